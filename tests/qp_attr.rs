//! Every QP attribute rxe supports, set through modify and read back through query; GID and
//! P_Key queries.

mod common;

use common::*;
use uverbs::*;

#[test]
fn attributes_round_trip_through_modify_and_query() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let path = loopback_path(&ctx);
    let cq = ctx.create_cq(16).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq, &cq);
    init.sq_sig_all = true;
    init.cap.max_inline_data = 100;
    let mut qp = pd.create_qp(&init).unwrap();
    let qpn = qp.qpn();
    let access = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    qp.modify(&QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        access: Some(access),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        state: Some(QpState::Rtr),
        ah: Some(path),
        path_mtu: Some(Mtu::Mtu2048),
        dest_qpn: Some(qpn),
        rq_psn: Some(0x1234),
        max_dest_rd_atomic: Some(4),
        min_rnr_timer: Some(17),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(0x4321),
        timeout: Some(18),
        retry_cnt: Some(5),
        rnr_retry: Some(3),
        max_rd_atomic: Some(2),
        ..Default::default()
    })
    .unwrap();
    let info = qp.query().unwrap();
    let a = &info.attr;
    assert_eq!(a.state, Some(QpState::Rts));
    assert_eq!(a.access, Some(access));
    assert_eq!((a.port_num, a.pkey_index), (Some(1), Some(0)));
    assert_eq!(a.path_mtu, Some(Mtu::Mtu2048));
    assert_eq!(
        (a.dest_qpn, a.rq_psn, a.sq_psn),
        (Some(qpn), Some(0x1234), Some(0x4321))
    );
    assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (Some(18), Some(5), Some(3)));
    assert_eq!(
        (a.max_rd_atomic, a.max_dest_rd_atomic, a.min_rnr_timer),
        (Some(2), Some(4), Some(17))
    );
    // The path as given: a global route on RoCE, the LID on InfiniBand (the mlx5 model).
    let ah = a.ah.unwrap();
    match path.grh {
        Some(want) => {
            let grh = ah.grh.expect("global route");
            assert_eq!((grh.dgid, grh.sgid_index), (want.dgid, want.sgid_index));
        }
        None => assert_eq!((ah.dlid, ah.grh), (path.dlid, None), "{ah:?}"),
    }
    assert!(info.sq_sig_all);
    assert!(!info.sq_draining);
    assert!(info.cap.max_inline_data >= 100, "{:?}", info.cap);

    // SQ drain, reported by query while in SQD. mlx5 (Linux 6.1 hw/mlx5/qp.c:4289) has no
    // RTS -> SQD firmware command: the kernel refuses the move with EINVAL.
    let sqd = qp.modify(&QpAttr {
        state: Some(QpState::Sqd),
        ..Default::default()
    });
    let now = match driver(&ctx) {
        Driver::Rxe => {
            sqd.unwrap();
            QpState::Sqd
        }
        Driver::Mlx5 => {
            assert_eq!(sqd.unwrap_err().errno(), Some(nix::errno::Errno::EINVAL));
            QpState::Rts
        }
        Driver::Siw => unreachable!("this test connects its QPs by hand: it does not run on siw"),
    };
    assert_eq!(qp.query().unwrap().attr.state, Some(now));
    // An invalid transition is refused by the kernel with a typed error.
    let err = qp
        .modify(&QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(err.errno(), Some(nix::errno::Errno::EINVAL), "{err}");
    assert_eq!(qp.state(), now, "a refused modify changes nothing");
}

/// An RC path with a global route: the DGID the caller gave is the one the kernel holds
/// (query reads it back from the kernel) and the one packets carry (a send over the path
/// arrives; the mlx5 model drops a packet whose DGID is not its port's). On InfiniBand (the
/// mlx5 model) the port's LID with a GRH to its GID 0; on RoCE its RoCE v2 GID.
#[test]
fn a_global_routes_dgid_reaches_the_kernel_intact() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let (path, gid) = loopback_path_with_grh(&ctx);
    let mut cq = ctx.create_cq(16).unwrap();
    let init = QpInit::new(QpType::Rc, &cq, &cq);
    let (mut a, mut b) = (pd.create_qp(&init).unwrap(), pd.create_qp(&init).unwrap());
    let (qa, qb) = (a.qpn(), b.qpn());
    let access = AccessFlags::LOCAL_WRITE;
    for (qp, peer) in [(&mut a, qb), (&mut b, qa)] {
        qp.to_init(1, access).unwrap();
        qp.to_rtr(path, peer, 0, Mtu::Mtu1024).unwrap();
        qp.to_rts(0).unwrap();
        let grh = qp.query().unwrap().attr.ah.unwrap().grh.expect("a global route");
        assert_eq!(grh.dgid, gid.raw, "the DGID the kernel holds");
        assert_eq!(grh.sgid_index, gid.index);
    }
    let mut mr = pd.alloc_mr(4096, LocalAccess::LOCAL_WRITE).unwrap();
    mr.as_mut_slice()[..64].fill(0x5a);
    let recv = [mr.sge(1024, 64).unwrap()];
    // SAFETY: the buffers are read only after the completions below.
    unsafe { b.post_recv(&[RecvWr::new(2, &recv)]) }.unwrap();
    let send = [mr.sge(0, 64).unwrap()];
    // SAFETY: as above.
    unsafe { a.post_send(&[SendWr::new(1, SendOp::Send, &send)]) }.unwrap();
    let mut wcs = poll_n(&mut cq, 2, 2);
    wcs.sort_by_key(|w| w.wr_id);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)]
    );
    assert_eq!(mr.as_slice()[1024..1088], [0x5a; 64]);
}

