//! Architecture rules checked on the source tree, as unit tests: no import loop among the
//! modules of the library (those of `src/` and each vendor provider under `providers/`), and
//! the core names no vendor; none among those of the mlx5 device model
//! (`tests/mlx5/model/src/`), of the libibverbs front end (`dropin/libibverbs/src/`) or of
//! xtask itself; the vendor contract names nothing only a front end uses; every module of the
//! library with `unsafe` code and unit tests runs them under miri (`models::MIRI_TESTS`) or
//! says why not (`models::MIRI_EXEMPT`); the lists of where `unsafe` is allowed (docs/architecture.md,
//! `src/sys/mod.rs`) name exactly the `allow(unsafe_code)` sites.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules of the crate root `src` each module of it names: through `crate::module`
/// paths, or through a type the crate root re-exports from a module (`crate::Pd`).
/// Files in a module's folder (`src/sys/*`, `src/cm/*`, `kernel/ioctl/srq.rs`) count as that
/// module (`sys`, `cm`, `kernel`).
fn module_imports(src: &Path) -> std::io::Result<BTreeMap<String, BTreeSet<String>>> {
    imports_among(src, module_sources(src)?)
}

/// [`module_imports`] of the library: the modules of `src/` and the vendor providers mounted
/// from `providers/` (`providers/rxe/**` counts as `providers::rxe`, `providers/mod.rs`, the
/// vendor table, as `providers`).
fn library_imports(src: &Path) -> std::io::Result<BTreeMap<String, BTreeSet<String>>> {
    let mut sources = module_sources(src)?;
    sources.extend(provider_sources(&src.join("../providers"))?);
    imports_among(src, sources)
}

/// The import graph among the modules of `sources` (`(module, text)`), `src` being the crate
/// root's folder.
fn imports_among(src: &Path, sources: Vec<(String, String)>) -> std::io::Result<BTreeMap<String, BTreeSet<String>>> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).or_else(|_| std::fs::read_to_string(src.join("main.rs")))?;
    let reexports = reexported_types(&lib);
    let mut graph = BTreeMap::new();
    for (module, text) in sources {
        let mut names = BTreeSet::new();
        for path in crate_paths(&text) {
            let mut segments = path.split("::");
            let first = segments.next().unwrap_or_default();
            let vendor = match (first, segments.next()) {
                ("providers", Some(v)) if !v.is_empty() => format!("providers::{v}"),
                _ => String::new(),
            };
            let target = if vendor.is_empty() {
                reexports.get(first).map_or(first, String::as_str)
            } else {
                vendor.as_str()
            };
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
            for text in rust_texts(&path)? {
                out.push((stem.clone(), text));
            }
        } else if path.extension().is_some_and(|e| e == "rs") && stem != "lib" && stem != "main" {
            out.push((stem, std::fs::read_to_string(&path)?));
        }
    }
    Ok(out)
}

/// `(module, source)` of every file under `providers/`: `providers::<vendor>` for a vendor's
/// folder, `providers` for the table in `mod.rs`.
fn provider_sources(dir: &Path) -> std::io::Result<Vec<(String, String)>> {
    let mut out = vec![("providers".to_string(), std::fs::read_to_string(dir.join("mod.rs"))?)];
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            let vendor = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            for text in rust_texts(&path)? {
                out.push((format!("providers::{vendor}"), text));
            }
        }
    }
    Ok(out)
}

/// The text of every `.rs` file in `dir` and the folders inside it.
fn rust_texts(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(rust_texts(&path)?);
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
        if let Some(group) = rest.strip_prefix('{') {
            out.extend(group_heads(group));
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        out.push(&rest[..end]);
    }
    out
}

/// The first name of each path in a `use crate::{a, b::{c, d}}` group, from just after its
/// `{` to its `}` (or the end of the line: a group rustfmt spreads over lines is read up to it).
fn group_heads(group: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let (mut depth, mut start) = (0usize, Some(0));
    for (i, c) in group.char_indices() {
        if c.is_whitespace() && start == Some(i) {
            start = Some(i + c.len_utf8());
            continue;
        }
        if let Some(s) = start {
            if !(c.is_alphanumeric() || c == '_') {
                heads.push(&group[s..i]);
                start = None;
            }
        }
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return heads,
            '}' => depth -= 1,
            ',' if depth == 0 => start = Some(i + 1),
            _ => {}
        }
    }
    if let Some(s) = start {
        heads.push(&group[s..]);
    }
    heads.retain(|h| !h.is_empty() && *h != "self");
    heads
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

