//! The differential trace's step (the trace file itself is `trace.rs`): at each [`step`] (a
//! test program calls `uverbs_mlx5_model_step` after each post) the trace gets, per QP: the
//! doorbell records, the send WQEs and receive WQEs posted since the last step (decoded from
//! the rings in posting order, whatever the ring size); per CQ the consumer index record; and
//! what was written to each BlueFlame buffer of the context's bfregs (taken, so each write is
//! reported once), an 8-byte doorbell or a BlueFlame copy, read against the last WQE of the
//! QP it names.
//!
//! In WQE bytes the QP number is shown as `qqqqqq` (it differs between runs, and is checked
//! against the QP's own); the padding after inline data and a fetch-and-add's compare field
//! as `..` (libmlx5 never writes either: they hold whatever an earlier WQE left).
//!
//! While tracing, the device executes no WQE ([`Device::next_work`]): instead the step
//! **retires** what it traced, a CQE for every signaled send WQE and every receive WQE,
//! drawn from a seeded generator (successes and errors, every responder opcode, random
//! values in every field a provider reads and in those it must ignore). So the rings wrap
//! without a peer or valid keys, and both runs see the same CQEs in the same CQ state.

use crate::abi;
use crate::device::Device;
use crate::kernel::Model;
use crate::mem::Memory;
use crate::trace::{self, hex};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// What the stepper keeps between steps.
struct Stepper {
    /// By QPN: the send and receive doorbell records at the last step.
    seen: HashMap<u32, (u16, u16)>,
    rng: u64,
}

fn stepper() -> &'static Mutex<Stepper> {
    static S: std::sync::OnceLock<Mutex<Stepper>> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        Mutex::new(Stepper {
            seen: HashMap::new(),
            rng: 0x9e37_79b9_7f4a_7c15,
        })
    })
}

