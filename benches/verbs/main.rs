//! The Rust side of `cargo xtask bench`: the workloads of benches/c/verbs_bench.c on the
//! `uverbs` API, against a real rxe device (run it in the test guest; see docs/benchmarks.md).
//!
//! Keep it in step with the C harness: same queue sizes, QP attributes, work requests, round
//! counts and output. Every result is one JSON line on stdout, e.g.
//!
//! ```text
//! {"impl":"rust","workload":"drain","param":16,"unit":"ns","samples":[...],"median":...,"min":...,"max":...}
//! ```
//!
//! Options: `--impl NAME` (label, default "rust"), `--only W1,W2` (workloads: drain, inplace,
//! inplace_copy (Rust only), drain_replay, drain_floor (Rust only), empty, post, post_built
//! (1, and lists of 32 built per call) and post_safe (Rust only), srq_post_built and
//! srq_post_safe (Rust only), recv_built and recv_safe (Rust only), pingpong, rate),
//! `--device NAME`, `--gid-index N`,
//! `--cq-depth N` (default 8192), `--batches B1,B2` (the drain's batch sizes, default
//! [`DRAIN_BATCHES`]), `--drain-wait-ms N` (the drain's first wait for the device, default 20;
//! a round with fewer ready waits twice as long next time, and its dump is named
//! "<workload>_partial"), `--rounds N` (measured rounds of drain, empty and post, default 11;
//! with `UVERBS_BENCH_PERF_CTL`, below, the native profile of a missed target: Rust only),
//! `--callgrind` (few rounds, and callgrind client requests around each measured
//! region: collect on, work, collect off, then a dump named "<workload> <param> <ops>").
//! With `UVERBS_BENCH_PERF_CTL=<ctl>,<ack>` (the fifos of `perf record --control`), sampling
//! is enabled for the measured regions only. With `UVERBS_REPLAY_TRACE` set, the replayed drain also writes a line to stderr as each
//! block ends: `replay <impl> <workload> <batch> <ns per completion>`.

mod replay;

use replay::{Floor, Ring};
use std::process::ExitCode;
use std::sync::Barrier;
use std::time::{Duration, Instant};
use uverbs::{
    AccessFlags, AhAttr, Buf, Context, Cq, Gid, GlobalRoute, LocalAccess, Mtu, Pd, Qp, QpCap, QpInit, QpType, RecvWr,
    Remote, RemoteMr, SendFlags, SendOp, SendWr, Sge, SrqInit, WcOpcode, WcStatus, WorkCompletion,
};

const N_DRAIN: usize = 4096;
const SEND_WR: u32 = 4096;
const RECV_WR: u32 = 1024;
const MR_LEN: usize = 1 << 20;
const MSG: u32 = 64;
const RECV_DEPTH: u64 = 512;
const WINDOW: u64 = 64;
const POST_K: usize = 1024;
/// Completions asked for per poll call in the drain. Between the powers of two, 12, 20 and 24
/// show how the emulated CPU's timing of the copying drain moves with the batch size
/// (docs/benchmarks.md). The same list as the C harness's `drain_batches`.
const DRAIN_BATCHES: [usize; 10] = [1, 2, 4, 8, 12, 16, 20, 24, 32, 64];
/// The replayed drain (replay.rs): batch sizes, rounds (one block per batch size each), and
/// drains per block. One sample is the median of a block. As the C harness.
const REPLAY_BATCHES: [usize; 3] = [1, 16, 64];
const REPLAY_ROUNDS: usize = 20;
const REPLAY_BLOCK: usize = 100;

struct Opts {
    impl_name: String,
    only: Option<Vec<String>>,
    device: Option<String>,
    gid_index: u8,
    cq_depth: u32,
    batches: Vec<usize>,
    drain_wait_ms: u64,
    rounds: Option<usize>,
    callgrind: bool,
}

impl Opts {
    fn wanted(&self, w: &str) -> bool {
        self.only.as_ref().is_none_or(|o| o.iter().any(|x| x == w))
    }

    /// One result line: the per-round values, and their median, min and max.
    fn report(&self, workload: &str, param: usize, mut v: Vec<f64>) {
        let samples: Vec<String> = v.iter().map(|x| format!("{x:.3}")).collect();
        let med = median(&mut v);
        let n = v.len();
        println!(
            "{{\"impl\":\"{}\",\"workload\":\"{workload}\",\"param\":{param},\"unit\":\"ns\",\"samples\":[{}],\"median\":{med:.3},\"min\":{:.3},\"max\":{:.3}}}",
            self.impl_name,
            samples.join(","),
            v[0],
            v[n - 1]
        );
    }

    /// Under `perf record --control`: start sampling. Callgrind: start counting (after, so
    /// that the count leaves the perf control out).
    fn collect_on(&self) {
        perf_control::command("enable");
        if self.callgrind {
            callgrind::toggle_collect();
        }
    }

    /// Callgrind: stop counting and dump what was counted since the last dump. Under `perf
    /// record --control`: stop sampling.
    fn collect_off(&self, workload: &str, param: usize, ops: usize) {
        if self.callgrind {
            callgrind::toggle_collect();
            callgrind::dump_stats_at(&format!("{workload} {param} {ops}"));
        }
        perf_control::command("disable");
    }
}

/// The median of `v` (sorted in place; not empty).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `perf record --control=fifo:<ctl>,<ack> -D -1` around the measured regions, when
/// `UVERBS_BENCH_PERF_CTL` names the two fifos as `<ctl>,<ack>`: the profile then holds only
/// samples taken inside them.
mod perf_control {
    use std::fs::{File, OpenOptions};
    use std::io::{Read, Write};
    use std::sync::{Mutex, OnceLock};

