//! The provider's device level: the providers of the `uverbs` core it fronts, each registered
//! with libibverbs as a driver of its own (with the table [`crate::ops::device_ops`] makes),
//! and the per-device object with its entry points.

use crate::abi::{verbs_device, verbs_sysfs_dev};
use crate::ffi;
use libc::c_char;
use std::ffi::CStr;
use std::ops::RangeInclusive;

/// A provider of the `uverbs` core as libibverbs is to see it. Its kernel driver id comes from
/// the core ([`uverbs::providers`]); the rest is what rdma-core's C provider for the same
/// devices registers, so that libibverbs offers this library the same devices.
pub struct Frontend {
    /// The core provider's name ([`uverbs::provider::Provider::name`]).
    pub core: &'static str,
    /// The driver name registered with libibverbs.
    pub driver: &'static CStr,
    /// The C provider's device-name match, for kernels that report no driver id.
    pub name_modalias: &'static CStr,
    /// The per-device uverbs ABI versions the C provider accepts.
    pub abi_versions: RangeInclusive<u32>,
    /// Formats `ibv_device_attr.fw_ver` as the C provider does.
    pub fw_ver: fn(u64) -> String,
}

/// Every core provider this library fronts: adding one is one entry.
pub static FRONTENDS: &[Frontend] = &[
    Frontend {
        core: "rxe",
        driver: c"uverbs_rxe",
        name_modalias: c"rdma_device:*Nrxe*",
        // rxe's per-device uverbs ABI: 1 and 2 are the same on 64-bit machines.
        abi_versions: 1..=2,
        fw_ver: dotted_fw_ver,
    },
    Frontend {
        core: "siw",
        driver: c"uverbs_siw",
        name_modalias: c"rdma_device:*Nsiw*",
        // siw's per-device uverbs ABI (SIW_ABI_VERSION).
        abi_versions: 1..=1,
        fw_ver: dotted_fw_ver,
    },
];

/// `major.minor.sub_minor` from the kernel's 64-bit firmware version, as rdma-core's rxe and
/// siw print it.
fn dotted_fw_ver(raw: u64) -> String {
    format!("{}.{}.{}", (raw >> 32) & 0xffff, (raw >> 16) & 0xffff, raw & 0xffff)
}

/// What a match table entry's `driver_data` points at: the frontend a device matched, and its
/// core provider's kernel driver id.
pub struct Matched {
    /// The entry the table was made from.
    pub frontend: &'static Frontend,
    /// `enum rdma_driver_id`, from the core provider.
    pub driver_id: u32,
}

/// Our per-device object: libibverbs' `verbs_device` first (it fills it after
/// `alloc_device`), then what the provider keeps.
#[repr(C)]
pub struct Device {
    pub vdev: verbs_device,
    /// The uverbs device name (`uverbs0`), to find the device for `uverbs` at open time.
    pub uverbs_name: String,
    /// The IB device name (`rxe0`).
    pub ibdev_name: String,
    /// The frontend whose match table the device matched, and its kernel driver id.
    pub matched: &'static Matched,
}

fn c_chars(s: &[c_char]) -> String {
    let bytes: Vec<u8> = s.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `verbs_device_ops.alloc_device`: libibverbs matched `sysfs_dev` to this provider.
pub(crate) unsafe extern "C" fn alloc_device(sysfs_dev: *mut verbs_sysfs_dev) -> *mut verbs_device {
    ffi::guard("alloc_device", std::ptr::null_mut(), || {
        // SAFETY: libibverbs passes a live, initialized verbs_sysfs_dev.
        let sysfs = unsafe { &*sysfs_dev };
        // libibverbs calls `alloc_device` only for a device one of our tables matched (there
        // is no `match_device` to accept others), and records the entry in `match_`.
        if sysfs.match_.is_null() {
            return ffi::refuse_null("alloc_device", libc::ENODEV, "no match table entry");
        }
        // SAFETY: `match_` points into a table `ops::device_ops` made, whose every entry's
        // `driver_data` is a leaked, never-freed `Matched`.
        let matched = unsafe { &*(*sysfs.match_).driver_data.cast::<Matched>() };
        let dev = Box::new(Device {
            // SAFETY: all-zero is a valid verbs_device (null pointers, zero counters, None
            // function pointers); libibverbs fills it after we return, as calloc'd in C.
            vdev: unsafe { std::mem::zeroed() },
            uverbs_name: c_chars(&sysfs.sysfs_name),
            ibdev_name: c_chars(&sysfs.ibdev_name),
            matched,
        });
        ffi::verbose(format_args!(
            "claiming {} ({}, driver id {}, abi {}) for the Rust {} provider",
            dev.ibdev_name, dev.uverbs_name, sysfs.driver_id, sysfs.abi_ver, matched.frontend.core
        ));
        let dev = Box::into_raw(dev);
        // SAFETY: `dev` is live; `vdev` is its first field.
        unsafe { std::ptr::addr_of_mut!((*dev).vdev) }
    })
}

/// `verbs_device_ops.uninit_device`: the last reference to the device went away.
pub(crate) unsafe extern "C" fn uninit_device(vdev: *mut verbs_device) {
    ffi::guard("uninit_device", (), || {
        // SAFETY: every verbs_device libibverbs hands back was made by `alloc_device` as the
        // first field of a boxed `Device`, and this is its last use.
        drop(unsafe { Box::from_raw(vdev.cast::<Device>()) });
    });
}

/// The `Device` around libibverbs' `ibv_device`.
///
/// # Safety
/// `dev` must be an `ibv_device` this provider allocated.
pub unsafe fn from_ibv<'a>(dev: *mut crate::abi::ibv_device) -> &'a Device {
    // SAFETY: `ibv_device` is the first field of `verbs_device`, the first field of `Device`.
    unsafe { &*dev.cast::<Device>() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rxe_matches_as_the_c_provider() {
        let rxe = FRONTENDS.iter().find(|f| f.core == "rxe").unwrap();
        assert_eq!(rxe.name_modalias, c"rdma_device:*Nrxe*");
        assert_eq!((rxe.fw_ver)(0x0001_0002_0003), "1.2.3");
    }

    #[test]
    fn siw_matches_as_the_c_provider() {
        let siw = FRONTENDS.iter().find(|f| f.core == "siw").unwrap();
        assert_eq!(siw.name_modalias, c"rdma_device:*Nsiw*");
        assert_eq!(siw.abi_versions, 1..=1);
        assert_eq!(siw.driver, c"uverbs_siw");
    }
}
