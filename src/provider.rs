//! The contract between the vendor-neutral core and a vendor module under `providers/`.
//!
//! The core runs every kernel command itself; a provider only supplies what is vendor
//! specific. Object creation follows one shape for every object: the core hands the provider a
//! *kernel call* closure, the provider prepares whatever the driver needs (user-allocated ring
//! buffers and doorbell records whose addresses go in the driver request, as on mlx5, or
//! nothing, as on rxe), calls the closure with its driver request bytes and a buffer for the
//! driver response, and then finishes from the response (mapping kernel-allocated rings from
//! mmap cookies, as on rxe, or recording the hardware object number, as on mlx5).
//!
//! If the provider fails after the kernel call succeeded, the core destroys the kernel object;
//! the provider only has to release what it allocated itself. When an object is destroyed the
//! core issues the kernel destroy first and drops the provider's part after, so rings and
//! buffers outlive the kernel's use of them.
//!
//! The data path (poll, post) is a call through the provider's trait object per *batch*, never
//! per completion or work request.

use crate::attr::{QpCap, QpType};
use crate::device::{DeviceFile, DeviceInfo};
use crate::error::Result;
use crate::wc::WorkCompletion;
use crate::wr::{RecvWr, SendWr};
use std::ptr::NonNull;
use std::sync::Arc;

/// Runs the kernel's create command with the provider's driver request bytes, writing the
/// driver's response bytes into the buffer given, and returns the core results `T`.
pub type KernelCall<'a, T> = &'a mut dyn FnMut(&[u8], &mut [u8]) -> Result<T>;

/// A vendor module. Providers are listed in `providers/mod.rs`.
pub trait Provider: Sync {
    /// Short name, e.g. for error messages.
    fn name(&self) -> &'static str;

    /// The kernel's `enum rdma_driver_id` value for this driver; ioctl calls carry it.
    fn driver_id(&self) -> u32;

    /// Whether this provider drives `device` (by driver id, else by name, and ABI version).
    fn matches(&self, device: &DeviceInfo) -> bool;

