//! The safe posting API (`Qp::send_buf`, `send_inline`, `recv_buf`, `reclaim`) on a real
//! device: 100,000 sends with every buffer back and every completion counted, reads, writes
//! and atomics through owned buffers, flush completions giving buffers back, completions
//! given back only to the queue they belong to, and remotely writable memory reached only by
//! copies.

mod common;
mod figures;

use common::*;
use figures::figure;
use std::time::Instant;
use uverbs::*;

const MSG: usize = 64;

/// Message `seq`: its number, then its low byte repeated.
fn message(seq: u64) -> [u8; MSG] {
    let mut m = [seq as u8; MSG];
    m[..8].copy_from_slice(&seq.to_le_bytes());
    m
}

/// Local buffers of `size` bytes from a fresh region of `count` of them.
fn bufs(pd: &Pd, count: usize, size: usize) -> Vec<Buf> {
    let mr = pd.alloc_mr(count * size, LocalAccess::LOCAL_WRITE).unwrap();
    mr.into_bufs(size).unwrap()
}

#[test]
fn hundred_thousand_safe_sends_give_every_buffer_and_completion_back() {
    const N: u64 = 100_000;
    const SENDS: usize = 64;
    const RECVS: usize = 128;
    let mut p = Pair::new();
    let mut send_pool = bufs(&p.pd, SENDS, MSG);
    for b in bufs(&p.pd, RECVS, MSG) {
        p.b.qp.recv_buf(b).unwrap();
    }
    assert_eq!(p.b.qp.held_bufs(), (0, RECVS));
    let mut wc = [WorkCompletion::default(); 32];
    let (mut sent, mut signaled, mut inline) = (0u64, 0u64, 0u64);
    let (mut send_completions, mut sends_back, mut received) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    while received < N {
        // Keep at most RECVS messages ahead of the receiver, and stop when the pool is empty.
        while sent < N && sent < received + RECVS as u64 {
            // Every 10th message inline from a plain slice; every 4th unsignaled (its buffer
            // comes back with a later completion), except the last, which must be signaled.
            let unsignaled = sent % 4 == 3 && sent != N - 1;
            let flags = if unsignaled {
                SendFlags::empty()
            } else {
                SendFlags::SIGNALED
            };
            if sent % 10 == 9 {
                p.a.qp
                    .send_inline_with(SendOp::Send, &message(sent), flags, None)
                    .unwrap();
                inline += 1;
            } else {
                let Some(mut buf) = send_pool.pop() else { break };
                buf.fill_from(&message(sent)).unwrap();
                p.a.qp.send_buf_with(SendOp::Send, buf, flags, None).unwrap();
            }
            signaled += u64::from(!unsignaled);
            sent += 1;
        }
        for c in p.a.cq.reap(&mut wc).iter() {
            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
            assert_eq!(c.opcode, WcOpcode::SEND);
            send_completions += 1;
            while let Some(buf) = p.a.qp.reclaim(c) {
                assert_eq!(buf.len(), MSG, "a send's buffer comes back as it went");
                send_pool.push(buf);
                sends_back += 1;
            }
        }
        for c in p.b.cq.reap(&mut wc).iter() {
            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
            assert_eq!(c.opcode, WcOpcode::RECV);
            assert!(p.a.qp.reclaim(c).is_none(), "B's receive is not A's to give back");
            let buf = p.b.qp.reclaim(c).expect("a receive gives its buffer back");
            assert!(p.b.qp.reclaim(c).is_none(), "one buffer per receive");
            assert_eq!(buf.as_slice(), &message(received)[..], "message {received}");
            received += 1;
            p.b.qp.recv_buf(buf).unwrap();
        }
        assert!(
            start.elapsed() < TIMEOUT * 10,
            "stalled: {sent} sent, {received} received"
        );
    }
    // The last send is signaled, and its completion gives back every buffer before it.
    while send_completions < signaled {
        for c in p.a.cq.reap(&mut wc).iter() {
            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
            send_completions += 1;
            while let Some(buf) = p.a.qp.reclaim(c) {
                send_pool.push(buf);
                sends_back += 1;
            }
        }
        assert!(
            start.elapsed() < TIMEOUT * 10,
            "{send_completions} of {signaled} send completions"
        );
    }
    assert_eq!(send_completions, signaled, "one completion per signaled send");
    assert_eq!(sends_back, N - inline, "every buffered send's buffer came back once");
    assert_eq!(send_pool.len(), SENDS, "the whole send pool is back");
    assert_eq!(p.a.qp.held_bufs(), (0, 0));

    // The receiver's posted buffers come back with their flush completions.
    p.b.qp
        .modify(&QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        })
        .unwrap();
    let mut recv_pool = Vec::new();
    while recv_pool.len() < RECVS {
        for c in p.b.cq.reap(&mut wc).iter() {
            assert_eq!(c.status, WcStatus::WR_FLUSH_ERR, "{c:?}");
            recv_pool.extend(p.b.qp.reclaim(c));
        }
        assert!(start.elapsed() < TIMEOUT * 10, "{} of {RECVS} flushed", recv_pool.len());
    }
    assert_eq!(p.b.qp.held_bufs(), (0, 0));
    assert_eq!(p.a.cq.poll(&mut wc), 0, "no completion beyond those counted");
    assert_eq!(p.b.cq.poll(&mut wc), 0, "no completion beyond those counted");
    figure(format_args!(
        "safe API: {N} sends ({inline} inline, {} unsignaled) -> {send_completions} send completions, {sends_back} buffers back, {received} receives, {RECVS} receive buffers back by flush",
        N - signaled
    ));
}

