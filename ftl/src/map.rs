//! The LBA -> physical map (L2P), paged: a bounded cache of map pages over the index.
//!
//! An entry is 8 bytes: physical block number in the low 32 bits and the crc32c of the
//! block's data in the high 32 bits, so a read can verify what it got and a relocation
//! can compare-and-swap the whole entry. `u64::MAX` means unmapped (reads zero).
//!
//! Entries live in pages of [`PAGE_ENTRIES`] (4 KiB). The truth is the last checkpoint's
//! pages in the index plus the log replayed since (recovery) and the changes made since
//! open; RAM holds a bounded cache of pages. A miss reads the page from the index
//! ([`PageReader`]); a page absent there is all unmapped.
//!
//! Cache rules (each keeps "the index plus the log" the truth):
//! 1. a changed page is dirty and is never evicted: the index holds an older copy;
//! 2. the checkpoint takes the dirty pages ([`L2p::take_dirty`]): they turn "writing" and
//!    stay unevictable until the commit that holds them returned ([`L2p::committed`]; a
//!    failed commit makes them dirty again, [`L2p::uncommitted`]), because a miss in
//!    between would read the copy the commit replaces;
//! 3. only clean pages are evicted (CLOCK: a page used since the hand last passed gets a
//!    second chance). When every cached page of a shard is dirty or writing the cache
//!    grows past its bound, and `dirty_pages` tells the engine a checkpoint is due; the
//!    commit that cleans them shrinks the shard back to its bound;
//! 4. a miss reads the index under its shard's lock, so two misses of one page cannot
//!    both insert it (the later one would overwrite the earlier one's changes).
//!
//! Owns the cached pages and their dirty/writing state. Changed only by the appender
//! (under the stripe locks), relocation (through the appender) and recovery; read by
//! everyone through `tables.rs`; the checkpoint takes its dirty pages.

use crate::error::Result;
use crate::records::PAGE_ENTRIES;
use crate::sync::{lock, AtomicU64, Mutex};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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

/// Where a missed page is read from: the index as the last committed checkpoint left it.
pub trait PageReader: Send + Sync {
    /// Entries of `page` (`None`: the index holds no such page, every entry unmapped).
    fn read_page(&self, page: u64) -> Result<Option<Vec<u64>>>;
}

/// A reader with no pages (tests).
#[cfg(test)]
pub struct NoPages;

#[cfg(test)]
impl PageReader for NoPages {
    fn read_page(&self, _page: u64) -> Result<Option<Vec<u64>>> {
        Ok(None)
    }
}

/// Bytes of RAM one cached page costs: its entries plus the slot and hash entry.
pub const PAGE_RAM_BYTES: u64 = (PAGE_ENTRIES * 8 + 64) as u64;

/// The least cache the map accepts, in pages (tests use it to make every few accesses
/// miss).
pub const MIN_CACHE_PAGES: u64 = 1;

/// The default map cache: 256 MiB, the whole map of a device of about 128 GiB (with
/// what a checkpoint copies, sled and the rest, a 15 TiB device then peaks at about
/// 1 GiB of RSS; 512 MiB peaked at 1.3 GiB).
pub const DEFAULT_CACHE_BYTES: u64 = 256 << 20;

const MAX_SHARDS: u64 = 64;

struct Slot {
    page: u64,
    entries: Box<[u64]>,
    /// Changed since the index copy (rule 1).
    dirty: bool,
    /// Taken by a checkpoint whose commit has not returned (rule 2).
    writing: bool,
    /// Used since the clock hand last passed (rule 3).
    referenced: bool,
}

#[derive(Default)]
struct Shard {
    slots: Vec<Slot>,
    at: HashMap<u64, usize>,
    hand: usize,
}

/// Cache figures, for `stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct MapCacheStats {
    /// The bound, in bytes of cached pages.
    pub capacity_bytes: u64,
    /// Bytes of the whole map (8 per exported block), cached or not.
    pub map_bytes: u64,
    pub cached_pages: u64,
    pub dirty_pages: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// The paged L2P table.
