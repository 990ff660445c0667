//! rxe shared receive queues: receive WQEs in a kernel-allocated ring, like a QP's RQ.

use super::abi::{CreateSrqResp, MmInfo, ModifySrqCmd, RecvWqe};
use super::qp::post_recv_wqes;
use super::queue::Producer;
use super::RxeContext;
use crate::error::{Result, Verb};
use crate::provider::{KernelCall, KernelInput, SrqCreated, SrqQueue};
use crate::wr::{RecvWr, Sge};
use zerocopy::IntoBytes;

pub(super) fn create(ctx: &RxeContext, kernel: KernelCall<'_, SrqCreated>) -> Result<Box<dyn SrqQueue>> {
    let mut resp = CreateSrqResp::default();
    let created = kernel(&[], resp.as_mut_bytes())?;
    let ring = map_ring(ctx, &resp.mi, created.max_sge, "CREATE_SRQ")?;
    Ok(Box::new(RxeSrq {
        ring,
        max_sge: created.max_sge,
        ctx: ctx.clone(),
    }))
}

fn map_ring(ctx: &RxeContext, mi: &MmInfo, max_sge: u32, verb: Verb) -> Result<Producer> {
    let min = size_of::<RecvWqe>() + max_sge as usize * size_of::<Sge>();
    Ok(Producer::new(ctx.map(mi, verb, min)?))
}

struct RxeSrq {
    ring: Producer,
    max_sge: u32,
    ctx: RxeContext,
}

// SAFETY: MODIFY_SRQ's driver request names `modify`'s local `mi`, live for the call.
unsafe impl SrqQueue for RxeSrq {
    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let result = post_recv_wqes(&mut self.ring, self.max_sge, wrs);
        self.ring.publish();
        result
    }

    fn modify(&mut self, resize: bool, kernel: KernelInput<'_>) -> Result<()> {
        // rxe always takes the address of an `mminfo`, and fills it when resizing.
        let mut mi = MmInfo::default();
        let cmd = ModifySrqCmd {
            mmap_info_addr: std::ptr::addr_of_mut!(mi) as u64,
        };
        kernel(cmd.as_bytes())?;
        if resize {
            // The kernel copied the posted receives into the new ring.
            self.ring = map_ring(&self.ctx, &mi, self.max_sge, "MODIFY_SRQ")?;
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
