//! The safe API under random use: seeded sequences of safe calls only (regions cut into
//! `Buf`s, CQs of random depth, RC, UC, UD and RC-on-SRQ QPs in loopback pairs, state changes
//! valid and not, every safe post, reaps, reclaims, resizes, destroys while busy, drops in
//! random order, `fork()`), run round after round until the time budget is spent. Where the
//! RDMA CM is (`UVERBS_CM_ADDR`: rxe_cm on a dummy netdev in the test guest), rounds also
//! listen, connect (accepted, rejected, dropped on either side on the way up, or nobody
//! there or answering: typed rejects and timeouts), post over the connected QPs with the
//! same buffer accounting, disconnect from either side, and drop connections and listeners
//! while connected; those steps are [`CM_PER_MILLE`] of all. Without it (the mlx5
//! model) they are skipped and the summary says so.
//!
//! Every round checks that every `Buf` comes back exactly once (from a reclaim, a refusal or
//! a destroy), or is still held by a live queue as that queue counts it, or went down with a
//! dropped queue; that every failure is a typed `uverbs::Error` (nothing panics); that
//! `SendOp::Raw` is refused by every safe post; and that received and read bytes are what was
//! sent. In the test guest it also reads the kernel log: an oops, BUG or WARNING fails the
//! round.
//!
//! `UVERBS_SAFE_FUZZ_SEED` sets the seed. Without `UVERBS_SAFE_FUZZ_SECONDS` (the CI run) a
//! run is a fixed number of rounds (`UVERBS_SAFE_FUZZ_ROUNDS`; by default
//! [`DEFAULT_ROUNDS_RXE`] or [`DEFAULT_ROUNDS_MLX5`]): the same rounds on every machine,
//! whatever its speed, stopped early only at a time cap ([`ROUNDS_CAP_SECONDS`]). A round's
//! draws do not depend on timing, but what it sees does (which completions have arrived when
//! it polls), so the same round may still take another path on another run.
//! `UVERBS_SAFE_FUZZ_SECONDS=s` explores instead: rounds until `s` seconds are spent (with
//! `UVERBS_SAFE_FUZZ_ROUNDS`, whichever ends first). `UVERBS_SAFE_FUZZ_ROUND=n` replays round `n` alone, and
//! `UVERBS_SAFE_FUZZ_TRACE=1` prints every step as it runs (for a round that kills the
//! kernel, where the step log printed on failure never comes).

#![deny(unsafe_code)]

#[allow(unsafe_code)] // the shared set-up's raw-post helpers; none is used here
mod common;
mod figures;

/// Adds a line to the round's step log (`$r`: the `Round`).
macro_rules! step {
    ($r:expr, $($arg:tt)*) => {
        $r.log.push(format!($($arg)*))
    };
}

// The parts, in `tests/safe_fuzz/` (a folder without `main.rs`: no test target of its own).
// This file is the crate root, so each is named by its path.
#[path = "safe_fuzz/bookkeeping.rs"]
mod bookkeeping;
#[path = "safe_fuzz/cm.rs"]
mod cm;
#[path = "safe_fuzz/kmsg.rs"]
mod kmsg;
#[allow(unsafe_code)]
#[path = "safe_fuzz/process.rs"]
mod process;
#[path = "safe_fuzz/round.rs"]
mod round;
#[path = "safe_fuzz/verbs.rs"]
mod verbs;

use bookkeeping::{Log, Stats};
use common::{driver, open_test_device};
use figures::figure;
use kmsg::Kmsg;
use round::Round;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};
use uverbs::testing::Rng;

