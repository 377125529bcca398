//! The cleaner's helper threads, so that its steps overlap instead of running one after
//! another on the cleaning thread:
//! - [`Prefetcher`]: picks the next victim and reads it (its live runs, or a whole
//!   window at once when nearly all of it is live, its chunk summaries then walked in
//!   memory) while the cleaner relocates the current one;
//! - its picker (`ftl-picker`): chooses the victim after that one and lists its live
//!   blocks (one batch of summary reads where the segment table knows the chunk starts)
//!   while the prefetcher reads, so the prefetcher's turn is its reads alone. With the
//!   reads kept at a steady depth in flight ([`ftl::victim_read_depth`]), that took
//!   uniform overwrites of a full 2 GiB device from 54-69K to 58-78K IOPS in the same
//!   minutes, at the same WAF (`docs/steady.md`, "The cleaner's reads at a steady
//!   depth");
//! - writers ([`ftl::ChunkWriters`], [`GC_WRITERS`] threads): write the chunks
//!   relocations seal (`Ftl::relocate_deferred`), several in flight, while the cleaner
//!   appends the next blocks (one writer at a time left the cleaner waiting on it: 9.5
//!   ms of every 4 MiB victim).
//!
//! Measured on a full 2 GiB device under 32 random writers (`ftlblk bench --tests
//! steady`): with everything on the cleaning thread a 4 MiB victim cost 1.3 ms to pick,
//! 3 ms to read and 4.6 ms to relocate; picking from memory and overlapping the three
//! took the cleaner from 18K to about 38K user writes per second of net free space.
//!
//! A second prefetch thread (two victims prepared ahead, claimed victims excluded) was
//! tried with free records in place, 3 alternating A/B pairs: median pass 42.5-50.3K
//! against 48.2-50.5K IOPS and write p99.9 6.9-9.9 ms against 2.3-3.0 ms: more reads in
//! flight delayed the writers. Not the disk's bandwidth: fio on the same disk reads 1.5-2x
//! more beside the same writes (`docs/steady.md`, "Not the disk's bandwidth"); the shape of
//! the cleaner's reads against its writes is what limits it.
//!
//! Only [`crate::slice::Cleaner`] uses them (`Cleaner::start_helpers`). They end after
//! it is dropped, once the work in hand is done (the prefetch thread joins its picker);
//! nobody joins the prefetch thread.

use crate::policy::{pick_victim, wear_victim, Policy, WearAccount, WEAR_BURST_SEGMENTS};
use ftl::device::{AlignedBuf, BLOCK_SIZE};
use ftl::{BlockDevice, Ftl, IndexStore, LiveBlock};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Live share (percent) of a victim from which its window is read whole.
const WHOLE_WINDOW_PCT: u64 = 85;

/// Threads writing the chunks relocations seal.
pub(crate) const GC_WRITERS: usize = 4;

/// A victim picked and its live blocks listed (and, by the prefetcher, its first window
/// read), ready to be relocated.
pub(crate) struct Prepared {
    pub(crate) victim: u32,
    pub(crate) policy: Policy,
    /// Ordered by window, then LBA.
    pub(crate) blocks: Vec<LiveBlock>,
    /// The window read into the buffer that came with it, if any.
    pub(crate) loaded: Option<u64>,
    pub(crate) at: Instant,
    pub(crate) pick_ns: u64,
    pub(crate) read_ns: u64,
    /// The backing reads and bytes its first window took.
    pub(crate) reads: ftl::ReadCount,
    /// Picked by static wear levelling, not by the policy.
    pub(crate) wear: bool,
    /// What its pick spent of the wear budget (given back if it is not cleaned).
    pub(crate) wear_spent: u64,
    /// Chosen and listed by the picker thread while the victim before it was read.
    pub(crate) ahead: bool,
    /// The victim's reuse count read before its live blocks were listed: the life of
    /// the segment the list belongs to (it may be freed and reused while it is cleaned).
    pub(crate) reuses: u32,
}

/// A victim chosen and, unless it is read whole, its live blocks listed: everything
/// [`prepare`] does before the victim's reads.
pub(crate) struct Chosen {
    victim: u32,
    policy: Policy,
    /// Listed from the summaries on the device; `None` when the victim is read whole
    /// and listed from what was read.
    blocks: Option<Vec<LiveBlock>>,
    at: Instant,
    pick_ns: u64,
    wear: bool,
    wear_spent: u64,
    /// Chosen by the picker thread before it was asked for.
    ahead: bool,
    /// See [`Prepared::reuses`].
    reuses: u32,
}

