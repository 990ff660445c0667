//! The C structures libibverbs and its providers share, as `#[repr(C)]` Rust structs.
//!
//! Two sources, two kinds of check:
//!
//! - Public structs from `<infiniband/verbs.h>` (installed by `libibverbs-dev`): sizes and
//!   offsets are asserted at compile time below, and the unit test `layout::matches_verbs_h`
//!   compiles a C program against the installed header and compares every asserted number.
//! - Provider-private structs from rdma-core v44's `libibverbs/driver.h` (not installed by
//!   Debian; the provider ABI `IBVERBS_PRIVATE_34`): transcribed from the v44 source, and the
//!   asserted numbers were obtained by compiling that header with gcc on x86_64 (see
//!   docs/libibverbs-provider.md, "Checking the layouts"). A change to any of them changes the
//!   PABI number, which [`crate::libibverbs`] checks at load time.
//!
//! Function pointers libibverbs fills and this provider never calls are typed [`OpaqueFn`]:
//! same size and alignment, no signature to get wrong.
#![allow(non_camel_case_types, dead_code)]

use libc::{c_char, c_int, c_uint, c_void, dev_t, pthread_cond_t, pthread_mutex_t, size_t};
use std::sync::atomic::AtomicI32;

use uverbs::assert_layout;

/// A function pointer this provider stores or lets libibverbs store, but never calls.
pub type OpaqueFn = Option<unsafe extern "C" fn()>;

/// `IBV_SYSFS_NAME_MAX`.
pub const SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const SYSFS_PATH_MAX: usize = 256;

// ---------------------------------------------------------------------------------------------
// verbs.h: devices and contexts
// ---------------------------------------------------------------------------------------------

/// `struct _ibv_device_ops`: two legacy slots libibverbs asserts are NULL.
#[repr(C)]
pub struct ibv_device_ops_compat {
    pub _dummy1: OpaqueFn,
    pub _dummy2: OpaqueFn,
}

/// `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    pub _ops: ibv_device_ops_compat,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; SYSFS_NAME_MAX],
    pub dev_name: [c_char; SYSFS_NAME_MAX],
    pub dev_path: [c_char; SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; SYSFS_PATH_MAX],
}
assert_layout!(ibv_device, size 664, node_type @ 16, transport_type @ 20, name @ 24,
    dev_name @ 88, dev_path @ 152, ibdev_path @ 408);

/// `struct ibv_context_ops`: the data-path entry points the inline `ibv_poll_cq`,
/// `ibv_post_send` and friends call directly (filled by `verbs_set_ops`).
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: OpaqueFn,
    pub _compat_query_port: OpaqueFn,
    pub _compat_alloc_pd: OpaqueFn,
    pub _compat_dealloc_pd: OpaqueFn,
    pub _compat_reg_mr: OpaqueFn,
    pub _compat_rereg_mr: OpaqueFn,
    pub _compat_dereg_mr: OpaqueFn,
    pub alloc_mw: OpaqueFn,
    pub bind_mw: OpaqueFn,
    pub dealloc_mw: OpaqueFn,
    pub _compat_create_cq: OpaqueFn,
    pub poll_cq: OpaqueFn,
    pub req_notify_cq: OpaqueFn,
    pub _compat_cq_event: OpaqueFn,
    pub _compat_resize_cq: OpaqueFn,
    pub _compat_destroy_cq: OpaqueFn,
    pub _compat_create_srq: OpaqueFn,
    pub _compat_modify_srq: OpaqueFn,
    pub _compat_query_srq: OpaqueFn,
    pub _compat_destroy_srq: OpaqueFn,
    pub post_srq_recv: Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub _compat_create_qp: OpaqueFn,
    pub _compat_query_qp: OpaqueFn,
    pub _compat_modify_qp: OpaqueFn,
    pub _compat_destroy_qp: OpaqueFn,
    pub post_send: OpaqueFn,
    pub post_recv: OpaqueFn,
    pub _compat_create_ah: OpaqueFn,
    pub _compat_destroy_ah: OpaqueFn,
    pub _compat_attach_mcast: OpaqueFn,
    pub _compat_detach_mcast: OpaqueFn,
    pub _compat_async_event: OpaqueFn,
}
assert_layout!(ibv_context_ops, size 256, poll_cq @ 88, post_send @ 200, post_recv @ 208);

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}
assert_layout!(ibv_context, size 328, ops @ 8, cmd_fd @ 264, async_fd @ 268,
    num_comp_vectors @ 272, mutex @ 280, abi_compat @ 320);

/// `struct verbs_context`: the extended context; `context` must be its last field, and
/// libibverbs finds this struct from an `ibv_context` by that offset. Every slot before `sz`
/// is filled by `verbs_init_context`/`verbs_set_ops` (libibverbs), never by the provider.
#[repr(C)]
pub struct verbs_context {
    pub query_port: OpaqueFn,
    pub advise_mr: OpaqueFn,
    pub alloc_null_mr: OpaqueFn,
    pub read_counters: OpaqueFn,
    pub attach_counters_point_flow: OpaqueFn,
    pub create_counters: OpaqueFn,
    pub destroy_counters: OpaqueFn,
    pub reg_dm_mr: OpaqueFn,
    pub alloc_dm: OpaqueFn,
    pub free_dm: OpaqueFn,
    pub modify_flow_action_esp: OpaqueFn,
    pub destroy_flow_action: OpaqueFn,
    pub create_flow_action_esp: OpaqueFn,
    pub modify_qp_rate_limit: OpaqueFn,
    pub alloc_parent_domain: OpaqueFn,
    pub dealloc_td: OpaqueFn,
    pub alloc_td: OpaqueFn,
    pub modify_cq: OpaqueFn,
    pub post_srq_ops: OpaqueFn,
    pub destroy_rwq_ind_table: OpaqueFn,
    pub create_rwq_ind_table: OpaqueFn,
    pub destroy_wq: OpaqueFn,
    pub modify_wq: OpaqueFn,
    pub create_wq: OpaqueFn,
    pub query_rt_values: OpaqueFn,
    pub create_cq_ex: OpaqueFn,
    /// `struct verbs_ex_private *`, libibverbs' own state (opaque here).
    pub priv_: *mut c_void,
    pub query_device_ex: OpaqueFn,
    pub ibv_destroy_flow: OpaqueFn,
    pub abi_placeholder2: OpaqueFn,
    pub ibv_create_flow: OpaqueFn,
    pub abi_placeholder1: OpaqueFn,
    pub open_qp: OpaqueFn,
    pub create_qp_ex: OpaqueFn,
    pub get_srq_num: OpaqueFn,
    pub create_srq_ex: OpaqueFn,
    pub open_xrcd: OpaqueFn,
    pub close_xrcd: OpaqueFn,
    pub _abi_placeholder3: u64,
    /// `sizeof(struct verbs_context)`, written by `verbs_init_context`: checked after init.
    pub sz: size_t,
    pub context: ibv_context,
}
assert_layout!(verbs_context, size 648, priv_ @ 208, query_device_ex @ 216, sz @ 312,
    context @ 320);

