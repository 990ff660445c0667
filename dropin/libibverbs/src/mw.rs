//! Memory windows: `alloc_mw`, `dealloc_mw`, `bind_mw` (type 1, through a BIND_MW request as
//! rdma-core's rxe posts it). The C bind arguments as the core's `MwBind` are [`crate::wr`]'s.

use crate::abi::{ibv_mw, ibv_mw_bind, ibv_pd, ibv_qp};
use crate::ffi;
use crate::pd::{pd_ref, Pd};
use crate::qp::qp_ref;
use crate::wr::mw_bind;
use libc::c_int;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use uverbs::{MwType, SendFlags, SendOp, SendWr};

/// An MW: `ibv_mw` (whose `rkey` is the program's record of the window's key: binds change
/// it), then the `uverbs` MW and the PD it counts against.
#[repr(C)]
pub struct Mw {
    ibv: ibv_mw,
    mw: uverbs::Mw,
    pd: *const Pd,
}

/// `IBV_ACCESS_ZERO_BASED`, which rxe's binds refuse.
const ACCESS_ZERO_BASED: u32 = 1 << 5;

pub unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: c_int) -> *mut ibv_mw {
    ffi::guard("alloc_mw", std::ptr::null_mut(), || {
        // SAFETY: libibverbs passes one of our PDs.
        let p = unsafe { pd_ref(pd) };
        let Some(t) = u32::try_from(mw_type).ok().and_then(MwType::from_raw) else {
            // As the kernel answers.
            return ffi::refuse_null("alloc_mw", libc::EINVAL, &format!("MW type {mw_type}"));
        };
        match p.pd.alloc_mw(t) {
            Ok(mw) => {
                p.users.fetch_add(1, Ordering::AcqRel);
                let b = Box::new(Mw {
                    ibv: ibv_mw {
                        context: p.ibv.context,
                        pd,
                        rkey: mw.rkey(),
                        handle: mw.handle(),
                        type_: mw_type,
                    },
                    mw,
                    pd: p,
                });
                Box::into_raw(b).cast::<ibv_mw>()
            }
            Err(e) => ffi::fail_null("alloc_mw", &e),
        }
    })
}

pub unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    ffi::guard("dealloc_mw", libc::EIO, || {
        let m = mw.cast::<Mw>();
        // SAFETY: libibverbs passes one of our MWs, made by `alloc_mw`, which the program does
        // not use elsewhere while deallocating it. Its `uverbs` half is moved out, and put
        // back if the kernel refuses, so the C object stays intact then.
        let core = unsafe { std::ptr::addr_of!((*m).mw).read() };
        match core.dealloc() {
            Ok(()) => {
                // SAFETY: PDs outlive the MWs counted in them (their dealloc refuses); made by
                // `alloc_mw` with Box::into_raw, its `uverbs` half gone and the rest needing
                // no drop: this is its last use.
                unsafe {
                    (*(*m).pd).users.fetch_sub(1, Ordering::AcqRel);
                    drop(Box::from_raw(m.cast::<MaybeUninit<Mw>>()));
                }
                0
            }
            Err((core, e)) => {
                // SAFETY: the field moved out above.
                unsafe { std::ptr::addr_of_mut!((*m).mw).write(core) };
                ffi::fail("dealloc_mw", &e)
            }
        }
    })
}

/// `bind_mw` (type 1; libibverbs' `ibv_bind_mw` refuses other types): posts a BIND_MW request
/// giving the window the next key (the low 8 bits of its rkey plus one), as rdma-core's rxe
/// does, and records the new rkey in `mw->rkey` once posted (the program undoes that if the
/// bind completes in error, as with the C provider).
pub unsafe extern "C" fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, bind: *mut ibv_mw_bind) -> c_int {
    ffi::guard("bind_mw", libc::EIO, || {
        // SAFETY: libibverbs passes one of our QPs and MWs and the caller's bind.
        let (q, b) = unsafe { (qp_ref(qp), &*bind) };
        let info = b.bind_info;
        if info.mw_access_flags & ACCESS_ZERO_BASED != 0 {
            ffi::set_errno(libc::EINVAL);
            return libc::EINVAL;
        }
        // SAFETY: as above.
        let rkey = unsafe { (*mw).rkey };
        let new_rkey = (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff);
        // SAFETY: as above.
        let op = SendOp::BindMw(unsafe { mw_bind(mw, new_rkey, &info) });
        let wr = SendWr::new(b.wr_id, op, &[]).set_flags(SendFlags::from_bits_retain(b.send_flags));
        // SAFETY: the request names no buffers.
        match unsafe { q.qp.lock().post_send(std::slice::from_ref(&wr)) } {
            Ok(()) => {
                // SAFETY: `mw` is live; the program does not bind it from two threads at once.
                unsafe { (*mw).rkey = new_rkey };
                0
            }
            Err(e) => {
                let errno = ffi::fail("bind_mw", &e);
                ffi::set_errno(errno);
                errno
            }
        }
    })
}
