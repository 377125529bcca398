//! The reference model: what each LBA may read, including after a crash.
//!
//! Shared by the property tests and the fuzz targets. Block contents are generated from
//! a (lba, tag) pair, tag 0 meaning zeros, so the model stores one u64 per written LBA
//! and can tell "another LBA's data" or garbage from a legitimately older version.
//!
//! Per LBA the model keeps the *current* tag (what a read must return now), the tag
//! *durable* at the last FLUSH (or FUA) covering it, and the tags written since. After a
//! crash an LBA may read the durable tag or any tag written since; once observed, that
//! value becomes both current and durable.

use crate::device::BLOCK_SIZE;
use std::collections::BTreeMap;

/// A version of a block: 0 = zeros.
pub type Tag = u64;

#[derive(Debug, Clone, Default)]
struct Slot {
    current: Tag,
    durable: Tag,
    since: Vec<Tag>,
}

/// Reference model of a block device with a volatile write cache.
#[derive(Debug, Clone, Default)]
pub struct Model {
    slots: BTreeMap<u64, Slot>,
    next_tag: Tag,
}

/// Contents of block `lba` at version `tag`.
pub fn block_for(lba: u64, tag: Tag) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    if tag == 0 {
        return b;
    }
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b[8..16].copy_from_slice(&tag.to_le_bytes());
    let mut x = lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ tag;
    for chunk in b[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    b
}

/// What a block read back is, judged against `lba`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    Tag(Tag),
    /// Data of another LBA, or bytes no write produced.
    Foreign,
}

/// Classifies bytes read from `lba`.
pub fn observe(lba: u64, data: &[u8]) -> Observed {
    if data.iter().all(|&b| b == 0) {
        return Observed::Tag(0);
    }
    let mut l = [0u8; 8];
    l.copy_from_slice(&data[..8]);
    let mut t = [0u8; 8];
    t.copy_from_slice(&data[8..16]);
    let tag = u64::from_le_bytes(t);
    if u64::from_le_bytes(l) == lba && tag != 0 && data == block_for(lba, tag).as_slice() {
        Observed::Tag(tag)
    } else {
        Observed::Foreign
    }
}

impl Model {
    pub fn new() -> Self {
        Model {
            slots: BTreeMap::new(),
            next_tag: 1,
        }
    }

    /// Records a write of `blocks` blocks at `lba`, issued but not yet durable; returns
    /// the bytes to write. A FUA write becomes durable only through [`Model::fua_completed`]
    /// once the FTL has returned `Ok` (one that fails promised nothing).
    pub fn write(&mut self, lba: u64, blocks: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(blocks as usize * BLOCK_SIZE);
        for l in lba..lba + blocks {
            let tag = self.next_tag;
            self.next_tag += 1;
            out.extend_from_slice(&block_for(l, tag));
            self.set(l, tag);
        }
        out
    }

    fn set(&mut self, lba: u64, tag: Tag) {
        let s = self.slots.entry(lba).or_default();
        s.current = tag;
        s.since.push(tag);
    }

    /// Records a trim / write-zeroes.
    pub fn trim(&mut self, lba: u64, blocks: u64) {
        for l in lba..lba + blocks {
            if self.slots.contains_key(&l) {
                self.set(l, 0);
            }
        }
    }

    /// Records that the FUA write of `blocks` blocks at `lba` (recorded with
    /// [`Model::write`] before it was issued) completed: those blocks are durable now. A
    /// FUA write that fails, or runs out of space part-way, promised nothing, so callers
    /// call this only on success.
    pub fn fua_completed(&mut self, lba: u64, blocks: u64) {
        for l in lba..lba + blocks {
            if let Some(s) = self.slots.get_mut(&l) {
                s.durable = s.current;
                s.since.clear();
            }
        }
    }

    /// Records a completed FLUSH.
    pub fn flush(&mut self) {
        for s in self.slots.values_mut() {
            s.durable = s.current;
            s.since.clear();
        }
    }

    /// Records the death of the server process with its staging area intact (`kill -9`,
    /// not a power cut): every completed write and trim survives, as after a FLUSH.
    pub fn process_died(&mut self) {
        self.flush();
    }

    /// The tag a read of `lba` must return now.
    pub fn expected(&self, lba: u64) -> Tag {
        self.slots.get(&lba).map_or(0, |s| s.current)
    }

    /// Tags `lba` may hold after a crash.
    pub fn allowed_after_crash(&self, lba: u64) -> Vec<Tag> {
        match self.slots.get(&lba) {
            None => vec![0],
            Some(s) => std::iter::once(s.durable)
                .chain(s.since.iter().copied())
                .collect(),
        }
    }

    /// After a crash: accepts what was observed at `lba` if allowed, and makes it the
    /// new current and durable value. Returns an error message if not allowed.
    pub fn settle_after_crash(&mut self, lba: u64, got: Observed) -> Result<(), String> {
        let allowed = self.allowed_after_crash(lba);
        match got {
            Observed::Tag(t) if allowed.contains(&t) => {
                if t != 0 || self.slots.contains_key(&lba) {
                    let s = self.slots.entry(lba).or_default();
                    s.current = t;
                    s.durable = t;
                    s.since.clear();
                }
                Ok(())
            }
            other => Err(format!(
                "lba {lba}: read {other:?} after crash, allowed {allowed:?}"
            )),
        }
    }

    /// Every LBA the model has seen written or trimmed.
    pub fn touched(&self) -> Vec<u64> {
        self.slots.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_distinguishable() {
        assert_eq!(observe(5, &block_for(5, 9)), Observed::Tag(9));
        assert_eq!(observe(6, &block_for(5, 9)), Observed::Foreign);
        assert_eq!(observe(5, &block_for(5, 0)), Observed::Tag(0));
        let mut b = block_for(5, 9);
        b[100] ^= 1;
        assert_eq!(observe(5, &b), Observed::Foreign);
    }

    #[test]
    fn crash_semantics() {
        let mut m = Model::new();
        m.write(1, 1);
        m.flush();
        let t1 = m.expected(1);
        m.write(1, 1);
        let t2 = m.expected(1);
        assert_eq!(m.allowed_after_crash(1), vec![t1, t2]);
        m.write(2, 1);
        m.fua_completed(2, 1);
        assert_eq!(m.allowed_after_crash(2), vec![m.expected(2)]);
        assert!(m.settle_after_crash(1, Observed::Tag(0)).is_err());
        m.settle_after_crash(1, Observed::Tag(t2)).unwrap();
        assert_eq!(m.allowed_after_crash(1), vec![t2]);
        m.trim(1, 1);
        assert_eq!(m.allowed_after_crash(1), vec![t2, 0]);
        assert_eq!(m.allowed_after_crash(99), vec![0]);
    }

    #[test]
    fn a_fua_write_is_durable_only_once_completed() {
        let mut m = Model::new();
        m.write(3, 2);
        m.flush();
        let old = m.expected(3);
        // Issued as FUA, not (yet) completed: old and new both allowed.
        m.write(3, 2);
        let new = m.expected(3);
        assert_eq!(m.allowed_after_crash(3), vec![old, new]);
        m.fua_completed(3, 2);
        assert_eq!(m.allowed_after_crash(3), vec![new]);
        assert_eq!(m.allowed_after_crash(4), vec![m.expected(4)]);
        // Other LBAs' unflushed writes stay undecided.
        m.write(7, 1);
        m.fua_completed(3, 1);
        assert_eq!(m.allowed_after_crash(7).len(), 2);
    }
}