/// Waits for one completion on `qp`'s send CQ `cq` and returns the buffer it gives back.
fn one_back(qp: &mut Qp, cq: &mut Cq) -> Buf {
    let mut wc = [WorkCompletion::default(); 1];
    let start = Instant::now();
    loop {
        if let Some(c) = cq.reap(&mut wc).iter().next() {
            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
            let buf = qp.reclaim(c).expect("the request's buffer");
            assert!(qp.reclaim(c).is_none());
            return buf;
        }
        assert!(start.elapsed() < TIMEOUT, "no completion");
    }
}

#[test]
fn reads_writes_and_atomics_lend_a_buffer_and_give_it_back() {
    let mut p = Pair::new();
    let mut pool = bufs(&p.pd, 4, 64);
    let target = |mr: &RemoteMr, off| mr.remote(off).unwrap();
    let (read_at, write_at, atomic_at) = (target(&p.b.mr, 0), target(&p.b.mr, 1024), target(&p.b.mr, 2048));
    p.b.mr.write(0, &message(7)).unwrap();
    p.b.mr.write(2048, &40u64.to_ne_bytes()).unwrap();

    let buf = pool.pop().unwrap();
    p.a.qp.send_buf(SendOp::RdmaRead(read_at), buf).unwrap();
    let buf = one_back(&mut p.a.qp, &mut p.a.cq);
    assert_eq!(buf.as_slice(), &message(7)[..], "the read fetched the peer's bytes");

    let mut buf = buf;
    buf.fill_from(&message(9)).unwrap();
    p.a.qp.send_buf(SendOp::RdmaWrite(write_at), buf).unwrap();
    let buf = one_back(&mut p.a.qp, &mut p.a.cq);
    assert_eq!(p.b.mr.to_vec(1024, MSG).unwrap(), message(9), "the write landed");
    pool.push(buf);

    let mut buf = pool.pop().unwrap();
    buf.set_len(8).unwrap();
    p.a.qp
        .send_buf(
            SendOp::FetchAdd {
                remote: atomic_at,
                add: 2,
            },
            buf,
        )
        .unwrap();
    let buf = one_back(&mut p.a.qp, &mut p.a.cq);
    assert_eq!(
        buf.as_slice(),
        40u64.to_ne_bytes(),
        "fetch-and-add returns the old value"
    );
    p.a.qp
        .send_buf(
            SendOp::CompareSwap {
                remote: atomic_at,
                compare: 42,
                swap: 5,
            },
            buf,
        )
        .unwrap();
    let buf = one_back(&mut p.a.qp, &mut p.a.cq);
    assert_eq!(
        buf.as_slice(),
        42u64.to_ne_bytes(),
        "compare-and-swap returns the old value"
    );
    let mut now = [0; 8];
    p.b.mr.read(2048, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 5, "and swapped");

    p.a.qp
        .send_inline(SendOp::RdmaWrite(target(&p.b.mr, 4096)), b"inline write")
        .unwrap();
    let mut wc = [WorkCompletion::default(); 1];
    let start = Instant::now();
    loop {
        if let Some(c) = p.a.cq.reap(&mut wc).iter().next() {
            assert_eq!(c.status, WcStatus::SUCCESS);
            assert!(p.a.qp.reclaim(c).is_none(), "an inline request holds no buffer");
            break;
        }
        assert!(start.elapsed() < TIMEOUT);
    }
    assert_eq!(p.b.mr.to_vec(4096, 12).unwrap(), b"inline write");
    pool.push(buf);
    assert_eq!(p.a.qp.held_bufs(), (0, 0));
}

/// No safe post hands the kernel an operation the core does not model: `SendOp::Raw` is
/// refused by `send_inline` as by `send_buf`. On rxe (Linux 6.1) this exact request, opcode
/// 0x20 (`IB_WR_REG_MR`) inline on a connected RC QP, made the kernel dereference a NULL MR
/// pointer (`rxe_reg_fast_mr`); rxe also refuses it, and anything past it, on the unsafe
/// post, since the kernel's opcode table ends there. The QP works afterwards.
#[test]
fn raw_operations_never_reach_the_kernel_from_the_safe_posts() {
    let mut p = Pair::new();
    let remote = p.b.mr.remote(0).unwrap();
    let not_supported = |e: &Error| {
        matches!(
            e,
            Error::WorkRequest {
                reason: WrReject::OpcodeNotSupported,
                index: 0,
                ..
            }
        )
    };
    for opcode in [10, 0x20, 0x21, 0xff, u32::MAX] {
        let raw = SendOp::Raw(RawOp {
            opcode,
            imm_data: 0,
            remote,
        });
        let e = p.a.qp.send_inline(raw, &[]).unwrap_err();
        assert!(not_supported(&e), "send_inline, opcode {opcode:#x}: {e}");
        let e =
            p.a.qp
                .send_inline_with(raw, b"x", SendFlags::empty(), None)
                .unwrap_err();
        assert!(not_supported(&e), "send_inline_with, opcode {opcode:#x}: {e}");
    }
    if driver(&p.ctx) == Driver::Rxe {
        for opcode in [0x20, 0x21, 0x1000] {
            let raw = SendOp::Raw(RawOp {
                opcode,
                imm_data: 0,
                remote,
            });
            // SAFETY: no buffer: the request names no memory.
            let e = unsafe { p.a.qp.post_send(&[SendWr::new(1, raw, &[])]) }.unwrap_err();
            assert!(not_supported(&e), "post_send, opcode {opcode:#x}: {e}");
        }
    }
    assert_eq!(p.a.qp.held_bufs(), (0, 0));
    p.a.qp
        .send_inline(SendOp::RdmaWrite(p.b.mr.remote(64).unwrap()), b"still works")
        .unwrap();
    let mut wc = [WorkCompletion::default(); 1];
    let start = Instant::now();
    loop {
        if let Some(c) = p.a.cq.reap(&mut wc).iter().next() {
            assert_eq!(c.status, WcStatus::SUCCESS, "the QP was left as it was");
            break;
        }
        assert!(start.elapsed() < TIMEOUT);
    }
    assert_eq!(p.b.mr.to_vec(64, 11).unwrap(), b"still works");
}

