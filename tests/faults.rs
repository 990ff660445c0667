//! Faults: a QP moved to the error state with work outstanding flushes each request exactly
//! once; RNR with retry counts 0 and 7; destroy and ownership mistakes get typed errors.
//!
//! Elsewhere, not repeated here: a peer process killed mid-stream (RETRY_EXC_ERR while the
//! survivor's other QPs keep working) is `two_hosts.rs`'s `killed_peer_gives_retry_exceeded`;
//! CQ overrun is `cq.rs`'s `overrun_is_reported_as_a_cq_error_event`; destroying a CQ in use
//! is `bad_input.rs`'s `destroying_a_cq_in_use_is_ebusy_and_the_cq_survives`.

mod common;
mod figures;

use common::*;
use figures::figure;
use std::time::{Duration, Instant};
use uverbs::*;

/// A connected RC pair like `Pair::new`, with A's RNR retry count set to `rnr_retry`.
fn pair_with_rnr_retry(rnr_retry: u8) -> Pair {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let path = loopback_path(&ctx);
    let opts = PairOpts::default();
    let make = || {
        let cq = ctx.create_cq(opts.cq_depth).unwrap();
        let mut init = QpInit::new(QpType::Rc, &cq, &cq);
        init.cap = opts.cap;
        let qp = pd.create_qp(&init).unwrap();
        let mr = pd.alloc_remote_mr(opts.mr_len, opts.access).unwrap();
        End { qp, cq, mr }
    };
    let (mut a, mut b) = (make(), make());
    let (a_qpn, b_qpn) = (a.qp.qpn(), b.qp.qpn());
    for (me, peer, rnr) in [(&mut a, b_qpn, rnr_retry), (&mut b, a_qpn, 7)] {
        me.qp.to_init(1, opts.access).unwrap();
        me.qp.to_rtr(path, peer, 0, Mtu::Mtu1024).unwrap();
        me.qp
            .modify(&QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(0),
                timeout: Some(14),
                retry_cnt: Some(7),
                rnr_retry: Some(rnr),
                max_rd_atomic: Some(16),
                ..Default::default()
            })
            .unwrap();
    }
    Pair {
        ctx,
        pd,
        a,
        b,
        cm: None,
    }
}

fn to_err(qp: &mut Qp) {
    qp.modify(&QpAttr {
        state: Some(QpState::Err),
        ..Default::default()
    })
    .unwrap();
}

/// Polls until `cq` has been quiet for `quiet` (at most `TIMEOUT` in all).
fn drain(cq: &mut Cq, quiet: Duration) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 32];
    let start = Instant::now();
    let mut last = Instant::now();
    while last.elapsed() < quiet && start.elapsed() < TIMEOUT {
        let n = cq.poll(&mut wc);
        if n > 0 {
            out.extend_from_slice(&wc[..n]);
            last = Instant::now();
        }
    }
    out
}

