//! The device: executes send WQEs when `dbrec[SND]` moves, consumes receive WQEs for
//! incoming messages, writes CQEs and raises completion and async events.
//!
//! Everything the device reads from or writes to the client is checked first against what
//! the client registered: an MR (by key, PD, access and range), the QP's own ring, or the
//! CQ's own buffer. A malformed WQE or doorbell becomes an error CQE or a QP error.
//!
//! The work is split so the model's lock is not held while a request crosses the fabric:
//! [`Device::next_work`] turns the next WQE into a [`Work`] (or completes it locally),
//! the caller exchanges the request with the responder, and [`Device::complete`] finishes.

use crate::abi::{self, cqe_op, opcode, qps, syndrome};
use crate::kernel::Model;
use crate::mem::Memory;
use crate::objects::{Arm, Cq, EventSink, Mr, Qp, Stall};
use crate::wire::{Datagram, Op, Request, Response};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod srq;

/// The device's operations on the model.
pub struct Device;

/// A send WQE on its way to the responder.
#[derive(Debug)]
pub struct Work {
    pub qp: u32,
    pub dlid: u16,
    pub request: Request,
    wqe_index: u16,
    /// The QP's `epoch` when the request was taken.
    epoch: u32,
    nbb: u16,
    opcode: u8,
    signaled: bool,
    /// Where READ data or an atomic's original value go: (client address, length).
    scatter: Vec<(u64, u64)>,
}

/// A parsed data segment: `(byte_count, lkey, addr)` or inline bytes.
enum Segment {
    Pointer { len: u32, lkey: u32, addr: u64 },
    Inline(Vec<u8>),
}

/// What a WQE asks for, before any memory of the client is touched.
struct Wqe {
    opcode: u8,
    index: u16,
    nbb: u16,
    signaled: bool,
    solicited: bool,
    imm: u32,
    raddr: u64,
    rkey: u32,
    swap_add: u64,
    compare: u64,
    /// A UD send's address vector (`mlx5_wqe_datagram_seg`, 48 bytes).
    av: Option<[u8; 48]>,
    segments: Vec<Segment>,
}

/// The receive WQE a message lands in.
struct RecvWqe {
    /// Address of its first data segment.
    segs: u64,
    /// Data segments it has room for.
    max_segs: u64,
    /// The receive queue's counter, or the SRQ WQE's index: the CQE's `wqe_counter`.
    index: u16,
    /// The SRQ it belongs to.
    srq: Option<u32>,
}

/// A CQE under construction (64 bytes, big-endian fields).
struct Cqe([u8; 64]);

impl Cqe {
    fn new(op: u8, qpn_field: u32, uidx: u32, wqe_counter: u16) -> Self {
        let mut c = [0u8; 64];
        c[32..36].copy_from_slice(&(uidx & 0xff_ffff).to_be_bytes());
        c[56..60].copy_from_slice(&qpn_field.to_be_bytes());
        c[60..62].copy_from_slice(&wqe_counter.to_be_bytes());
        c[63] = op << 4;
        Self(c)
    }
    fn byte_cnt(mut self, n: u32) -> Self {
        self.0[44..48].copy_from_slice(&n.to_be_bytes());
        self
    }
    fn imm(mut self, raw: u32) -> Self {
        self.0[36..40].copy_from_slice(&raw.to_ne_bytes());
        self
    }
    fn source(mut self, slid: u16, src_qp: u32) -> Self {
        self.0[22..24].copy_from_slice(&slid.to_be_bytes());
        self.0[24..28].copy_from_slice(&(src_qp & 0xff_ffff).to_be_bytes());
        self
    }
    /// A UD receive's `flags_rqpn` high byte: the service level (bits 24-27) and the GRH
    /// type (bits 28-29, 1: an InfiniBand GRH; libmlx5 sets `IBV_WC_GRH` when non-zero).
    fn datagram(mut self, d: &Datagram) -> Self {
        self.0[24] = (d.sl & 0xf) | if d.grh.is_some() { 1 << 4 } else { 0 };
        self
    }
    fn solicited(mut self, yes: bool) -> Self {
        if yes {
            self.0[63] |= 2;
        }
        self
    }
    fn syndrome(mut self, s: u8) -> Self {
        self.0[55] = s;
        self
    }
}

/// The largest UD message: one packet of the path MTU (4096; see [`Device::prepare`]).
const UD_MTU: usize = 4096;
/// The GRH at the head of every UD receive buffer.
const GRH_LEN: usize = 40;

/// The user index a CQE carries (`srqn_uidx`): the QP's with CQE version 1, else 0.
fn uidx(qp: &Qp) -> u32 {
    if qp.uidx == abi::DEFAULT_UIDX {
        0
    } else {
        qp.uidx
    }
}

/// IB `min_rnr_timer` encoding, in microseconds (IBA table 45).
fn rnr_delay(code: u8) -> Duration {
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840, 5120, 7680, 10_240,
        15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680, 491_520,
    ];
    Duration::from_micros(u64::from(US[usize::from(code & 31)]))
}

/// Local ACK timeout `4.096 us << timeout`, capped (0 means "infinite": the cap).
fn ack_timeout(code: u8) -> Duration {
    const CAP: Duration = Duration::from_millis(500);
    if code == 0 || code > 20 {
        return CAP;
    }
    Duration::from_nanos(4096u64 << code).min(CAP)
}

