//! The requester: takes the send WQEs a doorbell record announces, checks their local data
//! and keys, hands the request to the fabric and completes it with the responder's answer;
//! errors, flushes and NOPs complete locally.

use super::{ack_timeout, mr_covering, rnr_delay, uidx, Cqe, Device, Segment, Work, Wqe, UD_MTU};
use crate::abi::{self, cqe_op, opcode, qps, syndrome};
use crate::kernel::Model;
use crate::mem::Memory;
use crate::objects::{Qp, Stall};
use crate::port::{GidType, Port};
use crate::wire::{Datagram, Eth, Grh, Op, Request, Response};
use std::time::Instant;

impl Device {
    /// Completes the send WQE `index` of QP `h` in error with `synd` and moves the QP to ERR.
    fn fail_send(model: &mut Model, h: u32, index: u16, nbb: u16, op: u8, synd: u8, mem: &dyn Memory) {
        let Some(qp) = model.qps.get_mut(h) else { return };
        crate::log!("qp {:#x} wqe {index} error syndrome {synd:#x}", qp.qpn);
        qp.state = qps::ERR;
        qp.stall = None;
        qp.sq_ci = qp.sq_ci.wrapping_add(nbb.max(1));
        let cqe = Cqe::new(cqe_op::REQ_ERR, (u32::from(op) << 24) | qp.qpn, uidx(qp), index).syndrome(synd);
        Self::post_for(model, h, true, cqe, mem);
    }

    /// Flushes what is posted on a QP in ERR: one WR_FLUSH_ERR CQE per WQE, at most one
    /// ring's worth per call.
    fn flush(model: &mut Model, h: u32, mem: &dyn Memory) -> bool {
        let Some(qp) = model.qps.get(h) else { return false };
        let (db, sq_cnt, rq_cnt) = (qp.db, qp.sq_cnt, qp.rq_cnt);
        let mut active = false;
        if sq_cnt > 0 {
            if let Ok(snd) = mem.read_be32(db + abi::SND_DBR) {
                let snd = snd as u16;
                for _ in 0..sq_cnt {
                    let Some(qp) = model.qps.get_mut(h) else { return active };
                    if qp.sq_ci == snd {
                        break;
                    }
                    if u32::from(snd.wrapping_sub(qp.sq_ci)) > sq_cnt {
                        qp.sq_ci = snd;
                        break;
                    }
                    let index = qp.sq_ci;
                    let ctrl_addr = qp.sq_base() + (u64::from(index) & u64::from(sq_cnt - 1)) * abi::SEND_WQE_BB;
                    let mut ctrl = [0u8; 16];
                    let (op, nbb) = match mem.read(ctrl_addr, &mut ctrl) {
                        Ok(()) => {
                            let ds = u32::from(ctrl[7] & 0x3f);
                            (ctrl[3], ds.div_ceil(4).max(1) as u16)
                        }
                        Err(_) => (0, 1),
                    };
                    qp.sq_ci = qp.sq_ci.wrapping_add(nbb);
                    let cqe = Cqe::new(cqe_op::REQ_ERR, (u32::from(op) << 24) | qp.qpn, uidx(qp), index)
                        .syndrome(syndrome::WR_FLUSH);
                    Self::post_for(model, h, true, cqe, mem);
                    active = true;
                }
            }
        }
        if rq_cnt > 0 {
            if let Ok(rcv) = mem.read_be32(db + abi::RCV_DBR) {
                let rcv = rcv as u16;
                for _ in 0..rq_cnt {
                    let Some(qp) = model.qps.get_mut(h) else { return active };
                    if qp.rq_ci == rcv {
                        break;
                    }
                    if u32::from(rcv.wrapping_sub(qp.rq_ci)) > rq_cnt {
                        qp.rq_ci = rcv;
                        break;
                    }
                    let index = qp.rq_ci;
                    qp.rq_ci = qp.rq_ci.wrapping_add(1);
                    let cqe = Cqe::new(cqe_op::RESP_ERR, qp.qpn, uidx(qp), index).syndrome(syndrome::WR_FLUSH);
                    Self::post_for(model, h, false, cqe, mem);
                    active = true;
                }
            }
        }
        active
    }

