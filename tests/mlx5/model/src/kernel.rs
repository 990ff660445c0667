//! The fake uverbs kernel with the mlx5 driver: framed `write()` commands and the
//! `RDMA_VERBS_IOCTL` methods the model answers, validated as Linux 6.1 does.
//!
//! Citations name the Linux 6.1 source line (`hw/mlx5/main.c:2054`, paths under
//! `drivers/infiniband/` of Debian 12's `linux-source-6.1`, 6.1.192) and function whose check
//! a rule models.
//! Every handler decodes bytes it copied from the client with safe code; only [`Memory`]
//! touches client memory.

use crate::abi::{self, cmd, qp_attr, qps, PAGE_SIZE};
use crate::device::Device;
use crate::mem::Memory;
use crate::objects::{Ah, Cq, EventSink, Mr, Pd, Qp, QpAttrs, Srq, Table, Uar};
use libc::{EBADF, EBUSY, EFAULT, EINVAL, ENOENT, ENOMEM, ENOSPC, EOPNOTSUPP, EPERM, EPROTONOSUPPORT};
use std::collections::HashMap;
use std::sync::Arc;
use zerocopy::{FromBytes, IntoBytes};

mod ioctl;
mod srq;

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
}

/// The whole fake kernel and device of one process.
pub struct Model {
    pub lid: u16,
    pub node_guid: u64,
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

/// Pages `[addr, addr + len)` touches (`ib_umem_num_pages`).
fn pages_spanned(addr: u64, len: u64) -> u64 {
    let first = addr & !(PAGE_SIZE - 1);
    let end = addr.saturating_add(len).saturating_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
    (end - first) / PAGE_SIZE
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
    /// A model whose port has `lid`.
    pub fn new(lid: u16) -> Self {
        Self {
            lid,
            node_guid: 0x0002_c903_0000_0001,
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

    // ---- GET_CONTEXT -------------------------------------------------------------------

    fn get_context(&mut self, call: &Call<'_>, mem: &dyn Memory, host: &dyn Host) -> Result<(), Errno> {
        // core/uverbs_cmd.c:241 ib_init_ucontext (from ib_uverbs_get_context): a second
        // GET_CONTEXT is EINVAL (the file already has a ucontext).
        if self.ctx(call.ctx)?.alive {
            return Err(EINVAL);
        }
        let (fd, sink) = host.event_fd()?;
        let resp = abi::GetContextResp {
            async_fd: fd as u32,
            num_comp_vectors: caps::NUM_COMP_VECTORS,
        };
        // The core response is written before the driver runs (core/uverbs_cmd.c:303, then
        // :307 ib_init_ucontext -> :251 the driver). 6.1 writes it before the second-context
        // check too (:241, above here in the model; docs/kernel-facts.md).
        let driver = call
            .respond_core(mem, resp.as_bytes())
            .and_then(|()| self.alloc_ucontext(call, mem));
        match driver {
            Ok(ctx) => {
                let c = self.contexts.entry(call.ctx).or_default();
                *c = ctx;
                c.async_sink = Some(sink);
                c.async_fd = Some(fd);
                c.async_fds.push(fd);
                Ok(())
            }
            Err(e) => {
                host.close_fd(fd);
                Err(e)
            }
        }
    }

    /// hw/mlx5/main.c:1853 `mlx5_ib_alloc_ucontext`.
    fn alloc_ucontext(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<Context, Errno> {
        crate::trace::command("GET_CONTEXT", &call.udata_in, call.udata_outlen);
        let inlen = call.udata_in.len();
        // hw/mlx5/main.c:1872-1877 mlx5_ib_alloc_ucontext: `if (udata->inlen == sizeof(req))
        // ver = 0; else if (inlen >= min_req_v2) ver = 2; else return -EINVAL;`
        if inlen != abi::MLX5_UCONTEXT_REQ_V0 && inlen < abi::MLX5_UCONTEXT_REQ_V2_MIN {
            return Err(EINVAL);
        }
        let mut bytes = [0u8; 32];
        let n = inlen.min(32);
        bytes[..n].copy_from_slice(&call.udata_in[..n]);
        let mut req: abi::AllocUcontextReq = decode(&bytes);
        // hw/mlx5/main.c:1883 mlx5_ib_alloc_ucontext: `if (req.flags &
        // ~MLX5_IB_ALLOC_UCTX_DEVX) return -EOPNOTSUPP;`
        if req.flags & !abi::ALLOC_UCTX_DEVX != 0 {
            return Err(EOPNOTSUPP);
        }
        // hw/mlx5/main.c:1886 mlx5_ib_alloc_ucontext: `if (req.comp_mask || req.reserved0 ||
        // req.reserved1 || req.reserved2) return -EOPNOTSUPP;`
        if req.comp_mask != 0 || req.reserved0 != 0 || req.reserved1 != 0 || req.reserved2 != 0 {
            return Err(EOPNOTSUPP);
        }
        // hw/mlx5/main.c:1889-1892 mlx5_ib_alloc_ucontext: `req.total_num_bfregs =
        // ALIGN(req.total_num_bfregs, MLX5_NON_FP_BFREGS_PER_UAR); if
        // (req.num_low_latency_bfregs > req.total_num_bfregs - 1) return -EINVAL;`
        req.total_num_bfregs = req.total_num_bfregs.checked_add(1).map_or(0, |v| v & !1);
        if req.num_low_latency_bfregs > req.total_num_bfregs.wrapping_sub(1) {
            return Err(EINVAL);
        }
        // hw/mlx5/main.c:1894 -> hw/mlx5/devx.c:122 mlx5_ib_devx_create: this device has no
        // DEVX user contexts (`if (!MLX5_CAP_GEN(dev->mdev, log_max_uctx)) return -EINVAL;`;
        // Debian's 6.1 has CONFIG_INFINIBAND_USER_ACCESS=m, so not the EOPNOTSUPP stub).
        if req.flags & abi::ALLOC_UCTX_DEVX != 0 {
            return Err(EINVAL);
        }
        let lib_uar_dyn = req.lib_caps & abi::LIB_CAP_DYN_UAR != 0;
        let mut static_pages = 0;
        if !lib_uar_dyn {
            // hw/mlx5/main.c:1604 calc_total_bfregs: `if (req->total_num_bfregs == 0) return
            // -EINVAL;`, then hw/mlx5/main.c:1610 `if (req->total_num_bfregs >
            // MLX5_MAX_BFREGS) return -ENOMEM;`. (Its second low-latency check, main.c:1617,
            // cannot fire here: with one UAR per system page it aligns to 2 again.)
            if req.total_num_bfregs == 0 {
                return Err(EINVAL);
            }
            if req.total_num_bfregs > caps::MAX_BFREGS {
                return Err(ENOMEM);
            }
            static_pages = u64::from(req.total_num_bfregs / 2);
        }
        let cqe_version = if inlen >= 17 { req.max_cqe_version.min(1) } else { 0 };
        // hw/mlx5/main.c:1771 set_ucontext_resp fills every field; :1953 copies
        // `min(outlen, sizeof(resp))` bytes and reports that as `response_length`.
        let len = call.udata_outlen.min(std::mem::size_of::<abi::AllocUcontextResp>());
        let resp = abi::AllocUcontextResp {
            qp_tab_size: 1 << 18,
            bf_reg_size: crate::bf_reg_size(),
            tot_bfregs: if lib_uar_dyn { 0 } else { req.total_num_bfregs },
            cache_line_size: 64,
            max_sq_desc_sz: 512,
            max_rq_desc_sz: 512,
            max_send_wqebb: 1 << caps::LOG_MAX_QP_SZ,
            max_recv_wr: 1 << caps::LOG_MAX_QP_SZ,
            max_srq_recv_wr: 1 << caps::LOG_MAX_QP_SZ,
            num_ports: 1,
            // main.c:1826 (4 KiB pages: the core clock page is mapped) and main.c:1848 (always).
            comp_mask: abi::ucontext_resp_mask::CORE_CLOCK_OFFSET | abi::ucontext_resp_mask::MKEY_UPDATE_TAG,
            response_length: len as u32,
            cqe_version,
            // main.c:1809: QUERY_DEVICE and CREATE_AH take driver data.
            cmds_supp_uhw: 3,
            // main.c:1816: a clock info page only where the device has a clock frequency.
            clock_info_versions: if caps::HAS_CLOCK_INFO {
                1 << abi::CLOCK_INFO_V1
            } else {
                0
            },
            // main.c:1828: `internal_timer_h` (init segment offset 0x1000) within its page.
            hca_core_clock_offset: abi::INTERNAL_TIMER_OFFSET % PAGE_SIZE,
            log_uar_size: 12,
            num_uars_per_page: 1,
            ..Default::default()
        };
        let out = if len == 0 { &[][..] } else { &resp.as_bytes()[..len] };
        Self::respond(mem, call.udata_out, out)?;
        Ok(Context {
            alive: true,
            cqe_version,
            lib_uar_dyn,
            static_uar_pages: static_pages,
            bfreg_count: vec![0; if lib_uar_dyn { 0 } else { req.total_num_bfregs as usize }],
            num_low_latency_bfregs: req.num_low_latency_bfregs,
            ucontext_v2: inlen != abi::MLX5_UCONTEXT_REQ_V0,
            async_sink: None,
            async_fd: None,
            async_fds: Vec::new(),
            uar_maps: Vec::new(),
        })
    }

    // ---- queries ---------------------------------------------------------------------------

    fn query_device(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("QUERY_DEVICE", &call.udata_in, call.udata_outlen);
        let resp = abi::QueryDeviceResp {
            fw_ver: caps::FW_VER,
            node_guid: self.node_guid.to_be(),
            sys_image_guid: self.node_guid.to_be(),
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            vendor_id: caps::VENDOR_ID,
            vendor_part_id: caps::VENDOR_PART_ID,
            max_qp: 1 << 18,
            max_qp_wr: 1 << caps::LOG_MAX_QP_SZ,
            device_cap_flags: 0x1 | 0x2 | 0x4 | 0x20 | 0x40 | 0x400 | 0x20_0000,
            max_sge: caps::MAX_SGE,
            max_sge_rd: caps::MAX_SGE,
            max_cq: 1 << 24,
            max_cqe: (1 << caps::LOG_MAX_CQ_SZ) - 1,
            max_mr: 1 << 24,
            max_pd: 1 << 24,
            max_qp_rd_atom: u32::from(caps::MAX_RD_ATOMIC),
            max_res_rd_atom: u32::from(caps::MAX_RD_ATOMIC) << 18,
            max_qp_init_rd_atom: u32::from(caps::MAX_RD_ATOMIC),
            atomic_cap: 1,
            max_mw: 1 << 24,
            max_ah: u32::MAX,
            max_srq: 1 << 23,
            max_srq_wr: (1 << caps::LOG_MAX_QP_SZ) - 1,
            max_srq_sge: 31,
            max_pkeys: caps::PKEY_TABLE_LEN,
            local_ca_ack_delay: 16,
            phys_port_cnt: 1,
            ..Default::default()
        };
        call.respond_core(mem, resp.as_bytes())
    }

    fn query_port(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("QUERY_PORT", &call.udata_in, call.udata_outlen);
        let req: abi::QueryPort = decode(call.req);
        // core/uverbs_cmd.c:392 ib_uverbs_query_port -> core/device.c:2108-2109
        // ib_query_port: `if (!rdma_is_port_valid(device, port_num)) return -EINVAL;`
        if req.port_num != 1 {
            return Err(EINVAL);
        }
        let resp = abi::QueryPortResp {
            port_cap_flags: 0x0251_0868,
            max_msg_sz: 1 << 30,
            gid_tbl_len: 1,
            pkey_tbl_len: caps::PKEY_TABLE_LEN,
            lid: self.lid,
            sm_lid: 1,
            state: 4,
            max_mtu: 5,
            active_mtu: 5,
            max_vl_num: 4,
            subnet_timeout: 18,
            active_width: 2,
            active_speed: 32,
            phys_state: 5,
            link_layer: 1,
            ..Default::default()
        };
        call.respond_core(mem, resp.as_bytes())
    }

    // ---- PD and MR ---------------------------------------------------------------------

    fn alloc_pd(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("ALLOC_PD", &call.udata_in, call.udata_outlen);
        let handle = self.pds.insert(Pd {
            ctx: call.ctx,
            users: 0,
        });
        // hw/mlx5/main.c:2379 mlx5_ib_alloc_pd: `ib_copy_to_udata(udata, &resp, sizeof(resp))`
        // copies the 4-byte PD number without clamping to outlen: no driver response buffer
        // (NULL) is EFAULT. Driver first (core/uverbs_cmd.c:450), then the core response
        // (:459).
        let result = Self::respond(mem, call.udata_out, &(handle + 1).to_ne_bytes())
            .and_then(|()| call.respond_core(mem, &handle.to_ne_bytes()));
        if result.is_err() {
            self.pds.remove(handle);
        }
        result
    }

    fn dealloc_pd(&mut self, call: &Call<'_>) -> Result<(), Errno> {
        crate::trace::command("DEALLOC_PD", &call.udata_in, call.udata_outlen);
        let handle = decode::<abi::HandleOnly>(call.req).handle;
        // core/rdma_core.c:327 lookup_get_idr_uobject: an unknown handle is ENOENT.
        let pd = self.pds.get(handle).filter(|p| p.ctx == call.ctx).ok_or(ENOENT)?;
        // core/uverbs_std_types.c:127 uverbs_free_pd: in use is EBUSY.
        if pd.users > 0 {
            return Err(EBUSY);
        }
        self.pds.remove(handle);
        Ok(())
    }

    // ---- AH ----------------------------------------------------------------------------

    /// CREATE_AH (core/uverbs_cmd.c:2408 `ib_uverbs_create_ah`). libmlx5 sends it only on
    /// an Ethernet port (it builds an InfiniBand address vector itself); the Rust provider
    /// sends it on every port, as the kernel allows.
    fn create_ah(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("CREATE_AH", &call.udata_in, call.udata_outlen);
        let req: abi::CreateAh = decode(call.req);
        // core/uverbs_cmd.c:2427: an invalid port is EINVAL, before the PD lookup.
        if req.attr.port_num != 1 {
            return Err(EINVAL);
        }
        // core/uverbs_cmd.c:2432: a PD handle naming nothing is the lookup's ENOENT.
        if !self.pds.get(req.pd_handle).is_some_and(|p| p.ctx == call.ctx) {
            return Err(ENOENT);
        }
        // core/verbs.c:597 rdma_create_user_ah -> :451 rdma_check_ah_attr: the port is
        // InfiniBand (core/uverbs_cmd.c:2438 rdma_ah_find_type gives an IB AH) and does not
        // require a GRH (hw/mlx5/main.c:2894: only a port whose vport says so), so an AH
        // without one is fine. With one, :463 rdma_get_gid_attr: an sgid index beyond the
        // GID table (one entry) is EINVAL (core/cache.c:1232).
        if req.attr.is_global != 0 && req.attr.sgid_index >= 1 {
            return Err(EINVAL);
        }
        // hw/mlx5/ah.c:93 mlx5_ib_create_ah: an IB AH takes no driver data and returns none
        // (the dmac response, :106-120, is for RoCE AHs only); the AH holds its PD
        // (core/verbs.c:544).
        let handle = self.ahs.insert(Ah {
            ctx: call.ctx,
            pd: req.pd_handle,
            attr: req.attr,
        });
        if let Err(e) = call.respond_core(mem, &handle.to_ne_bytes()) {
            self.ahs.remove(handle);
            return Err(e);
        }
        if let Some(pd) = self.pds.get_mut(req.pd_handle) {
            pd.users += 1;
        }
        Ok(())
    }

    /// DESTROY_AH (core/uverbs_cmd.c:2478), also the ioctl AH_DESTROY.
    fn destroy_ah(&mut self, call: &Call<'_>) -> Result<(), Errno> {
        crate::trace::command("DESTROY_AH", &call.udata_in, call.udata_outlen);
        let handle = decode::<abi::HandleOnly>(call.req).handle;
        // core/uverbs_cmd.c:2487 uobj_perform_destroy: an unknown handle is ENOENT
        // (core/rdma_core.c:325-327).
        let ah = self.ahs.get(handle).filter(|a| a.ctx == call.ctx).ok_or(ENOENT)?;
        let pd = ah.pd;
        self.ahs.remove(handle);
        if let Some(pd) = self.pds.get_mut(pd) {
            pd.users -= 1;
        }
        Ok(())
    }

    fn reg_mr(&mut self, call: &Call<'_>, mem: &dyn Memory, host: &dyn Host) -> Result<(), Errno> {
        crate::trace::command("REG_MR", &call.udata_in, call.udata_outlen);
        let req: abi::RegMr = decode(call.req);
        // core/uverbs_cmd.c:710 ib_uverbs_reg_mr: start and hca_va must share their page
        // offset.
        if (req.start ^ req.hca_va) & (PAGE_SIZE - 1) != 0 {
            return Err(EINVAL);
        }
        // include/rdma/ib_verbs.h:4296, :4300, :4303 ib_check_mr_access (core/uverbs_cmd.c:717):
        // remote write or atomic needs local write, unknown bits, and on-demand paging on a
        // device without IBK_ON_DEMAND_PAGING (this one) are all EINVAL.
        const SUPPORTED: u32 = 0xff | 0x1ff0_0000;
        let a = req.access_flags;
        if a & !SUPPORTED != 0 {
            return Err(EINVAL);
        }
        if a & (abi::access::REMOTE_ATOMIC | abi::access::REMOTE_WRITE) != 0 && a & abi::access::LOCAL_WRITE == 0 {
            return Err(EINVAL);
        }
        if a & 0x40 != 0 {
            return Err(EINVAL);
        }
        // core/uverbs_cmd.c:721-723 uobj_get_obj_read(pd): an unknown PD is the lookup's
        // ENOENT (core/rdma_core.c:327; EINVAL before Debian's 6.1.147).
        if !self.pds.get(req.pd_handle).is_some_and(|p| p.ctx == call.ctx) {
            return Err(ENOENT);
        }
        // core/umem.c:182-184 ib_umem_get: a range that wraps is EINVAL; memory that cannot
        // be pinned (not mapped) is pin_user_pages_fast's EFAULT (:235-241).
        if req
            .start
            .checked_add(req.length)
            .and_then(|end| end.checked_add(PAGE_SIZE - 1))
            .is_none()
        {
            return Err(EINVAL);
        }
        // umem.c ib_umem_get: with no RLIMIT_MEMLOCK and no CAP_IPC_LOCK `can_do_mlock` is
        // EPERM; pages pinned past the limit (`mm->pinned_vm`) are ENOMEM; then pinning
        // memory that is not mapped is EFAULT.
        let npages = pages_spanned(req.start, req.length);
        if let Some(limit) = host.memlock_pages() {
            if limit == 0 {
                return Err(EPERM);
            }
            if self.pinned_pages + npages > limit {
                return Err(ENOMEM);
            }
        }
        if !mem.probe(req.start, req.length) {
            return Err(EFAULT);
        }
        self.pinned_pages += npages;
        self.next_key = self.next_key.wrapping_add(1);
        let mr = Mr {
            ctx: call.ctx,
            pd: req.pd_handle,
            addr: req.start,
            length: req.length,
            iova: req.hca_va,
            access: a,
            key: 0,
        };
        let handle = self.mrs.insert(mr);
        // mkey = index << 8 | variant; index 1 would make 0x1xx, and 0x100 is the invalid lkey.
        let key = ((handle + 2) << 8) | (self.next_key & 0xff);
        if let Some(m) = self.mrs.get_mut(handle) {
            m.key = key;
        }
        if let Some(pd) = self.pds.get_mut(req.pd_handle) {
            pd.users += 1;
        }
        let resp = abi::RegMrResp {
            mr_handle: handle,
            lkey: key,
            rkey: key,
        };
        let result = call.respond_core(mem, resp.as_bytes());
        if result.is_err() {
            self.drop_mr(handle);
        }
        result
    }

    fn drop_mr(&mut self, handle: u32) {
        if let Some(mr) = self.mrs.remove(handle) {
            self.pinned_pages -= pages_spanned(mr.addr, mr.length);
            if let Some(pd) = self.pds.get_mut(mr.pd) {
                pd.users -= 1;
            }
        }
    }

    fn dereg_mr(&mut self, call: &Call<'_>) -> Result<(), Errno> {
        crate::trace::command("DEREG_MR", &call.udata_in, call.udata_outlen);
        let handle = decode::<abi::HandleOnly>(call.req).handle;
        // core/uverbs_cmd.c:906 uobj_perform_destroy: an unknown MR is the lookup's ENOENT
        // (core/rdma_core.c:325-327).
        self.mrs.get(handle).filter(|m| m.ctx == call.ctx).ok_or(ENOENT)?;
        self.drop_mr(handle);
        Ok(())
    }

    // ---- completion channels and CQs -----------------------------------------------------

    fn create_comp_channel(&mut self, call: &Call<'_>, mem: &dyn Memory, host: &dyn Host) -> Result<(), Errno> {
        let (fd, sink) = host.event_fd()?;
        if let Err(e) = call.respond_core(mem, &(fd as u32).to_ne_bytes()) {
            host.close_fd(fd);
            return Err(e);
        }
        self.channels.insert(fd, (call.ctx, sink));
        Ok(())
    }

    fn create_cq(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("CREATE_CQ", &call.udata_in, call.udata_outlen);
        let req: abi::CreateCq = decode(call.req);
        // core/uverbs_cmd.c:1021 create_cq: `if (cmd->comp_vector >= num_comp_vectors) return
        // -EINVAL;`
        if req.comp_vector >= caps::NUM_COMP_VECTORS {
            return Err(EINVAL);
        }
        // core/uverbs_cmd.c:1030 ib_uverbs_lookup_comp_file: an fd that is not a completion
        // channel is EBADF.
        let channel = if req.comp_channel >= 0 {
            let (owner, sink) = self.channels.get(&req.comp_channel).ok_or(EBADF)?;
            if *owner != call.ctx {
                return Err(EBADF);
            }
            Some(sink.clone())
        } else {
            None
        };
        // hw/mlx5/cq.c:959, :967 mlx5_ib_create_cq: `if (entries < 0 || entries > (1 <<
        // log_max_cq_sz)) return -EINVAL;`, then the same for roundup_pow_of_two(entries + 1)
        // (entries is an int).
        let entries = i32::try_from(req.cqe).map_err(|_| EINVAL)?;
        let ncqe = (entries as u32 + 1).checked_next_power_of_two().ok_or(EINVAL)?;
        if ncqe > 1 << caps::LOG_MAX_CQ_SZ {
            return Err(EINVAL);
        }
        let ctx = self.ctx(call.ctx)?;
        // hw/mlx5/cq.c:980 mlx5_ib_create_cq -> :713 create_cq_user.
        let inlen = call.udata_in.len().min(32);
        // hw/mlx5/cq.c:729 create_cq_user: `if (ucmdlen < offsetof(struct mlx5_ib_create_cq,
        // flags)) return -EINVAL;`
        if inlen < abi::MLX5_CREATE_CQ_FLAGS_OFFSET {
            return Err(EINVAL);
        }
        let mut bytes = [0u8; 32];
        bytes[..inlen].copy_from_slice(&call.udata_in[..inlen]);
        let ucmd: abi::Mlx5CreateCq = decode(&bytes);
        // hw/mlx5/cq.c:735 create_cq_user: `if (ucmd.flags & ~(CQE_128B_PAD | UAR_PAGE_INDEX |
        // REAL_TIME_TS)) return -EINVAL;`
        if ucmd.flags & !(abi::CQ_FLAG_CQE_128B_PAD | abi::CQ_FLAG_UAR_PAGE_INDEX | abi::CQ_FLAG_REAL_TIME_TS) != 0 {
            return Err(EINVAL);
        }
        // hw/mlx5/cq.c:740 create_cq_user: `if ((ucmd.cqe_size != 64 && ucmd.cqe_size != 128)
        // || ucmd.reserved0 || ucmd.reserved1) return -EINVAL;`
        if (ucmd.cqe_size != 64 && ucmd.cqe_size != 128) || ucmd.reserved0 != 0 || ucmd.reserved1 != 0 {
            return Err(EINVAL);
        }
        // hw/mlx5/cq.c:747 create_cq_user: ib_umem_get(buf_addr, entries * cqe_size):
        // unmapped memory is EFAULT.
        if !mem.probe(ucmd.buf_addr, u64::from(ncqe) * u64::from(ucmd.cqe_size)) {
            return Err(EFAULT);
        }
        // hw/mlx5/cq.c:762 create_cq_user -> mlx5_ib_db_map_user pins the doorbell page:
        // EFAULT when unmapped.
        if !mem.probe(ucmd.db_addr & !(PAGE_SIZE - 1), PAGE_SIZE) {
            return Err(EFAULT);
        }
        // hw/mlx5/cq.c:791 create_cq_user: `else if (context->bfregi.lib_uar_dyn) { err =
        // -EINVAL; }`: with dynamic UARs the
        // CQ must name its UAR page.
        if ucmd.flags & abi::CQ_FLAG_UAR_PAGE_INDEX == 0 && ctx.lib_uar_dyn {
            return Err(EINVAL);
        }
        // hw/mlx5/cq.c:798-805, :825-828 create_cq_user: CQE compression and 128-byte
        // padding need capabilities this device lacks: EOPNOTSUPP. Real-time timestamps are
        // only recorded (hw/mlx5/cq.c:838): accepted.
        if ucmd.cqe_comp_en == 1 || ucmd.flags & abi::CQ_FLAG_CQE_128B_PAD != 0 {
            return Err(EOPNOTSUPP);
        }
        let cqn = self.next_cqn;
        let last_arm_db = mem.read_be32(ucmd.db_addr + abi::CQ_ARM_DB).unwrap_or(0);
        let handle = self.cqs.insert(Cq {
            ctx: call.ctx,
            cqn,
            user_handle: req.user_handle,
            buf: ucmd.buf_addr,
            ncqe,
            cqe_size: ucmd.cqe_size,
            db: ucmd.db_addr,
            pi: 0,
            channel,
            arm: None,
            fired: None,
            last_arm_db,
            comp_events: 0,
            async_events: 0,
            error: false,
            users: 0,
        });
        // hw/mlx5/cq.c:1029 mlx5_ib_create_cq: `ib_copy_to_udata(udata, &cq->mcq.cqn,
        // sizeof(__u32))`, unclamped.
        let result = Self::respond(mem, call.udata_out, &cqn.to_ne_bytes()).and_then(|()| {
            let resp = abi::CreateCqResp {
                cq_handle: handle,
                cqe: ncqe - 1,
            };
            call.respond_core(mem, resp.as_bytes())
        });
        match result {
            Ok(()) => {
                self.next_cqn += 1;
                Ok(())
            }
            Err(e) => {
                self.cqs.remove(handle);
                Err(e)
            }
        }
    }

    fn resize_cq(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("RESIZE_CQ", &call.udata_in, call.udata_outlen);
        let req: abi::ResizeCq = decode(call.req);
        // core/uverbs_cmd.c:1135: an unknown CQ is the lookup's ENOENT.
        let cq = self
            .cqs
            .get(req.cq_handle)
            .filter(|c| c.ctx == call.ctx)
            .ok_or(ENOENT)?;
        // hw/mlx5/cq.c:1283, :1292 mlx5_ib_resize_cq: `if (entries < 1 || entries > (1 <<
        // log_max_cq_sz)) return -EINVAL;`, then roundup_pow_of_two(entries + 1) against
        // the same plus one.
        let entries = i32::try_from(req.cqe).map_err(|_| EINVAL)?;
        if entries < 1 || entries as u32 > 1 << caps::LOG_MAX_CQ_SZ {
            return Err(EINVAL);
        }
        let new_n = (entries as u32 + 1).next_power_of_two();
        if new_n > (1 << caps::LOG_MAX_CQ_SZ) + 1 {
            return Err(EINVAL);
        }
        // hw/mlx5/cq.c:1295 mlx5_ib_resize_cq: `if (entries == ibcq->cqe + 1) return 0;`
        if new_n == cq.ncqe {
            return call.respond_core(mem, &resize_resp(cq.ncqe - 1));
        }
        // hw/mlx5/cq.c:1161 resize_user: `ib_copy_from_udata(&ucmd, udata, sizeof(ucmd))`,
        // unclamped: short or
        // missing driver data reads past it (NULL when absent: EFAULT).
        let mut bytes = [0u8; 16];
        if call.udata_in.len() >= 16 {
            bytes.copy_from_slice(&call.udata_in[..16]);
        } else {
            return Err(if call.udata_in.is_empty() { EFAULT } else { EINVAL });
        }
        let ucmd: abi::Mlx5ResizeCq = decode(&bytes);
        // hw/mlx5/cq.c:1165 resize_user: `if (ucmd.reserved0 || ucmd.reserved1) return
        // -EINVAL;`
        if ucmd.reserved0 != 0 || ucmd.reserved1 != 0 {
            return Err(EINVAL);
        }
        // The new CQE size must be one the device writes. 6.1's driver does not check it
        // (hw/mlx5/cq.c:1153 resize_user); it passes it to the firmware through the CQ
        // context (cq.c:1356 cqe_sz_to_mlx_sz), which refuses other sizes: the model answers
        // for the firmware with EINVAL.
        if ucmd.cqe_size != 64 && ucmd.cqe_size != 128 {
            return Err(EINVAL);
        }
        if !mem.probe(ucmd.buf_addr, u64::from(new_n) * u64::from(ucmd.cqe_size)) {
            return Err(EFAULT);
        }
        let cq = self.cqs.get_mut(req.cq_handle).ok_or(ENOENT)?;
        Device::resize_cq(cq, ucmd.buf_addr, new_n, u32::from(ucmd.cqe_size), mem);
        call.respond_core(mem, &resize_resp(new_n - 1))
    }

    fn destroy_cq(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("DESTROY_CQ", &call.udata_in, call.udata_outlen);
        let req: abi::DestroyObj = decode(call.req);
        // core/uverbs_cmd.c:1270 uobj_get_destroy: an unknown CQ is the lookup's ENOENT
        // (core/rdma_core.c:325-327).
        let cq = self.cqs.get(req.handle).filter(|c| c.ctx == call.ctx).ok_or(ENOENT)?;
        // core/uverbs_cmd.c:1270 uobj_get_destroy -> core/uverbs_std_types_cq.c:48 ->
        // core/verbs.c:2119-2120 ib_destroy_cq_user: a CQ a QP still uses is EBUSY
        // (docs/kernel-facts.md).
        if cq.users > 0 {
            return Err(EBUSY);
        }
        let resp = abi::DestroyCqResp {
            comp_events_reported: cq.comp_events,
            async_events_reported: cq.async_events,
        };
        self.cqs.remove(req.handle);
        call.respond_core(mem, resp.as_bytes())
    }

    // ---- QPs ---------------------------------------------------------------------------

    fn create_qp(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("CREATE_QP", &call.udata_in, call.udata_outlen);
        let req: abi::CreateQp = decode(call.req);
        let owned_cq = |h: u32| self.cqs.get(h).is_some_and(|c| c.ctx == call.ctx);
        // core/uverbs_cmd.c:1367-1405 create_qp: an SRQ, CQ or PD handle that names nothing
        // is the lookup's ENOENT (core/rdma_core.c:327).
        let srq = (req.is_srq != 0).then_some(req.srq_handle);
        if srq.is_some_and(|h| !self.srqs.get(h).is_some_and(|s| s.ctx == call.ctx)) {
            return Err(ENOENT);
        }
        if !owned_cq(req.send_cq_handle) || !owned_cq(req.recv_cq_handle) {
            return Err(ENOENT);
        }
        if !self.pds.get(req.pd_handle).is_some_and(|p| p.ctx == call.ctx) {
            return Err(ENOENT);
        }
        // hw/mlx5/qp.c:3213 -> :2728 check_qp_type takes RC, UC and UD (:2745-2747), and
        // raw packet, XRC and driver QPs too; the model runs RC, UC and UD only (EOPNOTSUPP,
        // the errno :2759 gives others). A user UD QP goes through the same create_user_qp
        // (:3280-3284) and so the same driver-data rules as RC; its create flags
        // (:2966-2973, IPoIB LSO and source QPN) come only with the extended command.
        if !matches!(req.qp_type, abi::qpt::RC | abi::qpt::UC | abi::qpt::UD) {
            return Err(EOPNOTSUPP);
        }
        let ctx = self.ctx(call.ctx)?;
        let inlen = call.udata_in.len();
        // hw/mlx5/qp.c:3024, :3045 process_udata_size: driver data shorter than
        // `ece_options` is EINVAL.
        if inlen < abi::MLX5_CREATE_QP_ECE_OFFSET {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:3194 check_ucmd_data: everything from `reserved` on must be zero.
        if call.udata_in[abi::MLX5_CREATE_QP_RESERVED_OFFSET.min(inlen)..]
            .iter()
            .any(|&b| b != 0)
        {
            return Err(EINVAL);
        }
        let mut bytes = [0u8; 56];
        bytes[..inlen.min(56)].copy_from_slice(&call.udata_in[..inlen.min(56)]);
        let ucmd: abi::Mlx5CreateQp = decode(&bytes);
        // hw/mlx5/qp.c:3247 -> :2834 process_vendor_flags: flags the device does not take
        // are EINVAL (:2906-2909).
        let known = abi::QP_FLAG_SIGNATURE
            | abi::QP_FLAG_SCATTER_CQE
            | abi::QP_FLAG_ALLOW_SCATTER_CQE
            | abi::QP_FLAG_BFREG_INDEX
            | abi::QP_FLAG_UAR_PAGE_INDEX;
        if ucmd.flags & !known != 0 {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:3251 -> mlx5_ib.h:1508 get_qp_user_index, :1493 verify_assign_uidx:
        // with CQE version 1 the user index must be given and fit 24 bits (:1497-1499); with
        // version 0 it must be MLX5_IB_DEFAULT_UIDX (:1515-1520).
        if ctx.cqe_version == 0 {
            if ucmd.uidx != abi::DEFAULT_UIDX {
                return Err(EINVAL);
            }
        } else if ucmd.uidx == abi::DEFAULT_UIDX || ucmd.uidx & !0xff_ffff != 0 {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:394 set_rq_size: `if (cap->max_recv_wr > (1 << log_max_qp_sz)) return
        // -EINVAL;`
        if req.max_recv_wr > 1 << caps::LOG_MAX_QP_SZ {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:639 qp_has_rq: a QP on an SRQ has no receive queue of its own.
        let has_rq = req.max_recv_wr != 0 && srq.is_none();
        let (rq_cnt, rq_shift) = if has_rq {
            // hw/mlx5/qp.c:409-412 set_rq_size: `if (check_shl_overflow(1,
            // qp->rq.wqe_shift, &wqe_size)) return -EINVAL;` (an int: shifts of 31 and more)
            // and `wqe_size / sizeof(data_seg) < wq_sig` is EINVAL.
            if ucmd.rq_wqe_shift >= 31 {
                return Err(EINVAL);
            }
            let sig = u32::from(ucmd.flags & abi::QP_FLAG_SIGNATURE != 0);
            if (1u64 << ucmd.rq_wqe_shift) / 16 < u64::from(sig) {
                return Err(EINVAL);
            }
            (ucmd.rq_wqe_count, ucmd.rq_wqe_shift)
        } else {
            (0, 0)
        };
        // hw/mlx5/qp.c:2242 create_user_qp: `if (ucmd->rq_wqe_shift != qp->rq.wqe_shift ||
        // ucmd->rq_wqe_count != qp->rq.wqe_cnt) return -EINVAL;` (a QP without receive queue
        // must describe none).
        if ucmd.rq_wqe_shift != rq_shift || ucmd.rq_wqe_count != rq_cnt {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:2246 create_user_qp: `if (ucmd->sq_wqe_count > (1 << log_max_qp_sz))
        // return -EINVAL;`
        if ucmd.sq_wqe_count > 1 << caps::LOG_MAX_QP_SZ {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:942 _create_user_qp -> qp.c:731 alloc_bfreg: with dynamic UARs the QP
        // must name its UAR page (`if (bfregi->lib_uar_dyn) return -EINVAL;`).
        let uar_named = ucmd.flags & (abi::QP_FLAG_UAR_PAGE_INDEX | abi::QP_FLAG_BFREG_INDEX) != 0;
        if !uar_named && ctx.lib_uar_dyn {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:602 set_user_buf_size: `if (ucmd->sq_wqe_count &&
        // !is_power_of_2(ucmd->sq_wqe_count)) return -EINVAL;`
        if ucmd.sq_wqe_count != 0 && !ucmd.sq_wqe_count.is_power_of_two() {
            return Err(EINVAL);
        }
        let rq_bytes = u64::from(rq_cnt).checked_shl(rq_shift).ok_or(EINVAL)?;
        let buf_size = rq_bytes + (u64::from(ucmd.sq_wqe_count) << 6);
        // hw/mlx5/qp.c:967-972 _create_user_qp: ib_umem_get(buf_addr, buf_size) when both
        // are set (EFAULT, core/umem.c:235-241); then :1013 mlx5_ib_db_map_user pins the
        // doorbell page.
        if ucmd.buf_addr != 0 && buf_size != 0 && !mem.probe(ucmd.buf_addr, buf_size) {
            return Err(EFAULT);
        }
        if !mem.probe(ucmd.db_addr & !(PAGE_SIZE - 1), PAGE_SIZE) {
            return Err(EFAULT);
        }
        let bfregn = if uar_named {
            None
        } else {
            let c = self.contexts.get_mut(&call.ctx).ok_or(EINVAL)?;
            Some(alloc_bfreg(c))
        };
        // hw/mlx5/qp.c:896 adjust_bfregn: the index in the layout with the fast-path bfregs
        // (4 per UAR, 2 of them not fast path).
        let bfreg_index = bfregn.map_or(abi::INVALID_BFREG, |n| n / 2 * 4 + n % 2);
        let qpn = self.next_qpn & 0xff_ffff;
        let handle = self.qps.insert(Qp {
            ctx: call.ctx,
            bfregn,
            qpn,
            qp_type: req.qp_type,
            pd: req.pd_handle,
            send_cq: req.send_cq_handle,
            recv_cq: req.recv_cq_handle,
            srq,
            user_handle: req.user_handle,
            uidx: ucmd.uidx,
            buf: ucmd.buf_addr,
            // The context holds log_rq_size: a count that is not a power of two is rounded
            // down by the hardware.
            rq_cnt: if rq_cnt == 0 {
                0
            } else {
                1 << (31 - rq_cnt.leading_zeros())
            },
            rq_shift,
            sq_cnt: ucmd.sq_wqe_count,
            db: ucmd.db_addr,
            state: qps::RESET,
            attrs: QpAttrs::default(),
            sq_sig_all: req.sq_sig_all != 0,
            max_send_wr: req.max_send_wr,
            max_recv_wr: if has_rq { req.max_recv_wr } else { 0 },
            max_send_sge: req.max_send_sge,
            max_recv_sge: if has_rq { req.max_recv_sge } else { 0 },
            max_inline: req.max_inline_data,
            sq_ci: 0,
            rq_ci: 0,
            stall: None,
            epoch: 0,
            async_events: 0,
        });
        let dresp = abi::Mlx5CreateQpResp {
            bfreg_index,
            ..Default::default()
        };
        let outlen = call.udata_outlen.min(40);
        let resp = abi::CreateQpResp {
            qp_handle: handle,
            qpn,
            max_send_wr: req.max_send_wr,
            max_recv_wr: if has_rq { req.max_recv_wr } else { 0 },
            max_send_sge: req.max_send_sge,
            max_recv_sge: if has_rq { req.max_recv_sge } else { 0 },
            max_inline_data: req.max_inline_data,
            reserved: 0,
        };
        // hw/mlx5/qp.c:3013 process_udata_size: the response is min(outlen, sizeof(resp));
        // then the core response.
        let result = Self::respond(mem, call.udata_out, &dresp.as_bytes()[..outlen])
            .and_then(|()| call.respond_core(mem, resp.as_bytes()));
        if let Err(e) = result {
            self.qps.remove(handle);
            self.free_bfreg(call.ctx, bfregn);
            return Err(e);
        }
        self.next_qpn += 1;
        for cq in [req.send_cq_handle, req.recv_cq_handle] {
            if let Some(c) = self.cqs.get_mut(cq) {
                c.users += 1;
            }
        }
        if let Some(pd) = self.pds.get_mut(req.pd_handle) {
            pd.users += 1;
        }
        if let Some(s) = srq.and_then(|h| self.srqs.get_mut(h)) {
            s.users += 1;
        }
        Ok(())
    }

    fn modify_qp(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("MODIFY_QP", &call.udata_in, call.udata_outlen);
        let req: abi::ModifyQp = decode(call.req);
        let mask = req.attr_mask;
        // core/uverbs_cmd.c:1940 ib_uverbs_modify_qp: bits beyond the standard attributes
        // (IB_QP_ATTR_STANDARD_BITS, 0..=20; RATE_LIMIT too) are EOPNOTSUPP, before the lookup.
        const STANDARD: u32 = (1 << 21) - 1;
        if mask & !STANDARD != 0 {
            return Err(EOPNOTSUPP);
        }
        // core/uverbs_cmd.c:1776: an unknown QP is the lookup's ENOENT.
        let qp = self
            .qps
            .get(req.qp_handle)
            .filter(|q| q.ctx == call.ctx)
            .ok_or(ENOENT)?;
        // core/uverbs_cmd.c:1783, :1790, :1851-1854 modify_qp: invalid port numbers and states
        // beyond ERR are EINVAL.
        if mask & qp_attr::PORT != 0 && req.port_num != 1 {
            return Err(EINVAL);
        }
        if mask & qp_attr::AV != 0 && req.dest.port_num != 1 {
            return Err(EINVAL);
        }
        if (mask & qp_attr::CUR_STATE != 0 && req.cur_qp_state > qps::ERR)
            || (mask & qp_attr::STATE != 0 && req.qp_state > qps::ERR)
        {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:4640, :4643, :4652 mlx5_ib_modify_qp, driver data: `if (udata->inlen <
        // offsetofend(ucmd, ece_options)) return -EINVAL;` beyond the struct must be zero
        // (EOPNOTSUPP); comp_mask and burst reserved too.
        let inlen = call.udata_in.len();
        if inlen > 0 {
            if inlen < 16 {
                return Err(EINVAL);
            }
            if call.udata_in[16..].iter().any(|&b| b != 0) {
                return Err(EOPNOTSUPP);
            }
            let comp_mask = u32::from_ne_bytes(call.udata_in[0..4].try_into().unwrap_or_default());
            let burst_reserved = u16::from_ne_bytes(call.udata_in[10..12].try_into().unwrap_or_default());
            if comp_mask != 0 || burst_reserved != 0 {
                return Err(EOPNOTSUPP);
            }
        }
        let cur = if mask & qp_attr::CUR_STATE != 0 {
            req.cur_qp_state
        } else {
            qp.state
        };
        let new = if mask & qp_attr::STATE != 0 { req.qp_state } else { cur };
        // core/verbs.c:1692 ib_modify_qp_is_ok (hw/mlx5/qp.c:4680): the transition and the
        // attributes it requires and allows.
        if !modify_is_ok(cur, new, qp.qp_type, mask) {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:4289 __mlx5_ib_modify_qp: a transition with no firmware command in
        // `optab` is EINVAL. Of those ib_modify_qp_is_ok allows, that is RTS -> SQD: mlx5 has
        // no RTS2SQD (only SQD -> RTS, for a QP already in SQD).
        if (cur, new) == (qps::RTS, qps::SQD) {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:4701 mlx5_ib_modify_qp, qp.c:4603, :4610 validate_rd_atomic: pkey index
        // beyond the table, and RDMA read depths beyond the device's, are EINVAL.
        if mask & qp_attr::PKEY_INDEX != 0 && req.pkey_index >= caps::PKEY_TABLE_LEN {
            return Err(EINVAL);
        }
        if (mask & qp_attr::MAX_QP_RD_ATOMIC != 0 && req.max_rd_atomic > caps::MAX_RD_ATOMIC)
            || (mask & qp_attr::MAX_DEST_RD_ATOMIC != 0 && req.max_dest_rd_atomic > caps::MAX_RD_ATOMIC)
        {
            return Err(EINVAL);
        }
        // hw/mlx5/qp.c:3498 mlx5_set_path: a GRH whose sgid index is beyond the GID table is
        // EINVAL.
        if mask & qp_attr::AV != 0 && req.dest.is_global != 0 && req.dest.sgid_index >= 1 {
            return Err(EINVAL);
        }
        let _ = mem;
        let qp = self.qps.get_mut(req.qp_handle).ok_or(EINVAL)?;
        let a = &mut qp.attrs;
        if mask & qp_attr::ACCESS_FLAGS != 0 {
            a.access = req.qp_access_flags;
        }
        if mask & qp_attr::PKEY_INDEX != 0 {
            a.pkey_index = req.pkey_index;
        }
        if mask & qp_attr::PORT != 0 {
            a.port_num = req.port_num;
        }
        if mask & qp_attr::QKEY != 0 {
            a.qkey = req.qkey;
        }
        if mask & qp_attr::AV != 0 {
            a.dest = req.dest;
        }
        if mask & qp_attr::PATH_MTU != 0 {
            a.path_mtu = req.path_mtu;
        }
        if mask & qp_attr::TIMEOUT != 0 {
            a.timeout = req.timeout;
        }
        if mask & qp_attr::RETRY_CNT != 0 {
            a.retry_cnt = req.retry_cnt;
        }
        if mask & qp_attr::RNR_RETRY != 0 {
            a.rnr_retry = req.rnr_retry;
        }
        if mask & qp_attr::RQ_PSN != 0 {
            a.rq_psn = req.rq_psn;
        }
        if mask & qp_attr::SQ_PSN != 0 {
            a.sq_psn = req.sq_psn;
        }
        if mask & qp_attr::MAX_QP_RD_ATOMIC != 0 {
            a.max_rd_atomic = req.max_rd_atomic;
        }
        if mask & qp_attr::MAX_DEST_RD_ATOMIC != 0 {
            a.max_dest_rd_atomic = req.max_dest_rd_atomic;
        }
        if mask & qp_attr::MIN_RNR_TIMER != 0 {
            a.min_rnr_timer = req.min_rnr_timer;
        }
        if mask & qp_attr::DEST_QPN != 0 {
            a.dest_qp_num = req.dest_qp_num;
        }
        // hw/mlx5/qp.c:4136-4149 __mlx5_ib_modify_qp: the context's pm_state takes the three
        // known migration states (others leave it as it was); qp.c:4921 reports it back.
        if mask & qp_attr::PATH_MIG_STATE != 0 && req.path_mig_state <= 2 {
            a.path_mig_state = req.path_mig_state;
        }
        if new == qps::RESET || new == qps::ERR {
            qp.epoch = qp.epoch.wrapping_add(1);
        }
        if new == qps::RESET {
            // The hardware forgets its ring positions; user space resets its own.
            qp.sq_ci = 0;
            qp.rq_ci = 0;
            qp.stall = None;
        }
        qp.state = new;
        crate::log!("qp {:#x} state {} -> {}", qp.qpn, cur, new);
        Ok(())
    }

    fn query_qp(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("QUERY_QP", &call.udata_in, call.udata_outlen);
        let req: abi::QueryQp = decode(call.req);
        // core/uverbs_cmd.c:1671: an unknown QP is the lookup's ENOENT.
        let qp = self
            .qps
            .get(req.qp_handle)
            .filter(|q| q.ctx == call.ctx)
            .ok_or(ENOENT)?;
        let a = &qp.attrs;
        // hw/mlx5/qp.c:5026 mlx5_ib_query_qp: user QPs report no send capabilities (user
        // space adds its own); the receive queue as sized.
        let resp = abi::QueryQpResp {
            dest: a.dest,
            max_recv_wr: qp.rq_cnt,
            max_recv_sge: if qp.rq_cnt == 0 {
                0
            } else {
                (1 << qp.rq_shift.min(31)) / 16
            },
            max_inline_data: qp.max_inline,
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.access,
            pkey_index: a.pkey_index,
            qp_state: qp.state,
            cur_qp_state: qp.state,
            path_mtu: a.path_mtu,
            path_mig_state: a.path_mig_state,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            sq_sig_all: u8::from(qp.sq_sig_all),
            ..Default::default()
        };
        call.respond_core(mem, resp.as_bytes())
    }

    fn destroy_qp(&mut self, call: &Call<'_>, mem: &dyn Memory) -> Result<(), Errno> {
        crate::trace::command("DESTROY_QP", &call.udata_in, call.udata_outlen);
        let req: abi::DestroyObj = decode(call.req);
        // core/uverbs_cmd.c:1984 uobj_get_destroy: an unknown QP is the lookup's ENOENT
        // (core/rdma_core.c:325-327).
        let qp = self.qps.get(req.handle).filter(|q| q.ctx == call.ctx).ok_or(ENOENT)?;
        let events = qp.async_events;
        if let Some(qp) = self.qps.remove(req.handle) {
            self.free_bfreg(qp.ctx, qp.bfregn);
            for cq in [qp.send_cq, qp.recv_cq] {
                if let Some(c) = self.cqs.get_mut(cq) {
                    c.users -= 1;
                }
            }
            if let Some(pd) = self.pds.get_mut(qp.pd) {
                pd.users -= 1;
            }
            if let Some(s) = qp.srq.and_then(|h| self.srqs.get_mut(h)) {
                s.users -= 1;
            }
        }
        call.respond_core(mem, &events.to_ne_bytes())
    }

    // ---- ioctl -------------------------------------------------------------------------

    /// The mlx5 UAR object's methods (hw/mlx5/main.c:3505 `UAR_OBJ_ALLOC`, :3577 `DESTROY`),
    /// after [`Model::ioctl`] checked the header and processed the attributes as the core
    /// does (kernel/ioctl.rs).
    fn uar_method(&mut self, ctx: i32, hdr: &abi::IoctlHdr, arg: u64, mem: &dyn Memory) -> Result<(), Errno> {
        let mut attrs = Vec::new();
        for i in 0..u64::from(hdr.num_attrs) {
            let mut ab = [0u8; 16];
            mem.read(arg + 24 + 16 * i, &mut ab).map_err(|_| EFAULT)?;
            attrs.push(decode::<abi::IoctlAttr>(&ab));
        }
        let find = |id: u16| attrs.iter().position(|a| a.attr_id == id);
        // Unknown mandatory attributes are EPROTONOSUPPORT (core/uverbs_ioctl.c:402-403).
        let known: &[u16] = if hdr.method_id == abi::uar_obj::METHOD_ALLOC {
            &[
                abi::uar_obj::ATTR_HANDLE,
                abi::uar_obj::ATTR_TYPE,
                abi::uar_obj::ATTR_MMAP_OFFSET,
                abi::uar_obj::ATTR_MMAP_LENGTH,
                abi::uar_obj::ATTR_PAGE_ID,
            ]
        } else {
            &[abi::uar_obj::ATTR_HANDLE]
        };
        if attrs
            .iter()
            .any(|a| !known.contains(&a.attr_id) && a.flags & abi::ATTR_F_MANDATORY != 0)
        {
            return Err(EPROTONOSUPPORT);
        }
        let handle_at = find(abi::uar_obj::ATTR_HANDLE).ok_or(EINVAL)?;
        if hdr.method_id == abi::uar_obj::METHOD_DESTROY {
            let h = attrs[handle_at].data;
            let h = u32::try_from(h).map_err(|_| EINVAL)?;
            self.uars.get(h).filter(|u| u.ctx == ctx).ok_or(ENOENT)?;
            self.uars.remove(h);
            return Ok(());
        }
        let type_at = find(abi::uar_obj::ATTR_TYPE).ok_or(EINVAL)?;
        let alloc_type = attrs[type_at].data;
        // hw/mlx5/main.c:3526, :3530 UAR_OBJ_ALLOC: unknown types, and BlueFlame without write
        // combining, are EOPNOTSUPP.
        if alloc_type != abi::uar_obj::TYPE_BF && alloc_type != abi::uar_obj::TYPE_NC {
            return Err(EOPNOTSUPP);
        }
        if alloc_type == abi::uar_obj::TYPE_BF && !crate::wc_support() {
            return Err(EOPNOTSUPP);
        }
        let outs = [
            abi::uar_obj::ATTR_MMAP_OFFSET,
            abi::uar_obj::ATTR_MMAP_LENGTH,
            abi::uar_obj::ATTR_PAGE_ID,
        ]
        .map(|id| find(id).ok_or(EINVAL));
        let [off_at, len_at, page_at] = [outs[0]?, outs[1]?, outs[2]?];
        let page_id = self.next_uar_page;
        let n = u64::try_from(self.uars.iter().count()).unwrap_or(0);
        // Dynamic mmap entries live at internal page offsets from MLX5_IB_MMAP_OFFSET_START <<
        // 16 (hw/mlx5/main.c:3340-3343); the client is told the offset
        // `mlx5_entry_to_mmap_offset` makes of one (main.c:2297-2304, :3538).
        let mut pgoff = (abi::mmap_cmd::OFFSET_START << 16) + n;
        while self.uars.iter().any(|(_, u)| u.ctx == ctx && u.pgoff == pgoff) {
            pgoff += 1;
        }
        let handle = self.uars.insert(Uar { ctx, pgoff, page_id });
        let write_out = |at: usize, value: &[u8]| -> Result<(), Errno> {
            let a = &attrs[at];
            let len = usize::from(a.len).min(value.len());
            mem.write(a.data, &value[..len]).map_err(|_| EFAULT)?;
            let flags = a.flags | abi::ATTR_F_VALID_OUTPUT;
            mem.write(arg + 24 + 16 * at as u64 + 4, &flags.to_ne_bytes())
                .map_err(|_| EFAULT)
        };
        let result = mem
            .write(arg + 24 + 16 * handle_at as u64 + 8, &u64::from(handle).to_ne_bytes())
            .map_err(|_| EFAULT)
            .and_then(|()| write_out(off_at, &(entry_mmap_pgoff(pgoff) * PAGE_SIZE).to_ne_bytes()))
            .and_then(|()| write_out(page_at, &page_id.to_ne_bytes()))
            .and_then(|()| write_out(len_at, &(PAGE_SIZE as u32).to_ne_bytes()));
        match result {
            Ok(()) => {
                self.next_uar_page += 1;
                crate::log!(
                    "uar alloc page {page_id} offset {:#x}",
                    entry_mmap_pgoff(pgoff) * PAGE_SIZE
                );
                Ok(())
            }
            Err(e) => {
                self.uars.remove(handle);
                Err(e)
            }
        }
    }

    /// Checks an `mmap` of `len` bytes at page offset `pgoff` on the device file (main.c:2306
    /// `mlx5_ib_mmap`); the caller then maps the page and reports a UAR with
    /// [`Model::mapped`].
    pub fn check_mmap(&self, ctx: i32, pgoff: u64, len: u64, access: MapAccess) -> Result<Mapping, Errno> {
        let c = self.contexts.get(&ctx).filter(|c| c.alive).ok_or(EINVAL)?;
        // hw/mlx5/main.c:2054 get_command, :2070 get_extended_index.
        let command = (pgoff >> 8) & 0xff;
        let index = (pgoff & 0xff) | (((pgoff >> 16) & 0xff) << 8);
        match command {
            // main.c:2162 uar_mmap: `if (bfregi->lib_uar_dyn) return -EINVAL;`, :2165 exactly
            // one page, :2173 an index within the static pages.
            abi::mmap_cmd::WC_PAGE if crate::wc_support() => self.check_mmap(ctx, pgoff & !0xff00, len, access),
            abi::mmap_cmd::REGULAR_PAGE | abi::mmap_cmd::NC_PAGE => {
                if c.lib_uar_dyn || len != PAGE_SIZE || index >= c.static_uar_pages {
                    return Err(EINVAL);
                }
                Ok(Mapping::Uar)
            }
            // main.c:2318: WC pages need write combining: EPERM without it (with it, a WC
            // page is a static UAR page as above).
            abi::mmap_cmd::WC_PAGE | abi::mmap_cmd::ALLOC_WC => Err(libc::EPERM),
            // main.c:2325.
            abi::mmap_cmd::GET_CONTIGUOUS_PAGES => Err(libc::ENOSYS),
            // main.c:2327: one page (:2328), never writable (:2331); 4 KiB pages (:2336).
            abi::mmap_cmd::CORE_CLOCK => {
                if len != PAGE_SIZE {
                    return Err(EINVAL);
                }
                if access.write {
                    return Err(libc::EPERM);
                }
                Ok(Mapping::CoreClock)
            }
            // main.c:2096 mlx5_ib_mmap_clock_info_page: one shared page (:2100), index V1
            // (:2104), neither writable nor executable (:2107), and only where the device has
            // a clock info page (:2111).
            abi::mmap_cmd::CLOCK_INFO => {
                if len != PAGE_SIZE || !access.shared {
                    return Err(EINVAL);
                }
                if index != abi::CLOCK_INFO_V1 {
                    return Err(EOPNOTSUPP);
                }
                if access.write || access.exec {
                    return Err(libc::EPERM);
                }
                // No clock info page on the model (`caps::HAS_CLOCK_INFO`).
                Err(EOPNOTSUPP)
            }
            // main.c:2350 -> :2266 mlx5_ib_mmap_offset: every other command names a dynamic
            // entry at internal offset `command << 16 | index` (main.c:2255
            // mlx5_vma_to_pgoff); none there, or another length, is EINVAL (main.c:2279).
            _ => {
                let entry = (command << 16) | index;
                self.uars
                    .iter()
                    .find(|(_, u)| u.ctx == ctx && u.pgoff == entry)
                    .ok_or(EINVAL)?;
                if len == PAGE_SIZE {
                    Ok(Mapping::Uar)
                } else {
                    Err(EINVAL)
                }
            }
        }
    }

    /// hw/mlx5/qp.c:751 `mlx5_ib_free_bfreg`.
    fn free_bfreg(&mut self, ctx: i32, bfregn: Option<u32>) {
        let count = bfregn.and_then(|n| self.contexts.get_mut(&ctx)?.bfreg_count.get_mut(n as usize));
        if let Some(count) = count {
            *count = count.saturating_sub(1);
        }
    }

    /// A UAR page of context `ctx` is now mapped at `addr`.
    pub fn mapped(&mut self, ctx: i32, addr: u64) {
        if let Some(c) = self.contexts.get_mut(&ctx) {
            c.uar_maps.push(addr);
        }
    }

    /// A core clock page is now mapped at `client`, and at `view` for the model to write.
    pub fn mapped_clock(&mut self, client: u64, view: u64) {
        self.clock_pages.push((client, view));
    }

    /// UAR and core clock pages currently mapped.
    pub fn mapped_pages(&self) -> usize {
        self.contexts.values().map(|c| c.uar_maps.len()).sum::<usize>() + self.clock_pages.len()
    }

    /// The client unmapped `[addr, addr + len)`: forget the pages inside it; returns the
    /// views of the clock pages among them, for the caller to unmap.
    pub fn unmapped(&mut self, addr: u64, len: u64) -> Vec<u64> {
        let inside = |p: u64| p >= addr && p < addr.saturating_add(len);
        for c in self.contexts.values_mut() {
            c.uar_maps.retain(|&p| !inside(p));
        }
        let (gone, kept) = self.clock_pages.iter().partition(|&&(client, _)| inside(client));
        self.clock_pages = kept;
        gone.into_iter().map(|(_, view)| view).collect()
    }
}

/// The page offset a client maps the dynamic entry at internal page offset `entry` with
/// (hw/mlx5/main.c:2297 `mlx5_entry_to_mmap_offset`): the command in bits 8-15, the index's low
/// byte in bits 0-7 and its high byte in bits 16-23.
fn entry_mmap_pgoff(entry: u64) -> u64 {
    let command = (entry >> 16) & 0xffff;
    let index = entry & 0xffff;
    ((index >> 8) << 16) | (command << 8) | (index & 0xff)
}

/// hw/mlx5/qp.c:726 `alloc_bfreg` (with qp.c:691 `alloc_high_class_bfreg`, qp.c:706
/// `alloc_med_class_bfreg`; legacy UARs): a free low-latency ("high class") bfreg, else the
/// least used medium one, else bfreg 0 (shared, no BlueFlame); v0 contexts always get 0.
/// Bfreg numbers count only the non-fast-path bfregs: 0 is the first UAR's, the last
/// `num_low_latency_bfregs` are low latency, the ones between medium.
fn alloc_bfreg(c: &mut Context) -> u32 {
    let total = c.bfreg_count.len() as u32;
    let med = total.saturating_sub(c.num_low_latency_bfregs + 1);
    let first_hi = med + 1;
    let mut pick = None;
    if c.ucontext_v2 {
        pick = (first_hi..total).find(|&i| c.bfreg_count[i as usize] == 0);
        if pick.is_none() && med > 0 {
            let mut min = 1;
            for i in 1..first_hi {
                if c.bfreg_count[i as usize] < c.bfreg_count[min as usize] {
                    min = i;
                }
                if c.bfreg_count[min as usize] == 0 {
                    break;
                }
            }
            pick = Some(min);
        }
    }
    let n = pick.unwrap_or(0);
    if let Some(count) = c.bfreg_count.get_mut(n as usize) {
        *count += 1;
    }
    n
}

/// `struct ib_uverbs_resize_cq_resp {cqe, reserved}`.
fn resize_resp(cqe: u32) -> [u8; 8] {
    let mut b = [0; 8];
    b[..4].copy_from_slice(&cqe.to_ne_bytes());
    b
}

/// core/verbs.c:1692 `ib_modify_qp_is_ok` for RC, UC and UD: whether `cur -> next` is a
/// transition and `mask` holds every attribute it requires and no attribute it does not allow.
pub fn modify_is_ok(cur: u8, next: u8, qp_type: u8, mask: u32) -> bool {
    use qp_attr as m;
    let rc = qp_type == abi::qpt::RC;
    if mask & m::CUR_STATE != 0 && !matches!(cur, qps::RTR | qps::RTS | qps::SQD | qps::SQE) {
        return false;
    }
    if qp_type == abi::qpt::UD {
        return ud_modify_is_ok(cur, next, mask);
    }
    let (req, opt) = match (cur, next) {
        (_, qps::RESET) | (_, qps::ERR) => (0, 0),
        (qps::RESET, qps::INIT) => (m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS, 0),
        (qps::INIT, qps::INIT) => (0, m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS),
        (qps::INIT, qps::RTR) => {
            let req = m::AV | m::PATH_MTU | m::DEST_QPN | m::RQ_PSN;
            let opt = m::ALT_PATH | m::ACCESS_FLAGS | m::PKEY_INDEX;
            if rc {
                (req | m::MAX_DEST_RD_ATOMIC | m::MIN_RNR_TIMER, opt)
            } else {
                (req, opt)
            }
        }
        (qps::RTR, qps::RTS) => {
            let opt = m::CUR_STATE | m::ALT_PATH | m::ACCESS_FLAGS | m::PATH_MIG_STATE;
            if rc {
                (
                    m::SQ_PSN | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::MAX_QP_RD_ATOMIC,
                    opt | m::MIN_RNR_TIMER,
                )
            } else {
                (m::SQ_PSN, opt)
            }
        }
        (qps::RTS, qps::RTS) | (qps::SQD, qps::RTS) => {
            let opt = m::CUR_STATE | m::ACCESS_FLAGS | m::ALT_PATH | m::PATH_MIG_STATE;
            (0, if rc { opt | m::MIN_RNR_TIMER } else { opt })
        }
        (qps::RTS, qps::SQD) => (0, m::EN_SQD_ASYNC_NOTIFY),
        (qps::SQE, qps::RTS) if !rc => (0, m::CUR_STATE | m::ACCESS_FLAGS),
        _ => return false,
    };
    mask & req == req && mask & !(req | opt | m::STATE) == 0
}

/// core/verbs.c:1389 `qp_state_table`, the UD column: no path, a Q_Key instead.
fn ud_modify_is_ok(cur: u8, next: u8, mask: u32) -> bool {
    use qp_attr as m;
    let (req, opt) = match (cur, next) {
        (_, qps::RESET) | (_, qps::ERR) => (0, 0),
        // :1395-1397
        (qps::RESET, qps::INIT) => (m::PKEY_INDEX | m::PORT | m::QKEY, 0),
        // :1424-1426
        (qps::INIT, qps::INIT) => (0, m::PKEY_INDEX | m::PORT | m::QKEY),
        // :1445, :1470-1471: nothing required.
        (qps::INIT, qps::RTR) => (0, m::PKEY_INDEX | m::QKEY),
        // :1497, :1515-1516
        (qps::RTR, qps::RTS) => (m::SQ_PSN, m::CUR_STATE | m::QKEY),
        // :1549-1550, :1595-1596, :1675-1676
        (qps::RTS, qps::RTS) | (qps::SQD, qps::RTS) | (qps::SQE, qps::RTS) => (0, m::CUR_STATE | m::QKEY),
        // :1579
        (qps::RTS, qps::SQD) => (0, m::EN_SQD_ASYNC_NOTIFY),
        _ => return false,
    };
    mask & req == req && mask & !(req | opt | m::STATE) == 0
}
