//! Memory regions, and the rule for reading and writing them.
//!
//! Rust references and the device must never race on the same bytes. Who else may touch a
//! region decides how its bytes are reached:
//!
//! - An [`Mr`] has no remote write or atomic access ([`Pd::alloc_mr`] takes no such flags: [`LocalAccess`]),
//!   so only this process's own work requests make the device touch it. Its bytes are plain
//!   slices ([`Mr::as_slice`], [`Mr::as_mut_slice`]); the unsafe [`crate::Qp::post_send`] and
//!   [`crate::Qp::post_recv`] make their caller promise not to hold such slices over buffers a
//!   request may still touch. [`Mr::into_bufs`] cuts it into [`Buf`]s, which the safe posting
//!   API (`crate::owned`) lends to the device and gets back with their completions.
//! - A [`RemoteMr`] ([`Pd::alloc_remote_mr`]) lets peers write or run atomics on it at any
//!   time, with no completion here to say when. No safe `&[u8]` exists over it: its bytes are
//!   copied in and out with volatile accesses ([`RemoteMr::read`], [`RemoteMr::write`]), which
//!   are sound while the device writes (a concurrent write may leave a torn copy, never
//!   undefined behaviour). [`RemoteMr::as_slice`] is `unsafe`, for callers who know, from
//!   their own protocol, that no peer writes the bytes while the slice lives.
//! - Memory registered with the unsafe [`Pd::reg_mr`] belongs to the caller, whose contract
//!   covers every access.

use crate::error::{Error, Result};
use crate::pd::{Pd, PdInner};
use crate::sys::abi::{self, RegMr, RegMrResp};
use crate::sys::cmd;
use crate::sys::mapping::Mapping;
use crate::wr::{Remote, Sge};
use std::sync::Arc;

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

bitflags::bitflags! {
    /// The access [`Pd::alloc_mr`] registers an [`Mr`] with: the flags of [`AccessFlags`]
    /// that let no peer change its bytes. Remote write, remote atomic and window binding are
    /// not among them, so asking for them does not compile (they need
    /// [`Pd::alloc_remote_mr`], whose bytes are reached by copies):
    ///
    /// ```compile_fail,E0599
    /// # fn f(pd: &uverbs::Pd) -> uverbs::Result<()> {
    /// let mr = pd.alloc_mr(4096, uverbs::LocalAccess::REMOTE_WRITE)?; // no such flag: E0599
    /// # Ok(()) }
    /// ```
    ///
    /// ```compile_fail,E0308
    /// # fn f(pd: &uverbs::Pd) -> uverbs::Result<()> {
    /// let access = uverbs::AccessFlags::LOCAL_WRITE | uverbs::AccessFlags::REMOTE_WRITE;
    /// let mr = pd.alloc_mr(4096, access)?; // AccessFlags is not LocalAccess: E0308
    /// # Ok(()) }
    /// ```
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct LocalAccess: u32 {
        /// The local HCA may write (needed for receives, reads and atomics into it).
        const LOCAL_WRITE = AccessFlags::LOCAL_WRITE.bits();
        /// Peers may RDMA-read from it.
        const REMOTE_READ = AccessFlags::REMOTE_READ.bits();
    }
}

