//! Behaviour of the I/O API and of format/open on the in-memory backends.

mod common;

use common::*;
use ftl::device::mem::MemDevice;
use ftl::device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
use ftl::index::mem::MemIndex;
use ftl::model::{block_for, Model};
use ftl::{Config, Error, FormatOptions, Ftl, StreamId};
use std::sync::Arc;

#[test]
fn write_read_trim_round_trip() {
    let (_d, _i, f) = mem_ftl(64 << 20, &FormatOptions::default());
    let mut m = Model::new();
    let data = m.write(10, 3);
    f.write(10, &data, false, S0).unwrap();
    for l in 8..14 {
        check_read(&f, &m, l, 1).unwrap();
    }
    let mut big = vec![0u8; 3 * 4096];
    f.read(10, &mut big).unwrap();
    assert_eq!(big, data);
    f.flush().unwrap();
    f.read(10, &mut big).unwrap();
    assert_eq!(big, data, "reads after the chunk reached the device");
    f.trim(11, 1).unwrap();
    m.trim(11, 1);
    for l in 10..13 {
        check_read(&f, &m, l, 1).unwrap();
    }
    assert_eq!(f.stats().mapped_blocks, 2);
}

#[test]
fn out_of_range_and_unaligned_are_errors() {
    let (_d, _i, f) = mem_ftl(64 << 20, &FormatOptions::default());
    let cap = f.capacity_blocks();
    let mut b = vec![0u8; 4096];
    assert!(matches!(f.read(cap, &mut b), Err(Error::OutOfRange { .. })));
    assert!(matches!(
        f.write(cap - 1, &[0u8; 8192], false, S0),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(f.trim(u64::MAX, 2), Err(Error::OutOfRange { .. })));
    assert!(matches!(
        f.write(0, &[0u8; 100], false, S0),
        Err(Error::Unaligned(_))
    ));
    assert!(matches!(
        f.write(0, &b, false, StreamId(200)),
        Err(Error::InvalidParameters(_))
    ));
    assert_eq!(
        Error::OutOfRange {
            lba: 0,
            end: 0,
            capacity: 0
        }
        .errno(),
        -libc_einval()
    );
    f.write(cap - 1, &b, false, S0).unwrap();
    f.read(cap - 1, &mut b).unwrap();
    // The block-at-a-time calls refuse a buffer short of a block (they panicked).
    let mut short = [0u8; 100];
    assert!(matches!(
        f.reread_block(cap - 1, &mut short),
        Err(Error::Unaligned(_))
    ));
    assert!(matches!(
        f.locate(cap - 1, &mut short),
        Err(Error::Unaligned(_))
    ));
    let entry = f.map_entry(cap - 1).unwrap();
    assert!(matches!(
        f.verify_block(cap - 1, entry, &short),
        Err(Error::Unaligned(_))
    ));
    f.flush().unwrap();
    assert!(matches!(
        f.reread_block(cap - 1, &mut short),
        Err(Error::Unaligned(_))
    ));
    assert!(matches!(
        f.verify_block(cap - 1, entry, &short),
        Err(Error::Unaligned(_))
    ));
}

fn libc_einval() -> i32 {
    22
}

#[test]
fn format_refuses_formatted_backing_without_force() {
    let (dev, idx) = formatted_64m();
    let e = ftl::format(&dev, &idx, &FormatOptions::default(), false).unwrap_err();
    assert!(matches!(e, Error::AlreadyFormatted(_)), "{e}");
    assert!(e.to_string().contains("--force"));
    ftl::format(&dev, &idx, &FormatOptions::default(), true).unwrap();
}

/// Only a blank backing is formatted without `force`: one holding other data at either
/// end (a file system's superblock, a partition table, a disk image: `add` of a mistyped
/// path formatted over it) is refused and left as it was, and so is a backing whose index
/// holds a checkpoint (another backing's map, or this one's with its superblocks lost).
#[test]
fn format_refuses_foreign_data_and_an_index_in_use_without_force() {
    for at in [4096u64, (64 << 20) - 4096] {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let sig = vec![0x53u8; 4096];
        dev.write_at(at, &sig).unwrap();
        let e = ftl::format(&dev, &MemIndex::new(), &FormatOptions::default(), false).unwrap_err();
        assert!(matches!(e, Error::ForeignData(..)), "{e}");
        assert!(e.to_string().contains("--force"), "{e}");
        let mut back = vec![0u8; 4096];
        dev.read_at(at, &mut back).unwrap();
        assert_eq!(back, sig, "the foreign data is left as it was");
        let mut head = vec![0u8; 4096];
        dev.read_at(0, &mut head).unwrap();
        assert!(head.iter().all(|&b| b == 0), "no superblock written");
        ftl::format(&dev, &MemIndex::new(), &FormatOptions::default(), true).unwrap();
    }

    // Backing A's index given for a blank backing B: refused once A was opened (a
    // format's own checkpoint, never opened, holds nothing: a format that failed after
    // its index commit left one, and it does not stand in the way).
    let a = Arc::new(MemDevice::new(64 << 20));
    let idx = Arc::new(MemIndex::new());
    ftl::format(&a, &idx, &FormatOptions::default(), false).unwrap();
    let b = Arc::new(MemDevice::new(64 << 20));
    ftl::format(&b, &idx, &FormatOptions::default(), false).unwrap();
    let sb = ftl::format(&a, &idx, &FormatOptions::default(), true).unwrap();
    let (f, _) = Ftl::open(a.clone(), idx.clone(), Config::default()).unwrap();
    f.close().unwrap();
    let b = Arc::new(MemDevice::new(64 << 20));
    let e = ftl::format(&b, &idx, &FormatOptions::default(), false).unwrap_err();
    assert!(matches!(e, Error::IndexInUse { .. }), "{e}");
    assert!(e.to_string().contains(&sb.uuid_string()), "{e}");
    assert!(
        e.to_string()
            .contains("ftlblk format --backing ... --force"),
        "{e}"
    );
    ftl::format(&b, &idx, &FormatOptions::default(), true).unwrap();
}

#[test]
fn too_small_backing_is_refused() {
    let dev = MemDevice::new(8 << 20);
    let e = ftl::format(&dev, &MemIndex::new(), &FormatOptions::default(), false).unwrap_err();
    assert!(matches!(e, Error::TooSmall(_)), "{e}");
}

#[test]
fn unformatted_backing_is_named() {
    let dev = MemDevice::new(64 << 20);
    let e = Ftl::open(dev, MemIndex::new(), Config::default())
        .err()
        .unwrap();
    assert!(matches!(e, Error::NotFormatted(..)), "{e}");
}

#[test]
fn one_damaged_superblock_copy_is_repaired_both_is_an_error() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let idx = Arc::new(MemIndex::new());
    let sb = ftl::format(&dev, &idx, &FormatOptions::default(), false).unwrap();
    let copy_b = sb.geometry.segment_bytes - 4096;
    dev.write_at(0, &[0xAB; 4096]).unwrap();
    let (f, report) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    drop(f);
    let (_, again) = ftl::read_superblock(&dev).unwrap();
    assert!(again.is_empty(), "copy A was rewritten");
    // Damage both copies (keep the magic so it is "corrupt", not "unformatted").
    for off in [0, copy_b] {
        let mut b = vec![0u8; 4096];
        dev.read_at(off, &mut b).unwrap();
        b[40] ^= 0xff;
        dev.write_at(off, &b).unwrap();
    }
    let e = Ftl::open(dev.clone(), idx.clone(), Config::default())
        .err()
        .unwrap();
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
}

