//! Targeted interleavings of the orderings *between* threads, each driven through its
//! window with a device that holds operations on command ([`GateDevice`]). Each test
//! names the rule it checks (see the closing list in `docs/orderings.md`).

mod common;

use common::*;
use ftl::device::crash::CrashDevice;
use ftl::device::gate::{GateDevice, GateOp};
use ftl::index::mem::MemIndex;
use ftl::model::{block_for, observe, Observed};
use ftl::{BlockDevice, Config, Error, FreeMode, Ftl, IndexStore, StreamId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type GateDev = Arc<GateDevice<Arc<CrashDevice>>>;
type GateFtl = Ftl<GateDev, Arc<MemIndex>>;

fn gated(cfg: Config) -> (Arc<GateDevice<Arc<CrashDevice>>>, Arc<MemIndex>, GateFtl) {
    gated_sized(cfg, ftl::model::tiny::DEVICE_BYTES)
}

/// [`gated`] on a device of `bytes` (the tiny geometry, more segments).
fn gated_sized(
    cfg: Config,
    bytes: u64,
) -> (Arc<GateDevice<Arc<CrashDevice>>>, Arc<MemIndex>, GateFtl) {
    let crash = Arc::new(CrashDevice::new(bytes));
    let dev = Arc::new(GateDevice::new(crash));
    let idx = Arc::new(MemIndex::new());
    ftl::format(&dev, &idx, &tiny(), false).unwrap();
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), cfg).unwrap();
    (dev, idx, f)
}

/// Fills the log of `f` (no reserve) until three segments are free, then kills the first
/// segment's blocks, so that the next checkpoint frees it. Returns the tags written.
fn kill_the_first_segment(f: &GateFtl) -> HashMap<u64, u64> {
    let mut tags: HashMap<u64, u64> = HashMap::new();
    let mut tag = 1u64;
    let cap = f.capacity_blocks();
    let mut lba = 0u64;
    while f.free_segments() > 3 {
        f.write(lba, &block_for(lba, tag), false, S0).unwrap();
        tags.insert(lba, tag);
        tag += 1;
        lba = (lba + 1) % cap;
    }
    f.flush().unwrap();
    for l in 0..20 {
        f.write(l, &block_for(l, tag), false, S0).unwrap();
        tags.insert(l, tag);
        tag += 1;
    }
    f.flush().unwrap();
    assert!(f.dead_segments() >= 1, "the first segment is dead");
    tags
}

/// Reads every tag of `tags` back from `f`.
fn check_tags(f: &GateFtl, tags: &HashMap<u64, u64>, when: &str) {
    let mut b = vec![0u8; 4096];
    for (&l, &t) in tags {
        f.read(l, &mut b)
            .unwrap_or_else(|e| panic!("{when}: read {l}: {e}"));
        assert_eq!(observe(l, &b), Observed::Tag(t), "{when}: lba {l}");
    }
}

/// Holds discards, lets `discard` (a thread) run into the discard of the freed segment,
/// and meanwhile has a writer acknowledge FUA writes for 1.5 s: none may land in the
/// segment being discarded (the discard would zero it). Then every acknowledged write
/// reads back, live and after a power cut.
fn writers_stay_out_of_a_held_discard(
    dev: Arc<GateDevice<Arc<CrashDevice>>>,
    idx: Arc<MemIndex>,
    f: Arc<GateFtl>,
    cfg: Config,
    mut tags: HashMap<u64, u64>,
    discard: impl FnOnce(Arc<GateFtl>) -> Result<(), Error> + Send + 'static,
) {
    dev.hold(GateOp::Discard);
    let ck = {
        let f = f.clone();
        std::thread::spawn(move || discard(f))
    };
    assert!(
        dev.wait_held(GateOp::Discard, Duration::from_secs(10)),
        "the discard of the freed segment is reached"
    );
    // A writer acknowledging FUA writes; it stops at the first error or after 64 writes.
    let acked = Arc::new(std::sync::Mutex::new(Vec::<(u64, u64)>::new()));
    let done = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let w = {
        let (f, acked, done, writes) = (f.clone(), acked.clone(), done.clone(), writes.clone());
        std::thread::spawn(move || {
            for i in 0..64u64 {
                let lba = 100 + i % 40;
                let tag = 1_000_000 + i;
                match f.write(lba, &block_for(lba, tag), true, StreamId(2)) {
                    Ok(()) => acked.lock().unwrap().push((lba, tag)),
                    Err(Error::NoSpace) => break,
                    Err(e) => panic!("write {i}: {e}"),
                }
                writes.fetch_add(1, Ordering::SeqCst);
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    // Give the writer time to use the free segments (and the freed one, if it could).
    let deadline = Instant::now() + Duration::from_millis(1500);
    while !done.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let violations = dev.writes_into_held_discards();
    assert!(
        writes.load(Ordering::SeqCst) > 0,
        "the writer wrote nothing: the test tested nothing"
    );
    dev.release(GateOp::Discard);
    ck.join().unwrap().unwrap();
    w.join().unwrap();
    assert_eq!(
        violations,
        0,
        "a writer wrote into a segment whose discard was pending ({} writes acknowledged)",
        writes.load(Ordering::SeqCst)
    );
    for (l, t) in acked.lock().unwrap().iter() {
        tags.insert(*l, *t);
    }
    check_tags(&f, &tags, "live");
    // Every acknowledged write was FUA or flushed: a power cut keeps them all.
    let f = Arc::into_inner(f).expect("threads joined");
    drop(f);
    dev.inner().crash(7).unwrap();
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), cfg).unwrap();
    check_tags(&f, &tags, "after a power cut");
}

/// Checkpoint rule 5 (discards as segments are freed, `discard_delay` zero): a segment
/// freed by a checkpoint is discarded BEFORE it can be allocated. A writer woken by the
/// freed space must never write into a segment whose discard is still in flight (the
/// discard would zero what the writer acknowledged).
#[test]
fn a_freed_segment_is_not_allocatable_until_its_discard_completed() {
    // No reserve: user writes may take every free segment, so a writer reaches the
    // freed one as soon as the others are used.
    let cfg = Config {
        gc_reserve_segments: 0,
        discard_delay: Duration::ZERO,
        ..Config::default()
    };
    let (dev, idx, f) = gated(cfg.clone());
    let tags = kill_the_first_segment(&f);
    writers_stay_out_of_a_held_discard(dev, idx, Arc::new(f), cfg, tags, |f| {
        f.checkpoint().map(|_| ())
    });
}

/// No reserve (user writes may take every free segment) and discards deferred by an hour
/// (only `discard_waiting(true)` discards).
fn deferred_discards() -> Config {
    Config {
        gc_reserve_segments: 0,
        discard_delay: Duration::from_secs(3600),
        ..Config::default()
    }
}

/// Discard rule 1 (deferred discards, `engine/discard.rs`): a free segment being
/// discarded is out of the free list until its discard completed, so no writer is handed
/// it meanwhile.
#[test]
fn a_segment_being_discarded_later_is_not_allocatable_meanwhile() {
    let cfg = deferred_discards();
    let (dev, idx, f) = gated(cfg.clone());
    let tags = kill_the_first_segment(&f);
    f.checkpoint().unwrap();
    // Freed, not discarded: it waits for the delay.
    assert!(f.undiscarded_segments() >= 1);
    assert_eq!(dev.inner().discarded_bytes(), 0);
    assert_eq!(f.discard_waiting(false), 0, "nothing waited an hour");
    writers_stay_out_of_a_held_discard(dev, idx, Arc::new(f), cfg, tags, |f| {
        assert!(f.discard_waiting(true) >= 1);
        Ok(())
    });
}

/// `Ftl::close` discards every freed segment still waiting, the reserve's too: the
/// discarder leaves the reserve and one more segment in the free list while writers may
/// run (rule 5), and close used it, so on a nearly full device up to that many freed
/// segments kept their backing space after a clean stop (the queue is lost with the
/// process). Found by review, 2026-11-29.
#[test]
fn close_discards_every_segment_waiting_for_its_discard() {
    let cfg = Config {
        discard_delay: Duration::from_secs(3600),
        ..Config::default()
    };
    let keep = cfg.gc_reserve_segments + 1;
    let (dev, _idx, f) = gated(cfg);
    let cap = f.capacity_blocks();
    // Sequential overwrites (no cleaner runs): whole segments die and writers free them.
    let mut n = 0u64;
    while n < cap || !(f.free_segments() <= keep && f.undiscarded_segments() >= 1) {
        let l = n % cap;
        f.write(l, &block_for(l, 1 + n / cap), false, StreamId(1))
            .unwrap();
        n += 1;
        assert!(
            n < 100 * cap,
            "never reached {keep} free segments, some freed"
        );
    }
    let before = dev.inner().discarded_bytes();
    f.close().unwrap();
    assert_eq!(
        f.undiscarded_segments(),
        0,
        "close left freed segments undiscarded"
    );
    assert!(dev.inner().discarded_bytes() > before);
}

/// Discard rule 2: a free segment a writer took before its deferred
/// discard is never discarded afterwards (the discard would wipe what the writer wrote).
#[test]
fn a_segment_reused_before_its_discard_keeps_its_data() {
    let cfg = deferred_discards();
    let (dev, _idx, f) = gated(cfg);
    let mut tags = kill_the_first_segment(&f);
    f.checkpoint().unwrap();
    let waiting: Vec<u32> = f
        .segment_snapshot()
        .iter()
        .filter(|s| s.state == "free")
        .map(|s| s.segment)
        .collect();
    assert!(f.undiscarded_segments() >= 1);
    // Write until every segment free after the checkpoint (the freed one among them) is
    // taken.
    let still_free = |f: &GateFtl| {
        f.segment_snapshot()
            .iter()
            .any(|s| waiting.contains(&s.segment) && s.state == "free")
    };
    let mut i = 0u64;
    while still_free(&f) {
        let lba = 100 + i % 40;
        f.write(lba, &block_for(lba, 2_000_000 + i), true, StreamId(2))
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
        tags.insert(lba, 2_000_000 + i);
        i += 1;
        assert!(i < 100_000, "the freed segments were never taken");
    }
    let open: Vec<u32> = f
        .segment_snapshot()
        .iter()
        .filter(|s| waiting.contains(&s.segment) && s.state != "free")
        .map(|s| s.segment)
        .collect();
    assert!(
        !open.is_empty(),
        "a segment waiting for its discard was reused"
    );
    assert_eq!(f.discard_waiting(true), 0, "a reused segment was discarded");
    assert_eq!(dev.inner().discarded_bytes(), 0);
    check_tags(&f, &tags, "after the discards");
}

/// A gated FTL with deferred discards whose first segment died and was freed by a
/// checkpoint: the FTL, the tags written and the freed segments waiting for a discard.
fn freed_awaiting_discard() -> (GateDev, GateFtl, HashMap<u64, u64>, Vec<u32>) {
    let (dev, _idx, f) = gated(deferred_discards());
    let tags = kill_the_first_segment(&f);
    f.checkpoint().unwrap();
    let waiting: Vec<u32> = f
        .segment_snapshot()
        .iter()
        .filter(|s| s.state == "free" && s.erase_count > 0)
        .map(|s| s.segment)
        .collect();
    assert!(!waiting.is_empty(), "a dead segment was freed");
    (dev, f, tags, waiting)
}

/// Discard rule 3: a segment discarded later has its first block zeroed again after the
/// discard, which need not leave zeros (here it leaves 0xA5 bytes), so the log walker
/// sees nothing of its old use.
#[test]
fn a_deferred_discard_leaves_the_segment_head_zeroed() {
    let (dev, f, tags, waiting) = freed_awaiting_discard();
    dev.set_discard_fill(Some(0xA5));
    assert!(f.discard_waiting(true) >= waiting.len());
    let geo = *f.geometry();
    let mut b = vec![0u8; 4096];
    for &s in &waiting {
        let start = geo.segment_start(s) * 4096;
        dev.read_at(start, &mut b).unwrap();
        assert!(
            b.iter().all(|&x| x == 0),
            "segment {s}'s first block after its discard: {:#x}",
            b[0]
        );
        let walk =
            ftl::chunks::SegmentChunks::new(&*dev, geo, s, f.format_id(), (u64::MAX, u64::MAX));
        assert_eq!(walk.count(), 0, "segment {s} shows no chunk");
        // The rest of it is what the discard left.
        dev.read_at(start + 4096, &mut b).unwrap();
        assert!(
            b.iter().all(|&x| x == 0xA5),
            "the discard reached segment {s}"
        );
    }
    check_tags(&f, &tags, "after the discards");
}

/// Writes with `write` until `free` segments are free, one of them waiting for its
/// discard, then holds discards at the gate and starts a discarder of every segment
/// waiting; returns it (its count of segments discarded).
fn discarder_held_at(
    dev: &GateDev,
    f: &Arc<GateFtl>,
    free: usize,
    mut write: impl FnMut(),
) -> std::thread::JoinHandle<usize> {
    while f.free_segments() > free {
        write();
    }
    assert_eq!(
        f.undiscarded_segments(),
        1,
        "one free segment waits for its discard"
    );
    dev.hold(GateOp::Discard);
    let f = f.clone();
    std::thread::spawn(move || f.discard_waiting(true))
}

/// Discard rule 5: the discarder leaves the reserve and one segment more in the free
/// list. Here the last free segment waits for its discard while a writer needs a new
/// segment and no cleaner runs: the discard (held) must not take it, or the writer
/// fails with no space while a segment is free.
#[test]
fn a_discard_never_takes_the_reserve_from_a_writer() {
    let (dev, _idx, f) = gated(deferred_discards());
    let f = Arc::new(f);
    let mut tags = kill_the_first_segment(&f);
    f.checkpoint().unwrap();
    let cap = f.capacity_blocks();
    let (mut lba, mut tag) = (0u64, 1_000_000u64);
    let mut write = |f: &GateFtl, tags: &mut HashMap<u64, u64>| {
        f.write(lba, &block_for(lba, tag), false, S0)?;
        tags.insert(lba, tag);
        tag += 1;
        lba = (lba + 7) % cap;
        Ok::<(), Error>(())
    };
    // Down to one free segment: the one just freed (the most worn is taken last).
    let discarder = discarder_held_at(&dev, &f, 1, || write(&f, &mut tags).unwrap());
    // The discarder either takes the segment (and is held at the gate) or leaves it and
    // returns: waited for, not timed (a discarder not yet scheduled after a fixed wait
    // let the mutant pass).
    let deadline = Instant::now() + Duration::from_secs(10);
    let took_it = loop {
        if dev.wait_held(GateOp::Discard, Duration::from_millis(10)) {
            break true;
        }
        if discarder.is_finished() {
            break false;
        }
        assert!(
            Instant::now() < deadline,
            "the discarder neither returned nor reached a discard"
        );
    };
    if took_it {
        // Said at once: the writer below would wait for the held discard (rule 6).
        dev.release(GateOp::Discard);
        discarder.join().unwrap();
        panic!("the discarder took the last free segment");
    }
    // The writer runs into the end of its segment and takes the last free one.
    let open_of_s0 = |f: &GateFtl| {
        f.segment_snapshot()
            .into_iter()
            .find(|x| x.state == "open" && x.stream == S0.0)
            .map(|x| x.segment)
    };
    let first = open_of_s0(&f);
    let mut failed = None;
    for _ in 0..2 * f.geometry().blocks_per_segment() {
        if let Err(e) = write(&f, &mut tags) {
            failed = Some(e);
            break;
        }
        if open_of_s0(&f) != first {
            break;
        }
    }
    dev.release(GateOp::Discard);
    let discarded = discarder.join().unwrap();
    assert!(failed.is_none(), "a write failed: {failed:?}");
    assert_ne!(open_of_s0(&f), first, "the writer opened a new segment");
    assert_eq!(discarded, 0, "nothing discarded");
    check_tags(&f, &tags, "after the writes");
}

/// Discard rule 6: with no cleaner attached, writers of two streams each open a segment
/// while a discard holds segments out of the free list. Rule 5 left one for them; the
/// second writer found none and failed with ENOSPC at once, though the discarded
/// segments came back a moment later. Now it waits for them.
#[test]
fn writers_of_two_streams_wait_for_a_discard_without_a_cleaner() {
    const S1: StreamId = StreamId(2);
    let (dev, _idx, f) = gated(deferred_discards());
    let f = Arc::new(f);
    let mut tags = kill_the_first_segment(&f);
    f.checkpoint().unwrap();
    let cap = f.capacity_blocks();
    let mut tag = 1_000_000u64;
    let mut write = |f: &GateFtl, lba: u64, s: StreamId, tags: &mut HashMap<u64, u64>| {
        f.write(lba, &block_for(lba, tag), false, s)?;
        tags.insert(lba, tag);
        tag += 1;
        Ok::<(), Error>(())
    };
    // Down to two free segments, one of them waiting for its discard.
    let mut lba = 0u64;
    let discarder = discarder_held_at(&dev, &f, 2, || {
        write(&f, lba, S0, &mut tags).unwrap();
        lba = (lba + 7) % cap;
    });
    assert!(
        dev.wait_held(GateOp::Discard, Duration::from_secs(10)),
        "the discarder took the segment and reached its discard"
    );
    assert_eq!(f.free_segments(), 1, "rule 5 left one segment");
    // S0 runs into the end of its segment and takes the last free one.
    let open_of = |f: &GateFtl, s: StreamId| {
        f.segment_snapshot()
            .into_iter()
            .find(|x| x.state == "open" && x.stream == s.0)
            .map(|x| x.segment)
    };
    let first = open_of(&f, S0);
    while open_of(&f, S0) == first {
        write(&f, lba, S0, &mut tags).unwrap();
        lba = (lba + 7) % cap;
    }
    assert_eq!(f.free_segments(), 0);
    assert_eq!(
        f.dead_segments(),
        0,
        "no dead segment a writer could free itself"
    );
    assert_eq!(open_of(&f, S1), None, "S1 has no open segment");
    // The discard ends a little later; S1's first write waits for it.
    let release = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            dev.release(GateOp::Discard);
        })
    };
    let r = write(&f, cap - 1, S1, &mut tags);
    release.join().unwrap();
    assert_eq!(discarder.join().unwrap(), 1, "the segment was discarded");
    assert!(
        r.is_ok(),
        "S1's write failed while a discard held a segment: {r:?}"
    );
    assert!(open_of(&f, S1).is_some());
    check_tags(&f, &tags, "after the writes");
}

