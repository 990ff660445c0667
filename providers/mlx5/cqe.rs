//! 64-byte completion queue entries (`mlx5dv.h`'s `struct mlx5_cqe64` and
//! `struct mlx5_err_cqe`), decoded into [`WorkCompletion`]s as libmlx5's `mlx5_parse_cqe`
//! fills `struct ibv_wc` (the fields it defines). Every input is a plain byte array the CQ
//! copied out of its ring, so no value in it can move a read anywhere.

use super::wqe::opcode as send_opcode;
use crate::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};

/// Bytes in a CQE.
pub const CQE_SIZE: usize = 64;
/// Offset of `op_own`, the byte the device writes last.
pub const OP_OWN: usize = 63;
/// `op_own` of an entry the device has not written: opcode INVALID, owner 0.
pub const INVALID_OP_OWN: u8 = 0xf0;

/// CQE opcodes (`MLX5_CQE_*`), the high nibble of `op_own`.
pub mod opcode {
    pub const REQ: u8 = 0;
    pub const RESP_WR_IMM: u8 = 1;
    pub const RESP_SEND: u8 = 2;
    pub const RESP_SEND_IMM: u8 = 3;
    pub const RESP_SEND_INV: u8 = 4;
    /// Written by the device in the old ring after RESIZE_CQ, behind its last completion
    /// there.
    pub const RESIZE_CQ: u8 = 5;
    pub const REQ_ERR: u8 = 13;
    pub const RESP_ERR: u8 = 14;
    pub const INVALID: u8 = 15;
}

/// Whether a CQE of this opcode completes a receive (libmlx5 `cq.c`'s `is_responder`).
pub fn is_responder(op: u8) -> bool {
    matches!(
        op,
        opcode::RESP_WR_IMM | opcode::RESP_SEND | opcode::RESP_SEND_IMM | opcode::RESP_SEND_INV | opcode::RESP_ERR
    )
}

/// `mlx5dv_get_cqe_owner`.
pub fn owner(op_own: u8) -> u8 {
    op_own & 1
}

/// `mlx5dv_get_cqe_se`: the solicited-event bit (`ibv_wc` has no field for it).
#[cfg(test)]
pub fn solicited(op_own: u8) -> u8 {
    (op_own >> 1) & 1
}

/// `mlx5dv_get_cqe_format`: 0 plain, 1 and 2 inline scatter (32/64 bytes), 3 compressed.
pub fn format(op_own: u8) -> u8 {
    (op_own >> 2) & 3
}

/// `mlx5dv_get_cqe_opcode`.
pub fn cqe_opcode(op_own: u8) -> u8 {
    op_own >> 4
}

/// Every field of a CQE the provider reads, in host byte order. Error CQEs reuse bytes 54-55
/// for their syndromes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe64 {
    pub ml_path: u8,
    pub slid: u16,
    pub flags_rqpn: u32,
    pub srqn_uidx: u32,
    /// Raw, as the wire carries it (network byte order in memory).
    pub imm_inval_pkey: u32,
    pub byte_cnt: u32,
    pub timestamp: u64,
    pub sop_drop_qpn: u32,
    pub wqe_counter: u16,
    pub signature: u8,
    pub op_own: u8,
    /// `struct mlx5_err_cqe`'s `vendor_err_synd`.
    pub vendor_err_synd: u8,
    /// `struct mlx5_err_cqe`'s `syndrome`.
    pub syndrome: u8,
}

impl Cqe64 {
    /// Reads the fields out of a CQE's bytes.
    pub fn parse(b: &[u8; CQE_SIZE]) -> Self {
        let be16 = |at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
        let be32 = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        Self {
            ml_path: b[17],
            slid: be16(22),
            flags_rqpn: be32(24),
            srqn_uidx: be32(32),
            imm_inval_pkey: u32::from_ne_bytes([b[36], b[37], b[38], b[39]]),
            byte_cnt: be32(44),
            timestamp: u64::from(be32(48)) << 32 | u64::from(be32(52)),
            sop_drop_qpn: be32(56),
            wqe_counter: be16(60),
            signature: b[62],
            op_own: b[63],
            vendor_err_synd: b[54],
            syndrome: b[55],
        }
    }

    /// The user index of the QP (cqe_version 1).
    pub fn user_index(&self) -> u32 {
        self.srqn_uidx & 0xff_ffff
    }

