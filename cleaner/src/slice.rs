//! Quasi-preemptive cleaning (OrcFS): cleaning runs in slices. At the end of a slice it
//! checks whether foreground I/O is waiting; if so it keeps its context (victim and
//! next block) and yields; the next slice resumes where it stopped. Run with an
//! unbounded budget it is the classic non-preemptive cleaner (a whole victim at once).

use crate::policy::{pick_victim, Policy};
use ftl::device::AlignedBuf;
use ftl::{BlockDevice, Ftl, IndexStore, LiveBlock, StreamId, GC_STREAM};

/// Live blocks read together (one round of concurrent device reads).
const BATCH: usize = 32;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How much one slice may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Wall-clock length of a slice.
    pub time: Duration,
    /// Blocks a slice may move (for deterministic tests); `usize::MAX` for no limit.
    pub blocks: usize,
}

impl Budget {
    /// A time-bounded slice.
    pub fn time(t: Duration) -> Self {
        Budget {
            time: t,
            blocks: usize::MAX,
        }
    }
    /// A block-bounded slice.
    pub fn blocks(n: usize) -> Self {
        Budget {
            time: Duration::MAX,
            blocks: n,
        }
    }
    /// No bound: a whole victim at once.
    pub fn unbounded() -> Self {
        Budget {
            time: Duration::MAX,
            blocks: usize::MAX,
        }
    }
}

/// How a slice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceEnd {
    /// The victim has no live block left (it frees at the next checkpoint).
    Finished { victim: u32, moved: usize },
    /// Budget spent and foreground I/O waiting: context kept.
    Preempted { victim: u32, moved: usize },
    /// Nothing worth cleaning.
    NoVictim,
}

/// Figures for `ftlblk stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CleanerStats {
    pub blocks_copied: u64,
    pub blocks_skipped: u64,
    pub segments_cleaned: u64,
    pub slices: u64,
    pub preemptions: u64,
}

struct Context {
    victim: u32,
    blocks: Vec<LiveBlock>,
    next: usize,
}

/// A cleaner over one FTL. Not thread-safe by itself: one cleaner per FTL.
pub struct Cleaner<D: BlockDevice, I: IndexStore> {
    ftl: Arc<Ftl<D, I>>,
    ctx: Option<Context>,
    bufs: Vec<AlignedBuf>,
    gc_stream: Box<dyn Fn(u64) -> StreamId + Send>,
    pub stats: CleanerStats,
    /// Utilisation (live / blocks per segment) of each victim when it was picked.
    pub victim_utilization: Vec<f32>,
}

impl<D: BlockDevice, I: IndexStore> Cleaner<D, I> {
    pub fn new(ftl: Arc<Ftl<D, I>>) -> Self {
        Cleaner {
            ftl,
            ctx: None,
            bufs: (0..BATCH).map(|_| AlignedBuf::new(4096)).collect(),
            gc_stream: Box::new(|_| GC_STREAM),
            stats: CleanerStats::default(),
            victim_utilization: Vec::new(),
        }
    }

    /// Chooses the GC output stream per relocated LBA (e.g. by expected lifetime); the
    /// default puts everything into the FTL's GC stream. (The FTL diverts a relocation to
    /// [`GC_STREAM`] when its stream would need the last free segment.)
    pub fn with_gc_stream(mut self, f: impl Fn(u64) -> StreamId + Send + 'static) -> Self {
        self.gc_stream = Box::new(f);
        self
    }

    /// The victim being cleaned, if a slice was preempted.
    pub fn current_victim(&self) -> Option<u32> {
        self.ctx.as_ref().map(|c| c.victim)
    }

    /// Runs one slice. `foreground_waiting` is asked when the budget is spent.
    pub fn run_slice(
        &mut self,
        policy: Policy,
        budget: Budget,
        foreground_waiting: &dyn Fn() -> bool,
    ) -> Result<SliceEnd, crate::Error> {
        self.stats.slices += 1;
        if self.ctx.is_none() {
            let snap = self.ftl.segment_snapshot();
            let now = self.ftl.current_seq();
            let bps = self.ftl.geometry().blocks_per_segment();
            let Some(victim) = pick_victim(policy, &snap, now, bps, &[]) else {
                return Ok(SliceEnd::NoVictim);
            };
            // Relocation order is LBA order: cleaning also defragments.
            let blocks = self.ftl.live_blocks(victim)?;
            self.victim_utilization
                .push(blocks.len() as f32 / bps as f32);
            self.ctx = Some(Context {
                victim,
                blocks,
                next: 0,
            });
        }
        let mut slice_start = Instant::now();
        let mut slice_moved = 0usize;
        let mut moved = 0usize;
        loop {
            let Some(ctx) = self.ctx.as_mut() else {
                return Ok(SliceEnd::NoVictim);
            };
            if ctx.next >= ctx.blocks.len() {
                let victim = ctx.victim;
                self.ctx = None;
                self.stats.segments_cleaned += 1;
                return Ok(SliceEnd::Finished { victim, moved });
            }
            if slice_moved >= budget.blocks || slice_start.elapsed() >= budget.time {
                if foreground_waiting() {
                    self.stats.preemptions += 1;
                    return Ok(SliceEnd::Preempted {
                        victim: ctx.victim,
                        moved,
                    });
                }
                // Nobody waits: go on with a fresh slice.
                self.stats.slices += 1;
                slice_start = Instant::now();
                slice_moved = 0;
            }
            // Read a batch of live blocks at once (concurrent reads on the device), then
            // relocate each with a compare-and-swap: blocks the user rewrote meanwhile stay.
            let room = budget.blocks.saturating_sub(slice_moved).max(1);
            let n = (ctx.blocks.len() - ctx.next).min(BATCH).min(room);
            let batch: Vec<LiveBlock> = ctx.blocks[ctx.next..ctx.next + n].to_vec();
            ctx.next += n;
            let readable = self.ftl.read_live_batch(&batch, &mut self.bufs)?;
            for (i, b) in batch.iter().enumerate() {
                let stream = (self.gc_stream)(b.lba);
                if readable[i]
                    && self
                        .ftl
                        .relocate(b.lba, b.entry, &self.bufs[i][..4096], stream)?
                {
                    self.stats.blocks_copied += 1;
                    moved += 1;
                    slice_moved += 1;
                } else {
                    self.stats.blocks_skipped += 1;
                }
            }
        }
    }
}
