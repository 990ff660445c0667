//! Shared receive queues: `create_srq`, `create_srq_ex`, `modify_srq`, `query_srq`,
//! `destroy_srq`, `post_srq_recv`.

use crate::abi::{
    ibv_context, ibv_pd, ibv_recv_wr, ibv_srq, ibv_srq_attr, ibv_srq_init_attr, ibv_srq_init_attr_ex,
    srq_init_attr_mask, SRQT_BASIC,
};
use crate::event::{destroy_core, init_sync, wait_for_acks, Slot};
use crate::ffi;
use crate::pd::{pd_ref, Pd};
use crate::spin::SpinLock;
use crate::wr::post_recv_list;
use libc::c_int;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};
use uverbs::SrqAttrMask;

/// An SRQ: `ibv_srq` (libibverbs fills context, srq_context, pd, mutex and cond after
/// `create_srq`), then the `uverbs` SRQ, its PD, and how many QPs use it.
#[repr(C)]
pub struct Srq {
    ibv: ibv_srq,
    pub(crate) srq: SpinLock<uverbs::Srq>,
    pd: *const Pd,
    pub(crate) users: AtomicUsize,
}

/// # Safety
/// `srq` must be a live SRQ made by [`create_srq`].
pub(crate) unsafe fn srq_ref<'a>(srq: *mut ibv_srq) -> &'a Srq {
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

/// `create_srq_ex`, which libibverbs calls for what `ibv_create_srq` cannot express: a basic
/// SRQ is made as [`create_srq`] makes one (the kernel ignores a CQ for basic SRQs), and the
/// fields libibverbs fills after `create_srq` are filled here. rdma_rxe makes basic SRQs only
/// (XRC ones need an XRC domain, which rxe cannot open; tag matching it refuses).
pub unsafe extern "C" fn create_srq_ex(_ibctx: *mut ibv_context, attr: *mut ibv_srq_init_attr_ex) -> *mut ibv_srq {
    ffi::guard("create_srq_ex", std::ptr::null_mut(), || {
        // SAFETY: the caller's live attributes.
        let a = unsafe { &mut *attr };
        // As libibverbs' ibv_cmd_create_srq_ex, which the C provider calls.
        if a.comp_mask >= srq_init_attr_mask::RESERVED {
            return ffi::refuse_null(
                "create_srq_ex",
                libc::EOPNOTSUPP,
                &format!("comp_mask {:#x}", a.comp_mask),
            );
        }
        if a.comp_mask & srq_init_attr_mask::PD == 0 || a.pd.is_null() {
            return ffi::refuse_null("create_srq_ex", libc::EINVAL, "no PD");
        }
        if a.comp_mask & srq_init_attr_mask::TYPE != 0 && a.srq_type != SRQT_BASIC {
            let why = format!("SRQ type {} (rxe makes basic SRQs only)", a.srq_type);
            return ffi::refuse_null("create_srq_ex", libc::EOPNOTSUPP, &why);
        }
        let mut base = ibv_srq_init_attr {
            srq_context: a.srq_context,
            attr: a.attr,
        };
        // SAFETY: `a.pd` is one of our PDs (comp_mask says it is set).
        let srq = unsafe { create_srq(a.pd, &mut base) };
        if !srq.is_null() {
            a.attr = base.attr;
            // SAFETY: `srq` was just made and is not yet shared; libibverbs does not
            // initialize these for `create_srq_ex` as it does for `create_srq`.
            unsafe {
                (*srq).srq_context = a.srq_context;
                init_sync(
                    std::ptr::addr_of_mut!((*srq).mutex),
                    std::ptr::addr_of_mut!((*srq).cond),
                );
            }
        }
        srq
    })
}

pub unsafe extern "C" fn modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    ffi::guard("modify_srq", libc::EIO, || {
        // SAFETY: libibverbs passes one of our SRQs and the caller's attributes.
        let (s, a) = unsafe { (srq_ref(srq), &*attr) };
        // `enum ibv_srq_attr_mask` bits; unknown ones are refused.
        let Some(mask) = SrqAttrMask::from_bits(mask as u32) else {
            return libc::EINVAL;
        };
        let mut q = s.srq.lock();
        if mask.contains(SrqAttrMask::MAX_WR) {
            if let Err(e) = q.resize(a.max_wr) {
                return ffi::fail("modify_srq", &e);
            }
        }
        if mask.contains(SrqAttrMask::LIMIT) {
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
    // No `ffi::guard`: see the crate docs.
    // SAFETY: libibverbs passes one of our SRQs; the list and `bad_wr` are the caller's.
    let s = unsafe { srq_ref(srq) };
    let mut q = s.srq.lock();
    // SAFETY: as for post_recv; the C caller keeps receive buffers valid until completion.
    unsafe { post_recv_list(wr, bad_wr, |batch| q.post_recv(batch)) }
}
