//! A [`Loader`] over fake backends for unit tests (only built for tests),
//! and model repositories written to a temporary folder for it.
//!
//! Every model is the doubler of `backend::fake` (FP32 `x` → `y = 2x`,
//! dims `[1]`) behind a real scheduler. Its `config.pbtxt` steers the fake:
//! `parameters { key: "fake.fail" ... }` makes every load fail with that
//! message, `fake.bytes` sets the accounted footprint (default 1 MiB),
//! `fake.gpu_bytes` the device memory it takes on GPU 0 (default none).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{ControlMode, Lifecycle, LoadLimits, Loader};
use crate::backend::Backend;
use crate::backend::fake::{Doubler, Gate};
use crate::config::{ModelConfig, Parameters, Signature};
use crate::error::LoadError;
use crate::metrics::Metrics;
use crate::model::{Ensemble, Model, ModelParts, Scheduling};
use crate::registry::Registry;
use crate::repository::{ModelDir, Repositories};
use crate::residency::Budget;
use crate::scheduler::policy::Policy;
use crate::tensor::{DataType, TensorSpec};

/// The default footprint of a fake model, in bytes.
pub const FAKE_BYTES: u64 = 1 << 20;

/// Loads doublers; records each load.
pub struct FakeLoader {
    metrics: Arc<Metrics>,
    gate: Option<Arc<Gate>>,
    /// `(model, version)` of each load, in order.
    pub loads: Mutex<Vec<(String, u64)>>,
    /// What [`Loader::gpu_free_bytes`] answers for every GPU.
    pub gpu_free: Mutex<Option<u64>>,
}

impl FakeLoader {
    /// A loader whose loads wait at `gate`, when given.
    pub fn new(metrics: Arc<Metrics>, gate: Option<Arc<Gate>>) -> FakeLoader {
        FakeLoader { metrics, gate, loads: Mutex::default(), gpu_free: Mutex::default() }
    }

    /// How many loads ran so far.
    pub fn count(&self) -> usize {
        self.loads.lock().len()
    }
}

impl Loader for FakeLoader {
    fn load(
        &self,
        dir: &ModelDir,
        version: u64,
        config: &ModelConfig,
        parameters: &Parameters,
    ) -> Result<(Model, u64), LoadError> {
        self.loads.lock().push((dir.name.clone(), version));
        if let Some(gate) = &self.gate {
            gate.pass();
        }
        let parameter = |key: &str| config.parameters.get(key).map(|p| p.string_value.as_str());
        if let Some(message) = parameter("fake.fail") {
            return Err(LoadError::Failed(message.to_owned()));
        }
        let bytes = parameter("fake.bytes").map_or(FAKE_BYTES, |b| b.parse().unwrap());
        if let Some(ensemble) = Ensemble::from_config(config) {
            let signature = Signature::from_config(config).map_err(LoadError::Failed)?;
            let metrics = self.metrics.for_model(&dir.name, version);
            let model = Model::ensemble(&dir.name, version, config, parameters.clone(), signature, ensemble, metrics);
            return Ok((model, bytes));
        }
        let spec = |name: &str| TensorSpec::new(name, DataType::Fp32, &[1]);
        let signature = Signature {
            max_batch_size: u32::try_from(config.max_batch_size).unwrap(),
            inputs: vec![spec("x")],
            outputs: vec![spec("y")],
        };
        let policy = Policy::from_config(config).map_err(LoadError::Failed)?;
        let instances: Vec<Arc<dyn Backend>> = vec![Arc::new(Doubler::default())];
        let metrics = self.metrics.for_model(&dir.name, version);
        let mut model = Model::new(ModelParts {
            name: &dir.name,
            version,
            config,
            parameters: parameters.clone(),
            signature,
            instances,
            scheduling: Scheduling::Dynamic(policy),
            metrics,
            plugin: None,
            rate_limited: None,
        });
        if let Some(gpu) = parameter("fake.gpu_bytes") {
            model.set_device_bytes([(0, gpu.parse().unwrap())].into());
        }
        Ok((model, bytes))
    }

    fn gpu_free_bytes(&self, _: u32) -> Option<u64> {
        *self.gpu_free.lock()
    }
}

/// A model repository in a temporary folder.
pub struct Repository {
    dir: tempfile::TempDir,
}

impl Repository {
    /// An empty repository.
    pub fn new() -> Repository {
        Repository { dir: tempfile::tempdir().unwrap() }
    }

    /// The repository folder.
    pub fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Adds (or rewrites) model `name` with `versions`, each holding a
    /// 1000-byte `model.onnx`, and `config.pbtxt` = `max_batch_size: 8` and
    /// `extra`.
    pub fn add(&self, name: &str, versions: &[u64], extra: &str) -> &Repository {
        let model = self.dir.path().join(name);
        for v in versions {
            std::fs::create_dir_all(model.join(v.to_string())).unwrap();
            std::fs::write(model.join(format!("{v}/model.onnx")), [0u8; 1000]).unwrap();
        }
        std::fs::write(model.join("config.pbtxt"), format!("max_batch_size: 8 {extra}")).unwrap();
        self
    }

    /// Adds ensemble `name` (FP32 `IN` → `OUT`, dims `[1]`) whose steps run
    /// `models` one after the other, each `x` → `y`.
    pub fn add_chain(&self, name: &str, models: &[&str]) -> &Repository {
        let tensor = |i: usize| match i {
            0 => "IN".to_owned(),
            i if i == models.len() => "OUT".to_owned(),
            i => format!("T{i}"),
        };
        let steps: Vec<String> = models
            .iter()
            .enumerate()
            .map(|(i, m)| {
                format!(
                    r#"{{ model_name: "{m}" model_version: -1 input_map {{ key: "x" value: "{}" }} output_map {{ key: "y" value: "{}" }} }}"#,
                    tensor(i),
                    tensor(i + 1)
                )
            })
            .collect();
        let config = format!(
            r#"platform: "ensemble"
               input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
               output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
               ensemble_scheduling {{ step [ {} ] }}"#,
            steps.join(", ")
        );
        self.add(name, &[1], &config)
    }

    /// Removes model `name`'s folder.
    pub fn remove(&self, name: &str) {
        std::fs::remove_dir_all(self.dir.path().join(name)).unwrap();
    }

    /// The folder of model `name`.
    pub fn model_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// A lifecycle in `mode` over `repository` (none in modelmesh mode) with a
/// [`FakeLoader`], and the loader.
pub fn lifecycle(
    mode: ControlMode,
    repository: Option<&Path>,
    budget: Budget,
    gate: Option<Arc<Gate>>,
) -> (Arc<Lifecycle>, Arc<FakeLoader>) {
    let metrics = Arc::new(Metrics::new());
    let loader = Arc::new(FakeLoader::new(metrics.clone(), gate));
    let limits = LoadLimits { concurrency: 2, timeout: std::time::Duration::from_secs(60), budget };
    let repositories = Repositories::from(repository.map(Path::to_path_buf).into_iter().collect::<Vec<_>>());
    let lifecycle = Lifecycle::new(loader.clone(), Arc::new(Registry::default()), repositories, mode, limits, metrics);
    (Arc::new(lifecycle), loader)
}

/// `(name, version, state, reason)` of each row of the repository index.
pub fn index(lifecycle: &Lifecycle) -> Vec<(String, String, &'static str, String)> {
    lifecycle.index().into_iter().map(|r| (r.name, r.version, r.state.as_str(), r.reason)).collect()
}
