//! The mlx5 step of `cargo xtask bench`: the Rust mlx5 provider against Debian's C libmlx5,
//! both on the mlx5 device model on this host. No guest: the rings, doorbell records and
//! UAR pages are plain memory of the process, so the data path runs natively.
//!
//! The same two harnesses as the rxe benchmarks (`benches/verbs/main.rs` on the uverbs API
//! with the mlx5 provider, `benches/c/verbs_bench.c` through libibverbs and libmlx5) run on
//! the model (`--device mlx5_0`, InfiniBand: the LID addresses the pair), each twice: under
//! callgrind, counting only the measured regions of the harness's own thread (collection is
//! toggled by client requests, per thread, and the dumps are per thread: the model's device
//! thread is never counted), and natively for nanoseconds. The drain measures only rounds in
//! which every completion was already written when the region began (the harness waits for
//! the device first, and a round that found fewer is dumped as `drain_partial` and rerun).
//!
//! Results: `target/bench/mlx5/` (raw dumps and results.jsonl) and the table
//! `target/bench/mlx5-summary.md`, with, for every missed instruction target, the functions
//! the measured region spent its instructions in, and for every missed time target a sampling
//! profile of the Rust harness running that workload for many rounds (`perf record -e
//! cpu-clock`, the software clock: this VM has no hardware counters).

use super::{doc, fmt_value, median_iqr, read_callgrind, read_samples};
use crate::error::{bail, Context, Result};
use crate::proc;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// The name that skips this step in `UVERBS_BENCH_SKIP`.
pub const SKIP_NAME: &str = "mlx5";

/// How long the drain first waits for the device to write its 4096 completions (doubled after
/// a round that found fewer): the model runs under valgrind too.
const DRAIN_WAIT_MS: &str = "2000";

/// Native runs of each harness, alternating (11 rounds each): the table's ns are medians of
/// all their samples.
const NATIVE_PASSES: usize = 3;

/// `prog` on CPU 0 with the model's device thread on CPU 1 (`taskset`, and the model's
/// `UVERBS_MLX5_MODEL_DEVICE_CPU`), where there are two CPUs and `taskset`: left to the
/// scheduler the two threads move between the cores, and one process measured up to 2.5×
/// the time of the next (docs/benchmarks.md). Otherwise unpinned. The measured thread keeps
/// its priority (`UVERBS_MLX5_MODEL_CLIENT_NICE=0`).
fn pinned(prog: &Path) -> Command {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let mut c = match proc::find_program("taskset") {
        Some(taskset) if cpus >= 2 => {
            let mut c = Command::new(taskset);
            c.args(["-c", "0"]).arg(prog).env("UVERBS_MLX5_MODEL_DEVICE_CPU", "1");
            c
        }
        _ => {
            note!("xtask: bench mlx5: native runs unpinned (needs 2 CPUs and taskset)");
            Command::new(prog)
        }
    };
    c.env("UVERBS_MLX5_MODEL_CLIENT_NICE", "0");
    c
}

/// The rows: workload, parameter, what, unit, target (Rust/libmlx5 at most).
const ROWS: [(&str, i64, &str, &str, f64); 6] = [
    ("drain", 1, "drain 4096 ready, poll 1 at a time", "completion", 0.7),
    ("drain", 16, "drain 4096 ready, poll 16 at a time", "completion", 0.5),
    ("drain", 64, "drain 4096 ready, poll 64 at a time", "completion", 0.5),
    ("empty", 16, "poll an empty CQ (16 asked)", "call", 0.5),
    ("post", 1, "post_send, 1 WR per call (+ doorbell)", "WR", 0.7),
    ("post", 32, "post_send, lists of 32 WRs (+ doorbell)", "WR", 0.7),
];

/// The harness arguments for implementation `imp` on the model.
fn harness_args(imp: &str) -> Vec<&str> {
    vec![
        "--impl",
        imp,
        "--device",
        "mlx5_0",
        "--gid-index",
        "0",
        "--only",
        "drain,empty,post",
        "--batches",
        "1,16,64",
        "--drain-wait-ms",
        DRAIN_WAIT_MS,
    ]
}

