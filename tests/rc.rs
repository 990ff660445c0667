//! RC data path on a real device: sends with exact accounting, immediate data, RDMA write and
//! read, error completions, inline sends, poll sizes, and teardown in any order.

mod common;

use common::*;
use std::collections::HashSet;
use uverbs::*;

const MSG: usize = 64;

fn fill(buf: &mut [u8], seq: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (seq as u8).wrapping_mul(31).wrapping_add(i as u8);
    }
    buf[..8].copy_from_slice(&seq.to_le_bytes());
}

fn check(buf: &[u8], seq: u64) {
    let mut want = vec![0u8; buf.len()];
    fill(&mut want, seq);
    assert_eq!(buf, &want[..], "payload of message {seq}");
}

#[test]
fn hundred_thousand_sends_complete_exactly_once() {
    const TOTAL: u64 = 100_000;
    const WINDOW: u64 = 64;
    const RECV_DEPTH: u64 = 128;
    let mut p = Pair::new();
    let (a_qpn, b_qpn) = (p.a.qp.qpn(), p.b.qp.qpn());
    let recv_base = 512 * 1024;

    // Receive slots on B: slot i at recv_base + i*MSG, wr_id = sequence number.
    let mut next_recv = 0u64;
    let post_recv = |b: &mut End, seq: u64| {
        let sge =
            b.mr.sge(recv_base + (seq % RECV_DEPTH) as usize * MSG, MSG as u32)
                .unwrap();
        // SAFETY: the slot is not touched until its completion is polled.
        unsafe { b.qp.post_recv(&[RecvWr::new(seq, &[sge])]) }.expect("post_recv");
    };
    while next_recv < RECV_DEPTH {
        post_recv(&mut p.b, next_recv);
        next_recv += 1;
    }

    let (mut sent, mut send_done, mut recv_done) = (0u64, 0u64, 0u64);
    let mut seen_send = HashSet::new();
    let mut wc = [WorkCompletion::default(); 32];
    let start = std::time::Instant::now();
    while recv_done < TOTAL || send_done < TOTAL {
        // Keep WINDOW sends in flight, never more than the receives posted.
        while sent < TOTAL && sent - send_done < WINDOW && sent < recv_done + RECV_DEPTH {
            let off = (sent % WINDOW) as usize * MSG;
            fill(&mut p.a.mr.bytes_mut()[off..off + MSG], sent);
            let sge = p.a.mr.sge(off, MSG as u32).unwrap();
            // SAFETY: the slot is rewritten only after this send's completion.
            unsafe { p.a.qp.post_send(&[SendWr::new(sent, SendOp::Send, &[sge])]) }.expect("post_send");
            sent += 1;
        }
        let n = p.a.cq.poll(&mut wc);
        for c in &wc[..n] {
            assert_eq!((c.status, c.opcode), (WcStatus::SUCCESS, WcOpcode::SEND), "{c:?}");
            assert_eq!((c.qp_num, c.byte_len), (a_qpn, sent_byte_len(&p.ctx, MSG)), "{c:?}");
            assert_eq!(c.wr_id, send_done, "send completions arrive in order");
            assert!(seen_send.insert(c.wr_id), "send {} completed twice", c.wr_id);
            send_done += 1;
        }
        let n = p.b.cq.poll(&mut wc);
        for c in &wc[..n] {
            assert_eq!((c.status, c.opcode), (WcStatus::SUCCESS, WcOpcode::RECV), "{c:?}");
            assert_eq!(
                (c.qp_num, c.byte_len as usize, c.src_qp),
                (b_qpn, MSG, rc_recv_src_qp(&p.ctx, a_qpn)),
                "{c:?}"
            );
            assert_eq!(c.wr_id, recv_done, "receives complete in order, once each");
            let off = recv_base + (c.wr_id % RECV_DEPTH) as usize * MSG;
            check(&p.b.mr.bytes()[off..off + MSG], c.wr_id);
            recv_done += 1;
        }
        for _ in 0..n {
            if next_recv < TOTAL {
                post_recv(&mut p.b, next_recv);
                next_recv += 1;
            }
        }
        assert!(
            start.elapsed() < 10 * TIMEOUT,
            "stalled at sent={sent} send_done={send_done} recv_done={recv_done}"
        );
    }
    assert_eq!((send_done, recv_done, seen_send.len() as u64), (TOTAL, TOTAL, TOTAL));
    assert_idle(&mut p.a.cq);
    assert_idle(&mut p.b.cq);
    println!(
        "{TOTAL} sends: {TOTAL} send and {TOTAL} receive completions, 0 lost, 0 duplicated, in {:?}",
        start.elapsed()
    );
}

