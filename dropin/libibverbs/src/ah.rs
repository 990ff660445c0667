//! Address handles: `create_ah`, `destroy_ah`, and the C address vector.

use crate::abi::{ibv_ah, ibv_ah_attr, ibv_global_route, ibv_pd};
use crate::ffi;
use crate::pd::{pd_ref, Pd};
use libc::c_int;
use std::sync::atomic::Ordering;
use uverbs::{AhAttr, GlobalRoute};

/// An AH: `ibv_ah`, then the `uverbs` AH and the PD it counts against.
#[repr(C)]
pub struct Ah {
    ibv: ibv_ah,
    pub(crate) ah: uverbs::Ah,
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

pub(crate) fn ah_from(a: &ibv_ah_attr) -> AhAttr {
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

pub(crate) fn ah_to(a: &AhAttr) -> ibv_ah_attr {
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
