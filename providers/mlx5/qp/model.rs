//! The state a QP's poster and its CQ's poller share, under loom: every interleaving (within
//! loom's preemption bound) of a posting thread and a polling thread, on a send queue of 2
//! basic blocks and a receive queue of 2 slots that both wrap.
//!
//! The poster and the poller are the library's own [`QpShared`] methods, unchanged: only its
//! [`Cells`] are loom's, the counters loom atomics and the table entries loom `UnsafeCell`s,
//! so an entry the poller reads while the poster may be rewriting it (or the reverse) is a
//! causality violation loom reports, as it would be for plain memory.
//!
//! The device runs in the polling thread: it learns of requests from the doorbell record
//! (which post_send stores with Release after the SeqCst fence, and the device reads before
//! it fetches the WQEs) and its CQEs go straight to the poll, as a CQE whose owner byte the
//! poll loads with Acquire does: the hardware orders nothing more between the two threads.
//! The CQ ring itself is not modelled here (`cq.rs`'s tests and the fuzz target cover it).
//!
//! Built only with `RUSTFLAGS="--cfg loom"`: `cargo xtask loom`.

use super::shared::{Cells, Entry, QpShared, Word};
use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU32;
use loom::sync::Arc;
use std::sync::atomic::Ordering;

impl Word for AtomicU32 {
    fn new(value: u32) -> Self {
        AtomicU32::new(value)
    }

    fn load(&self, order: Ordering) -> u32 {
        AtomicU32::load(self, order)
    }

    fn store(&self, value: u32, order: Ordering) {
        AtomicU32::store(self, value, order)
    }
}

impl<T: Copy + Default> Entry<T> for UnsafeCell<T> {
    fn new() -> Self {
        UnsafeCell::new(T::default())
    }

    fn get(&self) -> T {
        // SAFETY: loom checks the access; the pointer is to the cell's own value.
        self.with(|p| unsafe { *p })
    }

    fn set(&self, value: T) {
        // SAFETY: as in `get`.
        self.with_mut(|p| unsafe { *p = value })
    }
}

/// Loom's cells.
struct Model;

impl Cells for Model {
    type Counter = AtomicU32;
    type WrId = UnsafeCell<u64>;
    type Request = UnsafeCell<u32>;
}

/// A counter whose stores are all Relaxed: a deliberately broken publish, to show the model
/// notices a missing Release.
struct RelaxedStores(AtomicU32);

impl Word for RelaxedStores {
    fn new(value: u32) -> Self {
        Self(AtomicU32::new(value))
    }

    fn load(&self, order: Ordering) -> u32 {
        self.0.load(order)
    }

    fn store(&self, value: u32, _: Ordering) {
        self.0.store(value, Ordering::Relaxed)
    }
}

struct Broken;

impl Cells for Broken {
    type Counter = RelaxedStores;
    type WrId = UnsafeCell<u64>;
    type Request = UnsafeCell<u32>;
}

/// Basic blocks in the send queue, receive slots, and so requests outstanding at most.
const SLOTS: u32 = 2;
/// Requests through the queue: it fills and wraps.
const REQUESTS: u32 = 3;

/// Which queue a run exercises.
#[derive(Clone, Copy)]
enum Queue {
    /// Sends, every `signal_every`-th (and the last) asking for a completion.
    Send {
        signal_every: u32,
    },
    Recv,
}

impl Queue {
    fn signaled(self, request: u32) -> bool {
        match self {
            Self::Send { signal_every } => (request + 1) % signal_every == 0 || request + 1 == REQUESTS,
            Self::Recv => true,
        }
    }
}

/// The QP and the doorbell record the two threads share.
struct World<C: Cells> {
    qp: QpShared<C>,
    /// Requests the poster has rung the doorbell for.
    doorbell: AtomicU32,
}

// SAFETY: the table entries are loom cells, which check every access for races: sharing
// them between the threads is what the model is for. The rest is atomics.
unsafe impl<C: Cells> Sync for World<C> {}
// SAFETY: as above.
unsafe impl<C: Cells> Send for World<C> {}

impl<C: Cells> World<C> {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            qp: QpShared::new(SLOTS as usize, SLOTS as usize, None),
            doorbell: AtomicU32::new(0),
        })
    }
}

fn wr_id(request: u32) -> u64 {
    100 + u64::from(request)
}

