//! GET_CONTEXT (`mlx5_ib_alloc_ucontext`) and its driver data, PDs and MRs.

use super::*;

pub(super) fn ucontext(f: impl FnOnce(&mut abi::AllocUcontextReq)) -> abi::AllocUcontextReq {
    let mut r = abi::AllocUcontextReq {
        total_num_bfregs: 16,
        num_low_latency_bfregs: 4,
        max_cqe_version: 1,
        lib_caps: 1,
        ..Default::default()
    };
    f(&mut r);
    r
}

#[test]
fn a_second_get_context_is_einval() {
    let env = Env::new(false);
    assert_eq!(env.get_context(ucontext(|_| {}).as_bytes()), Err(EINVAL));
}

#[test]
fn ucontext_driver_data_between_v0_and_v2_is_einval() {
    let env = Env::bare();
    assert_eq!(env.get_context(&ucontext(|_| {}).as_bytes()[..12]), Err(EINVAL));
}

#[test]
fn ucontext_unknown_flags_are_eopnotsupp() {
    let env = Env::bare();
    assert_eq!(env.get_context(ucontext(|r| r.flags = 2).as_bytes()), Err(EOPNOTSUPP));
}

#[test]
fn ucontext_reserved_fields_and_comp_mask_are_eopnotsupp() {
    for f in [
        (|r: &mut abi::AllocUcontextReq| r.reserved0 = 1) as fn(&mut abi::AllocUcontextReq),
        |r| r.reserved1 = 1,
        |r| r.reserved2 = 1,
        |r| r.comp_mask = 1,
    ] {
        let env = Env::bare();
        assert_eq!(env.get_context(ucontext(f).as_bytes()), Err(EOPNOTSUPP));
    }
}

#[test]
fn ucontext_more_low_latency_bfregs_than_bfregs_is_einval() {
    let env = Env::bare();
    assert_eq!(
        env.get_context(ucontext(|r| r.num_low_latency_bfregs = 16).as_bytes()),
        Err(EINVAL)
    );
}

#[test]
fn ucontext_too_many_bfregs_is_enomem() {
    let env = Env::bare();
    assert_eq!(
        env.get_context(ucontext(|r| r.total_num_bfregs = 2000).as_bytes()),
        Err(ENOMEM)
    );
}

#[test]
fn ucontext_devx_is_refused_so_libmlx5_retries_without() {
    let env = Env::bare();
    // hw/mlx5/devx.c:122: no log_max_uctx is EINVAL (6.1), not EOPNOTSUPP.
    assert_eq!(
        env.get_context(ucontext(|r| r.flags = abi::ALLOC_UCTX_DEVX).as_bytes()),
        Err(EINVAL)
    );
    assert_eq!(env.get_context(ucontext(|_| {}).as_bytes()), Ok(()));
    let resp: [u8; 80] = env.resp();
    let drv = abi::AllocUcontextResp::read_from_bytes(&resp[8..]).unwrap();
    assert_eq!((drv.tot_bfregs, drv.cqe_version, drv.response_length), (16, 1, 72));
}

// ---- PD and MR -------------------------------------------------------------------------

#[test]
fn alloc_pd_without_a_driver_response_buffer_is_efault() {
    let env = Env::new(false);
    assert_eq!(env.write(cmd::ALLOC_PD, &RESP.to_ne_bytes(), &[], 1), Err(EFAULT));
    assert_eq!(env.write(cmd::ALLOC_PD, &RESP.to_ne_bytes(), &[], 2), Ok(()));
}

#[test]
fn dealloc_pd_of_an_unknown_handle_is_enoent_and_of_a_used_pd_ebusy() {
    let env = Env::new(false);
    assert_eq!(env.write(cmd::DEALLOC_PD, &9u32.to_ne_bytes(), &[], 0), Err(ENOENT));
    let pd = env.alloc_pd();
    env.reg_mr(pd, DATA, 4096, 1).unwrap();
    assert_eq!(env.write(cmd::DEALLOC_PD, &pd.to_ne_bytes(), &[], 0), Err(EBUSY));
}

#[test]
fn reg_mr_rules() {
    let env = Env::new(false);
    let pd = env.alloc_pd();
    // start and hca_va with different page offsets
    let req = abi::RegMr {
        response: RESP,
        start: DATA,
        length: 64,
        hca_va: DATA + 1,
        pd_handle: pd,
        access_flags: 1,
    };
    assert_eq!(env.write(cmd::REG_MR, req.as_bytes(), &[], 3), Err(EINVAL));
    // remote write without local write; unknown access bits; on-demand paging
    assert_eq!(env.reg_mr(pd, DATA, 64, abi::access::REMOTE_WRITE), Err(EINVAL));
    assert_eq!(env.reg_mr(pd, DATA, 64, 1 << 12), Err(EINVAL));
    assert_eq!(env.reg_mr(pd, DATA, 64, 0x40), Err(EINVAL));
    // unknown PD (the lookup's ENOENT on 6.1.147 and later); memory that is not mapped
    assert_eq!(env.reg_mr(pd + 5, DATA, 64, 1), Err(ENOENT));
    assert_eq!(env.reg_mr(pd, 0x7000_0000, 64, 1), Err(EFAULT));
    assert!(env.reg_mr(pd, DATA, 64, 1).is_ok());
}

#[test]
fn reg_mr_beyond_rlimit_memlock_is_enomem_and_zero_is_eperm() {
    let env = Env::new(false);
    let pd = env.alloc_pd();
    // ib_umem_get: 4 pages allowed; one MR of 1 byte already pins a page.
    *env.host.memlock_pages.lock().unwrap() = Some(4);
    let (one, _) = env.reg_mr(pd, DATA, 1, 1).unwrap();
    // 0x3800 bytes from 0x800 into a page span 4 pages: 5 in all
    assert_eq!(env.reg_mr(pd, DATA + 0x800, 0x3800, 1), Err(ENOMEM));
    let (two, _) = env.reg_mr(pd, DATA + 0x800, 0x1000, 1).unwrap();
    assert_eq!(env.reg_mr(pd, DATA, 0x2000, 1), Err(ENOMEM), "3 pinned, 2 more");
    // the limit is checked before the pages are: past it, unmapped memory is ENOMEM too
    assert_eq!(env.reg_mr(pd, 0x7000_0000, 0x10000, 1), Err(ENOMEM));
    // deregistering unpins
    for mr in [one, two] {
        env.write(cmd::DEREG_MR, &mr.to_ne_bytes(), &[], 0).unwrap();
    }
    assert!(env.reg_mr(pd, DATA, 0x4000, 1).is_ok());
    // no RLIMIT_MEMLOCK at all and no CAP_IPC_LOCK: can_do_mlock is EPERM
    *env.host.memlock_pages.lock().unwrap() = Some(0);
    assert_eq!(env.reg_mr(pd, DATA, 1, 1), Err(EPERM));
}