/// Open rule 1: a backing whose block 0 another user took (an old copy B still in
/// segment 0) is refused by an index that is not its own, and nothing is written: block 0
/// keeps the other user's bytes. With its own index the open repairs copy A.
#[test]
fn a_refused_open_leaves_block_0_as_it_found_it() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let idx = Arc::new(MemIndex::new());
    let sb = ftl::format(&dev, &idx, &FormatOptions::default(), false).unwrap();
    let theirs = [0xABu8; 4096];
    dev.write_at(0, &theirs).unwrap();
    let other = Arc::new(MemIndex::new());
    let e = Ftl::open(dev.clone(), other, Config::default())
        .err()
        .unwrap();
    assert!(matches!(e, Error::IndexMismatch { .. }), "{e}");
    let mut b = vec![0u8; 4096];
    dev.read_at(0, &mut b).unwrap();
    assert!(b == theirs, "a refused open rewrote block 0");
    let (f, report) = Ftl::open(dev.clone(), idx, Config::default()).unwrap();
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    drop(f);
    dev.read_at(0, &mut b).unwrap();
    assert_eq!(
        &b[..],
        &sb.encode()[..],
        "copy A rewritten by the accepted open"
    );
}

/// Copy A lost after a re-format with larger segments: the copy B found is the new
/// format's, not the one the earlier format (smaller segments) left inside segment 0,
/// and copy A is repaired from it. The re-format clears the old copy, and the probe
/// takes the newest copy it finds.
#[test]
fn copy_a_lost_after_a_reformat_is_repaired_from_the_new_formats_copy() {
    let (dev, idx, _, new) = formatted_twice(64 << 20, 64 << 10, 128 << 10);
    dev.write_at(0, &[0u8; 4096]).unwrap();
    let (sb, warnings) = ftl::read_superblock(&dev).unwrap();
    assert_eq!(sb.uuid, new.uuid, "{warnings:?}");
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
    assert_eq!(f.superblock().uuid, new.uuid);
}

/// `sb` encoded with byte `at` set to `v` and its checksum made right again.
fn encoded_with(sb: &ftl::superblock::Superblock, at: usize, v: u8) -> Vec<u8> {
    let mut b = sb.encode();
    b[at] = v;
    let crc = crc32c::crc32c(&b[..4092]);
    b[4092..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// A copy B with a reserved flag set (a newer build's format cut short: it writes B
/// first) is refused, not "repaired" from the older copy A, which would undo the newer
/// format unknowingly; nothing is written.
#[test]
fn a_copy_with_unknown_flags_is_refused_not_repaired() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let idx = Arc::new(MemIndex::new());
    let sb = ftl::format(&dev, &idx, &FormatOptions::default(), false).unwrap();
    // A reserved flag set, the checksum made right.
    let b = encoded_with(&sb, 12, 1);
    let copy_b = sb.geometry.segment_bytes - 4096;
    dev.write_at(copy_b, &b).unwrap();
    let e = Ftl::open(dev.clone(), idx.clone(), Config::default())
        .err()
        .unwrap();
    assert!(
        matches!(e, Error::UnsupportedFeatures { flags: 1, .. }),
        "{e}"
    );
    let mut now = vec![0u8; 4096];
    dev.read_at(copy_b, &mut now).unwrap();
    assert!(now == b, "copy B was rewritten");
}

#[test]
fn unknown_version_and_shrunk_backing_are_named() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let idx = Arc::new(MemIndex::new());
    let sb = ftl::format(&dev, &idx, &FormatOptions::default(), false).unwrap();
    // A superblock claiming version 9 in both copies.
    let b = encoded_with(&sb, 8, 9);
    dev.write_at(0, &b).unwrap();
    dev.write_at(sb.geometry.segment_bytes - 4096, &b).unwrap();
    let e = Ftl::open(dev.clone(), idx.clone(), Config::default())
        .err()
        .unwrap();
    assert!(
        matches!(e, Error::UnsupportedVersion { found: 9, .. }),
        "{e}"
    );
    assert!(
        e.to_string().contains(&dev.describe()),
        "names the backing: {e}"
    );

    // Same image on a smaller device.
    let big = MemDevice::new(64 << 20);
    let sb = ftl::format(&big, &MemIndex::new(), &FormatOptions::default(), false).unwrap();
    let small = MemDevice::new(32 << 20);
    let mut blk = vec![0u8; 4096];
    big.read_at(0, &mut blk).unwrap();
    small.write_at(0, &blk).unwrap();
    let name = small.describe();
    let e = Ftl::open(small, MemIndex::new(), Config::default())
        .err()
        .unwrap();
    assert!(
        matches!(e, Error::Shrunk { .. }),
        "{e} (formatted {})",
        sb.geometry.backing_bytes
    );
    let msg = e.to_string();
    assert!(msg.contains(&name) && msg.contains("truncate -s"), "{msg}");
}

