//! Chunk-write tracking and group commit.
//!
//! Chain sequence numbers are handed out and registered as incomplete under one lock,
//! so "every chunk below N has completed" is a well-defined question even while other
//! threads are sealing. A FLUSH waits for that, then joins (or starts) one device sync;
//! concurrent flushes share a sync (group commit).

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

struct SyncInner {
    /// Every chunk below this is durable.
    durable: u64,
    running: bool,
}

/// Group commit of device syncs.
pub struct SyncGroup {
    inner: Mutex<SyncInner>,
    cv: Condvar,
}

impl SyncGroup {
    pub fn new(durable: u64) -> Self {
        SyncGroup {
            inner: Mutex::new(SyncInner {
                durable,
                running: false,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SyncInner> {
        crate::sync::lock(&self.inner)
    }

    /// Every chunk below the returned number is durable.
    pub fn durable(&self) -> u64 {
        self.lock().durable
    }

    /// Makes every chunk below `target` durable, sharing syncs with concurrent callers.
    /// `frontier` tells how far completed writes reach; `sync` performs one device sync.
    /// Returns whether this call ran a sync itself.
    pub fn sync_to<E>(
        &self,
        target: u64,
        frontier: impl Fn() -> u64,
        sync: impl Fn() -> Result<(), E>,
    ) -> Result<bool, E> {
        let mut g = self.lock();
        loop {
            if g.durable >= target {
                return Ok(false);
            }
            if !g.running {
                g.running = true;
                drop(g);
                // Completed writes below `covers` are exactly what this sync makes durable.
                let covers = frontier();
                let r = sync();
                g = self.lock();
                g.running = false;
                if r.is_ok() {
                    g.durable = g.durable.max(covers);
                }
                self.cv.notify_all();
                r?;
                if g.durable >= target {
                    return Ok(true);
                }
            } else {
                g = wait(&self.cv, g);
            }
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
        let g = Arc::new(SyncGroup::new(0));
        let syncs = Arc::new(AtomicU32::new(0));
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let (g, syncs) = (g.clone(), syncs.clone());
                std::thread::spawn(move || {
                    g.sync_to(
                        10,
                        || 10,
                        || {
                            syncs.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(20));
                            Ok::<(), ()>(())
                        },
                    )
                    .unwrap();
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(g.durable(), 10);
        assert!(syncs.load(Ordering::SeqCst) < 8, "syncs were shared");
        assert!(
            !g.sync_to(10, || 10, || Err::<(), ()>(())).unwrap(),
            "nothing to do, no sync"
        );
    }
}
