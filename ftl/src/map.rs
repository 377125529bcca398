//! The in-memory LBA -> physical map (L2P).
//!
//! One `AtomicU64` per exported block: physical block number in the low 32 bits and the
//! crc32c of the block's data in the high 32 bits, so a read can verify what it got and a
//! relocation can compare-and-swap the whole entry. `u64::MAX` means unmapped (reads zero).
//! Cost: 8 bytes per block, plus one dirty bit per 512-entry page for checkpoints.
//!
//! Owns the entries and the dirty-page bitmap. Changed only by the appender (under the
//! stripe locks) and recovery; read by everyone through `tables.rs`; the checkpoint takes
//! its dirty pages.

use crate::records::PAGE_ENTRIES;
use crate::sync::AtomicU64;
use std::sync::atomic::Ordering;

/// A map entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MapEntry(pub u64);

impl MapEntry {
    /// The unmapped entry.
    pub const UNMAPPED: MapEntry = MapEntry(u64::MAX);

    /// Entry for data at physical block `pba` with checksum `crc`.
    pub fn new(pba: u32, crc: u32) -> Self {
        MapEntry(((crc as u64) << 32) | pba as u64)
    }
    /// True unless unmapped.
    pub fn is_mapped(self) -> bool {
        self != Self::UNMAPPED
    }
    /// Physical block, if mapped.
    pub fn pba(self) -> Option<u32> {
        self.is_mapped().then_some(self.0 as u32)
    }
    /// Data checksum (meaningless when unmapped).
    pub fn crc(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// The L2P table with dirty-page tracking.
pub struct L2p {
    entries: Box<[AtomicU64]>,
    dirty: Box<[AtomicU64]>,
}

impl L2p {
    /// All `blocks` entries unmapped, nothing dirty.
    pub fn new(blocks: u64) -> Self {
        let entries = (0..blocks).map(|_| AtomicU64::new(u64::MAX)).collect();
        let pages = blocks.div_ceil(PAGE_ENTRIES as u64);
        let dirty = (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        L2p { entries, dirty }
    }

    /// Number of pages.
    pub fn pages(&self) -> u64 {
        (self.entries.len() as u64).div_ceil(PAGE_ENTRIES as u64)
    }

    /// Bytes of RAM the entries use (8 per exported block).
    pub fn ram_bytes(&self) -> u64 {
        (self.entries.len() * 8) as u64
    }

    /// Bytes of RAM the dirty-page bitmap uses (1 bit per 512 entries).
    pub fn dirty_ram_bytes(&self) -> u64 {
        (self.dirty.len() * 8) as u64
    }

    /// Current entry of `lba` (caller checked range).
    pub fn get(&self, lba: u64) -> MapEntry {
        MapEntry(self.entries[lba as usize].load(Ordering::SeqCst))
    }

    /// Replaces the entry, returning the old one, and marks its page dirty.
    pub fn swap(&self, lba: u64, e: MapEntry) -> MapEntry {
        let old = MapEntry(self.entries[lba as usize].swap(e.0, Ordering::SeqCst));
        self.mark_dirty(lba / PAGE_ENTRIES as u64);
        old
    }


    /// Loads a page's entries (used by recovery; marks nothing dirty).
    pub fn load_page(&self, page: u64, entries: &[u64]) {
        let start = page as usize * PAGE_ENTRIES;
        for (i, &e) in entries.iter().enumerate() {
            if let Some(slot) = self.entries.get(start + i) {
                slot.store(e, Ordering::Relaxed);
            }
        }
    }

    /// Copies a page's entries.
    pub fn page(&self, page: u64) -> Vec<u64> {
        let start = (page as usize * PAGE_ENTRIES).min(self.entries.len());
        let end = (start + PAGE_ENTRIES).min(self.entries.len());
        self.entries[start..end]
            .iter()
            .map(|e| e.load(Ordering::SeqCst))
            .collect()
    }

    /// Marks a page dirty.
    pub fn mark_dirty(&self, page: u64) {
        self.dirty[(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::SeqCst);
    }

    /// Marks every page dirty (after recovery, so the next checkpoint writes everything).
    pub fn mark_all_dirty(&self) {
        for p in 0..self.pages() {
            self.mark_dirty(p);
        }
    }

    /// Clears and returns the dirty page numbers.
    pub fn take_dirty(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (w, word) in self.dirty.iter().enumerate() {
            let mut bits = word.swap(0, Ordering::SeqCst);
            while bits != 0 {
                let b = bits.trailing_zeros() as u64;
                out.push(w as u64 * 64 + b);
                bits &= bits - 1;
            }
        }
        out
    }

    /// Iterates over (lba, entry) of mapped blocks.
    pub fn iter_mapped(&self) -> impl Iterator<Item = (u64, MapEntry)> + '_ {
        self.entries.iter().enumerate().filter_map(|(i, e)| {
            let e = MapEntry(e.load(Ordering::Relaxed));
            e.is_mapped().then_some((i as u64, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_packing() {
        let e = MapEntry::new(7, 0xabcd_ef01);
        assert_eq!(e.pba(), Some(7));
        assert_eq!(e.crc(), 0xabcd_ef01);
        assert_eq!(MapEntry::UNMAPPED.pba(), None);
    }

    #[test]
    fn swap_and_dirty() {
        let m = L2p::new(2000);
        assert_eq!(m.swap(600, MapEntry::new(1, 2)), MapEntry::UNMAPPED);
        assert_eq!(m.swap(600, MapEntry::new(3, 4)), MapEntry::new(1, 2));
        assert_eq!(m.get(600), MapEntry::new(3, 4));
        assert_eq!(m.take_dirty(), vec![1]);
        assert!(m.take_dirty().is_empty());
        assert_eq!(m.pages(), 4);
        assert_eq!(m.page(3).len(), 2000 - 3 * 512);
        assert_eq!(m.iter_mapped().count(), 1);
    }
}