    /// Reads and decodes the WQE at the SQ's consumer index. `Err((nbb, opcode, syndrome))`
    /// for a malformed one.
    fn parse(qp: &Qp, avail: u16, mem: &dyn Memory) -> Result<Wqe, (u16, u8, u8)> {
        let bad = |nbb: u16, op: u8| Err((nbb, op, syndrome::LOCAL_QP_OP));
        let mask = u64::from(qp.sq_cnt - 1);
        let bb_addr = |k: u16| qp.sq_base() + ((u64::from(qp.sq_ci.wrapping_add(k))) & mask) * abi::SEND_WQE_BB;
        let mut first = [0u8; 64];
        if mem.read(bb_addr(0), &mut first).is_err() {
            return bad(1, 0);
        }
        let op = first[3];
        let index = u16::from_be_bytes([first[1], first[2]]);
        let qpn = u32::from_be_bytes([0, first[4], first[5], first[6]]);
        let ds = u16::from(first[7] & 0x3f);
        let nbb = ds.div_ceil(4).max(1);
        // A WQE must name its own index and QP, have at least its control segment, fit the
        // ring and lie within what the doorbell covers.
        if ds == 0 || index != qp.sq_ci || qpn != qp.qpn || u32::from(nbb) > qp.sq_cnt || nbb > avail {
            return bad(nbb, op);
        }
        let mut wqe = vec![0u8; usize::from(nbb) * 64];
        wqe[..64].copy_from_slice(&first);
        for k in 1..nbb {
            let at = usize::from(k) * 64;
            if mem.read(bb_addr(k), &mut wqe[at..at + 64]).is_err() {
                return bad(nbb, op);
            }
        }
        wqe.truncate(usize::from(ds) * 16);
        let fm_ce_se = first[11];
        let be64 = |b: &[u8]| u64::from_be_bytes(b[..8].try_into().unwrap_or_default());
        let be32 = |b: &[u8]| u32::from_be_bytes(b[..4].try_into().unwrap_or_default());
        let mut w = Wqe {
            opcode: op,
            index,
            nbb,
            signaled: fm_ce_se & abi::WQE_CTRL_CQ_UPDATE != 0,
            solicited: fm_ce_se & abi::WQE_CTRL_SOLICITED != 0,
            imm: u32::from_ne_bytes(first[12..16].try_into().unwrap_or_default()),
            raddr: 0,
            rkey: 0,
            swap_add: 0,
            compare: 0,
            av: None,
            segments: Vec::new(),
        };
        let ud = qp.qp_type == abi::qpt::UD;
        let data_at = match op {
            opcode::NOP => 16,
            // A UD send's datagram segment follows the control segment.
            opcode::SEND | opcode::SEND_IMM if ud => 64,
            opcode::SEND | opcode::SEND_IMM => 16,
            _ if ud => return bad(nbb, op),
            opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM | opcode::RDMA_READ => 32,
            opcode::ATOMIC_CS | opcode::ATOMIC_FA => 48,
            _ => return bad(nbb, op),
        };
        if qp.qp_type == abi::qpt::UC && matches!(op, opcode::RDMA_READ | opcode::ATOMIC_CS | opcode::ATOMIC_FA) {
            return bad(nbb, op);
        }
        if wqe.len() < data_at {
            return bad(nbb, op);
        }
        if ud && data_at == 64 {
            w.av = wqe[16..64].try_into().ok();
        }
        if data_at >= 32 {
            w.raddr = be64(&wqe[16..]);
            w.rkey = be32(&wqe[24..]);
        }
        if data_at == 48 {
            w.swap_add = be64(&wqe[32..]);
            w.compare = be64(&wqe[40..]);
        }
        let mut at = data_at;
        while at + 16 <= wqe.len() {
            let count = be32(&wqe[at..]);
            if count & abi::INLINE_SEG != 0 {
                let len = (count & !abi::INLINE_SEG) as usize;
                let Some(end) = (at + 4).checked_add(len).filter(|&e| e <= wqe.len()) else {
                    return bad(nbb, op);
                };
                w.segments.push(Segment::Inline(wqe[at + 4..end].to_vec()));
                at += (4 + len).div_ceil(16) * 16;
            } else {
                let (lkey, addr) = (be32(&wqe[at + 4..]), be64(&wqe[at + 8..]));
                if count != 0 {
                    w.segments.push(Segment::Pointer { len: count, lkey, addr });
                }
                at += 16;
            }
        }
        Ok(w)
    }

