//! The kernel's RDMA connection manager ABI (`include/uapi/rdma/rdma_user_cm.h`, ABI version
//! 4) on `/dev/infiniband/rdma_cm`: the command structs, with sizes and offsets asserted, and
//! the one `write()` framing they share. Fields keep the kernel's names and meanings.
#![allow(missing_docs)]

use super::abi::AhAttrAbi;
use super::assert_layout;
use crate::error::{Error, Result, Verb};
use std::os::fd::BorrowedFd;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `RDMA_USER_CM_ABI_VERSION`; the kernel also answers version 3 programs the same way.
pub const ABI_VERSIONS: [u32; 2] = [3, 4];
/// `RDMA_MAX_PRIVATE_DATA`: the ABI's private data area.
pub const MAX_PRIVATE_DATA: usize = 256;
/// `struct __kernel_sockaddr_storage`'s size.
pub const SOCKADDR_STORAGE: usize = 128;

/// `RDMA_PS_TCP`: reliable connected ids.
pub const PS_TCP: u16 = 0x0106;
/// `RDMA_USER_CM_QUERY_ADDR`.
pub const QUERY_ADDR: u32 = 0;
/// `RDMA_USER_CM_QUERY_PATH`.
pub const QUERY_PATH: u32 = 1;
/// Paths a route holds at most (primary and alternate: `num_pri_alt_paths`).
pub const MAX_PATHS: usize = 2;

/// `IB_PATH_*` (`rdma/ib_user_sa.h`): what a path record is for.
pub mod path_flags {
    pub const GMP: u32 = 1;
    pub const PRIMARY: u32 = 1 << 1;
    pub const BIDIRECTIONAL: u32 = (1 << 3) | (1 << 5);
}

/// SET_OPTION levels and names (`RDMA_OPTION_*`).
pub mod option {
    /// `RDMA_OPTION_ID`: options of the id itself.
    pub const LEVEL_ID: u32 = 0;
    pub const ID_TOS: u32 = 0;
    pub const ID_REUSEADDR: u32 = 1;
    pub const ID_AFONLY: u32 = 2;
    pub const ID_ACK_TIMEOUT: u32 = 3;
    /// `RDMA_OPTION_IB`: options of the IB transport.
    pub const LEVEL_IB: u32 = 1;
    pub const IB_PATH: u32 = 1;
}

/// Command numbers (the anonymous `enum` of `RDMA_USER_CM_CMD_*`).
pub mod cmd {
    pub const CREATE_ID: u32 = 0;
    pub const DESTROY_ID: u32 = 1;
    pub const RESOLVE_ROUTE: u32 = 4;
    pub const CONNECT: u32 = 6;
    pub const LISTEN: u32 = 7;
    pub const ACCEPT: u32 = 8;
    pub const REJECT: u32 = 9;
    pub const DISCONNECT: u32 = 10;
    pub const INIT_QP_ATTR: u32 = 11;
    pub const GET_EVENT: u32 = 12;
    pub const SET_OPTION: u32 = 14;
    pub const NOTIFY: u32 = 15;
    pub const MIGRATE_ID: u32 = 18;
    pub const QUERY: u32 = 19;
    pub const BIND: u32 = 20;
    pub const RESOLVE_ADDR: u32 = 21;
}

/// `struct rdma_ucm_cmd_hdr`: unlike uverbs, `in` and `out` count bytes.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct UcmHdr {
    pub cmd: u32,
    /// Bytes of the command body after this header.
    pub in_: u16,
    /// Bytes of the response.
    pub out: u16,
}
assert_layout!(UcmHdr, size 8, cmd @ 0, in_ @ 4, out @ 6);

/// `struct rdma_ucm_create_id`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateId {
    pub uid: u64,
    pub response: u64,
    pub ps: u16,
    pub qp_type: u8,
    pub reserved: [u8; 5],
}
assert_layout!(CreateId, size 24, uid @ 0, response @ 8, ps @ 16, qp_type @ 18);

/// `struct rdma_ucm_create_id_resp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct CreateIdResp {
    pub id: u32,
}
assert_layout!(CreateIdResp, size 4, id @ 0);

/// `struct rdma_ucm_destroy_id`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct DestroyId {
    pub response: u64,
    pub id: u32,
    pub reserved: u32,
}
assert_layout!(DestroyId, size 16, response @ 0, id @ 8);

