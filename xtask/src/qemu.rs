//! Boots the guest in QEMU: builds the command line, streams the guest's
//! ttyS0 to our stdout, notices when the command starts, enforces a timeout.

use crate::error::{bail, Context, Result};
use crate::kernel::Kernel;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The line guest.sh prints on ttyS0 right before it starts the command.
pub const START_MARKER: &str = "@@uverbs-guest:command-start@@";

/// Machine settings (from the environment knobs).
pub struct Machine {
    pub kvm: bool,
    pub mem_mib: u32,
    pub cpus: u32,
    pub timeout: Duration,
}

/// How the QEMU process ended.
pub enum End {
    Exited(ExitStatus),
    TimedOut,
}

/// What a boot produced.
pub struct Outcome {
    pub end: End,
    /// Time from starting QEMU to the command starting in the guest.
    pub started_after: Option<Duration>,
    /// QEMU's own stderr (warnings, option errors).
    pub qemu_stderr: String,
}

/// QEMU option values separate suboptions with commas; a literal comma is doubled.
fn opt_path(p: &Path) -> String {
    p.to_string_lossy().replace(',', ",,")
}

/// Boots `kernel`+`initramfs`; the guest's init runs `<results>/guest.sh`.
pub fn boot(m: &Machine, kernel: &Kernel, initramfs: &Path, results: &Path, kernel_log: &Path) -> Result<Outcome> {
    let results_str = results.to_string_lossy();
    if results_str.contains(|c: char| c.is_whitespace() || c == '"') {
        bail!("the results directory {results_str} contains whitespace or quotes, which the kernel command line cannot carry");
    }
    // A kernel unpacked from a package: init.sh mounts its modules at /lib/modules/<release>.
    let modules_arg = match kernel.modules_outside_host() {
        Some(dir) => {
            let d = dir.to_string_lossy();
            if d.contains(|c: char| c.is_whitespace() || c == '"') {
                bail!("the modules directory {d} contains whitespace or quotes, which the kernel command line cannot carry");
            }
            format!("uverbs_modules={d}")
        }
        None => String::new(),
    };
    let append = [
        // Kernel messages on ttyS1 (a file); ttyS0 carries only the command.
        "console=ttyS1",
        "loglevel=7",
        // A panic reboots, and -no-reboot turns that into QEMU exiting.
        "panic=-1",
        // Boot-time savings under TCG: no probing of absent UARTs, no TSC
        // and timer checks, no speculation mitigations, no entropy wait.
        "8250.nr_uarts=2",
        "tsc=reliable",
        "no_timer_check",
        "mitigations=off",
        "random.trust_cpu=on",
        // Unknown parameters without a dot reach init as environment variables.
        &format!("uverbs_results={results_str}"),
        &modules_arg,
    ]
    .join(" ");
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"]);
    if m.kvm {
        cmd.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        cmd.args(["-accel", "tcg,thread=multi", "-cpu", "max"]);
    }
    cmd.args(["-m", &m.mem_mib.to_string(), "-smp", &m.cpus.to_string()])
        .arg("-kernel")
        .arg(&kernel.image)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", &append, "-nic", "none"])
        // ttyS0: the command's output, on our stdout. (A virtio console was
        // tried: it is ~50x slower than the UART under TCG.)
        .args(["-chardev", "stdio,id=out,signal=off", "-serial", "chardev:out"])
        // ttyS1: the kernel console.
        .arg("-serial")
        .arg(format!("file:{}", kernel_log.display()))
        // The host's root (read-only; multidevs=remap keeps inode numbers of
        // different host filesystems apart) and the writable results directory.
        .args([
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            "-virtfs",
            &format!("local,path={},mount_tag=results,security_model=none", opt_path(results)),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());

    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start `{}`", crate::proc::describe(&cmd)))?;
    let mut stdout = child.stdout.take().context("QEMU stdout missing")?;
    let mut stderr = child.stderr.take().context("QEMU stderr missing")?;
    let (tx, rx) = mpsc::channel();
    let accel = if m.kvm { "kvm" } else { "tcg" };
    let reader = std::thread::spawn(move || {
        let started = pump(&mut stdout, start, accel);
        let _ = tx.send(started);
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    // The reader finishes when QEMU closes its stdout, i.e. when it exits.
    let (timed_out, started_after) = match rx.recv_timeout(m.timeout) {
        Ok(started) => (false, started),
        Err(mpsc::RecvTimeoutError::Disconnected) => (false, None),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let _ = child.kill();
            (true, rx.recv().ok().flatten())
        }
    };
    let status = child.wait().context("waiting for QEMU")?;
    let _ = reader.join();
    let qemu_stderr = err_reader.join().unwrap_or_default();
    Ok(Outcome {
        end: if timed_out { End::TimedOut } else { End::Exited(status) },
        started_after,
        qemu_stderr,
    })
}

/// Copies the guest's ttyS0 to stdout, hiding the start marker and reporting
/// when it appeared. Returns the time from `start` to the marker.
fn pump(src: &mut impl Read, start: Instant, accel: &str) -> Option<Duration> {
    let mut out = std::io::stdout();
    let mut pending: Vec<u8> = Vec::new();
    let mut started = None;
    let mut buf = [0u8; 16384];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if started.is_some() {
            let _ = out.write_all(&buf[..n]);
            let _ = out.flush();
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        while let Some(pos) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=pos).collect();
            if line.trim_ascii() == START_MARKER.as_bytes() {
                let t = start.elapsed();
                started = Some(t);
                let _ = out.flush();
                note!(
                    "xtask: guest command started {:.2} s after QEMU start ({accel})",
                    t.as_secs_f64()
                );
                break;
            }
            let _ = out.write_all(&line);
        }
        if started.is_some() {
            let _ = out.write_all(&pending);
            pending.clear();
        }
        let _ = out.flush();
    }
    let _ = out.write_all(&pending);
    let _ = out.flush();
    started
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commas_are_doubled() {
        assert_eq!(opt_path(Path::new("/a,b/c")), "/a,,b/c");
    }
}