/// Picks a victim under `policy` (not one of `exclude`) and, unless it is nearly all
/// live and `buf_given` (then [`finish`] reads its window whole and lists it from
/// memory), lists its live blocks. `ahead`: a victim chosen before it is asked for
/// (the prefetch thread's next); then no wear-levelling victim is taken (that is left
/// to the request, which spends its budget), and `None` says so.
fn choose<D: BlockDevice, I: IndexStore>(
    ftl: &Ftl<D, I>,
    budget: &WearBudget,
    policy: Policy,
    exclude: &[u32],
    buf_given: bool,
    ahead: bool,
) -> Result<Option<Chosen>, crate::Error> {
    let t = Instant::now();
    let snap = ftl.segment_snapshot();
    let bps = ftl.geometry().blocks_per_segment();
    let picked = pick_victim(policy, &snap, ftl.current_seq(), bps, exclude);
    // Static wear levelling first, when the wear is spread too far
    // (`policy::wear_victim`) and what it costs beyond the policy's victim fits its budget.
    let valid_of = |seg: u32| {
        snap.iter()
            .find(|s| s.segment == seg)
            .map_or(0, |s| s.valid as u64)
    };
    let wear = if ftl.config().wear_levelling {
        let user = ftl.counters().user_blocks_written;
        let burst = WEAR_BURST_SEGMENTS * bps as u64;
        let extra = |w: u32| valid_of(w).saturating_sub(picked.map_or(0, valid_of));
        let w = wear_victim(&snap, exclude);
        if ahead {
            if w.is_some_and(|w| budget.affordable(policy, extra(w), user, burst)) {
                return Ok(None);
            }
            None
        } else {
            w.map(|w| (w, extra(w)))
                .filter(|&(_, x)| budget.spend(policy, x, user, burst))
        }
    } else {
        None
    };
    let wear_spent = wear.map_or(0, |(_, x)| x);
    let wear = wear.map(|(w, _)| w);
    let Some(victim) = wear.or(picked) else {
        return Ok(None);
    };
    // Nearly all live: read the victim's first window whole, summaries and data at once
    // (the live blocks' reads would cover it anyway), and walk the summaries in memory
    // instead of one dependent read each. Below that, only the live runs are read: whole
    // 4 MiB windows of 2/3-live victims (uniform overwrites) read half as much again as
    // needed, and the extra reads doubled the writers' p99.9 (14.5 -> 7.5 ms over 3 A/B
    // runs, for 7% fewer IOPS).
    // Before any listing: a release between this read and the list shows as another
    // count (the check after cleaning then says nothing).
    let reuses = ftl.segment_reuses(victim);
    #[cfg(test)]
    tests::after_pick(victim);
    // The victim's live share, of the segment: against one window (the same on devices
    // whose segments fit a window, up to 8 MiB) a 16 MiB segment was read whole from 42%
    // live and a 256 MiB one from 2.7%, its first window however dead (found by review,
    // 2026-11-29).
    let whole = buf_given && 100 * valid_of(victim) >= WHOLE_WINDOW_PCT * bps as u64;
    let blocks = if whole {
        None
    } else {
        match ftl.live_blocks(victim) {
            Ok(b) => Some(b),
            Err(e) => {
                budget.refund(wear_spent);
                return Err(crate::Error::of_victim(victim)(e));
            }
        }
    };
    Ok(Some(Chosen {
        victim,
        policy,
        blocks,
        at: Instant::now(),
        pick_ns: t.elapsed().as_nanos() as u64,
        wear: wear.is_some(),
        wear_spent,
        ahead: false,
        reuses,
    }))
}

