//! The object ops: PD, MR, CQ and QP, each a C struct libibverbs sees followed by the `uverbs`
//! object that does the work.
//!
//! Every C object is a `Box` of a `#[repr(C)]` struct whose first field is the struct
//! libibverbs knows (`ibv_pd`, `verbs_mr`, `verbs_cq`, `verbs_qp`), so the pointer libibverbs
//! hands back converts to ours by a cast. Objects used from several threads at once by C
//! programs (CQs, QPs, SRQs) keep their `uverbs` half behind a [`SpinLock`], as rdma-core's
//! rxe keeps its queues behind a `pthread_spinlock_t`.
//!
//! # The data path runs without `ffi::guard`
//!
//! `poll_cq`, `post_send`, `post_recv` and `post_srq_recv` do not run under [`ffi::guard`]:
//! its `catch_unwind` costs 26 instructions a poll and 38 a post (callgrind, `cargo xtask
//! bench`), more than half of an empty poll. They cannot panic on any input: the core's poll
//! and post bound every count and index by the rings and report bad requests as errors (the
//! only panic in their compiled code is std's assertion that the open QP's fd is not -1).
//! And were one to panic, it would not unwind into C: a panic leaving an `extern "C"` fn
//! aborts the process (Rust 1.81 and later, this crate's `rust-version`), an abort, never
//! undefined behaviour. Every other op keeps the guard.

use crate::abi::{
    ibv_ah, ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_global_route, ibv_mr, ibv_pd, ibv_qp, ibv_qp_attr,
    ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_srq, ibv_srq_attr, ibv_srq_init_attr,
    ibv_wc, qp_attr_mask as m, qp_init_attr_mask, srq_attr_mask, verbs_cq, verbs_mr, verbs_qp, wr_opcode,
    IBV_MR_TYPE_MR,
};
use crate::context::Context;
use crate::ffi;
use crate::spin::SpinLock;
use libc::{c_int, c_void, size_t};
use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use uverbs::{
    AccessFlags, AhAttr, EventsReported, GlobalRoute, Mtu, QpAttr, QpState, QpType, RecvWr, Remote, SendFlags, SendOp,
    SendWr,
};

/// Heap room for a C object whose address is needed before the object can be built: CQs,
/// QPs and SRQs are created in the kernel with their C pointer as user handle, because
/// libibverbs turns the handle of a completion or async event straight back into the
/// `struct ibv_cq *` (`ibv_qp *`, `ibv_srq *`) it gives the program.
struct Slot<T>(Box<MaybeUninit<T>>);

impl<T> Slot<T> {
    fn new() -> Self {
        Self(Box::new(MaybeUninit::uninit()))
    }

    /// The address the object will have, as a kernel user handle.
    fn user_handle(&self) -> u64 {
        self.0.as_ptr() as u64
    }

    /// Moves `value` in and hands the object over to C. Dropping an unfilled slot just frees
    /// the memory.
    fn fill(mut self, value: T) -> *mut T {
        self.0.write(value);
        // `MaybeUninit<T>` has `T`'s layout, and the value is initialized: the pointer can be
        // turned back into a `Box<T>` by `Box::from_raw`.
        Box::into_raw(self.0).cast::<T>()
    }
}

/// Initializes a pthread mutex and condition variable libibverbs will use.
///
/// # Safety
/// Both must point at writable, unused storage.
unsafe fn init_sync(mutex: *mut libc::pthread_mutex_t, cond: *mut libc::pthread_cond_t) {
    // SAFETY: per the contract; default attributes.
    unsafe {
        libc::pthread_mutex_init(mutex, std::ptr::null());
        libc::pthread_cond_init(cond, std::ptr::null());
    }
}

// The C halves and counters of a CQ, QP or SRQ need no drop: once its `uverbs` half has been
// moved out by `destroy_core`, the C object is freed as `MaybeUninit` memory.
const _: () = assert!(
    !std::mem::needs_drop::<verbs_cq>() && !std::mem::needs_drop::<verbs_qp>() && !std::mem::needs_drop::<ibv_srq>()
);

/// Destroys the `uverbs` half of a C object explicitly (`destroy` is `Cq::destroy`,
/// `Qp::destroy` or `Srq::destroy`), returning the events the kernel reported for it. On
/// failure the object is put back where it was, so the C object stays intact.
///
/// # Safety
/// `field` must point at the initialized `uverbs` half of a live C object that no other thread
/// uses (libibverbs' contract for destroys). On `Ok` the field has been moved out: the caller
/// must free the C object without dropping the field again.
unsafe fn destroy_core<T>(
    field: *mut SpinLock<T>,
    destroy: impl FnOnce(T) -> Result<EventsReported, (T, uverbs::Error)>,
) -> Result<EventsReported, uverbs::Error> {
    // SAFETY: per the contract the field is initialized and ours alone; it is written back
    // below on failure, and the caller never reads it again on success.
    let core = unsafe { field.read() }.into_inner();
    destroy(core).map_err(|(core, e)| {
        // SAFETY: the same field, whose value was moved out above; nothing saw the gap.
        unsafe { field.write(SpinLock::new(core)) };
        e
    })
}

