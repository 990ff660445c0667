//! Unit tests: each kernel validation rule called with bytes, and the device against
//! well-formed and hostile WQEs and doorbells in an [`Arena`] that counts stray accesses.

use crate::abi::{self, cmd, qp_attr, qps};
use crate::harness::*;
use crate::kernel::{Errno, MapAccess, Mapping};
use crate::mem::Memory;
use libc::{EBADF, EBUSY, EFAULT, EINVAL, ENOENT, ENOMEM, ENOSPC, EOPNOTSUPP, EPERM, EPROTONOSUPPORT};
use zerocopy::{FromBytes, IntoBytes};

// ---- write() framing ---------------------------------------------------------------------

#[test]
fn a_write_shorter_than_the_header_is_einval() {
    let env = Env::new(false);
    env.mem.write(CMD, &[0; 8]).unwrap();
    assert_eq!(
        env.model.lock().unwrap().write(CTX, CMD, 7, &env.mem, &env.host),
        Err(EINVAL)
    );
}

#[test]
fn in_words_must_cover_the_whole_write() {
    let env = Env::new(false);
    let hdr = abi::CmdHdr {
        command: cmd::ALLOC_PD,
        in_words: 5,
        out_words: 2,
    };
    let mut b = hdr.as_bytes().to_vec();
    b.extend_from_slice(&RESP.to_ne_bytes());
    env.mem.write(CMD, &b).unwrap();
    assert_eq!(
        env.model.lock().unwrap().write(CTX, CMD, b.len(), &env.mem, &env.host),
        Err(EINVAL)
    );
}

#[test]
fn a_request_shorter_than_the_command_is_enospc() {
    let env = Env::new(false);
    assert_eq!(env.write(cmd::REG_MR, &[0; 16], &[], 3), Err(ENOSPC));
}

#[test]
fn out_words_short_of_the_core_response_is_enospc() {
    let env = Env::new(false);
    assert_eq!(env.write(cmd::QUERY_DEVICE, &RESP.to_ne_bytes(), &[], 43), Err(ENOSPC));
}

#[test]
fn unknown_command_bits_are_einval_and_unmodelled_commands_eopnotsupp() {
    let env = Env::new(false);
    assert_eq!(
        env.write(0x100 | cmd::ALLOC_PD, &RESP.to_ne_bytes(), &[], 2),
        Err(EINVAL)
    );
    // POST_SEND (28) is not enabled on mlx5; REQ_NOTIFY_CQ (23) neither.
    assert_eq!(env.write(28, &[0; 24], &[], 1), Err(EOPNOTSUPP));
    assert_eq!(env.write(23, &[0; 8], &[], 0), Err(EOPNOTSUPP));
    // Their in_words is checked first (sizes 0: core/uverbs_main.c:535), inside the table
    // only: command 41 lies beyond it.
    for (command, expected) in [(28, EINVAL), (23, EINVAL), (41, EOPNOTSUPP)] {
        let hdr = abi::CmdHdr {
            command,
            in_words: 5,
            out_words: 0,
        };
        env.mem.write(CMD, hdr.as_bytes()).unwrap();
        let got = env.model.lock().unwrap().write(CTX, CMD, 8, &env.mem, &env.host);
        assert_eq!(got, Err(expected), "command {command}");
    }
}

#[test]
fn commands_before_get_context_are_einval() {
    let env = Env::bare();
    assert_eq!(env.write(cmd::ALLOC_PD, &RESP.to_ne_bytes(), &[], 2), Err(EINVAL));
}

/// Commands that only look a handle up ask for no ucontext: the lookup's ENOENT.
#[test]
fn lookups_before_get_context_are_enoent() {
    let env = Env::bare();
    assert_eq!(env.write(cmd::DEALLOC_PD, &[0; 4], &[], 0), Err(ENOENT));
    assert_eq!(env.write(cmd::DEREG_MR, &[0; 4], &[], 0), Err(ENOENT));
    assert_eq!(
        env.write(cmd::DESTROY_QP, &RESP.to_ne_bytes().repeat(2), &[], 1),
        Err(ENOENT)
    );
    assert_eq!(
        env.write(cmd::DESTROY_CQ, &RESP.to_ne_bytes().repeat(2), &[], 2),
        Err(ENOENT)
    );
    assert_eq!(
        env.write(cmd::QUERY_QP, &RESP.to_ne_bytes().repeat(2), &[], 32),
        Err(ENOENT)
    );
}

// ---- GET_CONTEXT / mlx5_ib_alloc_ucontext -------------------------------------------------

fn ucontext(f: impl FnOnce(&mut abi::AllocUcontextReq)) -> abi::AllocUcontextReq {
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

// ---- CQ --------------------------------------------------------------------------------

fn cq_err(env: &Env, core: abi::CreateCq, drv: &[u8], out_words: u16) -> Result<(), Errno> {
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

// ---- QP --------------------------------------------------------------------------------

fn qp_env() -> (Env, u32, u32) {
    let env = Env::new(false);
    let pd = env.alloc_pd();
    let cq = env.create_cq(15, CQ_BUF, DB).unwrap();
    (env, pd, cq)
}

fn qp_with(f: impl FnOnce(&mut abi::Mlx5CreateQp)) -> Result<(), Errno> {
    let (env, pd, cq) = qp_env();
    let mut u = Env::mlx5_qp(QP_BUF, DB + 64, 1);
    f(&mut u);
    env.create_qp_with(Env::qp_cmd(pd, cq, abi::qpt::RC), u.as_bytes())
        .map(|_| ())
}

#[test]
fn create_qp_driver_data_shorter_than_ece_options_is_einval() {
    let (env, pd, cq) = qp_env();
    let u = Env::mlx5_qp(QP_BUF, DB + 64, 1);
    assert_eq!(
        env.create_qp_with(Env::qp_cmd(pd, cq, abi::qpt::RC), &u.as_bytes()[..40]),
        Err(EINVAL)
    );
}

#[test]
fn create_qp_reserved_and_trailing_bytes_must_be_zero() {
    assert_eq!(qp_with(|u| u.reserved = 1), Err(EINVAL));
    let (env, pd, cq) = qp_env();
    let mut bytes = Env::mlx5_qp(QP_BUF, DB + 64, 1).as_bytes().to_vec();
    bytes.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1]);
    assert_eq!(
        env.create_qp_with(Env::qp_cmd(pd, cq, abi::qpt::RC), &bytes),
        Err(EINVAL)
    );
}

#[test]
fn create_qp_unknown_vendor_flags_are_einval() {
    assert_eq!(qp_with(|u| u.flags = 1 << 9), Err(EINVAL));
    assert_eq!(qp_with(|u| u.flags = abi::QP_FLAG_SCATTER_CQE), Ok(()));
}

#[test]
fn create_qp_user_index_rules() {
    assert_eq!(qp_with(|u| u.uidx = abi::DEFAULT_UIDX), Err(EINVAL));
    assert_eq!(qp_with(|u| u.uidx = 1 << 24), Err(EINVAL));
    // CQE version 0: the index must be the default one.
    let env = Env::bare();
    env.get_context(ucontext(|r| r.max_cqe_version = 0).as_bytes()).unwrap();
    let pd = env.alloc_pd();
    let cq = env.create_cq(15, CQ_BUF, DB).unwrap();
    let qp = |uidx| {
        env.create_qp_with(
            Env::qp_cmd(pd, cq, abi::qpt::RC),
            Env::mlx5_qp(QP_BUF, DB + 64, uidx).as_bytes(),
        )
    };
    assert_eq!(qp(1), Err(EINVAL));
    assert!(qp(abi::DEFAULT_UIDX).is_ok());
}

#[test]
fn create_qp_sq_wqe_count_must_be_a_power_of_two_within_the_device() {
    assert_eq!(qp_with(|u| u.sq_wqe_count = 12), Err(EINVAL));
    assert_eq!(qp_with(|u| u.sq_wqe_count = 1 << 16), Err(EINVAL));
}

#[test]
fn create_qp_receive_queue_rules() {
    // 1 << 31 overflows the kernel's int (qp.c:409).
    assert_eq!(qp_with(|u| u.rq_wqe_shift = 31), Err(EINVAL));
    // No receive queue (max_recv_wr 0) with RQ sizes given.
    let (env, pd, cq) = qp_env();
    let mut req = Env::qp_cmd(pd, cq, abi::qpt::RC);
    req.max_recv_wr = 0;
    assert_eq!(
        env.create_qp_with(req, Env::mlx5_qp(QP_BUF, DB + 64, 1).as_bytes()),
        Err(EINVAL)
    );
    let mut u = Env::mlx5_qp(QP_BUF, DB + 64, 2);
    (u.rq_wqe_count, u.rq_wqe_shift) = (0, 0);
    assert!(env.create_qp_with(req, u.as_bytes()).is_ok());
}

#[test]
fn create_qp_buffer_must_be_mapped() {
    assert_eq!(qp_with(|u| u.buf_addr = 0x7000_0000), Err(EFAULT));
}

#[test]
fn create_qp_types_handles_and_dynamic_uars() {
    let (env, pd, cq) = qp_env();
    let u = Env::mlx5_qp(QP_BUF, DB + 64, 1);
    // Raw packet QPs: check_qp_type takes them, the model does not (EOPNOTSUPP).
    assert_eq!(
        env.create_qp_with(Env::qp_cmd(pd, cq, 8), u.as_bytes()),
        Err(EOPNOTSUPP)
    );
    // Unknown CQ or PD: the lookup's ENOENT.
    assert_eq!(
        env.create_qp_with(Env::qp_cmd(pd, cq + 3, abi::qpt::RC), u.as_bytes()),
        Err(ENOENT)
    );
    assert_eq!(
        env.create_qp_with(Env::qp_cmd(pd + 3, cq, abi::qpt::RC), u.as_bytes()),
        Err(ENOENT)
    );
    let env = Env::new(true);
    let pd = env.alloc_pd();
    let mut drv = Env::mlx5_cq(CQ_BUF, DB);
    drv.flags = abi::CQ_FLAG_UAR_PAGE_INDEX;
    cq_err(&env, Env::cq_cmd(15, -1), drv.as_bytes(), 4).unwrap();
    let cq = env.resp::<abi::CreateCqResp>().cq_handle;
    assert_eq!(
        env.create_qp_with(Env::qp_cmd(pd, cq, abi::qpt::RC), u.as_bytes()),
        Err(EINVAL)
    );
    let mut u = u;
    u.flags = abi::QP_FLAG_UAR_PAGE_INDEX;
    assert!(env
        .create_qp_with(Env::qp_cmd(pd, cq, abi::qpt::RC), u.as_bytes())
        .is_ok());
}

#[test]
fn modify_qp_rules() {
    let (env, pd, cq) = qp_env();
    let (qp, _) = env
        .create_qp_with(
            Env::qp_cmd(pd, cq, abi::qpt::RC),
            Env::mlx5_qp(QP_BUF, DB + 64, 1).as_bytes(),
        )
        .unwrap();
    let init = qp_attr::STATE | qp_attr::PKEY_INDEX | qp_attr::PORT | qp_attr::ACCESS_FLAGS;
    // RESET -> RTR is no transition; INIT without its required attributes; extra attributes.
    assert_eq!(
        env.modify(qp, |m| (m.attr_mask, m.qp_state) = (qp_attr::STATE, qps::RTR)),
        Err(EINVAL)
    );
    assert_eq!(
        env.modify(qp, |m| (m.attr_mask, m.qp_state) = (qp_attr::STATE, qps::INIT)),
        Err(EINVAL)
    );
    assert_eq!(
        env.modify(qp, |m| (m.attr_mask, m.qp_state, m.port_num) =
            (init | qp_attr::SQ_PSN, qps::INIT, 1)),
        Err(EINVAL)
    );
    // A port other than 1; a state beyond ERR; a pkey index beyond the table.
    assert_eq!(
        env.modify(qp, |m| (m.attr_mask, m.qp_state, m.port_num) = (init, qps::INIT, 2)),
        Err(EINVAL)
    );
    assert_eq!(
        env.modify(qp, |m| (m.attr_mask, m.qp_state) = (qp_attr::STATE, 7)),
        Err(EINVAL)
    );
    assert_eq!(
        env.modify(qp, |m| (m.attr_mask, m.qp_state, m.port_num, m.pkey_index) =
            (init, qps::INIT, 1, 200)),
        Err(EINVAL)
    );
    assert_eq!(
        env.modify(qp, |m| (m.attr_mask, m.qp_state, m.port_num) = (init, qps::INIT, 1)),
        Ok(())
    );
    // Attribute bits beyond the standard ones, RATE_LIMIT (25) too, are EOPNOTSUPP, even
    // on a handle that names nothing (checked before the lookup).
    assert_eq!(env.modify(qp, |m| m.attr_mask = 1 << 24), Err(EOPNOTSUPP));
    assert_eq!(env.modify(qp, |m| m.attr_mask = 1 << 25), Err(EOPNOTSUPP));
    assert_eq!(env.modify(qp + 4, |m| m.attr_mask = 1 << 25), Err(EOPNOTSUPP));
    // Unknown QP handle: the lookup's ENOENT.
    assert_eq!(env.modify(qp + 4, |m| m.attr_mask = qp_attr::STATE), Err(ENOENT));
    // RESET -> RESET goes through ib_modify_qp_is_ok too: a state alone is fine, an
    // attribute RESET does not take is EINVAL.
    let reset = |m: &mut abi::ModifyQp| {
        m.attr_mask = qp_attr::STATE;
        m.qp_state = qps::RESET;
    };
    assert_eq!(env.modify(qp, reset), Ok(()));
    assert_eq!(env.modify(qp, reset), Ok(()));
    assert_eq!(
        env.modify(qp, |m| {
            reset(m);
            m.attr_mask |= qp_attr::QKEY;
        }),
        Err(EINVAL)
    );
}

