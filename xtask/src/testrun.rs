//! `cargo xtask test`: host unit (examples' included) and doc tests, formatting and clippy on
//! the workspace, the documentation as docs.rs builds it, the build without default features,
//! then the mlx5 model checks on the host (xtask/src/mlx5.rs), then the integration test
//! binaries and `tests/guest/*.sh` scripts against a real rxe device (in a QEMU guest unless
//! the host has one), with a `guest: N passed, M failed` line that counts every item.

use crate::error::Result;
use crate::json;
use crate::proc::{self, sh_quote};
use crate::toolchain::cargo;
use crate::{env_number, guest, paths};
use std::process::{Command, ExitCode};

/// Default per-item timeout in seconds (`UVERBS_GUEST_TEST_TIMEOUT`).
const ITEM_TIMEOUT: u32 = 600;

/// A test binary or guest script to run against the device.
#[derive(Clone)]
struct Item {
    name: String,
    argv: Vec<String>,
    /// Run on the first kernel of [`kernels`] only: the rxe suite's second run on siw, which
    /// the suite's time allows once (siw's own tests run on every kernel).
    first_kernel_only: bool,
}

/// The default limit of one guest boot that runs the whole suite, in seconds.
const SUITE_BOOT_TIMEOUT: u32 = 4800;

/// How an item ended.
enum Outcome {
    Exited(i32),
    Unfinished(String),
}

/// Runs everything; `extra` goes to every test binary (e.g. a name filter).
pub fn run(extra: &[String]) -> Result<ExitCode> {
    let native = crate::native();
    if !native {
        // Early, so that missing tools show up before minutes of building.
        crate::packages::ensure()?;
    }
    let mut failures: Vec<String> = Vec::new();
    let command = |args: &[&str]| {
        let mut c = cargo();
        c.args(args);
        c
    };
    // Each chain stops at its first failing command.
    let mut host_steps: Vec<Vec<Command>> = vec![
        vec![command(&[
            "test",
            "--workspace",
            "--lib",
            "--bins",
            "--examples",
            "--no-fail-fast",
        ])],
        vec![command(&["test", "--doc", "-p", "uverbs"])],
        // The tree as docs/test-guest.md keeps it: formatted, and every crate of the workspace
        // lint-clean with the default features (the mlx5 provider, the drop-in and the model
        // included; their `clippy::undocumented_unsafe_blocks` denials are clippy's to check).
        vec![command(&["fmt", "--all", "--check"])],
        vec![command(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])],
        // The documentation with docs.rs's features (Cargo.toml's `[package.metadata.docs.rs]`),
        // every link resolving to a public item. (docs.rs also passes `--cfg docsrs`, which
        // needs nightly rustdoc: it only adds the "needs feature" badges.)
        vec![{
            let mut c = command(&["doc", "-p", "uverbs", "--no-deps", "--features", "tokio"]);
            c.env("RUSTDOCFLAGS", "-D warnings");
            c
        }],
        // The build without the default `mlx5` feature (rxe only): every target lints clean
        // and the unit tests pass, its own among them (an mlx5 device gets the "no provider"
        // error).
        vec![
            command(&[
                "clippy",
                "-p",
                "uverbs",
                "--no-default-features",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]),
            command(&["test", "-p", "uverbs", "--no-default-features", "--lib"]),
        ],
    ];
    // Every interleaving of the rxe ring protocol's producer and consumer (loom), the unit
    // tests of the modules with `unsafe` under miri, and the ring code under the fuzzer
    // (build, then run).
    host_steps.push(vec![crate::models::loom()]);
    match crate::models::miri() {
        Ok(c) => host_steps.push(vec![c]),
        Err(e) => failures.push(format!("host: miri: {e}")),
    }
    match crate::doc_examples::nightly_doc_tests() {
        Ok(c) => host_steps.push(vec![c]),
        Err(e) => failures.push(format!("host: compile_fail error codes: {e}")),
    }
    match crate::models::fuzz(crate::models::CI_FUZZ_SECONDS) {
        Ok(chain) => host_steps.push(chain),
        Err(e) => failures.push(format!("host: fuzz: {e}")),
    }
    // The library for 64-bit Arm: rxe builds, the mlx5 provider refuses (xtask/src/cross.rs).
    if let Err(e) = crate::cross::check() {
        failures.push(format!("host: aarch64: {e}"));
    }
    // Every public item as the snapshot lists it (xtask/src/public_api.rs).
    if let Err(e) = crate::public_api::run(&[]) {
        failures.push(format!("host: public API: {e}"));
    }
    // The declared rust-version, as far as this toolchain can check it (xtask/src/msrv.rs).
    if let Err(e) = crate::msrv::check() {
        failures.push(format!("host: msrv: {e}"));
    }
    for chain in host_steps {
        for mut c in chain {
            note!("xtask: host: {}", proc::describe(&c));
            let started = std::time::Instant::now();
            let result = proc::check(&mut c);
            note!("xtask: host: took {:.0} s", started.elapsed().as_secs_f64());
            if let Err(e) = result {
                failures.push(format!("host: {e}"));
                break;
            }
        }
    }
    // Debian's C libmlx5 on the mlx5 model, on the host.
    let started = std::time::Instant::now();
    let mlx5_results = crate::mlx5::test_step();
    note!(
        "xtask: the mlx5 model step took {:.0} s",
        started.elapsed().as_secs_f64()
    );

    let suite = guest_suite(extra, native)?;
    failures.extend(suite.failures);
    let results: Vec<(String, std::result::Result<(), String>)> = mlx5_results
        .into_iter()
        .map(|c| (format!("mlx5 model: {}", c.name), c.result))
        .chain(suite.results)
        .collect();
    let (mut lines, failed) = summary(&failures, &results);
    // Each kernel's line right before the total.
    let total = lines.pop();
    lines.extend(suite.kernel_lines);
    lines.extend(total);
    for line in lines {
        say!("{line}");
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Kernels `cargo xtask test` runs the guest suite on, unless `UVERBS_GUEST_KERNELS`
/// (comma-separated) or `UVERBS_GUEST_KERNEL` (one) says otherwise: Debian 12's own 6.1 and
/// its 6.12 (`linux-image-6.12.*+deb12-amd64`, unpacked from the package by xtask/src/kernel_pkg.rs).
pub const CI_KERNELS: &[&str] = &["6.1", "6.12"];

/// The kernel specs of this run (see [`CI_KERNELS`]).
fn kernels() -> Vec<String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let Some(list) = var("UVERBS_GUEST_KERNELS") {
        return list
            .split(',')
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect();
    }
    match var(crate::ENV_KERNEL) {
        Some(k) => vec![k],
        None => CI_KERNELS.iter().map(|k| k.to_string()).collect(),
    }
}

