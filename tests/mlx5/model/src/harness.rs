//! The unit tests' and the fuzz target's model in a box: an [`Env`] with a [`Model`], an
//! [`Arena`] that counts stray accesses and a test host for event fds, and a [`Pair`] of
//! connected RC QPs to post WQEs on. Built for the tests and with the `harness` feature.
#![allow(clippy::unwrap_used)] // a test harness: setup failures are bugs in the harness

use crate::abi::{self, cmd, qp_attr, qps};
use crate::device::Device;
use crate::kernel::{Errno, Host, Model};
use crate::mem::{Arena, Memory};
use crate::objects::EventSink;
pub(crate) use crate::port::LinkLayer;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use zerocopy::{FromBytes, IntoBytes};

pub(crate) const CTX: i32 = 3;
pub(crate) const CMD: u64 = 0x1_0000;
pub(crate) const RESP: u64 = 0x2_0000;
pub(crate) const DB: u64 = 0x3_0000;
pub(crate) const CQ_BUF: u64 = 0x4_0000;
pub(crate) const QP_BUF: u64 = 0x10_0000;
pub(crate) const DATA: u64 = 0x20_0000;

#[derive(Default)]
pub(crate) struct Sink(pub(crate) Mutex<Vec<Vec<u8>>>);
impl EventSink for Sink {
    fn push(&self, record: &[u8]) {
        self.0.lock().unwrap().push(record.to_vec());
    }
}

#[derive(Default)]
pub(crate) struct TestHost {
    pub(crate) sinks: Mutex<Vec<Arc<Sink>>>,
    /// RLIMIT_MEMLOCK in pages; `None`: no limit (as for root).
    pub(crate) memlock_pages: Mutex<Option<u64>>,
    /// The one stand-in dma-buf: `(fd, address in the arena, size)`.
    pub(crate) dmabuf: Mutex<Option<(i32, u64, u64)>>,
}

/// How many dma-buf mappings the test host has had unmapped.
pub(crate) static DMABUF_UNMAPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn count_unmap(_addr: u64, _len: u64) {
    DMABUF_UNMAPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}
impl Host for TestHost {
    fn event_fd(&self) -> Result<(i32, Arc<dyn EventSink>), Errno> {
        let sink = Arc::new(Sink::default());
        let mut s = self.sinks.lock().unwrap();
        s.push(sink.clone());
        Ok((100 + s.len() as i32, sink))
    }
    fn close_fd(&self, _fd: i32) {}
    fn memlock_pages(&self) -> Option<u64> {
        *self.memlock_pages.lock().unwrap()
    }
    fn map_dmabuf(&self, fd: i32) -> Result<crate::objects::DmabufMap, Errno> {
        match *self.dmabuf.lock().unwrap() {
            Some((f, addr, len)) if f == fd => Ok(crate::objects::DmabufMap {
                addr,
                len,
                unmap: count_unmap,
            }),
            _ => Err(libc::EBADF),
        }
    }
}

pub(crate) struct Env {
    pub(crate) model: Mutex<Model>,
    pub(crate) mem: Arena,
    pub(crate) host: TestHost,
    /// The source GID index [`Env::connect`] uses on Ethernet (the destination is this
    /// port's GID at the same index).
    pub(crate) sgid_index: u8,
    /// The destination GID [`Env::connect`] uses on Ethernet instead of the port's own.
    pub(crate) dgid: Option<[u8; 16]>,
}

impl Env {
    #[cfg_attr(not(test), allow(dead_code))] // the unit tests' own
    pub(crate) fn bare() -> Self {
        Self::bare_on(LinkLayer::InfiniBand)
    }

    pub(crate) fn bare_on(link: LinkLayer) -> Self {
        let mem = Arena::default();
        for (addr, len) in [
            (CMD, 4096),
            (RESP, 4096),
            (DB, 4096),
            (CQ_BUF, 0x8000),
            (QP_BUF, 0x10000),
            (DATA, 0x10000),
        ] {
            mem.add(addr, len);
        }
        let mut model = Model::with_link(7, link);
        model.open(CTX);
        Self {
            model: Mutex::new(model),
            mem,
            host: TestHost::default(),
            sgid_index: 3,
            dgid: None,
        }
    }

    #[cfg_attr(not(test), allow(dead_code))] // the unit tests' own
    /// A context with legacy UARs (`dyn_uar == false`) or dynamic ones.
    pub(crate) fn new(dyn_uar: bool) -> Self {
        Self::new_on(dyn_uar, LinkLayer::InfiniBand)
    }

