//! The data path never touches the heap: with a counting global allocator, many rounds of
//! `Cq::poll` and `Cq::try_poll` (with and without completions; the empty `try_poll` reads the
//! async event file), `Cq::batch` iteration (`next` and `&mut batch`), `Qp::post_send` (single
//! requests and lists, inline and not) and `Qp::post_recv` (single and lists) on a real device
//! make zero allocations; so do the safe posts (`Qp::send_buf`, `send_buf_with`,
//! `send_inline`, `recv_buf`, and lists with `send_bufs`) with `Cq::reap`, `Qp::reclaim` and
//! `Qp::reclaim_all` giving the buffers back, and the SRQ's (`Srq::recv_buf`, `Srq::reclaim`,
//! `Srq::reclaim_all`).

mod common;

use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Instant;
use uverbs::*;

/// The system allocator, counting what this thread asks of it while `COUNTING` is set.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the allocator may run while this thread's locals are being torn down. The
    // locals are const-initialized and need no destructor, so touching them never allocates.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            CALLS.with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: every method forwards to `System` unchanged; counting has no effect on memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f`, returning its result and how many allocator calls (allocations, reallocations
/// and frees) this thread made meanwhile.
fn allocator_calls<R>(f: impl FnOnce() -> R) -> (u64, R) {
    CALLS.with(|c| c.set(0));
    COUNTING.with(|on| on.set(true));
    let r = f();
    COUNTING.with(|on| on.set(false));
    (CALLS.with(Cell::get), r)
}

#[test]
fn the_counter_sees_allocations() {
    let (calls, v) = allocator_calls(|| vec![1u8; 100]);
    assert_eq!(v.len(), 100);
    assert_eq!(calls, 1, "one allocation (the free comes later)");
    let (calls, ()) = allocator_calls(|| drop(v));
    assert_eq!(calls, 1);
}

/// Polls `cq` until it has handed out `want` completions (checking each succeeded), with
/// `poll` (`in_place == false`; `try_poll` when `checked`) or `batch` (iterated as `&mut batch`
/// when `checked`).
fn take(cq: &mut Cq, want: usize, in_place: bool, checked: bool, wc: &mut [WorkCompletion]) -> u64 {
    let start = Instant::now();
    let (mut got, mut ids) = (0, 0u64);
    while got < want {
        if in_place {
            let mut b = cq.batch();
            let mut count = |c: &WorkCompletion| {
                assert_eq!(c.status, WcStatus::SUCCESS);
                ids = ids.wrapping_add(c.wr_id);
                got += 1;
            };
            if checked {
                (&mut b).for_each(&mut count);
            } else {
                while let Some(c) = b.next() {
                    count(c);
                }
            }
        } else {
            let room = (want - got).min(wc.len());
            let n = if checked {
                cq.try_poll(&mut wc[..room]).unwrap()
            } else {
                cq.poll(&mut wc[..room])
            };
            for c in &wc[..n] {
                assert_eq!(c.status, WcStatus::SUCCESS);
                ids = ids.wrapping_add(c.wr_id);
            }
            got += n;
        }
        assert!(start.elapsed() < TIMEOUT, "timed out with {got} of {want} completions");
    }
    assert_eq!(got, want, "more completions than expected");
    ids
}