    /// Takes the next send WQE of some QP: returns the work to send across the fabric, or
    /// `None` when no QP has anything to do now. Local errors, flushes and NOPs complete
    /// here. Sets `*active` when anything happened.
    /// Under the differential trace the device executes nothing (`stepper.rs` retires WQEs).
    pub fn next_work(model: &mut Model, mem: &dyn Memory, now: Instant, active: &mut bool) -> Option<Work> {
        if crate::trace::enabled() {
            return None;
        }
        for h in model.qps.handles() {
            let Some(qp) = model.qps.get(h) else { continue };
            match qp.state {
                qps::ERR => {
                    *active |= Self::flush(model, h, mem);
                    continue;
                }
                qps::RTS | qps::SQD => {}
                _ => continue,
            }
            if qp.sq_cnt == 0 || qp.stall.is_some_and(|s| s.until > now) {
                continue;
            }
            let Ok(snd) = mem.read_be32(qp.db + abi::SND_DBR) else {
                Self::raise_qp_fatal(model, h);
                continue;
            };
            let bf_reg = u64::from(crate::bf_reg_size());
            if bf_reg > 0 && qp.bfregn.is_some() {
                super::bfcheck::observe(model, h, snd as u16, mem, bf_reg);
            }
            let Some(qp) = model.qps.get(h) else { continue };
            let avail = (snd as u16).wrapping_sub(qp.sq_ci);
            if avail == 0 {
                continue;
            }
            *active = true;
            if u32::from(avail) > qp.sq_cnt {
                // The doorbell claims more WQEs than the ring holds.
                Self::raise_qp_fatal(model, h);
                continue;
            }
            let wqe = match Self::parse(qp, avail, mem) {
                Ok(w) => w,
                Err((nbb, op, synd)) => {
                    let index = qp.sq_ci;
                    Self::fail_send(model, h, index, nbb, op, synd, mem);
                    continue;
                }
            };
            match Self::prepare(model, h, wqe, mem) {
                Ok(Some(work)) => return Some(work),
                Ok(None) => {}
                Err((index, nbb, op, synd)) => Self::fail_send(model, h, index, nbb, op, synd, mem),
            }
        }
        None
    }