    /// A context on a port with `link`.
    pub(crate) fn new_on(dyn_uar: bool, link: LinkLayer) -> Self {
        let env = Self::bare_on(link);
        let req = abi::AllocUcontextReq {
            total_num_bfregs: 16,
            num_low_latency_bfregs: 4,
            max_cqe_version: 1,
            lib_caps: if dyn_uar { 3 } else { 1 },
            ..Default::default()
        };
        env.get_context(req.as_bytes()).unwrap();
        env
    }

    pub(crate) fn write(&self, command: u32, req: &[u8], udata: &[u8], out_words: u16) -> Result<(), Errno> {
        let len = 8 + req.len() + udata.len();
        let hdr = abi::CmdHdr {
            command,
            in_words: (len / 4) as u16,
            out_words,
        };
        let mut bytes = hdr.as_bytes().to_vec();
        bytes.extend_from_slice(req);
        bytes.extend_from_slice(udata);
        self.mem.write(CMD, &bytes).unwrap();
        self.model
            .lock()
            .unwrap()
            .write(CTX, CMD, bytes.len(), &self.mem, &self.host)
    }

    pub(crate) fn resp<T: FromBytes>(&self) -> T {
        let mut b = vec![0u8; std::mem::size_of::<T>()];
        self.mem.read(RESP, &mut b).unwrap();
        T::read_from_bytes(&b).unwrap()
    }

    pub(crate) fn get_context(&self, udata: &[u8]) -> Result<(), Errno> {
        self.write(cmd::GET_CONTEXT, &RESP.to_ne_bytes(), udata, 20)
    }

    pub(crate) fn alloc_pd(&self) -> u32 {
        self.write(cmd::ALLOC_PD, &RESP.to_ne_bytes(), &[], 2).unwrap();
        u32::from_ne_bytes(self.resp::<[u8; 4]>())
    }

    pub(crate) fn reg_mr(&self, pd: u32, addr: u64, len: u64, access: u32) -> Result<(u32, u32), Errno> {
        let req = abi::RegMr {
            response: RESP,
            start: addr,
            length: len,
            hca_va: addr,
            pd_handle: pd,
            access_flags: access,
        };
        self.write(cmd::REG_MR, req.as_bytes(), &[], 3)?;
        let r: abi::RegMrResp = self.resp();
        Ok((r.mr_handle, r.lkey))
    }

    pub(crate) fn cq_cmd(cqe: u32, channel: i32) -> abi::CreateCq {
        abi::CreateCq {
            response: RESP,
            user_handle: 0xc0,
            cqe,
            comp_vector: 0,
            comp_channel: channel,
            reserved: 0,
        }
    }

    pub(crate) fn mlx5_cq(buf: u64, db: u64) -> abi::Mlx5CreateCq {
        abi::Mlx5CreateCq {
            buf_addr: buf,
            db_addr: db,
            cqe_size: 64,
            ..Default::default()
        }
    }

    pub(crate) fn create_cq(&self, cqe: u32, buf: u64, db: u64) -> Result<u32, Errno> {
        self.write(
            cmd::CREATE_CQ,
            Self::cq_cmd(cqe, -1).as_bytes(),
            Self::mlx5_cq(buf, db).as_bytes(),
            4,
        )?;
        Ok(self.resp::<abi::CreateCqResp>().cq_handle)
    }

    pub(crate) fn qp_cmd(pd: u32, cq: u32, qp_type: u8) -> abi::CreateQp {
        abi::CreateQp {
            response: RESP,
            user_handle: 0x9,
            pd_handle: pd,
            send_cq_handle: cq,
            recv_cq_handle: cq,
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            qp_type,
            ..Default::default()
        }
    }

    pub(crate) fn mlx5_qp(buf: u64, db: u64, uidx: u32) -> abi::Mlx5CreateQp {
        abi::Mlx5CreateQp {
            buf_addr: buf,
            db_addr: db,
            sq_wqe_count: 16,
            rq_wqe_count: 8,
            rq_wqe_shift: 4,
            uidx,
            ..Default::default()
        }
    }

    pub(crate) fn create_qp_with(&self, req: abi::CreateQp, ucmd: &[u8]) -> Result<(u32, u32), Errno> {
        self.write(cmd::CREATE_QP, req.as_bytes(), ucmd, 18)?;
        let r: abi::CreateQpResp = self.resp();
        Ok((r.qp_handle, r.qpn))
    }