impl From<LocalAccess> for AccessFlags {
    /// Only [`LocalAccess`]'s own flags: a value built with `LocalAccess::from_bits_retain`
    /// may carry other bits (remote write, say), and those must not reach an [`Mr`], whose
    /// slices are safe only while no peer can write it.
    fn from(a: LocalAccess) -> Self {
        AccessFlags::from_bits_truncate(a.intersection(LocalAccess::all()).bits())
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

/// Access flags that let a peer's requests reach a region.
const PEER_ACCESS: AccessFlags = AccessFlags::REMOTE_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// Access flags that let a peer change a region's bytes at any time: directly, or through a
/// memory window bound over the region (`MW_BIND`).
const PEER_WRITES: AccessFlags = AccessFlags::REMOTE_WRITE
    .union(AccessFlags::REMOTE_ATOMIC)
    .union(AccessFlags::MW_BIND);

/// What every kind of memory region holds of its registration: the kernel's handle and keys,
/// the addresses work requests use, and the memory it allocated itself, if any.
struct Registration {
    pd: Arc<PdInner>,
    handle: u32,
    lkey: u32,
    rkey: u32,
    /// The address of the first byte in work requests and for peers.
    iova: u64,
    len: usize,
    access: AccessFlags,
    /// The memory [`Pd::alloc_mr`] and [`Pd::alloc_remote_mr`] mapped for the region.
    owned: Option<Mapping>,
}

impl Registration {
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

    fn sge(&self, offset: usize, len: u32) -> Result<Sge, OutOfBounds> {
        self.check(offset, len as usize)?;
        Ok(Sge {
            addr: self.iova + offset as u64,
            length: len,
            lkey: self.lkey,
        })
    }

    fn remote(&self, offset: usize) -> Result<Remote, OutOfBounds> {
        self.check(offset, 0)?;
        Ok(Remote {
            addr: self.iova + offset as u64,
            rkey: self.rkey,
        })
    }

    /// Deregisters the region (the [`Drop`] of each kind), after the QPs' responders let go
    /// of it where the kernel would wait for them, then unmaps the memory it owns.
    fn deregister(&mut self) {
        let mut owned = self.owned.take();
        // A region peers can access may be held by a QP's responder in the middle of a
        // message; where the kernel's DEREG_MR would wait for it (rxe), it waits for the QPs.
        if self.access.intersects(PEER_ACCESS) && self.pd.ctx.provider.dereg_waits_for_responders() {
            match self.pd.park_mr(self.handle, owned) {
                Ok(()) => return,
                Err(back) => owned = back,
            }
        }
        // Deregistered before the mapping is unmapped (leaked if DEREG_MR failed).
        self.pd.dereg_mr(self.handle, owned);
    }
}

/// The accessors every kind of memory region has, over its [`Registration`] at `self.$reg`;
/// `$addr_doc` says what its address is.
macro_rules! region_accessors {
    ($($reg:ident).+, $addr_doc:literal) => {
        /// Local key.
        pub fn lkey(&self) -> u32 {
            self.$($reg).+.lkey
        }

        /// Remote key: what a peer needs, with the address [`Self::remote`] gives, to reach
        /// the region.
        pub fn rkey(&self) -> u32 {
            self.$($reg).+.rkey
        }

        #[doc = $addr_doc]
        pub fn addr(&self) -> u64 {
            self.$($reg).+.iova
        }

        /// The kernel's handle.
        pub fn handle(&self) -> u32 {
            self.$($reg).+.handle
        }

        /// Length in bytes.
        pub fn len(&self) -> usize {
            self.$($reg).+.len
        }

        /// Whether the region is empty.
        pub fn is_empty(&self) -> bool {
            self.$($reg).+.len == 0
        }

        /// The access it was registered with.
        pub fn access(&self) -> AccessFlags {
            self.$($reg).+.access
        }

        /// A scatter/gather entry for the `len` bytes at `offset` in the region.
        pub fn sge(&self, offset: usize, len: u32) -> Result<Sge, OutOfBounds> {
            self.$($reg).+.sge(offset, len)
        }

        /// Where a peer's RDMA read, write or atomic lands at `offset` in this region: the
        /// address and rkey to send the peer. `offset` may be the region's length (for
        /// zero-length operations).
        pub fn remote(&self, offset: usize) -> Result<Remote, OutOfBounds> {
            self.$($reg).+.remote(offset)
        }
    };
}

/// A registered memory region that no peer may write (see the module docs for the rule).
///
/// Either it owns its memory (from [`Pd::alloc_mr`], page aligned and zeroed) or it names
/// memory the caller keeps alive (from the unsafe [`Pd::reg_mr`]).
pub struct Mr {
    reg: Registration,
    addr: *mut u8,
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
            .field("len", &self.reg.len)
            .field("lkey", &self.reg.lkey)
            .field("rkey", &self.reg.rkey)
            .finish()
    }
}

impl Pd {
    /// Allocates `len` zeroed, page-aligned bytes and registers them with `access`: local
    /// write and remote read at most ([`LocalAccess`]; remote write, remote atomic or window
    /// binding does not compile, since a peer, or a window bound over the region, could change
    /// the bytes under a slice). For memory peers write, [`Pd::alloc_remote_mr`].
    /// A `LocalAccess` built with `from_bits_retain` keeps only its own flags (the others
    /// are dropped, not registered).
    pub fn alloc_mr(&self, len: usize, access: LocalAccess) -> Result<Mr> {
        let access = AccessFlags::from(access);
        debug_assert!(!access.intersects(PEER_WRITES));
        self.alloc_any_mr(len, access)
    }

