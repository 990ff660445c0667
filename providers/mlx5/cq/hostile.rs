//! Hostile CQEs: bytes (from a fuzzer, or from a seeded generator in the unit test) become a
//! CQ ring, the QPs completing on it, and a sequence of moves by the poster and by a device
//! that lies: CQEs of random bytes (compressed and inline-scatter formats, opcodes never asked
//! for, unknown user indices, `wqe_counter`s naming nothing outstanding), entries written out of
//! order or over unpolled ones, scrubs and resets between polls. The real ring, poll, CQE
//! decoder and `wr_id` tables (`cq.rs`, `cqe.rs`, `qp/shared.rs`) run against it; the harness
//! checks that every completion is either a typed error (`GENERAL_ERR` with a `vendor_err`
//! above 0xff, no `wr_id`) or carries the `wr_id` of a request that was outstanding on its
//! QP, that the consumer index record follows the ring, and that nothing panics (a panic is a
//! finding, as is an access outside the ring under AddressSanitizer).
//!
//! Used by the unit test below and by the cargo-fuzz target `fuzz/fuzz_targets/mlx5_cqe.rs`,
//! which reaches [`run`] as `uverbs::testing::mlx5_cqes::run` (features `test-support` and
//! `mlx5`).

use super::super::cqe::{opcode, CQE_SIZE, OP_OWN};
use super::super::mem::DbPages;
use super::super::qp::QpShared;
use super::{poll_ring, CqShared, Ring, SET_CI};
use crate::testing::FuzzInput;
use crate::wc::{WcStatus, WorkCompletion};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What a run saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Inputs run.
    pub cases: u64,
    /// CQEs of random bytes the device wrote.
    pub hostile_cqes: u64,
    /// Well-formed CQEs the device wrote for outstanding requests.
    pub wellformed_cqes: u64,
    /// Completions polled that are typed errors.
    pub typed_errors: u64,
    /// Completions polled that carry the `wr_id` of an outstanding request.
    pub completions: u64,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "hostile CQEs: {} cases, {} random and {} well-formed CQEs written; {} completions with a wr_id \
             of an outstanding request, {} typed errors",
            self.cases, self.hostile_cqes, self.wellformed_cqes, self.completions, self.typed_errors
        )
    }
}

/// The harness's own account of one QP: what it posted and what is still outstanding.
struct Qp {
    uidx: u32,
    shared: Arc<QpShared>,
    linked: bool,
    /// Basic blocks, the most one WQE takes, and the sends allowed outstanding.
    sq_blocks: u32,
    max_blocks: u32,
    cur_post: u32,
    sq_head: u32,
    /// Outstanding sends: (first block, request, wr_id), oldest first.
    sends: VecDeque<(u32, u32, u64)>,
    rq_slots: u32,
    rq_head: u32,
    recvs: VecDeque<u64>,
}

impl Qp {
    fn max_post(&self) -> u32 {
        self.sq_blocks / self.max_blocks
    }

    fn reset(&mut self) {
        self.shared.reset();
        (self.cur_post, self.sq_head, self.rq_head) = (0, 0, 0);
        self.sends.clear();
        self.recvs.clear();
    }
}

