//! rxe queue pairs: send WQEs written into the SQ ring and rung with an empty POST_SEND
//! command; receive WQEs written into the RQ ring with no system call.

use super::abi::{AtomicArm, CreateQpResp, DmaInfo, MwArm, RdmaArm, RecvWqe, SendWqe, UdArm, WrArm};
use super::queue::Producer;
use super::RxeContext;
use crate::attr::{QpState, QpType};
use crate::chain::{ChainWr, FastWr, SendChain, SlowWr};
use crate::device::DeviceFile;
use crate::error::{Error, Result, WrReject};
use crate::front_end::{ChainQueues, Queues};
use crate::provider::{CreateQpCall, KernelCall, ProviderQp, QpQueues, QpRequest};
use crate::sys::cmd::SendDoorbell;
use crate::wr::{ContextId, RawOp, RecvWr, Remote, SendFlags, SendList, SendOp, SendWr, Sge};
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::Arc;
use zerocopy::IntoBytes;

pub(super) fn create(ctx: &RxeContext, req: &QpRequest<'_>, kernel: CreateQpCall<'_>) -> Result<ProviderQp> {
    let mut resp = CreateQpResp::default();
    let created = kernel(req.cap, &[], resp.as_mut_bytes())?;
    let cap = created.cap;
    let sq = ctx.map(
        &resp.sq_mi,
        "CREATE_QP",
        size_of::<SendWqe>() + cap.max_send_sge as usize * size_of::<Sge>(),
    )?;
    let rq = if req.srq.is_some() {
        None
    } else {
        let min = size_of::<RecvWqe>() + cap.max_recv_sge as usize * size_of::<Sge>();
        Some(Producer::new(ctx.map(&resp.rq_mi, "CREATE_QP", min)?))
    };
    // An atomic write carries its 8-byte value after the header, whatever the SGE count.
    if sq.elem_size() < size_of::<SendWqe>() + 8 {
        return Err(Error::malformed(
            "CREATE_QP",
            format!("send queue slots of {} bytes", sq.elem_size()),
        ));
    }
    // The kernel may grant more inline room than asked; what fits in a slot is the limit.
    let max_inline = cap.max_inline_data.min((sq.elem_size() - size_of::<SendWqe>()) as u32);
    let queues = Box::new(RxeQp {
        sq: Producer::new(sq),
        rq,
        qp_type: req.qp_type,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: cap.max_recv_sge,
        max_inline,
        doorbell: SendDoorbell::new(created.handle),
        file: ctx.file.clone(),
    });
    Ok(ProviderQp { queues, cap })
}

struct RxeQp {
    sq: Producer,
    rq: Option<Producer>,
    qp_type: QpType,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline: u32,
    doorbell: SendDoorbell,
    /// The device file the doorbell is rung on.
    file: Arc<DeviceFile>,
}

impl RxeQp {
    /// Checks a request's scatter/gather list against the QP; for an inline request returns
    /// its total length.
    #[inline(always)]
    fn check_limits(&self, sg_list: &[Sge], flags: SendFlags) -> Result<u32, WrReject> {
        let sges = sg_list.len();
        if sges > self.max_send_sge as usize {
            return Err(WrReject::TooManySge {
                given: sges,
                max: self.max_send_sge,
            });
        }
        if !flags.contains(SendFlags::INLINE) {
            return Ok(0);
        }
        let len: u64 = sg_list.iter().map(|s| u64::from(s.length)).sum();
        if len > u64::from(self.max_inline) {
            return Err(WrReject::InlineTooLong {
                given: len as usize,
                max: self.max_inline,
            });
        }
        Ok(len as u32)
    }

    /// Publishes the `posted` requests just written and rings the doorbell if there are any;
    /// then reports the request refused, if one was, whatever the doorbell said (a chain below
    /// RTS: the kernel refuses the doorbell, and the caller must still learn which requests
    /// are not in the ring, as librxe's `bad_wr` tells).
    #[inline(always)]
    fn finish(&mut self, posted: usize, rejected: Option<(usize, WrReject)>) -> Result<()> {
        if posted > 0 {
            self.sq.publish();
        }
        self.doorbell.finish_post(self.file.as_fd(), posted > 0, rejected)
    }
}

