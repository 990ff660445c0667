//! siw's driver ABI (`include/uapi/rdma/siw-abi.h`), sizes and offsets asserted (and checked
//! against the installed header by the layout test below).

use crate::sys::assert_layout;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `SIW_MAX_SGE`: scatter/gather entries in one send or receive slot.
pub const MAX_SGE: usize = 6;
/// `SIW_MAX_INLINE`: inline bytes a send slot holds (the room of SGEs 1 to 5).
pub const MAX_INLINE: u32 = (size_of::<SiwSge>() * (MAX_SGE - 1)) as u32;
/// `SIW_INVAL_UOBJ_KEY`: a response's key when the kernel could not prepare the mapping.
pub const INVAL_UOBJ_KEY: u64 = 0x08FFFF + 1;

/// `enum siw_opcode`, the values a user-space slot may carry.
pub mod op {
    pub const WRITE: u8 = 0;
    pub const READ: u8 = 1;
    pub const READ_LOCAL_INV: u8 = 2;
    pub const SEND: u8 = 3;
    pub const SEND_WITH_IMM: u8 = 4;
    pub const SEND_REMOTE_INV: u8 = 5;
    pub const FETCH_AND_ADD: u8 = 6;
    pub const COMP_AND_SWAP: u8 = 7;
    pub const RECEIVE: u8 = 8;
}

/// `enum siw_wqe_flags`.
pub mod wqe {
    pub const VALID: u16 = 1;
    pub const INLINE: u16 = 1 << 1;
    pub const SIGNALLED: u16 = 1 << 2;
    pub const SOLICITED: u16 = 1 << 3;
    pub const READ_FENCE: u16 = 1 << 4;
    pub const REM_INVAL: u16 = 1 << 5;
}

/// `enum siw_notify_flags`, written into the CQ's control word to arm it.
pub mod notify {
    #[cfg(test)]
    pub const NOT: u32 = 0;
    pub const SOLICITED: u32 = 1;
    pub const NEXT_COMPLETION: u32 = 1 << 1;
}

/// `struct siw_uresp_alloc_ctx`: GET_CONTEXT's driver response (the kernel refuses a shorter
/// buffer).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct AllocCtxResp {
    pub dev_id: u32,
    pub pad: u32,
}
assert_layout!(AllocCtxResp, size 8);

/// `struct siw_uresp_create_cq`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateCqResp {
    pub cq_id: u32,
    pub num_cqe: u32,
    pub cq_key: u64,
}
assert_layout!(CreateCqResp, size 16, num_cqe @ 4, cq_key @ 8);

/// `struct siw_uresp_create_qp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateQpResp {
    pub qp_id: u32,
    pub num_sqe: u32,
    pub num_rqe: u32,
    pub pad: u32,
    pub sq_key: u64,
    pub rq_key: u64,
}
assert_layout!(CreateQpResp, size 32, num_sqe @ 4, num_rqe @ 8, sq_key @ 16, rq_key @ 24);

/// `struct siw_ureq_reg_mr`: REG_MR's driver request (the kernel refuses it missing).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct RegMrReq {
    pub stag_key: u8,
    pub reserved: [u8; 3],
    pub pad: u32,
}
assert_layout!(RegMrReq, size 8, pad @ 4);

/// `struct siw_uresp_reg_mr`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct RegMrResp {
    pub stag: u32,
    pub pad: u32,
}
assert_layout!(RegMrResp, size 8);

/// `struct siw_uresp_create_srq`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateSrqResp {
    pub num_rqe: u32,
    pub pad: u32,
    pub srq_key: u64,
}
assert_layout!(CreateSrqResp, size 16, srq_key @ 8);

/// `struct siw_sge`: the layout of the core's `Sge` (address, length, key).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct SiwSge {
    pub laddr: u64,
    pub length: u32,
    pub lkey: u32,
}
assert_layout!(SiwSge, size 16, length @ 8, lkey @ 12);

/// `struct siw_sqe`: a 120-byte send slot; `flags` (with VALID) is written last.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Sqe {
    pub id: u64,
    pub flags: u16,
    pub num_sge: u8,
    pub opcode: u8,
    pub rkey: u32,
    pub raddr: u64,
    pub sge: [SiwSge; MAX_SGE],
}
assert_layout!(Sqe, size 120, flags @ 8, num_sge @ 10, opcode @ 11, rkey @ 12, raddr @ 16, sge @ 24);

