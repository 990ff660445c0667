//! The kernel ABI the model speaks: uverbs write()/ioctl framing and the mlx5 driver data, as
//! `zerocopy` structs checked against `/usr/include/rdma/{ib_user_verbs,mlx5-abi,
//! rdma_user_ioctl_cmds}.h` (sizes asserted below), and the mlx5 WQE/CQE constants of
//! `/usr/include/infiniband/mlx5dv.h`.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Page size of the machine (x86_64); every UAR mapping is exactly one page.
pub const PAGE_SIZE: u64 = 4096;

/// `enum ib_uverbs_write_cmds` (ib_user_verbs.h).
pub mod cmd {
    pub const GET_CONTEXT: u32 = 0;
    pub const QUERY_DEVICE: u32 = 1;
    pub const QUERY_PORT: u32 = 2;
    pub const ALLOC_PD: u32 = 3;
    pub const DEALLOC_PD: u32 = 4;
    pub const CREATE_AH: u32 = 5;
    pub const DESTROY_AH: u32 = 8;
    pub const REG_MR: u32 = 9;
    pub const DEREG_MR: u32 = 13;
    pub const CREATE_COMP_CHANNEL: u32 = 17;
    pub const CREATE_CQ: u32 = 18;
    pub const RESIZE_CQ: u32 = 19;
    pub const DESTROY_CQ: u32 = 20;
    pub const CREATE_QP: u32 = 24;
    pub const QUERY_QP: u32 = 25;
    pub const MODIFY_QP: u32 = 26;
    pub const DESTROY_QP: u32 = 27;
    pub const CREATE_SRQ: u32 = 32;
    pub const MODIFY_SRQ: u32 = 33;
    pub const QUERY_SRQ: u32 = 34;
    pub const DESTROY_SRQ: u32 = 35;
    /// The last write command 6.1 declares (`IB_USER_VERBS_CMD_OPEN_QP`): the table ends here.
    pub const OPEN_QP: u32 = 40;
    /// `IB_USER_VERBS_CMD_FLAG_EXTENDED`.
    pub const FLAG_EXTENDED: u32 = 0x8000_0000;
    /// `IB_USER_VERBS_CMD_COMMAND_MASK`.
    pub const COMMAND_MASK: u32 = 0xff;
}

/// `RDMA_VERBS_IOCTL` = `_IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr)`.
pub const RDMA_VERBS_IOCTL: u64 = 0xc018_1b01;
/// `enum rdma_driver_id`: `RDMA_DRIVER_MLX5`.
pub const RDMA_DRIVER_MLX5: u32 = 1;
/// `UVERBS_ATTR_F_MANDATORY`.
pub const ATTR_F_MANDATORY: u16 = 1;
/// `UVERBS_ATTR_F_VALID_OUTPUT`.
pub const ATTR_F_VALID_OUTPUT: u16 = 2;
/// `MLX5_IB_OBJECT_UAR` and its methods and attributes (mlx5_user_ioctl_cmds.h).
pub mod uar_obj {
    pub const OBJECT: u16 = 0x1008;
    pub const METHOD_ALLOC: u16 = 0x1000;
    pub const METHOD_DESTROY: u16 = 0x1001;
    pub const ATTR_HANDLE: u16 = 0x1000;
    pub const ATTR_TYPE: u16 = 0x1001;
    pub const ATTR_MMAP_OFFSET: u16 = 0x1002;
    pub const ATTR_MMAP_LENGTH: u16 = 0x1003;
    pub const ATTR_PAGE_ID: u16 = 0x1004;
    /// `MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF` / `_NC`.
    pub const TYPE_BF: u64 = 0;
    pub const TYPE_NC: u64 = 1;
}

/// `enum ib_event_type` values the model raises.
pub mod event {
    pub const CQ_ERR: u32 = 0;
    pub const QP_FATAL: u32 = 1;
    pub const SRQ_ERR: u32 = 14;
    pub const SRQ_LIMIT_REACHED: u32 = 15;
}

/// `enum ib_qp_state`.
pub mod qps {
    pub const RESET: u8 = 0;
    pub const INIT: u8 = 1;
    pub const RTR: u8 = 2;
    pub const RTS: u8 = 3;
    pub const SQD: u8 = 4;
    pub const SQE: u8 = 5;
    pub const ERR: u8 = 6;
}

