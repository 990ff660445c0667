//! mlx5 completion queues: a user-allocated ring of 64-byte CQEs the device hands over by
//! flipping each entry's owner bit, a doorbell record for the consumer index and arming, and
//! the CQ doorbell in UAR page 0.
//!
//! The ring and the table of the QPs completing on it live in [`CqShared`] behind a try-lock:
//! the poller takes it without waiting (a poll that finds it taken returns nothing), and a QP
//! scrubbing its CQEs on RESET or destroy, or linking itself at create, waits for the
//! poller's batch to end. So a QP's state is never freed while a poll reads it, whatever CQE
//! the device writes.

use super::cqe::{self, BadCqe, Cqe64, Decoded, WorkQueue, CQE_SIZE, INVALID_OP_OWN, OP_OWN};
use super::mem::{Buffer, Doorbell};
use super::qp::QpShared;
use super::srq::SrqShared;
use super::wqe::opcode as send_opcode;
use super::{abi, Ctx};
use crate::error::{Error, Result};
use crate::provider::{CqRing, CreateCqCall, ReadyRun, ResizeCqCall};
use crate::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use zerocopy::IntoBytes;

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
    let shared = Arc::new(CqShared {
        locked: AtomicBool::new(false),
        state: UnsafeCell::new(CqState {
            ring,
            qps: QpTable::default(),
        }),
        db,
    });
    Ok(Box::new(Mlx5Cq {
        shared,
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
    locked: AtomicBool,
    state: UnsafeCell<CqState>,
    db: Doorbell,
}

// SAFETY: `state` is only reached through a `CqGuard`, which `locked` makes exclusive.
unsafe impl Sync for CqShared {}

/// Exclusive access to a CQ's state.
struct CqGuard<'a> {
    cq: &'a CqShared,
}

impl CqShared {
    /// The state, if no one else holds it: never waits.
    fn try_lock(&self) -> Option<CqGuard<'_>> {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then_some(CqGuard { cq: self })
    }

    /// The state, waiting for a poll's batch (or another QP's scrub) to end.
    fn lock(&self) -> CqGuard<'_> {
        loop {
            if let Some(guard) = self.try_lock() {
                return guard;
            }
            std::thread::yield_now();
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

impl CqGuard<'_> {
    fn state(&mut self) -> &mut CqState {
        // SAFETY: the guard holds the lock, so this is the only reference.
        unsafe { &mut *self.cq.state.get() }
    }
}

impl Drop for CqGuard<'_> {
    fn drop(&mut self) {
        self.cq.locked.store(false, Ordering::Release);
    }
}

/// Moves up to `out.len()` completions out of the ring; publishes the consumer index once.
/// An empty ring costs one look at one entry, before any of the work of a drain.
#[inline(always)]
fn poll_ring(state: &mut CqState, db: &Doorbell, out: &mut [WorkCompletion]) -> usize {
    match state.ring.handed_over(state.ring.ci) {
        Some(first) if !out.is_empty() => drain_ring(state, db, out, first),
        _ => 0,
    }
}

/// [`poll_ring`] once the entry at the consumer index, `first`, is known handed over.
#[inline(never)]
fn drain_ring(state: &mut CqState, db: &Doorbell, out: &mut [WorkCompletion], first: (NonNull<u8>, u8)) -> usize {
    let ring = &state.ring;
    let mut ci = ring.ci;
    let (mut entry, mut op_own) = first;
    let mut n = 0;
    for slot in out.iter_mut() {
        if n > 0 {
            match ring.handed_over(ci) {
                Some(next) => (entry, op_own) = next,
                None => break,
            }
        }
        if !requester_success(&state.qps, entry, op_own, slot) {
            complete_entry(&state.qps, entry, slot);
        }
        ci = ci.wrapping_add(1);
        n += 1;
    }
    state.ring.ci = ci;
    db.set(SET_CI, ci & 0xff_ffff);
    n
}

/// The completion for a handed-over entry the fast path declined.
#[cold]
#[inline(never)]
fn complete_entry(qps: &QpTable, entry: NonNull<u8>, out: &mut WorkCompletion) {
    *out = complete(qps, &Cqe64::parse(&copy_cqe(entry)));
}

