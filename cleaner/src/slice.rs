//! Quasi-preemptive cleaning (OrcFS): cleaning runs in slices. At the end of a slice it
//! checks whether foreground I/O is waiting; if so it keeps its context (victim and
//! next block) and yields; the next slice resumes where it stopped. Run with an
//! unbounded budget it is the classic non-preemptive cleaner (a whole victim at once).

use crate::policy::Policy;
use ftl::device::{AlignedBuf, BLOCK_SIZE};
use ftl::{BlockDevice, Ftl, IndexStore, LiveBlock, PendingChunks, StreamId, GC_STREAM};

use crate::pipeline::{prepare, Prefetcher, Prepared, GC_WRITERS};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest window of a victim read at once (smaller segments are read whole).
const WINDOW_BYTES: u64 = 8 << 20;

/// How long the cleaner leaves a victim whose cleaning failed ([`crate::Error::Victim`]:
/// a block that does not read back, unreadable summaries) before it tries it again. A
/// block whose checksum fails stays failed, and the victim, whose live blocks score it
/// best, was picked again at every turn: the cleaner stopped freeing space and writers
/// ran into ENOSPC (found by review, 2026-11-27). Its other live blocks stay where they
/// are meanwhile; an unreadable one reads as EIO, as before.
pub const SHUN_FOR: Duration = Duration::from_secs(60);

/// Map pages (of 512 LBAs) a victim's scan for blocks its list did not name reads in one
/// step (`Cleaner::run_slice`): 2 GiB of the device's capacity. One in unit tests, so
/// that their small maps take several steps.
#[cfg(not(test))]
const SCAN_PAGES: u64 = 1024;
#[cfg(test)]
const SCAN_PAGES: u64 = 1;

/// Victims remembered with one end that left live blocks unnamed (`Cleaner::suspects`).
const MAX_SUSPECTS: usize = 64;

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
    /// Victims static wear levelling picked (`policy::wear_victim`; their copies count in
    /// `blocks_copied` and the WAF like any other).
    pub wear_victims: u64,
    /// What they cost: copies beyond those of the victims the policy would have taken
    /// (at most `policy::wear_budget` of the user blocks written, paced by
    /// `policy::WEAR_BURST_SEGMENTS`).
    pub wear_extra_blocks: u64,
    pub slices: u64,
    pub preemptions: u64,
    /// Where the cleaner's time went, in nanoseconds: picking victims and walking their
    /// summaries, reading live blocks, and relocating them (appends, chunk writes).
    pub pick_ns: u64,
    pub read_ns: u64,
    pub relocate_ns: u64,
    /// Backing reads of victims (their live runs, or whole windows of nearly full ones),
    /// and the bytes they read (dead blocks read over included).
    pub victim_reads: u64,
    pub victim_read_bytes: u64,
    /// Victims taken from the prefetcher, and nanoseconds the cleaner waited for it.
    pub prefetched: u64,
    pub prefetch_wait_ns: u64,
    /// Victims left after a failure to clean them ([`SHUN_FOR`]).
    pub victims_abandoned: u64,
    /// Live blocks of victims that their lists did not name (a damaged chunk summary ends
    /// the walk of its segment before the chunks after it), found by a scan of the map and
    /// moved with the rest (those a user rewrote meanwhile are skipped, and still counted
    /// here). Anything here means a summary on the backing fails its checksum; once the
    /// segment is cleaned, nothing is left for `ftlblk check` to name.
    pub unnamed_live_found: u64,
    /// Cleanings that ended with live blocks in the victim (same life) that neither its
    /// list nor the map named: a count gone wrong, or a passing state (the second such
    /// end of the same victim leaves it).
    pub unnamed_live_ends: u64,
    /// Victims the picker thread chose and listed while the one before was read (their
    /// `pick_ns` was off the cleaner's path).
    pub chosen_ahead: u64,
}

/// Where one victim's time went on average, in milliseconds, and its reads
/// ([`CleanerStats::per_victim`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct VictimTimes {
    /// Picking it and walking its chunk summaries (on the prefetch thread, mostly).
    pub pick_ms: f64,
    /// Reading its live blocks.
    pub read_ms: f64,
    /// Relocating them (appends, sealed chunks handed to the GC writers).
    pub relocate_ms: f64,
    /// The cleaner waiting for the prefetch thread to hand it over.
    pub waiting_ms: f64,
    /// Backing reads of its live blocks, and KiB read in all.
    pub reads: f64,
    pub read_kib: f64,
}

