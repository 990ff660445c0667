//! The RDMA connection manager (`uverbs::cm`) against the kernel's rdma_ucm and rxe: both
//! ends in this process, on the address of a netdev with an rxe device (`UVERBS_CM_ADDR`; the
//! test guest puts `rxe_cm` on a dummy netdev with 169.254.77.1). Every test ends by checking
//! that no cm_id of this process is left (`rdma resource show cm_id`).

mod common;

use common::cm::*;
use common::wire::{sh, Capture, Wire};
use common::*;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::thread;
use std::time::Duration;
use uverbs::cm::{CmEventKind, CmOption, ConnParam, Connector, EventChannel, Listener};
use uverbs::*;

const T: Duration = Duration::from_secs(20);

#[test]
fn connect_and_accept_with_private_data_at_the_limits_then_move_a_message() {
    let addr = cm_addr(7471);
    let listener = Listener::bind(addr).unwrap();
    assert_eq!(listener.local_addr().unwrap(), addr);
    // The check every test ends with sees this process's ids.
    let ids = my_cm_ids();
    assert!(
        ids.len() == 1 && ids[0].contains("LISTEN"),
        "{ids:?} in\n{}",
        cm_id_table()
    );
    let (req_data, rep_data) = (pattern(56, 1), pattern(196, 2));
    let before = kernel_footprint();
    thread::scope(|s| {
        let server = s.spawn(|| {
            let req = listener.get_request(T).unwrap();
            // RoCE reports the whole REQ area: exactly what was sent, 56 bytes.
            assert_eq!(&req.private_data[..], &req_data[..]);
            assert!(req.conn.responder_resources > 0, "{:?}", req.conn);
            let mut side = Side::new(&req.context().unwrap());
            let param = ConnParam {
                private_data: &rep_data,
                ..Default::default()
            };
            let mut conn = req.accept(side.qp(), &param, T).unwrap();
            assert_eq!(conn.peer_private_data(), &req_data[..]);
            assert_eq!(conn.qp().state(), QpState::Rts);
            let info = conn.qp_mut().query().unwrap();
            println!("passive QP after accept: {:?}", info.attr);
            side.post_recv(conn.qp_mut(), 1);
            let wc = side.one();
            wc.result().unwrap();
            assert_eq!(wc.wr_id, 1);
            assert_eq!(&side.mr.as_slice()[..wc.byte_len as usize], b"hello over rdma_cm");
            // A receive posted now is flushed exactly once by the disconnect.
            side.post_recv(conn.qp_mut(), 2);
            conn.wait_disconnected(T).unwrap();
            let wc = side.one();
            assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WR_FLUSH_ERR));
            assert_idle(&mut side.cq);
        });
        let connector = Connector::resolve(addr, T).unwrap();
        let mut side = Side::new(&connector.context().unwrap());
        let param = ConnParam {
            private_data: &req_data,
            ..Default::default()
        };
        let mut conn = connector.connect(side.qp(), &param, T).unwrap();
        // The whole REP area: 196 bytes.
        assert_eq!(conn.peer_private_data(), &rep_data[..]);
        assert_eq!(conn.qp().state(), QpState::Rts);
        let info = conn.qp_mut().query().unwrap();
        println!("active QP after connect: {:?}", info.attr);
        // The CM's INIT attributes, applied again once the reply settled the responder
        // resources (as librdmacm does): the server may write and read this side's memory.
        let access = info.attr.access.unwrap();
        assert!(
            access.contains(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ),
            "{access:?}"
        );
        side.mr.as_mut_slice()[..18].copy_from_slice(b"hello over rdma_cm");
        let sge = [side.mr.sge(0, 18).unwrap()];
        // SAFETY: `mr` outlives the request; its completion is polled below.
        unsafe { conn.qp_mut().post_send(&[SendWr::new(7, SendOp::Send, &sge)]).unwrap() };
        let wc = side.one();
        wc.result().unwrap();
        assert_eq!(wc.wr_id, 7);
        side.post_recv(conn.qp_mut(), 3);
        conn.disconnect(T).unwrap();
        let wc = side.one();
        assert_eq!((wc.wr_id, wc.status), (3, WcStatus::WR_FLUSH_ERR));
        assert_idle(&mut side.cq);
        drop(conn);
        server.join().unwrap();
    });
    drop(listener);
    assert_no_cm_ids();
    assert!(
        kernel_footprint().0 <= before.0 + 1,
        "fds: {before:?} -> {:?}",
        kernel_footprint()
    );
}

#[test]
fn the_passive_side_disconnects_first() {
    let addr = cm_addr(7472);
    let listener = Listener::bind(addr).unwrap();
    thread::scope(|s| {
        let server = s.spawn(|| {
            let req = listener.get_request(T).unwrap();
            // Fewer bytes than the REQ carries: the kernel reports the whole area, padded.
            assert_eq!(req.private_data.len(), 56);
            assert_eq!(&req.private_data[..5], b"short");
            assert!(req.private_data[5..].iter().all(|b| *b == 0));
            let side = Side::new(&req.context().unwrap());
            let param = ConnParam {
                private_data: b"rep",
                ..Default::default()
            };
            let mut conn = req.accept(side.qp(), &param, T).unwrap();
            conn.disconnect(T).unwrap();
        });
        let connector = Connector::resolve(addr, T).unwrap();
        let mut side = Side::new(&connector.context().unwrap());
        let param = ConnParam {
            private_data: b"short",
            ..Default::default()
        };
        let mut conn = connector.connect(side.qp(), &param, T).unwrap();
        assert_eq!(conn.peer_private_data().len(), 196, "the whole REP area");
        assert_eq!(&conn.peer_private_data()[..3], b"rep");
        side.post_recv(conn.qp_mut(), 9);
        conn.wait_disconnected(T).unwrap();
        let wc = side.one();
        assert_eq!((wc.wr_id, wc.status), (9, WcStatus::WR_FLUSH_ERR));
        assert_idle(&mut side.cq);
        assert_eq!(conn.qp().state(), QpState::Err);
        server.join().unwrap();
    });
    drop(listener);
    assert_no_cm_ids();
}

#[test]
fn a_reject_delivers_its_private_data_and_reason() {
    let addr = cm_addr(7473);
    let listener = Listener::bind(addr).unwrap();
    let rej_data = pattern(148, 3);
    thread::scope(|s| {
        let server = s.spawn(|| listener.get_request(T).unwrap().reject(&rej_data).unwrap());
        let connector = Connector::resolve(addr, T).unwrap();
        let side = Side::new(&connector.context().unwrap());
        match connector
            .connect(side.qp(), &ConnParam::default(), T)
            .map_err(|f| f.error)
        {
            Err(Error::Rejected { status, private_data }) => {
                assert_eq!(status, 28, "IB_CM_REJ_CONSUMER_DEFINED");
                assert_eq!(private_data, rej_data);
            }
            other => panic!("expected a reject, got {other:?}"),
        }
        server.join().unwrap();
    });
    drop(listener);
    assert_no_cm_ids();
}

#[test]
fn private_data_over_the_transport_limits_is_refused_before_the_kernel() {
    let addr = cm_addr(7474);
    let listener = Listener::bind(addr).unwrap();
    let connector = Connector::resolve(addr, T).unwrap();
    let limits = connector.id().private_data_limits().unwrap();
    assert_eq!((limits.connect, limits.accept, limits.reject), (56, 196, 148));
    let side = Side::new(&connector.context().unwrap());
    let too_long = pattern(57, 4);
    let param = ConnParam {
        private_data: &too_long,
        ..Default::default()
    };
    let err = connector.connect(side.qp(), &param, T).unwrap_err().error;
    assert!(
        matches!(
            err,
            Error::PrivateDataTooLong {
                verb: "connect",
                len: 57,
                max: 56
            }
        ),
        "{err}"
    );

    // Accept with 197 bytes, then reject with 149: each refused, the request then dropped,
    // which the active side sees as a reject.
    for (verb, len) in [("accept", 197), ("reject", 149)] {
        thread::scope(|s| {
            let server = s.spawn(|| {
                let req = listener.get_request(T).unwrap();
                let data = pattern(len, 5);
                let err = if verb == "accept" {
                    let side = Side::new(&req.context().unwrap());
                    let param = ConnParam {
                        private_data: &data,
                        ..Default::default()
                    };
                    req.accept(side.qp(), &param, T).unwrap_err()
                } else {
                    req.reject(&data).unwrap_err()
                };
                match err {
                    Error::PrivateDataTooLong { verb: v, len: l, max } => {
                        assert_eq!((v, l, max), (verb, len, if verb == "accept" { 196 } else { 148 }))
                    }
                    other => panic!("{verb}: {other}"),
                }
            });
            let connector = Connector::resolve(addr, T).unwrap();
            let side = Side::new(&connector.context().unwrap());
            let err = connector
                .connect(side.qp(), &ConnParam::default(), T)
                .unwrap_err()
                .error;
            assert!(matches!(err, Error::Rejected { .. }), "{verb}: {err}");
            server.join().unwrap();
        });
    }
    drop(listener);
    assert_no_cm_ids();
}

