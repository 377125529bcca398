//! Read-driven defragmentation (`frag.rs`, `engine/defrag.rs`): large reads of a range
//! that random overwrites scattered queue it, `Ftl::defrag_step` rewrites it contiguously
//! by compare-and-swap relocations, and nothing is lost: a block written after the read
//! keeps its new data, and every block reads back what was last written, before and
//! after a reopen.

use ftl::device::mem::MemDevice;
use ftl::device::BLOCK_SIZE;
use ftl::frag::FragLevel;
use ftl::index::mem::MemIndex;
use ftl::{Config, FormatOptions, Ftl, StreamId};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

type MemFtl = Ftl<Arc<MemDevice>, Arc<MemIndex>>;

const REGION: u64 = 4096;
const WINDOW: u64 = 32;

fn block(lba: u64, generation: u64) -> Vec<u8> {
    let mut b = vec![(lba as u8) ^ (generation as u8); BLOCK_SIZE];
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b[8..16].copy_from_slice(&generation.to_le_bytes());
    b
}

/// A device with `REGION` blocks written in order, then a quarter overwritten at random;
/// returns the generation of every block.
fn scattered(cfg: Config) -> (Arc<MemDevice>, Arc<MemIndex>, MemFtl, Vec<u64>) {
    let (dev, idx) = (
        Arc::new(MemDevice::new(64 << 20)),
        Arc::new(MemIndex::new()),
    );
    ftl::format(&dev, &idx, &FormatOptions::default(), false).unwrap();
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), cfg).unwrap();
    let mut data = Vec::new();
    for l in 0..REGION {
        data.extend(block(l, 0));
    }
    f.write(0, &data, false, StreamId(1)).unwrap();
    let mut gens = vec![0u64; REGION as usize];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    for i in 0..REGION / 4 {
        let l = rng.gen_range(0..REGION);
        gens[l as usize] = i + 1;
        f.write(l, &block(l, i + 1), false, StreamId(2)).unwrap();
    }
    f.flush().unwrap();
    (dev, idx, f, gens)
}

fn read_region(f: &MemFtl, gens: &[u64]) {
    let mut b = vec![0u8; WINDOW as usize * BLOCK_SIZE];
    for w in (0..REGION).step_by(WINDOW as usize) {
        f.read(w, &mut b).unwrap();
        for (k, blk) in b.chunks(BLOCK_SIZE).enumerate() {
            let l = w + k as u64;
            assert!(
                blk == block(l, gens[l as usize]).as_slice(),
                "block {l} reads back wrong"
            );
        }
    }
}

#[test]
fn reads_of_a_scattered_range_get_it_rewritten_contiguously() {
    let (dev, idx, f, gens) = scattered(Config::default());
    let before = f.fragmentation(0, REGION, WINDOW).unwrap();
    assert!(before.reads_per_window() > 6.0, "{before:?}");
    read_region(&f, &gens);
    let fig = f.stats().fragmentation;
    assert_eq!(fig.large_reads, REGION / WINDOW);
    // About 7 of a window's 32 blocks were overwritten: the old run is one read (over
    // the stale copies), each overwritten block one more, a mean of ~4 blocks per read.
    assert!(fig.mean_run_blocks < 5.0, "{fig:?}");
    assert_ne!(fig.level, FragLevel::Low);
    assert!(f.defrag_waiting() > 0);
    let mut moved = 0;
    while f.defrag_waiting() > 0 {
        let r = f.defrag_step(8).unwrap();
        assert!(
            r.windows > 0,
            "free space is plentiful: the queue must drain"
        );
        moved += r.moved;
    }
    f.flush().unwrap();
    let after = f.fragmentation(0, REGION, WINDOW).unwrap();
    assert!(
        after.reads_per_window() < 1.5,
        "rewritten windows still take {:.2} reads each ({moved} blocks moved)",
        after.reads_per_window()
    );
    read_region(&f, &gens);
    // The moves are relocations: they count in the WAF and survive a reopen.
    assert!(f.stats().counters.relocated_blocks >= moved && moved > 0);
    f.close().unwrap();
    let (f, _) = Ftl::open(dev, idx, Config::default()).unwrap();
    read_region(&f, &gens);
}

