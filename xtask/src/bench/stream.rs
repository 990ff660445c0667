//! `cargo xtask bench --stream`: instructions per byte moved, `uverbs::stream` against C
//! rsockets, counted by callgrind in one guest boot (`tests/stream/callgrind.sh`).
//!
//! Builds `examples/rstream_peer` (release) and runs the script in the guest (kernel 6.12
//! unless `UVERBS_GUEST_KERNEL` says otherwise; `UVERBS_GUEST_TIMEOUT` 3000 s unless set):
//! the client of rstream's exchange, the Rust peer or rdma-core's `rstream`, against a C
//! `rstream` server, each under callgrind with two iteration counts per message size. Per
//! size, Ir/byte is the difference of the two totals over the difference of the bytes moved
//! (sent plus received), so set-up and teardown cancel out. The table goes to
//! `target/bench/stream/summary.md` and between the `bench-stream` markers of
//! docs/benchmarks.md; the raw files (totals, dumps, environment) stay in
//! `target/bench/stream/raw/`. In the same boot `tests/stream/bench.sh` times rstream's
//! exchange and round trip for the Rust stream, C rsockets and TCP; that table (TCG times,
//! recorded but not evidence) goes between the `bench-stream-time` markers. `--stream
//! --report` redoes both tables from the raw files.

use super::doc;
use crate::error::{bail, Context, Result};
use crate::proc::{self, sh_quote};
use crate::toolchain::cargo;
use crate::{guest, paths};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

/// The host's 1-minute load average, as recorded (`?` where unreadable).
fn load_1min() -> String {
    doc::load_1min().map_or("?".into(), |l| format!("{l:.2}"))
}

/// The table `tests/stream/bench.sh` prints: throughput and round trip under TCG.
const TIMES_FILE: &str = "times.md";

/// The kernel the stream was measured on (the guest's default otherwise).
const DEFAULT_KERNEL: &str = "6.12";

/// The whole guest run's limit unless `UVERBS_GUEST_TIMEOUT` is set: sixteen client runs under
/// callgrind, the large messages slow under TCG.
const DEFAULT_TIMEOUT_S: &str = "3000";

/// Runs the benchmark (or, with `report_only`, only redoes the table) and updates
/// docs/benchmarks.md.
pub fn run(report_only: bool) -> Result<ExitCode> {
    let out = paths::target_dir().join("bench/stream");
    let raw = out.join("raw");
    if report_only {
        if !raw.join("totals.txt").exists() {
            bail!("no results to report: run `cargo xtask bench --stream` first");
        }
        return report(&out).map(|()| ExitCode::SUCCESS);
    }
    crate::packages::ensure_with(&[("valgrind", "valgrind"), ("rstream", "rdmacm-utils")])?;
    let mut c = cargo();
    c.args(["build", "--release", "-p", "uverbs", "--example", "rstream_peer"]);
    note!("xtask: {}", proc::describe(&c));
    proc::check(&mut c)?;
    let _ = std::fs::remove_dir_all(&raw);
    doc::record_start(&raw, "--stream", &[("load_start", load_1min())])?;
    if std::env::var_os(crate::ENV_KERNEL).is_none() {
        std::env::set_var(crate::ENV_KERNEL, DEFAULT_KERNEL);
    }
    if std::env::var_os(crate::ENV_TIMEOUT).is_none() {
        std::env::set_var(crate::ENV_TIMEOUT, DEFAULT_TIMEOUT_S);
    }
    let script = |name: &str| sh_quote(&paths::root().join("tests/stream").join(name).to_string_lossy());
    // The instructions first, then, in the same boot, the times (TCG: recorded, not evidence).
    let result = guest::run(&guest::Job {
        command: format!(
            "/bin/sh {} && /bin/sh {} > \"$UVERBS_RESULTS/{TIMES_FILE}\"",
            script("callgrind.sh"),
            script("bench.sh")
        ),
        files: Vec::new(),
    })?;
    super::copy_tree(&result.results, &raw)?;
    doc::record_more(&raw, &[("load_end", load_1min())])?;
    if let Some(f) = &result.failure {
        note!("xtask: error: {f}");
    }
    if result.status != Some(0) || result.failure.is_some() {
        note!(
            "xtask: the stream benchmark failed (status {:?}); docs/benchmarks.md not updated; raw files in {}",
            result.status,
            raw.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    report(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// One size's spec: message size, transfers, the two iteration counts.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Spec {
    size: u64,
    count: u64,
    i1: u64,
    i2: u64,
}

/// The specs the script ran (`specs=` of env.txt: `size count i1 i2`, comma-separated).
fn parse_specs(s: &str) -> Result<Vec<Spec>> {
    let mut v = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let n: Vec<u64> = item
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|e| crate::error::Error::msg(format!("spec `{item}`: {e}")))?;
        let [size, count, i1, i2] = n[..] else {
            bail!("spec `{item}`: not `size count i1 i2`");
        };
        if i2 <= i1 || size == 0 || count == 0 {
            bail!("spec `{item}`: needs i2 > i1 and a size and count above 0");
        }
        v.push(Spec { size, count, i1, i2 });
    }
    if v.is_empty() {
        bail!("no specs");
    }
    Ok(v)
}

/// Callgrind totals by (implementation, size, count, iterations), from totals.txt.
type Totals = BTreeMap<(String, u64, u64, u64), f64>;

fn parse_totals(text: &str) -> Result<Totals> {
    let mut t = Totals::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [imp, size, count, iters, total] = f[..] else {
            bail!("totals.txt: `{line}`: not `IMPL SIZE COUNT ITERATIONS TOTAL`");
        };
        let num = |s: &str| s.parse::<u64>().with_context(|| format!("totals.txt: `{line}`"));
        let total: f64 = total.parse().with_context(|| format!("totals.txt: `{line}`"))?;
        t.insert((imp.to_string(), num(size)?, num(count)?, num(iters)?), total);
    }
    Ok(t)
}

