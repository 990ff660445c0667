//! rxe's driver ABI (`include/uapi/rdma/rdma_user_rxe.h`), sizes and offsets asserted.

use crate::sys::assert_layout;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `struct mminfo`: where to mmap a kernel-allocated ring on the device fd.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct MmInfo {
    /// The fake file offset (cookie) to pass to mmap.
    pub offset: u64,
    /// Bytes to map.
    pub size: u32,
    pub pad: u32,
}
assert_layout!(MmInfo, size 16, offset @ 0, size @ 8);

/// `struct rxe_create_qp_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateQpResp {
    pub rq_mi: MmInfo,
    pub sq_mi: MmInfo,
}
assert_layout!(CreateQpResp, size 32, rq_mi @ 0, sq_mi @ 16);

/// `struct rxe_create_srq_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateSrqResp {
    pub mi: MmInfo,
    pub srq_num: u32,
    pub reserved: u32,
}
assert_layout!(CreateSrqResp, size 24, srq_num @ 16);

/// `struct rxe_modify_srq_cmd`: where the kernel writes the new ring's `mminfo` on resize.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ModifySrqCmd {
    pub mmap_info_addr: u64,
}
assert_layout!(ModifySrqCmd, size 8);

/// `struct rxe_create_ah_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateAhResp {
    pub ah_num: u32,
    pub reserved: u32,
}
assert_layout!(CreateAhResp, size 8);

/// Offsets inside `struct rxe_queue_buf`, the header of every ring.
pub mod queue {
    pub const LOG2_ELEM_SIZE: usize = 0;
    pub const INDEX_MASK: usize = 4;
    pub const PRODUCER_INDEX: usize = 128;
    pub const CONSUMER_INDEX: usize = 256;
    pub const DATA: usize = 384;
}

/// `struct rxe_dma_info` without its flexible array (SGEs or inline data follow it).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct DmaInfo {
    pub length: u32,
    pub resid: u32,
    pub cur_sge: u32,
    pub num_sge: u32,
    pub sge_offset: u32,
    pub reserved: u32,
}
assert_layout!(DmaInfo, size 24, num_sge @ 12);

/// The `rdma` arm of `rxe_send_wr.wr`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct RdmaArm {
    pub remote_addr: u64,
    pub rkey: u32,
    pub reserved: u32,
}

/// The `atomic` arm of `rxe_send_wr.wr`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct AtomicArm {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
    pub reserved: u32,
}

/// The `ud` arm of `rxe_send_wr.wr` (without the legacy address vector that follows it).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UdArm {
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    pub pkey_index: u16,
    pub reserved: u16,
    pub ah_num: u32,
}
assert_layout!(UdArm, size 16, remote_qkey @ 4, pkey_index @ 8, ah_num @ 12);

/// The `mw` arm of `rxe_send_wr.wr` (memory window binds).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct MwArm {
    pub addr: u64,
    pub length: u64,
    pub mr_lkey: u32,
    pub mw_rkey: u32,
    pub rkey: u32,
    pub access: u32,
}
assert_layout!(MwArm, size 32, mr_lkey @ 16, mw_rkey @ 20, rkey @ 24, access @ 28);

/// `rxe_send_wr.wr`: 120 bytes of operation-specific fields.
#[repr(C)]
#[derive(Clone, Copy)]
pub union WrArm {
    pub rdma: RdmaArm,
    pub atomic: AtomicArm,
    pub ud: UdArm,
    pub mw: MwArm,
    pub raw: [u64; 15],
}
assert_layout!(WrArm, size 120);

/// `struct rxe_send_wqe` up to its flexible array: the 208-byte header of a send slot.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SendWqe {
    pub wr_id: u64,
    pub reserved: u32,
    pub opcode: u32,
    pub send_flags: u32,
    /// `ex.imm_data` (network order) or `ex.invalidate_rkey`.
    pub ex: u32,
    pub wr: WrArm,
    pub status: u32,
    pub state: u32,
    pub iova: u64,
    pub mask: u32,
    pub first_psn: u32,
    pub last_psn: u32,
    pub ack_length: u32,
    pub ssn: u32,
    pub has_rd_atomic: u32,
    pub dma: DmaInfo,
}
assert_layout!(SendWqe, size 208, opcode @ 12, send_flags @ 16, ex @ 20, wr @ 24,
    status @ 144, state @ 148, iova @ 152, mask @ 160, ssn @ 176, dma @ 184);