/// Runs the step (`args`: the bench command's arguments, for the record); returns whether
/// every run succeeded.
pub fn run(out: &Path, rust: &Path, c_harness: &Path, args: &str) -> Result<bool> {
    let lib = crate::mlx5::build_model_in(true)?;
    let raw = out.join("mlx5");
    let _ = std::fs::remove_dir_all(&raw);
    std::fs::create_dir_all(raw.join("cg")).with_context(|| format!("creating {}", raw.display()))?;
    doc::record_start(&raw, args, &[("load_start", load_1min()), ("cpu", doc::cpu_model())])?;
    let mut ok = true;
    let harnesses = [("c", c_harness), ("rust", rust)];
    for (imp, prog) in harnesses {
        let dir = crate::mlx5::fresh_dir()?;
        let mut cg = Command::new("valgrind");
        cg.args(["--tool=callgrind", "--collect-atstart=no", "--separate-threads=yes"])
            .arg("--compress-strings=no")
            // Valgrind runs one thread at a time; with its default lock a busy-polling harness
            // can keep the model's device thread from ever running again (seen waiting for a
            // list's completion). Fair scheduling hands the lock round; counts are per thread.
            .arg("--fair-sched=yes")
            .arg(format!(
                "--callgrind-out-file={}",
                raw.join("cg").join(format!("{imp}.out")).display()
            ))
            .arg(prog)
            .args(harness_args(imp))
            .arg("--callgrind")
            // Timings under valgrind mean nothing; the dumps are the result.
            .stdout(Stdio::null());
        crate::mlx5::on_model(&mut cg, &lib, &dir);
        note!("xtask: bench mlx5: {}", proc::describe(&cg));
        let cg_ok = proc::status(&mut cg)?.success();
        if cg_ok {
            let _ = std::fs::remove_dir_all(dir);
        }
        ok &= cg_ok;
    }
    // The native runs alternate, so a slow stretch of the host falls on both libraries.
    let mut results = String::new();
    for _ in 0..NATIVE_PASSES {
        for (imp, prog) in harnesses {
            let dir = crate::mlx5::fresh_dir()?;
            let mut native = pinned(prog);
            native.args(harness_args(imp)).stderr(Stdio::inherit());
            crate::mlx5::on_model(&mut native, &lib, &dir);
            note!("xtask: bench mlx5: {}", proc::describe(&native));
            let o = native.output().with_context(|| format!("running {}", prog.display()))?;
            results.push_str(&String::from_utf8_lossy(&o.stdout));
            if o.status.success() {
                let _ = std::fs::remove_dir_all(dir);
            }
            ok &= o.status.success();
        }
    }
    crate::write_atomic(&raw.join("results.jsonl"), results.as_bytes())?;
    doc::record_more(&raw, &[("load_end", load_1min())])?;
    for (w, p, _) in time_misses(&read_samples(&raw)?) {
        ok &= profile_natively(&raw, rust, &lib, w, p)?;
    }
    report(out)?;
    Ok(ok)
}

/// Writes `mlx5-summary.md` from the last run's results in `out/mlx5`, and its first table
/// between the `bench-mlx5` markers of docs/benchmarks.md (`cargo xtask bench --report` redoes
/// both, when there are results). The doc is left alone, and this fails, unless every cell of
/// the table has its figure and the run recorded itself.
pub fn report(out: &Path) -> Result<()> {
    let raw = out.join("mlx5");
    let table = summarize(&raw)?;
    crate::write_atomic(&out.join("mlx5-summary.md"), table.as_bytes())?;
    say!("{table}");
    let part = doc_part(&table, &doc::Run::read(&raw)?)
        .context("the mlx5 results are incomplete; docs/benchmarks.md not updated")?;
    doc::write_parts(&[("mlx5", &part)])
}

/// The 1-minute load average above which the native times are not evidence.
pub(super) const QUIET_LOAD: f64 = 1.5;

/// The host's 1-minute load average, as recorded (`?` where unreadable).
fn load_1min() -> String {
    doc::load_1min().map_or("?".into(), |l| format!("{l:.2}"))
}

