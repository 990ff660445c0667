//! UD: address handles, Q_Keys, the 40-byte GRH at the head of every receive buffer, and the
//! source QP in completions.

mod common;

use common::*;
use uverbs::*;

const QKEY: u32 = 0x1111_2222;

/// A UD QP in RTS.
fn ud_qp(pd: &Pd, cq: &Cq) -> Qp {
    let mut init = QpInit::new(QpType::Ud, cq, cq);
    init.cap.max_inline_data = 64;
    let mut qp = pd.create_qp(&init).expect("UD QP");
    qp.ud_to_rts(1, QKEY).expect("UD to RTS");
    qp
}

#[test]
fn ud_sends_carry_grh_src_qp_and_payload() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let (mut scq, mut rcq) = (ctx.create_cq(64).unwrap(), ctx.create_cq(64).unwrap());
    let mut tx = ud_qp(&pd, &scq);
    let mut rx = ud_qp(&pd, &rcq);
    let (path, gid) = loopback_path_with_grh(&ctx);
    let ah = pd.create_ah(&path).expect("create_ah");
    let mut mr = pd.alloc_mr(65536, LocalAccess::LOCAL_WRITE).unwrap();

    const N: u64 = 20;
    for i in 0..N {
        let sge = mr.sge(32768 + i as usize * 1024, 1024).unwrap();
        // SAFETY: the buffer is read only after the completion.
        unsafe { rx.post_recv(&[RecvWr::new(i, &[sge])]) }.unwrap();
    }
    for i in 0..N {
        let len = 100 + i as usize * 10;
        mr.as_mut_slice()[..len].fill(i as u8 + 1);
        let sge = [mr.sge(0, len as u32).unwrap()];
        let dest = ah.ud_dest(rx.qpn(), QKEY);
        let op = if i % 2 == 0 {
            SendOp::Send
        } else {
            SendOp::SendWithImm { imm: i as u32 }
        };
        // SAFETY: the buffer is rewritten only after the send completed (polled below).
        unsafe { tx.post_send(&[SendWr::new(i, op, &sge).to(dest)]) }.unwrap();
        let c = poll_n(&mut scq, 1, 1)[0];
        assert_eq!(
            (c.status, c.opcode, c.wr_id),
            (WcStatus::SUCCESS, WcOpcode::SEND, i),
            "{c:?}"
        );
    }
    for (i, c) in poll_n(&mut rcq, N as usize, 8).into_iter().enumerate() {
        let len = 100 + i * 10;
        assert_eq!(
            (c.status, c.opcode, c.wr_id),
            (WcStatus::SUCCESS, WcOpcode::RECV, i as u64),
            "{c:?}"
        );
        assert_eq!(c.byte_len as usize, 40 + len, "byte_len counts the GRH: {c:?}");
        assert_eq!((c.src_qp, c.qp_num), (tx.qpn(), rx.qpn()), "{c:?}");
        assert!(c.wc_flags.contains(WcFlags::GRH), "{c:?}");
        assert_eq!(c.imm(), (i % 2 == 1).then_some(i as u32), "{c:?}");
        let buf = &mr.as_slice()[32768 + i * 1024..][..40 + len];
        if gid.ip().to_ipv4_mapped().is_some() {
            // IPv4: 20 unused bytes, then the IPv4 header (version 4, IHL 5).
            assert_eq!(buf[20], 0x45, "IPv4 header in the GRH area");
        } else {
            assert_eq!(buf[0] >> 4, 6, "IPv6 header in the GRH area");
        }
        assert!(buf[40..].iter().all(|&b| b == i as u8 + 1), "payload of message {i}");
    }
    assert_idle(&mut rcq);
}

#[test]
fn ud_rejects_one_sided_operations_and_missing_destinations() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let mut qp = ud_qp(&pd, &cq);
    let mr = pd.alloc_mr(4096, LocalAccess::LOCAL_WRITE).unwrap();
    let sge = [mr.sge(0, 8).unwrap()];
    let write = SendWr::new(1, SendOp::RdmaWrite(Remote { addr: 0, rkey: 0 }), &sge);
    let no_dest = SendWr::new(2, SendOp::Send, &sge);
    for wr in [write, no_dest] {
        match unsafe { qp.post_send(&[wr]) } {
            Err(Error::WorkRequest {
                index: 0,
                reason: WrReject::OpcodeNotSupported,
                ..
            }) => {}
            other => panic!("expected OpcodeNotSupported for {wr:?}, got {other:?}"),
        }
    }
}