impl RxeQp {
    /// Writes a request read in place into the next slot (not yet published); `ATOMICS` as
    /// for [`RxeQp::post_chain`].
    ///
    /// # Safety
    /// As for [`QpQueues::post_send`].
    #[inline(always)]
    unsafe fn post_fast<const ATOMICS: bool>(&mut self, wr: &FastWr<'_>) -> Result<(), WrReject> {
        let inline_len = self.check_limits(wr.sg_list(), wr.flags())?;
        // Out of line; before the slot is taken, so a refused atomic takes none. (`remote_addr`
        // is at the same place in the `rdma` and `atomic` arms.)
        if ATOMICS && wr.is_atomic() {
            check_atomic(wr.sg_list(), wr.rdma().remote_addr)?;
        }
        let index = self.sq.next_index().ok_or(WrReject::QueueFull)?;
        let slot = self.sq.slot(index);
        // Before the slot's writes (the index stays private until published): the next index
        // is still in a register.
        self.sq.advance();
        // SAFETY: a free slot; `check_limits` bounded SGEs and inline data by what the kernel
        // granted, which sized the slot; inline memory is the caller's contract.
        unsafe { write_fast_wqe(slot, wr, inline_len) };
        Ok(())
    }

    /// [`RxeQp::post_fast`] for a request the core reads as a `SendWr`: out of line, so that
    /// the loop keeps no `SendWr`.
    ///
    /// # Safety
    /// As for [`QpQueues::post_send`].
    #[inline(never)]
    unsafe fn post_slow<const ATOMICS: bool>(
        &mut self,
        wr: SlowWr<'_>,
        qp_type: QpType,
        context: ContextId,
    ) -> Result<(), WrReject> {
        let wr = wr.read(qp_type, context)?;
        let inline_len = self.check_limits(wr.sg_list, wr.flags)?;
        match wr.op {
            SendOp::CompareSwap { remote, .. } | SendOp::FetchAdd { remote, .. } if ATOMICS => {
                check_atomic(wr.sg_list, remote.addr)?
            }
            SendOp::Raw(raw) => check_raw(raw)?,
            // As rdma-core's rxe: a bind carries no data and is for connected QPs.
            SendOp::BindMw(_) if !wr.sg_list.is_empty() || !matches!(qp_type, QpType::Rc | QpType::Uc) => {
                return Err(WrReject::OpcodeNotSupported)
            }
            _ => {}
        }
        let slot = self.sq.next_slot().ok_or(WrReject::QueueFull)?;
        // SAFETY: as in `post_fast`.
        unsafe { write_send_wqe(slot, &wr, inline_len) };
        self.sq.advance();
        Ok(())
    }

    /// The chain's requests from the caller's structs to the slots: those read in place
    /// through [`RxeQp::post_fast`], the rest through [`RxeQp::post_slow`]; one doorbell.
    /// `ATOMICS`: whether atomics are checked as librxe's `ibv_post_send` checks them
    /// ([`check_atomic`]); its `ibv_wr_*` builders leave them to the kernel.
    ///
    /// # Safety
    /// As for [`ChainQueues::post_send_chain`].
    #[inline(never)]
    unsafe fn post_chain<const ATOMICS: bool>(
        &mut self,
        mut chain: SendChain<'_>,
        qp_type: QpType,
        context: ContextId,
    ) -> Result<()> {
        let mut rejected = None;
        let mut posted = 0;
        while let Some(wr) = chain.next(qp_type) {
            // SAFETY: forwarded contract.
            let step = unsafe {
                match wr {
                    ChainWr::Fast(f) => self.post_fast::<ATOMICS>(&f),
                    ChainWr::Slow(s) => self.post_slow::<ATOMICS>(s, qp_type, context),
                    ChainWr::Malformed => Err(WrReject::Malformed),
                }
            };
            if let Err(reason) = step {
                rejected = Some((posted, reason));
                break;
            }
            posted += 1;
        }
        self.finish(posted, rejected)
    }
}

/// The first `enum ib_wr_opcode` number the rxe requester cannot be given safely: it indexes
/// `rxe_wr_opcode_info[opcode]` without a bound (Linux 6.1, `rxe_loc.h` `wr_opcode_mask`), the
/// table ends at `IB_WR_REG_MR` (0x20), and a REG_MR from user space makes the kernel follow
/// the MR pointer in the request (a NULL dereference in `rxe_reg_fast_mr`). rdma-core's rxe
/// posts any opcode; this provider refuses these on every path, the unsafe ones and the
/// drop-in's included (docs/kernel-facts.md).
const FIRST_UNSAFE_OPCODE: u32 = 0x20;

