//! A spin lock for the data path, as rdma-core's rxe provider takes a `pthread_spin_lock`
//! around each poll and post: uncontended, locking is one compare-exchange and unlocking one
//! store, with no poisoning to track.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// How many times a waiter spins before it starts yielding its CPU between tries (the holder
/// may be in a system call, such as a `modify_qp`, or descheduled).
const SPINS: u32 = 100;

/// A `T` that one thread at a time can use, through [`SpinLock::lock`].
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock gives one thread at a time access to `value`, so sharing a `SpinLock<T>`
// only moves the use of `T` from thread to thread: `T: Send` is enough, as for `Mutex`.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// An unlocked lock around `value`.
    pub const fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Waits until no other thread holds the lock, then holds it until the guard drops.
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        match self.try_lock() {
            Some(guard) => guard,
            None => self.lock_contended(),
        }
    }

    /// Takes the lock if no other thread holds it.
    #[inline]
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        // A guard is made only on success: dropping one unlocks.
        let taken = self
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        taken.then(|| SpinGuard {
            lock: self,
            _value: PhantomData,
        })
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) -> SpinGuard<'_, T> {
        let mut spins = 0;
        loop {
            // Plain loads until it looks free, so waiters do not keep taking the cache line
            // from the holder; then one try.
            while self.locked.load(Ordering::Relaxed) {
                if spins < SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if let Some(guard) = self.try_lock() {
                return guard;
            }
        }
    }

    /// Takes the lock for a holder whose hold spans C calls (the extended poll and post
    /// interfaces: `ibv_start_poll` to `ibv_end_poll`, `ibv_wr_start` to `ibv_wr_complete`):
    /// no guard; [`SpinLock::unlock_held`] releases it.
    #[inline]
    pub fn lock_held(&self) {
        std::mem::forget(self.lock());
    }

    /// The value, while held by [`SpinLock::lock_held`].
    ///
    /// # Safety
    /// The caller must hold the lock (taken by [`SpinLock::lock_held`]) and stop using the
    /// pointer before [`SpinLock::unlock_held`].
    #[inline]
    pub unsafe fn held_value(&self) -> *mut T {
        self.value.get()
    }

    /// Releases a lock taken by [`SpinLock::lock_held`].
    ///
    /// # Safety
    /// The caller must hold it, taken by [`SpinLock::lock_held`].
    #[inline]
    pub unsafe fn unlock_held(&self) {
        // Release, as a guard's drop.
        self.locked.store(false, Ordering::Release);
    }

    /// The value, lock and all consumed (no other thread can hold it).
    pub fn into_inner(self) -> T {
        self.value.into_inner()
    }
}

/// Access to the `T` of a held [`SpinLock`]; dropping it unlocks.
///
/// It behaves as a `&mut T` (the marker): shared between threads only if `T: Sync`.
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    _value: PhantomData<&'a mut T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so no other thread touches `value` until it drops.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Release: what the holder wrote is visible to the next thread whose Acquire takes it.
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::SpinLock;

    #[test]
    fn threads_hammering_one_lock_lose_no_update() {
        const THREADS: usize = 8;
        const ROUNDS: usize = if cfg!(miri) { 100 } else { 20_000 };
        // Two fields written apart inside the lock: a thread that got in without it would
        // see them differ, or lose increments.
        let lock = SpinLock::new((0usize, 0usize));
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..ROUNDS {
                        let mut g = lock.lock();
                        assert_eq!(g.0, g.1);
                        g.0 += 1;
                        std::hint::spin_loop();
                        g.1 += 1;
                    }
                });
            }
        });
        assert_eq!(lock.into_inner(), (THREADS * ROUNDS, THREADS * ROUNDS));
    }

    #[test]
    fn try_lock_fails_while_held_and_leaves_the_lock_held() {
        let lock = SpinLock::new(());
        let held = lock.lock();
        assert!(lock.try_lock().is_none());
        assert!(lock.try_lock().is_none());
        drop(held);
        assert!(lock.try_lock().is_some());
    }

    #[test]
    fn a_held_lock_is_released_by_unlock_held() {
        let lock = SpinLock::new(1);
        lock.lock_held();
        assert!(lock.try_lock().is_none());
        // SAFETY: held by `lock_held` above; the pointer is not used after the unlock.
        unsafe {
            *lock.held_value() += 1;
            lock.unlock_held();
        }
        assert_eq!(*lock.lock(), 2);
    }

    #[test]
    fn a_dropped_guard_unlocks() {
        let lock = SpinLock::new(1);
        *lock.lock() += 1;
        *lock.lock() += 1;
        assert_eq!(*lock.lock(), 3);
    }
}
