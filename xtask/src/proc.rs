//! Running host programs: spawning with clear errors, capturing output, PATH lookup.

use crate::error::{bail, Context, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// A command line as a human-readable string (for messages).
pub fn describe(cmd: &Command) -> String {
    let prog = Path::new(cmd.get_program());
    // `cargo` stands for the toolchain's full path that `$CARGO` holds.
    let mut s = match prog.file_name() {
        Some(n) if n == "cargo" => "cargo".to_string(),
        _ => prog.to_string_lossy().into_owned(),
    };
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&sh_quote(&a.to_string_lossy()));
    }
    s
}

/// Runs `cmd` with inherited stdio and returns its exit status.
pub fn status(cmd: &mut Command) -> Result<ExitStatus> {
    cmd.status()
        .with_context(|| format!("cannot start `{}`", describe(cmd)))
}

/// Runs `cmd` with inherited stdio; fails unless it exits with status 0.
pub fn check(cmd: &mut Command) -> Result<()> {
    let st = status(cmd)?;
    if !st.success() {
        bail!("`{}` failed ({st})", describe(cmd));
    }
    Ok(())
}

/// Runs `cmd` with `input` on stdin and returns its stdout; fails (quoting its
/// stderr) unless it exits with a status in `ok_codes`.
pub fn filter(cmd: &mut Command, input: &[u8], ok_codes: &[i32]) -> Result<Vec<u8>> {
    let what = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{what}`"))?;
    let mut stdin = child.stdin.take().context("child stdin missing")?;
    let mut stderr = child.stderr.take().context("child stderr missing")?;
    let mut stdout = child.stdout.take().context("child stdout missing")?;
    let (out, err) = std::thread::scope(|s| {
        // A program that stops reading early (e.g. at the end of its stream)
        // makes this write fail with EPIPE; its exit status tells the truth.
        s.spawn(move || {
            let _ = stdin.write_all(input);
        });
        let err = s.spawn(move || {
            let mut v = Vec::new();
            let _ = stderr.read_to_end(&mut v);
            v
        });
        let mut out = Vec::new();
        let r = stdout.read_to_end(&mut out);
        (r.map(|_| out), err.join().unwrap_or_default())
    });
    let st = child.wait().with_context(|| format!("waiting for `{what}`"))?;
    let out = out.with_context(|| format!("reading the output of `{what}`"))?;
    if !st.code().is_some_and(|c| ok_codes.contains(&c)) {
        bail!("`{what}` failed ({st}): {}", String::from_utf8_lossy(&err).trim());
    }
    Ok(out)
}

/// Finds `name` in `$PATH` or the sbin directories (which a non-root `$PATH` may lack).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

/// Whether `p` is a regular file with an execute bit set.
pub fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Quotes `s` for a POSIX shell (unchanged if it needs no quoting).
pub fn sh_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The effective user id of this process, from /proc/self/status.
pub fn euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(sh_quote("ls"), "ls");
        assert_eq!(sh_quote("/a/b-c.d"), "/a/b-c.d");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote("$x;y"), "'$x;y'");
    }

    #[test]
    fn filter_pipes_and_reports_failures() {
        let out = filter(&mut Command::new("cat"), b"hello", &[0]).unwrap();
        assert_eq!(out, b"hello");
        let e = filter(Command::new("sh").args(["-c", "echo nope >&2; exit 3"]), b"", &[0])
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope") && e.contains('3'), "{e}");
    }
}