    /// Allocates `len` zeroed, page-aligned bytes that peers may write, registered with
    /// `access` (any flags); its bytes are reached by copies (see [`RemoteMr`]).
    pub fn alloc_remote_mr(&self, len: usize, access: AccessFlags) -> Result<RemoteMr> {
        Ok(RemoteMr {
            mr: self.alloc_any_mr(len, access)?,
        })
    }

    fn alloc_any_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        // Registered memory stays with the parent across fork(): a child finds zeros there
        // (`Mapping`); one that needs the bytes copies them before forking.
        let mut map = Mapping::anon(len, false).map_err(|e| Error::io("mmap anonymous", e))?;
        let addr = map.as_mut_ptr();
        // SAFETY: `map` is kept in the returned `Mr`, so the region outlives the registration.
        let mut mr = unsafe { self.reg_mr(addr, len, access) }?;
        mr.reg.owned = Some(map);
        Ok(mr)
    }

    /// Registers `len` bytes at `addr` with `access`.
    ///
    /// # Safety
    /// The memory must stay mapped until the returned `Mr` is dropped and every work request
    /// using it has completed. With remote write or atomic access, peers may write it at any
    /// time: the caller must not hold Rust references to bytes a peer may be writing, and so
    /// must not use [`Mr::as_slice`], [`Mr::as_mut_slice`] or [`Mr::into_bufs`] on it while
    /// a peer may.
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
            reg: Registration {
                pd: self.inner.clone(),
                handle: resp.mr_handle,
                lkey: resp.lkey,
                rkey: resp.rkey,
                iova,
                len,
                access,
                owned: None,
            },
            addr,
        })
    }
}

impl Mr {
    region_accessors!(
        reg,
        "The address work requests and peers use for the region's first byte (its start \
         address unless registered with [`Pd::reg_mr_iova`])."
    );

    /// The bytes. No peer writes them; the device executing this process's receives, reads
    /// and atomics may, which is why those posts are `unsafe`: read only what completed work
    /// requests wrote.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `addr..addr+len` is mapped for the life of `self` (owned, or the caller's
        // `reg_mr` contract).
        unsafe { std::slice::from_raw_parts(self.addr, self.reg.len) }
    }

    /// The bytes, mutably (to fill send buffers).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` excludes other local references.
        unsafe { std::slice::from_raw_parts_mut(self.addr, self.reg.len) }
    }
}

impl Mr {
    /// Cuts the region into [`Buf`]s of `size` bytes each (the last one shorter if `size`
    /// does not divide the length), each owned by one holder at a time. The region lives
    /// until the last of them is dropped. Refused for memory registered with remote write or
    /// atomic access (possible only through the unsafe [`Pd::reg_mr`]), and for a `size` of 0
    /// or above `u32::MAX`.
    pub fn into_bufs(self, size: usize) -> Result<Vec<Buf>> {
        if self.reg.access.intersects(PEER_WRITES) {
            return Err(Error::invalid("into_bufs", "peers may write this region"));
        }
        let cap = u32::try_from(size)
            .ok()
            .filter(|&c| c > 0)
            .ok_or_else(|| Error::invalid("into_bufs", format!("buffer size {size}: 1 to 2^32-1 bytes")))?;
        let (iova, lkey, len) = (self.reg.iova, self.reg.lkey, self.reg.len);
        let mr = Arc::new(self);
        Ok((0..len)
            .step_by(size)
            .map(|offset| {
                let cap = piece_len(len, offset, cap);
                Buf(Box::new(BufPart {
                    sge: Sge {
                        addr: iova + offset as u64,
                        length: cap,
                        lkey,
                    },
                    whole: Sge {
                        addr: iova + offset as u64,
                        length: cap,
                        lkey,
                    },
                    request: 0,
                    mr: mr.clone(),
                }))
            })
            .collect())
    }
}