/// One source file of the library crate.
struct LibFile {
    /// From the workspace root (`providers/rxe/queue.rs`).
    path: String,
    /// Its module path in the crate (`providers::rxe::queue`; empty for the crate root).
    module: String,
    text: String,
}

/// The library crate's files: `src/` and the folders `src/lib.rs` mounts with `#[path]`
/// (`providers/`), less the folders of other workspace members, should one sit there.
fn library_files(root: &Path) -> std::io::Result<Vec<LibFile>> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))?;
    let members = workspace_members(&manifest);
    let lib = std::fs::read_to_string(root.join("src/lib.rs"))?;
    let mut mounts = vec![("src".to_string(), String::new())];
    mounts.extend(path_mounts(&lib));
    let mut out = Vec::new();
    for (dir, prefix) in mounts {
        let mut files = Vec::new();
        rust_files(root, &root.join(&dir), &members, &mut files)?;
        for path in files {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let inner = path.strip_prefix(root.join(&dir)).unwrap_or(&path);
            let mut parts: Vec<String> = Vec::new();
            if !prefix.is_empty() {
                parts.push(prefix.clone());
            }
            let inner = inner.with_extension("");
            for c in inner.components() {
                parts.push(c.as_os_str().to_string_lossy().into_owned());
            }
            if parts
                .last()
                .is_some_and(|p| p == "mod" || (p == "lib" && prefix.is_empty() && parts.len() == 1))
            {
                parts.pop();
            }
            out.push(LibFile {
                path: rel.to_string_lossy().into_owned(),
                module: parts.join("::"),
                text: std::fs::read_to_string(&path)?,
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The `members` of the workspace manifest (`[workspace] members = [..]`).
fn workspace_members(manifest: &str) -> Vec<String> {
    let Some(at) = manifest.find("members") else {
        return Vec::new();
    };
    let rest = &manifest[at..];
    let list = &rest[rest.find('[').unwrap_or(0) + 1..rest.find(']').unwrap_or(rest.len())];
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty() && m != ".")
        .collect()
}

/// `(folder, module)` for each `#[path = "../folder/mod.rs"] mod module;` of the crate root.
fn path_mounts(lib: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut path = None;
    for line in lib.lines().map(str::trim) {
        if let Some(p) = line.strip_prefix("#[path = \"").and_then(|l| l.strip_suffix("\"]")) {
            path = Some(p.trim_start_matches("../").trim_end_matches("/mod.rs").to_string());
        } else if let (Some(dir), Some(name)) = (&path, module_declared(line)) {
            out.push((dir.clone(), name.to_string()));
            path = None;
        }
    }
    out
}

/// Every `.rs` file under `dir`, but in the folders of `members`.
fn rust_files(root: &Path, dir: &Path, members: &[String], out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            if !members.iter().any(|m| root.join(m) == path) {
                rust_files(root, &path, members, out)?;
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The name of the module `line` declares (`pub(crate) mod name;`, `mod name {`), if it does.
pub(crate) fn module_declared(line: &str) -> Option<&str> {
    let mut rest = line.trim();
    if let Some(r) = rest.strip_prefix("pub") {
        rest = r.trim_start();
        if rest.starts_with('(') {
            rest = rest[rest.find(')')? + 1..].trim_start();
        }
    }
    let rest = rest.strip_prefix("mod ")?.trim_start();
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// `text` without its `//` comments (doc comments included) and string literals, line by line.
pub(crate) fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if in_str => {
                    chars.next();
                }
                '"' => in_str = !in_str,
                '/' if !in_str && chars.peek() == Some(&'/') => break,
                _ if in_str => {}
                _ => out.push(c),
            }
        }
        out.push('\n');
    }
    out
}

/// Whether `code` (see [`code_only`]) has the keyword `unsafe`: a block, fn, impl, trait or
/// extern block (not the lint names `unsafe_code`, `unsafe_op_in_unsafe_fn`).
fn has_unsafe(code: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices("unsafe").any(|(at, _)| {
        !code[..at].chars().next_back().is_some_and(ident) && !code[at + 6..].chars().next().is_some_and(ident)
    })
}

/// The attribute and comment lines right above line `at` of `lines`.
fn attributes_above<'a>(lines: &[&'a str], at: usize) -> Vec<&'a str> {
    lines[..at]
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("#[") || l.starts_with("//"))
        .filter(|l| l.starts_with("#["))
        .collect()
}

