//! QPs of one process connected to each other by the way the device's transport needs: on
//! RoCE and InfiniBand (rxe, mlx5) moved to RTS by hand over the loopback path; on iWARP
//! (siw), where a QP reaches RTS only through the connection manager, connected by
//! `uverbs::cm` over `UVERBS_CM_ADDR` (`xtask/guest/with_siw.sh` points it at siw's netdev),
//! the connection then owning the QP.

use super::*;
use std::thread;
use uverbs::cm::{CmEvent, CmEventKind, CmId, ConnParam, Connection, Connector, EventChannel, Listener};

/// Whether `ctx`'s device speaks iWARP.
pub fn is_iwarp(ctx: &Context) -> bool {
    ctx.device().transport().expect("the device's transport") == Transport::IWARP
}

/// A QP in RTS, connected to its peer.
#[allow(clippy::large_enum_variant)] // a few per test, made once
pub enum Linked {
    /// Moved through INIT, RTR and RTS by hand.
    Direct(Qp),
    /// Connected through the CM; `active` is the side that sent the connect request.
    Cm { conn: Connection, active: bool },
}

impl Linked {
    pub fn qp(&self) -> &Qp {
        match self {
            Linked::Direct(qp) => qp,
            Linked::Cm { conn, .. } => conn.qp(),
        }
    }

    pub fn qp_mut(&mut self) -> &mut Qp {
        match self {
            Linked::Direct(qp) => qp,
            Linked::Cm { conn, .. } => conn.qp_mut(),
        }
    }
}

/// Connects `qps[2i]` with `qps[2i + 1]` (RC, `access` for the peer's requests, `mtu` on a
/// path set by hand) and returns them in the same order. On iWARP the even QP of each pair
/// connects to a listener on `UVERBS_CM_ADDR` port `port`, the odd one accepts; the CM
/// dictates the attributes (its INIT access flags are LOCAL_WRITE, REMOTE_WRITE and
/// REMOTE_READ, all iWARP allows).
pub fn connect_pairs(ctx: &Context, qps: Vec<Qp>, access: AccessFlags, mtu: Mtu, port: u16) -> Vec<Linked> {
    assert!(qps.len() % 2 == 0, "QPs come in pairs");
    if !is_iwarp(ctx) {
        let path = loopback_path(ctx);
        let qpns: Vec<u32> = qps.iter().map(|qp| qp.qpn()).collect();
        return qps
            .into_iter()
            .enumerate()
            .map(|(i, mut qp)| {
                qp.to_init(1, access).expect("to INIT");
                qp.to_rtr(path, qpns[i ^ 1], 0, mtu).expect("to RTR");
                qp.to_rts(0).expect("to RTS");
                Linked::Direct(qp)
            })
            .collect();
    }
    let addr = cm::cm_addr(port);
    let listener = Listener::bind(addr).expect("listening on UVERBS_CM_ADDR");
    let mut out = Vec::with_capacity(qps.len());
    let mut qps = qps.into_iter();
    while let (Some(a), Some(b)) = (qps.next(), qps.next()) {
        let (active, passive) = thread::scope(|s| {
            let listener = &listener;
            let passive = s.spawn(move || {
                let req = listener.get_request(TIMEOUT).expect("get_request");
                req.accept(b, &ConnParam::default(), TIMEOUT).expect("accept")
            });
            let connector = Connector::resolve(addr, TIMEOUT).expect("resolve");
            let active = connector
                .connect(a, &ConnParam::default(), TIMEOUT)
                .map_err(|f| f.error)
                .expect("connect");
            (active, passive.join().expect("the accepting thread"))
        });
        assert_eq!(active.qp().state(), QpState::Rts);
        assert_eq!(passive.qp().state(), QpState::Rts);
        out.push(Linked::Cm {
            conn: active,
            active: true,
        });
        out.push(Linked::Cm {
            conn: passive,
            active: false,
        });
    }
    out
}

/// Moves every QP of `links` to ERR, so that what is still posted flushes: by hand; on
/// iWARP by disconnecting each pair (the active side's QP goes to ERR and the peer's
/// connection closes, its QP moved to ERR by the kernel) and waiting until both sides saw
/// `DISCONNECTED`.
pub fn to_error(links: &mut [&mut Linked]) {
    for link in links.iter_mut() {
        match link {
            Linked::Direct(qp) => qp
                .modify(&QpAttr {
                    state: Some(QpState::Err),
                    ..Default::default()
                })
                .expect("to ERR"),
            Linked::Cm { conn, active: true } => conn.start_disconnect().expect("disconnect"),
            Linked::Cm { active: false, .. } => {}
        }
    }
    for active in [false, true] {
        for link in links.iter_mut() {
            if let Linked::Cm { conn, active: a } = link {
                if *a == active {
                    conn.wait_disconnected(TIMEOUT).expect("DISCONNECTED");
                }
            }
        }
    }
}

