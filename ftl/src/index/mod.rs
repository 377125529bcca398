//! The index: where checkpoints of the map and segment table persist (sled in production).
//!
//! Contract of every [`IndexStore`]: `commit` applies a batch atomically and durably (after
//! it returns Ok, a crash keeps all of the batch; if it fails or the process dies during it,
//! a crash keeps all or none of it). `load` returns every record. Keys are opaque bytes;
//! the [`Key`] helpers build them.

pub mod mem;
pub mod sled_store;

use crate::error::Result;

/// One change in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>),
}

/// Durable key-value store holding checkpoints.
pub trait IndexStore: Send + Sync {
    /// Every (key, value) pair, in key order.
    fn load(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Applies `ops` atomically and durably.
    fn commit(&self, ops: Vec<Op>) -> Result<()>;
    /// Removes everything (format), durably.
    fn clear(&self) -> Result<()>;
    /// Approximate bytes on disk, for stats.
    fn size_on_disk(&self) -> u64 {
        0
    }
}

impl<T: IndexStore + ?Sized> IndexStore for &T {
    fn load(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        (**self).load()
    }
    fn commit(&self, ops: Vec<Op>) -> Result<()> {
        (**self).commit(ops)
    }
    fn clear(&self) -> Result<()> {
        (**self).clear()
    }
    fn size_on_disk(&self) -> u64 {
        (**self).size_on_disk()
    }
}

impl<T: IndexStore + ?Sized> IndexStore for std::sync::Arc<T> {
    fn load(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        (**self).load()
    }
    fn commit(&self, ops: Vec<Op>) -> Result<()> {
        (**self).commit(ops)
    }
    fn clear(&self) -> Result<()> {
        (**self).clear()
    }
    fn size_on_disk(&self) -> u64 {
        (**self).size_on_disk()
    }
}

/// Key layout: a one-byte kind, then a big-endian number (so pages sort in order).
pub struct Key;

impl Key {
    pub const CHECKPOINT: u8 = b'c';
    pub const SEGMENT: u8 = b's';
    pub const MAP_PAGE: u8 = b'm';
    /// A segment freed since the checkpoint (`records::FreeRecord`).
    pub const FREE: u8 = b'f';

    pub fn checkpoint() -> Vec<u8> {
        vec![Self::CHECKPOINT]
    }
    pub fn segment(seg: u32) -> Vec<u8> {
        let mut k = vec![Self::SEGMENT];
        k.extend_from_slice(&seg.to_be_bytes());
        k
    }
    pub fn free(seg: u32) -> Vec<u8> {
        let mut k = vec![Self::FREE];
        k.extend_from_slice(&seg.to_be_bytes());
        k
    }
    pub fn map_page(page: u64) -> Vec<u8> {
        let mut k = vec![Self::MAP_PAGE];
        k.extend_from_slice(&page.to_be_bytes());
        k
    }
}
