//! The `plinth` command line. Flag names follow Triton's where Triton has
//! the same setting (`--model-repository`, `--http-port`, `--log-verbose`,
//! `--log-format`, `--strict-readiness`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod serve;
pub use serve::ServeArgs;

/// What `plinth check` and `plinth serve` run.
pub use crate::lifecycle::check_repository;
pub use crate::server::logging::Logging;
pub use crate::server::serve;
pub use crate::server::tls::install_crypto_provider;

use crate::lifecycle::{ControlMode, LoadLimits, LoadingOptions};
use crate::plugin::PluginLimits;
use crate::repository::Location;
use crate::residency::Budget;
use crate::scheduler::rate_limiter::{Mode as RateLimitMode, ResourceCount};
use crate::server::listener_settings::default_max_connections;
pub use crate::server::logging::LogFormat;
use crate::server::restrictions::{Front, Restrictions};
use crate::server::tls::TlsFiles;
use crate::server::{GrpcListener, HttpListener, ServeOptions};

/// Plinth: a KServe v2 model server with WebAssembly pre/post-processing.
#[derive(Debug, Parser)]
#[command(name = "plinth", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands of `plinth`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the models of one or more model repositories over HTTP.
    Serve(Box<ServeArgs>),
    /// Check a model repository without serving it: load every model as
    /// `serve` does at start (configurations, model files, plugins, warm-up,
    /// ensembles against their steps), then stop. Prints one line per model
    /// or version that would not be READY and exits non-zero if there is any.
    Check(CheckArgs),
    /// Create or inspect plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Ask a running server whether it is ready (`/v2/health/ready`) or,
    /// with --live, alive; exits 0 if so. For container health checks on
    /// images without an HTTP client.
    Health {
        /// The server's base URL.
        #[arg(long, default_value = "http://127.0.0.1:8000")]
        url: String,
        /// Ask `/v2/health/live` instead.
        #[arg(long)]
        live: bool,
    },
}

/// `plinth plugin` subcommands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Create the plugin crate NAME in a folder of that name; it builds as is
    /// with `cargo build --release`.
    New {
        /// The crate's name (lower-case letters, digits, '-', '_').
        name: String,
        /// Where to create the folder.
        #[arg(long, default_value = ".")]
        path: PathBuf,
        /// Plinth's plugin-sdk folder (default: the bundle's share/plinth/plugin-sdk, else the checkout the binary was built from).
        #[arg(long)]
        sdk: Option<PathBuf>,
        /// A generative model's plugin (prompts and chats to token ids, ids to
        /// text, with tokenizers and minijinja) instead of a request handler.
        #[arg(long)]
        generation: bool,
    },
    /// Say which plinth:plugin version FILE.wasm was built against and
    /// whether this server can run it; exits non-zero if it cannot.
    Check {
        /// The plugin component.
        file: PathBuf,
    },
}

/// Flags of `plinth check`: those of `plinth serve` that decide whether a
/// model loads.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The repositories, runtimes and limits, as `plinth serve` takes them.
    #[command(flatten)]
    pub loading: LoadArgs,
}

impl CheckArgs {
    /// The loading options these flags describe, in control mode `none`.
    ///
    /// # Errors
    /// As [`LoadArgs::options`].
    pub fn options(&self) -> Result<LoadingOptions, String> {
        self.loading.options(ControlMode::None, Budget::default(), Duration::from_secs(DEFAULT_LOAD_TIMEOUT_SECS))
    }
}

