//! Which provider `uverbs::open` gives each device: the one of its kernel driver (RDMA
//! netlink's driver id; without netlink, as on the mlx5 model, the device name), or, where
//! this build has none (`--no-default-features` leaves mlx5 out), `Error::NoProvider`. Runs on
//! rxe in the guest and on the mlx5 model (`cargo xtask mlx5 --step`, which also runs it built
//! without the mlx5 feature). Devices of other drivers are the unit tests of
//! `providers/mod.rs`: no test machine has one.

mod common;

use uverbs::*;

/// `RDMA_DRIVER_MLX5`, `RDMA_DRIVER_RXE` and `RDMA_DRIVER_SIW` in the kernel's
/// `enum rdma_driver_id`.
const DRIVER_MLX5: u32 = 1;
const DRIVER_RXE: u32 = 14;
const DRIVER_SIW: u32 = 18;

/// The provider a device's kernel driver calls for, as rdma-core picks its C provider.
fn drivers_provider(device: &DeviceInfo) -> &'static str {
    match device.driver_id {
        Some(DRIVER_RXE) => "rxe",
        Some(DRIVER_MLX5) => "mlx5",
        Some(DRIVER_SIW) => "siw",
        Some(id) => panic!("{}: driver id {id} is not rxe's, mlx5's or siw's", device.name),
        None if device.name.starts_with("mlx5_") => "mlx5",
        None if device.name.contains("rxe") => "rxe",
        None if device.name.starts_with("siw") => "siw",
        None => panic!("{}: no driver id and a name of no driver this build knows", device.name),
    }
}

/// The provider this build has for `device`'s driver, if any.
fn built_provider(device: &DeviceInfo) -> Option<&'static str> {
    let provider = drivers_provider(device);
    (provider != "mlx5" || cfg!(feature = "mlx5")).then_some(provider)
}

#[test]
fn every_device_gets_the_provider_of_its_driver_or_the_no_provider_error() {
    let devices = uverbs::devices().unwrap();
    assert!(!devices.is_empty(), "no RDMA device: run with `cargo xtask test`");
    for device in &devices {
        // `open` takes the first provider that matches (providers/mod.rs): here the only one.
        let matching: Vec<_> = uverbs::providers()
            .iter()
            .filter(|p| p.matches(device))
            .map(|p| p.name())
            .collect();
        assert_eq!(matching, Vec::from_iter(built_provider(device)), "{device:?}");
        match (built_provider(device), device.open()) {
            (Some(_), Ok(ctx)) => {
                assert_eq!(ctx.device(), device);
                // The provider's context works: a PD and a CQ through its driver data.
                let _pd = ctx.alloc_pd().unwrap();
                let mut cq = ctx.create_cq(4).unwrap();
                let mut wc = [WorkCompletion::default(); 4];
                assert_eq!(cq.poll(&mut wc), 0);
            }
            (
                None,
                Err(Error::NoProvider {
                    device: name,
                    driver_id,
                    known,
                }),
            ) => {
                assert_eq!((name.as_str(), driver_id), (device.name.as_str(), device.driver_id));
                let built: Vec<_> = uverbs::providers().iter().map(|p| p.name()).collect();
                assert_eq!(known, built.join(", "));
                assert!(!built.contains(&"mlx5"), "{known}");
                eprintln!("{}: Error::NoProvider, as a build without mlx5 must say", device.name);
            }
            (expected, result) => panic!("{}: expected {expected:?}, got {result:?}", device.name),
        }
    }
}

#[test]
fn open_by_name_opens_that_device_and_an_unknown_name_is_no_device() {
    for device in uverbs::devices().unwrap() {
        if built_provider(&device).is_some() {
            assert_eq!(uverbs::open(Some(&device.name)).unwrap().device(), &device);
        }
    }
    match uverbs::open(Some("no_such_device")) {
        Err(Error::NoDevice { name, reason }) => {
            assert_eq!(name.as_deref(), Some("no_such_device"));
            assert!(reason.starts_with("present: "), "{reason}");
        }
        other => panic!("expected Error::NoDevice, got {other:?}"),
    }
}

/// Device and port attributes are typed values: the first device's port 1 is ACTIVE with the
/// link layer of its driver (Ethernet for rxe's RoCE, InfiniBand on the mlx5 model), MTUs,
/// a width and a speed this crate names, and GIDs of the matching type.
#[test]
fn device_and_port_attributes_are_typed_values() {
    let devices = uverbs::devices().unwrap();
    let device = devices.first().expect("an RDMA device");
    if built_provider(device).is_none() {
        eprintln!(
            "{}: no provider in this build (the test above checks that)",
            device.name
        );
        return;
    }
    let ctx = device.open().unwrap();
    let attr = ctx.query_device().unwrap();
    assert!(
        attr.phys_port_cnt >= 1 && attr.max_qp > 0 && attr.max_cqe > 0,
        "{attr:?}"
    );
    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.state, PortState::ACTIVE, "{port:?}");
    // rxe is RoCE; the mlx5 model's port is InfiniBand or, in its RoCE runs, Ethernet. An
    // Ethernet port needs a GRH, an InfiniBand one does not.
    let roce = port.link_layer == LinkLayer::ETHERNET;
    if drivers_provider(device) == "rxe" {
        assert!(roce, "{port:?}");
    } else {
        assert!(roce || port.link_layer == LinkLayer::INFINIBAND, "{port:?}");
    }
    assert_eq!(port.needs_grh(), roce, "{port:?}");
    assert!(port.active_mtu.is_some() && port.active_mtu <= port.max_mtu, "{port:?}");
    assert!(port.active_width.lanes().is_some(), "{port:?}");
    assert!(port.active_speed.lane_mbps().is_some(), "{port:?}");
    let gids = ctx.gid_table().unwrap();
    let roce_gid = |g: &Gid| g.gid_type == GidType::ROCE_V1 || g.gid_type == GidType::ROCE_V2;
    match roce {
        true => assert!(gids.iter().all(roce_gid) && gids.iter().any(|g| g.gid_type == GidType::ROCE_V2)),
        false => assert!(!gids.is_empty() && gids.iter().all(|g| g.gid_type == GidType::IB)),
    }
    println!("{}: {port:?}; GIDs {gids:?}", device.name);
}

/// The extended QUERY_DEVICE on rxe: the base attributes QUERY_DEVICE gives, the same low 32
/// capability bits, and above them what the running kernel sets (docs/kernel-facts.md, "Between
/// kernels"): nothing on Linux 6.1, bits 38 to 40 on 6.12. (The mlx5 model has no extended
/// QUERY_DEVICE; the drop-in, which uses it, drives rxe only.)
#[test]
fn extended_device_attributes_carry_the_kernels_upper_capability_bits() {
    let devices = uverbs::devices().unwrap();
    let device = devices.first().expect("an RDMA device");
    if drivers_provider(device) != "rxe" || built_provider(device).is_none() {
        eprintln!("{}: not rxe, or no provider in this build", device.name);
        return;
    }
    let ctx = device.open().unwrap();
    let ex = ctx.query_device_ex().unwrap();
    assert_eq!(ex.attr, ctx.query_device().unwrap());
    assert_eq!(ex.device_cap_flags_ex as u32, ex.attr.device_cap_flags, "{ex:?}");
    assert_eq!(
        ex.device_cap_flags_ex >> 32 << 32,
        common::kernel::rxe_upper_cap_flags(),
        "{} {:#x}",
        common::kernel::release(),
        ex.device_cap_flags_ex
    );
}
