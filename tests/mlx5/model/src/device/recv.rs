//! The responder: runs an incoming request on its destination QP, taking a receive WQE
//! from the QP's receive queue or its SRQ (`srq.rs`), scattering the data and writing the
//! receive CQE.

use super::{mr_covering, Cqe, Device, RecvWqe, GRH_LEN};
use crate::abi::{self, cqe_op, qps, syndrome};
use crate::kernel::Model;
use crate::mem::Memory;
use crate::port::{DropReason, GidType};
use crate::wire::{Op, Request, Response};

impl Device {
    /// Checks `req`'s headers as the receiving port and QP would: `Err` names why a device
    /// drops it. On success, the handle of the destination QP and whether the packet is a
    /// duplicate (an RC request whose PSN the QP already took).
    fn admit(model: &Model, req: &Request) -> Result<(u32, bool), DropReason> {
        let port = &model.port;
        let hdr = &req.hdr;
        // The link: on Ethernet the frame's destination MAC, on InfiniBand the LRH's DLID.
        let ty = match (&hdr.eth, port.is_eth()) {
            (Some(eth), true) => {
                if eth.dmac != port.mac {
                    return Err(DropReason::Dmac);
                }
                if hdr.grh.is_none() {
                    return Err(DropReason::GidType);
                }
                if eth.v2 {
                    GidType::RoceV2
                } else {
                    GidType::RoceV1
                }
            }
            (None, false) => {
                if hdr.dlid != port.lid {
                    return Err(DropReason::Dlid);
                }
                GidType::Ib
            }
            (Some(_), false) => return Err(DropReason::Dlid),
            (None, true) => return Err(DropReason::Dmac),
        };
        // The network header: the DGID (RoCE v2: the destination IP) must be one of the
        // port's, of the packet's type; a routed packet must have hops left.
        if let Some(grh) = &hdr.grh {
            if port.find(&grh.dgid, ty).is_none() {
                return Err(DropReason::Dgid);
            }
            if ty == GidType::RoceV2 && grh.hop_limit == 0 {
                return Err(DropReason::HopLimit);
            }
        }
        // The BTH's P_Key: the port's table holds the default, 0xffff (a full member); a
        // packet matches when the low 15 bits agree and one side is a full member.
        if hdr.pkey & 0x7fff != 0x7fff {
            return Err(DropReason::Pkey);
        }
        let (h, qp) = model
            .qps
            .iter()
            .find(|(_, q)| q.qpn == req.dst_qpn)
            .ok_or(DropReason::DestQpn)?;
        if !matches!(qp.state, qps::RTR | qps::RTS | qps::SQD) {
            return Err(DropReason::QpState);
        }
        let ud = qp.qp_type == abi::qpt::UD;
        match &req.op {
            // A UD QP takes datagrams whose Q_Key is its own (the hardware counts a Q_Key
            // violation for the others).
            Op::Send { datagram: Some(d), .. } if ud => {
                return if d.qkey == qp.attrs.qkey {
                    Ok((h, false))
                } else {
                    Err(DropReason::Qkey)
                };
            }
            Op::Send { datagram: Some(_), .. } => return Err(DropReason::DestQpn),
            _ if ud => return Err(DropReason::DestQpn),
            _ => {}
        }
        // A connected QP takes packets only from the QP its path names: that QP number,
        // from the GID (or LID) it is connected to, to its own GID at the path's index,
        // of that GID's type.
        if qp.attrs.dest_qp_num != req.src_qpn {
            return Err(DropReason::SrcQpn);
        }
        let dest = &qp.attrs.dest;
        match &hdr.grh {
            Some(grh) if port.is_eth() || dest.is_global != 0 => {
                let own = port.gid(dest.sgid_index).map_err(|_| DropReason::Dgid)?;
                if own.gid != grh.dgid {
                    return Err(DropReason::Dgid);
                }
                if own.ty != ty {
                    return Err(DropReason::GidType);
                }
                if grh.sgid != dest.dgid {
                    return Err(DropReason::Source);
                }
            }
            None if !port.is_eth() && dest.is_global == 0 => {
                if req.src_lid != dest.dlid {
                    return Err(DropReason::Source);
                }
            }
            _ => return Err(DropReason::Source),
        }
        // RC takes the PSN it expects; one it already took is a duplicate (answered again,
        // not run again); any other is dropped (the requester's retries run out). UC
        // starts over at whatever PSN a message begins with.
        if qp.qp_type == abi::qpt::RC && hdr.psn != qp.attrs.epsn {
            let behind = qp.attrs.epsn.wrapping_sub(hdr.psn) & 0xff_ffff;
            if behind != 0 && behind < 1 << 23 {
                return Ok((h, true));
            }
            return Err(DropReason::Psn);
        }
        Ok((h, false))
    }