impl CleanerStats {
    /// Adds a victim read's backing reads and bytes.
    fn count_reads(&mut self, r: ftl::ReadCount) {
        self.victim_reads += r.reads;
        self.victim_read_bytes += r.bytes;
    }

    /// Averages of the time counters over the victims cleaned (zeros before the first):
    /// the split `ftlblk bench` reports for each steady test, to see which step limits
    /// cleaning (`docs/steady.md`).
    pub fn per_victim(&self) -> VictimTimes {
        let n = self.segments_cleaned.max(1) as f64 * 1e6;
        VictimTimes {
            pick_ms: self.pick_ns as f64 / n,
            read_ms: self.read_ns as f64 / n,
            relocate_ms: self.relocate_ns as f64 / n,
            waiting_ms: self.prefetch_wait_ns as f64 / n,
            reads: self.victim_reads as f64 * 1e6 / n,
            read_kib: self.victim_read_bytes as f64 * 1e6 / n / 1024.0,
        }
    }
}

struct Context {
    victim: u32,
    /// Live blocks ordered by window, then by LBA (relocation order: cleaning also
    /// defragments).
    blocks: Vec<LiveBlock>,
    next: usize,
    /// The window whose live blocks are in the cleaner's buffer.
    loaded: Option<u64>,
    /// See `Prepared::reuses`.
    reuses: u32,
    /// Its live blocks were listed again at the end (see `slice`).
    relisted: bool,
    /// The map was scanned for blocks its list did not name (see `slice`).
    scanned: bool,
    /// The next map page of that scan, once it began, and what it found so far.
    scan_at: u64,
    found: Vec<LiveBlock>,
}

impl<D: BlockDevice, I: IndexStore> Cleaner<D, I> {
    /// Ends the current victim's cleaning: every block of its life moved or died.
    fn cleaned(&mut self, victim: u32, moved: usize) -> SliceEnd {
        self.ctx = None;
        self.stats.segments_cleaned += 1;
        SliceEnd::Finished { victim, moved }
    }
}

impl Context {
    /// Cleans `blocks` from the start (ordered as the first list was: by window, then LBA).
    fn restart(&mut self, mut blocks: Vec<LiveBlock>, window_blocks: u64) {
        blocks.sort_by_key(|b| b.entry.pba().map_or(u64::MAX, |p| p as u64 / window_blocks));
        self.blocks = blocks;
        self.next = 0;
        self.loaded = None;
    }
}

/// A cleaner over one FTL. Not thread-safe by itself: one cleaner per FTL.
pub struct Cleaner<D: BlockDevice, I: IndexStore> {
    ftl: Arc<Ftl<D, I>>,
    ctx: Option<Context>,
    /// One window of the victim (see [`Ftl::read_live_window`]).
    window: AlignedBuf,
    window_blocks: u64,
    prefetch: Option<Prefetcher>,
    /// Relocations' sealed chunks, and the writer threads they go to (none: written in
    /// line).
    pending: PendingChunks,
    writers: Option<ftl::ChunkWriters>,
    gc_stream: Box<dyn Fn(u64) -> StreamId + Send>,
    pub stats: CleanerStats,
    wear: crate::pipeline::WearBudget,
    /// Victims whose cleaning failed, and since when they are left alone ([`SHUN_FOR`]).
    shunned: Vec<(u32, Instant)>,
    /// Victims (and their reuse counts) whose cleaning ended once with live blocks their
    /// lists did not name: one taken again in the same life and ending so again is left.
    /// At most [`MAX_SUSPECTS`], those whose reuse count moved dropped.
    suspects: Vec<(u32, u32)>,
    /// Victims picked, by their utilisation (live / blocks per segment) then, in tenths
    /// (bin 9 holds 0.9 to 1). A histogram, not a list: the daemon's cleaner runs for
    /// months (a list grew about 35 MB a day at 100 victims a second; found by review,
    /// 2026-11-27).
    pub victim_utilization: [u64; 10],
}

