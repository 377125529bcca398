//! Reads: where a block lives (a stream's buffer, the device, nowhere), device reads in
//! physically contiguous runs issued together, each block checked against its map
//! entry's crc32c, and the
//! one retry path for a block that moved while it was read ([`Ftl::reread_block`], also
//! used by the ublk edge). Called by the engine's users.

use super::{BlockLocation, Ftl, READ_RETRIES};
use crate::device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
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
    /// window (one per run of mapped blocks physically in order, at most
    /// [`READ_SPAN_GAP_BLOCKS`] apart) summed over the
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
                        if !prev.is_some_and(|q| p > q && p - q <= 1 + READ_SPAN_GAP_BLOCKS) {
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

    /// Locates every block of a read of `buf.len()` bytes at `lba`: zeros and buffered
    /// blocks are filled in `buf` here; the device-resident ones are returned in request
    /// order, to be read (in [`device_runs`]) and verified by the caller. The one read
    /// planner of every reader ([`Ftl::read`] and the ublk edge).
    pub fn plan_read(&self, lba: u64, buf: &mut [u8]) -> Result<Vec<DeviceBlock>> {
        let n = Self::check_len(buf.len())?;
        self.check_range(lba, n)?;
        let mut dev = Vec::new();
        for (i, blk) in buf.chunks_mut(BLOCK_SIZE).enumerate() {
            match self.locate(lba + i as u64, blk)? {
                BlockLocation::Zero => blk.fill(0),
                BlockLocation::Copied => {}
                BlockLocation::Device { offset, entry } => dev.push(DeviceBlock {
                    idx: i,
                    offset,
                    entry,
                }),
            }
        }
        Ok(dev)
    }

    /// Reads whole blocks at `lba` into `buf`. Never-written and trimmed blocks read zeros.
    /// The physically contiguous runs are read together (one batch of backing reads, so a
    /// fragmented range costs the slowest of its reads, not their sum), then each block
    /// is checked against its map entry.
    pub fn read(&self, lba: u64, buf: &mut [u8]) -> Result<()> {
        let (dev, _) = self.read_checked(lba, buf)?;
        self.note_read(lba, &dev, buf);
        Ok(())
    }

    /// [`Ftl::read`] without reporting it ([`Ftl::note_read`]): the device-resident
    /// blocks (their entries as located, before any retry) and the backing reads issued.
    pub(crate) fn read_checked(&self, lba: u64, buf: &mut [u8]) -> Result<(Vec<DeviceBlock>, usize)> {
        let dev = self.plan_read(lba, buf)?;
        if dev.is_empty() {
            return Ok((dev, 0));
        }
        let runs = device_runs_within(&dev, READ_SPAN_GAP_BLOCKS);
        // A run with gaps (a chunk's summary, a FLUSH's padding between its blocks) is
        // read whole into a scratch buffer and its blocks copied out.
        let span = |&(first, count): &(usize, usize)| {
            let (a, z) = (dev[first], dev[first + count - 1]);
            (a.offset, (z.offset - a.offset) as usize + BLOCK_SIZE)
        };
        let mut scratch: Vec<AlignedBuf> = runs
            .iter()
            .filter(|r| span(r).1 != r.1 * BLOCK_SIZE)
            .map(|r| AlignedBuf::new(span(r).1))
            .collect();
        {
            let mut reqs: Vec<(u64, &mut [u8])> = Vec::with_capacity(runs.len());
            let mut rest: &mut [u8] = buf;
            let mut at = 0usize;
            let mut spare = scratch.iter_mut();
            for r in &runs {
                let (first, count) = *r;
                let b = dev[first];
                let (_, tail) = std::mem::take(&mut rest).split_at_mut((b.idx - at) * BLOCK_SIZE);
                let (run, tail) = tail.split_at_mut(count * BLOCK_SIZE);
                rest = tail;
                at = b.idx + count;
                let (offset, len) = span(r);
                if len == count * BLOCK_SIZE {
                    reqs.push((offset, run));
                } else if let Some(sc) = spare.next() {
                    reqs.push((offset, &mut sc[..]));
                }
            }
            let first = reqs.first().map_or(0, |r| r.0);
            // One run (every 4 KiB read, a contiguous range): a plain read.
            match reqs.as_mut_slice() {
                [(offset, run)] => self.dev.read_at(*offset, run),
                all => self.dev.read_many(all),
            }
            .map_err(|e| Error::io("read", first, e))?;
        }
        let mut spare = scratch.iter();
        for r in &runs {
            let (offset, len) = span(r);
            if len == r.1 * BLOCK_SIZE {
                continue;
            }
            let Some(sc) = spare.next() else { break };
            for b in &dev[r.0..r.0 + r.1] {
                let from = (b.offset - offset) as usize;
                buf[b.idx * BLOCK_SIZE..(b.idx + 1) * BLOCK_SIZE]
                    .copy_from_slice(&sc[from..from + BLOCK_SIZE]);
            }
        }
        for b in &dev {
            let l = lba + b.idx as u64;
            let blk = &mut buf[b.idx * BLOCK_SIZE..(b.idx + 1) * BLOCK_SIZE];
            if !self.verify_block(l, b.entry, blk)? {
                self.reread_block(l, blk)?;
            }
        }
        Ok((dev, runs.len()))
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

/// A device-resident block of a read: its index in the request, byte offset and map
/// entry (what [`Ftl::plan_read`] returns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBlock {
    pub idx: usize,
    pub offset: u64,
    pub entry: MapEntry,
}

/// Blocks of other data a read spans rather than splitting in two: a chunk's summary
/// block and a FLUSH's padding to a 16 KiB flash page, found between the blocks of a
/// range written (or rewritten) in order.
pub const READ_SPAN_GAP_BLOCKS: u64 = 4;

/// Groups device blocks into runs adjacent both in the request and on the backing;
/// returns `(first, count)` pairs over `blocks` (one backing read each).
pub fn device_runs(blocks: &[DeviceBlock]) -> Vec<(usize, usize)> {
    device_runs_within(blocks, 0)
}

/// [`device_runs`], also joining blocks adjacent in the request whose places on the
/// backing follow each other with at most `gap` other blocks between (one backing read
/// spanning them).
pub fn device_runs_within(blocks: &[DeviceBlock], gap: u64) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    let bs = BLOCK_SIZE as u64;
    for (k, b) in blocks.iter().enumerate() {
        if let Some((first, count)) = out.last_mut() {
            let prev = blocks[*first + *count - 1];
            if prev.idx + 1 == b.idx
                && b.offset > prev.offset
                && b.offset - prev.offset <= (1 + gap) * bs
            {
                *count += 1;
                continue;
            }
        }
        out.push((k, 1));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_join_blocks_adjacent_in_the_request_and_on_the_device() {
        let b = |idx, offset| DeviceBlock {
            idx,
            offset,
            entry: MapEntry::UNMAPPED,
        };
        let blocks = [
            b(0, 4096),
            b(1, 8192),
            b(2, 0),
            b(4, 4096),
            b(5, 8192),
            b(6, 12288),
        ];
        assert_eq!(device_runs(&blocks), vec![(0, 2), (2, 1), (3, 3)]);
        assert!(device_runs(&[]).is_empty());
        // A summary block between two pieces of one range: one read with a gap of one.
        let gapped = [b(0, 4096), b(1, 12288), b(2, 16384), b(3, 4096 * 9)];
        assert_eq!(device_runs(&gapped), vec![(0, 1), (1, 2), (3, 1)]);
        assert_eq!(device_runs_within(&gapped, 1), vec![(0, 3), (3, 1)]);
        assert_eq!(device_runs_within(&gapped, 4), vec![(0, 4)]);
        // Never backwards.
        assert_eq!(device_runs_within(&[b(0, 8192), b(1, 4096)], 4).len(), 2);
    }
}
