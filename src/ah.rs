//! Address handles: where a UD send goes.

use crate::attr::AhAttr;
use crate::context::ContextInner;
use crate::error::Result;
use crate::pd::{Pd, PdInner};
use crate::provider::create_object;
use crate::sys::abi::{self, AhAttrAbi, CreateAh, CreateAhResp};
use crate::sys::cmd;
use crate::sys::ioctl::object;
use crate::wr::{AhData, AhRef, UdDest};
use std::sync::Arc;

const METHOD_AH_DESTROY: u16 = 0;

/// An address handle.
pub struct Ah {
    pd: Arc<PdInner>,
    handle: u32,
    /// What the provider needs to address a UD send with this AH.
    data: AhData,
}

impl std::fmt::Debug for Ah {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ah").field("handle", &self.handle).finish()
    }
}

impl Pd {
    /// Creates an address handle for `attr` (CREATE_AH).
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah> {
        let ctx = &self.inner.ctx;
        ctx.check_owner("CREATE_AH")?;
        let grh = attr.grh.unwrap_or_default();
        let req = CreateAh {
            response: 0,
            user_handle: 0,
            pd_handle: self.inner.handle,
            reserved: 0,
            attr: AhAttrAbi {
                dgid: grh.dgid,
                flow_label: grh.flow_label,
                sgid_index: grh.sgid_index,
                hop_limit: grh.hop_limit,
                traffic_class: grh.traffic_class,
                grh_reserved: 0,
                dlid: attr.dlid,
                sl: attr.sl,
                src_path_bits: attr.src_path_bits,
                static_rate: attr.static_rate,
                is_global: u8::from(attr.grh.is_some()),
                port_num: attr.port_num,
                reserved: 0,
            },
        };
        // The source GID's type, looked up before the command as libibverbs' providers do
        // (mlx5 writes RoCE v2's UDP source port only for a v2 GID).
        let sgid_type = match attr.grh {
            Some(grh) => Some(ctx.gid_type(attr.port_num, grh.sgid_index)?),
            None => None,
        };
        let (handle, provider_data) = create_object(
            "CREATE_AH",
            |kernel| {
                ctx.provider
                    .create_ah(attr, sgid_type, &mut |drv_in, drv_out| kernel((), drv_in, drv_out))
            },
            |(), drv_in: &[u8], drv_out: &mut [u8]| {
                let resp: CreateAhResp =
                    cmd::execute_plain(ctx.fd(), "CREATE_AH", abi::cmd::CREATE_AH, &req, drv_in, drv_out)?;
                Ok(resp.ah_handle)
            },
            |h| drop(destroy_ah(ctx, h)),
        )?;
        Ok(Ah {
            pd: self.inner.clone(),
            handle,
            data: AhData {
                provider_data,
                context: self.inner.context_id(),
            },
        })
    }
}

fn destroy_ah(ctx: &ContextInner, handle: u32) -> Result<()> {
    ctx.destroy("DESTROY_AH", object::AH, METHOD_AH_DESTROY, handle, &mut [])
}

impl Ah {
    /// The kernel's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The destination `remote_qpn` with `remote_qkey` behind this AH, for a UD send.
    pub fn ud_dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest<'_> {
        UdDest {
            ah: AhRef::new(&self.data),
            remote_qpn,
            remote_qkey,
        }
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        let ctx = &self.pd.ctx;
        // The provider's half goes only once the kernel AH is gone (and never in a forked
        // child, where the AH is the parent's).
        if destroy_ah(ctx, self.handle).is_ok() && !ctx.forked() {
            ctx.provider.destroy_ah(self.data.provider_data);
        }
    }
}
