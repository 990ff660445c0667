//! `cargo xtask public-api [--bless]`: the library's public items, as rustdoc sees them with
//! docs.rs's features, compared with the snapshot in `tests/public-api.txt`, so that every
//! change to the public API (a C layout made public above all: `repr(C)` and its public
//! fields are part of each line) shows in review as a change of that file. `--bless` writes
//! the snapshot anew. `cargo xtask test` runs the comparison.
//!
//! The list comes from rustdoc's JSON output (nightly only, `-Zunstable-options
//! --output-format json`), walked from the crate root through public modules and
//! re-exports: one line per module, type, function, constant, public field, enum variant,
//! inherent method and trait implementation (auto and blanket implementations left out).

use crate::error::{bail, Context, Result};
use crate::{paths, proc};
use serde_json::Value;
use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;

/// The snapshot, from the repository root.
const SNAPSHOT: &str = "tests/public-api.txt";

/// Compares the public items with the snapshot (or writes it, with `--bless`).
pub fn run(args: &[String]) -> Result<std::process::ExitCode> {
    let bless = args.iter().any(|a| a == "--bless");
    let lines = current()?;
    let path = paths::root().join(SNAPSHOT);
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    if bless {
        std::fs::write(&path, text).context(format!("writing {SNAPSHOT}"))?;
        note!("xtask: wrote {} public items to {SNAPSHOT}", lines.len());
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let old = std::fs::read_to_string(&path).context(format!("reading {SNAPSHOT}"))?;
    let diff = difference(&old, &text);
    if diff.is_empty() {
        note!("xtask: the public API ({} items) is the snapshot's", lines.len());
        return Ok(std::process::ExitCode::SUCCESS);
    }
    bail!(
        "the public API differs from {SNAPSHOT} (`cargo xtask public-api --bless` writes it anew, \
         and CHANGELOG.md says what changed and how to migrate):\n{}",
        diff.join("\n")
    )
}

/// The public items of the library now: rustdoc's JSON of it, walked.
fn current() -> Result<Vec<String>> {
    crate::toolchain::ensure_nightly()?;
    let target = paths::target_dir().join("nightly");
    let mut c = crate::toolchain::toolchain_cargo("nightly");
    c.args(["rustdoc", "-p", "uverbs", "--lib", "--features", "tokio", "--"])
        .args(["-Zunstable-options", "--output-format", "json"])
        .current_dir(paths::root())
        .env("CARGO_TARGET_DIR", &target);
    note!("xtask: {}", proc::describe(&c));
    proc::check(&mut c)?;
    let json: PathBuf = target.join("doc").join("uverbs.json");
    let text = std::fs::read_to_string(&json).context(format!("reading {}", json.display()))?;
    let doc: Value = serde_json::from_str(&text).context("parsing rustdoc's JSON")?;
    items(&doc)
}

/// `- line` for each line only in `old`, `+ line` for each only in `new`.
fn difference(old: &str, new: &str) -> Vec<String> {
    let (a, b): (BTreeSet<&str>, BTreeSet<&str>) = (old.lines().collect(), new.lines().collect());
    a.difference(&b)
        .map(|l| format!("- {l}"))
        .chain(b.difference(&a).map(|l| format!("+ {l}")))
        .collect()
}

/// The sorted lines of `doc` (rustdoc's JSON of the crate).
fn items(doc: &Value) -> Result<Vec<String>> {
    let index = doc.get("index").context("no index in rustdoc's JSON")?;
    let root = doc.get("root").context("no root in rustdoc's JSON")?;
    let mut walk = Walk {
        index,
        out: BTreeSet::new(),
        seen: HashSet::new(),
    };
    let root = id_key(root).context("the root's id")?;
    let name = walk
        .item(&root)
        .and_then(|i| i["name"].as_str())
        .unwrap_or("uverbs")
        .to_string();
    walk.visit(&root, &name, None);
    if walk.out.len() < 50 {
        bail!(
            "only {} public items found: rustdoc's JSON format changed?",
            walk.out.len()
        );
    }
    Ok(walk.out.into_iter().collect())
}

/// An id as the index's key.
fn id_key(id: &Value) -> Option<String> {
    id.as_u64()
        .map(|n| n.to_string())
        .or_else(|| id.as_str().map(str::to_string))
}

struct Walk<'a> {
    index: &'a Value,
    out: BTreeSet<String>,
    /// (id, path) pairs visited: a module re-exported under itself ends the walk there.
    seen: HashSet<(String, String)>,
}