#[test]
fn poll_and_post_make_no_allocation() {
    const ROUNDS: u64 = 300;
    let mut p = Pair::new();
    // Everything the measured loop uses is made before it.
    let remote = Remote {
        addr: p.b.mr.addr() + 8192,
        rkey: p.b.mr.rkey(),
    };
    let send_sge = [p.a.mr.sge(0, 64).unwrap()];
    let two_sges = [p.a.mr.sge(0, 16).unwrap(), p.a.mr.sge(256, 16).unwrap()];
    let scratch = [0x5au8; 48];
    let inline_sge = [Sge {
        addr: scratch.as_ptr() as u64,
        length: scratch.len() as u32,
        lkey: 0,
    }];
    let recv_sges: Vec<[Sge; 1]> = (0..4).map(|i| [p.b.mr.sge(4096 + i * 128, 128).unwrap()]).collect();
    let mut wc = [WorkCompletion::default(); 16];

    let (calls, (sends, recvs)) = allocator_calls(|| {
        let (mut sends, mut recvs) = (0u64, 0u64);
        for r in 0..ROUNDS {
            let id = r * 8;
            // Four receives on B: one alone, three in a list.
            // SAFETY: the receive buffers are only read back after their completions.
            unsafe {
                p.b.qp.post_recv(&[RecvWr::new(id, &recv_sges[0])]).unwrap();
                p.b.qp
                    .post_recv(&[
                        RecvWr::new(id + 1, &recv_sges[1]),
                        RecvWr::new(id + 2, &recv_sges[2]),
                        RecvWr::new(id + 3, &recv_sges[3]),
                    ])
                    .unwrap();
            }
            // Six sends from A: a send alone, an inline send alone, then a list of a send with
            // two SGEs, an inline send with immediate data, an RDMA write and an inline RDMA
            // write. The four sends consume B's four receives.
            // SAFETY: A's MR outlives the requests and is not rewritten; inline data is copied
            // before `post_send` returns.
            unsafe {
                p.a.qp.post_send(&[SendWr::new(id, SendOp::Send, &send_sge)]).unwrap();
                p.a.qp
                    .post_send(&[SendWr::new(id + 1, SendOp::Send, &inline_sge).with(SendFlags::INLINE)])
                    .unwrap();
                p.a.qp
                    .post_send(&[
                        SendWr::new(id + 2, SendOp::Send, &two_sges),
                        SendWr::new(id + 3, SendOp::SendWithImm { imm: 7 }, &inline_sge).with(SendFlags::INLINE),
                        SendWr::new(id + 4, SendOp::RdmaWrite(remote), &send_sge),
                        SendWr::new(id + 5, SendOp::RdmaWrite(remote), &inline_sge).with(SendFlags::INLINE),
                    ])
                    .unwrap();
            }
            let (in_place, checked) = (r % 2 == 1, r % 4 >= 2);
            let s = take(&mut p.a.cq, 6, !in_place, checked, &mut wc);
            assert_eq!(s, 6 * id + 15, "send completions of round {r}");
            let v = take(&mut p.b.cq, 4, in_place, checked, &mut wc);
            assert_eq!(v, 4 * id + 6, "receive completions of round {r}");
            sends += 6;
            recvs += 4;
            // And polls of empty CQs, both ways.
            assert_eq!(p.a.cq.poll(&mut wc), 0);
            assert_eq!(p.a.cq.try_poll(&mut wc).unwrap(), 0);
            assert!(p.b.cq.batch().next().is_none());
            assert_eq!((&mut p.b.cq.batch()).count(), 0);
        }
        (sends, recvs)
    });
    assert_eq!((sends, recvs), (6 * ROUNDS, 4 * ROUNDS));
    assert_eq!(
        calls, 0,
        "{calls} allocator calls in {ROUNDS} rounds of posting and polling"
    );
}

/// Takes completions from `cq` with `Cq::reap` until `want` came, giving every buffer back to
/// `pool` through `qp.reclaim`; returns the buffers given back.
fn reclaim_into(qp: &mut Qp, cq: &mut Cq, want: usize, pool: &mut Vec<Buf>, wc: &mut [WorkCompletion]) -> usize {
    let start = Instant::now();
    let (mut got, mut back) = (0, 0);
    while got < want {
        for c in cq.reap(wc).iter() {
            assert_eq!(c.status, WcStatus::SUCCESS);
            while let Some(buf) = qp.reclaim(c) {
                pool.push(buf);
                back += 1;
            }
            got += 1;
        }
        assert!(start.elapsed() < TIMEOUT, "timed out with {got} of {want} completions");
    }
    assert_eq!(got, want, "more completions than expected");
    back
}

