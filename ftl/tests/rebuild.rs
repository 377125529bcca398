//! The index rebuild from the log (`rebuild.rs`) and the rules that keep the log a full
//! description of the device: tombstones carried before their segment is freed
//! (`engine/tombstones.rs`), freed segments zeroed (checkpoint rule 5), chunks past a
//! crash's break zeroed by recovery (recovery rule 2), the rebuild's checkpoint last
//! (rebuild rule 1). Every crash-model run also ends with a rebuild that must agree
//! (`model::rebuild_agrees`).

mod common;

use common::*;
use ftl::chunks::SegmentChunks;
use ftl::device::crash::CrashDevice;
use ftl::device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
use ftl::index::mem::MemIndex;
use ftl::model::{block_for, observe, rebuild_agrees, tiny, Observed};
use ftl::{Config, Error, Ftl, IndexStore, StreamId, GC_STREAM, TRIM_STREAM};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn read_all(f: &CrashFtl) -> Vec<Vec<u8>> {
    (0..f.capacity_blocks())
        .map(|l| {
            let mut b = vec![0u8; BLOCK_SIZE];
            f.read(l, &mut b).unwrap();
            b
        })
        .collect()
}

/// Rebuilds a new index of `dev` (the whole map at once), and checks that a rebuild in
/// slices gives the same index, record for record: slices of 7 blocks (spilled in RAM)
/// and of 1 block (spilled to files).
fn rebuild_into(dev: &Arc<CrashDevice>) -> (Arc<MemIndex>, ftl::RebuildReport) {
    let idx = Arc::new(MemIndex::new());
    let mut calls = 0u32;
    let r = ftl::rebuild(dev, &idx, 16, &mut |_, _| calls += 1).unwrap();
    assert!(calls >= r.segments - 1, "progress reported per segment");
    assert_eq!((r.slices, r.spilled_bytes), (1, 0));
    let whole = idx.load().unwrap();
    let spill = tempfile::tempdir().unwrap();
    // Someone else's file in the spill directory given.
    std::fs::create_dir(spill.path().join("spill")).unwrap();
    std::fs::write(spill.path().join("spill").join("mine"), b"x").unwrap();
    for (blocks, dir) in [(7u64, None), (1, Some(spill.path().join("spill")))] {
        let sliced = Arc::new(MemIndex::new());
        let opts = ftl::RebuildOptions {
            batch: 16,
            memory: blocks * ftl::rebuild::WINNER_BYTES,
            spill_dir: dir.clone(),
            ..Default::default()
        };
        let s = ftl::rebuild_with(dev, &sliced, &opts, &mut |_, _| {}).unwrap();
        let cap = ftl::read_superblock_readonly(&**dev)
            .unwrap()
            .0
            .geometry
            .exported_blocks;
        assert_eq!(s.slices as u64, cap.div_ceil(blocks), "{s:?}");
        assert!(s.spilled_bytes > 0 || r.data_entries + r.trim_entries == 0);
        let same = ftl::RebuildReport {
            slices: 1,
            spilled_bytes: 0,
            ..s.clone()
        };
        assert_eq!(same, r, "the sliced rebuild reports otherwise");
        assert!(
            sliced.load().unwrap() == whole,
            "slices of {blocks} blocks build another index"
        );
        if let Some(d) = dir {
            let left: Vec<_> = std::fs::read_dir(&d)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(
                left,
                vec![std::ffi::OsString::from("mine")],
                "the spill's files are removed, nothing else"
            );
        }
    }
    (idx, r)
}

/// Cleans the closed segment with the fewest live blocks (all of them moved).
fn clean_one(f: &CrashFtl) -> bool {
    let victim = f
        .segment_snapshot()
        .into_iter()
        .filter(|s| s.state == "closed" && s.segment != 0 && s.valid > 0)
        .min_by_key(|s| s.valid);
    let Some(v) = victim else { return false };
    let mut b = vec![0u8; BLOCK_SIZE];
    for lb in f.live_blocks(v.segment).unwrap() {
        f.read(lb.lba, &mut b).unwrap();
        f.relocate(lb.lba, lb.entry, &b, GC_STREAM).unwrap();
    }
    true
}

