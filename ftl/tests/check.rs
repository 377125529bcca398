//! The offline checker finds each kind of damage, and passes healthy devices.

mod common;

use common::*;
use ftl::check::check;
use ftl::model::block_for;
use ftl::{BlockDevice, IndexStore, StreamId};
use std::sync::atomic::Ordering;

/// A tiny device where lbas `0..n` were written (stream 1) and the FTL closed, and the
/// map page those entries sit in, as the checkpoint holds it.
fn written_and_closed(n: u64) -> (CrashFtl, Vec<u64>, Dev, Idx) {
    let (dev, idx, f) = tiny_crash();
    for l in 0..n {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    f.close().unwrap();
    let mut entries = vec![u64::MAX; 393usize.min(ftl::records::PAGE_ENTRIES)];
    for l in 0..n {
        entries[l as usize] = f.map_entry(l).unwrap().0;
    }
    (f, entries, dev, idx)
}

type Dev = std::sync::Arc<ftl::device::crash::CrashDevice>;
type Idx = std::sync::Arc<ftl::index::mem::MemIndex>;

/// Puts `entries` in the index as map page 0.
fn poke_map_page(idx: &Idx, entries: Vec<u64>) {
    idx.poke(
        ftl::index::Key::map_page(0),
        ftl::records::MapPage { page: 0, entries }.encode(),
    );
}

#[test]
fn healthy_device_is_clean_after_writes_trims_crashes() {
    let (dev, idx, f) = tiny_crash();
    for i in 0..200u64 {
        f.write(
            i % 90,
            &block_for(i % 90, i + 1),
            i % 17 == 0,
            StreamId((i % 3) as u8),
        )
        .unwrap();
        if i % 50 == 0 {
            f.trim(i % 90, 5).unwrap();
            f.checkpoint().unwrap();
        }
    }
    f.flush().unwrap();
    drop(f);
    dev.crash(5).unwrap();
    let r = check(&*dev, &*idx, true).unwrap();
    assert!(r.clean(), "{:#?}", r.problems);
    assert!(r.mapped_blocks > 0 && r.blocks_verified == r.mapped_blocks);
    assert!(
        r.chunks_replayed > 0,
        "the checker replays the log without writing"
    );
}

#[test]
fn damaged_data_superblock_and_index_are_reported() {
    let (dev, idx, f) = tiny_crash();
    for l in 0..40u64 {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    f.close().unwrap();
    let pba = f.map_entry(7).unwrap().pba().unwrap() as u64;
    drop(f);
    // A flipped data block.
    dev.write_at(pba * 4096, &[0x77; 4096]).unwrap();
    let r = check(&*dev, &*idx, true).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.check == "data checksums" && p.detail.contains("lba 7")),
        "{:#?}",
        r.problems
    );
    // A damaged superblock copy B.
    let seg = 64 << 10;
    dev.write_at(seg - 4096, &[1u8; 4096]).unwrap();
    let r = check(&*dev, &*idx, false).unwrap();
    assert!(
        r.problems.iter().any(|p| p.check == "superblock"),
        "{:#?}",
        r.problems
    );
    // A segment record whose live count disagrees with the map.
    edit_segment_record(&idx, 1, |r| r.valid += 3);
    let r = check(&*dev, &*idx, false).unwrap();
    assert!(
        r.problems.iter().any(|p| p.check == "segment live counts"),
        "{:#?}",
        r.problems
    );
    // A corrupt record is a problem naming it (the check stops there): damage found,
    // not a check that could not run.
    idx.poke(ftl::index::Key::map_page(0), vec![0; 10]);
    let r = check(&*dev, &*idx, false).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.check == "index records" && p.detail.contains("rebuild")),
        "{:#?}",
        r.problems
    );
}

