//! The send buffer as a ring (rsocket's `sbuf`, with `sbuf_bytes_avail`): each data message
//! takes the next bytes after the last one's, as many as it carries, and gives them back when
//! its send completes. Sends complete in the order they were posted, so the bytes come back
//! in ring order too, and the free space is one run of bytes, cut in two where it wraps from
//! the buffer's end to its start.
//!
//! rsockets gathers a message that wraps into two SGEs; here a message is one [`Buf`] (one
//! SGE), so one that would wrap ends at the buffer's end and the next starts at its start.

use crate::mr::Buf;
use std::collections::VecDeque;

/// A piece of the send buffer: [`Buf`], or a range in the tests.
pub(crate) trait Piece {
    /// Its bytes.
    fn capacity(&self) -> usize;
    /// Moves the first `n` bytes of `from` to the end of `self`, if `self` ends where `from`
    /// starts or is empty ([`Buf::take_front`]).
    fn take_front(&mut self, from: &mut Self, n: usize) -> bool;
}

impl Piece for Buf {
    #[inline]
    fn capacity(&self) -> usize {
        Buf::capacity(self)
    }

    #[inline]
    fn take_front(&mut self, from: &mut Self, n: usize) -> bool {
        Buf::take_front(self, from, n)
    }
}

/// The send ring: the free pieces in ring order from the head, and empty handles that taken
/// bytes go out in.
pub(crate) struct SendRing<P> {
    /// The free bytes, the first at the head: at most two pieces (the wrap cuts the run).
    free: VecDeque<P>,
    /// Empty pieces, one for each message that may be in flight.
    spare: Vec<P>,
    /// Free bytes in all (`sbuf_bytes_avail`).
    avail: usize,
}

impl<P: Piece> SendRing<P> {
    /// A ring over `whole` (all of the send buffer), with `handles` empty pieces of it: at most
    /// that many messages are out at once.
    pub(crate) fn new(whole: P, handles: Vec<P>) -> Self {
        let avail = whole.capacity();
        let mut free = VecDeque::with_capacity(4);
        if avail > 0 {
            free.push_back(whole);
        }
        Self {
            free,
            spare: handles,
            avail,
        }
    }

    /// Free bytes in all.
    #[cfg(test)]
    pub(crate) fn avail(&self) -> usize {
        self.avail
    }

    /// Whether [`SendRing::take`] would give a piece.
    #[inline]
    pub(crate) fn can_take(&self) -> bool {
        !self.free.is_empty() && !self.spare.is_empty()
    }

    /// The next at most `max` bytes after the head (fewer where the buffer ends), as a piece
    /// of its own; `None` when no byte is free, `max` is 0 or every handle is out.
    #[inline]
    pub(crate) fn take(&mut self, max: usize) -> Option<P> {
        let front = self.free.front_mut()?;
        let n = max.min(front.capacity());
        if n == 0 {
            return None;
        }
        let mut piece = self.spare.pop()?;
        if !piece.take_front(front, n) {
            // Not a piece of this buffer: nothing moved.
            self.spare.push(piece);
            return None;
        }
        if front.capacity() == 0 {
            if let Some(empty) = self.free.pop_front() {
                self.spare.push(empty);
            }
        }
        self.avail -= n;
        Some(piece)
    }