/// What `to_rtr`/`to_rts` set, read back: the documented defaults (retry_cnt 6, so a dead peer
/// surfaces), and a `ConnectAttr` of one's own through the `_with` forms.
#[test]
fn connect_helpers_set_the_documented_defaults_or_the_given_ones() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let path = loopback_path(&ctx);
    let cq = ctx.create_cq(16).unwrap();
    let custom = ConnectAttr {
        timeout: 10,
        retry_cnt: 2,
        rnr_retry: 3,
        min_rnr_timer: 5,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 8,
    };
    for connect in [None, Some(custom)] {
        let mut qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
        let qpn = qp.qpn();
        qp.to_init(1, AccessFlags::REMOTE_WRITE).unwrap();
        match connect {
            None => {
                qp.to_rtr(path, qpn, 0, Mtu::Mtu1024).unwrap();
                qp.to_rts(0).unwrap();
            }
            Some(c) => {
                qp.to_rtr_with(path, qpn, 0, Mtu::Mtu1024, &c).unwrap();
                qp.to_rts_with(0, &c).unwrap();
            }
        }
        let a = qp.query().unwrap().attr;
        let want = connect.unwrap_or_default();
        let got = ConnectAttr {
            timeout: a.timeout.unwrap(),
            retry_cnt: a.retry_cnt.unwrap(),
            rnr_retry: a.rnr_retry.unwrap(),
            min_rnr_timer: a.min_rnr_timer.unwrap(),
            max_rd_atomic: a.max_rd_atomic.unwrap(),
            max_dest_rd_atomic: a.max_dest_rd_atomic.unwrap(),
        };
        assert_eq!(got, want);
    }
    let d = ConnectAttr::default();
    assert_eq!(
        (
            d.timeout,
            d.retry_cnt,
            d.rnr_retry,
            d.min_rnr_timer,
            d.max_rd_atomic,
            d.max_dest_rd_atomic
        ),
        (14, 6, 7, 12, 16, 16),
        "the values the docs give"
    );
}

#[test]
fn gid_and_pkey_queries() {
    let ctx = open_test_device();
    let table = ctx.gid_table().unwrap();
    assert!(!table.is_empty());
    // RoCE's loopback GID; on InfiniBand (the mlx5 model) GID 0, the port's link-local one.
    let gid = match ctx.query_port(1).unwrap().needs_grh() {
        true => loopback_gid(&ctx),
        false => table[0],
    };
    assert_eq!(ctx.query_gid(1, gid.index).unwrap(), gid);
    assert!(ctx.query_gid(1, 250).is_err());
    assert_eq!(ctx.query_pkey(1, 0).unwrap(), 0xffff, "default P_Key");
    let port = ctx.query_port(1).unwrap();
    assert!(port.gid_tbl_len as usize >= table.len());
}

