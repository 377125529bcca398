//! Reads: where a block lives (a stream's buffer, the device, nowhere), device reads in
//! physically contiguous runs issued together, each block checked against its map
//! entry's crc32c, and the
//! one retry path for a block that moved while it was read ([`Ftl::reread_block`], also
//! used by the ublk edge). Called by the engine's users.

use super::{BlockLocation, Ftl, READ_RETRIES};
use crate::device::{BlockDevice, ScratchBuf, BLOCK_SIZE};
use crate::error::{Error, Result};
use crate::index::IndexStore;
use crate::map::MapEntry;

/// The block-at-a-time calls take a buffer of one block or more (its first block used):
/// a shorter one is refused, not a panic of the slicing (found by review, 2026-11-30).
fn one_block(len: usize) -> Result<()> {
    if len < BLOCK_SIZE {
        return Err(Error::Unaligned(format!(
            "a buffer of {len} bytes for one block of {BLOCK_SIZE}"
        )));
    }
    Ok(())
}

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Finds where `lba` lives; copies it into `out` when it is still buffered.
    pub fn locate(&self, lba: u64, out: &mut [u8]) -> Result<BlockLocation> {
        self.locate_as(lba, out, true)
    }

    /// [`Ftl::locate`]; `foreground` counts it as a user's request (the cleaner's runner
    /// yields to those; its own reads must not make the device look busy to it).
    fn locate_as(&self, lba: u64, out: &mut [u8], foreground: bool) -> Result<BlockLocation> {
        self.check_range(lba, 1)?;
        one_block(out.len())?;
        if foreground {
            self.space.note_foreground();
        }
        for _ in 0..READ_RETRIES {
            let e = self.t.map.get(lba)?;
            let Some(pba) = e.pba() else {
                return Ok(BlockLocation::Zero);
            };
            let pba = pba as u64;
            #[cfg(test)]
            crate::append::tests::maybe_park(&crate::append::tests::PARK_AFTER_LOOKUP);
            if !self.log.copy_buffered(&self.t, pba, out) {
                return Ok(BlockLocation::Device {
                    offset: pba * BLOCK_SIZE as u64,
                    entry: e,
                });
            }
            // A buffered block is checked against its entry like one read from the
            // device: between the map lookup and the copy the block may have moved, its
            // segment been freed and reused, and another LBA's block sit at `pba`. Then
            // it is located again.
            if self.verify_block(lba, e, out)? {
                return Ok(BlockLocation::Copied);
            }
        }
        Err(Error::KeptMoving {
            lba,
            tries: READ_RETRIES,
        })
    }

    /// Verifies a block read from the device against its map entry. A mismatch is an
    /// error unless the map moved on meanwhile (then the caller locates again).
    pub fn verify_block(&self, lba: u64, entry: MapEntry, data: &[u8]) -> Result<bool> {
        one_block(data.len())?;
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
    /// window (its [`ReadSpans`]: one per run of mapped blocks at most
    /// [`READ_SPAN_GAP_BLOCKS`] apart on the backing) summed over the
    /// windows, and the windows with a mapped block. The mean contiguous run is
    /// `mapped / reads`; the reads per user read `reads / windows`.
    pub fn fragmentation(&self, lba: u64, blocks: u64, window: u64) -> Result<Fragmentation> {
        self.check_range(lba, blocks)?;
        let window = window.max(1);
        let mut f = Fragmentation::default();
        let mut w = lba;
        while w < lba + blocks {
            // Saturating: a window near u64::MAX wrapped (found by review, 2026-11-29).
            let end = w.saturating_add(window).min(lba + blocks);
            let mut dev = Vec::with_capacity((end - w) as usize);
            for l in w..end {
                if let Some(p) = self.t.map.get(l)?.pba() {
                    dev.push(DeviceBlock {
                        idx: (l - w) as usize,
                        offset: p as u64 * BLOCK_SIZE as u64,
                        entry: MapEntry::UNMAPPED,
                    });
                }
            }
            f.reads += ReadSpans::new(&dev, READ_SPAN_GAP_BLOCKS).len() as u64;
            f.mapped_blocks += dev.len() as u64;
            let any = !dev.is_empty();
            f.windows += any as u64;
            w = end;
        }
        Ok(f)
    }

    /// Whether locating `count` blocks at `lba` would read the index: the map cache holds
    /// part of the map and misses a page of the range. The ublk edge then has the pages
    /// loaded ([`Ftl::prefetch_map`]) off its queue thread, where an index read held
    /// every other request of the queue.
    pub fn map_misses(&self, lba: u64, count: u64) -> bool {
        !self.t.map.cached(lba, count)
    }

    /// Loads the map pages of `count` blocks at `lba` into the cache (index reads on
    /// misses), so that locating them soon after does not wait for the index (a hint: a
    /// page evicted meanwhile is read again then).
    pub fn prefetch_map(&self, lba: u64, count: u64) -> Result<()> {
        self.check_range(lba, count)?;
        self.t.map.prefetch(lba, count)
    }

    /// Locates every block of a read of `buf.len()` bytes at `lba`: zeros and buffered
    /// blocks are filled in `buf` here; the device-resident ones are returned in request
    /// order, to be read (in [`ReadSpans`]) and verified by the caller. The one read
    /// planner of every reader ([`Ftl::read`] and the ublk edge).
    pub fn plan_read(&self, lba: u64, buf: &mut [u8]) -> Result<Vec<DeviceBlock>> {
        self.plan_read_as(lba, buf, true)
    }

    fn plan_read_as(&self, lba: u64, buf: &mut [u8], foreground: bool) -> Result<Vec<DeviceBlock>> {
        let n = Self::check_len(buf.len())?;
        self.check_range(lba, n)?;
        let mut dev = Vec::new();
        for (i, blk) in buf.chunks_mut(BLOCK_SIZE).enumerate() {
            match self.locate_as(lba + i as u64, blk, foreground)? {
                BlockLocation::Zero => blk.fill(0),
                BlockLocation::Copied => {}
                BlockLocation::Device { offset, entry } => dev.push(DeviceBlock {
                    idx: i,
                    offset,
                    entry,
                }),
            }
        }
        // A user's request that reaches the backing: the cleaner reads less deep beside
        // it (`victim_read_depth`).
        if foreground && !dev.is_empty() {
            self.space.note_user_read();
        }
        Ok(dev)
    }

    /// Reads whole blocks at `lba` into `buf`. Never-written and trimmed blocks read zeros.
    /// The physically contiguous runs are read together (one batch of backing reads, so a
    /// fragmented range costs the slowest of its reads, not their sum), then each block
    /// is checked against its map entry.
    pub fn read(&self, lba: u64, buf: &mut [u8]) -> Result<()> {
        let (dev, _) = self.read_checked(lba, buf, true)?;
        self.note_read(lba, &dev, buf);
        Ok(())
    }

    /// [`Ftl::read`] without reporting it ([`Ftl::note_read`]): the device-resident
    /// blocks (their entries as located, before any retry) and the backing reads issued.
    /// `foreground`: a user's read (false: the FTL's own, not counted as activity).
    pub(crate) fn read_checked(
        &self,
        lba: u64,
        buf: &mut [u8],
        foreground: bool,
    ) -> Result<(Vec<DeviceBlock>, usize)> {
        let dev = self.plan_read_as(lba, buf, foreground)?;
        if dev.is_empty() {
            return Ok((dev, 0));
        }
        let spans = ReadSpans::new(&dev, READ_SPAN_GAP_BLOCKS);
        // A span holding other data between its blocks (stale copies, a chunk's summary,
        // a FLUSH's padding) or blocks out of request order is read whole into a scratch
        // buffer and its blocks copied out; the others straight into `buf`.
        let mut scratch: Vec<ScratchBuf> = spans
            .iter()
            .filter(|s| s.direct().is_none())
            .map(|s| ScratchBuf::take(s.len))
            .collect();
        {
            let mut reqs: Vec<(u64, &mut [u8])> = Vec::with_capacity(spans.len());
            let mut direct: Vec<(usize, ReadSpan<'_>)> = spans
                .iter()
                .filter_map(|s| s.direct().map(|i| (i, s)))
                .collect();
            direct.sort_unstable_by_key(|d| d.0);
            let mut rest: &mut [u8] = buf;
            let mut at = 0usize;
            for (idx, s) in direct {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut((idx - at) * BLOCK_SIZE);
                let (run, tail) = tail.split_at_mut(s.len);
                rest = tail;
                at = idx + s.blocks.len();
                reqs.push((s.offset, run));
            }
            for (s, sc) in spans.iter().filter(|s| s.direct().is_none()).zip(&mut scratch) {
                reqs.push((s.offset, &mut sc[..]));
            }
            let first = reqs.first().map_or(0, |r| r.0);
            // One span (every 4 KiB read, a contiguous range): a plain read.
            match reqs.as_mut_slice() {
                [(offset, run)] => self.dev.read_at(*offset, run),
                all => self.dev.read_many(all),
            }
            .map_err(|e| Error::io("read", first, e))?;
        }
        for (s, sc) in spans.iter().filter(|s| s.direct().is_none()).zip(&scratch) {
            s.copy_out(sc, buf);
        }
        for b in &dev {
            let l = lba + b.idx as u64;
            let blk = &mut buf[b.idx * BLOCK_SIZE..(b.idx + 1) * BLOCK_SIZE];
            if !self.verify_block(l, b.entry, blk)? {
                self.reread_block_as(l, blk, foreground)?;
            }
        }
        let reads = spans.len();
        Ok((dev, reads))
    }

    /// Reads one block whose map entry moved while it was read (its data did not match
    /// the entry it was located by), locating it again up to [`READ_RETRIES`] times. The
    /// one retry path of every reader.
    pub fn reread_block(&self, lba: u64, blk: &mut [u8]) -> Result<()> {
        self.reread_block_as(lba, blk, true)
    }

    /// [`Ftl::reread_block`]; `foreground` as in [`Ftl::locate_as`] (defragmentation's
    /// re-reads counted as a user's requests, and the cleaner's runner saw a busy device;
    /// found by review, 2026-11-29).
    fn reread_block_as(&self, lba: u64, blk: &mut [u8], foreground: bool) -> Result<()> {
        for _ in 0..READ_RETRIES {
            match self.locate_as(lba, blk, foreground)? {
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

/// Blocks a read spans rather than issuing another backing read: a chunk's summary
/// block, a FLUSH's padding to a 16 KiB flash page, and stale copies of the request's
/// own blocks (an overwritten block of a range written in order sits in its old place
/// between the live ones; reading over it costs 4 KiB more of one read, not a read).
pub const READ_SPAN_GAP_BLOCKS: u64 = 4;

/// The backing reads of a planned read ([`Ftl::plan_read`]'s device blocks): the blocks
/// in the order of their places on the backing, cut into spans, each one read of the
/// backing covering blocks at most `gap` blocks apart. Blocks adjacent on the backing are
/// joined whatever their order in the request, so the live blocks of a range written
/// in order stay one read however many of its blocks were overwritten elsewhere since.
/// Used by every reader ([`Ftl::read`], the ublk edge) and by the fragmentation figures.
#[derive(Debug, Clone)]
pub struct ReadSpans<'a> {
    blocks: std::borrow::Cow<'a, [DeviceBlock]>,
    /// `(first, count)` over `blocks`.
    spans: Vec<(usize, usize)>,
}

/// One backing read of [`ReadSpans`]: `len` bytes at `offset`, holding `blocks` (in
/// offset order; the bytes between them belong to no block of the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadSpan<'a> {
    pub offset: u64,
    pub len: usize,
    pub blocks: &'a [DeviceBlock],
}

impl ReadSpan<'_> {
    /// The request block the span can be read straight into (its blocks follow each
    /// other both in the request and on the backing), or `None` (it is read into a
    /// scratch buffer and its blocks copied out: [`ReadSpan::copy_out`]).
    pub fn direct(&self) -> Option<usize> {
        let first = self.blocks.first()?.idx;
        let packed = self.len == self.blocks.len() * BLOCK_SIZE
            && self.blocks.iter().enumerate().all(|(k, b)| b.idx == first + k);
        packed.then_some(first)
    }

    /// Copies the span's blocks from `scratch` (the span's `len` bytes as read) to their
    /// places in the request buffer `buf`.
    pub fn copy_out(&self, scratch: &[u8], buf: &mut [u8]) {
        for b in self.blocks {
            let from = (b.offset - self.offset) as usize;
            buf[b.idx * BLOCK_SIZE..(b.idx + 1) * BLOCK_SIZE]
                .copy_from_slice(&scratch[from..from + BLOCK_SIZE]);
        }
    }
}

impl<'a> ReadSpans<'a> {
    /// Plans the backing reads of `blocks` (any order), joining blocks at most `gap`
    /// blocks apart on the backing.
    pub fn new(blocks: &'a [DeviceBlock], gap: u64) -> Self {
        let blocks = if blocks.is_sorted_by_key(|b| b.offset) {
            std::borrow::Cow::Borrowed(blocks)
        } else {
            let mut v = blocks.to_vec();
            v.sort_unstable_by_key(|b| b.offset);
            std::borrow::Cow::Owned(v)
        };
        let bs = BLOCK_SIZE as u64;
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for (k, b) in blocks.iter().enumerate() {
            if let Some((first, count)) = spans.last_mut() {
                let prev = blocks[*first + *count - 1].offset;
                if b.offset > prev && b.offset - prev <= (1 + gap) * bs {
                    *count += 1;
                    continue;
                }
            }
            spans.push((k, 1));
        }
        ReadSpans { blocks, spans }
    }

    /// Backing reads.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The spans, in the order of their places on the backing.
    pub fn iter(&self) -> impl Iterator<Item = ReadSpan<'_>> + '_ {
        (0..self.spans.len()).filter_map(|k| self.get(k))
    }

    /// The `k`th span of [`ReadSpans::iter`].
    pub fn get(&self, k: usize) -> Option<ReadSpan<'_>> {
        let &(first, count) = self.spans.get(k)?;
        let blocks = &self.blocks[first..first + count];
        let (a, z) = (blocks.first()?.offset, blocks.last()?.offset);
        Some(ReadSpan {
            offset: a,
            len: (z - a) as usize + BLOCK_SIZE,
            blocks,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = BLOCK_SIZE as u64;

    fn b(idx: usize, place: u64) -> DeviceBlock {
        DeviceBlock {
            idx,
            offset: place * B,
            entry: MapEntry::UNMAPPED,
        }
    }

    fn shape(s: &ReadSpans<'_>) -> Vec<(u64, usize, Vec<usize>, Option<usize>)> {
        s.iter()
            .map(|x| {
                let idx = x.blocks.iter().map(|b| b.idx).collect();
                (x.offset / B, x.len / BLOCK_SIZE, idx, x.direct())
            })
            .collect()
    }

    #[test]
    fn a_range_in_order_is_one_direct_read() {
        let blocks: Vec<_> = (0..8).map(|i| b(i, 100 + i as u64)).collect();
        let s = ReadSpans::new(&blocks, READ_SPAN_GAP_BLOCKS);
        assert_eq!(shape(&s), vec![(100, 8, (0..8).collect(), Some(0))]);
        assert!(ReadSpans::new(&[], 4).is_empty());
    }

    #[test]
    fn spans_read_over_stale_blocks_and_summaries_but_not_past_the_gap() {
        // Blocks 2 and 5 of a range written in order at 100.. were overwritten and now
        // live at 900 and 40; a chunk summary sits at 104.
        let blocks = [
            b(0, 100),
            b(1, 101),
            b(2, 900),
            b(3, 103),
            b(4, 105),
            b(5, 40),
            b(6, 107),
        ];
        let s = ReadSpans::new(&blocks, READ_SPAN_GAP_BLOCKS);
        assert_eq!(
            shape(&s),
            vec![
                (40, 1, vec![5], Some(5)),
                (100, 8, vec![0, 1, 3, 4, 6], None),
                (900, 1, vec![2], Some(2)),
            ]
        );
        // Without gaps the old range splits at every hole.
        assert_eq!(ReadSpans::new(&blocks, 0).len(), 6);
        // A gap of exactly `gap` blocks joins; one more splits.
        assert_eq!(ReadSpans::new(&[b(0, 10), b(1, 15)], 4).len(), 1);
        assert_eq!(ReadSpans::new(&[b(0, 10), b(1, 16)], 4).len(), 2);
    }

    #[test]
    fn blocks_in_place_order_but_not_request_order_are_copied_out() {
        // Request blocks 0 and 1 stored backwards: one read, through scratch.
        let blocks = [b(0, 51), b(1, 50)];
        let s = ReadSpans::new(&blocks, READ_SPAN_GAP_BLOCKS);
        assert_eq!(shape(&s), vec![(50, 2, vec![1, 0], None)]);
        let span = s.iter().next().unwrap();
        let mut scratch = vec![0u8; 2 * BLOCK_SIZE];
        scratch[..BLOCK_SIZE].fill(1);
        scratch[BLOCK_SIZE..].fill(2);
        let mut buf = vec![0u8; 2 * BLOCK_SIZE];
        span.copy_out(&scratch, &mut buf);
        assert!(buf[..BLOCK_SIZE].iter().all(|&x| x == 2));
        assert!(buf[BLOCK_SIZE..].iter().all(|&x| x == 1));
    }

    proptest::proptest! {
        /// Any set of device blocks (distinct places, any request order): every block
        /// is in exactly one span; spans are in place order, disjoint, begin and end on
        /// a block and hold no hole past the gap; a direct span's blocks are the
        /// request's consecutive blocks at consecutive places, and reading each span
        /// then copying out puts every block's bytes at its request index.
        #[test]
        fn spans_cover_every_block_once_and_copy_out_to_its_index(
            places in proptest::collection::btree_set(0u64..200, 1..40),
            seed in 0u64..1000,
            gap in 0u64..6,
        ) {
            use rand::{seq::SliceRandom, SeedableRng};
            let mut places: Vec<u64> = places.into_iter().collect();
            places.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(seed));
            let blocks: Vec<DeviceBlock> =
                places.iter().enumerate().map(|(i, &p)| b(i, p)).collect();
            let s = ReadSpans::new(&blocks, gap);
            // The "device": every place holds its own number.
            let disk = |at: u64, len: usize| -> Vec<u8> {
                (0..len / BLOCK_SIZE)
                    .flat_map(|k| vec![(at / B + k as u64) as u8; BLOCK_SIZE])
                    .collect()
            };
            let mut buf = vec![0xffu8; blocks.len() * BLOCK_SIZE];
            let mut seen = vec![0; blocks.len()];
            let mut end = 0u64;
            for span in s.iter() {
                proptest::prop_assert!(span.offset >= end, "spans overlap or go backwards");
                end = span.offset + span.len as u64;
                proptest::prop_assert_eq!(span.offset, span.blocks[0].offset);
                proptest::prop_assert_eq!(
                    end,
                    span.blocks[span.blocks.len() - 1].offset + B
                );
                for w in span.blocks.windows(2) {
                    proptest::prop_assert!(w[1].offset > w[0].offset);
                    proptest::prop_assert!(w[1].offset - w[0].offset <= (1 + gap) * B);
                }
                for x in span.blocks {
                    seen[x.idx] += 1;
                }
                let data = disk(span.offset, span.len);
                match span.direct() {
                    Some(i) => {
                        for (k, x) in span.blocks.iter().enumerate() {
                            proptest::prop_assert_eq!(x.idx, i + k);
                        }
                        proptest::prop_assert_eq!(span.len, span.blocks.len() * BLOCK_SIZE);
                        buf[i * BLOCK_SIZE..i * BLOCK_SIZE + span.len].copy_from_slice(&data);
                    }
                    None => span.copy_out(&data, &mut buf),
                }
            }
            proptest::prop_assert!(seen.iter().all(|&n| n == 1), "{:?}", seen);
            for x in &blocks {
                let got = &buf[x.idx * BLOCK_SIZE..(x.idx + 1) * BLOCK_SIZE];
                proptest::prop_assert!(got.iter().all(|&v| v == (x.offset / B) as u8));
            }
        }
    }
}