    fn fifos() -> Option<&'static Mutex<(File, File)>> {
        static FIFOS: OnceLock<Option<Mutex<(File, File)>>> = OnceLock::new();
        FIFOS
            .get_or_init(|| {
                let names = std::env::var("UVERBS_BENCH_PERF_CTL").ok()?;
                let (ctl, ack) = names.split_once(',')?;
                let open = |path: &str, write: bool| {
                    OpenOptions::new()
                        .read(!write)
                        .write(write)
                        .open(path)
                        .unwrap_or_else(|e| super::fail(&format!("UVERBS_BENCH_PERF_CTL: {path}: {e}")))
                };
                Some(Mutex::new((open(ctl, true), open(ack, false))))
            })
            .as_ref()
    }

    /// Sends `cmd` (`enable`, `disable`) and waits for perf's acknowledgement (`ack\n\0`).
    pub fn command(cmd: &str) {
        let Some(fifos) = fifos() else { return };
        let mut f = fifos.lock().unwrap_or_else(|e| e.into_inner());
        let mut ack = [0u8; 5];
        if f.0.write_all(format!("{cmd}\n").as_bytes()).is_err() || f.1.read_exact(&mut ack).is_err() {
            super::fail("perf control: the fifo closed");
        }
    }
}

/// Callgrind client requests (`<valgrind/callgrind.h>`): the magic instruction sequence
/// valgrind recognizes, a no-op on a real CPU.
mod callgrind {
    /// `VG_USERREQ_TOOL_BASE('C','T')`.
    const BASE: u64 = ((b'C' as u64) << 24) | ((b'T' as u64) << 16);
    const TOGGLE_COLLECT: u64 = BASE + 2;
    const DUMP_STATS_AT: u64 = BASE + 3;

