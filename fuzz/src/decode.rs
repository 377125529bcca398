//! The `decode` target: arbitrary bytes through every on-disk decoder.
//!
//! Input: one selector byte, then the bytes to decode.
//! - bits 0..=2 (mod 7) pick the decoder: 0 superblock, 1 chunk summary, 2 segment
//!   record, 3 map page, 4 checkpoint record, 5 free record, 6 partial-checkpoint record;
//! - bit 4 ("fit"): first resize the bytes to the length the structure claims (a block
//!   for the superblock and summary, 32 bytes for a segment or free record, `20 + 8 * count` for
//!   a map page, `140 + 8 * streams` for a checkpoint), zero-padding or truncating;
//! - bit 3 ("fix crc"): then overwrite the last four bytes with the crc32c of the rest,
//!   so the fuzzer gets past the checksum to the field checks behind it.
//!
//! Properties: every decoder returns `Ok` or `Err` and never panics (the codec promises
//! never to allocate more than the input length; the replay test measures it); a value
//! that decodes and re-encodes decodes again to the same value.

use ftl::device::BLOCK_SIZE;
use ftl::records::{
    CheckpointRecord, FreeRecord, MapPage, PartialCheckpoint, SegmentRecord, PAGE_ENTRIES,
    PARTIAL_RECORD_BYTES, SEG_RECORD_BYTES,
};
use ftl::summary::ChunkSummary;
use ftl::superblock::Superblock;

/// Selector bit: fit the length.
pub const FIT: u8 = 0x10;
/// Selector bit: fix the trailing crc32c.
pub const FIX_CRC: u8 = 0x08;

/// The decoders, in selector order.
pub const DECODERS: [&str; 7] = [
    "superblock",
    "chunk summary",
    "segment record",
    "map page",
    "checkpoint record",
    "free record",
    "partial checkpoint",
];

fn le_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The input bytes as the decoder will see them (selector applied).
pub fn prepare(sel: u8, rest: &[u8]) -> Vec<u8> {
    let mut buf = rest.to_vec();
    if sel & FIT != 0 {
        let len = match (sel & 7) % 7 {
            0 | 1 => BLOCK_SIZE,
            2 => SEG_RECORD_BYTES,
            5 => 44 + 8 * (le_u32(&buf, 36).unwrap_or(0) as usize).min(64),
            6 => PARTIAL_RECORD_BYTES,
            3 => 20 + 8 * (le_u16(&buf, 6).unwrap_or(0) as usize).min(PAGE_ENTRIES),
            _ => 140 + 8 * (le_u32(&buf, 12).unwrap_or(0) as usize).min(64),
        };
        buf.resize(len, 0);
    }
    if sel & FIX_CRC != 0 && buf.len() >= 4 {
        let n = buf.len() - 4;
        let crc = crc32c(&buf[..n]);
        buf[n..].copy_from_slice(&crc.to_le_bytes());
    }
    buf
}

/// crc32c (Castagnoli), as the on-disk structures use it.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Whether `decode` accepted `buf`; if it did, its value re-encoded must decode again to
/// the same value (`what` names the structure in the violation).
fn round_trip<T: PartialEq + std::fmt::Debug, E: std::fmt::Debug>(
    buf: &[u8],
    what: &str,
    decode: impl Fn(&[u8]) -> Result<T, E>,
    encode: impl Fn(&T) -> Vec<u8>,
) -> Result<bool, String> {
    let Ok(v) = decode(buf) else {
        return Ok(false);
    };
    let again =
        decode(&encode(&v)).map_err(|e| format!("{what} re-encoded does not decode: {e:?}"))?;
    if again != v {
        return Err(format!("{what} round trip: {v:?} became {again:?}"));
    }
    Ok(true)
}

/// What a decode gave: whether it was accepted, or the violated property.
pub fn run(data: &[u8]) -> Result<Option<bool>, String> {
    let Some((&sel, rest)) = data.split_first() else {
        return Ok(None);
    };
    let buf = prepare(sel, rest);
    let which = (sel & 7) % 7;
    let ok = match which {
        0 => round_trip(&buf, "superblock", Superblock::decode, Superblock::encode)?,
        1 => match ChunkSummary::decode(&buf) {
            Ok(Some(s)) => {
                let mut out = vec![0u8; BLOCK_SIZE];
                // Encoding demands entries in ascending order within 2^32 of the first;
                // a decoded summary need not satisfy that, so only check when it encodes.
                if s.encode_into(&mut out).is_ok() {
                    let again = ChunkSummary::decode(&out)
                        .map_err(|e| format!("summary re-encoded does not decode: {e}"))?;
                    if again.as_ref() != Some(&s) {
                        return Err(format!("summary round trip: {s:?} became {again:?}"));
                    }
                }
                true
            }
            Ok(None) => false,
            Err(_) => false,
        },
        2 => round_trip(
            &buf,
            "segment record",
            SegmentRecord::decode,
            SegmentRecord::encode,
        )?,
        3 => match MapPage::decode(&buf) {
            Ok(p) => {
                if p.entries.len() > PAGE_ENTRIES {
                    return Err(format!(
                        "map page with {} entries accepted",
                        p.entries.len()
                    ));
                }
                let again = MapPage::decode(&p.encode())
                    .map_err(|e| format!("map page re-encoded does not decode: {e}"))?;
                if again != p {
                    return Err(format!("map page round trip: {p:?} became {again:?}"));
                }
                true
            }
            Err(_) => false,
        },
        5 => round_trip(&buf, "free record", FreeRecord::decode, FreeRecord::encode)?,
        6 => round_trip(
            &buf,
            "partial checkpoint",
            PartialCheckpoint::decode,
            PartialCheckpoint::encode,
        )?,
        _ => round_trip(
            &buf,
            "checkpoint",
            CheckpointRecord::decode,
            CheckpointRecord::encode,
        )?,
    };
    Ok(Some(ok))
}

/// libFuzzer entry: panics on any violated property.
pub fn fuzz(data: &[u8]) {
    if let Err(e) = run(data) {
        panic!("decode: {e}");
    }
}
