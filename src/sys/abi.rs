//! Vendor-neutral uverbs ABI structs (`include/uapi/rdma/ib_user_verbs.h`,
//! `ib_user_ioctl_verbs.h`), with sizes and offsets asserted against the kernel's. Fields keep
//! the kernel's names and meanings; see those headers.
#![allow(missing_docs)]

use super::assert_layout;
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
    pub const ALLOC_MW: u32 = 14;
    pub const CREATE_COMP_CHANNEL: u32 = 17;
    pub const RESIZE_CQ: u32 = 19;
    pub const REQ_NOTIFY_CQ: u32 = 23;
    pub const QUERY_QP: u32 = 25;
    pub const MODIFY_QP: u32 = 26;
    pub const POST_SEND: u32 = 28;
    pub const ATTACH_MCAST: u32 = 30;
    pub const DETACH_MCAST: u32 = 31;
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

/// `IB_USER_VERBS_CMD_FLAG_EXTENDED`: the command number of an extended `write()` command
/// (`ib_uverbs_cmd_hdr` then `ib_uverbs_ex_cmd_hdr`, sizes in 8-byte words).
pub const CMD_FLAG_EXTENDED: u32 = 0x8000_0000;

/// Extended command numbers (`IB_USER_VERBS_EX_CMD_*`).
pub mod ex_cmd {
    pub const QUERY_DEVICE: u32 = 1;
}

/// `struct ib_uverbs_ex_cmd_hdr`: follows `ib_uverbs_cmd_hdr` in an extended command.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ExCmdHdr {
    pub response: u64,
    pub provider_in_words: u16,
    pub provider_out_words: u16,
    pub cmd_hdr_reserved: u32,
}
assert_layout!(ExCmdHdr, size 16, response @ 0, provider_in_words @ 8, provider_out_words @ 10,
    cmd_hdr_reserved @ 12);

/// `struct ib_uverbs_ex_query_device`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ExQueryDevice {
    pub comp_mask: u32,
    pub reserved: u32,
}
assert_layout!(ExQueryDevice, size 8, comp_mask @ 0, reserved @ 4);

/// The first 232 bytes of `struct ib_uverbs_ex_query_device_resp` (304 bytes in Linux 6.1),
/// up to `device_cap_flags_ex`: the kernel writes as much of its response as asked for, and
/// `response_length` says how much that was.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ExQueryDeviceResp {
    pub base: QueryDeviceResp,
    pub comp_mask: u32,
    pub response_length: u32,
    /// `struct ib_uverbs_odp_caps`: general_caps, then the RC, UC and UD caps and a reserved word.
    pub odp_general_caps: u64,
    pub odp_per_transport_caps: [u32; 4],
    pub timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
}
assert_layout!(ExQueryDeviceResp, size 232, comp_mask @ 176, response_length @ 180,
    odp_general_caps @ 184, timestamp_mask @ 208, hca_core_clock @ 216, device_cap_flags_ex @ 224);

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

/// `struct ib_uverbs_alloc_mw`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct AllocMw {
    pub response: u64,
    pub pd_handle: u32,
    pub mw_type: u8,
    pub reserved: [u8; 3],
}
assert_layout!(AllocMw, size 16, pd_handle @ 8, mw_type @ 12);

/// `struct ib_uverbs_alloc_mw_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct AllocMwResp {
    pub mw_handle: u32,
    pub rkey: u32,
}
assert_layout!(AllocMwResp, size 8);

/// `struct ib_uverbs_attach_mcast` (DETACH_MCAST takes the same): no response.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct AttachMcast {
    pub gid: [u8; 16],
    pub qp_handle: u32,
    pub mlid: u16,
    pub reserved: u16,
}
assert_layout!(AttachMcast, size 24, qp_handle @ 16, mlid @ 20);

/// `struct ib_uverbs_qp_cap` (ioctl `QP_CREATE` capabilities in and out).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}
assert_layout!(QpCap, size 20, max_inline_data @ 16);

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

/// `struct ib_uverbs_post_send` with no work requests: the send doorbell (`cmd::SendDoorbell`).
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

/// `IB_EVENT_CQ_ERR`, the `event_type` of a CQ overrun.
pub const ASYNC_EVENT_CQ_ERR: u32 = 0;

