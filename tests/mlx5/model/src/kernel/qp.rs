//! Queue pairs: CREATE/MODIFY/QUERY/DESTROY_QP as the uverbs core and 6.1's mlx5 driver
//! (`hw/mlx5/qp.c`) check them, the bfregs a QP's doorbells go through, and the state
//! transitions `ib_modify_qp_is_ok` allows.

use super::{caps, decode, Call, Context, Errno, Model};
use crate::abi::{self, qp_attr, qps, PAGE_SIZE};
use crate::mem::Memory;
use crate::objects::{Qp, QpAttrs};
use libc::{EFAULT, EINVAL, ENOENT, EOPNOTSUPP};
use zerocopy::IntoBytes;

impl Model {
    pub(super) fn create_qp(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("CREATE_QP", &call.udata_in, call.udata_outlen);
        let req: abi::CreateQp = decode(call.req);
        let owned_cq = |h: u32| self.cqs.get(h).is_some_and(|c| c.ctx == call.ctx);
        // core/uverbs_cmd.c:1367-1405 create_qp: an SRQ, CQ or PD handle that names nothing
        // is the lookup's ENOENT (core/rdma_core.c:327).
        let srq = (req.is_srq != 0).then_some(req.srq_handle);
        if srq.is_some_and(|h| !self.srqs.get(h).is_some_and(|s| s.ctx == call.ctx)) {
            return Err(ENOENT);
        }
        if !owned_cq(req.send_cq_handle) || !owned_cq(req.recv_cq_handle) {
            return Err(ENOENT);
        }
        if !self.pds.get(req.pd_handle).is_some_and(|p| p.ctx == call.ctx) {
            return Err(ENOENT);
        }
        // hw/mlx5/qp.c:3213 -> :2728 check_qp_type takes RC, UC and UD (:2745-2747), and
        // raw packet, XRC and driver QPs too; the model runs RC, UC and UD only (EOPNOTSUPP,
        // the errno :2759 gives others). A user UD QP goes through the same create_user_qp
        // (:3280-3284) and so the same driver-data rules as RC; its create flags
        // (:2966-2973, IPoIB LSO and source QPN) come only with the extended command.
        if !matches!(req.qp_type, abi::qpt::RC | abi::qpt::UC | abi::qpt::UD) {
            return Err(EOPNOTSUPP);
        }
        let ctx = self.ctx(call.ctx)?;
        let inlen = call.udata_in.len();
        // hw/mlx5/qp.c:3024, :3045 process_udata_size: driver data shorter than
        // `ece_options` is EINVAL.
        if inlen < abi::MLX5_CREATE_QP_ECE_OFFSET {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:3194 check_ucmd_data: everything from `reserved` on must be zero.
        if call.udata_in[abi::MLX5_CREATE_QP_RESERVED_OFFSET.min(inlen)..]
            .iter()
            .any(|&b| b != 0)
        {
            return Err(EINVAL);
        }
        let mut bytes = [0u8; 56];
        bytes[..inlen.min(56)].copy_from_slice(&call.udata_in[..inlen.min(56)]);
        let ucmd: abi::Mlx5CreateQp = decode(&bytes);
        // hw/mlx5/qp.c:3247 -> :2834 process_vendor_flags: flags the device does not take
        // are EINVAL (:2906-2909).
        let known = abi::QP_FLAG_SIGNATURE
            | abi::QP_FLAG_SCATTER_CQE
            | abi::QP_FLAG_ALLOW_SCATTER_CQE
            | abi::QP_FLAG_BFREG_INDEX
            | abi::QP_FLAG_UAR_PAGE_INDEX;
        if ucmd.flags & !known != 0 {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:3251 -> mlx5_ib.h:1508 get_qp_user_index, :1493 verify_assign_uidx:
        // with CQE version 1 the user index must be given and fit 24 bits (:1497-1499); with
        // version 0 it must be MLX5_IB_DEFAULT_UIDX (:1515-1520).
        if ctx.cqe_version == 0 {
            if ucmd.uidx != abi::DEFAULT_UIDX {
                return Err(EINVAL);
            }
        } else if ucmd.uidx == abi::DEFAULT_UIDX || ucmd.uidx & !0xff_ffff != 0 {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:394 set_rq_size: `if (cap->max_recv_wr > (1 << log_max_qp_sz)) return
        // -EINVAL;`
        if req.max_recv_wr > 1 << caps::LOG_MAX_QP_SZ {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:639 qp_has_rq: a QP on an SRQ has no receive queue of its own.
        let has_rq = req.max_recv_wr != 0 && srq.is_none();
        let (rq_cnt, rq_shift) = if has_rq {
            // hw/mlx5/qp.c:409-412 set_rq_size: `if (check_shl_overflow(1,
            // qp->rq.wqe_shift, &wqe_size)) return -EINVAL;` (an int: shifts of 31 and more)
            // and `wqe_size / sizeof(data_seg) < wq_sig` is EINVAL.
            if ucmd.rq_wqe_shift >= 31 {
                return Err(EINVAL);
            }
            let sig = u32::from(ucmd.flags & abi::QP_FLAG_SIGNATURE != 0);
            if (1u64 << ucmd.rq_wqe_shift) / 16 < u64::from(sig) {
                return Err(EINVAL);
            }
            (ucmd.rq_wqe_count, ucmd.rq_wqe_shift)
        } else {
            (0, 0)
        };
        // hw/mlx5/qp.c:2242 create_user_qp: `if (ucmd->rq_wqe_shift != qp->rq.wqe_shift ||
        // ucmd->rq_wqe_count != qp->rq.wqe_cnt) return -EINVAL;` (a QP without receive queue
        // must describe none).
        if ucmd.rq_wqe_shift != rq_shift || ucmd.rq_wqe_count != rq_cnt {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:2246 create_user_qp: `if (ucmd->sq_wqe_count > (1 << log_max_qp_sz))
        // return -EINVAL;`
        if ucmd.sq_wqe_count > 1 << caps::LOG_MAX_QP_SZ {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:942 _create_user_qp -> qp.c:731 alloc_bfreg: with dynamic UARs the QP
        // must name its UAR page (`if (bfregi->lib_uar_dyn) return -EINVAL;`).
        let uar_named = ucmd.flags & (abi::QP_FLAG_UAR_PAGE_INDEX | abi::QP_FLAG_BFREG_INDEX) != 0;
        if !uar_named && ctx.lib_uar_dyn {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:602 set_user_buf_size: `if (ucmd->sq_wqe_count &&
        // !is_power_of_2(ucmd->sq_wqe_count)) return -EINVAL;`
        if ucmd.sq_wqe_count != 0 && !ucmd.sq_wqe_count.is_power_of_two() {
            return Err(EINVAL);
        }
        let rq_bytes = u64::from(rq_cnt).checked_shl(rq_shift).ok_or(EINVAL)?;
        let buf_size = rq_bytes + (u64::from(ucmd.sq_wqe_count) << 6);
        // hw/mlx5/qp.c:967-972 _create_user_qp: ib_umem_get(buf_addr, buf_size) when both
        // are set (EFAULT, core/umem.c:235-241); then :1013 mlx5_ib_db_map_user pins the
        // doorbell page.
        if ucmd.buf_addr != 0 && buf_size != 0 && !mem.probe(ucmd.buf_addr, buf_size) {
            return Err(EFAULT);
        }
        if !mem.probe(ucmd.db_addr & !(PAGE_SIZE - 1), PAGE_SIZE) {
            return Err(EFAULT);
        }
        let bfregn = if uar_named {
            None
        } else {
            let c = self.contexts.get_mut(&call.ctx).ok_or(EINVAL)?;
            Some(alloc_bfreg(c))
        };
        // hw/mlx5/qp.c:896 adjust_bfregn: the index in the layout with the fast-path bfregs
        // (4 per UAR, 2 of them not fast path).
        let bfreg_index = bfregn.map_or(abi::INVALID_BFREG, |n| n / 2 * 4 + n % 2);
        let qpn = self.next_qpn & 0xff_ffff;
        let handle = self.qps.insert(Qp {
            ctx: call.ctx,
            bfregn,
            bf: Default::default(),
            qpn,
            qp_type: req.qp_type,
            pd: req.pd_handle,
            send_cq: req.send_cq_handle,
            recv_cq: req.recv_cq_handle,
            srq,
            user_handle: req.user_handle,
            uidx: ucmd.uidx,
            buf: ucmd.buf_addr,
            // The context holds log_rq_size: a count that is not a power of two is rounded
            // down by the hardware.
            rq_cnt: if rq_cnt == 0 {
                0
            } else {
                1 << (31 - rq_cnt.leading_zeros())
            },
            rq_shift,
            sq_cnt: ucmd.sq_wqe_count,
            db: ucmd.db_addr,
            state: qps::RESET,
            attrs: QpAttrs::default(),
            sq_sig_all: req.sq_sig_all != 0,
            max_send_wr: req.max_send_wr,
            max_recv_wr: if has_rq { req.max_recv_wr } else { 0 },
            max_send_sge: req.max_send_sge,
            max_recv_sge: if has_rq { req.max_recv_sge } else { 0 },
            max_inline: req.max_inline_data,
            sq_ci: 0,
            rq_ci: 0,
            stall: None,
            epoch: 0,
            async_events: 0,
        });
        let dresp = abi::Mlx5CreateQpResp {
            bfreg_index,
            ..Default::default()
        };
        let outlen = call.udata_outlen.min(40);
        let resp = abi::CreateQpResp {
            qp_handle: handle,
            qpn,
            max_send_wr: req.max_send_wr,
            max_recv_wr: if has_rq { req.max_recv_wr } else { 0 },
            max_send_sge: req.max_send_sge,
            max_recv_sge: if has_rq { req.max_recv_sge } else { 0 },
            max_inline_data: req.max_inline_data,
            reserved: 0,
        };
        // hw/mlx5/qp.c:3013 process_udata_size: the response is min(outlen, sizeof(resp));
        // then the core response.
        let result = Self::respond(mem, call.udata_out, &dresp.as_bytes()[..outlen])
            .and_then(|()| call.respond_core(mem, resp.as_bytes()));
        if let Err(e) = result {
            self.qps.remove(handle);
            self.free_bfreg(call.ctx, bfregn);
            return Err(e);
        }
        self.next_qpn += 1;
        for cq in [req.send_cq_handle, req.recv_cq_handle] {
            if let Some(c) = self.cqs.get_mut(cq) {
                c.users += 1;
            }
        }
        if let Some(pd) = self.pds.get_mut(req.pd_handle) {
            pd.users += 1;
        }
        if let Some(s) = srq.and_then(|h| self.srqs.get_mut(h)) {
            s.users += 1;
        }
        Ok(())
    }

    pub(super) fn modify_qp(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("MODIFY_QP", &call.udata_in, call.udata_outlen);
        let req: abi::ModifyQp = decode(call.req);
        let mask = req.attr_mask;
        // core/uverbs_cmd.c:1940 ib_uverbs_modify_qp: bits beyond the standard attributes
        // (IB_QP_ATTR_STANDARD_BITS, 0..=20; RATE_LIMIT too) are EOPNOTSUPP, before the lookup.
        const STANDARD: u32 = (1 << 21) - 1;
        if mask & !STANDARD != 0 {
            return Err(EOPNOTSUPP);
        }
        // core/uverbs_cmd.c:1776: an unknown QP is the lookup's ENOENT.
        let qp = self
            .qps
            .get(req.qp_handle)
            .filter(|q| q.ctx == call.ctx)
            .ok_or(ENOENT)?;
        // core/uverbs_cmd.c:1783, :1790, :1851-1854 modify_qp: invalid port numbers and states
        // beyond ERR are EINVAL.
        if mask & qp_attr::PORT != 0 && req.port_num != 1 {
            return Err(EINVAL);
        }
        if mask & qp_attr::AV != 0 && req.dest.port_num != 1 {
            return Err(EINVAL);
        }
        if (mask & qp_attr::CUR_STATE != 0 && req.cur_qp_state > qps::ERR)
            || (mask & qp_attr::STATE != 0 && req.qp_state > qps::ERR)
        {
            return Err(EINVAL);
        }
        // core/verbs.c:1769 _ib_modify_qp -> :441 rdma_fill_sgid_attr: a RoCE address
        // without a GRH is EINVAL (:420 rdma_check_ah_attr); with one, its source GID index
        // must name a valid GID (core/cache.c:1221 rdma_get_gid_attr: beyond the table
        // EINVAL, an empty entry ENODATA; hw/mlx5/qp.c:3498 mlx5_set_path checks the
        // length again).
        let mut dest = req.dest;
        let mut roce = None;
        if mask & qp_attr::AV != 0 {
            if self.port.is_eth() && dest.is_global == 0 {
                return Err(EINVAL);
            }
            if dest.is_global != 0 {
                let sgid = self.port.gid(dest.sgid_index)?;
                // :1778 a RoCE path of a connected QP from user space: the destination MAC
                // is resolved from the DGID (:1727 ib_resolve_eth_dmac), and the hop limit
                // becomes the route's where the IP stack resolved it.
                if self.port.is_eth() && matches!(qp.qp_type, abi::qpt::RC | abi::qpt::UC) {
                    let (dmac, hop_limit) = self.port.resolve_dmac(dest.sgid_index, &dest.dgid)?;
                    if let Some(h) = hop_limit {
                        dest.hop_limit = h;
                    }
                    // hw/mlx5/qp.c:3512-3520: a RoCE v2 path of a connected QP gets its UDP
                    // source port when the modify names the destination QP.
                    let sport = (sgid.ty == crate::port::GidType::RoceV2 && mask & qp_attr::DEST_QPN != 0)
                        .then(|| crate::port::Port::udp_sport(dest.flow_label, qp.qpn, req.dest_qp_num));
                    roce = Some((dmac, sport));
                }
            }
        }
        // core/verbs.c:1797-1817: an alternate path is for InfiniBand only ("Ban them in
        // roce mode"): EINVAL on an Ethernet port.
        if mask & qp_attr::ALT_PATH != 0 && self.port.is_eth() {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:4640, :4643, :4652 mlx5_ib_modify_qp, driver data: `if (udata->inlen <
        // offsetofend(ucmd, ece_options)) return -EINVAL;` beyond the struct must be zero
        // (EOPNOTSUPP); comp_mask and burst reserved too.
        let inlen = call.udata_in.len();
        if inlen > 0 {
            if inlen < 16 {
                return Err(EINVAL);
            }
            if call.udata_in[16..].iter().any(|&b| b != 0) {
                return Err(EOPNOTSUPP);
            }
            let comp_mask = u32::from_ne_bytes(call.udata_in[0..4].try_into().unwrap_or_default());
            let burst_reserved = u16::from_ne_bytes(call.udata_in[10..12].try_into().unwrap_or_default());
            if comp_mask != 0 || burst_reserved != 0 {
                return Err(EOPNOTSUPP);
            }
        }
        let cur = if mask & qp_attr::CUR_STATE != 0 {
            req.cur_qp_state
        } else {
            qp.state
        };
        let new = if mask & qp_attr::STATE != 0 { req.qp_state } else { cur };
        // core/verbs.c:1692 ib_modify_qp_is_ok (hw/mlx5/qp.c:4680): the transition and the
        // attributes it requires and allows.
        if !modify_is_ok(cur, new, qp.qp_type, mask) {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:4289 __mlx5_ib_modify_qp: a transition with no firmware command in
        // `optab` is EINVAL. Of those ib_modify_qp_is_ok allows, that is RTS -> SQD: mlx5 has
        // no RTS2SQD (only SQD -> RTS, for a QP already in SQD).
        if (cur, new) == (qps::RTS, qps::SQD) {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:4701 mlx5_ib_modify_qp, qp.c:4603, :4610 validate_rd_atomic: pkey index
        // beyond the table, and RDMA read depths beyond the device's, are EINVAL.
        if mask & qp_attr::PKEY_INDEX != 0 && req.pkey_index >= caps::PKEY_TABLE_LEN {
            return Err(EINVAL);
        }
        if (mask & qp_attr::MAX_QP_RD_ATOMIC != 0 && req.max_rd_atomic > caps::MAX_RD_ATOMIC)
            || (mask & qp_attr::MAX_DEST_RD_ATOMIC != 0 && req.max_dest_rd_atomic > caps::MAX_RD_ATOMIC)
        {
            return Err(EINVAL);
        }
        let _ = mem;
        let qp = self.qps.get_mut(req.qp_handle).ok_or(EINVAL)?;
        let a = &mut qp.attrs;
        if let Some((dmac, sport)) = roce {
            a.dmac = dmac;
            if let Some(p) = sport {
                a.udp_sport = p;
            }
        }
        if mask & qp_attr::ACCESS_FLAGS != 0 {
            a.access = req.qp_access_flags;
        }
        if mask & qp_attr::PKEY_INDEX != 0 {
            a.pkey_index = req.pkey_index;
        }
        if mask & qp_attr::PORT != 0 {
            a.port_num = req.port_num;
        }
        if mask & qp_attr::QKEY != 0 {
            a.qkey = req.qkey;
        }
        if mask & qp_attr::AV != 0 {
            a.dest = dest;
        }
        if mask & qp_attr::PATH_MTU != 0 {
            a.path_mtu = req.path_mtu;
        }
        if mask & qp_attr::TIMEOUT != 0 {
            a.timeout = req.timeout;
        }
        if mask & qp_attr::RETRY_CNT != 0 {
            a.retry_cnt = req.retry_cnt;
        }
        if mask & qp_attr::RNR_RETRY != 0 {
            a.rnr_retry = req.rnr_retry;
        }
        // core/verbs.c:1826-1838: PSNs are masked to 24 bits.
        if mask & qp_attr::RQ_PSN != 0 {
            a.rq_psn = req.rq_psn & 0xff_ffff;
            a.epsn = a.rq_psn;
        }
        if mask & qp_attr::SQ_PSN != 0 {
            a.sq_psn = req.sq_psn & 0xff_ffff;
            a.next_psn = a.sq_psn;
        }
        if mask & qp_attr::MAX_QP_RD_ATOMIC != 0 {
            a.max_rd_atomic = req.max_rd_atomic;
        }
        if mask & qp_attr::MAX_DEST_RD_ATOMIC != 0 {
            a.max_dest_rd_atomic = req.max_dest_rd_atomic;
        }
        if mask & qp_attr::MIN_RNR_TIMER != 0 {
            a.min_rnr_timer = req.min_rnr_timer;
        }
        if mask & qp_attr::DEST_QPN != 0 {
            a.dest_qp_num = req.dest_qp_num;
        }
        // hw/mlx5/qp.c:4136-4149 __mlx5_ib_modify_qp: the context's pm_state takes the three
        // known migration states (others leave it as it was); qp.c:4921 reports it back.
        if mask & qp_attr::PATH_MIG_STATE != 0 && req.path_mig_state <= 2 {
            a.path_mig_state = req.path_mig_state;
        }
        if new == qps::RESET || new == qps::ERR {
            qp.epoch = qp.epoch.wrapping_add(1);
        }
        if new == qps::RESET {
            // The hardware forgets its ring positions; user space resets its own.
            qp.sq_ci = 0;
            qp.rq_ci = 0;
            qp.stall = None;
        }
        qp.state = new;
        crate::log!("qp {:#x} state {} -> {}", qp.qpn, cur, new);
        Ok(())
    }

    pub(super) fn query_qp(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("QUERY_QP", &call.udata_in, call.udata_outlen);
        let req: abi::QueryQp = decode(call.req);
        // core/uverbs_cmd.c:1671: an unknown QP is the lookup's ENOENT.
        let qp = self
            .qps
            .get(req.qp_handle)
            .filter(|q| q.ctx == call.ctx)
            .ok_or(ENOENT)?;
        let a = &qp.attrs;
        // hw/mlx5/qp.c:5026 mlx5_ib_query_qp: user QPs report no send capabilities (user
        // space adds its own); the receive queue as sized.
        let resp = abi::QueryQpResp {
            dest: a.dest,
            max_recv_wr: qp.rq_cnt,
            max_recv_sge: if qp.rq_cnt == 0 {
                0
            } else {
                (1 << qp.rq_shift.min(31)) / 16
            },
            max_inline_data: qp.max_inline,
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.access,
            pkey_index: a.pkey_index,
            qp_state: qp.state,
            cur_qp_state: qp.state,
            path_mtu: a.path_mtu,
            path_mig_state: a.path_mig_state,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            sq_sig_all: u8::from(qp.sq_sig_all),
            ..Default::default()
        };
        call.respond_core(mem, resp.as_bytes())
    }

    pub(super) fn destroy_qp(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("DESTROY_QP", &call.udata_in, call.udata_outlen);
        let req: abi::DestroyObj = decode(call.req);
        // core/uverbs_cmd.c:1984 uobj_get_destroy: an unknown QP is the lookup's ENOENT
        // (core/rdma_core.c:325-327).
        let qp = self.qps.get(req.handle).filter(|q| q.ctx == call.ctx).ok_or(ENOENT)?;
        let events = qp.async_events;
        if let Some(qp) = self.qps.remove(req.handle) {
            self.free_bfreg(qp.ctx, qp.bfregn);
            for cq in [qp.send_cq, qp.recv_cq] {
                if let Some(c) = self.cqs.get_mut(cq) {
                    c.users -= 1;
                }
            }
            if let Some(pd) = self.pds.get_mut(qp.pd) {
                pd.users -= 1;
            }
            if let Some(s) = qp.srq.and_then(|h| self.srqs.get_mut(h)) {
                s.users -= 1;
            }
        }
        call.respond_core(mem, &events.to_ne_bytes())
    }

    /// hw/mlx5/qp.c:751 `mlx5_ib_free_bfreg`.
    fn free_bfreg(&mut self, ctx: i32, bfregn: Option<u32>) {
        let count = bfregn.and_then(|n| self.contexts.get_mut(&ctx)?.bfreg_count.get_mut(n as usize));
        if let Some(count) = count {
            *count = count.saturating_sub(1);
        }
    }
}

/// hw/mlx5/qp.c:726 `alloc_bfreg` (with qp.c:691 `alloc_high_class_bfreg`, qp.c:706
/// `alloc_med_class_bfreg`; legacy UARs): a free low-latency ("high class") bfreg, else the
/// least used medium one, else bfreg 0 (shared, no BlueFlame); v0 contexts always get 0.
/// Bfreg numbers count only the non-fast-path bfregs: 0 is the first UAR's, the last
/// `num_low_latency_bfregs` are low latency, the ones between medium.
fn alloc_bfreg(c: &mut Context) -> u32 {
    let total = c.bfreg_count.len() as u32;
    let med = total.saturating_sub(c.num_low_latency_bfregs + 1);
    let first_hi = med + 1;
    let mut pick = None;
    if c.ucontext_v2 {
        pick = (first_hi..total).find(|&i| c.bfreg_count[i as usize] == 0);
        if pick.is_none() && med > 0 {
            let mut min = 1;
            for i in 1..first_hi {
                if c.bfreg_count[i as usize] < c.bfreg_count[min as usize] {
                    min = i;
                }
                if c.bfreg_count[min as usize] == 0 {
                    break;
                }
            }
            pick = Some(min);
        }
    }
    let n = pick.unwrap_or(0);
    if let Some(count) = c.bfreg_count.get_mut(n as usize) {
        *count += 1;
    }
    n
}

/// core/verbs.c:1692 `ib_modify_qp_is_ok` for RC, UC and UD: whether `cur -> next` is a
/// transition and `mask` holds every attribute it requires and no attribute it does not allow.
pub fn modify_is_ok(cur: u8, next: u8, qp_type: u8, mask: u32) -> bool {
    use qp_attr as m;
    let rc = qp_type == abi::qpt::RC;
    if mask & m::CUR_STATE != 0 && !matches!(cur, qps::RTR | qps::RTS | qps::SQD | qps::SQE) {
        return false;
    }
    if qp_type == abi::qpt::UD {
        return ud_modify_is_ok(cur, next, mask);
    }
    let (req, opt) = match (cur, next) {
        (_, qps::RESET) | (_, qps::ERR) => (0, 0),
        (qps::RESET, qps::INIT) => (m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS, 0),
        (qps::INIT, qps::INIT) => (0, m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS),
        (qps::INIT, qps::RTR) => {
            let req = m::AV | m::PATH_MTU | m::DEST_QPN | m::RQ_PSN;
            let opt = m::ALT_PATH | m::ACCESS_FLAGS | m::PKEY_INDEX;
            if rc {
                (req | m::MAX_DEST_RD_ATOMIC | m::MIN_RNR_TIMER, opt)
            } else {
                (req, opt)
            }
        }
        (qps::RTR, qps::RTS) => {
            let opt = m::CUR_STATE | m::ALT_PATH | m::ACCESS_FLAGS | m::PATH_MIG_STATE;
            if rc {
                (
                    m::SQ_PSN | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::MAX_QP_RD_ATOMIC,
                    opt | m::MIN_RNR_TIMER,
                )
            } else {
                (m::SQ_PSN, opt)
            }
        }
        (qps::RTS, qps::RTS) | (qps::SQD, qps::RTS) => {
            let opt = m::CUR_STATE | m::ACCESS_FLAGS | m::ALT_PATH | m::PATH_MIG_STATE;
            (0, if rc { opt | m::MIN_RNR_TIMER } else { opt })
        }
        (qps::RTS, qps::SQD) => (0, m::EN_SQD_ASYNC_NOTIFY),
        (qps::SQE, qps::RTS) if !rc => (0, m::CUR_STATE | m::ACCESS_FLAGS),
        _ => return false,
    };
    mask & req == req && mask & !(req | opt | m::STATE) == 0
}

/// core/verbs.c:1389 `qp_state_table`, the UD column: no path, a Q_Key instead.
fn ud_modify_is_ok(cur: u8, next: u8, mask: u32) -> bool {
    use qp_attr as m;
    let (req, opt) = match (cur, next) {
        (_, qps::RESET) | (_, qps::ERR) => (0, 0),
        // :1395-1397
        (qps::RESET, qps::INIT) => (m::PKEY_INDEX | m::PORT | m::QKEY, 0),
        // :1424-1426
        (qps::INIT, qps::INIT) => (0, m::PKEY_INDEX | m::PORT | m::QKEY),
        // :1445, :1470-1471: nothing required.
        (qps::INIT, qps::RTR) => (0, m::PKEY_INDEX | m::QKEY),
        // :1497, :1515-1516
        (qps::RTR, qps::RTS) => (m::SQ_PSN, m::CUR_STATE | m::QKEY),
        // :1549-1550, :1595-1596, :1675-1676
        (qps::RTS, qps::RTS) | (qps::SQD, qps::RTS) | (qps::SQE, qps::RTS) => (0, m::CUR_STATE | m::QKEY),
        // :1579
        (qps::RTS, qps::SQD) => (0, m::EN_SQD_ASYNC_NOTIFY),
        _ => return false,
    };
    mask & req == req && mask & !(req | opt | m::STATE) == 0
}
