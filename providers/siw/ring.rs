//! siw's rings: arrays of fixed-size slots the kernel allocates, with no shared indices. Each
//! slot has a flags word whose VALID bit says who owns it: on send and receive queues user
//! space fills a slot whose VALID bit is clear and then sets it, the kernel copies the slot
//! and clears it; on completion queues the kernel fills a slot whose flags are zero and then
//! sets VALID, user space copies it and clears the flags. Each side keeps its own position.
//!
//! The ordering: the owner-to-be reads the flags with Acquire (what the other side wrote into
//! the slot before handing it over is then visible), and hands a slot over with a Release
//! store of the flags after its last write to (or read of) the slot. The kernel's side uses
//! `READ_ONCE`, `smp_rmb` and `smp_store_mb`/`WRITE_ONCE` under its CQ lock (Linux 6.1,
//! `siw_qp.c`, `siw_cq.c`). The protocol is kept in [`Flag`] so that the unit tests run it on
//! synthetic rings (and under miri). Positions are taken modulo the slot count the kernel gave,
//! checked at map time against the mapping's length, so no value the kernel writes moves an
//! access outside the mapping.

use super::abi::wqe::VALID;
use crate::error::{Error, Result, Verb};
use crate::sys::mapping::Mapping;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, AtomicU8, Ordering};

/// The most slots a ring may have (siw's own limits are far below: 32 Ki for queues, 64 Ki
/// for CQs on 6.1).
const MAX_SLOTS: u32 = 1 << 20;

/// A slot's flags word, as wide as the ABI has it (16 bits in send and receive slots, 8 in
/// completions).
pub(super) trait Flag {
    /// Loads the flags.
    fn load_flags(&self, order: Ordering) -> u16;
    /// Stores the flags.
    fn store_flags(&self, value: u16, order: Ordering);
}

impl Flag for AtomicU16 {
    #[inline]
    fn load_flags(&self, order: Ordering) -> u16 {
        self.load(order)
    }

    #[inline]
    fn store_flags(&self, value: u16, order: Ordering) {
        self.store(value, order)
    }
}

impl Flag for AtomicU8 {
    #[inline]
    fn load_flags(&self, order: Ordering) -> u16 {
        u16::from(self.load(order))
    }

    #[inline]
    fn store_flags(&self, value: u16, order: Ordering) {
        self.store(value as u8, order)
    }
}

/// Whether the slot whose flags are `flag` is ours to fill (producer side): VALID clear.
#[inline]
pub(super) fn free_to_fill(flag: &impl Flag) -> bool {
    flag.load_flags(Ordering::Acquire) & VALID == 0
}

/// Hands a slot we filled to the kernel: its flags, VALID among them, stored after every
/// write to the slot.
#[inline]
pub(super) fn hand_over(flag: &impl Flag, flags: u16) {
    flag.store_flags(flags | VALID, Ordering::Release);
}

/// Whether the kernel filled the slot whose flags are `flag` (consumer side): VALID set.
#[inline]
pub(super) fn ready_to_read(flag: &impl Flag) -> bool {
    flag.load_flags(Ordering::Acquire) & VALID != 0
}

/// Hands a slot we read back to the kernel: flags zero, stored after every read of the slot.
#[inline]
pub(super) fn give_back(flag: &impl Flag) {
    flag.store_flags(0, Ordering::Release);
}

/// What a ring's memory is.
pub(super) enum Backing {
    /// Mapped from the device.
    Mapped(Mapping),
    /// Synthetic, for tests and miri: 8-byte aligned words.
    #[cfg(any(test, feature = "test-support"))]
    Heap(HeapWords),
}

/// Zeroed heap words reached only through one raw pointer (a `Box` moved after a pointer into
/// it was taken would invalidate that pointer under Stacked Borrows).
#[cfg(any(test, feature = "test-support"))]
pub(super) struct HeapWords(NonNull<[u64]>);

#[cfg(any(test, feature = "test-support"))]
impl HeapWords {
    /// `n` zeroed words.
    pub(super) fn new(n: usize) -> Self {
        Self(NonNull::from(Box::leak(vec![0u64; n].into_boxed_slice())))
    }
}