/// The path migration state goes to the kernel and comes back from query; an alternate path
/// is InfiniBand's: Linux refuses it on RoCE ports with EINVAL (core/verbs.c
/// `_ib_modify_qp`), at any transition.
#[test]
fn migration_state_round_trips_and_roce_refuses_alternate_paths() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let path = loopback_path(&ctx);
    let cq = ctx.create_cq(16).unwrap();
    let mut qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let qpn = qp.qpn();
    qp.to_init(1, AccessFlags::REMOTE_WRITE).unwrap();
    qp.to_rtr(path, qpn, 0, Mtu::Mtu1024).unwrap();
    let rts = QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(0),
        timeout: Some(14),
        retry_cnt: Some(6),
        rnr_retry: Some(7),
        max_rd_atomic: Some(1),
        path_mig_state: Some(MigState::REARM),
        ..Default::default()
    };
    if ctx.query_port(1).unwrap().needs_grh() {
        let alt = AltPath {
            ah: path,
            pkey_index: 0,
            port_num: 1,
            timeout: 14,
        };
        let with_alt = QpAttr {
            alt_path: Some(alt),
            ..rts.clone()
        };
        let err = qp.modify(&with_alt).unwrap_err();
        assert_eq!(err.errno(), Some(nix::errno::Errno::EINVAL), "{err}");
        assert_eq!(qp.state(), QpState::Rtr);
    }
    qp.modify(&rts).unwrap();
    let a = qp.query().unwrap().attr;
    assert_eq!((a.state, a.path_mig_state), (Some(QpState::Rts), Some(MigState::REARM)));
    qp.modify(&QpAttr {
        path_mig_state: Some(MigState::ARMED),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(qp.query().unwrap().attr.path_mig_state, Some(MigState::ARMED));
    // The kernel takes one byte.
    let err = qp
        .modify(&QpAttr {
            path_mig_state: Some(MigState(256)),
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
}

/// Addressing by link layer: each QP's `Endpoint` (the port's LID on InfiniBand, its GID on
/// RoCE) goes through its byte encoding, and `connect_to` builds the path the link layer
/// needs; the pair then moves data both ways. On rxe this is RoCE; on the mlx5 model's
/// InfiniBand port a LID path. Ends on different link layers are refused.
#[test]
fn endpoints_connect_by_link_layer() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let mut cq = ctx.create_cq(64).unwrap();
    let mut a = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let mut b = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let port = ctx.query_port(1).unwrap();
    let (ea, eb) = (ctx.endpoint(&a, 1).unwrap(), ctx.endpoint(&b, 1).unwrap());
    match (port.needs_grh(), ea.addr) {
        (true, PortAddr::Gid { raw, .. }) => assert_eq!(raw, ctx.roce_v2_gid(1).unwrap().raw),
        (false, PortAddr::Lid(lid)) => assert_eq!(lid, port.lid),
        (roce, addr) => panic!("RoCE {roce}, addressed as {addr:?}"),
    }
    assert_eq!((ea.qpn, ea.port, Some(ea.mtu)), (a.qpn(), 1, port.active_mtu));
    assert!(ea.psn <= 0xff_ffff);
    let path = ctx.path_between(&ea, &eb).unwrap();
    assert_eq!(path.grh.is_some(), port.needs_grh(), "{path:?}");
    let layer = if port.needs_grh() {
        "RoCE, a GID path"
    } else {
        "InfiniBand, a LID path"
    };
    eprintln!("endpoints connect on {layer}");

    // Through the wire encoding, as a peer would get them.
    let (wa, wb) = (ea.encode(), eb.encode());
    let (pa, pb) = (Endpoint::decode(&wa).unwrap(), Endpoint::decode(&wb).unwrap());
    assert_eq!((pa, pb), (ea, eb));
    let other = Endpoint {
        addr: match ea.addr {
            PortAddr::Lid(_) => PortAddr::Gid { raw: [0; 16], index: 0 },
            PortAddr::Gid { .. } => PortAddr::Lid(1),
        },
        ..pb
    };
    let err = a.connect_to(&ctx, &ea, &other, AccessFlags::empty()).unwrap_err();
    assert!(err.to_string().contains("different link layers"), "{err}");
    assert_eq!(a.state(), QpState::Reset, "nothing changed");
    let err = a.connect_to(&ctx, &eb, &pa, AccessFlags::empty()).unwrap_err();
    assert!(err.to_string().contains("not this QP's"), "{err}");

    a.connect_to(&ctx, &ea, &pb, AccessFlags::empty()).unwrap();
    b.connect_to(&ctx, &eb, &pa, AccessFlags::empty()).unwrap();
    assert_eq!((a.state(), b.state()), (QpState::Rts, QpState::Rts));

    let mut bufs = pd
        .alloc_mr(4 * 64, LocalAccess::LOCAL_WRITE)
        .unwrap()
        .into_bufs(64)
        .unwrap();
    for (from, to) in [(0, 1), (1, 0)] {
        let mut msg = bufs.pop().unwrap();
        msg.fill_from(&[from as u8 + 1; 40]).unwrap();
        let (tx, rx) = if from == 0 { (&mut a, &mut b) } else { (&mut b, &mut a) };
        rx.recv_buf(bufs.pop().unwrap()).unwrap();
        tx.send_buf(SendOp::Send, msg).unwrap();
        let mut got = 0;
        let mut wc = [WorkCompletion::default(); 4];
        let start = std::time::Instant::now();
        while got < 2 {
            for c in cq.reap(&mut wc).iter() {
                assert!(c.is_success(), "{} -> {to}: {c:?}", from);
                let buf = tx.reclaim(c).or_else(|| rx.reclaim(c)).expect("a buffer back");
                if c.opcode == WcOpcode::RECV {
                    assert_eq!(buf.as_slice(), [from as u8 + 1; 40]);
                }
                bufs.push(buf);
                got += 1;
            }
            assert!(start.elapsed() < TIMEOUT, "{from} -> {to}: {got} completions");
        }
    }
}