/// The MR `key` names, if it belongs to `pd` and covers `[iova, iova + len)` with `access`.
fn mr_covering(mrs: &crate::objects::Table<Mr>, key: u32, pd: u32, iova: u64, len: u64, access: u32) -> Option<u64> {
    let (_, mr) = mrs.iter().find(|(_, m)| m.key == key)?;
    if mr.pd != pd || mr.access & access != access {
        return None;
    }
    let off = iova.checked_sub(mr.iova)?;
    if off.checked_add(len)? > mr.length {
        return None;
    }
    mr.addr.checked_add(off)
}

impl Device {
    /// Writes `cqe` in the next slot of `cq`, unless that would overwrite an unconsumed CQE
    /// (then the CQ is in error and a CQ_ERR async event goes out). The `op_own` byte is
    /// written last, after the rest of the CQE is visible.
    fn post(cq: &mut Cq, mut cqe: Cqe, mem: &dyn Memory, async_sink: Option<&Arc<dyn EventSink>>) {
        if cq.error {
            return;
        }
        let ci = mem.read_be32(cq.db + abi::CQ_SET_CI).map(|v| v & 0xff_ffff);
        let full = ci.map_or(true, |ci| cq.pi.wrapping_sub(ci) & 0xff_ffff >= cq.ncqe);
        if full {
            cq.error = true;
            crate::log!("cq {} overrun: CQ_ERR", cq.cqn);
            if let Some(sink) = async_sink {
                let ev = abi::AsyncEventDesc {
                    element: cq.user_handle,
                    event_type: abi::event::CQ_ERR,
                    reserved: 0,
                };
                sink.push(zerocopy::IntoBytes::as_bytes(&ev));
            }
            return;
        }
        let slot = u64::from(cq.pi & (cq.ncqe - 1));
        let addr = cq.buf + slot * u64::from(cq.cqe_size) + u64::from(cq.cqe_size - 64);
        cqe.0[63] = (cqe.0[63] & !1) | u8::from(cq.pi & cq.ncqe != 0);
        // Two copies: the 63 bytes, then op_own. Each is a completed system call, so the
        // first is globally visible before the second (Release order on the owner byte).
        if mem.write(addr, &cqe.0[..63]).is_err() || mem.write(addr + 63, &cqe.0[63..]).is_err() {
            cq.error = true;
            return;
        }
        cq.pi = (cq.pi + 1) & 0xff_ffff;
        let op = cqe.0[63] >> 4;
        let solicited = cqe.0[63] & 2 != 0 || op == cqe_op::REQ_ERR || op == cqe_op::RESP_ERR;
        if let Some(arm) = cq.arm {
            if !arm.solicited_only || solicited {
                Self::fire(cq, arm);
            }
        }
    }

    /// Writes a CQE given whole (the trace's retirement, `stepper.rs`), as [`Self::post`] does.
    pub fn post_raw(cq: &mut Cq, bytes: [u8; 64], mem: &dyn Memory) {
        Self::post(cq, Cqe(bytes), mem, None);
    }

    fn fire(cq: &mut Cq, arm: Arm) {
        cq.arm = None;
        cq.fired = Some(arm.value);
        if let Some(ch) = &cq.channel {
            ch.push(&cq.user_handle.to_ne_bytes());
        }
    }

    fn arm(cq: &mut Cq, value: u32) {
        let arm = Arm {
            solicited_only: value & (1 << 24) != 0,
            ci: value & 0xff_ffff,
            value,
        };
        cq.arm = Some(arm);
        // CQEs already past the consumer index the arm names: the event is due now.
        if !arm.solicited_only && cq.pi != arm.ci {
            Self::fire(cq, arm);
        }
    }

    /// Reads every CQ's arm doorbell record and every mapped UAR page's CQ doorbell.
    pub fn poll_arms(model: &mut Model, mem: &dyn Memory) {
        for h in model.cqs.handles() {
            let Some(cq) = model.cqs.get_mut(h) else { continue };
            let Ok(v) = mem.read_be32(cq.db + abi::CQ_ARM_DB) else {
                continue;
            };
            if v != cq.last_arm_db {
                cq.last_arm_db = v;
                Self::arm(cq, v);
            }
        }
        for (&ctx, c) in &model.contexts {
            for &page in &c.uar_maps {
                let Ok(word) = mem.take(page + abi::UAR_CQ_DOORBELL) else {
                    continue;
                };
                if word == 0 {
                    continue;
                }
                let v = u64::from_be_bytes(word.to_ne_bytes());
                let (value, cqn) = ((v >> 32) as u32, v as u32);
                let Some(h) = model
                    .cqs
                    .iter()
                    .find(|(_, q)| q.ctx == ctx && q.cqn == cqn)
                    .map(|(h, _)| h)
                else {
                    continue;
                };
                let Some(cq) = model.cqs.get_mut(h) else { continue };
                if cq.fired == Some(value) || cq.arm.is_some_and(|a| a.value == value) {
                    continue;
                }
                // The record carries the same value: do not arm twice for one request.
                cq.last_arm_db = value;
                Self::arm(cq, value);
            }
        }
    }

    fn raise_qp_fatal(model: &mut Model, h: u32) {
        let Some(qp) = model.qps.get_mut(h) else { return };
        qp.state = qps::ERR;
        crate::log!("qp {:#x} fatal", qp.qpn);
        if let Some(sink) = model.contexts.get(&qp.ctx).and_then(|c| c.async_sink.as_ref()) {
            let ev = abi::AsyncEventDesc {
                element: qp.user_handle,
                event_type: abi::event::QP_FATAL,
                reserved: 0,
            };
            sink.push(zerocopy::IntoBytes::as_bytes(&ev));
        }
    }

