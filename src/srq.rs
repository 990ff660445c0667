//! Shared receive queues.

use crate::attr::SrqAttrMask;
use crate::context::ContextInner;
use crate::cq::EventsReported;
use crate::error::{Error, Result};
use crate::held::{SrqHeld, SrqMembers};
use crate::parked::Parked;
use crate::pd::{Pd, PdInner};
use crate::provider::{create_object, KernelInput, SrqCreated, SrqQueue};
use crate::sys::abi::{self, DestroySrqResp, ModifySrq, QuerySrq, QuerySrqResp};
use crate::sys::cmd;
use crate::sys::fork::Owner;
use crate::sys::ioctl::{object, UHW_IN, UHW_OUT};
use crate::wr::RecvWr;
use std::any::Any;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use zerocopy::IntoBytes;

const METHOD_SRQ_CREATE: u16 = 0;
const METHOD_SRQ_DESTROY: u16 = 1;
/// `IB_SRQT_BASIC`.
const SRQ_TYPE_BASIC: u64 = 0;

/// How to create an SRQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqInit {
    /// Least number of outstanding receives.
    pub max_wr: u32,
    /// Scatter/gather entries per receive.
    pub max_sge: u32,
    /// Arm the limit event at this fill level (0: not armed).
    pub srq_limit: u32,
    /// The value naming the SRQ in events; `None` picks a fresh one.
    pub user_handle: Option<u64>,
}

impl SrqInit {
    /// `max_wr` receives of `max_sge` entries, limit not armed.
    pub fn new(max_wr: u32, max_sge: u32) -> Self {
        Self {
            max_wr,
            max_sge,
            srq_limit: 0,
            user_handle: None,
        }
    }
}

/// SRQ attributes as QUERY_SRQ reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Capacity.
    pub max_wr: u32,
    /// Scatter/gather entries per receive.
    pub max_sge: u32,
    /// Armed limit (0 once the limit event fired).
    pub srq_limit: u32,
}

/// The kernel SRQ. QPs hold an `Arc` of this to keep the SRQ alive; the queue belongs to the
/// unique [`Srq`] handle while it lives, then to this, until the kernel SRQ is destroyed.
pub(crate) struct SrqInner {
    pub(crate) pd: Arc<PdInner>,
    pub(crate) handle: u32,
    user_handle: u64,
    /// The provider's half, once the [`Srq`] handle is gone: the device may read and write
    /// it until the kernel SRQ is destroyed.
    parked: Parked<dyn SrqQueue>,
    /// The buffers of the safe receives (`crate::owned`), parked with the queue.
    parked_bufs: Parked<SrqHeld>,
    /// The QPs on it, which the safe receives check completions against.
    pub(crate) members: SrqMembers,
    /// Set once an explicit [`Srq::destroy`] succeeded, so `Drop` does not repeat it.
    destroyed: AtomicBool,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        let gone = self.destroyed.load(Ordering::Relaxed) || destroy_srq(&self.pd.ctx, self.handle).is_ok();
        self.parked.release(gone);
        self.parked_bufs.release(gone);
    }
}

/// Destroys SRQ `handle`; returns how many async events the kernel reported for it.
fn destroy_srq(ctx: &ContextInner, handle: u32) -> Result<u32> {
    let mut resp = DestroySrqResp::default();
    ctx.destroy(
        "DESTROY_SRQ",
        object::SRQ,
        METHOD_SRQ_DESTROY,
        handle,
        resp.as_mut_bytes(),
    )?;
    Ok(resp.events_reported)
}

/// A shared receive queue: QPs created with it take their receives from it. Posting takes
/// `&mut self` (one producer, no lock): [`Srq::recv_buf`] without `unsafe`, giving each buffer
/// back with [`Srq::reclaim`], or the raw [`Srq::post_recv`].
pub struct Srq {
    pub(crate) inner: Arc<SrqInner>,
    /// The provider's half; parked in `inner` when this handle drops, so it is released only
    /// after the kernel SRQ is destroyed.
    pub(crate) queue: Box<dyn SrqQueue>,
    pub(crate) owner: Owner,
    /// The buffers [`Srq::recv_buf`] lent the device; parked like `queue`.
    pub(crate) held: SrqHeld,
    max_wr: u32,
    max_sge: u32,
}

