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
/// freed pages after a delay ([`envlens::allocator::PURGE_DELAY_MS`]), but only when a thread
/// calls into it: once a burst of requests ends, the runtime's threads sleep and what the
/// burst freed stayed resident (250 MB after the issue 22 probes). One call from a thread of its own purges what is due.
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

/// How often a runtime thread, when it goes idle, hands back what its own heap holds free.
const OWN_HEAP_COLLECT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Called by each runtime thread as it parks (goes idle): at most every
/// [`OWN_HEAP_COLLECT_EVERY`], collects that thread's own mimalloc heap. mimalloc keeps pages
/// in the heap of the thread that allocated them; blocks freed there by other threads (a
/// connection's buffers dropped elsewhere) wait in the page until its own thread looks, and
/// [`return_freed_memory`]'s collect from a thread of its own cannot reach them. A thread that
/// idles after a burst is the one with time to spare for it.
fn collect_own_heap() {
    use std::cell::Cell;
    use std::time::Instant;
    thread_local!(static LAST: Cell<Option<Instant>> = const { Cell::new(None) });
    let now = Instant::now();
    let due = LAST.with(|last| match last.get() {
        Some(at) if now.duration_since(at) < OWN_HEAP_COLLECT_EVERY => false,
        _ => {
            last.set(Some(now));
            true
        }
    });
    if due {
        // SAFETY: takes no pointer; collects the calling thread's heap.
        unsafe { mi_collect(false) };
    }
}

fn main() -> ExitCode {
    envlens::allocator::configure();
    return_freed_memory();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(collect_own_heap)
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(run()),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> ExitCode {
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
