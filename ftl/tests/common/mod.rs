//! Shared helpers for the ftl integration tests. What the cleaner's tests and the fuzz
//! targets share too lives in `ftl::model` (re-exported here).
#![allow(dead_code, unused_imports)]

use ftl::StreamId;

pub use ftl::model::tiny::{crash_ftl as tiny_crash, options as tiny, CrashFtl};
pub use ftl::model::{check_after_crash, check_read, checker, mem_ftl, MemFtl};

pub const S0: StreamId = StreamId(1);

/// Writes LBAs 0..48 (three tiny segments) in stream 1, `rounds` times over, each round
/// flushed and then handed to `after` (round number): every round but the last kills the
/// segments of the one before.
pub fn overwrite_rounds<D: ftl::BlockDevice, I: ftl::IndexStore>(
    f: &ftl::Ftl<D, I>,
    rounds: u64,
    mut after: impl FnMut(u64),
) {
    for round in 0..rounds {
        for l in 0..48 {
            f.write(l, &ftl::model::block_for(l, round * 100 + l + 1), false, S0)
                .unwrap();
        }
        f.flush().unwrap();
        after(round);
    }
}

/// Turns a hang into a failure: armed around one run of a crash harness, it aborts the
/// test process (the test binary fails, naming `what`) when the run has not ended within
/// `limit`, instead of leaving a deadlock to run into CI's time limit. A child process
/// registered with [`Watchdog::kill_on_expiry`] is killed first, so it does not outlive
/// the test.
pub struct Watchdog {
    done: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    child: std::sync::Arc<std::sync::atomic::AtomicI32>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub fn arm(what: String, limit: std::time::Duration) -> Self {
        use std::sync::atomic::{AtomicI32, Ordering};
        use std::sync::{Arc, Condvar, Mutex};
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let child = Arc::new(AtomicI32::new(0));
        let thread = {
            let (done, child) = (done.clone(), child.clone());
            std::thread::spawn(move || {
                let (m, cv) = &*done;
                let g = m.lock().unwrap_or_else(|e| e.into_inner());
                let (g, _) = cv
                    .wait_timeout_while(g, limit, |d| !*d)
                    .unwrap_or_else(|e| e.into_inner());
                if !*g {
                    // Past libtest's capture of `eprintln!`, which an abort never prints.
                    use std::io::Write;
                    let _ = writeln!(
                        std::io::stderr(),
                        "watchdog: {what} did not end within {limit:?}: a hang; aborting"
                    );
                    let pid = child.load(Ordering::SeqCst);
                    if pid > 0 {
                        // SAFETY: kill(2) of the test's own child process.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                    std::process::abort();
                }
            })
        };
        Watchdog {
            done,
            child,
            thread: Some(thread),
        }
    }

    /// Kills process `pid` before the abort, should the run hang (0: none, as once the
    /// child was reaped).
    pub fn kill_on_expiry(&self, pid: u32) {
        self.child
            .store(pid as i32, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (m, cv) = &*self.done;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Rewrites segment `seg`'s record in the index through `f`.
pub fn edit_segment_record(
    idx: &ftl::index::mem::MemIndex,
    seg: u32,
    f: impl FnOnce(&mut ftl::records::SegmentRecord),
) {
    use ftl::IndexStore;
    let key = ftl::index::Key::segment(seg);
    let rec = idx
        .load()
        .unwrap()
        .into_iter()
        .find(|(k, _)| *k == key)
        .unwrap()
        .1;
    let mut r = ftl::records::SegmentRecord::decode(&rec).unwrap();
    f(&mut r);
    idx.poke(key, r.encode());
}
