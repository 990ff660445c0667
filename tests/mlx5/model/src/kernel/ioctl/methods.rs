//! The core's ioctl methods the model has (core/uverbs_std_types_{device,cq,qp,async_fd}.c,
//! core/uverbs_std_types{,_mr}.c): each takes its attributes from the processed bundle, turns
//! them into the write form's core request and runs the same handler as the write() command.

use super::super::{caps, Call, Context, Errno, Host, Model};
use super::{
    core_resp, object, qp_create, qpt, Bundle, CORE_SUPPORT, CQ_FLAGS_IGNORE_OVERRUN, CQ_FLAGS_TIMESTAMP_COMPLETION,
};
use crate::abi;
use crate::mem::Memory;
use libc::{EINVAL, ENOENT, EOPNOTSUPP};
use std::cell::RefCell;
use zerocopy::IntoBytes;

impl Model {
    /// core/uverbs_std_types_device.c:211 `UVERBS_METHOD_GET_CONTEXT`: the two optional
    /// outputs, then `ib_alloc_ucontext` and `ib_init_ucontext` with the driver's
    /// `alloc_ucontext`. Unlike the write form it makes no async event fd (ASYNC_EVENT_ALLOC
    /// does).
    pub(super) fn ioctl_get_context(&mut self, ctx: i32, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        // core/uverbs_std_types_device.c:218-226: the outputs are written first (EFAULT).
        b.output(mem, 0, &caps::NUM_COMP_VECTORS.to_ne_bytes())?;
        b.output(mem, 1, &CORE_SUPPORT.to_ne_bytes())?;
        // :231 -> core/uverbs_cmd.c:241-244 ib_init_ucontext: a file that has a ucontext
        // already is EINVAL, before the driver runs (:251).
        if self.contexts.get(&ctx).is_some_and(|c| c.alive) {
            return Err(EINVAL);
        }
        let call = b.call(mem, ctx, &[])?;
        let fresh = self.alloc_ucontext(&call, mem)?;
        b.driver_written(mem)?;
        let c = self.contexts.entry(ctx).or_default();
        *c = Context {
            async_sink: c.async_sink.take(),
            async_fd: c.async_fd,
            async_fds: std::mem::take(&mut c.async_fds),
            uar_maps: std::mem::take(&mut c.uar_maps),
            ..fresh
        };
        Ok(())
    }

    /// core/uverbs_std_types_device.c:176 `UVERBS_METHOD_QUERY_PORT`: the write form's port
    /// attributes as `ib_uverbs_query_port_resp_ex` (`port_cap_flags2` 0).
    pub(super) fn ioctl_query_port(&mut self, ctx: i32, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        // :186-188: the ucontext (EINVAL without, after the attributes were processed).
        self.ucontext(ctx)?;
        // :195-198: `uverbs_get_const` into a u8: a value beyond it is EINVAL
        // (core/uverbs_ioctl.c:803-804).
        let port = b.number(mem, 0)?.unwrap_or(0);
        let port = u8::try_from(port).map_err(|_| EINVAL)?;
        let req = abi::QueryPort {
            response: 0,
            port_num: port,
            reserved: [0; 7],
        };
        // :200 ib_query_port (core/device.c:2108-2109: an invalid port is EINVAL).
        let call = b.call(mem, ctx, req.as_bytes())?;
        self.query_port(&call, mem)?;
        let legacy: abi::QueryPortResp = core_resp(&call);
        let mut resp = legacy.as_bytes().to_vec();
        resp.resize(48, 0);
        // :207-208: copied with the client's buffer beyond the struct zeroed.
        b.output_or_zero(mem, 1, &resp)
    }

    /// The port's valid GIDs: on an InfiniBand port GID 0, the link-local prefix and the
    /// port GUID, type IB, no netdev; on Ethernet the RoCE v1 and v2 GIDs of the netdev's
    /// addresses (`port.rs`), each with the netdev's ifindex.
    pub fn gid_table(&self) -> Vec<abi::GidEntry> {
        let eth = self.port.is_eth();
        self.port
            .gids
            .iter()
            .enumerate()
            .map(|(i, g)| abi::GidEntry {
                gid: g.gid,
                gid_index: i as u32,
                port_num: 1,
                gid_type: g.ty.abi(),
                netdev_ifindex: if eth { crate::port::NETDEV_IFINDEX } else { 0 },
            })
            .collect()
    }