pub struct L2p {
    blocks: u64,
    pages: u64,
    reader: Arc<dyn PageReader>,
    shards: Box<[Mutex<Shard>]>,
    /// Pages a shard holds before it evicts.
    shard_cap: usize,
    capacity_pages: u64,
    cached: AtomicU64,
    dirty: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

/// The map pages holding `count` entries from `lba` (`None`: none, or a range past the
/// last LBA there can be).
fn pages_of(lba: u64, count: u64) -> Option<std::ops::RangeInclusive<u64>> {
    let end = lba.checked_add(count).filter(|_| count > 0)?;
    Some(lba / PAGE_ENTRIES as u64..=(end - 1) / PAGE_ENTRIES as u64)
}

impl L2p {
    /// A map of `blocks` entries over the pages `reader` holds, caching at most about
    /// `cache_bytes` of pages (at least [`MIN_CACHE_PAGES`]; never more than the map).
    pub fn new(blocks: u64, cache_bytes: u64, reader: Arc<dyn PageReader>) -> Self {
        let pages = blocks.div_ceil(PAGE_ENTRIES as u64);
        let capacity_pages = (cache_bytes / PAGE_RAM_BYTES)
            .max(MIN_CACHE_PAGES)
            .min(pages.max(1));
        let shards = (capacity_pages / 8).clamp(1, MAX_SHARDS);
        L2p {
            blocks,
            pages,
            reader,
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            shard_cap: capacity_pages.div_ceil(shards) as usize,
            capacity_pages,
            cached: AtomicU64::new(0),
            dirty: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// A map of `blocks` unmapped entries, all of it cached (tests).
    #[cfg(test)]
    pub fn unbounded(blocks: u64) -> Self {
        Self::new(blocks, u64::MAX, Arc::new(NoPages))
    }

    /// Number of pages.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Cache figures.
    pub fn cache_stats(&self) -> MapCacheStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MapCacheStats {
            capacity_bytes: self.capacity_pages * PAGE_RAM_BYTES,
            map_bytes: self.blocks * 8,
            cached_pages: get(&self.cached),
            dirty_pages: get(&self.dirty),
            hits: get(&self.hits),
            misses: get(&self.misses),
            evictions: get(&self.evictions),
        }
    }

    /// Bytes of RAM the cached pages use.
    pub fn ram_bytes(&self) -> u64 {
        self.cached.load(Ordering::Relaxed) * PAGE_RAM_BYTES
    }

    /// Dirty pages (changed since the index copy, not yet taken by a checkpoint).
    pub fn dirty_pages(&self) -> u64 {
        self.dirty.load(Ordering::Relaxed)
    }

    /// The cache's bound, in pages.
    pub fn capacity_pages(&self) -> u64 {
        self.capacity_pages
    }

    /// True when the cache is smaller than the map and an eighth of it is dirty: only a
    /// checkpoint makes dirty pages evictable (rule 3). A cache that holds the whole map
    /// never needs one.
    pub fn wants_checkpoint(&self) -> bool {
        self.partial() && self.dirty_pages() > (self.capacity_pages / 8).max(1)
    }

    /// True when a quarter of the cache is dirty: writers checkpoint themselves (the
    /// background checkpoint [`wants_checkpoint`](Self::wants_checkpoint) asks for did
    /// not keep up, or there is none). The checkpoint copies the dirty pages (rule 2), so
    /// this also bounds that copy to a quarter of the cache.
    pub fn over_bound(&self) -> bool {
        self.partial() && self.dirty_pages() > (self.capacity_pages / 4).max(1)
    }

    /// True when the cache is smaller than the map (misses read the index).
    pub fn partial(&self) -> bool {
        self.capacity_pages < self.pages
    }

    /// True when half the cache is dirty: a writer waits for a checkpoint under way
    /// instead of going on (only a checkpoint makes dirty pages evictable, and writers
    /// that went on while a slow one ran grew the cache without bound; found by review,
    /// 2026-11-27).
    pub fn at_limit(&self) -> bool {
        self.partial() && self.dirty_pages() > (self.capacity_pages / 2).max(2)
    }

    fn shard(&self, page: u64) -> &Mutex<Shard> {
        &self.shards[(page % self.shards.len() as u64) as usize]
    }

    /// Runs `f` on the cached page `page` (loading it on a miss, rule 4) with the shard
    /// locked.
    fn with_page<R>(&self, page: u64, f: impl FnOnce(&mut Slot) -> R) -> Result<R> {
        let mut sh = lock(self.shard(page));
        if let Some(&i) = sh.at.get(&page) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            let slot = &mut sh.slots[i];
            slot.referenced = true;
            return Ok(f(slot));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let len = self.page_len(page);
        // An evicted page's buffer is reused: allocating one per miss and freeing one per
        // eviction from whichever thread missed spread the cache over every thread's
        // malloc arena (the resident set grew by the cache's size per reading thread).
        let mut entries = match self.evict_for_one(&mut sh) {
            Some(b) if b.len() == len => b,
            _ => vec![u64::MAX; len].into_boxed_slice(),
        };
        self.read_into(page, &mut entries)?;
        let slot = Slot {
            page,
            entries,
            dirty: false,
            writing: false,
            referenced: true,
        };
        let n = sh.slots.len();
        sh.at.insert(page, n);
        sh.slots.push(slot);
        self.cached.fetch_add(1, Ordering::Relaxed);
        Ok(f(&mut sh.slots[n]))
    }

    /// Makes room for one more page in the shard: evicts clean pages the clock picks
    /// while the shard is at its bound (rule 3; a shard that grew past it while its pages
    /// were dirty shrinks back here, or when they are committed). Returns the last
    /// evicted page's buffer.
    fn evict_for_one(&self, sh: &mut Shard) -> Option<Box<[u64]>> {
        self.shrink(sh, self.shard_cap.saturating_sub(1))
    }

    /// Evicts clean pages the clock picks until the shard holds at most `keep` (or only
    /// dirty and writing ones are left). Returns the last evicted page's buffer.
    fn shrink(&self, sh: &mut Shard, keep: usize) -> Option<Box<[u64]>> {
        let mut buf = None;
        while sh.slots.len() > keep {
            let Some(h) = Self::clock_victim(sh) else { break };
            let gone = sh.slots.swap_remove(h);
            sh.at.remove(&gone.page);
            if let Some(moved) = sh.slots.get(h) {
                sh.at.insert(moved.page, h);
            }
            self.cached.fetch_sub(1, Ordering::Relaxed);
            self.evictions.fetch_add(1, Ordering::Relaxed);
            buf = Some(gone.entries);
        }
        buf
    }

    /// A clean page not used since the hand last passed, if any (two sweeps at most).
    fn clock_victim(sh: &mut Shard) -> Option<usize> {
        let n = sh.slots.len();
        for _ in 0..2 * n {
            let h = sh.hand % n;
            sh.hand = h + 1;
            let s = &mut sh.slots[h];
            if s.dirty || s.writing {
                continue;
            }
            if !s.referenced {
                return Some(h);
            }
            s.referenced = false;
        }
        None
    }

    /// Fills `entries` with `page` as the index holds it (unmapped where it holds none).
    fn read_into(&self, page: u64, entries: &mut [u64]) -> Result<()> {
        entries.fill(u64::MAX);
        if let Some(stored) = self.reader.read_page(page)? {
            for (d, s) in entries.iter_mut().zip(stored) {
                *d = s;
            }
        }
        Ok(())
    }

    fn page_len(&self, page: u64) -> usize {
        let start = page * PAGE_ENTRIES as u64;
        (self.blocks.saturating_sub(start)).min(PAGE_ENTRIES as u64) as usize
    }

    fn split(lba: u64) -> (u64, usize) {
        (lba / PAGE_ENTRIES as u64, (lba % PAGE_ENTRIES as u64) as usize)
    }

    /// Current entry of `lba` (caller checked range).
    pub fn get(&self, lba: u64) -> Result<MapEntry> {
        let (page, i) = Self::split(lba);
        self.with_page(page, |s| MapEntry(s.entries[i]))
    }

    /// Reads the entry of `lba` and, when `f` returns a new one, stores it (marking the
    /// page dirty), in one step under the page's lock. Returns the entry `f` saw.
    pub fn update(&self, lba: u64, f: impl FnOnce(MapEntry) -> Option<MapEntry>) -> Result<MapEntry> {
        let (page, i) = Self::split(lba);
        self.with_page(page, |s| {
            let old = MapEntry(s.entries[i]);
            if let Some(new) = f(old) {
                s.entries[i] = new.0;
                if !s.dirty {
                    s.dirty = true;
                    self.dirty.fetch_add(1, Ordering::Relaxed);
                }
            }
            old
        })
    }

    /// Replaces the entry, returning the old one, and marks its page dirty.
    pub fn swap(&self, lba: u64, e: MapEntry) -> Result<MapEntry> {
        self.update(lba, |_| Some(e))
    }

    /// True when every page of `lba..lba + count` is in the cache. A look only: nothing
    /// is loaded, and a page may be evicted right after. A shard whose lock is held
    /// counts as a miss: its holder may be reading the index (map rule 4), and the caller
    /// must not wait for that. A cache that holds the whole map starts empty after an open
    /// too and reads each page on first use: it said "cached" for every page, and the
    /// ublk edge read the index on its queue thread, every other request of the queue
    /// waiting behind the read (found by review, 2026-11-29).
    pub fn cached(&self, lba: u64, count: u64) -> bool {
        let Some(pages) = pages_of(lba, count) else {
            return true;
        };
        pages.into_iter().all(|p| match self.shard(p).try_lock() {
            Ok(sh) => sh.at.contains_key(&p),
            Err(_) => false,
        })
    }

    /// Loads the pages of `lba..lba + count` into the cache, so the changes that follow
    /// are unlikely to miss (a miss can fail; a trim changes several entries).
    pub fn prefetch(&self, lba: u64, count: u64) -> Result<()> {
        for p in pages_of(lba, count).into_iter().flatten() {
            self.with_page(p, |_| ())?;
        }
        Ok(())
    }

    /// Takes every dirty page for a checkpoint (rule 2): returns copies of their entries
    /// and marks them writing until [`committed`](Self::committed) or
    /// [`uncommitted`](Self::uncommitted).
    pub fn take_dirty(&self) -> Vec<(u64, Vec<u64>)> {
        let mut out = Vec::new();
        for sh in self.shards.iter() {
            let mut sh = lock(sh);
            for s in sh.slots.iter_mut().filter(|s| s.dirty) {
                s.dirty = false;
                s.writing = true;
                out.push((s.page, s.entries.to_vec()));
            }
        }
        self.dirty.fetch_sub(out.len() as u64, Ordering::Relaxed);
        out.sort_unstable_by_key(|p| p.0);
        out
    }

    /// The commit holding `pages` returned Ok: they may be evicted once clean.
    pub fn committed(&self, pages: &[u64]) {
        self.set_writing_done(pages, false);
    }

    /// The commit holding `pages` failed: they are dirty again (the next checkpoint
    /// writes them).
    pub fn uncommitted(&self, pages: &[u64]) {
        self.set_writing_done(pages, true);
    }

    fn set_writing_done(&self, pages: &[u64], redirty: bool) {
        for &p in pages {
            let mut sh = lock(self.shard(p));
            if let Some(&i) = sh.at.get(&p) {
                let s = &mut sh.slots[i];
                s.writing = false;
                if redirty && !s.dirty {
                    s.dirty = true;
                    self.dirty.fetch_add(1, Ordering::Relaxed);
                }
            }
            // A shard its dirty pages grew past its bound shrinks back once they are
            // clean, not only at its next miss: one whose pages were then only hit kept
            // them for good, the cache over its budget (found by review, 2026-11-29).
            if !redirty {
                self.shrink(&mut sh, self.shard_cap);
            }
        }
    }

    /// Calls `f(page, entries)` for every page in order: the cached copy, or the index's
    /// (read without caching it). For the checker and tools; O(map).
    pub fn for_each_page(&self, mut f: impl FnMut(u64, &[u64])) -> Result<()> {
        self.try_for_each_page(|p, entries| {
            f(p, entries);
            Ok(())
        })
    }

    /// [`L2p::for_each_page`], stopping at `f`'s first error (and returning it).
    pub fn try_for_each_page(&self, f: impl FnMut(u64, &[u64]) -> Result<()>) -> Result<()> {
        self.try_for_pages(0..self.pages, f)
    }

    /// [`L2p::try_for_each_page`] over the pages in `pages` (those past the map's end
    /// left out).
    pub fn try_for_pages(
        &self,
        pages: std::ops::Range<u64>,
        mut f: impl FnMut(u64, &[u64]) -> Result<()>,
    ) -> Result<()> {
        let mut buf = vec![u64::MAX; PAGE_ENTRIES];
        for p in pages.start..pages.end.min(self.pages) {
            let len = self.page_len(p);
            let cached = {
                let sh = lock(self.shard(p));
                sh.at.get(&p).map(|&i| sh.slots[i].entries.to_vec())
            };
            match cached {
                Some(e) => f(p, &e)?,
                None => {
                    self.read_into(p, &mut buf[..len])?;
                    f(p, &buf[..len])?;
                }
            }
        }
        Ok(())
    }

}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn entry_packing() {
        let e = MapEntry::new(7, 0xabcd_ef01);
        assert_eq!(e.pba(), Some(7));
        assert_eq!(e.crc(), 0xabcd_ef01);
        assert_eq!(MapEntry::UNMAPPED.pba(), None);
    }

