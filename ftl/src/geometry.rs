//! Device geometry: how the backing is cut into segments, and what capacity is exported.
//!
//! Physical layout of the backing (every unit is a 4 KiB block):
//!
//! ```text
//!  segment 0 (metadata)                 segment 1 .. segment_count-1 (log)
//! +-----+-----------------------+-----+ +---------------------------+ +---- ...
//! | SB  |  unused               | SB  | | chunk | chunk | ... |pad | | chunk ...
//! | (A) |                       | (B) | +---------------------------+ +---- ...
//! +-----+-----------------------+-----+
//!  block 0                  last block of segment 0
//! ```
//!
//! Segment 0 holds the two superblock copies, far apart; every other segment is a unit of
//! log space (written sequentially, cleaned and reused whole). A tail smaller than one
//! segment is left unused. Exported capacity = physical bytes - over-provisioning - metadata.
//!
//! Owns the arithmetic of the layout (segment sizes, blocks per segment, where chunks fit).
//! Called by format, open and every layer that turns a block number into a place.

use crate::device::BLOCK_SIZE;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// Fewest segments a backing must provide.
pub const MIN_SEGMENTS: u64 = 16;
/// Segment count the default segment size aims for. Cleaning separates lifetimes only
/// when it has hundreds of segments to choose from (every stream holds an open segment):
/// at 8 GiB, 82 segments of 128 MiB left zipf:0.99 at WAF 1.264 with online streams,
/// 642 of 16 MiB give 1.229 (one stream: 1.90 and 1.97; `docs/waf.md`, "Capacity and
/// segments"). A backing of 128 GiB or more still gets [`MAX_DEFAULT_SEGMENT_BYTES`]
/// segments, the size of a flash superblock, so the SSD below never has to clean.
pub const TARGET_SEGMENTS: u64 = 512;
/// Largest default segment size.
pub const MAX_DEFAULT_SEGMENT_BYTES: u64 = 256 << 20;
/// Smallest default segment size.
pub const MIN_DEFAULT_SEGMENT_BYTES: u64 = 1 << 20;
/// Smallest segment size accepted when given explicitly (tiny geometries for tests).
pub const MIN_SEGMENT_BYTES: u64 = 64 << 10;
/// Largest segment size accepted.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;
/// Default flash page (block patching unit).
pub const DEFAULT_FLASH_PAGE_BYTES: u32 = 16 << 10;
/// Largest flash page: a FLUSH pads a chunk to the page, and the staging slot that holds
/// the chunk is sized for a full chunk padded to this (see `staging::CHUNK_BUF_BLOCKS`).
pub const MAX_FLASH_PAGE_BYTES: u32 = 1 << 20;
/// Default over-provisioning, per mille of the physical size.
pub const DEFAULT_OP_PERMILLE: u32 = 200;
/// Physical block numbers are u32 in the map (sentinel excluded): 16 TiB of backing.
pub const MAX_PHYSICAL_BLOCKS: u64 = u32::MAX as u64 - 1;

/// What a user may choose at format time. `None` means "pick the default".
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FormatOptions {
    /// Segment size in bytes (power of two).
    pub segment_bytes: Option<u64>,
    /// Over-provisioning in per mille of physical size (e.g. 200 = 20%).
    pub op_permille: Option<u32>,
    /// Flash page size in bytes (power of two, 4 KiB .. segment size).
    pub flash_page_bytes: Option<u32>,
    /// Use only this many bytes of the backing (default: all of it).
    pub size_bytes: Option<u64>,
    /// Discard the whole log area at format. Right for SSDs (they learn everything is
    /// free); wrong for files, where the holes make every later synced write allocate
    /// blocks and commit file-system metadata. Stale logs are harmless either way: chunk
    /// summaries carry the format id.
    #[serde(default)]
    pub discard_log: bool,
}

/// Resolved geometry, as recorded in the superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    /// Bytes of backing in use (a whole number of segments).
    pub backing_bytes: u64,
    /// Segment size in bytes.
    pub segment_bytes: u64,
    /// Segments including the metadata segment 0.
    pub segment_count: u32,
    /// Flash page size in bytes.
    pub flash_page_bytes: u32,
    /// Over-provisioning per mille.
    pub op_permille: u32,
    /// Exported capacity in 4 KiB blocks.
    pub exported_blocks: u64,
}

