//! Shared receive queues: CREATE/MODIFY/QUERY/DESTROY_SRQ as the uverbs core and 6.1's mlx5
//! driver (`hw/mlx5/srq.c`) check them. The ioctl SRQ CREATE method decodes its attributes
//! and runs [`Model::create_srq`] too.

use super::{caps, decode, Call, Errno, Model};
use crate::abi::{self, srqt, PAGE_SIZE};
use crate::mem::Memory;
use crate::objects::Srq;
use libc::{EBUSY, EFAULT, EINVAL, ENOENT};
use zerocopy::IntoBytes;

/// The core's view of a CREATE_SRQ request (the write form's `ib_uverbs_create_srq`, or the
/// ioctl method's attributes).
pub(crate) struct SrqRequest {
    pub(crate) user_handle: u64,
    pub(crate) pd: u32,
    pub(crate) srq_type: u32,
    pub(crate) max_wr: u32,
    pub(crate) max_sge: u32,
}

/// What the core reports of a new SRQ.
pub(crate) struct SrqMade {
    pub(crate) handle: u32,
    pub(crate) max_wr: u32,
    pub(crate) max_sge: u32,
}

impl Model {
    /// The write command CREATE_SRQ (core/uverbs_cmd.c:3489 `ib_uverbs_create_srq`: always a
    /// basic SRQ).
    pub(super) fn create_srq_cmd(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        let req: abi::CreateSrq = decode(call.req);
        let made = self.create_srq(
            call,
            mem,
            &SrqRequest {
                user_handle: req.user_handle,
                pd: req.pd_handle,
                srq_type: srqt::BASIC,
                max_wr: req.max_wr,
                max_sge: req.max_sge,
            },
        )?;
        // core/uverbs_cmd.c:3466-3469: handle, the granted sizes, `srqn` only for XRC.
        let resp = abi::CreateSrqResp {
            srq_handle: made.handle,
            max_wr: made.max_wr,
            max_sge: made.max_sge,
            srqn: 0,
        };
        let result = call.respond_core(mem, resp.as_bytes());
        if result.is_err() {
            self.drop_srq(made.handle);
        }
        result
    }

    /// core/verbs.c:1010 `ib_create_srq_user` -> hw/mlx5/srq.c:191 `mlx5_ib_create_srq` with
    /// `create_srq_user` (srq.c:43), after the core found the PD.
    pub(crate) fn create_srq(&mut self, call: &Call<'_>, mem: &dyn Memory, req: &SrqRequest) -> Result<SrqMade, Errno> {
        // core/uverbs_cmd.c:3426 (the ioctl form: the PD attribute's lookup): an unknown PD is
        // ENOENT (core/rdma_core.c:327).
        if !self.pds.get(req.pd).is_some_and(|p| p.ctx == call.ctx) {
            return Err(ENOENT);
        }
        // hw/mlx5/srq.c:211-212: `max_wr >= max_srq_wqes || max_sge > max_sge_sz` is EINVAL
        // (1 << log_max_srq_sz WQEs; max_wqe_sz_rq / 16 scatter entries).
        let max_sge_sz = caps::MAX_WQE_SZ_RQ / 16;
        if req.max_wr >= 1 << caps::LOG_MAX_SRQ_SZ || req.max_sge > max_sge_sz {
            return Err(EINVAL);
        }
        // hw/mlx5/srq.c:221-239: `max = roundup_pow_of_two(max_wr + 1)`; the WQE is the next
        // segment and `max_sge` data segments, a power of two of at least 32 bytes. (Its
        // checks for a zero or overflowing size at srq.c:226, :231 and :238 cannot fire
        // within the limits above.)
        let max = (req.max_wr + 1).next_power_of_two();
        let desc_size = (16 + 16 * req.max_sge).next_power_of_two().max(32);
        let wqe_shift = desc_size.trailing_zeros();
        let buf_size = u64::from(max) * u64::from(desc_size);
        // hw/mlx5/srq.c:55-60 create_srq_user: `min(inlen, sizeof(ucmd))` bytes of driver
        // data, the rest zero (no driver data at all reads as zeros).
        let inlen = call.udata_in.len();
        let mut bytes = [0u8; 32];
        bytes[..inlen.min(32)].copy_from_slice(&call.udata_in[..inlen.min(32)]);
        let ucmd: abi::Mlx5CreateSrq = decode(&bytes);
        // hw/mlx5/srq.c:62: `if (ucmd.reserved0 || ucmd.reserved1) return -EINVAL;`
        if ucmd.reserved0 != 0 || ucmd.reserved1 != 0 {
            return Err(EINVAL);
        }
        // hw/mlx5/srq.c:65-68: driver data beyond the struct must be zero.
        if call.udata_in.iter().skip(32).any(|&b| b != 0) {
            return Err(EINVAL);
        }
        // hw/mlx5/srq.c:70: a basic SRQ's `uidx` is never read. The user index rules
        // (mlx5_ib.h:1525 get_srq_user_index) apply to XRC and tag-matching SRQs only, which
        // the model refuses below or before (their uidx errors are EINVAL too).
        // hw/mlx5/srq.c:78 create_srq_user: ib_umem_get(buf_addr, buf_size): memory that
        // cannot be pinned is EFAULT.
        if !mem.probe(ucmd.buf_addr, buf_size) {
            return Err(EFAULT);
        }
        // hw/mlx5/srq.c:86 create_srq_user -> mlx5_ib_db_map_user pins the doorbell page.
        if !mem.probe(ucmd.db_addr & !(PAGE_SIZE - 1), PAGE_SIZE) {
            return Err(EFAULT);
        }
        // hw/mlx5/srq.c:264-271: a tag-matching SRQ's list must fit the device's
        // `log_tag_matching_list_sz`, 0 on this device (no tag matching): always EINVAL.
        // An XRC SRQ never gets here: the model has no XRC domains to name.
        if req.srq_type == srqt::TM {
            return Err(EINVAL);
        }
        let srqn = self.next_srqn & 0xff_ffff;
        let handle = self.srqs.insert(Srq {
            ctx: call.ctx,
            srqn,
            pd: req.pd,
            user_handle: req.user_handle,
            buf: ucmd.buf_addr,
            max,
            wqe_shift,
            max_gs: req.max_sge,
            db: ucmd.db_addr,
            head: 0,
            taken: 0,
            limit: 0,
            error: false,
            users: 0,
            async_events: 0,
        });
        // hw/mlx5/srq.c:297-305: `{srqn}` copied as `min(outlen, sizeof(resp))` bytes; a
        // fault is EFAULT.
        let resp = abi::Mlx5CreateSrqResp { srqn, reserved: 0 };
        let n = call.udata_outlen.min(std::mem::size_of::<abi::Mlx5CreateSrqResp>());
        if n > 0 {
            if let Err(e) = Self::respond(mem, call.udata_out, &resp.as_bytes()[..n]) {
                self.srqs.remove(handle);
                return Err(e);
            }
        }
        self.next_srqn += 1;
        if let Some(pd) = self.pds.get_mut(req.pd) {
            pd.users += 1;
        }
        // hw/mlx5/srq.c:308: the core reports `max - 1` WQEs and the scatter entries asked for.
        Ok(SrqMade {
            handle,
            max_wr: max - 1,
            max_sge: req.max_sge,
        })
    }