    /// core/uverbs_std_types_device.c:312 `UVERBS_METHOD_QUERY_GID_TABLE`; each entry is
    /// copied at the caller's size, zero-padded (`copy_gid_entries_to_user`, :271).
    pub(super) fn ioctl_query_gid_table(&mut self, ctx: i32, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        // :324-327: flags must be 0.
        b.flags(mem, 1, 0)?;
        // :329-335: a zero entry size is EINVAL.
        let entry_size = b.number(mem, 0)?.unwrap_or(0);
        if entry_size == 0 {
            return Err(EINVAL);
        }
        // :337-341 (include/rdma/uverbs_ioctl.h:733 uverbs_attr_ptr_get_array_size): the
        // buffer must hold a whole, nonzero number of entries.
        let len = b.get(2).map_or(0, |(_, a)| u64::from(a.len));
        if len % entry_size != 0 || len / entry_size == 0 {
            return Err(EINVAL);
        }
        // :343-345: only now the ucontext.
        self.ucontext(ctx)?;
        // :352-354 (core/cache.c:1273-1275 rdma_query_gid_table): fewer slots than valid
        // GIDs is EINVAL.
        let table = self.gid_table();
        if (table.len() as u64) > len / entry_size {
            return Err(EINVAL);
        }
        let mut bytes = Vec::new();
        for e in &table {
            let mut entry = e.as_bytes().to_vec();
            entry.resize(entry_size as usize, 0);
            bytes.extend_from_slice(&entry);
        }
        b.output(mem, 2, &bytes)?;
        b.output(mem, 3, &(table.len() as u64).to_ne_bytes())
    }

    /// core/uverbs_std_types_async_fd.c:11 `UVERBS_METHOD_ASYNC_EVENT_ALLOC`: a new event fd
    /// (core/rdma_core.c:453 alloc_begin_fd_uobject); the first becomes the context's default,
    /// where events go.
    pub(super) fn ioctl_async_event_alloc(
        &mut self,
        ctx: i32,
        b: &Bundle,
        mem: &dyn Memory,
        host: &dyn Host,
    ) -> Result<(), Errno> {
        let (fd, sink) = host.event_fd()?;
        if let Err(e) = b.set_data(mem, 0, fd as u64) {
            host.close_fd(fd);
            return Err(e);
        }
        let c = self.contexts.get_mut(&ctx).ok_or(EINVAL)?;
        c.async_fds.push(fd);
        if c.async_fd.is_none() {
            c.async_fd = Some(fd);
            c.async_sink = Some(sink);
        }
        Ok(())
    }

    /// core/uverbs_std_types_cq.c:61 `UVERBS_METHOD_CQ_CREATE`, through the write form's
    /// handler. The fds were checked with the attributes.
    pub(super) fn ioctl_create_cq(&mut self, ctx: i32, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        let comp_vector = b.number(mem, 4)?.unwrap_or(0) as u32;
        let cqe = b.number(mem, 1)?.unwrap_or(0) as u32;
        let user_handle = b.number(mem, 2)?.unwrap_or(0);
        // :89-94: flags beyond TIMESTAMP_COMPLETION | IGNORE_OVERRUN are EINVAL.
        let flags = b.flags(mem, 5, CQ_FLAGS_TIMESTAMP_COMPLETION | CQ_FLAGS_IGNORE_OVERRUN)?;
        // :107-110: `if (attr.comp_vector >= num_comp_vectors) return -EINVAL;`
        if comp_vector >= caps::NUM_COMP_VECTORS {
            return Err(EINVAL);
        }
        // hw/mlx5/cq.c:959-961 mlx5_ib_create_cq: `if (entries < 0 || entries > (1 <<
        // log_max_cq_sz)) return -EINVAL;` before its flag check (:963).
        if i32::try_from(cqe).is_err() || cqe > 1 << caps::LOG_MAX_CQ_SZ {
            return Err(EINVAL);
        }
        // hw/mlx5/cq.c:963-964 (mlx5_ib.h:1483 check_cq_create_flags) accepts both flags;
        // TIMESTAMP_COMPLETION changes nothing in 6.1's mlx5, IGNORE_OVERRUN sets the CQ
        // context's `oi` bit (cq.c:1009), which the model's device does not have: EOPNOTSUPP
        // (docs/kernel-facts.md).
        if flags & CQ_FLAGS_IGNORE_OVERRUN != 0 {
            crate::log!("CQ IGNORE_OVERRUN not modelled");
            return Err(EOPNOTSUPP);
        }
        let req = abi::CreateCq {
            response: 0,
            user_handle,
            cqe,
            comp_vector,
            comp_channel: b.fd(3).unwrap_or(-1),
            reserved: 0,
        };
        let call = b.call(mem, ctx, req.as_bytes())?;
        self.create_cq(&call, mem)?;
        let resp: abi::CreateCqResp = core_resp(&call);
        // :140-142: the CQE count; then UHW_OUT flagged (core/uverbs_ioctl.c:482-488).
        let out = b
            .set_data(mem, 0, u64::from(resp.cq_handle))
            .and_then(|()| b.output(mem, 6, &resp.cqe.to_ne_bytes()))
            .and_then(|()| b.driver_written(mem));
        if out.is_err() {
            self.cqs.remove(resp.cq_handle);
        }
        out
    }

