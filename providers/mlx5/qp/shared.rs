//! What a QP's poster and its CQs' poller share: the request counters and the work-request id
//! tables.
//!
//! The poster fills a table entry, then publishes its head with Release; the poller reads an
//! entry only for a request below the head it loaded with Acquire and at or above its own tail,
//! and publishes the tail it advances with Release, which the poster loads with Acquire before
//! it reuses an entry. Each side's counters sit on their own cache line.
//!
//! The counters and entries are reached through [`Cells`], so the same code runs on atomics
//! here and on loom's model cells in `model.rs` (`cargo xtask loom`), where an entry read
//! while the poster may be writing it is a race loom reports.

use super::super::cqe::BadCqe;
use super::super::srq::SrqShared;
use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Added to a request number: one that is not outstanding for the next 2^31 requests, while
/// at most 2^16 are outstanding (one per basic block at most) and every block's entry is
/// rewritten on each pass over the ring.
const NO_REQUEST: u32 = 1 << 31;

/// A 32-bit counter one side publishes and the other reads.
pub(in crate::providers::mlx5) trait Word {
    fn new(value: u32) -> Self;
    fn load(&self, order: Ordering) -> u32;
    fn store(&self, value: u32, order: Ordering);
}

/// A table entry: written by the poster before it publishes, read by the poller after, never
/// both at once (the counters' protocol).
pub(in crate::providers::mlx5) trait Entry<T> {
    fn new() -> Self;
    fn get(&self) -> T;
    fn set(&self, value: T);
}

/// The cell types a [`QpShared`] is made of.
pub(in crate::providers::mlx5) trait Cells {
    type Counter: Word;
    type WrId: Entry<u64>;
    type Request: Entry<u32>;
}

/// The library's cells: atomics, the entries Relaxed (the counters order them).
pub(in crate::providers::mlx5) struct Atomics;

impl Cells for Atomics {
    type Counter = AtomicU32;
    type WrId = AtomicU64;
    type Request = AtomicU32;
}

impl Word for AtomicU32 {
    fn new(value: u32) -> Self {
        AtomicU32::new(value)
    }

    fn load(&self, order: Ordering) -> u32 {
        AtomicU32::load(self, order)
    }

    fn store(&self, value: u32, order: Ordering) {
        AtomicU32::store(self, value, order)
    }
}

impl Entry<u64> for AtomicU64 {
    fn new() -> Self {
        AtomicU64::new(0)
    }

    fn get(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }

    fn set(&self, value: u64) {
        self.store(value, Ordering::Relaxed)
    }
}

impl Entry<u32> for AtomicU32 {
    fn new() -> Self {
        AtomicU32::new(0)
    }

    fn get(&self) -> u32 {
        self.load(Ordering::Relaxed)
    }

    fn set(&self, value: u32) {
        self.store(value, Ordering::Relaxed)
    }
}

/// A pair of counters of one side, free-running.
struct Counters<W> {
    /// Send requests posted (poster) or completed (poller).
    sq: W,
    /// Receive requests posted (poster) or completed (poller).
    rq: W,
}

impl<W: Word> Counters<W> {
    fn new() -> Self {
        Self {
            sq: W::new(0),
            rq: W::new(0),
        }
    }
}

/// What a QP's poster and its CQs' poller share.
pub(in crate::providers::mlx5) struct QpShared<C: Cells = Atomics> {
    poster: CachePadded<Counters<C::Counter>>,
    poller: CachePadded<Counters<C::Counter>>,
    /// By the send WQE's first basic block: its `wr_id`, and its request number.
    sq_wrid: Box<[C::WrId]>,
    sq_request: Box<[C::Request]>,
    /// By receive slot.
    rq_wrid: Box<[C::WrId]>,
    /// The SRQ receives come from instead (then there are no receive slots).
    srq: Option<Arc<SrqShared>>,
}

impl<C: Cells> QpShared<C> {
    /// Tables for `sq_blocks` send basic blocks and `rq_slots` receive slots (powers of two),
    /// or receives from `srq`.
    pub(in crate::providers::mlx5) fn new(sq_blocks: usize, rq_slots: usize, srq: Option<Arc<SrqShared>>) -> Self {
        let shared = Self {
            poster: CachePadded::new(Counters::new()),
            poller: CachePadded::new(Counters::new()),
            sq_wrid: (0..sq_blocks.max(1)).map(|_| C::WrId::new()).collect(),
            sq_request: (0..sq_blocks.max(1)).map(|_| C::Request::new()).collect(),
            rq_wrid: (0..rq_slots.max(1)).map(|_| C::WrId::new()).collect(),
            srq,
        };
        shared.refuse_every_send();
        shared
    }

    /// Marks every send entry as naming no request (none is outstanding).
    fn refuse_every_send(&self) {
        for entry in self.sq_request.iter() {
            entry.set(NO_REQUEST);
        }
    }

