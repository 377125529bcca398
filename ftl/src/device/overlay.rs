//! A copy-on-write view of a device: reads see the device below plus what was written
//! through the view; writes and discards stay in memory. The offline checker runs
//! recovery (including the replay of a dead server's staging area) through one, so it
//! checks exactly what the next open would see without changing the backing.

use super::{check_range, BlockDevice, BLOCK_SIZE};
use std::collections::HashMap;
use std::io;
use std::sync::RwLock;

/// In-memory overlay over `D` (see the module docs).
pub struct OverlayDevice<D> {
    below: D,
    blocks: RwLock<HashMap<u64, Box<[u8]>>>,
}

impl<D: BlockDevice> OverlayDevice<D> {
    pub fn new(below: D) -> Self {
        OverlayDevice {
            below,
            blocks: RwLock::new(HashMap::new()),
        }
    }

    /// Blocks written (or discarded) through the overlay.
    pub fn overlaid_blocks(&self) -> usize {
        self.blocks.read().map(|b| b.len()).unwrap_or(0)
    }

    fn put(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut m = self
            .blocks
            .write()
            .map_err(|_| io::Error::other("overlay lock poisoned"))?;
        for (i, b) in data.chunks(BLOCK_SIZE).enumerate() {
            m.insert(offset / BLOCK_SIZE as u64 + i as u64, b.into());
        }
        Ok(())
    }

    /// Copies the overlay's blocks over what `reqs` read from the device below.
    fn overlay(&self, reqs: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        let m = self
            .blocks
            .read()
            .map_err(|_| io::Error::other("overlay lock poisoned"))?;
        if m.is_empty() {
            return Ok(());
        }
        for (offset, buf) in reqs.iter_mut() {
            for (i, b) in buf.chunks_mut(BLOCK_SIZE).enumerate() {
                if let Some(d) = m.get(&(*offset / BLOCK_SIZE as u64 + i as u64)) {
                    b.copy_from_slice(d);
                }
            }
        }
        Ok(())
    }
}

impl<D: BlockDevice> BlockDevice for OverlayDevice<D> {
    fn size(&self) -> u64 {
        self.below.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.size(), offset, buf.len())?;
        self.below.read_at(offset, buf)?;
        self.overlay(&mut [(offset, buf)])
    }
    /// The reads go to the device below together (its queue), then the overlay's blocks
    /// replace what they cover.
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        for (offset, buf) in reqs.iter() {
            check_range(self.size(), *offset, buf.len())?;
        }
        self.below.read_many(reqs)?;
        self.overlay(reqs)
    }
    fn read_many_depth(&self, reqs: &mut [(u64, &mut [u8])], depth: usize) -> io::Result<()> {
        for (offset, buf) in reqs.iter() {
            check_range(self.size(), *offset, buf.len())?;
        }
        self.below.read_many_depth(reqs, depth)?;
        self.overlay(reqs)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(self.size(), offset, buf.len())?;
        self.put(offset, buf)
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len as usize)?;
        self.put(offset, &vec![0u8; len as usize])
    }
    fn describe(&self) -> String {
        format!("in-memory overlay over {}", self.below.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mem::MemDevice;

    #[test]
    fn writes_stay_in_the_overlay() {
        let below = MemDevice::new(1 << 20);
        below.write_at(0, &[1u8; 8192]).unwrap();
        let o = OverlayDevice::new(&below);
        o.write_at(4096, &[2u8; 4096]).unwrap();
        let mut b = vec![0u8; 8192];
        o.read_at(0, &mut b).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 1) && b[4096..].iter().all(|&x| x == 2));
        below.read_at(0, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 1), "the device below is unchanged");
        o.discard(0, 4096).unwrap();
        o.read_at(0, &mut b[..4096]).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 0));
        assert_eq!(o.overlaid_blocks(), 2);
    }

    #[test]
    fn batched_reads_see_the_overlay_too() {
        let below = MemDevice::new(1 << 20);
        below.write_at(0, &[1u8; 16384]).unwrap();
        let o = OverlayDevice::new(&below);
        o.write_at(8192, &[2u8; 4096]).unwrap();
        let (mut a, mut b) = (vec![0u8; 8192], vec![0u8; 8192]);
        let mut reqs: Vec<(u64, &mut [u8])> = vec![(0, &mut a), (8192, &mut b)];
        o.read_many_depth(&mut reqs, 2).unwrap();
        assert!(a.iter().all(|&x| x == 1));
        assert!(b[..4096].iter().all(|&x| x == 2) && b[4096..].iter().all(|&x| x == 1));
        let mut past: Vec<(u64, &mut [u8])> = vec![(1 << 20, &mut a)];
        assert!(o.read_many(&mut past).is_err(), "past the end");
    }
}
