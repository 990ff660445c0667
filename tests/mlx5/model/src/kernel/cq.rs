//! Completion channels and CQs: CREATE_COMP_CHANNEL and CREATE/RESIZE/DESTROY_CQ as the uverbs
//! core and 6.1's mlx5 driver (`hw/mlx5/cq.c`) check them.

use super::{caps, decode, Call, Errno, Host, Model};
use crate::abi::{self, PAGE_SIZE};
use crate::mem::Memory;
use crate::objects::Cq;
use libc::{EBADF, EBUSY, EFAULT, EINVAL, ENOENT, EOPNOTSUPP};
use zerocopy::IntoBytes;

impl Model {
    pub(super) fn create_comp_channel(
        &mut self,
        call: &Call<'_>,
        mem: &dyn Memory,
        host: &dyn Host,
    ) -> Result<(), Errno> {
        let (fd, sink) = host.event_fd()?;
        if let Err(e) = call.respond_core(mem, &(fd as u32).to_ne_bytes()) {
            host.close_fd(fd);
            return Err(e);
        }
        self.channels.insert(fd, (call.ctx, sink));
        Ok(())
    }

    pub(super) fn create_cq(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("CREATE_CQ", &call.udata_in, call.udata_outlen);
        let req: abi::CreateCq = decode(call.req);
        // core/uverbs_cmd.c:1021 create_cq: `if (cmd->comp_vector >= num_comp_vectors) return
        // -EINVAL;`
        if req.comp_vector >= caps::NUM_COMP_VECTORS {
            return Err(EINVAL);
        }
        // core/uverbs_cmd.c:1030 ib_uverbs_lookup_comp_file: an fd that is not a completion
        // channel is EBADF.
        let channel = if req.comp_channel >= 0 {
            let (owner, sink) = self.channels.get(&req.comp_channel).ok_or(EBADF)?;
            if *owner != call.ctx {
                return Err(EBADF);
            }
            Some(sink.clone())
        } else {
            None
        };
        // hw/mlx5/cq.c:959, :967 mlx5_ib_create_cq: `if (entries < 0 || entries > (1 <<
        // log_max_cq_sz)) return -EINVAL;`, then the same for roundup_pow_of_two(entries + 1)
        // (entries is an int).
        let entries = i32::try_from(req.cqe).map_err(|_| EINVAL)?;
        let ncqe = (entries as u32 + 1).checked_next_power_of_two().ok_or(EINVAL)?;
        if ncqe > 1 << caps::LOG_MAX_CQ_SZ {
            return Err(EINVAL);
        }
        let ctx = self.ctx(call.ctx)?;
        // hw/mlx5/cq.c:980 mlx5_ib_create_cq -> :713 create_cq_user.
        let inlen = call.udata_in.len().min(32);
        // hw/mlx5/cq.c:729 create_cq_user: `if (ucmdlen < offsetof(struct mlx5_ib_create_cq,
        // flags)) return -EINVAL;`
        if inlen < abi::MLX5_CREATE_CQ_FLAGS_OFFSET {
            return Err(EINVAL);
        }
        let mut bytes = [0u8; 32];
        bytes[..inlen].copy_from_slice(&call.udata_in[..inlen]);
        let ucmd: abi::Mlx5CreateCq = decode(&bytes);
        // hw/mlx5/cq.c:735 create_cq_user: `if (ucmd.flags & ~(CQE_128B_PAD | UAR_PAGE_INDEX |
        // REAL_TIME_TS)) return -EINVAL;`
        if ucmd.flags & !(abi::CQ_FLAG_CQE_128B_PAD | abi::CQ_FLAG_UAR_PAGE_INDEX | abi::CQ_FLAG_REAL_TIME_TS) != 0 {
            return Err(EINVAL);
        }
        // hw/mlx5/cq.c:740 create_cq_user: `if ((ucmd.cqe_size != 64 && ucmd.cqe_size != 128)
        // || ucmd.reserved0 || ucmd.reserved1) return -EINVAL;`
        if (ucmd.cqe_size != 64 && ucmd.cqe_size != 128) || ucmd.reserved0 != 0 || ucmd.reserved1 != 0 {
            return Err(EINVAL);
        }
        // hw/mlx5/cq.c:747 create_cq_user: ib_umem_get(buf_addr, entries * cqe_size):
        // unmapped memory is EFAULT.
        if !mem.probe(ucmd.buf_addr, u64::from(ncqe) * u64::from(ucmd.cqe_size)) {
            return Err(EFAULT);
        }
        // hw/mlx5/cq.c:762 create_cq_user -> mlx5_ib_db_map_user pins the doorbell page:
        // EFAULT when unmapped.
        if !mem.probe(ucmd.db_addr & !(PAGE_SIZE - 1), PAGE_SIZE) {
            return Err(EFAULT);
        }
        // hw/mlx5/cq.c:791 create_cq_user: `else if (context->bfregi.lib_uar_dyn) { err =
        // -EINVAL; }`: with dynamic UARs the
        // CQ must name its UAR page.
        if ucmd.flags & abi::CQ_FLAG_UAR_PAGE_INDEX == 0 && ctx.lib_uar_dyn {
            return Err(EINVAL);
        }
        // hw/mlx5/cq.c:798-805, :825-828 create_cq_user: CQE compression and 128-byte
        // padding need capabilities this device lacks: EOPNOTSUPP. Real-time timestamps are
        // only recorded (hw/mlx5/cq.c:838): accepted.
        if ucmd.cqe_comp_en == 1 || ucmd.flags & abi::CQ_FLAG_CQE_128B_PAD != 0 {
            return Err(EOPNOTSUPP);
        }
        let cqn = self.next_cqn;
        let last_arm_db = mem.read_be32(ucmd.db_addr + abi::CQ_ARM_DB).unwrap_or(0);
        let handle = self.cqs.insert(Cq {
            ctx: call.ctx,
            cqn,
            user_handle: req.user_handle,
            buf: ucmd.buf_addr,
            ncqe,
            cqe_size: ucmd.cqe_size,
            db: ucmd.db_addr,
            pi: 0,
            channel,
            arm: None,
            fired: None,
            last_arm_db,
            comp_events: 0,
            async_events: 0,
            error: false,
            users: 0,
        });
        // hw/mlx5/cq.c:1029 mlx5_ib_create_cq: `ib_copy_to_udata(udata, &cq->mcq.cqn,
        // sizeof(__u32))`, unclamped.
        let result = Self::respond(mem, call.udata_out, &cqn.to_ne_bytes()).and_then(|()| {
            let resp = abi::CreateCqResp {
                cq_handle: handle,
                cqe: ncqe - 1,
            };
            call.respond_core(mem, resp.as_bytes())
        });
        match result {
            Ok(()) => {
                self.next_cqn += 1;
                Ok(())
            }
            Err(e) => {
                self.cqs.remove(handle);
                Err(e)
            }
        }
    }

