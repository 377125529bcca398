//! A heap buffer aligned to [`BLOCK_SIZE`], as O_DIRECT requires, and a per-thread pool
//! of them for the read path's scratch buffers ([`ScratchBuf`]).

use super::BLOCK_SIZE;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::RefCell;
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

/// Scratch buffers a thread keeps for its next reads.
const SCRATCH_POOLED: usize = 8;
/// Larger scratch buffers are freed rather than kept.
const SCRATCH_MAX_POOLED_BYTES: usize = 2 << 20;
/// Scratch sizes are rounded up to this, so buffers fit more reads.
const SCRATCH_GRAIN: usize = 64 << 10;

thread_local! {
    static SCRATCH: RefCell<Vec<AlignedBuf>> = const { RefCell::new(Vec::new()) };
}

/// A 4 KiB-aligned scratch buffer of `len` bytes from this thread's pool, returned to it
/// when dropped. Not zeroed: it holds what its last user left, so it is only for buffers
/// a read fills before anyone looks (a read's spans). A fresh large allocation costs the
/// allocator's zeroing and a page fault per 4 KiB; on a fragmented read that was a fifth
/// of the CPU time.
pub struct ScratchBuf {
    buf: Option<AlignedBuf>,
    len: usize,
}

impl ScratchBuf {
    pub fn take(len: usize) -> Self {
        let len = len.max(1).div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        let pooled = SCRATCH
            .try_with(|p| {
                let mut p = p.try_borrow_mut().ok()?;
                let k = p.iter().position(|b| b.len() >= len)?;
                Some(p.swap_remove(k))
            })
            .ok()
            .flatten();
        let buf =
            pooled.unwrap_or_else(|| AlignedBuf::new(len.div_ceil(SCRATCH_GRAIN) * SCRATCH_GRAIN));
        ScratchBuf {
            buf: Some(buf),
            len,
        }
    }
}

impl Deref for ScratchBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_deref().map_or(&[], |b| &b[..self.len])
    }
}

impl DerefMut for ScratchBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        self.buf.as_deref_mut().map_or(&mut [], |b| &mut b[..len])
    }
}

impl Drop for ScratchBuf {
    fn drop(&mut self) {
        let Some(b) = self.buf.take() else { return };
        if b.len() > SCRATCH_MAX_POOLED_BYTES {
            return;
        }
        let _ = SCRATCH.try_with(|p| {
            if let Ok(mut p) = p.try_borrow_mut() {
                if p.len() < SCRATCH_POOLED {
                    p.push(b);
                }
            }
        });
    }
}

impl std::fmt::Debug for ScratchBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScratchBuf({} bytes)", self.len)
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

    #[test]
    fn scratch_buffers_are_aligned_sized_and_reused() {
        let mut a = ScratchBuf::take(5000);
        assert_eq!(a.len(), 8192);
        assert!(is_aligned(&a));
        a.fill(7);
        let at = a.as_ptr();
        drop(a);
        // The same allocation comes back for a read that fits it, with what it held.
        let b = ScratchBuf::take(2 * BLOCK_SIZE);
        assert_eq!((b.len(), b.as_ptr()), (2 * BLOCK_SIZE, at));
        assert!(b.iter().all(|&x| x == 7));
        // One too large for the pool is freed, not kept.
        let big = ScratchBuf::take(SCRATCH_MAX_POOLED_BYTES + BLOCK_SIZE);
        drop(big);
        let again = ScratchBuf::take(SCRATCH_MAX_POOLED_BYTES + BLOCK_SIZE);
        assert_eq!(again.len(), SCRATCH_MAX_POOLED_BYTES + BLOCK_SIZE);
    }
}
