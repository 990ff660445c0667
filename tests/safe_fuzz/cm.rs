//! The RDMA CM steps of a [`Round`] (where the CM is): listeners, connects accepted,
//! rejected, dropped on either side on the way up, to nobody or unanswered (typed rejects and
//! timeouts), disconnects from either side, and the check that a forked child's drops left
//! every id alive; with [`drive`], which polls both ends of a connect on its way up.

use super::bookkeeping::Key;
use super::round::{access_all, read_pattern, CmSide, Handle, Kind, QpSlot, Round};
use super::{ATOMIC_AREA, CM_PORTS, CM_PORT_NOBODY, MAX_LISTENERS, MAX_QPS, READ_AREA, TARGET_LEN};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};
use uverbs::cm::{ConnParam, Connection, Connector, Establishing, Listener};
use uverbs::testing::Rng;
use uverbs::*;

/// Polls `advance` of each end that is still on its way up, in random order, until both
/// ended or `deadline`; returns each end's outcome (`None`: still pending at the deadline).
/// `rng` is the caller's to spend: how many polls it takes depends on timing.
pub(crate) fn drive(
    mut rng: Rng,
    ends: [&mut Option<Establishing>; 2],
    deadline: Instant,
) -> [Option<Result<Connection>>; 2] {
    let mut out: [Option<Result<Connection>>; 2] = [None, None];
    let [a, b] = ends;
    let ends = [a, b];
    loop {
        let first = rng.below(2) as usize;
        for k in [first, 1 - first] {
            let Some(e) = ends[k].as_mut() else { continue };
            match e.advance() {
                Ok(false) => {}
                Ok(true) => out[k] = Some(ends[k].take().expect("pending").finish()),
                Err(err) => {
                    // The end (its id, channel and QP) goes down with the error.
                    *ends[k] = None;
                    out[k] = Some(Err(err));
                }
            }
        }
        if ends.iter().all(|e| e.is_none()) || Instant::now() >= deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Private data of `len` bytes, different each time.
pub(crate) fn cm_data(rng: &mut Rng, len: usize) -> Vec<u8> {
    let seed = rng.next_u64();
    (0..len).map(|i| (seed >> (8 * (i % 8))) as u8 ^ i as u8).collect()
}

impl Round<'_> {
    pub(crate) fn cm_step(&mut self) {
        self.cm_touched = true;
        match self.rng.below(100) {
            0..=11 => {
                self.cm_listen();
            }
            12..=56 => self.cm_connect(),
            57..=63 => self.cm_connect_nobody(),
            64..=67 => self.cm_time_out(),
            68..=70 => self.cm_unreachable(),
            71..=92 => self.cm_disconnect(),
            _ => {
                if let Some(l) = Self::pick(&mut self.rng, &self.listeners) {
                    self.drop_listener(l);
                }
            }
        }
    }

    pub(crate) fn cm_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.cm_ip.expect("the CM is available"), port)
    }

    /// The round's objects on the CM's device, made from the first id bound to it.
    pub(crate) fn cm_side(&mut self, ctx: Result<Context>) -> bool {
        if self.cm.is_some() {
            return true;
        }
        self.call("cm_context");
        let ctx = match ctx {
            Ok(ctx) => ctx,
            Err(e) => {
                let k = self.error(&e);
                step!(self, "cm: context -> {k}");
                return false;
            }
        };
        let pd = ctx.alloc_pd().expect("alloc_pd on the CM's device");
        let mut target = pd
            .alloc_remote_mr(TARGET_LEN, access_all())
            .expect("a target region on the CM's device");
        let pattern: Vec<u8> = (0..ATOMIC_AREA - READ_AREA).map(read_pattern).collect();
        target.write(READ_AREA, &pattern).expect("in the region");
        step!(self, "cm: the CM's device is {}", ctx.device().name);
        self.cm = Some(CmSide { ctx, pd, target });
        true
    }

    pub(crate) fn cm_listen(&mut self) -> Option<usize> {
        if Self::live(&self.listeners).len() >= MAX_LISTENERS {
            return Self::pick(&mut self.rng, &self.listeners);
        }
        if self.rng.chance(5) {
            self.call("cm_listen");
            let r = Listener::bind("127.0.0.1:7701".parse().expect("an address"));
            let e = r.expect_err("the RDMA CM takes no loopback address");
            let k = self.error(&e);
            assert!(matches!(e, Error::Loopback { .. }), "a loopback bind: {e:?}");
            step!(self, "cm: listen on 127.0.0.1 -> {k}");
            return None;
        }
        let port = CM_PORTS[self.rng.below(CM_PORTS.len() as u64) as usize];
        let taken = self.listeners.iter().flatten().any(|(_, p)| *p == port);
        self.call("cm_listen");
        match Listener::bind(self.cm_addr(port)) {
            Ok(l) => {
                assert!(!taken, "cm: a second listener on port {port}");
                self.listeners.push(Some((l, port)));
                step!(self, "cm: listen on {port} -> l{}", self.listeners.len() - 1);
                Some(self.listeners.len() - 1)
            }
            Err(e) => {
                let k = self.error(&e);
                step!(self, "cm: listen on {port} -> {k}");
                None
            }
        }
    }

    pub(crate) fn drop_listener(&mut self, l: usize) {
        let (listener, port) = self.listeners[l].take().expect("live");
        self.call("cm_listener_drop");
        drop(listener);
        step!(self, "cm: l{l} (port {port}) dropped");
    }

    /// Resolves `addr` on a new connector, bounded by `timeout` a step.
    pub(crate) fn cm_resolve(&mut self, addr: SocketAddr, timeout: Duration) -> Option<Connector> {
        self.call("cm_resolve");
        match Connector::resolve(addr, timeout) {
            Ok(c) => {
                let ctx = c.context();
                self.cm_side(ctx).then_some(c)
            }
            Err(e) => {
                let k = self.error(&e);
                step!(self, "cm: resolve {addr} -> {k}");
                None
            }
        }
    }

    pub(crate) fn conn_param<'d>(&mut self, data: &'d [u8]) -> ConnParam<'d> {
        let small = |rng: &mut Rng| rng.chance(50).then(|| rng.below(5) as u8);
        ConnParam {
            private_data: data,
            responder_resources: small(&mut self.rng),
            initiator_depth: small(&mut self.rng),
            flow_control: self.rng.chance(50),
            retry_count: if self.rng.chance(3) { 8 } else { self.rng.below(8) as u8 },
            rnr_retry_count: self.rng.below(8) as u8,
            ack_timeout: self.rng.chance(50).then(|| 12 + self.rng.below(8) as u8),
        }
    }

    /// A QP on the CM's device for one end, in a slot of its own while receives are posted
    /// on it before the connect or accept (`init_qp` first), then taken out for the CM: the
    /// slot's index, the QP and the receives it holds.
    pub(crate) fn cm_qp(&mut self, init: impl FnOnce(&mut Qp) -> Result<()>) -> Option<(usize, Qp, VecDeque<Key>)> {
        let i = self.create_qp_on(Kind::Rc, None, true)?;
        if self.rng.chance(50) {
            self.call("cm_init_qp");
            let r = init(&mut self.qps[i].as_mut().expect("live").qp);
            let k = match &r {
                Ok(()) => "ok".to_string(),
                Err(e) => self.error(e),
            };
            step!(self, "qp{i}: cm init_qp -> {k}");
            if r.is_ok() {
                for _ in 0..self.rng.below(5) {
                    self.recv_buf(i);
                }
            }
        }
        let slot = self.qps[i].take().expect("live");
        let Handle::Plain(qp) = slot.qp else {
            unreachable!("made plain")
        };
        Some((i, qp, slot.recvs))
    }

    /// An end that came up goes into slot `i`; one that did not took its QP down with it.
    pub(crate) fn cm_end(
        &mut self,
        i: usize,
        held: (usize, usize),
        recvs: VecDeque<Key>,
        r: Option<Result<Connection>>,
        peer: u32,
        who: &str,
    ) -> bool {
        match r {
            Some(Ok(conn)) => {
                assert_eq!(conn.qp().state(), QpState::Rts, "qp{i}: the {who}'s established QP");
                assert_eq!(conn.qp().held_bufs(), held, "qp{i}: the {who}'s buffers");
                self.stats.cm_connections += 1;
                step!(self, "qp{i}: the {who} is connected (qpn {})", conn.qp().qpn());
                self.qps[i] = Some(QpSlot {
                    qp: Handle::Conn(Box::new(conn)),
                    cm: true,
                    kind: Kind::Rc,
                    peer,
                    srq: None,
                    sends: VecDeque::new(),
                    recvs,
                    link_up: true,
                });
                true
            }
            Some(Err(e)) => {
                let k = self.error(&e);
                self.qp_gone(i, None, held, &format!("({who}) failed: {k}"));
                false
            }
            None => {
                self.call("cm_dropped_in_flight");
                self.qp_gone(i, None, held, &format!("({who}) dropped on its way up"));
                false
            }
        }
    }

    /// A client connects to a listener; the listener takes the request and accepts, rejects,
    /// drops it, or goes away; either end may be dropped on its way up.
    pub(crate) fn cm_connect(&mut self) {
        if Self::live(&self.qps).len() + 2 > MAX_QPS {
            return;
        }
        let Some(l) = self.cm_listen() else { return };
        let port = self.listeners[l].as_ref().expect("live").1;
        let addr = self.cm_addr(port);
        let Some(connector) = self.cm_resolve(addr, Duration::from_secs(2)) else {
            return;
        };
        let from = connector.id().query_addr().ok().and_then(|a| a.src);
        let Some((ci, qp, crecvs)) = self.cm_qp(|qp| connector.id().init_qp(qp)) else {
            return;
        };
        let cqpn = qp.qpn();
        let len = if self.rng.chance(8) {
            57 + self.rng.below(4)
        } else {
            self.rng.below(57)
        } as usize;
        let cdata = cm_data(&mut self.rng, len);
        let param = self.conn_param(&cdata);
        let cheld = qp.held_bufs();
        self.call("cm_start_connect");
        let mut client = match connector.start_connect(qp, &param) {
            Ok(e) => Some(e),
            Err(uverbs::cm::ConnectFailed { error: e, qp }) => {
                drop(qp);
                let k = self.error(&e);
                step!(self, "qp{ci}: cm connect to {addr} ({len} bytes, {param:?}) -> {k}");
                assert!(len <= 56 || matches!(e, Error::PrivateDataTooLong { .. }), "{e:?}");
                self.qp_gone(ci, None, cheld, "dropped with its failed connect");
                return;
            }
        };
        step!(self, "qp{ci}: cm connect to {addr} ({len} bytes) sent");
        // The listener's side: its request (stale ones of clients gone are dropped).
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut req = None;
        while Instant::now() < deadline {
            self.call("cm_try_request");
            let Some((listener, _)) = self.listeners[l].as_ref() else {
                break;
            };
            match listener.try_request() {
                Ok(Some(r)) => {
                    let dst = r.query_addr().ok().and_then(|a| a.dst);
                    if dst.is_some() && dst == from {
                        req = Some(r);
                        break;
                    }
                    step!(self, "cm: l{l}: a stale request (from {dst:?}) dropped");
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => {
                    let k = self.error(&e);
                    step!(self, "cm: l{l}: try_request -> {k}");
                }
            }
        }
        let mut server = None;
        let mut server_end = None;
        let mut rejected = None;
        match (req, self.rng.below(100)) {
            (None, _) => step!(self, "cm: l{l}: no request came"),
            (Some(req), 0..=69) => {
                assert_eq!(&req.private_data[..len], &cdata[..], "the request's private data");
                self.call("cm_request_context");
                let same = req.context().map(|c| c.device().name.clone());
                let cm_dev = self.cm.as_ref().expect("the CM side").ctx.device().name.clone();
                assert_eq!(same.as_ref().ok(), Some(&cm_dev), "the request's device");
                if let Some((si, qp, srecvs)) = self.cm_qp(|qp| req.init_qp(qp)) {
                    let slen = if self.rng.chance(8) {
                        197 + self.rng.below(4)
                    } else {
                        self.rng.below(197)
                    } as usize;
                    let sdata = cm_data(&mut self.rng, slen);
                    let sparam = self.conn_param(&sdata);
                    let sheld = qp.held_bufs();
                    let sqpn = qp.qpn();
                    self.call("cm_start_accept");
                    match req.start_accept(qp, &sparam) {
                        Ok(e) => {
                            step!(self, "qp{si}: cm accept ({slen} bytes) sent");
                            server = Some(e);
                            server_end = Some((si, sheld, srecvs, sqpn, sdata));
                        }
                        Err(e) => {
                            let k = self.error(&e);
                            step!(self, "qp{si}: cm accept ({slen} bytes, {sparam:?}) -> {k}");
                            assert!(slen <= 196 || matches!(e, Error::PrivateDataTooLong { .. }), "{e:?}");
                            self.qp_gone(si, None, sheld, "dropped with its failed accept");
                        }
                    }
                }
            }
            (Some(req), 70..=84) => {
                let rlen = if self.rng.chance(10) { 149 } else { self.rng.below(149) } as usize;
                let rdata = cm_data(&mut self.rng, rlen);
                self.call("cm_reject");
                let r = req.reject(&rdata);
                let k = match &r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => self.error(e),
                };
                step!(self, "cm: l{l}: reject ({rlen} bytes) -> {k}");
                assert_eq!(r.is_ok(), rlen <= 148, "reject with {rlen} bytes: {r:?}");
                if r.is_ok() {
                    rejected = Some(rdata);
                }
            }
            (Some(req), 85..=92) => {
                self.call("cm_request_drop");
                drop(req);
                step!(self, "cm: l{l}: request dropped");
            }
            (Some(req), _) => {
                // The listener goes, then the request it handed out.
                self.drop_listener(l);
                drop(req);
            }
        }
        // Either end dropped on its way up, sometimes.
        if self.rng.chance(4) {
            client = None;
            step!(self, "qp{ci}: the connect dropped in flight");
        }
        if server.is_some() && self.rng.chance(4) {
            server = None;
            step!(self, "cm: the accept dropped in flight");
        }
        let had = [client.is_some(), server.is_some()];
        let deadline = Instant::now() + Duration::from_secs(2);
        let [c, s] = drive(Rng::new(self.rng.next_u64()), [&mut client, &mut server], deadline);
        if let (Some(data), Some(Err(Error::Rejected { status, private_data }))) = (&rejected, &c) {
            assert_eq!(*status, 28, "a consumer reject's reason");
            assert_eq!(&private_data[..data.len()], &data[..], "the reject's private data");
        }
        if rejected.is_some() {
            assert!(!matches!(c, Some(Ok(_))), "rejected, yet connected");
        }
        if let (Some(Ok(conn)), Some((_, _, _, _, sdata))) = (&c, &server_end) {
            assert_eq!(
                &conn.peer_private_data()[..sdata.len()],
                &sdata[..],
                "the accept's private data"
            );
        }
        let c = if had[0] { c } else { None };
        let speer = server_end.as_ref().map_or(0, |e| e.3);
        self.cm_end(ci, cheld, crecvs, c, speer, "client");
        if let Some((si, sheld, srecvs, _, _)) = server_end {
            let s = if had[1] { s } else { None };
            self.cm_end(si, sheld, srecvs, s, cqpn, "server");
        }
    }

    /// A connect where nothing listens: a typed reject.
    pub(crate) fn cm_connect_nobody(&mut self) {
        let addr = self.cm_addr(CM_PORT_NOBODY);
        let Some(connector) = self.cm_resolve(addr, Duration::from_secs(2)) else {
            return;
        };
        let Some((i, qp, _)) = self.cm_qp(|qp| connector.id().init_qp(qp)) else {
            return;
        };
        let held = qp.held_bufs();
        self.call("cm_connect");
        let r = connector.connect(qp, &ConnParam::default(), Duration::from_secs(2));
        let e = r.expect_err("a connect where nothing listens").error;
        let k = self.error(&e);
        step!(self, "qp{i}: cm connect to {addr}, nobody there -> {k}");
        assert!(matches!(e, Error::Rejected { status: 8, .. }), "no listener: {e:?}");
        self.qp_gone(i, None, held, "dropped with its rejected connect");
    }

    /// A connect nobody answers: a listener that never takes the request, or an address with
    /// no host behind it (the dummy netdev is NOARP). A typed timeout.
    pub(crate) fn cm_time_out(&mut self) {
        let listener = self.rng.chance(50).then(|| self.cm_listen()).flatten();
        let addr = match listener {
            Some(l) => self.cm_addr(self.listeners[l].as_ref().expect("live").1),
            None => {
                let IpAddr::V4(ip) = self.cm_ip.expect("the CM") else {
                    return;
                };
                let [a, b, c, d] = ip.octets();
                SocketAddr::new(IpAddr::from([a, b, c, d.wrapping_add(98)]), 7711)
            }
        };
        let Some(connector) = self.cm_resolve(addr, Duration::from_secs(2)) else {
            return;
        };
        let Some((i, qp, _)) = self.cm_qp(|qp| connector.id().init_qp(qp)) else {
            return;
        };
        let held = qp.held_bufs();
        let t = Duration::from_millis(50 + self.rng.below(150));
        self.call("cm_connect");
        let r = connector.connect(qp, &ConnParam::default(), t);
        let e = r.expect_err("a connect nobody answers").error;
        let k = self.error(&e);
        step!(self, "qp{i}: cm connect to {addr}, unanswered, {t:?} -> {k}");
        assert!(
            matches!(e, Error::TimedOut { verb: "connect", .. }),
            "unanswered: {e:?}"
        );
        self.qp_gone(i, None, held, "dropped with its connect timed out");
        // The request left on the listener: taken and dropped, or left for later.
        if let Some(l) = listener.filter(|_| self.rng.chance(70)) {
            let listener = &self.listeners[l].as_ref().expect("live").0;
            let r = listener.get_request(Duration::from_millis(20));
            self.call("cm_get_request");
            let k = match &r {
                Ok(_) => "a request, dropped".to_string(),
                Err(e) => self.error(e),
            };
            step!(self, "cm: l{l}: get_request -> {k}");
        }
    }

    /// An address no route leads to: a typed error from the resolution.
    pub(crate) fn cm_unreachable(&mut self) {
        let addr: SocketAddr = "169.254.178.1:7712".parse().expect("an address");
        self.call("cm_resolve");
        let r = Connector::resolve(addr, Duration::from_millis(100));
        let e = r.expect_err("no route to 169.254.178.1");
        let k = self.error(&e);
        step!(self, "cm: resolve {addr} -> {k}");
    }

    /// The live connections' slots.
    pub(crate) fn conns(&self) -> Vec<usize> {
        Self::live(&self.qps)
            .into_iter()
            .filter(|&i| matches!(self.qps[i].as_ref().expect("live").qp, Handle::Conn(_)))
            .collect()
    }

    pub(crate) fn conn(&mut self, i: usize) -> &mut Connection {
        match &mut self.qps[i].as_mut().expect("live").qp {
            Handle::Conn(c) => c,
            Handle::Plain(_) => unreachable!("a connection"),
        }
    }

    /// Marks connection `i` as touched by a disconnect; whether it was untouched until now.
    pub(crate) fn link_down(&mut self, i: usize) -> bool {
        std::mem::replace(&mut self.qps[i].as_mut().expect("live").link_up, false)
    }

    /// A disconnect from either side, waited for or not, both at once, or a poll.
    pub(crate) fn cm_disconnect(&mut self) {
        let conns = self.conns();
        if conns.is_empty() {
            return;
        }
        let i = conns[self.rng.below(conns.len() as u64) as usize];
        let peer = self.qps[i].as_ref().expect("live").peer;
        // The other end, if it is a live connection of the round on the CM's device.
        let p = conns
            .iter()
            .copied()
            .find(|&p| p != i && self.qps[p].as_ref().expect("live").qp.qpn() == peer);
        let how = self.rng.below(6);
        let mut outcome = Vec::new();
        let start = |r: &mut Self, k: usize| {
            r.call("cm_start_disconnect");
            let was_up = r.link_down(k);
            let res = r.conn(k).start_disconnect();
            if res.is_ok() && was_up {
                assert_eq!(r.conn(k).qp().state(), QpState::Err, "qp{k}: disconnecting, so in ERR");
            }
            match res {
                Ok(()) => format!("qp{k}: start_disconnect ok"),
                Err(e) => format!("qp{k}: start_disconnect {}", r.error(&e)),
            }
        };
        match how {
            0..=2 => {
                outcome.push(start(self, i));
                if how == 1 {
                    if let Some(p) = p {
                        outcome.push(start(self, p));
                    }
                }
                if how <= 1 {
                    // Both ends advance until each has seen DISCONNECTED.
                    let deadline = Instant::now() + Duration::from_millis(1500);
                    let mut left: Vec<usize> = [Some(i), p].into_iter().flatten().collect();
                    // Its own draws: how many polls it takes depends on timing.
                    let mut order = Rng::new(self.rng.next_u64());
                    while !left.is_empty() && Instant::now() < deadline {
                        let k = left[order.below(left.len() as u64) as usize];
                        self.call("cm_advance");
                        match self.conn(k).advance() {
                            Ok(true) => {
                                self.link_down(k);
                                left.retain(|&x| x != k);
                                outcome.push(format!("qp{k}: down"));
                            }
                            Ok(false) => std::thread::sleep(Duration::from_millis(1)),
                            Err(e) => {
                                self.link_down(k);
                                left.retain(|&x| x != k);
                                let kind = self.error(&e);
                                outcome.push(format!("qp{k}: advance {kind}"));
                            }
                        }
                    }
                    if !left.is_empty() {
                        outcome.push(format!("{left:?} not down in time"));
                    }
                }
            }
            3 => {
                let t = Duration::from_millis(20 + self.rng.below(80));
                self.call("cm_disconnect");
                self.link_down(i);
                let r = self.conn(i).disconnect(t);
                let k = match &r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => self.error(e),
                };
                outcome.push(format!("qp{i}: disconnect({t:?}) -> {k}"));
            }
            4 => {
                self.call("cm_wait_disconnected");
                self.link_down(i);
                let r = self.conn(i).wait_disconnected(Duration::ZERO);
                let k = match &r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => self.error(e),
                };
                outcome.push(format!("qp{i}: wait_disconnected(0) -> {k}"));
            }
            _ => {
                self.call("cm_advance");
                let r = self.conn(i).advance();
                if !matches!(r, Ok(false)) {
                    self.link_down(i);
                }
                let k = match &r {
                    Ok(down) => format!("{down}"),
                    Err(e) => self.error(e),
                };
                outcome.push(format!("qp{i}: advance -> {k}"));
            }
        }
        step!(self, "cm disconnect (peer qp{p:?}): {}", outcome.join("; "));
    }

    /// Every id of the round still answers: a forked child's drops destroyed none of them.
    pub(crate) fn check_cm_ids_alive(&mut self, when: &str) {
        for (listener, port) in self.listeners.iter().flatten() {
            let a = listener.local_addr();
            assert!(
                matches!(a, Ok(a) if a.port() == *port),
                "a listener on {port} {when}: {a:?}"
            );
        }
        for i in self.conns() {
            let a = self.conn(i).id().query_addr();
            assert!(a.is_ok(), "qp{i}'s connection {when}: {a:?}");
        }
    }

    pub(crate) fn cm_used(&self) -> bool {
        self.cm_touched
    }
}