/// The part of docs/benchmarks.md: the summary's first table and the generated line (the
/// host's load at the start and end of the run; the ns columns are said not to be evidence
/// when it was above [`QUIET_LOAD`] at either). Fails if a cell has no figure.
fn doc_part(summary: &str, run: &doc::Run) -> Result<String> {
    let table: Vec<&str> = summary.lines().take_while(|l| l.starts_with('|')).collect();
    if table.len() != 2 + ROWS.len() {
        bail!(
            "the summary's table has {} rows, not {}",
            table.len().saturating_sub(2),
            ROWS.len()
        );
    }
    if let Some(row) = table[2..].iter().find(|r| r.contains("| – |") || r.contains("| ? |")) {
        bail!("a row without all its figures: {row}");
    }
    let load = |k: &str| run.keys.get(k).cloned().unwrap_or_else(|| "?".into());
    let (start, end) = (load("load_start"), load("load_end"));
    let busy = [&start, &end]
        .iter()
        .any(|l| l.parse::<f64>().map_or(true, |l| l > QUIET_LOAD));
    let verdict = if busy {
        format!(
            " **The ns columns of this run are not evidence**: the load average was above {QUIET_LOAD} (or unknown) at its start or end; the Ir are deterministic."
        )
    } else {
        " The ns columns are native times on a quiet host; the Ir are deterministic.".to_string()
    };
    let cpu = run.keys.get("cpu").map_or("unknown", String::as_str);
    Ok(format!(
        "{}\n\n{}; CPU {cpu}; host load average (1 min) {start} at the start, {end} at the end.{verdict}\n",
        table.join("\n"),
        run.generated()
    ))
}

/// Nanoseconds to three significant digits (the form docs/benchmarks.md shows them in).
fn fmt_ns(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// The table from `raw` (results.jsonl and the callgrind dumps in cg/).
fn summarize(raw: &Path) -> Result<String> {
    let samples = read_samples(raw)?;
    let ir = read_callgrind(raw);
    let ns = |w: &str, p: i64, i: &str| native_median(&samples, w, p, i);
    let ir_of = |w: &str, p: i64, i: &str| ir.get(&(w.to_string(), p, i.to_string())).copied();
    let show = |x: Option<f64>| x.map_or("–".to_string(), fmt_value);
    let show_ns = |x: Option<f64>| x.map_or("–".to_string(), fmt_ns);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let show_ratio = |r: Option<f64>| r.map_or("–".to_string(), |r| format!("{r:.2}"));
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| workload | per | Ir libmlx5 | Ir Rust | Ir Rust/libmlx5 | ns libmlx5 | ns Rust | ns Rust/libmlx5 | target | met (Ir) | met (ns) |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|");
    let mut missed = Vec::new();
    for (w, p, what, per, target) in ROWS {
        let (ic, ir_rust) = (ir_of(w, p, "c"), ir_of(w, p, "rust"));
        let (nc, nr) = (ns(w, p, "c"), ns(w, p, "rust"));
        let r = ratio(ir_rust, ic);
        let met = match r {
            Some(r) if r <= target => "yes",
            Some(_) => {
                missed.push((w, p, what));
                "no"
            }
            None => "?",
        };
        let time_met = match ratio(nr, nc) {
            Some(r) if r <= target => "yes",
            Some(_) => "no",
            None => "?",
        };
        let _ = writeln!(
            md,
            "| {what} | {per} | {} | {} | {} | {} | {} | {} | ≤ {target}× | {met} | {time_met} |",
            show(ic),
            show(ir_rust),
            show_ratio(r),
            show_ns(nc),
            show_ns(nr),
            show_ratio(ratio(nr, nc)),
        );
    }
    let _ = writeln!(
        md,
        "\nIr: callgrind instructions of the measured regions of the harness thread, divided by \
         the operations in them. ns: medians of the native runs on the model (its device thread \
         shares the machine: noisy; the Ir are the deterministic comparison)."
    );
    for (w, p, what) in missed {
        for imp in ["rust", "c"] {
            let _ = writeln!(md, "\n{what}, {imp}: Ir per operation by function (self cost)\n");
            for (f, v) in profile(raw, w, p, imp).into_iter().take(8) {
                let _ = writeln!(md, "    {v:>8.1}  {f}");
            }
        }
    }
    for (w, p, what) in time_misses(&samples) {
        let _ = writeln!(
            md,
            "\n{what}, rust: time missed; native profile (`{}`)\n",
            perf_name(w, p)
        );
        match std::fs::read_to_string(raw.join("perf").join(perf_name(w, p))) {
            Ok(text) => text.lines().for_each(|l| {
                let _ = writeln!(md, "    {l}");
            }),
            Err(_) => {
                let _ = writeln!(md, "    (none taken)");
            }
        }
    }
    Ok(md)
}

/// The median of the native samples of `imp` for workload `w` at `p`.
fn native_median(samples: &super::Samples, w: &str, p: i64, imp: &str) -> Option<f64> {
    let mut v: Vec<f64> = samples
        .get(&(w.to_string(), p, imp.to_string()))?
        .values()
        .flatten()
        .copied()
        .collect();
    (!v.is_empty()).then(|| median_iqr(&mut v).0)
}

/// The rows whose native time ratio missed its target.
fn time_misses(samples: &super::Samples) -> Vec<(&'static str, i64, &'static str)> {
    ROWS.iter()
        .filter(|&&(w, p, .., target)| {
            let (c, rust) = (native_median(samples, w, p, "c"), native_median(samples, w, p, "rust"));
            matches!((rust, c), (Some(r), Some(c)) if c > 0.0 && r / c > target)
        })
        .map(|&(w, p, what, ..)| (w, p, what))
        .collect()
}

/// The file under `perf/` holding the native profile of workload `w` at `p`.
fn perf_name(w: &str, p: i64) -> String {
    format!("{w}-{p}.txt")
}

/// Measured rounds of a profile run, per workload: enough for some hundreds of samples inside
/// the measured regions (a post round takes 5 to 30 µs under the profiler, an empty-poll round
/// 0.5 ms, a drain round 20 to 90 µs after a wait of 300 ms for the device).
fn profile_rounds(w: &str) -> &'static str {
    match w {
        "post" => "1000",
        "empty" => "50",
        _ => "100",
    }
}

