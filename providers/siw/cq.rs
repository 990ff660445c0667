//! siw completion queues: `struct siw_cqe` slots the kernel fills and marks VALID, then the
//! control word user space writes to arm the CQ. The CQEs are not `ibv_wc`s: `poll` translates
//! each into a [`WorkCompletion`] ([`translate`], which takes any bytes: the kernel's values are
//! not trusted), and `ready_run` translates into a scratch array.

use super::abi::{notify, op, wqe, Cqe, CreateCqResp, CQ_CTRL_SIZE, INVAL_UOBJ_KEY};
use super::ring::{give_back, ready_to_read, Slots};
use super::SiwContext;
use crate::error::{Error, Result};
use crate::provider::{CqRing, CreateCqCall, ReadyRun, ResizeCqCall};
use crate::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use zerocopy::IntoBytes;

/// Completions `ready_run` translates at once.
const SCRATCH: usize = 64;

/// Offset of `flags` in a CQE.
const FLAGS_AT: usize = 8;

pub(super) fn create(ctx: &SiwContext, cqe: u32, kernel: CreateCqCall<'_>) -> Result<Box<dyn CqRing>> {
    let mut resp = CreateCqResp::default();
    kernel(cqe, &[], resp.as_mut_bytes())?;
    if resp.cq_key == INVAL_UOBJ_KEY {
        return Err(Error::malformed(
            "CREATE_CQ",
            "the kernel could not prepare the CQ's mapping",
        ));
    }
    let len = (resp.num_cqe as usize)
        .checked_mul(size_of::<Cqe>())
        .and_then(|n| n.checked_add(CQ_CTRL_SIZE))
        .ok_or_else(|| Error::malformed("CREATE_CQ", format!("{} CQEs", resp.num_cqe)))?;
    let ring = ctx.map(
        resp.cq_key,
        len,
        resp.num_cqe,
        size_of::<Cqe>(),
        CQ_CTRL_SIZE,
        "CREATE_CQ",
    )?;
    Ok(Box::new(SiwCq::new(ring)))
}

struct SiwCq {
    ring: Slots,
    /// The position of the next completion to read.
    get: u32,
    /// What `ready_run` translated, not yet consumed.
    scratch: Box<[WorkCompletion]>,
}

impl SiwCq {
    fn new(ring: Slots) -> Self {
        Self {
            ring,
            get: 0,
            scratch: vec![WorkCompletion::default(); SCRATCH].into_boxed_slice(),
        }
    }

    /// The flags of the CQE at position `pos`.
    #[inline]
    fn flag(&self, pos: u32) -> &AtomicU8 {
        // SAFETY: `flags` is the byte at offset 8 of every 32-byte CQE.
        unsafe { self.ring.flag::<AtomicU8>(pos, FLAGS_AT) }
    }

    /// The CQE at `pos`, if the kernel marked it VALID: read after the flags (Acquire).
    #[inline]
    fn read(&self, pos: u32) -> Option<Cqe> {
        if !ready_to_read(self.flag(pos)) {
            return None;
        }
        // SAFETY: a whole CQE inside the ring (`Slots::slot`), 8-aligned; the kernel leaves it
        // alone until we give it back. Volatile: it is shared memory.
        Some(unsafe { self.ring.slot(pos).cast::<Cqe>().read_volatile() })
    }
}

/// A [`WorkCompletion`] of a CQE. Every value is taken as it comes: an opcode siw does not
/// define becomes `WcOpcode(u32::MAX)`, a status it does not define `GENERAL_ERR` with the raw
/// status as `vendor_err`.
pub(super) fn translate(c: &Cqe) -> WorkCompletion {
    let opcode = match c.opcode {
        op::WRITE => WcOpcode::RDMA_WRITE,
        op::READ | op::READ_LOCAL_INV => WcOpcode::RDMA_READ,
        op::SEND | op::SEND_WITH_IMM | op::SEND_REMOTE_INV => WcOpcode::SEND,
        op::FETCH_AND_ADD => WcOpcode::FETCH_ADD,
        op::COMP_AND_SWAP => WcOpcode::COMP_SWAP,
        op::RECEIVE => WcOpcode::RECV,
        _ => WcOpcode(u32::MAX),
    };
    let (status, vendor_err) = match c.status {
        0 => (WcStatus::SUCCESS, 0),
        1 => (WcStatus::LOC_LEN_ERR, 0),
        2 => (WcStatus::LOC_PROT_ERR, 0),
        3 => (WcStatus::LOC_QP_OP_ERR, 0),
        4 => (WcStatus::WR_FLUSH_ERR, 0),
        5 => (WcStatus::BAD_RESP_ERR, 0),
        6 => (WcStatus::LOC_ACCESS_ERR, 0),
        7 => (WcStatus::REM_ACCESS_ERR, 0),
        8 => (WcStatus::REM_INV_REQ_ERR, 0),
        9 => (WcStatus::GENERAL_ERR, 0),
        s => (WcStatus::GENERAL_ERR, u32::from(s)),
    };
    let mut wc = WorkCompletion::default();
    (wc.wr_id, wc.status, wc.opcode, wc.vendor_err) = (c.id, status, opcode, vendor_err);
    (wc.byte_len, wc.qp_num) = (c.bytes, c.qp_id as u32);
    if u16::from(c.flags) & wqe::REM_INVAL != 0 {
        wc.wc_flags = WcFlags::WITH_INV;
        wc.imm_data = c.imm_data as u32;
    }
    wc
}

