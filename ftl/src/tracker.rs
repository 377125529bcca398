//! Chunk-write tracking and group commit.
//!
//! Chain sequence numbers are handed out and registered as incomplete under one lock,
//! so "every chunk below N has completed" is a well-defined question even while other
//! threads are sealing. A FLUSH waits for that, then joins (or starts) one device sync;
//! concurrent flushes share a sync ([`GroupCommit`], which also groups the FLUSHes).
//!
//! Owns chain-number bookkeeping and the one group-commit helper used by FLUSH and the
//! device-sync group. Called by the appender (begin, complete) and the engine (wait, group
//! commit).

use crate::sync::{wait, Condvar, Mutex, MutexGuard};
use std::collections::BTreeSet;

struct Inner {
    next_seq: u64,
    incomplete: BTreeSet<u64>,
}

/// Tracks sealed chunks until their writes complete.
pub struct ChunkTracker {
    inner: Mutex<Inner>,
    done: Condvar,
}

impl ChunkTracker {
    /// Starts numbering at `next_seq`.
    pub fn new(next_seq: u64) -> Self {
        ChunkTracker {
            inner: Mutex::new(Inner {
                next_seq,
                incomplete: BTreeSet::new(),
            }),
            done: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        crate::sync::lock(&self.inner)
    }

    /// Assigns the next chain number and registers it as incomplete.
    #[cfg(test)]
    pub fn begin(&self) -> u64 {
        self.begin_with(|_| {})
    }

    /// As [`ChunkTracker::begin`], running `note` with the number before the lock is
    /// released (so the number is recorded before any later one exists).
    pub fn begin_with(&self, note: impl FnOnce(u64)) -> u64 {
        let mut g = self.lock();
        let s = g.next_seq;
        g.next_seq += 1;
        g.incomplete.insert(s);
        note(s);
        s
    }

    /// Marks a chunk's write finished (successfully or not: the caller poisons on error).
    pub fn complete(&self, seq: u64) {
        let mut g = self.lock();
        g.incomplete.remove(&seq);
        drop(g);
        self.done.notify_all();
    }

    /// The next number to be handed out: every sealed chunk is below it.
    pub fn next_seq(&self) -> u64 {
        self.lock().next_seq
    }

    /// Every chunk below the returned number has completed.
    pub fn frontier(&self) -> u64 {
        let g = self.lock();
        g.incomplete.first().copied().unwrap_or(g.next_seq)
    }

    /// Blocks until every chunk below `target` has completed.
    pub fn wait_below(&self, target: u64) {
        let mut g = self.lock();
        while g.incomplete.first().is_some_and(|&s| s < target) {
            g = wait(&self.done, g);
        }
    }
}

struct GroupState {
    /// Everything below this is done.
    done: u64,
    /// A leader is working.
    running: bool,
    /// Callers waiting behind the leader.
    waiting: usize,
}

/// Leader/follower group commit: callers that need "everything below N done" share the
/// work. One caller at a time leads and runs the work, which reports how far it got;
/// the others wait for it and then look again (returning at once if it covered them).
/// Used for FLUSH (the work seals every stream and syncs) and for device syncs (the work
/// is one sync covering every completed chunk write).
///
/// A leader that fails hands leadership to the next caller; one that panics does too
/// (its guard clears the flag and wakes the waiters), so a panic never wedges the group.
pub struct GroupCommit {
    inner: Mutex<GroupState>,
    cv: Condvar,
}

/// Clears the leader flag when the leader is done, whatever way it leaves.
struct Leading<'a>(&'a GroupCommit);

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        crate::sync::lock(&self.0.inner).running = false;
        self.0.cv.notify_all();
    }
}

impl GroupCommit {
    /// A group where everything below `done` is already done.
    pub fn new(done: u64) -> Self {
        GroupCommit {
            inner: Mutex::new(GroupState {
                done,
                running: false,
                waiting: 0,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, GroupState> {
        crate::sync::lock(&self.inner)
    }

    /// Everything below the returned number is done.
    #[cfg(test)]
    pub fn done(&self) -> u64 {
        self.lock().done
    }

    /// Callers waiting behind the leader now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// Makes everything below `target` done, leading with `work` (which returns how far
    /// it got) or following another leader. Returns whether this call ran `work`.
    pub fn run_to<E>(&self, target: u64, work: impl Fn() -> Result<u64, E>) -> Result<bool, E> {
        let mut g = self.lock();
        let mut led = false;
        loop {
            if g.done >= target {
                return Ok(led);
            }
            if g.running {
                g.waiting += 1;
                g = wait(&self.cv, g);
                g.waiting -= 1;
                continue;
            }
            g.running = true;
            drop(g);
            let leading = Leading(self);
            let r = work();
            led = true;
            g = self.lock();
            if let Ok(covers) = r {
                g.done = g.done.max(covers);
            }
            drop(g);
            drop(leading);
            r?;
            g = self.lock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn frontier_follows_completion() {
        let t = ChunkTracker::new(5);
        let a = t.begin();
        let b = t.begin();
        assert_eq!((a, b, t.frontier(), t.next_seq()), (5, 6, 5, 7));
        t.complete(b);
        assert_eq!(t.frontier(), 5);
        t.complete(a);
        assert_eq!(t.frontier(), 7);
        t.wait_below(7);
    }

    #[test]
    fn concurrent_flushes_share_syncs() {
        let g = Arc::new(GroupCommit::new(0));
        let syncs = Arc::new(AtomicU32::new(0));
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let (g, syncs) = (g.clone(), syncs.clone());
                std::thread::spawn(move || {
                    g.run_to(10, || {
                        syncs.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        Ok::<u64, ()>(10)
                    })
                    .unwrap();
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(g.done(), 10);
        assert!(syncs.load(Ordering::SeqCst) < 8, "syncs were shared");
        assert!(
            !g.run_to(10, || Err::<u64, ()>(())).unwrap(),
            "nothing to do, no sync"
        );
    }

    #[test]
    fn a_leader_that_panics_hands_leadership_on() {
        let g = Arc::new(GroupCommit::new(0));
        let g2 = g.clone();
        let t = std::thread::spawn(move || {
            let _ = g2.run_to(5, || -> Result<u64, ()> { panic!("leader dies") });
        });
        assert!(t.join().is_err());
        assert_eq!(
            g.run_to(5, || Ok::<u64, ()>(5)),
            Ok(true),
            "the next caller leads"
        );
        assert_eq!(g.run_to(3, || Err::<u64, ()>(())), Ok(false));
        assert_eq!(
            g.run_to(9, || Err::<u64, ()>(())),
            Err(()),
            "errors reach the leader"
        );
    }
}
