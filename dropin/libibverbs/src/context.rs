//! Contexts: `alloc_context`/`free_context`, device and port queries. The op table that
//! names them, and every object module's ops, is [`crate::ops`]'s.

use crate::abi::{
    ibv_context, ibv_device, ibv_device_attr, ibv_device_attr_ex, ibv_port_attr, ibv_query_device_ex_input,
    verbs_context, verbs_context_ops, verbs_device,
};
use crate::{device, ffi, libibverbs};
use libc::{c_int, size_t};
use std::mem::{offset_of, size_of};
use std::os::fd::{BorrowedFd, IntoRawFd};

/// Our context: libibverbs' `verbs_context` first, then the `uverbs` context.
#[repr(C)]
pub struct Context {
    pub vctx: verbs_context,
    /// `None` only while being set up or torn down.
    pub core: Option<uverbs::Context>,
}

impl Context {
    /// The `Context` around `ctx`.
    ///
    /// # Safety
    /// `ctx` must be the `ibv_context` of a live context made by [`alloc_context`].
    pub unsafe fn from_ibv<'a>(ctx: *mut ibv_context) -> &'a Context {
        let at = offset_of!(Context, vctx) + offset_of!(verbs_context, context);
        // SAFETY: per the contract `ctx` is the `context` field of the `vctx` field of a
        // live `Context`.
        unsafe { &*ctx.cast::<u8>().sub(at).cast::<Context>() }
    }

    /// The `uverbs` context (set for every context libibverbs can see).
    pub fn core(&self) -> &uverbs::Context {
        self.core
            .as_ref()
            .expect("a context visible to libibverbs has its uverbs context")
    }
}

fn dup(fd: BorrowedFd<'_>) -> std::io::Result<std::os::fd::OwnedFd> {
    fd.try_clone_to_owned()
}

/// `verbs_device_ops.alloc_context` (through [`crate::ops`], which runs it under
/// [`ffi::guard`]): libibverbs opened `cmd_fd` on one of our devices and hands it over
/// (closing it is ours on failure); the context gets the op table `ops`.
///
/// # Safety
/// `ibdev` must be a device `alloc_device` made.
pub(crate) unsafe fn alloc_context(
    ibdev: *mut ibv_device,
    cmd_fd: c_int,
    ops: &'static verbs_context_ops,
) -> *mut verbs_context {
    let Some(imports) = libibverbs::imports() else {
        // Unreachable: the provider registers only after resolving its imports.
        // SAFETY: we own cmd_fd and nothing else uses it.
        unsafe { libc::close(cmd_fd) };
        return ffi::refuse_null("alloc_context", libc::ENOSYS, "libibverbs imports missing");
    };
    // SAFETY: `ibdev` is a device `alloc_device` made.
    let dev = unsafe { device::from_ibv(ibdev) };
    // SAFETY: libibverbs callocs a `Context` (all-zero: null/None pointers, zero integers, a
    // zeroed mutex, and `core`'s bytes, which are written below before any read) and
    // initializes its `vctx`; it takes ownership of `cmd_fd`, closing it on failure.
    let ctx = unsafe {
        (imports.init_and_alloc_context)(
            ibdev,
            cmd_fd,
            size_of::<Context>(),
            offset_of!(Context, vctx) as *mut verbs_context,
            dev.matched.driver_id,
        )
    }
    .cast::<Context>();
    if ctx.is_null() {
        return ffi::refuse_null("alloc_context", libc::ENOMEM, "verbs_init_context failed");
    }
    // SAFETY: `ctx` is live and ours alone until returned.
    let vctx = unsafe {
        std::ptr::addr_of_mut!((*ctx).core).write(None);
        std::ptr::addr_of_mut!((*ctx).vctx)
    };
    // SAFETY: `vctx` was just initialized.
    let sz = unsafe { (*vctx).sz };
    let fail = |errno: c_int, why: &str| -> *mut verbs_context {
        // SAFETY: undoes the init (closing cmd_fd and any async fd), then frees the memory
        // libibverbs calloc'd, which nobody else references (`core` is still `None`).
        unsafe {
            (imports.uninit_context)(vctx);
            libc::free(ctx.cast());
        }
        ffi::refuse_null("alloc_context", errno, why)
    };
    if sz != size_of::<verbs_context>() {
        return fail(
            libc::ENOSYS,
            &format!(
                "libibverbs says struct verbs_context is {sz} bytes, this provider was built for \
                 {} (provider ABI mismatch)",
                size_of::<verbs_context>()
            ),
        );
    }
    let info = match uverbs::devices() {
        Ok(list) => list.into_iter().find(|d| d.uverbs == dev.uverbs_name),
        Err(e) => return fail(ffi::fail("alloc_context", &e), "listing devices failed"),
    };
    let Some(info) = info else {
        return fail(
            libc::ENODEV,
            &format!("{} is no longer listed in sysfs", dev.uverbs_name),
        );
    };
    // The uverbs context owns a duplicate of libibverbs' cmd_fd (the same open file, so the
    // same kernel context); libibverbs closes its own in verbs_uninit_context.
    // SAFETY: `cmd_fd` stays open until verbs_uninit_context.
    let owned = match dup(unsafe { BorrowedFd::borrow_raw(cmd_fd) }) {
        Ok(fd) => fd,
        Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE), "dup of cmd_fd"),
    };
    let core = match uverbs::Context::from_fd(&info, owned) {
        Ok(c) => c,
        Err(e) => return fail(ffi::fail("alloc_context", &e), "opening the uverbs context"),
    };
    // libibverbs reads async events from `async_fd` itself (ibv_get_async_event) and closes
    // it in verbs_uninit_context: give it its own duplicate of the kernel's async event file
    // (the drop-in never calls the core's CQ checks, which would read events ahead of it).
    let async_fd = match dup(core.kernel_async_fd()) {
        Ok(fd) => fd.into_raw_fd(),
        Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE), "dup of async fd"),
    };
    // SAFETY: `ctx` is live and not yet visible to anyone else; `vctx` is initialized and
    // `ops` is a 'static table of the layout libibverbs expects.
    unsafe {
        (*vctx).context.async_fd = async_fd;
        (*vctx).context.num_comp_vectors = core.num_comp_vectors() as c_int;
        *std::ptr::addr_of_mut!((*ctx).core) = Some(core);
        (imports.set_ops)(vctx, ops);
    }
    ffi::verbose(format_args!(
        "opened {} on fd {cmd_fd} (async fd {async_fd})",
        dev.ibdev_name
    ));
    vctx
}

