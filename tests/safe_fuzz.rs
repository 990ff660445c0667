//! The safe API under random use: seeded sequences of safe calls only (regions cut into
//! `Buf`s, CQs of random depth, RC, UC, UD and RC-on-SRQ QPs in loopback pairs, state changes
//! valid and not, every safe post, reaps, reclaims, resizes, destroys while busy, drops in
//! random order, `fork()`), run round after round until the time budget is spent. Where the
//! RDMA CM is (`UVERBS_CM_ADDR`: rxe_cm on a dummy netdev in the test guest), rounds also
//! listen, connect (accepted, rejected, dropped on either side on the way up, or nobody
//! there or answering: typed rejects and timeouts), post over the connected QPs with the
//! same buffer accounting, disconnect from either side, and drop connections and listeners
//! while connected; those steps are [`CM_PER_MILLE`] of all. Without it (the mlx5
//! model) they are skipped and the summary says so.
//!
//! Every round checks that every `Buf` comes back exactly once (from a reclaim, a refusal or
//! a destroy), or is still held by a live queue as that queue counts it, or went down with a
//! dropped queue; that every failure is a typed `uverbs::Error` (nothing panics); that
//! `SendOp::Raw` is refused by every safe post; and that received and read bytes are what was
//! sent. In the test guest it also reads the kernel log: an oops, BUG or WARNING fails the
//! round.
//!
//! `UVERBS_SAFE_FUZZ_SEED` sets the seed. Without `UVERBS_SAFE_FUZZ_SECONDS` (the CI run) a
//! run is a fixed number of rounds (`UVERBS_SAFE_FUZZ_ROUNDS`; by default
//! [`DEFAULT_ROUNDS_RXE`] or [`DEFAULT_ROUNDS_MLX5`]): the same rounds on every machine,
//! whatever its speed, stopped early only at a time cap ([`ROUNDS_CAP_SECONDS`]). A round's
//! draws do not depend on timing, but what it sees does (which completions have arrived when
//! it polls), so the same round may still take another path on another run.
//! `UVERBS_SAFE_FUZZ_SECONDS=s` explores instead: rounds until `s` seconds are spent (with
//! `UVERBS_SAFE_FUZZ_ROUNDS`, whichever ends first). `UVERBS_SAFE_FUZZ_ROUND=n` replays round `n` alone, and
//! `UVERBS_SAFE_FUZZ_TRACE=1` prints every step as it runs (for a round that kills the
//! kernel, where the step log printed on failure never comes).

#![deny(unsafe_code)]

#[allow(unsafe_code)] // the shared set-up's raw-post helpers; none is used here
mod common;
mod figures;

use common::{driver, loopback_path, open_test_device};
use figures::figure;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};
use uverbs::cm::{ConnParam, Connection, Connector, Establishing, Listener};
use uverbs::testing::Rng;
use uverbs::*;

const DEFAULT_SEED: u64 = 0x5afe_f022;
/// Rounds of a run without `UVERBS_SAFE_FUZZ_SECONDS` (the CI run): about a minute on an
/// idle host (rxe in the guest under TCG: 5 rounds a second; the mlx5 model: 44), which is
/// what the 60 s budget the CI run had gave there.
const DEFAULT_ROUNDS_RXE: u64 = 300;
const DEFAULT_ROUNDS_MLX5: u64 = 2500;
/// Where a run of a fixed number of rounds stops early, on a host too busy for them (rxe in
/// the guest ran 0.6 rounds a second on a host shared by six builds): the rounds it ran are
/// the first of the same fixed set, never others.
const ROUNDS_CAP_SECONDS: u64 = 120;
/// Steps of the step log printed with a failure.
const LOG_STEPS: usize = 200;
const QKEY: u32 = 0x1111_1111;
/// The region all one-sided operations target: written here, read (a fixed pattern) there,
/// atomics on the words at the end.
const WRITE_AREA: usize = 0;
const READ_AREA: usize = 16 << 10;
const ATOMIC_AREA: usize = 32 << 10;
const TARGET_LEN: usize = ATOMIC_AREA + 64;
/// Longest message sent or read (a buffer may be larger: a receive fills all of it).
const MAX_MSG: usize = 64 << 10;
const UD_GRH: usize = 40;
/// Limits on what one round holds, to keep rounds short on TCG.
const MAX_QPS: usize = 10;
const MAX_CQS: usize = 5;
const MAX_SRQS: usize = 2;
const MAX_MRS: usize = 6;
const MAX_BUFS_PER_MR: usize = 256;
/// CQs and listeners on the RDMA CM's device at once.
const MAX_CM_CQS: usize = 3;
const MAX_LISTENERS: usize = 2;
/// The ports listeners bind (the round picks among them), and one nothing listens on.
const CM_PORTS: [u16; 3] = [7701, 7702, 7703];
const CM_PORT_NOBODY: u16 = 7709;
/// CM steps per thousand steps where the CM is (a connect takes tens of ms under TCG: about
/// a fifth of the run's time in the test guest). A fixed chance, not a share of the time, so
/// a round takes the same path whatever the machine's speed.
const CM_PER_MILLE: u64 = 25;
/// Queue ids of SRQs (those of QPs are twice the QP's index, plus one for its receives).
const SRQ_QUEUE: u32 = 1 << 20;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
        }
        Err(_) => default,
    }
}

/// Round `n`'s own seed.
fn round_seed(seed: u64, n: u64) -> u64 {
    Rng::new(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)).next_u64()
}

/// The last [`LOG_STEPS`] steps of a round, printed when it fails.
struct Log {
    lines: VecDeque<String>,
    step: u64,
    trace: bool,
}

impl Log {
    fn new(trace: bool) -> Self {
        Self {
            lines: VecDeque::with_capacity(LOG_STEPS),
            step: 0,
            trace,
        }
    }

