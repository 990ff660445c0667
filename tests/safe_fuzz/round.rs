//! A round's state and its shared steps: the [`Round`] (its objects in slots, the buffer
//! pool and tracker, the RDMA CM side), the slot types, the helpers every step uses (counts,
//! draws of sizes and buffers, tagged messages and their check), the check of every queue's
//! count after each step, and the round's own driving: one step drawn among the verbs steps
//! (`verbs.rs`) and the CM steps (`cm.rs`), and the teardown in random order.

use super::bookkeeping::{error_kind, At, Key, Log, Stats, Tracker};
use super::common::{self, driver, loopback_path, open_test_device};
use super::{ATOMIC_AREA, CM_PER_MILLE, QKEY, READ_AREA, SRQ_QUEUE, TARGET_LEN};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::time::Instant;
use uverbs::cm::{Connection, Listener};
use uverbs::testing::Rng;
use uverbs::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Rc,
    Uc,
    Ud,
    RcSrq,
}

/// A request a QP's send queue counts, oldest first.
#[derive(Debug)]
pub(crate) enum Sent {
    Buf { key: Key, read: Option<usize> },
    Inline,
}

/// A QP of the round: made by the fuzzer, or one end of an RDMA CM connection (which owns
/// its QP); posts, reaps and state changes go to either through `Deref`.
#[allow(clippy::large_enum_variant)] // a few per round
pub(crate) enum Handle {
    Plain(Qp),
    Conn(Box<Connection>),
}

impl std::ops::Deref for Handle {
    type Target = Qp;
    fn deref(&self) -> &Qp {
        match self {
            Handle::Plain(qp) => qp,
            Handle::Conn(c) => c.qp(),
        }
    }
}

impl std::ops::DerefMut for Handle {
    fn deref_mut(&mut self) -> &mut Qp {
        match self {
            Handle::Plain(qp) => qp,
            Handle::Conn(c) => c.qp_mut(),
        }
    }
}

pub(crate) struct QpSlot {
    pub(crate) qp: Handle,
    /// On the RDMA CM's device.
    pub(crate) cm: bool,
    pub(crate) kind: Kind,
    pub(crate) peer: u32,
    pub(crate) srq: Option<usize>,
    pub(crate) sends: VecDeque<Sent>,
    pub(crate) recvs: VecDeque<Key>,
    /// A connection no disconnect has touched yet: its first `start_disconnect` moves the QP
    /// to ERR. Once one has, a later one is a no-op and leaves the state alone (the caller
    /// may have moved the QP on since).
    pub(crate) link_up: bool,
}

pub(crate) struct SrqSlot {
    pub(crate) srq: Srq,
    pub(crate) members: usize,
}

/// The round's objects on the RDMA CM's device (rxe_cm in the guest; the round's own device
/// is another), made at its first connect: connections post buffers of this PD's regions, and
/// one-sided operations go to `target`, laid out as the round's.
pub(crate) struct CmSide {
    pub(crate) ctx: Context,
    pub(crate) pd: Pd,
    pub(crate) target: RemoteMr,
}

/// What every round starts with.
pub(crate) struct Base {
    pub(crate) ctx: Context,
    pub(crate) pd: Pd,
    pub(crate) target: RemoteMr,
    pub(crate) ah: Ah,
    /// An AH of another context: UD sends through it are refused.
    pub(crate) foreign: Option<(Ah, Context)>,
}

pub(crate) struct Round<'r> {
    pub(crate) rng: Rng,
    pub(crate) base: Option<Base>,
    pub(crate) path: AhAttr,
    pub(crate) cqs: Vec<Option<Cq>>,
    pub(crate) qps: Vec<Option<QpSlot>>,
    pub(crate) srqs: Vec<Option<SrqSlot>>,
    pub(crate) pool: Vec<Buf>,
    pub(crate) bufs: Tracker,
    /// Region number by lkey (unique among live regions: a `Buf` keeps its region).
    pub(crate) regions: HashMap<u32, u32>,
    pub(crate) mrs: u32,
    /// Messages sent: tag to length and immediate data.
    pub(crate) tags: HashMap<u64, (usize, Option<u32>)>,
    pub(crate) next_tag: u64,
    pub(crate) stats: &'r mut Stats,
    pub(crate) log: &'r mut Log,
    pub(crate) cm_ip: Option<IpAddr>,
    pub(crate) cm: Option<CmSide>,
    pub(crate) cm_cqs: HashSet<usize>,
    pub(crate) listeners: Vec<Option<(Listener, u16)>>,
    /// A CM step ran this round.
    pub(crate) cm_touched: bool,
}

