//! Shared receive queues: two QPs consuming one SRQ, the limit event, query, resize, and the
//! last-WQE-reached event when an SRQ-attached QP goes to the error state.

mod common;

use common::srq::{setup, Setup};
use common::*;
use std::time::Duration;
use uverbs::*;

fn post_srq(s: &mut Setup, ids: std::ops::Range<u64>) {
    for i in ids {
        let sge = s.mr.sge(65536 + (i as usize % 512) * 256, 256).unwrap();
        // SAFETY: buffers are read only after their completions.
        unsafe { s.srq.post_recv(&[RecvWr::new(i, &[sge])]) }.expect("post_srq_recv");
    }
}

fn send(s: &mut Setup, qp: usize, wr_id: u64) {
    let off = (wr_id as usize % 64) * 64;
    s.mr.as_mut_slice()[off..off + 64].fill(wr_id as u8);
    let sge = [s.mr.sge(off, 64).unwrap()];
    unsafe { s.senders[qp].post_send(&[SendWr::new(wr_id, SendOp::Send, &sge)]) }.unwrap();
    let c = poll_n(&mut s.send_cq, 1, 1)[0];
    assert_eq!((c.wr_id, c.status), (wr_id, WcStatus::SUCCESS), "{c:?}");
}

#[test]
fn two_qps_share_one_srq() {
    let mut s = setup(64);
    assert!(s.srq.max_wr() >= 64);
    post_srq(&mut s, 0..40);
    for i in 0..40 {
        send(&mut s, (i % 2) as usize, 1000 + i);
    }
    let wcs = poll_n(&mut s.recv_cq, 40, 16);
    let mut per_qp = [0; 2];
    let mut ids: Vec<u64> = Vec::new();
    for c in &wcs {
        assert_eq!(
            (c.status, c.opcode, c.byte_len),
            (WcStatus::SUCCESS, WcOpcode::RECV, 64),
            "{c:?}"
        );
        let which = s
            .receivers
            .iter()
            .position(|q| q.qpn() == c.qp_num)
            .expect("a receiving QP");
        per_qp[which] += 1;
        ids.push(c.wr_id);
        let off = 65536 + (c.wr_id as usize % 512) * 256;
        let first = s.mr.as_slice()[off];
        assert!(s.mr.as_slice()[off..off + 64].iter().all(|&b| b == first));
    }
    assert_eq!(per_qp, [20, 20]);
    ids.sort();
    assert_eq!(ids, (0..40).collect::<Vec<_>>(), "each SRQ receive used once");
    assert_idle(&mut s.recv_cq);
}

#[test]
fn limit_event_fires_once_when_the_srq_runs_low() {
    let mut s = setup(64);
    post_srq(&mut s, 0..15);
    s.srq.arm_limit(10).unwrap();
    assert_eq!(s.srq.query().unwrap().srq_limit, 10);
    for i in 0..6 {
        send(&mut s, 0, i);
    }
    poll_n(&mut s.recv_cq, 6, 8);
    let ev = s
        .ctx
        .get_async_event(Some(Duration::from_secs(10)))
        .unwrap()
        .expect("SRQ limit event");
    assert_eq!(
        (ev.kind, ev.target),
        (AsyncEventKind::SRQ_LIMIT_REACHED, EventTarget::Srq(s.srq.user_handle()))
    );
    // siw's QUERY_SRQ reports the limit it was armed with, fired or not (`siw_query_srq`);
    // rxe and mlx5 report 0 once it fired.
    let limit = match driver(&s.ctx) {
        Driver::Siw => 10,
        Driver::Rxe | Driver::Mlx5 => 0,
    };
    assert_eq!(
        s.srq.query().unwrap().srq_limit,
        limit,
        "the limit QUERY_SRQ reports after the event"
    );
    assert_eq!(s.ctx.get_async_event(Some(Duration::ZERO)).unwrap(), None, "fired once");
    // Explicit destroy: refused while QPs use the SRQ; afterwards the kernel reports the one
    // async event it delivered for it.
    let Setup { srq, receivers, .. } = s;
    let (srq, err) = srq.destroy().expect_err("QPs still use the SRQ");
    assert_eq!(err.errno(), Some(nix::errno::Errno::EBUSY), "{err}");
    for qp in receivers {
        assert_eq!(qp.destroy().expect("destroy QP").r#async, 0);
    }
    assert_eq!(
        srq.destroy().expect("destroy SRQ"),
        EventsReported { comp: 0, r#async: 1 }
    );
}

#[test]
fn resize_keeps_posted_receives() {
    let mut s = setup(16);
    post_srq(&mut s, 0..10);
    let resized = s.srq.resize(200);
    if matches!(driver(&s.ctx), Driver::Mlx5 | Driver::Siw) {
        // mlx5_ib has no SRQ resize (hw/mlx5/srq.c mlx5_ib_modify_srq: EINVAL for
        // IB_SRQ_MAX_WR), siw's SRQ ring has a fixed size; the providers say so before the
        // kernel.
        assert!(matches!(resized, Err(Error::Unsupported { .. })), "{resized:?}");
        return;
    }
    resized.unwrap();
    assert!(s.srq.max_wr() >= 200, "granted {}", s.srq.max_wr());
    post_srq(&mut s, 10..150);
    for i in 0..150 {
        send(&mut s, (i % 2) as usize, i);
    }
    let mut ids: Vec<u64> = poll_n(&mut s.recv_cq, 150, 32).iter().map(|c| c.wr_id).collect();
    ids.sort();
    assert_eq!(ids, (0..150).collect::<Vec<_>>());
}

#[test]
fn qp_on_srq_moved_to_error_flushes_nothing_of_the_srq() {
    let mut s = setup(16);
    post_srq(&mut s, 0..4);
    s.receivers[1]
        .modify(&QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        })
        .unwrap();
    // The SRQ's receives belong to no QP: none is flushed, and the other QP still uses them.
    // rxe in Linux 6.1 raises no LAST_WQE_REACHED event here (the driver has no code for
    // it); 6.12 raises it for the QP (docs/kernel-facts.md, "Between kernels").
    assert_idle(&mut s.recv_cq);
    send(&mut s, 0, 9);
    let c = poll_n(&mut s.recv_cq, 1, 1)[0];
    assert_eq!((c.status, c.qp_num), (WcStatus::SUCCESS, s.receivers[0].qpn()));
    if driver(&s.ctx) == Driver::Rxe && common::kernel::rxe_raises_last_wqe_reached() {
        let ev = s.ctx.get_async_event(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(
            ev,
            Some(AsyncEvent {
                kind: AsyncEventKind::QP_LAST_WQE_REACHED,
                target: EventTarget::Qp(s.receivers[1].user_handle()),
            }),
            "{}",
            common::kernel::release()
        );
    }
    assert_eq!(s.ctx.get_async_event(Some(Duration::from_millis(200))).unwrap(), None);
    let _ = &s.pd;
}