/// What the guest suite found.
pub struct Suite {
    /// Failed steps (the build, a guest that did not boot or crashed).
    pub failures: Vec<String>,
    /// Each item on each kernel.
    pub results: Vec<(String, std::result::Result<(), String>)>,
    /// `guest <release>: N passed, M failed`, one per kernel.
    pub kernel_lines: Vec<String>,
}

/// Builds the integration test binaries, the examples and the libraries, then runs every test
/// binary (`extra` passed to each) and executable `tests/guest/*.sh` on the real rxe driver:
/// natively if the host has a device, else in one guest boot per kernel of [`kernels`].
pub fn guest_suite(extra: &[String], native: bool) -> Result<Suite> {
    let mut failures = Vec::new();
    let timeout: u32 = env_number("UVERBS_GUEST_TEST_TIMEOUT", ITEM_TIMEOUT)?;
    let mut items = Vec::new();
    match test_binaries() {
        Ok(bins) => {
            for (name, exe) in bins {
                let mut argv = vec![exe, "--test-threads=1".to_string()];
                argv.extend(extra.iter().cloned());
                let on_siw = crate::siw_module::siw_rerun_argv(&name, &argv);
                let argv = crate::siw_module::guest_argv(&name, argv);
                items.push(Item {
                    name: format!("test {name}"),
                    argv,
                    first_kernel_only: false,
                });
                if let Some(argv) = on_siw {
                    items.push(Item {
                        name: format!("test {name} on siw0"),
                        argv,
                        first_kernel_only: true,
                    });
                }
            }
        }
        Err(e) => failures.push(format!("build: {e}")),
    }
    match release_stream_echo() {
        Ok(echo) => items.extend(echo),
        Err(e) => failures.push(format!("build: {e}")),
    }
    let mut c = cargo();
    // Examples and every library, the libibverbs provider cdylib among them: guest scripts
    // run them.
    c.args(["build", "--workspace", "--lib", "--examples"]);
    note!("xtask: {}", proc::describe(&c));
    if let Err(e) = proc::check(&mut c) {
        failures.push(format!("build: {e}"));
    }
    items.extend(scripts()?);

    let mut results = Vec::new();
    let mut kernel_lines = Vec::new();
    if native {
        note!(
            "xtask: running {} test binaries/scripts natively (host has an RDMA device or UVERBS_NATIVE=1)",
            items.len()
        );
        let outcomes: Vec<Outcome> = items.iter().map(|i| run_native(i, timeout)).collect();
        results.extend(
            items
                .iter()
                .zip(&outcomes)
                .map(|(item, outcome)| (item.name.clone(), outcome.result(timeout))),
        );
        return Ok(Suite {
            failures,
            results,
            kernel_lines,
        });
    }
    let kernels = kernels();
    let saved = std::env::var_os(crate::ENV_KERNEL);
    for (k, spec) in kernels.iter().enumerate() {
        let items: Vec<Item> = items
            .iter()
            .filter(|i| k == 0 || !i.first_kernel_only)
            .cloned()
            .collect();
        // guest::run boots what this variable names.
        std::env::set_var(crate::ENV_KERNEL, spec);
        let cache = guest::cache_dir();
        let release = std::fs::create_dir_all(&cache)
            .map_err(|e| crate::error::Error::msg(e.to_string()))
            .and_then(|()| crate::kernel::prepare(&cache));
        let (release, outcomes, guest_failure) = match release {
            Ok(k) => {
                note!(
                    "xtask: running {} test binaries/scripts in a QEMU guest on kernel {}",
                    items.len(),
                    k.version
                );
                let started = std::time::Instant::now();
                let (o, f) = run_in_guest(&items, timeout);
                note!(
                    "xtask: the guest suite on {} took {:.0} s",
                    k.version,
                    started.elapsed().as_secs_f64()
                );
                (k.version, o, f)
            }
            Err(e) => {
                let why = format!("kernel {spec}: {e}");
                let o = items.iter().map(|_| Outcome::Unfinished(why.clone())).collect();
                (spec.clone(), o, Some(format!("guest: {why}")))
            }
        };
        let prefix = if kernels.len() > 1 {
            format!("[{release}] ")
        } else {
            String::new()
        };
        let mine: Vec<_> = items
            .iter()
            .zip(&outcomes)
            .map(|(item, outcome)| (format!("{prefix}{}", item.name), outcome.result(timeout)))
            .collect();
        let passed = mine.iter().filter(|(_, r)| r.is_ok()).count();
        let failed = mine.len() - passed + usize::from(guest_failure.is_some());
        kernel_lines.push(format!("guest {release}: {passed} passed, {failed} failed"));
        failures.extend(guest_failure.map(|f| format!("{prefix}{f}")));
        results.extend(mine);
    }
    match saved {
        Some(v) => std::env::set_var(crate::ENV_KERNEL, v),
        None => std::env::remove_var(crate::ENV_KERNEL),
    }
    Ok(Suite {
        failures,
        results,
        kernel_lines,
    })
}