    fn push(&mut self, line: String) {
        self.step += 1;
        let line = format!("{:5} {line}", self.step);
        if self.trace {
            figure(&line);
        }
        if self.lines.len() == LOG_STEPS {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }
}

/// Calls, errors and other counts over the whole run.
struct Stats {
    rounds: u64,
    calls: BTreeMap<&'static str, u64>,
    errors: BTreeMap<String, u64>,
    bufs: u64,
    returned: u64,
    dropped_held: u64,
    payloads: u64,
    completions: u64,
    forks: u64,
    raw_refused: u64,
    /// The RDMA CM: its address, or why the CM steps are skipped.
    cm: std::result::Result<IpAddr, String>,
    cm_time: Duration,
    cm_connections: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            rounds: 0,
            calls: BTreeMap::new(),
            errors: BTreeMap::new(),
            bufs: 0,
            returned: 0,
            dropped_held: 0,
            payloads: 0,
            completions: 0,
            forks: 0,
            raw_refused: 0,
            cm: Err("not looked for".into()),
            cm_time: Duration::ZERO,
            cm_connections: 0,
        }
    }
}

/// The short name of an error: its variant, the verb, and the reason or errno.
fn error_kind(e: &Error) -> String {
    match e {
        Error::WorkRequest { verb, reason, .. } => format!("{verb}:{}", variant(&format!("{reason:?}"))),
        Error::Kernel { verb, errno } => format!("{verb}:{errno:?}"),
        Error::Malformed { verb, .. } | Error::InvalidArgument { verb, .. } | Error::Unsupported { verb, .. } => {
            format!("{verb}:{}", variant(&format!("{e:?}")))
        }
        Error::Rejected { status, .. } => format!("Rejected:{status}"),
        Error::CmEvent { verb, event, status } => format!("{verb}:{event}:{status}"),
        Error::TimedOut { verb, .. } => format!("{verb}:TimedOut"),
        e => variant(&format!("{e:?}")).to_string(),
    }
}

fn variant(debug: &str) -> &str {
    debug.split([' ', '{', '(']).next().unwrap_or(debug)
}

/// The name of a `Buf` for accounting: its region (numbered per round) and offset.
type Key = (u32, usize);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    Hand,
    Queue(u32),
    Gone,
}

/// Where every `Buf` of the round is.
#[derive(Default)]
struct Tracker {
    at: HashMap<Key, At>,
    per_queue: HashMap<u32, usize>,
}

impl Tracker {
    fn add(&mut self, key: Key) {
        assert!(self.at.insert(key, At::Hand).is_none(), "buffer {key:?} made twice");
    }

    fn post(&mut self, key: Key, q: u32) {
        let at = self.at.get_mut(&key).expect("a buffer of this round");
        assert_eq!(*at, At::Hand, "buffer {key:?} posted to queue {q} from {at:?}");
        *at = At::Queue(q);
        *self.per_queue.entry(q).or_default() += 1;
    }

    fn back(&mut self, key: Key, q: u32, how: &str) {
        let at = self
            .at
            .get_mut(&key)
            .unwrap_or_else(|| panic!("unknown buffer {key:?} {how}"));
        assert_eq!(
            *at,
            At::Queue(q),
            "buffer {key:?} given back ({how}) by queue {q}, but it is {at:?}"
        );
        *at = At::Hand;
        *self.per_queue.get_mut(&q).expect("counted") -= 1;
    }

    fn drop_hand(&mut self, key: Key) {
        let at = self.at.get_mut(&key).expect("a buffer of this round");
        assert_eq!(*at, At::Hand, "buffer {key:?} dropped from hand while {at:?}");
        *at = At::Gone;
    }

    /// The queue went down with its buffers: how many.
    fn drop_queue(&mut self, q: u32) -> usize {
        let mut n = 0;
        for at in self.at.values_mut().filter(|at| **at == At::Queue(q)) {
            *at = At::Gone;
            n += 1;
        }
        let counted = self.per_queue.remove(&q).unwrap_or(0);
        assert_eq!(n, counted, "queue {q}: buffers held");
        n
    }

    fn held(&self, q: u32) -> usize {
        self.per_queue.get(&q).copied().unwrap_or(0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rc,
    Uc,
    Ud,
    RcSrq,
}

/// A request a QP's send queue counts, oldest first.
#[derive(Debug)]
enum Sent {
    Buf { key: Key, read: Option<usize> },
    Inline,
}

/// A QP of the round: made by the fuzzer, or one end of an RDMA CM connection (which owns
/// its QP); posts, reaps and state changes go to either through `Deref`.
#[allow(clippy::large_enum_variant)] // a few per round
enum Handle {
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

struct QpSlot {
    qp: Handle,
    /// On the RDMA CM's device.
    cm: bool,
    kind: Kind,
    peer: u32,
    srq: Option<usize>,
    sends: VecDeque<Sent>,
    recvs: VecDeque<Key>,
    /// A connection no disconnect has touched yet: its first `start_disconnect` moves the QP
    /// to ERR. Once one has, a later one is a no-op and leaves the state alone (the caller
    /// may have moved the QP on since).
    link_up: bool,
}

struct SrqSlot {
    srq: Srq,
    members: usize,
}

/// The round's objects on the RDMA CM's device (rxe_cm in the guest; the round's own device
/// is another), made at its first connect: connections post buffers of this PD's regions, and
/// one-sided operations go to `target`, laid out as the round's.
struct CmSide {
    ctx: Context,
    pd: Pd,
    target: RemoteMr,
}

/// What every round starts with.
struct Base {
    ctx: Context,
    pd: Pd,
    target: RemoteMr,
    ah: Ah,
    /// An AH of another context: UD sends through it are refused.
    foreign: Option<(Ah, Context)>,
}

struct Round<'r> {
    rng: Rng,
    base: Option<Base>,
    path: AhAttr,
    cqs: Vec<Option<Cq>>,
    qps: Vec<Option<QpSlot>>,
    srqs: Vec<Option<SrqSlot>>,
    pool: Vec<Buf>,
    bufs: Tracker,
    /// Region number by lkey (unique among live regions: a `Buf` keeps its region).
    regions: HashMap<u32, u32>,
    mrs: u32,
    /// Messages sent: tag to length and immediate data.
    tags: HashMap<u64, (usize, Option<u32>)>,
    next_tag: u64,
    stats: &'r mut Stats,
    log: &'r mut Log,
    cm_ip: Option<IpAddr>,
    cm: Option<CmSide>,
    cm_cqs: HashSet<usize>,
    listeners: Vec<Option<(Listener, u16)>>,
    /// A CM step ran this round.
    cm_touched: bool,
}

macro_rules! step {
    ($r:expr, $($arg:tt)*) => {
        $r.log.push(format!($($arg)*))
    };
}

fn access_all() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
}

fn read_pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(3)
}