/// The length of the piece of a `len`-byte region at `offset` (below `len`) cut by
/// [`Mr::into_bufs`] in pieces of `size`: `size`, or what is left of a shorter tail. Regions
/// of 4 GiB and more leave tails that do not fit a `u32`, which is then not the shorter one.
fn piece_len(len: usize, offset: usize, size: u32) -> u32 {
    u32::try_from(len - offset).map_or(size, |left| left.min(size))
}

/// A piece of an [`Mr`] with one owner at a time (from [`Mr::into_bufs`]): the caller, who
/// reads and writes it as a plain slice, or a QP, which holds it from the safe post that
/// lends it to the device until the completion that gives it back (`Qp::reclaim`).
///
/// It has a capacity (its share of the region) and a length, the bytes a send or write
/// gathers, a read fetches, or a receive delivered.
///
/// One pointer wide: posting moves a word, and the work request points at the SGE behind it.
pub struct Buf(Box<BufPart>);

/// What a [`Buf`] is. Boxed once by `into_bufs`, so a post or a completion moves no more than
/// the pointer and the SGE keeps its address while the QP holds the buffer.
#[repr(C)] // the SGE first: a request names it at the box's own address
struct BufPart {
    /// The bytes `0..len` as a work request names them.
    sge: Sge,
    /// The whole buffer, `0..capacity`, as a receive names it (changed only by the stream's
    /// send ring, which moves bytes between pieces of one region).
    whole: Sge,
    /// The id of the SRQ receive it was last posted with (`crate::held::SrqHeld`).
    request: u64,
    mr: Arc<Mr>,
}

// A post moves one word; a slot of the QP's ring holds one (`None` is the null pointer).
const _: () = assert!(size_of::<Buf>() == size_of::<usize>());
const _: () = assert!(size_of::<Option<Buf>>() == size_of::<usize>());

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buf")
            .field("offset", &self.offset())
            .field("len", &self.0.sge.length)
            .field("cap", &self.0.whole.length)
            .field("lkey", &self.0.sge.lkey)
            .finish()
    }
}

impl Buf {
    /// Where the buffer starts within its region.
    pub fn offset(&self) -> usize {
        (self.0.sge.addr - self.0.mr.reg.iova) as usize
    }

    /// Its length: what a send or write takes, what a read fetches, what a receive delivered.
    pub fn len(&self) -> usize {
        self.0.sge.length as usize
    }

    /// Whether the length is 0.
    pub fn is_empty(&self) -> bool {
        self.0.sge.length == 0
    }

    /// Its share of the region: the most `len` may be, and what a receive may fill.
    pub fn capacity(&self) -> usize {
        self.0.whole.length as usize
    }

    /// Sets the length, up to the capacity.
    pub fn set_len(&mut self, len: usize) -> Result<(), OutOfBounds> {
        match u32::try_from(len) {
            Ok(l) if l <= self.0.whole.length => {
                self.0.sge.length = l;
                Ok(())
            }
            _ => Err(OutOfBounds {
                offset: self.offset(),
                len,
                mr_len: self.0.whole.length as usize,
            }),
        }
    }

    /// The region's local key.
    pub fn lkey(&self) -> u32 {
        self.0.sge.lkey
    }