    /// The responder: runs `req` on the destination QP of this model, if the device takes
    /// it ([`Self::admit`]); a packet it drops is counted with its reason.
    pub fn respond(model: &mut Model, req: &Request, mem: &dyn Memory) -> Response {
        let (h, duplicate) = match Self::admit(model, req) {
            Ok(v) => v,
            Err(reason) => {
                model.drops.add(reason);
                crate::log!(
                    "drop ({}) for qpn {:#x} from {:#x}",
                    reason.name(),
                    req.dst_qpn,
                    req.src_qpn
                );
                return Response::Dropped;
            }
        };
        if duplicate {
            // Sends and writes already done are acknowledged again; a READ is served
            // again (it changes nothing); an atomic's saved result is not modelled.
            if !matches!(req.op, Op::Read { .. } | Op::CompareSwap { .. } | Op::FetchAdd { .. }) {
                return Response::Ack;
            }
            if !matches!(req.op, Op::Read { .. }) {
                return Response::Dropped;
            }
        }
        let answer = Self::execute(model, h, req, mem);
        if !duplicate
            && matches!(
                answer,
                Response::Ack | Response::ReadData(_) | Response::AtomicOriginal(_)
            )
        {
            if let Some(qp) = model.qps.get_mut(h) {
                if qp.qp_type == abi::qpt::UC {
                    qp.attrs.epsn = req.hdr.psn;
                }
                qp.attrs.epsn = qp.attrs.epsn.wrapping_add(req.hdr.npkts) & 0xff_ffff;
            }
        }
        answer
    }

