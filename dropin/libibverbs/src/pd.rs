//! Protection domains: `alloc_pd`, `dealloc_pd`.

use crate::abi::{ibv_context, ibv_pd};
use crate::context::Context;
use crate::ffi;
use libc::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A PD: `ibv_pd`, then the `uverbs` PD and how many MRs and QPs use it.
#[repr(C)]
pub struct Pd {
    pub(crate) ibv: ibv_pd,
    pub(crate) pd: uverbs::Pd,
    pub(crate) users: AtomicUsize,
}

/// # Safety
/// `pd` must be a live PD made by [`alloc_pd`].
pub(crate) unsafe fn pd_ref<'a>(pd: *mut ibv_pd) -> &'a Pd {
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