    /// Writes a CQE for QP `h` on its send (`send == true`) or receive CQ.
    fn post_for(model: &mut Model, h: u32, send: bool, cqe: Cqe, mem: &dyn Memory) {
        let Some(qp) = model.qps.get(h) else { return };
        let cq_handle = if send { qp.send_cq } else { qp.recv_cq };
        let sink = model.contexts.get(&qp.ctx).and_then(|c| c.async_sink.clone());
        if let Some(cq) = model.cqs.get_mut(cq_handle) {
            Self::post(cq, cqe, mem, sink.as_ref());
        }
    }

    /// Completes the send WQE `index` of QP `h` in error with `synd` and moves the QP to ERR.
    fn fail_send(model: &mut Model, h: u32, index: u16, nbb: u16, op: u8, synd: u8, mem: &dyn Memory) {
        let Some(qp) = model.qps.get_mut(h) else { return };
        crate::log!("qp {:#x} wqe {index} error syndrome {synd:#x}", qp.qpn);
        qp.state = qps::ERR;
        qp.stall = None;
        qp.sq_ci = qp.sq_ci.wrapping_add(nbb.max(1));
        let cqe = Cqe::new(cqe_op::REQ_ERR, (u32::from(op) << 24) | qp.qpn, uidx(qp), index).syndrome(synd);
        Self::post_for(model, h, true, cqe, mem);
    }

    /// Flushes what is posted on a QP in ERR: one WR_FLUSH_ERR CQE per WQE, at most one
    /// ring's worth per call.
    fn flush(model: &mut Model, h: u32, mem: &dyn Memory) -> bool {
        let Some(qp) = model.qps.get(h) else { return false };
        let (db, sq_cnt, rq_cnt) = (qp.db, qp.sq_cnt, qp.rq_cnt);
        let mut active = false;
        if sq_cnt > 0 {
            if let Ok(snd) = mem.read_be32(db + abi::SND_DBR) {
                let snd = snd as u16;
                for _ in 0..sq_cnt {
                    let Some(qp) = model.qps.get_mut(h) else { return active };
                    if qp.sq_ci == snd {
                        break;
                    }
                    if u32::from(snd.wrapping_sub(qp.sq_ci)) > sq_cnt {
                        qp.sq_ci = snd;
                        break;
                    }
                    let index = qp.sq_ci;
                    let ctrl_addr = qp.sq_base() + (u64::from(index) & u64::from(sq_cnt - 1)) * abi::SEND_WQE_BB;
                    let mut ctrl = [0u8; 16];
                    let (op, nbb) = match mem.read(ctrl_addr, &mut ctrl) {
                        Ok(()) => {
                            let ds = u32::from(ctrl[7] & 0x3f);
                            (ctrl[3], ds.div_ceil(4).max(1) as u16)
                        }
                        Err(_) => (0, 1),
                    };
                    qp.sq_ci = qp.sq_ci.wrapping_add(nbb);
                    let cqe = Cqe::new(cqe_op::REQ_ERR, (u32::from(op) << 24) | qp.qpn, uidx(qp), index)
                        .syndrome(syndrome::WR_FLUSH);
                    Self::post_for(model, h, true, cqe, mem);
                    active = true;
                }
            }
        }
        if rq_cnt > 0 {
            if let Ok(rcv) = mem.read_be32(db + abi::RCV_DBR) {
                let rcv = rcv as u16;
                for _ in 0..rq_cnt {
                    let Some(qp) = model.qps.get_mut(h) else { return active };
                    if qp.rq_ci == rcv {
                        break;
                    }
                    if u32::from(rcv.wrapping_sub(qp.rq_ci)) > rq_cnt {
                        qp.rq_ci = rcv;
                        break;
                    }
                    let index = qp.rq_ci;
                    qp.rq_ci = qp.rq_ci.wrapping_add(1);
                    let cqe = Cqe::new(cqe_op::RESP_ERR, qp.qpn, uidx(qp), index).syndrome(syndrome::WR_FLUSH);
                    Self::post_for(model, h, false, cqe, mem);
                    active = true;
                }
            }
        }
        active
    }

