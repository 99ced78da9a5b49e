//! The `plinth` binary.

use std::process::ExitCode;

use clap::Parser;
use std::sync::Arc;

use plinth::cli::{CheckArgs, Cli, Command, LogFormat, Logging, PluginCommand};

/// The malloc arenas `plinth serve` lets glibc open (glibc's default is
/// eight per core). Loads and unloads run on short-lived threads, a new
/// thread may open a new arena, and each arena keeps its own fragments of
/// what the loads allocated, which `malloc_trim` cannot give back: 100
/// unload/load cycles of a model under traffic grew RSS by 13–23 % with
/// glibc's default on two cores (16 arenas), 3–10 % with 4, 1–4 % with 2, at
/// the same throughput (`bench/memory_churn.py`).
const MALLOC_ARENAS: i32 = 2;

/// Bounds glibc's malloc arenas to [`MALLOC_ARENAS`], unless the
/// environment sets them (`MALLOC_ARENA_MAX`, or the tunable
/// `glibc.malloc.arena_max` in `GLIBC_TUNABLES`). Runs before any thread
/// starts, so every thread shares the bounded arenas.
fn bound_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunable = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.arena_max"));
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() && !tunable {
            // SAFETY: mallopt only sets a parameter of glibc's allocator.
            unsafe { libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS) };
        }
    }
}

fn main() -> ExitCode {
    // Before any TLS client or server is built (the listeners, object
    // storage, the OTLP exporter): reqwest's rustls has no provider of its
    // own, and every TLS user of the process agrees on ring.
    plinth::cli::install_crypto_provider();
    match Cli::parse().command {
        Command::Serve(args) => {
            bound_malloc_arenas();
            let logging = Arc::new(Logging::init(args.log_verbose, args.log_format));
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
            let result = args.options().and_then(|opts| runtime.block_on(plinth::cli::serve(opts, logging)));
            // Blocking tasks still running (a plugin call) are not waited for.
            runtime.shutdown_background();
            finish(result)
        }
        Command::Plugin(PluginCommand::New { name, path, sdk, generation }) => {
            use plinth::plugin::scaffold::{Kind, new_crate};
            let kind = if generation { Kind::Generation } else { Kind::Handler };
            finish(new_crate(&name, &path, sdk.as_deref(), kind).map(|dir| {
                println!("created {}; build it with: cd {} && cargo build --release", dir.display(), dir.display());
            }))
        }
        Command::Plugin(PluginCommand::Check { file }) => finish(check_plugin(&file)),
        Command::Health { url, live } => finish(health(&url, live)),
        Command::Check(args) => {
            // The problems are the output; the loads' log is there on request.
            if std::env::var_os("RUST_LOG").is_some() {
                let _ = Logging::init(0, LogFormat::Default);
            }
            match check(args) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => finish(Err(e)),
            }
        }
    }
}

/// Runs `plinth check`: prints each problem on its own line; `Ok(true)` when
/// there is none.
fn check(args: CheckArgs) -> Result<bool, String> {
    let opts = args.options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let problems = runtime.block_on(plinth::cli::check_repository(&opts))?;
    // Blocking tasks still running (a plugin call) are not waited for, as
    // at the end of `serve`.
    runtime.shutdown_background();
    for problem in &problems {
        println!("{problem}");
    }
    if problems.is_empty() {
        println!("ok: every model in the repository loads");
    }
    Ok(problems.is_empty())
}

/// Runs `plinth health`: one GET with a 2 s timeout.
fn health(url: &str, live: bool) -> Result<(), String> {
    let path = if live { "/v2/health/live" } else { "/v2/health/ready" };
    let url = format!("{}{path}", url.trim_end_matches('/'));
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(std::time::Duration::from_secs(2))).build().into();
    match agent.get(&url).call() {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("{url}: {e}")),
    }
}

/// Runs `plinth plugin check`: prints the plugin's contract version.
fn check_plugin(file: &std::path::Path) -> Result<(), String> {
    let host = plinth::plugin::PluginHost::new(plinth::plugin::PluginLimits::default(), None)?;
    let version = host.inspect(file).map_err(|e| format!("{}: {e}", file.display()))?;
    println!(
        "{}: built against plinth:plugin@{version}; this host runs it (it runs {})",
        file.display(),
        plinth::plugin::runs()
    );
    Ok(())
}

fn finish(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
