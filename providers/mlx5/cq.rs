//! mlx5 completion queues: a user-allocated ring of 64-byte CQEs the device hands over by
//! flipping each entry's owner bit, a doorbell record for the consumer index and arming, and
//! the CQ doorbell in UAR page 0.
//!
//! The ring and the table of the QPs completing on it live in [`CqShared`] behind a lock
//! ([`gate`]): the poller takes it without waiting (a poll that finds it taken returns
//! nothing) and without a read-modify-write, and a QP scrubbing its CQEs on RESET or destroy,
//! or linking itself at create, waits for the poller's batch to end. So a QP's state is never
//! freed while a poll reads it, whatever CQE the device writes.

use super::cqe::{self, BadCqe, Cqe64, Decoded, WorkQueue, CQE_SIZE, INVALID_OP_OWN, OP_OWN};
use super::mem::{mmio_fence, Buffer, Doorbell};
use super::qp::{QpShared, SendRun};
use super::srq::SrqShared;
use super::wqe::opcode as send_opcode;
use super::{abi, Ctx};
use crate::error::{Error, Result};
use crate::provider::{CqRing, CreateCqCall, ReadyRun, ResizeCqCall};
use crate::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use gate::Gate;
use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use zerocopy::IntoBytes;

mod gate;
#[cfg(any(test, feature = "test-support"))]
pub mod hostile;

/// Doorbell record words (`MLX5_CQ_SET_CI`, `MLX5_CQ_ARM_DB`).
const SET_CI: usize = 0;
const ARM_DB: usize = 1;
/// `MLX5_CQ_DOORBELL`: the CQ doorbell's offset in UAR page 0.
const UAR_CQ_DOORBELL: usize = 0x20;
/// `MLX5_CQ_DB_REQ_NOT_SOL`: arm for solicited completions only.
const ARM_SOLICITED: u32 = 1 << 24;
/// The largest ring the device takes.
const MAX_CQES: u32 = 1 << 24;
/// Completions translated per `ready_run`.
const SCRATCH: usize = 64;

/// The ring for at least `cqe` completions: a power of two above it, as the kernel computes.
fn ring_size(verb: &'static str, cqe: u32) -> Result<u32> {
    cqe.checked_add(1)
        .and_then(u32::checked_next_power_of_two)
        .filter(|&n| n <= MAX_CQES)
        .ok_or_else(|| Error::invalid(verb, format!("{cqe} entries: at most {} on mlx5", MAX_CQES - 1)))
}

pub(super) fn create(ctx: &Arc<Ctx>, cqe: u32, kernel: CreateCqCall<'_>) -> Result<Box<dyn CqRing>> {
    let ncqe = ring_size("CREATE_CQ", cqe)?;
    let ring = Ring::new(ncqe, "CREATE_CQ")?;
    let db = ctx.db_pages.alloc("CREATE_CQ")?;
    let req = abi::CreateCq {
        buf_addr: ring.buf.addr(),
        db_addr: db.addr(),
        cqe_size: CQE_SIZE as u32,
        ..Default::default()
    };
    let mut resp = abi::CreateCqResp::default();
    kernel(ncqe - 1, req.as_bytes(), resp.as_mut_bytes())?;
    Ok(Box::new(Mlx5Cq {
        poller: CqShared::create(ring, db),
        ctx: ctx.clone(),
        cqn: resp.cqn,
        scratch: vec![WorkCompletion::default(); SCRATCH].into_boxed_slice(),
        pending: 0..0,
    }))
}

/// The CQE ring and the consumer index.
pub(super) struct Ring {
    buf: Buffer,
    /// Entries, a power of two.
    ncqe: u32,
    /// Free-running consumer index.
    ci: u32,
}

impl Ring {
    /// A ring of `ncqe` (a power of two) entries, each marked not yet written.
    pub(super) fn new(ncqe: u32, verb: &'static str) -> Result<Self> {
        let buf = Buffer::new(ncqe as usize * CQE_SIZE, verb)?;
        let ring = Self { buf, ncqe, ci: 0 };
        for i in 0..ncqe {
            ring.op_own(i).store(INVALID_OP_OWN, Ordering::Relaxed);
        }
        Ok(ring)
    }

    /// Entry `index` (masked).
    fn entry(&self, index: u32) -> NonNull<u8> {
        let slot = (index & (self.ncqe - 1)) as usize;
        // SAFETY: `slot < ncqe` and the buffer holds `ncqe` entries.
        unsafe { self.buf.base().add(slot * CQE_SIZE) }
    }

    /// Entry `index`'s `op_own` byte, which the device writes last.
    fn op_own(&self, index: u32) -> &AtomicU8 {
        // SAFETY: byte 63 of an entry inside the buffer, which lives as long as `self`.
        unsafe { &*self.entry(index).add(OP_OWN).cast::<AtomicU8>().as_ptr() }
    }

    /// Entry `index` and its `op_own`, if the device has handed it over: a valid opcode and
    /// the owner bit of `index`'s pass over the ring. Acquire: the rest of the entry is read
    /// after.
    #[inline(always)]
    fn handed_over(&self, index: u32) -> Option<(NonNull<u8>, u8)> {
        let entry = self.entry(index);
        // SAFETY: byte 63 of an entry inside the buffer, which lives as long as `self`.
        let op_own = unsafe { &*entry.add(OP_OWN).cast::<AtomicU8>().as_ptr() }.load(Ordering::Acquire);
        let pass = u8::from(index & self.ncqe != 0);
        if cqe::cqe_opcode(op_own) == cqe::opcode::INVALID || cqe::owner(op_own) != pass {
            return None;
        }
        Some((entry, op_own))
    }

    /// The bytes of the CQE at `index`, if the device has handed it over.
    fn ready(&self, index: u32) -> Option<[u8; CQE_SIZE]> {
        let (entry, _) = self.handed_over(index)?;
        Some(copy_cqe(entry))
    }

