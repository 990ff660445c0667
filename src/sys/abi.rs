//! Vendor-neutral uverbs ABI structs (`include/uapi/rdma/ib_user_verbs.h`,
//! `ib_user_ioctl_verbs.h`), with sizes and offsets asserted against the kernel's. Fields keep
//! the kernel's names and meanings; see those headers.
#![allow(missing_docs)]

use super::assert_layout;
use crate::attr::QpCap;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Global uverbs ABI version this crate speaks (`/sys/class/infiniband_verbs/abi_version`).
pub const UVERBS_ABI_VERSION: u32 = 6;

/// `write()` command numbers (`enum ib_uverbs_write_cmds`).
/// Only commands with no ioctl method are sent this way.
pub mod cmd {
    pub const QUERY_DEVICE: u32 = 1;
    pub const ALLOC_PD: u32 = 3;
    pub const CREATE_AH: u32 = 5;
    pub const REG_MR: u32 = 9;
    pub const CREATE_COMP_CHANNEL: u32 = 17;
    pub const RESIZE_CQ: u32 = 19;
    pub const REQ_NOTIFY_CQ: u32 = 23;
    pub const QUERY_QP: u32 = 25;
    pub const MODIFY_QP: u32 = 26;
    pub const POST_SEND: u32 = 28;
    pub const MODIFY_SRQ: u32 = 33;
    pub const QUERY_SRQ: u32 = 34;
}

/// `struct ib_uverbs_cmd_hdr`: the head of every non-extended `write()` command.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CmdHdr {
    pub command: u32,
    /// Whole command length in 32-bit words, header included.
    pub in_words: u16,
    /// Response length (core + driver) in 32-bit words.
    pub out_words: u16,
}
assert_layout!(CmdHdr, size 8, command @ 0, in_words @ 4, out_words @ 6);

/// `struct ib_uverbs_query_device`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct QueryDevice {
    pub response: u64,
}

/// `struct ib_uverbs_query_device_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct QueryDeviceResp {
    pub fw_ver: u64,
    /// Big-endian.
    pub node_guid: u64,
    /// Big-endian.
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub device_cap_flags: u32,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_ee_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_ee_init_rd_atom: u32,
    pub atomic_cap: u32,
    pub max_ee: u32,
    pub max_rdd: u32,
    pub max_mw: u32,
    pub max_raw_ipv6_qp: u32,
    pub max_raw_ethy_qp: u32,
    pub max_mcast_grp: u32,
    pub max_mcast_qp_attach: u32,
    pub max_total_mcast_qp_attach: u32,
    pub max_ah: u32,
    pub max_fmr: u32,
    pub max_map_per_fmr: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
    pub reserved: [u8; 4],
}
assert_layout!(QueryDeviceResp, size 176, vendor_id @ 40, max_cqe @ 76, max_srq_sge @ 164,
    max_pkeys @ 168, phys_port_cnt @ 171);

/// `struct ib_uverbs_query_port_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct QueryPortResp {
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub gid_tbl_len: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub state: u8,
    pub max_mtu: u8,
    pub active_mtu: u8,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub reserved: u8,
}
assert_layout!(QueryPortResp, size 40, gid_tbl_len @ 16, state @ 26, link_layer @ 37);

/// `struct ib_uverbs_query_port_resp_ex` (ioctl `QUERY_PORT`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct QueryPortRespEx {
    pub legacy: QueryPortResp,
    pub port_cap_flags2: u16,
    pub reserved: [u8; 6],
}
assert_layout!(QueryPortRespEx, size 48, port_cap_flags2 @ 40);

/// `struct ib_uverbs_gid_entry` (ioctl `QUERY_GID_TABLE`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct GidEntry {
    pub gid: [u8; 16],
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub netdev_ifindex: u32,
}
assert_layout!(GidEntry, size 32, gid_index @ 16, port_num @ 20, gid_type @ 24,
    netdev_ifindex @ 28);

/// `struct ib_uverbs_alloc_pd`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct AllocPd {
    pub response: u64,
}

/// `struct ib_uverbs_alloc_pd_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct AllocPdResp {
    pub pd_handle: u32,
}
assert_layout!(AllocPdResp, size 4);

/// `struct ib_uverbs_reg_mr`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct RegMr {
    pub response: u64,
    pub start: u64,
    pub length: u64,
    pub hca_va: u64,
    pub pd_handle: u32,
    pub access_flags: u32,
}
assert_layout!(RegMr, size 40, pd_handle @ 32, access_flags @ 36);

/// `struct ib_uverbs_reg_mr_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct RegMrResp {
    pub mr_handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}
assert_layout!(RegMrResp, size 12);

/// `struct ib_uverbs_qp_dest`: the address vector inside modify/query QP.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct QpDest {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub dlid: u16,
    pub reserved: u16,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}
assert_layout!(QpDest, size 32, flow_label @ 16, sgid_index @ 24, is_global @ 30, port_num @ 31);