/// Discard rule 3 after a discard that failed having done part of its work (here: left
/// 0xA5 bytes, then reported an error): the segment's first block is zeroed all the same
/// before it goes back on the free list.
#[test]
fn a_failed_deferred_discard_still_leaves_the_segment_head_zeroed() {
    let (dev, f, tags, waiting) = freed_awaiting_discard();
    dev.set_discard_fill(Some(0xA5));
    dev.set_discard_fails(true);
    assert_eq!(f.discard_waiting(true), 0, "no discard succeeded");
    assert_eq!(f.undiscarded_segments(), 0);
    let geo = *f.geometry();
    let mut b = vec![0u8; 4096];
    for &s in &waiting {
        dev.read_at(geo.segment_start(s) * 4096, &mut b).unwrap();
        assert!(
            b.iter().all(|&x| x == 0),
            "segment {s}'s first block after its failed discard: {:#x}",
            b[0]
        );
    }
    check_tags(&f, &tags, "after the failed discards");
}

/// Discard rule 3, its failure: a segment whose first block could not be zeroed after
/// its deferred discard stays out of the free list (its head may still show its old
/// use to the log walker), as a checkpoint keeps one out; the FTL is poisoned, the data
/// still reads.
#[test]
fn a_deferred_discard_that_cannot_zero_the_head_keeps_the_segment_out() {
    let cfg = deferred_discards();
    let (dev, _idx, f) = gated(cfg);
    let tags = kill_the_first_segment(&f);
    f.checkpoint().unwrap();
    let waiting = f.undiscarded_segments();
    assert!(
        waiting > 0,
        "a dead segment was freed and waits for its discard"
    );
    let free_before = f.free_segments();
    dev.inner().faults.writes.store(true, Ordering::SeqCst);
    assert_eq!(
        f.discard_waiting(true),
        waiting,
        "the discards themselves succeed"
    );
    dev.inner().faults.writes.store(false, Ordering::SeqCst);
    assert_eq!(f.undiscarded_segments(), 0);
    assert_eq!(
        f.free_segments(),
        free_before - waiting,
        "no segment with an unzeroed head went back on the free list"
    );
    assert!(
        matches!(
            f.write(0, &block_for(0, 9), false, StreamId(1)),
            Err(Error::ReadOnly(_))
        ),
        "the failed zeroing poisoned the FTL"
    );
    check_tags(&f, &tags, "after the failed zeroing");
}

/// Engine rule 3: a FLUSH returns only once every write it covers is durable, also when
/// another thread sealed the chunk holding it and is still writing it (a sync is credited
/// only with the chunk writes that completed before it started).
#[test]
fn a_flush_waits_for_a_chunk_another_thread_is_writing() {
    let (dev, _idx, f) = gated(Config::default());
    let f = Arc::new(f);
    let stream = StreamId(1);
    let data = block_for(1, 1);
    f.write(1, &data, false, stream).unwrap();
    let pba = f.map_entry(1).unwrap().pba().unwrap() as u64;
    // W seals the chunk holding lba 1 and is held in its write.
    dev.hold(GateOp::Write);
    let w = {
        let f = f.clone();
        std::thread::spawn(move || f.close_stream(stream))
    };
    assert!(dev.wait_held(GateOp::Write, Duration::from_secs(10)));
    // X's FLUSH covers lba 1.
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (f, dev) = (f.clone(), dev.clone());
        std::thread::spawn(move || {
            let r = f.flush();
            let mut durable = vec![0u8; 4096];
            dev.inner().read_durable(pba * 4096, &mut durable).unwrap();
            let _ = tx.send((r.is_ok(), durable));
        });
    }
    let early = rx.recv_timeout(Duration::from_millis(500)).ok();
    dev.release(GateOp::Write);
    w.join().unwrap().unwrap();
    let (ok, durable) = match early {
        Some(x) => x,
        None => rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the FLUSH returns"),
    };
    assert!(ok);
    assert!(
        durable == data,
        "the FLUSH returned before the chunk holding the write it covers was durable"
    );
}

/// A closed segment whose last chunk is still being written is "closing", no victim:
/// the cleaner read its blocks before they reached the device, took the checksum
/// failure for damage and shunned a healthy victim for a minute.
#[test]
fn a_segment_whose_last_chunk_is_being_written_is_no_victim_yet() {
    let (dev, _idx, f) = gated(Config::default());
    let f = Arc::new(f);
    let stream = StreamId(1);
    f.write(1, &block_for(1, 1), false, stream).unwrap();
    let seg =
        (f.map_entry(1).unwrap().pba().unwrap() as u64 * 4096 / f.geometry().segment_bytes) as u32;
    dev.hold(GateOp::Write);
    let w = {
        let f = f.clone();
        std::thread::spawn(move || f.close_stream(stream))
    };
    assert!(dev.wait_held(GateOp::Write, Duration::from_secs(10)));
    let state = |f: &GateFtl| f.segment_snapshot()[seg as usize].state;
    assert_eq!(state(&f), "closing");
    let snap = f.segment_snapshot();
    let bps = (f.geometry().segment_bytes / 4096) as u32;
    assert_eq!(
        cleaner::policy::pick_victim(cleaner::policy::Policy::Greedy, &snap, 1 << 20, bps, &[]),
        None,
        "the only segment with data is still being written"
    );
    dev.release(GateOp::Write);
    w.join().unwrap().unwrap();
    assert_eq!(state(&f), "closed");
    let snap = f.segment_snapshot();
    assert_eq!(
        cleaner::policy::pick_victim(cleaner::policy::Policy::Greedy, &snap, 1 << 20, bps, &[]),
        Some(seg)
    );
}

