//! Map pages read back from the index on a cache miss of the map (`map.rs`), each checked
//! as recovery checks what it loads: its crc and version (`records::MapPage`), its key,
//! and every entry pointing into the log.
//!
//! Owns nothing but the reader; built by recovery for the map it hands the engine.

use super::{IndexReader, Key};
use crate::error::{Error, Result};
use crate::map::{MapEntry, PageReader};
use crate::records::MapPage;
use std::sync::Arc;

/// Reads map pages from the index.
pub struct IndexPages {
    reader: Arc<dyn IndexReader>,
    /// Pages in the map (a record at or past it is damage).
    pages: u64,
    /// Entries point into `first_log..physical`.
    first_log: u64,
    physical: u64,
}

impl IndexPages {
    pub fn new(reader: Arc<dyn IndexReader>, pages: u64, first_log: u64, physical: u64) -> Self {
        IndexPages {
            reader,
            pages,
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
