//! The siw provider on the real soft-iWARP driver: `cargo xtask test` runs this binary through
//! `xtask/guest/with_siw.sh`, which adds `siw0` on a dummy netdev with 169.254.78.1
//! (`UVERBS_SIW_ADDR`) and names it in `UVERBS_TEST_DEVICE`. iWARP QPs reach RTS only through
//! the connection manager, so the traffic tests connect two QPs of this process with
//! `uverbs::cm` over siw; every byte moved is checked.

mod common;

use common::cm::{assert_no_cm_ids, pattern};
use common::*;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;
use uverbs::cm::{ConnParam, Connector, Listener};
use uverbs::*;

const T: Duration = Duration::from_secs(20);

/// Bytes of each side's region.
const LEN: usize = 64 * 1024;

/// Where the server receives the note announcing the client's WRITE: past the eight
/// messages' buffers (`LEN / 2 + i * 1024`), below the written quarter (`LEN * 3 / 4`).
const NOTE_AT: usize = LEN / 2 + 8 * 1024;

/// `UVERBS_SIW_ADDR` with `port`.
fn siw_addr(port: u16) -> SocketAddr {
    let ip: IpAddr = std::env::var("UVERBS_SIW_ADDR")
        .expect("UVERBS_SIW_ADDR: the address of the netdev siw0 is on (`cargo xtask test` sets it)")
        .parse()
        .expect("UVERBS_SIW_ADDR is an IP address");
    SocketAddr::new(ip, port)
}

/// One end: a PD, a CQ and a region peers may read and write, on the device the CM chose.
struct End {
    pd: Pd,
    cq: Cq,
    mr: RemoteMr,
}

impl End {
    fn new(ctx: &Context) -> Self {
        assert_eq!(ctx.device().name, "siw0", "the CM chose another device");
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mr = pd.alloc_remote_mr(LEN, access).unwrap();
        Self { pd, cq, mr }
    }

    fn qp(&self) -> Qp {
        let mut init = QpInit::new(QpType::Rc, &self.cq, &self.cq);
        init.cap.max_send_sge = 2;
        init.cap.max_recv_sge = 2;
        init.cap.max_inline_data = 64;
        self.pd.create_qp(&init).unwrap()
    }

    fn recv(&mut self, qp: &mut Qp, wr_id: u64, offset: usize, len: u32) {
        let sge = [self.mr.sge(offset, len).unwrap()];
        // SAFETY: `mr` outlives the request; its completion is polled.
        unsafe { qp.post_recv(&[RecvWr::new(wr_id, &sge)]).unwrap() };
    }

    fn one(&mut self) -> WorkCompletion {
        poll_n(&mut self.cq, 1, 1)[0]
    }
}

#[test]
fn the_device_is_siw_and_what_siw_lacks_is_refused_before_the_kernel() {
    let ctx = open_test_device();
    let dev = ctx.device();
    assert_eq!(dev.name, "siw0");
    assert_eq!(dev.driver_id, Some(18), "RDMA_DRIVER_SIW");
    assert_eq!(dev.transport().unwrap(), Transport::IWARP);
    let pd = ctx.alloc_pd().unwrap();
    let mut cq = ctx.create_cq(8).unwrap();
    // REG_MR with siw's 8 bytes of driver data each way.
    let mr = pd.alloc_mr(4096, LocalAccess::LOCAL_WRITE).unwrap();
    assert_ne!(mr.lkey(), 0);
    for qp_type in [QpType::Ud, QpType::Uc] {
        match pd.create_qp(&QpInit::new(qp_type, &cq, &cq)) {
            Err(Error::Unsupported { verb: "CREATE_QP", .. }) => {}
            other => panic!("{qp_type:?}: {:?}", other.map(|q| q.qpn())),
        }
    }
    let mut init = QpInit::new(QpType::Rc, &cq, &cq);
    init.cap.max_inline_data = 81;
    match pd.create_qp(&init) {
        Err(Error::InvalidArgument { verb: "CREATE_QP", .. }) => {}
        other => panic!("81 bytes inline: {:?}", other.map(|q| q.qpn())),
    }
    match pd.create_ah(&AhAttr::default()) {
        Err(Error::Unsupported { verb: "CREATE_AH", .. }) => {}
        other => panic!("AH: {other:?}"),
    }
    match cq.resize(16) {
        Err(Error::Unsupported { verb: "RESIZE_CQ", .. }) => {}
        other => panic!("resize: {other:?}"),
    }
    // An RC QP the kernel accepts, with the inline limit siw has.
    let mut init = QpInit::new(QpType::Rc, &cq, &cq);
    init.cap.max_inline_data = 80;
    let qp = pd.create_qp(&init).unwrap();
    assert_eq!(qp.cap().max_inline_data, 80);
    assert_eq!(qp.state(), QpState::Reset);
    // An SRQ (6.1's siw has them) takes receives by its flags.
    let mut srq = pd.create_srq(&SrqInit::new(16, 1)).unwrap();
    let sge = [mr.sge(0, 64).unwrap()];
    // SAFETY: `mr` outlives the SRQ; nothing completes on it.
    unsafe { srq.post_recv(&[RecvWr::new(1, &sge), RecvWr::new(2, &sge)]).unwrap() };
    match srq.resize(64) {
        Err(Error::Unsupported { verb: "MODIFY_SRQ", .. }) => {}
        other => panic!("SRQ resize: {other:?}"),
    }
    assert_idle(&mut cq);
}

