//! The fake uverbs kernel with the mlx5 driver: framed `write()` commands and the
//! `RDMA_VERBS_IOCTL` methods the model answers, validated as Linux 6.1 does.
//!
//! Citations name the Linux 6.1 source line (`hw/mlx5/main.c:2054`, paths under
//! `drivers/infiniband/` of Debian 12's `linux-source-6.1`, 6.1.192) and function whose check
//! a rule models.
//! Every handler decodes bytes it copied from the client with safe code; only [`Memory`]
//! touches client memory.

use crate::abi::{self, cmd};
use crate::mem::Memory;
use crate::objects::{Ah, Cq, EventSink, Mr, Pd, Qp, Srq, Table, Uar};
use libc::{EFAULT, EINVAL, ENOSPC, EOPNOTSUPP};
use std::collections::HashMap;
use std::sync::Arc;
use zerocopy::FromBytes;

mod ah;
mod context;
mod cq;
mod ioctl;
mod mmap;
mod qp;
mod srq;

pub use qp::modify_is_ok;

/// A positive errno value.
pub type Errno = i32;

/// What the kernel needs from the host process: new event fds.
pub trait Host {
    /// Creates an event file: returns the fd given to the client and where events go.
    fn event_fd(&self) -> Result<(i32, Arc<dyn EventSink>), Errno>;
    /// Closes an event fd the command created before it failed.
    fn close_fd(&self, fd: i32);
    /// The caller's RLIMIT_MEMLOCK in pages as `ib_umem_get` applies it, or `None` when the
    /// caller may pin without limit (`capable(CAP_IPC_LOCK)`, or RLIM_INFINITY).
    fn memlock_pages(&self) -> Option<u64>;
    /// `dma_buf_get(fd)` and a mapping of the buffer's pages, for REG_DMABUF_MR: the model
    /// stands in for the exporter, with a memfd as the dma-buf. An fd that is not open is
    /// EBADF; one that is not a memfd is EINVAL (`dma_buf_get`'s answer for a file that is no
    /// dma-buf).
    fn map_dmabuf(&self, fd: i32) -> Result<crate::objects::DmabufMap, Errno>;
}

/// The model's device limits (a ConnectX-5 without write combining, DEVX or CQE compression).
pub mod caps {
    pub const LOG_MAX_QP_SZ: u32 = 15;
    pub const LOG_MAX_SRQ_SZ: u32 = 15;
    /// `max_wqe_sz_rq`: the largest receive WQE, in bytes.
    pub const MAX_WQE_SZ_RQ: u32 = 512;
    pub const LOG_MAX_CQ_SZ: u32 = 22;
    pub const MAX_BFREGS: u32 = 512 * 2;
    pub const NUM_COMP_VECTORS: u32 = 4;
    pub const MAX_SGE: u32 = 30;
    pub const MAX_RD_ATOMIC: u8 = 16;
    pub const PKEY_TABLE_LEN: u16 = 128;
    pub const VENDOR_ID: u32 = 0x02c9;
    pub const VENDOR_PART_ID: u32 = 4119;
    pub const FW_VER: u64 = (16 << 32) | (35 << 16) | 1012;
    /// The device reports no clock frequency, so the kernel makes no clock info page
    /// (net/ethernet/mellanox/mlx5/core/lib/clock.c:977 `mlx5_init_clock` stops; the model
    /// does not model QUERY_DEVICE_EX, where the frequency would show). The internal timer
    /// page is still mapped (hw/mlx5/main.c:2327).
    pub const DEVICE_FREQUENCY_KHZ: u32 = 0;
    pub const HAS_CLOCK_INFO: bool = DEVICE_FREQUENCY_KHZ != 0;
}

/// How a client maps a page of the device file: the `PROT_*` and `MAP_*` bits the kernel
/// checks (`VM_WRITE`, `VM_EXEC`, `VM_SHARED`).
#[derive(Clone, Copy, Debug)]
pub struct MapAccess {
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
}

/// What an accepted `mmap` of the device file maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// A UAR page (doorbells; the device watches it).
    Uar,
    /// The read-only page holding the device's internal timer at
    /// `abi::INTERNAL_TIMER_OFFSET % PAGE_SIZE`.
    CoreClock,
}