    /// A piece [`SendRing::take`] gave, back from the device (the oldest one out).
    #[inline]
    pub(crate) fn give_back(&mut self, mut piece: P) {
        let n = piece.capacity();
        self.avail += n;
        if let Some(last) = self.free.back_mut() {
            if n > 0 && last.take_front(&mut piece, n) {
                self.spare.push(piece);
                return;
            }
        }
        if n == 0 {
            self.spare.push(piece);
        } else {
            // The first free bytes after the wrap, or after a time with none free.
            self.free.push_back(piece);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range of a buffer of its own: the accounting without a device.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Range {
        start: usize,
        len: usize,
    }

    impl Piece for Range {
        fn capacity(&self) -> usize {
            self.len
        }

        fn take_front(&mut self, from: &mut Self, n: usize) -> bool {
            if n > from.len || (self.len != 0 && self.start + self.len != from.start) {
                return false;
            }
            if self.len == 0 {
                self.start = from.start;
            }
            self.len += n;
            from.start += n;
            from.len -= n;
            true
        }
    }

    fn ring(size: usize, handles: usize) -> SendRing<Range> {
        SendRing::new(Range { start: 0, len: size }, vec![Range { start: 0, len: 0 }; handles])
    }

    const KIB: usize = 1024;

    /// The old send buffer, 256 KiB in 64 KiB pieces, had room for 4 messages whatever their
    /// size; the ring holds as many as their bytes allow.
    #[test]
    fn small_messages_fill_the_whole_ring() {
        let mut r = ring(256 * KIB, 130);
        let mut out = Vec::new();
        while let Some(p) = r.take(4 * KIB) {
            out.push(p);
        }
        assert_eq!(out.len(), 64);
        assert_eq!(r.avail(), 0);
        assert!(!r.can_take());
        for (i, p) in out.iter().enumerate() {
            assert_eq!(
                *p,
                Range {
                    start: i * 4 * KIB,
                    len: 4 * KIB
                }
            );
        }
        // One back, one more out: the bytes the oldest had.
        r.give_back(out.remove(0));
        assert_eq!(r.avail(), 4 * KIB);
        assert_eq!(r.take(64 * KIB), Some(Range { start: 0, len: 4 * KIB }));
    }

    /// Messages out at once are limited by the handles too (one for each send queue entry).
    #[test]
    fn handles_bound_the_messages_out() {
        let mut r = ring(256 * KIB, 3);
        assert!(r.take(100).is_some() && r.take(100).is_some() && r.take(100).is_some());
        assert_eq!(r.take(100), None);
        assert_eq!(r.avail(), 256 * KIB - 300);
    }

    /// A message never spans the buffer's end: it stops there and the next starts at 0, once
    /// the bytes there came back.
    #[test]
    fn a_message_stops_where_the_buffer_ends() {
        let mut r = ring(10_000, 8);
        let a = r.take(4000).unwrap();
        let b = r.take(4000).unwrap();
        assert_eq!(r.take(4000), Some(Range { start: 8000, len: 2000 }));
        assert_eq!(r.take(1), None, "all out");
        r.give_back(a);
        r.give_back(b);
        assert_eq!(r.avail(), 8000);
        assert_eq!(r.take(9000), Some(Range { start: 0, len: 8000 }));
    }

    /// Random sizes, completions in order: the pieces out never overlap, lie in the buffer,
    /// and the free count is what is not out.
    #[test]
    fn pieces_out_are_disjoint_and_counted() {
        let size = 65_536 + 123;
        let mut r = ring(size, 40);
        let mut out: VecDeque<Range> = VecDeque::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut moved = 0;
        for _ in 0..20_000 {
            if next() % 3 != 0 {
                let max = 1 + (next() % 20_000) as usize;
                if let Some(p) = r.take(max) {
                    assert!(p.len >= 1 && p.len <= max && p.start + p.len <= size);
                    moved += p.len;
                    out.push_back(p);
                } else {
                    assert!(r.avail() == 0 || out.len() >= 38, "refused with {} free", r.avail());
                }
            } else if let Some(p) = out.pop_front() {
                r.give_back(p);
            }
            let mut spans: Vec<_> = out.iter().map(|p| (p.start, p.start + p.len)).collect();
            spans.sort();
            assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "overlap: {spans:?}");
            assert_eq!(r.avail() + out.iter().map(|p| p.len).sum::<usize>(), size);
            assert!(r.free.len() <= 2);
        }
        assert!(moved > 50 * size, "the ring went round: {moved}");
    }
}
