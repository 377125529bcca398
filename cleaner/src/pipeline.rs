//! The cleaner's helper threads, so that its steps overlap instead of running one after
//! another on the cleaning thread:
//! - [`Prefetcher`] ([`PREFETCH_DEPTH`] threads): pick the next victims and read them
//!   (their live runs, or a whole window at once when nearly all of it is live, its
//!   chunk summaries then walked in memory) while the cleaner relocates the current one;
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
//! Only [`crate::slice::Cleaner`] uses them (`Cleaner::start_helpers`); the threads end
//! when it is dropped.

use crate::policy::{pick_victim, Policy};
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
}

/// Picks a victim under `policy` (not one of `exclude`) and lists its live blocks in
/// relocation order: by window, then by LBA (cleaning also defragments). With `buf`,
/// also reads the first window's live blocks into it.
pub(crate) fn prepare<D: BlockDevice, I: IndexStore>(
    ftl: &Ftl<D, I>,
    policy: Policy,
    exclude: &[u32],
    window_blocks: u64,
    buf: Option<&mut AlignedBuf>,
) -> Result<Option<Prepared>, crate::Error> {
    let t = Instant::now();
    match pick(ftl, policy, exclude) {
        Some((victim, valid)) => {
            prepare_victim(ftl, policy, victim, valid, t, window_blocks, buf).map(Some)
        }
        None => Ok(None),
    }
}

/// The best victim under `policy` other than `exclude`, and its live-block count.
fn pick<D: BlockDevice, I: IndexStore>(
    ftl: &Ftl<D, I>,
    policy: Policy,
    exclude: &[u32],
) -> Option<(u32, u32)> {
    let snap = ftl.segment_snapshot();
    let bps = ftl.geometry().blocks_per_segment();
    let victim = pick_victim(policy, &snap, ftl.current_seq(), bps, exclude)?;
    let valid = snap
        .iter()
        .find(|s| s.segment == victim)
        .map_or(0, |s| s.valid);
    Some((victim, valid))
}

/// Lists `victim`'s live blocks (picked at `t`) and, with `buf`, reads its first window.
fn prepare_victim<D: BlockDevice, I: IndexStore>(
    ftl: &Ftl<D, I>,
    policy: Policy,
    victim: u32,
    valid: u32,
    t: Instant,
    window_blocks: u64,
    buf: Option<&mut AlignedBuf>,
) -> Result<Prepared, crate::Error> {
    let bps = ftl.geometry().blocks_per_segment();
    let window_of = |b: &LiveBlock| b.entry.pba().map_or(u64::MAX, |p| p as u64 / window_blocks);
    let first_window = ftl.geometry().segment_start(victim) / window_blocks;
    // Nearly all live: read the victim's first window whole, summaries and data at once
    // (the live blocks' reads would cover it anyway), and walk the summaries in memory
    // instead of one dependent read each. Below that, only the live runs are read: whole
    // 4 MiB windows of 2/3-live victims (uniform overwrites) read half as much again as
    // needed, and the extra reads doubled the writers' p99.9 (14.5 -> 7.5 ms over 3 A/B
    // runs, for 7% fewer IOPS; again with free records: 12-15 against 3 ms, for 15% more
    // IOPS).
    let whole =
        buf.is_some() && 100 * valid as u64 >= WHOLE_WINDOW_PCT * window_blocks.min(bps as u64);
    let mut buf = buf;
    let mut read_ns = 0;
    let mut loaded = None;
    let mut blocks = match buf.as_deref_mut() {
        Some(buf) if whole => {
            let r = Instant::now();
            ftl.read_window(first_window * window_blocks, buf)?;
            read_ns = r.elapsed().as_nanos() as u64;
            loaded = Some(first_window);
            let within = (ftl.geometry().segment_start(victim) - first_window * window_blocks)
                as usize
                * BLOCK_SIZE;
            ftl.live_blocks_in(victim, &buf[within..])?
        }
        _ => ftl.live_blocks(victim)?,
    };
    blocks.sort_by_key(window_of);
    if let (Some(buf), false) = (buf, whole) {
        let r = Instant::now();
        if let Some(w) = blocks.first().map(window_of).filter(|&w| w != u64::MAX) {
            let n = blocks.iter().take_while(|b| window_of(b) == w).count();
            ftl.read_live_window(w * window_blocks, &blocks[..n], buf)?;
            loaded = Some(w);
        }
        read_ns = r.elapsed().as_nanos() as u64;
    }
    Ok(Prepared {
        victim,
        policy,
        blocks,
        loaded,
        at: Instant::now(),
        pick_ns: (t.elapsed().as_nanos() as u64).saturating_sub(read_ns),
        read_ns,
    })
}

/// A request to the prefetch threads, with the buffer to read into and where to answer.
struct Request {
    policy: Policy,
    exclude: u32,
    buf: AlignedBuf,
    reply: mpsc::Sender<Answer>,
}
type Answer = (Result<Option<Prepared>, crate::Error>, AlignedBuf);

/// Victims prepared ahead of the cleaner, each by its own thread: a victim costs about
/// 2.6 ms of dependent summary reads and 3.8 ms of live-block reads under a full device's
/// random overwrites, against 2.3 ms to relocate it, so one thread left the cleaner
/// waiting for it half of the time.
pub(crate) const PREFETCH_DEPTH: usize = 2;