/// Sends to a peer with no receive and an infinite RNR retry stay outstanding; moving the QP
/// to ERR then flushes every one of them, signaled or not, and every posted receive: each
/// wr_id exactly once, in order, as WR_FLUSH_ERR. Requests posted in ERR flush too.
#[test]
fn err_with_n_outstanding_flushes_exactly_n() {
    for (sends, recvs) in [(1u64, 0u64), (37, 11), (200, 100)] {
        let mut p = pair_with_rnr_retry(7);
        let sge = [p.a.mr.sge(0, 64).unwrap()];
        let wrs: Vec<_> = (0..sends)
            .map(|i| {
                let wr = SendWr::new(i, SendOp::Send, &sge);
                // Every third unsignaled: a flushed request completes regardless.
                if i % 3 == 1 {
                    wr.set_flags(SendFlags::empty())
                } else {
                    wr
                }
            })
            .collect();
        for i in 0..recvs {
            let rsge = p.a.mr.sge(4096 + i as usize * 64, 64).unwrap();
            // SAFETY: the receive buffer stays valid and untouched until its completion.
            unsafe { p.a.qp.post_recv(&[RecvWr::new(1_000_000 + i, &[rsge])]) }.unwrap();
        }
        // SAFETY: the buffers outlive the flush.
        unsafe { p.a.qp.post_send(&wrs) }.unwrap();
        // Nothing completes while the peer has no receive (RNR retry 7 = forever).
        std::thread::sleep(Duration::from_millis(300));
        let mut wc = [WorkCompletion::default(); 4];
        assert_eq!(p.a.cq.poll(&mut wc), 0, "{:?}", &wc);

        to_err(&mut p.a.qp);
        let got = drain(&mut p.a.cq, Duration::from_millis(500));
        let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
        let want: Vec<u64> = (0..sends).collect();
        let recv_ids: Vec<u64> = (1_000_000..1_000_000 + recvs).collect();
        // The two queues flush independently; within each, in order.
        let send_part: Vec<u64> = ids.iter().copied().filter(|&i| i < 1_000_000).collect();
        let recv_part: Vec<u64> = ids.iter().copied().filter(|&i| i >= 1_000_000).collect();
        assert_eq!(send_part, want, "each send flushed once, in order");
        assert_eq!(recv_part, recv_ids, "each receive flushed once, in order");
        for c in &got {
            assert_eq!((c.status, c.qp_num), (WcStatus::WR_FLUSH_ERR, p.a.qp.qpn()), "{c:?}");
        }
        assert_idle(&mut p.b.cq);

        // Posting in ERR is accepted and flushed, exactly once each. Sends flush at once (the
        // doorbell is a kernel call); rxe takes receives from the ring with no kernel call, so
        // one posted in ERR waits for the next kernel entry that schedules the responder: a
        // repeated move to ERR flushes it (rdma-core's librxe behaves the same).
        let more: Vec<_> = (0..5).map(|i| SendWr::new(500 + i, SendOp::Send, &sge)).collect();
        // SAFETY: the buffers named stay valid and unchanged until the completion.
        unsafe { p.a.qp.post_send(&more) }.unwrap();
        let rsge = [p.a.mr.sge(8192, 64).unwrap()];
        unsafe { p.a.qp.post_recv(&[RecvWr::new(2_000_000, &rsge)]) }.unwrap();
        let mut got2 = drain(&mut p.a.cq, Duration::from_millis(500));
        let recv_waited = !got2.iter().any(|c| c.wr_id == 2_000_000);
        if recv_waited {
            to_err(&mut p.a.qp);
            got2.extend(drain(&mut p.a.cq, Duration::from_millis(500)));
        }
        let mut ids2: Vec<u64> = got2.iter().map(|c| c.wr_id).collect();
        ids2.sort_unstable();
        assert_eq!(ids2, [500, 501, 502, 503, 504, 2_000_000]);
        assert!(got2.iter().all(|c| c.status == WcStatus::WR_FLUSH_ERR), "{got2:?}");
        figure(format_args!(
            "ERR with {sends} sends + {recvs} receives outstanding: {} flush completions, {} more for 6 posted in ERR{}; lost 0, duplicated 0, invented 0",
            got.len(),
            got2.len(),
            if recv_waited {
                " (the receive posted in ERR flushed on the next move to ERR)"
            } else {
                ""
            }
        ));
        assert_eq!(got.len() as u64, sends + recvs);
    }
}

