//! Vendor modules. Each lives in its own folder and provides a [`Provider`]; adding a vendor is
//! a folder plus one entry in [`PROVIDERS`]. The core finds the provider for a device here and
//! never names a vendor itself.

use crate::device::DeviceInfo;
use crate::error::{Error, Result};
use crate::provider::Provider;

/// Not yet run on a device or on the mlx5 model: built only with the `mlx5` feature.
#[cfg(feature = "mlx5")]
mod mlx5;
mod rxe;

/// The mlx5 CQ's hostile-CQE harness, for `crate::testing`.
#[cfg(all(feature = "mlx5", any(test, feature = "test-support")))]
pub use mlx5::hostile_cqes;
/// The rxe ring's hostile-ring harness, for `crate::testing`.
#[cfg(any(test, feature = "test-support"))]
pub use rxe::hostile;

/// Every provider compiled in, asked in order.
#[cfg(not(feature = "mlx5"))]
static PROVIDERS: &[&dyn Provider] = &[&rxe::Rxe];
/// Every provider compiled in, asked in order.
#[cfg(feature = "mlx5")]
static PROVIDERS: &[&dyn Provider] = &[&rxe::Rxe, &mlx5::Mlx5];

/// Every provider compiled into this build, in the order [`crate::open`] asks them. For front
/// ends over the public API that must name devices' providers themselves (the drop-in
/// libibverbs provider registers a match table per provider, by name and kernel driver id).
pub fn providers() -> &'static [&'static dyn Provider] {
    PROVIDERS
}

/// The provider that drives `device`.
pub(crate) fn find(device: &DeviceInfo) -> Result<&'static dyn Provider> {
    PROVIDERS
        .iter()
        .copied()
        .find(|p| p.matches(device))
        .ok_or_else(|| Error::NoProvider {
            device: device.name.clone(),
            driver_id: device.driver_id,
            known: PROVIDERS.iter().map(|p| p.name()).collect::<Vec<_>>().join(", "),
        })
}
