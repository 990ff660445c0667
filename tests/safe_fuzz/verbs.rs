//! The verbs steps of a [`Round`]: objects (regions cut into `Buf`s, CQs, SRQs, QP pairs and
//! their state changes), posts of every kind (`SendOp::Raw` refused), reaps and reclaims with
//! the payload checks, resizes, destroys and drops while busy, and `fork()` with the child's
//! checks that inherited objects refuse work.

use super::bookkeeping::{variant, Key};
use super::process;
use super::round::{access_all, dest, read_pattern, state_attr, Handle, Kind, QpSlot, Round, Sent, SrqSlot};
use super::{
    ATOMIC_AREA, MAX_BUFS_PER_MR, MAX_CM_CQS, MAX_CQS, MAX_MRS, MAX_MSG, MAX_QPS, MAX_SRQS, QKEY, READ_AREA, SRQ_QUEUE,
    UD_GRH, WRITE_AREA,
};
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use uverbs::*;

impl Round<'_> {
    // ---- objects ----

    pub(crate) fn alloc_mr(&mut self) {
        if Self::live_regions(&self.regions) >= MAX_MRS {
            return;
        }
        let len = self.size(4 << 20);
        let cut = match self.rng.below(20) {
            0 => 0, // refused: a size of 0
            _ => {
                let min = len.div_ceil(MAX_BUFS_PER_MR);
                let c = self.size(len);
                c.max(min)
            }
        };
        self.call("alloc_mr");
        // On the RDMA CM's device too, once there is one: its connections post those.
        let cm = self.cm.is_some() && self.rng.chance(40);
        let pd = match cm {
            true => &self.cm.as_ref().expect("the CM side").pd,
            false => &self.base().pd,
        };
        let mr = match pd.alloc_mr(len, LocalAccess::LOCAL_WRITE) {
            Ok(mr) => mr,
            Err(e) => {
                let k = self.error(&e);
                step!(self, "alloc_mr({len}) -> {k}");
                return;
            }
        };
        let lkey = mr.lkey();
        if self.regions.contains_key(&lkey) {
            // Two devices number their regions apart: a key another region of the round had
            // would make the buffers' names ambiguous.
            step!(
                self,
                "alloc_mr({len}, cm {cm}): lkey {lkey:#x} taken by an earlier region, dropped"
            );
            return;
        }
        self.call("into_bufs");
        match mr.into_bufs(cut) {
            Ok(bufs) => {
                self.mrs += 1;
                self.regions.insert(lkey, self.mrs);
                step!(
                    self,
                    "alloc_mr({len}, cm {cm}).into_bufs({cut}) -> {} bufs, region {}",
                    bufs.len(),
                    self.mrs
                );
                for b in bufs {
                    let key = self.key(&b);
                    self.bufs.add(key);
                    self.stats.bufs += 1;
                    self.pool.push(b);
                }
            }
            Err(e) => {
                assert_eq!(cut, 0, "into_bufs({cut}) of {len} bytes: {e}");
                let k = self.error(&e);
                step!(self, "alloc_mr({len}).into_bufs(0) -> {k}");
            }
        }
    }

    /// Regions are counted by their lkeys while any of their buffers may live (a rough bound).
    pub(crate) fn live_regions(regions: &HashMap<u32, u32>) -> usize {
        regions.len()
    }

    pub(crate) fn create_cq(&mut self) -> Option<usize> {
        self.create_cq_on(false)
    }

    /// A CQ on the round's device, or (`cm`) on the RDMA CM's: a new one, or one of those
    /// there are once they are many.
    pub(crate) fn create_cq_on(&mut self, cm: bool) -> Option<usize> {
        let on: Vec<usize> = Self::live(&self.cqs)
            .into_iter()
            .filter(|c| self.cm_cqs.contains(c) == cm)
            .collect();
        if on.len() >= if cm { MAX_CM_CQS } else { MAX_CQS } {
            return Some(on[self.rng.below(on.len() as u64) as usize]);
        }
        let depth = match self.rng.below(4) {
            0 => 1 + self.rng.below(4) as u32, // overruns soon
            _ => self.size(512) as u32,
        };
        self.call("create_cq");
        let ctx = match cm {
            true => &self.cm.as_ref().expect("the CM side is set up").ctx,
            false => &self.base().ctx,
        };
        match ctx.create_cq(depth) {
            Ok(cq) => {
                self.cqs.push(Some(cq));
                if cm {
                    self.cm_cqs.insert(self.cqs.len() - 1);
                }
                step!(self, "create_cq({depth}, cm {cm}) -> cq{}", self.cqs.len() - 1);
                Some(self.cqs.len() - 1)
            }
            Err(e) => {
                let k = self.error(&e);
                step!(self, "create_cq({depth}) -> {k}");
                None
            }
        }
    }

    pub(crate) fn create_srq(&mut self) -> Option<usize> {
        if Self::live(&self.srqs).len() >= MAX_SRQS {
            return Self::pick(&mut self.rng, &self.srqs);
        }
        let max_wr = self.size(64) as u32;
        self.call("create_srq");
        match self.base().pd.create_srq(&SrqInit::new(max_wr, 1)) {
            Ok(srq) => {
                self.srqs.push(Some(SrqSlot { srq, members: 0 }));
                step!(self, "create_srq({max_wr}) -> srq{}", self.srqs.len() - 1);
                Some(self.srqs.len() - 1)
            }
            Err(e) => {
                let k = self.error(&e);
                step!(self, "create_srq({max_wr}) -> {k}");
                None
            }
        }
    }

    pub(crate) fn create_qp(&mut self, kind: Kind, srq: Option<usize>) -> Option<usize> {
        self.create_qp_on(kind, srq, false)
    }

    /// A QP on the round's PD, or (`cm`) on the RDMA CM device's, with CQs there.
    pub(crate) fn create_qp_on(&mut self, kind: Kind, srq: Option<usize>, cm: bool) -> Option<usize> {
        let send_cq = self.create_cq_on(cm)?;
        let recv_cq = if self.rng.chance(50) {
            send_cq
        } else {
            self.create_cq_on(cm)?
        };
        let cap = QpCap {
            max_send_wr: self.size(64) as u32,
            max_recv_wr: self.size(64) as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: if self.rng.chance(50) { 0 } else { self.size(256) as u32 },
        };
        let sq_sig_all = self.rng.chance(10);
        let qp_type = match kind {
            Kind::Rc | Kind::RcSrq => QpType::Rc,
            Kind::Uc => QpType::Uc,
            Kind::Ud => QpType::Ud,
        };
        self.call("create_qp");
        let made = {
            let (scq, rcq) = (
                self.cqs[send_cq].as_ref().expect("live"),
                self.cqs[recv_cq].as_ref().expect("live"),
            );
            let mut init = QpInit::new(qp_type, scq, rcq);
            init.cap = cap;
            init.sq_sig_all = sq_sig_all;
            init.srq = srq.map(|s| &self.srqs[s].as_ref().expect("live").srq);
            match cm {
                true => self.cm.as_ref().expect("the CM side").pd.create_qp(&init),
                false => self.base().pd.create_qp(&init),
            }
        };
        match made {
            Ok(qp) => {
                if let Some(s) = srq {
                    self.srqs[s].as_mut().expect("live").members += 1;
                }
                self.qps.push(Some(QpSlot {
                    qp: Handle::Plain(qp),
                    cm,
                    kind,
                    peer: 0,
                    srq,
                    sends: VecDeque::new(),
                    recvs: VecDeque::new(),
                    link_up: false,
                }));
                let i = self.qps.len() - 1;
                step!(
                    self,
                    "create_qp({kind:?}, cq{send_cq}/cq{recv_cq}, srq {srq:?}, {cap:?}, sig_all {sq_sig_all}) -> qp{i} (qpn {})",
                    self.qps[i].as_ref().expect("live").qp.qpn()
                );
                Some(i)
            }
            Err(e) => {
                let k = self.error(&e);
                step!(self, "create_qp({kind:?}, {cap:?}) -> {k}");
                None
            }
        }
    }

    /// Two QPs of one kind connected to each other, or one connected to itself.
    pub(crate) fn create_pair(&mut self) {
        if Self::live(&self.qps).len() + 2 > MAX_QPS {
            return;
        }
        let kind = [Kind::Rc, Kind::Uc, Kind::Ud, Kind::RcSrq][self.rng.below(4) as usize];
        let srq = match kind {
            Kind::RcSrq => match self.create_srq() {
                Some(s) => Some(s),
                None => return,
            },
            _ => None,
        };
        let Some(a) = self.create_qp(kind, srq) else { return };
        let alone = self.rng.chance(15);
        let b = if alone {
            a
        } else {
            // On an SRQ, the other end takes its receives from the SRQ too, or has its own.
            let (kind_b, srq_b) = if kind == Kind::RcSrq && self.rng.chance(50) {
                (Kind::Rc, None)
            } else {
                (kind, srq)
            };
            let Some(b) = self.create_qp(kind_b, srq_b) else { return };
            b
        };
        let (qa, qb) = (self.qpn(a), self.qpn(b));
        self.qps[a].as_mut().expect("live").peer = qb;
        self.qps[b].as_mut().expect("live").peer = qa;
        for i in [a, b].into_iter().take(if alone { 1 } else { 2 }) {
            if !self.rng.chance(90) {
                continue; // left in RESET
            }
            let (ok, what) = self.connect(i);
            assert!(ok.is_ok(), "connecting qp{i} ({what}): {ok:?}");
        }
    }

    pub(crate) fn qpn(&self, i: usize) -> u32 {
        self.qps[i].as_ref().expect("live").qp.qpn()
    }

    /// RESET to RTS towards the QP's peer.
    pub(crate) fn connect(&mut self, i: usize) -> (Result<()>, &'static str) {
        self.call("connect");
        let path = self.path;
        let s = self.qps[i].as_mut().expect("live");
        let r = match s.kind {
            Kind::Ud => s.qp.ud_to_rts(1, QKEY),
            _ => {
                s.qp.to_init(1, access_all())
                    .and_then(|()| s.qp.to_rtr(path, s.peer, 0, Mtu::Mtu1024))
                    .and_then(|()| s.qp.to_rts(0))
            }
        };
        let what = if r.is_ok() { "ok" } else { "failed" };
        let state = s.qp.state();
        if let Err(e) = &r {
            self.error(e);
        }
        step!(self, "qp{i}: connect -> {r:?}, now {state:?}");
        (r, what)
    }

    /// A state change, valid or not.
    pub(crate) fn change_state(&mut self) {
        let Some(i) = Self::pick(&mut self.rng, &self.qps) else {
            return;
        };
        let path = self.path;
        let what = self.rng.below(9);
        let s = self.qps[i].as_mut().expect("live");
        let before = s.qp.state();
        let held = s.qp.held_bufs();
        let ud = s.kind == Kind::Ud;
        let peer = if self.rng.chance(90) { s.peer } else { 0xff_ffff };
        let (name, target, r): (&'static str, Option<QpState>, Result<()>) = match what {
            0 if ud => (
                "modify(INIT, qkey)",
                Some(QpState::Init),
                s.qp.modify(&QpAttr {
                    state: Some(QpState::Init),
                    pkey_index: Some(0),
                    port_num: Some(1),
                    qkey: Some(QKEY),
                    ..Default::default()
                }),
            ),
            0 => ("to_init", Some(QpState::Init), s.qp.to_init(1, access_all())),
            1 if ud => (
                "modify(RTR)",
                Some(QpState::Rtr),
                s.qp.modify(&state_attr(QpState::Rtr)),
            ),
            1 => ("to_rtr", Some(QpState::Rtr), s.qp.to_rtr(path, peer, 0, Mtu::Mtu1024)),
            2 if ud => (
                "modify(RTS, sq_psn)",
                Some(QpState::Rts),
                s.qp.modify(&QpAttr {
                    state: Some(QpState::Rts),
                    sq_psn: Some(0),
                    ..Default::default()
                }),
            ),
            2 => ("to_rts", Some(QpState::Rts), s.qp.to_rts(0)),
            3 => (
                "modify(ERR)",
                Some(QpState::Err),
                s.qp.modify(&state_attr(QpState::Err)),
            ),
            4 => (
                "modify(RESET)",
                Some(QpState::Reset),
                s.qp.modify(&state_attr(QpState::Reset)),
            ),
            5 => (
                "modify(SQD)",
                Some(QpState::Sqd),
                s.qp.modify(&state_attr(QpState::Sqd)),
            ),
            // Attributes that do not belong to the transition or the QP type.
            6 => (
                "to_rtr(any type)",
                Some(QpState::Rtr),
                s.qp.to_rtr(path, peer, 0, Mtu::Mtu4096),
            ),
            7 => ("to_init(port 9)", Some(QpState::Init), s.qp.to_init(9, access_all())),
            _ => ("query", None, s.qp.query().map(drop)),
        };
        let after = s.qp.state();
        self.call(name);
        let outcome = match &r {
            Ok(()) => "ok".to_string(),
            Err(e) => self.error(e),
        };
        step!(self, "qp{i}: {before:?} {name} -> {outcome}, now {after:?}");
        match (&r, target) {
            (Ok(()), Some(t)) => assert_eq!(after, t, "qp{i}: {name} succeeded"),
            (Err(_), Some(_)) => assert_eq!(after, before, "qp{i}: {name} failed yet the state changed"),
            _ => {}
        }
        // Any state may go to RESET while the safe posts count no request of the QP, and is
        // refused, naming the counts, while they do; any state but RESET may go to ERR
        // (Linux's `ib_modify_qp_is_ok` has no RESET to ERR; the mlx5 model allows it).
        if target == Some(QpState::Reset) && held != (0, 0) {
            assert!(
                matches!(r, Err(Error::RequestsOutstanding { send, recv, .. }) if (send, recv) == held),
                "qp{i}: RESET with {held:?} held: {r:?}"
            );
        } else if before == QpState::Sqd
            && target == Some(QpState::Reset)
            && matches!(r, Err(Error::Kernel { verb: "MODIFY_QP", .. }))
        {
            // rxe lets a QP leave SQD only for ERR while its send queue still drains
            // (`rxe_qp_chk_attr`): a race with the drain (seen on 6.12, docs/kernel-facts.md).
        } else if target == Some(QpState::Reset) || (target == Some(QpState::Err) && before != QpState::Reset) {
            assert!(r.is_ok(), "qp{i}: {before:?} to {target:?} is always valid: {r:?}");
        }
        if r.is_ok() && matches!(after, QpState::Reset | QpState::Err) {
            // A reset drops the queued requests; what a read fetched is no longer known.
            for sent in &mut self.qps[i].as_mut().expect("live").sends {
                if let Sent::Buf { read, .. } = sent {
                    *read = None;
                }
            }
        }
    }

    // ---- posts ----

    /// A random send operation for `qp`, and the offset of the read area it reads, if it
    /// is a valid read. The buffer's length is set to suit.
    pub(crate) fn send_op(&mut self, i: usize, buf: &mut Buf, raw: bool) -> (SendOp, Option<usize>) {
        let (addr, rkey) = self.target_of(i);
        let valid = self.rng.chance(90);
        let rkey = if valid { rkey } else { rkey ^ 0x80 };
        let remote = |off: usize| Remote {
            addr: addr + off as u64,
            rkey,
        };
        let msg_len = self.size(MAX_MSG);
        let pick = if raw { 12 } else { self.rng.below(12) };
        match pick {
            0 | 1 => {
                self.fill(buf, msg_len, false);
                (SendOp::Send, None)
            }
            2 | 3 => {
                let (tag, _) = self.fill(buf, msg_len, true);
                (SendOp::SendWithImm { imm: tag as u32 }, None)
            }
            4 => {
                let (_, len) = self.fill(buf, msg_len.min(READ_AREA), false);
                let off = self.rng.below((READ_AREA - len + 1) as u64) as usize;
                (SendOp::RdmaWrite(remote(WRITE_AREA + off)), None)
            }
            5 => {
                let (tag, len) = self.fill(buf, msg_len.min(READ_AREA), false);
                let off = self.rng.below((READ_AREA - len + 1) as u64) as usize;
                (SendOp::RdmaWriteWithImm(remote(WRITE_AREA + off), tag as u32), None)
            }
            6 | 7 => {
                let len = msg_len.min(ATOMIC_AREA - READ_AREA).min(buf.capacity());
                buf.set_len(len).expect("within the capacity");
                let off = self.rng.below((ATOMIC_AREA - READ_AREA - len + 1) as u64) as usize;
                (SendOp::RdmaRead(remote(READ_AREA + off)), valid.then_some(off))
            }
            8 | 9 => {
                let len = if self.rng.chance(85) { 8 } else { self.size(16) };
                let _ = buf.set_len(len.min(buf.capacity()));
                let word = self.rng.below(8) as usize * 8 + if self.rng.chance(90) { 0 } else { 3 };
                let remote = remote(ATOMIC_AREA + word);
                let op = if pick == 8 {
                    SendOp::FetchAdd {
                        remote,
                        add: self.rng.next_u64(),
                    }
                } else {
                    SendOp::CompareSwap {
                        remote,
                        compare: self.rng.next_u64() & 3,
                        swap: self.rng.next_u64(),
                    }
                };
                (op, None)
            }
            10 => {
                self.fill(buf, msg_len, false);
                (SendOp::SendWithInv { rkey }, None)
            }
            11 => match self.rng.below(2) {
                0 => (SendOp::LocalInv { rkey }, None),
                _ => (
                    SendOp::AtomicWrite {
                        remote: remote(ATOMIC_AREA + 8 * self.rng.below(8) as usize),
                        value: self.rng.next_u64().to_ne_bytes(),
                    },
                    None,
                ),
            },
            _ => {
                self.fill(buf, msg_len, false);
                (self.raw_op(), None)
            }
        }
    }

    pub(crate) fn raw_op(&mut self) -> SendOp {
        let opcode = match self.rng.below(4) {
            0 => 0x20,
            1 => self.rng.below(16) as u32,
            _ => self.rng.next_u64() as u32,
        };
        SendOp::Raw(RawOp {
            opcode,
            imm_data: self.rng.next_u64() as u32,
            remote: Remote {
                addr: self.base().target.addr(),
                rkey: self.base().target.rkey(),
            },
        })
    }

    pub(crate) fn flags(&mut self) -> SendFlags {
        let mut f = if self.rng.chance(75) {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        for (flag, p) in [
            (SendFlags::SOLICITED, 10),
            (SendFlags::FENCE, 10),
            (SendFlags::INLINE, 5),
        ] {
            if self.rng.chance(p) {
                f |= flag;
            }
        }
        f
    }

    pub(crate) fn send_buf(&mut self, i: usize) {
        let Some(mut buf) = self.take_buf() else { return };
        let raw = self.rng.chance(12);
        let (op, read) = self.send_op(i, &mut buf, raw);
        let key = self.key(&buf);
        let plain = self.rng.chance(30);
        let flags = if plain { SendFlags::SIGNALED } else { self.flags() };
        let dest_pick = self.rng.below(100);
        let ud = self.qps[i].as_ref().expect("live").kind == Kind::Ud;
        let held_before = self.qps[i].as_ref().expect("live").qp.held_bufs();
        let name = if plain { "send_buf" } else { "send_buf_with" };
        self.call(name);
        let r = {
            let peer = self.qps[i].as_ref().expect("live").peer;
            let base = self.base.as_ref().expect("base");
            let dest = if ud && !plain {
                dest(base, peer, dest_pick)
            } else {
                None
            };
            let s_qp = &mut self.qps[i].as_mut().expect("live").qp;
            if plain {
                s_qp.send_buf(op, buf)
            } else {
                s_qp.send_buf_with(op, buf, flags, dest)
            }
        };
        let held_after = self.qps[i].as_ref().expect("live").qp.held_bufs();
        let desc = format!("qp{i}: {name}({op:?}, {key:?}, {flags:?}, dest {})", ud && !plain);
        self.after_send(i, key, read, r, raw, held_before, held_after, desc);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn after_send(
        &mut self,
        i: usize,
        key: Key,
        read: Option<usize>,
        r: std::result::Result<(), Refused>,
        raw: bool,
        held_before: (usize, usize),
        held_after: (usize, usize),
        desc: String,
    ) {
        let q = 2 * i as u32;
        match r {
            Ok(()) => {
                step!(self, "{desc} -> ok");
                assert!(!raw, "{desc}: a raw operation was posted by a safe post");
                assert_eq!(held_after.0, held_before.0 + 1, "{desc}: posted, so held");
                self.bufs.post(key, q);
                let s = self.qps[i].as_mut().expect("live");
                s.sends.push_back(Sent::Buf { key, read });
            }
            Err(Refused { error, buf }) => {
                let kind = self.error(&error);
                step!(self, "{desc} -> {kind} (buffer back: {})", buf.is_some());
                match buf {
                    Some(buf) => {
                        assert_eq!(self.key(&buf), key, "{desc}: refused with another buffer");
                        assert_eq!(held_after, held_before, "{desc}: refused, yet the QP counts more");
                        self.pool.push(buf);
                    }
                    None => {
                        assert!(
                            !matches!(error, Error::WorkRequest { .. }),
                            "{desc}: a rejected request kept its buffer"
                        );
                        assert_eq!(held_after.0, held_before.0 + 1, "{desc}: kept, so held");
                        self.bufs.post(key, q);
                        let s = self.qps[i].as_mut().expect("live");
                        s.sends.push_back(Sent::Buf { key, read: None });
                    }
                }
                if raw {
                    self.check_raw_refusal(&error, &desc, i);
                }
            }
        }
    }

    /// A raw operation must be refused: as unsupported once nothing else stands in the way.
    pub(crate) fn check_raw_refusal(&mut self, error: &Error, desc: &str, i: usize) {
        self.stats.raw_refused += 1;
        let Error::WorkRequest { reason, .. } = error else {
            panic!("{desc}: a raw operation refused with {error:?}, not a typed work request refusal");
        };
        let state = self.qps[i].as_ref().expect("live").qp.state();
        let expected = match reason {
            WrReject::OpcodeNotSupported | WrReject::QueueFull | WrReject::ForeignAh => true,
            // The recorded state is what the post checks.
            WrReject::WrongState(_) => state < QpState::Rts,
            _ => false,
        };
        assert!(expected, "{desc}: a raw operation refused with {reason:?} in {state:?}");
    }

    pub(crate) fn send_bufs(&mut self, i: usize) {
        let n = self.rng.below(40) as usize;
        let raw = self.rng.chance(12);
        let mut list = Vec::new();
        // One operation for the whole list, drawn for the first buffer; the others are
        // filled to suit it.
        let mut op = if raw { self.raw_op() } else { SendOp::Send };
        let mut first_read = None;
        for k in 0..n {
            let Some(mut buf) = self.take_buf() else { break };
            if k == 0 {
                (op, first_read) = self.send_op(i, &mut buf, raw);
            } else {
                let len = self.size(MAX_MSG);
                match op {
                    // Writes stay within the write area: the read area must keep its pattern.
                    SendOp::RdmaWrite(r) | SendOp::RdmaWriteWithImm(r, _) => {
                        let end = self.target_of(i).0 + READ_AREA as u64;
                        let room = end.saturating_sub(r.addr) as usize;
                        let imm = match op {
                            SendOp::RdmaWriteWithImm(_, imm) => Some(imm),
                            _ => None,
                        };
                        self.fill_tagged(&mut buf, len.min(room), imm);
                    }
                    SendOp::SendWithImm { imm } => {
                        self.fill_tagged(&mut buf, len, Some(imm));
                    }
                    SendOp::RdmaRead(_) | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {
                        let len = if self.rng.chance(85) { 8 } else { len };
                        let _ = buf.set_len(len.min(buf.capacity()));
                    }
                    _ => {
                        self.fill_tagged(&mut buf, len, None);
                    }
                }
            }
            list.push(buf);
        }
        // Only the first buffer was cut for its read: what the others fetch is not checked.
        let reads: Vec<Option<usize>> = (0..list.len())
            .map(|k| if k == 0 { first_read } else { None })
            .collect();
        let keys: Vec<Key> = list.iter().map(|b| self.key(b)).collect();
        let flags = self.flags();
        let before = self.qps[i].as_ref().expect("live").qp.held_bufs();
        self.call("send_bufs");
        let r = self.qps[i].as_mut().expect("live").qp.send_bufs(op, &mut list, flags);
        let after = self.qps[i].as_ref().expect("live").qp.held_bufs();
        let posted = keys.len() - list.len();
        let desc = format!("qp{i}: send_bufs({op:?}, {} bufs, {flags:?})", keys.len());
        let back: Vec<Key> = list.iter().map(|b| self.key(b)).collect();
        assert_eq!(back, keys[posted..], "{desc}: the buffers not posted, in order");
        assert_eq!(after.0, before.0 + posted, "{desc}: posted {posted}");
        match &r {
            Ok(()) => {
                step!(self, "{desc} -> ok");
                assert!(!raw, "{desc}: a raw operation was posted");
                assert!(list.is_empty(), "{desc}: ok with buffers left");
            }
            Err(e) => {
                let kind = self.error(e);
                step!(self, "{desc} -> {kind}, {posted} posted");
                if let Error::WorkRequest { index, .. } = e {
                    assert_eq!(*index, posted, "{desc}: the refused request's index");
                }
                if raw {
                    assert!(
                        matches!(
                            e,
                            Error::WorkRequest {
                                reason: WrReject::OpcodeNotSupported,
                                ..
                            }
                        ),
                        "{desc}: a raw list refused with {e:?}"
                    );
                    self.stats.raw_refused += 1;
                }
            }
        }
        let q = 2 * i as u32;
        for (k, key) in keys[..posted].iter().enumerate() {
            self.bufs.post(*key, q);
            let s = self.qps[i].as_mut().expect("live");
            s.sends.push_back(Sent::Buf {
                key: *key,
                read: reads[k],
            });
        }
        self.pool.append(&mut list);
    }

    pub(crate) fn send_inline(&mut self, i: usize) {
        let max = self.qps[i].as_ref().expect("live").qp.cap().max_inline_data as usize;
        let len = match self.rng.below(4) {
            0 => 0,
            1 => self.size(max.max(1) + 64), // past the limit, sometimes
            _ => self.size(max.max(1)).min(max),
        };
        let (addr, rkey) = self.target_of(i);
        let remote = Remote {
            addr: addr + WRITE_AREA as u64,
            rkey,
        };
        let raw = self.rng.chance(10);
        let pick = self.rng.below(10);
        let imm = matches!(pick, 2 | 3);
        let (tag, data) = self.message(len, imm);
        let op = if raw {
            self.raw_op()
        } else {
            match pick {
                0 | 1 => SendOp::Send,
                2 => SendOp::SendWithImm { imm: tag as u32 },
                3 => SendOp::RdmaWriteWithImm(remote, tag as u32),
                4 | 5 => SendOp::RdmaWrite(remote),
                // Operations the device writes into: never inline.
                6 => SendOp::RdmaRead(remote),
                7 => SendOp::FetchAdd { remote, add: 1 },
                8 => SendOp::SendWithInv { rkey },
                _ => SendOp::LocalInv { rkey },
            }
        };
        let plain = self.rng.chance(30);
        let flags = self.flags();
        let dest_pick = self.rng.below(100);
        let ud = self.qps[i].as_ref().expect("live").kind == Kind::Ud;
        let before = self.qps[i].as_ref().expect("live").qp.held_bufs();
        let name = if plain { "send_inline" } else { "send_inline_with" };
        self.call(name);
        let r = {
            let peer = self.qps[i].as_ref().expect("live").peer;
            let base = self.base.as_ref().expect("base");
            let dest = if ud && !plain {
                dest(base, peer, dest_pick)
            } else {
                None
            };
            let qp = &mut self.qps[i].as_mut().expect("live").qp;
            if plain {
                qp.send_inline(op, &data)
            } else {
                qp.send_inline_with(op, &data, flags, dest)
            }
        };
        let after = self.qps[i].as_ref().expect("live").qp.held_bufs();
        let desc = format!("qp{i}: {name}({op:?}, {len} bytes, {flags:?})");
        match &r {
            Ok(()) => {
                step!(self, "{desc} -> ok");
                assert!(!raw, "{desc}: a raw operation was posted");
            }
            Err(e) => {
                let kind = self.error(e);
                step!(self, "{desc} -> {kind}");
                if raw {
                    self.check_raw_refusal(e, &desc, i);
                }
            }
        }
        assert!(after.0 <= before.0 + 1, "{desc}: one request counts at most one");
        assert_eq!(after.1, before.1, "{desc}: the receive queue moved");
        if after.0 > before.0 {
            self.qps[i].as_mut().expect("live").sends.push_back(Sent::Inline);
        }
    }

    pub(crate) fn recv_buf(&mut self, i: usize) {
        let Some(buf) = self.take_buf() else { return };
        let key = self.key(&buf);
        let before = self.qps[i].as_ref().expect("live").qp.held_bufs();
        self.call("recv_buf");
        let r = self.qps[i].as_mut().expect("live").qp.recv_buf(buf);
        let after = self.qps[i].as_ref().expect("live").qp.held_bufs();
        let desc = format!("qp{i}: recv_buf({key:?})");
        let q = 2 * i as u32 + 1;
        match r {
            Ok(()) => {
                step!(self, "{desc} -> ok");
                assert_eq!(after.1, before.1 + 1, "{desc}: posted, so held");
                self.bufs.post(key, q);
                self.qps[i].as_mut().expect("live").recvs.push_back(key);
            }
            Err(Refused { error, buf }) => {
                let kind = self.error(&error);
                step!(self, "{desc} -> {kind} (buffer back: {})", buf.is_some());
                match buf {
                    Some(buf) => {
                        assert_eq!(self.key(&buf), key, "{desc}: refused with another buffer");
                        assert_eq!(after, before, "{desc}: refused, yet counted");
                        self.pool.push(buf);
                    }
                    None => {
                        assert!(!matches!(error, Error::WorkRequest { .. }), "{desc}: kept");
                        self.bufs.post(key, q);
                        self.qps[i].as_mut().expect("live").recvs.push_back(key);
                    }
                }
            }
        }
    }

    pub(crate) fn srq_recv_buf(&mut self) {
        let Some(j) = Self::pick(&mut self.rng, &self.srqs) else {
            return;
        };
        let Some(buf) = self.take_buf() else { return };
        let key = self.key(&buf);
        let srq = &mut self.srqs[j].as_mut().expect("live").srq;
        let before = srq.held_bufs();
        let r = srq.recv_buf(buf);
        let after = srq.held_bufs();
        self.call("srq_recv_buf");
        let desc = format!("srq{j}: recv_buf({key:?})");
        let q = SRQ_QUEUE + j as u32;
        match r {
            Ok(()) => {
                step!(self, "{desc} -> ok");
                assert_eq!(after, before + 1, "{desc}: posted, so held");
                self.bufs.post(key, q);
            }
            Err(Refused { error, buf }) => {
                let kind = self.error(&error);
                step!(self, "{desc} -> {kind} (buffer back: {})", buf.is_some());
                match buf {
                    Some(buf) => {
                        assert_eq!(self.key(&buf), key, "{desc}: refused with another buffer");
                        assert_eq!(after, before, "{desc}: refused, yet counted");
                        self.pool.push(buf);
                    }
                    None => {
                        assert!(!matches!(error, Error::WorkRequest { .. }), "{desc}: kept");
                        self.bufs.post(key, q);
                    }
                }
            }
        }
    }

    pub(crate) fn post(&mut self) {
        let Some(i) = Self::pick(&mut self.rng, &self.qps) else {
            return;
        };
        match self.rng.below(100) {
            0..=29 => self.send_buf(i),
            30..=41 => self.send_bufs(i),
            42..=56 => self.send_inline(i),
            57..=84 => {
                let on_srq = self.qps[i].as_ref().expect("live").srq.is_some();
                if on_srq && self.rng.chance(80) {
                    self.srq_recv_buf();
                } else {
                    self.recv_buf(i);
                }
            }
            _ => self.srq_recv_buf(),
        }
    }

    // ---- completions ----

    pub(crate) fn reap(&mut self) {
        let Some(c) = Self::pick(&mut self.rng, &self.cqs) else {
            return;
        };
        let n = 1 + self.rng.below(32) as usize;
        let mut wc = vec![WorkCompletion::default(); n];
        let checked = self.rng.chance(50);
        let all = self.rng.chance(30);
        self.call(if checked { "try_reap" } else { "reap" });
        let cq = self.cqs[c].as_mut().expect("live");
        let reaped = if checked {
            let r = cq.try_reap(&mut wc);
            match r {
                Ok(r) => r,
                Err(e) => {
                    let kind = self.error(&e);
                    step!(self, "cq{c}: try_reap({n}) -> {kind}");
                    assert!(matches!(e, Error::CqOverrun { .. }), "try_reap: {e:?}");
                    return;
                }
            }
        } else {
            cq.reap(&mut wc)
        };
        self.stats.completions += reaped.len() as u64;
        let summary: Vec<String> = reaped
            .iter()
            .map(|c| {
                format!(
                    "{:#x}@{}:{:?}/{:?}/{}",
                    c.wr_id, c.qp_num, c.status, c.opcode, c.byte_len
                )
            })
            .collect();
        step!(
            self,
            "cq{c}: {}({n}) -> [{}]",
            if checked { "try_reap" } else { "reap" },
            summary.join(", ")
        );
        if reaped.is_empty() {
            return;
        }
        if all {
            self.reclaim_all(&reaped);
        } else {
            for c in reaped.iter() {
                self.reclaim_one(c);
            }
        }
    }

    /// Offers `c` to every live queue: only its own may give buffers back.
    pub(crate) fn reclaim_one(&mut self, c: Completion<'_>) {
        let success = c.status == WcStatus::SUCCESS;
        for i in Self::live(&self.qps) {
            let mut last = None;
            loop {
                self.call("reclaim");
                let Some(buf) = self.qps[i].as_mut().expect("live").qp.reclaim(c) else {
                    break;
                };
                let key = self.key(&buf);
                let recv = self.taken_back(i, key, success, &buf);
                if let Some((earlier, _)) = last.replace((buf, recv)) {
                    self.pool.push(earlier);
                }
            }
            if let Some((buf, true)) = last {
                // The last buffer a receive completion gives back is that receive's own.
                if success && c.opcode == WcOpcode::RECV {
                    let ud = self.qps[i].as_ref().expect("live").kind == Kind::Ud;
                    let data = buf.as_slice();
                    let data = if ud {
                        assert!(data.len() >= UD_GRH, "a UD receive of {} bytes", data.len());
                        &data[UD_GRH..]
                    } else {
                        data
                    };
                    let data = data.to_vec();
                    self.check_message(&data, c.imm());
                }
                self.pool.push(buf);
            } else if let Some((buf, false)) = last {
                self.pool.push(buf);
            }
        }
        for j in Self::live(&self.srqs) {
            self.call("srq_reclaim");
            match self.srqs[j].as_mut().expect("live").srq.reclaim(c) {
                Ok(buf) => {
                    let key = self.key(&buf);
                    self.bufs.back(key, SRQ_QUEUE + j as u32, "by Srq::reclaim");
                    self.stats.returned += 1;
                    if success && c.opcode == WcOpcode::RECV {
                        let data = buf.as_slice().to_vec();
                        self.check_message(&data, c.imm());
                    }
                    self.pool.push(buf);
                }
                Err(e) => {
                    *self
                        .stats
                        .errors
                        .entry(format!("srq_reclaim:{}", variant(&format!("{e:?}"))))
                        .or_default() += 1;
                }
            }
        }
    }

    /// Buffer `key` came back from QP `i` (by `reclaim`): it must be the oldest its queue
    /// holds. Checks what a read fetched. Returns whether it was a receive's.
    pub(crate) fn taken_back(&mut self, i: usize, key: Key, success: bool, buf: &Buf) -> bool {
        self.stats.returned += 1;
        let s = self.qps[i].as_mut().expect("live");
        let rc = s.kind != Kind::Uc && s.kind != Kind::Ud;
        if s.recvs.front() == Some(&key) {
            s.recvs.pop_front();
            self.bufs.back(key, 2 * i as u32 + 1, "by Qp::reclaim (receive)");
            return true;
        }
        // Inline sends before it hold nothing; the first buffer must be this one.
        while let Some(Sent::Inline) = s.sends.front() {
            s.sends.pop_front();
        }
        match s.sends.pop_front() {
            Some(Sent::Buf { key: k, read }) => {
                assert_eq!(
                    k, key,
                    "qp{i}: reclaim gave back {key:?}, but the oldest send holds {k:?}"
                );
                self.bufs.back(key, 2 * i as u32, "by Qp::reclaim (send)");
                if let (Some(off), true, true) = (read, success, rc) {
                    // A successful completion on RC: every request before it succeeded.
                    let want: Vec<u8> = (off..off + buf.len()).map(read_pattern).collect();
                    assert_eq!(buf.as_slice(), &want[..], "qp{i}: what the read of {key:?} fetched");
                    self.stats.payloads += 1;
                }
            }
            other => panic!("qp{i}: reclaim gave back {key:?}, which neither queue holds first ({other:?})"),
        }
        false
    }

    pub(crate) fn reclaim_all(&mut self, reaped: &Reaped<'_>) {
        for i in Self::live(&self.qps) {
            let mut into = Vec::new();
            self.call("reclaim_all");
            self.qps[i].as_mut().expect("live").qp.reclaim_all(reaped, &mut into);
            for buf in into {
                let key = self.key(&buf);
                // Which completion gave it back is not known here: no payload checks.
                self.taken_back(i, key, false, &buf);
                self.pool.push(buf);
            }
        }
        for j in Self::live(&self.srqs) {
            let mut into = Vec::new();
            self.call("srq_reclaim_all");
            self.srqs[j].as_mut().expect("live").srq.reclaim_all(reaped, &mut into);
            for buf in into {
                let key = self.key(&buf);
                self.bufs.back(key, SRQ_QUEUE + j as u32, "by Srq::reclaim_all");
                self.stats.returned += 1;
                self.pool.push(buf);
            }
        }
    }

    // ---- resizes, destroys, drops ----

    pub(crate) fn resize(&mut self) {
        if self.rng.chance(70) {
            let Some(c) = Self::pick(&mut self.rng, &self.cqs) else {
                return;
            };
            let cqe = self.size(1024) as u32;
            self.call("cq_resize");
            let r = self.cqs[c].as_mut().expect("live").resize(cqe);
            let out = match &r {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("{} ({e})", self.error(e)),
            };
            step!(self, "cq{c}: resize({cqe}) -> {out}");
        } else {
            let Some(j) = Self::pick(&mut self.rng, &self.srqs) else {
                return;
            };
            let max_wr = self.size(256) as u32;
            self.call("srq_resize");
            let r = self.srqs[j].as_mut().expect("live").srq.resize(max_wr);
            let out = match &r {
                Ok(()) => "ok".to_string(),
                Err(e) => self.error(e),
            };
            step!(self, "srq{j}: resize({max_wr}) -> {out}");
        }
    }

    /// QP `i` went down (dropped or destroyed) with the buffers it held.
    pub(crate) fn qp_gone(&mut self, i: usize, srq: Option<usize>, held: (usize, usize), how: &str) {
        let sent = self.bufs.drop_queue(2 * i as u32);
        let recv = self.bufs.drop_queue(2 * i as u32 + 1);
        assert!(sent <= held.0, "qp{i}: {sent} send buffers tracked, {} held", held.0);
        assert_eq!(recv, held.1, "qp{i}: receive buffers held");
        self.stats.dropped_held += (sent + recv) as u64;
        if let Some(srq) = srq.and_then(|j| self.srqs[j].as_mut()) {
            srq.members -= 1;
        }
        step!(self, "qp{i} {how}: {sent} send and {recv} receive buffers went with it");
    }

    /// Drops or destroys QP `i`, busy or not.
    pub(crate) fn destroy_qp(&mut self, i: usize) {
        let mut s = self.qps[i].take().expect("live");
        let held = s.qp.held_bufs();
        if self.rng.chance(50) {
            self.call("qp_drop");
            drop(s.qp);
            self.qp_gone(i, s.srq, held, "dropped");
            return;
        }
        let QpSlot {
            qp,
            cm,
            kind,
            peer,
            srq,
            sends,
            recvs,
            link_up,
        } = s;
        let qp = match qp {
            Handle::Plain(qp) => qp,
            Handle::Conn(mut conn) => {
                // A connected id destroyed with its QP: at once (the id's destruction sends the
                // disconnect request), or after starting a disconnect of its own.
                let how = if self.rng.chance(30) {
                    self.call("cm_start_disconnect");
                    match conn.start_disconnect() {
                        Ok(()) => "disconnecting, then dropped",
                        Err(e) => {
                            let k = self.error(&e);
                            step!(self, "qp{i}: cm start_disconnect -> {k}");
                            "dropped after a failed disconnect"
                        }
                    }
                } else {
                    "connection dropped"
                };
                self.call("cm_conn_drop");
                drop(conn);
                self.qp_gone(i, srq, held, how);
                return;
            }
        };
        self.call("qp_destroy");
        match qp.destroy() {
            Ok(_) => self.qp_gone(i, srq, held, "destroyed"),
            Err((qp, e)) => {
                let kind_e = self.error(&e);
                step!(self, "qp{i}: destroy -> {kind_e}");
                assert_eq!(qp.held_bufs(), held, "qp{i}: a failed destroy changed what it holds");
                s = QpSlot {
                    qp: Handle::Plain(qp),
                    cm,
                    kind,
                    peer,
                    srq,
                    sends,
                    recvs,
                    link_up,
                };
                self.qps[i] = Some(s);
            }
        }
    }

    /// Drops or destroys SRQ `j`; `destroy_reclaim` gives its buffers back once no QP uses it.
    pub(crate) fn destroy_srq(&mut self, j: usize) {
        let slot = self.srqs[j].take().expect("live");
        let q = SRQ_QUEUE + j as u32;
        let held = slot.srq.held_bufs();
        assert_eq!(held, self.bufs.held(q), "srq{j}: buffers held");
        if self.rng.chance(30) {
            self.call("srq_drop");
            drop(slot.srq);
            let n = self.bufs.drop_queue(q);
            self.stats.dropped_held += n as u64;
            step!(
                self,
                "srq{j} dropped ({} QPs on it): {n} buffers went with it",
                slot.members
            );
            return;
        }
        let mut into = Vec::new();
        self.call("srq_destroy_reclaim");
        let members = slot.members;
        match slot.srq.destroy_reclaim(&mut into) {
            Ok(_) => {
                assert_eq!(into.len(), held, "srq{j}: destroy_reclaim gave back what it held");
                step!(
                    self,
                    "srq{j}: destroy_reclaim ({members} QPs on it) -> ok, {} back",
                    into.len()
                );
                for buf in into {
                    let key = self.key(&buf);
                    self.bufs.back(key, q, "by Srq::destroy_reclaim");
                    self.stats.returned += 1;
                    self.pool.push(buf);
                }
            }
            Err((srq, e)) => {
                let kind = self.error(&e);
                step!(self, "srq{j}: destroy_reclaim ({members} QPs on it) -> {kind}");
                assert!(into.is_empty(), "srq{j}: a failed destroy gave buffers back");
                assert_eq!(srq.held_bufs(), held, "srq{j}: a failed destroy changed what it holds");
                self.srqs[j] = Some(SrqSlot { srq, members });
            }
        }
    }

    pub(crate) fn destroy_cq(&mut self, c: usize) {
        let cq = self.cqs[c].take().expect("live");
        if self.rng.chance(50) {
            self.call("cq_drop");
            drop(cq);
            step!(self, "cq{c} dropped");
            return;
        }
        self.call("cq_destroy");
        match cq.destroy() {
            Ok(_) => step!(self, "cq{c}: destroy -> ok"),
            Err((cq, e)) => {
                let kind = self.error(&e);
                step!(self, "cq{c}: destroy -> {kind}");
                self.cqs[c] = Some(cq);
            }
        }
    }

    pub(crate) fn drop_something(&mut self) {
        match self.rng.below(10) {
            0..=4 => {
                if let Some(i) = Self::pick(&mut self.rng, &self.qps) {
                    self.destroy_qp(i);
                }
            }
            5 | 6 => {
                if let Some(j) = Self::pick(&mut self.rng, &self.srqs) {
                    self.destroy_srq(j);
                }
            }
            7 => {
                if let Some(c) = Self::pick(&mut self.rng, &self.cqs) {
                    self.destroy_cq(c);
                }
            }
            _ => {
                let n = self.rng.below(8) as usize;
                for _ in 0..n {
                    let Some(buf) = self.take_buf() else { break };
                    let key = self.key(&buf);
                    self.bufs.drop_hand(key);
                    drop(buf);
                }
                self.call("buf_drop");
                step!(self, "dropped {n} buffers from hand");
            }
        }
    }

    // ---- fork ----

    /// Forks: the child checks that the inherited objects refuse work and drops all of them.
    pub(crate) fn fork(&mut self) {
        self.call("fork");
        self.stats.forks += 1;
        let pid = process::fork();
        if pid == 0 {
            let code = catch_unwind(AssertUnwindSafe(|| self.child())).unwrap_or(101);
            process::exit_child(code);
        }
        let status = process::wait(pid);
        step!(self, "fork -> child {status:?}");
        self.check_cm_ids_alive("after a forked child dropped its copies");
        assert_eq!(
            status,
            Ok(0),
            "the forked child: 10 a post was not refused as forked, 11 the refusal kept the \
             buffer, 12 alloc_pd was not refused, 13 a reap found completions, 14 an inherited buffer held non-zero bytes, 15 send_room was not 0, 101 it panicked; \
             Err(signal) it was killed"
        );
    }

    /// The child's side of [`Round::fork`]: only inherited handles, then every one dropped.
    pub(crate) fn child(&mut self) -> i32 {
        let mut code = 0;
        if let (Some(i), Some(buf)) = (Self::live(&self.qps).first().copied(), self.pool.pop()) {
            // The region's pages are the child's own, zeroed: never the parent's bytes.
            if buf.as_slice().iter().any(|&b| b != 0) {
                code = 14;
            }
            // The ring is not mapped in a child: no room, and nothing read.
            if self.qps[i].as_mut().expect("live").qp.send_room() != 0 {
                code = 15;
            }
            match self.qps[i].as_mut().expect("live").qp.send_buf(SendOp::Send, buf) {
                Err(Refused {
                    error: Error::Forked { .. },
                    buf: Some(_),
                }) => {}
                Err(Refused { buf: None, .. }) => code = 11,
                _ => code = 10,
            }
        }
        if !matches!(self.base().ctx.alloc_pd(), Err(Error::Forked { .. })) {
            code = 12;
        }
        let mut wc = [WorkCompletion::default(); 4];
        for cq in self.cqs.iter_mut().flatten() {
            if !cq.reap(&mut wc).is_empty() {
                code = 13;
            }
        }
        self.qps.clear();
        self.srqs.clear();
        self.cqs.clear();
        self.pool.clear();
        self.listeners.clear();
        self.cm = None;
        self.base = None;
        code
    }
}
