//! Runs the FTL's blocking calls (WRITE, FLUSH, DISCARD, and the index reads of a READ
//! that misses the map cache) off the ublk queue threads.
//!
//! Contract:
//! - A queue thread never blocks on the FTL: [`Offload::run`] hands the call to a pool of
//!   worker threads and awaits its completion through the queue's own io_uring (a read of
//!   the calling tag's eventfd), so the other tags of the queue keep being served while a
//!   write waits for its chunk I/O or a FLUSH for its device sync.
//! - The job owns everything it touches (WRITE payloads are copied into the job), so a
//!   queue that is torn down while a job runs leaves nothing dangling.
//! - Many flushes waiting at once in the pool are what lets the FTL's group commit batch
//!   them (one device sync per group).
//! - FLUSHes have workers of their own ([`Lane::Flush`]): a FLUSH needs no free space,
//!   and queued behind writes paced by the cleaner's throttle or waiting for space on a
//!   full device (up to `space_wait` each, with 4 workers per queue of 128 tags) it took
//!   seconds, every fsync with it (found by review, 2026-11-27). It covers the writes
//!   completed before it was issued, never those still queued, so passing them is right.
//! - The result is the ublk completion value (bytes or 0, or a negative errno). A job that
//!   panics completes with -EIO; a pool that is gone completes with -EIO.
//!
//! Created by [`crate::daemon`], used by the queues of [`crate::ublk`]; a leaf.

use crate::output::errln;
use libublk::io::UblkQueue;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Which workers run a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// WRITE and DISCARD: they may wait for the throttle or for free space.
    Data,
    /// FLUSH: never queued behind those.
    Flush,
    /// The index reads of a READ's map cache misses ([`ftl::Ftl::prefetch_map`]): behind
    /// writes they would wait for the throttle, behind FLUSHes for device syncs, and in
    /// front of FLUSHes they would delay them.
    Map,
}

/// Fixed pools of worker threads running FTL calls for the queues, one per [`Lane`].
pub struct Offload {
    tx: Mutex<Option<[Sender<Job>; 3]>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Offload {
    /// Starts `n` workers (at least one) in each lane.
    pub fn new(n: usize) -> std::io::Result<Arc<Offload>> {
        let mut workers = Vec::new();
        let mut lane = |name: &str| -> std::io::Result<Sender<Job>> {
            let (tx, rx) = channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..n.max(1) {
                let rx = rx.clone();
                workers.push(
                    std::thread::Builder::new()
                        .name(format!("ftlblk-{name}{i}"))
                        .spawn(move || worker(&rx))?,
                );
            }
            Ok(tx)
        };
        let lanes = [lane("io")?, lane("flush")?, lane("map")?];
        Ok(Arc::new(Offload {
            tx: Mutex::new(Some(lanes)),
            workers: Mutex::new(workers),
        }))
    }

    /// Stops the workers once the queued jobs are done.
    pub fn shutdown(&self) {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|p| p.into_inner()));
        for w in workers {
            let _ = w.join();
        }
    }

    fn submit(&self, lane: Lane, job: Job) -> bool {
        match &*self.tx.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(lanes) => lanes[lane as usize].send(job).is_ok(),
            None => false,
        }
    }

    /// Runs `f` on a worker of `lane`; the calling tag awaits its eventfd `wake` on queue
    /// `q`.
    pub async fn run<F>(&self, q: &UblkQueue<'_>, wake: &TagEvent, lane: Lane, f: F) -> i32
    where
        F: FnOnce() -> i32 + Send + 'static,
    {
        let result = Arc::new(AtomicI32::new(PENDING));
        let slot = result.clone();
        let efd = wake.fd.clone();
        let job: Job = Box::new(move || {
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
                    errln!("ftlblk: panic in an I/O worker; completing with -EIO");
                    -libc::EIO
                });
            slot.store(r, Ordering::Release);
            signal(&efd);
        });
        if !self.submit(lane, job) {
            return -libc::EIO;
        }
        wake.wait(q).await;
        finished(&result)
    }
}

/// What a job not finished yet holds (no errno is this).
const PENDING: i32 = i32::MIN;

