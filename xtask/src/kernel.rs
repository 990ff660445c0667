//! Picks the guest kernel (a Debian linux-image in /boot, or a package that
//! `crate::kernel_pkg` unpacks) and extracts the
//! uncompressed `vmlinux` ELF from its bzImage, so QEMU can boot it through
//! the PVH entry point (faster than the bzImage's real-mode setup).

use crate::error::{bail, Context, Result};
use crate::proc;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The kernel a guest boots.
pub struct Kernel {
    /// Release string, e.g. `6.1.0-56-amd64`.
    pub version: String,
    /// What to pass to QEMU's `-kernel`: the cached vmlinux, or the bzImage
    /// when the kernel has no PVH entry point.
    pub image: PathBuf,
    /// `/lib/modules/<version>`.
    pub modules: PathBuf,
    /// A stamp of the installed image (size, mtime) for cache keys.
    pub stamp: String,
}

/// Versions with both `/boot/vmlinuz-<v>` and `/lib/modules/<v>/modules.dep`, newest last.
pub fn installed_versions() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/boot")
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_prefix("vmlinuz-").map(str::to_string)
                })
                .filter(|ver| is_installed(ver))
                .collect()
        })
        .unwrap_or_default();
    v.sort_by(|a, b| crate::kernel_pkg::version_cmp(a, b));
    v
}

/// Whether kernel `ver` has its image and its modules installed.
pub fn is_installed(ver: &str) -> bool {
    Path::new(&format!("/boot/vmlinuz-{ver}")).is_file()
        && Path::new(&format!("/lib/modules/{ver}/modules.dep")).is_file()
}

/// Selects the kernel (override: `UVERBS_GUEST_KERNEL`) and caches its vmlinux in `cache`.
///
/// The override is an installed release (`6.1.0-56-amd64`), a version prefix of one
/// (`6.1`), or else a kernel package for `crate::kernel_pkg` to fetch and unpack (`6.12`,
/// a release, a `linux-image-*` name, a `.deb` file).
pub fn prepare(cache: &Path) -> Result<Kernel> {
    let spec = std::env::var(crate::ENV_KERNEL).unwrap_or_default();
    let (version, bz_path, config, modules, stamp) = match installed_for(&spec) {
        Some(version) => {
            let bz_path = PathBuf::from(format!("/boot/vmlinuz-{version}"));
            let meta = std::fs::metadata(&bz_path).with_context(|| format!("reading {}", bz_path.display()))?;
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            let stamp = format!("{}-{mtime}", meta.len());
            let config = PathBuf::from(format!("/boot/config-{version}"));
            let modules = PathBuf::from(format!("/lib/modules/{version}"));
            (version, bz_path, config, modules, stamp)
        }
        None if spec.is_empty() => {
            bail!("no kernel in /boot with modules in /lib/modules (install linux-image-amd64)")
        }
        None => {
            let u = crate::kernel_pkg::prepare(&spec, cache)
                .with_context(|| format!("{}={spec}: not an installed kernel; as a package", crate::ENV_KERNEL))?;
            (u.release, u.bzimage, u.config, u.modules, u.stamp)
        }
    };

    if !has_pvh(&config) {
        note!("xtask: kernel {version} lacks CONFIG_PVH; booting the bzImage (slower)");
        return Ok(Kernel {
            version,
            image: bz_path,
            modules,
            stamp,
        });
    }
    let image = cache.join(format!("vmlinux-{version}"));
    let stamp_file = cache.join(format!("vmlinux-{version}.stamp"));
    let cached = image.is_file() && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp);
    if !cached {
        let bz = std::fs::read(&bz_path).with_context(|| format!("reading {}", bz_path.display()))?;
        let elf = extract_vmlinux(&bz).with_context(|| format!("extracting vmlinux from {}", bz_path.display()))?;
        crate::write_atomic(&image, &elf)?;
        crate::write_atomic(&stamp_file, stamp.as_bytes())?;
        note!("xtask: extracted {} ({} MiB)", image.display(), elf.len() >> 20);
    }
    Ok(Kernel {
        version,
        image,
        modules,
        stamp,
    })
}

/// The installed kernel `spec` names (empty: the newest installed one).
fn installed_for(spec: &str) -> Option<String> {
    let mut all = installed_versions();
    if spec.is_empty() {
        return all.pop();
    }
    all.into_iter().rfind(|v| crate::kernel_pkg::names(spec, v))
}

impl Kernel {
    /// Where the guest finds this kernel's modules, when that is not `/lib/modules/<version>`
    /// of the host's root (a kernel unpacked from a package): init.sh mounts it there.
    pub fn modules_outside_host(&self) -> Option<&Path> {
        (self.modules != Path::new("/lib/modules").join(&self.version)).then_some(self.modules.as_path())
    }
}

/// Whether the kernel's config (if readable) enables the PVH entry point.
fn has_pvh(config: &Path) -> bool {
    match std::fs::read_to_string(config) {
        Ok(cfg) => cfg.lines().any(|l| l == "CONFIG_PVH=y"),
        Err(_) => true, // No config to check: try, QEMU will say if it cannot.
    }
}

