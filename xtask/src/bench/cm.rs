//! `cargo xtask bench --cm`: connection setup, the Rust `cmatose` example (uverbs::cm) against
//! rdma-core's C `ucmatose` (librdmacm), in one guest boot (`benches/cm.sh`).
//!
//! Each implementation runs as server and client of itself with N connections and no
//! messages, for two values of N, once with both sides under `strace -f -c` and once under
//! callgrind. The figures per connection are the differences between the two runs divided by
//! the difference in N, so that each program's start-up (loading libraries, opening the
//! device) cancels out. The table goes to `target/bench/cm/summary.md` and replaces the part
//! of docs/benchmarks.md between its `bench-cm` markers; the raw files stay in
//! `target/bench/cm/raw/`. `--cm --report` redoes the table from them.

use crate::error::{bail, Context, Result};
use crate::proc::{self, sh_quote};
use crate::toolchain::cargo;
use crate::{guest, paths};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

/// Runs the benchmark (or, with `report_only`, only redoes the table) and updates
/// docs/benchmarks.md.
pub fn run(report_only: bool) -> Result<ExitCode> {
    let out = paths::target_dir().join("bench/cm");
    let raw = out.join("raw");
    if report_only {
        if !raw.join("env.txt").exists() {
            bail!("no results to report: run `cargo xtask bench --cm` first");
        }
        return report(&out).map(|()| ExitCode::SUCCESS);
    }
    let tools = [
        ("valgrind", "valgrind"),
        ("strace", "strace"),
        ("ucmatose", "rdmacm-utils"),
    ];
    crate::packages::ensure_with(&tools)?;
    let mut c = cargo();
    c.args(["build", "--release", "--example", "cmatose"]);
    note!("xtask: {}", proc::describe(&c));
    proc::check(&mut c)?;
    let rust = paths::target_dir().join("release/examples/cmatose");
    let _ = std::fs::remove_dir_all(&raw);
    std::fs::create_dir_all(&raw).with_context(|| format!("creating {}", raw.display()))?;
    let script = paths::root().join("benches/cm.sh");
    let command = format!(
        "/bin/sh {} {}",
        sh_quote(&script.to_string_lossy()),
        sh_quote(&rust.to_string_lossy())
    );
    let result = guest::run(&guest::Job {
        command,
        files: Vec::new(),
    })?;
    super::copy_tree(&result.results, &raw)?;
    if let Some(f) = &result.failure {
        note!("xtask: error: {f}");
    }
    if result.status != Some(0) {
        note!(
            "xtask: the connection benchmark failed (status {:?}); see {}",
            result.status,
            raw.join("log.txt").display()
        );
        return Ok(ExitCode::FAILURE);
    }
    report(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// One side's counts at one N.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Counts {
    /// User-space instructions (callgrind's `Ir`).
    ir: f64,
    /// `write(2)` calls: the rdma_cm commands and the uverbs write commands (plus a
    /// program's own output, the same at every N).
    write: f64,
    /// `ioctl(2)` calls: the uverbs ioctl commands.
    ioctl: f64,
    /// Every system call.
    all: f64,
}

/// `(implementation, role)` → N → counts, from the raw files.
type Results = BTreeMap<(String, String), BTreeMap<u32, Counts>>;

fn read_results(raw: &Path) -> Result<Results> {
    let mut results = Results::new();
    for e in std::fs::read_dir(raw).with_context(|| format!("reading {}", raw.display()))? {
        let e = e.with_context(|| format!("reading {}", raw.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let parts: Vec<&str> = name.split('.').collect();
        let [kind, imp, role, n] = parts[..] else {
            continue;
        };
        let Ok(n) = n.parse::<u32>() else { continue };
        let text = std::fs::read_to_string(e.path()).with_context(|| format!("reading {name}"))?;
        let entry = results
            .entry((imp.to_string(), role.to_string()))
            .or_default()
            .entry(n)
            .or_default();
        match kind {
            "cg" => entry.ir = callgrind_total(&text).with_context(|| format!("{name}: no total"))?,
            "strace" => {
                let calls = strace_calls(&text);
                entry.write = calls.get("write").copied().unwrap_or(0.0);
                entry.ioctl = calls.get("ioctl").copied().unwrap_or(0.0);
                entry.all = calls.get("total").copied().unwrap_or(0.0);
            }
            _ => {}
        }
    }
    Ok(results)
}

/// The instruction total of a callgrind dump (its `totals:` or `summary:` line).
fn callgrind_total(text: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))
        .filter_map(|v| v.split_whitespace().next()?.parse().ok())
        .next_back()
}

/// Calls per system call from `strace -c`'s table (`total` for the sum).
fn strace_calls(text: &str) -> BTreeMap<String, f64> {
    let mut calls = BTreeMap::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors], syscall (the total line too).
        if words.len() < 5 || words[0].parse::<f64>().is_err() {
            continue;
        }
        let Some(name) = words.last() else { continue };
        let number = words[3];
        if let Ok(n) = number.parse::<f64>() {
            calls.insert(name.to_string(), n);
        }
    }
    calls
}

