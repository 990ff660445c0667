//! Completion queues: completion channels and events (blocking, non-blocking, solicited
//! only), in-place batches, resize keeping completions, and overrun reported as an event and
//! to a poller that reads no events.

mod common;

use common::*;
use std::os::fd::AsRawFd;
use std::time::Duration;
use uverbs::*;

fn write_n(p: &mut Pair, ids: std::ops::Range<u64>) {
    let sge = [p.a.mr.sge(0, 8).unwrap()];
    let remote = Remote {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey(),
    };
    let wrs: Vec<_> = ids.map(|i| SendWr::new(i, SendOp::RdmaWrite(remote), &sge)).collect();
    // SAFETY: the source buffer is not modified.
    unsafe { p.a.qp.post_send(&wrs) }.unwrap();
}

#[test]
fn completion_channel_wakes_a_waiter_once_per_request() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let channel = ctx.create_comp_channel().unwrap();
    assert!(channel.as_raw_fd() > 2);
    let mut cq = ctx
        .create_cq_with(&CqInit {
            channel: Some(&channel),
            ..CqInit::new(64)
        })
        .unwrap();
    let mut qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    // The peer shares the CQ; the writes it takes complete nothing there.
    let mut peer = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let mr = pd
        .alloc_remote_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let _cm = link::connect_qps(&ctx, &mut qp, &mut peer, AccessFlags::REMOTE_WRITE);
    let sge = [mr.sge(0, 8).unwrap()];
    let remote = Remote {
        addr: mr.addr() + 64,
        rkey: mr.rkey(),
    };

    assert_eq!(
        channel.get_event(Some(Duration::ZERO)).unwrap(),
        None,
        "nothing pending"
    );
    for round in 0..3u64 {
        cq.req_notify(false).unwrap();
        unsafe { qp.post_send(&[SendWr::new(round, SendOp::RdmaWrite(remote), &sge)]) }.unwrap();
        let ev = channel
            .get_event(Some(Duration::from_secs(10)))
            .unwrap()
            .expect("a completion event");
        assert_eq!(ev.cq_user_handle, cq.user_handle());
        assert_eq!(poll_n(&mut cq, 1, 4)[0].wr_id, round);
    }
    // Not re-armed: a completion raises no event.
    unsafe { qp.post_send(&[SendWr::new(9, SendOp::RdmaWrite(remote), &sge)]) }.unwrap();
    poll_n(&mut cq, 1, 1);
    assert_eq!(channel.get_event(Some(Duration::from_millis(200))).unwrap(), None);
}

#[test]
fn solicited_only_waits_for_a_solicited_receive() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let channel = ctx.create_comp_channel().unwrap();
    let mut scq = ctx.create_cq(64).unwrap();
    let mut rcq = ctx
        .create_cq_with(&CqInit {
            channel: Some(&channel),
            ..CqInit::new(64)
        })
        .unwrap();
    let mut tx = pd.create_qp(&QpInit::new(QpType::Rc, &scq, &scq)).unwrap();
    let mut rx = pd.create_qp(&QpInit::new(QpType::Rc, &scq, &rcq)).unwrap();
    let _cm = link::connect_qps(&ctx, &mut tx, &mut rx, AccessFlags::LOCAL_WRITE);
    let mr = pd.alloc_mr(4096, LocalAccess::LOCAL_WRITE).unwrap();
    for i in 0..4 {
        let sge = mr.sge(1024 + i * 64, 64).unwrap();
        unsafe { rx.post_recv(&[RecvWr::new(i as u64, &[sge])]) }.unwrap();
    }
    let sge = [mr.sge(0, 16).unwrap()];
    rcq.req_notify(true).unwrap();
    unsafe { tx.post_send(&[SendWr::new(1, SendOp::Send, &sge)]) }.unwrap();
    poll_n(&mut scq, 1, 1);
    assert_eq!(
        channel.get_event(Some(Duration::from_millis(300))).unwrap(),
        None,
        "unsolicited: no event"
    );
    let wr = SendWr::new(2, SendOp::Send, &sge).with(SendFlags::SOLICITED);
    unsafe { tx.post_send(&[wr]) }.unwrap();
    if driver(&ctx) == Driver::Siw {
        // siw's receive completion never passes the message's solicited flag to its notify
        // check (`siw_rqe_complete`): armed for solicited only, its CQ raises no event at all
        // (docs/kernel-facts.md).
        poll_n(&mut scq, 1, 1);
        assert_eq!(
            channel.get_event(Some(Duration::from_millis(300))).unwrap(),
            None,
            "siw: no event for a solicited receive either"
        );
        assert_eq!(poll_n(&mut rcq, 2, 4).len(), 2);
        return;
    }
    let ev = channel
        .get_event(Some(Duration::from_secs(10)))
        .unwrap()
        .expect("solicited event");
    assert_eq!(ev.cq_user_handle, rcq.user_handle());
    assert_eq!(poll_n(&mut rcq, 2, 4).len(), 2);
}