/// Without a global route, on InfiniBand: no GRH flag, the 40 bytes at the head of the buffer
/// left as they were, `byte_len` still counting them; the source LID and QP in the
/// completion; a send with a wrong Q_Key dropped at the receiver while the sender completes.
/// On RoCE every packet needs a GRH: an AH without one is refused.
#[test]
fn ud_without_a_grh_leaves_its_room_alone_and_a_wrong_qkey_is_dropped() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let port = ctx.query_port(1).unwrap();
    if port.needs_grh() {
        let refused = pd.create_ah(&AhAttr {
            port_num: 1,
            ..Default::default()
        });
        assert!(refused.is_err(), "an AH without a GRH on RoCE: {refused:?}");
        return;
    }
    let (mut scq, mut rcq) = (ctx.create_cq(16).unwrap(), ctx.create_cq(16).unwrap());
    let mut tx = ud_qp(&pd, &scq);
    let mut rx = ud_qp(&pd, &rcq);
    let ah = pd.create_ah(&loopback_path(&ctx)).expect("create_ah");
    let mut mr = pd.alloc_mr(8192, LocalAccess::LOCAL_WRITE).unwrap();
    mr.as_mut_slice()[4096..].fill(0xee);
    for i in 0..2 {
        let sge = mr.sge(4096 + i * 1024, 1024).unwrap();
        // SAFETY: the buffer is read only after the completion.
        unsafe { rx.post_recv(&[RecvWr::new(i as u64, &[sge])]) }.unwrap();
    }
    mr.as_mut_slice()[..300].fill(7);
    let sge = [mr.sge(0, 300).unwrap()];
    for (id, qkey) in [(1, QKEY ^ 1), (2, QKEY)] {
        // SAFETY: the buffer is not rewritten.
        unsafe { tx.post_send(&[SendWr::new(id, SendOp::Send, &sge).to(ah.ud_dest(rx.qpn(), qkey))]) }.unwrap();
        let c = poll_n(&mut scq, 1, 1)[0];
        assert_eq!((c.status, c.wr_id), (WcStatus::SUCCESS, id), "{c:?}");
    }
    let c = poll_n(&mut rcq, 1, 1)[0];
    assert_eq!((c.status, c.wr_id, c.byte_len), (WcStatus::SUCCESS, 0, 340), "{c:?}");
    assert_eq!((c.src_qp, c.slid), (tx.qpn(), port.lid), "{c:?}");
    assert!(!c.wc_flags.contains(WcFlags::GRH), "{c:?}");
    let buf = &mr.as_slice()[4096..4096 + 1024];
    assert!(buf[..40].iter().all(|&b| b == 0xee), "the GRH room untouched");
    assert!(buf[40..340].iter().all(|&b| b == 7), "the payload after it");
    assert!(buf[340..].iter().all(|&b| b == 0xee), "nothing past it");
    assert_idle(&mut rcq);
}

/// An address handle names a destination for its own context's provider only: a UD request
/// carrying another context's AH is refused before it reaches the queue.
#[test]
fn an_ah_of_another_context_is_refused() {
    let (ctx, other) = (open_test_device(), open_test_device());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let mut qp = ud_qp(&pd, &cq);
    let foreign = other
        .alloc_pd()
        .unwrap()
        .create_ah(&loopback_path_with_grh(&other).0)
        .unwrap();
    let mr = pd.alloc_mr(4096, LocalAccess::LOCAL_WRITE).unwrap();
    let sge = [mr.sge(0, 8).unwrap()];
    let wr = SendWr::new(1, SendOp::Send, &sge).to(foreign.ud_dest(qp.qpn(), QKEY));
    // SAFETY: refused before anything is queued.
    match unsafe { qp.post_send(&[wr]) } {
        Err(Error::WorkRequest {
            index: 0,
            reason: WrReject::ForeignAh,
            ..
        }) => {}
        other => panic!("expected ForeignAh, got {other:?}"),
    }
}
