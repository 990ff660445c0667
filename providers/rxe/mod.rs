//! SoftRoCE (`rdma_rxe`): the kernel allocates every ring and hands back mmap cookies; sends
//! are rung with an empty POST_SEND command; receives and polling touch only the rings.

mod abi;
mod cq;
mod qp;
pub(super) use qp::queues;
mod queue;
mod srq;

/// The ring's hostile-ring harness, for `crate::testing`.
#[cfg(any(test, feature = "test-support"))]
pub use queue::hostile;

use crate::attr::{AhAttr, GidType};
use crate::device::{DeviceFile, DeviceInfo};
use crate::error::{Error, Result, Verb};
use crate::provider::{
    CqRing, CreateCqCall, CreateQpCall, KernelCall, Provider, ProviderContext, ProviderQp, QpRequest, SrqCreated,
    SrqQueue,
};
use crate::sys::mapping::Mapping;
use abi::{CreateAhResp, MmInfo};
use queue::{Backing, Queue};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use zerocopy::IntoBytes;

/// `RDMA_DRIVER_RXE` in `enum rdma_driver_id`.
const DRIVER_ID: u32 = 14;
/// The per-device uverbs ABI versions the rxe driver has used.
const ABI_VERSIONS: std::ops::RangeInclusive<u32> = 1..=2;

/// The rxe provider.
pub(crate) struct Rxe;

impl Provider for Rxe {
    fn name(&self) -> &'static str {
        "rxe"
    }

    fn driver_id(&self) -> u32 {
        DRIVER_ID
    }

    fn matches(&self, device: &DeviceInfo) -> bool {
        let driver = match device.driver_id {
            Some(id) => id == DRIVER_ID,
            // Without RDMA netlink, match the name as rdma-core does.
            None => device.name.contains("rxe"),
        };
        driver && ABI_VERSIONS.contains(&device.abi_version)
    }

    fn open(&self, file: &Arc<DeviceFile>, kernel: KernelCall<'_, ()>) -> Result<Box<dyn ProviderContext>> {
        // rxe has no driver data in GET_CONTEXT.
        kernel(&[], &mut [])?;
        Ok(Box::new(RxeContext { file: file.clone() }))
    }
}

#[derive(Clone)]
struct RxeContext {
    file: Arc<DeviceFile>,
}

impl RxeContext {
    /// Maps a ring the kernel described in `mi` and validates its header.
    fn map(&self, mi: &MmInfo, verb: Verb, min_elem: usize) -> Result<Queue> {
        // SAFETY: a mapping of the device's ring, which the kernel keeps alive while it is
        // mapped; all access goes through `Queue`'s checked geometry, with atomics for what
        // the kernel writes. A forked child gets no copy: it could only steal or corrupt the
        // parent's queues (rdma-core's ibv_fork_init does the same).
        let map = unsafe { Mapping::device(self.file.as_fd().as_raw_fd(), mi.offset, mi.size as usize) }
            .map_err(|e| Error::io(format!("{verb}: mmap of ring at cookie {:#x}", mi.offset), e))?;
        Queue::new(Backing::Mapped(map), verb, min_elem)
    }
}

// SAFETY: rxe passes driver bytes with no user address (mmap cookies come back in responses).
unsafe impl ProviderContext for RxeContext {
    fn alloc_pd(&self, kernel: KernelCall<'_, ()>) -> Result<()> {
        kernel(&[], &mut [])
    }

    fn reg_mr(&self, kernel: KernelCall<'_, ()>) -> Result<()> {
        kernel(&[], &mut [])
    }

    fn create_cq(&self, cqe: u32, kernel: CreateCqCall<'_>) -> Result<Box<dyn CqRing>> {
        cq::create(self, cqe, kernel)
    }

    fn create_qp(&self, request: &QpRequest<'_>, kernel: CreateQpCall<'_>) -> Result<ProviderQp> {
        qp::create(self, request, kernel)
    }

    /// rxe sizes the ring itself (the kernel allocates it): the sizes asked for are the core
    /// command's alone.
    fn create_srq(&self, _: u32, _: u32, kernel: KernelCall<'_, SrqCreated>) -> Result<Box<dyn SrqQueue>> {
        srq::create(self, kernel)
    }

    /// Linux 6.1's rxe holds the region in `qp->resp.mr` from a message's first packet; an
    /// unfinished message leaves it there until the QP is reset or destroyed, and DEREG_MR
    /// waits 50 s for it, then logs a WARNING and frees the region anyway
    /// (docs/kernel-facts.md).
    fn dereg_waits_for_responders(&self) -> bool {
        true
    }

    /// rxe builds the address vector in the kernel from CREATE_AH's attributes.
    fn create_ah(&self, _attr: &AhAttr, _sgid_type: Option<GidType>, kernel: KernelCall<'_, u32>) -> Result<u64> {
        let mut resp = CreateAhResp::default();
        kernel(&[], resp.as_mut_bytes())?;
        if resp.ah_num == 0 {
            // Kernels before 5.14 return no AH number; UD sends would then need a full
            // address vector in every WQE, which this provider does not build.
            return Err(Error::Unsupported {
                verb: "CREATE_AH",
                what: "rxe kernels without AH numbers (before Linux 5.14)",
            });
        }
        Ok(u64::from(resp.ah_num))
    }

    /// The kernel keeps rxe's address vectors; nothing of the AH lives here.
    fn destroy_ah(&self, _: u64) {}
}