/// `struct ib_uverbs_modify_qp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ModifyQp {
    pub dest: QpDest,
    pub alt_dest: QpDest,
    pub qp_handle: u32,
    pub attr_mask: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub qp_state: u8,
    pub cur_qp_state: u8,
    pub path_mtu: u8,
    pub path_mig_state: u8,
    pub en_sqd_async_notify: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub reserved: [u8; 2],
}
assert_layout!(ModifyQp, size 112, qp_handle @ 64, attr_mask @ 68, qp_access_flags @ 88,
    pkey_index @ 92, qp_state @ 96, port_num @ 104, alt_timeout @ 109);

/// `struct ib_uverbs_query_qp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct QueryQp {
    pub response: u64,
    pub qp_handle: u32,
    pub attr_mask: u32,
}
assert_layout!(QueryQp, size 16);

/// `struct ib_uverbs_query_qp_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct QueryQpResp {
    pub dest: QpDest,
    pub alt_dest: QpDest,
    pub cap: QpCap,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub qp_state: u8,
    pub cur_qp_state: u8,
    pub path_mtu: u8,
    pub path_mig_state: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub sq_sig_all: u8,
    pub reserved: [u8; 5],
}
assert_layout!(QueryQpResp, size 128, cap @ 64, qkey @ 84, pkey_index @ 104, qp_state @ 108,
    sq_sig_all @ 122);

/// `struct ib_uverbs_post_send` with no work requests: rxe's doorbell.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct PostSend {
    pub response: u64,
    pub qp_handle: u32,
    pub wr_count: u32,
    pub sge_count: u32,
    pub wqe_size: u32,
}
assert_layout!(PostSend, size 24, qp_handle @ 8, wqe_size @ 20);

/// Size of `struct ib_uverbs_send_wr`, the least `wqe_size` the kernel accepts.
pub const SEND_WR_SIZE: u32 = 56;

/// `struct ib_uverbs_destroy_cq_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct DestroyCqResp {
    pub comp_events_reported: u32,
    pub async_events_reported: u32,
}
assert_layout!(DestroyCqResp, size 8);

/// `struct ib_uverbs_destroy_qp_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct DestroyQpResp {
    pub events_reported: u32,
}
assert_layout!(DestroyQpResp, size 4);

/// `struct ib_uverbs_create_comp_channel`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateCompChannel {
    pub response: u64,
}

/// `struct ib_uverbs_create_comp_channel_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateCompChannelResp {
    pub fd: u32,
}
assert_layout!(CreateCompChannelResp, size 4);

/// `struct ib_uverbs_req_notify_cq`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ReqNotifyCq {
    pub cq_handle: u32,
    pub solicited_only: u32,
}
assert_layout!(ReqNotifyCq, size 8);

/// `struct ib_uverbs_resize_cq`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ResizeCq {
    pub response: u64,
    pub cq_handle: u32,
    pub cqe: u32,
}
assert_layout!(ResizeCq, size 16, cq_handle @ 8);

/// `struct ib_uverbs_resize_cq_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ResizeCqResp {
    pub cqe: u32,
    pub reserved: u32,
}
assert_layout!(ResizeCqResp, size 8);

/// `struct ib_uverbs_ah_attr`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct AhAttrAbi {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub grh_reserved: u8,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
    pub reserved: u8,
}
assert_layout!(AhAttrAbi, size 32, sgid_index @ 20, dlid @ 24, is_global @ 29, port_num @ 30);

/// `struct ib_uverbs_create_ah`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateAh {
    pub response: u64,
    pub user_handle: u64,
    pub pd_handle: u32,
    pub reserved: u32,
    pub attr: AhAttrAbi,
}
assert_layout!(CreateAh, size 56, pd_handle @ 16, attr @ 24);

/// `struct ib_uverbs_create_ah_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateAhResp {
    pub ah_handle: u32,
}
assert_layout!(CreateAhResp, size 4);

/// `struct ib_uverbs_modify_srq`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ModifySrq {
    pub srq_handle: u32,
    pub attr_mask: u32,
    pub max_wr: u32,
    pub srq_limit: u32,
}
assert_layout!(ModifySrq, size 16);

/// `struct ib_uverbs_query_srq`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct QuerySrq {
    pub response: u64,
    pub srq_handle: u32,
    pub reserved: u32,
}
assert_layout!(QuerySrq, size 16);

/// `struct ib_uverbs_query_srq_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct QuerySrqResp {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
    pub reserved: u32,
}
assert_layout!(QuerySrqResp, size 16);

/// `struct ib_uverbs_destroy_srq_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct DestroySrqResp {
    pub events_reported: u32,
}
assert_layout!(DestroySrqResp, size 4);

/// `struct ib_uverbs_comp_event_desc`: what a completion channel's fd yields.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CompEventDesc {
    pub cq_handle: u64,
}
assert_layout!(CompEventDesc, size 8);

/// `struct ib_uverbs_async_event_desc`: what the async event fd yields.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct AsyncEventDesc {
    pub element: u64,
    pub event_type: u32,
    pub reserved: u32,
}
assert_layout!(AsyncEventDesc, size 16, event_type @ 8);