/// The cleaner's reserve is spent by one stream only. Relocations split over several GC
/// streams (as the daemon's classifier splits them by age) used to open a segment each
/// down to the last free one, and `close_stream` closed the cleaner's open segment even
/// then; the soak of the concurrent harness reached a full log with no free and no open
/// segment, every closed one holding live blocks: cleaning could never finish again.
/// Now a relocation outside `GC_STREAM` keeps the reserve (it is diverted to the GC
/// stream instead), and closing a stream gives up no room while free space is at the
/// reserve: a victim always finishes and frees its segment.
#[test]
fn relocations_over_several_streams_leave_the_reserve_to_the_gc_stream() {
    let (_, _, f) = mem_ftl(ftl::model::tiny::DEVICE_BYTES, &tiny());
    let reserve = f.gc_reserve_segments();
    // Write every block, then overwrite at random until one segment more than the
    // reserve is free: every closed segment holds live blocks, some of them few.
    let mut tag = fill(&f);
    overwrite_until_free(&f, 12345, &mut tag, reserve + 1);
    f.checkpoint().unwrap();
    for s in 0..8 {
        f.close_stream(StreamId(s)).unwrap();
    }
    // Clean the greedy victims (of at least 4 live blocks) one after another, their blocks spread over streams 4..=7
    // round robin, closing every stream between blocks as an idle-stream closer might.
    let mut buf = ftl::device::AlignedBuf::new(4096);
    for round in 0..6 {
        let victim = f
            .segment_snapshot()
            .into_iter()
            .filter(|s| s.segment != 0 && s.state == "closed" && s.valid >= 4)
            .min_by_key(|s| s.valid)
            .expect("a victim");
        for (i, b) in f.live_blocks(victim.segment).unwrap().iter().enumerate() {
            assert!(f.read_live(b, &mut buf).unwrap());
            f.relocate(b.lba, b.entry, &buf, StreamId(4 + (i % 4) as u8))
                .unwrap_or_else(|e| {
                    panic!(
                        "round {round}: relocating block {i} of segment {} ({} live): {e}; \
                         free {}",
                        victim.segment,
                        victim.valid,
                        f.free_segments()
                    )
                });
            f.close_stream(StreamId(4 + (i % 4) as u8)).unwrap();
        }
        assert_eq!(f.segment_valid(victim.segment), 0);
        f.checkpoint().unwrap();
        assert!(
            f.free_segments() >= 1,
            "round {round}: the victim was freed"
        );
    }
}

/// The reserve rule in one step: with free segments at the reserve and a class stream
/// without an open segment, a relocation into that stream does not take a reserve
/// segment; it is diverted to the GC stream, whose reserve it is. (The test above runs
/// the same rule over many victims, where closing streams at the reserve, the other rule,
/// hides it.)
#[test]
fn at_the_reserve_a_relocation_into_a_class_stream_is_diverted_to_the_gc_stream() {
    relocate_at_the_reserve(StreamId(4));
}

/// The same for stream 0, the TRIM stream and the classifier's hottest class: only a
/// carry of TRIM records may take a reserve segment for it, not a relocation of data
/// (a relocation into stream 0 took one, leaving the GC stream one segment short of a
/// victim's live blocks; found by review).
#[test]
fn at_the_reserve_a_relocation_into_the_trim_stream_is_diverted_to_the_gc_stream() {
    let (f, lba) = relocate_at_the_reserve(StreamId(0));
    let geo = *f.geometry();
    let at = f.map_entry(lba).unwrap().pba().expect("mapped") as u64;
    let seg = f.segment_snapshot()[geo.segment_of(at) as usize];
    assert_eq!(
        seg.stream,
        ftl::GC_STREAM.0,
        "the block went to the GC stream"
    );
}

/// Free segments down to the reserve, no stream with an open segment: the first live
/// block of the emptiest victim relocated into `into` is diverted to the GC stream and
/// reads back. Returns the FTL and the block's LBA.
fn relocate_at_the_reserve(into: StreamId) -> (MemFtl, u64) {
    let (_, _, f) = mem_ftl(ftl::model::tiny::DEVICE_BYTES, &tiny());
    let reserve = f.gc_reserve_segments();
    let mut tag = fill(&f);
    f.checkpoint().unwrap();
    for s in 0..8 {
        f.close_stream(StreamId(s)).unwrap();
    }
    // Overwrite in S0 until its next segment takes free space down to the reserve.
    overwrite_until_free(&f, 777, &mut tag, reserve);
    assert_eq!(f.free_segments(), reserve);
    let victim = f
        .segment_snapshot()
        .into_iter()
        .filter(|s| s.segment != 0 && s.state == "closed" && s.valid > 0)
        .min_by_key(|s| s.valid)
        .expect("a victim");
    let b = f.live_blocks(victim.segment).unwrap()[0];
    let mut buf = ftl::device::AlignedBuf::new(4096);
    assert!(f.read_live(&b, &mut buf).unwrap());
    assert!(f.relocate(b.lba, b.entry, &buf, into).unwrap());
    assert_eq!(
        f.relocations_diverted(),
        1,
        "stream {} took a reserve segment (free now {})",
        into.0,
        f.free_segments()
    );
    let mut back = vec![0u8; 4096];
    f.read(b.lba, &mut back).unwrap();
    assert_eq!(observe(b.lba, &back), observe(b.lba, &buf));
    (f, b.lba)
}

/// Engine rule 10: a FLUSH leaves open a chunk that holds relocations only. A victim's
/// blocks relocated one at a time, each followed by a FLUSH (a file system's fsyncs
/// beside the cleaner), cost no summary block and no padding until a free record seals
/// their chunk; before, each FLUSH sealed it (a summary block and a flash page's padding
/// per block moved), and at the reserve a victim took more segments than it freed. A
/// user write beside them is still sealed by its FLUSH, and power cuts before and after
/// the free record keep every block readable (at its old place, then at its new one).
#[test]
fn a_flush_leaves_a_chunk_of_relocations_open_until_a_free_record_seals_it() {
    let cfg = Config::default();
    let (dev, idx, f) = gated(cfg.clone());
    let (victim, lbas) = closed_at_checkpoint(&f);
    let mut tags: HashMap<u64, u64> = (0..64).map(|l| (l, 1)).collect();
    assert!(lbas.len() >= 4, "the victim holds {} blocks", lbas.len());
    let summaries = |f: &GateFtl| f.stats().counters.summary_blocks;
    let before = summaries(&f);
    let mut buf = ftl::device::AlignedBuf::new(4096);
    for b in f.live_blocks(victim).unwrap() {
        assert!(f.read_live(&b, &mut buf).unwrap());
        assert!(f.relocate(b.lba, b.entry, &buf, ftl::GC_STREAM).unwrap());
        f.flush().unwrap();
    }
    assert_eq!(f.segment_valid(victim), 0, "every block moved");
    assert_eq!(
        summaries(&f),
        before,
        "{} FLUSHes sealed the chunk of relocations",
        lbas.len()
    );
    // A user write's chunk is sealed by its FLUSH as before.
    write_tagged(&f, [200], 2, S0, false, &mut tags);
    f.flush().unwrap();
    assert_eq!(
        summaries(&f),
        before + 1,
        "the user write's chunk was sealed"
    );
    // A power cut now: the moves are lost, the victim (not free) still holds the blocks.
    let cut = idx
        .snapshot_while(|| dev.inner().power_cut_image(3))
        .unwrap();
    assert_eq!(f.segment_snapshot()[victim as usize].state, "closed");
    // The free record seals the chunk of relocations (free rule 2) before it frees.
    f.free_dead_with(FreeMode::Seal).unwrap();
    assert_eq!(
        summaries(&f),
        before + 2,
        "the free record sealed the moves"
    );
    assert_eq!(f.segment_snapshot()[victim as usize].state, "free");
    let (cut_idx, image) = cut;
    let early = Ftl::open(
        Arc::new(CrashDevice::from_image(image.unwrap())),
        Arc::new(cut_idx),
        cfg.clone(),
    )
    .unwrap()
    .0;
    let mut b = vec![0u8; 4096];
    for (&l, &t) in &tags {
        early.read(l, &mut b).unwrap();
        assert_eq!(
            observe(l, &b),
            Observed::Tag(t),
            "cut before the free: lba {l}"
        );
    }
    cut_and_check(f, &dev, &idx, 4, cfg, &tags);
}

/// Engine rule 10 looks at the whole chunk: a user write sharing a chunk with a
/// relocation (a class stream the cleaner also relocates into), before or after it, is
/// sealed by its FLUSH and reads back after a power cut. A rule that left open any chunk
/// holding a relocation lost it (found by review, 2026-11-27: the test above writes its
/// user block into another stream).
#[test]
fn a_flush_seals_a_chunk_where_a_user_write_shares_it_with_relocations() {
    for write_first in [false, true] {
        let cfg = Config::default();
        let (dev, idx, f) = gated(cfg.clone());
        let (victim, _) = closed_at_checkpoint(&f);
        let mut tags: HashMap<u64, u64> = (0..64).map(|l| (l, 1)).collect();
        let class = StreamId(4);
        if write_first {
            write_tagged(&f, [200], 2, class, false, &mut tags);
        }
        let b = f.live_blocks(victim).unwrap()[0];
        let mut buf = ftl::device::AlignedBuf::new(4096);
        assert!(f.read_live(&b, &mut buf).unwrap());
        assert!(f.relocate(b.lba, b.entry, &buf, class).unwrap());
        assert_eq!(f.relocations_diverted(), 0, "the move went into {class:?}");
        if !write_first {
            write_tagged(&f, [200], 2, class, false, &mut tags);
        }
        f.flush().unwrap();
        cut_and_check(f, &dev, &idx, 5, cfg, &tags);
    }
}

/// Writes every block in stream 0, tagged from 1; returns the next tag.
fn fill(f: &MemFtl) -> u64 {
    let mut tag = 1u64;
    for lba in 0..f.capacity_blocks() {
        f.write(lba, &block_for(lba, tag), false, S0).unwrap();
        tag += 1;
    }
    tag
}

/// Overwrites random blocks (seeded) in stream 0 until at most `free` segments are free.
fn overwrite_until_free(f: &MemFtl, seed: u64, tag: &mut u64, free: usize) {
    let mut x = seed;
    while f.free_segments() > free {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let lba = (x >> 33) % f.capacity_blocks();
        f.write(lba, &block_for(lba, *tag), false, S0).unwrap();
        *tag += 1;
    }
}

