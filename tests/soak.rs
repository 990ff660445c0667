//! Soak with exact accounting: mixed work requests (send, send with immediate, RDMA write,
//! write with immediate, read, compare-and-swap, fetch-and-add; 0 to 64 KiB, one or two
//! SGEs, some inline) over 8 RC QPs (4 connected pairs, traffic both ways) that share one
//! send CQ and one receive CQ.
//!
//! Every work request's completion is matched to what was posted: each wr_id completes exactly
//! once, in order per QP, with the expected status, opcode and length; every byte moved is
//! compared with what was sent (destinations are poisoned first, so stale data cannot pass);
//! every atomic's returned value is checked against a model of the remote word, and the words
//! are checked again at the end.
//!
//! The same source runs on rxe (the QPs connected by hand over the loopback path) and on siw
//! (`xtask/guest/with_siw.sh`: iWARP QPs reach RTS only through the connection manager, so
//! each pair is connected by `uverbs::cm`, and the pairs are disconnected at the end). What
//! the device's provider refuses of the mix (siw: immediate data, atomics, READ with more than
//! one SGE) is posted once first and each refusal checked; the run then mixes the rest.
//!
//! `UVERBS_SOAK_WRS` sets how many send-queue work requests (default 500,000 on rxe and
//! 100,000 on siw, which moves a third to a half of rxe's rate in the test guest: the CI runs);
//! `UVERBS_SOAK_SEED` the seed. The full 10 million run and its figures: docs/reliability.md.

mod common;
mod figures;

use common::link::{connect_pairs, to_error, Linked};
use common::*;
use figures::figure;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use uverbs::testing::Rng;
use uverbs::*;

const QPS: usize = 8;
/// Largest message, and the size of every buffer slot.
const SLOT: usize = 64 << 10;
/// Send-queue work requests in flight per QP.
const WINDOW: usize = 16;
/// Receives posted per QP.
const RECV_DEPTH: usize = 32;
const MAX_INLINE: u32 = 64;
/// Each QP's MR: send/read/atomic-result slots, then receive slots, then the slots its peer
/// writes and reads, then the word its peer's atomics hit.
const LOCAL: usize = 0;
const INBOX: usize = LOCAL + WINDOW * SLOT;
const EXPOSED: usize = INBOX + RECV_DEPTH * SLOT;
const ATOMIC: usize = EXPOSED + WINDOW * SLOT;
const MR_LEN: usize = ATOMIC + 4096;
const POISON: u8 = 0xee;
/// Receive wr_ids have this bit; the QP index is in the top byte.
const RECV_BIT: u64 = 1 << 55;
const SEQ_MASK: u64 = RECV_BIT - 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    CmpSwap,
    FetchAdd,
}

const KINDS: [Kind; 7] = [
    Kind::Send,
    Kind::SendImm,
    Kind::Write,
    Kind::WriteImm,
    Kind::Read,
    Kind::CmpSwap,
    Kind::FetchAdd,
];

impl Kind {
    fn consumes_receive(self) -> bool {
        matches!(self, Kind::Send | Kind::SendImm | Kind::WriteImm)
    }

    fn opcode(self) -> WcOpcode {
        match self {
            Kind::Send | Kind::SendImm => WcOpcode::SEND,
            Kind::Write | Kind::WriteImm => WcOpcode::RDMA_WRITE,
            Kind::Read => WcOpcode::RDMA_READ,
            Kind::CmpSwap => WcOpcode::COMP_SWAP,
            Kind::FetchAdd => WcOpcode::FETCH_ADD,
        }
    }
}

/// A message size: 0, tiny, small, medium or large (up to 64 KiB), weighted towards small so
/// the run moves many messages without spending all its time copying.
fn message_size(rng: &mut Rng) -> usize {
    (match rng.below(100) {
        0..=3 => 0,
        4..=43 => 1 + rng.below(64),
        44..=75 => 65 + rng.below(1024 - 64),
        76..=94 => 1025 + rng.below(8192 - 1024),
        _ => 8193 + rng.below(SLOT as u64 - 8192),
    }) as usize
}

/// A registered region, reached through raw pointers: the device writes parts of it while the
/// test reads others, so no reference to the whole region is ever made.
#[derive(Clone, Copy)]
struct Mem {
    base: *mut u8,
}

