//! Completion queues.

use crate::batch::Batch;
use crate::context::{Context, ContextInner, CqFlags, CqWatch, WatchedCq};
use crate::error::{Error, Result};
use crate::event::CompChannel;
use crate::parked::Parked;
use crate::provider::{create_object, CqCreated, CqRing, ReadyRun, ResizeCqCall};
use crate::sys::abi::{self, DestroyCqResp, ReqNotifyCq, ResizeCq, ResizeCqResp};
use crate::sys::cmd;
use crate::sys::fork::Owner;
use crate::sys::ioctl::{object, UHW_IN, UHW_OUT};
use crate::wc::WorkCompletion;
use std::any::Any;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use zerocopy::IntoBytes;

const METHOD_CQ_CREATE: u16 = 0;
const METHOD_CQ_DESTROY: u16 = 1;

/// How to create a CQ.
#[derive(Debug, Clone, Copy)]
pub struct CqInit<'a> {
    /// Least number of entries.
    pub cqe: u32,
    /// Channel that receives this CQ's completion events.
    pub channel: Option<&'a CompChannel>,
    /// Completion vector (below [`Context::num_comp_vectors`]).
    pub comp_vector: u32,
    /// The value naming the CQ in events; `None` picks a fresh one.
    pub user_handle: Option<u64>,
}

impl CqInit<'_> {
    /// `cqe` entries, no channel, vector 0.
    pub fn new(cqe: u32) -> Self {
        Self {
            cqe,
            channel: None,
            comp_vector: 0,
            user_handle: None,
        }
    }
}

/// The kernel CQ. QPs hold an `Arc` of this to keep the CQ alive; the ring belongs to the
/// unique [`Cq`] handle while it lives, then to this, until the kernel CQ is destroyed.
///
/// It exists from before the kernel CQ is created (the event readers watch it from the
/// start, through a `Weak`), so the kernel's handle is set once the kernel answered.
pub(crate) struct CqInner {
    pub(crate) ctx: Arc<ContextInner>,
    handle: AtomicU32,
    user_handle: u64,
    /// The channel, kept open while the kernel may send events to it.
    channel: Option<CompChannel>,
    /// Its completion events and overrun flag, which the channel's and the context's event
    /// readers set (`CqWatch`).
    flags: CqFlags,
    /// The provider's half, once the [`Cq`] handle is gone: the device may write into it
    /// until the kernel CQ is destroyed.
    parked: Parked<dyn CqRing>,
    /// Set while there is no kernel CQ to destroy: until it is created, and once an explicit
    /// [`Cq::destroy`] succeeded, so `Drop` does not repeat it.
    destroyed: AtomicBool,
}

impl CqInner {
    /// The kernel's handle.
    #[inline]
    pub(crate) fn handle(&self) -> u32 {
        self.handle.load(Ordering::Relaxed)
    }
}

impl CqWatch for CqInner {
    fn cq_flags(&self) -> &CqFlags {
        &self.flags
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // Runs after every QP using the CQ is gone (they hold this `Arc`), possibly in an
        // event reader that held the last reference for a moment.
        let gone = self.destroyed.load(Ordering::Relaxed) || destroy_cq(&self.ctx, self.handle()).is_ok();
        self.parked.release(gone);
        if let Some(channel) = &self.channel {
            channel.forget_dead_cqs();
        }
    }
}

fn destroy_cq(ctx: &ContextInner, handle: u32) -> Result<DestroyCqResp> {
    let mut resp = DestroyCqResp::default();
    ctx.destroy("DESTROY_CQ", object::CQ, METHOD_CQ_DESTROY, handle, resp.as_mut_bytes())?;
    Ok(resp)
}

/// What the kernel had reported for an object when it was destroyed: hosts that hand events
/// out by reference (libibverbs' `ibv_ack_*_events`) wait until as many were acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventsReported {
    /// Completion events delivered on the CQ's channel.
    pub comp: u32,
    /// Async events delivered for the object.
    pub r#async: u32,
}

