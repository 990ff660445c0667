//! mlx5 queue pairs (RC, UC): one user buffer, the receive queue first and the send queue
//! after it, a doorbell record, and the 8-byte UAR doorbell of the bfreg the kernel chose.
//!
//! The poster and the CQ's poller share [`QpShared`] (`qp/shared.rs`): the request counters
//! and the work-request id tables.

use super::cq::{CqShared, Mlx5Cq};
use super::mem::{Buffer, Doorbell};
use super::srq::{Mlx5Srq, SrqShared};
use super::wqe::{self, ctrl_flags, opcode, Ctrl, SEG, SEND_WQE_BB};
use super::{abi, Ctx};
use crate::attr::{QpCap, QpState, QpType};
use crate::error::{Error, Result, WrReject};
use crate::provider::{CreateQpCall, KernelCall, ProviderQp, QpQueues, QpRequest};
use crate::wr::{RecvWr, SendFlags, SendList, SendOp, SendWr};
use std::ptr::NonNull;
use std::sync::Arc;
use zerocopy::IntoBytes;

#[cfg(all(test, loom))]
mod model;
mod shared;

pub(super) use shared::{QpShared, SendRun};

/// Doorbell record words (`MLX5_RCV_DBR`, `MLX5_SND_DBR`).
const RCV_DBR: usize = 0;
const SND_DBR: usize = 1;
/// Bytes of the segments before the data of the largest request: control, remote address.
const SQ_HEADER: usize = 2 * SEG;

/// The queue geometry a QP is created with, from the capabilities asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    /// Send basic blocks (a power of two) and bytes per send WQE (whole blocks).
    sq_blocks: u32,
    sq_wqe_size: u32,
    /// Receive slots (a power of two) and log2 of a slot's bytes.
    rq_slots: u32,
    rq_shift: u32,
    /// What the user is told.
    cap: QpCap,
}

impl Geometry {
    fn new(asked: QpCap, ctx: &Ctx) -> Result<Self> {
        let invalid = |what: String| Error::invalid("create_qp", what);
        let data = (asked.max_send_sge as usize * SEG).max(2 * SEG); // atomics: operands + 1 SGE
        let inline = wqe::inline_units(asked.max_inline_data as usize) * SEG;
        let sq_wqe_size = (SQ_HEADER + data.max(inline)).next_multiple_of(SEND_WQE_BB);
        if sq_wqe_size > usize::from(ctx.max_sq_desc_sz) {
            return Err(invalid(format!(
                "{} send SGEs / {} inline bytes need {sq_wqe_size}-byte WQEs; the device takes {}",
                asked.max_send_sge, asked.max_inline_data, ctx.max_sq_desc_sz
            )));
        }
        let blocks_per_wqe = (sq_wqe_size / SEND_WQE_BB) as u32;
        let sq_blocks = asked
            .max_send_wr
            .max(1)
            .checked_mul(blocks_per_wqe)
            .and_then(u32::checked_next_power_of_two)
            .filter(|&b| b <= ctx.max_send_wqebb)
            .ok_or_else(|| invalid(format!("{} send requests: too many for the device", asked.max_send_wr)))?;
        let rq_sge = asked.max_recv_sge.max(1);
        let rq_stride = (rq_sge as usize * SEG).next_power_of_two();
        if rq_stride > usize::from(ctx.max_rq_desc_sz) {
            return Err(invalid(format!("{rq_sge} receive SGEs: too many for the device")));
        }
        let rq_slots = asked
            .max_recv_wr
            .max(1)
            .checked_next_power_of_two()
            .filter(|&s| s <= ctx.max_recv_wr)
            .ok_or_else(|| {
                invalid(format!(
                    "{} receive requests: too many for the device",
                    asked.max_recv_wr
                ))
            })?;
        let room = sq_wqe_size - SQ_HEADER;
        let cap = QpCap {
            max_send_wr: sq_blocks / blocks_per_wqe,
            max_recv_wr: rq_slots,
            max_send_sge: (room / SEG) as u32,
            max_recv_sge: (rq_stride / SEG) as u32,
            max_inline_data: (room - 4) as u32,
        };
        Ok(Self {
            sq_blocks,
            sq_wqe_size: sq_wqe_size as u32,
            rq_slots,
            rq_shift: rq_stride.trailing_zeros(),
            cap,
        })
    }

