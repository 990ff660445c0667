//! Async I/O on tokio (feature `tokio`): completions awaited through the CQ's completion
//! channel and async events as a [`Stream`], both on tokio's reactor with no busy polling.
//! (Not named `tokio`, so that `use uverbs::*` leaves the `tokio` crate's name alone.)
//!
//! ```no_run
//! # async fn f(ctx: uverbs::Context) -> uverbs::Result<()> {
//! let channel = ctx.create_comp_channel()?;
//! let mut init = uverbs::CqInit::new(256);
//! init.channel = Some(&channel);
//! let mut cq = uverbs::aio::AsyncCq::new(ctx.create_cq_with(&init)?, &channel)?;
//! let mut wc = [uverbs::WorkCompletion::default(); 16];
//! let n = cq.poll(&mut wc).await?; // at least one
//! # let _ = n;
//! # Ok(())
//! # }
//! ```

use crate::context::Context;
use crate::cq::Cq;
use crate::error::{Error, Result};
use crate::event::{AsyncEvent, CompChannel};
use crate::wc::WorkCompletion;
use futures_core::Stream;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context as TaskContext, Poll};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Puts `fd` in non-blocking mode, as a reactor needs.
fn set_nonblocking(fd: BorrowedFd<'_>, verb: &'static str) -> Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let raw = fd.as_raw_fd();
    let flags = fcntl(raw, FcntlArg::F_GETFL).map_err(|e| Error::kernel(verb, e))?;
    let flags = OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK;
    fcntl(raw, FcntlArg::F_SETFL(flags)).map_err(|e| Error::kernel(verb, e))?;
    Ok(())
}

fn reactor_error(verb: &'static str, e: std::io::Error) -> Error {
    Error::io(format!("{verb}: tokio reactor"), e)
}

/// Registers `inner`'s fd for readability with the current runtime's reactor.
///
/// # Safety
/// `inner.as_raw_fd()` must return the same open fd for as long as `inner` lives.
unsafe fn register<T: AsRawFd>(inner: T, verb: &'static str) -> Result<AsyncFd<T>> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::invalid(verb, "called outside a tokio runtime"));
    }
    // SAFETY: forwarded caller contract.
    unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }.map_err(|e| reactor_error(verb, e.into()))
}

/// How often an [`AsyncCq`] waited, for telling a quiet wait from a busy one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WaitStats {
    /// Times the task was woken because the channel became readable.
    pub wakeups: u64,
    /// Completion events read from the channel.
    pub events: u64,
}

/// A CQ whose completions can be awaited: it arms the CQ, sleeps on the completion channel in
/// tokio's reactor, drains the channel's events and polls again.
///
/// [`AsyncCq::poll`] is cancellation safe: completions leave the CQ only when it returns them,
/// so a future dropped before it finished loses none (the CQ may stay armed; the next wait
/// picks that up).
///
/// An overrun is an error, not a wait that never ends: each time the CQ is found empty it is
/// checked ([`Cq::check`]), and the wait also wakes for async events, so a `CQ_ERR` that comes
/// after the last completion is seen too.
pub struct AsyncCq {
    cq: Cq,
    channel: AsyncFd<CompChannel>,
    /// A duplicate of the context's [`Context::async_fd`].
    async_events: AsyncFd<OwnedFd>,
    armed: bool,
    stats: WaitStats,
}

impl std::fmt::Debug for AsyncCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCq")
            .field("cq", &self.cq)
            .field("armed", &self.armed)
            .field("stats", &self.stats)
            .finish()
    }
}

impl AsyncCq {
    /// Wraps `cq`, which must have been created on `channel` (`CqInit::channel`), with no
    /// other CQ on it: events for other CQs would be taken from them. Must be called inside a
    /// tokio runtime with I/O enabled (else an error).
    pub fn new(cq: Cq, channel: &CompChannel) -> Result<Self> {
        set_nonblocking(channel.as_fd(), "AsyncCq::new")?;
        // SAFETY: the clone keeps the channel's fd open (an `Arc` of it) and always names it.
        let channel = unsafe { register(channel.clone(), "AsyncCq::new") }?;
        let async_events = cq
            .inner
            .ctx
            .async_events
            .ready()
            .try_clone_to_owned()
            .map_err(|e| Error::io("AsyncCq::new: dup of the async event fd", e))?;
        // SAFETY: an `OwnedFd` names the fd it owns while it lives.
        let async_events = unsafe { register(async_events, "AsyncCq::new") }?;
        Ok(Self {
            cq,
            channel,
            async_events,
            armed: false,
            stats: WaitStats::default(),
        })
    }

