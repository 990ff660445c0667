//! Memory shared with the device: page-aligned ring buffers, doorbell records carved out of
//! per-context pages, and the UAR pages mapped from the device file.

use crate::error::{Error, Result, Verb};
use crate::sys::mapping::Mapping;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes per doorbell record slot: libmlx5 gives each a cache line.
const DB_SLOT: usize = 64;

/// Page-aligned, zeroed memory the device reads or writes (a CQE or WQE ring). The kernel
/// pins it from the create command until the destroy; it is unmapped on drop, which the core
/// orders after the destroy.
pub(super) struct Buffer {
    /// Keeps the mapping; reached only through `base`.
    _map: Mapping,
    base: NonNull<u8>,
}

// SAFETY: the buffer is plain memory; every access through `base` is made by the one owner
// of the ring it holds (poster or poller, ordered by the protocols in cq.rs and qp.rs).
unsafe impl Send for Buffer {}
// SAFETY: as above; shared access only reads or writes through atomics or under the CQ lock.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// `len` bytes (rounded up to whole pages by the kernel's mmap), not inherited by forks,
    /// faulted in writable now (`MAP_POPULATE`), as libmlx5's `memset` of its buffers does:
    /// the kernel pins pages that exist, and the first lap of the ring takes no page faults
    /// in the data path (one per 64 send WQEs otherwise, each ~150 ns a post on the model).
    pub(super) fn new(len: usize, verb: Verb) -> Result<Self> {
        // The device keeps writing to these pages: a forked child gets zeroed ones (`Mapping`).
        let mut map =
            Mapping::anon(len, !cfg!(miri)).map_err(|e| Error::io(format!("{verb}: allocating {len} bytes"), e))?;
        let base = NonNull::new(map.as_mut_ptr()).ok_or_else(|| Error::malformed(verb, "mmap returned null"))?;
        Ok(Self { _map: map, base })
    }

    pub(super) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// The address the driver request carries.
    pub(super) fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }
}

/// A page of doorbell record slots.
struct DbPage {
    buf: Buffer,
    /// Bit `i` set: slot `i` is taken.
    used: u64,
}

/// The context's doorbell record pages (the kernel pins each page once per context).
pub(super) struct DbPages {
    page_size: usize,
    pages: Mutex<Vec<DbPage>>,
}

impl DbPages {
    pub(super) fn new(page_size: usize) -> Self {
        Self {
            page_size,
            pages: Mutex::new(Vec::new()),
        }
    }

    /// Slots per page (at most 64, the bits of `used`).
    fn slots(&self) -> usize {
        (self.page_size / DB_SLOT).clamp(1, 64)
    }

    /// A zeroed doorbell record.
    pub(super) fn alloc(self: &Arc<Self>, verb: Verb) -> Result<Doorbell> {
        let slots = self.slots();
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        let found = pages
            .iter()
            .enumerate()
            .find_map(|(p, page)| (0..slots).find(|s| page.used & 1 << s == 0).map(|s| (p, s)));
        let (page, slot) = match found {
            Some(at) => at,
            None => {
                pages.push(DbPage {
                    buf: Buffer::new(self.page_size, verb)?,
                    used: 0,
                });
                (pages.len() - 1, 0)
            }
        };
        pages[page].used |= 1 << slot;
        // SAFETY: `slot < slots`, so the slot's 8 bytes lie inside the page; the page stays
        // mapped as long as `self`, which the doorbell keeps.
        let words = unsafe { pages[page].buf.base().add(slot * DB_SLOT) }.cast::<AtomicU32>();
        let db = Doorbell {
            words,
            pages: self.clone(),
            page,
            slot,
        };
        db.set(0, 0);
        db.set(1, 0);
        Ok(db)
    }
}

/// A doorbell record: two big-endian words the device reads (CQ: consumer index and arm;
/// QP: receive and send counters). Its slot is freed on drop.
pub(super) struct Doorbell {
    words: NonNull<AtomicU32>,
    pages: Arc<DbPages>,
    page: usize,
    slot: usize,
}

// SAFETY: the record is two atomics in a page that lives as long as `pages`.
unsafe impl Send for Doorbell {}
// SAFETY: as above; all access is atomic.
unsafe impl Sync for Doorbell {}

