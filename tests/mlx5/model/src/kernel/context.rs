//! The ucontext and what hangs off it without a queue: GET_CONTEXT (`mlx5_ib_alloc_ucontext`),
//! QUERY_DEVICE and QUERY_PORT, PDs and MRs.

use super::{caps, decode, Call, Context, Errno, Host, Model};
use crate::abi::{self, PAGE_SIZE};
use crate::mem::Memory;
use crate::objects::{Mr, Pd};
use libc::{EBUSY, EFAULT, EINVAL, ENOENT, ENOMEM, EOPNOTSUPP, EPERM};
use zerocopy::IntoBytes;

impl Model {
    // ---- GET_CONTEXT -------------------------------------------------------------------

    pub(super) fn get_context(&mut self, call: &Call<'_>, mem: &dyn Memory, host: &dyn Host) -> Result<(), Errno> {
        // core/uverbs_cmd.c:241 ib_init_ucontext (from ib_uverbs_get_context): a second
        // GET_CONTEXT is EINVAL (the file already has a ucontext).
        if self.ctx(call.ctx)?.alive {
            return Err(EINVAL);
        }
        let (fd, sink) = host.event_fd()?;
        let resp = abi::GetContextResp {
            async_fd: fd as u32,
            num_comp_vectors: caps::NUM_COMP_VECTORS,
        };
        // The core response is written before the driver runs (core/uverbs_cmd.c:303, then
        // :307 ib_init_ucontext -> :251 the driver). 6.1 writes it before the second-context
        // check too (:241, above here in the model; docs/kernel-facts.md).
        let driver = call
            .respond_core(mem, resp.as_bytes())
            .and_then(|()| self.alloc_ucontext(call, mem));
        match driver {
            Ok(ctx) => {
                let c = self.contexts.entry(call.ctx).or_default();
                *c = ctx;
                c.async_sink = Some(sink);
                c.async_fd = Some(fd);
                c.async_fds.push(fd);
                Ok(())
            }
            Err(e) => {
                host.close_fd(fd);
                Err(e)
            }
        }
    }

