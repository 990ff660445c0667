//! The ring the rxe kernel driver shares with userspace (`struct rxe_queue_buf`): a header
//! with the element size, the index mask and the two indices on their own cache lines, then
//! the slots.
//!
//! Indices are masked (never free-running): the queue is empty when `prod == cons` and full
//! when `prod + 1 == cons` (mod slots). Each side owns one index: it keeps a private copy,
//! publishes it with a Release store after touching the slot, and reads the other side's with
//! an Acquire load before touching a slot. Every index read from shared memory is masked with
//! the mask cached at map time, so no value the kernel writes can move an access outside the
//! mapping.
//!
//! The index protocol ([`ProdIndex`], [`ConsIndex`]) is kept apart from the memory it runs on:
//! it reaches the two shared words only through [`Word`], so the same code runs on the mapped
//! header here and on loom's model atomics in `queue/model.rs` (`cargo xtask loom`). The
//! synthetic heap rings below let the unit tests, `cargo xtask miri` and the hostile-ring
//! harness in `queue/hostile.rs` (also the `fuzz/` target) run the real code without a device.

use super::abi::queue as off;
use crate::error::{Error, Result, Verb};
use crate::sys::mapping::Mapping;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

#[cfg(any(test, feature = "test-support"))]
pub mod hostile;
#[cfg(all(test, loom))]
mod model;
#[cfg(test)]
mod provider_fuzz;

/// One shared 32-bit index word: a mapped `AtomicU32` in the library, a loom atomic in the
/// model checker.
pub(super) trait Word {
    /// Loads the word.
    fn load(&self, order: Ordering) -> u32;
    /// Stores the word.
    fn store(&self, value: u32, order: Ordering);
}

impl Word for AtomicU32 {
    #[inline]
    fn load(&self, order: Ordering) -> u32 {
        AtomicU32::load(self, order)
    }

    #[inline]
    fn store(&self, value: u32, order: Ordering) {
        AtomicU32::store(self, value, order)
    }
}

/// The producing side's index logic (user side of send, receive and shared receive queues;
/// the kernel's side of completion queues): its own index, the last consumer index it saw, and
/// the mask. Every value taken from shared memory is masked.
#[derive(Debug, Clone, Copy)]
pub(super) struct ProdIndex {
    mask: u32,
    prod: u32,
    cons: u32,
}

impl ProdIndex {
    /// Starts from the indices in shared memory.
    pub(super) fn new(mask: u32, producer: &impl Word, consumer: &impl Word) -> Self {
        Self {
            mask,
            prod: producer.load(Ordering::Relaxed) & mask,
            cons: consumer.load(Ordering::Acquire) & mask,
        }
    }

    /// The slot index the next entry goes in, or `None` when the ring is full. The consumer's
    /// index is re-read (Acquire: its reads of the slots it released happen before our
    /// writes) only when the cached one says full.
    #[inline]
    pub(super) fn next_free(&mut self, consumer: &impl Word) -> Option<u32> {
        let next = (self.prod + 1) & self.mask;
        if next == self.cons {
            self.cons = consumer.load(Ordering::Acquire) & self.mask;
            if next == self.cons {
                return None;
            }
        }
        Some(self.prod)
    }

    /// How many slots are free after the private producer index, from the consumer's index
    /// as of now (Acquire, as in `next_free`). One slot always stays empty.
    pub(super) fn free(&mut self, consumer: &impl Word) -> u32 {
        self.cons = consumer.load(Ordering::Acquire) & self.mask;
        self.cons.wrapping_sub(self.prod).wrapping_sub(1) & self.mask
    }

    /// Counts the slot from `next_free` as filled (still private).
    #[inline]
    pub(super) fn advance(&mut self) {
        self.prod = (self.prod + 1) & self.mask;
    }

    /// Makes every advanced entry visible (Release: the slot writes happen before the index).
    #[inline]
    pub(super) fn publish(&self, producer: &impl Word) {
        producer.store(self.prod, Ordering::Release);
    }

    /// The private producer index (always `<= mask`).
    #[cfg(any(test, feature = "test-support"))]
    pub(super) fn index(&self) -> u32 {
        self.prod
    }
}

/// The consuming side's index logic (user side of completion queues; the kernel's side of the
/// others).
#[derive(Debug, Clone, Copy)]
pub(super) struct ConsIndex {
    mask: u32,
    cons: u32,
}

impl ConsIndex {
    /// Starts from the consumer index in shared memory.
    pub(super) fn new(mask: u32, consumer: &impl Word) -> Self {
        Self {
            mask,
            cons: consumer.load(Ordering::Relaxed) & mask,
        }
    }