// SAFETY: `ready_run` describes `scratch`, ours, 8-aligned `WorkCompletion`s, changed only by
// methods taking `&mut self`. No driver bytes carry addresses.
unsafe impl CqRing for SiwCq {
    fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        while n < wc.len() {
            let Some(cqe) = self.read(self.get) else {
                break;
            };
            wc[n] = translate(&cqe);
            give_back(self.flag(self.get));
            self.get = self.get.wrapping_add(1);
            n += 1;
        }
        n
    }

    fn ready_run(&mut self) -> ReadyRun {
        let max = SCRATCH.min(self.ring.count() as usize);
        let mut n = 0;
        while n < max {
            let Some(cqe) = self.read(self.get.wrapping_add(n as u32)) else {
                break;
            };
            self.scratch[n] = translate(&cqe);
            n += 1;
        }
        // From the whole array, so that the pointer reaches every staged completion.
        let first = NonNull::new(self.scratch.as_mut_ptr()).unwrap_or(NonNull::dangling());
        ReadyRun {
            first,
            before_wrap: n,
            wrapped: first,
            len: n,
            stride: size_of::<WorkCompletion>(),
        }
    }

    fn consume(&mut self, n: usize) {
        for _ in 0..n {
            give_back(self.flag(self.get));
            self.get = self.get.wrapping_add(1);
        }
    }

    /// siw has no RESIZE_CQ (Linux 6.1 registers none; rdma-core's libsiw answers EOPNOTSUPP).
    fn resize(&mut self, _cqe: u32, _kernel: ResizeCqCall<'_>) -> Result<u32> {
        Err(Error::Unsupported {
            verb: "RESIZE_CQ",
            what: "siw CQs cannot be resized",
        })
    }

    /// siw arms in user space: the notify flags go into the control word after the CQEs,
    /// which the kernel reads when it adds a completion.
    fn arm(&mut self, solicited_only: bool, _events: u32, _kernel: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let flags = if solicited_only {
            notify::SOLICITED
        } else {
            notify::SOLICITED | notify::NEXT_COMPLETION
        };
        let Some(ctrl) = self.ring.tail() else {
            return Err(Error::malformed("req_notify_cq", "the CQ has no control word"));
        };
        // SAFETY: the control word (`struct siw_cq_ctrl`, 8 bytes, 8-aligned after 32-byte
        // CQEs) starts with the 32-bit flags, which the kernel reads and clears atomically.
        let word = unsafe { ctrl.cast::<AtomicU32>().as_ref() };
        word.store(flags, Ordering::SeqCst);
        Ok(())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A CQ on a synthetic ring and a way to play the kernel's side, for the unit tests, miri and
/// the hostile-ring harness.
#[cfg(any(test, feature = "test-support"))]
pub mod hostile {
    use super::*;
    use zerocopy::FromBytes;

    /// A siw CQ of `count` slots and the kernel's side of it.
    pub struct HostileCq {
        cq: SiwCq,
    }

    impl HostileCq {
        /// An empty CQ of `count` (at least 1) slots.
        pub fn new(count: u32) -> Self {
            Self {
                cq: SiwCq::new(Slots::heap(count.max(1), size_of::<Cqe>(), CQ_CTRL_SIZE)),
            }
        }

        /// Writes the 32 bytes of the slot at `pos` as the kernel would (`bytes` is a CQE, any
        /// bytes: flags, opcode and status included), the flags byte last with Release.
        pub fn kernel_writes(&mut self, pos: u32, bytes: [u8; 32]) {
            let slot = self.cq.ring.slot(pos);
            // SAFETY: 32 bytes of the synthetic ring's slot; the CQ reads it only through
            // `&mut self` calls, after this.
            unsafe {
                for (i, b) in bytes.iter().enumerate() {
                    if i != FLAGS_AT {
                        slot.add(i).write_volatile(*b);
                    }
                }
            }
            self.cq.flag(pos).store(bytes[FLAGS_AT], Ordering::Release);
        }

        /// Whether the slot at `pos` was given back (flags zero).
        pub fn given_back(&self, pos: u32) -> bool {
            self.cq.flag(pos).load(Ordering::Acquire) == 0
        }

        /// [`CqRing::poll`].
        pub fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
            self.cq.poll(wc)
        }

        /// [`CqRing::ready_run`]'s completions, copied, then [`CqRing::consume`] of `take`.
        pub fn ready_then_consume(&mut self, take: usize) -> Vec<WorkCompletion> {
            let run = self.cq.ready_run();
            // SAFETY: `run` names `len` completions of our scratch array, unchanged until the
            // next `&mut` call.
            let v = (0..run.len)
                .map(|i| unsafe { run.first.add(i).read() })
                .collect::<Vec<_>>();
            self.cq.consume(take.min(run.len));
            v
        }

        /// The control word's notify flags.
        pub fn armed(&self) -> u32 {
            // SAFETY: as in `arm`.
            self.cq
                .ring
                .tail()
                .map_or(0, |t| unsafe { t.cast::<AtomicU32>().as_ref() }.load(Ordering::SeqCst))
        }

        /// Plays `data` (libFuzzer's bytes, or seeded ones) as a lying kernel against a CQ of
        /// 1 to 16 slots: CQEs of any bytes written into any slot (flags with or without VALID,
        /// over unpolled ones, out of order), polls of any width, `ready_run`s consumed in part.
        /// Panics where the CQ returns a completion that is not the one in the slot at its
        /// position, hands back a slot it did not read, or reads past a slot not VALID.
        pub fn run(data: &[u8]) {
            let mut input = crate::testing::FuzzInput::new(data);
            let count = u32::from(input.below(16)) + 1;
            let mut h = Self::new(count);
            // The model: what each slot holds (its bytes), and the next position to read.
            let mut slots: Vec<Option<[u8; 32]>> = vec![None; count as usize];
            let mut get = 0u32;
            let at = |pos: u32| (pos % count) as usize;
            let expect = |bytes: &[u8; 32]| translate(&Cqe::read_from_bytes(bytes).unwrap_or_default());
            let mut out = [WorkCompletion::default(); 20];
            while !input.is_empty() {
                match input.below(3) {
                    0 => {
                        let pos = u32::from(input.below(count as u8));
                        let mut bytes: [u8; 32] = input.bytes();
                        bytes[FLAGS_AT] &= 0x7f;
                        h.kernel_writes(pos, bytes);
                        slots[at(pos)] = (bytes[FLAGS_AT] != 0).then_some(bytes);
                    }
                    1 => {
                        let want = usize::from(input.below(20));
                        let n = h.poll(&mut out[..want]);
                        assert!(n <= want, "polled {n} of {want}");
                        for wc in &out[..n] {
                            let bytes = slots[at(get)].take().expect("a completion from a slot not written");
                            assert!(bytes[FLAGS_AT] & 1 != 0, "a completion from a slot without VALID");
                            assert_eq!(*wc, expect(&bytes));
                            assert!(h.given_back(get), "a polled slot was not given back");
                            get = get.wrapping_add(1);
                        }
                        if n < want {
                            assert!(
                                slots[at(get)].is_none_or(|b| b[FLAGS_AT] & 1 == 0),
                                "poll stopped at a VALID slot"
                            );
                        }
                    }
                    _ => {
                        let take = usize::from(input.below(20));
                        let run = h.ready_then_consume(take);
                        for (i, wc) in run.iter().enumerate() {
                            let bytes = slots[at(get.wrapping_add(i as u32))]
                                .expect("a staged completion from a slot not written");
                            assert_eq!(*wc, expect(&bytes));
                        }
                        for _ in 0..take.min(run.len()) {
                            slots[at(get)] = None;
                            get = get.wrapping_add(1);
                        }
                    }
                }
                // A slot without VALID the model keeps as empty.
                for s in slots.iter_mut() {
                    if s.is_some_and(|b| b[FLAGS_AT] & 1 == 0) {
                        *s = None;
                    }
                }
            }
        }

        /// [`CqRing::arm`].
        pub fn arm(&mut self, solicited_only: bool) {
            let mut never = || -> Result<()> { Err(Error::invalid("arm", "siw arms in user space")) };
            let _ = self.cq.arm(solicited_only, 0, &mut never);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::hostile::HostileCq;
    use super::*;
    use zerocopy::FromBytes;

    fn cqe(id: u64, flags: u8, opcode: u8, status: u16, bytes: u32, qp: u64) -> [u8; 32] {
        let c = Cqe {
            id,
            flags,
            opcode,
            status,
            bytes,
            imm_data: 0x1234_5678,
            qp_id: qp,
        };
        let mut b = [0u8; 32];
        b.copy_from_slice(c.as_bytes());
        b
    }

    #[test]
    fn completions_are_read_by_the_valid_flag_in_order_and_given_back() {
        let mut h = HostileCq::new(4);
        let mut wc = [WorkCompletion::default(); 8];
        assert_eq!(h.poll(&mut wc), 0);
        h.kernel_writes(0, cqe(10, 1, op::SEND, 0, 100, 7));
        h.kernel_writes(1, cqe(11, 1, op::RECEIVE, 0, 64, 7));
        // Slot 3 is valid but slot 2 is not: the poll stops at the gap.
        h.kernel_writes(3, cqe(13, 1, op::READ, 0, 8, 7));
        assert_eq!(h.poll(&mut wc), 2);
        assert_eq!(
            (wc[0].wr_id, wc[0].opcode, wc[0].byte_len, wc[0].qp_num),
            (10, WcOpcode::SEND, 100, 7)
        );
        assert_eq!((wc[1].wr_id, wc[1].opcode), (11, WcOpcode::RECV));
        assert!(h.given_back(0) && h.given_back(1) && !h.given_back(3));
        h.kernel_writes(2, cqe(12, 1, op::WRITE, 4, 0, 7));
        assert_eq!(h.poll(&mut wc), 2);
        assert_eq!((wc[0].wr_id, wc[0].status), (12, WcStatus::WR_FLUSH_ERR));
        assert_eq!((wc[1].wr_id, wc[1].opcode), (13, WcOpcode::RDMA_READ));
        // Around the ring again.
        h.kernel_writes(4, cqe(14, 1, op::SEND, 0, 1, 7));
        assert_eq!(h.poll(&mut wc[..1]), 1);
        assert_eq!(wc[0].wr_id, 14);
    }

    #[test]
    fn ready_run_stages_without_giving_back_until_consumed() {
        let mut h = HostileCq::new(4);
        for i in 0..3 {
            h.kernel_writes(i, cqe(u64::from(i), 1, op::SEND, 0, 1, 1));
        }
        let v = h.ready_then_consume(1);
        assert_eq!(v.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(h.given_back(0) && !h.given_back(1));
        let v = h.ready_then_consume(2);
        assert_eq!(v.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2]);
        assert!(h.given_back(1) && h.given_back(2));
        assert!(h.ready_then_consume(5).is_empty());
    }

    #[test]
    fn hostile_cqes_become_typed_completions() {
        let mut h = HostileCq::new(2);
        let mut wc = [WorkCompletion::default(); 2];
        // Every flag bit, an opcode and a status siw does not define.
        h.kernel_writes(0, cqe(1, 0xff, 0xee, 0xffff, u32::MAX, u64::MAX));
        assert_eq!(h.poll(&mut wc), 1);
        assert_eq!(wc[0].opcode, WcOpcode(u32::MAX));
        assert_eq!((wc[0].status, wc[0].vendor_err), (WcStatus::GENERAL_ERR, 0xffff));
        assert_eq!(wc[0].qp_num, u32::MAX);
        assert_eq!((wc[0].wc_flags, wc[0].imm_data), (WcFlags::WITH_INV, 0x1234_5678));
        // Flags without VALID: not a completion.
        h.kernel_writes(1, cqe(2, 0xfe, op::SEND, 0, 0, 0));
        assert_eq!(h.poll(&mut wc), 0);
        for b in 0..=255u8 {
            let mut bytes = [b; 32];
            bytes[FLAGS_AT] = 1;
            let _ = translate(&Cqe::read_from_bytes(&bytes).unwrap_or_default());
        }
    }

    /// The hostile-ring harness on seeded inputs (the fuzz target `siw_cqe` runs it on
    /// libFuzzer's).
    #[test]
    fn a_lying_kernel_gets_only_the_completions_it_wrote() {
        let runs = if cfg!(miri) { 4 } else { 300 };
        for seed in 0..runs {
            let mut rng = crate::testing::Rng::new(seed);
            let data: Vec<u8> = (0..400).map(|_| rng.next_u64() as u8).collect();
            HostileCq::run(&data);
        }
    }

    #[test]
    fn arming_writes_the_control_word_and_never_the_kernel() {
        let mut h = HostileCq::new(2);
        assert_eq!(h.armed(), notify::NOT);
        h.arm(true);
        assert_eq!(h.armed(), notify::SOLICITED);
        h.arm(false);
        assert_eq!(h.armed(), notify::SOLICITED | notify::NEXT_COMPLETION);
    }
}