const DEFAULT_SEED: u64 = 0x5afe_f022;
/// Rounds of a run without `UVERBS_SAFE_FUZZ_SECONDS` (the CI run): about a minute on an
/// idle host (rxe in the guest under TCG: 5 rounds a second; the mlx5 model: 44), which is
/// what the 60 s budget the CI run had gave there.
const DEFAULT_ROUNDS_RXE: u64 = 300;
const DEFAULT_ROUNDS_MLX5: u64 = 2500;
/// Where a run of a fixed number of rounds stops early, on a host too busy for them (rxe in
/// the guest ran 0.6 rounds a second on a host shared by six builds): the rounds it ran are
/// the first of the same fixed set, never others.
const ROUNDS_CAP_SECONDS: u64 = 120;
/// Steps of the step log printed with a failure.
const LOG_STEPS: usize = 200;
const QKEY: u32 = 0x1111_1111;
/// The region all one-sided operations target: written here, read (a fixed pattern) there,
/// atomics on the words at the end.
const WRITE_AREA: usize = 0;
const READ_AREA: usize = 16 << 10;
const ATOMIC_AREA: usize = 32 << 10;
const TARGET_LEN: usize = ATOMIC_AREA + 64;
/// Longest message sent or read (a buffer may be larger: a receive fills all of it).
const MAX_MSG: usize = 64 << 10;
const UD_GRH: usize = 40;
/// Limits on what one round holds, to keep rounds short on TCG.
const MAX_QPS: usize = 10;
const MAX_CQS: usize = 5;
const MAX_SRQS: usize = 2;
const MAX_MRS: usize = 6;
const MAX_BUFS_PER_MR: usize = 256;
/// CQs and listeners on the RDMA CM's device at once.
const MAX_CM_CQS: usize = 3;
const MAX_LISTENERS: usize = 2;
/// The ports listeners bind (the round picks among them), and one nothing listens on.
const CM_PORTS: [u16; 3] = [7701, 7702, 7703];
const CM_PORT_NOBODY: u16 = 7709;
/// CM steps per thousand steps where the CM is (a connect takes tens of ms under TCG: about
/// a fifth of the run's time in the test guest). A fixed chance, not a share of the time, so
/// a round takes the same path whatever the machine's speed.
const CM_PER_MILLE: u64 = 25;
/// Queue ids of SRQs (those of QPs are twice the QP's index, plus one for its receives).
const SRQ_QUEUE: u32 = 1 << 20;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
        }
        Err(_) => default,
    }
}

/// Round `n`'s own seed.
fn round_seed(seed: u64, n: u64) -> u64 {
    Rng::new(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)).next_u64()
}
fn run_round(seed: u64, stats: &mut Stats, log: &mut Log) {
    let mut r = Round::new(seed, stats, log);
    let steps = 50 + r.rng.below(250);
    for _ in 0..steps {
        r.step();
    }
    r.teardown();
}