    /// hw/mlx5/main.c:1853 `mlx5_ib_alloc_ucontext`.
    pub(super) fn alloc_ucontext(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<Context, Errno> {
        crate::trace::command("GET_CONTEXT", &call.udata_in, call.udata_outlen);
        let inlen = call.udata_in.len();
        // hw/mlx5/main.c:1872-1877 mlx5_ib_alloc_ucontext: `if (udata->inlen == sizeof(req))
        // ver = 0; else if (inlen >= min_req_v2) ver = 2; else return -EINVAL;`
        if inlen != abi::MLX5_UCONTEXT_REQ_V0 && inlen < abi::MLX5_UCONTEXT_REQ_V2_MIN {
            return Err(EINVAL);
        }
        let mut bytes = [0u8; 32];
        let n = inlen.min(32);
        bytes[..n].copy_from_slice(&call.udata_in[..n]);
        let mut req: abi::AllocUcontextReq = decode(&bytes);
        // hw/mlx5/main.c:1883 mlx5_ib_alloc_ucontext: `if (req.flags &
        // ~MLX5_IB_ALLOC_UCTX_DEVX) return -EOPNOTSUPP;`
        if req.flags & !abi::ALLOC_UCTX_DEVX != 0 {
            return Err(EOPNOTSUPP);
        }
        // hw/mlx5/main.c:1886 mlx5_ib_alloc_ucontext: `if (req.comp_mask || req.reserved0 ||
        // req.reserved1 || req.reserved2) return -EOPNOTSUPP;`
        if req.comp_mask != 0 || req.reserved0 != 0 || req.reserved1 != 0 || req.reserved2 != 0 {
            return Err(EOPNOTSUPP);
        }
        // hw/mlx5/main.c:1889-1892 mlx5_ib_alloc_ucontext: `req.total_num_bfregs =
        // ALIGN(req.total_num_bfregs, MLX5_NON_FP_BFREGS_PER_UAR); if
        // (req.num_low_latency_bfregs > req.total_num_bfregs - 1) return -EINVAL;`
        req.total_num_bfregs = req.total_num_bfregs.checked_add(1).map_or(0, |v| v & !1);
        if req.num_low_latency_bfregs > req.total_num_bfregs.wrapping_sub(1) {
            return Err(EINVAL);
        }
        // hw/mlx5/main.c:1894 -> hw/mlx5/devx.c:122 mlx5_ib_devx_create: this device has no
        // DEVX user contexts (`if (!MLX5_CAP_GEN(dev->mdev, log_max_uctx)) return -EINVAL;`;
        // Debian's 6.1 has CONFIG_INFINIBAND_USER_ACCESS=m, so not the EOPNOTSUPP stub).
        if req.flags & abi::ALLOC_UCTX_DEVX != 0 {
            return Err(EINVAL);
        }
        let lib_uar_dyn = req.lib_caps & abi::LIB_CAP_DYN_UAR != 0;
        let mut static_pages = 0;
        if !lib_uar_dyn {
            // hw/mlx5/main.c:1604 calc_total_bfregs: `if (req->total_num_bfregs == 0) return
            // -EINVAL;`, then hw/mlx5/main.c:1610 `if (req->total_num_bfregs >
            // MLX5_MAX_BFREGS) return -ENOMEM;`. (Its second low-latency check, main.c:1617,
            // cannot fire here: with one UAR per system page it aligns to 2 again.)
            if req.total_num_bfregs == 0 {
                return Err(EINVAL);
            }
            if req.total_num_bfregs > caps::MAX_BFREGS {
                return Err(ENOMEM);
            }
            static_pages = u64::from(req.total_num_bfregs / 2);
        }
        let cqe_version = if inlen >= 17 { req.max_cqe_version.min(1) } else { 0 };
        // hw/mlx5/main.c:1771 set_ucontext_resp fills every field; :1953 copies
        // `min(outlen, sizeof(resp))` bytes and reports that as `response_length`.
        let len = call.udata_outlen.min(std::mem::size_of::<abi::AllocUcontextResp>());
        let resp = abi::AllocUcontextResp {
            qp_tab_size: 1 << 18,
            bf_reg_size: crate::bf_reg_size(),
            tot_bfregs: if lib_uar_dyn { 0 } else { req.total_num_bfregs },
            cache_line_size: 64,
            max_sq_desc_sz: 512,
            max_rq_desc_sz: 512,
            max_send_wqebb: 1 << caps::LOG_MAX_QP_SZ,
            max_recv_wr: 1 << caps::LOG_MAX_QP_SZ,
            max_srq_recv_wr: 1 << caps::LOG_MAX_QP_SZ,
            num_ports: 1,
            // main.c:1826 (4 KiB pages: the core clock page is mapped) and main.c:1848 (always).
            comp_mask: abi::ucontext_resp_mask::CORE_CLOCK_OFFSET | abi::ucontext_resp_mask::MKEY_UPDATE_TAG,
            response_length: len as u32,
            cqe_version,
            // main.c:1809: QUERY_DEVICE and CREATE_AH take driver data.
            cmds_supp_uhw: 3,
            // main.c:1811-1814: on Ethernet, the minimum inline mode plus one (a ConnectX-5
            // needs no inline headers: MLX5_INLINE_MODE_NONE, so 1).
            eth_min_inline: u8::from(self.port.is_eth()),
            // main.c:1816: a clock info page only where the device has a clock frequency.
            clock_info_versions: if caps::HAS_CLOCK_INFO {
                1 << abi::CLOCK_INFO_V1
            } else {
                0
            },
            // main.c:1828: `internal_timer_h` (init segment offset 0x1000) within its page.
            hca_core_clock_offset: abi::INTERNAL_TIMER_OFFSET % PAGE_SIZE,
            log_uar_size: 12,
            num_uars_per_page: 1,
            ..Default::default()
        };
        let out = if len == 0 { &[][..] } else { &resp.as_bytes()[..len] };
        Self::respond(mem, call.udata_out, out)?;
        Ok(Context {
            alive: true,
            cqe_version,
            lib_uar_dyn,
            static_uar_pages: static_pages,
            bfreg_count: vec![0; if lib_uar_dyn { 0 } else { req.total_num_bfregs as usize }],
            num_low_latency_bfregs: req.num_low_latency_bfregs,
            ucontext_v2: inlen != abi::MLX5_UCONTEXT_REQ_V0,
            async_sink: None,
            async_fd: None,
            async_fds: Vec::new(),
            uar_maps: Vec::new(),
            static_uars: Vec::new(),
        })
    }

    // ---- queries ---------------------------------------------------------------------------

    pub(super) fn query_device(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("QUERY_DEVICE", &call.udata_in, call.udata_outlen);
        let resp = abi::QueryDeviceResp {
            fw_ver: caps::FW_VER,
            node_guid: self.node_guid.to_be(),
            sys_image_guid: self.node_guid.to_be(),
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            vendor_id: caps::VENDOR_ID,
            vendor_part_id: caps::VENDOR_PART_ID,
            max_qp: 1 << 18,
            max_qp_wr: 1 << caps::LOG_MAX_QP_SZ,
            device_cap_flags: 0x1 | 0x2 | 0x4 | 0x20 | 0x40 | 0x400 | 0x20_0000,
            max_sge: caps::MAX_SGE,
            max_sge_rd: caps::MAX_SGE,
            max_cq: 1 << 24,
            max_cqe: (1 << caps::LOG_MAX_CQ_SZ) - 1,
            max_mr: 1 << 24,
            max_pd: 1 << 24,
            max_qp_rd_atom: u32::from(caps::MAX_RD_ATOMIC),
            max_res_rd_atom: u32::from(caps::MAX_RD_ATOMIC) << 18,
            max_qp_init_rd_atom: u32::from(caps::MAX_RD_ATOMIC),
            atomic_cap: 1,
            max_mw: 1 << 24,
            max_ah: u32::MAX,
            max_srq: 1 << 23,
            max_srq_wr: (1 << caps::LOG_MAX_QP_SZ) - 1,
            max_srq_sge: 31,
            max_pkeys: caps::PKEY_TABLE_LEN,
            local_ca_ack_delay: 16,
            phys_port_cnt: 1,
            ..Default::default()
        };
        call.respond_core(mem, resp.as_bytes())
    }

    pub(super) fn query_port(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("QUERY_PORT", &call.udata_in, call.udata_outlen);
        let req: abi::QueryPort = decode(call.req);
        // core/uverbs_cmd.c:392 ib_uverbs_query_port -> core/device.c:2108-2109
        // ib_query_port: `if (!rdma_is_port_valid(device, port_num)) return -EINVAL;`
        if req.port_num != 1 {
            return Err(EINVAL);
        }
        let resp = if self.port.is_eth() {
            // hw/mlx5/main.c:470 mlx5_query_port_roce: CM supported and IP-based GIDs
            // (core/uverbs_cmd.c copy_port_attr_to_resp turns `ip_gids` into
            // IB_UVERBS_PCF_IP_BASED_GIDS, bit 26), the RoCE GID table, one P_Key, no LIDs,
            // SM or VLs; the active MTU from the netdev's (9000: `iboe_get_mtu` gives 4096),
            // the maximum 4096; speed and width from the Ethernet protocol (100GBASE: EDR, 4X).
            abi::QueryPortResp {
                port_cap_flags: (1 << 16) | (1 << 26),
                max_msg_sz: 1 << 30,
                gid_tbl_len: self.port.gid_tbl_len(),
                pkey_tbl_len: 1,
                state: 4,
                max_mtu: 5,
                active_mtu: 5,
                active_width: 2,
                active_speed: 32,
                phys_state: 5,
                link_layer: self.port.link.abi(),
                ..Default::default()
            }
        } else {
            abi::QueryPortResp {
                port_cap_flags: 0x0251_0868,
                max_msg_sz: 1 << 30,
                gid_tbl_len: self.port.gid_tbl_len(),
                pkey_tbl_len: caps::PKEY_TABLE_LEN,
                lid: self.lid,
                sm_lid: 1,
                state: 4,
                max_mtu: 5,
                active_mtu: 5,
                max_vl_num: 4,
                subnet_timeout: 18,
                active_width: 2,
                active_speed: 32,
                phys_state: 5,
                link_layer: self.port.link.abi(),
                ..Default::default()
            }
        };
        call.respond_core(mem, resp.as_bytes())
    }

    // ---- PD and MR ---------------------------------------------------------------------

    pub(super) fn alloc_pd(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("ALLOC_PD", &call.udata_in, call.udata_outlen);
        let handle = self.pds.insert(Pd {
            ctx: call.ctx,
            users: 0,
        });
        // hw/mlx5/main.c:2379 mlx5_ib_alloc_pd: `ib_copy_to_udata(udata, &resp, sizeof(resp))`
        // copies the 4-byte PD number without clamping to outlen: no driver response buffer
        // (NULL) is EFAULT. Driver first (core/uverbs_cmd.c:450), then the core response
        // (:459).
        let result = Self::respond(mem, call.udata_out, &(handle + 1).to_ne_bytes())
            .and_then(|()| call.respond_core(mem, &handle.to_ne_bytes()));
        if result.is_err() {
            self.pds.remove(handle);
        }
        result
    }

    pub(super) fn dealloc_pd(&mut self, call: &Call<'_>) -> Result<(), Errno> {
        crate::trace::command("DEALLOC_PD", &call.udata_in, call.udata_outlen);
        let handle = decode::<abi::HandleOnly>(call.req).handle;
        // core/rdma_core.c:327 lookup_get_idr_uobject: an unknown handle is ENOENT.
        let pd = self.pds.get(handle).filter(|p| p.ctx == call.ctx).ok_or(ENOENT)?;
        // core/uverbs_std_types.c:127 uverbs_free_pd: in use is EBUSY.
        if pd.users > 0 {
            return Err(EBUSY);
        }
        self.pds.remove(handle);
        Ok(())
    }

    pub(super) fn reg_mr(&mut self, call: &Call<'_>, mem: &dyn Memory, host: &dyn Host) -> Result<(), Errno> {
        crate::trace::command("REG_MR", &call.udata_in, call.udata_outlen);
        let req: abi::RegMr = decode(call.req);
        // core/uverbs_cmd.c:710 ib_uverbs_reg_mr: start and hca_va must share their page
        // offset.
        if (req.start ^ req.hca_va) & (PAGE_SIZE - 1) != 0 {
            return Err(EINVAL);
        }
        // include/rdma/ib_verbs.h:4296, :4300, :4303 ib_check_mr_access (core/uverbs_cmd.c:717):
        // remote write or atomic needs local write, unknown bits, and on-demand paging on a
        // device without IBK_ON_DEMAND_PAGING (this one) are all EINVAL.
        const SUPPORTED: u32 = 0xff | 0x1ff0_0000;
        let a = req.access_flags;
        if a & !SUPPORTED != 0 {
            return Err(EINVAL);
        }
        if a & (abi::access::REMOTE_ATOMIC | abi::access::REMOTE_WRITE) != 0 && a & abi::access::LOCAL_WRITE == 0 {
            return Err(EINVAL);
        }
        if a & 0x40 != 0 {
            return Err(EINVAL);
        }
        // core/uverbs_cmd.c:721-723 uobj_get_obj_read(pd): an unknown PD is the lookup's
        // ENOENT (core/rdma_core.c:327; EINVAL before Debian's 6.1.147).
        if !self.pds.get(req.pd_handle).is_some_and(|p| p.ctx == call.ctx) {
            return Err(ENOENT);
        }
        // core/umem.c:182-184 ib_umem_get: a range that wraps is EINVAL; memory that cannot
        // be pinned (not mapped) is pin_user_pages_fast's EFAULT (:235-241).
        if req
            .start
            .checked_add(req.length)
            .and_then(|end| end.checked_add(PAGE_SIZE - 1))
            .is_none()
        {
            return Err(EINVAL);
        }
        // umem.c ib_umem_get: with no RLIMIT_MEMLOCK and no CAP_IPC_LOCK `can_do_mlock` is
        // EPERM; pages pinned past the limit (`mm->pinned_vm`) are ENOMEM; then pinning
        // memory that is not mapped is EFAULT.
        let npages = pages_spanned(req.start, req.length);
        if let Some(limit) = host.memlock_pages() {
            if limit == 0 {
                return Err(EPERM);
            }
            if self.pinned_pages + npages > limit {
                return Err(ENOMEM);
            }
        }
        if !mem.probe(req.start, req.length) {
            return Err(EFAULT);
        }
        self.pinned_pages += npages;
        self.next_key = self.next_key.wrapping_add(1);
        let mr = Mr {
            ctx: call.ctx,
            pd: req.pd_handle,
            addr: req.start,
            length: req.length,
            iova: req.hca_va,
            access: a,
            key: 0,
            dmabuf: None,
        };
        let handle = self.mrs.insert(mr);
        // mkey = index << 8 | variant; index 1 would make 0x1xx, and 0x100 is the invalid lkey.
        let key = ((handle + 2) << 8) | (self.next_key & 0xff);
        if let Some(m) = self.mrs.get_mut(handle) {
            m.key = key;
        }
        if let Some(pd) = self.pds.get_mut(req.pd_handle) {
            pd.users += 1;
        }
        let resp = abi::RegMrResp {
            mr_handle: handle,
            lkey: key,
            rkey: key,
        };
        let result = call.respond_core(mem, resp.as_bytes());
        if result.is_err() {
            self.drop_mr(handle);
        }
        result
    }

    pub(super) fn drop_mr(&mut self, handle: u32) {
        if let Some(mr) = self.mrs.remove(handle) {
            if mr.dmabuf.is_none() {
                self.pinned_pages -= pages_spanned(mr.addr, mr.length);
            }
            if let Some(pd) = self.pds.get_mut(mr.pd) {
                pd.users -= 1;
            }
        }
    }

    pub(super) fn dereg_mr(&mut self, call: &Call<'_>) -> Result<(), Errno> {
        crate::trace::command("DEREG_MR", &call.udata_in, call.udata_outlen);
        let handle = decode::<abi::HandleOnly>(call.req).handle;
        // core/uverbs_cmd.c:906 uobj_perform_destroy: an unknown MR is the lookup's ENOENT
        // (core/rdma_core.c:325-327).
        self.mrs.get(handle).filter(|m| m.ctx == call.ctx).ok_or(ENOENT)?;
        self.drop_mr(handle);
        Ok(())
    }
}

/// Pages `[addr, addr + len)` touches (`ib_umem_num_pages`).
fn pages_spanned(addr: u64, len: u64) -> u64 {
    let first = addr & !(PAGE_SIZE - 1);
    let end = addr.saturating_add(len).saturating_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
    (end - first) / PAGE_SIZE
}
