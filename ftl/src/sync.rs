//! The synchronization primitives of the engine, in one place.
//!
//! Normally `std`'s. With the `shuttle` feature they are [shuttle]'s, so a test can run
//! the real engine (writers, FLUSH group commit, checkpoints, relocation, the staging
//! slot lifecycle) under a controlled, replayable thread schedule and explore the
//! interleavings between every lock, condition variable and atomic operation
//! (`tests/shuttle.rs`, and the `sched` fuzz target, which lets the fuzzer pick them).
//!
//! Under shuttle a timed wait never times out (shuttle's model), so every wait in the
//! engine must have a notifier; the staging area's own header atomics stay `std`'s
//! because they live in shared memory (`staging/mod.rs`).
//!
//! Who may use it: every module of the crate that shares state between threads. Nothing
//! here is public API.
//!
//! Owns nothing: it picks std or shuttle primitives. Used by every module that locks.

#[cfg(not(feature = "shuttle"))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8};
#[cfg(not(feature = "shuttle"))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

#[cfg(feature = "shuttle")]
pub(crate) use shuttle::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8};
#[cfg(feature = "shuttle")]
pub(crate) use shuttle::sync::{Condvar, Mutex, MutexGuard};

use std::time::Duration;

/// Locks `m`. A poisoned lock is taken over: every critical section of the engine
/// leaves its data valid before anything that can panic, and a panic that did leave it
/// half done has poisoned the FTL itself (see `Ftl::seal_open`).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits on `cv`, releasing `g` meanwhile.
pub(crate) fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(g).unwrap_or_else(|p| p.into_inner())
}

/// Waits on `cv` for at most `dur` (under shuttle: until notified).
pub(crate) fn wait_timeout<'a, T>(
    cv: &Condvar,
    g: MutexGuard<'a, T>,
    dur: Duration,
) -> MutexGuard<'a, T> {
    match cv.wait_timeout(g, dur) {
        Ok((g, _)) => g,
        Err(p) => p.into_inner().0,
    }
}

/// A point where another thread may run (under shuttle; nothing otherwise): between
/// stores a dying process could be interrupted between, which no lock or atomic of the
/// facade separates (the staging area's shared-memory stores).
pub(crate) fn preemption_point() {
    #[cfg(feature = "shuttle")]
    shuttle::thread::yield_now();
}
