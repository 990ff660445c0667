//! Completion queues: `create_cq`, `create_cq_ex` and the extended poll interface
//! (`ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll`, `ibv_wc_read_*`), `poll_cq`,
//! `req_notify_cq`, `resize_cq`, `destroy_cq`.

use crate::abi::{
    cq_init_attr_mask, ibv_comp_channel, ibv_context, ibv_cq, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_poll_cq_attr, ibv_wc,
    verbs_cq, wc_ex,
};
use crate::context::Context;
use crate::event::{destroy_core, wait_for_acks, Slot};
use crate::ffi;
use crate::spin::SpinLock;
use libc::{c_int, c_uint};
use std::cell::UnsafeCell;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use uverbs::{Batch, WorkCompletion};

/// A CQ: `verbs_cq` (libibverbs fills most of its `ibv_cq` after `create_cq` and
/// `create_cq_ex`), then the `uverbs` CQ, how many QPs use it, and the extended poll in
/// progress.
#[repr(C)]
pub struct Cq {
    vcq: verbs_cq,
    pub(crate) cq: SpinLock<uverbs::Cq>,
    pub(crate) users: AtomicUsize,
    ex: UnsafeCell<ExPoll>,
}

/// An extended poll between `ibv_start_poll` and `ibv_end_poll`, which hold the CQ's lock
/// all along (as rdma-core's rxe does): the ready completions read in place from the ring,
/// and the one the `ibv_wc_read_*` accessors read.
struct ExPoll {
    /// `Some` while a poll is in progress. It borrows the CQ's `uverbs` half, which the held
    /// lock keeps to this poll; dropping it hands the completions read back to the device.
    batch: Option<Batch<'static>>,
    current: *const WorkCompletion,
}

/// # Safety
/// `cq` must be a live CQ made by [`create_cq`] or [`create_cq_ex`].
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
        let Ok(cqe) = u32::try_from(cqe) else {
            return ffi::refuse_null("create_cq", libc::EINVAL, "negative cqe");
        };
        // SAFETY: libibverbs passes one of our contexts and the caller's channel.
        unsafe { new_cq("create_cq", ibctx, cqe, channel, comp_vector, |_| {}) }.cast::<ibv_cq>()
    })
}

