//! UC: sends and RDMA writes; reads and atomics are refused before posting.

mod common;

use common::*;
use uverbs::*;

#[test]
fn uc_send_and_write_arrive() {
    let mut p = Pair::with(PairOpts {
        qp_type: QpType::Uc,
        ..PairOpts::default()
    });
    for i in 0..8u64 {
        let sge = p.b.mr.sge(i as usize * 256, 256).unwrap();
        // SAFETY: read only after completion.
        unsafe { p.b.qp.post_recv(&[RecvWr::new(i, &[sge])]) }.unwrap();
    }
    for i in 0..8u64 {
        p.a.mr.bytes_mut()[i as usize * 100..][..100].fill(0x40 + i as u8);
        let sge = [p.a.mr.sge(i as usize * 100, 100).unwrap()];
        unsafe { p.a.qp.post_send(&[SendWr::new(i, SendOp::Send, &sge)]) }.unwrap();
    }
    for c in poll_n(&mut p.a.cq, 8, 8) {
        assert_eq!((c.status, c.opcode), (WcStatus::SUCCESS, WcOpcode::SEND), "{c:?}");
    }
    for c in poll_n(&mut p.b.cq, 8, 8) {
        assert_eq!(
            (c.status, c.opcode, c.byte_len),
            (WcStatus::SUCCESS, WcOpcode::RECV, 100),
            "{c:?}"
        );
        assert!(p.b.mr.bytes()[c.wr_id as usize * 256..][..100]
            .iter()
            .all(|&b| b == 0x40 + c.wr_id as u8));
    }
    // RDMA write, and write with immediate.
    p.a.mr.bytes_mut()[..512].fill(0x77);
    let sge = [p.a.mr.sge(0, 512).unwrap()];
    let remote = Remote {
        addr: p.b.mr.addr() + 8192,
        rkey: p.b.mr.rkey(),
    };
    unsafe { p.a.qp.post_send(&[SendWr::new(20, SendOp::RdmaWrite(remote), &sge)]) }.unwrap();
    let rsge = p.b.mr.sge(0, 0).unwrap();
    unsafe { p.b.qp.post_recv(&[RecvWr::new(21, &[rsge])]) }.unwrap();
    let remote2 = Remote {
        addr: p.b.mr.addr() + 16384,
        rkey: p.b.mr.rkey(),
    };
    unsafe {
        p.a.qp
            .post_send(&[SendWr::new(22, SendOp::RdmaWriteWithImm(remote2, 5), &sge)])
    }
    .unwrap();
    let done = poll_n(&mut p.a.cq, 2, 4);
    assert!(
        done.iter()
            .all(|c| c.status == WcStatus::SUCCESS && c.opcode == WcOpcode::RDMA_WRITE),
        "{done:?}"
    );
    let r = poll_n(&mut p.b.cq, 1, 4)[0];
    assert_eq!(
        (r.wr_id, r.opcode, r.imm()),
        (21, WcOpcode::RECV_RDMA_WITH_IMM, Some(5))
    );
    assert!(p.b.mr.bytes()[8192..8192 + 512].iter().all(|&b| b == 0x77));
    assert!(p.b.mr.bytes()[16384..16384 + 512].iter().all(|&b| b == 0x77));
}

#[test]
fn uc_refuses_reads_and_atomics() {
    let mut p = Pair::with(PairOpts {
        qp_type: QpType::Uc,
        ..PairOpts::default()
    });
    let sge = [p.a.mr.sge(0, 8).unwrap()];
    let remote = Remote {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey(),
    };
    for op in [SendOp::RdmaRead(remote), SendOp::FetchAdd { remote, add: 1 }] {
        match unsafe { p.a.qp.post_send(&[SendWr::new(1, op, &sge)]) } {
            Err(Error::WorkRequest {
                reason: WrReject::OpcodeNotSupported,
                ..
            }) => {}
            other => panic!("{op:?} on UC: {other:?}"),
        }
    }
    assert_idle(&mut p.a.cq);
}