    #[cfg(target_arch = "x86_64")]
    fn request(code: u64, arg1: u64) {
        let args: [u64; 6] = [code, arg1, 0, 0, 0, 0];
        // SAFETY: valgrind's amd64 client-request preamble: four rotations of rdi by a total
        // of 128 bits (rdi ends unchanged; declared clobbered anyway) and `xchg rbx, rbx`,
        // a no-op natively. Under valgrind it reads the six words at rax (live for the
        // call) and writes its answer to rdx; rdx holds the default (0) otherwise.
        unsafe {
            std::arch::asm!(
                "rol rdi, 3",
                "rol rdi, 13",
                "rol rdi, 61",
                "rol rdi, 51",
                "xchg rbx, rbx",
                in("rax") args.as_ptr(),
                inout("rdx") 0u64 => _,
                out("rdi") _,
                options(nostack),
            );
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn request(_code: u64, _arg1: u64) {}

    pub fn toggle_collect() {
        request(TOGGLE_COLLECT, 0);
    }

    pub fn dump_stats_at(name: &str) {
        let c = std::ffi::CString::new(name).expect("no NUL in dump names");
        request(DUMP_STATS_AT, c.as_ptr() as u64);
    }
}

struct Side {
    qp: Qp,
    cq: Cq,
    mr: RemoteMr,
}

struct Pair {
    ctx: Context,
    pd: Pd,
    a: Side,
    b: Side,
}

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

fn make_side(ctx: &Context, pd: &Pd, cq_depth: u32) -> uverbs::Result<Side> {
    let cq = ctx.create_cq(cq_depth)?;
    let mut init = QpInit::new(QpType::Rc, &cq, &cq);
    init.cap = QpCap {
        max_send_wr: SEND_WR,
        max_recv_wr: RECV_WR,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(&init)?;
    let mr = pd.alloc_remote_mr(MR_LEN, access())?;
    Ok(Side { qp, cq, mr })
}

/// `lid` is the port's: the destination on InfiniBand (0 on RoCE).
fn connect(qp: &mut Qp, gid: &Gid, lid: u16, dest: u32) -> uverbs::Result<()> {
    let path = AhAttr {
        port_num: 1,
        dlid: lid,
        grh: Some(GlobalRoute {
            dgid: gid.raw,
            sgid_index: gid.index,
            hop_limit: 64,
            ..Default::default()
        }),
        ..Default::default()
    };
    qp.to_init(1, access())?;
    qp.to_rtr(path, dest, 0, Mtu::Mtu1024)?;
    qp.to_rts(0)
}

impl Pair {
    fn open(o: &Opts) -> uverbs::Result<Self> {
        let ctx = uverbs::open(o.device.as_deref())?;
        let pd = ctx.alloc_pd()?;
        let gid = ctx.query_gid(1, o.gid_index)?;
        let lid = ctx.query_port(1)?.lid;
        let mut a = make_side(&ctx, &pd, o.cq_depth)?;
        let mut b = make_side(&ctx, &pd, o.cq_depth)?;
        let (aq, bq) = (a.qp.qpn(), b.qp.qpn());
        connect(&mut a.qp, &gid, lid, bq)?;
        connect(&mut b.qp, &gid, lid, aq)?;
        Ok(Self { ctx, pd, a, b })
    }
}

fn fail(what: &str) -> ! {
    eprintln!("verbs_bench: {what}");
    std::process::exit(1);
}

/// Polls `cq` until `n` completions arrived (30 s limit); all must have succeeded.
fn wait_completions(cq: &mut Cq, mut n: usize) {
    let mut wc = [WorkCompletion::default(); 64];
    let deadline = Instant::now() + Duration::from_secs(30);
    while n > 0 {
        let got = cq.poll(&mut wc[..n.min(64)]);
        for c in &wc[..got] {
            if c.status != WcStatus::SUCCESS {
                fail(&format!("completion {}: {:?}", c.wr_id, c.status));
            }
        }
        n -= got;
        if Instant::now() > deadline {
            fail("timed out waiting for completions");
        }
    }
}

/// Posts N_DRAIN signaled 8-byte RDMA writes from A to B, in lists of 64.
fn post_writes(p: &mut Pair) {
    let sge = [p.a.mr.sge(0, 8).expect("in the MR")];
    let remote = Remote {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey(),
    };
    let mut wrs = [SendWr::new(0, SendOp::RdmaWrite(remote), &sge); 64];
    for base in (0..N_DRAIN).step_by(64) {
        for (i, wr) in wrs.iter_mut().enumerate() {
            wr.wr_id = (base + i) as u64;
        }
        // SAFETY: both MRs live as long as the pair; nothing reads the target bytes.
        unsafe { p.a.qp.post_send(&wrs) }.unwrap_or_else(|e| fail(&format!("post_send: {e}")));
    }
}

/// How [`bench_drain`] takes the completions.
#[derive(Clone, Copy)]
enum Drain {
    /// `Cq::poll`, this many at a time.
    Poll(usize),
    /// `Cq::batch`, reading `wr_id` and `status` of each.
    InPlace,
    /// `Cq::batch`, also copying each completion into the 64-entry array (as `Cq::poll` does):
    /// a Rust-only row that shows what the copy itself costs.
    InPlaceCopy,
}

/// Takes up to N_DRAIN completions with `Cq::batch`, reading `wr_id` and `status` of each
/// (and, with `COPY`, copying each into `out`); returns how many, the sum of their `wr_id`s and
/// whether any failed.
#[inline(always)]
fn drain_in_place<const COPY: bool>(cq: &mut Cq, out: &mut [WorkCompletion; 64]) -> (usize, u64, bool) {
    let (mut got, mut acc, mut bad) = (0, 0, false);
    let mut b = cq.batch();
    while let Some(c) = b.next() {
        if COPY {
            out[got % 64] = *c;
        }
        acc += c.wr_id;
        bad |= c.status != WcStatus::SUCCESS;
        got += 1;
        if got == N_DRAIN {
            break;
        }
    }
    (got, acc, bad)
}

/// Calls `poll` with `wc` until N_DRAIN completions came or none is ready; returns how many
/// came, and how many the last call gave.
#[inline(always)]
fn drain_with(mut poll: impl FnMut(&mut [WorkCompletion]) -> usize, wc: &mut [WorkCompletion]) -> (usize, usize) {
    let (mut got, mut last) = (0, 0);
    while got < N_DRAIN {
        let n = poll(wc);
        if n == 0 {
            break;
        }
        got += n;
        last = n;
    }
    (got, last)
}

/// 1. Draining a CQ holding N_DRAIN ready completions.
fn bench_drain(o: &Opts, p: &mut Pair, how: Drain) {
    let (name, batch) = match how {
        Drain::Poll(b) => ("drain", b),
        Drain::InPlace => ("inplace", 0),
        Drain::InPlaceCopy => ("inplace_copy", 0),
    };
    let inplace = !matches!(how, Drain::Poll(_));
    let rounds = o.rounds.unwrap_or(if o.callgrind { 3 } else { 11 });
    let (mut wait_ms, mut retries) = (o.drain_wait_ms, 0);
    let partial = format!("{name}_partial");
    let mut v = Vec::with_capacity(rounds);
    let mut wc = [WorkCompletion::default(); 64];
    let mut r: isize = -1;
    while r < rounds as isize {
        post_writes(p);
        std::thread::sleep(Duration::from_millis(wait_ms));
        if r >= 0 {
            o.collect_on();
        }
        let t0 = Instant::now();
        let (got, last, acc, bad) = match how {
            Drain::InPlace => {
                let (got, acc, bad) = drain_in_place::<false>(&mut p.a.cq, &mut wc);
                (got, 0, acc, bad)
            }
            Drain::InPlaceCopy => {
                let (got, acc, bad) = drain_in_place::<true>(&mut p.a.cq, &mut wc);
                (got, 0, acc, bad)
            }
            Drain::Poll(batch) => {
                let (got, last) = drain_with(|w| p.a.cq.poll(w), &mut wc[..batch]);
                (got, last, 0, false)
            }
        };
        let dt = t0.elapsed();
        // The copies are the work being measured: keep them.
        std::hint::black_box(&wc);
        if r >= 0 {
            // A round that found fewer ready also timed polls of an empty CQ: its dump is named
            // apart, and the round is run again.
            o.collect_off(if got == N_DRAIN { name } else { &partial }, batch, got);
        }
        if bad {
            fail("in-place drain: a completion failed");
        }
        if !inplace && got > 0 && (wc[last - 1].wr_id != got as u64 - 1 || wc[last - 1].status != WcStatus::SUCCESS) {
            fail("drain: unexpected completion");
        }
        if got < N_DRAIN {
            // Not all were ready: finish untimed, wait longer next time.
            wait_completions(&mut p.a.cq, N_DRAIN - got);
            wait_ms *= 2;
            retries += 1;
            if retries > 8 {
                fail("completions never became ready in time");
            }
            continue;
        }
        if inplace && acc != (N_DRAIN * (N_DRAIN - 1) / 2) as u64 {
            fail("in-place drain: wrong wr_ids");
        }
        if r >= 0 {
            v.push(dt.as_nanos() as f64 / N_DRAIN as f64);
        }
        r += 1;
    }
    o.report(name, batch, v);
}

/// 1b. The drain replayed from user space (replay.rs), with `Cq::poll` at each of
/// REPLAY_BATCHES or, with `floor`, the hand-inlined floor loop one at a time (the floor of
/// one-at-a-time polling: batched, the library's unrolled copy does better than that loop).
fn bench_replay(o: &Opts, p: &mut Pair, floor: bool) {
    let (name, batches) = if floor {
        ("drain_floor", &[1][..])
    } else {
        ("drain_replay", &REPLAY_BATCHES[..])
    };
    post_writes(p);
    let ring = Ring::wait_full(N_DRAIN as u32).unwrap_or_else(|e| fail(&e));
    ring.fill(N_DRAIN as u32);
    let (rounds, block) = if o.callgrind {
        (1, 2)
    } else {
        (REPLAY_ROUNDS, REPLAY_BLOCK)
    };
    let mut floor_cq = Floor::new(&ring);
    let mut samples = vec![Vec::with_capacity(rounds); batches.len()];
    let mut times = Vec::with_capacity(block);
    let mut wc = [WorkCompletion::default(); 64];
    let trace = std::env::var_os("UVERBS_REPLAY_TRACE").is_some();
    for _ in 0..rounds {
        for (k, &batch) in batches.iter().enumerate() {
            times.clear();
            o.collect_on();
            for _ in 0..block {
                let t0 = Instant::now();
                let (got, last) = if floor {
                    drain_with(|w| floor_cq.poll(w), &mut wc[..batch])
                } else {
                    drain_with(|w| p.a.cq.poll(w), &mut wc[..batch])
                };
                let dt = t0.elapsed();
                std::hint::black_box(&wc);
                replay::check_drain(got, N_DRAIN, &wc[last.max(1) - 1]).unwrap_or_else(|e| fail(&e));
                ring.offer(N_DRAIN as u32);
                times.push(dt.as_nanos() as f64 / N_DRAIN as f64);
            }
            o.collect_off(name, batch, block * N_DRAIN);
            samples[k].push(median(&mut times));
            if trace {
                eprintln!(
                    "replay {} {name} {batch} {:.3}",
                    o.impl_name,
                    samples[k][samples[k].len() - 1]
                );
            }
        }
    }
    for (v, &batch) in samples.into_iter().zip(batches) {
        o.report(name, batch, v);
    }
}

/// 2. Polling an empty CQ.
fn bench_empty(o: &Opts, p: &mut Pair) {
    let rounds = o.rounds.unwrap_or(if o.callgrind { 1 } else { 11 });
    let k: usize = if o.callgrind { 4096 } else { 1 << 18 };
    let mut v = Vec::with_capacity(rounds);
    let mut wc = [WorkCompletion::default(); 16];
    for r in -1..rounds as isize {
        let mut sum = 0;
        if r >= 0 {
            o.collect_on();
        }
        let t0 = Instant::now();
        for _ in 0..k {
            sum += p.a.cq.poll(&mut wc);
        }
        let dt = t0.elapsed();
        if r >= 0 {
            o.collect_off("empty", 16, k);
        }
        if sum != 0 {
            fail("empty CQ returned completions");
        }
        if r >= 0 {
            v.push(dt.as_nanos() as f64 / k as f64);
        }
    }
    o.report("empty", 16, v);
}

/// 3. post_send of POST_K unsignaled 8-byte RDMA writes (the last signaled), `list` per call.
fn bench_post(o: &Opts, p: &mut Pair, list: usize) {
    let rounds = o.rounds.unwrap_or(if o.callgrind { 2 } else { 11 });
    let k = if o.callgrind { 256 } else { POST_K };
    let mut v = Vec::with_capacity(rounds);
    let sge = [p.a.mr.sge(0, 8).expect("in the MR")];
    let remote = Remote {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey(),
    };
    let wrs: Vec<SendWr<'_>> = (0..k)
        .map(|i| {
            let flags = if i == k - 1 {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            SendWr::new(i as u64, SendOp::RdmaWrite(remote), &sge).set_flags(flags)
        })
        .collect();
    for r in -1..rounds as isize {
        if r >= 0 {
            o.collect_on();
        }
        let t0 = Instant::now();
        for chunk in wrs.chunks(list) {
            // SAFETY: both MRs outlive the requests; nothing reads the target bytes.
            unsafe { p.a.qp.post_send(chunk) }.unwrap_or_else(|e| fail(&format!("post_send: {e}")));
        }
        let dt = t0.elapsed();
        if r >= 0 {
            o.collect_off("post", list, k);
        }
        wait_completions(&mut p.a.cq, 1);
        if r >= 0 {
            v.push(dt.as_nanos() as f64 / k as f64);
        }
    }
    o.report("post", list, v);
}

/// 3a. `post_send` of one request per call, the request built in the loop as a caller who
/// does not keep a prepared list would (Rust only: the raw baseline for the safe post below).
fn bench_post_built(o: &Opts, p: &mut Pair) {
    let rounds = if o.callgrind { 2 } else { 11 };
    let k = if o.callgrind { 256 } else { POST_K };
    let mut v = Vec::with_capacity(rounds);
    let sge = [p.a.mr.sge(0, 8).expect("in the MR")];
    let remote = Remote {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey(),
    };
    for r in -1..rounds as isize {
        if r >= 0 {
            o.collect_on();
        }
        let t0 = Instant::now();
        for i in 0..k {
            let flags = if i == k - 1 {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            let wr = SendWr::new(i as u64, SendOp::RdmaWrite(remote), &sge).set_flags(flags);
            // SAFETY: both MRs outlive the requests; nothing reads the target bytes.
            unsafe { p.a.qp.post_send(&[wr]) }.unwrap_or_else(|e| fail(&format!("post_send: {e}")));
        }
        let dt = t0.elapsed();
        if r >= 0 {
            o.collect_off("post_built", 1, k);
        }
        wait_completions(&mut p.a.cq, 1);
        if r >= 0 {
            v.push(dt.as_nanos() as f64 / k as f64);
        }
    }
    o.report("post_built", 1, v);
}

/// 3a'. `post_send` of lists of `Qp::BUF_LIST` (32), each request's id and SGE written per
/// call as a caller posting distinct buffers would (one SGE per 8-byte buffer, prepared with
/// the buffers like the safe post's `Buf`s; the rest of the request, operation and flags, kept
/// in an array built once before the rounds), every request signaled like `post_safe` 32:
/// Rust only, the raw baseline for the safe post of lists (beside `post` 32, which re-posts
/// one prepared array and builds nothing per call).
fn bench_post_built_list(o: &Opts, p: &mut Pair) {
    const LIST: usize = Qp::BUF_LIST;
    let rounds = if o.callgrind { 2 } else { 11 };
    let k = if o.callgrind { 256 } else { POST_K };
    let mut v = Vec::with_capacity(rounds);
    let sges: Vec<Sge> = (0..k).map(|i| p.a.mr.sge(i * 8, 8).expect("in the MR")).collect();
    let remote = Remote {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey(),
    };
    let mut wrs = [SendWr::new(0, SendOp::RdmaWrite(remote), &[]); LIST];
    let mut id = 0u64;
    for r in -1..rounds as isize {
        if r >= 0 {
            o.collect_on();
        }
        let t0 = Instant::now();
        for chunk in sges.chunks(LIST) {
            for (wr, sge) in wrs.iter_mut().zip(chunk) {
                wr.wr_id = id;
                wr.sg_list = std::slice::from_ref(sge);
                id += 1;
            }
            // SAFETY: both MRs outlive the requests; nothing reads the target bytes.
            unsafe { p.a.qp.post_send(&wrs[..chunk.len()]) }.unwrap_or_else(|e| fail(&format!("post_send: {e}")));
        }
        let dt = t0.elapsed();
        if r >= 0 {
            o.collect_off("post_built", LIST, k);
        }
        wait_completions(&mut p.a.cq, k);
        if r >= 0 {
            v.push(dt.as_nanos() as f64 / k as f64);
        }
    }
    o.report("post_built", LIST, v);
}

/// 3b. The same single posts through the safe API (`Qp::send_buf_with`, each 8-byte buffer
/// moved into the QP and reclaimed after the round, untimed): Rust only, the safe path's cost
/// beside the raw `post` 1 and `post_built` above.
fn bench_post_safe(o: &Opts, p: &mut Pair) {
    let rounds = if o.callgrind { 2 } else { 11 };
    let k = if o.callgrind { 256 } else { POST_K };
    let mut v = Vec::with_capacity(rounds);
    let remote = Remote {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey(),
    };
    let mut bufs = safe_bufs(p, k);
    for r in -1..rounds as isize {
        // In posting order. Emptied in the loop, freed after it.
        let mut posting = std::mem::take(&mut bufs).into_iter();
        if r >= 0 {
            o.collect_on();
        }
        let t0 = Instant::now();
        while let Some(buf) = posting.next() {
            // The last one signaled.
            let flags = if posting.len() == 0 {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            p.a.qp
                .send_buf_with(SendOp::RdmaWrite(remote), buf, flags, None)
                .unwrap_or_else(|e| fail(&format!("send_buf: {e}")));
        }
        let dt = t0.elapsed();
        if r >= 0 {
            o.collect_off("post_safe", 1, k);
        }
        drop(posting);
        reclaim_round(p, &mut bufs, k);
        if r >= 0 {
            v.push(dt.as_nanos() as f64 / k as f64);
        }
    }
    o.report("post_safe", 1, v);
}

/// 3c. The safe post of a list: the whole round in one `Qp::send_bufs`, which posts lists of
/// `Qp::BUF_LIST` (32) per doorbell, every request signaled (rxe writes the flag like any
/// other): Rust only, beside the raw `post` 32 of prepared lists.
fn bench_post_safe_list(o: &Opts, p: &mut Pair) {
    let rounds = if o.callgrind { 2 } else { 11 };
    let k = if o.callgrind { 256 } else { POST_K };
    let mut v = Vec::with_capacity(rounds);
    let remote = Remote {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey(),
    };
    let mut bufs = safe_bufs(p, k);
    let list = Qp::BUF_LIST;
    for r in -1..rounds as isize {
        // In posting order. Emptied by the post, freed after it.
        let mut posting = std::mem::take(&mut bufs);
        if r >= 0 {
            o.collect_on();
        }
        let t0 = Instant::now();
        p.a.qp
            .send_bufs(SendOp::RdmaWrite(remote), &mut posting, SendFlags::SIGNALED)
            .unwrap_or_else(|e| fail(&format!("send_bufs: {e}")));
        let dt = t0.elapsed();
        if r >= 0 {
            o.collect_off("post_safe", list, k);
        }
        drop(posting);
        reclaim_round(p, &mut bufs, k);
        if r >= 0 {
            v.push(dt.as_nanos() as f64 / k as f64);
        }
    }
    o.report("post_safe", list, v);
}

/// `k` buffers of 8 bytes for the safe posts, from one region.
fn safe_bufs(p: &Pair, k: usize) -> Vec<Buf> {
    let region =
        p.pd.alloc_mr(k * 8, LocalAccess::LOCAL_WRITE)
            .unwrap_or_else(|e| fail(&format!("alloc_mr: {e}")));
    let bufs = region.into_bufs(8).unwrap_or_else(|e| fail(&format!("into_bufs: {e}")));
    if bufs.len() != k {
        fail("a buffer per request");
    }
    bufs
}

/// Reaps the round's completions and takes every buffer back into `bufs` (`k` in all).
fn reclaim_round(p: &mut Pair, bufs: &mut Vec<Buf>, k: usize) {
    let mut wc = [WorkCompletion::default(); 64];
    let deadline = Instant::now() + Duration::from_secs(30);
    while bufs.len() < k {
        for c in p.a.cq.reap(&mut wc).iter() {
            if c.status != WcStatus::SUCCESS {
                fail(&format!("completion {}: {:?}", c.wr_id, c.status));
            }
            while let Some(buf) = p.a.qp.reclaim(c) {
                bufs.push(buf);
            }
        }
        if Instant::now() > deadline {
            fail("post_safe: the buffers did not come back");
        }
    }
}

/// 3c. Receives posted one per call to a fresh SRQ of `POST_K` (no QP on it, so nothing
/// completes): raw (`Srq::post_recv`, the request built in the loop; `safe` false) or safe
/// (`Srq::recv_buf`, each 64-byte buffer moved into the SRQ and given back, untimed, by
/// `Srq::destroy_reclaim`). Rust only.
fn bench_srq_post(o: &Opts, p: &mut Pair, safe: bool) {
    let workload = if safe { "srq_post_safe" } else { "srq_post_built" };
    let rounds = if o.callgrind { 2 } else { 11 };
    let k = if o.callgrind { 256 } else { POST_K };
    let mut v = Vec::with_capacity(rounds);
    let region =
        p.pd.alloc_mr(k * MSG as usize, LocalAccess::LOCAL_WRITE)
            .unwrap_or_else(|e| fail(&format!("alloc_mr: {e}")));
    let raw: Vec<_> = (0..k)
        .map(|i| region.sge(i * MSG as usize, MSG).expect("in the MR"))
        .collect();
    let mut bufs = region
        .into_bufs(MSG as usize)
        .unwrap_or_else(|e| fail(&format!("into_bufs: {e}")));
    for r in -1..rounds as isize {
        let mut srq =
            p.pd.create_srq(&SrqInit::new(k as u32, 1))
                .unwrap_or_else(|e| fail(&format!("create_srq: {e}")));
        let mut posting = std::mem::take(&mut bufs).into_iter();
        if r >= 0 {
            o.collect_on();
        }
        let t0 = Instant::now();
        if safe {
            for buf in posting.by_ref() {
                srq.recv_buf(buf)
                    .unwrap_or_else(|e| fail(&format!("srq recv_buf: {e}")));
            }
        } else {
            for (i, sge) in raw.iter().enumerate() {
                // SAFETY: the region outlives the SRQ (its `Buf`s keep it), and nothing reads
                // or writes those bytes while the SRQ lives.
                unsafe { srq.post_recv(&[RecvWr::new(i as u64, std::slice::from_ref(sge))]) }
                    .unwrap_or_else(|e| fail(&format!("srq post_recv: {e}")));
            }
        }
        let dt = t0.elapsed();
        if r >= 0 {
            o.collect_off(workload, 1, k);
        }
        bufs.extend(posting);
        srq.destroy_reclaim(&mut bufs)
            .unwrap_or_else(|(_, e)| fail(&format!("destroy_srq: {e}")));
        if bufs.len() != k {
            fail("every buffer back from the SRQ");
        }
        if r >= 0 {
            v.push(dt.as_nanos() as f64 / k as f64);
        }
    }
    o.report(workload, 1, v);
}

/// 3d. Receives posted one per call to a fresh RC QP in INIT (receives are taken from INIT
/// on; nothing arrives, so nothing completes), `POST_K` deep as the pair's: raw
/// (`Qp::post_recv`, the request built in the loop; `safe` false) or safe (`Qp::recv_buf`,
/// each 64-byte buffer moved into the QP and dropped, untimed, with it). Rust only.
fn bench_recv_post(o: &Opts, p: &mut Pair, safe: bool) {
    let workload = if safe { "recv_safe" } else { "recv_built" };
    let rounds = if o.callgrind { 2 } else { 11 };
    let k = if o.callgrind { 256 } else { POST_K };
    let mut v = Vec::with_capacity(rounds);
    let cq = p.ctx.create_cq(1).unwrap_or_else(|e| fail(&format!("create_cq: {e}")));
    let raw_region =
        p.pd.alloc_mr(k * MSG as usize, LocalAccess::LOCAL_WRITE)
            .unwrap_or_else(|e| fail(&format!("alloc_mr: {e}")));
    let raw: Vec<_> = (0..k)
        .map(|i| raw_region.sge(i * MSG as usize, MSG).expect("in the MR"))
        .collect();
    for r in -1..rounds as isize {
        let mut init = QpInit::new(QpType::Rc, &cq, &cq);
        init.cap = QpCap {
            max_send_wr: 1,
            max_recv_wr: POST_K as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut qp =
            p.pd.create_qp(&init)
                .unwrap_or_else(|e| fail(&format!("create_qp: {e}")));
        qp.to_init(1, access())
            .unwrap_or_else(|e| fail(&format!("to_init: {e}")));
        let bufs = if safe {
            p.pd.alloc_mr(k * MSG as usize, LocalAccess::LOCAL_WRITE)
                .and_then(|region| region.into_bufs(MSG as usize))
                .unwrap_or_else(|e| fail(&format!("bufs: {e}")))
        } else {
            Vec::new()
        };
        let mut posting = bufs.into_iter();
        if r >= 0 {
            o.collect_on();
        }
        let t0 = Instant::now();
        if safe {
            for buf in posting.by_ref() {
                qp.recv_buf(buf).unwrap_or_else(|e| fail(&format!("recv_buf: {e}")));
            }
        } else {
            for (i, sge) in raw.iter().enumerate() {
                // SAFETY: the region outlives the QP, and nothing reads or writes those bytes
                // while the QP lives.
                unsafe { qp.post_recv(&[RecvWr::new(i as u64, std::slice::from_ref(sge))]) }
                    .unwrap_or_else(|e| fail(&format!("post_recv: {e}")));
            }
        }
        let dt = t0.elapsed();
        if r >= 0 {
            o.collect_off(workload, 1, k);
        }
        if posting.len() != 0 || (safe && qp.held_bufs().1 != k) {
            fail("every receive posted");
        }
        drop(qp);
        if r >= 0 {
            v.push(dt.as_nanos() as f64 / k as f64);
        }
    }
    o.report(workload, 1, v);
}

fn post_recv(s: &mut Side, id: u64) {
    let off = MR_LEN / 2 + (id % RECV_DEPTH) as usize * MSG as usize;
    let sge = [s.mr.sge(off, MSG).expect("in the MR")];
    // SAFETY: the slot is only rewritten by the device; the benchmark never reads it.
    unsafe { s.qp.post_recv(&[RecvWr::new(id, &sge)]) }.unwrap_or_else(|e| fail(&format!("post_recv: {e}")));
}

fn post_msg(s: &mut Side, id: u64) {
    let sge = [s.mr.sge(0, MSG).expect("in the MR")];
    // SAFETY: the MR outlives the request; the bytes are never rewritten.
    unsafe { s.qp.post_send(&[SendWr::new(id, SendOp::Send, &sge)]) }
        .unwrap_or_else(|e| fail(&format!("post_send: {e}")));
}

/// Polls until one receive completed (reposting it); counts send completions in `sends`.
fn wait_recv(s: &mut Side, sends: &mut usize) {
    let mut wc = [WorkCompletion::default(); 16];
    loop {
        let n = s.cq.poll(&mut wc);
        let mut recvd = 0;
        for c in &wc[..n] {
            if c.status != WcStatus::SUCCESS {
                fail("ping-pong: completion failed");
            }
            if c.opcode == WcOpcode::RECV {
                post_recv(s, c.wr_id + RECV_DEPTH);
                recvd += 1;
            } else {
                *sends += 1;
            }
        }
        if recvd > 1 {
            fail("ping-pong: more than one message in flight");
        }
        if recvd == 1 {
            return;
        }
    }
}

fn finish_sends(s: &mut Side, sends: usize, want: usize) {
    if want > sends {
        wait_completions(&mut s.cq, want - sends);
    }
}

/// 4a. Ping-pong between A and B (two threads): one-way latency = round trip / 2.
fn bench_pingpong(o: &Opts, p: &mut Pair) {
    let rounds = 5;
    let iters = 2000;
    let mut v = Vec::with_capacity(rounds);
    for i in 0..RECV_DEPTH {
        post_recv(&mut p.a, i);
        post_recv(&mut p.b, i);
    }
    for r in -1..rounds as isize {
        let n = if r < 0 { 200 } else { iters };
        let go = Barrier::new(2);
        let (a, b) = (&mut p.a, &mut p.b);
        let dt = std::thread::scope(|s| {
            s.spawn(|| {
                // The echo side: B answers each message.
                let mut sends = 0;
                go.wait();
                for i in 0..n {
                    wait_recv(b, &mut sends);
                    post_msg(b, i as u64);
                }
                finish_sends(b, sends, n);
            });
            let mut sends = 0;
            go.wait();
            let t0 = Instant::now();
            for i in 0..n {
                post_msg(a, i as u64);
                wait_recv(a, &mut sends);
            }
            let dt = t0.elapsed();
            finish_sends(a, sends, n);
            dt
        });
        if r >= 0 {
            v.push(dt.as_nanos() as f64 / n as f64 / 2.0);
        }
    }
    o.report("pingpong", MSG as usize, v);
}

/// 4b. One-way message rate A -> B, WINDOW sends in flight: ns per message.
fn bench_rate(o: &Opts, p: &mut Pair) {
    let rounds = 5;
    let total = 20000u64;
    let mut v = Vec::with_capacity(rounds);
    for r in -1..rounds as isize {
        let n = if r < 0 { 1000 } else { total };
        let go = Barrier::new(2);
        let (a, b) = (&mut p.a, &mut p.b);
        let dt = std::thread::scope(|s| {
            s.spawn(|| {
                // The receiving side: counts `n` receives, reposting each.
                let mut wc = [WorkCompletion::default(); 16];
                let mut got = 0u64;
                go.wait();
                while got < n {
                    let k = b.cq.poll(&mut wc);
                    for c in &wc[..k] {
                        if c.status != WcStatus::SUCCESS || c.opcode != WcOpcode::RECV {
                            fail("rate: unexpected completion at the receiver");
                        }
                        post_recv(b, c.wr_id + RECV_DEPTH);
                    }
                    got += k as u64;
                }
            });
            let mut wc = [WorkCompletion::default(); 16];
            let (mut posted, mut done) = (0u64, 0u64);
            go.wait();
            let t0 = Instant::now();
            while done < n {
                while posted < n && posted - done < WINDOW {
                    post_msg(a, posted);
                    posted += 1;
                }
                let k = a.cq.poll(&mut wc);
                for c in &wc[..k] {
                    if c.status != WcStatus::SUCCESS {
                        fail("rate: send failed");
                    }
                }
                done += k as u64;
            }
            t0.elapsed()
        });
        if r >= 0 {
            v.push(dt.as_nanos() as f64 / n as f64);
        }
    }
    o.report("rate", MSG as usize, v);
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        impl_name: "rust".into(),
        only: None,
        device: None,
        gid_index: 1,
        cq_depth: 8192,
        batches: DRAIN_BATCHES.to_vec(),
        drain_wait_ms: 20,
        rounds: None,
        callgrind: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--impl" => o.impl_name = value()?,
            "--only" => o.only = Some(value()?.split(',').map(String::from).collect()),
            "--device" => o.device = Some(value()?),
            "--gid-index" => o.gid_index = value()?.parse().map_err(|e| format!("--gid-index: {e}"))?,
            "--cq-depth" => o.cq_depth = value()?.parse().map_err(|e| format!("--cq-depth: {e}"))?,
            "--callgrind" => o.callgrind = true,
            "--drain-wait-ms" => o.drain_wait_ms = value()?.parse().map_err(|e| format!("--drain-wait-ms: {e}"))?,
            "--rounds" => o.rounds = Some(value()?.parse().map_err(|e| format!("--rounds: {e}"))?),
            "--batches" => {
                o.batches = value()?
                    .split(',')
                    .map(|b| b.parse().map_err(|e| format!("--batches: {e}")))
                    .collect::<Result<_, _>>()?;
                if o.batches.iter().any(|&b| b == 0 || b > 64) {
                    return Err("--batches: each between 1 and 64".into());
                }
            }
            // `cargo bench` passes --bench; accept and ignore it.
            "--bench" => {}
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "verbs_bench: {e}\nusage: verbs [--impl NAME] [--only W,...] [--device D] [--gid-index N] [--cq-depth N] [--batches B,...] [--drain-wait-ms N] [--rounds N] [--callgrind]"
            );
            return ExitCode::from(2);
        }
    };
    let open = || {
        Pair::open(&o).unwrap_or_else(|e| {
            fail(&format!(
                "{e}\n(needs an RDMA device: run through `cargo xtask bench`, which boots a guest with rdma_rxe)"
            ))
        })
    };
    if [
        "drain",
        "empty",
        "post",
        "post_built",
        "post_safe",
        "srq_post_built",
        "srq_post_safe",
        "recv_built",
        "recv_safe",
    ]
    .iter()
    .any(|w| o.wanted(w))
    {
        let mut p = open();
        if o.wanted("drain") {
            for &batch in &o.batches {
                bench_drain(&o, &mut p, Drain::Poll(batch));
            }
        }
        if o.wanted("empty") {
            bench_empty(&o, &mut p);
        }
        if o.wanted("post") {
            bench_post(&o, &mut p, 1);
            bench_post(&o, &mut p, 32);
        }
        if o.wanted("post_built") {
            bench_post_built(&o, &mut p);
            bench_post_built_list(&o, &mut p);
        }
        if o.wanted("post_safe") {
            bench_post_safe(&o, &mut p);
            bench_post_safe_list(&o, &mut p);
        }
        if o.wanted("srq_post_built") {
            bench_srq_post(&o, &mut p, false);
        }
        if o.wanted("srq_post_safe") {
            bench_srq_post(&o, &mut p, true);
        }
        if o.wanted("recv_built") {
            bench_recv_post(&o, &mut p, false);
        }
        if o.wanted("recv_safe") {
            bench_recv_post(&o, &mut p, true);
        }
    }
    if o.wanted("inplace") {
        bench_drain(&o, &mut open(), Drain::InPlace);
    }
    if o.wanted("inplace_copy") {
        bench_drain(&o, &mut open(), Drain::InPlaceCopy);
    }
    // Each on fresh queues: the replay leaves the CQ's ring out of step with the device.
    if o.wanted("drain_replay") {
        bench_replay(&o, &mut open(), false);
    }
    if o.wanted("drain_floor") {
        bench_replay(&o, &mut open(), true);
    }
    if o.wanted("pingpong") || o.wanted("rate") {
        if o.wanted("pingpong") {
            bench_pingpong(&o, &mut open());
        }
        if o.wanted("rate") {
            // Fresh receive queues: the ping-pong left its own receives posted.
            let mut p = open();
            for i in 0..RECV_DEPTH {
                post_recv(&mut p.b, i);
            }
            bench_rate(&o, &mut p);
        }
    }
    ExitCode::SUCCESS
}
