//! The real rxe provider code (`cq.rs`, `qp.rs`, `srq.rs` and the rings under them) against a
//! fake kernel that lies, thousands of seeded cases: ring mappings of any size at any cookie,
//! headers that do not fit them, capabilities no ring can hold, producer and consumer indices
//! out of range, completions full of garbage (opcodes and statuses that do not exist), resizes
//! to hostile rings.
//!
//! The "device" is a sparse regular file: it passes `DeviceFile`'s check (device number 0:0 on
//! both sides), the provider maps rings from it exactly as from `/dev/infiniband/uverbsN`, and
//! the fake kernel reads and writes the same bytes with `pread`/`pwrite`. The doorbell's
//! `write()` lands at the file's start, below every ring.
//!
//! Checked: creation fails with a typed error (`Malformed`, or `Io` when the mapping itself
//! fails) or succeeds with a ring whose every access stays inside the mapping; nothing panics;
//! every completion handed out is a byte-exact copy of the slot the ring protocol names, each
//! once; every posted work request lands in the slot the protocol names, and the published
//! indices stay in range. Host only (not under miri: it maps a file).

use super::super::abi::{CreateQpResp, CreateSrqResp, MmInfo, ModifySrqCmd};
use super::super::{cq, qp, srq, RxeContext};
use super::off;
use crate::attr::QpCap;
use crate::attr::QpType;
use crate::device::{DeviceFile, DeviceInfo};
use crate::error::{Error, WrReject};
use crate::provider::{CqCreated, CqRing, QpCreated, QpQueues, QpRequest, SrqCreated, SrqQueue};
use crate::testing::Rng;
use crate::wc::WorkCompletion;
use crate::wr::{RecvWr, Remote, SendFlags, SendList, SendOp, SendWr, Sge};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use zerocopy::{FromBytes, IntoBytes};

/// Rings live from here on in the file; the doorbell writes below.
const RINGS_AT: u64 = 16 << 20;
const FILE_LEN: u64 = RINGS_AT + REGIONS * REGION;
/// Largest mapping the fake kernel hands out (the file always covers it).
const MAX_MAP: u64 = 1 << 20;
/// Rings are handed out round-robin from this many regions, far enough apart that even a
/// misaligned maximal mapping stays inside its own.
const REGIONS: u64 = 32;
const REGION: u64 = 2 * MAX_MAP;

#[derive(Debug, Default)]
struct Stats {
    cases: u64,
    created: u64,
    malformed: u64,
    io: u64,
    completions: u64,
    garbage_completions: u64,
    posted: u64,
    rejected_wrs: u64,
    hostile_index_writes: u64,
    resizes: u64,
}

/// The fake kernel's side of a ring: where it is in the file and what header it wrote.
#[derive(Clone, Copy, Debug)]
struct FakeRing {
    at: u64,
    #[allow(dead_code)] // shown in failure messages
    len: u64,
    log2: u32,
    mask: u32,
}

struct Fake {
    file: File,
    ctx: RxeContext,
    rng: Rng,
    next_region: u64,
}