    /// The bytes `0..len`.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the range lies in the region (`into_bufs` cut it so), which `self.0.mr` keeps
        // mapped; no other `Buf` covers it, no peer may write the region, and the device
        // touches it only while a QP holds this `Buf` (then no `&self` exists).
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len()) }
    }

    /// The bytes `0..len`, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` excludes every other reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len()) }
    }

    /// Sets the length to `data.len()` and copies `data` in.
    pub fn fill_from(&mut self, data: &[u8]) -> Result<(), OutOfBounds> {
        self.set_len(data.len())?;
        self.as_mut_slice().copy_from_slice(data);
        Ok(())
    }

    /// The scatter/gather entry for the bytes `0..len`, while the buffer is posted.
    #[inline]
    pub(crate) fn sge(&self) -> &Sge {
        &self.0.sge
    }

    /// The bytes `0..len` as a receive delivered `byte_len` of them (clamped to the capacity).
    #[inline]
    pub(crate) fn received(&mut self, byte_len: u32) {
        self.0.sge.length = byte_len.min(self.0.whole.length);
    }

    /// Records the id of the SRQ receive it is posted with.
    #[inline]
    pub(crate) fn set_request(&mut self, id: u64) {
        self.0.request = id;
    }

    /// The id [`Buf::set_request`] recorded last.
    #[inline]
    pub(crate) fn request(&self) -> u64 {
        self.0.request
    }

    /// The scatter/gather entry for the whole capacity, which a receive may fill.
    #[inline]
    pub(crate) fn whole_sge(&self) -> &Sge {
        &self.0.whole
    }

    /// An empty buffer (capacity 0) of the same region, at this one's start: a handle that
    /// [`Buf::take_front`] gives bytes to. It covers no byte.
    #[cfg(feature = "tokio")] // the stream's send ring
    pub(crate) fn empty_handle(&self) -> Buf {
        let at = Sge {
            addr: self.0.sge.addr,
            length: 0,
            lkey: self.0.sge.lkey,
        };
        Buf(Box::new(BufPart {
            sge: at,
            whole: at,
            request: 0,
            mr: self.0.mr.clone(),
        }))
    }

    /// Moves the first `n` bytes of `from`'s capacity to the end of this buffer's, if both are
    /// pieces of one region, `n` is at most `from`'s capacity, and this buffer ends where
    /// `from` starts or is empty (it then moves to where `from` starts). Both lengths are then
    /// their capacities. False, and nothing changed, otherwise. The bytes pass from one owner
    /// to the other, so no byte is in two buffers (the rule `Buf::as_slice` relies on).
    #[cfg(feature = "tokio")] // the stream's send ring
    pub(crate) fn take_front(&mut self, from: &mut Buf, n: usize) -> bool {
        let Ok(n32) = u32::try_from(n) else {
            return false;
        };
        let (to, src) = (&mut *self.0, &mut *from.0);
        let joins = to.whole.length == 0 || to.whole.addr + u64::from(to.whole.length) == src.whole.addr;
        let total = to.whole.length.checked_add(n32);
        if !Arc::ptr_eq(&to.mr, &src.mr) || n32 > src.whole.length || !joins {
            return false;
        }
        let Some(total) = total else {
            return false;
        };
        if to.whole.length == 0 {
            to.whole.addr = src.whole.addr;
        }
        to.whole.length = total;
        src.whole.addr += u64::from(n32);
        src.whole.length -= n32;
        to.sge = to.whole;
        src.sge = src.whole;
        true
    }

    fn ptr(&self) -> *mut u8 {
        // The offset is below the region's length, so this stays in the mapping.
        self.0.mr.addr.wrapping_add(self.offset())
    }
}

/// Copies `out.len()` bytes from `src` into `out`, each read once with a volatile load (a byte
/// written meanwhile comes out old or new): aligned [`Wide`] loads where `src` allows, bytes at
/// either end.
///
/// # Safety
/// `src..src + out.len()` is mapped and readable for the call.
unsafe fn volatile_copy(src: *const u8, out: &mut [u8]) {
    let len = out.len();
    // Every store goes through `dst`, which `&mut` lets no one else reach meanwhile.
    let dst = out.as_mut_ptr();
    let head = src.align_offset(WIDE).min(len);
    for i in 0..head {
        // SAFETY: `src + i` and `dst + i` lie in the two ranges (`i < len`); `src`'s is
        // mapped (the caller's promise); volatile, so a concurrent device write is not a data
        // race in Rust's model.
        unsafe { dst.add(i).write(src.add(i).read_volatile()) };
    }
    let mut at = head;
    while len - at >= 2 * WIDE {
        // SAFETY: as above; `src + at` is aligned to `WIDE` and `2 * WIDE` bytes from there
        // lie in both ranges; the stores are unaligned.
        unsafe {
            let a = src.add(at).cast::<Wide>().read_volatile();
            let b = src.add(at + WIDE).cast::<Wide>().read_volatile();
            dst.add(at).cast::<Wide>().write_unaligned(a);
            dst.add(at + WIDE).cast::<Wide>().write_unaligned(b);
        }
        at += 2 * WIDE;
    }
    if len - at >= WIDE {
        // SAFETY: as above, for `WIDE` bytes.
        unsafe {
            let a = src.add(at).cast::<Wide>().read_volatile();
            dst.add(at).cast::<Wide>().write_unaligned(a);
        }
        at += WIDE;
    }
    for i in at..len {
        // SAFETY: as for the head.
        unsafe { dst.add(i).write(src.add(i).read_volatile()) };
    }
}

