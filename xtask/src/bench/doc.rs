//! The parts of docs/benchmarks.md that the bench commands write, and what each run records
//! about itself for the line under its table.
//!
//! A part lies between `<!-- bench-NAME:begin ... -->` and `<!-- bench-NAME:end -->`, each on
//! a line of its own; everything between the two is replaced, the markers and the rest of the
//! page are kept. The writers: `cargo xtask bench` (or `--report`) the three rxe instruction
//! tables (`bench-rxe-api`, `bench-rxe-dropin`, `bench-safe`), `--mlx5` the mlx5 table
//! (`bench-mlx5`), `--cm` connection setup (`bench-cm`), `--stream` the stream's
//! instructions per byte (`bench-stream`), `--cq-copy` the rxe CQE copies (`bench-cq-copy`).

use crate::error::{bail, Context, Result};
use crate::paths;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The page the parts are written into.
pub fn doc_path() -> PathBuf {
    paths::root().join("docs/benchmarks.md")
}

/// The byte range of the inside of part `name` in `text`: from after its begin marker's line
/// to the start of its end marker. Fails unless each marker is there exactly once, begin
/// first.
fn part_range(text: &str, name: &str) -> Result<(usize, usize)> {
    let begin = format!("<!-- bench-{name}:begin");
    let end = format!("<!-- bench-{name}:end -->");
    let mut b = None;
    let mut e = None;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_end();
        if t.starts_with(&begin) && t.ends_with("-->") {
            if b.is_some() {
                bail!("two `bench-{name}:begin` markers");
            }
            b = Some(at + line.len());
        } else if t == end {
            if e.is_some() {
                bail!("two `bench-{name}:end` markers");
            }
            e = Some(at);
        }
        at += line.len();
    }
    match (b, e) {
        (Some(b), Some(e)) if b <= e => Ok((b, e)),
        (Some(_), Some(_)) => bail!("the `bench-{name}:end` marker comes before its begin marker"),
        _ => bail!("no `bench-{name}` markers (a line starting `<!-- bench-{name}:begin` and a line `<!-- bench-{name}:end -->`)"),
    }
}