    /// Reads and decodes the WQE at the SQ's consumer index. `Err((nbb, opcode, syndrome))`
    /// for a malformed one.
    fn parse(qp: &Qp, avail: u16, mem: &dyn Memory) -> Result<Wqe, (u16, u8, u8)> {
        let bad = |nbb: u16, op: u8| Err((nbb, op, syndrome::LOCAL_QP_OP));
        let mask = u64::from(qp.sq_cnt - 1);
        let bb_addr = |k: u16| qp.sq_base() + ((u64::from(qp.sq_ci.wrapping_add(k))) & mask) * abi::SEND_WQE_BB;
        let mut first = [0u8; 64];
        if mem.read(bb_addr(0), &mut first).is_err() {
            return bad(1, 0);
        }
        let op = first[3];
        let index = u16::from_be_bytes([first[1], first[2]]);
        let qpn = u32::from_be_bytes([0, first[4], first[5], first[6]]);
        let ds = u16::from(first[7] & 0x3f);
        let nbb = ds.div_ceil(4).max(1);
        // A WQE must name its own index and QP, have at least its control segment, fit the
        // ring and lie within what the doorbell covers.
        if ds == 0 || index != qp.sq_ci || qpn != qp.qpn || u32::from(nbb) > qp.sq_cnt || nbb > avail {
            return bad(nbb, op);
        }
        let mut wqe = vec![0u8; usize::from(nbb) * 64];
        wqe[..64].copy_from_slice(&first);
        for k in 1..nbb {
            let at = usize::from(k) * 64;
            if mem.read(bb_addr(k), &mut wqe[at..at + 64]).is_err() {
                return bad(nbb, op);
            }
        }
        wqe.truncate(usize::from(ds) * 16);
        let fm_ce_se = first[11];
        let be64 = |b: &[u8]| u64::from_be_bytes(b[..8].try_into().unwrap_or_default());
        let be32 = |b: &[u8]| u32::from_be_bytes(b[..4].try_into().unwrap_or_default());
        let mut w = Wqe {
            opcode: op,
            index,
            nbb,
            signaled: fm_ce_se & abi::WQE_CTRL_CQ_UPDATE != 0,
            solicited: fm_ce_se & abi::WQE_CTRL_SOLICITED != 0,
            imm: u32::from_ne_bytes(first[12..16].try_into().unwrap_or_default()),
            raddr: 0,
            rkey: 0,
            swap_add: 0,
            compare: 0,
            av: None,
            segments: Vec::new(),
        };
        let ud = qp.qp_type == abi::qpt::UD;
        let data_at = match op {
            opcode::NOP => 16,
            // A UD send's datagram segment follows the control segment.
            opcode::SEND | opcode::SEND_IMM if ud => 64,
            opcode::SEND | opcode::SEND_IMM => 16,
            _ if ud => return bad(nbb, op),
            opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM | opcode::RDMA_READ => 32,
            opcode::ATOMIC_CS | opcode::ATOMIC_FA => 48,
            _ => return bad(nbb, op),
        };
        if qp.qp_type == abi::qpt::UC && matches!(op, opcode::RDMA_READ | opcode::ATOMIC_CS | opcode::ATOMIC_FA) {
            return bad(nbb, op);
        }
        if wqe.len() < data_at {
            return bad(nbb, op);
        }
        if ud && data_at == 64 {
            w.av = wqe[16..64].try_into().ok();
        }
        if data_at >= 32 {
            w.raddr = be64(&wqe[16..]);
            w.rkey = be32(&wqe[24..]);
        }
        if data_at == 48 {
            w.swap_add = be64(&wqe[32..]);
            w.compare = be64(&wqe[40..]);
        }
        let mut at = data_at;
        while at + 16 <= wqe.len() {
            let count = be32(&wqe[at..]);
            if count & abi::INLINE_SEG != 0 {
                let len = (count & !abi::INLINE_SEG) as usize;
                let Some(end) = (at + 4).checked_add(len).filter(|&e| e <= wqe.len()) else {
                    return bad(nbb, op);
                };
                w.segments.push(Segment::Inline(wqe[at + 4..end].to_vec()));
                at += (4 + len).div_ceil(16) * 16;
            } else {
                let (lkey, addr) = (be32(&wqe[at + 4..]), be64(&wqe[at + 8..]));
                if count != 0 {
                    w.segments.push(Segment::Pointer { len: count, lkey, addr });
                }
                at += 16;
            }
        }
        Ok(w)
    }

    /// Takes the next send WQE of some QP: returns the work to send across the fabric, or
    /// `None` when no QP has anything to do now. Local errors, flushes and NOPs complete
    /// here. Sets `*active` when anything happened.
    /// Under the differential trace the device executes nothing (`stepper.rs` retires WQEs).
    pub fn next_work(model: &mut Model, mem: &dyn Memory, now: Instant, active: &mut bool) -> Option<Work> {
        if crate::trace::enabled() {
            return None;
        }
        for h in model.qps.handles() {
            let Some(qp) = model.qps.get(h) else { continue };
            match qp.state {
                qps::ERR => {
                    *active |= Self::flush(model, h, mem);
                    continue;
                }
                qps::RTS | qps::SQD => {}
                _ => continue,
            }
            if qp.sq_cnt == 0 || qp.stall.is_some_and(|s| s.until > now) {
                continue;
            }
            let Ok(snd) = mem.read_be32(qp.db + abi::SND_DBR) else {
                Self::raise_qp_fatal(model, h);
                continue;
            };
            let avail = (snd as u16).wrapping_sub(qp.sq_ci);
            if avail == 0 {
                continue;
            }
            *active = true;
            if u32::from(avail) > qp.sq_cnt {
                // The doorbell claims more WQEs than the ring holds.
                Self::raise_qp_fatal(model, h);
                continue;
            }
            let wqe = match Self::parse(qp, avail, mem) {
                Ok(w) => w,
                Err((nbb, op, synd)) => {
                    let index = qp.sq_ci;
                    Self::fail_send(model, h, index, nbb, op, synd, mem);
                    continue;
                }
            };
            match Self::prepare(model, h, wqe, mem) {
                Ok(Some(work)) => return Some(work),
                Ok(None) => {}
                Err((index, nbb, op, synd)) => Self::fail_send(model, h, index, nbb, op, synd, mem),
            }
        }
        None
    }