#[test]
fn send_with_imm_carries_flag_and_value() {
    let mut p = Pair::new();
    let rsge = p.b.mr.sge(0, 32).unwrap();
    // SAFETY: buffers untouched until completion.
    unsafe { p.b.qp.post_recv(&[RecvWr::new(7, &[rsge])]) }.unwrap();
    p.a.mr.bytes_mut()[..16].copy_from_slice(b"immediate hello!");
    let sge = p.a.mr.sge(0, 16).unwrap();
    let sges = [sge];
    let wr = SendWr::new(1, SendOp::SendWithImm { imm: 0xdead_beef }, &sges);
    if driver(&p.ctx) == Driver::Siw {
        // siw's user-space interface has no immediate data: refused before the kernel.
        match unsafe { p.a.qp.post_send(&[wr]) } {
            Err(Error::WorkRequest { reason, .. }) => assert_eq!(reason, WrReject::OpcodeNotSupported),
            other => panic!("siw posted SEND with immediate: {other:?}"),
        }
        assert_idle(&mut p.a.cq);
        return;
    }
    unsafe { p.a.qp.post_send(&[wr]) }.unwrap();
    let s = poll_n(&mut p.a.cq, 1, 1)[0];
    assert_eq!((s.status, s.opcode, s.wr_id), (WcStatus::SUCCESS, WcOpcode::SEND, 1));
    // rxe flags the send completion WITH_IMM, with imm_data 0: `imm()` is for receives.
    assert_eq!((s.wc_flags, s.imm_data, s.imm()), (WcFlags::WITH_IMM, 0, None), "{s:?}");
    let r = poll_n(&mut p.b.cq, 1, 1)[0];
    assert_eq!(
        (r.status, r.opcode, r.wr_id, r.byte_len),
        (WcStatus::SUCCESS, WcOpcode::RECV, 7, 16)
    );
    assert_eq!(r.wc_flags, WcFlags::WITH_IMM | rc_recv_grh(&p.ctx), "{r:?}");
    assert_eq!(
        r.imm_data,
        0xdead_beefu32.to_be(),
        "host order in the request, network order in the completion's raw field"
    );
    assert_eq!(r.imm(), Some(0xdead_beef));
    assert_eq!(&p.b.mr.bytes()[..16], b"immediate hello!");
}

#[test]
fn rdma_write_write_with_imm_and_read_move_the_bytes() {
    let mut p = Pair::new();
    let remote = |off: u64| Remote {
        addr: p.b.mr.addr() + off,
        rkey: p.b.mr.rkey(),
    };
    let (w, wi, rd) = (remote(4096), remote(8192), remote(12288));

    // RDMA write: 1000 bytes into B at 4096; B sees no completion.
    for (i, b) in p.a.mr.bytes_mut()[..1000].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let sge = p.a.mr.sge(0, 1000).unwrap();
    unsafe { p.a.qp.post_send(&[SendWr::new(10, SendOp::RdmaWrite(w), &[sge])]) }.unwrap();
    let c = poll_n(&mut p.a.cq, 1, 4)[0];
    assert_eq!(
        (c.status, c.opcode, c.wr_id, c.byte_len),
        (WcStatus::SUCCESS, WcOpcode::RDMA_WRITE, 10, sent_byte_len(&p.ctx, 1000))
    );
    await_placement(&mut p);
    assert_eq!(&p.b.mr.bytes()[4096..5096], &p.a.mr.bytes()[..1000]);
    assert_idle(&mut p.b.cq);

    // Write with immediate: consumes a receive at B, which reports RECV_RDMA_WITH_IMM. siw
    // has no immediate data: refused before the kernel.
    if driver(&p.ctx) == Driver::Siw {
        let sge = [p.a.mr.sge(2000, 100).unwrap()];
        match unsafe {
            p.a.qp
                .post_send(&[SendWr::new(11, SendOp::RdmaWriteWithImm(wi, 42), &sge)])
        } {
            Err(Error::WorkRequest { reason, .. }) => assert_eq!(reason, WrReject::OpcodeNotSupported),
            other => panic!("siw posted WRITE with immediate: {other:?}"),
        }
    } else {
        write_with_imm(&mut p, wi);
    }

    // Read: B's bytes at 12288 land in A at 3000.
    for (i, b) in p.b.mr.bytes_mut()[12288..12288 + 777].iter_mut().enumerate() {
        *b = (i * 7 % 256) as u8;
    }
    let sge = p.a.mr.sge(3000, 777).unwrap();
    unsafe { p.a.qp.post_send(&[SendWr::new(12, SendOp::RdmaRead(rd), &[sge])]) }.unwrap();
    let c = poll_n(&mut p.a.cq, 1, 4)[0];
    assert_eq!(
        (c.status, c.opcode, c.wr_id, c.byte_len),
        (WcStatus::SUCCESS, WcOpcode::RDMA_READ, 12, 777)
    );
    assert_eq!(&p.a.mr.bytes()[3000..3777], &p.b.mr.bytes()[12288..12288 + 777]);
}