impl<D: BlockDevice, I: IndexStore> Cleaner<D, I> {
    pub fn new(ftl: Arc<Ftl<D, I>>) -> Self {
        let window = ftl.geometry().segment_bytes.min(WINDOW_BYTES);
        Cleaner {
            ftl,
            ctx: None,
            window: AlignedBuf::new(window as usize),
            window_blocks: window / BLOCK_SIZE as u64,
            prefetch: None,
            pending: PendingChunks::default(),
            writers: None,
            gc_stream: Box::new(|_| GC_STREAM),
            stats: CleanerStats::default(),
            wear: Default::default(),
            shunned: Vec::new(),
            suspects: Vec::new(),
            victim_utilization: [0; 10],
        }
    }

    /// Chooses the GC output stream per relocated LBA (e.g. by expected lifetime); the
    /// default puts everything into the FTL's GC stream. (The FTL diverts a relocation to
    /// [`GC_STREAM`] when its stream would need the last free segment.)
    pub fn with_gc_stream(mut self, f: impl Fn(u64) -> StreamId + Send + 'static) -> Self {
        self.gc_stream = Box::new(f);
        self
    }

    /// Starts the helper threads (the runner does; tests that count slices and blocks do
    /// not): a prefetcher picks and reads the next victim while the current one is
    /// relocated, and writers write the chunks relocation seals while the cleaner
    /// appends the next blocks (see [`crate::pipeline`]).
    pub fn start_helpers(&mut self) -> std::io::Result<()>
    where
        D: 'static,
        I: 'static,
    {
        self.writers = Some(ftl::ChunkWriters::spawn(
            &self.ftl,
            GC_WRITERS,
            "ftl-gc-writer",
        )?);
        self.prefetch = Some(Prefetcher::spawn(
            &self.ftl,
            &self.wear,
            self.window_blocks,
            self.window.len(),
            crate::pipeline::AHEAD_MAX_AGE,
        )?);
        Ok(())
    }

    /// The prefetched victim, if one was asked for under `policy`, is recent and was not
    /// left after a failure meanwhile; its buffer becomes the window buffer.
    fn take_prefetched(&mut self, policy: Policy) -> Option<Prepared> {
        let shunned = self.shunned();
        let pf = self.prefetch.as_mut()?;
        let t = Instant::now();
        let taken = pf.take(policy, &mut self.window);
        self.stats.prefetch_wait_ns += t.elapsed().as_nanos() as u64;
        let taken = match taken {
            // Left after a failure meanwhile: not cleaned, so its wear spending goes back.
            Some(p) if shunned.contains(&p.victim) => {
                self.wear.refund(p.wear_spent);
                None
            }
            other => other,
        };
        self.stats.prefetched += u64::from(taken.is_some());
        taken
    }

    /// Asks the prefetcher for the victim after `current`.
    fn prefetch_next(&mut self, policy: Policy, current: u32) {
        let mut exclude = self.shunned();
        exclude.push(current);
        if let Some(pf) = self.prefetch.as_mut() {
            pf.request(policy, exclude);
        }
    }

    /// The victims left after a failure, for [`SHUN_FOR`] each: no slice takes them.
    pub fn shunned_victims(&mut self) -> Vec<u32> {
        self.shunned()
    }

    /// The victims left after a failure, those left for [`SHUN_FOR`] dropped.
    fn shunned(&mut self) -> Vec<u32> {
        self.shunned.retain(|(_, at)| at.elapsed() < SHUN_FOR);
        self.shunned.iter().map(|&(v, _)| v).collect()
    }

    /// Leaves `victim` for [`SHUN_FOR`] after a failure to clean it: its context is
    /// dropped and no pick takes it meanwhile.
    fn abandon(&mut self, victim: u32) {
        if self.ctx.as_ref().is_some_and(|c| c.victim == victim) {
            self.ctx = None;
        }
        self.shunned.retain(|&(v, _)| v != victim);
        self.shunned.push((victim, Instant::now()));
        self.stats.victims_abandoned += 1;
    }

