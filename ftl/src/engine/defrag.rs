//! Read-driven defragmentation (issue 18): every reader reports what a read cost
//! ([`Ftl::note_read`]: the meter, and the window queued when the policy in `frag.rs`
//! says it is worth rewriting), and the cleaner's runner rewrites queued windows
//! contiguously ([`Ftl::defrag_step`]) when free space allows. Also the sampled
//! fragmentation of the map for `ftlblk stats` ([`Ftl::fragmentation_sample`]).
//!
//! A window is rewritten by relocations (rule 6 of the engine: compare and swap against
//! the entries the read verified), never in place: a block the user wrote since the read
//! is skipped, and a FLUSH's promise is kept as by the cleaner. It goes into
//! [`GC_STREAM`] (data read in order is long-lived) from the runner's thread, so a
//! window's blocks are appended back to back; it never takes the cleaner's reserve: a
//! window starts only with [`DEFRAG_SPARE_SEGMENTS`] free beyond it, and each block
//! moves only while that holds or the GC stream's open segment has room for it (a
//! relocation into [`GC_STREAM`] may open a reserve segment, and writers took the
//! spare during a window: found by review, 2026-11-27).

use super::read::{DeviceBlock, Fragmentation, ReadSpans, READ_SPAN_GAP_BLOCKS};
use super::Ftl;
use crate::append::PendingChunks;
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::error::Result;
use crate::frag::{worth_defrag, DefragWindow, FragLevel};
use crate::index::IndexStore;
use crate::stream::GC_STREAM;
use std::sync::atomic::Ordering;

/// Free segments beyond the cleaner's reserve that defragmentation leaves alone.
pub const DEFRAG_SPARE_SEGMENTS: usize = 4;

/// What one [`Ftl::defrag_step`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DefragReport {
    pub windows: u64,
    /// Blocks moved next to their neighbours.
    pub moved: u64,
    /// Blocks left where they were: written (or moved) since the read.
    pub skipped: u64,
}

