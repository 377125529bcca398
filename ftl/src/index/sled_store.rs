//! sled-backed index store. One tree; a checkpoint is one `apply_batch` (atomic) followed
//! by `flush` (durable). sled holds an exclusive lock on its directory, so a second server
//! cannot open the same index.

use super::{IndexStore, Op};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// sled-backed [`IndexStore`].
pub struct SledIndex {
    db: sled::Db,
    path: PathBuf,
}

fn err(path: &Path, e: sled::Error) -> Error {
    Error::Index(format!("{}: {e}", path.display()))
}

impl SledIndex {
    /// Opens (creating if needed) the index in directory `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let db = sled::Config::new()
            .path(path)
            .mode(sled::Mode::HighThroughput)
            .cache_capacity(64 << 20)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(ref io) if io.kind() == std::io::ErrorKind::WouldBlock => {
                    Error::Busy(format!("index {}", path.display()))
                }
                other => err(path, other),
            })?;
        Ok(SledIndex {
            db,
            path: path.to_path_buf(),
        })
    }

    /// Directory of the index.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl IndexStore for SledIndex {
    fn load(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.db
            .iter()
            .map(|r| {
                r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(|e| err(&self.path, e))
            })
            .collect()
    }
    fn commit(&self, ops: Vec<Op>) -> Result<()> {
        let mut batch = sled::Batch::default();
        for op in ops {
            match op {
                Op::Put(k, v) => batch.insert(k, v),
                Op::Remove(k) => batch.remove(k),
            }
        }
        self.db.apply_batch(batch).map_err(|e| err(&self.path, e))?;
        self.db.flush().map_err(|e| err(&self.path, e))?;
        Ok(())
    }
    fn clear(&self) -> Result<()> {
        self.db.clear().map_err(|e| err(&self.path, e))?;
        self.db.flush().map_err(|e| err(&self.path, e))?;
        Ok(())
    }
    fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_load_clear_and_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("idx");
        {
            let s = SledIndex::open(&p).unwrap();
            s.commit(vec![
                Op::Put(b"a".to_vec(), b"1".to_vec()),
                Op::Put(b"b".to_vec(), b"2".to_vec()),
            ])
            .unwrap();
            s.commit(vec![Op::Remove(b"a".to_vec())]).unwrap();
            assert!(matches!(
                SledIndex::open(&p),
                Err(Error::Busy(_)) | Err(Error::Index(_))
            ));
        }
        let s = SledIndex::open(&p).unwrap();
        assert_eq!(s.load().unwrap(), vec![(b"b".to_vec(), b"2".to_vec())]);
        s.clear().unwrap();
        assert!(s.load().unwrap().is_empty());
    }
}