/// What `ibv_cmd_destroy_cq` (`_qp`, `_srq`) do after the kernel destroyed the object: lock its
/// `mutex` and wait on its `cond` until each counter in `counts` equals its number, i.e. until
/// the program has acknowledged as many events as the kernel reported (libibverbs'
/// `ibv_ack_cq_events` and `ibv_ack_async_event` add to those counters under that mutex and
/// signal the cond), so no thread still holding an event for the object touches freed memory.
///
/// # Safety
/// `mutex` and `cond` must be initialized, and they and the counters live, until this returns.
unsafe fn wait_for_acks(
    mutex: *mut libc::pthread_mutex_t,
    cond: *mut libc::pthread_cond_t,
    counts: &[(*const u32, u32)],
) {
    // SAFETY: per the contract. The counters are read with the mutex held, as their writers
    // hold it, and through raw pointers, as other threads write them.
    unsafe {
        libc::pthread_mutex_lock(mutex);
        while counts.iter().any(|&(counter, n)| counter.read() != n) {
            libc::pthread_cond_wait(cond, mutex);
        }
        libc::pthread_mutex_unlock(mutex);
    }
}

// ---------------------------------------------------------------------------------------------
// Protection domains
// ---------------------------------------------------------------------------------------------

/// A PD: `ibv_pd`, then the `uverbs` PD and how many MRs and QPs use it.
#[repr(C)]
pub struct Pd {
    ibv: ibv_pd,
    pd: uverbs::Pd,
    users: AtomicUsize,
}

/// # Safety
/// `pd` must be a live PD made by [`alloc_pd`].
unsafe fn pd_ref<'a>(pd: *mut ibv_pd) -> &'a Pd {
    // SAFETY: `ibv_pd` is the first field of a boxed `Pd`.
    unsafe { &*pd.cast::<Pd>() }
}

pub unsafe extern "C" fn alloc_pd(ibctx: *mut ibv_context) -> *mut ibv_pd {
    ffi::guard("alloc_pd", std::ptr::null_mut(), || {
        // SAFETY: libibverbs passes one of our contexts.
        let ctx = unsafe { Context::from_ibv(ibctx) };
        match ctx.core().alloc_pd() {
            Ok(pd) => {
                let b = Box::new(Pd {
                    ibv: ibv_pd {
                        context: ibctx,
                        handle: pd.handle(),
                    },
                    pd,
                    users: AtomicUsize::new(0),
                });
                Box::into_raw(b).cast::<ibv_pd>()
            }
            Err(e) => ffi::fail_null("alloc_pd", &e),
        }
    })
}

pub unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ffi::guard("dealloc_pd", libc::EIO, || {
        // SAFETY: libibverbs passes one of our PDs.
        if unsafe { pd_ref(pd) }.users.load(Ordering::Acquire) != 0 {
            // As the kernel answers while MRs, QPs or AHs still use the PD.
            return libc::EBUSY;
        }
        // SAFETY: made by `alloc_pd` with Box::into_raw; this is its last use.
        drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
        0
    })
}

// ---------------------------------------------------------------------------------------------
// Memory regions
// ---------------------------------------------------------------------------------------------

/// An MR: `verbs_mr` (libibverbs reads its `mr_type` in `ibv_dereg_mr`), then the `uverbs`
/// MR and the PD it counts against.
#[repr(C)]
pub struct Mr {
    vmr: verbs_mr,
    mr: uverbs::Mr,
    pd: *const Pd,
}

/// `reg_mr`, behind `ibv_reg_mr` (`hca_va` = `addr`) and `ibv_reg_mr_iova` (any `hca_va`):
/// work requests and peers address byte `addr + i` as `hca_va + i`.
pub unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    hca_va: u64,
    access: c_int,
) -> *mut ibv_mr {
    ffi::guard("reg_mr", std::ptr::null_mut(), || {
        // SAFETY: libibverbs passes one of our PDs.
        let p = unsafe { pd_ref(pd) };
        let access = AccessFlags::from_bits_retain(access as u32);
        // SAFETY: the caller of ibv_reg_mr keeps `addr..addr+length` mapped until it
        // deregisters, which is the contract `uverbs::Pd::reg_mr_iova` asks for; remote peers
        // writing it is the C program's business, not Rust references'.
        match unsafe { p.pd.reg_mr_iova(addr.cast::<u8>(), length, hca_va, access) } {
            Ok(mr) => {
                let vmr = verbs_mr {
                    ibv_mr: ibv_mr {
                        context: p.ibv.context,
                        pd,
                        // The buffer address, as libibverbs also sets it (not the iova).
                        addr,
                        length,
                        handle: mr.handle(),
                        lkey: mr.lkey(),
                        rkey: mr.rkey(),
                    },
                    mr_type: IBV_MR_TYPE_MR,
                    access: access.bits() as c_int,
                };
                p.users.fetch_add(1, Ordering::AcqRel);
                Box::into_raw(Box::new(Mr { vmr, mr, pd: p })).cast::<ibv_mr>()
            }
            Err(e) => ffi::fail_null("reg_mr", &e),
        }
    })
}

pub unsafe extern "C" fn dereg_mr(vmr: *mut verbs_mr) -> c_int {
    ffi::guard("dereg_mr", libc::EIO, || {
        // SAFETY: made by `reg_mr` with Box::into_raw; this is its last use.
        let mr = unsafe { Box::from_raw(vmr.cast::<Mr>()) };
        // SAFETY: the PD outlives its MRs (dealloc_pd refuses while `users` > 0).
        unsafe { &*mr.pd }.users.fetch_sub(1, Ordering::AcqRel);
        drop(mr);
        0
    })
}

