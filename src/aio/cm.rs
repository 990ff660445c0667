//! The connection manager's connect/accept flow ([`crate::cm`]) as futures: each object's
//! event channel registered with tokio's reactor, its non-blocking steps (`advance`,
//! `try_request`) taken only when the channel polls readable.
//!
//! Cancellation: every future here may be dropped at any await point. What it owns then goes
//! with it, torn down as when the blocking object is dropped (the kernel destroys an id
//! inside `DESTROY_ID`: nothing is left half-made, nothing later waits on it); what lives in
//! an object the caller keeps stays consistent, and the next call carries on from it. Each
//! method says which of the two it is.
//!
//! Deadlines: a connect and an accept end by themselves after [`CONNECT_TIMEOUT`] (set
//! another with [`AsyncConnector::with_connect_timeout`]), with [`crate::Error::TimedOut`]:
//! the kernel's own limits are minutes (docs/rdma-cm.md). Resolution ends within the
//! timeout given to it; [`AsyncListener::next_request`] waits for as long as it is awaited.

use super::{reactor_error, register};
use crate::cm::{
    CmId, CmOption, ConnParam, ConnectFailed, ConnectRequest, Connection, Connector, EventChannel, Listener,
};
use crate::context::Context;
use crate::error::{Error, Result, Verb};
use crate::qp::Qp;
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::task::Poll;
use std::time::Duration;
use tokio::io::unix::AsyncFd;

/// How long [`AsyncConnector::connect`] and [`AsyncConnection::accept`] wait for the
/// handshake to end unless told otherwise. An answering peer ends it in milliseconds; the
/// kernel's own limits are minutes (an absent host about 100 s, a listener that never
/// answers its requests much longer).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// An event channel's fd, for the reactor.
struct ChannelFd(EventChannel);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// A one-shot monotonic timer's fd, for the reactor: readable once it expired.
struct TimerFdRaw(TimerFd);

impl AsRawFd for TimerFdRaw {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// A deadline on the reactor: [`Registered::until`] ends with [`Error::TimedOut`] when it
/// passes. A timerfd, so that it needs no tokio timer (a runtime built without
/// `enable_time` has none).
struct Deadline {
    fd: AsyncFd<TimerFdRaw>,
    timeout: Duration,
}

impl Deadline {
    fn after(timeout: Duration, verb: Verb) -> Result<Self> {
        let timer = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .map_err(|e| Error::kernel(verb, e))?;
        // A zero expiry would disarm the timer: at least a nanosecond; at most 68 years, which
        // `time_t` holds everywhere (`Duration::MAX` for "no deadline").
        let at = TimeSpec::from_duration(
            timeout
                .max(Duration::from_nanos(1))
                .min(Duration::from_secs(i32::MAX as u64)),
        );
        timer
            .set(Expiration::OneShot(at), TimerSetTimeFlags::empty())
            .map_err(|e| Error::kernel(verb, e))?;
        // SAFETY: the `TimerFd` owns its fd and keeps it open for as long as it lives.
        let fd = unsafe { register(TimerFdRaw(timer), verb) }?;
        Ok(Self { fd, timeout })
    }
}

/// An event channel registered with the reactor for readability.
struct Registered(AsyncFd<ChannelFd>);

impl Registered {
    /// Registers `channel`, whose fd is non-blocking ([`EventChannel::open`] opens it so):
    /// its reads end with `EAGAIN` when nothing is queued. Must be called inside a tokio
    /// runtime with I/O enabled (else an error).
    fn new(channel: &EventChannel, verb: Verb) -> Result<Self> {
        // SAFETY: the clone keeps the channel's fd open (an `Arc` of it) and always names it.
        unsafe { register(ChannelFd(channel.clone()), verb) }.map(Self)
    }

