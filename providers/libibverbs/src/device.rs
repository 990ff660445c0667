//! The provider's device-level entry points: what it matches and the per-device object.

use crate::abi::{match_kind, verbs_device, verbs_device_ops, verbs_match_ent, verbs_sysfs_dev};
use crate::ffi;
use libc::c_char;

/// `RDMA_DRIVER_RXE` in the kernel's `enum rdma_driver_id`.
pub const DRIVER_ID_RXE: u32 = 14;

/// A `'static` C table; the raw pointers in it only point at other `'static` data.
#[repr(transparent)]
pub struct Static<T>(pub T);
// SAFETY: the wrapped tables are immutable after compilation and hold pointers only to
// immutable `'static` data, so sharing them between threads is sound.
unsafe impl<T> Sync for Static<T> {}

/// A `verbs_match_ent` whose `u` union holds the `modalias` pointer (a `static` initializer
/// cannot turn a pointer into the integer `verbs_match_ent.u`).
#[repr(C)]
struct NameMatchEnt {
    driver_data: *mut libc::c_void,
    modalias: *const c_char,
    vendor: u16,
    device: u16,
    kind: u8,
}
const _: () = assert!(size_of::<NameMatchEnt>() == size_of::<verbs_match_ent>());

/// What to match, as the C rxe provider does: the kernel driver id first, else an IB device
/// name containing "rxe"; ends with a sentinel.
#[repr(C)]
struct MatchTable {
    by_driver_id: verbs_match_ent,
    by_name: NameMatchEnt,
    sentinel: verbs_match_ent,
}
const _: () = assert!(size_of::<MatchTable>() == size_of::<[verbs_match_ent; 3]>());

static MATCH: Static<MatchTable> = Static(MatchTable {
    by_driver_id: verbs_match_ent {
        driver_data: std::ptr::null_mut(),
        u: DRIVER_ID_RXE as u64,
        vendor: 0,
        device: 0,
        kind: match_kind::DRIVER_ID,
    },
    by_name: NameMatchEnt {
        driver_data: std::ptr::null_mut(),
        modalias: c"rdma_device:*Nrxe*".as_ptr(),
        vendor: 0,
        device: 0,
        kind: match_kind::MODALIAS,
    },
    sentinel: verbs_match_ent {
        driver_data: std::ptr::null_mut(),
        u: 0,
        vendor: 0,
        device: 0,
        kind: match_kind::SENTINEL,
    },
});

/// The provider, as registered with libibverbs.
pub static DEVICE_OPS: Static<verbs_device_ops> = Static(verbs_device_ops {
    name: c"uverbs_rxe".as_ptr(),
    // rxe's per-device uverbs ABI: 1 and 2 are the same on 64-bit machines (as the C provider).
    match_min_abi_version: 1,
    match_max_abi_version: 2,
    match_table: std::ptr::addr_of!(MATCH.0).cast::<verbs_match_ent>(),
    static_providers: std::ptr::null(),
    match_device: None,
    alloc_context: Some(crate::context::alloc_context),
    import_context: None,
    alloc_device: Some(alloc_device),
    uninit_device: Some(uninit_device),
});

/// Our per-device object: libibverbs' `verbs_device` first (it fills it after
/// `alloc_device`), then what the provider keeps.
#[repr(C)]
pub struct Device {
    pub vdev: verbs_device,
    /// The uverbs device name (`uverbs0`), to find the device for `uverbs` at open time.
    pub uverbs_name: String,
    /// The IB device name (`rxe0`).
    pub ibdev_name: String,
}

fn c_chars(s: &[c_char]) -> String {
    let bytes: Vec<u8> = s.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `verbs_device_ops.alloc_device`: libibverbs matched `sysfs_dev` to this provider.
unsafe extern "C" fn alloc_device(sysfs_dev: *mut verbs_sysfs_dev) -> *mut verbs_device {
    ffi::guard("alloc_device", std::ptr::null_mut(), || {
        // SAFETY: libibverbs passes a live, initialized verbs_sysfs_dev.
        let sysfs = unsafe { &*sysfs_dev };
        let dev = Box::new(Device {
            // SAFETY: all-zero is a valid verbs_device (null pointers, zero counters, None
            // function pointers); libibverbs fills it after we return, as calloc'd in C.
            vdev: unsafe { std::mem::zeroed() },
            uverbs_name: c_chars(&sysfs.sysfs_name),
            ibdev_name: c_chars(&sysfs.ibdev_name),
        });
        ffi::verbose(format_args!(
            "claiming {} ({}, driver id {}, abi {}) for the Rust provider",
            dev.ibdev_name, dev.uverbs_name, sysfs.driver_id, sysfs.abi_ver
        ));
        let dev = Box::into_raw(dev);
        // SAFETY: `dev` is live; `vdev` is its first field.
        unsafe { std::ptr::addr_of_mut!((*dev).vdev) }
    })
}

/// `verbs_device_ops.uninit_device`: the last reference to the device went away.
unsafe extern "C" fn uninit_device(vdev: *mut verbs_device) {
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

/// The name-match string, for tests.
#[cfg(test)]
pub fn name_modalias() -> &'static std::ffi::CStr {
    // SAFETY: the table entry points at a 'static C string literal.
    unsafe { std::ffi::CStr::from_ptr(MATCH.0.by_name.modalias) }
}