#[test]
fn index_of_another_backing_is_refused() {
    let d1 = Arc::new(MemDevice::new(64 << 20));
    let d2 = Arc::new(MemDevice::new(64 << 20));
    let i1 = Arc::new(MemIndex::new());
    let i2 = Arc::new(MemIndex::new());
    ftl::format(&d1, &i1, &FormatOptions::default(), false).unwrap();
    ftl::format(&d2, &i2, &FormatOptions::default(), false).unwrap();
    let e = Ftl::open(d1.clone(), i2.clone(), Config::default())
        .err()
        .unwrap();
    assert!(matches!(e, Error::IndexMismatch { .. }), "{e}");
    let e = Ftl::open(d1, Arc::new(MemIndex::new()), Config::default())
        .err()
        .unwrap();
    assert!(matches!(e, Error::IndexMismatch { .. }), "{e}");
}

#[test]
fn corrupt_index_record_is_an_error_not_a_panic() {
    let (dev, idx) = formatted_64m();
    idx.poke(ftl::index::Key::segment(3), vec![1, 2, 3]);
    let e = Ftl::open(dev, idx, Config::default()).err().unwrap();
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
}

#[test]
fn full_device_reports_no_space_and_keeps_data() {
    let (_d, _i, f) = mem_ftl(32 * (64 << 10), &tiny());
    let cap = f.capacity_blocks();
    let mut m = Model::new();
    // Fill with FUA writes of one block each: every write pads a flash page, so the log
    // runs out long before the exported capacity is written.
    let mut written = 0;
    let err = loop {
        let lba = written % cap;
        let data = block_for(lba, 1_000_000 + written);
        match f.write(lba, &data, true, S0) {
            Ok(()) => {
                m.write(lba, 1);
                m.fua_completed(lba, 1);
                written += 1;
            }
            Err(e) => break e,
        }
        assert!(written < 100 * cap, "never ran out of space");
    };
    assert!(matches!(err, Error::NoSpace), "{err}");
    assert_eq!(err.errno(), -28);
    // Nothing acknowledged was lost, and reads still work.
    let mut b = vec![0u8; 4096];
    for lba in 0..written.min(cap) {
        f.read(lba, &mut b).unwrap();
        assert!(matches!(ftl::model::observe(lba, &b), ftl::model::Observed::Tag(t) if t != 0));
    }
}

#[test]
fn whole_dead_segments_are_recycled_without_a_cleaner() {
    // Sequential overwrites kill whole segments: the device must keep running far past
    // its physical size without any cleaner.
    let (dev, _i, f) = mem_ftl(32 * (64 << 10), &tiny());
    let cap = f.capacity_blocks();
    let mut m = Model::new();
    for round in 0..8 {
        for lba in (0..cap).step_by(8) {
            let n = 8.min(cap - lba);
            let data = m.write(lba, n);
            f.write(lba, &data, false, S0)
                .unwrap_or_else(|e| panic!("round {round} lba {lba}: {e}"));
        }
    }
    for lba in 0..cap {
        check_read(&f, &m, lba, 1).unwrap();
    }
    let s = f.stats();
    assert!(s.counters.user_blocks_written >= 8 * cap);
    // Freed by free records between checkpoints, a segment that dies again before the
    // next one too (free rule 7), or by checkpoints.
    assert!(
        s.checkpoints > 1 || s.segments_freed_by_records > 0,
        "{} checkpoints, {} segments freed by records",
        s.checkpoints,
        s.segments_freed_by_records
    );
    // Those reused at once are overwritten whole, not discarded; those still free are
    // discarded once they waited (here: now), but for the reserve and one more (discard
    // rule 5): on this full device, as many as there are beyond those.
    let keep = f.gc_reserve_segments() + 1;
    let waiting = f.undiscarded_segments();
    let expected = if f.free_segments() > keep { waiting } else { 0 };
    assert_eq!(
        f.discard_waiting(true),
        expected,
        "free segments wait for their discard"
    );
    // Half the device trimmed: its segments die, are freed and discarded.
    let before = dev.discarded_bytes();
    f.trim(0, cap / 2).unwrap();
    f.checkpoint().unwrap();
    f.discard_waiting(true);
    assert!(f.free_segments() > keep);
    assert!(
        dev.discarded_bytes() > before,
        "freed segments were discarded"
    );
    assert!(f.stats().counters.discarded_bytes > 0);
}

