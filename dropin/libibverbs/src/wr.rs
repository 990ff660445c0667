//! Work requests: C scatter/gather lists, send opcodes and receive lists as the `uverbs`
//! types, in batches that neither allocate nor clear.

use crate::abi::{ibv_mw, ibv_mw_bind_info, ibv_recv_wr, ibv_send_wr, ibv_sge};
use crate::ffi;
use libc::c_int;
use std::mem::MaybeUninit;
use uverbs::{CSendWr, MwBind, RecvWr, SendOp, WrOpcode};

/// The scatter/gather list of a C work request.
///
/// # Safety
/// `sg_list` must point at `num_sge` entries that stay valid for `'a` (or `num_sge` be 0).
pub(crate) unsafe fn sges<'a>(sg_list: *const ibv_sge, num_sge: c_int) -> Option<&'a [ibv_sge]> {
    match usize::try_from(num_sge) {
        Ok(0) => Some(&[]),
        Ok(n) if !sg_list.is_null() => {
            // SAFETY: per the contract.
            Some(unsafe { std::slice::from_raw_parts(sg_list, n) })
        }
        _ => None,
    }
}

/// The `uverbs` operation for a C send work request (an opcode uverbs does not model is a
/// `SendOp::Raw`), or `None` for a bind without a window or with immediate data (which
/// rdma-core's rxe refuses, EINVAL).
pub(crate) fn send_op(wr: &ibv_send_wr) -> Option<SendOp> {
    if WrOpcode(wr.opcode as u32) == WrOpcode::BIND_MW {
        let b = wr.bind_mw;
        if b.mw.is_null() || wr.imm_data != 0 {
            return None;
        }
        // SAFETY: the caller's live MW and MR (the ibv_post_send contract).
        return Some(SendOp::BindMw(unsafe { mw_bind(b.mw, b.rkey, &b.bind_info) }));
    }
    // SAFETY: `CSendWr` is the head of `ibv_send_wr`, field for field (both layouts asserted
    // in `abi.rs`), and `wr` is a live reference.
    let head = unsafe { &*std::ptr::from_ref(wr).cast::<CSendWr>() };
    // Negative opcodes become values no `WrOpcode` has.
    head.send_op()
}

/// The core's form of a bind of `mw` under `new_rkey`.
///
/// # Safety
/// `mw` must be a live MW and `info.mr` null or a live MR (the caller's contract).
pub(crate) unsafe fn mw_bind(mw: *const ibv_mw, new_rkey: u32, info: &ibv_mw_bind_info) -> MwBind {
    // An unbind (length 0) may name no MR.
    let mr_lkey = if info.mr.is_null() {
        0
    } else {
        // SAFETY: per the contract.
        unsafe { (*info.mr).lkey }
    };
    MwBind {
        // SAFETY: per the contract.
        mw_rkey: unsafe { (*mw).rkey },
        new_rkey,
        mr_lkey,
        addr: info.addr,
        length: info.length,
        access: info.mw_access_flags,
    }
}

/// How many work requests one uverbs call takes at most (one doorbell each).
pub(crate) const BATCH: usize = 32;

/// Stack room for a batch of `T`, filled from the front: posting neither allocates nor clears.
pub(crate) fn batch_room<T>() -> [MaybeUninit<T>; BATCH] {
    [const { MaybeUninit::uninit() }; BATCH]
}

/// The first `n` entries of `room`.
///
/// # Safety
/// They must have been written.
pub(crate) unsafe fn filled<T>(room: &[MaybeUninit<T>; BATCH], n: usize) -> &[T] {
    // SAFETY: `MaybeUninit<T>` has `T`'s layout, and per the contract the first `n` (at most
    // `BATCH`, as the slice index checks) are initialized.
    unsafe { &*(std::ptr::from_ref(&room[..n]) as *const [T]) }
}

/// The request `index` steps after `wr` in a C list (the one a failed batch stopped at).
///
/// # Safety
/// The list must have at least `index + 1` live elements from `wr`.
pub(crate) unsafe fn nth<T>(mut wr: *mut T, index: usize, next: impl Fn(&T) -> *mut T) -> *mut T {
    for _ in 0..index {
        // SAFETY: per the contract.
        wr = next(unsafe { &*wr });
    }
    wr
}

/// Feeds a C receive list to `post` (one request as it is, more in batches), reporting the
/// first request not posted in `bad_wr`.
///
/// # Safety
/// `wr` must be a valid list whose SGE arrays stay valid for the call, `bad_wr` writable, and
/// `post` an unsafe post whose buffer contract the C caller upholds.
pub(crate) unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    mut post: impl FnMut(&[RecvWr<'_>]) -> uverbs::Result<()>,
) -> c_int {
    // SAFETY: a non-null `wr` is a live element of the caller's list.
    if !wr.is_null() && unsafe { (*wr).next }.is_null() {
        // One request, the common case: nothing to gather.
        // SAFETY: as above, with its SGE array.
        let w = unsafe { &*wr };
        // SAFETY: as above.
        let errno = match unsafe { sges(w.sg_list, w.num_sge) } {
            Some(sg) => match post(std::slice::from_ref(&RecvWr::new(w.wr_id, sg))) {
                Ok(()) => return 0,
                Err(e) => ffi::fail("post_recv", &e),
            },
            None => libc::EINVAL,
        };
        // SAFETY: writable per the libibverbs contract.
        unsafe { *bad_wr = wr };
        return errno;
    }
    // SAFETY: forwarded contract.
    unsafe { post_recv_batches(wr, bad_wr, post) }
}

/// [`post_recv_list`] of a list (or of nothing), in batches of up to [`BATCH`]: out of line,
/// so that the one-request path does not pay for its stack and registers. (Sends batch in the
/// core instead: `post_send` hands the C list to `uverbs::Qp::post_send_chain`.)
///
/// # Safety
/// As for [`post_recv_list`].
#[inline(never)]
unsafe fn post_recv_batches(
    mut wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    mut post: impl FnMut(&[RecvWr<'_>]) -> uverbs::Result<()>,
) -> c_int {
    let mut room = batch_room::<RecvWr<'_>>();
    while !wr.is_null() {
        let first = wr;
        let mut n = 0;
        let mut rejected = false;
        while !wr.is_null() && n < BATCH {
            // SAFETY: a live element of the caller's list.
            let w = unsafe { &*wr };
            // SAFETY: the caller's SGE array, live for the call.
            let Some(sg) = (unsafe { sges(w.sg_list, w.num_sge) }) else {
                rejected = true;
                break;
            };
            room[n].write(RecvWr::new(w.wr_id, sg));
            n += 1;
            wr = w.next;
        }
        if n > 0 {
            // SAFETY: the loop above wrote the first `n`.
            if let Err(e) = post(unsafe { filled(&room, n) }) {
                let index = match e {
                    uverbs::Error::WorkRequest { index, .. } => index.min(n - 1),
                    _ => 0,
                };
                // SAFETY: the batch came from the `n` (> `index`) elements from `first`;
                // `bad_wr` is writable per the libibverbs contract.
                unsafe { *bad_wr = nth(first, index, |w| w.next) };
                return ffi::fail("post_recv", &e);
            }
        }
        if rejected {
            // SAFETY: writable per the libibverbs contract; `wr` is the rejected request.
            unsafe { *bad_wr = wr };
            return libc::EINVAL;
        }
    }
    0
}
