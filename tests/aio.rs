//! The tokio integration (`uverbs::aio`): completions awaited through the completion channel
//! with no busy waking, cancellation losing nothing, async events as a stream.

mod common;

use common::*;
use futures_core::Stream;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uverbs::aio::{AsyncCq, AsyncEvents};
use uverbs::*;

/// Two connected RC QPs; `a` completes into an awaitable CQ.
struct AsyncPair {
    a: Qp,
    acq: AsyncCq,
    mr: RemoteMr,
    remote: Remote,
    _b: Qp,
    _bcq: Cq,
    _pd: Pd,
    ctx: Context,
}

fn async_pair() -> AsyncPair {
    async_pair_of(1024)
}

/// [`async_pair`] with an awaitable CQ of `cqe` entries.
fn async_pair_of(cqe: u32) -> AsyncPair {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let channel = ctx.create_comp_channel().unwrap();
    let mut init = CqInit::new(cqe);
    init.channel = Some(&channel);
    let acq = ctx.create_cq_with(&init).unwrap();
    let bcq = ctx.create_cq(16).unwrap();
    let mut a = pd.create_qp(&QpInit::new(QpType::Rc, &acq, &acq)).unwrap();
    let mut b = pd.create_qp(&QpInit::new(QpType::Rc, &bcq, &bcq)).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.alloc_remote_mr(4096, access).unwrap();
    let path = loopback_path(&ctx);
    let (an, bn) = (a.qpn(), b.qpn());
    for (qp, peer) in [(&mut a, bn), (&mut b, an)] {
        qp.to_init(1, access).unwrap();
        qp.to_rtr(path, peer, 0, Mtu::Mtu1024).unwrap();
        qp.to_rts(0).unwrap();
    }
    let remote = Remote {
        addr: mr.addr() + 2048,
        rkey: mr.rkey(),
    };
    AsyncPair {
        a,
        acq: AsyncCq::new(acq, &channel).unwrap(),
        mr,
        remote,
        _b: b,
        _bcq: bcq,
        _pd: pd,
        ctx,
    }
}

impl AsyncPair {
    /// Posts signaled 8-byte writes `ids`, one doorbell.
    fn write(&mut self, ids: std::ops::Range<u64>) {
        let sge = [self.mr.sge(0, 8).unwrap()];
        let wrs: Vec<_> = ids
            .map(|id| SendWr::new(id, SendOp::RdmaWrite(self.remote), &sge))
            .collect();
        // SAFETY: the MR outlives the requests and is not touched while they are in flight.
        unsafe { self.a.post_send(&wrs) }.unwrap();
    }
}

/// Receives completing on `a`'s awaitable CQ while another thread sends them from `b`: the
/// task sleeps on the channel whenever it is ahead (rxe completes a send inside its doorbell
/// write, so only completions made by another thread make the task wait).
#[test]
fn a_hundred_thousand_completions_awaited_without_busy_waking() {
    const N: u64 = 100_000;
    const DEPTH: u64 = 128;
    let rt = runtime();
    rt.block_on(async {
        let p = async_pair();
        let AsyncPair {
            mut a,
            mut acq,
            mr,
            _b: mut b,
            _bcq: mut bcq,
            ..
        } = p;
        let posted = Arc::new(AtomicU64::new(0));
        let sender = {
            let (posted, mr) = (posted.clone(), mr.sge(0, 8).unwrap());
            std::thread::spawn(move || {
                let sge = [mr];
                for id in 0..N {
                    while posted.load(Ordering::Acquire) <= id {
                        std::thread::yield_now();
                    }
                    // SAFETY: the MR outlives the sends, which only read it.
                    unsafe { b.post_send(&[SendWr::new(id, SendOp::Send, &sge)]) }.unwrap();
                    let c = poll_n(&mut bcq, 1, 1)[0];
                    assert!(c.is_success(), "{c:?}");
                }
            })
        };
        let recv = [mr.sge(1024, 64).unwrap()];
        let post_recvs = |a: &mut Qp, from: u64, to: u64| {
            let wrs: Vec<_> = (from..to).map(|id| RecvWr::new(id, &recv)).collect();
            // SAFETY: the MR outlives the receives; nothing reads the landing area.
            unsafe { a.post_recv(&wrs) }.unwrap();
            posted.store(to, Ordering::Release);
        };
        post_recvs(&mut a, 0, DEPTH);
        let (mut done, mut wc) = (0u64, [WorkCompletion::default(); 32]);
        while done < N {
            let n = tokio::time::timeout(TIMEOUT, acq.poll(&mut wc))
                .await
                .unwrap_or_else(|_| panic!("no completion within {TIMEOUT:?} after {done}"))
                .unwrap();
            for c in &wc[..n] {
                assert!(c.is_success(), "{c:?}");
                assert_eq!((c.wr_id, c.opcode), (done, WcOpcode::RECV), "in order, each once");
                done += 1;
            }
            let have = posted.load(Ordering::Relaxed);
            if have < N && have - done < DEPTH / 2 {
                post_recvs(&mut a, have, (done + DEPTH).min(N));
            }
        }
        sender.join().unwrap();
        let stats = acq.stats();
        println!("aio: {N} completions awaited, {stats:?}");
        assert!(stats.events > 0, "it slept on the channel: {stats:?}");
        assert!(
            stats.wakeups <= stats.events + 4,
            "a wake-up per completion event, no busy waking: {stats:?}"
        );
        assert_eq!(acq.get_mut().poll(&mut wc), 0, "nothing left over");
    });
}