    /// core/uverbs_std_types_qp.c:82 `UVERBS_METHOD_QP_CREATE`: the attribute rules of the
    /// ioctl form, then the write form's handler. The handles and the event fd were looked up
    /// with the attributes (the model has no XRCDs or indirection tables: naming one was
    /// ENOENT there).
    pub(super) fn ioctl_create_qp(&mut self, ctx: i32, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        // :102-111: the capabilities (copied in: EFAULT), the user handle, the type (a
        // `uverbs_get_const` into an enum: beyond 32 bits EINVAL).
        let cap_bytes = b.input(mem, 8)?.unwrap_or_default();
        let cap = |i: usize| u32::from_ne_bytes(cap_bytes[4 * i..4 * i + 4].try_into().unwrap_or_default());
        let user_handle = b.number(mem, 7)?.unwrap_or(0);
        let qp_type = u32::try_from(b.number(mem, 9)?.unwrap_or(0)).map_err(|_| EINVAL)?;
        match qp_type {
            qpt::XRC_TGT => {
                // :115-123: no CQs, PD or indirection table with an XRC target (EINVAL);
                // :125-128: its XRCD is absent (ENOENT): the model has none.
                return Err(if [5, 4, 2, 6].iter().any(|&id| b.has(id)) {
                    EINVAL
                } else {
                    ENOENT
                });
            }
            // :135-137: a raw packet QP needs CAP_NET_RAW (EPERM); the model does not ask
            // and lets it through to the write form's handler, which refuses the type.
            qpt::RC | qpt::UC | qpt::UD | qpt::RAW_PACKET | qpt::XRC_INI | qpt::DRIVER => {}
            // :190-191.
            _ => return Err(EINVAL),
        }
        // :144-149: no XRCD, and no SRQ with XRC_INI.
        if b.has(1) || (b.has(3) && qp_type == qpt::XRC_INI) {
            return Err(EINVAL);
        }
        // :151-154: `uverbs_attr_get_obj` of an absent PD is ENOENT; :175-185 the same for
        // the send CQ, and for the receive CQ unless XRC_INI.
        let pd = b.handle(2).ok_or(ENOENT)?;
        let send_cq = b.handle(4).ok_or(ENOENT)?;
        let recv_cq = match b.handle(5) {
            Some(h) => h,
            None if qp_type == qpt::XRC_INI => send_cq,
            None => return Err(ENOENT),
        };
        // :194-202: flags outside these are EINVAL.
        use qp_create as f;
        let allowed = f::BLOCK_MULTICAST_LOOPBACK
            | f::SCATTER_FCS
            | f::CVLAN_STRIPPING
            | f::PCI_WRITE_END_PADDING
            | f::SQ_SIG_ALL;
        let flags = b.flags(mem, 10, allowed)?;
        // :204-206 -> :45 check_creation_flags: beyond SQ_SIG_ALL, flags only for UD, raw
        // packet and driver QPs (:50-54); SCATTER_FCS and CVLAN_STRIPPING only for raw packet
        // ones (:56-59).
        let creation = flags & !f::SQ_SIG_ALL;
        if creation != 0 && qp_type != qpt::DRIVER {
            if qp_type != qpt::RAW_PACKET && qp_type != qpt::UD {
                return Err(EINVAL);
            }
            if creation & (f::SCATTER_FCS | f::CVLAN_STRIPPING) != 0 && qp_type != qpt::RAW_PACKET {
                return Err(EINVAL);
            }
        }
        // :208-215: a source QPN becomes IB_QP_CREATE_SOURCE_QPN, which mlx5 takes on UD QPs
        // only (hw/mlx5/qp.c:2966-2974, else EOPNOTSUPP at :2997-3000). The creation flags
        // the core let through are device capabilities (multicast loopback blocking, PCI end
        // padding, IPoIB LSO, ...) the model has none of: hw/mlx5/qp.c:2912
        // process_create_flag leaves them set and :2997-3000 answers EOPNOTSUPP. The model
        // answers here, before the driver's udata checks (qp.c:3227-3253), which 6.1 runs
        // first.
        if b.has(11) || creation != 0 {
            return Err(EOPNOTSUPP);
        }
        let srq = b.handle(3);
        let req = abi::CreateQp {
            response: 0,
            user_handle,
            pd_handle: pd,
            send_cq_handle: send_cq,
            recv_cq_handle: recv_cq,
            srq_handle: srq.unwrap_or(0),
            max_send_wr: cap(0),
            max_recv_wr: cap(1),
            max_send_sge: cap(2),
            max_recv_sge: cap(3),
            max_inline_data: cap(4),
            // :237-246.
            sq_sig_all: u8::from(flags & f::SQ_SIG_ALL != 0),
            // Only the types checked above reach here; the write handler refuses all but RC
            // and UC (EOPNOTSUPP).
            qp_type: qp_type as u8,
            is_srq: u8::from(srq.is_some()),
            reserved: 0,
        };
        // :251-256 ib_create_qp_user -> core/verbs.c:1242 the driver.
        let call = b.call(mem, ctx, req.as_bytes())?;
        self.create_qp(&call, mem)?;
        let r: abi::CreateQpResp = core_resp(&call);
        let caps = [
            r.max_send_wr,
            r.max_recv_wr,
            r.max_send_sge,
            r.max_recv_sge,
            r.max_inline_data,
        ];
        // :268-277: the capabilities (the client's buffer beyond them zeroed), the QPN.
        let out = b
            .set_data(mem, 0, u64::from(r.qp_handle))
            .and_then(|()| b.output_or_zero(mem, 13, caps.as_bytes()))
            .and_then(|()| b.output(mem, 14, &r.qpn.to_ne_bytes()))
            .and_then(|()| b.driver_written(mem));
        if out.is_err() {
            let undo = abi::DestroyObj {
                response: 0,
                handle: r.qp_handle,
                reserved: 0,
            };
            if let Ok(call) = b.call(mem, ctx, undo.as_bytes()) {
                let _ = self.destroy_qp(&call, mem);
            }
        }
        out
    }