    /// How many CQEs the device has handed over past the consumer index.
    fn queued(&self) -> u32 {
        let mut end = self.ci;
        while end.wrapping_sub(self.ci) < self.ncqe && self.ready(end).is_some() {
            end = end.wrapping_add(1);
        }
        end.wrapping_sub(self.ci)
    }

    /// Whether the device can write its RESIZE CQE: it marks the switch with one in this
    /// (the old) ring, so a full ring has no slot for it and the resize would overrun the
    /// CQ (the CQEs queued lost, and no RESIZE CQE for [`Ring::take_from`] to find).
    fn room_for_resize_cqe(&self) -> Result<()> {
        if self.queued() >= self.ncqe {
            return Err(Error::invalid(
                "RESIZE_CQ",
                format!(
                    "the CQ is full ({} completions queued): the device has no slot for its RESIZE CQE; poll first",
                    self.ncqe
                ),
            ));
        }
        Ok(())
    }

    /// After RESIZE_CQ: moves the CQEs `old` holds in front of the device's RESIZE CQE into
    /// this ring, each one index later (the RESIZE CQE took an index), with this ring's owner
    /// bits, as libmlx5's `mlx5_cq_resize_copy_cqes` does: the consumer index moves one on,
    /// and the device goes on writing after the RESIZE CQE's index.
    fn take_from(&mut self, old: &Ring) -> Result<()> {
        let mut i = old.ci;
        loop {
            let bytes = (i.wrapping_sub(old.ci) < old.ncqe)
                .then(|| old.ready(i))
                .flatten()
                .ok_or_else(|| Error::Malformed {
                    verb: "RESIZE_CQ",
                    detail: format!(
                        "no RESIZE CQE from the device in the old ring after index {i:#x}: the completions \
                         queued before the resize are lost"
                    ),
                })?;
            if cqe::cqe_opcode(bytes[OP_OWN]) == cqe::opcode::RESIZE_CQ {
                break;
            }
            let to = i.wrapping_add(1);
            let mut moved = bytes;
            moved[OP_OWN] = (bytes[OP_OWN] & !1) | u8::from(to & self.ncqe != 0);
            // SAFETY: a whole entry inside this ring's buffer; the device writes only after
            // the RESIZE CQE's index, which this never reaches.
            unsafe { self.entry(to).cast::<[u8; CQE_SIZE]>().as_ptr().write_volatile(moved) };
            i = to;
        }
        self.ci = old.ci.wrapping_add(1);
        Ok(())
    }

    /// Removes the CQEs of user index `uidx` among those handed over, as libmlx5's
    /// `__mlx5_cq_clean` does: later entries move up over them, keeping each destination's
    /// owner bit; the WQEs of removed receive CQEs go back to `srq`. Returns how many were
    /// removed.
    fn scrub(&mut self, uidx: u32, srq: Option<&SrqShared>) -> u32 {
        let mut removed = 0u32;
        let mut i = self.ci.wrapping_add(self.queued());
        while i != self.ci {
            i = i.wrapping_sub(1);
            let Some(bytes) = self.ready(i) else { break };
            let cqe = Cqe64::parse(&bytes);
            if cqe.user_index() == uidx {
                if let Some(srq) = srq.filter(|_| cqe::is_responder(cqe::cqe_opcode(cqe.op_own))) {
                    // A WQE not posted (a hostile CQE) is left alone.
                    let _ = srq.complete(cqe.wqe_counter);
                }
                removed += 1;
            } else if removed > 0 {
                let to = i.wrapping_add(removed);
                let owner = self.op_own(to).load(Ordering::Relaxed) & 1;
                let mut moved = bytes;
                moved[OP_OWN] = (bytes[OP_OWN] & !1) | owner;
                // SAFETY: a whole entry inside the buffer, handed over by the device.
                unsafe { self.entry(to).cast::<[u8; CQE_SIZE]>().as_ptr().write_volatile(moved) };
            }
        }
        self.ci = self.ci.wrapping_add(removed);
        removed
    }
}

/// A whole CQE, copied out of the ring (the device no longer writes a handed-over entry).
fn copy_cqe(entry: NonNull<u8>) -> [u8; CQE_SIZE] {
    // SAFETY: a whole entry inside the ring buffer.
    unsafe { entry.cast::<[u8; CQE_SIZE]>().as_ptr().read_volatile() }
}

/// The QPs completing on a CQ, by user index (the context hands out the lowest free one, so
/// the table stays as small as the QPs are many).
#[derive(Default)]
struct QpTable(Vec<Option<Arc<QpShared>>>);

impl QpTable {
    #[inline(always)]
    fn get(&self, uidx: u32) -> Option<&QpShared> {
        self.0.get(uidx as usize)?.as_deref()
    }

    fn insert(&mut self, uidx: u32, qp: Arc<QpShared>) {
        let i = uidx as usize;
        if self.0.len() <= i {
            self.0.resize(i + 1, None);
        }
        self.0[i] = Some(qp);
    }

    fn remove(&mut self, uidx: u32) {
        if let Some(slot) = self.0.get_mut(uidx as usize) {
            *slot = None;
        }
    }
}

/// What the poller and the QPs linking or scrubbing share, under the try-lock.
struct CqState {
    ring: Ring,
    /// The QPs completing on this CQ.
    qps: QpTable,
}

/// A CQ's shared half: the QPs using it hold it too.
pub(super) struct CqShared {
    gate: Gate,
    state: UnsafeCell<CqState>,
    db: Doorbell,
}

// SAFETY: `state` is only reached through a `CqGuard`, which `gate` makes exclusive.
unsafe impl Sync for CqShared {}

/// Exclusive access to a CQ's state: the poller's ([`Poller`]) or another thread's.
struct CqGuard<'a> {
    cq: &'a CqShared,
    poller: bool,
}

/// The one handle that polls a CQ: its gate's poller side is taken through this only.
pub(super) struct Poller(Arc<CqShared>);

impl Poller {
    /// The shared half, for the QPs that complete here.
    pub(super) fn shared(&self) -> &Arc<CqShared> {
        &self.0
    }