/// Bug 6 of issue 14: the checker's summary walk took a chunk of an earlier format of
/// the backing (reformatted without discard) for part of the log, so a map entry
/// pointing at such a stale block passed. It reads summaries as recovery does now.
#[test]
fn a_chunk_of_an_earlier_format_covers_no_map_entry() {
    let (dev, idx, f) = tiny_crash();
    f.write(5, &block_for(5, 9), false, S0).unwrap();
    f.close().unwrap();
    let e = f.map_entry(5).unwrap();
    drop(f);
    let bps = 16u64;
    let seg = e.pba().unwrap() as u64 / bps;
    // Reformat: the old chunk stays where it was.
    ftl::format(&dev, &idx, &tiny(), true).unwrap();
    // An index that (wrongly) maps lba 5 to the old block and calls its segment closed.
    let cap = 393usize;
    let mut entries = vec![u64::MAX; cap.min(ftl::records::PAGE_ENTRIES)];
    entries[5] = e.0;
    poke_map_page(&idx, entries);
    edit_segment_record(&idx, seg as u32, |r| {
        r.state = ftl::records::SegState::Closed;
        r.valid = 1;
    });
    let report = check(&*dev, &*idx, true).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.check == "map vs summaries" && p.detail.contains("lba 5")),
        "the stale chunk was taken for the log: {:#?}",
        report.problems
    );
}

/// A map entry whose checksum is not the one its block's summary recorded: every read
/// of the LBA fails (EIO). The checker compared only the LBA the summary names, so
/// without data verification (`--no-data`) it called such an index clean (found by
/// review, 2026-11-27).
#[test]
fn a_map_entry_with_a_checksum_its_summary_does_not_hold_is_reported() {
    let (f, mut entries, dev, idx) = written_and_closed(40);
    drop(f);
    assert!(check(&*dev, &*idx, false).unwrap().clean());
    let e = ftl::MapEntry(entries[7]);
    entries[7] = ftl::MapEntry::new(e.pba().unwrap(), e.crc() ^ 1).0;
    poke_map_page(&idx, entries);
    let r = check(&*dev, &*idx, false).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.check == "map vs summaries" && p.detail.contains("lba 7 ")),
        "{:#?}",
        r.problems
    );
}

/// Bug 6 of issue 14: after the server died, the checker reported "clean" while
/// completed writes existed only in its staging file. Given the file, it checks what the
/// next open will see, and changes neither the file nor the backing.
#[test]
fn the_checker_includes_what_a_dead_servers_staging_file_holds() {
    use ftl::staging::StagingArea;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.stage");
    let (dev, idx, f) = tiny_crash();
    drop(f);
    let area = StagingArea::open_file(&file, 8).unwrap();
    let (f, _) =
        ftl::Ftl::open_staged(dev.clone(), idx.clone(), ftl::Config::default(), area).unwrap();
    for l in 0..30u64 {
        f.write(l, &block_for(l, 3), false, StreamId(1 + (l % 3) as u8))
            .unwrap();
    }
    drop(f); // the server dies
    let image = |d: &ftl::device::crash::CrashDevice| {
        let mut b = vec![0u8; d.size() as usize];
        d.read_at(0, &mut b).unwrap();
        b
    };
    let (dev_before, file_before) = (image(&dev), std::fs::read(&file).unwrap());
    let without = check(&*dev, &*idx, true).unwrap();
    let snap = StagingArea::open_file_snapshot(&file).unwrap();
    let with = ftl::check::check_staged(&*dev, &*idx, true, Some(snap)).unwrap();
    assert!(with.clean(), "{:#?}", with.problems);
    assert_eq!(with.staged.entries, 30, "{:?}", with.staged);
    assert_eq!(with.mapped_blocks, 30);
    assert!(
        without.mapped_blocks < 30,
        "the staged writes are not on the backing yet"
    );
    assert!(image(&dev) == dev_before, "the backing is unchanged");
    assert!(
        std::fs::read(&file).unwrap() == file_before,
        "the staging file is unchanged"
    );
    // And the next open agrees with the checker.
    let area = StagingArea::open_file(&file, 8).unwrap();
    let (f, rep) =
        ftl::Ftl::open_staged(dev.clone(), idx.clone(), ftl::Config::default(), area).unwrap();
    assert_eq!(rep.recovery.staged.entries, 30);
    assert_eq!(f.stats().mapped_blocks, 30);
}