/// The framed commands' core requests, each with its C struct and whether it begins with
/// the `response` pointer (checked against the installed header by
/// `sys::cmd::tests::every_request_frames_as_built`); `plain`: its only user address, if
/// any, is that pointer.
macro_rules! requests {
    ($($t:ident = $c:literal, $response:ident, $plain:ident;)*) => {
        $(
            // SAFETY: `RESPONSE` is true exactly for the layouts whose first field is
            // `response` (asserted at offset 0 below, and against the kernel's header by
            // the framing test).
            unsafe impl super::cmd::Request for $t {
                const RESPONSE: bool = requests!(@bool $response);
            }
            requests!(@response $response $t);
            requests!(@plain $plain $t);
        )*
        /// Each request type with its C struct name, for the framing test.
        #[cfg(test)]
        pub(crate) fn each_request(check: &mut impl super::cmd::tests::RequestCheck) {
            $(check.check::<$t>($c);)*
        }
    };
    (@bool response) => { true };
    (@bool none) => { false };
    (@response response $t:ident) => {
        const _: () = assert!(::core::mem::offset_of!($t, response) == 0);
    };
    (@response none $t:ident) => {};
    // SAFETY: each of these holds handles, sizes, flags and attributes; its only user
    // address, if any, is the `response` field `execute` fills in.
    (@plain plain $t:ident) => { unsafe impl super::cmd::PlainRequest for $t {} };
    (@plain user_addresses $t:ident) => {};
}
requests! {
    QueryDevice = "ib_uverbs_query_device", response, plain;
    AllocPd = "ib_uverbs_alloc_pd", response, plain;
    RegMr = "ib_uverbs_reg_mr", response, user_addresses;
    AllocMw = "ib_uverbs_alloc_mw", response, plain;
    AttachMcast = "ib_uverbs_attach_mcast", none, plain;
    ModifyQp = "ib_uverbs_modify_qp", none, plain;
    QueryQp = "ib_uverbs_query_qp", response, plain;
    CreateCompChannel = "ib_uverbs_create_comp_channel", response, plain;
    ReqNotifyCq = "ib_uverbs_req_notify_cq", none, plain;
    ResizeCq = "ib_uverbs_resize_cq", response, plain;
    CreateAh = "ib_uverbs_create_ah", response, plain;
    ModifySrq = "ib_uverbs_modify_srq", none, plain;
    QuerySrq = "ib_uverbs_query_srq", response, plain;
}

