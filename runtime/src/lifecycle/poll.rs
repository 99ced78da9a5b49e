//! Poll mode: every model loads at start; then every
//! `--repository-poll-secs` the repositories are looked at, and a model
//! folder is acted on once its files stayed the same for a whole interval
//! (so half-copied files are not loaded): new and changed versions load,
//! removed folders unload.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::core::Core;
use super::request::LoadRequest;
use super::startup;
use crate::repository::{ModelFiles, ScanError};

/// Each model folder as the previous look saw it.
#[derive(Default)]
pub(super) struct Poll {
    observed: Mutex<HashMap<String, ModelFiles>>,
}

impl Poll {
    /// Loads every model and remembers its files.
    ///
    /// # Errors
    /// A message when a repository cannot be read.
    pub(super) async fn start(&self, core: &Core) -> Result<(), ScanError> {
        let dirs = startup::load_all(core).await?;
        let mut observed = self.observed.lock();
        for dir in &dirs {
            observed.insert(dir.name.clone(), core.observe(dir));
        }
        Ok(())
    }

    /// One look: acts on every model folder whose files stayed the same
    /// since the previous look and differ from what was last tried, and
    /// unloads models whose folder is gone.
    pub(super) async fn poll(&self, core: &Core) {
        let dirs = match core.scan().await {
            Ok(dirs) => dirs,
            Err(e) => return tracing::error!("poll: {e}"),
        };
        let mut stable = Vec::new();
        let gone: Vec<String> = {
            let mut observed = self.observed.lock();
            let mut now = HashMap::new();
            for (dir, files) in dirs {
                if observed.get(&dir.name) == Some(&files) {
                    stable.push((dir.name.clone(), files.clone()));
                }
                now.insert(dir.name, files);
            }
            let gone = observed.keys().filter(|n| !now.contains_key(*n)).cloned().collect();
            *observed = now;
            gone
        };
        for (name, files) in stable {
            let record = core.record(&name);
            let changed = record.lock().await.attempted.as_ref().is_none_or(|(tried, _)| *tried != files);
            if changed {
                tracing::info!(model = %name, "poll: files changed");
                let _ = core.load(&name, LoadRequest::default()).await;
            }
        }
        for name in gone {
            tracing::info!(model = %name, "poll: model folder removed");
            let _ = core.unload(&name).await;
        }
    }
}