#[test]
fn relocation_is_compare_and_swap() {
    let (_d, _i, f) = mem_ftl(64 << 20, &FormatOptions::default());
    let a = block_for(5, 1);
    f.write(5, &a, false, S0).unwrap();
    let e = f.map_entry(5).unwrap();
    assert!(
        f.relocate(5, e, &a, StreamId(7)).unwrap(),
        "moves while the map still points there"
    );
    assert_ne!(f.map_entry(5).unwrap(), e);
    // The user overwrote it meanwhile: a stale relocation must not resurrect old data.
    let b = block_for(5, 2);
    let e2 = f.map_entry(5).unwrap();
    f.write(5, &b, false, S0).unwrap();
    assert!(!f.relocate(5, e2, &a, StreamId(7)).unwrap());
    let mut r = vec![0u8; 4096];
    f.read(5, &mut r).unwrap();
    assert_eq!(r, b);
    assert!(
        f.relocate(5, f.map_entry(5).unwrap(), &a, StreamId(7))
            .is_err(),
        "data must match the entry's crc"
    );
}

/// `data` with its last 4 bytes set so that its crc32c is `target` (crc32c is affine
/// over GF(2): the effects of the 32 bits are solved for).
fn with_crc(mut data: Vec<u8>, target: u32) -> Vec<u8> {
    let n = data.len();
    data[n - 4..].fill(0);
    let base = crc32c::crc32c(&data);
    // Row i: the crc change of flipping bit i of the last 4 bytes, and that bit.
    let mut rows: Vec<(u32, u32)> = (0..32)
        .map(|i| {
            let mut d = data.clone();
            d[n - 4 + i / 8] ^= 1 << (i % 8);
            (crc32c::crc32c(&d) ^ base, 1u32 << i)
        })
        .collect();
    // Gaussian elimination over the crc bits.
    let mut basis: Vec<(u32, u32)> = Vec::new();
    for bit in (0..32).rev() {
        if let Some(p) = rows.iter().position(|r| r.0 >> bit & 1 == 1) {
            let pivot = rows.swap_remove(p);
            for r in rows.iter_mut().chain(basis.iter_mut()) {
                if r.0 >> bit & 1 == 1 {
                    *r = (r.0 ^ pivot.0, r.1 ^ pivot.1);
                }
            }
            basis.push(pivot);
        }
    }
    let (mut want, mut flips) = (base ^ target, 0u32);
    for &(d, m) in &basis {
        let top = 31 - d.leading_zeros();
        if want >> top & 1 == 1 {
            want ^= d;
            flips ^= m;
        }
    }
    assert_eq!(want, 0, "the 32 bits span every crc change");
    data[n - 4..].copy_from_slice(&flips.to_le_bytes());
    assert_eq!(crc32c::crc32c(&data), target);
    data
}

/// A relocation against the unmapped entry moves nothing: the compare-and-swap would map
/// a trimmed block, even to data whose checksum is the unmapped entry's (which skipped
/// the data check). Found by review (2026-11-29; no caller passes one).
#[test]
fn a_relocation_never_maps_an_unmapped_block() {
    let (_d, _i, f) = mem_ftl(64 << 20, &FormatOptions::default());
    f.write(5, &block_for(5, 1), false, S0).unwrap();
    f.trim(5, 1).unwrap();
    let forged = with_crc(block_for(5, 2), ftl::MapEntry::UNMAPPED.crc());
    assert!(!f
        .relocate(5, ftl::MapEntry::UNMAPPED, &forged, StreamId(7))
        .unwrap());
    let mut r = vec![0u8; 4096];
    f.read(5, &mut r).unwrap();
    assert_eq!(r, vec![0u8; 4096], "a trimmed block came back");
}

#[test]
fn flush_pads_partial_pages_and_counts_it() {
    let (_d, _i, f) = mem_ftl(64 << 20, &FormatOptions::default());
    let before = f.stats().counters.padding_bytes;
    f.write(0, &block_for(0, 1), false, S0).unwrap();
    f.flush().unwrap();
    let s = f.stats();
    // summary + 1 data block padded to a 16 KiB page = 2 blocks of padding.
    assert_eq!(s.counters.padding_bytes - before, 2 * 4096);
    f.flush().unwrap();
    assert_eq!(
        f.stats().counters.padding_bytes - before,
        2 * 4096,
        "an idle flush writes nothing"
    );
}

