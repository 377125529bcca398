//! The index: where checkpoints of the map and segment table persist (sled in production).
//!
//! Contract of every [`IndexStore`]: `commit` applies a batch atomically and durably (after
//! it returns Ok, a crash keeps all of the batch; if it fails or the process dies during it,
//! a crash keeps all or none of it). `load` returns every record. Keys are opaque bytes;
//! the [`Key`] helpers build them. `load_kind` and `reader().get` see what the last
//! returned commit left (the map's cache reads its missed pages through a reader).

pub mod mem;
pub mod pages;
pub mod sled_store;

use crate::error::Result;
use std::sync::Arc;

/// One change in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>),
}

/// What [`IndexStore::scan`] calls with each (key, value) pair.
pub type ScanFn<'a> = dyn FnMut(&[u8], &[u8]) -> Result<()> + 'a;

/// Reads single records; owned, so the map can keep one for its misses.
pub trait IndexReader: Send + Sync {
    /// The value of `key`, if any.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
}

/// Durable key-value store holding checkpoints.
pub trait IndexStore: Send + Sync {
    /// Every (key, value) pair, in key order.
    fn load(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Every (key, value) pair whose key starts with `kind`, in key order.
    fn load_kind(&self, kind: u8) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(self
            .load()?
            .into_iter()
            .filter(|(k, _)| k.first() == Some(&kind))
            .collect())
    }
    /// Calls `f` with every (key, value) pair, or those whose key starts with `kind`,
    /// in key order, one at a time: the checker's pass over an index larger than memory
    /// (a map of 2^31 blocks is 16 GiB). The default holds them all (`load`); the sled
    /// store streams them. Stops at `f`'s first error.
    fn scan(&self, kind: Option<u8>, f: &mut ScanFn) -> Result<()> {
        let all = match kind {
            Some(k) => self.load_kind(k)?,
            None => self.load()?,
        };
        all.iter().try_for_each(|(k, v)| f(k, v))
    }
    /// A handle reading single records.
    fn reader(&self) -> Arc<dyn IndexReader>;
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
    fn load_kind(&self, kind: u8) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        (**self).load_kind(kind)
    }
    fn scan(&self, kind: Option<u8>, f: &mut ScanFn) -> Result<()> {
        (**self).scan(kind, f)
    }
    fn reader(&self) -> Arc<dyn IndexReader> {
        (**self).reader()
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
    fn load_kind(&self, kind: u8) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        (**self).load_kind(kind)
    }
    fn scan(&self, kind: Option<u8>, f: &mut ScanFn) -> Result<()> {
        (**self).scan(kind, f)
    }
    fn reader(&self) -> Arc<dyn IndexReader> {
        (**self).reader()
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
    /// A checkpoint committing its map pages in several batches is under way
    /// (`records::PartialCheckpoint`).
    pub const PARTIAL: u8 = b'p';

    /// Every kind of record the index holds.
    pub const KINDS: [u8; 5] = [
        Self::CHECKPOINT,
        Self::SEGMENT,
        Self::MAP_PAGE,
        Self::FREE,
        Self::PARTIAL,
    ];

    pub fn partial() -> Vec<u8> {
        vec![Self::PARTIAL]
    }
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