/// Two QPs the caller keeps, connected to each other through the CM: the ids (the listener,
/// each side's, and their channel) live as long as this value. Dropping it ends the
/// connection (the kernel closes it when it destroys the ids).
pub struct CmLink {
    // Declared in the order they are destroyed: the connection's ids, then the listener.
    _ids: [CmId; 2],
    _listener: CmId,
}

impl std::fmt::Debug for CmLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CmLink")
    }
}

/// Waits for the next event of `ch` and checks that it is `kind`.
fn expect_event(ch: &EventChannel, kind: CmEventKind) -> CmEvent {
    let ev = ch.get_event(Some(TIMEOUT)).expect("a CM event");
    assert_eq!(ev.kind, kind, "{ev:?}");
    ev
}

/// Connects `a` (active) with `b` (passive) through the CM on `UVERBS_CM_ADDR` (a port the
/// kernel picks), with the CM's own attributes, leaving both QPs with the caller: in RTS once
/// this returns (on iWARP the kernel moved them).
pub fn cm_connect(a: &mut Qp, b: &mut Qp) -> CmLink {
    let ch = EventChannel::open().expect("rdma_cm channel");
    let mut listener = ch.create_id().expect("listener id");
    listener.bind(cm::cm_addr(0)).expect("bind");
    listener.listen(1).expect("listen");
    let addr = listener
        .query_addr()
        .expect("the listener's address")
        .src
        .expect("bound");
    let mut active = ch.create_id().expect("active id");
    active.resolve_addr(None, addr, TIMEOUT).expect("resolve_addr");
    expect_event(&ch, CmEventKind::ADDR_RESOLVED);
    active.resolve_route(TIMEOUT).expect("resolve_route");
    expect_event(&ch, CmEventKind::ROUTE_RESOLVED);
    active.connect(a, &ConnParam::default()).expect("connect");
    let mut ev = expect_event(&ch, CmEventKind::CONNECT_REQUEST);
    let req = ev.take_request().expect("the request");
    let passive = req.accept_id(b, &ConnParam::default()).expect("accept");
    // Each side's ESTABLISHED (on RoCE the active side's CONNECT_RESPONSE first).
    let (mut a_up, mut b_up) = (false, false);
    while !(a_up && b_up) {
        let ev = ch.get_event(Some(TIMEOUT)).expect("a CM event");
        match (ev.kind, ev.uid) {
            (CmEventKind::CONNECT_RESPONSE, uid) if uid == active.uid() => {
                active.establish(a).expect("establish");
                a_up = true;
            }
            (CmEventKind::ESTABLISHED, uid) if uid == active.uid() => {
                active.established(a).expect("established");
                a_up = true;
            }
            (CmEventKind::ESTABLISHED, uid) if uid == passive.uid() => {
                passive.established(b).expect("established");
                b_up = true;
            }
            _ => panic!("unexpected CM event while connecting: {ev:?}"),
        }
    }
    assert_eq!((a.state(), b.state()), (QpState::Rts, QpState::Rts));
    CmLink {
        _ids: [active, passive],
        _listener: listener,
    }
}

/// Connects RC QPs `a` and `b` (both in RESET) to each other: by hand over the loopback path
/// with `access` for the peer's requests and MTU 1024, or on iWARP through the CM
/// ([`cm_connect`], whose link the caller keeps while the QPs are used).
pub fn connect_qps(ctx: &Context, a: &mut Qp, b: &mut Qp, access: AccessFlags) -> Option<CmLink> {
    if is_iwarp(ctx) {
        return Some(cm_connect(a, b));
    }
    let path = loopback_path(ctx);
    let (an, bn) = (a.qpn(), b.qpn());
    for (qp, peer) in [(a, bn), (b, an)] {
        qp.to_init(1, access).expect("to INIT");
        qp.to_rtr(path, peer, 0, Mtu::Mtu1024).expect("to RTR");
        qp.to_rts(0).expect("to RTS");
    }
    None
}
