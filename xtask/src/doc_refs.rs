//! What the documentation names is there, as unit tests:
//!
//! - every repository path that README.md, docs/*.md and the comments of the workspace's Rust
//!   files, manifests and shell scripts name (`src/sys/cmd.rs`, `providers/<vendor>/`, `tests/*.rs`, a Markdown link, a
//!   Rust file or script named bare in Markdown) is a file or folder of the tree, and a test
//!   named after its file (`tests/rc.rs::` and the name) is defined there (CHANGELOG.md is
//!   history: not read);
//! - every Rust path docs/*.md and README.md name in the `uverbs` crate
//!   (`uverbs::aio::AsyncCq`, `providers::rxe::queue::tests`, `sys::cmd::execute_plain`) is a
//!   module of it and, where it goes on, an item of that module; a `Type::member` of the
//!   workspace's types (`Qp::send_buf`, `Error::NoProvider`) is a name the workspace's code
//!   defines or uses (a method, field or variant; comments and strings do not count);
//! - docs/architecture.md's table "The tree" has a row, one line, for each top-level folder
//!   and names each crate of the repository;
//! - docs/provider-contract.md's "each hook the stub logs" is checked by
//!   `tests/provider_contract.rs`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The top-level folders a repository path in prose starts with.
const TOP_FOLDERS: [&str; 11] = [
    "src/",
    "providers/",
    "dropin/",
    "tests/",
    "benches/",
    "docs/",
    "examples/",
    "xtask/",
    "fuzz/",
    ".ci/",
    ".cargo/",
];

/// Where the scanned prose is: the Markdown files, and the folders whose `.rs` files'
/// comments (`//!` module docs, `///` item docs, `//` notes) are read.
const MARKDOWN: [&str; 2] = ["README.md", "docs"];
const CODE_FOLDERS: [&str; 8] = [
    "src",
    "providers",
    "dropin",
    "tests",
    "xtask",
    "examples",
    "benches",
    "fuzz",
];

/// Characters that end a path token in prose: white space, quoting, brackets, list and table
/// punctuation.
fn delimiter(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            '`' | '(' | ')' | '[' | ']' | '"' | '\'' | '’' | ',' | ';' | '|' | '{' | '}' | '='
        )
}

/// The repository paths in `line`: tokens starting with a top-level folder (`src/qp.rs`) or
/// naming a top-level file in capitals (`README.md`), without their anchor (`#part`), line
/// suffix (`:12`, `:12-30`), item (`::name`) or trailing punctuation.
fn paths_in(line: &str) -> Vec<String> {
    path_refs(line).into_iter().map(|(path, _)| path).collect()
}

/// [`paths_in`], each with the item named after a Rust file's path, if any
/// (`tests/rc.rs::qp_moved_to_err_flushes_each_receive_once` gives that test's name).
fn path_refs(line: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for token in line.split(delimiter) {
        let mut t = token;
        if let Some(at) = t.find('#') {
            t = &t[..at];
        }
        let mut item = None;
        if let Some(at) = t.find("::") {
            let name = &t[at + 2..];
            let end = name
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(name.len());
            item = (end > 0 && t[..at].ends_with(".rs")).then(|| name[..end].to_string());
            t = &t[..at];
        }
        t = t.trim_end_matches(['.', ',', ':', ';', '!', '?']);
        // `:12` or `:12-30` after a file name.
        if let Some((file, suffix)) = t.rsplit_once(':') {
            if !suffix.is_empty() && suffix.chars().all(|c| c.is_ascii_digit() || c == '-') {
                t = file;
            }
        }
        let top_file = t.ends_with(".md")
            && !t.contains('/')
            && t[..t.len() - 3]
                .chars()
                .all(|c| c.is_ascii_uppercase() || c == '_' || c == '-')
            && t.len() > 3;
        if TOP_FOLDERS.iter().any(|f| t.starts_with(f)) || top_file || t == "Cargo.toml" || t == "Cargo.lock" {
            out.push((t.to_string(), item));
        }
    }
    out
}

/// The Rust files and shell scripts `line` names bare, in backticks (`` `lib.rs` ``): this
/// repository's kinds of source, where a C file is more likely the kernel's or rdma-core's.
fn bare_file_names(line: &str) -> Vec<&str> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| {
            (t.ends_with(".rs") || t.ends_with(".sh"))
                && t.len() > 3
                && t.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
        })
        .collect()
}

/// The targets of the Markdown links in `line` that are no URL and no anchor on the same page
/// (`[text](docs/verbs.md#part)` gives `docs/verbs.md`), relative to the Markdown file's folder.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split_whitespace().next().unwrap_or_default();
        let target = target.split('#').next().unwrap_or_default();
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target.to_string());
        }
        rest = &rest[end..];
    }
    out
}

