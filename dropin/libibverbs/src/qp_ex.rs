//! The extended QP's work request interface: `ibv_wr_start`, the `ibv_wr_*` builders and
//! setters, `ibv_wr_complete` and `ibv_wr_abort`.
//!
//! Between `ibv_wr_start` and `ibv_wr_complete` (or `ibv_wr_abort`) the QP's lock is held, as
//! rdma-core's rxe holds its send queue lock. Each builder adds one `uverbs::SendWr` to room the
//! QP allocated at creation (one per send queue entry), setters fill in the last one, copying
//! scatter/gather lists and inline data into room of the QP's own (the caller's may go away
//! as soon as the setter returns), and `ibv_wr_complete` posts the lot with one
//! `uverbs::Qp::post_send_batch`, a chain as `ibv_post_send` posts: one doorbell, no
//! allocation, the requests checked as the C provider's `ibv_wr_complete` checks them (no
//! atomic's length or alignment: the kernel judges) and written in any QP state (the kernel
//! refuses the doorbell below RTS, EINVAL, and the requests run once the QP is in RTS and a
//! doorbell rings, as with librxe). As in the C provider, the first
//! error (a full send queue, too many SGEs, too much inline data) is kept, the rest of the
//! batch ignored, and `ibv_wr_complete` returns it without posting anything. The send queue
//! is full for a builder when the batch already holds as many requests as the queue has
//! free slots at that moment (`uverbs::Qp::send_room`, read again only when the room known
//! runs out), the C provider's test.

use crate::abi::{ibv_ah, ibv_data_buf, ibv_mw, ibv_mw_bind_info, ibv_qp_ex, ibv_sge, send_ops};
use crate::ah::Ah;
use crate::qp::Qp;
use libc::{c_int, c_void, size_t};
use std::ptr::NonNull;
use uverbs::{CRdmaArm, CSendArm, CSendWr, QpCap, QpType, Remote, SendFlags, SendOp, SendWr, Sge};

/// The `ibv_wr_*` builders of each transport, as rdma-core v44's rxe offers them.
pub(crate) const RC_OPS: u64 = send_ops::RDMA_WRITE
    | send_ops::RDMA_WRITE_WITH_IMM
    | send_ops::SEND
    | send_ops::SEND_WITH_IMM
    | send_ops::RDMA_READ
    | send_ops::ATOMIC_CMP_AND_SWP
    | send_ops::ATOMIC_FETCH_AND_ADD
    | send_ops::LOCAL_INV
    | send_ops::BIND_MW
    | send_ops::SEND_WITH_INV
    | send_ops::ATOMIC_WRITE;
pub(crate) const UC_OPS: u64 = send_ops::RDMA_WRITE
    | send_ops::RDMA_WRITE_WITH_IMM
    | send_ops::SEND
    | send_ops::SEND_WITH_IMM
    | send_ops::BIND_MW
    | send_ops::SEND_WITH_INV;
pub(crate) const UD_OPS: u64 = send_ops::SEND | send_ops::SEND_WITH_IMM;

/// The requests of one `ibv_wr_start` .. `ibv_wr_complete` batch, and room for what they
/// point at. Used only with the QP's lock held.
pub(crate) struct WrBuilder {
    /// The requests built so far. Their scatter/gather lists point into `sges` and UD
    /// destinations at the caller's AHs: `'static` stands for "until the batch ends", which
    /// both outlive (the AHs by the caller's contract, as with `ibv_post_send`).
    wrs: Vec<SendWr<'static>>,
    /// Room for the chain `ibv_wr_complete` posts: one link per request of `wrs`.
    links: Vec<Link>,
    /// Scatter/gather entries copied from the setters, and entries naming `inline`.
    sges: Vec<Sge>,
    /// Inline data copied from the setters.
    inline: Vec<u8>,
    max_sge: usize,
    max_inline: usize,
    /// Free send queue slots as last read; read again when the batch reaches it.
    room: usize,
    /// The first error of the batch (errno), or 0.
    err: c_int,
}