    /// The local QP number.
    pub fn qpn(&self) -> u32 {
        self.sop_drop_qpn & 0xff_ffff
    }
}

/// Which work queue a CQE completes, and so where its `wr_id` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkQueue {
    /// The send queue: the WQE at `wqe_counter` (its index in basic blocks, modulo 2^16).
    Send { wqe_counter: u16 },
    /// The receive queue: its oldest outstanding WQE.
    Recv,
}

/// A decoded CQE: everything but the `wr_id`, which the CQ takes from the QP's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// The QP's user index.
    pub user_index: u32,
    pub queue: WorkQueue,
    pub wc: WorkCompletion,
}

/// Why a CQE cannot be turned into a completion. The CQ reports it as a
/// [`WcStatus::GENERAL_ERR`] completion whose `vendor_err` is [`BadCqe::vendor_err`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadCqe {
    /// A compressed CQE (format 3): compression is never enabled on this provider's CQs.
    Compressed,
    /// Inline-scattered data (format 1 or 2): the QPs never ask for it.
    InlineScatter,
    /// A CQE opcode the provider has no request for (resize, signature error, ...).
    Opcode(u8),
    /// A requester CQE for a send opcode the provider never posts.
    SendOpcode(u8),
    /// A user index no QP on this CQ has.
    UnknownUserIndex,
    /// A send CQE naming a WQE that is not outstanding.
    WqeCounter,
    /// A receive CQE on a QP with no receive outstanding.
    NoReceive,
}

impl BadCqe {
    /// The `vendor_err` reported for it: above 0xff, so never an mlx5 syndrome.
    pub fn vendor_err(self) -> u32 {
        0x100
            + match self {
                Self::Compressed => 1,
                Self::InlineScatter => 2,
                Self::Opcode(_) => 3,
                Self::SendOpcode(_) => 4,
                Self::UnknownUserIndex => 5,
                Self::WqeCounter => 6,
                Self::NoReceive => 7,
            }
    }
}

/// The status of an error CQE's syndrome (`MLX5_CQE_SYNDROME_*`, libmlx5 `cq.c`'s
/// `mlx5_handle_error_cqe`).
pub fn syndrome_status(syndrome: u8) -> WcStatus {
    match syndrome {
        0x01 => WcStatus::LOC_LEN_ERR,
        0x02 => WcStatus::LOC_QP_OP_ERR,
        0x04 => WcStatus::LOC_PROT_ERR,
        0x05 => WcStatus::WR_FLUSH_ERR,
        0x06 => WcStatus::MW_BIND_ERR,
        0x10 => WcStatus::BAD_RESP_ERR,
        0x11 => WcStatus::LOC_ACCESS_ERR,
        0x12 => WcStatus::REM_INV_REQ_ERR,
        0x13 => WcStatus::REM_ACCESS_ERR,
        0x14 => WcStatus::REM_OP_ERR,
        0x15 => WcStatus::RETRY_EXC_ERR,
        0x16 => WcStatus::RNR_RETRY_EXC_ERR,
        0x22 => WcStatus::REM_ABORT_ERR,
        _ => WcStatus::GENERAL_ERR,
    }
}

