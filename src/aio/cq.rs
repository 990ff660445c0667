//! [`AsyncCq`]: completions awaited through the CQ's completion channel.

use super::{reactor_error, register, set_nonblocking};
use crate::context::Context;
use crate::cq::{Cq, CqInit};
use crate::error::{Error, Result};
use crate::event::CompChannel;
use crate::owned::Reaped;
use crate::wc::WorkCompletion;
use std::os::fd::{AsFd, OwnedFd};
use std::task::Poll;
use std::time::Duration;
use tokio::io::unix::AsyncFd;

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

impl Context {
    /// A CQ of at least `cqe` entries whose completions can be awaited, on a completion
    /// channel of its own (created here, owned by the CQ, so no other CQ shares it). A QP
    /// takes it as it takes a [`Cq`]: `QpInit::new(QpType::Rc, &acq, &acq)`. Must be called
    /// inside a tokio runtime with I/O enabled (else an error).
    ///
    /// ```no_run
    /// # async fn f(ctx: uverbs::Context, pd: uverbs::Pd) -> uverbs::Result<()> {
    /// let mut cq = ctx.create_async_cq(256)?;
    /// let qp = pd.create_qp(&uverbs::QpInit::new(uverbs::QpType::Rc, &cq, &cq))?;
    /// let mut wc = [uverbs::WorkCompletion::default(); 16];
    /// let n = cq.poll(&mut wc).await?; // at least one
    /// # let _ = (n, qp);
    /// # Ok(())
    /// # }
    /// ```
    pub fn create_async_cq(&self, cqe: u32) -> Result<AsyncCq> {
        self.create_async_cq_with(&CqInit::new(cqe))
    }

    /// [`Context::create_async_cq`] with `init`'s completion vector and user handle; its
    /// `channel` must be `None` (the CQ gets a channel of its own).
    pub fn create_async_cq_with(&self, init: &CqInit<'_>) -> Result<AsyncCq> {
        if init.channel.is_some() {
            return Err(Error::invalid(
                "create_async_cq_with",
                "the CQ gets a channel of its own: leave CqInit::channel None (AsyncCq::new wraps a CQ on a channel of yours)",
            ));
        }
        let channel = self.create_comp_channel()?;
        let init = CqInit {
            channel: Some(&channel),
            ..*init
        };
        let cq = self.create_cq_with(&init)?;
        AsyncCq::new(cq, &channel)
    }
}

impl AsRef<Cq> for AsyncCq {
    fn as_ref(&self) -> &Cq {
        &self.cq
    }
}

/// The CQ, for what reads it without polling (its capacity, handle), and so that a QP is
/// created on an `AsyncCq` directly: `QpInit::new(QpType::Rc, &acq, &acq)`.
impl std::ops::Deref for AsyncCq {
    type Target = Cq;

    fn deref(&self) -> &Cq {
        &self.cq
    }
}

impl AsyncCq {
    /// Wraps `cq`, which must have been created on `channel` (`CqInit::channel`), with no
    /// other CQ on it: events for other CQs would be taken from them. Must be called inside a
    /// tokio runtime with I/O enabled (else an error). [`Context::create_async_cq`] does it
    /// all in one call; this is for a CQ created by hand (QPs may already be on it).
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
        std::future::poll_fn(|cx| self.poll_completions(cx, wc)).await
    }

    /// The poll form of [`AsyncCq::poll`], for `poll_*` methods (such as tokio's
    /// `AsyncRead`): completions into `wc` if there are any, else `Pending` with the CQ armed
    /// and `cx`'s waker registered for its next completion event (or an async event).
    pub fn poll_completions(
        &mut self,
        cx: &mut std::task::Context<'_>,
        wc: &mut [WorkCompletion],
    ) -> Poll<Result<usize>> {
        if wc.is_empty() {
            return Poll::Ready(Err(Error::invalid("AsyncCq::poll", "no room for a completion")));
        }
        loop {
            let n = self.cq.poll(wc);
            if n > 0 {
                return Poll::Ready(Ok(n));
            }
            self.cq.check()?;
            if !self.armed {
                self.cq.req_notify(false)?;
                self.armed = true;
                // A completion that arrived between the poll and the arm raises no event:
                // look again before sleeping.
                continue;
            }
            if let Poll::Ready(ready) = self.async_events.poll_read_ready(cx) {
                // An async event: the loop's check reads it (ahead of the user).
                ready.map_err(|e| reactor_error("AsyncCq::poll", e))?.clear_ready();
                continue;
            }
            let mut ready = match self.channel.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(ready) => ready.map_err(|e| reactor_error("AsyncCq::poll", e))?,
            };
            self.stats.wakeups += 1;
            // Each event disarmed the CQ; reading them all leaves the fd empty.
            while ready.get_inner().get_event(Some(Duration::ZERO))?.is_some() {
                self.stats.events += 1;
                self.armed = false;
            }
            ready.clear_ready();
        }
    }

    /// Waits like [`AsyncCq::poll`], then hands the completions over as
    /// [`Completion`](crate::Completion)s, which [`Qp::reclaim`](crate::Qp::reclaim) and
    /// [`Srq::reclaim`](crate::Srq::reclaim) turn back into the safe posts' buffers (the
    /// awaited form of [`Cq::reap`]). Cancellation safe, as `poll` is.
    pub async fn reap<'w>(&mut self, wc: &'w mut [WorkCompletion]) -> Result<Reaped<'w>> {
        let n = self.poll(wc).await?;
        Ok(Reaped::new(&wc[..n], self.cq.identity()))
    }

    /// The poll form of [`AsyncCq::reap`] ([`AsyncCq::poll_completions`], then the
    /// completions as [`Completion`](crate::Completion)s).
    pub fn poll_reap<'w>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        wc: &'w mut [WorkCompletion],
    ) -> Poll<Result<Reaped<'w>>> {
        match self.poll_completions(cx, wc) {
            Poll::Ready(Ok(n)) => Poll::Ready(Ok(Reaped::new(&wc[..n], self.cq.identity()))),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
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
