//! `cargo xtask bench`: the uverbs hot paths against rdma-core's C provider, every
//! implementation in the same guest boot (docs/benchmarks.md).
//!
//! Builds the Rust harness (`benches/verbs/main.rs`), the drop-in libibverbs provider and the C
//! harness (`benches/c/verbs_bench.c`, compiled here with gcc against the system libibverbs:
//! a comparison tool, never part of the library), runs `benches/guest.sh` in one guest (or
//! natively, as `cargo xtask test` decides), and turns what it wrote into
//! `target/bench/summary.md` (the table, TCG timings beside the instruction counts),
//! `instructions.md` (the instruction tables docs/benchmarks.md shows), `bench-poll.csv` and
//! `bench-poll.png` (the plot, with python3 and matplotlib). The raw results stay in
//! `target/bench/raw/`.
//!
//! Then the mlx5 step (bench/mlx5.rs): the same harnesses on the mlx5 device model on the host,
//! the Rust mlx5 provider against Debian's libmlx5 (`target/bench/mlx5-summary.md`).
//!
//! Knobs (environment, passed into the guest): `UVERBS_BENCH_REPS` (harness repetitions,
//! default 5), `UVERBS_BENCH_PERFTEST_REPS` (default 15), `UVERBS_BENCH_SKIP` (comma list of
//! `timing`, `callgrind`, `profile`, `perftest`, and `mlx5`, which xtask reads itself).

use crate::error::{bail, Context, Result};
use crate::json;
use crate::proc::{self, sh_quote};
use crate::toolchain::cargo;
use crate::{guest, paths};

mod cm;
mod cq_copy;
mod doc;
mod mlx5;
mod stream;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// `cargo xtask bench [--report | --mlx5 | --cm [--report] | --stream [--report] | --cq-copy
/// [--report]]`:
/// `--report` only redoes the tables and plot from the raw results of the last run (rxe, mlx5
/// or both, whichever are there), and the doc parts they write; `--mlx5` runs only the mlx5
/// step; `--cm` only the connection-setup benchmark (bench/cm.rs); `--stream` only the
/// stream's instructions per byte against rsockets (bench/stream.rs); `--cq-copy` only the rxe
/// provider's CQE copies, natively on the host (bench/cq_copy.rs).
///
/// Each writes its tables into docs/benchmarks.md between its markers (bench/doc.rs), with a
/// line saying the command, commit, date and guest kernel (or host load): `cargo xtask bench`
/// the three rxe instruction tables, from a run whose callgrind step counted all three
/// harnesses; `--mlx5` (or the mlx5 step) the mlx5 table; `--cm`, `--stream` and `--cq-copy`
/// theirs.
pub fn run(args: &[String]) -> Result<ExitCode> {
    let out = paths::target_dir().join("bench");
    let only_mlx5 = match args {
        [] => false,
        [a] if a == "--report" => {
            let (rxe, mlx5) = (out.join("raw/results.jsonl"), out.join("mlx5/results.jsonl"));
            if !rxe.exists() && !mlx5.exists() {
                bail!("no results to report: run `cargo xtask bench` (or `--mlx5`) first");
            }
            if rxe.exists() {
                report(&out)?;
                let raw = out.join("raw");
                if has_callgrind(&raw) {
                    write_rxe_doc(&raw)?;
                } else {
                    note!("xtask: the last rxe run has no callgrind counts: its docs/benchmarks.md parts are left as they are");
                }
            }
            if mlx5.exists() {
                mlx5::report(&out)?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        [a] if a == "--mlx5" => true,
        [a] if a == "--cm" => return cm::run(false),
        [a, b] if a == "--cm" && b == "--report" => return cm::run(true),
        [a] if a == "--stream" => return stream::run(false),
        [a, b] if a == "--stream" && b == "--report" => return stream::run(true),
        [a] if a == "--cq-copy" => return cq_copy::run(false),
        [a, b] if a == "--cq-copy" && b == "--report" => return cq_copy::run(true),
        _ => bail!("usage: cargo xtask bench [--report | --mlx5 | --cm [--report] | --stream [--report] | --cq-copy [--report]] (knobs: UVERBS_BENCH_REPS, UVERBS_BENCH_PERFTEST_REPS, UVERBS_BENCH_SKIP)"),
    };
    let native = crate::native();
    let tools = [
        ("gcc", "gcc"),
        ("valgrind", "valgrind"),
        ("python3", "python3"),
        ("perf", "linux-perf"),
    ];
    if !native {
        crate::packages::ensure_with(&tools)?;
    }
    for (tool, package) in tools {
        if proc::find_program(tool).is_none() {
            bail!("`cargo xtask bench` needs {tool} (Debian package {package})");
        }
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let rust = build_rust_harness()?;
    let mut c = cargo();
    c.args(["build", "--release", "-p", "uverbs-libibverbs"]);
    note!("xtask: {}", proc::describe(&c));
    proc::check(&mut c)?;
    let dropin = paths::target_dir().join("release/libuverbs_rxe.so");
    let c_harness = out.join("verbs_bench_c");
    let mut gcc = Command::new("gcc");
    gcc.args(["-O2", "-g", "-Wall", "-o"])
        .arg(&c_harness)
        .arg(paths::root().join("benches/c/verbs_bench.c"))
        .args(["-libverbs", "-lpthread"]);
    note!("xtask: {}", proc::describe(&gcc));
    proc::check(&mut gcc).context("building the C harness (needs libibverbs-dev and valgrind's headers)")?;
    if only_mlx5 {
        let ok = mlx5::run(&out, &rust, &c_harness, "--mlx5")?;
        return Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE });
    }

    let load_before = host_load();
    let raw = out.join("raw");
    let _ = std::fs::remove_dir_all(&raw);
    std::fs::create_dir_all(&raw).with_context(|| format!("creating {}", raw.display()))?;
    // What this run is, for the line under the tables it writes into docs/benchmarks.md.
    doc::record_start(&raw, "", &[])?;
    let script = paths::root().join("benches/guest.sh");
    let argv: Vec<String> = [&script, &rust, &c_harness, &dropin]
        .iter()
        .map(|p| sh_quote(&p.to_string_lossy()))
        .collect();
    let status = if native {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!(
                "ulimit -l unlimited 2>/dev/null; exec /bin/sh {}",
                argv.join(" ")
            ))
            .current_dir(paths::root())
            .env("UVERBS_RESULTS", &raw);
        proc::status(&mut c)?.code()
    } else {
        let report = guest::run(&guest::Job {
            command: format!("/bin/sh {}", argv.join(" ")),
            files: Vec::new(),
        })?;
        copy_tree(&report.results, &raw)?;
        if let Some(f) = &report.failure {
            note!("xtask: error: {f}");
        }
        report.status
    };
    let host = format!("{}load_before={load_before}\nload_after={}\n", host_env(), host_load());
    std::fs::write(raw.join("host.txt"), host).context("writing host.txt")?;

    report(&out)?;
    // The three rxe tables of docs/benchmarks.md, from this run's counts when its callgrind
    // step ran (all or none of them; a refusal fails the command, after the mlx5 step).
    let doc_ok = skip_names().iter().any(|s| s == "callgrind") || {
        match write_rxe_doc(&raw) {
            Ok(()) => true,
            Err(e) => {
                note!("xtask: error: docs/benchmarks.md not updated: {e}");
                false
            }
        }
    };
    // The mlx5 provider against libmlx5, on the device model on this host (bench/mlx5.rs).
    let mlx5_ok = mlx5::skipped() || mlx5::run(&out, &rust, &c_harness, "")?;
    Ok(match status {
        Some(0) if mlx5_ok && doc_ok => ExitCode::SUCCESS,
        Some(0) if mlx5_ok => ExitCode::FAILURE,
        Some(0) => {
            note!("xtask: the mlx5 benchmarks failed; see above");
            ExitCode::FAILURE
        }
        Some(s) => {
            note!(
                "xtask: the benchmark script failed (status {s}); see {}",
                raw.join("log.txt").display()
            );
            ExitCode::FAILURE
        }
        None => ExitCode::FAILURE,
    })
}