    /// Calls `step` now and then each time the channel polls readable, until it returns a
    /// value. `step` reads the queued events without blocking and returns `None` only when
    /// it read the channel empty; only then is the readiness cleared, so an event queued
    /// behind the one that ended a step is taken by the next call at once, with no new
    /// wake-up needed. Nothing is awaited between `step`'s value and the return: dropped,
    /// the future loses nothing `step` took.
    /// With a `deadline`, ends with [`Error::TimedOut`] once it passed and the channel had
    /// nothing that ends the step.
    async fn until<T>(
        &self,
        verb: Verb,
        deadline: Option<&Deadline>,
        mut step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        // First without waiting: the step may be done already (a second `disconnect`).
        if let Some(value) = step()? {
            return Ok(value);
        }
        let channel = &self.0;
        loop {
            let mut ready = std::future::poll_fn(move |cx| {
                if let Poll::Ready(r) = channel.poll_read_ready(cx) {
                    return Poll::Ready(r.map_err(|e| reactor_error(verb, e)));
                }
                match deadline.map(|d| d.fd.poll_read_ready(cx)) {
                    Some(Poll::Ready(_)) => Poll::Ready(Err(Error::TimedOut {
                        verb,
                        timeout: deadline.map(|d| d.timeout).unwrap_or_default(),
                    })),
                    _ => Poll::Pending,
                }
            })
            .await?;
            if let Some(value) = step()? {
                return Ok(value);
            }
            ready.clear_ready();
        }
    }

    /// The poll form of [`Registered::until`].
    fn poll_until<T>(
        &self,
        cx: &mut std::task::Context<'_>,
        verb: Verb,
        mut step: impl FnMut() -> Result<Option<T>>,
    ) -> Poll<Result<T>> {
        // Readiness first: a step reads the channel (a system call), which is due only once
        // the reactor saw it readable; the readiness is cleared only after a step read the
        // channel empty, so nothing queued is missed.
        loop {
            match self.0.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(reactor_error(verb, e))),
                Poll::Ready(Ok(mut ready)) => {
                    if let Some(value) = step()? {
                        return Poll::Ready(Ok(value));
                    }
                    ready.clear_ready();
                }
            }
        }
    }
}

/// The active side with its address and route resolved ([`Connector`] on the reactor).
pub struct AsyncConnector {
    connector: Connector,
    fd: Registered,
    timeout: Duration,
}

impl std::fmt::Debug for AsyncConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncConnector")
            .field("connector", &self.connector)
            .finish_non_exhaustive()
    }
}

impl AsyncConnector {
    /// Resolves `dst`'s address and route on a channel of its own. `timeout` is the kernel's
    /// for each step: it ends an address nobody answers with `ADDR_ERROR`
    /// ([`crate::Error::CmEvent`]) when it passes (on RoCE the route step sends nothing and
    /// ends by itself).
    ///
    /// Dropped before it is ready: the id is destroyed (the kernel cancels the resolution)
    /// and its channel closed; nothing is left to give back.
    pub async fn resolve(dst: SocketAddr, timeout: Duration) -> Result<Self> {
        Self::resolve_with(None, dst, &[], timeout).await
    }

    /// As [`AsyncConnector::resolve`], from the local address `src` and with `options` set
    /// on the id first ([`Connector::resolve_with`]).
    pub async fn resolve_with(
        src: Option<SocketAddr>,
        dst: SocketAddr,
        options: &[CmOption],
        timeout: Duration,
    ) -> Result<Self> {
        let mut connector = Connector::start(src, dst, options, timeout)?;
        let fd = Registered::new(connector.channel(), "resolve")?;
        fd.until("resolve", None, || Ok(connector.advance()?.then_some(())))
            .await?;
        Ok(Self {
            connector,
            fd,
            timeout: CONNECT_TIMEOUT,
        })
    }

    /// How long [`AsyncConnector::connect`] waits for the peer's answer ([`CONNECT_TIMEOUT`]
    /// unless set here).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The device the route goes through (create the QP there).
    pub fn context(&self) -> Result<Context> {
        self.connector.context()
    }