/// The unit of [`RemoteMr::read`]'s volatile loads: an SSE register on x86-64 (every x86-64
/// CPU has SSE2), a word elsewhere.
#[cfg(target_arch = "x86_64")]
type Wide = std::arch::x86_64::__m128i;
#[cfg(not(target_arch = "x86_64"))]
type Wide = u64;
const WIDE: usize = size_of::<Wide>();

/// A registered memory region peers may write or run atomics on (from
/// [`Pd::alloc_remote_mr`]). Its bytes are reached by volatile copies, sound while the
/// device writes them; a plain slice only through the `unsafe` [`RemoteMr::as_slice`].
#[derive(Debug)]
pub struct RemoteMr {
    mr: Mr,
}

impl RemoteMr {
    region_accessors!(
        mr.reg,
        "The address work requests and peers use for the region's first byte."
    );

    /// Copies the bytes at `offset` into `out`, each read once with a volatile load: a byte a
    /// peer writes meanwhile comes out old or new. Aligned 16-byte loads where the source
    /// allows (8-byte ones on targets other than x86-64), bytes at either end.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds> {
        self.mr.reg.check(offset, out.len())?;
        // SAFETY: the range lies in the region (checked above), which stays mapped while
        // `self` lives.
        unsafe { volatile_copy(self.mr.addr.wrapping_add(offset), out) };
        Ok(())
    }

    /// The `len` bytes at `offset`, copied as [`RemoteMr::read`] does.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, OutOfBounds> {
        let mut v = vec![0; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// Copies `data` in at `offset`, each byte written once with a volatile store (a peer
    /// writing the same bytes meanwhile leaves either value).
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        self.mr.reg.check(offset, data.len())?;
        let dst = self.mr.addr.wrapping_add(offset);
        let head = dst.align_offset(8).min(data.len());
        let words = (data.len() - head) / 8;
        for (i, &b) in data[..head].iter().enumerate() {
            // SAFETY: in the region (checked above), mapped while `self` lives; `&mut self`
            // excludes other Rust accesses, volatile makes the device's concurrent ones
            // defined.
            unsafe { dst.add(i).write_volatile(b) };
        }
        for w in 0..words {
            let at = head + 8 * w;
            let v = u64::from_ne_bytes(data[at..at + 8].try_into().expect("8 bytes"));
            // SAFETY: as above; `dst + at` is 8-byte aligned and 8 bytes lie in the range.
            unsafe { dst.add(at).cast::<u64>().write_volatile(v) };
        }
        for (i, &b) in data.iter().enumerate().skip(head + 8 * words) {
            // SAFETY: as above.
            unsafe { dst.add(i).write_volatile(b) };
        }
        Ok(())
    }

    /// Sets the `len` bytes at `offset` to `byte`, as [`RemoteMr::write`] would.
    pub fn fill(&mut self, offset: usize, len: usize, byte: u8) -> Result<(), OutOfBounds> {
        self.mr.reg.check(offset, len)?;
        for i in offset..offset + len {
            // SAFETY: in the region (checked above); see `write`.
            unsafe { self.mr.addr.add(i).write_volatile(byte) };
        }
        Ok(())
    }

    /// The bytes as a plain slice.
    ///
    /// # Safety
    /// While the slice lives, no peer may write or run atomics on the region and no work
    /// request of this process may write it (the caller's protocol must ensure it, e.g. the
    /// peer's writes all completed and it was told not to write again).
    pub unsafe fn as_slice(&self) -> &[u8] {
        self.mr.as_slice()
    }

    /// The bytes as a plain mutable slice.
    ///
    /// # Safety
    /// As for [`RemoteMr::as_slice`] (a peer reading meanwhile may see a mix of old and new
    /// bytes; that is the protocol's concern, not a soundness one).
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        self.mr.as_mut_slice()
    }
}

