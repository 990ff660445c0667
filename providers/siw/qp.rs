//! siw queue pairs and shared receive queues: send slots filled and handed over by their
//! VALID flag, then an empty POST_SEND as the doorbell (the kernel transmits inside it);
//! receive slots handed over the same way, with no system call. What siw does not do is
//! refused here, before the kernel sees it.

use super::abi::{op, wqe, CreateQpResp, CreateSrqResp, Rqe, SiwSge, Sqe, INVAL_UOBJ_KEY, MAX_INLINE, MAX_SGE};
use super::ring::{free_to_fill, hand_over, Slots};
use super::SiwContext;
use crate::attr::{QpState, QpType};
use crate::device::DeviceFile;
use crate::error::{Error, Result, WrReject};
use crate::front_end::{GatheredChains, Queues};
use crate::provider::{CreateQpCall, KernelCall, KernelInput, ProviderQp, QpQueues, QpRequest, SrqCreated, SrqQueue};
use crate::sys::cmd::SendDoorbell;
use crate::wr::{RecvWr, SendFlags, SendList, SendOp, SendWr};
use std::os::fd::AsFd;
use std::sync::atomic::AtomicU16;
use std::sync::Arc;
use zerocopy::IntoBytes;

/// Offset of `flags` in send and receive slots.
const FLAGS_AT: usize = 8;

pub(super) fn create(ctx: &SiwContext, req: &QpRequest<'_>, kernel: CreateQpCall<'_>) -> Result<ProviderQp> {
    if req.qp_type != QpType::Rc {
        return Err(Error::Unsupported {
            verb: "CREATE_QP",
            what: "siw (iWARP) has RC QPs only",
        });
    }
    if req.cap.max_inline_data > MAX_INLINE {
        return Err(Error::invalid(
            "CREATE_QP",
            format!(
                "{} bytes of inline data asked for; siw holds at most {MAX_INLINE}",
                req.cap.max_inline_data
            ),
        ));
    }
    if req.cap.max_send_sge as usize > MAX_SGE || req.cap.max_recv_sge as usize > MAX_SGE {
        return Err(Error::invalid(
            "CREATE_QP",
            format!("siw takes at most {MAX_SGE} scatter/gather entries per request"),
        ));
    }
    let mut resp = CreateQpResp::default();
    let created = kernel(req.cap, &[], resp.as_mut_bytes())?;
    if resp.sq_key == INVAL_UOBJ_KEY || resp.rq_key == INVAL_UOBJ_KEY {
        return Err(Error::malformed(
            "CREATE_QP",
            "the kernel could not prepare the queues' mappings",
        ));
    }
    let sq = ctx.map_slots(resp.sq_key, resp.num_sqe, size_of::<Sqe>(), "CREATE_QP")?;
    let rq = match (req.srq, resp.num_rqe) {
        (None, n) if n > 0 => Some(Recv::new(
            ctx.map_slots(resp.rq_key, n, size_of::<Rqe>(), "CREATE_QP")?,
            created.cap.max_recv_sge.min(MAX_SGE as u32),
        )),
        _ => None,
    };
    let mut cap = created.cap;
    cap.max_inline_data = cap.max_inline_data.min(MAX_INLINE);
    cap.max_send_sge = cap.max_send_sge.min(MAX_SGE as u32);
    cap.max_recv_sge = cap.max_recv_sge.min(MAX_SGE as u32);
    let queues = Box::new(SiwQp {
        send: Send::new(sq, cap.max_send_sge, cap.max_inline_data, req.sq_sig_all),
        rq,
        doorbell: SendDoorbell::new(created.handle),
        file: ctx.file.clone(),
    });
    Ok(ProviderQp { queues, cap })
}

/// Chains through the vendor post: siw has no writer of its own for libibverbs' layout.
impl GatheredChains for SiwQp {}

/// The [`Queues`] of a siw QP.
///
/// # Safety
/// `queues` must be a [`SiwQp`]: queues a siw context made ([`create`]).
pub(crate) unsafe fn queues(queues: Box<dyn QpQueues>) -> Queues {
    // SAFETY: a `SiwQp` (the contract), boxed by `create`: the same allocation and layout.
    Queues::new(unsafe { Box::from_raw(Box::into_raw(queues).cast::<SiwQp>()) })
}