impl Mem {
    /// # Safety
    /// No work request in flight may access `off..off + len`, and no other slice of the range
    /// may be live.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= MR_LEN);
        // SAFETY: inside the MR (asserted); exclusivity per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(off), len) }
    }

    fn read_u64(&self, off: usize) -> u64 {
        // SAFETY: inside the MR, 8-aligned; read only when no atomic on it is in flight.
        unsafe { self.base.add(off).cast::<u64>().read_volatile() }
    }

    fn write_u64(&self, off: usize, v: u64) {
        // SAFETY: as in `read_u64`.
        unsafe { self.base.add(off).cast::<u64>().write_volatile(v) }
    }
}

/// A posted send-queue request and how to check its completion.
#[derive(Debug)]
struct Pending {
    seq: u64,
    kind: Kind,
    len: usize,
    /// Pieces of the message: (offset in the local slot, logical offset, length).
    pieces: [(usize, usize, usize); 2],
    npieces: usize,
    pool_off: usize,
    /// For atomics: the value the remote word held (the expected result).
    old: u64,
}

/// A message the peer will deliver into one of our receives.
#[derive(Debug)]
struct Incoming {
    /// The sender's sequence number.
    seq: u64,
    kind: Kind,
    len: usize,
    pool_off: usize,
    imm: u32,
}

struct QpRun {
    link: Linked,
    mr: RemoteMr,
    mem: Mem,
    rng: Rng,
    posted: u64,
    /// Posted requests not completed yet, in posting order.
    pending: VecDeque<Pending>,
    /// WRITEs completed by a device that completes them once sent (siw), in order: their bytes
    /// are checked once they are known to be placed at the peer.
    unplaced: VecDeque<Pending>,
    /// Receives posted on this QP, and completed.
    recv_posted: u64,
    recv_done: u64,
    /// Messages the peer sent that consume our receives, in order.
    incoming: VecDeque<Incoming>,
    /// Receive-consuming requests this QP has sent to its peer.
    sent_to_peer: u64,
    /// The peer's atomic word, as this QP's atomics should have left it.
    atomic_model: u64,
}

#[derive(Default, Debug)]
struct Tally {
    by_kind: [u64; 7],
    send_completions: u64,
    recv_completions: u64,
    duplicated: u64,
    invented: u64,
    out_of_order: u64,
    bad_status: u64,
    bad_opcode_or_len: u64,
    bad_payload: u64,
    bad_atomic: u64,
    payloads_checked: u64,
    bytes_checked: u64,
    atomics_checked: u64,
}

struct Soak {
    qps: Vec<QpRun>,
    pool: Vec<u8>,
    tally: Tally,
    inline_cap: u32,
    /// The kinds the device takes, and the most SGEs its READs take.
    kinds: Vec<Kind>,
    read_sges: usize,
    /// The shortest READ the run posts: 1 on siw, whose responder answers a zero-length READ
    /// it queued behind other transmissions with the previous transmission's length, which
    /// ends the connection (docs/kernel-facts.md); 0 elsewhere.
    read_min_len: usize,
    /// The device completes SENDs and WRITEs when it has sent them, READs when their response
    /// arrived (siw, whose completions mean "the buffer may be reused", as iWARP's verbs
    /// define them; docs/kernel-facts.md): a READ then completes after requests posted after
    /// it, and a WRITE's bytes are known to be at the peer only once a later READ of the same
    /// QP completed, the peer received a later SEND of it, or the connection closed (the
    /// peer processes the byte stream in order).
    sent_completes: bool,
}

/// What the provider of `ctx`'s device refuses of the mix before the device sees it: siw
/// has no immediate data, no atomics and one SGE per READ (docs/verbs.md). Returns the kinds
/// it takes and the SGEs a READ may have.
fn supported(ctx: &Context) -> (Vec<Kind>, usize) {
    match driver(ctx) {
        Driver::Siw => (vec![Kind::Send, Kind::Write, Kind::Read], 1),
        Driver::Rxe | Driver::Mlx5 => (KINDS.to_vec(), 2),
    }
}

