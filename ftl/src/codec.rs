//! Little-endian field codec with bounds checks, shared by every on-disk structure.
//! Decoding never panics and never allocates more than the input length.
//!
//! Called by every encoder and decoder of an on-disk structure; owns no state.

use crate::error::{Error, Result};

/// Cursor over bytes being decoded.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// Starts decoding `buf`; `what` names the structure in errors.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }

    /// Takes the next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                Error::Corrupt(format!(
                    "{}: truncated at byte {} (need {n} more)",
                    self.what, self.pos
                ))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// Moves to `offset`, a field's named place in the structure's layout.
    pub fn seek(&mut self, offset: usize) -> Result<&mut Self> {
        if offset > self.buf.len() {
            return Err(Error::Corrupt(format!(
                "{}: truncated before byte {offset}",
                self.what
            )));
        }
        self.pos = offset;
        Ok(self)
    }
}

/// Appends little-endian fields to a byte vector.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    /// Moves to `offset`, a field's named place in the structure's layout, padding with
    /// zeros. Fields are written in increasing offset order; each structure's layout
    /// test checks every named offset against what its encoder wrote.
    pub fn at(&mut self, offset: usize) -> &mut Self {
        debug_assert!(
            self.buf.len() <= offset,
            "field at {offset} overlaps the one before"
        );
        self.pad_to(offset)
    }
    /// Pads with zeros up to `len` bytes.
    pub fn pad_to(&mut self, len: usize) -> &mut Self {
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        self
    }
    /// Appends crc32c of everything written so far.
    pub fn crc(&mut self) -> &mut Self {
        let c = crc32c::crc32c(&self.buf);
        self.u32(c)
    }
}

/// Verifies that the last four bytes of `buf` are the crc32c of the rest.
pub fn check_trailing_crc(buf: &[u8], what: &str) -> Result<()> {
    if buf.len() < 4 {
        return Err(Error::Corrupt(format!(
            "{what}: {} bytes is too short",
            buf.len()
        )));
    }
    let (body, tail) = buf.split_at(buf.len() - 4);
    let stored = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let actual = crc32c::crc32c(body);
    if stored != actual {
        return Err(Error::Corrupt(format!(
            "{what}: checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let mut w = Writer::default();
        w.u8(1).u16(2).u32(3).u64(4).crc();
        let b = w.buf.clone();
        check_trailing_crc(&b, "t").unwrap();
        let mut r = Reader::new(&b, "t");
        assert_eq!(
            (
                r.u8().unwrap(),
                r.u16().unwrap(),
                r.u32().unwrap(),
                r.u64().unwrap()
            ),
            (1, 2, 3, 4)
        );
        assert!(r.u64().is_err());
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert!(check_trailing_crc(&bad, "t").is_err());
    }
}
