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

use super::abi::queue as off;
use crate::error::{Error, Result, Verb};
use memmap2::MmapMut;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// Memory holding a ring.
pub(super) enum Backing {
    /// A ring mapped from the device.
    Mapped(MmapMut),
    /// A synthetic ring for tests, cache-line aligned like the kernel's.
    #[cfg(test)]
    Heap(Box<[tests::Line]>),
}

impl Backing {
    fn region(&mut self) -> (NonNull<u8>, usize) {
        let (ptr, len) = match self {
            Self::Mapped(m) => (m.as_mut_ptr(), m.len()),
            #[cfg(test)]
            Self::Heap(h) => (h.as_mut_ptr().cast::<u8>(), size_of_val(&**h)),
        };
        (NonNull::new(ptr).unwrap_or(NonNull::dangling()), len)
    }
}

/// A validated ring: its geometry was checked against the mapping's length once, and is
/// cached so later header changes cannot affect bounds.
pub(super) struct Queue {
    base: NonNull<u8>,
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

    /// The slot at `index` (masked), `elem_size()` bytes, 64-byte aligned.
    fn slot(&self, index: u32) -> NonNull<u8> {
        let at = off::DATA + (((index & self.mask) as usize) << self.log2_elem);
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
    prod: u32,
    /// Last consumer index seen; refreshed only when the ring looks full.
    cons: u32,
}

impl Producer {
    pub(super) fn new(queue: Queue) -> Self {
        let prod = queue.producer().load(Ordering::Relaxed) & queue.mask;
        let cons = queue.consumer().load(Ordering::Acquire) & queue.mask;
        Self { queue, prod, cons }
    }

    /// The slot the next entry goes in, or `None` when the ring is full. The entry becomes
    /// visible only after [`Producer::advance`] and [`Producer::publish`].
    pub(super) fn next_slot(&mut self) -> Option<NonNull<u8>> {
        let next = (self.prod + 1) & self.queue.mask;
        if next == self.cons {
            self.cons = self.queue.consumer().load(Ordering::Acquire) & self.queue.mask;
            if next == self.cons {
                return None;
            }
        }
        Some(self.queue.slot(self.prod))
    }

    /// Counts the slot from `next_slot` as filled (still private).
    pub(super) fn advance(&mut self) {
        self.prod = (self.prod + 1) & self.queue.mask;
    }

    /// Makes every advanced entry visible to the kernel.
    pub(super) fn publish(&self) {
        self.queue.producer().store(self.prod, Ordering::Release);
    }
}

/// The user side of a ring the kernel fills (completion queues).
pub(super) struct Consumer {
    queue: Queue,
    cons: u32,
}

impl Consumer {
    pub(super) fn new(queue: Queue) -> Self {
        let cons = queue.consumer().load(Ordering::Relaxed) & queue.mask;
        Self { queue, cons }
    }

    /// How many entries are ready. Entries counted here may be read until `release`.
    #[inline]
    pub(super) fn ready(&self) -> u32 {
        let prod = self.queue.producer().load(Ordering::Acquire) & self.queue.mask;
        prod.wrapping_sub(self.cons) & self.queue.mask
    }

    /// The `i`-th ready entry.
    #[inline]
    pub(super) fn entry(&self, i: u32) -> NonNull<u8> {
        self.queue.slot(self.cons.wrapping_add(i))
    }

    /// Hands the first `n` ready entries back to the kernel with one Release store.
    #[inline]
    pub(super) fn release(&mut self, n: u32) {
        self.cons = (self.cons + n) & self.queue.mask;
        self.queue.consumer().store(self.cons, Ordering::Release);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// One cache line of a synthetic ring.
    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    pub(crate) struct Line([u32; 16]);

    /// A synthetic ring of `slots` slots of `1 << log2` bytes, as the kernel would lay it out.
    pub(crate) fn heap_ring(log2: u32, slots: u32) -> Backing {
        let bytes = off::DATA + ((slots as usize) << log2);
        let mut lines = vec![Line([0; 16]); bytes.div_ceil(64)].into_boxed_slice();
        lines[0].0[0] = log2;
        lines[0].0[1] = slots - 1;
        Backing::Heap(lines)
    }

    fn set_mask(b: &mut Backing, mask: u32) {
        if let Backing::Heap(lines) = b {
            lines[0].0[1] = mask;
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
        for _ in 0..7 {
            assert!(p.next_slot().is_some());
            p.advance();
        }
        assert!(p.next_slot().is_none(), "one slot stays empty");
        p.publish();
        assert_eq!(p.queue.producer().load(Ordering::Relaxed), 7);
        // The kernel consumes two; two more fit.
        p.queue.consumer().store(2, Ordering::Release);
        for _ in 0..2 {
            assert!(p.next_slot().is_some());
            p.advance();
        }
        assert!(p.next_slot().is_none());
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
}