/// Issue 17, item 4: a device written with overwrites, TRIMs, FLUSHes and cleaning, its
/// index deleted and rebuilt from the log, reads what it read before, and checks clean.
#[test]
fn a_rebuilt_index_reads_what_the_device_read() {
    for seed in 0..6u64 {
        let (dev, _idx, f) = tiny_crash();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let cap = f.capacity_blocks();
        let mut tag = 1u64;
        let (mut trims, mut cleans) = (0, 0);
        for step in 0..3000u64 {
            match rng.gen_range(0..100) {
                0..=74 => {
                    let lba = rng.gen_range(0..cap);
                    let s = StreamId(rng.gen_range(1..4));
                    match f.write(lba, &block_for(lba, tag), false, s) {
                        Ok(()) => tag += 1,
                        Err(Error::NoSpace) => {
                            assert!(clean_one(&f), "step {step}: full and nothing to clean");
                            f.checkpoint().unwrap();
                        }
                        Err(e) => panic!("write: {e}"),
                    }
                }
                75..=84 => {
                    let lba = rng.gen_range(0..cap);
                    let n = rng.gen_range(1..=24).min(cap - lba);
                    match f.trim(lba, n) {
                        Ok(()) => trims += 1,
                        Err(Error::NoSpace) => {
                            assert!(clean_one(&f), "step {step}: full and nothing to clean");
                            f.checkpoint().unwrap();
                        }
                        Err(e) => panic!("trim: {e}"),
                    }
                }
                85..=89 => f.flush().unwrap(),
                90..=94 => {
                    cleans += clean_one(&f) as u32;
                }
                95..=97 => {
                    f.checkpoint().unwrap();
                }
                _ => f.close_stream(TRIM_STREAM).unwrap(),
            }
        }
        assert!(trims > 100 && cleans > 50, "the run trims and cleans");
        let before = read_all(&f);
        f.close().unwrap();
        drop(f);
        // The index is lost: rebuild a new one from the backing alone.
        let (idx, report) = rebuild_into(&dev);
        assert!(
            report.trim_entries > 0 && report.data_entries > 0,
            "{report:?}"
        );
        checker(&dev, &idx).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let (g, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
        let after = read_all(&g);
        for (l, (a, b)) in before.iter().zip(&after).enumerate() {
            assert!(
                a == b,
                "seed {seed}: lba {l} read {:?}, after the rebuild {:?} ({report:?})",
                observe(l as u64, a),
                observe(l as u64, b)
            );
        }
        // The rebuilt device goes on: writes, a checkpoint, a reopen.
        // (Every segment with a chunk is closed after a rebuild: clean one if full.)
        let mut tries = 0;
        while let Err(e) = g.write(0, &block_for(0, tag), true, StreamId(1)) {
            assert!(
                matches!(e, Error::NoSpace) && tries < 8,
                "write after rebuild: {e}"
            );
            assert!(clean_one(&g));
            g.checkpoint().unwrap();
            tries += 1;
        }
        g.close().unwrap();
        drop(g);
        let (h, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
        let mut b = vec![0u8; BLOCK_SIZE];
        h.read(0, &mut b).unwrap();
        assert_eq!(observe(0, &b), Observed::Tag(tag));
    }
}

/// Tombstone rules 1 and 2: a TRIM segment is freed only after the records that may still
/// hide an older block are carried into a newer chunk; a rebuild after it was freed gives
/// the trimmed range back as zeroes (and WRITE_ZEROES read zeroes).
#[test]
fn a_trimmed_range_stays_trimmed_after_its_trim_segment_is_freed() {
    let (dev, _idx, f) = tiny_crash();
    for l in 0..40 {
        f.write(l, &block_for(l, l + 1), false, StreamId(1))
            .unwrap();
    }
    f.flush().unwrap();
    f.trim(0, 40).unwrap();
    // Its records alone in a segment of the TRIM stream, closed and then dead.
    f.close_stream(TRIM_STREAM).unwrap();
    let trim_segs = closed_trim_segments(&f);
    assert!(!trim_segs.is_empty(), "the TRIM segment is closed");
    f.checkpoint().unwrap();
    f.checkpoint().unwrap();
    let snap = f.segment_snapshot();
    let freed: Vec<u32> = trim_segs
        .iter()
        .copied()
        .filter(|&s| snap[s as usize].state == "free")
        .collect();
    assert!(
        !freed.is_empty(),
        "the TRIM segment is freed ({trim_segs:?})"
    );
    trimmed_after_rebuild(&dev, &f, &snap);
}

/// Tombstone rule 1 across a restart: a segment recovery takes over (free at the
/// checkpoint, the TRIM stream's chain continued into it) holds TRIM records the new
/// session never saw sealed, so it is carried before it is freed, like any TRIM segment
/// of an earlier session. Found by review: the recovery path marked it as seen in this
/// session with no TRIM records, and it was freed uncarried.
#[test]
fn trim_records_in_a_segment_recovery_took_over_are_carried_before_it_is_freed() {
    let (dev, idx, f) = tiny_crash();
    for l in 0..40 {
        f.write(l, &block_for(l, l + 1), false, StreamId(1))
            .unwrap();
    }
    f.flush().unwrap();
    f.checkpoint().unwrap();
    // The TRIM stream opens a segment free at the checkpoint; its records are durable.
    f.trim(0, 40).unwrap();
    f.flush().unwrap();
    let trim_segs = |f: &CrashFtl| -> Vec<u32> {
        f.segment_snapshot()
            .into_iter()
            .filter(|s| s.stream == TRIM_STREAM.0 && s.state != "free" && s.segment != 0)
            .map(|s| s.segment)
            .collect()
    };
    let before = trim_segs(&f);
    assert!(!before.is_empty());
    // A process death (no close), and a reopen that replays the TRIM stream's chunks.
    drop(f);
    let (g, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
    g.close_stream(TRIM_STREAM).unwrap();
    g.checkpoint().unwrap();
    g.checkpoint().unwrap();
    let snap = g.segment_snapshot();
    assert!(
        before.iter().any(|&s| snap[s as usize].state == "free"),
        "the TRIM segment is freed ({before:?})"
    );
    trimmed_after_rebuild(&dev, &g, &snap);
}

/// The data segment of stream 1 still holds the trimmed blocks (in `snap`), yet the index
/// rebuilt from the log agrees with `f`, and a trimmed block reads zeros.
fn trimmed_after_rebuild(dev: &Arc<CrashDevice>, f: &CrashFtl, snap: &[ftl::SegmentSnapshot]) {
    assert!(
        snap.iter().any(|s| s.stream == 1 && s.state != "free"),
        "the data segment is not freed"
    );
    rebuild_agrees(dev, f).unwrap();
    let mut b = vec![0u8; BLOCK_SIZE];
    f.read(5, &mut b).unwrap();
    assert_eq!(observe(5, &b), Observed::Tag(0));
}

/// Checkpoint rule 5: a freed segment's first block is zero on the device, discard or
/// not, so the walker finds nothing of its old use.
#[test]
fn a_freed_segment_shows_nothing_to_the_walker() {
    let (dev, idx) = tiny::formatted().unwrap();
    let cfg = Config {
        discard_freed: false,
        ..Config::default()
    };
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), cfg).unwrap();
    overwrite_rounds(&f, 3, |_| {});
    let used: Vec<u32> = f
        .segment_snapshot()
        .into_iter()
        .filter(|s| s.state == "closed" && s.segment != 0 && s.valid == 0)
        .map(|s| s.segment)
        .collect();
    assert!(!used.is_empty(), "overwrites killed whole segments");
    f.checkpoint().unwrap();
    f.checkpoint().unwrap();
    let geo = *f.geometry();
    let snap = f.segment_snapshot();
    let mut b = AlignedBuf::new(BLOCK_SIZE);
    let mut seen = 0;
    for s in used {
        if snap[s as usize].state != "free" {
            continue;
        }
        seen += 1;
        dev.read_at(geo.segment_start(s) * BLOCK_SIZE as u64, &mut b)
            .unwrap();
        assert!(
            b.iter().all(|&x| x == 0),
            "segment {s}'s first block is zero"
        );
        let walk = SegmentChunks::new(&dev, geo, s, f.format_id(), (u64::MAX, u64::MAX));
        assert_eq!(walk.count(), 0, "segment {s} shows no chunk");
    }
    assert!(seen > 0, "some dead segment was freed");
    // Their old chunks after the zeroed head are no damage: the rebuild warns of nothing.
    f.close().unwrap();
    drop(f);
    let (_, r) = rebuild_into(&dev);
    assert_eq!(r.chunks_hidden, 0, "{r:?}");
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

/// Recovery rule 2: a chunk past the break (here: stream 2's chunk, sealed after stream
/// 1's chunk whose summary the crash lost) is zeroed by the reopen, so no later walk of
/// the log takes it for part of it.
#[test]
fn chunks_past_a_crash_break_are_zeroed_by_recovery() {
    let (dev, idx, f) = tiny_crash();
    let geo = *f.geometry();
    let fid = f.format_id();
    for l in 0..6 {
        f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
    }
    f.flush().unwrap();
    for l in 10..16 {
        f.write(l, &block_for(l, 1), false, StreamId(2)).unwrap();
    }
    f.flush().unwrap();
    // Every chunk, by stream.
    let mut chunks = Vec::new();
    for seg in 1..geo.segment_count {
        for c in SegmentChunks::new(&dev, geo, seg, fid, (u64::MAX, u64::MAX)) {
            let (off, s) = c.unwrap();
            chunks.push((s.chunk_seq, s.stream, seg, off, s.epoch));
        }
    }
    let last_of = |stream: u8| {
        *chunks
            .iter()
            .filter(|c| c.1 == stream)
            .max_by_key(|c| c.0)
            .unwrap()
    };
    let (b_seq, _, b_seg, b_off, _) = last_of(1);
    let (d_seq, _, d_seg, d_off, epoch) = last_of(2);
    assert!(d_seq > b_seq);
    drop(f);
    // The crash lost stream 1's last summary: the chain breaks there.
    let at = |seg: u32, off: u32| (geo.segment_start(seg) + off as u64) * BLOCK_SIZE as u64;
    dev.write_at(at(b_seg, b_off), &AlignedBuf::new(BLOCK_SIZE))
        .unwrap();
    dev.sync().unwrap();
    let (g, report) = tiny::open_report(&dev, &idx).unwrap();
    assert!(report.recovery.stale_chunks_zeroed >= 1, "{report:?}");
    let mut b = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(at(d_seg, d_off), &mut b).unwrap();
    assert!(
        b.iter().all(|&x| x == 0),
        "the chunk past the break is zeroed"
    );
    // Nothing of epoch `epoch` at or past the break is left for a walker.
    for seg in 1..geo.segment_count {
        for c in SegmentChunks::new(&dev, geo, seg, fid, (u64::MAX, u64::MAX)) {
            let (_, s) = c.unwrap();
            assert!(
                !(s.epoch == epoch && s.chunk_seq >= b_seq),
                "chunk {} of epoch {epoch} survives past the break {b_seq}",
                s.chunk_seq
            );
        }
    }
    rebuild_agrees(&dev, &g).unwrap();
}

/// Recovery rule 2, a torn summary: the cut tore stream 1's chunk (lba 4..5) while the
/// chunk after it in the same segment (lba 6..7) was written whole. The roll-forward
/// stops at the torn one; the reopen zeroes it, so that an index rebuild, which walks on
/// past a damaged summary, does not take the crashed session's tail past the break for
/// part of the log (no chunk of the new session marks the break for it here).
#[test]
fn a_summary_torn_at_a_stream_cursor_is_zeroed_by_recovery() {
    let (dev, idx, f) = tiny_crash();
    let (seg, off) = chunks_of_two_flushed(&f, &dev);
    drop(f);
    let at = flip_a_byte(&dev, seg, off);
    dev.sync().unwrap();
    let (g, report) = tiny::open_report(&dev, &idx).unwrap();
    assert!(report.recovery.stale_chunks_zeroed >= 1, "{report:?}");
    let mut blk = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(at, &mut blk).unwrap();
    assert!(blk.iter().all(|&x| x == 0), "the torn summary is zeroed");
    let mut b = vec![0u8; BLOCK_SIZE];
    for l in 4..8 {
        g.read(l, &mut b).unwrap();
        assert_eq!(observe(l, &b), Observed::Tag(0), "LBA {l} past the break");
    }
    rebuild_agrees(&dev, &g).unwrap();
}

/// Rebuild rule 1: the checkpoint record is committed last, so a rebuild cut short
/// leaves an index every open refuses, with a message pointing at the rebuild; a second
/// rebuild succeeds.
#[test]
fn a_rebuild_cut_short_leaves_no_checkpoint() {
    let (dev, _idx, f) = tiny_crash();
    for l in 0..200u64 {
        f.write(l % 100, &block_for(l % 100, l + 1), false, StreamId(1))
            .unwrap();
    }
    let before = read_all(&f);
    f.close().unwrap();
    drop(f);
    let idx = Arc::new(MemIndex::new());
    // clear + the page batches + the segment records, then the checkpoint: fail the last.
    let mut commits = 0;
    {
        let probe = Arc::new(MemIndex::new());
        let counting = CountingIndex(probe, std::sync::atomic::AtomicU64::new(0));
        ftl::rebuild(&dev, &counting, 1, &mut |_, _| {}).unwrap();
        commits += counting.1.load(std::sync::atomic::Ordering::SeqCst);
    }
    assert!(commits >= 3, "pages, records and checkpoint in batches");
    idx.fail_after(commits - 1);
    assert!(ftl::rebuild(&dev, &idx, 1, &mut |_, _| {}).is_err());
    idx.fail_after(u64::MAX);
    let err = match Ftl::open(dev.clone(), idx.clone(), Config::default()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("an index without a checkpoint opened"),
    };
    assert!(err.contains("--rebuild-index"), "{err}");
    ftl::rebuild(&dev, &idx, 1, &mut |_, _| {}).unwrap();
    let (g, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
    assert!(
        read_all(&g) == before,
        "the second rebuild gives the device back"
    );
}

/// An index that counts its commits.
struct CountingIndex(Arc<MemIndex>, std::sync::atomic::AtomicU64);

impl ftl::IndexStore for CountingIndex {
    fn load(&self) -> ftl::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.0.load()
    }
    fn load_kind(&self, kind: u8) -> ftl::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.0.load_kind(kind)
    }
    fn commit(&self, ops: Vec<ftl::index::Op>) -> ftl::Result<()> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0.commit(ops)
    }
    fn clear(&self) -> ftl::Result<()> {
        self.0.clear()
    }
    fn reader(&self) -> Arc<dyn ftl::index::IndexReader> {
        self.0.reader()
    }
}