/// Refuses a [`SendOp::Raw`] whose opcode would crash the kernel ([`FIRST_UNSAFE_OPCODE`]).
#[cold]
fn check_raw(raw: RawOp) -> Result<(), WrReject> {
    if raw.opcode >= FIRST_UNSAFE_OPCODE {
        return Err(WrReject::OpcodeNotSupported);
    }
    Ok(())
}

/// What rdma-core's rxe checks of an atomic in a chain (`validate_send_wr`): 8 bytes or
/// more over its SGEs (summed as `unsigned int`) and an 8-byte aligned target. The other
/// rules of a chain (transports, inline data) are left to the kernel, as there
/// (`crate::chain`).
#[inline(never)]
fn check_atomic(sg_list: &[Sge], remote_addr: u64) -> Result<(), WrReject> {
    let length = sg_list.iter().fold(0u32, |sum, s| sum.wrapping_add(s.length));
    if length < 8 || remote_addr % 8 != 0 {
        return Err(WrReject::BadAtomic);
    }
    Ok(())
}

/// Copies a request's payload after the header of the send slot at `slot`: the SGEs, or for
/// an inline request (`inline_len` bytes, from `check_limits`) the bytes they name, in one pass
/// that also sums the length. Returns the length and the SGE count for the header.
///
/// # Safety
/// As for [`write_send_wqe`].
#[inline(always)]
unsafe fn copy_payload(slot: NonNull<u8>, sg_list: &[Sge], flags: SendFlags, inline_len: u32) -> (u32, u32) {
    // SAFETY: per the contract the slot is free and large enough for what follows the header;
    // slots are 64-byte aligned, so the SGE array after the 208-byte header is 16-aligned.
    unsafe {
        let tail = slot.add(size_of::<SendWqe>());
        if flags.contains(SendFlags::INLINE) {
            let mut to = tail.as_ptr();
            for sge in sg_list {
                let len = sge.length as usize;
                std::ptr::copy_nonoverlapping(sge.addr as *const u8, to, len);
                to = to.add(len);
            }
            (inline_len, 0)
        } else if let [sge] = sg_list {
            // The common case, without the loop's setup: one 16-byte move where SSE2 is (every
            // x86-64), 2 instructions a request fewer than the two 8-byte moves `write` makes.
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
                _mm_storeu_si128(
                    tail.cast::<__m128i>().as_ptr(),
                    _mm_loadu_si128(std::ptr::from_ref(sge).cast()),
                );
            }
            #[cfg(not(target_arch = "x86_64"))]
            tail.cast::<Sge>().write(*sge);
            (sge.length, 1)
        } else {
            let to = tail.cast::<Sge>().as_ptr();
            let mut length = 0u32;
            for (i, sge) in sg_list.iter().enumerate() {
                to.add(i).write(*sge);
                length = length.wrapping_add(sge.length);
            }
            (length, sg_list.len() as u32)
        }
    }
}

/// The 208-byte header of a send slot, for a request of `length` bytes in `num_sge` SGEs
/// (0 when inline).
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the header's fields, each from its own place
fn send_header(
    wr_id: u64,
    opcode: u32,
    flags: SendFlags,
    ex: u32,
    arm: WrArm,
    iova: u64,
    length: u32,
    num_sge: u32,
) -> SendWqe {
    SendWqe {
        wr_id,
        reserved: 0,
        opcode,
        send_flags: flags.bits(),
        ex,
        wr: arm,
        status: 0,
        state: 0,
        iova,
        mask: 0,
        first_psn: 0,
        last_psn: 0,
        ack_length: 0,
        ssn: 0,
        has_rd_atomic: 0,
        dma: DmaInfo {
            length,
            resid: length,
            cur_sge: 0,
            num_sge,
            sge_offset: 0,
            reserved: 0,
        },
    }
}

/// The arm of a header, zeroed.
const ZEROED_ARM: WrArm = WrArm { raw: [0; 15] };

