//! What an SRQ keeps for its safe receives (`crate::owned`): the buffers it holds, each in a
//! slot its request's id names, and the QPs whose completions may give them back.
//!
//! An SRQ's receives complete in any order (whichever QP a message comes to takes the next
//! one), so a completion gives back exactly the buffer its id names, not every older one as on
//! a QP's own queue. Ids come from the same blocks as the QPs' ([`super::NEXT_BLOCK`]), so no
//! two requests in the process ever share one: a request's id has its slot in the low bits and
//! the SRQ's count of posts above them.

use super::{BLOCK_BITS, EMPTY_SGE, MAX_BLOCKS, NEXT_BLOCK, RECV_ID, SAFE_ID};
use crate::error::WrReject;
use crate::mr::Buf;
use crate::wr::Sge;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The most slots an SRQ keeps: ids keep `32 - 24` bits of each block for the count of posts.
const MAX_SLOTS: u32 = 1 << 24;

/// One slot: the buffer of the request posted there last, while the SRQ holds it.
struct Slot {
    id: u64,
    buf: Option<Buf>,
}

/// The buffers an SRQ holds for its receives, by slot.
pub(crate) struct SrqHeld {
    slots: Box<[Slot]>,
    /// The free slots are `free[..free_len]`, distinct indices into `slots` (as long as it);
    /// a post takes the last.
    free: Box<[u32]>,
    free_len: usize,
    /// How many low bits of an id name its slot.
    slot_bits: u32,
    /// The next id less its slot: [`SAFE_ID`] | [`RECV_ID`] | the current block | the count
    /// of posts in it, shifted by `slot_bits`; it grows by `step` (`1 << slot_bits`) with
    /// every post, up to `end`, the end of the block.
    next: u64,
    step: u64,
    end: u64,
    /// The QPs on the SRQ as last read from [`SrqMembers`], and that list's version.
    known: Vec<Member>,
    known_version: u64,
}

impl SrqHeld {
    /// Slots for `depth` receives (at most 2^24); no block of ids is drawn before the first
    /// post. Allocates nothing for `depth` 0.
    pub(crate) fn new(depth: u32) -> Self {
        let depth = depth.min(MAX_SLOTS);
        let slot_bits = u32::BITS - depth.saturating_sub(1).leading_zeros();
        Self {
            slots: (0..depth).map(|_| Slot { id: 0, buf: None }).collect(),
            free: (0..depth).rev().collect(),
            free_len: depth as usize,
            slot_bits,
            next: 0,
            step: 1 << slot_bits,
            end: 0,
            known: Vec::new(),
            known_version: u64::MAX,
        }
    }

    /// Puts `buf` in a free slot under a fresh id and returns the id and the buffer's SGE for
    /// the request; then `commit` once the provider took the request, or `unclaim`. `QueueFull`
    /// (and the buffer back) when every slot is taken.
    #[inline]
    #[allow(unsafe_code)] // indexes the slots unchecked
    pub(crate) fn claim(&mut self, buf: Buf) -> std::result::Result<(u64, &Sge), (WrReject, Buf)> {
        if self.free_len == 0 || (self.next == self.end && !self.next_block()) {
            return Err((WrReject::QueueFull, buf));
        }
        // SAFETY: `free_len` is at most `free.len()` and not 0 (checked above).
        let at = unsafe { *self.free.get_unchecked(self.free_len - 1) };
        let id = self.next | u64::from(at);
        self.next += self.step;
        // SAFETY: the free list holds indices into `slots` only.
        let slot = unsafe { self.slots.get_unchecked_mut(at as usize) };
        slot.id = id;
        // Free: its buffer was given back (or never there).
        std::mem::forget(slot.buf.replace(buf));
        let sge = match &slot.buf {
            Some(buf) => buf.sge(),
            // Never: just filled (and compiled away).
            None => &EMPTY_SGE,
        };
        Ok((id, sge))
    }

    /// Counts the claimed slot as held: the provider took its request.
    #[inline]
    pub(crate) fn commit(&mut self) {
        self.free_len -= 1;
    }

    /// The claimed buffer, back: the provider refused the request.
    pub(crate) fn unclaim(&mut self) -> Option<Buf> {
        let at = self.free[self.free_len - 1] as usize;
        self.slots[at].buf.take()
    }

    /// Starts a fresh block of ids; false when the process used up every block.
    #[cold]
    fn next_block(&mut self) -> bool {
        let block = NEXT_BLOCK.fetch_add(1, Ordering::Relaxed);
        if block >= MAX_BLOCKS {
            return false;
        }
        self.next = SAFE_ID | RECV_ID | block << BLOCK_BITS;
        self.end = self.next + (1 << BLOCK_BITS);
        true
    }

