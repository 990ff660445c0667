//! The contract between the vendor-neutral core and a vendor module under `providers/`.
//!
//! The core runs every kernel command itself; a provider only supplies what is vendor
//! specific. Object creation follows one shape for every object: the core hands the provider a
//! *kernel call* closure, the provider prepares whatever the driver needs (user-allocated ring
//! buffers and doorbell records whose addresses go in the driver request, as on mlx5, or
//! nothing, as on rxe), calls the closure with the core values it controls (a CQ's size, a
//! QP's capabilities), its driver request bytes and a buffer for the driver response, and then
//! finishes from the response (mapping kernel-allocated rings from mmap cookies, as on rxe, or
//! recording the hardware object number, as on mlx5).
//!
//! Memory: if the provider fails after the kernel call succeeded, the core destroys the kernel
//! object; the provider only releases what it allocated itself. The provider's half of an
//! object (ring, queue, address vector) is released only after the kernel destroy of that
//! object succeeded, whatever order the user drops handles in: a CQ or SRQ handle dropped
//! while QPs still use the kernel object parks its half until the last QP is gone. If the
//! kernel refuses a destroy, the half is leaked, never freed under a live kernel object.
//!
//! The data path (poll, post) is a call through the provider's trait object per *batch*, never
//! per completion or work request. `docs/provider-contract.md` maps rxe and mlx5 onto this.

#[cfg(feature = "test-support")]
#[allow(unsafe_code)] // implements the unsafe provider traits
pub mod stub;

use crate::attr::{AhAttr, GidType, QpCap, QpState, QpType};
use crate::device::{DeviceFile, DeviceInfo};
use crate::error::Result;
use crate::wc::WorkCompletion;
use crate::wr::RecvWr;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;

/// What [`QpQueues::post_send`] takes.
pub use crate::wr::SendList;

/// Runs a kernel command with the provider's driver request bytes, writing the driver's
/// response bytes into the buffer given, and returns the core results `T`.
pub type KernelCall<'a, T> = &'a mut dyn FnMut(&[u8], &mut [u8]) -> Result<T>;

/// Runs CREATE_CQ asking for `cqe` entries (the core command's value, which the provider
/// chooses: mlx5 asks for its ring size less one), with driver request and response bytes.
pub type CreateCqCall<'a> = &'a mut dyn FnMut(u32, &[u8], &mut [u8]) -> Result<CqCreated>;

/// Runs RESIZE_CQ asking for `cqe` entries (chosen by the provider, as for CREATE_CQ), with
/// driver request and response bytes; returns the size the kernel granted.
pub type ResizeCqCall<'a> = &'a mut dyn FnMut(u32, &[u8], &mut [u8]) -> Result<u32>;

/// Runs CREATE_QP asking for these capabilities (the core command's values, which the
/// provider chooses), with driver request and response bytes.
pub type CreateQpCall<'a> = &'a mut dyn FnMut(QpCap, &[u8], &mut [u8]) -> Result<QpCreated>;

/// Runs a kernel command that takes driver request bytes and returns no driver response.
pub type KernelInput<'a> = &'a mut dyn FnMut(&[u8]) -> Result<()>;

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

/// A QP creation request, as the provider sees it: what the user asked for, and the vendor
/// halves of the queues the QP will use, so that the provider can link them (a CQ's poll
/// finding the QP's work-request ids, say). Each half is the provider's own type behind the
/// trait object: reach it with `as_any().downcast_ref()`.
#[derive(Clone, Copy)]
pub struct QpRequest<'a> {
    /// Transport.
    pub qp_type: QpType,
    /// Capabilities the user asked for.
    pub cap: QpCap,
    /// The send CQ's vendor half.
    pub send_cq: &'a dyn CqRing,
    /// The receive CQ's vendor half (may be the same CQ as `send_cq`).
    pub recv_cq: &'a dyn CqRing,
    /// The SRQ's vendor half, when receives come from an SRQ (then the QP has no receive
    /// queue of its own).
    pub srq: Option<&'a dyn SrqQueue>,
    /// Every send request completes, signaled or not (`sq_sig_all`): rxe's kernel does it
    /// itself, a provider that writes WQEs for the device asks for a CQE in each one.
    pub sq_sig_all: bool,
}

impl std::fmt::Debug for QpRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpRequest")
            .field("qp_type", &self.qp_type)
            .field("cap", &self.cap)
            .field("srq", &self.srq.is_some())
            .field("sq_sig_all", &self.sq_sig_all)
            .finish_non_exhaustive()
    }
}

