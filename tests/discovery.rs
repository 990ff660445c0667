//! Which provider `uverbs::open` gives each device: the one of its kernel driver (RDMA
//! netlink's driver id; without netlink, as on the mlx5 model, the device name). Runs on rxe
//! in the guest and on the mlx5 model (`cargo xtask mlx5 --step`). A device no provider
//! drives, and a build without the mlx5 provider, are the unit tests of `providers/mod.rs`:
//! no test machine has such a device.

use uverbs::*;

/// `RDMA_DRIVER_MLX5` and `RDMA_DRIVER_RXE` in the kernel's `enum rdma_driver_id`.
const DRIVER_MLX5: u32 = 1;
const DRIVER_RXE: u32 = 14;

/// The provider a device's kernel driver calls for, as rdma-core picks its C provider.
fn drivers_provider(device: &DeviceInfo) -> &'static str {
    match device.driver_id {
        Some(DRIVER_RXE) => "rxe",
        Some(DRIVER_MLX5) => "mlx5",
        Some(id) => panic!("{}: driver id {id} is neither rxe's nor mlx5's", device.name),
        None if device.name.starts_with("mlx5_") => "mlx5",
        None if device.name.contains("rxe") => "rxe",
        None => panic!("{}: no driver id and a name of neither driver", device.name),
    }
}

#[test]
fn every_device_gets_the_provider_of_its_driver_and_opens_with_it() {
    let devices = uverbs::devices().unwrap();
    assert!(!devices.is_empty(), "no RDMA device: run with `cargo xtask test`");
    for device in &devices {
        // `open` takes the first provider that matches (providers/mod.rs): here the only one.
        let matching: Vec<_> = uverbs::providers()
            .iter()
            .filter(|p| p.matches(device))
            .map(|p| p.name())
            .collect();
        assert_eq!(matching, [drivers_provider(device)], "{device:?}");
        let ctx = device.open().unwrap_or_else(|e| panic!("{}: {e}", device.name));
        assert_eq!(ctx.device(), device);
        // The provider's context works: a PD and a CQ through its driver data.
        let pd = ctx.alloc_pd().unwrap();
        let mut cq = ctx.create_cq(4).unwrap();
        let mut wc = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut wc), 0);
        drop(pd);
    }
}

#[test]
fn open_by_name_opens_that_device_and_an_unknown_name_is_no_device() {
    for device in uverbs::devices().unwrap() {
        assert_eq!(uverbs::open(Some(&device.name)).unwrap().device(), &device);
    }
    match uverbs::open(Some("no_such_device")) {
        Err(Error::NoDevice { name, reason }) => {
            assert_eq!(name.as_deref(), Some("no_such_device"));
            assert!(reason.starts_with("present: "), "{reason}");
        }
        other => panic!("expected Error::NoDevice, got {other:?}"),
    }
}