#[test]
fn refused_posts_hand_the_buffer_back_and_failed_requests_still_return_it() {
    let mut p = Pair::new();
    let mut pool = bufs(&p.pd, 2, 64);
    // An atomic needs an 8-byte aligned target: refused before posting, buffer returned.
    let mut buf = pool.pop().unwrap();
    buf.set_len(8).unwrap();
    let misaligned = p.b.mr.remote(3).unwrap();
    let refused =
        p.a.qp
            .send_buf(
                SendOp::FetchAdd {
                    remote: misaligned,
                    add: 1,
                },
                buf,
            )
            .unwrap_err();
    assert!(
        matches!(
            refused.error,
            Error::WorkRequest {
                reason: WrReject::BadAtomic,
                ..
            }
        ),
        "{}",
        refused.error
    );
    let buf = refused.buf.expect("rejected before it was queued");
    assert_eq!(p.a.qp.held_bufs(), (0, 0));
    // An operation the core does not model is not for a lent buffer, alone or in a list.
    let raw = SendOp::Raw(RawOp {
        opcode: 10, // IBV_WR_TSO
        imm_data: 0,
        remote: p.b.mr.remote(0).unwrap(),
    });
    let refused = p.a.qp.send_buf(raw, buf).unwrap_err();
    assert!(
        matches!(
            refused.error,
            Error::WorkRequest {
                reason: WrReject::OpcodeNotSupported,
                ..
            }
        ),
        "{}",
        refused.error
    );
    let buf = refused.buf.expect("refused before it was queued");
    let mut list = vec![buf];
    let err = p.a.qp.send_bufs(raw, &mut list, SendFlags::SIGNALED).unwrap_err();
    assert!(
        matches!(
            err,
            Error::WorkRequest {
                reason: WrReject::OpcodeNotSupported,
                index: 0,
                ..
            }
        ),
        "{err}"
    );
    let buf = list.pop().expect("the list's buffer stays with the caller");
    assert_eq!(p.a.qp.held_bufs(), (0, 0));
    // A write with a bad rkey fails at the device: the error completion gives it back.
    let bad = Remote {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey() ^ 0x5a5a,
    };
    p.a.qp.send_buf(SendOp::RdmaWrite(bad), buf).unwrap();
    let mut wc = [WorkCompletion::default(); 4];
    let start = Instant::now();
    let back = loop {
        if let Some(c) = p.a.cq.reap(&mut wc).iter().next() {
            assert_ne!(c.status, WcStatus::SUCCESS, "a bad rkey fails");
            break p.a.qp.reclaim(c).expect("an error completion ends the request too");
        };
        assert!(start.elapsed() < TIMEOUT);
    };
    assert_eq!(back.len(), 8);
    // The QP is in ERR now: a post is refused by the device's queue state or flushed.
    assert_eq!(p.a.qp.held_bufs(), (0, 0));
}

#[test]
fn completions_of_raw_posts_and_other_queues_give_nothing_back() {
    let mut p = Pair::new();
    let mut pool = bufs(&p.pd, 2, 64);
    p.b.qp.recv_buf(pool.pop().unwrap()).unwrap();
    // A raw send from A's registered memory, with a wr_id of its own.
    let sge = [p.a.mr.sge(0, 16).unwrap()];
    // SAFETY: A's region outlives the request and nothing rewrites it before it completes.
    unsafe { p.a.qp.post_send(&[SendWr::new(77, SendOp::Send, &sge)]) }.unwrap();
    let mut wc = [WorkCompletion::default(); 4];
    let start = Instant::now();
    let (mut send_seen, mut recv_seen) = (false, false);
    while !(send_seen && recv_seen) {
        for c in p.a.cq.reap(&mut wc).iter() {
            assert_eq!(c.wr_id, 77);
            assert!(p.a.qp.reclaim(c).is_none(), "a raw request holds nothing");
            assert!(p.b.qp.reclaim(c).is_none(), "nor is it B's");
            send_seen = true;
        }
        for c in p.b.cq.reap(&mut wc).iter() {
            assert!(p.a.qp.reclaim(c).is_none(), "B's receive is not A's");
            let buf = p.b.qp.reclaim(c).expect("B's receive buffer");
            assert_eq!(buf.len(), 16, "length set to the bytes received");
            recv_seen = true;
        }
        assert!(start.elapsed() < TIMEOUT);
    }
}