/// `free_context` (from `ibv_close_device`).
pub(crate) unsafe extern "C" fn free_context(ibctx: *mut ibv_context) {
    ffi::guard("free_context", (), || {
        let Some(imports) = libibverbs::imports() else {
            return;
        };
        let at = offset_of!(Context, vctx) + offset_of!(verbs_context, context);
        // SAFETY: `ibctx` belongs to a context `alloc_context` made (calloc'd by libibverbs);
        // this is its last use. The uverbs context (our fd duplicates) goes first, then
        // libibverbs' half (its cmd_fd and async_fd), then the memory.
        unsafe {
            let ctx = ibctx.cast::<u8>().sub(at).cast::<Context>();
            std::ptr::drop_in_place(std::ptr::addr_of_mut!((*ctx).core));
            (imports.uninit_context)(std::ptr::addr_of_mut!((*ctx).vctx));
            libc::free(ctx.cast());
        }
    });
}

/// `a` as libibverbs lays it out, `fw_ver` formatted by `fw_ver`.
fn device_attr(a: &uverbs::DeviceAttr, fw_ver: fn(u64) -> String) -> ibv_device_attr {
    // SAFETY: all-zero is a valid ibv_device_attr (integers and a char array).
    let mut o: ibv_device_attr = unsafe { std::mem::zeroed() };
    let fw = fw_ver(a.fw_ver);
    for (d, s) in o.fw_ver.iter_mut().zip(fw.bytes().take(63)) {
        *d = s as libc::c_char;
    }
    o.node_guid = a.node_guid.to_be();
    o.sys_image_guid = a.sys_image_guid.to_be();
    o.max_mr_size = a.max_mr_size;
    o.page_size_cap = a.page_size_cap;
    o.vendor_id = a.vendor_id;
    o.vendor_part_id = a.vendor_part_id;
    o.hw_ver = a.hw_ver;
    o.max_qp = a.max_qp as c_int;
    o.max_qp_wr = a.max_qp_wr as c_int;
    o.device_cap_flags = a.device_cap_flags;
    o.max_sge = a.max_sge as c_int;
    o.max_sge_rd = a.max_sge_rd as c_int;
    o.max_cq = a.max_cq as c_int;
    o.max_cqe = a.max_cqe as c_int;
    o.max_mr = a.max_mr as c_int;
    o.max_pd = a.max_pd as c_int;
    o.max_qp_rd_atom = a.max_qp_rd_atom as c_int;
    o.max_ee_rd_atom = a.max_ee_rd_atom as c_int;
    o.max_res_rd_atom = a.max_res_rd_atom as c_int;
    o.max_qp_init_rd_atom = a.max_qp_init_rd_atom as c_int;
    o.max_ee_init_rd_atom = a.max_ee_init_rd_atom as c_int;
    o.atomic_cap = a.atomic_cap.0 as c_int;
    o.max_ee = a.max_ee as c_int;
    o.max_rdd = a.max_rdd as c_int;
    o.max_mw = a.max_mw as c_int;
    o.max_raw_ipv6_qp = a.max_raw_ipv6_qp as c_int;
    o.max_raw_ethy_qp = a.max_raw_ethy_qp as c_int;
    o.max_mcast_grp = a.max_mcast_grp as c_int;
    o.max_mcast_qp_attach = a.max_mcast_qp_attach as c_int;
    o.max_total_mcast_qp_attach = a.max_total_mcast_qp_attach as c_int;
    o.max_ah = a.max_ah as c_int;
    o.max_fmr = a.max_fmr as c_int;
    o.max_map_per_fmr = a.max_map_per_fmr as c_int;
    o.max_srq = a.max_srq as c_int;
    o.max_srq_wr = a.max_srq_wr as c_int;
    o.max_srq_sge = a.max_srq_sge as c_int;
    o.max_pkeys = a.max_pkeys;
    o.local_ca_ack_delay = a.local_ca_ack_delay;
    o.phys_port_cnt = a.phys_port_cnt;
    o
}