/// Whether `pattern` (`providers/<vendor>/mod.rs`, `tests/*.rs`) matches a path of the tree
/// under `root`: `<...>` and `*` stand for any part of one name, `**` for any folders.
fn template_matches(root: &Path, pattern: &str) -> bool {
    let parts: Vec<&str> = pattern.trim_end_matches('/').split('/').collect();
    fn walk(dir: &Path, parts: &[&str]) -> bool {
        let Some((first, rest)) = parts.split_first() else {
            return true;
        };
        if *first == "**" {
            if walk(dir, rest) {
                return true;
            }
            return children(dir).iter().any(|(_, p)| p.is_dir() && walk(p, parts));
        }
        if !first.contains('*') && !first.contains('<') {
            let next = dir.join(first);
            return next.exists() && walk(&next, rest);
        }
        children(dir)
            .iter()
            .any(|(name, p)| name_matches(first, name) && walk(p, rest))
    }
    fn children(dir: &Path) -> Vec<(String, PathBuf)> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .collect()
    }
    walk(root, &parts)
}

/// Whether one path name matches a name pattern: `*` and `<...>` stand for any text.
fn name_matches(pattern: &str, name: &str) -> bool {
    // The pattern's literal pieces, in order, the first at the start and the last at the end.
    let mut pieces = Vec::new();
    let mut piece = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '*' => pieces.push(std::mem::take(&mut piece)),
            '<' => {
                pieces.push(std::mem::take(&mut piece));
                for d in chars.by_ref() {
                    if d == '>' {
                        break;
                    }
                }
            }
            _ => piece.push(c),
        }
    }
    pieces.push(piece);
    let (first, last) = (&pieces[0], &pieces[pieces.len() - 1]);
    if !name.starts_with(first.as_str()) || name.len() < first.len() + last.len() || !name.ends_with(last.as_str()) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for p in &pieces[1..pieces.len() - 1] {
        match rest.find(p.as_str()) {
            Some(at) => rest = &rest[at + p.len()..],
            None => return false,
        }
    }
    true
}

/// Whether the path `path` named in prose is there: from the repository root, or from the
/// root of the crate whose file names it (the mlx5 model's comments name its files from its
/// own folder).
/// A template matches some path of the tree.
/// A path without `.rs` names the program built from that file (`examples/demo`).
/// A path in a folder git ignores (`target/`, `fuzz/corpus/`) is an output and not checked.
fn exists(root: &Path, crate_root: &Path, path: &str) -> bool {
    [root, crate_root].iter().any(|base| {
        if ignored(base, path) {
            true
        } else if path.contains('*') || path.contains('<') {
            template_matches(base, path)
        } else {
            base.join(path).exists() || base.join(format!("{path}.rs")).is_file()
        }
    })
}

/// Whether `path`, from `base`, is in a folder that the `.gitignore` of the folder above it
/// names (`/target` in the root's, `corpus` in `fuzz/`'s).
fn ignored(base: &Path, path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let mut dir = base.to_path_buf();
    for part in parts {
        let ignore = std::fs::read_to_string(dir.join(".gitignore")).unwrap_or_default();
        let listed = ignore.lines().map(str::trim).any(|l| {
            let l = l.trim_start_matches('/').trim_end_matches('/');
            l == part
        });
        if listed {
            return true;
        }
        dir = dir.join(part);
    }
    false
}

/// The files whose prose is scanned, with the text to scan: Markdown whole, Rust files their
/// comments (each line's text after its `//`, line numbers kept).
fn prose_files(root: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for entry in MARKDOWN {
        let path = root.join(entry);
        let files = if path.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(&path)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "md"))
                .collect();
            v.sort();
            v
        } else {
            vec![path]
        };
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            out.push((file, text));
        }
    }
    for folder in CODE_FOLDERS {
        let mut files = Vec::new();
        rust_files(&root.join(folder), &mut files);
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let comments: String = text
                .lines()
                .map(|l| match l.split_once("//").map(|(_, c)| c) {
                    Some(d) => format!("{d}\n"),
                    None => "\n".to_string(),
                })
                .collect();
            out.push((file, comments));
        }
    }
    // Manifests and shell scripts: their `#` comments.
    let mut scripts: Vec<String> = tracked_files(root)
        .into_iter()
        .filter(|f| f.ends_with(".toml") || f.ends_with(".sh") || f == ".ci/run")
        .collect();
    scripts.sort();
    for file in scripts {
        let Ok(text) = std::fs::read_to_string(root.join(&file)) else {
            continue;
        };
        let comments: String = text
            .lines()
            .map(|l| match l.trim_start().strip_prefix('#') {
                Some(c) if !c.starts_with('!') && !c.starts_with('[') => format!("{c}\n"),
                _ => "\n".to_string(),
            })
            .collect();
        out.push((root.join(file), comments));
    }
    out
}