    /// The id.
    pub fn id(&self) -> &CmId {
        self.connector.id()
    }

    /// Connects `qp` (moving it through INIT, RTR and RTS): the connect request goes out
    /// when this is called, so the future borrows nothing; it waits for the peer's answer,
    /// at most the connect timeout ([`CONNECT_TIMEOUT`] unless
    /// [`AsyncConnector::with_connect_timeout`] set another), then
    /// [`crate::Error::TimedOut`]. A reject is [`crate::Error::Rejected`] with the peer's
    /// reason and data ([`crate::Error::is_no_listener`] where nothing listens yet). Left to
    /// itself the kernel ends an unanswered request only after minutes: an absent host with
    /// `UNREACHABLE` after about 100 s, a peer whose CM answers and whose application never
    /// accepts later still (docs/rdma-cm.md).
    ///
    /// On failure the QP comes back in the [`ConnectFailed`] (in INIT after a reject or a
    /// timeout, its receives still posted: connect it again with a new connector).
    ///
    /// Dropped before it is ready: the id, its channel and `qp` are destroyed. The request
    /// is withdrawn (the kernel's CM sends a reject), so a peer's accept of it fails; the
    /// peer never sees the connection established, because the RTU goes out only in the
    /// poll that returns the connection.
    pub fn connect(
        self,
        qp: Qp,
        param: &ConnParam<'_>,
    ) -> impl Future<Output = std::result::Result<AsyncConnection, ConnectFailed>> + Send + 'static {
        let Self { connector, fd, timeout } = self;
        let started = connector.start_connect(qp, param);
        async move {
            let mut pending = started?;
            let waited = match Deadline::after(timeout, "connect") {
                Ok(deadline) => {
                    fd.until("connect", Some(&deadline), || Ok(pending.advance()?.then_some(())))
                        .await
                }
                Err(e) => Err(e),
            };
            match waited {
                Ok(()) => Ok(AsyncConnection {
                    connection: pending.into_connection()?,
                    fd,
                }),
                Err(error) => Err(pending.fail(error)),
            }
        }
    }
}

/// The passive side: an id listening on an address ([`Listener`] on the reactor).
pub struct AsyncListener {
    listener: Listener,
    fd: Registered,
}

impl std::fmt::Debug for AsyncListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncListener")
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

impl AsyncListener {
    /// Binds `addr` and listens with the kernel's maximum backlog. Must be called inside a
    /// tokio runtime with I/O enabled (else an error).
    pub fn bind(addr: SocketAddr) -> Result<Self> {
        Self::bind_with(addr, &[])
    }

    /// As [`AsyncListener::bind`], with `options` set on the id before it binds
    /// ([`Listener::bind_with`]).
    pub fn bind_with(addr: SocketAddr, options: &[CmOption]) -> Result<Self> {
        let listener = Listener::bind_with(addr, options)?;
        let fd = Registered::new(listener.channel(), "bind")?;
        Ok(Self { listener, fd })
    }

    /// The bound address (with the port the kernel picked for port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next connect request: answer it with [`AsyncConnection::accept`] or
    /// [`ConnectRequest::reject`]; dropped unanswered, it is rejected.
    ///
    /// Cancellation safe: a request leaves the channel only in the poll that returns it, so
    /// a dropped future leaves every request queued for the next call (`tokio::select!` in
    /// a loop loses none).
    pub async fn next_request(&self) -> Result<ConnectRequest> {
        self.fd
            .until("next_request", None, || self.listener.try_request())
            .await
    }
}

/// An established connection ([`Connection`] on the reactor): its QP (in RTS), its id and
/// its own event channel. Dropping it disconnects (QP to ERR, then DISCONNECT) and
/// destroys the QP and the id.
pub struct AsyncConnection {
    connection: Connection,
    fd: Registered,
}

impl std::fmt::Debug for AsyncConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncConnection")
            .field("connection", &self.connection)
            .finish_non_exhaustive()
    }
}