/// Check 7: a free record's reuse count is more than the table's (one more for each time
/// the segment was freed since); a record that says otherwise is reported under "wear",
/// and the report carries the wear figures.
#[test]
fn a_free_record_with_a_wrong_reuse_count_is_reported() {
    let (dev, idx, f) = tiny_crash();
    overwrite_rounds(&f, 3, |round| {
        if round == 0 {
            f.checkpoint().unwrap();
        }
    });
    let r = f.free_dead().unwrap();
    assert!(r.segments_freed > 0, "{r:?}");
    drop(f);
    let report = check(&dev, &idx, true).unwrap();
    assert!(report.clean(), "{:?}", report.problems);
    assert!(report.wear.max <= 1, "{:?}", report.wear);
    let (k, v) = idx
        .load_kind(ftl::index::Key::FREE)
        .unwrap()
        .into_iter()
        .next()
        .expect("a free record");
    let mut rec = ftl::records::FreeRecord::decode(&v).unwrap();
    rec.erase_count = 0;
    idx.poke(k, rec.encode());
    let report = check(&dev, &idx, true).unwrap();
    assert!(
        report.problems.iter().any(|p| p.check == "wear"),
        "{:?}",
        report.problems
    );
}

/// Reuse counts survive checkpoints, free records and recovery (issue 18, item 4).
#[test]
fn reuse_counts_survive_a_crash_and_reopen() {
    let (dev, idx, f) = tiny_crash();
    overwrite_rounds(&f, 12, |round| {
        if round % 2 == 0 {
            f.checkpoint().unwrap();
        } else {
            f.free_dead().unwrap();
        }
    });
    let counts =
        |s: Vec<ftl::SegmentSnapshot>| -> Vec<u32> { s.iter().map(|s| s.erase_count).collect() };
    // Nothing left dead for the reopen's checkpoint to free (which would count a reuse).
    f.checkpoint().unwrap();
    f.checkpoint().unwrap();
    let before = counts(f.segment_snapshot());
    assert!(f.stats().wear.max >= 1, "{:?}", f.stats().wear);
    drop(f);
    let g = ftl::model::tiny::open(&dev, &idx).unwrap();
    assert_eq!(counts(g.segment_snapshot()), before);
}

/// Check 4 sums a hash of each map entry and of each summary entry per segment, and
/// reads again only the segments whose sums differ, in groups held to a number of
/// blocks. Each contradiction is named as before (another LBA, another checksum, no
/// summary at all), and the same problems come out whether the damaged segments are
/// read all at once or one at a time.
#[test]
fn contradictions_are_named_alike_in_one_group_or_many() {
    let (f, mut entries, dev, idx) = written_and_closed(100);
    let segment_of = |e: u64| ftl::MapEntry(e).pba().unwrap() as u64 / 16;
    assert_ne!(segment_of(entries[3]), segment_of(entries[60]));
    assert_ne!(segment_of(entries[3]), segment_of(entries[20]));
    let f_entries = entries.clone();
    let free = f
        .segment_snapshot()
        .into_iter()
        .rev()
        .find(|s| s.state == "free")
        .expect("a free segment")
        .segment;
    drop(f);
    assert!(check(&*dev, &*idx, false).unwrap().clean());
    // lbas 3 and 60 swap blocks; lba 20 keeps its block with another checksum; lba 90
    // points into a free segment.
    entries.swap(3, 60);
    let e = ftl::MapEntry(entries[20]);
    entries[20] = ftl::MapEntry::new(e.pba().unwrap(), e.crc() ^ 1).0;
    entries[90] = ftl::MapEntry::new(free * 16 + 5, 0).0;
    poke_map_page(&idx, entries);
    let sorted = |r: ftl::check::CheckReport| {
        let mut p: Vec<_> = r
            .problems
            .into_iter()
            .map(|p| format!("{}: {}", p.check, p.detail))
            .collect();
        p.sort();
        p
    };
    let all = sorted(check(&*dev, &*idx, false).unwrap());
    for want in [
        "map vs summaries: lba 3 -> block".to_string(),
        "map vs summaries: lba 60 -> block".to_string(),
        "map vs summaries: lba 20 -> block".to_string(),
        format!("map: lba 90 maps into free segment {free}"),
        format!(
            "map vs summaries: lba 90 -> block {}, which no chunk summary covers",
            free * 16 + 5
        ),
    ] {
        assert!(
            all.iter().any(|p| p.starts_with(&want)),
            "no '{want}' in {all:#?}"
        );
    }
    assert!(
        all.iter()
            .any(|p| p.contains("lba 3 -> block") && p.contains("whose summary names lba 60")),
        "{all:#?}"
    );
    assert!(
        all.iter()
            .any(|p| p.contains("lba 20 -> block") && p.contains("whose summary says")),
        "{all:#?}"
    );
    // One segment per group: a pass over the map for each damaged segment.
    let grouped = sorted(ftl::check::check_in_groups(&*dev, &*idx, false, 1, 8).unwrap());
    assert_eq!(all, grouped);
    // Two passes at most: the segments past them get one problem each, not a pass.
    let damaged = [3usize, 60, 20]
        .map(|l| segment_of(f_entries[l]))
        .into_iter()
        .chain([free as u64])
        .collect::<std::collections::BTreeSet<_>>();
    let capped = sorted(ftl::check::check_in_groups(&*dev, &*idx, false, 1, 2).unwrap());
    let per_segment = capped
        .iter()
        .filter(|p| p.contains("entries not named one by one"))
        .count();
    assert_eq!(per_segment, damaged.len() - 2, "{capped:#?}");
    let named = capped.iter().filter(|p| p.contains(" -> block ")).count();
    assert!(
        named >= 2 && named < all.iter().filter(|p| p.contains(" -> block ")).count(),
        "{capped:#?}"
    );
}