/// Every `.rs` file under `dir`, but in build outputs (`target/`).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The folder of the crate `file` belongs to: the nearest folder above it with a
/// `Cargo.toml`.
fn crate_root(root: &Path, file: &Path) -> PathBuf {
    file.ancestors()
        .skip(1)
        .take_while(|a| a.starts_with(root))
        .find(|a| a.join("Cargo.toml").is_file())
        .unwrap_or(root)
        .to_path_buf()
}

/// The repository paths the prose of the files `files` names that are not there, as
/// `file:line: path`; in Markdown, also a Rust file or shell script named bare (`` `ops.rs` ``)
/// that is no file of the tree, in any folder.
fn missing_paths(root: &Path, files: &[(PathBuf, String)]) -> Vec<String> {
    let mut missing = Vec::new();
    let tracked = tracked_files(root);
    let names: BTreeSet<&str> = tracked.iter().map(|f| f.rsplit('/').next().unwrap_or(f)).collect();
    for (file, text) in files {
        let rel = file.strip_prefix(root).unwrap_or(file).display().to_string();
        let crate_root = crate_root(root, file);
        let markdown = file.extension().is_some_and(|e| e == "md");
        let folder = file.parent().unwrap_or(root);
        for (n, line) in text.lines().enumerate() {
            for (path, item) in path_refs(line) {
                if !exists(root, &crate_root, &path) {
                    missing.push(format!("{rel}:{}: {path}", n + 1));
                } else if let Some(item) = item {
                    // The file from whichever base it is in (templates name no item).
                    let text = [root, crate_root.as_path()]
                        .iter()
                        .find_map(|base| std::fs::read_to_string(base.join(&path)).ok())
                        .unwrap_or_default();
                    if !defines(&text, &item) && !macro_invoked_defines(&text, &item) {
                        missing.push(format!("{rel}:{}: {path}::{item} (no `{item}` there)", n + 1));
                    }
                }
            }
            if markdown {
                for name in bare_file_names(line) {
                    if !names.contains(name) {
                        missing.push(format!("{rel}:{}: `{name}` (no file of that name)", n + 1));
                    }
                }
                for target in link_targets(line) {
                    if !exists(folder, folder, &target) {
                        missing.push(format!("{rel}:{}: link ({target})", n + 1));
                    }
                }
            }
        }
    }
    missing
}

/// A module of the `uverbs` crate: the file it is in and the folder its child modules' files
/// are in. An inline module (`mod tests {`) is its file's.
struct Module {
    file: PathBuf,
    dir: PathBuf,
    text: String,
}

impl Module {
    fn at(file: PathBuf, dir: PathBuf) -> Option<Module> {
        let text = std::fs::read_to_string(&file).ok()?;
        Some(Module { file, dir, text })
    }

    /// The child module `name`, if this one declares it (`mod name;`, `mod name {`,
    /// `#[path = ".."] mod name;`).
    fn child(&self, name: &str) -> Option<Module> {
        let lines: Vec<&str> = self.text.lines().collect();
        let at = lines
            .iter()
            .position(|l| crate::architecture::module_declared(l) == Some(name))?;
        let decl = lines[at].trim_end();
        if decl.ends_with('{') {
            return Some(Module {
                file: self.file.clone(),
                dir: self.dir.join(name),
                text: self.text.clone(),
            });
        }
        let path_attr = lines[..at]
            .iter()
            .rev()
            .map(|l| l.trim())
            .take_while(|l| l.starts_with("#[") || l.starts_with("//"))
            .find_map(|l| l.strip_prefix("#[path = \"").and_then(|l| l.strip_suffix("\"]")));
        if let Some(p) = path_attr {
            let file = self.file.parent()?.join(p);
            let dir = file.parent()?.to_path_buf();
            return Module::at(file, dir);
        }
        let file = self.dir.join(format!("{name}.rs"));
        if file.is_file() {
            return Module::at(file, self.dir.join(name));
        }
        Module::at(self.dir.join(name).join("mod.rs"), self.dir.join(name))
    }

    /// Whether this module defines or re-exports an item `name` (`fn name`, `struct name`,
    /// `pub use m::{name}`, a `macro_rules! name`).
    fn has_item(&self, name: &str) -> bool {
        defines(&self.text, name) || {
            let code = crate::architecture::code_only(&self.text);
            code.split(';')
                .filter(|s| s.contains("use "))
                .any(|s| words(s).any(|w| w == name))
        }
    }
}

