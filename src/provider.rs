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

use crate::attr::{AhAttr, QpCap, QpState, QpType};
use crate::chain::SendChain;
use crate::device::{DeviceFile, DeviceInfo};
use crate::error::{Error, Result};
use crate::wc::WorkCompletion;
use crate::wr::{ContextId, RecvWr, SendWr};
use std::any::Any;
use std::mem::MaybeUninit;
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
    /// the kernel call returns the AH's handle. Returns a value the provider reads back from
    /// the AH when posting UD sends (an index or an address of its own); the core hands it
    /// to [`Self::destroy_ah`] once.
    fn create_ah(&self, attr: &AhAttr, kernel: KernelCall<'_, u32>) -> Result<u64>;

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

    /// [`QpQueues::post_send_chain`] of a batch made by libibverbs' extended QP builders
    /// (`ibv_wr_*`, completed with `ibv_wr_complete`), which a C provider may write with fewer
    /// checks than `ibv_post_send`'s: a provider checks what its C twin's builders and
    /// `ibv_wr_complete` check. This default is [`QpQueues::post_send_chain`].
    ///
    /// # Safety
    /// As for [`QpQueues::post_send_chain`].
    unsafe fn post_send_batch(
        &mut self,
        chain: SendChain<'_>,
        qp_type: QpType,
        context: ContextId,
        state: QpState,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.post_send_chain(chain, qp_type, context, state) }
    }

    /// [`QpQueues::post_send`] of a chain of requests in libibverbs' layout, `qp_type` being
    /// the QP's and `state` its state as the core last knew it: the same order, doorbells and
    /// error contract, indices counted from the chain's first request. A provider reads each
    /// request as it writes it (`SendChain::next`) and checks what its C twin checks
    /// (`crate::chain`), the state included (rxe writes in any state, as librxe: the kernel's
    /// doorbell refuses below RTS); this default refuses sends below RTS as
    /// [`crate::Qp::post_send`] does, and gathers the requests into lists of up to 32 for
    /// `post_send`.
    ///
    /// # Safety
    /// See [`crate::Qp::post_send_chain`]; a UD request's AH must be of `context`, the QP's
    /// (`SlowWr::read` checks).
    unsafe fn post_send_chain(
        &mut self,
        mut chain: SendChain<'_>,
        qp_type: QpType,
        context: ContextId,
        state: QpState,
    ) -> Result<()> {
        if state < QpState::Rts {
            return Err(Error::WorkRequest {
                verb: "post_send",
                index: 0,
                reason: crate::error::WrReject::WrongState(state),
            });
        }
        const BATCH: usize = 32;
        let mut room = [const { MaybeUninit::<SendWr<'_>>::uninit() }; BATCH];
        let mut before = 0;
        loop {
            let (mut n, mut refused) = (0, None);
            while n < BATCH {
                match chain
                    .next(qp_type)
                    .map(|wr| wr.and_then(|wr| wr.to_send_wr(qp_type, context)))
                {
                    None => break,
                    Some(Ok(wr)) => {
                        room[n].write(wr);
                        n += 1;
                    }
                    Some(Err(reason)) => {
                        refused = Some(reason);
                        break;
                    }
                }
            }
            // SAFETY: the first `n` were written above (`MaybeUninit<T>` has `T`'s layout).
            let wrs = unsafe { &*(std::ptr::from_ref(&room[..n]) as *const [SendWr<'_>]) };
            if n > 0 {
                // SAFETY: forwarded caller contract.
                unsafe { self.post_send(SendList::new(wrs)) }.map_err(|e| match e {
                    Error::WorkRequest { verb, index, reason } => Error::WorkRequest {
                        verb,
                        index: before + index,
                        reason,
                    },
                    e => e,
                })?;
            }
            if let Some(reason) = refused {
                return Err(Error::WorkRequest {
                    verb: "post_send",
                    index: before + n,
                    reason,
                });
            }
            if n < BATCH {
                return Ok(());
            }
            before += n;
        }
    }

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

#[cfg(test)]
#[allow(unsafe_code)] // a test provider implementing the unsafe trait
mod tests {
    use super::*;
    use crate::chain::{CRdmaArm, CSendArm, CSendWr};
    use crate::error::WrReject;
    use crate::wr::{ContextId, SendFlags, WrOpcode};

    /// A signaled send with no buffers, in libibverbs' layout.
    fn send() -> CSendWr {
        CSendWr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: WrOpcode::SEND.0,
            send_flags: SendFlags::SIGNALED.bits(),
            imm_data: 0,
            wr: CSendArm::rdma(CRdmaArm {
                remote_addr: 0,
                rkey: 0,
            }),
        }
    }

    /// Sends of a connected QP are read in place: the slow path is never taken.
    unsafe fn never(_: NonNull<CSendWr>, _: QpType) -> Option<SendWr<'static>> {
        unreachable!("sends are read in place")
    }

    /// Records the `wr_id`s `post_send` takes, per call; refuses one of them as a full queue.
    struct Recorder {
        calls: Vec<Vec<u64>>,
        full_at: Option<u64>,
    }

    // SAFETY: no kernel data; nothing is written anywhere.
    unsafe impl QpQueues for Recorder {
        unsafe fn post_send(&mut self, wrs: crate::wr::SendList<'_, '_>) -> crate::Result<()> {
            let mut call = Vec::new();
            let mut result = Ok(());
            for (index, wr) in wrs.iter(QpType::Rc).enumerate() {
                let reason = match wr {
                    Ok(wr) if Some(wr.wr_id) != self.full_at => {
                        call.push(wr.wr_id);
                        continue;
                    }
                    Ok(_) => WrReject::QueueFull,
                    Err(reason) => reason,
                };
                result = Err(crate::Error::WorkRequest {
                    verb: "post_send",
                    index,
                    reason,
                });
                break;
            }
            self.calls.push(call);
            result
        }

        unsafe fn post_recv(&mut self, _: &[crate::wr::RecvWr<'_>]) -> crate::Result<()> {
            unreachable!("sends only")
        }

        fn send_room(&mut self) -> u32 {
            unreachable!("sends only through post_send")
        }

        fn modify(&mut self, _: Option<crate::attr::QpState>, _: KernelCall<'_, ()>) -> crate::Result<()> {
            unreachable!("sends only")
        }

        fn destroyed(&mut self) {}
    }

    /// The default `post_send_chain` (providers without an in-place writer): lists of 32, one
    /// `post_send` each, and errors indexed from the chain's first request, whether the
    /// provider refused a request, the core's transport rules did (the `SendList`) or the
    /// chain could not read it; nothing below RTS.
    #[test]
    fn default_post_send_chain_gathers_lists_and_counts_from_the_first() {
        let post_in = |chain: &mut Vec<CSendWr>, full_at, state| {
            // Linked through one raw pointer to the array: a reference to an element taken
            // after a link was made would invalidate it (Stacked Borrows).
            let base = chain.as_mut_ptr();
            for i in 1..chain.len() {
                // SAFETY: `i - 1` and `i` are elements of the array.
                unsafe { (*base.add(i - 1)).next = base.add(i) };
            }
            let mut qp = Recorder {
                calls: Vec::new(),
                full_at,
            };
            // SAFETY: the test's chain, live and unchanged for the call.
            let result = unsafe {
                let chain = SendChain::new(NonNull::new_unchecked(base), never);
                qp.post_send_chain(chain, QpType::Rc, ContextId(0), state)
            };
            let index = result.map_err(|e| match e {
                crate::Error::WorkRequest { index, reason, .. } => (index, reason),
                e => panic!("{e}"),
            });
            (qp.calls.iter().map(Vec::len).collect::<Vec<_>>(), index)
        };
        let post = |chain: &mut Vec<CSendWr>, full_at| post_in(chain, full_at, QpState::Rts);
        let sends = || -> Vec<CSendWr> { (0..70).map(|i| CSendWr { wr_id: i, ..send() }).collect() };
        assert_eq!(post(&mut sends(), None), (vec![32, 32, 6], Ok(())));
        assert_eq!(
            post(&mut sends(), Some(40)),
            (vec![32, 8], Err((40, WrReject::QueueFull)))
        );
        let mut chain = sends();
        chain[50].num_sge = -1;
        assert_eq!(post(&mut chain, None), (vec![32, 18], Err((50, WrReject::Malformed))));
        let mut chain = sends();
        chain[64].num_sge = -1;
        assert_eq!(post(&mut chain, None), (vec![32, 32], Err((64, WrReject::Malformed))));
        let mut chain = sends();
        chain[45].opcode = crate::wr::WrOpcode::RDMA_READ.0;
        chain[45].send_flags |= crate::wr::SendFlags::INLINE.bits();
        assert_eq!(
            post(&mut chain, None),
            (vec![32, 13], Err((45, WrReject::OpcodeNotSupported)))
        );
        assert_eq!(
            post_in(&mut sends(), None, QpState::Init),
            (vec![], Err((0, WrReject::WrongState(QpState::Init)))),
            "below RTS"
        );
    }
}
