//! rxe completion queues: the kernel writes `struct ib_uverbs_wc` (the first 48 bytes of
//! each slot), which is byte-for-byte a [`WorkCompletion`].
//!
//! `poll` is the hot path (docs/benchmarks.md has its numbers). It reads the producer index
//! once, copies every ready completion it was asked for, and hands the slots back with one
//! index store; rdma-core's C provider takes a spinlock per call and loads and stores the
//! indices once per completion. The ready slots are one run `stride` bytes apart unless the
//! ring wraps inside them (once per lap), so the copy walks the run with a pointer, four
//! completions per step. Each completion moves as one 32-byte and one 16-byte AVX move where
//! the CPU has AVX (the copy is chosen once, when the CQ is created), else as one plain
//! 48-byte copy, whose moves the compiler picks.

use super::abi::MmInfo;
use super::queue::Consumer;
use super::RxeContext;
use crate::error::{Result, Verb};
use crate::provider::{CqRing, CreateCqCall, ReadyRun, ResizeCqCall};
use crate::wc::WorkCompletion;
use std::marker::PhantomData;
use zerocopy::IntoBytes;

pub(super) fn create(ctx: &RxeContext, cqe: u32, kernel: CreateCqCall<'_>) -> Result<Box<dyn CqRing>> {
    let mut mi = MmInfo::default();
    kernel(cqe, &[], mi.as_mut_bytes())?;
    let (ring, stride) = map_ring(ctx, &mi, "CREATE_CQ")?;
    let ctx = ctx.clone();
    // Each copy is its own type behind the `dyn CqRing`, so `poll` has no branch for it.
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        return Ok(Box::new(RxeCq::<Avx>::new(ring, stride, ctx)));
    }
    Ok(Box::new(RxeCq::<Baseline>::new(ring, stride, ctx)))
}

/// Maps a CQ ring; returns it with its slot size.
fn map_ring(ctx: &RxeContext, mi: &MmInfo, verb: Verb) -> Result<(Consumer, usize)> {
    let queue = ctx.map(mi, verb, size_of::<WorkCompletion>())?;
    let stride = queue.elem_size();
    Ok((Consumer::new(queue), stride))
}

struct RxeCq<K> {
    ring: Consumer,
    /// Bytes from one slot to the next (the ring's element size, at least 48).
    stride: usize,
    ctx: RxeContext,
    _take: PhantomData<K>,
}

impl<K> RxeCq<K> {
    fn new(ring: Consumer, stride: usize, ctx: RxeContext) -> Self {
        Self {
            ring,
            stride,
            ctx,
            _take: PhantomData,
        }
    }
}