/// An index older than the log (restored from a backup) is refused, not opened: opening
/// would roll the device back and then overwrite what came after. The rebuild gives the
/// device back.
#[test]
fn an_index_older_than_the_log_is_refused_and_the_rebuild_recovers() {
    let (dev, idx, f) = tiny_crash();
    let cap = f.capacity_blocks();
    for l in 0..cap / 4 {
        f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
    }
    f.checkpoint().unwrap();
    let (old, ()) = idx.snapshot_while(|| ()).unwrap();
    // Later sessions: new data into segments the old index records free.
    f.close().unwrap();
    drop(f);
    let g = tiny::open(&dev, &idx).unwrap();
    for l in 0..cap / 2 {
        g.write(l, &block_for(l, 2), false, StreamId(2)).unwrap();
    }
    let before = read_all(&g);
    g.close().unwrap();
    drop(g);
    let old = Arc::new(old);
    let err = match Ftl::open(dev.clone(), old.clone(), Config::default()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("an index older than the log opened"),
    };
    assert!(
        err.contains("older than the log") && err.contains("--rebuild-index"),
        "{err}"
    );
    let (idx2, _) = rebuild_into(&dev);
    let (h, _) = Ftl::open(dev.clone(), idx2, Config::default()).unwrap();
    assert!(
        read_all(&h) == before,
        "the rebuild gives the newest state back"
    );
}

/// Tombstone rule 4: a carry leaves out a block written since the TRIM (the write wins),
/// so that write must be durable before the carried segment is freed. Here the write is
/// still in an open chunk of another stream when a free record frees the TRIM segment,
/// the power is cut (the write, never acknowledged, is lost), and an index rebuild must
/// still find the TRIM that hides the block's older data. Found by review: the free
/// record synced only the chunks that killed the segment, the rebuild handed the
/// trimmed data back.
#[test]
fn a_trim_carried_past_a_write_not_yet_durable_still_hides_the_old_block() {
    let (dev, idx, f) = tiny_crash();
    let s1 = StreamId(1);
    // O, stream 1: LBAs 0..8 (trimmed below) and 50..54 (live: O stays allocated).
    for l in (0..8).chain(50..54) {
        f.write(l, &block_for(l, 6), false, s1).unwrap();
    }
    f.flush().unwrap();
    // T, the TRIM stream: the TRIM of 0..8, then data until T is full.
    f.trim(0, 8).unwrap();
    let open_of = |f: &CrashFtl, stream: u8| {
        f.segment_snapshot()
            .into_iter()
            .find(|s| s.state == "open" && s.stream == stream)
            .map(|s| s.segment)
    };
    let t = open_of(&f, TRIM_STREAM.0).expect("the TRIM stream's segment");
    let mut l = 100;
    while open_of(&f, TRIM_STREAM.0) == Some(t) {
        f.write(l, &block_for(l, 7), false, TRIM_STREAM).unwrap();
        l += 1;
    }
    f.flush().unwrap();
    // A process death: the reopen's checkpoint records T closed, not carried.
    drop(f);
    let g = tiny::open(&dev, &idx).unwrap();
    // T's data dies; T is then dead but for its TRIM records.
    for x in 100..l {
        g.write(x, &block_for(x, 8), false, s1).unwrap();
    }
    g.flush().unwrap();
    // W: LBA 5 written again, in an open chunk of another stream, not flushed.
    g.write(5, &block_for(5, 9), false, StreamId(2)).unwrap();
    g.free_dead().unwrap();
    // A later sync that seals nothing (another free record's) makes anything the record
    // did durable. Then the power is cut: W, never flushed, is lost. The index is lost
    // too.
    dev.sync().unwrap();
    let rebuilt_after_cut = || {
        let cut = Arc::new(CrashDevice::from_image(dev.power_cut_image(1).unwrap()));
        let (idx2, _) = rebuild_into(&cut);
        let (h, _) = Ftl::open(cut.clone(), idx2, Config::default()).unwrap();
        let mut b = vec![0u8; BLOCK_SIZE];
        (0..8)
            .map(|x| {
                h.read(x, &mut b).unwrap();
                observe(x, &b)
            })
            .collect::<Vec<_>>()
    };
    let seen = rebuilt_after_cut();
    for (x, o) in seen.iter().enumerate() {
        assert!(
            *o == Observed::Tag(0) || (x == 5 && *o == Observed::Tag(9)),
            "lba {x}, trimmed and flushed, reads {o:?} after the rebuild"
        );
    }
    // Rule 4: T waits for a checkpoint (W is in stream 2's open chunk)...
    assert_eq!(g.segment_snapshot()[t as usize].state, "closed", "T waits");
    assert_eq!(g.dead_segments(), 1, "T is dead");
    // ... which seals and syncs W, then frees T.
    g.checkpoint().unwrap();
    assert_eq!(
        g.segment_snapshot()[t as usize].state,
        "free",
        "T was freed"
    );
    dev.sync().unwrap();
    let mut want = vec![Observed::Tag(0); 8];
    want[5] = Observed::Tag(9);
    assert_eq!(
        rebuilt_after_cut(),
        want,
        "W is durable, the other TRIMs hold"
    );
}

