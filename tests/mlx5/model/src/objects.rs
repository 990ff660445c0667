//! The objects a context owns, as the kernel and the device both see them.

use crate::mem::Memory;
use std::sync::Arc;

/// Where the model delivers events: the writing end of a completion channel or of the async
/// event fd.
pub trait EventSink: Send + Sync {
    /// Queues one event record (8 or 16 bytes) for the client's `read()`.
    fn push(&self, record: &[u8]);
}

/// A protection domain.
#[derive(Debug)]
pub struct Pd {
    pub ctx: i32,
    pub users: u32,
}

/// A registered memory region: `[addr, addr + length)` of the client, named by `iova`.
#[derive(Debug, Clone)]
pub struct Mr {
    pub ctx: i32,
    pub pd: u32,
    pub addr: u64,
    pub length: u64,
    pub iova: u64,
    pub access: u32,
    pub key: u32,
    /// For a dma-buf region (ioctl REG_DMABUF_MR): the exporter's pages the model mapped,
    /// which `addr` points into. Such a region pins no user pages.
    pub dmabuf: Option<std::sync::Arc<DmabufMap>>,
}

/// The pages of a dma-buf a region maps, unmapped when the last region using them goes. The
/// model stands in for the exporter: the "dma-buf" is a memfd, which the host maps shared
/// (Debian's 6.1 has no `CONFIG_UDMABUF`, so no real dma-buf can be made from user memory).
#[derive(Debug)]
pub struct DmabufMap {
    /// Where the whole buffer is mapped in this process.
    pub addr: u64,
    /// The buffer's size (`dmabuf->size`).
    pub len: u64,
    /// Unmaps `(addr, len)`.
    pub unmap: fn(u64, u64),
}

impl Drop for DmabufMap {
    fn drop(&mut self) {
        (self.unmap)(self.addr, self.len);
    }
}

/// A pending arm request read from the CQ doorbell (record or UAR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arm {
    pub solicited_only: bool,
    pub ci: u32,
    /// The doorbell value (`sn << 28 | cmd | ci`) that armed it.
    pub value: u32,
}

/// A completion queue in user memory.
pub struct Cq {
    pub ctx: i32,
    pub cqn: u32,
    pub user_handle: u64,
    pub buf: u64,
    /// Entries in the ring, a power of two.
    pub ncqe: u32,
    pub cqe_size: u32,
    pub db: u64,
    /// CQEs written so far (24-bit counter as the hardware's producer index).
    pub pi: u32,
    pub channel: Option<Arc<dyn EventSink>>,
    pub arm: Option<Arm>,
    /// The arm value of the last event raised (an arm seen again with it is a duplicate).
    pub fired: Option<u32>,
    /// The arm doorbell record as last seen.
    pub last_arm_db: u32,
    pub comp_events: u32,
    pub async_events: u32,
    /// Overrun seen: the CQ is in error and writes nothing more.
    pub error: bool,
    pub users: u32,
}

impl Cq {
    /// Switches to a new buffer (RESIZE_CQ): the device writes a RESIZE CQE in the old one at
    /// the producer index (libmlx5 copies the CQEs before it and continues in the new buffer).
    pub fn resize(&mut self, buf: u64, ncqe: u32, cqe_size: u32, mem: &dyn Memory) {
        let slot = u64::from(self.pi & (self.ncqe - 1));
        let addr = self.buf + slot * u64::from(self.cqe_size) + u64::from(self.cqe_size - 64);
        let owner = u8::from(self.pi & self.ncqe != 0);
        let mut cqe = [0u8; 64];
        cqe[63] = (5 << 4) | owner;
        let _ = mem
            .write(addr, &cqe[..63])
            .and_then(|()| mem.write(addr + 63, &cqe[63..]));
        self.pi = (self.pi + 1) & 0xff_ffff;
        self.buf = buf;
        self.ncqe = ncqe;
        self.cqe_size = cqe_size;
    }
}

/// A queue pair's connection attributes, from MODIFY_QP.
#[derive(Debug, Default, Clone)]
pub struct QpAttrs {
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub access: u32,
    pub pkey_index: u16,
    pub port_num: u8,
    pub path_mtu: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    /// `enum ib_mig_state` (0, MIGRATED, until a modify names another).
    pub path_mig_state: u8,
    pub dest: crate::abi::QpDest,
    /// On Ethernet: the destination MAC MODIFY_QP resolved from the path's DGID.
    pub dmac: [u8; 6],
    /// On RoCE v2: the path's UDP source port.
    pub udp_sport: u16,
    /// The PSN of the next request the send queue sends (from `sq_psn`).
    pub next_psn: u32,
    /// The PSN the receive side expects next (from `rq_psn`).
    pub epsn: u32,
}

/// Why the send queue waits before retrying its head WQE.
#[derive(Debug, Clone, Copy)]
pub struct Stall {
    pub until: std::time::Instant,
    pub rnr_left: u8,
    pub retry_left: u8,
}