    /// Gathers a WQE's local data and checks its local keys. `Ok(None)` when it completed
    /// locally (NOP).
    fn prepare(model: &mut Model, h: u32, wqe: Wqe, mem: &dyn Memory) -> Result<Option<Work>, (u16, u16, u8, u8)> {
        let qp = model.qps.get(h).ok_or((0, 1, 0, syndrome::LOCAL_QP_OP))?;
        let fail = |s: u8| (wqe.index, wqe.nbb, wqe.opcode, s);
        let reads_remote = matches!(wqe.opcode, opcode::RDMA_READ | opcode::ATOMIC_CS | opcode::ATOMIC_FA);
        let mut data = Vec::new();
        let mut scatter = Vec::new();
        for seg in &wqe.segments {
            match seg {
                Segment::Inline(bytes) if !reads_remote => data.extend_from_slice(bytes),
                Segment::Inline(_) => return Err(fail(syndrome::LOCAL_QP_OP)),
                Segment::Pointer { len, lkey, addr } => {
                    let len = u64::from(*len);
                    let need = if reads_remote { abi::access::LOCAL_WRITE } else { 0 };
                    let at = mr_covering(&model.mrs, *lkey, qp.pd, *addr, len, need)
                        .ok_or_else(|| fail(syndrome::LOCAL_PROT))?;
                    if reads_remote {
                        scatter.push((at, len));
                    } else {
                        if data.len() as u64 + len > crate::wire::MAX_MESSAGE as u64 {
                            return Err(fail(syndrome::LOCAL_LENGTH));
                        }
                        let start = data.len();
                        data.resize(start + len as usize, 0);
                        mem.read(at, &mut data[start..])
                            .map_err(|_| fail(syndrome::LOCAL_PROT))?;
                    }
                }
            }
        }
        let imm = matches!(wqe.opcode, opcode::SEND_IMM | opcode::RDMA_WRITE_IMM).then_some(wqe.imm);
        let op = match wqe.opcode {
            opcode::NOP => {
                let (qpn, u) = (qp.qpn, uidx(qp));
                if let Some(qp) = model.qps.get_mut(h) {
                    qp.sq_ci = qp.sq_ci.wrapping_add(wqe.nbb);
                }
                if wqe.signaled {
                    let cqe = Cqe::new(cqe_op::REQ, (u32::from(opcode::NOP) << 24) | qpn, u, wqe.index);
                    Self::post_for(model, h, true, cqe, mem);
                }
                return Ok(None);
            }
            opcode::SEND | opcode::SEND_IMM => Op::Send {
                imm,
                solicited: wqe.solicited,
                datagram: match &wqe.av {
                    Some(av) => {
                        // A UD message is one packet: at most the path MTU, 4096 for a UD
                        // QP (hw/mlx5/qp.c:4164-4167) on a port whose active MTU is 4096.
                        if data.len() > UD_MTU {
                            return Err(fail(syndrome::LOCAL_LENGTH));
                        }
                        Some(Self::datagram(qp, av, data.len(), imm.is_some(), model.node_guid))
                    }
                    None => None,
                },
                data,
            },
            opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM => Op::Write {
                raddr: wqe.raddr,
                rkey: wqe.rkey,
                imm,
                solicited: wqe.solicited,
                data,
            },
            opcode::RDMA_READ => {
                let len: u64 = scatter.iter().map(|(_, l)| l).sum();
                let len = u32::try_from(len).map_err(|_| fail(syndrome::LOCAL_LENGTH))?;
                Op::Read {
                    raddr: wqe.raddr,
                    rkey: wqe.rkey,
                    len,
                }
            }
            _ => {
                // Atomics land in exactly one 8-byte local buffer.
                if scatter.len() != 1 || scatter[0].1 != 8 {
                    return Err(fail(syndrome::LOCAL_LENGTH));
                }
                if wqe.opcode == opcode::ATOMIC_CS {
                    Op::CompareSwap {
                        raddr: wqe.raddr,
                        rkey: wqe.rkey,
                        compare: wqe.compare,
                        swap: wqe.swap_add,
                    }
                } else {
                    Op::FetchAdd {
                        raddr: wqe.raddr,
                        rkey: wqe.rkey,
                        add: wqe.swap_add,
                    }
                }
            }
        };
        // A UD send goes where its address vector says: `rlid`, and `dqp_dct`'s low 24 bits.
        let (dlid, dst_qpn) = match &wqe.av {
            Some(av) => (
                u16::from_be_bytes([av[14], av[15]]),
                u32::from_be_bytes([0, av[9], av[10], av[11]]),
            ),
            None => (qp.attrs.dest.dlid, qp.attrs.dest_qp_num),
        };
        Ok(Some(Work {
            qp: h,
            dlid,
            request: Request {
                dst_qpn,
                src_qpn: qp.qpn,
                src_lid: model.lid,
                op,
            },
            wqe_index: wqe.index,
            epoch: qp.epoch,
            nbb: wqe.nbb,
            opcode: wqe.opcode,
            signaled: wqe.signaled,
            scatter,
        }))
    }