/// The job's result, once it stored one: the wake-up comes after the store, but a tag
/// whose eventfd could not be read (the blocking fallback's read failing) must not
/// complete its request while the job still runs (found by review, 2026-11-29: it
/// completed with -EIO and the write could land afterwards).
fn finished(result: &AtomicI32) -> i32 {
    loop {
        let r = result.load(Ordering::Acquire);
        if r != PENDING {
            return r;
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

impl Drop for Offload {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(j) => j,
            Err(_) => return,
        };
        job();
    }
}

fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    loop {
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
        let r = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if r == 8 {
            return;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            errln!("ftlblk: waking a queue tag failed: {e}");
            return;
        }
    }
}

/// One tag's wake-up eventfd (a tag has at most one job in flight).
pub struct TagEvent {
    fd: Arc<OwnedFd>,
}

impl TagEvent {
    pub fn new() -> std::io::Result<TagEvent> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: freshly created, owned by nothing else.
        Ok(TagEvent {
            fd: Arc::new(unsafe { OwnedFd::from_raw_fd(fd) }),
        })
    }

    /// Waits (through the queue ring) until the job signals, consuming the count.
    async fn wait(&self, q: &UblkQueue<'_>) {
        let mut count: u64 = 0;
        loop {
            let sqe = io_uring::opcode::Read::new(
                io_uring::types::Fd(self.fd.as_raw_fd()),
                (&mut count as *mut u64).cast(),
                8,
            )
            .build();
            let r = q.ublk_submit_sqe(sqe).await;
            if r == 8 {
                return;
            }
            if r != -libc::EINTR && r != -libc::EAGAIN {
                // Cannot wait through the ring: the job still finishes; poll for it.
                errln!("ftlblk: eventfd read through the queue ring failed ({r}); polling");
                self.wait_blocking();
                return;
            }
        }
    }

    fn wait_blocking(&self) {
        let mut count: u64 = 0;
        loop {
            // SAFETY: reads 8 bytes into a live u64 from an eventfd we own.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
            if r == 8 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_completes_with_what_its_job_stored_however_late() {
        let result = Arc::new(AtomicI32::new(PENDING));
        let slot = result.clone();
        let job = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            slot.store(7, Ordering::Release);
        });
        assert_eq!(finished(&result), 7);
        job.join().unwrap();
    }

    #[test]
    fn pool_runs_jobs_and_signals_the_eventfd() {
        let pool = Offload::new(2).unwrap();
        let ev = TagEvent::new().unwrap();
        let slot = Arc::new(AtomicI32::new(0));
        for i in 1..=3 {
            let s = slot.clone();
            let efd = ev.fd.clone();
            assert!(pool.submit(
                Lane::Data,
                Box::new(move || {
                    s.fetch_add(i, Ordering::SeqCst);
                    signal(&efd);
                })
            ));
            ev.wait_blocking();
        }
        assert_eq!(slot.load(Ordering::SeqCst), 6);
        pool.shutdown();
        assert!(
            !pool.submit(Lane::Flush, Box::new(|| {})),
            "a stopped pool takes no jobs"
        );
    }

    /// A FLUSH is not queued behind writes that wait (for the throttle, or for space on
    /// a full device): with every data worker held and writes queued behind it, a flush
    /// still runs.
    #[test]
    fn a_flush_is_not_queued_behind_blocked_writes() {
        let pool = Offload::new(1).unwrap();
        let (release, held) = channel::<()>();
        let (started, running) = channel::<()>();
        let held = Mutex::new(held);
        assert!(pool.submit(
            Lane::Data,
            Box::new(move || {
                started.send(()).unwrap();
                let _ = held.lock().unwrap().recv();
            })
        ));
        running
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the write started");
        assert!(pool.submit(Lane::Data, Box::new(|| {})), "a queued write");
        let (done, flushed) = channel::<()>();
        assert!(pool.submit(
            Lane::Flush,
            Box::new(move || {
                done.send(()).unwrap();
            })
        ));
        let r = flushed.recv_timeout(std::time::Duration::from_secs(30));
        release.send(()).unwrap();
        r.expect("the flush ran while the write held the data worker");
        pool.shutdown();
    }
}