    pub(crate) fn modify(&self, qp: u32, f: impl FnOnce(&mut abi::ModifyQp)) -> Result<(), Errno> {
        let mut m = abi::ModifyQp {
            qp_handle: qp,
            ..Default::default()
        };
        f(&mut m);
        self.write(cmd::MODIFY_QP, m.as_bytes(), &[], 0)
    }

    /// RESET -> INIT -> RTR -> RTS, connected to `dest_qpn` on this model's LID.
    pub(crate) fn connect(&self, qp: u32, dest_qpn: u32, rnr_retry: u8) {
        self.connect_psn(qp, dest_qpn, rnr_retry, (0, 0));
    }

    /// [`Env::connect`] with the send and receive PSNs `(sq_psn, rq_psn)`.
    pub(crate) fn connect_psn(&self, qp: u32, dest_qpn: u32, rnr_retry: u8, (sq_psn, rq_psn): (u32, u32)) {
        let all = abi::access::REMOTE_WRITE | abi::access::REMOTE_READ | abi::access::REMOTE_ATOMIC;
        self.modify(qp, |m| {
            m.attr_mask = qp_attr::STATE | qp_attr::PKEY_INDEX | qp_attr::PORT | qp_attr::ACCESS_FLAGS;
            m.qp_state = qps::INIT;
            m.port_num = 1;
            m.qp_access_flags = all;
        })
        .unwrap();
        self.modify(qp, |m| {
            m.attr_mask = qp_attr::STATE
                | qp_attr::AV
                | qp_attr::PATH_MTU
                | qp_attr::DEST_QPN
                | qp_attr::RQ_PSN
                | qp_attr::MAX_DEST_RD_ATOMIC
                | qp_attr::MIN_RNR_TIMER;
            m.qp_state = qps::RTR;
            m.dest.dlid = 7;
            m.dest.port_num = 1;
            let port = &self.model.lock().unwrap().port;
            if port.is_eth() {
                m.dest.dlid = 0;
                m.dest.is_global = 1;
                m.dest.sgid_index = self.sgid_index;
                m.dest.hop_limit = 1;
                m.dest.dgid = self.dgid.unwrap_or(port.gids[usize::from(self.sgid_index)].gid);
            }
            m.path_mtu = 5;
            m.dest_qp_num = dest_qpn;
            m.rq_psn = rq_psn;
            m.max_dest_rd_atomic = 1;
            m.min_rnr_timer = 1;
        })
        .unwrap();
        self.modify(qp, |m| {
            m.attr_mask = qp_attr::STATE
                | qp_attr::SQ_PSN
                | qp_attr::TIMEOUT
                | qp_attr::RETRY_CNT
                | qp_attr::RNR_RETRY
                | qp_attr::MAX_QP_RD_ATOMIC;
            m.qp_state = qps::RTS;
            m.timeout = 1;
            m.retry_cnt = 1;
            m.rnr_retry = rnr_retry;
            m.sq_psn = sq_psn;
            m.max_rd_atomic = 1;
        })
        .unwrap();
    }

    /// Runs the device until it has nothing left to do (bounded).
    pub(crate) fn drive(&self) {
        for _ in 0..10_000 {
            let mut active = false;
            let work = {
                let mut m = self.model.lock().unwrap();
                Device::poll_arms(&mut m, &self.mem);
                Device::next_work(&mut m, &self.mem, Instant::now(), &mut active)
            };
            let Some(work) = work else {
                if active {
                    continue;
                }
                return;
            };
            let answer = Device::respond(&mut self.model.lock().unwrap(), &work.request, &self.mem);
            Device::complete(
                &mut self.model.lock().unwrap(),
                work,
                Some(answer),
                &self.mem,
                Instant::now(),
            );
        }
    }
}

/// Two connected RC QPs on one model, an MR over DATA with every access, and one CQ.
pub(crate) struct Pair {
    pub(crate) env: Env,
    pub(crate) key: u32,
    pub(crate) qpn: [u32; 2],
    pub(crate) posted: [u16; 2],
    #[cfg_attr(not(test), allow(dead_code))] // the unit tests' own
    pub(crate) recvs: [u16; 2],
}

pub(crate) const QP_DB: [u64; 2] = [DB + 64, DB + 128];
pub(crate) const QP_BUFS: [u64; 2] = [QP_BUF, QP_BUF + 0x4000];
pub(crate) const CQ_DB: u64 = DB;

impl Pair {
    pub(crate) fn new(rnr_retry: u8) -> Self {
        Self::new_on(LinkLayer::InfiniBand, 3, rnr_retry)
    }

