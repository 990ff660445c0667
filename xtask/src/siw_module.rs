//! Builds the soft-iWARP driver (`siw.ko`) for the guest's kernel, out of tree.
//!
//! Debian's kernels do not ship siw (`CONFIG_RDMA_SIW` is off), so the harness builds it from
//! Debian's own kernel source: the `linux-source-<major.minor>` package of the same version as
//! the kernel's headers package (`linux-headers-<release>`, installed with apt-get when
//! missing), the siw sources extracted from its tarball, compiled against those headers. The
//! module is cached under `target/guest/siw/<release>-<hash of the sources>/siw.ko` and its
//! `vermagic` checked against the kernel release before the guest loads it (`xtask/guest/siw.sh`
//! loads it in every guest; `xtask/guest/with_siw.sh` adds the `siw0` link for the siw tests).

use crate::error::{bail, Context, Result};
use crate::kernel::Kernel;
use crate::proc;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The guest script's part that loads the module (sourced into guest.sh before run.sh).
pub const GUEST_SH: &str = include_str!("../guest/siw.sh");

/// Test binaries (by target name) that run with a siw device only: `xtask/guest/with_siw.sh`
/// adds one for the run and removes it after, so that every other item sees the rxe devices
/// only.
const SIW_TESTS: &[&str] = &["siw"];

/// Test binaries of the rxe suite that run a second time on siw from the same sources, as an
/// item of their own (`test <name> on siw0`, through `with_siw.sh`): each connects its QPs
/// by the CM where the device is iWARP and expects siw's refusals where siw refuses.
const ALSO_ON_SIW: &[&str] = &[
    "bad_input",
    "cq",
    "discovery",
    "leaks",
    "rc",
    "soak",
    "srq",
    "srq_owned",
    "stream",
];

/// The argv of test binary `name`: wrapped in `with_siw.sh` when it is a siw test.
pub fn guest_argv(name: &str, argv: Vec<String>) -> Vec<String> {
    if !SIW_TESTS.contains(&name) {
        return argv;
    }
    with_siw(argv)
}

/// The argv of test binary `name`'s second run on siw, if it has one ([`ALSO_ON_SIW`]).
pub fn siw_rerun_argv(name: &str, argv: &[String]) -> Option<Vec<String>> {
    ALSO_ON_SIW.contains(&name).then(|| with_siw(argv.to_vec()))
}

/// `argv` run through `with_siw.sh` (with a siw device, `UVERBS_CM_ADDR` its address).
pub fn with_siw(argv: Vec<String>) -> Vec<String> {
    let wrapper = crate::paths::root().join("xtask/guest/with_siw.sh");
    let mut v = vec!["/bin/sh".to_string(), wrapper.to_string_lossy().into_owned()];
    v.extend(argv);
    v
}

/// The guest.sh line that names the module for `siw.sh` (empty when there is none).
pub fn header_line(module: Option<&Path>) -> String {
    match module {
        Some(m) => format!("UVERBS_SIW_MODULE={}\n", proc::sh_quote(&m.to_string_lossy())),
        None => "UVERBS_SIW_MODULE=\n".into(),
    }
}

/// [`prepare`], or `None` with the reason printed: the rxe suite runs without siw.
pub fn prepare_or_note(kernel: &Kernel, cache: &Path) -> Option<PathBuf> {
    match prepare(kernel, cache) {
        Ok(p) => Some(p),
        Err(e) => {
            note!(
                "xtask: siw: no siw.ko for kernel {} ({e}); the guest runs without siw",
                kernel.version
            );
            None
        }
    }
}

/// Returns `siw.ko` for `kernel`, building it when the cache has none for these sources.
pub fn prepare(kernel: &Kernel, cache: &Path) -> Result<PathBuf> {
    let release = &kernel.version;
    let headers = PathBuf::from(format!("/usr/src/linux-headers-{release}"));
    let headers_pkg = format!("linux-headers-{release}");
    if !headers.join("Makefile").is_file() {
        install(&headers_pkg)?;
    }
    let pkg_version = dpkg_version(&headers_pkg)?;
    let series = series(release).with_context(|| format!("kernel release {release}"))?;
    let dir = cache.join("siw");
    let src = dir.join(format!("src-{series}-{pkg_version}"));
    if !src.join("Makefile").is_file() {
        extract_sources(&dir, &series, &pkg_version, &src)?;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&src)
        .with_context(|| format!("reading {}", src.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "c" || e == "h") || p.ends_with("Makefile"))
        .collect();
    files.sort();
    for f in &files {
        (
            f.file_name(),
            std::fs::read(f).with_context(|| format!("reading {}", f.display()))?,
        )
            .hash(&mut h);
    }
    let build = dir.join(format!("{release}-{:016x}", h.finish()));
    let module = build.join("siw.ko");
    if module.is_file() && vermagic_matches(&module, release)? {
        note!("xtask: siw: using the cached {}", module.display());
        return Ok(module);
    }
    let _ = std::fs::remove_dir_all(&build);
    std::fs::create_dir_all(&build).with_context(|| format!("creating {}", build.display()))?;
    for f in &files {
        let to = build.join(f.file_name().context("source without a name")?);
        std::fs::copy(f, &to).with_context(|| format!("copying {} to {}", f.display(), to.display()))?;
    }
    note!(
        "xtask: siw: building siw.ko from {series} source {pkg_version} against {}",
        headers.display()
    );
    let out = proc::filter(
        Command::new("make")
            .arg("-C")
            .arg(&headers)
            .arg(format!("M={}", build.display()))
            .args(["CONFIG_RDMA_SIW=m", "modules"]),
        &[],
        &[0],
    )
    .context("building siw.ko")?;
    drop(out);
    if !vermagic_matches(&module, release)? {
        bail!(
            "{} was built but its vermagic does not name {release}",
            module.display()
        );
    }
    note!("xtask: siw: built {} (vermagic {release})", module.display());
    Ok(module)
}