/// Ir/byte of `imp` at `spec`: the difference of the two totals over the difference of the
/// bytes moved (each iteration sends and receives `count` messages of `size`).
fn ir_per_byte(totals: &Totals, imp: &str, s: Spec) -> Result<f64> {
    let get = |i: u64| {
        totals
            .get(&(imp.to_string(), s.size, s.count, i))
            .copied()
            .with_context(|| format!("no total for {imp} at {} B x {} x {i}", s.size, s.count))
    };
    let (a, b) = (get(s.i1)?, get(s.i2)?);
    if a <= 0.0 || b <= a {
        bail!(
            "{imp} at {} B x {}: totals {a} ({} iterations) and {b} ({}) do not grow",
            s.size,
            s.count,
            s.i1,
            s.i2
        );
    }
    let bytes = 2 * s.size * s.count * (s.i2 - s.i1);
    Ok((b - a) / bytes as f64)
}

/// The table, every spec's row complete or an error.
fn table(specs: &[Spec], totals: &Totals) -> Result<String> {
    let mut md = String::from(
        "| message | transfers x iterations | Rust stream Ir/byte | C rsockets (rstream) Ir/byte | Rust/C |\n\
         |---|---|---:|---:|---:|\n",
    );
    for &s in specs {
        let (rust, c) = (ir_per_byte(totals, "rust", s)?, ir_per_byte(totals, "c", s)?);
        let _ = writeln!(
            md,
            "| {} B | {} x ({} vs {}) | {rust:.2} | {c:.2} | {:.2} |",
            s.size,
            s.count,
            s.i1,
            s.i2,
            rust / c
        );
    }
    Ok(md)
}

/// The table and its generated line from `raw`.
fn body(raw: &Path) -> Result<String> {
    let env = doc::read_keys(&raw.join("env.txt"));
    let specs = parse_specs(env.get("specs").context("env.txt: no `specs=` line")?)?;
    let path = raw.join("totals.txt");
    let totals = parse_totals(&std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?)?;
    let table = table(&specs, &totals)?;
    let run = doc::Run::read(raw)?;
    let kernel = env.get("guest_kernel").map_or("unknown", String::as_str);
    Ok(format!(
        "{table}\n{}; guest kernel {kernel}. Per size: the difference of the two callgrind totals \
         (all threads of the client) over the difference of the bytes moved; Rust/C from the \
         unrounded figures.\n",
        run.generated()
    ))
}

