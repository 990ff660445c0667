//! Rules for the documentation's examples, as unit tests: every `compile_fail` example names
//! the error it is there to show (`compile_fail,E0451`), so an example that stops compiling
//! for another reason (a typo, a missing field) fails instead of passing silently. rustdoc
//! compares the codes only on a nightly toolchain: `cargo xtask test` runs the doc tests of
//! [`COMPILE_FAIL_FILES`] on nightly for that (`crate::testrun`).

use crate::error::Result;
use crate::paths;
use std::process::Command;

/// The files with `compile_fail` examples, as `cargo test --doc` names their tests.
pub const COMPILE_FAIL_FILES: [&str; 4] = ["src/batch.rs", "src/mr.rs", "src/owned.rs", "src/owned/srq.rs"];

/// The doc tests of [`COMPILE_FAIL_FILES`] on nightly, where rustdoc checks that each
/// example fails with the error code it names (its own target dir, so the stable build's
/// artifacts stay).
pub fn nightly_doc_tests() -> Result<Command> {
    crate::toolchain::ensure_nightly()?;
    let mut c = crate::toolchain::toolchain_cargo("nightly");
    c.args(["test", "--doc", "-p", "uverbs", "--"])
        .args(COMPILE_FAIL_FILES)
        .current_dir(paths::root())
        .env("CARGO_TARGET_DIR", paths::target_dir().join("nightly"));
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// Every `.rs` and `.md` file of the library, its providers and its docs.
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "md") {
                out.push(path);
            }
        }
    }

    /// The fence lines that open a `compile_fail` example, with the file each is in.
    fn compile_fail_fences() -> Vec<(String, String)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut all = vec![root.join("README.md")];
        for dir in ["src", "providers", "docs"] {
            files(&root.join(dir), &mut all);
        }
        let mut fences = Vec::new();
        for path in all {
            let text = std::fs::read_to_string(&path).unwrap();
            let name = path.strip_prefix(&root).unwrap().display().to_string();
            for line in text.lines() {
                let line = line
                    .trim_start()
                    .trim_start_matches("//!")
                    .trim_start_matches("///")
                    .trim();
                if line.starts_with("```") && line.contains("compile_fail") {
                    fences.push((name.clone(), line.to_string()));
                }
            }
        }
        fences
    }

    /// An error code: `E` and four digits.
    fn is_error_code(word: &str) -> bool {
        word.len() == 5 && word.starts_with('E') && word[1..].bytes().all(|b| b.is_ascii_digit())
    }

    #[test]
    fn every_compile_fail_example_names_its_error_code() {
        let fences = compile_fail_fences();
        assert!(fences.len() >= 9, "found the examples: {fences:?}");
        for (file, fence) in &fences {
            let words: Vec<&str> = fence.trim_start_matches('`').split(',').map(str::trim).collect();
            assert!(
                words.iter().any(|w| is_error_code(w)),
                "{file}: `{fence}` names no error code"
            );
        }
        let mut with_examples: Vec<&str> = fences.iter().map(|(f, _)| f.as_str()).collect();
        with_examples.sort();
        with_examples.dedup();
        assert_eq!(
            with_examples, COMPILE_FAIL_FILES,
            "COMPILE_FAIL_FILES lists the files whose examples the nightly doc tests check"
        );
        assert!(is_error_code("E0451") && !is_error_code("E045") && !is_error_code("compile_fail"));
    }
}