#[test]
fn concurrent_writers_flushes_trims_and_checkpoints_do_not_deadlock() {
    // Many rounds of every operation that takes stream locks, at once. The device is
    // large enough that the log never fills (no cleaner in this test).
    let (_d, _i, f) = mem_ftl(1 << 30, &FormatOptions::default());
    let f = Arc::new(f);
    let threads: Vec<_> = (0..6u64)
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || {
                for i in 0..2000u64 {
                    let lba = (t * 7919 + i * 13) % 4000;
                    match (t + i) % 7 {
                        0 => f.flush().unwrap(),
                        1 if t == 0 => {
                            f.checkpoint().unwrap();
                        }
                        2 => f.trim(lba, 3).unwrap(),
                        3 => f
                            .write(lba, &block_for(lba, i + 1), true, StreamId((i % 4) as u8))
                            .unwrap(),
                        _ => f
                            .write(lba, &block_for(lba, i + 1), false, StreamId((i % 4) as u8))
                            .unwrap(),
                    }
                }
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    for t in threads {
        while !t.is_finished() {
            assert!(
                std::time::Instant::now() < deadline,
                "deadlock: threads did not finish in 120 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        t.join().unwrap();
    }
}

#[test]
fn concurrent_writers_and_flushes() {
    let (_d, _i, f) = mem_ftl(64 << 20, &FormatOptions::default());
    let f = Arc::new(f);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || {
                for i in 0..500u64 {
                    let lba = t * 1000 + i;
                    f.write(
                        lba,
                        &block_for(lba, 1 + i),
                        i % 50 == 0,
                        StreamId((t % 3) as u8),
                    )
                    .unwrap();
                    if i % 97 == 0 {
                        f.flush().unwrap();
                    }
                    if i % 211 == 0 {
                        f.checkpoint().unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut b = vec![0u8; 4096];
    for t in 0..4u64 {
        for i in 0..500u64 {
            let lba = t * 1000 + i;
            f.read(lba, &mut b).unwrap();
            assert_eq!(b, block_for(lba, 1 + i), "lba {lba}");
        }
    }
}

/// Bug 3 of issue 14: a full chunk (summary + 251 data blocks) padded to a 32 KiB page
/// ran past its staging slot and panicked inside `seal`. Pages up to 1 MiB work.
#[test]
fn large_flash_pages_pad_full_chunks() {
    for page in [32u32 << 10, 64 << 10, 1 << 20] {
        let seg = (4 * page as u64).max(1 << 20);
        let opts = FormatOptions {
            segment_bytes: Some(seg),
            flash_page_bytes: Some(page),
            ..Default::default()
        };
        let (dev, idx, f) = mem_ftl(20 * seg, &opts);
        let mut m = Model::new();
        for i in 0..600u64 {
            let d = m.write(i, 1);
            f.write(i, &d, i % 97 == 0, S0).unwrap();
            if i % 150 == 149 {
                f.flush().unwrap();
            }
        }
        f.flush().unwrap();
        for l in 0..600 {
            check_read(&f, &m, l, 1).unwrap_or_else(|e| panic!("page {page}: {e}"));
        }
        f.close().unwrap();
        drop(f);
        let (f, _) = Ftl::open(dev, idx, Config::default()).unwrap();
        for l in 0..600 {
            check_read(&f, &m, l, 1).unwrap_or_else(|e| panic!("page {page} reopened: {e}"));
        }
    }
}

#[test]
fn flash_pages_above_one_mebibyte_are_refused_at_format_and_open() {
    let opts = FormatOptions {
        segment_bytes: Some(8 << 20),
        flash_page_bytes: Some(2 << 20),
        ..Default::default()
    };
    let dev = Arc::new(MemDevice::new(32 * (8 << 20)));
    let idx = Arc::new(MemIndex::new());
    match ftl::format(&dev, &idx, &opts, false) {
        Err(Error::InvalidParameters(why)) => assert!(why.contains("at most 1048576"), "{why}"),
        other => panic!("a 2 MiB page was accepted: {other:?}"),
    }
    // A backing an older build formatted with such a page: a clear error at open.
    let ok = FormatOptions {
        flash_page_bytes: Some(1 << 20),
        ..opts
    };
    let sb = ftl::format(&dev, &idx, &ok, false).unwrap();
    let mut old = sb.clone();
    old.geometry.flash_page_bytes = 2 << 20;
    for off in [
        0,
        ftl::Geometry::superblock_offset(1, sb.geometry.segment_bytes),
    ] {
        dev.write_at(off, &old.encode()).unwrap();
    }
    match Ftl::open(dev.clone(), idx.clone(), Config::default()) {
        Err(Error::InvalidParameters(why)) => {
            assert!(why.contains("flash page of 2097152 bytes"), "{why}")
        }
        Err(e) => panic!("unclear error: {e}"),
        Ok(_) => panic!("opened a backing whose chunks do not fit the staging slots"),
    }
}

/// Map cache rule 3's limit: while a checkpoint is stuck (its map pages' commit held),
/// a writer stops once half the cache is dirty instead of going on dirtying pages, which
/// cannot be evicted (the cache grew without bound while a slow checkpoint ran).
#[test]
fn writers_wait_at_the_map_cache_limit_while_a_checkpoint_runs() {
    let (dev, idx) = formatted_64m();
    let cfg = Config {
        map_cache_bytes: 8 * ftl::map::PAGE_RAM_BYTES,
        ..Config::default()
    };
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), cfg).unwrap();
    let f = Arc::new(f);
    f.write(0, &block_for(0, 1), false, S0).unwrap();
    idx.hold_commits_with(ftl::index::Key::MAP_PAGE);
    let ck = {
        let f = f.clone();
        std::thread::spawn(move || f.checkpoint())
    };
    assert!(idx.wait_commit_held(std::time::Duration::from_secs(10)));
    let cap = f.capacity_blocks();
    let writer = {
        let f = f.clone();
        std::thread::spawn(move || {
            // Every page of the map, again and again.
            for i in 0..4000u64 {
                let lba = (i * 512 + i / 64) % cap;
                f.write(lba, &block_for(lba, 2), false, S0).unwrap();
            }
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    let s = f.stats().map_cache;
    let stopped = !writer.is_finished();
    idx.release_commits();
    ck.join().unwrap().unwrap();
    writer.join().unwrap();
    assert!(
        stopped,
        "the writer went on while the checkpoint was stuck: {s:?}"
    );
    assert!(s.dirty_pages <= 4 + 1, "{s:?}");
}

/// Map cache rule 3's back-pressure: with a cache of 2 pages of a 64 MiB device's 32
/// and no background checkpoints, writers spread over the whole map checkpoint
/// themselves, so the dirty pages (which cannot be evicted) stay near the bound; every
/// block reads back through the misses, and after a reopen.
#[test]
fn a_small_map_cache_stays_bounded_under_writes_and_reads_back_everything() {
    let (dev, idx) = formatted_64m();
    let cfg = Config {
        map_cache_bytes: 0,
        checkpoint_page_batch: 3,
        ..Config::default()
    };
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), cfg.clone()).unwrap();
    let cap = f.capacity_blocks();
    let mut m = Model::new();
    let mut x = 99u64;
    for _ in 0..4000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let lba = (x >> 20) % cap;
        f.write(lba, &m.write(lba, 1), false, S0).unwrap();
        let s = f.stats().map_cache;
        assert!(s.dirty_pages <= 3 + 1, "{s:?}");
        if lba.is_multiple_of(7) {
            f.trim(lba, 1).unwrap();
            m.trim(lba, 1);
        }
    }
    let s = f.stats();
    assert!(
        s.checkpoints > 10,
        "writers checkpointed: {}",
        s.checkpoints
    );
    assert!(
        s.map_cache.evictions > 100 && s.map_cache.cached_pages <= 4,
        "{:?}",
        s.map_cache
    );
    for l in 0..cap {
        check_read(&f, &m, l, 1).unwrap();
    }
    f.close().unwrap();
    drop(f);
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), cfg).unwrap();
    for l in 0..cap {
        check_read(&f, &m, l, 1).unwrap();
    }
    let r = ftl::check::check(&*dev, &*idx, true).unwrap();
    assert!(r.clean(), "{:#?}", r.problems);
}

/// Fragmentation as reads see it: one backing read per span of a window's blocks on the
/// backing; an overwrite in the middle of a sequential run adds one read (its new place),
/// the old run is still read whole, over the stale copy.
#[test]
fn fragmentation_counts_the_backing_reads_of_each_window() {
    let (_, _, f) = mem_ftl(64 << 20, &ftl::FormatOptions::default());
    let data: Vec<u8> = (0..64u64).flat_map(|l| block_for(l, 1)).collect();
    f.write(0, &data, false, S0).unwrap();
    f.flush().unwrap();
    let fr = f.fragmentation(0, 64, 32).unwrap();
    assert_eq!(
        (fr.windows, fr.reads, fr.mapped_blocks),
        (2, 2, 64),
        "{fr:?}"
    );
    f.write(5, &block_for(5, 2), false, S0).unwrap();
    f.flush().unwrap();
    let fr = f.fragmentation(0, 64, 32).unwrap();
    assert_eq!((fr.windows, fr.reads), (2, 3), "{fr:?}");
    assert_eq!(fr.mean_run_blocks(), 64.0 / 3.0);
    assert_eq!(fr.reads_per_window(), 1.5);
    // Five overwrites in a row of the old run: a gap past `READ_SPAN_GAP_BLOCKS` splits
    // it; the five new blocks follow each other (one more read).
    let five: Vec<u8> = (40..45u64).flat_map(|l| block_for(l, 2)).collect();
    f.write(40, &five, false, S0).unwrap();
    f.flush().unwrap();
    let fr = f.fragmentation(32, 32, 32).unwrap();
    assert_eq!((fr.windows, fr.reads), (1, 3), "{fr:?}");
    let mut back = vec![0u8; 64 * BLOCK_SIZE];
    f.read(0, &mut back).unwrap();
    for l in 0..64u64 {
        let gen = if l == 5 || (40..45).contains(&l) {
            2
        } else {
            1
        };
        assert!(
            back[l as usize * BLOCK_SIZE..][..BLOCK_SIZE] == block_for(l, gen)[..],
            "block {l} reads back wrong"
        );
    }
    assert_eq!(
        f.fragmentation(100, 32, 32).unwrap().windows,
        0,
        "nothing mapped"
    );
}

/// The ublk edge's READ fills the map cache off its queue thread: with a cache smaller
/// than the map, [`Ftl::map_misses`] names a range whose page is not cached, and after
/// [`Ftl::prefetch_map`] it is cached and the read of it counts no miss (no index read).
/// A prefetch past the end is refused. With the whole map in memory, pages miss after an
/// open until first read.
#[test]
fn a_prefetched_map_range_is_read_without_an_index_read() {
    let (dev, idx) = formatted_64m();
    let cfg = Config {
        map_cache_bytes: 0,
        ..Config::default()
    };
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), cfg).unwrap();
    let cap = f.capacity_blocks();
    let mut m = Model::new();
    for lba in (0..cap).step_by(64) {
        f.write(lba, &m.write(lba, 1), false, S0).unwrap();
    }
    // Writers checkpoint themselves past one dirty page (map cache rule 3), so only a
    // few of the 32 pages stay cached.
    f.checkpoint().unwrap();
    let lba = (0..cap)
        .step_by(64)
        .find(|&l| f.map_misses(l, 1))
        .expect("some page of the map is not cached");
    f.prefetch_map(lba, 1).unwrap();
    assert!(!f.map_misses(lba, 1), "the prefetched page is cached");
    let before = f.stats().map_cache.misses;
    check_read(&f, &m, lba, 1).unwrap();
    assert_eq!(
        f.stats().map_cache.misses,
        before,
        "the read missed the map cache"
    );
    assert!(matches!(
        f.prefetch_map(cap, 1),
        Err(Error::OutOfRange { .. })
    ));
    f.close().unwrap();
    drop(f);
    // A cache that holds the whole map starts empty after an open too: its pages miss
    // until read (it said "cached" for all of them, and the ublk edge read the index on
    // its queue thread), and once read they stay.
    let (f, _) = Ftl::open(dev, idx, Config::default()).unwrap();
    assert!((0..cap).step_by(64).all(|l| f.map_misses(l, 1)));
    f.prefetch_map(0, cap).unwrap();
    assert!((0..cap).step_by(64).all(|l| !f.map_misses(l, 1)));
    let before = f.stats().map_cache.misses;
    check_read(&f, &m, lba, 1).unwrap();
    assert_eq!(f.stats().map_cache.misses, before);
}