#[test]
fn ud_qps_are_created_like_rc_and_modified_with_a_qkey() {
    let (env, pd, cq) = qp_env();
    // qp.c:2747: UD passes check_qp_type and goes through create_user_qp's rules.
    let mut bad = Env::mlx5_qp(QP_BUF, DB + 64, 1);
    bad.sq_wqe_count = 12;
    assert_eq!(
        env.create_qp_with(Env::qp_cmd(pd, cq, abi::qpt::UD), bad.as_bytes()),
        Err(EINVAL)
    );
    let (qp, _) = env
        .create_qp_with(
            Env::qp_cmd(pd, cq, abi::qpt::UD),
            Env::mlx5_qp(QP_BUF, DB + 64, 1).as_bytes(),
        )
        .unwrap();
    let init = qp_attr::STATE | qp_attr::PKEY_INDEX | qp_attr::PORT;
    // verbs.c:1395-1397: RESET -> INIT needs the Q_Key; access flags are RC/UC's.
    assert_eq!(
        env.modify(qp, |m| (m.attr_mask, m.qp_state, m.port_num) = (init, qps::INIT, 1)),
        Err(EINVAL)
    );
    assert_eq!(
        env.modify(qp, |m| (m.attr_mask, m.qp_state, m.port_num) =
            (init | qp_attr::QKEY | qp_attr::ACCESS_FLAGS, qps::INIT, 1)),
        Err(EINVAL)
    );
    env.modify(qp, |m| {
        (m.attr_mask, m.qp_state, m.port_num, m.qkey) = (init | qp_attr::QKEY, qps::INIT, 1, 0x1111_1111)
    })
    .unwrap();
    // :1445, :1470: RTR needs nothing and takes no path.
    assert_eq!(
        env.modify(qp, |m| (m.attr_mask, m.qp_state) =
            (qp_attr::STATE | qp_attr::AV, qps::RTR)),
        Err(EINVAL)
    );
    env.modify(qp, |m| (m.attr_mask, m.qp_state) = (qp_attr::STATE, qps::RTR))
        .unwrap();
    // :1497: RTS needs the SQ PSN; :1549: RTS -> RTS may change the Q_Key.
    assert_eq!(
        env.modify(qp, |m| (m.attr_mask, m.qp_state) = (qp_attr::STATE, qps::RTS)),
        Err(EINVAL)
    );
    env.modify(qp, |m| {
        (m.attr_mask, m.qp_state) = (qp_attr::STATE | qp_attr::SQ_PSN, qps::RTS)
    })
    .unwrap();
    env.modify(qp, |m| {
        (m.attr_mask, m.qp_state, m.qkey) = (qp_attr::STATE | qp_attr::QKEY, qps::RTS, 0x2222)
    })
    .unwrap();
    assert_eq!(
        env.modify(qp, |m| (m.attr_mask, m.qp_state) =
            (qp_attr::STATE | qp_attr::TIMEOUT, qps::RTS)),
        Err(EINVAL)
    );
    let q = abi::QueryQp {
        response: RESP,
        qp_handle: qp,
        attr_mask: 0,
    };
    env.write(cmd::QUERY_QP, q.as_bytes(), &[], 32).unwrap();
    let r: abi::QueryQpResp = env.resp();
    assert_eq!((r.qkey, r.qp_state), (0x2222, qps::RTS));
}

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

// ---- mmap and ioctl ------------------------------------------------------------------------

/// `PROT_READ | PROT_WRITE`, `MAP_SHARED`: how libraries map UAR pages.
const RW_SHARED: MapAccess = MapAccess {
    write: true,
    exec: false,
    shared: true,
};
/// `PROT_READ`, `MAP_SHARED`: how libmlx5 maps the clock pages.
const RO_SHARED: MapAccess = MapAccess {
    write: false,
    exec: false,
    shared: true,
};

#[test]
fn mmap_rules() {
    let env = Env::new(false);
    let m = env.model.lock().unwrap();
    assert_eq!(m.check_mmap(CTX, 0, 4096, RW_SHARED), Ok(Mapping::Uar));
    assert_eq!(m.check_mmap(CTX, 0, 8192, RW_SHARED), Err(EINVAL));
    assert_eq!(m.check_mmap(CTX, 8, 4096, RW_SHARED), Err(EINVAL));
    assert_eq!(m.check_mmap(CTX, 2 << 8, 4096, RW_SHARED), Err(EPERM));
    assert_eq!(m.check_mmap(CTX, 1 << 8, 4096, RW_SHARED), Err(libc::ENOSYS));
    drop(m);
    let env = Env::new(true);
    assert_eq!(
        env.model.lock().unwrap().check_mmap(CTX, 0, 4096, RW_SHARED),
        Err(EINVAL)
    );
}

/// The core clock page (command 5): one page, read-only (main.c:2327-2331); the clock info
/// page (command 7): one shared page, index 1, read-only, and on the model (no clock
/// frequency) EOPNOTSUPP after those checks (main.c:2096-2111).
#[test]
fn clock_page_mmap_rules() {
    let env = Env::new(false);
    let m = env.model.lock().unwrap();
    let private = MapAccess {
        shared: false,
        ..RO_SHARED
    };
    let exec = MapAccess {
        exec: true,
        ..RO_SHARED
    };
    assert_eq!(m.check_mmap(CTX, 5 << 8, 4096, RO_SHARED), Ok(Mapping::CoreClock));
    assert_eq!(m.check_mmap(CTX, 5 << 8, 4096, private), Ok(Mapping::CoreClock));
    assert_eq!(m.check_mmap(CTX, 5 << 8, 8192, RO_SHARED), Err(EINVAL));
    assert_eq!(m.check_mmap(CTX, 5 << 8, 4096, RW_SHARED), Err(EPERM));
    assert_eq!(m.check_mmap(CTX, 7 << 8 | 1, 4096, RO_SHARED), Err(libc::EOPNOTSUPP));
    assert_eq!(m.check_mmap(CTX, 7 << 8 | 1, 8192, RO_SHARED), Err(EINVAL));
    assert_eq!(m.check_mmap(CTX, 7 << 8 | 1, 4096, private), Err(EINVAL));
    assert_eq!(m.check_mmap(CTX, 7 << 8 | 2, 4096, RO_SHARED), Err(libc::EOPNOTSUPP));
    assert_eq!(m.check_mmap(CTX, 7 << 8 | 1, 4096, RW_SHARED), Err(EPERM));
    assert_eq!(m.check_mmap(CTX, 7 << 8 | 1, 4096, exec), Err(EPERM));
}

/// GET_CONTEXT reports the core clock page's offset (main.c:1826) and MKEY_UPDATE_TAG
/// (main.c:1848), no clock info page, and `min(outlen, 72)` as its length (main.c:1953),
/// cut mid-field where the buffer ends.
#[test]
fn ucontext_resp_reports_the_core_clock_and_its_length() {
    let env = Env::bare();
    env.get_context(ucontext(|_| {}).as_bytes()).unwrap();
    let resp: [u8; 80] = env.resp();
    let drv = abi::AllocUcontextResp::read_from_bytes(&resp[8..]).unwrap();
    assert_eq!(drv.comp_mask, 1 | 1 << 5);
    assert_eq!((drv.hca_core_clock_offset, drv.clock_info_versions), (0, 0));
    assert_eq!(drv.response_length, 72);
    // 60 bytes of response: the core's 8 and 52 of the driver's, which ends inside
    // hca_core_clock_offset (bytes 48..56).
    let env = Env::bare();
    env.write(cmd::GET_CONTEXT, &RESP.to_ne_bytes(), ucontext(|_| {}).as_bytes(), 15)
        .unwrap();
    let resp: [u8; 80] = env.resp();
    let drv = abi::AllocUcontextResp::read_from_bytes(&resp[8..]).unwrap();
    assert_eq!(drv.response_length, 52);
}

fn uar_ioctl(env: &Env, f: impl FnOnce(&mut abi::IoctlHdr, &mut Vec<abi::IoctlAttr>)) -> Result<(), Errno> {
    let mut hdr = abi::IoctlHdr {
        length: 24 + 16 * 5,
        object_id: abi::uar_obj::OBJECT,
        method_id: abi::uar_obj::METHOD_ALLOC,
        num_attrs: 5,
        driver_id: abi::RDMA_DRIVER_MLX5,
        ..Default::default()
    };
    let out = |id, at: u64, len| abi::IoctlAttr {
        attr_id: id,
        len,
        flags: 1,
        attr_data: 0,
        data: RESP + at,
    };
    let mut attrs = vec![
        abi::IoctlAttr {
            attr_id: abi::uar_obj::ATTR_HANDLE,
            flags: 1,
            ..Default::default()
        },
        abi::IoctlAttr {
            attr_id: abi::uar_obj::ATTR_TYPE,
            len: 8,
            flags: 1,
            data: abi::uar_obj::TYPE_NC,
            attr_data: 0,
        },
        out(abi::uar_obj::ATTR_MMAP_OFFSET, 0, 8),
        out(abi::uar_obj::ATTR_MMAP_LENGTH, 8, 4),
        out(abi::uar_obj::ATTR_PAGE_ID, 12, 4),
    ];
    f(&mut hdr, &mut attrs);
    let mut bytes = hdr.as_bytes().to_vec();
    for a in &attrs {
        bytes.extend_from_slice(a.as_bytes());
    }
    env.mem.write(CMD, &bytes).unwrap();
    env.model
        .lock()
        .unwrap()
        .ioctl(CTX, abi::RDMA_VERBS_IOCTL, CMD, &env.mem, &env.host)
}

#[test]
fn ioctl_rules() {
    let env = Env::new(true);
    assert_eq!(uar_ioctl(&env, |h, _| h.reserved1 = 1), Err(EPROTONOSUPPORT));
    assert_eq!(uar_ioctl(&env, |h, _| h.length += 1), Err(EINVAL));
    assert_eq!(uar_ioctl(&env, |h, _| h.driver_id = 14), Err(EINVAL));
    assert_eq!(uar_ioctl(&env, |h, _| h.object_id = 0), Err(EPROTONOSUPPORT));
    assert_eq!(
        uar_ioctl(&env, |_, a| a[1].data = abi::uar_obj::TYPE_BF),
        Err(EOPNOTSUPP)
    );
    let unknown = abi::IoctlAttr {
        attr_id: 0x1010,
        flags: 1,
        ..Default::default()
    };
    let more = |h: &mut abi::IoctlHdr, a: &mut Vec<abi::IoctlAttr>| {
        a.push(unknown);
        (h.num_attrs, h.length) = (6, 24 + 16 * 6);
    };
    assert_eq!(uar_ioctl(&env, more), Err(EPROTONOSUPPORT));
    assert_eq!(uar_ioctl(&env, |_, _| {}), Ok(()));
    let offset = u64::from_ne_bytes(env.resp::<[u8; 8]>());
    // The first dynamic entry: command 9 in bits 8-15 of the page offset (main.c:2297).
    assert_eq!(offset, 0x900 * 4096);
    assert_eq!(
        env.model
            .lock()
            .unwrap()
            .check_mmap(CTX, offset / 4096, 4096, RW_SHARED),
        Ok(Mapping::Uar)
    );
    // The entry's internal offset (9 << 16) is a legacy command 0 offset: EINVAL here.
    assert_eq!(
        env.model.lock().unwrap().check_mmap(CTX, 9 << 16, 4096, RW_SHARED),
        Err(EINVAL)
    );
    assert_eq!(
        env.model
            .lock()
            .unwrap()
            .check_mmap(CTX, offset / 4096, 8192, RW_SHARED),
        Err(EINVAL)
    );
    assert_eq!(
        env.model.lock().unwrap().ioctl(CTX, 0x1234, CMD, &env.mem, &env.host),
        Err(libc::ENOTTY)
    );
}

