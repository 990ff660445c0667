//! [`AsyncEvents`]: a context's async events as a [`Stream`].

use super::{reactor_error, register};
use crate::context::Context;
use crate::error::Result;
use crate::event::AsyncEvent;
use futures_core::Stream;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context as TaskContext, Poll};
use std::time::Duration;
use tokio::io::unix::AsyncFd;

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