    /// Whether `id` has the form of a safe receive's (an SRQ's or a QP's own).
    pub(crate) fn is_recv_id(id: u64) -> bool {
        id & (SAFE_ID | RECV_ID) == SAFE_ID | RECV_ID
    }

    /// The buffer request `id` holds, if the SRQ holds one for it (each request's once).
    #[inline]
    pub(crate) fn release(&mut self, id: u64) -> Option<Buf> {
        let at = (id & ((1 << self.slot_bits) - 1)) as usize;
        let slot = self.slots.get_mut(at).filter(|s| s.id == id)?;
        let buf = slot.buf.take()?;
        self.free[self.free_len] = at as u32;
        self.free_len += 1;
        Some(buf)
    }

    /// How many buffers it holds.
    pub(crate) fn len(&self) -> usize {
        self.slots.len() - self.free_len
    }

    /// Every buffer it holds, for when the device can no longer reach them.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Buf> + '_ {
        self.free_len = self.slots.len();
        for (k, at) in self.free.iter_mut().rev().enumerate() {
            *at = k as u32;
        }
        self.slots.iter_mut().filter_map(|s| s.buf.take())
    }

    /// Whether QP `qpn`, with receive CQ `cq` (`Cq::identity`), is on the SRQ now, as
    /// `members` says; reads `members` again only when it changed (allocating only when more
    /// QPs joined than it ever saw).
    #[inline]
    pub(crate) fn knows(&mut self, members: &SrqMembers, qpn: u32, cq: usize) -> bool {
        if members.version.load(Ordering::Acquire) != self.known_version {
            self.known_version = members.copy_into(&mut self.known);
        }
        self.known
            .binary_search_by_key(&qpn, |m| m.qpn)
            .is_ok_and(|at| self.known[at].cq == cq)
    }
}

/// A QP on an SRQ: its number and its receive CQ.
#[derive(Debug, Clone, Copy)]
struct Member {
    qpn: u32,
    cq: usize,
}

/// The QPs on an SRQ, sorted by number: a QP joins when created on it and leaves once the
/// kernel destroyed it (its number may then be given to another QP).
pub(crate) struct SrqMembers {
    list: Mutex<Vec<Member>>,
    /// Changes with every join and leave.
    version: AtomicU64,
}

impl SrqMembers {
    pub(crate) fn new() -> Self {
        Self {
            list: Mutex::new(Vec::new()),
            version: AtomicU64::new(0),
        }
    }

    /// QP `qpn`, receiving on CQ `cq` (`Cq::identity`), is on the SRQ.
    pub(crate) fn join(&self, qpn: u32, cq: usize) {
        self.update(|list| {
            let at = list.partition_point(|m| m.qpn < qpn);
            list.insert(at, Member { qpn, cq });
        });
    }

    /// QP `qpn` was destroyed.
    pub(crate) fn leave(&self, qpn: u32) {
        self.update(|list| list.retain(|m| m.qpn != qpn));
    }

    fn update(&self, change: impl FnOnce(&mut Vec<Member>)) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        change(&mut list);
        self.version.fetch_add(1, Ordering::Release);
    }

    /// Copies the list into `into`; returns the version it is.
    fn copy_into(&self, into: &mut Vec<Member>) -> u64 {
        let list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        into.clone_from(&list);
        self.version.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_counts_only_while_its_qp_is_on_the_srq_with_that_receive_cq() {
        let members = SrqMembers::new();
        let mut held = SrqHeld::new(8);
        assert!(!held.knows(&members, 7, 1));
        members.join(9, 2);
        members.join(7, 1);
        members.join(8, 1);
        assert!(held.knows(&members, 7, 1) && held.knows(&members, 8, 1) && held.knows(&members, 9, 2));
        assert!(!held.knows(&members, 9, 1), "another CQ than the QP's receive CQ");
        members.leave(7);
        assert!(
            !held.knows(&members, 7, 1),
            "destroyed: its number may be another QP's now"
        );
        assert!(held.knows(&members, 8, 1));
    }

    #[test]
    fn slots_and_ids_fit_the_depth() {
        let held = SrqHeld::new(1000);
        assert_eq!((held.slot_bits, held.slots.len(), held.len()), (10, 1000, 0));
        assert_eq!(SrqHeld::new(1).slot_bits, 0);
        assert!(SrqHeld::is_recv_id(SAFE_ID | RECV_ID | 5));
        assert!(!SrqHeld::is_recv_id(SAFE_ID | 5) && !SrqHeld::is_recv_id(5));
    }
}
