//! Makes sure the host has the Debian packages the guest harness and the mlx5 model checks need.

use crate::error::{bail, Result};
use crate::proc::{self, find_program};
use std::path::Path;
use std::process::Command;

/// One thing the harness needs and the package that provides it.
struct Need {
    what: String,
    package: String,
    present: bool,
}

fn program(name: &str, package: &str) -> Need {
    Need {
        what: format!("program `{name}`"),
        package: package.into(),
        present: find_program(name).is_some(),
    }
}

fn file(path: &str, package: &str) -> Need {
    Need {
        what: format!("`{path}`"),
        package: package.into(),
        present: Path::new(path).exists(),
    }
}

fn needs() -> Vec<Need> {
    let mut v = vec![
        program("qemu-system-x86_64", "qemu-system-x86"),
        program("xz", "xz-utils"),
        program("zstd", "zstd"),
        // Used inside the guest, which runs the host's own root filesystem.
        program("modprobe", "kmod"),
        program("ip", "iproute2"),
        program("rdma", "iproute2"),
        program("timeout", "coreutils"),
        // rdma-core's C tools: references for guest scripts and for checks.
        program("ibv_devinfo", "ibverbs-utils"),
        program("ibv_devices", "ibverbs-utils"),
        program("ibv_rc_pingpong", "ibverbs-utils"),
        program("ibv_uc_pingpong", "ibverbs-utils"),
        program("ib_write_bw", "perftest"),
        program("rdma-ndd", "rdma-core"),
        // librdmacm's example programs, for the RDMA CM interop scripts.
        program("rdma_server", "rdmacm-utils"),
        program("rdma_client", "rdmacm-utils"),
        program("rping", "rdmacm-utils"),
        program("ucmatose", "rdmacm-utils"),
        // C programs built against libibverbs: the drop-in test's event checker and the
        // drop-in's struct layout test.
        program("cc", "gcc"),
        file("/usr/include/infiniband/verbs.h", "libibverbs-dev"),
        // The kernel's uapi headers, for the core's and rxe's struct layout tests (also `cc`).
        file("/usr/include/rdma/ib_user_verbs.h", "linux-libc-dev"),
        file("/usr/include/rdma/ib_user_ioctl_verbs.h", "linux-libc-dev"),
        file("/usr/include/rdma/rdma_user_ioctl_cmds.h", "linux-libc-dev"),
        file("/usr/include/rdma/rdma_user_rxe.h", "linux-libc-dev"),
        file("/usr/include/rdma/rdma_user_cm.h", "linux-libc-dev"),
        Need {
            what: "the rxe provider of libibverbs".into(),
            package: "ibverbs-providers".into(),
            present: std::fs::read_dir("/usr/lib/x86_64-linux-gnu/libibverbs").is_ok_and(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("librxe-"))
            }),
        },
        // Debian's C mlx5 provider, which the mlx5 model checks run on the host.
        file(
            "/usr/lib/x86_64-linux-gnu/libibverbs/libmlx5-rdmav34.so",
            "ibverbs-providers",
        ),
        file("/etc/libibverbs.d/mlx5.driver", "ibverbs-providers"),
        Need {
            what: "a statically linked /bin/busybox".into(),
            package: "busybox-static".into(),
            present: is_static_elf(Path::new("/bin/busybox")),
        },
    ];
    // A kernel the override names that is not installed comes from its package
    // (crate::kernel_pkg: apt-get download, dpkg -x, depmod), not from apt-get install.
    let kernel = match std::env::var(crate::ENV_KERNEL) {
        Ok(spec) if !spec.is_empty() => Need {
            what: "dpkg and depmod, to unpack a kernel package".into(),
            package: "kmod".into(),
            present: find_program("dpkg").is_some() && find_program("depmod").is_some(),
        },
        _ => Need {
            what: "a kernel image in /boot with its modules in /lib/modules".into(),
            package: "linux-image-amd64".into(),
            present: !crate::kernel::installed_versions().is_empty(),
        },
    };
    v.push(kernel);
    v
}

/// Installs (as root, with apt-get) whatever the guest harness is missing.
pub fn ensure() -> Result<()> {
    ensure_with(&[])
}

/// [`ensure`], plus the programs in `extra` (program, Debian package).
pub fn ensure_with(extra: &[(&str, &str)]) -> Result<()> {
    let all = || {
        let mut v = needs();
        v.extend(extra.iter().map(|(name, package)| program(name, package)));
        v
    };
    let missing: Vec<Need> = all().into_iter().filter(|n| !n.present).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut pkgs: Vec<&str> = missing.iter().map(|n| n.package.as_str()).collect();
    pkgs.sort_unstable();
    pkgs.dedup();
    let list = missing
        .iter()
        .map(|n| format!("{} ({})", n.what, n.package))
        .collect::<Vec<_>>()
        .join(", ");
    if proc::euid() != Some(0) {
        bail!(
            "missing {list}; run as root: apt-get update && apt-get install -y --no-install-recommends {}",
            pkgs.join(" ")
        );
    }
    note!("xtask: missing {list}; installing {}", pkgs.join(" "));
    let apt = |args: &[&str]| {
        let mut c = Command::new("apt-get");
        c.env("DEBIAN_FRONTEND", "noninteractive")
            .args(["-o", "DPkg::Lock::Timeout=600", "-q"])
            .args(args);
        c
    };
    proc::check(&mut apt(&["update"]))?;
    proc::check(
        apt(&["install", "-y", "--no-install-recommends"])
            .args(&pkgs)
            .stdout(std::process::Stdio::null()),
    )?;
    let still: Vec<String> = all().into_iter().filter(|n| !n.present).map(|n| n.what).collect();
    if !still.is_empty() {
        bail!(
            "after installing {}, still missing: {}",
            pkgs.join(" "),
            still.join(", ")
        );
    }
    Ok(())
}

/// Whether `path` is an ELF executable without a program interpreter (PT_INTERP).
pub fn is_static_elf(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|b| elf_is_static(&b))
}

fn elf_is_static(b: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    // 64-bit little-endian ELF only (this harness is x86_64).
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return false;
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(b[0x20..0x28].try_into().unwrap_or_default()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).all(|i| {
        let o = phoff + i * phentsize;
        b.get(o..o + 4)
            .is_some_and(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) != PT_INTERP)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_check() {
        assert!(!elf_is_static(b"not an elf"));
        // /bin/sh on any Debian host is dynamically linked.
        assert!(!is_static_elf(Path::new("/bin/sh")));
    }
}
