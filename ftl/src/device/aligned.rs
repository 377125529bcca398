//! A heap buffer aligned to [`BLOCK_SIZE`], as O_DIRECT requires.

use super::BLOCK_SIZE;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Zero-initialised, 4 KiB-aligned byte buffer whose length is a multiple of 4 KiB.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zero bytes (rounded up to a whole block; at least one block).
    pub fn new(len: usize) -> Self {
        let len = len.max(1).div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        let layout = Self::layout(len);
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = match NonNull::new(raw) {
            Some(p) => p,
            None => std::alloc::handle_alloc_error(layout),
        };
        AlignedBuf { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        match Layout::from_size_align(len, BLOCK_SIZE) {
            Ok(l) => l,
            // len is a non-zero multiple of 4096 and far below isize::MAX in practice.
            Err(_) => panic!("invalid aligned buffer size {len}"),
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with the same layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// True when `buf` starts on a block boundary (O_DIRECT-safe).
pub fn is_aligned(buf: &[u8]) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(BLOCK_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let b = AlignedBuf::new(5000);
        assert_eq!(b.len(), 8192);
        assert!(is_aligned(&b));
        assert!(b.iter().all(|&x| x == 0));
    }
}