#[cfg(any(test, feature = "test-support"))]
impl Drop for HeapWords {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::leak` in `new` and is freed once, here.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

impl Backing {
    fn base_and_len(&mut self) -> (NonNull<u8>, usize) {
        match self {
            Backing::Mapped(m) => {
                let len = m.len();
                (NonNull::new(m.as_mut_ptr()).unwrap_or(NonNull::dangling()), len)
            }
            #[cfg(any(test, feature = "test-support"))]
            Backing::Heap(words) => (words.0.cast(), words.0.len() * 8),
        }
    }
}

/// `count` slots of `stride` bytes from the start of the backing, then possibly a tail (the
/// CQ's control word).
pub(super) struct Slots {
    base: NonNull<u8>,
    count: u32,
    stride: usize,
    /// Bytes of the backing after the slots.
    tail: usize,
    /// Keeps the memory alive; never reached except through `base`.
    _backing: Backing,
}

// SAFETY: `Slots` owns its memory (the mapping or the heap words); the pointer is only used
// by the one owner of the `Slots`.
unsafe impl Send for Slots {}

impl Slots {
    /// Checks that `count` slots of `stride` bytes and `tail` more bytes fit in `backing`.
    pub(super) fn new(mut backing: Backing, count: u32, stride: usize, tail: usize, verb: Verb) -> Result<Self> {
        if count == 0 || count > MAX_SLOTS {
            return Err(Error::malformed(verb, format!("a ring of {count} slots")));
        }
        let (base, len) = backing.base_and_len();
        let need = (count as usize)
            .checked_mul(stride)
            .and_then(|n| n.checked_add(tail))
            .filter(|&n| n <= len);
        if need.is_none() || base.as_ptr() as usize % 8 != 0 {
            return Err(Error::malformed(
                verb,
                format!("{count} slots of {stride} bytes do not fit the {len}-byte ring"),
            ));
        }
        Ok(Self {
            base,
            count,
            stride,
            tail,
            _backing: backing,
        })
    }

    /// A synthetic ring of zeroed slots.
    #[cfg(any(test, feature = "test-support"))]
    pub(super) fn heap(count: u32, stride: usize, tail: usize) -> Self {
        let words = (count as usize * stride + tail).div_ceil(8);
        Self::new(Backing::Heap(HeapWords::new(words)), count, stride, tail, "test").unwrap_or_else(|e| panic!("{e}"))
    }

    /// How many slots.
    #[inline]
    pub(super) fn count(&self) -> u32 {
        self.count
    }

    /// The slot at position `pos` (taken modulo the slot count).
    #[inline]
    pub(super) fn slot(&self, pos: u32) -> NonNull<u8> {
        let i = (pos % self.count) as usize;
        // SAFETY: `i < count`, and `count * stride` bytes lie inside the backing (`new`).
        unsafe { self.base.add(i * self.stride) }
    }

    /// The flags word at byte `offset` of the slot at `pos`, as an atomic of type `F`.
    ///
    /// # Safety
    /// `offset` must be the offset of an `F`-sized, `F`-aligned field inside a slot.
    #[inline]
    pub(super) unsafe fn flag<F>(&self, pos: u32, offset: usize) -> &F {
        // SAFETY: per the contract the field lies inside the slot and is aligned (slots start
        // 8-aligned and strides are multiples of 8); the other side changes it only
        // atomically, and atomics may alias memory the kernel writes.
        unsafe { self.slot(pos).add(offset).cast::<F>().as_ref() }
    }

    /// The bytes after the slots (the CQ's control word).
    #[inline]
    pub(super) fn tail(&self) -> Option<NonNull<u8>> {
        // SAFETY: `count * stride + tail` bytes lie inside the backing (`new`).
        (self.tail > 0).then(|| unsafe { self.base.add(self.count as usize * self.stride) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_from_the_kernel_is_checked() {
        let words = || Backing::Heap(HeapWords::new(64));
        assert!(Slots::new(words(), 4, 120, 0, "t").is_ok());
        assert!(Slots::new(words(), 5, 120, 0, "t").is_err(), "600 > 512 bytes");
        assert!(Slots::new(words(), 0, 120, 0, "t").is_err());
        assert!(Slots::new(words(), 16, 32, 8, "t").is_err(), "520 > 512 bytes");
        assert!(Slots::new(words(), u32::MAX, usize::MAX, 0, "t").is_err(), "overflow");
        let s = Slots::new(words(), 16, 32, 0, "t").unwrap();
        assert_eq!(s.slot(16), s.slot(0), "positions wrap");
        assert!(s.tail().is_none());
    }

    #[test]
    fn the_valid_bit_passes_a_slot_back_and_forth() {
        let s = Slots::heap(2, 120, 0);
        // SAFETY: offset 8 is the 2-byte flags of a send slot.
        let f = unsafe { s.flag::<AtomicU16>(0, 8) };
        assert!(free_to_fill(f));
        hand_over(f, super::super::abi::wqe::SIGNALLED);
        assert!(!free_to_fill(f));
        assert!(ready_to_read(f));
        give_back(f);
        assert!(free_to_fill(f) && !ready_to_read(f));
        // Any other flag bit without VALID leaves the slot free.
        f.store(0xfffe, Ordering::Relaxed);
        assert!(free_to_fill(f));
    }
}