/// `text` with the inside of each part `(name, body)` replaced by `body` (a newline added if
/// it has none). Fails, changing nothing, if any part's markers are missing or repeated.
pub fn replace_parts(text: &str, parts: &[(&str, &str)]) -> Result<String> {
    let mut ranges = Vec::new();
    for &(name, body) in parts {
        if body.trim().is_empty() {
            bail!("nothing to write for `bench-{name}`");
        }
        ranges.push((part_range(text, name)?, body));
    }
    ranges.sort_by_key(|&((b, _), _)| b);
    if ranges.windows(2).any(|w| w[0].0 .1 > w[1].0 .0) {
        bail!("bench parts overlap");
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for ((b, e), body) in ranges {
        out.push_str(&text[at..b]);
        out.push_str(body);
        if !body.ends_with('\n') {
            out.push('\n');
        }
        at = e;
    }
    out.push_str(&text[at..]);
    Ok(out)
}

/// Writes the parts into `doc`, all or none.
pub fn write_parts_into(doc: &Path, parts: &[(&str, &str)]) -> Result<()> {
    let text = std::fs::read_to_string(doc).with_context(|| format!("reading {}", doc.display()))?;
    let updated = replace_parts(&text, parts).with_context(|| format!("{}: not written", doc.display()))?;
    crate::write_atomic(doc, updated.as_bytes())?;
    let names: Vec<String> = parts.iter().map(|(n, _)| format!("bench-{n}")).collect();
    note!("xtask: wrote {} into {}", names.join(", "), doc.display());
    Ok(())
}

/// Writes the parts into docs/benchmarks.md, all or none.
pub fn write_parts(parts: &[(&str, &str)]) -> Result<()> {
    write_parts_into(&doc_path(), parts)
}

/// The file a run leaves beside its raw results: what it was (the command, the commit, the
/// date, and for some the host's load average), as `key=value` lines.
pub const RUN_FILE: &str = "run.txt";

/// The checkout's commit, `git rev-parse --short HEAD`, with `-dirty` when the tree has
/// uncommitted changes (untracked files included; `target/` is ignored).
pub fn commit() -> String {
    let out = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(paths::root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(head) = out(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    match out(&["status", "--porcelain"]) {
        Some(s) if s.is_empty() => head,
        _ => format!("{head}-dirty"),
    }
}

/// Today's date and the time, UTC (`date -u`).
fn now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown date".into())
}

/// The command line that started this run: `cargo xtask bench` with `args`, after the
/// benchmark knobs that are set in the environment.
pub fn command_line(args: &str) -> String {
    let mut s = String::new();
    for k in [
        "UVERBS_BENCH_SKIP",
        "UVERBS_BENCH_REPS",
        "UVERBS_BENCH_PERFTEST_REPS",
        "UVERBS_STREAM_CG_SPECS",
        "UVERBS_GUEST_KERNEL",
    ] {
        if let Ok(v) = std::env::var(k) {
            s.push_str(&format!("{k}={} ", crate::proc::sh_quote(&v)));
        }
    }
    s.push_str("cargo xtask bench");
    if !args.is_empty() {
        s.push(' ');
        s.push_str(args);
    }
    s
}

/// The host's 1-minute load average (`/proc/loadavg`).
pub fn load_1min() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The CPU's model name (`/proc/cpuinfo`), `unknown` where there is none.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim() == "model name")
                .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Records the start of a run in `dir/run.txt`: command, commit, date (and `extra` lines).
pub fn record_start(dir: &Path, args: &str, extra: &[(&str, String)]) -> Result<()> {
    let mut s = format!("command={}\ncommit={}\ndate={}\n", command_line(args), commit(), now());
    for (k, v) in extra {
        s.push_str(&format!("{k}={v}\n"));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    crate::write_atomic(&dir.join(RUN_FILE), s.as_bytes())
}

/// Adds `key=value` lines to `dir/run.txt` (at the end of a run).
pub fn record_more(dir: &Path, extra: &[(&str, String)]) -> Result<()> {
    let path = dir.join(RUN_FILE);
    let mut s = std::fs::read_to_string(&path).unwrap_or_default();
    for (k, v) in extra {
        s.push_str(&format!("{k}={v}\n"));
    }
    crate::write_atomic(&path, s.as_bytes())
}

/// `key=value` lines of a file (`run.txt`, a guest's `env.txt`), the last of a key winning.
pub fn read_keys(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    parse_keys(&text)
}

fn parse_keys(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// What a run recorded in `run.txt`, for the generated line: fails if the run left none (it
/// predates the recording, or was not a bench command's).
pub struct Run {
    pub command: String,
    pub commit: String,
    pub date: String,
    pub keys: BTreeMap<String, String>,
}

impl Run {
    pub fn read(dir: &Path) -> Result<Run> {
        let keys = read_keys(&dir.join(RUN_FILE));
        let get = |k: &str| {
            keys.get(k).cloned().with_context(|| {
                format!(
                    "{}: no `{k}=` line (rerun the bench command)",
                    dir.join(RUN_FILE).display()
                )
            })
        };
        Ok(Run {
            command: get("command")?,
            commit: get("commit")?,
            date: get("date")?,
            keys: keys.clone(),
        })
    }

    /// "Generated by `COMMAND` at COMMIT on DATE" (the start of the generated line).
    pub fn generated(&self) -> String {
        format!("Generated by `{}` at {}, {}", self.command, self.commit, self.date)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# Title\n\nprose\n\n<!-- bench-a:begin (cargo xtask bench writes this part) -->\nold a\nold a 2\n<!-- bench-a:end -->\nmiddle\n<!-- bench-b:begin (x) -->\n<!-- bench-b:end -->\nend\n";

    #[test]
    fn parts_are_replaced_between_their_markers_only() {
        let t = replace_parts(PAGE, &[("b", "new b"), ("a", "new a\n")]).unwrap();
        assert_eq!(
            t,
            "# Title\n\nprose\n\n<!-- bench-a:begin (cargo xtask bench writes this part) -->\nnew a\n<!-- bench-a:end -->\nmiddle\n<!-- bench-b:begin (x) -->\nnew b\n<!-- bench-b:end -->\nend\n"
        );
        // Writing the same again changes nothing.
        assert_eq!(replace_parts(&t, &[("a", "new a\n"), ("b", "new b")]).unwrap(), t);
    }

    #[test]
    fn missing_or_repeated_markers_are_refused() {
        let e = replace_parts(PAGE, &[("a", "x"), ("c", "y")]).unwrap_err().to_string();
        assert!(e.contains("no `bench-c` markers"), "{e}");
        let no_end = PAGE.replace("<!-- bench-a:end -->\n", "");
        assert!(replace_parts(&no_end, &[("a", "x")]).is_err());
        let twice = format!("{PAGE}<!-- bench-b:end -->\n");
        assert!(replace_parts(&twice, &[("b", "x")])
            .unwrap_err()
            .to_string()
            .contains("two"));
        let reversed = "<!-- bench-a:end -->\n<!-- bench-a:begin -->\n";
        assert!(replace_parts(reversed, &[("a", "x")]).is_err());
        // A marker inside a line of prose is not a marker.
        let inline = "see `<!-- bench-a:begin -->` and\n<!-- bench-a:end -->\n";
        assert!(replace_parts(inline, &[("a", "x")]).is_err());
        assert!(
            replace_parts(PAGE, &[("a", " \n")]).is_err(),
            "an empty body is refused"
        );
    }

    #[test]
    fn a_refused_write_leaves_the_file_alone() {
        let dir = std::env::temp_dir().join(format!("xtask-doc-parts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let doc = dir.join("benchmarks.md");
        std::fs::write(&doc, PAGE).unwrap();
        assert!(write_parts_into(&doc, &[("a", "x"), ("missing", "y")]).is_err());
        assert_eq!(std::fs::read_to_string(&doc).unwrap(), PAGE);
        write_parts_into(&doc, &[("a", "x")]).unwrap();
        assert!(std::fs::read_to_string(&doc)
            .unwrap()
            .contains("begin (cargo xtask bench writes this part) -->\nx\n<!-- bench-a:end"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn run_files_give_the_generated_line() {
        let dir = std::env::temp_dir().join(format!("xtask-doc-run-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert!(Run::read(&dir).is_err(), "no run.txt, no line");
        std::fs::write(
            dir.join(RUN_FILE),
            "command=cargo xtask bench --stream\ncommit=abc1234-dirty\ndate=2026-11-28 12:00 UTC\n",
        )
        .unwrap();
        record_more(&dir, &[("load_end", "0.50".into())]).unwrap();
        let run = Run::read(&dir).unwrap();
        assert_eq!(
            run.generated(),
            "Generated by `cargo xtask bench --stream` at abc1234-dirty, 2026-11-28 12:00 UTC"
        );
        assert_eq!(run.keys["load_end"], "0.50");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