impl Geometry {
    /// Resolves `opts` against a backing of `backing_size` bytes, validating everything.
    pub fn resolve(backing_size: u64, opts: &FormatOptions) -> Result<Geometry> {
        let bs = BLOCK_SIZE as u64;
        let usable = match opts.size_bytes {
            Some(s) if s > backing_size => {
                return Err(Error::TooSmall(format!(
                    "requested size {s} bytes but the backing has only {backing_size} bytes"
                )))
            }
            Some(s) => s,
            None => backing_size,
        };
        let segment_bytes = match opts.segment_bytes {
            Some(s) => {
                if !s.is_power_of_two() || !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&s) {
                    return Err(Error::InvalidParameters(format!(
                        "segment size {s} must be a power of two between {MIN_SEGMENT_BYTES} and {MAX_SEGMENT_BYTES} bytes"
                    )));
                }
                s
            }
            None => default_segment_bytes(usable),
        };
        let flash_page_bytes = opts.flash_page_bytes.unwrap_or(DEFAULT_FLASH_PAGE_BYTES);
        if !flash_page_bytes.is_power_of_two()
            || (flash_page_bytes as u64) < bs
            || flash_page_bytes > MAX_FLASH_PAGE_BYTES
            || flash_page_bytes as u64 * 4 > segment_bytes
        {
            return Err(Error::InvalidParameters(format!(
                "flash page size {flash_page_bytes} must be a power of two, at least 4096, at most {MAX_FLASH_PAGE_BYTES} and at most a quarter of the segment size ({segment_bytes})"
            )));
        }
        let op_permille = opts.op_permille.unwrap_or(DEFAULT_OP_PERMILLE);
        if !(10..=900).contains(&op_permille) {
            return Err(Error::InvalidParameters(format!(
                "over-provisioning {op_permille} per mille is outside 10..=900 (1% .. 90%)"
            )));
        }
        let segment_count = usable / segment_bytes;
        if segment_count < MIN_SEGMENTS {
            return Err(Error::TooSmall(format!(
                "{usable} bytes hold {segment_count} segments of {segment_bytes} bytes; at least {MIN_SEGMENTS} are needed (at least {} bytes)",
                MIN_SEGMENTS * segment_bytes
            )));
        }
        let backing_bytes = segment_count * segment_bytes;
        if backing_bytes / bs > MAX_PHYSICAL_BLOCKS {
            return Err(Error::InvalidParameters(format!(
                "backing of {backing_bytes} bytes exceeds the {} bytes (just under 16 TiB) this \
                 map format addresses; use --size",
                MAX_PHYSICAL_BLOCKS * bs
            )));
        }
        let op_bytes = backing_bytes * op_permille as u64 / 1000;
        let exported_bytes = backing_bytes - op_bytes - segment_bytes;
        let exported_blocks = exported_bytes / bs;
        // The log needs room beyond the exported data: the cleaner's reserve (two
        // segments by default) and one more to make progress with. Demand three spare
        // log segments, counted in the data blocks a segment holds beside its chunk
        // summaries (four counted in blocks, as before, is about as much on devices of
        // a few dozen segments, the smallest format allows). Counted in blocks, a device whose
        // log could not hold its exported capacity was accepted (1000 segments of 64 KiB
        // at 3%: 15,504 blocks exported, 14,985 data blocks in the log), and once it was
        // written whole the cleaner took one full victim after another and freed nothing
        // (found by review, 2026-11-29).
        let per_segment = crate::log::data_room_from((segment_bytes / bs) as u32, 0);
        let log_blocks = (segment_count - 1) * per_segment;
        if exported_blocks + 3 * per_segment > log_blocks {
            return Err(Error::InvalidParameters(format!(
                "over-provisioning {op_permille} per mille leaves fewer than 3 spare segments \
                 of data beside the exported capacity"
            )));
        }
        Ok(Geometry {
            backing_bytes,
            segment_bytes,
            segment_count: segment_count as u32,
            flash_page_bytes,
            op_permille,
            exported_blocks,
        })
    }

    /// Blocks per segment.
    pub fn blocks_per_segment(&self) -> u32 {
        (self.segment_bytes / BLOCK_SIZE as u64) as u32
    }

    /// Blocks per flash page.
    pub fn blocks_per_page(&self) -> u32 {
        self.flash_page_bytes / BLOCK_SIZE as u32
    }

    /// First physical block of segment `seg`.
    pub fn segment_start(&self, seg: u32) -> u64 {
        seg as u64 * self.blocks_per_segment() as u64
    }

    /// Segment holding physical block `pba`.
    pub fn segment_of(&self, pba: u64) -> u32 {
        (pba / self.blocks_per_segment() as u64) as u32
    }

    /// Whether a chunk can start at block `offset` of a segment: room for its summary
    /// block and at least one data block. Where it cannot, the segment is full.
    pub fn chunk_fits_at(&self, offset: u32) -> bool {
        offset as u64 + 2 <= self.blocks_per_segment() as u64
    }

    /// Total physical blocks in use.
    pub fn physical_blocks(&self) -> u64 {
        self.backing_bytes / BLOCK_SIZE as u64
    }

    /// Exported capacity in bytes.
    pub fn exported_bytes(&self) -> u64 {
        self.exported_blocks * BLOCK_SIZE as u64
    }

    /// Byte offset of superblock copy `i` (0 or 1).
    pub fn superblock_offset(i: usize, segment_bytes: u64) -> u64 {
        if i == 0 {
            0
        } else {
            segment_bytes - BLOCK_SIZE as u64
        }
    }
}