/// The vendor half of a new QP.
pub struct ProviderQp {
    /// Its queues.
    pub queues: Box<dyn QpQueues>,
    /// The capabilities the user is told the QP has: the provider's own limits where they are
    /// tighter than what the kernel granted (its WQE layout decides them).
    pub cap: QpCap,
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

/// Per-context vendor state: makes the vendor halves of CQs, QPs, SRQs and AHs, and passes
/// driver data on the commands that carry it.
///
/// # Safety
/// Driver request bytes a provider passes to a kernel call (here and in the halves it makes)
/// may contain user addresses: ring buffers and doorbell records on mlx5, a buffer for the
/// kernel to fill on rxe's SRQ resize. The implementation guarantees each names live memory
/// of the right size for as long as the kernel may use it: until the call returns for a
/// buffer the kernel fills, until the kernel destroy for rings. The core passes these bytes
/// to the kernel as they are.
#[allow(unsafe_code)] // declares the contract above
pub unsafe trait ProviderContext: Send + Sync {
    /// Runs ALLOC_PD through `kernel` with the driver's data (mlx5 needs a 4-byte response
    /// buffer: it copies its PD number without checking the length).
    fn alloc_pd(&self, kernel: KernelCall<'_, ()>) -> Result<()>;

    /// Runs REG_MR through `kernel` with the driver's data (siw passes 8 bytes each way).
    fn reg_mr(&self, kernel: KernelCall<'_, ()>) -> Result<()>;

    /// Creates the vendor half of a CQ of at least `cqe` entries.
    fn create_cq(&self, cqe: u32, kernel: CreateCqCall<'_>) -> Result<Box<dyn CqRing>>;

    /// Creates the vendor half of a QP.
    fn create_qp(&self, request: &QpRequest<'_>, kernel: CreateQpCall<'_>) -> Result<ProviderQp>;

    /// Creates the vendor half of an SRQ of at least `max_wr` receives of `max_sge` entries
    /// each: the values the core command carries (mlx5 sizes its ring from them as its
    /// kernel driver does).
    fn create_srq(&self, max_wr: u32, max_sge: u32, kernel: KernelCall<'_, SrqCreated>) -> Result<Box<dyn SrqQueue>>;

    /// Creates the vendor half of an address handle for `attr` (what CREATE_AH carries);
    /// the kernel call returns the AH's handle. `sgid_type` is the type of the source GID
    /// (`attr.grh`'s `sgid_index` on `attr.port_num`; [`GidType::IB`] on an InfiniBand
    /// port), `None` for an AH without a GRH. Returns a value the provider reads back from
    /// the AH when posting UD sends (an index or an address of its own); the core hands it
    /// to [`Self::destroy_ah`] once.
    fn create_ah(&self, attr: &AhAttr, sgid_type: Option<GidType>, kernel: KernelCall<'_, u32>) -> Result<u64>;

    /// Releases what [`Self::create_ah`] made, after the kernel destroyed the AH.
    fn destroy_ah(&self, provider_data: u64);

    /// Whether the kernel's DEREG_MR waits for a QP's responder that still holds the region
    /// (a message into it not finished), which only destroying or resetting that QP ends:
    /// the core then deregisters a region peers can access only once every QP of its PD
    /// that was alive when the region was dropped has been destroyed or reset.
    fn dereg_waits_for_responders(&self) -> bool {
        false
    }
}

/// The consumer side of a completion queue. There is exactly one consumer: the core only
/// calls the `&mut self` methods through a handle it hands out uniquely (`&mut`).
///
/// # Safety
/// The core reads the completions [`CqRing::ready_run`] describes through its pointers, so an
/// implementation must make them point at `len` readable, 8-aligned `WorkCompletion`s
/// (`before_wrap` from `first` and the rest from `wrapped`, `stride` bytes apart) that stay
/// unchanged until the next call of a method taking `&mut self`. The addresses in driver bytes
/// it passes to `resize` follow [`ProviderContext`]'s contract.
#[allow(unsafe_code)] // declares the contract above
pub unsafe trait CqRing: Send + Any {
    /// Moves up to `wc.len()` ready completions into `wc` and returns how many; fewer (or 0)
    /// when fewer are ready. Must not block, allocate or make a system call.
    fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize;

    /// Where the ready completions are, to be read in place. Must not block, allocate or
    /// make a system call.
    fn ready_run(&mut self) -> ReadyRun;

    /// Hands the first `n` ready completions back to the device.
    fn consume(&mut self, n: usize);

    /// Resizes to at least `cqe` entries: runs RESIZE_CQ through `kernel` and moves to the new
    /// ring, keeping queued completions; returns the granted size.
    fn resize(&mut self, cqe: u32, kernel: ResizeCqCall<'_>) -> Result<u32>;

    /// Asks for one completion event at the next completion (or the next solicited one).
    /// `events` is how many completion events have been delivered for this CQ so far (mlx5
    /// takes its arm sequence number from it). `kernel` runs the REQ_NOTIFY_CQ command, for
    /// drivers whose arming goes through the kernel (rxe); others arm in user space (mlx5:
    /// the doorbell record and a UAR write) and must not call it.
    fn arm(&mut self, solicited_only: bool, events: u32, kernel: &mut dyn FnMut() -> Result<()>) -> Result<()>;

    /// The provider's own type, for [`QpRequest`] linkage.
    fn as_any(&self) -> &dyn Any;
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
///
/// # Safety
/// The addresses in driver bytes it passes to `modify` follow [`ProviderContext`]'s contract.
#[allow(unsafe_code)] // declares the contract above
pub unsafe trait SrqQueue: Send + Any {
    /// Writes `wrs` into the SRQ; same contract as [`QpQueues::post_recv`].
    ///
    /// # Safety
    /// See [`crate::Srq::post_recv`].
    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()>;

    /// Runs MODIFY_SRQ through `kernel` with the driver's request bytes; when `resize` is
    /// set the kernel moves the SRQ to a new ring, which the provider then adopts.
    fn modify(&mut self, resize: bool, kernel: KernelInput<'_>) -> Result<()>;

    /// The provider's own type, for [`QpRequest`] linkage.
    fn as_any(&self) -> &dyn Any;
}

/// The producer side of a QP's send and receive queues.
///
/// The rules all devices share are checked by the core as the provider takes each send from
/// its [`SendList`]; the provider checks its own limits.
///
/// # Safety
/// The addresses in driver bytes it passes to `modify` follow [`ProviderContext`]'s contract.
#[allow(unsafe_code)] // declares the contract above
pub unsafe trait QpQueues: Send {
    /// Writes `wrs` into the send queue in order and rings the doorbell once. On a rejected
    /// request returns [`crate::Error::WorkRequest`] with its index, after ringing the
    /// doorbell for those before it.
    ///
    /// # Safety
    /// See [`crate::Qp::post_send`].
    unsafe fn post_send(&mut self, wrs: SendList<'_, '_>) -> Result<()>;

    /// How many more send requests the send queue takes now: those posted that the device
    /// has not completed count against its depth. The device only ever frees more. Must not
    /// block, allocate or make a system call.
    fn send_room(&mut self) -> u32;

    /// Writes `wrs` into the receive queue in order; same error contract as `post_send`.
    ///
    /// # Safety
    /// See [`crate::Qp::post_recv`].
    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()>;

    /// Runs MODIFY_QP through `kernel` with the driver's data; once it succeeded, reacts to
    /// the state it moved to (`next`, if the modify changed the state): on RESET a provider
    /// with user-allocated rings resets them and scrubs the QP's completions from its CQs.
    fn modify(&mut self, next: Option<QpState>, kernel: KernelCall<'_, ()>) -> Result<()>;

    /// Told once the kernel destroyed the QP, before the queues are dropped: scrub the QP's
    /// completions from its CQs, free its number in per-context tables.
    fn destroyed(&mut self);
}

/// Runs a provider's create step around the core's kernel command, destroying the kernel
/// object again if the provider fails after the command succeeded. `A` is what the provider
/// chooses of the core command (nothing, a CQ size, QP capabilities).
pub(crate) fn create_object<A, C: Copy, R>(
    verb: crate::error::Verb,
    provider_step: impl FnOnce(&mut dyn FnMut(A, &[u8], &mut [u8]) -> Result<C>) -> Result<R>,
    mut kernel: impl FnMut(A, &[u8], &mut [u8]) -> Result<C>,
    destroy: impl FnOnce(C),
) -> Result<(C, R)> {
    let mut created = None;
    let result = provider_step(&mut |core, drv_in, drv_out| {
        if created.is_some() {
            return Err(crate::Error::malformed(verb, "provider ran the command twice"));
        }
        let c = kernel(core, drv_in, drv_out)?;
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
