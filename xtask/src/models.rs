//! `cargo xtask loom`, `cargo xtask miri`, `cargo xtask fuzz [seconds]`: the rxe ring code
//! (`providers/rxe/queue.rs`) and the mlx5 provider's shared state under a model checker, the
//! unit tests of every module with `unsafe` code under an interpreter that detects undefined
//! behaviour and data races, and the rings and CQE decoder under a coverage-guided fuzzer.
//! None needs
//! an RDMA device or a guest, and `cargo xtask test` runs all three (fuzzing for
//! [`CI_FUZZ_SECONDS`]). docs/reliability.md has what they check and the last results.
//!
//! - loom: `RUSTFLAGS="--cfg loom"`, its own target dir (`target/loom`), release; runs
//!   `providers::rxe::queue::model` and `providers::mlx5::qp::model`. `LOOM_MAX_PREEMPTIONS` is passed through (default 3).
//! - miri: `cargo +nightly miri test` of the unit tests of every module with `unsafe` code
//!   ([`MIRI_TESTS`]; an architecture test keeps it complete) and of the mlx5 WQE encoders and
//!   CQE decoder, under several scheduler seeds. `MIRIFLAGS` from the environment replaces
//!   the default.
//! - fuzz: builds `fuzz/`'s targets the way `cargo fuzz build` does (libFuzzer, sanitizer
//!   coverage, AddressSanitizer, `--cfg fuzzing`), so no `cargo-fuzz` install is needed, and
//!   runs `rings` (the rxe rings) for the given seconds on `fuzz/corpus/rings`, then
//!   `mlx5_cqe` (the mlx5 CQ's poll and CQE decoder) and `mlx5_device` (the mlx5 device model)
//!   for half as long each, and `siw_cqe` (the siw CQ's poll, CQE translation and slot
//!   protocol) for a quarter, on `fuzz/corpus/<target>`.
//!   `cargo +nightly fuzz run <target>` does the same where cargo-fuzz is installed.
//!
//! miri and the sanitizers need the nightly toolchain. When it (or its `miri` and `rust-src`
//! components) is missing, these commands install it with rustup and fail, saying so, if
//! that is impossible.

use crate::error::{bail, Context, Result};
use crate::toolchain::{cargo, ensure_nightly, nightly_cargo};
use crate::{paths, proc};
use std::process::{Command, ExitCode};

/// How long `cargo xtask test` fuzzes.
pub const CI_FUZZ_SECONDS: u32 = 60;

/// The loom models: the rxe ring-index protocol, the mlx5 QP's poster/poller shared state.
const LOOM_MODELS: [&str; 2] = ["providers::rxe::queue::model", "providers::mlx5::qp::model"];

/// The unit tests miri runs: those of every module with `unsafe` code (an architecture test
/// keeps this list complete, less `MIRI_EXEMPT`) and the pure mlx5 encoders and decoder.
/// A single test that needs what miri cannot emulate (another process) is
/// `#[cfg_attr(miri, ignore)]` where it is, with the reason.
pub(crate) const MIRI_TESTS: [&str; 25] = [
    // Core: the in-place batch, libibverbs-layout chains, the front-end interface's default
    // chain post and the QP's two views of its queues, the held-buffer rings, the pieces of a
    // region, the QP's mask checks, the rdma_ucm command framing.
    "batch::tests",
    "chain::tests",
    "front_end::tests",
    "held::tests",
    "held::srq::tests",
    "mr::tests",
    "qp::tests",
    "sys::ucma::tests",
    // rxe: the ring-index protocol, synthetic and hostile rings, the poll, the WQE writer.
    "providers::rxe::queue::tests",
    "providers::rxe::cq::tests",
    "providers::rxe::qp::tests",
    // siw: the VALID-flag slot protocol and ring geometry, the CQE translation and poll with
    // the hostile-ring harness, the send and receive slot writers.
    "providers::siw::ring::tests",
    "providers::siw::cq::tests",
    "providers::siw::qp::tests",
    // mlx5: the WQE segment encoders, the CQE decoder, the poster/poller tables, the CQ's
    // poller gate, the CQ poll and resize, hostile CQEs, the QP and SRQ rings, doorbell
    // records, address vectors.
    "providers::mlx5::wqe::tests",
    "providers::mlx5::cqe::tests",
    "providers::mlx5::qp::shared::tests",
    "providers::mlx5::cq::gate::tests",
    "providers::mlx5::cq::tests",
    "providers::mlx5::cq::hostile::tests",
    "providers::mlx5::qp::tests",
    "providers::mlx5::srq::tests",
    "providers::mlx5::tests",
    "providers::mlx5::mem::tests",
    "providers::mlx5::ah::tests",
];