/// Runs one input. Panics (the fuzzer's finding) when a completion breaks the rules above.
pub fn run(data: &[u8]) -> Stats {
    let mut input = FuzzInput::new(data);
    let mut stats = Stats {
        cases: 1,
        ..Stats::default()
    };
    let ncqe = 1u32 << input.below(7);
    let Ok(ring) = Ring::new(ncqe, "fuzz") else {
        return stats;
    };
    let Ok(db) = Arc::new(DbPages::new(4096)).alloc("hostile CQEs") else {
        return stats;
    };
    let cq = CqShared::create(ring, db).0;
    let mut qps: Vec<Qp> = (0..1 + input.below(3))
        .map(|i| {
            let sq_blocks = 1u32 << input.below(4);
            let rq_slots = 1u32 << input.below(3);
            Qp {
                uidx: u32::from(i) * 3 + u32::from(input.below(3)),
                shared: Arc::new(QpShared::new(sq_blocks as usize, rq_slots as usize, None)),
                linked: true,
                sq_blocks,
                max_blocks: (1 + u32::from(input.below(2))).min(sq_blocks),
                cur_post: 0,
                sq_head: 0,
                sends: VecDeque::new(),
                rq_slots,
                rq_head: 0,
                recvs: VecDeque::new(),
            }
        })
        .collect();
    // Two QPs with one user index: the CQ knows the later one.
    let mut owner_of: HashMap<u32, usize> = HashMap::new();
    for (i, qp) in qps.iter().enumerate() {
        cq.link(qp.uidx, qp.shared.clone());
        owner_of.insert(qp.uidx, i);
    }
    let mut next_wr_id = 1u64;
    let mut pi = 0u32;
    let mut out = [WorkCompletion::default(); 8];
    for _ in 0..512 {
        if input.is_empty() {
            break;
        }
        let k = usize::from(input.below(qps.len() as u8));
        match input.below(9) {
            0 => {
                let qp = &mut qps[k];
                if !qp.shared.send_full(qp.sq_head, qp.max_post()) {
                    let blocks = 1 + u32::from(input.below(qp.max_blocks as u8));
                    qp.shared.record_send(qp.cur_post, blocks, qp.sq_head, next_wr_id);
                    qp.sends.push_back((qp.cur_post, qp.sq_head, next_wr_id));
                    qp.cur_post = qp.cur_post.wrapping_add(blocks);
                    qp.sq_head = qp.sq_head.wrapping_add(1);
                    qp.shared.publish_sends(qp.sq_head);
                    next_wr_id += 1;
                }
            }
            1 => {
                let qp = &mut qps[k];
                if !qp.shared.recv_full(qp.rq_head, qp.rq_slots) {
                    qp.shared.record_recv(qp.rq_head, next_wr_id);
                    qp.recvs.push_back(next_wr_id);
                    qp.rq_head = qp.rq_head.wrapping_add(1);
                    qp.shared.publish_recvs(qp.rq_head);
                    next_wr_id += 1;
                }
            }
            2 => {
                // The device: random bytes, handed over (owner bit of this pass) or not.
                let mut bytes: [u8; CQE_SIZE] = input.bytes();
                let at = pi.wrapping_add(u32::from(input.below(4)));
                if input.u8() & 1 == 0 {
                    bytes[OP_OWN] = bytes[OP_OWN] & !1 | u8::from(at & ncqe != 0);
                }
                write_cqe(&cq, at, bytes);
                pi = pi.wrapping_add(1);
                stats.hostile_cqes += 1;
            }
            3 | 4 => {
                // The device: a well-formed CQE for an outstanding request of QP k.
                let qp = &qps[k];
                let mut b = [0u8; CQE_SIZE];
                b[32..36].copy_from_slice(&qp.uidx.to_be_bytes());
                b[56..60].copy_from_slice(&(0x0a00_0000 | qp.uidx).to_be_bytes());
                let pick = usize::from(input.u8());
                let op = if input.u8() & 1 == 0 && !qp.sends.is_empty() {
                    let (block, _, _) = qp.sends[pick % qp.sends.len()];
                    b[60..62].copy_from_slice(&(block as u16).to_be_bytes());
                    if input.u8() & 3 == 0 {
                        b[55] = input.u8();
                        opcode::REQ_ERR
                    } else {
                        opcode::REQ
                    }
                } else {
                    opcode::RESP_SEND
                };
                b[OP_OWN] = op << 4 | u8::from(pi & ncqe != 0);
                write_cqe(&cq, pi, b);
                pi = pi.wrapping_add(1);
                stats.wellformed_cqes += 1;
            }
            5..=7 => {
                let n = 1 + usize::from(input.below(out.len() as u8));
                let (got, ci) = {
                    let mut guard = cq.lock();
                    let state = guard.state();
                    let got = poll_ring(state, &cq.db, &mut out[..n]);
                    (got, state.ring.ci)
                };
                assert!(got <= n, "{got} completions for {n} entries");
                if got > 0 {
                    assert_eq!(cq.db.get(SET_CI), ci & 0xff_ffff, "consumer index record");
                }
                for wc in &out[..got] {
                    check(wc, &mut qps, &owner_of, &mut stats);
                }
            }
            _ => {
                // RESET (scrub, then empty queues) or destroy (scrub and unlink).
                let qp = &mut qps[k];
                let destroy = input.u8() & 1 == 0 && qp.linked;
                cq.scrub(qp.uidx, destroy);
                if destroy {
                    qp.linked = false;
                    owner_of.retain(|_, &mut i| i != k);
                } else {
                    qp.reset();
                }
            }
        }
    }
    stats
}

