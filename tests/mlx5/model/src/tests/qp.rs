//! QPs: CREATE_QP's driver data, user index, rings and types, and MODIFY_QP's transitions.

use super::context::ucontext;
use super::cq::cq_err;
use super::*;

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
