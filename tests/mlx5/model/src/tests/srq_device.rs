//! Shared receive queues in the device: receives taken along the SRQ's links, its limit
//! event, errors and hostile WQEs.

use super::context::ucontext;
use super::srq::{mlx5_srq, srq_cmd, SRQ_BUF, SRQ_DB};
use super::*;

/// Two senders with their own RQs, each connected to a receiver on one SRQ of 8 WQEs of one
/// data segment (32-byte WQEs at `SRQ_BUF`).
struct SrqRig {
    env: Env,
    key: u32,
    srq: u32,
    senders: [(u32, u32); 2],
    receivers: [(u32, u32); 2],
    sent: [u16; 2],
    posted: u16,
}

const RIG_BUF: [u64; 4] = [QP_BUF, QP_BUF + 0x1000, QP_BUF + 0x2000, QP_BUF + 0x3000];
const RIG_DB: [u64; 4] = [DB + 64, DB + 128, DB + 192, DB + 256];

impl SrqRig {
    fn new(cqe_version: u8) -> Self {
        let env = Env::bare();
        let req = ucontext(|r| r.max_cqe_version = cqe_version);
        env.get_context(req.as_bytes()).unwrap();
        let pd = env.alloc_pd();
        let (_, key) = env.reg_mr(pd, DATA, 0x8000, 0xf).unwrap();
        let cq = env.create_cq(63, CQ_BUF, DB).unwrap();
        let srq = env.create_srq(srq_cmd(pd, 7, 1), mlx5_srq().as_bytes()).unwrap();
        let uidx = |i: u32| if cqe_version == 1 { 10 + i } else { abi::DEFAULT_UIDX };
        let mut qps = Vec::new();
        for i in 0..4u32 {
            let qp = if i < 2 {
                let mut u = Env::mlx5_qp(RIG_BUF[i as usize], RIG_DB[i as usize], uidx(i));
                (u.rq_wqe_count, u.rq_wqe_shift) = (0, 0);
                let mut core = Env::qp_cmd(pd, cq, abi::qpt::RC);
                core.max_recv_wr = 0;
                env.create_qp_with(core, u.as_bytes())
            } else {
                env.create_srq_qp(pd, cq, srq, RIG_BUF[i as usize], RIG_DB[i as usize], uidx(i))
            };
            qps.push(qp.unwrap());
        }
        for i in 0..2 {
            env.connect(qps[i].0, qps[i + 2].1, 0);
            env.connect(qps[i + 2].0, qps[i].1, 0);
        }
        // libmlx5's free list at creation: WQE i links to i + 1.
        for i in 0..8u16 {
            env.mem
                .write(SRQ_BUF + u64::from(i) * 32 + 2, &((i + 1) % 8).to_be_bytes())
                .unwrap();
        }
        Self {
            env,
            key,
            srq,
            senders: [qps[0], qps[1]],
            receivers: [qps[2], qps[3]],
            sent: [0; 2],
            posted: 0,
        }
    }

    /// Writes SRQ WQE `index` (a receive of `len` bytes at `addr`) and bumps the doorbell
    /// record's count of posted WQEs.
    fn post_srq(&mut self, index: u16, addr: u64, len: u32) {
        let at = SRQ_BUF + u64::from(index) * 32;
        self.env.mem.write(at + 16, &data_seg(len, self.key, addr)).unwrap();
        self.posted = self.posted.wrapping_add(1);
        self.env
            .mem
            .write(SRQ_DB, &u32::from(self.posted).to_be_bytes())
            .unwrap();
    }

    /// Links SRQ WQE `from` to `to` (what libmlx5 does when a WQE returns to the free list).
    fn link(&self, from: u16, to: u16) {
        self.env
            .mem
            .write(SRQ_BUF + u64::from(from) * 32 + 2, &to.to_be_bytes())
            .unwrap();
    }

    /// A signaled SEND of `len` bytes at `addr` from sender `i`.
    fn send(&mut self, i: usize, addr: u64, len: u32) {
        let idx = self.sent[i];
        let mut wqe = [0u8; 64];
        wqe[0..4].copy_from_slice(&((u32::from(idx) << 8) | u32::from(abi::opcode::SEND)).to_be_bytes());
        wqe[4..8].copy_from_slice(&((self.senders[i].1 << 8) | 2).to_be_bytes());
        wqe[11] = abi::WQE_CTRL_CQ_UPDATE;
        wqe[16..32].copy_from_slice(&data_seg(len, self.key, addr));
        let sq = RIG_BUF[i];
        self.env.mem.write(sq + u64::from(idx % 16) * 64, &wqe).unwrap();
        self.sent[i] += 1;
        self.env
            .mem
            .write(RIG_DB[i] + abi::SND_DBR, &u32::from(self.sent[i]).to_be_bytes())
            .unwrap();
    }