/// A completion queue. Polling takes `&mut self`: a CQ has one consumer, so the ring needs no
/// lock. The handle is `Send` (move it to the polling thread) but not `Sync`.
///
/// **Overrun.** A CQ must hold every completion that can be outstanding in it: when one more
/// arrives the device drops it (and, depending on the device, those after it) and raises a
/// `CQ_ERR` async event; `ibv_poll_cq(3)` says the CQ cannot be used after that. The ring
/// itself shows nothing, so [`Cq::poll`] and [`Cq::batch`] (pure ring reads, for the hot
/// path) go on returning what fit and then nothing. [`Cq::try_poll`] returns what fit and
/// then [`Error::CqOverrun`], looking at the async events only when the ring is empty;
/// [`Cq::check`] looks on demand; `aio::AsyncCq::poll` ends with the error. None of
/// them takes an event away from [`Context::get_async_event`].
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
    /// The provider's half; parked in `inner` when this handle drops, so it is released only
    /// after the kernel CQ is destroyed.
    ring: Box<dyn CqRing>,
    owner: Owner,
    cqe: u32,
    /// Empty [`Cq::try_poll`]s so far, which look at the async event file every
    /// [`LOOK_EVERY`]th time.
    empty_polls: u32,
}

/// How often an empty [`Cq::try_poll`] looks for an overrun event: one `poll(2)` in this many
/// empty calls, the first one included.
const LOOK_EVERY: u32 = 64;

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("handle", &self.inner.handle())
            .field("cqe", &self.cqe)
            .finish()
    }
}

impl Context {
    /// Creates a completion queue of at least `cqe` entries, with no completion channel.
    pub fn create_cq(&self, cqe: u32) -> Result<Cq> {
        Cq::new(self, &CqInit::new(cqe))
    }

    /// Creates a completion queue as `init` says.
    pub fn create_cq_with(&self, init: &CqInit<'_>) -> Result<Cq> {
        Cq::new(self, init)
    }
}

impl Cq {
    fn new(ctx: &Context, init: &CqInit<'_>) -> Result<Self> {
        let inner = &ctx.inner;
        // Before the provider's step: its memory (mlx5's doorbell pages) is not mapped in a
        // forked child.
        inner.check_owner("CREATE_CQ")?;
        let user_handle = init.user_handle.unwrap_or_else(|| inner.new_user_handle());
        // No kernel CQ yet (`destroyed`); dropped on a failure below, it only prunes the
        // watch lists.
        let cq = Arc::new(CqInner {
            ctx: inner.clone(),
            handle: AtomicU32::new(0),
            user_handle,
            channel: init.channel.cloned(),
            flags: CqFlags::default(),
            parked: Parked::new(),
            destroyed: AtomicBool::new(true),
        });
        let watched = || -> WatchedCq {
            let cq: Arc<dyn CqWatch> = cq.clone();
            Arc::downgrade(&cq)
        };
        if let Some(channel) = init.channel {
            channel.watch_cq(user_handle, watched())?;
        }
        inner.watch_cq_overrun(user_handle, watched());
        let (created, ring) = create_object(
            "CREATE_CQ",
            |kernel| inner.provider.create_cq(init.cqe, kernel),
            |cqe: u32, drv_in: &[u8], drv_out: &mut [u8]| {
                let mut resp_cqe = 0u32;
                let mut call = inner.ioctl(object::CQ, METHOD_CQ_CREATE);
                let handle = call.new_handle(0);
                call.input(1, &cqe)
                    .input(2, &user_handle)
                    .input(4, &init.comp_vector)
                    .output(6, resp_cqe.as_mut_bytes())
                    .fd(7, inner.async_events.kernel().as_raw_fd());
                if let Some(channel) = init.channel {
                    call.fd(3, channel.as_raw_fd());
                }
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
            |c| drop(destroy_cq(inner, c.handle)),
        )?;
        cq.handle.store(created.handle, Ordering::Relaxed);
        cq.destroyed.store(false, Ordering::Relaxed);
        Ok(Self {
            inner: cq,
            ring,
            owner: inner.owner,
            cqe: created.cqe,
            empty_polls: 0,
        })
    }

    /// Moves up to `wc.len()` ready completions into `wc` and returns how many: fewer than
    /// asked (possibly 0) when fewer are ready, as `ibv_poll_cq(3)`. Never blocks, allocates or
    /// makes a system call.
    ///
    /// More completions than the CQ holds overrun it: those that do not fit are lost, and
    /// `poll` still returns the ones that fit, and then nothing, without a word: it is a pure
    /// ring read. [`Cq::try_poll`] is the same read and tells.
    ///
    /// In a forked child the CQ is the parent's and its ring is not mapped: this returns 0.
    #[inline]
    pub fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
        if self.owner.forked() {
            return 0;
        }
        self.ring.poll(wc)
    }