/// Reads the big-endian word at `at` of a handed-over entry.
#[inline(always)]
fn be32(entry: NonNull<u8>, at: usize) -> u32 {
    // SAFETY: `at` is one of the 4-aligned offsets below 64 this file passes, inside the entry.
    u32::from_be(unsafe { entry.add(at).cast::<u32>().as_ptr().read_volatile() })
}

/// The fast path of the common completion: a successful requester CQE (plain format) of a
/// request the QP has outstanding, written to `out` as [`complete`] would give it. False,
/// with `out` untouched, for anything else, which [`complete`] then decodes, errors included.
#[inline(always)]
fn requester_success(qps: &QpTable, entry: NonNull<u8>, op_own: u8, out: &mut WorkCompletion) -> bool {
    // Opcode REQ and format 0: the solicited and owner bits are free.
    if op_own & 0xfc != 0 {
        return false;
    }
    let sop_drop_qpn = be32(entry, 56);
    let (opcode, wc_flags, byte_len) = match (sop_drop_qpn >> 24) as u8 {
        send_opcode::SEND | send_opcode::SEND_INVAL => (WcOpcode::SEND, WcFlags::empty(), 0),
        send_opcode::SEND_IMM => (WcOpcode::SEND, WcFlags::WITH_IMM, 0),
        send_opcode::RDMA_WRITE => (WcOpcode::RDMA_WRITE, WcFlags::empty(), 0),
        send_opcode::RDMA_WRITE_IMM => (WcOpcode::RDMA_WRITE, WcFlags::WITH_IMM, 0),
        send_opcode::RDMA_READ => (WcOpcode::RDMA_READ, WcFlags::empty(), be32(entry, 44)),
        send_opcode::ATOMIC_CS => (WcOpcode::COMP_SWAP, WcFlags::empty(), 8),
        send_opcode::ATOMIC_FA => (WcOpcode::FETCH_ADD, WcFlags::empty(), 8),
        _ => return false,
    };
    let Some(qp) = qps.get(be32(entry, 32) & 0xff_ffff) else {
        return false;
    };
    // `wqe_counter`, the high half of the word at 60.
    let Ok(wr_id) = qp.complete_send((be32(entry, 60) >> 16) as u16) else {
        return false;
    };
    store_completion(
        out,
        [
            wr_id,
            pair(WcStatus::SUCCESS.0, opcode.0),
            pair(0, byte_len),
            pair(0, sop_drop_qpn & 0xff_ffff),
            pair(0, wc_flags.bits()),
            0,
        ],
    );
    true
}

/// Two adjacent 4-byte fields as one 8-byte word, `first` at the lower address.
#[inline(always)]
fn pair(first: u32, second: u32) -> u64 {
    let (a, b) = (first.to_ne_bytes(), second.to_ne_bytes());
    u64::from_ne_bytes([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]])
}

/// Stores a completion as its six 8-byte words (the compiler stores a struct field by field,
/// zeros included): `wr_id`; `status`, `opcode`; `vendor_err`, `byte_len`; `imm_data`,
/// `qp_num`; `src_qp`, `wc_flags`; the rest.
#[inline(always)]
fn store_completion(out: &mut WorkCompletion, words: [u64; 6]) {
    // SAFETY: `out` is a whole, 8-aligned 48-byte `WorkCompletion` (`repr(C)`, its layout
    // asserted in wc.rs), and every bit pattern is a valid one.
    unsafe { std::ptr::from_mut(out).cast::<[u64; 6]>().write(words) };
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
    shared: Arc<CqShared>,
    ctx: Arc<Ctx>,
    cqn: u32,
    /// Completions translated for `ready_run`, `pending` of them not yet consumed.
    scratch: Box<[WorkCompletion]>,
    pending: std::ops::Range<usize>,
}

impl Mlx5Cq {
    /// The shared half, for the QPs that complete here.
    pub(super) fn shared(&self) -> &Arc<CqShared> {
        &self.shared
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
        let Some(mut guard) = self.shared.try_lock() else {
            return queued;
        };
        queued + poll_ring(guard.state(), &self.shared.db, &mut wc[queued..])
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
        match self.shared.try_lock() {
            Some(mut guard) => poll_ring(guard.state(), &self.shared.db, wc),
            None => 0,
        }
    }