// SAFETY: `ready_run` describes exactly the ready slots: the kernel finished writing each
// before its Release store of the producer index (read with Acquire), and leaves them alone
// until we release them, which only `consume` and `poll` (both `&mut self`) do. Slots are
// 64-byte aligned and at least 48 bytes (checked at map time), and every bit pattern is a
// valid `WorkCompletion`.
unsafe impl<K: Take> CqRing for RxeCq<K> {
    #[inline]
    fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
        poll::<K>(&mut self.ring, self.stride, wc)
    }

    #[inline]
    fn ready_run(&mut self) -> ReadyRun {
        let len = self.ring.ready();
        let run = self.ring.run(len);
        ReadyRun {
            first: run.first.cast(),
            before_wrap: run.before_wrap as usize,
            wrapped: run.wrapped.cast(),
            len: len as usize,
            stride: self.stride,
        }
    }

    fn consume(&mut self, n: usize) {
        self.ring.release(n as u32);
    }

    fn resize(&mut self, cqe: u32, kernel: ResizeCqCall<'_>) -> Result<u32> {
        let mut mi = MmInfo::default();
        let granted = kernel(cqe, &[], mi.as_mut_bytes())?;
        // The kernel copied the queued completions to the start of the new ring; the old
        // mapping goes when `ring` is replaced.
        (self.ring, self.stride) = map_ring(&self.ctx, &mi, "RESIZE_CQ")?;
        Ok(granted)
    }

    /// rxe arms through the kernel, which counts nothing: `events` is not needed.
    fn arm(&mut self, _solicited_only: bool, _events: u32, kernel: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        kernel()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// [`CqRing::poll`] on `ring`, whose slots are `stride` bytes apart. An empty CQ is answered
/// here; the rest is [`Take::take`], out of line.
#[inline(always)]
fn poll<K: Take>(ring: &mut Consumer, stride: usize, wc: &mut [WorkCompletion]) -> usize {
    let ready = ring.ready() as usize;
    if ready == 0 {
        return 0;
    }
    // SAFETY: an `RxeCq<K>` is only made where `K` runs (`create`; the tests check it
    // themselves).
    unsafe { K::take(ring, wc, stride, ready) }
}

/// How a CQ copies completions out of its ring: [`Baseline`] anywhere, [`Avx`] where the CPU
/// has it.
trait Take: Send + 'static {
    /// [`take_few`] with this copy, for `ready` (at least 1) ready completions. (`wc` comes
    /// before `stride` so that the `CqRing::poll` that jumps here need not move its arguments
    /// between registers.)
    ///
    /// # Safety
    /// The CPU must have the features this copy needs.
    unsafe fn take(ring: &mut Consumer, wc: &mut [WorkCompletion], stride: usize, ready: usize) -> usize;
}

/// The plain copy ([`copy`]), compiled for the target's baseline features.
struct Baseline;

impl Take for Baseline {
    #[inline(always)]
    unsafe fn take(ring: &mut Consumer, wc: &mut [WorkCompletion], stride: usize, ready: usize) -> usize {
        take_few_baseline(ring, wc, stride, ready)
    }
}

#[inline(never)]
fn take_few_baseline(ring: &mut Consumer, wc: &mut [WorkCompletion], stride: usize, ready: usize) -> usize {
    take_few(ring, stride, wc, ready, copy, take_many_baseline)
}

#[inline(never)]
fn take_many_baseline(ring: &mut Consumer, wc: &mut [WorkCompletion], stride: usize, ready: usize) -> usize {
    take_with(ring, stride, wc, ready, copy)
}

/// One 32-byte and one 16-byte AVX move per completion ([`copy_avx`]). Only made where the
/// CPU has AVX.
#[cfg(target_arch = "x86_64")]
struct Avx;

#[cfg(target_arch = "x86_64")]
impl Take for Avx {
    #[inline(always)]
    unsafe fn take(ring: &mut Consumer, wc: &mut [WorkCompletion], stride: usize, ready: usize) -> usize {
        // SAFETY: per the contract, the CPU has AVX.
        unsafe { take_few_avx(ring, wc, stride, ready) }
    }
}

/// [`take_few`] with AVX enabled, so that the copy inlines.
///
/// # Safety
/// The CPU must have AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline(never)]
unsafe fn take_few_avx(ring: &mut Consumer, wc: &mut [WorkCompletion], stride: usize, ready: usize) -> usize {
    let copy = |s, o: &mut WorkCompletion| {
        // SAFETY: `take_few` passes only ready slots, all `copy_avx` needs besides AVX, which
        // our caller guarantees.
        unsafe { copy_avx(s, o) }
    };
    let many = |ring: &mut Consumer, wc: &mut [WorkCompletion], stride, ready| {
        // SAFETY: our caller guarantees AVX.
        unsafe { take_many_avx(ring, wc, stride, ready) }
    };
    take_few(ring, stride, wc, ready, copy, many)
}

/// [`take_with`] with AVX enabled.
///
/// # Safety
/// The CPU must have AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline(never)]
unsafe fn take_many_avx(ring: &mut Consumer, wc: &mut [WorkCompletion], stride: usize, ready: usize) -> usize {
    let copy = |s, o: &mut WorkCompletion| {
        // SAFETY: `take_with` passes only ready slots, all `copy_avx` needs besides AVX, which
        // our caller guarantees.
        unsafe { copy_avx(s, o) }
    };
    take_with(ring, stride, wc, ready, copy)
}