impl<'a> Walk<'a> {
    fn item(&self, id: &str) -> Option<&'a Value> {
        self.index.get(id)
    }

    /// Records the item `id` at `path` (its name there given by `rename`, for re-exports).
    fn visit(&mut self, id: &str, path: &str, rename: Option<&str>) {
        let Some(item) = self.item(id) else {
            return;
        };
        if !self.seen.insert((id.to_string(), path.to_string())) {
            return;
        }
        let Some((kind, inner)) = item["inner"].as_object().and_then(|o| o.iter().next()) else {
            return;
        };
        let name = rename.or(item["name"].as_str()).unwrap_or("_");
        let here = if rename.is_none() && kind == "module" && inner["is_crate"] == true {
            path.to_string()
        } else {
            format!("{path}::{name}")
        };
        match kind.as_str() {
            "module" => {
                self.out.insert(format!("mod {here}"));
                for child in inner["items"].as_array().into_iter().flatten() {
                    if let Some(c) = id_key(child) {
                        self.visit(&c, &here, None);
                    }
                }
            }
            "use" => {
                let target = inner.get("id").and_then(id_key);
                let is_glob = inner["is_glob"] == true;
                match target {
                    Some(t) if is_glob => {
                        let items = self.item(&t).map(|m| m["inner"]["module"]["items"].clone());
                        for child in items.as_ref().and_then(Value::as_array).into_iter().flatten() {
                            if let Some(c) = id_key(child) {
                                self.visit(&c, path, None);
                            }
                        }
                    }
                    Some(t) if self.item(&t).is_some() => {
                        let as_name = inner["name"].as_str().unwrap_or(name).to_string();
                        self.visit(&t, path, Some(&as_name));
                    }
                    _ => {
                        let source = inner["source"].as_str().unwrap_or("?");
                        self.out.insert(format!(
                            "use {path}::{} = {source}",
                            inner["name"].as_str().unwrap_or(name)
                        ));
                    }
                }
            }
            "struct" | "union" | "enum" => {
                self.out.insert(format!("{kind} {here}{}", repr(item)));
                let fields = match kind.as_str() {
                    "struct" => inner["kind"]["plain"]["fields"]
                        .as_array()
                        .or(inner["kind"]["tuple"].as_array()),
                    "union" => inner["fields"].as_array(),
                    _ => None,
                };
                for f in fields.into_iter().flatten().filter_map(id_key) {
                    if let Some(field) = self.item(&f).filter(|f| f["visibility"] == "public") {
                        self.out
                            .insert(format!("field {here}.{}", field["name"].as_str().unwrap_or("?")));
                    }
                }
                for v in inner["variants"].as_array().into_iter().flatten().filter_map(id_key) {
                    if let Some(variant) = self.item(&v) {
                        self.out
                            .insert(format!("variant {here}::{}", variant["name"].as_str().unwrap_or("?")));
                    }
                }
                self.impls(inner, &here);
            }
            "trait" => {
                let unsafe_ = if inner["is_unsafe"] == true { "unsafe " } else { "" };
                self.out.insert(format!("{unsafe_}trait {here}"));
                for m in inner["items"].as_array().into_iter().flatten().filter_map(id_key) {
                    self.member(&m, &here);
                }
            }
            "function" => {
                self.out.insert(format!("{}fn {here}", fn_unsafe(inner)));
            }
            other => {
                self.out.insert(format!("{} {here}", other.replace('_', " ")));
            }
        }
    }

    /// The inherent methods and constants, and the trait implementations, of a type.
    fn impls(&mut self, inner: &Value, here: &str) {
        for i in inner["impls"].as_array().into_iter().flatten().filter_map(id_key) {
            let Some(imp) = self.item(&i).map(|i| &i["inner"]["impl"]) else {
                continue;
            };
            if imp["is_synthetic"] == true || !imp["blanket_impl"].is_null() {
                continue;
            }
            match imp["trait"]["path"].as_str() {
                Some(t) => {
                    let unsafe_ = if imp["is_unsafe"] == true { "unsafe " } else { "" };
                    self.out.insert(format!("{unsafe_}impl {t} for {here}"));
                }
                None => {
                    for m in imp["items"].as_array().into_iter().flatten().filter_map(id_key) {
                        if self.item(&m).is_some_and(|m| m["visibility"] == "public") {
                            self.member(&m, here);
                        }
                    }
                }
            }
        }
    }

    /// A method, constant or type of an impl or trait.
    fn member(&mut self, id: &str, here: &str) {
        let Some(m) = self.item(id) else {
            return;
        };
        let name = m["name"].as_str().unwrap_or("?");
        let line = match m["inner"].as_object().and_then(|o| o.iter().next()) {
            Some((k, inner)) if k == "function" => format!("{}fn {here}::{name}", fn_unsafe(inner)),
            Some((k, _)) => format!("{} {here}::{name}", k.replace('_', " ")),
            None => return,
        };
        self.out.insert(line);
    }
}

