//! The responder: runs an incoming request on its destination QP, taking a receive WQE
//! from the QP's receive queue or its SRQ (`srq.rs`), scattering the data and writing the
//! receive CQE.

use super::{mr_covering, Cqe, Device, RecvWqe, GRH_LEN};
use crate::abi::{self, cqe_op, qps, syndrome};
use crate::kernel::Model;
use crate::mem::Memory;
use crate::wire::{Op, Request, Response};

impl Device {
    /// The responder: runs `req` on the destination QP of this model.
    pub fn respond(model: &mut Model, req: &Request, mem: &dyn Memory) -> Response {
        let Some((h, qp)) = model.qps.iter().find(|(_, q)| q.qpn == req.dst_qpn) else {
            return Response::Dropped;
        };
        let receiving = matches!(qp.state, qps::RTR | qps::RTS | qps::SQD);
        let ud = qp.qp_type == abi::qpt::UD;
        let accepted = match &req.op {
            // A UD QP takes datagrams whose Q_Key is its own; the hardware drops the others
            // (and counts a Q_Key violation).
            Op::Send { datagram: Some(d), .. } => ud && receiving && d.qkey == qp.attrs.qkey,
            _ => !ud && receiving && qp.attrs.dest_qp_num == req.src_qpn,
        };
        if !accepted {
            return Response::Dropped;
        }
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
        // A UD receive buffer starts with room for the GRH: the hardware writes the GRH
        // there when the packet carried one and leaves those bytes alone when not; the
        // byte count includes them either way.
        let datagram = match &req.op {
            Op::Send { datagram: Some(d), .. } => Some(d),
            _ => None,
        };
        let with_grh;
        let (data, unwritten) = match (data, datagram) {
            (Some(payload), Some(d)) => {
                let mut bytes = Vec::with_capacity(GRH_LEN + payload.len());
                bytes.extend_from_slice(d.grh.as_ref().unwrap_or(&[0; GRH_LEN]));
                bytes.extend_from_slice(payload);
                with_grh = bytes;
                (Some(&with_grh), if d.grh.is_some() { 0 } else { GRH_LEN })
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
            cqe = cqe.datagram(d);
        }
        Self::post_for(model, h, false, cqe, mem);
        Ok(Response::Ack)
    }
}