/// RNR retry 0: a send to a peer with no receive fails at once with RNR_RETRY_EXC_ERR, and the
/// requests behind it are flushed; the peer sees nothing.
#[test]
fn rnr_retry_0_fails_at_once() {
    let mut p = pair_with_rnr_retry(0);
    let sge = [p.a.mr.sge(0, 64).unwrap()];
    let wrs: Vec<_> = (1..=3).map(|i| SendWr::new(i, SendOp::Send, &sge)).collect();
    let start = Instant::now();
    // SAFETY: the buffers named stay valid and unchanged until the completion.
    unsafe { p.a.qp.post_send(&wrs) }.unwrap();
    let got = poll_n(&mut p.a.cq, 3, 4);
    let took = start.elapsed();
    assert_eq!(
        got.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::RNR_RETRY_EXC_ERR),
            (2, WcStatus::WR_FLUSH_ERR),
            (3, WcStatus::WR_FLUSH_ERR)
        ]
    );
    assert_idle(&mut p.a.cq);
    assert_idle(&mut p.b.cq);
    assert_eq!(p.a.qp.query().unwrap().attr.state, Some(QpState::Err));
    figure(format_args!(
        "RNR retry 0: RNR_RETRY_EXC_ERR after {took:?}, the 2 behind it flushed"
    ));
}

/// RNR retry 7 (infinite): the send waits for as long as the peer has no receive, then
/// completes once one is posted, with its payload intact.
#[test]
fn rnr_retry_7_waits_for_a_receive() {
    let mut p = pair_with_rnr_retry(7);
    p.a.mr.bytes_mut()[..64].copy_from_slice(&[0x3c; 64]);
    let sge = [p.a.mr.sge(0, 64).unwrap()];
    // SAFETY: the buffers named stay valid and unchanged until the completion.
    unsafe { p.a.qp.post_send(&[SendWr::new(1, SendOp::Send, &sge)]) }.unwrap();
    let waited = Duration::from_secs(2);
    std::thread::sleep(waited);
    let mut wc = [WorkCompletion::default(); 2];
    assert_eq!(p.a.cq.poll(&mut wc), 0, "still retrying: {:?}", wc[0]);
    let rsge = [p.b.mr.sge(4096, 64).unwrap()];
    // SAFETY: the receive buffer stays valid and untouched until its completion.
    unsafe { p.b.qp.post_recv(&[RecvWr::new(9, &rsge)]) }.unwrap();
    let s = poll_n(&mut p.a.cq, 1, 1)[0];
    assert_eq!((s.wr_id, s.status), (1, WcStatus::SUCCESS), "{s:?}");
    let r = poll_n(&mut p.b.cq, 1, 1)[0];
    assert_eq!((r.wr_id, r.status, r.byte_len), (9, WcStatus::SUCCESS, 64), "{r:?}");
    assert!(p.b.mr.bytes()[4096..4160].iter().all(|&x| x == 0x3c));
    assert_idle(&mut p.a.cq);
    figure(format_args!(
        "RNR retry 7: the send waited {waited:?} without completing, then completed once a receive was posted"
    ));
}

/// A CQ shared by two QPs cannot be destroyed until both are gone: EBUSY, the CQ handed back
/// unchanged, every time; then it destroys cleanly.
#[test]
fn destroying_a_shared_cq_is_ebusy_until_every_qp_is_gone() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let other = ctx.create_cq(16).unwrap();
    let q1 = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &other)).unwrap();
    let q2 = pd.create_qp(&QpInit::new(QpType::Rc, &other, &cq)).unwrap();
    let handle = cq.handle();
    let busy = |cq: Cq| {
        let (cq, e) = cq.destroy().expect_err("in use");
        assert_eq!(e.errno(), Some(nix::errno::Errno::EBUSY), "{e}");
        assert!(matches!(e, Error::Kernel { verb: "DESTROY_CQ", .. }), "{e:?}");
        assert_eq!(cq.handle(), handle);
        cq
    };
    let cq = busy(cq);
    drop(q1);
    let cq = busy(cq); // still the receive CQ of q2
    drop(q2);
    cq.destroy().expect("no QP uses it any more");
    other.destroy().expect("no QP uses it any more");
}

