//! Soft-iWARP (`siw`): the kernel allocates every ring and hands back mmap keys; each slot
//! has a VALID flag that says whose it is (no shared indices); sends are rung with an empty
//! POST_SEND command, in which the kernel transmits; completions are polled by the flag. RC
//! QPs only, connected through the RDMA connection manager (iWARP QPs reach RTS only there).
//! What siw does not do (atomics, immediate data, UD, address handles, memory windows, reads
//! into more than one buffer, more than 80 bytes inline, CQ and SRQ resizing) is refused
//! here with a typed error before the kernel sees it (docs/siw.md).

mod abi;
mod cq;
mod qp;
mod ring;

pub(super) use qp::queues;

/// The CQ's hostile-ring harness, for `crate::testing`.
#[cfg(any(test, feature = "test-support"))]
pub use cq::hostile;

use crate::attr::{AhAttr, GidType};
use crate::device::{DeviceFile, DeviceInfo};
use crate::error::{Error, Result, Verb};
use crate::provider::{
    CqRing, CreateCqCall, CreateQpCall, KernelCall, Provider, ProviderContext, ProviderQp, QpRequest, SrqCreated,
    SrqQueue,
};
use crate::sys::mapping::Mapping;
use abi::{AllocCtxResp, RegMrReq, RegMrResp};
use ring::{Backing, Slots};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use zerocopy::IntoBytes;

/// `RDMA_DRIVER_SIW` in `enum rdma_driver_id`.
const DRIVER_ID: u32 = 18;
/// `SIW_ABI_VERSION`.
const ABI_VERSION: u32 = 1;

/// The siw provider.
pub(crate) struct Siw;

impl Provider for Siw {
    fn name(&self) -> &'static str {
        "siw"
    }

    fn driver_id(&self) -> u32 {
        DRIVER_ID
    }

    fn matches(&self, device: &DeviceInfo) -> bool {
        let driver = match device.driver_id {
            Some(id) => id == DRIVER_ID,
            // Without RDMA netlink, match the name as rdma-core's fallback does.
            None => device.name.contains("siw"),
        };
        driver && device.abi_version == ABI_VERSION
    }

    fn open(&self, file: &Arc<DeviceFile>, kernel: KernelCall<'_, ()>) -> Result<Box<dyn ProviderContext>> {
        // siw refuses GET_CONTEXT without room for its 8-byte response.
        let mut resp = AllocCtxResp::default();
        kernel(&[], resp.as_mut_bytes())?;
        Ok(Box::new(SiwContext { file: file.clone() }))
    }
}

#[derive(Clone)]
pub(super) struct SiwContext {
    file: Arc<DeviceFile>,
}

impl SiwContext {
    /// Maps `len` bytes at `key` as `count` slots of `stride` bytes and `tail` bytes after.
    fn map(&self, key: u64, len: usize, count: u32, stride: usize, tail: usize, verb: Verb) -> Result<Slots> {
        if len == 0 {
            return Err(Error::malformed(verb, "an empty ring"));
        }
        // SAFETY: a mapping of a kernel-allocated ring, alive while it is mapped; all access
        // goes through `Slots`, whose geometry is checked against the length, with atomics for
        // the flags both sides write. Not inherited by a forked child.
        let map = unsafe { Mapping::device(self.file.as_fd().as_raw_fd(), key, len) }
            .map_err(|e| Error::io(format!("{verb}: mmap of ring at key {key:#x}"), e))?;
        Slots::new(Backing::Mapped(map), count, stride, tail, verb)
    }

    /// [`SiwContext::map`] of a queue of `count` slots of `stride` bytes.
    fn map_slots(&self, key: u64, count: u32, stride: usize, verb: Verb) -> Result<Slots> {
        let len = (count as usize)
            .checked_mul(stride)
            .ok_or_else(|| Error::malformed(verb, format!("{count} slots")))?;
        self.map(key, len, count, stride, 0, verb)
    }
}

// SAFETY: siw passes driver bytes with no user address (mmap keys come back in responses).
unsafe impl ProviderContext for SiwContext {
    fn alloc_pd(&self, kernel: KernelCall<'_, ()>) -> Result<()> {
        kernel(&[], &mut [])
    }

    /// siw needs 8 bytes of driver data each way (EINVAL otherwise): a key byte for the
    /// STag, which stays 0, and the STag back.
    fn reg_mr(&self, kernel: KernelCall<'_, ()>) -> Result<()> {
        let req = RegMrReq::default();
        let mut resp = RegMrResp::default();
        kernel(req.as_bytes(), resp.as_mut_bytes())
    }

    fn create_cq(&self, cqe: u32, kernel: CreateCqCall<'_>) -> Result<Box<dyn CqRing>> {
        cq::create(self, cqe, kernel)
    }

    fn create_qp(&self, request: &QpRequest<'_>, kernel: CreateQpCall<'_>) -> Result<ProviderQp> {
        qp::create(self, request, kernel)
    }

    /// The kernel allocates the ring; the sizes asked for are the core command's alone.
    fn create_srq(&self, _: u32, _: u32, kernel: KernelCall<'_, SrqCreated>) -> Result<Box<dyn SrqQueue>> {
        qp::create_srq(self, kernel)
    }

    /// iWARP has no address handles (siw answers CREATE_AH with EOPNOTSUPP).
    fn create_ah(&self, _attr: &AhAttr, _sgid_type: Option<GidType>, _kernel: KernelCall<'_, u32>) -> Result<u64> {
        Err(Error::Unsupported {
            verb: "CREATE_AH",
            what: "siw (iWARP) has no address handles",
        })
    }

    fn destroy_ah(&self, _: u64) {}
}