#[test]
fn a_dropped_wait_loses_no_completion() {
    let rt = runtime();
    rt.block_on(async {
        let mut p = async_pair();
        let mut wc = [WorkCompletion::default(); 4];
        // A wait cancelled while the CQ is armed and empty ...
        let short = tokio::time::timeout(Duration::from_millis(20), p.acq.poll(&mut wc)).await;
        assert!(short.is_err(), "nothing to complete yet");
        // ... leaves the next wait to see what arrives afterwards.
        p.write(0..3);
        let mut seen = Vec::new();
        while seen.len() < 3 {
            let n = tokio::time::timeout(TIMEOUT, p.acq.poll(&mut wc[..1]))
                .await
                .expect("completions after a cancelled wait")
                .unwrap();
            seen.extend(wc[..n].iter().map(|c| c.wr_id));
        }
        assert_eq!(seen, [0, 1, 2]);
        // A wait dropped before it was ever polled takes nothing either.
        p.write(3..4);
        drop(p.acq.poll(&mut wc));
        let n = tokio::time::timeout(TIMEOUT, p.acq.poll(&mut wc))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((n, wc[0].wr_id), (1, 3));
    });
}

#[test]
fn async_events_arrive_as_a_stream() {
    let rt = runtime();
    rt.block_on(async {
        let mut p = async_pair();
        let mut events = AsyncEvents::new(&p.ctx).unwrap();
        let sqd = p.a.modify(&QpAttr {
            state: Some(QpState::Sqd),
            en_sqd_async_notify: Some(true),
            ..Default::default()
        });
        // mlx5 (Linux 6.1 hw/mlx5/qp.c:4289) has no RTS -> SQD command: EINVAL, no event.
        if driver(&p.ctx) == Driver::Mlx5 {
            assert_eq!(sqd.unwrap_err().errno(), Some(nix::errno::Errno::EINVAL));
            return;
        }
        sqd.unwrap();
        let next = std::future::poll_fn(|cx| Pin::new(&mut events).poll_next(cx));
        let event = tokio::time::timeout(TIMEOUT, next)
            .await
            .expect("an event within the timeout")
            .expect("the stream goes on")
            .unwrap();
        assert_eq!(
            (event.kind, event.target),
            (AsyncEventKind::SQ_DRAINED, EventTarget::Qp(p.a.user_handle()))
        );
    });
}

#[test]
fn outside_a_runtime_is_an_error_not_a_panic() {
    let ctx = open_test_device();
    let channel = ctx.create_comp_channel().unwrap();
    let mut init = CqInit::new(16);
    init.channel = Some(&channel);
    let cq = ctx.create_cq_with(&init).unwrap();
    let err = AsyncCq::new(cq, &channel).unwrap_err();
    assert!(err.to_string().contains("outside a tokio runtime"), "{err}");
    let err = AsyncEvents::new(&ctx).unwrap_err();
    assert!(err.to_string().contains("outside a tokio runtime"), "{err}");
}

/// An overrun ends the wait with `CqOverrun` once what fit has been returned, though nobody
/// reads async events; the CQ_ERR still arrives on the stream afterwards.
#[test]
fn an_overrun_ends_the_wait_with_an_error() {
    let rt = runtime();
    rt.block_on(async {
        let mut p = async_pair_of(4);
        let cap = p.acq.get_mut().capacity() as u64;
        p.write(0..cap + 4);
        // Only so that the overrun surely happened before the wait starts; nothing is read.
        let mut fds = [nix::poll::PollFd::new(p.ctx.async_fd(), nix::poll::PollFlags::POLLIN)];
        let timeout = nix::poll::PollTimeout::try_from(TIMEOUT).unwrap();
        assert_eq!(nix::poll::poll(&mut fds, timeout).unwrap(), 1, "an async event");
        let mut wc = [WorkCompletion::default(); 2];
        let mut got = 0u64;
        let err = loop {
            match tokio::time::timeout(TIMEOUT, p.acq.poll(&mut wc))
                .await
                .expect("no endless wait")
            {
                Ok(n) => {
                    for c in &wc[..n] {
                        assert_eq!(c.wr_id, got, "in order, once");
                        got += 1;
                    }
                }
                Err(e) => break e,
            }
        };
        assert!(matches!(err, Error::CqOverrun { .. }), "{err}");
        assert!((cap..cap + 4).contains(&got), "what fit: {got} of {}", cap + 4);
        let mut events = AsyncEvents::new(&p.ctx).unwrap();
        let next = std::future::poll_fn(|cx| Pin::new(&mut events).poll_next(cx));
        let event = tokio::time::timeout(TIMEOUT, next).await.expect("the event is kept");
        let event = event.expect("the stream goes on").unwrap();
        let handle = p.acq.get_mut().user_handle();
        assert_eq!(
            (event.kind, event.target),
            (AsyncEventKind::CQ_ERR, EventTarget::Cq(handle))
        );
    });
}