impl Fake {
    fn new(seed: u64) -> Self {
        let path = std::env::temp_dir().join(format!("uverbs-fake-rxe-{}-{seed:x}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file.set_len(FILE_LEN).unwrap();
        let info = DeviceInfo {
            name: "rxe_fake".into(),
            uverbs: "uverbs_fake".into(),
            dev_path: path,
            dev_number: "0:0".into(),
            abi_version: 2,
            driver_id: Some(14),
            kernel_index: None,
            parent_netdev: None,
            node_guid: String::new(),
        };
        let dev = DeviceFile::from_fd(&info, file.try_clone().unwrap().into()).expect("a regular file is device 0:0");
        Self {
            file,
            ctx: RxeContext { file: Arc::new(dev) },
            rng: Rng::new(seed),
            next_region: 0,
        }
    }

    fn put_u32(&self, at: u64, v: u32) {
        self.file.write_all_at(&v.to_le_bytes(), at).unwrap();
    }

    fn get_u32(&self, at: u64) -> u32 {
        let mut b = [0; 4];
        self.file.read_exact_at(&mut b, at).unwrap();
        u32::from_le_bytes(b)
    }

    fn garbage(&mut self, at: u64, len: usize) {
        let bytes: Vec<u8> = (0..len).map(|_| self.rng.next_u64() as u8).collect();
        self.file.write_all_at(&bytes, at).unwrap();
    }

    /// A ring for an object needing slots of `min_elem` bytes: usually a header that fits
    /// its mapping, often one that does not, at an aligned cookie or not, of any size.
    fn ring(&mut self, min_elem: usize) -> (MmInfo, FakeRing) {
        let r = &mut self.rng;
        let region = RINGS_AT + (self.next_region % REGIONS) * REGION;
        self.next_region += 1;
        let honest = r.chance(70);
        let log2 = if honest {
            (min_elem.max(1).next_power_of_two().trailing_zeros() + r.below(2) as u32).min(14)
        } else if r.chance(20) {
            r.next_u64() as u32
        } else {
            r.below(16) as u32
        };
        let mask = if honest || r.chance(50) {
            (1u32 << r.below(9)) - 1
        } else {
            r.next_u64() as u32 >> r.below(32)
        };
        let needed = off::DATA as u64 + ((u64::from(mask) + 1) << log2.min(40));
        let len = if honest && r.chance(90) {
            needed.min(MAX_MAP)
        } else {
            r.below(MAX_MAP + 1)
        };
        let misalign = if r.chance(10) { r.below(4096) } else { 0 };
        let at = region + misalign;
        // Now and then a cookie no mapping can have: the mapping itself fails.
        let cookie = if r.chance(3) { u64::MAX - r.below(1 << 20) } else { at };
        let prod = if r.chance(20) { r.next_u64() as u32 } else { 0 };
        let cons = if r.chance(20) { r.next_u64() as u32 } else { 0 };
        let header_len = (off::DATA as u64).min(len) as usize;
        self.garbage(at, header_len); // the padding between the words is not read
        for (o, v) in [
            (off::LOG2_ELEM_SIZE, log2),
            (off::INDEX_MASK, mask),
            (off::PRODUCER_INDEX, prod),
            (off::CONSUMER_INDEX, cons),
        ] {
            if (o + 4) as u64 <= len {
                self.put_u32(at + o as u64, v);
            }
        }
        let mi = MmInfo {
            offset: cookie,
            size: len as u32,
            pad: 0,
        };
        (mi, FakeRing { at, len, log2, mask })
    }
}

fn typed(e: &Error, stats: &mut Stats) {
    match e {
        Error::Malformed { .. } => stats.malformed += 1,
        Error::Io { .. } => stats.io += 1,
        other => panic!("untyped failure: {other:?}"),
    }
}

fn slot_at(r: &FakeRing, index: u32) -> u64 {
    r.at + off::DATA as u64 + (u64::from(index & r.mask) << r.log2)
}

/// A CQ: the kernel produces garbage completions at hostile producer indices; the provider
/// polls, batches and resizes.
fn cq_case(f: &mut Fake, stats: &mut Stats) {
    let (mi, mut ring) = f.ring(size_of::<WorkCompletion>());
    let mut cq: Box<dyn CqRing> = match cq::create(&f.ctx, 16, &mut |_, _, out| {
        out.copy_from_slice(mi.as_bytes());
        Ok(CqCreated { handle: 1, cqe: 16 })
    }) {
        Ok(cq) => cq,
        Err(e) => return typed(&e, stats),
    };
    stats.created += 1;
    let mut cons = f.get_u32(ring.at + off::CONSUMER_INDEX as u64) & ring.mask;
    let mut wc = vec![WorkCompletion::default(); 64];
    for _ in 0..f.rng.below(48) {
        match f.rng.below(6) {
            0 => {
                // Garbage in the slots: statuses, opcodes and flags that do not exist.
                let n = ((u64::from(ring.mask) + 1) << ring.log2).min(8192) as usize;
                f.garbage(ring.at + off::DATA as u64, n);
            }
            1 => {
                let v = f.rng.next_u64() as u32;
                f.put_u32(ring.at + off::PRODUCER_INDEX as u64, v);
                stats.hostile_index_writes += 1;
            }
            2 => {
                // Resize: the kernel answers with a new (possibly hostile) ring.
                let (mi2, ring2) = f.ring(size_of::<WorkCompletion>());
                stats.resizes += 1;
                match cq.resize(31, &mut |_, _, out| {
                    out.copy_from_slice(mi2.as_bytes());
                    Ok(32)
                }) {
                    Ok(_) => {
                        ring = ring2;
                        cons = f.get_u32(ring.at + off::CONSUMER_INDEX as u64) & ring.mask;
                    }
                    Err(e) => {
                        typed(&e, stats);
                        return; // a failed resize leaves the CQ unusable; the core destroys it
                    }
                }
            }
            3 => {
                // In place, as `Cq::batch`: look at some, consume some.
                let prod = f.get_u32(ring.at + off::PRODUCER_INDEX as u64) & ring.mask;
                let ready = prod.wrapping_sub(cons) & ring.mask;
                let run = cq.ready_run();
                assert_eq!(run.len, ready as usize);
                assert!(run.before_wrap <= run.len && run.before_wrap <= (ring.mask - cons + 1) as usize);
                let look = f.rng.below(u64::from(ready) + 1) as u32;
                for i in 0..look as usize {
                    let (from, k) = if i < run.before_wrap {
                        (run.first, i)
                    } else {
                        (run.wrapped, i - run.before_wrap)
                    };
                    // SAFETY: the `i`-th of the `run.len` ready completions `CqRing` describes.
                    let wc = unsafe { &*from.as_ptr().byte_add(k * run.stride) };
                    check_wc(f, &ring, wc, cons.wrapping_add(i as u32), stats);
                }
                if look > 0 {
                    cq.consume(look as usize);
                    cons = (cons + look) & ring.mask;
                    assert_eq!(f.get_u32(ring.at + off::CONSUMER_INDEX as u64), cons);
                }
            }
            _ => {
                let want = f.rng.below(65) as usize;
                let prod = f.get_u32(ring.at + off::PRODUCER_INDEX as u64) & ring.mask;
                let ready = (prod.wrapping_sub(cons) & ring.mask) as usize;
                let n = cq.poll(&mut wc[..want]);
                assert_eq!(n, ready.min(want), "poll returns what is ready, up to the slice");
                for (i, c) in wc[..n].iter().enumerate() {
                    check_wc(f, &ring, c, cons.wrapping_add(i as u32), stats);
                }
                if n > 0 {
                    cons = (cons + n as u32) & ring.mask;
                    assert_eq!(f.get_u32(ring.at + off::CONSUMER_INDEX as u64), cons);
                }
            }
        }
    }
}

/// A completion handed out must be a byte-exact copy of the slot the protocol names.
fn check_wc(f: &Fake, ring: &FakeRing, wc: &WorkCompletion, index: u32, stats: &mut Stats) {
    let mut want = [0u8; 48];
    f.file.read_exact_at(&mut want, slot_at(ring, index)).unwrap();
    // SAFETY: `WorkCompletion` is 48 bytes of plain integers with no padding (asserted in
    // wc.rs), so every byte of it is initialized.
    let got = unsafe { std::slice::from_raw_parts((wc as *const WorkCompletion).cast::<u8>(), 48) };
    assert_eq!(got, &want[..], "completion {index} differs from its slot");
    // Unknown statuses and opcodes print as numbers; nothing here may panic.
    let text = format!("{wc:?} {:?} {}", wc.imm(), wc.is_success());
    std::hint::black_box(text);
    stats.completions += 1;
    if !wc.is_success() || wc.opcode.0 > 129 {
        stats.garbage_completions += 1;
    }
}

/// A QP: the kernel moves the consumer indices anywhere; the provider posts sends and
/// receives.
fn qp_case(f: &mut Fake, stats: &mut Stats) {
    let r = &mut f.rng;
    let qp_type = [QpType::Rc, QpType::Uc, QpType::Ud][r.below(3) as usize];
    let has_srq = r.chance(20);
    let wild = |r: &mut Rng, sane: u64| {
        if r.chance(85) {
            r.below(sane + 1) as u32
        } else {
            r.next_u64() as u32 >> r.below(32)
        }
    };
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: wild(r, 4),
        max_recv_sge: wild(r, 4),
        max_inline_data: wild(r, 256),
    };
    let sq_min = 208 + cap.max_send_sge as usize * 16;
    let rq_min = 40 + cap.max_recv_sge as usize * 16;
    let (sq_mi, sq) = f.ring(sq_min.min(1 << 14));
    let (rq_mi, rq) = f.ring(rq_min.min(1 << 14));
    let resp = CreateQpResp { rq_mi, sq_mi };
    // rxe links nothing to the QP's CQs and SRQ: the core's placeholders stand in for them.
    let request = QpRequest {
        qp_type,
        cap,
        send_cq: &crate::cq::NoRing,
        recv_cq: &crate::cq::NoRing,
        srq: has_srq.then_some(&crate::srq::NoQueue as &dyn SrqQueue),
        sq_sig_all: false,
    };
    let mut qp: Box<dyn QpQueues> = match qp::create(&f.ctx, &request, &mut |_, _, out| {
        out.copy_from_slice(resp.as_bytes());
        Ok(QpCreated {
            handle: 2,
            qpn: 17,
            cap,
        })
    }) {
        Ok(q) => q.queues,
        Err(e) => return typed(&e, stats),
    };
    stats.created += 1;
    let mut sq_prod = f.get_u32(sq.at + off::PRODUCER_INDEX as u64) & sq.mask;
    let mut rq_prod = f.get_u32(rq.at + off::PRODUCER_INDEX as u64) & rq.mask;
    let buf = vec![0x5au8; 4096];
    let mut wr_id = 0u64;
    for _ in 0..f.rng.below(32) {
        match f.rng.below(5) {
            0 => {
                let v = f.rng.next_u64() as u32;
                f.put_u32(sq.at + off::CONSUMER_INDEX as u64, v);
                stats.hostile_index_writes += 1;
            }
            1 => {
                let v = f.rng.next_u64() as u32;
                f.put_u32(rq.at + off::CONSUMER_INDEX as u64, v);
                stats.hostile_index_writes += 1;
            }
            2 if !has_srq => {
                let n = f.rng.below(8) as usize;
                let sges: Vec<Vec<Sge>> = (0..n)
                    .map(|_| vec![sge(&buf, 64); sge_count(&mut f.rng, cap.max_recv_sge)])
                    .collect();
                let wrs: Vec<RecvWr<'_>> = sges
                    .iter()
                    .map(|s| {
                        wr_id += 1;
                        RecvWr::new(wr_id, s)
                    })
                    .collect();
                // SAFETY: nothing reads the buffers (no device).
                let result = unsafe { qp.post_recv(&wrs) };
                rq_prod = check_posted(
                    f,
                    &rq,
                    rq_prod,
                    &wrs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
                    result,
                    stats,
                );
            }
            _ => {
                let n = f.rng.below(8) as usize;
                let sges: Vec<Vec<Sge>> = (0..n)
                    .map(|_| {
                        let k = sge_count(&mut f.rng, cap.max_send_sge);
                        let len = if f.rng.chance(50) { 8 } else { f.rng.below(100) as u32 };
                        vec![sge(&buf, len); k]
                    })
                    .collect();
                let remote = Remote {
                    addr: 0x1000 + 4 * f.rng.below(4),
                    rkey: 1,
                };
                let ops: Vec<(SendOp, bool)> = (0..n)
                    .map(|_| {
                        let op = match f.rng.below(7) {
                            0 => SendOp::Send,
                            1 => SendOp::SendWithImm { imm: 5 },
                            2 => SendOp::RdmaWrite(remote),
                            3 => SendOp::RdmaWriteWithImm(remote, 6),
                            4 => SendOp::RdmaRead(remote),
                            5 => SendOp::CompareSwap {
                                remote,
                                compare: 1,
                                swap: 2,
                            },
                            _ => SendOp::FetchAdd { remote, add: 3 },
                        };
                        (op, f.rng.chance(30))
                    })
                    .collect();
                let wrs: Vec<SendWr<'_>> = ops
                    .iter()
                    .zip(&sges)
                    .map(|(&(op, inline), s)| {
                        wr_id += 1;
                        let flags = if inline {
                            SendFlags::SIGNALED | SendFlags::INLINE
                        } else {
                            SendFlags::SIGNALED
                        };
                        SendWr::new(wr_id, op, s).set_flags(flags)
                    })
                    .collect();
                // No UD request: no AH for the context to match.
                // SAFETY: every SGE names `buf`, alive and readable; nothing writes it (no
                // device).
                let result = unsafe { qp.post_send(SendList::new(&wrs)) };
                sq_prod = check_posted(
                    f,
                    &sq,
                    sq_prod,
                    &wrs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
                    result,
                    stats,
                );
            }
        }
    }
}

/// Usually within the queue's limit, sometimes one over it.
fn sge_count(r: &mut Rng, max: u32) -> usize {
    let max = max.min(6) as usize;
    if r.chance(10) {
        max + 1
    } else {
        r.below(max as u64 + 1) as usize
    }
}

fn sge(buf: &[u8], len: u32) -> Sge {
    Sge {
        addr: buf.as_ptr() as u64,
        length: len.min(buf.len() as u32),
        lkey: 1,
    }
}

/// Checks a post: the accepted prefix landed in consecutive slots from `prod` (the last lap of
/// them, if a lying consumer index let the post wrap), and the published producer index is
/// right after it. Returns the new producer index.
fn check_posted(
    f: &Fake,
    ring: &FakeRing,
    prod: u32,
    ids: &[u64],
    result: crate::error::Result<()>,
    stats: &mut Stats,
) -> u32 {
    let accepted = match result {
        Ok(()) => ids.len(),
        Err(Error::WorkRequest { index, reason, .. }) => {
            assert!(
                matches!(
                    reason,
                    WrReject::QueueFull
                        | WrReject::TooManySge { .. }
                        | WrReject::InlineTooLong { .. }
                        | WrReject::BadAtomic
                        | WrReject::OpcodeNotSupported
                ),
                "{reason:?}"
            );
            stats.rejected_wrs += 1;
            index
        }
        Err(e) => panic!("untyped post failure: {e:?}"),
    };
    // A lying consumer index can make the ring look emptier than it is, so one post may lap
    // it: the last `slots` requests are the ones still in place.
    let slots = ring.mask as usize + 1;
    for (i, &id) in ids
        .iter()
        .enumerate()
        .take(accepted)
        .skip(accepted.saturating_sub(slots))
    {
        let mut b = [0u8; 8];
        f.file
            .read_exact_at(&mut b, slot_at(ring, prod.wrapping_add(i as u32)))
            .unwrap();
        assert_eq!(
            u64::from_le_bytes(b),
            id,
            "work request {i} not in its slot: {ring:?} prod {prod} accepted {accepted} of {ids:?}"
        );
    }
    stats.posted += accepted as u64;
    let new = (prod + accepted as u32) & ring.mask;
    let published = f.get_u32(ring.at + off::PRODUCER_INDEX as u64);
    if accepted > 0 {
        assert_eq!(published, new, "published producer index");
    }
    assert!(published <= ring.mask || accepted == 0);
    new
}

/// An SRQ: hostile consumer indices, posts, and resizes to hostile rings.
fn srq_case(f: &mut Fake, stats: &mut Stats) {
    let max_sge = if f.rng.chance(85) {
        f.rng.below(5) as u32
    } else {
        f.rng.next_u64() as u32
    };
    let (mi, mut ring) = f.ring((40 + max_sge as usize * 16).min(1 << 14));
    let resp = CreateSrqResp {
        mi,
        srq_num: 3,
        reserved: 0,
    };
    let mut q: Box<dyn SrqQueue> = match srq::create(&f.ctx, &mut |_, out| {
        out.copy_from_slice(resp.as_bytes());
        Ok(SrqCreated {
            handle: 3,
            max_wr: 64,
            max_sge,
        })
    }) {
        Ok(q) => q,
        Err(e) => return typed(&e, stats),
    };
    stats.created += 1;
    let mut prod = f.get_u32(ring.at + off::PRODUCER_INDEX as u64) & ring.mask;
    let buf = vec![0u8; 256];
    let mut wr_id = 0;
    for _ in 0..f.rng.below(24) {
        match f.rng.below(4) {
            0 => {
                let v = f.rng.next_u64() as u32;
                f.put_u32(ring.at + off::CONSUMER_INDEX as u64, v);
                stats.hostile_index_writes += 1;
            }
            1 => {
                let (mi2, ring2) = f.ring((40 + max_sge as usize * 16).min(1 << 14));
                stats.resizes += 1;
                let result = q.modify(true, &mut |cmd| {
                    // The kernel writes the new ring's mminfo where the command says.
                    let c = ModifySrqCmd::read_from_bytes(cmd).expect("8-byte command");
                    // SAFETY: the provider passes the address of a live `MmInfo`.
                    unsafe { (c.mmap_info_addr as *mut MmInfo).write_unaligned(mi2) };
                    Ok(())
                });
                match result {
                    Ok(()) => {
                        ring = ring2;
                        prod = f.get_u32(ring.at + off::PRODUCER_INDEX as u64) & ring.mask;
                    }
                    Err(e) => return typed(&e, stats),
                }
            }
            _ => {
                let n = f.rng.below(10) as usize;
                let sges: Vec<Vec<Sge>> = (0..n)
                    .map(|_| vec![sge(&buf, 16); sge_count(&mut f.rng, max_sge)])
                    .collect();
                let wrs: Vec<RecvWr<'_>> = sges
                    .iter()
                    .map(|s| {
                        wr_id += 1;
                        RecvWr::new(wr_id, s)
                    })
                    .collect();
                // SAFETY: nothing writes the buffers (no device).
                let result = unsafe { q.post_recv(&wrs) };
                prod = check_posted(
                    f,
                    &ring,
                    prod,
                    &wrs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
                    result,
                    stats,
                );
            }
        }
    }
}

#[test]
fn the_rxe_provider_survives_a_lying_kernel() {
    let mut f = Fake::new(0x0bad_c0de);
    let mut stats = Stats::default();
    for case in 0..6000 {
        stats.cases += 1;
        match case % 3 {
            0 => cq_case(&mut f, &mut stats),
            1 => qp_case(&mut f, &mut stats),
            _ => srq_case(&mut f, &mut stats),
        }
    }
    super::tests::report(format_args!(
        "lying rxe kernel: {} CQ/QP/SRQ creations and {} resizes: {} refused as malformed, {} with a failed mapping (typed errors), \
         {} objects created; {} completions polled, each a byte-exact copy of its slot ({} with garbage status or opcode); \
         {} work requests posted into the right slots, {} lists stopped with a typed rejection; {} hostile index writes",
        stats.cases,
        stats.resizes,
        stats.malformed,
        stats.io,
        stats.created,
        stats.completions,
        stats.garbage_completions,
        stats.posted,
        stats.rejected_wrs,
        stats.hostile_index_writes,
    ));
    assert!(stats.malformed > 0 && stats.io > 0 && stats.created > 0 && stats.completions > 0 && stats.posted > 0);
}