/// A 64 MiB memory device and index, formatted with the default options (32 map pages).
fn formatted_64m() -> (Arc<MemDevice>, Arc<MemIndex>) {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let idx = Arc::new(MemIndex::new());
    ftl::format(&dev, &idx, &FormatOptions::default(), false).unwrap();
    (dev, idx)
}

/// An index whose single-record reads (the map's misses) wait while the gate is shut.
struct GatedIndex {
    inner: Arc<MemIndex>,
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    shut: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
    waiting: std::sync::atomic::AtomicU64,
}

struct GatedReader {
    inner: Arc<dyn ftl::index::IndexReader>,
    gate: Arc<Gate>,
}

impl ftl::index::IndexReader for GatedReader {
    fn get(&self, key: &[u8]) -> ftl::Result<Option<Vec<u8>>> {
        let mut shut = self.gate.shut.lock().unwrap();
        if *shut {
            self.gate
                .waiting
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            while *shut {
                shut = self.gate.cv.wait(shut).unwrap();
            }
        }
        drop(shut);
        self.inner.get(key)
    }
}

impl ftl::IndexStore for GatedIndex {
    fn load(&self) -> ftl::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.load()
    }
    fn load_kind(&self, kind: u8) -> ftl::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.load_kind(kind)
    }
    fn commit(&self, ops: Vec<ftl::index::Op>) -> ftl::Result<()> {
        self.inner.commit(ops)
    }
    fn clear(&self) -> ftl::Result<()> {
        self.inner.clear()
    }
    fn reader(&self) -> Arc<dyn ftl::index::IndexReader> {
        Arc::new(GatedReader {
            inner: self.inner.reader(),
            gate: self.gate.clone(),
        })
    }
}