    /// How many entries are ready (at most `mask`). Acquire: the producer's slot writes
    /// happen before our reads of the slots counted here.
    #[inline]
    pub(super) fn ready(&self, producer: &impl Word) -> u32 {
        let prod = producer.load(Ordering::Acquire) & self.mask;
        prod.wrapping_sub(self.cons) & self.mask
    }

    /// The index of the `i`-th ready entry, not masked: the slot lookup masks it (once, with
    /// the mask that bounds the mapping).
    #[inline]
    pub(super) fn unmasked(&self, i: u32) -> u32 {
        self.cons.wrapping_add(i)
    }

    /// Hands the first `n` ready entries back with one Release store (our reads of them
    /// happen before the producer may refill them).
    #[inline]
    pub(super) fn release(&mut self, n: u32, consumer: &impl Word) {
        self.cons = self.cons.wrapping_add(n) & self.mask;
        consumer.store(self.cons, Ordering::Release);
    }

    /// The private consumer index (always `<= mask`).
    #[cfg(any(test, feature = "test-support"))]
    pub(super) fn index(&self) -> u32 {
        self.cons
    }
}

/// Memory holding a ring.
pub(super) enum Backing {
    /// A ring mapped from the device.
    Mapped(Mapping),
    /// A synthetic ring (tests, miri, fuzzing), cache-line aligned like the kernel's.
    #[cfg(any(test, feature = "test-support"))]
    Heap(HeapRing),
}

/// One cache line of a synthetic ring.
#[cfg(any(test, feature = "test-support"))]
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Line(pub(super) [u32; 16]);

/// Heap memory for a synthetic ring, held as a raw allocation rather than a `Box`: like a
/// mapping, it is reached through pointers derived once, which moving a `Box` (a unique
/// owner) would invalidate (miri's Stacked Borrows reports exactly that).
#[cfg(any(test, feature = "test-support"))]
pub(super) struct HeapRing {
    lines: NonNull<Line>,
    count: usize,
}

#[cfg(any(test, feature = "test-support"))]
impl HeapRing {
    pub(super) fn new(lines: Box<[Line]>) -> Self {
        let count = lines.len();
        let raw = Box::into_raw(lines).cast::<Line>();
        Self {
            lines: NonNull::new(raw).unwrap_or(NonNull::dangling()),
            count,
        }
    }

    /// The lines, before the ring is handed to a [`Queue`].
    #[cfg(test)]
    pub(super) fn lines_mut(&mut self) -> &mut [Line] {
        // SAFETY: the allocation from `new`, `count` lines, uniquely borrowed through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_ptr(), self.count) }
    }
}

#[cfg(any(test, feature = "test-support"))]
impl Drop for HeapRing {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.lines.as_ptr(), self.count);
        // SAFETY: `slice` is exactly the allocation `Box::into_raw` gave up in `new`.
        drop(unsafe { Box::from_raw(slice) });
    }
}

impl Backing {
    fn region(&mut self) -> (NonNull<u8>, usize) {
        let (ptr, len) = match self {
            Self::Mapped(m) => (m.as_mut_ptr(), m.len()),
            #[cfg(any(test, feature = "test-support"))]
            Self::Heap(h) => (h.lines.as_ptr().cast::<u8>(), h.count * size_of::<Line>()),
        };
        (NonNull::new(ptr).unwrap_or(NonNull::dangling()), len)
    }
}

/// A validated ring: its geometry was checked against the mapping's length once, and is
/// cached so later header changes cannot affect bounds.
pub(super) struct Queue {
    base: NonNull<u8>,
    len: usize,
    mask: u32,
    log2_elem: u32,
    _backing: Backing,
}

// SAFETY: the queue owns its backing memory; the raw pointer is only used through methods
// that follow the ring protocol (atomics on the indices, one owner per side).
unsafe impl Send for Queue {}

impl Queue {
    /// Validates the ring header in `backing`: slots of at least `min_elem` bytes, a
    /// power-of-two slot count, all inside the mapping.
    pub(super) fn new(mut backing: Backing, verb: Verb, min_elem: usize) -> Result<Self> {
        let (base, len) = backing.region();
        if len < off::DATA || base.as_ptr() as usize % 64 != 0 {
            return Err(Error::malformed(verb, format!("ring of {len} bytes")));
        }
        // SAFETY: both offsets are 4-aligned and inside the `len >= DATA` bytes checked above.
        let (log2_elem, mask) = unsafe {
            (
                header_word(base, off::LOG2_ELEM_SIZE).load(Ordering::Relaxed),
                header_word(base, off::INDEX_MASK).load(Ordering::Relaxed),
            )
        };
        let slots = u64::from(mask) + 1;
        let fits = log2_elem <= 20
            && (1usize << log2_elem) >= min_elem
            && slots.is_power_of_two()
            && (off::DATA as u64)
                .checked_add(slots << log2_elem)
                .is_some_and(|end| end <= len as u64);
        if !fits {
            return Err(Error::malformed(
                verb,
                format!("ring header log2_elem_size={log2_elem} index_mask={mask:#x} for a {len}-byte mapping (slots of at least {min_elem} bytes)"),
            ));
        }
        Ok(Self {
            base,
            len,
            mask,
            log2_elem,
            _backing: backing,
        })
    }