    fn rq_bytes(&self) -> usize {
        (self.rq_slots as usize) << self.rq_shift
    }

    fn sq_bytes(&self) -> usize {
        self.sq_blocks as usize * SEND_WQE_BB
    }
}

/// The shared half of an SRQ from its provider half.
fn srq_half(srq: &dyn crate::provider::SrqQueue) -> Result<Arc<SrqShared>> {
    srq.as_any()
        .downcast_ref::<Mlx5Srq>()
        .map(|srq| srq.shared().clone())
        .ok_or_else(|| Error::invalid("create_qp", "the SRQ is not an mlx5 SRQ"))
}

/// The shared half of a CQ from its provider half.
fn cq_half(cq: &dyn crate::provider::CqRing) -> Result<Arc<CqShared>> {
    cq.as_any()
        .downcast_ref::<Mlx5Cq>()
        .map(|cq| cq.shared().clone())
        .ok_or_else(|| Error::invalid("create_qp", "the CQ is not an mlx5 CQ"))
}

pub(super) fn create(ctx: &Arc<Ctx>, req: &QpRequest<'_>, kernel: CreateQpCall<'_>) -> Result<ProviderQp> {
    if req.qp_type == QpType::Ud {
        return Err(Error::Unsupported {
            verb: "create_qp",
            what: "UD QPs on mlx5 (not built yet)",
        });
    }
    let srq = req.srq.map(srq_half).transpose()?;
    let (send_cq, recv_cq) = (cq_half(req.send_cq)?, cq_half(req.recv_cq)?);
    // On an SRQ the receive capabilities asked for are not the QP's to size.
    let asked = match srq {
        Some(_) => QpCap {
            max_recv_wr: 0,
            max_recv_sge: 0,
            ..req.cap
        },
        None => req.cap,
    };
    let mut geo = Geometry::new(asked, ctx)?;
    if srq.is_some() {
        // No receive queue of its own (the driver's `qp_has_rq` is false: both sizes 0).
        (geo.rq_slots, geo.rq_shift, geo.cap.max_recv_wr, geo.cap.max_recv_sge) = (0, 0, 0, 0);
    }
    let buf = Buffer::new(geo.rq_bytes() + geo.sq_bytes(), "CREATE_QP")?;
    let db = ctx.db_pages.alloc("CREATE_QP")?;
    let uidx = UserIndex::new(ctx)?;
    let cmd = abi::CreateQp {
        buf_addr: buf.addr(),
        db_addr: db.addr(),
        sq_wqe_count: geo.sq_blocks,
        rq_wqe_count: geo.rq_slots,
        rq_wqe_shift: geo.rq_shift,
        uidx: uidx.0,
        ..Default::default()
    };
    let mut resp = abi::CreateQpResp::default();
    let created = kernel(geo.cap, cmd.as_bytes(), resp.as_mut_bytes())?;
    let doorbell = ctx.bfreg(resp.bfreg_index).ok_or_else(|| {
        Error::malformed(
            "CREATE_QP",
            format!("bfreg index {} outside the UARs", resp.bfreg_index),
        )
    })?;
    let shared = Arc::new(QpShared::new(geo.sq_blocks as usize, geo.rq_slots as usize, srq));
    send_cq.link(uidx.0, shared.clone());
    recv_cq.link(uidx.0, shared.clone());
    let queues = Box::new(Mlx5Qp {
        shared,
        sq: SendQueue {
            // SAFETY: the SQ starts right after the RQ, inside the buffer.
            base: unsafe { buf.base().add(geo.rq_bytes()) },
            mask: geo.sq_bytes() - 1,
            cur_post: 0,
            head: 0,
            max_post: geo.cap.max_send_wr,
            max_sge: geo.cap.max_send_sge,
            max_inline: geo.cap.max_inline_data,
            qpn: created.qpn,
            last_ctrl: [0; 8],
            last_start: 0,
            last_ds: 0,
            last_inline: false,
        },
        rq: RecvQueue {
            base: buf.base(),
            slots: geo.rq_slots,
            shift: geo.rq_shift,
            head: 0,
            max_sge: geo.cap.max_recv_sge,
        },
        qp_type: req.qp_type,
        doorbell,
        db,
        _buf: buf,
        send_cq,
        recv_cq,
        uidx,
        ctx: ctx.clone(),
    });
    Ok(ProviderQp { queues, cap: geo.cap })
}