/// `enum ib_qp_attr_mask` bits.
pub mod qp_attr {
    pub const STATE: u32 = 1 << 0;
    pub const CUR_STATE: u32 = 1 << 1;
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const PORT: u32 = 1 << 5;
    pub const QKEY: u32 = 1 << 6;
    pub const AV: u32 = 1 << 7;
    pub const PATH_MTU: u32 = 1 << 8;
    pub const TIMEOUT: u32 = 1 << 9;
    pub const RETRY_CNT: u32 = 1 << 10;
    pub const RNR_RETRY: u32 = 1 << 11;
    pub const RQ_PSN: u32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub const ALT_PATH: u32 = 1 << 14;
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    pub const SQ_PSN: u32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    pub const DEST_QPN: u32 = 1 << 20;
}

/// `enum ib_access_flags` bits the model checks.
pub mod access {
    pub const LOCAL_WRITE: u32 = 1 << 0;
    pub const REMOTE_WRITE: u32 = 1 << 1;
    pub const REMOTE_READ: u32 = 1 << 2;
    pub const REMOTE_ATOMIC: u32 = 1 << 3;
}

/// `enum ib_qp_type` values the model runs.
pub mod qpt {
    pub const RC: u8 = 2;
    pub const UC: u8 = 3;
    pub const UD: u8 = 4;
}

/// mlx5 send opcodes (mlx5dv.h `MLX5_OPCODE_*`).
pub mod opcode {
    pub const NOP: u8 = 0x00;
    pub const RDMA_WRITE: u8 = 0x08;
    pub const RDMA_WRITE_IMM: u8 = 0x09;
    pub const SEND: u8 = 0x0a;
    pub const SEND_IMM: u8 = 0x0b;
    pub const RDMA_READ: u8 = 0x10;
    pub const ATOMIC_CS: u8 = 0x11;
    pub const ATOMIC_FA: u8 = 0x12;
}

/// CQE opcodes (mlx5dv.h `MLX5_CQE_*`), the high nibble of `op_own`.
pub mod cqe_op {
    pub const REQ: u8 = 0;
    pub const RESP_WR_IMM: u8 = 1;
    pub const RESP_SEND: u8 = 2;
    pub const RESP_SEND_IMM: u8 = 3;
    pub const REQ_ERR: u8 = 13;
    pub const RESP_ERR: u8 = 14;
}

/// Error CQE syndromes (mlx5dv.h `MLX5_CQE_SYNDROME_*`).
pub mod syndrome {
    pub const LOCAL_LENGTH: u8 = 0x01;
    pub const LOCAL_QP_OP: u8 = 0x02;
    pub const LOCAL_PROT: u8 = 0x04;
    pub const WR_FLUSH: u8 = 0x05;
    pub const REMOTE_INVAL_REQ: u8 = 0x12;
    pub const REMOTE_ACCESS: u8 = 0x13;
    pub const REMOTE_OP: u8 = 0x14;
    pub const TRANSPORT_RETRY_EXC: u8 = 0x15;
    pub const RNR_RETRY_EXC: u8 = 0x16;
}

/// `fm_ce_se` bits of the control segment.
pub const WQE_CTRL_CQ_UPDATE: u8 = 0x08;
pub const WQE_CTRL_SOLICITED: u8 = 0x02;
/// `MLX5_INLINE_SEG`: the byte count's inline flag.
pub const INLINE_SEG: u32 = 0x8000_0000;
/// `MLX5_INVALID_LKEY`: ends a receive WQE's scatter list.
pub const INVALID_LKEY: u32 = 0x100;
/// The first bfreg's offset in a UAR page (`MLX5_BF_OFFSET`).
pub const BF_OFFSET: u64 = 0x800;
/// `MLX5_SEND_WQE_BB`.
pub const SEND_WQE_BB: u64 = 64;
/// Doorbell record slots (mlx5dv.h / libmlx5's mlx5.h).
pub const RCV_DBR: u64 = 0;
pub const SND_DBR: u64 = 4;
pub const CQ_SET_CI: u64 = 0;
pub const CQ_ARM_DB: u64 = 4;
/// Offset of the CQ doorbell in a UAR page (`MLX5_CQ_DOORBELL`).
pub const UAR_CQ_DOORBELL: u64 = 0x20;