#[test]
fn remotely_writable_memory_is_reached_by_copies_and_never_split() {
    let p = Pair::new();
    // `alloc_mr` with remote write, atomic or window access does not compile (`LocalAccess`'s
    // compile_fail examples).
    let mut mr =
        p.pd.alloc_remote_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    // Unaligned ends and aligned words in between.
    let data: Vec<u8> = (0..100u8).collect();
    mr.write(3, &data).unwrap();
    assert_eq!(mr.to_vec(3, 100).unwrap(), data);
    assert_eq!(mr.to_vec(0, 3).unwrap(), [0, 0, 0]);
    mr.fill(4000, 96, 7).unwrap();
    assert_eq!(mr.to_vec(4000, 96).unwrap(), [7; 96]);
    assert_eq!(
        mr.write(4090, &[0; 8]).unwrap_err(),
        OutOfBounds {
            offset: 4090,
            len: 8,
            mr_len: 4096
        }
    );
    // Local memory splits into buffers, the last one shorter.
    let bufs =
        p.pd.alloc_mr(1000, LocalAccess::LOCAL_WRITE)
            .unwrap()
            .into_bufs(300)
            .unwrap();
    let caps: Vec<(usize, usize)> = bufs.iter().map(|b| (b.offset(), b.capacity())).collect();
    assert_eq!(caps, [(0, 300), (300, 300), (600, 300), (900, 100)]);
    let mut last = bufs.into_iter().last().unwrap();
    assert!(last.set_len(101).is_err());
    last.set_len(100).unwrap();
    assert_eq!(last.as_slice(), &[0; 100][..]);
}

#[test]
fn dropping_a_qp_that_holds_buffers_releases_them_after_the_kernel_destroyed_it() {
    let mut p = Pair::new();
    let mut pool = bufs(&p.pd, 8, 64);
    let weak_probe = pool.pop().unwrap();
    for b in pool.drain(..) {
        p.b.qp.recv_buf(b).unwrap();
    }
    assert_eq!(p.b.qp.held_bufs(), (0, 7));
    // The receives never complete; dropping the QP destroys it, then drops what it held.
    let Pair { b, .. } = p;
    drop(b.qp);
    // The region is still alive through the one buffer kept here.
    assert_eq!(weak_probe.as_slice().len(), 64);
}

/// Reaps `cq` until `want` buffers came back from `qp` (`Qp::reclaim_all`), returned in the
/// order given back.
fn reclaim_n(qp: &mut Qp, cq: &mut Cq, want: usize) -> Vec<Buf> {
    let mut wc = [WorkCompletion::default(); 16];
    let mut back = Vec::new();
    let start = Instant::now();
    while back.len() < want {
        let reaped = cq.reap(&mut wc);
        for c in reaped.iter() {
            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
        }
        let before = back.len();
        assert_eq!(qp.reclaim_all(&reaped, &mut back), back.len() - before);
        assert!(start.elapsed() < TIMEOUT, "{} of {want} buffers back", back.len());
    }
    back
}

#[test]
fn a_list_of_buffers_is_posted_a_doorbell_per_32_and_every_buffer_comes_back() {
    const N: usize = 100;
    let mut p = Pair::new();
    for b in bufs(&p.pd, N, MSG) {
        p.b.qp.recv_buf(b).unwrap();
    }
    let mut list = bufs(&p.pd, N, MSG);
    for (seq, b) in list.iter_mut().enumerate() {
        b.fill_from(&message(seq as u64)).unwrap();
    }
    // Only the last of each doorbell signaled would do too; every one is, to count them.
    p.a.qp.send_bufs(SendOp::Send, &mut list, SendFlags::SIGNALED).unwrap();
    assert!(list.is_empty());
    assert_eq!(p.a.qp.held_bufs(), (N, 0));
    let sent = reclaim_n(&mut p.a.qp, &mut p.a.cq, N);
    for (seq, b) in sent.iter().enumerate() {
        assert_eq!(b.as_slice(), message(seq as u64), "given back in posting order");
    }
    let received = reclaim_n(&mut p.b.qp, &mut p.b.cq, N);
    for (seq, b) in received.iter().enumerate() {
        assert_eq!(b.as_slice(), message(seq as u64), "received in order");
    }
    assert_eq!((p.a.qp.held_bufs(), p.b.qp.held_bufs()), ((0, 0), (0, 0)));
}