/// A user index, freed on drop.
struct UserIndex(u32, Arc<Ctx>);

impl UserIndex {
    fn new(ctx: &Arc<Ctx>) -> Result<Self> {
        Ok(Self(ctx.uidx.alloc()?, ctx.clone()))
    }
}

impl Drop for UserIndex {
    fn drop(&mut self) {
        self.1.uidx.free(self.0);
    }
}

/// Where a QP's send doorbell goes: a UAR page and the bfreg's offset in it.
pub(super) struct SendDoorbell {
    pub(super) page: usize,
    pub(super) offset: usize,
    /// The two halves of the bfreg alternate (libmlx5 toggles them on every ring).
    pub(super) toggle: usize,
    /// Bytes of a BlueFlame buffer; 0: no BlueFlame.
    pub(super) bf_size: usize,
}

/// The poster's view of the send queue.
struct SendQueue {
    base: NonNull<u8>,
    /// Bytes in the ring less one (a power of two less one).
    mask: usize,
    /// Basic blocks used, free-running (the WQE index the device counts in).
    cur_post: u32,
    /// Requests posted, free-running.
    head: u32,
    max_post: u32,
    max_sge: u32,
    max_inline: u32,
    qpn: u32,
    /// The first 8 bytes of the last WQE's control segment: what the UAR doorbell carries.
    last_ctrl: [u8; 8],
    /// The last WQE's byte position in the ring, its size in 16-byte units, and whether it
    /// was an inline request with SGEs (libmlx5's condition for a BlueFlame copy).
    last_start: usize,
    last_ds: usize,
    last_inline: bool,
}

/// Writes a WQE's segments, wrapping at the ring's end.
struct WqeWriter<'a> {
    sq: &'a SendQueue,
    /// Byte position, unmasked.
    pos: usize,
}

impl WqeWriter<'_> {
    /// Writes one segment at the current position, which is a whole number of segments
    /// into the ring: a ring of whole basic blocks never ends inside it.
    #[inline(always)]
    fn seg(&mut self, seg: [u8; SEG]) {
        debug_assert_eq!(self.pos % SEG, 0, "segments start on segment boundaries");
        let at = self.pos & self.sq.mask & !(SEG - 1);
        // SAFETY: `at` is a multiple of SEG below the ring's size, itself a multiple of SEG, so
        // the segment lies inside the ring, which no Rust reference covers.
        unsafe { self.sq.base.as_ptr().add(at).cast::<[u8; SEG]>().write_unaligned(seg) };
        self.pos += SEG;
    }

    /// Copies `bytes` to the ring at the current position.
    fn put(&mut self, bytes: &[u8]) {
        // SAFETY: the source is a slice the caller owns, readable for its length.
        unsafe { self.copy(bytes.as_ptr(), bytes.len()) }
    }

    /// Copies `len` bytes from `from`, splitting at the ring's end.
    ///
    /// # Safety
    /// `from` must be readable for `len` bytes.
    unsafe fn copy(&mut self, mut from: *const u8, mut len: usize) {
        while len > 0 {
            let at = self.pos & self.sq.mask;
            let n = len.min(self.sq.mask + 1 - at);
            // SAFETY: `at + n` stays inside the ring; the source per our contract; the ring
            // is user memory no Rust reference covers.
            unsafe {
                std::ptr::copy_nonoverlapping(from, self.sq.base.as_ptr().add(at), n);
                from = from.add(n);
            }
            self.pos += n;
            len -= n;
        }
    }
}

/// The poster's view of the receive queue.
struct RecvQueue {
    base: NonNull<u8>,
    slots: u32,
    shift: u32,
    /// Requests posted, free-running.
    head: u32,
    max_sge: u32,
}