/// Runs the Rust harness on workload `w` for many rounds under `perf record -e cpu-clock`, and
/// keeps the harness thread's hottest functions and the hottest instructions of the two hottest
/// provider functions in `perf/<w>-<p>.txt`. Returns whether the run succeeded (a failed
/// record is said in the file instead).
fn profile_natively(raw: &Path, rust: &Path, lib: &Path, w: &str, p: i64) -> Result<bool> {
    let dir = raw.join("perf");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let data = dir.join(format!("{w}-{p}.data"));
    // Sampling only inside the measured regions: the harness enables and disables it through
    // these fifos (`perf record --control`, events off at the start).
    let (ctl, ack) = (dir.join(format!("{w}-{p}.ctl")), dir.join(format!("{w}-{p}.ack")));
    for fifo in [&ctl, &ack] {
        let _ = std::fs::remove_file(fifo);
        proc::check(Command::new("mkfifo").arg(fifo))?;
    }
    let model_dir = crate::mlx5::fresh_dir()?;
    let mut rec = Command::new("perf");
    rec.args(["record", "-q", "-e", "cpu-clock", "-F", "50000", "-D", "-1"])
        .arg(format!("--control=fifo:{},{}", ctl.display(), ack.display()))
        .arg("-o")
        .arg(&data)
        .arg("--")
        .env("UVERBS_BENCH_PERF_CTL", format!("{},{}", ctl.display(), ack.display()));
    let harness = pinned(rust);
    rec.arg(harness.get_program()).args(harness.get_args());
    for (k, v) in harness.get_envs() {
        if let Some(v) = v {
            rec.env(k, v);
        }
    }
    let batches = p.to_string();
    let mut args = harness_args("rust");
    args.extend(["--rounds", profile_rounds(w), "--batches", &batches, "--only", w]);
    args.extend(["--drain-wait-ms", "300"]);
    rec.args(&args).stdout(Stdio::null());
    crate::mlx5::on_model(&mut rec, lib, &model_dir);
    note!("xtask: bench mlx5: {}", proc::describe(&rec));
    let recorded = proc::status(&mut rec)?.success();
    let mut text = String::new();
    if recorded {
        let _ = std::fs::remove_dir_all(model_dir);
        let comm: String = rust
            .file_name()
            .map(|n| n.to_string_lossy().chars().take(15).collect())
            .unwrap_or_default();
        text = perf_text(&data, &comm, if w == "post" { "post" } else { "poll" })?;
    } else {
        let _ = writeln!(text, "perf record failed (see the log above)");
    }
    crate::write_atomic(&dir.join(perf_name(w, p)), text.as_bytes())?;
    Ok(recorded)
}

