//! A region dropped while a QP's responder still holds it: on rxe (Linux 6.1) a multi-packet
//! RDMA write with immediate into it that never finishes (the requester retries; it ends in
//! RETRY_EXC_ERR) leaves the region in the responder's `qp->resp.mr`, and DEREG_MR then waits
//! 50 s and logs a kernel WARNING (docs/kernel-facts.md). The library deregisters such a
//! region once the QPs that could hold it are destroyed or reset: the drop returns at once,
//! the kernel logs nothing, and the region goes when the QPs go. This sequence is the
//! safe-API fuzzer's (seed 0x1800, round 115), reduced.

mod common;

use common::*;
use std::time::{Duration, Instant};
use uverbs::*;

#[test]
fn a_region_a_responder_still_holds_is_deregistered_after_its_qps() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let path = loopback_path(&ctx);
    let all =
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let target = pd.alloc_remote_mr((32 << 10) + 64, all).unwrap();
    let mut bufs = pd
        .alloc_mr(796399, LocalAccess::LOCAL_WRITE)
        .unwrap()
        .into_bufs(3111)
        .unwrap();
    let mut srq = pd.create_srq(&SrqInit::new(14, 1)).unwrap();
    let cq_a = ctx.create_cq(12).unwrap();
    let cq_b = ctx.create_cq(1).unwrap();
    let cq = ctx.create_cq(60).unwrap();
    let mut a = pd
        .create_qp(&QpInit {
            srq: Some(&srq),
            cap: QpCap {
                max_send_wr: 2,
                max_recv_wr: 22,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 256,
            },
            ..QpInit::new(QpType::Rc, &cq_a, &cq_b)
        })
        .unwrap();
    let mut b = pd
        .create_qp(&QpInit {
            cap: QpCap {
                max_send_wr: 12,
                max_recv_wr: 2,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..QpInit::new(QpType::Rc, &cq, &cq)
        })
        .unwrap();
    let (qa, qb) = (a.qpn(), b.qpn());
    for (qp, peer) in [(&mut a, qb), (&mut b, qa)] {
        qp.to_init(1, all).unwrap();
        qp.to_rtr(path, peer, 0, Mtu::Mtu1024).unwrap();
        qp.to_rts(0).unwrap();
    }
    b.recv_buf(bufs.pop().unwrap()).unwrap();
    b.send_inline_with(
        SendOp::SendWithImm { imm: 18 },
        &[7; 16],
        SendFlags::SIGNALED | SendFlags::INLINE,
        None,
    )
    .unwrap();
    srq.recv_buf(bufs.pop().unwrap()).unwrap();
    srq.recv_buf(bufs.pop().unwrap()).unwrap();
    let remote = target.remote(1000).unwrap();
    b.send_buf_with(
        SendOp::RdmaWriteWithImm(remote, 19),
        bufs.pop().unwrap(),
        SendFlags::FENCE | SendFlags::SIGNALED,
        None,
    )
    .unwrap();
    let t = Instant::now();
    drop(target);
    let dropped = t.elapsed();
    let t = Instant::now();
    drop((a, b));
    let qps = t.elapsed();
    eprintln!("region dropped in {dropped:?}, the QPs (and the region with them) in {qps:?}");
    assert!(dropped < Duration::from_secs(5), "DEREG_MR waited {dropped:?}");
    assert!(qps < Duration::from_secs(5), "the QPs' destruction waited {qps:?}");
    drop((srq, cq, cq_a, cq_b, bufs, pd, ctx));
}
