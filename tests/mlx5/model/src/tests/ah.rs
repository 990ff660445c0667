//! Address handles: CREATE_AH as the core and mlx5 check it on InfiniBand.

use super::ioctl::obj;
use super::*;

impl Env {
    fn create_ah(&self, pd: u32, f: impl FnOnce(&mut abi::AhAttr)) -> Result<u32, Errno> {
        let mut req = abi::CreateAh {
            response: RESP,
            user_handle: 0x5,
            pd_handle: pd,
            reserved: 0,
            attr: abi::AhAttr {
                dlid: 7,
                port_num: 1,
                ..Default::default()
            },
        };
        f(&mut req.attr);
        self.write(cmd::CREATE_AH, req.as_bytes(), &[], 1)?;
        Ok(u32::from_ne_bytes(self.resp::<[u8; 4]>()))
    }
}

#[test]
fn create_ah_rules_as_the_core_and_mlx5_on_infiniband() {
    let env = Env::new(false);
    let pd = env.alloc_pd();
    // uverbs_cmd.c:2427 a bad port (before the PD), :2432 an unknown PD.
    assert_eq!(env.create_ah(pd + 5, |a| a.port_num = 2), Err(EINVAL));
    assert_eq!(env.create_ah(pd + 5, |_| {}), Err(ENOENT));
    // cache.c:1232: a GRH naming a GID beyond the table.
    assert_eq!(env.create_ah(pd, |a| (a.is_global, a.sgid_index) = (1, 1)), Err(EINVAL));
    // The core response needs its 4 bytes (verify_hdr: ENOSPC).
    let req = abi::CreateAh {
        response: RESP,
        pd_handle: pd,
        attr: abi::AhAttr {
            port_num: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(env.write(cmd::CREATE_AH, req.as_bytes(), &[], 0), Err(ENOSPC));
    // An IB AH, with or without a GRH, takes no driver data back (ah.c:106 is RoCE's).
    let plain = env.create_ah(pd, |_| {}).unwrap();
    let global = env.create_ah(pd, |a| (a.is_global, a.hop_limit) = (1, 64)).unwrap();
    assert_ne!(plain, global);
    // verbs.c:544: the AH holds its PD.
    assert_eq!(env.write(cmd::DEALLOC_PD, &pd.to_ne_bytes(), &[], 0), Err(EBUSY));
    env.write(cmd::DESTROY_AH, &plain.to_ne_bytes(), &[], 0).unwrap();
    assert_eq!(env.write(cmd::DESTROY_AH, &plain.to_ne_bytes(), &[], 0), Err(ENOENT));
    // The ioctl AH_DESTROY runs the same handler.
    env.ioctl(6, 0, &[obj(0, u64::from(global))]).unwrap();
    assert_eq!(env.ioctl(6, 0, &[obj(0, u64::from(global))]).map(drop), Err(ENOENT));
    env.write(cmd::DEALLOC_PD, &pd.to_ne_bytes(), &[], 0).unwrap();
}