/// The times table `tests/stream/bench.sh` wrote (its header, then one row per test, each row
/// complete) and its generated line.
fn times_body(raw: &Path) -> Result<String> {
    let path = raw.join(TIMES_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
    let columns = rows.first().map_or(0, |h| h.matches('|').count());
    if rows.len() < 3 || columns == 0 {
        bail!("{}: no table", path.display());
    }
    for row in &rows[2..] {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        if row.matches('|').count() != columns || cells[1..cells.len() - 1].iter().any(|c| c.is_empty()) {
            bail!("{}: incomplete row `{row}`", path.display());
        }
    }
    let run = doc::Run::read(raw)?;
    let env = doc::read_keys(&raw.join("env.txt"));
    let kernel = env.get("guest_kernel").map_or("unknown", String::as_str);
    let load = |k: &str| run.keys.get(k).map_or("?", String::as_str);
    Ok(format!(
        "{}\n\n{}; guest kernel {kernel}, under QEMU TCG, host load average (1 min) {} at the \
         start, {} at the end: the emulated CPU's times, not evidence of native speed.\n",
        rows.join("\n"),
        run.generated(),
        load("load_start"),
        load("load_end")
    ))
}

fn report(out: &Path) -> Result<()> {
    let raw = out.join("raw");
    let body = body(&raw).context("the stream results are incomplete; docs/benchmarks.md not updated")?;
    let times = times_body(&raw).context("the stream times are incomplete; docs/benchmarks.md not updated")?;
    crate::write_atomic(&out.join("summary.md"), format!("{body}\n{times}").as_bytes())?;
    say!("{body}\n{times}");
    doc::write_parts(&[("stream", &body), ("stream-time", &times)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_and_totals_parse() {
        let specs = parse_specs("64 200 5 10,4096 20 5 10").unwrap();
        assert_eq!(
            specs[1],
            Spec {
                size: 4096,
                count: 20,
                i1: 5,
                i2: 10
            }
        );
        assert!(parse_specs("64 200 10 5").is_err(), "i2 must exceed i1");
        assert!(parse_specs("64 200 5").is_err());
        assert!(parse_specs("").is_err());
        let t = parse_totals("rust 64 200 5 1000\nc 64 200 10 2000\n").unwrap();
        assert_eq!(t[&("c".to_string(), 64, 200, 10)], 2000.0);
        assert!(parse_totals("rust 64 200 5\n").is_err(), "a run without a total");
    }

    #[test]
    fn the_table_takes_the_difference_over_the_bytes() {
        let specs = parse_specs("64 200 5 10,1048576 1 2 4").unwrap();
        // 64 B: 2 x 64 x 200 x 5 = 128,000 bytes between the runs.
        let text = "rust 64 200 5 5000000\nrust 64 200 10 6280000\nc 64 200 5 9000000\nc 64 200 10 9640000\n\
                    rust 1048576 1 2 7000000\nrust 1048576 1 4 9097152\nc 1048576 1 2 8000000\nc 1048576 1 4 12194304\n";
        let t = table(&specs, &parse_totals(text).unwrap()).unwrap();
        assert!(t.contains("| 64 B | 200 x (5 vs 10) | 10.00 | 5.00 | 2.00 |"), "{t}");
        // 1 MiB: 2 x 1048576 x 2 = 4,194,304 bytes.
        assert!(t.contains("| 1048576 B | 1 x (2 vs 4) | 0.50 | 1.00 | 0.50 |"), "{t}");
        assert_eq!(t.lines().count(), 4);
    }

    #[test]
    fn incomplete_results_are_refused() {
        let specs = parse_specs("64 200 5 10").unwrap();
        let missing_c = parse_totals("rust 64 200 5 5000000\nrust 64 200 10 6280000\nc 64 200 5 9000000\n").unwrap();
        let e = table(&specs, &missing_c).unwrap_err().to_string();
        assert!(e.contains("no total for c at 64 B x 200 x 10"), "{e}");
        let shrinking = parse_totals("rust 64 200 5 5000000\nrust 64 200 10 0\nc 64 200 5 1\nc 64 200 10 2\n").unwrap();
        assert!(table(&specs, &shrinking).is_err());
    }

    #[test]
    fn the_times_table_is_taken_whole_or_refused() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-stream-times-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("env.txt"), "guest_kernel=6.1.0-56-amd64\n").unwrap();
        std::fs::write(
            dir.join(doc::RUN_FILE),
            "command=cargo xtask bench --stream\ncommit=abc1234\ndate=2026-11-28 12:00 UTC\n",
        )
        .unwrap();
        let header = "| test | size | Rust | C | TCP |\n|---|---|---|---|---|\n";
        std::fs::write(
            dir.join(TIMES_FILE),
            format!("{header}| throughput, MiB/s | 64 B x 2000 x 1 | 0.85 | 1.44 | 2.71 |\n"),
        )
        .unwrap();
        let b = times_body(&dir).unwrap();
        assert!(b.starts_with("| test |") && b.contains("| 0.85 | 1.44 | 2.71 |"), "{b}");
        assert!(b.contains("at abc1234") && b.contains("not evidence"), "{b}");
        std::fs::write(
            dir.join(TIMES_FILE),
            format!("{header}| throughput, MiB/s | 64 B x 2000 x 1 |  | 1.44 | 2.71 |\n"),
        )
        .unwrap();
        assert!(times_body(&dir).is_err(), "a run that printed no figure");
        std::fs::write(dir.join(TIMES_FILE), header).unwrap();
        assert!(times_body(&dir).is_err(), "no rows");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_body_needs_the_runs_record() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-stream-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("env.txt"),
            "guest_kernel=6.12.117+deb12-amd64\nspecs=64 200 5 10\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("totals.txt"),
            "rust 64 200 5 5000000\nrust 64 200 10 6280000\nc 64 200 5 9000000\nc 64 200 10 9640000\n",
        )
        .unwrap();
        assert!(body(&dir).is_err(), "no run.txt");
        std::fs::write(
            dir.join(doc::RUN_FILE),
            "command=cargo xtask bench --stream\ncommit=abc1234\ndate=2026-11-28 12:00 UTC\n",
        )
        .unwrap();
        let b = body(&dir).unwrap();
        assert!(b.contains("| 64 B | 200 x (5 vs 10) | 10.00 | 5.00 | 2.00 |"), "{b}");
        assert!(
            b.contains("Generated by `cargo xtask bench --stream` at abc1234, 2026-11-28 12:00 UTC; guest kernel 6.12.117+deb12-amd64."),
            "{b}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
