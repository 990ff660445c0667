//! Completion queues: `create_cq`, `poll_cq`, `req_notify_cq`, `resize_cq`, `destroy_cq`.

use crate::abi::{ibv_comp_channel, ibv_context, ibv_cq, ibv_wc, verbs_cq};
use crate::context::Context;
use crate::event::{destroy_core, wait_for_acks, Slot};
use crate::ffi;
use crate::spin::SpinLock;
use libc::c_int;
use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A CQ: `verbs_cq` (libibverbs fills most of its `ibv_cq` after `create_cq`), then the
/// `uverbs` CQ and how many QPs use it.
#[repr(C)]
pub struct Cq {
    vcq: verbs_cq,
    pub(crate) cq: SpinLock<uverbs::Cq>,
    pub(crate) users: AtomicUsize,
}

/// # Safety
/// `cq` must be a live CQ made by [`create_cq`].
pub(crate) unsafe fn cq_ref<'a>(cq: *mut ibv_cq) -> &'a Cq {
    // SAFETY: `ibv_cq` is at the start of `verbs_cq`, the first field of a boxed `Cq`.
    unsafe { &*cq.cast::<Cq>() }
}

/// `create_cq`. With a completion channel, the CQ is created on a duplicate of the channel's
/// fd (libibverbs made the channel with CREATE_COMP_CHANNEL on its cmd fd and reads its events
/// itself in `ibv_get_cq_event`), and with the `ibv_cq` pointer as user handle, which is what
/// `ibv_get_cq_event` hands the program as the CQ of each event.
pub unsafe extern "C" fn create_cq(
    ibctx: *mut ibv_context,
    cqe: c_int,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    ffi::guard("create_cq", std::ptr::null_mut(), || {
        // SAFETY: libibverbs passes one of our contexts.
        let ctx = unsafe { Context::from_ibv(ibctx) };
        let Ok(cqe) = u32::try_from(cqe) else {
            return ffi::refuse_null("create_cq", libc::EINVAL, "negative cqe");
        };
        if comp_vector < 0 || comp_vector as u32 >= ctx.core().num_comp_vectors().max(1) {
            return ffi::refuse_null("create_cq", libc::EINVAL, "comp_vector out of range");
        }
        let channel = if channel.is_null() {
            None
        } else {
            // SAFETY: a non-null channel is a live `ibv_comp_channel` of the caller's
            // (libibverbs takes a reference on it only after we return, but the caller may
            // not destroy it while it creates a CQ on it).
            let fd = unsafe { (*channel).fd };
            if fd < 0 {
                return ffi::refuse_null("create_cq", libc::EINVAL, "completion channel has no fd");
            }
            // SAFETY: `fd` is the channel's open fd for the duration of this call; we keep a
            // duplicate of our own, so the CQ never depends on libibverbs' copy staying open.
            match unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned() {
                Ok(owned) => Some(uverbs::CompChannel::from(owned)),
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(libc::EMFILE);
                    return ffi::refuse_null("create_cq", errno, &format!("dup of the channel fd: {e}"));
                }
            }
        };
        let slot = Slot::<Cq>::new();
        let mut init = uverbs::CqInit::new(cqe);
        init.comp_vector = comp_vector as u32;
        init.channel = channel.as_ref();
        init.user_handle = Some(slot.user_handle());
        match ctx.core().create_cq_with(&init) {
            Ok(cq) => {
                // SAFETY: all-zero is a valid verbs_cq; libibverbs' verbs_init_cq fills in
                // context, channel, cq_context, counters, mutex and cond after we return.
                let mut vcq: verbs_cq = unsafe { std::mem::zeroed() };
                vcq.cq.context = ibctx;
                vcq.cq.handle = cq.handle();
                vcq.cq.cqe = cq.capacity() as c_int;
                slot.fill(Cq {
                    vcq,
                    cq: SpinLock::new(cq),
                    users: AtomicUsize::new(0),
                })
                .cast::<ibv_cq>()
            }
            Err(e) => ffi::fail_null("create_cq", &e),
        }
    })
}

pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // No `ffi::guard`: see the crate docs.
    // A count of 0 or less polls nothing, as in rdma-core's rxe (and `wc` may then be null).
    if num_entries <= 0 {
        return 0;
    }
    // SAFETY: libibverbs passes one of our CQs.
    let c = unsafe { cq_ref(cq) };
    // SAFETY: the caller passes room for `num_entries` (> 0) completions; `ibv_wc` and
    // `WorkCompletion` are the same type, and any bytes are a valid value of it.
    let out = unsafe { std::slice::from_raw_parts_mut(wc, num_entries as usize) };
    match c.cq.try_lock() {
        Some(mut core) => core.poll(out) as c_int,
        None => poll_contended(&c.cq, out),
    }
}

/// [`poll_cq`] when another thread holds the CQ: out of line, so that the uncontended path
/// keeps nothing live across a call but the CQ.
#[cold]
#[inline(never)]
fn poll_contended(cq: &SpinLock<uverbs::Cq>, out: &mut [uverbs::WorkCompletion]) -> c_int {
    cq.lock().poll(out) as c_int
}

pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    ffi::guard("req_notify_cq", libc::EIO, || {
        // SAFETY: libibverbs passes one of our CQs.
        let c = unsafe { cq_ref(cq) };
        match c.cq.lock().req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => ffi::fail("req_notify_cq", &e),
        }
    })
}

pub unsafe extern "C" fn resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ffi::guard("resize_cq", libc::EIO, || {
        let Ok(cqe) = u32::try_from(cqe) else {
            return libc::EINVAL;
        };
        // SAFETY: libibverbs passes one of our CQs.
        let c = unsafe { cq_ref(cq) };
        let mut guard = c.cq.lock();
        match guard.resize(cqe) {
            Ok(()) => {
                // SAFETY: `cq` is live; `cqe` is a plain field the program reads.
                unsafe { (*cq).cqe = guard.capacity() as c_int };
                0
            }
            Err(e) => ffi::fail("resize_cq", &e),
        }
    })
}

/// `destroy_cq`, as `ibv_cmd_destroy_cq`: the kernel destroy, then a wait until the program
/// has acknowledged every completion and async event the kernel reported for the CQ.
pub unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    ffi::guard("destroy_cq", libc::EIO, || {
        // SAFETY: libibverbs passes one of our CQs.
        if unsafe { cq_ref(cq) }.users.load(Ordering::Acquire) != 0 {
            // As the kernel answers while QPs still use the CQ.
            return libc::EBUSY;
        }
        let c = cq.cast::<Cq>();
        // SAFETY: `c` is live, made by `create_cq`, and the program does not use a CQ it is
        // destroying from other threads; on success the field is never read again.
        let reported = match unsafe { destroy_core(std::ptr::addr_of_mut!((*c).cq), uverbs::Cq::destroy) } {
            Ok(r) => r,
            Err(e) => return ffi::fail("destroy_cq", &e),
        };
        // SAFETY: `cq` is live until freed below, and libibverbs initialized its mutex and cond
        // (verbs_init_cq).
        unsafe {
            wait_for_acks(
                std::ptr::addr_of_mut!((*cq).mutex),
                std::ptr::addr_of_mut!((*cq).cond),
                &[
                    (std::ptr::addr_of!((*cq).comp_events_completed), reported.comp),
                    (std::ptr::addr_of!((*cq).async_events_completed), reported.r#async),
                ],
            );
        }
        // SAFETY: made by `create_cq` with Box::into_raw (`MaybeUninit<Cq>` has `Cq`'s layout);
        // its `uverbs` half is gone and the rest needs no drop; this is its last use.
        drop(unsafe { Box::from_raw(c.cast::<MaybeUninit<Cq>>()) });
        0
    })
}