/// A chunk summary with a valid checksum but an impossible epoch (u64::MAX), or one
/// entry with an impossible sequence number: the rebuild skips and counts it, as recovery
/// does. Taken, the epoch made `max_epoch + 1` wrap to 0 and the entry won its LBA over
/// every later write; the rebuilt counters were out of the range every open accepts.
#[test]
fn summaries_with_counters_out_of_range_are_skipped_by_the_rebuild() {
    for field in ["epoch", "epoch-1", "epoch-gap", "seq"] {
        let (dev, _idx, f) = tiny_crash();
        for l in 0..8u64 {
            f.write(l, &block_for(l, 1), false, S0).unwrap();
        }
        f.flush().unwrap();
        // The first chunk of the segment version 1 went to (offset 0) holds only
        // version-1 blocks: version 2 goes to another stream.
        let pba = f.map_entry(0).unwrap().pba().unwrap() as u64;
        let seg = f.geometry().segment_of(pba);
        assert_eq!(pba, f.geometry().segment_start(seg) + 1);
        for l in 0..8u64 {
            f.write(l, &block_for(l, 2), false, StreamId(2)).unwrap();
        }
        f.close().unwrap();
        let want = read_all(&f);
        drop(f);
        let at = tiny::SEGMENT_BYTES * seg as u64;
        let mut blk = AlignedBuf::new(BLOCK_SIZE);
        dev.read_at(at, &mut blk).unwrap();
        let mut s = ftl::summary::ChunkSummary::decode(&blk).unwrap().unwrap();
        match field {
            "epoch" => s.epoch = u64::MAX,
            // One below the bound: the rebuilt checkpoint's next epoch would reach it.
            "epoch-1" => s.epoch = u64::MAX / 4 - 1,
            // Below the bound by less than the gap the rebuilt session is numbered past
            // the newest (`rebuild::EPOCH_GAP`): out of range too (found by review).
            "epoch-gap" => s.epoch = u64::MAX / 4 - 2 - ftl::rebuild::EPOCH_GAP / 2,
            _ => {
                // One entry alone, so the summary still encodes (seqs within 2^32).
                s.entries.truncate(1);
                s.data_blocks = 1;
                if let ftl::summary::Entry::Data { seq, .. } = &mut s.entries[0] {
                    *seq = u64::MAX - 1;
                }
            }
        }
        s.encode_into(&mut blk).unwrap();
        dev.write_at(at, &blk).unwrap();
        let (idx, r) = rebuild_into(&dev);
        match field {
            "epoch" | "epoch-1" | "epoch-gap" => assert_eq!(r.chunks_out_of_range, 1, "{r:?}"),
            _ => assert!(r.entries_skipped >= 1, "{r:?}"),
        }
        assert!(
            r.epoch < u64::MAX / 4 && r.next_entry_seq < u64::MAX / 4,
            "{r:?}"
        );
        let (f, _) = Ftl::open(dev.clone(), idx, Config::default())
            .unwrap_or_else(|e| panic!("{field}: reopen of the rebuilt index: {e}"));
        let got = read_all(&f);
        let differ: Vec<u64> = (0..want.len() as u64)
            .filter(|&l| got[l as usize] != want[l as usize])
            .collect();
        assert!(
            differ.is_empty(),
            "{field}: the rebuilt index reads other data at {differ:?} ({:?})",
            differ.first().map(|&l| observe(l, &got[l as usize]))
        );
    }
}

/// A summary damaged in the middle of a segment: the rebuild walks on past it to the
/// chunks after it, so only the damaged chunk's own blocks are lost (nothing says which
/// LBAs they hold), and it names the segment and block. It used to end the walk there,
/// leaving every later chunk of the segment out (their LBAs read older data).
#[test]
fn a_rebuild_walks_on_past_a_damaged_summary() {
    let (dev, _idx, f) = tiny_crash();
    let (seg, off) = chunks_of_two_flushed(&f, &dev);
    f.close().unwrap();
    drop(f);
    flip_a_byte(&dev, seg, off);
    let (idx, r) = rebuild_into(&dev);
    assert_eq!((r.chunks_damaged, r.chunks_hidden), (1, 0), "{r:?}");
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains(&format!("segment {seg}: the summary at block {off} fails"))),
        "{:?}",
        r.warnings
    );
    let (f, _) = Ftl::open(dev.clone(), idx, Config::default()).unwrap();
    let mut b = vec![0u8; BLOCK_SIZE];
    for l in 0..8u64 {
        f.read(l, &mut b).unwrap();
        let want = if l == 4 || l == 5 {
            Observed::Tag(0)
        } else {
            Observed::Tag(1)
        };
        assert_eq!(observe(l, &b), want, "LBA {l}");
    }
}

/// The first chunk of a segment's use damaged: nothing says which later summaries in the
/// segment are of this use and which of an earlier one, so the walk stops there, and the
/// rebuild counts the chunks it may have hidden and names the segment.
#[test]
fn chunks_after_a_damaged_first_summary_are_reported_by_the_rebuild() {
    let (dev, _idx, f) = tiny_crash();
    chunks_of_two_flushed(&f, &dev);
    f.close().unwrap();
    let geo = *f.geometry();
    let seg = geo.segment_of(f.map_entry(0).unwrap().pba().unwrap() as u64);
    drop(f);
    flip_a_byte(&dev, seg, 0);
    let (_, r) = rebuild_into(&dev);
    assert_eq!(r.chunks_damaged, 0, "{r:?}");
    assert!(r.chunks_hidden >= 1, "{r:?}");
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains(&format!("segment {seg}:"))),
        "{:?}",
        r.warnings
    );
}