// ---------------------------------------------------------------------------------------------
// Completion queues
// ---------------------------------------------------------------------------------------------

/// A CQ: `verbs_cq` (libibverbs fills most of its `ibv_cq` after `create_cq`), then the
/// `uverbs` CQ and how many QPs use it.
#[repr(C)]
pub struct Cq {
    vcq: verbs_cq,
    cq: SpinLock<uverbs::Cq>,
    users: AtomicUsize,
}

/// # Safety
/// `cq` must be a live CQ made by [`create_cq`].
unsafe fn cq_ref<'a>(cq: *mut ibv_cq) -> &'a Cq {
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
    // No `ffi::guard`: see the module docs.
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

// ---------------------------------------------------------------------------------------------
// Address handles
// ---------------------------------------------------------------------------------------------

/// An AH: `ibv_ah`, then the `uverbs` AH and the PD it counts against.
#[repr(C)]
pub struct Ah {
    ibv: ibv_ah,
    ah: uverbs::Ah,
    pd: *const Pd,
}

pub unsafe extern "C" fn create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ffi::guard("create_ah", std::ptr::null_mut(), || {
        // SAFETY: libibverbs passes one of our PDs and the caller's attributes.
        let (p, a) = unsafe { (pd_ref(pd), &*attr) };
        match p.pd.create_ah(&ah_from(a)) {
            Ok(ah) => {
                p.users.fetch_add(1, Ordering::AcqRel);
                let b = Box::new(Ah {
                    ibv: ibv_ah {
                        context: p.ibv.context,
                        pd,
                        handle: ah.handle(),
                    },
                    ah,
                    pd: p,
                });
                Box::into_raw(b).cast::<ibv_ah>()
            }
            Err(e) => ffi::fail_null("create_ah", &e),
        }
    })
}

pub unsafe extern "C" fn destroy_ah(ah: *mut ibv_ah) -> c_int {
    ffi::guard("destroy_ah", libc::EIO, || {
        // SAFETY: made by `create_ah` with Box::into_raw; this is its last use.
        let a = unsafe { Box::from_raw(ah.cast::<Ah>()) };
        // SAFETY: the PD outlives the AHs counted in it.
        unsafe { &*a.pd }.users.fetch_sub(1, Ordering::AcqRel);
        drop(a);
        0
    })
}

// ---------------------------------------------------------------------------------------------
// Shared receive queues
// ---------------------------------------------------------------------------------------------

/// An SRQ: `ibv_srq` (libibverbs fills context, srq_context, pd, mutex and cond after
/// `create_srq`), then the `uverbs` SRQ, its PD, and how many QPs use it.
#[repr(C)]
pub struct Srq {
    ibv: ibv_srq,
    srq: SpinLock<uverbs::Srq>,
    pd: *const Pd,
    users: AtomicUsize,
}

/// # Safety
/// `srq` must be a live SRQ made by [`create_srq`].
unsafe fn srq_ref<'a>(srq: *mut ibv_srq) -> &'a Srq {
    // SAFETY: `ibv_srq` is the first field of a boxed `Srq`.
    unsafe { &*srq.cast::<Srq>() }
}

pub unsafe extern "C" fn create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    ffi::guard("create_srq", std::ptr::null_mut(), || {
        // SAFETY: libibverbs passes one of our PDs and the caller's attributes.
        let (p, a) = unsafe { (pd_ref(pd), &mut *attr) };
        // Events name the SRQ by its `ibv_srq` pointer (see `Slot`).
        let slot = Slot::<Srq>::new();
        let init = uverbs::SrqInit {
            max_wr: a.attr.max_wr,
            max_sge: a.attr.max_sge,
            srq_limit: a.attr.srq_limit,
            user_handle: Some(slot.user_handle()),
        };
        match p.pd.create_srq(&init) {
            Ok(srq) => {
                a.attr.max_wr = srq.max_wr();
                a.attr.max_sge = srq.max_sge();
                p.users.fetch_add(1, Ordering::AcqRel);
                // SAFETY: all-zero is a valid ibv_srq; libibverbs fills the rest.
                let mut ibv: ibv_srq = unsafe { std::mem::zeroed() };
                ibv.context = p.ibv.context;
                ibv.pd = pd;
                ibv.handle = srq.handle();
                slot.fill(Srq {
                    ibv,
                    srq: SpinLock::new(srq),
                    pd: p,
                    users: AtomicUsize::new(0),
                })
                .cast::<ibv_srq>()
            }
            Err(e) => ffi::fail_null("create_srq", &e),
        }
    })
}

pub unsafe extern "C" fn modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    ffi::guard("modify_srq", libc::EIO, || {
        // SAFETY: libibverbs passes one of our SRQs and the caller's attributes.
        let (s, a) = unsafe { (srq_ref(srq), &*attr) };
        if mask & !(srq_attr_mask::MAX_WR | srq_attr_mask::LIMIT) != 0 {
            return libc::EINVAL;
        }
        let mut q = s.srq.lock();
        if mask & srq_attr_mask::MAX_WR != 0 {
            if let Err(e) = q.resize(a.max_wr) {
                return ffi::fail("modify_srq", &e);
            }
        }
        if mask & srq_attr_mask::LIMIT != 0 {
            if let Err(e) = q.arm_limit(a.srq_limit) {
                return ffi::fail("modify_srq", &e);
            }
        }
        0
    })
}

