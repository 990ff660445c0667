//! The RDMA connection manager (`uverbs::cm`) against the kernel's rdma_ucm and rxe: both
//! ends in this process, on the address of a netdev with an rxe device (`UVERBS_CM_ADDR`; the
//! test guest puts `rxe_cm` on a dummy netdev with 169.254.77.1). Every test ends by checking
//! that no cm_id of this process is left (`rdma resource show cm_id`).

mod common;

use common::*;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::process::Command;
use std::thread;
use std::time::Duration;
use uverbs::cm::{CmEventKind, ConnParam, Connector, EventChannel, Listener};
use uverbs::*;

const T: Duration = Duration::from_secs(20);

/// `UVERBS_CM_ADDR` with `port`.
fn cm_addr(port: u16) -> SocketAddr {
    let ip: IpAddr = std::env::var("UVERBS_CM_ADDR")
        .expect(
            "UVERBS_CM_ADDR: an IPv4 address of a netdev with an RDMA device; `cargo xtask test` \
             runs this in a guest that sets it",
        )
        .parse()
        .expect("UVERBS_CM_ADDR is an IP address");
    SocketAddr::new(ip, port)
}

/// `len` bytes that differ per test and per position.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed) | 1)
        .collect()
}

/// One end's verbs objects on the device the CM chose.
struct Side {
    pd: Pd,
    cq: Cq,
    mr: Mr,
}

impl Side {
    fn new(ctx: &Context) -> Self {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        Self { pd, cq, mr }
    }

    fn qp(&self) -> Qp {
        self.pd.create_qp(&QpInit::new(QpType::Rc, &self.cq, &self.cq)).unwrap()
    }

    fn post_recv(&mut self, qp: &mut Qp, wr_id: u64) {
        let sge = [self.mr.sge(0, 1024).unwrap()];
        // SAFETY: `mr` outlives the request (the test polls its completion or flush).
        unsafe { qp.post_recv(&[RecvWr::new(wr_id, &sge)]).unwrap() };
    }

    /// Waits for one completion and returns it.
    fn one(&mut self) -> WorkCompletion {
        poll_n(&mut self.cq, 1, 1)[0]
    }
}

/// What `rdma resource show cm_id` prints.
fn cm_id_table() -> String {
    let out = Command::new("rdma")
        .args(["resource", "show", "cm_id"])
        .output()
        .expect("running `rdma resource show cm_id` (iproute2)");
    assert!(out.status.success(), "rdma resource show cm_id: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lines of `rdma resource show cm_id` that belong to this process. The kernel records
/// the creating *thread*'s id as `pid`: a line is ours if that thread is one of ours, or has
/// exited (an id outlives its thread only while its process keeps the channel open, and the
/// test binary runs alone: `cargo xtask test` runs one binary at a time).
fn my_cm_ids() -> Vec<String> {
    cm_id_table()
        .lines()
        .filter(|l| {
            let mut words = l.split_whitespace();
            let Some(tid) = words.by_ref().skip_while(|w| *w != "pid").nth(1) else {
                return false;
            };
            let ours = std::path::Path::new("/proc/self/task").join(tid).exists();
            ours || !std::path::Path::new("/proc").join(tid).exists()
        })
        .map(String::from)
        .collect()
}

fn assert_no_cm_ids() {
    // The kernel destroys an id inside DESTROY_ID; nothing is deferred.
    let left = my_cm_ids();
    assert!(left.is_empty(), "cm_ids left behind: {left:#?}");
}

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
        match connector.connect(side.qp(), &ConnParam::default(), T) {
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
    let err = connector.connect(side.qp(), &param, T).unwrap_err();
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
            let err = connector.connect(side.qp(), &ConnParam::default(), T).unwrap_err();
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
    match connector.connect(side.qp(), &ConnParam::default(), T) {
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
                    connector.connect(side.qp(), &ConnParam::default(), T).unwrap_err()
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
        connector.connect(side.qp(), &ConnParam::default(), short).map(drop)
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