/// A WRITE with immediate of 100 bytes into `wi` consumes a receive at B, which reports
/// RECV_RDMA_WITH_IMM with the value.
fn write_with_imm(p: &mut Pair, wi: Remote) {
    let rsge = p.b.mr.sge(0, 0).unwrap();
    unsafe { p.b.qp.post_recv(&[RecvWr::new(77, &[rsge])]) }.unwrap();
    p.a.mr.bytes_mut()[2000..2100].fill(0x5a);
    let sge = p.a.mr.sge(2000, 100).unwrap();
    let sges = [sge];
    let wr = SendWr::new(11, SendOp::RdmaWriteWithImm(wi, 42), &sges);
    unsafe { p.a.qp.post_send(&[wr]) }.unwrap();
    let c = poll_n(&mut p.a.cq, 1, 4)[0];
    assert_eq!(
        (c.status, c.opcode, c.wr_id),
        (WcStatus::SUCCESS, WcOpcode::RDMA_WRITE, 11)
    );
    let r = poll_n(&mut p.b.cq, 1, 4)[0];
    assert_eq!(
        (r.status, r.opcode, r.wr_id, r.byte_len),
        (WcStatus::SUCCESS, WcOpcode::RECV_RDMA_WITH_IMM, 77, 100)
    );
    assert_eq!(r.imm(), Some(42));
    assert!(p.b.mr.bytes()[8192..8292].iter().all(|&b| b == 0x5a));
}

#[test]
fn write_to_mr_without_remote_write_is_rem_access_err() {
    let mut p = Pair::new();
    let read_only =
        p.pd.alloc_mr(4096, LocalAccess::LOCAL_WRITE | LocalAccess::REMOTE_READ)
            .unwrap();
    let sge = p.a.mr.sge(0, 64).unwrap();
    let target = Remote {
        addr: read_only.addr(),
        rkey: read_only.rkey(),
    };
    if driver(&p.ctx) == Driver::Siw {
        // siw completes a WRITE once sent (docs/kernel-facts.md): SUCCESS at the requester;
        // the peer refuses the placement and ends the connection with a TERMINATE, so a READ
        // posted behind the WRITE is never answered: it completes in error.
        let readable = Remote {
            addr: p.b.mr.addr(),
            rkey: p.b.mr.rkey(),
        };
        let into = p.a.mr.sge(64, 64).unwrap();
        let wrs = [
            SendWr::new(99, SendOp::RdmaWrite(target), std::slice::from_ref(&sge)),
            SendWr::new(100, SendOp::RdmaRead(readable), std::slice::from_ref(&into)),
        ];
        unsafe { p.a.qp.post_send(&wrs) }.unwrap();
        let c = poll_n(&mut p.a.cq, 2, 4);
        assert_eq!(
            (c[0].wr_id, c[0].status, c[0].qp_num),
            (99, WcStatus::SUCCESS, p.a.qp.qpn()),
            "{c:?}"
        );
        assert_eq!(c[1].wr_id, 100, "{c:?}");
        assert_ne!(c[1].status, WcStatus::SUCCESS, "the connection ended: {c:?}");
        assert!(read_only.as_slice().iter().all(|&b| b == 0), "nothing written");
        return;
    }
    unsafe { p.a.qp.post_send(&[SendWr::new(99, SendOp::RdmaWrite(target), &[sge])]) }.unwrap();
    let c = poll_n(&mut p.a.cq, 1, 4)[0];
    assert_eq!(
        (c.wr_id, c.status, c.qp_num),
        (99, WcStatus::REM_ACCESS_ERR, p.a.qp.qpn()),
        "{c:?}"
    );
    assert!(read_only.as_slice().iter().all(|&b| b == 0), "nothing written");
}