impl Stepper {
    /// splitmix64.
    fn next(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// 64 random bytes.
    fn noise(&mut self) -> [u8; 64] {
        let mut b = [0u8; 64];
        for c in b.chunks_mut(8) {
            c.copy_from_slice(&self.next().to_ne_bytes());
        }
        b
    }
}

/// A send WQE as traced: its first block index, blocks, opcode and whether it is signaled.
struct SendWqe {
    index: u16,
    opcode: u8,
    signaled: bool,
}

/// Logical bytes `[at, at + len)` of the send queue starting at block `index`, wrapping.
fn sq_bytes(qp: &crate::objects::Qp, index: u16, len: usize, mem: &dyn Memory) -> Option<Vec<u8>> {
    let mut out = vec![0u8; len];
    for (k, chunk) in out.chunks_mut(64).enumerate() {
        let block = u64::from(index.wrapping_add(k as u16)) & u64::from(qp.sq_cnt - 1);
        mem.read(qp.sq_base() + block * abi::SEND_WQE_BB, chunk).ok()?;
    }
    Some(out)
}

/// A traced send WQE: its bytes (`ds * 16`), one token per byte (hex, or `qq` for its own
/// QPN, `QP` for another, `..` for bytes libmlx5 leaves unwritten), what retiring it needs,
/// and its basic blocks.
struct Traced {
    bytes: Vec<u8>,
    tokens: Vec<String>,
    wqe: SendWqe,
    nbb: u16,
}

/// Tokens as text: 16 a group.
fn line(tokens: &[String]) -> String {
    tokens.chunks(16).map(|c| c.concat()).collect::<Vec<_>>().join(" ")
}

/// One send WQE, the QPN, inline padding and a fetch-and-add's compare masked; `None` if
/// unreadable.
fn send_wqe(qp: &crate::objects::Qp, index: u16, mem: &dyn Memory) -> Option<Traced> {
    let ctrl = sq_bytes(qp, index, 64, mem)?;
    let ds = usize::from(ctrl[7] & 0x3f);
    let nbb = ds.div_ceil(4).max(1) as u16;
    let bytes = sq_bytes(qp, index, usize::from(nbb) * 64, mem)?;
    let mut text: Vec<String> = bytes[..ds * 16].iter().map(|b| format!("{b:02x}")).collect();
    let qpn = u32::from_be_bytes([0, bytes[4], bytes[5], bytes[6]]);
    let q = if qpn == qp.qpn { "qq" } else { "QP" };
    for t in &mut text[4..7] {
        *t = q.into();
    }
    let opcode = bytes[3];
    let data_at = match opcode {
        // A UD send's data follows its 48-byte datagram segment.
        abi::opcode::SEND | abi::opcode::SEND_IMM if qp.qp_type == abi::qpt::UD => 64,
        abi::opcode::RDMA_WRITE | abi::opcode::RDMA_WRITE_IMM | abi::opcode::RDMA_READ => 32,
        abi::opcode::ATOMIC_CS | abi::opcode::ATOMIC_FA => 48,
        _ => 16,
    };
    if data_at + 4 <= ds * 16 {
        let count = u32::from_be_bytes(bytes[data_at..data_at + 4].try_into().ok()?);
        if count & abi::INLINE_SEG != 0 {
            let end = data_at + 4 + (count & !abi::INLINE_SEG) as usize;
            for t in text.iter_mut().take(ds * 16).skip(end) {
                *t = "..".into();
            }
        }
    }
    // libmlx5 never writes a fetch-and-add's compare field (the device ignores it).
    if opcode == abi::opcode::ATOMIC_FA && ds * 16 >= 48 {
        for t in &mut text[40..48] {
            *t = "..".into();
        }
    }
    let wqe = SendWqe {
        index,
        opcode,
        signaled: bytes[11] & abi::WQE_CTRL_CQ_UPDATE != 0,
    };
    let mut bytes = bytes;
    bytes.truncate(ds * 16);
    Some(Traced {
        bytes,
        tokens: text,
        wqe,
        nbb,
    })
}

/// The bytes written to one BlueFlame buffer (a bfreg half; with no BlueFlame, the
/// doorbell's 8 bytes), up to the last nonzero one, read against the last WQE of the QP they
/// name: an 8-byte doorbell is its first 8 bytes, a BlueFlame copy its `ds * 16` bytes and
/// the rest of their last basic block (`..`: whatever the ring held). Masked where the WQE
/// is; ` differs from the WQE` is added when an unmasked byte does not match the ring.
fn uar_text(bytes: &[u8], last: &HashMap<u32, Traced>) -> String {
    let qpn = match bytes.get(4..7) {
        Some(b) => u32::from_be_bytes([0, b[0], b[1], b[2]]),
        None => 0,
    };
    let wqe = last.get(&qpn);
    let len = match (bytes.len() <= 8, wqe) {
        (true, _) => 8,
        (false, Some(w)) => bytes.len().max(w.bytes.len()).next_multiple_of(64),
        (false, None) => bytes.len().next_multiple_of(64),
    };
    let mut same = true;
    let tokens: Vec<String> = (0..len)
        .map(|i| {
            let b = bytes.get(i).copied().unwrap_or(0);
            match wqe {
                Some(w) if i < w.bytes.len() => {
                    if w.tokens[i].bytes().all(|c| c.is_ascii_hexdigit()) {
                        same &= w.bytes[i] == b;
                        format!("{b:02x}")
                    } else {
                        w.tokens[i].clone()
                    }
                }
                Some(w) if len > 8 && i < w.bytes.len().next_multiple_of(64) => "..".into(),
                _ => format!("{b:02x}"),
            }
        })
        .collect();
    let note = match (wqe, same) {
        (Some(_), true) => "",
        (Some(_), false) => " differs from the WQE",
        (None, _) => " names no traced QP",
    };
    format!("{}{note}", line(&tokens))
}

/// The traced step `label` for every QP and CQ of the process (see the module doc).
pub fn step(model: &mut Model, label: &str, mem: &dyn Memory) {
    if !trace::enabled() {
        return;
    }
    let mut t = stepper().lock().unwrap_or_else(|e| e.into_inner());
    let mut out = format!("step {label}\n");
    // By QPN: the last send WQE traced in this step, which a doorbell must carry.
    let mut last: HashMap<u32, Traced> = HashMap::new();
    for h in model.qps.handles() {
        let Some(qp) = model.qps.get(h) else { continue };
        let snd = mem.read_be32(qp.db + abi::SND_DBR).unwrap_or(u32::MAX);
        let rcv = mem.read_be32(qp.db + abi::RCV_DBR).unwrap_or(u32::MAX);
        let _ = writeln!(out, "qp dbrec rcv={rcv:#x} snd={snd:#x}");
        let (mut sq, mut rq) = t.seen.get(&qp.qpn).copied().unwrap_or((0, 0));
        let mut sends = Vec::new();
        while qp.sq_cnt > 0 && sq != snd as u16 {
            let Some(traced) = send_wqe(qp, sq, mem) else {
                let _ = writeln!(out, "sq unreadable at {sq}");
                break;
            };
            let _ = writeln!(out, "sq {}", line(&traced.tokens));
            sq = sq.wrapping_add(traced.nbb);
            sends.push(traced);
        }
        let mut recvs = 0u32;
        while qp.rq_cnt > 0 && rq != rcv as u16 {
            let slot = u64::from(rq) & u64::from(qp.rq_cnt - 1);
            let mut wqe = vec![0u8; 1 << qp.rq_shift];
            let _ = mem.read(qp.buf + (slot << qp.rq_shift), &mut wqe);
            let segs: Vec<String> = wqe
                .chunks(16)
                .scan(false, |done, seg| {
                    let show = !*done;
                    *done |= seg[4..8] == 0x100u32.to_be_bytes();
                    Some(show.then(|| hex(seg)))
                })
                .flatten()
                .collect();
            let _ = writeln!(out, "rq {}", segs.join(" "));
            rq = rq.wrapping_add(1);
            recvs += 1;
        }
        t.seen.insert(qp.qpn, (sq, rq));
        let (qpn, uidx, send_cq, recv_cq) = (qp.qpn, qp.uidx & 0xff_ffff, qp.send_cq, qp.recv_cq);
        for w in sends.iter().map(|t| &t.wqe).filter(|w| w.signaled) {
            let cqe = send_cqe(&mut t, qpn, uidx, w);
            if let Some(cq) = model.cqs.get_mut(send_cq) {
                Device::post_raw(cq, cqe, mem);
            }
        }
        for _ in 0..recvs {
            let cqe = recv_cqe(&mut t, qpn, uidx);
            if let Some(cq) = model.cqs.get_mut(recv_cq) {
                Device::post_raw(cq, cqe, mem);
            }
        }
        if let Some(w) = sends.pop() {
            last.insert(qpn, w);
        }
    }
    for h in model.cqs.handles() {
        if let Some(cq) = model.cqs.get(h) {
            let ci = mem.read_be32(cq.db + abi::CQ_SET_CI).unwrap_or(u32::MAX);
            let _ = writeln!(out, "cq set_ci={ci:#x}");
        }
    }
    // The bfregs (from 0x800 of each UAR page) in BlueFlame buffers, each taken whole; named
    // by their offset in the bfreg, since the two providers get different bfregs.
    let bf_reg = u64::from(crate::bf_reg_size());
    let half = (bf_reg / 2).max(64);
    for c in model.contexts.values() {
        for &page in &c.uar_maps {
            for at in (0x800..0x1000u64).step_by(half as usize) {
                let bytes: Vec<u8> = (at..at + half)
                    .step_by(8)
                    .flat_map(|off| mem.take(page + off).unwrap_or(0).to_ne_bytes())
                    .collect();
                if let Some(end) = bytes.iter().rposition(|&b| b != 0) {
                    let rel = (at - 0x800) % bf_reg.max(half);
                    let _ = writeln!(out, "uar bf+{rel:#x} {}", uar_text(&bytes[..=end], &last));
                }
            }
        }
    }
    trace::emit(&out);
}

/// Error syndromes the generator draws from: every one libmlx5 names, and two it does not.
const SYNDROMES: [u8; 15] = [
    0x01, 0x02, 0x04, 0x05, 0x06, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x22, 0x07, 0xff,
];

/// The send opcodes a requester CQE names (`MLX5_OPCODE_*`): SEND_INVAL, RDMA_WRITE(_IMM),
/// SEND(_IMM), RDMA_READ, ATOMIC_CS, ATOMIC_FA.
const REQ_OPCODES: [u8; 8] = [0x01, 0x08, 0x09, 0x0a, 0x0b, 0x10, 0x11, 0x12];

/// Fills the fields every CQE carries; the rest (the high byte of `srqn_uidx` too) stays
/// random.
fn frame(b: &mut [u8; 64], op: u8, qpn_field: u32, uidx: u32, wqe_counter: u16, se: bool) {
    b[33..36].copy_from_slice(&uidx.to_be_bytes()[1..]);
    b[56..60].copy_from_slice(&qpn_field.to_be_bytes());
    b[60..62].copy_from_slice(&wqe_counter.to_be_bytes());
    b[63] = op << 4 | if se { 2 } else { 0 };
}

/// A requester CQE for `w`: success with the WQE's opcode, or an error with a random
/// syndrome.
fn send_cqe(t: &mut Stepper, qpn: u32, uidx: u32, w: &SendWqe) -> [u8; 64] {
    let mut b = t.noise();
    let r = t.next();
    if r % 5 == 0 {
        let synd = SYNDROMES[(r >> 8) as usize % SYNDROMES.len()];
        frame(
            &mut b,
            abi::cqe_op::REQ_ERR,
            u32::from(w.opcode) << 24 | qpn,
            uidx,
            w.index,
            false,
        );
        b[55] = synd;
    } else {
        // Mostly the WQE's opcode; now and then another requester opcode (SEND_INVAL too):
        // a provider reads the CQE's, never its own record of the WQE.
        let opcode = match r & 0x3000 {
            0 => REQ_OPCODES[(r >> 16) as usize % REQ_OPCODES.len()],
            _ => w.opcode,
        };
        frame(
            &mut b,
            abi::cqe_op::REQ,
            u32::from(opcode) << 24 | qpn,
            uidx,
            w.index,
            r & 0x100 != 0,
        );
    }
    b
}

/// A responder CQE: each receive opcode, or an error.
fn recv_cqe(t: &mut Stepper, qpn: u32, uidx: u32) -> [u8; 64] {
    let mut b = t.noise();
    let r = t.next();
    let op = [
        abi::cqe_op::RESP_SEND,
        abi::cqe_op::RESP_SEND_IMM,
        abi::cqe_op::RESP_WR_IMM,
        4, // RESP_SEND_INV
        abi::cqe_op::RESP_ERR,
    ][r as usize % 5];
    let counter = (r >> 16) as u16;
    frame(
        &mut b,
        op,
        (r >> 32) as u32 & 0xff00_0000 | qpn,
        uidx,
        counter,
        r & 0x100 != 0,
    );
    if op == abi::cqe_op::RESP_ERR {
        b[55] = SYNDROMES[(r >> 40) as usize % SYNDROMES.len()];
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::Arena;
    use crate::objects::{Qp, QpAttrs};

    /// A QP of 4 send blocks at 0x10000 (no receive queue), QPN 0x1c0.
    fn qp() -> Qp {
        Qp {
            ctx: 3,
            bfregn: None,
            bf: Default::default(),
            qpn: 0x1c0,
            qp_type: abi::qpt::RC,
            pd: 0,
            send_cq: 0,
            recv_cq: 0,
            srq: None,
            user_handle: 0,
            uidx: 0,
            buf: 0x10000,
            rq_cnt: 0,
            rq_shift: 0,
            sq_cnt: 4,
            db: 0x20000,
            state: abi::qps::RTS,
            attrs: QpAttrs::default(),
            sq_sig_all: false,
            max_send_wr: 4,
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 0,
            max_inline: 60,
            sq_ci: 0,
            rq_ci: 0,
            stall: None,
            async_events: 0,
            epoch: 0,
        }
    }

    /// A two-block inline WRITE posted at the last block reads on at the ring's start; its
    /// QPN and the padding after its 5 inline bytes are masked.
    #[test]
    fn send_wqes_are_read_across_the_ring_end_and_masked() {
        let mem = Arena::default();
        mem.add(0x10000, 4 * 64);
        let mut wqe = [0u8; 128];
        wqe[..8].copy_from_slice(&[0, 0, 3, 0x08, 0, 1, 0xc0, 5]);
        wqe[11] = abi::WQE_CTRL_CQ_UPDATE;
        wqe[16..24].copy_from_slice(&0x1122u64.to_be_bytes());
        wqe[32..36].copy_from_slice(&(5 | abi::INLINE_SEG).to_be_bytes());
        wqe[36..41].copy_from_slice(b"hello");
        wqe[41..80].fill(0x77);
        mem.write(0x10000 + 3 * 64, &wqe[..64]).unwrap();
        mem.write(0x10000, &wqe[64..]).unwrap();
        let t = send_wqe(&qp(), 3, &mem).unwrap();
        let (text, w, nbb) = (line(&t.tokens), t.wqe, t.nbb);
        assert_eq!((w.index, w.opcode, w.signaled, nbb), (3, 0x08, true, 2));
        let segs: Vec<&str> = text.split(' ').collect();
        assert_eq!(segs.len(), 5);
        assert_eq!(segs[0], "00000308qqqqqq050000000800000000");
        assert_eq!(segs[2], format!("{}{}{}", "80000005", hex(b"hello"), "..".repeat(7)));
        assert_eq!(segs[4], "..".repeat(16));
        // A control segment naming another QP is shown, not masked away.
        mem.write(0x10000 + 3 * 64 + 6, &[0xc1]).unwrap();
        assert!(line(&send_wqe(&qp(), 3, &mem).unwrap().tokens).starts_with("00000308QPQPQP05"));
        assert_eq!(mem.stray(), 0);
    }

    /// A fetch-and-add's compare field is masked (libmlx5 never writes it); a CAS's is not.
    #[test]
    fn fetch_and_add_compare_is_masked() {
        let mem = Arena::default();
        mem.add(0x10000, 4 * 64);
        let mut wqe = [0xabu8; 64];
        wqe[..8].copy_from_slice(&[0, 0, 0, abi::opcode::ATOMIC_FA, 0, 1, 0xc0, 4]);
        mem.write(0x10000, &wqe).unwrap();
        let text = line(&send_wqe(&qp(), 0, &mem).unwrap().tokens);
        assert_eq!(
            text.split(' ').nth(2),
            Some(format!("{}{}", "ab".repeat(8), "..".repeat(8)).as_str())
        );
        mem.write(0x10000 + 3, &[abi::opcode::ATOMIC_CS]).unwrap();
        let text = line(&send_wqe(&qp(), 0, &mem).unwrap().tokens);
        assert_eq!(text.split(' ').nth(2), Some("ab".repeat(16).as_str()));
    }

    /// A doorbell is the last WQE's first 8 bytes; a BlueFlame copy its bytes and the rest of
    /// its last block (`..`); a byte that is not the ring's is flagged.
    #[test]
    fn uar_writes_read_against_the_last_wqe() {
        let mem = Arena::default();
        mem.add(0x10000, 4 * 64);
        let mut wqe = [0x5au8; 64];
        wqe[..8].copy_from_slice(&[0, 0, 0, 0x0a, 0, 1, 0xc0, 2]);
        mem.write(0x10000, &wqe).unwrap();
        let last = HashMap::from([(0x1c0, send_wqe(&qp(), 0, &mem).unwrap())]);
        assert_eq!(uar_text(&wqe[..8], &last), "0000000aqqqqqq02");
        let mut copy = wqe.to_vec();
        copy[40..].fill(0x33); // after the WQE's 32 bytes: stale ring bytes
        let text = uar_text(&copy, &last);
        assert_eq!(
            text,
            format!(
                "0000000aqqqqqq02{} {} {} {}",
                "5a".repeat(8),
                "5a".repeat(16),
                "..".repeat(16),
                "..".repeat(16)
            )
        );
        copy[20] = 0;
        assert!(uar_text(&copy, &last).ends_with(" differs from the WQE"));
        assert!(uar_text(&[1, 0, 0, 0, 0, 0, 9], &last).ends_with(" names no traced QP"));
    }
}