/// Whether `text` invokes a macro of `crate_text` (`kernel_layouts! {`) whose definition
/// defines `name` (`mod kernel_layout`, `fn matches_kernel_headers`).
fn macro_generates(text: &str, crate_text: &str, name: &str) -> bool {
    crate_text.match_indices("macro_rules! ").any(|(at, _)| {
        let rest = &crate_text[at + "macro_rules! ".len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let body = &rest[..rest.find("\n}").unwrap_or(rest.len())];
        end > 0 && text.contains(&format!("{}!", &rest[..end])) && defines(body, name)
    })
}

/// [`macro_generates`] with the macros of `text` itself (a test file's `macro_rules!`).
fn macro_invoked_defines(text: &str, name: &str) -> bool {
    macro_generates(text, text, name)
}

/// Whether `text` has a struct field `name` (a line `pub name: T,` or `name: T,`).
fn has_field(text: &str, name: &str) -> bool {
    text.lines().any(|l| field_name(l) == Some(name))
}

/// The field `line` declares or sets (`pub(crate) name: T,`, `name: value,`), if it does.
fn field_name(line: &str) -> Option<&str> {
    let mut l = line.trim_start();
    if let Some(r) = l.strip_prefix("pub") {
        l = r.trim_start();
        if l.starts_with('(') {
            l = l[l.find(')')? + 1..].trim_start();
        }
    }
    let end = l.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    let rest = &l[end..];
    (end > 0 && rest.starts_with(':') && !rest.starts_with("::")).then(|| &l[..end])
}

/// The identifiers in `text`.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

/// Whether `text` defines `name` with an item keyword (`fn name`, `struct name`, ...).
fn defines(text: &str, name: &str) -> bool {
    const KEYWORDS: [&str; 10] = [
        "fn",
        "struct",
        "enum",
        "trait",
        "const",
        "type",
        "static",
        "mod",
        "union",
        "macro_rules!",
    ];
    text.lines().any(|line| {
        let mut prev: Option<&str> = None;
        for w in line.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '!')) {
            if w.is_empty() {
                continue;
            }
            if w == name && prev.is_some_and(|p| KEYWORDS.contains(&p)) {
                return true;
            }
            prev = Some(w);
        }
        false
    })
}

/// The first names of the Rust paths docs check: the crate's own name and what names the
/// library's modules only (its top-level modules that no other crate of the workspace, nor
/// the integration tests' shared folders, has a module of that name).
fn checked_heads(root: &Path) -> BTreeSet<String> {
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let mut heads: BTreeSet<String> = lib
        .lines()
        .filter_map(crate::architecture::module_declared)
        .map(str::to_string)
        .collect();
    let mut others = BTreeSet::from(["tests".to_string()]);
    for dir in [
        "dropin/libibverbs/src",
        "tests/mlx5/model/src",
        "xtask/src",
        "tests",
        "fuzz/fuzz_targets",
    ] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap().flatten() {
            // `tests/`'s files are test crates, not modules; its folders are (`common`).
            if dir == "tests" && !entry.path().is_dir() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            others.insert(name.trim_end_matches(".rs").to_string());
        }
    }
    heads.retain(|h| !others.contains(h));
    heads.insert("uverbs".to_string());
    heads.insert("crate".to_string());
    heads
}

/// The Rust paths in backticks in `line` whose first name is one of `heads`, as far as they
/// go (`uverbs::open(None)` gives `uverbs::open`).
fn rust_paths_in(line: &str, heads: &BTreeSet<String>) -> Vec<String> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|code| {
            let end = code
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(code.len());
            let path = code[..end].trim_end_matches(':');
            let (head, _) = path.split_once("::")?;
            heads.contains(head).then(|| path.to_string())
        })
        .collect()
}

/// Why the Rust path `path` of the `uverbs` crate is not there, if it is not: its modules are
/// modules of the crate; the name after the last module is an item of it; a name after that
/// (a method, a variant) is defined in the crate (`fn name`) or, capitalised, named in it.
fn check_rust_path(root: &Path, crate_text: &str, path: &str) -> Result<(), String> {
    let mut module = Module::at(root.join("src/lib.rs"), root.join("src")).ok_or("no src/lib.rs")?;
    let mut names = path.split("::").skip(1).peekable();
    let mut item = None;
    for name in names.by_ref() {
        match module.child(name) {
            Some(m) => module = m,
            None => {
                item = Some(name);
                break;
            }
        }
    }
    let Some(item) = item else {
        return Ok(());
    };
    if !module.has_item(item) && !macro_generates(&module.text, crate_text, item) {
        return Err(format!(
            "no `{item}` in {}",
            module.file.strip_prefix(root).unwrap_or(&module.file).display()
        ));
    }
    for name in names {
        let found = if name.starts_with(|c: char| c.is_lowercase()) {
            defines(crate_text, name) || has_field(crate_text, name)
        } else {
            words(crate_text).any(|w| w == name)
        };
        if !found {
            return Err(format!("no `{name}` in the crate"));
        }
    }
    Ok(())
}