#[test]
fn qp_moved_to_err_flushes_each_receive_once() {
    let mut p = Pair::new();
    const N: u64 = 50;
    for i in 0..N {
        let sge = p.b.mr.sge(i as usize * 64, 64).unwrap();
        unsafe { p.b.qp.post_recv(&[RecvWr::new(1000 + i, &[sge])]) }.unwrap();
    }
    p.b.qp
        .modify(&QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        })
        .unwrap();
    let wcs = poll_n(&mut p.b.cq, N as usize, 16);
    let ids: Vec<u64> = wcs.iter().map(|c| c.wr_id).collect();
    assert_eq!(
        ids,
        (1000..1000 + N).collect::<Vec<_>>(),
        "each receive flushed once, in order"
    );
    for c in &wcs {
        assert_eq!((c.status, c.qp_num), (WcStatus::WR_FLUSH_ERR, p.b.qp.qpn()), "{c:?}");
    }
    assert_idle(&mut p.b.cq);
    // On siw, whose QUERY_QP leaves the state out, the state this side tracked.
    assert_eq!(p.b.qp.query().unwrap().attr.state, Some(QpState::Err));
    // A receive posted after the flush is only written to the ring: rxe 6.1 (and C rdma-core
    // on it) never completes it, not even flushed (docs/kernel-facts.md). mlx5 hardware
    // executes the doorbell of a QP in error and flushes it at once, as the verbs spec says.
    let sge = p.b.mr.sge(0, 64).unwrap();
    unsafe { p.b.qp.post_recv(&[RecvWr::new(2000, &[sge])]) }.unwrap();
    if driver(&p.ctx) == Driver::Mlx5 {
        let c = poll_n(&mut p.b.cq, 1, 4)[0];
        assert_eq!((c.wr_id, c.status), (2000, WcStatus::WR_FLUSH_ERR), "{c:?}");
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_idle(&mut p.b.cq);
}

#[test]
fn inline_sends_arrive_and_free_the_buffer_at_once() {
    let mut p = Pair::new();
    let max_inline = p.a.qp.cap().max_inline_data;
    assert!(max_inline >= 64, "granted inline {max_inline}");
    for i in 0..10u64 {
        let sge = p.b.mr.sge(i as usize * 128, 128).unwrap();
        unsafe { p.b.qp.post_recv(&[RecvWr::new(i, &[sge])]) }.unwrap();
    }
    // Inline data comes from ordinary memory with no lkey, reused right after posting.
    let mut scratch = [0u8; 64];
    for i in 0..10u64 {
        scratch.fill(i as u8 + 1);
        let sge = Sge {
            addr: scratch.as_ptr() as u64,
            length: 64,
            lkey: 0,
        };
        let sges = [sge];
        let wr = SendWr::new(i, SendOp::Send, &sges).with(SendFlags::INLINE);
        unsafe { p.a.qp.post_send(&[wr]) }.unwrap();
        scratch.fill(0xee);
    }
    for c in poll_n(&mut p.a.cq, 10, 16) {
        assert_eq!(
            (c.status, c.opcode, c.byte_len),
            (WcStatus::SUCCESS, WcOpcode::SEND, sent_byte_len(&p.ctx, 64)),
            "{c:?}"
        );
    }
    for c in poll_n(&mut p.b.cq, 10, 16) {
        assert_eq!((c.status, c.byte_len), (WcStatus::SUCCESS, 64), "{c:?}");
        let off = c.wr_id as usize * 128;
        assert!(
            p.b.mr.bytes()[off..off + 64].iter().all(|&b| b == c.wr_id as u8 + 1),
            "message {}",
            c.wr_id
        );
    }
    // Too long for the queue: rejected before it reaches the ring, nothing posted.
    let big = vec![0u8; max_inline as usize + 1];
    let sge = Sge {
        addr: big.as_ptr() as u64,
        length: big.len() as u32,
        lkey: 0,
    };
    let sges = [sge];
    let wr = SendWr::new(50, SendOp::Send, &sges).with(SendFlags::INLINE);
    match unsafe { p.a.qp.post_send(&[wr]) } {
        Err(Error::WorkRequest {
            index: 0,
            reason: WrReject::InlineTooLong { .. },
            ..
        }) => {}
        other => panic!("expected InlineTooLong, got {other:?}"),
    }
    assert_idle(&mut p.a.cq);
}