    /// Waits until at least one completion is ready, then moves up to `wc.len()` of them
    /// into `wc` and returns how many (`wc` must not be empty). [`Error::CqOverrun`] once the
    /// CQ overran and what fit has been returned.
    pub async fn poll(&mut self, wc: &mut [WorkCompletion]) -> Result<usize> {
        if wc.is_empty() {
            return Err(Error::invalid("AsyncCq::poll", "no room for a completion"));
        }
        loop {
            let n = self.cq.poll(wc);
            if n > 0 {
                return Ok(n);
            }
            self.cq.check()?;
            if !self.armed {
                self.cq.req_notify(false)?;
                self.armed = true;
                // A completion that arrived between the poll and the arm raises no event:
                // look again before sleeping.
                continue;
            }
            let (channel, async_events) = (&self.channel, &self.async_events);
            let woke = std::future::poll_fn(|cx| {
                if let Poll::Ready(ready) = async_events.poll_read_ready(cx) {
                    // An async event: the loop's check reads it (ahead of the user).
                    ready.map_err(|e| reactor_error("AsyncCq::poll", e))?.clear_ready();
                    return Poll::Ready(Ok(None));
                }
                channel
                    .poll_read_ready(cx)
                    .map(|ready| ready.map(Some).map_err(|e| reactor_error("AsyncCq::poll", e)))
            })
            .await?;
            let Some(mut ready) = woke else { continue };
            self.stats.wakeups += 1;
            // Each event disarmed the CQ; reading them all leaves the fd empty.
            while self.channel.get_ref().get_event(Some(Duration::ZERO))?.is_some() {
                self.stats.events += 1;
                self.armed = false;
            }
            ready.clear_ready();
        }
    }

    /// How often [`AsyncCq::poll`] slept and woke.
    pub fn stats(&self) -> WaitStats {
        self.stats
    }

    /// The CQ, for polling without waiting, resizing and the rest.
    pub fn get_mut(&mut self) -> &mut Cq {
        &mut self.cq
    }

    /// The CQ back.
    pub fn into_inner(self) -> Cq {
        self.cq
    }
}

/// The context's async event fd, for the reactor.
struct AsyncEventFd(Context);

impl AsRawFd for AsyncEventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.async_fd().as_raw_fd()
    }
}

/// The context's async events (port changes, QP and CQ errors, SRQ limits, ...) as a
/// [`Stream`] on tokio's reactor. One per context: each event is delivered once, to whoever
/// reads it first.
pub struct AsyncEvents {
    fd: AsyncFd<AsyncEventFd>,
}

impl std::fmt::Debug for AsyncEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncEvents").finish_non_exhaustive()
    }
}

impl AsyncEvents {
    /// The async events of `ctx`. Must be called inside a tokio runtime with I/O enabled
    /// (else an error).
    pub fn new(ctx: &Context) -> Result<Self> {
        set_nonblocking(ctx.async_fd(), "AsyncEvents::new")?;
        // SAFETY: the context keeps its async event fd open while it lives and always names
        // that one.
        let fd = unsafe { register(AsyncEventFd(ctx.clone()), "AsyncEvents::new") }?;
        Ok(Self { fd })
    }
}

impl Stream for AsyncEvents {
    type Item = Result<AsyncEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let mut ready = match ready!(self.fd.poll_read_ready(cx)) {
                Ok(ready) => ready,
                Err(e) => return Poll::Ready(Some(Err(reactor_error("AsyncEvents", e)))),
            };
            match ready.get_inner().0.get_async_event(Some(Duration::ZERO)) {
                Ok(Some(event)) => return Poll::Ready(Some(Ok(event))),
                Ok(None) => ready.clear_ready(),
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
        }
    }
}