/// Byte `i` of the message tagged `tag`.
fn msg_byte(tag: u64, i: usize) -> u8 {
    (tag as u8 ^ (tag >> 8) as u8).wrapping_add((i as u8).wrapping_mul(31))
}

/// The UD destination of a send to `peer`: through the round's AH (or another context's,
/// refused), or none.
fn dest(base: &Base, peer: u32, pick: u64) -> Option<UdDest<'_>> {
    match pick {
        0..=79 => Some(base.ah.ud_dest(peer, QKEY)),
        80..=87 => Some(base.ah.ud_dest(peer, QKEY ^ 1)),
        88..=93 => base.foreign.as_ref().map(|(ah, _)| ah.ud_dest(peer, QKEY)),
        _ => None,
    }
}

fn state_attr(state: QpState) -> QpAttr {
    QpAttr {
        state: Some(state),
        ..Default::default()
    }
}

impl<'r> Round<'r> {
    fn new(seed: u64, stats: &'r mut Stats, log: &'r mut Log) -> Self {
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
    fn target_of(&self, i: usize) -> (u64, u32) {
        let on_cm = self.qps[i].as_ref().is_some_and(|s| s.cm);
        match (&self.cm, on_cm) {
            (Some(cm), true) => (cm.target.addr(), cm.target.rkey()),
            _ => (self.base().target.addr(), self.base().target.rkey()),
        }
    }

    fn base(&self) -> &Base {
        self.base.as_ref().expect("the round's base objects")
    }

    fn call(&mut self, name: &'static str) {
        *self.stats.calls.entry(name).or_default() += 1;
    }

    fn error(&mut self, e: &Error) -> String {
        let kind = error_kind(e);
        *self.stats.errors.entry(kind.clone()).or_default() += 1;
        kind
    }

    fn key(&self, buf: &Buf) -> Key {
        let region = *self
            .regions
            .get(&buf.lkey())
            .unwrap_or_else(|| panic!("a buffer of no region of this round: {buf:?}"));
        (region, buf.offset())
    }

    fn live<T>(v: &[Option<T>]) -> Vec<usize> {
        v.iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| i)
            .collect()
    }

    fn pick<T>(rng: &mut Rng, v: &[Option<T>]) -> Option<usize> {
        let live = Self::live(v);
        (!live.is_empty()).then(|| live[rng.below(live.len() as u64) as usize])
    }

    /// A number from 1 to `max`, log-uniform.
    fn size(&mut self, max: usize) -> usize {
        let bits = usize::BITS - max.leading_zeros();
        let top = 1usize << self.rng.below(bits as u64);
        (top + self.rng.below(top as u64) as usize).clamp(1, max)
    }

    fn take_buf(&mut self) -> Option<Buf> {
        if self.pool.is_empty() {
            return None;
        }
        let i = self.rng.below(self.pool.len() as u64) as usize;
        Some(self.pool.swap_remove(i))
    }

    /// Sets `buf` to a message of about `len` bytes and returns its tag and length; `imm`:
    /// it goes with the tag as immediate data.
    fn fill(&mut self, buf: &mut Buf, len: usize, imm: bool) -> (u64, usize) {
        let tag = self.next_tag;
        self.fill_tagged(buf, len, imm.then_some(tag as u32))
    }

