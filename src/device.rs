//! Device discovery from sysfs (`/sys/class/infiniband_verbs/uverbsN`) and the device file.

use crate::attr::Transport;
use crate::error::{Error, Result};
use crate::netlink;
use crate::sys::abi::UVERBS_ABI_VERSION;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const VERBS_CLASS: &str = "/sys/class/infiniband_verbs";
const IB_CLASS: &str = "/sys/class/infiniband";

/// An RDMA device as sysfs and the kernel describe it, before it is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceInfo {
    /// RDMA device name, e.g. `rxe0` or `mlx5_0`.
    pub name: String,
    /// Name of its uverbs character device, e.g. `uverbs0`.
    pub uverbs: String,
    /// Path of the character device, e.g. `/dev/infiniband/uverbs0`.
    pub dev_path: PathBuf,
    /// `major:minor` of the character device, as sysfs gives it.
    pub dev_number: String,
    /// The driver's uverbs ABI version (per device; rxe is 2, mlx5 is 1).
    pub abi_version: u32,
    /// The kernel's `enum rdma_driver_id` for the device, from RDMA netlink when available.
    pub driver_id: Option<u32>,
    /// The kernel's index of the device (RDMA netlink's `DEV_INDEX`, rdma_cm's
    /// `ibdev_index`), when netlink answered.
    pub kernel_index: Option<u32>,
    /// The network device a software device (rxe) is bound to.
    pub parent_netdev: Option<String>,
    /// Node GUID, as sysfs prints it.
    pub node_guid: String,
}

impl DeviceInfo {
    /// The transport the device speaks, from its sysfs node type (`1: CA`, `4: RNIC`, ...).
    pub fn transport(&self) -> Result<Transport> {
        let path = Path::new(IB_CLASS).join(&self.name).join("node_type");
        let text = read_attr(&path)?;
        let number = text.split(':').next().unwrap_or_default().trim();
        let node_type = number
            .parse()
            .map_err(|_| Error::malformed("sysfs", format!("{}: {text:?}", path.display())))?;
        Ok(Transport::from_node_type(node_type))
    }
}

/// Lists the RDMA devices with a uverbs interface. An empty list is not an error.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let class = Path::new(VERBS_CLASS);
    if !class.exists() {
        return Ok(Vec::new());
    }
    check_global_abi()?;
    let entries = std::fs::read_dir(class).map_err(|e| Error::io(VERBS_CLASS, e))?;
    let netlink = netlink::uverbs_devices().unwrap_or_default();
    let mut list = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(VERBS_CLASS, e))?;
        let uverbs = entry.file_name().to_string_lossy().into_owned();
        if !uverbs.starts_with("uverbs") {
            continue;
        }
        let dir = entry.path();
        let name = read_attr(&dir.join("ibdev"))?;
        let abi_version = parse_attr(&dir.join("abi_version"))?;
        let ib_dir = Path::new(IB_CLASS).join(&name);
        list.push(DeviceInfo {
            driver_id: netlink.get(&uverbs).map(|d| d.driver_id),
            kernel_index: netlink.get(&uverbs).map(|d| d.index),
            dev_path: Path::new("/dev/infiniband").join(&uverbs),
            dev_number: read_attr(&dir.join("dev"))?,
            parent_netdev: read_attr(&ib_dir.join("parent")).ok(),
            node_guid: read_attr(&ib_dir.join("node_guid")).unwrap_or_default(),
            uverbs,
            name,
            abi_version,
        });
    }
    list.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(list)
}

/// The device named `name`, or the first device when `name` is `None`.
pub(crate) fn find(name: Option<&str>) -> Result<DeviceInfo> {
    let mut list = devices()?;
    let found = match name {
        Some(n) => list.iter().position(|d| d.name == n),
        None => (!list.is_empty()).then_some(0),
    };
    match found {
        Some(at) => Ok(list.swap_remove(at)),
        None => Err(Error::NoDevice {
            name: name.map(str::to_owned),
            reason: if list.is_empty() {
                format!(
                    "{VERBS_CLASS} lists no uverbs device (is an RDMA driver loaded? for \
                     SoftRoCE: `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <if>`)"
                )
            } else {
                let names: Vec<_> = list.iter().map(|d| d.name.as_str()).collect();
                format!("present: {}", names.join(", "))
            },
        }),
    }
}

fn check_global_abi() -> Result<()> {
    let found: u32 = parse_attr(&Path::new(VERBS_CLASS).join("abi_version"))?;
    if found != UVERBS_ABI_VERSION {
        return Err(Error::AbiVersion {
            what: "kernel uverbs",
            found,
            supported: "6",
        });
    }
    Ok(())
}

pub(crate) fn read_attr(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| Error::io(path.display().to_string(), e))
}

fn parse_attr<T: std::str::FromStr>(path: &Path) -> Result<T> {
    let text = read_attr(path)?;
    text.parse()
        .map_err(|_| Error::malformed("sysfs", format!("{}: {text:?}", path.display())))
}

/// The open uverbs character device: every command and ring mapping goes through it.
#[derive(Debug)]
pub struct DeviceFile {
    fd: OwnedFd,
}

impl DeviceFile {
    /// Opens `info`'s character device and checks it is the device sysfs describes.
    pub(crate) fn open(info: &DeviceInfo) -> Result<Self> {
        let file = File::options()
            .read(true)
            .write(true)
            .open(&info.dev_path)
            .map_err(|e| Error::io(info.dev_path.display().to_string(), e))?;
        Self::from_file(info, file)
    }

    /// Adopts a character device someone else opened (read-write), after checking it is the
    /// device sysfs describes for `info`.
    pub(crate) fn from_fd(info: &DeviceInfo, fd: OwnedFd) -> Result<Self> {
        Self::from_file(info, File::from(fd))
    }

    fn from_file(info: &DeviceInfo, file: File) -> Result<Self> {
        let what = || info.dev_path.display().to_string();
        let rdev = file.metadata().map_err(|e| Error::io(what(), e))?.rdev();
        let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
        if format!("{major}:{minor}") != info.dev_number {
            return Err(Error::malformed(
                "open",
                format!("{} is {major}:{minor}, sysfs says {}", what(), info.dev_number),
            ));
        }
        Ok(Self { fd: file.into() })
    }
}

impl AsFd for DeviceFile {
    /// Inlined: the send doorbell borrows the fd on every post.
    #[inline]
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