/// Writes LBAs 0..8 (tag 1) in chunks of two, each flushed (one flash page each), and
/// returns the segment and block of the summary of the chunk holding LBA 4, which is not
/// its segment's first and has LBA 6..7's chunk after it in the segment.
fn chunks_of_two_flushed(f: &CrashFtl, dev: &Arc<CrashDevice>) -> (u32, u32) {
    for l in 0..8u64 {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
        if l % 2 == 1 {
            f.flush().unwrap();
        }
    }
    let geo = *f.geometry();
    let seg_of = |l: u64| geo.segment_of(f.map_entry(l).unwrap().pba().unwrap() as u64);
    let seg = seg_of(4);
    assert_eq!(seg_of(6), seg, "a chunk after lba 4's in the same segment");
    let off = SegmentChunks::new(dev, geo, seg, f.format_id(), (u64::MAX, u64::MAX))
        .map(|c| c.unwrap())
        .find(|(_, s)| {
            s.entries
                .iter()
                .any(|e| matches!(e, ftl::summary::Entry::Data { lba: 4, .. }))
        })
        .map(|(off, _)| off)
        .unwrap();
    assert!(off > 0);
    (seg, off)
}

/// Opens the FTL on `dev` + `idx` (the default configuration), which must be refused as
/// corrupt with a message containing `says`, and the block at byte `at` left as it was
/// (a refused open writes nothing there). `what`: the test's words for an open that went
/// through.
fn refused_leaving_block(
    dev: &Arc<CrashDevice>,
    idx: &Arc<MemIndex>,
    at: u64,
    says: &str,
    what: &str,
) {
    let mut before = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(at, &mut before).unwrap();
    let e = match Ftl::open(dev.clone(), idx.clone(), Config::default()) {
        Ok(_) => panic!("{what}"),
        Err(e) => e,
    };
    assert!(
        matches!(e, Error::Corrupt(ref m) if m.contains(says)),
        "{e}"
    );
    let mut after = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(at, &mut after).unwrap();
    assert!(
        after[..] == before[..],
        "{what}: the refused open changed block {at}"
    );
}

/// Flips a byte of block `off` of segment `seg` (a summary there fails its checksum);
/// returns its byte offset on the device.
fn flip_a_byte(dev: &CrashDevice, seg: u32, off: u32) -> u64 {
    let geo = ftl::read_superblock_readonly(dev).unwrap().0.geometry;
    let at = (geo.segment_start(seg) + off as u64) * BLOCK_SIZE as u64;
    let mut blk = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(at, &mut blk).unwrap();
    blk[100] ^= 0xff;
    dev.write_at(at, &blk).unwrap();
    at
}

/// A rebuild keeps the erase counts the old index's records still name: wear-aware
/// allocation and static wear levelling balance that history, and a rebuild that reset
/// it made every segment look unworn.
#[test]
fn a_rebuild_keeps_the_erase_counts_the_old_index_names() {
    let (dev, idx, f) = tiny_crash();
    overwrite_rounds(&f, 40, |_| {
        f.checkpoint().unwrap();
    });
    f.close().unwrap();
    let before: Vec<u32> = f.segment_snapshot().iter().map(|s| s.erase_count).collect();
    assert!(
        before.iter().any(|&c| c > 1),
        "segments were reused: {before:?}"
    );
    let segments = f.geometry().segment_count;
    drop(f);
    let (sb, _) = ftl::read_superblock_readonly(&*dev).unwrap();
    // Not from another backing's index: its segment numbers name other segments.
    let mut other = sb.uuid;
    other[0] ^= 1;
    assert!(ftl::erase_counts_of(&*idx, segments, &other)
        .iter()
        .all(|&c| c == 0));
    let wear = ftl::erase_counts_of(&*idx, segments, &sb.uuid);
    assert_eq!(wear, before);
    // The checkpoint record damaged (a common reason to rebuild): the segment records
    // still name the counts (they were all zero).
    let mut damaged = idx.load_kind(ftl::index::Key::CHECKPOINT).unwrap();
    damaged.retain(|(k, _)| k.len() == 1);
    let (key, mut value) = damaged.pop().unwrap();
    value[10] ^= 0xff;
    idx.commit(vec![ftl::index::Op::Put(key.clone(), value)])
        .unwrap();
    assert_eq!(ftl::erase_counts_of(&*idx, segments, &sb.uuid), before);
    // But not from records naming segments this geometry lacks.
    assert!(ftl::erase_counts_of(&*idx, segments - 1, &sb.uuid)
        .iter()
        .all(|&c| c == 0));
    let fresh = Arc::new(MemIndex::new());
    let opts = ftl::RebuildOptions {
        batch: 16,
        wear,
        ..Default::default()
    };
    ftl::rebuild_with(&dev, &fresh, &opts, &mut |_, _| {}).unwrap();
    let (f, _) = Ftl::open(dev.clone(), fresh, Config::default()).unwrap();
    let after: Vec<u32> = f.segment_snapshot().iter().map(|s| s.erase_count).collect();
    assert_eq!(after, before);
}