/// `cargo xtask guest --suite [-- <args for test binaries>]`: only the guest suite of
/// `cargo xtask test`, with its PASS/FAIL lines and each kernel's line.
pub fn suite_only(extra: &[String]) -> Result<ExitCode> {
    crate::packages::ensure()?;
    let suite = guest_suite(extra, crate::native())?;
    let (mut lines, failed) = summary(&suite.failures, &suite.results);
    let total = lines.pop();
    lines.extend(suite.kernel_lines);
    lines.extend(total);
    for line in lines {
        say!("{line}");
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

impl Outcome {
    /// `Err` with why, unless the item exited 0.
    fn result(&self, timeout: u32) -> std::result::Result<(), String> {
        match self {
            Outcome::Exited(0) => Ok(()),
            Outcome::Exited(124) => Err(format!("timed out after {timeout} s")),
            Outcome::Exited(code) => Err(format!("exit status {code}")),
            Outcome::Unfinished(why) => Err(format!("did not finish: {why}")),
        }
    }
}

/// The report's lines: a FAIL line per failed step, a PASS or FAIL line per item (the first
/// line of why), then `guest: N passed, M failed` counting all of them; and M.
fn summary(failures: &[String], results: &[(String, std::result::Result<(), String>)]) -> (Vec<String>, usize) {
    let mut lines: Vec<String> = failures.iter().map(|f| format!("FAIL {f}")).collect();
    let mut passed = 0;
    for (name, result) in results {
        match result {
            Ok(()) => {
                passed += 1;
                lines.push(format!("PASS {name}"));
            }
            Err(why) => lines.push(format!("FAIL {name} ({})", why.lines().next().unwrap_or_default())),
        }
    }
    let failed = failures.len() + results.len() - passed;
    lines.push(format!("guest: {passed} passed, {failed} failed"));
    (lines, failed)
}

/// Tests of mlx5-only behaviour (`tests/mlx5_*.rs`): the mlx5 model step runs them
/// (`crate::mlx5`), never the rxe guest.
const MLX5_ONLY: &str = "mlx5_";

/// Builds the main crate's integration tests; returns (target name, executable), those for
/// the rxe guest.
fn test_binaries() -> Result<Vec<(String, String)>> {
    let mut c = cargo();
    c.args(["test", "-p", "uverbs", "--tests", "--no-run", "--message-format=json"]);
    let mut bins: Vec<_> = json::cargo_executables(&mut c)?
        .into_iter()
        .filter(|e| e.is("test") && !e.name.starts_with(MLX5_ONLY))
        .map(|e| (e.name, e.path))
        .collect();
    bins.sort();
    Ok(bins)
}

/// The test in `tests/stream.rs` that runs at full size from a release build.
const STREAM_ECHO_TEST: &str = "copy_echo_over_concurrent_connections_checks_every_byte";

/// `tests/stream.rs`'s echo at the size its acceptance asks for (10 connections x 100 MiB
/// each way, every byte checked), from a release build of the test: the debug build moves
/// under 1 MiB/s under TCG, the release build about ten times that (docs/test-guest.md). Run
/// on rxe, and again on siw (rsocket's message-send variant), both on the first kernel only.
fn release_stream_echo() -> Result<Vec<Item>> {
    let mut c = cargo();
    c.args([
        "test",
        "--release",
        "-p",
        "uverbs",
        "--test",
        "stream",
        "--no-run",
        "--message-format=json",
    ]);
    let exe = json::cargo_executables(&mut c)?
        .into_iter()
        .find(|e| e.is("test") && e.name == "stream")
        .ok_or_else(|| crate::error::Error::msg("the release build of tests/stream.rs made no test binary"))?;
    let rxe = stream_echo_item(exe.path);
    let siw = stream_echo_on_siw(&rxe);
    Ok(vec![rxe, siw])
}

/// The release echo `rxe` again on siw0, through `with_siw.sh`.
fn stream_echo_on_siw(rxe: &Item) -> Item {
    Item {
        name: "test stream on siw0 (release: echo, 10 connections x 100 MiB)".into(),
        argv: crate::siw_module::with_siw(rxe.argv.clone()),
        first_kernel_only: true,
    }
}

fn stream_echo_item(exe: String) -> Item {
    Item {
        name: "test stream (release: echo, 10 connections x 100 MiB)".into(),
        argv: vec![
            "env".into(),
            "UVERBS_STREAM_CONNS=10".into(),
            "UVERBS_STREAM_MIB=100".into(),
            exe,
            "--test-threads=1".into(),
            "--exact".into(),
            STREAM_ECHO_TEST.into(),
            "--nocapture".into(),
        ],
        first_kernel_only: true,
    }
}

/// Guest scripts that run on the first kernel of [`kernels`] only, for CI's time: the drop-in,
/// the demo and the rsocket interop on siw (siw's own tests and its CM interop run on every
/// kernel).
const FIRST_KERNEL_ONLY_SCRIPTS: &[&str] = &["demo_siw.sh", "libibverbs_dropin_siw.sh", "rsocket_siw_interop.sh"];

/// Executable `tests/guest/*.sh`, sorted, each run through `/bin/sh`.
fn scripts() -> Result<Vec<Item>> {
    let dir = paths::root().join("tests/guest");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(Vec::new());
    };
    let mut paths: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "sh") && proc::is_executable(p))
        .collect();
    paths.sort();
    Ok(paths
        .into_iter()
        .map(|p| Item {
            name: p.strip_prefix(paths::root()).unwrap_or(&p).display().to_string(),
            argv: vec!["/bin/sh".into(), p.to_string_lossy().into_owned()],
            first_kernel_only: p
                .file_name()
                .is_some_and(|f| FIRST_KERNEL_ONLY_SCRIPTS.iter().any(|s| f == *s)),
        })
        .collect())
}

