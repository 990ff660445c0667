//! Safe receives on a shared receive queue (`Srq::recv_buf`, `reclaim`, `reclaim_all`,
//! `destroy_reclaim`) on a real device: two QPs receiving from one SRQ with every buffer back
//! once, its contents and length right; the typed errors for completions that are not the
//! SRQ's; and flushes and destruction giving the buffers back or keeping them owned.

mod common;

use common::srq::{setup, Setup};
use common::*;
use std::collections::BTreeSet;
use std::time::Instant;
use uverbs::*;

const CAP: usize = 256;

/// Message `seq` to receiver `qp`: 1 to `CAP` bytes, each naming the QP and the message.
fn message(qp: usize, seq: u64) -> Vec<u8> {
    let len = 1 + (seq as usize * 37 + qp * 11) % CAP;
    (0..len)
        .map(|i| (seq as u8).wrapping_add(i as u8) ^ (qp as u8) << 7)
        .collect()
}

/// Local buffers of `size` bytes from a fresh region of `count` of them.
fn bufs(pd: &Pd, count: usize, size: usize) -> Vec<Buf> {
    let mr = pd.alloc_mr(count * size, LocalAccess::LOCAL_WRITE).unwrap();
    mr.into_bufs(size).unwrap()
}

/// Which receiver QP of `s` has number `qpn`.
fn receiver(s: &Setup, qpn: u32) -> usize {
    s.receivers.iter().position(|q| q.qpn() == qpn).expect("a receiver")
}

/// Sends `data` from sender `qp` with a buffer of `pool` and waits for its completion, which
/// gives the buffer back to `pool`; returns the send's completion.
fn send(s: &mut Setup, pool: &mut Vec<Buf>, qp: usize, data: &[u8]) -> WorkCompletion {
    let mut buf = pool.pop().expect("a send buffer");
    buf.fill_from(data).unwrap();
    s.senders[qp].send_buf(SendOp::Send, buf).unwrap();
    let mut wc = [WorkCompletion::default(); 1];
    let start = Instant::now();
    loop {
        if let Some(c) = s.send_cq.reap(&mut wc).iter().next() {
            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
            pool.push(s.senders[qp].reclaim(c).expect("the send's buffer"));
            return *c;
        }
        assert!(start.elapsed() < TIMEOUT, "no send completion");
    }
}

#[test]
fn two_qps_on_one_srq_give_every_buffer_back_with_its_message() {
    const N: u64 = 10_000; // per receiving QP
    const RECVS: usize = 64;
    const SENDS: usize = 24; // per sender, at most this many in flight
    let mut s = setup(RECVS as u32);
    let mut recv_pool = bufs(&s.pd, RECVS, CAP);
    let offsets: BTreeSet<usize> = recv_pool.iter().map(Buf::offset).collect();
    for b in recv_pool.drain(..) {
        s.srq.recv_buf(b).unwrap();
    }
    assert_eq!(s.srq.held_bufs(), RECVS);
    let mut send_pools = [bufs(&s.pd, SENDS, CAP), bufs(&s.pd, SENDS, CAP)];
    let (mut sent, mut received, mut sends_back) = ([0u64; 2], [0u64; 2], 0u64);
    let (mut foreign, mut twice) = (0u64, 0u64);
    let mut wc = [WorkCompletion::default(); 32];
    let start = Instant::now();
    while received != [N; 2] || send_pools.iter().any(|p| p.len() < SENDS) {
        for q in 0..2 {
            while sent[q] < N {
                let Some(mut buf) = send_pools[q].pop() else { break };
                buf.fill_from(&message(q, sent[q])).unwrap();
                s.senders[q].send_buf(SendOp::Send, buf).unwrap();
                sent[q] += 1;
            }
        }
        for c in s.send_cq.reap(&mut wc).iter() {
            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
            assert_eq!(
                s.srq.reclaim(c).unwrap_err(),
                SrqReclaimError::ForeignQp { qp_num: c.qp_num },
                "a sender is not on the SRQ"
            );
            foreign += 1;
            for (q, qp) in s.senders.iter_mut().enumerate() {
                while let Some(buf) = qp.reclaim(c) {
                    send_pools[q].push(buf);
                    sends_back += 1;
                }
            }
        }
        for c in s.recv_cq.reap(&mut wc).iter() {
            assert_eq!((c.status, c.opcode), (WcStatus::SUCCESS, WcOpcode::RECV), "{c:?}");
            let q = receiver(&s, c.qp_num);
            let buf = s.srq.reclaim(c).expect("a receive of the SRQ");
            assert_eq!(
                s.srq.reclaim(c).unwrap_err(),
                SrqReclaimError::NotHeld { wr_id: c.wr_id },
                "given back once"
            );
            twice += 1;
            let want = message(q, received[q]);
            assert_eq!(buf.len(), c.byte_len as usize, "length set to the bytes received");
            assert_eq!(buf.as_slice(), &want[..], "QP {q} message {}", received[q]);
            assert_eq!(buf.capacity(), CAP);
            received[q] += 1;
            s.srq.recv_buf(buf).unwrap();
        }
        assert!(
            start.elapsed() < TIMEOUT * 10,
            "stalled: sent {sent:?}, received {received:?}, send buffers back {sends_back}"
        );
    }
    assert_eq!(received, [N; 2], "every message once, in order per QP");
    assert_eq!(sends_back, 2 * N, "every send buffer back once");
    assert_eq!((foreign, twice), (2 * N, 2 * N));
    assert_eq!(s.srq.held_bufs(), RECVS, "every receive buffer reposted");
    assert_idle(&mut s.recv_cq);
    // With its QPs gone the SRQ can be destroyed, and gives back every buffer it held.
    let Setup {
        srq,
        receivers,
        senders,
        ..
    } = s;
    drop(senders);
    for qp in receivers {
        qp.destroy().expect("destroy QP");
    }
    let mut back = Vec::new();
    srq.destroy_reclaim(&mut back).expect("destroy SRQ");
    assert_eq!(back.len(), RECVS);
    let back_offsets: BTreeSet<usize> = back.iter().map(Buf::offset).collect();
    assert_eq!(back_offsets, offsets, "the same buffers, each once");
}