/// Decodes a CQE the device handed over (owner bit and opcode already checked by the poll).
pub fn decode(cqe: &Cqe64) -> Result<Decoded, BadCqe> {
    match format(cqe.op_own) {
        0 => {}
        3 => return Err(BadCqe::Compressed),
        _ => return Err(BadCqe::InlineScatter),
    }
    let mut wc = WorkCompletion::default();
    wc.qp_num = cqe.qpn();
    let send = WorkQueue::Send {
        wqe_counter: cqe.wqe_counter,
    };
    let queue = match cqe_opcode(cqe.op_own) {
        opcode::REQ => {
            let (op, flags, byte_len) = match (cqe.sop_drop_qpn >> 24) as u8 {
                send_opcode::RDMA_WRITE => (WcOpcode::RDMA_WRITE, WcFlags::empty(), 0),
                send_opcode::RDMA_WRITE_IMM => (WcOpcode::RDMA_WRITE, WcFlags::WITH_IMM, 0),
                send_opcode::SEND | send_opcode::SEND_INVAL => (WcOpcode::SEND, WcFlags::empty(), 0),
                send_opcode::SEND_IMM => (WcOpcode::SEND, WcFlags::WITH_IMM, 0),
                send_opcode::RDMA_READ => (WcOpcode::RDMA_READ, WcFlags::empty(), cqe.byte_cnt),
                send_opcode::ATOMIC_CS => (WcOpcode::COMP_SWAP, WcFlags::empty(), 8),
                send_opcode::ATOMIC_FA => (WcOpcode::FETCH_ADD, WcFlags::empty(), 8),
                other => return Err(BadCqe::SendOpcode(other)),
            };
            (wc.opcode, wc.wc_flags, wc.byte_len) = (op, flags, byte_len);
            send
        }
        op @ (opcode::RESP_WR_IMM | opcode::RESP_SEND | opcode::RESP_SEND_IMM | opcode::RESP_SEND_INV) => {
            wc.byte_len = cqe.byte_cnt;
            (wc.opcode, wc.wc_flags) = match op {
                opcode::RESP_WR_IMM => (WcOpcode::RECV_RDMA_WITH_IMM, WcFlags::WITH_IMM),
                opcode::RESP_SEND => (WcOpcode::RECV, WcFlags::empty()),
                opcode::RESP_SEND_IMM => (WcOpcode::RECV, WcFlags::WITH_IMM),
                _ => (WcOpcode::RECV, WcFlags::WITH_INV),
            };
            wc.imm_data = if op == opcode::RESP_SEND_INV {
                // `invalidated_rkey` is host order; immediate data stays as the wire has it.
                u32::from_be(cqe.imm_inval_pkey)
            } else {
                cqe.imm_inval_pkey
            };
            wc.slid = cqe.slid;
            wc.sl = ((cqe.flags_rqpn >> 24) & 0xf) as u8;
            wc.src_qp = cqe.flags_rqpn & 0xff_ffff;
            wc.dlid_path_bits = cqe.ml_path & 0x7f;
            if (cqe.flags_rqpn >> 28) & 3 != 0 {
                wc.wc_flags |= WcFlags::GRH;
            }
            wc.pkey_index = (u32::from_be(cqe.imm_inval_pkey) & 0xffff) as u16;
            WorkQueue::Recv
        }
        op @ (opcode::REQ_ERR | opcode::RESP_ERR) => {
            wc.status = syndrome_status(cqe.syndrome);
            wc.vendor_err = u32::from(cqe.vendor_err_synd);
            if op == opcode::REQ_ERR {
                send
            } else {
                WorkQueue::Recv
            }
        }
        other => return Err(BadCqe::Opcode(other)),
    };
    Ok(Decoded {
        user_index: cqe.user_index(),
        queue,
        wc,
    })
}