    /// Sends the chunks relocations sealed to the writer thread (or writes them here).
    fn hand_over_pending(&mut self) -> Result<(), crate::Error> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let p = std::mem::take(&mut self.pending);
        let unsent = match &self.writers {
            Some(w) => w.send(p),
            None => Some(p),
        };
        if let Some(p) = unsent {
            self.ftl.write_pending(p)?;
        }
        Ok(())
    }

    /// The victim being cleaned, if a slice was preempted.
    pub fn current_victim(&self) -> Option<u32> {
        self.ctx.as_ref().map(|c| c.victim)
    }

    /// Runs one slice. `foreground_waiting` is asked when the budget is spent. A victim
    /// whose cleaning fails ([`crate::Error::victim_at_fault`]) is left for [`SHUN_FOR`]
    /// and the error returned; the next slice cleans another.
    pub fn run_slice(
        &mut self,
        policy: Policy,
        budget: Budget,
        foreground_waiting: &dyn Fn() -> bool,
    ) -> Result<SliceEnd, crate::Error> {
        let r = self.slice(policy, budget, foreground_waiting);
        if let Some(victim) = r.as_ref().err().and_then(|e| e.victim_at_fault()) {
            self.abandon(victim);
        }
        r
    }

    fn slice(
        &mut self,
        policy: Policy,
        budget: Budget,
        foreground_waiting: &dyn Fn() -> bool,
    ) -> Result<SliceEnd, crate::Error> {
        self.stats.slices += 1;
        if self.ctx.is_none() {
            let prepared = match self.take_prefetched(policy) {
                Some(p) => p,
                None => {
                    let wb = self.window_blocks;
                    let shunned = self.shunned();
                    let mut found = prepare(&self.ftl, &self.wear, policy, &shunned, wb, None)?;
                    // Every candidate left after a failure: the one left longest (the
                    // first: a failure puts a victim last) is taken again rather than
                    // none, or the cleaner stopped for SHUN_FOR (60 s, past a writer's
                    // wait for space) with the device working again after a spell of
                    // read errors (found by review, 2026-11-30); only that one, so one
                    // with a lasting fault is not taken at every slice before the others.
                    if found.is_none() && !shunned.is_empty() {
                        found = prepare(&self.ftl, &self.wear, policy, &shunned[1..], wb, None)?;
                    }
                    match found {
                        Some(p) => p,
                        None => return Ok(SliceEnd::NoVictim),
                    }
                }
            };
            self.stats.pick_ns += prepared.pick_ns;
            self.stats.read_ns += prepared.read_ns;
            self.stats.count_reads(prepared.reads);
            self.stats.wear_victims += prepared.wear as u64;
            self.stats.chosen_ahead += prepared.ahead as u64;
            self.stats.wear_extra_blocks = self.wear.spent();
            let cap = crate::policy::data_capacity(self.ftl.geometry().blocks_per_segment());
            let tenth = (prepared.blocks.len() as u64 * 10 / u64::from(cap)).min(9) as usize;
            self.victim_utilization[tenth] += 1;
            let victim = prepared.victim;
            self.ctx = Some(Context {
                victim,
                blocks: prepared.blocks,
                next: 0,
                loaded: prepared.loaded,
                reuses: prepared.reuses,
                relisted: false,
                scanned: false,
                scan_at: 0,
                found: Vec::new(),
            });
            self.prefetch_next(policy, victim);
        }
        let mut slice_start = Instant::now();
        let mut slice_moved = 0usize;
        let mut moved = 0usize;
        loop {
            let Some(ctx) = self.ctx.as_mut() else {
                return Ok(SliceEnd::NoVictim);
            };
            if ctx.next >= ctx.blocks.len() {
                let (victim, reuses) = (ctx.victim, ctx.reuses);
                // Every listed block moved or died, and nothing new enters a closed
                // segment: one still counting live blocks in the life its list was read
                // from may hold some its summaries do not name (a damaged summary ends
                // the walk before their chunks). Taken again it lists the same nothing,
                // at every turn, freeing nothing (greedy takes it first: it holds the
                // fewest live blocks). The segment may also have been freed and reused
                // meanwhile (its listed blocks all died): then its reuse count moved,
                // before or after the live blocks were counted.
                let same_life = || self.ftl.segment_reuses(victim) == reuses;
                let hidden = if same_life() {
                    self.ftl.segment_valid(victim)
                } else {
                    0
                };
                if hidden > 0 && same_life() {
                    // A user's overwrite or TRIM changes the map a moment before the
                    // count (the map under its page lock, then the count): blocks the
                    // first list missed for that reason, or a chunk still being written
                    // then, are named by a second list, and moved too.
                    if !ctx.relisted {
                        ctx.relisted = true;
                        let again = self.ftl.live_blocks(victim);
                        // Freed meanwhile (it is no closed segment then): its life is over.
                        if !same_life() {
                            return Ok(self.cleaned(victim, moved));
                        }
                        let again = again.map_err(crate::Error::of_victim(victim))?;
                        if !again.is_empty() {
                            ctx.restart(again, self.window_blocks);
                        }
                        // Its count again: it may have caught up meanwhile.
                        continue;
                    }
                    // Still none named: a damaged summary ended the walk before their
                    // chunks. The map knows where they are: a scan of all of it, once a
                    // cleaning, SCAN_PAGES at a time (it yields to users' I/O between
                    // steps as moving blocks does). Each block found is moved as any
                    // other, verified against its entry's checksum. Before, such a victim
                    // was left uncleaned, its space held until the index was rebuilt.
                    // Not for a victim with one such end already (a count gone wrong
                    // needs no second scan to be told from damage: the first found
                    // nothing).
                    if !ctx.scanned && !self.suspects.contains(&(victim, reuses)) {
                        let pages = self.ftl.map_pages();
                        let end = (ctx.scan_at + SCAN_PAGES).min(pages);
                        let found = self.ftl.mapped_blocks_in(victim, ctx.scan_at..end);
                        // Freed and taken again during the step (its blocks all died):
                        // what the step found may be its new life's, still being written
                        // (found by review). The old life's cleaning is over.
                        if !same_life() {
                            return Ok(self.cleaned(victim, moved));
                        }
                        ctx.found
                            .extend(found.map_err(crate::Error::of_victim(victim))?);
                        ctx.scan_at = end;
                        if end < pages {
                            if slice_start.elapsed() >= budget.time && foreground_waiting() {
                                self.stats.preemptions += 1;
                                return Ok(SliceEnd::Preempted { victim, moved });
                            }
                            continue;
                        }
                        ctx.scanned = true;
                        let found = std::mem::take(&mut ctx.found);
                        if !found.is_empty() {
                            self.stats.unnamed_live_found += found.len() as u64;
                            ctx.restart(found, self.window_blocks);
                            continue;
                        }
                    }
                    self.ctx = None;
                    self.stats.unnamed_live_ends += 1;
                    // Counted, yet named by nothing: a count gone wrong, or a passing
                    // state (a count a moment behind the map). The second such end of
                    // the same life leaves it as a victim that fails (SHUN_FOR): taken
                    // again at every turn it would free nothing.
                    let ftl = &self.ftl;
                    self.suspects.retain(|&(v, r)| ftl.segment_reuses(v) == r);
                    if let Some(i) = self.suspects.iter().position(|&x| x == (victim, reuses)) {
                        self.suspects.remove(i);
                        return Err(crate::Error::Victim {
                            victim,
                            source: ftl::Error::Corrupt(format!(
                                "{hidden} live blocks it counts are not named by its chunk \
                                 summaries nor by the map (a live count gone wrong): left \
                                 uncleaned"
                            )),
                        });
                    }
                    if self.suspects.len() >= MAX_SUSPECTS {
                        self.suspects.remove(0);
                    }
                    self.suspects.push((victim, reuses));
                    return Ok(SliceEnd::Finished { victim, moved });
                }
                return Ok(self.cleaned(victim, moved));
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
            // Read the live blocks of the next block's window at once (large concurrent
            // reads), then relocate each with a compare-and-swap: blocks the user rewrote
            // meanwhile stay.
            let b = ctx.blocks[ctx.next];
            let victim = ctx.victim;
            let wb = self.window_blocks;
            let window = b.entry.pba().map(|p| p as u64 / wb);
            if let Some(w) = window.filter(|&w| ctx.loaded != Some(w)) {
                let t = Instant::now();
                let end = ctx.blocks[ctx.next..]
                    .iter()
                    .position(|x| x.entry.pba().map(|p| p as u64 / wb) != Some(w))
                    .map_or(ctx.blocks.len(), |k| ctx.next + k);
                ctx.loaded = None;
                let reads = self
                    .ftl
                    .read_live_window(w * wb, &ctx.blocks[ctx.next..end], &mut self.window)
                    .map_err(crate::Error::of_victim(victim))?;
                ctx.loaded = Some(w);
                self.stats.read_ns += t.elapsed().as_nanos() as u64;
                self.stats.count_reads(reads);
            }
            let t = Instant::now();
            let moved_now = match (b.entry.pba(), window) {
                (Some(p), Some(w)) => {
                    let at = (p as u64 - w * wb) as usize * BLOCK_SIZE;
                    let stream = (self.gc_stream)(b.lba);
                    let moved = self.ftl.relocate_deferred(
                        b.lba,
                        b.entry,
                        &self.window[at..at + BLOCK_SIZE],
                        stream,
                        &mut self.pending,
                    );
                    self.hand_over_pending()?;
                    moved.map_err(|e| relocation_error(victim, e))?
                }
                _ => false,
            };
            // Past the block only once it moved or needed no move: a slice that failed
            // on it (out of space) tries it again.
            if let Some(ctx) = self.ctx.as_mut() {
                ctx.next += 1;
            }
            if moved_now {
                self.stats.blocks_copied += 1;
                moved += 1;
                slice_moved += 1;
            } else {
                self.stats.blocks_skipped += 1;
            }
            self.stats.relocate_ns += t.elapsed().as_nanos() as u64;
        }
    }
}