/// A written, half-overwritten device whose fullest closed segment is a victim.
/// Every third block up to the returned bound was overwritten (tag 2; the rest tag 1).
fn device_with_a_victim() -> (MemFtl, u32, u64) {
    let (_, _, f) = mem_ftl(ftl::model::tiny::DEVICE_BYTES, &tiny());
    let cap = f.capacity_blocks();
    for lba in 0..cap {
        f.write(lba, &block_for(lba, 1), false, S0).unwrap();
    }
    let mut bound = 0;
    for lba in (0..cap).step_by(3) {
        if f.free_segments() <= f.gc_reserve_segments() + 1 {
            break;
        }
        f.write(lba, &block_for(lba, 2), false, S0).unwrap();
        bound = lba + 1;
    }
    f.checkpoint().unwrap();
    let victim = f
        .segment_snapshot()
        .into_iter()
        .filter(|s| s.segment != 0 && s.state == "closed" && s.valid > 0)
        .max_by_key(|s| s.valid)
        .expect("a closed segment with live blocks");
    (f, victim.segment, bound)
}

/// Relocations whose chunk writes are deferred (the cleaner hands them to its writer
/// threads): a chunk they sealed is below every later FLUSH, so the FLUSH must wait for
/// its write, and once written the moved blocks read back what they held. Dropped
/// unwritten (a panic on the way), they poison the FTL and complete their chunk numbers
/// (engine rule 5): a FLUSH fails instead of waiting forever.
#[test]
fn deferred_relocation_writes_are_covered_by_flush_and_never_wedge_it() {
    // Relocates live blocks of closed segments, fullest first, until a chunk is sealed.
    fn relocate_until_sealed(f: &MemFtl) -> (Vec<ftl::LiveBlock>, ftl::PendingChunks) {
        let mut segs: Vec<_> = f
            .segment_snapshot()
            .into_iter()
            .filter(|s| s.segment != 0 && s.state == "closed" && s.valid > 0)
            .collect();
        segs.sort_by_key(|s| std::cmp::Reverse(s.valid));
        let mut buf = ftl::device::AlignedBuf::new(4096);
        let mut pending = ftl::PendingChunks::default();
        let mut moved = Vec::new();
        for s in segs {
            for b in f.live_blocks(s.segment).unwrap() {
                assert!(f.read_live(&b, &mut buf).unwrap());
                assert!(f
                    .relocate_deferred(b.lba, b.entry, &buf, ftl::GC_STREAM, &mut pending)
                    .unwrap());
                moved.push(b);
                if !pending.is_empty() {
                    return (moved, pending);
                }
            }
        }
        panic!("no chunk was sealed by {} relocations", moved.len());
    }

    let (f, _, bound) = device_with_a_victim();
    let f = Arc::new(f);
    let (moved, pending) = relocate_until_sealed(&f);
    // A FLUSH started now waits for the deferred chunk...
    let done = Arc::new(AtomicBool::new(false));
    let (f2, d2) = (f.clone(), done.clone());
    let flusher = std::thread::spawn(move || {
        f2.flush().unwrap();
        d2.store(true, Ordering::SeqCst);
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !done.load(Ordering::SeqCst),
        "a FLUSH returned before the relocations' chunk was written"
    );
    // ...and returns once it is.
    f.write_pending(pending).unwrap();
    flusher.join().unwrap();
    for b in &moved {
        let mut out = vec![0u8; 4096];
        f.read(b.lba, &mut out).unwrap();
        let tag = if b.lba % 3 == 0 && b.lba < bound {
            2
        } else {
            1
        };
        assert_eq!(
            observe(b.lba, &out),
            Observed::Tag(tag),
            "block {} after its relocation",
            b.lba
        );
        assert_ne!(
            f.map_entry(b.lba).unwrap(),
            b.entry,
            "block {} did not move",
            b.lba
        );
    }

    // Dropped unwritten: poisoned, and the FLUSH fails at once instead of hanging.
    let (f, _, _) = device_with_a_victim();
    let f = Arc::new(f);
    let (_, pending) = relocate_until_sealed(&f);
    // The FLUSH is already waiting for the chunk when it is dropped.
    let (tx, rx) = std::sync::mpsc::channel();
    let f2 = f.clone();
    std::thread::spawn(move || tx.send(f2.flush()));
    std::thread::sleep(Duration::from_millis(100));
    drop(pending);
    let err = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a FLUSH waits forever for chunks that were dropped unwritten")
        .expect_err("the dropped chunks were never written");
    assert!(
        err.to_string().contains("dropped unwritten"),
        "unexpected error: {err}"
    );
}

/// The cleaner reads a victim's live blocks with few large reads into one window buffer;
/// every live block lands at its place in the window and matches its entry's crc32c.
#[test]
fn a_victims_live_blocks_read_as_one_window() {
    let (f, victim, _) = device_with_a_victim();
    let geo = *f.geometry();
    let start = geo.segment_start(victim);
    let live = f.live_blocks(victim).unwrap();
    let mut window = ftl::device::AlignedBuf::new(geo.segment_bytes as usize);
    f.read_live_window(start, &live, &mut window).unwrap();
    for b in &live {
        let at = (b.entry.pba().unwrap() as u64 - start) as usize * 4096;
        assert!(
            f.verify_block(b.lba, b.entry, &window[at..at + 4096])
                .unwrap(),
            "block {} is not where the window puts it",
            b.lba
        );
    }
    // The whole-window read (summaries included) gives the same live blocks.
    f.read_window(start, &mut window).unwrap();
    assert_eq!(f.live_blocks_in(victim, &window).unwrap(), live);
    // A block outside the window is refused, not read somewhere else.
    let mut small = ftl::device::AlignedBuf::new(4096);
    assert!(f.read_live_window(start, &live, &mut small).is_err() || live.len() <= 1);
}

// ----- free records (`engine/free.rs`) -----

/// Writes lbas 0..64 on stream S0 (the first segments fill and close), checkpoints, and
/// returns the segment holding lba 0 with the lbas mapped into it.
fn closed_at_checkpoint(f: &GateFtl) -> (u32, Vec<u64>) {
    for l in 0..64 {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    f.checkpoint().unwrap();
    in_segment_of(f, 0, 0..64)
}

/// The segment holding `lba` and the lbas of `range` mapped into it.
fn in_segment_of(f: &GateFtl, lba: u64, range: std::ops::Range<u64>) -> (u32, Vec<u64>) {
    let geo = *f.geometry();
    let seg_of = |l: u64| geo.segment_of(f.map_entry(l).unwrap().pba().unwrap() as u64);
    let seg = seg_of(lba);
    (seg, range.filter(|&l| seg_of(l) == seg).collect())
}

/// Overwrites `lbas` with `tag` on stream 2 (no FLUSH), so their segment dies.
fn kill(f: &GateFtl, lbas: &[u64], tag: u64) {
    for &l in lbas {
        f.write(l, &block_for(l, tag), false, StreamId(2)).unwrap();
    }
}

/// The segments the index holds free records for.
fn free_records(idx: &MemIndex) -> Vec<u32> {
    use ftl::index::{IndexStore, Key};
    idx.load()
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.first() == Some(&Key::FREE))
        .map(|(_, v)| ftl::records::FreeRecord::decode(&v).unwrap().segment)
        .collect()
}

/// A power cut (a seeded subset of unsynced writes kept), the offline checker, then a
/// reopen.
fn cut_check_reopen(
    dev: &Arc<GateDevice<Arc<CrashDevice>>>,
    idx: &Arc<MemIndex>,
    seed: u64,
    cfg: Config,
) -> GateFtl {
    dev.inner().crash(seed).unwrap();
    checker(dev.inner().clone(), idx.clone()).expect("the recovered map is consistent");
    Ftl::open(dev.clone(), idx.clone(), cfg).unwrap().0
}

/// A gated FTL after `lbas` were written on S0 with tag 1 (S0 closed then when `close`)
/// and a checkpoint, with the tags given.
#[allow(clippy::type_complexity)]
fn checkpointed_after(
    cfg: &Config,
    lbas: std::ops::Range<u64>,
    close: bool,
) -> (
    Arc<GateDevice<Arc<CrashDevice>>>,
    Arc<MemIndex>,
    GateFtl,
    HashMap<u64, u64>,
) {
    let (dev, idx, f) = gated(cfg.clone());
    let mut tags = HashMap::new();
    write_tagged(&f, lbas, 1, S0, false, &mut tags);
    if close {
        f.close_stream(S0).unwrap();
    }
    f.checkpoint().unwrap();
    (dev, idx, f, tags)
}

/// [`cut_check_reopen`] once `f` is dropped, then every block of `tags` read back.
fn cut_and_check(
    f: GateFtl,
    dev: &Arc<GateDevice<Arc<CrashDevice>>>,
    idx: &Arc<MemIndex>,
    seed: u64,
    cfg: Config,
    tags: &HashMap<u64, u64>,
) {
    drop(f);
    let f = cut_check_reopen(dev, idx, seed, cfg);
    check_tags(&f, tags, "after the power cut");
}

/// Every lba of `lbas` reads the block written with `tag`.
fn assert_tags(f: &GateFtl, lbas: &[u64], tag: u64) {
    for &l in lbas {
        assert_eq!(read_tag(f, l), Observed::Tag(tag), "lba {l}");
    }
}

fn read_tag(f: &GateFtl, lba: u64) -> Observed {
    let mut b = vec![0u8; 4096];
    f.read(lba, &mut b)
        .unwrap_or_else(|e| panic!("read {lba}: {e}"));
    observe(lba, &b)
}

/// Writes `lbas` with `tag` on `stream` and notes them in `tags`.
fn write_tagged(
    f: &GateFtl,
    lbas: impl IntoIterator<Item = u64>,
    tag: u64,
    stream: StreamId,
    fua: bool,
    tags: &mut HashMap<u64, u64>,
) {
    for l in lbas {
        f.write(l, &block_for(l, tag), fua, stream).unwrap();
        tags.insert(l, tag);
    }
}

/// Kills segment `seg` (its blocks `lbas` overwritten on stream 2), frees it by a free
/// record and returns the record, which lists chunks (free rule 7).
fn free_listed(
    f: &GateFtl,
    idx: &MemIndex,
    seg: u32,
    lbas: &[u64],
    tags: &mut HashMap<u64, u64>,
) -> ftl::records::FreeRecord {
    use ftl::index::{IndexStore, Key};
    write_tagged(f, lbas.iter().copied(), 2, StreamId(2), false, tags);
    assert_eq!(f.segment_valid(seg), 0);
    assert!(f.freeable_segments() >= 1, "segment {seg}");
    let r = f.free_dead().unwrap();
    assert!(r.segments_freed >= 1, "{r:?}");
    let rec = idx
        .load()
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.first() == Some(&Key::FREE))
        .map(|(_, v)| ftl::records::FreeRecord::decode(&v).unwrap())
        .find(|r| r.segment == seg)
        .expect("a free record of the segment");
    assert!(
        !rec.chunks.is_empty(),
        "the record lists its chunks: {rec:?}"
    );
    rec
}

/// Writes on stream 3, every write FUA, until segment `seg` is taken again.
fn reuse_on_stream_3(f: &GateFtl, seg: u32, tags: &mut HashMap<u64, u64>) {
    let mut i = 0u64;
    while f.segment_snapshot()[seg as usize].state == "free" {
        write_tagged(f, [200 + i % 40], 3_000_000 + i, StreamId(3), true, tags);
        i += 1;
        assert!(i < 100_000, "the freed segment was never taken again");
    }
}

