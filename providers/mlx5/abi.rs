//! mlx5's driver ABI (`include/uapi/rdma/mlx5-abi.h`): the driver data of every command the
//! provider sends, sizes and offsets asserted here and checked against the installed header.

use crate::sys::assert_layout;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `MLX5_LIB_CAP_4K_UAR`: the library maps UARs as 4 KiB pages. Without `MLX5_LIB_CAP_DYN_UAR`
/// the kernel hands out the legacy, statically allocated UARs this provider maps at open.
pub const LIB_CAP_4K_UAR: u64 = 1;

/// `MLX5_IB_MMAP_REGULAR_PAGE` and `MLX5_IB_MMAP_NC_PAGE`: the mmap commands for a legacy UAR
/// page (write-combining where the platform has it, and uncached).
pub const MMAP_REGULAR_PAGE: u64 = 0;
pub const MMAP_NC_PAGE: u64 = 3;

/// `struct mlx5_ib_alloc_ucontext_req_v2`: GET_CONTEXT's driver request.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct AllocUcontextReq {
    pub total_num_bfregs: u32,
    pub num_low_latency_bfregs: u32,
    pub flags: u32,
    pub comp_mask: u32,
    pub max_cqe_version: u8,
    pub reserved0: u8,
    pub reserved1: u16,
    pub reserved2: u32,
    pub lib_caps: u64,
}
assert_layout!(AllocUcontextReq, size 32, total_num_bfregs @ 0, num_low_latency_bfregs @ 4,
    flags @ 8, comp_mask @ 12, max_cqe_version @ 16, reserved0 @ 17, reserved1 @ 18,
    reserved2 @ 20, lib_caps @ 24);

/// `struct mlx5_ib_alloc_ucontext_resp`: GET_CONTEXT's driver response.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct AllocUcontextResp {
    pub qp_tab_size: u32,
    pub bf_reg_size: u32,
    pub tot_bfregs: u32,
    pub cache_line_size: u32,
    pub max_sq_desc_sz: u16,
    pub max_rq_desc_sz: u16,
    pub max_send_wqebb: u32,
    pub max_recv_wr: u32,
    pub max_srq_recv_wr: u32,
    pub num_ports: u16,
    pub flow_action_flags: u16,
    pub comp_mask: u32,
    pub response_length: u32,
    pub cqe_version: u8,
    pub cmds_supp_uhw: u8,
    pub eth_min_inline: u8,
    pub clock_info_versions: u8,
    pub hca_core_clock_offset: u64,
    pub log_uar_size: u32,
    pub num_uars_per_page: u32,
    pub num_dyn_bfregs: u32,
    pub dump_fill_mkey: u32,
}
assert_layout!(AllocUcontextResp, size 72, bf_reg_size @ 4, tot_bfregs @ 8, cache_line_size @ 12,
    max_sq_desc_sz @ 16, max_rq_desc_sz @ 18, max_send_wqebb @ 20, max_recv_wr @ 24,
    max_srq_recv_wr @ 28, num_ports @ 32, comp_mask @ 36, response_length @ 40,
    cqe_version @ 44, clock_info_versions @ 47, hca_core_clock_offset @ 48, log_uar_size @ 56,
    num_uars_per_page @ 60, num_dyn_bfregs @ 64, dump_fill_mkey @ 68);

/// `struct mlx5_ib_alloc_pd_resp`: the driver copies it without checking the response length,
/// so ALLOC_PD must always offer these 4 bytes.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct AllocPdResp {
    pub pdn: u32,
}
assert_layout!(AllocPdResp, size 4);

/// `struct mlx5_ib_create_cq`: where the CQE ring and its doorbell record are.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateCq {
    pub buf_addr: u64,
    pub db_addr: u64,
    pub cqe_size: u32,
    pub cqe_comp_en: u8,
    pub cqe_comp_res_format: u8,
    pub flags: u16,
    pub uar_page_index: u16,
    pub reserved0: u16,
    pub reserved1: u32,
}
assert_layout!(CreateCq, size 32, buf_addr @ 0, db_addr @ 8, cqe_size @ 16, cqe_comp_en @ 20,
    cqe_comp_res_format @ 21, flags @ 22, uar_page_index @ 24, reserved0 @ 26, reserved1 @ 28);

