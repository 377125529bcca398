//! The decoders never allocate hugely: the largest single allocation while decoding an
//! input stays within a small bound of the input's own size.

use ftl_fuzz::decode;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

struct Counting;

static TRACK: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if TRACK.load(Ordering::Relaxed) {
            LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if TRACK.load(Ordering::Relaxed) {
            LARGEST.fetch_max(n, Ordering::Relaxed);
        }
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Largest single allocation while decoding `data`.
fn largest(data: &[u8]) -> usize {
    let _g = ONE_AT_A_TIME.lock().unwrap();
    LARGEST.store(0, Ordering::SeqCst);
    TRACK.store(true, Ordering::SeqCst);
    let r = decode::run(data);
    TRACK.store(false, Ordering::SeqCst);
    r.unwrap_or_else(|e| panic!("decode: {e}"));
    LARGEST.load(Ordering::SeqCst)
}

const SLACK: usize = 64 << 10;

#[test]
fn decoders_allocate_at_most_the_input_plus_a_constant() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/decode");
    let mut inputs: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
        .collect();
    // Claims of huge counts behind a fixed-up crc.
    for sel in 0..5u8 {
        for flags in [0, decode::FIX_CRC, decode::FIX_CRC | decode::FIT] {
            let mut v = vec![sel | flags];
            v.extend_from_slice(b"FTLCHUNK");
            v.extend_from_slice(&[0xff; 200]);
            inputs.push(v.clone());
            v[1..9].copy_from_slice(b"FTLCKPT1");
            inputs.push(v.clone());
            v[1..5].copy_from_slice(b"FTLM");
            inputs.push(v);
        }
    }
    inputs.push(vec![decode::FIX_CRC | 3; 1 << 20]);
    assert!(inputs.len() > 10);
    for data in &inputs {
        let got = largest(data);
        assert!(
            got <= data.len() + SLACK,
            "decoding {} bytes (selector {:#x}) allocated {got} bytes at once",
            data.len(),
            data.first().copied().unwrap_or(0)
        );
    }
}