pub(super) fn create_srq(
    ctx: &SiwContext,
    kernel: crate::provider::KernelCall<'_, SrqCreated>,
) -> Result<Box<dyn SrqQueue>> {
    let mut resp = CreateSrqResp::default();
    let created = kernel(&[], resp.as_mut_bytes())?;
    if resp.srq_key == INVAL_UOBJ_KEY {
        return Err(Error::malformed(
            "CREATE_SRQ",
            "the kernel could not prepare the SRQ's mapping",
        ));
    }
    let ring = ctx.map_slots(resp.srq_key, resp.num_rqe, size_of::<Rqe>(), "CREATE_SRQ")?;
    Ok(Box::new(SiwSrq {
        rq: Recv::new(ring, created.max_sge.min(MAX_SGE as u32)),
    }))
}

/// A send queue: the slots and our position in them.
pub(super) struct Send {
    slots: Slots,
    put: u32,
    max_sge: u32,
    /// Inline bytes a request may carry: the QP's, at most `MAX_INLINE`.
    max_inline: u32,
    sig_all: bool,
}

impl Send {
    pub(super) fn new(slots: Slots, max_sge: u32, max_inline: u32, sig_all: bool) -> Self {
        Self {
            slots,
            put: 0,
            max_sge,
            max_inline: max_inline.min(MAX_INLINE),
            sig_all,
        }
    }

    fn flag(&self, pos: u32) -> &AtomicU16 {
        // SAFETY: `flags` is the 2-byte field at offset 8 of every 120-byte send slot.
        unsafe { self.slots.flag::<AtomicU16>(pos, FLAGS_AT) }
    }

    /// Free slots from our position on: those the kernel has copied.
    fn room(&self) -> u32 {
        (0..self.slots.count())
            .take_while(|&i| free_to_fill(self.flag(self.put.wrapping_add(i))))
            .count() as u32
    }

    /// Checks `wr` against what siw does and writes it into the next slot, handing it over.
    ///
    /// # Safety
    /// Inline requests' SGEs name readable memory (the caller's contract of `post_send`).
    pub(super) unsafe fn push(&mut self, wr: &SendWr<'_>) -> Result<(), WrReject> {
        let mut sqe = Sqe {
            id: wr.wr_id,
            ..Sqe::default()
        };
        let mut flags = 0u16;
        if wr.flags.contains(SendFlags::SIGNALED) || self.sig_all {
            flags |= wqe::SIGNALLED;
        }
        if wr.flags.contains(SendFlags::SOLICITED) {
            flags |= wqe::SOLICITED;
        }
        if wr.flags.contains(SendFlags::FENCE) {
            flags |= wqe::READ_FENCE;
        }
        let inline = wr.flags.contains(SendFlags::INLINE);
        match wr.op {
            SendOp::Send => sqe.opcode = op::SEND,
            SendOp::SendWithInv { rkey } => {
                sqe.opcode = op::SEND_REMOTE_INV;
                sqe.rkey = rkey;
            }
            SendOp::RdmaWrite(r) => {
                sqe.opcode = op::WRITE;
                (sqe.raddr, sqe.rkey) = (r.addr, r.rkey);
            }
            SendOp::RdmaRead(r) => {
                // siw reads into one local buffer, and a read cannot be fenced.
                if wr.sg_list.len() > 1 {
                    return Err(WrReject::TooManySge {
                        given: wr.sg_list.len(),
                        max: 1,
                    });
                }
                if inline || flags & wqe::READ_FENCE != 0 {
                    return Err(WrReject::OpcodeNotSupported);
                }
                sqe.opcode = op::READ;
                (sqe.raddr, sqe.rkey) = (r.addr, r.rkey);
            }
            // Immediate data, atomics, local invalidation, memory windows and anything the core
            // does not model: siw's user-space interface has none of them.
            SendOp::SendWithImm { .. }
            | SendOp::RdmaWriteWithImm(..)
            | SendOp::CompareSwap { .. }
            | SendOp::FetchAdd { .. }
            | SendOp::LocalInv { .. }
            | SendOp::BindMw(_)
            | SendOp::AtomicWrite { .. }
            | SendOp::Raw(_) => return Err(WrReject::OpcodeNotSupported),
        }
        // siw_activate_tx takes inline data for SEND and WRITE only: anything else is EINVAL
        // there, with the slot left VALID, and the send queue stops.
        if inline && sqe.opcode != op::SEND && sqe.opcode != op::WRITE {
            return Err(WrReject::OpcodeNotSupported);
        }
        if inline {
            let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
            if len > u64::from(self.max_inline) {
                return Err(WrReject::InlineTooLong {
                    given: len as usize,
                    max: self.max_inline,
                });
            }
            flags |= wqe::INLINE;
            sqe.num_sge = 1;
            sqe.sge[0].length = len as u32;
        } else {
            if wr.sg_list.len() > self.max_sge as usize {
                return Err(WrReject::TooManySge {
                    given: wr.sg_list.len(),
                    max: self.max_sge,
                });
            }
            sqe.num_sge = wr.sg_list.len() as u8;
            for (to, s) in sqe.sge.iter_mut().zip(wr.sg_list) {
                *to = SiwSge {
                    laddr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                };
            }
        }
        if !free_to_fill(self.flag(self.put)) {
            return Err(WrReject::QueueFull);
        }
        let slot = self.slots.slot(self.put).cast::<Sqe>();
        // SAFETY: a whole free slot (VALID clear: the kernel copied it and leaves it alone);
        // the flags are stored last, through `hand_over`, so the header written here carries
        // flags 0. Inline bytes (at most `MAX_INLINE`, checked) go after the first SGE, as the
        // kernel reads them; their source is the caller's contract.
        unsafe {
            slot.write(sqe);
            if inline {
                let mut to = slot
                    .cast::<u8>()
                    .add(size_of::<Sqe>() - (MAX_SGE - 1) * size_of::<SiwSge>());
                for s in wr.sg_list {
                    std::ptr::copy_nonoverlapping(s.addr as *const u8, to.as_ptr(), s.length as usize);
                    to = to.add(s.length as usize);
                }
            }
        }
        hand_over(self.flag(self.put), flags);
        self.put = self.put.wrapping_add(1);
        Ok(())
    }
}

