//! Runs a shell command inside a QEMU guest that has a real `rdma_rxe` device:
//! prepares packages, kernel and initramfs, writes the per-run scripts into a
//! results directory shared with the guest, boots, and reads the results back.

use crate::error::{bail, Context, Result};
use crate::proc::sh_quote;
use crate::qemu::{self, End, Machine};
use crate::{env_number, paths, ENV_KVM, ENV_TIMEOUT};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Body of guest.sh (rxe setup, then the command), after a generated header.
const RUN_SH: &str = include_str!("../guest/run.sh");

/// Lines of the kernel log shown when something goes wrong.
const LOG_TAIL: usize = 30;

/// What to run in a guest.
pub struct Job {
    /// Shell command, run through `/bin/sh -c` in the project root.
    pub command: String,
    /// Extra files written into the results directory before boot (name, contents).
    pub files: Vec<(String, String)>,
}

/// What came back from a guest whose command started.
pub struct Report {
    /// The results directory (on the host and, at the same path, in the guest).
    pub results: PathBuf,
    /// The command's exit status, unless the guest died or timed out first.
    pub status: Option<i32>,
    /// Why there is no status.
    pub failure: Option<String>,
}

impl Report {
    /// Reads a file the command wrote into the results directory.
    pub fn read(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.results.join(name)).ok()
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.results);
    }
}

/// The directory under the target dir where the guest's files are cached.
pub fn cache_dir() -> PathBuf {
    paths::target_dir().join("guest")
}

/// Where the QEMU run writes the kernel log (ttyS1).
pub fn kernel_log() -> PathBuf {
    cache_dir().join("kernel.log")
}

/// The results directory of this xtask process (same path in the guest).
fn results_dir() -> PathBuf {
    cache_dir().join(format!("run-{}", std::process::id()))
}