/// One opened device file and its ucontext.
#[derive(Default)]
pub struct Context {
    /// GET_CONTEXT ran.
    pub alive: bool,
    pub cqe_version: u8,
    pub lib_uar_dyn: bool,
    /// Static UAR pages (legacy mode).
    pub static_uar_pages: u64,
    /// Legacy mode: QPs using each bfreg (`bfregi->count`, indexed by the bfreg number
    /// without the fast-path ones), and how many of them are low-latency.
    pub bfreg_count: Vec<u32>,
    pub num_low_latency_bfregs: u32,
    /// The request was v2 (`bfregi->ver`); v0 gets bfreg 0 only.
    pub ucontext_v2: bool,
    pub async_sink: Option<Arc<dyn EventSink>>,
    /// The client's end of the async event fd (the first one: events go there).
    pub async_fd: Option<i32>,
    /// Every async event fd of the context (ioctl ASYNC_EVENT_ALLOC may make more than one).
    pub async_fds: Vec<i32>,
    /// Addresses of the UAR pages mapped for this context (the device watches their CQ
    /// doorbell word).
    pub uar_maps: Vec<u64>,
    /// The static (legacy) UAR pages mapped, as (index, address): where the bfregs are.
    pub static_uars: Vec<(u64, u64)>,
}

/// The whole fake kernel and device of one process.
pub struct Model {
    pub lid: u16,
    pub node_guid: u64,
    /// The port: link layer, addresses, GID table, neighbours.
    pub port: crate::port::Port,
    /// Packets the device dropped, by reason.
    pub drops: crate::port::Drops,
    pub contexts: HashMap<i32, Context>,
    pub pds: Table<Pd>,
    pub mrs: Table<Mr>,
    pub cqs: Table<Cq>,
    pub qps: Table<Qp>,
    pub srqs: Table<Srq>,
    pub ahs: Table<Ah>,
    pub uars: Table<Uar>,
    pub channels: HashMap<i32, (i32, Arc<dyn EventSink>)>,
    /// Core clock pages mapped: `(client address, the model's writable view of the page)`.
    /// They outlive the device file, as mappings do.
    pub clock_pages: Vec<(u64, u64)>,
    next_qpn: u32,
    next_cqn: u32,
    next_srqn: u32,
    next_key: u32,
    next_uar_page: u32,
    /// Pages pinned by registered MRs (the process's `mm->pinned_vm`; the CQ and QP buffers
    /// and doorbell pages 6.1 also pins are not counted).
    pinned_pages: u64,
    /// What the device saw a client do that a device would not accept (`device/bfcheck.rs`),
    /// in order; `uverbs_mlx5_model_violations` reports them.
    pub violations: Vec<crate::objects::Violation>,
    /// By (context, bfreg): the doorbells the device saw on it since the last quiescent check
    /// (`device/bfcheck.rs`), and whether it saw each post on its own.
    pub bf_posts: HashMap<(i32, u32), (Vec<u64>, bool)>,
    /// BlueFlame copies the device compared with their WQE and found whole.
    pub bf_copies_checked: u64,
}

/// The parts of a decoded command: a write() command, or an ioctl method turned into the
/// write form's core request so both run the same handler.
pub(crate) struct Call<'a> {
    pub(crate) ctx: i32,
    pub(crate) req: &'a [u8],
    pub(crate) response: u64,
    /// Driver request bytes (`udata.inbuf`), copied in.
    pub(crate) udata_in: Vec<u8>,
    /// Address the kernel writes driver response bytes to (0 when `outlen` is 0: the kernel
    /// passes NULL then, core/uverbs.h:67 `ib_uverbs_init_udata_buf_or_null`).
    pub(crate) udata_out: u64,
    pub(crate) udata_outlen: usize,
    /// For an ioctl method: the write form's core response lands here, and the ioctl layer
    /// copies its fields to the method's output attributes.
    pub(crate) core_out: Option<std::cell::RefCell<Vec<u8>>>,
}

impl Call<'_> {
    /// Writes the core response: to the client's response buffer (write()), or keeps it for
    /// the ioctl layer.
    pub(crate) fn respond_core(&self, mem: &dyn Memory, bytes: &[u8]) -> Result<(), Errno> {
        match &self.core_out {
            Some(out) => {
                *out.borrow_mut() = bytes.to_vec();
                Ok(())
            }
            None => mem.write(self.response, bytes).map_err(|_| EFAULT),
        }
    }
}

pub(crate) fn decode<T: FromBytes>(bytes: &[u8]) -> T {
    // Callers pass at least size_of::<T>() bytes (checked against the method's req_size).
    T::read_from_prefix(bytes)
        .map(|(v, _)| v)
        .unwrap_or_else(|_| T::new_zeroed())
}