/// A receive queue (a QP's or an SRQ's): the slots and our position in them.
pub(super) struct Recv {
    slots: Slots,
    put: u32,
    max_sge: u32,
}

impl Recv {
    pub(super) fn new(slots: Slots, max_sge: u32) -> Self {
        Self { slots, put: 0, max_sge }
    }

    fn flag(&self, pos: u32) -> &AtomicU16 {
        // SAFETY: `flags` is the 2-byte field at offset 8 of every 112-byte receive slot.
        unsafe { self.slots.flag::<AtomicU16>(pos, FLAGS_AT) }
    }

    /// Writes `wrs` in order, each handed over by its flag.
    pub(super) fn post(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        for (index, wr) in wrs.iter().enumerate() {
            let reject = |reason| {
                Err(Error::WorkRequest {
                    verb: "post_recv",
                    index,
                    reason,
                })
            };
            if !free_to_fill(self.flag(self.put)) {
                return reject(WrReject::QueueFull);
            }
            if wr.sg_list.len() > self.max_sge as usize {
                return reject(WrReject::TooManySge {
                    given: wr.sg_list.len(),
                    max: self.max_sge,
                });
            }
            let mut rqe = Rqe {
                id: wr.wr_id,
                num_sge: wr.sg_list.len() as u8,
                ..Rqe::default()
            };
            for (to, s) in rqe.sge.iter_mut().zip(wr.sg_list) {
                *to = SiwSge {
                    laddr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                };
            }
            // SAFETY: a whole free slot (VALID clear); the flags go last, in `hand_over`.
            unsafe { self.slots.slot(self.put).cast::<Rqe>().write(rqe) };
            hand_over(self.flag(self.put), 0);
            self.put = self.put.wrapping_add(1);
        }
        Ok(())
    }
}

struct SiwQp {
    send: Send,
    rq: Option<Recv>,
    doorbell: SendDoorbell,
    file: Arc<DeviceFile>,
}