pub(crate) fn access_all() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
}

pub(crate) fn read_pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(3)
}

/// Byte `i` of the message tagged `tag`.
pub(crate) fn msg_byte(tag: u64, i: usize) -> u8 {
    (tag as u8 ^ (tag >> 8) as u8).wrapping_add((i as u8).wrapping_mul(31))
}

/// The UD destination of a send to `peer`: through the round's AH (or another context's,
/// refused), or none.
pub(crate) fn dest(base: &Base, peer: u32, pick: u64) -> Option<UdDest<'_>> {
    match pick {
        0..=79 => Some(base.ah.ud_dest(peer, QKEY)),
        80..=87 => Some(base.ah.ud_dest(peer, QKEY ^ 1)),
        88..=93 => base.foreign.as_ref().map(|(ah, _)| ah.ud_dest(peer, QKEY)),
        _ => None,
    }
}

pub(crate) fn state_attr(state: QpState) -> QpAttr {
    QpAttr {
        state: Some(state),
        ..Default::default()
    }
}

impl<'r> Round<'r> {
    pub(crate) fn new(seed: u64, stats: &'r mut Stats, log: &'r mut Log) -> Self {
        let mut rng = Rng::new(seed);
        let ctx = open_test_device();
        let driver = driver(&ctx);
        let path = loopback_path(&ctx);
        let pd = ctx.alloc_pd().expect("alloc_pd");
        let mut target = pd.alloc_remote_mr(TARGET_LEN, access_all()).expect("target region");
        let pattern: Vec<u8> = (0..ATOMIC_AREA - READ_AREA).map(read_pattern).collect();
        target.write(READ_AREA, &pattern).expect("in the region");
        let ah = pd.create_ah(&path).expect("create_ah");
        let foreign = rng.chance(20).then(|| {
            let other = open_test_device();
            let ah = other
                .alloc_pd()
                .and_then(|pd| pd.create_ah(&path))
                .expect("a second context's AH");
            (ah, other)
        });
        log.push(format!(
            "round seed {seed:#x}: {driver:?}, foreign AH {}",
            foreign.is_some()
        ));
        Self {
            rng,
            base: Some(Base {
                ctx,
                pd,
                target,
                ah,
                foreign,
            }),
            path,
            cqs: Vec::new(),
            qps: Vec::new(),
            srqs: Vec::new(),
            pool: Vec::new(),
            bufs: Tracker::default(),
            regions: HashMap::new(),
            mrs: 0,
            tags: HashMap::new(),
            next_tag: 0x5afe << 48,
            cm_ip: stats.cm.as_ref().ok().copied(),
            stats,
            log,
            cm: None,
            cm_cqs: HashSet::new(),
            listeners: Vec::new(),
            cm_touched: false,
        }
    }

    /// The address and rkey of the region one-sided operations of QP `i` target: the round's,
    /// or for a QP on the CM's device that device's.
    pub(crate) fn target_of(&self, i: usize) -> (u64, u32) {
        let on_cm = self.qps[i].as_ref().is_some_and(|s| s.cm);
        match (&self.cm, on_cm) {
            (Some(cm), true) => (cm.target.addr(), cm.target.rkey()),
            _ => (self.base().target.addr(), self.base().target.rkey()),
        }
    }

    pub(crate) fn base(&self) -> &Base {
        self.base.as_ref().expect("the round's base objects")
    }

    pub(crate) fn call(&mut self, name: &'static str) {
        *self.stats.calls.entry(name).or_default() += 1;
    }

