//! Completion channels and async events: the two event fds the kernel gives a context.
//!
//! Both fds are plain pollable files: hand them to an event loop (`AsFd`/`AsRawFd`), and call
//! the `get_*` methods when readable, or block in them with a timeout.
//!
//! There is no "acknowledge" call. libibverbs needs `ibv_ack_*_events` only so that destroying
//! a CQ or QP can wait for threads still holding an event that points at it; here an event is
//! a plain value naming the object by its user handle, so nothing can dangle and there is
//! nothing to wait for. Each event is consumed exactly once by the read that returns it.

use crate::context::{Context, ContextInner, WatchedCq};
use crate::error::{Error, Result};
use crate::event_file::read_event;
use crate::open_enum::open_enum;
use crate::sys::abi::{AsyncEventDesc, CompEventDesc};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A completion channel: CQs created on it report "a completion arrived" events here after
/// [`crate::Cq::req_notify`]. Cheap to clone; the fd stays open while a clone or a CQ on it
/// lives.
#[derive(Clone)]
pub struct CompChannel {
    inner: Arc<ChannelInner>,
}

struct ChannelInner {
    fd: OwnedFd,
    /// The CQs on this channel by user handle, with their delivered-event counters: each
    /// event read here is counted for its CQ (mlx5 arms with the count as sequence number).
    cqs: Mutex<Vec<(u64, WatchedCq)>>,
}

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompChannel").field("fd", &self.as_raw_fd()).finish()
    }
}

/// A completion event: the CQ with this user handle has new completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CqEvent {
    /// [`crate::Cq::user_handle`] of the CQ.
    pub cq_user_handle: u64,
}

impl CompChannel {
    pub(crate) fn new(ctx: &ContextInner) -> Result<Self> {
        ctx.check_owner("CREATE_COMP_CHANNEL")?;
        Ok(Self::from(crate::sys::cmd::create_comp_channel(ctx.fd())?))
    }

    fn cqs(&self) -> std::sync::MutexGuard<'_, Vec<(u64, WatchedCq)>> {
        self.inner.cqs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the events for the CQ named `user_handle` in `events`. A user handle names one
    /// live CQ per channel, or events could not be told apart.
    pub(crate) fn watch_cq(&self, user_handle: u64, cq: WatchedCq) -> Result<()> {
        let mut cqs = self.cqs();
        cqs.retain(|(_, w)| w.strong_count() > 0);
        if cqs.iter().any(|(h, _)| *h == user_handle) {
            return Err(Error::invalid(
                "CREATE_CQ",
                format!("user handle {user_handle} already names a CQ on this channel"),
            ));
        }
        cqs.push((user_handle, cq));
        Ok(())
    }

    /// Forgets the CQs that are gone (a CQ calls this as it goes).
    pub(crate) fn forget_dead_cqs(&self) {
        self.cqs().retain(|(_, w)| w.strong_count() > 0);
    }

    /// Waits up to `timeout` (forever with `None`, not at all with `Some(ZERO)`) for the next
    /// event. Re-arm the CQ with `req_notify` and drain it with `poll` after each event.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<CqEvent>> {
        let desc: Option<CompEventDesc> = read_event(self.as_fd(), "get_cq_event", timeout)?;
        Ok(desc.map(|d| {
            // Upgraded after the list's lock: the last reference to the CQ may be this one,
            // and dropping it destroys the CQ, which prunes this list.
            let cq = self
                .cqs()
                .iter()
                .find(|(h, _)| *h == d.cq_handle)
                .map(|(_, cq)| cq.clone());
            if let Some(cq) = cq.and_then(|cq| cq.upgrade()) {
                cq.cq_flags().events.fetch_add(1, Ordering::Relaxed);
            }
            CqEvent {
                cq_user_handle: d.cq_handle,
            }
        }))
    }
}

/// Adopts a completion channel fd created elsewhere (for example by libibverbs, or a `dup` of
/// one). The kernel checks it is one when a CQ is created on it.
impl From<OwnedFd> for CompChannel {
    fn from(fd: OwnedFd) -> Self {
        Self {
            inner: Arc::new(ChannelInner {
                fd,
                cqs: Mutex::new(Vec::new()),
            }),
        }
    }
}

impl AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }
}

open_enum! {
    /// `enum ibv_event_type` (the kernel's `enum ib_event_type`).
    AsyncEventKind {
        CQ_ERR = 0, QP_FATAL = 1, QP_REQ_ERR = 2, QP_ACCESS_ERR = 3, COMM_EST = 4,
        SQ_DRAINED = 5, PATH_MIG = 6, PATH_MIG_ERR = 7, DEVICE_FATAL = 8, PORT_ACTIVE = 9,
        PORT_ERR = 10, LID_CHANGE = 11, PKEY_CHANGE = 12, SM_CHANGE = 13, SRQ_ERR = 14,
        SRQ_LIMIT_REACHED = 15, QP_LAST_WQE_REACHED = 16, CLIENT_REREGISTER = 17,
        GID_CHANGE = 18, WQ_FATAL = 19,
    }
}