/// The flags that decide whether a model loads, the same for `plinth serve`
/// and `plinth check`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// A model repository: a folder, or a path in object storage as
    /// s3://bucket/path, s3://host:port/bucket/path, gs://bucket/path or
    /// as://account/container/path (repeat for several; none in modelmesh mode).
    #[arg(long = "model-repository", value_name = "PATH|URL")]
    pub model_repositories: Vec<Location>,

    /// Where repositories in object storage are copied to be loaded (one
    /// folder each, kept across restarts so unchanged files are not fetched
    /// again). Default: the folder TRITON_AWS_MOUNT_DIRECTORY,
    /// TRITON_GCS_MOUNT_DIRECTORY or TRITON_AZURE_MOUNT_DIRECTORY names for
    /// the repository's provider, else a temporary folder removed at exit.
    #[arg(long, value_name = "PATH")]
    pub repository_cache_dir: Option<PathBuf>,

    /// The ONNX Runtime 1.31 shared library (libonnxruntime.so).
    #[arg(long, env = "ORT_DYLIB_PATH", value_name = "PATH")]
    pub ort_dylib_path: Option<PathBuf>,

    /// Model loads that run at once (default: one per core).
    #[arg(long)]
    pub model_load_concurrency: Option<usize>,

    /// Device memory models may hold on a GPU, as a fraction of its memory:
    /// DEVICE:FRACTION, e.g. 0:0.8 (repeat per GPU; Triton's flag). Each
    /// model's share is measured at its load. In on_demand mode the least
    /// recently used models on that GPU leave to make room; in the other
    /// modes a load that does not fit is refused.
    #[arg(long = "model-load-gpu-limit", value_name = "DEVICE:FRACTION", value_parser = parse_gpu_limit)]
    pub model_load_gpu_limits: Vec<(u32, f64)>,

    /// Largest linear memory a plugin instance may use, e.g. 256MiB.
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    pub plugin_memory_limit: usize,

    /// How long one plugin call may run, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub plugin_timeout_ms: u64,

    /// Quote a trapped plugin's panic message and stderr in the error
    /// response (they can hold the client's input); without it the
    /// response names the model, plugin, phase and the panic's source
    /// location, and the log has the rest.
    #[arg(long)]
    pub plugin_panic_details: bool,

    /// Plugin calls running at once across all models (default: one per core).
    #[arg(long)]
    pub plugin_concurrency: Option<usize>,

    /// Folder for compiled plugins (default: $XDG_CACHE_HOME/plinth/plugins
    /// or ~/.cache/plinth/plugins; "none" disables the cache).
    #[arg(long, value_name = "PATH")]
    pub plugin_cache_dir: Option<PathBuf>,

    /// The response cache, as Triton's `<cache>,<key>=<value>`: Plinth has
    /// `local,size=BYTES`, used by models with `response_cache { enable:
    /// true }`.
    #[arg(long, value_name = "CACHE,KEY=VALUE")]
    pub cache_config: Vec<String>,

    /// Triton's rate limiter: `execution_count` makes every execution wait
    /// for its instance's turn (priority) and resources (each instance
    /// group's `rate_limiter`); `off` runs at once and applies no
    /// `rate_limiter` setting.
    #[arg(long, value_enum, ignore_case = true, default_value_t = RateLimitMode::Off)]
    pub rate_limit: RateLimitMode,

    /// Copies of a rate limiter resource, as Triton's
    /// `<name>:<count>[:<device>]` (repeat; case-insensitive): on GPU
    /// `<device>`, else on every device (and, for a global resource, the
    /// server). Once one is given, a resource not given has none. Default:
    /// the most any instance needs. With `--rate-limit=off` it is accepted
    /// and not applied, as in Triton.
    #[arg(long = "rate-limit-resource", value_name = "NAME:COUNT[:DEVICE]")]
    pub rate_limit_resources: Vec<ResourceCount>,
}

fn parse_bytes(s: &str) -> Result<usize, String> {
    let size: bytesize::ByteSize = s.parse().map_err(|e| format!("'{s}' is not a size such as 256MiB: {e}"))?;
    usize::try_from(size.as_u64()).map_err(|_| format!("'{s}' is too large"))
}

/// `--model-load-timeout-secs`' default; `plinth check` loads with it.
const DEFAULT_LOAD_TIMEOUT_SECS: u64 = 60;

impl LoadArgs {
    /// The loading options these flags describe, in `mode`, with the
    /// residency `budget` and load `timeout` (flags of `plinth serve` only).
    ///
    /// # Errors
    /// A message for a flag given twice, a repository missing outside
    /// modelmesh mode, or one given in it, or a malformed `--cache-config`.
    pub fn options(&self, mode: ControlMode, budget: Budget, timeout: Duration) -> Result<LoadingOptions, String> {
        match (mode == ControlMode::ModelMesh, self.model_repositories.is_empty()) {
            (true, false) => {
                return Err("--model-control-mode=modelmesh takes no --model-repository: \
                            ModelMesh names each model's path"
                    .into());
            }
            (false, true) => return Err("--model-repository is required (repeat it for several repositories)".into()),
            _ => {}
        }
        let mut limited = std::collections::BTreeSet::new();
        if let Some((gpu, _)) = self.model_load_gpu_limits.iter().find(|(gpu, _)| !limited.insert(*gpu)) {
            return Err(format!("--model-load-gpu-limit is given twice for GPU {gpu}"));
        }
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Ok(LoadingOptions {
            model_repositories: self.model_repositories.clone(),
            repository_cache_dir: self.repository_cache_dir.clone(),
            control_mode: mode,
            load_limits: LoadLimits { concurrency: self.model_load_concurrency.unwrap_or(cores), timeout, budget },
            gpu_load_limits: self.model_load_gpu_limits.clone(),
            ort_dylib_path: self.ort_dylib_path.clone(),
            plugin_limits: PluginLimits {
                memory_bytes: self.plugin_memory_limit,
                call_timeout: Duration::from_millis(self.plugin_timeout_ms),
                concurrency: self.plugin_concurrency.unwrap_or(cores),
                instances: 0,
                panic_details: self.plugin_panic_details,
            },
            plugin_cache_dir: match &self.plugin_cache_dir {
                Some(p) if p.as_os_str() == "none" => None,
                Some(p) => Some(p.clone()),
                None => default_cache_dir(),
            },
            response_cache_bytes: crate::model::ResponseCache::capacity_from_flags(&self.cache_config)?,
            rate_limit: self.rate_limit,
            rate_limit_resources: self.rate_limit_resources.clone(),
        })
    }
}

fn parse_gpu_limit(text: &str) -> Result<(u32, f64), String> {
    let (device, fraction) =
        text.split_once(':').ok_or_else(|| format!("'{text}' is not DEVICE:FRACTION (e.g. 0:0.8)"))?;
    let device = device.trim().parse::<u32>().map_err(|_| format!("'{device}' is not a GPU index"))?;
    match fraction.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok((device, f)),
        _ => Err(format!("'{fraction}' is not a fraction above 0 and at most 1")),
    }
}

fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("plinth").join("plugins"))
}