// SAFETY: the references inside `wrs` point into `sges` and `inline` (moved along with the
// builder, and never reallocated: see `WrBuilder::new`) and at AHs, which are `Sync`; the
// pointers inside `links` name `wrs` and `links`, made again for each post; the
// builder is used by one thread at a time, under the QP's lock.
unsafe impl Send for WrBuilder {}

impl WrBuilder {
    /// No room: for QPs created without `ibv_wr_*` builders (allocates nothing).
    pub(crate) fn none() -> Self {
        Self {
            wrs: Vec::new(),
            links: Vec::new(),
            sges: Vec::new(),
            inline: Vec::new(),
            max_sge: 0,
            max_inline: 0,
            room: 0,
            err: 0,
        }
    }

    /// Room for a full send queue of `depth` requests (those an empty queue takes: rdma_rxe
    /// 6.1 reports the depth asked at create, 8 say, for a ring that takes 15) with `cap`'s
    /// SGEs and inline data. The vectors never grow past this capacity, so what points into
    /// them stays valid.
    pub(crate) fn new(cap: &QpCap, depth: u32) -> Self {
        let wrs = depth.max(cap.max_send_wr) as usize;
        let max_sge = cap.max_send_sge as usize;
        let max_inline = cap.max_inline_data as usize;
        Self {
            wrs: Vec::with_capacity(wrs),
            links: Vec::with_capacity(wrs),
            // Inline data takes one entry of its own.
            sges: Vec::with_capacity(wrs * max_sge.max(1)),
            inline: Vec::with_capacity(wrs * max_inline),
            max_sge,
            max_inline,
            room: 0,
            err: 0,
        }
    }

    fn clear(&mut self) {
        self.wrs.clear();
        self.links.clear();
        self.sges.clear();
        self.inline.clear();
        self.room = 0;
        self.err = 0;
    }

    /// The last request built, for a setter; an error if there is none.
    fn last(&mut self) -> Option<&mut SendWr<'static>> {
        if self.err != 0 {
            return None;
        }
        if self.wrs.is_empty() {
            self.err = libc::EINVAL;
        }
        self.wrs.last_mut()
    }

    /// Copies `list` into `sges` and makes it the last request's list.
    fn set_sges(&mut self, list: &[Sge]) {
        if self.last().is_none() {
            return;
        }
        if list.len() > self.max_sge.max(1) || self.sges.len() + list.len() > self.sges.capacity() {
            self.err = libc::ENOSPC;
            return;
        }
        let start = self.sges.len();
        self.sges.extend_from_slice(list);
        // SAFETY: `start..start + list.len()` was just written; `sges` never grows past its
        // capacity (checked above), so the entries stay where they are until `clear`, which
        // also empties `wrs`.
        let copied: &'static [Sge] = unsafe { std::slice::from_raw_parts(self.sges.as_ptr().add(start), list.len()) };
        if let Some(wr) = self.wrs.last_mut() {
            wr.sg_list = copied;
        }
    }

    /// Copies the buffers into `inline` and makes them the last request's inline data.
    fn set_inline(&mut self, bufs: &[(*const u8, usize)]) {
        if self.last().is_none() {
            return;
        }
        let total = bufs.iter().map(|&(_, len)| len).fold(0usize, usize::saturating_add);
        if total > self.max_inline || self.inline.len() + total > self.inline.capacity() {
            self.err = libc::ENOSPC;
            return;
        }
        let start = self.inline.len();
        for &(addr, len) in bufs {
            if len != 0 {
                // SAFETY: the caller's buffer of `len` bytes (the ibv_wr_set_inline_data*
                // contract).
                self.inline
                    .extend_from_slice(unsafe { std::slice::from_raw_parts(addr, len) });
            }
        }
        let sge = Sge {
            // SAFETY: `start` is at most the length; `inline` never grows past its capacity,
            // so the bytes stay where they are until `clear`.
            addr: unsafe { self.inline.as_ptr().add(start) } as u64,
            length: total as u32,
            lkey: 0,
        };
        self.set_sges(&[sge]);
        if let Some(wr) = self.wrs.last_mut() {
            wr.flags |= SendFlags::INLINE;
        }
    }
}

