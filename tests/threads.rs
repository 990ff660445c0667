//! Threads: which handles are `Send` and `Sync` (checked at compile time; the reasons are in
//! docs/reliability.md), one QP and CQ per thread on 8 threads sharing a context and PD, and
//! one CQ shared by several threads behind a lock.

mod common;
mod figures;

use common::*;
use figures::figure;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::Instant;
use uverbs::*;

const fn send<T: Send>() {}
const fn sync<T: Sync>() {}

/// Fails to compile if `$t` is `Sync` (the method call becomes ambiguous).
macro_rules! not_sync {
    ($t:ty) => {
        const _: fn() = || {
            trait AmbiguousIfSync<A> {
                fn check() {}
            }
            impl<T: ?Sized> AmbiguousIfSync<()> for T {}
            impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}
            let _ = <$t as AmbiguousIfSync<_>>::check;
        };
    };
}

// Shared freely: immutable after creation, or every method goes to the kernel.
const _: () = {
    send::<Context>();
    sync::<Context>();
    send::<Pd>();
    sync::<Pd>();
    send::<Mr>();
    sync::<Mr>();
    send::<Ah>();
    sync::<Ah>();
    send::<CompChannel>();
    sync::<CompChannel>();
    send::<Srq>();
    sync::<Srq>();
    send::<DeviceInfo>();
    sync::<DeviceInfo>();
    send::<Error>();
    sync::<Error>();
    send::<WorkCompletion>();
    sync::<WorkCompletion>();
};
// One owner at a time: the rings are touched without locks, through `&mut self`.
const _: () = {
    send::<Cq>();
    send::<Qp>();
    send::<Batch<'static>>();
};
not_sync!(Cq);
not_sync!(Qp);
not_sync!(Batch<'static>);

const THREADS: usize = 8;
const PER_THREAD: u64 = 5_000;
const MSG: usize = 256;
const DEPTH: u64 = 64;

/// 8 threads, each creating and owning one QP, one CQ and one MR (the context and PD are
/// shared): threads 2k and 2k+1 exchange QP numbers and connect, then each sends
/// `PER_THREAD` messages to the other while receiving as many, checking each exactly once.
#[test]
fn one_qp_and_cq_per_thread_on_8_threads() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let path = loopback_path(&ctx);
    let barrier = Barrier::new(THREADS);
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel::<u32>()).unzip();
    let mut rxs: Vec<Option<mpsc::Receiver<u32>>> = rxs.into_iter().map(Some).collect();
    let start = Instant::now();
    let results: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (ctx, pd, barrier) = (&ctx, &pd, &barrier);
                let to_peer = txs[t ^ 1].clone();
                let from_peer = rxs[t].take().unwrap();
                s.spawn(move || {
                    let mut cq = ctx.create_cq(256).unwrap();
                    let mut init = QpInit::new(QpType::Rc, &cq, &cq);
                    init.cap.max_send_wr = DEPTH as u32;
                    init.cap.max_recv_wr = DEPTH as u32;
                    let mut qp = pd.create_qp(&init).unwrap();
                    let mut mr = pd.alloc_mr(2 * DEPTH as usize * MSG, LocalAccess::LOCAL_WRITE).unwrap();
                    to_peer.send(qp.qpn()).unwrap();
                    let peer_qpn = from_peer.recv().unwrap();
                    qp.to_init(1, AccessFlags::empty()).unwrap();
                    qp.to_rtr(path, peer_qpn, 0, Mtu::Mtu1024).unwrap();
                    qp.to_rts(0).unwrap();
                    let recv_base = DEPTH as usize * MSG;
                    for i in 0..DEPTH {
                        let sge = mr.sge(recv_base + i as usize * MSG, MSG as u32).unwrap();
                        // SAFETY: the receive buffer stays valid and untouched until its completion.
                        unsafe { qp.post_recv(&[RecvWr::new((1 << 32) | i, &[sge])]) }.unwrap();
                    }
                    // Both ends have their receives up before anyone sends.
                    barrier.wait();
                    exchange(t, &mut qp, &mut cq, &mut mr)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (t, &(sent, received)) in results.iter().enumerate() {
        assert_eq!((sent, received), (PER_THREAD, PER_THREAD), "thread {t}");
    }
    figure(format_args!(
        "{THREADS} threads, one QP and CQ each: {} sends and {} receives completed exactly once in {:?}",
        THREADS as u64 * PER_THREAD,
        THREADS as u64 * PER_THREAD,
        start.elapsed()
    ));
}

/// Sends `PER_THREAD` messages stamped with the thread and sequence number while receiving as
/// many from the peer thread; returns (send completions, receive completions).
fn exchange(t: usize, qp: &mut Qp, cq: &mut Cq, mr: &mut Mr) -> (u64, u64) {
    let peer = (t ^ 1) as u64;
    let recv_base = DEPTH as usize * MSG;
    let (mut sent, mut send_done, mut recv_done) = (0u64, 0u64, 0u64);
    let mut wc = [WorkCompletion::default(); 32];
    let start = Instant::now();
    while send_done < PER_THREAD || recv_done < PER_THREAD {
        // The peer reposts a receive only after polling one, so stay DEPTH/2 behind.
        while sent < PER_THREAD && sent - send_done < DEPTH / 2 {
            let off = (sent % DEPTH) as usize * MSG;
            let buf = &mut mr.as_mut_slice()[off..off + MSG];
            buf.fill(t as u8);
            buf[..8].copy_from_slice(&sent.to_le_bytes());
            let sge = [mr.sge(off, MSG as u32).unwrap()];
            // SAFETY: the buffers named stay valid and unchanged until the completion.
            unsafe { qp.post_send(&[SendWr::new(sent, SendOp::Send, &sge)]) }.unwrap();
            sent += 1;
        }
        let n = cq.poll(&mut wc);
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::SUCCESS, "thread {t}: {c:?}");
            if c.opcode == WcOpcode::SEND {
                assert_eq!(c.wr_id, send_done, "thread {t}: sends complete once, in order");
                send_done += 1;
            } else {
                let slot = c.wr_id & 0xffff_ffff;
                assert_eq!((c.wr_id >> 32, slot), (1, recv_done % DEPTH), "thread {t}: {c:?}");
                let off = recv_base + slot as usize * MSG;
                let buf = &mr.as_slice()[off..off + MSG];
                assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), recv_done);
                assert!(buf[8..].iter().all(|&b| u64::from(b) == peer), "thread {t}: payload");
                recv_done += 1;
                let sge = mr.sge(off, MSG as u32).unwrap();
                // SAFETY: the receive buffer stays valid and untouched until its completion.
                unsafe { qp.post_recv(&[RecvWr::new(c.wr_id, &[sge])]) }.unwrap();
            }
        }
        assert!(
            start.elapsed() < 4 * TIMEOUT,
            "thread {t} stalled: sent {sent}, {send_done} sends and {recv_done} receives done"
        );
    }
    (send_done, recv_done)
}