#[test]
fn completions_that_are_not_the_srqs_give_typed_errors() {
    let mut s = setup(16);
    let mut pool = bufs(&s.pd, 4, CAP);
    // A raw receive first: the SRQ hands it to the first message, the safe one to the next.
    let sge = s.mr.sge(65536, CAP as u32).unwrap();
    // SAFETY: the region outlives the request, and the bytes are not touched until then.
    unsafe { s.srq.post_recv(&[RecvWr::new(5, &[sge])]) }.unwrap();
    s.srq.recv_buf(bufs(&s.pd, 1, CAP).pop().unwrap()).unwrap();
    let sent = send(&mut s, &mut pool, 0, b"raw");
    send(&mut s, &mut pool, 1, b"safe");
    let mut wc = [WorkCompletion::default(); 4];
    let (mut seen, mut back) = (0, Vec::new());
    let start = Instant::now();
    while seen < 2 {
        for c in s.recv_cq.reap(&mut wc).iter() {
            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
            if seen == 0 {
                assert_eq!(c.wr_id, 5, "the SRQ's receives are taken in the order posted");
                assert_eq!(s.srq.reclaim(c).unwrap_err(), SrqReclaimError::NotSafeRecv { wr_id: 5 });
            } else {
                let buf = s.srq.reclaim(c).expect("the safe receive");
                assert_eq!((buf.as_slice(), c.qp_num), (&b"safe"[..], s.receivers[1].qpn()));
                assert_eq!(
                    s.srq.reclaim(c).unwrap_err(),
                    SrqReclaimError::NotHeld { wr_id: c.wr_id }
                );
                back.push(buf);
            }
            seen += 1;
        }
        assert!(start.elapsed() < TIMEOUT, "{seen} of 2 receives");
    }
    assert_eq!(s.srq.held_bufs(), 0);
    // A QP on the SRQ sends (its send CQ is not its receive CQ): that completion is not the
    // SRQ's either.
    s.senders[0].recv_buf(pool.pop().unwrap()).unwrap();
    let mut out = pool.pop().unwrap();
    out.fill_from(b"back").unwrap();
    s.receivers[0].send_buf(SendOp::Send, out).unwrap();
    let mut seen = 0;
    let start = Instant::now();
    while seen < 2 {
        for c in s.send_cq.reap(&mut wc).iter() {
            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
            assert_eq!(
                s.srq.reclaim(c).unwrap_err(),
                SrqReclaimError::ForeignQp { qp_num: c.qp_num },
                "{c:?}"
            );
            let back = s.receivers[0].reclaim(c).or_else(|| s.senders[0].reclaim(c));
            assert_eq!(back.expect("the send's or the receive's buffer").as_slice(), b"back");
            seen += 1;
        }
        assert!(start.elapsed() < TIMEOUT, "{seen} of 2 completions");
    }
    let err = SrqReclaimError::ForeignQp { qp_num: sent.qp_num };
    assert_eq!(
        err.to_string(),
        format!("QP {} does not receive from this SRQ", sent.qp_num)
    );

    // Full: refused with the buffer back, whether the SRQ's slots (as many as it had room
    // for when created) or the provider's ring (mlx5 keeps one WQE free) ran out first.
    let mut many = bufs(&s.pd, s.srq.max_wr() as usize + 1, CAP);
    let posted = post_until_full(&mut s.srq, &mut many);
    assert!(posted + 1 >= s.srq.max_wr() as usize, "{posted} of {}", s.srq.max_wr());
    assert_eq!(s.srq.held_bufs(), posted);
}

