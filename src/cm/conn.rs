//! The connector/listener pair over the low-level ids: resolve, connect or accept, and a
//! [`Connection`] that owns its QP, its id and a channel of its own.
//!
//! Every object here advances without blocking: its `advance` (or [`Listener::try_request`])
//! reads the events queued on its own channel and takes the next step, and the object is
//! `AsFd` for an event loop to wait on. The blocking forms sleep in poll(2) on that fd and
//! advance when it is readable.

use super::channel::EventChannel;
use super::event::{CmEvent, CmEventKind, ConnectRequest, PrivateData};
use super::id::{CmId, ConnParam};
use super::option::CmOption;
use crate::attr::QpState;
use crate::context::Context;
use crate::error::{Error, Result, Verb};
use crate::qp::{Qp, QpAttr};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

/// The next queued event on `channel` that matters (`TIMEWAIT_EXIT` is informational), or
/// `None` if none is queued.
fn next_event(channel: &EventChannel) -> Result<Option<CmEvent>> {
    loop {
        match channel.try_get_event()? {
            Some(e) if e.kind == CmEventKind::TIMEWAIT_EXIT => continue,
            other => return Ok(other),
        }
    }
}

/// An event `verb` did not expect as its error: a reject is [`Error::Rejected`] with the
/// peer's reason and data, anything else [`Error::CmEvent`].
fn unexpected(verb: Verb, event: &CmEvent) -> Error {
    match event.kind {
        CmEventKind::REJECTED => Error::Rejected {
            status: event.status,
            private_data: event.private_data.to_vec(),
        },
        k => Error::CmEvent {
            verb,
            event: k.name().unwrap_or("an unknown event"),
            status: event.status,
        },
    }
}

/// Calls `advance` each time `channel` polls readable until it returns `true`, at most
/// `timeout`.
fn wait(
    channel: &EventChannel,
    verb: Verb,
    timeout: Duration,
    mut advance: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !advance()? {
        channel.wait_readable(verb, Some(deadline), timeout)?;
    }
    Ok(())
}

/// Where a [`Connector`]'s resolution stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resolution {
    Address,
    Route,
    Done,
}

impl Resolution {
    fn verb(self) -> Verb {
        match self {
            Self::Address => "resolve_addr",
            Self::Route | Self::Done => "resolve_route",
        }
    }
}

/// The active side: an id with its address and route resolved, ready to connect.
///
/// ```no_run
/// # fn main() -> uverbs::Result<()> {
/// use std::time::Duration;
/// use uverbs::cm::{ConnParam, Connector};
/// use uverbs::{QpInit, QpType};
/// let t = Duration::from_secs(5);
/// let connector = Connector::resolve("169.254.77.1:7471".parse().unwrap(), t)?;
/// let ctx = connector.context()?; // the device the route goes through
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(16)?;
/// let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?;
/// let param = ConnParam { private_data: b"hello", ..Default::default() };
/// let mut conn = connector.connect(qp, &param, t)?; // the QP is in RTS
/// println!("the server said {:?}", conn.peer_private_data());
/// conn.disconnect(t)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Connector {
    // Declared first: the id is destroyed before its channel closes.
    id: CmId,
    channel: EventChannel,
    timeout: Duration,
    step: Resolution,
}

impl Connector {
    /// Resolves `dst`'s address and route on a channel of its own, each step within `timeout`.
    /// Where ARP completes inside the kernel's first lookup (a veth pair on one host), Linux
    /// misses its own wake-up and the first resolution toward a new neighbour ends only at
    /// `timeout`: keep it short there, as rping does (2 s; docs/kernel-facts.md).
    pub fn resolve(dst: SocketAddr, timeout: Duration) -> Result<Self> {
        Self::resolve_from(None, dst, timeout)
    }

    /// As [`Connector::resolve`], from the local address `src`.
    pub fn resolve_from(src: Option<SocketAddr>, dst: SocketAddr, timeout: Duration) -> Result<Self> {
        Self::resolve_with(src, dst, &[], timeout)
    }