/// A link of the chain a batch is posted as: a C request with no opcode libibverbs has, so
/// that the core hands it to [`built_wr`] (`uverbs::SlowDecode`), which returns the request
/// built.
#[repr(C)]
struct Link {
    c: CSendWr,
    wr: *const SendWr<'static>,
}

impl WrBuilder {
    /// Links the requests built into a chain in `links`; its first link. `wrs` must not be
    /// empty, and neither may change until the chain is posted.
    fn chain(&mut self) -> NonNull<CSendWr> {
        self.links.clear();
        for wr in &self.wrs {
            self.links.push(Link {
                c: CSendWr {
                    wr_id: wr.wr_id,
                    next: std::ptr::null_mut(),
                    sg_list: std::ptr::null_mut(),
                    num_sge: 0,
                    // No libibverbs opcode: the core reads no field of the link itself.
                    opcode: u32::MAX,
                    send_flags: 0,
                    imm_data: 0,
                    wr: CSendArm::rdma(CRdmaArm {
                        remote_addr: 0,
                        rkey: 0,
                    }),
                },
                wr,
            });
        }
        // `links` holds as many as `wrs` (same capacity), so it never reallocated above.
        let base = self.links.as_mut_ptr();
        for i in 1..self.links.len() {
            // SAFETY: `i - 1` and `i` are links just written.
            unsafe { (*base.add(i - 1)).c.next = std::ptr::addr_of_mut!((*base.add(i)).c) };
        }
        // SAFETY: not empty (the contract), so `base` is a live link; `c` is its first field.
        unsafe { NonNull::new_unchecked(std::ptr::addr_of_mut!((*base).c)) }
    }
}

/// The request a [`Link`] stands for.
///
/// # Safety
/// `at` must be the `c` of a link made by [`WrBuilder::chain`], whose builder is unchanged.
unsafe fn built_wr(at: NonNull<CSendWr>, _qp_type: QpType) -> Option<SendWr<'static>> {
    // SAFETY: `c` is the first field of the `repr(C)` link, which names a live request.
    Some(unsafe { *(*at.as_ptr().cast::<Link>()).wr })
}

/// The QP and its builder.
///
/// # Safety
/// `qpx` must be the `ibv_qp_ex` of one of our QPs made by `create_qp_ex`, inside a batch
/// this thread started (so it holds the QP's lock).
#[inline(always)]
unsafe fn builder<'a>(qpx: *mut ibv_qp_ex) -> (&'a Qp, &'a mut WrBuilder) {
    // SAFETY: per the contract; the lock makes this thread the builder's only user.
    unsafe {
        let q = Qp::from_ex(qpx);
        (q, &mut *q.builder.get())
    }
}

/// Adds a request for `op` with the `wr_id` and `wr_flags` the program set in `ibv_qp_ex`.
///
/// # Safety
/// As for [`builder`].
unsafe fn build(qpx: *mut ibv_qp_ex, op: SendOp) {
    // SAFETY: per the contract.
    let (q, b) = unsafe { builder(qpx) };
    if b.err != 0 {
        return;
    }
    if b.wrs.len() >= b.room {
        // SAFETY: the lock is held (the contract), so this thread alone uses the QP.
        b.room = unsafe { (*q.qp.held_value()).send_room() } as usize;
    }
    if b.wrs.len() >= b.room || b.wrs.len() == b.wrs.capacity() {
        // The send queue is full, as the C provider says.
        b.err = libc::ENOSPC;
        return;
    }
    // SAFETY: `qpx` is live; the program set these fields before calling the builder.
    let (wr_id, flags) = unsafe { ((*qpx).wr_id, (*qpx).wr_flags) };
    b.wrs
        .push(SendWr::new(wr_id, op, &[]).set_flags(SendFlags::from_bits_retain(flags)));
}