    pub(super) fn resize_cq(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("RESIZE_CQ", &call.udata_in, call.udata_outlen);
        let req: abi::ResizeCq = decode(call.req);
        // core/uverbs_cmd.c:1135: an unknown CQ is the lookup's ENOENT.
        let cq = self
            .cqs
            .get(req.cq_handle)
            .filter(|c| c.ctx == call.ctx)
            .ok_or(ENOENT)?;
        // hw/mlx5/cq.c:1283, :1292 mlx5_ib_resize_cq: `if (entries < 1 || entries > (1 <<
        // log_max_cq_sz)) return -EINVAL;`, then roundup_pow_of_two(entries + 1) against
        // the same plus one.
        let entries = i32::try_from(req.cqe).map_err(|_| EINVAL)?;
        if entries < 1 || entries as u32 > 1 << caps::LOG_MAX_CQ_SZ {
            return Err(EINVAL);
        }
        let new_n = (entries as u32 + 1).next_power_of_two();
        if new_n > (1 << caps::LOG_MAX_CQ_SZ) + 1 {
            return Err(EINVAL);
        }
        // hw/mlx5/cq.c:1295 mlx5_ib_resize_cq: `if (entries == ibcq->cqe + 1) return 0;`
        if new_n == cq.ncqe {
            return call.respond_core(mem, &resize_resp(cq.ncqe - 1));
        }
        // hw/mlx5/cq.c:1161 resize_user: `ib_copy_from_udata(&ucmd, udata, sizeof(ucmd))`,
        // unclamped: short or
        // missing driver data reads past it (NULL when absent: EFAULT).
        let mut bytes = [0u8; 16];
        if call.udata_in.len() >= 16 {
            bytes.copy_from_slice(&call.udata_in[..16]);
        } else {
            return Err(if call.udata_in.is_empty() { EFAULT } else { EINVAL });
        }
        let ucmd: abi::Mlx5ResizeCq = decode(&bytes);
        // hw/mlx5/cq.c:1165 resize_user: `if (ucmd.reserved0 || ucmd.reserved1) return
        // -EINVAL;`
        if ucmd.reserved0 != 0 || ucmd.reserved1 != 0 {
            return Err(EINVAL);
        }
        // The new CQE size must be one the device writes. 6.1's driver does not check it
        // (hw/mlx5/cq.c:1153 resize_user); it passes it to the firmware through the CQ
        // context (cq.c:1356 cqe_sz_to_mlx_sz), which refuses other sizes: the model answers
        // for the firmware with EINVAL.
        if ucmd.cqe_size != 64 && ucmd.cqe_size != 128 {
            return Err(EINVAL);
        }
        if !mem.probe(ucmd.buf_addr, u64::from(new_n) * u64::from(ucmd.cqe_size)) {
            return Err(EFAULT);
        }
        let cq = self.cqs.get_mut(req.cq_handle).ok_or(ENOENT)?;
        cq.resize(ucmd.buf_addr, new_n, u32::from(ucmd.cqe_size), mem);
        call.respond_core(mem, &resize_resp(new_n - 1))
    }

    pub(super) fn destroy_cq(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("DESTROY_CQ", &call.udata_in, call.udata_outlen);
        let req: abi::DestroyObj = decode(call.req);
        // core/uverbs_cmd.c:1270 uobj_get_destroy: an unknown CQ is the lookup's ENOENT
        // (core/rdma_core.c:325-327).
        let cq = self.cqs.get(req.handle).filter(|c| c.ctx == call.ctx).ok_or(ENOENT)?;
        // core/uverbs_cmd.c:1270 uobj_get_destroy -> core/uverbs_std_types_cq.c:48 ->
        // core/verbs.c:2119-2120 ib_destroy_cq_user: a CQ a QP still uses is EBUSY
        // (docs/kernel-facts.md).
        if cq.users > 0 {
            return Err(EBUSY);
        }
        let resp = abi::DestroyCqResp {
            comp_events_reported: cq.comp_events,
            async_events_reported: cq.async_events,
        };
        self.cqs.remove(req.handle);
        call.respond_core(mem, resp.as_bytes())
    }
}

/// `struct ib_uverbs_resize_cq_resp {cqe, reserved}`.
fn resize_resp(cqe: u32) -> [u8; 8] {
    let mut b = [0; 8];
    b[..4].copy_from_slice(&cqe.to_ne_bytes());
    b
}