#[test]
fn connecting_where_nothing_listens_is_a_typed_reject() {
    let connector = Connector::resolve(cm_addr(7475), T).unwrap();
    let side = Side::new(&connector.context().unwrap());
    match connector
        .connect(side.qp(), &ConnParam::default(), T)
        .map_err(|f| f.error)
    {
        Err(Error::Rejected { status, .. }) => assert_eq!(status, 8, "IB_CM_REJ_INVALID_SERVICE_ID"),
        other => panic!("expected a reject, got {other:?}"),
    }
    assert_no_cm_ids();
}

#[test]
fn loopback_addresses_are_a_typed_error() {
    for addr in ["127.0.0.1:7476", "[::1]:7476"] {
        let addr: SocketAddr = addr.parse().unwrap();
        let err = Connector::resolve(addr, T).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Loopback {
                    verb: "resolve_addr",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("loopback"), "{err}");
        let err = Listener::bind(addr).unwrap_err();
        assert!(matches!(err, Error::Loopback { verb: "bind", .. }), "{err}");
    }
    assert_no_cm_ids();
}

#[test]
fn a_listener_dropped_with_unanswered_requests_leaves_nothing() {
    let addr = cm_addr(7477);
    let before = kernel_footprint();
    let listener = Listener::bind(addr).unwrap();
    thread::scope(|s| {
        let clients: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(move || {
                    let connector = Connector::resolve(addr, T).unwrap();
                    let side = Side::new(&connector.context().unwrap());
                    connector
                        .connect(side.qp(), &ConnParam::default(), T)
                        .unwrap_err()
                        .error
                })
            })
            .collect();
        // Both requests queued on the listener's channel, neither read: the two new ids
        // (bound to the listener's address) are in state CONNECT.
        let children = format!("src-addr {addr} ");
        let deadline = std::time::Instant::now() + T;
        loop {
            let ids = my_cm_ids();
            let queued = ids
                .iter()
                .filter(|l| l.contains("state CONNECT") && l.contains(&children))
                .count();
            if queued == 2 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "two requests never queued: {ids:#?} in\n{}",
                cm_id_table()
            );
            thread::sleep(Duration::from_millis(50));
        }
        let mut fds = [nix::poll::PollFd::new(
            listener.channel().as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        assert_eq!(
            nix::poll::poll(&mut fds, 0u16).unwrap(),
            1,
            "the listener's channel polls readable"
        );
        drop(listener);
        for c in clients {
            let err = c.join().unwrap();
            println!("a request the listener never read: {err}");
            assert!(matches!(err, Error::Rejected { .. }), "{err}");
        }
    });
    assert_no_cm_ids();
    assert_eq!(kernel_footprint().0, before.0, "an fd was left open");
}

#[test]
fn events_are_polled_and_migrate_with_their_id() {
    let (a, b) = (EventChannel::open().unwrap(), EventChannel::open().unwrap());
    let mut id = a.create_id().unwrap();
    assert_eq!(a.kernel_id(id.uid()), Some(id.kernel_id()));
    assert!(a.try_get_event().unwrap().is_none());
    id.resolve_addr(None, cm_addr(7478), T).unwrap();
    // The fd polls readable once the event is queued; it stays queued there.
    let mut fds = [nix::poll::PollFd::new(a.as_fd(), nix::poll::PollFlags::POLLIN)];
    assert_eq!(nix::poll::poll(&mut fds, 20_000u16).unwrap(), 1);
    assert_eq!(
        id.migrate(&b).unwrap(),
        0,
        "no event of the id was read on the old channel"
    );
    assert_eq!(
        (a.kernel_id(id.uid()), b.kernel_id(id.uid())),
        (None, Some(id.kernel_id()))
    );
    assert!(
        a.try_get_event().unwrap().is_none(),
        "the queued event moved with the id"
    );
    let event = b.get_event(Some(T)).unwrap();
    assert_eq!(
        (event.kind, event.status, event.uid),
        (CmEventKind::ADDR_RESOLVED, 0, id.uid())
    );
    let addr = id.query_addr().unwrap();
    assert_eq!(addr.dst, Some(cm_addr(7478)));
    assert_eq!(id.device().unwrap().kernel_index, Some(addr.ibdev_index));
    assert_eq!(id.destroy().unwrap(), 1, "events_reported: the one read");
    assert!(b.try_get_event().unwrap().is_none());
    assert_no_cm_ids();
}

/// The asynchronous API in a mio event loop: three clients on one channel and a listener on
/// another, every step started from the event that ends the previous one, and every
/// wake-up bringing at least one event.
#[test]
fn an_event_loop_drives_connects_and_accepts_without_busy_wakeups() {
    use mio::unix::SourceFd;
    use mio::{Events, Interest, Poll, Token};
    use std::collections::HashMap;
    use std::os::fd::AsRawFd;
    const N: usize = 3;
    let addr = cm_addr(7479);
    let (server_ch, client_ch) = (EventChannel::open().unwrap(), EventChannel::open().unwrap());
    let mut listener = server_ch.create_id().unwrap();
    listener.bind(addr).unwrap();
    listener.listen(0).unwrap();
    let mut clients: HashMap<u64, (uverbs::cm::CmId, Option<Qp>)> = HashMap::new();
    for _ in 0..N {
        let mut id = client_ch.create_id().unwrap();
        id.resolve_addr(None, addr, T).unwrap();
        clients.insert(id.uid(), (id, None));
    }
    let mut poll = Poll::new().unwrap();
    let (server_fd, client_fd) = (server_ch.as_fd().as_raw_fd(), client_ch.as_fd().as_raw_fd());
    poll.registry()
        .register(&mut SourceFd(&server_fd), Token(0), Interest::READABLE)
        .unwrap();
    poll.registry()
        .register(&mut SourceFd(&client_fd), Token(1), Interest::READABLE)
        .unwrap();
    let (mut sides, mut accepted) = (Vec::new(), HashMap::new());
    let (mut connected, mut established, mut wakeups, mut events_seen) = (0, 0, 0, 0);
    let mut events = Events::with_capacity(4);
    while connected < N || established < N {
        poll.poll(&mut events, Some(T)).unwrap();
        assert!(
            !events.is_empty(),
            "no event within {T:?}: {connected} connected, {established} established"
        );
        for readiness in &events {
            wakeups += 1;
            let channel = if readiness.token() == Token(0) {
                &server_ch
            } else {
                &client_ch
            };
            let mut got = 0;
            while let Some(mut event) = channel.try_get_event().unwrap() {
                got += 1;
                assert_eq!(event.status, 0, "{event:?}");
                match event.kind {
                    CmEventKind::ADDR_RESOLVED => clients.get_mut(&event.uid).unwrap().0.resolve_route(T).unwrap(),
                    CmEventKind::ROUTE_RESOLVED => {
                        let (id, qp) = clients.get_mut(&event.uid).unwrap();
                        let side = Side::new(&id.context().unwrap());
                        let mut new_qp = side.qp();
                        id.connect(&mut new_qp, &ConnParam::default()).unwrap();
                        *qp = Some(new_qp);
                        sides.push(side);
                    }
                    CmEventKind::CONNECT_RESPONSE => {
                        let (id, qp) = clients.get_mut(&event.uid).unwrap();
                        id.establish(qp.as_mut().unwrap()).unwrap();
                        connected += 1;
                    }
                    CmEventKind::CONNECT_REQUEST => {
                        let req = event.take_request().unwrap();
                        let side = Side::new(&req.context().unwrap());
                        let mut qp = side.qp();
                        let id = req.accept_id(&mut qp, &ConnParam::default()).unwrap();
                        accepted.insert(id.uid(), (id, qp));
                        sides.push(side);
                    }
                    CmEventKind::ESTABLISHED => {
                        assert!(
                            accepted.contains_key(&event.uid),
                            "ESTABLISHED for an id not accepted: {event:?}"
                        );
                        established += 1;
                    }
                    other => panic!("unexpected {other:?}: {event:?}"),
                }
            }
            assert!(got > 0, "a wake-up with no event");
            events_seen += got;
        }
    }
    // Each of the N connections: 3 client events and 2 server events.
    assert_eq!(events_seen, 5 * N);
    assert!(wakeups <= events_seen, "{wakeups} wake-ups for {events_seen} events");
    println!("{events_seen} events in {wakeups} wake-ups");
    for (_, (id, qp)) in clients.iter_mut() {
        assert_eq!(qp.as_ref().unwrap().state(), QpState::Rts);
        assert!(id.query_addr().unwrap().dst == Some(addr));
    }
    drop((clients, accepted, listener, sides));
    assert_no_cm_ids();
}

