//! `cargo xtask bench --cq-copy`: the rxe provider's CQE copies (`providers/rxe/cq.rs`: AVX
//! 32+16-byte moves where the CPU has them, else the plain 48-byte copy), measured natively on
//! a heap ring of 128-byte slots by the ignored unit test
//! `providers::rxe::cq::tests::poll_bench`. No guest, no device.
//!
//! Builds the library's test binary (release) and runs that one test, one copy per process
//! (`UVERBS_POLL_BENCH_KIND`):
//! - natively, pinned to CPU 0 where `taskset` is there, [`PROCESSES`] processes per copy,
//!   the copies alternating (a slow stretch of the host falls on both), [`ROUNDS`] rounds each;
//!   every process prints, per case, the median of its rounds. The table's ns are, per case,
//!   the median of those per-process medians;
//! - under `valgrind --tool=callgrind --collect-atstart=no`, one process per copy with one
//!   round: the test collects around the first round of each case only and dumps it
//!   (`<kind> batch=<b> total=<t>`). Ir per completion is a dump's total over the completions
//!   drained (`total`, the test's ready count); the empty poll's (`total=0`) is per call, over
//!   the same count of calls.
//!
//! A copy the CPU lacks (the test skips AVX where the CPU has none) is a row saying so. The raw
//! files (each process's output, the callgrind dumps, `run.txt`) stay in
//! `target/bench/cq-copy/raw/`; the table goes to `target/bench/cq-copy/summary.md` and between
//! the `bench-cq-copy` markers of docs/benchmarks.md, only when every figure is there.
//! `--cq-copy --report` redoes it from the raw files.

use super::doc;
use crate::error::{bail, Context, Result};
use crate::toolchain::cargo;
use crate::{json, paths, proc};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

/// The test, by its full name in the library's test binary.
const TEST: &str = "providers::rxe::cq::tests::poll_bench";

/// The copies (`UVERBS_POLL_BENCH_KIND`), their rows' names, and whether the CPU may lack
/// them (the test then measures nothing for them).
const KINDS: [(&str, &str, Option<&str>); 2] = [
    ("avx", "AVX 32+16-byte moves (kept)", Some("AVX")),
    ("baseline", "plain 48-byte copy (kept without AVX)", None),
];

/// The drain's batch sizes, in the table's order, and the empty poll's.
const BATCHES: [u32; 3] = [1, 16, 64];
const EMPTY_BATCH: u32 = 16;

/// Native processes per copy, and rounds per process.
const PROCESSES: usize = 9;
const ROUNDS: usize = 201;

/// Rounds of a callgrind process: only the first is collected.
const CG_ROUNDS: usize = 1;

/// The host's 1-minute load average, as recorded (`?` where unreadable).
fn load_1min() -> String {
    doc::load_1min().map_or("?".into(), |l| format!("{l:.2}"))
}

/// The native process's file of copy `kind`, run `i`.
fn native_file(raw: &Path, kind: &str, i: usize) -> PathBuf {
    raw.join("native").join(format!("{kind}-{i}.txt"))
}

/// The callgrind output file of copy `kind` (its dumps: this name with `.1`, `.2`, ...).
fn cg_file(raw: &Path, kind: &str) -> PathBuf {
    raw.join("cg").join(format!("{kind}.out"))
}