    #[test]
    fn swap_and_dirty() {
        let m = L2p::unbounded(2000);
        assert_eq!(m.swap(600, MapEntry::new(1, 2)).unwrap(), MapEntry::UNMAPPED);
        assert_eq!(m.swap(600, MapEntry::new(3, 4)).unwrap(), MapEntry::new(1, 2));
        assert_eq!(m.get(600).unwrap(), MapEntry::new(3, 4));
        let taken = m.take_dirty();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].0, 1);
        assert!(m.take_dirty().is_empty());
        assert_eq!(m.pages(), 4);
        let (mut lens, mut mapped) = (Vec::new(), Vec::new());
        m.for_each_page(|p, e| {
            lens.push(e.len());
            let base = p * PAGE_ENTRIES as u64;
            mapped.extend(e.iter().enumerate().filter(|&(_, &x)| x != u64::MAX).map(|(i, &x)| (base + i as u64, MapEntry(x))));
        })
        .unwrap();
        assert_eq!(mapped, vec![(600, MapEntry::new(3, 4))]);
        assert_eq!(lens, vec![512, 512, 512, 2000 - 3 * 512]);
        for p in 0..4 {
            m.swap(p * 512, MapEntry::new(1, 2)).unwrap();
        }
        assert!(!m.wants_checkpoint(), "the whole map is cached: never");
    }

    /// A cache that holds the whole map starts empty too (an open): its pages are misses
    /// until read, so the callers that must not wait for the index (the ublk edge, a
    /// writer about to take its stream's lock) load them first.
    #[test]
    fn a_whole_map_cache_says_which_pages_it_has_not_read_yet() {
        let store = Arc::new(Pages::default());
        let blocks = 4 * PAGE_ENTRIES as u64;
        store.0.lock().unwrap().insert(1, vec![7; PAGE_ENTRIES]);
        let m = L2p::new(blocks, u64::MAX, store.clone());
        assert!(!m.partial());
        let page1 = PAGE_ENTRIES as u64;
        assert!(!m.cached(page1, 1), "page 1 not read yet");
        assert!(!m.cached(0, 2 * page1), "pages 0 and 1 not read yet");
        m.prefetch(page1, 1).unwrap();
        assert_eq!(store.1.load(Ordering::Relaxed), 1);
        assert!(m.cached(page1 + 5, 3));
        assert!(!m.cached(0, 2 * page1), "page 0 still not read");
        assert_eq!(m.get(page1 + 5).unwrap(), MapEntry(7));
        assert_eq!(store.1.load(Ordering::Relaxed), 1, "a hit reads nothing");
    }

    /// An index stand-in: pages a "checkpoint" committed.
    #[derive(Default)]
    struct Pages(std::sync::Mutex<BTreeMap<u64, Vec<u64>>>, AtomicU64);

    impl PageReader for Pages {
        fn read_page(&self, page: u64) -> Result<Option<Vec<u64>>> {
            self.1.fetch_add(1, Ordering::Relaxed);
            Ok(self.0.lock().unwrap().get(&page).cloned())
        }
    }

    fn checkpoint(m: &L2p, pages: &Pages) {
        let taken = m.take_dirty();
        let mut stored = pages.0.lock().unwrap();
        for (p, e) in &taken {
            stored.insert(*p, e.clone());
        }
        drop(stored);
        m.committed(&taken.iter().map(|t| t.0).collect::<Vec<_>>());
    }

    /// Rules 1 and 3: a bounded cache keeps dirty pages and evicts clean ones, and a page
    /// read back after eviction holds what was written.
    #[test]
    fn dirty_pages_stay_and_clean_ones_come_back_from_the_index() {
        let store = Arc::new(Pages::default());
        let blocks = 128 * PAGE_ENTRIES as u64;
        let m = L2p::new(blocks, MIN_CACHE_PAGES * PAGE_RAM_BYTES, store.clone());
        assert_eq!(m.capacity_pages(), MIN_CACHE_PAGES);
        let at = |p: u64| p * PAGE_ENTRIES as u64 + 3;
        // Dirty 64 pages: none may be evicted, the cache grows past its bound.
        for p in 0..64 {
            m.swap(at(p), MapEntry::new(p as u32 + 10, 1)).unwrap();
        }
        assert_eq!(m.cache_stats().cached_pages, 64);
        assert_eq!(m.cache_stats().evictions, 0);
        assert_eq!(m.dirty_pages(), 64);
        assert!(m.wants_checkpoint());
        checkpoint(&m, &store);
        assert_eq!(m.dirty_pages(), 0);
        assert!(!m.wants_checkpoint());
        // Other pages pass through: the clean ones are evicted, down to the bound.
        for p in 64..128 {
            assert_eq!(m.get(at(p)).unwrap(), MapEntry::UNMAPPED);
        }
        let s = m.cache_stats();
        assert!(s.evictions >= 64, "{s:?}");
        assert!(s.cached_pages <= MIN_CACHE_PAGES, "{s:?}");
        // Read back from the index.
        for p in 0..64 {
            assert_eq!(
                m.get(at(p)).unwrap(),
                MapEntry::new(p as u32 + 10, 1),
                "page {p} read back from the index"
            );
        }
        assert!(m.cache_stats().cached_pages <= MIN_CACHE_PAGES);
        assert!(store.1.load(Ordering::Relaxed) >= 64 + 64);
    }

    /// Rule 3: a shard that grew past its bound while its pages were dirty shrinks back
    /// once a checkpoint committed them, though none of its pages misses afterwards.
    #[test]
    fn a_shard_grown_by_dirty_pages_shrinks_once_committed() {
        let store = Arc::new(Pages::default());
        let e = PAGE_ENTRIES as u64;
        let m = L2p::new(16384 * e, 512 * PAGE_RAM_BYTES, store.clone());
        assert_eq!((m.shards.len(), m.shard_cap), (64, 8));
        // 129 dirty pages, all in shard 0.
        for k in 0..129 {
            m.swap(k * 64 * e, MapEntry::new(1, 1)).unwrap();
        }
        checkpoint(&m, &store);
        // Misses in the other shards only; shard 0's pages are only hit.
        for s in 1..64 {
            for k in 0..16 {
                m.get((k * 64 + s) * e).unwrap();
            }
        }
        m.get(0).unwrap();
        let c = m.cache_stats().cached_pages;
        assert!(c <= m.capacity_pages(), "{c} pages cached, over the bound");
        // Pages evicted read back what was committed.
        for k in 0..129 {
            assert_eq!(m.get(k * 64 * e).unwrap(), MapEntry::new(1, 1));
        }
    }

    /// Rule 2: pages a checkpoint took are not evicted before its commit returned, and a
    /// failed commit makes them dirty again.
    #[test]
    fn pages_being_written_are_not_evicted() {
        let store = Arc::new(Pages::default());
        let blocks = 64 * PAGE_ENTRIES as u64;
        let m = L2p::new(blocks, 0, store.clone());
        assert_eq!(m.capacity_pages(), MIN_CACHE_PAGES);
        m.swap(5, MapEntry::new(9, 9)).unwrap();
        let taken = m.take_dirty();
        assert_eq!(taken.len(), 1);
        // Many other pages pass through the cache while the commit is in flight.
        for round in 0..3 {
            for p in 1..64 {
                m.get(p * PAGE_ENTRIES as u64 + round).unwrap();
            }
        }
        assert_eq!(m.get(5).unwrap(), MapEntry::new(9, 9), "kept while writing");
        // The commit failed: dirty again, and still kept.
        m.uncommitted(&[0]);
        assert_eq!(m.dirty_pages(), 1);
        for p in 1..64 {
            m.get(p * PAGE_ENTRIES as u64).unwrap();
        }
        assert_eq!(m.get(5).unwrap(), MapEntry::new(9, 9));
        assert!(store.0.lock().unwrap().is_empty());
        checkpoint(&m, &store);
        assert_eq!(store.0.lock().unwrap()[&0][5], MapEntry::new(9, 9).0);
    }

    /// An index whose reads take a while, as sled's do: two misses of one page overlap.
    struct SlowPages(Arc<Pages>);

    impl PageReader for SlowPages {
        fn read_page(&self, page: u64) -> Result<Option<Vec<u64>>> {
            std::thread::sleep(std::time::Duration::from_micros(50));
            self.0.read_page(page)
        }
    }

    /// Many threads changing entries through a tiny cache lose no change (rule 4: a miss
    /// reads the index under its shard's lock; read outside it, two misses of one page
    /// both inserted it, and the later copy hid the earlier one's change).
    #[test]
    fn concurrent_updates_through_a_tiny_cache_lose_nothing() {
        let store = Arc::new(Pages::default());
        // More pages than are touched between checkpoints: clean pages are evicted at
        // the next miss, and pages are read again and again.
        let blocks = 1024 * PAGE_ENTRIES as u64;
        let m = Arc::new(L2p::new(blocks, 0, Arc::new(SlowPages(store.clone()))));
        // The threads walk the same pages in step (each its own LBA in them), so that
        // their misses of one page overlap.
        let lba_of = move |t: u64, i: u64| (i * 7919 * 4) % blocks + t;
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let m = m.clone();
                let store = store.clone();
                std::thread::spawn(move || {
                    for i in 0..3000u64 {
                        let lba = lba_of(t, i);
                        m.update(lba, |old| Some(MapEntry(old.0.wrapping_add(1)))).unwrap();
                        if i % 10 == 0 && t == 0 {
                            checkpoint(&m, &store);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut expect: HashMap<u64, u64> = HashMap::new();
        for t in 0..4u64 {
            for i in 0..3000u64 {
                let e = expect.entry(lba_of(t, i)).or_insert(u64::MAX);
                *e = e.wrapping_add(1);
            }
        }
        let misses = m.cache_stats().misses;
        for (&lba, &e) in &expect {
            assert_eq!(m.get(lba).unwrap().0, e, "lba {lba} ({misses} misses)");
        }
        assert!(misses > 1000, "only {misses} misses: the test did not run through misses");
    }

    /// Pages a checkpoint took.
    type Taken = Vec<(u64, Vec<u64>)>;

    #[derive(Debug, Clone)]
    enum Op {
        Set(u64, u32),
        Get(u64),
        /// A checkpoint takes the dirty pages; the commit comes `after` ops later (or
        /// at once), failing when `fail`.
        Take { fail: bool },
        Commit,
    }

    fn op(blocks: u64) -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0..blocks, any::<u32>()).prop_map(|(l, v)| Op::Set(l, v)),
            6 => (0..blocks).prop_map(Op::Get),
            1 => any::<bool>().prop_map(|fail| Op::Take { fail }),
            1 => Just(Op::Commit),
        ]
    }

    proptest::proptest! {
        /// The cache rules against a plain model: with a cache of two pages of twelve,
        /// checkpoints in flight and failing, every read returns the last value set, and
        /// after a checkpoint that commits with nothing changed since, the index holds
        /// every value (what a reopen would read).
        #[test]
        fn the_cache_never_serves_a_stale_page(ops in proptest::collection::vec(op(12 * 512), 1..400)) {
            let blocks = 12 * PAGE_ENTRIES as u64;
            let store = Arc::new(Pages::default());
            let m = L2p::new(blocks, 0, store.clone());
            let mut truth = vec![u64::MAX; blocks as usize];
            let mut in_flight: Option<(Taken, bool)> = None;
            let commit = |taken: Vec<(u64, Vec<u64>)>, fail: bool| {
                let pages: Vec<u64> = taken.iter().map(|t| t.0).collect();
                if fail {
                    m.uncommitted(&pages);
                } else {
                    let mut st = store.0.lock().unwrap();
                    for (p, e) in taken {
                        st.insert(p, e);
                    }
                    drop(st);
                    m.committed(&pages);
                }
            };
            for o in ops {
                match o {
                    Op::Set(l, v) => {
                        m.swap(l, MapEntry::new(v, v)).unwrap();
                        truth[l as usize] = MapEntry::new(v, v).0;
                    }
                    Op::Get(l) => proptest::prop_assert_eq!(m.get(l).unwrap().0, truth[l as usize]),
                    Op::Take { fail } => {
                        if let Some((t, f)) = in_flight.take() {
                            commit(t, f);
                        }
                        in_flight = Some((m.take_dirty(), fail));
                    }
                    Op::Commit => {
                        if let Some((t, f)) = in_flight.take() {
                            commit(t, f);
                        }
                    }
                }
            }
            if let Some((t, f)) = in_flight.take() {
                commit(t, f);
            }
            commit(m.take_dirty(), false);
            let reopened = L2p::new(blocks, 0, store.clone());
            for l in 0..blocks {
                proptest::prop_assert_eq!(reopened.get(l).unwrap().0, truth[l as usize], "lba {}", l);
            }
        }
    }
}