/// `(req_size, resp_size)` of the write methods the model has (core/uverbs_cmd.c:3744
/// `uverbs_def_write_intf`); `None` for commands the mlx5 device does not enable or the model
/// does not have.
fn write_method(command: u32) -> Option<(usize, usize)> {
    Some(match command {
        cmd::GET_CONTEXT | cmd::ALLOC_PD | cmd::CREATE_COMP_CHANNEL => {
            (8, if command == cmd::GET_CONTEXT { 8 } else { 4 })
        }
        cmd::QUERY_DEVICE => (8, 176),
        cmd::QUERY_PORT => (16, 40),
        cmd::DEALLOC_PD | cmd::DEREG_MR | cmd::DESTROY_AH => (4, 0),
        cmd::CREATE_AH => (56, 4),
        cmd::REG_MR => (40, 12),
        cmd::CREATE_CQ => (32, 8),
        cmd::RESIZE_CQ => (16, 8),
        cmd::DESTROY_CQ => (16, 8),
        cmd::CREATE_QP => (56, 32),
        cmd::QUERY_QP => (16, 128),
        cmd::MODIFY_QP => (112, 0),
        cmd::DESTROY_QP => (16, 4),
        cmd::CREATE_SRQ => (32, 16),
        cmd::MODIFY_SRQ => (16, 0),
        cmd::QUERY_SRQ => (16, 16),
        cmd::DESTROY_SRQ => (16, 4),
        _ => return None,
    })
}

impl Model {
    /// A model whose port has `lid`, on the link layer `UVERBS_MLX5_MODEL_LINK` names.
    pub fn new(lid: u16) -> Self {
        Self::with_link(lid, crate::port::LinkLayer::from_env())
    }

    /// A model whose port has `lid`, on `link`.
    pub fn with_link(lid: u16, link: crate::port::LinkLayer) -> Self {
        Self {
            lid,
            node_guid: 0x0002_c903_0000_0001,
            port: crate::port::Port::new(lid, link),
            drops: crate::port::Drops::default(),
            contexts: HashMap::new(),
            pds: Table::default(),
            mrs: Table::default(),
            cqs: Table::default(),
            qps: Table::default(),
            srqs: Table::default(),
            ahs: Table::default(),
            uars: Table::default(),
            channels: HashMap::new(),
            clock_pages: Vec::new(),
            next_qpn: u32::from(lid) << 8,
            next_cqn: 1,
            next_srqn: 1,
            next_key: 0,
            next_uar_page: 16,
            pinned_pages: 0,
            violations: Vec::new(),
            bf_copies_checked: 0,
            bf_posts: HashMap::new(),
        }
    }

    /// A device file was opened as `fd`.
    pub fn open(&mut self, fd: i32) {
        self.contexts.insert(fd, Context::default());
    }

    /// The device file `fd` was closed: everything its context owned goes
    /// (core/rdma_core.c:924 `uverbs_destroy_ufile_hw`).
    pub fn close(&mut self, fd: i32) {
        if self.contexts.remove(&fd).is_none() {
            return;
        }
        for h in self.qps.handles() {
            if self.qps.get(h).is_some_and(|q| q.ctx == fd) {
                self.qps.remove(h);
            }
        }
        for h in self.srqs.handles() {
            if self.srqs.get(h).is_some_and(|s| s.ctx == fd) {
                self.srqs.remove(h);
            }
        }
        for h in self.cqs.handles() {
            if self.cqs.get(h).is_some_and(|c| c.ctx == fd) {
                self.cqs.remove(h);
            }
        }
        for h in self.ahs.handles() {
            if self.ahs.get(h).is_some_and(|a| a.ctx == fd) {
                self.ahs.remove(h);
            }
        }
        for h in self.mrs.handles() {
            if self.mrs.get(h).is_some_and(|m| m.ctx == fd) {
                self.drop_mr(h);
            }
        }
        for h in self.pds.handles() {
            if self.pds.get(h).is_some_and(|p| p.ctx == fd) {
                self.pds.remove(h);
            }
        }
        for h in self.uars.handles() {
            if self.uars.get(h).is_some_and(|u| u.ctx == fd) {
                self.uars.remove(h);
            }
        }
        self.channels.retain(|_, (ctx, _)| *ctx != fd);
    }

    /// An fd the client closed: forget it if it was a completion channel.
    pub fn fd_closed(&mut self, fd: i32) {
        self.channels.remove(&fd);
    }