pub unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    ffi::guard("query_srq", libc::EIO, || {
        // SAFETY: libibverbs passes one of our SRQs.
        let s = unsafe { srq_ref(srq) };
        match s.srq.lock().query() {
            Ok(q) => {
                // SAFETY: the caller's output struct.
                unsafe {
                    attr.write(ibv_srq_attr {
                        max_wr: q.max_wr,
                        max_sge: q.max_sge,
                        srq_limit: q.srq_limit,
                    })
                };
                0
            }
            Err(e) => ffi::fail("query_srq", &e),
        }
    })
}

/// `destroy_srq`, as `ibv_cmd_destroy_srq`: the kernel destroy, then a wait until the program
/// has acknowledged every async event the kernel reported for the SRQ.
pub unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    ffi::guard("destroy_srq", libc::EIO, || {
        // SAFETY: libibverbs passes one of our SRQs.
        if unsafe { srq_ref(srq) }.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        let s = srq.cast::<Srq>();
        // SAFETY: `s` is live, made by `create_srq`, and not used by other threads while the
        // program destroys it; on success the field is never read again.
        let reported = match unsafe { destroy_core(std::ptr::addr_of_mut!((*s).srq), uverbs::Srq::destroy) } {
            Ok(r) => r,
            Err(e) => return ffi::fail("destroy_srq", &e),
        };
        // SAFETY: the PD outlives the SRQs counted in it; the kernel no longer counts this one.
        unsafe { &*(*s).pd }.users.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: `srq` is live until freed below, and libibverbs initialized its mutex and
        // cond (ibv_create_srq).
        unsafe {
            wait_for_acks(
                std::ptr::addr_of_mut!((*srq).mutex),
                std::ptr::addr_of_mut!((*srq).cond),
                &[(std::ptr::addr_of!((*srq).events_completed), reported.r#async)],
            );
        }
        // SAFETY: made by `create_srq` with Box::into_raw (`MaybeUninit<Srq>` has `Srq`'s
        // layout); its `uverbs` half is gone and the rest needs no drop; this is its last use.
        drop(unsafe { Box::from_raw(s.cast::<MaybeUninit<Srq>>()) });
        0
    })
}

pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // No `ffi::guard`: see the module docs.
    // SAFETY: libibverbs passes one of our SRQs; the list and `bad_wr` are the caller's.
    let s = unsafe { srq_ref(srq) };
    let mut q = s.srq.lock();
    // SAFETY: as for post_recv; the C caller keeps receive buffers valid until completion.
    unsafe { post_recv_list(wr, bad_wr, |batch| q.post_recv(batch)) }
}

// ---------------------------------------------------------------------------------------------
// Queue pairs
// ---------------------------------------------------------------------------------------------

/// A QP: `verbs_qp`, then the `uverbs` QP and the objects whose use counts it holds.
#[repr(C)]
pub struct Qp {
    vqp: verbs_qp,
    qp: SpinLock<uverbs::Qp>,
    pd: *const Pd,
    send_cq: *const Cq,
    recv_cq: *const Cq,
    srq: *const Srq,
    ud: bool,
}

/// # Safety
/// `qp` must be a live QP made by [`create_qp`].
unsafe fn qp_ref<'a>(qp: *mut ibv_qp) -> &'a Qp {
    // SAFETY: `ibv_qp` is at the start of `verbs_qp`, the first field of a boxed `Qp`.
    unsafe { &*qp.cast::<Qp>() }
}

fn qp_type_from(t: c_int) -> Option<QpType> {
    match t {
        2 => Some(QpType::Rc),
        3 => Some(QpType::Uc),
        4 => Some(QpType::Ud),
        _ => None,
    }
}

pub unsafe extern "C" fn create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    ffi::guard("create_qp", std::ptr::null_mut(), || {
        // SAFETY: libibverbs passes one of our PDs and the caller's live attributes.
        unsafe { create_qp_common(pd, &mut *attr) }
    })
}