    /// Two connected RC QPs on a port with `link`; on Ethernet, through GID `sgid_index`.
    pub(crate) fn new_on(link: LinkLayer, sgid_index: u8, rnr_retry: u8) -> Self {
        let (mut env, key, handles, qpn) = Self::qps_on(abi::qpt::RC, link);
        env.sgid_index = sgid_index;
        env.connect(handles[0], qpn[1], rnr_retry);
        env.connect(handles[1], qpn[0], rnr_retry);
        Self::with(env, key, qpn)
    }

    #[cfg_attr(not(test), allow(dead_code))] // the unit tests' own
    /// Two UD QPs in RTS, each with Q_Key `qkey`.
    pub(crate) fn ud(qkey: u32) -> Self {
        Self::ud_on(LinkLayer::InfiniBand, qkey)
    }

    #[cfg_attr(not(test), allow(dead_code))] // the unit tests' own
    /// Two UD QPs in RTS on a port with `link`, each with Q_Key `qkey`.
    pub(crate) fn ud_on(link: LinkLayer, qkey: u32) -> Self {
        let (env, key, handles, qpn) = Self::qps_on(abi::qpt::UD, link);
        for qp in handles {
            env.modify(qp, |m| {
                m.attr_mask = qp_attr::STATE | qp_attr::PKEY_INDEX | qp_attr::PORT | qp_attr::QKEY;
                (m.qp_state, m.port_num, m.qkey) = (qps::INIT, 1, qkey);
            })
            .unwrap();
            env.modify(qp, |m| (m.attr_mask, m.qp_state) = (qp_attr::STATE, qps::RTR))
                .unwrap();
            env.modify(qp, |m| {
                (m.attr_mask, m.qp_state) = (qp_attr::STATE | qp_attr::SQ_PSN, qps::RTS)
            })
            .unwrap();
        }
        Self::with(env, key, qpn)
    }

    /// An MR over DATA, one CQ and two QPs of `qp_type` in RESET: `(env, key, handles, qpns)`.
    pub(crate) fn qps_on(qp_type: u8, link: LinkLayer) -> (Env, u32, [u32; 2], [u32; 2]) {
        let env = Env::new_on(false, link);
        let pd = env.alloc_pd();
        let (_, key) = env.reg_mr(pd, DATA, 0x8000, 0xf).unwrap();
        let cq = env.create_cq(15, CQ_BUF, CQ_DB).unwrap();
        let mut qpn = [0; 2];
        let mut handles = [0; 2];
        for i in 0..2 {
            let (h, n) = env
                .create_qp_with(
                    Env::qp_cmd(pd, cq, qp_type),
                    Env::mlx5_qp(QP_BUFS[i], QP_DB[i], 1 + i as u32).as_bytes(),
                )
                .unwrap();
            (handles[i], qpn[i]) = (h, n);
        }
        (env, key, handles, qpn)
    }

    pub(crate) fn with(env: Env, key: u32, qpn: [u32; 2]) -> Self {
        Self {
            env,
            key,
            qpn,
            posted: [0; 2],
            recvs: [0; 2],
        }
    }

    #[cfg_attr(not(test), allow(dead_code))] // the unit tests' own
    /// Posts one send WQE (its control segment, then `segs`, in 64-byte blocks) on QP `i`
    /// and rings the doorbell record.
    pub(crate) fn post(&mut self, i: usize, opcode: u8, segs: &[u8], signaled: bool) {
        let idx = self.posted[i];
        let ds = 1 + segs.len().div_ceil(16);
        let mut wqe = vec![0u8; ds.div_ceil(4) * 64];
        wqe[0..4].copy_from_slice(&((u32::from(idx) << 8) | u32::from(opcode)).to_be_bytes());
        wqe[4..8].copy_from_slice(&((self.qpn[i] << 8) | ds as u32).to_be_bytes());
        wqe[11] = if signaled { abi::WQE_CTRL_CQ_UPDATE } else { 0 };
        wqe[16..16 + segs.len()].copy_from_slice(segs);
        let sq = QP_BUFS[i] + 8 * 16;
        for (k, bb) in wqe.chunks(64).enumerate() {
            let at = (idx + k as u16) % 16;
            self.env.mem.write(sq + u64::from(at) * 64, bb).unwrap();
        }
        self.posted[i] += (wqe.len() / 64) as u16;
        self.env
            .mem
            .write(QP_DB[i] + abi::SND_DBR, &u32::from(self.posted[i]).to_be_bytes())
            .unwrap();
    }