/// `struct rdma_ucm_destroy_id_resp` (also `rdma_ucm_migrate_resp`, the same layout).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct EventsReportedResp {
    pub events_reported: u32,
}
assert_layout!(EventsReportedResp, size 4, events_reported @ 0);

/// `struct rdma_ucm_bind`.
#[repr(C)]
#[derive(Debug, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct Bind {
    pub id: u32,
    pub addr_size: u16,
    pub reserved: u16,
    pub addr: [u8; SOCKADDR_STORAGE],
}
assert_layout!(Bind, size 136, id @ 0, addr_size @ 4, addr @ 8);

/// `struct rdma_ucm_resolve_addr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ResolveAddr {
    pub id: u32,
    pub timeout_ms: u32,
    pub src_size: u16,
    pub dst_size: u16,
    pub reserved: u32,
    pub src_addr: [u8; SOCKADDR_STORAGE],
    pub dst_addr: [u8; SOCKADDR_STORAGE],
}
assert_layout!(ResolveAddr, size 272, timeout_ms @ 4, src_size @ 8, dst_size @ 10, src_addr @ 16, dst_addr @ 144);

/// `struct rdma_ucm_resolve_route`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ResolveRoute {
    pub id: u32,
    pub timeout_ms: u32,
}
assert_layout!(ResolveRoute, size 8, id @ 0, timeout_ms @ 4);

/// `struct rdma_ucm_query`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct Query {
    pub response: u64,
    pub id: u32,
    pub option: u32,
}
assert_layout!(Query, size 16, response @ 0, id @ 8, option @ 12);

/// `struct rdma_ucm_query_addr_resp`.
#[repr(C)]
#[derive(Debug, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct QueryAddrResp {
    /// Big-endian.
    pub node_guid: u64,
    pub port_num: u8,
    pub reserved: u8,
    pub pkey: u16,
    pub src_size: u16,
    pub dst_size: u16,
    pub src_addr: [u8; SOCKADDR_STORAGE],
    pub dst_addr: [u8; SOCKADDR_STORAGE],
    pub ibdev_index: u32,
    pub reserved1: u32,
}
assert_layout!(QueryAddrResp, size 280, port_num @ 8, pkey @ 10, src_size @ 12, src_addr @ 16, dst_addr @ 144, ibdev_index @ 272);

/// `struct ib_path_rec_data` (`rdma/ib_user_sa.h`): a path record in the SA's wire format
/// (64 bytes, big-endian) and its `path_flags`.
#[repr(C)]
#[derive(Debug, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct PathRecData {
    pub flags: u32,
    pub reserved: u32,
    pub path_rec: [u8; 64],
}
assert_layout!(PathRecData, size 72, flags @ 0, path_rec @ 8);

/// `QUERY` with `RDMA_USER_CM_QUERY_PATH`: the same command as [`Query`], answered with
/// [`QueryPathResp`].
#[repr(transparent)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, Immutable)]
pub struct QueryPath(pub Query);

/// `struct rdma_ucm_query_path_resp` with room for [`MAX_PATHS`] paths (C's flexible
/// `path_data[]`).
#[repr(C)]
#[derive(Debug, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct QueryPathResp {
    pub num_paths: u32,
    pub reserved: u32,
    pub path_data: [PathRecData; MAX_PATHS],
}
assert_layout!(QueryPathResp, size 152, num_paths @ 0, path_data @ 8);

/// `struct rdma_ucm_conn_param`.
#[repr(C)]
#[derive(Debug, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct ConnParam {
    pub qp_num: u32,
    pub qkey: u32,
    pub private_data: [u8; MAX_PRIVATE_DATA],
    pub private_data_len: u8,
    pub srq: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub valid: u8,
}
assert_layout!(ConnParam, size 272, private_data @ 8, private_data_len @ 264, responder_resources @ 266, valid @ 271);

/// `struct rdma_ucm_ece`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct Ece {
    pub vendor_id: u32,
    pub attr_mod: u32,
}
assert_layout!(Ece, size 8, vendor_id @ 0, attr_mod @ 4);

/// `struct rdma_ucm_connect`.
#[repr(C)]
#[derive(Debug, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct Connect {
    pub conn_param: ConnParam,
    pub id: u32,
    pub reserved: u32,
    pub ece: Ece,
}
assert_layout!(Connect, size 288, id @ 272, ece @ 280);