/// The steps `UVERBS_BENCH_SKIP` names.
fn skip_names() -> Vec<String> {
    std::env::var("UVERBS_BENCH_SKIP")
        .unwrap_or_default()
        .split(',')
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect()
}

/// Writes the table and the plot from `out/raw`.
fn report(out: &Path) -> Result<()> {
    let raw = out.join("raw");
    let summary = summarize(&raw)?;
    crate::write_atomic(&out.join("summary.md"), summary.markdown.as_bytes())?;
    crate::write_atomic(&out.join("bench-poll.csv"), summary.csv.as_bytes())?;
    let tables = instruction_tables(&read_callgrind(&raw));
    crate::write_atomic(&out.join("instructions.md"), tables.as_bytes())?;
    say!("{}", summary.markdown);
    say!("{tables}");
    let png = out.join("bench-poll.png");
    let mut plot = Command::new("python3");
    plot.arg(paths::root().join("benches/plot.py"))
        .arg(out.join("bench-poll.csv"))
        .arg(&png);
    match proc::status(&mut plot) {
        Ok(st) if st.success() => note!("xtask: plot in {}", png.display()),
        _ => note!("xtask: warning: no plot (benches/plot.py needs python3 with matplotlib: pip install matplotlib)"),
    }
    note!("xtask: results in {} (raw data in {})", out.display(), raw.display());
    Ok(())
}

/// Builds `benches/verbs/main.rs` (bench profile) and returns its executable.
fn build_rust_harness() -> Result<PathBuf> {
    let mut c = cargo();
    c.args([
        "bench",
        "-p",
        "uverbs",
        "--bench",
        "verbs",
        "--no-run",
        "--message-format=json",
    ]);
    let what = proc::describe(&c);
    json::cargo_executables(&mut c)?
        .into_iter()
        .find(|e| e.name == "verbs" && e.is("bench"))
        .map(|e| PathBuf::from(e.path))
        .with_context(|| format!("`{what}` named no executable for the `verbs` bench"))
}

/// Copies the files under `from` into `to` (directories recursively).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e.with_context(|| format!("reading {}", from.display()))?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if src.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).with_context(|| format!("copying {}", src.display()))?;
        }
    }
    Ok(())
}

/// The host side of the environment: CPU, kernel, QEMU and compilers.
fn host_env() -> String {
    let first_line = |prog: &str, args: &[&str]| {
        Command::new(prog)
            .args(args)
            .output()
            .ok()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .unwrap_or_default()
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "host_cpu={cpu}\nhost_cpus={cpus}\nhost_kernel={}\nqemu={}\nrustc={}\ngcc={}\nnative={}\n",
        first_line("uname", &["-r"]),
        first_line("qemu-system-x86_64", &["--version"]),
        first_line("rustc", &["--version"]),
        first_line("gcc", &["--version"]),
        crate::native()
    )
}

/// The host's load average, and how many QEMU processes run (other guests slow ours down).
fn host_load() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let qemus = std::fs::read_dir("/proc").map_or(0, |d| {
        d.flatten()
            .filter(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.starts_with("qemu-system")))
            .count()
    });
    format!("{} ({qemus} QEMU processes)", load.trim())
}

/// Key of one measurement: workload, parameter, implementation.
type Key = (String, i64, String);

/// Per-round samples of one measurement, by repetition (0 where there is none).
type Samples = BTreeMap<Key, BTreeMap<i64, Vec<f64>>>;

/// What `summarize` produces.
struct Summary {
    markdown: String,
    csv: String,
}

/// Median and interquartile range of `v` (sorted in place).
fn median_iqr(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| {
        let x = p * (v.len() - 1) as f64;
        let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
        v[lo] + (v[hi] - v[lo]) * (x - lo as f64)
    };
    (q(0.5), q(0.75) - q(0.25))
}

/// Timing samples from results.jsonl.
fn read_samples(raw: &Path) -> Result<Samples> {
    let path = raw.join("results.jsonl");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut samples = Samples::new();
    for line in text.lines().filter(|l| l.starts_with('{')) {
        let r = json::bench_result(line).with_context(|| format!("{}: {line}", path.display()))?;
        samples
            .entry((r.workload, r.param, r.implementation))
            .or_default()
            .entry(r.rep)
            .or_default()
            .extend(r.samples);
    }
    Ok(samples)
}