/// Largest power of two giving at least [`TARGET_SEGMENTS`] segments, clamped to
/// [`MIN_DEFAULT_SEGMENT_BYTES`] ..= [`MAX_DEFAULT_SEGMENT_BYTES`].
pub fn default_segment_bytes(backing: u64) -> u64 {
    let ideal = backing / TARGET_SEGMENTS;
    let pow = if ideal == 0 {
        1
    } else {
        1u64 << (63 - ideal.leading_zeros())
    };
    pow.clamp(MIN_DEFAULT_SEGMENT_BYTES, MAX_DEFAULT_SEGMENT_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// The spare is counted in data blocks: a log whose segments, less their chunk
    /// summaries, cannot hold the exported capacity and three segments more is refused.
    #[test]
    fn the_spare_is_counted_in_the_data_a_segment_holds() {
        let opts = FormatOptions {
            segment_bytes: Some(64 << 10),
            op_permille: Some(30),
            ..Default::default()
        };
        match Geometry::resolve(1000 << 16, &opts) {
            Err(Error::InvalidParameters(why)) => assert!(why.contains("spare"), "{why}"),
            other => panic!("a log smaller than its exported data was accepted: {other:?}"),
        }
        let g = Geometry::resolve(
            1000 << 16,
            &FormatOptions {
                op_permille: Some(120),
                ..opts
            },
        )
        .unwrap();
        let per = crate::log::data_room_from(g.blocks_per_segment(), 0);
        assert!(g.exported_blocks + 3 * per <= (g.segment_count as u64 - 1) * per);
    }

    #[test]
    fn defaults_for_two_gib() {
        let g = Geometry::resolve(2 * GIB, &FormatOptions::default()).unwrap();
        assert_eq!(g.segment_bytes, 4 << 20);
        assert_eq!(g.segment_count, 512);
        assert_eq!(g.flash_page_bytes, 16 << 10);
        assert_eq!(
            g.exported_blocks,
            (2 * GIB - 2 * GIB * 200 / 1000 - (4 << 20)) / 4096
        );
    }

    #[test]
    fn default_segment_is_capped_and_floored() {
        assert_eq!(default_segment_bytes(1 << 40), 256 << 20);
        assert_eq!(default_segment_bytes(128 * GIB), 256 << 20);
        assert_eq!(default_segment_bytes(100 * GIB), 128 << 20);
        assert_eq!(default_segment_bytes(8 * GIB), 16 << 20);
        assert_eq!(default_segment_bytes(10 << 20), 1 << 20);
    }

    #[test]
    fn too_small_names_the_problem() {
        let e = Geometry::resolve(15 << 20, &FormatOptions::default()).unwrap_err();
        assert!(matches!(e, Error::TooSmall(_)), "{e}");
        assert!(e.to_string().contains("at least 16"), "{e}");
    }

    #[test]
    fn bad_parameters_are_rejected() {
        let bad = [
            FormatOptions {
                segment_bytes: Some(3 << 20),
                ..Default::default()
            },
            FormatOptions {
                segment_bytes: Some(4096),
                ..Default::default()
            },
            FormatOptions {
                flash_page_bytes: Some(3000),
                ..Default::default()
            },
            FormatOptions {
                flash_page_bytes: Some(1 << 20),
                segment_bytes: Some(1 << 20),
                ..Default::default()
            },
            FormatOptions {
                op_permille: Some(5),
                ..Default::default()
            },
            FormatOptions {
                op_permille: Some(950),
                ..Default::default()
            },
        ];
        for o in bad {
            let e = Geometry::resolve(GIB, &o).unwrap_err();
            assert!(matches!(e, Error::InvalidParameters(_)), "{o:?}: {e}");
        }
    }

    #[test]
    fn size_option_limits_backing() {
        let g = Geometry::resolve(
            4 * GIB,
            &FormatOptions {
                size_bytes: Some(GIB),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(g.backing_bytes, GIB);
        assert!(Geometry::resolve(
            GIB,
            &FormatOptions {
                size_bytes: Some(2 * GIB),
                ..Default::default()
            }
        )
        .is_err());
    }
}