/// Free rules 1 and 7: a segment the last checkpoint recorded closed is freeable; so is
/// a stream's open segment at the checkpoint, whose chunks from the checkpoint on are in
/// the chain recovery follows from that stream's cursor. Its record lists them, recovery
/// steps over them and lets the stream continue elsewhere: after the segment is reused by
/// another stream and the power is cut, every block reads what it was given.
#[test]
fn a_segment_open_at_the_checkpoint_is_freed_with_its_chunks_listed() {
    let cfg = Config::default();
    let (dev, idx, f, mut tags) = checkpointed_after(&cfg, 0..3, false);
    // Lba 0's segment is S0's open segment at the checkpoint: S0 goes on in it, then
    // closes it (and writes nothing more: its cursor at the checkpoint is the last place
    // recovery knows for it).
    write_tagged(&f, 3..6, 1, S0, false, &mut tags);
    f.close_stream(S0).unwrap();
    let (seg, lbas) = in_segment_of(&f, 0, 0..6);
    assert_eq!(lbas.len(), 6, "S0 went on in it after the checkpoint");
    free_listed(&f, &idx, seg, &lbas, &mut tags);
    // Reused by another stream, then more chunks of it there, over the place S0's
    // cursor pointed at the checkpoint (recovery must not take that place for S0's, nor
    // zero it as the chunk past S0's break).
    reuse_on_stream_3(&f, seg, &mut tags);
    write_tagged(&f, 300..312, 6, StreamId(3), true, &mut tags);
    cut_and_check(f, &dev, &idx, 13, cfg, &tags);
}

/// Free rules 1 and 7, a segment freed twice between two checkpoints: S0's open segment
/// at the checkpoint goes on in it, is freed by a record listing those chunks, is taken
/// by stream 3, whose FUA writes put chunks of its chain there, dies and is freed again.
/// The second record takes the first one's key, so it lists the chunks of both lives;
/// after the segment is reused a third time and the power is cut, recovery steps over
/// all of them and every block reads what it was given. (Listing only the second life's
/// chunks, recovery would find S0's chain broken where the first life's chunks were.)
#[test]
fn a_segment_freed_twice_between_checkpoints_lists_the_chunks_of_both_lives() {
    let cfg = Config::default();
    let (dev, idx, f, mut tags) = checkpointed_after(&cfg, 0..3, false);
    write_tagged(&f, 3..6, 1, S0, false, &mut tags);
    f.close_stream(S0).unwrap();
    let (seg, lbas) = in_segment_of(&f, 0, 0..6);
    let first = free_listed(&f, &idx, seg, &lbas, &mut tags);
    // Its second life: chunks of stream 3's chain.
    reuse_on_stream_3(&f, seg, &mut tags);
    write_tagged(&f, 240..244, 7, StreamId(3), true, &mut tags);
    f.close_stream(StreamId(3)).unwrap();
    let (again, lbas) = in_segment_of(&f, 240, 200..244);
    assert_eq!(again, seg, "stream 3 wrote on in the segment");
    let second = free_listed(&f, &idx, seg, &lbas, &mut tags);
    assert!(
        second.chunks.len() > first.chunks.len()
            && first.chunks.iter().all(|c| second.chunks.contains(c)),
        "the second record lists both lives: {first:?} then {second:?}"
    );
    reuse_on_stream_3(&f, seg, &mut tags);
    write_tagged(&f, 300..312, 8, StreamId(3), true, &mut tags);
    cut_and_check(f, &dev, &idx, 19, cfg, &tags);
}

/// A gated FTL after a checkpoint, where S0 filled the segment it had open at the
/// checkpoint and opened young ones (flushed): the young segment of lba 60 and the lbas
/// of `0..120` in it.
#[allow(clippy::type_complexity)]
fn young_segment(
    cfg: &Config,
) -> (
    Arc<GateDevice<Arc<CrashDevice>>>,
    Arc<MemIndex>,
    GateFtl,
    HashMap<u64, u64>,
    u32,
    Vec<u64>,
) {
    let (dev, idx, f, mut tags) = checkpointed_after(cfg, 0..3, false);
    write_tagged(&f, 3..120, 1, S0, false, &mut tags);
    f.flush().unwrap();
    let (open_at_ck, _) = in_segment_of(&f, 0, 0..1);
    let (seg, lbas) = in_segment_of(&f, 60, 0..120);
    assert_ne!(
        seg, open_at_ck,
        "lba 60 is in a segment opened after the checkpoint"
    );
    (dev, idx, f, tags, seg, lbas)
}

/// Free rule 7: a segment opened and closed after the checkpoint holds chunks of the chain
/// recovery replays. Freed by a record (which lists them) and reused, those chunks are
/// gone; a power cut afterwards recovers by stepping over them, and every block written
/// after them, in the reused segment among others, is found.
#[test]
fn a_young_segment_freed_by_a_record_is_stepped_over_by_recovery() {
    let cfg = Config::default();
    let (dev, idx, f, mut tags, seg, lbas) = young_segment(&cfg);
    free_listed(&f, &idx, seg, &lbas, &mut tags);
    reuse_on_stream_3(&f, seg, &mut tags);
    write_tagged(&f, 250..270, 4, StreamId(3), false, &mut tags);
    f.flush().unwrap();
    cut_and_check(f, &dev, &idx, 11, cfg, &tags);
}

/// Free rule 7 when the power cut loses the zeroing of the freed segment's first block
/// (it is written after the record's sync and not synced itself): recovery finds the young
/// segment's first chunk in place, listed by the record, and replays it instead of
/// stepping over it; every entry in it was superseded by a later one it replays too, so
/// every block reads what it was given and the checker is clean. (The code handled it;
/// the test pins it, suggested by the review of 2026-11-29.)
#[test]
fn a_young_segment_whose_head_zeroing_a_power_cut_lost_recovers() {
    let cfg = Config::default();
    let (dev, idx, f, mut tags, seg, lbas) = young_segment(&cfg);
    let head = f.geometry().segment_start(seg) * 4096;
    let mut stale = vec![0u8; 4096];
    dev.inner().read_durable(head, &mut stale).unwrap();
    assert!(
        stale.iter().any(|&b| b != 0),
        "the segment's first summary is durable"
    );
    free_listed(&f, &idx, seg, &lbas, &mut tags);
    // The record's sync made everything before its zeroing durable; the zeroing is not.
    let mut durable = vec![0u8; 4096];
    dev.inner().read_durable(head, &mut durable).unwrap();
    assert_eq!(durable, stale, "the zeroing is not durable yet");
    let (cut_idx, image) = idx.snapshot_while(|| dev.inner().current_image()).unwrap();
    let mut image = image.unwrap();
    let at = head as usize;
    assert!(
        image[at..at + 4096].iter().all(|&b| b == 0),
        "the free zeroed the head"
    );
    // A power cut now that keeps every unsynced write but the zeroing.
    image[at..at + 4096].copy_from_slice(&stale);
    drop(f);
    let (cut_dev, cut_idx) = (Arc::new(CrashDevice::from_image(image)), Arc::new(cut_idx));
    checker(cut_dev.clone(), cut_idx.clone()).expect("the cut image is consistent");
    let (g, _) = Ftl::open(cut_dev, cut_idx, cfg).unwrap();
    let mut b = vec![0u8; 4096];
    for (&l, &t) in &tags {
        g.read(l, &mut b).unwrap();
        assert_eq!(observe(l, &b), Observed::Tag(t), "lba {l}");
    }
}

/// Free rule 7, TRIM records: a TRIM record has no later entry superseding it, so a young
/// segment holding some is not freed by a record (recovery would step over the records,
/// and the checkpoint's map would still name the blocks they unmapped). Found by review.
#[test]
fn a_young_segment_with_trim_records_waits_for_a_checkpoint() {
    let cfg = Config::default();
    // Segment X holds lbas 0..8, closed before the checkpoint.
    let (dev, idx, f, mut tags) = checkpointed_after(&cfg, 0..8, true);
    let (x, x_lbas) = in_segment_of(&f, 5, 0..8);
    assert_eq!(x_lbas.len(), 8);
    // TRIM them: the TRIM stream opens a young segment with the records, which kill X.
    f.trim(0, 8).unwrap();
    for l in 0..8 {
        tags.insert(l, 0);
    }
    assert_eq!(f.segment_valid(x), 0);
    assert!(f.free_dead().unwrap().segments_freed >= 1);
    assert_eq!(f.segment_snapshot()[x as usize].state, "free");
    // The TRIM segment, closed: dead and young, but it holds TRIM records.
    let trim = ftl::TRIM_STREAM;
    let t_seg = f
        .segment_snapshot()
        .iter()
        .find(|s| s.stream == trim.0 && s.state == "open")
        .map(|s| s.segment)
        .expect("the TRIM stream's segment");
    f.close_stream(trim).unwrap();
    f.free_dead().unwrap();
    assert_ne!(
        f.segment_snapshot()[t_seg as usize].state,
        "free",
        "a young segment with TRIM records was freed by a record"
    );
    // X is reused, and the power is cut: lbas 0..8 read zeros.
    reuse_on_stream_3(&f, x, &mut tags);
    cut_and_check(f, &dev, &idx, 17, cfg, &tags);
}

/// Free rule 2: the entries that killed the segment's last blocks sit in stream 2's open
/// chunk; the free seals it (and rule 3 syncs it) before the record is committed. A power
/// cut right after the free then finds every death in the log: the checkpoint's map,
/// which still points into the freed segment, is corrected by the replay.
#[test]
fn a_free_record_seals_the_open_chunk_that_killed_the_segment() {
    let (dev, idx, f) = gated(Config::default());
    let (seg, lbas) = closed_at_checkpoint(&f);
    kill(&f, &lbas, 2);
    let r = f.free_dead().unwrap();
    assert_eq!(r.segments_freed, 1, "{r:?}");
    assert!(
        r.chunks_sealed >= 1,
        "stream 2's open chunk killed it: {r:?}"
    );
    assert_eq!(free_records(&idx), vec![seg]);
    drop(f);
    let f = cut_check_reopen(&dev, &idx, 3, Config::default());
    assert_tags(&f, &lbas, 2);
}

/// Free rule 2 with `FreeMode::Settled`: a segment whose blocks an open chunk killed is
/// left alone (nothing is sealed early); once that chunk is sealed (here by a FLUSH) the
/// segment is freed without sealing anything, and survives a power cut.
#[test]
fn a_settled_free_waits_for_the_open_chunk_that_killed_the_segment() {
    let (dev, idx, f) = gated(Config::default());
    let (seg, lbas) = closed_at_checkpoint(&f);
    kill(&f, &lbas, 2);
    assert_eq!(
        f.freeable_and_settled(),
        (1, 0),
        "stream 2's open chunk killed it"
    );
    let r = f.free_dead_with(FreeMode::Settled).unwrap();
    assert_eq!(
        (r.segments_freed, r.chunks_sealed, r.unsettled),
        (0, 0, 1),
        "{r:?}"
    );
    assert!(free_records(&idx).is_empty());
    f.flush().unwrap();
    assert_eq!(
        f.freeable_and_settled(),
        (1, 1),
        "the FLUSH sealed the killer"
    );
    let r = f.free_dead_with(FreeMode::Settled).unwrap();
    assert_eq!((r.segments_freed, r.chunks_sealed), (1, 0), "{r:?}");
    assert_eq!(free_records(&idx), vec![seg]);
    drop(f);
    let f = cut_check_reopen(&dev, &idx, 5, Config::default());
    assert_tags(&f, &lbas, 2);
}