/// A queue pair whose rings live in user memory.
pub struct Qp {
    pub ctx: i32,
    /// The legacy bfreg the kernel chose for it (released on destroy).
    pub bfregn: Option<u32>,
    /// The device's view of its doorbells (`device/bfcheck.rs`).
    pub bf: BfWatch,
    pub qpn: u32,
    pub qp_type: u8,
    pub pd: u32,
    pub send_cq: u32,
    pub recv_cq: u32,
    /// The SRQ its receives come from (then it has no receive queue of its own).
    pub srq: Option<u32>,
    pub user_handle: u64,
    pub uidx: u32,
    pub buf: u64,
    pub rq_cnt: u32,
    pub rq_shift: u32,
    pub sq_cnt: u32,
    pub db: u64,
    pub state: u8,
    pub attrs: QpAttrs,
    pub sq_sig_all: bool,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline: u32,
    /// Send WQE basic blocks consumed (16-bit, as `dbrec[SND]`).
    pub sq_ci: u16,
    /// Receive WQEs consumed (16-bit, as `dbrec[RCV]`).
    pub rq_ci: u16,
    pub stall: Option<Stall>,
    pub async_events: u32,
    /// Counts the moves that end the requests in flight (to ERR or RESET): a request taken
    /// before one never completes after it, as on a device, whatever the ring positions say.
    pub epoch: u32,
}

impl Qp {
    /// Address of the send queue.
    pub fn sq_base(&self) -> u64 {
        self.buf.wrapping_add(u64::from(self.rq_cnt) << self.rq_shift)
    }
}

/// A shared receive queue in user memory: WQEs linked through `next_wqe_index`, a doorbell
/// record counting the WQEs posted.
#[derive(Debug)]
pub struct Srq {
    pub ctx: i32,
    pub srqn: u32,
    pub pd: u32,
    pub user_handle: u64,
    pub buf: u64,
    /// WQEs in the ring, a power of two.
    pub max: u32,
    /// log2 of the WQE stride.
    pub wqe_shift: u32,
    /// Scatter entries the user asked for (QUERY_SRQ's `max_sge`).
    pub max_gs: u32,
    pub db: u64,
    /// The WQE the device takes next (it follows each taken WQE's `next_wqe_index`).
    pub head: u16,
    /// WQEs taken (16-bit, as the doorbell record's counter).
    pub taken: u16,
    /// The armed limit (`lwm`); 0 when not armed.
    pub limit: u32,
    /// The doorbell record claimed more WQEs than the ring holds: SRQ_ERR was raised and
    /// nothing more is taken.
    pub error: bool,
    /// QPs attached.
    pub users: u32,
    pub async_events: u32,
}

/// A dynamically allocated UAR page (`MLX5_IB_OBJECT_UAR`).
/// An address handle: the kernel keeps only what CREATE_AH gave it (an mlx5 user AH lives
/// in user space; the kernel object pins its PD).
#[derive(Debug)]
pub struct Ah {
    pub ctx: i32,
    pub pd: u32,
    pub attr: crate::abi::AhAttr,
}

#[derive(Debug)]
pub struct Uar {
    pub ctx: i32,
    pub pgoff: u64,
    pub page_id: u32,
}

/// A table of objects named by small integer handles.
pub struct Table<T> {
    slots: Vec<Option<T>>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self { slots: Vec::new() }
    }
}

impl<T> Table<T> {
    /// Stores `value` in the lowest free slot; returns its handle.
    pub fn insert(&mut self, value: T) -> u32 {
        let at = self.slots.iter().position(Option::is_none).unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        self.slots[at] = Some(value);
        u32::try_from(at).unwrap_or(u32::MAX)
    }
    pub fn get(&self, handle: u32) -> Option<&T> {
        self.slots.get(handle as usize).and_then(Option::as_ref)
    }
    pub fn get_mut(&mut self, handle: u32) -> Option<&mut T> {
        self.slots.get_mut(handle as usize).and_then(Option::as_mut)
    }
    pub fn remove(&mut self, handle: u32) -> Option<T> {
        self.slots.get_mut(handle as usize).and_then(Option::take)
    }
    /// Handles in use.
    pub fn handles(&self) -> Vec<u32> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].is_some())
            .map(|i| i as u32)
            .collect()
    }
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|v| (i as u32, v)))
    }
}

/// A rule the device saw broken; `Model::violations` keeps them for the tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// A QP's doorbell or copy on a bfreg that is not the one its CREATE_QP gave it.
    ForeignBfreg { qpn: u32, own: u32, found: u32 },
    /// A BlueFlame copy that differs from the WQE it names, from byte `at`.
    TornCopy {
        qpn: u32,
        wqe_index: u16,
        bfreg: u32,
        at: usize,
    },
    /// `posts` doorbells on a bfreg since the last quiescent check, but its two halves do not
    /// hold the last two of them: two went to the same half (the toggle raced).
    NotAlternated { bfreg: u32, posts: usize },
}

impl Violation {
    /// The reason, as tests and the log name it.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ForeignBfreg { .. } => "doorbell on another QP's bfreg",
            Self::TornCopy { .. } => "torn BlueFlame copy",
            Self::NotAlternated { .. } => "bfreg halves not alternated",
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ForeignBfreg { qpn, own, found } => {
                write!(f, "{}: QP {qpn:#x} (bfreg {own}) rang bfreg {found}", self.reason())
            }
            Self::TornCopy {
                qpn,
                wqe_index,
                bfreg,
                at,
            } => write!(
                f,
                "{}: QP {qpn:#x} WQE {wqe_index} on bfreg {bfreg} differs from the ring at byte {at}",
                self.reason()
            ),
            Self::NotAlternated { bfreg, posts } => write!(
                f,
                "{}: {posts} doorbells on bfreg {bfreg}, its halves do not hold two of them",
                self.reason()
            ),
        }
    }
}

/// A QP's last post as the device saw its doorbell record move.
#[derive(Debug, Clone, Default)]
pub struct BfWatch {
    /// The send doorbell record last seen.
    pub(crate) seen: u16,
    /// The last WQE of the post seen last: its first 8 bytes as stored, and its bytes when
    /// the post was one request both providers copy.
    pub(crate) last: Option<(u64, Option<Vec<u8>>)>,
}