/// A peer that never answers (an address on the dummy netdev's subnet with no host behind
/// it). A dummy netdev is NOARP, so the address and route resolve at once; the connect then
/// ends with a typed timeout (the CM itself would resend the REQ for about a minute).
#[test]
fn a_peer_that_never_answers_ends_in_a_typed_error_within_the_timeout() {
    let IpAddr::V4(ip) = cm_addr(0).ip() else {
        panic!("UVERBS_CM_ADDR must be IPv4 here")
    };
    let [a, b, c, d] = ip.octets();
    let addr = SocketAddr::new(IpAddr::from([a, b, c, d.wrapping_add(98)]), 7480);
    let short = Duration::from_secs(3);
    let start = std::time::Instant::now();
    let result = Connector::resolve(addr, short).and_then(|connector| {
        let side = Side::new(&connector.context()?);
        connector.connect(side.qp(), &ConnParam::default(), short)?;
        Ok(())
    });
    let took = start.elapsed();
    println!("{addr}: {result:?} after {took:?}");
    assert!(
        matches!(result, Err(Error::TimedOut { verb: "connect", .. })),
        "expected the connect to time out, got {result:?}"
    );
    assert!(took < 4 * short, "took {took:?}");
    assert_no_cm_ids();
}

/// Across the veth pair of `tests/two_hosts.rs`: a client on `rxe_wa` (169.254.30.1) and a
/// listener on `rxe_wb` (169.254.30.2), each id bound to its own device (found by kernel
/// index and node GUID), a message over the wire, every RoCE packet of it with the client's
/// TOS in its IP header (captured on `uvwb`); then an address behind `uvwa` that nobody
/// answers ARP for ends in `ADDR_ERROR` within the timeout.
///
/// The address is resolved with a short timeout, as rping does (2 s): on a veth pair the ARP
/// exchange completes inside the kernel's first neighbour lookup, before the resolution is
/// queued, so the neighbour update that would wake it is missed and `ADDR_RESOLVED` comes
/// only when the timeout expires (the kernel then looks again and succeeds). With the
/// 20 s of the other steps the listener gave up first (docs/kernel-facts.md).
#[test]
fn a_connection_crosses_the_veth_wire_and_an_unanswered_address_is_an_address_error() {
    let wire = Wire::up();
    let (a, b): (IpAddr, IpAddr) = ("169.254.30.1".parse().unwrap(), "169.254.30.2".parse().unwrap());
    let server_addr = SocketAddr::new(b, 7490);
    let listener = Listener::bind(server_addr).unwrap();
    let tx_before = wire.tx_packets();
    let capture = Capture::on("uvwb");
    let resolve = Duration::from_secs(2);
    let tos = 0x68;
    thread::scope(|s| {
        let server = s.spawn(|| {
            let req = listener.get_request(T).unwrap();
            assert_eq!(req.device().unwrap().name, "rxe_wb");
            let mut side = Side::new(&req.context().unwrap());
            let mut qp = side.qp();
            req.init_qp(&mut qp).unwrap();
            side.post_recv(&mut qp, 1);
            let mut conn = req.accept(qp, &ConnParam::default(), T).unwrap();
            let wc = side.one();
            wc.result().unwrap();
            assert_eq!(&side.mr.as_slice()[..wc.byte_len as usize], b"across the wire");
            conn.wait_disconnected(T).unwrap();
        });
        let start = std::time::Instant::now();
        let options = [CmOption::Tos(tos)];
        // The kernel's address timeout short, the wait for both steps not: on RoCE the route
        // step is a work item on the CM's ordered workqueue, with no timeout of its own and
        // no packet, which a loaded host may run seconds later.
        let mut connector = Connector::start(Some(SocketAddr::new(a, 0)), server_addr, &options, resolve).unwrap();
        while !connector.advance().unwrap() {
            let mut fds = [nix::poll::PollFd::new(connector.as_fd(), nix::poll::PollFlags::POLLIN)];
            let within = nix::poll::PollTimeout::try_from(T.as_millis() as i32).unwrap();
            assert_eq!(nix::poll::poll(&mut fds, within).unwrap(), 1, "nothing within {T:?}");
        }
        println!(
            "address and route resolved in {:?} (timeout {resolve:?})",
            start.elapsed()
        );
        assert_eq!(connector.id().device().unwrap().name, "rxe_wa");
        let mut side = Side::new(&connector.context().unwrap());
        let mut conn = connector.connect(side.qp(), &ConnParam::default(), T).unwrap();
        side.mr.as_mut_slice()[..15].copy_from_slice(b"across the wire");
        let sge = [side.mr.sge(0, 15).unwrap()];
        // SAFETY: `mr` outlives the request; its completion is polled below.
        unsafe { conn.qp_mut().post_send(&[SendWr::new(1, SendOp::Send, &sge)]).unwrap() };
        side.one().result().unwrap();
        conn.disconnect(T).unwrap();
        server.join().unwrap();
    });
    let crossed = wire.tx_packets() - tx_before;
    assert!(crossed >= 4, "only {crossed} packets left uvwa");
    // Every RoCE packet both ways (CM messages, the send, its ACK, the disconnect) carries
    // the client's type of service in its IP header.
    let seen = capture.roce_packets();
    println!("{} RoCE packets on uvwb (source, TOS): {seen:x?}", seen.len());
    for end in [a, b] {
        assert!(
            seen.iter().any(|(src, _)| IpAddr::V4(*src) == end),
            "none from {end}: {seen:?}"
        );
    }
    assert!(seen.iter().all(|(_, t)| *t == tos), "{seen:x?}");
    drop(listener);

    assert!(sh("ip route replace 169.254.31.0/24 dev uvwa src 169.254.30.1"));
    let short = Duration::from_secs(2);
    let start = std::time::Instant::now();
    let err = Connector::resolve("169.254.31.9:7491".parse().unwrap(), short).unwrap_err();
    let took = start.elapsed();
    sh("ip route del 169.254.31.0/24 dev uvwa");
    println!("an address nobody answers: {err} after {took:?}");
    assert!(
        matches!(err, Error::CmEvent { verb: "resolve_addr", event: "ADDR_ERROR", status } if status < 0),
        "{err}"
    );
    assert!(took < 3 * short, "took {took:?}");
    drop(wire);
    assert_no_cm_ids();
}

/// The next event on `ch`, which must be `kind` (with status 0).
fn next_event(ch: &EventChannel, kind: CmEventKind) -> uverbs::cm::CmEvent {
    let event = ch.get_event(Some(T)).unwrap();
    assert_eq!((event.kind, event.status), (kind, 0), "{event:?}");
    event
}

/// `err` is the kernel refusing `verb` with `errno`.
fn assert_kernel_error<T: std::fmt::Debug>(r: Result<T>, verb: &str, errno: nix::errno::Errno) {
    match r {
        Err(Error::Kernel { verb: v, errno: e }) if v == verb && e == errno => {}
        other => panic!("expected {verb} to fail with {errno}, got {other:?}"),
    }
}

