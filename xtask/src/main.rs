//! `cargo xtask`: runs uverbs against the real `rdma_rxe` kernel driver in a
//! QEMU guest that boots the host's Debian kernel and shares the host's root
//! filesystem (read-only 9p under a tmpfs overlay), so host binaries run as is.
//!
//! Commands:
//! - `cargo xtask guest [--] <command...>`: run a shell command in the guest
//!   (cwd = project root, `/bin/sh -c`) with `rxe0` on `lo`; its output is
//!   streamed and its exit status returned.
//! - `cargo xtask test [-- <args for test binaries>]`: all tests. Host unit and
//!   doc tests, the loom model, miri and 60 s of fuzzing of the ring code, then
//!   the integration test binaries (`--test-threads=1`) and
//!   executable `tests/guest/*.sh` against an rxe device; ends with
//!   `guest <release>: N passed, M failed` for each kernel the guest suite ran on (Debian
//!   12's 6.1 and 6.12), then `guest: N passed, M failed` (M also counts failed host steps
//!   and builds).
//! - `cargo xtask guest --suite [--kernel K] [-- <test args>]`: only that guest suite.
//!   After the host steps it runs the mlx5 model checks on the host (Debian's
//!   C libmlx5 on the model: `ibv_devices`, `ibv_devinfo -v`, ibv_rc_pingpong and
//!   ibv_uc_pingpong pairs, `tests/mlx5/verbs_check.c`; then the Rust demo and
//!   rc_pingpong with the Rust mlx5 provider, the latter against ibv_rc_pingpong
//!   both ways, the differential and the integration suite; then the same on the model's
//!   RoCE port, with the Rust uc/ud/srq pingpongs against Debian's too; xtask/src/mlx5.rs),
//!   each item counted in that line.
//! - `cargo xtask mlx5 [--roce] [--] <command...>`: build the mlx5 device model
//!   (`cargo build -p uverbs-mlx5-model`) and run a shell command on it on the
//!   host (cwd = project root, `/bin/sh -c`, `UVERBS_MLX5_MODEL_DIR` set to a
//!   fresh `target/mlx5-model/<pid>-<n>/`, `LD_PRELOAD` to the interposer); its
//!   exit status is returned (docs/mlx5-model.md); `--roce` gives the model a RoCE port
//!   (`UVERBS_MLX5_MODEL_LINK=eth`) instead of an InfiniBand one. `cargo xtask mlx5 --step` runs
//!   only the mlx5 step of `cargo xtask test` and prints each item.
//! - `cargo xtask demo`: build and run `examples/demo` (release) in the guest.
//! - `cargo xtask loom`, `cargo xtask miri`, `cargo xtask fuzz [seconds]`: the
//!   rxe ring code and the mlx5 CQ/QP code under loom, the unit tests of every module
//!   with `unsafe` under miri (nightly), the rings and CQE decoder under libFuzzer with
//!   ASan (nightly;
//!   xtask installs nightly if missing); no device needed (xtask/src/models.rs, docs/reliability.md).
//! - `cargo xtask cross`: `cargo check` of the library for aarch64 (xtask/src/cross.rs).
//! - `cargo xtask public-api [--bless]`: the library's public items (rustdoc's JSON, nightly)
//!   against the snapshot `tests/public-api.txt`, or written to it.
//! - `cargo xtask bench`: benchmarks against rdma-core's C provider in one
//!   guest boot; table and plot in `target/bench/`, the three rxe instruction tables
//!   into docs/benchmarks.md. `--report` redoes tables, plot and doc parts; `--mlx5`
//!   runs only the mlx5 step (its table into the doc); `--cm` runs only the
//!   connection-setup benchmark (Rust `cmatose` against C `ucmatose`); `--stream` only
//!   the stream's instructions per byte against rsockets (tests/stream/callgrind.sh);
//!   `--cq-copy` only the rxe provider's CQE copies, natively on the host (the ignored
//!   unit test `poll_bench` of providers/rxe/cq.rs, timed and under callgrind).
//!   Each writes its tables into docs/benchmarks.md between their markers, with the
//!   command, commit and date (`--cm --report`, `--stream --report`, `--cq-copy --report`
//!   from the last run's files).
//!
//! Environment knobs:
//! - `UVERBS_GUEST_KERNEL=<spec>` (or `--kernel <spec>`): kernel to boot (default: newest
//!   `/boot/vmlinuz-*` with modules in `/lib/modules`). An installed release or a version
//!   prefix of one (`6.1`); otherwise a Debian package (`6.12`: the newest
//!   `linux-image-6.12.*-amd64` apt knows; a release; a package name; a `.deb`), downloaded,
//!   unpacked and depmod'ed under `target/guest/kernels/` (xtask/src/kernel_pkg.rs).
//! - `UVERBS_GUEST_KERNELS=<spec>,<spec>`: the kernels `cargo xtask test` and
//!   `cargo xtask guest --suite` run the guest suite on (default `6.1,6.12`; a set
//!   `UVERBS_GUEST_KERNEL` means only that one).
//! - `UVERBS_GUEST_TIMEOUT=<s>`: limit for a whole QEMU run (default 1200; 4800 for the suite).
//! - `UVERBS_GUEST_TEST_TIMEOUT=<s>`: limit per test binary/script (default 600).
//! - `UVERBS_GUEST_KVM=1`: use KVM instead of TCG (only where KVM works).
//! - `UVERBS_GUEST_MEM_MIB`, `UVERBS_GUEST_CPUS`: guest size (default 2048, 2).
//! - `UVERBS_NATIVE=1`: run tests and demo on the host instead of a guest;
//!   `UVERBS_NATIVE=0`: always use a guest. Unset: native iff the host has
//!   `/sys/class/infiniband_verbs/uverbs*`.
//! - `UVERBS_MLX5_TIMEOUT=<s>`: limit per mlx5 model item (default 300);
//!   `UVERBS_MLX5_MODEL_LOG=1`: the model logs to stderr.
//!
//! `RUST_*` and `UVERBS_*` variables are passed into the guest. Files go to
//! `target/guest/`: cached `vmlinux-<release>` and initramfs, `kernel.log`
//! (the guest's kernel console, ttyS1) of the last run.