pub unsafe extern "C" fn create_qp_ex(_ibctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    ffi::guard("create_qp_ex", std::ptr::null_mut(), || {
        // SAFETY: the caller's live attributes.
        let a = unsafe { &mut *attr };
        let supported = qp_init_attr_mask::PD | qp_init_attr_mask::CREATE_FLAGS;
        if a.comp_mask & !supported != 0 || a.comp_mask & qp_init_attr_mask::PD == 0 {
            return ffi::refuse_null(
                "create_qp_ex",
                libc::EOPNOTSUPP,
                &format!("comp_mask {:#x} (supported: PD, CREATE_FLAGS=0)", a.comp_mask),
            );
        }
        if a.comp_mask & qp_init_attr_mask::CREATE_FLAGS != 0 && a.create_flags != 0 {
            return ffi::refuse_null("create_qp_ex", libc::EOPNOTSUPP, "create_flags");
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
        // SAFETY: `a.pd` is one of our PDs (comp_mask says it is set).
        let qp = unsafe { create_qp_common(a.pd, &mut base) };
        a.cap = base.cap;
        qp
    })
}

/// # Safety
/// `pd` must be one of our PDs; `attr`'s CQ pointers must be our CQs.
unsafe fn create_qp_common(pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> *mut ibv_qp {
    // SAFETY: per the contract.
    let p = unsafe { pd_ref(pd) };
    let Some(qp_type) = qp_type_from(attr.qp_type) else {
        return ffi::refuse_null("create_qp", libc::EOPNOTSUPP, &format!("QP type {}", attr.qp_type));
    };
    if attr.send_cq.is_null() || attr.recv_cq.is_null() {
        return ffi::refuse_null("create_qp", libc::EINVAL, "missing CQ");
    }
    // SAFETY: per the contract.
    let (scq, rcq) = unsafe { (cq_ref(attr.send_cq), cq_ref(attr.recv_cq)) };
    let same = std::ptr::eq(scq, rcq);
    // Lock in address order so two threads creating QPs on the same two CQs cannot deadlock.
    let (first, second) = if (scq as *const Cq) <= (rcq as *const Cq) {
        (scq, rcq)
    } else {
        (rcq, scq)
    };
    let g1 = first.cq.lock();
    let g2 = (!same).then(|| second.cq.lock());
    let (send_ref, recv_ref): (&uverbs::Cq, &uverbs::Cq) = match &g2 {
        None => (&g1, &g1),
        Some(g2) if std::ptr::eq(first, scq) => (&g1, g2),
        Some(g2) => (g2, &g1),
    };
    // SAFETY: a non-null `srq` is one of our SRQs (libibverbs contract).
    let srq = (!attr.srq.is_null()).then(|| unsafe { srq_ref(attr.srq) });
    let srq_guard = srq.map(|s| s.srq.lock());
    // Events name the QP by its `ibv_qp` pointer (see `Slot`).
    let slot = Slot::<Qp>::new();
    let mut init = uverbs::QpInit::new(qp_type, send_ref, recv_ref);
    init.user_handle = Some(slot.user_handle());
    init.cap = attr.cap;
    init.sq_sig_all = attr.sq_sig_all != 0;
    init.srq = srq_guard.as_deref();
    let created = p.pd.create_qp(&init);
    drop(srq_guard);
    drop(g2);
    drop(g1);
    let qp = match created {
        Ok(qp) => qp,
        Err(e) => return ffi::fail_null("create_qp", &e),
    };
    attr.cap = qp.cap();
    // SAFETY: all-zero is a valid verbs_qp; the fields libibverbs reads are set below and the
    // mutex/cond initialized in place once boxed.
    let mut vqp: verbs_qp = unsafe { std::mem::zeroed() };
    vqp.qp.context = p.ibv.context;
    vqp.qp.qp_context = attr.qp_context;
    vqp.qp.pd = pd;
    vqp.qp.send_cq = attr.send_cq;
    vqp.qp.recv_cq = attr.recv_cq;
    vqp.qp.srq = attr.srq;
    vqp.qp.handle = qp.handle();
    vqp.qp.qp_num = qp.qpn();
    vqp.qp.state = QpState::Reset as c_int;
    vqp.qp.qp_type = attr.qp_type;
    p.users.fetch_add(1, Ordering::AcqRel);
    scq.users.fetch_add(1, Ordering::AcqRel);
    rcq.users.fetch_add(1, Ordering::AcqRel);
    if let Some(s) = srq {
        s.users.fetch_add(1, Ordering::AcqRel);
    }
    let b = slot.fill(Qp {
        vqp,
        qp: SpinLock::new(qp),
        pd: p,
        send_cq: scq,
        recv_cq: rcq,
        srq: srq.map_or(std::ptr::null(), |s| s as *const Srq),
        ud: qp_type == QpType::Ud,
    });
    // SAFETY: `b` is live and not yet shared.
    unsafe {
        init_sync(
            std::ptr::addr_of_mut!((*b).vqp.qp.mutex),
            std::ptr::addr_of_mut!((*b).vqp.qp.cond),
        );
    }
    b.cast::<ibv_qp>()
}

/// `destroy_qp`, as `ibv_cmd_destroy_qp`: the kernel destroy, then a wait until the program
/// has acknowledged every async event the kernel reported for the QP.
pub unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    ffi::guard("destroy_qp", libc::EIO, || {
        let q = qp.cast::<Qp>();
        // SAFETY: libibverbs passes one of our QPs, made by `create_qp_common`, which the
        // program does not use from other threads while destroying it; on success the field
        // is never read again.
        let reported = match unsafe { destroy_core(std::ptr::addr_of_mut!((*q).qp), uverbs::Qp::destroy) } {
            Ok(r) => r,
            Err(e) => return ffi::fail("destroy_qp", &e),
        };
        // SAFETY: PDs, CQs and SRQs outlive the QPs counted in them (their destroy refuses);
        // the kernel no longer counts this one.
        unsafe {
            (*(*q).pd).users.fetch_sub(1, Ordering::AcqRel);
            (*(*q).send_cq).users.fetch_sub(1, Ordering::AcqRel);
            (*(*q).recv_cq).users.fetch_sub(1, Ordering::AcqRel);
            if !(*q).srq.is_null() {
                (*(*q).srq).users.fetch_sub(1, Ordering::AcqRel);
            }
        }
        // SAFETY: `qp` is live until freed below, and `create_qp_common` initialized its mutex
        // and cond, which nobody uses after the wait.
        unsafe {
            let (mutex, cond) = (std::ptr::addr_of_mut!((*qp).mutex), std::ptr::addr_of_mut!((*qp).cond));
            wait_for_acks(
                mutex,
                cond,
                &[(std::ptr::addr_of!((*qp).events_completed), reported.r#async)],
            );
            libc::pthread_mutex_destroy(mutex);
            libc::pthread_cond_destroy(cond);
        }
        // SAFETY: made by `create_qp_common` with Box::into_raw (`MaybeUninit<Qp>` has `Qp`'s
        // layout); its `uverbs` half is gone and the rest needs no drop; this is its last use.
        drop(unsafe { Box::from_raw(q.cast::<MaybeUninit<Qp>>()) });
        0
    })
}

fn state_from(v: c_int) -> Option<QpState> {
    Some(match v {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return None,
    })
}

fn ah_from(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        port_num: a.port_num,
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        grh: (a.is_global != 0).then_some(GlobalRoute {
            dgid: a.grh.dgid,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
            flow_label: a.grh.flow_label,
        }),
    }
}

fn ah_to(a: &AhAttr) -> ibv_ah_attr {
    let g = a.grh.unwrap_or_default();
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: g.dgid,
            flow_label: g.flow_label,
            sgid_index: g.sgid_index,
            hop_limit: g.hop_limit,
            traffic_class: g.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.grh.is_some()),
        port_num: a.port_num,
    }
}