/// `struct rdma_ucm_listen`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct Listen {
    pub id: u32,
    pub backlog: u32,
}
assert_layout!(Listen, size 8, id @ 0, backlog @ 4);

/// `struct rdma_ucm_accept`: with `conn_param.valid == 0` on the active side, the RTU.
#[repr(C)]
#[derive(Debug, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct Accept {
    pub uid: u64,
    pub conn_param: ConnParam,
    pub id: u32,
    pub reserved: u32,
    pub ece: Ece,
}
assert_layout!(Accept, size 296, conn_param @ 8, id @ 280, ece @ 288);

/// `struct rdma_ucm_reject`.
#[repr(C)]
#[derive(Debug, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct Reject {
    pub id: u32,
    pub private_data_len: u8,
    pub reason: u8,
    pub reserved: [u8; 2],
    pub private_data: [u8; MAX_PRIVATE_DATA],
}
assert_layout!(Reject, size 264, private_data_len @ 4, reason @ 5, private_data @ 8);

/// `struct rdma_ucm_disconnect`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct Disconnect {
    pub id: u32,
}
assert_layout!(Disconnect, size 4, id @ 0);

/// `struct rdma_ucm_init_qp_attr`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct InitQpAttr {
    pub response: u64,
    pub id: u32,
    pub qp_state: u32,
}
assert_layout!(InitQpAttr, size 16, response @ 0, id @ 8, qp_state @ 12);

/// `struct ib_uverbs_qp_attr`: INIT_QP_ATTR's response.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct UverbsQpAttr {
    pub qp_attr_mask: u32,
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    /// INIT_QP_ATTR's address vector; its order differs from MODIFY_QP's `ib_uverbs_qp_dest`.
    pub ah_attr: AhAttrAbi,
    pub alt_ah_attr: AhAttrAbi,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
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
    pub reserved: [u8; 5],
}
assert_layout!(UverbsQpAttr, size 144, ah_attr @ 40, alt_ah_attr @ 72, max_send_wr @ 104, pkey_index @ 124,
    max_rd_atomic @ 130, max_dest_rd_atomic @ 131, port_num @ 133, timeout @ 134, rnr_retry @ 136);

/// `struct rdma_ucm_get_event`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct GetEvent {
    pub response: u64,
}
assert_layout!(GetEvent, size 8, response @ 0);

/// `struct rdma_ucm_event_resp`. `param` is C's union of `rdma_ucm_conn_param` and
/// `rdma_ucm_ud_param`, 4-byte aligned at offset 20, kept as bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct EventResp {
    pub uid: u64,
    pub id: u32,
    pub event: u32,
    pub status: u32,
    pub param: [u8; 304],
    pub reserved: u32,
    pub ece: Ece,
}
assert_layout!(EventResp, size 336, id @ 8, event @ 12, status @ 16, param @ 20, reserved @ 324, ece @ 328);

/// `struct rdma_ucm_set_option`. The kernel only reads `optval` (`memdup_user` of `optlen`
/// bytes), so an address there is never written through.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct SetOption {
    pub optval: u64,
    pub id: u32,
    pub level: u32,
    pub optname: u32,
    pub optlen: u32,
}
assert_layout!(SetOption, size 24, optval @ 0, id @ 8, level @ 12, optname @ 16, optlen @ 20);

/// `struct rdma_ucm_notify`: `event` is an `enum ib_event_type`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct Notify {
    pub id: u32,
    pub event: u32,
}
assert_layout!(Notify, size 8, id @ 0, event @ 4);

/// `struct rdma_ucm_migrate_id`, written on the channel the id moves to.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
pub struct MigrateId {
    pub response: u64,
    pub id: u32,
    /// The fd of the channel the id leaves.
    pub fd: u32,
}
assert_layout!(MigrateId, size 16, response @ 0, id @ 8, fd @ 12);

/// A command struct: its number, and where its `response` user pointer is, if it has one.
///
/// # Safety
/// Implementors hold no user address the kernel writes through other than the field at
/// `RESPONSE_AT`, which names a `Resp` (addresses the kernel only reads, as SET_OPTION's
/// `optval`, cannot break this process's memory).
pub unsafe trait UcmCommand: IntoBytes + Immutable {
    const CMD: u32;
    const VERB: Verb;
    /// Offset of the `response` field, for commands that answer.
    const RESPONSE_AT: Option<usize>;
    type Resp: FromBytes + IntoBytes;
}