    /// Runs an admitted request on QP `h`.
    fn execute(model: &mut Model, h: u32, req: &Request, mem: &dyn Memory) -> Response {
        let Some(qp) = model.qps.get(h) else {
            return Response::Dropped;
        };
        let rc = qp.qp_type == abi::qpt::RC;
        // Remote read and atomics are off without responder resources (qp.c
        // set_qpc_atomic_flags: `if (!dest_rd_atomic) access_flags &= IB_ACCESS_REMOTE_WRITE`).
        let mut qp_access = qp.attrs.access;
        if rc && qp.attrs.max_dest_rd_atomic == 0 {
            qp_access &= abi::access::REMOTE_WRITE;
        }
        let (pd, min_rnr) = (qp.pd, qp.attrs.min_rnr_timer);
        let result = match &req.op {
            Op::Send {
                imm, solicited, data, ..
            } => Self::receive(model, h, req, *imm, *solicited, Some(data), mem),
            Op::Write {
                raddr,
                rkey,
                imm,
                solicited,
                data,
            } => {
                let need = abi::access::REMOTE_WRITE;
                match mr_covering(&model.mrs, *rkey, pd, *raddr, data.len() as u64, need) {
                    Some(at) if qp_access & need != 0 => {
                        // An immediate needs a receive WQE: check for one before writing.
                        if imm.is_some() && !Self::has_recv(model, h, mem) {
                            Err(Response::Rnr(min_rnr))
                        } else if mem.write(at, data).is_err() {
                            Err(Response::Nak(syndrome::REMOTE_ACCESS))
                        } else if imm.is_some() {
                            Self::receive(model, h, req, *imm, *solicited, None, mem)
                        } else {
                            Ok(Response::Ack)
                        }
                    }
                    _ => Err(Response::Nak(syndrome::REMOTE_ACCESS)),
                }
            }
            Op::Read { raddr, rkey, len } => {
                let need = abi::access::REMOTE_READ;
                match mr_covering(&model.mrs, *rkey, pd, *raddr, u64::from(*len), need) {
                    Some(at) if rc && qp_access & need != 0 => {
                        let mut buf = vec![0u8; *len as usize];
                        match mem.read(at, &mut buf) {
                            Ok(()) => Ok(Response::ReadData(buf)),
                            Err(_) => Err(Response::Nak(syndrome::REMOTE_ACCESS)),
                        }
                    }
                    _ if !rc => Err(Response::Nak(syndrome::REMOTE_INVAL_REQ)),
                    _ => Err(Response::Nak(syndrome::REMOTE_ACCESS)),
                }
            }
            Op::CompareSwap { raddr, rkey, .. } | Op::FetchAdd { raddr, rkey, .. } => {
                let need = abi::access::REMOTE_ATOMIC;
                if !rc || raddr % 8 != 0 {
                    Err(Response::Nak(syndrome::REMOTE_INVAL_REQ))
                } else {
                    match mr_covering(&model.mrs, *rkey, pd, *raddr, 8, need) {
                        Some(at) if qp_access & need != 0 => {
                            // Atomics operate on 64-bit words in host order, as on a device
                            // whose driver reports IB_ATOMIC_HCA (mlx5 reports it only
                            // when the device answers in host endianness).
                            let done = match &req.op {
                                Op::CompareSwap { compare, swap, .. } => mem.compare_swap(at, *compare, *swap),
                                Op::FetchAdd { add, .. } => mem.fetch_add(at, *add),
                                _ => Err(crate::mem::Fault),
                            };
                            done.map(Response::AtomicOriginal)
                                .map_err(|_| Response::Nak(syndrome::REMOTE_ACCESS))
                        }
                        _ => Err(Response::Nak(syndrome::REMOTE_ACCESS)),
                    }
                }
            }
        };
        match result {
            Ok(r) => r,
            Err(Response::Nak(s)) => {
                // A NAK'd request is fatal for an RC responder too; UC drops it silently.
                if rc {
                    if let Some(qp) = model.qps.get_mut(h) {
                        qp.state = qps::ERR;
                    }
                }
                Response::Nak(s)
            }
            Err(other) => other,
        }
    }

    fn has_recv(model: &mut Model, h: u32, mem: &dyn Memory) -> bool {
        matches!(Self::next_recv(model, h, mem), Ok(Some(_)))
    }

    /// The receive WQE the next message to QP `h` lands in: from its receive queue or its
    /// SRQ; `Ok(None)` when none is posted, `Err(())` when the doorbell record claims more
    /// than the ring holds (the QP, or the SRQ, is in error: the message is dropped).
    fn next_recv(model: &mut Model, h: u32, mem: &dyn Memory) -> Result<Option<RecvWqe>, ()> {
        let Some(qp) = model.qps.get(h) else { return Err(()) };
        if let Some(srq) = qp.srq {
            return Self::srq_next(model, srq, mem);
        }
        if qp.rq_cnt == 0 {
            return Ok(None);
        }
        let Ok(rcv) = mem.read_be32(qp.db + abi::RCV_DBR) else {
            Self::raise_qp_fatal(model, h);
            return Err(());
        };
        let rcv = rcv as u16;
        if rcv == qp.rq_ci {
            return Ok(None);
        }
        if u32::from(rcv.wrapping_sub(qp.rq_ci)) > qp.rq_cnt {
            Self::raise_qp_fatal(model, h);
            return Err(());
        }
        let stride = 1u64 << qp.rq_shift.min(31);
        Ok(Some(RecvWqe {
            segs: qp.buf + (u64::from(qp.rq_ci) & u64::from(qp.rq_cnt - 1)) * stride,
            max_segs: (stride / 16).min(64),
            index: qp.rq_ci,
            srq: None,
        }))
    }

    /// Hands `wqe` from QP `h`'s receive queue, or its SRQ, to the message.
    fn take_recv(model: &mut Model, h: u32, wqe: &RecvWqe, mem: &dyn Memory) {
        match wqe.srq {
            Some(srq) => Self::srq_take(model, srq, wqe.index, mem),
            None => {
                if let Some(qp) = model.qps.get_mut(h) {
                    qp.rq_ci = qp.rq_ci.wrapping_add(1);
                }
            }
        }
    }

