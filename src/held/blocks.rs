//! Where the safe posts' request ids come from: runs of id values no request in the process
//! ever had, each given to one queue at a time. A run is a fresh block of 2^36 values, or what
//! a dropped queue left unused of its run: queues that come and go (a server's connections)
//! would otherwise use up the 2^26 blocks, a block for each queue's first post.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A block is 2^36 values: a queue draws a new run only while it holds nothing (`Held`), so
/// the end of a run makes a busy queue drain once (a receive queue kept full runs empty), and
/// runs are at least half a block: at most once in 2^35 requests (9.5 hours at a million a
/// second). Every value is below 2^62 (the two bits above are the ids' kind), and so is every
/// end: the kind bits plus a run's end (or its oldest id plus a queue's depth) never
/// overflow.
pub(super) const BLOCK_BITS: u32 = 36;
const MAX_BLOCKS: u64 = (1 << (62 - BLOCK_BITS)) - 1;
/// The shortest run kept when a queue gives it back: half a block.
const MIN_SPARE: u64 = 1 << (BLOCK_BITS - 1);
/// The most runs kept at once (16 bytes each); beyond that what a queue leaves is lost.
const MAX_SPARES: usize = 1 << 16;

/// Id values `start..end`, none of them given to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Run {
    pub(super) start: u64,
    pub(super) end: u64,
}

/// The process's id values: blocks not handed out yet, and runs given back.
pub(super) struct Blocks {
    next: AtomicU64,
    spare: Mutex<Vec<Run>>,
}

/// The one source every queue draws from.
pub(super) static BLOCKS: Blocks = Blocks::new();

impl Blocks {
    const fn new() -> Self {
        Self {
            next: AtomicU64::new(0),
            spare: Mutex::new(Vec::new()),
        }
    }

    /// A run for one queue: one given back if there is one, else a fresh block; `None` once
    /// every block was handed out and none is given back.
    pub(super) fn draw(&self) -> Option<Run> {
        if let Some(run) = self.spare.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Some(run);
        }
        let block = self.next.fetch_add(1, Ordering::Relaxed);
        (block < MAX_BLOCKS).then(|| Run {
            start: block << BLOCK_BITS,
            end: (block + 1) << BLOCK_BITS,
        })
    }

    /// Takes back the values `run` of a queue that gives none of them to a request any more
    /// (dropped): a later `draw` hands them to another queue.
    pub(super) fn give_back(&self, run: Run) {
        if run.end.saturating_sub(run.start) < MIN_SPARE {
            return;
        }
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if spare.len() < MAX_SPARES {
            spare.push(run);
        }
    }

    /// Takes back the ids `next..end` (kind bits `kind` on both) of a queue dropped with
    /// them unused.
    pub(super) fn give_back_ids(&self, kind: u64, next: u64, end: u64) {
        if next < end {
            self.give_back(Run {
                start: next - kind,
                end: end - kind,
            });
        }
    }

    /// How many fresh blocks were asked for.
    #[cfg(test)]
    pub(super) fn drawn(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_given_back_is_drawn_again_before_a_fresh_block() {
        let blocks = Blocks::new();
        let first = blocks.draw().unwrap();
        assert_eq!(
            first,
            Run {
                start: 0,
                end: 1 << BLOCK_BITS
            }
        );
        // A queue that took 5 ids gives back the rest; the next queue starts there.
        let rest = Run {
            start: 5,
            end: first.end,
        };
        blocks.give_back(rest);
        assert_eq!(blocks.draw(), Some(rest));
        // Shorter than half a block, too short to keep: the next draw is a fresh block.
        blocks.give_back(Run {
            start: first.end - MIN_SPARE + 1,
            end: first.end,
        });
        assert_eq!(
            blocks.draw(),
            Some(Run {
                start: 1 << BLOCK_BITS,
                end: 2 << BLOCK_BITS
            })
        );
        assert_eq!(blocks.drawn(), 2);
    }

    #[test]
    fn the_last_block_is_below_the_kind_bits_and_then_there_are_none() {
        let blocks = Blocks::new();
        blocks.next.store(MAX_BLOCKS - 1, Ordering::Relaxed);
        let last = blocks.draw().unwrap();
        assert_eq!(last.end, (1 << 62) - (1 << BLOCK_BITS));
        // A receive id (both kind bits) at the end, plus the largest depth (a `u32` power of
        // two), still fits.
        let kind = 3 << 62;
        let end = u64::checked_add(kind, last.end).and_then(|e| e.checked_add(1 << 31));
        assert!(end.is_some());
        assert_eq!(blocks.draw(), None);
        // One given back still serves.
        blocks.give_back(Run { start: 7, end: 1 << 40 });
        assert_eq!(blocks.draw(), Some(Run { start: 7, end: 1 << 40 }));
        assert_eq!(blocks.draw(), None);
    }

    #[test]
    fn at_most_max_spares_runs_are_kept() {
        let blocks = Blocks::new();
        for k in 0..MAX_SPARES as u64 + 5 {
            blocks.give_back(Run {
                start: k << BLOCK_BITS,
                end: (k + 1) << BLOCK_BITS,
            });
        }
        assert_eq!(blocks.spare.lock().unwrap().len(), MAX_SPARES);
    }
}