/// The Rust paths of the `uverbs` crate that README.md and docs/*.md name and that are not
/// there, and the members of the workspace's types they name (`Qp::send_buf`) that are
/// nowhere in it, as `file:line: path (why)`.
fn missing_rust_paths(root: &Path, files: &[(PathBuf, String)]) -> Vec<String> {
    let heads = checked_heads(root);
    let mut sources = Vec::new();
    rust_files(&root.join("src"), &mut sources);
    rust_files(&root.join("providers"), &mut sources);
    // Code only: a name that appears in a comment or a string is no item.
    let crate_text: String = sources
        .iter()
        .map(|f| crate::architecture::code_only(&std::fs::read_to_string(f).unwrap()))
        .collect::<Vec<_>>()
        .join("\n");
    // Members of the workspace's types (`Qp::send_buf`, `Model::drops`): any Rust file of it.
    let workspace_text: String = tracked_files(root)
        .iter()
        .filter(|f| f.ends_with(".rs"))
        .filter_map(|f| std::fs::read_to_string(root.join(f)).ok())
        .map(|t| crate::architecture::code_only(&t))
        .collect::<Vec<_>>()
        .join("\n");
    let types = defined_types(&workspace_text);
    let names = Names::of(&workspace_text);
    let mut missing = Vec::new();
    for (file, text) in files.iter().filter(|(f, _)| f.extension().is_some_and(|e| e == "md")) {
        let rel = file.strip_prefix(root).unwrap_or(file).display().to_string();
        for (n, line) in text.lines().enumerate() {
            for path in rust_paths_in(line, &heads) {
                let full = match path.split_once("::") {
                    Some(("uverbs" | "crate", _)) => path.clone(),
                    _ => format!("uverbs::{path}"),
                };
                if let Err(why) = check_rust_path(root, &crate_text, &full) {
                    missing.push(format!("{rel}:{}: {path} ({why})", n + 1));
                }
            }
            for (ty, member) in member_paths_in(line) {
                if types.contains(ty) && !names.has_member(member) {
                    missing.push(format!(
                        "{rel}:{}: {ty}::{member} (no `{member}` in the workspace)",
                        n + 1
                    ));
                }
            }
        }
    }
    missing
}

/// The `Type::member` paths in backticks in `line` (`Qp::send_buf`, `Error::NoProvider`).
fn member_paths_in(line: &str) -> Vec<(&str, &str)> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|code| {
            let (ty, rest) = code.split_once("::")?;
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let ok = ty.starts_with(|c: char| c.is_ascii_uppercase())
                && ty.chars().all(|c| c.is_alphanumeric() || c == '_')
                && end > 0;
            ok.then(|| (ty, &rest[..end]))
        })
        .collect()
}

/// The types `text` defines (`struct Name`, `enum`, `trait`, `type`, `union`).
fn defined_types(text: &str) -> BTreeSet<&str> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let mut prev = "";
        for w in words(line) {
            if matches!(prev, "struct" | "enum" | "trait" | "type" | "union")
                && w.starts_with(|c: char| c.is_ascii_uppercase())
            {
                out.insert(w);
            }
            prev = w;
        }
    }
    out
}

/// The names a workspace's Rust text has, to look members up in: the methods and fields it
/// defines (`fn name`, `name: T`), and every identifier.
struct Names {
    defined: BTreeSet<String>,
    words: BTreeSet<String>,
}

impl Names {
    fn of(text: &str) -> Names {
        let mut names = Names {
            defined: BTreeSet::new(),
            words: BTreeSet::new(),
        };
        for line in text.lines() {
            let mut prev = "";
            for w in words(line) {
                if prev == "fn" {
                    names.defined.insert(w.to_string());
                }
                names.words.insert(w.to_string());
                prev = w;
            }
            if let Some(field) = field_name(line) {
                names.defined.insert(field.to_string());
            }
        }
        names
    }

    /// Whether the member `name` of a type is there: a method or field for a lower-case name,
    /// named at all for a capitalised one (a variant, an associated constant).
    fn has_member(&self, name: &str) -> bool {
        if name.ends_with('_') {
            // A template (`Qp::post_*`): some method or field starts so.
            self.defined.iter().any(|d| d.starts_with(name))
        } else if name.starts_with(|c: char| c.is_lowercase() || c == '_') {
            self.defined.contains(name)
        } else {
            self.words.contains(name)
        }
    }
}