/// The completion reported for a CQE that cannot be decoded.
pub fn bad_cqe_completion(cqe: &Cqe64, why: BadCqe) -> WorkCompletion {
    let mut wc = WorkCompletion::default();
    wc.status = WcStatus::GENERAL_ERR;
    wc.vendor_err = why.vendor_err();
    wc.qp_num = cqe.qpn();
    wc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cqe(op_own: u8, sop_drop_qpn: u32) -> [u8; CQE_SIZE] {
        let mut b = [0u8; CQE_SIZE];
        b[56..60].copy_from_slice(&sop_drop_qpn.to_be_bytes());
        b[32..36].copy_from_slice(&0x0000_0007u32.to_be_bytes());
        b[60..62].copy_from_slice(&0x1234u16.to_be_bytes());
        b[44..48].copy_from_slice(&77u32.to_be_bytes());
        b[OP_OWN] = op_own;
        b
    }

    #[test]
    fn requester_cqes_follow_libmlx5() {
        let cases = [
            (send_opcode::SEND, WcOpcode::SEND, WcFlags::empty(), 0),
            (send_opcode::SEND_INVAL, WcOpcode::SEND, WcFlags::empty(), 0),
            (send_opcode::SEND_IMM, WcOpcode::SEND, WcFlags::WITH_IMM, 0),
            (send_opcode::RDMA_WRITE, WcOpcode::RDMA_WRITE, WcFlags::empty(), 0),
            (send_opcode::RDMA_WRITE_IMM, WcOpcode::RDMA_WRITE, WcFlags::WITH_IMM, 0),
            (send_opcode::RDMA_READ, WcOpcode::RDMA_READ, WcFlags::empty(), 77),
            (send_opcode::ATOMIC_CS, WcOpcode::COMP_SWAP, WcFlags::empty(), 8),
            (send_opcode::ATOMIC_FA, WcOpcode::FETCH_ADD, WcFlags::empty(), 8),
        ];
        for (op, wc_op, flags, len) in cases {
            let d = decode(&Cqe64::parse(&cqe(0x01, u32::from(op) << 24 | 0x1c0))).unwrap();
            assert_eq!(d.user_index, 7);
            assert_eq!(d.queue, WorkQueue::Send { wqe_counter: 0x1234 });
            assert_eq!(
                (d.wc.opcode, d.wc.wc_flags, d.wc.byte_len),
                (wc_op, flags, len),
                "{op:#x}"
            );
            assert_eq!((d.wc.status, d.wc.qp_num), (WcStatus::SUCCESS, 0x1c0));
        }
        assert_eq!(
            decode(&Cqe64::parse(&cqe(0x00, 0x25 << 24))),
            Err(BadCqe::SendOpcode(0x25))
        );
    }

    #[test]
    fn responder_cqes_fill_the_receive_fields() {
        let mut b = cqe(opcode::RESP_SEND_IMM << 4 | 0x02, 0x1c0);
        b[17] = 0xff;
        b[22..24].copy_from_slice(&0x0102u16.to_be_bytes());
        b[24..28].copy_from_slice(&0x2a00_0abcu32.to_be_bytes());
        b[36..40].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        let d = decode(&Cqe64::parse(&b)).unwrap();
        assert_eq!(d.queue, WorkQueue::Recv);
        let wc = d.wc;
        assert_eq!(
            (wc.opcode, wc.wc_flags),
            (WcOpcode::RECV, WcFlags::WITH_IMM | WcFlags::GRH)
        );
        assert_eq!(wc.imm(), Some(0xdead_beef));
        assert_eq!((wc.byte_len, wc.slid, wc.sl, wc.src_qp), (77, 0x0102, 0xa, 0xabc));
        assert_eq!((wc.dlid_path_bits, wc.pkey_index), (0x7f, 0xbeef));
        b[OP_OWN] = opcode::RESP_SEND_INV << 4;
        let wc = decode(&Cqe64::parse(&b)).unwrap().wc;
        assert_eq!(
            (wc.wc_flags & WcFlags::WITH_INV, wc.imm_data),
            (WcFlags::WITH_INV, 0xdead_beef)
        );
    }

    #[test]
    fn error_cqes_carry_status_and_vendor_syndrome() {
        let mut b = cqe(opcode::REQ_ERR << 4, 0x0a00_01c0);
        b[54] = 0x99;
        b[55] = 0x15;
        let d = decode(&Cqe64::parse(&b)).unwrap();
        assert_eq!(
            (d.wc.status, d.wc.vendor_err, d.wc.qp_num),
            (WcStatus::RETRY_EXC_ERR, 0x99, 0x1c0)
        );
        assert_eq!(d.queue, WorkQueue::Send { wqe_counter: 0x1234 });
        b[OP_OWN] = opcode::RESP_ERR << 4;
        b[55] = 0x77;
        let d = decode(&Cqe64::parse(&b)).unwrap();
        assert_eq!((d.wc.status, d.queue), (WcStatus::GENERAL_ERR, WorkQueue::Recv));
    }

    #[test]
    fn hostile_formats_and_opcodes_are_typed_errors() {
        let d = |op_own| decode(&Cqe64::parse(&cqe(op_own, 0x0a00_0000)));
        assert_eq!(d(0x0c), Err(BadCqe::Compressed));
        assert_eq!(d(0x04), Err(BadCqe::InlineScatter));
        assert_eq!(d(0x28), Err(BadCqe::InlineScatter));
        for op in [5, 6, 7, 12, 15] {
            assert_eq!(d(op << 4), Err(BadCqe::Opcode(op)));
        }
        let bad = bad_cqe_completion(&Cqe64::parse(&cqe(0x0c, 0x55)), BadCqe::Compressed);
        assert_eq!(
            (bad.status, bad.vendor_err, bad.qp_num),
            (WcStatus::GENERAL_ERR, 0x101, 0x55)
        );
    }
}