/// ` repr(C)` (or another repr) from an item's attributes, as rustdoc reports them.
fn repr(item: &Value) -> String {
    let mut reprs = Vec::new();
    for a in item["attrs"].as_array().into_iter().flatten() {
        if let Some(r) = a.get("repr") {
            let mut parts: Vec<String> = Vec::new();
            if let Some(k) = r["kind"].as_str().filter(|k| *k != "rust") {
                parts.push(if k == "c" { "C".into() } else { k.to_string() });
            }
            if let Some(i) = r["int"].as_str() {
                parts.push(i.to_string());
            }
            if let Some(n) = r["align"].as_u64() {
                parts.push(format!("align({n})"));
            }
            if let Some(n) = r["packed"].as_u64() {
                parts.push(format!("packed({n})"));
            }
            if !parts.is_empty() {
                reprs.push(format!(" repr({})", parts.join(", ")));
            }
        } else if let Some(s) = a.as_str().filter(|s| s.starts_with("#[repr(")) {
            reprs.push(format!(" {}", s.trim_start_matches("#[").trim_end_matches(']')));
        }
    }
    reprs.concat()
}

/// `unsafe ` for an unsafe function.
fn fn_unsafe(inner: &Value) -> &'static str {
    if inner["header"]["is_unsafe"] == true {
        "unsafe "
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small rustdoc index walked: re-exports under their names, public fields of a
    /// `repr(C)` union, inherent methods, trait impls but not auto ones.
    #[test]
    fn walks_modules_reexports_and_impls() {
        let doc: Value = serde_json::from_str(
            r#"{"root": 0, "index": {
            "0": {"name": "k", "inner": {"module": {"is_crate": true, "items": [1, 2]}}},
            "1": {"name": "m", "inner": {"module": {"is_crate": false, "items": [3]}}},
            "2": {"name": "U", "inner": {"use": {"source": "m::U", "name": "U", "id": 3, "is_glob": false}}},
            "3": {"name": "U", "attrs": [{"repr": {"kind": "c", "align": null, "packed": null, "int": null}}],
                  "inner": {"union": {"fields": [4, 5], "impls": [6, 7, 8]}}},
            "4": {"name": "a", "visibility": "public", "inner": {"struct_field": {}}},
            "5": {"name": "b", "visibility": "default", "inner": {"struct_field": {}}},
            "6": {"inner": {"impl": {"is_synthetic": false, "blanket_impl": null, "trait": null, "items": [9]}}},
            "7": {"inner": {"impl": {"is_synthetic": false, "blanket_impl": null, "trait": {"path": "Clone"}, "items": []}}},
            "8": {"inner": {"impl": {"is_synthetic": true, "blanket_impl": null, "trait": {"path": "Send"}, "items": []}}},
            "9": {"name": "get", "visibility": "public", "inner": {"function": {"header": {"is_unsafe": true}}}}
            }}"#,
        )
        .unwrap();
        let mut walk = Walk {
            index: &doc["index"],
            out: BTreeSet::new(),
            seen: HashSet::new(),
        };
        walk.visit("0", "k", None);
        let lines: Vec<String> = walk.out.into_iter().collect();
        assert_eq!(
            lines,
            [
                "field k::U.a",
                "field k::m::U.a",
                "impl Clone for k::U",
                "impl Clone for k::m::U",
                "mod k",
                "mod k::m",
                "union k::U repr(C)",
                "union k::m::U repr(C)",
                "unsafe fn k::U::get",
                "unsafe fn k::m::U::get",
            ]
        );
        assert_eq!(difference("a\nb\n", "b\nc\n"), ["- a", "+ c"]);
    }
}