#[test]
fn batch_borrows_in_place_and_consumes_only_what_it_yielded() {
    let mut p = Pair::new();
    write_n(&mut p, 0..5);
    std::thread::sleep(Duration::from_millis(500));
    {
        let mut batch = p.a.cq.batch();
        assert_eq!(batch.len(), 5);
        for want in 0..3 {
            let wc = batch.next().unwrap();
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode),
                (want, WcStatus::SUCCESS, WcOpcode::RDMA_WRITE)
            );
        }
    }
    let rest = poll_n(&mut p.a.cq, 2, 8);
    assert_eq!(rest.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [3, 4]);
    assert!(p.a.cq.batch().next().is_none());
}

#[test]
fn resize_keeps_queued_completions() {
    let mut p = Pair::with(PairOpts {
        cq_depth: 16,
        ..Default::default()
    });
    let before = p.a.cq.capacity();
    write_n(&mut p, 0..10);
    std::thread::sleep(Duration::from_millis(500));
    if driver(&p.ctx) == Driver::Siw {
        // siw's CQs have a fixed size: refused before the kernel, the completions kept.
        match p.a.cq.resize(300) {
            Err(Error::Unsupported { verb: "RESIZE_CQ", .. }) => {}
            other => panic!("siw resized a CQ: {other:?}"),
        }
        assert_eq!(p.a.cq.capacity(), before);
        let ids: Vec<u64> = poll_n(&mut p.a.cq, 10, 64).iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, (0..10).collect::<Vec<_>>(), "queued completions kept, in order");
        return;
    }
    p.a.cq.resize(300).unwrap();
    assert!(
        p.a.cq.capacity() >= 300 && before < 300,
        "{before} -> {}",
        p.a.cq.capacity()
    );
    write_n(&mut p, 10..200);
    let ids: Vec<u64> = poll_n(&mut p.a.cq, 200, 64).iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..200).collect::<Vec<_>>(), "queued completions kept, in order");
    p.a.cq.resize(32).unwrap();
    write_n(&mut p, 200..210);
    assert_eq!(poll_n(&mut p.a.cq, 10, 16).len(), 10);
}

#[test]
fn overrun_is_reported_as_a_cq_error_event() {
    let mut p = Pair::with(PairOpts {
        cq_depth: 4,
        ..Default::default()
    });
    let cap = p.a.cq.capacity() as u64;
    assert!(!p.a.cq.overrun());
    write_n(&mut p, 0..cap + 4);
    let ev = p
        .ctx
        .get_async_event(Some(Duration::from_secs(10)))
        .unwrap()
        .expect("CQ error event");
    assert_eq!(
        ev,
        AsyncEvent {
            kind: AsyncEventKind::CQ_ERR,
            target: EventTarget::Cq(p.a.cq.user_handle())
        }
    );
    // Reading the event marked the CQ, and only that one: the poller sees it in `overrun`,
    // `check` and `req_notify`.
    assert!(p.a.cq.overrun() && !p.b.cq.overrun());
    let handle = p.a.cq.user_handle();
    assert!(matches!(p.a.cq.check(), Err(Error::CqOverrun { cq_user_handle }) if cq_user_handle == handle));
    assert!(matches!(p.a.cq.req_notify(false), Err(Error::CqOverrun { .. })));
    p.b.cq.check().unwrap();
    // What fit is still delivered, exactly once and in order.
    let got: Vec<u64> = poll_n(&mut p.a.cq, cap as usize, 8).iter().map(|c| c.wr_id).collect();
    assert_eq!(got, (0..cap).collect::<Vec<_>>());
}

/// Waits up to the test timeout for `ctx`'s async fd to be readable, reading nothing.
fn wait_for_async_event(ctx: &Context) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(ctx.async_fd(), PollFlags::POLLIN)];
    let n = poll(&mut fds, PollTimeout::try_from(TIMEOUT).unwrap()).unwrap();
    assert_eq!(n, 1, "an async event within {TIMEOUT:?}");
}

fn async_fd_readable(ctx: &Context) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(ctx.async_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).unwrap() == 1
}

