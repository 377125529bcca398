//! Reads: where a block lives (a stream's buffer, the device, nowhere), device reads in
//! physically contiguous runs, each block checked against its map entry's crc32c, and the
//! one retry path for a block that moved while it was read ([`Ftl::reread_block`], also
//! used by the ublk edge). Called by the engine's users.

use super::{BlockLocation, Ftl, READ_RETRIES};
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::error::{Error, Result};
use crate::index::IndexStore;
use crate::map::MapEntry;

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Finds where `lba` lives; copies it into `out` when it is still buffered.
    pub fn locate(&self, lba: u64, out: &mut [u8]) -> Result<BlockLocation> {
        self.check_range(lba, 1)?;
        self.space.note_foreground();
        let e = self.t.map.get(lba)?;
        let Some(pba) = e.pba() else {
            return Ok(BlockLocation::Zero);
        };
        let pba = pba as u64;
        if self.log.copy_buffered(&self.t, pba, out) {
            return Ok(BlockLocation::Copied);
        }
        Ok(BlockLocation::Device {
            offset: pba * BLOCK_SIZE as u64,
            entry: e,
        })
    }

    /// Verifies a block read from the device against its map entry. A mismatch is an
    /// error unless the map moved on meanwhile (then the caller locates again).
    pub fn verify_block(&self, lba: u64, entry: MapEntry, data: &[u8]) -> Result<bool> {
        if crc32c::crc32c(&data[..BLOCK_SIZE]) == entry.crc() {
            return Ok(true);
        }
        if self.t.map.get(lba)? != entry {
            return Ok(false);
        }
        Err(Error::DataChecksum {
            lba,
            pba: entry.pba().unwrap_or(u32::MAX) as u64,
        })
    }

    /// Fragmentation of `blocks` blocks from `lba`, cut in windows of `window` blocks
    /// (as reads of that size see it): the backing reads [`Ftl::read`] issues for each
    /// window (one per run of physically contiguous mapped blocks) summed over the
    /// windows, and the windows with a mapped block. The mean contiguous run is
    /// `mapped / reads`; the reads per user read `reads / windows`.
    pub fn fragmentation(&self, lba: u64, blocks: u64, window: u64) -> Result<Fragmentation> {
        self.check_range(lba, blocks)?;
        let window = window.max(1);
        let mut f = Fragmentation::default();
        let mut w = lba;
        while w < lba + blocks {
            let end = (w + window).min(lba + blocks);
            let mut prev: Option<u64> = None;
            let mut any = false;
            for l in w..end {
                match self.t.map.get(l)?.pba() {
                    Some(p) => {
                        let p = p as u64;
                        if prev != Some(p.wrapping_sub(1)) {
                            f.reads += 1;
                        }
                        prev = Some(p);
                        f.mapped_blocks += 1;
                        any = true;
                    }
                    None => prev = None,
                }
            }
            f.windows += any as u64;
            w = end;
        }
        Ok(f)
    }

    /// Reads whole blocks at `lba` into `buf`. Never-written and trimmed blocks read zeros.
    pub fn read(&self, lba: u64, buf: &mut [u8]) -> Result<()> {
        let n = Self::check_len(buf.len())?;
        self.check_range(lba, n)?;
        let mut i = 0u64;
        while i < n {
            let blk = &mut buf[i as usize * BLOCK_SIZE..(i as usize + 1) * BLOCK_SIZE];
            match self.locate(lba + i, blk)? {
                BlockLocation::Zero => {
                    blk.fill(0);
                    i += 1;
                }
                BlockLocation::Copied => i += 1,
                BlockLocation::Device { offset, entry } => {
                    // Extend the run while the following blocks are physically contiguous.
                    let mut run = vec![entry];
                    while i + (run.len() as u64) < n {
                        let next = self.t.map.get(lba + i + run.len() as u64)?;
                        let contiguous = next.pba().is_some_and(|p| {
                            p as u64 * BLOCK_SIZE as u64
                                == offset + run.len() as u64 * BLOCK_SIZE as u64
                                && self
                                    .t
                                    .segs
                                    .buffered_owner(self.t.geo.segment_of(p as u64))
                                    .is_none()
                        });
                        if !contiguous {
                            break;
                        }
                        run.push(next);
                    }
                    let bytes =
                        &mut buf[i as usize * BLOCK_SIZE..(i as usize + run.len()) * BLOCK_SIZE];
                    self.dev
                        .read_at(offset, bytes)
                        .map_err(|e| Error::io("read", offset, e))?;
                    for (k, e) in run.iter().enumerate() {
                        let blk = &mut buf
                            [(i as usize + k) * BLOCK_SIZE..(i as usize + k + 1) * BLOCK_SIZE];
                        if !self.verify_block(lba + i + k as u64, *e, blk)? {
                            self.reread_block(lba + i + k as u64, blk)?;
                        }
                    }
                    i += run.len() as u64;
                }
            }
        }
        Ok(())
    }

    /// Reads one block whose map entry moved while it was read (its data did not match
    /// the entry it was located by), locating it again up to [`READ_RETRIES`] times. The
    /// one retry path of every reader.
    pub fn reread_block(&self, lba: u64, blk: &mut [u8]) -> Result<()> {
        for _ in 0..READ_RETRIES {
            match self.locate(lba, blk)? {
                BlockLocation::Zero => {
                    blk.fill(0);
                    return Ok(());
                }
                BlockLocation::Copied => return Ok(()),
                BlockLocation::Device { offset, entry } => {
                    self.dev
                        .read_at(offset, &mut blk[..BLOCK_SIZE])
                        .map_err(|e| Error::io("read", offset, e))?;
                    if self.verify_block(lba, entry, blk)? {
                        return Ok(());
                    }
                }
            }
        }
        Err(Error::KeptMoving {
            lba,
            tries: READ_RETRIES,
        })
    }

    /// Current map entry of `lba` (for the cleaner and checks).
    pub fn map_entry(&self, lba: u64) -> Result<MapEntry> {
        self.check_range(lba, 1)?;
        self.t.map.get(lba)
    }
}

/// What [`Ftl::fragmentation`] measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Fragmentation {
    /// Windows holding at least one mapped block.
    pub windows: u64,
    /// Backing reads reading those windows takes (one per contiguous run).
    pub reads: u64,
    pub mapped_blocks: u64,
}

impl Fragmentation {
    /// Mean physically contiguous run, in blocks.
    pub fn mean_run_blocks(&self) -> f64 {
        self.mapped_blocks as f64 / self.reads.max(1) as f64
    }
    /// Backing reads per window read.
    pub fn reads_per_window(&self) -> f64 {
        self.reads as f64 / self.windows.max(1) as f64
    }
}