/// `MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_*`: what a GET_CONTEXT response's `comp_mask` reports.
pub mod ucontext_resp_mask {
    pub const CORE_CLOCK_OFFSET: u32 = 1 << 0;
    pub const MKEY_UPDATE_TAG: u32 = 1 << 5;
}

/// `offsetof(struct mlx5_init_seg, internal_timer_h)`: the device's free-running timer, a
/// big-endian high word then low word, in the init segment the core clock page maps.
pub const INTERNAL_TIMER_OFFSET: u64 = 0x1000;

/// `MLX5_IB_CLOCK_INFO_V1`: the clock info page's version, its mmap index.
pub const CLOCK_INFO_V1: u64 = 1;

/// mmap commands (`enum mlx5_ib_mmap_cmd`, main.c `get_command`).
pub mod mmap_cmd {
    pub const REGULAR_PAGE: u64 = 0;
    pub const GET_CONTIGUOUS_PAGES: u64 = 1;
    pub const WC_PAGE: u64 = 2;
    pub const NC_PAGE: u64 = 3;
    pub const CORE_CLOCK: u64 = 5;
    pub const ALLOC_WC: u64 = 6;
    pub const CLOCK_INFO: u64 = 7;
    /// `MLX5_IB_MMAP_OFFSET_START`: the first command of the dynamic mmap entries.
    pub const OFFSET_START: u64 = 9;
}

