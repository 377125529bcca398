//! A sparse in-memory device: all-zero blocks are not stored. Trace replay writes zero
//! payloads in metadata-only mode, so only chunk summaries take memory and multi-GiB
//! traces replay in seconds. `sync` is a no-op; nothing survives the process.

use super::{check_range, BlockDevice, BLOCK_SIZE};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

/// Hashes a block number with one multiply (Fibonacci hashing): the keys are dense
/// integers, so SipHash's DoS resistance buys nothing and cost most of a replay's time.
#[derive(Default)]
struct BlockNoHasher(u64);

impl Hasher for BlockNoHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type BlockMap = HashMap<u64, Box<[u8]>, BuildHasherDefault<BlockNoHasher>>;

const ZERO_BLOCK: [u8; BLOCK_SIZE] = [0; BLOCK_SIZE];

/// Sparse in-memory block device.
pub struct SparseDevice {
    blocks: RwLock<BlockMap>,
    size: u64,
    written: AtomicU64,
    discarded: AtomicU64,
}

impl SparseDevice {
    pub fn new(size: u64) -> Self {
        SparseDevice {
            blocks: RwLock::new(BlockMap::default()),
            size: size / BLOCK_SIZE as u64 * BLOCK_SIZE as u64,
            written: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
        }
    }
    /// Blocks holding non-zero data.
    pub fn stored_blocks(&self) -> usize {
        self.blocks.read().map(|b| b.len()).unwrap_or(0)
    }
    /// Bytes written so far.
    pub fn written_bytes(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
    /// Bytes discarded so far.
    pub fn discarded_bytes(&self) -> u64 {
        self.discarded.load(Ordering::Relaxed)
    }
}

fn poisoned() -> io::Error {
    io::Error::other("sparse device lock poisoned")
}

impl BlockDevice for SparseDevice {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.size, offset, buf.len())?;
        let m = self.blocks.read().map_err(|_| poisoned())?;
        for (i, out) in buf.chunks_mut(BLOCK_SIZE).enumerate() {
            match m.get(&(offset / BLOCK_SIZE as u64 + i as u64)) {
                Some(b) => out.copy_from_slice(b),
                None => out.fill(0),
            }
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(self.size, offset, buf.len())?;
        let mut m = self.blocks.write().map_err(|_| poisoned())?;
        for (i, blk) in buf.chunks(BLOCK_SIZE).enumerate() {
            let no = offset / BLOCK_SIZE as u64 + i as u64;
            // A slice comparison is a memcmp; a byte-wise `all` was most of a replay.
            if blk == &ZERO_BLOCK[..blk.len()] {
                m.remove(&no);
            } else {
                m.insert(no, blk.into());
            }
        }
        self.written.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len as usize)?;
        let mut m = self.blocks.write().map_err(|_| poisoned())?;
        let first = offset / BLOCK_SIZE as u64;
        for no in first..first + len / BLOCK_SIZE as u64 {
            m.remove(&no);
        }
        self.discarded.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }
    fn describe(&self) -> String {
        format!("sparse memory device ({} bytes)", self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_blocks_cost_nothing() {
        let d = SparseDevice::new(1 << 30);
        d.write_at(0, &[0u8; 8192]).unwrap();
        assert_eq!(d.stored_blocks(), 0);
        d.write_at(4096, &[1u8; 4096]).unwrap();
        assert_eq!(d.stored_blocks(), 1);
        let mut b = vec![9u8; 8192];
        d.read_at(0, &mut b).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 0) && b[4096..].iter().all(|&x| x == 1));
        d.discard(4096, 4096).unwrap();
        assert_eq!(d.stored_blocks(), 0);
        // A discard removes what it covers and nothing outside.
        d.write_at(8192, &[2u8; 8192]).unwrap();
        d.write_at(1 << 20, &[3u8; 4096]).unwrap();
        d.discard(0, 1 << 20).unwrap();
        assert_eq!(d.stored_blocks(), 1);
        d.read_at(1 << 20, &mut b[..4096]).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 3));
        assert!(d.write_at(1 << 30, &[1u8; 4096]).is_err());
    }
}