/// Writes a request read in place from libibverbs' layout into the send slot at `slot`, as
/// [`write_send_wqe`] writes the same request as a `SendWr` (byte for byte: a unit test
/// compares them). The C opcode is rxe's; the arm and `iova` come from the C arm the opcode
/// names, and `ex` from `imm_data` when the opcode has one.
///
/// # Safety
/// As for [`write_send_wqe`].
#[inline(always)]
unsafe fn write_fast_wqe(slot: NonNull<u8>, wr: &FastWr<'_>, inline_len: u32) {
    let flags = wr.flags();
    let wqe = slot.cast::<SendWqe>().as_ptr();
    // The header first, then the payload and the lengths it gives: fewer values live at once.
    // Stored from each arm's branch, the arm's unused bytes known to be zero there.
    let header = |arm: WrArm, iova: u64| {
        let header = send_header(wr.wr_id(), wr.opcode(), flags, wr.imm_or_rkey(), arm, iova, 0, 0);
        // SAFETY: per the contract.
        unsafe { wqe.write(header) };
    };
    let mut arm = ZEROED_ARM;
    if wr.is_rdma() {
        let r = wr.rdma();
        arm.rdma = RdmaArm {
            remote_addr: r.remote_addr,
            rkey: r.rkey,
            reserved: 0,
        };
        header(arm, r.remote_addr);
    } else if wr.is_atomic() {
        let a = wr.atomic();
        arm.atomic = AtomicArm {
            remote_addr: a.remote_addr,
            compare_add: a.compare_add,
            swap: a.swap,
            rkey: a.rkey,
            reserved: 0,
        };
        header(arm, a.remote_addr);
    } else {
        header(arm, 0);
    }
    // SAFETY: per the contract.
    unsafe {
        let (length, num_sge) = copy_payload(slot, wr.sg_list(), flags, inline_len);
        std::ptr::addr_of_mut!((*wqe).dma.length).write(length);
        std::ptr::addr_of_mut!((*wqe).dma.resid).write(length);
        std::ptr::addr_of_mut!((*wqe).dma.num_sge).write(num_sge);
    }
}

/// Writes `wr` into the send slot at `slot`. `inline_len` is the total length of an inline
/// request (from `check_limits`).
///
/// The SGEs (or inline bytes) are copied in one pass that also sums the length; then each
/// operation stores its whole 208-byte header straight into the slot, its opcode, immediate
/// data and arm known at compile time in its branch, so nothing is staged on the stack.
///
/// # Safety
/// `slot` must be a free SQ slot large enough for the header plus the SGEs or inline data
/// (checked by `check_limits` against the slot size), and for inline requests every SGE must
/// name readable memory.
#[inline(always)]
unsafe fn write_send_wqe(slot: NonNull<u8>, wr: &SendWr<'_>, inline_len: u32) {
    // SAFETY: per the contract.
    let (length, num_sge) = unsafe { copy_payload(slot, wr.sg_list, wr.flags, inline_len) };
    // Inlined into every branch below, where `wr.op` is known.
    // `ex` is the immediate data (network order) or the rkey to invalidate (host order, as rxe
    // reads it).
    let write = |arm: WrArm, iova: u64, ex: u32| {
        let header = send_header(wr.wr_id, wr.op.wr_opcode(), wr.flags, ex, arm, iova, length, num_sge);
        // SAFETY: as above.
        unsafe { slot.cast::<SendWqe>().write(header) };
    };
    // The arms, the bytes past the operation's fields zeroed.
    let zeroed = ZEROED_ARM;
    let rdma = |r: Remote| {
        let mut arm = zeroed;
        arm.rdma = RdmaArm {
            remote_addr: r.addr,
            rkey: r.rkey,
            reserved: 0,
        };
        arm
    };
    let atomic = |remote: Remote, compare_add, swap| {
        let mut arm = zeroed;
        arm.atomic = AtomicArm {
            remote_addr: remote.addr,
            compare_add,
            swap,
            rkey: remote.rkey,
            reserved: 0,
        };
        arm
    };
    let send = || {
        let mut arm = zeroed;
        if let Some(ud) = wr.ud {
            arm.ud = UdArm {
                remote_qpn: ud.remote_qpn,
                remote_qkey: ud.remote_qkey,
                pkey_index: 0,
                reserved: 0,
                ah_num: ud.ah.provider_data() as u32,
            };
        }
        arm
    };
    // One arm per operation, never `A | B`: in each, `write`'s opcode and immediate data fold
    // to constants (merging arms brings back the second jump table).
    match wr.op {
        SendOp::RdmaWrite(r) => write(rdma(r), r.addr, 0),
        SendOp::RdmaWriteWithImm(r, imm) => write(rdma(r), r.addr, imm.to_be()),
        SendOp::RdmaRead(r) => write(rdma(r), r.addr, 0),
        SendOp::Send => write(send(), 0, 0),
        SendOp::SendWithImm { imm } => write(send(), 0, imm.to_be()),
        SendOp::CompareSwap { remote, compare, swap } => write(atomic(remote, compare, swap), remote.addr, 0),
        SendOp::FetchAdd { remote, add } => write(atomic(remote, add, 0), remote.addr, 0),
        SendOp::SendWithInv { rkey } => write(send(), 0, rkey),
        SendOp::LocalInv { rkey } => write(zeroed, 0, rkey),
        SendOp::BindMw(b) => {
            let mut arm = zeroed;
            arm.mw = MwArm {
                addr: b.addr,
                length: b.length,
                mr_lkey: b.mr_lkey,
                mw_rkey: b.mw_rkey,
                rkey: b.new_rkey,
                access: b.access,
            };
            write(arm, 0, 0)
        }
        // SAFETY: as above.
        SendOp::Raw(raw) => unsafe { write_raw_wqe(slot, wr, raw, length, num_sge) },
        SendOp::AtomicWrite { remote, value } => {
            write(rdma(remote), remote.addr, 0);
            // The value takes the place of the SGEs (`dma.atomic_wr`), 8 bytes of payload.
            // SAFETY: as above; `create` made sure every slot has 8 bytes after the header.
            unsafe {
                slot.add(size_of::<SendWqe>()).cast::<[u8; 8]>().write(value);
                let dma = &raw mut (*slot.cast::<SendWqe>().as_ptr()).dma;
                (*dma).length = 8;
                (*dma).resid = 8;
            }
        }
    }
}

