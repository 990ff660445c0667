//! What events ask of every object: CQs, QPs and SRQs are named in completion and async
//! events by their C pointer, so each is allocated before the kernel object exists
//! ([`Slot`]), and destroying one waits until the program has acknowledged every event the
//! kernel reported for it ([`destroy_core`], [`wait_for_acks`]).

use crate::abi::{ibv_srq, verbs_cq, verbs_qp};
use crate::spin::SpinLock;
use std::mem::MaybeUninit;
use uverbs::EventsReported;

/// Heap room for a C object whose address is needed before the object can be built: CQs,
/// QPs and SRQs are created in the kernel with their C pointer as user handle, because
/// libibverbs turns the handle of a completion or async event straight back into the
/// `struct ibv_cq *` (`ibv_qp *`, `ibv_srq *`) it gives the program.
pub(crate) struct Slot<T>(Box<MaybeUninit<T>>);

impl<T> Slot<T> {
    pub(crate) fn new() -> Self {
        Self(Box::new(MaybeUninit::uninit()))
    }

    /// The address the object will have, as a kernel user handle.
    pub(crate) fn user_handle(&self) -> u64 {
        self.0.as_ptr() as u64
    }

    /// Moves `value` in and hands the object over to C. Dropping an unfilled slot just frees
    /// the memory.
    pub(crate) fn fill(mut self, value: T) -> *mut T {
        self.0.write(value);
        // `MaybeUninit<T>` has `T`'s layout, and the value is initialized: the pointer can be
        // turned back into a `Box<T>` by `Box::from_raw`.
        Box::into_raw(self.0).cast::<T>()
    }
}

/// Initializes a pthread mutex and condition variable libibverbs will use.
///
/// # Safety
/// Both must point at writable, unused storage.
pub(crate) unsafe fn init_sync(mutex: *mut libc::pthread_mutex_t, cond: *mut libc::pthread_cond_t) {
    // SAFETY: per the contract; default attributes.
    unsafe {
        libc::pthread_mutex_init(mutex, std::ptr::null());
        libc::pthread_cond_init(cond, std::ptr::null());
    }
}

// The C halves and counters of a CQ, QP or SRQ need no drop: once its `uverbs` half has been
// moved out by `destroy_core`, the C object is freed as `MaybeUninit` memory.
const _: () = assert!(
    !std::mem::needs_drop::<verbs_cq>() && !std::mem::needs_drop::<verbs_qp>() && !std::mem::needs_drop::<ibv_srq>()
);

/// Destroys the `uverbs` half of a C object explicitly (`destroy` is `Cq::destroy`,
/// `Qp::destroy` or `Srq::destroy`), returning the events the kernel reported for it. On
/// failure the object is put back where it was, so the C object stays intact.
///
/// # Safety
/// `field` must point at the initialized `uverbs` half of a live C object that no other thread
/// uses (libibverbs' contract for destroys). On `Ok` the field has been moved out: the caller
/// must free the C object without dropping the field again.
pub(crate) unsafe fn destroy_core<T>(
    field: *mut SpinLock<T>,
    destroy: impl FnOnce(T) -> Result<EventsReported, (T, uverbs::Error)>,
) -> Result<EventsReported, uverbs::Error> {
    // SAFETY: per the contract the field is initialized and ours alone; it is written back
    // below on failure, and the caller never reads it again on success.
    let core = unsafe { field.read() }.into_inner();
    destroy(core).map_err(|(core, e)| {
        // SAFETY: the same field, whose value was moved out above; nothing saw the gap.
        unsafe { field.write(SpinLock::new(core)) };
        e
    })
}

/// What `ibv_cmd_destroy_cq` (`_qp`, `_srq`) do after the kernel destroyed the object: lock its
/// `mutex` and wait on its `cond` until each counter in `counts` equals its number, i.e. until
/// the program has acknowledged as many events as the kernel reported (libibverbs'
/// `ibv_ack_cq_events` and `ibv_ack_async_event` add to those counters under that mutex and
/// signal the cond), so no thread still holding an event for the object touches freed memory.
///
/// # Safety
/// `mutex` and `cond` must be initialized, and they and the counters live, until this returns.
pub(crate) unsafe fn wait_for_acks(
    mutex: *mut libc::pthread_mutex_t,
    cond: *mut libc::pthread_cond_t,
    counts: &[(*const u32, u32)],
) {
    // SAFETY: per the contract. The counters are read with the mutex held, as their writers
    // hold it, and through raw pointers, as other threads write them.
    unsafe {
        libc::pthread_mutex_lock(mutex);
        while counts.iter().any(|&(counter, n)| counter.read() != n) {
            libc::pthread_cond_wait(cond, mutex);
        }
        libc::pthread_mutex_unlock(mutex);
    }
}