    /// The headers a UD send from `qp` carries, from its address vector
    /// (`mlx5_wqe_av`: `qkey` at 0, `stat_rate_sl` at 12, `tclass` 26, `hop_limit` 27,
    /// `grh_gid_fl` 28, `rgid` 32), for a payload of `len` bytes.
    fn datagram(qp: &Qp, av: &[u8; 48], len: usize, imm: bool, node_guid: u64) -> Datagram {
        let be32 = |at: usize| u32::from_be_bytes([av[at], av[at + 1], av[at + 2], av[at + 3]]);
        // A Q_Key with its high bit set is a controlled one: the QP's own goes out instead.
        let qkey = match be32(0) {
            k if k & 0x8000_0000 != 0 => qp.attrs.qkey,
            k => k,
        };
        let grh_gid_fl = be32(28);
        // Bit 30 of `grh_gid_fl`: the address vector asks for a GRH (InfiniBand; RoCE
        // always has one).
        let grh = (grh_gid_fl & (1 << 30) != 0).then(|| {
            let mut g = [0u8; GRH_LEN];
            let flow = grh_gid_fl & 0xf_ffff;
            g[0..4].copy_from_slice(&((6 << 28) | (u32::from(av[26]) << 20) | flow).to_be_bytes());
            // PayLen: what follows the GRH (BTH 12, DETH 8, the immediate, the payload
            // padded to 4, ICRC 4).
            let paylen = 12 + 8 + if imm { 4 } else { 0 } + len.div_ceil(4) * 4 + 4;
            g[4..6].copy_from_slice(&(paylen as u16).to_be_bytes());
            g[6] = 0x1b;
            g[7] = av[27];
            // The source GID: the port's only one, fe80:: and the port GUID.
            g[8..16].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
            g[16..24].copy_from_slice(&node_guid.to_be_bytes());
            g[24..40].copy_from_slice(&av[32..48]);
            g
        });
        Datagram {
            qkey,
            sl: av[12] & 0xf,
            grh,
        }
    }

    /// Finishes `work` with the responder's answer (`None`: the fabric could not deliver it).
    pub fn complete(model: &mut Model, work: Work, answer: Option<Response>, mem: &dyn Memory, now: Instant) {
        let h = work.qp;
        let Some(qp) = model.qps.get_mut(h) else { return };
        // The QP left RTS while the request was out (modify to ERR/RESET): it is flushed or
        // reset instead, even if the QP is back in RTS at the same ring position by now.
        if qp.epoch != work.epoch || qp.sq_ci != work.wqe_index || !matches!(qp.state, qps::RTS | qps::SQD) {
            return;
        }
        let unacknowledged = matches!(qp.qp_type, abi::qpt::UC | abi::qpt::UD);
        let answer = match answer {
            // UC and UD have no acknowledgements: whatever happened at the responder (or if
            // nothing took the packet), the send is done.
            _ if unacknowledged => Response::Ack,
            Some(a) => a,
            None => Response::Dropped,
        };
        let fail = |model: &mut Model, s: u8| {
            Self::fail_send(model, h, work.wqe_index, work.nbb, work.opcode, s, mem);
        };
        let mut byte_cnt = 0;
        match answer {
            Response::Ack => {}
            Response::ReadData(bytes) => {
                let mut at = 0usize;
                for &(addr, len) in &work.scatter {
                    let len = len as usize;
                    let end = (at + len).min(bytes.len());
                    if at < end && mem.write(addr, &bytes[at..end]).is_err() {
                        return fail(model, syndrome::LOCAL_PROT);
                    }
                    at += len;
                }
                byte_cnt = bytes.len() as u32;
            }
            Response::AtomicOriginal(v) => {
                if let Some(&(addr, _)) = work.scatter.first() {
                    if mem.write(addr, &v.to_ne_bytes()).is_err() {
                        return fail(model, syndrome::LOCAL_PROT);
                    }
                }
                byte_cnt = 8;
            }
            Response::Nak(s) => return fail(model, s),
            Response::Rnr(timer) => {
                let rnr_retry = qp.attrs.rnr_retry;
                let left = qp.stall.map_or(rnr_retry, |s| s.rnr_left);
                if rnr_retry != 7 && left == 0 {
                    return fail(model, syndrome::RNR_RETRY_EXC);
                }
                let retry_left = qp.stall.map_or(qp.attrs.retry_cnt, |s| s.retry_left);
                let rnr_left = if rnr_retry == 7 { 7 } else { left - 1 };
                qp.stall = Some(Stall {
                    until: now + rnr_delay(timer),
                    rnr_left,
                    retry_left,
                });
                return;
            }
            Response::Dropped => {
                let left = qp.stall.map_or(qp.attrs.retry_cnt, |s| s.retry_left);
                if left == 0 {
                    return fail(model, syndrome::TRANSPORT_RETRY_EXC);
                }
                let rnr_left = qp.stall.map_or(qp.attrs.rnr_retry, |s| s.rnr_left);
                let until = now + ack_timeout(qp.attrs.timeout);
                qp.stall = Some(Stall {
                    until,
                    rnr_left,
                    retry_left: left - 1,
                });
                return;
            }
        }
        qp.stall = None;
        qp.sq_ci = qp.sq_ci.wrapping_add(work.nbb);
        if work.signaled {
            let cqe = Cqe::new(
                cqe_op::REQ,
                (u32::from(work.opcode) << 24) | qp.qpn,
                uidx(qp),
                work.wqe_index,
            )
            .byte_cnt(byte_cnt);
            Self::post_for(model, h, true, cqe, mem);
        }
    }