#[test]
fn random_safe_calls_lose_no_buffer_and_never_panic() {
    let seed = env_u64("UVERBS_SAFE_FUZZ_SEED", DEFAULT_SEED);
    // A time budget where one is asked for (to explore); else a fixed number of rounds, the
    // same ones on every machine, with the time cap as the only bound a slow one may hit.
    let seconds = std::env::var_os("UVERBS_SAFE_FUZZ_SECONDS").map(|_| env_u64("UVERBS_SAFE_FUZZ_SECONDS", 0));
    let rounds = match (std::env::var_os("UVERBS_SAFE_FUZZ_ROUNDS"), seconds) {
        (Some(_), _) => env_u64("UVERBS_SAFE_FUZZ_ROUNDS", 0),
        (None, Some(_)) => u64::MAX,
        (None, None) => match driver(&open_test_device()) {
            common::Driver::Rxe | common::Driver::Siw => DEFAULT_ROUNDS_RXE,
            common::Driver::Mlx5 => DEFAULT_ROUNDS_MLX5,
        },
    };
    let budget = Duration::from_secs(seconds.unwrap_or(ROUNDS_CAP_SECONDS));
    let only = std::env::var("UVERBS_SAFE_FUZZ_ROUND")
        .ok()
        .map(|_| env_u64("UVERBS_SAFE_FUZZ_ROUND", 0));
    let trace = std::env::var_os("UVERBS_SAFE_FUZZ_TRACE").is_some_and(|v| v != "0");
    let start = Instant::now();
    let mut stats = Stats {
        cm: cm_available(),
        ..Default::default()
    };
    let mut kmsg = Kmsg::open();
    let mut round = only.unwrap_or(0);
    loop {
        let mut log = Log::new(trace);
        let rseed = round_seed(seed, round);
        if trace {
            figure(format_args!("safe_fuzz: round {round}, seed {seed:#x}"));
        }
        let r = catch_unwind(AssertUnwindSafe(|| run_round(rseed, &mut stats, &mut log)));
        let kernel = kmsg.problems();
        if r.is_err() || !kernel.is_empty() {
            eprintln!(
                "safe_fuzz: round {round} failed; replay: UVERBS_SAFE_FUZZ_SEED={seed:#x} UVERBS_SAFE_FUZZ_ROUND={round}\nlast {} steps:\n{}",
                log.lines.len(),
                Vec::from(log.lines.clone()).join("\n")
            );
            if !kernel.is_empty() {
                eprintln!("kernel log:\n{}", kernel.join("\n"));
            }
            match r {
                Err(panic) => resume_unwind(panic),
                Ok(()) => panic!("round {round} (seed {seed:#x}): the kernel logged a problem: {kernel:?}"),
            }
        }
        stats.rounds += 1;
        round += 1;
        if only.is_some() || stats.rounds >= rounds {
            break;
        }
        if start.elapsed() >= budget {
            if rounds != u64::MAX {
                figure(format_args!(
                    "safe_fuzz: stopped at the {} s cap after {} of {rounds} rounds",
                    budget.as_secs(),
                    stats.rounds
                ));
            }
            break;
        }
    }
    let calls: u64 = stats.calls.values().sum();
    let cm_calls: u64 = stats
        .calls
        .iter()
        .filter(|(k, _)| k.starts_with("cm_"))
        .map(|(_, v)| v)
        .sum();
    let cm = match &stats.cm {
        Ok(ip) => format!(
            "CM on {ip}: {cm_calls} calls, {} ends connected, {:.1} s ({:.0}% of the run)",
            stats.cm_connections,
            stats.cm_time.as_secs_f64(),
            100.0 * stats.cm_time.as_secs_f64() / start.elapsed().as_secs_f64()
        ),
        Err(why) => format!("CM steps skipped ({why}), {cm_calls} CM calls"),
    };
    let errors: u64 = stats.errors.values().sum();
    fn list<K: std::fmt::Display>(m: &BTreeMap<K, u64>) -> String {
        m.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
    }
    figure(format_args!(
        "safe_fuzz (seed {seed:#x}, {:.0} s): {} rounds, {calls} calls ({}), {errors} typed errors ({}), \
         {} bufs tracked ({} given back, {} went down with their queue), {} completions, {} payloads checked, \
         {} raw ops refused, {} forks, {cm}, kernel log {}",
        start.elapsed().as_secs_f64(),
        stats.rounds,
        list(&stats.calls),
        list(&stats.errors),
        stats.bufs,
        stats.returned,
        stats.dropped_held,
        stats.completions,
        stats.payloads,
        stats.raw_refused,
        stats.forks,
        if kmsg.present() { "watched" } else { "not readable" },
    ));
}

/// The RDMA CM's address (`UVERBS_CM_ADDR`, which the test guest sets for rxe_cm on a dummy
/// netdev: the CM takes no loopback address), or why there is none (the mlx5 model has no
/// CM).
fn cm_available() -> std::result::Result<IpAddr, String> {
    let ip = std::env::var("UVERBS_CM_ADDR").map_err(|_| "UVERBS_CM_ADDR is not set: no RDMA CM device".to_string())?;
    let ip: IpAddr = ip.parse().map_err(|e| format!("UVERBS_CM_ADDR={ip:?}: {e}"))?;
    uverbs::cm::EventChannel::open().map_err(|e| format!("no RDMA CM: {e}"))?;
    Ok(ip)
}