/// `struct rxe_recv_wqe` up to its SGE array: the 40-byte header of a receive slot.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct RecvWqe {
    pub wr_id: u64,
    pub reserved: u32,
    pub padding: u32,
    pub dma: DmaInfo,
}
assert_layout!(RecvWqe, size 40, dma @ 16);

#[cfg(test)]
crate::sys::layout_check::kernel_layouts! {
    headers: ["rdma/rdma_user_rxe.h"],
    use crate::wr::Sge;
    structs: {
        MmInfo = "struct mminfo" { offset, size, pad },
        // CREATE_CQ's and RESIZE_CQ's responses are read as a bare `MmInfo`.
        MmInfo = "struct rxe_create_cq_resp" { offset = "mi.offset", size = "mi.size", pad = "mi.pad" },
        MmInfo = "struct rxe_resize_cq_resp" { offset = "mi.offset", size = "mi.size", pad = "mi.pad" },
        CreateQpResp = "struct rxe_create_qp_resp" { rq_mi, sq_mi },
        CreateSrqResp = "struct rxe_create_srq_resp" { mi, srq_num, reserved },
        ModifySrqCmd = "struct rxe_modify_srq_cmd" { mmap_info_addr },
        CreateAhResp = "struct rxe_create_ah_resp" { ah_num, reserved },
        DmaInfo = "struct rxe_dma_info" {
            length, resid, cur_sge, num_sge, sge_offset, reserved,
        },
        RdmaArm = "MEMBER_TYPE(struct rxe_send_wr, wr.rdma)" { remote_addr, rkey, reserved },
        AtomicArm = "MEMBER_TYPE(struct rxe_send_wr, wr.atomic)" {
            remote_addr, compare_add, swap, rkey, reserved,
        },
        MwArm = "MEMBER_TYPE(struct rxe_send_wr, wr.mw)" {
            addr, length, mr_lkey, mw_rkey, rkey, access,
        },
        UdArm = "MEMBER_TYPE(struct rxe_send_wr, wr.ud)" until "pad" {
            remote_qpn, remote_qkey, pkey_index, reserved, ah_num,
        },
        // C nests the first six fields in `struct rxe_send_wr wr`.
        SendWqe = "struct rxe_send_wqe" {
            wr_id = "wr.wr_id", reserved = "wr.reserved", opcode = "wr.opcode",
            send_flags = "wr.send_flags", ex = "wr.ex", wr = "wr.wr", status, state, iova, mask,
            first_psn, last_psn, ack_length, ssn, has_rd_atomic, dma,
        },
        RecvWqe = "struct rxe_recv_wqe" { wr_id, reserved, padding, dma },
        // The SGEs after a WQE's header.
        Sge = "struct rxe_sge" { addr, length, lkey },
    },
    // `raw` is Rust's own view of the whole union; the size covers it.
    unions: {
        WrArm = "MEMBER_TYPE(struct rxe_send_wr, wr)" { rdma, atomic, ud },
    },
    values: {
        // SGEs and inline data start right after the fixed part of a WQE.
        size_of::<DmaInfo>() => "offsetof(struct rxe_dma_info, sge)",
        size_of::<DmaInfo>() => "offsetof(struct rxe_dma_info, inline_data)",
        size_of::<SendWqe>() => "offsetof(struct rxe_send_wqe, dma.sge)",
        size_of::<RecvWqe>() => "offsetof(struct rxe_recv_wqe, dma.sge)",
        queue::LOG2_ELEM_SIZE => "offsetof(struct rxe_queue_buf, log2_elem_size)",
        queue::INDEX_MASK => "offsetof(struct rxe_queue_buf, index_mask)",
        queue::PRODUCER_INDEX => "offsetof(struct rxe_queue_buf, producer_index)",
        queue::CONSUMER_INDEX => "offsetof(struct rxe_queue_buf, consumer_index)",
        queue::DATA => "offsetof(struct rxe_queue_buf, data)",
        queue::DATA => "sizeof(struct rxe_queue_buf)",
    },
}
