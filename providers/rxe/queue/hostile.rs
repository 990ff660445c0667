//! Hostile rings: bytes (from a fuzzer, or from a seeded generator in the unit tests) become a
//! ring header and a sequence of moves by a kernel that lies: producer and consumer indices
//! out of range, headers rewritten after validation, garbage in the slots, element sizes and
//! slot counts that do not fit the mapping. The real `Queue`, `Producer` and `Consumer`
//! run against it; the harness checks that validation fails with a typed error or every access
//! stays inside the ring, that published indices stay in range, and that nothing panics (a
//! panic is a finding: the fuzzer reports it as a crash).
//!
//! Used by `queue.rs`'s unit tests (thousands of seeded cases, also under miri) and by the
//! cargo-fuzz target in `fuzz/`, which reaches [`run`] as `uverbs::testing::hostile::run`
//! (feature `test-support`).

use super::{header_word, off, Backing, Consumer, HeapRing, Line, Producer, Queue};
use crate::error::Error;
use crate::testing::FuzzInput;
use std::fmt;
use std::sync::atomic::Ordering;

/// What a run saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Inputs run.
    pub cases: u64,
    /// Headers accepted by `Queue::new`.
    pub accepted: u64,
    /// Headers rejected with `Error::Malformed`.
    pub rejected: u64,
    /// Hostile index or header writes by the "kernel".
    pub hostile_writes: u64,
    /// Slots the user side wrote (producer) or read (consumer), each bounds-checked.
    pub slots_touched: u64,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "hostile rings: {} cases, {} headers rejected with a typed error, {} accepted; {} hostile index/header/slot writes; {} slot accesses, all inside the ring",
            self.cases, self.rejected, self.accepted, self.hostile_writes, self.slots_touched
        )
    }
}

/// The ring memory as the kernel sees it: raw, through the same header offsets.
struct Kernel {
    base: *mut u8,
    len: usize,
}

impl Kernel {
    fn of(q: &Queue) -> Self {
        Self {
            base: q.base.as_ptr(),
            len: q.len,
        }
    }

    fn store(&self, offset: usize, value: u32) {
        // SAFETY: header offsets are 4-aligned and below `DATA <= len` (checked by `Queue::new`).
        unsafe { header_word(std::ptr::NonNull::new_unchecked(self.base), offset) }.store(value, Ordering::Release);
    }

    /// Garbage into `n` bytes at `at` of the data area, clipped to the mapping.
    fn scribble(&self, at: usize, n: usize, byte: u8) {
        let start = off::DATA + at % (self.len - off::DATA + 1);
        let n = n.min(self.len - start);
        // SAFETY: `start..start + n` lies inside the mapping; no reference into it is live
        // (the harness is single-threaded and holds no slot borrows across moves).
        unsafe { std::ptr::write_bytes(self.base.add(start), byte, n) };
    }

    /// Checks that a slot handed out lies inside the data area.
    fn check_slot(&self, slot: *const u8, elem: usize) {
        let (lo, hi) = (self.base as usize + off::DATA, self.base as usize + self.len);
        let at = slot as usize;
        assert!(
            at >= lo && at.checked_add(elem).is_some_and(|end| end <= hi),
            "slot {at:#x}+{elem} outside the ring {lo:#x}..{hi:#x}"
        );
    }
}

/// A ring header from the input: mostly consistent with the buffer, a quarter arbitrary.
fn backing(input: &mut FuzzInput<'_>) -> (Backing, usize) {
    let mode = input.u8();
    let (log2, mask, data_bytes) = if mode % 4 != 3 {
        let log2 = u32::from(input.u8() % 9); // 1..256-byte slots
        let slots = 1u32 << (input.u8() % 7); // 1..64 slots
        let spare = usize::from(input.u8() % 4) * 64;
        (log2, slots - 1, ((slots as usize) << log2) + spare)
    } else {
        let log2 = match input.u8() % 4 {
            0 => input.u32(),
            _ => u32::from(input.u8() % 24),
        };
        let mask = match input.u8() % 4 {
            0 => input.u32(),
            1 => (1u32 << (input.u8() % 32)).wrapping_sub(1),
            _ => u32::from(input.u8()),
        };
        (log2, mask, usize::from(input.u8()) * 64)
    };
    // The mapping may be shorter than the header: from no data area at all to a few bytes
    // short of what the header claims.
    let short = match input.u8() % 8 {
        0 => data_bytes + off::DATA,
        1 => usize::from(input.u8()),
        _ => 0,
    };
    let bytes = (off::DATA + data_bytes).saturating_sub(short);
    let lines = bytes.div_ceil(64).max(1);
    let mut buf = vec![Line([0; 16]); lines].into_boxed_slice();
    buf[0].0[0] = log2;
    buf[0].0[1] = mask;
    // Usually an entry size the slots can hold; sometimes one they cannot.
    let min_elem = match input.u8() % 8 {
        0..=4 => usize::from(input.u8()) % ((1usize << log2.min(12)) + 1),
        5 => 48,
        6 => 208 + 16 * usize::from(input.u8() % 4),
        _ => usize::from(input.u8()) * 4,
    };
    (Backing::Heap(HeapRing::new(buf)), min_elem)
}