/// REUSEADDR: ids that all set it bind one address and port; without it the second bind
/// is `EADDRINUSE`. Listening still needs the port alone (the kernel clears the option on
/// listen), and the option can no longer be turned on then, nor off after a bind. A
/// connection does not hold its listener's port: a new listener binds it, without the
/// option, while an accepted connection lives.
#[test]
fn reuseaddr_shares_a_port_between_ids_until_one_listens() {
    use nix::errno::Errno;
    let addr = cm_addr(7500);
    let ch = EventChannel::open().unwrap();
    let (mut a, mut b) = (ch.create_id().unwrap(), ch.create_id().unwrap());
    a.bind(addr).unwrap();
    assert_kernel_error(b.bind(addr), "BIND", Errno::EADDRINUSE);
    drop((a, b));

    let (mut a, mut b) = (ch.create_id().unwrap(), ch.create_id().unwrap());
    a.set_option(CmOption::ReuseAddr(true)).unwrap();
    b.set_option(CmOption::ReuseAddr(true)).unwrap();
    a.bind(addr).unwrap();
    b.bind(addr).unwrap();
    assert_kernel_error(a.listen(0), "LISTEN", Errno::EADDRINUSE);
    assert_kernel_error(b.set_option(CmOption::ReuseAddr(false)), "SET_OPTION", Errno::EINVAL);
    drop(b);
    a.listen(0).unwrap();
    assert_kernel_error(a.set_option(CmOption::ReuseAddr(true)), "SET_OPTION", Errno::EINVAL);
    let mut c = ch.create_id().unwrap();
    c.set_option(CmOption::ReuseAddr(true)).unwrap();
    assert_kernel_error(c.bind(addr), "BIND", Errno::EADDRINUSE);
    drop((a, c));

    let addr = cm_addr(7501);
    let listener = Listener::bind(addr).unwrap();
    let (accepted, listener_back) = std::sync::mpsc::channel();
    thread::scope(|s| {
        let server = s.spawn(move || {
            let req = listener.get_request(T).unwrap();
            let side = Side::new(&req.context().unwrap());
            let mut conn = req.accept(side.qp(), &ConnParam::default(), T).unwrap();
            accepted.send(listener).unwrap();
            conn.wait_disconnected(T).unwrap();
        });
        let connector = Connector::resolve(addr, T).unwrap();
        let side = Side::new(&connector.context().unwrap());
        let mut conn = connector.connect(side.qp(), &ConnParam::default(), T).unwrap();
        drop(listener_back.recv_timeout(T).unwrap());
        let again = Listener::bind(addr).unwrap();
        assert_eq!(again.local_addr().unwrap(), addr);
        conn.disconnect(T).unwrap();
        server.join().unwrap();
    });
    assert_no_cm_ids();
}

/// AFONLY on IPv6 ids bound to `[::]`: set, such an id shares its port with an IPv4 one and
/// its listener takes no IPv4 request: the REQ meets the IB CM's listen on the port, no RDMA
/// CM listener matches it, and the kernel rejects it with reason 28 (consumer defined, not
/// 8 as where nothing listens on the port) and no data, while nothing reaches the listener's
/// channel. Cleared, the IPv4 bind is `EADDRNOTAVAIL` and an IPv4 client reaches the IPv6
/// listener. After listening the option is refused.
#[test]
fn afonly_decides_whether_an_ipv6_listener_takes_ipv4_requests() {
    use nix::errno::Errno;
    let ch = EventChannel::open().unwrap();
    let any6 = |port| SocketAddr::new("::".parse().unwrap(), port);
    let any4 = |port| SocketAddr::new("0.0.0.0".parse().unwrap(), port);

    let (mut six, mut four) = (ch.create_id().unwrap(), ch.create_id().unwrap());
    six.set_option(CmOption::AfOnly(true)).unwrap();
    six.bind(any6(7502)).unwrap();
    four.bind(any4(7502)).unwrap();
    drop((six, four));
    let (mut six, mut four) = (ch.create_id().unwrap(), ch.create_id().unwrap());
    six.set_option(CmOption::AfOnly(false)).unwrap();
    six.bind(any6(7503)).unwrap();
    assert_kernel_error(four.bind(any4(7503)), "BIND", Errno::EADDRNOTAVAIL);
    drop((six, four));

    // An IPv4 client against an IPv6 listener on the same port, each way.
    let v4_client = |port: u16| -> Result<()> {
        let connector = Connector::resolve(cm_addr(port), T)?;
        let side = Side::new(&connector.context()?);
        connector.connect(side.qp(), &ConnParam::default(), T)?;
        Ok(())
    };
    let only6 = Listener::bind_with(any6(7504), &[CmOption::AfOnly(true)]).unwrap();
    match v4_client(7504) {
        Err(Error::Rejected {
            status: 28,
            private_data,
        }) => {
            assert!(private_data.iter().all(|b| *b == 0), "{private_data:?}")
        }
        other => panic!("an AF-only IPv6 listener took an IPv4 request: {other:?}"),
    }
    assert!(only6.channel().try_get_event().unwrap().is_none());
    let mut id = only6.channel().create_id().unwrap();
    id.bind(any6(7505)).unwrap();
    id.listen(0).unwrap();
    assert_kernel_error(id.set_option(CmOption::AfOnly(false)), "SET_OPTION", Errno::EINVAL);
    drop((id, only6));

    let both = Listener::bind_with(any6(7506), &[CmOption::AfOnly(false)]).unwrap();
    thread::scope(|s| {
        let server = s.spawn(|| {
            let req = both.get_request(T).unwrap();
            let peer = req.query_addr().unwrap().dst.unwrap();
            req.reject(b"seen by the IPv6 listener").unwrap();
            peer
        });
        match v4_client(7506) {
            Err(Error::Rejected {
                status: 28,
                private_data,
            }) => {
                assert_eq!(&private_data[..25], b"seen by the IPv6 listener")
            }
            other => panic!("expected the IPv6 listener's reject, got {other:?}"),
        }
        let peer = server.join().unwrap();
        println!("the IPv6 listener saw the IPv4 client as {peer}");
        assert_eq!(peer.ip(), cm_addr(0).ip());
    });
    drop(both);
    assert_no_cm_ids();
}

/// TOS and ACK_TIMEOUT: the client's type of service reaches both sides' paths (the
/// passive side's from the REQ), each side's ACK timeout its own QP, and the client's, set
/// before the route, its path's packet lifetime (timeout − 1, else the kernel's
/// `CMA_IBOE_PACKET_LIFETIME`: 18 on Linux 6.1, 16 on 6.12); without the options
/// the traffic class is the port's default (0). ACK timeouts over 31 are refused before the
/// kernel.
#[test]
fn tos_and_ack_timeout_reach_the_connection() {
    let addr = cm_addr(7507);
    let (tos, client_timeout, server_timeout) = (0x68, 18, 16);
    let listener = Listener::bind(addr).unwrap();
    let traffic_class = |id: &uverbs::cm::CmId| {
        let rtr = id.qp_attr(QpState::Rtr).unwrap();
        rtr.ah.and_then(|ah| ah.grh).map(|grh| grh.traffic_class)
    };
    let (checked, server_checked) = std::sync::mpsc::channel();
    let server_listener = &listener;
    thread::scope(|s| {
        let server = s.spawn(move || {
            for expect_tos in [0, tos] {
                let mut req = server_listener.get_request(T).unwrap();
                if expect_tos != 0 {
                    req.set_option(CmOption::AckTimeout(server_timeout)).unwrap();
                }
                let side = Side::new(&req.context().unwrap());
                let mut conn = req.accept(side.qp(), &ConnParam::default(), T).unwrap();
                assert_eq!(traffic_class(conn.id()), Some(expect_tos));
                if expect_tos != 0 {
                    let rts = conn.id().qp_attr(QpState::Rts).unwrap();
                    assert_eq!(rts.timeout, Some(server_timeout));
                    let info = conn.qp_mut().query().unwrap();
                    assert_eq!(info.attr.timeout, Some(server_timeout), "the passive QP's own");
                }
                // The CM answers INIT_QP_ATTR only until the peer's disconnect arrives.
                checked.send(()).unwrap();
                conn.wait_disconnected(T).unwrap();
            }
        });
        let plain = Connector::resolve(addr, T).unwrap();
        let side = Side::new(&plain.context().unwrap());
        let mut conn = plain.connect(side.qp(), &ConnParam::default(), T).unwrap();
        assert_eq!(traffic_class(conn.id()), Some(0), "the port's default_roce_tos");
        let path = conn.id().query_path().unwrap()[0];
        assert_eq!(
            path.packet_life_time,
            common::kernel::iboe_packet_lifetime(),
            "CMA_IBOE_PACKET_LIFETIME of {}",
            common::kernel::release()
        );
        server_checked.recv_timeout(T).unwrap();
        conn.disconnect(T).unwrap();
        drop(conn);

        let options = [CmOption::Tos(tos), CmOption::AckTimeout(client_timeout)];
        let connector = Connector::resolve_with(None, addr, &options, T).unwrap();
        let side = Side::new(&connector.context().unwrap());
        let mut conn = connector.connect(side.qp(), &ConnParam::default(), T).unwrap();
        assert_eq!(traffic_class(conn.id()), Some(tos));
        let path = conn.id().query_path().unwrap()[0];
        assert_eq!(
            path.packet_life_time,
            client_timeout - 1,
            "set before the route: timeout - 1"
        );
        let info = conn.qp_mut().query().unwrap();
        assert_eq!(info.attr.timeout, Some(client_timeout));
        assert_eq!(
            info.attr.ah.and_then(|ah| ah.grh).map(|grh| grh.traffic_class),
            Some(tos),
            "the QP's own path"
        );
        server_checked.recv_timeout(T).unwrap();
        conn.disconnect(T).unwrap();
        server.join().unwrap();
    });
    let ch = EventChannel::open().unwrap();
    let mut id = ch.create_id().unwrap();
    assert!(matches!(
        id.set_option(CmOption::AckTimeout(32)),
        Err(Error::InvalidArgument { .. })
    ));
    id.set_option(CmOption::AckTimeout(31)).unwrap();
    drop((id, listener));
    assert_no_cm_ids();
}