    /// The state, if no other thread holds it: never waits.
    #[inline(always)]
    fn try_lock(&mut self) -> Option<CqGuard<'_>> {
        // SAFETY: `&mut self` of the CQ's one `Poller`: no other poller side at once.
        unsafe { self.0.gate.try_enter() }.then_some(CqGuard {
            cq: &self.0,
            poller: true,
        })
    }

    /// The state, waiting for another thread's scrub or link to end.
    fn lock(&mut self) -> CqGuard<'_> {
        // SAFETY: as in `try_lock`.
        unsafe { self.0.gate.enter() };
        CqGuard {
            cq: &self.0,
            poller: true,
        }
    }
}

impl CqShared {
    /// The shared half of a new CQ, in its poller.
    fn create(ring: Ring, db: Doorbell) -> Poller {
        Poller(Arc::new(CqShared {
            gate: Gate::new(),
            state: UnsafeCell::new(CqState {
                ring,
                qps: QpTable::default(),
            }),
            db,
        }))
    }

    /// The state for a QP (link, scrub) or a test, waiting for a poll's batch (or another
    /// QP's scrub) to end. Never from inside the poller's own guard: it would wait for itself.
    fn lock(&self) -> CqGuard<'_> {
        self.gate.lock();
        CqGuard {
            cq: self,
            poller: false,
        }
    }

    /// Makes the QP of user index `uidx` known to polls.
    pub(super) fn link(&self, uidx: u32, qp: Arc<QpShared>) {
        self.lock().state().qps.insert(uidx, qp);
    }

    /// Removes the QP's CQEs, and with `unlink` the QP itself, publishing the new consumer
    /// index. The SRQ WQEs of the receive CQEs removed go back to the QP's SRQ.
    pub(super) fn scrub(&self, uidx: u32, unlink: bool) {
        let mut guard = self.lock();
        let state = guard.state();
        let srq = state.qps.get(uidx).and_then(|qp| qp.srq().cloned());
        if unlink {
            state.qps.remove(uidx);
        }
        if state.ring.scrub(uidx, srq.as_deref()) > 0 {
            self.db.set(SET_CI, state.ring.ci & 0xff_ffff);
        }
    }
}

impl<'a> CqGuard<'a> {
    /// The CQ's doorbell record.
    fn db(&self) -> &'a Doorbell {
        &self.cq.db
    }

    fn state(&mut self) -> &mut CqState {
        // SAFETY: the guard holds the lock, so this is the only reference.
        unsafe { &mut *self.cq.state.get() }
    }
}

impl Drop for CqGuard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        match self.poller {
            true => self.cq.gate.leave(),
            false => self.cq.gate.unlock(),
        }
    }
}

/// Moves up to `out.len()` completions out of the ring; publishes the consumer index once.
/// An empty ring costs one look at one entry, before any of the work of a drain.
#[inline(always)]
fn poll_ring(state: &mut CqState, db: &Doorbell, out: &mut [WorkCompletion]) -> usize {
    match (state.ring.handed_over(state.ring.ci), out) {
        (None, _) | (_, []) => 0,
        (Some((_, op_own)), [slot]) => poll_one(state, db, slot, op_own),
        (Some(_), out) => drain_ring(state, db, out),
    }
}

/// [`poll_ring`] for one completion (a common poll: no run, no loop) once the entry at the
/// consumer index is known handed over, its `op_own` loaded (with Acquire) as `op_own`.
#[inline(never)]
fn poll_one(state: &mut CqState, db: &Doorbell, slot: &mut WorkCompletion, op_own: u8) -> usize {
    let CqState { ring, qps } = state;
    let entry = ring.entry(ring.ci);
    let sop_drop_qpn = be32(entry, 56);
    // Handed over, so `op_own`'s owner bit is this pass's: `fast_opcode` of either.
    let pass = cqe::owner(op_own);
    let fast = fast_opcode(op_own, pass, sop_drop_qpn)
        && qps.get(be32(entry, 32) & 0xff_ffff).is_some_and(|qp| {
            let mut send = qp.send_run();
            let took = take_fast(entry, sop_drop_qpn, &mut send, slot);
            if took {
                send.finish();
            }
            took
        });
    if !fast {
        complete_entry(qps, entry, slot);
    }
    ring.ci = ring.ci.wrapping_add(1);
    db.set(SET_CI, ring.ci & 0xff_ffff);
    1
}

/// [`poll_ring`] once the entry at the consumer index is known handed over.
///
/// A run of CQEs from one QP keeps that QP's send state ([`SendRun`]) across them: the QP is
/// looked up, and its counters loaded and its tail published, once per run. The run at the
/// consumer index (up to the ring's end) is taken here by [`take_run`], the common case: a
/// drain of one QP's sends. Anything after it goes to [`drain_rest`].
#[inline(never)]
fn drain_ring(state: &mut CqState, db: &Doorbell, out: &mut [WorkCompletion]) -> usize {
    let CqState { ring, qps } = state;
    let ci = ring.ci;
    let entry = ring.entry(ci);
    // Handed over (the caller looked), so its user index is the device's.
    let key = raw32(entry, 32) & UIDX_RAW_MASK;
    let mut done = match qps.get(u32::from_be(key)) {
        Some(qp) => {
            let to_end = (ring.ncqe - (ci & (ring.ncqe - 1))) as usize;
            let len = out.len().min(to_end);
            take_run(entry, u8::from(ci & ring.ncqe != 0), &mut out[..len], key, qp)
        }
        None => 0,
    };
    if done < out.len() {
        done = drain_rest(ring, qps, done, out);
    }
    ring.ci = ci.wrapping_add(done as u32);
    db.set(SET_CI, ring.ci & 0xff_ffff);
    done
}

