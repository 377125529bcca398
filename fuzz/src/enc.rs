//! Writes values in the byte format `arbitrary` 1.x decodes them from, so seed inputs
//! can be built from readable structures (the replay tests check that every seed
//! decodes back to the structure it was built from, so a change of format is caught).
//!
//! The format: integers little-endian in their width; `bool` one byte (bit 0); an enum's
//! variant a `u32` `x` with `(x * variants) >> 32 == index`, then its fields in order;
//! `Option` a bool then the value; a `Vec` (and `arbitrary_iter`) a `true` byte before
//! each element and a `false` byte after the last.

use crate::open_corrupt::{Case, Damage, IndexKey, Poke, Put};
use crate::ops::Op;

/// Bytes being built.
#[derive(Default, Debug, Clone)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }
    /// Variant `index` of an enum with `count` variants.
    pub fn variant(&mut self, index: u32, count: u32) -> &mut Self {
        let x = ((index as u64) << 32).div_ceil(count as u64);
        debug_assert_eq!((x * count as u64) >> 32, index as u64);
        self.u32(x as u32)
    }
    /// A sequence: `each` writes one element.
    pub fn seq<T>(&mut self, items: &[T], mut each: impl FnMut(&mut Self, &T)) -> &mut Self {
        for it in items {
            self.bool(true);
            each(self, it);
        }
        self.bool(false)
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.seq(v, |e, &b| {
            e.u8(b);
        })
    }
}

const OP_VARIANTS: u32 = 13;

/// Writes one [`Op`].
pub fn op(e: &mut Enc, op: &Op) {
    match *op {
        Op::Write {
            lba,
            blocks,
            fua,
            stream,
        } => e
            .variant(0, OP_VARIANTS)
            .u8(lba)
            .u8(blocks)
            .bool(fua)
            .u8(stream),
        Op::Read { lba, blocks } => e.variant(12, OP_VARIANTS).u8(lba).u8(blocks),
        Op::Trim { lba, blocks } => e.variant(1, OP_VARIANTS).u8(lba).u8(blocks),
        Op::WriteZeroes { lba, blocks } => e.variant(2, OP_VARIANTS).u8(lba).u8(blocks),
        Op::Flush => e.variant(3, OP_VARIANTS),
        Op::FuaWrite {
            lba,
            blocks,
            stream,
        } => e.variant(4, OP_VARIANTS).u8(lba).u8(blocks).u8(stream),
        Op::Checkpoint => e.variant(5, OP_VARIANTS),
        Op::Relocate { lba } => e.variant(6, OP_VARIANTS).u8(lba),
        Op::Clean { seg, max } => e.variant(7, OP_VARIANTS).u8(seg).u8(max),
        Op::Crash { seed } => e.variant(8, OP_VARIANTS).u64(seed),
        Op::Invalid { lba, blocks, kind } => e.variant(9, OP_VARIANTS).u64(lba).u8(blocks).u8(kind),
        Op::Fault { kind, seed } => e.variant(10, OP_VARIANTS).u8(kind).u64(seed),
        Op::Close => e.variant(11, OP_VARIANTS),
        // Added to the shared `ftl::model::ops::Op` after the format was fixed.
        Op::CloseStream { .. } | Op::Defrag { .. } => {
            panic!("{op:?} is not in the ops target's input format")
        }
    };
}

/// An `ops` input.
pub fn ops(list: &[Op]) -> Vec<u8> {
    let mut e = Enc::default();
    e.seq(list, op);
    e.0
}

fn put(e: &mut Enc, p: &Put) {
    e.u8(p.lba).u8(p.blocks).u8(p.stream).bool(p.trim);
}

fn damage(e: &mut Enc, d: &Damage) {
    match d {
        Damage::Bytes {
            block,
            offset,
            bytes,
            fix_crc,
        } => e
            .variant(0, 3)
            .u16(*block)
            .u16(*offset)
            .bytes(bytes)
            .bool(*fix_crc),
        Damage::Fill { block, byte } => e.variant(1, 3).u16(*block).u8(*byte),
        Damage::Copy { from, to } => e.variant(2, 3).u16(*from).u16(*to),
    };
}

fn key(e: &mut Enc, k: &IndexKey) {
    match k {
        IndexKey::Checkpoint => e.variant(0, 4),
        IndexKey::Segment(s) => e.variant(1, 4).u32(*s),
        IndexKey::MapPage(p) => e.variant(2, 4).u64(*p),
        IndexKey::Other(b) => e.variant(3, 4).bytes(b),
    };
}

fn poke(e: &mut Enc, p: &Poke) {
    match p {
        Poke::Raw { key: k, value } => {
            e.variant(0, 2);
            key(e, k);
            e.bytes(value);
        }
        Poke::Edit {
            record,
            offset,
            bytes,
            resize,
            fix_crc,
        } => {
            e.variant(1, 2).u8(*record).u16(*offset).bytes(bytes);
            match resize {
                Some(n) => e.bool(true).u16(*n),
                None => e.bool(false),
            };
            e.bool(*fix_crc);
        }
    }
}

/// An `open_corrupt` input.
pub fn case(c: &Case) -> Vec<u8> {
    let mut e = Enc::default();
    e.seq(&c.writes, put).bool(c.checkpoint).seq(&c.tail, put);
    e.seq(&c.damage, damage);
    match &c.poke {
        Some(p) => {
            e.bool(true);
            poke(&mut e, p);
        }
        None => {
            e.bool(false);
        }
    }
    e.bool(c.write_after);
    e.0
}