/// NOTIFY with COMM_EST: the client moves its QP to RTS and sends before its RTU; the
/// server, holding the message, reports COMM_EST and gets `ESTABLISHED` at once; the late
/// RTU is then ignored (the next event is the disconnect), and a second COMM_EST is
/// `EISCONN`. An id bound to no device, a listener, and an event the CM does not take are
/// `EINVAL`.
#[test]
fn notify_comm_est_establishes_the_passive_side_before_the_rtu() {
    use nix::errno::Errno;
    let addr = cm_addr(7508);
    let listener = Listener::bind(addr).unwrap();
    assert_kernel_error(
        listener.channel().create_id().unwrap().notify(AsyncEventKind::COMM_EST),
        "NOTIFY",
        Errno::EINVAL,
    );
    let (got_it, send_rtu) = std::sync::mpsc::channel();
    thread::scope(|s| {
        let server = s.spawn(|| {
            let mut event = next_event(listener.channel(), CmEventKind::CONNECT_REQUEST);
            let req = event.take_request().unwrap();
            let mut side = Side::new(&req.context().unwrap());
            let mut qp = side.qp();
            req.init_qp(&mut qp).unwrap();
            side.post_recv(&mut qp, 1);
            let mut id = req.accept_id(&mut qp, &ConnParam::default()).unwrap();
            let wc = side.one();
            wc.result().unwrap();
            assert_eq!(&side.mr.as_slice()[..wc.byte_len as usize], b"before the RTU");
            assert!(listener.channel().try_get_event().unwrap().is_none(), "no RTU yet");
            id.notify(AsyncEventKind::COMM_EST).unwrap();
            let established = next_event(listener.channel(), CmEventKind::ESTABLISHED);
            assert_eq!(established.uid, id.uid());
            assert_kernel_error(id.notify(AsyncEventKind::COMM_EST), "NOTIFY", Errno::EISCONN);
            assert_kernel_error(id.notify(AsyncEventKind::SQ_DRAINED), "NOTIFY", Errno::EINVAL);
            got_it.send(()).unwrap();
            next_event(listener.channel(), CmEventKind::DISCONNECTED);
            id.disconnect(&mut qp).unwrap();
        });
        let ch = EventChannel::open().unwrap();
        let mut id = ch.create_id().unwrap();
        id.resolve_addr(None, addr, T).unwrap();
        next_event(&ch, CmEventKind::ADDR_RESOLVED);
        id.resolve_route(T).unwrap();
        next_event(&ch, CmEventKind::ROUTE_RESOLVED);
        let mut side = Side::new(&id.context().unwrap());
        let mut qp = side.qp();
        id.connect(&mut qp, &ConnParam::default()).unwrap();
        next_event(&ch, CmEventKind::CONNECT_RESPONSE);
        for state in [QpState::Rtr, QpState::Rts] {
            qp.modify(&id.qp_attr(state).unwrap()).unwrap();
        }
        side.mr.as_mut_slice()[..14].copy_from_slice(b"before the RTU");
        let sge = [side.mr.sge(0, 14).unwrap()];
        // SAFETY: `mr` outlives the request; its completion is polled below.
        unsafe { qp.post_send(&[SendWr::new(1, SendOp::Send, &sge)]).unwrap() };
        side.one().result().unwrap();
        send_rtu.recv_timeout(T).unwrap();
        id.establish(&mut qp).unwrap();
        id.disconnect(&mut qp).unwrap();
        next_event(&ch, CmEventKind::DISCONNECTED);
        server.join().unwrap();
    });
    drop(listener);
    assert_no_cm_ids();
}

/// IB_PATH: the path `QUERY` reports for a resolved route, set on a second id whose address
/// is resolved, becomes that id's route (`ROUTE_RESOLVED` at once, no resolution) and
/// carries a connection, its traffic class from the record. Refused (`EINVAL`) on an id
/// whose route is resolved already.
#[test]
fn a_path_record_sets_the_route_instead_of_resolving_it() {
    use nix::errno::Errno;
    let addr = cm_addr(7509);
    let listener = Listener::bind(addr).unwrap();
    let ch = EventChannel::open().unwrap();
    let mut first = ch.create_id().unwrap();
    first.set_option(CmOption::Tos(0x20)).unwrap();
    first.resolve_addr(None, addr, T).unwrap();
    next_event(&ch, CmEventKind::ADDR_RESOLVED);
    assert!(first.query_path().unwrap().is_empty(), "no route yet");
    first.resolve_route(T).unwrap();
    next_event(&ch, CmEventKind::ROUTE_RESOLVED);
    let paths = first.query_path().unwrap();
    println!("the resolved route: {paths:?}");
    assert_eq!(paths.len(), 1);
    let path = paths[0];
    let IpAddr::V4(ip) = addr.ip() else {
        panic!("UVERBS_CM_ADDR is IPv4")
    };
    let gid = ip.to_ipv6_mapped().octets();
    assert_eq!((path.sgid, path.dgid), (gid, gid));
    assert_eq!((path.pkey, path.traffic_class, path.reversible), (0xffff, 0x20, true));
    assert_kernel_error(first.set_option(CmOption::IbPath(path)), "SET_OPTION", Errno::EINVAL);
    drop(first);

    thread::scope(|s| {
        let server = s.spawn(|| {
            let req = listener.get_request(T).unwrap();
            let side = Side::new(&req.context().unwrap());
            let mut conn = req.accept(side.qp(), &ConnParam::default(), T).unwrap();
            conn.wait_disconnected(T).unwrap();
        });
        let mut id = ch.create_id().unwrap();
        id.resolve_addr(None, addr, T).unwrap();
        next_event(&ch, CmEventKind::ADDR_RESOLVED);
        id.set_option(CmOption::IbPath(path)).unwrap();
        let event = ch
            .try_get_event()
            .unwrap()
            .expect("ROUTE_RESOLVED queued by the option");
        assert_eq!(
            (event.kind, event.status, event.uid),
            (CmEventKind::ROUTE_RESOLVED, 0, id.uid())
        );
        let set = id.query_path().unwrap();
        println!("the route set from the record: {set:?}");
        assert_eq!(set.len(), 1);
        assert_eq!((set[0].sgid, set[0].dgid, set[0].traffic_class), (gid, gid, 0x20));
        let side = Side::new(&id.context().unwrap());
        let mut qp = side.qp();
        id.connect(&mut qp, &ConnParam::default()).unwrap();
        next_event(&ch, CmEventKind::CONNECT_RESPONSE);
        id.establish(&mut qp).unwrap();
        let grh = qp.query().unwrap().attr.ah.and_then(|ah| ah.grh).unwrap();
        assert_eq!((grh.dgid, grh.traffic_class), (gid, 0x20));
        id.disconnect(&mut qp).unwrap();
        next_event(&ch, CmEventKind::DISCONNECTED);
        server.join().unwrap();
    });
    drop(listener);
    assert_no_cm_ids();
}

