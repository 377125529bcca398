//! A device that can hold operations on command, for tests of thread interleavings.
//!
//! [`GateDevice`] forwards to an inner device; [`GateDevice::hold`] makes every later
//! operation of one kind block *before* it reaches the inner device until
//! [`GateDevice::release`]. A test holds, say, discards, lets a checkpoint run into one,
//! waits with [`GateDevice::wait_held`] until it is stuck there, and then drives other
//! threads through the window. The device also watches the rule that nothing is written
//! into a range whose discard is still held ([`GateDevice::writes_into_held_discards`]).

use super::BlockDevice;
use std::io;
use std::os::fd::RawFd;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Operation kinds a gate can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateOp {
    Read,
    Write,
    Sync,
    Discard,
}

impl GateOp {
    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Default)]
struct GateState {
    holding: [bool; 4],
    /// Operations of each kind blocked at the gate right now.
    held: [usize; 4],
    /// Byte ranges of discards blocked right now.
    held_discards: Vec<(u64, u64)>,
    /// Writes issued into a held discard's range.
    violations: usize,
    /// What a discard leaves in its range instead of the inner device's discard.
    discard_fill: Option<u8>,
    /// Discards report an error (after leaving their fill, if any: a discard that did
    /// part of its work).
    discard_fails: bool,
    /// The next sync reports an error (without syncing the inner device).
    fail_next_sync: bool,
    /// Reads overlapping this byte range fail with EIO (a bad sector).
    bad_reads: Option<(u64, u64)>,
    /// Writes overlapping this byte range fail with EIO.
    bad_writes: Option<(u64, u64)>,
}

/// A device whose operations can be held at a gate (see the module docs).
pub struct GateDevice<D> {
    inner: D,
    state: Mutex<GateState>,
    cv: Condvar,
}

impl<D: BlockDevice> GateDevice<D> {
    /// Wraps `inner`; nothing is held.
    pub fn new(inner: D) -> Self {
        GateDevice {
            inner,
            state: Mutex::new(GateState::default()),
            cv: Condvar::new(),
        }
    }

    /// From now on a discard leaves `fill` bytes in its range (a device whose TRIM
    /// does not read back as zeros: it need not), `None` for the inner device's discard.
    pub fn set_discard_fill(&self, fill: Option<u8>) {
        self.lock().discard_fill = fill;
    }

    /// From now on discards fail (after doing what they do: their fill, if set).
    pub fn set_discard_fails(&self, fails: bool) {
        self.lock().discard_fails = fails;
    }

    /// The next sync (one that passes the gate after this call) fails with EIO without
    /// syncing the inner device; later ones sync as usual (a transient cache-flush error,
    /// or an fsync whose error the kernel reports only once).
    pub fn fail_next_sync(&self) {
        self.lock().fail_next_sync = true;
    }

    /// From now on reads overlapping `len` bytes at `offset` fail with EIO, as on a bad
    /// sector (`None`: no more).
    pub fn set_bad_reads(&self, range: Option<(u64, u64)>) {
        self.lock().bad_reads = range;
    }

    /// From now on writes overlapping `len` bytes at `offset` fail with EIO (`None`: no
    /// more).
    pub fn set_bad_writes(&self, range: Option<(u64, u64)>) {
        self.lock().bad_writes = range;
    }

