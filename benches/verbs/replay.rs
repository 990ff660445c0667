//! The drain replayed (workloads `drain_replay` and `drain_floor`): the device fills a CQ ring
//! once, then the harness offers the same completions again and again by advancing the ring's
//! producer index itself, so that each timed drain has no kernel or device work under it and
//! any number of drains run in one process. benches/c/verbs_bench.c does the same on the C
//! provider; docs/benchmarks.md says what it showed.
//!
//! This knows rxe's ring layout (`struct rxe_queue_buf`, the kernel's
//! `include/uapi/rdma/rdma_user_rxe.h`): it is a measuring tool beside the provider, not a
//! second provider.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use uverbs::{WcStatus, WorkCompletion};

/// Byte offsets in the ring's header, and of its first slot.
const LOG2_SLOT: usize = 0x0;
const INDEX_MASK: usize = 0x4;
const PRODUCER: usize = 0x80;
const CONSUMER: usize = 0x100;
const SLOTS: usize = 0x180;

/// One rxe CQ ring, mapped by the provider under test (which keeps it mapped while its CQ
/// lives: the caller keeps the CQ).
pub struct Ring {
    header: *mut u8,
    mask: u32,
    log2_slot: u32,
    producer: Cell<u32>,
}

impl Ring {
    /// Waits (up to 30 s) until exactly one of this process's rxe mappings is a CQ ring holding
    /// `ready` completions, none consumed, and returns it.
    pub fn wait_full(ready: u32) -> Result<Self, String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = Self::full_rings(ready)?;
            match found.len() {
                1 => return Ok(found.into_iter().next().expect("one")),
                0 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                0 => return Err(format!("no rxe CQ ring came to hold {ready} completions")),
                n => return Err(format!("{n} rxe rings look like the CQ under test")),
            }
        }
    }

    /// The shared, writable mappings of `/dev/infiniband/uverbs*` (rxe maps only queue rings
    /// there) whose header says: `ready` produced, none consumed.
    fn full_rings(ready: u32) -> Result<Vec<Self>, String> {
        let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| format!("/proc/self/maps: {e}"))?;
        let mut found = Vec::new();
        for line in maps.lines().filter(|l| l.contains("/dev/infiniband/uverbs")) {
            let mut f = line.split_whitespace();
            let (Some(range), Some(perms)) = (f.next(), f.next()) else {
                continue;
            };
            let Some((lo, hi)) = range.split_once('-') else {
                continue;
            };
            let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) else {
                continue;
            };
            if !perms.starts_with("rw") || hi - lo < SLOTS {
                continue;
            }
            let ring = Self {
                header: lo as *mut u8,
                mask: 0,
                log2_slot: 0,
                producer: Cell::new(0),
            };
            let (log2_slot, mask) = (
                ring.word(LOG2_SLOT).load(Ordering::Relaxed),
                ring.word(INDEX_MASK).load(Ordering::Relaxed),
            );
            let fits = (5..=12).contains(&log2_slot)
                && (mask as u64 + 1).is_power_of_two()
                && ((mask as u64 + 1) << log2_slot) + SLOTS as u64 <= (hi - lo) as u64;
            if fits
                && mask >= ready
                && ring.word(PRODUCER).load(Ordering::Acquire) == ready
                && ring.word(CONSUMER).load(Ordering::Relaxed) == 0
            {
                found.push(Self {
                    mask,
                    log2_slot,
                    producer: Cell::new(ready),
                    ..ring
                });
            }
        }
        Ok(found)
    }

    /// One 32-bit index of the header.
    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: `header` starts a live shared mapping at least SLOTS bytes long (checked by
        // `full_rings`), and the offset is one of the header's aligned index words.
        unsafe { &*(self.header.add(offset) as *const AtomicU32) }
    }

    fn slot(&self, index: u32) -> *mut u8 {
        // SAFETY: `full_rings` checked that all `mask + 1` slots lie in the mapping.
        unsafe {
            self.header
                .add(SLOTS + (((index & self.mask) as usize) << self.log2_slot))
        }
    }

    /// Copies the first `ready` completions over every other slot, so that any run of `ready`
    /// slots starting at a multiple of `ready` reads as the first one did (`ready` divides the
    /// ring's power-of-two size).
    pub fn fill(&self, ready: u32) {
        for i in ready..=self.mask {
            // SAFETY: both are whole slots of the ring, distinct because `i >= ready`.
            unsafe { std::ptr::copy_nonoverlapping(self.slot(i % ready), self.slot(i), 1 << self.log2_slot) };
        }
    }

    /// Makes `n` more completions ready, as the device would: one release store of the
    /// producer index.
    pub fn offer(&self, n: u32) {
        self.producer.set(self.producer.get().wrapping_add(n) & self.mask);
        self.word(PRODUCER).store(self.producer.get(), Ordering::Release);
    }
}

/// The fewest instructions a poll of this ring can take: the whole poll inlined into the drain
/// loop, the layout as constants, no fork check, no choice of provider at run time. The
/// library cannot be this (its core does not know the vendor's layout, and it is fork-safe);
/// the distance between the two is what those cost. (A plain copy of the ring's geometry, so
/// that the compiler keeps it in registers.)
pub struct Floor<'a> {
    header: *mut u8,
    mask: u32,
    log2_slot: u32,
    consumer: u32,
    _ring: PhantomData<&'a Ring>,
}

impl<'a> Floor<'a> {
    pub fn new(ring: &'a Ring) -> Self {
        Self {
            header: ring.header,
            mask: ring.mask,
            log2_slot: ring.log2_slot,
            consumer: ring.word(CONSUMER).load(Ordering::Relaxed),
            _ring: PhantomData,
        }
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: as `Ring::word`: the ring outlives `'a`.
        unsafe { &*(self.header.add(offset) as *const AtomicU32) }
    }

    #[inline(always)]
    pub fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
        let produced = self.word(PRODUCER).load(Ordering::Acquire);
        let ready = (produced.wrapping_sub(self.consumer) & self.mask) as usize;
        if ready == 0 {
            return 0;
        }
        let n = ready.min(wc.len());
        if n != 1 {
            return self.take(wc, n);
        }
        self.copy_one(&mut wc[0]);
        self.word(CONSUMER).store(self.consumer, Ordering::Release);
        1
    }

    #[inline(never)]
    fn take(&mut self, wc: &mut [WorkCompletion], n: usize) -> usize {
        for out in &mut wc[..n] {
            self.copy_one(out);
        }
        self.word(CONSUMER).store(self.consumer, Ordering::Release);
        n
    }

    #[inline(always)]
    fn copy_one(&mut self, out: &mut WorkCompletion) {
        // SAFETY: the slot is in the ring (`consumer <= mask`) and ready (the producer index
        // passed it); its first 48 bytes are the kernel's `struct ib_uverbs_wc`, the layout
        // of `WorkCompletion`.
        unsafe {
            let slot = self.header.add(SLOTS + ((self.consumer as usize) << self.log2_slot));
            std::ptr::copy_nonoverlapping(slot as *const WorkCompletion, out, 1);
        }
        self.consumer = (self.consumer + 1) & self.mask;
    }
}

/// Checks the last completion of a replayed drain of `got`.
pub fn check_drain(got: usize, want: usize, last: &WorkCompletion) -> Result<(), String> {
    if got != want {
        return Err(format!("replayed drain took {got} of {want}"));
    }
    if last.wr_id != want as u64 - 1 || last.status != WcStatus::SUCCESS {
        return Err(format!(
            "replayed drain: last completion {} {:?}",
            last.wr_id, last.status
        ));
    }
    Ok(())
}