/// Data verification reads a map page's blocks sorted by place, runs of adjacent blocks
/// as one read: blocks damaged at a run's start, inside one, at its end and alone (an
/// overwrite elsewhere in the log) are each named once, in LBA order, and no other.
#[test]
fn every_damaged_block_is_named_once_whatever_its_run() {
    let (dev, idx, f) = tiny_crash();
    for l in 0..60u64 {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    // Overwrites in reverse order: their blocks lie in the log backwards to their LBAs.
    for l in [50u64, 31, 30, 12] {
        f.write(l, &block_for(l, 2), false, S0).unwrap();
    }
    f.close().unwrap();
    let pba = |l: u64| f.map_entry(l).unwrap().pba().unwrap() as u64;
    let damaged = [0u64, 12, 20, 21, 30, 59];
    let places: Vec<u64> = damaged.iter().map(|&l| pba(l)).collect();
    drop(f);
    for p in places {
        dev.write_at(p * 4096, &[0x5a; 4096]).unwrap();
    }
    let r = check(&*dev, &*idx, true).unwrap();
    let named: Vec<&str> = r
        .problems
        .iter()
        .filter(|p| p.check == "data checksums")
        .map(|p| p.detail.as_str())
        .collect();
    let lbas: Vec<u64> = named
        .iter()
        .map(|d| {
            d["lba ".len()..]
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(lbas, damaged, "{named:#?}");
    assert_eq!(r.blocks_verified, 60);
}

/// A block that does not read at all (a media error) is named as such, and the check goes
/// on: the blocks of its run before and after it, and every later page, are still
/// verified, and one damaged elsewhere still named. A read error used to end the check
/// there, with the offset of the whole run.
#[test]
fn a_block_that_does_not_read_is_named_and_the_check_goes_on() {
    let (dev, idx, f) = tiny_crash();
    for l in 0..60u64 {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    f.close().unwrap();
    let pba = |l: u64| f.map_entry(l).unwrap().pba().unwrap() as u64;
    let (gone, damaged) = (pba(20), pba(40));
    assert_eq!(
        (pba(19) + 1, pba(21) - 1),
        (gone, gone),
        "lba 20 inside a run"
    );
    drop(f);
    dev.write_at(damaged * 4096, &[0x5a; 4096]).unwrap();
    dev.faults.unreadable.store(gone + 1, Ordering::SeqCst);
    let r = check(&*dev, &*idx, true).unwrap();
    let named: Vec<(&str, &str)> = r
        .problems
        .iter()
        .filter(|p| p.check.starts_with("data"))
        .map(|p| (p.check, p.detail.as_str()))
        .collect();
    assert_eq!(named.len(), 2, "{named:#?}");
    assert_eq!(named[0].0, "data reads");
    assert!(
        named[0]
            .1
            .starts_with(&format!("lba 20 (block {gone}) does not read")),
        "{named:#?}"
    );
    assert_eq!(
        named[1],
        (
            "data checksums",
            format!("lba 40 (block {damaged}) does not match its crc32c").as_str()
        )
    );
    assert!(!r.clean());
    assert_eq!(r.blocks_verified, 59);
}

/// A backing where nothing reads any more (unplugged in the middle of the check) is not
/// named block by block: past 1024 blocks that do not read, the check ends with the
/// error (it could not check), instead of a problem for each block left.
#[test]
fn a_check_stops_when_too_many_blocks_do_not_read() {
    let (dev, idx) = ftl::model::tiny::formatted_bytes(32 << 20).unwrap();
    let f = ftl::model::tiny::open(&dev, &idx).unwrap();
    for l in 0..1100u64 {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    f.close().unwrap();
    let places: Vec<u64> = (0..1100u64)
        .map(|l| f.map_entry(l).unwrap().pba().unwrap() as u64)
        .collect();
    let (first, last) = (places.iter().min().unwrap(), places.iter().max().unwrap());
    drop(f);
    // Every block from the first data block to the last: the stream's cursor after them
    // still reads (the open's recovery reads it).
    dev.faults.unreadable.store(first + 1, Ordering::SeqCst);
    dev.faults
        .unreadable_count
        .store(last - first + 1, Ordering::SeqCst);
    match check(&*dev, &*idx, true) {
        Err(e) => assert!(e.to_string().contains("more than 1024 blocks"), "{e}"),
        Ok(r) => panic!(
            "{} problems, {} verified",
            r.problems.len(),
            r.blocks_verified
        ),
    }
}

/// Check 8: the map against the newest record of each LBA in the log. An index whose
/// map points at an older copy of a block (a later write sits in the log), maps a block
/// the log's newest record trims (a rebuild would unmap it) or leaves unmapped a block
/// whose newest record is a write (a lost write) passed every other check: each map
/// entry agrees with the summary of the block it names (found by review, 2026-11-29).
#[test]
fn a_map_that_is_not_the_logs_newest_record_is_reported() {
    let (dev, idx, f) = tiny_crash();
    for l in 0..10u64 {
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    let (old5, old7) = (f.map_entry(5).unwrap(), f.map_entry(7).unwrap());
    f.write(5, &block_for(5, 2), false, S0).unwrap();
    f.trim(7, 1).unwrap();
    f.close().unwrap();
    let mut entries = vec![u64::MAX; 393usize.min(ftl::records::PAGE_ENTRIES)];
    for l in 0..10u64 {
        entries[l as usize] = f.map_entry(l).unwrap().0;
    }
    drop(f);
    assert!(check(&*dev, &*idx, false).unwrap().clean());
    let new3 = entries[3];
    entries[5] = old5.0;
    entries[7] = old7.0;
    entries[3] = u64::MAX;
    poke_map_page(&idx, entries);
    let r = check(&*dev, &*idx, false).unwrap();
    let found = |lba: &str, what: &str| {
        r.problems.iter().any(|p| {
            p.check == "map vs log" && p.detail.starts_with(lba) && p.detail.contains(what)
        })
    };
    let new3 = ftl::MapEntry(new3).pba().unwrap();
    assert!(
        found("lba 5 ", "newest record of it is the write at block"),
        "{:#?}",
        r.problems
    );
    assert!(found("lba 7 ", "TRIM"), "{:#?}", r.problems);
    assert!(
        found(
            "lba 3 ",
            &format!("unmapped, but the log's newest record of it is the write at block {new3}")
        ),
        "{:#?}",
        r.problems
    );
    assert_eq!(
        r.problems
            .iter()
            .filter(|p| p.check == "map vs log")
            .count(),
        3,
        "{:#?}",
        r.problems
    );
    // Held a map page of LBAs at a time: the same problems.
    let sliced = ftl::check::check_in_slices(&*dev, &*idx, 1, None).unwrap();
    assert_eq!(sliced.problems, r.problems);
}

/// Check 8 in slices of LBAs (one pass over the summaries each) names what one pass
/// names, on a device of several map pages, with damage in the second page and a TRIM
/// across the pages' edge.
#[test]
fn the_log_check_in_slices_names_what_one_pass_names() {
    use ftl::model::tiny;
    let (dev, idx) = tiny::formatted_bytes(tiny::DEVICE_BYTES * 4).unwrap();
    let f = tiny::open(&dev, &idx).unwrap();
    let page = ftl::records::PAGE_ENTRIES as u64;
    let cap = f.geometry().exported_blocks;
    assert!(cap > 2 * page, "{cap}");
    for i in 0..(cap as usize) {
        let l = (i as u64 * 7) % cap;
        f.write(l, &block_for(l, 1), false, S0).unwrap();
    }
    let old = f.map_entry(page + 3).unwrap();
    f.write(page + 3, &block_for(page + 3, 2), false, S0)
        .unwrap();
    f.trim(page - 2, 4).unwrap();
    f.close().unwrap();
    drop(f);
    assert!(check(&*dev, &*idx, false).unwrap().clean());
    assert!(ftl::check::check_in_slices(&*dev, &*idx, 1, None)
        .unwrap()
        .clean());
    // Page 1 as the index holds it, with lba page + 3 at its older copy.
    let mut entries = Vec::new();
    let f = tiny::open(&dev, &idx).unwrap();
    for l in page..(2 * page).min(cap) {
        entries.push(f.map_entry(l).unwrap().0);
    }
    f.close().unwrap();
    drop(f);
    entries[3] = old.0;
    idx.poke(
        ftl::index::Key::map_page(1),
        ftl::records::MapPage { page: 1, entries }.encode(),
    );
    let whole = check(&*dev, &*idx, false).unwrap();
    let log: Vec<_> = whole
        .problems
        .iter()
        .filter(|p| p.check == "map vs log")
        .collect();
    assert_eq!(log.len(), 1, "{:#?}", whole.problems);
    assert!(
        log[0].detail.starts_with(&format!("lba {} ", page + 3)),
        "{log:?}"
    );
    let sliced = ftl::check::check_in_slices(&*dev, &*idx, 1, None).unwrap();
    assert_eq!(sliced.problems, whole.problems);
    let slices = cap.div_ceil(page);
    assert_eq!(
        sliced.log_passes as u64, slices,
        "a walk of the log per slice"
    );
    // With a place for its records: one walk of the log, sorted into a file per slice
    // (it walked every summary once per slice: a review found 3.5 G summary reads for a
    // 15 TiB device), the same problems named, nothing left behind.
    let scratch = tempfile::tempdir().unwrap();
    let spilled = ftl::check::check_in_slices(&*dev, &*idx, 1, Some(scratch.path())).unwrap();
    assert_eq!(spilled.problems, whole.problems);
    assert_eq!(spilled.log_passes, 1, "one walk of the log");
    assert_eq!(spilled.spill_declined, None);
    assert_eq!(
        std::fs::read_dir(scratch.path()).unwrap().count(),
        0,
        "the spill is removed"
    );
    // A place it cannot make: the walks per slice, the same problems.
    let nowhere = scratch.path().join("file");
    std::fs::write(&nowhere, b"x").unwrap();
    let fallback = ftl::check::check_in_slices(&*dev, &*idx, 1, Some(&nowhere)).unwrap();
    assert_eq!(fallback.problems, whole.problems);
    assert_eq!(fallback.log_passes as u64, slices);
    assert!(
        fallback.spill_declined.is_some(),
        "says why it did not spill"
    );
}