/// Connects two QPs of this process over siw and moves SEND/RECV, RDMA WRITE and RDMA READ
/// traffic, every byte checked, then the refusals on the connected QP, then disconnects.
/// QUERY_QP on siw answers no state on 6.1 (it reads RESET) and its idle state as INIT on
/// 6.12; the QP reports the state it is in on both.
#[test]
fn a_queried_qp_reports_the_state_it_is_in() {
    let ctx = open_test_device();
    let end = End::new(&ctx);
    let mut qp = end.qp();
    assert_eq!(qp.query().unwrap().attr.state, Some(QpState::Reset));
    assert_eq!(qp.state(), QpState::Reset);
    qp.to_init(1, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(qp.query().unwrap().attr.state, Some(QpState::Init));
    assert_eq!(qp.state(), QpState::Init);
}

#[test]
fn send_write_and_read_over_a_cm_connection_every_byte_checked() {
    let addr = siw_addr(7490);
    let listener = Listener::bind(addr).unwrap();
    // iWARP's MPA carries private data both ways.
    let (req_data, rep_data) = (pattern(200, 1), pattern(180, 2));
    let (to_client, from_server) = mpsc::channel::<(u64, u32)>();
    let (posted_tx, posted_rx) = mpsc::channel::<()>();
    thread::scope(|s| {
        let (listener, req_data, rep_data) = (&listener, &req_data, &rep_data);
        let server = s.spawn(move || {
            let req = listener.get_request(T).unwrap();
            assert_eq!(&req.private_data[..req_data.len()], &req_data[..]);
            let mut end = End::new(&req.context().unwrap());
            // The server's region: a pattern the client reads; it writes into the upper half.
            let src = pattern(LEN / 2, 9);
            end.mr.write(0, &src).unwrap();
            let mut qp = end.qp();
            req.init_qp(&mut qp).unwrap();
            for i in 0..8u64 {
                end.recv(&mut qp, 100 + i, LEN / 2 + i as usize * 1024, 1024);
            }
            // The receive for the message that announces the client's WRITE, posted with the
            // others: the client sends it once its WRITE completed, which on siw is once sent,
            // whatever this side has polled by then, and iWARP has no receiver-not-ready retry:
            // a SEND that finds no receive posted ends the connection (a TERMINATE, DDP
            // untagged buffer error "no buffer", docs/kernel-facts.md).
            end.recv(&mut qp, 200, NOTE_AT, 16);
            let param = ConnParam {
                private_data: rep_data,
                ..Default::default()
            };
            let mut conn = req.accept(qp, &param, T).unwrap();
            assert_eq!(conn.qp().state(), QpState::Rts, "the kernel moved the QP");
            to_client.send((end.mr.addr(), end.mr.rkey())).unwrap();
            // Eight messages, each of its own length and bytes.
            for i in 0..8u64 {
                let wc = end.one();
                wc.result().unwrap();
                assert_eq!((wc.wr_id, wc.opcode), (100 + i, WcOpcode::RECV));
                let len = 100 + 100 * i as usize;
                assert_eq!(wc.byte_len as usize, len);
                let at = LEN / 2 + i as usize * 1024;
                assert_eq!(end.mr.to_vec(at, len).unwrap(), pattern(len, i as u8), "message {i}");
            }
            // The client's RDMA WRITE into [LEN*3/4, LEN), announced by one more message.
            let wc = end.one();
            wc.result().unwrap();
            assert_eq!((wc.wr_id, wc.byte_len), (200, 5));
            assert_eq!(end.mr.to_vec(NOTE_AT, 5).unwrap(), b"wrote");
            assert_eq!(
                end.mr.to_vec(LEN * 3 / 4, LEN / 4).unwrap(),
                pattern(LEN / 4, 77),
                "the written bytes"
            );
            // The client's READ left the server's bytes as they were.
            assert_eq!(end.mr.to_vec(0, LEN / 2).unwrap(), src);
            // Posted before the client disconnects, which waits for it: a receive posted once
            // the kernel moved the QP on (the connection closed) is never seen, so never
            // flushed (the client used to go on as soon as it had sent a message this side
            // had not read yet, and under load won that race 2 runs in 40).
            end.recv(conn.qp_mut(), 300, 0, 16);
            posted_tx.send(()).unwrap();
            conn.wait_disconnected(T).unwrap();
            let wc = end.one();
            assert_eq!((wc.wr_id, wc.status), (300, WcStatus::WR_FLUSH_ERR));
            assert_idle(&mut end.cq);
        });
        let connector = Connector::resolve(addr, T).unwrap();
        let mut end = End::new(&connector.context().unwrap());
        let param = ConnParam {
            private_data: req_data,
            ..Default::default()
        };
        let mut conn = connector.connect(end.qp(), &param, T).unwrap();
        assert_eq!(conn.qp().state(), QpState::Rts, "ESTABLISHED without CONNECT_RESPONSE");
        assert_eq!(&conn.peer_private_data()[..rep_data.len()], &rep_data[..]);
        let (raddr, rkey) = from_server.recv().unwrap();
        // SENDs: two SGEs, inline, plain; every length differs.
        for i in 0..8u64 {
            let len = 100 + 100 * i as usize;
            let at = i as usize * 1024;
            end.mr.write(at, &pattern(len, i as u8)).unwrap();
            let flags = SendFlags::SIGNALED;
            match i {
                0 => {
                    // 100 bytes over two SGEs.
                    let sges = [end.mr.sge(at, 40).unwrap(), end.mr.sge(at + 40, 60).unwrap()];
                    // SAFETY: `mr` outlives the request; polled below.
                    unsafe {
                        conn.qp_mut()
                            .post_send(&[SendWr::new(i, SendOp::Send, &sges).with(flags)])
                    }
                    .unwrap();
                }
                _ => {
                    let sge = [end.mr.sge(at, len as u32).unwrap()];
                    // SAFETY: as above.
                    unsafe {
                        conn.qp_mut()
                            .post_send(&[SendWr::new(i, SendOp::Send, &sge).with(flags)])
                    }
                    .unwrap();
                }
            }
            let wc = end.one();
            wc.result().unwrap();
            assert_eq!((wc.wr_id, wc.opcode), (i, WcOpcode::SEND));
        }
        // RDMA WRITE of 16 KiB into the server's upper quarter.
        let w = LEN / 4;
        end.mr.write(8192, &pattern(w, 77)).unwrap();
        let sge = [end.mr.sge(8192, w as u32).unwrap()];
        let target = Remote {
            addr: raddr + (LEN * 3 / 4) as u64,
            rkey,
        };
        // SAFETY: as above.
        unsafe {
            conn.qp_mut()
                .post_send(&[SendWr::new(20, SendOp::RdmaWrite(target), &sge).with(SendFlags::SIGNALED)])
        }
        .unwrap();
        let wc = end.one();
        wc.result().unwrap();
        assert_eq!((wc.wr_id, wc.opcode), (20, WcOpcode::RDMA_WRITE));
        // Inline SEND announcing it (5 bytes from the stack).
        let note = *b"wrote";
        let sge = [Sge {
            addr: note.as_ptr() as u64,
            length: 5,
            lkey: 0,
        }];
        // SAFETY: inline: the bytes are copied during the post.
        unsafe {
            conn.qp_mut()
                .post_send(&[SendWr::new(21, SendOp::Send, &sge).with(SendFlags::SIGNALED | SendFlags::INLINE)])
        }
        .unwrap();
        let wc = end.one();
        wc.result().unwrap();
        assert_eq!(wc.wr_id, 21);
        // RDMA READ of the server's lower half into [LEN/2, LEN).
        end.mr.write(LEN / 2, &vec![0; LEN / 2]).unwrap();
        let sge = [end.mr.sge(LEN / 2, (LEN / 2) as u32).unwrap()];
        let source = Remote { addr: raddr, rkey };
        // SAFETY: as above.
        unsafe {
            conn.qp_mut()
                .post_send(&[SendWr::new(22, SendOp::RdmaRead(source), &sge).with(SendFlags::SIGNALED)])
        }
        .unwrap();
        let wc = end.one();
        wc.result().unwrap();
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.byte_len),
            (22, WcOpcode::RDMA_READ, (LEN / 2) as u32)
        );
        assert_eq!(
            end.mr.to_vec(LEN / 2, LEN / 2).unwrap(),
            pattern(LEN / 2, 9),
            "the bytes read"
        );
        // What siw lacks, refused on the connected QP before the kernel sees it.
        let one = [end.mr.sge(0, 8).unwrap()];
        let two = [end.mr.sge(0, 8).unwrap(), end.mr.sge(8, 8).unwrap()];
        let long = [end.mr.sge(0, 81).unwrap()];
        assert!(conn.qp().cap().max_inline_data >= 64);
        let refusals: [(SendWr<'_>, WrReject); 7] = [
            (
                SendWr::new(30, SendOp::SendWithImm { imm: 1 }, &one),
                WrReject::OpcodeNotSupported,
            ),
            (
                SendWr::new(31, SendOp::RdmaWriteWithImm(target, 1), &one),
                WrReject::OpcodeNotSupported,
            ),
            (
                SendWr::new(32, SendOp::FetchAdd { remote: target, add: 1 }, &one),
                WrReject::OpcodeNotSupported,
            ),
            (
                SendWr::new(
                    33,
                    SendOp::CompareSwap {
                        remote: target,
                        compare: 0,
                        swap: 1,
                    },
                    &one,
                ),
                WrReject::OpcodeNotSupported,
            ),
            (
                SendWr::new(34, SendOp::RdmaRead(source), &two),
                WrReject::TooManySge { given: 2, max: 1 },
            ),
            // Inline data for anything but SEND and WRITE: the kernel would leave the slot
            // VALID and stop the queue.
            (
                SendWr::new(36, SendOp::SendWithInv { rkey: 1 }, &one).with(SendFlags::INLINE),
                WrReject::OpcodeNotSupported,
            ),
            (
                SendWr::new(35, SendOp::Send, &long).with(SendFlags::INLINE),
                WrReject::InlineTooLong {
                    given: 81,
                    max: conn.qp().cap().max_inline_data,
                },
            ),
        ];
        for (wr, why) in refusals {
            // SAFETY: refused before anything is read or written.
            match unsafe { conn.qp_mut().post_send(&[wr]) } {
                Err(Error::WorkRequest { index: 0, reason, .. }) => assert_eq!(reason, why, "{:?}", wr.op),
                other => panic!("{:?}: {other:?}", wr.op),
            }
        }
        assert_idle(&mut end.cq);
        // The connection still works after the refusals.
        end.recv(conn.qp_mut(), 40, 0, 8);
        posted_rx.recv().unwrap();
        conn.disconnect(T).unwrap();
        let wc = end.one();
        assert_eq!((wc.wr_id, wc.status), (40, WcStatus::WR_FLUSH_ERR));
        assert_idle(&mut end.cq);
        drop(conn);
        server.join().unwrap();
    });
    drop(listener);
    assert_no_cm_ids();
}