/// The attributes `mask` selects, or the mask bits uverbs cannot express.
fn qp_attr_from(a: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, String> {
    let unsupported = m::ALT_PATH | m::PATH_MIG_STATE | m::CAP | m::RATE_LIMIT;
    let known = ((1 << 21) - 1) | m::RATE_LIMIT;
    if mask & unsupported != 0 || mask & !known != 0 {
        return Err(format!(
            "attribute mask bits {:#x} (alternate path, migration state, caps and rate limit \
             are not supported)",
            mask & (unsupported | !known)
        ));
    }
    let has = |bit: c_int| mask & bit != 0;
    let state = |v: c_int| state_from(v).ok_or_else(|| format!("QP state {v}"));
    Ok(QpAttr {
        state: has(m::STATE).then(|| state(a.qp_state)).transpose()?,
        cur_state: has(m::CUR_STATE).then(|| state(a.cur_qp_state)).transpose()?,
        en_sqd_async_notify: has(m::EN_SQD_ASYNC_NOTIFY).then_some(a.en_sqd_async_notify != 0),
        access: has(m::ACCESS_FLAGS).then_some(AccessFlags::from_bits_retain(a.qp_access_flags)),
        pkey_index: has(m::PKEY_INDEX).then_some(a.pkey_index),
        port_num: has(m::PORT).then_some(a.port_num),
        qkey: has(m::QKEY).then_some(a.qkey),
        ah: has(m::AV).then(|| ah_from(&a.ah_attr)),
        path_mtu: has(m::PATH_MTU)
            .then(|| {
                u8::try_from(a.path_mtu)
                    .ok()
                    .and_then(Mtu::from_raw)
                    .ok_or_else(|| format!("path MTU {}", a.path_mtu))
            })
            .transpose()?,
        timeout: has(m::TIMEOUT).then_some(a.timeout),
        retry_cnt: has(m::RETRY_CNT).then_some(a.retry_cnt),
        rnr_retry: has(m::RNR_RETRY).then_some(a.rnr_retry),
        rq_psn: has(m::RQ_PSN).then_some(a.rq_psn),
        max_rd_atomic: has(m::MAX_QP_RD_ATOMIC).then_some(a.max_rd_atomic),
        min_rnr_timer: has(m::MIN_RNR_TIMER).then_some(a.min_rnr_timer),
        sq_psn: has(m::SQ_PSN).then_some(a.sq_psn),
        max_dest_rd_atomic: has(m::MAX_DEST_RD_ATOMIC).then_some(a.max_dest_rd_atomic),
        dest_qpn: has(m::DEST_QPN).then_some(a.dest_qp_num),
    })
}

pub unsafe extern "C" fn modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    ffi::guard("modify_qp", libc::EIO, || {
        // SAFETY: libibverbs passes one of our QPs and the caller's attributes.
        let (q, a) = unsafe { (qp_ref(qp), &*attr) };
        let attr = match qp_attr_from(a, mask) {
            Ok(attr) => attr,
            Err(why) => {
                ffi::verbose(format_args!("modify_qp: {why}"));
                return libc::EOPNOTSUPP;
            }
        };
        // libibverbs' ibv_modify_qp records the new state in `ibv_qp.state` on success.
        match q.qp.lock().modify(&attr) {
            Ok(()) => 0,
            Err(e) => ffi::fail("modify_qp", &e),
        }
    })
}