/// `create_cq_ex`: a CQ as [`create_cq`] makes, with the extended poll interface and the
/// `ibv_wc_read_*` accessors for the fields `wc_flags` asks for (those rxe completions carry,
/// the set rdma-core's rxe offers). libibverbs' `verbs_init_cq` sets the C fields after.
pub unsafe extern "C" fn create_cq_ex(ibctx: *mut ibv_context, attr: *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex {
    ffi::guard("create_cq_ex", std::ptr::null_mut(), || {
        // SAFETY: the caller's live attributes.
        let a = unsafe { &*attr };
        if a.wc_flags & !wc_ex::SUPPORTED != 0 {
            let why = format!("wc_flags {:#x} (supported: {:#x})", a.wc_flags, wc_ex::SUPPORTED);
            return ffi::refuse_null("create_cq_ex", libc::EOPNOTSUPP, &why);
        }
        // As libibverbs' ibv_cmd_create_cq_ex, which the C provider calls.
        if a.comp_mask & !(cq_init_attr_mask::FLAGS | cq_init_attr_mask::PD) != 0 {
            let why = format!("comp_mask {:#x}", a.comp_mask);
            return ffi::refuse_null("create_cq_ex", libc::EOPNOTSUPP, &why);
        }
        // IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN becomes a kernel CQ flag, which rxe refuses;
        // SINGLE_THREADED asks nothing of the kernel.
        if a.comp_mask & cq_init_attr_mask::FLAGS != 0 && a.flags & IGNORE_OVERRUN != 0 {
            return ffi::refuse_null("create_cq_ex", libc::EOPNOTSUPP, "IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN");
        }
        let Ok(comp_vector) = c_int::try_from(a.comp_vector) else {
            return ffi::refuse_null("create_cq_ex", libc::EINVAL, "comp_vector out of range");
        };
        let wc_flags = a.wc_flags;
        // SAFETY: libibverbs passes one of our contexts and the caller's channel.
        let cq = unsafe {
            new_cq("create_cq_ex", ibctx, a.cqe, a.channel, comp_vector, |ex| {
                set_poll_ops(ex, wc_flags)
            })
        };
        cq.cast::<ibv_cq_ex>()
    })
}

/// `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`.
const IGNORE_OVERRUN: u32 = 1 << 1;

/// Fills the extended poll interface: the poll calls and the accessors every CQ has, and
/// those `wc_flags` asks for (the others stay null, as in the C provider).
fn set_poll_ops(ex: &mut ibv_cq_ex, wc_flags: u64) {
    ex.start_poll = Some(start_poll);
    ex.next_poll = Some(next_poll);
    ex.end_poll = Some(end_poll);
    ex.read_opcode = Some(read_opcode);
    ex.read_vendor_err = Some(read_vendor_err);
    ex.read_wc_flags = Some(read_wc_flags);
    let asked = |bit: u64| wc_flags & bit != 0;
    if asked(wc_ex::WITH_BYTE_LEN) {
        ex.read_byte_len = Some(read_byte_len);
    }
    if asked(wc_ex::WITH_IMM) {
        ex.read_imm_data = Some(read_imm_data);
    }
    if asked(wc_ex::WITH_QP_NUM) {
        ex.read_qp_num = Some(read_qp_num);
    }
    if asked(wc_ex::WITH_SRC_QP) {
        ex.read_src_qp = Some(read_src_qp);
    }
    if asked(wc_ex::WITH_SLID) {
        ex.read_slid = Some(read_slid);
    }
    if asked(wc_ex::WITH_SL) {
        ex.read_sl = Some(read_sl);
    }
    if asked(wc_ex::WITH_DLID_PATH_BITS) {
        ex.read_dlid_path_bits = Some(read_dlid_path_bits);
    }
}

/// Creates a CQ for `create_cq` and `create_cq_ex`; `extend` fills the extended interface.
/// Null with errno set on failure.
///
/// # Safety
/// `ibctx` must be one of our contexts, `channel` null or the caller's live channel.
unsafe fn new_cq(
    verb: &str,
    ibctx: *mut ibv_context,
    cqe: u32,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
    extend: impl FnOnce(&mut ibv_cq_ex),
) -> *mut Cq {
    // SAFETY: per the contract.
    let ctx = unsafe { Context::from_ibv(ibctx) };
    if comp_vector < 0 || comp_vector as u32 >= ctx.core().num_comp_vectors().max(1) {
        return ffi::refuse_null(verb, libc::EINVAL, "comp_vector out of range");
    }
    let channel = if channel.is_null() {
        None
    } else {
        // SAFETY: a non-null channel is a live `ibv_comp_channel` of the caller's
        // (libibverbs takes a reference on it only after we return, but the caller may
        // not destroy it while it creates a CQ on it).
        let fd = unsafe { (*channel).fd };
        if fd < 0 {
            return ffi::refuse_null(verb, libc::EINVAL, "completion channel has no fd");
        }
        // SAFETY: `fd` is the channel's open fd for the duration of this call; we keep a
        // duplicate of our own, so the CQ never depends on libibverbs' copy staying open.
        match unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned() {
            Ok(owned) => Some(uverbs::CompChannel::from(owned)),
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(libc::EMFILE);
                return ffi::refuse_null(verb, errno, &format!("dup of the channel fd: {e}"));
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
            // SAFETY: all-zero is a valid ibv_cq_ex (integers, pointers and `None`s);
            // libibverbs' verbs_init_cq fills in context, channel, cq_context, counters,
            // mutex and cond after we return.
            let mut ex: ibv_cq_ex = unsafe { std::mem::zeroed() };
            ex.cq.context = ibctx;
            ex.cq.handle = cq.handle();
            ex.cq.cqe = cq.capacity() as c_int;
            extend(&mut ex);
            slot.fill(Cq {
                vcq: verbs_cq {
                    cq_ex: ManuallyDrop::new(ex),
                },
                cq: SpinLock::new(cq),
                users: AtomicUsize::new(0),
                ex: UnsafeCell::new(ExPoll {
                    batch: None,
                    current: std::ptr::null(),
                }),
            })
        }
        Err(e) => ffi::fail_null(verb, &e),
    }
}

/// # Safety
/// `cq` must be a live CQ made by [`create_cq_ex`].
#[inline(always)]
unsafe fn ex_ref<'a>(cq: *mut ibv_cq_ex) -> &'a Cq {
    // SAFETY: `ibv_cq_ex` is at the start of `verbs_cq`, the first field of a boxed `Cq`.
    unsafe { &*cq.cast::<Cq>() }
}

/// Makes `wc` the current completion: the accessors read it, and `ibv_cq_ex` shows its status
/// and work request id.
///
/// # Safety
/// `cq` must be live, `wc` a completion of the poll in progress.
#[inline(always)]
unsafe fn set_current(cq: *mut ibv_cq_ex, poll: &mut ExPoll, wc: *const WorkCompletion) {
    poll.current = wc;
    // SAFETY: per the contract.
    unsafe {
        (*cq).status = (*wc).status.0;
        (*cq).wr_id = (*wc).wr_id;
    }
}

/// `ibv_start_poll`: locks the CQ and reads the first ready completion in place; ENOENT (and
/// unlocked) when there is none.
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, _attr: *mut ibv_poll_cq_attr) -> c_int {
    // No `ffi::guard`: nothing here can panic (see the crate docs).
    // SAFETY: libibverbs' inline ibv_start_poll passes one of our extended CQs.
    let c = unsafe { ex_ref(cq) };
    c.cq.lock_held();
    // SAFETY: the lock is held until `end_poll` (or below), so this thread alone uses the
    // `uverbs` CQ and the poll state until then; the CQ lives until `destroy_cq`, which the
    // program does not call during a poll. The batch borrows the `uverbs` CQ for as long as
    // it is kept, which is no longer than the lock is held.
    let (core, poll) = unsafe { (&mut *c.cq.held_value(), &mut *c.ex.get()) };
    let mut batch = core.batch();
    match batch.next().map(std::ptr::from_ref) {
        Some(wc) => {
            // SAFETY: `wc` is the batch's first completion; `cq` is live.
            unsafe { set_current(cq, poll, wc) };
            poll.batch = Some(batch);
            0
        }
        None => {
            drop(batch);
            // SAFETY: taken above.
            unsafe { c.cq.unlock_held() };
            ffi::set_errno(libc::ENOENT);
            libc::ENOENT
        }
    }
}