    /// [`Cq::poll`], and [`Error::CqOverrun`] once the CQ overran and nothing is left in it:
    /// the poll to use unless you watch async events yourself.
    ///
    /// The completions that fit before an overrun are returned first, as `poll` does. Only
    /// when a call finds the ring empty does it look further (the cold path, so a call that
    /// returns completions costs what `poll` costs): it tests the CQ's overrun flag, and on
    /// the first empty call and every 64th after it, also reads the async events pending on
    /// the context's file without waiting (one `poll(2)` when there are none), so a `CQ_ERR`
    /// is seen though nobody calls [`Context::get_async_event`]. Events read that way are
    /// not lost: `get_async_event` still returns them, and [`Context::async_fd`] stays
    /// readable until it has. [`Cq::check`] looks at once.
    ///
    /// In a forked child: [`Error::Forked`].
    #[inline]
    pub fn try_poll(&mut self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let n = self.poll(wc);
        if n == 0 {
            self.check_empty()?;
        }
        Ok(n)
    }

    /// `try_poll`'s look when the ring was empty.
    #[cold]
    fn check_empty(&mut self) -> Result<()> {
        self.owner.check("poll_cq")?;
        let look = self.empty_polls % LOOK_EVERY == 0;
        self.empty_polls = self.empty_polls.wrapping_add(1);
        if look {
            self.check()
        } else {
            self.check_flag()
        }
    }

    /// Which CQ this is, for [`crate::Qp::reclaim`]: the address of the shared state every
    /// QP on it keeps alive, so no live QP's CQ shares it with another.
    #[inline]
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Borrows the ready completions in place, without copying them out of the ring (the
    /// Rust form of `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`). The ring slots are
    /// handed back to the device, with one index store, when the batch is dropped: only the
    /// completions the iterator yielded are consumed.
    ///
    /// A ring read like [`Cq::poll`]: after an overrun it still yields what fit, then empty
    /// batches. Call [`Cq::check`] when a batch comes back empty to learn of an overrun.
    #[inline]
    pub fn batch(&mut self) -> Batch<'_> {
        let run = if self.owner.forked() {
            ReadyRun::empty()
        } else {
            self.ring.ready_run()
        };
        Batch::new(&mut *self.ring, run)
    }

    /// Whether the CQ overran: completions were lost because more arrived than it holds.
    /// `ibv_poll_cq(3)`: the CQ cannot be used after that; work requests that completed into
    /// it are unaccounted for. Size a CQ for every work request that can complete into it.
    ///
    /// The device says so with a `CQ_ERR` async event; this is `true` once that event has
    /// been read off the context's async event file, by [`Context::get_async_event`] or by a
    /// check ([`Cq::try_poll`], [`Cq::check`], `aio::AsyncCq::poll`), on any clone of
    /// the context, in any thread. It makes no system call and reads nothing itself.
    pub fn overrun(&self) -> bool {
        self.inner.flags.overrun.load(Ordering::Relaxed)
    }

    /// [`Error::CqOverrun`] if the CQ overran: reads the async events pending on the
    /// context's file without waiting (they stay for [`Context::get_async_event`]), so it
    /// knows without anyone reading events. One `poll(2)` when none is pending. For a poller
    /// of [`Cq::poll`] or [`Cq::batch`], when it comes back empty.
    ///
    /// An overrun's event may lag the ring on some devices: a check that passes as the last
    /// completions are read may be followed by the event. A waiter that must not wait forever
    /// on a CQ that overran also watches [`Context::async_fd`] (`aio::AsyncCq` does).
    pub fn check(&self) -> Result<()> {
        self.check_flag()?;
        self.owner.check("poll_cq")?;
        self.inner.ctx.read_async_events_ahead()?;
        self.check_flag()
    }

    /// [`Error::CqOverrun`] if the CQ's overrun flag is set ([`Cq::overrun`]).
    fn check_flag(&self) -> Result<()> {
        if self.overrun() {
            return Err(Error::CqOverrun {
                cq_user_handle: self.inner.user_handle,
            });
        }
        Ok(())
    }

