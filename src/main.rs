use std::process::ExitCode;

use clap::Parser;

/// See Cargo.toml for why.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// mimalloc's own; linked in with the allocator (the sys crate declares it only with a feature).
extern "C" {
    fn mi_collect(force: bool);
}

/// Gives back to the system, every few seconds, the memory mimalloc holds free. It returns
/// freed pages after a delay (a second), but only when a thread calls into it: once a burst of
/// requests ends, the runtime's threads sleep and what the burst freed stayed resident (250 MB
/// after the issue 22 probes). One call from a thread of its own purges what is due.
fn return_freed_memory() {
    let _ = std::thread::Builder::new()
        .name("mi-collect".into())
        .spawn(|| loop {
            std::thread::sleep(std::time::Duration::from_secs(5));
            // SAFETY: takes no pointer; mimalloc collects the calling thread's heap and purges
            // the arenas' expired free ranges.
            unsafe { mi_collect(false) };
        });
}

#[tokio::main]
async fn main() -> ExitCode {
    return_freed_memory();
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
            envlens::telemetry::announce(tracing::Level::ERROR, &format!("error: {e:#}"), &[]);
            ExitCode::FAILURE
        }
    }
}
