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

use crate::abi::{
    ibv_ah, ibv_context, ibv_data_buf, ibv_mw, ibv_mw_bind_info, ibv_qp, ibv_qp_ex, ibv_qp_init_attr,
    ibv_qp_init_attr_ex, ibv_sge, qp_init_attr_mask, send_ops,
};
use crate::ah::Ah;
use crate::ffi;
use crate::qp::{create_qp_common, Qp, QpEx};
use crate::wr_builder::{built_wr, WrBuilder};
use libc::{c_int, c_void, size_t};
use uverbs::{QpType, Remote, SendFlags, SendOp, SendWr, Sge};

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

/// `create_qp_ex`: [`create_qp_common`] with the `ibv_wr_*` interface asked for.
pub unsafe extern "C" fn create_qp_ex(_ibctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    ffi::guard("create_qp_ex", std::ptr::null_mut(), || {
        // SAFETY: the caller's live attributes.
        let a = unsafe { &mut *attr };
        let supported = qp_init_attr_mask::PD | qp_init_attr_mask::CREATE_FLAGS | qp_init_attr_mask::SEND_OPS_FLAGS;
        if a.comp_mask & !supported != 0 || a.comp_mask & qp_init_attr_mask::PD == 0 {
            return ffi::refuse_null(
                "create_qp_ex",
                libc::EOPNOTSUPP,
                &format!(
                    "comp_mask {:#x} (supported: PD, CREATE_FLAGS=0, SEND_OPS_FLAGS)",
                    a.comp_mask
                ),
            );
        }
        if a.comp_mask & qp_init_attr_mask::CREATE_FLAGS != 0 && a.create_flags != 0 {
            return ffi::refuse_null("create_qp_ex", libc::EOPNOTSUPP, "create_flags");
        }
        let with_ops = a.comp_mask & qp_init_attr_mask::SEND_OPS_FLAGS != 0;
        let send_ops = if with_ops { a.send_ops_flags } else { 0 };
        // The builders rdma-core's rxe offers each transport (that the core can post).
        let offered = match u8::try_from(a.qp_type).ok().and_then(QpType::from_raw) {
            Some(QpType::Rc) => RC_OPS,
            Some(QpType::Uc) => UC_OPS,
            Some(QpType::Ud) => UD_OPS,
            _ => 0,
        };
        if send_ops & !offered != 0 {
            return ffi::refuse_null(
                "create_qp_ex",
                libc::EOPNOTSUPP,
                &format!("send_ops_flags {send_ops:#x} (supported for this QP type: {offered:#x})"),
            );
        }
        // `ibv_qp_init_attr_ex` begins with the fields of `ibv_qp_init_attr`, in order.
        let mut base = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        let fill = |x: &mut ibv_qp_ex| set_send_ops(x, send_ops);
        let ex = if with_ops { QpEx::WithSendOps(&fill) } else { QpEx::Yes };
        // SAFETY: `a.pd` is one of our PDs (comp_mask says it is set).
        let qp = unsafe { create_qp_common(a.pd, &mut base, ex) };
        a.cap = base.cap;
        qp
    })
}

/// Fills the `ibv_wr_*` interface: the builders `ops` asks for, and the setters, start,
/// complete and abort every QP created with `send_ops_flags` has, even 0 (as in the C
/// provider).
fn set_send_ops(x: &mut ibv_qp_ex, ops: u64) {
    let asked = |bit: u64| ops & bit != 0;
    if asked(send_ops::SEND) {
        x.wr_send = Some(wr_send);
    }
    if asked(send_ops::SEND_WITH_IMM) {
        x.wr_send_imm = Some(wr_send_imm);
    }
    if asked(send_ops::RDMA_WRITE) {
        x.wr_rdma_write = Some(wr_rdma_write);
    }
    if asked(send_ops::RDMA_WRITE_WITH_IMM) {
        x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    }
    if asked(send_ops::RDMA_READ) {
        x.wr_rdma_read = Some(wr_rdma_read);
    }
    if asked(send_ops::ATOMIC_CMP_AND_SWP) {
        x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    }
    if asked(send_ops::ATOMIC_FETCH_AND_ADD) {
        x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    }
    if asked(send_ops::SEND_WITH_INV) {
        x.wr_send_inv = Some(wr_send_inv);
    }
    if asked(send_ops::LOCAL_INV) {
        x.wr_local_inv = Some(wr_local_inv);
    }
    if asked(send_ops::BIND_MW) {
        x.wr_bind_mw = Some(wr_bind_mw);
    }
    if asked(send_ops::ATOMIC_WRITE) {
        x.wr_atomic_write = Some(wr_atomic_write);
    }
    x.wr_set_ud_addr = Some(wr_set_ud_addr);
    x.wr_set_inline_data = Some(wr_set_inline_data);
    x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    x.wr_set_sge = Some(wr_set_sge);
    x.wr_set_sge_list = Some(wr_set_sge_list);
    x.wr_start = Some(wr_start);
    x.wr_complete = Some(wr_complete);
    x.wr_abort = Some(wr_abort);
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