/// Runs one item on the host with an unlimited RLIMIT_MEMLOCK (where allowed).
fn run_native(item: &Item, timeout: u32) -> Outcome {
    note!("==== native: {}", item.name);
    let mut c = Command::new("sh");
    c.args([
        "-c",
        "ulimit -l unlimited 2>/dev/null; exec timeout -k 10 \"$0\" \"$@\"",
        &timeout.to_string(),
    ])
    .args(&item.argv)
    .current_dir(paths::root())
    .env("UVERBS_TARGET_DIR", paths::target_dir());
    match proc::status(&mut c) {
        Ok(st) => Outcome::Exited(st.code().unwrap_or(128)),
        Err(e) => Outcome::Unfinished(e.to_string()),
    }
}

/// The script the guest runs: every item in order, one `<status> <index> <seconds>` line each.
fn guest_script(items: &[Item], timeout: u32) -> String {
    let mut s = String::from(
        "# Generated by `cargo xtask test`.\n\
         item() {\n    i=$1; name=$2; shift 2\n    echo \"==== guest: $name\"\n    \
         start=$(date +%s)\n    timeout -k 10 TIMEOUT \"$@\"\n    rc=$?\n    \
         echo \"$rc $i $(( $(date +%s) - start ))\" >> \"$UVERBS_RESULTS/results\"\n}\n",
    )
    .replace("TIMEOUT", &timeout.to_string());
    for (i, item) in items.iter().enumerate() {
        let argv: Vec<String> = item.argv.iter().map(|a| sh_quote(a)).collect();
        s.push_str(&format!("item {i} {} {}\n", sh_quote(&item.name), argv.join(" ")));
    }
    s
}

