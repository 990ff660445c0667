//! The library on another architecture (a host step of `cargo xtask test`): for 64-bit Arm
//! (`aarch64-unknown-linux-gnu`) it must build without the mlx5 provider (the rxe rings are
//! shared with the kernel's CPUs, so Acquire and Release are the whole protocol on any
//! architecture), and a build with it must stop at the provider's own message: its device
//! barriers are written for x86-64 only (docs/mlx5-model.md, "Barriers"). `cargo check` only;
//! rustup adds the target's standard library when it is missing.

use crate::error::{bail, Context, Result};
use crate::{paths, proc};
use std::process::Command;

const TARGET: &str = "aarch64-unknown-linux-gnu";
/// What the mlx5 provider's `compile_error!` says first.
const MLX5_REFUSAL: &str = "the mlx5 provider orders its device memory for x86-64 only";

/// Runs both checks.
pub fn check() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running rustup")?;
    if !String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == TARGET)
    {
        let mut add = Command::new("rustup");
        add.args(["target", "add", TARGET]);
        note!("xtask: {}", proc::describe(&add));
        proc::check(&mut add)?;
    }
    let cargo = |features: &[&str]| {
        let mut c = crate::toolchain::cargo();
        c.args(["check", "-p", "uverbs", "--lib", "--target", TARGET])
            .args(features)
            .env("CARGO_TARGET_DIR", paths::target_dir().join(TARGET));
        c
    };
    let mut without = cargo(&["--no-default-features", "--features", "tokio"]);
    note!("xtask: {}", proc::describe(&without));
    proc::check(&mut without)?;
    let mut with = cargo(&["--features", "mlx5,tokio"]);
    note!(
        "xtask: {} (must stop at the mlx5 provider's refusal)",
        proc::describe(&with)
    );
    let out = with.output().context("running cargo check")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !stderr.contains(MLX5_REFUSAL) {
        bail!(
            "{TARGET} with the mlx5 feature: expected the build to stop at \"{MLX5_REFUSAL}\", got {} with:\n{stderr}",
            out.status
        );
    }
    Ok(())
}