/// `eprintln!` that ignores a closed stderr (e.g. `| head`) instead of panicking.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that ignores a closed stderr.
macro_rules! note_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

/// `println!` that ignores a closed stdout.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

#[cfg(test)]
mod architecture;
mod bench;
mod cpio;
mod cross;
mod doc_examples;
#[cfg(test)]
mod doc_refs;
mod error;
mod guest;
mod initramfs;
mod json;
mod kernel;
mod kernel_pkg;
mod mlx5;
mod mlx5_diff;
mod models;
mod msrv;
mod packages;
mod proc;
mod public_api;
mod qemu;
mod siw_module;
mod testrun;
mod toolchain;

use error::{bail, Context, Result};
use std::path::Path;
use std::process::ExitCode;

/// Kernel release override.
pub const ENV_KERNEL: &str = "UVERBS_GUEST_KERNEL";
/// Whole-run timeout in seconds.
pub const ENV_TIMEOUT: &str = "UVERBS_GUEST_TIMEOUT";
/// KVM opt-in.
pub const ENV_KVM: &str = "UVERBS_GUEST_KVM";
/// Native (no guest) override.
pub const ENV_NATIVE: &str = "UVERBS_NATIVE";

const USAGE: &str = "\
usage: cargo xtask guest [--kernel K] [--] <command...>
                                             run a shell command in the rxe guest (K: a kernel
                                             release or version, e.g. 6.1 or 6.12; a package is
                                             fetched if it is not installed)
       cargo xtask guest --suite [--kernel K] [-- <test args>]
                                             only the guest suite of `test` (default: on 6.1 and 6.12)
       cargo xtask test [-- <test args>]     run all tests (host, mlx5 model, rxe guest)
       cargo xtask mlx5 [--roce] [--] <command...>
                                             run a shell command on the mlx5 device model
                                             (with a RoCE port instead of InfiniBand)
       cargo xtask mlx5 --step               run only the mlx5 model checks of `test`
       cargo xtask demo                      build and run examples/demo in the guest
       cargo xtask bench [--report]          benchmarks against rdma-core's C provider
       cargo xtask bench --mlx5              only the mlx5 provider against libmlx5, on the model
       cargo xtask bench --cm [--report]     connection setup: Rust cmatose against C ucmatose
       cargo xtask bench --stream [--report] uverbs::stream against C rsockets, Ir per byte
       cargo xtask bench --cq-copy [--report]
                                             the rxe CQE copies (AVX, plain), natively: Ir and ns
       cargo xtask loom|miri|fuzz [secs]     loom, miri (unsafe modules' unit tests), libFuzzer
       cargo xtask msrv                      the declared rust-version against dependencies and std APIs
       cargo xtask public-api [--bless]      the public API against tests/public-api.txt (or write it)
       cargo xtask cross                     the library for aarch64: rxe builds, the mlx5 provider refuses
(environment knobs: see the doc comment of xtask/src/main.rs)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match dispatch(&args) {
        Ok(code) => code,
        Err(e) => {
            note!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(args: &[String]) -> Result<ExitCode> {
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => ("help", &[][..]),
    };
    let rest = rest.strip_prefix(&["--".to_string()]).unwrap_or(rest);
    match cmd {
        "guest" => guest_command(&args[1..]),
        "test" => testrun::run(rest),
        "mlx5" => mlx5::run(rest),
        "demo" => demo(),
        "loom" | "miri" | "fuzz" => models::run(cmd, rest),
        "bench" => bench::run(rest),
        "msrv" => msrv::check().map(|()| ExitCode::SUCCESS),
        "public-api" => public_api::run(rest),
        "cross" => cross::check().map(|()| ExitCode::SUCCESS),
        "help" | "-h" | "--help" => {
            say!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        other => bail!("unknown command `{other}`\n{USAGE}"),
    }
}

/// `cargo xtask guest [--kernel <spec>] [--suite] [--] <command or test args...>`.
fn guest_command(args: &[String]) -> Result<ExitCode> {
    let mut rest = args;
    let mut suite = false;
    loop {
        match rest.split_first() {
            Some((a, r)) if a == "--suite" => {
                suite = true;
                rest = r;
            }
            Some((a, r)) if a == "--kernel" => {
                let (k, r) = r
                    .split_first()
                    .with_context(|| format!("--kernel needs a kernel\n{USAGE}"))?;
                // guest::run and the suite boot what this variable names.
                std::env::set_var(ENV_KERNEL, k);
                rest = r;
            }
            Some((a, r)) if a.starts_with("--kernel=") => {
                std::env::set_var(ENV_KERNEL, &a["--kernel=".len()..]);
                rest = r;
            }
            _ => break,
        }
    }
    let rest = rest.strip_prefix(&["--".to_string()]).unwrap_or(rest);
    if suite {
        return testrun::suite_only(rest);
    }
    if rest.is_empty() {
        bail!("`cargo xtask guest` needs a command to run\n{USAGE}");
    }
    run_in_guest(&rest.join(" "))
}

/// Runs `command` in a guest and returns its exit status.
fn run_in_guest(command: &str) -> Result<ExitCode> {
    let report = guest::run(&guest::Job {
        command: command.to_string(),
        files: Vec::new(),
    })?;
    match (report.status, &report.failure) {
        (Some(s), None) => Ok(ExitCode::from(s.clamp(0, 255) as u8)),
        // The guest died, or its kernel logged a problem (whatever the command's status).
        (_, Some(why)) => bail!("{why}"),
        (None, None) => bail!("the guest reported no exit status"),
    }
}

/// `cargo xtask demo`.
fn demo() -> Result<ExitCode> {
    let root = paths::root();
    if !root.join("examples/demo.rs").is_file() && !root.join("examples/demo/main.rs").is_file() {
        bail!("there is no demo yet: neither examples/demo.rs nor examples/demo/main.rs exists");
    }
    let mut c = toolchain::cargo();
    c.args(["build", "-p", "uverbs", "--release", "--example", "demo"]);
    proc::check(&mut c)?;
    let exe = paths::target_dir().join("release/examples/demo");
    if native() {
        let mut c = std::process::Command::new("sh");
        c.args(["-c", "ulimit -l unlimited 2>/dev/null; exec \"$0\""])
            .arg(&exe)
            .current_dir(&root);
        let st = proc::status(&mut c)?;
        return Ok(ExitCode::from(st.code().unwrap_or(1).clamp(0, 255) as u8));
    }
    run_in_guest(&proc::sh_quote(&exe.to_string_lossy()))
}

/// Whether tests and the demo run on the host (see `UVERBS_NATIVE`).
pub fn native() -> bool {
    match std::env::var(ENV_NATIVE).as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => std::fs::read_dir("/sys/class/infiniband_verbs").is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("uverbs"))
        }),
    }
}

/// Reads a numeric environment knob, with a default when unset or empty.
pub fn env_number<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .ok()
            .with_context(|| format!("{name}={v} is not a valid number")),
        _ => Ok(default),
    }
}

/// Writes `data` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// Project paths.
pub mod paths {
    use std::path::{Path, PathBuf};

    /// The workspace root (parent of xtask/).
    pub fn root() -> PathBuf {
        let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
        xtask.parent().unwrap_or(xtask).to_path_buf()
    }

    /// Cargo's target directory (`CARGO_TARGET_DIR`, else `<root>/target`).
    pub fn target_dir() -> PathBuf {
        match std::env::var_os("CARGO_TARGET_DIR") {
            Some(d) if !d.is_empty() => root().join(d),
            _ => root().join("target"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_are_errors() {
        assert!(dispatch(&["nope".into()]).is_err());
        assert!(dispatch(&["guest".into(), "--".into()]).is_err());
        assert!(dispatch(&["mlx5".into(), "--".into()]).is_err());
    }

    #[test]
    fn numbers_from_env() {
        assert_eq!(env_number("XTASK_TEST_UNSET_VARIABLE", 7u32).unwrap(), 7);
    }
}
