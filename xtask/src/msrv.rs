//! `cargo xtask msrv` (also a host step of `cargo xtask test`): the `rust-version` that
//! Cargo.toml declares for `uverbs`, checked as far as the one toolchain this machine has can
//! check it, without compiling on that older Rust:
//!
//! 1. no library dependency (normal and build dependencies, every feature on, for Linux on
//!    x86-64, as locked in Cargo.lock) declares a `rust-version` above it;
//! 2. clippy's `incompatible_msrv` finds no standard-library item stabilized after it in the
//!    library (every feature on);
//! 3. the library (every feature on, the locked dependencies) compiles with that Rust
//!    (`cargo check`, in `target/msrv`), which rustup installs (minimal profile) when it is
//!    missing: this is what catches language features newer than the declared version.

use crate::error::{bail, Context, Result};
use crate::toolchain::cargo;
use crate::{paths, proc};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Deserialize)]
struct Metadata {
    packages: Vec<Package>,
    resolve: Resolve,
}

#[derive(Deserialize)]
struct Package {
    id: String,
    name: String,
    version: String,
    rust_version: Option<String>,
    /// The native library the package links (`links = "..."` in its manifest); only a test
    /// reads it.
    #[cfg(test)]
    links: Option<String>,
}

#[derive(Deserialize)]
struct Resolve {
    nodes: Vec<Node>,
}

#[derive(Deserialize)]
struct Node {
    id: String,
    deps: Vec<NodeDep>,
}

#[derive(Deserialize)]
struct NodeDep {
    pkg: String,
    dep_kinds: Vec<DepKind>,
}

#[derive(Deserialize)]
struct DepKind {
    /// `None` for a normal dependency, `"dev"` or `"build"`.
    kind: Option<String>,
}

/// `1.80` or `1.80.1` as comparable numbers (a missing patch is 0).
fn version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split('.').map(str::parse::<u32>);
    let major = parts.next()?.ok()?;
    let minor = parts.next().unwrap_or(Ok(0)).ok()?;
    let patch = parts.next().unwrap_or(Ok(0)).ok()?;
    Some((major, minor, patch))
}

/// The packages the library `root` pulls in (itself excluded) whose `rust-version` is above
/// its own, as `name version (rust-version)`.
fn newer_dependencies(meta: &Metadata, root: &str) -> Result<(String, Vec<String>)> {
    let packages: BTreeMap<&str, &Package> = meta.packages.iter().map(|p| (p.id.as_str(), p)).collect();
    let nodes: BTreeMap<&str, &Node> = meta.resolve.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let root_pkg = meta
        .packages
        .iter()
        .find(|p| p.name == root)
        .with_context(|| format!("no package `{root}` in cargo metadata"))?;
    let declared = root_pkg
        .rust_version
        .clone()
        .with_context(|| format!("`{root}` declares no rust-version"))?;
    let msrv = version(&declared).with_context(|| format!("rust-version {declared}"))?;
    let mut seen = BTreeSet::new();
    let mut todo = vec![root_pkg.id.as_str()];
    let mut newer = Vec::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        let Some(node) = nodes.get(id) else { continue };
        for d in &node.deps {
            if d.dep_kinds.iter().any(|k| k.kind.as_deref() != Some("dev")) {
                todo.push(d.pkg.as_str());
            }
        }
        let p = packages
            .get(id)
            .with_context(|| format!("package {id} not in cargo metadata"))?;
        if let Some(rv) = &p.rust_version {
            if id != root_pkg.id && version(rv).is_some_and(|v| v > msrv) {
                newer.push(format!("{} {} (rust-version {rv})", p.name, p.version));
            }
        }
    }
    Ok((declared, newer))
}

/// The packages the library `root` pulls in (normal and build dependencies, itself
/// included) that link a native library, as `name (links)`: none, so that a binary on the
/// library needs no C library beyond what Rust's standard library links (README: `ldd` shows
/// libc and libgcc_s).
#[cfg(test)]
fn native_links(meta: &Metadata, root: &str) -> Vec<String> {
    let packages: BTreeMap<&str, &Package> = meta.packages.iter().map(|p| (p.id.as_str(), p)).collect();
    let nodes: BTreeMap<&str, &Node> = meta.resolve.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let mut todo: Vec<&str> = meta
        .packages
        .iter()
        .filter(|p| p.name == root)
        .map(|p| p.id.as_str())
        .collect();
    let (mut seen, mut out) = (BTreeSet::new(), Vec::new());
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        for d in nodes.get(id).map_or(&[][..], |n| &n.deps[..]) {
            if d.dep_kinds.iter().any(|k| k.kind.as_deref() != Some("dev")) {
                todo.push(d.pkg.as_str());
            }
        }
        if let Some(links) = packages.get(id).and_then(|p| p.links.as_ref()) {
            out.push(format!("{} ({links})", packages[id].name));
        }
    }
    out
}

