//! A volatile in-memory device: fast, for tests, fuzzing and trace replay.
//! `sync` is a no-op; nothing survives the process. Memory is allocated lazily by the OS
//! (zeroed pages), so a large sparse device costs only what is written.

use super::{check_range, BlockDevice};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

/// In-memory block device.
pub struct MemDevice {
    data: RwLock<Vec<u8>>,
    size: u64,
    discarded: AtomicU64,
}

impl MemDevice {
    /// A zero-filled device of `size` bytes (rounded down to whole blocks).
    pub fn new(size: u64) -> Self {
        let size = size / super::BLOCK_SIZE as u64 * super::BLOCK_SIZE as u64;
        MemDevice {
            data: RwLock::new(vec![0u8; size as usize]),
            size,
            discarded: AtomicU64::new(0),
        }
    }

    /// Bytes discarded so far.
    pub fn discarded_bytes(&self) -> u64 {
        self.discarded.load(Ordering::Relaxed)
    }
}

fn poisoned() -> io::Error {
    io::Error::other("memory device lock poisoned")
}

impl BlockDevice for MemDevice {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.size, offset, buf.len())?;
        let d = self.data.read().map_err(|_| poisoned())?;
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(self.size, offset, buf.len())?;
        let mut d = self.data.write().map_err(|_| poisoned())?;
        d[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len as usize)?;
        let mut d = self.data.write().map_err(|_| poisoned())?;
        d[offset as usize..(offset + len) as usize].fill(0);
        self.discarded.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }
    fn describe(&self) -> String {
        format!("memory device ({} bytes)", self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bounds() {
        let d = MemDevice::new(1 << 20);
        d.write_at(4096, &[7u8; 8192]).unwrap();
        let mut b = vec![0u8; 4096];
        d.read_at(8192, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 7));
        assert!(d.read_at(1 << 20, &mut b).is_err());
        assert!(d.write_at(100, &b).is_err());
        d.discard(4096, 4096).unwrap();
        d.read_at(4096, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
    }
}