/// iWARP's private data: 251 bytes each way arrive whole; 252 are refused before the kernel
/// (6.1's siw would wrap MPA's length byte); a reject carries 251 bytes and the reason.
#[test]
fn private_data_at_the_iwarp_limit_arrives_whole_and_past_it_is_refused() {
    let addr = siw_addr(7491);
    let listener = Listener::bind(addr).unwrap();
    let (req_data, rep_data) = (pattern(251, 3), pattern(251, 4));
    thread::scope(|s| {
        let (listener, req_data, rep_data) = (&listener, &req_data, &rep_data);
        let server = s.spawn(move || {
            let req = listener.get_request(T).unwrap();
            println!("passive side: {} bytes of private data", req.private_data.len());
            assert_eq!(&req.private_data[..], &req_data[..]);
            let end = End::new(&req.context().unwrap());
            let param = ConnParam {
                private_data: rep_data,
                ..Default::default()
            };
            let mut conn = req.accept(end.qp(), &param, T).unwrap();
            // The active side disconnects; this side answers.
            conn.wait_disconnected(T).unwrap();
            assert_eq!(conn.qp().state(), QpState::Err);
        });
        let connector = Connector::resolve(addr, T).unwrap();
        let limits = connector.id().private_data_limits().unwrap();
        assert_eq!((limits.connect, limits.accept, limits.reject), (251, 251, 251));
        let end = End::new(&connector.context().unwrap());
        let too_long = pattern(252, 6);
        let refused = ConnParam {
            private_data: &too_long,
            ..Default::default()
        };
        match connector.connect(end.qp(), &refused, T).map_err(|f| f.error) {
            Err(Error::PrivateDataTooLong { .. }) => {}
            other => panic!("252 bytes: {:?}", other.map(|c| c.qp().qpn())),
        }
        let connector = Connector::resolve(addr, T).unwrap();
        let param = ConnParam {
            private_data: req_data,
            ..Default::default()
        };
        let mut conn = connector.connect(end.qp(), &param, T).unwrap();
        println!("active side: {} bytes of private data", conn.peer_private_data().len());
        assert_eq!(conn.peer_private_data(), &rep_data[..]);
        conn.disconnect(T).unwrap();
        drop(conn);
        server.join().unwrap();
    });
    // A reject with 251 bytes.
    let rej_data = pattern(251, 7);
    thread::scope(|s| {
        let (listener, rej_data) = (&listener, &rej_data);
        let server = s.spawn(move || listener.get_request(T).unwrap().reject(rej_data).unwrap());
        let connector = Connector::resolve(addr, T).unwrap();
        let end = End::new(&connector.context().unwrap());
        match connector
            .connect(end.qp(), &ConnParam::default(), T)
            .map_err(|f| f.error)
        {
            Err(Error::Rejected { status, private_data }) => {
                println!("reject: status {status}, {} bytes", private_data.len());
                assert_eq!(&private_data[..], &rej_data[..]);
            }
            other => panic!("expected a reject, got {:?}", other.map(|c| c.qp().qpn())),
        }
        server.join().unwrap();
    });
    drop(listener);
    assert_no_cm_ids();
}