// ---- the device ------------------------------------------------------------------------

#[test]
fn a_send_moves_the_bytes_and_completes_on_both_sides() {
    let mut p = Pair::new(7);
    p.env.mem.write(DATA, b"hello").unwrap();
    p.recv(1, DATA + 0x1000, 64);
    p.post(0, abi::opcode::SEND, &data_seg(5, p.key, DATA), true);
    p.env.drive();
    let mut got = [0u8; 5];
    p.env.mem.read(DATA + 0x1000, &mut got).unwrap();
    assert_eq!(&got, b"hello");
    assert_eq!(p.cqes(), vec![(abi::cqe_op::RESP_SEND, 0, 5), (abi::cqe_op::REQ, 0, 0)]);
    assert_eq!(p.env.mem.stray(), 0);
}

#[test]
fn rdma_write_read_and_atomics_act_on_the_target() {
    let mut p = Pair::new(7);
    p.env.mem.write(DATA, &[7; 8]).unwrap();
    let mut segs = raddr_seg(DATA + 0x2000, p.key).to_vec();
    segs.extend_from_slice(&data_seg(8, p.key, DATA));
    p.post(0, abi::opcode::RDMA_WRITE, &segs, false);
    let mut segs = raddr_seg(DATA + 0x2000, p.key).to_vec();
    segs.extend_from_slice(&data_seg(8, p.key, DATA + 0x3000));
    p.post(0, abi::opcode::RDMA_READ, &segs, true);
    // FAA of 5 (big-endian in the WQE) on the host-order word at 0x4000 (starts at 10),
    // the original value to 0x4100 in host order.
    p.env.mem.write(DATA + 0x4000, &10u64.to_ne_bytes()).unwrap();
    let mut segs = raddr_seg(DATA + 0x4000, p.key).to_vec();
    segs.extend_from_slice(&5u64.to_be_bytes());
    segs.extend_from_slice(&[0; 8]);
    segs.extend_from_slice(&data_seg(8, p.key, DATA + 0x4100));
    p.post(0, abi::opcode::ATOMIC_FA, &segs, true);
    p.env.drive();
    let mut b = [0u8; 8];
    p.env.mem.read(DATA + 0x3000, &mut b).unwrap();
    assert_eq!(b, [7; 8]);
    p.env.mem.read(DATA + 0x4000, &mut b).unwrap();
    assert_eq!(u64::from_ne_bytes(b), 15);
    p.env.mem.read(DATA + 0x4100, &mut b).unwrap();
    assert_eq!(u64::from_ne_bytes(b), 10);
    assert_eq!(p.cqes(), vec![(0, 0, 8), (0, 0, 8)]);
}

#[test]
fn a_bad_rkey_is_remote_access_and_what_follows_is_flushed() {
    let mut p = Pair::new(7);
    let mut segs = raddr_seg(DATA, p.key ^ 0xff00).to_vec();
    segs.extend_from_slice(&data_seg(8, p.key, DATA));
    p.post(0, abi::opcode::RDMA_WRITE, &segs, false);
    p.post(0, abi::opcode::SEND, &data_seg(8, p.key, DATA), false);
    p.env.drive();
    let e = abi::cqe_op::REQ_ERR;
    assert_eq!(
        p.cqes(),
        vec![(e, abi::syndrome::REMOTE_ACCESS, 0), (e, abi::syndrome::WR_FLUSH, 0)]
    );
}

#[test]
fn a_bad_lkey_is_local_protection() {
    let mut p = Pair::new(7);
    p.post(0, abi::opcode::SEND, &data_seg(8, 0x4242, DATA), true);
    p.env.drive();
    assert_eq!(p.cqes(), vec![(abi::cqe_op::REQ_ERR, abi::syndrome::LOCAL_PROT, 0)]);
}

#[test]
fn no_receive_posted_exhausts_the_rnr_retries() {
    let mut p = Pair::new(0);
    p.post(0, abi::opcode::SEND, &data_seg(8, p.key, DATA), true);
    p.env.drive();
    assert_eq!(p.cqes(), vec![(abi::cqe_op::REQ_ERR, abi::syndrome::RNR_RETRY_EXC, 0)]);
}

#[test]
fn a_full_cq_raises_cq_err_and_is_not_overwritten() {
    let mut p = Pair::new(7);
    for _ in 0..17 {
        p.post(0, abi::opcode::NOP, &[], true);
        if p.posted[0] % 8 == 0 {
            p.env.drive();
        }
    }
    p.env.drive();
    let sinks = p.env.host.sinks.lock().unwrap();
    let events = sinks[0].0.lock().unwrap();
    assert_eq!(events.len(), 1);
    let ev = abi::AsyncEventDesc::read_from_bytes(&events[0]).unwrap();
    assert_eq!((ev.event_type, ev.element), (abi::event::CQ_ERR, 0xc0));
    // Counted when read, for DESTROY_CQ's response.
    let mut m = p.env.model.lock().unwrap();
    let fd = m.contexts[&CTX].async_fd.unwrap();
    m.events_read(fd, &events[0]);
    assert_eq!(m.cqs.iter().next().unwrap().1.async_events, 1);
}

/// A UD send's datagram segment (`mlx5_wqe_av`) to `dqpn` at LID 7 with `qkey`, service
/// level 5, and a GRH (traffic class 3, hop limit 64, flow label 0x12345, DGID 0xd0..) if
/// `grh`; then one data segment.
fn ud_segs(qkey: u32, dqpn: u32, grh: bool, data: [u8; 16]) -> Vec<u8> {
    let mut av = [0u8; 48];
    av[0..4].copy_from_slice(&qkey.to_be_bytes());
    av[8..12].copy_from_slice(&(0x8000_0000 | dqpn).to_be_bytes());
    av[12] = 5;
    av[14..16].copy_from_slice(&7u16.to_be_bytes());
    if grh {
        av[26] = 3;
        av[27] = 64;
        av[28..32].copy_from_slice(&((1u32 << 30) | 0x1_2345).to_be_bytes());
        for (k, b) in av[32..48].iter_mut().enumerate() {
            *b = 0xd0 + k as u8;
        }
    }
    let mut segs = av.to_vec();
    segs.extend_from_slice(&data);
    segs
}

#[test]
fn a_ud_send_lands_after_the_grh_room_with_its_source_in_the_cqe() {
    for grh in [false, true] {
        let mut p = Pair::ud(0x1111_1111);
        p.env.mem.write(DATA, &[0xab; 100]).unwrap();
        p.env.mem.write(DATA + 0x1000, &[0xee; 200]).unwrap();
        p.recv(1, DATA + 0x1000, 140);
        let segs = ud_segs(0x1111_1111, p.qpn[1], grh, data_seg(100, p.key, DATA));
        p.post(0, abi::opcode::SEND, &segs, true);
        p.env.drive();
        let cqes = p.raw_cqes();
        assert_eq!(cqes.len(), 2, "grh {grh}");
        let (req, resp) = if cqes[0][63] >> 4 == abi::cqe_op::REQ {
            (cqes[0], cqes[1])
        } else {
            (cqes[1], cqes[0])
        };
        assert_eq!(req[63] >> 4, abi::cqe_op::REQ);
        assert_eq!(resp[63] >> 4, abi::cqe_op::RESP_SEND);
        // byte_cnt counts the 40 GRH bytes; flags_rqpn: GRH type, SL 5, the source QPN.
        assert_eq!(u32::from_be_bytes(resp[44..48].try_into().unwrap()), 140);
        let flags_rqpn = u32::from_be_bytes(resp[24..28].try_into().unwrap());
        assert_eq!(flags_rqpn, (u32::from(grh) << 28) | (5 << 24) | p.qpn[0]);
        assert_eq!(u16::from_be_bytes([resp[22], resp[23]]), 7);
        let mut buf = [0u8; 200];
        p.env.mem.read(DATA + 0x1000, &mut buf).unwrap();
        assert_eq!(buf[40..140], [0xab; 100]);
        assert_eq!(buf[140..], [0xee; 60]);
        if grh {
            // IPv6 version 6, traffic class 3, flow label; PayLen 12 + 8 + 100 + 4; next
            // header 0x1b; hop limit; SGID fe80::<port GUID>; the DGID asked for.
            assert_eq!(buf[0..4], ((6u32 << 28) | (3 << 20) | 0x1_2345).to_be_bytes());
            assert_eq!(buf[4..8], [0, 124, 0x1b, 64]);
            assert_eq!(buf[8..10], [0xfe, 0x80]);
            assert_eq!(buf[16..24], 0x0002_c903_0000_0001u64.to_be_bytes());
            assert_eq!(buf[24], 0xd0);
            assert_eq!(buf[39], 0xdf);
        } else {
            assert_eq!(buf[..40], [0xee; 40]);
        }
    }
}

#[test]
fn ud_sends_with_a_wrong_qkey_or_to_no_qp_are_dropped_and_still_complete() {
    let mut p = Pair::ud(0x1111_1111);
    p.recv(1, DATA + 0x1000, 100);
    let seg = data_seg(8, p.key, DATA);
    p.post(0, abi::opcode::SEND, &ud_segs(0x2222, p.qpn[1], false, seg), true);
    p.post(
        0,
        abi::opcode::SEND,
        &ud_segs(0x1111_1111, p.qpn[1] + 9, false, seg),
        true,
    );
    p.env.drive();
    // Both sends complete without error; nothing arrived, the receive is still posted.
    let req = (abi::cqe_op::REQ, 0, 0);
    assert_eq!(p.cqes(), vec![req, req]);
    // A controlled Q_Key (high bit set) sends the QP's own: this one arrives.
    p.post(0, abi::opcode::SEND, &ud_segs(0x8000_0000, p.qpn[1], false, seg), true);
    p.env.drive();
    assert!(p.cqes().contains(&(abi::cqe_op::RESP_SEND, 0, 48)));
}

#[test]
fn ud_qps_take_only_sends_and_messages_of_one_mtu() {
    let mut p = Pair::ud(7);
    // An RDMA write on a UD QP is a local QP operation error.
    let mut segs = raddr_seg(DATA, p.key).to_vec();
    segs.extend_from_slice(&data_seg(8, p.key, DATA));
    p.post(0, abi::opcode::RDMA_WRITE, &segs, true);
    p.env.drive();
    assert_eq!(p.cqes(), vec![(abi::cqe_op::REQ_ERR, abi::syndrome::LOCAL_QP_OP, 0)]);
    let mut p = Pair::ud(7);
    p.post(
        0,
        abi::opcode::SEND,
        &ud_segs(7, p.qpn[1], false, data_seg(4097, p.key, DATA)),
        true,
    );
    p.env.drive();
    assert_eq!(p.cqes(), vec![(abi::cqe_op::REQ_ERR, abi::syndrome::LOCAL_LENGTH, 0)]);
}

#[test]
fn moving_to_err_flushes_posted_receives() {
    let mut p = Pair::new(7);
    p.recv(1, DATA, 8);
    p.recv(1, DATA, 8);
    let qp1 = 1;
    p.env
        .modify(qp1, |m| (m.attr_mask, m.qp_state) = (qp_attr::STATE, qps::ERR))
        .unwrap();
    p.env.drive();
    let e = abi::cqe_op::RESP_ERR;
    assert_eq!(
        p.cqes(),
        vec![(e, abi::syndrome::WR_FLUSH, 0), (e, abi::syndrome::WR_FLUSH, 0)]
    );
}

#[test]
fn hostile_wqes_and_doorbells_never_panic_or_stray() {
    let mut rng = uverbs::testing::Rng::new(0x5eed);
    for round in 0..200 {
        assert_eq!(hostile_round(&mut || rng.next_u64()), 0, "round {round}");
    }
}

// ---- the core's ioctl methods --------------------------------------------------------------

/// Where the tests put an ioctl's attribute array, and the buffers its pointers name.
const IOCTL: u64 = CMD;
const IN_BUF: u64 = CMD + 0x800;

