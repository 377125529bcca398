//! What the FTL offers a cleaner (the `cleaner` crate drives it):
//! - [`Ftl::live_blocks`]: the live blocks of a closed segment, from its on-disk chunk
//!   summaries checked against the map, sorted by LBA (relocation order: cleaning also
//!   defragments);
//! - [`Ftl::read_live`]: a live block's data, verified against its map entry;
//! - [`Ftl::relocate`] (in `engine.rs`): compare-and-swap move into [`GC_STREAM`];
//! - free-space signalling: writers that find no free segment wait (bounded by
//!   `Config::space_wait`) while a cleaner is attached, instead of failing at once;
//! - [`Ftl::set_write_delay`]: the per-block delay the cleaner's throttle asks writers for;
//! - [`Ftl::close_stream`]: gives up a stream's open segment, so the free space left in it
//!   (an idle stream's, otherwise held until the stream fills it) can be cleaned back.
//!
//! Invariant: a relocation moves a block only if the map still points at the old place,
//! so a user write landing on a victim's block meanwhile is never lost.

use crate::chunks::SegmentChunks;
use crate::device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
use crate::engine::Ftl;
use crate::error::{Error, Result};
use crate::index::IndexStore;
use crate::map::MapEntry;
use crate::records::SegState;
use crate::summary::Entry;
use crate::sync::{lock, wait_timeout, AtomicBool, AtomicU64, Condvar, Mutex};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub use crate::engine::GC_STREAM;

/// A block the cleaner must move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveBlock {
    pub lba: u64,
    pub entry: MapEntry,
}

/// Writers waiting for free segments, and the cleaner's signals to them.
#[derive(Default)]
pub struct SpaceWaiters {
    generation: Mutex<u64>,
    cv: Condvar,
    cleaner_attached: AtomicBool,
    /// Nanoseconds each written block waits (the throttle).
    write_delay_ns: AtomicU64,
    /// Foreground requests started (the cleaner compares it across a slice).
    pub(crate) foreground_ops: AtomicU64,
}

