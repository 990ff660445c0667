//! The lock between a CQ's one poller and the threads that link QPs to it or scrub it.
//!
//! A poll takes it on every call, a QP only at create, RESET and destroy. So the poller's
//! side is made cheap: it announces itself with a plain store, orders that store before its
//! look at the lock with a compiler-only fence, and leaves with a plain store: no
//! read-modify-write and no fence instruction (each costs more than the rest of an empty
//! poll). The other side takes the lock with a compare-exchange and then runs
//! `membarrier(2)`, a full barrier on every running thread of the process, before it reads
//! whether the poller is inside: the two sides are then ordered as if the poller had fenced
//! too (Dekker's store-then-load on each side), and the one who comes second backs off.
//! Where the kernel has no expedited membarrier (or under Miri), both sides use
//! `fence(SeqCst)` instead, the textbook form of the same protocol.

use crate::sys::membarrier;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, Ordering};

pub(in crate::providers::mlx5) struct Gate {
    /// The poller is inside (or deciding whether to go in).
    polling: AtomicBool,
    /// Another thread holds the lock (or is waiting for the poller to leave).
    held: AtomicBool,
    /// `membarrier(2)` works in this process: the poller fences for the compiler only.
    asymmetric: bool,
}

impl Gate {
    pub(in crate::providers::mlx5) fn new() -> Self {
        Self {
            polling: AtomicBool::new(false),
            held: AtomicBool::new(false),
            asymmetric: membarrier::available(),
        }
    }

    /// The poller's entry: `true` when it is in, `false` (at once) when another thread holds
    /// the lock. A `true` is ended by [`Gate::leave`].
    ///
    /// # Safety
    /// At most one thread uses `try_enter` and `leave` of a gate at a time (the CQ's poller:
    /// two pollers inside at once would both get in).
    #[inline(always)]
    pub(in crate::providers::mlx5) unsafe fn try_enter(&self) -> bool {
        self.polling.store(true, Ordering::Relaxed);
        if self.asymmetric {
            // The store above stays before the load below in the program; the holder's
            // membarrier keeps them in that order on the processor too.
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        // Acquire: a holder's writes, released by `unlock`, are seen.
        if self.held.load(Ordering::Acquire) {
            self.polling.store(false, Ordering::Release);
            return false;
        }
        true
    }

    /// [`Gate::try_enter`], waiting (yielding) while another thread holds the lock.
    ///
    /// # Safety
    /// As for [`Gate::try_enter`].
    pub(in crate::providers::mlx5) unsafe fn enter(&self) {
        // SAFETY: the caller's contract.
        while !unsafe { self.try_enter() } {
            std::thread::yield_now();
        }
    }

    /// The poller leaves: its accesses happen before those of the next holder.
    #[inline(always)]
    pub(in crate::providers::mlx5) fn leave(&self) {
        self.polling.store(false, Ordering::Release);
    }

    /// Takes the lock from any thread but the poller, waiting for other holders and then for
    /// the poller to leave. Ended by [`Gate::unlock`].
    pub(in crate::providers::mlx5) fn lock(&self) {
        while self
            .held
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        if self.asymmetric {
            membarrier::barrier();
        } else {
            fence(Ordering::SeqCst);
        }
        // Acquire: the poller's accesses, released by `leave`, are seen.
        while self.polling.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
    }

    /// Lets the lock go (after [`Gate::lock`]).
    pub(in crate::providers::mlx5) fn unlock(&self) {
        self.held.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::UnsafeCell;
    use std::sync::Arc;

    /// A counter only the gate guards: the poller and the lockers each add to it with a
    /// plain read and write, so two inside at once would lose additions (and Miri, which
    /// runs this too, would report the data race).
    struct Guarded {
        gate: Gate,
        count: UnsafeCell<u64>,
    }

    // SAFETY: `count` is only touched inside the gate.
    unsafe impl Sync for Guarded {}

    fn bump(g: &Guarded) {
        // SAFETY: called inside the gate only.
        unsafe { *g.count.get() += 1 };
    }

    #[test]
    fn the_poller_and_the_lockers_never_overlap() {
        let rounds: u64 = if cfg!(miri) { 20 } else { 100_000 };
        let lockers = 2;
        let g = Arc::new(Guarded {
            gate: Gate::new(),
            count: UnsafeCell::new(0),
        });
        let threads: Vec<_> = (0..lockers)
            .map(|_| {
                let g = g.clone();
                std::thread::spawn(move || {
                    for _ in 0..rounds / 10 {
                        g.gate.lock();
                        bump(&g);
                        g.gate.unlock();
                    }
                })
            })
            .collect();
        let mut polled = 0;
        while polled < rounds {
            // SAFETY: this thread is the gate's only poller.
            if unsafe { g.gate.try_enter() } {
                bump(&g);
                g.gate.leave();
                polled += 1;
            }
        }
        for t in threads {
            t.join().unwrap();
        }
        g.gate.lock();
        // SAFETY: inside the gate.
        let count = unsafe { *g.count.get() };
        g.gate.unlock();
        assert_eq!(count, rounds + lockers * (rounds / 10));
    }

    #[test]
    fn a_held_lock_turns_the_poller_away_and_waiting_gets_in_after() {
        let g = Arc::new(Gate::new());
        g.lock();
        // SAFETY: this thread is the only poller.
        assert!(!unsafe { g.try_enter() }, "held: the poller does not get in");
        let waiter = {
            let g = g.clone();
            // SAFETY: the spawned thread is the only poller from here on.
            std::thread::spawn(move || unsafe { g.enter() })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!waiter.is_finished(), "the poller waits for the holder");
        g.unlock();
        waiter.join().unwrap();
        let locker = {
            let g = g.clone();
            std::thread::spawn(move || {
                g.lock();
                g.unlock();
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!locker.is_finished(), "a locker waits for the poller inside");
        g.leave();
        locker.join().unwrap();
    }
}