fn inline(id: u16, len: u16, value: u64) -> abi::IoctlAttr {
    abi::IoctlAttr {
        attr_id: id,
        len,
        flags: abi::ATTR_F_MANDATORY,
        attr_data: 0,
        data: value,
    }
}

/// An output of `len` bytes at `RESP + at`.
fn out(id: u16, at: u64, len: u16) -> abi::IoctlAttr {
    inline(id, len, RESP + at)
}

/// A handle or fd attribute.
fn obj(id: u16, value: u64) -> abi::IoctlAttr {
    inline(id, 0, value)
}

const UHW_IN: u16 = 0x1000;
const UHW_OUT: u16 = 0x1001;

impl Env {
    /// Runs `object`/`method` with `attrs`; returns the attribute array as the call left it.
    fn ioctl(&self, object: u16, method: u16, attrs: &[abi::IoctlAttr]) -> Result<Vec<abi::IoctlAttr>, Errno> {
        let num = attrs.len() as u16;
        raw_ioctl(self, IOCTL, object, method, abi::RDMA_DRIVER_MLX5, attrs, num)?;
        let mut bytes = vec![0u8; 16 * attrs.len()];
        self.mem.read(IOCTL + 24, &mut bytes).unwrap();
        Ok(bytes
            .chunks_exact(16)
            .map(|c| abi::IoctlAttr::read_from_bytes(c).unwrap())
            .collect())
    }

    fn at<T: FromBytes>(&self, offset: u64) -> T {
        let mut b = vec![0u8; std::mem::size_of::<T>()];
        self.mem.read(RESP + offset, &mut b).unwrap();
        T::read_from_bytes(&b).unwrap()
    }

    /// Driver data placed at `IN_BUF` as a UHW_IN attribute.
    fn uhw_in(&self, bytes: &[u8]) -> abi::IoctlAttr {
        self.mem.write(IN_BUF, bytes).unwrap();
        inline(UHW_IN, bytes.len() as u16, IN_BUF)
    }

    /// GET_CONTEXT through the ioctl, legacy UARs as the Rust provider asks.
    fn ioctl_context() -> Self {
        let env = Self::bare();
        let req = ucontext(|r| r.lib_caps = 1);
        let attrs = [
            out(0, 0, 4),
            out(1, 8, 8),
            env.uhw_in(req.as_bytes()),
            out(UHW_OUT, 0x100, 72),
        ];
        env.ioctl(0, 3, &attrs).unwrap();
        env
    }

    fn cq_attrs(&self, cqe: u32) -> Vec<abi::IoctlAttr> {
        vec![
            obj(0, 0),
            inline(1, 4, u64::from(cqe)),
            inline(2, 8, 0xc0),
            inline(4, 4, 0),
            out(6, 0, 4),
            self.uhw_in(Self::mlx5_cq(CQ_BUF, DB).as_bytes()),
            out(UHW_OUT, 0x40, 8),
        ]
    }

    fn qp_attrs(&self, pd: u32, cq: u32, uidx: u32) -> Vec<abi::IoctlAttr> {
        let cap: [u32; 5] = [8, 8, 1, 1, 0];
        self.mem.write(IN_BUF + 0x100, cap.as_bytes()).unwrap();
        vec![
            obj(0, 0),
            obj(2, u64::from(pd)),
            obj(4, u64::from(cq)),
            obj(5, u64::from(cq)),
            inline(7, 8, 0x9),
            inline(8, 20, IN_BUF + 0x100),
            inline(9, 8, u64::from(abi::qpt::RC)),
            out(13, 0x80, 20),
            out(14, 0xa0, 4),
            self.uhw_in(Self::mlx5_qp(QP_BUF, DB + 64, uidx).as_bytes()),
            out(UHW_OUT, 0xc0, 40),
        ]
    }
}

#[test]
fn ioctl_get_context_reports_vectors_and_core_support_and_legacy_uars() {
    let env = Env::bare();
    let req = ucontext(|r| r.lib_caps = 1);
    let attrs = [
        out(0, 0, 4),
        out(1, 8, 8),
        env.uhw_in(req.as_bytes()),
        out(UHW_OUT, 0x100, 72),
    ];
    // An output of the wrong size is EINVAL before anything runs.
    let mut short = attrs;
    short[0].len = 8;
    assert_eq!(env.ioctl(0, 3, &short).map(drop), Err(EINVAL));
    let back = env.ioctl(0, 3, &attrs).unwrap();
    assert_eq!(env.at::<u32>(0), 4);
    assert_eq!(env.at::<u64>(8), 1);
    let resp: abi::AllocUcontextResp = env.at(0x100);
    assert_eq!(resp.tot_bfregs, 16);
    assert_eq!(resp.cqe_version, 1);
    // Every output written, the driver's included, is flagged valid.
    for a in [back[0], back[1], back[3]] {
        assert_eq!(a.flags & abi::ATTR_F_VALID_OUTPUT, abi::ATTR_F_VALID_OUTPUT);
    }
    // Legacy UAR pages can be mapped; a second GET_CONTEXT is EINVAL.
    assert_eq!(
        env.model.lock().unwrap().check_mmap(CTX, 7, 4096, RW_SHARED),
        Ok(Mapping::Uar)
    );
    assert_eq!(env.ioctl(0, 3, &attrs).map(drop), Err(EINVAL));
    // The driver rules are the write form's: too many bfregs is ENOMEM.
    let env = Env::bare();
    let big = ucontext(|r| (r.lib_caps, r.total_num_bfregs) = (1, 4096));
    assert_eq!(env.ioctl(0, 3, &[env.uhw_in(big.as_bytes())]).map(drop), Err(ENOMEM));
}

#[test]
fn ioctl_methods_need_a_context_and_known_mandatory_attributes() {
    let env = Env::bare();
    assert_eq!(
        env.ioctl(0, 2, &[inline(0, 8, 1), out(1, 0, 48)]).map(drop),
        Err(EINVAL)
    );
    let env = Env::ioctl_context();
    // Missing a mandatory attribute: EINVAL; an unknown mandatory one: EPROTONOSUPPORT; an
    // unknown optional one is ignored; the same one twice is EINVAL.
    assert_eq!(env.ioctl(0, 2, &[inline(0, 8, 1)]).map(drop), Err(EINVAL));
    let mut unknown = inline(9, 0, 0);
    assert_eq!(
        env.ioctl(0, 2, &[inline(0, 8, 1), out(1, 0, 48), unknown]).map(drop),
        Err(EPROTONOSUPPORT)
    );
    unknown.flags = 0;
    assert_eq!(
        env.ioctl(0, 2, &[inline(0, 8, 1), out(1, 0, 48), unknown]).map(drop),
        Ok(())
    );
    assert_eq!(
        env.ioctl(0, 2, &[inline(0, 8, 1), out(1, 0, 48), out(1, 0, 48)])
            .map(drop),
        Err(EINVAL)
    );
    // Methods the model does not have: EPROTONOSUPPORT.
    assert_eq!(env.ioctl(7, 0, &[]).map(drop), Err(EPROTONOSUPPORT));
}

#[test]
fn ioctl_query_port_and_gid_table() {
    let env = Env::ioctl_context();
    // QUERY_PORT: the port number is a u8 constant; the response exactly 48 bytes.
    assert_eq!(
        env.ioctl(0, 2, &[inline(0, 8, 2), out(1, 0, 48)]).map(drop),
        Err(EINVAL)
    );
    assert_eq!(
        env.ioctl(0, 2, &[inline(0, 8, 257), out(1, 0, 48)]).map(drop),
        Err(EINVAL)
    );
    assert_eq!(
        env.ioctl(0, 2, &[inline(0, 8, 1), out(1, 0, 40)]).map(drop),
        Err(EINVAL)
    );
    env.mem.write(RESP, &[0xff; 48]).unwrap();
    env.ioctl(0, 2, &[inline(0, 8, 1), out(1, 0, 48)]).unwrap();
    let port: abi::QueryPortResp = env.at(0);
    assert_eq!((port.state, port.lid, port.link_layer, port.gid_tbl_len), (4, 7, 1, 1));
    assert_eq!(env.at::<[u8; 8]>(40), [0; 8]);
    // QUERY_GID_TABLE: flags must be 0, the entry size non-zero and dividing the buffer.
    let gids = |size: u64, len: u16, flags: Option<u64>| {
        let mut a = vec![inline(0, 8, size), out(2, 0, len), out(3, 0x200, 8)];
        if let Some(f) = flags {
            a.push(inline(1, 4, f));
        }
        env.ioctl(0, 5, &a).map(drop)
    };
    assert_eq!(gids(32, 64, Some(1)), Err(EINVAL));
    assert_eq!(gids(0, 64, None), Err(EINVAL));
    assert_eq!(gids(32, 48, None), Err(EINVAL));
    assert_eq!(gids(32, 0, None), Err(EINVAL));
    assert_eq!(gids(32, 64, Some(0)), Ok(()));
    assert_eq!(env.at::<u64>(0x200), 1);
    let e: abi::GidEntry = env.at(0);
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[8..].copy_from_slice(&0x0002_c903_0000_0001u64.to_be_bytes());
    assert_eq!((e.gid, e.gid_index, e.port_num, e.gid_type), (gid, 0, 1, 0));
    // A larger entry size: each entry padded with zeros.
    env.mem.write(RESP, &[0xff; 64]).unwrap();
    assert_eq!(gids(40, 80, None), Ok(()));
    assert_eq!(env.at::<[u8; 8]>(32), [0; 8]);
}

#[test]
fn ioctl_async_event_fds_and_cq_create_destroy() {
    let env = Env::ioctl_context();
    let back = env.ioctl(16, 0, &[obj(0, 0)]).unwrap();
    let async_fd = back[0].data;
    assert_eq!(async_fd, 101);
    // CQ: the write form's driver rules (a 32-byte CQE is EINVAL), an event fd that is not
    // the context's is EBADF, a completion channel that is none EBADF.
    let mut a = env.cq_attrs(15);
    a.push(obj(7, 55));
    assert_eq!(env.ioctl(3, 0, &a).map(drop), Err(EBADF));
    let mut a = env.cq_attrs(15);
    a.push(obj(3, 55));
    assert_eq!(env.ioctl(3, 0, &a).map(drop), Err(EBADF));
    let mut bad = Env::mlx5_cq(CQ_BUF, DB);
    bad.cqe_size = 32;
    let mut a = env.cq_attrs(15);
    a[5] = env.uhw_in(bad.as_bytes());
    assert_eq!(env.ioctl(3, 0, &a).map(drop), Err(EINVAL));
    // IGNORE_OVERRUN: 6.1's mlx5 takes it, the model's device has no such mode.
    let mut a = env.cq_attrs(15);
    a.push(inline(5, 4, 2));
    assert_eq!(env.ioctl(3, 0, &a).map(drop), Err(EOPNOTSUPP));
    let mut a = env.cq_attrs(15);
    a.push(obj(7, async_fd));
    let back = env.ioctl(3, 0, &a).unwrap();
    let handle = back[0].data as u32;
    assert_eq!(env.at::<u32>(0), 15);
    assert_eq!(env.at::<u32>(0x40), 1, "the CQN, in the driver response");
    // Destroy: the events reported; an unknown handle is ENOENT.
    assert_eq!(env.ioctl(3, 1, &[obj(0, 77), out(1, 0, 8)]).map(drop), Err(ENOENT));
    assert_eq!(env.ioctl(3, 1, &[obj(0, 1 << 40), out(1, 0, 8)]).map(drop), Err(ENOENT));
    env.mem.write(RESP, &[0xff; 8]).unwrap();
    env.ioctl(3, 1, &[obj(0, u64::from(handle)), out(1, 0, 8)]).unwrap();
    assert_eq!(env.at::<[u32; 2]>(0), [0, 0]);
    assert_eq!(
        env.ioctl(3, 1, &[obj(0, u64::from(handle)), out(1, 0, 8)]).map(drop),
        Err(ENOENT)
    );
}