/// The prefetch threads' end: pick and read the next victims while the cleaner moves the
/// current one, so victim selection, summary walks and reads overlap relocation (and
/// each other).
pub(crate) struct Prefetcher {
    tx: mpsc::Sender<Request>,
    /// Answers asked for, oldest first.
    inflight: std::collections::VecDeque<mpsc::Receiver<Answer>>,
    spares: Vec<AlignedBuf>,
    /// Victims the threads picked whose answers the cleaner has not taken, and the one
    /// it took last (`current`, until the next take): a thread picking excludes them, so
    /// two threads never prepare the same victim, nor one the cleaner is moving.
    claimed: Arc<Mutex<Vec<u32>>>,
    current: Option<u32>,
}

/// A prefetched victim older than this is picked again (the device moved on).
const PREFETCH_MAX_AGE: Duration = Duration::from_millis(50);

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Prefetcher {
    /// Starts [`PREFETCH_DEPTH`] threads; they read into buffers of `buf_len` bytes
    /// (windows of `window_blocks` blocks).
    pub(crate) fn spawn<D, I>(
        ftl: &Arc<Ftl<D, I>>,
        window_blocks: u64,
        buf_len: usize,
    ) -> std::io::Result<Self>
    where
        D: BlockDevice + 'static,
        I: IndexStore + 'static,
    {
        let (tx, req_rx) = mpsc::channel::<Request>();
        let req_rx = Arc::new(Mutex::new(req_rx));
        let claimed = Arc::new(Mutex::new(Vec::new()));
        for i in 0..PREFETCH_DEPTH {
            let (ftl, req_rx, claimed) = (ftl.clone(), req_rx.clone(), claimed.clone());
            std::thread::Builder::new()
                .name(format!("ftl-prefetch-{i}"))
                .spawn(move || loop {
                    // Ends when the cleaner (the requests' sender) is dropped.
                    let Ok(mut r) = locked(&req_rx).recv() else {
                        return;
                    };
                    let t = Instant::now();
                    let picked = {
                        let mut c = locked(&claimed);
                        let mut exclude = c.clone();
                        exclude.push(r.exclude);
                        let p = pick(&ftl, r.policy, &exclude);
                        if let Some((v, _)) = p {
                            c.push(v);
                        }
                        p
                    };
                    let p = match picked {
                        Some((victim, valid)) => {
                            let p = prepare_victim(
                                &ftl,
                                r.policy,
                                victim,
                                valid,
                                t,
                                window_blocks,
                                Some(&mut r.buf),
                            );
                            if p.is_err() {
                                locked(&claimed).retain(|&x| x != victim);
                            }
                            p.map(Some)
                        }
                        None => Ok(None),
                    };
                    // The cleaner may be gone; the answer then goes nowhere.
                    let _ = r.reply.send((p, r.buf));
                })?;
        }
        Ok(Prefetcher {
            tx,
            inflight: Default::default(),
            spares: (0..PREFETCH_DEPTH).map(|_| AlignedBuf::new(buf_len)).collect(),
            claimed,
            current: None,
        })
    }

    /// Victims being prepared or prepared and not taken (for a pick in line to skip).
    pub(crate) fn claimed(&self) -> Vec<u32> {
        locked(&self.claimed).clone()
    }

    /// The oldest victim asked for, if it was picked under `policy` and is recent: its
    /// buffer is swapped into `window` (the one there becomes a spare). Waits for its
    /// thread if it is still busy. `None` when nothing was asked for, or the answer is
    /// stale, for another policy, empty or failed (the cleaner then picks in line, which
    /// reports a failure that persists).
    pub(crate) fn take(&mut self, policy: Policy, window: &mut AlignedBuf) -> Option<Prepared> {
        if let Some(old) = self.current.take() {
            locked(&self.claimed).retain(|&x| x != old);
        }
        let rx = self.inflight.pop_front()?;
        let (r, buf) = rx.recv().ok()?;
        match r {
            Ok(Some(p)) if p.policy == policy && p.at.elapsed() <= PREFETCH_MAX_AGE => {
                self.current = Some(p.victim);
                self.spares.push(std::mem::replace(window, buf));
                Some(p)
            }
            r => {
                if let Ok(Some(p)) = r {
                    locked(&self.claimed).retain(|&x| x != p.victim);
                }
                self.spares.push(buf);
                None
            }
        }
    }

    /// Asks for the best victims under `policy` other than `current` (and those asked
    /// for already), up to [`PREFETCH_DEPTH`] in flight.
    pub(crate) fn request(&mut self, policy: Policy, current: u32) {
        while self.inflight.len() < PREFETCH_DEPTH {
            let Some(buf) = self.spares.pop() else { return };
            let (reply, rx) = mpsc::channel();
            match self.tx.send(Request {
                policy,
                exclude: current,
                buf,
                reply,
            }) {
                Ok(()) => self.inflight.push_back(rx),
                Err(e) => {
                    self.spares.push(e.0.buf);
                    return;
                }
            }
        }
    }
}