impl SpaceWaiters {
    /// Wakes writers: segments were freed.
    pub fn notify(&self) {
        let mut g = lock(&self.generation);
        *g += 1;
        drop(g);
        self.cv.notify_all();
    }
}

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Declares that a cleaner runs: writers short of space wait for it.
    pub fn attach_cleaner(&self, attached: bool) {
        self.space
            .cleaner_attached
            .store(attached, Ordering::SeqCst);
        self.space.notify();
    }

    /// Sets the throttle: every written block first waits this long.
    pub fn set_write_delay(&self, delay: Duration) {
        self.space.write_delay_ns.store(
            delay.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    /// Current throttle delay per block.
    pub fn write_delay(&self) -> Duration {
        Duration::from_nanos(self.space.write_delay_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn throttle(&self, blocks: u64) {
        let ns = self.space.write_delay_ns.load(Ordering::Relaxed);
        if ns > 0 {
            crate::sync::sleep(Duration::from_nanos(ns.saturating_mul(blocks)));
        }
    }

    /// Waits for a segment to be freed while a cleaner is attached. False when none is,
    /// or nothing was freed within `Config::space_wait`.
    pub(crate) fn wait_for_space(&self) -> Result<bool> {
        if !self.space.cleaner_attached.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let deadline = Instant::now() + self.cfg.space_wait;
        let mut g = lock(&self.space.generation);
        let start = *g;
        while *g == start {
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            g = wait_timeout(&self.space.cv, g, deadline - now);
        }
        self.check_poison()?;
        Ok(true)
    }

    /// Foreground requests started so far; a change across a cleaning slice means
    /// foreground I/O is waiting or running, and the cleaner should yield.
    pub fn foreground_ops(&self) -> u64 {
        self.space.foreground_ops.load(Ordering::Relaxed)
    }

    pub(crate) fn note_foreground(&self) {
        self.space.foreground_ops.fetch_add(1, Ordering::Relaxed);
    }

    /// The entry sequence number the next write gets (the FTL's clock for segment ages).
    pub fn current_seq(&self) -> u64 {
        self.entry_seq.load(Ordering::SeqCst)
    }

    /// Free segments now (including the cleaner's reserve).
    pub fn free_segments(&self) -> usize {
        self.segs.free_count()
    }

    /// Closes `stream`'s open segment: seals and writes its open chunk if it holds
    /// anything, then closes the segment (its unwritten tail counts as dead space for
    /// victim selection). The stream's next write opens a new segment. Recovery is not
    /// affected: chunks written later are found at the start of segments that were free
    /// at the checkpoint, like after a segment fills.
    ///
    /// Does nothing while free segments are at or below the cleaner's reserve: the room
    /// left in an open segment is then what cleaning needs to finish its victim, and the
    /// stream's next write would need a free segment there is none of.
    pub fn close_stream(&self, stream: crate::StreamId) -> Result<()> {
        let Some(m) = self.streams.get(stream.0 as usize) else {
            return Err(Error::InvalidParameters(format!("no stream {}", stream.0)));
        };
        if self.segs.free_count() <= self.cfg.gc_reserve_segments {
            return Ok(());
        }
        let mut out = Vec::new();
        {
            let mut st = lock(m);
            if let Some(sealed) = self.seal_open(stream.0, &mut st)? {
                out.push(sealed);
            }
            // Left: an open chunk with nothing in it, which nobody reads.
            if let Some(empty) = st.chunk.take() {
                self.segs.unwritten[empty.seg as usize].fetch_sub(1, Ordering::SeqCst);
                drop(empty);
            }
            if let Some((seg, _)) = st.cursor.take() {
                self.segs.close(seg);
            }
        }
        self.write_chunks(out)
    }

    /// The cleaner's reserve, in segments.
    pub fn gc_reserve_segments(&self) -> usize {
        self.cfg.gc_reserve_segments
    }

    /// Live blocks of closed segment `seg`, sorted by LBA.
    pub fn live_blocks(&self, seg: u32) -> Result<Vec<LiveBlock>> {
        if seg == 0
            || seg >= self.geo.segment_count
            || self.segs.state(seg) != Some(SegState::Closed)
        {
            return Err(Error::InvalidParameters(format!(
                "segment {seg} is not a closed log segment"
            )));
        }
        let start = self.geo.segment_start(seg);
        let below = (self.epoch, self.tracker.next_seq());
        let mut out = Vec::new();
        for chunk in SegmentChunks::new(&self.dev, self.geo, seg, self.format_id(), below) {
            let (off, s) = chunk?;
            let mut k = 0u64;
            for e in &s.entries {
                if let Entry::Data { lba, .. } = *e {
                    let pba = start + off as u64 + 1 + k;
                    k += 1;
                    if lba < self.geo.exported_blocks {
                        let cur = self.map.get(lba);
                        if cur.pba() == Some(pba as u32) {
                            out.push(LiveBlock { lba, entry: cur });
                        }
                    }
                }
            }
        }
        out.sort_by_key(|b| b.lba);
        out.dedup_by_key(|b| b.lba);
        Ok(out)
    }

    /// Reads a live block's data into `buf` (one block), verified against its entry.
    /// `Ok(false)`: the map moved on (nothing to relocate).
    pub fn read_live(&self, b: &LiveBlock, buf: &mut [u8]) -> Result<bool> {
        let Some(pba) = b.entry.pba() else {
            return Ok(false);
        };
        let at = pba as u64 * BLOCK_SIZE as u64;
        self.dev
            .read_at(at, &mut buf[..BLOCK_SIZE])
            .map_err(|e| Error::io("cleaner read", at, e))?;
        self.verify_block(b.lba, b.entry, buf)
    }

    /// Reads several live blocks at once (one block of `bufs` each) and verifies each;
    /// `false` for a block whose map entry moved on meanwhile (nothing to relocate).
    pub fn read_live_batch(
        &self,
        blocks: &[LiveBlock],
        bufs: &mut [AlignedBuf],
    ) -> Result<Vec<bool>> {
        let mut reqs: Vec<(u64, &mut [u8])> = Vec::with_capacity(blocks.len());
        let mut idx = Vec::with_capacity(blocks.len());
        for (i, (b, buf)) in blocks.iter().zip(bufs.iter_mut()).enumerate() {
            if let Some(pba) = b.entry.pba() {
                reqs.push((pba as u64 * BLOCK_SIZE as u64, &mut buf[..BLOCK_SIZE]));
                idx.push(i);
            }
        }
        let first = reqs.first().map_or(0, |r| r.0);
        self.dev
            .read_many(&mut reqs)
            .map_err(|e| Error::io("cleaner read", first, e))?;
        drop(reqs);
        let mut ok = vec![false; blocks.len()];
        for i in idx {
            ok[i] = self.verify_block(blocks[i].lba, blocks[i].entry, &bufs[i])?;
        }
        Ok(ok)
    }

    /// Closed segments without live blocks, waiting for a checkpoint to become free.
    pub fn dead_segments(&self) -> usize {
        self.segs.dead_closed().len()
    }

    /// Live-block count of a segment (from the in-memory table).
    pub fn segment_valid(&self, seg: u32) -> u32 {
        self.segs
            .valid
            .get(seg as usize)
            .map_or(0, |v| v.load(Ordering::SeqCst))
    }
}