#[test]
fn ioctl_qp_create_destroy_and_legacy_bfregs() {
    let env = Env::ioctl_context();
    let pd = env.alloc_pd();
    let back = env.ioctl(3, 0, &env.cq_attrs(15)).unwrap();
    let cq = back[0].data as u32;
    // Unknown PD or CQ: ENOENT (the write form says EINVAL); no send CQ: ENOENT; an SRQ
    // (none exists) ENOENT; creation flags other than SQ_SIG_ALL on RC: EINVAL.
    assert_eq!(env.ioctl(4, 0, &env.qp_attrs(pd + 9, cq, 1)).map(drop), Err(ENOENT));
    assert_eq!(env.ioctl(4, 0, &env.qp_attrs(pd, cq + 9, 1)).map(drop), Err(ENOENT));
    let mut a = env.qp_attrs(pd, cq, 1);
    a.remove(2);
    assert_eq!(env.ioctl(4, 0, &a).map(drop), Err(ENOENT));
    let mut a = env.qp_attrs(pd, cq, 1);
    a.push(obj(3, 0));
    assert_eq!(env.ioctl(4, 0, &a).map(drop), Err(ENOENT));
    let mut a = env.qp_attrs(pd, cq, 1);
    a.push(inline(10, 4, 1 << 8));
    assert_eq!(env.ioctl(4, 0, &a).map(drop), Err(EINVAL));
    let mut a = env.qp_attrs(pd, cq, 1);
    a[6] = inline(9, 8, 77);
    assert_eq!(env.ioctl(4, 0, &a).map(drop), Err(EINVAL));
    // The write form's driver rules: a user index of 0xffffff with CQE version 1 is EINVAL.
    assert_eq!(env.ioctl(4, 0, &env.qp_attrs(pd, cq, 0xff_ffff)).map(drop), Err(EINVAL));
    // Legacy bfregs (16, 4 low latency): the low-latency ones first (bfreg numbers 12..16,
    // indices 24, 25, 28, 29), then the least used medium one (1, 2, ...).
    let mut handles = Vec::new();
    let mut indices = Vec::new();
    for uidx in 1..=6 {
        let mut a = env.qp_attrs(pd, cq, uidx);
        a.push(inline(10, 4, 1 << 12));
        let back = env.ioctl(4, 0, &a).unwrap();
        handles.push(back[0].data);
        let resp: abi::Mlx5CreateQpResp = env.at(0xc0);
        indices.push(resp.bfreg_index);
    }
    assert_eq!(indices, [24, 25, 28, 29, 1, 4]);
    assert_eq!(env.at::<[u32; 5]>(0x80), [8, 8, 1, 1, 0]);
    assert_eq!(env.at::<u32>(0xa0) & 0xff, 5, "the sixth QPN");
    let m = env.model.lock().unwrap();
    let qp = m.qps.get(handles[0] as u32).unwrap();
    assert!(qp.sq_sig_all);
    drop(m);
    // Destroying a QP frees its bfreg for the next one.
    env.ioctl(4, 1, &[obj(0, handles[1]), out(1, 0, 4)]).unwrap();
    let mut a = env.qp_attrs(pd, cq, 9);
    a.push(inline(10, 4, 0));
    let back = env.ioctl(4, 0, &a).unwrap();
    assert_eq!(env.at::<abi::Mlx5CreateQpResp>(0xc0).bfreg_index, 25);
    // Handles are reused lowest first, as the kernel's xarray allocates them.
    assert_eq!(back[0].data, handles[1]);
    env.ioctl(4, 1, &[obj(0, handles[1]), out(1, 0, 4)]).unwrap();
    assert_eq!(
        env.ioctl(4, 1, &[obj(0, handles[1]), out(1, 0, 4)]).map(drop),
        Err(ENOENT)
    );
}

#[test]
fn ioctl_plain_destroys_and_srq() {
    let env = Env::ioctl_context();
    let pd = env.alloc_pd();
    let (mr, _) = env.reg_mr(pd, DATA, 4096, 1).unwrap();
    // PD in use: EBUSY; MR: gone once; AH (the model has none) and SRQ 0: ENOENT.
    assert_eq!(env.ioctl(1, 0, &[obj(0, u64::from(pd))]).map(drop), Err(EBUSY));
    env.ioctl(7, 1, &[obj(0, u64::from(mr))]).unwrap();
    assert_eq!(env.ioctl(7, 1, &[obj(0, u64::from(mr))]).map(drop), Err(ENOENT));
    env.ioctl(1, 0, &[obj(0, u64::from(pd))]).unwrap();
    assert_eq!(env.ioctl(6, 0, &[obj(0, 0)]).map(drop), Err(ENOENT));
    assert_eq!(env.ioctl(5, 1, &[obj(0, 0), out(1, 0, 4)]).map(drop), Err(ENOENT));
    // A handle attribute with a length is EINVAL.
    assert_eq!(env.ioctl(1, 0, &[inline(0, 4, 0)]).map(drop), Err(EINVAL));
    // SRQ creation without driver data: a zeroed request names no ring (hw/mlx5/srq.c
    // create_srq_user copies `min(inlen, sizeof)` bytes, then the umem of address 0 faults).
    let pd = env.alloc_pd();
    let srq = [
        obj(0, 0),
        obj(1, u64::from(pd)),
        inline(4, 8, 0),
        inline(5, 4, 8),
        inline(6, 4, 1),
        inline(7, 4, 0),
        inline(9, 8, 0),
        out(11, 0, 4),
        out(12, 4, 4),
    ];
    assert_eq!(env.ioctl(5, 0, &srq).map(drop), Err(EFAULT));
}

// ---- ioctl: check order and errnos as Linux 6.1 (core/uverbs_ioctl.c, ------------------------
// ---- core/uverbs_std_types_*.c, core/rdma_core.c; docs/kernel-facts.md) ----------------------

/// An ioctl whose header (with `driver_id`) is at `at`, its attributes after it.
fn raw_ioctl(
    env: &Env,
    at: u64,
    object: u16,
    method: u16,
    driver_id: u32,
    attrs: &[abi::IoctlAttr],
    num: u16,
) -> Result<(), Errno> {
    let hdr = abi::IoctlHdr {
        length: 24 + 16 * num,
        object_id: object,
        method_id: method,
        num_attrs: num,
        driver_id,
        ..Default::default()
    };
    let mut bytes = hdr.as_bytes().to_vec();
    for a in attrs {
        bytes.extend_from_slice(a.as_bytes());
    }
    env.mem.write(at, &bytes).unwrap();
    env.model
        .lock()
        .unwrap()
        .ioctl(CTX, abi::RDMA_VERBS_IOCTL, at, &env.mem, &env.host)
}

/// UAR_OBJ_ALLOC's attributes (an NC page), the outputs at `RESP`.
fn uar_alloc_attrs() -> Vec<abi::IoctlAttr> {
    use abi::uar_obj as u;
    vec![
        obj(u::ATTR_HANDLE, 0),
        inline(u::ATTR_TYPE, 8, u::TYPE_NC),
        out(u::ATTR_MMAP_OFFSET, 0, 8),
        out(u::ATTR_MMAP_LENGTH, 8, 4),
        out(u::ATTR_PAGE_ID, 12, 4),
    ]
}

#[test]
fn ioctl_driver_id_is_checked_before_the_method_and_the_array_copied_before_any_attribute() {
    let env = Env::ioctl_context();
    // uverbs_ioctl.c:562 before :569: a wrong driver id is EINVAL even for a method the
    // device lacks.
    assert_eq!(raw_ioctl(&env, CMD, 7, 0, 14, &[], 0), Err(EINVAL));
    assert_eq!(
        raw_ioctl(&env, CMD, 7, 0, abi::RDMA_DRIVER_MLX5, &[], 0),
        Err(EPROTONOSUPPORT)
    );
    // :440: the whole array is copied in before the first attribute is looked at: an
    // array running off the mapped page is EFAULT although its first attribute is an
    // unknown mandatory one (EPROTONOSUPPORT once the array is readable).
    let unknown = inline(9, 0, 0);
    let at = CMD + 4096 - 24 - 16;
    assert_eq!(
        raw_ioctl(&env, at, 0, 2, abi::RDMA_DRIVER_MLX5, &[unknown], 2),
        Err(EFAULT)
    );
    assert_eq!(
        raw_ioctl(&env, at, 0, 2, abi::RDMA_DRIVER_MLX5, &[unknown], 1),
        Err(EPROTONOSUPPORT)
    );
}

#[test]
fn ioctl_without_a_ucontext_handles_name_nothing_and_new_objects_are_einval() {
    use abi::uar_obj as u;
    let env = Env::bare();
    // rdma_core.c:325-327: an existing object's lookup needs no ucontext: ENOENT.
    assert_eq!(env.ioctl(1, 0, &[obj(0, 0)]).map(drop), Err(ENOENT));
    assert_eq!(env.ioctl(3, 1, &[obj(0, 0), out(1, 0, 8)]).map(drop), Err(ENOENT));
    assert_eq!(
        env.ioctl(u::OBJECT, u::METHOD_DESTROY, &[obj(u::ATTR_HANDLE, 0)])
            .map(drop),
        Err(ENOENT)
    );
    // rdma_core.c:265-270: a new object needs it (uverbs_main.c:98-99: EINVAL).
    assert_eq!(env.ioctl(16, 0, &[obj(0, 0)]).map(drop), Err(EINVAL));
    assert_eq!(env.ioctl(3, 0, &env.cq_attrs(15)).map(drop), Err(EINVAL));
    assert_eq!(
        env.ioctl(u::OBJECT, u::METHOD_ALLOC, &uar_alloc_attrs()).map(drop),
        Err(EINVAL)
    );
    // uverbs_std_types_device.c:186: QUERY_PORT asks for it only in its handler, after the
    // attributes were processed: an unknown mandatory attribute comes first.
    let unknown = inline(9, 0, 0);
    assert_eq!(
        env.ioctl(0, 2, &[inline(0, 8, 1), out(1, 0, 48), unknown]).map(drop),
        Err(EPROTONOSUPPORT)
    );
    assert_eq!(
        env.ioctl(0, 2, &[inline(0, 8, 1), out(1, 0, 48)]).map(drop),
        Err(EINVAL)
    );
    // uverbs_std_types_device.c:324-343: QUERY_GID_TABLE checks its flags and sizes first.
    assert_eq!(
        env.ioctl(
            0,
            5,
            &[inline(0, 8, 32), out(2, 0, 64), out(3, 0x200, 8), inline(1, 5, 0)]
        )
        .map(drop),
        Err(EINVAL)
    );
}

#[test]
fn ioctl_objects_are_looked_up_in_array_order_before_the_method_runs() {
    let env = Env::ioctl_context();
    let pd = env.alloc_pd();
    let cq = env.ioctl(3, 0, &env.cq_attrs(15)).unwrap()[0].data as u32;
    // An unknown PD is found out while processing (ENOENT), before the missing mandatory
    // QP type is (EINVAL, uverbs_ioctl.c:450).
    let mut a = env.qp_attrs(pd + 9, cq, 1);
    a.retain(|x| x.attr_id != 9);
    assert_eq!(env.ioctl(4, 0, &a).map(drop), Err(ENOENT));
    // A completion channel that is none is EBADF while processing (rdma_core.c:355), before
    // the comp_vector check of the handler (uverbs_std_types_cq.c:107).
    let mut a = env.cq_attrs(15);
    a[3] = inline(4, 4, 9);
    assert_eq!(env.ioctl(3, 0, &a).map(drop), Err(EINVAL));
    a.push(obj(3, 55));
    assert_eq!(env.ioctl(3, 0, &a).map(drop), Err(EBADF));
    // An event fd that is not the context's is EBADF before the handler looks at the source
    // QPN (EOPNOTSUPP from mlx5 for a non-UD QP).
    let mut a = env.qp_attrs(pd, cq, 1);
    a.push(inline(11, 4, 5));
    assert_eq!(env.ioctl(4, 0, &a).map(drop), Err(EOPNOTSUPP));
    a.push(obj(12, 55));
    assert_eq!(env.ioctl(4, 0, &a).map(drop), Err(EBADF));
    // rdma_core.c:315-316: a negative handle is EINVAL; :342-343: an fd beyond an int EINVAL.
    assert_eq!(env.ioctl(1, 0, &[obj(0, 1 << 63)]).map(drop), Err(EINVAL));
    assert_eq!(env.ioctl(1, 0, &[obj(0, 1 << 40)]).map(drop), Err(ENOENT));
    let mut a = env.cq_attrs(15);
    a.push(obj(7, 1 << 32));
    assert_eq!(env.ioctl(3, 0, &a).map(drop), Err(EINVAL));
}