    /// CQ_DESTROY, QP_DESTROY, SRQ_DESTROY (core/uverbs_std_types_cq.c:185,
    /// uverbs_std_types_qp.c:345, uverbs_std_types_srq.c:197): the object destroyed
    /// (core/uverbs_ioctl.c:466; a CQ in use is EBUSY, core/verbs.c:2119-2120), then the
    /// write form's response copied to attribute 1.
    pub(super) fn ioctl_destroy(&mut self, ctx: i32, object: u16, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        let handle = b.handle(0).ok_or(ENOENT)?;
        let req = abi::DestroyObj {
            response: 0,
            handle,
            reserved: 0,
        };
        let call = b.call(mem, ctx, req.as_bytes())?;
        match object {
            object::CQ => self.destroy_cq(&call, mem)?,
            object::QP => self.destroy_qp(&call, mem)?,
            _ => self.destroy_srq(&call, mem)?,
        }
        let resp = call.core_out.as_ref().map(|c| c.borrow().clone()).unwrap_or_default();
        b.output(mem, 1, &resp)
    }

    /// PD_DESTROY, MR_DESTROY, AH_DESTROY (no response; core/uverbs_ioctl.c:466; a PD in use
    /// is EBUSY, core/uverbs_std_types.c:127-128).
    pub(super) fn ioctl_destroy_plain(&mut self, ctx: i32, object: u16, b: &Bundle) -> Result<(), Errno> {
        let handle = b.handle(0).ok_or(ENOENT)?;
        let req = abi::HandleOnly { handle };
        let call = Call {
            ctx,
            req: req.as_bytes(),
            response: 0,
            udata_in: Vec::new(),
            udata_out: 0,
            udata_outlen: 0,
            core_out: Some(RefCell::new(Vec::new())),
        };
        match object {
            object::PD => self.dealloc_pd(&call),
            object::MR => self.dereg_mr(&call),
            _ => self.destroy_ah(&call),
        }
    }
}