/// The table: per connection for each implementation and role, from the two smallest and
/// largest N.
fn table(results: &Results) -> Result<String> {
    let mut s = String::new();
    let mut ns = Vec::new();
    for ((imp, role), by_n) in results {
        let (Some((&n1, a)), Some((&n2, b))) = (by_n.first_key_value(), by_n.last_key_value()) else {
            continue;
        };
        if n1 == n2 {
            bail!("{imp} {role}: one connection count only ({n1}); the figures need two");
        }
        ns = vec![n1, n2];
        let per = |x: f64, y: f64| (y - x) / f64::from(n2 - n1);
        let _ = writeln!(
            s,
            "| {role} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} M |",
            if imp == "c" {
                "C `ucmatose` (librdmacm)"
            } else {
                "Rust `cmatose` (uverbs::cm)"
            },
            per(a.ir, b.ir),
            per(a.write, b.write) + per(a.ioctl, b.ioctl),
            per(a.write, b.write),
            per(a.ioctl, b.ioctl),
            per(a.all, b.all),
            b.ir / 1e6,
        );
    }
    if ns.is_empty() {
        bail!("no results");
    }
    Ok(format!(
        "Per connection, from N = {} and N = {} (the difference over {} connections); the last \
         column is the whole run at N = {}, start-up included.\n\n\
         | side | implementation | Ir/conn | kernel commands/conn | write/conn | ioctl/conn | system calls/conn | Ir at N = {} |\n\
         |---|---|---:|---:|---:|---:|---:|---:|\n{s}",
        ns[0],
        ns[1],
        ns[1] - ns[0],
        ns[1],
        ns[1]
    ))
}

fn report(out: &Path) -> Result<()> {
    let raw = out.join("raw");
    let results = read_results(&raw)?;
    let env = std::fs::read_to_string(raw.join("env.txt")).unwrap_or_default();
    let env: Vec<&str> = env.lines().collect();
    let body = format!(
        "{}\nMeasured in one guest boot ({}).\n",
        table(&results)?,
        env.join(", ")
    );
    std::fs::write(out.join("summary.md"), &body).context("writing summary.md")?;
    note!("{body}");
    super::doc::write_parts(&[("cm", &body)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strace_and_callgrind_totals_parse() {
        let st = "% time     seconds  usecs/call     calls    errors syscall\n\
                  ------ ----------- ----------- --------- --------- ----------------\n \
                  52.00    0.000520           5       100           write\n \
                  10.00    0.000100           2        50         3 ioctl\n\
                  ------ ----------- ----------- --------- --------- ----------------\n\
                  100.00    0.001000           6       170           total\n";
        let calls = strace_calls(st);
        assert_eq!((calls["write"], calls["ioctl"], calls["total"]), (100.0, 50.0, 170.0));
        assert_eq!(
            callgrind_total("events: Ir\nsummary: 1234\nfn=x\ntotals: 1234\n"),
            Some(1234.0)
        );
    }

    #[test]
    fn the_table_takes_differences_per_connection() {
        let mut r = Results::new();
        let c = |ir, write, ioctl, all| Counts { ir, write, ioctl, all };
        let by_n = BTreeMap::from([(10, c(1e6, 20.0, 10.0, 100.0)), (50, c(5e6, 100.0, 50.0, 500.0))]);
        r.insert(("rust".into(), "server".into()), by_n);
        let t = table(&r).unwrap();
        assert!(
            t.contains("| server | Rust `cmatose` (uverbs::cm) | 100000 | 3.0 | 2.0 | 1.0 | 10.0 | 5.00 M |"),
            "{t}"
        );
    }
}