/// The harness thread's (`comm`) functions by share of that thread's samples (the model's
/// device thread, sampled in the same windows, takes most of them), and the hottest
/// instructions of its two hottest provider functions whose names have `hint` in them (the
/// measured verb's), from `perf report` and `perf annotate`.
fn perf_text(data: &Path, comm: &str, hint: &str) -> Result<String> {
    let report = stdout_of(
        Command::new("perf")
            .args(["report", "--stdio", "-q", "--no-children", "--sort", "comm,sym"])
            .arg("-i")
            .arg(data),
    )?;
    // Lines: `<share>%  <comm>  [.] <function>`; the model's threads have names of their own.
    let ours: Vec<(f64, &str)> = report
        .lines()
        .filter_map(|l| {
            let mut t = l.split_whitespace();
            let share = t.next()?.trim_end_matches('%').parse::<f64>().ok()?;
            (t.next()? == comm).then_some(())?;
            Some((share, l.split_once("] ").map_or("?", |(_, f)| f.trim())))
        })
        .collect();
    let total: f64 = ours.iter().map(|&(share, _)| share).sum();
    let mut text = format!(
        "the harness thread's functions, by share of its samples ({total:.1}% of all; the rest \
         are the model's threads):\n"
    );
    for (share, f) in ours.iter().take(12) {
        let _ = writeln!(text, "{:>7.2}%  {f}", 100.0 * share / total.max(f64::MIN_POSITIVE));
    }
    let hottest = ours
        .iter()
        .map(|&(_, f)| f)
        .filter(|f| f.contains("providers::mlx5") && f.contains(hint));
    for f in hottest.take(2) {
        let annotate = stdout_of(
            Command::new("perf")
                .args(["annotate", "--stdio", "--no-source", "-i"])
                .arg(data)
                .arg(f),
        )?;
        let mut hot: Vec<(f64, &str)> = annotate
            .lines()
            .filter_map(|l| {
                let (share, rest) = l.split_once(':')?;
                Some((share.trim().parse::<f64>().ok()?, rest.trim()))
            })
            .filter(|(share, _)| *share > 0.0)
            .collect();
        hot.sort_by(|a, b| b.0.total_cmp(&a.0));
        let _ = writeln!(text, "\nhottest instructions of {f} (share of its samples):");
        for (share, ins) in hot.into_iter().take(10) {
            let _ = writeln!(text, "{share:>7.2}%  {ins}");
        }
    }
    Ok(text)
}

/// `cmd`'s standard output; fails (quoting its standard error) unless it exits with 0.
fn stdout_of(cmd: &mut Command) -> Result<String> {
    Ok(String::from_utf8_lossy(&proc::filter(cmd, &[], &[0])?).into_owned())
}

/// The self cost per function, per operation, of implementation `imp`'s dumps of workload
/// `w` at `p`, highest first (the dumps' uncompressed names: `--compress-strings=no`).
fn profile(raw: &Path, w: &str, p: i64, imp: &str) -> Vec<(String, f64)> {
    let mut by_fn: BTreeMap<String, f64> = BTreeMap::new();
    let mut ops = 0.0;
    let want = format!("{w} {p} ");
    let Ok(dir) = std::fs::read_dir(raw.join("cg")) else {
        return Vec::new();
    };
    for e in dir.flatten() {
        if !e.file_name().to_string_lossy().starts_with(&format!("{imp}.out.")) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let trigger = text
            .lines()
            .find_map(|l| l.strip_prefix("desc: Trigger: Client Request: "));
        let Some(n) = trigger
            .and_then(|t| t.strip_prefix(&want))
            .and_then(|n| n.trim().parse::<f64>().ok())
        else {
            continue;
        };
        ops += n;
        let (mut func, mut after_call) = (String::new(), false);
        for l in text.lines() {
            if let Some(f) = l.strip_prefix("fn=") {
                (func, after_call) = (f.to_string(), false);
            } else if l.starts_with("calls=") {
                after_call = true;
            } else if l.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
                // The line after `calls=` is the callee's inclusive cost, not this function's.
                if std::mem::take(&mut after_call) {
                    continue;
                }
                if let Some(cost) = l.split_whitespace().nth(1).and_then(|c| c.parse::<f64>().ok()) {
                    *by_fn.entry(func.clone()).or_default() += cost;
                }
            }
        }
    }
    let mut v: Vec<(String, f64)> = by_fn
        .into_iter()
        .filter(|_| ops > 0.0)
        .map(|(f, c)| (f, c / ops))
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v
}