/// Test modules of files with `unsafe` code that miri does not run, and why.
#[cfg(test)]
pub(crate) const MIRI_EXEMPT: [(&str, &str); 7] = [
    (
        "providers::rxe::queue::model",
        "loom models, built only with `--cfg loom` (`cargo xtask loom`)",
    ),
    (
        "providers::mlx5::qp::model",
        "loom models, built only with `--cfg loom` (`cargo xtask loom`)",
    ),
    (
        "providers::rxe::queue::provider_fuzz",
        "maps a regular file as the device, which miri cannot mmap; its rings run under miri in \
         `providers::rxe::queue::tests`",
    ),
    (
        "providers::siw::cq::hostile",
        "the hostile-ring harness, no tests of its own: `providers::siw::cq::tests` runs it under \
         miri",
    ),
    (
        "sys::membarrier::tests",
        "the membarrier(2) syscall itself, which miri lacks (built without it under miri)",
    ),
    (
        "sys::cmd::tests",
        "frames each command into a pipe(2) and reads the installed kernel header, which miri \
         cannot do (ignored there)",
    ),
    (
        "sys::mapping::tests",
        "fork(2) and what a child sees of its mappings, which miri cannot run (ignored there)",
    ),
];

/// The fuzz target's host triple (`-Zsanitizer` needs an explicit `--target`).
const FUZZ_TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// Runs `cmd` (`loom`, `miri` or `fuzz`) with the arguments after it.
pub fn run(cmd: &str, rest: &[String]) -> Result<ExitCode> {
    let mut steps = match cmd {
        "loom" => vec![loom()],
        "miri" => vec![miri()?],
        "fuzz" => {
            let secs: u32 = match rest.first() {
                Some(s) => s
                    .parse()
                    .map_err(|_| crate::error::Error::msg(format!("`{s}` is not a number of seconds")))?,
                None => CI_FUZZ_SECONDS,
            };
            fuzz(secs)?
        }
        other => bail!("unknown model command `{other}`"),
    };
    for c in &mut steps {
        note!("xtask: {}", proc::describe(c));
        let st = proc::status(c)?;
        if !st.success() {
            return Ok(ExitCode::from(st.code().unwrap_or(1).clamp(1, 255) as u8));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The loom model of the ring index protocol (stable toolchain).
pub fn loom() -> Command {
    let mut c = cargo();
    c.args(["test", "-p", "uverbs", "--lib", "--release", "--"])
        .args(LOOM_MODELS)
        .args(["--nocapture", "--test-threads=1"])
        .env("RUSTFLAGS", "--cfg loom")
        .env("CARGO_TARGET_DIR", paths::target_dir().join("loom"));
    c
}

/// [`MIRI_TESTS`] under miri, four scheduler seeds.
pub fn miri() -> Result<Command> {
    ensure_nightly()?;
    let mut c = nightly_cargo();
    c.args(["miri", "test", "-p", "uverbs", "--lib", "--"])
        .args(MIRI_TESTS)
        .arg("--nocapture")
        .current_dir(paths::root());
    if std::env::var_os("MIRIFLAGS").is_none() {
        c.env("MIRIFLAGS", "-Zmiri-many-seeds=0..4");
    }
    Ok(c)
}

/// Builds the fuzz target and runs it for `secs` seconds: two commands, in order.
pub fn fuzz(secs: u32) -> Result<Vec<Command>> {
    ensure_nightly()?;
    let dir = paths::root().join("fuzz");
    let targets = [
        ("rings", secs),
        ("mlx5_cqe", secs / 2),
        ("mlx5_device", secs / 2),
        ("siw_cqe", secs / 4),
    ];
    for (target, _) in targets {
        for d in ["corpus", "artifacts"] {
            let d = format!("{d}/{target}");
            std::fs::create_dir_all(dir.join(&d)).context(format!("creating fuzz/{d}"))?;
        }
    }
    // What `cargo fuzz build` passes (cargo-fuzz 0.13, default options).
    let rustflags = [
        "-Cpasses=sancov-module",
        "-Cllvm-args=-sanitizer-coverage-level=4",
        "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
        "-Cllvm-args=-sanitizer-coverage-pc-table",
        "-Cllvm-args=-sanitizer-coverage-trace-compares",
        "--cfg fuzzing",
        "-Zsanitizer=address",
        "-Cdebug-assertions",
        "-Coverflow-checks",
    ]
    .join(" ");
    let mut build = nightly_cargo();
    build
        .args(["build", "--release", "--bins", "--target", FUZZ_TRIPLE])
        .env("RUSTFLAGS", rustflags)
        .current_dir(&dir);
    let mut chain = vec![build];
    for (target, secs) in targets {
        let mut run = Command::new(dir.join("target").join(FUZZ_TRIPLE).join("release").join(target));
        run.arg(format!("-max_total_time={secs}"))
            .arg(format!("-artifact_prefix=artifacts/{target}/"))
            .arg(format!("corpus/{target}"))
            .current_dir(&dir);
        chain.push(run);
    }
    Ok(chain)
}