/// The passive side disconnects first; the active side's posted receive is flushed once.
#[test]
fn the_passive_side_disconnects_first_and_receives_flush_once() {
    let addr = siw_addr(7492);
    let listener = Listener::bind(addr).unwrap();
    let (posted_tx, posted_rx) = mpsc::channel::<()>();
    thread::scope(|s| {
        let listener = &listener;
        let server = s.spawn(move || {
            let req = listener.get_request(T).unwrap();
            let end = End::new(&req.context().unwrap());
            let mut conn = req.accept(end.qp(), &ConnParam::default(), T).unwrap();
            posted_rx.recv().unwrap();
            conn.disconnect(T).unwrap();
        });
        let connector = Connector::resolve(addr, T).unwrap();
        let mut end = End::new(&connector.context().unwrap());
        let mut conn = connector.connect(end.qp(), &ConnParam::default(), T).unwrap();
        end.recv(conn.qp_mut(), 9, 0, 64);
        posted_tx.send(()).unwrap();
        conn.wait_disconnected(T).unwrap();
        let wc = end.one();
        assert_eq!((wc.wr_id, wc.status), (9, WcStatus::WR_FLUSH_ERR));
        assert_idle(&mut end.cq);
        assert_eq!(conn.qp().state(), QpState::Err);
        server.join().unwrap();
    });
    drop(listener);
    assert_no_cm_ids();
}