/// A writer whose map page is not read yet reads it before it takes its stream's lock,
/// with the whole map in memory too (pages are read on first use after an open): a
/// slow index read holds no other writer of the stream. Without it (the prefetch only
/// with a cache smaller than the map), the page was read inside the append with the
/// stream locked, and the second write below waited for the index (found by review,
/// 2026-11-29).
#[test]
fn a_writer_reads_its_map_page_before_it_locks_its_stream() {
    let (dev, idx) = formatted_64m();
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
    let far = 10 * 512; // another map page than block 0's
    f.write(0, &block_for(0, 1), false, S0).unwrap();
    f.write(far, &block_for(far, 1), false, S0).unwrap();
    f.close().unwrap();
    drop(f);
    let gate = Arc::new(Gate::default());
    let gated = Arc::new(GatedIndex {
        inner: idx,
        gate: gate.clone(),
    });
    let (f, _) = Ftl::open(dev, gated, Config::default()).unwrap();
    let f = Arc::new(f);
    let mut b = vec![0u8; BLOCK_SIZE];
    f.read(0, &mut b).unwrap(); // block 0's page read
    *gate.shut.lock().unwrap() = true;
    let slow = {
        let f = f.clone();
        std::thread::spawn(move || f.write(far, &block_for(far, 2), false, S0))
    };
    let t = std::time::Instant::now();
    while gate.waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "no index read"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let fast = {
        let f = f.clone();
        std::thread::spawn(move || {
            let r = f.write(0, &block_for(0, 2), false, S0);
            let _ = tx.send(());
            r
        })
    };
    let passed = rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok();
    *gate.shut.lock().unwrap() = false;
    gate.cv.notify_all();
    slow.join().unwrap().unwrap();
    fast.join().unwrap().unwrap();
    assert!(
        passed,
        "a write to a cached page waited for another writer's index read"
    );
    f.read(far, &mut b).unwrap();
    assert_eq!(b, block_for(far, 2));
}

/// A device of `bytes` formatted with segments of `first` bytes, then again (forced)
/// with `second`: the device, its index, and the two formats' superblocks.
fn formatted_twice(
    bytes: u64,
    first: u64,
    second: u64,
) -> (
    Arc<MemDevice>,
    Arc<MemIndex>,
    ftl::superblock::Superblock,
    ftl::superblock::Superblock,
) {
    let dev = Arc::new(MemDevice::new(bytes));
    let idx = Arc::new(MemIndex::new());
    let opts = |seg: u64| FormatOptions {
        segment_bytes: Some(seg),
        ..FormatOptions::default()
    };
    let old = ftl::format(&dev, &idx, &opts(first), false).unwrap();
    let new = ftl::format(&dev, &idx, &opts(second), true).unwrap();
    assert_ne!(old.uuid, new.uuid);
    (dev, idx, old, new)
}

/// Copy A as the earlier format `old` left it, a second earlier than format `new`: a
/// format cut short between its copy B and its copy A.
fn earlier_copy_a(
    dev: &MemDevice,
    old: &ftl::superblock::Superblock,
    new: &ftl::superblock::Superblock,
) {
    let mut a = old.clone();
    a.created_secs = new.created_secs - 10;
    dev.write_at(0, &a.encode()).unwrap();
}

/// `sb` encoded as version 2 (a version this build does not know), its checksum whole.
fn of_version_2(sb: &ftl::superblock::Superblock) -> Vec<u8> {
    use ftl::superblock::offsets as o;
    let mut b = sb.encode();
    b[o::VERSION..o::VERSION + 4].copy_from_slice(&2u32.to_le_bytes());
    let crc = crc32c::crc32c(&b[..o::CRC]);
    b[o::CRC..o::CRC + 4].copy_from_slice(&crc.to_le_bytes());
    b
}