/// Runs the benchmark (or, with `report_only`, only redoes the table) and updates
/// docs/benchmarks.md.
pub fn run(report_only: bool) -> Result<ExitCode> {
    let out = paths::target_dir().join("bench/cq-copy");
    let raw = out.join("raw");
    if report_only {
        if !raw.join(doc::RUN_FILE).exists() {
            bail!("no results to report: run `cargo xtask bench --cq-copy` first");
        }
        return report(&out).map(|()| ExitCode::SUCCESS);
    }
    if proc::find_program("valgrind").is_none() {
        bail!("valgrind is missing: apt-get install -y --no-install-recommends valgrind");
    }
    let mut c = cargo();
    c.args([
        "test",
        "--release",
        "-p",
        "uverbs",
        "--lib",
        "--no-run",
        "--message-format=json",
    ]);
    let what = proc::describe(&c);
    let bin = json::cargo_executables(&mut c)?
        .into_iter()
        .find(|e| e.name == "uverbs" && e.is("lib"))
        .map(|e| PathBuf::from(e.path))
        .with_context(|| format!("`{what}` named no executable for the library's tests"))?;
    let _ = std::fs::remove_dir_all(&raw);
    for d in ["native", "cg"] {
        std::fs::create_dir_all(raw.join(d)).with_context(|| format!("creating {}", raw.join(d).display()))?;
    }
    let taskset = proc::find_program("taskset");
    let pinned = if taskset.is_some() { "CPU 0" } else { "no" };
    doc::record_start(
        &raw,
        "--cq-copy",
        &[
            ("load_start", load_1min()),
            ("cpu", doc::cpu_model()),
            ("pinned", pinned.into()),
            ("processes", PROCESSES.to_string()),
            ("rounds", ROUNDS.to_string()),
        ],
    )?;
    // The test's arguments and knobs, after the binary.
    let test = |cmd: &mut Command, kind: &str, rounds: usize| {
        cmd.args([TEST, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("UVERBS_POLL_BENCH_KIND", kind)
            .env("UVERBS_POLL_BENCH_ROUNDS", rounds.to_string())
            .stderr(Stdio::inherit());
    };
    let mut ok = true;
    // The copies the CPU lacks: a process that passed without a line for its copy.
    let mut absent: Vec<&str> = Vec::new();
    for i in 0..PROCESSES {
        for (kind, _, may_lack) in KINDS {
            if absent.contains(&kind) {
                continue;
            }
            let mut cmd = match &taskset {
                Some(t) => {
                    let mut c = Command::new(t);
                    c.args(["-c", "0"]).arg(&bin);
                    c
                }
                None => Command::new(&bin),
            };
            test(&mut cmd, kind, ROUNDS);
            note!("xtask: bench cq-copy: {kind} {}: {}", i + 1, proc::describe(&cmd));
            let o = cmd.output().with_context(|| format!("running {}", bin.display()))?;
            crate::write_atomic(&native_file(&raw, kind, i), &o.stdout)?;
            let text = String::from_utf8_lossy(&o.stdout);
            if !o.status.success() {
                note!("xtask: bench cq-copy: the {kind} process failed ({})", o.status);
                ok = false;
            } else if may_lack.is_some() && parse_native(&text).keys().all(|k| k.0 != kind) {
                note!("xtask: bench cq-copy: this CPU has no {kind}: its row says so");
                absent.push(kind);
            }
        }
    }
    for (kind, ..) in KINDS.iter().filter(|k| !absent.contains(&k.0)) {
        let mut cmd = Command::new("valgrind");
        cmd.args(["--tool=callgrind", "--collect-atstart=no"])
            .arg(format!("--callgrind-out-file={}", cg_file(&raw, kind).display()))
            .arg(&bin);
        test(&mut cmd, kind, CG_ROUNDS);
        note!("xtask: bench cq-copy: {}", proc::describe(&cmd));
        let o = cmd
            .output()
            .with_context(|| format!("running valgrind on {}", bin.display()))?;
        crate::write_atomic(&raw.join("cg").join(format!("{kind}.stdout")), &o.stdout)?;
        if !o.status.success() {
            note!(
                "xtask: bench cq-copy: callgrind on the {kind} copy failed ({})",
                o.status
            );
            ok = false;
        }
    }
    doc::record_more(&raw, &[("load_end", load_1min()), ("absent", absent.join(","))])?;
    if !ok {
        note!(
            "xtask: the CQE copy benchmark failed; docs/benchmarks.md not updated; raw files in {}",
            raw.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    report(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// A case of the test: copy, batch, and whether it is the empty poll.
type Case = (String, u32, bool);

/// The medians one process printed, by case: lines `poll_bench <kind> batch <b> <what> ns
/// median <x> (p10 ..., p90 ...)`, `<what>` naming the empty poll or not. The first may follow
/// the test harness's `test <name> ... ` on the same line.
fn parse_native(text: &str) -> BTreeMap<Case, f64> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = t.windows(3).position(|w| w[0] == "poll_bench" && w[2] == "batch") else {
            continue;
        };
        let t = &t[at..];
        let (Some(kind), Some(batch), Some(median)) = (t.get(1), t.get(3), t.iter().position(|w| *w == "median"))
        else {
            continue;
        };
        let (Ok(batch), Some(Ok(ns))) = (batch.parse::<u32>(), t.get(median + 1).map(|v| v.parse::<f64>())) else {
            continue;
        };
        let empty = t[4..median].contains(&"empty");
        m.insert((kind.to_string(), batch, empty), ns);
    }
    m
}

/// A callgrind dump's name and total: its trigger (`<kind> batch=<b> total=<t>` from the
/// test's `dump_stats_at`) and its `totals:` (or `summary:`) line. `None` for another dump
/// (the one at program termination).
fn parse_dump(text: &str) -> Option<((String, u32, u64), f64)> {
    let trigger = text
        .lines()
        .find_map(|l| l.strip_prefix("desc: Trigger: Client Request: "))?;
    let ir = text
        .lines()
        .find_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))?
        .split_whitespace()
        .next()?
        .parse::<f64>()
        .ok()?;
    let [kind, batch, total] = trigger.split_whitespace().collect::<Vec<_>>()[..] else {
        return None;
    };
    let batch = batch.strip_prefix("batch=")?.parse().ok()?;
    let total = total.strip_prefix("total=")?.parse().ok()?;
    Some(((kind.to_string(), batch, total), ir))
}

/// The dumps of copy `kind` in `raw/cg`: Ir by (batch, total).
fn read_dumps(raw: &Path, kind: &str) -> BTreeMap<(u32, u64), f64> {
    let mut m = BTreeMap::new();
    let prefix = format!("{kind}.out");
    let Ok(dir) = std::fs::read_dir(raw.join("cg")) else {
        return m;
    };
    for e in dir.flatten() {
        if !e.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        if let Some(((k, batch, total), ir)) = parse_dump(&text) {
            if k == kind {
                m.insert((batch, total), ir);
            }
        }
    }
    m
}

/// One measured copy's figures.
#[derive(Debug, PartialEq)]
struct Figures {
    /// Ir per completion at each of [`BATCHES`], and per empty call.
    ir: [f64; 3],
    ir_empty: f64,
    /// ns per completion at each of [`BATCHES`]: the median of the processes' medians.
    ns: [f64; 3],
    /// Each process's medians at [`BATCHES`] (for the summary).
    per_process: Vec<[f64; 3]>,
}

/// The median of `v` (the mean of the middle two for an even count); `None` when empty.
fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Copy `kind`'s figures from its dumps and its processes' outputs; fails unless every
/// figure is there (each of `processes` printed all its cases).
fn figures(kind: &str, dumps: &BTreeMap<(u32, u64), f64>, outputs: &[String], processes: usize) -> Result<Figures> {
    // The completions of a drain: the test's ready count, the same in every drain case.
    let totals: Vec<u64> = dumps.keys().map(|&(_, t)| t).filter(|&t| t > 0).collect();
    let Some(&ready) = totals.first() else {
        bail!("{kind}: no callgrind dump of a drain");
    };
    if totals.iter().any(|&t| t != ready) {
        bail!("{kind}: the drains' dumps have different totals: {totals:?}");
    }
    let mut ir = [0.0; 3];
    for (i, &b) in BATCHES.iter().enumerate() {
        let n = dumps
            .get(&(b, ready))
            .with_context(|| format!("{kind}: no callgrind dump `batch={b} total={ready}`"))?;
        ir[i] = n / ready as f64;
    }
    let empty = dumps
        .get(&(EMPTY_BATCH, 0))
        .with_context(|| format!("{kind}: no callgrind dump `batch={EMPTY_BATCH} total=0`"))?;
    if outputs.len() != processes {
        bail!("{kind}: {} native processes' outputs, not {processes}", outputs.len());
    }
    let mut per_process = Vec::new();
    for (p, text) in outputs.iter().enumerate() {
        let m = parse_native(text);
        let mut row = [0.0; 3];
        for (i, &b) in BATCHES.iter().enumerate() {
            row[i] = *m
                .get(&(kind.to_string(), b, false))
                .with_context(|| format!("{kind}: process {} printed no median at batch {b}", p + 1))?;
        }
        per_process.push(row);
    }
    let mut ns = [0.0; 3];
    for (i, n) in ns.iter_mut().enumerate() {
        let mut v: Vec<f64> = per_process.iter().map(|r| r[i]).collect();
        *n = median(&mut v).context("no native process")?;
    }
    Ok(Figures {
        ir,
        ir_empty: empty / ready as f64,
        ns,
        per_process,
    })
}

/// Nanoseconds to two significant digits (the form docs/benchmarks.md shows them in).
fn fmt_ns(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.0}")
    } else if x >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// The table: a row per copy, measured (`Some`) or lacked by the CPU (`None`, with the
/// feature's name).
fn table(rows: &[(&str, Result<Figures, &str>)]) -> String {
    let mut md = String::from(
        "| copy | Ir/completion at 1 / 16 / 64 | Ir, empty call | ns/completion at 1 / 16 / 64 |\n\
         |---|---|---:|---|\n",
    );
    for (name, r) in rows {
        match r {
            Ok(f) => {
                let ir: Vec<String> = f.ir.iter().map(|x| format!("{x:.1}")).collect();
                let ns: Vec<String> = f.ns.iter().map(|&x| fmt_ns(x)).collect();
                let _ = writeln!(
                    md,
                    "| {name} | {} | {:.1} | {} |",
                    ir.join(" / "),
                    f.ir_empty,
                    ns.join(" / ")
                );
            }
            Err(feature) => {
                let _ = writeln!(md, "| {name} | not measured: this CPU has no {feature} | – | – |");
            }
        }
    }
    md
}

/// The generated line under the table: the run, the CPU, the host's load (the ns are said not
/// to be evidence when it was above the mlx5 table's threshold at either end), and what the
/// figures are.
fn generated_line(run: &doc::Run) -> String {
    let key = |k: &str| run.keys.get(k).cloned().unwrap_or_else(|| "?".into());
    let (start, end) = (key("load_start"), key("load_end"));
    let busy = [&start, &end]
        .iter()
        .any(|l| l.parse::<f64>().map_or(true, |l| l > super::mlx5::QUIET_LOAD));
    let verdict = if busy {
        format!(
            "**The ns of this run are not evidence**: the load average was above {} (or unknown) at its start or end; the Ir are deterministic.",
            super::mlx5::QUIET_LOAD
        )
    } else {
        "The ns are native times on a quiet host; the Ir are deterministic.".to_string()
    };
    let pinned = match key("pinned").as_str() {
        "no" => "unpinned".to_string(),
        p => format!("pinned to {p}"),
    };
    format!(
        "{}; CPU {}; host load average (1 min) {start} at the start, {end} at the end. {verdict} \
         Ir: callgrind's count of each case's first round, one process per copy, over the \
         completions it drained (the empty poll: over its calls, as many as the drains' \
         completions). ns: {} processes per copy, the copies alternating, {pinned}; each \
         process takes the median of its {} rounds, and the table shows the median of those \
         medians.\n",
        run.generated(),
        key("cpu"),
        key("processes"),
        key("rounds"),
    )
}

/// The part and the summary from `raw`: fails unless every measured copy has all its figures
/// and the run recorded itself.
fn body(raw: &Path) -> Result<(String, String)> {
    let run = doc::Run::read(raw)?;
    let absent: Vec<&str> = run
        .keys
        .get("absent")
        .map(|a| a.split(',').filter(|k| !k.is_empty()).collect())
        .unwrap_or_default();
    let processes: usize = run
        .keys
        .get("processes")
        .and_then(|p| p.parse().ok())
        .context("run.txt: no `processes=` line")?;
    let mut rows = Vec::new();
    for (kind, name, may_lack) in KINDS {
        let r = match (may_lack, absent.contains(&kind)) {
            (Some(feature), true) => Err(feature),
            (None, true) => bail!("the {kind} copy measured nothing"),
            (_, false) => {
                let mut outputs = Vec::new();
                for i in 0..processes {
                    if let Ok(t) = std::fs::read_to_string(native_file(raw, kind, i)) {
                        outputs.push(t);
                    }
                }
                Ok(figures(kind, &read_dumps(raw, kind), &outputs, processes)?)
            }
        };
        rows.push((name, r));
    }
    let part = format!("{}\n{}", table(&rows), generated_line(&run));
    let mut summary = part.clone();
    for (name, r) in &rows {
        if let Ok(f) = r {
            let _ = writeln!(
                summary,
                "\n{name}: each process's median ns/completion at 1 / 16 / 64\n"
            );
            for p in &f.per_process {
                let v: Vec<String> = p.iter().map(|x| format!("{x:.3}")).collect();
                let _ = writeln!(summary, "    {}", v.join(" / "));
            }
        }
    }
    Ok((part, summary))
}

fn report(out: &Path) -> Result<()> {
    let (part, summary) =
        body(&out.join("raw")).context("the CQE copy results are incomplete; docs/benchmarks.md not updated")?;
    crate::write_atomic(&out.join("summary.md"), summary.as_bytes())?;
    say!("{summary}");
    doc::write_parts(&[("cq-copy", &part)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What one native process prints for copy `kind` (ns at 1, 16, 64 and the empty poll).
    fn native(kind: &str, ns: [f64; 4]) -> String {
        // The first line follows the harness's own, as `--test-threads=1` prints it.
        let mut s = String::from("\nrunning 1 test\ntest providers::rxe::cq::tests::poll_bench ... ");
        for (i, (b, what)) in [
            (1, "per completion"),
            (16, "per completion"),
            (64, "per completion"),
            (16, "empty poll, per call"),
        ]
        .into_iter()
        .enumerate()
        {
            s.push_str(&format!(
                "poll_bench {kind:12} batch {b:2} {what:22} ns median {:.3} (p10 0.500, p90 3.000)\n",
                ns[i]
            ));
        }
        s.push_str("ok\n");
        s
    }

    /// A callgrind dump of `total` at `batch` with `ir` instructions.
    fn dump(kind: &str, batch: u32, total: u64, ir: u64) -> String {
        format!(
            "# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\npid: 42\ncmd: uverbs-1a2b\npart: 1\n\n\
             desc: I1 cache: \ndesc: Timerange: Basic block 1 - 2\ndesc: Trigger: Client Request: {kind} batch={batch} total={total}\n\n\
             positions: line\nevents: Ir\nsummary: {ir}\n\nfn=drain\n0 {ir}\n\ntotals: {ir}\n"
        )
    }

    fn dumps(kind: &str, ir: [u64; 4]) -> BTreeMap<(u32, u64), f64> {
        let mut m = BTreeMap::new();
        for ((b, t), ir) in [(1, 4096), (16, 4096), (64, 4096), (16, 0)].into_iter().zip(ir) {
            let ((k, b, t), n) = parse_dump(&dump(kind, b, t, ir)).unwrap();
            assert_eq!(k, kind);
            m.insert((b, t), n);
        }
        m
    }

    #[test]
    fn process_output_and_dumps_parse() {
        let m = parse_native(&native("avx", [2.0, 0.72, 0.68, 7.5]));
        assert_eq!(m.len(), 4);
        assert_eq!(m[&("avx".to_string(), 16, false)], 0.72);
        assert_eq!(m[&("avx".to_string(), 16, true)], 7.5);
        assert!(parse_native("running 1 test\ntest result: ok\n").is_empty());
        let (key, ir) = parse_dump(&dump("baseline", 64, 4096, 32768)).unwrap();
        assert_eq!(key, ("baseline".to_string(), 64, 4096));
        assert_eq!(ir, 32768.0);
        // The dump at program termination is no case.
        let end = "desc: Trigger: Program termination\ntotals: 123\n";
        assert!(parse_dump(end).is_none());
        assert!(parse_dump("desc: Trigger: Client Request: avx batch=1 total=4096\n").is_none());
    }

    #[test]
    fn figures_are_per_completion_and_medians_of_the_process_medians() {
        let outputs: Vec<String> = [1.9, 2.0, 2.4]
            .iter()
            .map(|&x| native("avx", [x, x / 2.0, x / 4.0, 9.0]))
            .collect();
        let f = figures("avx", &dumps("avx", [159744, 37683, 24986, 69632]), &outputs, 3).unwrap();
        assert_eq!(f.ir, [39.0, 37683.0 / 4096.0, 24986.0 / 4096.0]);
        assert_eq!(f.ir_empty, 17.0);
        assert_eq!(f.ns, [2.0, 1.0, 0.5]);
        let t = table(&[
            ("AVX 32+16-byte moves (kept)", Ok(f)),
            ("plain 48-byte copy (kept without AVX)", Err("AVX")),
        ]);
        assert!(
            t.contains("| AVX 32+16-byte moves (kept) | 39.0 / 9.2 / 6.1 | 17.0 | 2.0 / 1.0 / 0.50 |"),
            "{t}"
        );
        assert!(t.contains("| not measured: this CPU has no AVX | – | – |"), "{t}");
        assert_eq!(t.lines().count(), 4);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn incomplete_results_are_refused() {
        let full = dumps("avx", [159744, 37683, 24986, 69632]);
        let outputs = vec![native("avx", [2.0, 0.7, 0.6, 9.0]); 3];
        assert!(figures("avx", &full, &outputs, 3).is_ok());
        let mut no_empty = full.clone();
        no_empty.remove(&(16, 0));
        let e = figures("avx", &no_empty, &outputs, 3).unwrap_err().to_string();
        assert!(e.contains("batch=16 total=0"), "{e}");
        let mut no_64 = full.clone();
        no_64.remove(&(64, 4096));
        assert!(figures("avx", &no_64, &outputs, 3).is_err());
        assert!(figures("avx", &BTreeMap::new(), &outputs, 3).is_err());
        assert!(figures("avx", &full, &outputs[..2], 3).is_err(), "a process missing");
        let mut cut = outputs.clone();
        cut[1] = cut[1].lines().take(4).collect::<Vec<_>>().join("\n");
        let e = figures("avx", &full, &cut, 3).unwrap_err().to_string();
        assert!(e.contains("process 2 printed no median at batch 64"), "{e}");
        assert!(
            figures("baseline", &full, &outputs, 3).is_err(),
            "another copy's lines are not this one's"
        );
    }

    fn run(load_start: &str, load_end: &str) -> doc::Run {
        doc::Run {
            command: "cargo xtask bench --cq-copy".into(),
            commit: "abc1234".into(),
            date: "2026-11-28 12:00 UTC".into(),
            keys: [
                ("load_start", load_start),
                ("load_end", load_end),
                ("cpu", "Intel(R) Xeon(R) Processor"),
                ("pinned", "CPU 0"),
                ("processes", "9"),
                ("rounds", "201"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        }
    }

    #[test]
    fn the_generated_line_names_the_run_the_cpu_and_the_load() {
        let quiet = generated_line(&run("0.40", "1.20"));
        assert!(
            quiet.starts_with(
                "Generated by `cargo xtask bench --cq-copy` at abc1234, 2026-11-28 12:00 UTC; CPU Intel(R) Xeon(R) Processor; host load average (1 min) 0.40 at the start, 1.20 at the end. The ns are native times on a quiet host"
            ),
            "{quiet}"
        );
        assert!(
            quiet.contains("9 processes per copy") && quiet.contains("its 201 rounds"),
            "{quiet}"
        );
        assert!(quiet.contains("pinned to CPU 0"), "{quiet}");
        let busy = generated_line(&run("0.40", "2.10"));
        assert!(busy.contains("**The ns of this run are not evidence**"), "{busy}");
        assert!(generated_line(&run("?", "0.1")).contains("not evidence"));
    }

    #[test]
    fn the_body_comes_from_the_raw_files_or_is_refused() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-cq-copy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("native")).unwrap();
        std::fs::create_dir_all(dir.join("cg")).unwrap();
        for (b, t, ir, n) in [
            (1, 4096, 163840, 1),
            (16, 4096, 45056, 2),
            (64, 4096, 32768, 3),
            (16, 0, 69632, 4),
        ] {
            std::fs::write(
                cg_file(&dir, "baseline").with_extension(format!("out.{n}")),
                dump("baseline", b, t, ir),
            )
            .unwrap();
        }
        std::fs::write(
            cg_file(&dir, "baseline"),
            "desc: Trigger: Program termination\ntotals: 0\n",
        )
        .unwrap();
        for i in 0..2 {
            std::fs::write(
                native_file(&dir, "baseline", i),
                native("baseline", [1.9, 0.89, 0.84, 9.0]),
            )
            .unwrap();
        }
        let record = "command=cargo xtask bench --cq-copy\ncommit=abc1234\ndate=2026-11-28 12:00 UTC\nload_start=3.00\ncpu=Some CPU\npinned=CPU 0\nprocesses=2\nrounds=201\nload_end=2.50\n";
        std::fs::write(dir.join(doc::RUN_FILE), record).unwrap();
        let e = body(&dir).unwrap_err().to_string();
        assert!(
            e.contains("avx: no callgrind dump"),
            "AVX neither measured nor absent: {e}"
        );
        std::fs::write(dir.join(doc::RUN_FILE), format!("{record}absent=avx\n")).unwrap();
        let (part, summary) = body(&dir).unwrap();
        assert!(part.starts_with("| copy | Ir/completion at 1 / 16 / 64 |"), "{part}");
        assert!(
            part.contains("| AVX 32+16-byte moves (kept) | not measured: this CPU has no AVX | – | – |"),
            "{part}"
        );
        assert!(
            part.contains("| plain 48-byte copy (kept without AVX) | 40.0 / 11.0 / 8.0 | 17.0 | 1.9 / 0.89 / 0.84 |"),
            "{part}"
        );
        assert!(part.contains("CPU Some CPU; host load average (1 min) 3.00 at the start, 2.50 at the end. **The ns of this run are not evidence**"), "{part}");
        assert!(summary.contains("    1.900 / 0.890 / 0.840\n"), "{summary}");
        std::fs::write(dir.join(doc::RUN_FILE), format!("{record}absent=baseline\n")).unwrap();
        assert!(body(&dir).is_err(), "the baseline is never lacked");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