    /// As [`Connector::resolve_from`], with `options` set on the id first (the route then
    /// carries its type of service, the QP its ACK timeout).
    pub fn resolve_with(
        src: Option<SocketAddr>,
        dst: SocketAddr,
        options: &[CmOption],
        timeout: Duration,
    ) -> Result<Self> {
        let mut connector = Self::start(src, dst, options, timeout)?;
        // The kernel ends each step with an event within `timeout`; waiting twice as long
        // for each lets its own error (ADDR_ERROR, ROUTE_ERROR, with the reason) arrive first.
        let wait = timeout.saturating_mul(2);
        let mut deadline = (connector.step, Instant::now() + wait);
        while !connector.advance()? {
            if connector.step != deadline.0 {
                deadline = (connector.step, Instant::now() + wait);
            }
            connector
                .channel
                .wait_readable(connector.step.verb(), Some(deadline.1), wait)?;
        }
        Ok(connector)
    }

    /// Starts resolving `dst` (from `src`, with `options` set first) and returns at once:
    /// [`Connector::advance`] takes the steps as their events arrive, the connector's fd
    /// polls readable when one is queued. `timeout` is the kernel's for each step.
    pub fn start(src: Option<SocketAddr>, dst: SocketAddr, options: &[CmOption], timeout: Duration) -> Result<Self> {
        let channel = EventChannel::open()?;
        let mut id = channel.create_id()?;
        for option in options {
            id.set_option(*option)?;
        }
        id.resolve_addr(src, dst, timeout)?;
        Ok(Self {
            id,
            channel,
            timeout,
            step: Resolution::Address,
        })
    }

    /// Takes the queued events: address resolved → resolves the route. `true` once the route
    /// is resolved (then connect); `false` while a step is under way. An `ADDR_ERROR` or
    /// `ROUTE_ERROR` is [`Error::CmEvent`].
    pub fn advance(&mut self) -> Result<bool> {
        while self.step != Resolution::Done {
            let Some(event) = next_event(&self.channel)? else {
                return Ok(false);
            };
            match (self.step, event.kind) {
                (Resolution::Address, CmEventKind::ADDR_RESOLVED) => {
                    self.id.resolve_route(self.timeout)?;
                    self.step = Resolution::Route;
                }
                (Resolution::Route, CmEventKind::ROUTE_RESOLVED) => self.step = Resolution::Done,
                _ => return Err(unexpected(self.step.verb(), &event)),
            }
        }
        Ok(true)
    }

    /// The device the route goes through (create the QP there).
    pub fn context(&self) -> Result<Context> {
        self.id.context()
    }

    /// The id.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The connector's channel (its connection's, after the connect): readable when a step
    /// has ended.
    pub fn channel(&self) -> &EventChannel {
        &self.channel
    }

    /// Connects `qp` (moving it through INIT, RTR and RTS) and waits at most `timeout` for
    /// the peer's answer. A reject is [`Error::Rejected`] with the peer's reason and data
    /// ([`Error::is_no_listener`] where nothing listens on the port yet).
    ///
    /// On failure the QP comes back in the [`ConnectFailed`], with its posted receives: in
    /// INIT after a reject, an unanswered request or a timeout, ready for another
    /// connector's `connect`; in ERR where the handshake failed past that.
    #[allow(clippy::result_large_err)] // a cold path that hands the QP back whole on failure
    pub fn connect(
        self,
        qp: Qp,
        param: &ConnParam<'_>,
        timeout: Duration,
    ) -> std::result::Result<Connection, ConnectFailed> {
        let mut pending = self.start_connect(qp, param)?;
        let channel = pending.channel.clone();
        match wait(&channel, "connect", timeout, || pending.advance()) {
            Ok(()) => pending.into_connection(),
            Err(error) => Err(pending.fail(error)),
        }
    }

