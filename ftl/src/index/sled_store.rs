//! sled-backed index store. One tree; a commit is one `apply_batch` (atomic), then
//! `flush`, then an fdatasync of sled's data file (durable). sled holds an exclusive lock
//! on its directory, so a second server cannot open the same index.
//!
//! Durability rule: 1. a commit returns only after an fdatasync of `db` that began after
//! sled's `flush` returned. sled 0.34's `flush` ends with `sync_file_range`, which writes
//! the pages back but neither flushes the device's write cache nor the file's size (its
//! own `sync_all` runs on a background thread about every 500 ms, sled issue 1452): a
//! power cut right after a checkpoint's commit lost it while the segments it freed were
//! already reused (found by review, 2026-11-29). Test:
//! `tests::a_commit_syncs_the_data_file_before_it_returns`.
//!
//! Rule 2: a failed flush, fdatasync or batch fails every later commit until the index is
//! opened again. Linux reports a write-back error to a file once: the next fdatasync
//! returns 0 while the failed batch's pages may never reach the disk, and sled's recovery
//! stops at the first torn message, dropping every batch after it. A later commit that
//! "succeeded" freed segments its durable predecessor never freed, and writers reused
//! them (found by review, 2026-11-29). Test: `tests::a_failed_sync_fails_every_later_commit`.
//!
//! Rule 3: values past sled's inline limit (segment size / 4, 128 KiB) go to files of their
//! own in `blobs/`, which sled neither syncs nor names durably: rule 1 syncs every new
//! blob file and the directory too. The engine keeps its values far below the limit
//! (map pages 4 KiB, free records at most `engine::free::LIST_CAP` chunks); this covers
//! a leaf sled rewrites whole. Test: `tests::a_blob_value_is_synced_with_its_commit`.

use super::{IndexReader, IndexStore, Op};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// sled-backed [`IndexStore`].
pub struct SledIndex {
    db: sled::Db,
    path: PathBuf,
    /// sled's data file, for rule 1's fdatasync.
    data: std::fs::File,
    /// Rule 2: the first failure of a commit; every later commit fails with it.
    failed: std::sync::Mutex<Option<String>>,
    /// Rule 3: the blob files already synced (sled removes them as values change).
    blobs_synced: std::sync::Mutex<std::collections::HashSet<std::ffi::OsString>>,
    /// Test hook: the next fdatasync fails.
    #[cfg(test)]
    fail_next_sync: std::sync::atomic::AtomicBool,
    /// What `make_durable` did, in order (for the test of rule 1; one per index, so
    /// other tests committing meanwhile count nothing here).
    #[cfg(test)]
    steps: std::sync::Mutex<Vec<&'static str>>,
}

/// sled's own cache. The map's page cache (`map.rs`) is the cache that matters; sled
/// holds several times its `cache_capacity` in RAM (its issue 1309: "about ten times"):
/// with 64 MiB a 15 TiB device's index took 1.3-1.8 GiB of RSS.
pub const SLED_CACHE_BYTES: u64 = 16 << 20;

/// How long [`SledIndex::open`] waits out a lock before it reports the index busy.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// sled reports a held lock as an I/O error whose kind is `WouldBlock`, or (0.34) as one
/// wrapping it with the message "could not acquire lock".
fn is_lock_error(e: &sled::Error) -> bool {
    match e {
        sled::Error::Io(io) => {
            io.kind() == std::io::ErrorKind::WouldBlock
                || io.to_string().contains("could not acquire lock")
        }
        _ => false,
    }
}

fn err(path: &Path, e: sled::Error) -> Error {
    Error::Index(format!("{}: {e}", path.display()))
}

impl SledIndex {
    /// Whether directory `path` holds a sled database (its config and data files): the
    /// read-only tools refuse a directory without one instead of creating one in it.
    pub fn exists_at(path: &Path) -> bool {
        path.join("conf").is_file() || path.join("db").is_file()
    }