    /// The responder: runs `req` on the destination QP of this model.
    pub fn respond(model: &mut Model, req: &Request, mem: &dyn Memory) -> Response {
        let Some((h, qp)) = model.qps.iter().find(|(_, q)| q.qpn == req.dst_qpn) else {
            return Response::Dropped;
        };
        let receiving = matches!(qp.state, qps::RTR | qps::RTS | qps::SQD);
        let ud = qp.qp_type == abi::qpt::UD;
        let accepted = match &req.op {
            // A UD QP takes datagrams whose Q_Key is its own; the hardware drops the others
            // (and counts a Q_Key violation).
            Op::Send { datagram: Some(d), .. } => ud && receiving && d.qkey == qp.attrs.qkey,
            _ => !ud && receiving && qp.attrs.dest_qp_num == req.src_qpn,
        };
        if !accepted {
            return Response::Dropped;
        }
        let rc = qp.qp_type == abi::qpt::RC;
        // Remote read and atomics are off without responder resources (qp.c
        // set_qpc_atomic_flags: `if (!dest_rd_atomic) access_flags &= IB_ACCESS_REMOTE_WRITE`).
        let mut qp_access = qp.attrs.access;
        if rc && qp.attrs.max_dest_rd_atomic == 0 {
            qp_access &= abi::access::REMOTE_WRITE;
        }
        let (pd, min_rnr) = (qp.pd, qp.attrs.min_rnr_timer);
        let result = match &req.op {
            Op::Send {
                imm, solicited, data, ..
            } => Self::receive(model, h, req, *imm, *solicited, Some(data), mem),
            Op::Write {
                raddr,
                rkey,
                imm,
                solicited,
                data,
            } => {
                let need = abi::access::REMOTE_WRITE;
                match mr_covering(&model.mrs, *rkey, pd, *raddr, data.len() as u64, need) {
                    Some(at) if qp_access & need != 0 => {
                        // An immediate needs a receive WQE: check for one before writing.
                        if imm.is_some() && !Self::has_recv(model, h, mem) {
                            Err(Response::Rnr(min_rnr))
                        } else if mem.write(at, data).is_err() {
                            Err(Response::Nak(syndrome::REMOTE_ACCESS))
                        } else if imm.is_some() {
                            Self::receive(model, h, req, *imm, *solicited, None, mem)
                        } else {
                            Ok(Response::Ack)
                        }
                    }
                    _ => Err(Response::Nak(syndrome::REMOTE_ACCESS)),
                }
            }
            Op::Read { raddr, rkey, len } => {
                let need = abi::access::REMOTE_READ;
                match mr_covering(&model.mrs, *rkey, pd, *raddr, u64::from(*len), need) {
                    Some(at) if rc && qp_access & need != 0 => {
                        let mut buf = vec![0u8; *len as usize];
                        match mem.read(at, &mut buf) {
                            Ok(()) => Ok(Response::ReadData(buf)),
                            Err(_) => Err(Response::Nak(syndrome::REMOTE_ACCESS)),
                        }
                    }
                    _ if !rc => Err(Response::Nak(syndrome::REMOTE_INVAL_REQ)),
                    _ => Err(Response::Nak(syndrome::REMOTE_ACCESS)),
                }
            }
            Op::CompareSwap { raddr, rkey, .. } | Op::FetchAdd { raddr, rkey, .. } => {
                let need = abi::access::REMOTE_ATOMIC;
                if !rc || raddr % 8 != 0 {
                    Err(Response::Nak(syndrome::REMOTE_INVAL_REQ))
                } else {
                    match mr_covering(&model.mrs, *rkey, pd, *raddr, 8, need) {
                        Some(at) if qp_access & need != 0 => {
                            // Atomics operate on 64-bit words in host order, as on a device
                            // whose driver reports IB_ATOMIC_HCA (mlx5 reports it only
                            // when the device answers in host endianness).
                            let done = match &req.op {
                                Op::CompareSwap { compare, swap, .. } => mem.compare_swap(at, *compare, *swap),
                                Op::FetchAdd { add, .. } => mem.fetch_add(at, *add),
                                _ => Err(crate::mem::Fault),
                            };
                            done.map(Response::AtomicOriginal)
                                .map_err(|_| Response::Nak(syndrome::REMOTE_ACCESS))
                        }
                        _ => Err(Response::Nak(syndrome::REMOTE_ACCESS)),
                    }
                }
            }
        };
        match result {
            Ok(r) => r,
            Err(Response::Nak(s)) => {
                // A NAK'd request is fatal for an RC responder too; UC drops it silently.
                if rc {
                    if let Some(qp) = model.qps.get_mut(h) {
                        qp.state = qps::ERR;
                    }
                }
                Response::Nak(s)
            }
            Err(other) => other,
        }
    }

    fn has_recv(model: &mut Model, h: u32, mem: &dyn Memory) -> bool {
        matches!(Self::next_recv(model, h, mem), Ok(Some(_)))
    }

    /// The receive WQE the next message to QP `h` lands in: from its receive queue or its
    /// SRQ; `Ok(None)` when none is posted, `Err(())` when the doorbell record claims more
    /// than the ring holds (the QP, or the SRQ, is in error: the message is dropped).
    fn next_recv(model: &mut Model, h: u32, mem: &dyn Memory) -> Result<Option<RecvWqe>, ()> {
        let Some(qp) = model.qps.get(h) else { return Err(()) };
        if let Some(srq) = qp.srq {
            return Self::srq_next(model, srq, mem);
        }
        if qp.rq_cnt == 0 {
            return Ok(None);
        }
        let Ok(rcv) = mem.read_be32(qp.db + abi::RCV_DBR) else {
            Self::raise_qp_fatal(model, h);
            return Err(());
        };
        let rcv = rcv as u16;
        if rcv == qp.rq_ci {
            return Ok(None);
        }
        if u32::from(rcv.wrapping_sub(qp.rq_ci)) > qp.rq_cnt {
            Self::raise_qp_fatal(model, h);
            return Err(());
        }
        let stride = 1u64 << qp.rq_shift.min(31);
        Ok(Some(RecvWqe {
            segs: qp.buf + (u64::from(qp.rq_ci) & u64::from(qp.rq_cnt - 1)) * stride,
            max_segs: (stride / 16).min(64),
            index: qp.rq_ci,
            srq: None,
        }))
    }