    /// Opens a context: runs GET_CONTEXT through `kernel` with the driver's data, and keeps
    /// whatever per-context state the driver needs (UAR mappings, say).
    fn open(&self, file: &Arc<DeviceFile>, kernel: KernelCall<'_, ()>) -> Result<Box<dyn ProviderContext>>;
}

/// What the core knows of a CQ the kernel just created.
#[derive(Debug, Clone, Copy)]
pub struct CqCreated {
    /// The kernel's handle.
    pub handle: u32,
    /// Capacity the kernel granted.
    pub cqe: u32,
}

/// What the core knows of a QP the kernel just created.
#[derive(Debug, Clone, Copy)]
pub struct QpCreated {
    /// The kernel's handle.
    pub handle: u32,
    /// The QP number.
    pub qpn: u32,
    /// Capabilities the kernel granted (possibly more than asked).
    pub cap: QpCap,
}

/// A QP creation request, as the provider sees it.
#[derive(Debug, Clone, Copy)]
pub struct QpRequest {
    /// Transport.
    pub qp_type: QpType,
    /// Capabilities asked for.
    pub cap: QpCap,
    /// Whether receives come from an SRQ (then there is no receive queue to map).
    pub has_srq: bool,
}

/// What the core knows of an SRQ the kernel just created.
#[derive(Debug, Clone, Copy)]
pub struct SrqCreated {
    /// The kernel's handle.
    pub handle: u32,
    /// Work requests the kernel granted.
    pub max_wr: u32,
    /// Scatter/gather entries per request the kernel granted.
    pub max_sge: u32,
}

/// Runs a kernel command that takes driver request bytes and returns no driver response.
pub type KernelInput<'a> = &'a mut dyn FnMut(&[u8]) -> Result<()>;

/// Per-context vendor state: makes the vendor halves of CQs, QPs, SRQs and AHs.
///
/// Driver request bytes a provider passes to a kernel call may contain user pointers (rxe's
/// SRQ resize names a buffer for the kernel to fill); the provider guarantees each names live
/// memory of the right size for the duration of the call.
pub trait ProviderContext: Send + Sync {
    /// Creates the vendor half of a CQ of at least `cqe` entries.
    fn create_cq(&self, cqe: u32, kernel: KernelCall<'_, CqCreated>) -> Result<Box<dyn CqRing>>;

    /// Creates the vendor half of a QP.
    fn create_qp(&self, request: &QpRequest, kernel: KernelCall<'_, QpCreated>) -> Result<Box<dyn QpQueues>>;

    /// Creates the vendor half of an SRQ.
    fn create_srq(&self, kernel: KernelCall<'_, SrqCreated>) -> Result<Box<dyn SrqQueue>>;

    /// Creates the vendor half of an address handle; the kernel call returns the AH's
    /// handle. Returns a value the provider reads back from the AH when posting UD sends.
    fn create_ah(&self, kernel: KernelCall<'_, u32>) -> Result<u64>;
}

/// The consumer side of a completion queue. There is exactly one consumer: the core only
/// calls these through a handle it hands out uniquely (`&mut`).
///
/// # Safety
/// The core reads the completions [`CqRing::ready_run`] describes through its pointers, so an
/// implementation must make them point at `len` readable, 8-aligned `WorkCompletion`s
/// (`before_wrap` from `first` and the rest from `wrapped`, `stride` bytes apart) that stay
/// unchanged until the next call of a method taking `&mut self`.
pub unsafe trait CqRing: Send {
    /// Moves up to `wc.len()` ready completions into `wc` and returns how many; fewer (or 0)
    /// when fewer are ready. Must not block, allocate or make a system call.
    fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize;

    /// Where the ready completions are, to be read in place. Must not block, allocate or
    /// make a system call.
    fn ready_run(&mut self) -> ReadyRun;

    /// Hands the first `n` ready completions back to the device.
    fn consume(&mut self, n: usize);

    /// Resizes: runs RESIZE_CQ through `kernel` (which returns the granted size) and moves to
    /// the new ring, keeping queued completions.
    fn resize(&mut self, kernel: KernelCall<'_, u32>) -> Result<()>;
}

/// Ready completions in place (see [`CqRing::ready_run`]): `len` of them, `stride` bytes
/// apart, the first `before_wrap` from `first` and the rest from `wrapped`, where a ring
/// starts again. A provider whose device does not write `WorkCompletion`s translates into a
/// scratch array of its own and describes that.
#[derive(Debug, Clone, Copy)]
pub struct ReadyRun {
    /// The first ready completion.
    pub first: NonNull<WorkCompletion>,
    /// How many follow one another from `first` (at most `len`).
    pub before_wrap: usize,
    /// Where the rest continue.
    pub wrapped: NonNull<WorkCompletion>,
    /// How many are ready in all.
    pub len: usize,
    /// Bytes from one completion to the next.
    pub stride: usize,
}

impl ReadyRun {
    /// No completions.
    pub fn empty() -> Self {
        Self {
            first: NonNull::dangling(),
            before_wrap: 0,
            wrapped: NonNull::dangling(),
            len: 0,
            stride: size_of::<WorkCompletion>(),
        }
    }
}

/// The producer side of a shared receive queue.
pub trait SrqQueue: Send {
    /// Writes `wrs` into the SRQ; same contract as [`QpQueues::post_recv`].
    ///
    /// # Safety
    /// See [`crate::Srq::post_recv`].
    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()>;

    /// Runs MODIFY_SRQ through `kernel` with the driver's request bytes; when `resize` is
    /// set the kernel moves the SRQ to a new ring, which the provider then adopts.
    fn modify(&mut self, resize: bool, kernel: KernelInput<'_>) -> Result<()>;
}

/// The producer side of a QP's send and receive queues.
pub trait QpQueues: Send {
    /// Writes `wrs` into the send queue in order and rings the doorbell once. On a rejected
    /// request returns [`crate::Error::WorkRequest`] with its index, after ringing the
    /// doorbell for those before it.
    ///
    /// # Safety
    /// See [`crate::Qp::post_send`].
    unsafe fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<()>;

    /// Writes `wrs` into the receive queue in order; same error contract as `post_send`.
    ///
    /// # Safety
    /// See [`crate::Qp::post_recv`].
    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()>;
}

/// Runs a provider's create step around the core's kernel command, destroying the kernel
/// object again if the provider fails after the command succeeded.
pub(crate) fn create_object<C: Copy, R>(
    verb: crate::error::Verb,
    provider_step: impl FnOnce(KernelCall<'_, C>) -> Result<R>,
    mut kernel: impl FnMut(&[u8], &mut [u8]) -> Result<C>,
    destroy: impl FnOnce(C),
) -> Result<(C, R)> {
    let mut created = None;
    let result = provider_step(&mut |drv_in, drv_out| {
        let c = kernel(drv_in, drv_out)?;
        created = Some(c);
        Ok(c)
    });
    match (result, created) {
        (Ok(r), Some(c)) => Ok((c, r)),
        (Ok(_), None) => Err(crate::Error::malformed(verb, "provider never ran the command")),
        (Err(e), created) => {
            created.map(destroy);
            Err(e)
        }
    }
}
