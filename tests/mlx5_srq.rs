//! SRQs on an mlx5 device (the model: `cargo xtask mlx5 -- <this test binary>`; or ConnectX
//! hardware): WQEs going round the provider's free list, the limit event, a QP scrubbed on
//! destroy giving its SRQ WQEs back, and what mlx5 refuses. Addresses by LID on InfiniBand,
//! by GID on RoCE.
//! What it expects is mlx5's (no resize; sizes as the mlx5 driver rounds them), so
//! `cargo xtask mlx5 --step` runs it and the rxe guest leaves it out (`tests/mlx5_*.rs`).

mod common;

use common::srq::{setup, Setup};
use nix::errno::Errno;
use std::time::{Duration, Instant};
use uverbs::*;

const TIMEOUT: Duration = Duration::from_secs(20);

/// Where receive `wr_id` lands.
fn slot(wr_id: u64) -> usize {
    65536 + (wr_id as usize % 1024) * 128
}

fn post_srq(s: &mut Setup, ids: std::ops::Range<u64>) -> Result<()> {
    for i in ids {
        let sge = s.mr.sge(slot(i), 128).unwrap();
        // SAFETY: buffers are read only after their completions.
        unsafe { s.srq.post_recv(&[RecvWr::new(i, &[sge])]) }?;
    }
    Ok(())
}

/// Sends 64 bytes of `wr_id as u8` from sender `qp` and waits for the send completion.
fn send(s: &mut Setup, qp: usize, wr_id: u64) {
    let off = (wr_id as usize % 64) * 64;
    s.mr.as_mut_slice()[off..off + 64].fill(wr_id as u8);
    let sge = [s.mr.sge(off, 64).unwrap()];
    // SAFETY: the buffer is not touched until the completion below.
    unsafe { s.senders[qp].post_send(&[SendWr::new(wr_id, SendOp::Send, &sge)]) }.unwrap();
    let c = poll_n(&mut s.send_cq, 1)[0];
    assert_eq!((c.wr_id, c.status), (wr_id, WcStatus::SUCCESS), "{c:?}");
}

fn poll_n(cq: &mut Cq, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 16];
    let start = Instant::now();
    while out.len() < n {
        let want = wc.len().min(n - out.len());
        let got = cq.poll(&mut wc[..want]);
        out.extend_from_slice(&wc[..got]);
        assert!(start.elapsed() < TIMEOUT, "{} of {n} completions: {out:#?}", out.len());
    }
    out
}

fn assert_idle(cq: &mut Cq) {
    std::thread::sleep(Duration::from_millis(50));
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut wc), 0, "{:?}", &wc[..1]);
}

/// Every round fills the SRQ (one more is refused), then both QPs consume it: each WQE
/// goes back to the free list when its completion is polled, or the next round could not
/// fill the SRQ again.
#[test]
fn wqes_go_round_the_free_list_for_two_qps() {
    let mut s = setup(15);
    let cap = u64::from(s.srq.max_wr());
    assert_eq!(cap, 15, "roundup_pow_of_two(15 + 1) WQEs, one never posted");
    for round in 0..5u64 {
        let ids = round * 100..round * 100 + cap;
        post_srq(&mut s, ids.clone()).expect("a full SRQ's worth");
        match post_srq(&mut s, 0..1) {
            Err(Error::WorkRequest {
                reason: WrReject::QueueFull,
                ..
            }) => {}
            other => panic!("round {round}: one more than max_wr: {other:?}"),
        }
        for (k, id) in ids.clone().enumerate() {
            send(&mut s, k % 2, id);
        }
        let mut got = Vec::new();
        for c in poll_n(&mut s.recv_cq, cap as usize) {
            assert_eq!(
                (c.status, c.opcode, c.byte_len),
                (WcStatus::SUCCESS, WcOpcode::RECV, 64),
                "{c:?}"
            );
            let qp = s.receivers.iter().position(|q| q.qpn() == c.qp_num);
            assert!(qp.is_some(), "{c:?}");
            let at = slot(c.wr_id);
            assert!(s.mr.as_slice()[at..at + 64].iter().all(|&b| b == c.wr_id as u8));
            got.push(c.wr_id);
        }
        got.sort();
        assert_eq!(got, ids.collect::<Vec<_>>(), "round {round}: each receive once");
    }
    assert_idle(&mut s.recv_cq);
}

#[test]
fn limit_event_fires_once_when_the_srq_runs_low() {
    let mut s = setup(31);
    post_srq(&mut s, 0..15).unwrap();
    s.srq.arm_limit(10).unwrap();
    assert_eq!(s.srq.query().unwrap().srq_limit, 10);
    for i in 0..6 {
        send(&mut s, (i % 2) as usize, i);
    }
    poll_n(&mut s.recv_cq, 6);
    let ev = s.ctx.get_async_event(Some(TIMEOUT)).unwrap().expect("SRQ limit event");
    assert_eq!(
        (ev.kind, ev.target),
        (AsyncEventKind::SRQ_LIMIT_REACHED, EventTarget::Srq(s.srq.user_handle()))
    );
    assert_eq!(s.srq.query().unwrap().srq_limit, 0, "disarmed after firing");
    assert_eq!(s.ctx.get_async_event(Some(Duration::ZERO)).unwrap(), None, "fired once");
    // mlx5 cannot resize an SRQ (6.1's mlx5_ib_modify_srq: EINVAL): the provider says so.
    assert!(matches!(s.srq.resize(64), Err(Error::Unsupported { .. })));
    let Setup { srq, receivers, .. } = s;
    let (srq, err) = srq.destroy().expect_err("QPs still use the SRQ");
    assert_eq!(err.errno(), Some(Errno::EBUSY), "{err}");
    for qp in receivers {
        qp.destroy().expect("destroy QP");
    }
    assert_eq!(
        srq.destroy().expect("destroy SRQ"),
        EventsReported { comp: 0, r#async: 1 }
    );
}

/// A QP on the SRQ moved to ERR flushes nothing of it. A QP destroyed with a receive
/// completion still queued: the provider scrubs the CQE and the SRQ WQE goes back to the
/// free list (else the SRQ could not be filled again).
#[test]
fn error_flushes_nothing_and_destroy_returns_the_scrubbed_wqes() {
    let mut s = setup(7);
    post_srq(&mut s, 0..7).unwrap();
    s.receivers[1]
        .modify(&QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        })
        .unwrap();
    assert_idle(&mut s.recv_cq);
    // Three receives through QP 0, left unpolled; QP 0 is destroyed.
    for i in 0..3 {
        send(&mut s, 0, i);
    }
    std::thread::sleep(Duration::from_millis(100));
    let rx0 = s.receivers.remove(0);
    let tx0 = s.senders.remove(0);
    rx0.destroy().expect("destroy QP");
    drop(tx0);
    assert_idle(&mut s.recv_cq);
    // The 3 scrubbed WQEs are free again: 3 more fit, then the SRQ is full.
    post_srq(&mut s, 10..13).expect("the scrubbed WQEs are free");
    assert!(matches!(
        post_srq(&mut s, 13..14),
        Err(Error::WorkRequest {
            reason: WrReject::QueueFull,
            ..
        })
    ));
}

#[test]
fn a_qp_on_an_srq_takes_no_receives_of_its_own() {
    let mut s = setup(7);
    let sge = [s.mr.sge(0, 8).unwrap()];
    // SAFETY: refused before anything is written.
    let r = unsafe { s.receivers[0].post_recv(&[RecvWr::new(1, &sge)]) };
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
}
