//! `HostMem`: a block of host memory shared between the runtime, the driver and (for kernels and
//! zero-copy numpy views) Python.
//!
//! It plays three roles: the backing store of a sim allocation, a mirror of a device allocation,
//! and the host side of a vendor mapping. Its contents behave like device memory: several owners
//! may hold it (`Arc`), and the bytes change underneath them. Rust-side accesses go through an
//! internal lock, so the safe API is free of data races; callers that hand the raw address to
//! numpy (see [`HostMem::owned_addr`]) take the responsibility that a DMA engine would.
//!
//! A foreign block (a vendor mapping) can be revoked: after [`HostMem::revoke`] every access fails,
//! so a mapping torn down by `unmap_host` is never dereferenced again. A foreign block is also
//! refused in a forked child of the process that mapped it (`crate::fork`): the child inherits
//! the mapping, and a write through it would land in the parent's device memory.
//!
//! Owned blocks are 4 KiB-aligned; a block a driver page-locks (a CUDA mirror) is laid out in
//! whole host pages ([`HostMem::with_page`]), so it never shares a page with another one; on a
//! 64 KiB-page host the page is 64 KiB.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

/// Alignment of owned blocks: a page, so numpy views of any dtype are aligned.
const ALIGN: usize = 4096;

/// An access outside a block, or to a revoked one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostMemError {
    #[error("host access of {len} bytes at offset {offset} runs past a block of {size} bytes")]
    OutOfRange {
        offset: usize,
        len: usize,
        size: usize,
    },
    #[error("host mapping was revoked (unmapped); access refused")]
    Revoked,
    #[error("cannot allocate {0} bytes of host memory")]
    Alloc(usize),
    /// A foreign block (a vendor mapping) accessed in a forked child of the process that mapped
    /// it.
    #[error("host mapping refused: {0}")]
    Forked(String),
}

/// The host's page size (`sysconf(_SC_PAGESIZE)`), at least 4 KiB.
pub fn host_page_size() -> usize {
    // SAFETY: `sysconf` reads a system constant; no pointers.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(ALIGN).max(ALIGN)
}

enum Origin {
    /// Allocated here with this layout; freed on drop.
    Owned(Layout),
    /// Memory owned by a vendor driver (a mapping) in the process of this stamp; never freed
    /// here.
    Foreign(crate::fork::Stamp),
}

/// A shared, lockable block of host memory. See the module docs.
pub struct HostMem {
    ptr: NonNull<u8>,
    len: usize,
    origin: Origin,
    /// `true` while the memory may be accessed. Held during every access, so `revoke` waits for
    /// accesses in flight.
    valid: Mutex<bool>,
}

// SAFETY: HostMem is a pointer to memory it owns (or that a driver keeps valid until `revoke`),
// and every access made through its API happens with `valid` locked, so Rust code sharing it
// between threads cannot race on the bytes. The one way around the lock is `owned_addr`, which
// hands the address to numpy for zero-copy arrays (kernels on sim, `read_tensor`): such arrays
// are like device memory under DMA, and their users must not write them from one thread while
// another thread copies the same bytes (the worker's lock serializes the runtime's own copies;
// the docs state this contract for user code).
unsafe impl Send for HostMem {}
// SAFETY: as above: `&HostMem` only reaches the bytes under the `valid` lock; the raw address
// given out by `owned_addr` carries the documented no-concurrent-writes contract.
unsafe impl Sync for HostMem {}

impl std::fmt::Debug for HostMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMem")
            .field("len", &self.len)
            .field("owned", &matches!(self.origin, Origin::Owned(_)))
            .finish()
    }
}

impl HostMem {
    /// Allocates `len` bytes (at least 1), every byte set to `fill`, 4 KiB-aligned.
    pub fn new(len: usize, fill: u8) -> Result<HostMem, HostMemError> {
        HostMem::layout(len, fill, ALIGN, len.max(1))
    }

    /// [`HostMem::new`] on whole pages of `page` bytes (rounded up to a power of two, at least
    /// 4 KiB): the block starts on a page and [`HostMem::allocated`] (its length rounded up to
    /// whole pages) is what it occupies, so no other block shares its pages (what a driver that
    /// page-locks it needs).
    pub fn with_page(len: usize, fill: u8, page: usize) -> Result<HostMem, HostMemError> {
        let page = page.max(ALIGN).next_power_of_two();
        let size = len
            .max(1)
            .checked_next_multiple_of(page)
            .ok_or(HostMemError::Alloc(len))?;
        HostMem::layout(len, fill, page, size)
    }

