//! The tiny geometry of the property tests (`ftl/tests/common`): 32 segments of 64 KiB,
//! 16 KiB flash pages, on the crash-simulating device with the in-memory index.

use ftl::device::crash::CrashDevice;
use ftl::device::BLOCK_SIZE;
use ftl::index::mem::MemIndex;
use ftl::model::{Model, Observed};
use ftl::{Config, FormatOptions, Ftl};
use std::sync::Arc;

pub type CrashFtl = Ftl<Arc<CrashDevice>, Arc<MemIndex>>;

/// Segments of the tiny device.
pub const SEGMENTS: u64 = 32;
/// Bytes per segment.
pub const SEGMENT_BYTES: u64 = 64 << 10;
/// Bytes of the tiny device.
pub const DEVICE_BYTES: u64 = SEGMENTS * SEGMENT_BYTES;
/// Blocks of the tiny device.
pub const DEVICE_BLOCKS: u64 = DEVICE_BYTES / BLOCK_SIZE as u64;

pub fn options() -> FormatOptions {
    FormatOptions {
        segment_bytes: Some(SEGMENT_BYTES),
        flash_page_bytes: Some(16 << 10),
        ..Default::default()
    }
}

/// A freshly formatted tiny device and index (not opened).
pub fn formatted() -> Result<(Arc<CrashDevice>, Arc<MemIndex>), String> {
    let dev = Arc::new(CrashDevice::new(DEVICE_BYTES));
    let idx = Arc::new(MemIndex::new());
    ftl::format(&dev, &idx, &options(), false).map_err(|e| format!("format: {e}"))?;
    Ok((dev, idx))
}

/// Opens the FTL on `dev` + `idx`.
pub fn open(dev: &Arc<CrashDevice>, idx: &Arc<MemIndex>) -> ftl::Result<CrashFtl> {
    open_report(dev, idx).map(|(f, _)| f)
}

/// Opens the FTL on `dev` + `idx`, with what recovery found.
pub fn open_report(
    dev: &Arc<CrashDevice>,
    idx: &Arc<MemIndex>,
) -> ftl::Result<(CrashFtl, ftl::OpenReport)> {
    Ftl::open(dev.clone(), idx.clone(), Config::default())
}

/// Reopens after the death of the process, with the staging area it left.
pub fn open_staged(
    dev: &Arc<CrashDevice>,
    idx: &Arc<MemIndex>,
    staging: Arc<ftl::staging::StagingArea>,
) -> ftl::Result<(CrashFtl, ftl::OpenReport)> {
    Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging)
}

static ZEROS: [u8; BLOCK_SIZE] = [0; BLOCK_SIZE];

/// [`ftl::model::observe`], with its all-zeros test done as one `memcmp`: under the
/// fuzzer's per-comparison instrumentation the byte-by-byte test dominated every case
/// (every LBA is read after every crash, and most are zeros). Same result.
pub fn observe(lba: u64, data: &[u8]) -> Observed {
    if data == &ZEROS[..] {
        Observed::Tag(0)
    } else {
        ftl::model::observe(lba, data)
    }
}

/// Reads `blocks` blocks at `lba` and checks each against what the model says must be
/// there now (the property tests' `check_read`, for a range).
pub fn check_read(f: &CrashFtl, m: &Model, lba: u64, blocks: u64) -> Result<(), String> {
    let mut b = vec![0u8; blocks as usize * BLOCK_SIZE];
    f.read(lba, &mut b)
        .map_err(|e| format!("read {lba}+{blocks}: {e}"))?;
    for (i, blk) in b.chunks(BLOCK_SIZE).enumerate() {
        let l = lba + i as u64;
        let got = observe(l, blk);
        let want = Observed::Tag(m.expected(l));
        if got != want {
            return Err(format!(
                "lba {l} (read {lba}+{blocks}): read {got:?}, expected {want:?}"
            ));
        }
    }
    Ok(())
}

/// After a reopen: every LBA must hold a value the model allows after a crash; the model
/// settles on it (the property tests' `check_after_crash`).
pub fn check_after_crash(f: &CrashFtl, m: &mut Model) -> Result<(), String> {
    let mut b = vec![0u8; BLOCK_SIZE];
    for lba in 0..f.capacity_blocks() {
        f.read(lba, &mut b)
            .map_err(|e| format!("read {lba} after crash: {e}"))?;
        m.settle_after_crash(lba, observe(lba, &b))?;
    }
    Ok(())
}

/// Runs the offline checker on the (closed) image; any problem is an error.
pub fn checker(dev: &Arc<CrashDevice>, idx: &Arc<MemIndex>) -> Result<(), String> {
    let report = ftl::check::check(&**dev, &**idx, true).map_err(|e| format!("check: {e}"))?;
    if report.clean() {
        Ok(())
    } else {
        Err(format!("checker: {:?}", report.problems))
    }
}