/// Instructions per operation from the callgrind dumps in `raw/cg`: each dump is named
/// `<workload> <param> <ops>` by the harness and counts only the measured region.
fn read_callgrind(raw: &Path) -> BTreeMap<Key, f64> {
    let mut sums: BTreeMap<Key, (f64, f64)> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(raw.join("cg")) else {
        return BTreeMap::new();
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((imp, _)) = name.split_once(".out.") else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let trigger = text
            .lines()
            .find_map(|l| l.strip_prefix("desc: Trigger: Client Request: "));
        let totals = text.lines().find_map(|l| l.strip_prefix("totals: "));
        let (Some(trigger), Some(totals)) = (trigger, totals) else {
            continue;
        };
        let f: Vec<&str> = trigger.split_whitespace().collect();
        let (Some(ir), [w, p, ops]) = (totals.trim().parse::<f64>().ok(), f.as_slice()) else {
            continue;
        };
        let (Ok(p), Ok(ops)) = (p.parse::<i64>(), ops.parse::<f64>()) else {
            continue;
        };
        let s = sums.entry((w.to_string(), p, imp.to_string())).or_default();
        s.0 += ir;
        s.1 += ops;
    }
    sums.into_iter()
        .filter(|(_, (_, ops))| *ops > 0.0)
        .map(|(k, (ir, ops))| (k, ir / ops))
        .collect()
}

/// One row of the table.
struct Row {
    workload: &'static str,
    param: i64,
    what: String,
    unit: &'static str,
    /// Values are rates (higher is better) rather than times.
    rate: bool,
    /// Ratio targets (implementation/C) for time and instructions.
    target: Option<f64>,
    ir_target: Option<f64>,
}

/// The drain batch sizes that have results (timings or instruction counts), in order: the
/// harnesses' lists, without a copy here.
fn drain_batches(samples: &Samples, ir: &BTreeMap<Key, f64>) -> Vec<i64> {
    let keys = samples.keys().chain(ir.keys());
    let batches: std::collections::BTreeSet<i64> = keys.filter(|(w, _, _)| w == "drain").map(|(_, b, _)| *b).collect();
    batches.into_iter().collect()
}

fn rows(batches: &[i64]) -> Vec<Row> {
    let row = |workload, param, what: String, unit, target, ir_target| Row {
        workload,
        param,
        what,
        unit,
        rate: unit == "Mpps",
        target,
        ir_target,
    };
    let mut v = Vec::new();
    for &b in batches {
        let t = [1, 16, 64].contains(&b).then_some(0.5);
        v.push(row(
            "drain",
            b,
            format!("drain 4096 ready, poll {b} at a time"),
            "ns/completion",
            t,
            t,
        ));
    }
    for b in REPLAY_BATCHES {
        v.push(row(
            "drain_replay",
            b,
            format!("drain replayed (ring re-offered from user space, no kernel work), poll {b} at a time"),
            "ns/completion",
            None,
            None,
        ));
    }
    v.push(row(
        "drain_floor",
        1,
        "drain replayed, the floor loop: one at a time, hand-inlined, ring layout as constants (Rust only)".into(),
        "ns/completion",
        None,
        None,
    ));
    v.push(row(
        "inplace",
        0,
        "drain 4096 ready in place (`Cq::batch` / `ibv_start_poll`)".into(),
        "ns/completion",
        None,
        None,
    ));
    v.push(row(
        "inplace_copy",
        0,
        "drain 4096 ready in place, copying each out (Rust only: the copy's cost)".into(),
        "ns/completion",
        None,
        None,
    ));
    v.push(row(
        "empty",
        16,
        "poll an empty CQ".into(),
        "ns/call",
        Some(0.5),
        Some(0.5),
    ));
    v.push(row(
        "post",
        1,
        "post_send, 1 WR per call (+ doorbell)".into(),
        "ns/WR",
        Some(1.0),
        None,
    ));
    v.push(row(
        "post_built",
        1,
        "post_send, 1 WR per call, the request built in the loop (+ doorbell), Rust only".into(),
        "ns/WR",
        None,
        None,
    ));
    v.push(row(
        "post_safe",
        1,
        "safe post (`Qp::send_buf_with`: the buffer moves into the QP), 1 WR per call (+ doorbell), Rust only".into(),
        "ns/WR",
        None,
        None,
    ));
    v.push(row(
        "srq_post_built",
        1,
        "SRQ post_recv, 1 WR per call, the request built in the loop, Rust only".into(),
        "ns/WR",
        None,
        None,
    ));
    v.push(row(
        "srq_post_safe",
        1,
        "safe SRQ receive (`Srq::recv_buf`: the buffer moves into the SRQ), 1 WR per call, Rust only".into(),
        "ns/WR",
        None,
        None,
    ));
    v.push(row(
        "recv_built",
        1,
        "QP post_recv, 1 WR per call, the request built in the loop, Rust only".into(),
        "ns/WR",
        None,
        None,
    ));
    v.push(row(
        "recv_safe",
        1,
        "safe QP receive (`Qp::recv_buf`: the buffer moves into the QP), 1 WR per call, Rust only".into(),
        "ns/WR",
        None,
        None,
    ));
    v.push(row(
        "post",
        32,
        "post_send, lists of 32 WRs (+ doorbell)".into(),
        "ns/WR",
        Some(1.0),
        None,
    ));
    v.push(row(
        "post_built",
        32,
        "post_send, lists of 32 WRs, each request's id and SGE written per call (+ doorbell), Rust only".into(),
        "ns/WR",
        None,
        None,
    ));
    v.push(row(
        "post_safe",
        32,
        "safe post of a list (`Qp::send_bufs`: 256 buffers per call, 32 WRs per doorbell), Rust only".into(),
        "ns/WR",
        None,
        None,
    ));
    v.push(row(
        "pingpong",
        64,
        "send/recv ping-pong, 64 B, one-way latency".into(),
        "ns",
        None,
        None,
    ));
    v.push(row(
        "rate",
        64,
        "send, 64 B, 64 in flight, one-way".into(),
        "ns/message",
        None,
        None,
    ));
    v.push(row(
        "ib_send_lat",
        64,
        "perftest ib_send_lat -s 64, t_typical".into(),
        "µs",
        Some(1.0),
        None,
    ));
    v.push(row(
        "ib_write_bw",
        64,
        "perftest ib_write_bw -s 64, message rate".into(),
        "Mpps",
        Some(1.0),
        None,
    ));
    v.push(row(
        "ib_send_bw",
        64,
        "perftest ib_send_bw -s 64, message rate".into(),
        "Mpps",
        Some(1.0),
        None,
    ));
    v
}

