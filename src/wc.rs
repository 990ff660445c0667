//! Work completions, layout-identical to C `struct ibv_wc`.

use crate::open_enum::open_enum;
use crate::sys::assert_layout;
use std::fmt;

open_enum! {
    /// `enum ibv_wc_status`.
    WcStatus {
        SUCCESS = 0, LOC_LEN_ERR = 1, LOC_QP_OP_ERR = 2, LOC_EEC_OP_ERR = 3, LOC_PROT_ERR = 4,
        WR_FLUSH_ERR = 5, MW_BIND_ERR = 6, BAD_RESP_ERR = 7, LOC_ACCESS_ERR = 8,
        REM_INV_REQ_ERR = 9, REM_ACCESS_ERR = 10, REM_OP_ERR = 11, RETRY_EXC_ERR = 12,
        RNR_RETRY_EXC_ERR = 13, LOC_RDD_VIOL_ERR = 14, REM_INV_RD_REQ_ERR = 15,
        REM_ABORT_ERR = 16, INV_EECN_ERR = 17, INV_EEC_STATE_ERR = 18, FATAL_ERR = 19,
        RESP_TIMEOUT_ERR = 20, GENERAL_ERR = 21,
    }
}

impl WcStatus {
    /// What the status means, as `ibv_wc_status_str(3)` says it.
    pub fn description(self) -> &'static str {
        match self {
            Self::SUCCESS => "success",
            Self::LOC_LEN_ERR => "local length error",
            Self::LOC_QP_OP_ERR => "local QP operation error",
            Self::LOC_EEC_OP_ERR => "local EE context operation error",
            Self::LOC_PROT_ERR => "local protection error",
            Self::WR_FLUSH_ERR => "Work Request Flushed Error",
            Self::MW_BIND_ERR => "memory management operation error",
            Self::BAD_RESP_ERR => "bad response error",
            Self::LOC_ACCESS_ERR => "local access error",
            Self::REM_INV_REQ_ERR => "remote invalid request error",
            Self::REM_ACCESS_ERR => "remote access error",
            Self::REM_OP_ERR => "remote operation error",
            Self::RETRY_EXC_ERR => "transport retry counter exceeded",
            Self::RNR_RETRY_EXC_ERR => "RNR retry counter exceeded",
            Self::LOC_RDD_VIOL_ERR => "local RDD violation error",
            Self::REM_INV_RD_REQ_ERR => "remote invalid RD request",
            Self::REM_ABORT_ERR => "aborted error",
            Self::INV_EECN_ERR => "invalid EE context number",
            Self::INV_EEC_STATE_ERR => "invalid EE context state",
            Self::FATAL_ERR => "fatal error",
            Self::RESP_TIMEOUT_ERR => "response timeout error",
            Self::GENERAL_ERR => "general error",
            _ => "unknown",
        }
    }
}

/// The verbs.h name and `ibv_wc_status_str(3)`'s text: `RETRY_EXC_ERR (transport retry
/// counter exceeded)`.
impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?} ({})", self.description())
    }
}

impl std::error::Error for WcStatus {}

open_enum! {
    /// `enum ibv_wc_opcode`.
    WcOpcode {
        SEND = 0, RDMA_WRITE = 1, RDMA_READ = 2, COMP_SWAP = 3, FETCH_ADD = 4, BIND_MW = 5,
        LOCAL_INV = 6, TSO = 7, ATOMIC_WRITE = 9, RECV = 128, RECV_RDMA_WITH_IMM = 129,
    }
}

/// Which of a QP's queues a request was posted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkQueue {
    /// The send queue: sends, RDMA writes and reads, atomics, binds, invalidations.
    Send,
    /// The receive queue (the QP's own, or its SRQ).
    Recv,
}

bitflags::bitflags! {
    /// `enum ibv_wc_flags`, as the kernel writes them (rxe copies its own bit values: bit 2 is
    /// rxe's own; docs/kernel-facts.md).
    #[repr(transparent)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct WcFlags: u32 {
        /// The packet carried a GRH. On a UD receive its 40 bytes head the buffer. rxe sets
        /// the flag on RC receives too, whose buffers hold no GRH: on a connected QP it says
        /// nothing about the buffer (docs/kernel-facts.md).
        const GRH = 1;
        /// `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// `IBV_WC_IP_CSUM_OK` (rxe's kernel writes this bit for SEND_WITH_INV receives).
        const IP_CSUM_OK = 1 << 2;
        /// `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
        const _ = !0;
    }
}

/// One work completion: the same 48 bytes, offsets and values as C `struct ibv_wc`, so a slice
/// of these can be handed to C code expecting `struct ibv_wc *`.
///
/// When `status` is not [`WcStatus::SUCCESS`] only `wr_id`, `status`, `qp_num` and
/// `vendor_err` are meaningful (`ibv_poll_cq(3)`).
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Vendor error syndrome.
    pub vendor_err: u32,
    /// Bytes transferred (receives: bytes received, including a UD GRH).
    pub byte_len: u32,
    /// Immediate data, raw: in network byte order (`__be32` in C); [`WorkCompletion::imm`]
    /// gives it in host order. Or the invalidated rkey.
    pub imm_data: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Remote QP number (UD).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (GSI only).
    pub pkey_index: u16,
    /// Source LID (InfiniBand only).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
    // The kernel's `ib_uverbs_wc` puts `port_num` and a reserved byte here; C's `ibv_wc` has
    // padding. Kept so the whole 48 bytes copy as one.
    _tail: [u8; 2],
}
assert_layout!(WorkCompletion, size 48, wr_id @ 0, status @ 8, opcode @ 12, vendor_err @ 16,
    byte_len @ 20, imm_data @ 24, qp_num @ 28, src_qp @ 32, wc_flags @ 36, pkey_index @ 40,
    slid @ 42, sl @ 44, dlid_path_bits @ 45);