/// `ibv_next_poll`: the next ready completion, or ENOENT (the CQ stays locked until
/// `ibv_end_poll`, as the man page has it). Completions that arrived since the batch began
/// are picked up by starting another.
unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: libibverbs passes one of our extended CQs, on which this thread started a poll
    // (the program's contract), so it holds the lock and alone uses the poll state.
    let (c, poll) = unsafe {
        let c = ex_ref(cq);
        (c, &mut *c.ex.get())
    };
    let Some(batch) = poll.batch.as_mut() else {
        ffi::set_errno(libc::ENOENT);
        return libc::ENOENT;
    };
    // Tested as the reference it is: an `Option` of a raw pointer would be tested again.
    if let Some(wc) = batch.next() {
        let wc = std::ptr::from_ref(wc);
        // SAFETY: a completion of the batch in progress; `cq` is live.
        unsafe { set_current(cq, poll, wc) };
        return 0;
    }
    next_batch(cq, c, poll)
}

/// [`next_poll`] at the end of a batch: hands the batch back and starts another.
#[cold]
#[inline(never)]
fn next_batch(cq: *mut ibv_cq_ex, c: &Cq, poll: &mut ExPoll) -> c_int {
    poll.batch = None;
    // SAFETY: as in `start_poll`: the lock is still held.
    let core = unsafe { &mut *c.cq.held_value() };
    let mut batch = core.batch();
    let next = batch.next().map(std::ptr::from_ref);
    poll.batch = Some(batch);
    match next {
        Some(wc) => {
            // SAFETY: the new batch's first completion; `cq` is live.
            unsafe { set_current(cq, poll, wc) };
            0
        }
        None => {
            ffi::set_errno(libc::ENOENT);
            libc::ENOENT
        }
    }
}

/// `ibv_end_poll`: hands the completions read back to the device and unlocks the CQ.
unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    // SAFETY: as in `next_poll`.
    let (c, poll) = unsafe {
        let c = ex_ref(cq);
        (c, &mut *c.ex.get())
    };
    if poll.batch.take().is_some() {
        poll.current = std::ptr::null();
        // SAFETY: a poll in progress holds the lock, taken in `start_poll`.
        unsafe { c.cq.unlock_held() };
    }
}

/// The current completion of the poll in progress.
///
/// # Safety
/// `cq` must be one of our extended CQs with a poll in progress in this thread.
#[inline(always)]
unsafe fn current<'a>(cq: *mut ibv_cq_ex) -> &'a WorkCompletion {
    // SAFETY: per the contract, `current` is a completion of the batch in progress, unchanged
    // until the batch ends.
    unsafe { &*(*ex_ref(cq).ex.get()).current }
}

macro_rules! accessors {
    ($($name:ident -> $t:ty = |$wc:ident| $e:expr;)*) => {$(
        /// An `ibv_wc_read_*` accessor of the current completion.
        unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $t {
            // SAFETY: libibverbs' inline accessors are called during a poll (the program's
            // contract, as with the C provider).
            let $wc = unsafe { current(cq) };
            $e
        }
    )*};
}

accessors! {
    read_opcode -> c_uint = |wc| wc.opcode.0;
    read_vendor_err -> u32 = |wc| wc.vendor_err;
    read_byte_len -> u32 = |wc| wc.byte_len;
    // `__be32`, as the ring holds it.
    read_imm_data -> u32 = |wc| wc.imm_data;
    read_qp_num -> u32 = |wc| wc.qp_num;
    read_src_qp -> u32 = |wc| wc.src_qp;
    read_wc_flags -> c_uint = |wc| wc.wc_flags.bits();
    read_slid -> u32 = |wc| u32::from(wc.slid);
    read_sl -> u8 = |wc| wc.sl;
    read_dlid_path_bits -> u8 = |wc| wc.dlid_path_bits;
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
