use std::process::ExitCode;

use clap::Parser;

/// See Cargo.toml for why.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = envlens::config::Cli::parse();
    let _traces =
        match envlens::telemetry::init_logging(cli.log_format, cli.otlp_endpoint.as_deref()) {
            Ok(guard) => guard,
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::FAILURE;
            }
        };
    match envlens::cli::run(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