/// `UVERBS_METHOD_REG_DMABUF_MR` of `UVERBS_OBJECT_MR` and its attributes
/// (`ib_user_ioctl_cmds.h`).
const METHOD_REG_DMABUF_MR: u16 = 4;
mod dmabuf_attr {
    pub const HANDLE: u16 = 0;
    pub const PD_HANDLE: u16 = 1;
    pub const OFFSET: u16 = 2;
    pub const LENGTH: u16 = 3;
    pub const IOVA: u16 = 4;
    pub const FD: u16 = 5;
    pub const ACCESS_FLAGS: u16 = 6;
    pub const RESP_LKEY: u16 = 7;
    pub const RESP_RKEY: u16 = 8;
}

/// A memory region over a dma-buf (from [`Pd::reg_dmabuf_mr`]): GPU or device memory that
/// another driver (the exporter) owns. This process may not have it mapped at all, so the
/// region gives out no bytes, only its keys and addresses: use it in scatter/gather entries
/// of the unsafe posts ([`DmabufMr::sge`]) and as a target for peers ([`DmabufMr::remote`],
/// [`DmabufMr::region`]). The bytes are read and written through the exporter.
pub struct DmabufMr {
    reg: Registration,
}

impl std::fmt::Debug for DmabufMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmabufMr")
            .field("iova", &self.reg.iova)
            .field("len", &self.reg.len)
            .field("lkey", &self.reg.lkey)
            .field("rkey", &self.reg.rkey)
            .finish()
    }
}

impl Pd {
    /// Registers `length` bytes at `offset` in the dma-buf `fd` with `access`
    /// (`ibv_reg_dmabuf_mr`, the ioctl `REG_DMABUF_MR`); work requests and peers address
    /// byte `offset + i` of the buffer as `iova + i`. The kernel keeps its own reference to
    /// the dma-buf, so `fd` may be closed afterwards.
    ///
    /// Errors: [`Error::Unsupported`] where the device's driver has no dma-buf registration
    /// (rdma_rxe and siw on Linux 6.1 among them: the kernel answers `EOPNOTSUPP`) or the
    /// kernel lacks the method (`EPROTONOSUPPORT`); [`Error::InvalidArgument`] when `offset`
    /// and `iova` differ in their offset within a page (the kernel requires them equal) or
    /// the range wraps; otherwise the kernel's errno as [`Error::Kernel`] (`EINVAL` for a
    /// range past the buffer's end or an fd that is not a dma-buf, `EBADF` for an fd that is
    /// not open).
    pub fn reg_dmabuf_mr(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        length: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<DmabufMr> {
        const VERB: crate::error::Verb = "REG_DMABUF_MR";
        // The kernel compares the offsets within its own pages.
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| u64::try_from(p).ok())
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096);
        let page_mask = page - 1;
        if offset & page_mask != iova & page_mask {
            return Err(Error::invalid(
                VERB,
                format!("offset {offset:#x} and iova {iova:#x} must have the same offset within a page"),
            ));
        }
        let len64 = length as u64;
        if offset.checked_add(len64).is_none() || iova.checked_add(len64).is_none() {
            return Err(Error::invalid(
                VERB,
                format!("{length} bytes from offset {offset:#x} or iova {iova:#x} wrap"),
            ));
        }
        let ctx = &self.inner.ctx;
        use std::os::fd::AsRawFd;
        let raw_fd = fd.as_raw_fd() as u32;
        let access_bits = access.bits();
        let (mut lkey, mut rkey) = (0u32, 0u32);
        let mut call = ctx.ioctl(crate::sys::ioctl::object::MR, METHOD_REG_DMABUF_MR);
        let slot = call.new_handle(dmabuf_attr::HANDLE);
        call.handle(dmabuf_attr::PD_HANDLE, self.inner.handle)
            .input(dmabuf_attr::OFFSET, &offset)
            .input(dmabuf_attr::LENGTH, &len64)
            .input(dmabuf_attr::IOVA, &iova)
            .input(dmabuf_attr::FD, &raw_fd)
            .input(dmabuf_attr::ACCESS_FLAGS, &access_bits)
            .output(dmabuf_attr::RESP_LKEY, zerocopy::IntoBytes::as_mut_bytes(&mut lkey))
            .output(dmabuf_attr::RESP_RKEY, zerocopy::IntoBytes::as_mut_bytes(&mut rkey));
        let done = call.execute(ctx.fd(), VERB).map_err(|e| match e.errno() {
            Some(nix::errno::Errno::EOPNOTSUPP) => Error::Unsupported {
                verb: VERB,
                what: "dma-buf memory regions: the device's kernel driver has no reg_user_mr_dmabuf (EOPNOTSUPP)",
            },
            Some(nix::errno::Errno::EPROTONOSUPPORT) => Error::Unsupported {
                verb: VERB,
                what: "dma-buf memory regions: the kernel has no REG_DMABUF_MR method (EPROTONOSUPPORT)",
            },
            _ => e,
        })?;
        Ok(DmabufMr {
            reg: Registration {
                pd: self.inner.clone(),
                handle: done.handle(slot),
                lkey,
                rkey,
                iova,
                len: length,
                access,
                owned: None,
            },
        })
    }
}

