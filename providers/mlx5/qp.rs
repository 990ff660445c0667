//! mlx5 queue pairs (RC, UC, UD): one user buffer, the receive queue first and the send
//! queue after it, a doorbell record, and the 8-byte UAR doorbell of the bfreg the kernel
//! chose. A UD send carries its AH's address vector in a datagram segment after the control
//! segment.
//!
//! The poster and the CQ's poller share [`QpShared`] (`qp/shared.rs`): the request counters
//! and the work-request id tables.

use super::cq::{CqShared, Mlx5Cq};
use super::mem::{mmio_fence, Buffer, Doorbell};
use super::srq::{Mlx5Srq, SrqShared};
use super::wqe::{self, ctrl_flags, opcode, Ctrl, Words, SEG, SEND_WQE_BB};
use super::{abi, ah, Ctx};
use crate::attr::{QpCap, QpState, QpType};
use crate::error::{Error, Result, WrReject};
use crate::front_end::{GatheredChains, Queues};
use crate::provider::{CreateQpCall, KernelCall, ProviderQp, QpQueues, QpRequest};
use crate::wr::{RecvWr, SendFlags, SendList, SendOp, SendWr, Sge};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use zerocopy::IntoBytes;

#[cfg(all(test, loom))]
mod model;
mod shared;

pub(super) use shared::{QpShared, SendRun};

/// Doorbell record words (`MLX5_RCV_DBR`, `MLX5_SND_DBR`).
const RCV_DBR: usize = 0;
const SND_DBR: usize = 1;
/// Bytes of the segments before the data of the largest request: control, then remote
/// address (RC, UC) or the datagram segment (UD).
const SQ_HEADER: usize = 2 * SEG;
const UD_SQ_HEADER: usize = SEG + ah::AV_SIZE;

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

/// The device's queue limits, from GET_CONTEXT's response.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) max_sq_desc_sz: u16,
    pub(super) max_rq_desc_sz: u16,
    pub(super) max_send_wqebb: u32,
    pub(super) max_recv_wr: u32,
}

/// Bytes libmlx5 reserves in every send WQE before its data (verbs.c `sq_overhead` for the
/// operations a QP gets by default): on RC and UC the largest request it can post, a
/// memory-window bind or local invalidate (control, UMR control, mkey context and a KLM
/// segment: 16 + 48 + 64 + 64); on UD the control and datagram segments (16 + 48). Sizing
/// with the same overhead gives the same queues for the same capabilities.
const SQ_OVERHEAD: usize = 192;
const UD_SQ_OVERHEAD: usize = SEG + ah::AV_SIZE;