    /// Sends the connect request for `qp` and returns at once; [`Establishing::advance`]
    /// completes it when the answer arrives. The route must be resolved. On failure the QP
    /// comes back as from [`Connector::connect`].
    #[allow(clippy::result_large_err)] // a cold path that hands the QP back whole on failure
    pub fn start_connect(
        mut self,
        mut qp: Qp,
        param: &ConnParam<'_>,
    ) -> std::result::Result<Establishing, ConnectFailed> {
        if self.step != Resolution::Done {
            return Err(ConnectFailed::new(
                Error::invalid(
                    "connect",
                    "the route is not resolved yet: advance the connector until it is",
                ),
                qp,
            ));
        }
        if let Err(error) = self.id.connect(&mut qp, param) {
            return Err(ConnectFailed::new(error, qp));
        }
        Ok(Establishing {
            qp,
            id: self.id,
            channel: self.channel,
            peer: None,
            established: false,
        })
    }
}

impl AsFd for Connector {
    /// The connector's channel: readable when a step has ended.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }
}

/// A connection on its way up: the active side's connect sent, or the passive side's
/// accept. [`Establishing::advance`] completes it; the fd is its channel's, which the
/// [`Connection`] keeps.
#[derive(Debug)]
pub struct Establishing {
    qp: Qp,
    id: CmId,
    channel: EventChannel,
    /// The peer's private data: the passive side's from the request; the active side's
    /// from the answer, `None` until it arrives.
    peer: Option<PrivateData>,
    established: bool,
}

impl Establishing {
    /// Takes the queued events: the active side completes the peer's answer (RTR, RTS, the
    /// RTU), the passive side waits for `ESTABLISHED`. `true` once the connection is
    /// established (then [`Establishing::finish`]); a reject is [`Error::Rejected`].
    pub fn advance(&mut self) -> Result<bool> {
        let verb = if self.peer.is_none() { "connect" } else { "accept" };
        while !self.established {
            let Some(event) = next_event(&self.channel)? else {
                return Ok(false);
            };
            match (self.peer.is_none(), event.kind) {
                (true, CmEventKind::CONNECT_RESPONSE) => {
                    if let Err(e) = self.id.establish(&mut self.qp) {
                        // The peer's reject can overtake its answer (its id destroyed after
                        // the REP): the kernel then refuses the QP moves; report the reject.
                        return Err(match next_event(&self.channel)? {
                            Some(late) => unexpected(verb, &late),
                            None => e,
                        });
                    }
                    self.peer = Some(event.private_data);
                    self.established = true;
                }
                // iWARP: no answer to complete; the kernel moved the QP to RTS and the
                // event carries the peer's private data.
                (true, CmEventKind::ESTABLISHED) if self.id.is_iwarp()? => {
                    self.id.established(&mut self.qp)?;
                    self.peer = Some(event.private_data);
                    self.established = true;
                }
                (false, CmEventKind::ESTABLISHED) => {
                    self.id.established(&mut self.qp)?;
                    self.established = true;
                }
                _ => return Err(unexpected(verb, &event)),
            }
        }
        Ok(true)
    }

    /// The established connection; an error before [`Establishing::advance`] said so.
    pub fn finish(self) -> Result<Connection> {
        self.into_connection().map_err(|failed| failed.error)
    }

    /// As [`Establishing::finish`], with the QP back in the error.
    #[allow(clippy::result_large_err)] // a cold path that hands the QP back whole on failure
    pub(crate) fn into_connection(self) -> std::result::Result<Connection, ConnectFailed> {
        match (self.established, self.peer) {
            (true, Some(peer)) => Ok(Connection {
                qp: self.qp,
                id: self.id,
                channel: self.channel,
                peer,
                state: Link::Up,
            }),
            _ => Err(ConnectFailed::new(
                Error::invalid("finish", "the connection is not established yet: advance until it is"),
                self.qp,
            )),
        }
    }

    /// Gives up: the id is destroyed (an unanswered request is withdrawn) and the QP comes
    /// back with `error`, as from [`Connector::connect`].
    pub fn fail(self, error: Error) -> ConnectFailed {
        ConnectFailed::new(error, self.qp)
    }

    /// The id.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The connection's channel: readable when the answer or `ESTABLISHED` is queued.
    pub fn channel(&self) -> &EventChannel {
        &self.channel
    }
}