impl DmabufMr {
    region_accessors!(
        reg,
        "The address work requests and peers use for the region's first byte (the `iova` it \
         was registered with)."
    );
}

impl Drop for DmabufMr {
    fn drop(&mut self) {
        self.reg.deregister();
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.reg.deregister();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn local_access_smuggles_no_peer_write_into_an_mr() {
        let smuggled = super::LocalAccess::from_bits_retain(0x1f);
        assert_eq!(
            super::AccessFlags::from(smuggled),
            super::AccessFlags::LOCAL_WRITE | super::AccessFlags::REMOTE_READ
        );
    }

    /// The volatile copy gives the source's bytes at every alignment and length, wide loads
    /// and byte ends alike.
    #[test]
    fn volatile_copy_copies_at_every_alignment() {
        let src: Vec<u8> = (0..200u32).map(|i| (i * 7 + 3) as u8).collect();
        for start in 0..40 {
            for len in [0, 1, 7, 15, 16, 17, 31, 32, 33, 47, 48, 64, 100, 160 - start] {
                let mut out = vec![0xEEu8; len];
                // SAFETY: `start + len` is at most 160, within `src`.
                unsafe { super::volatile_copy(src.as_ptr().add(start), &mut out) };
                assert_eq!(out, &src[start..start + len], "start {start} len {len}");
            }
        }
    }

    use super::piece_len;

    /// Each piece is `size` bytes but the last, which is what is left, at every region size
    /// the kernel registers: the first piece of a 4 GiB region is not 0 bytes.
    #[test]
    fn pieces_of_regions_of_any_size() {
        const GIB: usize = 1 << 30;
        assert_eq!(piece_len(4 * GIB, 0, 2048), 2048);
        assert_eq!(piece_len(4 * GIB, 4 * GIB - 2048, 2048), 2048);
        assert_eq!(piece_len(4 * GIB + 5, 0, u32::MAX), u32::MAX);
        assert_eq!(piece_len(4 * GIB + 5, u32::MAX as usize, u32::MAX), 6);
        assert_eq!(piece_len(8 * GIB, 4 * GIB, 4096), 4096);
        assert_eq!(piece_len(100, 96, 64), 4);
        assert_eq!(piece_len(1, 0, 1), 1);
        // The pieces cover the region exactly.
        for (len, size) in [(4 * GIB + 5, u32::MAX), (5 * GIB, 1 << 31), (3000, 1024)] {
            let total: usize = (0..len)
                .step_by(size as usize)
                .map(|o| piece_len(len, o, size) as usize)
                .sum();
            assert_eq!(total, len, "{len} in pieces of {size}");
        }
    }
}