/// The library posting: room checked, the request recorded, the head published, then the
/// doorbell record (post_send / post_recv), up to `per_doorbell` requests at a time.
fn post<C: Cells>(w: &World<C>, queue: Queue, per_doorbell: u32) {
    let mut head = 0;
    while head < REQUESTS {
        let mut posted = 0;
        while posted < per_doorbell && head + posted < REQUESTS {
            let request = head + posted;
            let full = match queue {
                Queue::Send { .. } => w.qp.sends_free(request, SLOTS) == 0,
                Queue::Recv => w.qp.recv_full(request, SLOTS),
            };
            if full {
                break;
            }
            match queue {
                // One basic block per WQE: the request's first block is its number.
                Queue::Send { .. } => w.qp.send_tables().record(request, 1, request, wr_id(request)),
                Queue::Recv => w.qp.record_recv(request, wr_id(request)),
            }
            posted += 1;
        }
        if posted == 0 {
            loom::thread::yield_now();
            continue;
        }
        head += posted;
        match queue {
            Queue::Send { .. } => w.qp.publish_sends(head),
            Queue::Recv => w.qp.publish_recvs(head),
        }
        w.doorbell.store(head, Ordering::Release);
    }
}

/// The device and the library polling, one CQE at a time, or with `runs` the sends' CQEs
/// ready as one run: the device executes the requests the doorbell record covers, in order,
/// with a CQE for each signaled one (each receive); the poll turns each CQE into its `wr_id`
/// through the tables.
fn execute_and_poll<C: Cells>(w: &World<C>, queue: Queue, runs: bool) {
    let (mut executed, mut completed) = (0, 0);
    let mut cqes = std::collections::VecDeque::new();
    while completed < REQUESTS {
        if executed < w.doorbell.load(Ordering::Acquire) {
            if queue.signaled(executed) {
                cqes.push_back(executed as u16);
            }
            executed += 1;
        }
        if cqes.is_empty() {
            loom::thread::yield_now();
            continue;
        }
        if let (Queue::Send { .. }, true) = (queue, runs) {
            // The CQEs ready, as the CQ's drain takes a run of one QP's CQEs: the counters
            // loaded once, the tail published at the end; a request the run's head does not
            // cover yet goes through `complete_send`, which loads the head again.
            let mut run = w.qp.send_run();
            while let Some(counter) = cqes.pop_front() {
                let got = match run.complete(counter) {
                    Some(wr_id) => Ok(wr_id),
                    None => {
                        run.finish();
                        let got = w.qp.complete_send(counter);
                        run = w.qp.send_run();
                        got
                    }
                };
                assert_eq!(got, Ok(wr_id(u32::from(counter))), "each completion its own wr_id");
                completed = u32::from(counter) + 1;
            }
            run.finish();
            continue;
        }
        let Some(counter) = cqes.pop_front() else {
            continue;
        };
        let (got, request) = match queue {
            Queue::Send { .. } => (w.qp.complete_send(counter), u32::from(counter)),
            Queue::Recv => (w.qp.complete_recv(0), completed),
        };
        assert_eq!(got, Ok(wr_id(request)), "each completion its own wr_id");
        completed = request + 1;
    }
    assert!(
        w.qp.complete_recv(0).is_err() && w.qp.complete_send(0).is_err(),
        "nothing outstanding is left"
    );
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

/// The poster against the device and poller on one queue.
fn run<C: Cells + 'static>(queue: Queue, per_doorbell: u32, runs: bool) {
    let w = World::<C>::new();
    let poller = {
        let w = w.clone();
        loom::thread::spawn(move || execute_and_poll(&w, queue, runs))
    };
    post(&w, queue, per_doorbell);
    poller.join().unwrap();
}

#[test]
fn loom_send_tables_between_poster_and_poller() {
    for (signal_every, per_doorbell) in [(1, 1), (1, 2), (2, 1)] {
        model(
            &format!("sends, every {signal_every} signaled, {per_doorbell} per doorbell"),
            move || run::<Model>(Queue::Send { signal_every }, per_doorbell, false),
        );
    }
}

/// Sends completed as the CQ's drain does, a run of CQEs with one [`super::SendRun`]: the
/// tail published once at its end.
#[test]
fn loom_send_runs_between_poster_and_poller() {
    for (signal_every, per_doorbell) in [(1, 1), (1, 2), (2, 1)] {
        model(
            &format!("send runs, every {signal_every} signaled, {per_doorbell} per doorbell"),
            move || run::<Model>(Queue::Send { signal_every }, per_doorbell, true),
        );
    }
}

#[test]
fn loom_recv_table_between_poster_and_poller() {
    for per_doorbell in [1, 2] {
        model(&format!("receives, {per_doorbell} per doorbell"), move || {
            run::<Model>(Queue::Recv, per_doorbell, false)
        });
    }
}

/// The model has teeth: with the poller's tail published Relaxed, the poster can reuse a
/// table entry the poller is not known to be done reading, and loom says so.
#[test]
#[should_panic(expected = "Causality violation")]
fn loom_notices_a_relaxed_tail() {
    model("broken tail publish", || {
        run::<Broken>(Queue::Send { signal_every: 1 }, 1, false)
    });
}
