//! The device against well-formed and hostile WQEs and doorbells: data moved, CQEs written,
//! errors and flushes.

use super::*;

#[test]
fn a_send_moves_the_bytes_and_completes_on_both_sides() {
    let mut p = Pair::new(7);
    p.env.mem.write(DATA, b"hello").unwrap();
    p.recv(1, DATA + 0x1000, 64);
    p.post(0, abi::opcode::SEND, &data_seg(5, p.key, DATA), true);
    p.env.drive();
    let mut got = [0u8; 5];
    p.env.mem.read(DATA + 0x1000, &mut got).unwrap();
    assert_eq!(&got, b"hello");
    assert_eq!(p.cqes(), vec![(abi::cqe_op::RESP_SEND, 0, 5), (abi::cqe_op::REQ, 0, 0)]);
    assert_eq!(p.env.mem.stray(), 0);
}

#[test]
fn rdma_write_read_and_atomics_act_on_the_target() {
    let mut p = Pair::new(7);
    p.env.mem.write(DATA, &[7; 8]).unwrap();
    let mut segs = raddr_seg(DATA + 0x2000, p.key).to_vec();
    segs.extend_from_slice(&data_seg(8, p.key, DATA));
    p.post(0, abi::opcode::RDMA_WRITE, &segs, false);
    let mut segs = raddr_seg(DATA + 0x2000, p.key).to_vec();
    segs.extend_from_slice(&data_seg(8, p.key, DATA + 0x3000));
    p.post(0, abi::opcode::RDMA_READ, &segs, true);
    // FAA of 5 (big-endian in the WQE) on the host-order word at 0x4000 (starts at 10),
    // the original value to 0x4100 in host order.
    p.env.mem.write(DATA + 0x4000, &10u64.to_ne_bytes()).unwrap();
    let mut segs = raddr_seg(DATA + 0x4000, p.key).to_vec();
    segs.extend_from_slice(&5u64.to_be_bytes());
    segs.extend_from_slice(&[0; 8]);
    segs.extend_from_slice(&data_seg(8, p.key, DATA + 0x4100));
    p.post(0, abi::opcode::ATOMIC_FA, &segs, true);
    p.env.drive();
    let mut b = [0u8; 8];
    p.env.mem.read(DATA + 0x3000, &mut b).unwrap();
    assert_eq!(b, [7; 8]);
    p.env.mem.read(DATA + 0x4000, &mut b).unwrap();
    assert_eq!(u64::from_ne_bytes(b), 15);
    p.env.mem.read(DATA + 0x4100, &mut b).unwrap();
    assert_eq!(u64::from_ne_bytes(b), 10);
    assert_eq!(p.cqes(), vec![(0, 0, 8), (0, 0, 8)]);
}

#[test]
fn a_bad_rkey_is_remote_access_and_what_follows_is_flushed() {
    let mut p = Pair::new(7);
    let mut segs = raddr_seg(DATA, p.key ^ 0xff00).to_vec();
    segs.extend_from_slice(&data_seg(8, p.key, DATA));
    p.post(0, abi::opcode::RDMA_WRITE, &segs, false);
    p.post(0, abi::opcode::SEND, &data_seg(8, p.key, DATA), false);
    p.env.drive();
    let e = abi::cqe_op::REQ_ERR;
    assert_eq!(
        p.cqes(),
        vec![(e, abi::syndrome::REMOTE_ACCESS, 0), (e, abi::syndrome::WR_FLUSH, 0)]
    );
}

#[test]
fn a_bad_lkey_is_local_protection() {
    let mut p = Pair::new(7);
    p.post(0, abi::opcode::SEND, &data_seg(8, 0x4242, DATA), true);
    p.env.drive();
    assert_eq!(p.cqes(), vec![(abi::cqe_op::REQ_ERR, abi::syndrome::LOCAL_PROT, 0)]);
}