/// What an async event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventTarget {
    /// A CQ, by [`crate::Cq::user_handle`].
    Cq(u64),
    /// A QP, by [`crate::Qp::user_handle`].
    Qp(u64),
    /// An SRQ, by [`crate::Srq::user_handle`].
    Srq(u64),
    /// A port of the device.
    Port(u8),
    /// The device as a whole.
    Device,
    /// A kind this crate does not know; the raw element.
    Unknown(u64),
}

/// An async event from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// What it happened to.
    pub target: EventTarget,
}

impl AsyncEvent {
    fn from_desc(d: &AsyncEventDesc) -> Self {
        use AsyncEventKind as K;
        let kind = AsyncEventKind(d.event_type);
        let target = match kind {
            K::CQ_ERR => EventTarget::Cq(d.element),
            K::QP_FATAL
            | K::QP_REQ_ERR
            | K::QP_ACCESS_ERR
            | K::COMM_EST
            | K::SQ_DRAINED
            | K::PATH_MIG
            | K::PATH_MIG_ERR
            | K::QP_LAST_WQE_REACHED => EventTarget::Qp(d.element),
            K::SRQ_ERR | K::SRQ_LIMIT_REACHED => EventTarget::Srq(d.element),
            K::PORT_ACTIVE
            | K::PORT_ERR
            | K::LID_CHANGE
            | K::PKEY_CHANGE
            | K::SM_CHANGE
            | K::CLIENT_REREGISTER
            | K::GID_CHANGE => EventTarget::Port(d.element as u8),
            K::DEVICE_FATAL => EventTarget::Device,
            _ => EventTarget::Unknown(d.element),
        };
        Self { kind, target }
    }
}

impl Context {
    /// Creates a completion channel.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        CompChannel::new(&self.inner)
    }

    /// Waits up to `timeout` (forever with `None`, not at all with `Some(ZERO)`) for the next
    /// async event. The fd to poll is [`Context::async_fd`]. Every event is returned once, in
    /// the order the kernel reported it, including those a CQ check ([`crate::Cq::try_poll`],
    /// [`crate::Cq::check`]) read ahead to find an overrun; a `CQ_ERR` marks its CQ
    /// ([`crate::Cq::overrun`]) when first read, here or there.
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
        Ok(self
            .inner
            .next_async_event(timeout)?
            .as_ref()
            .map(AsyncEvent::from_desc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn events_name_their_target() {
        let e = |event_type, element| {
            AsyncEvent::from_desc(&AsyncEventDesc {
                element,
                event_type,
                reserved: 0,
            })
        };
        assert_eq!(e(0, 9).target, EventTarget::Cq(9));
        assert_eq!(e(16, 3).target, EventTarget::Qp(3));
        assert_eq!(e(15, 4).target, EventTarget::Srq(4));
        assert_eq!(e(9, 1).target, EventTarget::Port(1));
        assert_eq!(e(99, 5).target, EventTarget::Unknown(5));
        assert_eq!(format!("{:?}", e(10, 1).kind), "PORT_ERR");
    }

    /// The channel counts each event it reads for the CQ it names (records written into a
    /// pipe stand in for the kernel's); a user handle names one live CQ per channel.
    #[test]
    fn the_channel_counts_events_per_cq() {
        use crate::context::{CqFlags, CqWatch};
        struct Cq(CqFlags);
        impl CqWatch for Cq {
            fn cq_flags(&self) -> &CqFlags {
                &self.0
            }
        }
        let new_cq = || Arc::new(Cq(CqFlags::default()));
        let watch = |cq: &Arc<Cq>| -> WatchedCq {
            let cq: Arc<dyn CqWatch> = cq.clone();
            Arc::downgrade(&cq)
        };
        let (rx, tx) = nix::unistd::pipe().unwrap();
        let channel = CompChannel::from(rx);
        let (seven, nine) = (new_cq(), new_cq());
        channel.watch_cq(7, watch(&seven)).unwrap();
        channel.watch_cq(9, watch(&nine)).unwrap();
        assert!(channel.watch_cq(7, watch(&new_cq())).is_err(), "7 is taken");
        for handle in [7u64, 9, 7, 5] {
            nix::unistd::write(&tx, CompEventDesc { cq_handle: handle }.as_bytes()).unwrap();
        }
        let mut seen = Vec::new();
        while let Some(event) = channel.get_event(Some(Duration::ZERO)).unwrap() {
            seen.push(event.cq_user_handle);
        }
        assert_eq!(seen, [7, 9, 7, 5], "every event is returned, counted or not");
        assert_eq!(
            (
                seven.0.events.load(Ordering::Relaxed),
                nine.0.events.load(Ordering::Relaxed)
            ),
            (2, 1)
        );
        // A dropped CQ's handle is free again; a live one's is not.
        drop(nine);
        channel.forget_dead_cqs();
        channel.watch_cq(9, watch(&new_cq())).unwrap();
        assert!(channel.watch_cq(7, watch(&new_cq())).is_err(), "7 is still taken");
        drop(seven);
        channel.watch_cq(7, watch(&new_cq())).unwrap();
    }
}