/// [`write_send_wqe`]'s header for a [`SendOp::Raw`], as rdma-core's rxe writes an opcode it
/// does not know: the arm zeroed, `iova` from the `wr.rdma` arm, `ex` as given; the kernel
/// judges the opcode. Out of line, so that the common operations' arms stay as they were.
///
/// # Safety
/// As for [`write_send_wqe`].
#[cold]
#[inline(never)]
unsafe fn write_raw_wqe(slot: NonNull<u8>, wr: &SendWr<'_>, raw: RawOp, length: u32, num_sge: u32) {
    let header = send_header(
        wr.wr_id,
        raw.opcode,
        wr.flags,
        raw.imm_data,
        ZEROED_ARM,
        raw.remote.addr,
        length,
        num_sge,
    );
    // SAFETY: per the contract.
    unsafe { slot.cast::<SendWqe>().write(header) };
}

// SAFETY: MODIFY_QP carries no driver bytes on rxe.
unsafe impl QpQueues for RxeQp {
    unsafe fn post_send(&mut self, wrs: SendList<'_, '_>) -> Result<()> {
        let mut rejected = None;
        let mut posted = 0;
        for (index, wr) in wrs.iter(self.qp_type).enumerate() {
            let checked = wr.and_then(|wr| {
                if let SendOp::Raw(raw) = wr.op {
                    check_raw(raw)?;
                }
                Ok((wr, self.check_limits(wr.sg_list, wr.flags)?))
            });
            let (wr, inline_len) = match checked {
                Ok(checked) => checked,
                Err(reason) => {
                    rejected = Some((index, reason));
                    break;
                }
            };
            let Some(slot) = self.sq.next_slot() else {
                rejected = Some((index, WrReject::QueueFull));
                break;
            };
            // SAFETY: a free slot; `check_limits` bounded SGEs and inline data by what the
            // kernel granted, which sized the slot; inline memory is the caller's contract.
            unsafe { write_send_wqe(slot, wr, inline_len) };
            self.sq.advance();
            posted += 1;
        }
        self.finish(posted, rejected)
    }

    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let Some(rq) = self.rq.as_mut() else {
            return Err(Error::invalid("post_recv", "the QP takes receives from its SRQ"));
        };
        let result = post_recv_wqes(rq, self.max_recv_sge, wrs);
        rq.publish();
        result
    }

    /// The kernel resets rxe's rings itself and has no driver data for MODIFY_QP.
    fn modify(&mut self, _next: Option<QpState>, kernel: KernelCall<'_, ()>) -> Result<()> {
        kernel(&[], &mut [])
    }

    /// The ring's free slots, from the kernel's consumer index as of now.
    fn send_room(&mut self) -> u32 {
        self.sq.free()
    }

    /// The kernel flushed or dropped rxe's completions with the QP.
    fn destroyed(&mut self) {}
}