/// Moves `min(ready, wc.len())` completions (`ready` at least 1) into `wc` and hands their
/// slots back with one index store; returns how many. One or two are moved right here with
/// `copy`, more (or none, for an empty `wc`: rare, so it gets no branch of its own) by `many`,
/// out of line so that taking one or two does not pay for the registers the loop needs
/// (`many` clamps `ready` itself, so that the call can be a jump). `copy(s, o)` is only called
/// with `s` pointing at a ready slot (as [`copy`] needs) and copies that completion to `o`.
#[inline(always)]
fn take_few(
    ring: &mut Consumer,
    stride: usize,
    wc: &mut [WorkCompletion],
    ready: usize,
    copy: impl Fn(*const u8, &mut WorkCompletion),
    many: impl FnOnce(&mut Consumer, &mut [WorkCompletion], usize, usize) -> usize,
) -> usize {
    match ready.min(wc.len()) {
        1 => {
            copy(ring.entry(0).as_ptr().cast_const(), &mut wc[0]);
            ring.release(1);
            1
        }
        2 => {
            copy(ring.entry(0).as_ptr().cast_const(), &mut wc[0]);
            copy(ring.entry(1).as_ptr().cast_const(), &mut wc[1]);
            ring.release(2);
            2
        }
        _ => many(ring, wc, stride, ready),
    }
}

/// Moves `min(ready, wc.len())` (0 or at least 3) completions of `ring`, `ready` of which are
/// ready, into `wc` with `copy` (as in [`take_few`]), releases their slots and returns how
/// many.
#[inline(always)]
fn take_with(
    ring: &mut Consumer,
    stride: usize,
    wc: &mut [WorkCompletion],
    ready: usize,
    copy: impl Fn(*const u8, &mut WorkCompletion),
) -> usize {
    let n = ready.min(wc.len());
    let wc = &mut wc[..n];
    let run = ring.run(n as u32);
    // rxe's slots are 128 bytes (its `struct rxe_cqe` rounded up to a power of two); with the
    // stride a constant the offsets fold into the moves. The slots are one run unless the
    // ring wraps inside them (once per lap).
    if stride != 128 || run.before_wrap as usize != n {
        return take_other(ring, stride, wc);
    }
    copy_run(run.first.as_ptr().cast_const(), 128, wc, &copy);
    ring.release(n as u32);
    n
}

/// [`take_with`] for the rare rest: a run that wraps, or another slot size. Out of line, with
/// the plain copy, so that the common case keeps its registers.
#[cold]
#[inline(never)]
fn take_other(ring: &mut Consumer, stride: usize, wc: &mut [WorkCompletion]) -> usize {
    let n = wc.len();
    let run = ring.run(n as u32);
    let (before, after) = wc.split_at_mut((run.before_wrap as usize).min(n));
    copy_run(run.first.as_ptr().cast_const(), stride, before, &copy);
    copy_run(run.wrapped.as_ptr().cast_const(), stride, after, &copy);
    ring.release(n as u32);
    n
}

/// Copies the completions at `s`, `s + stride`, ... into `out` with `copy`, four per step.
#[inline(always)]
fn copy_run(
    mut s: *const u8,
    stride: usize,
    out: &mut [WorkCompletion],
    copy: &impl Fn(*const u8, &mut WorkCompletion),
) {
    let (quads, rest) = out.split_at_mut(out.len() & !3);
    for q in quads.chunks_exact_mut(4) {
        copy(s, &mut q[0]);
        copy(s.wrapping_add(stride), &mut q[1]);
        copy(s.wrapping_add(2 * stride), &mut q[2]);
        copy(s.wrapping_add(3 * stride), &mut q[3]);
        s = s.wrapping_add(4 * stride);
    }
    for o in rest {
        copy(s, o);
        s = s.wrapping_add(stride);
    }
}