impl AsFd for Establishing {
    /// The connection's channel: readable when the answer or `ESTABLISHED` is queued.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }
}

/// A connect or accept that failed, with the QP it was given: reuse it rather than build
/// another. `?` turns it into its [`Error`].
///
/// The QP is in INIT where the handshake ended before the peer's answer was applied (a
/// reject, no answer, a timeout), with its posted receives; another connect takes it as it
/// is. Where it had gone further, it was moved to ERR: its posted requests flush; reclaim
/// them and move it to RESET before connecting again.
#[derive(Debug)]
pub struct ConnectFailed {
    /// What went wrong.
    pub error: Error,
    /// The QP, in INIT, RESET or ERR.
    pub qp: Qp,
}

impl ConnectFailed {
    pub(crate) fn new(error: Error, mut qp: Qp) -> Self {
        if matches!(qp.state(), QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe) {
            // Best effort: where even that fails, the QP is handed back as it is.
            let _ = qp.modify(&QpAttr {
                state: Some(QpState::Err),
                ..Default::default()
            });
        }
        Self { error, qp }
    }

    /// Whether nothing listened on the peer's port ([`Error::is_no_listener`]): a server
    /// not started yet. Connect the QP again.
    pub fn is_no_listener(&self) -> bool {
        self.error.is_no_listener()
    }
}

impl std::fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl From<ConnectFailed> for Error {
    fn from(failed: ConnectFailed) -> Self {
        failed.error
    }
}

/// The passive side: an id listening on an address.
#[derive(Debug)]
pub struct Listener {
    id: CmId,
    channel: EventChannel,
}

impl Listener {
    /// Binds `addr` and listens with the kernel's maximum backlog.
    pub fn bind(addr: SocketAddr) -> Result<Self> {
        Self::bind_with(addr, &[])
    }

    /// As [`Listener::bind`], with `options` set on the id before it binds (e.g.
    /// [`CmOption::AfOnly`] for an IPv6 listener).
    pub fn bind_with(addr: SocketAddr, options: &[CmOption]) -> Result<Self> {
        let channel = EventChannel::open()?;
        let mut id = channel.create_id()?;
        for option in options {
            id.set_option(*option)?;
        }
        id.bind(addr)?;
        id.listen(0)?;
        Ok(Self { id, channel })
    }

    /// The bound address (with the port the kernel picked for port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.id
            .query_addr()?
            .src
            .ok_or_else(|| Error::malformed("QUERY", "a listener with no IP source address"))
    }

    /// The listener's channel: readable when a request is queued.
    pub fn channel(&self) -> &EventChannel {
        &self.channel
    }

    /// Waits at most `timeout` for the next connect request.
    pub fn get_request(&self, timeout: Duration) -> Result<ConnectRequest> {
        let mut request = None;
        wait(&self.channel, "get_request", timeout, || {
            request = self.try_request()?;
            Ok(request.is_some())
        })?;
        request.ok_or_else(|| Error::malformed("GET_EVENT", "no request after the wait"))
    }

    /// The next queued connect request, or `None` at once if there is none.
    pub fn try_request(&self) -> Result<Option<ConnectRequest>> {
        let Some(mut event) = next_event(&self.channel)? else {
            return Ok(None);
        };
        if event.kind != CmEventKind::CONNECT_REQUEST {
            return Err(unexpected("get_request", &event));
        }
        event
            .take_request()
            .map(Some)
            .ok_or_else(|| Error::malformed("GET_EVENT", "a connect request without a new id"))
    }
}

impl AsFd for Listener {
    /// The listener's channel: readable when a request is queued.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }
}

impl ConnectRequest {
    /// Accepts with `qp` on a channel of the connection's own and waits at most `timeout` for
    /// `ESTABLISHED` ([`ConnectRequest::accept_id`] does the QP moves).
    pub fn accept(self, qp: Qp, param: &ConnParam<'_>, timeout: Duration) -> Result<Connection> {
        let mut pending = self.start_accept(qp, param)?;
        let channel = pending.channel.clone();
        wait(&channel, "accept", timeout, || pending.advance())?;
        pending.finish()
    }

