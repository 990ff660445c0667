//! The vocabulary every layer shares: transports, QP states, MTUs, address vectors, queue
//! capabilities, and device and port attributes. It imports nothing else from the crate, so
//! the provider contract, work requests and errors can all use it without import loops.

use crate::open_enum::open_enum;

/// Transport type (`enum ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum QpType {
    /// Reliable connected.
    Rc = 2,
    /// Unreliable connected.
    Uc = 3,
    /// Unreliable datagram.
    Ud = 4,
}

impl QpType {
    /// From the verbs encoding (2..=4); `None` for anything else.
    pub fn from_raw(v: u8) -> Option<Self> {
        Some(match v {
            2 => Self::Rc,
            3 => Self::Uc,
            4 => Self::Ud,
            _ => return None,
        })
    }
}

/// QP state (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum QpState {
    /// Just created, or reset.
    Reset = 0,
    /// Receives may be posted.
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue drained.
    Sqd = 4,
    /// Send queue error.
    Sqe = 5,
    /// Error: outstanding work requests are flushed.
    Err = 6,
}

impl QpState {
    /// From the verbs encoding (0..=6); `None` for anything else.
    pub fn from_raw(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Reset,
            1 => Self::Init,
            2 => Self::Rtr,
            3 => Self::Rts,
            4 => Self::Sqd,
            5 => Self::Sqe,
            6 => Self::Err,
            _ => return None,
        })
    }
}

open_enum! {
    /// What a GID addresses (`enum ib_uverbs_gid_type`): an InfiniBand port, or RoCE v1
    /// (Ethernet) or RoCE v2 (UDP/IP, the kind rxe traffic uses).
    GidType {
        IB = 0,
        ROCE_V1 = 1,
        ROCE_V2 = 2,
    }
}

open_enum! {
    /// Path migration state of a connected QP (`enum ibv_mig_state`), as MODIFY_QP and
    /// QUERY_QP carry it (one byte): whether the hardware has migrated to the alternate path
    /// or is armed to.
    MigState {
        MIGRATED = 0,
        REARM = 1,
        ARMED = 2,
    }
}

bitflags::bitflags! {
    /// Which attributes a QP modify or query names: `enum ibv_qp_attr_mask`, the same bits as
    /// the kernel's `enum ib_qp_attr_mask` that MODIFY_QP and QUERY_QP carry.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `qp_state`.
        const STATE = 1;
        /// `cur_qp_state`.
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`.
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `port_num`.
        const PORT = 1 << 5;
        /// `qkey`.
        const QKEY = 1 << 6;
        /// `ah_attr`, the primary path.
        const AV = 1 << 7;
        /// `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `timeout`.
        const TIMEOUT = 1 << 9;
        /// `retry_cnt`.
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry`.
        const RNR_RETRY = 1 << 11;
        /// `rq_psn`.
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `alt_ah_attr`, `alt_pkey_index`, `alt_port_num`, `alt_timeout`: the alternate path.
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`.
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state`.
        const PATH_MIG_STATE = 1 << 18;
        /// `cap`.
        const CAP = 1 << 19;
        /// `dest_qp_num`.
        const DEST_QPN = 1 << 20;
        /// `rate_limit`.
        const RATE_LIMIT = 1 << 25;
    }
}

impl QpAttrMask {
    /// The bits of `self` no [`crate::QpAttr`] field sets: `CAP`, `RATE_LIMIT` and bits this
    /// type does not name, which only [`crate::QpAttr::bare_mask`] sends.
    pub fn bare(self) -> Self {
        self.difference(Self::all().difference(Self::CAP | Self::RATE_LIMIT))
    }
}

bitflags::bitflags! {
    /// Which attributes an SRQ modify names: `enum ibv_srq_attr_mask`, the same bits as the
    /// kernel's `enum ib_srq_attr_mask` that MODIFY_SRQ carries.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SrqAttrMask: u32 {
        /// `max_wr`: resize.
        const MAX_WR = 1;
        /// `srq_limit`: arm the limit event.
        const LIMIT = 1 << 1;
    }
}

/// Path MTU (`enum ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// From the verbs encoding (1..=5); `None` for anything else.
    pub fn from_raw(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Mtu256,
            2 => Self::Mtu512,
            3 => Self::Mtu1024,
            4 => Self::Mtu2048,
            5 => Self::Mtu4096,
            _ => return None,
        })
    }

    /// Bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// The global routing header of an address (always present on RoCE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GlobalRoute {
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Index of the local GID to send from.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
}