/// Plays the device: writes `bytes` at ring index `at`, `op_own` last.
fn write_cqe(cq: &CqShared, at: u32, bytes: [u8; CQE_SIZE]) {
    let mut guard = cq.lock();
    let ring = &guard.state().ring;
    let mut body = bytes;
    body[OP_OWN] = ring.op_own(at).load(Ordering::Relaxed);
    // SAFETY: a whole entry of the heap ring (`entry` masks the index).
    unsafe { ring.entry(at).cast::<[u8; CQE_SIZE]>().as_ptr().write_volatile(body) };
    ring.op_own(at).store(bytes[OP_OWN], Ordering::Release);
}

/// A polled completion is a typed error, or the `wr_id` of a request outstanding on its QP.
fn check(wc: &WorkCompletion, qps: &mut [Qp], owner_of: &HashMap<u32, usize>, stats: &mut Stats) {
    if wc.vendor_err > 0xff {
        assert_eq!(wc.status, WcStatus::GENERAL_ERR, "{wc:?}");
        assert_eq!(wc.wr_id, 0, "a typed error names no request: {wc:?}");
        stats.typed_errors += 1;
        return;
    }
    stats.completions += 1;
    // Every wr_id is unique: find the QP that posted it among those the CQ knows.
    let found = qps.iter_mut().enumerate().find_map(|(i, qp)| {
        if !owner_of.values().any(|&o| o == i) {
            return None;
        }
        if let Some(pos) = qp.sends.iter().position(|&(_, _, id)| id == wc.wr_id) {
            // Completing a send completes every earlier one.
            qp.sends.drain(..=pos);
            return Some(());
        }
        if qp.recvs.front() == Some(&wc.wr_id) {
            qp.recvs.pop_front();
            return Some(());
        }
        None
    });
    assert!(
        found.is_some(),
        "wr_id {} is no outstanding request of a linked QP (oldest receive, or a send): {wc:?}",
        wc.wr_id
    );
}

#[cfg(test)]
mod tests {
    use crate::testing::Rng;

    /// Seeded random inputs through the harness (the fuzz target runs the same code).
    #[test]
    fn hostile_cqes_give_typed_errors_or_outstanding_wr_ids() {
        let mut rng = Rng::new(0x6d6c_7835);
        let mut total = super::Stats::default();
        // Under miri (about a second an input) 8 inputs, where both outcomes occur.
        let (inputs, floor) = if cfg!(miri) { (8, 0) } else { (2000, 1000) };
        for _ in 0..inputs {
            let len = rng.below(2048) as usize;
            let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let s = super::run(&data);
            total.cases += s.cases;
            total.hostile_cqes += s.hostile_cqes;
            total.wellformed_cqes += s.wellformed_cqes;
            total.typed_errors += s.typed_errors;
            total.completions += s.completions;
        }
        println!("{total}");
        assert!(total.completions > floor && total.typed_errors > floor, "{total}");
    }
}