/// Safe posts awaited with `AsyncCq::reap`: every completion gives its buffer back to the QP,
/// each exactly once, and nothing is left held.
#[test]
fn reaped_completions_give_the_safe_posts_buffers_back() {
    const N: usize = 1000;
    let rt = runtime();
    rt.block_on(async {
        let mut p = async_pair();
        let region = p._pd.alloc_mr(32 * 8, LocalAccess::LOCAL_WRITE).unwrap();
        let mut bufs = region.into_bufs(8).unwrap();
        let total = bufs.len();
        let (mut sent, mut back) = (0, 0);
        let mut wc = [WorkCompletion::default(); 16];
        while back < N {
            while sent < N {
                let Some(mut buf) = bufs.pop() else { break };
                buf.fill_from(&(sent as u64).to_le_bytes()).unwrap();
                p.a.send_buf(SendOp::RdmaWrite(p.remote), buf)
                    .map_err(|r| r.error)
                    .unwrap();
                sent += 1;
            }
            let reaped = tokio::time::timeout(TIMEOUT, p.acq.reap(&mut wc))
                .await
                .unwrap_or_else(|_| panic!("no completion within {TIMEOUT:?} after {back}"))
                .unwrap();
            assert!(!reaped.is_empty(), "a wait returns completions");
            for c in reaped.iter() {
                assert!(c.is_success(), "{c:?}");
            }
            let got = p.a.reclaim_all(&reaped, &mut bufs);
            assert_eq!(got, reaped.len(), "one buffer per signaled completion");
            back += got;
        }
        assert_eq!((sent, back, bufs.len()), (N, N, total));
        assert_eq!(p.a.held_bufs(), (0, 0));
        assert_eq!(p.acq.get_mut().poll(&mut wc), 0, "nothing left over");
    });
}

/// `Context::create_async_cq` in one call: the QP is created on the awaitable CQ itself, and
/// two such CQs of one context each wake for their own completions only (each has a channel
/// of its own). Outside a runtime it is an error, and a channel of the caller's is refused.
#[test]
fn a_one_call_async_cq_takes_its_qp_directly() {
    let ctx = open_test_device();
    let err = ctx.create_async_cq(16).unwrap_err();
    assert!(err.to_string().contains("outside a tokio runtime"), "{err}");
    let rt = runtime();
    rt.block_on(async {
        let channel = ctx.create_comp_channel().unwrap();
        let mut init = CqInit::new(16);
        init.channel = Some(&channel);
        let err = ctx.create_async_cq_with(&init).unwrap_err();
        assert!(err.to_string().contains("channel of its own"), "{err}");

        let pd = ctx.alloc_pd().unwrap();
        let (mut acq, mut bcq) = (ctx.create_async_cq(64).unwrap(), ctx.create_async_cq(64).unwrap());
        let mut a = pd.create_qp(&QpInit::new(QpType::Rc, &acq, &acq)).unwrap();
        let mut b = pd.create_qp(&QpInit::new(QpType::Rc, &bcq, &bcq)).unwrap();
        let path = loopback_path(&ctx);
        let (an, bn) = (a.qpn(), b.qpn());
        for (qp, peer) in [(&mut a, bn), (&mut b, an)] {
            qp.to_init(1, AccessFlags::LOCAL_WRITE).unwrap();
            qp.to_rtr(path, peer, 0, Mtu::Mtu1024).unwrap();
            qp.to_rts(0).unwrap();
        }
        let mut bufs = pd
            .alloc_mr(4 * 64, LocalAccess::LOCAL_WRITE)
            .unwrap()
            .into_bufs(64)
            .unwrap();
        b.recv_buf(bufs.pop().unwrap()).unwrap();
        let mut msg = bufs.pop().unwrap();
        msg.fill_from(b"one call").unwrap();
        a.send_buf(SendOp::Send, msg).unwrap();
        let mut wc = [WorkCompletion::default(); 4];
        for (cq, qp, recv) in [(&mut bcq, &mut b, true), (&mut acq, &mut a, false)] {
            let reaped = tokio::time::timeout(TIMEOUT, cq.reap(&mut wc))
                .await
                .expect("a completion on this CQ's own channel")
                .unwrap();
            assert_eq!(reaped.len(), 1, "only this CQ's completion");
            let c = reaped.iter().next().unwrap();
            assert!(c.is_success(), "{c:?}");
            let buf = qp.reclaim(c).unwrap();
            if recv {
                assert_eq!(buf.as_slice(), b"one call");
            }
        }
        assert_eq!((a.held_bufs(), b.held_bufs()), ((0, 0), (0, 0)));
    });
}