#[test]
fn ioctl_struct_attributes_take_longer_buffers_zero_beyond_the_struct() {
    let env = Env::ioctl_context();
    // QUERY_PORT's response is UVERBS_ATTR_STRUCT (uverbs_std_types_device.c:463): more than
    // 48 bytes is fine (uverbs_ioctl.c:276-279), and zeroed beyond the struct (:818-821).
    env.mem.write(RESP, &[0xff; 64]).unwrap();
    env.ioctl(0, 2, &[inline(0, 8, 1), out(1, 0, 64)]).unwrap();
    assert_eq!(env.at::<abi::QueryPortResp>(0).lid, 7);
    assert_eq!(env.at::<[u8; 24]>(40), [0; 24]);
    // QP_CREATE's capabilities are UVERBS_ATTR_STRUCT in and out (uverbs_std_types_qp.c:320,
    // :337): a longer input must be zero beyond the 20 bytes (EOPNOTSUPP, uverbs_ioctl.c:269),
    // a longer output is zeroed.
    let pd = env.alloc_pd();
    let cq = env.ioctl(3, 0, &env.cq_attrs(15)).unwrap()[0].data as u32;
    let long_cap = |tail: u32, out_len: u16| {
        let mut a = env.qp_attrs(pd, cq, 1);
        env.mem.write(IN_BUF + 0x100 + 20, &tail.to_ne_bytes()).unwrap();
        a[5] = inline(8, 24, IN_BUF + 0x100);
        a[7] = out(13, 0x80, out_len);
        env.ioctl(4, 0, &a).map(drop)
    };
    assert_eq!(long_cap(1, 20), Err(EOPNOTSUPP));
    env.mem.write(RESP + 0x80, &[0xff; 24]).unwrap();
    assert_eq!(long_cap(0, 24), Ok(()));
    assert_eq!(env.at::<[u32; 6]>(0x80), [8, 8, 1, 1, 0, 0]);
    // Shorter than the struct stays EINVAL.
    let mut a = env.qp_attrs(pd, cq, 2);
    a[5] = inline(8, 16, IN_BUF + 0x100);
    assert_eq!(env.ioctl(4, 0, &a).map(drop), Err(EINVAL));
}

#[test]
fn ioctl_cq_flags_as_6_1() {
    let env = Env::ioctl_context();
    let with_flags = |len: u16, flags: u64, vector: u64| {
        let mut a = env.cq_attrs(15);
        a[3] = inline(4, 4, vector);
        a.push(inline(5, len, flags));
        env.ioctl(3, 0, &a).map(drop)
    };
    // uverbs_std_types_cq.c:89-94: unknown bits EINVAL; uverbs_ioctl.c:660-665: a flags
    // attribute of 5 bytes too.
    assert_eq!(with_flags(4, 4, 0), Err(EINVAL));
    assert_eq!(with_flags(5, 0, 0), Err(EINVAL));
    // TIMESTAMP_COMPLETION: mlx5 takes it (hw/mlx5/mlx5_ib.h:1489) and it changes nothing.
    assert_eq!(with_flags(8, 1, 0), Ok(()));
    // IGNORE_OVERRUN (not modelled: EOPNOTSUPP) after the comp_vector check
    // (uverbs_std_types_cq.c:107) and the driver's size check (hw/mlx5/cq.c:959).
    assert_eq!(with_flags(4, 2, 9), Err(EINVAL));
    let mut a = env.cq_attrs(1 << 23);
    a.push(inline(5, 4, 2));
    assert_eq!(env.ioctl(3, 0, &a).map(drop), Err(EINVAL));
    assert_eq!(with_flags(4, 2, 0), Err(EOPNOTSUPP));
}

#[test]
fn ioctl_qp_creation_flags_as_check_creation_flags() {
    let env = Env::ioctl_context();
    let pd = env.alloc_pd();
    let cq = env.ioctl(3, 0, &env.cq_attrs(15)).unwrap()[0].data as u32;
    let with = |qp_type: u64, flags: u64| {
        let mut a = env.qp_attrs(pd, cq, 1);
        a[6] = inline(9, 8, qp_type);
        a.push(inline(10, 8, flags));
        env.ioctl(4, 0, &a).map(drop)
    };
    // uverbs_std_types_qp.c:56-59: SCATTER_FCS and CVLAN_STRIPPING only on raw packet QPs.
    assert_eq!(with(4, 1 << 8), Err(EINVAL));
    assert_eq!(with(4, 1 << 9), Err(EINVAL));
    // Other creation flags pass the core on UD, every one on a driver QP (:50); the driver
    // then refuses the capabilities the model lacks (hw/mlx5/qp.c:2997-3000), and the
    // model has no driver QPs.
    assert_eq!(with(4, 1 << 1), Err(EOPNOTSUPP));
    assert_eq!(with(0xff, 1 << 8), Err(EOPNOTSUPP));
    // :53-54: none on RC; a 64-bit flag beyond the known ones is EINVAL (:194-202).
    assert_eq!(with(2, 1 << 1), Err(EINVAL));
    assert_eq!(with(2, 1 << 40), Err(EINVAL));
}

#[test]
fn ioctl_get_context_writes_its_outputs_before_refusing_a_second_context() {
    let env = Env::ioctl_context();
    env.mem.write(RESP, &[0; 16]).unwrap();
    // uverbs_std_types_device.c:218-231: the outputs are copied before ib_init_ucontext finds
    // the file's ucontext (core/uverbs_cmd.c:241: EINVAL).
    assert_eq!(env.ioctl(0, 3, &[out(0, 0, 4), out(1, 8, 8)]).map(drop), Err(EINVAL));
    assert_eq!((env.at::<u32>(0), env.at::<u64>(8)), (4, 1));
}

#[test]
fn ioctl_uar_object_attributes_as_the_core_processes_them() {
    use abi::uar_obj as u;
    let env = Env::new(true);
    let alloc = |f: &dyn Fn(&mut Vec<abi::IoctlAttr>)| {
        let mut a = uar_alloc_attrs();
        f(&mut a);
        env.ioctl(u::OBJECT, u::METHOD_ALLOC, &a)
    };
    // uverbs_ioctl.c:409-410: the same attribute twice; :276-279: an output of the wrong size.
    assert_eq!(alloc(&|a| a.push(a[1])).map(drop), Err(EINVAL));
    assert_eq!(alloc(&|a| a[4].len = 8).map(drop), Err(EINVAL));
    // hw/mlx5/main.c:3521-3528: the type is a 32-bit enum constant (beyond: EINVAL,
    // uverbs_ioctl.c:803), an unknown one EOPNOTSUPP.
    assert_eq!(alloc(&|a| a[1].data = 1 << 32).map(drop), Err(EINVAL));
    assert_eq!(alloc(&|a| a[1].data = 2).map(drop), Err(EOPNOTSUPP));
    let handle = alloc(&|_| {}).unwrap()[0].data;
    assert_eq!(env.at::<u32>(8), 4096);
    let destroy = |h: u64| {
        env.ioctl(u::OBJECT, u::METHOD_DESTROY, &[obj(u::ATTR_HANDLE, h)])
            .map(drop)
    };
    assert_eq!(destroy(handle + 5), Err(ENOENT));
    assert_eq!(destroy(1 << 63), Err(EINVAL));
    assert_eq!(destroy(handle), Ok(()));
    assert_eq!(destroy(handle), Err(ENOENT));
}

#[test]
fn rts_to_sqd_is_einval_as_mlx5_has_no_rts2sqd_command() {
    let env = Env::new(false);
    let pd = env.alloc_pd();
    let cq = env.create_cq(15, CQ_BUF, DB).unwrap();
    let (qp, qpn) = env
        .create_qp_with(
            Env::qp_cmd(pd, cq, abi::qpt::RC),
            Env::mlx5_qp(QP_BUF, DB + 64, 0).as_bytes(),
        )
        .unwrap();
    env.connect(qp, qpn, 7);
    let to_sqd = |env: &Env| {
        env.modify(qp, |m| {
            m.attr_mask = qp_attr::STATE;
            m.qp_state = qps::SQD;
        })
    };
    assert_eq!(to_sqd(&env), Err(EINVAL));
}

// ---- shared receive queues (hw/mlx5/srq.c) -------------------------------------------------

const SRQ_BUF: u64 = QP_BUF + 0x8000;
const SRQ_DB: u64 = DB + 0x400;

fn srq_cmd(pd: u32, max_wr: u32, max_sge: u32) -> abi::CreateSrq {
    abi::CreateSrq {
        response: RESP,
        user_handle: 0x5,
        pd_handle: pd,
        max_wr,
        max_sge,
        srq_limit: 0,
    }
}

fn mlx5_srq() -> abi::Mlx5CreateSrq {
    abi::Mlx5CreateSrq {
        buf_addr: SRQ_BUF,
        db_addr: SRQ_DB,
        ..Default::default()
    }
}

impl Env {
    /// CREATE_SRQ with a 16-byte core and 8-byte driver response; the handle.
    fn create_srq(&self, core: abi::CreateSrq, drv: &[u8]) -> Result<u32, Errno> {
        self.write(cmd::CREATE_SRQ, core.as_bytes(), drv, 6)?;
        Ok(self.resp::<abi::CreateSrqResp>().srq_handle)
    }

    fn modify_srq(&self, srq: u32, mask: u32, limit: u32) -> Result<(), Errno> {
        let m = abi::ModifySrq {
            srq_handle: srq,
            attr_mask: mask,
            max_wr: 0,
            srq_limit: limit,
        };
        self.write(cmd::MODIFY_SRQ, m.as_bytes(), &[], 0)
    }

    fn query_srq(&self, srq: u32) -> Result<abi::QuerySrqResp, Errno> {
        let q = abi::DestroyObj {
            response: RESP,
            handle: srq,
            reserved: 0,
        };
        self.write(cmd::QUERY_SRQ, q.as_bytes(), &[], 4)?;
        Ok(self.resp())
    }

    fn destroy_srq(&self, srq: u32) -> Result<u32, Errno> {
        let d = abi::DestroyObj {
            response: RESP,
            handle: srq,
            reserved: 0,
        };
        self.write(cmd::DESTROY_SRQ, d.as_bytes(), &[], 1)?;
        Ok(self.resp())
    }

    /// A QP on SRQ `srq` (no receive queue) with its buffer at `buf`, doorbell at `db`.
    fn create_srq_qp(&self, pd: u32, cq: u32, srq: u32, buf: u64, db: u64, uidx: u32) -> Result<(u32, u32), Errno> {
        let mut core = Env::qp_cmd(pd, cq, abi::qpt::RC);
        (core.is_srq, core.srq_handle) = (1, srq);
        let mut u = Env::mlx5_qp(buf, db, uidx);
        (u.rq_wqe_count, u.rq_wqe_shift) = (0, 0);
        self.create_qp_with(core, u.as_bytes())
    }

    /// The async events raised so far: (element, type).
    fn async_events(&self) -> Vec<(u64, u32)> {
        let sinks = self.host.sinks.lock().unwrap();
        let records = sinks[0].0.lock().unwrap();
        records
            .iter()
            .map(|r| {
                let ev = abi::AsyncEventDesc::read_from_bytes(r).unwrap();
                (ev.element, ev.event_type)
            })
            .collect()
    }
}

fn srq_env() -> (Env, u32) {
    let env = Env::new(false);
    let pd = env.alloc_pd();
    (env, pd)
}

#[test]
fn create_srq_reports_max_minus_one_wqes_the_sges_asked_for_and_the_srqn() {
    let (env, pd) = srq_env();
    // max = roundup_pow_of_two(max_wr + 1): 10 -> 16 WQEs, 15 reported; max_sge as asked.
    let h = env.create_srq(srq_cmd(pd, 10, 3), mlx5_srq().as_bytes()).unwrap();
    let core: abi::CreateSrqResp = env.resp();
    assert_eq!((core.srq_handle, core.max_wr, core.max_sge, core.srqn), (h, 15, 3, 0));
    let drv: abi::Mlx5CreateSrqResp = env.at(16);
    let m = env.model.lock().unwrap();
    let srq = m.srqs.get(h).unwrap();
    assert_eq!(drv.srqn, srq.srqn);
    assert_ne!(srq.srqn, 0, "libmlx5 with CQE version 0 reads srqn 0 as no SRQ");
    // WQE: 16-byte next segment + 3 data segments = 64 bytes.
    assert_eq!((srq.max, srq.wqe_shift), (16, 6));
    drop(m);
    // One scatter entry still takes a 32-byte WQE.
    let h = env.create_srq(srq_cmd(pd, 1, 1), mlx5_srq().as_bytes()).unwrap();
    assert_eq!(env.model.lock().unwrap().srqs.get(h).unwrap().wqe_shift, 5);
}