/// Engine rule 9: a failed sync poisons the FTL BEFORE the sync group's next leader
/// runs. A checkpoint leads the group's sync and a FLUSH queues behind it (checkpoints,
/// free records and FLUSHes share one sync group); the checkpoint's sync fails. Before
/// the rule, the FLUSH woke as the failed leader left, led a sync of its own, which
/// succeeded (an fsync reports a writeback error once; a retried cache flush can succeed
/// after the cache lost data), and acknowledged writes the failed sync had lost.
#[test]
fn a_flush_queued_behind_a_failed_sync_fails_too() {
    let (dev, _idx, f) = gated(Config::default());
    let f = Arc::new(f);
    f.write(1, &block_for(1, 1), false, StreamId(1)).unwrap();
    dev.hold(GateOp::Sync);
    let ck = {
        let f = f.clone();
        std::thread::spawn(move || f.checkpoint())
    };
    assert!(dev.wait_held(GateOp::Sync, Duration::from_secs(10)));
    f.write(2, &block_for(2, 1), false, StreamId(2)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let f = f.clone();
        std::thread::spawn(move || {
            let _ = tx.send(f.flush());
        });
    }
    // The FLUSH seals and writes its chunk, then queues behind the held sync (past its
    // own poison checks: only the rule can fail it now).
    let queued = Instant::now();
    while f.sync_waiters() == 0 {
        assert!(
            queued.elapsed() < Duration::from_secs(10),
            "the FLUSH never queued behind the held sync"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    dev.fail_next_sync();
    dev.release(GateOp::Sync);
    assert!(ck.join().unwrap().is_err(), "the checkpoint's sync failed");
    let flushed = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the FLUSH returns");
    assert!(
        flushed.is_err(),
        "a FLUSH queued behind a failed sync acknowledged the writes it lost"
    );
    assert!(f.flush().is_err(), "the FTL stays poisoned");
    assert!(
        f.staging().device_error(),
        "the staging area records the device error for recovery rule 3"
    );
}

/// Free rule 3: the record is committed only after the log sync that makes the deaths
/// durable.
#[test]
fn a_free_record_is_committed_only_after_the_log_sync() {
    let (dev, idx, f) = gated(Config::default());
    let f = Arc::new(f);
    let (seg, lbas) = closed_at_checkpoint(&f);
    kill(&f, &lbas, 2);
    dev.hold(GateOp::Sync);
    let h = {
        let f = f.clone();
        std::thread::spawn(move || f.free_dead())
    };
    assert!(
        dev.wait_held(GateOp::Sync, Duration::from_secs(10)),
        "the free syncs the log"
    );
    std::thread::sleep(Duration::from_millis(50));
    assert!(free_records(&idx).is_empty(), "committed before the sync");
    assert!(f.segment_valid(seg) == 0 && f.free_segments() < 31);
    let free_before = f.free_segments();
    dev.release(GateOp::Sync);
    let r = h.join().unwrap().unwrap();
    assert_eq!(r.segments_freed, 1);
    assert_eq!(free_records(&idx), vec![seg]);
    assert_eq!(f.free_segments(), free_before + 1);
}

/// Checkpoint rule 6 (and free rule 6): the records are removed with the segment table
/// that supersedes them, by an ordinary checkpoint and by the one that starts a session
/// after a crash; a crash between a free and the next checkpoint recovers through them.
#[test]
fn a_checkpoint_removes_the_free_records_it_supersedes() {
    // No reserve: the writes below reach the freed segment at the back of the free list.
    let cfg = Config {
        gc_reserve_segments: 0,
        ..Config::default()
    };
    let (dev, idx, f) = gated(cfg.clone());
    let (seg, lbas) = closed_at_checkpoint(&f);
    kill(&f, &lbas, 2);
    assert_eq!(f.free_dead().unwrap().segments_freed, 1);
    // The freed segment is reused before the cut: new chunks in it, found by recovery.
    let mut tags: HashMap<u64, u64> = HashMap::new();
    let mut i = 0u64;
    loop {
        let l = 100 + i % 100;
        f.write(l, &block_for(l, 10 + i), false, StreamId(3))
            .unwrap();
        tags.insert(l, 10 + i);
        i += 1;
        if f.segment_snapshot()[seg as usize].state == "open" {
            break;
        }
        assert!(i < 2000, "segment {seg} was never reused");
    }
    f.flush().unwrap();
    assert_eq!(free_records(&idx), vec![seg], "no checkpoint ran meanwhile");
    drop(f);
    let f = cut_check_reopen(&dev, &idx, 9, cfg);
    assert!(
        free_records(&idx).is_empty(),
        "the open checkpoint supersedes them"
    );
    assert_tags(&f, &lbas, 2);
    for (&k, &t) in &tags {
        assert_eq!(read_tag(&f, k), Observed::Tag(t), "lba {k}");
    }
    // In a session: a free, then a checkpoint.
    let (seg2, lbas2) = in_segment_of(&f, 1, 0..64);
    kill(&f, &lbas2, 6);
    assert_eq!(f.free_dead().unwrap().segments_freed, 1);
    assert_eq!(free_records(&idx), vec![seg2]);
    f.checkpoint().unwrap();
    assert!(free_records(&idx).is_empty());
}

/// The `next_chunk_seq` of the checkpoint the index holds.
fn checkpoint_base(idx: &MemIndex) -> u64 {
    use ftl::index::{IndexStore, Key};
    let (_, v) = idx
        .load()
        .unwrap()
        .into_iter()
        .find(|(k, _)| *k == Key::checkpoint())
        .expect("a checkpoint");
    ftl::records::CheckpointRecord::decode(&v)
        .unwrap()
        .next_chunk_seq
}

/// Free rule 6: a record whose chain number the log does not reach, or that does not
/// follow the checkpoint, fails the open (the map would point into a freed segment); one
/// that names another checkpoint is stale and ignored.
#[test]
fn recovery_fails_loudly_when_a_free_record_outruns_the_log() {
    use ftl::index::Key;
    use ftl::records::FreeRecord;
    let (dev, idx, f) = gated(Config::default());
    let (seg, _) = closed_at_checkpoint(&f);
    let epoch = f.epoch();
    drop(f);
    let poke = |r: FreeRecord| idx.poke(Key::free(r.segment), r.encode());
    // The open fails on record `r`, a corruption naming `why`.
    let refused = |r: FreeRecord, why: &str| {
        // Alone in the index, so that it is this record the open refuses.
        idx.commit(vec![
            ftl::index::Op::Remove(Key::free(seg)),
            ftl::index::Op::Remove(Key::free(seg + 8)),
        ])
        .unwrap();
        poke(r);
        let err = Ftl::open(dev.clone(), idx.clone(), Config::default())
            .err()
            .expect("the open fails");
        assert!(
            matches!(&err, Error::Corrupt(m) if m.contains(why)),
            "{err}"
        );
    };
    let good = FreeRecord {
        segment: seg,
        epoch,
        base: checkpoint_base(&idx),
        chain: 1 << 40,
        erase_count: 1,
        chunks: vec![],
    };
    refused(good.clone(), "chunks are missing");
    refused(
        FreeRecord {
            epoch: epoch - 1,
            ..good.clone()
        },
        "does not follow",
    );
    // Free rule 7: chunks numbered before the checkpoint do not follow it. A chunk list
    // on a segment the checkpoint recorded closed does (it was freed, reused and freed
    // again since); this one is refused only for the log that stops short of its chain.
    refused(
        FreeRecord {
            chunks: vec![good.base + 1],
            ..good.clone()
        },
        "chunks are missing",
    );
    refused(
        FreeRecord {
            segment: seg + 8,
            chunks: vec![good.base - 1],
            ..good.clone()
        },
        "does not follow",
    );
    // Stale: it follows another checkpoint. Ignored (segment `seg` keeps its data) and
    // removed by the open checkpoint.
    idx.commit(vec![ftl::index::Op::Remove(Key::free(seg + 8))])
        .unwrap();
    poke(FreeRecord {
        base: good.base - 1,
        ..good
    });
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
    assert_eq!(read_tag(&f, 0), Observed::Tag(1));
    assert!(free_records(&idx).is_empty());
    drop(f);
    checker(dev.inner().clone(), idx.clone()).unwrap();
}

/// A free record's commit that reports a failure but was applied (sled can: the batch
/// applied, its flush failed) is superseded by the next checkpoint like any other: the
/// segment is in `freed` before the commit. Before this, such a record stayed in the
/// index and freed the segment again at a later recovery.
#[test]
fn a_free_record_whose_commit_failed_after_applying_is_superseded() {
    let (dev, idx, f) = gated(Config::default());
    let (seg, lbas) = closed_at_checkpoint(&f);
    kill(&f, &lbas, 2);
    idx.fail_after_apply.store(true, Ordering::SeqCst);
    assert!(f.free_dead().is_err());
    idx.fail_after_apply.store(false, Ordering::SeqCst);
    assert_eq!(free_records(&idx), vec![seg], "applied all the same");
    assert_eq!(f.freeable_segments(), 0, "not freed twice");
    f.checkpoint().unwrap();
    assert!(free_records(&idx).is_empty(), "the checkpoint removed it");
    for &l in &lbas {
        assert_eq!(read_tag(&f, l), Observed::Tag(2), "lba {l}");
    }
    drop(f);
    let f = cut_check_reopen(&dev, &idx, 4, Config::default());
    assert_tags(&f, &lbas, 2);
}

/// A checkpoint whose commit reports a failure but was applied may have recorded dead
/// segments free; until a checkpoint succeeds, no free record frees anything (the old
/// bitmap of closed segments would free them a second time, naming a segment the index
/// records free).
#[test]
fn after_a_failed_checkpoint_commit_nothing_is_freed_by_free_records() {
    let (dev, idx, f) = gated(Config::default());
    let (seg, lbas) = closed_at_checkpoint(&f);
    kill(&f, &lbas, 2);
    idx.fail_after_apply.store(true, Ordering::SeqCst);
    assert!(f.checkpoint().is_err());
    idx.fail_after_apply.store(false, Ordering::SeqCst);
    // The checkpoint's own free record (its rule 9) failed after applying too: the
    // segment stays dead, and the next checkpoint removes the record.
    assert_eq!(free_records(&idx), vec![seg]);
    assert_eq!(f.segment_snapshot()[seg as usize].state, "closed");
    // Free rule 7: nor a segment opened after the failed checkpoint (young to which?).
    for l in 100..140 {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    let (young, young_lbas) = in_segment_of(&f, 116, 100..140);
    kill(&f, &young_lbas, 2);
    assert_eq!(f.segment_valid(young), 0);
    assert_eq!(f.freeable_segments(), 0);
    assert_eq!(f.free_dead().unwrap().segments_freed, 0);
    assert_eq!(free_records(&idx), vec![seg], "no record added");
    assert!(f.checkpoint().unwrap().segments_freed >= 1);
    assert!(free_records(&idx).is_empty());
    drop(f);
    let f = cut_check_reopen(&dev, &idx, 5, Config::default());
    assert_tags(&f, &lbas, 2);
}

/// Checkpoint rule 7: a checkpoint whose map pages go in several index batches, cut after
/// the first: the index holds a page newer than its header and segment records, and the
/// partial-checkpoint record. Recovery replays from the old header and recounts the live
/// counts from the map: the checker is clean and every block reads what it was given.
#[test]
fn a_checkpoint_cut_between_its_page_batches_recovers() {
    let cfg = Config {
        checkpoint_page_batch: 1,
        checkpoint_blocks: 1 << 40,
        ..Config::default()
    };
    // 8 MiB: four map pages.
    let (dev, idx, f) = gated_sized(cfg.clone(), 8 << 20);
    let cap = f.capacity_blocks();
    assert!(cap > 3 * 512, "{cap} blocks: at least four map pages");
    let lbas: Vec<u64> = (0..cap).step_by(97).collect();
    for &l in &lbas {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    f.checkpoint().unwrap();
    // New places for every block (the live counts move), and a trim.
    for &l in &lbas {
        f.write(l, &block_for(l, 2), false, S0).unwrap();
    }
    f.trim(lbas[3], 1).unwrap();
    f.flush().unwrap();
    // Nothing dead left for the checkpoint's own free records (rule 9), whose commit
    // would come first.
    f.free_dead().unwrap();
    assert_eq!(f.freeable_segments(), 0);
    // The first page batch lands, the rest of the checkpoint does not.
    idx.fail_after(1);
    let err = f.checkpoint().unwrap_err();
    assert!(err.to_string().contains("injected"), "{err}");
    assert!(
        idx.load()
            .unwrap()
            .iter()
            .any(|(k, _)| k == &ftl::index::Key::partial()),
        "the partial-checkpoint record is in the index"
    );
    drop(f);
    idx.fail_after(u64::MAX >> 2);
    let f = cut_check_reopen(&dev, &idx, 7, cfg);
    for &l in &lbas {
        let want = if l == lbas[3] {
            Observed::Tag(0)
        } else {
            Observed::Tag(2)
        };
        assert_eq!(read_tag(&f, l), want, "lba {l}");
    }
    // The open checkpoint removed the record.
    assert!(!idx
        .load()
        .unwrap()
        .iter()
        .any(|(k, _)| k == &ftl::index::Key::partial()));
}

/// Checkpoint rule 7: the pages of a checkpoint cut between its page batches were taken
/// when every chunk below its number was synced. A log that ends below that number (the
/// first chunk after the older checkpoint lost its summary) is refused: the pages name
/// blocks of chunks the roll-forward never reached, which the open counted in nothing
/// and the next writes overwrote (found by review, 2026-11-29).
#[test]
fn a_log_ending_below_a_cut_checkpoint_is_refused() {
    let cfg = Config {
        checkpoint_page_batch: 1,
        checkpoint_blocks: 1 << 40,
        ..Config::default()
    };
    let (dev, idx, f) = gated_sized(cfg.clone(), 8 << 20);
    let cap = f.capacity_blocks();
    let lbas: Vec<u64> = (0..cap).step_by(97).collect();
    for &l in &lbas {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    f.checkpoint().unwrap();
    // Every other block written again: no segment dies, so no free record (whose own
    // refusal of a short log would come first) is committed.
    for &l in lbas.iter().step_by(2) {
        f.write(l, &block_for(l, 2), false, S0).unwrap();
    }
    f.flush().unwrap();
    assert_eq!(f.dead_segments() + f.freeable_segments(), 0);
    // The first chunk after the checkpoint: the one holding lbas[0]'s second write.
    let geo = *f.geometry();
    let pba = f.map_entry(lbas[0]).unwrap().pba().unwrap() as u64;
    let seg = geo.segment_of(pba);
    let off = ftl::chunks::SegmentChunks::new(&dev, geo, seg, f.format_id(), (u64::MAX, u64::MAX))
        .map(|c| c.unwrap())
        .find(|(_, s)| {
            s.entries
                .iter()
                .any(|e| matches!(e, ftl::summary::Entry::Data { lba, .. } if *lba == lbas[0]))
        })
        .map(|(off, _)| off)
        .unwrap();
    idx.fail_after(1);
    f.checkpoint().unwrap_err();
    drop(f);
    idx.fail_after(u64::MAX >> 2);
    dev.inner().crash(7).unwrap();
    let at = (geo.segment_start(seg) + off as u64) * 4096;
    dev.write_at(at, &[0u8; 4096]).unwrap();
    let before = dev.inner().current_image().unwrap();
    match Ftl::open(dev.clone(), idx.clone(), cfg) {
        Ok(_) => panic!("a log ending below the cut checkpoint opened"),
        Err(e) => assert!(e.to_string().contains("below chunk"), "{e}"),
    }
    assert!(
        dev.inner().current_image().unwrap() == before,
        "the refused open wrote"
    );
}

/// Checkpoint rule 8: a free record committed while a checkpoint syncs and commits its
/// map pages follows the last checkpoint, and the checkpoint's header batch puts it again
/// with its own base. The segment (closed at both snapshots, dead in between) is freed
/// and reused while the checkpoint is held at its pages: a power cut then recovers from
/// the older checkpoint, one after the checkpoint from the newer, and in both every block
/// reads what it was given (without the second put the newer table alone calls the
/// segment closed, and what writers put there since is lost).
#[test]
fn a_free_record_during_a_checkpoint_follows_both_checkpoints() {
    use ftl::index::Key;
    // No reserve: writers reach the freed segment at the back of the free list.
    let cfg = Config {
        gc_reserve_segments: 0,
        ..Config::default()
    };
    let (dev, idx, f) = gated(cfg.clone());
    let (seg, lbas) = closed_at_checkpoint(&f);
    let before = checkpoint_base(&idx);
    let mut tags: HashMap<u64, u64> = lbas.iter().map(|&l| (l, 1)).collect();
    // A dirty map page, so the checkpoint below has pages to commit.
    write_tagged(&f, [300], 5, StreamId(3), false, &mut tags);
    idx.hold_commits_with(Key::MAP_PAGE);
    let during = std::thread::scope(|sc| {
        let ck = sc.spawn(|| f.checkpoint());
        let release = held_at_map_pages(&idx);
        // Live at the snapshot, dead now.
        write_tagged(&f, lbas.iter().copied(), 2, StreamId(2), false, &mut tags);
        assert_eq!(f.segment_valid(seg), 0);
        let r = f.free_dead().unwrap();
        assert_eq!(
            r.segments_freed, 1,
            "freed while the checkpoint is in flight: {r:?}"
        );
        let rec = free_record_of(&idx, seg).expect("its record");
        assert_eq!(rec.base, before, "it follows the older checkpoint");
        // A power cut then: the older checkpoint and the record.
        let cut = reuse_then_cut(&f, &dev, &idx, seg, &mut tags, 21);
        drop(release);
        ck.join().unwrap().unwrap();
        (cut, tags.clone())
    });
    let after = checkpoint_base(&idx);
    assert!(after > before);
    let rec = free_record_of(&idx, seg).expect("the checkpoint keeps the record");
    assert_eq!(
        rec.base, after,
        "put again with the newer checkpoint's base"
    );
    write_tagged(&f, 320..330, 6, StreamId(3), true, &mut tags);
    // A power cut after the checkpoint.
    cut_and_check(f, &dev, &idx, 22, cfg.clone(), &tags);
    // And the one taken while it was in flight.
    let (cut, old_tags) = during;
    check_cut_in_flight(cut, before, cfg, &old_tags);
}

/// Checkpoint rule 8, its other half, with rule 9: a segment dead at the checkpoint's
/// snapshot is the checkpoint's to free (by its own record, once its log is synced); a
/// free record while the checkpoint syncs leaves it (freed twice, it would be on the free
/// list twice and handed to two streams), and the checkpoint's record is not committed
/// before the sync (recovery from it would stop short of the record's chain). A power cut
/// while the sync is held recovers from the older checkpoint.
#[test]
fn a_free_record_during_a_checkpoint_leaves_its_dead_segments_to_it() {
    let cfg = Config::default();
    let (dev, idx, f) = gated(cfg.clone());
    let (seg, lbas) = closed_at_checkpoint(&f);
    let before = checkpoint_base(&idx);
    let mut tags: HashMap<u64, u64> = (0..64).map(|l| (l, 1)).collect();
    write_tagged(&f, lbas.iter().copied(), 2, StreamId(2), false, &mut tags);
    f.flush().unwrap();
    assert_eq!(f.freeable_segments(), 1);
    // A write the checkpoint syncs (not flushed: the cut may lose it).
    write_tagged(&f, [300], 5, StreamId(3), false, &mut HashMap::new());
    dev.hold(GateOp::Sync);
    let cut = std::thread::scope(|sc| {
        let ck = sc.spawn(|| f.checkpoint());
        let release = GateOnDrop(&dev, GateOp::Sync);
        assert!(
            dev.wait_held(GateOp::Sync, Duration::from_secs(10)),
            "the checkpoint never synced"
        );
        assert_eq!(f.freeable_segments(), 0, "the checkpoint frees it");
        assert!(
            free_record_of(&idx, seg).is_none(),
            "the checkpoint's own record before its log sync"
        );
        let cut = idx
            .snapshot_while(|| dev.inner().power_cut_image(25))
            .unwrap();
        drop(release);
        ck.join().unwrap().unwrap();
        cut
    });
    assert_eq!(f.segment_snapshot()[seg as usize].state, "free");
    assert!(free_record_of(&idx, seg).is_none());
    let free = f
        .segment_snapshot()
        .iter()
        .filter(|s| s.state == "free")
        .count();
    assert_eq!(free, f.free_segments(), "each free segment listed once");
    check_cut_in_flight(cut, before, cfg, &tags);
}

/// Checkpoint rule 9: a segment dead at the checkpoint's snapshot is freed by the
/// checkpoint's own free record right after its log sync, before its map pages: with the
/// checkpoint held at its page commit the segment is free already, and writers reuse it.
/// A power cut then recovers from the older checkpoint and that record; one after the
/// checkpoint from its table (whose batch removed the record), with the segment not
/// released a second time at the checkpoint's end (it holds the new data).
#[test]
fn a_checkpoint_frees_its_dead_segments_before_its_map_pages() {
    frees_its_dead_segments_before_its_map_pages(false);
}

/// Checkpoint rule 9 for a segment opened after the last checkpoint (young to it): the
/// checkpoint's own record lists its chunks (free rule 7), taken before the young lists
/// restart at its snapshot, and recovery from the older checkpoint steps over them.
#[test]
fn a_checkpoint_frees_its_dead_young_segments_before_its_map_pages() {
    frees_its_dead_segments_before_its_map_pages(true);
}

fn frees_its_dead_segments_before_its_map_pages(young: bool) {
    use ftl::index::Key;
    // No reserve: writers reach the freed segment at the back of the free list.
    let cfg = Config {
        gc_reserve_segments: 0,
        ..Config::default()
    };
    let (dev, idx, f) = gated(cfg.clone());
    let (mut seg, mut lbas) = closed_at_checkpoint(&f);
    let before = checkpoint_base(&idx);
    let mut tags: HashMap<u64, u64> = (0..64).map(|l| (l, 1)).collect();
    if young {
        write_tagged(&f, 100..140, 1, S0, false, &mut tags);
        (seg, lbas) = in_segment_of(&f, 116, 100..140);
    }
    write_tagged(&f, lbas.iter().copied(), 2, StreamId(2), false, &mut tags);
    assert_eq!(f.segment_valid(seg), 0);
    let early = f.stats().segments_freed_early_by_checkpoints;
    idx.hold_commits_with(Key::MAP_PAGE);
    let during = std::thread::scope(|sc| {
        let ck = sc.spawn(|| f.checkpoint());
        let release = held_at_map_pages(&idx);
        assert_eq!(
            f.segment_snapshot()[seg as usize].state,
            "free",
            "freed before the map pages"
        );
        let rec = free_record_of(&idx, seg).expect("the checkpoint's own record");
        assert_eq!(rec.base, before, "it follows the older checkpoint");
        assert_eq!(!rec.chunks.is_empty(), young, "{rec:?}");
        let cut = reuse_then_cut(&f, &dev, &idx, seg, &mut tags, 23);
        drop(release);
        ck.join().unwrap().unwrap();
        (cut, tags.clone())
    });
    assert!(checkpoint_base(&idx) > before);
    assert!(
        free_record_of(&idx, seg).is_none(),
        "the header's batch removes it"
    );
    assert_eq!(f.stats().segments_freed_early_by_checkpoints, early + 1);
    assert_ne!(
        f.segment_snapshot()[seg as usize].state,
        "free",
        "released again at the checkpoint's end while writers use it"
    );
    write_tagged(&f, 320..330, 6, StreamId(3), true, &mut tags);
    cut_and_check(f, &dev, &idx, 24, cfg.clone(), &tags);
    let (cut, old_tags) = during;
    check_cut_in_flight(cut, before, cfg, &old_tags);
}

/// Writers take `seg` again (stream 3, flushed); then a power cut (a seeded subset of
/// unsynced writes kept): the index and device image at one instant.
fn reuse_then_cut(
    f: &GateFtl,
    dev: &GateDevice<Arc<CrashDevice>>,
    idx: &MemIndex,
    seg: u32,
    tags: &mut HashMap<u64, u64>,
    seed: u64,
) -> (MemIndex, std::io::Result<Vec<u8>>) {
    reuse_on_stream_3(f, seg, tags);
    f.flush().unwrap();
    idx.snapshot_while(|| dev.inner().power_cut_image(seed))
        .unwrap()
}

/// Recovers `cut`, a power cut (index and device image) taken while a checkpoint was in
/// flight: the checker is clean, the index holds the older checkpoint (at `base`), and
/// every block of `tags` reads back.
fn check_cut_in_flight(
    cut: (MemIndex, std::io::Result<Vec<u8>>),
    base: u64,
    cfg: Config,
    tags: &HashMap<u64, u64>,
) {
    let (idx, image) = cut;
    let idx = Arc::new(idx);
    let dev = Arc::new(CrashDevice::from_image(image.unwrap()));
    checker(dev.clone(), idx.clone()).expect("the recovered map is consistent");
    assert_eq!(checkpoint_base(&idx), base);
    let (f, _) = Ftl::open(dev, idx, cfg).unwrap();
    for (&l, &t) in tags {
        let mut b = vec![0u8; 4096];
        f.read(l, &mut b).unwrap();
        assert_eq!(
            observe(l, &b),
            Observed::Tag(t),
            "lba {l}, cut during the checkpoint"
        );
    }
}

/// Lets the device's held operation through when dropped (as [`ReleaseOnDrop`]).
struct GateOnDrop<'a>(&'a GateDevice<Arc<CrashDevice>>, GateOp);

impl Drop for GateOnDrop<'_> {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}

/// Waits until a checkpoint's map-page commit is held (`MemIndex::hold_commits_with`),
/// and returns the guard that lets it through.
fn held_at_map_pages(idx: &MemIndex) -> ReleaseOnDrop<'_> {
    let release = ReleaseOnDrop(idx);
    assert!(
        idx.wait_commit_held(Duration::from_secs(10)),
        "the checkpoint never reached its map pages"
    );
    release
}

/// Lets the index's held commits through when dropped, also when a test panics while a
/// thread is held (its scope would wait for it forever).
struct ReleaseOnDrop<'a>(&'a MemIndex);

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.release_commits();
    }
}