// SAFETY: siw's MODIFY_QP carries no driver bytes.
unsafe impl QpQueues for SiwQp {
    unsafe fn post_send(&mut self, wrs: SendList<'_, '_>) -> Result<()> {
        let mut rejected = None;
        let mut posted = 0;
        for (index, wr) in wrs.iter(QpType::Rc).enumerate() {
            // SAFETY: forwarded contract.
            if let Err(reason) = wr.and_then(|wr| unsafe { self.send.push(wr) }) {
                rejected = Some((index, reason));
                break;
            }
            posted += 1;
        }
        self.doorbell.finish_post(self.file.as_fd(), posted > 0, rejected)
    }

    fn send_room(&mut self) -> u32 {
        self.send.room()
    }

    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        match self.rq.as_mut() {
            Some(rq) => rq.post(wrs),
            None => Err(Error::invalid("post_recv", "the QP has no receive queue of its own")),
        }
    }

    fn modify(&mut self, _next: Option<QpState>, kernel: KernelCall<'_, ()>) -> Result<()> {
        kernel(&[], &mut [])
    }

    fn destroyed(&mut self) {}
}

struct SiwSrq {
    rq: Recv,
}

// SAFETY: siw's MODIFY_SRQ carries no driver bytes.
unsafe impl SrqQueue for SiwSrq {
    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.rq.post(wrs)
    }

    /// siw changes an SRQ's limit but not its size (Linux 6.1 `siw_modify_srq`).
    fn modify(&mut self, resize: bool, kernel: KernelInput<'_>) -> Result<()> {
        if resize {
            return Err(Error::Unsupported {
                verb: "MODIFY_SRQ",
                what: "siw SRQs cannot be resized",
            });
        }
        kernel(&[])
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::{Remote, Sge};
    use std::sync::atomic::Ordering;

    fn send_queue(count: u32) -> Send {
        Send::new(Slots::heap(count, size_of::<Sqe>(), 0), 2, 100, false)
    }

    fn slot(q: &Send, pos: u32) -> Sqe {
        // SAFETY: a whole slot of the synthetic ring.
        unsafe { q.slots.slot(pos).cast::<Sqe>().read() }
    }

    /// The kernel's side: copies the slot and clears its flags.
    fn kernel_takes(q: &Send, pos: u32) -> Sqe {
        let s = slot(q, pos);
        q.flag(pos).store(0, Ordering::Release);
        s
    }

    static DATA: [u8; 100] = [9; 100];

    #[test]
    fn sends_are_written_and_handed_over_by_the_valid_flag() {
        let mut q = send_queue(2);
        let sge = [Sge {
            addr: 0x1000,
            length: 64,
            lkey: 5,
        }];
        let write = SendWr::new(7, SendOp::RdmaWrite(Remote { addr: 0x2000, rkey: 9 }), &sge).with(SendFlags::SIGNALED);
        // SAFETY: not inline.
        unsafe { q.push(&write) }.unwrap();
        let s = slot(&q, 0);
        assert_eq!(
            (s.id, s.opcode, s.raddr, s.rkey, s.num_sge),
            (7, op::WRITE, 0x2000, 9, 1)
        );
        assert_eq!(s.flags, wqe::VALID | wqe::SIGNALLED);
        assert_eq!((s.sge[0].laddr, s.sge[0].length, s.sge[0].lkey), (0x1000, 64, 5));
        assert_eq!(q.room(), 1);
        // SAFETY: not inline.
        unsafe { q.push(&SendWr::new(8, SendOp::Send, &sge)) }.unwrap();
        assert_eq!(q.room(), 0);
        // SAFETY: not inline.
        let full = unsafe { q.push(&SendWr::new(9, SendOp::Send, &sge)) };
        assert_eq!(full, Err(WrReject::QueueFull));
        assert_eq!(kernel_takes(&q, 0).id, 7);
        assert_eq!(q.room(), 1);
        // SAFETY: not inline.
        unsafe { q.push(&SendWr::new(9, SendOp::Send, &sge)) }.unwrap();
        assert_eq!(slot(&q, 0).id, 9, "the ring wrapped");
    }

    #[test]
    fn inline_data_goes_after_the_first_sge_up_to_80_bytes() {
        let mut q = send_queue(2);
        let sge = [
            Sge {
                addr: DATA.as_ptr() as u64,
                length: 30,
                lkey: 0,
            },
            Sge {
                addr: DATA.as_ptr() as u64,
                length: 50,
                lkey: 0,
            },
        ];
        let wr = SendWr::new(1, SendOp::Send, &sge).with(SendFlags::INLINE);
        // SAFETY: the SGEs name `DATA`.
        unsafe { q.push(&wr) }.unwrap();
        let s = slot(&q, 0);
        assert_eq!(
            (s.flags & wqe::INLINE, s.num_sge, s.sge[0].length),
            (wqe::INLINE, 1, 80)
        );
        // SAFETY: the slot's bytes.
        let bytes = unsafe { std::slice::from_raw_parts(q.slots.slot(0).as_ptr().add(40), 80) };
        assert!(bytes.iter().all(|&b| b == 9));
        let long = [Sge {
            addr: DATA.as_ptr() as u64,
            length: 81,
            lkey: 0,
        }];
        let wr = SendWr::new(2, SendOp::Send, &long).with(SendFlags::INLINE);
        // SAFETY: the SGE names `DATA`.
        let long = unsafe { q.push(&wr) };
        assert_eq!(long, Err(WrReject::InlineTooLong { given: 81, max: 80 }));
    }

    #[test]
    fn what_siw_does_not_do_is_refused_before_a_slot_is_taken() {
        let mut q = send_queue(2);
        let r = Remote { addr: 8, rkey: 1 };
        let sge = [Sge {
            addr: 0x1000,
            length: 8,
            lkey: 5,
        }; 2];
        let refused = [
            (SendOp::SendWithImm { imm: 1 }, &sge[..1], WrReject::OpcodeNotSupported),
            (SendOp::RdmaWriteWithImm(r, 1), &sge[..1], WrReject::OpcodeNotSupported),
            (
                SendOp::CompareSwap {
                    remote: r,
                    compare: 0,
                    swap: 1,
                },
                &sge[..1],
                WrReject::OpcodeNotSupported,
            ),
            (
                SendOp::FetchAdd { remote: r, add: 1 },
                &sge[..1],
                WrReject::OpcodeNotSupported,
            ),
            (SendOp::LocalInv { rkey: 1 }, &[][..], WrReject::OpcodeNotSupported),
            (
                SendOp::AtomicWrite {
                    remote: r,
                    value: [0; 8],
                },
                &[][..],
                WrReject::OpcodeNotSupported,
            ),
            (SendOp::RdmaRead(r), &sge[..], WrReject::TooManySge { given: 2, max: 1 }),
            (
                SendOp::Send,
                &[sge[0]; 3][..],
                WrReject::TooManySge { given: 3, max: 2 },
            ),
        ];
        for (op, sg, why) in refused {
            // SAFETY: not inline.
            assert_eq!(unsafe { q.push(&SendWr::new(1, op, sg)) }, Err(why), "{op:?}");
        }
        let fenced_read = SendWr::new(1, SendOp::RdmaRead(r), &sge[..1]).with(SendFlags::FENCE);
        // SAFETY: not inline.
        assert_eq!(unsafe { q.push(&fenced_read) }, Err(WrReject::OpcodeNotSupported));
        assert_eq!(q.room(), 2, "no slot was taken");
    }

    #[test]
    fn receives_are_handed_over_by_the_valid_flag() {
        let mut rq = Recv::new(Slots::heap(2, size_of::<Rqe>(), 0), 2);
        let sge = [Sge {
            addr: 0x1000,
            length: 64,
            lkey: 5,
        }];
        rq.post(&[RecvWr::new(1, &sge), RecvWr::new(2, &sge)]).unwrap();
        let e = rq.post(&[RecvWr::new(3, &sge)]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::WorkRequest {
                    index: 0,
                    reason: WrReject::QueueFull,
                    ..
                }
            ),
            "{e}"
        );
        // SAFETY: a whole slot of the synthetic ring.
        let r = unsafe { rq.slots.slot(1).cast::<Rqe>().read() };
        assert_eq!((r.id, r.flags, r.num_sge, r.sge[0].length), (2, wqe::VALID, 1, 64));
        rq.flag(0).store(0, Ordering::Release);
        rq.flag(1).store(0, Ordering::Release);
        let three = [sge[0]; 3];
        let e = rq.post(&[RecvWr::new(3, &sge), RecvWr::new(4, &three)]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::WorkRequest {
                    index: 1,
                    reason: WrReject::TooManySge { .. },
                    ..
                }
            ),
            "{e}"
        );
    }
}