/// The `n` longest of (seconds, name), longest first, as `name N s, ...`.
fn slowest(took: &mut [(u64, &str)], n: usize) -> String {
    took.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let listed: Vec<String> = took
        .iter()
        .take(n)
        .map(|(secs, name)| format!("{name} {secs} s"))
        .collect();
    listed.join(", ")
}

/// Boots one guest for all items; an item the guest never finished counts as
/// failed. Also returns why the guest failed (did not boot, crashed), if it did.
fn run_in_guest(items: &[Item], timeout: u32) -> (Vec<Outcome>, Option<String>) {
    // The whole boot's limit (`UVERBS_GUEST_TIMEOUT`) defaults to one that lets every item
    // run: each is bounded by its own `timeout`, and the suite is far longer than one item.
    if std::env::var_os(crate::ENV_TIMEOUT).is_none() {
        std::env::set_var(crate::ENV_TIMEOUT, SUITE_BOOT_TIMEOUT.to_string());
    }
    let job = guest::Job {
        command: "/bin/sh \"$UVERBS_RESULTS/tests.sh\"".into(),
        files: vec![("tests.sh".into(), guest_script(items, timeout))],
    };
    let report = match guest::run(&job) {
        Ok(r) => r,
        Err(e) => {
            note!("xtask: error: {e}");
            let first = e.to_string().lines().next().unwrap_or_default().to_string();
            let outcomes = items
                .iter()
                .map(|_| Outcome::Unfinished("the guest did not boot".into()))
                .collect();
            return (outcomes, Some(format!("guest: {first}")));
        }
    };
    if let Some(f) = &report.failure {
        note!("xtask: error: {f}");
    }
    let results = report.read("results").unwrap_or_default();
    note!("xtask: the guest's kernel log is in {}", guest::kernel_log().display());
    let mut outcomes: Vec<Outcome> = items
        .iter()
        .map(|_| {
            Outcome::Unfinished(
                report
                    .failure
                    .as_deref()
                    .and_then(|f| f.lines().next())
                    .unwrap_or("no result recorded")
                    .to_string(),
            )
        })
        .collect();
    let mut took: Vec<(u64, &str)> = Vec::new();
    for line in results.lines() {
        let mut it = line.split_whitespace();
        if let (Some(Ok(rc)), Some(Ok(i))) = (it.next().map(str::parse), it.next().map(str::parse::<usize>)) {
            if let Some(o) = outcomes.get_mut(i) {
                *o = Outcome::Exited(rc);
            }
            if let (Some(Ok(secs)), Some(item)) = (it.next().map(str::parse::<u64>), items.get(i)) {
                took.push((secs, &item.name));
            }
        }
    }
    // What to look at first when the suite outgrows CI's time.
    note!("xtask: the slowest items: {}", slowest(&mut took, 12));
    let failure = report
        .failure
        .as_deref()
        .and_then(|f| f.lines().next())
        .map(|f| format!("guest: {f}"));
    (outcomes, failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_items_come_first() {
        let mut took = vec![(3, "b"), (40, "a"), (3, "a"), (7, "c")];
        assert_eq!(slowest(&mut took, 3), "a 40 s, c 7 s, a 3 s");
        assert_eq!(slowest(&mut [], 3), "");
    }

    #[test]
    fn the_release_stream_echo_runs_the_full_size_on_its_own() {
        let item = stream_echo_item("/t/stream-abc".into());
        let s = guest_script(std::slice::from_ref(&item), 600);
        assert!(
            s.contains(&format!(
                "env UVERBS_STREAM_CONNS=10 UVERBS_STREAM_MIB=100 /t/stream-abc --test-threads=1 --exact {STREAM_ECHO_TEST} --nocapture\n"
            )),
            "{s}"
        );
        let siw = stream_echo_on_siw(&item);
        assert!(siw.first_kernel_only);
        assert!(siw.argv[1].ends_with("xtask/guest/with_siw.sh"), "{:?}", siw.argv);
        assert_eq!(siw.argv[2..], item.argv[..]);
    }

    #[test]
    fn guest_script_runs_items_in_order() {
        let items = [
            Item {
                name: "test a b".into(),
                argv: vec!["/t/a".into(), "--test-threads=1".into(), "x y".into()],
                first_kernel_only: false,
            },
            Item {
                name: "tests/guest/z.sh".into(),
                argv: vec!["/bin/sh".into(), "/p/z.sh".into()],
                first_kernel_only: false,
            },
        ];
        let s = guest_script(&items, 60);
        assert!(s.contains("timeout -k 10 60 \"$@\""), "{s}");
        assert!(s.contains("item 0 'test a b' /t/a --test-threads=1 'x y'\n"), "{s}");
        assert!(s.ends_with("item 1 tests/guest/z.sh /bin/sh /p/z.sh\n"), "{s}");
    }

    #[test]
    fn summary_counts_failed_steps_mlx5_items_and_guest_items() {
        let results = [
            (
                "mlx5 model: build the model".to_string(),
                Err("the crate is missing\nmore".to_string()),
            ),
            ("test rc".to_string(), Outcome::Exited(0).result(60)),
            ("test cq".to_string(), Outcome::Exited(124).result(60)),
            (
                "x.sh".to_string(),
                Outcome::Unfinished("the guest did not boot".into()).result(60),
            ),
        ];
        let (lines, failed) = summary(&["host: miri: no nightly".to_string()], &results);
        assert_eq!(
            lines,
            [
                "FAIL host: miri: no nightly",
                "FAIL mlx5 model: build the model (the crate is missing)",
                "PASS test rc",
                "FAIL test cq (timed out after 60 s)",
                "FAIL x.sh (did not finish: the guest did not boot)",
                "guest: 1 passed, 4 failed",
            ]
        );
        assert_eq!(failed, 4);
        assert_eq!(summary(&[], &[]), (vec!["guest: 0 passed, 0 failed".to_string()], 0));
    }
}
