//! Memory regions.

use crate::error::{Error, Result};
use crate::pd::{Pd, PdInner};
use crate::sys::abi::{self, RegMr, RegMrResp};
use crate::sys::cmd;
use crate::sys::ioctl::object;
use crate::wr::{Remote, Sge};
use memmap2::MmapMut;
use std::sync::Arc;

const METHOD_MR_DESTROY: u16 = 1;

bitflags::bitflags! {
    /// `enum ibv_access_flags` (the same values as the kernel's `IB_UVERBS_ACCESS_*`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct AccessFlags: u32 {
        /// The local HCA may write (needed for receives, reads and atomics into it).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA-write into it.
        const REMOTE_WRITE = 1 << 1;
        /// Peers may RDMA-read from it.
        const REMOTE_READ = 1 << 2;
        /// Peers may run atomics on it.
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to it.
        const MW_BIND = 1 << 4;
    }
}

/// A range that does not fit a memory region (from [`Mr::sge`] or [`Mr::remote`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBounds {
    /// Start of the range, from the region's first byte.
    pub offset: usize,
    /// Length of the range.
    pub len: usize,
    /// Length of the region.
    pub mr_len: usize,
}

impl std::fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes at offset {} do not fit the {}-byte memory region",
            self.len, self.offset, self.mr_len
        )
    }
}

impl std::error::Error for OutOfBounds {}

impl From<OutOfBounds> for Error {
    fn from(e: OutOfBounds) -> Self {
        Error::invalid("memory region", e.to_string())
    }
}

/// A registered memory region.
///
/// Either it owns its memory (from [`Pd::alloc_mr`], page aligned and zeroed) or it names
/// memory the caller keeps alive (from the unsafe [`Pd::reg_mr`]).
pub struct Mr {
    pd: Arc<PdInner>,
    handle: u32,
    lkey: u32,
    rkey: u32,
    addr: *mut u8,
    iova: u64,
    len: usize,
    _owned: Option<MmapMut>,
}

// SAFETY: `addr` is only dereferenced through `&self`/`&mut self` methods that follow Rust's
// borrowing rules; the region itself is plain memory with no thread affinity.
unsafe impl Send for Mr {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Mr {}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .finish()
    }
}

impl Pd {
    /// Allocates `len` zeroed, page-aligned bytes and registers them with `access`.
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        let mut map = MmapMut::map_anon(len.max(1)).map_err(|e| Error::io("mmap anonymous", e))?;
        // Registered memory stays with the parent across fork(), as with rdma-core's
        // ibv_fork_init; a child that needs the bytes copies them before forking.
        map.advise(memmap2::Advice::DontFork)
            .map_err(|e| Error::io("madvise(DONTFORK)", e))?;
        let addr = map.as_mut_ptr();
        // SAFETY: `map` is kept in the returned `Mr`, so the region outlives the registration.
        let mut mr = unsafe { self.reg_mr(addr, len, access) }?;
        mr._owned = Some(map);
        Ok(mr)
    }

    /// Registers `len` bytes at `addr` with `access`.
    ///
    /// # Safety
    /// The memory must stay mapped until the returned `Mr` is dropped and every work request
    /// using it has completed. With remote access enabled, peers may write it at any time:
    /// the caller must not hold Rust references to bytes a peer may be writing.
    pub unsafe fn reg_mr(&self, addr: *mut u8, len: usize, access: AccessFlags) -> Result<Mr> {
        // SAFETY: forwarded caller contract.
        unsafe { self.reg_mr_iova(addr, len, addr as u64, access) }
    }

    /// Like [`Pd::reg_mr`], but work requests address the region from `iova` instead of from
    /// `addr` (`ibv_reg_mr_iova`): byte `addr + i` is `iova + i` in SGEs and RDMA.
    ///
    /// # Safety
    /// As for [`Pd::reg_mr`].
    pub unsafe fn reg_mr_iova(&self, addr: *mut u8, len: usize, iova: u64, access: AccessFlags) -> Result<Mr> {
        let req = RegMr {
            response: 0,
            start: addr as u64,
            length: len as u64,
            hca_va: iova,
            pd_handle: self.inner.handle,
            access_flags: access.bits(),
        };
        // REG_MR only pins `start..start+length`; the kernel writes no user memory but the
        // response.
        let ctx = &self.inner.ctx;
        ctx.check_owner("REG_MR")?;
        let mut resp = RegMrResp::default();
        ctx.provider.reg_mr(&mut |drv_in, drv_out| {
            // SAFETY: the core request's pointers name the region, which the kernel only pins;
            // those in the driver data are the provider's to keep valid.
            resp = unsafe { cmd::execute(ctx.fd(), "REG_MR", abi::cmd::REG_MR, &req, drv_in, drv_out) }?;
            Ok(())
        })?;
        Ok(Mr {
            pd: self.inner.clone(),
            handle: resp.mr_handle,
            lkey: resp.lkey,
            rkey: resp.rkey,
            addr,
            iova,
            len,
            _owned: None,
        })
    }
}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The address work requests and peers use for the region's first byte (its start
    /// address unless registered with [`Pd::reg_mr_iova`]).
    pub fn addr(&self) -> u64 {
        self.iova
    }

    /// The kernel's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A scatter/gather entry for the `len` bytes at `offset` in the region.
    pub fn sge(&self, offset: usize, len: u32) -> Result<Sge, OutOfBounds> {
        self.check(offset, len as usize)?;
        Ok(Sge {
            addr: self.iova + offset as u64,
            length: len,
            lkey: self.lkey,
        })
    }

    /// Where a peer's RDMA read, write or atomic lands at `offset` in this region: the
    /// address and rkey to send the peer. `offset` may be the region's length (for
    /// zero-length operations).
    pub fn remote(&self, offset: usize) -> Result<Remote, OutOfBounds> {
        self.check(offset, 0)?;
        Ok(Remote {
            addr: self.iova + offset as u64,
            rkey: self.rkey,
        })
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfBounds> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfBounds {
                offset,
                len,
                mr_len: self.len,
            }),
        }
    }

    /// The bytes. Peers with remote write access, and the device executing receives or reads
    /// into this region, may change them: read only what completed work requests wrote.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `addr..addr+len` is mapped for the life of `self` (owned, or the caller's
        // `reg_mr` contract).
        unsafe { std::slice::from_raw_parts(self.addr, self.len) }
    }

    /// The bytes, mutably (to fill send buffers).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` excludes other local references.
        unsafe { std::slice::from_raw_parts_mut(self.addr, self.len) }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // Deregister before the owned mapping (a later field) is unmapped.
        let _ = self
            .pd
            .ctx
            .destroy("DEREG_MR", object::MR, METHOD_MR_DESTROY, self.handle, &mut []);
    }
}