    /// Gathers a WQE's local data and checks its local keys. `Ok(None)` when it completed
    /// locally (NOP).
    fn prepare(model: &mut Model, h: u32, wqe: Wqe, mem: &dyn Memory) -> Result<Option<Work>, (u16, u16, u8, u8)> {
        let qp = model.qps.get(h).ok_or((0, 1, 0, syndrome::LOCAL_QP_OP))?;
        let fail = |s: u8| (wqe.index, wqe.nbb, wqe.opcode, s);
        let reads_remote = matches!(wqe.opcode, opcode::RDMA_READ | opcode::ATOMIC_CS | opcode::ATOMIC_FA);
        let mut data = Vec::new();
        let mut scatter = Vec::new();
        for seg in &wqe.segments {
            match seg {
                Segment::Inline(bytes) if !reads_remote => data.extend_from_slice(bytes),
                Segment::Inline(_) => return Err(fail(syndrome::LOCAL_QP_OP)),
                Segment::Pointer { len, lkey, addr } => {
                    let len = u64::from(*len);
                    let need = if reads_remote { abi::access::LOCAL_WRITE } else { 0 };
                    let at = mr_covering(&model.mrs, *lkey, qp.pd, *addr, len, need)
                        .ok_or_else(|| fail(syndrome::LOCAL_PROT))?;
                    if reads_remote {
                        scatter.push((at, len));
                    } else {
                        if data.len() as u64 + len > crate::wire::MAX_MESSAGE as u64 {
                            return Err(fail(syndrome::LOCAL_LENGTH));
                        }
                        let start = data.len();
                        data.resize(start + len as usize, 0);
                        mem.read(at, &mut data[start..])
                            .map_err(|_| fail(syndrome::LOCAL_PROT))?;
                    }
                }
            }
        }
        let imm = matches!(wqe.opcode, opcode::SEND_IMM | opcode::RDMA_WRITE_IMM).then_some(wqe.imm);
        let op = match wqe.opcode {
            opcode::NOP => {
                let (qpn, u) = (qp.qpn, uidx(qp));
                if let Some(qp) = model.qps.get_mut(h) {
                    qp.sq_ci = qp.sq_ci.wrapping_add(wqe.nbb);
                }
                if wqe.signaled {
                    let cqe = Cqe::new(cqe_op::REQ, (u32::from(opcode::NOP) << 24) | qpn, u, wqe.index);
                    Self::post_for(model, h, true, cqe, mem);
                }
                return Ok(None);
            }
            opcode::SEND | opcode::SEND_IMM => Op::Send {
                imm,
                solicited: wqe.solicited,
                datagram: match &wqe.av {
                    Some(av) => {
                        // A UD message is one packet: at most the path MTU, 4096 for a UD
                        // QP (hw/mlx5/qp.c:4164-4167) on a port whose active MTU is 4096.
                        if data.len() > UD_MTU {
                            return Err(fail(syndrome::LOCAL_LENGTH));
                        }
                        Some(Self::datagram(qp, av, model.port.is_eth()))
                    }
                    None => None,
                },
                data,
            },
            opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM => Op::Write {
                raddr: wqe.raddr,
                rkey: wqe.rkey,
                imm,
                solicited: wqe.solicited,
                data,
            },
            opcode::RDMA_READ => {
                let len: u64 = scatter.iter().map(|(_, l)| l).sum();
                let len = u32::try_from(len).map_err(|_| fail(syndrome::LOCAL_LENGTH))?;
                Op::Read {
                    raddr: wqe.raddr,
                    rkey: wqe.rkey,
                    len,
                }
            }
            _ => {
                // Atomics land in exactly one 8-byte local buffer.
                if scatter.len() != 1 || scatter[0].1 != 8 {
                    return Err(fail(syndrome::LOCAL_LENGTH));
                }
                if wqe.opcode == opcode::ATOMIC_CS {
                    Op::CompareSwap {
                        raddr: wqe.raddr,
                        rkey: wqe.rkey,
                        compare: wqe.compare,
                        swap: wqe.swap_add,
                    }
                } else {
                    Op::FetchAdd {
                        raddr: wqe.raddr,
                        rkey: wqe.rkey,
                        add: wqe.swap_add,
                    }
                }
            }
        };
        let (route, hdr) = match &wqe.av {
            Some(av) => Self::av_headers(&model.port, av).ok_or_else(|| fail(syndrome::LOCAL_QP_OP))?,
            None => Self::path_headers(&model.port, qp),
        };
        let len = match &op {
            Op::Send { data, .. } | Op::Write { data, .. } => data.len() as u64,
            Op::Read { len, .. } => u64::from(*len),
            _ => 0,
        };
        let npkts = match &wqe.av {
            Some(_) => 1,
            None => {
                let mtu = 128u64 << qp.attrs.path_mtu.clamp(1, 5);
                len.div_ceil(mtu).max(1) as u32
            }
        };
        // A UD send goes to `dqp_dct`'s low 24 bits; a connected one to its QP's.
        let dst_qpn = match &wqe.av {
            Some(av) => u32::from_be_bytes([0, av[9], av[10], av[11]]),
            None => qp.attrs.dest_qp_num,
        };
        Ok(Some(Work {
            qp: h,
            dlid: route,
            request: Request {
                dst_qpn,
                src_qpn: qp.qpn,
                src_lid: model.lid,
                hdr: crate::wire::Headers {
                    psn: qp.attrs.next_psn,
                    npkts,
                    ..hdr
                },
                op,
            },
            wqe_index: wqe.index,
            epoch: qp.epoch,
            nbb: wqe.nbb,
            opcode: wqe.opcode,
            signaled: wqe.signaled,
            scatter,
        }))
    }