// ---------------------------------------------------------------------------------------------
// verbs.h: objects
// ---------------------------------------------------------------------------------------------

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}
assert_layout!(ibv_pd, size 16, handle @ 8);

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: size_t,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}
assert_layout!(ibv_mr, size 48, addr @ 16, length @ 24, handle @ 32, lkey @ 36, rkey @ 40);

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}
assert_layout!(ibv_comp_channel, size 16, fd @ 8, refcnt @ 12);

/// `struct ibv_cq`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}
assert_layout!(ibv_cq, size 128, handle @ 24, cqe @ 28, mutex @ 32, cond @ 72,
    comp_events_completed @ 120, async_events_completed @ 124);

/// `sizeof(struct ibv_cq_ex)`: `struct verbs_cq` is a union of `ibv_cq` and `ibv_cq_ex`.
pub const IBV_CQ_EX_SIZE: usize = 288;

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}
assert_layout!(ibv_poll_cq_attr, size 4);

/// A read accessor of `struct ibv_cq_ex`.
pub type CqExRead<T> = Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> T>;

/// `struct ibv_cq_ex`: the fields of `struct ibv_cq`, then the extended poll interface the
/// provider fills and libibverbs' inline `ibv_start_poll`, `ibv_wc_read_*`... call.
#[repr(C)]
pub struct ibv_cq_ex {
    pub cq: ibv_cq,
    pub comp_mask: u32,
    /// `enum ibv_wc_status` of the current completion.
    pub status: c_uint,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    pub read_opcode: CqExRead<c_uint>,
    pub read_vendor_err: CqExRead<u32>,
    pub read_byte_len: CqExRead<u32>,
    pub read_imm_data: CqExRead<u32>,
    pub read_qp_num: CqExRead<u32>,
    pub read_src_qp: CqExRead<u32>,
    pub read_wc_flags: CqExRead<c_uint>,
    pub read_slid: CqExRead<u32>,
    pub read_sl: CqExRead<u8>,
    pub read_dlid_path_bits: CqExRead<u8>,
    pub read_completion_ts: OpaqueFn,
    pub read_cvlan: OpaqueFn,
    pub read_flow_tag: OpaqueFn,
    pub read_tm_info: OpaqueFn,
    pub read_completion_wallclock_ns: OpaqueFn,
}
assert_layout!(ibv_cq_ex, size 288, comp_mask @ 128, status @ 132, wr_id @ 136, start_poll @ 144,
    next_poll @ 152, end_poll @ 160, read_opcode @ 168, read_vendor_err @ 176, read_byte_len @ 184,
    read_imm_data @ 192, read_qp_num @ 200, read_src_qp @ 208, read_wc_flags @ 216, read_slid @ 224,
    read_sl @ 232, read_dlid_path_bits @ 240, read_completion_ts @ 248,
    read_completion_wallclock_ns @ 280);

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    /// `enum ibv_create_cq_wc_flags` bits.
    pub wc_flags: u64,
    /// `enum ibv_cq_init_attr_mask` bits.
    pub comp_mask: u32,
    /// `enum ibv_create_cq_attr_flags` bits.
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}
assert_layout!(ibv_cq_init_attr_ex, size 56, cq_context @ 8, channel @ 16, comp_vector @ 24,
    wc_flags @ 32, comp_mask @ 40, flags @ 44, parent_domain @ 48);

/// `enum ibv_create_cq_wc_flags`: the fields an extended CQ can be asked to read.
pub mod wc_ex {
    pub const WITH_BYTE_LEN: u64 = 1 << 0;
    pub const WITH_IMM: u64 = 1 << 1;
    pub const WITH_QP_NUM: u64 = 1 << 2;
    pub const WITH_SRC_QP: u64 = 1 << 3;
    pub const WITH_SLID: u64 = 1 << 4;
    pub const WITH_SL: u64 = 1 << 5;
    pub const WITH_DLID_PATH_BITS: u64 = 1 << 6;
    /// What rxe completions carry (rdma-core's rxe offers the same).
    pub const SUPPORTED: u64 =
        WITH_BYTE_LEN | WITH_IMM | WITH_QP_NUM | WITH_SRC_QP | WITH_SLID | WITH_SL | WITH_DLID_PATH_BITS;
}

/// `enum ibv_cq_init_attr_mask`.
pub mod cq_init_attr_mask {
    pub const FLAGS: u32 = 1 << 0;
    pub const PD: u32 = 1 << 1;
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}
assert_layout!(ibv_srq, size 128, handle @ 24, mutex @ 32, cond @ 72, events_completed @ 120);

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}
assert_layout!(ibv_srq_attr, size 12, max_sge @ 4, srq_limit @ 8);

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}
assert_layout!(ibv_srq_init_attr, size 24, attr @ 8);

/// `struct ibv_srq_init_attr_ex` (`tm_cap`, two `uint32_t`, kept as one array).
#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    /// `enum ibv_srq_init_attr_mask` bits.
    pub comp_mask: u32,
    /// `enum ibv_srq_type`.
    pub srq_type: c_int,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub cq: *mut ibv_cq,
    pub tm_cap: [u32; 2],
}
assert_layout!(ibv_srq_init_attr_ex, size 64, comp_mask @ 20, srq_type @ 24, pd @ 32, xrcd @ 40,
    cq @ 48, tm_cap @ 56);