/// The free record the index holds for `seg`, if any.
fn free_record_of(idx: &MemIndex, seg: u32) -> Option<ftl::records::FreeRecord> {
    use ftl::index::{IndexStore, Key};
    idx.load()
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.first() == Some(&Key::FREE))
        .map(|(_, v)| ftl::records::FreeRecord::decode(&v).unwrap())
        .find(|r| r.segment == seg)
}

/// Chunk writers' admission (`ftl/src/writers.rs`): while as many chunk batches are
/// handed over and not written as the pool has threads, a writer waits before it appends
/// (every writer shares the wait, not only the one whose block sealed the next chunk),
/// and nothing it wrote is lost once the device takes the writes again.
#[test]
fn writers_wait_while_the_chunk_writers_are_behind() {
    let (dev, _idx, f) = gated(Config::default());
    let f = Arc::new(f);
    let pool = Arc::new(ftl::ChunkWriters::spawn(&f, 1, "admission-test").expect("pool"));
    dev.hold(GateOp::Write);
    let done = Arc::new(AtomicU64::new(0));
    let writer = {
        let (f, pool, done) = (f.clone(), pool.clone(), done.clone());
        std::thread::spawn(move || {
            for l in 0..40u64 {
                f.write_via(l, &block_for(l, l + 1), false, S0, &pool)
                    .expect("write");
                done.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // The first sealed chunk reaches the device and is held there: one batch behind.
    assert!(
        dev.wait_held(GateOp::Write, Duration::from_secs(20)),
        "no chunk write reached the device"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        done.load(Ordering::SeqCst) < 40,
        "the writer went on while the chunk writers were behind"
    );
    dev.release(GateOp::Write);
    writer.join().expect("writer");
    assert!(
        pool.admit_wait_ns() >= 50_000_000,
        "writers waited {} ns for the chunk writers",
        pool.admit_wait_ns()
    );
    f.flush().expect("flush");
    let mut buf = vec![0u8; ftl::device::BLOCK_SIZE];
    for l in 0..40u64 {
        f.read(l, &mut buf).expect("read");
        assert_eq!(buf, block_for(l, l + 1), "block {l}");
    }
}

/// Engine rule 7: a writer holding chunks it deferred to the chunk writers
/// ([`Ftl::write_via`]) writes them itself BEFORE it waits for a staging slot, since each
/// of them holds one. Without the rule, one write sealing more chunks than the staging
/// area has slots waits for the slots it holds, for ever.
#[test]
fn a_write_sealing_more_chunks_than_there_are_staging_slots_does_not_wait_for_itself() {
    let dev = Arc::new(CrashDevice::new(ftl::model::tiny::DEVICE_BYTES));
    let idx = Arc::new(MemIndex::new());
    ftl::format(&dev, &idx, &tiny(), false).unwrap();
    let area = ftl::staging::StagingArea::in_memory(2).unwrap();
    let (f, _) = Ftl::open_staged(dev, idx, Config::default(), area).unwrap();
    let f = Arc::new(f);
    let pool = Arc::new(ftl::ChunkWriters::spawn(&f, 1, "rule-7-test").expect("pool"));
    // 32 blocks: 8 chunks of the tiny geometry's 16 KiB pages, in one write.
    const BLOCKS: u64 = 32;
    let data: Vec<u8> = (0..BLOCKS).flat_map(|l| block_for(l, l + 7)).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (f, pool) = (f.clone(), pool.clone());
        std::thread::spawn(move || {
            let r = f.write_via(0, &data, false, S0, &pool);
            let _ = tx.send(r.map_err(|e| e.to_string()));
        });
    }
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(r) => r.expect("the write"),
        Err(_) => panic!("a write of {BLOCKS} blocks through 2 staging slots did not complete"),
    }
    f.flush().expect("flush");
    let mut buf = vec![0u8; ftl::device::BLOCK_SIZE];
    for l in 0..BLOCKS {
        f.read(l, &mut buf).expect("read");
        assert_eq!(buf, block_for(l, l + 7), "block {l}");
    }
}

/// Tombstone rule 1 with a TRIM segment whose summary does not read (a bad sector): it is
/// left uncarried, so never freed, and the checkpoint goes on (it failed, and with it
/// every checkpoint, free record and write past the map's bound). The failure is
/// counted; once the segment reads again it is carried and freed.
#[test]
fn a_trim_segment_that_cannot_be_read_does_not_stop_checkpoints() {
    let (dev, _idx, f) = gated(Config::default());
    for l in 0..40 {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    f.flush().unwrap();
    f.checkpoint().unwrap();
    f.trim(0, 40).unwrap();
    f.close_stream(ftl::TRIM_STREAM).unwrap();
    let t = f
        .segment_snapshot()
        .into_iter()
        .find(|s| s.stream == ftl::TRIM_STREAM.0 && s.state == "closed" && s.segment != 0)
        .expect("the TRIM segment is closed")
        .segment;
    let start = f.geometry().segment_start(t) * ftl::device::BLOCK_SIZE as u64;
    dev.set_bad_reads(Some((start, ftl::device::BLOCK_SIZE as u64)));
    f.checkpoint()
        .expect("a checkpoint beside a TRIM segment that does not read");
    // Tried again by the next checkpoint (and a free record, which leaves it for a
    // while), and counted once.
    f.free_dead().unwrap();
    f.checkpoint().unwrap();
    let s = f.stats();
    assert_eq!(s.tombstone_carry_failures, 1, "{s:?}");
    let why = s.tombstone_carry_error.unwrap_or_default();
    assert!(why.contains(&format!("segment {t}")), "{why}");
    assert_ne!(f.segment_snapshot()[t as usize].state, "free");
    f.write(100, &block_for(100, 2), false, S0).unwrap();
    f.flush().unwrap();
    dev.set_bad_reads(None);
    f.checkpoint().unwrap();
    f.checkpoint().unwrap();
    assert_eq!(
        f.segment_snapshot()[t as usize].state,
        "free",
        "carried and freed once it reads"
    );
}

/// Recovery rule 3's mark: a device write or sync of the recovery itself that fails
/// marks the staging area, so the next open in this boot takes the device for one that
/// may have lost writes (only the session's own chunk writes and syncs marked it).
#[test]
fn a_failed_recovery_sync_marks_the_staging_area() {
    let (dev, idx, f) = gated(Config::default());
    for l in 0..10 {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    let staging = f.staging().clone();
    assert!(!staging.device_error());
    // The process dies with its writes staged; recovery replays them and syncs.
    drop(f);
    dev.fail_next_sync();
    let opened = Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging.clone());
    assert!(opened.is_err(), "the recovery sync failed");
    assert!(
        staging.device_error(),
        "the failed recovery sync marked the area"
    );
}

/// The same for a freed segment's first block whose zeroing fails in the session: the
/// FTL turns read-only and the staging area is marked.
#[test]
fn a_failed_zeroing_of_a_freed_segment_marks_the_staging_area() {
    let (dev, _idx, f) = gated(Config::default());
    kill_the_first_segment(&f);
    let bps = f.geometry().blocks_per_segment() as u64;
    let dead = f
        .segment_snapshot()
        .into_iter()
        .find(|s| s.state == "closed" && s.valid == 0 && s.segment != 0)
        .expect("a dead segment")
        .segment;
    let head = dead as u64 * bps * ftl::device::BLOCK_SIZE as u64;
    dev.set_bad_writes(Some((head, ftl::device::BLOCK_SIZE as u64)));
    let _ = f.checkpoint();
    assert!(
        f.flush().is_err(),
        "the FTL is read-only after the failed zeroing"
    );
    assert!(
        f.staging().device_error(),
        "the failed zeroing marked the area"
    );
}

/// Recovery rule 1 in its order: the open checkpoint is committed only AFTER the
/// rolled-forward chunks are synced. A power cut right after that commit (here: the
/// commit applied, then reported failed, and the device cut losing every unsynced write)
/// leaves an index whose blocks are on the device: every LBA reads what a power cut
/// allows, none fails its checksum. The sync moved after the open checkpoint (mutant
/// `recovery-1-order`) reads EIO; no test cut inside an open before (found by review,
/// 2026-11-29: removing the sync was caught, reordering it was not).
#[test]
fn the_open_checkpoint_is_committed_after_the_rolled_forward_chunks_are_synced() {
    let (dev, idx, f) = gated(Config::default());
    let mut m = ftl::model::Model::new();
    for l in 0..10 {
        let d = m.write(l, 1);
        f.write(l, &d, false, S0).unwrap();
    }
    let staging = f.staging().clone();
    // The process dies with its writes staged; the next open replays them.
    drop(f);
    idx.fail_after_apply.store(true, Ordering::SeqCst);
    let opened = Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging);
    assert!(
        opened.is_err(),
        "the open checkpoint's commit was applied, then failed"
    );
    idx.fail_after_apply.store(false, Ordering::SeqCst);
    // The power goes: every unsynced write is lost, and the staging area (tmpfs) too.
    dev.inner().crash_losing_all().unwrap();
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
    let mut b = vec![0u8; ftl::device::BLOCK_SIZE];
    for l in 0..10 {
        f.read(l, &mut b)
            .unwrap_or_else(|e| panic!("lba {l} after the cut: {e}"));
        m.settle_after_crash(l, observe(l, &b)).unwrap();
    }
}