/// Disconnect from either side, both ways: each side posted four receives before the
/// connection came up (the QP in INIT from the CM); whichever side disconnects, both see
/// `DISCONNECTED` and each side's four receives complete exactly once, flushed, and nothing
/// more.
#[test]
fn a_disconnect_from_either_side_flushes_each_posted_receive_exactly_once() {
    const POSTED: u64 = 4;
    let addr = cm_addr(7511);
    let listener = Listener::bind(addr).unwrap();
    let flushed_once = |side: &mut Side, first: u64| {
        let mut wr_ids: Vec<u64> = poll_n(&mut side.cq, POSTED as usize, 4)
            .iter()
            .map(|wc| {
                assert_eq!(wc.status, WcStatus::WR_FLUSH_ERR, "{wc:?}");
                wc.wr_id
            })
            .collect();
        wr_ids.sort_unstable();
        assert_eq!(wr_ids, (first..first + POSTED).collect::<Vec<_>>());
        assert_idle(&mut side.cq);
    };
    for active_disconnects in [true, false] {
        thread::scope(|s| {
            let server = s.spawn(|| {
                let req = listener.get_request(T).unwrap();
                let mut side = Side::new(&req.context().unwrap());
                let mut qp = side.qp();
                req.init_qp(&mut qp).unwrap();
                for i in 0..POSTED {
                    side.post_recv(&mut qp, 100 + i);
                }
                let mut conn = req.accept(qp, &ConnParam::default(), T).unwrap();
                if active_disconnects {
                    conn.wait_disconnected(T).unwrap();
                } else {
                    conn.disconnect(T).unwrap();
                }
                assert_eq!(conn.qp().state(), QpState::Err);
                flushed_once(&mut side, 100);
            });
            let connector = Connector::resolve(addr, T).unwrap();
            let mut side = Side::new(&connector.context().unwrap());
            let mut qp = side.qp();
            connector.id().init_qp(&mut qp).unwrap();
            for i in 0..POSTED {
                side.post_recv(&mut qp, 200 + i);
            }
            let mut conn = connector.connect(qp, &ConnParam::default(), T).unwrap();
            if active_disconnects {
                conn.disconnect(T).unwrap();
            } else {
                conn.wait_disconnected(T).unwrap();
            }
            assert_eq!(conn.qp().state(), QpState::Err);
            flushed_once(&mut side, 200);
            // A second disconnect or wait is a no-op: DISCONNECTED came once.
            conn.disconnect(T).unwrap();
            conn.wait_disconnected(Duration::ZERO).unwrap();
            server.join().unwrap();
        });
    }
    drop(listener);
    assert_no_cm_ids();
}

/// Connects a client to `listener` (at `addr`) with the high-level API; the pair, active
/// side first.
fn connected_pair(listener: &Listener, addr: SocketAddr) -> (uverbs::cm::Connection, uverbs::cm::Connection) {
    thread::scope(|s| {
        let server = s.spawn(|| {
            let req = listener.get_request(T).unwrap();
            let side = Side::new(&req.context().unwrap());
            req.accept(side.qp(), &ConnParam::default(), T).unwrap()
        });
        let connector = Connector::resolve(addr, T).unwrap();
        let side = Side::new(&connector.context().unwrap());
        let client = connector.connect(side.qp(), &ConnParam::default(), T).unwrap();
        (client, server.join().unwrap())
    })
}

/// Teardown in every order the API allows; after each, no cm_id of the process is left in
/// `rdma resource show cm_id`, and after all of them (run twice, measured around the
/// second) the process has exactly the fds and mappings it had before: id before its
/// channel, the channel's handle before the id (the id keeps the fd open until it goes),
/// a connection before its listener and a listener before its connections, a connection
/// dropped without a disconnect (the peer sees `DISCONNECTED`), the QP, PD, CQ and
/// context before the connected id, a connect and an accept each dropped in flight, a
/// listener before a request it handed out but nobody answered, and a listener with
/// requests nobody read.
#[test]
fn teardown_in_every_order_leaves_no_id_fd_or_mapping() {
    let addr = cm_addr(7513);
    let round = || {
        // The id, then its channel.
        let ch = EventChannel::open().unwrap();
        let mut id = ch.create_id().unwrap();
        id.resolve_addr(None, addr, T).unwrap();
        next_event(&ch, CmEventKind::ADDR_RESOLVED);
        drop(id);
        assert_no_cm_ids();
        drop(ch);

        // The channel's handle, then the id: the id lives on until dropped.
        let ch = EventChannel::open().unwrap();
        let mut id = ch.create_id().unwrap();
        id.resolve_addr(None, addr, T).unwrap();
        next_event(&ch, CmEventKind::ADDR_RESOLVED);
        drop(ch);
        assert_eq!(my_cm_ids().len(), 1, "the id outlives the channel's handle");
        drop(id);
        assert_no_cm_ids();

        // A connection (each side dropped without disconnecting), then the listener.
        let listener = Listener::bind(addr).unwrap();
        let (client, mut server) = connected_pair(&listener, addr);
        drop(client);
        server.wait_disconnected(T).unwrap();
        drop(server);
        drop(listener);
        assert_no_cm_ids();

        // The listener, then the connection it accepted (passive side first).
        let listener = Listener::bind(addr).unwrap();
        let (mut client, server) = connected_pair(&listener, addr);
        drop(listener);
        drop(server);
        client.wait_disconnected(T).unwrap();
        drop(client);
        assert_no_cm_ids();

        // The QP and every verbs object, then the connected id (low level, active side).
        let listener = Listener::bind(addr).unwrap();
        thread::scope(|s| {
            let server = s.spawn(|| {
                let req = listener.get_request(T).unwrap();
                let side = Side::new(&req.context().unwrap());
                let mut conn = req.accept(side.qp(), &ConnParam::default(), T).unwrap();
                conn.wait_disconnected(T).unwrap();
            });
            let ch = EventChannel::open().unwrap();
            let mut id = ch.create_id().unwrap();
            id.resolve_addr(None, addr, T).unwrap();
            next_event(&ch, CmEventKind::ADDR_RESOLVED);
            id.resolve_route(T).unwrap();
            next_event(&ch, CmEventKind::ROUTE_RESOLVED);
            let ctx = id.context().unwrap();
            let side = Side::new(&ctx);
            let mut qp = side.qp();
            id.connect(&mut qp, &ConnParam::default()).unwrap();
            next_event(&ch, CmEventKind::CONNECT_RESPONSE);
            id.establish(&mut qp).unwrap();
            drop((qp, side, ctx));
            // Destroying a connected id sends the disconnect request itself.
            drop(id);
            server.join().unwrap();
            drop(ch);
        });
        drop(listener);
        assert_no_cm_ids();

        // A connect in flight dropped before its answer (the request, if it got out, is
        // dropped too: a reject); then an accept in flight dropped before `ESTABLISHED` was
        // read (the client sees a reject, or a connection it then drops).
        let listener = Listener::bind(addr).unwrap();
        let connector = Connector::resolve(addr, T).unwrap();
        let side = Side::new(&connector.context().unwrap());
        let pending = connector.start_connect(side.qp(), &ConnParam::default()).unwrap();
        drop((pending, side));
        if let Ok(req) = listener.get_request(Duration::from_secs(1)) {
            drop(req);
        }
        thread::scope(|s| {
            let client = s.spawn(|| {
                let connector = Connector::resolve(addr, T).unwrap();
                let side = Side::new(&connector.context().unwrap());
                match connector
                    .connect(side.qp(), &ConnParam::default(), T)
                    .map_err(|f| f.error)
                {
                    Ok(conn) => drop(conn),
                    // The server's reject after its REP, or the kernel refusing the QP moves
                    // when the reject lands between the REP's event and `establish`.
                    Err(e @ (Error::Rejected { .. } | Error::Kernel { .. })) => {
                        println!("an accept dropped in flight: the client saw {e}")
                    }
                    Err(e) => panic!("an accept dropped in flight: {e}"),
                }
            });
            let req = listener.get_request(T).unwrap();
            let side = Side::new(&req.context().unwrap());
            drop(req.start_accept(side.qp(), &ConnParam::default()).unwrap());
            client.join().unwrap();
        });
        drop(listener);
        assert_no_cm_ids();

        // A request taken from the listener, the listener dropped, then the request.
        let listener = Listener::bind(addr).unwrap();
        thread::scope(|s| {
            let client = s.spawn(|| {
                let connector = Connector::resolve(addr, T).unwrap();
                let side = Side::new(&connector.context().unwrap());
                connector
                    .connect(side.qp(), &ConnParam::default(), T)
                    .unwrap_err()
                    .error
            });
            let req = listener.get_request(T).unwrap();
            drop(listener);
            drop(req);
            let err = client.join().unwrap();
            assert!(matches!(err, Error::Rejected { .. }), "{err}");
        });
        assert_no_cm_ids();

        // A listener with two requests nobody read.
        let listener = Listener::bind(addr).unwrap();
        thread::scope(|s| {
            let clients: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let connector = Connector::resolve(addr, T).unwrap();
                        let side = Side::new(&connector.context().unwrap());
                        connector
                            .connect(side.qp(), &ConnParam::default(), T)
                            .unwrap_err()
                            .error
                    })
                })
                .collect();
            let deadline = std::time::Instant::now() + T;
            let children = format!("src-addr {addr} ");
            while my_cm_ids()
                .iter()
                .filter(|l| l.contains("state CONNECT") && l.contains(&children))
                .count()
                < 2
            {
                assert!(std::time::Instant::now() < deadline, "{}", cm_id_table());
                thread::sleep(Duration::from_millis(50));
            }
            drop(listener);
            for c in clients {
                let err = c.join().unwrap();
                assert!(matches!(err, Error::Rejected { .. }), "{err}");
            }
        });
        assert_no_cm_ids();
    };
    // The first round warms up what a process sets up once (the allocator's arenas, the
    // test harness's buffers); the second must leave exactly what it found.
    round();
    let (before, before_dev) = (process_footprint(), kernel_footprint());
    round();
    let (after, after_dev) = (process_footprint(), kernel_footprint());
    println!("fds and mappings: {before:?} -> {after:?}; of /dev/infiniband: {before_dev:?} -> {after_dev:?}");
    assert_eq!(after_dev, before_dev, "a device fd or mapping leaked");
    assert_eq!(after, before, "an fd or a mapping leaked");
}