    fn check_read(&self, offset: u64, len: usize) -> io::Result<()> {
        fails(self.lock().bad_reads, offset, len)
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on, operations of kind `op` block until [`GateDevice::release`].
    pub fn hold(&self, op: GateOp) {
        self.lock().holding[op.index()] = true;
    }

    /// Lets every held operation of kind `op` (and later ones) through.
    pub fn release(&self, op: GateOp) {
        self.lock().holding[op.index()] = false;
        self.cv.notify_all();
    }

    /// Waits until at least one operation of kind `op` is blocked at the gate; false on
    /// timeout.
    pub fn wait_held(&self, op: GateOp, timeout: Duration) -> bool {
        let i = op.index();
        let (g, _) = self
            .cv
            .wait_timeout_while(self.lock(), timeout, |g| g.held[i] == 0)
            .unwrap_or_else(|p| p.into_inner());
        g.held[i] > 0
    }

    /// Writes issued so far into the range of a discard blocked at the gate.
    pub fn writes_into_held_discards(&self) -> usize {
        self.lock().violations
    }

    fn pass(&self, op: GateOp, range: Option<(u64, u64)>) {
        let mut g = self.lock();
        if !g.holding[op.index()] {
            return;
        }
        g.held[op.index()] += 1;
        if let Some(r) = range {
            g.held_discards.push(r);
        }
        self.cv.notify_all();
        while g.holding[op.index()] {
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        g.held[op.index()] -= 1;
        if let Some(r) = range {
            if let Some(i) = g.held_discards.iter().position(|&x| x == r) {
                g.held_discards.swap_remove(i);
            }
        }
    }
}

impl<D: BlockDevice> BlockDevice for GateDevice<D> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.pass(GateOp::Read, None);
        self.check_read(offset, buf.len())?;
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        {
            let mut g = self.lock();
            let end = offset + buf.len() as u64;
            if g.held_discards
                .iter()
                .any(|&(o, l)| offset < o + l && o < end)
            {
                g.violations += 1;
            }
        }
        self.pass(GateOp::Write, None);
        fails(self.lock().bad_writes, offset, buf.len())?;
        self.inner.write_at(offset, buf)
    }
    fn sync(&self) -> io::Result<()> {
        // The mark on entry: a sync held at the gate makes durable what completed before
        // it was issued, not the writes landing while it is held (it took the mark after
        // the gate, so a test could never catch a FLUSH crediting itself with a write
        // still in flight when its sync began; found by review, 2026-11-30).
        let mark = self.sync_mark()?;
        self.sync_upto(mark)
    }
    fn sync_mark(&self) -> io::Result<u64> {
        self.inner.sync_mark()
    }
    fn sync_upto(&self, mark: u64) -> io::Result<()> {
        self.pass(GateOp::Sync, None);
        if std::mem::take(&mut self.lock().fail_next_sync) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.sync_upto(mark)
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.pass(GateOp::Discard, Some((offset, len)));
        let (fill, fails) = {
            let g = self.lock();
            (g.discard_fill, g.discard_fails)
        };
        match fill {
            Some(b) => {
                let junk = vec![b; usize::try_from(len).map_err(io::Error::other)?];
                self.inner.write_at(offset, &junk)?;
            }
            None => self.inner.discard(offset, len)?,
        }
        if fails {
            return Err(io::Error::other(
                "injected discard error (after part of it)",
            ));
        }
        Ok(())
    }
    fn raw_fd(&self) -> Option<RawFd> {
        None
    }
    fn describe(&self) -> String {
        format!("gated {}", self.inner.describe())
    }
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        self.pass(GateOp::Read, None);
        for (o, b) in reqs.iter() {
            self.check_read(*o, b.len())?;
        }
        self.inner.read_many(reqs)
    }
    fn read_many_depth(&self, reqs: &mut [(u64, &mut [u8])], depth: usize) -> io::Result<()> {
        self.pass(GateOp::Read, None);
        for (o, b) in reqs.iter() {
            self.check_read(*o, b.len())?;
        }
        self.inner.read_many_depth(reqs, depth)
    }
}

/// EIO when `len` bytes at `offset` overlap the failing `range`.
fn fails(range: Option<(u64, u64)>, offset: u64, len: usize) -> io::Result<()> {
    match range {
        Some((o, l)) if offset < o + l && o < offset + len as u64 => {
            Err(io::Error::from_raw_os_error(libc::EIO))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mem::MemDevice;
    use std::sync::Arc;

    #[test]
    fn a_held_discard_blocks_until_released_and_watches_writes() {
        let d = Arc::new(GateDevice::new(MemDevice::new(1 << 20)));
        d.hold(GateOp::Discard);
        let d2 = d.clone();
        let t = std::thread::spawn(move || d2.discard(4096, 8192));
        assert!(d.wait_held(GateOp::Discard, Duration::from_secs(5)));
        d.write_at(0, &[1u8; 4096]).unwrap();
        assert_eq!(d.writes_into_held_discards(), 0, "outside the range");
        d.write_at(8192, &[1u8; 4096]).unwrap();
        assert_eq!(d.writes_into_held_discards(), 1, "inside the range");
        d.release(GateOp::Discard);
        t.join().unwrap().unwrap();
        d.write_at(8192, &[1u8; 4096]).unwrap();
        assert_eq!(d.writes_into_held_discards(), 1, "the discard is done");
        assert!(!d.wait_held(GateOp::Sync, Duration::from_millis(10)));
    }

    /// A sync held at the gate makes durable what completed before it was issued, not a
    /// write landing while it is held (as a real fsync): the mark is taken on entry.
    #[test]
    fn a_held_sync_covers_only_the_writes_before_it() {
        use crate::device::crash::CrashDevice;
        let crash = Arc::new(CrashDevice::new(1 << 20));
        let d = Arc::new(GateDevice::new(crash.clone()));
        d.write_at(0, &[1u8; 4096]).unwrap();
        d.hold(GateOp::Sync);
        let d2 = d.clone();
        let t = std::thread::spawn(move || d2.sync());
        assert!(d.wait_held(GateOp::Sync, Duration::from_secs(5)));
        d.write_at(4096, &[2u8; 4096]).unwrap();
        d.release(GateOp::Sync);
        t.join().unwrap().unwrap();
        assert_eq!(crash.unsynced_blocks(), 1, "the write during the held sync");
        d.sync().unwrap();
        assert_eq!(crash.unsynced_blocks(), 0);
    }
}
