//! Completions read in place: a lending view of the ready completions a CQ's provider
//! describes ([`ReadyRun`]), read through its pointers. This module and the providers are the
//! only places that read ring memory.

use crate::provider::{CqRing, ReadyRun};
use crate::wc::WorkCompletion;
use std::ptr::NonNull;

/// Ready completions borrowed in place from the ring; see [`crate::Cq::batch`].
///
/// Each completion is a reference into the ring, so none may outlive the batch: its slots go
/// back to the device, to be written again, when the batch is dropped. That is why the batch
/// is not itself an [`Iterator`] (whose items could be kept after it is gone); iterate
/// `&mut batch` instead, whose items live as long as that borrow, or call the lending
/// [`Batch::next`]. Copy a completion out (`*wc`) to keep it longer.
///
/// ```no_run
/// # fn f(cq: &mut uverbs::Cq) {
/// let mut batch = cq.batch();
/// for wc in &mut batch {
///     println!("{} {:?} {}", wc.wr_id, wc.status, wc.byte_len);
/// }
/// // Or one at a time: `while let Some(wc) = batch.next() { .. }`.
/// # }
/// ```
///
/// A completion cannot be kept past the batch:
///
/// ```compile_fail,E0505
/// # fn f(cq: &mut uverbs::Cq) {
/// let mut batch = cq.batch();
/// let first: Vec<&uverbs::WorkCompletion> = (&mut batch).take(1).collect();
/// drop(batch); // hands the slot back to the device
/// println!("{:?}", first);
/// # }
/// ```
pub struct Batch<'a> {
    ring: &'a mut dyn CqRing,
    /// The next completion to yield, and how many are left from it on, one after another
    /// (past the last, `next` may point anywhere: it is only read while `left` > 0).
    next: *const WorkCompletion,
    left: usize,
    /// The part after the ring wrapped, until the batch moves on to it.
    wrapped: NonNull<WorkCompletion>,
    wrapped_len: usize,
    stride: usize,
    /// Ready when the batch began.
    ready: usize,
}

impl std::fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("ready", &self.ready)
            .field("left", &self.len())
            .finish_non_exhaustive()
    }
}

// SAFETY: the pointers are into the ring the batch borrows mutably, which is `Send`; moving
// the batch moves that borrow with it.
unsafe impl Send for Batch<'_> {}

impl<'a> Batch<'a> {
    pub(crate) fn new(ring: &'a mut dyn CqRing, run: ReadyRun) -> Self {
        Self {
            ring,
            next: run.first.as_ptr(),
            left: run.before_wrap,
            wrapped: run.wrapped,
            wrapped_len: run.len.saturating_sub(run.before_wrap),
            stride: run.stride,
            ready: run.len,
        }
    }

    /// The next ready completion, or `None` at the end of the batch. Completions that
    /// arrive after the batch started wait for the next batch.
    #[allow(clippy::should_implement_trait)] // lending: the item borrows the batch
    #[inline]
    pub fn next(&mut self) -> Option<&WorkCompletion> {
        if self.left == 0 && !self.wrap() {
            return None;
        }
        let wc = self.next;
        self.left -= 1;
        // The address after the last completion is never read, so a wrapping add will do.
        self.next = wc.wrapping_byte_add(self.stride);
        // SAFETY: `wc` is one of the ready completions the provider described, which stay
        // unchanged while the batch holds the ring (`CqRing`'s contract); the borrow is tied
        // to `&mut self`, and the slots are handed back only when the batch drops.
        Some(unsafe { &*wc })
    }

    /// Moves on to the part after the ring wrapped; `false` if there is none left.
    #[cold]
    fn wrap(&mut self) -> bool {
        if self.wrapped_len == 0 {
            return false;
        }
        (self.next, self.left, self.wrapped_len) = (self.wrapped.as_ptr(), self.wrapped_len, 0);
        true
    }

    /// Completions left in the batch.
    pub fn len(&self) -> usize {
        self.left + self.wrapped_len
    }

    /// Whether the batch is exhausted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The batch's completions in order, each borrowed for as long as the batch is: several can be
/// held at once (each is its own read-only slot), and the batch can be neither used nor
/// dropped while any is. Those taken are consumed when the batch drops, as with
/// [`Batch::next`].
impl<'b> Iterator for &'b mut Batch<'_> {
    type Item = &'b WorkCompletion;

    #[inline]
    fn next(&mut self) -> Option<&'b WorkCompletion> {
        let wc: *const WorkCompletion = Batch::next(self)?;
        // SAFETY: as in `Batch::next`, `wc` is a ready completion that stays unchanged while
        // the batch holds the ring. The batch is borrowed mutably for 'b, so for 'b it can
        // neither be dropped (which hands the slot back) nor be used to reach the ring; and
        // each call yields a different slot, so the shared references never overlap a write.
        Some(unsafe { &*wc })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = Batch::len(self);
        (left, Some(left))
    }
}

impl ExactSizeIterator for &mut Batch<'_> {}

