//! Kubernetes resources of an environment: their health and their dependency graph, pure
//! over the objects so they test without a cluster.

pub mod cause;
pub mod delta;
pub mod graph;
pub mod group;
pub mod health;
pub mod keys;
pub mod listing;
pub mod manifests;
pub mod masking;
pub mod namespaces;
pub mod object;
pub mod page;
pub mod reach;
pub mod text;
pub mod timeline;
pub mod tree;

/// Groups from this many objects on are worked on by two threads where the work splits in two:
/// a thread costs tens of microseconds, a pass over a thousand objects about two hundred.
/// Measured over `benches/resources.rs`' environment, two threads break even at 1,000 objects
/// and gain from 2,000.
const PARALLEL_FROM: usize = 2_000;

/// Groups from this many objects on are read with [`tree::prefetched`]: smaller ones stay in
/// the caches between passes, and prefetching them only costs.
const PREFETCH_FROM: usize = 4_000;

/// `a` and `b`, with `a` on a thread of its own when `parallel`.
///
/// The pure passes over a large group (ownership, edges, health) take tens of milliseconds
/// each; where two of them read the same objects and nothing of each other, the second core
/// halves the wait. The caller is on a blocking thread, never on the async runtime's.
pub(crate) fn join<A: Send, B>(
    parallel: bool,
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B,
) -> (A, B) {
    if !parallel {
        return (a(), b());
    }
    std::thread::scope(|scope| {
        let a = scope.spawn(a);
        let b = b();
        let a = a
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (a, b)
    })
}