    /// Consumes the next receive WQE of QP `h` for an incoming message: scatters `data`
    /// (SEND) and writes the receive CQE. `Err` is the response for the requester.
    fn receive(
        model: &mut Model,
        h: u32,
        req: &Request,
        imm: Option<u32>,
        solicited: bool,
        data: Option<&Vec<u8>>,
        mem: &dyn Memory,
    ) -> Result<Response, Response> {
        let Some(qp) = model.qps.get(h) else {
            return Err(Response::Dropped);
        };
        let min_rnr = qp.attrs.min_rnr_timer;
        let rc = qp.qp_type == abi::qpt::RC;
        let (qpn, pd) = (qp.qpn, qp.pd);
        let u = Self::recv_uidx(model, qp);
        let wqe = match Self::next_recv(model, h, mem) {
            Ok(Some(wqe)) => wqe,
            // UC drops what it cannot receive.
            Ok(None) if rc => return Err(Response::Rnr(min_rnr)),
            Ok(None) => return Ok(Response::Ack),
            Err(()) => return Err(Response::Dropped),
        };
        let index = wqe.index;
        // A UD receive buffer starts with room for the GRH: the hardware writes the network
        // header there when the packet carried one (a GRH; on RoCE v2 over IPv4 the IPv4
        // header in the last 20 bytes) and leaves the bytes it does not write alone; the
        // byte count includes all 40 either way.
        let datagram = match &req.op {
            Op::Send { datagram: Some(d), .. } => Some(d),
            _ => None,
        };
        let with_grh;
        let mut l3 = None;
        let (data, unwritten) = match (data, datagram) {
            (Some(payload), Some(_)) => {
                let mut bytes = Vec::with_capacity(GRH_LEN + payload.len());
                let (grh, skip) = match network_header(&req.hdr, payload.len(), imm.is_some()) {
                    Some((g, kind, skip)) => {
                        l3 = Some(kind);
                        (g, skip)
                    }
                    None => ([0; GRH_LEN], GRH_LEN),
                };
                bytes.extend_from_slice(&grh);
                bytes.extend_from_slice(payload);
                with_grh = bytes;
                (Some(&with_grh), skip)
            }
            (data, _) => (data, 0),
        };
        let local_error = |model: &mut Model, synd: u8, nak: u8| {
            Self::take_recv(model, h, &wqe, mem);
            if let Some(qp) = model.qps.get_mut(h) {
                qp.state = qps::ERR;
            }
            let cqe = Cqe::new(cqe_op::RESP_ERR, qpn, u, index).syndrome(synd);
            Self::post_for(model, h, false, cqe, mem);
            Err(Response::Nak(nak))
        };
        let len = data.map_or(0, |d| d.len());
        if let Some(data) = data {
            let mut at = 0usize;
            for s in 0..wqe.max_segs {
                if at >= len {
                    break;
                }
                let mut seg = [0u8; 16];
                if mem.read(wqe.segs + s * 16, &mut seg).is_err() {
                    return local_error(model, syndrome::LOCAL_PROT, syndrome::REMOTE_OP);
                }
                let count = u32::from_be_bytes(seg[0..4].try_into().unwrap_or_default());
                let lkey = u32::from_be_bytes(seg[4..8].try_into().unwrap_or_default());
                let addr = u64::from_be_bytes(seg[8..16].try_into().unwrap_or_default());
                if lkey == abi::INVALID_LKEY {
                    break;
                }
                let take = (count as usize).min(len - at);
                if take == 0 {
                    continue;
                }
                let Some(host) = mr_covering(&model.mrs, lkey, pd, addr, take as u64, abi::access::LOCAL_WRITE) else {
                    return local_error(model, syndrome::LOCAL_PROT, syndrome::REMOTE_OP);
                };
                let from = unwritten.clamp(at, at + take);
                if from < at + take && mem.write(host + (from - at) as u64, &data[from..at + take]).is_err() {
                    return local_error(model, syndrome::LOCAL_PROT, syndrome::REMOTE_OP);
                }
                at += take;
            }
            if at < len {
                return local_error(model, syndrome::LOCAL_LENGTH, syndrome::REMOTE_INVAL_REQ);
            }
        }
        Self::take_recv(model, h, &wqe, mem);
        let op = match (data.is_some(), imm.is_some()) {
            (true, false) => cqe_op::RESP_SEND,
            (true, true) => cqe_op::RESP_SEND_IMM,
            (false, _) => cqe_op::RESP_WR_IMM,
        };
        let payload_len = match &req.op {
            Op::Write { data, .. } => data.len(),
            _ => len,
        };
        let mut cqe = Cqe::new(op, qpn, u, index)
            .byte_cnt(payload_len as u32)
            .source(req.src_lid, req.src_qpn)
            .solicited(solicited);
        if let Some(imm) = imm {
            cqe = cqe.imm(imm);
        }
        if let Some(d) = datagram {
            cqe = cqe.datagram(d, l3, model.port.is_eth());
        } else if let Some(kind) = l3_of(&req.hdr) {
            // A connected QP's receive says so too when its packet had a network header
            // (on RoCE, every packet).
            cqe = cqe.network_header(kind, model.port.is_eth());
        }
        Self::post_for(model, h, false, cqe, mem);
        Ok(Response::Ack)
    }
}