/// `enum ibv_srq_init_attr_mask`.
pub mod srq_init_attr_mask {
    pub const TYPE: u32 = 1 << 0;
    pub const PD: u32 = 1 << 1;
    pub const RESERVED: u32 = 1 << 5;
}

/// `IBV_SRQT_BASIC`.
pub const SRQT_BASIC: c_int = 0;

/// `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}
assert_layout!(ibv_ah, size 24, pd @ 8, handle @ 16);

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}
assert_layout!(ibv_qp, size 160, srq @ 40, handle @ 48, qp_num @ 52, state @ 56, qp_type @ 60,
    mutex @ 64, cond @ 104, events_completed @ 152);

/// `sizeof(struct ibv_qp_ex)`: `struct verbs_qp` is a union of `ibv_qp` and `ibv_qp_ex`.
pub const IBV_QP_EX_SIZE: usize = 352;

/// `struct ibv_mw`.
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`.
    pub type_: c_int,
}
assert_layout!(ibv_mw, size 32, pd @ 8, rkey @ 16, handle @ 20, type_ @ 24);

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}
assert_layout!(ibv_mw_bind_info, size 32, addr @ 8, length @ 16, mw_access_flags @ 24);

/// `struct ibv_mw_bind`.
#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}
assert_layout!(ibv_mw_bind, size 48, send_flags @ 8, bind_info @ 16);

/// `struct ibv_data_buf`.
#[repr(C)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: size_t,
}
assert_layout!(ibv_data_buf, size 16, length @ 8);

/// A builder or setter of `struct ibv_qp_ex`.
pub type QpExFn<A> = Option<A>;
type X = *mut ibv_qp_ex;

/// `struct ibv_qp_ex`: `struct ibv_qp`, then the work request interface the provider fills
/// and libibverbs' inline `ibv_wr_*` call.
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    /// `enum ibv_send_flags` bits.
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: QpExFn<unsafe extern "C" fn(X, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: QpExFn<unsafe extern "C" fn(X, u32, u64, u64)>,
    pub wr_bind_mw: QpExFn<unsafe extern "C" fn(X, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    pub wr_local_inv: QpExFn<unsafe extern "C" fn(X, u32)>,
    pub wr_rdma_read: QpExFn<unsafe extern "C" fn(X, u32, u64)>,
    pub wr_rdma_write: QpExFn<unsafe extern "C" fn(X, u32, u64)>,
    pub wr_rdma_write_imm: QpExFn<unsafe extern "C" fn(X, u32, u64, u32)>,
    pub wr_send: QpExFn<unsafe extern "C" fn(X)>,
    pub wr_send_imm: QpExFn<unsafe extern "C" fn(X, u32)>,
    pub wr_send_inv: QpExFn<unsafe extern "C" fn(X, u32)>,
    pub wr_send_tso: OpaqueFn,
    pub wr_set_ud_addr: QpExFn<unsafe extern "C" fn(X, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: OpaqueFn,
    pub wr_set_inline_data: QpExFn<unsafe extern "C" fn(X, *mut c_void, size_t)>,
    pub wr_set_inline_data_list: QpExFn<unsafe extern "C" fn(X, size_t, *const ibv_data_buf)>,
    pub wr_set_sge: QpExFn<unsafe extern "C" fn(X, u32, u64, u32)>,
    pub wr_set_sge_list: QpExFn<unsafe extern "C" fn(X, size_t, *const ibv_sge)>,
    pub wr_start: QpExFn<unsafe extern "C" fn(X)>,
    pub wr_complete: QpExFn<unsafe extern "C" fn(X) -> c_int>,
    pub wr_abort: QpExFn<unsafe extern "C" fn(X)>,
    pub wr_atomic_write: QpExFn<unsafe extern "C" fn(X, u32, u64, *const c_void)>,
}
assert_layout!(ibv_qp_ex, size 352, comp_mask @ 160, wr_id @ 168, wr_flags @ 176,
    wr_atomic_cmp_swp @ 184, wr_local_inv @ 208, wr_send @ 240, wr_send_tso @ 264,
    wr_set_ud_addr @ 272, wr_set_inline_data @ 288, wr_set_sge_list @ 312, wr_start @ 320,
    wr_complete @ 328, wr_abort @ 336, wr_atomic_write @ 344);

/// `enum ibv_qp_create_send_ops_flags`: the `ibv_wr_*` builders asked for at `create_qp_ex`.
pub mod send_ops {
    pub const RDMA_WRITE: u64 = 1 << 0;
    pub const RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
    pub const SEND: u64 = 1 << 2;
    pub const SEND_WITH_IMM: u64 = 1 << 3;
    pub const RDMA_READ: u64 = 1 << 4;
    pub const ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
    pub const ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
    pub const LOCAL_INV: u64 = 1 << 7;
    pub const BIND_MW: u64 = 1 << 8;
    pub const SEND_WITH_INV: u64 = 1 << 9;
    pub const TSO: u64 = 1 << 10;
    pub const ATOMIC_WRITE: u64 = 1 << 12;
}

/// `VERBS_QP_EX` of `verbs_qp.comp_mask` (driver.h): `ibv_qp_to_qp_ex` hands out the
/// `ibv_qp_ex` only when it is set.
pub const VERBS_QP_EX: u32 = 1 << 1;

/// `struct ibv_qp_cap`; the same layout as [`uverbs::QpCap`].
pub type ibv_qp_cap = uverbs::QpCap;
assert_layout!(ibv_qp_cap, size 20, max_send_wr @ 0, max_recv_wr @ 4, max_send_sge @ 8,
    max_recv_sge @ 12, max_inline_data @ 16);

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}
assert_layout!(ibv_qp_init_attr, size 64, srq @ 24, cap @ 32, qp_type @ 52, sq_sig_all @ 56);

/// `struct ibv_rx_hash_conf`.
#[repr(C)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}
assert_layout!(ibv_rx_hash_conf, size 24);

/// `struct ibv_qp_init_attr_ex`: `ibv_qp_init_attr` plus extensions selected by `comp_mask`.
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}
assert_layout!(ibv_qp_init_attr_ex, size 136, comp_mask @ 60, pd @ 64, xrcd @ 72,
    create_flags @ 80, max_tso_header @ 84, rwq_ind_tbl @ 88, rx_hash_conf @ 96,
    source_qpn @ 120, send_ops_flags @ 128);

/// `enum ibv_qp_init_attr_mask` bits: libibverbs' own (the kernel's CREATE_QP takes other
/// `comp_mask` bits, `IB_UVERBS_CREATE_QP_MASK_*`), so they are not the core's.
pub mod qp_init_attr_mask {
    pub const PD: u32 = 1 << 0;
    pub const XRCD: u32 = 1 << 1;
    pub const CREATE_FLAGS: u32 = 1 << 2;
    pub const MAX_TSO_HEADER: u32 = 1 << 3;
    pub const IND_TABLE: u32 = 1 << 4;
    pub const RX_HASH: u32 = 1 << 5;
    pub const SEND_OPS_FLAGS: u32 = 1 << 6;
}

/// `struct ibv_global_route`. `dgid` is `union ibv_gid`, whose `global` arm holds two
/// `__be64`: hence 8-byte alignment (which makes `ibv_qp_attr` 144 bytes, not 140).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}
assert_layout!(ibv_global_route, size 24, flow_label @ 16, sgid_index @ 20, hop_limit @ 21,
    traffic_class @ 22);

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}
assert_layout!(ibv_ah_attr, size 32, dlid @ 24, sl @ 26, src_path_bits @ 27, static_rate @ 28,
    is_global @ 29, port_num @ 30);

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
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
    pub rate_limit: u32,
}
assert_layout!(ibv_qp_attr, size 144, qkey @ 16, dest_qp_num @ 28, qp_access_flags @ 32,
    cap @ 36, ah_attr @ 56, alt_ah_attr @ 88, pkey_index @ 120, en_sqd_async_notify @ 124,
    max_rd_atomic @ 126, max_dest_rd_atomic @ 127, min_rnr_timer @ 128, port_num @ 129,
    timeout @ 130, retry_cnt @ 131, rnr_retry @ 132, alt_timeout @ 134, rate_limit @ 136);

/// `struct ibv_sge`; the same layout as [`uverbs::Sge`].
pub type ibv_sge = uverbs::Sge;

/// `struct ibv_wc`; the same layout as [`uverbs::WorkCompletion`].
pub type ibv_wc = uverbs::WorkCompletion;
assert_layout!(ibv_wc, size 48, wr_id @ 0, status @ 8, opcode @ 12, vendor_err @ 16,
    byte_len @ 20, imm_data @ 24, qp_num @ 28, src_qp @ 32, wc_flags @ 36, pkey_index @ 40,
    slid @ 42, sl @ 44, dlid_path_bits @ 45);

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}
assert_layout!(ibv_recv_wr, size 32, next @ 8, sg_list @ 16, num_sge @ 24);

/// The `rdma` arm of `ibv_send_wr.wr`: the core's (which reads it in place).
pub type ibv_send_wr_rdma = uverbs::CRdmaArm;
/// The `atomic` arm of `ibv_send_wr.wr`.
pub type ibv_send_wr_atomic = uverbs::CAtomicArm;
/// The `ud` arm of `ibv_send_wr.wr`.
pub type ibv_send_wr_ud = uverbs::CUdArm;
/// `ibv_send_wr.wr`.
pub type ibv_send_wr_wr = uverbs::CSendArm;

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    /// `imm_data` (network order) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    /// The `bind_mw` arm of the `bind_mw`/`tso` union (the larger).
    pub bind_mw: ibv_send_wr_bind_mw,
}
assert_layout!(ibv_send_wr, size 128, next @ 8, sg_list @ 16, num_sge @ 24, opcode @ 28,
    send_flags @ 32, imm_data @ 36, wr @ 40, remote_srqn @ 72, bind_mw @ 80);
// The core reads the fields through `wr` in place, as its `CSendWr` (`uverbs::Qp::post_send_chain`).
assert_layout!(uverbs::CSendWr, size 72, next @ 8, sg_list @ 16, num_sge @ 24, opcode @ 28,
    send_flags @ 32, imm_data @ 36, wr @ 40);

/// `ibv_send_wr.bind_mw`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}
assert_layout!(ibv_send_wr_bind_mw, size 48, rkey @ 8, bind_info @ 16);

// ---------------------------------------------------------------------------------------------
// verbs.h: queries
// ---------------------------------------------------------------------------------------------

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}
assert_layout!(ibv_device_attr, size 232, node_guid @ 64, vendor_id @ 96, max_qp @ 108,
    device_cap_flags @ 116, atomic_cap @ 164, max_srq_sge @ 220, max_pkeys @ 224,
    local_ca_ack_delay @ 226, phys_port_cnt @ 227);

/// `struct ibv_device_attr_ex`. The extension blocks this provider only ever zeroes are kept
/// as opaque words.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    /// `struct ibv_odp_caps`.
    pub odp_caps: [u64; 3],
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    /// `tso_caps` through `cq_mod_caps` and padding: all zero on rxe.
    pub tso_to_cq_mod_caps: [u32; 22],
    pub max_dm_size: u64,
    /// `struct ibv_pci_atomic_caps`.
    pub pci_atomic_caps: [u16; 3],
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}
assert_layout!(ibv_device_attr_ex, size 400, comp_mask @ 232, odp_caps @ 240,
    completion_timestamp_mask @ 264, hca_core_clock @ 272, device_cap_flags_ex @ 280,
    tso_to_cq_mod_caps @ 288, max_dm_size @ 376, pci_atomic_caps @ 384, xrc_odp_caps @ 392,
    phys_port_cnt_ex @ 396);

/// `struct ibv_query_device_ex_input`.
#[repr(C)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
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
    pub port_cap_flags2: u16,
}
assert_layout!(ibv_port_attr, size 52, gid_tbl_len @ 12, pkey_tbl_len @ 32, lmc @ 38,
    active_speed @ 44, link_layer @ 46, flags @ 47, port_cap_flags2 @ 48);

// ---------------------------------------------------------------------------------------------
// driver.h (rdma-core v44, IBVERBS_PRIVATE_34)
// ---------------------------------------------------------------------------------------------

/// ccan `struct list_node`.
#[repr(C)]
pub struct list_node {
    pub next: *mut list_node,
    pub prev: *mut list_node,
}

/// `struct verbs_match_ent`.
#[repr(C)]
pub struct verbs_match_ent {
    pub driver_data: *mut c_void,
    /// `u.modalias` (a C string) or `u.driver_id`.
    pub u: u64,
    pub vendor: u16,
    pub device: u16,
    pub kind: u8,
}
assert_layout!(verbs_match_ent, size 24, u @ 8, vendor @ 16, device @ 18, kind @ 20);

/// `VERBS_MATCH_*` kinds (driver.h; libibverbs' own).
pub mod match_kind {
    pub const SENTINEL: u8 = 0;
    pub const MODALIAS: u8 = 2;
    pub const DRIVER_ID: u8 = 3;
}

/// `struct verbs_sysfs_dev`: an RDMA device found in sysfs, as libibverbs hands it to a
/// provider's `match_device`/`alloc_device`.
#[repr(C)]
pub struct verbs_sysfs_dev {
    pub entry: list_node,
    pub provider_data: *mut c_void,
    pub match_: *const verbs_match_ent,
    pub flags: c_uint,
    pub sysfs_name: [c_char; SYSFS_NAME_MAX],
    pub sysfs_cdev: dev_t,
    pub ibdev_name: [c_char; SYSFS_NAME_MAX],
    pub ibdev_path: [c_char; SYSFS_PATH_MAX],
    pub modalias: [c_char; 512],
    pub node_guid: u64,
    pub driver_id: u32,
    pub node_type: c_int,
    pub ibdev_idx: c_int,
    pub num_ports: u32,
    pub abi_ver: u32,
    pub time_created: libc::timespec,
}
assert_layout!(verbs_sysfs_dev, size 992, match_ @ 24, flags @ 32, sysfs_name @ 36,
    sysfs_cdev @ 104, ibdev_name @ 112, ibdev_path @ 176, modalias @ 432, node_guid @ 944,
    driver_id @ 952, node_type @ 956, ibdev_idx @ 960, num_ports @ 964, abi_ver @ 968,
    time_created @ 976);

/// `verbs_device_ops.alloc_context`.
pub type AllocContextFn = unsafe extern "C" fn(*mut ibv_device, c_int, *mut c_void) -> *mut verbs_context;
/// `verbs_device_ops.alloc_device`.
pub type AllocDeviceFn = unsafe extern "C" fn(*mut verbs_sysfs_dev) -> *mut verbs_device;
/// `verbs_device_ops.uninit_device`.
pub type UninitDeviceFn = unsafe extern "C" fn(*mut verbs_device);

/// `struct verbs_device_ops`: what a provider registers.
#[repr(C)]
pub struct verbs_device_ops {
    pub name: *const c_char,
    pub match_min_abi_version: u32,
    pub match_max_abi_version: u32,
    pub match_table: *const verbs_match_ent,
    pub static_providers: *const *const verbs_device_ops,
    pub match_device: OpaqueFn,
    pub alloc_context: Option<AllocContextFn>,
    pub import_context: OpaqueFn,
    pub alloc_device: Option<AllocDeviceFn>,
    pub uninit_device: Option<UninitDeviceFn>,
}
assert_layout!(verbs_device_ops, size 72, match_table @ 16, match_device @ 32,
    alloc_context @ 40, import_context @ 48, alloc_device @ 56, uninit_device @ 64);

/// `struct verbs_device`: `device` must be first; libibverbs fills everything after it but
/// `core_support`.
#[repr(C)]
pub struct verbs_device {
    pub device: ibv_device,
    pub ops: *const verbs_device_ops,
    pub refcount: AtomicI32,
    pub entry: list_node,
    pub sysfs: *mut verbs_sysfs_dev,
    pub core_support: u64,
}
assert_layout!(verbs_device, size 712, ops @ 664, refcount @ 672, entry @ 680, sysfs @ 696,
    core_support @ 704);

/// `enum ibv_mr_type`.
pub const IBV_MR_TYPE_MR: c_int = 0;

/// `struct verbs_mr`.
#[repr(C)]
pub struct verbs_mr {
    pub ibv_mr: ibv_mr,
    pub mr_type: c_int,
    pub access: c_int,
}
assert_layout!(verbs_mr, size 56, mr_type @ 48, access @ 52);

/// `struct verbs_cq`: `union { struct ibv_cq cq; struct ibv_cq_ex cq_ex; }`.
#[repr(C)]
pub union verbs_cq {
    pub cq: ibv_cq,
    pub cq_ex: std::mem::ManuallyDrop<ibv_cq_ex>,
}
assert_layout!(verbs_cq, size 288);

/// `struct verbs_qp`.
#[repr(C)]
pub struct verbs_qp {
    /// `union { struct ibv_qp qp; struct ibv_qp_ex qp_ex; }`: `ibv_qp_ex` starts with the
    /// `ibv_qp`.
    pub qp_ex: ibv_qp_ex,
    pub comp_mask: u32,
    pub xrcd: *mut c_void,
}
assert_layout!(verbs_qp, size 368, comp_mask @ 352, xrcd @ 360);

/// `struct verbs_context_ops` (the provider's op table, handed to `verbs_set_ops`; kept
/// sorted as in driver.h). Slots this provider does not fill stay `None`, which makes
/// libibverbs answer with its own "not supported" stubs.
#[repr(C)]
#[derive(Default)]
pub struct verbs_context_ops {
    pub advise_mr: OpaqueFn,
    pub alloc_dm: OpaqueFn,
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, c_int) -> *mut ibv_mw>,
    pub alloc_null_mr: OpaqueFn,
    pub alloc_parent_domain: OpaqueFn,
    pub alloc_pd: Option<unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd>,
    pub alloc_td: OpaqueFn,
    pub async_event: OpaqueFn,
    pub attach_counters_point_flow: OpaqueFn,
    pub attach_mcast: Option<unsafe extern "C" fn(*mut ibv_qp, *const [u8; 16], u16) -> c_int>,
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int>,
    pub close_xrcd: OpaqueFn,
    pub cq_event: OpaqueFn,
    pub create_ah: Option<unsafe extern "C" fn(*mut ibv_pd, *mut ibv_ah_attr) -> *mut ibv_ah>,
    pub create_counters: OpaqueFn,
    pub create_cq: Option<unsafe extern "C" fn(*mut ibv_context, c_int, *mut ibv_comp_channel, c_int) -> *mut ibv_cq>,
    pub create_cq_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex>,
    pub create_flow: OpaqueFn,
    pub create_flow_action_esp: OpaqueFn,
    pub create_qp: Option<unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp>,
    pub create_qp_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp>,
    pub create_rwq_ind_table: OpaqueFn,
    pub create_srq: Option<unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq>,
    pub create_srq_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq>,
    pub create_wq: OpaqueFn,
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
    pub dealloc_pd: Option<unsafe extern "C" fn(*mut ibv_pd) -> c_int>,
    pub dealloc_td: OpaqueFn,
    pub dereg_mr: Option<unsafe extern "C" fn(*mut verbs_mr) -> c_int>,
    pub destroy_ah: Option<unsafe extern "C" fn(*mut ibv_ah) -> c_int>,
    pub destroy_counters: OpaqueFn,
    pub destroy_cq: Option<unsafe extern "C" fn(*mut ibv_cq) -> c_int>,
    pub destroy_flow: OpaqueFn,
    pub destroy_flow_action: OpaqueFn,
    pub destroy_qp: Option<unsafe extern "C" fn(*mut ibv_qp) -> c_int>,
    pub destroy_rwq_ind_table: OpaqueFn,
    pub destroy_srq: Option<unsafe extern "C" fn(*mut ibv_srq) -> c_int>,
    pub destroy_wq: OpaqueFn,
    pub detach_mcast: Option<unsafe extern "C" fn(*mut ibv_qp, *const [u8; 16], u16) -> c_int>,
    pub free_context: Option<unsafe extern "C" fn(*mut ibv_context)>,
    pub free_dm: OpaqueFn,
    pub get_srq_num: OpaqueFn,
    pub import_dm: OpaqueFn,
    pub import_mr: OpaqueFn,
    pub import_pd: OpaqueFn,
    pub modify_cq: OpaqueFn,
    pub modify_flow_action_esp: OpaqueFn,
    pub modify_qp: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int>,
    pub modify_qp_rate_limit: OpaqueFn,
    pub modify_srq: Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr, c_int) -> c_int>,
    pub modify_wq: OpaqueFn,
    pub open_qp: OpaqueFn,
    pub open_xrcd: OpaqueFn,
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub post_recv: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub post_send: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub post_srq_ops: OpaqueFn,
    pub post_srq_recv: Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub query_device_ex: Option<
        unsafe extern "C" fn(
            *mut ibv_context,
            *const ibv_query_device_ex_input,
            *mut ibv_device_attr_ex,
            size_t,
        ) -> c_int,
    >,
    pub query_ece: OpaqueFn,
    pub query_port: Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int>,
    pub query_qp: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int>,
    pub query_qp_data_in_order: OpaqueFn,
    pub query_rt_values: OpaqueFn,
    pub query_srq: Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr) -> c_int>,
    pub read_counters: OpaqueFn,
    pub reg_dm_mr: OpaqueFn,
    pub reg_dmabuf_mr: OpaqueFn,
    pub reg_mr: Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, size_t, u64, c_int) -> *mut ibv_mr>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    pub rereg_mr: OpaqueFn,
    pub resize_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    pub set_ece: OpaqueFn,
    pub unimport_dm: OpaqueFn,
    pub unimport_mr: OpaqueFn,
    pub unimport_pd: OpaqueFn,
}
assert_layout!(verbs_context_ops, size 608, alloc_pd @ 40, create_cq @ 120, create_qp @ 152,
    dealloc_pd @ 208, dereg_mr @ 224, destroy_qp @ 272, free_context @ 312, modify_qp @ 376,
    poll_cq @ 424, post_send @ 440, query_device_ex @ 464, query_port @ 480, query_qp @ 488,
    reg_mr @ 544, req_notify_cq @ 552, resize_cq @ 568, unimport_pd @ 600);

/// The C layout table the `layout` test checks against the installed `<infiniband/verbs.h>`:
/// `(C expression, value Rust computes)` for every public struct above.
#[cfg(test)]
pub(crate) fn public_layouts() -> Vec<(String, usize)> {
    use std::mem::{offset_of, size_of};
    let mut v = Vec::new();
    macro_rules! check {
        ($c:literal, $t:ty $(, $f:ident)*) => {
            v.push((format!("sizeof(struct {})", $c), size_of::<$t>()));
            $(v.push((format!("offsetof(struct {}, {})", $c, stringify!($f)), offset_of!($t, $f)));)*
        };
    }
    check!(
        "ibv_device",
        ibv_device,
        node_type,
        transport_type,
        name,
        dev_name,
        dev_path,
        ibdev_path
    );
    check!(
        "ibv_context_ops",
        ibv_context_ops,
        alloc_mw,
        poll_cq,
        req_notify_cq,
        post_srq_recv,
        post_send,
        post_recv,
        _compat_async_event
    );
    check!(
        "ibv_context",
        ibv_context,
        device,
        ops,
        cmd_fd,
        async_fd,
        num_comp_vectors,
        mutex,
        abi_compat
    );
    check!(
        "verbs_context",
        verbs_context,
        query_port,
        create_cq_ex,
        query_device_ex,
        open_qp,
        close_xrcd,
        sz,
        context
    );
    check!("ibv_pd", ibv_pd, context, handle);
    check!("ibv_mr", ibv_mr, context, pd, addr, length, handle, lkey, rkey);
    check!("ibv_comp_channel", ibv_comp_channel, context, fd, refcnt);
    check!(
        "ibv_cq",
        ibv_cq,
        context,
        channel,
        cq_context,
        handle,
        cqe,
        mutex,
        cond,
        comp_events_completed,
        async_events_completed
    );
    check!(
        "ibv_srq",
        ibv_srq,
        context,
        srq_context,
        pd,
        handle,
        mutex,
        cond,
        events_completed
    );
    check!("ibv_srq_attr", ibv_srq_attr, max_wr, max_sge, srq_limit);
    check!("ibv_srq_init_attr", ibv_srq_init_attr, srq_context, attr);
    check!("ibv_ah", ibv_ah, context, pd, handle);
    check!(
        "ibv_qp",
        ibv_qp,
        context,
        qp_context,
        pd,
        send_cq,
        recv_cq,
        srq,
        handle,
        qp_num,
        state,
        qp_type,
        mutex,
        cond,
        events_completed
    );
    check!(
        "ibv_qp_cap",
        ibv_qp_cap,
        max_send_wr,
        max_recv_wr,
        max_send_sge,
        max_recv_sge,
        max_inline_data
    );
    check!(
        "ibv_qp_init_attr",
        ibv_qp_init_attr,
        qp_context,
        send_cq,
        recv_cq,
        srq,
        cap,
        qp_type,
        sq_sig_all
    );
    check!(
        "ibv_rx_hash_conf",
        ibv_rx_hash_conf,
        rx_hash_function,
        rx_hash_key_len,
        rx_hash_key,
        rx_hash_fields_mask
    );
    check!(
        "ibv_qp_init_attr_ex",
        ibv_qp_init_attr_ex,
        cap,
        qp_type,
        sq_sig_all,
        comp_mask,
        pd,
        xrcd,
        create_flags,
        max_tso_header,
        rwq_ind_tbl,
        rx_hash_conf,
        source_qpn,
        send_ops_flags
    );
    check!(
        "ibv_global_route",
        ibv_global_route,
        dgid,
        flow_label,
        sgid_index,
        hop_limit,
        traffic_class
    );
    check!(
        "ibv_ah_attr",
        ibv_ah_attr,
        grh,
        dlid,
        sl,
        src_path_bits,
        static_rate,
        is_global,
        port_num
    );
    check!(
        "ibv_qp_attr",
        ibv_qp_attr,
        qp_state,
        cur_qp_state,
        path_mtu,
        path_mig_state,
        qkey,
        rq_psn,
        sq_psn,
        dest_qp_num,
        qp_access_flags,
        cap,
        ah_attr,
        alt_ah_attr,
        pkey_index,
        alt_pkey_index,
        en_sqd_async_notify,
        sq_draining,
        max_rd_atomic,
        max_dest_rd_atomic,
        min_rnr_timer,
        port_num,
        timeout,
        retry_cnt,
        rnr_retry,
        alt_port_num,
        alt_timeout,
        rate_limit
    );
    check!("ibv_sge", ibv_sge, addr, length, lkey);
    check!(
        "ibv_wc",
        ibv_wc,
        wr_id,
        status,
        opcode,
        vendor_err,
        byte_len,
        imm_data,
        qp_num,
        src_qp,
        wc_flags,
        pkey_index,
        slid,
        sl,
        dlid_path_bits
    );
    check!("ibv_recv_wr", ibv_recv_wr, wr_id, next, sg_list, num_sge);
    check!(
        "ibv_send_wr",
        ibv_send_wr,
        wr_id,
        next,
        sg_list,
        num_sge,
        opcode,
        send_flags,
        imm_data,
        wr
    );
    v.push((
        "offsetof(struct ibv_send_wr, qp_type)".into(),
        std::mem::offset_of!(ibv_send_wr, remote_srqn),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, bind_mw)".into(),
        std::mem::offset_of!(ibv_send_wr, bind_mw),
    ));
    v.push((
        "sizeof(((struct ibv_send_wr *)0)->bind_mw)".into(),
        size_of::<ibv_send_wr_bind_mw>(),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, bind_mw.rkey)".into(),
        80 + offset_of!(ibv_send_wr_bind_mw, rkey),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, bind_mw.bind_info)".into(),
        80 + offset_of!(ibv_send_wr_bind_mw, bind_info),
    ));
    v.push((
        "sizeof(((struct ibv_send_wr *)0)->wr)".into(),
        size_of::<ibv_send_wr_wr>(),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, wr.atomic.rkey)".into(),
        40 + offset_of!(ibv_send_wr_atomic, rkey),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, wr.rdma.rkey)".into(),
        40 + offset_of!(ibv_send_wr_rdma, rkey),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, wr.ud.remote_qkey)".into(),
        40 + offset_of!(ibv_send_wr_ud, remote_qkey),
    ));
    check!(
        "ibv_device_attr",
        ibv_device_attr,
        fw_ver,
        node_guid,
        sys_image_guid,
        max_mr_size,
        page_size_cap,
        vendor_id,
        vendor_part_id,
        hw_ver,
        max_qp,
        max_qp_wr,
        device_cap_flags,
        max_sge,
        max_sge_rd,
        max_cq,
        max_cqe,
        max_mr,
        max_pd,
        max_qp_rd_atom,
        max_ee_rd_atom,
        max_res_rd_atom,
        max_qp_init_rd_atom,
        max_ee_init_rd_atom,
        atomic_cap,
        max_ee,
        max_rdd,
        max_mw,
        max_raw_ipv6_qp,
        max_raw_ethy_qp,
        max_mcast_grp,
        max_mcast_qp_attach,
        max_total_mcast_qp_attach,
        max_ah,
        max_fmr,
        max_map_per_fmr,
        max_srq,
        max_srq_wr,
        max_srq_sge,
        max_pkeys,
        local_ca_ack_delay,
        phys_port_cnt
    );
    check!(
        "ibv_device_attr_ex",
        ibv_device_attr_ex,
        orig_attr,
        comp_mask,
        odp_caps,
        completion_timestamp_mask,
        hca_core_clock,
        device_cap_flags_ex,
        max_dm_size,
        pci_atomic_caps,
        xrc_odp_caps,
        phys_port_cnt_ex
    );
    v.push((
        "offsetof(struct ibv_device_attr_ex, tso_caps)".into(),
        offset_of!(ibv_device_attr_ex, tso_to_cq_mod_caps),
    ));
    v.push(("sizeof(struct ibv_odp_caps)".into(), 24));
    v.push((
        "offsetof(struct ibv_device_attr_ex, max_dm_size) - offsetof(struct ibv_device_attr_ex, tso_caps)".into(),
        size_of::<[u32; 22]>(),
    ));
    check!("ibv_query_device_ex_input", ibv_query_device_ex_input, comp_mask);
    check!(
        "ibv_port_attr",
        ibv_port_attr,
        state,
        max_mtu,
        active_mtu,
        gid_tbl_len,
        port_cap_flags,
        max_msg_sz,
        bad_pkey_cntr,
        qkey_viol_cntr,
        pkey_tbl_len,
        lid,
        sm_lid,
        lmc,
        max_vl_num,
        sm_sl,
        subnet_timeout,
        init_type_reply,
        active_width,
        active_speed,
        phys_state,
        link_layer,
        flags,
        port_cap_flags2
    );
    v.push(("sizeof(struct ibv_cq_ex)".into(), IBV_CQ_EX_SIZE));
    check!(
        "ibv_cq_ex",
        ibv_cq_ex,
        comp_mask,
        status,
        wr_id,
        start_poll,
        next_poll,
        end_poll,
        read_opcode,
        read_vendor_err,
        read_byte_len,
        read_imm_data,
        read_qp_num,
        read_src_qp,
        read_wc_flags,
        read_slid,
        read_sl,
        read_dlid_path_bits,
        read_completion_ts,
        read_cvlan,
        read_flow_tag,
        read_tm_info,
        read_completion_wallclock_ns
    );
    check!(
        "ibv_cq_init_attr_ex",
        ibv_cq_init_attr_ex,
        cqe,
        cq_context,
        channel,
        comp_vector,
        wc_flags,
        comp_mask,
        flags,
        parent_domain
    );
    check!("ibv_poll_cq_attr", ibv_poll_cq_attr, comp_mask);
    check!(
        "ibv_srq_init_attr_ex",
        ibv_srq_init_attr_ex,
        srq_context,
        attr,
        comp_mask,
        srq_type,
        pd,
        xrcd,
        cq,
        tm_cap
    );
    v.push(("IBV_SRQ_INIT_ATTR_TYPE".into(), srq_init_attr_mask::TYPE as usize));
    v.push(("IBV_SRQ_INIT_ATTR_PD".into(), srq_init_attr_mask::PD as usize));
    v.push((
        "IBV_SRQ_INIT_ATTR_RESERVED".into(),
        srq_init_attr_mask::RESERVED as usize,
    ));
    v.push(("IBV_SRQT_BASIC".into(), SRQT_BASIC as usize));
    for (name, bit) in [
        ("BYTE_LEN", wc_ex::WITH_BYTE_LEN),
        ("IMM", wc_ex::WITH_IMM),
        ("QP_NUM", wc_ex::WITH_QP_NUM),
        ("SRC_QP", wc_ex::WITH_SRC_QP),
        ("SLID", wc_ex::WITH_SLID),
        ("SL", wc_ex::WITH_SL),
        ("DLID_PATH_BITS", wc_ex::WITH_DLID_PATH_BITS),
    ] {
        v.push((format!("IBV_WC_EX_WITH_{name}"), bit as usize));
    }
    v.push(("IBV_WC_STANDARD_FLAGS".into(), wc_ex::SUPPORTED as usize));
    v.push(("IBV_CQ_INIT_ATTR_MASK_FLAGS".into(), cq_init_attr_mask::FLAGS as usize));
    v.push(("IBV_CQ_INIT_ATTR_MASK_PD".into(), cq_init_attr_mask::PD as usize));
    v.push(("sizeof(struct ibv_qp_ex)".into(), IBV_QP_EX_SIZE));
    check!(
        "ibv_qp_ex",
        ibv_qp_ex,
        qp_base,
        comp_mask,
        wr_id,
        wr_flags,
        wr_atomic_cmp_swp,
        wr_atomic_fetch_add,
        wr_bind_mw,
        wr_local_inv,
        wr_rdma_read,
        wr_rdma_write,
        wr_rdma_write_imm,
        wr_send,
        wr_send_imm,
        wr_send_inv,
        wr_send_tso,
        wr_set_ud_addr,
        wr_set_xrc_srqn,
        wr_set_inline_data,
        wr_set_inline_data_list,
        wr_set_sge,
        wr_set_sge_list,
        wr_start,
        wr_complete,
        wr_abort,
        wr_atomic_write
    );
    check!("ibv_mw", ibv_mw, context, pd, rkey, handle);
    v.push(("offsetof(struct ibv_mw, type)".into(), offset_of!(ibv_mw, type_)));
    check!("ibv_mw_bind_info", ibv_mw_bind_info, mr, addr, length, mw_access_flags);
    check!("ibv_mw_bind", ibv_mw_bind, wr_id, send_flags, bind_info);
    check!("ibv_data_buf", ibv_data_buf, addr, length);
    for (name, bit) in [
        ("RDMA_WRITE", send_ops::RDMA_WRITE),
        ("RDMA_WRITE_WITH_IMM", send_ops::RDMA_WRITE_WITH_IMM),
        ("SEND", send_ops::SEND),
        ("SEND_WITH_IMM", send_ops::SEND_WITH_IMM),
        ("RDMA_READ", send_ops::RDMA_READ),
        ("ATOMIC_CMP_AND_SWP", send_ops::ATOMIC_CMP_AND_SWP),
        ("ATOMIC_FETCH_AND_ADD", send_ops::ATOMIC_FETCH_AND_ADD),
        ("LOCAL_INV", send_ops::LOCAL_INV),
        ("BIND_MW", send_ops::BIND_MW),
        ("SEND_WITH_INV", send_ops::SEND_WITH_INV),
        ("TSO", send_ops::TSO),
        ("ATOMIC_WRITE", send_ops::ATOMIC_WRITE),
    ] {
        v.push((format!("IBV_QP_EX_WITH_{name}"), bit as usize));
    }
    v.push(("sizeof(pthread_mutex_t)".into(), size_of::<pthread_mutex_t>()));
    v.push(("sizeof(pthread_cond_t)".into(), size_of::<pthread_cond_t>()));
    v.push(("IBV_SYSFS_NAME_MAX".into(), SYSFS_NAME_MAX));
    v.push(("IBV_SYSFS_PATH_MAX".into(), SYSFS_PATH_MAX));
    v
}
