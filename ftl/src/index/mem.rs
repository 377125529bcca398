//! In-memory index store: every commit is atomic and immediately "durable" (it survives a
//! simulated crash of the device, as a real sled commit survives a power cut).

use super::{IndexReader, IndexStore, Op};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

type Records = Arc<Mutex<BTreeMap<Vec<u8>, Vec<u8>>>>;

/// In-memory [`IndexStore`].
pub struct MemIndex {
    map: Records,
    /// When set, commits fail (to test error paths) and change nothing.
    pub fail_commits: AtomicBool,
    /// When set, commits are applied and then report a failure (as sled can: the batch
    /// applied, the flush failed; the contract allows all or none of it to persist).
    pub fail_after_apply: AtomicBool,
    /// When set, commits fail as an index stuck after a failure does
    /// (`Error::IndexStuck`, `sled_store` rule 2) and change nothing.
    pub stuck: AtomicBool,
    /// Commits still allowed before every later one fails ([`MemIndex::fail_after`]).
    commits_left: std::sync::atomic::AtomicI64,
    /// Commits held before they apply ([`MemIndex::hold_commits_with`]).
    gate: Mutex<CommitGate>,
    gate_cv: Condvar,
}

/// Which commits [`MemIndex`] holds, and how many are held now.
#[derive(Default)]
struct CommitGate {
    kind: Option<u8>,
    held: usize,
}

impl Default for MemIndex {
    fn default() -> Self {
        MemIndex {
            map: Records::default(),
            fail_commits: AtomicBool::new(false),
            fail_after_apply: AtomicBool::new(false),
            stuck: AtomicBool::new(false),
            commits_left: std::sync::atomic::AtomicI64::new(-1),
            gate: Mutex::default(),
            gate_cv: Condvar::new(),
        }
    }
}

impl MemIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets `n` more commits through, then fails every later one (changing nothing): a
    /// crash between two commits of one checkpoint.
    pub fn fail_after(&self, n: u64) {
        self.commits_left.store(n as i64, Ordering::SeqCst);
    }

    /// A copy of the index as it is at one instant: `at_instant` runs while no commit
    /// can start or be half done, so a crash test can cut the device at the same instant
    /// (no commit lands between the two copies).
    pub fn snapshot_while<R>(&self, at_instant: impl FnOnce() -> R) -> Result<(MemIndex, R)> {
        let m = self.map.lock().map_err(|_| poisoned())?;
        let r = at_instant();
        Ok((
            MemIndex {
                map: Arc::new(Mutex::new(m.clone())),
                ..MemIndex::default()
            },
            r,
        ))
    }

    /// From now on a commit that puts or removes a key of `kind` (`Key::MAP_PAGE`, ...)
    /// blocks before it applies, until [`MemIndex::release_commits`]: a test drives other
    /// threads through the window of a checkpoint stuck there.
    pub fn hold_commits_with(&self, kind: u8) {
        self.gate_state().kind = Some(kind);
    }

    /// Lets held commits (and later ones) through.
    pub fn release_commits(&self) {
        self.gate_state().kind = None;
        self.gate_cv.notify_all();
    }

    /// Waits until a commit is held; false on timeout.
    pub fn wait_commit_held(&self, timeout: Duration) -> bool {
        let g = self.gate_state();
        let (g, _) = self
            .gate_cv
            .wait_timeout_while(g, timeout, |g| g.held == 0)
            .unwrap_or_else(|p| p.into_inner());
        g.held > 0
    }

    fn gate_state(&self) -> std::sync::MutexGuard<'_, CommitGate> {
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks while commits of a kind among `ops` are held.
    fn pass_gate(&self, ops: &[Op]) {
        let mut g = self.gate_state();
        let key = |op: &Op| match op {
            Op::Put(k, _) | Op::Remove(k) => k.first().copied(),
        };
        let held = |g: &CommitGate| g.kind.is_some() && ops.iter().any(|o| key(o) == g.kind);
        if !held(&g) {
            return;
        }
        g.held += 1;
        self.gate_cv.notify_all();
        let mut g = self
            .gate_cv
            .wait_while(g, |g| held(g))
            .unwrap_or_else(|p| p.into_inner());
        g.held -= 1;
    }

    /// Overwrites one value (for corruption tests).
    pub fn poke(&self, key: Vec<u8>, value: Vec<u8>) {
        if let Ok(mut m) = self.map.lock() {
            m.insert(key, value);
        }
    }
}

fn poisoned() -> Error {
    Error::Index("in-memory index lock poisoned".into())
}

struct MemReader(Records);

impl IndexReader for MemReader {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.0.lock().map_err(|_| poisoned())?.get(key).cloned())
    }
}

impl IndexStore for MemIndex {
    fn reader(&self) -> Arc<dyn IndexReader> {
        Arc::new(MemReader(self.map.clone()))
    }
    fn load_kind(&self, kind: u8) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let m = self.map.lock().map_err(|_| poisoned())?;
        Ok(m.range(vec![kind]..)
            .take_while(|(k, _)| k.first() == Some(&kind))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
    fn load(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let m = self.map.lock().map_err(|_| poisoned())?;
        Ok(m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }
    fn commit(&self, ops: Vec<Op>) -> Result<()> {
        self.pass_gate(&ops);
        let left = self
            .commits_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n > 0).then(|| n - 1)
            });
        if self.fail_commits.load(Ordering::SeqCst) || left == Err(0) {
            return Err(Error::Index("injected index commit failure".into()));
        }
        if self.stuck.load(Ordering::SeqCst) {
            return Err(Error::IndexStuck(
                "injected: an earlier commit failed".into(),
            ));
        }
        let mut m = self.map.lock().map_err(|_| poisoned())?;
        for op in ops {
            match op {
                Op::Put(k, v) => {
                    m.insert(k, v);
                }
                Op::Remove(k) => {
                    m.remove(&k);
                }
            }
        }
        if self.fail_after_apply.load(Ordering::SeqCst) {
            return Err(Error::Index(
                "injected index failure after the batch was applied".into(),
            ));
        }
        Ok(())
    }
    fn clear(&self) -> Result<()> {
        self.map.lock().map_err(|_| poisoned())?.clear();
        Ok(())
    }
    fn size_on_disk(&self) -> u64 {
        self.map
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum())
            .unwrap_or(0)
    }
}