/// [`drain_ring`] after its first run: `done` completions taken from the consumer index on.
/// Finds the QP of each further run for [`run_fast`], moves to the next pass, and hands
/// anything else to the decoder, one CQE at a time.
#[inline(never)]
fn drain_rest(ring: &Ring, qps: &QpTable, mut done: usize, out: &mut [WorkCompletion]) -> usize {
    let mut ci = ring.ci.wrapping_add(done as u32);
    while done < out.len() {
        let entry = ring.entry(ci);
        let pass = u8::from(ci & ring.ncqe != 0);
        let op_own = op_own(entry);
        let mut taken = 0;
        if fast_opcode(op_own, pass, be32(entry, 56)) {
            let key = raw32(entry, 32) & UIDX_RAW_MASK;
            if let Some(qp) = qps.get(u32::from_be(key)) {
                let to_end = (ring.ncqe - (ci & (ring.ncqe - 1))) as usize;
                let rest = &mut out[done..];
                let len = rest.len().min(to_end);
                taken = run_fast(entry, pass, &mut rest[..len], key, qp);
            }
        }
        if taken == 0 {
            if cqe::cqe_opcode(op_own) == cqe::opcode::INVALID || cqe::owner(op_own) != pass {
                break;
            }
            complete_entry(qps, entry, &mut out[done]);
            taken = 1;
        }
        ci = ci.wrapping_add(taken as u32);
        done += taken;
    }
    done
}

/// A handed-over entry's `op_own`, loaded with Acquire: the rest of the entry is read after.
#[inline(always)]
fn op_own(entry: NonNull<u8>) -> u8 {
    // SAFETY: byte 63 of an entry inside the ring's buffer.
    unsafe { &*entry.add(OP_OWN).cast::<AtomicU8>().as_ptr() }.load(Ordering::Acquire)
}

/// Whether [`take_fast`] may take an entry of this `op_own` and `sop_drop_qpn`: handed over
/// on this pass, opcode REQ in the plain format (the solicited bit is free), a send opcode it
/// maps.
#[inline(always)]
fn fast_opcode(op_own: u8, pass: u8, sop_drop_qpn: u32) -> bool {
    op_own & 0xfd == pass && SEND_TABLE.take[(sop_drop_qpn >> 24) as usize] != Take::Decline
}

/// The fast path of the common completion, for an entry [`fast_opcode`] accepts, of the QP of
/// `send`: a successful requester CQE of a request outstanding there, written to `out` as
/// [`complete`] would give it. False, with `out` and `send` untouched, for a request that is
/// not.
#[inline(always)]
fn take_fast(entry: NonNull<u8>, sop_drop_qpn: u32, send: &mut SendRun<'_>, out: &mut WorkCompletion) -> bool {
    let Some(wr_id) = send.complete(wqe_counter(entry)) else {
        return false;
    };
    let op = (sop_drop_qpn >> 24) as usize;
    fill(out, wr_id, op, sop_drop_qpn);
    if op == usize::from(send_opcode::RDMA_READ) {
        out.byte_len = be32(entry, 44);
    }
    true
}

/// Writes the successful completion of request `wr_id` for a CQE of `sop_drop_qpn`, whose
/// opcode `op` (its high byte) [`fast_opcode`] accepts, to `out` (but an RDMA READ's
/// `byte_len`, which is the CQE's byte count).
#[inline(always)]
fn fill(out: &mut WorkCompletion, wr_id: u64, op: usize, sop_drop_qpn: u32) {
    let [by_op, flags] = SEND_TABLE.words[op & 0x1f];
    // The completion as its six 8-byte words (the compiler would store it field by field,
    // zeros included): `wr_id`; `status`, `opcode`; `vendor_err`, `byte_len`; `imm_data`,
    // `qp_num`; `src_qp`, `wc_flags`; the rest.
    // SAFETY: `out` is a whole, 8-aligned 48-byte `WorkCompletion` (`repr(C)`, its layout
    // asserted in wc.rs), and every bit pattern is a valid one.
    let words = unsafe { &mut *std::ptr::from_mut(out).cast::<[u64; 6]>() };
    words[0] = wr_id;
    [words[1], words[2]] = by_op;
    words[3] = pair(0, sop_drop_qpn & 0xff_ffff);
    [words[4], words[5]] = flags;
}

/// [`take_fast`] from `first` on (entries of one pass, `pass`) while each is a CQE of user
/// index `key`, of `qp`; returns how many were taken, the QP's send tail published once.
///
/// The run goes in segments of CQEs equal to the segment's first in `op_own`,
/// `sop_drop_qpn` and the user index word. The first is checked as [`take_fast`] does; the
/// others are compared with it, which makes them pass the same checks and complete with the
/// same words but `wr_id` (and an RDMA READ's byte count), so the compiler loads those once
/// per segment. Runs of one QP's completions of one operation are the common case.
#[inline(always)]
fn take_run(first: NonNull<u8>, pass: u8, out: &mut [WorkCompletion], key: u32, qp: &QpShared) -> usize {
    let mut send = qp.send_run();
    let mut slots = out.iter_mut();
    let Some(mut slot) = slots.next() else {
        return 0;
    };
    let mut entry = first;
    'segments: loop {
        let op_own = op_own(entry);
        let sop_drop_qpn = be32(entry, 56);
        let uidx_word = raw32(entry, 32);
        if !(fast_opcode(op_own, pass, sop_drop_qpn) && uidx_word & UIDX_RAW_MASK == key) {
            break;
        }
        let op = (sop_drop_qpn >> 24) as usize;
        loop {
            let Some(wr_id) = send.complete(wqe_counter(entry)) else {
                break 'segments;
            };
            fill(slot, wr_id, op, sop_drop_qpn);
            if op == usize::from(send_opcode::RDMA_READ) {
                slot.byte_len = be32(entry, 44);
            }
            // SAFETY: at most one past the run's last entry (`out` holds no more than reach
            // the ring's end), inside or one past the buffer.
            entry = unsafe { entry.add(CQE_SIZE) };
            slot = match slots.next() {
                Some(slot) => slot,
                None => break 'segments,
            };
            if !(self::op_own(entry) == op_own
                && raw32(entry, 56) == sop_drop_qpn.to_be()
                && raw32(entry, 32) == uidx_word)
            {
                continue 'segments;
            }
        }
    }
    let taken = (entry.as_ptr() as usize - first.as_ptr() as usize) / CQE_SIZE;
    if taken > 0 {
        send.finish();
    }
    taken
}