#[test]
fn create_srq_too_many_wqes_or_sges_is_einval() {
    let (env, pd) = srq_env();
    let u = mlx5_srq();
    // srq.c:211: max_wr >= 1 << log_max_srq_sz (2^15), max_sge > max_wqe_sz_rq / 16 (32).
    assert_eq!(env.create_srq(srq_cmd(pd, 1 << 15, 1), u.as_bytes()), Err(EINVAL));
    assert_eq!(env.create_srq(srq_cmd(pd, 1, 33), u.as_bytes()), Err(EINVAL));
    env.mem.add(0x100_0000, 1 << 20);
    let mut big = u;
    big.buf_addr = 0x100_0000;
    assert!(env.create_srq(srq_cmd(pd, (1 << 15) - 1, 1), big.as_bytes()).is_ok());
    assert!(env.create_srq(srq_cmd(pd, 1, 32), u.as_bytes()).is_ok());
}

#[test]
fn create_srq_reserved_fields_are_einval() {
    let (env, pd) = srq_env();
    let mut u = mlx5_srq();
    u.reserved0 = 1;
    assert_eq!(env.create_srq(srq_cmd(pd, 7, 1), u.as_bytes()), Err(EINVAL));
    let mut u = mlx5_srq();
    u.reserved1 = 1;
    assert_eq!(env.create_srq(srq_cmd(pd, 7, 1), u.as_bytes()), Err(EINVAL));
}

#[test]
fn create_srq_driver_data_beyond_the_struct_must_be_zero() {
    let (env, pd) = srq_env();
    let mut b = mlx5_srq().as_bytes().to_vec();
    b.extend_from_slice(&[0, 0, 0, 1]);
    assert_eq!(env.create_srq(srq_cmd(pd, 7, 1), &b), Err(EINVAL));
    b[35] = 0;
    assert!(env.create_srq(srq_cmd(pd, 7, 1), &b).is_ok());
}

#[test]
fn create_srq_basic_ignores_the_user_index_and_unknown_flags() {
    // srq.c:70: a basic SRQ's uidx is not read (libmlx5 44 sends 0); 6.1 checks no flags.
    let (env, pd) = srq_env();
    for (uidx, flags) in [(0, 0), (abi::DEFAULT_UIDX, 0), (0xffff_ffff, 0x80)] {
        let mut u = mlx5_srq();
        (u.uidx, u.flags) = (uidx, flags);
        assert!(env.create_srq(srq_cmd(pd, 7, 1), u.as_bytes()).is_ok(), "{uidx:#x}");
    }
    // Driver data shorter than the uidx field is accepted too (read as zeros).
    assert!(env.create_srq(srq_cmd(pd, 7, 1), &mlx5_srq().as_bytes()[..16]).is_ok());
}

#[test]
fn create_srq_unmapped_ring_or_doorbell_is_efault_and_unknown_pd_enoent() {
    let (env, pd) = srq_env();
    let mut u = mlx5_srq();
    u.buf_addr = 0x7000_0000;
    assert_eq!(env.create_srq(srq_cmd(pd, 7, 1), u.as_bytes()), Err(EFAULT));
    // No driver data: a NULL ring.
    assert_eq!(env.create_srq(srq_cmd(pd, 7, 1), &[]), Err(EFAULT));
    let mut u = mlx5_srq();
    u.db_addr = 0x7000_0000;
    assert_eq!(env.create_srq(srq_cmd(pd, 7, 1), u.as_bytes()), Err(EFAULT));
    assert_eq!(
        env.create_srq(srq_cmd(pd + 5, 7, 1), mlx5_srq().as_bytes()),
        Err(ENOENT)
    );
    // A failed create leaves the PD free.
    let dealloc = abi::HandleOnly { handle: pd };
    env.write(cmd::DEALLOC_PD, dealloc.as_bytes(), &[], 0).unwrap();
}

#[test]
fn create_srq_driver_response_is_clamped_to_outlen() {
    let (env, pd) = srq_env();
    env.mem.write(RESP + 16, &[0xee; 8]).unwrap();
    // out_words 5: the core response and 4 driver bytes: srqn only.
    env.write(cmd::CREATE_SRQ, srq_cmd(pd, 7, 1).as_bytes(), mlx5_srq().as_bytes(), 5)
        .unwrap();
    let drv: [u8; 8] = env.at(16);
    assert_ne!(drv[..4], [0xee; 4]);
    assert_eq!(drv[4..], [0xee; 4]);
    // No driver response at all is fine (min(outlen, 8) = 0).
    env.write(cmd::CREATE_SRQ, srq_cmd(pd, 7, 1).as_bytes(), mlx5_srq().as_bytes(), 4)
        .unwrap();
    // Core response short of 16 bytes: ENOSPC.
    assert_eq!(
        env.write(cmd::CREATE_SRQ, srq_cmd(pd, 7, 1).as_bytes(), mlx5_srq().as_bytes(), 3),
        Err(ENOSPC)
    );
}

#[test]
fn modify_srq_rules_and_query_srq() {
    let (env, pd) = srq_env();
    let h = env.create_srq(srq_cmd(pd, 7, 2), mlx5_srq().as_bytes()).unwrap();
    assert_eq!(env.modify_srq(h + 3, abi::SRQ_ATTR_LIMIT, 1), Err(ENOENT));
    // srq.c:332: no resize.
    assert_eq!(env.modify_srq(h, abi::SRQ_ATTR_MAX_WR, 0), Err(EINVAL));
    // srq.c:336: a limit of max (8) WQEs or more.
    assert_eq!(env.modify_srq(h, abi::SRQ_ATTR_LIMIT, 8), Err(EINVAL));
    env.modify_srq(h, abi::SRQ_ATTR_LIMIT, 7).unwrap();
    let q = env.query_srq(h).unwrap();
    assert_eq!((q.max_wr, q.max_sge, q.srq_limit), (7, 2, 7));
    // An empty mask changes nothing.
    env.modify_srq(h, 0, 3).unwrap();
    assert_eq!(env.query_srq(h).unwrap().srq_limit, 7);
    assert_eq!(env.query_srq(h + 3).map(drop), Err(ENOENT));
}

#[test]
fn destroy_srq_unknown_is_enoent_and_in_use_ebusy() {
    let (env, pd) = srq_env();
    let cq = env.create_cq(15, CQ_BUF, DB).unwrap();
    let srq = env.create_srq(srq_cmd(pd, 7, 1), mlx5_srq().as_bytes()).unwrap();
    assert_eq!(env.destroy_srq(srq + 1), Err(ENOENT));
    let (qp, _) = env.create_srq_qp(pd, cq, srq, QP_BUF, DB + 64, 1).unwrap();
    assert_eq!(env.destroy_srq(srq), Err(EBUSY));
    let d = abi::DestroyObj {
        response: RESP,
        handle: qp,
        reserved: 0,
    };
    env.write(cmd::DESTROY_QP, d.as_bytes(), &[], 1).unwrap();
    assert_eq!(env.destroy_srq(srq), Ok(0));
    assert_eq!(env.destroy_srq(srq), Err(ENOENT));
}

#[test]
fn create_qp_on_an_srq_has_no_receive_queue() {
    let (env, pd) = srq_env();
    let cq = env.create_cq(15, CQ_BUF, DB).unwrap();
    let srq = env.create_srq(srq_cmd(pd, 7, 1), mlx5_srq().as_bytes()).unwrap();
    // An SRQ handle that names nothing: ENOENT.
    assert_eq!(env.create_srq_qp(pd, cq, srq + 1, QP_BUF, DB + 64, 1), Err(ENOENT));
    // qp.c:639 qp_has_rq is false, so the driver data must describe no RQ (qp.c:2242).
    let mut core = Env::qp_cmd(pd, cq, abi::qpt::RC);
    (core.is_srq, core.srq_handle) = (1, srq);
    let u = Env::mlx5_qp(QP_BUF, DB + 64, 1);
    assert_eq!(env.create_qp_with(core, u.as_bytes()), Err(EINVAL));
    env.create_srq_qp(pd, cq, srq, QP_BUF, DB + 64, 1).unwrap();
    let r: abi::CreateQpResp = env.resp();
    assert_eq!((r.max_recv_wr, r.max_recv_sge), (0, 0));
}

#[test]
fn ioctl_srq_create_and_destroy() {
    let env = Env::ioctl_context();
    let pd = env.alloc_pd();
    let attrs = |ty: u64| {
        vec![
            obj(0, 0),
            obj(1, u64::from(pd)),
            inline(4, 8, 0x77),
            inline(5, 4, 10),
            inline(6, 4, 2),
            inline(7, 4, 0),
            inline(9, 8, ty),
            out(11, 0, 4),
            out(12, 4, 4),
            env.uhw_in(mlx5_srq().as_bytes()),
            out(UHW_OUT, 0x40, 8),
        ]
    };
    let back = env.ioctl(5, 0, &attrs(0)).unwrap();
    let h = back[0].data as u32;
    assert_eq!((env.at::<u32>(0), env.at::<u32>(4)), (15, 2));
    let srqn = env.model.lock().unwrap().srqs.get(h).unwrap().srqn;
    assert_eq!(env.at::<u32>(0x40), srqn);
    // Type 3 is no SRQ type: EINVAL; XRC and tag matching need a CQ (absent: ENOENT); XRC
    // an XRC domain (the model has none: ENOENT); tag matching its tag count (absent:
    // ENOENT), then the device has no tag matching (srq.c:267): EINVAL.
    let cq = env.ioctl(3, 0, &env.cq_attrs(15)).unwrap()[0].data;
    assert_eq!(env.ioctl(5, 0, &attrs(3)).map(drop), Err(EINVAL));
    assert_eq!(env.ioctl(5, 0, &attrs(1)).map(drop), Err(ENOENT));
    let mut a = attrs(1);
    a.push(obj(3, cq));
    assert_eq!(env.ioctl(5, 0, &a).map(drop), Err(ENOENT));
    let mut a = attrs(2);
    a.push(obj(3, cq));
    assert_eq!(env.ioctl(5, 0, &a).map(drop), Err(ENOENT));
    a.push(inline(8, 4, 16));
    assert_eq!(env.ioctl(5, 0, &a).map(drop), Err(EINVAL));
    // The driver rules hold in this form too.
    let mut a = attrs(0);
    let mut u = mlx5_srq();
    u.reserved1 = 1;
    a[9] = env.uhw_in(u.as_bytes());
    assert_eq!(env.ioctl(5, 0, &a).map(drop), Err(EINVAL));
    // A QP names the SRQ by attribute 3; the SRQ is busy until the QP goes.
    let mut a = env.qp_attrs(pd, cq as u32, 1);
    a.push(obj(3, u64::from(h)));
    a[9] = env.uhw_in(Env::mlx5_qp(QP_BUF, DB + 64, 1).as_bytes());
    assert_eq!(env.ioctl(4, 0, &a).map(drop), Err(EINVAL), "an RQ described");
    let mut u = Env::mlx5_qp(QP_BUF, DB + 64, 1);
    (u.rq_wqe_count, u.rq_wqe_shift) = (0, 0);
    a[9] = env.uhw_in(u.as_bytes());
    let qp = env.ioctl(4, 0, &a).unwrap()[0].data;
    assert_eq!(
        env.ioctl(5, 1, &[obj(0, u64::from(h)), out(1, 0, 4)]).map(drop),
        Err(EBUSY)
    );
    env.ioctl(4, 1, &[obj(0, qp), out(1, 0, 4)]).unwrap();
    env.ioctl(5, 1, &[obj(0, u64::from(h)), out(1, 0, 4)]).unwrap();
    assert_eq!(
        env.ioctl(5, 1, &[obj(0, u64::from(h)), out(1, 0, 4)]).map(drop),
        Err(ENOENT)
    );
}

/// Two senders with their own RQs, each connected to a receiver on one SRQ of 8 WQEs of one
/// data segment (32-byte WQEs at `SRQ_BUF`).
struct SrqRig {
    env: Env,
    key: u32,
    srq: u32,
    senders: [(u32, u32); 2],
    receivers: [(u32, u32); 2],
    sent: [u16; 2],
    posted: u16,
}

const RIG_BUF: [u64; 4] = [QP_BUF, QP_BUF + 0x1000, QP_BUF + 0x2000, QP_BUF + 0x3000];
const RIG_DB: [u64; 4] = [DB + 64, DB + 128, DB + 192, DB + 256];