impl AsyncConnection {
    /// Accepts `request` with `qp` on a channel of the connection's own (moving the QP
    /// through INIT, RTR and RTS; [`ConnectRequest::start_accept`]): the accept goes out when
    /// this is called, so the future borrows nothing; it waits for `ESTABLISHED`, at most
    /// [`CONNECT_TIMEOUT`]. Must be called inside a tokio runtime with I/O enabled (else the
    /// future's error). A request whose peer gave up before the accept is
    /// [`crate::Error::RequestWithdrawn`].
    ///
    /// Dropped before it is ready: the new id, its channel and `qp` are destroyed; the peer
    /// sees a reject, or, where its side came up first, a disconnect.
    pub fn accept(
        request: ConnectRequest,
        qp: Qp,
        param: &ConnParam<'_>,
    ) -> impl Future<Output = Result<Self>> + Send + 'static {
        let started = request.start_accept(qp, param).and_then(|pending| {
            let fd = Registered::new(pending.channel(), "accept")?;
            Ok((pending, fd))
        });
        async move {
            let (mut pending, fd) = started?;
            let deadline = Deadline::after(CONNECT_TIMEOUT, "accept")?;
            fd.until("accept", Some(&deadline), || Ok(pending.advance()?.then_some(())))
                .await?;
            Ok(Self {
                connection: pending.finish()?,
                fd,
            })
        }
    }

    /// The QP.
    pub fn qp(&self) -> &Qp {
        self.connection.qp()
    }

    /// The QP, to post on.
    pub fn qp_mut(&mut self) -> &mut Qp {
        self.connection.qp_mut()
    }

    /// The private data of the peer's connect request (passive side) or accept (active
    /// side), as the kernel reported it.
    pub fn peer_private_data(&self) -> &[u8] {
        self.connection.peer_private_data()
    }

    /// The connection, for its id and channel.
    pub fn get_ref(&self) -> &Connection {
        &self.connection
    }

    /// Disconnects: the QP goes to ERR (its posted requests flush), a disconnect request
    /// goes out, and this waits for `DISCONNECTED`. A second call returns at once.
    ///
    /// Cancellation safe: where it stands lives in the connection. Once polled, the request
    /// is out; a dropped future leaves the connection closing, and the next `disconnect` or
    /// [`AsyncConnection::wait_disconnected`] waits for the same `DISCONNECTED`.
    pub async fn disconnect(&mut self) -> Result<()> {
        self.connection.start_disconnect()?;
        self.wait_disconnected().await
    }

    /// Waits for `DISCONNECTED`: the peer's disconnect (answered, as `rdma_disconnect` on
    /// `DISCONNECTED` does) or the end of this side's own. Returns at once once it came.
    ///
    /// Cancellation safe: the event is taken only in the poll that returns.
    pub async fn wait_disconnected(&mut self) -> Result<()> {
        let Self { connection, fd } = self;
        fd.until("wait_disconnected", None, || Ok(connection.advance()?.then_some(())))
            .await
    }

    /// The poll form of [`AsyncConnection::wait_disconnected`]: `Ready` once `DISCONNECTED`
    /// came (the peer's, answered, or the end of this side's own), else `Pending` with `cx`'s
    /// waker registered for the connection's next event.
    pub fn poll_disconnected(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<()>> {
        if self.connection.is_down() {
            return Poll::Ready(Ok(()));
        }
        let Self { connection, fd } = self;
        fd.poll_until(cx, "wait_disconnected", || Ok(connection.advance()?.then_some(())))
    }

    /// Starts a disconnect ([`Connection::start_disconnect`]) without waiting for it:
    /// [`AsyncConnection::poll_disconnected`] sees its end.
    pub fn start_disconnect(&mut self) -> Result<()> {
        self.connection.start_disconnect()
    }

    /// The connection back, off the reactor (for the blocking calls or another poller).
    pub fn into_inner(self) -> Connection {
        self.connection
    }
}
