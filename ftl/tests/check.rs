//! The offline checker finds each kind of damage, and passes healthy devices.

mod common;

use common::*;
use ftl::check::check;
use ftl::model::block_for;
use ftl::{BlockDevice, IndexStore, StreamId};

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
    let key = ftl::index::Key::segment(1);
    let rec = idx
        .load()
        .unwrap()
        .into_iter()
        .find(|(k, _)| *k == key)
        .unwrap()
        .1;
    let mut r1 = ftl::records::SegmentRecord::decode(&rec).unwrap();
    r1.valid += 3;
    idx.poke(key, r1.encode());
    let r = check(&*dev, &*idx, false).unwrap();
    assert!(
        r.problems.iter().any(|p| p.check == "segment live counts"),
        "{:#?}",
        r.problems
    );
    // A corrupt record is an error naming it.
    idx.poke(ftl::index::Key::map_page(0), vec![0; 10]);
    assert!(check(&*dev, &*idx, false).is_err());
}