    /// Hands `wqe` from QP `h`'s receive queue, or its SRQ, to the message.
    fn take_recv(model: &mut Model, h: u32, wqe: &RecvWqe, mem: &dyn Memory) {
        match wqe.srq {
            Some(srq) => Self::srq_take(model, srq, wqe.index, mem),
            None => {
                if let Some(qp) = model.qps.get_mut(h) {
                    qp.rq_ci = qp.rq_ci.wrapping_add(1);
                }
            }
        }
    }

    /// Consumes the next receive WQE of QP `h` for an incoming message: scatters `data`
    /// (SEND) and writes the receive CQE. `Err` is the response for the requester.
    fn receive(
        model: &mut Model,
        h: u32,
        req: &Request,
        imm: Option<u32>,
        solicited: bool,
        data: Option<&Vec<u8>>,
        mem: &dyn Memory,
    ) -> Result<Response, Response> {
        let Some(qp) = model.qps.get(h) else {
            return Err(Response::Dropped);
        };
        let min_rnr = qp.attrs.min_rnr_timer;
        let rc = qp.qp_type == abi::qpt::RC;
        let (qpn, pd) = (qp.qpn, qp.pd);
        let u = Self::recv_uidx(model, qp);
        let wqe = match Self::next_recv(model, h, mem) {
            Ok(Some(wqe)) => wqe,
            // UC drops what it cannot receive.
            Ok(None) if rc => return Err(Response::Rnr(min_rnr)),
            Ok(None) => return Ok(Response::Ack),
            Err(()) => return Err(Response::Dropped),
        };
        let index = wqe.index;
        // A UD receive buffer starts with room for the GRH: the hardware writes the GRH
        // there when the packet carried one and leaves those bytes alone when not; the
        // byte count includes them either way.
        let datagram = match &req.op {
            Op::Send { datagram: Some(d), .. } => Some(d),
            _ => None,
        };
        let with_grh;
        let (data, unwritten) = match (data, datagram) {
            (Some(payload), Some(d)) => {
                let mut bytes = Vec::with_capacity(GRH_LEN + payload.len());
                bytes.extend_from_slice(d.grh.as_ref().unwrap_or(&[0; GRH_LEN]));
                bytes.extend_from_slice(payload);
                with_grh = bytes;
                (Some(&with_grh), if d.grh.is_some() { 0 } else { GRH_LEN })
            }
            (data, _) => (data, 0),
        };
        let local_error = |model: &mut Model, synd: u8, nak: u8| {
            Self::take_recv(model, h, &wqe, mem);
            if let Some(qp) = model.qps.get_mut(h) {
                qp.state = qps::ERR;
            }
            let cqe = Cqe::new(cqe_op::RESP_ERR, qpn, u, index).syndrome(synd);
            Self::post_for(model, h, false, cqe, mem);
            Err(Response::Nak(nak))
        };
        let len = data.map_or(0, |d| d.len());
        if let Some(data) = data {
            let mut at = 0usize;
            for s in 0..wqe.max_segs {
                if at >= len {
                    break;
                }
                let mut seg = [0u8; 16];
                if mem.read(wqe.segs + s * 16, &mut seg).is_err() {
                    return local_error(model, syndrome::LOCAL_PROT, syndrome::REMOTE_OP);
                }
                let count = u32::from_be_bytes(seg[0..4].try_into().unwrap_or_default());
                let lkey = u32::from_be_bytes(seg[4..8].try_into().unwrap_or_default());
                let addr = u64::from_be_bytes(seg[8..16].try_into().unwrap_or_default());
                if lkey == abi::INVALID_LKEY {
                    break;
                }
                let take = (count as usize).min(len - at);
                if take == 0 {
                    continue;
                }
                let Some(host) = mr_covering(&model.mrs, lkey, pd, addr, take as u64, abi::access::LOCAL_WRITE) else {
                    return local_error(model, syndrome::LOCAL_PROT, syndrome::REMOTE_OP);
                };
                let from = unwritten.clamp(at, at + take);
                if from < at + take && mem.write(host + (from - at) as u64, &data[from..at + take]).is_err() {
                    return local_error(model, syndrome::LOCAL_PROT, syndrome::REMOTE_OP);
                }
                at += take;
            }
            if at < len {
                return local_error(model, syndrome::LOCAL_LENGTH, syndrome::REMOTE_INVAL_REQ);
            }
        }
        Self::take_recv(model, h, &wqe, mem);
        let op = match (data.is_some(), imm.is_some()) {
            (true, false) => cqe_op::RESP_SEND,
            (true, true) => cqe_op::RESP_SEND_IMM,
            (false, _) => cqe_op::RESP_WR_IMM,
        };
        let payload_len = match &req.op {
            Op::Write { data, .. } => data.len(),
            _ => len,
        };
        let mut cqe = Cqe::new(op, qpn, u, index)
            .byte_cnt(payload_len as u32)
            .source(req.src_lid, req.src_qpn)
            .solicited(solicited);
        if let Some(imm) = imm {
            cqe = cqe.imm(imm);
        }
        if let Some(d) = datagram {
            cqe = cqe.datagram(d);
        }
        Self::post_for(model, h, false, cqe, mem);
        Ok(Response::Ack)
    }
}
