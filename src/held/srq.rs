//! What an SRQ keeps for its safe receives (`crate::owned`): the buffers it holds, each in a
//! slot its request's id names, and the QPs whose completions may give them back.
//!
//! An SRQ's receives complete in any order (whichever QP a message comes to takes the next
//! one), so a completion gives back exactly the buffer its id names, not every older one as on
//! a QP's own queue. Ids come from the same source as the QPs' ([`super::blocks`]) and grow by
//! one with every post within a run, so no two requests in the process ever share one; a
//! request's slot is its id's low bits (the slots are a ring, a power of two long). A post
//! takes the slot of the next id; if that slot still holds the buffer of a receive not given
//! back yet, the id is passed over (never used) and the next one tried.

use super::blocks::BLOCKS;
use super::{EMPTY_SGE, RECV_ID, SAFE_ID};
use crate::error::WrReject;
use crate::mr::Buf;
use crate::wr::Sge;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The most slots an SRQ keeps (its depth rounded up to a power of two, capped).
const MAX_SLOTS: u32 = 1 << 24;
/// The kind bits of an SRQ's ids: a safe receive's.
const KIND: u64 = SAFE_ID | RECV_ID;

/// The buffers an SRQ holds for its receives, by slot.
pub(crate) struct SrqHeld {
    /// The buffer of the request posted in each slot last, while the SRQ holds it, its
    /// request's id kept with it ([`Buf::request`]). A power of two long, or empty (no safe
    /// receives: `claim` always refuses).
    slots: Box<[Option<Buf>]>,
    /// `slots.len() - 1` (0 when empty).
    mask: u64,
    /// The next id: [`KIND`] plus a value of the current run; up to `end`, the end of the run
    /// (0 and 0 before the first post).
    next: u64,
    end: u64,
    /// The QPs on the SRQ as last read from [`SrqMembers`], and that list's version.
    known: Vec<Member>,
    known_version: u64,
}

impl SrqHeld {
    /// Slots for `depth` receives (rounded up to a power of two, at most 2^24); no run of
    /// ids is drawn before the first post. Allocates nothing for `depth` 0.
    pub(crate) fn new(depth: u32) -> Self {
        let len = if depth == 0 {
            0
        } else {
            depth.min(MAX_SLOTS).next_power_of_two()
        };
        Self {
            slots: (0..len).map(|_| None).collect(),
            mask: u64::from(len.saturating_sub(1)),
            next: 0,
            end: 0,
            known: Vec::new(),
            known_version: u64::MAX,
        }
    }

    /// Puts `buf` in the slot of a fresh id and returns the id and the buffer's SGE for the
    /// request; then `commit` once the provider took the request, or `unclaim`. `QueueFull`
    /// (and the buffer back) when every slot holds a buffer.
    #[inline]
    #[allow(unsafe_code)] // indexes the slots unchecked
    pub(crate) fn claim(&mut self, buf: Buf) -> std::result::Result<(u64, &Sge), (WrReject, Buf)> {
        if self.next == self.end {
            if let Err(reason) = self.next_run() {
                return Err((reason, buf));
            }
        }
        let at = (self.next & self.mask) as usize;
        // SAFETY: past the check above the slots are not empty (`next_run` refuses then),
        // so `mask` is their length less one (a power of two) and `at` is in the ring.
        if unsafe { self.slots.get_unchecked(at) }.is_some() {
            return self.claim_passing(buf);
        }
        // SAFETY: as above.
        let slot = unsafe { self.slots.get_unchecked_mut(at) };
        Ok(fill(slot, self.next, buf))
    }

    /// `claim` when the next id's slot still holds a buffer.
    #[cold]
    fn claim_passing(&mut self, buf: Buf) -> std::result::Result<(u64, &Sge), (WrReject, Buf)> {
        match self.pass_held() {
            Ok(at) => Ok(fill(&mut self.slots[at], self.next, buf)),
            Err(reason) => Err((reason, buf)),
        }
    }

    /// The next id's slot holds a buffer: passes over ids (never used) to the first whose slot
    /// is free and returns that slot; `QueueFull` when every slot holds one.
    #[cold]
    fn pass_held(&mut self) -> std::result::Result<usize, WrReject> {
        for _ in 0..self.slots.len() {
            self.next += 1;
            if self.next == self.end {
                self.next_run()?;
            }
            let at = (self.next & self.mask) as usize;
            if self.slots[at].is_none() {
                return Ok(at);
            }
        }
        Err(WrReject::QueueFull)
    }

    /// Counts the claimed id as used: the provider took its request.
    #[inline]
    pub(crate) fn commit(&mut self) {
        self.next += 1;
    }

    /// The claimed buffer, back: the provider refused the request (its id was never given
    /// to the device; the next post takes it again).
    pub(crate) fn unclaim(&mut self) -> Option<Buf> {
        let at = (self.next & self.mask) as usize;
        self.slots.get_mut(at)?.take()
    }

    /// Draws a new run of ids (one given back, or a fresh block); `QueueFull` when there are
    /// no slots or the process used up every block.
    #[cold]
    fn next_run(&mut self) -> std::result::Result<(), WrReject> {
        if self.slots.is_empty() {
            return Err(WrReject::QueueFull);
        }
        let run = BLOCKS.draw().ok_or(WrReject::QueueFull)?;
        self.next = KIND + run.start;
        self.end = KIND + run.end;
        Ok(())
    }

    /// Whether `id` has the form of a safe receive's (an SRQ's or a QP's own).
    pub(crate) fn is_recv_id(id: u64) -> bool {
        id & KIND == KIND
    }

    /// The buffer request `id` holds, if the SRQ holds one for it (each request's once).
    #[inline]
    pub(crate) fn release(&mut self, id: u64) -> Option<Buf> {
        let slot = self.slots.get_mut((id & self.mask) as usize)?;
        slot.take_if(|buf| buf.request() == id)
    }

    /// How many buffers it holds.
    pub(crate) fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Every buffer it holds, for when the device can no longer reach them.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Buf> + '_ {
        self.slots.iter_mut().filter_map(Option::take)
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

impl Drop for SrqHeld {
    /// Gives back the ids of the SRQ's run that no request had, for another queue.
    fn drop(&mut self) {
        BLOCKS.give_back_ids(KIND, self.next, self.end);
    }
}

/// Puts `buf` in the free `slot` under `id`; returns the id and the SGE of the buffer's whole
/// capacity, for the receive.
#[inline]
fn fill(slot: &mut Option<Buf>, id: u64, mut buf: Buf) -> (u64, &Sge) {
    buf.set_request(id);
    // Free: its buffer was given back (or never there).
    std::mem::forget(slot.replace(buf));
    let sge = match slot {
        Some(buf) => buf.whole_sge(),
        // Never: just filled (and compiled away).
        None => &EMPTY_SGE,
    };
    (id, sge)
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
    fn slots_are_a_ring_of_the_depth_rounded_up() {
        let held = SrqHeld::new(1000);
        assert_eq!((held.mask, held.slots.len(), held.len()), (1023, 1024, 0));
        assert_eq!(SrqHeld::new(1).mask, 0);
        assert!(SrqHeld::new(0).slots.is_empty());
        assert!(SrqHeld::is_recv_id(SAFE_ID | RECV_ID | 5));
        assert!(!SrqHeld::is_recv_id(SAFE_ID | 5) && !SrqHeld::is_recv_id(5));
    }
}