impl WorkCompletion {
    /// Whether the work request succeeded.
    pub fn is_success(&self) -> bool {
        self.status == WcStatus::SUCCESS
    }

    /// The immediate data in host byte order (the order [`crate::SendOp`] takes it in), when
    /// this is a receive that carries one. Send completions never do: rxe flags its send
    /// completions of `*_WITH_IMM` requests `WITH_IMM` with `imm_data` 0, and
    /// `ibv_poll_cq(3)` gives the flag a meaning only for receives.
    pub fn imm(&self) -> Option<u32> {
        let receive = self.opcode.0 & WcOpcode::RECV.0 != 0;
        (receive && self.wc_flags.contains(WcFlags::WITH_IMM)).then(|| u32::from_be(self.imm_data))
    }

    /// The completion as a `Result`: `Ok(self)` on success, else the fields that are
    /// meaningful for a failed request, as an error that prints and propagates with `?`.
    pub fn result(&self) -> Result<&Self, WcError> {
        if self.is_success() {
            Ok(self)
        } else {
            Err(WcError {
                wr_id: self.wr_id,
                status: self.status,
                vendor_err: self.vendor_err,
                qp_num: self.qp_num,
            })
        }
    }
}

/// A work request that completed in error (from [`WorkCompletion::result`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WcError {
    /// The work request's id.
    pub wr_id: u64,
    /// The status, never [`WcStatus::SUCCESS`].
    pub status: WcStatus,
    /// Vendor error syndrome.
    pub vendor_err: u32,
    /// Local QP number.
    pub qp_num: u32,
}

impl fmt::Display for WcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "work request {} on QP {} completed with {} (vendor error {:#x})",
            self.wr_id, self.qp_num, self.status, self.vendor_err
        )
    }
}

impl std::error::Error for WcError {}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id)
            .field("status", &self.status)
            .field("opcode", &self.opcode)
            .field("vendor_err", &self.vendor_err)
            .field("byte_len", &self.byte_len)
            .field("imm_data", &format_args!("{:#x}", self.imm_data))
            .field("qp_num", &self.qp_num)
            .field("src_qp", &self.src_qp)
            .field("wc_flags", &self.wc_flags)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_values_print_as_numbers() {
        assert_eq!(format!("{:?}", WcStatus::REM_ACCESS_ERR), "REM_ACCESS_ERR");
        assert_eq!(format!("{:?}", WcStatus(77)), "WcStatus(77)");
        assert_eq!(format!("{:?}", WcOpcode(129)), "RECV_RDMA_WITH_IMM");
    }

    #[test]
    fn status_prints_name_and_meaning() {
        assert_eq!(
            WcStatus::RETRY_EXC_ERR.to_string(),
            "RETRY_EXC_ERR (transport retry counter exceeded)"
        );
        assert_eq!(WcStatus(77).to_string(), "WcStatus(77) (unknown)");
    }

    #[test]
    fn result_is_ok_on_success_and_names_the_request_on_error() {
        let mut wc = WorkCompletion {
            wr_id: 9,
            qp_num: 17,
            ..Default::default()
        };
        assert_eq!(wc.result().map(|w| w.wr_id), Ok(9));
        wc.status = WcStatus::REM_ACCESS_ERR;
        wc.vendor_err = 0x81;
        let err = wc.result().unwrap_err();
        assert_eq!(
            err,
            WcError {
                wr_id: 9,
                status: WcStatus::REM_ACCESS_ERR,
                vendor_err: 0x81,
                qp_num: 17
            }
        );
        assert_eq!(
            err.to_string(),
            "work request 9 on QP 17 completed with REM_ACCESS_ERR (remote access error) (vendor error 0x81)"
        );
    }

    #[test]
    fn imm_is_host_order_only_for_receives_with_the_flag() {
        let mut wc = WorkCompletion {
            imm_data: 0x1234_5678u32.to_be(),
            ..Default::default()
        };
        wc.opcode = WcOpcode::RECV;
        assert_eq!(wc.imm(), None);
        wc.wc_flags = WcFlags::WITH_IMM | WcFlags::GRH;
        assert_eq!(wc.imm(), Some(0x1234_5678));
        wc.opcode = WcOpcode::RECV_RDMA_WITH_IMM;
        assert_eq!(wc.imm(), Some(0x1234_5678));
        wc.opcode = WcOpcode::SEND;
        assert_eq!(wc.imm(), None, "a send completion carries no immediate data");
    }
}

#[cfg(test)]
crate::sys::layout_check::kernel_layouts! {
    headers: ["rdma/ib_user_verbs.h"],
    structs: {
        WorkCompletion = "struct ib_uverbs_wc" {
            wr_id, status, opcode, vendor_err, byte_len, imm_data = "ex.imm_data", qp_num,
            src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits, _tail = "port_num",
        },
    },
}