/// The connector/listener flow in a mio event loop: three clients each on its connector's
/// channel, the listener's, and each accepted connection's; every object advances when its
/// fd is readable, up to the disconnects; no wake-up without an event (each connection's
/// kernel events: four on the client's channel, one on the listener's, two on the server
/// connection's).
#[test]
fn the_connector_and_listener_advance_in_a_mio_event_loop() {
    use mio::unix::SourceFd;
    use mio::{Events, Interest, Poll, Token};
    use std::os::fd::AsRawFd;
    use uverbs::cm::{Connection, Establishing};
    const N: usize = 3;
    const LISTENER: Token = Token(usize::MAX);
    enum Flow {
        Resolving(Connector),
        Establishing(Establishing),
        Up(Connection),
        Down(Connection),
    }
    let addr = cm_addr(7514);
    let listener = Listener::bind(addr).unwrap();
    let mut poll = Poll::new().unwrap();
    let register = |poll: &Poll, fd: std::os::fd::BorrowedFd<'_>, token| {
        poll.registry()
            .register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)
            .unwrap()
    };
    register(&poll, listener.as_fd(), LISTENER);
    // Tokens 0..N: the clients; N..: the accepted connections.
    let mut flows: Vec<Option<Flow>> = Vec::new();
    for _ in 0..N {
        let connector = Connector::start(None, addr, &[], T).unwrap();
        register(&poll, connector.as_fd(), Token(flows.len()));
        flows.push(Some(Flow::Resolving(connector)));
    }
    let mut sides = Vec::new();
    let advance = |flow: Flow, sides: &mut Vec<Side>| match flow {
        Flow::Resolving(mut c) => {
            if !c.advance().unwrap() {
                return Flow::Resolving(c);
            }
            let side = Side::new(&c.context().unwrap());
            let qp = side.qp();
            sides.push(side);
            Flow::Establishing(c.start_connect(qp, &ConnParam::default()).unwrap())
        }
        Flow::Establishing(mut e) => {
            if !e.advance().unwrap() {
                return Flow::Establishing(e);
            }
            let mut conn = e.finish().unwrap();
            assert_eq!(conn.qp().state(), QpState::Rts);
            // An event queued behind ESTABLISHED raises no new edge: take it now.
            if conn.advance().unwrap() {
                Flow::Down(conn)
            } else {
                Flow::Up(conn)
            }
        }
        Flow::Up(mut conn) => {
            if conn.advance().unwrap() {
                Flow::Down(conn)
            } else {
                Flow::Up(conn)
            }
        }
        down => down,
    };
    let count = |flows: &[Option<Flow>], up: bool| {
        flows
            .iter()
            .filter(|f| match f {
                Some(Flow::Up(_)) => up,
                Some(Flow::Down(_)) => true,
                _ => false,
            })
            .count()
    };
    let (mut wakeups, mut disconnecting) = (0, false);
    let mut events = Events::with_capacity(8);
    while count(&flows, false) < 2 * N {
        if !disconnecting && flows.len() == 2 * N && count(&flows, true) == 2 * N {
            // Everything is up: the clients disconnect.
            for flow in flows.iter_mut().take(N) {
                let Some(Flow::Up(conn)) = flow else { unreachable!() };
                conn.start_disconnect().unwrap();
            }
            disconnecting = true;
        }
        poll.poll(&mut events, Some(T)).unwrap();
        assert!(
            !events.is_empty(),
            "nothing within {T:?}: {} of {} up",
            count(&flows, true),
            flows.len()
        );
        for readiness in &events {
            wakeups += 1;
            if readiness.token() == LISTENER {
                while let Some(req) = listener.try_request().unwrap() {
                    let side = Side::new(&req.context().unwrap());
                    let pending = req.start_accept(side.qp(), &ConnParam::default()).unwrap();
                    sides.push(side);
                    register(&poll, pending.as_fd(), Token(flows.len()));
                    flows.push(Some(Flow::Establishing(pending)));
                }
                continue;
            }
            let slot = &mut flows[readiness.token().0];
            *slot = Some(advance(slot.take().unwrap(), &mut sides));
        }
    }
    println!("{N} connections up and down in {wakeups} wake-ups");
    assert!(wakeups <= 7 * N, "{wakeups} wake-ups for {} kernel events", 7 * N);
    for flow in flows.iter().flatten() {
        let Flow::Down(conn) = flow else { unreachable!() };
        assert_eq!(conn.qp().state(), QpState::Err);
    }
    drop((flows, listener));
    assert_no_cm_ids();
}

/// A client that starts before its server: the connect is rejected as "no listener", the QP
/// comes back in INIT with the receive posted before it, and the same QP connects once the
/// listener exists; the server's first message lands in that receive.
#[test]
fn a_connect_with_no_listener_hands_the_qp_back_for_a_retry() {
    let addr = cm_addr(7540);
    let connector = Connector::resolve(addr, T).unwrap();
    let mut side = Side::new(&connector.context().unwrap());
    let mut qp = side.qp();
    connector.id().init_qp(&mut qp).unwrap();
    side.post_recv(&mut qp, 41);
    let failed = connector.connect(qp, &ConnParam::default(), T).unwrap_err();
    assert!(failed.is_no_listener(), "{failed}");
    assert!(failed.error.is_no_listener());
    assert_eq!(failed.qp.state(), QpState::Init);
    let qp = failed.qp;
    assert_no_cm_ids();

    let listener = Listener::bind(addr).unwrap();
    thread::scope(|s| {
        let server = s.spawn(|| {
            let req = listener.get_request(T).unwrap();
            let mut side = Side::new(&req.context().unwrap());
            let mut conn = req.accept(side.qp(), &ConnParam::default(), T).unwrap();
            side.mr.as_mut_slice()[..5].copy_from_slice(b"retry");
            let sge = [side.mr.sge(0, 5).unwrap()];
            // SAFETY: `mr` outlives the request; its completion is polled below.
            unsafe { conn.qp_mut().post_send(&[SendWr::new(8, SendOp::Send, &sge)]).unwrap() };
            side.one().result().unwrap();
            conn.wait_disconnected(T).unwrap();
        });
        let connector = Connector::resolve(addr, T).unwrap();
        let mut conn = connector.connect(qp, &ConnParam::default(), T).unwrap();
        let wc = side.one();
        wc.result().unwrap();
        assert_eq!((wc.wr_id, wc.byte_len), (41, 5));
        assert_eq!(&side.mr.as_slice()[..5], b"retry");
        conn.disconnect(T).unwrap();
        server.join().unwrap();
    });
    drop(listener);
    assert_no_cm_ids();
}