    /// Bytes per slot.
    pub(super) fn elem_size(&self) -> usize {
        1 << self.log2_elem
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: offset checked in `new`; the memory lives as long as `self`.
        unsafe { header_word(self.base, off::PRODUCER_INDEX) }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as in `producer`.
        unsafe { header_word(self.base, off::CONSUMER_INDEX) }
    }

    /// The slot at `index`, which this masks: `elem_size()` bytes, 64-byte aligned.
    fn slot(&self, index: u32) -> NonNull<u8> {
        let at = off::DATA + (((index & self.mask) as usize) << self.log2_elem);
        debug_assert!(at + self.elem_size() <= self.len);
        // SAFETY: `new` checked that every masked slot lies inside the mapping.
        unsafe { self.base.add(at) }
    }
}

/// # Safety
/// `offset` must be 4-aligned and `base + offset + 4` inside a live mapping that outlives
/// the returned reference.
unsafe fn header_word<'a>(base: NonNull<u8>, offset: usize) -> &'a AtomicU32 {
    // SAFETY: per the contract; `AtomicU32` has the layout of `u32`, and the other side only
    // accesses this word atomically.
    unsafe { &*base.as_ptr().add(offset).cast::<AtomicU32>() }
}

/// The user side of a ring userspace fills (send, receive and shared receive queues).
pub(super) struct Producer {
    queue: Queue,
    index: ProdIndex,
}

impl Producer {
    pub(super) fn new(queue: Queue) -> Self {
        let index = ProdIndex::new(queue.mask, queue.producer(), queue.consumer());
        Self { queue, index }
    }

    /// The slot the next entry goes in, or `None` when the ring is full. The entry becomes
    /// visible only after [`Producer::advance`] and [`Producer::publish`].
    #[inline]
    pub(super) fn next_slot(&mut self) -> Option<NonNull<u8>> {
        let index = self.index.next_free(self.queue.consumer())?;
        Some(self.queue.slot(index))
    }

    /// How many more entries fit now (see [`ProdIndex::free`]).
    pub(super) fn free(&mut self) -> u32 {
        self.index.free(self.queue.consumer())
    }

    /// [`Producer::next_slot`] as the index for [`Producer::slot`]: an `Option` of a pointer
    /// would be tested for null again where it is taken apart.
    #[inline]
    pub(super) fn next_index(&mut self) -> Option<u32> {
        self.index.next_free(self.queue.consumer())
    }

    /// The slot of an index from [`Producer::next_index`].
    #[inline]
    pub(super) fn slot(&self, index: u32) -> NonNull<u8> {
        self.queue.slot(index)
    }

    /// Counts the slot from `next_slot` as filled (still private).
    #[inline]
    pub(super) fn advance(&mut self) {
        self.index.advance();
    }

    /// Makes every advanced entry visible to the kernel.
    #[inline]
    pub(super) fn publish(&self) {
        self.index.publish(self.queue.producer());
    }
}

/// Where a run of ready entries lies (see [`Consumer::run`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    pub(super) first: NonNull<u8>,
    pub(super) before_wrap: u32,
    pub(super) wrapped: NonNull<u8>,
}

/// The user side of a ring the kernel fills (completion queues).
pub(super) struct Consumer {
    queue: Queue,
    index: ConsIndex,
}

impl Consumer {
    pub(super) fn new(queue: Queue) -> Self {
        let index = ConsIndex::new(queue.mask, queue.consumer());
        Self { queue, index }
    }

    /// How many entries are ready. Entries counted here may be read until `release`.
    #[inline]
    pub(super) fn ready(&self) -> u32 {
        self.index.ready(self.queue.producer())
    }

    /// The `i`-th ready entry.
    #[inline]
    pub(super) fn entry(&self, i: u32) -> NonNull<u8> {
        self.queue.slot(self.index.unmasked(i))
    }