/// What a receive CQE says of the network header (`flags_rqpn` bits 24-25 on Ethernet:
/// `MLX5_CQE_ROCE_L3_HEADER_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum L3 {
    /// An InfiniBand or RoCE v1 GRH.
    Grh = 0,
    Ipv6 = 1,
    Ipv4 = 2,
}

/// The kind of network header a packet with `hdr` has, if any.
fn l3_of(hdr: &crate::wire::Headers) -> Option<L3> {
    let grh = hdr.grh?;
    let v2 = hdr.eth.is_some_and(|e| e.v2);
    let v4 = grh.dgid[..10] == [0; 10] && grh.dgid[10..12] == [0xff, 0xff];
    Some(match (v2, v4) {
        (true, true) => L3::Ipv4,
        (true, false) => L3::Ipv6,
        _ => L3::Grh,
    })
}

/// The 40 bytes a UD receive gets at its head for a packet with `hdr` and a payload of
/// `len` bytes, their kind, and how many leading bytes stay unwritten: `None` when the
/// packet has no network header (an InfiniBand packet without a GRH).
fn network_header(hdr: &crate::wire::Headers, len: usize, imm: bool) -> Option<([u8; GRH_LEN], L3, usize)> {
    let grh = hdr.grh?;
    // BTH 12, DETH 8, the immediate, the payload padded to 4, the ICRC 4.
    let transport = 12 + 8 + if imm { 4 } else { 0 } + len.div_ceil(4) * 4 + 4;
    let mut g = [0u8; GRH_LEN];
    let v2 = hdr.eth.is_some_and(|e| e.v2);
    let v4 = grh.dgid[..10] == [0; 10] && grh.dgid[10..12] == [0xff, 0xff];
    if v2 && v4 {
        // RoCE v2 over IPv4: the IPv4 header (20 bytes, DF, protocol UDP) ends the room.
        let total = 20 + 8 + transport;
        let ip = &mut g[20..];
        ip[0] = 0x45;
        ip[1] = grh.tclass;
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ip[6] = 0x40;
        ip[8] = grh.hop_limit;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&grh.sgid[12..]);
        ip[16..20].copy_from_slice(&grh.dgid[12..]);
        let mut sum = 0u32;
        for pair in ip.chunks(2) {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        return Some((g, L3::Ipv4, 20));
    }
    // A GRH (InfiniBand, RoCE v1: next header 0x1b) or an IPv6 header (RoCE v2: UDP, its
    // 8 bytes counted in the payload length).
    g[0..4].copy_from_slice(&((6 << 28) | (u32::from(grh.tclass) << 20) | (grh.flow_label & 0xf_ffff)).to_be_bytes());
    let paylen = transport + if v2 { 8 } else { 0 };
    g[4..6].copy_from_slice(&(paylen as u16).to_be_bytes());
    g[6] = if v2 { 17 } else { 0x1b };
    g[7] = grh.hop_limit;
    g[8..24].copy_from_slice(&grh.sgid);
    g[24..40].copy_from_slice(&grh.dgid);
    Some((g, if v2 { L3::Ipv6 } else { L3::Grh }, 0))
}