#[test]
fn poll_returns_what_is_ready_up_to_the_slice() {
    let mut p = Pair::new();
    let sge = p.a.mr.sge(0, 8).unwrap();
    // One list of 20 signaled writes, one doorbell.
    let wrs: Vec<_> = (0..20)
        .map(|i| {
            SendWr::new(
                i,
                SendOp::RdmaWrite(Remote {
                    addr: p.b.mr.addr(),
                    rkey: p.b.mr.rkey(),
                }),
                std::slice::from_ref(&sge),
            )
        })
        .collect();
    unsafe { p.a.qp.post_send(&wrs) }.unwrap();
    let deadline = std::time::Instant::now() + TIMEOUT;
    // Give all 20 time to complete (loopback takes well under a millisecond each), then
    // poll 1, then 16, then ask for 64 and get the remaining 3.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let mut wc = [WorkCompletion::default(); 64];
    let mut got = Vec::new();
    for want in [1usize, 16, 64] {
        let n = loop {
            let n = p.a.cq.poll(&mut wc[..want]);
            if n > 0 || std::time::Instant::now() > deadline {
                break n;
            }
        };
        got.extend(wc[..n].iter().map(|c| c.wr_id));
        match want {
            1 => assert_eq!(n, 1),
            16 => assert_eq!(n, 16),
            _ => assert_eq!(n, 3, "only 3 left though 64 were asked for"),
        }
    }
    assert_eq!(got, (0..20).collect::<Vec<_>>());
    assert_eq!(p.a.cq.poll(&mut wc), 0);
}

#[test]
fn dropping_in_any_order_leaves_no_fd_or_mapping() {
    let before = kernel_footprint();
    {
        let p = Pair::new();
        let during = kernel_footprint();
        // rxe maps its 6 rings from the device file; mlx5's rings are user memory, and only
        // its UAR pages are mappings of the device.
        let maps = match driver(&p.ctx) {
            Driver::Rxe => 6,
            Driver::Mlx5 => 1,
            // Each QP's send and receive rings and each CQ's.
            Driver::Siw => 6,
        };
        assert!(
            !footprint_visible() || (during.0 >= before.0 + 2 && during.1 >= before.1 + maps),
            "device fd, async fd and {maps} mappings: {during:?}"
        );
        // CQs and the PD first, then the QPs and context: each object keeps what it needs.
        let Pair { ctx, pd, a, b, .. } = p;
        drop(a.cq);
        drop(pd);
        drop(ctx);
        drop(b.mr);
        drop(a.qp);
        drop(b.cq);
        drop(b.qp);
        drop(a.mr);
    }
    assert_eq!(kernel_footprint(), before, "after dropping QPs last");
    {
        let Pair { ctx, pd, a, b, .. } = Pair::new();
        drop(a.qp);
        drop(b.qp);
        drop(a.mr);
        drop(b.cq);
        drop(pd);
        drop(a.cq);
        drop(b.mr);
        drop(ctx);
    }
    assert_eq!(kernel_footprint(), before, "after dropping QPs first");
}

