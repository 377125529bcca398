//! Map pages read back from the index on a cache miss of the map (`map.rs`), each checked
//! as recovery checks what it loads: its crc and version (`records::MapPage`), its key,
//! and every entry pointing into the log.
//!
//! Owns nothing but the reader; built by recovery for the map it hands the engine.

use super::{IndexReader, Key};
use crate::error::{Error, Result};
use crate::map::{MapEntry, PageReader};
use crate::records::{MapPage, PAGE_ENTRIES};
use std::sync::Arc;

/// Reads map pages from the index.
pub struct IndexPages {
    reader: Arc<dyn IndexReader>,
    /// Blocks the map holds (its pages: a record at or past the last is damage).
    blocks: u64,
    pages: u64,
    /// Entries point into `first_log..physical`.
    first_log: u64,
    physical: u64,
}

impl IndexPages {
    pub fn new(reader: Arc<dyn IndexReader>, blocks: u64, first_log: u64, physical: u64) -> Self {
        IndexPages {
            reader,
            blocks,
            pages: blocks.div_ceil(PAGE_ENTRIES as u64),
            first_log,
            physical,
        }
    }

    /// Decodes the value stored under `page`'s key and checks it.
    pub fn decode(&self, page: u64, value: &[u8]) -> Result<MapPage> {
        let p = MapPage::decode(value)?;
        if p.page != page || p.page >= self.pages {
            return Err(Error::Corrupt(format!("map page {} out of place", p.page)));
        }
        // Every entry of the page's blocks, and none mapped past the map's end (a rebuild
        // stores the last page whole). A short page read its missing entries as unmapped:
        // zeros instead of an error (found by review, 2026-11-29).
        let len = (self.blocks - page * PAGE_ENTRIES as u64).min(PAGE_ENTRIES as u64) as usize;
        if p.entries.len() < len
            || p.entries[len..]
                .iter()
                .any(|&e| MapEntry(e).pba().is_some())
        {
            return Err(Error::Corrupt(format!(
                "map page {page} holds {} entries where the map has {len}",
                p.entries.len()
            )));
        }
        if let Some(bad) = p.entries.iter().find(|&&e| {
            MapEntry(e)
                .pba()
                .is_some_and(|b| (b as u64) < self.first_log || b as u64 >= self.physical)
        }) {
            return Err(Error::Corrupt(format!(
                "map page {} points outside the log: {bad:#x}",
                p.page
            )));
        }
        Ok(p)
    }
}

impl PageReader for IndexPages {
    fn read_page(&self, page: u64) -> Result<Option<Vec<u64>>> {
        let Some(v) = self.reader.get(&Key::map_page(page))? else {
            return Ok(None);
        };
        Ok(Some(self.decode(page, &v)?.entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::mem::MemIndex;
    use crate::index::{IndexStore, Op};

    fn pages_over(blocks: u64, stored: &[(u64, Vec<u64>)]) -> IndexPages {
        let idx = MemIndex::new();
        let ops = stored
            .iter()
            .map(|(page, entries)| {
                let p = MapPage {
                    page: *page,
                    entries: entries.clone(),
                };
                Op::Put(Key::map_page(*page), p.encode())
            })
            .collect();
        idx.commit(ops).unwrap();
        IndexPages::new(idx.reader(), blocks, 16, 1 << 20)
    }

    /// A page holding fewer entries than the map's page has is damage (its missing
    /// entries read as unmapped: zeros instead of an error); the last page may be stored
    /// whole (a rebuild does), its entries past the map's end unmapped.
    #[test]
    fn a_short_page_is_damage_and_a_whole_last_page_is_not() {
        let unmapped = u64::MAX;
        let r = pages_over(1000, &[(0, vec![100])]);
        let e = r.read_page(0).expect_err("a short page refused");
        assert!(matches!(e, Error::Corrupt(_)), "{e}");
        // The last page (488 blocks) stored whole, or as long as it is.
        let mut whole = vec![unmapped; PAGE_ENTRIES];
        whole[0] = 100;
        let r = pages_over(1000, &[(1, whole.clone())]);
        assert_eq!(r.read_page(1).unwrap().unwrap()[0], 100);
        let r = pages_over(1000, &[(1, whole[..488].to_vec())]);
        assert!(r.read_page(1).unwrap().is_some());
        // A block mapped past the map's end is damage.
        whole[500] = 200;
        let r = pages_over(1000, &[(1, whole)]);
        assert!(matches!(r.read_page(1), Err(Error::Corrupt(_))));
        // A full page.
        let r = pages_over(1000, &[(0, vec![100; PAGE_ENTRIES])]);
        assert_eq!(r.read_page(0).unwrap().unwrap().len(), PAGE_ENTRIES);
    }
}