#[allow(unsafe_code)]
// SAFETY: the only part that is not `Sync` is `queue`, and every method that reaches it (or
// the buffers in `held`) takes `&mut self`; through a shared `&Srq` threads only read
// immutable fields and counts and run kernel commands.
unsafe impl Sync for Srq {}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("handle", &self.inner.handle)
            .field("max_wr", &self.max_wr)
            .finish()
    }
}

impl Pd {
    /// Creates an SRQ in this PD.
    pub fn create_srq(&self, init: &SrqInit) -> Result<Srq> {
        let ctx = &self.inner.ctx;
        // Before the provider's step, as for CQs.
        ctx.check_owner("CREATE_SRQ")?;
        let user_handle = init.user_handle.unwrap_or_else(|| ctx.new_user_handle());
        let (created, queue) = create_object(
            "CREATE_SRQ",
            |kernel| {
                ctx.provider
                    .create_srq(init.max_wr, init.max_sge, &mut |drv_in, drv_out| {
                        kernel((), drv_in, drv_out)
                    })
            },
            |(), drv_in: &[u8], drv_out: &mut [u8]| {
                let (mut max_wr, mut max_sge) = (0u32, 0u32);
                let mut call = ctx.ioctl(object::SRQ, METHOD_SRQ_CREATE);
                let handle = call.new_handle(0);
                call.handle(1, self.inner.handle)
                    .input(4, &user_handle)
                    .input(5, &init.max_wr)
                    .input(6, &init.max_sge)
                    .input(7, &init.srq_limit)
                    .input(9, &SRQ_TYPE_BASIC)
                    .fd(10, ctx.async_events.kernel().as_raw_fd())
                    .output(11, max_wr.as_mut_bytes())
                    .output(12, max_sge.as_mut_bytes());
                if !drv_in.is_empty() {
                    call.input(UHW_IN, drv_in);
                }
                if !drv_out.is_empty() {
                    call.output(UHW_OUT, drv_out);
                }
                let done = call.execute(ctx.fd(), "CREATE_SRQ")?;
                Ok(SrqCreated {
                    handle: done.handle(handle),
                    max_wr,
                    max_sge,
                })
            },
            |c| drop(destroy_srq(ctx, c.handle)),
        )?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: self.inner.clone(),
                handle: created.handle,
                user_handle,
                parked: Parked::new(),
                parked_bufs: Parked::new(),
                members: SrqMembers::new(),
                destroyed: AtomicBool::new(false),
            }),
            queue,
            owner: ctx.owner,
            held: SrqHeld::new(created.max_wr),
            max_wr: created.max_wr,
            max_sge: created.max_sge,
        })
    }
}