pub unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    ffi::guard("query_qp", libc::EIO, || {
        // SAFETY: libibverbs passes one of our QPs.
        let q = unsafe { qp_ref(qp) };
        let info = match q.qp.lock().query() {
            Ok(i) => i,
            Err(e) => return ffi::fail("query_qp", &e),
        };
        let i = &info.attr;
        let out = ibv_qp_attr {
            qp_state: i.state.map_or(0, |s| s as c_int),
            cur_qp_state: i.cur_state.map_or(0, |s| s as c_int),
            path_mtu: i.path_mtu.map_or(0, |v| v as c_int),
            path_mig_state: 0,
            qkey: i.qkey.unwrap_or(0),
            rq_psn: i.rq_psn.unwrap_or(0),
            sq_psn: i.sq_psn.unwrap_or(0),
            dest_qp_num: i.dest_qpn.unwrap_or(0),
            qp_access_flags: i.access.map_or(0, |a| a.bits()),
            cap: info.cap,
            ah_attr: i.ah.as_ref().map(ah_to).unwrap_or_default(),
            alt_ah_attr: ibv_ah_attr::default(),
            pkey_index: i.pkey_index.unwrap_or(0),
            alt_pkey_index: 0,
            en_sqd_async_notify: u8::from(i.en_sqd_async_notify.unwrap_or(false)),
            sq_draining: u8::from(info.sq_draining),
            max_rd_atomic: i.max_rd_atomic.unwrap_or(0),
            max_dest_rd_atomic: i.max_dest_rd_atomic.unwrap_or(0),
            min_rnr_timer: i.min_rnr_timer.unwrap_or(0),
            port_num: i.port_num.unwrap_or(0),
            timeout: i.timeout.unwrap_or(0),
            retry_cnt: i.retry_cnt.unwrap_or(0),
            rnr_retry: i.rnr_retry.unwrap_or(0),
            alt_port_num: 0,
            alt_timeout: 0,
            rate_limit: 0,
        };
        // SAFETY: the caller's output structs; `qp` is live.
        unsafe {
            attr.write(out);
            let c = &(*qp);
            init.write(ibv_qp_init_attr {
                qp_context: c.qp_context,
                send_cq: c.send_cq,
                recv_cq: c.recv_cq,
                srq: c.srq,
                cap: info.cap,
                qp_type: c.qp_type,
                sq_sig_all: c_int::from(info.sq_sig_all),
            });
        }
        0
    })
}

/// The scatter/gather list of a C work request.
///
/// # Safety
/// `sg_list` must point at `num_sge` entries that stay valid for `'a` (or `num_sge` be 0).
unsafe fn sges<'a>(sg_list: *const ibv_sge, num_sge: c_int) -> Option<&'a [ibv_sge]> {
    match usize::try_from(num_sge) {
        Ok(0) => Some(&[]),
        Ok(n) if !sg_list.is_null() => {
            // SAFETY: per the contract.
            Some(unsafe { std::slice::from_raw_parts(sg_list, n) })
        }
        _ => None,
    }
}

/// The `uverbs` operation for a C send work request, or `None` for opcodes uverbs lacks.
fn send_op(wr: &ibv_send_wr) -> Option<SendOp> {
    // SAFETY (union reads below): every arm is plain data; the opcode says which applies.
    let rdma = || {
        // SAFETY: see above.
        let r = unsafe { wr.wr.rdma };
        Remote {
            addr: r.remote_addr,
            rkey: r.rkey,
        }
    };
    // SAFETY: see above.
    let atomic = unsafe { wr.wr.atomic };
    let aremote = Remote {
        addr: atomic.remote_addr,
        rkey: atomic.rkey,
    };
    Some(match wr.opcode {
        wr_opcode::RDMA_WRITE => SendOp::RdmaWrite(rdma()),
        wr_opcode::RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm(rdma(), wr.imm_data),
        wr_opcode::SEND => SendOp::Send,
        wr_opcode::SEND_WITH_IMM => SendOp::SendWithImm { imm_data: wr.imm_data },
        wr_opcode::RDMA_READ => SendOp::RdmaRead(rdma()),
        wr_opcode::ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote: aremote,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        wr_opcode::ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote: aremote,
            add: atomic.compare_add,
        },
        _ => return None,
    })
}

/// How many work requests one uverbs call takes at most (one doorbell each).
const BATCH: usize = 32;

/// Stack room for a batch of `T`, filled from the front: posting neither allocates nor clears.
fn batch_room<T>() -> [MaybeUninit<T>; BATCH] {
    [const { MaybeUninit::uninit() }; BATCH]
}

/// The first `n` entries of `room`.
///
/// # Safety
/// They must have been written.
unsafe fn filled<T>(room: &[MaybeUninit<T>; BATCH], n: usize) -> &[T] {
    // SAFETY: `MaybeUninit<T>` has `T`'s layout, and per the contract the first `n` (at most
    // `BATCH`, as the slice index checks) are initialized.
    unsafe { &*(std::ptr::from_ref(&room[..n]) as *const [T]) }
}

/// The request `index` steps after `wr` in a C list (the one a failed batch stopped at).
///
/// # Safety
/// The list must have at least `index + 1` live elements from `wr`.
unsafe fn nth<T>(mut wr: *mut T, index: usize, next: impl Fn(&T) -> *mut T) -> *mut T {
    for _ in 0..index {
        // SAFETY: per the contract.
        wr = next(unsafe { &*wr });
    }
    wr
}

pub unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    // No `ffi::guard`: see the module docs.
    // SAFETY: libibverbs passes one of our QPs; `wr` is the caller's list, live for the
    // call; `bad_wr` is writable.
    unsafe { post_send_inner(qp_ref(qp), wr, bad_wr) }
}