/// Runs one input. Panics only on a finding.
pub fn run(data: &[u8]) -> Stats {
    let mut input = FuzzInput::new(data);
    let mut stats = Stats {
        cases: 1,
        ..Stats::default()
    };
    let (backing, min_elem) = backing(&mut input);
    let queue = match Queue::new(backing, "fuzz", min_elem) {
        Ok(q) => q,
        Err(Error::Malformed { .. }) => {
            stats.rejected = 1;
            return stats;
        }
        Err(e) => panic!("untyped rejection: {e:?}"),
    };
    stats.accepted = 1;
    let elem = queue.elem_size();
    let slots = u64::from(queue.mask) + 1;
    assert!(elem >= min_elem, "slot of {elem} bytes for entries of {min_elem}");
    assert!(off::DATA as u64 + (slots << queue.log2_elem) <= queue.len as u64);
    let kernel = Kernel::of(&queue);
    let mask = queue.mask;
    let mut side = if input.u8() & 1 == 0 {
        Side::Producer(Producer::new(queue))
    } else {
        Side::Consumer(Consumer::new(queue))
    };
    let mut moves = 0;
    while !input.is_empty() && moves < 512 {
        moves += 1;
        match input.u8() % 8 {
            0 => kernel.store(off::PRODUCER_INDEX, input.u32()),
            1 => kernel.store(off::CONSUMER_INDEX, input.u32()),
            2 => {
                kernel.store(off::LOG2_ELEM_SIZE, input.u32());
                kernel.store(off::INDEX_MASK, input.u32());
            }
            3 => {
                let (at, n, byte) = (input.u32() as usize, usize::from(input.u8()) * 4, input.u8());
                kernel.scribble(at, n, byte);
            }
            _ => {
                stats.slots_touched += match &mut side {
                    Side::Producer(p) => produce(p, &kernel, elem, u32::from(input.u8() % 16)),
                    Side::Consumer(c) => consume(c, &kernel, elem, input.u8()),
                };
                continue;
            }
        }
        stats.hostile_writes += 1;
    }
    // Whatever the kernel did, the indices we published are in range.
    let ours = match &side {
        Side::Producer(p) => p.index.index(),
        Side::Consumer(c) => c.index.index(),
    };
    assert!(ours <= mask, "our index {ours} beyond mask {mask:#x}");
    stats
}

enum Side {
    Producer(Producer),
    Consumer(Consumer),
}

/// Posts up to `n` entries of `elem` bytes, as `post_send`/`post_recv` do.
fn produce(p: &mut Producer, kernel: &Kernel, elem: usize, n: u32) -> u64 {
    let mut posted = 0;
    for _ in 0..n {
        let Some(slot) = p.next_slot() else { break };
        kernel.check_slot(slot.as_ptr(), elem);
        // SAFETY: a free slot of `elem` bytes inside the ring (checked just above; under miri
        // or ASan an access outside the allocation would also be caught).
        unsafe { std::ptr::write_bytes(slot.as_ptr(), 0xa5, elem) };
        p.advance();
        posted += 1;
    }
    if posted > 0 {
        p.publish();
    }
    let published = p.queue.producer().load(Ordering::Relaxed);
    assert!(posted == 0 || published <= p.queue.mask, "published {published:#x}");
    posted
}

/// Reads every ready entry (at most 64), then releases `release % (ready + 1)` of them, as a
/// CQ poll or batch does.
fn consume(c: &mut Consumer, kernel: &Kernel, elem: usize, release: u8) -> u64 {
    let ready = c.ready();
    assert!(
        ready <= c.queue.mask,
        "{ready} ready in a ring of {} slots",
        c.queue.mask + 1
    );
    let mut sum = 0u8;
    for i in 0..ready.min(64) {
        let slot = c.entry(i);
        kernel.check_slot(slot.as_ptr(), elem);
        // SAFETY: a ready slot of `elem` bytes inside the ring (checked just above).
        let bytes = unsafe { std::slice::from_raw_parts(slot.as_ptr(), elem) };
        sum = bytes.iter().fold(sum, |s, &b| s.wrapping_add(b));
    }
    std::hint::black_box(sum);
    let n = u32::from(release) % (ready + 1);
    c.release(n);
    let published = c.queue.consumer().load(Ordering::Relaxed);
    assert!(published <= c.queue.mask, "published {published:#x}");
    u64::from(ready.min(64))
}

/// `cases` inputs from a seeded generator (splitmix64), of 8 to 520 bytes each.
#[cfg(test)]
pub(crate) fn run_many(seed: u64, cases: u64) -> Stats {
    let mut rng = crate::testing::Rng::new(seed);
    let mut total = Stats::default();
    let mut data = Vec::new();
    for _ in 0..cases {
        let len = 8 + rng.below(512) as usize;
        data.clear();
        while data.len() < len {
            data.extend_from_slice(&rng.next_u64().to_le_bytes());
        }
        data.truncate(len);
        let s = run(&data);
        total.cases += s.cases;
        total.accepted += s.accepted;
        total.rejected += s.rejected;
        total.hostile_writes += s.hostile_writes;
        total.slots_touched += s.slots_touched;
    }
    total
}