    pub(crate) fn error(&mut self, e: &Error) -> String {
        let kind = error_kind(e);
        *self.stats.errors.entry(kind.clone()).or_default() += 1;
        kind
    }

    pub(crate) fn key(&self, buf: &Buf) -> Key {
        let region = *self
            .regions
            .get(&buf.lkey())
            .unwrap_or_else(|| panic!("a buffer of no region of this round: {buf:?}"));
        (region, buf.offset())
    }

    pub(crate) fn live<T>(v: &[Option<T>]) -> Vec<usize> {
        v.iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| i)
            .collect()
    }

    pub(crate) fn pick<T>(rng: &mut Rng, v: &[Option<T>]) -> Option<usize> {
        let live = Self::live(v);
        (!live.is_empty()).then(|| live[rng.below(live.len() as u64) as usize])
    }

    /// A number from 1 to `max`, log-uniform.
    pub(crate) fn size(&mut self, max: usize) -> usize {
        let bits = usize::BITS - max.leading_zeros();
        let top = 1usize << self.rng.below(bits as u64);
        (top + self.rng.below(top as u64) as usize).clamp(1, max)
    }

    pub(crate) fn take_buf(&mut self) -> Option<Buf> {
        if self.pool.is_empty() {
            return None;
        }
        let i = self.rng.below(self.pool.len() as u64) as usize;
        Some(self.pool.swap_remove(i))
    }

    /// Sets `buf` to a message of about `len` bytes and returns its tag and length; `imm`:
    /// it goes with the tag as immediate data.
    pub(crate) fn fill(&mut self, buf: &mut Buf, len: usize, imm: bool) -> (u64, usize) {
        let tag = self.next_tag;
        self.fill_tagged(buf, len, imm.then_some(tag as u32))
    }

    /// [`Round::fill`] with the immediate data given.
    pub(crate) fn fill_tagged(&mut self, buf: &mut Buf, len: usize, imm: Option<u32>) -> (u64, usize) {
        let len = len.min(buf.capacity());
        let tag = self.next_tag;
        self.next_tag += 1;
        buf.set_len(len).expect("within the capacity");
        // Short messages carry no tag: their bytes are those of tag 0.
        let pattern = if len >= 8 { tag } else { 0 };
        let bytes = buf.as_mut_slice();
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = msg_byte(pattern, i);
        }
        if len >= 8 {
            bytes[..8].copy_from_slice(&tag.to_le_bytes());
            self.tags.insert(tag, (len, imm));
        }
        (tag, len)
    }

    pub(crate) fn message(&mut self, len: usize, imm: bool) -> (u64, Vec<u8>) {
        let tag = self.next_tag;
        self.next_tag += 1;
        let pattern = if len >= 8 { tag } else { 0 };
        let mut m: Vec<u8> = (0..len).map(|i| msg_byte(pattern, i)).collect();
        if len >= 8 {
            m[..8].copy_from_slice(&tag.to_le_bytes());
            self.tags.insert(tag, (len, imm.then_some(tag as u32)));
        }
        (tag, m)
    }

    /// Checks a received message against what was sent.
    pub(crate) fn check_message(&mut self, data: &[u8], imm: Option<u32>) {
        let tag = if data.len() >= 8 {
            let tag = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
            let sent = self.tags.get(&tag).copied();
            assert_eq!(
                sent.map(|s| s.0),
                Some(data.len()),
                "received {} bytes tagged {tag:#x}: no such message was sent",
                data.len()
            );
            let want_imm = sent.and_then(|s| s.1);
            if want_imm.is_some() || imm.is_some() {
                assert_eq!(imm, want_imm, "immediate data of message {tag:#x}");
            }
            Some(tag)
        } else {
            None
        };
        let from = if tag.is_some() { 8 } else { 0 };
        for (i, &b) in data.iter().enumerate().skip(from) {
            assert_eq!(b, msg_byte(tag.unwrap_or(0), i), "byte {i} of a received message");
        }
        self.stats.payloads += 1;
    }

    /// What each live queue counts agrees with what it was given and gave back.
    pub(crate) fn check_counts(&self) {
        for i in Self::live(&self.qps) {
            let s = self.qps[i].as_ref().expect("live");
            let (sends, recvs) = s.qp.held_bufs();
            let bufs = self.bufs.held(2 * i as u32);
            assert!(
                bufs <= sends && sends <= s.sends.len(),
                "qp{i}: {bufs} send buffers posted and not back, the QP counts {sends}, {} requests tracked",
                s.sends.len()
            );
            assert_eq!(recvs, self.bufs.held(2 * i as u32 + 1), "qp{i}: receive buffers held");
            assert_eq!(recvs, s.recvs.len(), "qp{i}: receives tracked");
        }
        for j in Self::live(&self.srqs) {
            let held = self.srqs[j].as_ref().expect("live").srq.held_bufs();
            assert_eq!(held, self.bufs.held(SRQ_QUEUE + j as u32), "srq{j}: buffers held");
        }
    }

    // ---- the round ----

    pub(crate) fn step(&mut self) {
        if self.cm_ip.is_some() && self.rng.below(1000) < CM_PER_MILLE {
            let t = Instant::now();
            self.cm_step();
            self.stats.cm_time += t.elapsed();
            self.check_counts();
            return;
        }
        match self.rng.below(1000) {
            0..=49 => self.alloc_mr(),
            50..=99 => self.create_pair(),
            100..=119 => {
                self.create_cq();
            }
            120..=129 => {
                self.create_srq();
            }
            130..=199 => self.change_state(),
            200..=549 => self.post(),
            550..=869 => self.reap(),
            870..=899 => self.resize(),
            900..=994 => self.drop_something(),
            _ => self.fork(),
        }
        self.check_counts();
    }

    /// Drops everything left, in random order.
    pub(crate) fn teardown(&mut self) {
        let mut things: Vec<(u8, usize)> = Vec::new();
        things.extend(Self::live(&self.qps).into_iter().map(|i| (0, i)));
        things.extend(Self::live(&self.srqs).into_iter().map(|j| (1, j)));
        things.extend(Self::live(&self.cqs).into_iter().map(|c| (2, c)));
        things.push((3, 0));
        things.extend(Self::live(&self.listeners).into_iter().map(|l| (4, l)));
        if self.cm.is_some() {
            things.push((5, 0));
        }
        for k in (1..things.len()).rev() {
            let o = self.rng.below(k as u64 + 1) as usize;
            things.swap(k, o);
        }
        for (what, i) in things {
            match what {
                0 => self.destroy_qp(i),
                1 => self.destroy_srq(i),
                2 => self.destroy_cq(i),
                4 => self.drop_listener(i),
                5 => {
                    step!(self, "the CM device's context, PD and target dropped");
                    self.cm = None;
                }
                _ => {
                    step!(self, "base objects dropped");
                    self.base = None;
                }
            }
            self.check_counts();
        }
        // Failed destroys (a CQ or SRQ still in use) left some: drop them now.
        for i in Self::live(&self.qps) {
            let s = self.qps[i].take().expect("live");
            let held = s.qp.held_bufs();
            drop(s.qp);
            self.qp_gone(i, s.srq, held, "dropped");
        }
        for j in Self::live(&self.srqs) {
            let slot = self.srqs[j].take().expect("live");
            drop(slot.srq);
            let n = self.bufs.drop_queue(SRQ_QUEUE + j as u32);
            self.stats.dropped_held += n as u64;
        }
        self.cqs.clear();
        for buf in std::mem::take(&mut self.pool) {
            let key = self.key(&buf);
            self.bufs.drop_hand(key);
        }
        let left: Vec<_> = self.bufs.at.iter().filter(|(_, at)| **at != At::Gone).collect();
        assert!(left.is_empty(), "buffers neither back nor gone: {left:?}");
        if self.cm_used() {
            // The kernel destroys an id inside DESTROY_ID: none may be left.
            let ids = common::cm::my_cm_ids();
            assert!(ids.is_empty(), "cm_ids left after the round: {ids:#?}");
        }
    }
}