/// A QP whose connection is not up, asked to take it as up (`Qp::iwarp_connected_elsewhere`,
/// what the libibverbs drop-in does on a post librdmacm's connection may have made valid):
/// the kernel refuses the empty doorbell it rings first (ENOTCONN), the QP stays in INIT, and
/// nothing is written into its send queue, where siw would run it once the connection came
/// up. Once connected, the QP's send queue carries only what is posted after.
#[test]
fn a_qp_not_yet_connected_is_not_taken_as_connected_and_its_queue_stays_empty() {
    let addr = siw_addr(7493);
    let listener = Listener::bind(addr).unwrap();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    thread::scope(|s| {
        let listener = &listener;
        let server = s.spawn(move || {
            let req = listener.get_request(T).unwrap();
            let mut end = End::new(&req.context().unwrap());
            let mut qp = end.qp();
            req.init_qp(&mut qp).unwrap();
            let room = qp.send_room();
            let err = qp.iwarp_connected_elsewhere().unwrap_err();
            assert_eq!(err.errno(), Some(nix::errno::Errno::ENOTCONN), "{err}");
            assert_eq!(qp.state(), QpState::Init);
            assert_eq!(qp.send_room(), room, "nothing written into the send queue");
            end.recv(&mut qp, 1, 0, 1024);
            let mut conn = req.accept(qp, &ConnParam::default(), T).unwrap();
            let wc = end.one();
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (1, WcStatus::SUCCESS, 300),
                "{wc:?}"
            );
            assert_eq!(end.mr.to_vec(0, 300).unwrap(), pattern(300, 3));
            // The client posted its receive: one SEND back, the only request in the queue.
            ready_rx.recv().unwrap();
            end.mr.write(4096, &pattern(200, 4)).unwrap();
            let sge = [end.mr.sge(4096, 200).unwrap()];
            // SAFETY: `mr` outlives the request; polled below.
            unsafe {
                conn.qp_mut()
                    .post_send(&[SendWr::new(2, SendOp::Send, &sge).with(SendFlags::SIGNALED)])
            }
            .unwrap();
            let wc = end.one();
            assert_eq!((wc.wr_id, wc.status), (2, WcStatus::SUCCESS), "{wc:?}");
            assert_idle(&mut end.cq);
            conn.wait_disconnected(T).unwrap();
        });
        let connector = Connector::resolve(addr, T).unwrap();
        let mut end = End::new(&connector.context().unwrap());
        let mut conn = connector.connect(end.qp(), &ConnParam::default(), T).unwrap();
        end.recv(conn.qp_mut(), 10, 8192, 1024);
        end.mr.write(0, &pattern(300, 3)).unwrap();
        let sge = [end.mr.sge(0, 300).unwrap()];
        // SAFETY: `mr` outlives the request; polled below.
        unsafe {
            conn.qp_mut()
                .post_send(&[SendWr::new(11, SendOp::Send, &sge).with(SendFlags::SIGNALED)])
        }
        .unwrap();
        let wc = end.one();
        assert_eq!((wc.wr_id, wc.status), (11, WcStatus::SUCCESS), "{wc:?}");
        ready_tx.send(()).unwrap();
        let wc = end.one();
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (10, WcStatus::SUCCESS, 200),
            "{wc:?}"
        );
        assert_eq!(
            end.mr.to_vec(8192, 200).unwrap(),
            pattern(200, 4),
            "only the SEND posted after"
        );
        assert_idle(&mut end.cq);
        conn.disconnect(T).unwrap();
        server.join().unwrap();
    });
    drop(listener);
    assert_no_cm_ids();
}