macro_rules! commands {
    ($($req:ty => $cmd:ident $(, response @ $at:literal -> $resp:ty)?;)*) => {$(
        // SAFETY: the struct has no user address but `response` (when given), at `$at`.
        unsafe impl UcmCommand for $req {
            const CMD: u32 = cmd::$cmd;
            const VERB: Verb = stringify!($cmd);
            const RESPONSE_AT: Option<usize> = commands!(@at $($at)?);
            type Resp = commands!(@resp $($resp)?);
        }
    )*};
    (@at) => { None };
    (@at $at:literal) => { Some($at) };
    (@resp) => { () };
    (@resp $resp:ty) => { $resp };
}

commands! {
    CreateId => CREATE_ID, response @ 8 -> CreateIdResp;
    DestroyId => DESTROY_ID, response @ 0 -> EventsReportedResp;
    Bind => BIND;
    ResolveAddr => RESOLVE_ADDR;
    ResolveRoute => RESOLVE_ROUTE;
    Query => QUERY, response @ 0 -> QueryAddrResp;
    QueryPath => QUERY, response @ 0 -> QueryPathResp;
    Connect => CONNECT;
    Listen => LISTEN;
    Accept => ACCEPT;
    Reject => REJECT;
    Disconnect => DISCONNECT;
    InitQpAttr => INIT_QP_ATTR, response @ 0 -> UverbsQpAttr;
    GetEvent => GET_EVENT, response @ 0 -> EventResp;
    MigrateId => MIGRATE_ID, response @ 0 -> EventsReportedResp;
    SetOption => SET_OPTION;
    Notify => NOTIFY;
}

/// Largest command body (ACCEPT).
const MAX_BODY: usize = 296;

/// Writes one command on an rdma_cm channel and returns its response; `resp` is the value the
/// response starts from (the kernel may write fewer bytes than it holds).
pub fn execute<C: UcmCommand>(fd: BorrowedFd<'_>, req: &C, mut resp: C::Resp) -> Result<C::Resp, nix::errno::Errno> {
    execute_into(fd, req, &mut resp)?;
    Ok(resp)
}

/// [`execute`] with the response written in place: for large responses (an event), which
/// would otherwise be copied in and out.
pub fn execute_into<C: UcmCommand>(fd: BorrowedFd<'_>, req: &C, resp: &mut C::Resp) -> Result<(), nix::errno::Errno> {
    let body = req.as_bytes();
    let resp_bytes = resp.as_mut_bytes();
    let hdr = UcmHdr {
        cmd: C::CMD,
        in_: body.len() as u16,
        out: if C::RESPONSE_AT.is_some() {
            resp_bytes.len() as u16
        } else {
            0
        },
    };
    const { assert!(size_of::<C>() <= MAX_BODY) };
    if let Some(at) = C::RESPONSE_AT {
        assert!(at + 8 <= size_of::<C>(), "a response pointer outside the command");
    }
    // Only the bytes written go to the kernel: nothing is zeroed first (a command is sent
    // for every step of a connection, and the buffer is the largest command's size).
    let mut buf = std::mem::MaybeUninit::<[u8; size_of::<UcmHdr>() + MAX_BODY]>::uninit();
    let at = buf.as_mut_ptr().cast::<u8>();
    let len = size_of::<UcmHdr>() + size_of::<C>();
    // SAFETY: the header (8 bytes) and the body (`size_of::<C>()` bytes, at most `MAX_BODY`:
    // asserted above) fit the buffer and come from other memory; the response pointer is
    // written over 8 bytes of the body (asserted in it). The first `len` bytes are then
    // initialised, and only they are read.
    let bytes = unsafe {
        std::ptr::copy_nonoverlapping(hdr.as_bytes().as_ptr(), at, size_of::<UcmHdr>());
        std::ptr::copy_nonoverlapping(body.as_ptr(), at.add(size_of::<UcmHdr>()), size_of::<C>());
        if let Some(offset) = C::RESPONSE_AT {
            let ptr = resp_bytes.as_mut_ptr() as u64;
            std::ptr::write_unaligned(at.add(size_of::<UcmHdr>() + offset).cast::<u64>(), ptr);
        }
        std::slice::from_raw_parts(at, len)
    };
    let n = nix::unistd::write(fd, bytes)?;
    if n != len {
        return Err(nix::errno::Errno::EIO);
    }
    Ok(())
}