pub(crate) unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    // SAFETY: libibverbs' inline ibv_wr_start passes one of our extended QPs.
    let q = unsafe { Qp::from_ex(qpx) };
    q.qp.lock_held();
    // SAFETY: the lock is now held by this thread.
    unsafe { &mut *q.builder.get() }.clear();
}

pub(crate) unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    // SAFETY: called inside a batch this thread started (the program's contract).
    let (q, b) = unsafe { builder(qpx) };
    let rc = if b.err != 0 || b.wrs.is_empty() {
        b.err
    } else {
        let first = b.chain();
        // SAFETY: the lock is held, so this thread alone uses the `uverbs` QP. The chain's
        // links and the requests they name stay unchanged for the call. The buffers the SGEs
        // name are the caller's registered memory, which the caller keeps valid until
        // completion (the `ibv_wr_*` contract, as `uverbs::Qp::post_send` asks), or the
        // inline copies, which the provider copies into the queue entry before returning.
        match unsafe { (*q.qp.held_value()).post_send_batch(first, built_wr) } {
            Ok(()) => 0,
            Err(uverbs::Error::WorkRequest {
                reason: uverbs::WrReject::QueueFull,
                ..
            }) => libc::ENOSPC,
            Err(e) => crate::ffi::fail("wr_complete", &e),
        }
    };
    b.clear();
    // SAFETY: taken in `wr_start`.
    unsafe { q.qp.unlock_held() };
    rc
}

pub(crate) unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    // SAFETY: called inside a batch this thread started (the program's contract).
    let (q, b) = unsafe { builder(qpx) };
    b.clear();
    // SAFETY: taken in `wr_start`.
    unsafe { q.qp.unlock_held() };
}

fn remote(rkey: u32, addr: u64) -> Remote {
    Remote { addr, rkey }
}

// The builders. Immediate data arrives as `__be32`; the core takes it in host order.

pub(crate) unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    // SAFETY: libibverbs' inline builder, inside a batch (the program's contract).
    unsafe { build(qpx, SendOp::Send) }
}

pub(crate) unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm: u32) {
    // SAFETY: as in `wr_send`.
    unsafe { build(qpx, SendOp::SendWithImm { imm: u32::from_be(imm) }) }
}

pub(crate) unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    // SAFETY: as in `wr_send`.
    unsafe { build(qpx, SendOp::RdmaWrite(remote(rkey, addr))) }
}

pub(crate) unsafe extern "C" fn wr_rdma_write_imm(qpx: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    // SAFETY: as in `wr_send`.
    unsafe { build(qpx, SendOp::RdmaWriteWithImm(remote(rkey, addr), u32::from_be(imm))) }
}

pub(crate) unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    // SAFETY: as in `wr_send`.
    unsafe { build(qpx, SendOp::RdmaRead(remote(rkey, addr))) }
}

pub(crate) unsafe extern "C" fn wr_atomic_cmp_swp(qpx: *mut ibv_qp_ex, rkey: u32, addr: u64, compare: u64, swap: u64) {
    let op = SendOp::CompareSwap {
        remote: remote(rkey, addr),
        compare,
        swap,
    };
    // SAFETY: as in `wr_send`.
    unsafe { build(qpx, op) }
}

pub(crate) unsafe extern "C" fn wr_atomic_fetch_add(qpx: *mut ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    let op = SendOp::FetchAdd {
        remote: remote(rkey, addr),
        add,
    };
    // SAFETY: as in `wr_send`.
    unsafe { build(qpx, op) }
}

pub(crate) unsafe extern "C" fn wr_send_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    // SAFETY: as in `wr_send`.
    unsafe { build(qpx, SendOp::SendWithInv { rkey }) }
}

