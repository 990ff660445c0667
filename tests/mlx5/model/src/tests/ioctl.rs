//! The core's ioctl methods the model has: GET_CONTEXT, QUERY_PORT, async event fds, CQ, QP
//! and the plain destroys.

use super::context::ucontext;
use super::mmap::RW_SHARED;
use super::*;

/// Where the tests put an ioctl's attribute array, and the buffers its pointers name.
const IOCTL: u64 = CMD;
pub(super) const IN_BUF: u64 = CMD + 0x800;

pub(super) fn inline(id: u16, len: u16, value: u64) -> abi::IoctlAttr {
    abi::IoctlAttr {
        attr_id: id,
        len,
        flags: abi::ATTR_F_MANDATORY,
        attr_data: 0,
        data: value,
    }
}

/// An output of `len` bytes at `RESP + at`.
pub(super) fn out(id: u16, at: u64, len: u16) -> abi::IoctlAttr {
    inline(id, len, RESP + at)
}

/// A handle or fd attribute.
pub(super) fn obj(id: u16, value: u64) -> abi::IoctlAttr {
    inline(id, 0, value)
}

/// An ioctl whose header (with `driver_id`) is at `at`, its attributes after it.
pub(super) fn raw_ioctl(
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

const UHW_IN: u16 = 0x1000;
pub(super) const UHW_OUT: u16 = 0x1001;

impl Env {
    /// Runs `object`/`method` with `attrs`; returns the attribute array as the call left it.
    pub(super) fn ioctl(
        &self,
        object: u16,
        method: u16,
        attrs: &[abi::IoctlAttr],
    ) -> Result<Vec<abi::IoctlAttr>, Errno> {
        let num = attrs.len() as u16;
        raw_ioctl(self, IOCTL, object, method, abi::RDMA_DRIVER_MLX5, attrs, num)?;
        let mut bytes = vec![0u8; 16 * attrs.len()];
        self.mem.read(IOCTL + 24, &mut bytes).unwrap();
        Ok(bytes
            .chunks_exact(16)
            .map(|c| abi::IoctlAttr::read_from_bytes(c).unwrap())
            .collect())
    }

    pub(super) fn at<T: FromBytes>(&self, offset: u64) -> T {
        let mut b = vec![0u8; std::mem::size_of::<T>()];
        self.mem.read(RESP + offset, &mut b).unwrap();
        T::read_from_bytes(&b).unwrap()
    }

    /// Driver data placed at `IN_BUF` as a UHW_IN attribute.
    pub(super) fn uhw_in(&self, bytes: &[u8]) -> abi::IoctlAttr {
        self.mem.write(IN_BUF, bytes).unwrap();
        inline(UHW_IN, bytes.len() as u16, IN_BUF)
    }

    /// GET_CONTEXT through the ioctl, legacy UARs as the Rust provider asks.
    pub(super) fn ioctl_context() -> Self {
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

    pub(super) fn cq_attrs(&self, cqe: u32) -> Vec<abi::IoctlAttr> {
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

    pub(super) fn qp_attrs(&self, pd: u32, cq: u32, uidx: u32) -> Vec<abi::IoctlAttr> {
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
    gid[8..].copy_from_slice(&0x0002_c903_0001_0007u64.to_be_bytes());
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