/// Lists a chosen victim read whole, orders its live blocks by window, then LBA
/// (cleaning also defragments), and with `buf` reads its first window's live blocks into
/// it.
fn finish<D: BlockDevice, I: IndexStore>(
    ftl: &Ftl<D, I>,
    chosen: Chosen,
    window_blocks: u64,
    buf: Option<&mut AlignedBuf>,
) -> Result<Prepared, crate::Error> {
    let t = Instant::now();
    let victim = chosen.victim;
    let window_of = |b: &LiveBlock| b.entry.pba().map_or(u64::MAX, |p| p as u64 / window_blocks);
    let first_window = ftl.geometry().segment_start(victim) / window_blocks;
    let mut buf = buf;
    let mut read_ns = 0;
    let mut reads = ftl::ReadCount::default();
    let mut loaded = None;
    let at_fault = crate::Error::of_victim;
    let mut blocks = match (chosen.blocks, buf.as_deref_mut()) {
        (Some(blocks), _) => blocks,
        (None, Some(buf)) => {
            let r = Instant::now();
            reads = ftl
                .read_window(first_window * window_blocks, buf)
                .map_err(at_fault(victim))?;
            read_ns = r.elapsed().as_nanos() as u64;
            loaded = Some(first_window);
            let within = (ftl.geometry().segment_start(victim) - first_window * window_blocks)
                as usize
                * BLOCK_SIZE;
            ftl.live_blocks_in(victim, &buf[within..])
                .map_err(at_fault(victim))?
        }
        (None, None) => ftl.live_blocks(victim).map_err(at_fault(victim))?,
    };
    blocks.sort_by_key(window_of);
    if let (Some(buf), None) = (buf, loaded) {
        let r = Instant::now();
        if let Some(w) = blocks.first().map(window_of).filter(|&w| w != u64::MAX) {
            let n = blocks.iter().take_while(|b| window_of(b) == w).count();
            reads = ftl
                .read_live_window(w * window_blocks, &blocks[..n], buf)
                .map_err(at_fault(victim))?;
            loaded = Some(w);
        }
        read_ns = r.elapsed().as_nanos() as u64;
    }
    Ok(Prepared {
        victim,
        policy: chosen.policy,
        blocks,
        loaded,
        at: Instant::now(),
        pick_ns: chosen.pick_ns + (t.elapsed().as_nanos() as u64).saturating_sub(read_ns),
        read_ns,
        reads,
        wear: chosen.wear,
        wear_spent: chosen.wear_spent,
        ahead: chosen.ahead,
        reuses: chosen.reuses,
    })
}

/// [`finish`], giving back what the pick spent of the wear budget if it fails. A victim
/// dropped before its cleaning starts (failed, stale, or left after a failure) gives its
/// spending back; one whose cleaning fails part way keeps it (some copies were made).
fn finish_or_refund<D: BlockDevice, I: IndexStore>(
    ftl: &Ftl<D, I>,
    budget: &WearBudget,
    chosen: Chosen,
    window_blocks: u64,
    buf: Option<&mut AlignedBuf>,
) -> Result<Prepared, crate::Error> {
    let spent = chosen.wear_spent;
    finish(ftl, chosen, window_blocks, buf).inspect_err(|_| budget.refund(spent))
}