pub(crate) unsafe extern "C" fn wr_local_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    // SAFETY: as in `wr_send`.
    unsafe { build(qpx, SendOp::LocalInv { rkey }) }
}

/// Writes the 8 bytes at `value` to the peer's `addr` in one piece (RC).
pub(crate) unsafe extern "C" fn wr_atomic_write(qpx: *mut ibv_qp_ex, rkey: u32, addr: u64, value: *const c_void) {
    // SAFETY: the caller's 8 bytes (the ibv_wr_atomic_write contract), read unaligned as the C
    // provider's memcpy does.
    let value = unsafe { value.cast::<[u8; 8]>().read_unaligned() };
    let op = SendOp::AtomicWrite {
        remote: remote(rkey, addr),
        value,
    };
    // SAFETY: as in `wr_send`.
    unsafe { build(qpx, op) }
}

/// Binds `mw` (type 2) under `rkey`; the program sets `mw->rkey` itself once it completed.
pub(crate) unsafe extern "C" fn wr_bind_mw(
    qpx: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    // SAFETY: as in `wr_send`; `mw` and `info` (and its MR) are the caller's, live.
    unsafe { build(qpx, SendOp::BindMw(crate::wr::mw_bind(mw, rkey, &*info))) }
}

// The setters: they fill in the last request built.

pub(crate) unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: libibverbs' inline setter, inside a batch (the program's contract).
    let (_, b) = unsafe { builder(qpx) };
    // A zero length leaves the request without data, as in the C provider.
    let sge = Sge { addr, length, lkey };
    b.set_sges(if length == 0 { &[] } else { std::slice::from_ref(&sge) });
}

pub(crate) unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, num_sge: size_t, sg_list: *const ibv_sge) {
    // SAFETY: as in `wr_set_sge`.
    let (_, b) = unsafe { builder(qpx) };
    if num_sge > b.max_sge {
        b.err = libc::ENOSPC;
        return;
    }
    let list = if num_sge == 0 || sg_list.is_null() {
        &[][..]
    } else {
        // SAFETY: the caller's array of `num_sge` entries (`ibv_sge` is `uverbs::Sge`).
        unsafe { std::slice::from_raw_parts(sg_list, num_sge) }
    };
    b.set_sges(list);
}

pub(crate) unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: size_t) {
    // SAFETY: as in `wr_set_sge`.
    let (_, b) = unsafe { builder(qpx) };
    b.set_inline(&[(addr.cast_const().cast::<u8>(), length)]);
}

pub(crate) unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    num_buf: size_t,
    buf_list: *const ibv_data_buf,
) {
    // SAFETY: as in `wr_set_sge`.
    let (_, b) = unsafe { builder(qpx) };
    let bufs = if num_buf == 0 || buf_list.is_null() {
        &[][..]
    } else {
        // SAFETY: the caller's array of `num_buf` buffers.
        unsafe { std::slice::from_raw_parts(buf_list, num_buf) }
    };
    // At most a handful of buffers in practice; more than fit inline fail anyway.
    let mut parts = [(std::ptr::null::<u8>(), 0usize); 16];
    if bufs.len() > parts.len() {
        b.err = libc::ENOSPC;
        return;
    }
    for (p, d) in parts.iter_mut().zip(bufs) {
        *p = (d.addr.cast_const().cast::<u8>(), d.length);
    }
    b.set_inline(&parts[..bufs.len()]);
}

