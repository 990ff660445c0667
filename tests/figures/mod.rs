//! Figures the reliability tests report (docs/reliability.md): printed straight to stdout,
//! past the test harness's output capture, so `cargo xtask test` (which runs the test binaries
//! without `--nocapture`) shows them too.

use std::io::Write;

/// Prints `line` on stdout even when the harness captures test output.
pub fn figure(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