/// `6.1` of `6.1.0-56-amd64`: the series that names Debian's source package.
fn series(release: &str) -> Option<String> {
    let mut it = release.split('.');
    let (major, minor) = (it.next()?, it.next()?);
    let minor: String = minor.chars().take_while(char::is_ascii_digit).collect();
    (major.chars().all(|c| c.is_ascii_digit()) && !major.is_empty() && !minor.is_empty())
        .then(|| format!("{major}.{minor}"))
}

/// Whether the module's `vermagic` starts with the kernel release (the kernel refuses it
/// otherwise).
fn vermagic_matches(module: &Path, release: &str) -> Result<bool> {
    let out = proc::filter(Command::new("modinfo").args(["-F", "vermagic"]).arg(module), &[], &[0])?;
    let vermagic = String::from_utf8_lossy(&out);
    Ok(vermagic.split_whitespace().next() == Some(release))
}

/// The installed version of a Debian package.
fn dpkg_version(pkg: &str) -> Result<String> {
    let out = proc::filter(
        Command::new("dpkg-query").args(["-W", "-f", "${Version}", pkg]),
        &[],
        &[0],
    )
    .with_context(|| format!("the version of {pkg}"))?;
    let v = String::from_utf8_lossy(&out).trim().to_string();
    if v.is_empty() {
        bail!("{pkg} is not installed");
    }
    Ok(v)
}

fn apt() -> Command {
    let mut c = Command::new("apt-get");
    c.env("DEBIAN_FRONTEND", "noninteractive")
        .args(["-o", "DPkg::Lock::Timeout=600", "-q"]);
    c
}

/// Installs a package with apt-get (as root).
fn install(pkg: &str) -> Result<()> {
    if proc::euid() != Some(0) {
        bail!("{pkg} is missing; run as root: apt-get install -y --no-install-recommends {pkg}");
    }
    note!("xtask: siw: installing {pkg}");
    let install = || {
        proc::check(
            apt()
                .args(["install", "-y", "--no-install-recommends", pkg])
                .stdout(std::process::Stdio::null()),
        )
    };
    if install().is_err() {
        proc::check(apt().arg("update"))?;
        install()?;
    }
    Ok(())
}

/// Downloads `linux-source-<series>=<version>` and extracts the siw sources into `dest`.
fn extract_sources(dir: &Path, series: &str, version: &str, dest: &Path) -> Result<()> {
    let dl = dir.join("download");
    let _ = std::fs::remove_dir_all(&dl);
    std::fs::create_dir_all(&dl).with_context(|| format!("creating {}", dl.display()))?;
    let pkg = format!("linux-source-{series}");
    note!(
        "xtask: siw: downloading {pkg}={version} (the kernel source, ~140 MB) into {}",
        dl.display()
    );
    let download = || proc::check(apt().current_dir(&dl).args(["download", &format!("{pkg}={version}")]));
    if download().is_err() {
        proc::check(apt().arg("update"))?;
        download()?;
    }
    let deb = std::fs::read_dir(&dl)
        .with_context(|| format!("reading {}", dl.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", dl.display()))?;
    let root = format!("linux-source-{series}");
    let script = format!(
        "set -e; dpkg-deb --fsys-tarfile {deb} | tar -x -O ./usr/src/{root}.tar.xz | xz -dc | \
         tar -x -C {out} --wildcards '{root}/drivers/infiniband/sw/siw/*'",
        deb = proc::sh_quote(&deb.to_string_lossy()),
        out = proc::sh_quote(&dl.to_string_lossy()),
    );
    proc::check(Command::new("sh").args(["-c", &script])).context("extracting the siw sources")?;
    let from = dl.join(&root).join("drivers/infiniband/sw/siw");
    let _ = std::fs::remove_dir_all(dest);
    std::fs::rename(&from, dest).with_context(|| format!("moving {} to {}", from.display(), dest.display()))?;
    let _ = std::fs::remove_dir_all(&dl);
    note!("xtask: siw: sources of {pkg} {version} in {}", dest.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_of_releases() {
        assert_eq!(series("6.1.0-56-amd64").as_deref(), Some("6.1"));
        assert_eq!(series("6.12.95+deb12-amd64").as_deref(), Some("6.12"));
        assert_eq!(series("garbage"), None);
    }

    #[test]
    fn only_siw_tests_are_wrapped() {
        let argv = vec!["/t/rc".to_string()];
        assert_eq!(guest_argv("rc", argv.clone()), argv);
        let w = guest_argv("siw", vec!["/t/siw".into()]);
        assert!(w[1].ends_with("xtask/guest/with_siw.sh") && w[2] == "/t/siw", "{w:?}");
        assert_eq!(siw_rerun_argv("cm", &argv), None);
        assert_eq!(siw_rerun_argv("siw", &argv), None);
        let w = siw_rerun_argv("soak", &["/t/soak".into(), "-q".into()]).unwrap();
        assert!(
            w[1].ends_with("xtask/guest/with_siw.sh") && w[2..] == ["/t/soak", "-q"],
            "{w:?}"
        );
    }
}
