//! Builds (and caches) the guest's initramfs: static busybox, the init script
//! and the kernel modules needed to mount the host root over virtio-9p.

use crate::cpio::Archive;
use crate::error::{bail, Context, Result};
use crate::kernel::Kernel;
use crate::proc;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

/// PID 1 of the guest.
const INIT: &str = include_str!("../guest/init.sh");

/// What the kernel runs to autoload a module: the host's modprobe, in the chroot.
const MODPROBE_HELPER: &str = "#!/bin/sh\nexec /bin/chroot /newroot /sbin/modprobe \"$@\"\n";

/// Modules init loads (with their dependencies) before mounting the host root.
pub const MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "overlay"];

/// Busybox applets init uses, linked into /bin.
const APPLETS: &[&str] = &[
    "sh", "mount", "umount", "mkdir", "insmod", "chroot", "env", "poweroff", "stty", "cat", "echo", "sleep", "sync",
    "ls", "dmesg",
];

const BUSYBOX: &str = "/bin/busybox";

/// Returns the path of the initramfs for `kernel`, building it if the cached one is stale.
pub fn prepare(kernel: &Kernel, cache: &Path) -> Result<PathBuf> {
    let dep_path = kernel.modules.join("modules.dep");
    let dep = std::fs::read_to_string(&dep_path).with_context(|| format!("reading {}", dep_path.display()))?;
    let builtin = std::fs::read_to_string(kernel.modules.join("modules.builtin")).unwrap_or_default();
    let order =
        resolve(&dep, &builtin, MODULES).with_context(|| format!("resolving modules of kernel {}", kernel.version))?;

    let bb_meta = std::fs::metadata(BUSYBOX).with_context(|| format!("reading {BUSYBOX}"))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&kernel.version, &kernel.stamp, INIT, MODPROBE_HELPER, APPLETS, &order).hash(&mut h);
    (bb_meta.len(), bb_meta.modified().ok()).hash(&mut h);
    let name = format!("initramfs-{}-{:016x}.cpio", kernel.version, h.finish());
    let path = cache.join(&name);
    if path.is_file() {
        return Ok(path);
    }

    if !crate::packages::is_static_elf(Path::new(BUSYBOX)) {
        bail!("{BUSYBOX} is not a static executable (install busybox-static)");
    }
    let mut a = Archive::default();
    for d in [
        "/bin",
        "/dev",
        "/proc",
        "/sys",
        "/lib",
        "/lib/modules",
        "/lower",
        "/rw",
        "/newroot",
        "/tmp",
    ] {
        a.dir(d);
    }
    a.char_dev("/dev/console", 0o600, 5, 1);
    a.file("/init", 0o755, INIT.as_bytes());
    a.file("/bin/modprobe-chroot", 0o755, MODPROBE_HELPER.as_bytes());
    a.file(
        "/bin/busybox",
        0o755,
        &std::fs::read(BUSYBOX).with_context(|| format!("reading {BUSYBOX}"))?,
    );
    for applet in APPLETS {
        a.symlink(&format!("/bin/{applet}"), "busybox");
    }
    let mut load = String::new();
    for (name, rel) in &order {
        let src = kernel.modules.join(rel);
        a.file(&format!("/lib/modules/{name}.ko"), 0o644, &read_module(&src)?);
        load.push_str(name);
        load.push('\n');
    }
    a.file("/modules.load", 0o644, load.as_bytes());

    // Drop stale archives of this kernel, then publish the new one.
    if let Ok(d) = std::fs::read_dir(cache) {
        let prefix = format!("initramfs-{}-", kernel.version);
        for e in d.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    crate::write_atomic(&path, &a.finish())?;
    let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
    note!("xtask: built {} (modules: {})", path.display(), names.join(" "));
    Ok(path)
}

/// Reads a module, decompressing `.ko.xz`, `.ko.zst` and `.ko.gz` (busybox
/// insmod only takes plain ELF modules).
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let data = std::fs::read(path).with_context(|| format!("reading module {}", path.display()))?;
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".ko.xz") {
        "xz"
    } else if name.ends_with(".ko.zst") {
        "zstd"
    } else if name.ends_with(".ko.gz") {
        "gzip"
    } else {
        return Ok(data);
    };
    proc::filter(Command::new(tool).args(["-d", "-c", "-q"]), &data, &[0])
        .with_context(|| format!("decompressing module {}", path.display()))
}

/// Canonical module name of a modules.dep path: basename, no `.ko*`, `-` as `_`.
fn module_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let stem = base.split(".ko").next().unwrap_or(base);
    stem.replace('-', "_")
}

/// Load order (dependencies first) of `wanted` and their dependencies, as
/// (name, path relative to /lib/modules/<ver>); built-in modules are skipped.
fn resolve(modules_dep: &str, builtin: &str, wanted: &[&str]) -> Result<Vec<(String, String)>> {
    let mut deps: HashMap<String, (String, Vec<String>)> = HashMap::new();
    for line in modules_dep.lines() {
        let Some((path, rest)) = line.split_once(':') else {
            continue;
        };
        let ds = rest.split_whitespace().map(module_name).collect();
        deps.insert(module_name(path), (path.to_string(), ds));
    }
    let builtin: HashSet<String> = builtin.lines().map(module_name).collect();

    fn visit(
        m: &str,
        deps: &HashMap<String, (String, Vec<String>)>,
        builtin: &HashSet<String>,
        seen: &mut HashSet<String>,
        out: &mut Vec<(String, String)>,
    ) -> Result<()> {
        if builtin.contains(m) || !seen.insert(m.to_string()) {
            return Ok(());
        }
        let (path, ds) = deps
            .get(m)
            .with_context(|| format!("module {m} is neither in modules.dep nor in modules.builtin"))?;
        for d in ds.iter().rev() {
            visit(d, deps, builtin, seen, out)?;
        }
        out.push((m.to_string(), path.clone()));
        Ok(())
    }
    let (mut seen, mut out) = (HashSet::new(), Vec::new());
    for w in wanted {
        visit(&w.replace('-', "_"), &deps, &builtin, &mut seen, &mut out)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/fs/netfs/netfs.ko.xz:
kernel/fs/fscache/fscache.ko.xz: kernel/fs/netfs/netfs.ko.xz
kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/fscache/fscache.ko.xz kernel/fs/netfs/netfs.ko.xz
kernel/net/9p/9pnet.ko.xz:
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko.xz kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
";

    #[test]
    fn resolves_dependencies_first() {
        let order = resolve(
            DEP,
            "kernel/fs/overlayfs/overlay.ko\n",
            &["9pnet_virtio", "9p", "overlay"],
        )
        .unwrap();
        let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "virtio_ring",
                "virtio",
                "9pnet",
                "9pnet_virtio",
                "netfs",
                "fscache",
                "9p"
            ]
        );
        assert_eq!(order[2].1, "kernel/net/9p/9pnet.ko.xz");
        let e = resolve(DEP, "", &["nope"]).unwrap_err().to_string();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn names() {
        assert_eq!(
            module_name("kernel/arch/x86/crypto/crc32-pclmul.ko.zst"),
            "crc32_pclmul"
        );
        assert_eq!(module_name("kernel/fs/9p/9p.ko"), "9p");
    }
}
