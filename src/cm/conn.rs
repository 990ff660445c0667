//! The blocking connector/listener pair over the low-level ids: resolve, connect or accept,
//! and a [`Connection`] that owns its QP, its id and a channel of its own.

use super::channel::EventChannel;
use super::event::{CmEvent, CmEventKind, ConnectRequest, PrivateData};
use super::id::{CmId, ConnParam};
use super::option::CmOption;
use crate::context::Context;
use crate::error::{Error, Result, Verb};
use crate::qp::Qp;
use std::net::SocketAddr;
use std::time::Duration;

/// Waits for `wanted` on `channel`; a reject becomes [`Error::Rejected`], any other event
/// [`Error::CmEvent`]. `TIMEWAIT_EXIT` (informational) is skipped.
fn expect(channel: &EventChannel, verb: Verb, wanted: CmEventKind, timeout: Duration) -> Result<CmEvent> {
    loop {
        let event = channel.get_event(Some(timeout)).map_err(|e| match e {
            Error::TimedOut { timeout, .. } => Error::TimedOut { verb, timeout },
            other => other,
        })?;
        match event.kind {
            k if k == wanted => return Ok(event),
            CmEventKind::TIMEWAIT_EXIT => continue,
            CmEventKind::REJECTED => {
                return Err(Error::Rejected {
                    status: event.status,
                    private_data: event.private_data.to_vec(),
                })
            }
            k => {
                return Err(Error::CmEvent {
                    verb,
                    event: k.name().unwrap_or("an unknown event"),
                    status: event.status,
                })
            }
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
        let channel = EventChannel::open()?;
        let mut id = channel.create_id()?;
        for option in options {
            id.set_option(*option)?;
        }
        // The kernel ends each step with an event within `timeout`; waiting twice as long
        // lets its own error (ADDR_ERROR, ROUTE_ERROR, with the reason) arrive first.
        let wait = timeout.saturating_mul(2);
        id.resolve_addr(src, dst, timeout)?;
        expect(&channel, "resolve_addr", CmEventKind::ADDR_RESOLVED, wait)?;
        id.resolve_route(timeout)?;
        expect(&channel, "resolve_route", CmEventKind::ROUTE_RESOLVED, wait)?;
        Ok(Self { id, channel })
    }

    /// The device the route goes through (create the QP there).
    pub fn context(&self) -> Result<Context> {
        self.id.context()
    }

    /// The id.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// Connects `qp` (moving it through INIT, RTR and RTS) and waits at most `timeout` for
    /// the peer's answer. A reject is [`Error::Rejected`] with the peer's reason and data.
    pub fn connect(mut self, mut qp: Qp, param: &ConnParam<'_>, timeout: Duration) -> Result<Connection> {
        self.id.connect(&mut qp, param)?;
        let event = expect(&self.channel, "connect", CmEventKind::CONNECT_RESPONSE, timeout)?;
        self.id.establish(&mut qp)?;
        Ok(Connection {
            qp,
            id: self.id,
            channel: self.channel,
            peer: event.private_data,
            connected: true,
        })
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
        let mut event = expect(&self.channel, "get_request", CmEventKind::CONNECT_REQUEST, timeout)?;
        event
            .take_request()
            .ok_or_else(|| Error::malformed("GET_EVENT", "a connect request without a new id"))
    }
}

impl ConnectRequest {
    /// Accepts with `qp` on a channel of the connection's own and waits at most `timeout` for
    /// `ESTABLISHED` ([`ConnectRequest::accept_id`] does the QP moves).
    pub fn accept(mut self, mut qp: Qp, param: &ConnParam<'_>, timeout: Duration) -> Result<Connection> {
        let channel = EventChannel::open()?;
        // Before the accept, so that every event of the connection lands on its channel.
        self.migrate(&channel)?;
        let peer = self.private_data;
        let id = self.accept_id(&mut qp, param)?;
        expect(&channel, "accept", CmEventKind::ESTABLISHED, timeout)?;
        Ok(Connection {
            qp,
            id,
            channel,
            peer,
            connected: true,
        })
    }
}

/// An established connection: its QP (in RTS), its id and its own event channel. Dropping
/// it disconnects (QP to ERR, then DISCONNECT) and destroys the QP and the id.
#[derive(Debug)]
pub struct Connection {
    qp: Qp,
    id: CmId,
    channel: EventChannel,
    peer: PrivateData,
    connected: bool,
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
        if !self.connected {
            return Ok(());
        }
        self.connected = false;
        self.id.disconnect(&mut self.qp)?;
        expect(&self.channel, "disconnect", CmEventKind::DISCONNECTED, timeout)?;
        Ok(())
    }

    /// Waits at most `timeout` for the peer to disconnect, then answers it (QP to ERR,
    /// DISCONNECT), as `rdma_disconnect` on `DISCONNECTED` does.
    pub fn wait_disconnected(&mut self, timeout: Duration) -> Result<()> {
        if !self.connected {
            return Ok(());
        }
        expect(&self.channel, "wait_disconnected", CmEventKind::DISCONNECTED, timeout)?;
        self.connected = false;
        self.id.disconnect(&mut self.qp)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if self.connected {
            // Best effort: the id's destruction that follows tears the connection down anyway.
            let _ = self.id.disconnect(&mut self.qp);
        }
    }
}