/// `query_device_ex` (also behind the legacy `ibv_query_device`). The attributes come from
/// the kernel's extended QUERY_DEVICE via `uverbs`; of the extended ones, rxe reports its
/// capability flags (all 64 bits, as rdma-core's C provider passes them on: Linux 6.12 sets
/// bits above 31 that Linux 6.1 did not) and the port count, the rest are zero.
pub(crate) unsafe extern "C" fn query_device_ex(
    ibctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: size_t,
) -> c_int {
    ffi::guard("query_device_ex", libc::EIO, || {
        // SAFETY: `input` is null or a live input struct (libibverbs contract).
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return libc::EINVAL;
        }
        if attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        // SAFETY: `ibctx` is one of our contexts.
        let ctx = unsafe { Context::from_ibv(ibctx) };
        let (a, flags_ex) = match ctx.core().query_device_ex() {
            Ok(x) => (x.attr, x.device_cap_flags_ex),
            Err(e) => return ffi::fail("query_device_ex", &e),
        };
        // SAFETY: all-zero is a valid ibv_device_attr_ex.
        let mut ex: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: `ibctx->device` is one of our devices.
        let dev = unsafe { device::from_ibv((*ibctx).device) };
        ex.orig_attr = device_attr(&a, dev.matched.frontend.fw_ver);
        ex.device_cap_flags_ex = flags_ex;
        // SAFETY: `ibctx->device` is one of our devices; libibverbs set its `sysfs`.
        let num_ports = unsafe {
            let vdev = (*ibctx).device.cast::<verbs_device>();
            let sysfs = (*vdev).sysfs;
            if sysfs.is_null() {
                0
            } else {
                (*sysfs).num_ports
            }
        };
        ex.phys_port_cnt_ex = if num_ports != 0 {
            num_ports
        } else {
            u32::from(a.phys_port_cnt)
        };
        let n = attr_size.min(size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's buffer holds `attr_size` bytes; we write the first `n` of
        // them (zeroing any tail we do not know, as libibverbs does).
        unsafe {
            std::ptr::write_bytes(attr.cast::<u8>(), 0, attr_size);
            std::ptr::copy_nonoverlapping(std::ptr::addr_of!(ex).cast::<u8>(), attr.cast::<u8>(), n);
        }
        0
    })
}

/// `query_port`.
pub(crate) unsafe extern "C" fn query_port(ibctx: *mut ibv_context, port: u8, out: *mut ibv_port_attr) -> c_int {
    ffi::guard("query_port", libc::EIO, || {
        // SAFETY: `ibctx` is one of our contexts.
        let ctx = unsafe { Context::from_ibv(ibctx) };
        let p = match ctx.core().query_port(port) {
            Ok(p) => p,
            Err(e) => return ffi::fail("query_port", &e),
        };
        let attr = ibv_port_attr {
            state: p.state.0 as c_int,
            max_mtu: p.max_mtu.map_or(0, |m| m as c_int),
            active_mtu: p.active_mtu.map_or(0, |m| m as c_int),
            gid_tbl_len: p.gid_tbl_len as c_int,
            port_cap_flags: p.port_cap_flags,
            max_msg_sz: p.max_msg_sz,
            bad_pkey_cntr: p.bad_pkey_cntr,
            qkey_viol_cntr: p.qkey_viol_cntr,
            pkey_tbl_len: p.pkey_tbl_len,
            lid: p.lid,
            sm_lid: p.sm_lid,
            lmc: p.lmc,
            max_vl_num: p.max_vl_num,
            sm_sl: p.sm_sl,
            subnet_timeout: p.subnet_timeout,
            init_type_reply: p.init_type_reply,
            active_width: p.active_width.0 as u8,
            active_speed: p.active_speed.0 as u8,
            phys_state: p.phys_state,
            link_layer: p.link_layer.0 as u8,
            flags: p.flags,
            port_cap_flags2: p.port_cap_flags2,
        };
        // SAFETY: libibverbs passes a full `ibv_port_attr` (it bounces smaller user buffers).
        unsafe { out.write(attr) };
        0
    })
}
