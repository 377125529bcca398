//! Shared helpers for the ftl integration tests.
#![allow(dead_code)]

use ftl::device::crash::CrashDevice;
use ftl::device::mem::MemDevice;
use ftl::index::mem::MemIndex;
use ftl::model::{observe, Model};
use ftl::{Config, FormatOptions, Ftl, StreamId};
use std::sync::Arc;

pub type CrashFtl = Ftl<Arc<CrashDevice>, Arc<MemIndex>>;
pub type MemFtl = Ftl<Arc<MemDevice>, Arc<MemIndex>>;

/// 32 segments of 64 KiB, 16 KiB flash pages: chunks, segment changes and padding all
/// happen within a few hundred writes.
pub fn tiny() -> FormatOptions {
    FormatOptions {
        segment_bytes: Some(64 << 10),
        flash_page_bytes: Some(16 << 10),
        ..Default::default()
    }
}

pub fn tiny_crash() -> (Arc<CrashDevice>, Arc<MemIndex>, CrashFtl) {
    let dev = Arc::new(CrashDevice::new(32 * (64 << 10)));
    let idx = Arc::new(MemIndex::new());
    ftl::format(&dev, &idx, &tiny(), false).unwrap();
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
    (dev, idx, f)
}

pub fn mem_ftl(size: u64, opts: &FormatOptions) -> (Arc<MemDevice>, Arc<MemIndex>, MemFtl) {
    let dev = Arc::new(MemDevice::new(size));
    let idx = Arc::new(MemIndex::new());
    ftl::format(&dev, &idx, opts, false).unwrap();
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
    (dev, idx, f)
}

/// Reads `lba` and checks it against what the model says must be there now.
pub fn check_read<D: ftl::BlockDevice, I: ftl::IndexStore>(
    f: &Ftl<D, I>,
    m: &Model,
    lba: u64,
) -> Result<(), String> {
    let mut b = vec![0u8; 4096];
    f.read(lba, &mut b)
        .map_err(|e| format!("read {lba}: {e}"))?;
    let got = observe(lba, &b);
    let want = ftl::model::Observed::Tag(m.expected(lba));
    if got != want {
        return Err(format!("lba {lba}: read {got:?}, expected {want:?}"));
    }
    Ok(())
}

/// After a reopen: every LBA must hold an allowed value; the model settles on it.
pub fn check_after_crash<D: ftl::BlockDevice, I: ftl::IndexStore>(
    f: &Ftl<D, I>,
    m: &mut Model,
) -> Result<(), String> {
    let mut b = vec![0u8; 4096];
    for lba in 0..f.capacity_blocks() {
        f.read(lba, &mut b)
            .map_err(|e| format!("read {lba} after crash: {e}"))?;
        m.settle_after_crash(lba, observe(lba, &b))?;
    }
    Ok(())
}

pub const S0: StreamId = StreamId(1);
