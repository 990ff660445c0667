//! Memory mappings that a forked child neither shares nor unmaps.
//!
//! The device keeps reading and writing a mapping after `fork()`, so a child must not share
//! the parent's pages (a copy-on-write fault in the parent would move a page away from the
//! device):
//!
//! - a private anonymous mapping (registered memory, rings in ordinary memory) is
//!   `MADV_WIPEONFORK`: the child finds zeroed pages of its own at the same address, so a
//!   slice the child still holds over it reads zeros, never the parent's bytes and never
//!   memory the child mapped later;
//! - a mapping of the device file (kernel rings, doorbell pages) is `MADV_DONTFORK`: the
//!   child has nothing there, and every verb on an inherited handle stops before touching it
//!   ([`super::fork`]).
//!
//! In a child a [`Mapping`] is never unmapped: a `DONTFORK` range may by then hold one of the
//! child's own mappings, which an `munmap` would take away. The child leaks what it inherited,
//! as it leaks the inherited kernel objects.

use super::fork::Owner;
use memmap2::{MmapMut, MmapOptions};
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::RawFd;

/// A memory mapping made by this process, unmapped on drop unless the drop runs in a forked
/// child (see the module docs).
pub(crate) struct Mapping {
    map: ManuallyDrop<MmapMut>,
    owner: Owner,
}

impl Mapping {
    /// `len` bytes (at least one) of zeroed, page-aligned private memory, wiped for a forked
    /// child. `populate`: faulted in now (`MAP_POPULATE`).
    pub(crate) fn anon(len: usize, populate: bool) -> io::Result<Self> {
        let mut options = MmapOptions::new();
        options.len(len.max(1));
        if populate {
            options.populate();
        }
        let mut map = options.map_anon()?;
        if !cfg!(miri) {
            // SAFETY: the range is exactly the mapping just made, which this process owns;
            // the advice changes only what a future child sees.
            let rc = unsafe { nix::libc::madvise(map.as_mut_ptr().cast(), map.len(), nix::libc::MADV_WIPEONFORK) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Self::owned(map))
    }

    /// `len` bytes of the device file `fd` at `offset`, shared with the kernel and not
    /// inherited by a child.
    ///
    /// # Safety
    /// The kernel or the device may change the bytes at any time: the caller reaches them
    /// only through raw pointers with volatile or atomic accesses, never through references
    /// to plain bytes.
    pub(crate) unsafe fn device(fd: RawFd, offset: u64, len: usize) -> io::Result<Self> {
        // SAFETY: per the contract, the caller never forms references to the bytes.
        let map = unsafe { MmapOptions::new().offset(offset).len(len).map_mut(fd) }?;
        map.advise(memmap2::Advice::DontFork)?;
        Ok(Self::owned(map))
    }

    fn owned(map: MmapMut) -> Self {
        Self {
            map: ManuallyDrop::new(map),
            owner: Owner::current(),
        }
    }

    /// The first byte.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// The length, as asked for (the kernel maps whole pages).
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.owner.forked() {
            return;
        }
        // SAFETY: dropped once, here; `map` is not used again.
        unsafe { ManuallyDrop::drop(&mut self.map) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact case a child must survive: it drops an inherited mapping, maps memory of the
    /// same size, and the new mapping is its own and stays mapped; the inherited range reads
    /// as zeros throughout, never the parent's bytes.
    #[test]
    #[cfg_attr(miri, ignore)] // fork(2)
    fn a_child_reads_zeros_and_never_unmaps_what_it_inherited() {
        const LEN: usize = 1 << 16;
        let mut m = Mapping::anon(LEN, false).unwrap();
        let at = m.as_mut_ptr();
        // SAFETY: the mapping's own bytes, no other reference to them.
        unsafe { std::ptr::write_bytes(at, 0xa5, LEN) };
        // SAFETY: the child makes system calls, reads memory and `_exit`s: no allocation, no
        // lock another thread could hold.
        let pid = unsafe { nix::libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: the inherited range is mapped in the child (wiped), LEN bytes.
            let zeros = unsafe { std::slice::from_raw_parts(at, LEN) }.iter().all(|&b| b == 0);
            drop(m);
            // SAFETY: a fresh private mapping, LEN bytes.
            let fresh = unsafe {
                nix::libc::mmap(
                    std::ptr::null_mut(),
                    LEN,
                    nix::libc::PROT_READ | nix::libc::PROT_WRITE,
                    nix::libc::MAP_PRIVATE | nix::libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            let fresh_ok = fresh != nix::libc::MAP_FAILED && fresh.cast::<u8>() != at;
            if fresh_ok {
                // SAFETY: the fresh mapping, LEN bytes.
                unsafe { std::ptr::write_bytes(fresh.cast::<u8>(), 0x3c, LEN) };
            }
            // SAFETY: the inherited range is still mapped: the drop above leaked it.
            let still_zeros = unsafe { std::slice::from_raw_parts(at, LEN) }.iter().all(|&b| b == 0);
            let code = i32::from(!zeros) | i32::from(!fresh_ok) << 1 | i32::from(!still_zeros) << 2;
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { nix::libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: our own child.
        assert_eq!(unsafe { nix::libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(nix::libc::WIFEXITED(status));
        assert_eq!(
            nix::libc::WEXITSTATUS(status),
            0,
            "bit 0: the child saw the parent's bytes; bit 1: its new mapping landed on the inherited range; bit 2: the inherited range was unmapped"
        );
        // SAFETY: the parent's mapping, unchanged by the child.
        assert!(unsafe { std::slice::from_raw_parts(at, LEN) }
            .iter()
            .all(|&b| b == 0xa5));
    }
}
