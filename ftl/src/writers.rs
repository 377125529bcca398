//! A pool of threads that write sealed chunks handed over by the threads that appended
//! to them ([`PendingChunks`]): user writers ([`Ftl::write_via`]) and the cleaner
//! ([`Ftl::relocate_deferred`]). A chunk fills every 252 blocks or so; without the pool
//! the writer whose block filled it waits for its 1 MiB device write, which set the tail
//! of the write latency under load (p99.9 of 15 ms at steady state). FLUSH and
//! checkpoints wait for the chunks below them as before (the tracker), wherever they
//! are being written.
//!
//! Who may use it: anyone appending with a deferred sink; the pool owns no FTL state and
//! knows the FTL only as a [`ChunkSink`]. Threads end when the pool is dropped (after
//! writing what they were given).

use crate::append::PendingChunks;
use std::sync::{mpsc, Arc, Mutex};

/// Where the pool's threads write what they are handed (the FTL: `Ftl::write_pending`).
pub trait ChunkSink: Send + Sync + 'static {
    /// Writes the chunks and retires them; a failure poisons the sink.
    fn write_pending(&self, p: PendingChunks) -> crate::error::Result<()>;
}

/// The pool's end: hand chunks over with [`ChunkWriters::send`].
pub struct ChunkWriters {
    tx: mpsc::SyncSender<PendingChunks>,
}

impl ChunkWriters {
    /// Starts `threads` writers of `ftl`'s chunks. At most `threads` batches wait for
    /// them; a sender blocks beyond that (each batch holds staging slots).
    pub fn spawn<S: ChunkSink>(ftl: &Arc<S>, threads: usize, name: &str) -> std::io::Result<Self> {
        let threads = threads.max(1);
        let (tx, rx) = mpsc::sync_channel::<PendingChunks>(threads);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let (ftl, rx) = (ftl.clone(), rx.clone());
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || loop {
                    // Ends when the pool (the sender) is dropped.
                    let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok(p) = next else { return };
                    // A failed write poisons the FTL: its next request reports it.
                    let _ = ftl.write_pending(p);
                })?;
        }
        Ok(ChunkWriters { tx })
    }

    /// Hands `p` over (nothing to do when empty); gives it back when the writers are
    /// gone, to be written by the caller.
    pub fn send(&self, p: PendingChunks) -> Option<PendingChunks> {
        if p.is_empty() {
            return None;
        }
        self.tx.send(p).err().map(|e| e.0)
    }
}
