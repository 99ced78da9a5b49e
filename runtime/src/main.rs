//! The `plinth` binary.

use clap::Parser;
use plinth::cli::{Cli, Command, init_logging};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let Command::Serve(args) = cli.command;
    init_logging(args.log_verbose, args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match runtime.block_on(plinth::server::serve(args.options())) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