/// The poster's half of a QP.
struct Mlx5Qp {
    shared: Arc<QpShared>,
    sq: SendQueue,
    rq: RecvQueue,
    qp_type: QpType,
    doorbell: SendDoorbell,
    db: Doorbell,
    /// The ring memory `sq.base` and `rq.base` point into.
    _buf: Buffer,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    uidx: UserIndex,
    ctx: Arc<Ctx>,
}

// SAFETY: the ring pointers point into `_buf`, owned here; everything shared with the poller
// is atomic (`QpShared`) or locked (`CqShared`).
unsafe impl Send for Mlx5Qp {}

impl SendQueue {
    /// Checks `wr` against the queue's limits and room (`posted` this call so far).
    fn check(&self, wr: &SendWr<'_>, shared: &QpShared, posted: u32) -> Result<(), WrReject> {
        // Memory window operations and invalidation need UMR WQEs, which this provider does
        // not write.
        if matches!(
            wr.op,
            SendOp::SendWithInv { .. } | SendOp::LocalInv { .. } | SendOp::BindMw(_)
        ) {
            return Err(WrReject::OpcodeNotSupported);
        }
        if wr.flags.contains(SendFlags::INLINE) {
            let len = wr.total_len();
            if len > u64::from(self.max_inline) {
                return Err(WrReject::InlineTooLong {
                    given: len as usize,
                    max: self.max_inline,
                });
            }
        } else if wr.sg_list.len() > self.max_sge as usize {
            return Err(WrReject::TooManySge {
                given: wr.sg_list.len(),
                max: self.max_sge,
            });
        }
        if shared.send_full(self.head.wrapping_add(posted), self.max_post) {
            return Err(WrReject::QueueFull);
        }
        Ok(())
    }

    /// Writes `wr` as the WQE at `cur_post`; returns the basic blocks it took.
    ///
    /// # Safety
    /// `wr` passed [`Self::check`]; inline requests' SGEs name readable memory.
    unsafe fn write(&mut self, wr: &SendWr<'_>) -> u32 {
        let start = (self.cur_post as usize * SEND_WQE_BB) & self.mask;
        let mut w = WqeWriter {
            sq: self,
            pos: start + SEG,
        };
        let (op, imm) = match wr.op {
            SendOp::Send => (opcode::SEND, 0),
            // The WQE carries immediate data in network order (`SendOp::imm_data`).
            SendOp::SendWithImm { imm } => (opcode::SEND_IMM, imm.to_be()),
            SendOp::RdmaWrite(r) => {
                w.seg(wqe::raddr_seg(r.addr, r.rkey));
                (opcode::RDMA_WRITE, 0)
            }
            SendOp::RdmaWriteWithImm(r, imm) => {
                w.seg(wqe::raddr_seg(r.addr, r.rkey));
                (opcode::RDMA_WRITE_IMM, imm.to_be())
            }
            SendOp::RdmaRead(r) => {
                w.seg(wqe::raddr_seg(r.addr, r.rkey));
                (opcode::RDMA_READ, 0)
            }
            SendOp::CompareSwap { remote, compare, swap } => {
                w.seg(wqe::raddr_seg(remote.addr, remote.rkey));
                w.seg(wqe::atomic_seg(swap, compare));
                (opcode::ATOMIC_CS, 0)
            }
            SendOp::FetchAdd { remote, add } => {
                w.seg(wqe::raddr_seg(remote.addr, remote.rkey));
                w.seg(wqe::atomic_seg(add, 0));
                (opcode::ATOMIC_FA, 0)
            }
            // Refused by `check`: nothing is written.
            SendOp::SendWithInv { .. } | SendOp::LocalInv { .. } | SendOp::BindMw(_) => return 0,
        };
        if wr.flags.contains(SendFlags::INLINE) {
            // No bytes, no inline segment at all (libmlx5 `set_data_inl_seg`: size 0).
            let len = wr.total_len() as u32;
            if len > 0 {
                w.put(&wqe::inline_header(len));
                for sge in wr.sg_list {
                    // SAFETY: inline SGEs name readable memory (our contract); the length
                    // was checked against the WQE's room.
                    unsafe { w.copy(sge.addr as *const u8, sge.length as usize) };
                }
                w.pos = w.pos.next_multiple_of(SEG);
            }
        } else if wr.op.is_atomic() {
            // The device writes exactly the 8-byte old value.
            let sge = wr.sg_list[0];
            w.seg(wqe::data_seg(8, sge.lkey, sge.addr));
        } else {
            for sge in wr.sg_list.iter().filter(|s| s.length != 0) {
                w.seg(wqe::data_seg(sge.length, sge.lkey, sge.addr));
            }
        }
        let ds = (w.pos - start) / SEG;
        let mut fm_ce_se = 0;
        for (flag, bit) in [
            (SendFlags::SIGNALED, ctrl_flags::CQ_UPDATE),
            (SendFlags::SOLICITED, ctrl_flags::SOLICITED),
            (SendFlags::FENCE, ctrl_flags::FENCE),
        ] {
            if wr.flags.contains(flag) {
                fm_ce_se |= bit;
            }
        }
        let ctrl = wqe::ctrl_seg(&Ctrl {
            pi: self.cur_post as u16,
            opcode: op,
            opmod: 0,
            qpn: self.qpn,
            fm_ce_se,
            ds: ds as u8,
            signature: 0,
            imm,
        });
        let mut at_start = WqeWriter { sq: self, pos: start };
        at_start.seg(ctrl);
        self.last_ctrl.copy_from_slice(&ctrl[..8]);
        (self.last_start, self.last_ds) = (start, ds);
        self.last_inline = wr.flags.contains(SendFlags::INLINE) && !wr.sg_list.is_empty();
        (ds * SEG).div_ceil(SEND_WQE_BB) as u32
    }
}

