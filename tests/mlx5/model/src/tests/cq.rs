//! CQs: CREATE_CQ's core and driver data, RESIZE_CQ and DESTROY_CQ.

use super::*;

pub(super) fn cq_err(env: &Env, core: abi::CreateCq, drv: &[u8], out_words: u16) -> Result<(), Errno> {
    env.write(cmd::CREATE_CQ, core.as_bytes(), drv, out_words)
}

#[test]
fn create_cq_driver_data_rules() {
    let env = Env::new(false);
    let core = Env::cq_cmd(15, -1);
    let good = Env::mlx5_cq(CQ_BUF, DB);
    // shorter than `flags`
    assert_eq!(cq_err(&env, core, &good.as_bytes()[..21], 4), Err(EINVAL));
    // unknown flags; CQE size; reserved fields
    let mut bad = good;
    bad.flags = 1 << 3;
    assert_eq!(cq_err(&env, core, bad.as_bytes(), 4), Err(EINVAL));
    let mut bad = good;
    bad.cqe_size = 32;
    assert_eq!(cq_err(&env, core, bad.as_bytes(), 4), Err(EINVAL));
    let mut bad = good;
    bad.reserved1 = 1;
    assert_eq!(cq_err(&env, core, bad.as_bytes(), 4), Err(EINVAL));
    // CQE compression and 128-byte padding need capabilities the device lacks
    let mut bad = good;
    bad.cqe_comp_en = 1;
    assert_eq!(cq_err(&env, core, bad.as_bytes(), 4), Err(EOPNOTSUPP));
    // unmapped buffer
    let mut bad = good;
    bad.buf_addr = 0x7000_0000;
    assert_eq!(cq_err(&env, core, bad.as_bytes(), 4), Err(EFAULT));
    // no room for the 4-byte CQN: EFAULT
    assert_eq!(cq_err(&env, core, good.as_bytes(), 2), Err(EFAULT));
    assert_eq!(cq_err(&env, core, good.as_bytes(), 4), Ok(()));
    assert_eq!(env.resp::<abi::CreateCqResp>().cqe, 15);
    // real-time timestamps are only recorded (hw/mlx5/cq.c:838)
    let mut rt = good;
    rt.flags |= abi::CQ_FLAG_REAL_TIME_TS;
    assert_eq!(cq_err(&env, core, rt.as_bytes(), 4), Ok(()));
}

#[test]
fn create_cq_core_rules() {
    let env = Env::new(false);
    let good = Env::mlx5_cq(CQ_BUF, DB);
    let mut core = Env::cq_cmd(15, -1);
    core.comp_vector = 99;
    assert_eq!(cq_err(&env, core, good.as_bytes(), 4), Err(EINVAL));
    assert_eq!(cq_err(&env, Env::cq_cmd(15, 55), good.as_bytes(), 4), Err(EBADF));
    assert_eq!(cq_err(&env, Env::cq_cmd(1 << 22, -1), good.as_bytes(), 4), Err(EINVAL));
    assert_eq!(cq_err(&env, Env::cq_cmd(u32::MAX, -1), good.as_bytes(), 4), Err(EINVAL));
}

#[test]
fn with_dynamic_uars_a_cq_must_name_its_uar_page() {
    let env = Env::new(true);
    let core = Env::cq_cmd(15, -1);
    let mut drv = Env::mlx5_cq(CQ_BUF, DB);
    assert_eq!(cq_err(&env, core, drv.as_bytes(), 4), Err(EINVAL));
    drv.flags = abi::CQ_FLAG_UAR_PAGE_INDEX;
    assert_eq!(cq_err(&env, core, drv.as_bytes(), 4), Ok(()));
}

#[test]
fn resize_cq_rules() {
    let env = Env::new(false);
    let cq = env.create_cq(15, CQ_BUF, DB).unwrap();
    let resize = |handle: u32, cqe: u32, ucmd: Option<abi::Mlx5ResizeCq>| {
        let req = abi::ResizeCq {
            response: RESP,
            cq_handle: handle,
            cqe,
        };
        let udata = ucmd.map(|u| u.as_bytes().to_vec()).unwrap_or_default();
        env.write(cmd::RESIZE_CQ, req.as_bytes(), &udata, 2)
    };
    let good = abi::Mlx5ResizeCq {
        buf_addr: CQ_BUF + 0x2000,
        cqe_size: 64,
        ..Default::default()
    };
    // an unknown CQ: the lookup's ENOENT (core/uverbs_cmd.c:1135)
    assert_eq!(resize(cq + 7, 31, Some(good)), Err(ENOENT));
    // entries below 1 or beyond the device (hw/mlx5/cq.c:1283)
    assert_eq!(resize(cq, 0, Some(good)), Err(EINVAL));
    assert_eq!(resize(cq, 1 << 30, Some(good)), Err(EINVAL));
    // no driver data: ib_copy_from_udata from NULL is EFAULT (cq.c:1161)
    assert_eq!(resize(cq, 31, None), Err(EFAULT));
    // reserved fields (cq.c:1165); a CQE size the device does not write
    assert_eq!(
        resize(cq, 31, Some(abi::Mlx5ResizeCq { reserved1: 1, ..good })),
        Err(EINVAL)
    );
    assert_eq!(
        resize(cq, 31, Some(abi::Mlx5ResizeCq { cqe_size: 96, ..good })),
        Err(EINVAL)
    );
    // a buffer that is not mapped (ib_umem_get)
    let unmapped = abi::Mlx5ResizeCq {
        buf_addr: 0x7000_0000,
        ..good
    };
    assert_eq!(resize(cq, 31, Some(unmapped)), Err(EFAULT));
    assert_eq!(resize(cq, 31, Some(good)), Ok(()));
    assert_eq!(env.resp::<[u32; 2]>()[0], 31, "32 slots, the kernel reports cqe 31");
}

#[test]
fn destroy_cq_in_use_is_ebusy_and_unknown_enoent() {
    let env = Env::new(false);
    let pd = env.alloc_pd();
    let cq = env.create_cq(15, CQ_BUF, DB).unwrap();
    env.create_qp_with(
        Env::qp_cmd(pd, cq, abi::qpt::RC),
        Env::mlx5_qp(QP_BUF, DB + 64, 1).as_bytes(),
    )
    .unwrap();
    let d = abi::DestroyObj {
        response: RESP,
        handle: cq,
        reserved: 0,
    };
    assert_eq!(env.write(cmd::DESTROY_CQ, d.as_bytes(), &[], 2), Err(EBUSY));
    let d = abi::DestroyObj {
        response: RESP,
        handle: cq + 9,
        reserved: 0,
    };
    assert_eq!(env.write(cmd::DESTROY_CQ, d.as_bytes(), &[], 2), Err(ENOENT));
    // A 16-byte DESTROY_CQ (rdma-core v18/19) is read as 24: the handle comes from the 8
    // bytes after the write. Here they name the unknown CQ, so the lookup, not the size,
    // answers.
    assert_eq!(env.write(cmd::DESTROY_CQ, &d.as_bytes()[..8], &[], 2), Err(ENOENT));
    // Any other short request is ENOSPC.
    assert_eq!(env.write(cmd::DESTROY_QP, &d.as_bytes()[..8], &[], 2), Err(ENOSPC));
}