/// Whether `UVERBS_BENCH_SKIP` names this step.
pub fn skipped() -> bool {
    std::env::var("UVERBS_BENCH_SKIP").is_ok_and(|s| s.split(',').any(|x| x.trim() == SKIP_NAME))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUMMARY: &str = "| workload | per | Ir libmlx5 | Ir Rust | Ir Rust/libmlx5 | ns libmlx5 | ns Rust | ns Rust/libmlx5 | target | met (Ir) | met (ns) |\n\
        |---|---|---:|---:|---:|---:|---:|---:|---|---|---|\n\
        | drain 4096 ready, poll 1 at a time | completion | 195.0 | 136.0 | 0.70 | 36.3 | 22.7 | 0.62 | ≤ 0.7× | yes | yes |\n\
        | drain 4096 ready, poll 16 at a time | completion | 108.8 | 47.5 | 0.44 | 29.6 | 11.9 | 0.40 | ≤ 0.5× | yes | yes |\n\
        | drain 4096 ready, poll 64 at a time | completion | 104.5 | 40.4 | 0.39 | 29.5 | 11.5 | 0.39 | ≤ 0.5× | yes | yes |\n\
        | poll an empty CQ (16 asked) | call | 106.0 | 44.0 | 0.42 | 11.9 | 2.39 | 0.20 | ≤ 0.5× | yes | yes |\n\
        | post_send, 1 WR per call (+ doorbell) | WR | 279.2 | 195.6 | 0.70 | 37.5 | 27.8 | 0.74 | ≤ 0.7× | no | no |\n\
        | post_send, lists of 32 WRs (+ doorbell) | WR | 177.4 | 112.4 | 0.63 | 21.9 | 17.6 | 0.80 | ≤ 0.7× | yes | no |\n\
        \nIr: callgrind instructions ...\n\npost_send, 1 WR per call (+ doorbell), rust: Ir per operation by function (self cost)\n";

    fn run(load_start: &str, load_end: &str) -> doc::Run {
        doc::Run {
            command: "cargo xtask bench --mlx5".into(),
            commit: "abc1234".into(),
            date: "2026-11-28 12:00 UTC".into(),
            keys: [("load_start", load_start), ("load_end", load_end)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn the_doc_part_is_the_first_table_and_the_load() {
        let part = doc_part(SUMMARY, &run("0.40", "1.20")).unwrap();
        assert!(part.starts_with("| workload | per | Ir libmlx5 |"), "{part}");
        assert!(
            !part.contains("Ir per operation by function"),
            "only the first table: {part}"
        );
        assert!(part.ends_with(
            "| yes | no |\n\nGenerated by `cargo xtask bench --mlx5` at abc1234, 2026-11-28 12:00 UTC; CPU unknown; host load average (1 min) 0.40 at the start, 1.20 at the end. The ns columns are native times on a quiet host; the Ir are deterministic.\n"
        ), "{part}");
        let busy = doc_part(SUMMARY, &run("0.40", "2.10")).unwrap();
        assert!(
            busy.contains("0.40 at the start, 2.10 at the end. **The ns columns of this run are not evidence**"),
            "{busy}"
        );
        assert!(doc_part(SUMMARY, &run("?", "0.1")).unwrap().contains("not evidence"));
    }

    #[test]
    fn an_incomplete_table_is_refused() {
        let no_ns = SUMMARY.replace(
            "| 21.9 | 17.6 | 0.80 | ≤ 0.7× | yes | no |",
            "| – | – | – | ≤ 0.7× | yes | ? |",
        );
        assert!(doc_part(&no_ns, &run("0.1", "0.1"))
            .unwrap_err()
            .to_string()
            .contains("without all its figures"));
        let short: String = SUMMARY.lines().take(4).map(|l| format!("{l}\n")).collect();
        assert!(doc_part(&short, &run("0.1", "0.1")).is_err());
    }
}