/// One CQ behind a `Mutex`, shared by 4 threads that each own a QP sending on it: whoever holds
/// the lock polls and credits every completion to its wr_id, whichever thread posted it. Every
/// wr_id is seen exactly once overall.
#[test]
fn cq_shared_behind_a_lock() {
    const SENDERS: usize = 4;
    const EACH: u64 = 3_000;
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let path = loopback_path(&ctx);
    let cq = Arc::new(Mutex::new(ctx.create_cq(1024).unwrap()));
    let mr = pd
        .alloc_remote_mr(1 << 16, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let seen: Arc<Vec<AtomicU8>> = Arc::new((0..SENDERS as u64 * EACH).map(|_| AtomicU8::new(0)).collect());
    // Each thread's QP is connected to itself and RDMA-writes into the shared MR.
    let qps: Vec<Qp> = (0..SENDERS)
        .map(|_| {
            let guard = cq.lock().unwrap();
            let mut qp = pd.create_qp(&QpInit::new(QpType::Rc, &guard, &guard)).unwrap();
            let qpn = qp.qpn();
            qp.to_init(1, AccessFlags::REMOTE_WRITE).unwrap();
            qp.to_rtr(path, qpn, 0, Mtu::Mtu1024).unwrap();
            qp.to_rts(0).unwrap();
            qp
        })
        .collect();
    let start = Instant::now();
    std::thread::scope(|s| {
        for (t, mut qp) in qps.into_iter().enumerate() {
            let (cq, seen, mr) = (cq.clone(), seen.clone(), &mr);
            s.spawn(move || {
                let sge = [mr.sge(t * 64, 8).unwrap()];
                let remote = Remote {
                    addr: mr.addr() + 32768 + t as u64 * 64,
                    rkey: mr.rkey(),
                };
                let mut wc = [WorkCompletion::default(); 16];
                let mut posted = 0;
                let base = t as u64 * EACH;
                // This thread's writes still in flight, as far as it knows (others may poll
                // its completions, so it learns through `seen`).
                let mut done_upto = 0;
                while done_upto < EACH {
                    while posted < EACH && posted - done_upto < 32 {
                        let wr = SendWr::new(base + posted, SendOp::RdmaWrite(remote), &sge);
                        // SAFETY: the buffers named stay valid and unchanged until the completion.
                        unsafe { qp.post_send(&[wr]) }.unwrap();
                        posted += 1;
                    }
                    {
                        let mut cq = cq.lock().unwrap();
                        let n = cq.poll(&mut wc);
                        for c in &wc[..n] {
                            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
                            let prev = seen[c.wr_id as usize].fetch_add(1, Ordering::Relaxed);
                            assert_eq!(prev, 0, "wr_id {} completed twice", c.wr_id);
                        }
                    }
                    while done_upto < posted && seen[(base + done_upto) as usize].load(Ordering::Relaxed) == 1 {
                        done_upto += 1;
                    }
                    assert!(start.elapsed() < 4 * TIMEOUT, "thread {t} stalled at {done_upto}");
                }
            });
        }
    });
    let total = seen.len();
    let once = seen.iter().filter(|c| c.load(Ordering::Relaxed) == 1).count();
    assert_eq!(once, total, "every wr_id exactly once");
    assert_idle(&mut cq.lock().unwrap());
    figure(format_args!(
        "{SENDERS} threads sharing one CQ behind a Mutex: {total} writes, {once} completions seen exactly once, in {:?}",
        start.elapsed()
    ));
}