/// Whether `attributes` hold a `#[cfg(..)]` naming `test`: test-only code.
fn test_only(attributes: &[&str]) -> bool {
    attributes.iter().any(|a| {
        // Strings left out: `feature = "test-support"` is no test-only build.
        a.strip_prefix("#[cfg(").is_some_and(|c| {
            code_only(c)
                .split(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
                .any(|w| w == "test")
        })
    })
}

/// The module paths of the unit tests in `file`: its `#[cfg(test)] mod name {..}` at the top
/// level, or the file's own module where its tests sit outside any (a test-only file).
fn test_modules(file: &LibFile) -> Vec<String> {
    let lines: Vec<&str> = file.text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = module_declared(line) else {
            continue;
        };
        if !line.starts_with(char::is_whitespace)
            && line.trim_end().ends_with('{')
            && test_only(&attributes_above(&lines, i))
        {
            out.push(join(&file.module, name));
        }
    }
    if out.is_empty() && lines.iter().any(|l| l.trim() == "#[test]") {
        out.push(file.module.clone());
    }
    out
}

fn join(module: &str, name: &str) -> String {
    if module.is_empty() {
        name.to_string()
    } else {
        format!("{module}::{name}")
    }
}

/// Whether test module `module` runs under a libtest filter list `entries` (each entry a
/// module path: it selects that module and those inside it).
fn selected(module: &str, entries: &[&str]) -> bool {
    entries
        .iter()
        .any(|e| module == *e || module.starts_with(&format!("{e}::")))
}

/// Where the library allows `unsafe_code`, outside test-only code: the modules that allow
/// it whole (`#[allow(unsafe_code)] mod m`, `#![allow(unsafe_code)]`) and the modules with
/// items that allow it (an `unsafe fn`, an `unsafe impl`).
#[derive(Debug, Default, PartialEq, Eq)]
struct UnsafeSites {
    whole: BTreeSet<String>,
    items: BTreeSet<String>,
}

fn unsafe_sites(files: &[LibFile]) -> UnsafeSites {
    let mut sites = UnsafeSites::default();
    for file in files {
        let lines: Vec<&str> = file.text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim();
            let allows = t.starts_with("#") && (t.contains("allow(unsafe_code)") || t.contains("expect(unsafe_code)"));
            if !allows {
                continue;
            }
            if t.starts_with("#![") {
                sites.whole.insert(file.module.clone());
                continue;
            }
            // The item the attribute is on: the first line below that is no attribute or comment.
            let Some(item) = (i + 1..lines.len()).find(|&j| {
                let l = lines[j].trim();
                !(l.is_empty() || l.starts_with("#[") || l.starts_with("//"))
            }) else {
                continue;
            };
            if test_only(&attributes_above(&lines, item)) {
                continue;
            }
            match module_declared(lines[item]) {
                Some(name) => sites.whole.insert(join(&file.module, name)),
                None => sites.items.insert(file.module.clone()),
            };
        }
    }
    sites
}

