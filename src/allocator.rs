//! The global allocator's (mimalloc's) options, set by `envlens` (src/main.rs) and by the
//! benchmarks that allocate as it does, before their runtime starts.
//!
//! mimalloc gives freed pages back to the system 10 ms after they are freed (its
//! `purge_delay`; whole segments 10 times later). A first view allocates tens of megabytes
//! (its lists' bodies, their objects, the assembly) and frees most of them as it answers: with
//! the default, the next view finds none of that memory and faults every page in again, the
//! kernel zeroing each (a `perf` of the GitOps first view, session 20, put that above any of
//! envlens' own functions). Kept a second, a burst of views reuses it; what stays free longer
//! is still given back, by mimalloc on its next call and by `main`'s collecting thread.

use std::ffi::{c_int, c_long};

// mimalloc's own; linked in with the allocator (the sys crate declares them only with a
// feature).
extern "C" {
    fn mi_option_set(option: c_int, value: c_long);
}

/// `mi_option_purge_delay` in mimalloc's `mi_option_t` (include/mimalloc.h, v2).
const MI_OPTION_PURGE_DELAY: c_int = 15;

/// How long freed memory is kept before it is given back: a burst of views reuses it.
pub const PURGE_DELAY_MS: c_long = 1_000;

/// Sets mimalloc's options as the service runs with them, unless the environment names
/// mimalloc's own variable (`MIMALLOC_PURGE_DELAY`, read by mimalloc as it starts), which then
/// decides: measuring another value needs no build.
pub fn configure() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: takes no pointer; sets one of mimalloc's option values, read as it purges.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}