impl std::iter::FusedIterator for &mut Batch<'_> {}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        let taken = self.ready - self.len();
        if taken > 0 {
            self.ring.consume(taken);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use crate::provider::ResizeCqCall;
    use std::any::Any;

    /// A ring of `SLOTS` completions in memory, filled by the test, read through `Batch`.
    struct FakeRing {
        slots: Box<[WorkCompletion]>,
        cons: usize,
        ready: usize,
    }

    const SLOTS: usize = 8;

    // SAFETY: `ready_run` describes `ready` initialized completions of `slots` from `cons`,
    // wrapping at the end; the test changes them only through `&mut self`.
    unsafe impl CqRing for FakeRing {
        fn poll(&mut self, _: &mut [WorkCompletion]) -> usize {
            unreachable!("not used by Batch")
        }

        fn ready_run(&mut self) -> ReadyRun {
            let base = self.slots.as_mut_ptr();
            ReadyRun {
                // `cons < SLOTS`, so both are inside the allocation.
                first: NonNull::new(base.wrapping_add(self.cons)).unwrap(),
                before_wrap: self.ready.min(SLOTS - self.cons),
                wrapped: NonNull::new(base).unwrap(),
                len: self.ready,
                stride: size_of::<WorkCompletion>(),
            }
        }

        fn consume(&mut self, n: usize) {
            assert!(n <= self.ready, "consumed {n} of {}", self.ready);
            self.cons = (self.cons + n) % SLOTS;
            self.ready -= n;
        }

        fn resize(&mut self, _: u32, _: ResizeCqCall<'_>) -> Result<u32> {
            unreachable!("not used by Batch")
        }

        fn arm(&mut self, _: bool, _: u32, _: &mut dyn FnMut() -> Result<()>) -> Result<()> {
            unreachable!("not used by Batch")
        }

        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    /// Batches that stop early, run to the end, and span the wrap, against an exact count of
    /// what was produced and consumed.
    #[test]
    fn batch_yields_every_ready_completion_once_across_the_wrap() {
        let mut ring = FakeRing {
            slots: vec![WorkCompletion::default(); SLOTS].into_boxed_slice(),
            cons: 0,
            ready: 0,
        };
        let (mut produced, mut seen) = (0u64, 0u64);
        for step in 0..200usize {
            while ring.ready < SLOTS - 1 && (produced as usize + step) % 3 != 0 {
                let at = (ring.cons + ring.ready) % SLOTS;
                ring.slots[at].wr_id = produced;
                produced += 1;
                ring.ready += 1;
            }
            let ready = ring.ready;
            let take = step % (ready + 2);
            let run = ring.ready_run();
            let mut batch = Batch::new(&mut ring, run);
            assert_eq!(batch.len(), ready);
            for i in 0..take {
                match batch.next() {
                    Some(wc) => {
                        assert_eq!(wc.wr_id, seen, "step {step}");
                        seen += 1;
                    }
                    None => assert_eq!(i, ready, "ends after the ready ones"),
                }
            }
            assert_eq!(batch.len(), ready.saturating_sub(take));
            assert_eq!(batch.is_empty(), take >= ready);
            drop(batch);
            assert_eq!(ring.ready, ready.saturating_sub(take), "consumed what was yielded");
        }
        assert!(
            produced > 300 && seen + ring.ready as u64 == produced,
            "{produced} {seen}"
        );
    }

    /// `&mut batch` iterates the same completions as `next`, across the wrap, with an exact
    /// length; several items are held at once; only the ones taken are consumed.
    #[test]
    fn iterating_a_batch_by_reference_takes_each_completion_once() {
        let mut ring = FakeRing {
            slots: vec![WorkCompletion::default(); SLOTS].into_boxed_slice(),
            cons: SLOTS - 3,
            ready: 0,
        };
        for i in 0..6 {
            ring.slots[(SLOTS - 3 + i) % SLOTS].wr_id = 100 + i as u64;
            ring.ready += 1;
        }
        let run = ring.ready_run();
        let mut batch = Batch::new(&mut ring, run);
        let mut iter = &mut batch;
        assert_eq!(iter.len(), 6);
        let two: Vec<&WorkCompletion> = iter.by_ref().take(2).collect();
        assert_eq!(iter.len(), 4);
        assert_eq!(two.iter().map(|wc| wc.wr_id).collect::<Vec<_>>(), [100, 101]);
        let ids: Vec<u64> = (&mut batch).take(3).map(|wc| wc.wr_id).collect();
        assert_eq!(ids, [102, 103, 104], "across the wrap");
        drop(batch);
        assert_eq!((ring.ready, ring.cons), (1, 2), "five consumed, one left");

        let run = ring.ready_run();
        let mut batch = Batch::new(&mut ring, run);
        let rest: Vec<u64> = (&mut batch).map(|wc| wc.wr_id).collect();
        assert_eq!(rest, [105]);
        let mut iter = &mut batch;
        assert_eq!(Iterator::next(&mut iter), None, "fused");
        drop(batch);
        assert_eq!(ring.ready, 0);
    }
}