#[test]
fn flushes_and_destruction_give_buffers_back_or_keep_them_owned() {
    const K: usize = 16;
    let mut s = setup(K as u32);
    let mut pool = bufs(&s.pd, 4, CAP);
    let recv = bufs(&s.pd, K, CAP);
    let offsets: BTreeSet<usize> = recv.iter().map(Buf::offset).collect();
    for b in recv {
        s.srq.recv_buf(b).unwrap();
    }
    // A QP on the SRQ moved to ERR flushes none of the SRQ's receives: they are not its.
    s.receivers[1]
        .modify(&QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        })
        .unwrap();
    assert_idle(&mut s.recv_cq);
    assert_eq!(s.srq.held_bufs(), K);
    // The other QP still receives into them, and each completion gives its buffer back.
    let mut back = Vec::new();
    for seq in 0..4 {
        send(&mut s, &mut pool, 0, &message(0, seq));
    }
    let mut wc = [WorkCompletion::default(); 4];
    let start = Instant::now();
    while back.len() < 4 {
        let reaped = s.recv_cq.reap(&mut wc);
        s.srq.reclaim_all(&reaped, &mut back);
        assert!(start.elapsed() < TIMEOUT, "{} of 4 back", back.len());
    }
    for (seq, b) in back.iter().enumerate() {
        assert_eq!(b.as_slice(), message(0, seq as u64), "message {seq}");
    }
    assert_eq!(s.srq.held_bufs(), K - 4);
    // Three more received, then their QP destroyed before the completions were reaped: the
    // completions (rxe leaves them in the CQ; mlx5 scrubs them) give nothing back, and the
    // SRQ keeps the buffers.
    for seq in 4..7 {
        send(&mut s, &mut pool, 0, &message(0, seq));
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let receiver0 = s.receivers.remove(0);
    let qpn0 = receiver0.qpn();
    receiver0.destroy().expect("destroy QP");
    let left = match driver(&s.ctx) {
        // The kernel wrote them into the CQ ring, which nothing cleans.
        Driver::Rxe | Driver::Siw => 3,
        Driver::Mlx5 => 0, // the provider cleans a destroyed QP's completions from its CQs
    };
    let reaped = s.recv_cq.reap(&mut wc);
    assert_eq!(reaped.len(), left);
    for c in reaped.iter() {
        assert_eq!(
            s.srq.reclaim(c).unwrap_err(),
            SrqReclaimError::ForeignQp { qp_num: qpn0 },
            "its QP left the SRQ"
        );
    }
    assert_eq!(s.srq.held_bufs(), K - 4);
    // Refused while a QP uses it: the SRQ comes back with its buffers.
    let Setup { srq, receivers, .. } = s;
    let mut more = Vec::new();
    let (srq, err) = srq.destroy_reclaim(&mut more).expect_err("a QP uses the SRQ");
    assert_eq!(err.errno(), Some(nix::errno::Errno::EBUSY), "{err}");
    assert_eq!((more.len(), srq.held_bufs()), (0, K - 4));
    for qp in receivers {
        qp.destroy().expect("destroy QP");
    }
    srq.destroy_reclaim(&mut more).expect("destroy SRQ");
    assert_eq!(more.len(), K - 4, "every buffer still held comes back");
    let all: BTreeSet<usize> = back.iter().chain(&more).map(Buf::offset).collect();
    assert_eq!((all, back.len() + more.len()), (offsets, K), "each buffer once");
}