/// [`take_run`] for the runs after a drain's first, out of line.
#[inline(never)]
fn run_fast(entry: NonNull<u8>, pass: u8, out: &mut [WorkCompletion], key: u32, qp: &QpShared) -> usize {
    take_run(entry, pass, out, key, qp)
}

/// The completion for a handed-over entry the fast path declined.
#[cold]
#[inline(never)]
fn complete_entry(qps: &QpTable, entry: NonNull<u8>, out: &mut WorkCompletion) {
    *out = complete(qps, &Cqe64::parse(&copy_cqe(entry)));
}

/// A handed-over entry's `wqe_counter`.
#[inline(always)]
fn wqe_counter(entry: NonNull<u8>) -> u16 {
    // SAFETY: bytes 60 and 61 of the entry, 2-aligned.
    u16::from_be(unsafe { entry.add(60).cast::<u16>().as_ptr().read_volatile() })
}

/// Reads the big-endian word at `at` of a handed-over entry.
#[inline(always)]
fn be32(entry: NonNull<u8>, at: usize) -> u32 {
    u32::from_be(raw32(entry, at))
}

/// Reads the word at `at` of a handed-over entry as it lies in memory.
#[inline(always)]
fn raw32(entry: NonNull<u8>, at: usize) -> u32 {
    // SAFETY: `at` is one of the 4-aligned offsets below 64 this file passes, inside the entry.
    unsafe { entry.add(at).cast::<u32>().as_ptr().read_volatile() }
}

/// How the fast path takes a send opcode (the high byte of `sop_drop_qpn`).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Take {
    /// With its words in [`SendTable::words`].
    Words,
    /// An RDMA READ: its words, but `byte_len` is the CQE's byte count ([`take_fast`] tests
    /// the opcode itself).
    ByteCount,
    /// Not at all: never posted, [`cqe::decode`] reports it.
    Decline,
}

/// The fast path's send opcodes, as [`cqe::decode`] maps them.
struct SendTable {
    take: [Take; 256],
    /// For the opcodes taken (all below 32), the words of a successful completion (as
    /// [`take_fast`] stores them) that depend on the opcode only: `status` and `opcode`,
    /// `vendor_err` and `byte_len`; then `src_qp` and `wc_flags`, and the last 8 bytes.
    words: [[[u64; 2]; 2]; 32],
}

static SEND_TABLE: SendTable = {
    let mut t = SendTable {
        take: [Take::Decline; 256],
        words: [[[0; 2]; 2]; 32],
    };
    let none = WcFlags::empty();
    let ops = [
        (send_opcode::SEND, WcOpcode::SEND, none, 0),
        (send_opcode::SEND_INVAL, WcOpcode::SEND, none, 0),
        (send_opcode::SEND_IMM, WcOpcode::SEND, WcFlags::WITH_IMM, 0),
        (send_opcode::RDMA_WRITE, WcOpcode::RDMA_WRITE, none, 0),
        (send_opcode::RDMA_WRITE_IMM, WcOpcode::RDMA_WRITE, WcFlags::WITH_IMM, 0),
        (send_opcode::RDMA_READ, WcOpcode::RDMA_READ, none, 0),
        (send_opcode::ATOMIC_CS, WcOpcode::COMP_SWAP, none, 8),
        (send_opcode::ATOMIC_FA, WcOpcode::FETCH_ADD, none, 8),
    ];
    let mut k = 0;
    while k < ops.len() {
        let (op, wc_op, flags, byte_len) = ops[k];
        t.take[op as usize] = if op == send_opcode::RDMA_READ {
            Take::ByteCount
        } else {
            Take::Words
        };
        t.words[op as usize] = [
            [pair(WcStatus::SUCCESS.0, wc_op.0), pair(0, byte_len)],
            [pair(0, flags.bits()), 0],
        ];
        k += 1;
    }
    t
};

/// The mask of the user index in the CQE word at 32, as it lies in memory (the SRQ number's
/// byte masked off).
const UIDX_RAW_MASK: u32 = u32::from_be(0x00ff_ffff);

/// Two adjacent 4-byte fields as one 8-byte word, `first` at the lower address.
#[inline(always)]
const fn pair(first: u32, second: u32) -> u64 {
    let (a, b) = (first.to_ne_bytes(), second.to_ne_bytes());
    u64::from_ne_bytes([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]])
}

/// The completion for one CQE: decoded, its `wr_id` from the QP's tables.
#[inline(never)]
fn complete(qps: &QpTable, cqe: &Cqe64) -> WorkCompletion {
    let found = cqe::decode(cqe).and_then(
        |Decoded {
             user_index,
             queue,
             mut wc,
         }| {
            let qp = qps.get(user_index).ok_or(BadCqe::UnknownUserIndex)?;
            wc.wr_id = match queue {
                WorkQueue::Send { wqe_counter } => qp.complete_send(wqe_counter)?,
                WorkQueue::Recv => qp.complete_recv(cqe.wqe_counter)?,
            };
            Ok(wc)
        },
    );
    found.unwrap_or_else(|why| cqe::bad_cqe_completion(cqe, why))
}

/// The poller's half of a CQ.
pub(super) struct Mlx5Cq {
    poller: Poller,
    ctx: Arc<Ctx>,
    cqn: u32,
    /// Completions translated for `ready_run`, `pending` of them not yet consumed.
    scratch: Box<[WorkCompletion]>,
    pending: std::ops::Range<usize>,
}

impl Mlx5Cq {
    /// The shared half, for the QPs that complete here.
    pub(super) fn shared(&self) -> &Arc<CqShared> {
        self.poller.shared()
    }