/// Chains as librxe's `ibv_post_send` and `ibv_wr_complete` post them (`crate::chain`).
impl ChainQueues for RxeQp {
    /// A single request read in place goes straight to its slot; any other chain, or one the
    /// slot refuses (limits, a full queue), goes through [`RxeQp::post_chain`], which reports
    /// why. In any state, as librxe: below RTS the kernel refuses the doorbell and the
    /// requests stay in the ring and run at the first doorbell after the QP reached RTS.
    unsafe fn post_send_chain(
        &mut self,
        chain: SendChain<'_>,
        qp_type: QpType,
        context: ContextId,
        _state: QpState,
    ) -> Result<()> {
        if let Some(wr) = chain.single(qp_type) {
            // SAFETY: forwarded contract.
            if unsafe { self.post_fast::<true>(&wr) }.is_ok() {
                self.sq.publish();
                return self.doorbell.ring(self.file.as_fd());
            }
        }
        // SAFETY: forwarded contract.
        unsafe { self.post_chain::<true>(chain, qp_type, context) }
    }

    /// As librxe's `ibv_wr_complete`: the batch written in any state, atomics unchecked (its
    /// builders check no length or alignment: the kernel judges them).
    unsafe fn post_send_batch(
        &mut self,
        chain: SendChain<'_>,
        qp_type: QpType,
        context: ContextId,
        _state: QpState,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.post_chain::<false>(chain, qp_type, context) }
    }
}

/// The [`Queues`] of an rxe QP: it writes chains itself.
///
/// # Safety
/// `queues` must be an [`RxeQp`]: queues an rxe context made ([`create`]).
pub(crate) unsafe fn queues(queues: Box<dyn QpQueues>) -> Queues {
    // SAFETY: an `RxeQp` (the contract), boxed by `create`: the same allocation and layout.
    Queues::new(unsafe { Box::from_raw(Box::into_raw(queues).cast::<RxeQp>()) })
}

