//! Completions driven from an event loop (mio), with no busy polling: the completion channel's
//! fd and the context's async event fd are registered with `mio::Poll`; the thread sleeps in
//! `epoll_wait` until the device has news, drains the CQ, re-arms it, and goes back to sleep.
//!
//! Two RC QPs on one device exchange `ROUNDS` messages; every wakeup is counted and the
//! program fails if it ever woke without a completion to handle. Run it with
//! `cargo xtask guest -- target/debug/examples/event_loop` (or natively on an RDMA host).

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use std::os::fd::AsRawFd;
use std::time::Duration;
use uverbs::*;

const CQ_EVENTS: Token = Token(0);
const ASYNC_EVENTS: Token = Token(1);
const ROUNDS: u64 = 1000;

type DemoResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> DemoResult<()> {
    let ctx = open(std::env::args().nth(1).as_deref())?;
    let gid = ctx.roce_v2_gid(1)?;
    let pd = ctx.alloc_pd()?;
    let channel = ctx.create_comp_channel()?;
    let mut cq = ctx.create_cq_with(&CqInit {
        channel: Some(&channel),
        ..CqInit::new(64)
    })?;
    let (mut a, mut b) = (
        pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?,
        pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?,
    );
    let path = gid.route_to(gid.raw);
    let (an, bn) = (a.qpn(), b.qpn());
    for (qp, peer) in [(&mut a, bn), (&mut b, an)] {
        qp.to_init(1, AccessFlags::LOCAL_WRITE)?;
        qp.to_rtr(path, peer, 0, Mtu::Mtu1024)?;
        qp.to_rts(0)?;
    }
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
    let (send, recv) = ([mr.sge(0, 64)?], [mr.sge(2048, 64)?]);

    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut SourceFd(&channel.as_raw_fd()), CQ_EVENTS, Interest::READABLE)?;
    poll.registry().register(
        &mut SourceFd(&ctx.async_fd().as_raw_fd()),
        ASYNC_EVENTS,
        Interest::READABLE,
    )?;
    let mut events = Events::with_capacity(8);
    let mut wc = [WorkCompletion::default(); 16];

    let (mut round, mut wakeups, mut done) = (0u64, 0u64, 0u64);
    let post_round = |a: &mut Qp, b: &mut Qp, round: u64| -> Result<()> {
        // SAFETY: the buffers are not touched while the round is in flight.
        unsafe {
            b.post_recv(&[RecvWr::new(round, &recv)])?;
            a.post_send(&[SendWr::new(round, SendOp::Send, &send)])
        }
    };
    cq.req_notify(false)?;
    post_round(&mut a, &mut b, round)?;
    while done < 2 * ROUNDS {
        poll.poll(&mut events, Some(Duration::from_secs(10)))?;
        if events.is_empty() {
            return Err(format!("no event within 10 s after {done} completions").into());
        }
        for event in &events {
            wakeups += 1;
            match event.token() {
                CQ_EVENTS => {
                    // Drain the channel (edge-triggered), re-arm, then drain the CQ: a
                    // completion arriving between the last poll and the re-arm still raises
                    // an event because the arm comes first.
                    while channel.get_event(Some(Duration::ZERO))?.is_some() {}
                    cq.req_notify(false)?;
                    loop {
                        let n = cq.poll(&mut wc);
                        if n == 0 {
                            break;
                        }
                        if let Some(c) = wc[..n].iter().find(|c| !c.is_success()) {
                            return Err(format!("completion failed: {c:?}").into());
                        }
                        done += n as u64;
                    }
                    // A round ends with both its send and its receive; start the next one
                    // and go back to sleep.
                    if done == 2 * (round + 1) && round + 1 < ROUNDS {
                        round += 1;
                        post_round(&mut a, &mut b, round)?;
                    }
                }
                ASYNC_EVENTS => {
                    if let Some(e) = ctx.get_async_event(Some(Duration::ZERO))? {
                        return Err(format!("unexpected async event {e:?}").into());
                    }
                }
                _ => unreachable!("only two tokens are registered"),
            }
        }
    }
    println!(
        "event loop: {ROUNDS} send/receive rounds, {done} completions, {wakeups} wakeups ({:.2} completions per wakeup), no busy polling",
        done as f64 / wakeups as f64
    );
    Ok(())
}