impl SendQueue {
    /// `len` bytes of the ring from byte `start` (a multiple of 8), as 8-byte words,
    /// wrapping at the ring's end.
    fn words(&self, start: usize, len: usize) -> impl ExactSizeIterator<Item = [u8; 8]> + '_ {
        (0..len / 8).map(move |i| {
            let at = (start + 8 * i) & self.mask;
            // SAFETY: `at` is inside the ring and 8-aligned (the ring's size is a multiple
            // of 64); the poster, which alone writes the ring, is the caller.
            unsafe { self.base.as_ptr().add(at).cast::<[u8; 8]>().read() }
        })
    }
}

impl RecvQueue {
    /// Writes `wr` into the slot of request `head` (checked: SGE count, room).
    fn write(&self, wr: &RecvWr<'_>) {
        let slot = (self.head & (self.slots - 1)) as usize;
        // SAFETY: `slot < slots`, so the slot's `1 << shift` bytes are inside the RQ.
        let at = unsafe { self.base.add(slot << self.shift) };
        let mut n = 0;
        for sge in wr.sg_list.iter().filter(|s| s.length != 0) {
            // SAFETY: `n < max_sge`, which fits the slot.
            unsafe {
                at.add(n * SEG)
                    .cast::<[u8; SEG]>()
                    .write(wqe::data_seg(sge.length, sge.lkey, sge.addr))
            };
            n += 1;
        }
        if n < self.max_sge as usize {
            // SAFETY: as above.
            unsafe { at.add(n * SEG).cast::<[u8; SEG]>().write(wqe::rq_terminator()) };
        }
    }
}

