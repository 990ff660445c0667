//! BlueFlame on shared bfregs (the mlx5 model with write combining:
//! `UVERBS_MLX5_MODEL_WC=1 cargo xtask mlx5 -- <this test binary>`). 32 QPs on one context
//! get the kernel's 4 dedicated (low-latency) bfregs and share its 11 medium ones; 8 threads
//! post lone inline RDMA writes on them, each a BlueFlame copy of 240 bytes. The model
//! compares every copy it can with the WQE in the ring and checks that each doorbell is on
//! the QP's own bfreg; a torn copy (two QPs' copies interleaved in one buffer) or a doorbell
//! elsewhere is a violation, and the test fails on any. Every written byte is checked too.
//! mlx5-only: `cargo xtask mlx5 --step` runs it, the rxe guest leaves it out (`tests/mlx5_*.rs`).

mod common;

use common::*;
use std::ffi::{c_char, c_int};
use std::time::{Duration, Instant};
use uverbs::*;

const THREADS: usize = 8;
const QPS_PER_THREAD: usize = 4;
const ROUNDS: usize = 500;
/// Inline bytes: control, remote address and a 204-byte inline segment are 15 units (240
/// bytes), inside half a bfreg (256).
const LEN: usize = 200;
const TIMEOUT: Duration = Duration::from_secs(60);

/// The model's exported function `name`, found with `dlsym`.
fn model_fn(name: &std::ffi::CStr) -> *mut std::ffi::c_void {
    // SAFETY: a NUL-terminated name; RTLD_DEFAULT searches the process's objects.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    assert!(!f.is_null(), "not on the mlx5 model (no {name:?})");
    f
}