#[test]
fn no_receive_posted_exhausts_the_rnr_retries() {
    let mut p = Pair::new(0);
    p.post(0, abi::opcode::SEND, &data_seg(8, p.key, DATA), true);
    p.env.drive();
    assert_eq!(p.cqes(), vec![(abi::cqe_op::REQ_ERR, abi::syndrome::RNR_RETRY_EXC, 0)]);
}

#[test]
fn a_full_cq_raises_cq_err_and_is_not_overwritten() {
    let mut p = Pair::new(7);
    for _ in 0..17 {
        p.post(0, abi::opcode::NOP, &[], true);
        if p.posted[0] % 8 == 0 {
            p.env.drive();
        }
    }
    p.env.drive();
    let sinks = p.env.host.sinks.lock().unwrap();
    let events = sinks[0].0.lock().unwrap();
    assert_eq!(events.len(), 1);
    let ev = abi::AsyncEventDesc::read_from_bytes(&events[0]).unwrap();
    assert_eq!((ev.event_type, ev.element), (abi::event::CQ_ERR, 0xc0));
    // Counted when read, for DESTROY_CQ's response.
    let mut m = p.env.model.lock().unwrap();
    let fd = m.contexts[&CTX].async_fd.unwrap();
    m.events_read(fd, &events[0]);
    assert_eq!(m.cqs.iter().next().unwrap().1.async_events, 1);
}

/// The port GID of the harness's model (LID 7): fe80:: and the port GUID.
fn port_gid() -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
    g[8..].copy_from_slice(&0x0002_c903_0001_0007u64.to_be_bytes());
    g
}

/// A UD send's datagram segment (`mlx5_wqe_av`) to `dqpn` at LID 7 with `qkey`, service
/// level 5, and a GRH (traffic class 3, hop limit 64, flow label 0x12345, DGID the port's)
/// if `grh`; then one data segment.
fn ud_segs(qkey: u32, dqpn: u32, grh: bool, data: [u8; 16]) -> Vec<u8> {
    let mut av = [0u8; 48];
    av[0..4].copy_from_slice(&qkey.to_be_bytes());
    av[8..12].copy_from_slice(&(0x8000_0000 | dqpn).to_be_bytes());
    av[12] = 5;
    av[14..16].copy_from_slice(&7u16.to_be_bytes());
    if grh {
        av[26] = 3;
        av[27] = 64;
        av[28..32].copy_from_slice(&((1u32 << 30) | 0x1_2345).to_be_bytes());
        av[32..48].copy_from_slice(&port_gid());
    }
    let mut segs = av.to_vec();
    segs.extend_from_slice(&data);
    segs
}

#[test]
fn a_ud_send_lands_after_the_grh_room_with_its_source_in_the_cqe() {
    for grh in [false, true] {
        let mut p = Pair::ud(0x1111_1111);
        p.env.mem.write(DATA, &[0xab; 100]).unwrap();
        p.env.mem.write(DATA + 0x1000, &[0xee; 200]).unwrap();
        p.recv(1, DATA + 0x1000, 140);
        let segs = ud_segs(0x1111_1111, p.qpn[1], grh, data_seg(100, p.key, DATA));
        p.post(0, abi::opcode::SEND, &segs, true);
        p.env.drive();
        let cqes = p.raw_cqes();
        assert_eq!(cqes.len(), 2, "grh {grh}");
        let (req, resp) = if cqes[0][63] >> 4 == abi::cqe_op::REQ {
            (cqes[0], cqes[1])
        } else {
            (cqes[1], cqes[0])
        };
        assert_eq!(req[63] >> 4, abi::cqe_op::REQ);
        assert_eq!(resp[63] >> 4, abi::cqe_op::RESP_SEND);
        // byte_cnt counts the 40 GRH bytes; flags_rqpn: GRH type, SL 5, the source QPN.
        assert_eq!(u32::from_be_bytes(resp[44..48].try_into().unwrap()), 140);
        let flags_rqpn = u32::from_be_bytes(resp[24..28].try_into().unwrap());
        assert_eq!(flags_rqpn, (u32::from(grh) << 28) | (5 << 24) | p.qpn[0]);
        assert_eq!(u16::from_be_bytes([resp[22], resp[23]]), 7);
        let mut buf = [0u8; 200];
        p.env.mem.read(DATA + 0x1000, &mut buf).unwrap();
        assert_eq!(buf[40..140], [0xab; 100]);
        assert_eq!(buf[140..], [0xee; 60]);
        if grh {
            // IPv6 version 6, traffic class 3, flow label; PayLen 12 + 8 + 100 + 4; next
            // header 0x1b; hop limit; SGID fe80::<port GUID>; the DGID asked for.
            assert_eq!(buf[0..4], ((6u32 << 28) | (3 << 20) | 0x1_2345).to_be_bytes());
            assert_eq!(buf[4..8], [0, 124, 0x1b, 64]);
            assert_eq!(buf[8..24], port_gid());
            assert_eq!(buf[24..40], port_gid());
        } else {
            assert_eq!(buf[..40], [0xee; 40]);
        }
    }
}