/// Boots a guest and runs `job`. Fails if the guest never got to start the
/// command (boot, module or device failure), with the reason and the kernel log.
pub fn run(job: &Job) -> Result<Report> {
    crate::packages::ensure()?;
    let cache = cache_dir();
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    remove_stale_runs(&cache);
    let kernel = crate::kernel::prepare(&cache)?;
    let initramfs = crate::initramfs::prepare(&kernel, &cache)?;
    let siw = crate::siw_module::prepare_or_note(&kernel, &cache);

    let results = results_dir();
    let _ = std::fs::remove_dir_all(&results);
    std::fs::create_dir_all(&results).with_context(|| format!("creating {}", results.display()))?;
    // From here on, the Report's Drop removes the results directory.
    let mut report = Report {
        results: results.clone(),
        status: None,
        failure: None,
    };
    let script = format!(
        "{}{}{}{RUN_SH}",
        header(&results, &job.command),
        crate::siw_module::header_line(siw.as_deref()),
        crate::siw_module::GUEST_SH
    );
    crate::write_atomic(&results.join("guest.sh"), script.as_bytes())?;
    for (name, contents) in &job.files {
        crate::write_atomic(&results.join(name), contents.as_bytes())?;
    }

    let machine = Machine {
        kvm: std::env::var(ENV_KVM).is_ok_and(|v| v == "1"),
        mem_mib: env_number("UVERBS_GUEST_MEM_MIB", 2048)?,
        cpus: env_number("UVERBS_GUEST_CPUS", 2)?,
        timeout: Duration::from_secs(env_number(ENV_TIMEOUT, 1200u64)?),
    };
    // Written inside the results directory so that concurrent runs do not
    // mix their logs; moved to target/guest/kernel.log after the run.
    let run_log = results.join("kernel.log");
    note!(
        "xtask: booting kernel {} in QEMU ({}, timeout {} s)",
        kernel.version,
        if machine.kvm { "kvm" } else { "tcg" },
        machine.timeout.as_secs()
    );
    let out = qemu::boot(&machine, &kernel, &initramfs, &results, &run_log)?;
    let log_path = kernel_log();
    let log = std::fs::read_to_string(&run_log)
        .map(|t| t.replace('\r', ""))
        .unwrap_or_else(|e| format!("(no kernel log at {}: {e})", run_log.display()));
    if std::fs::rename(&run_log, &log_path).is_err() {
        let _ = std::fs::write(&log_path, &log);
    }
    let diagnostics = || diagnostics(&out.qemu_stderr, &log, &log_path);

    let status = std::fs::read_to_string(results.join("status"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    if out.started_after.is_none() && status.is_none() {
        let why = match &out.end {
            End::TimedOut => format!(
                "the guest did not start the command within {} s ({ENV_TIMEOUT})",
                machine.timeout.as_secs()
            ),
            End::Exited(st) => match std::fs::read_to_string(results.join("error")) {
                Ok(e) => format!("guest setup failed: {}", e.trim()),
                Err(_) => match guest_errors(&log) {
                    Some(e) => format!("guest init failed: {e}"),
                    None => format!("the guest stopped before starting the command (QEMU {st})"),
                },
            },
        };
        bail!("{why}{}", diagnostics());
    }
    report.status = status;
    // A kernel oops, BUG or WARNING fails the run, whatever the command's status: the
    // command may have survived what the kernel got wrong.
    report.failure = kernel_failure(&log, &log_path);
    if status.is_none() {
        let why = match out.end {
            End::TimedOut => format!(
                "the guest was killed after {} s ({ENV_TIMEOUT})",
                machine.timeout.as_secs()
            ),
            End::Exited(st) => match panic_line(&log) {
                Some(p) => format!("the guest kernel crashed while the command was running: {p}"),
                None => format!("the guest stopped while the command was running (QEMU {st})"),
            },
        };
        report.failure = Some(format!("{why}{}", diagnostics()));
    }
    Ok(report)
}

/// Variable assignments that start guest.sh: paths, command, passed-through env.
fn header(results: &Path, command: &str) -> String {
    let mut h = String::from("# Generated by `cargo xtask` for one guest run.\n");
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| {
            (k.starts_with("RUST_") || k.starts_with("UVERBS_"))
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
        .collect();
    vars.sort();
    for (k, v) in vars {
        h.push_str(&format!("export {k}={}\n", sh_quote(&v)));
    }
    for (k, v) in [
        ("UVERBS_RESULTS", results.to_string_lossy().into_owned()),
        ("UVERBS_PROJECT", paths::root().to_string_lossy().into_owned()),
        ("UVERBS_TARGET_DIR", paths::target_dir().to_string_lossy().into_owned()),
        ("UVERBS_COMMAND", command.to_string()),
    ] {
        h.push_str(&format!("{k}={}\n", sh_quote(&v)));
    }
    h
}

/// Error lines init or guest.sh wrote to the kernel log.
fn guest_errors(log: &str) -> Option<String> {
    let errs: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split_once("uverbs-guest: ERROR: ").map(|(_, e)| e.trim()))
        .collect();
    (!errs.is_empty()).then(|| errs.join("; "))
}

/// The kernel's "Kernel panic" line, if the log has one.
fn panic_line(log: &str) -> Option<&str> {
    log.lines().find(|l| l.contains("Kernel panic - not syncing"))
}

/// Kernel log lines that report a kernel bug or warning (oops, BUG, WARN_ON).
fn kernel_problems(log: &str) -> Vec<&str> {
    const SIGNS: &[&str] = &[
        "BUG:",
        "WARNING:",
        "Oops",
        "general protection fault",
        "UBSAN:",
        "KASAN:",
        "Kernel panic",
    ];
    log.lines()
        .filter(|l| SIGNS.iter().any(|s| l.contains(s)))
        .take(20)
        .collect()
}

/// The failure a kernel log with [`kernel_problems`] makes, naming the first of them.
fn kernel_failure(log: &str, log_path: &Path) -> Option<String> {
    let problems = kernel_problems(log);
    let first = problems.first()?;
    Some(format!(
        "the guest kernel logged a problem: {}\n{}\n(the kernel log: {})",
        first.trim(),
        problems.join("\n"),
        log_path.display()
    ))
}

/// QEMU's stderr and the tail of the kernel log, for error messages.
fn diagnostics(qemu_stderr: &str, log: &str, log_path: &Path) -> String {
    let mut s = String::new();
    if !qemu_stderr.trim().is_empty() {
        s.push_str(&format!("\nQEMU stderr:\n{}", qemu_stderr.trim_end()));
    }
    let lines: Vec<&str> = log.lines().collect();
    let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
    s.push_str(&format!(
        "\nlast {} lines of the kernel log ({}):\n{}",
        tail.len(),
        log_path.display(),
        tail.join("\n")
    ));
    s
}

/// Removes results directories left by xtask processes that no longer run.
fn remove_stale_runs(cache: &Path) {
    let Ok(d) = std::fs::read_dir(cache) else {
        return;
    };
    for e in d.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("run-") {
            if !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_quotes_the_command() {
        let h = header(Path::new("/r"), "echo 'hi' && false");
        assert!(h.contains("UVERBS_RESULTS=/r\n"), "{h}");
        assert!(h.contains(r"UVERBS_COMMAND='echo '\''hi'\'' && false'"), "{h}");
    }

    #[test]
    fn reads_errors_and_panics_from_the_log() {
        let log = "[ 1.0] x\n[ 1.1] uverbs-guest: ERROR: insmod 9p failed\n\
                   [ 2.0] Kernel panic - not syncing: sysrq triggered crash\n";
        assert_eq!(guest_errors(log).as_deref(), Some("insmod 9p failed"));
        assert_eq!(guest_errors("[ 1.0] fine\n"), None);
        assert_eq!(kernel_problems(log).len(), 1);
        assert!(kernel_failure(log, Path::new("/k.log")).is_some_and(|f| f.contains("Kernel panic")));
        assert_eq!(kernel_failure("[ 1.0] fine\n", Path::new("/k.log")), None);
        assert!(panic_line(log).is_some_and(|l| l.ends_with("sysrq triggered crash")));
        let d = diagnostics("", log, Path::new("/k.log"));
        assert!(d.contains("last 3 lines of the kernel log (/k.log)"), "{d}");
    }
}
