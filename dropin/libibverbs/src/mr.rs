//! Memory regions: `reg_mr`, `dereg_mr`.

use crate::abi::{ibv_mr, ibv_pd, verbs_mr, IBV_MR_TYPE_MR};
use crate::ffi;
use crate::pd::{pd_ref, Pd};
use libc::{c_int, c_void, size_t};
use std::sync::atomic::Ordering;
use uverbs::AccessFlags;

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
