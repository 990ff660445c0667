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

/// One round: B receives into `inbox`, A sends 64 bytes of `msg`; both buffers go to the QPs.
fn post_round(a: &mut Qp, b: &mut Qp, msg: &mut Option<Buf>, inbox: &mut Option<Buf>) -> DemoResult<()> {
    b.recv_buf(inbox.take().ok_or("the receive buffer is back")?)?;
    let mut m = msg.take().ok_or("the send buffer is back")?;
    m.set_len(64)?;
    a.send_buf(SendOp::Send, m)?;
    Ok(())
}

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
    // Two buffers, lent to the QPs for each round and given back by its completions.
    let mut bufs = pd.alloc_mr(4096, LocalAccess::LOCAL_WRITE)?.into_bufs(2048)?;
    let (mut inbox, mut msg) = (bufs.pop(), bufs.pop());

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
    cq.req_notify(false)?;
    post_round(&mut a, &mut b, &mut msg, &mut inbox)?;
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
                        let reaped = cq.reap(&mut wc);
                        if reaped.is_empty() {
                            break;
                        }
                        for c in reaped.iter() {
                            c.result()?;
                            // Each completion gives its request's buffer back.
                            msg = msg.or(a.reclaim(c));
                            inbox = inbox.or(b.reclaim(c));
                            done += 1;
                        }
                    }
                    // A round ends with both its send and its receive; start the next one
                    // and go back to sleep.
                    if done == 2 * (round + 1) && round + 1 < ROUNDS {
                        round += 1;
                        post_round(&mut a, &mut b, &mut msg, &mut inbox)?;
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