/// Writes receive WQEs into `rq` (not yet published). Shared by QP receive queues and SRQs.
pub(super) fn post_recv_wqes(rq: &mut Producer, max_sge: u32, wrs: &[RecvWr<'_>]) -> Result<()> {
    for (index, wr) in wrs.iter().enumerate() {
        let reject = |reason| {
            Err(Error::WorkRequest {
                verb: "post_recv",
                index,
                reason,
            })
        };
        // A full queue first, as rdma-core's rxe checks.
        let Some(slot) = rq.next_slot() else {
            return reject(WrReject::QueueFull);
        };
        if wr.sg_list.len() > max_sge as usize {
            return reject(WrReject::TooManySge {
                given: wr.sg_list.len(),
                max: max_sge,
            });
        }
        let length = wr.sg_list.iter().map(|s| s.length).fold(0u32, u32::wrapping_add);
        let header = RecvWqe {
            wr_id: wr.wr_id,
            reserved: 0,
            padding: 0,
            dma: DmaInfo {
                length,
                resid: length,
                cur_sge: 0,
                num_sge: wr.sg_list.len() as u32,
                sge_offset: 0,
                reserved: 0,
            },
        };
        // SAFETY: a free slot sized by the kernel for `max_sge` SGEs (checked at map time),
        // 64-byte aligned.
        unsafe {
            slot.cast::<RecvWqe>().write(header);
            let sges = slot.add(size_of::<RecvWqe>()).cast::<Sge>();
            std::ptr::copy_nonoverlapping(wr.sg_list.as_ptr(), sges.as_ptr(), wr.sg_list.len());
        }
        rq.advance();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A send slot, 64-byte aligned as the ring's are.
    #[repr(C, align(64))]
    struct Slot([u8; 512]);

    /// Writes `wr` into a slot full of garbage; returns the slot.
    fn written(wr: &SendWr<'_>, inline_len: u32) -> Slot {
        let mut slot = Slot([0xa5; 512]);
        let at = NonNull::from(&mut slot.0).cast::<u8>();
        // SAFETY: 512 bytes hold the header and the two SGEs or 32 inline bytes; the inline
        // SGEs name `DATA`, which is readable.
        unsafe { write_send_wqe(at, wr, inline_len) };
        slot
    }

    /// The header's bytes.
    fn header_bytes(h: &SendWqe) -> &[u8] {
        // SAFETY: `SendWqe` is `repr(C)` of integers with no padding (its layout assertion
        // sums to its size), so all its bytes are initialized.
        unsafe { std::slice::from_raw_parts(std::ptr::from_ref(h).cast::<u8>(), size_of::<SendWqe>()) }
    }

    static DATA: [u8; 32] = [7; 32];

    /// A chain's atomics are checked as rdma-core's rxe checks them: 8 bytes or more over all
    /// SGEs, an aligned target; nothing else.
    #[test]
    fn atomics_of_a_chain_are_checked_as_librxe_checks_them() {
        let sge = |length| Sge {
            addr: 0x2000,
            length,
            lkey: 1,
        };
        assert_eq!(check_atomic(&[sge(8)], 0x1000), Ok(()));
        assert_eq!(check_atomic(&[sge(4), sge(8)], 0x1000), Ok(()), "two SGEs");
        assert_eq!(check_atomic(&[sge(16)], 0x1000), Ok(()), "longer");
        for (sg, addr) in [(&[][..], 0x1000), (&[sge(4)][..], 0x1000), (&[sge(8)][..], 0x1004)] {
            assert_eq!(check_atomic(sg, addr), Err(WrReject::BadAtomic), "{sg:?} at {addr:#x}");
        }
    }

    /// Every operation but UD's (which needs a kernel AH; the guest tests cover it): the
    /// whole 208-byte header, byte for byte against one built field by field (opcodes are the
    /// kernel's `IB_WR_*`), then the SGEs or the inline bytes.
    #[test]
    fn send_wqes_are_written_whole_for_every_operation() {
        let remote = Remote {
            addr: 0x1000_2000,
            rkey: 0x77,
        };
        let base = DATA.as_ptr() as u64;
        let sges = [
            Sge {
                addr: base,
                length: 24,
                lkey: 9,
            },
            Sge {
                addr: base + 24,
                length: 8,
                lkey: 9,
            },
        ];
        let rdma_arm = [remote.addr, u64::from(remote.rkey)];
        let cases: [(SendOp, u32, u32, &[u64], u64); 8] = [
            (SendOp::RdmaWrite(remote), 0, 0, &rdma_arm, remote.addr),
            (
                SendOp::RdmaWriteWithImm(remote, 0x1234),
                1,
                0x1234u32.to_be(),
                &rdma_arm,
                remote.addr,
            ),
            (SendOp::Send, 2, 0, &[], 0),
            (SendOp::SendWithImm { imm: 0x55 }, 3, 0x55u32.to_be(), &[], 0),
            (SendOp::RdmaRead(remote), 4, 0, &rdma_arm, remote.addr),
            (
                SendOp::CompareSwap {
                    remote,
                    compare: 3,
                    swap: 4,
                },
                5,
                0,
                &[remote.addr, 3, 4, u64::from(remote.rkey)],
                remote.addr,
            ),
            (
                SendOp::FetchAdd { remote, add: 5 },
                6,
                0,
                &[remote.addr, 5, 0, u64::from(remote.rkey)],
                remote.addr,
            ),
            // As librxe writes an opcode it does not know: arm zeroed, `ex` as given.
            (
                SendOp::Raw(RawOp {
                    opcode: 10,
                    imm_data: 0x1234u32.to_be(),
                    remote,
                }),
                10,
                0x1234u32.to_be(),
                &[],
                remote.addr,
            ),
        ];
        for (op, opcode, ex, arm, iova) in cases {
            for inline in [false, true] {
                let flags = if inline {
                    SendFlags::SIGNALED | SendFlags::INLINE
                } else {
                    SendFlags::SIGNALED
                };
                let wr = SendWr::new(0xfeed, op, &sges).set_flags(flags);
                let slot = written(&wr, if inline { 32 } else { 0 });
                let mut raw = [0u64; 15];
                raw[..arm.len()].copy_from_slice(arm);
                let want = SendWqe {
                    wr_id: 0xfeed,
                    reserved: 0,
                    opcode,
                    send_flags: flags.bits(),
                    ex,
                    wr: WrArm { raw },
                    status: 0,
                    state: 0,
                    iova,
                    mask: 0,
                    first_psn: 0,
                    last_psn: 0,
                    ack_length: 0,
                    ssn: 0,
                    has_rd_atomic: 0,
                    dma: DmaInfo {
                        length: 32,
                        resid: 32,
                        cur_sge: 0,
                        num_sge: if inline { 0 } else { 2 },
                        sge_offset: 0,
                        reserved: 0,
                    },
                };
                let (header, tail) = slot.0.split_at(size_of::<SendWqe>());
                assert_eq!(header, header_bytes(&want), "{op:?}, inline {inline}");
                if inline {
                    assert_eq!(&tail[..32], &DATA, "{op:?}: inline bytes");
                } else {
                    let want: Vec<u8> = sges
                        .iter()
                        .flat_map(|s| {
                            [
                                &s.addr.to_le_bytes()[..],
                                &s.length.to_le_bytes(),
                                &s.lkey.to_le_bytes(),
                            ]
                            .concat()
                        })
                        .collect();
                    assert_eq!(&tail[..32], want, "{op:?}: SGEs");
                }
                assert!(
                    tail[32..].iter().all(|&b| b == 0xa5),
                    "{op:?}: nothing past the request"
                );
            }
        }
    }

    /// An atomic write as rdma-core's rxe writes it: opcode 15, the RDMA arm, and the value
    /// in place of the SGEs as 8 bytes of payload.
    #[test]
    fn atomic_write_carries_its_value_as_the_payload() {
        let remote = Remote {
            addr: 0x1000_2008,
            rkey: 0x77,
        };
        let op = SendOp::AtomicWrite {
            remote,
            value: *b"ABCDEFGH",
        };
        let slot = written(&SendWr::new(3, op, &[]), 0);
        let mut raw = [0u64; 15];
        raw[..2].copy_from_slice(&[remote.addr, u64::from(remote.rkey)]);
        let want = SendWqe {
            wr_id: 3,
            reserved: 0,
            opcode: 15,
            send_flags: SendFlags::SIGNALED.bits(),
            ex: 0,
            wr: WrArm { raw },
            status: 0,
            state: 0,
            iova: remote.addr,
            mask: 0,
            first_psn: 0,
            last_psn: 0,
            ack_length: 0,
            ssn: 0,
            has_rd_atomic: 0,
            dma: DmaInfo {
                length: 8,
                resid: 8,
                cur_sge: 0,
                num_sge: 0,
                sge_offset: 0,
                reserved: 0,
            },
        };
        let (header, tail) = slot.0.split_at(size_of::<SendWqe>());
        assert_eq!(header, header_bytes(&want));
        assert_eq!(&tail[..8], b"ABCDEFGH");
        assert!(tail[8..].iter().all(|&b| b == 0xa5), "nothing past the value");
    }

    /// A request read in place from libibverbs' layout is written byte for byte as the same
    /// request as a `SendWr`, for every operation read in place, inline and not, whatever the
    /// C fields its operation does not use hold.
    #[test]
    fn in_place_requests_are_written_as_their_send_wr() {
        use crate::chain::{CAtomicArm, CSendArm, CSendWr};
        use crate::wr::WrOpcode;
        use std::ptr::NonNull;
        unsafe fn never(_: NonNull<CSendWr>, _: QpType) -> Option<SendWr<'static>> {
            unreachable!("every opcode here is read in place")
        }
        let sges = [Sge {
            addr: DATA.as_ptr() as u64,
            length: 8,
            lkey: 9,
        }];
        for opcode in (0..10).filter(|&o| o != WrOpcode::BIND_MW.0) {
            let atomic = opcode == WrOpcode::ATOMIC_CMP_AND_SWP.0 || opcode == WrOpcode::ATOMIC_FETCH_AND_ADD.0;
            for inline in [false, true].into_iter().filter(|&i| !(i && (atomic || opcode == 4))) {
                let flags = if inline {
                    SendFlags::SIGNALED | SendFlags::INLINE
                } else {
                    SendFlags::SIGNALED
                };
                let local_inv = opcode == WrOpcode::LOCAL_INV.0;
                let mut c = CSendWr {
                    wr_id: 0xfeed,
                    next: std::ptr::null_mut(),
                    sg_list: sges.as_ptr().cast_mut(),
                    num_sge: if local_inv { 0 } else { 1 },
                    opcode,
                    send_flags: flags.bits(),
                    imm_data: 0x1234_5678,
                    // Every byte set, used or not by the operation.
                    wr: CSendArm::atomic(CAtomicArm {
                        remote_addr: 0x1000_2000,
                        compare_add: 0x3333,
                        swap: 0x4444,
                        rkey: 0x77,
                    }),
                };
                // SAFETY: the test's one-request chain, live for the loop body.
                let mut chain = unsafe { SendChain::new(NonNull::from(&mut c), never) };
                let Some(ChainWr::Fast(fast)) = chain.next(QpType::Rc) else {
                    panic!("opcode {opcode}: not read in place");
                };
                let inline_len = if inline { 8 } else { 0 };
                let mut slot = Slot([0xa5; 512]);
                // SAFETY: as in `written`.
                unsafe { write_fast_wqe(NonNull::from(&mut slot.0).cast(), &fast, inline_len) };
                let want = written(&fast.to_send_wr(), inline_len);
                assert_eq!(slot.0, want.0, "opcode {opcode}, inline {inline}");
            }
        }
    }
}
