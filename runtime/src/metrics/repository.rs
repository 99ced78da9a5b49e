//! Plinth's repository families: what fetching model folders from object
//! storage downloaded, reused and failed, by model.

use prometheus::{CounterVec, IntCounterVec, Opts, Registry};

use super::register;

/// The `plinth_repository_*` families, recorded by the remote repositories.
pub struct RepositoryMetrics {
    /// Bytes downloaded, by model.
    pub bytes: IntCounterVec,
    /// Objects downloaded, by model.
    pub objects: IntCounterVec,
    /// Objects taken from the mirror instead of downloaded (same size and
    /// ETag as last synced), by model.
    pub cache_hits: IntCounterVec,
    /// Seconds spent fetching model folders, by model.
    pub download_seconds: CounterVec,
    /// Fetches that failed, by model and cause (`not_found`, `denied`,
    /// `changed`, `truncated`, `local`, `provider`).
    pub failures: IntCounterVec,
}

impl RepositoryMetrics {
    /// Creates the families and registers them with `registry`.
    pub(super) fn register(registry: &Registry) -> RepositoryMetrics {
        let per_model = |name: &str, help: &str| {
            register(registry, IntCounterVec::new(Opts::new(name, help), &["model"]).expect("valid metric"))
        };
        let seconds = CounterVec::new(
            Opts::new(
                "plinth_repository_download_seconds_total",
                "Seconds spent fetching model folders from object storage",
            ),
            &["model"],
        )
        .expect("valid metric");
        let failures = IntCounterVec::new(
            Opts::new(
                "plinth_repository_download_failures_total",
                "Model folder fetches from object storage that failed, by cause",
            ),
            &["model", "cause"],
        )
        .expect("valid metric");
        RepositoryMetrics {
            bytes: per_model("plinth_repository_download_bytes_total", "Bytes downloaded from object storage"),
            objects: per_model("plinth_repository_download_objects_total", "Objects downloaded from object storage"),
            cache_hits: per_model(
                "plinth_repository_cache_hits_total",
                "Objects reused from the local mirror instead of downloaded (same size and ETag)",
            ),
            download_seconds: register(registry, seconds),
            failures: register(registry, failures),
        }
    }
}