/// Picks a victim under `policy` (not one of `exclude`) and lists its live blocks in
/// relocation order: by window, then by LBA (cleaning also defragments). With `buf`,
/// also reads the first window's live blocks into it.
pub(crate) fn prepare<D: BlockDevice, I: IndexStore>(
    ftl: &Ftl<D, I>,
    budget: &WearBudget,
    policy: Policy,
    exclude: &[u32],
    window_blocks: u64,
    buf: Option<&mut AlignedBuf>,
) -> Result<Option<Prepared>, crate::Error> {
    let given = buf.is_some();
    let mut buf = buf;
    let mut exclude = exclude.to_vec();
    // A victim freed between its pick and its listing or first read (users overwrote its
    // last live blocks, a free record returned it) fails as "not a closed log segment":
    // that is its death, not its fault. It was shunned for a minute and the cleaner
    // slept 100 ms while writers waited for space (found by review, 2026-11-29); the
    // next is picked instead, a few times at most.
    for _ in 0..PICK_ATTEMPTS {
        let c = match choose(ftl, budget, policy, &exclude, given, false) {
            Ok(Some(c)) => c,
            Ok(None) => return Ok(None),
            Err(e) => match e.victim() {
                Some(v) if !closed_now(ftl, v) => {
                    exclude.push(v);
                    continue;
                }
                _ => return Err(e),
            },
        };
        let (victim, reuses) = (c.victim, c.reuses);
        match finish_or_refund(ftl, budget, c, window_blocks, buf.as_deref_mut()) {
            Ok(p) => return Ok(Some(p)),
            Err(_) if died_since(ftl, victim, reuses) => exclude.push(victim),
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Victims [`prepare`] picks at most when each died before it was listed.
const PICK_ATTEMPTS: usize = 4;

/// Whether `victim` left the life its reuse count `reuses` was read in: freed (no longer
/// closed), or freed and taken again.
fn died_since<D: BlockDevice, I: IndexStore>(ftl: &Ftl<D, I>, victim: u32, reuses: u32) -> bool {
    ftl.segment_reuses(victim) != reuses || !closed_now(ftl, victim)
}

/// Whether `seg` is a closed log segment now (one the cleaner may take).
fn closed_now<D: BlockDevice, I: IndexStore>(ftl: &Ftl<D, I>, seg: u32) -> bool {
    ftl.segment_snapshot()
        .get(seg as usize)
        .is_some_and(|s| s.state == "closed")
}

/// What static wear levelling spent: copies of its victims beyond those of the victims
/// the policy would have taken, and the budget that lapsed unspent ([`WearAccount`];
/// shared by the cleaner and its prefetcher).
#[derive(Debug, Clone, Default)]
pub(crate) struct WearBudget(Arc<Mutex<WearAccount>>);

impl WearBudget {
    fn account(&self) -> std::sync::MutexGuard<'_, WearAccount> {
        // The account is two counters, whole after any panic.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether spending `extra` would fit the budget over `user_blocks` written, with
    /// `burst` blocks of it saved up at most.
    fn affordable(&self, policy: Policy, extra: u64, user_blocks: u64, burst: u64) -> bool {
        self.account()
            .spend(policy, extra, user_blocks, burst)
            .is_some()
    }

    /// Spends `extra` if it fits the budget over `user_blocks` written (`burst` saved up
    /// at most); says whether.
    fn spend(&self, policy: Policy, extra: u64, user_blocks: u64, burst: u64) -> bool {
        let mut a = self.account();
        match a.spend(policy, extra, user_blocks, burst) {
            Some(next) => {
                *a = next;
                true
            }
            None => false,
        }
    }

    /// Gives back `extra` spent for a victim that was not cleaned after all (a stale or
    /// failed prefetch): without it every stale prefetch of a wear victim spent its
    /// copies twice, once more when the cleaner picked it again, and wear levelling got
    /// about half its budget (found by review, 2026-11-27).
    pub(crate) fn refund(&self, extra: u64) {
        let mut a = self.account();
        *a = a.refund(extra);
    }

    /// Extra copies spent so far.
    pub(crate) fn spent(&self) -> u64 {
        self.account().spent
    }
}

/// A request to the prefetch thread, and its answer (with the buffer it was given).
struct Request {
    policy: Policy,
    /// The cleaner's current victim and those it left after a failure.
    exclude: Vec<u32>,
    buf: AlignedBuf,
}
type Answer = (Result<Option<Prepared>, crate::Error>, AlignedBuf);
/// The picker thread's answer.
type Choice = Result<Option<Chosen>, crate::Error>;

/// The prefetch thread's end: picks and reads the next victim while the cleaner moves
/// the current one, so victim selection, summary walks and reads overlap relocation.
pub(crate) struct Prefetcher {
    tx: mpsc::Sender<Request>,
    rx: mpsc::Receiver<Answer>,
    pending: bool,
    spare: Option<AlignedBuf>,
    /// Shared with the cleaner: an answer dropped here gives back its wear spending.
    budget: WearBudget,
}

/// A prefetched victim older than this is picked again (the device moved on).
const PREFETCH_MAX_AGE: Duration = Duration::from_millis(50);

/// A victim chosen ahead and not asked for within this is chosen again (the device
/// moved on): about four victims' time under load.
pub(crate) const AHEAD_MAX_AGE: Duration = Duration::from_millis(20);

impl Prefetcher {
    /// Starts the thread and its picker; it reads into buffers of `buf_len` bytes
    /// (windows of `window_blocks` blocks). A victim chosen ahead is used only if asked
    /// for within `ahead_max_age` ([`AHEAD_MAX_AGE`]).
    pub(crate) fn spawn<D, I>(
        ftl: &Arc<Ftl<D, I>>,
        budget: &WearBudget,
        window_blocks: u64,
        buf_len: usize,
        ahead_max_age: Duration,
    ) -> std::io::Result<Self>
    where
        D: BlockDevice + 'static,
        I: IndexStore + 'static,
    {
        let (tx, req_rx) = mpsc::channel::<Request>();
        let (ans_tx, rx) = mpsc::channel::<Answer>();
        let ftl = ftl.clone();
        let kept = budget.clone();
        let budget = budget.clone();
        let wb = window_blocks;
        std::thread::Builder::new()
            .name("ftl-prefetch".into())
            .spawn(move || {
                // The victim after the one being read, chosen and listed on a thread
                // of its own while this one reads, so that a request waits only for
                // its reads (a choice took 1.4-1.8 ms of dependent summary reads, and
                // 0.7-1.2 ms in one batch). If the picker cannot be started, every
                // victim is chosen here when asked for, as before it existed.
                let (job_tx, job_rx) = mpsc::channel::<(Policy, Vec<u32>)>();
                let (chosen_tx, chosen_rx) = mpsc::channel::<Choice>();
                let (pftl, pbudget) = (ftl.clone(), budget.clone());
                let picker =
                    std::thread::Builder::new()
                        .name("ftl-picker".into())
                        .spawn(move || {
                            // Ends when the prefetch thread (the jobs' sender) ends.
                            for (policy, exclude) in job_rx {
                                let c = choose(&pftl, &pbudget, policy, &exclude, true, true);
                                if chosen_tx.send(c).is_err() {
                                    return;
                                }
                            }
                        });
                let mut asked = false;
                // Ends when the cleaner (the requests' sender) is dropped.
                for mut r in req_rx {
                    let ahead = if std::mem::take(&mut asked) {
                        chosen_rx.recv().ok()
                    } else {
                        None
                    };
                    let chosen = match ahead {
                        Some(Ok(Some(c)))
                            if c.policy == r.policy
                                && !r.exclude.contains(&c.victim)
                                && c.at.elapsed() <= ahead_max_age =>
                        {
                            Ok(Some(Chosen { ahead: true, ..c }))
                        }
                        _ => choose(&ftl, &budget, r.policy, &r.exclude, true, false),
                    };
                    if let (Ok(Some(c)), Ok(_)) = (&chosen, &picker) {
                        let mut ex = r.exclude.clone();
                        ex.push(c.victim);
                        asked = job_tx.send((r.policy, ex)).is_ok();
                    }
                    let p = chosen.and_then(|c| {
                        c.map(|c| finish_or_refund(&ftl, &budget, c, wb, Some(&mut r.buf)))
                            .transpose()
                    });
                    if ans_tx.send((p, r.buf)).is_err() {
                        break;
                    }
                }
                // The picker ends with its jobs; it is not left reading behind this
                // thread.
                drop(job_tx);
                if let Ok(h) = picker {
                    let _ = h.join();
                }
            })?;
        Ok(Prefetcher {
            tx,
            rx,
            pending: false,
            spare: Some(AlignedBuf::new(buf_len)),
            budget: kept,
        })
    }

    /// The victim asked for, if it was picked under `policy` and is recent: its buffer
    /// is swapped into `window` (the one there becomes the spare). Waits for the thread
    /// if it is still busy. `None` when nothing was asked for, or the answer is stale,
    /// for another policy, empty or failed (the cleaner then picks in line, which
    /// reports a failure that persists).
    pub(crate) fn take(&mut self, policy: Policy, window: &mut AlignedBuf) -> Option<Prepared> {
        if !self.pending {
            return None;
        }
        self.pending = false;
        let (r, buf) = self.rx.recv().ok()?;
        match r {
            Ok(Some(p)) if p.policy == policy && p.at.elapsed() <= PREFETCH_MAX_AGE => {
                self.spare = Some(std::mem::replace(window, buf));
                Some(p)
            }
            other => {
                if let Ok(Some(p)) = other {
                    self.budget.refund(p.wear_spent);
                }
                self.spare = Some(buf);
                None
            }
        }
    }

    /// Asks for the best victim under `policy` other than those of `exclude` (the
    /// current one, and any the cleaner left after a failure).
    pub(crate) fn request(&mut self, policy: Policy, exclude: Vec<u32>) {
        if let Some(buf) = self.spare.take() {
            match self.tx.send(Request {
                policy,
                exclude,
                buf,
            }) {
                Ok(()) => self.pending = true,
                Err(e) => self.spare = Some(e.0.buf),
            }
        }
    }
}

/// A memory FTL of 64 segments of 64 KiB on a device whose operations a test can fail
/// (`GateDevice`): the device, and the FTL.
#[cfg(test)]
#[allow(clippy::type_complexity)]
pub(crate) fn gated_ftl() -> (
    Arc<ftl::device::gate::GateDevice<ftl::device::mem::MemDevice>>,
    Arc<
        ftl::Ftl<
            Arc<ftl::device::gate::GateDevice<ftl::device::mem::MemDevice>>,
            Arc<ftl::index::mem::MemIndex>,
        >,
    >,
) {
    use ftl::device::gate::GateDevice;
    use ftl::device::mem::MemDevice;
    use ftl::index::mem::MemIndex;
    let opts = ftl::FormatOptions {
        segment_bytes: Some(64 << 10),
        ..Default::default()
    };
    let dev = Arc::new(GateDevice::new(MemDevice::new(64 * (64 << 10))));
    let idx = Arc::new(MemIndex::new());
    ftl::format(&dev, &idx, &opts, false).unwrap();
    let (f, _) = ftl::Ftl::open(dev.clone(), idx, ftl::model::test_config()).unwrap();
    (dev, Arc::new(f))
}

/// A memory FTL of 64 segments of 64 KiB whose free segments are worn far past its
/// cold ones: 20 segments' worth of cold data (LBAs from 0, stream 1), then what `then`
/// writes (given the end of the cold data; it returns where the hot blocks go), then one
/// segment's worth of hot blocks rewritten 600 times in stream 2 (their segments die
/// whole and are freed and reused). Returns the FTL and the end of the hot blocks.
#[cfg(test)]
pub(crate) fn worn_mem_ftl(
    then: impl FnOnce(&ftl::model::MemFtl, u64) -> u64,
) -> (Arc<ftl::model::MemFtl>, u64) {
    use ftl::model::{block_for, mem_ftl};
    use ftl::{FormatOptions, StreamId};
    let opts = FormatOptions {
        segment_bytes: Some(64 << 10),
        ..Default::default()
    };
    let (_, _, f) = mem_ftl(64 * (64 << 10), &opts);
    let bps = f.geometry().blocks_per_segment() as u64;
    let cold = 20 * bps;
    for l in 0..cold {
        f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
    }
    let hot = then(&f, cold);
    for round in 0..600u64 {
        for l in hot..hot + bps {
            f.write(l, &block_for(l, round + 3), false, StreamId(2))
                .unwrap();
        }
    }
    (Arc::new(f), hot + bps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::wear_victim;
    use ftl::model::{block_for, mem_ftl};
    use ftl::{FormatOptions, StreamId};

    /// The picker chooses and lists the next victim while the one handed over is read:
    /// the second request is answered with a victim chosen ahead, not the one before it.
    /// A request under another policy is not answered with a choice made under the first.
    /// A wear-levelling victim the prefetcher picked and the cleaner then dropped (stale)
    /// gives its spending back: only the victim the cleaner cleans spends the budget
    /// (each stale prefetch spent it twice, once more when the cleaner picked the victim
    /// again).
    #[test]
    fn a_dropped_wear_victim_gives_its_budget_back() {
        // Cold data and a segment half overwritten (the policy's pick).
        let (f, _) = worn_mem_ftl(|f, cold| {
            let bps = f.geometry().blocks_per_segment() as u64;
            for l in cold..cold + bps {
                f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
            }
            for l in (cold..cold + bps).step_by(2) {
                f.write(l, &block_for(l, 2), false, StreamId(1)).unwrap();
            }
            cold + 2 * bps
        });
        let bps = f.geometry().blocks_per_segment() as u64;
        let snap = f.segment_snapshot();
        let w = wear_victim(&snap, &[]).expect("a wear spread wide enough for a wear victim");
        let wb = bps;
        let len = wb as usize * BLOCK_SIZE;
        let budget = WearBudget::default();
        let mut window = AlignedBuf::new(len);
        let mut pf = Prefetcher::spawn(&f, &budget, wb, len, Duration::from_secs(60)).unwrap();
        pf.request(Policy::Greedy, vec![]);
        std::thread::sleep(PREFETCH_MAX_AGE + Duration::from_millis(30));
        assert!(
            pf.take(Policy::Greedy, &mut window).is_none(),
            "a stale prefetch is dropped"
        );
        assert_eq!(
            budget.spent(),
            0,
            "the dropped wear victim {w} kept its spending"
        );
        // The cleaner picks it in line: now it spends, once.
        let p = prepare(&f, &budget, Policy::Greedy, &[], wb, None)
            .unwrap()
            .expect("a victim");
        assert!(p.wear, "the wear victim {w} is picked, not {}", p.victim);
        assert!(p.wear_spent > 0);
        assert_eq!(budget.spent(), p.wear_spent);
    }

    type Hook = std::cell::RefCell<Option<Box<dyn FnMut(u32)>>>;

    thread_local! {
        /// Test hook: run between a victim's pick and its listing, on this thread.
        static AFTER_PICK: Hook = const { std::cell::RefCell::new(None) };
    }

    pub(super) fn after_pick(victim: u32) {
        AFTER_PICK.with(|h| {
            if let Some(f) = h.borrow_mut().as_mut() {
                f(victim)
            }
        });
    }

    /// A victim freed between its pick and its listing (users overwrote its last live
    /// blocks and a free record returned it) is its death, not its fault: the next one is
    /// picked, no error (it was shunned for a minute and the cleaner slept 100 ms).
    #[test]
    fn a_victim_freed_between_its_pick_and_its_listing_is_passed_over() {
        let f = Arc::new(small_segments(32));
        let bps = f.geometry().blocks_per_segment() as u64;
        for l in 0..6 * bps {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        // Segments of the first two runs of LBAs mostly dead, the first the emptier.
        for l in (0..bps).filter(|l| l % 8 != 0) {
            f.write(l, &block_for(l, 2), false, StreamId(1)).unwrap();
        }
        for l in (bps..2 * bps).filter(|l| l % 4 != 0) {
            f.write(l, &block_for(l, 2), false, StreamId(1)).unwrap();
        }
        f.checkpoint().unwrap();
        let hooked = f.clone();
        let killed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let k = killed.clone();
        AFTER_PICK.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |victim| {
                if !k.lock().unwrap().is_empty() {
                    return;
                }
                // Every block still live in the victim overwritten, the segment freed.
                let start = hooked.geometry().segment_start(victim);
                for l in 0..hooked.capacity_blocks() {
                    let e = hooked.map_entry(l).unwrap();
                    if e.pba().is_some_and(|p| {
                        (start..start + hooked.geometry().blocks_per_segment() as u64)
                            .contains(&(p as u64))
                    }) {
                        hooked
                            .write(l, &block_for(l, 3), false, StreamId(2))
                            .unwrap();
                    }
                }
                hooked.free_dead().unwrap();
                k.lock().unwrap().push(victim);
            }))
        });
        let budget = WearBudget::default();
        let p = prepare(&*f, &budget, Policy::Greedy, &[], bps, None);
        AFTER_PICK.with(|h| *h.borrow_mut() = None);
        let first = killed.lock().unwrap()[0];
        assert_eq!(
            f.segment_snapshot()[first as usize].state,
            "free",
            "the hook freed it"
        );
        let p = p.unwrap_or_else(|e| panic!("the freed victim {first} failed the pick: {e}"));
        let p = p.expect("another victim");
        assert_ne!(p.victim, first);
        assert!(!p.blocks.is_empty());
    }

    /// A memory FTL of `segments` 64 KiB segments.
    fn small_segments(segments: u64) -> ftl::model::MemFtl {
        let opts = FormatOptions {
            segment_bytes: Some(64 << 10),
            ..Default::default()
        };
        mem_ftl(segments * (64 << 10), &opts).2
    }

    /// A victim is read whole only when nearly all of the *segment* is live: with
    /// segments larger than the window, a victim 44% live (its first window dead but for
    /// the summary) was read whole, 85% of one window's worth of live blocks.
    #[test]
    fn a_victim_larger_than_the_window_is_read_whole_only_when_nearly_all_live() {
        let f = small_segments(32);
        let bps = f.geometry().blocks_per_segment() as u64;
        let wb = bps / 2;
        // Four segments' worth of data, then the first half of the first one's overwritten.
        for l in 0..4 * bps {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        let pba = f.map_entry(0).unwrap().pba().expect("block 0 is mapped");
        let seg = f.geometry().segment_of(pba as u64);
        for l in 0..bps / 2 {
            f.write(l, &block_for(l, 2), false, StreamId(2)).unwrap();
        }
        let budget = WearBudget::default();
        let mut buf = AlignedBuf::new(wb as usize * BLOCK_SIZE);
        let p = prepare(&f, &budget, Policy::Greedy, &[], wb, Some(&mut buf))
            .unwrap()
            .expect("a victim");
        assert_eq!(p.victim, seg);
        let live = p.blocks.len() as u64;
        assert!(live > 0 && 100 * live < 85 * bps, "{live} of {bps} live");
        assert!(
            100 * live >= 85 * wb,
            "{live} live: 85% of a window or more"
        );
        assert!(
            p.reads.bytes < wb * BLOCK_SIZE as u64,
            "read {} bytes of a {}-byte window for {live} live blocks",
            p.reads.bytes,
            wb * BLOCK_SIZE as u64
        );
        for b in &p.blocks {
            assert!(b.lba >= bps / 2, "block {} was overwritten", b.lba);
        }
    }

    /// The cleaner spends no more than the burst at once: this device earned 45% of its
    /// user blocks (about 4,460 copies) while it had no wear victim, and with the burst
    /// unbounded its 20 cold segments were taken one after another (21 wear victims, 294
    /// copies).
    #[test]
    fn wear_levelling_spends_its_saved_budget_a_burst_at_a_time() {
        let (f, _) = worn_mem_ftl(|_, cold| cold);
        let bps = f.geometry().blocks_per_segment() as u64;
        let budget = WearBudget::default();
        let (mut exclude, mut wear_victims) = (Vec::new(), 0);
        for _ in 0..40 {
            let Some(p) = prepare(&f, &budget, Policy::Greedy, &exclude, bps, None).unwrap() else {
                break;
            };
            exclude.push(p.victim);
            wear_victims += u64::from(p.wear);
        }
        assert!(wear_victims > 0, "no wear victim on a worn device");
        assert!(
            budget.spent() <= WEAR_BURST_SEGMENTS * bps,
            "{} copies spent at once ({wear_victims} wear victims), the burst is {}",
            budget.spent(),
            WEAR_BURST_SEGMENTS * bps
        );
    }

    #[test]
    fn the_victim_after_the_one_handed_over_is_chosen_ahead() {
        let f = small_segments(64);
        let f = Arc::new(f);
        // Half filled, then every third block overwritten: many closed victims.
        let n = f.geometry().exported_blocks / 2;
        for l in 0..n {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        for l in (0..n).step_by(3) {
            f.write(l, &block_for(l, 2), false, StreamId(1)).unwrap();
        }
        let wb = f.geometry().blocks_per_segment() as u64;
        let len = wb as usize * BLOCK_SIZE;
        let mut window = AlignedBuf::new(len);
        // Two victims asked for in a row under greedy, the second naming the first as
        // the cleaner's current one.
        let mut two = |pf: &mut Prefetcher| {
            pf.request(Policy::Greedy, vec![0]);
            let a = pf.take(Policy::Greedy, &mut window).expect("a victim");
            std::thread::sleep(Duration::from_millis(5));
            pf.request(Policy::Greedy, vec![a.victim]);
            let b = pf
                .take(Policy::Greedy, &mut window)
                .expect("a second victim");
            assert_ne!(b.victim, a.victim);
            (a, b)
        };
        let fresh = Duration::from_secs(60);
        let mut pf = Prefetcher::spawn(&f, &WearBudget::default(), wb, len, fresh).unwrap();
        let (a, b) = two(&mut pf);
        assert!(!a.ahead, "the first victim is chosen when asked for");
        assert!(!a.blocks.is_empty());
        assert!(b.ahead, "the second was chosen while the first was read");
        assert_eq!(b.blocks, f.live_blocks(b.victim).unwrap());
        // A choice older than the age allowed is made again when asked for.
        let mut stale =
            Prefetcher::spawn(&f, &WearBudget::default(), wb, len, Duration::ZERO).unwrap();
        let (_, b2) = two(&mut stale);
        assert!(!b2.ahead, "a stale choice was used");
        // Nor is a choice made under another policy.
        pf.request(Policy::CostBenefit, vec![b.victim]);
        let c = pf
            .take(Policy::CostBenefit, &mut window)
            .expect("a third victim");
        assert!(!c.ahead, "chosen ahead under another policy");
        assert_ne!(c.victim, b.victim);
    }
}