/// How many instructions the safe post adds to the raw one, per work request (the safe
/// API's budget: at most 5), when callgrind counted them: one request per call against the
/// raw post of a prepared request (`post` 1) and of one built in the loop (`post_built`);
/// lists (`post_safe` 32, `Qp::send_bufs`) against the raw post of lists built per call
/// (`post_built` 32) and of prepared lists re-posted (`post` 32); and the safe receives of
/// a QP and of an SRQ over their raw posts (`recv_safe` over `recv_built`, `srq_post_safe`
/// over `srq_post_built`).
fn safe_post_line(ir: &BTreeMap<Key, f64>) -> String {
    let get = |w: &str, list: i64| ir.get(&(w.to_string(), list, "rust".to_string())).copied();
    let mut md = String::new();
    for (safe_list, raw, raw_list, what) in [
        (1, "post", 1, "the raw post of a prepared request, 1 WR per call"),
        (
            1,
            "post_built",
            1,
            "the raw post of a request built per call, 1 WR per call",
        ),
        (
            32,
            "post_built",
            32,
            "the raw post of lists of 32 built per call (id and SGE per request), the lists",
        ),
        (
            32,
            "post",
            32,
            "the raw post of prepared lists of 32 (re-posted, nothing built per call), the lists",
        ),
    ] {
        if let (Some(safe), Some(r)) = (get("post_safe", safe_list), get(raw, raw_list)) {
            let extra = safe - r;
            let _ = writeln!(
                md,
                "\nSafe post over {what}: {safe:.1} − {r:.1} = {extra:+.1} instructions per WR (budget ≤ 5: {}).",
                if extra <= 5.0 { "met" } else { "not met" }
            );
        }
    }
    for (safe, raw, what) in [
        ("recv_safe", "recv_built", "QP receive over the raw QP post"),
        ("srq_post_safe", "srq_post_built", "SRQ receive over the raw SRQ post"),
    ] {
        if let (Some(safe), Some(raw)) = (get(safe, 1), get(raw, 1)) {
            let extra = safe - raw;
            let _ = writeln!(
                md,
                "\nSafe {what} of a request built per call: {safe:.1} − {raw:.1} = {extra:+.1} instructions per WR (budget ≤ 5: {}).",
                if extra <= 5.0 { "met" } else { "not met" }
            );
        }
    }
    md
}