    #[cfg_attr(not(test), allow(dead_code))] // the unit tests' own
    /// Posts a receive of `len` bytes at `addr` on QP `i`.
    pub(crate) fn recv(&mut self, i: usize, addr: u64, len: u32) {
        let idx = self.recvs[i];
        let seg = data_seg(len, self.key, addr);
        self.env.mem.write(QP_BUFS[i] + u64::from(idx % 8) * 16, &seg).unwrap();
        self.recvs[i] += 1;
        self.env
            .mem
            .write(QP_DB[i] + abi::RCV_DBR, &u32::from(self.recvs[i]).to_be_bytes())
            .unwrap();
    }

    #[cfg_attr(not(test), allow(dead_code))] // the unit tests' own
    /// The CQEs written so far: (opcode, syndrome, byte_cnt).
    pub(crate) fn cqes(&self) -> Vec<(u8, u8, u32)> {
        self.raw_cqes()
            .iter()
            .map(|c| (c[63] >> 4, c[55], u32::from_be_bytes(c[44..48].try_into().unwrap())))
            .collect()
    }

    #[cfg_attr(not(test), allow(dead_code))] // the unit tests' own
    /// The CQEs written so far, whole.
    pub(crate) fn raw_cqes(&self) -> Vec<[u8; 64]> {
        let mut out = Vec::new();
        for slot in 0..16u64 {
            let mut c = [0u8; 64];
            self.env.mem.read(CQ_BUF + slot * 64, &mut c).unwrap();
            if c[63] >> 4 != 0 || c[56..60] != [0; 4] {
                out.push(c);
            }
        }
        out
    }
}

#[cfg_attr(not(test), allow(dead_code))] // the unit tests' own
pub(crate) fn data_seg(len: u32, key: u32, addr: u64) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[0..4].copy_from_slice(&len.to_be_bytes());
    s[4..8].copy_from_slice(&key.to_be_bytes());
    s[8..16].copy_from_slice(&addr.to_be_bytes());
    s
}

#[cfg_attr(not(test), allow(dead_code))] // the unit tests' own
pub(crate) fn raddr_seg(addr: u64, rkey: u32) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[0..8].copy_from_slice(&addr.to_be_bytes());
    s[8..12].copy_from_slice(&rkey.to_be_bytes());
    s
}

/// One round of hostile WQEs and doorbell values on a fresh [`Pair`], drawn from `next`:
/// returns how many accesses fell outside the buffers the client registered (must be 0).
pub fn hostile_round(next: &mut dyn FnMut() -> u64) -> usize {
    let mut p = Pair::new((next() % 8) as u8);
    for _ in 0..8 {
        let mut junk = [0u8; 64];
        for b in junk.chunks_mut(8) {
            b.copy_from_slice(&next().to_ne_bytes());
        }
        // Sometimes a plausible control segment, sometimes pure noise.
        if next() % 2 == 0 {
            let idx = p.posted[0];
            junk[0..4].copy_from_slice(&((u32::from(idx) << 8) | (next() % 0x14) as u32).to_be_bytes());
            junk[4..8].copy_from_slice(&((p.qpn[0] << 8) | (next() % 8) as u32).to_be_bytes());
            if next() % 2 == 0 {
                junk[20..24].copy_from_slice(&p.key.to_be_bytes());
            }
        }
        let idx = u64::from(p.posted[0] % 16);
        p.env.mem.write(QP_BUFS[0] + 8 * 16 + idx * 64, &junk).unwrap();
        p.posted[0] = p.posted[0].wrapping_add(1);
        let db = if next() % 8 == 0 {
            next() as u32
        } else {
            u32::from(p.posted[0])
        };
        p.env.mem.write(QP_DB[0] + abi::SND_DBR, &db.to_be_bytes()).unwrap();
        if next() % 4 == 0 {
            let rq = next() as u32;
            p.env.mem.write(QP_DB[1] + abi::RCV_DBR, &rq.to_be_bytes()).unwrap();
        }
        if next() % 4 == 0 {
            p.env
                .mem
                .write(QP_BUFS[1] + (next() % 8) * 16, &next().to_ne_bytes())
                .unwrap();
        }
        if next() % 8 == 0 {
            p.env
                .mem
                .write(CQ_DB + abi::CQ_ARM_DB, &(next() as u32).to_ne_bytes())
                .unwrap();
        }
        p.env.drive();
    }
    p.env.mem.stray()
}