/// Fragmentation figures for `ftlblk stats`: what large reads cost, the level the
/// policy sees, and what read-driven defragmentation did since open.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct FragFigures {
    pub level: FragLevel,
    /// Reads of at least [`crate::frag::MIN_READ_BLOCKS`] device blocks since open.
    pub large_reads: u64,
    /// Their backing reads.
    pub large_read_backing_reads: u64,
    /// Their mean physically contiguous run (blocks), lifetime and recent.
    pub mean_run_blocks: f64,
    pub recent_mean_run_blocks: f64,
    pub defrag_queued: u64,
    pub defrag_dropped: u64,
    pub defrag_waiting: u64,
    pub defrag_windows: u64,
    pub defrag_moved_blocks: u64,
    pub defrag_skipped_blocks: u64,
}

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Reports a read that found `dev` on the device (verified against their entries,
    /// data in `buf`): counts it and its runs, and queues its window for
    /// rewriting when the policy says so. Called by every reader after its checks.
    pub fn note_read(&self, lba: u64, dev: &[DeviceBlock], buf: &[u8]) {
        // Counted as `Ftl::read` reads them: small gaps (a chunk summary, padding) do not
        // split a run, so a range rewritten in order is never queued again for them.
        let runs = ReadSpans::new(dev, READ_SPAN_GAP_BLOCKS).len();
        self.frag.observe(dev.len(), runs);
        if !self.cfg.defrag || !worth_defrag(self.frag.level(), dev.len(), runs) {
            return;
        }
        let (count, bytes) = ((buf.len() / BLOCK_SIZE) as u32, dev.len() * BLOCK_SIZE);
        let w = if self.defrag.has_room(bytes) {
            let mut data = Vec::with_capacity(bytes);
            for b in dev {
                data.extend_from_slice(&buf[b.idx * BLOCK_SIZE..(b.idx + 1) * BLOCK_SIZE]);
            }
            DefragWindow {
                lba,
                count,
                blocks: dev.iter().map(|b| (lba + b.idx as u64, b.entry)).collect(),
                data,
            }
        } else {
            // No room for the data: the range alone, read again when its turn comes.
            DefragWindow {
                lba,
                count,
                blocks: Vec::new(),
                data: Vec::new(),
            }
        };
        self.defrag.offer(w);
    }

    /// Large reads (of at least `frag::MIN_READ_BLOCKS` blocks) so far: a change tells
    /// the cleaner's runner a scan is under way.
    pub fn large_reads(&self) -> u64 {
        self.frag.figures().0
    }

    /// The fragmentation level large reads show now (the policy's input).
    pub fn frag_level(&self) -> FragLevel {
        self.frag.level()
    }

    /// Windows waiting to be rewritten.
    pub fn defrag_waiting(&self) -> usize {
        self.defrag.len()
    }

    /// Rewrites up to `max_windows` queued windows contiguously (relocations into
    /// [`GC_STREAM`], compare and swap), stopping while free segments are within
    /// [`DEFRAG_SPARE_SEGMENTS`] of the cleaner's reserve. Called by the cleaner's runner
    /// (one thread, so a window's blocks are appended back to back).
    pub fn defrag_step(&self, max_windows: usize) -> Result<DefragReport> {
        let mut r = DefragReport::default();
        let mut pending = PendingChunks::default();
        let spare = || self.t.segs.free_count() > self.cfg.gc_reserve_segments + DEFRAG_SPARE_SEGMENTS;
        // Room for the block and what a free record or checkpoint sealing the open chunk
        // meanwhile costs: its summary and the padding to a flash page (a FLUSH leaves a
        // chunk of relocations open, engine rule 10).
        let margin = 2 + self.t.geo.blocks_per_page() as u64;
        let fits = || -> Result<bool> { Ok(spare() || self.gc_open_room()? >= margin) };
        // Every window taken counts towards `max_windows`, those found contiguous again
        // too: counting only the rewritten ones let one turn re-read every queued range
        // (up to 65,536 of them, gigabytes) on the runner's thread, no cleaning meanwhile,
        // after the ranges had been rewritten in order (found by review, 2026-11-29).
        let mut taken = 0usize;
        let res = (|| -> Result<()> {
            while taken < max_windows && spare() {
                #[cfg(test)]
                crate::append::tests::maybe_park(&crate::append::tests::PARK_AFTER_DEFRAG_CHECK);
                let Some(mut w) = self.defrag.take() else { break };
                taken += 1;
                if w.blocks.is_empty() {
                    // Queued without its data: read it again (a range rewritten since,
                    // by this or by the cleaner, is left alone).
                    let mut buf = vec![0u8; w.count as usize * BLOCK_SIZE];
                    let (dev, runs) = self.read_checked(w.lba, &mut buf, false)?;
                    if runs <= 1 {
                        continue;
                    }
                    w.blocks = dev.iter().map(|b| (w.lba + b.idx as u64, b.entry)).collect();
                    w.data = Vec::with_capacity(dev.len() * BLOCK_SIZE);
                    for b in &dev {
                        w.data
                            .extend_from_slice(&buf[b.idx * BLOCK_SIZE..(b.idx + 1) * BLOCK_SIZE]);
                    }
                }
                for (&(lba, entry), data) in w.blocks.iter().zip(w.data.chunks(BLOCK_SIZE)) {
                    if !fits()? {
                        // Left part done (each move stands on its own); a later read
                        // of the window queues it again.
                        return Ok(());
                    }
                    if self.relocate_deferred(lba, entry, data, GC_STREAM, &mut pending)? {
                        r.moved += 1;
                    } else {
                        r.skipped += 1;
                    }
                }
                r.windows += 1;
                // Each window's sealed chunks written before the next: held to the end of
                // the batch, they made every FLUSH, FUA write, free record and checkpoint
                // wait for the rest of it (its device reads included), and held staging
                // slots writers wait for (found by review, 2026-11-29).
                self.write_pending(std::mem::take(&mut pending))?;
                #[cfg(test)]
                crate::append::tests::maybe_park(&crate::append::tests::PARK_AFTER_DEFRAG_WINDOW);
            }
            Ok(())
        })();
        let written = self.write_pending(pending);
        self.defrag_done.windows.fetch_add(r.windows, Ordering::Relaxed);
        self.defrag_done.moved.fetch_add(r.moved, Ordering::Relaxed);
        self.defrag_done.skipped.fetch_add(r.skipped, Ordering::Relaxed);
        res?;
        written?;
        Ok(r)
    }

    /// The read-side figures and what defragmentation did.
    pub fn frag_figures(&self) -> FragFigures {
        let (reads, runs, blocks) = self.frag.figures();
        FragFigures {
            level: self.frag.level(),
            large_reads: reads,
            large_read_backing_reads: runs,
            mean_run_blocks: blocks as f64 / runs.max(1) as f64,
            recent_mean_run_blocks: self.frag.recent_mean_run().unwrap_or(0.0),
            defrag_queued: self.defrag.queued.load(Ordering::Relaxed),
            defrag_dropped: self.defrag.dropped.load(Ordering::Relaxed),
            defrag_waiting: self.defrag.len() as u64,
            defrag_windows: self.defrag_done.windows.load(Ordering::Relaxed),
            defrag_moved_blocks: self.defrag_done.moved.load(Ordering::Relaxed),
            defrag_skipped_blocks: self.defrag_done.skipped.load(Ordering::Relaxed),
        }
    }

    /// [`Ftl::fragmentation`] of `windows` windows of `window` blocks picked at random
    /// (from `seed`) over the exported space: a sample of the map, cheap enough for
    /// `ftlblk stats` on any size of device.
    pub fn fragmentation_sample(&self, windows: u64, window: u64, seed: u64) -> Result<Fragmentation> {
        let window = window.clamp(1, self.t.geo.exported_blocks.max(1));
        let slots = self.t.geo.exported_blocks / window;
        let mut f = Fragmentation::default();
        if slots == 0 {
            return Ok(f);
        }
        // A map larger than its cache: only windows whose pages are cached, so that a
        // look at the figures (every `ftlblk stats`) reads no index page and evicts no
        // page users need (found by review, 2026-11-29). A map the cache holds whole
        // evicts nothing: its windows are all taken.
        let whole = self.t.map.pages() <= self.t.map.capacity_pages();
        let mut x = seed | 1;
        for _ in 0..windows {
            // xorshift64*: plenty for picking sample windows.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let slot = x.wrapping_mul(0x2545_f491_4f6c_dd1d) % slots;
            if !whole && !self.t.map.cached(slot * window, window) {
                continue;
            }
            let one = self.fragmentation(slot * window, window, window)?;
            f.windows += one.windows;
            f.reads += one.reads;
            f.mapped_blocks += one.mapped_blocks;
        }
        Ok(f)
    }
}

/// What defragmentation did since open.
#[derive(Debug)]
pub(crate) struct DefragDone {
    pub windows: crate::sync::AtomicU64,
    pub moved: crate::sync::AtomicU64,
    pub skipped: crate::sync::AtomicU64,
}

impl DefragDone {
    pub fn new() -> Self {
        DefragDone {
            windows: crate::sync::AtomicU64::new(0),
            moved: crate::sync::AtomicU64::new(0),
            skipped: crate::sync::AtomicU64::new(0),
        }
    }
}
