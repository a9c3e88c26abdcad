use std::process::ExitCode;

use clap::Parser;

/// See Cargo.toml for why.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    envlens::telemetry::init_logging();
    let cli = envlens::config::Cli::parse();
    match envlens::cli::run(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