    /// The headers of a connected QP's packets, from its path (MODIFY_QP's address vector,
    /// and on Ethernet the MAC and UDP source port the kernel resolved), and the port they
    /// go to (the destination LID, or on Ethernet the port whose MAC it is; 0: none).
    fn path_headers(port: &Port, qp: &Qp) -> (u16, crate::wire::Headers) {
        let dest = &qp.attrs.dest;
        let pkey = Self::pkey(qp.attrs.pkey_index);
        let sgid = port.gid(dest.sgid_index).ok();
        let grh = (port.is_eth() || dest.is_global != 0).then(|| Grh {
            sgid: sgid.map_or([0; 16], |g| g.gid),
            dgid: dest.dgid,
            tclass: dest.traffic_class,
            hop_limit: dest.hop_limit,
            flow_label: dest.flow_label & 0xf_ffff,
        });
        if port.is_eth() {
            let eth = Eth {
                dmac: qp.attrs.dmac,
                smac: port.mac,
                v2: sgid.is_some_and(|g| g.ty == GidType::RoceV2),
                udp_sport: qp.attrs.udp_sport,
            };
            let route = crate::port::lid_of_mac(&eth.dmac).unwrap_or(0);
            let hdr = crate::wire::Headers {
                pkey,
                grh,
                eth: Some(eth),
                ..Default::default()
            };
            (route, hdr)
        } else {
            let hdr = crate::wire::Headers {
                dlid: dest.dlid,
                pkey,
                grh,
                ..Default::default()
            };
            (dest.dlid, hdr)
        }
    }