/// A relocation of a block of `victim` failed: the victim's fault only when the block
/// fails its checksum. A chunk write or an index read failing is the device's or the
/// index's, and shunning a healthy victim for it sent the cleaner on to the next one, and
/// the next (found by review, 2026-11-29).
fn relocation_error(victim: u32, e: ftl::Error) -> crate::Error {
    match e {
        e @ ftl::Error::DataChecksum { .. } => crate::Error::of_victim(victim)(e),
        e => crate::Error::Ftl(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_block_failing_its_checksum_blames_its_victim() {
        let bad = ftl::Error::DataChecksum { lba: 3, pba: 9 };
        assert_eq!(relocation_error(7, bad).victim_at_fault(), Some(7));
        let io = ftl::Error::io("chunk write", 0, std::io::Error::from_raw_os_error(5));
        assert_eq!(relocation_error(7, io).victim_at_fault(), None);
        let index = ftl::Error::Index("page read".into());
        assert_eq!(relocation_error(7, index).victim_at_fault(), None);
    }

    #[test]
    fn per_victim_times_average_over_the_victims_cleaned() {
        assert_eq!(CleanerStats::default().per_victim(), VictimTimes::default());
        let s = CleanerStats {
            segments_cleaned: 4,
            pick_ns: 12_000_000,
            read_ns: 14_000_000,
            relocate_ns: 8_000_000,
            prefetch_wait_ns: 2_000_000,
            victim_reads: 100,
            victim_read_bytes: 4 << 20,
            ..Default::default()
        };
        let t = s.per_victim();
        assert_eq!(
            (t.pick_ms, t.read_ms, t.relocate_ms, t.waiting_ms),
            (3.0, 3.5, 2.0, 0.5)
        );
        assert_eq!((t.reads, t.read_kib), (25.0, 1024.0));
    }

    /// With every candidate left after failures, a slice takes one of them again rather
    /// than none: the cleaner stopped for [`SHUN_FOR`] though the device worked again.
    #[test]
    fn a_slice_with_every_victim_shunned_takes_one_again() {
        use ftl::model::{block_for, mem_ftl};
        let opts = ftl::FormatOptions {
            segment_bytes: Some(64 << 10),
            ..Default::default()
        };
        let (_dev, _, f) = mem_ftl(64 * (64 << 10), &opts);
        let f = Arc::new(f);
        let n = 4 * f.geometry().blocks_per_segment() as u64;
        for l in 0..n {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        for l in (0..n).step_by(2) {
            f.write(l, &block_for(l, 2), false, StreamId(1)).unwrap();
        }
        f.flush().unwrap();
        let mut c = Cleaner::new(f.clone());
        let candidates: Vec<u32> = f
            .segment_snapshot()
            .into_iter()
            .filter(|s| s.state == "closed" && s.segment != 0 && s.valid > 0)
            .map(|s| s.segment)
            .collect();
        assert!(!candidates.is_empty());
        // The one left longest is taken, not whichever greedy likes best.
        let target = candidates[0];
        c.abandon(target);
        for &v in candidates.iter().rev().filter(|&&v| v != target) {
            c.abandon(v);
        }
        match c.run_slice(Policy::Greedy, Budget::unbounded(), &|| false) {
            Ok(SliceEnd::Finished { victim, .. }) => {
                assert_eq!(victim, target, "the one left longest")
            }
            other => panic!("a shunned victim is taken when there is no other: {other:?}"),
        }
    }

    /// A victim with a block that does not read back (its checksum fails) is left for
    /// [`SHUN_FOR`]: the slice fails once, and the next slices clean other victims
    /// instead of taking it again at every turn (the cleaner stopped freeing space, and
    /// writers ran into ENOSPC). The block still reads as EIO, its neighbours moved or not.
    #[test]
    fn a_victim_with_an_unreadable_block_is_left_and_others_are_cleaned() {
        use ftl::model::{block_for, mem_ftl};
        let opts = ftl::FormatOptions {
            segment_bytes: Some(64 << 10),
            ..Default::default()
        };
        let (dev, _, f) = mem_ftl(64 * (64 << 10), &opts);
        let f = Arc::new(f);
        let geo = *f.geometry();
        let n = 6 * geo.blocks_per_segment() as u64;
        for l in 0..n {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        f.flush().unwrap();
        let seg_of = |l: u64| geo.segment_of(f.map_entry(l).unwrap().pba().unwrap() as u64);
        // B: every block but x overwritten (the best victim by far), x corrupted.
        let x = 0;
        let bad = seg_of(x);
        let in_b: Vec<u64> = (0..n).filter(|&l| l != x && seg_of(l) == bad).collect();
        // Others: every other block of the rest overwritten.
        let halves: Vec<u64> = (0..n).filter(|&l| seg_of(l) != bad && l % 2 == 0).collect();
        for &l in in_b.iter().chain(&halves) {
            f.write(l, &block_for(l, 2), false, StreamId(1)).unwrap();
        }
        f.flush().unwrap();
        let pba = f.map_entry(x).unwrap().pba().unwrap() as u64;
        ftl::BlockDevice::write_at(&*dev, pba * BLOCK_SIZE as u64, &[0xEE; BLOCK_SIZE]).unwrap();
        let mut c = Cleaner::new(f.clone());
        let first = c.run_slice(Policy::Greedy, Budget::unbounded(), &|| false);
        match first {
            Err(crate::Error::Victim {
                victim,
                source: ftl::Error::DataChecksum { lba, .. },
            }) => assert_eq!((victim, lba), (bad, x)),
            other => panic!("the bad block fails its victim: {other:?}"),
        }
        let mut cleaned = Vec::new();
        for _ in 0..4 {
            match c.run_slice(Policy::Greedy, Budget::unbounded(), &|| false) {
                Ok(SliceEnd::Finished { victim, .. }) => cleaned.push(victim),
                other => panic!("a slice after the failure: {other:?}"),
            }
        }
        assert!(
            !cleaned.contains(&bad),
            "the failed victim was taken again: {cleaned:?}"
        );
        assert_eq!(c.stats.victims_abandoned, 1);
        // Five victims picked: the bad one with one live block, four about half live
        // (in tenths of the segment's blocks: bins 4 or 5).
        let h = c.victim_utilization;
        assert_eq!(
            (h[0], h[4] + h[5], h.iter().sum::<u64>()),
            (1, 4, 5),
            "{h:?}"
        );
        let mut b = vec![0u8; BLOCK_SIZE];
        assert!(matches!(
            f.read(x, &mut b),
            Err(ftl::Error::DataChecksum { lba: 0, .. })
        ));
        for &l in &halves {
            f.read(l, &mut b).unwrap();
            assert_eq!(ftl::model::observe(l, &b), ftl::model::Observed::Tag(2));
        }
    }

    /// A relocation that fails on a chunk write (the device's fault, not the victim's)
    /// does not shun the victim: the error is the FTL's, and the FTL turns read-only.
    #[test]
    fn a_failed_chunk_write_does_not_shun_the_victim() {
        use ftl::model::block_for;
        let (dev, f) = crate::pipeline::gated_ftl();
        let size = 64 * (64 << 10);
        let n = 6 * f.geometry().blocks_per_segment() as u64;
        for l in 0..n {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        for l in (0..n).step_by(2) {
            f.write(l, &block_for(l, 2), false, StreamId(1)).unwrap();
        }
        f.flush().unwrap();
        dev.set_bad_writes(Some((0, size)));
        let mut c = Cleaner::new(f.clone());
        let mut ends = Vec::new();
        for _ in 0..3 {
            let r = c.run_slice(Policy::Greedy, Budget::unbounded(), &|| false);
            assert!(
                r.as_ref()
                    .err()
                    .and_then(crate::Error::victim_at_fault)
                    .is_none(),
                "a victim blamed for the device: {r:?}"
            );
            ends.push(format!("{r:?}"));
        }
        assert!(ends.iter().any(|e| e.starts_with("Err")), "{ends:?}");
        assert_eq!(c.stats.victims_abandoned, 0, "{ends:?}");
        assert!(c.shunned_victims().is_empty());
    }

    /// The scan of the map for blocks a damaged summary hides goes a step at a time
    /// ([`SCAN_PAGES`], one page here) and yields to users' I/O between steps, as moving
    /// blocks does; the next slice goes on where it stopped, and every hidden block is
    /// found once. Here the victim's list names nothing (its first chunk's blocks are all
    /// overwritten; its second chunk's summary is damaged), so everything it moves, the
    /// scan found.
    #[test]
    fn the_map_scan_for_hidden_blocks_yields_between_steps_and_resumes() {
        use ftl::model::{block_for, mem_ftl, observe, Observed};
        let opts = ftl::FormatOptions {
            segment_bytes: Some(64 << 10),
            ..Default::default()
        };
        let (dev, _, f) = mem_ftl(256 * (64 << 10), &opts);
        let f = Arc::new(f);
        let geo = *f.geometry();
        let n = 6 * geo.blocks_per_segment() as u64;
        // Written last, at the end of the map: the scan reaches them in its last page.
        let base = geo.exported_blocks - n;
        for l in base..base + n {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
            if l % 5 == 4 {
                f.flush().unwrap();
            }
        }
        f.flush().unwrap();
        let pages = f.map_pages();
        assert!(pages >= 4, "{pages} map pages");
        let seg_of = |l: u64| geo.segment_of(f.map_entry(l).unwrap().pba().unwrap() as u64);
        let bad = seg_of(base);
        let chunks: Vec<(u32, Vec<u64>)> =
            ftl::chunks::SegmentChunks::new(&*dev, geo, bad, f.format_id(), (u64::MAX, u64::MAX))
                .map(|c| {
                    let (off, s) = c.unwrap();
                    let lbas = s.entries.iter().filter_map(|e| match *e {
                        ftl::summary::Entry::Data { lba, .. } => Some(lba),
                        _ => None,
                    });
                    (off, lbas.collect())
                })
                .collect();
        let hidden = [chunks[1].1[0], chunks[1].1[1]];
        let rest: Vec<u64> = (base..base + n)
            .filter(|&l| !hidden.contains(&l) && (seg_of(l) == bad || l % 2 == 0))
            .collect();
        for &l in &rest {
            f.write(l, &block_for(l, 2), false, StreamId(1)).unwrap();
        }
        f.flush().unwrap();
        let at = (geo.segment_start(bad) + chunks[1].0 as u64) * BLOCK_SIZE as u64;
        let mut summary = vec![0u8; BLOCK_SIZE];
        ftl::BlockDevice::read_at(&*dev, at, &mut summary).unwrap();
        summary[100] ^= 0xff;
        ftl::BlockDevice::write_at(&*dev, at, &summary).unwrap();
        assert_eq!(f.segment_valid(bad), 2);

        let mut c = Cleaner::new(f.clone());
        let now = Budget {
            time: Duration::ZERO,
            blocks: usize::MAX,
        };
        // One yield after each step but the last; then one at the first block it moves.
        for step in 0..pages {
            match c.run_slice(Policy::Greedy, now, &|| true) {
                Ok(SliceEnd::Preempted { victim, moved: 0 }) => assert_eq!(victim, bad),
                other => panic!("step {step} of {pages}: {other:?}"),
            }
        }
        assert_eq!(c.stats.unnamed_live_found, 2);
        match c.run_slice(Policy::Greedy, now, &|| false) {
            Ok(SliceEnd::Finished { victim, moved: 2 }) => assert_eq!(victim, bad),
            other => panic!("the hidden blocks moved: {other:?}"),
        }
        assert_eq!((c.stats.preemptions, c.stats.segments_cleaned), (pages, 1));
        let mut b = vec![0u8; BLOCK_SIZE];
        for l in hidden {
            assert_ne!(seg_of(l), bad);
            f.read(l, &mut b).unwrap();
            assert_eq!(observe(l, &b), Observed::Tag(1));
        }
    }
}