    /// The client read `bytes` from event fd `fd`: count the events per object, as the
    /// kernel does when an event is read (core/uverbs_main.c:214 `ib_uverbs_event_read`), for the
    /// DESTROY_CQ/QP responses libibverbs waits on.
    pub fn events_read(&mut self, fd: i32, bytes: &[u8]) {
        if let Some(&(ctx, _)) = self.channels.get(&fd) {
            for rec in bytes.chunks_exact(8) {
                let handle = u64::from_ne_bytes(rec.try_into().unwrap_or_default());
                for h in self.cqs.handles() {
                    if let Some(cq) = self.cqs.get_mut(h).filter(|c| c.ctx == ctx && c.user_handle == handle) {
                        cq.comp_events += 1;
                        break;
                    }
                }
            }
            return;
        }
        let Some((&ctx, _)) = self.contexts.iter().find(|(_, c)| c.async_fd == Some(fd)) else {
            return;
        };
        for rec in bytes.chunks_exact(16) {
            let ev: abi::AsyncEventDesc = decode(rec);
            if ev.event_type == abi::event::CQ_ERR {
                let cq = self
                    .cqs
                    .iter()
                    .find(|(_, c)| c.ctx == ctx && c.user_handle == ev.element)
                    .map(|(h, _)| h);
                if let Some(cq) = cq.and_then(|h| self.cqs.get_mut(h)) {
                    cq.async_events += 1;
                }
            } else if matches!(ev.event_type, abi::event::SRQ_ERR | abi::event::SRQ_LIMIT_REACHED) {
                let srq = self
                    .srqs
                    .iter()
                    .find(|(_, s)| s.ctx == ctx && s.user_handle == ev.element)
                    .map(|(h, _)| h);
                if let Some(srq) = srq.and_then(|h| self.srqs.get_mut(h)) {
                    srq.async_events += 1;
                }
            } else {
                let qp = self
                    .qps
                    .iter()
                    .find(|(_, q)| q.ctx == ctx && q.user_handle == ev.element)
                    .map(|(h, _)| h);
                if let Some(qp) = qp.and_then(|h| self.qps.get_mut(h)) {
                    qp.async_events += 1;
                }
            }
        }
    }

