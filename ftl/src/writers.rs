//! A pool of threads that write sealed chunks handed over by the threads that appended
//! to them ([`PendingChunks`]): user writers ([`Ftl::write_via`]) and the cleaner
//! ([`Ftl::relocate_deferred`]). A chunk fills every 252 blocks or so; without the pool
//! the writer whose block filled it waits for its 1 MiB device write, which set the tail
//! of the write latency under load (p99.9 of 15 ms at steady state). FLUSH and
//! checkpoints wait for the chunks below them as before (the tracker), wherever they
//! are being written.
//!
//! When the writers hand over chunks faster than the device takes them (a burst on a
//! device with free space, where nothing paces them), the wait is shared: every writer
//! waits at [`ChunkWriters::admit`] before it appends while `threads` batches or more are
//! handed over and not written, instead of the one whose block sealed a chunk waiting
//! alone at a full queue for the writes ahead of it (10-46 ms in the first 250 ms of
//! overwrites of a device just filled, `ftlblk bench --tests steady`; `docs/steady.md`).
//!
//! Who may use it: anyone appending with a deferred sink; the pool owns no FTL state and
//! knows the FTL only as a [`ChunkSink`]. Threads end when the pool is dropped (after
//! writing what they were given).

use crate::append::PendingChunks;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Batches handed over and not yet written, and the writers waiting for fewer. Every
/// user write checks it ([`Backlog::admit`]): the count is an atomic read without a lock;
/// the mutex only orders a waiter's check against the wake-up of [`Backlog::leave`].
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    queued: AtomicUsize,
    waiting: Mutex<()>,
    drained: Condvar,
    /// Nanoseconds writers spent in [`Backlog::admit`].
    waited_ns: AtomicU64,
}

impl Backlog {
    /// A batch was handed over.
    pub(crate) fn enter(&self) {
        self.queued.fetch_add(1, Ordering::SeqCst);
    }

    /// A batch was written (or given back): wakes every waiting writer.
    pub(crate) fn leave(&self) {
        // Saturating: a leave never outnumbers the enters before it, but never wrap.
        let _ = self
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| q.checked_sub(1));
        // Taken and released so that a waiter between its check and its wait is not missed.
        drop(self.waiting.lock().unwrap_or_else(|p| p.into_inner()));
        self.drained.notify_all();
    }

    /// Batches handed over and not yet written.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Returns once fewer than `limit` batches are queued, or after `patience` (a pool
    /// whose threads stopped never drains; the sender then finds it gone).
    pub(crate) fn admit(&self, limit: usize, patience: Duration) {
        if self.queued.load(Ordering::SeqCst) < limit {
            return;
        }
        let start = Instant::now();
        let mut g = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        while self.queued.load(Ordering::SeqCst) >= limit {
            let Some(left) = patience.checked_sub(start.elapsed()) else {
                break;
            };
            g = match self.drained.wait_timeout(g, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        drop(g);
        self.waited_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

/// How long [`ChunkWriters::admit`] waits at most.
const ADMIT_PATIENCE: Duration = Duration::from_millis(100);

/// Where the pool's threads write what they are handed (the FTL: `Ftl::write_pending`).
pub trait ChunkSink: Send + Sync + 'static {
    /// Writes the chunks and retires them; a failure poisons the sink.
    fn write_pending(&self, p: PendingChunks) -> crate::error::Result<()>;
}

/// The pool's end: hand chunks over with [`ChunkWriters::send`].
pub struct ChunkWriters {
    tx: mpsc::SyncSender<PendingChunks>,
    backlog: Arc<Backlog>,
    threads: usize,
}

/// Leaves the backlog when dropped.
struct Leave<'a>(&'a Backlog);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

impl ChunkWriters {
    /// Starts `threads` writers of `ftl`'s chunks. Writers that call
    /// [`ChunkWriters::admit`] wait while `threads` batches or more are handed over and
    /// not written; a sender blocks at twice that (`threads` being written, `threads`
    /// waiting: each batch holds staging slots, and a FLUSH, checkpoint or free record
    /// waits for every chunk below it, so a deeper queue delays them: four times as deep
    /// gave zipf:0.99 steady space waits of 21-26 s against 11-18 s in 5 A/B pairs).
    pub fn spawn<S: ChunkSink>(ftl: &Arc<S>, threads: usize, name: &str) -> std::io::Result<Self> {
        let threads = threads.max(1);
        let (tx, rx) = mpsc::sync_channel::<PendingChunks>(threads);
        let rx = Arc::new(Mutex::new(rx));
        let backlog = Arc::new(Backlog::default());
        for i in 0..threads {
            let (ftl, rx, backlog) = (ftl.clone(), rx.clone(), backlog.clone());
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || loop {
                    // Ends when the pool (the sender) is dropped.
                    let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok(p) = next else { return };
                    // Left also when the write panics (its chunks are poisoned and
                    // completed): admissions waited 100 ms each once `threads` batches
                    // had leaked (found by review, 2026-11-29).
                    let _leave = Leave(&backlog);
                    // A failed write poisons the FTL: its next request reports it.
                    let _ = ftl.write_pending(p);
                })?;
        }
        Ok(ChunkWriters {
            tx,
            backlog,
            threads,
        })
    }

    /// Hands `p` over (nothing to do when empty); gives it back when the writers are
    /// gone, to be written by the caller.
    pub fn send(&self, p: PendingChunks) -> Option<PendingChunks> {
        if p.is_empty() {
            return None;
        }
        self.backlog.enter();
        let back = self.tx.send(p).err().map(|e| e.0);
        if back.is_some() {
            self.backlog.leave();
        }
        back
    }

    /// Waits (at most 100 ms) while as many batches are handed over and not written as
    /// there are threads to write them: called by a writer before it appends, so that
    /// when blocks come faster than the device takes chunks, every writer waits a little
    /// rather than the one that seals a chunk a lot.
    pub fn admit(&self) {
        self.backlog.admit(self.threads, ADMIT_PATIENCE);
    }

    /// Nanoseconds writers have spent in [`ChunkWriters::admit`].
    pub fn admit_wait_ns(&self) -> u64 {
        self.backlog.waited_ns.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn admit_waits_while_the_backlog_is_full_and_wakes_when_a_batch_is_written() {
        let b = Arc::new(Backlog::default());
        // Below the limit: no wait.
        b.enter();
        let t = Instant::now();
        b.admit(2, Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(1));
        // At the limit: waits until a batch leaves.
        b.enter();
        assert_eq!(b.queued(), 2);
        let admitted = Arc::new(AtomicBool::new(false));
        let h = {
            let (b, admitted) = (b.clone(), admitted.clone());
            std::thread::spawn(move || {
                b.admit(2, Duration::from_secs(30));
                admitted.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!admitted.load(Ordering::SeqCst), "admitted over a full backlog");
        let woken = Instant::now();
        b.leave();
        h.join().expect("admit thread");
        // Woken by the batch written, not by its 30 s patience running out.
        assert!(woken.elapsed() < Duration::from_secs(15));
        assert!(admitted.load(Ordering::SeqCst));
        assert_eq!(b.queued(), 1);
        assert!(b.waited_ns.load(Ordering::Relaxed) >= 50_000_000);
        // A backlog that never drains holds a writer for its patience only.
        b.enter();
        let t = Instant::now();
        b.admit(2, Duration::from_millis(50));
        assert!(t.elapsed() >= Duration::from_millis(50));
    }
}
