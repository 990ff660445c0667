//! The ring's index protocol under loom: every interleaving (within loom's preemption bound)
//! of the user side and a kernel side running in another thread, on a 4-slot ring that wraps
//! several times. Slots are loom `UnsafeCell`s, so an entry read before it was published, or
//! overwritten before it was released, is a causality violation loom reports.
//!
//! The user side is the library's own [`ProdIndex`]/[`ConsIndex`], unchanged: only the
//! [`Word`] they go through is loom's atomic instead of a mapped one. The kernel side follows
//! `drivers/infiniband/sw/rxe/rxe_queue.h` (`load_acquire` of the other side's index,
//! `store_release` of its own).
//!
//! Built only with `RUSTFLAGS="--cfg loom"`: `cargo xtask loom`.

use super::{ConsIndex, ProdIndex, Word};
use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU32;
use loom::sync::Arc;
use std::sync::atomic::Ordering;

impl Word for AtomicU32 {
    fn load(&self, order: Ordering) -> u32 {
        AtomicU32::load(self, order)
    }

    fn store(&self, value: u32, order: Ordering) {
        AtomicU32::store(self, value, order)
    }
}

/// A word whose stores are all Relaxed: a deliberately broken publish, to show the model
/// notices a missing Release.
struct RelaxedStores<'a>(&'a AtomicU32);

impl Word for RelaxedStores<'_> {
    fn load(&self, order: Ordering) -> u32 {
        self.0.load(order)
    }

    fn store(&self, value: u32, _: Ordering) {
        self.0.store(value, Ordering::Relaxed)
    }
}

const MASK: u32 = 3;
/// Entries through the 4-slot ring (3 usable): it fills and wraps.
const ENTRIES: u64 = 5;

struct Ring {
    producer: AtomicU32,
    consumer: AtomicU32,
    slots: [UnsafeCell<u64>; 4],
}

impl Ring {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            producer: AtomicU32::new(0),
            consumer: AtomicU32::new(0),
            slots: std::array::from_fn(|_| UnsafeCell::new(u64::MAX)),
        })
    }

    fn write(&self, index: u32, value: u64) {
        // SAFETY: loom checks the access; the pointer is to the cell's own value.
        self.slots[index as usize].with_mut(|p| unsafe { *p = value });
    }

    fn read(&self, index: u32) -> u64 {
        // SAFETY: as in `write`.
        self.slots[index as usize].with(|p| unsafe { *p })
    }
}

/// The kernel filling a completion queue (`rxe_cq_post`, but waiting instead of reporting an
/// overrun).
fn kernel_produce(ring: &Ring, n: u64) {
    let mut prod = ring.producer.load(Ordering::Relaxed);
    for v in 0..n {
        let next = (prod + 1) & MASK;
        while next == ring.consumer.load(Ordering::Acquire) & MASK {
            loom::thread::yield_now();
        }
        ring.write(prod, v);
        prod = next;
        ring.producer.store(prod, Ordering::Release);
    }
}

/// The kernel draining a send or receive queue (the requester's / responder's
/// `queue_head` + `queue_advance_consumer`).
fn kernel_consume(ring: &Ring, n: u64) {
    let mut cons = ring.consumer.load(Ordering::Relaxed);
    let mut want = 0;
    while want < n {
        if ring.producer.load(Ordering::Acquire) & MASK == cons {
            loom::thread::yield_now();
            continue;
        }
        assert_eq!(ring.read(cons), want, "each entry once, in order");
        want += 1;
        cons = (cons + 1) & MASK;
        ring.consumer.store(cons, Ordering::Release);
    }
}

/// The library consuming (a CQ poll), releasing at most `per_release` entries at a time (1 is
/// a batch that stops early).
fn user_consume(ring: &Ring, per_release: u32, publish: &impl Word) {
    let mut idx = ConsIndex::new(MASK, &ring.consumer);
    let mut want = 0;
    while want < ENTRIES {
        let ready = idx.ready(&ring.producer);
        assert!(ready <= MASK);
        let take = ready.min(per_release);
        for i in 0..take {
            assert_eq!(
                ring.read(idx.unmasked(i) & MASK),
                want,
                "each completion once, in order"
            );
            want += 1;
        }
        if take > 0 {
            idx.release(take, publish);
        } else {
            loom::thread::yield_now();
        }
    }
    assert_eq!(idx.ready(&ring.producer), 0, "nothing invented");
}

/// The library producing (post_send / post_recv), up to `per_publish` entries per doorbell.
fn user_produce(ring: &Ring, per_publish: u32, publish: &impl Word) {
    let mut idx = ProdIndex::new(MASK, &ring.producer, &ring.consumer);
    let mut v = 0;
    while v < ENTRIES {
        let mut wrote = 0;
        while wrote < per_publish && v < ENTRIES {
            let Some(slot) = idx.next_free(&ring.consumer) else {
                break;
            };
            ring.write(slot, v);
            idx.advance();
            v += 1;
            wrote += 1;
        }
        if wrote > 0 {
            idx.publish(publish);
        } else {
            loom::thread::yield_now();
        }
    }
}

/// Runs `f` under loom (preemption bound 3 unless `LOOM_MAX_PREEMPTIONS` says otherwise) and
/// prints how many interleavings it explored.
fn model(name: &str, f: impl Fn() + Send + Sync + 'static) {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    let before = RUNS.load(Ordering::Relaxed);
    builder.check(move || {
        RUNS.fetch_add(1, Ordering::Relaxed);
        f()
    });
    println!(
        "loom: {name}: {} interleavings explored, all passed",
        RUNS.load(Ordering::Relaxed) - before
    );
}

#[test]
fn loom_cq_consumer_against_kernel_producer() {
    for per_release in [1, 3] {
        model(&format!("CQ, release {per_release} at a time"), move || {
            let ring = Ring::new();
            let kernel = {
                let ring = ring.clone();
                loom::thread::spawn(move || kernel_produce(&ring, ENTRIES))
            };
            user_consume(&ring, per_release, &ring.consumer);
            kernel.join().unwrap();
        });
    }
}

#[test]
fn loom_sq_producer_against_kernel_consumer() {
    for per_publish in [1, 2] {
        model(&format!("SQ/RQ, {per_publish} per doorbell"), move || {
            let ring = Ring::new();
            let kernel = {
                let ring = ring.clone();
                loom::thread::spawn(move || kernel_consume(&ring, ENTRIES))
            };
            user_produce(&ring, per_publish, &ring.producer);
            kernel.join().unwrap();
        });
    }
}

/// The model has teeth: the same producer with its publish weakened to Relaxed lets the
/// kernel read a slot the user's write is not ordered before, and loom says so.
#[test]
#[should_panic(expected = "Causality violation")]
fn loom_notices_a_relaxed_publish() {
    model("broken publish", || {
        let ring = Ring::new();
        let kernel = {
            let ring = ring.clone();
            loom::thread::spawn(move || kernel_consume(&ring, ENTRIES))
        };
        user_produce(&ring, 1, &RelaxedStores(&ring.producer));
        kernel.join().unwrap();
    });
}

/// And on the consumer side: a Relaxed release lets the kernel overwrite a slot the user is
/// not yet done reading.
#[test]
#[should_panic(expected = "Causality violation")]
fn loom_notices_a_relaxed_release() {
    model("broken release", || {
        let ring = Ring::new();
        let kernel = {
            let ring = ring.clone();
            loom::thread::spawn(move || kernel_produce(&ring, ENTRIES))
        };
        user_consume(&ring, 3, &RelaxedStores(&ring.consumer));
        kernel.join().unwrap();
    });
}