/// `struct mlx5_ib_create_cq_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateCqResp {
    pub cqn: u32,
    pub reserved: u32,
}
assert_layout!(CreateCqResp, size 8, cqn @ 0);

/// `struct mlx5_ib_resize_cq`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ResizeCq {
    pub buf_addr: u64,
    pub cqe_size: u16,
    pub reserved0: u16,
    pub reserved1: u32,
}
assert_layout!(ResizeCq, size 16, buf_addr @ 0, cqe_size @ 8, reserved0 @ 10, reserved1 @ 12);

/// `struct mlx5_ib_create_srq`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateSrq {
    pub buf_addr: u64,
    pub db_addr: u64,
    pub flags: u32,
    pub reserved0: u32,
    pub uidx: u32,
    pub reserved1: u32,
}
assert_layout!(CreateSrq, size 32, buf_addr @ 0, db_addr @ 8, flags @ 16, reserved0 @ 20,
    uidx @ 24, reserved1 @ 28);

/// `struct mlx5_ib_create_srq_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateSrqResp {
    pub srqn: u32,
    pub reserved: u32,
}
assert_layout!(CreateSrqResp, size 8, srqn @ 0);

/// `struct mlx5_ib_create_qp_dci_streams`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct DciStreams {
    pub log_num_concurent: u8,
    pub log_num_errored: u8,
}
assert_layout!(DciStreams, size 2);

/// `struct mlx5_ib_create_qp`: where the WQE buffer (RQ, then SQ) and the doorbell record
/// are, the queue geometry and the QP's user index.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateQp {
    pub buf_addr: u64,
    pub db_addr: u64,
    pub sq_wqe_count: u32,
    pub rq_wqe_count: u32,
    pub rq_wqe_shift: u32,
    pub flags: u32,
    pub uidx: u32,
    pub bfreg_index: u32,
    /// `sq_buf_addr`, or `access_key` for DCs: both arms are one `__aligned_u64`.
    pub sq_buf_addr: u64,
    pub ece_options: u32,
    pub dci_streams: DciStreams,
    pub reserved: u16,
}
assert_layout!(CreateQp, size 56, buf_addr @ 0, db_addr @ 8, sq_wqe_count @ 16,
    rq_wqe_count @ 20, rq_wqe_shift @ 24, flags @ 28, uidx @ 32, bfreg_index @ 36,
    sq_buf_addr @ 40, ece_options @ 48, dci_streams @ 52, reserved @ 54);

/// `struct mlx5_ib_create_qp_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateQpResp {
    pub bfreg_index: u32,
    pub ece_options: u32,
    pub comp_mask: u32,
    pub tirn: u32,
    pub tisn: u32,
    pub rqn: u32,
    pub sqn: u32,
    pub reserved1: u32,
    pub tir_icm_addr: u64,
}
assert_layout!(CreateQpResp, size 40, bfreg_index @ 0, ece_options @ 4, comp_mask @ 8,
    tirn @ 12, tisn @ 16, rqn @ 20, sqn @ 24, reserved1 @ 28, tir_icm_addr @ 32);

/// `struct mlx5_ib_burst_info`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct BurstInfo {
    pub max_burst_sz: u32,
    pub typical_pkt_sz: u16,
    pub reserved: u16,
}
assert_layout!(BurstInfo, size 8, max_burst_sz @ 0, typical_pkt_sz @ 4, reserved @ 6);

/// `struct mlx5_ib_modify_qp`: MODIFY_QP's driver request (all zero: no rate limiting, no
/// ECE).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ModifyQp {
    pub comp_mask: u32,
    pub burst_info: BurstInfo,
    pub ece_options: u32,
}
assert_layout!(ModifyQp, size 16, comp_mask @ 0, burst_info @ 4, ece_options @ 12);