    /// Accepts with `qp` on a channel of the connection's own and returns at once;
    /// [`Establishing::advance`] sees `ESTABLISHED` (register the returned value's fd).
    pub fn start_accept(mut self, mut qp: Qp, param: &ConnParam<'_>) -> Result<Establishing> {
        let channel = EventChannel::open()?;
        // Before the accept, so that every event of the connection lands on its channel.
        self.migrate(&channel)?;
        let peer = self.private_data;
        let id = self.accept_id(&mut qp, param)?;
        Ok(Establishing {
            qp,
            id,
            channel,
            peer: Some(peer),
            established: false,
        })
    }
}

/// Where a [`Connection`]'s link stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Up,
    /// This side sent the disconnect; `DISCONNECTED` is due.
    Closing,
    Down,
}

/// An established connection: its QP (in RTS), its id and its own event channel. Dropping
/// it disconnects (QP to ERR, then DISCONNECT) and destroys the QP and the id.
#[derive(Debug)]
pub struct Connection {
    qp: Qp,
    id: CmId,
    channel: EventChannel,
    peer: PrivateData,
    state: Link,
}

impl Connection {
    /// The QP.
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// The QP, to post on.
    pub fn qp_mut(&mut self) -> &mut Qp {
        &mut self.qp
    }

    /// The id.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The connection's channel: readable when the peer disconnects.
    pub fn channel(&self) -> &EventChannel {
        &self.channel
    }

    /// The private data of the peer's connect request (passive side) or accept (active
    /// side), as the kernel reported it.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer
    }

    /// Disconnects: the QP goes to ERR (its posted requests flush), a disconnect request
    /// goes out, and this waits at most `timeout` for `DISCONNECTED`.
    pub fn disconnect(&mut self, timeout: Duration) -> Result<()> {
        self.start_disconnect()?;
        self.wait_disconnected(timeout)
    }

    /// Moves the QP to ERR and sends the disconnect request, returning at once;
    /// [`Connection::advance`] sees the `DISCONNECTED` that follows.
    pub fn start_disconnect(&mut self) -> Result<()> {
        if self.state == Link::Up {
            self.state = Link::Closing;
            self.id.disconnect(&mut self.qp)?;
        }
        Ok(())
    }

    /// Waits at most `timeout` for `DISCONNECTED` (the peer's, answered as in
    /// [`Connection::advance`], or the end of this side's own disconnect).
    pub fn wait_disconnected(&mut self, timeout: Duration) -> Result<()> {
        let channel = self.channel.clone();
        wait(&channel, "wait_disconnected", timeout, || self.advance())
    }

    /// Whether `DISCONNECTED` came (no event to read for it).
    #[cfg(feature = "tokio")]
    pub(crate) fn is_down(&self) -> bool {
        self.state == Link::Down
    }

    /// Takes the queued event: `true` once `DISCONNECTED` came. A peer's disconnect is
    /// answered (QP to ERR, DISCONNECT), as `rdma_disconnect` on `DISCONNECTED` does.
    pub fn advance(&mut self) -> Result<bool> {
        if self.state == Link::Down {
            return Ok(true);
        }
        let Some(event) = next_event(&self.channel)? else {
            return Ok(false);
        };
        if event.kind != CmEventKind::DISCONNECTED {
            return Err(unexpected("disconnect", &event));
        }
        let answer = self.state == Link::Up;
        self.state = Link::Down;
        if answer {
            self.id.disconnect(&mut self.qp)?;
        }
        if self.id.is_iwarp()? {
            // The driver closed the connection and flushed the queues: nothing posted now
            // would complete.
            self.qp.kernel_moved_to(QpState::Err);
        }
        Ok(true)
    }
}

impl AsFd for Connection {
    /// The connection's channel: readable when the peer disconnects.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if self.state == Link::Up {
            // Best effort: the id's destruction that follows tears the connection down anyway.
            let _ = self.id.disconnect(&mut self.qp);
        }
    }
}
