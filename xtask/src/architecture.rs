//! Architecture rules checked on the source tree, as unit tests: no import loop among the
//! modules of `src/`, nor among those of the mlx5 device model (`tests/mlx5/model/src/`) or
//! of xtask itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules of the crate root `src` each module of it names: through `crate::module`
/// paths, or through a type the crate root re-exports from a module (`crate::Pd`).
/// Files in a module's folder (`src/sys/*`, `src/x/*`, `kernel/ioctl/srq.rs`) count as that
/// module (`sys`, `x`, `kernel`).
fn module_imports(src: &Path) -> std::io::Result<BTreeMap<String, BTreeSet<String>>> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).or_else(|_| std::fs::read_to_string(src.join("main.rs")))?;
    let reexports = reexported_types(&lib);
    let mut graph = BTreeMap::new();
    for (module, text) in module_sources(src)? {
        let mut names = BTreeSet::new();
        for path in crate_paths(&text) {
            let first = path.split("::").next().unwrap_or_default();
            let target = reexports.get(first).map_or(first, String::as_str);
            if target != module && !target.is_empty() {
                names.insert(target.to_string());
            }
        }
        graph.entry(module).or_insert_with(BTreeSet::new).extend(names);
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for names in graph.values_mut() {
        names.retain(|n| modules.contains(n));
    }
    Ok(graph)
}

/// `(module, source)` of every file under `src` but the crate root (`lib.rs` or `main.rs`).
fn module_sources(src: &Path) -> std::io::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(src)? {
        let path = entry?.path();
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        if path.is_dir() {
            for text in rust_files(&path)? {
                out.push((stem.clone(), text));
            }
        } else if path.extension().is_some_and(|e| e == "rs") && stem != "lib" && stem != "main" {
            out.push((stem, std::fs::read_to_string(&path)?));
        }
    }
    Ok(out)
}

/// The text of every `.rs` file in `dir` and the folders inside it.
fn rust_files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(std::fs::read_to_string(&path)?);
        }
    }
    Ok(out)
}

/// Type name -> module, from the crate root's `pub use module::{A, B};` lines.
fn reexported_types(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let mut rest = lib;
    while let Some(at) = rest.find("pub use ") {
        rest = &rest[at + "pub use ".len()..];
        let stmt = &rest[..rest.find(';').unwrap_or(rest.len())];
        let Some((module, names)) = stmt.split_once("::") else {
            continue;
        };
        let names = names.trim_matches(|c: char| c == '{' || c == '}' || c.is_whitespace());
        for name in names.split(',') {
            let name = name.trim();
            if !name.is_empty() {
                map.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    map
}

/// Every `crate::a::b` path in the code of `text` (not in comments or doc links), without
/// the `crate::`.
fn crate_paths(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .flat_map(paths_in_line)
        .collect()
}

fn paths_in_line(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | '$' | ':')) {
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        out.push(&rest[..end]);
    }
    out
}

/// A cycle in `graph`, if there is one, as the modules along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut done, &mut Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../src")
    }

    #[test]
    fn no_import_loop_among_core_modules() {
        let graph = module_imports(&src()).unwrap();
        assert!(graph.len() > 10, "read the modules of src/: {graph:?}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("src/ modules import each other in a loop: {}", cycle.join(" -> "));
        }
    }

    #[test]
    fn no_import_loop_among_mlx5_model_modules() {
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/mlx5/model/src");
        let graph = module_imports(&model).unwrap();
        assert!(graph.len() > 10, "read the modules of the model: {graph:?}");
        assert!(graph["stepper"].contains("trace"), "read crate:: paths: {graph:?}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("mlx5 model modules import each other in a loop: {}", cycle.join(" -> "));
        }
    }

    #[test]
    fn no_import_loop_among_xtask_modules() {
        let graph = module_imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).unwrap();
        assert!(graph.len() > 10, "read the modules of xtask: {graph:?}");
        assert!(graph["testrun"].contains("mlx5"), "read crate:: paths: {graph:?}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("xtask modules import each other in a loop: {}", cycle.join(" -> "));
        }
    }

    #[test]
    fn the_loop_finder_finds_loops() {
        let graph = BTreeMap::from([
            ("a".to_string(), BTreeSet::from(["b".to_string()])),
            ("b".to_string(), BTreeSet::from(["c".to_string()])),
            ("c".to_string(), BTreeSet::from(["a".to_string()])),
        ]);
        assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
        let reexports = reexported_types("pub use qp::{Qp, QpInit};\npub use pd::Pd;");
        assert_eq!(reexports["QpInit"], "qp");
        assert_eq!(reexports["Pd"], "pd");
        assert_eq!(
            crate_paths("use crate::qp::Qp; x::crate::no; $crate::m\n/// [`crate::doc`]"),
            ["qp::Qp"]
        );
    }
}