/// A poller that never reads async events learns of the overrun from `try_poll`: the
/// completions that fit first, in order, then `CqOverrun`; the CQ_ERR events it read ahead
/// are still there for `get_async_event`, with the async fd readable until they are read.
#[test]
fn overrun_fails_the_checked_poll_of_a_poller_that_reads_no_events() {
    let mut p = Pair::with(PairOpts {
        cq_depth: 4,
        ..Default::default()
    });
    let (cap, total) = (p.a.cq.capacity() as usize, p.a.cq.capacity() as u64 + 4);
    let handle = p.a.cq.user_handle();
    write_n(&mut p, 0..total);
    // Only so that the overrun surely happened before the poll starts (a poller that drains
    // as fast as rxe completes would keep up): nothing is read.
    wait_for_async_event(&p.ctx);
    assert!(!p.a.cq.overrun(), "nobody has read the event");

    let mut wc = [WorkCompletion::default(); 3];
    let mut got = Vec::new();
    let start = std::time::Instant::now();
    let err = loop {
        match p.a.cq.try_poll(&mut wc) {
            Ok(n) => got.extend(wc[..n].iter().map(|c| c.wr_id)),
            Err(e) => break e,
        }
        assert!(start.elapsed() < TIMEOUT, "no overrun reported; got {got:?}");
    };
    assert!(
        matches!(err, Error::CqOverrun { cq_user_handle } if cq_user_handle == handle),
        "{err}"
    );
    // What fit, exactly once and in order; the ring holds the reported capacity (rxe) or,
    // on mlx5, one more (a ring of 2^n entries is reported as 2^n - 1).
    let mlx5 = driver(&p.ctx) == Driver::Mlx5;
    let fit = if mlx5 { cap + 1 } else { cap };
    assert!(
        got.len() >= fit && got[..fit] == (0..fit as u64).collect::<Vec<_>>()[..],
        "{got:?}"
    );
    assert!(p.a.cq.overrun() && !p.b.cq.overrun());
    assert!(
        matches!(p.a.cq.try_poll(&mut wc), Err(Error::CqOverrun { .. })),
        "every call after"
    );
    assert!(
        matches!(p.a.cq.try_reap(&mut wc), Err(Error::CqOverrun { .. })),
        "the safe posts' reap too"
    );
    assert!(matches!(p.a.cq.check(), Err(Error::CqOverrun { .. })));
    assert!(matches!(p.a.cq.req_notify(false), Err(Error::CqOverrun { .. })));
    assert_eq!(p.b.cq.try_poll(&mut wc).unwrap(), 0, "the other CQ is fine");
    p.b.cq.check().unwrap();

    // The events the checks read are the user's still: the fd says so and they come back in
    // order.
    assert!(async_fd_readable(&p.ctx));
    let mut events = Vec::new();
    while let Some(ev) = p.ctx.get_async_event(Some(Duration::from_millis(500))).unwrap() {
        events.push(ev);
    }
    let cq_err = AsyncEvent {
        kind: AsyncEventKind::CQ_ERR,
        target: EventTarget::Cq(handle),
    };
    assert!(!events.is_empty() && events.iter().all(|e| *e == cq_err), "{events:?}");
    assert!(!async_fd_readable(&p.ctx), "all read");
    // A completion that found room after the poll drained the ring would be there still
    // (rxe goes on after an overrun); `poll` reads it.
    let late = p.a.cq.poll(&mut wc);
    got.extend(wc[..late].iter().map(|c| c.wr_id));
    assert!(
        got.windows(2).all(|w| w[0] < w[1]) && got.iter().all(|&id| id < total),
        "{got:?}"
    );
    if mlx5 {
        // The CQ stopped at the overrun: one event, nothing after what fit.
        assert_eq!((events.len(), got.len()), (1, fit), "{got:?}");
    } else {
        // rxe raises one CQ_ERR per completion it drops.
        assert_eq!(events.len() + got.len(), total as usize, "{events:?} {got:?}");
    }
}

/// `for wc in &mut batch` reads the ready completions in place, several held at once, in
/// order, and consumes only those taken: batches that each take at most two see every
/// completion exactly once.
#[test]
fn a_batch_iterates_by_reference() {
    let mut p = Pair::new();
    write_n(&mut p, 0..10);
    let mut seen = Vec::new();
    let start = std::time::Instant::now();
    while seen.len() < 10 {
        let mut batch = p.a.cq.batch();
        let mut iter = &mut batch;
        let ready = iter.len();
        let two: Vec<&WorkCompletion> = iter.by_ref().take(2).collect();
        assert_eq!(two.len(), ready.min(2));
        assert_eq!(iter.len(), ready - two.len(), "the iterator goes on while they live");
        assert!(two
            .iter()
            .all(|wc| wc.status == WcStatus::SUCCESS && wc.opcode == WcOpcode::RDMA_WRITE));
        seen.extend(two.iter().map(|wc| wc.wr_id));
        drop(batch);
        assert!(start.elapsed() < TIMEOUT, "10 completions; saw {seen:?}");
    }
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    assert_eq!((&mut p.a.cq.batch()).count(), 0, "nothing more");
}