impl Doorbell {
    /// Stores `value` big-endian into word `word` (0 or 1) with Release: the ring writes before
    /// it reach memory first.
    pub(super) fn set(&self, word: usize, value: u32) {
        // SAFETY: the record has two 4-aligned words; `word & 1` stays inside it.
        let w = unsafe { &*self.words.as_ptr().add(word & 1) };
        w.store(value.to_be(), Ordering::Release);
    }

    /// Word `word` in host order.
    #[cfg(any(test, feature = "test-support"))]
    pub(super) fn get(&self, word: usize) -> u32 {
        // SAFETY: as in `set`.
        let w = unsafe { &*self.words.as_ptr().add(word & 1) };
        u32::from_be(w.load(Ordering::Acquire))
    }

    /// The address the driver request carries.
    pub(super) fn addr(&self) -> u64 {
        self.words.as_ptr() as u64
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        let mut pages = self.pages.pages.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(page) = pages.get_mut(self.page) {
            page.used &= !(1 << self.slot);
        }
    }
}

/// A UAR page mapped from the device file: doorbells are 8-byte stores into it.
pub(super) struct UarPage {
    /// Keeps the mapping; reached only through `base`.
    _map: Mapping,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: device registers, written only with single 8-byte volatile stores.
unsafe impl Send for UarPage {}
// SAFETY: as above; an aligned 8-byte store is one bus write, whoever makes it.
unsafe impl Sync for UarPage {}

impl UarPage {
    pub(super) fn new(mut map: Mapping) -> Option<Self> {
        let len = map.len();
        let base = NonNull::new(map.as_mut_ptr())?;
        Some(Self { _map: map, base, len })
    }

    /// Whether an 8-byte doorbell fits at `offset`.
    pub(super) fn fits(&self, offset: usize) -> bool {
        offset % 8 == 0 && offset.checked_add(8).is_some_and(|end| end <= self.len)
    }

    /// The page's first byte: for registers whose offsets were checked with [`Self::fits`]
    /// once, written while the page is mapped (`Ctx::bfreg`).
    pub(super) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Stores `bytes` (already in the device's byte order) at `offset` as one 8-byte write;
    /// an offset that does not fit is ignored (offsets are checked when they are chosen).
    pub(super) fn write64(&self, offset: usize, bytes: [u8; 8]) {
        if !self.fits(offset) {
            return;
        }
        // SAFETY: `fits` keeps the 8 aligned bytes inside the mapping.
        unsafe {
            self.base
                .as_ptr()
                .add(offset)
                .cast::<u64>()
                .write_volatile(u64::from_ne_bytes(bytes))
        };
    }
}

/// The barrier around a write to a UAR page, which the kernel may map write-combining:
/// before it, the WQEs and doorbell records in memory are ordered ahead of it; after it, the
/// write leaves the write-combining buffer. rdma-core's `mmio_wc_start` and
/// `mmio_flush_writes`, which libmlx5 puts on both sides of each doorbell: `sfence` on
/// x86-64 (the only architecture this provider builds for: `mod.rs`). A compiler barrier too
/// (an `asm!` without `nomem`).
#[inline(always)]
pub(super) fn mmio_fence() {
    #[cfg(not(miri))]
    // SAFETY: a store fence: no operands, no memory of ours changed; SSE is in x86_64's
    // baseline.
    unsafe {
        std::arch::asm!("sfence", options(nostack, preserves_flags))
    };
    #[cfg(miri)]
    std::sync::atomic::fence(Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbell_slots_are_reused_and_pages_added() {
        let pages = Arc::new(DbPages::new(4096));
        let first: Vec<Doorbell> = (0..64).map(|_| pages.alloc("test").unwrap()).collect();
        assert_eq!(first[1].addr() - first[0].addr(), 64);
        let extra = pages.alloc("test").unwrap();
        assert_eq!(extra.addr() % 4096, 0, "a new page");
        let freed = first[5].addr();
        drop(first);
        let again = pages.alloc("test").unwrap();
        assert!(again.addr() <= freed);
        again.set(1, 0x1234_5678);
        assert_eq!(again.get(1), 0x1234_5678);
        // SAFETY: the record's second word, big-endian in memory.
        let raw = unsafe { *(again.addr() as *const [u8; 8]) };
        assert_eq!(&raw[4..], &[0x12, 0x34, 0x56, 0x78]);
    }
}