    /// The CQEs written: (opcode, syndrome, qpn, srqn_uidx, wqe_counter, byte_cnt).
    fn cqes(&self) -> Vec<(u8, u8, u32, u32, u16, u32)> {
        let mut out = Vec::new();
        for slot in 0..64u64 {
            let mut c = [0u8; 64];
            self.env.mem.read(CQ_BUF + slot * 64, &mut c).unwrap();
            if c[56..60] == [0; 4] {
                break;
            }
            let be32 = |at: usize| u32::from_be_bytes(c[at..at + 4].try_into().unwrap());
            out.push((
                c[63] >> 4,
                c[55],
                be32(56) & 0xff_ffff,
                be32(32) & 0xff_ffff,
                u16::from_be_bytes([c[60], c[61]]),
                be32(44),
            ));
        }
        out
    }

    /// The receive CQEs: (qpn, srqn_uidx, wqe_counter, byte_cnt).
    fn receives(&self) -> Vec<(u32, u32, u16, u32)> {
        self.cqes()
            .into_iter()
            .filter(|c| c.0 == abi::cqe_op::RESP_SEND)
            .map(|c| (c.2, c.3, c.4, c.5))
            .collect()
    }
}

#[test]
fn sends_to_two_qps_take_the_srq_wqes_along_their_links() {
    let mut r = SrqRig::new(1);
    r.env.mem.write(DATA, b"abcdefgh").unwrap();
    // Free list 0 -> 5 -> 2: the device takes WQE 0, then the one 0 links to, and so on.
    r.link(0, 5);
    r.link(5, 2);
    r.post_srq(0, DATA + 0x1000, 16);
    r.post_srq(5, DATA + 0x1100, 16);
    r.post_srq(2, DATA + 0x1200, 16);
    for (i, at, len) in [(0, 0, 3), (1, 3, 4), (0, 7, 1)] {
        r.send(i, DATA + at, len);
        r.env.drive();
    }
    let rx = [r.receivers[0].1, r.receivers[1].1];
    // CQE version 1: srqn_uidx is the receiving QP's user index (12, 13).
    assert_eq!(
        r.receives(),
        vec![(rx[0], 12, 0, 3), (rx[1], 13, 5, 4), (rx[0], 12, 2, 1)]
    );
    let mut got = [0u8; 4];
    r.env.mem.read(DATA + 0x1000, &mut got[..3]).unwrap();
    assert_eq!(&got[..3], b"abc");
    r.env.mem.read(DATA + 0x1100, &mut got).unwrap();
    assert_eq!(&got, b"defg");
    r.env.mem.read(DATA + 0x1200, &mut got[..1]).unwrap();
    assert_eq!(&got[..1], b"h");
    assert_eq!(r.env.mem.stray(), 0);
}

#[test]
fn with_cqe_version_0_a_receive_cqe_carries_the_srqn() {
    let mut r = SrqRig::new(0);
    r.post_srq(0, DATA + 0x1000, 16);
    r.send(1, DATA, 8);
    r.env.drive();
    let srqn = r.env.model.lock().unwrap().srqs.get(r.srq).unwrap().srqn;
    assert_eq!(r.receives(), vec![(r.receivers[1].1, srqn, 0, 8)]);
}

#[test]
fn an_empty_srq_answers_rnr() {
    let mut r = SrqRig::new(1);
    r.send(0, DATA, 8);
    r.env.drive();
    // rnr_retry 0: the sender fails at once; nothing was received.
    let c = r.cqes();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!((c[0].0, c[0].1), (abi::cqe_op::REQ_ERR, abi::syndrome::RNR_RETRY_EXC));
}

#[test]
fn the_srq_limit_event_fires_once_when_the_wqes_left_drop_below_it() {
    let mut r = SrqRig::new(1);
    for i in 0..4 {
        r.post_srq(i, DATA + 0x1000 + u64::from(i) * 0x100, 16);
    }
    r.env.modify_srq(r.srq, abi::SRQ_ATTR_LIMIT, 2).unwrap();
    // 4 posted: 3 left, then 2 (not below 2), then 1: the event, once.
    r.send(0, DATA, 8);
    r.send(0, DATA, 8);
    r.env.drive();
    assert_eq!(r.env.async_events(), vec![]);
    r.send(1, DATA, 8);
    r.env.drive();
    let limit = (0x5, abi::event::SRQ_LIMIT_REACHED);
    assert_eq!(r.env.async_events(), vec![limit]);
    // Disarmed: QUERY_SRQ reports 0 and the last receive raises nothing.
    assert_eq!(r.env.query_srq(r.srq).unwrap().srq_limit, 0);
    r.send(1, DATA, 8);
    r.env.drive();
    assert_eq!(r.env.async_events(), vec![limit]);
    assert_eq!(r.receives().len(), 4);
    // DESTROY_SRQ counts the event once the client has read it.
    r.env.model.lock().unwrap().srqs.get_mut(r.srq).unwrap().async_events = 1;
    for qp in r.receivers {
        let d = abi::DestroyObj {
            response: RESP,
            handle: qp.0,
            reserved: 0,
        };
        r.env.write(cmd::DESTROY_QP, d.as_bytes(), &[], 1).unwrap();
    }
    assert_eq!(r.env.destroy_srq(r.srq), Ok(1));
}