/// The violations the model recorded: (count, their text).
fn violations() -> (c_int, String) {
    let f = model_fn(c"uverbs_mlx5_model_violations");
    // SAFETY: the model's `uverbs_mlx5_model_violations(char *, size_t) -> int`.
    let f: extern "C" fn(*mut c_char, usize) -> c_int = unsafe { std::mem::transmute(f) };
    let mut buf = vec![0u8; 1 << 16];
    let n = f(buf.as_mut_ptr().cast(), buf.len());
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    (n, String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// BlueFlame copies the model compared with their WQE and found whole.
fn copies_checked() -> i64 {
    let f = model_fn(c"uverbs_mlx5_model_bf_copies_checked");
    // SAFETY: the model's `uverbs_mlx5_model_bf_copies_checked(void) -> int64_t`.
    let f: extern "C" fn() -> i64 = unsafe { std::mem::transmute(f) };
    f()
}

/// The QPs each thread posts on, by creation order. Linux's `alloc_bfreg` gives the first 4
/// QPs the dedicated bfregs and the next ones the medium bfregs 1 to 11 in turn (least used
/// first), so QP `k >= 4` is on bfreg `1 + (k - 4) % 11`. The threads of a row post on the same
/// bfregs in the same order (A, B and C on 1 to 4; D and E on 5 to 8; F and G on 9 to 11 and
/// then 5 or 6): threads let go at once by a barrier write to one bfreg at the same moment,
/// the race a shared bfreg's lock is for. H has the dedicated ones.
const QPS_OF: [[usize; QPS_PER_THREAD]; THREADS] = [
    [4, 5, 6, 7],
    [15, 16, 17, 18],
    [26, 27, 28, 29],
    [8, 9, 10, 11],
    [19, 20, 21, 22],
    [12, 13, 14, 30],
    [23, 24, 25, 31],
    [0, 1, 2, 3],
];

fn check_bfregs() -> c_int {
    let f = model_fn(c"uverbs_mlx5_model_check_bfregs");
    // SAFETY: the model's `uverbs_mlx5_model_check_bfregs(void) -> int`.
    let f: extern "C" fn() -> c_int = unsafe { std::mem::transmute(f) };
    f()
}

/// The payload QP `q` writes in round `round`.
fn payload(q: usize, round: usize) -> Vec<u8> {
    (0..LEN).map(|k| (q * 31 + round * 7 + k) as u8).collect()
}

/// 32 QPs, 8 threads, rounds of one lone inline RDMA write per QP, all threads let go at
/// once: every BlueFlame copy whole and on its QP's own bfreg (checked by the model as the
/// device sees each QP's next post, and after every round, when no post is in flight), every
/// byte written where it should be.
#[test]
fn thirty_two_qps_on_shared_bfregs_from_8_threads() {
    let ctx = open_test_device();
    assert_eq!(driver(&ctx), Driver::Mlx5, "BlueFlame registers are mlx5's");
    let pd = ctx.alloc_pd().unwrap();
    let path = loopback_path(&ctx);
    let region = ROUNDS * LEN;
    let nqps = THREADS * QPS_PER_THREAD;
    let mr = pd
        .alloc_remote_mr(nqps * region, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let cqs: Vec<Cq> = (0..THREADS).map(|_| ctx.create_cq(64).unwrap()).collect();
    // Created in order `k`, each on the CQ of the thread that posts on it.
    let owner = |k: usize| QPS_OF.iter().position(|row| row.contains(&k)).unwrap();
    let mut qps: Vec<Option<Qp>> = (0..nqps)
        .map(|k| {
            let cq = &cqs[owner(k)];
            let mut init = QpInit::new(QpType::Rc, cq, cq);
            init.cap.max_send_wr = 8;
            init.cap.max_inline_data = LEN as u32;
            let mut qp = pd.create_qp(&init).unwrap();
            let qpn = qp.qpn();
            qp.to_init(1, AccessFlags::REMOTE_WRITE).unwrap();
            qp.to_rtr(path, qpn, 0, Mtu::Mtu1024).unwrap();
            qp.to_rts(0).unwrap();
            Some(qp)
        })
        .collect();
    let mut ends: Vec<(Cq, Vec<(usize, Qp)>)> = cqs
        .into_iter()
        .zip(QPS_OF)
        .map(|(cq, row)| (cq, row.iter().map(|&k| (k, qps[k].take().unwrap())).collect()))
        .collect();
    let barrier = std::sync::Barrier::new(THREADS);
    // The start of a round: a spinning barrier, so the threads running on two cores leave it
    // within a cache miss of each other (a futex wake-up is tens of microseconds).
    let arrived = std::sync::atomic::AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for (t, (cq, qps)) in ends.iter_mut().enumerate() {
            let (mr, barrier, arrived) = (&mr, &barrier, &arrived);
            s.spawn(move || {
                let mut wc = [WorkCompletion::default(); 4];
                for round in 0..ROUNDS {
                    let data: Vec<Vec<u8>> = qps.iter().map(|&(q, _)| payload(q, round)).collect();
                    let all = THREADS * (round + 1);
                    arrived.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    let mut spins = 0u32;
                    while arrived.load(std::sync::atomic::Ordering::Acquire) < all {
                        spins += 1;
                        if spins % 256 == 0 {
                            std::thread::yield_now();
                        }
                        std::hint::spin_loop();
                    }
                    for ((q, qp), data) in qps.iter_mut().zip(&data) {
                        let local = [Sge {
                            addr: data.as_ptr() as u64,
                            length: LEN as u32,
                            lkey: 0,
                        }];
                        let target = mr.remote(*q * region + round * LEN).unwrap();
                        let wr = SendWr::new(round as u64, SendOp::RdmaWrite(target), &local)
                            .set_flags(SendFlags::INLINE | SendFlags::SIGNALED);
                        // SAFETY: inline: the bytes are copied into the WQE before this returns.
                        unsafe { qp.post_send(&[wr]) }.unwrap();
                    }
                    let mut done = 0;
                    while done < qps.len() {
                        let n = cq.poll(&mut wc);
                        for c in &wc[..n] {
                            assert_eq!(
                                (c.status, c.wr_id),
                                (WcStatus::SUCCESS, round as u64),
                                "thread {t}: {c:?}"
                            );
                        }
                        done += n;
                        if n == 0 {
                            // 8 pollers on a few cores: leave the model's device thread room.
                            std::thread::yield_now();
                        }
                        assert!(start.elapsed() < TIMEOUT, "thread {t} stalled in round {round}");
                    }
                    // No post in flight anywhere: the model checks every bfreg.
                    if barrier.wait().is_leader() {
                        check_bfregs();
                    }
                }
            });
        }
    });
    // SAFETY: every write completed; no work request names the region any more.
    let bytes = unsafe { mr.as_slice() };
    for q in 0..nqps {
        for round in 0..ROUNDS {
            let at = q * region + round * LEN;
            assert_eq!(&bytes[at..at + LEN], &payload(q, round)[..], "QP {q}, round {round}");
        }
    }
    let (n, text) = violations();
    let checked = copies_checked();
    eprintln!(
        "{} posts on {nqps} QPs from {THREADS} threads in {:?}: {checked} BlueFlame copies checked whole, {n} violations",
        nqps * ROUNDS,
        start.elapsed()
    );
    assert_eq!(n, 0, "the model saw:\n{text}");
    assert!(
        checked > 0,
        "no BlueFlame copy was checked: run on the model with UVERBS_MLX5_MODEL_WC=1"
    );
    drop(ends);
}