    /// Asks for an event on the CQ's channel at the next completion (or the next solicited
    /// one). One event per request: call again after each event. Fails with
    /// [`Error::CqOverrun`] once [`Cq::overrun`] is set; it reads no async events itself
    /// (a host such as libibverbs may read the kernel's file): call [`Cq::check`] before
    /// waiting on the channel.
    pub fn req_notify(&mut self, solicited_only: bool) -> Result<()> {
        self.owner.check("REQ_NOTIFY_CQ")?;
        self.check_flag()?;
        let events = self.inner.flags.events.load(Ordering::Relaxed);
        let (ctx, handle) = (&self.inner.ctx, self.inner.handle());
        self.ring.arm(solicited_only, events, &mut || {
            let req = ReqNotifyCq {
                cq_handle: handle,
                solicited_only: u32::from(solicited_only),
            };
            ctx.write_cmd("REQ_NOTIFY_CQ", abi::cmd::REQ_NOTIFY_CQ, &req)
        })
    }

    /// Resizes the CQ to at least `cqe` entries, keeping the completions it holds.
    ///
    /// Some devices mark the switch with an entry of their own in the old ring: there a CQ
    /// whose ring is full is refused ([`Error::InvalidArgument`], the CQ unchanged); poll,
    /// then resize. That check sees the completions queued when it runs: where a QP can still
    /// complete into the CQ during the resize, the ring can fill after it and the resize fails
    /// with [`Error::Malformed`], the completions queued lost; resize a CQ nothing completes
    /// into meanwhile.
    pub fn resize(&mut self, cqe: u32) -> Result<()> {
        self.owner.check("RESIZE_CQ")?;
        let ctx = self.inner.ctx.clone();
        let handle = self.inner.handle();
        self.cqe = self.ring.resize(cqe, &mut |cqe, drv_in, drv_out| {
            let req = ResizeCq {
                response: 0,
                cq_handle: handle,
                cqe,
            };
            let resp: ResizeCqResp =
                cmd::execute_plain(ctx.fd(), "RESIZE_CQ", abi::cmd::RESIZE_CQ, &req, drv_in, drv_out)?;
            Ok(resp.cqe)
        })?;
        Ok(())
    }

    /// Destroys the CQ now and reports the kernel's answer. Dropping a `Cq` destroys it too,
    /// but only once no QP uses it; this asks the kernel at once, and if it refuses (EBUSY
    /// while a QP still uses the CQ) hands the CQ back, unchanged and usable, with the error.
    pub fn destroy(self) -> std::result::Result<EventsReported, (Self, crate::Error)> {
        match destroy_cq(&self.inner.ctx, self.inner.handle()) {
            Ok(r) => {
                self.inner.destroyed.store(true, Ordering::Relaxed);
                Ok(EventsReported {
                    comp: r.comp_events_reported,
                    r#async: r.async_events_reported,
                })
            }
            Err(e) => Err((self, e)),
        }
    }

    /// The provider's half, for linking a new QP to it.
    pub(crate) fn ring(&self) -> &dyn CqRing {
        &*self.ring
    }

    /// Capacity the kernel granted.
    pub fn capacity(&self) -> u32 {
        self.cqe
    }

    /// The kernel's handle.
    pub fn handle(&self) -> u32 {
        self.inner.handle()
    }

    /// The value naming this CQ in [`crate::CqEvent`]s and [`crate::AsyncEvent`]s.
    pub fn user_handle(&self) -> u64 {
        self.inner.user_handle
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        let ring = std::mem::replace(&mut self.ring, Box::new(NoRing));
        self.inner.parked.park(ring);
    }
}

/// What a [`Cq`] handle holds in place of its ring while dropping (a zero-sized box: no
/// allocation).
pub(crate) struct NoRing;

#[allow(unsafe_code)]
// SAFETY: `ready_run` describes no completions.
unsafe impl CqRing for NoRing {
    fn poll(&mut self, _: &mut [WorkCompletion]) -> usize {
        0
    }

    fn ready_run(&mut self) -> ReadyRun {
        ReadyRun::empty()
    }

    fn consume(&mut self, _: usize) {}

    fn resize(&mut self, _: u32, _: ResizeCqCall<'_>) -> Result<u32> {
        Err(Error::invalid("RESIZE_CQ", "the CQ is being dropped"))
    }

    fn arm(&mut self, _: bool, _: u32, _: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        Err(Error::invalid("REQ_NOTIFY_CQ", "the CQ is being dropped"))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