#[test]
fn events_read_counts_srq_events_for_destroy_srq() {
    let r = SrqRig::new(1);
    let ev = abi::AsyncEventDesc {
        element: 0x5,
        event_type: abi::event::SRQ_LIMIT_REACHED,
        reserved: 0,
    };
    let fd = r.env.model.lock().unwrap().contexts[&CTX].async_fd.unwrap();
    r.env.model.lock().unwrap().events_read(fd, ev.as_bytes());
    assert_eq!(r.env.model.lock().unwrap().srqs.get(r.srq).unwrap().async_events, 1);
}

#[test]
fn a_qp_on_the_srq_moved_to_err_flushes_nothing_of_the_srq() {
    let mut r = SrqRig::new(1);
    r.post_srq(0, DATA + 0x1000, 16);
    r.post_srq(1, DATA + 0x1100, 16);
    let rx0 = r.receivers[0].0;
    r.env
        .modify(rx0, |m| (m.attr_mask, m.qp_state) = (qp_attr::STATE, qps::ERR))
        .unwrap();
    r.env.drive();
    assert_eq!(r.cqes(), vec![]);
    // The other QP still receives into both WQEs.
    r.send(1, DATA, 8);
    r.send(1, DATA, 8);
    r.env.drive();
    assert_eq!(r.receives().iter().map(|c| c.2).collect::<Vec<_>>(), [0, 1]);
}

#[test]
fn a_receive_too_small_completes_its_srq_wqe_in_error() {
    let mut r = SrqRig::new(1);
    r.post_srq(0, DATA + 0x1000, 4);
    r.send(0, DATA, 8);
    r.env.drive();
    let c = r.cqes();
    let resp_err = c.iter().find(|c| c.0 == abi::cqe_op::RESP_ERR).copied();
    // Local length error on the receiver, WQE index 0 (libmlx5 returns it to the free list).
    assert_eq!(
        resp_err.map(|c| (c.1, c.2, c.3, c.4)),
        Some((abi::syndrome::LOCAL_LENGTH, r.receivers[0].1, 12, 0))
    );
}

#[test]
fn an_srq_doorbell_beyond_the_ring_raises_srq_err() {
    let mut r = SrqRig::new(1);
    r.env.mem.write(SRQ_DB, &9u32.to_be_bytes()).unwrap();
    r.send(0, DATA, 8);
    r.env.drive();
    assert_eq!(r.env.async_events(), vec![(0x5, abi::event::SRQ_ERR)]);
    assert!(r.receives().is_empty());
    assert_eq!(r.env.mem.stray(), 0);
}

#[test]
fn hostile_srq_wqes_links_and_doorbells_never_panic_or_stray() {
    let mut rng = uverbs::testing::Rng::new(0x5a5a);
    for round in 0..100 {
        let mut r = SrqRig::new(1);
        for _ in 0..6 {
            // A WQE of noise (its link and segments included), sometimes a plausible one.
            let index = rng.below(8) as u16;
            let mut junk = [0u8; 32];
            for b in junk.chunks_mut(8) {
                b.copy_from_slice(&rng.next_u64().to_ne_bytes());
            }
            if rng.below(2) == 0 {
                junk[16..32].copy_from_slice(&data_seg(rng.below(64) as u32, r.key, DATA + 0x1000));
            }
            r.env.mem.write(SRQ_BUF + u64::from(index) * 32, &junk).unwrap();
            let count = match rng.below(4) {
                0 => rng.next_u64() as u32,
                _ => u32::from(r.posted.wrapping_add(rng.below(3) as u16)),
            };
            r.env.mem.write(SRQ_DB, &count.to_be_bytes()).unwrap();
            if rng.below(3) == 0 {
                r.env
                    .modify_srq(r.srq, abi::SRQ_ATTR_LIMIT, rng.below(8) as u32)
                    .unwrap();
            }
            r.send(rng.below(2) as usize, DATA, rng.below(48) as u32);
            r.env.drive();
        }
        assert_eq!(r.env.mem.stray(), 0, "round {round}");
    }
}