#[cfg(test)]
super::layout_check::kernel_layouts! {
    headers: ["rdma/ib_user_verbs.h", "rdma/ib_user_ioctl_verbs.h"],
    structs: {
        CmdHdr = "struct ib_uverbs_cmd_hdr" { command, in_words, out_words },
        QueryDevice = "struct ib_uverbs_query_device" { response },
        ExCmdHdr = "struct ib_uverbs_ex_cmd_hdr" {
            response, provider_in_words, provider_out_words, cmd_hdr_reserved,
        },
        ExQueryDevice = "struct ib_uverbs_ex_query_device" { comp_mask, reserved },
        ExQueryDeviceResp = "struct ib_uverbs_ex_query_device_resp" until "rss_caps" {
            base, comp_mask, response_length, odp_general_caps = "odp_caps.general_caps",
            odp_per_transport_caps = "odp_caps.per_transport_caps", timestamp_mask,
            hca_core_clock, device_cap_flags_ex,
        },
        QueryDeviceResp = "struct ib_uverbs_query_device_resp" {
            fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
            vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
            max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
            max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
            max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
            max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
            max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt, reserved,
        },
        QueryPortResp = "struct ib_uverbs_query_port_resp" {
            port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr, gid_tbl_len,
            pkey_tbl_len, lid, sm_lid, state, max_mtu, active_mtu, lmc, max_vl_num, sm_sl,
            subnet_timeout, init_type_reply, active_width, active_speed, phys_state,
            link_layer, flags, reserved,
        },
        QueryPortRespEx = "struct ib_uverbs_query_port_resp_ex" {
            legacy = "legacy_resp", port_cap_flags2, reserved,
        },
        GidEntry = "struct ib_uverbs_gid_entry" {
            gid, gid_index, port_num, gid_type, netdev_ifindex,
        },
        AllocPd = "struct ib_uverbs_alloc_pd" { response },
        AllocPdResp = "struct ib_uverbs_alloc_pd_resp" { pd_handle },
        RegMr = "struct ib_uverbs_reg_mr" {
            response, start, length, hca_va, pd_handle, access_flags,
        },
        RegMrResp = "struct ib_uverbs_reg_mr_resp" { mr_handle, lkey, rkey },
        AllocMw = "struct ib_uverbs_alloc_mw" { response, pd_handle, mw_type, reserved },
        AllocMwResp = "struct ib_uverbs_alloc_mw_resp" { mw_handle, rkey },
        AttachMcast = "struct ib_uverbs_attach_mcast" { gid, qp_handle, mlid, reserved },
        QpCap = "struct ib_uverbs_qp_cap" {
            max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data,
        },
        QpDest = "struct ib_uverbs_qp_dest" {
            dgid, flow_label, dlid, reserved, sgid_index, hop_limit, traffic_class, sl,
            src_path_bits, static_rate, is_global, port_num,
        },
        ModifyQp = "struct ib_uverbs_modify_qp" {
            dest, alt_dest, qp_handle, attr_mask, qkey, rq_psn, sq_psn, dest_qp_num,
            qp_access_flags, pkey_index, alt_pkey_index, qp_state, cur_qp_state, path_mtu,
            path_mig_state, en_sqd_async_notify, max_rd_atomic, max_dest_rd_atomic,
            min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout,
            reserved,
        },
        QueryQp = "struct ib_uverbs_query_qp" { response, qp_handle, attr_mask },
        // C has the capabilities as five loose fields; `values` places each.
        QueryQpResp = "struct ib_uverbs_query_qp_resp" {
            dest, alt_dest, cap = "max_send_wr", qkey, rq_psn, sq_psn, dest_qp_num,
            qp_access_flags, pkey_index, alt_pkey_index, qp_state, cur_qp_state, path_mtu,
            path_mig_state, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
            port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, sq_sig_all,
            reserved,
        },
        PostSend = "struct ib_uverbs_post_send" {
            response, qp_handle, wr_count, sge_count, wqe_size,
        },
        DestroyCqResp = "struct ib_uverbs_destroy_cq_resp" {
            comp_events_reported, async_events_reported,
        },
        DestroyQpResp = "struct ib_uverbs_destroy_qp_resp" { events_reported },
        CreateCompChannel = "struct ib_uverbs_create_comp_channel" { response },
        CreateCompChannelResp = "struct ib_uverbs_create_comp_channel_resp" { fd },
        ReqNotifyCq = "struct ib_uverbs_req_notify_cq" { cq_handle, solicited_only },
        ResizeCq = "struct ib_uverbs_resize_cq" { response, cq_handle, cqe },
        ResizeCqResp = "struct ib_uverbs_resize_cq_resp" { cqe, reserved },
        // C nests the first six fields in `struct ib_uverbs_global_route grh`.
        AhAttrAbi = "struct ib_uverbs_ah_attr" {
            dgid = "grh.dgid", flow_label = "grh.flow_label", sgid_index = "grh.sgid_index",
            hop_limit = "grh.hop_limit", traffic_class = "grh.traffic_class",
            grh_reserved = "grh.reserved", dlid, sl, src_path_bits, static_rate, is_global,
            port_num, reserved,
        },
        CreateAh = "struct ib_uverbs_create_ah" {
            response, user_handle, pd_handle, reserved, attr,
        },
        CreateAhResp = "struct ib_uverbs_create_ah_resp" { ah_handle },
        ModifySrq = "struct ib_uverbs_modify_srq" { srq_handle, attr_mask, max_wr, srq_limit },
        QuerySrq = "struct ib_uverbs_query_srq" { response, srq_handle, reserved },
        QuerySrqResp = "struct ib_uverbs_query_srq_resp" { max_wr, max_sge, srq_limit, reserved },
        DestroySrqResp = "struct ib_uverbs_destroy_srq_resp" { events_reported },
        CompEventDesc = "struct ib_uverbs_comp_event_desc" { cq_handle },
        AsyncEventDesc = "struct ib_uverbs_async_event_desc" { element, event_type, reserved },
    },
    values: {
        CMD_FLAG_EXTENDED => "IB_USER_VERBS_CMD_FLAG_EXTENDED",
        ex_cmd::QUERY_DEVICE => "IB_USER_VERBS_EX_CMD_QUERY_DEVICE",
        offset_of!(QueryQpResp, cap) + offset_of!(QpCap, max_send_wr)
            => "offsetof(struct ib_uverbs_query_qp_resp, max_send_wr)",
        offset_of!(QueryQpResp, cap) + offset_of!(QpCap, max_recv_wr)
            => "offsetof(struct ib_uverbs_query_qp_resp, max_recv_wr)",
        offset_of!(QueryQpResp, cap) + offset_of!(QpCap, max_send_sge)
            => "offsetof(struct ib_uverbs_query_qp_resp, max_send_sge)",
        offset_of!(QueryQpResp, cap) + offset_of!(QpCap, max_recv_sge)
            => "offsetof(struct ib_uverbs_query_qp_resp, max_recv_sge)",
        offset_of!(QueryQpResp, cap) + offset_of!(QpCap, max_inline_data)
            => "offsetof(struct ib_uverbs_query_qp_resp, max_inline_data)",
        SEND_WR_SIZE => "sizeof(struct ib_uverbs_send_wr)",
    },
}
