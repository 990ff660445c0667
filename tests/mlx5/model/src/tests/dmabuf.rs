//! REG_DMABUF_MR as 6.1's core and mlx5_ib accept it, with the test host's arena buffer as
//! the dma-buf.

use super::ioctl::{inline, obj, out};
use super::*;
use std::sync::atomic::Ordering;

const FD: i32 = 42;
const MR: u16 = 7;
const REG_DMABUF_MR: u16 = 4;

fn attrs(pd: u32, offset: u64, length: u64, iova: u64, access: u32) -> Vec<abi::IoctlAttr> {
    vec![
        obj(0, 0),
        obj(1, u64::from(pd)),
        inline(2, 8, offset),
        inline(3, 8, length),
        inline(4, 8, iova),
        inline(5, 4, FD as u64),
        inline(6, 4, u64::from(access)),
        out(7, 0, 4),
        out(8, 4, 4),
    ]
}

const LW: u32 = abi::access::LOCAL_WRITE;
const RW: u32 = abi::access::REMOTE_WRITE;
const RR: u32 = abi::access::REMOTE_READ;

#[test]
fn dmabuf_regions_follow_the_core_and_mlx5_rules() {
    let env = Env::new(false);
    let pd = env.alloc_pd();
    // No such fd: dma_buf_get's EBADF.
    assert_eq!(
        env.ioctl(MR, REG_DMABUF_MR, &attrs(pd, 0, 4096, 0, LW)).map(drop),
        Err(EBADF)
    );
    *env.host.dmabuf.lock().unwrap() = Some((FD, DATA, 0x8000));
    let refused = [
        // offset and iova in different page positions (uverbs_std_types_mr.c:218)
        (attrs(pd, 0x10, 4096, 0x20, LW), EINVAL),
        // remote write without local write (ib_check_mr_access)
        (attrs(pd, 0, 4096, 0, RW), EINVAL),
        // memory-window binding is not among the flags allowed (:226-233)
        (attrs(pd, 0, 4096, 0, LW | 0x10), EINVAL),
        // past the buffer's end, and empty (umem_dmabuf.c:133, :149)
        (attrs(pd, 0x1000, 0x8000, 0x1000, LW), EINVAL),
        (attrs(pd, 0, 0, 0, LW), EINVAL),
        // a range that wraps (:123)
        (attrs(pd, u64::MAX - 4095, 8192, u64::MAX - 4095, LW), EINVAL),
        // an unknown PD: the lookup's ENOENT
        (attrs(pd + 9, 0, 4096, 0, LW), ENOENT),
    ];
    for (a, errno) in refused {
        assert_eq!(env.ioctl(MR, REG_DMABUF_MR, &a).map(drop), Err(errno), "{a:?}");
    }
    assert_eq!(
        env.model.lock().unwrap().mrs.iter().count(),
        0,
        "no region left by a refusal"
    );

    let before = DMABUF_UNMAPS.load(Ordering::SeqCst);
    let back = env
        .ioctl(MR, REG_DMABUF_MR, &attrs(pd, 0x1000, 0x4000, 0x9000_1000, LW | RW | RR))
        .unwrap();
    let handle = back[0].data as u32;
    let keys: [u32; 2] = env.resp();
    let model = env.model.lock().unwrap();
    let mr = model.mrs.get(handle).expect("the region");
    assert_eq!(
        (mr.addr, mr.length, mr.iova, mr.access, mr.key, mr.key),
        (DATA + 0x1000, 0x4000, 0x9000_1000, LW | RW | RR, keys[0], keys[1])
    );
    drop(model);
    // Destroyed: the buffer's mapping goes with it, and the PD is free again.
    env.ioctl(MR, 1, &[obj(0, u64::from(handle))]).unwrap();
    assert_eq!(DMABUF_UNMAPS.load(Ordering::SeqCst), before + 1);
    assert_eq!(env.ioctl(1, 0, &[obj(0, u64::from(pd))]).map(drop), Ok(()));
}