/// The list of where `unsafe` is allowed in `doc` (Markdown; `//!` prefixes stripped): the
/// bullets after the line holding ``Where `unsafe` is allowed``. ``- `m` (note): why`` names
/// a module allowing it whole; ``- items of `m`, `n`: why`` modules with items allowing it.
fn listed_sites(doc: &str) -> Option<UnsafeSites> {
    let lines: Vec<&str> = doc.lines().map(|l| l.trim_start_matches("//!").trim()).collect();
    let start = lines.iter().position(|l| l.contains("Where `unsafe` is allowed"))?;
    let mut sites = UnsafeSites::default();
    let mut in_list = false;
    for line in &lines[start + 1..] {
        let Some(bullet) = line.strip_prefix("- ") else {
            if in_list && line.is_empty() {
                break;
            }
            continue;
        };
        in_list = true;
        // `- names (note): why`: module paths hold `::`, so the names end at ": ".
        let (names, _why) = bullet.split_once(": ")?;
        let names = names.split('(').next().unwrap_or_default();
        let (set, names) = match names.strip_prefix("items of ") {
            Some(n) => (&mut sites.items, n),
            None => (&mut sites.whole, names),
        };
        for name in names.split('`').skip(1).step_by(2) {
            set.insert(name.to_string());
        }
        if !names.contains('`') {
            return None;
        }
    }
    Some(sites)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// A module with `unsafe` code and unit tests runs them under miri, or says why not.
    #[test]
    fn every_module_with_unsafe_runs_its_unit_tests_under_miri() {
        use crate::models::{MIRI_EXEMPT, MIRI_TESTS};
        let files = library_files(&root()).unwrap();
        assert!(
            files.iter().any(|f| f.module == "providers::rxe::queue") && files.iter().any(|f| f.module == "sys"),
            "read the library's files: {:?}",
            files.iter().map(|f| &f.module).collect::<Vec<_>>()
        );
        assert!(
            files
                .iter()
                .all(|f| f.path.starts_with("src/") || f.path.starts_with("providers/")),
            "only the library's folders"
        );
        let exempt: Vec<&str> = MIRI_EXEMPT.iter().map(|(m, _)| *m).collect();
        let mut missing = Vec::new();
        for file in files.iter().filter(|f| has_unsafe(&code_only(&f.text))) {
            for module in test_modules(file) {
                if !selected(&module, &MIRI_TESTS) && !selected(&module, &exempt) {
                    missing.push(format!("{module} ({})", file.path));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "test modules of files with `unsafe` that miri does not run; add them to MIRI_TESTS in \
             xtask/src/models.rs (or to MIRI_EXEMPT, with the reason): {missing:#?}"
        );
        // Each entry names test modules; as a libtest filter (a substring of a test's name)
        // a MIRI_TESTS entry selects none that the list does not name.
        let all: Vec<String> = files.iter().flat_map(test_modules).collect();
        for entry in MIRI_TESTS.iter().chain(&exempt) {
            assert!(
                all.iter().any(|m| selected(m, &[entry])),
                "`{entry}` names no test module"
            );
            assert!(
                !(MIRI_TESTS.contains(entry) && exempt.contains(entry)),
                "`{entry}` is run and exempt"
            );
        }
        for entry in MIRI_TESTS {
            for m in all.iter().filter(|m| format!("{m}::").contains(&format!("{entry}::"))) {
                assert!(selected(m, &MIRI_TESTS), "the filter `{entry}` also selects `{m}`");
            }
        }
    }

    /// docs/architecture.md's and `src/sys/mod.rs`'s lists of where `unsafe` is allowed name exactly the
    /// `allow(unsafe_code)` sites of the library, and the crate root denies it elsewhere.
    #[test]
    fn the_lists_of_where_unsafe_is_allowed_are_the_allow_sites() {
        let root = root();
        let files = library_files(&root).unwrap();
        let lib = &files.iter().find(|f| f.module.is_empty()).unwrap().text;
        assert!(
            lib.lines()
                .any(|l| l.starts_with("#![deny(") && l.contains(" unsafe_code,")),
            "src/lib.rs denies `unsafe_code`"
        );
        let sites = unsafe_sites(&files);
        assert!(
            sites.whole.contains("sys") && sites.items.contains("qp"),
            "found the sites: {sites:?}"
        );
        for doc in ["docs/architecture.md", "src/sys/mod.rs"] {
            let text = std::fs::read_to_string(root.join(doc)).unwrap();
            let listed = listed_sites(&text)
                .unwrap_or_else(|| panic!("{doc}: no list of bullets under \"Where `unsafe` is allowed\""));
            assert_eq!(
                listed, sites,
                "{doc}'s list of where `unsafe` is allowed (left) differs from the `allow(unsafe_code)` \
                 sites (right)"
            );
        }
    }

    #[test]
    fn the_source_scanners_read_what_they_should() {
        assert_eq!(module_declared("pub(crate) mod layout_check;"), Some("layout_check"));
        assert_eq!(module_declared("mod tests {"), Some("tests"));
        assert_eq!(module_declared("pub fn module() {}"), None);
        assert!(has_unsafe(&code_only("let x = unsafe { *p };")));
        assert!(!has_unsafe(&code_only(
            "#![deny(unsafe_code, unsafe_op_in_unsafe_fn)]\n// unsafe\n/// an unsafe fn\nlet s = \"unsafe\";"
        )));
        let file = |module: &str, text: &str| LibFile {
            path: String::new(),
            module: module.to_string(),
            text: text.to_string(),
        };
        let a = file(
            "a",
            "#[cfg(test)]\n#[allow(unsafe_code)] // why\nmod tests {\n    #[test]\n    fn t() {}\n}\n\
             #[cfg(all(test, not(miri)))]\npub(super) mod slow {\n}\n#[cfg(test)]\nmod other;\n\
             #[allow(unsafe_code)]\n// SAFETY: ...\nunsafe impl Send for X {}\n",
        );
        assert_eq!(test_modules(&a), ["a::tests", "a::slow"]);
        assert_eq!(test_modules(&file("a::b", "#[test]\nfn t() {}\n")), ["a::b"]);
        assert!(selected("a::b::tests", &["a::b"]) && !selected("a::bc::tests", &["a::b"]));
        let root = file(
            "",
            "#[allow(unsafe_code)] // why\n#[path = \"x\"]\nmod m;\n#[cfg(feature = \"test-x\")]\n\
             #[allow(unsafe_code)]\npub mod stub;\n",
        );
        let inner = file("m::n", "#![allow(unsafe_code)]\n");
        let sites = unsafe_sites(&[a, root, inner]);
        assert_eq!(sites.whole, BTreeSet::from(["m".into(), "m::n".into(), "stub".into()]));
        assert_eq!(sites.items, BTreeSet::from(["a".to_string()]));
        let doc = "//! x\n//! Where `unsafe` is allowed:\n//!\n//! - `m`: whole\n//! - `m::n` (note `q`): whole\n\
                   //! - items of `a`, `b::c`: why: more\n//!\n//! - `later`: not in the list\n";
        let listed = listed_sites(doc).unwrap();
        assert_eq!(listed.whole, BTreeSet::from(["m".to_string(), "m::n".to_string()]));
        assert_eq!(listed.items, BTreeSet::from(["a".to_string(), "b::c".to_string()]));
        assert_eq!(
            path_mounts("#[path = \"../providers/mod.rs\"]\n#[allow(unsafe_code)]\nmod providers;"),
            [("providers".to_string(), "providers".to_string())]
        );
        assert_eq!(
            workspace_members("members = [\".\", \"xtask\", \"p/q\"]"),
            ["xtask", "p/q"]
        );
    }

    fn src() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../src")
    }

    #[test]
    fn no_import_loop_among_core_modules() {
        let graph = library_imports(&src()).unwrap();
        assert!(graph.len() > 10, "read the modules of src/: {graph:?}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("src/ modules import each other in a loop: {}", cycle.join(" -> "));
        }
    }

    /// The core reaches vendor code only through the table in `providers/mod.rs`.
    #[test]
    fn the_core_names_no_vendor() {
        let graph = library_imports(&src()).unwrap();
        for vendor in ["providers::rxe", "providers::mlx5"] {
            assert!(graph.contains_key(vendor), "read {vendor}: {graph:?}");
        }
        for (module, names) in graph.iter().filter(|(m, _)| !m.starts_with("providers")) {
            let vendors: Vec<&String> = names.iter().filter(|n| n.starts_with("providers::")).collect();
            assert!(vendors.is_empty(), "the core module `{module}` names {vendors:?}");
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

    /// The libibverbs front end's modules, as the library's: no file of one imports another
    /// that imports it back, however long the way round.
    #[test]
    fn no_import_loop_among_dropin_modules() {
        let dropin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dropin/libibverbs/src");
        let graph = module_imports(&dropin).unwrap();
        assert!(graph.len() > 10, "read the modules of the drop-in: {graph:?}");
        assert!(graph["ops"].contains("qp"), "read crate:: paths: {graph:?}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("drop-in modules import each other in a loop: {}", cycle.join(" -> "));
        }
    }

    /// The vendor contract (the traits of `src/provider.rs` and their reference,
    /// docs/provider-contract.md) names nothing only a front end uses: posting chains in
    /// libibverbs' layout is the front-end interface of `src/front_end.rs`, documented with the
    /// drop-in (docs/libibverbs-provider.md).
    #[test]
    fn the_vendor_contract_names_no_front_end_item() {
        let front_end = [
            "post_send_chain",
            "post_send_batch",
            "SendChain",
            "ChainWr",
            "ChainQueues",
            "front_end",
            "CSendWr",
            "SlowDecode",
            "crate::chain",
            "drop-in",
        ];
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (file, extra) in [
            ("src/provider.rs", &["libibverbs", "ibv_"][..]),
            ("docs/provider-contract.md", &[][..]),
        ] {
            let text = std::fs::read_to_string(root.join(file)).unwrap();
            assert!(text.contains("QpQueues"), "read {file}");
            for name in front_end.iter().chain(extra) {
                assert!(
                    !text.contains(name),
                    "{file} names `{name}`, which only a front end uses"
                );
            }
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
        assert_eq!(
            crate_paths("use crate::{ah, qp::{self, Qp}, srq};\nuse crate::{\n"),
            ["ah", "qp", "srq"]
        );
    }
}
