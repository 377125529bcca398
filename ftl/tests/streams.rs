//! Streams and the cleaner's reserve: user writes never take the reserved segments,
//! relocations may (into any stream) except the last free segment, which only the GC
//! stream takes; closing a stream gives its open segment up and loses nothing.

mod common;

use common::*;
use ftl::model::Model;
use ftl::{Config, Ftl, StreamId, GC_STREAM};

fn block(lba: u64, v: u8) -> Vec<u8> {
    let mut b = vec![v; 4096];
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b
}

fn stream_of_block<D: ftl::BlockDevice, I: ftl::IndexStore>(f: &Ftl<D, I>, lba: u64) -> u8 {
    let pba = f.map_entry(lba).unwrap().pba().unwrap() as u64;
    let seg = (pba / f.geometry().blocks_per_segment() as u64) as u32;
    f.segment_snapshot()
        .iter()
        .find(|s| s.segment == seg)
        .unwrap()
        .stream
}

#[test]
fn the_reserve_is_the_gc_streams_alone() {
    let (_d, _i, f) = mem_ftl(32 * (64 << 10), &tiny());
    let cap = f.capacity_blocks();
    let reserve = f.gc_reserve_segments();
    assert!(reserve >= 1);
    // Random overwrites without a cleaner: segments stay partly live, space runs out.
    let mut data = std::collections::HashMap::new();
    let (mut i, mut x) = (0u64, 0x9e37_79b9_7f4a_7c15u64);
    let full = loop {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let lba = x % cap;
        let v = (i % 251) as u8;
        match f.write(lba, &block(lba, v), false, StreamId(1)) {
            Ok(()) => {
                data.insert(lba, v);
            }
            Err(ftl::Error::NoSpace) => break i,
            Err(e) => panic!("write {i}: {e}"),
        }
        i += 1;
        assert!(i < 100 * cap, "never ran out of space");
    };
    assert!(full > cap);
    assert_eq!(
        f.free_segments(),
        reserve,
        "user writes stop at the reserve"
    );
    // Whatever the stream: GC_STREAM is no way into the reserve for user data.
    assert!(matches!(
        f.write(0, &block(0, 1), false, GC_STREAM),
        Err(ftl::Error::NoSpace)
    ));
    // Relocations into other streams do not take the reserve either: they go to the GC
    // stream, the only one that spends it (one stream, one victim at a time).
    let live: Vec<u64> = data.keys().copied().take(3).collect();
    let relocate = |lba: u64, s: StreamId| {
        let e = f.map_entry(lba).unwrap();
        assert!(f.relocate(lba, e, &block(lba, data[&lba]), s).unwrap());
    };
    relocate(live[0], StreamId(2));
    assert_eq!(f.relocations_diverted(), 1);
    assert_eq!(stream_of_block(&f, live[0]), GC_STREAM.0);
    assert_eq!(
        f.free_segments(),
        reserve - 1,
        "the GC stream opened a segment"
    );
    relocate(live[1], StreamId(5));
    assert_eq!(f.relocations_diverted(), 2);
    assert_eq!(stream_of_block(&f, live[1]), GC_STREAM.0);
    relocate(live[2], GC_STREAM);
    assert_eq!(f.relocations_diverted(), 2);
    assert_eq!(
        f.free_segments(),
        reserve - 1,
        "the GC stream's segment had room"
    );
    // Closing streams while free space is at the reserve gives nothing up.
    f.close_stream(GC_STREAM).unwrap();
    assert_eq!(stream_of_block(&f, live[2]), GC_STREAM.0);
    relocate(live[0], GC_STREAM);
    assert_eq!(
        f.free_segments(),
        reserve - 1,
        "the GC stream kept its open segment"
    );
    let mut r = vec![0u8; 4096];
    for (&lba, &v) in &data {
        f.read(lba, &mut r).unwrap();
        assert_eq!(r, block(lba, v), "lba {lba}");
    }
}

#[test]
fn closing_a_stream_gives_its_segment_up_and_loses_nothing() {
    let (dev, idx, f) = tiny_crash();
    let mut m = Model::new();
    let d = m.write(0, 3);
    f.write(0, &d, false, StreamId(2)).unwrap();
    f.flush().unwrap();
    m.flush();
    let seg_of = |f: &CrashFtl, lba: u64| {
        f.map_entry(lba).unwrap().pba().unwrap() / f.geometry().blocks_per_segment()
    };
    let first = seg_of(&f, 0);
    let state = |f: &CrashFtl, seg: u32| {
        f.segment_snapshot()
            .into_iter()
            .find(|s| s.segment == seg)
            .unwrap()
            .state
    };
    assert_eq!(state(&f, first), "open");
    f.close_stream(StreamId(2)).unwrap();
    assert_eq!(state(&f, first), "closed");
    f.close_stream(StreamId(2)).unwrap(); // nothing open: a no-op
    assert!(f.close_stream(StreamId(200)).is_err());
    // Unflushed writes in an open chunk are sealed and written by the close.
    let d = m.write(10, 2);
    f.write(10, &d, false, StreamId(2)).unwrap();
    let second = seg_of(&f, 10);
    assert_ne!(second, first, "the next write opens a new segment");
    f.close_stream(StreamId(2)).unwrap();
    let d = m.write(20, 2);
    f.write(20, &d, false, StreamId(2)).unwrap();
    assert_ne!(seg_of(&f, 20), second);
    f.flush().unwrap();
    m.flush();
    for lba in 0..30 {
        check_read(&f, &m, lba, 1).unwrap();
    }
    // Recovery finds every flushed chunk after the closes.
    drop(f);
    for seed in 0..8 {
        dev.crash(seed).unwrap();
        let report = ftl::check::check(&*dev, &*idx, true).unwrap();
        assert!(report.clean(), "{:?}", report.problems);
        let (f2, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
        let mut mm = m.clone();
        check_after_crash(&f2, &mut mm).unwrap();
    }
}