#[test]
fn windows_past_the_queue_bound_are_read_again_and_rewritten() {
    let (_dev, _idx, f, gens) = scattered(Config {
        defrag_queue_bytes: 8 * WINDOW as usize * BLOCK_SIZE,
        ..Config::default()
    });
    read_region(&f, &gens);
    assert_eq!(
        f.defrag_waiting() as u64,
        REGION / WINDOW,
        "all queued, most as ranges"
    );
    while f.defrag_waiting() > 0 {
        f.defrag_step(8).unwrap();
    }
    let after = f.fragmentation(0, REGION, WINDOW).unwrap();
    assert!(after.reads_per_window() < 1.5, "{after:?}");
    read_region(&f, &gens);
}

/// A turn takes at most `max_windows` windows, those found contiguous again too: a turn
/// re-read every queued range on the runner's thread (found by review, 2026-11-29).
#[test]
fn a_turn_takes_at_most_its_windows_even_when_they_need_nothing() {
    let (_dev, _idx, f, mut gens) = scattered(Config {
        defrag_queue_bytes: 1,
        ..Config::default()
    });
    read_region(&f, &gens);
    let queued = f.defrag_waiting();
    assert_eq!(queued as u64, REGION / WINDOW, "all queued as ranges");
    // Rewritten in order since: every range reads as one run now.
    let mut data = Vec::new();
    for l in 0..REGION {
        gens[l as usize] += 1_000_000;
        data.extend(block(l, gens[l as usize]));
    }
    f.write(0, &data, false, StreamId(1)).unwrap();
    f.flush().unwrap();
    let r = f.defrag_step(8).unwrap();
    // (A window across a chunk's end of the rewrite is two runs, and rewritten.)
    assert!(r.windows <= 2, "{r:?}");
    assert_eq!(
        f.defrag_waiting(),
        queued - 8,
        "one turn took more than its 8 windows"
    );
    read_region(&f, &gens);
}

#[test]
fn a_block_written_after_the_read_keeps_its_new_data() {
    let (_dev, _idx, f, mut gens) = scattered(Config::default());
    read_region(&f, &gens);
    // Overwrite one block of every window after the read queued it.
    for w in (0..REGION).step_by(WINDOW as usize) {
        let l = w + 5;
        gens[l as usize] = 1_000_000 + l;
        f.write(l, &block(l, gens[l as usize]), false, StreamId(2))
            .unwrap();
    }
    let mut skipped = 0;
    while f.defrag_waiting() > 0 {
        skipped += f.defrag_step(8).unwrap().skipped;
    }
    assert!(skipped >= REGION / WINDOW - 2, "{skipped} blocks skipped");
    read_region(&f, &gens);
}

#[test]
fn without_defrag_reads_are_only_measured() {
    let (_dev, _idx, f, gens) = scattered(Config {
        defrag: false,
        ..Config::default()
    });
    read_region(&f, &gens);
    assert_eq!(f.defrag_waiting(), 0);
    assert_eq!(f.defrag_step(8).unwrap().windows, 0);
    assert_eq!(f.stats().fragmentation.large_reads, REGION / WINDOW);
}

/// The sample `ftlblk stats` takes reads no map page the cache does not hold when the
/// map outgrows its cache: it read 256 windows through the cache, index reads that
/// evicted the pages users need (found by review, 2026-11-29). A map the cache holds
/// whole is sampled everywhere.
#[test]
fn the_fragmentation_sample_reads_no_index_page_past_the_cache() {
    let (dev, idx, f, gens) = scattered(Config::default());
    // All cached: every window sampled (those of the written region count).
    let all = f.fragmentation_sample(256, WINDOW, 1).unwrap().windows;
    f.close().unwrap();
    drop(f);
    let small = Config {
        map_cache_bytes: 4 * ftl::map::PAGE_RAM_BYTES,
        ..Config::default()
    };
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), small).unwrap();
    let c = f.stats().map_cache;
    assert!(c.map_bytes > 4 * c.capacity_bytes, "{c:?}");
    // Two pages' worth of the region read: cached now.
    let mut b = vec![0u8; WINDOW as usize * BLOCK_SIZE];
    for w in (0..1024).step_by(WINDOW as usize) {
        f.read(w, &mut b).unwrap();
    }
    let before = f.stats().map_cache.misses;
    let s = f.fragmentation_sample(256, WINDOW, 1).unwrap();
    assert_eq!(
        f.stats().map_cache.misses,
        before,
        "the sample read index pages"
    );
    assert!(s.windows > 0 && s.windows < all, "{s:?} of {all}");
    drop(f);
    let (f, _) = Ftl::open(dev, idx, Config::default()).unwrap();
    assert_eq!(f.fragmentation_sample(256, WINDOW, 1).unwrap().windows, all);
    read_region(&f, &gens);
}
