//! `cargo xtask loom`, `cargo xtask miri`, `cargo xtask fuzz [seconds]`: the rxe ring code
//! (`providers/rxe/queue.rs`) under a model checker, an interpreter that detects undefined
//! behaviour and data races, and a coverage-guided fuzzer. None needs an RDMA device or a
//! guest. `cargo xtask test` runs the loom model too (stable, about a minute); miri and
//! cargo-fuzz need a nightly toolchain, which a fresh machine does not have, so they stay
//! separate. docs/reliability.md has what they check and the
//! last results.
//!
//! - loom: `RUSTFLAGS="--cfg loom"`, its own target dir (`target/loom`), release; runs
//!   `providers::rxe::queue::model`. `LOOM_MAX_PREEMPTIONS` is passed through (default 3).
//! - miri: `cargo +nightly miri test` of `providers::rxe::queue::tests` (synthetic rings,
//!   threads standing in for the kernel, the hostile-ring harness) under several scheduler
//!   seeds. `MIRIFLAGS` from the environment replaces the default.
//! - fuzz: `cargo +nightly fuzz run rings` in `fuzz/` for the given seconds (default 60).

use crate::error::{bail, Result};
use crate::{paths, proc};
use std::process::{Command, ExitCode};

/// Runs `cmd` (`loom`, `miri` or `fuzz`) with the arguments after it.
pub fn run(cmd: &str, rest: &[String]) -> Result<ExitCode> {
    let root = paths::root();
    let mut c = match cmd {
        "loom" => loom(),
        "miri" => {
            require_nightly(
                &["miri", "--version"],
                "rustup toolchain install nightly --component miri rust-src",
            )?;
            let mut c = nightly_cargo();
            c.args(["miri", "test", "-p", "uverbs", "--lib", "--"])
                .args(["providers::rxe::queue::tests", "--nocapture"])
                .current_dir(&root);
            if std::env::var_os("MIRIFLAGS").is_none() {
                c.env("MIRIFLAGS", "-Zmiri-many-seeds=0..4");
            }
            c
        }
        "fuzz" => {
            require_nightly(&["fuzz", "--version"], "cargo install cargo-fuzz")?;
            let secs: u32 = match rest.first() {
                Some(s) => s
                    .parse()
                    .map_err(|_| crate::error::Error::msg(format!("`{s}` is not a number of seconds")))?,
                None => 60,
            };
            let mut c = nightly_cargo();
            c.args(["fuzz", "run", "rings", "--", &format!("-max_total_time={secs}")])
                .current_dir(root.join("fuzz"));
            c
        }
        other => bail!("unknown model command `{other}`"),
    };
    note!("xtask: {}", proc::describe(&c));
    let st = proc::status(&mut c)?;
    Ok(ExitCode::from(st.code().unwrap_or(1).clamp(0, 255) as u8))
}

/// The loom model of the ring index protocol (stable toolchain; `cargo xtask test` runs it
/// too).
pub fn loom() -> Command {
    let mut c = crate::testrun::cargo();
    c.args(["test", "-p", "uverbs", "--lib", "--release", "--"])
        .args(["providers::rxe::queue::model", "--nocapture", "--test-threads=1"])
        .env("RUSTFLAGS", "--cfg loom")
        .env("CARGO_TARGET_DIR", paths::target_dir().join("loom"));
    c
}

/// `cargo` of the nightly toolchain, without the variables that would pin the outer one.
fn nightly_cargo() -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", "nightly", "cargo"]);
    for v in ["CARGO", "RUSTC", "RUSTDOC", "RUSTUP_TOOLCHAIN", "RUSTFLAGS"] {
        c.env_remove(v);
    }
    c
}

/// Fails with `how` to install it unless `cargo +nightly <probe>` runs.
fn require_nightly(probe: &[&str], how: &str) -> Result<()> {
    let ok = nightly_cargo()
        .args(probe)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!(
            "`cargo +nightly {}` does not run; install it with `{how}`",
            probe.join(" ")
        );
    }
    Ok(())
}
