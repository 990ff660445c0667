//! Vendor modules. Each lives in its own folder and provides a [`Provider`]; adding a vendor is
//! a folder plus one entry in [`PROVIDERS`]. The core finds the provider for a device here and
//! never names a vendor itself.

use crate::device::DeviceInfo;
use crate::error::{Error, Result};
use crate::front_end::MakeQueues;
use crate::provider::Provider;

/// Built with the `mlx5` feature (a default one).
#[cfg(feature = "mlx5")]
mod mlx5;
mod rxe;
mod siw;

/// The mlx5 CQ's hostile-CQE harness, for `crate::testing`.
#[cfg(all(feature = "mlx5", any(test, feature = "test-support")))]
pub use mlx5::hostile_cqes;
/// The rxe ring's hostile-ring harness, for `crate::testing`.
#[cfg(any(test, feature = "test-support"))]
pub use rxe::hostile;
/// The siw CQ's hostile-ring harness, for `crate::testing`.
#[cfg(any(test, feature = "test-support"))]
pub use siw::hostile as siw_hostile;

/// A vendor compiled in: its provider (the vendor contract, `crate::provider`) and how a QP
/// holds the queues its contexts make (the front-end interface, `crate::front_end`).
pub(crate) struct Vendor {
    /// The provider.
    pub(crate) provider: &'static dyn Provider,
    /// Called only with queues `provider`'s contexts made.
    pub(crate) queues: MakeQueues,
}

const RXE: Vendor = Vendor {
    provider: &rxe::Rxe,
    queues: rxe::queues,
};
const SIW: Vendor = Vendor {
    provider: &siw::Siw,
    queues: siw::queues,
};
#[cfg(feature = "mlx5")]
const MLX5: Vendor = Vendor {
    provider: &mlx5::Mlx5,
    queues: mlx5::queues,
};

/// Every vendor compiled in, asked in order.
#[cfg(not(feature = "mlx5"))]
static VENDORS: &[Vendor] = &[RXE, SIW];
/// Every vendor compiled in, asked in order.
#[cfg(feature = "mlx5")]
static VENDORS: &[Vendor] = &[RXE, MLX5, SIW];

/// [`VENDORS`]' providers, in order.
#[cfg(not(feature = "mlx5"))]
static PROVIDERS: &[&dyn Provider] = &[RXE.provider, SIW.provider];
/// [`VENDORS`]' providers, in order.
#[cfg(feature = "mlx5")]
static PROVIDERS: &[&dyn Provider] = &[RXE.provider, MLX5.provider, SIW.provider];

/// Every provider compiled into this build, in the order [`crate::open`] asks them. For front
/// ends over the public API that must name devices' providers themselves (the drop-in
/// libibverbs provider registers a match table per provider, by name and kernel driver id).
pub fn providers() -> &'static [&'static dyn Provider] {
    PROVIDERS
}

/// The provider that drives `device`.
pub(crate) fn find(device: &DeviceInfo) -> Result<&'static Vendor> {
    VENDORS
        .iter()
        .find(|v| v.provider.matches(device))
        .ok_or_else(|| Error::NoProvider {
            device: device.name.clone(),
            driver_id: device.driver_id,
            known: PROVIDERS.iter().map(|p| p.name()).collect::<Vec<_>>().join(", "),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device as discovery describes it: `driver_id` from RDMA netlink, `None` without it.
    fn device(name: &str, driver_id: Option<u32>, abi_version: u32) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            uverbs: "uverbs0".into(),
            dev_path: "/dev/infiniband/uverbs0".into(),
            dev_number: "231:192".into(),
            abi_version,
            driver_id,
            kernel_index: Some(0),
            parent_netdev: None,
            node_guid: String::new(),
        }
    }

    fn found(device: &DeviceInfo) -> Result<&'static str> {
        find(device).map(|v| v.provider.name())
    }

    #[test]
    fn rxe_devices_get_rxe_by_driver_id_else_by_name() {
        // `RDMA_DRIVER_RXE`, whatever the device is called.
        assert_eq!(found(&device("roce_a", Some(14), 2)).unwrap(), "rxe");
        assert_eq!(found(&device("rxe0", None, 2)).unwrap(), "rxe");
        assert_eq!(found(&device("rxe0", None, 1)).unwrap(), "rxe");
    }

    #[cfg(feature = "mlx5")]
    #[test]
    fn mlx5_devices_get_mlx5_by_driver_id_else_by_name() {
        // `RDMA_DRIVER_MLX5`, whatever the device is called; the mlx5 model has no netlink.
        assert_eq!(found(&device("ib_a", Some(1), 1)).unwrap(), "mlx5");
        assert_eq!(found(&device("mlx5_0", None, 1)).unwrap(), "mlx5");
        assert_eq!(
            providers().iter().map(|p| p.name()).collect::<Vec<_>>(),
            ["rxe", "mlx5", "siw"]
        );
    }

    #[test]
    fn siw_devices_get_siw_by_driver_id_else_by_name() {
        // `RDMA_DRIVER_SIW`, whatever the device is called, at siw's one ABI version.
        assert_eq!(found(&device("iw_a", Some(18), 1)).unwrap(), "siw");
        assert_eq!(found(&device("siw0", None, 1)).unwrap(), "siw");
        assert!(find(&device("siw0", Some(18), 2)).is_err());
        assert!(find(&device("siw0", Some(14), 1)).is_ok_and(|p| p.provider.name() == "rxe"));
    }

    /// The error names the device, its driver id and what this build has.
    fn assert_no_provider(device: &DeviceInfo, known: &str) {
        match find(device) {
            Err(Error::NoProvider {
                device: name,
                driver_id,
                known: listed,
            }) => {
                assert_eq!(
                    (name.as_str(), driver_id, listed.as_str()),
                    (device.name.as_str(), device.driver_id, known)
                );
            }
            other => panic!(
                "{}: expected NoProvider, got {:?}",
                device.name,
                other.map(|v| v.provider.name())
            ),
        }
    }

    #[cfg(feature = "mlx5")]
    #[test]
    fn a_device_no_provider_drives_gets_the_no_provider_error() {
        let known = "rxe, mlx5, siw";
        // `RDMA_DRIVER_EFA` and `RDMA_DRIVER_MLX4`, and an id past the kernel's list.
        assert_no_provider(&device("efa_0", Some(17), 1), known);
        assert_no_provider(&device("mlx4_0", Some(2), 1), known);
        assert_no_provider(&device("dev0", Some(999), 1), known);
        // A name neither provider claims, without netlink.
        assert_no_provider(&device("hfi1_0", None, 1), known);
        // The driver id decides over the name.
        assert_no_provider(&device("mlx5_0", Some(17), 1), known);
        assert_no_provider(&device("rxe0", Some(17), 2), known);
        // The right driver at an ABI version its provider does not speak.
        assert_no_provider(&device("mlx5_0", Some(1), 2), known);
        assert_no_provider(&device("rxe0", Some(14), 3), known);
    }

    #[cfg(not(feature = "mlx5"))]
    #[test]
    fn without_the_mlx5_feature_an_mlx5_device_gets_the_no_provider_error() {
        assert_no_provider(&device("mlx5_0", Some(1), 1), "rxe, siw");
        assert_no_provider(&device("mlx5_0", None, 1), "rxe, siw");
        assert_no_provider(&device("efa_0", Some(17), 1), "rxe, siw");
    }
}