/// Recovery: the next chunk of the chain, at the head of a segment, in a stream past
/// this build's (a damaged but checksummed summary, or a log of a build with more
/// streams) is refused, and nothing is zeroed: it ended the roll-forward without a word,
/// every chunk after it was dropped and it was zeroed as stale.
#[test]
fn a_chunk_in_a_stream_this_build_does_not_know_is_refused_by_recovery() {
    let (dev, idx, f) = tiny_crash();
    for l in 0..8u64 {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    f.flush().unwrap();
    f.checkpoint().unwrap();
    // Stream 2 has no open segment: its first chunk heads a free segment, and it is the
    // next chunk of the chain after the checkpoint.
    for l in 8..16u64 {
        f.write(l, &block_for(l, 1), false, StreamId(2)).unwrap();
    }
    f.flush().unwrap();
    let pba = f.map_entry(8).unwrap().pba().unwrap() as u64;
    let seg = f.geometry().segment_of(pba);
    assert_eq!(
        pba,
        f.geometry().segment_start(seg) + 1,
        "stream 2 heads a segment"
    );
    drop(f);
    let at = tiny::SEGMENT_BYTES * seg as u64;
    let mut blk = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(at, &mut blk).unwrap();
    let mut s = ftl::summary::ChunkSummary::decode(&blk).unwrap().unwrap();
    s.stream = ftl::STREAMS as u8 + 1;
    s.encode_into(&mut blk).unwrap();
    dev.write_at(at, &blk).unwrap();
    let what = format!(
        "recovery took a chunk of stream {} for the end of the log",
        s.stream
    );
    refused_leaving_block(&dev, &idx, at, "past the", &what);
    // The rebuild refuses it too, before it touches the index it was given (whole, and
    // in slices).
    for memory in [ftl::DEFAULT_REBUILD_MEMORY, 3 * ftl::rebuild::WINNER_BYTES] {
        let before = idx.load().unwrap();
        let opts = ftl::RebuildOptions {
            memory,
            ..Default::default()
        };
        let e = ftl::rebuild_with(&dev, &idx, &opts, &mut |_, _| {}).unwrap_err();
        assert!(
            matches!(e, Error::Corrupt(ref m) if m.contains(&format!("segment {seg} holds a chunk of stream"))),
            "{e}"
        );
        assert!(idx.load().unwrap() == before, "the index was changed");
    }
}

/// A session on `idx` that stages a write of LBA 2 no FLUSH covers, its server killed:
/// the staging area it leaves.
fn killed_with_a_staged_write(
    dev: &Arc<CrashDevice>,
    idx: &Arc<MemIndex>,
) -> Arc<ftl::staging::StagingArea> {
    let g = tiny::open(dev, idx).unwrap();
    g.write(2, &block_for(2, 1), false, S0).unwrap();
    let staging = g.staging().clone();
    drop(g);
    staging
}

/// Opens `idx` with that staging area, which the open ignores as stale; LBA 1 reads its
/// flushed write. The FTL and a block buffer.
fn opened_ignoring_the_staged_write(
    dev: &Arc<CrashDevice>,
    idx: &Arc<MemIndex>,
    staging: Arc<ftl::staging::StagingArea>,
) -> (tiny::CrashFtl, Vec<u8>) {
    let (h, rep) = tiny::open_staged(dev, idx, staging).unwrap();
    assert!(
        rep.recovery.staged.ignored_stale,
        "{:?}",
        rep.recovery.staged
    );
    let mut b = vec![0u8; BLOCK_SIZE];
    h.read(1, &mut b).unwrap();
    assert!(b == block_for(1, 1));
    (h, b)
}

/// After one rebuild, sessions count on from its number. A second rebuild whose walk
/// finds none of them (here the one session since wrote only to its staging area and
/// was killed) is numbered past them all: it gave the first rebuild's number again, and
/// that session's staging area was taken for a restored index's and refused the open
/// (found by review, 2026-11-29). The floor is the clock, as `ftlblk check
/// --rebuild-index` gives it.
#[test]
fn a_second_rebuild_is_numbered_past_the_sessions_since_the_first() {
    let (dev, idx, f) = tiny_crash();
    f.write(1, &block_for(1, 1), false, S0).unwrap();
    f.flush().unwrap();
    f.close().unwrap();
    drop((f, idx));
    let rebuilt = || {
        let idx = Arc::new(MemIndex::new());
        let opts = ftl::RebuildOptions {
            epoch_floor: ftl::rebuild::clock_epoch_floor(),
            ..Default::default()
        };
        let r = ftl::rebuild_with(&dev, &idx, &opts, &mut |_, _| {}).unwrap();
        (idx, r)
    };
    let (idx1, r1) = rebuilt();
    let staging = killed_with_a_staged_write(&dev, &idx1);
    let (idx2, r2) = rebuilt();
    assert!(r2.epoch > r1.epoch + 1, "{} then {}", r1.epoch, r2.epoch);
    opened_ignoring_the_staged_write(&dev, &idx2, staging);
}

/// Recovery refuses, and leaves as it is, the next chunk of the log whose summary is
/// whole (its checksum good) but of a version this build does not know: it took it for
/// a torn write, ended the log there and zeroed it, and the flushed write in it read as
/// zeros (found by review, 2026-11-29).
#[test]
fn a_whole_summary_this_build_cannot_read_is_refused_not_taken_for_torn() {
    let (dev, idx, f) = tiny_crash();
    f.write(1, &block_for(1, 1), false, S0).unwrap();
    f.checkpoint().unwrap();
    f.write(5, &block_for(5, 1), false, S0).unwrap();
    f.flush().unwrap();
    let geo = *f.geometry();
    let pba = f.map_entry(5).unwrap().pba().unwrap() as u64;
    let seg = geo.segment_of(pba);
    let (off, _) = SegmentChunks::new(&dev, geo, seg, f.format_id(), (u64::MAX, u64::MAX))
        .map(|c| c.unwrap())
        .find(|(_, s)| {
            s.entries
                .iter()
                .any(|e| matches!(e, ftl::summary::Entry::Data { lba: 5, .. }))
        })
        .unwrap();
    drop(f);
    let at = (geo.segment_start(seg) + off as u64) * BLOCK_SIZE as u64;
    let mut blk = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(at, &mut blk).unwrap();
    // Version 2, the checksum made good again.
    blk[ftl::summary::offsets::VERSION] = 2;
    let crc = crc32c::crc32c(&blk[..BLOCK_SIZE - 4]);
    blk[BLOCK_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
    dev.write_at(at, &blk).unwrap();
    let what = "recovery took a whole summary of another version for a torn one";
    refused_leaving_block(&dev, &idx, at, "version 2", what);
}

/// Engine rule 11: a freed segment's zeroed first block is durable before the next free
/// record or checkpoint commits. Here segment A (lba 5's) is freed by a free record once
/// a TRIM killed its block, with nothing new to sync; then the TRIM segment is carried
/// (the record hides only a block of A, free now: dropped) and freed by a checkpoint,
/// with nothing new to sync either. A power cut keeping the second zeroing and losing
/// the first showed an index rebuild A's old chunk and no TRIM record: lba 5's trimmed
/// data came back (found by review, 2026-11-29).
#[test]
fn a_freed_segments_zeroing_is_durable_before_the_next_free_commits() {
    let cfg = Config {
        discard_freed: false,
        ..ftl::model::test_config()
    };
    let (dev, idx) = tiny::formatted().unwrap();
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), cfg).unwrap();
    let geo = *f.geometry();
    f.write(5, &block_for(5, 1), false, S0).unwrap();
    let a = geo.segment_of(f.map_entry(5).unwrap().pba().unwrap() as u64);
    f.close_stream(S0).unwrap();
    f.flush().unwrap();
    f.checkpoint().unwrap();
    f.trim(5, 1).unwrap();
    f.flush().unwrap();
    let r = f.free_dead().unwrap();
    assert!(r.segments_freed >= 1, "{r:?}");
    let state = |s: u32| {
        f.segment_snapshot()
            .into_iter()
            .find(|x| x.segment == s)
            .map(|x| x.state)
            .unwrap()
    };
    assert_eq!(state(a), "free");
    f.close_stream(TRIM_STREAM).unwrap();
    f.checkpoint().unwrap();
    let mut head = vec![0u8; BLOCK_SIZE];
    dev.read_durable(geo.segment_start(a) * BLOCK_SIZE as u64, &mut head)
        .unwrap();
    assert!(
        head.iter().all(|&b| b == 0),
        "segment {a}'s zeroing was not durable when the checkpoint committed"
    );
    // And end to end: a power cut now, the index lost, rebuilt: lba 5 stays trimmed.
    drop(f);
    dev.crash(3).unwrap();
    let (idx2, _) = rebuild_into(&dev);
    let g = tiny::open(&dev, &idx2).unwrap();
    let mut b = vec![0u8; BLOCK_SIZE];
    g.read(5, &mut b).unwrap();
    assert!(b == vec![0u8; BLOCK_SIZE], "the trimmed block came back");
}

