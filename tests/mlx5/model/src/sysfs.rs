//! The sysfs tree of the model device, under `<dir>/sysfs`: what libibverbs reads (through
//! `SYSFS_PATH`) and what the Rust core reads (through the interposer's redirection of
//! `/sys/class/infiniband*`).

use crate::port::LinkLayer;
use std::path::Path;

/// The device's node GUID as sysfs prints it (the same for every process: per-process
/// identity is the LID).
pub const NODE_GUID: &str = "0002:c903:0000:0001";

/// Writes the tree under `root` (idempotent; every file is written whole by a rename, so
/// processes starting together never read a half-written one).
pub fn build(root: &Path) -> std::io::Result<()> {
    let files: &[(&str, &str)] = &[
        ("class/infiniband_verbs/abi_version", "6"),
        ("class/infiniband_verbs/uverbs0/ibdev", "mlx5_0"),
        // The device file is backed by /dev/null (1:3); stat of the device path reports it.
        ("class/infiniband_verbs/uverbs0/dev", "1:3"),
        ("class/infiniband_verbs/uverbs0/abi_version", "1"),
        ("class/infiniband/mlx5_0/node_type", "1: CA"),
        ("class/infiniband/mlx5_0/node_guid", NODE_GUID),
        ("class/infiniband/mlx5_0/sys_image_guid", NODE_GUID),
        ("class/infiniband/mlx5_0/fw_ver", "16.35.1012"),
        ("class/infiniband/mlx5_0/hca_type", "MT4119"),
        ("class/infiniband/mlx5_0/hw_rev", "0"),
        ("class/infiniband/mlx5_0/board_id", "MODEL0000000001"),
        ("class/infiniband/mlx5_0/device/vendor", "0x15b3"),
        ("class/infiniband/mlx5_0/device/device", "0x1017"),
        (
            "class/infiniband/mlx5_0/device/modalias",
            "pci:v000015B3d00001017sv000015B3sd00000008bc02sc07i00",
        ),
        ("class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE"),
        ("class/infiniband/mlx5_0/ports/1/phys_state", "5: LinkUp"),
        (
            "class/infiniband/mlx5_0/ports/1/link_layer",
            LinkLayer::from_env().sysfs(),
        ),
        ("class/infiniband/mlx5_0/ports/1/rate", "100 Gb/sec (4X EDR)"),
        ("class/infiniband/mlx5_0/ports/1/pkeys/0", "0xffff"),
        // The LID, GIDs and GID attributes are each process's own: the interposer sends
        // their paths to the process's port directory (`Runtime::port_dir`).
    ];
    for (rel, text) in files {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, format!("{text}\n"))?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(())
}
