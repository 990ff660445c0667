//! The buffers one of a QP's queues holds for the safe posts (`crate::owned`), oldest
//! first, with the ids of their requests: ids grow with every post, in blocks handed out
//! once each in the process, so no two requests ever share one.

use crate::error::WrReject;
use crate::mr::Buf;
use std::sync::atomic::{AtomicU64, Ordering};

/// Set in every id given to a request here; a raw post must not use such `wr_id`s on a QP
/// with buffers posted here (see `Qp::post_send`).
const SAFE_ID: u64 = 1 << 63;
/// Set in the ids of receive requests.
const RECV_ID: u64 = 1 << 62;
/// Ids come in blocks of 2^32, handed out once each in the process.
const BLOCK_BITS: u32 = 32;
const MAX_BLOCKS: u64 = 1 << (62 - BLOCK_BITS);
static NEXT_BLOCK: AtomicU64 = AtomicU64::new(0);

struct Slot {
    id: u64,
    buf: Option<Buf>,
}

/// The buffers one of a QP's queues holds, oldest first, with the ids of their requests.
pub(crate) struct Held {
    slots: Box<[Slot]>,
    /// The oldest held buffer's slot.
    head: usize,
    len: usize,
    /// The next request's id, and the end of the block it comes from.
    next: u64,
    end: u64,
    /// [`SAFE_ID`], and [`RECV_ID`] for a receive queue.
    kind: u64,
}

impl Held {
    /// Room for `depth` buffers (rounded up to a power of two).
    pub(crate) fn new(depth: u32, recv: bool) -> Self {
        let cap = if depth == 0 {
            0
        } else {
            depth.next_power_of_two() as usize
        };
        Self {
            slots: (0..cap).map(|_| Slot { id: 0, buf: None }).collect(),
            head: 0,
            len: 0,
            next: 0,
            end: 0,
            kind: SAFE_ID | if recv { RECV_ID } else { 0 },
        }
    }

    /// Takes `buf` for request `self.next` (returned), if there is room; the post then calls
    /// `commit`, or `unclaim` if the provider refused it.
    #[inline]
    pub(crate) fn claim(&mut self, buf: Buf) -> std::result::Result<u64, (WrReject, Buf)> {
        // One branch for both rare cases.
        if (self.len == self.slots.len()) | (self.next == self.end) {
            return self.claim_cold(buf);
        }
        Ok(self.put(buf))
    }

    #[cold]
    fn claim_cold(&mut self, buf: Buf) -> std::result::Result<u64, (WrReject, Buf)> {
        if self.len == self.slots.len() {
            return Err((WrReject::QueueFull, buf));
        }
        if let Err(e) = self.new_block() {
            return Err((e, buf));
        }
        Ok(self.put(buf))
    }

    #[inline]
    fn put(&mut self, buf: Buf) -> u64 {
        let at = (self.head + self.len) & (self.slots.len() - 1);
        let slot = &mut self.slots[at];
        slot.id = self.next;
        // The slot is free (`len` is below the capacity): nothing to drop.
        std::mem::forget(slot.buf.replace(buf));
        self.next
    }

    #[inline]
    pub(crate) fn commit(&mut self) {
        self.len += 1;
        self.next += 1;
    }

    pub(crate) fn unclaim(&mut self) -> Buf {
        let at = (self.head + self.len) & (self.slots.len() - 1);
        self.slots[at].buf.take().expect("claimed just before")
    }

    /// The id for a request that holds no buffer (an inline send).
    #[inline]
    pub(crate) fn bare_id(&mut self) -> std::result::Result<u64, WrReject> {
        if self.next == self.end {
            self.new_block()?;
        }
        let id = self.next;
        self.next += 1;
        Ok(id)
    }

    #[cold]
    fn new_block(&mut self) -> std::result::Result<(), WrReject> {
        let block = NEXT_BLOCK.fetch_add(1, Ordering::Relaxed);
        if block >= MAX_BLOCKS {
            // 2^30 blocks of 2^32 requests each: never in practice, but never reused.
            return Err(WrReject::QueueFull);
        }
        self.next = self.kind | block << BLOCK_BITS;
        self.end = self.next + (1 << BLOCK_BITS);
        Ok(())
    }

    /// How many buffers it holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether this is a receive queue's.
    pub(crate) fn is_recv(&self) -> bool {
        self.kind & RECV_ID != 0
    }

    /// Whether `id` is one of this queue's (possibly already given back).
    pub(crate) fn owns(&self, id: u64) -> bool {
        id & (SAFE_ID | RECV_ID) == self.kind
    }

    /// The oldest held buffer, if its request is at or before `id`.
    pub(crate) fn release(&mut self, id: u64) -> Option<(u64, Buf)> {
        if self.len == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let slot = &mut self.slots[self.head];
        if slot.id > id {
            return None;
        }
        let buf = slot.buf.take()?;
        let held_id = slot.id;
        self.head = (self.head + 1) & mask;
        self.len -= 1;
        Some((held_id, buf))
    }
}