    /// The headers of a UD send from its address vector (`mlx5_wqe_av`: `stat_rate_sl` at
    /// 12, `rlid` 14 (on RoCE v2 the UDP source port), `rmac` 20, `tclass` 26, `hop_limit`
    /// 27, `grh_gid_fl` 28, `rgid` 32) and the port they go to. On InfiniBand a GRH only
    /// when `grh_gid_fl` bit 30 asks for one; on Ethernet always (libmlx5 leaves the bit
    /// clear there: it is reserved), from the source GID the vector's index names, whose
    /// type makes the packet RoCE v1 or v2. `None`: that index names no GID.
    fn av_headers(port: &Port, av: &[u8; 48]) -> Option<(u16, crate::wire::Headers)> {
        let grh_gid_fl = u32::from_be_bytes([av[28], av[29], av[30], av[31]]);
        let sgid_index = ((grh_gid_fl >> 20) & 0xff) as u8;
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&av[32..48]);
        let rlid = u16::from_be_bytes([av[14], av[15]]);
        let grh = |sgid: [u8; 16]| Grh {
            sgid,
            dgid,
            tclass: av[26],
            hop_limit: av[27],
            flow_label: grh_gid_fl & 0xf_ffff,
        };
        if port.is_eth() {
            let sgid = port.gid(sgid_index).ok()?;
            let mut dmac = [0u8; 6];
            dmac.copy_from_slice(&av[20..26]);
            let v2 = sgid.ty == GidType::RoceV2;
            let hdr = crate::wire::Headers {
                pkey: Self::pkey(0),
                grh: Some(grh(sgid.gid)),
                eth: Some(Eth {
                    dmac,
                    smac: port.mac,
                    v2,
                    udp_sport: if v2 { rlid } else { 0 },
                }),
                ..Default::default()
            };
            Some((crate::port::lid_of_mac(&dmac).unwrap_or(0), hdr))
        } else {
            let g = if grh_gid_fl & (1 << 30) != 0 {
                Some(grh(port.gid(sgid_index).ok()?.gid))
            } else {
                None
            };
            let hdr = crate::wire::Headers {
                dlid: rlid,
                pkey: Self::pkey(0),
                grh: g,
                ..Default::default()
            };
            Some((rlid, hdr))
        }
    }

    /// The P_Key at `index` of the port's table: 0xffff (the default full member) at 0,
    /// the rest of the table empty.
    fn pkey(index: u16) -> u16 {
        if index == 0 {
            0xffff
        } else {
            0
        }
    }

    /// What a UD send carries besides its headers: the Q_Key and service level from its
    /// address vector (`qkey` at 0, `stat_rate_sl` at 12).
    fn datagram(qp: &Qp, av: &[u8; 48], eth: bool) -> Datagram {
        let qkey = u32::from_be_bytes([av[0], av[1], av[2], av[3]]);
        // A Q_Key with its high bit set is a controlled one: the QP's own goes out instead.
        let qkey = if qkey & 0x8000_0000 != 0 { qp.attrs.qkey } else { qkey };
        // On Ethernet the priority sits in bits 1-3 (ah.c create_ib_ah), on InfiniBand
        // the SL in bits 0-3.
        let sl = if eth { (av[12] >> 1) & 7 } else { av[12] & 0xf };
        Datagram { qkey, sl }
    }

    /// Finishes `work` with the responder's answer (`None`: the fabric could not deliver it).
    pub fn complete(model: &mut Model, work: Work, answer: Option<Response>, mem: &dyn Memory, now: Instant) {
        let h = work.qp;
        let Some(qp) = model.qps.get_mut(h) else { return };
        // The QP was destroyed while the request was out, and its handle may name a newer QP
        // by now (QP numbers are never reused); or it left RTS (modify to ERR/RESET): it is
        // flushed or reset instead, even if the QP is back in RTS at the same ring position.
        let stale = qp.qpn != work.request.src_qpn || qp.epoch != work.epoch;
        if stale || qp.sq_ci != work.wqe_index || !matches!(qp.state, qps::RTS | qps::SQD) {
            return;
        }
        let unacknowledged = matches!(qp.qp_type, abi::qpt::UC | abi::qpt::UD);
        let answer = match answer {
            // UC and UD have no acknowledgements: whatever happened at the responder (or if
            // nothing took the packet), the send is done.
            _ if unacknowledged => Response::Ack,
            Some(a) => a,
            None => Response::Dropped,
        };
        let fail = |model: &mut Model, s: u8| {
            Self::fail_send(model, h, work.wqe_index, work.nbb, work.opcode, s, mem);
        };
        let mut byte_cnt = 0;
        match answer {
            Response::Ack => {}
            Response::ReadData(bytes) => {
                let mut at = 0usize;
                for &(addr, len) in &work.scatter {
                    let len = len as usize;
                    let end = (at + len).min(bytes.len());
                    if at < end && mem.write(addr, &bytes[at..end]).is_err() {
                        return fail(model, syndrome::LOCAL_PROT);
                    }
                    at += len;
                }
                byte_cnt = bytes.len() as u32;
            }
            Response::AtomicOriginal(v) => {
                if let Some(&(addr, _)) = work.scatter.first() {
                    if mem.write(addr, &v.to_ne_bytes()).is_err() {
                        return fail(model, syndrome::LOCAL_PROT);
                    }
                }
                byte_cnt = 8;
            }
            Response::Nak(s) => return fail(model, s),
            Response::Rnr(timer) => {
                let rnr_retry = qp.attrs.rnr_retry;
                let left = qp.stall.map_or(rnr_retry, |s| s.rnr_left);
                if rnr_retry != 7 && left == 0 {
                    return fail(model, syndrome::RNR_RETRY_EXC);
                }
                let retry_left = qp.stall.map_or(qp.attrs.retry_cnt, |s| s.retry_left);
                let rnr_left = if rnr_retry == 7 { 7 } else { left - 1 };
                qp.stall = Some(Stall {
                    until: now + rnr_delay(timer),
                    rnr_left,
                    retry_left,
                });
                return;
            }
            Response::Dropped => {
                let left = qp.stall.map_or(qp.attrs.retry_cnt, |s| s.retry_left);
                if left == 0 {
                    return fail(model, syndrome::TRANSPORT_RETRY_EXC);
                }
                let rnr_left = qp.stall.map_or(qp.attrs.rnr_retry, |s| s.rnr_left);
                let until = now + ack_timeout(qp.attrs.timeout);
                qp.stall = Some(Stall {
                    until,
                    rnr_left,
                    retry_left: left - 1,
                });
                return;
            }
        }
        qp.stall = None;
        qp.sq_ci = qp.sq_ci.wrapping_add(work.nbb);
        qp.attrs.next_psn = work.request.hdr.psn.wrapping_add(work.request.hdr.npkts) & 0xff_ffff;
        if work.signaled {
            let cqe = Cqe::new(
                cqe_op::REQ,
                (u32::from(work.opcode) << 24) | qp.qpn,
                uidx(qp),
                work.wqe_index,
            )
            .byte_cnt(byte_cnt);
            Self::post_for(model, h, true, cqe, mem);
        }
    }
}