// SAFETY: CREATE_QP's driver bytes name `_buf` and `db`, owned by the QP until it is dropped
// after the kernel destroy; MODIFY_QP's carry no address.
unsafe impl QpQueues for Mlx5Qp {
    unsafe fn post_send(&mut self, wrs: SendList<'_, '_>) -> Result<()> {
        let mut posted = 0u32;
        let mut rejected = None;
        for (index, wr) in wrs.iter(self.qp_type).enumerate() {
            let checked = wr.and_then(|wr| {
                self.sq.check(wr, &self.shared, posted)?;
                Ok(wr)
            });
            let wr = match checked {
                Ok(wr) => wr,
                Err(reason) => {
                    rejected = Some((index, reason));
                    break;
                }
            };
            // SAFETY: checked above; inline memory is the caller's contract.
            let blocks = unsafe { self.sq.write(wr) };
            self.shared
                .record_send(self.sq.cur_post, blocks, self.sq.head.wrapping_add(posted), wr.wr_id);
            self.sq.cur_post = self.sq.cur_post.wrapping_add(blocks);
            posted += 1;
        }
        if posted > 0 {
            self.sq.head = self.sq.head.wrapping_add(posted);
            self.shared.publish_sends(self.sq.head);
            self.db.set(SND_DBR, self.sq.cur_post & 0xffff);
            // The record and the WQEs must be in memory before the device hears the doorbell.
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            let d = &mut self.doorbell;
            if let Some(uar) = self.ctx.uars.get(d.page) {
                // BlueFlame (the WQE itself through the UAR, sparing the device its fetch)
                // on libmlx5's terms: a lone request (inline, or any with `prefer_bf`) of
                // more than the control segment that fits the buffer (qp.c post_send_db).
                let sq = &self.sq;
                let bytes = sq.last_ds * SEG;
                let wanted = sq.last_inline || self.ctx.prefer_bf;
                if posted == 1 && d.bf_size > 0 && wanted && sq.last_ds > 1 && bytes <= d.bf_size {
                    uar.copy64(d.offset, sq.words(sq.last_start, bytes.next_multiple_of(SEND_WQE_BB)));
                } else {
                    uar.write64(d.offset, sq.last_ctrl);
                }
            }
            d.offset ^= d.toggle;
        }
        match rejected {
            None => Ok(()),
            Some((index, reason)) => Err(Error::WorkRequest {
                verb: "post_send",
                index,
                reason,
            }),
        }
    }

    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.shared.srq().is_some() {
            return Err(Error::invalid("post_recv", "the QP receives from its SRQ: post there"));
        }
        let mut result = Ok(());
        for (index, wr) in wrs.iter().enumerate() {
            let reject = |reason| {
                Err(Error::WorkRequest {
                    verb: "post_recv",
                    index,
                    reason,
                })
            };
            if wr.sg_list.len() > self.rq.max_sge as usize {
                result = reject(WrReject::TooManySge {
                    given: wr.sg_list.len(),
                    max: self.rq.max_sge,
                });
                break;
            }
            if self.shared.recv_full(self.rq.head, self.rq.slots) {
                result = reject(WrReject::QueueFull);
                break;
            }
            self.rq.write(wr);
            self.shared.record_recv(self.rq.head, wr.wr_id);
            self.rq.head = self.rq.head.wrapping_add(1);
        }
        self.shared.publish_recvs(self.rq.head);
        self.db.set(RCV_DBR, self.rq.head & 0xffff);
        result
    }

    fn modify(&mut self, next: Option<QpState>, kernel: KernelCall<'_, ()>) -> Result<()> {
        let mut resp = abi::ModifyQpResp::default();
        kernel(abi::ModifyQp::default().as_bytes(), resp.as_mut_bytes())?;
        if next == Some(QpState::Reset) {
            // The kernel cleans CQs for kernel QPs only.
            self.scrub(false);
            self.shared.reset();
            (self.sq.cur_post, self.sq.head, self.rq.head) = (0, 0, 0);
            self.db.set(RCV_DBR, 0);
            self.db.set(SND_DBR, 0);
        }
        Ok(())
    }

    fn destroyed(&mut self) {
        self.scrub(true);
    }
}