    /// Forgets an SRQ no QP uses.
    pub(crate) fn drop_srq(&mut self, handle: u32) {
        if let Some(srq) = self.srqs.remove(handle) {
            if let Some(pd) = self.pds.get_mut(srq.pd) {
                pd.users -= 1;
            }
        }
    }

    /// core/uverbs_cmd.c:3523 `ib_uverbs_modify_srq` -> hw/mlx5/srq.c:324
    /// `mlx5_ib_modify_srq`.
    pub(super) fn modify_srq(&mut self, call: &Call<'_>) -> Result<(), Errno> {
        let req: abi::ModifySrq = decode(call.req);
        // core/uverbs_cmd.c:3534: an unknown SRQ is the lookup's ENOENT.
        let srq = self
            .srqs
            .get_mut(req.srq_handle)
            .filter(|s| s.ctx == call.ctx)
            .ok_or(ENOENT)?;
        // hw/mlx5/srq.c:332: resizing is EINVAL.
        if req.attr_mask & abi::SRQ_ATTR_MAX_WR != 0 {
            return Err(EINVAL);
        }
        if req.attr_mask & abi::SRQ_ATTR_LIMIT != 0 {
            // hw/mlx5/srq.c:336: a limit of `max` WQEs or more is EINVAL; then the firmware's
            // ARM_RQ sets the limit (`lwm`) and arms the event.
            if req.srq_limit >= srq.max {
                return Err(EINVAL);
            }
            srq.limit = req.srq_limit;
            crate::log!("srq {:#x} limit armed at {}", srq.srqn, req.srq_limit);
        }
        Ok(())
    }

    /// core/uverbs_cmd.c:3550 `ib_uverbs_query_srq` -> hw/mlx5/srq.c:349 `mlx5_ib_query_srq`:
    /// `max - 1` WQEs, the scatter entries asked for, the armed limit (0 once it fired).
    pub(super) fn query_srq(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        let req: abi::DestroyObj = decode(call.req);
        // core/uverbs_cmd.c:3562: an unknown SRQ is the lookup's ENOENT.
        let srq = self.srqs.get(req.handle).filter(|s| s.ctx == call.ctx).ok_or(ENOENT)?;
        let resp = abi::QuerySrqResp {
            max_wr: srq.max - 1,
            max_sge: srq.max_gs,
            srq_limit: srq.limit,
            reserved: 0,
        };
        call.respond_core(mem, resp.as_bytes())
    }

    /// core/uverbs_cmd.c:3583 `ib_uverbs_destroy_srq` (and the ioctl SRQ DESTROY): unknown is
    /// ENOENT, attached to a QP EBUSY (core/verbs.c:1083 `ib_destroy_srq_user`); the response
    /// is the async events reported.
    pub(crate) fn destroy_srq(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        let req: abi::DestroyObj = decode(call.req);
        let srq = self.srqs.get(req.handle).filter(|s| s.ctx == call.ctx).ok_or(ENOENT)?;
        if srq.users > 0 {
            return Err(EBUSY);
        }
        let events = srq.async_events;
        self.drop_srq(req.handle);
        call.respond_core(mem, &events.to_ne_bytes())
    }
}
