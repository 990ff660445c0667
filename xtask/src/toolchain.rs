//! The cargo a step runs: this toolchain's at the repository root ([`cargo`]), or one of
//! rustup's toolchains ([`toolchain_cargo`]), the nightly one installed on demand
//! ([`ensure_nightly`]). Shared by `cargo xtask test` and the steps it runs, and imports none
//! of them.

use crate::error::{bail, Result};
use crate::{paths, proc};
use std::process::Command;

/// `cargo` of the toolchain running xtask, in the repository root.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(paths::root());
    c
}

/// `cargo` of the nightly toolchain, without the variables that would pin the outer one.
pub fn nightly_cargo() -> Command {
    toolchain_cargo("nightly")
}

/// `cargo` of rustup's `toolchain`, without the variables that would pin the outer one.
pub fn toolchain_cargo(toolchain: &str) -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", toolchain, "cargo"]);
    for v in [
        "CARGO",
        "RUSTC",
        "RUSTDOC",
        "RUSTUP_TOOLCHAIN",
        "RUSTFLAGS",
        "CARGO_TARGET_DIR",
    ] {
        c.env_remove(v);
    }
    c
}

/// Makes sure the nightly toolchain with `miri` and `rust-src` is installed, installing
/// what is missing with rustup.
pub fn ensure_nightly() -> Result<()> {
    if nightly_has_miri() {
        return Ok(());
    }
    let mut install = Command::new("rustup");
    install.args(["toolchain", "install", "nightly", "--profile", "minimal"]);
    install.args(["--component", "miri", "--component", "rust-src"]);
    note!(
        "xtask: the nightly toolchain with miri is missing; {}",
        proc::describe(&install)
    );
    if proc::check(&mut install).is_err() || !nightly_has_miri() {
        bail!(
            "miri and the fuzzer's AddressSanitizer need the nightly toolchain with its `miri` and \
             `rust-src` components, and rustup could not install them; on a machine that can, run \
             `rustup toolchain install nightly --component miri --component rust-src`"
        );
    }
    Ok(())
}

fn nightly_has_miri() -> bool {
    nightly_cargo()
        .args(["miri", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