/// `struct mlx5_ib_modify_qp_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ModifyQpResp {
    pub response_length: u32,
    pub dctn: u32,
    pub ece_options: u32,
    pub reserved: u32,
}
assert_layout!(ModifyQpResp, size 16, response_length @ 0, dctn @ 4, ece_options @ 8, reserved @ 12);

/// `struct mlx5_ib_create_ah_resp`: the destination MAC on RoCE.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateAhResp {
    pub response_length: u32,
    pub dmac: [u8; 6],
    pub reserved: [u8; 6],
}
assert_layout!(CreateAhResp, size 16, response_length @ 0, dmac @ 4, reserved @ 10);

#[cfg(test)]
crate::sys::layout_check::kernel_layouts! {
    headers: ["rdma/mlx5-abi.h"],
    structs: {
        AllocUcontextReq = "struct mlx5_ib_alloc_ucontext_req_v2" {
            total_num_bfregs, num_low_latency_bfregs, flags, comp_mask, max_cqe_version,
            reserved0, reserved1, reserved2, lib_caps,
        },
        AllocUcontextResp = "struct mlx5_ib_alloc_ucontext_resp" {
            qp_tab_size, bf_reg_size, tot_bfregs, cache_line_size, max_sq_desc_sz,
            max_rq_desc_sz, max_send_wqebb, max_recv_wr, max_srq_recv_wr, num_ports,
            flow_action_flags, comp_mask, response_length, cqe_version, cmds_supp_uhw,
            eth_min_inline, clock_info_versions, hca_core_clock_offset, log_uar_size,
            num_uars_per_page, num_dyn_bfregs, dump_fill_mkey,
        },
        AllocPdResp = "struct mlx5_ib_alloc_pd_resp" { pdn },
        CreateCq = "struct mlx5_ib_create_cq" {
            buf_addr, db_addr, cqe_size, cqe_comp_en, cqe_comp_res_format, flags,
            uar_page_index, reserved0, reserved1,
        },
        CreateCqResp = "struct mlx5_ib_create_cq_resp" { cqn, reserved },
        ResizeCq = "struct mlx5_ib_resize_cq" { buf_addr, cqe_size, reserved0, reserved1 },
        CreateSrq = "struct mlx5_ib_create_srq" { buf_addr, db_addr, flags, reserved0, uidx, reserved1 },
        CreateSrqResp = "struct mlx5_ib_create_srq_resp" { srqn, reserved },
        DciStreams = "struct mlx5_ib_create_qp_dci_streams" { log_num_concurent, log_num_errored },
        CreateQp = "struct mlx5_ib_create_qp" {
            buf_addr, db_addr, sq_wqe_count, rq_wqe_count, rq_wqe_shift, flags, uidx,
            bfreg_index, sq_buf_addr, ece_options, dci_streams, reserved,
        },
        CreateQpResp = "struct mlx5_ib_create_qp_resp" {
            bfreg_index, ece_options, comp_mask, tirn, tisn, rqn, sqn, reserved1, tir_icm_addr,
        },
        BurstInfo = "struct mlx5_ib_burst_info" { max_burst_sz, typical_pkt_sz, reserved },
        ModifyQp = "struct mlx5_ib_modify_qp" { comp_mask, burst_info, ece_options },
        ModifyQpResp = "struct mlx5_ib_modify_qp_resp" { response_length, dctn, ece_options, reserved },
        CreateAhResp = "struct mlx5_ib_create_ah_resp" { response_length, dmac, reserved },
    },
    values: {
        LIB_CAP_4K_UAR => "MLX5_LIB_CAP_4K_UAR",
        MMAP_REGULAR_PAGE => "MLX5_IB_MMAP_REGULAR_PAGE",
        MMAP_NC_PAGE => "MLX5_IB_MMAP_NC_PAGE",
        // The other arm of the union `sq_buf_addr` stands for.
        std::mem::offset_of!(CreateQp, sq_buf_addr) => "offsetof(struct mlx5_ib_create_qp, access_key)",
    },
}