/// The rows of docs/architecture.md's table "The tree": `(folder, description)`.
fn tree_rows(doc: &str) -> Vec<(String, String)> {
    let Some(start) = doc.find("## The tree") else {
        return Vec::new();
    };
    let section = &doc[start + 2..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    section
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.strip_prefix('|')?.split('|').map(str::trim).collect();
            let folder = cells.first()?.strip_prefix('`')?.strip_suffix('`')?;
            Some((
                folder.to_string(),
                cells.get(1).copied().unwrap_or_default().to_string(),
            ))
        })
        .collect()
}

/// The repository's tracked files (`git ls-files`), or, without git, every file but those of
/// `.git` and `target`.
fn tracked_files(root: &Path) -> Vec<String> {
    let git = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output();
    if let Some(out) = git.ok().filter(|o| o.status.success() && !o.stdout.is_empty()) {
        return String::from_utf8_lossy(&out.stdout)
            .split('\0')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
    }
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if rel == ".git" || rel == "target" {
                continue;
            }
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out
}

/// A `Cargo.toml`'s package name.
fn package_name(manifest: &str) -> Option<String> {
    let package = &manifest[manifest.find("[package]")?..];
    let line = package.lines().find(|l| l.trim_start().starts_with("name"))?;
    Some(line.split('"').nth(1)?.to_string())
}

/// What docs/architecture.md's table "The tree" misses: a top-level folder without a row (nor
/// a row for the one folder inside it that holds all its files), a
/// crate (a tracked `Cargo.toml`) whose folder's row does not name it, a row whose folder is
/// not there.
fn tree_table_misses(root: &Path) -> Vec<String> {
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let rows = tree_rows(&doc);
    let mut misses = Vec::new();
    if rows.len() < 5 {
        misses.push(format!("read the table's rows: {rows:?}"));
    }
    let files = tracked_files(root);
    let top: BTreeSet<&str> = files
        .iter()
        .filter_map(|f| f.split_once('/').map(|(top, _)| top))
        .filter(|t| *t != "target")
        .collect();
    for folder in &top {
        // Its own row, or the row of the one folder that holds all it has (`dropin/libibverbs/`).
        let own = rows.iter().any(|(f, _)| f == &format!("{folder}/"));
        let inside: Vec<&String> = files.iter().filter(|f| f.starts_with(&format!("{folder}/"))).collect();
        let whole = rows.iter().any(|(f, _)| {
            f.starts_with(&format!("{folder}/")) && inside.iter().all(|file| file.starts_with(f.as_str()))
        });
        if !own && !whole {
            misses.push(format!("the top-level folder `{folder}/` has no row"));
        }
    }
    for manifest in files
        .iter()
        .filter(|f| *f == "Cargo.toml" || f.ends_with("/Cargo.toml"))
    {
        let folder = match manifest.strip_suffix("Cargo.toml").unwrap_or_default() {
            "" => "src/".to_string(),
            f => f.to_string(),
        };
        let text = std::fs::read_to_string(root.join(manifest)).unwrap();
        let Some(name) = package_name(&text) else {
            continue;
        };
        let named = rows
            .iter()
            .any(|(f, what)| *f == folder && what.contains(&format!("`{name}`")));
        if !named {
            misses.push(format!(
                "the row of `{folder}` does not name the crate `{name}` ({manifest})"
            ));
        }
    }
    for (folder, what) in &rows {
        if !root.join(folder).is_dir() {
            misses.push(format!("the row `{folder}` names no folder"));
        }
        if what.is_empty() {
            misses.push(format!("the row `{folder}` says nothing"));
        }
    }
    misses
}