/// Objects from two contexts cannot be mixed: a typed error before anything reaches the
/// kernel, and nothing left behind.
#[test]
fn mixing_contexts_is_a_typed_error() {
    let before = kernel_footprint();
    {
        let c1 = open_test_device();
        let c2 = open_test_device();
        let pd1 = c1.alloc_pd().unwrap();
        let cq1 = c1.create_cq(16).unwrap();
        let cq2 = c2.create_cq(16).unwrap();
        let pd2 = c2.alloc_pd().unwrap();
        let srq2 = pd2.create_srq(&SrqInit::new(16, 1)).unwrap();
        let inits = [
            QpInit::new(QpType::Rc, &cq2, &cq1),
            QpInit::new(QpType::Rc, &cq1, &cq2),
            QpInit {
                srq: Some(&srq2),
                ..QpInit::new(QpType::Rc, &cq1, &cq1)
            },
        ];
        for init in inits {
            match pd1.create_qp(&init) {
                Err(Error::InvalidArgument { verb: "CREATE_QP", .. }) => {}
                other => panic!("expected InvalidArgument, got {other:?}"),
            }
        }
        // The right combination still works.
        pd1.create_qp(&QpInit::new(QpType::Rc, &cq1, &cq1)).unwrap();
    }
    assert_eq!(kernel_footprint(), before);
}

/// A peer QP destroyed mid-stream: the survivor's next request fails with RETRY_EXC_ERR (the
/// destination QPN no longer exists), everything behind it flushes, and the survivor's CQ and
/// MR keep serving a new QP.
#[test]
fn destroyed_peer_gives_retry_exceeded_and_the_rest_keeps_working() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let path = loopback_path(&ctx);
    let mut cq = ctx.create_cq(64).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.alloc_remote_mr(1 << 16, access).unwrap();
    let connect = |qp: &mut Qp, peer: u32| {
        qp.to_init(1, access).unwrap();
        qp.to_rtr(path, peer, 0, Mtu::Mtu1024).unwrap();
        qp.modify(&QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0),
            timeout: Some(10), // 4 ms
            retry_cnt: Some(3),
            rnr_retry: Some(3),
            max_rd_atomic: Some(1),
            ..Default::default()
        })
        .unwrap();
    };
    let new_qp = |cq: &Cq| pd.create_qp(&QpInit::new(QpType::Rc, cq, cq)).unwrap();
    let (mut a, mut b) = (new_qp(&cq), new_qp(&cq));
    let (an, bn) = (a.qpn(), b.qpn());
    connect(&mut a, bn);
    connect(&mut b, an);
    let remote = Remote {
        addr: mr.addr() + 32768,
        rkey: mr.rkey(),
    };
    let sge = [mr.sge(0, 64).unwrap()];
    // SAFETY: the buffers named stay valid and unchanged until the completion.
    unsafe { a.post_send(&[SendWr::new(1, SendOp::RdmaWrite(remote), &sge)]) }.unwrap();
    assert_eq!(poll_n(&mut cq, 1, 1)[0].status, WcStatus::SUCCESS);
    drop(b);
    let wrs: Vec<_> = (2..=4)
        .map(|i| SendWr::new(i, SendOp::RdmaWrite(remote), &sge))
        .collect();
    // SAFETY: the buffers named stay valid and unchanged until the completion.
    unsafe { a.post_send(&wrs) }.unwrap();
    let got = poll_n(&mut cq, 3, 4);
    assert_eq!(
        got.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [
            (2, WcStatus::RETRY_EXC_ERR),
            (3, WcStatus::WR_FLUSH_ERR),
            (4, WcStatus::WR_FLUSH_ERR)
        ]
    );
    assert_idle(&mut cq);
    // A new QP on the same CQ, connected to itself, works.
    let mut c = new_qp(&cq);
    let cn = c.qpn();
    connect(&mut c, cn);
    // SAFETY: the buffers named stay valid and unchanged until the completion.
    unsafe { c.post_send(&[SendWr::new(5, SendOp::RdmaWrite(remote), &sge)]) }.unwrap();
    let done = poll_n(&mut cq, 1, 1)[0];
    assert_eq!((done.wr_id, done.status, done.qp_num), (5, WcStatus::SUCCESS, cn));
}
