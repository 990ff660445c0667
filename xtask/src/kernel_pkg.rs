//! Guest kernels from Debian packages that are not installed on the host: resolves a kernel
//! spec (`6.12`, `6.12.117+deb12-amd64`, `linux-image-6.12.117+deb12-amd64`, or a `.deb`
//! file) to a `linux-image-*` package, downloads it with `apt-get download`, unpacks it with
//! `dpkg -x` and indexes its modules with `depmod -b`, cached under
//! `target/guest/kernels/<package>_<version>/`. The guest mounts that modules directory at
//! `/lib/modules/<release>` (init.sh, `uverbs_modules=`), so `modprobe` finds the kernel's own
//! modules there.

use crate::error::{bail, Context, Result};
use crate::proc;
use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The parts of an unpacked kernel package the guest needs.
pub struct Unpacked {
    /// Release string, e.g. `6.12.117+deb12-amd64`.
    pub release: String,
    /// `boot/vmlinuz-<release>`.
    pub bzimage: PathBuf,
    /// `boot/config-<release>`.
    pub config: PathBuf,
    /// `lib/modules/<release>`, with the `modules.dep` that `depmod -b` wrote.
    pub modules: PathBuf,
    /// `<package>_<version>`, for cache keys.
    pub stamp: String,
}

/// Compares version strings, treating digit runs as numbers (`6.10` > `6.9`).
pub fn version_cmp(a: &str, b: &str) -> Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let b = s.as_bytes();
        for i in 1..=b.len() {
            if i == b.len() || b[i].is_ascii_digit() != b[start].is_ascii_digit() {
                out.push((b[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for (x, y) in ca.iter().zip(&cb) {
        let o = match (x, y) {
            ((true, x), (true, y)) => {
                let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
                x.len().cmp(&y.len()).then(x.cmp(y))
            }
            ((_, x), (_, y)) => x.cmp(y),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    ca.len().cmp(&cb.len())
}

/// Where unpacked packages live.
fn cache_root(cache: &Path) -> PathBuf {
    cache.join("kernels")
}

/// Whether `release` is what `spec` names: the release itself, or a version prefix of it
/// (`6.12` names `6.12.117+deb12-amd64`, `6.1` names `6.1.0-56-amd64` but not
/// `6.12.117+deb12-amd64`), of the plain `amd64` flavour (not `cloud-amd64`, `rt-amd64`).
pub fn names(spec: &str, release: &str) -> bool {
    if release == spec {
        return true;
    }
    let Some(rest) = release.strip_prefix(spec) else {
        return false;
    };
    if !(rest.starts_with('.') || rest.starts_with('-') || rest.starts_with('+')) {
        return false;
    }
    let Some(body) = release.strip_suffix("-amd64") else {
        return false;
    };
    // Every `-` component of the version part starts with a digit: `6.1.0-56`, not `6.1.0-56-rt`.
    body.split('-').all(|c| c.starts_with(|ch: char| ch.is_ascii_digit()))
}

/// Resolves `spec` to a package, and downloads and unpacks it unless it is cached.
pub fn prepare(spec: &str, cache: &Path) -> Result<Unpacked> {
    let (package, version, deb) = if spec.ends_with(".deb") {
        let deb = PathBuf::from(spec);
        if !deb.is_file() {
            bail!("{spec}: no such .deb file");
        }
        let out = proc::filter(
            Command::new("dpkg-deb")
                .args(["-f"])
                .arg(&deb)
                .args(["Package", "Version"]),
            b"",
            &[0],
        )?;
        let text = String::from_utf8_lossy(&out);
        let field = |f: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(f).map(|v| v.trim().to_string()))
                .with_context(|| format!("{spec} has no {f} field"))
        };
        (field("Package:")?, field("Version:")?, Some(deb))
    } else {
        let package = find_package(spec)?;
        let version = candidate_version(&package)?;
        (package, version, None)
    };
    let stamp = format!("{package}_{version}");
    let dir = cache_root(cache).join(sanitize(&stamp));
    if let Some(u) = read_unpacked(&dir, &stamp) {
        return Ok(u);
    }
    note!(
        "xtask: fetching kernel package {package} {version} (into {})",
        dir.display()
    );
    let tmp = dir.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let deb = match deb {
        Some(d) => d,
        None => download(&package, &version, &tmp)?,
    };
    let root = tmp.join("root");
    proc::check(Command::new("dpkg").arg("-x").arg(&deb).arg(&root))?;
    if deb.starts_with(&tmp) {
        let _ = std::fs::remove_file(&deb);
    }
    let release = single_release(&root.join("lib/modules"))
        .with_context(|| format!("{package} {version} ships no lib/modules/<release>"))?;
    if !root.join(format!("boot/vmlinuz-{release}")).is_file() {
        bail!("{package} {version} ships no boot/vmlinuz-{release}");
    }
    // The package's postinst would run depmod; `dpkg -x` runs nothing.
    proc::check(
        Command::new(proc::find_program("depmod").context("depmod (kmod) is missing")?)
            .arg("-b")
            .arg(&root)
            .arg(&release),
    )?;
    crate::write_atomic(&tmp.join("stamp"), stamp.as_bytes())?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
    read_unpacked(&dir, &stamp).with_context(|| format!("{} is incomplete after unpacking", dir.display()))
}

/// A finished unpacking in `dir` (its stamp file written last), if there is one.
fn read_unpacked(dir: &Path, stamp: &str) -> Option<Unpacked> {
    if std::fs::read_to_string(dir.join("stamp")).ok()? != stamp {
        return None;
    }
    let root = dir.join("root");
    let release = single_release(&root.join("lib/modules"))?;
    let modules = root.join("lib/modules").join(&release);
    if !modules.join("modules.dep").is_file() {
        return None;
    }
    Some(Unpacked {
        bzimage: root.join(format!("boot/vmlinuz-{release}")),
        config: root.join(format!("boot/config-{release}")),
        modules,
        release,
        stamp: stamp.to_string(),
    })
}

/// The only directory name under `dir`.
fn single_release(dir: &Path) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    (names.len() == 1).then(|| names.pop()).flatten()
}

/// A file name from a package name and version (`~` and `:` become `_`).
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+-._".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The `linux-image-<release>` package `spec` names: the newest release apt knows that
/// [`names`] accepts. Adds bookworm-backports to apt's sources (as root) when none is known.
fn find_package(spec: &str) -> Result<String> {
    if let Some(p) = newest_known(spec)? {
        return Ok(p);
    }
    if proc::euid() == Some(0) && add_backports()? {
        if let Some(p) = newest_known(spec)? {
            return Ok(p);
        }
    }
    bail!(
        "apt knows no linux-image package for kernel `{spec}` (tried `apt-cache pkgnames linux-image-`); \
         add bookworm-backports to apt's sources and run apt-get update{}",
        if proc::euid() == Some(0) { "" } else { " (as root)" }
    )
}

/// The newest `linux-image-<release>` with a candidate version whose release `spec` names.
fn newest_known(spec: &str) -> Result<Option<String>> {
    let spec = spec.strip_prefix("linux-image-").unwrap_or(spec);
    let out = proc::filter(Command::new("apt-cache").args(["pkgnames", "linux-image-"]), b"", &[0])?;
    let mut releases: Vec<String> = String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("linux-image-"))
        .filter(|r| names(spec, r))
        .map(str::to_string)
        .collect();
    releases.sort_by(|a, b| version_cmp(a, b));
    while let Some(r) = releases.pop() {
        let package = format!("linux-image-{r}");
        if candidate_version(&package).is_ok() {
            return Ok(Some(package));
        }
    }
    Ok(None)
}

/// The version apt would install of `package`.
fn candidate_version(package: &str) -> Result<String> {
    let out = proc::filter(Command::new("apt-cache").args(["policy", package]), b"", &[0])?;
    String::from_utf8_lossy(&out)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate:").map(|v| v.trim().to_string()))
        .filter(|v| !v.is_empty() && v != "(none)")
        .with_context(|| format!("apt has no candidate version of {package}"))
}

/// Downloads `package`=`version` into `dir`; returns the .deb. Refreshes apt's lists once
/// (as root) if the mirror no longer has that version.
fn download(package: &str, version: &str, dir: &Path) -> Result<PathBuf> {
    let get = || {
        let mut c = Command::new("apt-get");
        c.args(["-q", "download", &format!("{package}={version}")])
            .current_dir(dir);
        proc::check(&mut c)
    };
    if let Err(e) = get() {
        if proc::euid() != Some(0) {
            return Err(e);
        }
        note!("xtask: {e}; refreshing apt's lists and retrying");
        proc::check(Command::new("apt-get").args(["-q", "update"]))?;
        get()?;
    }
    std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download {package} left no .deb in {}", dir.display()))
}

/// The deb822 sources file for bookworm-backports this harness writes.
const BACKPORTS_FILE: &str = "/etc/apt/sources.list.d/uverbs-bookworm-backports.sources";

/// Adds bookworm-backports to apt's sources (Debian 12 hosts only) and updates the lists.
/// Returns whether it did.
fn add_backports() -> Result<bool> {
    let codename = std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VERSION_CODENAME=")
                .map(|v| v.trim_matches('"').to_string())
        });
    if codename.as_deref() != Some("bookworm") || Path::new(BACKPORTS_FILE).exists() || backports_listed() {
        return Ok(false);
    }
    note!("xtask: adding bookworm-backports to apt's sources ({BACKPORTS_FILE})");
    std::fs::write(
        BACKPORTS_FILE,
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\n\
         Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
    )
    .with_context(|| format!("writing {BACKPORTS_FILE}"))?;
    proc::check(Command::new("apt-get").args(["-q", "update"]))?;
    Ok(true)
}

