//! Access to the client program's memory, the way the kernel and the device reach it.
//!
//! Everything the model reads or writes in the client goes through [`Memory`]: command
//! requests and responses (`copy_from_user`/`copy_to_user`), doorbell records, rings and the
//! memory of registered MRs. [`ProcessMemory`] is the real thing, in this process: bulk copies
//! use `process_vm_readv`/`process_vm_writev` on ourselves, so an address that is not mapped
//! gives `EFAULT` as the kernel's copies do, never a crash; the atomics a device performs
//! (RDMA atomics, the UAR doorbell) are real atomic instructions on addresses the caller has
//! checked against what the client registered. [`Arena`] is a test double holding a few
//! buffers and counting every access outside them.

use std::sync::atomic::{AtomicU64, Ordering};

/// A failed access: `EFAULT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault;

/// The client's address space.
pub trait Memory: Sync {
    /// Copies `buf.len()` bytes from `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Fault>;
    /// Copies `data` to `addr`.
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), Fault>;
    /// Atomically replaces the 8-byte-aligned word at `addr` by `new` when it equals `expect`;
    /// returns the old value.
    fn compare_swap(&self, addr: u64, expect: u64, new: u64) -> Result<u64, Fault>;
    /// Atomically adds `add` to the 8-byte-aligned word at `addr`; returns the old value.
    fn fetch_add(&self, addr: u64, add: u64) -> Result<u64, Fault>;
    /// Atomically takes the 8-byte-aligned word at `addr`, leaving zero.
    fn take(&self, addr: u64) -> Result<u64, Fault>;

    /// Reads a big-endian `u32`.
    fn read_be32(&self, addr: u64) -> Result<u32, Fault> {
        let mut b = [0; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_be_bytes(b))
    }
    /// Whether `len` bytes at `addr` are mapped (`ib_umem_get` pins them or fails with EFAULT).
    fn probe(&self, addr: u64, len: u64) -> bool {
        let mut b = [0u8; 1];
        let end = match addr.checked_add(len) {
            Some(end) => end,
            None => return false,
        };
        if len == 0 {
            return true;
        }
        let mut page = addr & !(crate::abi::PAGE_SIZE - 1);
        while page < end {
            if self.read(page.max(addr), &mut b).is_err() {
                return false;
            }
            page += crate::abi::PAGE_SIZE;
        }
        true
    }
}

/// This process's own memory.
pub struct ProcessMemory;

impl ProcessMemory {
    fn vm(addr: u64, local: *mut u8, len: usize, write: bool) -> Result<(), Fault> {
        if len == 0 {
            return Ok(());
        }
        let local_iov = libc::iovec {
            iov_base: local.cast(),
            iov_len: len,
        };
        let remote_iov = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: `local` points to `len` bytes we own (a slice of the caller); the remote
        // side is checked by the kernel, which fails with EFAULT instead of touching an
        // unmapped address. The call only copies bytes.
        let done = unsafe {
            if write {
                libc::process_vm_writev(libc::getpid(), &local_iov, 1, &remote_iov, 1, 0)
            } else {
                libc::process_vm_readv(libc::getpid(), &local_iov, 1, &remote_iov, 1, 0)
            }
        };
        if done == len as isize {
            Ok(())
        } else {
            Err(Fault)
        }
    }

    /// Stores `value` in the aligned, mapped word at `addr` with one atomic store.
    pub fn store(&self, addr: u64, value: u64) -> Result<(), Fault> {
        self.atomic_at(addr)?.store(value, Ordering::Release);
        Ok(())
    }

    /// The word at `addr` as an atomic, after checking it is aligned and mapped.
    fn atomic_at(&self, addr: u64) -> Result<&AtomicU64, Fault> {
        if addr % 8 != 0 || addr == 0 || !self.probe(addr, 8) {
            return Err(Fault);
        }
        // SAFETY: the address is 8-byte aligned and mapped (probed just now); it is memory the
        // client registered with the device (the callers check it against an MR or a UAR page
        // the model mapped), which the client shares with the device by contract, as with
        // real hardware. Atomic access is what the device does to it.
        Ok(unsafe { &*(addr as *const AtomicU64) })
    }
}

impl Memory for ProcessMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        Self::vm(addr, buf.as_mut_ptr(), buf.len(), false)
    }
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        // process_vm_writev only reads the local buffer.
        Self::vm(addr, data.as_ptr().cast_mut(), data.len(), true)
    }
    fn compare_swap(&self, addr: u64, expect: u64, new: u64) -> Result<u64, Fault> {
        let word = self.atomic_at(addr)?;
        Ok(
            match word.compare_exchange(expect, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(old) | Err(old) => old,
            },
        )
    }
    fn fetch_add(&self, addr: u64, add: u64) -> Result<u64, Fault> {
        Ok(self.atomic_at(addr)?.fetch_add(add, Ordering::AcqRel))
    }
    fn take(&self, addr: u64) -> Result<u64, Fault> {
        Ok(self.atomic_at(addr)?.swap(0, Ordering::AcqRel))
    }
}

/// A test double: a few buffers at fixed fake addresses; any access outside them faults and is
/// counted in [`Arena::stray`].
#[derive(Default)]
pub struct Arena {
    regions: std::sync::Mutex<Vec<(u64, Vec<u8>)>>,
    stray: std::sync::atomic::AtomicUsize,
}

impl Arena {
    /// Adds a zeroed buffer of `len` bytes at `addr`.
    pub fn add(&self, addr: u64, len: usize) {
        self.regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((addr, vec![0; len]));
    }
    /// How many accesses fell outside every buffer.
    pub fn stray(&self) -> usize {
        self.stray.load(Ordering::Relaxed)
    }
    fn with<R>(&self, addr: u64, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, Fault> {
        let mut regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        for (base, bytes) in regions.iter_mut() {
            let Some(off) = addr.checked_sub(*base) else { continue };
            let Ok(off) = usize::try_from(off) else { continue };
            if off.checked_add(len).is_some_and(|end| end <= bytes.len()) {
                return Ok(f(&mut bytes[off..off + len]));
            }
        }
        self.stray.fetch_add(1, Ordering::Relaxed);
        Err(Fault)
    }
    fn word(&self, addr: u64, f: impl FnOnce(u64) -> u64) -> Result<u64, Fault> {
        if addr % 8 != 0 {
            return Err(Fault);
        }
        self.with(addr, 8, |b| {
            let old = u64::from_ne_bytes(b[..8].try_into().unwrap_or_default());
            b.copy_from_slice(&f(old).to_ne_bytes());
            old
        })
    }
}

impl Memory for Arena {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.with(addr, buf.len(), |b| buf.copy_from_slice(b))
    }
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        self.with(addr, data.len(), |b| b.copy_from_slice(data))
    }
    fn compare_swap(&self, addr: u64, expect: u64, new: u64) -> Result<u64, Fault> {
        self.word(addr, |old| if old == expect { new } else { old })
    }
    fn fetch_add(&self, addr: u64, add: u64) -> Result<u64, Fault> {
        self.word(addr, |old| old.wrapping_add(add))
    }
    fn take(&self, addr: u64) -> Result<u64, Fault> {
        self.word(addr, |_| 0)
    }
    /// A probe (the kernel pinning memory) is not a stray access: it is how unmapped memory
    /// is found.
    fn probe(&self, addr: u64, len: u64) -> bool {
        let regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        regions.iter().any(|(base, bytes)| {
            addr >= *base
                && addr
                    .checked_add(len)
                    .is_some_and(|end| end <= base + bytes.len() as u64)
        })
    }
}
