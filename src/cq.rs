//! Completion queues.

use crate::context::{Context, ContextInner};
use crate::error::Result;
use crate::provider::{create_object, CqCreated, CqRing};
use crate::sys::abi::DestroyCqResp;
use crate::sys::ioctl::{object, UHW_IN, UHW_OUT};
use crate::wc::WorkCompletion;
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use zerocopy::IntoBytes;

const METHOD_CQ_CREATE: u16 = 0;
const METHOD_CQ_DESTROY: u16 = 1;

/// The kernel CQ and its ring. QPs hold an `Arc` of this to keep the CQ alive; only the unique
/// [`Cq`] handle touches the ring.
pub(crate) struct CqInner {
    pub(crate) ctx: Arc<ContextInner>,
    pub(crate) handle: u32,
    cqe: u32,
    ring: UnsafeCell<Box<dyn CqRing>>,
}

// SAFETY: `ring` is only accessed through `Cq::poll(&mut self)`, and there is exactly one `Cq`
// per `CqInner`; everything else in it is immutable. So sharing the `Arc` across threads
// (QPs holding it) never shares the ring.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // Runs after every QP using the CQ is gone (they hold this `Arc`). Kernel destroy
        // first; the ring is unmapped after, when the field drops.
        destroy_cq(&self.ctx, self.handle);
    }
}

fn destroy_cq(ctx: &ContextInner, handle: u32) {
    let mut resp = DestroyCqResp::default();
    let _ = ctx.destroy(
        "DESTROY_CQ",
        object::CQ,
        METHOD_CQ_DESTROY,
        handle,
        resp.as_mut_bytes(),
    );
}

/// A completion queue. Polling takes `&mut self`: a CQ has one consumer, so the ring needs no
/// lock. The handle is `Send` (move it to the polling thread) but not `Sync`.
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("handle", &self.inner.handle)
            .field("cqe", &self.inner.cqe)
            .finish()
    }
}

impl Cq {
    pub(crate) fn new(ctx: &Context, cqe: u32) -> Result<Self> {
        let inner = &ctx.inner;
        let (created, ring) = create_object(
            "CREATE_CQ",
            |kernel| inner.provider.create_cq(cqe, kernel),
            |drv_in, drv_out| {
                let (mut resp_cqe, user_handle, comp_vector) = (0u32, 0u64, 0u32);
                let mut call = inner.ioctl(object::CQ, METHOD_CQ_CREATE);
                let handle = call.new_handle(0);
                call.input(1, &cqe)
                    .input(2, &user_handle)
                    .input(4, &comp_vector)
                    .output(6, resp_cqe.as_mut_bytes())
                    .fd(7, inner.async_fd.as_raw_fd());
                if !drv_in.is_empty() {
                    call.input(UHW_IN, drv_in);
                }
                if !drv_out.is_empty() {
                    call.output(UHW_OUT, drv_out);
                }
                let done = call.execute(inner.fd(), "CREATE_CQ")?;
                Ok(CqCreated {
                    handle: done.handle(handle),
                    cqe: resp_cqe,
                })
            },
            |c| destroy_cq(inner, c.handle),
        )?;
        Ok(Self {
            inner: Arc::new(CqInner {
                ctx: inner.clone(),
                handle: created.handle,
                cqe: created.cqe,
                ring: UnsafeCell::new(ring),
            }),
            _not_sync: PhantomData,
        })
    }

    /// Moves up to `wc.len()` ready completions into `wc` and returns how many: fewer than
    /// asked (possibly 0) when fewer are ready, as `ibv_poll_cq(3)`. Never blocks, allocates or
    /// makes a system call.
    #[inline]
    pub fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
        // SAFETY: `&mut self` on the only `Cq` for this `CqInner` gives exclusive access to
        // the ring (see `CqInner`'s `Sync` impl).
        unsafe { (*self.inner.ring.get()).poll(wc) }
    }

    /// Capacity the kernel granted.
    pub fn capacity(&self) -> u32 {
        self.inner.cqe
    }

    /// The kernel's handle.
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }
}
