//! Address handles: CREATE_AH and DESTROY_AH as the uverbs core checks them.

use super::{decode, Call, Errno, Model};
use crate::abi;
use crate::mem::Memory;
use crate::objects::Ah;
use libc::{EINVAL, ENOENT};

impl Model {
    /// CREATE_AH (core/uverbs_cmd.c:2408 `ib_uverbs_create_ah`). libmlx5 sends it only on
    /// an Ethernet port, for the destination MAC (it builds an InfiniBand address vector
    /// itself); the Rust provider sends it on every port, as the kernel allows.
    pub(super) fn create_ah(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("CREATE_AH", &call.udata_in, call.udata_outlen);
        let req: abi::CreateAh = decode(call.req);
        // core/uverbs_cmd.c:2427: an invalid port is EINVAL, before the PD lookup.
        if req.attr.port_num != 1 {
            return Err(EINVAL);
        }
        // core/uverbs_cmd.c:2432: a PD handle naming nothing is the lookup's ENOENT.
        if !self.pds.get(req.pd_handle).is_some_and(|p| p.ctx == call.ctx) {
            return Err(ENOENT);
        }
        // core/verbs.c:597 rdma_create_user_ah -> :441 rdma_fill_sgid_attr -> :420
        // rdma_check_ah_attr: an AH on Ethernet (a RoCE AH, core/uverbs_cmd.c:2438
        // rdma_ah_find_type) needs a GRH (EINVAL); an InfiniBand port does not require one
        // (hw/mlx5/main.c:2894: only a port whose vport says so). With a GRH, its source
        // GID index must name a valid GID (core/cache.c:1221: beyond the table EINVAL, an
        // empty entry ENODATA).
        if self.port.is_eth() && req.attr.is_global == 0 {
            return Err(EINVAL);
        }
        let mut dmac = None;
        if req.attr.is_global != 0 {
            self.port.gid(req.attr.sgid_index)?;
            // core/verbs.c:610: a RoCE AH's destination MAC is resolved from the DGID
            // (:1727 ib_resolve_eth_dmac), as for a connected QP's path.
            if self.port.is_eth() {
                dmac = Some(self.port.resolve_dmac(req.attr.sgid_index, &req.attr.dgid)?.0);
            }
        }
        // hw/mlx5/ah.c:93 mlx5_ib_create_ah: a RoCE AH created with driver data answers
        // `struct mlx5_ib_create_ah_resp` up to `dmac` (response_length 10), and a response
        // buffer shorter than that is EINVAL (:106-120); an InfiniBand AH takes no driver
        // data and returns none. The AH holds its PD (core/verbs.c:544).
        if let Some(dmac) = dmac {
            const MIN_RESP: usize = 10;
            if call.udata_outlen < MIN_RESP {
                return Err(EINVAL);
            }
            let mut resp = [0u8; MIN_RESP];
            resp[..4].copy_from_slice(&(MIN_RESP as u32).to_ne_bytes());
            resp[4..].copy_from_slice(&dmac);
            Self::respond(mem, call.udata_out, &resp)?;
        }
        let handle = self.ahs.insert(Ah {
            ctx: call.ctx,
            pd: req.pd_handle,
            attr: req.attr,
        });
        if let Err(e) = call.respond_core(mem, &handle.to_ne_bytes()) {
            self.ahs.remove(handle);
            return Err(e);
        }
        if let Some(pd) = self.pds.get_mut(req.pd_handle) {
            pd.users += 1;
        }
        Ok(())
    }

    /// DESTROY_AH (core/uverbs_cmd.c:2478), also the ioctl AH_DESTROY.
    pub(super) fn destroy_ah(&mut self, call: &Call<'_>) -> Result<(), Errno> {
        crate::trace::command("DESTROY_AH", &call.udata_in, call.udata_outlen);
        let handle = decode::<abi::HandleOnly>(call.req).handle;
        // core/uverbs_cmd.c:2487 uobj_perform_destroy: an unknown handle is ENOENT
        // (core/rdma_core.c:325-327).
        let ah = self.ahs.get(handle).filter(|a| a.ctx == call.ctx).ok_or(ENOENT)?;
        let pd = ah.pd;
        self.ahs.remove(handle);
        if let Some(pd) = self.pds.get_mut(pd) {
            pd.users -= 1;
        }
        Ok(())
    }
}