    /// `write(fd, buf, count)` on the device file (core/uverbs_main.c:559 `ib_uverbs_write`).
    pub fn write(&mut self, ctx: i32, buf: u64, count: usize, mem: &dyn Memory, host: &dyn Host) -> Result<(), Errno> {
        // core/uverbs_main.c:577 ib_uverbs_write: `if (count < sizeof(hdr)) return -EINVAL;`
        if count < 8 {
            return Err(EINVAL);
        }
        let mut hdr_bytes = [0u8; 8];
        mem.read(buf, &mut hdr_bytes).map_err(|_| EFAULT)?;
        let hdr: abi::CmdHdr = decode(&hdr_bytes);
        // core/rdma_core.h:172 uapi_get_method: bits outside EXTENDED|COMMAND_MASK are EINVAL.
        if hdr.command & !(cmd::FLAG_EXTENDED | cmd::COMMAND_MASK) != 0 {
            return Err(EINVAL);
        }
        // Extended commands (QUERY_DEVICE_EX, CREATE_CQ_EX, ...) are not modelled: the
        // libraries fall back to the plain commands on EOPNOTSUPP.
        if hdr.command & cmd::FLAG_EXTENDED != 0 {
            crate::log!("write ex cmd {} not modelled", hdr.command & cmd::COMMAND_MASK);
            return Err(EOPNOTSUPP);
        }
        let command = hdr.command;
        // core/rdma_core.h:182-183 uapi_get_method: a command beyond the table (the last
        // declared write method, OPEN_QP) is EOPNOTSUPP. One in the table that the device does
        // not enable (mlx5 keeps core/device.c:623-652's default uverbs_cmd_mask: no
        // POST_SEND, POST_RECV, POLL_CQ, REQ_NOTIFY_CQ) is the `notsupp` method
        // (core/uverbs_uapi.c:11-14, :453-454), sizes 0, so verify_hdr's in_words check comes
        // first (core/uverbs_main.c:535, EINVAL). Commands the model does not model answer the
        // same way.
        let Some((req_size, resp_size)) = write_method(command) else {
            crate::log!("write cmd {command} not modelled");
            if command <= cmd::OPEN_QP && usize::from(hdr.in_words) * 4 != count {
                return Err(EINVAL);
            }
            return Err(EOPNOTSUPP);
        };
        // core/uverbs_main.c:535-536, :538-551, :553-554 verify_hdr: in_words covers the
        // whole write (EINVAL), the request fits and out_words covers the core response
        // (ENOSPC).
        if usize::from(hdr.in_words) * 4 != count {
            return Err(EINVAL);
        }
        // core/uverbs_main.c:546 verify_hdr: rdma-core v18 and v19 wrote DESTROY_CQ as 16
        // bytes; the kernel reads it as 24 (the 8 bytes after the write, from the same buffer).
        let count = if command == cmd::DESTROY_CQ && count == 16 {
            24
        } else {
            count
        };
        if count < req_size + 8 {
            return Err(ENOSPC);
        }
        if usize::from(hdr.out_words) * 4 < resp_size {
            return Err(ENOSPC);
        }
        let mut body = vec![0u8; count - 8];
        mem.read(buf + 8, &mut body).map_err(|_| EFAULT)?;
        let (req, udata_in) = body.split_at(req_size);
        let response = if resp_size > 0 || command == cmd::MODIFY_QP {
            u64::from_ne_bytes(req[..8].try_into().unwrap_or_default())
        } else {
            0
        };
        let outlen = usize::from(hdr.out_words) * 4 - resp_size;
        let call = Call {
            ctx,
            req,
            response,
            udata_in: udata_in.to_vec(),
            udata_out: if outlen == 0 {
                0
            } else {
                response.wrapping_add(resp_size as u64)
            },
            udata_outlen: outlen,
            core_out: None,
        };
        crate::log!("write cmd {command} in {} out {}", hdr.in_words, hdr.out_words);
        // core/uverbs_main.c:98-99 ib_uverbs_get_ucontext_file: no ucontext yet is EINVAL
        // for the commands that create an object (core/rdma_core.c:265-270) or query the
        // device. Those that only look a handle up ask for none: their lookup finds nothing,
        // ENOENT (core/rdma_core.c:325-327; DEALLOC_PD core/uverbs_cmd.c:478, DESTROY_AH :2487,
        // DEREG_MR :906,
        // RESIZE_CQ :1135, DESTROY_CQ :1270, QUERY_QP :1671, MODIFY_QP after its attr_mask
        // check :1940, DESTROY_QP :1984).
        let looks_up_only = matches!(
            command,
            cmd::DEALLOC_PD
                | cmd::DESTROY_AH
                | cmd::DEREG_MR
                | cmd::RESIZE_CQ
                | cmd::DESTROY_CQ
                | cmd::QUERY_QP
                | cmd::MODIFY_QP
                | cmd::DESTROY_QP
        );
        if command != cmd::GET_CONTEXT && !looks_up_only && !self.contexts.get(&ctx).is_some_and(|c| c.alive) {
            return Err(EINVAL);
        }
        let result = match command {
            cmd::GET_CONTEXT => self.get_context(&call, mem, host),
            cmd::QUERY_DEVICE => self.query_device(&call, mem),
            cmd::QUERY_PORT => self.query_port(&call, mem),
            cmd::ALLOC_PD => self.alloc_pd(&call, mem),
            cmd::DEALLOC_PD => self.dealloc_pd(&call),
            cmd::CREATE_AH => self.create_ah(&call, mem),
            cmd::DESTROY_AH => self.destroy_ah(&call),
            cmd::REG_MR => self.reg_mr(&call, mem, host),
            cmd::DEREG_MR => self.dereg_mr(&call),
            cmd::CREATE_COMP_CHANNEL => self.create_comp_channel(&call, mem, host),
            cmd::CREATE_CQ => self.create_cq(&call, mem),
            cmd::RESIZE_CQ => self.resize_cq(&call, mem),
            cmd::DESTROY_CQ => self.destroy_cq(&call, mem),
            cmd::CREATE_QP => self.create_qp(&call, mem),
            cmd::QUERY_QP => self.query_qp(&call, mem),
            cmd::MODIFY_QP => self.modify_qp(&call, mem),
            cmd::DESTROY_QP => self.destroy_qp(&call, mem),
            cmd::CREATE_SRQ => self.create_srq_cmd(&call, mem),
            cmd::MODIFY_SRQ => self.modify_srq(&call),
            cmd::QUERY_SRQ => self.query_srq(&call, mem),
            cmd::DESTROY_SRQ => self.destroy_srq(&call, mem),
            _ => Err(EOPNOTSUPP),
        };
        if let Err(e) = result {
            crate::log!("write cmd {command} -> errno {e}");
        }
        result
    }

    fn respond(mem: &dyn Memory, addr: u64, bytes: &[u8]) -> Result<(), Errno> {
        mem.write(addr, bytes).map_err(|_| EFAULT)
    }

    fn ctx(&self, ctx: i32) -> Result<&Context, Errno> {
        self.contexts.get(&ctx).ok_or(EINVAL)
    }
}