    fn ready_run(&mut self) -> ReadyRun {
        if self.pending.is_empty() {
            let n = match self.shared.try_lock() {
                Some(mut guard) => poll_ring(guard.state(), &self.shared.db, &mut self.scratch),
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
        let mut guard = self.shared.lock();
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
        let new = Ring::new(ncqe, "RESIZE_CQ")?;
        let req = abi::ResizeCq {
            buf_addr: new.buf.addr(),
            cqe_size: CQE_SIZE as u16,
            ..Default::default()
        };
        let granted = kernel(ncqe - 1, req.as_bytes(), &mut [])?;
        let old = std::mem::replace(&mut state.ring, new);
        let moved = state.ring.take_from(&old);
        self.shared.db.set(SET_CI, state.ring.ci & 0xff_ffff);
        moved.map(|()| granted)
    }

    /// Arms in user space: the doorbell record, then the UAR's CQ doorbell.
    fn arm(&mut self, solicited_only: bool, events: u32, _kernel: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let ci = self.shared.lock().state().ring.ci & 0xff_ffff;
        let word = arm_word(solicited_only, events, ci);
        self.shared.db.set(ARM_DB, word);
        // The record must be in memory before the device reads it on the doorbell.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.ctx.cq_uar().write64(
            UAR_CQ_DOORBELL,
            (u64::from(word) << 32 | u64::from(self.cqn)).to_be_bytes(),
        );
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
        Arc::new(CqShared {
            locked: AtomicBool::new(false),
            state: UnsafeCell::new(CqState {
                ring: Ring::new(ncqe, "test").unwrap(),
                qps: QpTable::default(),
            }),
            db: Arc::new(DbPages::new(4096)).alloc("test").unwrap(),
        })
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

    /// The fast path gives what the decoder gives, for random requester CQEs against QPs in
    /// the same state, or declines them.
    #[test]
    fn requester_fast_path_equals_the_decoder() {
        let mut rng = crate::testing::Rng::new(0x0f45_7a7e);
        let (mut fast, mut declined) = (0, 0);
        for _ in 0..20_000 {
            let posted = rng.below(9) as u32;
            let [a, b] = [(); 2].map(|_| {
                let qp: QpShared = QpShared::new(8, 4, None);
                for r in 0..posted {
                    qp.record_send(r, 1, r, 500 + u64::from(r));
                }
                qp.publish_sends(posted);
                let mut t = QpTable::default();
                t.insert(3, Arc::new(qp));
                t
            });
            let mut cqe = [0u8; CQE_SIZE];
            cqe.iter_mut().for_each(|x| *x = rng.next_u64() as u8);
            if rng.chance(80) {
                cqe[OP_OWN] &= 0x03;
            }
            if rng.chance(80) {
                cqe[56] = [0x01, 0x08, 0x09, 0x0a, 0x0b, 0x10, 0x11, 0x12][rng.below(8) as usize];
            }
            if rng.chance(80) {
                cqe[32..36].copy_from_slice(&(3 | (rng.next_u64() as u32) << 24).to_be_bytes());
            }
            if rng.chance(80) {
                cqe[60..62].copy_from_slice(&(rng.below(10) as u16).to_be_bytes());
            }
            let op_own = cqe[OP_OWN];
            let mut wc = WorkCompletion::default();
            if requester_success(&a, NonNull::from(&mut cqe).cast(), op_own, &mut wc) {
                fast += 1;
                assert_eq!(wc, complete(&b, &Cqe64::parse(&cqe)), "{cqe:02x?}");
            } else {
                declined += 1;
            }
        }
        assert!(fast > 1000 && declined > 1000, "{fast} fast, {declined} declined");
    }

    #[test]
    fn arm_word_carries_sequence_command_and_index() {
        assert_eq!(arm_word(false, 5, 0x0123_4567), 1 << 28 | 0x23_4567);
        assert_eq!(arm_word(true, 3, 7), 3 << 28 | 1 << 24 | 7);
    }
}