    fn layout(len: usize, fill: u8, align: usize, size: usize) -> Result<HostMem, HostMemError> {
        let layout = Layout::from_size_align(size, align).map_err(|_| HostMemError::Alloc(len))?;
        // SAFETY: `layout` has a non-zero size (both callers pass at least 1 byte).
        let raw = unsafe {
            if fill == 0 {
                alloc::alloc_zeroed(layout)
            } else {
                alloc::alloc(layout)
            }
        };
        let ptr = NonNull::new(raw).ok_or(HostMemError::Alloc(len))?;
        if fill != 0 {
            // SAFETY: `ptr` points to `size` freshly allocated bytes that nothing else references.
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), fill, size) };
        }
        Ok(HostMem {
            ptr,
            len,
            origin: Origin::Owned(layout),
            valid: Mutex::new(true),
        })
    }

    /// Wraps memory owned by a vendor driver (the host side of a mapping).
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes until [`HostMem::revoke`] is called,
    /// and the caller must call `revoke` before the vendor tears the memory down.
    pub unsafe fn foreign(ptr: NonNull<u8>, len: usize) -> HostMem {
        HostMem {
            ptr,
            len,
            origin: Origin::Foreign(crate::fork::Stamp::now()),
            valid: Mutex::new(true),
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The host address of an owned block, for zero-copy numpy views. `None` for foreign memory:
    /// a vendor mapping can be revoked while a view would still point at it.
    pub fn owned_addr(&self) -> Option<usize> {
        match self.origin {
            Origin::Owned(_) => Some(self.ptr.as_ptr() as usize),
            Origin::Foreign(_) => None,
        }
    }

    /// The bytes an owned block occupies (its length rounded up to whole pages); a foreign
    /// block's length.
    pub fn allocated(&self) -> usize {
        match self.origin {
            Origin::Owned(layout) => layout.size(),
            Origin::Foreign(_) => self.len,
        }
    }

    /// Refuses an access to a foreign block from a forked child of the process that mapped it.
    fn check_process(&self) -> Result<(), HostMemError> {
        match self.origin {
            Origin::Foreign(stamp) if stamp.forked() => Err(HostMemError::Forked(stamp.refusal())),
            _ => Ok(()),
        }
    }

    /// Marks foreign memory unusable; waits for accesses in flight. Idempotent.
    pub fn revoke(&self) {
        *self.lock() = false;
    }

    /// Runs `teardown` (the vendor call that unmaps this memory) with every access blocked, and
    /// marks the block revoked only if it succeeds: a teardown that fails leaves a mapping that is
    /// still there, and still usable.
    pub fn revoke_with<E>(&self, teardown: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let mut valid = self.lock();
        teardown()?;
        *valid = false;
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, bool> {
        // A poisoned lock only means another thread panicked mid-copy; the bytes are still valid.
        self.valid.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[inline(always)]
    fn check(&self, offset: usize, len: usize) -> Result<(), HostMemError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(HostMemError::OutOfRange {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// Runs `f` over `len` bytes at `offset`, read-only.
    pub fn with_slice<R>(
        &self,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, HostMemError> {
        self.check(offset, len)?;
        self.check_process()?;
        let guard = self.lock();
        if !*guard {
            return Err(HostMemError::Revoked);
        }
        // SAFETY: the range was checked to lie inside the block, the block is valid (owned, or a
        // foreign mapping of this process not yet revoked, and revocation needs the lock we
        // hold), and no other Rust access can run while we hold the lock.
        let slice = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) };
        Ok(f(slice))
    }

    /// Runs `f` over `len` bytes at `offset`, writable.
    pub fn with_slice_mut<R>(
        &self,
        offset: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, HostMemError> {
        self.check(offset, len)?;
        self.check_process()?;
        let guard = self.lock();
        if !*guard {
            return Err(HostMemError::Revoked);
        }
        // SAFETY: as in `with_slice`; the lock makes this the only Rust reference to the bytes.
        let slice = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) };
        Ok(f(slice))
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), HostMemError> {
        self.with_slice(offset, dst.len(), |s| dst.copy_from_slice(s))
    }

    /// The `len` bytes (1, 2, 4 or 8: one element of a tensor) at `offset`, in the first `len`
    /// bytes of the result: [`HostMem::read`] for the orchestrator's element reads, with the
    /// copy a fixed-size move instead of a call to `memcpy`.
    pub fn read_element(&self, offset: usize, len: usize) -> Result<[u8; 8], HostMemError> {
        self.with_slice(offset, len, element)
    }

    /// Copies `src` into the block at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), HostMemError> {
        self.with_slice_mut(offset, src.len(), |d| d.copy_from_slice(src))
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), HostMemError> {
        self.with_slice_mut(offset, len, |d| d.fill(byte))
    }
}

/// The bytes of one element (at most 8), in the first bytes of the result; fixed-size moves
/// for the sizes of the dtypes (no call to `memcpy` for a few bytes).
#[inline(always)]
fn element(s: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    match *s {
        [a] => out[0] = a,
        [a, b] => out[..2].copy_from_slice(&[a, b]),
        [a, b, c, d] => out[..4].copy_from_slice(&[a, b, c, d]),
        [a, b, c, d, e, f, g, h] => out = [a, b, c, d, e, f, g, h],
        _ => {
            let n = s.len().min(8);
            out[..n].copy_from_slice(&s[..n]);
        }
    }
    out
}

impl Drop for HostMem {
    fn drop(&mut self) {
        if let Origin::Owned(layout) = self.origin {
            // SAFETY: `ptr` was returned by `alloc`/`alloc_zeroed` with exactly this layout and is
            // freed only here, once.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_read_write_and_bounds() {
        let m = HostMem::new(16, 0xA5).unwrap();
        let mut buf = [0u8; 4];
        m.read(12, &mut buf).unwrap();
        assert_eq!(buf, [0xA5; 4]);
        m.write(0, &[1, 2, 3]).unwrap();
        m.read(0, &mut buf).unwrap();
        assert_eq!(buf, [1, 2, 3, 0xA5]);
        for (len, want) in [
            (1, [1, 0, 0, 0, 0, 0, 0, 0]),
            (2, [1, 2, 0, 0, 0, 0, 0, 0]),
            (4, [1, 2, 3, 0xA5, 0, 0, 0, 0]),
            (8, [1, 2, 3, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5]),
        ] {
            assert_eq!(m.read_element(0, len).unwrap(), want, "{len} bytes");
        }
        assert!(matches!(
            m.read_element(12, 8),
            Err(HostMemError::OutOfRange { .. })
        ));
        assert_eq!(m.read_element(1, 2).unwrap()[..2], [2, 3]);
        m.revoke();
        let r = m.read_element(0, 4);
        assert!(matches!(r, Err(HostMemError::Revoked)), "{r:?}");
        assert!(matches!(
            m.read(13, &mut buf),
            Err(HostMemError::OutOfRange { .. })
        ));
        assert!(matches!(
            m.write(usize::MAX, &[1]),
            Err(HostMemError::OutOfRange { .. })
        ));
        assert_eq!(m.owned_addr().unwrap() % ALIGN, 0);
        assert_eq!(m.allocated(), 16);
    }

    #[test]
    fn blocks_cover_whole_pages_of_the_page_size_given() {
        let page = 64 << 10;
        let (a, b) = (
            HostMem::with_page(100, 0, page).unwrap(),
            HostMem::with_page(page + 1, 0, page).unwrap(),
        );
        for (m, pages) in [(&a, 1), (&b, 2)] {
            assert_eq!(m.owned_addr().unwrap() % page, 0);
            assert_eq!(m.allocated(), pages * page);
        }
        // Two blocks never share a page.
        let (x, y) = (a.owned_addr().unwrap(), b.owned_addr().unwrap());
        assert!(x + a.allocated() <= y || y + b.allocated() <= x);
        // A page size that is not a power of two is rounded up to one.
        assert_eq!(
            HostMem::with_page(1, 0, 3 << 12).unwrap().allocated(),
            16 << 10
        );
        assert_eq!(
            HostMem::with_page(usize::MAX, 0, page).unwrap_err(),
            HostMemError::Alloc(usize::MAX)
        );
    }

    #[test]
    fn revoked_foreign_memory_is_not_accessed() {
        let backing = HostMem::new(8, 1).unwrap();
        let ptr = NonNull::new(backing.owned_addr().unwrap() as *mut u8).unwrap();
        // SAFETY: `backing` outlives `f` and we revoke `f` before dropping `backing`.
        let f = unsafe { HostMem::foreign(ptr, 8) };
        assert!(f.owned_addr().is_none());
        f.write(0, &[9]).unwrap();
        let mut b = [0u8; 1];
        backing.read(0, &mut b).unwrap();
        assert_eq!(b, [9]);
        f.revoke();
        assert_eq!(f.read(0, &mut b), Err(HostMemError::Revoked));
    }
}