/// Posts each kind of the mix the device does not take, once, on `qp` and checks that the
/// provider refuses it with the reason it should, before anything reaches the device (the
/// run's accounting then sees no completion for them).
fn check_refusals(soak: &mut Soak, q: usize) {
    let peer = Soak::peer(q);
    let (addr, rkey) = (soak.qps[peer].mr.addr(), soak.qps[peer].mr.rkey());
    let remote = Remote {
        addr: addr + EXPOSED as u64,
        rkey,
    };
    let atomic = Remote {
        addr: addr + ATOMIC as u64,
        rkey,
    };
    let s = &mut soak.qps[q];
    let one = [s.mr.sge(LOCAL, 8).unwrap()];
    let two = [s.mr.sge(LOCAL, 8).unwrap(), s.mr.sge(LOCAL + 64, 8).unwrap()];
    let mut wrs: Vec<(SendWr<'_>, WrReject)> = Vec::new();
    for &kind in KINDS.iter().filter(|k| !soak.kinds.contains(k)) {
        let op = match kind {
            Kind::SendImm => SendOp::SendWithImm { imm: 1 },
            Kind::WriteImm => SendOp::RdmaWriteWithImm(remote, 1),
            Kind::CmpSwap => SendOp::CompareSwap {
                remote: atomic,
                compare: 0,
                swap: 1,
            },
            Kind::FetchAdd => SendOp::FetchAdd { remote: atomic, add: 1 },
            Kind::Send | Kind::Write | Kind::Read => unreachable!("every provider takes {kind:?}"),
        };
        wrs.push((SendWr::new(u64::MAX, op, &one), WrReject::OpcodeNotSupported));
    }
    if soak.read_sges < 2 {
        wrs.push((
            SendWr::new(u64::MAX, SendOp::RdmaRead(remote), &two),
            WrReject::TooManySge {
                given: 2,
                max: soak.read_sges as u32,
            },
        ));
    }
    for (wr, why) in wrs {
        // SAFETY: refused before anything is read or written.
        match unsafe { s.link.qp_mut().post_send(&[wr]) } {
            Err(Error::WorkRequest { index: 0, reason, .. }) => assert_eq!(reason, why, "{:?}", wr.op),
            other => panic!("{:?} should be refused ({why:?}): {other:?}", wr.op),
        }
    }
}

fn imm_for(q: usize, seq: u64) -> u32 {
    (seq as u32).wrapping_mul(2_654_435_761) ^ ((q as u32) << 24)
}

impl Soak {
    fn peer(q: usize) -> usize {
        q ^ 1
    }

    fn recv_sge(&self, q: usize, rseq: u64) -> Sge {
        let s = &self.qps[q];
        s.mr.sge(INBOX + (rseq as usize % RECV_DEPTH) * SLOT, SLOT as u32)
            .unwrap()
    }

    /// Posts receives on `q` until `RECV_DEPTH` are outstanding.
    fn refill_receives(&mut self, q: usize) {
        let s = &self.qps[q];
        let (from, to) = (s.recv_posted, s.recv_done + RECV_DEPTH as u64);
        if from >= to {
            return;
        }
        let sges: Vec<[Sge; 1]> = (from..to).map(|r| [self.recv_sge(q, r)]).collect();
        let wrs: Vec<RecvWr<'_>> = (from..to)
            .zip(&sges)
            .map(|(r, sge)| RecvWr::new(RECV_BIT | ((q as u64) << 56) | r, sge))
            .collect();
        let s = &mut self.qps[q];
        // SAFETY: the slots are not touched until their completions are polled.
        unsafe { s.link.qp_mut().post_recv(&wrs) }.expect("post_recv");
        s.recv_posted = to;
    }

    /// Posts up to the window's worth of new requests on `q`, in one list.
    fn post_batch(&mut self, q: usize, budget: &mut u64) {
        let peer = Self::peer(q);
        let peer_recv_posted = self.qps[peer].recv_posted;
        let (peer_addr, peer_rkey) = (self.qps[peer].mr.addr(), self.qps[peer].mr.rkey());
        let mut batch: Vec<(Pending, SendOp, [Sge; 2], bool)> = Vec::new();
        let mut new_incoming = Vec::new();
        {
            let s = &mut self.qps[q];
            // A slot is reused only when every older request's completion (and, for a WRITE
            // completed once sent, its placement) was seen.
            let oldest = [s.pending.front(), s.unplaced.front()]
                .into_iter()
                .flatten()
                .map(|p| p.seq)
                .min()
                .unwrap_or(s.posted);
            while *budget > 0 && s.posted + (batch.len() as u64) < oldest + WINDOW as u64 {
                let seq = s.posted + batch.len() as u64;
                let slot = LOCAL + (seq as usize % WINDOW) * SLOT;
                let target = EXPOSED + (seq as usize % WINDOW) * SLOT;
                let mut kind = self.kinds[s.rng.below(self.kinds.len() as u64) as usize];
                if kind.consumes_receive() && s.sent_to_peer >= peer_recv_posted {
                    kind = [Kind::Write, Kind::Read][s.rng.below(2) as usize];
                }
                if self.sent_completes && seq + 1 == oldest + WINDOW as u64 {
                    // The window's last slot: a READ, whose completion shows the WRITEs before
                    // it placed, so the window moves on.
                    kind = Kind::Read;
                }
                let atomic = matches!(kind, Kind::CmpSwap | Kind::FetchAdd);
                let len = match kind {
                    _ if atomic => 8,
                    Kind::Read => message_size(&mut s.rng).max(self.read_min_len),
                    _ => message_size(&mut s.rng),
                };
                let pool_off = s.rng.below(SLOT as u64) as usize;
                let split = !atomic
                    && (kind != Kind::Read || self.read_sges >= 2)
                    && (2..=SLOT - 64).contains(&len)
                    && s.rng.below(4) == 0;
                let mut p = Pending {
                    seq,
                    kind,
                    len,
                    pieces: [(slot, 0, len), (0, 0, 0)],
                    npieces: if len == 0 { 0 } else { 1 },
                    pool_off,
                    old: 0,
                };
                if split {
                    let a = 1 + s.rng.below(len as u64 - 1) as usize;
                    p.pieces = [(slot, 0, a), (slot + a + 64, a, len - a)];
                    p.npieces = 2;
                }
                let inline = matches!(kind, Kind::Send | Kind::SendImm | Kind::Write)
                    && len as u32 <= self.inline_cap
                    && s.rng.below(2) == 0;
                // Local side: fill what is sent, poison what the device will write.
                for &(off, logical, n) in &p.pieces[..p.npieces] {
                    // SAFETY: this slot's previous request completed (window), nothing in
                    // flight touches it.
                    let dst = unsafe { s.mem.bytes(off, n) };
                    match kind {
                        Kind::Read => dst.fill(POISON),
                        _ => dst.copy_from_slice(&self.pool[pool_off + logical..][..n]),
                    }
                }
                let remote = Remote {
                    addr: peer_addr + target as u64,
                    rkey: peer_rkey,
                };
                let atomic_word = Remote {
                    addr: peer_addr + ATOMIC as u64 + 8 * (q as u64 / 2),
                    rkey: peer_rkey,
                };
                let op = match kind {
                    Kind::Send => SendOp::Send,
                    Kind::SendImm => SendOp::SendWithImm { imm: imm_for(q, seq) },
                    Kind::Write => SendOp::RdmaWrite(remote),
                    Kind::WriteImm => SendOp::RdmaWriteWithImm(remote, imm_for(q, seq)),
                    Kind::Read => SendOp::RdmaRead(remote),
                    Kind::CmpSwap => {
                        let hit = s.rng.below(2) == 0;
                        let compare = if hit { s.atomic_model } else { s.atomic_model ^ 1 };
                        let swap = s.rng.next_u64();
                        p.old = s.atomic_model;
                        if hit {
                            s.atomic_model = swap;
                        }
                        SendOp::CompareSwap {
                            remote: atomic_word,
                            compare,
                            swap,
                        }
                    }
                    Kind::FetchAdd => {
                        let add = s.rng.next_u64() >> s.rng.below(64);
                        p.old = s.atomic_model;
                        s.atomic_model = s.atomic_model.wrapping_add(add);
                        SendOp::FetchAdd {
                            remote: atomic_word,
                            add,
                        }
                    }
                };
                if atomic {
                    s.mem.write_u64(slot, !p.old);
                }
                let mut sges = [Sge::default(); 2];
                for (i, &(off, _, n)) in p.pieces[..p.npieces].iter().enumerate() {
                    sges[i] = s.mr.sge(off, n as u32).unwrap();
                }
                if kind.consumes_receive() {
                    s.sent_to_peer += 1;
                    new_incoming.push(Incoming {
                        seq,
                        kind,
                        len,
                        pool_off,
                        imm: imm_for(q, seq),
                    });
                }
                batch.push((p, op, sges, inline));
                *budget -= 1;
            }
        }
        if batch.is_empty() {
            return;
        }
        // Remote side: poison what a write will fill, put the pattern where a read reads.
        for (p, _, _, _) in &batch {
            let target = EXPOSED + (p.seq as usize % WINDOW) * SLOT;
            // SAFETY: the peer's exposed slot for this window position is used only by this
            // QP's requests, and the previous one completed.
            let remote = unsafe { self.qps[peer].mem.bytes(target, p.len) };
            match p.kind {
                Kind::Write | Kind::WriteImm => remote.fill(POISON),
                Kind::Read => remote.copy_from_slice(&self.pool[p.pool_off..][..p.len]),
                _ => {}
            }
        }
        self.qps[peer].incoming.extend(new_incoming);
        let wrs: Vec<SendWr<'_>> = batch
            .iter()
            .map(|(p, op, sges, inline)| {
                let wr = SendWr::new(((q as u64) << 56) | p.seq, *op, &sges[..p.npieces]);
                if *inline {
                    wr.with(SendFlags::INLINE)
                } else {
                    wr
                }
            })
            .collect();
        let s = &mut self.qps[q];
        // SAFETY: every buffer named stays untouched until its completion is polled.
        unsafe { s.link.qp_mut().post_send(&wrs) }.expect("post_send");
        s.posted += batch.len() as u64;
        for (p, ..) in batch {
            self.tally.by_kind[KINDS.iter().position(|&k| k == p.kind).unwrap()] += 1;
            s.pending.push_back(p);
        }
    }

    fn on_send_completion(&mut self, wc: &WorkCompletion) {
        let q = (wc.wr_id >> 56) as usize;
        let seq = wc.wr_id & SEQ_MASK;
        if q >= QPS || wc.wr_id & RECV_BIT != 0 {
            self.tally.invented += 1;
            eprintln!("invented send completion {wc:?}");
            return;
        }
        let peer_mem = self.qps[Self::peer(q)].mem;
        let sent_completes = self.sent_completes;
        let t = &mut self.tally;
        let s = &mut self.qps[q];
        let Some(at) = s.pending.iter().position(|p| p.seq == seq) else {
            if seq < s.posted {
                t.duplicated += 1;
            } else {
                t.invented += 1;
            }
            eprintln!("unexpected send completion {seq} on QP {q} (not pending): {wc:?}");
            return;
        };
        // In posting order; where the device completes the rest once sent and READs when
        // their response came, a later request may overtake a READ but nothing else: a READ
        // goes out only after every earlier request was sent (so completed), and the rest
        // complete in the order they are sent.
        let late_read = |p: &Pending| sent_completes && p.kind == Kind::Read;
        let this_read = late_read(&s.pending[at]);
        if let Some(due) = s.pending.iter().take(at).find(|p| this_read || !late_read(p)) {
            t.out_of_order += 1;
            eprintln!("send completion {seq} on QP {q} while {} was due: {wc:?}", due.seq);
            return;
        }
        let p = s.pending.remove(at).unwrap();
        t.send_completions += 1;
        if wc.status != WcStatus::SUCCESS || wc.qp_num != s.link.qp().qpn() {
            t.bad_status += 1;
            eprintln!("QP {q} {p:?}: {wc:?}");
            return;
        }
        if wc.opcode != p.kind.opcode() {
            t.bad_opcode_or_len += 1;
            eprintln!("QP {q} {p:?}: {wc:?}");
        }
        let expect = |got: &[u8], logical: usize| got == &self.pool[p.pool_off + logical..][..got.len()];
        match p.kind {
            Kind::Write | Kind::WriteImm if sent_completes => s.unplaced.push_back(p),
            Kind::Write | Kind::WriteImm => check_write(&self.pool, t, peer_mem, q, &p),
            Kind::Read => {
                // The peer answered after taking every earlier request of this QP.
                while s.unplaced.front().is_some_and(|w| w.seq < p.seq) {
                    check_write(&self.pool, t, peer_mem, q, &s.unplaced.pop_front().unwrap());
                }
                t.payloads_checked += 1;
                t.bytes_checked += p.len as u64;
                for &(off, logical, n) in &p.pieces[..p.npieces] {
                    // SAFETY: the read completed; the slot is ours until reused.
                    let got = unsafe { s.mem.bytes(off, n) };
                    if !expect(got, logical) {
                        t.bad_payload += 1;
                        eprintln!("QP {q} {p:?}: read bytes differ");
                    }
                }
            }
            Kind::CmpSwap | Kind::FetchAdd => {
                t.atomics_checked += 1;
                let got = s.mem.read_u64(p.pieces[0].0);
                if got != p.old {
                    t.bad_atomic += 1;
                    eprintln!("QP {q} {p:?}: atomic returned {got:#x}, expected {:#x}", p.old);
                }
            }
            Kind::Send | Kind::SendImm => {}
        }
    }

    /// Checks the WRITEs still unplaced once the connections closed: each peer took the
    /// whole byte stream before it saw the close.
    fn place_all(&mut self) {
        for q in 0..QPS {
            let peer_mem = self.qps[Self::peer(q)].mem;
            while let Some(w) = self.qps[q].unplaced.pop_front() {
                check_write(&self.pool, &mut self.tally, peer_mem, q, &w);
            }
        }
    }

    /// Returns the QP whose receive completed, to refill.
    fn on_recv_completion(&mut self, wc: &WorkCompletion) -> Option<usize> {
        let q = (wc.wr_id >> 56) as usize;
        let rseq = wc.wr_id & SEQ_MASK;
        let t = &mut self.tally;
        if q >= QPS || wc.wr_id & RECV_BIT == 0 {
            t.invented += 1;
            eprintln!("invented receive completion {wc:?}");
            return None;
        }
        let s = &mut self.qps[q];
        if rseq != s.recv_done {
            if rseq < s.recv_done {
                t.duplicated += 1;
            } else if rseq >= s.recv_posted {
                t.invented += 1;
            } else {
                t.out_of_order += 1;
            }
            eprintln!("receive {rseq} on QP {q} while {} was due: {wc:?}", s.recv_done);
            return None;
        }
        s.recv_done += 1;
        t.recv_completions += 1;
        let Some(m) = s.incoming.pop_front() else {
            t.invented += 1;
            eprintln!("QP {q} received a message nobody sent: {wc:?}");
            return Some(q);
        };
        if wc.status == WcStatus::SUCCESS {
            // The sender's WRITEs before this message are in our memory now.
            let (mine, sender) = (s.mem, Self::peer(q));
            let pool = &self.pool;
            let from = &mut self.qps[sender];
            while from.unplaced.front().is_some_and(|w| w.seq < m.seq) {
                check_write(pool, t, mine, sender, &from.unplaced.pop_front().unwrap());
            }
        }
        let s = &mut self.qps[q];
        if wc.status != WcStatus::SUCCESS || wc.qp_num != s.link.qp().qpn() {
            t.bad_status += 1;
            eprintln!("QP {q} receive of {m:?}: {wc:?}");
            return Some(q);
        }
        let (opcode, imm) = match m.kind {
            Kind::Send => (WcOpcode::RECV, None),
            Kind::SendImm => (WcOpcode::RECV, Some(m.imm)),
            _ => (WcOpcode::RECV_RDMA_WITH_IMM, Some(m.imm)),
        };
        if wc.opcode != opcode || wc.byte_len as usize != m.len || wc.imm() != imm {
            t.bad_opcode_or_len += 1;
            eprintln!("QP {q} receive of {m:?}: {wc:?}");
        }
        if m.kind != Kind::WriteImm {
            let off = INBOX + (rseq as usize % RECV_DEPTH) * SLOT;
            // SAFETY: this receive completed and its slot is not reposted yet.
            let got = unsafe { s.mem.bytes(off, m.len) };
            t.payloads_checked += 1;
            t.bytes_checked += m.len as u64;
            if got != &self.pool[m.pool_off..][..m.len] {
                t.bad_payload += 1;
                eprintln!("QP {q} receive of {m:?}: bytes differ");
            }
            got.fill(POISON);
        }
        Some(q)
    }
}

/// Checks that WRITE `p` of QP `q` left its bytes in the peer's memory `peer_mem`.
fn check_write(pool: &[u8], t: &mut Tally, peer_mem: Mem, q: usize, p: &Pending) {
    let target = EXPOSED + (p.seq as usize % WINDOW) * SLOT;
    // SAFETY: the write completed (and is placed); nothing else uses the peer's slot now.
    let got = unsafe { peer_mem.bytes(target, p.len) };
    t.payloads_checked += 1;
    t.bytes_checked += p.len as u64;
    if got != &pool[p.pool_off..][..p.len] {
        t.bad_payload += 1;
        eprintln!("QP {q} {p:?}: remote bytes differ");
    }
}

#[test]
fn mixed_work_requests_complete_exactly_once_with_verified_payloads() {
    let seed: u64 = std::env::var("UVERBS_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x50a4);
    let ctx = open_test_device();
    let total: u64 = std::env::var("UVERBS_SOAK_WRS")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(match driver(&ctx) {
            Driver::Siw => 100_000,
            Driver::Rxe | Driver::Mlx5 => 500_000,
        });
    let pd = ctx.alloc_pd().unwrap();
    let mtu = ctx.query_port(1).unwrap().active_mtu.unwrap_or(Mtu::Mtu1024);
    let mut send_cq = ctx.create_cq(1024).unwrap();
    let mut recv_cq = ctx.create_cq(1024).unwrap();
    assert!(send_cq.capacity() as usize >= QPS * WINDOW && recv_cq.capacity() as usize >= QPS * RECV_DEPTH);
    let access =
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let raw: Vec<Qp> = (0..QPS)
        .map(|_| {
            let mut init = QpInit::new(QpType::Rc, &send_cq, &recv_cq);
            init.cap = QpCap {
                max_send_wr: WINDOW as u32,
                max_recv_wr: RECV_DEPTH as u32,
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: MAX_INLINE,
            };
            pd.create_qp(&init).unwrap()
        })
        .collect();
    // Pairs (0, 1), (2, 3), ...: each QP's peer is `q ^ 1`.
    let links = connect_pairs(&ctx, raw, access, mtu, 7470);
    let mut qps: Vec<QpRun> = links
        .into_iter()
        .enumerate()
        .map(|(q, link)| {
            let mr = pd.alloc_remote_mr(MR_LEN, access).unwrap();
            let mem = Mem {
                base: mr.addr() as *mut u8,
            };
            QpRun {
                link,
                mr,
                mem,
                rng: Rng::new(seed ^ (q as u64).wrapping_mul(0x1234_5678_9abc_def1)),
                posted: 0,
                pending: VecDeque::new(),
                unplaced: VecDeque::new(),
                recv_posted: 0,
                recv_done: 0,
                incoming: VecDeque::new(),
                sent_to_peer: 0,
                atomic_model: 0,
            }
        })
        .collect();
    for (q, s) in qps.iter_mut().enumerate() {
        // SAFETY: nothing is in flight yet.
        unsafe { s.mem.bytes(INBOX, RECV_DEPTH * SLOT) }.fill(POISON);
        // Each QP's atomics hit one word in its peer's MR; it starts at a known value.
        s.atomic_model = 0x1000 + q as u64;
    }
    for q in 0..QPS {
        let word = ATOMIC + 8 * (q / 2);
        qps[q ^ 1].mem.write_u64(word, qps[q].atomic_model);
    }
    let inline_cap = qps
        .iter()
        .map(|s| s.link.qp().cap().max_inline_data)
        .min()
        .unwrap()
        .min(MAX_INLINE);
    let mut pool = vec![0u8; 2 * SLOT];
    let mut r = Rng::new(seed);
    for c in pool.chunks_mut(8) {
        c.copy_from_slice(&r.next_u64().to_le_bytes()[..c.len()]);
    }
    let (kinds, read_sges) = supported(&ctx);
    let mut soak = Soak {
        qps,
        pool,
        tally: Tally::default(),
        inline_cap,
        kinds,
        read_sges,
        sent_completes: driver(&ctx) == Driver::Siw,
        read_min_len: usize::from(driver(&ctx) == Driver::Siw),
    };
    for q in 0..QPS {
        check_refusals(&mut soak, q);
        soak.refill_receives(q);
    }

    let start = Instant::now();
    let mut budget = total;
    let mut wc = vec![WorkCompletion::default(); 64];
    let mut last_progress = Instant::now();
    let mut last_report = Instant::now();
    let mut refill = [false; QPS];
    loop {
        for q in 0..QPS {
            soak.post_batch(q, &mut budget);
        }
        let n = send_cq.poll(&mut wc);
        for c in &wc[..n] {
            soak.on_send_completion(c);
        }
        let m = recv_cq.poll(&mut wc);
        for c in &wc[..m] {
            if let Some(q) = soak.on_recv_completion(c) {
                refill[q] = true;
            }
        }
        for (q, r) in refill.iter_mut().enumerate() {
            if std::mem::take(r) {
                soak.refill_receives(q);
            }
        }
        let outstanding: usize = soak.qps.iter().map(|s| s.pending.len() + s.incoming.len()).sum();
        if budget == 0 && outstanding == 0 {
            break;
        }
        if n + m > 0 {
            last_progress = Instant::now();
        } else {
            assert!(
                last_progress.elapsed() < TIMEOUT,
                "no completion for {TIMEOUT:?} with {outstanding} outstanding; {:?}",
                soak.tally
            );
        }
        if last_report.elapsed() > Duration::from_secs(60) {
            last_report = Instant::now();
            let done = total - budget;
            eprintln!(
                "soak: {done} of {total} posted after {:.0?} ({:.0} WR/s)",
                start.elapsed(),
                done as f64 / start.elapsed().as_secs_f64()
            );
        }
    }
    let took = start.elapsed();
    assert_idle(&mut send_cq);
    assert_idle(&mut recv_cq);
    for (q, s) in soak.qps.iter().enumerate() {
        let word = ATOMIC + 8 * (q / 2);
        let got = soak.qps[q ^ 1].mem.read_u64(word);
        if got != s.atomic_model {
            soak.tally.bad_atomic += 1;
            eprintln!("QP {q}: atomic word ends at {got:#x}, model says {:#x}", s.atomic_model);
        }
    }

    // The receives still posted complete too: move every QP to ERR and account for each flush.
    let flushed = flush_receives(&mut soak, &mut recv_cq);
    soak.place_all();
    assert_idle(&mut send_cq);

    let t = &soak.tally;
    let posted: u64 = soak.qps.iter().map(|s| s.posted).sum();
    let recv_posted: u64 = soak.qps.iter().map(|s| s.recv_posted).sum();
    let recv_consumed = t.recv_completions;
    let lost = (posted - t.send_completions)
        + soak.qps.iter().map(|s| s.incoming.len() as u64).sum::<u64>()
        + (recv_posted - recv_consumed - flushed);
    let kinds: Vec<String> = KINDS.iter().zip(t.by_kind).map(|(k, n)| format!("{k:?} {n}")).collect();
    figure(format_args!(
        "soak on {} ({:?}): {posted} work requests ({}) on {QPS} QPs sharing 2 CQs, plus {recv_posted} receives; \
         {} completions ({} send, {recv_consumed} receive, {flushed} receives flushed at the end): lost {lost}, duplicated {}, invented {}, out of order {}, \
         bad status {}, bad opcode/length {}, payloads {} checked ({} MiB) with {} mismatches, atomics {} checked with {} mismatches; \
         {:.1} s, {:.0} WR/s",
        ctx.device().name,
        driver(&ctx),
        kinds.join(", "),
        t.send_completions + t.recv_completions + flushed,
        t.send_completions,
        t.duplicated,
        t.invented,
        t.out_of_order,
        t.bad_status,
        t.bad_opcode_or_len,
        t.payloads_checked,
        t.bytes_checked >> 20,
        t.bad_payload,
        t.atomics_checked,
        t.bad_atomic,
        took.as_secs_f64(),
        posted as f64 / took.as_secs_f64(),
    ));
    assert_eq!(posted, total);
    assert_eq!(
        (
            lost,
            t.duplicated,
            t.invented,
            t.out_of_order,
            t.bad_status,
            t.bad_opcode_or_len,
            t.bad_payload,
            t.bad_atomic
        ),
        (0, 0, 0, 0, 0, 0, 0, 0),
        "{t:?}"
    );
    assert_eq!(t.send_completions, posted);
    assert_eq!(recv_consumed + flushed, recv_posted);
}

/// Moves every QP to ERR (on iWARP by disconnecting each pair) and checks that each receive still posted is flushed exactly once,
/// in order per QP; returns how many were.
fn flush_receives(soak: &mut Soak, recv_cq: &mut Cq) -> u64 {
    let want: u64 = soak.qps.iter().map(|s| s.recv_posted - s.recv_done).sum();
    to_error(&mut soak.qps.iter_mut().map(|s| &mut s.link).collect::<Vec<_>>());
    let mut flushed = 0;
    for wc in poll_n(recv_cq, want as usize, 64) {
        let q = (wc.wr_id >> 56) as usize;
        let t = &mut soak.tally;
        let Some(s) = soak.qps.get_mut(q).filter(|_| wc.wr_id & RECV_BIT != 0) else {
            t.invented += 1;
            eprintln!("invented flush {wc:?}");
            continue;
        };
        let rseq = wc.wr_id & SEQ_MASK;
        if rseq != s.recv_done || rseq >= s.recv_posted {
            if rseq < s.recv_done {
                t.duplicated += 1;
            } else {
                t.invented += 1;
            }
            eprintln!(
                "flush of receive {rseq} on QP {q} while {} was due: {wc:?}",
                s.recv_done
            );
            continue;
        }
        if wc.status != WcStatus::WR_FLUSH_ERR {
            t.bad_status += 1;
            eprintln!("flush on QP {q}: {wc:?}");
        }
        s.recv_done += 1;
        flushed += 1;
    }
    assert_idle(recv_cq);
    flushed
}