    /// Opens (creating if needed) the index in directory `path`. Another process (or
    /// handle) holding it is [`Error::Busy`]; sled lets go of its lock a moment after
    /// the last handle of a database is dropped, so a lock held for less than
    /// [`LOCK_WAIT`] (a format followed by an open) is waited out.
    pub fn open(path: &Path) -> Result<Self> {
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            let opened = sled::Config::new()
                .path(path)
                .mode(sled::Mode::HighThroughput)
                .cache_capacity(SLED_CACHE_BYTES)
                .open();
            match opened {
                Ok(db) => {
                    let io = |what: &str, e: std::io::Error| {
                        Error::Index(format!("{} ({what}): {e}", path.display()))
                    };
                    let data = std::fs::File::open(path.join("db"))
                        .map_err(|e| io("opening its data file", e))?;
                    // A new index's files are named durably: the directory, and the one
                    // it was created in.
                    sync_dir(path).map_err(|e| io("syncing its directory", e))?;
                    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                        sync_dir(parent).map_err(|e| io("syncing its parent directory", e))?;
                    }
                    return Ok(SledIndex {
                        db,
                        path: path.to_path_buf(),
                        data,
                        failed: Default::default(),
                        blobs_synced: Default::default(),
                        #[cfg(test)]
                        fail_next_sync: Default::default(),
                        #[cfg(test)]
                        steps: Default::default(),
                    });
                }
                Err(e) if is_lock_error(&e) => {
                    if std::time::Instant::now() >= deadline {
                        return Err(Error::Busy(format!("index {}", path.display())));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                // Damaged: say how to get a working one back (it said only sled's words).
                Err(e @ sled::Error::Corruption { .. }) => {
                    return Err(Error::IndexMismatch {
                        path: path.display().to_string(),
                        backing: "BACKING".into(),
                        why: format!("it is damaged ({e})"),
                    })
                }
                Err(other) => return Err(err(path, other)),
            }
        }
    }

    /// Directory of the index.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// sled's `flush`, then rule 1's fdatasync of its data file and rule 3's of new blob
    /// files.
    fn make_durable(&self) -> Result<()> {
        self.flush_sled()?;
        self.sync_blobs()?;
        self.sync_data_file()
    }

    /// Rule 2: runs one commit step unless an earlier one failed, and remembers its
    /// failure.
    fn step_unless_failed(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(first) = failed.as_ref() {
            return Err(Error::IndexStuck(format!(
                "{}: an earlier commit failed ({first}); nothing is committed until the \
                 index is opened again",
                self.path.display()
            )));
        }
        let r = f();
        if let Err(e) = &r {
            *failed = Some(e.to_string());
        }
        r
    }

    /// Rule 3: fdatasync of every blob file not synced yet, then of `blobs/`.
    fn sync_blobs(&self) -> Result<()> {
        let dir = self.path.join("blobs");
        let io = |what: &str, e: std::io::Error| {
            Error::Index(format!("{} ({what}): {e}", dir.display()))
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io("listing its blob files", e)),
        };
        let mut synced = self.blobs_synced.lock().unwrap_or_else(|p| p.into_inner());
        let mut present = std::collections::HashSet::new();
        let mut new = false;
        for entry in entries {
            let name = entry
                .map_err(|e| io("listing its blob files", e))?
                .file_name();
            if !synced.contains(&name) {
                match std::fs::File::open(dir.join(&name)) {
                    Ok(f) => f.sync_data().map_err(|e| io("syncing a blob file", e))?,
                    // Removed by sled since the listing: nothing to sync.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io("opening a blob file", e)),
                }
                new = true;
            }
            present.insert(name);
        }
        if new {
            sync_dir(&dir).map_err(|e| io("syncing the blob directory", e))?;
            #[cfg(test)]
            self.step("blobs");
        }
        *synced = present;
        Ok(())
    }

    /// sled's own flush (its last step `sync_file_range`: no cache flush, no size).
    fn flush_sled(&self) -> Result<()> {
        self.db.flush().map_err(|e| err(&self.path, e))?;
        #[cfg(test)]
        self.step("flush");
        Ok(())
    }

    /// fdatasync of sled's data file.
    fn sync_data_file(&self) -> Result<()> {
        #[cfg(test)]
        if self
            .fail_next_sync
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(Error::Index("fdatasync: injected failure".into()));
        }
        self.data
            .sync_data()
            .map_err(|e| Error::Index(format!("{} (fdatasync): {e}", self.path.display())))?;
        #[cfg(test)]
        self.step("sync");
        Ok(())
    }

    #[cfg(test)]
    fn step(&self, what: &'static str) {
        self.steps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what);
    }

    /// The steps `make_durable` took since the last call (test of rule 1).
    #[cfg(test)]
    fn take_steps(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.steps.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn sync_dir(p: &Path) -> std::io::Result<()> {
    std::fs::File::open(p)?.sync_all()
}

struct SledReader {
    db: sled::Db,
    path: PathBuf,
}

impl IndexReader for SledReader {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db
            .get(key)
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(|e| err(&self.path, e))
    }
}