impl Mlx5Qp {
    /// Removes the QP's CQEs from both CQs (once when they are one), and with `unlink` the
    /// QP from their tables.
    fn scrub(&self, unlink: bool) {
        self.send_cq.scrub(self.uidx.0, unlink);
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.scrub(self.uidx.0, unlink);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::{Remote, Sge};

    /// A send queue of `blocks` basic blocks on heap memory.
    fn send_queue(buf: &Buffer, blocks: usize) -> SendQueue {
        SendQueue {
            base: buf.base(),
            mask: blocks * SEND_WQE_BB - 1,
            cur_post: 0,
            head: 0,
            max_post: blocks as u32,
            max_sge: 4,
            max_inline: 100,
            qpn: 0x1c0,
            last_ctrl: [0; 8],
            last_start: 0,
            last_ds: 0,
            last_inline: false,
        }
    }

    /// The ring's bytes.
    fn ring(buf: &Buffer, blocks: usize) -> Vec<u8> {
        // SAFETY: the buffer holds at least `blocks` basic blocks, written by the test only.
        unsafe { std::slice::from_raw_parts(buf.base().as_ptr(), blocks * SEND_WQE_BB) }.to_vec()
    }

    /// The reference's capture: a signaled 100-byte SEND plus a zero-length SGE, which is
    /// skipped (ds 2, one block).
    #[test]
    fn send_wqe_matches_the_libmlx5_capture() {
        let buf = Buffer::new(4096, "test").unwrap();
        let mut sq = send_queue(&buf, 4);
        let sges = [
            Sge {
                addr: 0x1122_3344_5566_7788,
                length: 100,
                lkey: 0xabcd,
            },
            Sge {
                addr: 0,
                length: 0,
                lkey: 0,
            },
        ];
        let wr = SendWr::new(1, SendOp::Send, &sges);
        // SAFETY: no inline data; the queue is empty.
        assert_eq!(unsafe { sq.write(&wr) }, 1);
        let bytes = ring(&buf, 4);
        assert_eq!(&bytes[..16], &[0, 0, 0, 0x0a, 0, 1, 0xc0, 2, 0, 0, 0, 8, 0, 0, 0, 0]);
        assert_eq!(&bytes[16..32], &wqe::data_seg(100, 0xabcd, 0x1122_3344_5566_7788));
        assert_eq!(sq.last_ctrl, bytes[..8]);
    }

    /// An inline RDMA write of 90 bytes (ds 8, two blocks) posted at the last block of the
    /// ring continues at its start, as libmlx5 lays it out.
    #[test]
    fn wqes_straddle_the_ring_end() {
        let blocks = 4;
        let buf = Buffer::new(4096, "test").unwrap();
        let mut sq = send_queue(&buf, blocks);
        sq.cur_post = 3;
        let data: Vec<u8> = (0..90).collect();
        let sges = [Sge {
            addr: data.as_ptr() as u64,
            length: 90,
            lkey: 0,
        }];
        let remote = Remote { addr: 0x1000, rkey: 7 };
        let wr = SendWr::new(9, SendOp::RdmaWrite(remote), &sges).set_flags(SendFlags::INLINE);
        // SAFETY: the inline SGE names `data`.
        assert_eq!(unsafe { sq.write(&wr) }, 2);
        let bytes = ring(&buf, blocks);
        let mut wqe = bytes[3 * SEND_WQE_BB..].to_vec();
        wqe.extend_from_slice(&bytes[..SEND_WQE_BB]);
        assert_eq!(&wqe[..8], &[0, 0, 3, 0x08, 0, 1, 0xc0, 8]);
        assert_eq!(&wqe[16..32], &wqe::raddr_seg(0x1000, 7));
        assert_eq!(&wqe[32..36], &wqe::inline_header(90));
        assert_eq!(&wqe[36..126], &data[..]);
        // What a BlueFlame copy of it carries: its two blocks, in order across the end.
        assert_eq!((sq.last_start, sq.last_ds, sq.last_inline), (3 * SEND_WQE_BB, 8, true));
        let copied: Vec<u8> = sq.words(sq.last_start, 2 * SEND_WQE_BB).flatten().collect();
        assert_eq!(copied, wqe);
    }

    /// An inline request carrying no bytes (no SGE, or only empty ones) has no inline
    /// segment, as libmlx5 writes it: the control segment alone (ds 1).
    #[test]
    fn empty_inline_requests_have_no_inline_segment() {
        let buf = Buffer::new(4096, "test").unwrap();
        let mut sq = send_queue(&buf, 4);
        let empty = [Sge {
            addr: 0x10,
            length: 0,
            lkey: 1,
        }];
        for sges in [&[][..], &empty[..]] {
            let wr = SendWr::new(1, SendOp::Send, sges).set_flags(SendFlags::INLINE);
            // SAFETY: no inline byte is read.
            assert_eq!(unsafe { sq.write(&wr) }, 1);
            assert_eq!(sq.last_ctrl[7], 1, "ds");
            sq.cur_post += 1;
        }
    }
}