macro_rules! abi_struct {
    ($(#[$m:meta])* $name:ident, $size:expr, { $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
        pub struct $name { $($(#[$fm])* pub $field: $ty),* }
        const _: () = assert!(core::mem::size_of::<$name>() == $size);
    };
}

abi_struct!(
    /// `struct ib_uverbs_cmd_hdr`.
    CmdHdr, 8, { command: u32, in_words: u16, out_words: u16 });
abi_struct!(
    /// `struct ib_uverbs_ex_cmd_hdr`.
    ExCmdHdr, 16, { response: u64, provider_in_words: u16, provider_out_words: u16, cmd_hdr_reserved: u32 });
abi_struct!(
    /// The requests whose only core field is the response pointer (GET_CONTEXT, QUERY_DEVICE,
    /// ALLOC_PD, CREATE_COMP_CHANNEL).
    ResponseOnly, 8, { response: u64 });
abi_struct!(
    /// `struct ib_uverbs_get_context_resp`.
    GetContextResp, 8, { async_fd: u32, num_comp_vectors: u32 });
abi_struct!(
/// `struct ib_uverbs_query_device_resp`.
QueryDeviceResp, 176, {
    fw_ver: u64, node_guid: u64, sys_image_guid: u64, max_mr_size: u64, page_size_cap: u64,
    vendor_id: u32, vendor_part_id: u32, hw_ver: u32, max_qp: u32, max_qp_wr: u32,
    device_cap_flags: u32, max_sge: u32, max_sge_rd: u32, max_cq: u32, max_cqe: u32,
    max_mr: u32, max_pd: u32, max_qp_rd_atom: u32, max_ee_rd_atom: u32, max_res_rd_atom: u32,
    max_qp_init_rd_atom: u32, max_ee_init_rd_atom: u32, atomic_cap: u32, max_ee: u32,
    max_rdd: u32, max_mw: u32, max_raw_ipv6_qp: u32, max_raw_ethy_qp: u32, max_mcast_grp: u32,
    max_mcast_qp_attach: u32, max_total_mcast_qp_attach: u32, max_ah: u32, max_fmr: u32,
    max_map_per_fmr: u32, max_srq: u32, max_srq_wr: u32, max_srq_sge: u32, max_pkeys: u16,
    local_ca_ack_delay: u8, phys_port_cnt: u8, reserved: [u8; 4],
});
abi_struct!(
    /// `struct ib_uverbs_query_port`.
    QueryPort, 16, { response: u64, port_num: u8, reserved: [u8; 7] });
abi_struct!(
/// `struct ib_uverbs_query_port_resp`.
QueryPortResp, 40, {
    port_cap_flags: u32, max_msg_sz: u32, bad_pkey_cntr: u32, qkey_viol_cntr: u32,
    gid_tbl_len: u32, pkey_tbl_len: u16, lid: u16, sm_lid: u16, state: u8, max_mtu: u8,
    active_mtu: u8, lmc: u8, max_vl_num: u8, sm_sl: u8, subnet_timeout: u8,
    init_type_reply: u8, active_width: u8, active_speed: u8, phys_state: u8, link_layer: u8,
    flags: u8, reserved: u8,
});
abi_struct!(
/// `struct ib_uverbs_ah_attr` (with its `ib_uverbs_global_route`).
AhAttr, 32, {
    dgid: [u8; 16], flow_label: u32, sgid_index: u8, hop_limit: u8, traffic_class: u8,
    grh_reserved: u8, dlid: u16, sl: u8, src_path_bits: u8, static_rate: u8, is_global: u8,
    port_num: u8, reserved: u8,
});
abi_struct!(
    /// `struct ib_uverbs_create_ah`.
    CreateAh, 56, { response: u64, user_handle: u64, pd_handle: u32, reserved: u32, attr: AhAttr });
abi_struct!(
    /// `struct ib_uverbs_dealloc_pd`, `ib_uverbs_dereg_mr`, `ib_uverbs_destroy_ah`: one handle.
    HandleOnly, 4, { handle: u32 });
abi_struct!(
    /// `struct ib_uverbs_reg_mr`.
    RegMr, 40, { response: u64, start: u64, length: u64, hca_va: u64, pd_handle: u32, access_flags: u32 });
abi_struct!(
    /// `struct ib_uverbs_reg_mr_resp`.
    RegMrResp, 12, { mr_handle: u32, lkey: u32, rkey: u32 });
abi_struct!(
    /// `struct ib_uverbs_create_cq`.
    CreateCq, 32, { response: u64, user_handle: u64, cqe: u32, comp_vector: u32, comp_channel: i32, reserved: u32 });
abi_struct!(
    /// `struct ib_uverbs_create_cq_resp`.
    CreateCqResp, 8, { cq_handle: u32, cqe: u32 });
abi_struct!(
    /// `struct ib_uverbs_resize_cq`.
    ResizeCq, 16, { response: u64, cq_handle: u32, cqe: u32 });
abi_struct!(
    /// `struct ib_uverbs_destroy_cq` / `ib_uverbs_destroy_qp`.
    DestroyObj, 16, { response: u64, handle: u32, reserved: u32 });
abi_struct!(
    /// `struct ib_uverbs_destroy_cq_resp`.
    DestroyCqResp, 8, { comp_events_reported: u32, async_events_reported: u32 });
abi_struct!(
/// `struct ib_uverbs_create_qp`.
CreateQp, 56, {
    response: u64, user_handle: u64, pd_handle: u32, send_cq_handle: u32,
    recv_cq_handle: u32, srq_handle: u32, max_send_wr: u32, max_recv_wr: u32,
    max_send_sge: u32, max_recv_sge: u32, max_inline_data: u32, sq_sig_all: u8,
    qp_type: u8, is_srq: u8, reserved: u8,
});
abi_struct!(
/// `struct ib_uverbs_create_qp_resp`.
CreateQpResp, 32, {
    qp_handle: u32, qpn: u32, max_send_wr: u32, max_recv_wr: u32, max_send_sge: u32,
    max_recv_sge: u32, max_inline_data: u32, reserved: u32,
});
abi_struct!(
/// `struct ib_uverbs_qp_dest`.
QpDest, 32, {
    dgid: [u8; 16], flow_label: u32, dlid: u16, reserved: u16, sgid_index: u8, hop_limit: u8,
    traffic_class: u8, sl: u8, src_path_bits: u8, static_rate: u8, is_global: u8, port_num: u8,
});
abi_struct!(
/// `struct ib_uverbs_modify_qp`.
ModifyQp, 112, {
    dest: QpDest, alt_dest: QpDest, qp_handle: u32, attr_mask: u32, qkey: u32, rq_psn: u32,
    sq_psn: u32, dest_qp_num: u32, qp_access_flags: u32, pkey_index: u16, alt_pkey_index: u16,
    qp_state: u8, cur_qp_state: u8, path_mtu: u8, path_mig_state: u8, en_sqd_async_notify: u8,
    max_rd_atomic: u8, max_dest_rd_atomic: u8, min_rnr_timer: u8, port_num: u8, timeout: u8,
    retry_cnt: u8, rnr_retry: u8, alt_port_num: u8, alt_timeout: u8, reserved: [u8; 2],
});
abi_struct!(
    /// `struct ib_uverbs_query_qp`.
    QueryQp, 16, { response: u64, qp_handle: u32, attr_mask: u32 });
abi_struct!(
/// `struct ib_uverbs_query_qp_resp`.
QueryQpResp, 128, {
    dest: QpDest, alt_dest: QpDest, max_send_wr: u32, max_recv_wr: u32, max_send_sge: u32,
    max_recv_sge: u32, max_inline_data: u32, qkey: u32, rq_psn: u32, sq_psn: u32,
    dest_qp_num: u32, qp_access_flags: u32, pkey_index: u16, alt_pkey_index: u16,
    qp_state: u8, cur_qp_state: u8, path_mtu: u8, path_mig_state: u8, sq_draining: u8,
    max_rd_atomic: u8, max_dest_rd_atomic: u8, min_rnr_timer: u8, port_num: u8, timeout: u8,
    retry_cnt: u8, rnr_retry: u8, alt_port_num: u8, alt_timeout: u8, sq_sig_all: u8,
    reserved: [u8; 5],
});
abi_struct!(
/// `struct mlx5_ib_alloc_ucontext_req_v2`.
AllocUcontextReq, 32, {
    total_num_bfregs: u32, num_low_latency_bfregs: u32, flags: u32, comp_mask: u32,
    max_cqe_version: u8, reserved0: u8, reserved1: u16, reserved2: u32, lib_caps: u64,
});
abi_struct!(
/// `struct mlx5_ib_alloc_ucontext_resp`.
AllocUcontextResp, 72, {
    qp_tab_size: u32, bf_reg_size: u32, tot_bfregs: u32, cache_line_size: u32,
    max_sq_desc_sz: u16, max_rq_desc_sz: u16, max_send_wqebb: u32, max_recv_wr: u32,
    max_srq_recv_wr: u32, num_ports: u16, flow_action_flags: u16, comp_mask: u32,
    response_length: u32, cqe_version: u8, cmds_supp_uhw: u8, eth_min_inline: u8,
    clock_info_versions: u8, hca_core_clock_offset: u64, log_uar_size: u32,
    num_uars_per_page: u32, num_dyn_bfregs: u32, dump_fill_mkey: u32,
});
abi_struct!(
/// `struct mlx5_ib_create_cq`.
Mlx5CreateCq, 32, {
    buf_addr: u64, db_addr: u64, cqe_size: u32, cqe_comp_en: u8, cqe_comp_res_format: u8,
    flags: u16, uar_page_index: u16, reserved0: u16, reserved1: u32,
});
abi_struct!(
    /// `struct mlx5_ib_resize_cq`.
    Mlx5ResizeCq, 16, { buf_addr: u64, cqe_size: u16, reserved0: u16, reserved1: u32 });
abi_struct!(
/// `struct mlx5_ib_create_qp`.
Mlx5CreateQp, 56, {
    buf_addr: u64, db_addr: u64, sq_wqe_count: u32, rq_wqe_count: u32, rq_wqe_shift: u32,
    flags: u32, uidx: u32, bfreg_index: u32, sq_buf_addr: u64, ece_options: u32,
    dci_streams: u16, reserved: u16,
});
abi_struct!(
/// `struct mlx5_ib_create_qp_resp`.
Mlx5CreateQpResp, 40, {
    bfreg_index: u32, ece_options: u32, comp_mask: u32, tirn: u32, tisn: u32, rqn: u32,
    sqn: u32, reserved1: u32, tir_icm_addr: u64,
});
abi_struct!(
    /// `struct ib_uverbs_create_srq`.
    CreateSrq, 32, { response: u64, user_handle: u64, pd_handle: u32, max_wr: u32, max_sge: u32, srq_limit: u32 });
abi_struct!(
    /// `struct ib_uverbs_create_srq_resp`.
    CreateSrqResp, 16, { srq_handle: u32, max_wr: u32, max_sge: u32, srqn: u32 });
abi_struct!(
    /// `struct ib_uverbs_modify_srq`.
    ModifySrq, 16, { srq_handle: u32, attr_mask: u32, max_wr: u32, srq_limit: u32 });
abi_struct!(
    /// `struct ib_uverbs_query_srq_resp`.
    QuerySrqResp, 16, { max_wr: u32, max_sge: u32, srq_limit: u32, reserved: u32 });
abi_struct!(
    /// `struct mlx5_ib_create_srq`.
    Mlx5CreateSrq, 32, { buf_addr: u64, db_addr: u64, flags: u32, reserved0: u32, uidx: u32, reserved1: u32 });
abi_struct!(
    /// `struct mlx5_ib_create_srq_resp`.
    Mlx5CreateSrqResp, 8, { srqn: u32, reserved: u32 });
abi_struct!(
    /// `struct ib_uverbs_ioctl_hdr`.
    IoctlHdr, 24, { length: u16, object_id: u16, method_id: u16, num_attrs: u16, reserved1: u64, driver_id: u32, reserved2: u32 });
abi_struct!(
    /// `struct ib_uverbs_attr`.
    IoctlAttr, 16, { attr_id: u16, len: u16, flags: u16, attr_data: u16, data: u64 });
abi_struct!(
    /// `struct ib_uverbs_gid_entry`.
    GidEntry, 32, { gid: [u8; 16], gid_index: u32, port_num: u32, gid_type: u32, netdev_ifindex: u32 });
abi_struct!(
    /// `struct ib_uverbs_async_event_desc`.
    AsyncEventDesc, 16, { element: u64, event_type: u32, reserved: u32 });

/// Offsets in `struct ib_uverbs_create_cq`/`mlx5_ib_create_cq` the kernel checks lengths against.
pub const MLX5_CREATE_CQ_FLAGS_OFFSET: usize = 22;
/// `offsetof(struct mlx5_ib_create_qp, reserved)`: driver bytes from here on must be zero.
pub const MLX5_CREATE_QP_RESERVED_OFFSET: usize = 54;
/// `offsetof(struct mlx5_ib_create_qp, ece_options)`: shorter driver data is "too small".
pub const MLX5_CREATE_QP_ECE_OFFSET: usize = 48;
/// `offsetof(struct mlx5_ib_alloc_ucontext_req_v2, max_cqe_version)`.
pub const MLX5_UCONTEXT_REQ_V2_MIN: usize = 16;
/// `sizeof(struct mlx5_ib_alloc_ucontext_req)` (v0).
pub const MLX5_UCONTEXT_REQ_V0: usize = 8;

/// `MLX5_IB_CREATE_CQ_FLAGS_*`.
pub const CQ_FLAG_CQE_128B_PAD: u16 = 1 << 0;
pub const CQ_FLAG_UAR_PAGE_INDEX: u16 = 1 << 1;
pub const CQ_FLAG_REAL_TIME_TS: u16 = 1 << 2;
/// `MLX5_LIB_CAP_DYN_UAR`.
pub const LIB_CAP_DYN_UAR: u64 = 1 << 1;
/// `MLX5_IB_ALLOC_UCTX_DEVX`.
pub const ALLOC_UCTX_DEVX: u32 = 1;
/// `MLX5_QP_FLAG_*` the model accepts (`process_vendor_flags`).
pub const QP_FLAG_SIGNATURE: u32 = 1 << 0;
pub const QP_FLAG_SCATTER_CQE: u32 = 1 << 1;
pub const QP_FLAG_BFREG_INDEX: u32 = 1 << 3;
pub const QP_FLAG_ALLOW_SCATTER_CQE: u32 = 1 << 8;
pub const QP_FLAG_UAR_PAGE_INDEX: u32 = 1 << 10;
/// `MLX5_IB_INVALID_BFREG`.
pub const INVALID_BFREG: u32 = 1 << 31;
/// `enum ib_srq_attr_mask`: `IB_SRQ_MAX_WR`, `IB_SRQ_LIMIT`.
pub const SRQ_ATTR_MAX_WR: u32 = 1 << 0;
pub const SRQ_ATTR_LIMIT: u32 = 1 << 1;
/// `enum ib_srq_type` (and `ib_uverbs_srq_type`).
pub mod srqt {
    pub const BASIC: u32 = 0;
    pub const XRC: u32 = 1;
    pub const TM: u32 = 2;
}
/// `MLX5_IB_DEFAULT_UIDX`.
pub const DEFAULT_UIDX: u32 = 0xffffff;