impl Geometry {
    /// The queues libmlx5 creates for `asked` (verbs.c `mlx5_calc_sq_size`,
    /// `mlx5_calc_send_wqe`, `mlx5_calc_rq_size`, `mlx5_calc_rcv_wqe`): a send WQE is the
    /// overhead plus the larger of the SGEs and the inline segment asked for, in whole basic
    /// blocks; the send queue that many bytes per request, rounded up to a power of two; a
    /// receive WQE the SGEs asked for (at least one) rounded up to a power of two, the
    /// receive queue that per request (a power of two of them), at least one basic block, or
    /// none when no receive is asked for. Unlike libmlx5, a QP asking for no send request
    /// still gets a send queue of one (libmlx5 creates none): the size libmlx5 gives a QP
    /// asking for one. What the user is told is what this provider's WQEs leave room for,
    /// at least what was asked.
    fn new(asked: QpCap, qp_type: QpType, ctx: &Limits) -> Result<Self> {
        let invalid = |what: String| Error::invalid("create_qp", what);
        let (overhead, header) = match qp_type {
            QpType::Ud => (UD_SQ_OVERHEAD, UD_SQ_HEADER),
            _ => (SQ_OVERHEAD, SQ_HEADER),
        };
        let max_desc = usize::from(ctx.max_sq_desc_sz);
        let too_big = || {
            invalid(format!(
                "{} send SGEs / {} inline bytes: send WQEs larger than the device's {max_desc} bytes",
                asked.max_send_sge, asked.max_inline_data
            ))
        };
        if asked.max_send_sge as usize > max_desc.saturating_sub(overhead) / SEG {
            return Err(too_big());
        }
        let gather = overhead + asked.max_send_sge as usize * SEG;
        let inline = match asked.max_inline_data {
            0 => 0,
            n => overhead + wqe::inline_units(n as usize) * SEG,
        };
        let sq_wqe_size = gather.max(inline).next_multiple_of(SEND_WQE_BB);
        if sq_wqe_size > max_desc {
            return Err(too_big());
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
        let too_many_recvs = || {
            invalid(format!(
                "{} receive requests: too many for the device",
                asked.max_recv_wr
            ))
        };
        if asked.max_recv_wr > ctx.max_recv_wr {
            return Err(too_many_recvs());
        }
        let (rq_slots, rq_shift) = match asked.max_recv_wr {
            0 => (0, 0),
            n => {
                let bytes = n
                    .checked_next_power_of_two()
                    .and_then(|n| n.checked_mul(rq_stride as u32))
                    .ok_or_else(too_many_recvs)?
                    .max(SEND_WQE_BB as u32);
                (bytes / rq_stride as u32, rq_stride.trailing_zeros())
            }
        };
        let room = sq_wqe_size - header;
        let cap = QpCap {
            max_send_wr: sq_blocks / blocks_per_wqe,
            max_recv_wr: rq_slots,
            max_send_sge: (room / SEG) as u32,
            max_recv_sge: if rq_slots == 0 { 0 } else { (rq_stride / SEG) as u32 },
            max_inline_data: room.saturating_sub(4) as u32,
        };
        Ok(Self {
            sq_blocks,
            sq_wqe_size: sq_wqe_size as u32,
            rq_slots,
            rq_shift,
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
    let mut geo = Geometry::new(asked, req.qp_type, &ctx.limits())?;
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
    let doorbell = ctx
        .bfreg(resp.bfreg_index)
        .ok_or_else(|| {
            Error::malformed(
                "CREATE_QP",
                format!("bfreg index {} outside the UARs", resp.bfreg_index),
            )
        })?
        .claim()
        .ok_or_else(|| {
            Error::malformed(
                "CREATE_QP",
                format!(
                    "bfreg {} is a dedicated (low-latency) one and another QP of the context has it",
                    resp.bfreg_index
                ),
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
            datagram: req.qp_type == QpType::Ud,
            sig_all: req.sq_sig_all,
            plain: req.qp_type != QpType::Ud && !req.sq_sig_all,
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

/// One bfreg of the context (a pair of BlueFlame buffers): the half the next doorbell goes
/// to, and, where QPs share it, the lock libmlx5 takes around the doorbell (`struct mlx5_bf`:
/// `offset`, `need_lock`, `lock`). The toggle lives here, not in a QP: QPs sharing the bfreg
/// alternate its halves between them.
pub(super) struct BfReg {
    /// The half the next doorbell goes to (0 or the toggle). Read and written under `lock`
    /// where there is one; on a dedicated bfreg by its one QP's poster only.
    offset: AtomicUsize,
    /// `Some` on a shared bfreg (libmlx5 `need_uuar_lock`): held across the store or copy,
    /// the flush and the toggle, so copies from two QPs never interleave and every doorbell
    /// takes the half after the last one.
    lock: Option<Mutex<()>>,
    /// Live QPs on it; a dedicated (lock-free) bfreg takes one.
    users: AtomicU32,
}

impl BfReg {
    pub(super) fn new(shared: bool) -> Self {
        Self {
            offset: AtomicUsize::new(0),
            lock: shared.then(|| Mutex::new(())),
            users: AtomicU32::new(0),
        }
    }

    /// Whether QPs share it (and so post under its lock).
    pub(super) fn shared(&self) -> bool {
        self.lock.is_some()
    }
}

/// Where a QP's send doorbell goes: a bfreg in one of the context's UAR pages, checked by
/// `Ctx::bfreg` to lie inside it (both halves, and with BlueFlame a whole copy from either).
pub(super) struct SendDoorbell {
    /// The UAR page's first byte; mapped as long as the context is.
    pub(super) page: NonNull<u8>,
    /// The bfreg's first half, from the page.
    pub(super) offset: usize,
    /// The two halves of the bfreg alternate (libmlx5 toggles them on every ring).
    pub(super) toggle: usize,
    /// Bytes of a BlueFlame buffer; 0: no BlueFlame.
    pub(super) bf_size: usize,
    /// The bfreg's state, shared with every QP of the context on it.
    pub(super) reg: Arc<BfReg>,
    /// Counted in `reg.users` (by [`Self::claim`], until [`Self::release`]).
    pub(super) claimed: bool,
    /// `reg.shared()`, read once: a dedicated bfreg's poster keeps the half itself.
    pub(super) shared: bool,
    /// The next half on a dedicated bfreg (0 or `toggle`); a shared one's is in `reg`.
    pub(super) half: usize,
}

impl Drop for SendDoorbell {
    fn drop(&mut self) {
        self.release();
    }
}

impl SendDoorbell {
    /// Takes the bfreg for one more QP: `None` if it is a dedicated one already in use (the
    /// kernel hands a low-latency bfreg to one QP at a time; two QPs posting on it without
    /// the lock could interleave their copies).
    pub(super) fn claim(mut self) -> Option<Self> {
        let before = self.reg.users.fetch_add(1, Ordering::AcqRel);
        self.claimed = true;
        match before > 0 && !self.reg.shared() {
            true => None, // dropping `self` gives the count back
            false => Some(self),
        }
    }

    /// Gives the bfreg back: once the kernel destroyed the QP (it may then hand the bfreg to
    /// a new QP at once, before this QP's queues are dropped), or at the latest on drop.
    pub(super) fn release(&mut self) {
        if std::mem::take(&mut self.claimed) {
            self.reg.users.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Runs `write` with the bfreg's current half (its byte offset in the page), then
    /// flushes the write-combining buffers (`mmio_flush_writes`) and toggles the half: under
    /// the bfreg's lock where QPs share it (libmlx5 `mmio_wc_spinlock` ... `spinunlock`), so
    /// the flush is inside it, as libmlx5 has it: otherwise another CPU's later doorbell
    /// could reach the device first.
    #[inline(always)]
    fn with_half(&mut self, write: impl FnOnce(usize)) {
        if !self.shared {
            // Dedicated: this QP's poster is the bfreg's only writer (`claim`).
            let half = self.half;
            write(self.offset + half);
            mmio_fence();
            self.half = half ^ self.toggle;
            return;
        }
        let reg = &*self.reg;
        let _guard = reg.lock.as_ref().map(|l| l.lock().unwrap_or_else(|e| e.into_inner()));
        let half = reg.offset.load(Ordering::Relaxed);
        write(self.offset + half);
        mmio_fence();
        reg.offset.store(half ^ self.toggle, Ordering::Relaxed);
    }

    /// Rings: `ctrl` (the first 8 bytes of the last WQE) to the current half, then the other
    /// half's turn.
    ///
    /// # Safety
    /// The context whose `bfreg` made this is alive (its UAR pages are mapped).
    #[inline(always)]
    unsafe fn ring(&mut self, ctrl: u64) {
        let page = self.page;
        self.with_half(|at| {
            // SAFETY: `bfreg` checked that 8 bytes at either half lie in the page, mapped
            // (our contract); a device register, written with one volatile 8-byte store.
            unsafe { page.as_ptr().add(at).cast::<u64>().write_volatile(ctrl) };
        });
    }

    /// A BlueFlame copy: `words` (at most `bf_size` bytes rounded up to whole basic blocks)
    /// to the current half with 8-byte stores in order, then the other half's turn.
    ///
    /// # Safety
    /// As for [`Self::ring`].
    unsafe fn copy(&mut self, words: impl ExactSizeIterator<Item = u64>) {
        debug_assert!(words.len() * 8 <= self.bf_size.next_multiple_of(SEND_WQE_BB));
        let page = self.page;
        self.with_half(|at| {
            for (i, word) in words.enumerate() {
                // SAFETY: `bfreg` checked the whole copy from either half lies in the page;
                // the caller keeps to its length; mapped per our contract.
                unsafe { page.as_ptr().add(at + 8 * i).cast::<u64>().write_volatile(word) };
            }
        });
    }
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
    /// UD: every send carries a datagram segment.
    datagram: bool,
    /// Every request asks for a CQE (`sq_sig_all`; libmlx5's `sq_signal_bits`).
    sig_all: bool,
    /// Neither of the two: the common path.
    plain: bool,
}

/// The send ring as one call of `post_send` writes it: its base and segment mask, read once.
#[derive(Clone, Copy)]
struct Ring {
    base: NonNull<u8>,
    /// The ring's size less one segment: masks a position to its segment's.
    seg_mask: usize,
}

impl Ring {
    /// Stores a segment at byte `pos` (unmasked), a whole number of segments into the ring:
    /// a ring of whole basic blocks never ends inside one.
    #[inline(always)]
    fn seg(self, pos: usize, words: Words) {
        debug_assert_eq!(pos % SEG, 0, "segments start on segment boundaries");
        let at = pos & self.seg_mask;
        // SAFETY: `at` is a multiple of SEG below the ring's size, itself a multiple of SEG
        // (`seg_mask`), so the segment lies inside the ring (page-aligned, so the words are
        // aligned), which no Rust reference covers.
        unsafe {
            let to = self.base.as_ptr().add(at).cast::<u64>();
            to.write(words[0]);
            to.add(1).write(words[1]);
        }
    }

    /// The 8-byte word at byte `at` (unmasked, a multiple of 8), in the ring's byte order.
    #[inline(always)]
    fn word(self, at: usize) -> u64 {
        let at = at & (self.seg_mask | 8);
        // SAFETY: `at` is 8-aligned and below the ring's size, a multiple of 8; the poster,
        // which alone writes the ring, is the caller.
        unsafe { self.base.as_ptr().add(at).cast::<u64>().read() }
    }

    /// `len` bytes of the ring from byte `start` (a multiple of 8), as 8-byte words in the
    /// ring's byte order, wrapping at the ring's end.
    fn words(self, start: usize, len: usize) -> impl ExactSizeIterator<Item = u64> {
        (0..len / 8).map(move |i| self.word(start + 8 * i))
    }

    /// Copies `len` bytes from `from` to byte `pos` (unmasked), splitting at the ring's end;
    /// returns the position after them.
    ///
    /// # Safety
    /// `from` must be readable for `len` bytes.
    unsafe fn copy(self, mut pos: usize, mut from: *const u8, mut len: usize) -> usize {
        let mask = self.seg_mask | (SEG - 1);
        while len > 0 {
            let at = pos & mask;
            let n = len.min(mask + 1 - at);
            // SAFETY: `at + n` stays inside the ring; the source per our contract; the ring
            // is user memory no Rust reference covers.
            unsafe {
                std::ptr::copy_nonoverlapping(from, self.base.as_ptr().add(at), n);
                from = from.add(n);
            }
            pos += n;
            len -= n;
        }
        pos
    }

    /// Writes `wr` (not inline) as the WQE at byte `start`, basic block `pi`; returns its size
    /// in 16-byte units (`ds`).
    ///
    /// # Safety
    /// `wr` passed [`SendQueue::check`] and the transport rules.
    #[inline(always)]
    unsafe fn write<const DATAGRAM: bool, const SIG_ALL: bool>(
        self,
        wr: &SendWr<'_>,
        qpn: u32,
        pi: u32,
        start: usize,
    ) -> usize {
        // SAFETY: forwarded contract; no inline data.
        unsafe { self.write_as::<false, DATAGRAM, SIG_ALL>(wr, qpn, pi, start) }
    }

    /// [`Self::write`] for an inline request, out of line.
    ///
    /// # Safety
    /// As for [`Self::write`]; the SGEs name readable memory.
    #[inline(never)]
    unsafe fn write_inline<const DATAGRAM: bool, const SIG_ALL: bool>(
        self,
        wr: &SendWr<'_>,
        qpn: u32,
        pi: u32,
        start: usize,
    ) -> usize {
        // SAFETY: forwarded contract.
        unsafe { self.write_as::<true, DATAGRAM, SIG_ALL>(wr, qpn, pi, start) }
    }

    /// Writes the WQE, its data inline when `INLINE`.
    ///
    /// # Safety
    /// As for [`Self::write_inline`].
    #[inline(always)]
    unsafe fn write_as<const INLINE: bool, const DATAGRAM: bool, const SIG_ALL: bool>(
        self,
        wr: &SendWr<'_>,
        qpn: u32,
        pi: u32,
        start: usize,
    ) -> usize {
        let mut pos = start + SEG;
        // One dispatch on the operation: its opcode and immediate data, the segments before
        // the data, and whether it is an atomic (whose data is its result's one SGE).
        let (op, imm, atomic) = match wr.op {
            SendOp::Send => (opcode::SEND, 0, false),
            SendOp::SendWithImm { imm } => (opcode::SEND_IMM, imm, false),
            SendOp::RdmaWrite(r) => {
                self.seg(pos, wqe::raddr_words(r.addr, r.rkey));
                pos += SEG;
                (opcode::RDMA_WRITE, 0, false)
            }
            SendOp::RdmaWriteWithImm(r, imm) => {
                self.seg(pos, wqe::raddr_words(r.addr, r.rkey));
                pos += SEG;
                (opcode::RDMA_WRITE_IMM, imm, false)
            }
            SendOp::RdmaRead(r) => {
                self.seg(pos, wqe::raddr_words(r.addr, r.rkey));
                pos += SEG;
                (opcode::RDMA_READ, 0, false)
            }
            SendOp::CompareSwap { remote, compare, swap } => {
                self.seg(pos, wqe::raddr_words(remote.addr, remote.rkey));
                self.seg(pos + SEG, wqe::atomic_words(swap, compare));
                pos += 2 * SEG;
                (opcode::ATOMIC_CS, 0, true)
            }
            SendOp::FetchAdd { remote, add } => {
                self.seg(pos, wqe::raddr_words(remote.addr, remote.rkey));
                self.seg(pos + SEG, wqe::atomic_words(add, 0));
                pos += 2 * SEG;
                (opcode::ATOMIC_FA, 0, true)
            }
            // Refused by `check`: nothing is written.
            SendOp::SendWithInv { .. }
            | SendOp::LocalInv { .. }
            | SendOp::BindMw(_)
            | SendOp::AtomicWrite { .. }
            | SendOp::Raw(_) => return 0,
        };
        // A UD send's destination (`SendList` holds only AHs of this QP's
        // context): the AH's address vector with the key and QPN, after the control segment.
        if DATAGRAM {
            if let Some(dest) = wr.ud {
                // SAFETY: the AH is this provider's (its context is the QP's) and lives while
                // the request borrows it.
                let segs =
                    unsafe { ah::vector(dest.ah.provider_data()) }.datagram_seg(dest.remote_qpn, dest.remote_qkey);
                // SAFETY: `segs` is a local array of `AV_SIZE` bytes.
                pos = unsafe { self.copy(pos, segs.as_ptr().cast(), ah::AV_SIZE) };
            }
        }
        // The control segment before the data, its size (`ds`) patched in after it: only
        // `start` stays live across the data.
        self.seg(
            start,
            wqe::ctrl_words(&Ctrl {
                pi: pi as u16,
                opcode: op,
                opmod: 0,
                qpn,
                fm_ce_se: FM_CE_SE[(wr.flags.bits() & CTRL_FLAG_BITS) as usize]
                    | if SIG_ALL { ctrl_flags::CQ_UPDATE } else { 0 },
                ds: 0,
                signature: 0,
                // The WQE carries immediate data in network order (`SendOp::imm_data`).
                imm: imm.to_be(),
            }),
        );
        if atomic {
            // An atomic's one SGE (the transport rules): the device writes exactly the 8-byte
            // old value.
            if let Some(sge) = wr.sg_list.first() {
                self.seg(pos, wqe::data_words(8, sge.lkey, sge.addr));
                pos += SEG;
            }
        } else if INLINE {
            // SAFETY: forwarded contract.
            pos = unsafe { self.inline(pos, wr) };
        } else {
            // Zero-length SGEs take no segment (libmlx5 skips them too). One buffer, the
            // common case, without the loop.
            let mut gather = |sge: &Sge| {
                if sge.length != 0 {
                    self.seg(pos, wqe::data_words(sge.length, sge.lkey, sge.addr));
                    pos += SEG;
                }
            };
            match wr.sg_list {
                [sge] => gather(sge),
                sges => sges.iter().for_each(gather),
            }
        }
        let ds = (pos - start) / SEG;
        // SAFETY: `start` is a WQE's position in the ring (below its size), whose control
        // segment is 16 bytes.
        unsafe { self.base.as_ptr().add(start + wqe::CTRL_DS_BYTE).write(ds as u8) };
        ds
    }

    /// Writes `wr`'s gather list as inline data at `pos`; returns the position after the
    /// segment. No bytes, no inline segment at all (libmlx5 `set_data_inl_seg`: size 0).
    ///
    /// # Safety
    /// The SGEs name readable memory; their total fits the WQE (`check`).
    unsafe fn inline(self, pos: usize, wr: &SendWr<'_>) -> usize {
        let len = wr.total_len() as u32;
        if len == 0 {
            return pos;
        }
        let header = wqe::inline_header(len);
        // SAFETY: the header is a local array.
        let mut at = unsafe { self.copy(pos, header.as_ptr(), header.len()) };
        for sge in wr.sg_list {
            // SAFETY: inline SGEs name readable memory (our contract); the length was checked
            // against the WQE's room.
            at = unsafe { self.copy(at, sge.addr as *const u8, sge.length as usize) };
        }
        at.next_multiple_of(SEG)
    }
}

/// The `SendFlags` bits that map to the control segment's `fm_ce_se`.
const CTRL_FLAG_BITS: u32 = SendFlags::FENCE.bits() | SendFlags::SIGNALED.bits() | SendFlags::SOLICITED.bits();
const _: () = assert!(CTRL_FLAG_BITS == 7, "FM_CE_SE is indexed by the three low flag bits");

/// `fm_ce_se` by a request's fence, signaled and solicited flags ([`CTRL_FLAG_BITS`]).
const FM_CE_SE: [u8; 8] = {
    let mut table = [0; 8];
    let mut flags = 0;
    while flags < 8 {
        let f = flags as u32;
        if f & SendFlags::SIGNALED.bits() != 0 {
            table[flags] |= ctrl_flags::CQ_UPDATE;
        }
        if f & SendFlags::SOLICITED.bits() != 0 {
            table[flags] |= ctrl_flags::SOLICITED;
        }
        if f & SendFlags::FENCE.bits() != 0 {
            table[flags] |= ctrl_flags::FENCE;
        }
        flags += 1;
    }
    table
};

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
    /// Checks `wr` against the queue's limits (the room is the caller's).
    #[inline(always)]
    fn check(&self, wr: &SendWr<'_>) -> Result<(), WrReject> {
        // Memory window operations and invalidation need UMR WQEs, which this provider does
        // not write; libmlx5 offers no atomic write. Operations the core does not model are
        // refused too (libmlx5 writes TSO and its own DRIVER1 operations, which this provider
        // does not; opcodes past its table it refuses with EINVAL).
        if matches!(
            wr.op,
            SendOp::SendWithInv { .. }
                | SendOp::LocalInv { .. }
                | SendOp::BindMw(_)
                | SendOp::AtomicWrite { .. }
                | SendOp::Raw(_)
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
        Ok(())
    }

    /// The ring, for one call's writes.
    fn ring(&self) -> Ring {
        Ring {
            base: self.base,
            seg_mask: self.mask & !(SEG - 1),
        }
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
        // A lone request has its own copy of the loop, which the compiler straightens.
        // SAFETY: forwarded contract.
        unsafe {
            match (self.sq.plain, wrs.len()) {
                (true, 1) => self.post_sends::<true, false, false>(wrs),
                (true, _) => self.post_list(wrs),
                (false, _) => self.post_other(wrs),
            }
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

    fn send_room(&mut self) -> u32 {
        self.shared.sends_free(self.sq.head, self.sq.max_post)
    }

    fn destroyed(&mut self) {
        self.scrub(true);
        // The kernel freed the bfreg with the QP; no post follows a destroy.
        self.doorbell.release();
    }
}

/// Chains through the vendor post: mlx5 has no writer of its own for libibverbs' layout.
impl GatheredChains for Mlx5Qp {}

/// The [`Queues`] of an mlx5 QP.
///
/// # Safety
/// `queues` must be an [`Mlx5Qp`]: queues an mlx5 context made ([`create`]).
pub(crate) unsafe fn queues(queues: Box<dyn QpQueues>) -> Queues {
    // SAFETY: an `Mlx5Qp` (the contract), boxed by `create`: the same allocation and layout.
    Queues::new(unsafe { Box::from_raw(Box::into_raw(queues).cast::<Mlx5Qp>()) })
}

impl Mlx5Qp {
    /// [`QpQueues::post_send`]; with `LONE`, `wrs` holds one request.
    ///
    /// # Safety
    /// As for [`QpQueues::post_send`].
    #[inline(always)]
    unsafe fn post_sends<const LONE: bool, const DATAGRAM: bool, const SIG_ALL: bool>(
        &mut self,
        wrs: SendList<'_, '_>,
    ) -> Result<()> {
        // What every request needs, read once: locals stay in registers across the ring
        // writes, which the compiler cannot tell apart from the queue's fields.
        let sq = &self.sq;
        let (ring, qpn, head) = (sq.ring(), sq.qpn, sq.head);
        let tables = self.shared.send_tables();
        let mut cur_post = sq.cur_post;
        let mut posted = 0u32;
        // Requests known to fit; the poller's tail is loaded again only when they run out.
        let mut free = 0u32;
        let mut last = None;
        let mut rejected = None;
        for wr in wrs.iter(self.qp_type) {
            let checked = wr.and_then(|wr| {
                sq.check(wr)?;
                if posted == free {
                    free = self.shared.sends_free(head, sq.max_post);
                    if posted == free {
                        return Err(WrReject::QueueFull);
                    }
                }
                Ok(wr)
            });
            let wr = match checked {
                Ok(wr) => wr,
                Err(reason) => {
                    rejected = Some(reason);
                    break;
                }
            };
            let start = (cur_post as usize * SEND_WQE_BB) & ring.seg_mask;
            // SAFETY: checked above; inline memory is the caller's contract.
            let ds = unsafe {
                match wr.flags.contains(SendFlags::INLINE) {
                    false => ring.write::<DATAGRAM, SIG_ALL>(wr, qpn, cur_post, start),
                    true => ring.write_inline::<DATAGRAM, SIG_ALL>(wr, qpn, cur_post, start),
                }
            };
            let blocks = (ds * SEG).div_ceil(SEND_WQE_BB) as u32;
            tables.record(cur_post, blocks, head.wrapping_add(posted), wr.wr_id);
            cur_post = cur_post.wrapping_add(blocks);
            posted += 1;
            last = Some((wr, start));
            if LONE {
                break;
            }
        }
        if let Some((wr, start)) = last {
            self.sq.cur_post = cur_post;
            self.sq.head = head.wrapping_add(posted);
            self.shared.publish_sends(self.sq.head);
            self.db.set(SND_DBR, cur_post & 0xffff);
            // The record and the WQEs must be in memory before the device hears the doorbell.
            mmio_fence();
            // BlueFlame (the WQE itself through the UAR, sparing the device its fetch) on
            // libmlx5's terms: a lone request (inline, or any with `prefer_bf`) of more than
            // the control segment that fits the buffer (qp.c post_send_db).
            // The doorbell carries the first 8 bytes of the last WQE.
            let ctrl = ring.word(start);
            if posted == 1 && self.doorbell.bf_size > 0 {
                let inline = wr.flags.contains(SendFlags::INLINE) && !wr.sg_list.is_empty();
                self.ring_or_copy(ring, start, ctrl, inline || self.ctx.prefer_bf);
            } else {
                // SAFETY: `self.ctx`, whose `bfreg` made the doorbell, is alive.
                unsafe { self.doorbell.ring(ctrl) };
            }
        }
        match rejected {
            None => Ok(()),
            Some(reason) => Err(Error::WorkRequest {
                verb: "post_send",
                index: posted as usize,
                reason,
            }),
        }
    }

    /// [`QpQueues::post_send`] of a list, out of line.
    ///
    /// # Safety
    /// As for [`QpQueues::post_send`].
    #[inline(never)]
    unsafe fn post_list(&mut self, wrs: SendList<'_, '_>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.post_sends::<false, false, false>(wrs) }
    }

    /// [`QpQueues::post_send`] on a UD or an `sq_sig_all` QP, out of line: the connected
    /// QPs' path carries neither the datagram segment nor the forced CQE.
    ///
    /// # Safety
    /// As for [`QpQueues::post_send`].
    #[inline(never)]
    unsafe fn post_other(&mut self, wrs: SendList<'_, '_>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe {
            match (self.sq.datagram, self.sq.sig_all) {
                (false, false) => self.post_sends::<false, false, false>(wrs),
                (false, true) => self.post_sends::<false, false, true>(wrs),
                (true, false) => self.post_sends::<false, true, false>(wrs),
                (true, true) => self.post_sends::<false, true, true>(wrs),
            }
        }
    }

    /// A lone request's doorbell: a BlueFlame copy of its WQE (at byte `start`, beginning
    /// with `ctrl`) when `wanted` and the WQE is more than its control segment and fits the
    /// buffer, else the 8-byte doorbell.
    #[inline(never)]
    fn ring_or_copy(&mut self, ring: Ring, start: usize, ctrl: u64, wanted: bool) {
        let ds = (u64::from_be(ctrl) & 0xff) as usize;
        let bytes = ds * SEG;
        if wanted && ds > 1 && bytes <= self.doorbell.bf_size {
            let words = ring.words(start, bytes.next_multiple_of(SEND_WQE_BB));
            // SAFETY: `self.ctx`, whose `bfreg` made the doorbell, is alive; the copy is
            // `bf_size` bytes at most, rounded up to whole basic blocks.
            unsafe { self.doorbell.copy(words) };
        } else {
            // SAFETY: as above.
            unsafe { self.doorbell.ring(ctrl) };
        }
    }

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
    use crate::wr::Remote;

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
            datagram: false,
            sig_all: false,
            plain: true,
        }
    }

    /// Writes `wr` as the WQE at the queue's `cur_post`; returns its byte position and `ds`.
    ///
    /// # Safety
    /// As for [`Ring::write`].
    unsafe fn write(sq: &SendQueue, wr: &SendWr<'_>) -> (usize, usize) {
        let start = (sq.cur_post as usize * SEND_WQE_BB) & sq.mask;
        // SAFETY: forwarded.
        let ring = sq.ring();
        // SAFETY: forwarded.
        let ds = unsafe {
            match wr.flags.contains(SendFlags::INLINE) {
                false => ring.write::<false, false>(wr, sq.qpn, sq.cur_post, start),
                true => ring.write_inline::<false, false>(wr, sq.qpn, sq.cur_post, start),
            }
        };
        (start, ds)
    }

    /// The ring's bytes.
    fn ring(buf: &Buffer, blocks: usize) -> Vec<u8> {
        // SAFETY: the buffer holds at least `blocks` basic blocks, written by the test only.
        unsafe { std::slice::from_raw_parts(buf.base().as_ptr(), blocks * SEND_WQE_BB) }.to_vec()
    }

    /// The device limits the model's GET_CONTEXT reports (and ConnectX-5's).
    const LIMITS: Limits = Limits {
        max_sq_desc_sz: 512,
        max_rq_desc_sz: 512,
        max_send_wqebb: 1 << 15,
        max_recv_wr: 1 << 15,
    };

    fn cap(send: u32, recv: u32, send_sge: u32, recv_sge: u32, inline: u32) -> QpCap {
        QpCap {
            max_send_wr: send,
            max_recv_wr: recv,
            max_send_sge: send_sge,
            max_recv_sge: recv_sge,
            max_inline_data: inline,
        }
    }

    /// (send basic blocks, receive WQEs, log2 of a receive WQE's bytes), as CREATE_QP asks.
    fn sizes(qp_type: QpType, asked: QpCap) -> Result<(u32, u32, u32)> {
        Geometry::new(asked, qp_type, &LIMITS).map(|g| (g.sq_blocks, g.rq_slots, g.rq_shift))
    }

    /// The sizes libmlx5 44 asks the kernel for with the same capabilities (verbs.c
    /// mlx5_calc_sq_size and mlx5_calc_rq_size, worked by hand; the first and the UD one are
    /// the differential's QPs, whose CREATE_QP requests the model compares byte for byte).
    #[test]
    fn queues_are_sized_as_libmlx5_sizes_them() {
        // 192 + max(4 SGEs, 4 + 120 inline) = 320 bytes, 5 blocks a request; 64 requests.
        assert_eq!(sizes(QpType::Rc, cap(64, 32, 4, 4, 120)).unwrap(), (512, 32, 6));
        assert_eq!(sizes(QpType::Ud, cap(64, 32, 4, 4, 120)).unwrap(), (256, 32, 6));
        // One request of 192 + 16 bytes: 4 blocks, not 1; receives at least one block.
        assert_eq!(sizes(QpType::Rc, cap(1, 1, 1, 1, 0)).unwrap(), (4, 4, 4));
        assert_eq!(sizes(QpType::Uc, cap(1, 3, 1, 1, 0)).unwrap(), (4, 4, 4));
        assert_eq!(sizes(QpType::Rc, cap(1, 5, 1, 1, 0)).unwrap(), (4, 8, 4));
        assert_eq!(sizes(QpType::Ud, cap(8, 8, 1, 1, 0)).unwrap(), (16, 8, 4));
        assert_eq!(sizes(QpType::Rc, cap(100, 500, 1, 3, 64)).unwrap(), (512, 512, 6));
        // No receive asked for: no receive queue (libmlx5's rq_wqe_count 0).
        assert_eq!(sizes(QpType::Rc, cap(4, 0, 1, 1, 0)).unwrap(), (16, 0, 0));
        // At most (512 - 192) / 16 SGEs and 512 - 192 - 4 inline bytes on RC.
        assert_eq!(sizes(QpType::Rc, cap(1, 1, 20, 1, 316)).unwrap(), (8, 4, 4));
        assert!(sizes(QpType::Rc, cap(1, 1, 21, 1, 0)).is_err());
        assert!(sizes(QpType::Rc, cap(1, 1, 1, 1, 317)).is_err());
        assert!(sizes(QpType::Rc, cap(1, 1 << 16, 1, 1, 0)).is_err());
    }

    /// What the user is told covers what was asked and fits the WQE this provider writes.
    #[test]
    fn the_capabilities_reported_cover_the_ones_asked() {
        for qp_type in [QpType::Rc, QpType::Ud] {
            for asked in [
                cap(1, 1, 1, 1, 0),
                cap(7, 9, 3, 2, 60),
                cap(64, 32, 4, 4, 120),
                cap(2, 0, 0, 1, 0),
            ] {
                let g = Geometry::new(asked, qp_type, &LIMITS).unwrap();
                let got = g.cap;
                assert!(got.max_send_wr >= asked.max_send_wr, "{qp_type:?} {asked:?} -> {got:?}");
                assert!(got.max_recv_wr >= asked.max_recv_wr, "{qp_type:?} {asked:?} -> {got:?}");
                assert!(
                    got.max_send_sge >= asked.max_send_sge,
                    "{qp_type:?} {asked:?} -> {got:?}"
                );
                assert!(
                    got.max_inline_data >= asked.max_inline_data,
                    "{qp_type:?} {asked:?} -> {got:?}"
                );
                if asked.max_recv_wr > 0 {
                    assert!(
                        got.max_recv_sge >= asked.max_recv_sge,
                        "{qp_type:?} {asked:?} -> {got:?}"
                    );
                }
                // The largest WQE posted fits a request's share of the ring.
                let header = if qp_type == QpType::Ud { UD_SQ_HEADER } else { SQ_HEADER };
                let largest = header + got.max_send_sge as usize * SEG;
                assert!(largest <= g.sq_wqe_size as usize);
                // (Inline requests of no bytes have no inline segment.)
                let inline = match got.max_inline_data {
                    0 => 0,
                    n => wqe::inline_units(n as usize) * SEG,
                };
                assert!(header + inline <= g.sq_wqe_size as usize);
                assert!(got.max_send_wr * (g.sq_wqe_size / SEND_WQE_BB as u32) <= g.sq_blocks);
            }
        }
    }

    /// The reference's capture: a signaled 100-byte SEND plus a zero-length SGE, which is
    /// skipped (ds 2, one block).
    #[test]
    fn send_wqe_matches_the_libmlx5_capture() {
        let buf = Buffer::new(4096, "test").unwrap();
        let sq = send_queue(&buf, 4);
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
        assert_eq!(unsafe { write(&sq, &wr) }, (0, 2));
        let bytes = ring(&buf, 4);
        assert_eq!(&bytes[..16], &[0, 0, 0, 0x0a, 0, 1, 0xc0, 2, 0, 0, 0, 8, 0, 0, 0, 0]);
        assert_eq!(&bytes[16..32], &wqe::data_seg(100, 0xabcd, 0x1122_3344_5566_7788));
        // What the doorbell carries.
        assert_eq!(sq.ring().word(0).to_ne_bytes(), bytes[..8]);
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
        assert_eq!(unsafe { write(&sq, &wr) }, (3 * SEND_WQE_BB, 8));
        let bytes = ring(&buf, blocks);
        let mut wqe = bytes[3 * SEND_WQE_BB..].to_vec();
        wqe.extend_from_slice(&bytes[..SEND_WQE_BB]);
        assert_eq!(&wqe[..8], &[0, 0, 3, 0x08, 0, 1, 0xc0, 8]);
        assert_eq!(&wqe[16..32], &wqe::raddr_seg(0x1000, 7));
        assert_eq!(&wqe[32..36], &wqe::inline_header(90));
        assert_eq!(&wqe[36..126], &data[..]);
        // What a BlueFlame copy of it carries: its two blocks, in order across the end.
        let copied: Vec<u8> = sq
            .ring()
            .words(3 * SEND_WQE_BB, 2 * SEND_WQE_BB)
            .flat_map(u64::to_ne_bytes)
            .collect();
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
            let (start, ds) = unsafe { write(&sq, &wr) };
            assert_eq!(ds, 1);
            assert_eq!(ring(&buf, 4)[start + wqe::CTRL_DS_BYTE], 1, "ds");
            sq.cur_post += 1;
        }
    }
}