#[test]
fn ud_sends_with_a_wrong_qkey_or_to_no_qp_are_dropped_and_still_complete() {
    let mut p = Pair::ud(0x1111_1111);
    p.recv(1, DATA + 0x1000, 100);
    let seg = data_seg(8, p.key, DATA);
    p.post(0, abi::opcode::SEND, &ud_segs(0x2222, p.qpn[1], false, seg), true);
    p.post(
        0,
        abi::opcode::SEND,
        &ud_segs(0x1111_1111, p.qpn[1] + 9, false, seg),
        true,
    );
    p.env.drive();
    // Both sends complete without error; nothing arrived, the receive is still posted.
    let req = (abi::cqe_op::REQ, 0, 0);
    assert_eq!(p.cqes(), vec![req, req]);
    // A controlled Q_Key (high bit set) sends the QP's own: this one arrives.
    p.post(0, abi::opcode::SEND, &ud_segs(0x8000_0000, p.qpn[1], false, seg), true);
    p.env.drive();
    assert!(p.cqes().contains(&(abi::cqe_op::RESP_SEND, 0, 48)));
}

#[test]
fn ud_qps_take_only_sends_and_messages_of_one_mtu() {
    let mut p = Pair::ud(7);
    // An RDMA write on a UD QP is a local QP operation error.
    let mut segs = raddr_seg(DATA, p.key).to_vec();
    segs.extend_from_slice(&data_seg(8, p.key, DATA));
    p.post(0, abi::opcode::RDMA_WRITE, &segs, true);
    p.env.drive();
    assert_eq!(p.cqes(), vec![(abi::cqe_op::REQ_ERR, abi::syndrome::LOCAL_QP_OP, 0)]);
    let mut p = Pair::ud(7);
    p.post(
        0,
        abi::opcode::SEND,
        &ud_segs(7, p.qpn[1], false, data_seg(4097, p.key, DATA)),
        true,
    );
    p.env.drive();
    assert_eq!(p.cqes(), vec![(abi::cqe_op::REQ_ERR, abi::syndrome::LOCAL_LENGTH, 0)]);
}

#[test]
fn moving_to_err_flushes_posted_receives() {
    let mut p = Pair::new(7);
    p.recv(1, DATA, 8);
    p.recv(1, DATA, 8);
    let qp1 = 1;
    p.env
        .modify(qp1, |m| (m.attr_mask, m.qp_state) = (qp_attr::STATE, qps::ERR))
        .unwrap();
    p.env.drive();
    let e = abi::cqe_op::RESP_ERR;
    assert_eq!(
        p.cqes(),
        vec![(e, abi::syndrome::WR_FLUSH, 0), (e, abi::syndrome::WR_FLUSH, 0)]
    );
}

#[test]
fn hostile_wqes_and_doorbells_never_panic_or_stray() {
    let mut rng = uverbs::testing::Rng::new(0x5eed);
    for round in 0..200 {
        assert_eq!(hostile_round(&mut || rng.next_u64()), 0, "round {round}");
    }
}