/// The `uverbs` form of a C send request, or `None` for one uverbs cannot express (unknown
/// opcode, bad scatter/gather list, UD request without an AH).
///
/// # Safety
/// `w`'s SGE array and AH must stay valid for `'a`.
#[inline(always)]
unsafe fn send_wr<'a>(q: &'a Qp, w: &ibv_send_wr) -> Option<SendWr<'a>> {
    // SAFETY: per the contract.
    let (op, sg) = (send_op(w)?, unsafe { sges(w.sg_list, w.num_sge) }?);
    let swr = SendWr::new(w.wr_id, op, sg).flags(SendFlags::from_bits_retain(w.send_flags));
    if !q.ud {
        return Some(swr);
    }
    // SAFETY: on UD QPs the `ud` arm is the one the caller filled.
    let ud = unsafe { w.wr.ud };
    if ud.ah.is_null() {
        return None;
    }
    // SAFETY: a non-null AH in a work request is one of ours, live for `'a`.
    let ah = unsafe { &*ud.ah.cast::<Ah>() };
    Some(swr.to(ah.ah.ud_dest(ud.remote_qpn, ud.remote_qkey)))
}

/// Reports a send request [`send_wr`] refused.
///
/// # Safety
/// `bad_wr` must be writable.
#[cold]
unsafe fn reject_send(wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    ffi::verbose(format_args!("post_send: unsupported opcode or bad scatter/gather list"));
    // SAFETY: per the contract.
    unsafe { *bad_wr = wr };
    libc::EINVAL
}

unsafe fn post_send_inner(q: &Qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    // SAFETY: a non-null `wr` is a live element of the caller's list.
    if !wr.is_null() && unsafe { (*wr).next }.is_null() {
        // One request, the common case: nothing to gather.
        // SAFETY: as above; its SGE array and AH are live for the call.
        let Some(swr) = (unsafe { send_wr(q, &*wr) }) else {
            // SAFETY: writable per the libibverbs contract.
            return unsafe { reject_send(wr, bad_wr) };
        };
        // SAFETY: the C caller of ibv_post_send keeps the buffers its SGEs name valid until
        // completion, the contract `uverbs::Qp::post_send` asks for.
        return match unsafe { q.qp.lock().post_send(std::slice::from_ref(&swr)) } {
            Ok(()) => 0,
            Err(e) => {
                // SAFETY: writable per the libibverbs contract.
                unsafe { *bad_wr = wr };
                ffi::fail("post_send", &e)
            }
        };
    }
    // SAFETY: forwarded contract.
    unsafe { post_send_batches(q, wr, bad_wr) }
}

/// [`post_send`] of a list (or of nothing), in batches of up to [`BATCH`]: out of line, so
/// that the one-request path does not pay for its stack and registers.
///
/// # Safety
/// As for [`post_send`].
#[inline(never)]
unsafe fn post_send_batches(q: &Qp, mut wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    let mut guard = q.qp.lock();
    let mut room = batch_room::<SendWr<'_>>();
    while !wr.is_null() {
        let first = wr;
        let mut n = 0;
        let mut rejected = false;
        while !wr.is_null() && n < BATCH {
            // SAFETY: a live element of the caller's list, whose SGE array and AH are live for
            // the call.
            let w = unsafe { &*wr };
            // SAFETY: as above.
            let Some(swr) = (unsafe { send_wr(q, w) }) else {
                rejected = true;
                break;
            };
            room[n].write(swr);
            n += 1;
            wr = w.next;
        }
        if n > 0 {
            // SAFETY: the loop above wrote the first `n`. The C caller of ibv_post_send keeps
            // the buffers its SGEs name valid until completion, the contract
            // `uverbs::Qp::post_send` asks for.
            if let Err(e) = unsafe { guard.post_send(filled(&room, n)) } {
                let index = match e {
                    uverbs::Error::WorkRequest { index, .. } => index.min(n - 1),
                    _ => 0,
                };
                // SAFETY: the batch came from the `n` (> `index`) elements from `first`;
                // `bad_wr` is writable per the libibverbs contract.
                unsafe { *bad_wr = nth(first, index, |w| w.next) };
                return ffi::fail("post_send", &e);
            }
        }
        if rejected {
            // SAFETY: writable per the libibverbs contract; `wr` is the rejected request.
            return unsafe { reject_send(wr, bad_wr) };
        }
    }
    0
}

pub unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    // No `ffi::guard`: see the module docs.
    // SAFETY: as in post_send.
    unsafe { post_recv_inner(qp_ref(qp), wr, bad_wr) }
}

unsafe fn post_recv_inner(q: &Qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    let mut guard = q.qp.lock();
    // SAFETY: forwarded contract; the C caller keeps receive buffers valid and untouched
    // until completion, the contract `uverbs::Qp::post_recv` asks for.
    unsafe { post_recv_list(wr, bad_wr, |batch| guard.post_recv(batch)) }
}

/// Feeds a C receive list to `post` (one request as it is, more in batches), reporting the
/// first request not posted in `bad_wr`.
///
/// # Safety
/// `wr` must be a valid list whose SGE arrays stay valid for the call, `bad_wr` writable, and
/// `post` an unsafe post whose buffer contract the C caller upholds.
unsafe fn post_recv_list(
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
/// as [`post_send_batches`].
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
                // SAFETY: as in post_send_batches.
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