impl IndexStore for SledIndex {
    fn reader(&self) -> std::sync::Arc<dyn IndexReader> {
        std::sync::Arc::new(SledReader {
            db: self.db.clone(),
            path: self.path.clone(),
        })
    }
    fn load_kind(&self, kind: u8) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.db
            .scan_prefix([kind])
            .map(|r| {
                r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(|e| err(&self.path, e))
            })
            .collect()
    }
    fn scan(&self, kind: Option<u8>, f: &mut super::ScanFn) -> Result<()> {
        let iter = match kind {
            Some(k) => self.db.scan_prefix([k]),
            None => self.db.iter(),
        };
        for r in iter {
            let (k, v) = r.map_err(|e| err(&self.path, e))?;
            f(&k, &v)?;
        }
        Ok(())
    }
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
        // Rule 2: nothing after a failure; rule 1.
        self.step_unless_failed(|| {
            self.db.apply_batch(batch).map_err(|e| err(&self.path, e))?;
            self.make_durable()
        })
    }
    fn clear(&self) -> Result<()> {
        self.step_unless_failed(|| {
            self.db.clear().map_err(|e| err(&self.path, e))?;
            self.make_durable()
        })
    }
    fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A damaged index names the way to a working one (`--rebuild-index`), not only
    /// sled's words.
    #[test]
    fn a_damaged_index_points_at_the_rebuild() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("idx");
        {
            let s = SledIndex::open(&p).unwrap();
            s.commit(vec![Op::Put(b"a".to_vec(), vec![7u8; 300])])
                .unwrap();
        }
        // Its configuration file (a damaged log tail sled takes for a torn write).
        let conf = p.join("conf");
        let mut bytes = std::fs::read(&conf).unwrap();
        for b in bytes.iter_mut().skip(4) {
            *b ^= 0x5a;
        }
        std::fs::write(&conf, &bytes).unwrap();
        let e = SledIndex::open(&p)
            .err()
            .expect("a damaged index does not open");
        let msg = e.to_string();
        assert!(matches!(e, Error::IndexMismatch { .. }), "{msg}");
        assert!(msg.contains("--rebuild-index"), "{msg}");
    }

    /// Rule 1: every commit and clear ends with an fdatasync of sled's data file.
    #[test]
    fn a_commit_syncs_the_data_file_before_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let s = SledIndex::open(&dir.path().join("idx")).unwrap();
        s.take_steps();
        s.commit(vec![Op::Put(b"a".to_vec(), b"1".to_vec())])
            .unwrap();
        // sled's flush ends with sync_file_range: the fdatasync comes after it.
        assert_eq!(s.take_steps(), ["flush", "sync"], "a commit");
        s.clear().unwrap();
        assert_eq!(s.take_steps(), ["flush", "sync"], "a clear");
    }

    /// Rule 2: after a failed fdatasync (whose pages may be lost though the next
    /// fdatasync returns 0), no later commit succeeds; a new open commits again.
    #[test]
    fn a_failed_sync_fails_every_later_commit() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("idx");
        {
            let s = SledIndex::open(&p).unwrap();
            s.commit(vec![Op::Put(b"a".to_vec(), b"1".to_vec())])
                .unwrap();
            s.fail_next_sync
                .store(true, std::sync::atomic::Ordering::SeqCst);
            assert!(s
                .commit(vec![Op::Put(b"b".to_vec(), b"2".to_vec())])
                .is_err());
            let later = s.commit(vec![Op::Put(b"c".to_vec(), b"3".to_vec())]);
            let msg = later.expect_err("a commit after a failed sync").to_string();
            assert!(msg.contains("an earlier commit failed"), "{msg}");
            assert!(s.clear().is_err());
        }
        let s = SledIndex::open(&p).unwrap();
        s.commit(vec![Op::Put(b"d".to_vec(), b"4".to_vec())])
            .unwrap();
    }

    /// Rule 3: a value sled writes to a file of its own is synced, with its directory,
    /// before the commit returns.
    #[test]
    fn a_blob_value_is_synced_with_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        let s = SledIndex::open(&dir.path().join("idx")).unwrap();
        s.take_steps();
        s.commit(vec![Op::Put(b"small".to_vec(), vec![1u8; 4096])])
            .unwrap();
        assert_eq!(s.take_steps(), ["flush", "sync"], "an inline value");
        s.commit(vec![Op::Put(b"big".to_vec(), vec![2u8; 300 << 10])])
            .unwrap();
        let blobs = std::fs::read_dir(dir.path().join("idx/blobs"))
            .unwrap()
            .count();
        assert!(blobs > 0, "sled wrote no blob file");
        assert_eq!(s.take_steps(), ["flush", "blobs", "sync"], "a blob value");
        s.commit(vec![Op::Put(b"small".to_vec(), vec![3u8; 4096])])
            .unwrap();
        assert_eq!(s.take_steps(), ["flush", "sync"], "no new blob");
    }

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
            // Held: busy, after waiting out LOCK_WAIT.
            let t = std::time::Instant::now();
            assert!(matches!(SledIndex::open(&p), Err(Error::Busy(_))));
            assert!(t.elapsed() >= LOCK_WAIT);
        }
        // Dropped a moment ago: opens (the lock sled lets go of late is waited out).
        for _ in 0..20 {
            drop(SledIndex::open(&p).unwrap());
        }
        let s = SledIndex::open(&p).unwrap();
        assert_eq!(s.load().unwrap(), vec![(b"b".to_vec(), b"2".to_vec())]);
        s.clear().unwrap();
        assert!(s.load().unwrap().is_empty());
    }
}