pub(crate) unsafe extern "C" fn wr_set_ud_addr(
    qpx: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: as in `wr_set_sge`.
    let (_, b) = unsafe { builder(qpx) };
    if ah.is_null() {
        b.err = libc::EINVAL;
        return;
    }
    // SAFETY: a non-null AH is one of ours, which the caller keeps until the batch is posted
    // (the `'static` of `WrBuilder::wrs`).
    let ah: &'static Ah = unsafe { &*ah.cast::<Ah>() };
    if let Some(wr) = b.last() {
        wr.ud = Some(ah.ah.ud_dest(remote_qpn, remote_qkey));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder(max_send_wr: u32, max_send_sge: u32, max_inline_data: u32) -> WrBuilder {
        let cap = QpCap {
            max_send_wr,
            max_recv_wr: 0,
            max_send_sge,
            max_recv_sge: 0,
            max_inline_data,
        };
        WrBuilder::new(&cap, max_send_wr)
    }

    fn push(b: &mut WrBuilder, wr_id: u64) {
        b.wrs.push(SendWr::new(wr_id, SendOp::Send, &[]));
    }

    #[test]
    fn setters_copy_into_the_builders_room_and_fill_the_last_request() {
        let mut b = builder(4, 2, 16);
        push(&mut b, 1);
        let list = [
            Sge {
                addr: 0x1000,
                length: 8,
                lkey: 7,
            },
            Sge {
                addr: 0x2000,
                length: 24,
                lkey: 7,
            },
        ];
        b.set_sges(&list);
        push(&mut b, 2);
        let data = *b"0123456789";
        b.set_inline(&[(data.as_ptr(), 4), (data[6..].as_ptr(), 4)]);
        assert_eq!(b.err, 0);
        assert_eq!(b.wrs[0].sg_list, &list, "the list is a copy");
        assert_eq!(b.wrs[0].total_len(), 32);
        let inline = b.wrs[1];
        assert!(inline.flags.contains(SendFlags::INLINE | SendFlags::SIGNALED));
        assert_eq!((inline.sg_list.len(), inline.total_len()), (1, 8));
        // SAFETY: the entry names the builder's inline room, alive until `clear`.
        let copied = unsafe { std::slice::from_raw_parts(inline.sg_list[0].addr as *const u8, 8) };
        assert_eq!(copied, b"01236789", "the buffers, one after the other");
        b.clear();
        assert!(b.wrs.is_empty() && b.sges.is_empty() && b.inline.is_empty());
    }

    #[test]
    fn the_first_error_is_kept_and_later_setters_do_nothing() {
        let mut b = builder(4, 1, 8);
        b.set_sges(&[]);
        assert_eq!(b.err, libc::EINVAL, "a setter before any builder");
        b.clear();
        push(&mut b, 1);
        let sge = Sge {
            addr: 1,
            length: 1,
            lkey: 1,
        };
        b.set_sges(&[sge, sge]);
        assert_eq!(b.err, libc::ENOSPC, "more than max_send_sge");
        b.set_inline(&[(b"x".as_ptr(), 1)]);
        assert_eq!(b.err, libc::ENOSPC);
        assert!(b.wrs[0].sg_list.is_empty() && !b.wrs[0].flags.contains(SendFlags::INLINE));
        b.clear();
        push(&mut b, 2);
        b.set_inline(&[([0u8; 9].as_ptr(), 9)]);
        assert_eq!(b.err, libc::ENOSPC, "more than max_inline_data");
    }

    #[test]
    fn the_chain_links_every_request_built_in_order() {
        let mut b = builder(4, 1, 0);
        for wr_id in [7, 8, 9] {
            push(&mut b, wr_id);
        }
        let mut at = b.chain().as_ptr();
        let mut seen = Vec::new();
        while !at.is_null() {
            // SAFETY: a link of the chain just made, the builder unchanged.
            let (c, wr) = unsafe { (*at, built_wr(NonNull::new_unchecked(at), QpType::Rc)) };
            assert_eq!(
                c.opcode,
                u32::MAX,
                "no libibverbs opcode: the core reads nothing in place"
            );
            seen.push((c.wr_id, wr.map(|w| w.wr_id)));
            at = c.next;
        }
        assert_eq!(seen, [(7, Some(7)), (8, Some(8)), (9, Some(9))]);
    }

    #[test]
    fn a_builder_without_room_allocates_nothing() {
        let b = WrBuilder::none();
        assert_eq!((b.wrs.capacity(), b.sges.capacity(), b.inline.capacity()), (0, 0, 0));
    }
}