/// Copies the completion at `s` to `o`: one plain 48-byte copy, whose moves the compiler picks
/// (three 16-byte moves on x86-64). `s` is only ever a ready slot: 48 readable bytes, 64-byte
/// aligned, a completion the kernel finished writing ([`take_few`]'s callers pass nothing
/// else).
#[inline(always)]
fn copy(s: *const u8, o: &mut WorkCompletion) {
    // SAFETY: `s` is a ready slot (above); `o` is 48 writable bytes that do not overlap the
    // ring, and any bytes are a valid `WorkCompletion`.
    unsafe { std::ptr::copy_nonoverlapping(s, std::ptr::from_mut(o).cast::<u8>(), size_of::<WorkCompletion>()) }
}

/// Copies the completion at `s` to `o` as one 32-byte and one 16-byte move: 4 instructions,
/// where [`copy`] takes 6. With AVX enabled the compiler would pick two overlapping 32-byte
/// moves for [`copy`] instead, the same count but slower (docs/benchmarks.md).
///
/// # Safety
/// `s` must have 48 readable, 8-aligned bytes, and the CPU must have AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
unsafe fn copy_avx(s: *const u8, o: &mut WorkCompletion) {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm256_loadu_si256, _mm256_storeu_si256, _mm_loadu_si128, _mm_storeu_si128,
    };
    let d = std::ptr::from_mut(o).cast::<u8>();
    // SAFETY: per the contract for `s`; `d` is the 48-byte, 8-aligned `*o`, and any bytes are
    // a valid `WorkCompletion`. The moves are the unaligned kind.
    unsafe {
        let head = _mm256_loadu_si256(s.cast::<__m256i>());
        let tail = _mm_loadu_si128(s.add(32).cast::<__m128i>());
        _mm256_storeu_si256(d.cast::<__m256i>(), head);
        _mm_storeu_si128(d.add(32).cast::<__m128i>(), tail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::rxe::abi::queue as off;
    use crate::providers::rxe::queue::{
        tests::{heap_ring, report},
        Queue,
    };
    use std::sync::atomic::{AtomicU32, Ordering};

    type Poll = fn(&mut Consumer, usize, &mut [WorkCompletion]) -> usize;

    fn wc(i: u64) -> WorkCompletion {
        let mut w = WorkCompletion::default();
        w.wr_id = i;
        w.byte_len = i as u32 * 3;
        w.qp_num = 7;
        w.imm_data = !(i as u32);
        w.dlid_path_bits = 0xa5;
        w
    }

    /// Both copies, for three slot sizes, in runs and across the wrap of a 16-slot ring, asking
    /// for more or fewer completions than are ready.
    #[test]
    fn poll_copies_runs_and_wrapped_runs_exactly() {
        let kinds: Vec<(&str, Poll)> = vec![("baseline", poll::<Baseline>)];
        #[cfg(target_arch = "x86_64")]
        let kinds = if std::arch::is_x86_feature_detected!("avx") {
            [kinds, vec![("avx", poll::<Avx> as Poll)]].concat()
        } else {
            kinds
        };
        const SLOTS: u64 = 16;
        for (kind, poll) in kinds {
            for log2 in [6, 7, 8] {
                let q = Queue::new(heap_ring(log2, SLOTS as u32), "test", 48).unwrap();
                let stride = q.elem_size();
                let mut ring = Consumer::new(q);
                // Stands in for the kernel: writes slots, then the producer index, through the
                // ring's memory.
                let data = ring.entry(0).as_ptr();
                // SAFETY: the producer index word of the ring header, 4-aligned.
                let prod = unsafe { &*data.sub(off::DATA - off::PRODUCER_INDEX).cast::<AtomicU32>() };
                let (mut next, mut seen) = (0u64, 0u64);
                let mut out = [WorkCompletion::default(); 20];
                for step in 0..300u64 {
                    let room = SLOTS - 1 - (next - seen);
                    for _ in 0..(step * 7 % 16).min(room) {
                        // SAFETY: a slot of the heap ring that is not ready, so unread.
                        unsafe {
                            data.add((next % SLOTS) as usize * stride)
                                .cast::<WorkCompletion>()
                                .write(wc(next))
                        };
                        next += 1;
                    }
                    prod.store((next % SLOTS) as u32, Ordering::Release);
                    let ask = (step * 5 % 21) as usize;
                    let n = poll(&mut ring, stride, &mut out[..ask]);
                    assert_eq!(n, ask.min((next - seen) as usize), "{kind} {stride} step {step}");
                    for o in &out[..n] {
                        assert_eq!(*o, wc(seen), "{kind} {stride} step {step}");
                        seen += 1;
                    }
                }
                while poll(&mut ring, stride, &mut out[..1]) == 1 {
                    assert_eq!(out[0], wc(seen), "{kind} {stride}");
                    seen += 1;
                }
                assert_eq!(seen, next);
                assert!(next > 1000, "{next}");
                assert_eq!(poll(&mut ring, stride, &mut out), 0);
            }
        }
    }

    /// Valgrind's client requests (`<valgrind/callgrind.h>`), a no-op on a real CPU.
    mod callgrind {
        const BASE: u64 = ((b'C' as u64) << 24) | ((b'T' as u64) << 16);

        #[cfg(target_arch = "x86_64")]
        fn request(code: u64, arg1: u64) {
            let args: [u64; 6] = [code, arg1, 0, 0, 0, 0];
            // SAFETY: valgrind's amd64 client-request preamble (rdi rotated by 128 bits in all,
            // then `xchg rbx, rbx`): a no-op natively; valgrind reads the words at rax.
            unsafe {
                std::arch::asm!(
                    "rol rdi, 3", "rol rdi, 13", "rol rdi, 61", "rol rdi, 51", "xchg rbx, rbx",
                    in("rax") args.as_ptr(), inout("rdx") 0u64 => _, out("rdi") _, options(nostack),
                );
            }
        }

        #[cfg(not(target_arch = "x86_64"))]
        fn request(_code: u64, _arg1: u64) {}

        pub fn toggle_collect() {
            request(BASE + 2, 0);
        }

        pub fn dump_stats_at(name: &str) {
            let c = std::ffi::CString::new(name).unwrap();
            request(BASE + 3, c.as_ptr() as u64);
        }
    }

    /// `RxeCq` without its device file: the ring and stride behind a trait object.
    trait BenchPoll {
        fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize;
    }

    struct BenchCq<K> {
        ring: Consumer,
        stride: usize,
        _copy: PhantomData<K>,
    }

    impl<K: Take> BenchPoll for BenchCq<K> {
        #[inline]
        fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
            poll::<K>(&mut self.ring, self.stride, wc)
        }
    }

    const BENCH_SLOTS: u32 = 8192;
    const BENCH_READY: u32 = 4096;

    /// An rxe-shaped CQ ring (128-byte slots) on the heap, every slot a completion.
    fn bench_cq<K: Take>() -> (Box<dyn BenchPoll>, *const AtomicU32) {
        let q = Queue::new(heap_ring(7, BENCH_SLOTS), "bench", 48).unwrap();
        let stride = q.elem_size();
        let ring = Consumer::new(q);
        let data = ring.entry(0).as_ptr();
        for i in 0..BENCH_SLOTS as usize {
            // SAFETY: a slot of the heap ring, none ready yet.
            unsafe { data.add(i * stride).cast::<WorkCompletion>().write(wc(i as u64)) };
        }
        // SAFETY: the producer index word of the ring header.
        let prod = unsafe { data.sub(off::DATA - off::PRODUCER_INDEX).cast::<AtomicU32>() };
        let cq = BenchCq::<K> {
            ring,
            stride,
            _copy: PhantomData,
        };
        (Box::new(cq), prod)
    }

    /// Polls `total` completions `batch` at a time (`total` 0: `BENCH_READY` calls on an empty
    /// ring).
    #[inline(never)]
    fn drain(cq: &mut dyn BenchPoll, out: &mut [WorkCompletion; 64], batch: usize, total: usize) -> usize {
        let mut n = 0;
        if total == 0 {
            for _ in 0..BENCH_READY {
                n += cq.poll(&mut out[..batch]);
            }
            return n;
        }
        while n < total {
            n += cq.poll(&mut out[..batch]);
        }
        std::hint::black_box(out);
        n
    }

    /// The poll's cost per completion on an in-memory ring, for each copy: instructions
    /// (run the test binary under `valgrind --tool=callgrind --collect-atstart=no`; one dump
    /// per case) or native time (median of `UVERBS_POLL_BENCH_ROUNDS` rounds, default 201).
    /// `cargo test --release -p uverbs --lib poll_bench -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn poll_bench() {
        let rounds: usize = std::env::var("UVERBS_POLL_BENCH_ROUNDS").map_or(201, |v| v.parse().unwrap());
        let mut kinds: Vec<(&str, Box<dyn BenchPoll>, *const AtomicU32)> = Vec::new();
        let only = std::env::var("UVERBS_POLL_BENCH_KIND").ok();
        let add = |kinds: &mut Vec<_>, name: &'static str, (cq, prod)| {
            if only.as_deref().is_none_or(|o| o == name) {
                kinds.push((name, cq, prod));
            }
        };
        add(&mut kinds, "baseline", bench_cq::<Baseline>());
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            add(&mut kinds, "avx", bench_cq::<Avx>());
        }
        let cases = [
            (1usize, BENCH_READY as usize),
            (16, BENCH_READY as usize),
            (64, BENCH_READY as usize),
            (16, 0),
        ];
        let mut ns = vec![vec![Vec::new(); cases.len()]; kinds.len()];
        let mut out = [WorkCompletion::default(); 64];
        for round in 0..rounds {
            for (c, &(batch, total)) in cases.iter().enumerate() {
                for (k, (name, cq, prod)) in kinds.iter_mut().enumerate() {
                    // Replay: offer the next `total` slots (the ring is always full of completions).
                    // SAFETY: the header word of the ring `cq` owns.
                    let prod = unsafe { &**prod };
                    let cons = prod
                        .as_ptr()
                        .wrapping_add((off::CONSUMER_INDEX - off::PRODUCER_INDEX) / 4);
                    // SAFETY: the consumer index word, written only by `cq` (not running now).
                    let cons = unsafe { cons.read() };
                    prod.store((cons + total as u32) % BENCH_SLOTS, Ordering::Release);
                    let first = round == 0;
                    if first {
                        callgrind::toggle_collect();
                    }
                    let t = std::time::Instant::now();
                    let got = drain(&mut **cq, &mut out, batch, total);
                    let dt = t.elapsed();
                    if first {
                        callgrind::toggle_collect();
                        callgrind::dump_stats_at(&format!("{name} batch={batch} total={total}"));
                    }
                    assert_eq!(got, total);
                    ns[k][c].push(dt.as_nanos() as f64 / total.max(BENCH_READY as usize) as f64);
                }
            }
        }
        for (k, (name, _, _)) in kinds.iter().enumerate() {
            for (c, &(batch, total)) in cases.iter().enumerate() {
                let v = &mut ns[k][c];
                v.sort_by(f64::total_cmp);
                let what = if total == 0 {
                    "empty poll, per call"
                } else {
                    "per completion"
                };
                report(format!(
                    "poll_bench {name:12} batch {batch:2} {what:22} ns median {:.3} (p10 {:.3}, p90 {:.3})",
                    v[v.len() / 2],
                    v[v.len() / 10],
                    v[v.len() * 9 / 10]
                ));
            }
        }
    }
}
