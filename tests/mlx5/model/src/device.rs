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

use crate::abi::{self, cqe_op, qps};
use crate::kernel::Model;
use crate::mem::Memory;
use crate::objects::{Arm, Cq, EventSink, Mr, Qp};
use crate::wire::{Datagram, Request};
use std::sync::Arc;
use std::time::Duration;

pub mod bfcheck;
mod recv;
mod send;

pub use bfcheck::{BfWatch, Violation};
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
    /// A UD receive's `flags_rqpn` high byte: the GRH flag (bits 28-29: non-zero when the
    /// packet had a network header; libmlx5 and mlx5_ib set `IBV_WC_GRH` from it), and on
    /// InfiniBand the service level (bits 24-27), on Ethernet the network header's type
    /// (bits 24-25, hw/mlx5/cq.c:248: 0 GRH, 1 IPv6, 2 IPv4; the service level comes from a
    /// VLAN tag, and the model has none).
    fn datagram(mut self, d: &Datagram, l3: Option<recv::L3>, eth: bool) -> Self {
        let low = if eth { l3.map_or(0, |k| k as u8) } else { d.sl & 0xf };
        self.0[24] = low | if l3.is_some() { 1 << 4 } else { 0 };
        self
    }
    /// A connected QP's receive of a packet with a network header: the GRH flag, and on
    /// Ethernet its type (the SL bits of InfiniBand stay 0 for RC and UC).
    fn network_header(mut self, l3: recv::L3, eth: bool) -> Self {
        self.0[24] = (1 << 4) | if eth { l3 as u8 } else { 0 };
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
}