/// `cargo metadata` of the workspace, every feature on, for Linux on x86-64, as locked.
fn metadata() -> Result<Metadata> {
    let mut c = cargo();
    c.args([
        "metadata",
        "--format-version",
        "1",
        "--locked",
        "--all-features",
        "--filter-platform",
        "x86_64-unknown-linux-gnu",
    ]);
    note!("xtask: {}", proc::describe(&c));
    let out = c.output().context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_slice(&out.stdout).context("reading cargo metadata")
}

/// Runs the three checks.
pub fn check() -> Result<()> {
    let meta = metadata()?;
    let (declared, newer) = newer_dependencies(&meta, "uverbs")?;
    if !newer.is_empty() {
        bail!(
            "uverbs declares rust-version {declared}, but these dependencies need more: {}",
            newer.join(", ")
        );
    }
    note!("xtask: msrv: no dependency of uverbs needs more than rust-version {declared}");
    let mut clippy = cargo();
    clippy.args([
        "clippy",
        "-p",
        "uverbs",
        "--lib",
        "--all-features",
        "--",
        "-A",
        "clippy::all",
        "-D",
        "clippy::incompatible_msrv",
    ]);
    note!("xtask: {}", proc::describe(&clippy));
    proc::check(&mut clippy).context("standard-library items newer than the declared rust-version")?;
    note!("xtask: msrv: no standard-library item newer than {declared}");
    compile_with(&declared)?;
    note!("xtask: msrv: the library compiles with Rust {declared}");
    Ok(())
}

/// `cargo check` of the library, every feature on, with Rust `version`, installed with rustup
/// if missing.
fn compile_with(version: &str) -> Result<()> {
    let installed = || {
        crate::toolchain::toolchain_cargo(version)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !installed() {
        let mut install = std::process::Command::new("rustup");
        install.args(["toolchain", "install", version, "--profile", "minimal"]);
        note!("xtask: msrv: Rust {version} is missing; {}", proc::describe(&install));
        if proc::check(&mut install).is_err() || !installed() {
            bail!("rustup could not install Rust {version}; on a machine that can, run `rustup toolchain install {version} --profile minimal`");
        }
    }
    let mut c = crate::toolchain::toolchain_cargo(version);
    c.current_dir(paths::root())
        .env("CARGO_TARGET_DIR", paths::target_dir().join("msrv"))
        .args(["check", "-p", "uverbs", "--lib", "--all-features", "--locked"]);
    note!("xtask: {}", proc::describe(&c));
    proc::check(&mut c).with_context(|| format!("the library does not compile with Rust {version}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_with_a_missing_patch_as_zero() {
        assert_eq!(version("1.80"), Some((1, 80, 0)));
        assert!(version("1.85").unwrap() > version("1.80.1").unwrap());
        assert_eq!(version("x"), None);
    }

    #[test]
    fn dependencies_newer_than_the_root_are_named_dev_ones_skipped() {
        let meta: Metadata = serde_json::from_str(
            r#"{"packages":[
                {"id":"r","name":"root","version":"0.1.0","rust_version":"1.80"},
                {"id":"a","name":"a","version":"1.0.0","rust_version":"1.85"},
                {"id":"b","name":"b","version":"2.0.0","rust_version":"1.70"},
                {"id":"d","name":"d","version":"3.0.0","rust_version":"1.95"}],
             "resolve":{"nodes":[
                {"id":"r","deps":[{"pkg":"b","dep_kinds":[{"kind":null}]},{"pkg":"d","dep_kinds":[{"kind":"dev"}]}]},
                {"id":"b","deps":[{"pkg":"a","dep_kinds":[{"kind":"build"}]}]},
                {"id":"a","deps":[]},{"id":"d","deps":[]}]}}"#,
        )
        .unwrap();
        let (declared, newer) = newer_dependencies(&meta, "root").unwrap();
        assert_eq!(declared, "1.80");
        assert_eq!(newer, ["a 1.0.0 (rust-version 1.85)"]);
        assert!(native_links(&meta, "root").is_empty());
        let meta: Metadata = serde_json::from_str(
            r#"{"packages":[
                {"id":"r","name":"root","version":"0.1.0","rust_version":"1.80"},
                {"id":"s","name":"s-sys","version":"1.0.0","links":"s"},
                {"id":"t","name":"t-sys","version":"1.0.0","links":"t"}],
             "resolve":{"nodes":[
                {"id":"r","deps":[{"pkg":"s","dep_kinds":[{"kind":"build"}]},{"pkg":"t","dep_kinds":[{"kind":"dev"}]}]},
                {"id":"s","deps":[]},{"id":"t","deps":[]}]}}"#,
        )
        .unwrap();
        assert_eq!(native_links(&meta, "root"), ["s-sys (s)"]);
    }

    /// README: no libibverbs, no C library: no package the library pulls in links one.
    #[test]
    fn the_library_links_no_native_library() {
        let meta = metadata().unwrap();
        assert!(meta.packages.iter().any(|p| p.name == "nix"), "read the packages");
        assert_eq!(native_links(&meta, "uverbs"), Vec::<String>::new());
    }
}