    /// `poll` with completions left in `scratch` by `ready_run`: those first.
    #[inline(never)]
    fn poll_pending(&mut self, wc: &mut [WorkCompletion]) -> usize {
        let queued = self.pending.len().min(wc.len());
        wc[..queued].copy_from_slice(&self.scratch[self.pending.start..self.pending.start + queued]);
        self.pending.start += queued;
        if queued == wc.len() {
            return queued;
        }
        let Some(mut guard) = self.poller.try_lock() else {
            return queued;
        };
        let db = guard.db();
        queued + poll_ring(guard.state(), db, &mut wc[queued..])
    }
}

// SAFETY: `ready_run` describes completions in `scratch`, which only `&mut self` methods
// change; CREATE_CQ's driver bytes name the ring and doorbell record this CQ owns until it
// is dropped, after the kernel destroy.
unsafe impl CqRing for Mlx5Cq {
    #[inline]
    fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
        if !self.pending.is_empty() {
            return self.poll_pending(wc);
        }
        match self.poller.try_lock() {
            Some(mut guard) => {
                let db = guard.db();
                poll_ring(guard.state(), db, wc)
            }
            None => 0,
        }
    }

    fn ready_run(&mut self) -> ReadyRun {
        if self.pending.is_empty() {
            let n = match self.poller.try_lock() {
                Some(mut guard) => {
                    let db = guard.db();
                    poll_ring(guard.state(), db, &mut self.scratch)
                }
                None => 0,
            };
            self.pending = 0..n;
        }
        let len = self.pending.len();
        if len == 0 {
            return ReadyRun::empty();
        }
        let first = NonNull::from(&mut self.scratch[self.pending.start]);
        ReadyRun {
            first,
            before_wrap: len,
            wrapped: first,
            len,
            stride: size_of::<WorkCompletion>(),
        }
    }

    fn consume(&mut self, n: usize) {
        self.pending.start += n.min(self.pending.len());
    }

    /// A new ring for the device, the queued completions copied over once the kernel has
    /// switched the CQ to it (polls find the CQ taken meanwhile and return nothing).
    fn resize(&mut self, cqe: u32, kernel: ResizeCqCall<'_>) -> Result<u32> {
        let ncqe = ring_size("RESIZE_CQ", cqe)?;
        let mut guard = self.poller.lock();
        let db = guard.db();
        let state = guard.state();
        let queued = state.ring.queued() + self.pending.len() as u32;
        if ncqe - 1 < queued {
            return Err(Error::invalid(
                "RESIZE_CQ",
                format!("{cqe} entries cannot hold the {queued} completions queued"),
            ));
        }
        if ncqe == state.ring.ncqe {
            // The kernel changes nothing for the same size (hw/mlx5/cq.c mlx5_ib_resize_cq).
            return Ok(ncqe - 1);
        }
        state.ring.room_for_resize_cqe()?;
        let new = Ring::new(ncqe, "RESIZE_CQ")?;
        let req = abi::ResizeCq {
            buf_addr: new.buf.addr(),
            cqe_size: CQE_SIZE as u16,
            ..Default::default()
        };
        let granted = kernel(ncqe - 1, req.as_bytes(), &mut [])?;
        let old = std::mem::replace(&mut state.ring, new);
        let moved = state.ring.take_from(&old);
        db.set(SET_CI, state.ring.ci & 0xff_ffff);
        moved.map(|()| granted)
    }

    /// Arms in user space: the doorbell record, then the UAR's CQ doorbell.
    fn arm(&mut self, solicited_only: bool, events: u32, _kernel: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let mut guard = self.poller.lock();
        let word = arm_word(solicited_only, events, guard.state().ring.ci & 0xff_ffff);
        guard.db().set(ARM_DB, word);
        drop(guard);
        // The record must be in memory before the device reads it on the doorbell.
        mmio_fence();
        self.ctx.cq_uar().write64(
            UAR_CQ_DOORBELL,
            (u64::from(word) << 32 | u64::from(self.cqn)).to_be_bytes(),
        );
        mmio_fence();
        Ok(())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The arm doorbell word: sequence number (`events & 3`), command, consumer index.
fn arm_word(solicited_only: bool, events: u32, ci: u32) -> u32 {
    let cmd = if solicited_only { ARM_SOLICITED } else { 0 };
    (events & 3) << 28 | cmd | (ci & 0xff_ffff)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::providers::mlx5::mem::DbPages;
    use crate::wc::WcStatus;

    /// A CQ's shared half on heap memory, no kernel.
    pub(crate) fn shared(ncqe: u32) -> Arc<CqShared> {
        let db = Arc::new(DbPages::new(4096)).alloc("test").unwrap();
        CqShared::create(Ring::new(ncqe, "test").unwrap(), db).0
    }

    /// Plays the device: writes a CQE at producer index `pi`, `op_own` last.
    pub(crate) fn produce(cq: &CqShared, pi: u32, bytes: [u8; CQE_SIZE]) {
        produce_in(&cq.lock().state().ring, pi, bytes);
    }

    fn produce_in(ring: &Ring, pi: u32, mut bytes: [u8; CQE_SIZE]) {
        let op_own = bytes[OP_OWN] & !1 | u8::from(pi & ring.ncqe != 0);
        bytes[OP_OWN] = INVALID_OP_OWN;
        // SAFETY: a whole entry of the test ring, not handed over yet.
        unsafe { ring.entry(pi).cast::<[u8; CQE_SIZE]>().as_ptr().write(bytes) };
        ring.op_own(pi).store(op_own, Ordering::Release);
    }

    /// A responder CQE for user index `uidx`.
    pub(crate) fn recv_cqe(uidx: u32, qpn: u32) -> [u8; CQE_SIZE] {
        let mut b = [0u8; CQE_SIZE];
        b[32..36].copy_from_slice(&uidx.to_be_bytes());
        b[56..60].copy_from_slice(&qpn.to_be_bytes());
        b[OP_OWN] = cqe::opcode::RESP_SEND << 4;
        b
    }

    pub(crate) fn poll(cq: &CqShared, out: &mut [WorkCompletion]) -> usize {
        poll_ring(cq.lock().state(), &cq.db, out)
    }

    #[test]
    fn owner_parity_gates_entries_across_passes() {
        let cq = shared(4);
        let mut out = [WorkCompletion::default(); 8];
        assert_eq!(poll(&cq, &mut out), 0, "a fresh ring is all invalid");
        for pi in 0..10u32 {
            produce(&cq, pi, recv_cqe(9, 0x40 + pi));
            assert_eq!(poll(&cq, &mut out), 1, "entry {pi}");
            // No QP: a typed error completion, not a read of anything.
            assert_eq!((out[0].status, out[0].qp_num), (WcStatus::GENERAL_ERR, 0x40 + pi));
            assert_eq!(out[0].vendor_err, BadCqe::UnknownUserIndex.vendor_err());
            assert_eq!(cq.db.get(SET_CI), pi + 1);
            // The entry of the last pass is stale now: its owner bit is the old pass's.
            assert_eq!(poll(&cq, &mut out), 0);
        }
    }

    #[test]
    fn scrub_removes_one_qps_cqes_and_keeps_the_order_of_the_rest() {
        let cq = shared(8);
        let uidx = [1, 2, 1, 3, 1, 2];
        // Start mid-ring, so the handed-over entries wrap.
        let mut out = [WorkCompletion::default(); 8];
        for pi in 0..6 {
            produce(&cq, pi, recv_cqe(7, 0));
        }
        assert_eq!(poll(&cq, &mut out), 6);
        for (i, &u) in uidx.iter().enumerate() {
            produce(&cq, 6 + i as u32, recv_cqe(u, 100 + i as u32));
        }
        cq.scrub(1, true);
        assert_eq!(cq.db.get(SET_CI), 9);
        let n = poll(&cq, &mut out);
        let qpns: Vec<u32> = out[..n].iter().map(|w| w.qp_num).collect();
        assert_eq!(qpns, [101, 103, 105]);
        // The ring goes on with the right owner bits.
        produce(&cq, 12, recv_cqe(2, 112));
        assert_eq!(poll(&cq, &mut out), 1);
        assert_eq!(out[0].qp_num, 112);
    }

    /// After RESIZE_CQ the queued CQEs move to the new ring one index later, with its owner
    /// bits; the device's next CQE (after the RESIZE CQE's index) follows them.
    #[test]
    fn resize_moves_the_cqes_before_the_resize_cqe() {
        for (old_n, new_n, start) in [(4, 16, 2), (8, 4, 13), (4, 8, 6)] {
            let mut old = Ring::new(old_n, "test").unwrap();
            old.ci = start;
            for k in 0..3 {
                produce_in(&old, start + k, recv_cqe(7, 0x100 + k));
            }
            let mut resize = [0u8; CQE_SIZE];
            resize[OP_OWN] = cqe::opcode::RESIZE_CQ << 4;
            produce_in(&old, start + 3, resize);
            let mut new = Ring::new(new_n, "test").unwrap();
            new.take_from(&old).unwrap();
            assert_eq!(new.ci, start + 1, "{old_n} -> {new_n}");
            produce_in(&new, start + 4, recv_cqe(7, 0x200));
            let qpns: Vec<u32> = (0..4)
                .map(|k| Cqe64::parse(&new.ready(start + 1 + k).unwrap()).qpn())
                .collect();
            assert_eq!(qpns, [0x100, 0x101, 0x102, 0x200]);
            assert!(new.ready(start + 5).is_none());
        }
    }

    /// A full ring leaves the device no slot for its RESIZE CQE: the resize is refused
    /// before the kernel is asked; one free slot is enough.
    #[test]
    fn resize_of_a_full_ring_is_refused() {
        for (n, start) in [(2, 0), (4, 5), (8, 13)] {
            let mut ring = Ring::new(n, "test").unwrap();
            ring.ci = start;
            for k in 0..n - 1 {
                produce_in(&ring, start.wrapping_add(k), recv_cqe(7, k));
            }
            ring.room_for_resize_cqe().unwrap();
            produce_in(&ring, start.wrapping_add(n - 1), recv_cqe(7, n));
            let e = ring.room_for_resize_cqe().unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { verb: "RESIZE_CQ", .. }), "{e:?}");
        }
    }

    /// A device that writes no RESIZE CQE is a typed error, never a read past one pass.
    #[test]
    fn resize_without_a_resize_cqe_is_an_error() {
        let old = Ring::new(4, "test").unwrap();
        let mut new = Ring::new(8, "test").unwrap();
        assert!(matches!(new.take_from(&old), Err(Error::Malformed { .. })));
        for pi in 0..4 {
            produce_in(&old, pi, recv_cqe(7, pi));
        }
        assert!(matches!(new.take_from(&old), Err(Error::Malformed { .. })));
    }

    /// A CQ state whose QPs (user indices 1 to 3) have `posted` sends outstanding, request
    /// `r` in basic block `r` with `wr_id` 500 + r.
    fn state_with_sends(ncqe: u32, posted: u32) -> Arc<CqShared> {
        let cq = shared(ncqe);
        for uidx in 1..=3 {
            let qp: QpShared = QpShared::new(64, 4, None);
            for r in 0..posted {
                qp.record_send(r, 1, r, 500 + u64::from(r));
            }
            qp.publish_sends(posted);
            cq.link(uidx, Arc::new(qp));
        }
        cq
    }

    /// A CQE as the fuzz of this test makes them: mostly successful requester CQEs naming the
    /// next outstanding request (or one later) of a QP, of every send opcode, with random
    /// bytes elsewhere; sometimes a stale or unknown one, a responder CQE, or random bytes.
    /// Most of them repeat `prev`'s `op_own`, `sop_drop_qpn` and user index word (the words a
    /// drain's segment compares whole), or some of them, with a request of their own.
    fn random_cqe(rng: &mut crate::testing::Rng, next: &mut [u32; 4], prev: &[u8; CQE_SIZE]) -> [u8; CQE_SIZE] {
        let mut cqe = [0u8; CQE_SIZE];
        cqe.iter_mut().for_each(|x| *x = rng.next_u64() as u8);
        if rng.chance(10) {
            // Anything but the opcode of an entry not written.
            cqe[OP_OWN] &= 0xef;
            return cqe;
        }
        cqe[OP_OWN] &= if rng.chance(90) { 0x03 } else { 0x2f };
        let ops = [0x01, 0x08, 0x09, 0x0a, 0x0b, 0x10, 0x11, 0x12, 0x00, 0x13, 0x20];
        let kinds = if rng.chance(90) { 8 } else { ops.len() as u64 };
        cqe[56] = ops[rng.below(kinds) as usize];
        let uidx = if rng.chance(95) { 1 + rng.below(3) as u32 } else { 9 };
        let srqn_byte = if rng.chance(50) { 0 } else { rng.next_u64() as u32 };
        cqe[32..36].copy_from_slice(&(uidx | srqn_byte << 24).to_be_bytes());
        if rng.chance(60) {
            for words in [32..36, 56..60, OP_OWN..OP_OWN + 1] {
                if rng.chance(85) {
                    cqe[words.clone()].copy_from_slice(&prev[words]);
                }
            }
        }
        let uidx = u32::from_be_bytes([0, cqe[33], cqe[34], cqe[35]]);
        let at = &mut next[uidx.min(3) as usize];
        let request = if rng.chance(95) {
            *at + rng.below(2) as u32
        } else {
            rng.below(64) as u32
        };
        *at = (*at).max(request + 1);
        cqe[60..62].copy_from_slice(&(request as u16).to_be_bytes());
        cqe
    }

    /// Draining with the fast paths (one at a time, and runs of one QP's CQEs in batches that
    /// cross the ring's end) gives, CQE for CQE, what the decoder gives against QPs in the
    /// same state, and leaves the QPs' tails where the decoder leaves them.
    #[test]
    fn drains_equal_the_decoder() {
        let mut rng = crate::testing::Rng::new(0x0f45_7a7e);
        let (mut fast, mut total) = (0, 0);
        // Under miri (seconds a round) 4 rounds, where both kinds of completion occur.
        let (rounds, fast_floor, slow_floor) = if cfg!(miri) { (4, 0, 0) } else { (300, 2000, 500) };
        for _ in 0..rounds {
            let (a, b) = (state_with_sends(8, 40), state_with_sends(8, 40));
            let (mut pi, mut polled) = (0u32, 0u32);
            // Different passes over the ring.
            for _ in 0..rng.below(20) {
                produce(&a, pi, recv_cqe(9, 0));
                pi += 1;
                let mut out = [WorkCompletion::default(); 1];
                assert_eq!(poll(&a, &mut out), 1);
                polled += 1;
            }
            let mut next = [0u32; 4];
            let mut want = Vec::new();
            let mut got = Vec::new();
            let mut prev = [0u8; CQE_SIZE];
            for _ in 0..rng.below(60) {
                let cqe = random_cqe(&mut rng, &mut next, &prev);
                prev = cqe;
                produce(&a, pi, cqe);
                pi += 1;
                want.push(complete(&b.lock().state().qps, &Cqe64::parse(&cqe)));
                // A full ring is polled until it has room; otherwise now and then.
                while pi - polled == 8 || rng.chance(30) {
                    let mut out = [WorkCompletion::default(); 8];
                    let n = poll(&a, &mut out[..1 + rng.below(8) as usize]);
                    got.extend_from_slice(&out[..n]);
                    polled += n as u32;
                }
            }
            loop {
                let mut out = [WorkCompletion::default(); 8];
                let n = poll(&a, &mut out[..1 + rng.below(8) as usize]);
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&out[..n]);
            }
            assert_eq!(got, want);
            total += got.len();
            fast += got.iter().filter(|w| w.is_success()).count();
            let (mut ga, mut gb) = (a.lock(), b.lock());
            let (qa, qb) = (&ga.state().qps, &gb.state().qps);
            for uidx in 1..=3 {
                for counter in 0..64 {
                    assert_eq!(
                        qa.get(uidx).unwrap().complete_send(counter).is_ok(),
                        qb.get(uidx).unwrap().complete_send(counter).is_ok()
                    );
                }
            }
        }
        assert!(
            fast > fast_floor && total - fast > slow_floor,
            "{fast} of {total} successful"
        );
    }

    /// A run ends at the first entry of the last pass, even one equal to the run's CQEs but
    /// for its owner bit and naming a table entry that holds an outstanding request now.
    #[test]
    fn runs_end_at_entries_of_the_last_pass() {
        let cq = shared(8);
        let qp = Arc::new(QpShared::new(8, 1, None));
        cq.link(1, qp.clone());
        let cqe = |request: u32| {
            let mut b = [0u8; CQE_SIZE];
            b[32..36].copy_from_slice(&1u32.to_be_bytes());
            b[56..60].copy_from_slice(&(u32::from(send_opcode::RDMA_WRITE) << 24 | 0x40).to_be_bytes());
            b[60..62].copy_from_slice(&(request as u16).to_be_bytes());
            b
        };
        let mut out = [WorkCompletion::default(); 8];
        for (requests, ready) in [(0..8, 8), (8..14, 3)] {
            for r in requests.clone() {
                qp.record_send(r, 1, r, 500 + u64::from(r));
            }
            qp.publish_sends(requests.end);
            for r in requests.start..requests.start + ready {
                produce(&cq, r, cqe(r));
            }
            assert_eq!(poll(&cq, &mut out), ready as usize);
            let wr_ids: Vec<u64> = out[..ready as usize].iter().map(|w| w.wr_id).collect();
            assert_eq!(
                wr_ids,
                (requests.start..requests.start + ready)
                    .map(|r| 500 + u64::from(r))
                    .collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn arm_word_carries_sequence_command_and_index() {
        assert_eq!(arm_word(false, 5, 0x0123_4567), 1 << 28 | 0x23_4567);
        assert_eq!(arm_word(true, 3, 7), 3 << 28 | 1 << 24 | 7);
    }
}