#[test]
fn a_later_list_sends_its_own_operation_and_buffers() {
    // The QP keeps its request array between lists: each list must still go out with its own
    // operation, flags and buffers (a shorter one after a longer, an immediate after none).
    const N: usize = 40;
    let mut p = Pair::new();
    for b in bufs(&p.pd, N + N / 2, MSG) {
        p.b.qp.recv_buf(b).unwrap();
    }
    let mut list = bufs(&p.pd, N, MSG);
    for (seq, b) in list.iter_mut().enumerate() {
        b.fill_from(&message(seq as u64)).unwrap();
    }
    p.a.qp.send_bufs(SendOp::Send, &mut list, SendFlags::SIGNALED).unwrap();
    let mut sent = reclaim_n(&mut p.a.qp, &mut p.a.cq, N);
    let mut wc = [WorkCompletion::default(); 16];
    let mut got = Vec::new();
    let start = Instant::now();
    while got.len() < N {
        for c in p.b.cq.reap(&mut wc).iter() {
            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
            let imm = c.imm();
            let b = p.b.qp.reclaim(c).expect("a receive's buffer");
            got.push((imm, b.as_slice().to_vec()));
        }
        assert!(start.elapsed() < TIMEOUT, "{} of {N} received", got.len());
    }
    // The second half of the buffers, in reverse, as sends with an immediate.
    let mut list: Vec<Buf> = sent.drain(N / 2..).rev().collect();
    for (seq, b) in list.iter_mut().enumerate() {
        b.fill_from(&message(1000 + seq as u64)).unwrap();
    }
    p.a.qp
        .send_bufs(SendOp::SendWithImm { imm: 7 }, &mut list, SendFlags::SIGNALED)
        .unwrap();
    reclaim_n(&mut p.a.qp, &mut p.a.cq, N / 2);
    while got.len() < N + N / 2 {
        for c in p.b.cq.reap(&mut wc).iter() {
            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
            let imm = c.imm();
            let b = p.b.qp.reclaim(c).expect("a receive's buffer");
            got.push((imm, b.as_slice().to_vec()));
        }
        assert!(start.elapsed() < TIMEOUT, "{} of {} received", got.len(), N + N / 2);
    }
    for (seq, (imm, bytes)) in got.iter().enumerate() {
        let (want_imm, want) = if seq < N {
            (None, message(seq as u64))
        } else {
            (Some(7), message(1000 + (seq - N) as u64))
        };
        assert_eq!((*imm, bytes.as_slice()), (want_imm, &want[..]), "message {seq}");
    }
    assert_eq!((p.a.qp.held_bufs(), p.b.qp.held_bufs()), ((0, 0), (0, 0)));
}

