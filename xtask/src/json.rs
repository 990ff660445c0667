//! Everything xtask reads as JSON, with serde_json: cargo's `--message-format=json` output
//! (`cargo xtask test` and `cargo xtask bench` take the executables they run from it) and the
//! bench harnesses' result lines (`results.jsonl`).

use crate::error::{bail, Context, Result};
use crate::proc;
use serde::Deserialize;
use std::io::BufRead;
use std::process::{Command, Stdio};

/// One line of cargo's `--message-format=json` output, as far as xtask reads it.
#[derive(Debug, Deserialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
enum CargoMessage {
    /// A compiler diagnostic.
    CompilerMessage { message: Diagnostic },
    /// A target was built.
    CompilerArtifact(Artifact),
    /// Build-script output, the final `build-finished`, and whatever cargo adds later.
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct Diagnostic {
    /// The diagnostic as rustc prints it.
    rendered: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Artifact {
    target: ArtifactTarget,
    /// Absent for libraries and build scripts.
    executable: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ArtifactTarget {
    name: String,
    /// `lib`, `bin`, `test`, `bench`, ...
    kind: Vec<String>,
}

/// A built executable target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executable {
    /// The target's name (`soak` for `tests/soak.rs`).
    pub name: String,
    /// Its kinds, as cargo names them (`test`, `bench`, `bin`, ...).
    pub kinds: Vec<String>,
    /// The executable's path.
    pub path: String,
}

impl Executable {
    /// Whether the target is of `kind`.
    pub fn is(&self, kind: &str) -> bool {
        self.kinds.iter().any(|k| k == kind)
    }
}

/// Runs `cargo`, a build with `--message-format=json`, shows the compiler's diagnostics as
/// they come, and returns the executables it built.
pub fn cargo_executables(cargo: &mut Command) -> Result<Vec<Executable>> {
    cargo.stdout(Stdio::piped());
    let what = proc::describe(cargo);
    note!("xtask: {what}");
    let mut child = cargo.spawn().with_context(|| format!("cannot start `{what}`"))?;
    let stdout = child.stdout.take().context("cargo stdout missing")?;
    let mut built = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.with_context(|| format!("reading the output of `{what}`"))?;
        // Lines that are not messages (a build script's own output) are skipped.
        match serde_json::from_str::<CargoMessage>(&line) {
            Ok(CargoMessage::CompilerMessage { message }) => {
                if let Some(r) = message.rendered {
                    note_raw!("{r}");
                }
            }
            Ok(CargoMessage::CompilerArtifact(a)) => built.extend(executable(a)),
            Ok(CargoMessage::Other) | Err(_) => {}
        }
    }
    let st = child.wait().with_context(|| format!("waiting for `{what}`"))?;
    if !st.success() {
        bail!("`{what}` failed ({st})");
    }
    Ok(built)
}

fn executable(a: Artifact) -> Option<Executable> {
    Some(Executable {
        name: a.target.name,
        kinds: a.target.kind,
        path: a.executable?,
    })
}

/// One line of `results.jsonl`: a measurement as benches/verbs/main.rs,
/// benches/c/verbs_bench.c and benches/guest.sh print it.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct BenchResult {
    /// `c`, `rust`, `dropin`.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// `drain`, `post`, ..., or a perftest program.
    pub workload: String,
    /// Batch size or message size; 0 where there is none.
    pub param: i64,
    /// The repetition (benches/guest.sh adds it); 0 where there is none.
    pub rep: i64,
    /// Every round's value.
    pub samples: Vec<f64>,
}

/// Parses one result line.
pub fn bench_result(line: &str) -> Result<BenchResult> {
    serde_json::from_str(line).map_err(|e| crate::error::Error::msg(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(line: &str) -> CargoMessage {
        serde_json::from_str(line).unwrap()
    }

    #[test]
    fn reads_a_cargo_test_artifact() {
        let line = r#"{"reason":"compiler-artifact","package_id":"uverbs 0.1.0","target":{"kind":["test"],"crate_types":["bin"],"name":"soak","src_path":"/w/tests/soak.rs","doctest":false},"profile":{"opt_level":"0"},"features":[],"filenames":["/w/target/debug/deps/soak-1a2b"],"executable":"/w/target/debug/deps/soak-1a2b","fresh":true}"#;
        let CargoMessage::CompilerArtifact(a) = message(line) else {
            panic!("not an artifact");
        };
        let exe = executable(a).unwrap();
        assert_eq!(exe.name, "soak");
        assert!(exe.is("test") && !exe.is("bench"));
        assert_eq!(exe.path, "/w/target/debug/deps/soak-1a2b");
    }

    #[test]
    fn a_library_artifact_has_no_executable() {
        let line = r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"uverbs"},"executable":null,"fresh":false}"#;
        let CargoMessage::CompilerArtifact(a) = message(line) else {
            panic!("not an artifact");
        };
        assert_eq!(executable(a), None);
    }

    #[test]
    fn reads_diagnostics_and_skips_other_reasons() {
        let line =
            r#"{"reason":"compiler-message","message":{"rendered":"warning: unused \"x\"\n","level":"warning"}}"#;
        assert!(matches!(
            message(line),
            CargoMessage::CompilerMessage { message: Diagnostic { rendered: Some(r) } } if r == "warning: unused \"x\"\n"
        ));
        assert!(matches!(
            message(r#"{"reason":"build-finished","success":true}"#),
            CargoMessage::Other
        ));
        assert!(serde_json::from_str::<CargoMessage>("Compiling foo").is_err());
    }

    #[test]
    fn reads_bench_results() {
        let c = r#"{"impl":"c","workload":"drain","param":16,"unit":"ns","samples":[40.5,41],"median":40.750,"min":40.5,"max":41}"#;
        assert_eq!(
            bench_result(c).unwrap(),
            BenchResult {
                implementation: "c".into(),
                workload: "drain".into(),
                param: 16,
                rep: 0,
                samples: vec![40.5, 41.0],
            }
        );
        let perftest = r#"{"rep":2,"impl":"dropin","workload":"ib_send_lat","param":2,"unit":"us","samples":[12.34],"t_avg":12.5}"#;
        let r = bench_result(perftest).unwrap();
        assert_eq!((r.rep, r.param, r.samples.as_slice()), (2, 2, &[12.34][..]));
        assert!(bench_result(r#"{"impl":"c","samples":[1,}"#).is_err());
    }
}