/// Whether some apt source already names bookworm-backports.
fn backports_listed() -> bool {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(d) = std::fs::read_dir("/etc/apt/sources.list.d") {
        files.extend(d.flatten().map(|e| e.path()));
    }
    files.iter().any(|f| {
        let ext = f.extension().and_then(|e| e.to_str()).unwrap_or_default();
        (f.ends_with("sources.list") || ext == "list" || ext == "sources")
            && std::fs::read_to_string(f).is_ok_and(|t| {
                t.lines()
                    .any(|l| !l.trim_start().starts_with('#') && l.contains("bookworm-backports"))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_name_releases() {
        assert!(names("6.12", "6.12.117+deb12-amd64"));
        assert!(names("6.12.117+deb12-amd64", "6.12.117+deb12-amd64"));
        assert!(names("6.1", "6.1.0-56-amd64"));
        assert!(!names("6.1", "6.12.117+deb12-amd64"));
        assert!(!names("6.12", "6.12.117+deb12-cloud-amd64"));
        assert!(!names("6.12", "6.12.117+deb12-rt-amd64"));
        assert!(!names("6.12", "6.12.117+deb12-amd64-unsigned"));
        assert!(!names("6.12", "6.12.117+deb12-amd64-dbg"));
        assert!(!names("6.1", "6.1.0-56-cloud-amd64"));
    }

    #[test]
    fn cache_names_are_plain() {
        assert_eq!(
            sanitize("linux-image-6.12.117+deb12-amd64_6.12.117-1~deb12u1"),
            "linux-image-6.12.117+deb12-amd64_6.12.117-1_deb12u1"
        );
    }
}