/// A receive posted on a request's QP before `init_qp` names the step it misses.
#[test]
fn a_receive_before_init_qp_names_the_missing_step() {
    let addr = cm_addr(7541);
    let listener = Listener::bind(addr).unwrap();
    thread::scope(|s| {
        let client = s.spawn(|| {
            let connector = Connector::resolve(addr, T).unwrap();
            let side = Side::new(&connector.context().unwrap());
            connector
                .connect(side.qp(), &ConnParam::default(), T)
                .map(drop)
                .map_err(|f| f.error)
        });
        let req = listener.get_request(T).unwrap();
        let side = Side::new(&req.context().unwrap());
        let mut qp = side.qp();
        let sge = [side.mr.sge(0, 64).unwrap()];
        // SAFETY: refused before it reaches the queue (asserted).
        let err = unsafe { qp.post_recv(&[RecvWr::new(1, &sge)]) }.unwrap_err();
        assert!(err.to_string().contains("ConnectRequest::init_qp"), "{err}");
        req.init_qp(&mut qp).unwrap();
        let sge = [side.mr.sge(0, 64).unwrap()];
        // SAFETY: `mr` outlives the QP, which is destroyed at the end of the scope.
        unsafe { qp.post_recv(&[RecvWr::new(2, &sge)]).unwrap() };
        let conn = req.accept(qp, &ConnParam::default(), T).unwrap();
        client.join().unwrap().unwrap();
        drop(conn);
    });
    drop(listener);
    assert_no_cm_ids();
}

/// `ConnParam::default()`'s retries end as `ConnectAttr::default()`'s do: a peer whose QP is
/// gone (its id kept, so no disconnect is sent) fails the next send with `RETRY_EXC_ERR` in
/// about half a second on rxe, where librdmacm's 7 retries forever (and the kernel's ACK
/// timeout alone took 16 s).
#[test]
fn the_default_retry_count_fails_a_dead_peer() {
    let addr = cm_addr(7542);
    let listener = Listener::bind(addr).unwrap();
    thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let listener = &listener;
        let server = s.spawn(move || {
            let req = listener.get_request(T).unwrap();
            let side = Side::new(&req.context().unwrap());
            let mut qp = side.qp();
            let id = req.accept_id(&mut qp, &ConnParam::default()).unwrap();
            // The QP dies; the id lives on until the client has seen the failure.
            drop(qp);
            rx.recv().unwrap();
            drop(id);
        });
        let connector = Connector::resolve(addr, T).unwrap();
        let mut side = Side::new(&connector.context().unwrap());
        let mut conn = connector.connect(side.qp(), &ConnParam::default(), T).unwrap();
        // Past the server's QP destruction: the accept's caller dropped it at once.
        thread::sleep(Duration::from_millis(500));
        let sge = [side.mr.sge(0, 8).unwrap()];
        let start = std::time::Instant::now();
        // SAFETY: `mr` outlives the request; its completion is polled below.
        unsafe { conn.qp_mut().post_send(&[SendWr::new(9, SendOp::Send, &sge)]).unwrap() };
        let wc = poll_n(&mut side.cq, 1, 1)[0];
        let took = start.elapsed();
        println!("a send to a dead peer: {:?} after {took:?}", wc.status);
        assert_eq!(wc.status, WcStatus::RETRY_EXC_ERR);
        // 7 tries of 67 ms; TCG's slowness and the timer's granularity on top.
        assert!(took < Duration::from_secs(5), "{took:?}");
        tx.send(()).unwrap();
        drop(conn);
        server.join().unwrap();
    });
    drop(listener);
    assert_no_cm_ids();
}

/// A client that gave up (its connect timed out and its id is gone) before the server
/// accepted: the client gets its QP back in INIT, the server's accept a typed error.
#[test]
fn accepting_a_request_whose_client_gave_up_is_a_typed_error() {
    let addr = cm_addr(7543);
    let listener = Listener::bind(addr).unwrap();
    let connector = Connector::resolve(addr, T).unwrap();
    let side = Side::new(&connector.context().unwrap());
    let failed = connector
        .connect(side.qp(), &ConnParam::default(), Duration::from_secs(1))
        .unwrap_err();
    assert!(
        matches!(failed.error, Error::TimedOut { verb: "connect", .. }),
        "{failed}"
    );
    assert_eq!(failed.qp.state(), QpState::Init);
    // The reject the client's id sent when it went.
    thread::sleep(Duration::from_millis(500));
    let req = listener.get_request(T).unwrap();
    let server = Side::new(&req.context().unwrap());
    let err = req.accept(server.qp(), &ConnParam::default(), T).unwrap_err();
    assert!(matches!(err, Error::RequestWithdrawn { verb: "accept" }), "{err:?}");
    drop(listener);
    assert_no_cm_ids();
}

/// Connects to `addr` with a connect timeout of `limit` that the kernel is expected to beat:
/// prints `what` and the outcome, checks the kernel ended the request with `UNREACHABLE`, and
/// returns how long that took.
fn connect_until_unreachable(addr: SocketAddr, limit: Duration, what: &str) -> Duration {
    let connector = Connector::resolve(addr, T).unwrap();
    let side = Side::new(&connector.context().unwrap());
    let start = std::time::Instant::now();
    let failed = connector.connect(side.qp(), &ConnParam::default(), limit).unwrap_err();
    let took = start.elapsed();
    println!("{what}: {} after {took:?}", failed.error);
    assert!(
        matches!(
            failed.error,
            Error::CmEvent {
                event: "UNREACHABLE",
                ..
            }
        ),
        "{failed}"
    );
    took
}

/// How long the kernel itself takes to end a connect request nobody answers (an address on
/// the NOARP dummy netdev with no host behind it): minutes, which is why every connect here
/// has a timeout of its own. Ignored: it runs for about two minutes (docs/rdma-cm.md).
#[test]
#[ignore]
fn the_kernel_ends_an_unanswered_connect_request() {
    let IpAddr::V4(ip) = cm_addr(0).ip() else {
        panic!("UVERBS_CM_ADDR must be IPv4 here")
    };
    let [a, b, c, d] = ip.octets();
    let addr = SocketAddr::new(IpAddr::from([a, b, c, d.wrapping_add(97)]), 7545);
    let took = connect_until_unreachable(addr, Duration::from_secs(400), "an unanswered connect request");
    assert!(took > Duration::from_secs(60), "{took:?}");
}

/// How long the kernel keeps a client waiting when the listener's CM answers but its
/// application never accepts or rejects: the passive side's CM answers the request with an
/// MRA (a longer service timeout) and again each time the request is resent, so the active
/// side waits far longer than for an absent host, and then gets `UNREACHABLE` (1019 s on
/// Linux 6.12). Ignored: it runs for about 17 minutes (docs/rdma-cm.md); run with
/// `UVERBS_GUEST_TIMEOUT=2400`.
#[test]
#[ignore]
fn the_kernel_ends_a_connect_request_the_listener_never_answers() {
    let addr = cm_addr(7546);
    let listener = Listener::bind(addr).unwrap();
    let took = connect_until_unreachable(
        addr,
        Duration::from_secs(1800),
        "a connect request the listener never answers",
    );
    assert!(took > Duration::from_secs(240), "{took:?}");
    drop(listener);
}