#[test]
fn a_list_refused_midway_posts_the_requests_before_and_hands_the_rest_back_in_order() {
    // Fetch-and-adds of 8-byte buffers, but the 35th buffer holds 4 bytes: the provider
    // refuses that request (the third of the second doorbell's list), takes the 34 before it,
    // and the refused buffer comes back first, then the five not reached, in order.
    const N: usize = 40;
    const SHORT: usize = 34;
    let mut p = Pair::new();
    let atomic_at = p.b.mr.remote(2048).unwrap();
    p.b.mr.write(2048, &0u64.to_ne_bytes()).unwrap();
    let mut list = bufs(&p.pd, N, 8);
    for (seq, b) in list.iter_mut().enumerate() {
        if seq == SHORT {
            b.fill_from(&[0xaa; 4]).unwrap();
        } else {
            b.fill_from(&(seq as u64).to_ne_bytes()).unwrap();
        }
    }
    let op = SendOp::FetchAdd {
        remote: atomic_at,
        add: 1,
    };
    let e = p.a.qp.send_bufs(op, &mut list, SendFlags::SIGNALED).unwrap_err();
    assert!(
        matches!(
            e,
            Error::WorkRequest {
                index: SHORT,
                reason: WrReject::BadAtomic,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!((list.len(), p.a.qp.held_bufs()), (N - SHORT, (SHORT, 0)));
    assert_eq!(list[0].as_slice(), [0xaa; 4], "the refused buffer first");
    for (b, seq) in list[1..].iter().zip(SHORT + 1..) {
        assert_eq!(
            b.as_slice(),
            (seq as u64).to_ne_bytes(),
            "then those not reached, in order"
        );
    }
    reclaim_n(&mut p.a.qp, &mut p.a.cq, SHORT);
    assert_eq!(
        p.b.mr.to_vec(2048, 8).unwrap(),
        (SHORT as u64).to_ne_bytes(),
        "each request before the refused one added 1"
    );
    assert_eq!(p.a.qp.held_bufs(), (0, 0));
}

#[test]
fn a_list_longer_than_the_queue_posts_what_fits_and_hands_the_rest_back_in_order() {
    const N: usize = 80;
    let mut p = Pair::with(PairOpts {
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..Default::default()
    });
    let remote = p.b.mr.remote(0).unwrap();
    let mut list = bufs(&p.pd, N, 8);
    for (seq, b) in list.iter_mut().enumerate() {
        b.fill_from(&(seq as u64).to_le_bytes()).unwrap();
    }
    let mut posted = 0;
    while posted < N {
        let before = list.len();
        match p
            .a
            .qp
            .send_bufs(SendOp::RdmaWrite(remote), &mut list, SendFlags::SIGNALED)
        {
            Ok(()) => assert!(list.is_empty()),
            Err(Error::WorkRequest {
                index,
                reason: WrReject::QueueFull,
                ..
            }) => {
                assert!(index > 0, "the queue had room");
                assert_eq!(list.len(), before - index, "the rest is back");
            }
            Err(e) => panic!("{e}"),
        }
        let n = before - list.len();
        // What is left starts with the first buffer not posted.
        if let Some(first) = list.first() {
            assert_eq!(first.as_slice(), ((posted + n) as u64).to_le_bytes());
        }
        let back = reclaim_n(&mut p.a.qp, &mut p.a.cq, n);
        for (k, b) in back.iter().enumerate() {
            assert_eq!(b.as_slice(), ((posted + k) as u64).to_le_bytes());
        }
        posted += n;
    }
    assert_eq!(p.a.qp.held_bufs(), (0, 0));

    // A QP that cannot send yet takes none of them.
    let mut qp = p.pd.create_qp(&QpInit::new(QpType::Rc, &p.a.cq, &p.a.cq)).unwrap();
    let mut list = bufs(&p.pd, 3, 8);
    let e = qp.send_bufs(SendOp::Send, &mut list, SendFlags::SIGNALED).unwrap_err();
    assert!(
        matches!(
            e,
            Error::WorkRequest {
                index: 0,
                reason: WrReject::WrongState(QpState::Reset),
                ..
            }
        ),
        "{e}"
    );
    assert_eq!((list.len(), qp.held_bufs()), (3, (0, 0)));
}

#[test]
fn a_list_the_provider_refuses_comes_back_whole_and_in_order() {
    let p = Pair::new();
    let mut cq = p.ctx.create_cq(64).unwrap();
    let mut ud = p.pd.create_qp(&QpInit::new(QpType::Ud, &cq, &cq)).unwrap();
    ud.ud_to_rts(1, 0x1234).unwrap();
    let remote = p.b.mr.remote(0).unwrap();
    // More than one doorbell's worth; a UD QP has no RDMA write, so the first request of the
    // first list is refused and nothing is posted.
    let mut list = bufs(&p.pd, 40, 8);
    for (seq, b) in list.iter_mut().enumerate() {
        b.fill_from(&(seq as u64).to_le_bytes()).unwrap();
    }
    let e = ud
        .send_bufs(SendOp::RdmaWrite(remote), &mut list, SendFlags::SIGNALED)
        .unwrap_err();
    assert!(matches!(e, Error::WorkRequest { index: 0, .. }), "{e}");
    assert_eq!((list.len(), ud.held_bufs()), (40, (0, 0)));
    for (seq, b) in list.iter().enumerate() {
        assert_eq!(b.as_slice(), (seq as u64).to_le_bytes(), "back in order");
    }
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut wc), 0, "nothing was queued");
}

/// Full queues may not move to RESET, where the device would drop their requests without
/// completions (and rxe may still write a buffer after the move): the modify is refused with
/// the counts, and nothing changes. A move to ERR flushes every request, the flushes give
/// every buffer back, and then RESET is allowed; the full queues' ids are free again, so they
/// take new posts once the QP is connected again. A receive is refused in ERR.
#[test]
fn full_queues_move_to_reset_only_after_their_flushes_are_reaped() {
    const DEPTH: usize = 16;
    let mut p = Pair::with(PairOpts {
        cap: QpCap {
            max_send_wr: DEPTH as u32,
            max_recv_wr: DEPTH as u32,
            ..PairOpts::default().cap
        },
        ..PairOpts::default()
    });
    let state = |s| QpAttr {
        state: Some(s),
        ..Default::default()
    };
    // The peer stops answering: the sends wait, queued, for acknowledgements.
    p.b.qp.modify(&state(QpState::Reset)).unwrap();
    let remote = p.b.mr.remote(0).unwrap();
    let mut pool = bufs(&p.pd, 4 * DEPTH, 64);
    let full = |e: &Error| {
        matches!(
            e,
            Error::WorkRequest {
                reason: WrReject::QueueFull,
                ..
            }
        )
    };
    let mut posted = (0, 0);
    loop {
        match p.a.qp.send_buf(SendOp::RdmaWrite(remote), pool.pop().unwrap()) {
            Ok(()) => posted.0 += 1,
            Err(refused) => {
                assert!(full(&refused.error), "{}", refused.error);
                pool.push(refused.buf.unwrap());
                break;
            }
        }
    }
    loop {
        match p.a.qp.recv_buf(pool.pop().unwrap()) {
            Ok(()) => posted.1 += 1,
            Err(refused) => {
                assert!(full(&refused.error), "{}", refused.error);
                pool.push(refused.buf.unwrap());
                break;
            }
        }
    }
    assert!(posted.0 >= DEPTH && posted.1 >= DEPTH, "both queues full: {posted:?}");
    assert_eq!(p.a.qp.held_bufs(), posted);

    let e = p.a.qp.modify(&state(QpState::Reset)).unwrap_err();
    assert!(
        matches!(e, Error::RequestsOutstanding { send, recv, .. } if (send, recv) == posted),
        "{e}"
    );
    assert_eq!(p.a.qp.state(), QpState::Rts, "nothing changed");
    p.a.qp.modify(&state(QpState::Err)).unwrap();
    let refused = p.a.qp.recv_buf(pool.pop().unwrap()).unwrap_err();
    assert!(
        matches!(
            refused.error,
            Error::WorkRequest {
                reason: WrReject::WrongState(QpState::Err),
                ..
            }
        ),
        "{}",
        refused.error
    );
    pool.push(refused.buf.unwrap());
    // Every request completes, flushed (or done, for a send that got through first).
    let mut wc = [WorkCompletion::default(); 8];
    let start = Instant::now();
    while p.a.qp.held_bufs() != (0, 0) {
        let reaped = p.a.cq.reap(&mut wc);
        p.a.qp.reclaim_all(&reaped, &mut pool);
        assert!(start.elapsed() < TIMEOUT, "still held: {:?}", p.a.qp.held_bufs());
    }
    assert_eq!(pool.len(), 4 * DEPTH, "every buffer is back");
    p.a.qp.modify(&state(QpState::Reset)).unwrap();
    let (a_qpn, b_qpn) = (p.a.qp.qpn(), p.b.qp.qpn());
    let path = loopback_path(&p.ctx);
    for (qp, peer) in [(&mut p.a.qp, b_qpn), (&mut p.b.qp, a_qpn)] {
        qp.to_init(1, PairOpts::default().access).unwrap();
        qp.to_rtr(path, peer, 0, Mtu::Mtu1024).unwrap();
        qp.to_rts(0).unwrap();
    }
    // Full queues' worth of new posts: the flushed requests' ids are free.
    for k in 0..posted.0 {
        let mut buf = pool.pop().unwrap();
        buf.set_len(8).unwrap();
        buf.as_mut_slice().copy_from_slice(&(k as u64).to_le_bytes());
        p.a.qp
            .send_buf(SendOp::RdmaWrite(p.b.mr.remote(8 * k).unwrap()), buf)
            .unwrap_or_else(|r| panic!("send {k} after the reset: {}", r.error));
    }
    for _ in 0..posted.0 {
        pool.push(one_back(&mut p.a.qp, &mut p.a.cq));
    }
    for k in 0..posted.0 {
        assert_eq!(p.b.mr.to_vec(8 * k, 8).unwrap(), (k as u64).to_le_bytes());
    }
    for _ in 0..posted.1 {
        p.a.qp.recv_buf(pool.pop().unwrap()).unwrap();
    }
    for k in 0..posted.1 {
        p.b.qp.send_inline(SendOp::Send, &(k as u64).to_le_bytes()).unwrap();
    }
    for k in 0..posted.1 {
        let buf = one_back(&mut p.a.qp, &mut p.a.cq);
        assert_eq!(buf.as_slice(), (k as u64).to_le_bytes(), "the new receives, in order");
        pool.push(buf);
    }
    assert_eq!(p.a.qp.held_bufs(), (0, 0));
}

/// Flush completions, whose `opcode` is undefined, still say which queue and which operation
/// their request was: `Completion::queue`, `Qp::completed_op` and `Qp::reclaim_detailed` tell
/// from what the safe posts recorded.
#[test]
fn flushed_requests_say_their_queue_and_operation() {
    let mut p = Pair::new();
    let state = |s| QpAttr {
        state: Some(s),
        ..Default::default()
    };
    // The peer stops answering: the sends stay queued until the flush.
    p.b.qp.modify(&state(QpState::Reset)).unwrap();
    let remote = p.b.mr.remote(0).unwrap();
    let mut pool = bufs(&p.pd, 8, 64);
    let mut eight = pool.pop().unwrap();
    eight.set_len(8).unwrap();
    let posted = [
        (WorkQueue::Send, WcOpcode::RDMA_READ),
        (WorkQueue::Send, WcOpcode::FETCH_ADD),
        (WorkQueue::Send, WcOpcode::SEND),
        (WorkQueue::Send, WcOpcode::RDMA_WRITE),
        (WorkQueue::Recv, WcOpcode::RECV),
    ];
    p.a.qp.send_buf(SendOp::RdmaRead(remote), pool.pop().unwrap()).unwrap();
    p.a.qp.send_buf(SendOp::FetchAdd { remote, add: 1 }, eight).unwrap();
    p.a.qp.send_buf(SendOp::Send, pool.pop().unwrap()).unwrap();
    p.a.qp.send_inline(SendOp::RdmaWrite(remote), b"inline").unwrap();
    p.a.qp.recv_buf(pool.pop().unwrap()).unwrap();
    p.a.qp.modify(&state(QpState::Err)).unwrap();

    let mut seen = Vec::new();
    let mut back = Vec::new();
    let mut wc = [WorkCompletion::default(); 8];
    let start = Instant::now();
    while seen.len() < posted.len() {
        for c in p.a.cq.reap(&mut wc).iter() {
            assert_eq!(c.status, WcStatus::WR_FLUSH_ERR, "{c:?}");
            let op = p.a.qp.completed_op(&c).expect("the safe posts know it");
            seen.push((c.queue().expect("a safe post's id"), op));
            while let Some(r) = p.a.qp.reclaim_detailed(c) {
                assert!(r.completed_by(&c), "every request signaled");
                back.push((r.queue, r.op));
                pool.push(r.buf);
            }
        }
        assert!(start.elapsed() < TIMEOUT, "flushes so far: {seen:?}");
    }
    seen.sort_by_key(|(q, _)| *q == WorkQueue::Recv);
    assert_eq!(
        seen, posted,
        "each completion's queue and operation, the sends in order"
    );
    let holding: Vec<_> = posted
        .iter()
        .copied()
        .filter(|&(_, op)| op != WcOpcode::RDMA_WRITE)
        .collect();
    back.sort_by_key(|(q, _)| *q == WorkQueue::Recv);
    assert_eq!(
        back, holding,
        "the buffers back, each with its request (the inline one held none)"
    );
    assert_eq!(p.a.qp.held_bufs(), (0, 0));
}

/// One-sided safe posts through an advertised `RemoteRegion`: the region travels as bytes
/// (zero-padded, as private data comes back), the posts land inside it, and a range past its
/// end is refused before posting with a typed error, the buffer handed back.
#[test]
fn one_sided_posts_through_an_advertised_region_check_its_bounds() {
    let mut p = Pair::new();
    let advertised = p.b.mr.region_range(4096, 256).unwrap();
    let mut wire = [0u8; 56];
    wire[..RemoteRegion::ENCODED_LEN].copy_from_slice(&advertised.encode());
    let region = RemoteRegion::decode(&wire).unwrap();
    assert_eq!(region, advertised);
    assert_eq!((region.addr(), region.len()), (p.b.mr.addr() + 4096, 256));

    let mut pool = bufs(&p.pd, 4, 64);
    let mut buf = pool.pop().unwrap();
    buf.fill_from(&message(3)).unwrap();
    p.a.qp.write_buf(buf, &region, 192).unwrap();
    let buf = one_back(&mut p.a.qp, &mut p.a.cq);
    assert_eq!(p.b.mr.to_vec(4096 + 192, MSG).unwrap(), message(3), "the last 64 bytes");

    let refused = p.a.qp.write_buf(buf, &region, 193).unwrap_err();
    assert_eq!(
        refused.error.to_string(),
        Error::WorkRequest {
            verb: "write_buf",
            index: 0,
            reason: WrReject::RemoteOutOfBounds {
                offset: 193,
                len: 64,
                region_len: 256
            }
        }
        .to_string()
    );
    assert!(matches!(
        refused.error,
        Error::WorkRequest {
            reason: WrReject::RemoteOutOfBounds { offset: 193, .. },
            ..
        }
    ));
    let buf = refused.buf.expect("the buffer comes back");
    assert_eq!(p.a.qp.held_bufs(), (0, 0), "nothing posted");

    p.a.qp.read_buf(buf, &region, 192).unwrap();
    let mut buf = one_back(&mut p.a.qp, &mut p.a.cq);
    assert_eq!(buf.as_slice(), &message(3)[..], "read back through the region");

    p.b.mr.write(4096, &40u64.to_ne_bytes()).unwrap();
    buf.set_len(8).unwrap();
    p.a.qp.fetch_add_buf(buf, &region, 0, 2).unwrap();
    let buf = one_back(&mut p.a.qp, &mut p.a.cq);
    assert_eq!(buf.as_slice(), 40u64.to_ne_bytes());
    p.a.qp.compare_swap_buf(buf, &region, 0, 42, 7).unwrap();
    let buf = one_back(&mut p.a.qp, &mut p.a.cq);
    assert_eq!(buf.as_slice(), 42u64.to_ne_bytes());
    let refused = p.a.qp.fetch_add_buf(buf, &region, 256, 1).unwrap_err();
    assert!(matches!(
        refused.error,
        Error::WorkRequest {
            reason: WrReject::RemoteOutOfBounds { .. },
            ..
        }
    ));
    pool.push(refused.buf.unwrap());

    let sub = region.range(16, 16).unwrap();
    p.a.qp.write_inline(b"sixteen bytes!!!", &sub, 0).unwrap();
    let err = p.a.qp.write_inline(b"seventeen bytes!!", &sub, 0).unwrap_err();
    assert!(
        matches!(
            err,
            Error::WorkRequest {
                reason: WrReject::RemoteOutOfBounds {
                    len: 17,
                    region_len: 16,
                    ..
                },
                ..
            }
        ),
        "{err}"
    );
    let mut wc = [WorkCompletion::default(); 1];
    let start = Instant::now();
    while p.a.qp.held_bufs() != (0, 0) {
        for c in p.a.cq.reap(&mut wc).iter() {
            assert!(c.is_success() && p.a.qp.reclaim(c).is_none(), "{c:?}");
        }
        assert!(start.elapsed() < TIMEOUT);
    }
    assert_eq!(p.b.mr.to_vec(4096 + 16, 16).unwrap(), b"sixteen bytes!!!");
    assert_eq!(p.a.qp.held_bufs(), (0, 0));
}

/// A QP from `QpInit::new`'s defaults takes inline sends of up to `QpInit::INLINE` bytes on
/// every provider (the same program on rxe and on the mlx5 model), and refuses one byte more
/// than it was granted with the same typed error, before the provider sees it.
#[test]
fn default_qps_take_the_same_inline_sends_on_every_provider() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let (acq, bcq) = (ctx.create_cq(64).unwrap(), ctx.create_cq(64).unwrap());
    let mut a = pd.create_qp(&QpInit::new(QpType::Rc, &acq, &acq)).unwrap();
    let mut b = pd.create_qp(&QpInit::new(QpType::Rc, &bcq, &bcq)).unwrap();
    let granted = a.cap().max_inline_data;
    assert!(granted >= QpInit::INLINE, "granted {granted}");
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.alloc_remote_mr(4096, access).unwrap();
    let path = loopback_path(&ctx);
    let (an, bn) = (a.qpn(), b.qpn());
    for (qp, peer) in [(&mut a, bn), (&mut b, an)] {
        qp.to_init(1, access).unwrap();
        qp.to_rtr(path, peer, 0, Mtu::Mtu1024).unwrap();
        qp.to_rts(0).unwrap();
    }
    let data = [0x5a; QpInit::INLINE as usize];
    a.write_inline(&data, &mr.region(), 0).unwrap();
    let too_long = vec![1; granted as usize + 1];
    let err = a
        .send_inline(SendOp::RdmaWrite(mr.remote(0).unwrap()), &too_long)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::WorkRequest {
                reason: WrReject::InlineTooLong { given, max },
                ..
            } if given == too_long.len() && max == granted
        ),
        "{err}"
    );
    let mut acq = acq;
    let mut wc = [WorkCompletion::default(); 2];
    let start = Instant::now();
    while a.held_bufs() != (0, 0) {
        for c in acq.reap(&mut wc).iter() {
            assert!(c.is_success(), "{c:?}");
            assert!(a.reclaim(c).is_none());
        }
        assert!(start.elapsed() < TIMEOUT);
    }
    assert_eq!(mr.to_vec(0, data.len()).unwrap(), data);
}