/// `Qp::send_room`: the send queue's depth on a fresh QP, less each request the device has not
/// completed. Sends to a peer without receives wait (RNR, retried forever) and keep their
/// slots until the peer posts receives; a full queue refuses the next request.
#[test]
fn send_room_counts_the_requests_the_device_still_holds() {
    let mut p = Pair::with(PairOpts {
        cap: QpCap {
            max_send_wr: 8,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..Default::default()
    });
    // The whole queue: at least the depth granted. rdma_rxe 6.1 reports the depth asked (8)
    // and makes a ring of 16 slots, 15 usable (docs/kernel-facts.md).
    let depth = p.a.qp.send_room();
    assert!(depth >= p.a.qp.cap().max_send_wr, "{depth} {:?}", p.a.qp.cap());
    if driver(&p.ctx) == Driver::Siw {
        // siw frees a slot when its kernel copies it, at the doorbell (docs/kernel-facts.md),
        // and a SEND without a receive ends an iWARP connection: posted with receives ready,
        // the queue's room is back once the doorbell returned.
        for i in 0..u64::from(depth) {
            let sge = p.b.mr.sge(i as usize * MSG, MSG as u32).unwrap();
            unsafe { p.b.qp.post_recv(&[RecvWr::new(i, &[sge])]) }.unwrap();
        }
        let sge = [p.a.mr.sge(0, MSG as u32).unwrap()];
        let sends: Vec<SendWr<'_>> = (0..u64::from(depth))
            .map(|i| SendWr::new(i, SendOp::Send, &sge))
            .collect();
        unsafe { p.a.qp.post_send(&sends) }.unwrap();
        let done = poll_n(&mut p.a.cq, depth as usize, 16);
        assert!(done.iter().all(|c| c.is_success()), "{done:?}");
        poll_n(&mut p.b.cq, depth as usize, 16);
        assert_eq!(p.a.qp.send_room(), depth, "all slots free once completed");
        return;
    }
    assert!(p.b.qp.cap().max_recv_wr >= depth, "{:?}", p.b.qp.cap());
    let sge = [p.a.mr.sge(0, MSG as u32).unwrap()];
    let sends =
        |ids: std::ops::Range<u64>| -> Vec<SendWr<'_>> { ids.map(|i| SendWr::new(i, SendOp::Send, &sge)).collect() };
    // SAFETY: the buffer is only read by the device, and outlives the QP's use of it.
    unsafe { p.a.qp.post_send(&sends(0..3)) }.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(p.a.qp.send_room(), depth - 3, "held while B has no receive");
    unsafe { p.a.qp.post_send(&sends(3..u64::from(depth))) }.unwrap();
    assert_eq!(p.a.qp.send_room(), 0);
    match unsafe { p.a.qp.post_send(&sends(99..100)) }.unwrap_err() {
        Error::WorkRequest { index, reason, .. } => assert_eq!((index, reason), (0, WrReject::QueueFull)),
        e => panic!("{e}"),
    }
    for i in 0..u64::from(depth) {
        let sge = p.b.mr.sge(i as usize * MSG, MSG as u32).unwrap();
        unsafe { p.b.qp.post_recv(&[RecvWr::new(i, &[sge])]) }.unwrap();
    }
    let done = poll_n(&mut p.a.cq, depth as usize, 16);
    assert!(done.iter().all(|c| c.is_success()), "{done:?}");
    poll_n(&mut p.b.cq, depth as usize, 16);
    assert_eq!(p.a.qp.send_room(), depth, "all slots free once completed");
}

/// On a QP created with `sq_sig_all`, unsignaled sends complete too (rxe's kernel completes
/// them itself; on mlx5 the provider asks for a CQE in every WQE, as libmlx5 does).
#[test]
fn sq_sig_all_completes_unsignaled_sends() {
    let mut p = Pair::with(PairOpts {
        sq_sig_all: true,
        ..Default::default()
    });
    const N: u64 = 4;
    for i in 0..N {
        let sge = p.b.mr.sge(i as usize * MSG, MSG as u32).unwrap();
        // SAFETY: B's memory is only written by the device until the receive completes.
        unsafe { p.b.qp.post_recv(&[RecvWr::new(i, &[sge])]) }.unwrap();
    }
    let sge = [p.a.mr.sge(0, MSG as u32).unwrap()];
    let wrs: Vec<SendWr<'_>> = (0..N)
        .map(|i| SendWr::new(i, SendOp::Send, &sge).set_flags(SendFlags::empty()))
        .collect();
    assert!(wrs.iter().all(|wr| !wr.flags.contains(SendFlags::SIGNALED)));
    // SAFETY: the buffer is only read by the device, and outlives the QP's use of it.
    unsafe { p.a.qp.post_send(&wrs) }.unwrap();
    let done = poll_n(&mut p.a.cq, N as usize, 8);
    assert_eq!(
        done.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (0..N).collect::<Vec<_>>()
    );
    assert!(done.iter().all(|c| c.is_success()), "{done:?}");
    poll_n(&mut p.b.cq, N as usize, 8);
    assert_idle(&mut p.a.cq);
}