#[test]
fn dropping_the_srq_handle_keeps_its_buffers_until_the_kernel_destroyed_it() {
    let mut s = setup(8);
    let mut recv = bufs(&s.pd, 5, CAP);
    let probe = recv.pop().unwrap();
    for b in recv {
        s.srq.recv_buf(b).unwrap();
    }
    let Setup { srq, receivers, .. } = s;
    // The QPs keep the kernel SRQ; the buffers are parked with it until they are gone.
    drop(srq);
    drop(receivers);
    // The region is still alive through the one buffer kept here.
    assert_eq!(probe.capacity(), CAP);
}

/// Posts from `pool` until the SRQ refuses; the refusal is `QueueFull` with the buffer back.
/// Returns how many were posted.
fn post_until_full(srq: &mut Srq, pool: &mut Vec<Buf>) -> usize {
    let mut posted = 0;
    loop {
        match srq.recv_buf(pool.pop().expect("more buffers than room")) {
            Ok(()) => posted += 1,
            Err(refused) => {
                assert!(
                    matches!(
                        refused.error,
                        Error::WorkRequest {
                            reason: WrReject::QueueFull,
                            ..
                        }
                    ),
                    "{}",
                    refused.error
                );
                pool.push(refused.buf.expect("refused before it was queued: the buffer is back"));
                return posted;
            }
        }
    }
}

#[test]
fn a_post_passes_over_slots_whose_buffers_are_still_held() {
    let mut s = setup(8);
    let mut pool = bufs(&s.pd, 4, CAP);
    let mut recv = bufs(&s.pd, 64, CAP);
    // Fill the SRQ, let every receive take a message, and fill it again: every slot is held
    // (the first receives' completions are reaped but not reclaimed yet).
    let first = post_until_full(&mut s.srq, &mut recv);
    for seq in 0..first as u64 {
        send(&mut s, &mut pool, 0, &message(0, seq));
    }
    let mut wc = [WorkCompletion::default(); 64];
    let reaped = s.recv_cq.reap(&mut wc);
    assert_eq!(reaped.len(), first, "the sends completed, so did their receives");
    let second = post_until_full(&mut s.srq, &mut recv);
    assert_eq!(s.srq.held_bufs(), first + second);
    // The second receive's buffer back: its slot is free again, the first's still held.
    let completions: Vec<Completion<'_>> = reaped.iter().collect();
    let one = s.srq.reclaim(completions[1]).expect("the second receive's buffer");
    assert_eq!(one.as_slice(), message(0, 1));
    recv.push(one);
    // The next post passes over the held slots to the free one, under a new id.
    let third = post_until_full(&mut s.srq, &mut recv);
    assert!(third >= 1, "a slot was free");
    assert_eq!(
        s.srq.reclaim(completions[1]).unwrap_err(),
        SrqReclaimError::NotHeld {
            wr_id: completions[1].wr_id
        },
        "the old completion names the old id, not the new request in its slot"
    );
    // Every receive still posted takes a message and gives its buffer back once; the first
    // ones' completions give theirs.
    let mut back = Vec::new();
    for c in completions.iter().enumerate().filter(|&(k, _)| k != 1).map(|(_, c)| *c) {
        back.push(s.srq.reclaim(c).expect("a first receive's buffer"));
    }
    let pending = second + third;
    for seq in 0..pending as u64 {
        send(&mut s, &mut pool, 0, &message(0, 100 + seq));
    }
    let mut wc = [WorkCompletion::default(); 64];
    let reaped = s.recv_cq.reap(&mut wc);
    assert_eq!(reaped.len(), pending);
    for (seq, c) in reaped.iter().enumerate() {
        assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
        let b = s.srq.reclaim(c).expect("a posted receive's buffer");
        assert_eq!(b.as_slice(), message(0, 100 + seq as u64), "message {seq}");
        back.push(b);
    }
    assert_eq!(s.srq.held_bufs(), 0);
    let offsets: BTreeSet<usize> = back.iter().map(Buf::offset).collect();
    assert_eq!(offsets.len(), first + second + third - 1, "each buffer once");
}