#[test]
fn safe_posts_and_reclaims_make_no_allocation() {
    const ROUNDS: usize = 300;
    let mut p = Pair::new();
    // Everything the measured loop uses is made before it: the buffers, and pools with room
    // for all of them.
    let remote = p.b.mr.remote(8192).unwrap();
    let mut sends =
        p.pd.alloc_mr(4 * 64, LocalAccess::LOCAL_WRITE)
            .unwrap()
            .into_bufs(64)
            .unwrap();
    let mut recvs =
        p.pd.alloc_mr(4 * 128, LocalAccess::LOCAL_WRITE)
            .unwrap()
            .into_bufs(128)
            .unwrap();
    // For the writes posted as a list (`send_bufs`).
    let mut writes =
        p.pd.alloc_mr(2 * 64, LocalAccess::LOCAL_WRITE)
            .unwrap()
            .into_bufs(64)
            .unwrap();
    sends.reserve(4);
    recvs.reserve(4);
    writes.reserve(2);
    let payload = [0x5au8; 48];
    let mut wc = [WorkCompletion::default(); 16];

    let (calls, (posted, back)) = allocator_calls(|| {
        let (mut posted, mut back) = (0, 0);
        for r in 0..ROUNDS {
            // Four receives on B.
            while let Some(buf) = recvs.pop() {
                p.b.qp.recv_buf(buf).unwrap();
                posted += 1;
            }
            // From A: three sends from buffers (one unsignaled), a write from a buffer, and an
            // inline send and an inline write from a plain slice. The four sends consume B's
            // four receives.
            let mut next = || {
                let mut b = sends.pop().unwrap();
                b.as_mut_slice()[0] = r as u8;
                b
            };
            p.a.qp.send_buf(SendOp::Send, next()).unwrap();
            p.a.qp
                .send_buf_with(SendOp::Send, next(), SendFlags::empty(), None)
                .unwrap();
            p.a.qp.send_buf(SendOp::SendWithImm { imm: 7 }, next()).unwrap();
            p.a.qp.send_buf(SendOp::RdmaWrite(remote), next()).unwrap();
            p.a.qp.send_inline(SendOp::Send, &payload).unwrap();
            p.a.qp.send_inline(SendOp::RdmaWrite(remote), &payload).unwrap();
            posted += 4;
            // Five signaled sends complete (the unsignaled one's buffer comes back with a later
            // one); four receives.
            back += reclaim_into(&mut p.a.qp, &mut p.a.cq, 5, &mut sends, &mut wc);
            back += reclaim_into(&mut p.b.qp, &mut p.b.cq, 4, &mut recvs, &mut wc);
            // Two writes as one list (one doorbell), both signaled, given back in batches.
            p.a.qp
                .send_bufs(SendOp::RdmaWrite(remote), &mut writes, SendFlags::SIGNALED)
                .unwrap();
            posted += 2;
            let start = Instant::now();
            while writes.len() < 2 {
                back += p.a.qp.reclaim_all(&p.a.cq.reap(&mut wc), &mut writes);
                assert!(start.elapsed() < TIMEOUT, "the writes' buffers did not come back");
            }
            assert!(p.a.cq.reap(&mut wc).is_empty());
        }
        (posted, back)
    });
    assert_eq!(
        (posted, back),
        (10 * ROUNDS, 10 * ROUNDS),
        "every buffer back each round"
    );
    assert_eq!(
        calls, 0,
        "{calls} allocator calls in {ROUNDS} rounds of safe posting and reclaiming"
    );
}

#[test]
fn srq_receives_and_reclaims_make_no_allocation() {
    const ROUNDS: usize = 300;
    let mut s = common::srq::setup(16);
    let mut sends =
        s.pd.alloc_mr(4 * 64, LocalAccess::LOCAL_WRITE)
            .unwrap()
            .into_bufs(64)
            .unwrap();
    let mut recvs =
        s.pd.alloc_mr(4 * 128, LocalAccess::LOCAL_WRITE)
            .unwrap()
            .into_bufs(128)
            .unwrap();
    sends.reserve(4);
    recvs.reserve(4);
    let mut wc = [WorkCompletion::default(); 16];
    // Four receives through the SRQ, two sent by each sender to its receiver; the receive
    // completions give the buffers back one by one or in batches.
    let mut round = |s: &mut common::srq::Setup, sends: &mut Vec<Buf>, recvs: &mut Vec<Buf>, r: usize| {
        while let Some(buf) = recvs.pop() {
            s.srq.recv_buf(buf).unwrap();
        }
        for k in 0..4 {
            let mut b = sends.pop().unwrap();
            b.as_mut_slice()[0] = r as u8;
            s.senders[k % 2].send_buf(SendOp::Send, b).unwrap();
        }
        let start = Instant::now();
        while sends.len() < 4 || recvs.len() < 4 {
            for c in s.send_cq.reap(&mut wc).iter() {
                assert_eq!(c.status, WcStatus::SUCCESS);
                for qp in &mut s.senders {
                    sends.extend(qp.reclaim(c));
                }
            }
            let reaped = s.recv_cq.reap(&mut wc);
            if r % 2 == 0 {
                s.srq.reclaim_all(&reaped, recvs);
            } else {
                for c in reaped.iter() {
                    recvs.push(s.srq.reclaim(c).unwrap());
                }
            }
            assert!(start.elapsed() < TIMEOUT, "round {r}: buffers did not come back");
        }
        assert_eq!(s.srq.held_bufs(), 0);
    };
    // One round first: the SRQ's first reclaim reads which QPs are on it (allocating its copy
    // of that list once).
    round(&mut s, &mut sends, &mut recvs, 0);
    let (calls, ()) = allocator_calls(|| {
        for r in 1..=ROUNDS {
            round(&mut s, &mut sends, &mut recvs, r);
        }
    });
    assert_eq!(
        calls, 0,
        "{calls} allocator calls in {ROUNDS} rounds of SRQ receives and reclaims"
    );
}