impl SrqRig {
    fn new(cqe_version: u8) -> Self {
        let env = Env::bare();
        let req = ucontext(|r| r.max_cqe_version = cqe_version);
        env.get_context(req.as_bytes()).unwrap();
        let pd = env.alloc_pd();
        let (_, key) = env.reg_mr(pd, DATA, 0x8000, 0xf).unwrap();
        let cq = env.create_cq(63, CQ_BUF, DB).unwrap();
        let srq = env.create_srq(srq_cmd(pd, 7, 1), mlx5_srq().as_bytes()).unwrap();
        let uidx = |i: u32| if cqe_version == 1 { 10 + i } else { abi::DEFAULT_UIDX };
        let mut qps = Vec::new();
        for i in 0..4u32 {
            let qp = if i < 2 {
                let mut u = Env::mlx5_qp(RIG_BUF[i as usize], RIG_DB[i as usize], uidx(i));
                (u.rq_wqe_count, u.rq_wqe_shift) = (0, 0);
                let mut core = Env::qp_cmd(pd, cq, abi::qpt::RC);
                core.max_recv_wr = 0;
                env.create_qp_with(core, u.as_bytes())
            } else {
                env.create_srq_qp(pd, cq, srq, RIG_BUF[i as usize], RIG_DB[i as usize], uidx(i))
            };
            qps.push(qp.unwrap());
        }
        for i in 0..2 {
            env.connect(qps[i].0, qps[i + 2].1, 0);
            env.connect(qps[i + 2].0, qps[i].1, 0);
        }
        // libmlx5's free list at creation: WQE i links to i + 1.
        for i in 0..8u16 {
            env.mem
                .write(SRQ_BUF + u64::from(i) * 32 + 2, &((i + 1) % 8).to_be_bytes())
                .unwrap();
        }
        Self {
            env,
            key,
            srq,
            senders: [qps[0], qps[1]],
            receivers: [qps[2], qps[3]],
            sent: [0; 2],
            posted: 0,
        }
    }

    /// Writes SRQ WQE `index` (a receive of `len` bytes at `addr`) and bumps the doorbell
    /// record's count of posted WQEs.
    fn post_srq(&mut self, index: u16, addr: u64, len: u32) {
        let at = SRQ_BUF + u64::from(index) * 32;
        self.env.mem.write(at + 16, &data_seg(len, self.key, addr)).unwrap();
        self.posted = self.posted.wrapping_add(1);
        self.env
            .mem
            .write(SRQ_DB, &u32::from(self.posted).to_be_bytes())
            .unwrap();
    }

    /// Links SRQ WQE `from` to `to` (what libmlx5 does when a WQE returns to the free list).
    fn link(&self, from: u16, to: u16) {
        self.env
            .mem
            .write(SRQ_BUF + u64::from(from) * 32 + 2, &to.to_be_bytes())
            .unwrap();
    }

    /// A signaled SEND of `len` bytes at `addr` from sender `i`.
    fn send(&mut self, i: usize, addr: u64, len: u32) {
        let idx = self.sent[i];
        let mut wqe = [0u8; 64];
        wqe[0..4].copy_from_slice(&((u32::from(idx) << 8) | u32::from(abi::opcode::SEND)).to_be_bytes());
        wqe[4..8].copy_from_slice(&((self.senders[i].1 << 8) | 2).to_be_bytes());
        wqe[11] = abi::WQE_CTRL_CQ_UPDATE;
        wqe[16..32].copy_from_slice(&data_seg(len, self.key, addr));
        let sq = RIG_BUF[i];
        self.env.mem.write(sq + u64::from(idx % 16) * 64, &wqe).unwrap();
        self.sent[i] += 1;
        self.env
            .mem
            .write(RIG_DB[i] + abi::SND_DBR, &u32::from(self.sent[i]).to_be_bytes())
            .unwrap();
    }

    /// The CQEs written: (opcode, syndrome, qpn, srqn_uidx, wqe_counter, byte_cnt).
    fn cqes(&self) -> Vec<(u8, u8, u32, u32, u16, u32)> {
        let mut out = Vec::new();
        for slot in 0..64u64 {
            let mut c = [0u8; 64];
            self.env.mem.read(CQ_BUF + slot * 64, &mut c).unwrap();
            if c[56..60] == [0; 4] {
                break;
            }
            let be32 = |at: usize| u32::from_be_bytes(c[at..at + 4].try_into().unwrap());
            out.push((
                c[63] >> 4,
                c[55],
                be32(56) & 0xff_ffff,
                be32(32) & 0xff_ffff,
                u16::from_be_bytes([c[60], c[61]]),
                be32(44),
            ));
        }
        out
    }

    /// The receive CQEs: (qpn, srqn_uidx, wqe_counter, byte_cnt).
    fn receives(&self) -> Vec<(u32, u32, u16, u32)> {
        self.cqes()
            .into_iter()
            .filter(|c| c.0 == abi::cqe_op::RESP_SEND)
            .map(|c| (c.2, c.3, c.4, c.5))
            .collect()
    }
}

#[test]
fn sends_to_two_qps_take_the_srq_wqes_along_their_links() {
    let mut r = SrqRig::new(1);
    r.env.mem.write(DATA, b"abcdefgh").unwrap();
    // Free list 0 -> 5 -> 2: the device takes WQE 0, then the one 0 links to, and so on.
    r.link(0, 5);
    r.link(5, 2);
    r.post_srq(0, DATA + 0x1000, 16);
    r.post_srq(5, DATA + 0x1100, 16);
    r.post_srq(2, DATA + 0x1200, 16);
    for (i, at, len) in [(0, 0, 3), (1, 3, 4), (0, 7, 1)] {
        r.send(i, DATA + at, len);
        r.env.drive();
    }
    let rx = [r.receivers[0].1, r.receivers[1].1];
    // CQE version 1: srqn_uidx is the receiving QP's user index (12, 13).
    assert_eq!(
        r.receives(),
        vec![(rx[0], 12, 0, 3), (rx[1], 13, 5, 4), (rx[0], 12, 2, 1)]
    );
    let mut got = [0u8; 4];
    r.env.mem.read(DATA + 0x1000, &mut got[..3]).unwrap();
    assert_eq!(&got[..3], b"abc");
    r.env.mem.read(DATA + 0x1100, &mut got).unwrap();
    assert_eq!(&got, b"defg");
    r.env.mem.read(DATA + 0x1200, &mut got[..1]).unwrap();
    assert_eq!(&got[..1], b"h");
    assert_eq!(r.env.mem.stray(), 0);
}

#[test]
fn with_cqe_version_0_a_receive_cqe_carries_the_srqn() {
    let mut r = SrqRig::new(0);
    r.post_srq(0, DATA + 0x1000, 16);
    r.send(1, DATA, 8);
    r.env.drive();
    let srqn = r.env.model.lock().unwrap().srqs.get(r.srq).unwrap().srqn;
    assert_eq!(r.receives(), vec![(r.receivers[1].1, srqn, 0, 8)]);
}

#[test]
fn an_empty_srq_answers_rnr() {
    let mut r = SrqRig::new(1);
    r.send(0, DATA, 8);
    r.env.drive();
    // rnr_retry 0: the sender fails at once; nothing was received.
    let c = r.cqes();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!((c[0].0, c[0].1), (abi::cqe_op::REQ_ERR, abi::syndrome::RNR_RETRY_EXC));
}

#[test]
fn the_srq_limit_event_fires_once_when_the_wqes_left_drop_below_it() {
    let mut r = SrqRig::new(1);
    for i in 0..4 {
        r.post_srq(i, DATA + 0x1000 + u64::from(i) * 0x100, 16);
    }
    r.env.modify_srq(r.srq, abi::SRQ_ATTR_LIMIT, 2).unwrap();
    // 4 posted: 3 left, then 2 (not below 2), then 1: the event, once.
    r.send(0, DATA, 8);
    r.send(0, DATA, 8);
    r.env.drive();
    assert_eq!(r.env.async_events(), vec![]);
    r.send(1, DATA, 8);
    r.env.drive();
    let limit = (0x5, abi::event::SRQ_LIMIT_REACHED);
    assert_eq!(r.env.async_events(), vec![limit]);
    // Disarmed: QUERY_SRQ reports 0 and the last receive raises nothing.
    assert_eq!(r.env.query_srq(r.srq).unwrap().srq_limit, 0);
    r.send(1, DATA, 8);
    r.env.drive();
    assert_eq!(r.env.async_events(), vec![limit]);
    assert_eq!(r.receives().len(), 4);
    // DESTROY_SRQ counts the event once the client has read it.
    r.env.model.lock().unwrap().srqs.get_mut(r.srq).unwrap().async_events = 1;
    for qp in r.receivers {
        let d = abi::DestroyObj {
            response: RESP,
            handle: qp.0,
            reserved: 0,
        };
        r.env.write(cmd::DESTROY_QP, d.as_bytes(), &[], 1).unwrap();
    }
    assert_eq!(r.env.destroy_srq(r.srq), Ok(1));
}

#[test]
fn events_read_counts_srq_events_for_destroy_srq() {
    let r = SrqRig::new(1);
    let ev = abi::AsyncEventDesc {
        element: 0x5,
        event_type: abi::event::SRQ_LIMIT_REACHED,
        reserved: 0,
    };
    let fd = r.env.model.lock().unwrap().contexts[&CTX].async_fd.unwrap();
    r.env.model.lock().unwrap().events_read(fd, ev.as_bytes());
    assert_eq!(r.env.model.lock().unwrap().srqs.get(r.srq).unwrap().async_events, 1);
}

#[test]
fn a_qp_on_the_srq_moved_to_err_flushes_nothing_of_the_srq() {
    let mut r = SrqRig::new(1);
    r.post_srq(0, DATA + 0x1000, 16);
    r.post_srq(1, DATA + 0x1100, 16);
    let rx0 = r.receivers[0].0;
    r.env
        .modify(rx0, |m| (m.attr_mask, m.qp_state) = (qp_attr::STATE, qps::ERR))
        .unwrap();
    r.env.drive();
    assert_eq!(r.cqes(), vec![]);
    // The other QP still receives into both WQEs.
    r.send(1, DATA, 8);
    r.send(1, DATA, 8);
    r.env.drive();
    assert_eq!(r.receives().iter().map(|c| c.2).collect::<Vec<_>>(), [0, 1]);
}

#[test]
fn a_receive_too_small_completes_its_srq_wqe_in_error() {
    let mut r = SrqRig::new(1);
    r.post_srq(0, DATA + 0x1000, 4);
    r.send(0, DATA, 8);
    r.env.drive();
    let c = r.cqes();
    let resp_err = c.iter().find(|c| c.0 == abi::cqe_op::RESP_ERR).copied();
    // Local length error on the receiver, WQE index 0 (libmlx5 returns it to the free list).
    assert_eq!(
        resp_err.map(|c| (c.1, c.2, c.3, c.4)),
        Some((abi::syndrome::LOCAL_LENGTH, r.receivers[0].1, 12, 0))
    );
}

#[test]
fn an_srq_doorbell_beyond_the_ring_raises_srq_err() {
    let mut r = SrqRig::new(1);
    r.env.mem.write(SRQ_DB, &9u32.to_be_bytes()).unwrap();
    r.send(0, DATA, 8);
    r.env.drive();
    assert_eq!(r.env.async_events(), vec![(0x5, abi::event::SRQ_ERR)]);
    assert!(r.receives().is_empty());
    assert_eq!(r.env.mem.stray(), 0);
}

#[test]
fn hostile_srq_wqes_links_and_doorbells_never_panic_or_stray() {
    let mut rng = uverbs::testing::Rng::new(0x5a5a);
    for round in 0..100 {
        let mut r = SrqRig::new(1);
        for _ in 0..6 {
            // A WQE of noise (its link and segments included), sometimes a plausible one.
            let index = rng.below(8) as u16;
            let mut junk = [0u8; 32];
            for b in junk.chunks_mut(8) {
                b.copy_from_slice(&rng.next_u64().to_ne_bytes());
            }
            if rng.below(2) == 0 {
                junk[16..32].copy_from_slice(&data_seg(rng.below(64) as u32, r.key, DATA + 0x1000));
            }
            r.env.mem.write(SRQ_BUF + u64::from(index) * 32, &junk).unwrap();
            let count = match rng.below(4) {
                0 => rng.next_u64() as u32,
                _ => u32::from(r.posted.wrapping_add(rng.below(3) as u16)),
            };
            r.env.mem.write(SRQ_DB, &count.to_be_bytes()).unwrap();
            if rng.below(3) == 0 {
                r.env
                    .modify_srq(r.srq, abi::SRQ_ATTR_LIMIT, rng.below(8) as u32)
                    .unwrap();
            }
            r.send(rng.below(2) as usize, DATA, rng.below(48) as u32);
            r.env.drive();
        }
        assert_eq!(r.env.mem.stray(), 0, "round {round}");
    }
}
