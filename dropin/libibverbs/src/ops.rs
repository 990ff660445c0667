//! The tables the provider hands libibverbs, and so the one module that names every object
//! module's entry points: per core provider the device ops ([`device_ops`]: the match table,
//! device allocation, `alloc_context`), and the context ops every context gets ([`OPS`]).
//! The object modules import what they build on ([`context`], [`pd`], ...), never this one,
//! so the imports run one way: from here down to the objects, from them down to `abi`, `ffi`
//! and the core.

use crate::abi::{ibv_device, match_kind, verbs_context, verbs_context_ops, verbs_device_ops, verbs_match_ent};
use crate::device::{alloc_device, uninit_device, Frontend, Matched};
use crate::{ah, context, cq, ffi, mr, mw, pd, qp, qp_ex, srq};
use libc::{c_int, c_void};

/// The op table to register for `frontend`: it matches devices by the core provider's kernel
/// driver id first, else by name, as the C provider does. `None` when the core has no
/// provider of that name. Allocated once per process and never freed: libibverbs keeps the
/// pointers for as long as the library is loaded, which is until the process exits.
pub(crate) fn device_ops(frontend: &'static Frontend) -> Option<&'static verbs_device_ops> {
    let core = uverbs::providers().iter().find(|p| p.name() == frontend.core)?;
    let matched: &'static Matched = Box::leak(Box::new(Matched {
        frontend,
        driver_id: core.driver_id(),
    }));
    let entry = |kind: u8, u: u64| verbs_match_ent {
        driver_data: std::ptr::from_ref(matched).cast_mut().cast::<c_void>(),
        u,
        vendor: 0,
        device: 0,
        kind,
    };
    let table: &'static [verbs_match_ent; 3] = Box::leak(Box::new([
        entry(match_kind::DRIVER_ID, u64::from(matched.driver_id)),
        // `u` is a union: here the `modalias` pointer.
        entry(match_kind::MODALIAS, frontend.name_modalias.as_ptr() as u64),
        entry(match_kind::SENTINEL, 0),
    ]));
    Some(Box::leak(Box::new(verbs_device_ops {
        name: frontend.driver.as_ptr(),
        match_min_abi_version: *frontend.abi_versions.start(),
        match_max_abi_version: *frontend.abi_versions.end(),
        match_table: table.as_ptr(),
        static_providers: std::ptr::null(),
        match_device: None,
        alloc_context: Some(alloc_context),
        import_context: None,
        alloc_device: Some(alloc_device),
        uninit_device: Some(uninit_device),
    })))
}

/// `verbs_device_ops.alloc_context`: [`context::alloc_context`] with [`OPS`].
unsafe extern "C" fn alloc_context(
    ibdev: *mut ibv_device,
    cmd_fd: c_int,
    _private_data: *mut c_void,
) -> *mut verbs_context {
    ffi::guard("alloc_context", std::ptr::null_mut(), || {
        // SAFETY: libibverbs calls this only with a device `alloc_device` made.
        unsafe { context::alloc_context(ibdev, cmd_fd, &OPS) }
    })
}

/// The op table installed in every context. Unset slots make libibverbs answer EOPNOTSUPP
/// (or its own fallback).
static OPS: verbs_context_ops = verbs_context_ops {
    query_device_ex: Some(context::query_device_ex),
    query_port: Some(context::query_port),
    free_context: Some(context::free_context),
    alloc_pd: Some(pd::alloc_pd),
    dealloc_pd: Some(pd::dealloc_pd),
    reg_mr: Some(mr::reg_mr),
    dereg_mr: Some(mr::dereg_mr),
    alloc_mw: Some(mw::alloc_mw),
    dealloc_mw: Some(mw::dealloc_mw),
    bind_mw: Some(mw::bind_mw),
    create_cq: Some(cq::create_cq),
    create_cq_ex: Some(cq::create_cq_ex),
    poll_cq: Some(cq::poll_cq),
    req_notify_cq: Some(cq::req_notify_cq),
    resize_cq: Some(cq::resize_cq),
    destroy_cq: Some(cq::destroy_cq),
    create_qp: Some(qp::create_qp),
    create_qp_ex: Some(qp_ex::create_qp_ex),
    query_qp: Some(qp::query_qp),
    modify_qp: Some(qp::modify_qp),
    destroy_qp: Some(qp::destroy_qp),
    post_send: Some(qp::post_send),
    post_recv: Some(qp::post_recv),
    attach_mcast: Some(qp::attach_mcast),
    detach_mcast: Some(qp::detach_mcast),
    create_ah: Some(ah::create_ah),
    destroy_ah: Some(ah::destroy_ah),
    create_srq: Some(srq::create_srq),
    create_srq_ex: Some(srq::create_srq_ex),
    modify_srq: Some(srq::modify_srq),
    query_srq: Some(srq::query_srq),
    destroy_srq: Some(srq::destroy_srq),
    post_srq_recv: Some(srq::post_srq_recv),
    ..verbs_context_ops::EMPTY
};

impl verbs_context_ops {
    /// Every slot unset.
    // SAFETY: the struct is only `Option` function pointers, for which all-zero is `None`.
    pub const EMPTY: Self = unsafe { std::mem::zeroed() };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::FRONTENDS;
    use libc::c_char;
    use std::ffi::CStr;

    #[test]
    fn every_frontend_matches_its_core_providers_driver_id_then_the_c_providers_name() {
        for frontend in FRONTENDS {
            let core = uverbs::providers().iter().find(|p| p.name() == frontend.core);
            let core = core.unwrap_or_else(|| panic!("the core has no provider {:?}", frontend.core));
            let ops = device_ops(frontend).unwrap();
            assert_eq!(ops.name, frontend.driver.as_ptr());
            // SAFETY: `device_ops` made a table of three entries.
            let table = unsafe { std::slice::from_raw_parts(ops.match_table, 3) };
            assert_eq!(
                (table[0].kind, table[0].u),
                (match_kind::DRIVER_ID, u64::from(core.driver_id()))
            );
            assert_eq!(table[1].kind, match_kind::MODALIAS);
            // SAFETY: a modalias entry's `u` is the pointer to a 'static C string.
            let modalias = unsafe { CStr::from_ptr(table[1].u as *const c_char) };
            assert_eq!(modalias, frontend.name_modalias);
            assert_eq!(table[2].kind, match_kind::SENTINEL);
            for entry in table {
                // SAFETY: every entry's `driver_data` is the leaked `Matched`.
                let matched = unsafe { &*entry.driver_data.cast::<Matched>() };
                assert!(std::ptr::eq(matched.frontend, frontend));
                assert_eq!(matched.driver_id, core.driver_id());
            }
        }
    }
}