/// The variants of the enum `name` in `text` (`pub enum Hook { AllocPd, CreateCq { .. } }`):
/// the capitalised names at the first indentation level inside it.
fn enum_variants<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let Some(at) = text.find(&format!("pub enum {name} {{")) else {
        return Vec::new();
    };
    text[at..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with('}'))
        .filter(|l| l.starts_with("    ") && !l.starts_with("     "))
        .filter(|l| !l.trim_start().starts_with("//") && !l.trim_start().starts_with('#'))
        .filter_map(|l| words(l).next())
        .filter(|w| w.starts_with(|c: char| c.is_ascii_uppercase()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// The prose of README.md, docs/*.md and the `//!` module docs names only paths that are
    /// there (CHANGELOG.md is history and is not read).
    #[test]
    fn every_path_the_docs_name_is_in_the_tree() {
        let root = root();
        let files = prose_files(&root);
        assert!(
            files.iter().any(|(f, _)| f.ends_with("docs/architecture.md"))
                && files.iter().any(|(f, _)| f.ends_with("src/sys/mod.rs"))
                && files.iter().any(|(f, _)| f.ends_with("tests/mlx5/model/src/lib.rs")),
            "read the prose"
        );
        // A new top-level folder's paths are scanned too.
        let top: BTreeSet<String> = tracked_files(&root)
            .iter()
            .filter_map(|f| f.split_once('/').map(|(top, _)| format!("{top}/")))
            .collect();
        assert_eq!(
            top,
            TOP_FOLDERS.iter().map(|f| f.to_string()).collect::<BTreeSet<_>>(),
            "TOP_FOLDERS (right) lists the top-level folders (left)"
        );
        let named: usize = files
            .iter()
            .map(|(_, t)| t.lines().map(|l| paths_in(l).len()).sum::<usize>())
            .sum();
        assert!(named > 100, "found the paths the prose names: {named}");
        let missing = missing_paths(&root, &files);
        assert!(
            missing.is_empty(),
            "paths the docs name that are not in the tree ({}):\n{}",
            missing.len(),
            missing.join("\n")
        );
    }

    /// docs/*.md and README.md name modules and items of the `uverbs` crate that are there.
    #[test]
    fn every_module_path_the_docs_name_is_in_the_crate() {
        let root = root();
        let files = prose_files(&root);
        let heads = checked_heads(&root);
        for h in ["uverbs", "providers", "sys", "aio", "held"] {
            assert!(heads.contains(h), "checks paths starting with `{h}`: {heads:?}");
        }
        for h in ["cq", "device", "tests"] {
            assert!(!heads.contains(h), "`{h}` is also another crate's module: {heads:?}");
        }
        let missing = missing_rust_paths(&root, &files);
        assert!(
            missing.is_empty(),
            "Rust paths the docs name that are not in the crate ({}):\n{}",
            missing.len(),
            missing.join("\n")
        );
    }

    /// docs/architecture.md's "The tree": a row, one line, for each top-level folder and each
    /// crate, naming a folder that is there.
    #[test]
    fn the_tree_table_has_every_top_level_folder_and_crate() {
        let misses = tree_table_misses(&root());
        assert!(
            misses.is_empty(),
            "docs/architecture.md, \"The tree\":\n{}",
            misses.join("\n")
        );
    }

    #[test]
    fn the_path_scanner_reads_prose() {
        assert_eq!(paths_in("see `src/sys/cmd.rs`, then"), ["src/sys/cmd.rs"]);
        assert_eq!(paths_in("in src/lib.rs, src/qp.rs."), ["src/lib.rs", "src/qp.rs"]);
        assert_eq!(paths_in("[x](docs/verbs.md#the-table)"), ["docs/verbs.md"]);
        assert_eq!(
            paths_in("(src/sys/cmd.rs:123) and src/a.rs:4-9:"),
            ["src/sys/cmd.rs", "src/a.rs"]
        );
        assert_eq!(paths_in("src/lib.rs's list"), ["src/lib.rs"]);
        assert_eq!(
            paths_in("`providers/<vendor>/` and tests/*.rs"),
            ["providers/<vendor>/", "tests/*.rs"]
        );
        assert_eq!(paths_in("`src/sys/cmd.rs::execute`"), ["src/sys/cmd.rs"]);
        assert_eq!(
            path_refs("tests/rc.rs::send_with_imm, `tests/common/mod.rs::loopback_gid`: src/x::y"),
            [
                ("tests/rc.rs".to_string(), Some("send_with_imm".to_string())),
                ("tests/common/mod.rs".to_string(), Some("loopback_gid".to_string())),
                ("src/x".to_string(), None)
            ]
        );
        assert_eq!(
            paths_in("README.md and DEVELOPERS.md, not x.md"),
            ["README.md", "DEVELOPERS.md"]
        );
        assert!(paths_in("/usr/src/linux, ../providers/mod.rs, rust-fuzz/x, kernel/ioctl").is_empty());
        assert_eq!(
            bare_file_names("`ops.rs` and `run.sh`, not `x.c`, `src/a.rs` or ops.rs"),
            ["ops.rs", "run.sh"]
        );
        assert_eq!(
            link_targets("[a](docs/x.md#y), [b](https://e.org/src/x), [c](#here), [d](../src/lib.rs)"),
            ["docs/x.md", "../src/lib.rs"]
        );
        let root = root();
        assert!(exists(&root, &root, "providers/<vendor>/mod.rs") && exists(&root, &root, "tests/*.rs"));
        assert!(exists(&root, &root, "src/**/mod.rs") && exists(&root, &root, "src/sys/"));
        assert!(!exists(&root, &root, "providers/<vendor>/nothing.rs") && !exists(&root, &root, "src/nothing.rs"));
        assert!(exists(&root, &root, "examples/demo") && !exists(&root, &root, "examples/nothing"));
        assert!(exists(&root, &root, "target/debug/nothing") && exists(&root, &root, "fuzz/corpus/nothing"));
        assert!(!exists(&root, &root, "fuzz/nothing/corpus"));
        assert!(name_matches("*.rs", "a.rs") && name_matches("x<n>y", "x12y") && !name_matches("*.rs", "a.c"));
        assert!(!name_matches("ab*ba", "aba"));
        let model = root.join("tests/mlx5/model");
        assert_eq!(crate_root(&root, &model.join("src/lib.rs")), model);
    }

    #[test]
    fn the_rust_path_scanner_reads_prose() {
        let heads = BTreeSet::from(["uverbs".to_string(), "sys".to_string()]);
        assert_eq!(
            rust_paths_in("`uverbs::open(None)`, `sys::cmd` and `cq::poll`, not uverbs::x", &heads),
            ["uverbs::open", "sys::cmd"]
        );
        let root = root();
        let crate_text = "fn post_send() {}\nenum E { Variant }";
        for good in [
            "uverbs::open",
            "uverbs::sys::cmd",
            "uverbs::providers::rxe::queue::tests",
            "uverbs::Qp::post_send",
            "uverbs::aio",
        ] {
            assert_eq!(check_rust_path(&root, crate_text, good), Ok(()), "{good}");
        }
        for bad in [
            "uverbs::no_such_item",
            "uverbs::sys::no_such_module::x",
            "uverbs::Qp::no_such_method",
            "uverbs::Qp::NoSuchVariant",
        ] {
            assert!(check_rust_path(&root, crate_text, bad).is_err(), "{bad}");
        }
        assert!(defines("pub(crate) unsafe fn name(", "name") && !defines("let name = 1;", "name"));
        assert!(has_field("    pub(crate) name: u32,", "name") && !has_field("name::x", "name"));
        let macros = "macro_rules! gen {\n    () => { mod made { fn test() {} } };\n}\nfn other() {}";
        assert!(macro_generates("gen! {}", macros, "made") && !macro_generates("gen! {}", macros, "other"));
        assert!(!macro_generates("no macro", macros, "made"));
    }

    #[test]
    fn the_member_scanner_reads_prose() {
        assert_eq!(
            member_paths_in("`Qp::send_buf(op, buf)`, `Error::NoProvider`, `uverbs::open`, `Qp::`, Qp::x"),
            [("Qp", "send_buf"), ("Error", "NoProvider")]
        );
        let text =
            "pub struct Qp {\n    pub(crate) depth: u32,\n}\nimpl Qp { pub fn send_buf() {} }\nenum E { NoProvider }";
        assert_eq!(defined_types(text), BTreeSet::from(["Qp", "E"]));
        let names = Names::of(text);
        assert!(names.has_member("send_buf") && names.has_member("depth") && names.has_member("NoProvider"));
        assert!(!names.has_member("recv_buf") && !names.has_member("Other"));
    }

    /// docs/provider-contract.md: `tests/provider_contract.rs` checks each hook the stub
    /// provider logs.
    #[test]
    fn the_contract_test_checks_every_hook_the_stub_logs() {
        let root = root();
        let stub = std::fs::read_to_string(root.join("src/provider/stub.rs")).unwrap();
        let test = std::fs::read_to_string(root.join("tests/provider_contract.rs")).unwrap();
        let hooks = enum_variants(&stub, "Hook");
        assert!(
            hooks.len() > 5 && hooks.contains(&"AllocPd"),
            "read the hooks: {hooks:?}"
        );
        let unchecked: Vec<&&str> = hooks.iter().filter(|h| !test.contains(&format!("Hook::{h}"))).collect();
        assert!(
            unchecked.is_empty(),
            "hooks of the stub provider that tests/provider_contract.rs never checks: {unchecked:?}"
        );
        let doc = std::fs::read_to_string(root.join("docs/provider-contract.md")).unwrap();
        assert!(doc.contains("each hook the stub logs"), "the statement this checks");
    }

    #[test]
    fn the_tree_table_reader_reads_rows() {
        assert_eq!(
            enum_variants(
                "pub enum H {\n    A,\n    /// doc\n    B {\n        x: u32,\n    },\n}\nC",
                "H"
            ),
            ["A", "B"]
        );
        let doc =
            "# A\n## The tree\n\n| Folder | What |\n| --- | --- |\n| `src/` | Crate `x`. |\n\n## Next\n| `no/` | x |\n";
        assert_eq!(tree_rows(doc), [("src/".to_string(), "Crate `x`.".to_string())]);
        assert_eq!(
            package_name("[package]\nname = \"uverbs-fuzz\"\n"),
            Some("uverbs-fuzz".to_string())
        );
    }
}