    /// Where the first `n` ready entries lie: how many of them follow one another from the
    /// first, and where the rest continue (the first slot of the ring).
    #[inline]
    pub(super) fn run(&self, n: u32) -> Run {
        // The private index is always masked (`ConsIndex` keeps it so).
        let cons = self.index.unmasked(0);
        Run {
            first: self.queue.slot(cons),
            before_wrap: n.min(self.queue.mask.wrapping_sub(cons).wrapping_add(1)),
            wrapped: self.queue.slot(0),
        }
    }

    /// Hands the first `n` ready entries back to the kernel with one Release store.
    #[inline]
    pub(super) fn release(&mut self, n: u32) {
        self.index.release(n, self.queue.consumer());
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A synthetic ring of `slots` slots of `1 << log2` bytes, as the kernel would lay it out.
    pub(crate) fn heap_ring(log2: u32, slots: u32) -> Backing {
        let bytes = off::DATA + ((slots as usize) << log2);
        let mut lines = vec![Line([0; 16]); bytes.div_ceil(64)].into_boxed_slice();
        lines[0].0[0] = log2;
        lines[0].0[1] = slots - 1;
        Backing::Heap(HeapRing::new(lines))
    }

    fn set_mask(b: &mut Backing, mask: u32) {
        if let Backing::Heap(h) = b {
            h.lines_mut()[0].0[1] = mask;
        }
    }

    #[test]
    fn rejects_headers_that_point_outside_the_mapping() {
        let mut b = heap_ring(7, 4);
        set_mask(&mut b, 1023); // claims 1024 slots in a 4-slot buffer
        assert!(Queue::new(b, "test", 48).is_err());
        assert!(
            Queue::new(heap_ring(5, 4), "test", 48).is_err(),
            "slots smaller than an entry"
        );
        let mut b = heap_ring(7, 4);
        set_mask(&mut b, 2); // 3 slots: not a power of two
        assert!(Queue::new(b, "test", 48).is_err());
        assert!(Queue::new(heap_ring(7, 4), "test", 48).is_ok());
    }

    #[test]
    fn producer_fills_to_capacity_then_reports_full() {
        let q = Queue::new(heap_ring(6, 8), "test", 1).unwrap();
        let mut p = Producer::new(q);
        assert_eq!(p.free(), 7);
        for _ in 0..7 {
            assert!(p.next_slot().is_some());
            p.advance();
        }
        assert!(p.next_slot().is_none(), "one slot stays empty");
        assert_eq!(p.free(), 0);
        p.publish();
        assert_eq!(p.queue.producer().load(Ordering::Relaxed), 7);
        // The kernel consumes two; two more fit.
        p.queue.consumer().store(2, Ordering::Release);
        assert_eq!(p.free(), 2);
        for _ in 0..2 {
            assert!(p.next_slot().is_some());
            p.advance();
        }
        assert!(p.next_slot().is_none());
        assert_eq!(p.free(), 0, "across the wrap");
    }

    #[test]
    fn consumer_masks_a_hostile_producer_index() {
        let q = Queue::new(heap_ring(7, 4), "test", 48).unwrap();
        let mut c = Consumer::new(q);
        c.queue.producer().store(0xffff_fffe, Ordering::Release);
        assert_eq!(c.ready(), 2, "index masked into range");
        let end = c.queue.base.as_ptr() as usize + off::DATA + (4 << 7);
        for i in 0..c.ready() {
            assert!((c.entry(i).as_ptr() as usize) < end);
        }
        c.release(2);
        assert_eq!(c.queue.consumer().load(Ordering::Relaxed), 2);
        assert_eq!(c.ready(), 0);
    }

    #[test]
    fn release_of_any_count_stays_in_range() {
        let q = Queue::new(heap_ring(6, 8), "test", 1).unwrap();
        let mut c = Consumer::new(q);
        for n in [u32::MAX, 7, u32::MAX - 3, 1 << 31] {
            c.release(n);
            assert!(c.index.index() <= 7);
            assert!(c.queue.consumer().load(Ordering::Relaxed) <= 7);
        }
    }

    /// Raw access to a synthetic ring from a second thread, standing in for the kernel.
    #[derive(Clone, Copy)]
    struct KernelView {
        base: NonNull<u8>,
        mask: u32,
        log2: u32,
    }

    // SAFETY: the view is used only inside `thread::scope` while the queue it points into is
    // alive, and only through atomics on the index words and slots the protocol hands it.
    unsafe impl Send for KernelView {}

    impl KernelView {
        fn of(q: &Queue) -> Self {
            Self {
                base: q.base,
                mask: q.mask,
                log2: q.log2_elem,
            }
        }

        fn word(&self, offset: usize) -> &AtomicU32 {
            // SAFETY: header offsets of a validated queue that outlives the scope.
            unsafe { header_word(self.base, offset) }
        }

        fn slot(&self, index: u32) -> *mut u64 {
            let at = off::DATA + (((index & self.mask) as usize) << self.log2);
            // SAFETY: inside the validated ring (every masked slot is).
            unsafe { self.base.as_ptr().add(at).cast::<u64>() }
        }
    }

    /// The user consumer (a CQ) against a concurrent producer written as the kernel's
    /// `rxe_queue.h` does it, with plain (non-atomic) slot accesses: under `cargo miri test`
    /// the data-race detector and weak-memory emulation check the index orderings.
    #[test]
    fn consumer_against_a_concurrent_kernel_producer() {
        const N: u64 = if cfg!(miri) { 40 } else { 20_000 };
        let q = Queue::new(heap_ring(6, 4), "test", 8).unwrap();
        let view = KernelView::of(&q);
        let mut c = Consumer::new(q);
        std::thread::scope(|s| {
            s.spawn(move || {
                let (prod_w, cons_w) = (view.word(off::PRODUCER_INDEX), view.word(off::CONSUMER_INDEX));
                let mut prod = prod_w.load(Ordering::Relaxed);
                for v in 0..N {
                    let next = (prod + 1) & view.mask;
                    while next == cons_w.load(Ordering::Acquire) & view.mask {
                        std::thread::yield_now();
                    }
                    // SAFETY: the slot is free (the consumer released it: Acquire above).
                    unsafe { view.slot(prod).write(v) };
                    prod = next;
                    prod_w.store(prod, Ordering::Release);
                }
            });
            let mut want = 0;
            while want < N {
                let ready = c.ready();
                for i in 0..ready {
                    // SAFETY: a ready slot (Acquire in `ready`), not yet released.
                    let got = unsafe { c.entry(i).cast::<u64>().read() };
                    assert_eq!(got, want, "each value once, in order");
                    want += 1;
                }
                if ready > 0 {
                    c.release(ready);
                } else {
                    std::thread::yield_now();
                }
            }
        });
        assert_eq!(c.ready(), 0);
    }

    /// The user producer (an SQ or RQ) against a concurrent consumer written as the kernel's.
    #[test]
    fn producer_against_a_concurrent_kernel_consumer() {
        const N: u64 = if cfg!(miri) { 40 } else { 20_000 };
        let q = Queue::new(heap_ring(6, 4), "test", 8).unwrap();
        let view = KernelView::of(&q);
        let mut p = Producer::new(q);
        std::thread::scope(|s| {
            let kernel = s.spawn(move || {
                let (prod_w, cons_w) = (view.word(off::PRODUCER_INDEX), view.word(off::CONSUMER_INDEX));
                let mut cons = cons_w.load(Ordering::Relaxed);
                let mut want = 0;
                while want < N {
                    if prod_w.load(Ordering::Acquire) & view.mask == cons {
                        std::thread::yield_now();
                        continue;
                    }
                    // SAFETY: a published slot (Acquire above), not yet handed back.
                    let got = unsafe { view.slot(cons).read() };
                    assert_eq!(got, want, "each value once, in order");
                    want += 1;
                    cons = (cons + 1) & view.mask;
                    cons_w.store(cons, Ordering::Release);
                }
            });
            let mut v = 0;
            while v < N {
                let mut wrote = false;
                // Up to two per "post", one publish each, as `post_send` batches.
                for _ in 0..2 {
                    if v == N {
                        break;
                    }
                    let Some(slot) = p.next_slot() else { break };
                    // SAFETY: a free slot (the kernel released it: Acquire in `next_slot`).
                    unsafe { slot.cast::<u64>().write(v) };
                    p.advance();
                    v += 1;
                    wrote = true;
                }
                if wrote {
                    p.publish();
                } else {
                    std::thread::yield_now();
                }
            }
            kernel.join().unwrap();
        });
    }

    /// Prints a figure on stdout past the test harness's output capture, so `cargo xtask test`
    /// shows it (docs/reliability.md).
    pub(crate) fn report(line: impl std::fmt::Display) {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
    }

    /// A deterministic run of the hostile-ring harness (the `fuzz/` target's entry point)
    /// over a few thousand pseudo-random inputs.
    #[test]
    fn hostile_rings_never_escape_the_mapping() {
        let cases = if cfg!(miri) { 64 } else { 4000 };
        let stats = hostile::run_many(0x5eed_f71c, cases);
        report(stats);
        assert!(stats.rejected > 0 && stats.accepted > 0, "{stats}");
    }
}