    /// [`Round::fill`] with the immediate data given.
    fn fill_tagged(&mut self, buf: &mut Buf, len: usize, imm: Option<u32>) -> (u64, usize) {
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

    fn message(&mut self, len: usize, imm: bool) -> (u64, Vec<u8>) {
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
    fn check_message(&mut self, data: &[u8], imm: Option<u32>) {
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

    // ---- objects ----

    fn alloc_mr(&mut self) {
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
    fn live_regions(regions: &HashMap<u32, u32>) -> usize {
        regions.len()
    }

    fn create_cq(&mut self) -> Option<usize> {
        self.create_cq_on(false)
    }

    /// A CQ on the round's device, or (`cm`) on the RDMA CM's: a new one, or one of those
    /// there are once they are many.
    fn create_cq_on(&mut self, cm: bool) -> Option<usize> {
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

    fn create_srq(&mut self) -> Option<usize> {
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

    fn create_qp(&mut self, kind: Kind, srq: Option<usize>) -> Option<usize> {
        self.create_qp_on(kind, srq, false)
    }

    /// A QP on the round's PD, or (`cm`) on the RDMA CM device's, with CQs there.
    fn create_qp_on(&mut self, kind: Kind, srq: Option<usize>, cm: bool) -> Option<usize> {
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
    fn create_pair(&mut self) {
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

    fn qpn(&self, i: usize) -> u32 {
        self.qps[i].as_ref().expect("live").qp.qpn()
    }

    /// RESET to RTS towards the QP's peer.
    fn connect(&mut self, i: usize) -> (Result<()>, &'static str) {
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
    fn change_state(&mut self) {
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
    fn send_op(&mut self, i: usize, buf: &mut Buf, raw: bool) -> (SendOp, Option<usize>) {
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

    fn raw_op(&mut self) -> SendOp {
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

    fn flags(&mut self) -> SendFlags {
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

    fn send_buf(&mut self, i: usize) {
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
    fn after_send(
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
    fn check_raw_refusal(&mut self, error: &Error, desc: &str, i: usize) {
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

    fn send_bufs(&mut self, i: usize) {
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

    fn send_inline(&mut self, i: usize) {
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

    fn recv_buf(&mut self, i: usize) {
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

    fn srq_recv_buf(&mut self) {
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

    fn post(&mut self) {
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

    fn reap(&mut self) {
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
    fn reclaim_one(&mut self, c: Completion<'_>) {
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
    fn taken_back(&mut self, i: usize, key: Key, success: bool, buf: &Buf) -> bool {
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

    fn reclaim_all(&mut self, reaped: &Reaped<'_>) {
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

    fn resize(&mut self) {
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
    fn qp_gone(&mut self, i: usize, srq: Option<usize>, held: (usize, usize), how: &str) {
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
    fn destroy_qp(&mut self, i: usize) {
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
    fn destroy_srq(&mut self, j: usize) {
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

    fn destroy_cq(&mut self, c: usize) {
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

    fn drop_something(&mut self) {
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

    /// What each live queue counts agrees with what it was given and gave back.
    fn check_counts(&self) {
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

    // ---- fork ----

    /// Forks: the child checks that the inherited objects refuse work and drops all of them.
    fn fork(&mut self) {
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
    fn child(&mut self) -> i32 {
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

    // ---- the round ----

    fn step(&mut self) {
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
    fn teardown(&mut self) {
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

// ---- the RDMA connection manager ----

/// Polls `advance` of each end that is still on its way up, in random order, until both
/// ended or `deadline`; returns each end's outcome (`None`: still pending at the deadline).
/// `rng` is the caller's to spend: how many polls it takes depends on timing.
fn drive(mut rng: Rng, ends: [&mut Option<Establishing>; 2], deadline: Instant) -> [Option<Result<Connection>>; 2] {
    let mut out: [Option<Result<Connection>>; 2] = [None, None];
    let [a, b] = ends;
    let ends = [a, b];
    loop {
        let first = rng.below(2) as usize;
        for k in [first, 1 - first] {
            let Some(e) = ends[k].as_mut() else { continue };
            match e.advance() {
                Ok(false) => {}
                Ok(true) => out[k] = Some(ends[k].take().expect("pending").finish()),
                Err(err) => {
                    // The end (its id, channel and QP) goes down with the error.
                    *ends[k] = None;
                    out[k] = Some(Err(err));
                }
            }
        }
        if ends.iter().all(|e| e.is_none()) || Instant::now() >= deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Private data of `len` bytes, different each time.
fn cm_data(rng: &mut Rng, len: usize) -> Vec<u8> {
    let seed = rng.next_u64();
    (0..len).map(|i| (seed >> (8 * (i % 8))) as u8 ^ i as u8).collect()
}

impl Round<'_> {
    fn cm_step(&mut self) {
        self.cm_touched = true;
        match self.rng.below(100) {
            0..=11 => {
                self.cm_listen();
            }
            12..=56 => self.cm_connect(),
            57..=63 => self.cm_connect_nobody(),
            64..=67 => self.cm_time_out(),
            68..=70 => self.cm_unreachable(),
            71..=92 => self.cm_disconnect(),
            _ => {
                if let Some(l) = Self::pick(&mut self.rng, &self.listeners) {
                    self.drop_listener(l);
                }
            }
        }
    }

    fn cm_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.cm_ip.expect("the CM is available"), port)
    }

    /// The round's objects on the CM's device, made from the first id bound to it.
    fn cm_side(&mut self, ctx: Result<Context>) -> bool {
        if self.cm.is_some() {
            return true;
        }
        self.call("cm_context");
        let ctx = match ctx {
            Ok(ctx) => ctx,
            Err(e) => {
                let k = self.error(&e);
                step!(self, "cm: context -> {k}");
                return false;
            }
        };
        let pd = ctx.alloc_pd().expect("alloc_pd on the CM's device");
        let mut target = pd
            .alloc_remote_mr(TARGET_LEN, access_all())
            .expect("a target region on the CM's device");
        let pattern: Vec<u8> = (0..ATOMIC_AREA - READ_AREA).map(read_pattern).collect();
        target.write(READ_AREA, &pattern).expect("in the region");
        step!(self, "cm: the CM's device is {}", ctx.device().name);
        self.cm = Some(CmSide { ctx, pd, target });
        true
    }

    fn cm_listen(&mut self) -> Option<usize> {
        if Self::live(&self.listeners).len() >= MAX_LISTENERS {
            return Self::pick(&mut self.rng, &self.listeners);
        }
        if self.rng.chance(5) {
            self.call("cm_listen");
            let r = Listener::bind("127.0.0.1:7701".parse().expect("an address"));
            let e = r.expect_err("the RDMA CM takes no loopback address");
            let k = self.error(&e);
            assert!(matches!(e, Error::Loopback { .. }), "a loopback bind: {e:?}");
            step!(self, "cm: listen on 127.0.0.1 -> {k}");
            return None;
        }
        let port = CM_PORTS[self.rng.below(CM_PORTS.len() as u64) as usize];
        let taken = self.listeners.iter().flatten().any(|(_, p)| *p == port);
        self.call("cm_listen");
        match Listener::bind(self.cm_addr(port)) {
            Ok(l) => {
                assert!(!taken, "cm: a second listener on port {port}");
                self.listeners.push(Some((l, port)));
                step!(self, "cm: listen on {port} -> l{}", self.listeners.len() - 1);
                Some(self.listeners.len() - 1)
            }
            Err(e) => {
                let k = self.error(&e);
                step!(self, "cm: listen on {port} -> {k}");
                None
            }
        }
    }

    fn drop_listener(&mut self, l: usize) {
        let (listener, port) = self.listeners[l].take().expect("live");
        self.call("cm_listener_drop");
        drop(listener);
        step!(self, "cm: l{l} (port {port}) dropped");
    }

    /// Resolves `addr` on a new connector, bounded by `timeout` a step.
    fn cm_resolve(&mut self, addr: SocketAddr, timeout: Duration) -> Option<Connector> {
        self.call("cm_resolve");
        match Connector::resolve(addr, timeout) {
            Ok(c) => {
                let ctx = c.context();
                self.cm_side(ctx).then_some(c)
            }
            Err(e) => {
                let k = self.error(&e);
                step!(self, "cm: resolve {addr} -> {k}");
                None
            }
        }
    }

    fn conn_param<'d>(&mut self, data: &'d [u8]) -> ConnParam<'d> {
        let small = |rng: &mut Rng| rng.chance(50).then(|| rng.below(5) as u8);
        ConnParam {
            private_data: data,
            responder_resources: small(&mut self.rng),
            initiator_depth: small(&mut self.rng),
            flow_control: self.rng.chance(50),
            retry_count: if self.rng.chance(3) { 8 } else { self.rng.below(8) as u8 },
            rnr_retry_count: self.rng.below(8) as u8,
            ack_timeout: self.rng.chance(50).then(|| 12 + self.rng.below(8) as u8),
        }
    }

    /// A QP on the CM's device for one end, in a slot of its own while receives are posted
    /// on it before the connect or accept (`init_qp` first), then taken out for the CM: the
    /// slot's index, the QP and the receives it holds.
    fn cm_qp(&mut self, init: impl FnOnce(&mut Qp) -> Result<()>) -> Option<(usize, Qp, VecDeque<Key>)> {
        let i = self.create_qp_on(Kind::Rc, None, true)?;
        if self.rng.chance(50) {
            self.call("cm_init_qp");
            let r = init(&mut self.qps[i].as_mut().expect("live").qp);
            let k = match &r {
                Ok(()) => "ok".to_string(),
                Err(e) => self.error(e),
            };
            step!(self, "qp{i}: cm init_qp -> {k}");
            if r.is_ok() {
                for _ in 0..self.rng.below(5) {
                    self.recv_buf(i);
                }
            }
        }
        let slot = self.qps[i].take().expect("live");
        let Handle::Plain(qp) = slot.qp else {
            unreachable!("made plain")
        };
        Some((i, qp, slot.recvs))
    }

    /// An end that came up goes into slot `i`; one that did not took its QP down with it.
    fn cm_end(
        &mut self,
        i: usize,
        held: (usize, usize),
        recvs: VecDeque<Key>,
        r: Option<Result<Connection>>,
        peer: u32,
        who: &str,
    ) -> bool {
        match r {
            Some(Ok(conn)) => {
                assert_eq!(conn.qp().state(), QpState::Rts, "qp{i}: the {who}'s established QP");
                assert_eq!(conn.qp().held_bufs(), held, "qp{i}: the {who}'s buffers");
                self.stats.cm_connections += 1;
                step!(self, "qp{i}: the {who} is connected (qpn {})", conn.qp().qpn());
                self.qps[i] = Some(QpSlot {
                    qp: Handle::Conn(Box::new(conn)),
                    cm: true,
                    kind: Kind::Rc,
                    peer,
                    srq: None,
                    sends: VecDeque::new(),
                    recvs,
                    link_up: true,
                });
                true
            }
            Some(Err(e)) => {
                let k = self.error(&e);
                self.qp_gone(i, None, held, &format!("({who}) failed: {k}"));
                false
            }
            None => {
                self.call("cm_dropped_in_flight");
                self.qp_gone(i, None, held, &format!("({who}) dropped on its way up"));
                false
            }
        }
    }

    /// A client connects to a listener; the listener takes the request and accepts, rejects,
    /// drops it, or goes away; either end may be dropped on its way up.
    fn cm_connect(&mut self) {
        if Self::live(&self.qps).len() + 2 > MAX_QPS {
            return;
        }
        let Some(l) = self.cm_listen() else { return };
        let port = self.listeners[l].as_ref().expect("live").1;
        let addr = self.cm_addr(port);
        let Some(connector) = self.cm_resolve(addr, Duration::from_secs(2)) else {
            return;
        };
        let from = connector.id().query_addr().ok().and_then(|a| a.src);
        let Some((ci, qp, crecvs)) = self.cm_qp(|qp| connector.id().init_qp(qp)) else {
            return;
        };
        let cqpn = qp.qpn();
        let len = if self.rng.chance(8) {
            57 + self.rng.below(4)
        } else {
            self.rng.below(57)
        } as usize;
        let cdata = cm_data(&mut self.rng, len);
        let param = self.conn_param(&cdata);
        let cheld = qp.held_bufs();
        self.call("cm_start_connect");
        let mut client = match connector.start_connect(qp, &param) {
            Ok(e) => Some(e),
            Err(uverbs::cm::ConnectFailed { error: e, qp }) => {
                drop(qp);
                let k = self.error(&e);
                step!(self, "qp{ci}: cm connect to {addr} ({len} bytes, {param:?}) -> {k}");
                assert!(len <= 56 || matches!(e, Error::PrivateDataTooLong { .. }), "{e:?}");
                self.qp_gone(ci, None, cheld, "dropped with its failed connect");
                return;
            }
        };
        step!(self, "qp{ci}: cm connect to {addr} ({len} bytes) sent");
        // The listener's side: its request (stale ones of clients gone are dropped).
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut req = None;
        while Instant::now() < deadline {
            self.call("cm_try_request");
            let Some((listener, _)) = self.listeners[l].as_ref() else {
                break;
            };
            match listener.try_request() {
                Ok(Some(r)) => {
                    let dst = r.query_addr().ok().and_then(|a| a.dst);
                    if dst.is_some() && dst == from {
                        req = Some(r);
                        break;
                    }
                    step!(self, "cm: l{l}: a stale request (from {dst:?}) dropped");
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => {
                    let k = self.error(&e);
                    step!(self, "cm: l{l}: try_request -> {k}");
                }
            }
        }
        let mut server = None;
        let mut server_end = None;
        let mut rejected = None;
        match (req, self.rng.below(100)) {
            (None, _) => step!(self, "cm: l{l}: no request came"),
            (Some(req), 0..=69) => {
                assert_eq!(&req.private_data[..len], &cdata[..], "the request's private data");
                self.call("cm_request_context");
                let same = req.context().map(|c| c.device().name.clone());
                let cm_dev = self.cm.as_ref().expect("the CM side").ctx.device().name.clone();
                assert_eq!(same.as_ref().ok(), Some(&cm_dev), "the request's device");
                if let Some((si, qp, srecvs)) = self.cm_qp(|qp| req.init_qp(qp)) {
                    let slen = if self.rng.chance(8) {
                        197 + self.rng.below(4)
                    } else {
                        self.rng.below(197)
                    } as usize;
                    let sdata = cm_data(&mut self.rng, slen);
                    let sparam = self.conn_param(&sdata);
                    let sheld = qp.held_bufs();
                    let sqpn = qp.qpn();
                    self.call("cm_start_accept");
                    match req.start_accept(qp, &sparam) {
                        Ok(e) => {
                            step!(self, "qp{si}: cm accept ({slen} bytes) sent");
                            server = Some(e);
                            server_end = Some((si, sheld, srecvs, sqpn, sdata));
                        }
                        Err(e) => {
                            let k = self.error(&e);
                            step!(self, "qp{si}: cm accept ({slen} bytes, {sparam:?}) -> {k}");
                            assert!(slen <= 196 || matches!(e, Error::PrivateDataTooLong { .. }), "{e:?}");
                            self.qp_gone(si, None, sheld, "dropped with its failed accept");
                        }
                    }
                }
            }
            (Some(req), 70..=84) => {
                let rlen = if self.rng.chance(10) { 149 } else { self.rng.below(149) } as usize;
                let rdata = cm_data(&mut self.rng, rlen);
                self.call("cm_reject");
                let r = req.reject(&rdata);
                let k = match &r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => self.error(e),
                };
                step!(self, "cm: l{l}: reject ({rlen} bytes) -> {k}");
                assert_eq!(r.is_ok(), rlen <= 148, "reject with {rlen} bytes: {r:?}");
                if r.is_ok() {
                    rejected = Some(rdata);
                }
            }
            (Some(req), 85..=92) => {
                self.call("cm_request_drop");
                drop(req);
                step!(self, "cm: l{l}: request dropped");
            }
            (Some(req), _) => {
                // The listener goes, then the request it handed out.
                self.drop_listener(l);
                drop(req);
            }
        }
        // Either end dropped on its way up, sometimes.
        if self.rng.chance(4) {
            client = None;
            step!(self, "qp{ci}: the connect dropped in flight");
        }
        if server.is_some() && self.rng.chance(4) {
            server = None;
            step!(self, "cm: the accept dropped in flight");
        }
        let had = [client.is_some(), server.is_some()];
        let deadline = Instant::now() + Duration::from_secs(2);
        let [c, s] = drive(Rng::new(self.rng.next_u64()), [&mut client, &mut server], deadline);
        if let (Some(data), Some(Err(Error::Rejected { status, private_data }))) = (&rejected, &c) {
            assert_eq!(*status, 28, "a consumer reject's reason");
            assert_eq!(&private_data[..data.len()], &data[..], "the reject's private data");
        }
        if rejected.is_some() {
            assert!(!matches!(c, Some(Ok(_))), "rejected, yet connected");
        }
        if let (Some(Ok(conn)), Some((_, _, _, _, sdata))) = (&c, &server_end) {
            assert_eq!(
                &conn.peer_private_data()[..sdata.len()],
                &sdata[..],
                "the accept's private data"
            );
        }
        let c = if had[0] { c } else { None };
        let speer = server_end.as_ref().map_or(0, |e| e.3);
        self.cm_end(ci, cheld, crecvs, c, speer, "client");
        if let Some((si, sheld, srecvs, _, _)) = server_end {
            let s = if had[1] { s } else { None };
            self.cm_end(si, sheld, srecvs, s, cqpn, "server");
        }
    }

    /// A connect where nothing listens: a typed reject.
    fn cm_connect_nobody(&mut self) {
        let addr = self.cm_addr(CM_PORT_NOBODY);
        let Some(connector) = self.cm_resolve(addr, Duration::from_secs(2)) else {
            return;
        };
        let Some((i, qp, _)) = self.cm_qp(|qp| connector.id().init_qp(qp)) else {
            return;
        };
        let held = qp.held_bufs();
        self.call("cm_connect");
        let r = connector.connect(qp, &ConnParam::default(), Duration::from_secs(2));
        let e = r.expect_err("a connect where nothing listens").error;
        let k = self.error(&e);
        step!(self, "qp{i}: cm connect to {addr}, nobody there -> {k}");
        assert!(matches!(e, Error::Rejected { status: 8, .. }), "no listener: {e:?}");
        self.qp_gone(i, None, held, "dropped with its rejected connect");
    }

    /// A connect nobody answers: a listener that never takes the request, or an address with
    /// no host behind it (the dummy netdev is NOARP). A typed timeout.
    fn cm_time_out(&mut self) {
        let listener = self.rng.chance(50).then(|| self.cm_listen()).flatten();
        let addr = match listener {
            Some(l) => self.cm_addr(self.listeners[l].as_ref().expect("live").1),
            None => {
                let IpAddr::V4(ip) = self.cm_ip.expect("the CM") else {
                    return;
                };
                let [a, b, c, d] = ip.octets();
                SocketAddr::new(IpAddr::from([a, b, c, d.wrapping_add(98)]), 7711)
            }
        };
        let Some(connector) = self.cm_resolve(addr, Duration::from_secs(2)) else {
            return;
        };
        let Some((i, qp, _)) = self.cm_qp(|qp| connector.id().init_qp(qp)) else {
            return;
        };
        let held = qp.held_bufs();
        let t = Duration::from_millis(50 + self.rng.below(150));
        self.call("cm_connect");
        let r = connector.connect(qp, &ConnParam::default(), t);
        let e = r.expect_err("a connect nobody answers").error;
        let k = self.error(&e);
        step!(self, "qp{i}: cm connect to {addr}, unanswered, {t:?} -> {k}");
        assert!(
            matches!(e, Error::TimedOut { verb: "connect", .. }),
            "unanswered: {e:?}"
        );
        self.qp_gone(i, None, held, "dropped with its connect timed out");
        // The request left on the listener: taken and dropped, or left for later.
        if let Some(l) = listener.filter(|_| self.rng.chance(70)) {
            let listener = &self.listeners[l].as_ref().expect("live").0;
            let r = listener.get_request(Duration::from_millis(20));
            self.call("cm_get_request");
            let k = match &r {
                Ok(_) => "a request, dropped".to_string(),
                Err(e) => self.error(e),
            };
            step!(self, "cm: l{l}: get_request -> {k}");
        }
    }

    /// An address no route leads to: a typed error from the resolution.
    fn cm_unreachable(&mut self) {
        let addr: SocketAddr = "169.254.178.1:7712".parse().expect("an address");
        self.call("cm_resolve");
        let r = Connector::resolve(addr, Duration::from_millis(100));
        let e = r.expect_err("no route to 169.254.178.1");
        let k = self.error(&e);
        step!(self, "cm: resolve {addr} -> {k}");
    }

    /// The live connections' slots.
    fn conns(&self) -> Vec<usize> {
        Self::live(&self.qps)
            .into_iter()
            .filter(|&i| matches!(self.qps[i].as_ref().expect("live").qp, Handle::Conn(_)))
            .collect()
    }

    fn conn(&mut self, i: usize) -> &mut Connection {
        match &mut self.qps[i].as_mut().expect("live").qp {
            Handle::Conn(c) => c,
            Handle::Plain(_) => unreachable!("a connection"),
        }
    }

    /// Marks connection `i` as touched by a disconnect; whether it was untouched until now.
    fn link_down(&mut self, i: usize) -> bool {
        std::mem::replace(&mut self.qps[i].as_mut().expect("live").link_up, false)
    }

    /// A disconnect from either side, waited for or not, both at once, or a poll.
    fn cm_disconnect(&mut self) {
        let conns = self.conns();
        if conns.is_empty() {
            return;
        }
        let i = conns[self.rng.below(conns.len() as u64) as usize];
        let peer = self.qps[i].as_ref().expect("live").peer;
        // The other end, if it is a live connection of the round on the CM's device.
        let p = conns
            .iter()
            .copied()
            .find(|&p| p != i && self.qps[p].as_ref().expect("live").qp.qpn() == peer);
        let how = self.rng.below(6);
        let mut outcome = Vec::new();
        let start = |r: &mut Self, k: usize| {
            r.call("cm_start_disconnect");
            let was_up = r.link_down(k);
            let res = r.conn(k).start_disconnect();
            if res.is_ok() && was_up {
                assert_eq!(r.conn(k).qp().state(), QpState::Err, "qp{k}: disconnecting, so in ERR");
            }
            match res {
                Ok(()) => format!("qp{k}: start_disconnect ok"),
                Err(e) => format!("qp{k}: start_disconnect {}", r.error(&e)),
            }
        };
        match how {
            0..=2 => {
                outcome.push(start(self, i));
                if how == 1 {
                    if let Some(p) = p {
                        outcome.push(start(self, p));
                    }
                }
                if how <= 1 {
                    // Both ends advance until each has seen DISCONNECTED.
                    let deadline = Instant::now() + Duration::from_millis(1500);
                    let mut left: Vec<usize> = [Some(i), p].into_iter().flatten().collect();
                    // Its own draws: how many polls it takes depends on timing.
                    let mut order = Rng::new(self.rng.next_u64());
                    while !left.is_empty() && Instant::now() < deadline {
                        let k = left[order.below(left.len() as u64) as usize];
                        self.call("cm_advance");
                        match self.conn(k).advance() {
                            Ok(true) => {
                                self.link_down(k);
                                left.retain(|&x| x != k);
                                outcome.push(format!("qp{k}: down"));
                            }
                            Ok(false) => std::thread::sleep(Duration::from_millis(1)),
                            Err(e) => {
                                self.link_down(k);
                                left.retain(|&x| x != k);
                                let kind = self.error(&e);
                                outcome.push(format!("qp{k}: advance {kind}"));
                            }
                        }
                    }
                    if !left.is_empty() {
                        outcome.push(format!("{left:?} not down in time"));
                    }
                }
            }
            3 => {
                let t = Duration::from_millis(20 + self.rng.below(80));
                self.call("cm_disconnect");
                self.link_down(i);
                let r = self.conn(i).disconnect(t);
                let k = match &r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => self.error(e),
                };
                outcome.push(format!("qp{i}: disconnect({t:?}) -> {k}"));
            }
            4 => {
                self.call("cm_wait_disconnected");
                self.link_down(i);
                let r = self.conn(i).wait_disconnected(Duration::ZERO);
                let k = match &r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => self.error(e),
                };
                outcome.push(format!("qp{i}: wait_disconnected(0) -> {k}"));
            }
            _ => {
                self.call("cm_advance");
                let r = self.conn(i).advance();
                if !matches!(r, Ok(false)) {
                    self.link_down(i);
                }
                let k = match &r {
                    Ok(down) => format!("{down}"),
                    Err(e) => self.error(e),
                };
                outcome.push(format!("qp{i}: advance -> {k}"));
            }
        }
        step!(self, "cm disconnect (peer qp{p:?}): {}", outcome.join("; "));
    }

    /// Every id of the round still answers: a forked child's drops destroyed none of them.
    fn check_cm_ids_alive(&mut self, when: &str) {
        for (listener, port) in self.listeners.iter().flatten() {
            let a = listener.local_addr();
            assert!(
                matches!(a, Ok(a) if a.port() == *port),
                "a listener on {port} {when}: {a:?}"
            );
        }
        for i in self.conns() {
            let a = self.conn(i).id().query_addr();
            assert!(a.is_ok(), "qp{i}'s connection {when}: {a:?}");
        }
    }

    fn cm_used(&self) -> bool {
        self.cm_touched
    }
}

fn run_round(seed: u64, stats: &mut Stats, log: &mut Log) {
    let mut r = Round::new(seed, stats, log);
    let steps = 50 + r.rng.below(250);
    for _ in 0..steps {
        r.step();
    }
    r.teardown();
}

/// Kernel log lines of a bug or warning (as the guest harness looks for), read from
/// `/dev/kmsg` where this process may (root in the test guest); nothing elsewhere.
struct Kmsg(Option<std::fs::File>);

const KERNEL_SIGNS: &[&str] = &[
    "BUG:",
    "WARNING:",
    "Oops",
    "general protection fault",
    "UBSAN:",
    "KASAN:",
    "Kernel panic",
];

impl Kmsg {
    fn open() -> Self {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()
            .and_then(|mut f| f.seek(SeekFrom::End(0)).ok().map(|_| f));
        Self(file)
    }

    /// The new records that report a problem.
    fn problems(&mut self) -> Vec<String> {
        use std::io::Read;
        let Some(f) = &mut self.0 else { return Vec::new() };
        let mut out = Vec::new();
        let mut record = vec![0u8; 8192];
        loop {
            match f.read(&mut record) {
                Ok(0) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&record[..n]);
                    if KERNEL_SIGNS.iter().any(|s| text.contains(s)) {
                        out.push(text.trim_end().to_string());
                    }
                }
                // EPIPE: records were overwritten before they were read; go on from here.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break,
            }
        }
        out
    }

    fn present(&self) -> bool {
        self.0.is_some()
    }
}

#[test]
fn random_safe_calls_lose_no_buffer_and_never_panic() {
    let seed = env_u64("UVERBS_SAFE_FUZZ_SEED", DEFAULT_SEED);
    // A time budget where one is asked for (to explore); else a fixed number of rounds, the
    // same ones on every machine, with the time cap as the only bound a slow one may hit.
    let seconds = std::env::var_os("UVERBS_SAFE_FUZZ_SECONDS").map(|_| env_u64("UVERBS_SAFE_FUZZ_SECONDS", 0));
    let rounds = match (std::env::var_os("UVERBS_SAFE_FUZZ_ROUNDS"), seconds) {
        (Some(_), _) => env_u64("UVERBS_SAFE_FUZZ_ROUNDS", 0),
        (None, Some(_)) => u64::MAX,
        (None, None) => match driver(&open_test_device()) {
            common::Driver::Rxe | common::Driver::Siw => DEFAULT_ROUNDS_RXE,
            common::Driver::Mlx5 => DEFAULT_ROUNDS_MLX5,
        },
    };
    let budget = Duration::from_secs(seconds.unwrap_or(ROUNDS_CAP_SECONDS));
    let only = std::env::var("UVERBS_SAFE_FUZZ_ROUND")
        .ok()
        .map(|_| env_u64("UVERBS_SAFE_FUZZ_ROUND", 0));
    let trace = std::env::var_os("UVERBS_SAFE_FUZZ_TRACE").is_some_and(|v| v != "0");
    let start = Instant::now();
    let mut stats = Stats {
        cm: cm_available(),
        ..Default::default()
    };
    let mut kmsg = Kmsg::open();
    let mut round = only.unwrap_or(0);
    loop {
        let mut log = Log::new(trace);
        let rseed = round_seed(seed, round);
        if trace {
            figure(format_args!("safe_fuzz: round {round}, seed {seed:#x}"));
        }
        let r = catch_unwind(AssertUnwindSafe(|| run_round(rseed, &mut stats, &mut log)));
        let kernel = kmsg.problems();
        if r.is_err() || !kernel.is_empty() {
            eprintln!(
                "safe_fuzz: round {round} failed; replay: UVERBS_SAFE_FUZZ_SEED={seed:#x} UVERBS_SAFE_FUZZ_ROUND={round}\nlast {} steps:\n{}",
                log.lines.len(),
                Vec::from(log.lines.clone()).join("\n")
            );
            if !kernel.is_empty() {
                eprintln!("kernel log:\n{}", kernel.join("\n"));
            }
            match r {
                Err(panic) => resume_unwind(panic),
                Ok(()) => panic!("round {round} (seed {seed:#x}): the kernel logged a problem: {kernel:?}"),
            }
        }
        stats.rounds += 1;
        round += 1;
        if only.is_some() || stats.rounds >= rounds {
            break;
        }
        if start.elapsed() >= budget {
            if rounds != u64::MAX {
                figure(format_args!(
                    "safe_fuzz: stopped at the {} s cap after {} of {rounds} rounds",
                    budget.as_secs(),
                    stats.rounds
                ));
            }
            break;
        }
    }
    let calls: u64 = stats.calls.values().sum();
    let cm_calls: u64 = stats
        .calls
        .iter()
        .filter(|(k, _)| k.starts_with("cm_"))
        .map(|(_, v)| v)
        .sum();
    let cm = match &stats.cm {
        Ok(ip) => format!(
            "CM on {ip}: {cm_calls} calls, {} ends connected, {:.1} s ({:.0}% of the run)",
            stats.cm_connections,
            stats.cm_time.as_secs_f64(),
            100.0 * stats.cm_time.as_secs_f64() / start.elapsed().as_secs_f64()
        ),
        Err(why) => format!("CM steps skipped ({why}), {cm_calls} CM calls"),
    };
    let errors: u64 = stats.errors.values().sum();
    fn list<K: std::fmt::Display>(m: &BTreeMap<K, u64>) -> String {
        m.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
    }
    figure(format_args!(
        "safe_fuzz (seed {seed:#x}, {:.0} s): {} rounds, {calls} calls ({}), {errors} typed errors ({}), \
         {} bufs tracked ({} given back, {} went down with their queue), {} completions, {} payloads checked, \
         {} raw ops refused, {} forks, {cm}, kernel log {}",
        start.elapsed().as_secs_f64(),
        stats.rounds,
        list(&stats.calls),
        list(&stats.errors),
        stats.bufs,
        stats.returned,
        stats.dropped_held,
        stats.completions,
        stats.payloads,
        stats.raw_refused,
        stats.forks,
        if kmsg.present() { "watched" } else { "not readable" },
    ));
}

/// The RDMA CM's address (`UVERBS_CM_ADDR`, which the test guest sets for rxe_cm on a dummy
/// netdev: the CM takes no loopback address), or why there is none (the mlx5 model has no
/// CM).
fn cm_available() -> std::result::Result<IpAddr, String> {
    let ip = std::env::var("UVERBS_CM_ADDR").map_err(|_| "UVERBS_CM_ADDR is not set: no RDMA CM device".to_string())?;
    let ip: IpAddr = ip.parse().map_err(|e| format!("UVERBS_CM_ADDR={ip:?}: {e}"))?;
    uverbs::cm::EventChannel::open().map_err(|e| format!("no RDMA CM: {e}"))?;
    Ok(ip)
}

/// `fork()`, `waitpid()` and `_exit()`: the only `unsafe` of this test.
#[allow(unsafe_code)]
mod process {
    pub fn fork() -> libc::pid_t {
        // SAFETY: the child only drops the objects it inherited (the library refuses every
        // verb in a child and its drops destroy nothing) and `_exit`s; glibc's malloc is
        // usable after fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        pid
    }

    /// The child's exit status, or the signal that killed it.
    pub fn wait(pid: libc::pid_t) -> Result<i32, i32> {
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        if libc::WIFEXITED(status) {
            Ok(libc::WEXITSTATUS(status))
        } else {
            Err(libc::WTERMSIG(status))
        }
    }

    pub fn exit_child(code: i32) -> ! {
        // SAFETY: ends the child without running destructors, atexit handlers or the test
        // harness's remaining code.
        unsafe { libc::_exit(code) }
    }
}