impl Srq {
    /// Posts receives (no system call). Same contract and errors as [`crate::Qp::post_recv`].
    ///
    /// The safe alternative is [`Srq::recv_buf`].
    ///
    /// # Safety
    /// Until each request completes (or the SRQ is destroyed), the buffers it names must stay
    /// valid and must not be accessed: the device writes incoming data into them. In a
    /// process that uses the safe posts, no `wr_id` may have bit 63 set (as for
    /// [`Qp::post_send`](crate::Qp::post_send)).
    #[allow(unsafe_code)] // forwards the caller\'s contract to the provider
    pub unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.owner.check("post_srq_recv")?;
        // SAFETY: forwarded caller contract.
        unsafe { self.queue.post_recv(wrs) }
    }

    /// Arms the limit: when fewer than `limit` receives remain, the device raises one
    /// `SRQ_LIMIT_REACHED` async event and disarms.
    pub fn arm_limit(&mut self, limit: u32) -> Result<()> {
        self.modify(SrqAttrMask::LIMIT, 0, limit)
    }

    /// Grows the SRQ to at least `max_wr` receives, keeping those posted. [`Srq::recv_buf`]
    /// keeps as many buffers as the SRQ took when created (rounded up to a power of two), no more.
    pub fn resize(&mut self, max_wr: u32) -> Result<()> {
        self.modify(SrqAttrMask::MAX_WR, max_wr, 0)?;
        self.max_wr = self.query()?.max_wr;
        Ok(())
    }

    fn modify(&mut self, attr_mask: SrqAttrMask, max_wr: u32, srq_limit: u32) -> Result<()> {
        self.owner.check("MODIFY_SRQ")?;
        let ctx = self.inner.pd.ctx.clone();
        let req = ModifySrq {
            srq_handle: self.inner.handle,
            attr_mask: attr_mask.bits(),
            max_wr,
            srq_limit,
        };
        self.queue
            .modify(attr_mask.contains(SrqAttrMask::MAX_WR), &mut |drv_in| {
                cmd::execute_plain::<_, ()>(ctx.fd(), "MODIFY_SRQ", abi::cmd::MODIFY_SRQ, &req, drv_in, &mut [])
            })
    }

    /// Reads the attributes back (QUERY_SRQ).
    pub fn query(&self) -> Result<SrqAttr> {
        let req = QuerySrq {
            response: 0,
            srq_handle: self.inner.handle,
            reserved: 0,
        };
        let r: QuerySrqResp = self.inner.pd.ctx.write_cmd("QUERY_SRQ", abi::cmd::QUERY_SRQ, &req)?;
        Ok(SrqAttr {
            max_wr: r.max_wr,
            max_sge: r.max_sge,
            srq_limit: r.srq_limit,
        })
    }

    /// The provider's half, for linking a new QP to it.
    pub(crate) fn queue(&self) -> &dyn SrqQueue {
        &*self.queue
    }

    /// Capacity the kernel granted.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Scatter/gather entries per receive.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The kernel's handle.
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    /// Destroys the SRQ now and reports the kernel's answer: how many async events it reported
    /// for the SRQ. While a QP uses the SRQ the kernel refuses (EBUSY) and the SRQ comes back,
    /// unchanged, with the error.
    #[allow(clippy::result_large_err)] // a cold path that hands the SRQ back whole on failure
    pub fn destroy(self) -> std::result::Result<EventsReported, (Self, crate::Error)> {
        match destroy_srq(&self.inner.pd.ctx, self.inner.handle) {
            Ok(n) => {
                self.inner.destroyed.store(true, Ordering::Relaxed);
                Ok(EventsReported { comp: 0, r#async: n })
            }
            Err(e) => Err((self, e)),
        }
    }

    /// The value naming this SRQ in [`crate::AsyncEvent`]s.
    pub fn user_handle(&self) -> u64 {
        self.inner.user_handle
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        let queue = std::mem::replace(&mut self.queue, Box::new(NoQueue));
        self.inner.parked.park(queue);
        if self.held.len() > 0 {
            let held = std::mem::replace(&mut self.held, SrqHeld::new(0));
            self.inner.parked_bufs.park(Box::new(held));
        }
    }
}

/// What an [`Srq`] handle holds in place of its queue while dropping (a zero-sized box: no
/// allocation).
pub(crate) struct NoQueue;

#[allow(unsafe_code)]
// SAFETY: no kernel call, no driver bytes.
unsafe impl SrqQueue for NoQueue {
    unsafe fn post_recv(&mut self, _: &[RecvWr<'_>]) -> Result<()> {
        Err(Error::invalid("post_srq_recv", "the SRQ is being dropped"))
    }

    fn modify(&mut self, _: bool, _: KernelInput<'_>) -> Result<()> {
        Err(Error::invalid("MODIFY_SRQ", "the SRQ is being dropped"))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
