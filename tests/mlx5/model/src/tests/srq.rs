//! Shared receive queues in the kernel (hw/mlx5/srq.c): CREATE/MODIFY/QUERY/DESTROY_SRQ,
//! written and through the ioctl.

use super::ioctl::{inline, obj, out, UHW_OUT};
use super::*;

pub(super) const SRQ_BUF: u64 = QP_BUF + 0x8000;
pub(super) const SRQ_DB: u64 = DB + 0x400;

pub(super) fn srq_cmd(pd: u32, max_wr: u32, max_sge: u32) -> abi::CreateSrq {
    abi::CreateSrq {
        response: RESP,
        user_handle: 0x5,
        pd_handle: pd,
        max_wr,
        max_sge,
        srq_limit: 0,
    }
}

pub(super) fn mlx5_srq() -> abi::Mlx5CreateSrq {
    abi::Mlx5CreateSrq {
        buf_addr: SRQ_BUF,
        db_addr: SRQ_DB,
        ..Default::default()
    }
}

impl Env {
    /// CREATE_SRQ with a 16-byte core and 8-byte driver response; the handle.
    pub(super) fn create_srq(&self, core: abi::CreateSrq, drv: &[u8]) -> Result<u32, Errno> {
        self.write(cmd::CREATE_SRQ, core.as_bytes(), drv, 6)?;
        Ok(self.resp::<abi::CreateSrqResp>().srq_handle)
    }

    pub(super) fn modify_srq(&self, srq: u32, mask: u32, limit: u32) -> Result<(), Errno> {
        let m = abi::ModifySrq {
            srq_handle: srq,
            attr_mask: mask,
            max_wr: 0,
            srq_limit: limit,
        };
        self.write(cmd::MODIFY_SRQ, m.as_bytes(), &[], 0)
    }

    pub(super) fn query_srq(&self, srq: u32) -> Result<abi::QuerySrqResp, Errno> {
        let q = abi::DestroyObj {
            response: RESP,
            handle: srq,
            reserved: 0,
        };
        self.write(cmd::QUERY_SRQ, q.as_bytes(), &[], 4)?;
        Ok(self.resp())
    }

    pub(super) fn destroy_srq(&self, srq: u32) -> Result<u32, Errno> {
        let d = abi::DestroyObj {
            response: RESP,
            handle: srq,
            reserved: 0,
        };
        self.write(cmd::DESTROY_SRQ, d.as_bytes(), &[], 1)?;
        Ok(self.resp())
    }

    /// A QP on SRQ `srq` (no receive queue) with its buffer at `buf`, doorbell at `db`.
    pub(super) fn create_srq_qp(
        &self,
        pd: u32,
        cq: u32,
        srq: u32,
        buf: u64,
        db: u64,
        uidx: u32,
    ) -> Result<(u32, u32), Errno> {
        let mut core = Env::qp_cmd(pd, cq, abi::qpt::RC);
        (core.is_srq, core.srq_handle) = (1, srq);
        let mut u = Env::mlx5_qp(buf, db, uidx);
        (u.rq_wqe_count, u.rq_wqe_shift) = (0, 0);
        self.create_qp_with(core, u.as_bytes())
    }

    /// The async events raised so far: (element, type).
    pub(super) fn async_events(&self) -> Vec<(u64, u32)> {
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