    /// Poster: how many more sends fit with `head` posted and at most `max` outstanding. The
    /// poller only frees entries, so the answer stays true (if pessimistic) while the poster
    /// posts nothing.
    pub(in crate::providers::mlx5) fn sends_free(&self, head: u32, max: u32) -> u32 {
        max.saturating_sub(head.wrapping_sub(self.poller.sq.load(Ordering::Acquire)))
    }

    /// Poster, one request at a time (the CQ's tests and hostile harness post this way):
    /// whether request `request` (free-running) would put more than `max` sends outstanding.
    #[cfg(any(test, feature = "test-support"))]
    pub(in crate::providers::mlx5) fn send_full(&self, request: u32, max: u32) -> bool {
        self.sends_free(request, max) == 0
    }

    /// Poster, one request at a time: [`SendTables::record`].
    #[cfg(any(test, feature = "test-support"))]
    pub(in crate::providers::mlx5) fn record_send(&self, block: u32, blocks: u32, request: u32, wr_id: u64) {
        self.send_tables().record(block, blocks, request, wr_id);
    }

    /// Poster: the send tables, their addresses read once for a run of requests.
    pub(in crate::providers::mlx5) fn send_tables(&self) -> SendTables<'_, C> {
        SendTables {
            wrid: &self.sq_wrid,
            request: &self.sq_request,
            mask: self.sq_wrid.len() - 1,
        }
    }

    /// Poster: the sends before `head` are recorded.
    pub(in crate::providers::mlx5) fn publish_sends(&self, head: u32) {
        self.poster.sq.store(head, Ordering::Release);
    }

    /// Poster: whether receive request `request` would overfill the `slots`.
    pub(in crate::providers::mlx5) fn recv_full(&self, request: u32, slots: u32) -> bool {
        request.wrapping_sub(self.poller.rq.load(Ordering::Acquire)) >= slots
    }

    /// Poster: records receive request `request`.
    pub(in crate::providers::mlx5) fn record_recv(&self, request: u32, wr_id: u64) {
        self.rq_wrid[request as usize & (self.rq_wrid.len() - 1)].set(wr_id);
    }

    /// Poster: the receives before `head` are recorded.
    pub(in crate::providers::mlx5) fn publish_recvs(&self, head: u32) {
        self.poster.rq.store(head, Ordering::Release);
    }

    /// Poller: the `wr_id` of the send WQE at `wqe_counter`; every request up to it is
    /// completed. A counter naming no outstanding request is an error.
    pub(in crate::providers::mlx5) fn complete_send(&self, wqe_counter: u16) -> Result<u64, BadCqe> {
        let mut run = self.send_run();
        let wr_id = run.complete(wqe_counter).ok_or(BadCqe::WqeCounter)?;
        run.finish();
        Ok(wr_id)
    }

    /// Poller: the send queue's counters and tables held for a run of this QP's CQEs, the tail
    /// published once at its end ([`SendRun::finish`]) instead of per completion.
    #[inline(always)]
    pub(in crate::providers::mlx5) fn send_run(&self) -> SendRun<'_, C> {
        SendRun {
            qp: self,
            mask: self.sq_wrid.len() - 1,
            head: self.poster.sq.load(Ordering::Acquire),
            tail: self.poller.sq.load(Ordering::Relaxed),
        }
    }

    /// The SRQ the QP receives from.
    pub(in crate::providers::mlx5) fn srq(&self) -> Option<&Arc<SrqShared>> {
        self.srq.as_ref()
    }

    /// Poller: the `wr_id` of the oldest outstanding receive; on an SRQ, of the SRQ WQE at
    /// `wqe_counter`.
    pub(in crate::providers::mlx5) fn complete_recv(&self, wqe_counter: u16) -> Result<u64, BadCqe> {
        if let Some(srq) = &self.srq {
            return srq.complete(wqe_counter);
        }
        let head = self.poster.rq.load(Ordering::Acquire);
        let tail = self.poller.rq.load(Ordering::Relaxed);
        if head == tail {
            return Err(BadCqe::NoReceive);
        }
        let wr_id = self.rq_wrid[tail as usize & (self.rq_wrid.len() - 1)].get();
        self.poller.rq.store(tail.wrapping_add(1), Ordering::Release);
        Ok(wr_id)
    }

    /// Back to empty queues (RESET; no CQE of the QP is left), every send entry refused.
    pub(in crate::providers::mlx5) fn reset(&self) {
        self.refuse_every_send();
        self.poster.sq.store(0, Ordering::Relaxed);
        self.poster.rq.store(0, Ordering::Relaxed);
        self.poller.sq.store(0, Ordering::Release);
        self.poller.rq.store(0, Ordering::Release);
    }
}

/// The poster's view of the send tables ([`QpShared::send_tables`]).
pub(in crate::providers::mlx5) struct SendTables<'a, C: Cells = Atomics> {
    wrid: &'a [C::WrId],
    request: &'a [C::Request],
    /// Both tables' length less one (a power of two less one).
    mask: usize,
}