/// `struct siw_rqe`: a 112-byte receive slot.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Rqe {
    pub id: u64,
    pub flags: u16,
    pub num_sge: u8,
    pub opcode: u8,
    pub unused: u32,
    pub sge: [SiwSge; MAX_SGE],
}
assert_layout!(Rqe, size 112, flags @ 8, num_sge @ 10, sge @ 16);

/// `struct siw_cqe`: a 32-byte completion slot; the kernel sets `flags` (VALID) last.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct Cqe {
    pub id: u64,
    pub flags: u8,
    pub opcode: u8,
    pub status: u16,
    pub bytes: u32,
    /// `imm_data`, or `inval_stag` in its low 32 bits.
    pub imm_data: u64,
    pub qp_id: u64,
}
assert_layout!(Cqe, size 32, flags @ 8, opcode @ 9, status @ 10, bytes @ 12, imm_data @ 16, qp_id @ 24);

/// `struct siw_cq_ctrl`: after the CQ's slots; user space writes the notify flags.
pub const CQ_CTRL_SIZE: usize = 8;

#[cfg(test)]
crate::sys::layout_check::kernel_layouts! {
    headers: ["rdma/siw-abi.h"],
    structs: {
        AllocCtxResp = "struct siw_uresp_alloc_ctx" { dev_id, pad },
        CreateCqResp = "struct siw_uresp_create_cq" { cq_id, num_cqe, cq_key },
        CreateQpResp = "struct siw_uresp_create_qp" { qp_id, num_sqe, num_rqe, pad, sq_key, rq_key },
        RegMrReq = "struct siw_ureq_reg_mr" { stag_key, reserved, pad },
        RegMrResp = "struct siw_uresp_reg_mr" { stag, pad },
        CreateSrqResp = "struct siw_uresp_create_srq" { num_rqe, pad, srq_key },
        SiwSge = "struct siw_sge" { laddr, length, lkey },
        Sqe = "struct siw_sqe" { id, flags, num_sge, opcode, rkey, raddr, sge },
        Rqe = "struct siw_rqe" { id, flags, num_sge, opcode, unused, sge },
        Cqe = "struct siw_cqe" { id, flags, opcode, status, bytes, imm_data, qp_id },
    },
    values: {
        MAX_SGE => "SIW_MAX_SGE",
        MAX_INLINE as usize => "SIW_MAX_INLINE",
        INVAL_UOBJ_KEY as usize => "SIW_INVAL_UOBJ_KEY",
        CQ_CTRL_SIZE => "sizeof(struct siw_cq_ctrl)",
        op::WRITE as usize => "SIW_OP_WRITE",
        op::READ as usize => "SIW_OP_READ",
        op::READ_LOCAL_INV as usize => "SIW_OP_READ_LOCAL_INV",
        op::SEND as usize => "SIW_OP_SEND",
        op::SEND_WITH_IMM as usize => "SIW_OP_SEND_WITH_IMM",
        op::SEND_REMOTE_INV as usize => "SIW_OP_SEND_REMOTE_INV",
        op::FETCH_AND_ADD as usize => "SIW_OP_FETCH_AND_ADD",
        op::COMP_AND_SWAP as usize => "SIW_OP_COMP_AND_SWAP",
        op::RECEIVE as usize => "SIW_OP_RECEIVE",
        wqe::VALID as usize => "SIW_WQE_VALID",
        wqe::INLINE as usize => "SIW_WQE_INLINE",
        wqe::SIGNALLED as usize => "SIW_WQE_SIGNALLED",
        wqe::SOLICITED as usize => "SIW_WQE_SOLICITED",
        wqe::READ_FENCE as usize => "SIW_WQE_READ_FENCE",
        wqe::REM_INVAL as usize => "SIW_WQE_REM_INVAL",
        notify::NOT as usize => "SIW_NOTIFY_NOT",
        notify::SOLICITED as usize => "SIW_NOTIFY_SOLICITED",
        notify::NEXT_COMPLETION as usize => "SIW_NOTIFY_NEXT_COMPLETION",
    },
}
