//! The ioctl's check order and errnos as Linux 6.1 (core/uverbs_ioctl.c,
//! core/uverbs_std_types_*.c, core/rdma_core.c; docs/kernel-facts.md).

use super::ioctl::{inline, obj, out, raw_ioctl, IN_BUF};
use super::*;

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