/// A format cut short between its two superblock writes (copy B first, the index already
/// reset to it) leaves copy A of the earlier format: the newer copy wins and A is
/// completed from it. A won before: B was rewritten to the old format, and the open
/// failed on the index the format had reset.
#[test]
fn a_format_cut_short_between_its_superblock_copies_completes_from_the_newer() {
    let (dev, idx, old, new) = formatted_twice(32 << 20, 1 << 20, 1 << 20);
    earlier_copy_a(&dev, &old, &new);
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), Config::default())
        .expect("the newer copy's format opens");
    assert_eq!(f.superblock().uuid, new.uuid);
    let mut b = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(0, &mut b).unwrap();
    assert_eq!(
        ftl::superblock::Superblock::decode(&b).unwrap().uuid,
        new.uuid
    );
}

/// A copy A of a newer superblock version is not damage: an older build refuses it,
/// and does not rewrite it from copy B.
#[test]
fn a_newer_superblock_version_is_refused_not_repaired() {
    let dev = Arc::new(MemDevice::new(32 * (1 << 20)));
    let idx = Arc::new(MemIndex::new());
    let opts = FormatOptions {
        segment_bytes: Some(1 << 20),
        ..Default::default()
    };
    let sb = ftl::format(&dev, &idx, &opts, false).unwrap();
    let a = of_version_2(&sb);
    dev.write_at(0, &a).unwrap();
    match Ftl::open(dev.clone(), idx.clone(), Config::default()) {
        Err(Error::UnsupportedVersion { found: 2, .. }) => {}
        Err(e) => panic!("unclear error: {e}"),
        Ok(_) => panic!("a newer version was opened (and copy A rewritten)"),
    }
    let mut b = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(0, &mut b).unwrap();
    assert_eq!(&b[..], &a[..], "copy A was rewritten");
}

/// A format of part of a device (`--size`) writes nothing past that part: clearing old
/// superblock copies of other segment sizes zeroed blocks beyond it.
#[test]
fn a_format_of_part_of_a_device_writes_nothing_past_it() {
    let dev = Arc::new(ftl::device::sparse::SparseDevice::new(2 << 30));
    let idx = Arc::new(MemIndex::new());
    let marks: Vec<u64> = [512u64 << 20, 1 << 30]
        .iter()
        .map(|&o| o - BLOCK_SIZE as u64)
        .collect();
    for &m in &marks {
        dev.write_at(m, &[0x5a; BLOCK_SIZE]).unwrap();
    }
    let opts = FormatOptions {
        size_bytes: Some(256 << 20),
        ..Default::default()
    };
    ftl::format(&dev, &idx, &opts, false).unwrap();
    let mut b = AlignedBuf::new(BLOCK_SIZE);
    for &m in &marks {
        dev.read_at(m, &mut b).unwrap();
        assert!(
            b.iter().all(|&x| x == 0x5a),
            "format wrote at {m}, past its 256 MiB"
        );
    }
}

/// The same with a format of another segment size: its copy B is elsewhere (and the
/// one at the old size's place cleared), and it is still the newer copy that wins.
#[test]
fn a_reformat_of_another_segment_size_cut_short_completes_from_its_copy() {
    let (dev, idx, old, new) = formatted_twice(64 << 20, 1 << 20, 2 << 20);
    earlier_copy_a(&dev, &old, &new);
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), Config::default())
        .expect("the newer copy's format opens");
    assert_eq!(f.superblock().uuid, new.uuid);
    assert_eq!(f.geometry().segment_bytes, 2 << 20);
    // A copy B of a newer version where A's does not match: refused, A left alone.
    drop(f);
    let b = of_version_2(&new);
    dev.write_at(ftl::Geometry::superblock_offset(1, 2 << 20), &b)
        .unwrap();
    match Ftl::open(dev.clone(), idx.clone(), Config::default()) {
        Err(Error::UnsupportedVersion { found: 2, .. }) => {}
        Err(e) => panic!("unclear error: {e}"),
        Ok(_) => panic!("copy B of a newer version was repaired over"),
    }
}

/// With copy A whole and copy B at its place damaged (a magic, a bad checksum), B is
/// repaired from A: the places of larger segment sizes lie in A's log, where user data
/// may look like a newer superblock, and are not probed then.
#[test]
fn a_damaged_copy_b_is_repaired_from_a_not_from_a_lookalike_in_the_log() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let idx = Arc::new(MemIndex::new());
    let opts = FormatOptions {
        segment_bytes: Some(1 << 20),
        ..FormatOptions::default()
    };
    let sb = ftl::format(&dev, &idx, &opts, false).unwrap();
    // A superblock-looking block in the log, at the copy-B place of 2 MiB segments.
    let big = FormatOptions {
        segment_bytes: Some(2 << 20),
        ..FormatOptions::default()
    };
    let fake = ftl::superblock::Superblock {
        uuid: [9; 16],
        geometry: ftl::Geometry::resolve(64 << 20, &big).unwrap(),
        created_secs: sb.created_secs + 100,
    };
    dev.write_at(ftl::Geometry::superblock_offset(1, 2 << 20), &fake.encode())
        .unwrap();
    // Copy B at A's place damaged after its magic.
    let b_at = ftl::Geometry::superblock_offset(1, 1 << 20);
    let mut b = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(b_at, &mut b).unwrap();
    b[100] ^= 0xff;
    dev.write_at(b_at, &b).unwrap();
    let (f, rep) = Ftl::open(dev.clone(), idx.clone(), Config::default()).expect("opens");
    assert_eq!(f.superblock().uuid, sb.uuid);
    assert!(
        rep.warnings.iter().any(|w| w.contains("copy B")),
        "{:?}",
        rep.warnings
    );
    dev.read_at(b_at, &mut b).unwrap();
    assert_eq!(
        ftl::superblock::Superblock::decode(&b).unwrap().uuid,
        sb.uuid
    );
}