impl<C: Cells> SendTables<'_, C> {
    /// Records send request `request`, whose WQE takes `blocks` basic blocks from `block`.
    /// The entries of the blocks after the first get a request number far outside any
    /// outstanding window, so a CQE naming them (or one left from before a RESET) is
    /// refused, never matched to an older request.
    #[inline(always)]
    pub(in crate::providers::mlx5) fn record(&self, block: u32, blocks: u32, request: u32, wr_id: u64) {
        let i = block as usize & self.mask;
        // SAFETY: `i` is masked by the length less one, and both tables have that length (at
        // least 1: `QpShared::new`).
        unsafe {
            self.wrid.get_unchecked(i).set(wr_id);
            self.request.get_unchecked(i).set(request);
        }
        if blocks > 1 {
            self.refuse_after(i, blocks, request);
        }
    }

    /// The entries of a WQE's blocks after its first (`i`).
    #[cold]
    fn refuse_after(&self, i: usize, blocks: u32, request: u32) {
        for b in 1..blocks as usize {
            // SAFETY: as in `record`.
            unsafe { self.request.get_unchecked((i + b) & self.mask) }.set(request.wrapping_add(NO_REQUEST));
        }
    }
}

/// A QP's send completions over a run of its CQEs ([`QpShared::send_run`]): the head as
/// loaded at the start, the tail as advanced so far. A request posted after the start is not
/// in the window: [`SendRun::complete`] declines its CQE, and the caller finishes the run and
/// completes it with [`QpShared::complete_send`], which loads the head again.
pub(in crate::providers::mlx5) struct SendRun<'a, C: Cells = Atomics> {
    qp: &'a QpShared<C>,
    /// Both tables' length less one.
    mask: usize,
    head: u32,
    tail: u32,
}

impl<C: Cells> Clone for SendRun<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C: Cells> Copy for SendRun<'_, C> {}

impl<C: Cells> SendRun<'_, C> {
    /// The `wr_id` of the send WQE at `wqe_counter`, completing every request up to it; `None`
    /// if it names no request in the window, leaving the run as it was.
    #[inline(always)]
    pub(in crate::providers::mlx5) fn complete(&mut self, wqe_counter: u16) -> Option<u64> {
        let qp = self.qp;
        let i = usize::from(wqe_counter) & self.mask;
        // SAFETY: `i` is masked by the length less one (`send_run`), and both tables have
        // that length (at least 1: `QpShared::new`).
        let request = unsafe { qp.sq_request.get_unchecked(i) }.get();
        // An empty window (head == tail) holds no request.
        if request.wrapping_sub(self.tail) >= self.head.wrapping_sub(self.tail) {
            return None;
        }
        // SAFETY: as above.
        let wr_id = unsafe { qp.sq_wrid.get_unchecked(i) }.get();
        self.tail = request.wrapping_add(1);
        Some(wr_id)
    }

    /// Publishes the tail the run reached (Release: the poster may reuse the entries read).
    #[inline(always)]
    pub(in crate::providers::mlx5) fn finish(self) {
        self.qp.poller.sq.store(self.tail, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The poller completes up to the signaled request the CQE names and moves the tail past
    /// it; a counter naming nothing outstanding, or a receive with none posted, is an error.
    #[test]
    fn completions_follow_the_posted_tables() {
        let shared: QpShared = QpShared::new(8, 4, None);
        for (request, block) in [(0u32, 0u32), (1, 2), (2, 3)] {
            shared.send_tables().record(block, 1, request, 100 + u64::from(request));
        }
        assert_eq!(shared.complete_send(0), Err(BadCqe::WqeCounter), "nothing published");
        shared.publish_sends(3);
        assert_eq!(shared.complete_send(2), Ok(101));
        assert_eq!(shared.poller.sq.load(Ordering::Relaxed), 2);
        assert_eq!(shared.complete_send(2), Err(BadCqe::WqeCounter), "already completed");
        assert_eq!(shared.complete_send(0x0b), Ok(102), "masked to block 3");
        assert_eq!(shared.sends_free(3, 2), 2, "every request completed");
        assert_eq!(shared.sends_free(4, 2), 1);
        assert_eq!(shared.sends_free(5, 2), 0);
        // A two-block WQE: a CQE naming its second block is refused.
        shared.send_tables().record(4, 2, 3, 103);
        shared.publish_sends(4);
        assert_eq!(shared.complete_send(5), Err(BadCqe::WqeCounter));
        assert_eq!(shared.complete_send(4), Ok(103));
        // After a RESET, an entry of before it names nothing.
        shared.reset();
        shared.send_tables().record(0, 1, 0, 200);
        shared.publish_sends(1);
        assert_eq!(shared.complete_send(2), Err(BadCqe::WqeCounter));
        assert_eq!(shared.complete_send(0), Ok(200));
        assert_eq!(shared.complete_recv(0), Err(BadCqe::NoReceive));
        shared.record_recv(0, 55);
        shared.publish_recvs(1);
        assert!(shared.recv_full(1, 1));
        assert_eq!(shared.complete_recv(0), Ok(55));
        assert_eq!(shared.complete_recv(0), Err(BadCqe::NoReceive));
        assert!(!shared.recv_full(1, 1));
    }
}