/// [`execute`] with the kernel's refusal as the crate's error, named by the command.
pub fn call<C: UcmCommand>(fd: BorrowedFd<'_>, req: &C, resp: C::Resp) -> Result<C::Resp> {
    execute(fd, req, resp).map_err(|e| Error::kernel(C::VERB, e))
}

const _: () = assert!(size_of::<Accept>() == MAX_BODY);

#[cfg(test)]
super::layout_check::kernel_layouts! {
    headers: ["rdma/rdma_user_cm.h"],
    structs: {
        UcmHdr = "struct rdma_ucm_cmd_hdr" { cmd, in_ = "in", out },
        CreateId = "struct rdma_ucm_create_id" { uid, response, ps, qp_type, reserved },
        CreateIdResp = "struct rdma_ucm_create_id_resp" { id },
        DestroyId = "struct rdma_ucm_destroy_id" { response, id, reserved },
        EventsReportedResp = "struct rdma_ucm_destroy_id_resp" { events_reported },
        Bind = "struct rdma_ucm_bind" { id, addr_size, reserved, addr },
        ResolveAddr = "struct rdma_ucm_resolve_addr" {
            id, timeout_ms, src_size, dst_size, reserved, src_addr, dst_addr,
        },
        ResolveRoute = "struct rdma_ucm_resolve_route" { id, timeout_ms },
        Query = "struct rdma_ucm_query" { response, id, option },
        QueryAddrResp = "struct rdma_ucm_query_addr_resp" {
            node_guid, port_num, reserved, pkey, src_size, dst_size, src_addr, dst_addr, ibdev_index, reserved1,
        },
        ConnParam = "struct rdma_ucm_conn_param" {
            qp_num, qkey, private_data, private_data_len, srq, responder_resources, initiator_depth,
            flow_control, retry_count, rnr_retry_count, valid,
        },
        Ece = "struct rdma_ucm_ece" { vendor_id, attr_mod },
        Connect = "struct rdma_ucm_connect" { conn_param, id, reserved, ece },
        Listen = "struct rdma_ucm_listen" { id, backlog },
        Accept = "struct rdma_ucm_accept" { uid, conn_param, id, reserved, ece },
        Reject = "struct rdma_ucm_reject" { id, private_data_len, reason, reserved, private_data },
        Disconnect = "struct rdma_ucm_disconnect" { id },
        InitQpAttr = "struct rdma_ucm_init_qp_attr" { response, id, qp_state },
        UverbsQpAttr = "struct ib_uverbs_qp_attr" {
            qp_attr_mask, qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn,
            dest_qp_num, qp_access_flags, ah_attr, alt_ah_attr, max_send_wr, max_recv_wr, max_send_sge,
            max_recv_sge, max_inline_data, pkey_index, alt_pkey_index, en_sqd_async_notify, sq_draining,
            max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
            alt_port_num, alt_timeout, reserved,
        },
        GetEvent = "struct rdma_ucm_get_event" { response },
        EventResp = "struct rdma_ucm_event_resp" { uid, id, event, status, param, reserved, ece },
        MigrateId = "struct rdma_ucm_migrate_id" { response, id, fd },
        SetOption = "struct rdma_ucm_set_option" { optval, id, level, optname, optlen },
        PathRecData = "struct ib_path_rec_data" { flags, reserved, path_rec },
        QueryPathResp = "struct rdma_ucm_query_path_resp"
            sized(format!("sizeof(struct rdma_ucm_query_path_resp) + {MAX_PATHS} * sizeof(struct ib_path_rec_data)"))
        {
            num_paths, reserved, path_data,
        },
        Notify = "struct rdma_ucm_notify" { id, event },
    },
    values: {
        MAX_PRIVATE_DATA => "RDMA_MAX_PRIVATE_DATA",
        SOCKADDR_STORAGE => "sizeof(struct __kernel_sockaddr_storage)",
        PS_TCP => "RDMA_PS_TCP",
        QUERY_ADDR => "RDMA_USER_CM_QUERY_ADDR",
        cmd::CREATE_ID => "RDMA_USER_CM_CMD_CREATE_ID",
        cmd::DESTROY_ID => "RDMA_USER_CM_CMD_DESTROY_ID",
        cmd::RESOLVE_ROUTE => "RDMA_USER_CM_CMD_RESOLVE_ROUTE",
        cmd::CONNECT => "RDMA_USER_CM_CMD_CONNECT",
        cmd::LISTEN => "RDMA_USER_CM_CMD_LISTEN",
        cmd::ACCEPT => "RDMA_USER_CM_CMD_ACCEPT",
        cmd::REJECT => "RDMA_USER_CM_CMD_REJECT",
        cmd::DISCONNECT => "RDMA_USER_CM_CMD_DISCONNECT",
        cmd::INIT_QP_ATTR => "RDMA_USER_CM_CMD_INIT_QP_ATTR",
        cmd::GET_EVENT => "RDMA_USER_CM_CMD_GET_EVENT",
        cmd::MIGRATE_ID => "RDMA_USER_CM_CMD_MIGRATE_ID",
        cmd::QUERY => "RDMA_USER_CM_CMD_QUERY",
        cmd::BIND => "RDMA_USER_CM_CMD_BIND",
        cmd::RESOLVE_ADDR => "RDMA_USER_CM_CMD_RESOLVE_ADDR",
        cmd::SET_OPTION => "RDMA_USER_CM_CMD_SET_OPTION",
        cmd::NOTIFY => "RDMA_USER_CM_CMD_NOTIFY",
        option::LEVEL_ID => "RDMA_OPTION_ID",
        option::ID_TOS => "RDMA_OPTION_ID_TOS",
        option::ID_REUSEADDR => "RDMA_OPTION_ID_REUSEADDR",
        option::ID_AFONLY => "RDMA_OPTION_ID_AFONLY",
        option::ID_ACK_TIMEOUT => "RDMA_OPTION_ID_ACK_TIMEOUT",
        option::LEVEL_IB => "RDMA_OPTION_IB",
        option::IB_PATH => "RDMA_OPTION_IB_PATH",
        QUERY_PATH => "RDMA_USER_CM_QUERY_PATH",
        path_flags::GMP => "IB_PATH_GMP",
        path_flags::PRIMARY => "IB_PATH_PRIMARY",
        path_flags::BIDIRECTIONAL => "IB_PATH_BIDIRECTIONAL",
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// The framing as the kernel's `ucma_write` reads it: an 8-byte header with byte counts,
    /// the whole struct, and the response pointer at the command's own offset.
    #[test]
    fn commands_are_framed_with_byte_counts_and_their_response_pointer() {
        let (rx, tx) = nix::unistd::pipe().unwrap();
        let req = CreateId {
            uid: 7,
            ps: PS_TCP,
            qp_type: 2,
            ..Default::default()
        };
        execute(std::os::fd::AsFd::as_fd(&tx), &req, CreateIdResp::default()).unwrap();
        execute(std::os::fd::AsFd::as_fd(&tx), &Listen { id: 3, backlog: 9 }, ()).unwrap();
        drop(tx);
        // Plain reads: `read_to_end` asks the file's size first (statx), which miri refuses.
        let (mut rx, mut bytes, mut at) = (std::fs::File::from(rx), vec![0; 64], 0);
        while let n @ 1.. = rx.read(&mut bytes[at..]).unwrap() {
            at += n;
        }
        bytes.truncate(at);
        assert_eq!(bytes.len(), 8 + 24 + 8 + 8);
        assert_eq!(
            &bytes[..8],
            UcmHdr {
                cmd: 0,
                in_: 24,
                out: 4
            }
            .as_bytes()
        );
        assert_eq!(u64::from_ne_bytes(bytes[8..16].try_into().unwrap()), 7, "uid");
        assert_ne!(
            u64::from_ne_bytes(bytes[16..24].try_into().unwrap()),
            0,
            "response pointer at 8"
        );
        assert_eq!(&bytes[24..28], &[0x06, 0x01, 2, 0]);
        assert_eq!(&bytes[32..40], UcmHdr { cmd: 7, in_: 8, out: 0 }.as_bytes());
        assert_eq!(&bytes[40..], Listen { id: 3, backlog: 9 }.as_bytes());
    }
}