/// Compression formats a bzImage payload may use, recognised by magic.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Format {
    Xz,
    Lzma,
    Zstd,
    Gzip,
}

fn detect(payload: &[u8]) -> Option<Format> {
    if payload.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Some(Format::Xz)
    } else if payload.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some(Format::Zstd)
    } else if payload.starts_with(&[0x1f, 0x8b]) {
        Some(Format::Gzip)
    } else if payload.starts_with(&[0x5d, 0, 0]) {
        Some(Format::Lzma)
    } else {
        None
    }
}

/// The compressed payload inside a bzImage, located through its boot header
/// (`setup_sects`, `payload_offset`, `payload_length`; boot protocol >= 2.08).
fn payload(bz: &[u8]) -> Result<&[u8]> {
    if bz.len() < 0x250 || &bz[0x202..0x206] != b"HdrS" {
        bail!("not a bzImage (no HdrS boot header)");
    }
    let u32_at = |o: usize| u32::from_le_bytes([bz[o], bz[o + 1], bz[o + 2], bz[o + 3]]) as usize;
    let proto = u16::from_le_bytes([bz[0x206], bz[0x207]]);
    if proto < 0x208 {
        bail!("boot protocol {proto:#x} is older than 2.08 (no payload_offset)");
    }
    let setup_sects = match bz[0x1f1] {
        0 => 4,
        n => n as usize,
    };
    let start = (setup_sects + 1) * 512 + u32_at(0x248);
    let len = u32_at(0x24c);
    bz.get(start..start + len)
        .with_context(|| format!("payload {start}+{len} lies outside the {}-byte image", bz.len()))
}

/// Decompresses the vmlinux ELF out of a bzImage (or returns an ELF as is).
fn extract_vmlinux(bz: &[u8]) -> Result<Vec<u8>> {
    if bz.starts_with(b"\x7fELF") {
        return Ok(bz.to_vec());
    }
    let p = payload(bz)?;
    let format = detect(p).with_context(|| {
        format!(
            "unknown payload compression (magic {:02x?}); xz, lzma, zstd and gzip are supported",
            &p[..p.len().min(6)]
        )
    })?;
    // The kernel build appends the uncompressed size (4 bytes) to every
    // format but gzip, which stores it itself.
    let body = match format {
        Format::Gzip => p,
        _ => &p[..p.len().saturating_sub(4)],
    };
    let (mut cmd, ok): (Command, &[i32]) = match format {
        Format::Xz => (Command::new("xz"), &[0]),
        Format::Lzma => {
            let mut c = Command::new("xz");
            c.arg("--format=lzma");
            (c, &[0])
        }
        Format::Zstd => (Command::new("zstd"), &[0]),
        // 2 = "trailing garbage ignored": a warning, not a failure.
        Format::Gzip => (Command::new("gzip"), &[0, 2]),
    };
    cmd.args(["-d", "-c", "-q"]);
    if format == Format::Xz {
        cmd.arg("--single-stream");
    }
    let elf = proc::filter(&mut cmd, body, ok).with_context(|| format!("decompressing the {format:?} payload"))?;
    if !elf.starts_with(b"\x7fELF") {
        bail!("the decompressed {format:?} payload is not an ELF file");
    }
    Ok(elf)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernel_pkg::version_cmp;
    use std::cmp::Ordering;

    #[test]
    fn versions_sort_numerically() {
        assert_eq!(version_cmp("6.1.0-9-amd64", "6.1.0-10-amd64"), Ordering::Less);
        assert_eq!(version_cmp("6.10.0-1-amd64", "6.9.0-1-amd64"), Ordering::Greater);
        assert_eq!(version_cmp("6.1.0-1", "6.1.0-1"), Ordering::Equal);
    }

    #[test]
    fn detects_formats() {
        assert_eq!(detect(&[0xfd, b'7', b'z', b'X', b'Z', 0, 1]), Some(Format::Xz));
        assert_eq!(detect(&[0x28, 0xb5, 0x2f, 0xfd, 0]), Some(Format::Zstd));
        assert_eq!(detect(&[0x1f, 0x8b, 8]), Some(Format::Gzip));
        assert_eq!(detect(b"ELF?"), None);
    }

    #[test]
    fn extracts_from_a_synthetic_bzimage() {
        // Minimal image: 1 setup sector + boot sector, payload at offset 0.
        let elf = b"\x7fELF and the rest of a kernel".to_vec();
        let xz = proc::filter(Command::new("xz").args(["-c", "-q"]), &elf, &[0]).unwrap();
        let mut bz = vec![0u8; 2 * 512];
        bz[0x1f1] = 1;
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        bz[0x206..0x208].copy_from_slice(&0x20fu16.to_le_bytes());
        bz[0x24c..0x250].copy_from_slice(&((xz.len() + 4) as u32).to_le_bytes());
        bz.extend_from_slice(&xz);
        bz.extend_from_slice(&(elf.len() as u32).to_le_bytes());
        assert_eq!(extract_vmlinux(&bz).unwrap(), elf);
        assert!(extract_vmlinux(b"garbage").is_err());
    }
}