/// Rows of the instruction tables: workload, parameter, what, per, target (implementation
/// over librxe, at most).
type IrRow = (&'static str, i64, &'static str, &'static str, Option<f64>);

/// The Rust API's rows against librxe.
const RUST_IR_ROWS: [IrRow; 8] = [
    (
        "drain",
        1,
        "drain 4096 ready, poll 1 at a time",
        "completion",
        Some(0.5),
    ),
    (
        "drain",
        16,
        "drain 4096 ready, poll 16 at a time",
        "completion",
        Some(0.5),
    ),
    (
        "drain",
        64,
        "drain 4096 ready, poll 64 at a time",
        "completion",
        Some(0.5),
    ),
    (
        "drain_floor",
        1,
        "drain replayed, the floor loop (Rust only)",
        "completion",
        None,
    ),
    (
        "inplace",
        0,
        "drain 4096 ready in place (`Cq::batch` / `ibv_next_poll`)",
        "completion",
        None,
    ),
    ("empty", 16, "poll an empty CQ (16 asked)", "call", Some(0.5)),
    ("post", 1, "post_send, 1 WR per call (+ doorbell)", "WR", Some(1.0)),
    ("post", 32, "post_send, lists of 32 WRs (+ doorbell)", "WR", Some(1.0)),
];

/// The drop-in's rows against librxe (the same C program on either provider): those with a
/// target.
const DROPIN_IR_ROWS: [IrRow; 5] = [
    ("drain", 1, "`ibv_poll_cq`, 1 at a time", "completion", Some(1.0)),
    (
        "inplace",
        0,
        "in place (`ibv_start_poll` / `ibv_next_poll`)",
        "completion",
        Some(1.0),
    ),
    (
        "empty",
        16,
        "`ibv_poll_cq` on an empty CQ (16 asked)",
        "call",
        Some(1.0),
    ),
    (
        "post",
        1,
        "`ibv_post_send`, 1 WR per call (+ doorbell)",
        "WR",
        Some(1.0),
    ),
    (
        "post",
        32,
        "`ibv_post_send`, lists of 32 WRs (+ doorbell)",
        "WR",
        Some(1.0),
    ),
];

/// The safe posts against the raw ones: what, the raw post of a prepared request (if any), the
/// raw post of a request built per call, the safe post (workload and parameter each).
type SafeRow = (
    &'static str,
    Option<(&'static str, i64)>,
    (&'static str, i64),
    (&'static str, i64),
);

const SAFE_ROWS: [SafeRow; 4] = [
    (
        "send, 1 WR per call (`send_buf_with`)",
        Some(("post", 1)),
        ("post_built", 1),
        ("post_safe", 1),
    ),
    (
        "send, lists of 32 (`send_bufs`)",
        Some(("post", 32)),
        ("post_built", 32),
        ("post_safe", 32),
    ),
    (
        "QP receive, 1 WR per call (`Qp::recv_buf`)",
        None,
        ("recv_built", 1),
        ("recv_safe", 1),
    ),
    (
        "SRQ receive, 1 WR per call (`Srq::recv_buf`)",
        None,
        ("srq_post_built", 1),
        ("srq_post_safe", 1),
    ),
];

/// The Rust API's and the drop-in's table against librxe (`rust`/`dropin` over `c`).
fn librxe_table(ir: &BTreeMap<Key, f64>, imp: &str, name: &str, rows: &[IrRow]) -> String {
    let get = |w: &str, p: i64, i: &str| ir.get(&(w.to_string(), p, i.to_string())).copied();
    let ir_cell = |x: Option<f64>| x.map_or("–".to_string(), |x| format!("{x:.1}"));
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| workload | per | Ir librxe | Ir {name} | {name}/librxe | target | met |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---|---|");
    for &(w, p, what, per, target) in rows {
        let (c, x) = (get(w, p, "c"), get(w, p, imp));
        if c.is_none() && x.is_none() {
            continue;
        }
        let r = match (x, c) {
            (Some(x), Some(c)) if c > 0.0 => Some(x / c),
            _ => None,
        };
        let (t, met) = match (target, r) {
            (None, _) => ("–".to_string(), "–"),
            (Some(t), None) => (format!("≤ {t}×"), "?"),
            (Some(t), Some(r)) => (format!("≤ {t}×"), if r <= t { "yes" } else { "no" }),
        };
        let _ = writeln!(
            md,
            "| {what} | {per} | {} | {} | {} | {t} | {met} |",
            ir_cell(c),
            ir_cell(x),
            r.map_or("–".to_string(), |r| format!("{r:.2}")),
        );
    }
    md
}

/// The safe posts against the raw ones (the budget: at most 5 instructions per WR over the
/// raw post of a request built per call).
fn safe_table(ir: &BTreeMap<Key, f64>) -> String {
    let get = |w: &str, p: i64| ir.get(&(w.to_string(), p, "rust".to_string())).copied();
    let ir_cell = |x: Option<f64>| x.map_or("–".to_string(), |x| format!("{x:.1}"));
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| request | Ir raw, prepared | Ir raw, built per call | Ir safe | safe − built | budget | met |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---|---|");
    for (what, prepared, (bw, bp), (sw, sp)) in SAFE_ROWS {
        let prepared = prepared.and_then(|(w, p)| get(w, p));
        let (built, safe) = (get(bw, bp), get(sw, sp));
        if built.is_none() && safe.is_none() {
            continue;
        }
        let (extra, met) = match (safe, built) {
            (Some(s), Some(b)) => (format!("{:+.1}", s - b), if s - b <= 5.0 { "yes" } else { "no" }),
            _ => ("–".to_string(), "?"),
        };
        let _ = writeln!(
            md,
            "| {what} | {} | {} | {} | {extra} | ≤ +5 | {met} |",
            ir_cell(prepared),
            ir_cell(built),
            ir_cell(safe),
        );
    }
    md
}

/// The instruction tables of the rxe run (`target/bench/instructions.md`), in the form
/// docs/benchmarks.md shows them: the Rust API against librxe, the drop-in against librxe, and
/// the safe posts against the raw ones. Rows without counts are left out.
fn instruction_tables(ir: &BTreeMap<Key, f64>) -> String {
    format!(
        "### The Rust API against librxe\n\n{}\n### The drop-in against librxe\n\n{}\n### Safe posts against raw posts\n\n{}",
        librxe_table(ir, "rust", "Rust", &RUST_IR_ROWS),
        librxe_table(ir, "dropin", "drop-in", &DROPIN_IR_ROWS),
        safe_table(ir)
    )
}

/// Workloads the C harness does not run (their rows have no librxe count).
const RUST_ONLY: [&str; 1] = ["drain_floor"];

/// The counts missing from the three tables of docs/benchmarks.md (empty when every cell has
/// its count).
fn missing_counts(ir: &BTreeMap<Key, f64>) -> Vec<String> {
    let mut want: Vec<(&str, i64, &str)> = Vec::new();
    for &(w, p, ..) in &RUST_IR_ROWS {
        want.push((w, p, "rust"));
        if !RUST_ONLY.contains(&w) {
            want.push((w, p, "c"));
        }
    }
    for &(w, p, ..) in &DROPIN_IR_ROWS {
        want.extend([(w, p, "dropin"), (w, p, "c")]);
    }
    for (_, prepared, built, safe) in SAFE_ROWS {
        for (w, p) in prepared.into_iter().chain([built, safe]) {
            want.push((w, p, "rust"));
        }
    }
    let mut missing: Vec<String> = want
        .into_iter()
        .filter(|&(w, p, i)| !ir.contains_key(&(w.to_string(), p, i.to_string())))
        .map(|(w, p, i)| format!("{i} {w} {p}"))
        .collect();
    missing.dedup();
    missing
}

/// The three rxe parts of docs/benchmarks.md (`bench-rxe-api`, `bench-rxe-dropin`,
/// `bench-safe`), each its table and the line saying where it came from; an error unless the
/// run's callgrind step counted every cell (all three harnesses) and recorded itself.
fn rxe_doc_parts(ir: &BTreeMap<Key, f64>, run: &doc::Run, guest_kernel: &str) -> Result<[(&'static str, String); 3]> {
    let missing = missing_counts(ir);
    if !missing.is_empty() {
        bail!(
            "the callgrind step has no counts for {} (it must run for the Rust harness, C on librxe and C on the drop-in)",
            missing.join(", ")
        );
    }
    let line = format!(
        "\n{}; guest kernel {guest_kernel}. Ratios and margins are computed from the unrounded counts.\n",
        run.generated()
    );
    Ok([
        ("rxe-api", librxe_table(ir, "rust", "Rust", &RUST_IR_ROWS) + &line),
        (
            "rxe-dropin",
            librxe_table(ir, "dropin", "drop-in", &DROPIN_IR_ROWS) + &line,
        ),
        ("safe", safe_table(ir) + &line),
    ])
}

/// Whether `raw/cg` holds callgrind dumps of the measured regions (any implementation).
fn has_callgrind(raw: &Path) -> bool {
    std::fs::read_dir(raw.join("cg"))
        .is_ok_and(|d| d.flatten().any(|e| e.file_name().to_string_lossy().contains(".out.")))
}

/// Writes the three rxe parts of docs/benchmarks.md from the raw results in `raw` (all or
/// none).
fn write_rxe_doc(raw: &Path) -> Result<()> {
    let ir = read_callgrind(raw);
    let run = doc::Run::read(raw)?;
    let env = doc::read_keys(&raw.join("env.txt"));
    let kernel = env.get("guest_kernel").map_or("unknown", String::as_str);
    let parts = rxe_doc_parts(&ir, &run, kernel)?;
    let parts: Vec<(&str, &str)> = parts.iter().map(|(n, b)| (*n, b.as_str())).collect();
    doc::write_parts(&parts)
}

/// The replayed drain's batch sizes (the harnesses' REPLAY_BATCHES).
const REPLAY_BATCHES: [i64; 3] = [1, 16, 64];

/// The replayed drain process by process: each of its samples is the median of one block of
/// drains, so the lowest and highest sample of a repetition show how far the speed of one
/// process moved while it ran.
fn replay_table(samples: &Samples) -> String {
    let mut md = String::new();
    let reps: std::collections::BTreeSet<i64> = samples
        .iter()
        .filter(|((w, _, _), _)| w == "drain_replay" || w == "drain_floor")
        .flat_map(|(_, r)| r.keys().copied())
        .collect();
    if reps.is_empty() {
        return md;
    }
    let _ = writeln!(
        md,
        "\nThe replayed drain by process: lowest–highest block median (ns/completion) of each repetition.\n"
    );
    let head: Vec<String> = reps.iter().map(|r| format!("rep {r}")).collect();
    let _ = writeln!(md, "| workload | batch | impl | {} |", head.join(" | "));
    let _ = writeln!(md, "|---|---:|---|{}", "---:|".repeat(reps.len()));
    let keys = REPLAY_BATCHES
        .iter()
        .flat_map(|&b| ["c", "rust", "dropin"].map(|i| ("drain_replay", b, i)))
        .chain([("drain_floor", 1, "rust")]);
    for (w, b, i) in keys {
        let Some(by_rep) = samples.get(&(w.to_string(), b, i.to_string())) else {
            continue;
        };
        let cells: Vec<String> = reps
            .iter()
            .map(|r| match by_rep.get(r) {
                Some(v) if !v.is_empty() => {
                    let (lo, hi) = v
                        .iter()
                        .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
                    format!("{lo:.0}–{hi:.0}")
                }
                _ => "–".into(),
            })
            .collect();
        let _ = writeln!(md, "| {w} | {b} | {i} | {} |", cells.join(" | "));
    }
    md
}

fn fmt_value(x: f64) -> String {
    if x >= 1000.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

/// The median of `impl`/C (each repetition's median over the C one's: the implementations of a
/// repetition ran back to back), with the lowest and highest of those ratios.
fn paired_ratio(samples: &Samples, w: &str, p: i64, imp: &str) -> Option<(f64, f64, f64)> {
    let of = |i: &str| samples.get(&(w.to_string(), p, i.to_string()));
    let (a, c) = (of(imp)?, of("c")?);
    let mut ratios: Vec<f64> = a
        .iter()
        .filter_map(|(rep, v)| {
            let cv = c.get(rep)?;
            let (ma, mc) = (median_iqr(&mut v.clone()).0, median_iqr(&mut cv.clone()).0);
            (!v.is_empty() && !cv.is_empty() && mc > 0.0).then(|| ma / mc)
        })
        .collect();
    if ratios.is_empty() {
        return None;
    }
    let m = median_iqr(&mut ratios).0;
    Some((m, ratios[0], ratios[ratios.len() - 1]))
}

/// The table (markdown) and the plot data (CSV).
fn summarize(raw: &Path) -> Result<Summary> {
    let samples = read_samples(raw)?;
    let ir = read_callgrind(raw);
    let mut med: BTreeMap<Key, (f64, f64, usize)> = BTreeMap::new();
    for (k, reps) in &samples {
        let mut v: Vec<f64> = reps.values().flatten().copied().collect();
        if !v.is_empty() {
            let (m, iqr) = median_iqr(&mut v);
            med.insert(k.clone(), (m, iqr, v.len()));
        }
    }
    let get = |w: &str, p: i64, i: &str| med.get(&(w.to_string(), p, i.to_string())).copied();
    let get_ir = |w: &str, p: i64, i: &str| ir.get(&(w.to_string(), p, i.to_string())).copied();
    let cell = |x: Option<(f64, f64, usize)>| match x {
        Some((m, iqr, _)) if m > 0.0 => format!("{} ±{:.0}%", fmt_value(m), 50.0 * iqr / m),
        _ => "–".into(),
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let show = |r: Option<f64>| r.map_or("–".to_string(), |r| format!("{r:.2}"));
    let show_paired =
        |r: Option<(f64, f64, f64)>| r.map_or("–".to_string(), |(m, lo, hi)| format!("**{m:.2}** ({lo:.2}–{hi:.2})"));
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| workload | unit | C provider | Rust (uverbs API) | Rust/C | drop-in (C program, Rust provider) | drop-in/C | Ir/op C | Ir/op Rust | Ir Rust/C | Ir/op drop-in | target | met |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
    let batches = drain_batches(&samples, &ir);
    for r in rows(&batches) {
        let (c, rust, dropin) = (
            get(r.workload, r.param, "c"),
            get(r.workload, r.param, "rust"),
            get(r.workload, r.param, "dropin"),
        );
        let (irc, irr, ird) = (
            get_ir(r.workload, r.param, "c"),
            get_ir(r.workload, r.param, "rust"),
            get_ir(r.workload, r.param, "dropin"),
        );
        if [c, rust, dropin].iter().all(Option::is_none) && [irc, irr, ird].iter().all(Option::is_none) {
            continue;
        }
        let rr = paired_ratio(&samples, r.workload, r.param, "rust");
        let rd = paired_ratio(&samples, r.workload, r.param, "dropin");
        let rir = ratio(irr, irc);
        // perftest compares the drop-in; everything else the Rust API.
        let perftest = r.workload.starts_with("ib_");
        let subject = if perftest { rd } else { rr }.map(|x| x.0);
        let (target, met) = match r.target {
            None => ("–".to_string(), "–".to_string()),
            Some(t) => {
                let time_ok = subject.map(|x| if r.rate { x >= t } else { x <= t });
                let ir_ok = r.ir_target.map(|it| rir.is_some_and(|x| x <= it));
                let desc = match (r.rate, r.ir_target) {
                    (true, _) => format!("rate ≥ {t}× C"),
                    (false, Some(it)) => format!("≤ {t}× C (time), ≤ {it}× (Ir)"),
                    (false, None) => format!("≤ {t}× C"),
                };
                let met = match (time_ok, ir_ok) {
                    (Some(true), None | Some(true)) => "yes".to_string(),
                    (Some(false), Some(true)) => "Ir only".to_string(),
                    (Some(true), Some(false)) => "time only".to_string(),
                    (Some(false), _) => "no".to_string(),
                    (None, _) => "?".to_string(),
                };
                (desc, met)
            }
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {target} | {met} |",
            r.what,
            r.unit,
            cell(c),
            cell(rust),
            show_paired(rr),
            cell(dropin),
            show_paired(rd),
            irc.map_or("–".into(), |x| format!("{x:.1}")),
            irr.map_or("–".into(), |x| format!("{x:.1}")),
            show(rir),
            ird.map_or("–".into(), |x| format!("{x:.1}")),
        );
    }
    let _ = writeln!(
        md,
        "\nValues are medians over every round of every repetition (± half the interquartile range, as a \
         percentage of the median). Ratios pair the implementations of each repetition, which ran back \
         to back: the median of the per-repetition ratios, with the lowest and highest in parentheses; \
         for the perftest message rates a ratio above 1 is better. Ir/op are callgrind instruction \
         counts of the measured region only, divided by the operations in it."
    );
    md.push_str(&safe_post_line(&ir));
    md.push_str(&replay_table(&samples));
    let mut csv = String::from("batch,impl,ns,ir\n");
    for &b in &batches {
        for i in ["c", "rust", "dropin"] {
            if let Some((ns, _, _)) = get("drain", b, i) {
                let irv = get_ir("drain", b, i).map_or(String::new(), |x| format!("{x:.2}"));
                let _ = writeln!(csv, "{b},{i},{ns:.3},{irv}");
            }
        }
    }
    Ok(Summary { markdown: md, csv })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_quartiles() {
        let mut v = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(median_iqr(&mut v), (3.0, 2.0));
        let mut v = [1.0, 2.0];
        assert_eq!(median_iqr(&mut v).0, 1.5);
    }

    #[test]
    fn summary_from_raw_files() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("cg")).unwrap();
        std::fs::write(
            dir.join("results.jsonl"),
            "{\"impl\":\"c\",\"workload\":\"drain\",\"param\":16,\"unit\":\"ns\",\"samples\":[40,40],\"median\":40}\n\
             {\"impl\":\"rust\",\"workload\":\"drain\",\"param\":16,\"unit\":\"ns\",\"samples\":[10,30],\"median\":20}\n\
             {\"impl\":\"rust\",\"workload\":\"drain\",\"param\":16,\"unit\":\"ns\",\"samples\":[20],\"median\":20}\n",
        )
        .unwrap();
        let dump = |ir: u64| format!("desc: Trigger: Client Request: drain 16 4096\nevents: Ir\ntotals: {ir}\n");
        std::fs::write(dir.join("cg/c.out.1"), dump(4096 * 25)).unwrap();
        std::fs::write(dir.join("cg/rust.out.1"), dump(4096 * 10)).unwrap();
        std::fs::write(dir.join("cg/rust.out"), "totals: 0\n").unwrap();
        let s = summarize(&dir).unwrap();
        let line = s.markdown.lines().find(|l| l.contains("poll 16 at a time")).unwrap();
        assert!(line.contains("| 40.0 ±0% | 20.0 ±"), "{line}");
        assert!(line.contains("| **0.50** (0.50–0.50) |"), "{line}");
        assert!(line.contains("| 25.0 | 10.0 | 0.40 |"), "{line}");
        assert!(line.ends_with("| yes |"), "{line}");
        assert_eq!(s.csv, "batch,impl,ns,ir\n16,c,40.000,25.00\n16,rust,20.000,10.00\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn safe_post_is_compared_with_the_raw_post() {
        let key = |w: &str| (w.to_string(), 1, "rust".to_string());
        let mut ir = BTreeMap::new();
        assert_eq!(safe_post_line(&ir), "");
        ir.insert(key("post"), 187.6);
        ir.insert(key("post_safe"), 191.6);
        assert!(safe_post_line(&ir)
            .contains("prepared request, 1 WR per call: 191.6 − 187.6 = +4.0 instructions per WR (budget ≤ 5: met)"));
        ir.insert(key("post_safe"), 193.0);
        assert!(safe_post_line(&ir).contains("(budget ≤ 5: not met)"));
        assert!(!safe_post_line(&ir).contains("lists"), "no list figures, no list line");
        let list = |w: &str| (w.to_string(), 32, "rust".to_string());
        ir.insert(list("post"), 95.4);
        ir.insert(list("post_safe"), 113.1);
        assert!(safe_post_line(&ir).contains(
            "prepared lists of 32 (re-posted, nothing built per call), the lists: 113.1 − 95.4 = +17.7 instructions per WR (budget ≤ 5: not met)"
        ));
        assert!(
            !safe_post_line(&ir).contains("built per call (id"),
            "no built lists measured"
        );
        ir.insert(list("post_built"), 110.0);
        assert!(safe_post_line(&ir).contains(
            "lists of 32 built per call (id and SGE per request), the lists: 113.1 − 110.0 = +3.1 instructions per WR (budget ≤ 5: met)"
        ));
        ir.insert(key("recv_built"), 140.0);
        ir.insert(key("recv_safe"), 146.5);
        assert!(safe_post_line(&ir).contains(
            "Safe QP receive over the raw QP post of a request built per call: 146.5 − 140.0 = +6.5 instructions per WR (budget ≤ 5: not met)"
        ));
        assert!(!safe_post_line(&ir).contains("SRQ"), "no SRQ figures, no SRQ line");
    }

    #[test]
    fn instruction_tables_compare_with_librxe_and_the_raw_posts() {
        let mut ir = BTreeMap::new();
        let mut put = |w: &str, p: i64, i: &str, v: f64| ir.insert((w.to_string(), p, i.to_string()), v);
        put("drain", 1, "c", 70.0);
        put("drain", 1, "rust", 49.0);
        put("drain", 1, "dropin", 69.0);
        put("empty", 16, "c", 51.0);
        put("empty", 16, "rust", 21.0);
        put("post", 1, "rust", 186.6);
        put("post_built", 1, "rust", 197.6);
        put("post_safe", 1, "rust", 199.6);
        put("recv_built", 1, "rust", 144.6);
        put("recv_safe", 1, "rust", 142.8);
        let t = instruction_tables(&ir);
        assert!(
            t.contains("| drain 4096 ready, poll 1 at a time | completion | 70.0 | 49.0 | 0.70 | ≤ 0.5× | no |"),
            "{t}"
        );
        assert!(
            t.contains("| poll an empty CQ (16 asked) | call | 51.0 | 21.0 | 0.41 | ≤ 0.5× | yes |"),
            "{t}"
        );
        assert!(
            t.contains("| `ibv_poll_cq`, 1 at a time | completion | 70.0 | 69.0 | 0.99 | ≤ 1× | yes |"),
            "{t}"
        );
        assert!(
            t.contains("| `ibv_poll_cq` on an empty CQ (16 asked) | call | 51.0 | – | – | ≤ 1× | ? |"),
            "no drop-in count, but C's: {t}"
        );
        assert!(!t.contains("64 at a time"), "no counts at all, no row: {t}");
        assert!(
            t.contains("| send, 1 WR per call (`send_buf_with`) | 186.6 | 197.6 | 199.6 | +2.0 | ≤ +5 | yes |"),
            "{t}"
        );
        assert!(
            t.contains("| QP receive, 1 WR per call (`Qp::recv_buf`) | – | 144.6 | 142.8 | -1.8 | ≤ +5 | yes |"),
            "{t}"
        );
        assert!(!t.contains("SRQ receive"), "no SRQ counts, no SRQ row: {t}");
    }

    /// Counts for every cell of the three doc tables.
    fn full_counts() -> BTreeMap<Key, f64> {
        let mut ir = BTreeMap::new();
        let mut n = 10.0;
        for &(w, p, ..) in RUST_IR_ROWS.iter().chain(&DROPIN_IR_ROWS) {
            for i in ["c", "rust", "dropin"] {
                n += 1.0;
                ir.insert((w.to_string(), p, i.to_string()), n);
            }
        }
        for (_, prepared, built, safe) in SAFE_ROWS {
            for (w, p) in prepared.into_iter().chain([built, safe]) {
                n += 1.0;
                ir.insert((w.to_string(), p, "rust".to_string()), n);
            }
        }
        ir
    }

    #[test]
    fn the_doc_parts_need_every_count() {
        let run = doc::Run {
            command: "UVERBS_BENCH_SKIP=timing cargo xtask bench".into(),
            commit: "abc1234".into(),
            date: "2026-11-28 12:00 UTC".into(),
            keys: BTreeMap::new(),
        };
        let mut ir = full_counts();
        ir.insert(("drain".into(), 1, "c".into()), 70.0);
        ir.insert(("drain".into(), 1, "rust".into()), 49.0);
        ir.insert(("drain".into(), 1, "dropin".into()), 69.0);
        let parts = rxe_doc_parts(&ir, &run, "6.12.117").unwrap();
        assert_eq!(
            parts.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            ["rxe-api", "rxe-dropin", "safe"]
        );
        assert!(
            parts[0]
                .1
                .contains("| drain 4096 ready, poll 1 at a time | completion | 70.0 | 49.0 | 0.70 | ≤ 0.5× | no |"),
            "{}",
            parts[0].1
        );
        assert!(parts[1]
            .1
            .contains("| `ibv_poll_cq`, 1 at a time | completion | 70.0 | 69.0 | 0.99 | ≤ 1× | yes |"));
        assert!(parts[2].1.starts_with("| request | Ir raw, prepared |"));
        for (_, body) in &parts {
            assert!(body.ends_with(
                "\nGenerated by `UVERBS_BENCH_SKIP=timing cargo xtask bench` at abc1234, 2026-11-28 12:00 UTC; guest kernel 6.12.117. Ratios and margins are computed from the unrounded counts.\n"
            ), "{body}");
            assert!(!body.contains("###"), "no headings in the doc parts: {body}");
        }
        // The floor loop has no C count, and needs none.
        assert!(!missing_counts(&ir).iter().any(|m| m.contains("drain_floor")));
        // One harness's callgrind run missing: refused.
        ir.retain(|(_, _, i), _| i != "dropin");
        let e = rxe_doc_parts(&ir, &run, "6.12.117").unwrap_err().to_string();
        assert!(e.contains("dropin drain 1"), "{e}");
        let mut ir = full_counts();
        ir.remove(&("srq_post_safe".to_string(), 1, "rust".to_string()));
        assert_eq!(missing_counts(&ir), ["rust srq_post_safe 1"]);
    }

    #[test]
    fn ratios_pair_each_repetition() {
        let line = |rep: u32, imp: &str, v: f64| {
            format!("{{\"rep\":{rep},\"impl\":\"{imp}\",\"workload\":\"empty\",\"param\":16,\"samples\":[{v}]}}\n")
        };
        let dir = std::env::temp_dir().join(format!("xtask-bench-pairs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // The host got twice as slow for the second repetition: each ratio is still 0.25.
        let text = [
            line(1, "c", 100.0),
            line(1, "rust", 25.0),
            line(2, "c", 200.0),
            line(2, "rust", 50.0),
        ]
        .concat();
        std::fs::write(dir.join("results.jsonl"), text).unwrap();
        let samples = read_samples(&dir).unwrap();
        assert_eq!(paired_ratio(&samples, "empty", 16, "rust"), Some((0.25, 0.25, 0.25)));
        assert_eq!(paired_ratio(&samples, "empty", 16, "dropin"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn replay_table_spans_each_repetition() {
        let line = |rep: u32, imp: &str, w: &str, v: &str| {
            format!("{{\"rep\":{rep},\"impl\":\"{imp}\",\"workload\":\"{w}\",\"param\":1,\"samples\":[{v}]}}\n")
        };
        let text = [
            line(1, "rust", "drain_replay", "48,70,49"),
            line(2, "rust", "drain_replay", "50"),
            line(1, "c", "drain_replay", "78,120"),
            line(2, "rust", "drain_floor", "24,30"),
        ]
        .concat();
        let dir = std::env::temp_dir().join(format!("xtask-bench-replay-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("results.jsonl"), text).unwrap();
        let t = replay_table(&read_samples(&dir).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(t.contains("| workload | batch | impl | rep 1 | rep 2 |"), "{t}");
        assert!(t.contains("| drain_replay | 1 | c | 78–120 | – |"), "{t}");
        assert!(t.contains("| drain_replay | 1 | rust | 48–70 | 50–50 |"), "{t}");
        assert!(t.contains("| drain_floor | 1 | rust | – | 24–30 |"), "{t}");
    }
}