/// An address vector (`struct ibv_ah_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AhAttr {
    /// Local port.
    pub port_num: u8,
    /// Destination LID (InfiniBand).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Global route; required on RoCE.
    pub grh: Option<GlobalRoute>,
}

impl AhAttr {
    /// The RoCE address of `dgid`, reached from local GID `sgid_index` on `port_num`: hop
    /// limit 64, traffic class 0, flow label 0, service level 0, static rate 0 (the port's);
    /// change the fields for others.
    pub fn roce(port_num: u8, dgid: [u8; 16], sgid_index: u8) -> Self {
        Self {
            port_num,
            grh: Some(GlobalRoute {
                dgid,
                sgid_index,
                hop_limit: 64,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// Queue sizes of a QP (`struct ibv_qp_cap`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive request.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send request.
    pub max_inline_data: u32,
}

open_enum! {
    /// Port state (`enum ibv_port_state`).
    PortState {
        NOP = 0,
        DOWN = 1,
        INIT = 2,
        ARMED = 3,
        ACTIVE = 4,
        ACTIVE_DEFER = 5,
    }
}

open_enum! {
    /// Link layer of a port (`IBV_LINK_LAYER_*`).
    LinkLayer {
        UNSPECIFIED = 0,
        INFINIBAND = 1,
        ETHERNET = 2,
    }
}

open_enum! {
    /// Active link width (`IB_WIDTH_*`): lanes per link.
    LinkWidth {
        X1 = 1,
        X4 = 2,
        X8 = 4,
        X12 = 8,
        X2 = 16,
    }
}

impl LinkWidth {
    /// Lanes, if the value is a known width.
    pub fn lanes(self) -> Option<u32> {
        Some(match self {
            Self::X1 => 1,
            Self::X2 => 2,
            Self::X4 => 4,
            Self::X8 => 8,
            Self::X12 => 12,
            _ => return None,
        })
    }
}

open_enum! {
    /// Active lane speed (`IB_SPEED_*`).
    LinkSpeed {
        SDR = 1,
        DDR = 2,
        QDR = 4,
        FDR10 = 8,
        FDR = 16,
        EDR = 32,
        HDR = 64,
        NDR = 128,
        XDR = 256,
    }
}

impl LinkSpeed {
    /// Signalling rate of one lane in Mb/s, if the value is a known speed.
    pub fn lane_mbps(self) -> Option<u32> {
        Some(match self {
            Self::SDR => 2_500,
            Self::DDR => 5_000,
            Self::QDR => 10_000,
            Self::FDR10 => 10_312,
            Self::FDR => 14_062,
            Self::EDR => 25_781,
            Self::HDR => 53_125,
            Self::NDR => 106_250,
            Self::XDR => 212_500,
            _ => return None,
        })
    }
}

open_enum! {
    /// Atomic operation support (`enum ibv_atomic_cap`).
    AtomicCap {
        NONE = 0,
        HCA = 1,
        GLOB = 2,
    }
}

open_enum! {
    /// The transport a device speaks (`enum ibv_transport_type`, from its sysfs node type).
    Transport {
        IB = 0,
        IWARP = 1,
        USNIC = 2,
        USNIC_UDP = 3,
        UNSPECIFIED = 4,
    }
}

impl Transport {
    /// From the node type sysfs reports (`node_type`, e.g. `1: CA`), as libibverbs maps it.
    pub(crate) fn from_node_type(node_type: u32) -> Self {
        match node_type {
            1..=3 => Self::IB,
            4 => Self::IWARP,
            6 => Self::USNIC,
            7 => Self::USNIC_UDP,
            _ => Self::UNSPECIFIED,
        }
    }
}

/// Device attributes (QUERY_DEVICE; C `struct ibv_device_attr`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Firmware version, as the driver encodes it.
    pub fw_ver: u64,
    /// Node GUID (host byte order).
    pub node_guid: u64,
    /// System image GUID (host byte order).
    pub sys_image_guid: u64,
    /// Largest memory region, in bytes.
    pub max_mr_size: u64,
    /// Page sizes the device supports (bit n: 2^n bytes).
    pub page_size_cap: u64,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Vendor's part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// QPs.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// `IBV_DEVICE_*` capability flags.
    pub device_cap_flags: u32,
    /// Scatter/gather entries per send or receive request.
    pub max_sge: u32,
    /// Scatter/gather entries per RDMA read.
    pub max_sge_rd: u32,
    /// CQs.
    pub max_cq: u32,
    /// Entries per CQ.
    pub max_cqe: u32,
    /// Memory regions.
    pub max_mr: u32,
    /// Protection domains.
    pub max_pd: u32,
    /// Outstanding RDMA reads and atomics per QP as target.
    pub max_qp_rd_atom: u32,
    /// Outstanding RDMA reads and atomics per EE context as target.
    pub max_ee_rd_atom: u32,
    /// Resources for incoming RDMA reads and atomics.
    pub max_res_rd_atom: u32,
    /// Outstanding RDMA reads and atomics per QP as initiator.
    pub max_qp_init_rd_atom: u32,
    /// Outstanding RDMA reads and atomics per EE context as initiator.
    pub max_ee_init_rd_atom: u32,
    /// Atomic operation support.
    pub atomic_cap: AtomicCap,
    /// EE contexts.
    pub max_ee: u32,
    /// Reliable datagram domains.
    pub max_rdd: u32,
    /// Memory windows.
    pub max_mw: u32,
    /// Raw IPv6 datagram QPs.
    pub max_raw_ipv6_qp: u32,
    /// Raw Ethertype datagram QPs.
    pub max_raw_ethy_qp: u32,
    /// Multicast groups.
    pub max_mcast_grp: u32,
    /// QPs per multicast group.
    pub max_mcast_qp_attach: u32,
    /// QPs attached to multicast groups in all.
    pub max_total_mcast_qp_attach: u32,
    /// Address handles.
    pub max_ah: u32,
    /// Fast memory regions.
    pub max_fmr: u32,
    /// Remaps per fast memory region.
    pub max_map_per_fmr: u32,
    /// Shared receive queues.
    pub max_srq: u32,
    /// Work requests per SRQ.
    pub max_srq_wr: u32,
    /// Scatter/gather entries per SRQ request.
    pub max_srq_sge: u32,
    /// Partition keys per port.
    pub max_pkeys: u16,
    /// Local CA ack delay (4.096 µs × 2^value).
    pub local_ca_ack_delay: u8,
    /// Physical ports.
    pub phys_port_cnt: u8,
}

/// Extended device attributes (the extended QUERY_DEVICE; C `struct ibv_device_attr_ex`, the
/// part the kernel reports for every device).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DeviceAttrEx {
    /// The base attributes, as [`crate::Context::query_device`] reports them.
    pub attr: DeviceAttr,
    /// All 64 bits of the device's `IB_UVERBS_DEVICE_*` capability flags: the low 32 are
    /// [`DeviceAttr::device_cap_flags`]; the kernel reports the upper ones only here (Linux
    /// 6.12's rxe sets `FLUSH_GLOBAL`, `FLUSH_PERSISTENT` and `ATOMIC_WRITE`, bits 38 to 40).
    pub device_cap_flags_ex: u64,
    /// Bits of a completion timestamp the device fills in (0: none).
    pub completion_timestamp_mask: u64,
    /// The device clock's frequency in kHz (0: not reported).
    pub hca_core_clock: u64,
}

/// Port attributes (QUERY_PORT; C `struct ibv_port_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest MTU the port supports (`None`: a value this crate does not know).
    pub max_mtu: Option<Mtu>,
    /// MTU in use.
    pub active_mtu: Option<Mtu>,
    /// GID table entries.
    pub gid_tbl_len: u32,
    /// `IBV_PORT_*` capability flags.
    pub port_cap_flags: u32,
    /// Largest message, in bytes.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table entries.
    pub pkey_tbl_len: u16,
    /// Base LID (InfiniBand).
    pub lid: u16,
    /// Subnet manager's LID.
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Virtual lanes.
    pub max_vl_num: u8,
    /// Subnet manager's service level.
    pub sm_sl: u8,
    /// Subnet propagation delay.
    pub subnet_timeout: u8,
    /// Type of initialisation the SM did.
    pub init_type_reply: u8,
    /// Active link width.
    pub active_width: LinkWidth,
    /// Active lane speed.
    pub active_speed: LinkSpeed,
    /// Physical port state (`IB_PORT_PHYS_STATE_*`; 5 is link up).
    pub phys_state: u8,
    /// Link layer: InfiniBand, or Ethernet for RoCE.
    pub link_layer: LinkLayer,
    /// `IB_UVERBS_QPF_GRH_REQUIRED` and friends.
    pub flags: u8,
    /// `IBV_PORT_*2` capability flags.
    pub port_cap_flags2: u16,
}

impl PortAttr {
    /// Whether traffic on this port needs a global route (RoCE).
    pub fn needs_grh(&self) -> bool {
        self.link_layer == LinkLayer::ETHERNET
    }
}