/// Recovery refuses a segment record that says free yet counts live blocks before it
/// writes anything: the segment's first chunk (older than the checkpoint, so stale to
/// a free segment) was zeroed first, and the rebuild the message points to no longer
/// saw it (found by review, 2026-11-27).
#[test]
fn a_free_segment_record_counting_live_blocks_is_refused_before_anything_is_zeroed() {
    let (dev, idx, f) = tiny_crash();
    for l in 0..8u64 {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    f.close().unwrap();
    let seg = f
        .geometry()
        .segment_of(f.map_entry(0).unwrap().pba().unwrap() as u64);
    drop(f);
    edit_segment_record(&idx, seg, |r| {
        assert!(r.valid > 0);
        r.state = ftl::records::SegState::Free;
    });
    let at = tiny::SEGMENT_BYTES * seg as u64;
    let what = "a free segment counting live blocks was taken";
    refused_leaving_block(&dev, &idx, at, "live blocks", what);
}

/// Recovery rule 2's zeroing comes after the roll-forward's refusals: an open refused by
/// the entries it replays (here one unmapping a block of a segment the checkpoint counts
/// empty) leaves the chunk past the break as it was. Before, the chunks past the break
/// were zeroed first, and `check --rebuild-index`, which the refusal points to, no
/// longer saw them (found by review, 2026-11-27).
#[test]
fn an_open_refused_by_the_roll_forward_zeroes_nothing() {
    let (dev, idx, f) = tiny_crash();
    let geo = *f.geometry();
    let fid = f.format_id();
    for l in 0..6 {
        f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
    }
    f.close().unwrap();
    let a = geo.segment_of(f.map_entry(0).unwrap().pba().unwrap() as u64);
    drop(f);
    let (f, _) = tiny::open_report(&dev, &idx).unwrap();
    // Replayed: an overwrite of lba 0, which unmaps a block of segment `a`.
    f.write(0, &block_for(0, 2), false, StreamId(3)).unwrap();
    f.flush().unwrap();
    // The break: stream 4's chunk, whose summary the crash loses.
    f.write(20, &block_for(20, 2), false, StreamId(4)).unwrap();
    f.flush().unwrap();
    // Past the break: stream 5's chunk.
    f.write(30, &block_for(30, 2), false, StreamId(5)).unwrap();
    f.flush().unwrap();
    let last_of = |stream: u8| {
        let mut best = None;
        for seg in 1..geo.segment_count {
            for c in SegmentChunks::new(&dev, geo, seg, fid, (u64::MAX, u64::MAX)) {
                let (off, s) = c.unwrap();
                if s.stream == stream && best.is_none_or(|(q, _, _)| s.chunk_seq > q) {
                    best = Some((s.chunk_seq, seg, off));
                }
            }
        }
        best.unwrap()
    };
    let (_, b_seg, b_off) = last_of(4);
    let (_, d_seg, d_off) = last_of(5);
    drop(f);
    let at = |seg: u32, off: u32| (geo.segment_start(seg) + off as u64) * BLOCK_SIZE as u64;
    dev.write_at(at(b_seg, b_off), &AlignedBuf::new(BLOCK_SIZE))
        .unwrap();
    dev.sync().unwrap();
    edit_segment_record(&idx, a, |r| {
        assert!(r.valid > 0);
        r.valid = 0;
    });
    let mut before = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(at(d_seg, d_off), &mut before).unwrap();
    assert!(before.iter().any(|&x| x != 0));
    let e = match tiny::open_report(&dev, &idx) {
        Ok(_) => panic!("an entry unmapping a block of an empty segment was replayed"),
        Err(e) => e,
    };
    assert!(
        matches!(e, Error::Corrupt(ref m) if m.contains("counts empty")),
        "{e}"
    );
    let mut after = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(at(d_seg, d_off), &mut after).unwrap();
    assert!(
        after[..] == before[..],
        "the chunk past the break was zeroed by an open that was refused"
    );
}

/// A rebuild cannot tell a write that never completed from a damaged block of data that
/// was durable: both fail their checksum, and the LBA is rebuilt to its older copy.
/// Where that older copy is what the LBA now reads, the report names it (a warning, and
/// `older_copies`); a damaged block that was not its LBA's newest changes nothing and is
/// not named. It went by silently: a damaged newest copy came back as the stale one.
#[test]
fn a_rebuild_names_the_lbas_it_gives_an_older_copy() {
    for damaged_newest in [true, false] {
        let (dev, _idx, f) = tiny_crash();
        f.write(5, &block_for(5, 1), false, S0).unwrap();
        f.flush().unwrap();
        let old = f.map_entry(5).unwrap().pba().unwrap() as u64;
        f.write(5, &block_for(5, 2), false, S0).unwrap();
        f.flush().unwrap();
        let new = f.map_entry(5).unwrap().pba().unwrap() as u64;
        f.close().unwrap();
        let geo = *f.geometry();
        drop(f);
        let pba = if damaged_newest { new } else { old };
        let seg = geo.segment_of(pba);
        flip_a_byte(&dev, seg, (pba - geo.segment_start(seg)) as u32);
        let (_, r) = rebuild_into(&dev);
        assert_eq!(r.checksum_failures, 1, "{r:?}");
        let named = r.warnings.iter().any(|w| w.contains("LBA 5"));
        if damaged_newest {
            assert_eq!(r.older_copies, 1, "{r:?}");
            assert!(named, "{:?}", r.warnings);
        } else {
            assert_eq!(r.older_copies, 0, "{r:?}");
            assert!(!named, "{:?}", r.warnings);
        }
    }
}

/// Tombstone rule 2: the chunk that carries a TRIM segment's records notes that segment
/// as killed, so the free record that frees it seals and syncs the chunk first. A TRIM
/// segment of an earlier session (taken over by recovery, young to the session's first
/// checkpoint, which carries nothing: open rule 3) is closed, carried and freed by a free
/// record; then a power cut. Without the note the carried records were only in an open
/// chunk: lost, with their segment freed, and the trimmed blocks came back.
#[test]
fn carried_trim_records_are_durable_before_a_free_record_frees_their_segment() {
    let (dev, idx, f) = tiny_crash();
    for l in 0..60 {
        f.write(l, &block_for(l, l + 1), false, StreamId(1))
            .unwrap();
    }
    f.flush().unwrap();
    f.trim(0, 40).unwrap();
    f.close_stream(TRIM_STREAM).unwrap();
    f.flush().unwrap();
    drop(f);
    // Recovery takes the segment over as the TRIM stream's open segment (young to the
    // session's first checkpoint, which carries nothing); closed here, it is the earlier
    // session's closed TRIM segment a free record may carry and free.
    let g = tiny::open(&dev, &idx).unwrap();
    g.close_stream(TRIM_STREAM).unwrap();
    let trim_segs = closed_trim_segments(&g);
    assert!(
        !trim_segs.is_empty(),
        "the earlier session's TRIM segment is closed"
    );
    let r = g.free_dead().unwrap();
    let snap = g.segment_snapshot();
    assert!(
        trim_segs.iter().any(|&s| snap[s as usize].state == "free"),
        "a free record carried and freed the TRIM segment ({trim_segs:?}): {r:?}"
    );
    drop(g);
    assert!(dev.crash_losing_all().is_ok());
    let h = tiny::open(&dev, &idx).unwrap();
    let mut b = vec![0u8; BLOCK_SIZE];
    for l in 0..60 {
        h.read(l, &mut b).unwrap();
        let want = if l < 40 { 0 } else { l + 1 };
        assert_eq!(observe(l, &b), Observed::Tag(want), "lba {l}");
    }
    rebuild_agrees(&dev, &h).unwrap();
}

/// The closed segments of the TRIM stream.
fn closed_trim_segments(f: &CrashFtl) -> Vec<u32> {
    f.segment_snapshot()
        .into_iter()
        .filter(|s| s.stream == TRIM_STREAM.0 && s.state == "closed" && s.segment != 0)
        .map(|s| s.segment)
        .collect()
}

/// A chunk of session `epoch` holding `data` for `lba`, written in place at block `off`
/// of segment `seg` (summary, data block, zero padding to the page's end): what a freed
/// segment keeps past its zeroed first block from the session that used it last.
fn plant_chunk(dev: &CrashDevice, seg: u32, off: u32, epoch: u64, lba: u64, data: &[u8]) {
    let (sb, _) = ftl::read_superblock_readonly(dev).unwrap();
    let geo = sb.geometry;
    let pad = geo.blocks_per_page() - 2;
    let s = ftl::summary::ChunkSummary {
        stream: 1,
        chunk_seq: 1 << 20,
        epoch,
        format_id: sb.format_id(),
        segment: seg,
        offset: off,
        data_blocks: 1,
        pad_blocks: pad as u16,
        entries: vec![ftl::summary::Entry::Data {
            lba,
            seq: 1 << 30,
            crc: crc32c::crc32c(data),
        }],
    };
    let mut blk = AlignedBuf::new(BLOCK_SIZE);
    s.encode_into(&mut blk).unwrap();
    let at = (geo.segment_start(seg) + off as u64) * BLOCK_SIZE as u64;
    dev.write_at(at, &blk).unwrap();
    blk.copy_from_slice(data);
    dev.write_at(at + BLOCK_SIZE as u64, &blk).unwrap();
}

/// A rebuilt index's session is newer than every session the device ever ran, not only
/// than those whose chunks the log still walks: a freed segment keeps the chunks of its
/// last use past its zeroed first block, and those may be of a later session than any
/// chunk still live (everything a session wrote was overwritten or trimmed and freed).
/// Found by review (2026-11-29): the rebuild numbered its session one past the newest
/// walked chunk; the next sessions wrote into freed segments, recovery met such a chunk
/// where a stream went on, took it for a newer log and refused the open ("older than the
/// log"), and a second rebuild walked into it and handed its data back.
#[test]
fn a_rebuilt_session_is_newer_than_the_chunks_freed_segments_keep() {
    let (dev, idx, f) = tiny_crash();
    f.write(3, &block_for(3, 1), false, S0).unwrap();
    f.flush().unwrap();
    f.close().unwrap();
    drop((f, idx));
    let (idx, _) = rebuild_into(&dev);
    let (sb, _) = ftl::read_superblock_readonly(&*dev).unwrap();
    let (geo, page) = (sb.geometry, sb.geometry.blocks_per_page());
    // The newest session whose chunks the log walks.
    let walked = (1..geo.segment_count)
        .flat_map(|seg| {
            SegmentChunks::new(&dev, geo, seg, sb.format_id(), (u64::MAX, u64::MAX))
                .map(|c| c.unwrap().1.epoch)
                .collect::<Vec<_>>()
        })
        .max()
        .unwrap();
    // Every free segment keeps, at its first page boundary, a chunk of a session the
    // device ran before the index was lost (later than any the log walks).
    let old = block_for(7, 99);
    let g = tiny::open(&dev, &idx).unwrap();
    let free: Vec<u32> = g
        .segment_snapshot()
        .into_iter()
        .filter(|s| s.state == "free" && s.segment != 0)
        .map(|s| s.segment)
        .collect();
    assert!(!free.is_empty());
    for &seg in &free {
        plant_chunk(&dev, seg, page, walked + 7, 7, &old);
    }
    // A write with a FLUSH: its chunk takes a free segment's first page, and the stream
    // goes on at the planted chunk.
    let new = block_for(7, 2);
    g.write(7, &new, false, S0).unwrap();
    g.flush().unwrap();
    g.close().unwrap();
    drop(g);
    let h = match tiny::open(&dev, &idx) {
        Ok(h) => h,
        Err(e) => panic!("a rebuilt device's open refused: {e}"),
    };
    let mut b = vec![0u8; BLOCK_SIZE];
    h.read(7, &mut b).unwrap();
    assert!(b == new, "the planted chunk's data read back");
    h.close().unwrap();
    drop(h);
    // Rebuilt once more: the write wins over the planted chunk.
    let (idx2, _) = rebuild_into(&dev);
    let k = tiny::open(&dev, &idx2).unwrap();
    k.read(7, &mut b).unwrap();
    assert!(
        b == new,
        "the second rebuild handed the planted chunk's data back"
    );
    let mut b3 = vec![0u8; BLOCK_SIZE];
    k.read(3, &mut b3).unwrap();
    assert!(b3 == block_for(3, 1));
}

/// A rebuild's index starts a session of its own: the staging area a killed server of
/// the lost index's session left is not replayed (`ftlblk check --rebuild-index` says
/// so; its unflushed writes are lost), and nothing of it reaches the backing. Found by
/// review (2026-11-29): the rebuilt session took the killed one's number, the next open
/// replayed the area's chunk at its recorded place, where no stream of the rebuilt index
/// goes on, and failed after writing it; a later rebuild would map its blocks.
#[test]
fn a_rebuilt_index_does_not_replay_the_lost_sessions_staging_area() {
    let (dev, idx, f) = tiny_crash();
    f.write(1, &block_for(1, 1), false, S0).unwrap();
    f.flush().unwrap();
    f.close().unwrap();
    drop(f);
    // The next session stages a write no FLUSH covers, and its server is killed.
    let staging = killed_with_a_staged_write(&dev, &idx);
    drop(idx);
    let (idx2, _) = rebuild_into(&dev);
    let (h, mut b) = opened_ignoring_the_staged_write(&dev, &idx2, staging);
    h.read(2, &mut b).unwrap();
    assert!(b == vec![0u8; BLOCK_SIZE], "the staged write was replayed");
    h.close().unwrap();
    drop(h);
    let (idx3, _) = rebuild_into(&dev);
    let k = tiny::open(&dev, &idx3).unwrap();
    k.read(2, &mut b).unwrap();
    assert!(
        b == vec![0u8; BLOCK_SIZE],
        "the staged chunk reached the backing"
    );
}

/// Tombstone rule 1 against damage: a TRIM segment whose walk meets a summary failing its
/// checksum is not carried, so not freed (a failed carry, counted), and a rebuild still
/// finds the records of its readable chunks. The carry's walk used to end silently at
/// the damage: the segment counted as carried, was freed, and a rebuild handed back the
/// data the records of the chunks after the damaged one had hidden (found by review,
/// 2026-11-30). Damage in the first chunk, where no walk can go on, keeps it too.
#[test]
fn a_trim_segment_with_a_damaged_summary_is_not_carried_nor_freed() {
    for damaged_chunk in [1usize, 0] {
        let (dev, _idx, f) = tiny_crash();
        for l in 0..60 {
            f.write(l, &block_for(l, l + 1), false, StreamId(1))
                .unwrap();
        }
        f.flush().unwrap();
        f.checkpoint().unwrap();
        // Three chunks of TRIM records in one TRIM segment: 0..20, 20..40, 40..60.
        for part in 0..3u64 {
            f.trim(part * 20, 20).unwrap();
            f.flush().unwrap();
        }
        f.close_stream(TRIM_STREAM).unwrap();
        let trim_segs = closed_trim_segments(&f);
        assert_eq!(trim_segs.len(), 1, "{trim_segs:?}");
        let seg = trim_segs[0];
        let geo = *f.geometry();
        let chunks: Vec<u32> =
            SegmentChunks::new(&*dev, geo, seg, f.format_id(), (u64::MAX, u64::MAX))
                .map(|c| c.unwrap().0)
                .collect();
        assert_eq!(chunks.len(), 3, "{chunks:?}");
        flip_a_byte(&dev, seg, chunks[damaged_chunk]);
        f.checkpoint().unwrap();
        f.checkpoint().unwrap();
        let snap = f.segment_snapshot();
        assert_eq!(
            snap[seg as usize].state, "closed",
            "damaged chunk {damaged_chunk}: the TRIM segment is kept"
        );
        assert!(f.stats().tombstone_carry_failures >= 1);
        // The device still reads zeros where it was trimmed.
        let mut b = vec![0u8; BLOCK_SIZE];
        for l in 0..60 {
            f.read(l, &mut b).unwrap();
            assert_eq!(observe(l, &b), Observed::Tag(0), "lba {l}");
        }
        f.close().unwrap();
        drop(f);
        if damaged_chunk == 1 {
            // The rebuild walks past the damage: the third chunk's records still hide
            // the old data (the damaged chunk's own are lost, nothing says which LBAs).
            let (idx, _) = rebuild_into(&dev);
            let (g, _) = Ftl::open(dev.clone(), idx, Config::default()).unwrap();
            for l in 40..60 {
                g.read(l, &mut b).unwrap();
                assert_eq!(
                    observe(l, &b),
                    Observed::Tag(0),
                    "lba {l} after the rebuild"
                );
            }
        }
    }
}
