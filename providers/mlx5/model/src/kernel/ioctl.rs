//! `RDMA_VERBS_IOCTL` (uverbs_ioctl.c `ib_uverbs_ioctl`): the header, the attribute array
//! checked against each method's specification (`uverbs_process_attr`), and the core methods
//! the Rust core calls (uverbs_std_types_{device,cq,qp,srq,...}.c, `async_event.c`). Each
//! core method is turned into the write form's core request and runs the same handler as
//! the write() command, so every driver-data rule applies to both; the write form's core
//! response is then copied to the method's output attributes.
//!
//! Simplified against the kernel: objects named by IDR/FD attributes are looked up when the
//! method runs rather than while the attributes are processed (the errno is the same: an
//! unknown handle is ENOENT, a wrong fd EBADF), and a new object's handle is written back
//! once the method succeeded.

use super::{caps, decode, Call, Context, Errno, Host, Model};
use crate::abi::{self, PAGE_SIZE};
use crate::mem::Memory;
use libc::{EBADF, EFAULT, EINVAL, ENOENT, ENOTTY, EOPNOTSUPP, EPROTONOSUPPORT};
use std::cell::RefCell;
use zerocopy::IntoBytes;

mod srq;

/// `enum uverbs_default_objects`.
pub mod object {
    pub const DEVICE: u16 = 0;
    pub const PD: u16 = 1;
    pub const CQ: u16 = 3;
    pub const QP: u16 = 4;
    pub const SRQ: u16 = 5;
    pub const AH: u16 = 6;
    pub const MR: u16 = 7;
    pub const ASYNC_EVENT: u16 = 16;
}

/// Method ids of the objects above (`ib_user_ioctl_cmds.h`).
pub mod method {
    pub const QUERY_PORT: u16 = 2;
    pub const GET_CONTEXT: u16 = 3;
    pub const QUERY_GID_TABLE: u16 = 5;
    pub const CREATE: u16 = 0;
    pub const DESTROY: u16 = 1;
    /// PD and AH have only a destroy method, numbered 0; MR's destroy is 1, ASYNC_EVENT's
    /// alloc 0.
    pub const DESTROY_ONLY: u16 = 0;
    pub const ASYNC_EVENT_ALLOC: u16 = 0;
}

/// `UVERBS_ATTR_UHW_IN`/`OUT`: the driver's request and response bytes.
pub const UHW_IN: u16 = 0x1000;
pub const UHW_OUT: u16 = 0x1001;

/// `IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS`, what GET_CONTEXT reports.
const CORE_SUPPORT: u64 = 1;

/// How an attribute is passed (`enum uverbs_attr_type` with its size limits).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// A handle (IDR): `len` 0.
    Idr,
    /// A file descriptor: `len` 0.
    Fd,
    /// PTR_IN, CONST_IN, FLAGS_IN: `min..=max` bytes, inline in `data` up to 8.
    In(u16, u16),
    /// PTR_OUT of `min..=max` bytes.
    Out(u16, u16),
}

#[derive(Clone, Copy, Debug)]
struct Spec {
    id: u16,
    kind: Kind,
    mandatory: bool,
}

const fn m(id: u16, kind: Kind) -> Spec {
    Spec {
        id,
        kind,
        mandatory: true,
    }
}

const fn o(id: u16, kind: Kind) -> Spec {
    Spec {
        id,
        kind,
        mandatory: false,
    }
}

/// `UVERBS_ATTR_UHW()`: both optional, any size.
const UHW: [Spec; 2] = [o(UHW_IN, Kind::In(0, u16::MAX)), o(UHW_OUT, Kind::Out(0, u16::MAX))];
const U32_IN: Kind = Kind::In(4, 4);
const U64_IN: Kind = Kind::In(8, 8);
/// `UVERBS_ATTR_CONST_IN`: always a u64.
const CONST_IN: Kind = Kind::In(8, 8);
/// `UVERBS_ATTR_FLAGS_IN`: a u32 or a u64.
const FLAGS_IN: Kind = Kind::In(4, 8);

const GET_CONTEXT: &[Spec] = &[o(0, Kind::Out(4, 4)), o(1, Kind::Out(8, 8)), UHW[0], UHW[1]];
/// `UVERBS_ATTR_STRUCT(struct ib_uverbs_query_port_resp_ex, reserved)`: 48 bytes.
const QUERY_PORT: &[Spec] = &[m(0, CONST_IN), m(1, Kind::Out(48, 48))];
const QUERY_GID_TABLE: &[Spec] = &[
    m(0, CONST_IN),
    o(1, FLAGS_IN),
    m(2, Kind::Out(0, u16::MAX)),
    m(3, Kind::Out(8, 8)),
];
const ASYNC_EVENT_ALLOC: &[Spec] = &[m(0, Kind::Fd)];
const CQ_CREATE: &[Spec] = &[
    m(0, Kind::Idr),
    m(1, U32_IN),
    m(2, U64_IN),
    o(3, Kind::Fd),
    m(4, U32_IN),
    o(5, FLAGS_IN),
    m(6, Kind::Out(4, 4)),
    o(7, Kind::Fd),
    UHW[0],
    UHW[1],
];
/// `struct ib_uverbs_destroy_cq_resp` (8 bytes), `ib_uverbs_destroy_qp_resp` and
/// `ib_uverbs_destroy_srq_resp` (4).
const CQ_DESTROY: &[Spec] = &[m(0, Kind::Idr), m(1, Kind::Out(8, 8))];
const QP_DESTROY: &[Spec] = &[m(0, Kind::Idr), m(1, Kind::Out(4, 4))];
/// `struct ib_uverbs_qp_cap`, 20 bytes in and out.
const QP_CREATE: &[Spec] = &[
    m(0, Kind::Idr),
    o(1, Kind::Idr),
    o(2, Kind::Idr),
    o(3, Kind::Idr),
    o(4, Kind::Idr),
    o(5, Kind::Idr),
    o(6, Kind::Idr),
    m(7, U64_IN),
    m(8, Kind::In(20, 20)),
    m(9, CONST_IN),
    o(10, FLAGS_IN),
    o(11, U32_IN),
    o(12, Kind::Fd),
    m(13, Kind::Out(20, 20)),
    m(14, Kind::Out(4, 4)),
    UHW[0],
    UHW[1],
];
const SRQ_CREATE: &[Spec] = &[
    m(0, Kind::Idr),
    m(1, Kind::Idr),
    o(2, Kind::Idr),
    o(3, Kind::Idr),
    m(4, U64_IN),
    m(5, U32_IN),
    m(6, U32_IN),
    m(7, U32_IN),
    o(8, U32_IN),
    m(9, CONST_IN),
    o(10, Kind::Fd),
    m(11, Kind::Out(4, 4)),
    m(12, Kind::Out(4, 4)),
    o(13, Kind::Out(4, 4)),
    UHW[0],
    UHW[1],
];
const HANDLE_ONLY: &[Spec] = &[m(0, Kind::Idr)];

/// The core methods modelled, by object and method id.
fn core_method(object: u16, method_id: u16) -> Option<&'static [Spec]> {
    use self::method as me;
    Some(match (object, method_id) {
        (object::DEVICE, me::GET_CONTEXT) => GET_CONTEXT,
        (object::DEVICE, me::QUERY_PORT) => QUERY_PORT,
        (object::DEVICE, me::QUERY_GID_TABLE) => QUERY_GID_TABLE,
        (object::ASYNC_EVENT, me::ASYNC_EVENT_ALLOC) => ASYNC_EVENT_ALLOC,
        (object::CQ, me::CREATE) => CQ_CREATE,
        (object::CQ, me::DESTROY) => CQ_DESTROY,
        (object::QP, me::CREATE) => QP_CREATE,
        (object::QP, me::DESTROY) => QP_DESTROY,
        (object::SRQ, me::CREATE) => SRQ_CREATE,
        (object::SRQ, me::DESTROY) => QP_DESTROY,
        (object::PD, me::DESTROY_ONLY) | (object::AH, me::DESTROY_ONLY) | (object::MR, me::DESTROY) => HANDLE_ONLY,
        _ => return None,
    })
}

/// The attributes of one call, checked against the method's specification.
struct Bundle {
    /// Address of the attribute array in the client.
    at: u64,
    /// `(position in the array, attribute)` of each attribute the method knows.
    attrs: Vec<(usize, abi::IoctlAttr)>,
}

impl Bundle {
    /// uverbs_ioctl.c `uverbs_set_attr`/`uverbs_process_attr` and the mandatory check.
    fn parse(mem: &dyn Memory, arg: u64, num: u16, specs: &[Spec]) -> Result<Self, Errno> {
        let at = arg + 24;
        let mut attrs: Vec<(usize, abi::IoctlAttr)> = Vec::new();
        for i in 0..usize::from(num) {
            let mut ab = [0u8; 16];
            mem.read(at + 16 * i as u64, &mut ab).map_err(|_| EFAULT)?;
            let a: abi::IoctlAttr = decode(&ab);
            // An attribute the method does not have: an error only when marked mandatory.
            let Some(spec) = specs.iter().find(|s| s.id == a.attr_id) else {
                if a.flags & abi::ATTR_F_MANDATORY != 0 {
                    return Err(EPROTONOSUPPORT);
                }
                continue;
            };
            // The same attribute twice is EINVAL.
            if attrs.iter().any(|(_, b)| b.attr_id == a.attr_id) {
                return Err(EINVAL);
            }
            // `attr_data.reserved` must be zero (no enum attributes here).
            if a.attr_data != 0 {
                return Err(EINVAL);
            }
            match spec.kind {
                // IDR and FD attributes carry their value in `data`, with `len` 0.
                Kind::Idr | Kind::Fd if a.len != 0 => return Err(EINVAL),
                // `if (uattr->len < min_len || uattr->len > len) return -EINVAL;`
                Kind::In(min, max) | Kind::Out(min, max) if a.len < min || a.len > max => return Err(EINVAL),
                _ => {}
            }
            attrs.push((i, a));
        }
        // A mandatory attribute missing is EINVAL.
        if specs
            .iter()
            .any(|s| s.mandatory && !attrs.iter().any(|(_, a)| a.attr_id == s.id))
        {
            return Err(EINVAL);
        }
        Ok(Self { at, attrs })
    }

    fn get(&self, id: u16) -> Option<(usize, abi::IoctlAttr)> {
        self.attrs.iter().find(|(_, a)| a.attr_id == id).copied()
    }

    fn has(&self, id: u16) -> bool {
        self.get(id).is_some()
    }

    /// The bytes of an input attribute (inline up to 8 bytes, else copied in).
    fn input(&self, mem: &dyn Memory, id: u16) -> Result<Option<Vec<u8>>, Errno> {
        let Some((_, a)) = self.get(id) else {
            return Ok(None);
        };
        let len = usize::from(a.len);
        if len <= 8 {
            return Ok(Some(a.data.to_ne_bytes()[..len].to_vec()));
        }
        let mut bytes = vec![0u8; len];
        mem.read(a.data, &mut bytes).map_err(|_| EFAULT)?;
        Ok(Some(bytes))
    }

    /// A u32 or u64 input (`uverbs_copy_from` of a fixed-size attribute).
    fn number(&self, mem: &dyn Memory, id: u16) -> Result<Option<u64>, Errno> {
        Ok(self.input(mem, id)?.map(|b| {
            let mut v = [0u8; 8];
            v[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
            u64::from_ne_bytes(v)
        }))
    }

    /// `uverbs_get_flags32`/`64`: absent is 0, bits outside `allowed` are EINVAL.
    fn flags(&self, mem: &dyn Memory, id: u16, allowed: u64) -> Result<u64, Errno> {
        let v = self.number(mem, id)?.unwrap_or(0);
        if v & !allowed != 0 {
            return Err(EINVAL);
        }
        Ok(v)
    }

    /// A handle (IDR attribute): `None` when absent. Handles beyond 32 bits name nothing.
    fn handle(&self, id: u16) -> Option<Result<u32, Errno>> {
        self.get(id).map(|(_, a)| u32::try_from(a.data).map_err(|_| ENOENT))
    }

    /// An fd attribute: `None` when absent.
    fn fd(&self, id: u16) -> Option<i32> {
        self.get(id).map(|(_, a)| a.data as i64 as i32)
    }

    /// `uverbs_copy_to`: `min(len, bytes)` bytes, then `UVERBS_ATTR_F_VALID_OUTPUT`. Absent
    /// optional outputs are skipped.
    fn output(&self, mem: &dyn Memory, id: u16, bytes: &[u8]) -> Result<(), Errno> {
        let Some((i, a)) = self.get(id) else {
            return Ok(());
        };
        let n = usize::from(a.len).min(bytes.len());
        mem.write(a.data, &bytes[..n]).map_err(|_| EFAULT)?;
        self.set_valid(mem, i, a)
    }

    /// `uverbs_copy_to_struct_or_zero`: as [`Bundle::output`], zeroing what the client's
    /// buffer has beyond the struct.
    fn output_or_zero(&self, mem: &dyn Memory, id: u16, bytes: &[u8]) -> Result<(), Errno> {
        if let Some((_, a)) = self.get(id) {
            if usize::from(a.len) > bytes.len() {
                let zeros = vec![0u8; usize::from(a.len) - bytes.len()];
                mem.write(a.data + bytes.len() as u64, &zeros).map_err(|_| EFAULT)?;
            }
        }
        self.output(mem, id, bytes)
    }

    fn set_valid(&self, mem: &dyn Memory, i: usize, a: abi::IoctlAttr) -> Result<(), Errno> {
        let flags = a.flags | abi::ATTR_F_VALID_OUTPUT;
        mem.write(self.at + 16 * i as u64 + 4, &flags.to_ne_bytes())
            .map_err(|_| EFAULT)
    }

    /// Writes a new object's handle or fd into the attribute's `data`.
    fn set_data(&self, mem: &dyn Memory, id: u16, value: u64) -> Result<(), Errno> {
        let Some((i, _)) = self.get(id) else {
            return Err(EINVAL);
        };
        mem.write(self.at + 16 * i as u64 + 8, &value.to_ne_bytes())
            .map_err(|_| EFAULT)
    }

    /// The method's driver data as a [`Call`] around the write form's core request `req`
    /// (`uverbs_fill_udata`: an absent UHW_OUT is a NULL buffer of length 0).
    fn call<'a>(&self, mem: &dyn Memory, ctx: i32, req: &'a [u8]) -> Result<Call<'a>, Errno> {
        let udata_in = self.input(mem, UHW_IN)?.unwrap_or_default();
        let (udata_out, udata_outlen) = self.get(UHW_OUT).map_or((0, 0), |(_, a)| (a.data, usize::from(a.len)));
        Ok(Call {
            ctx,
            req,
            response: 0,
            udata_in,
            udata_out,
            udata_outlen,
            core_out: Some(RefCell::new(Vec::new())),
        })
    }

    /// After a method with driver data succeeded: UHW_OUT is marked written
    /// (`ib_uverbs_run_method`).
    fn driver_written(&self, mem: &dyn Memory) -> Result<(), Errno> {
        match self.get(UHW_OUT) {
            Some((i, a)) => self.set_valid(mem, i, a),
            None => Ok(()),
        }
    }
}

/// The write form's core response a handler left in `call`.
fn core_resp<T: zerocopy::FromBytes>(call: &Call<'_>) -> T {
    decode(&call.core_out.as_ref().map(|c| c.borrow().clone()).unwrap_or_default())
}

impl Model {
    /// `ioctl(fd, request, arg)` on the device file: `RDMA_VERBS_IOCTL` with the core
    /// methods above and mlx5's UAR object; every other method is EPROTONOSUPPORT, as a
    /// kernel without it answers (libibverbs then falls back to write()).
    pub fn ioctl(&mut self, ctx: i32, request: u64, arg: u64, mem: &dyn Memory, host: &dyn Host) -> Result<(), Errno> {
        if request != abi::RDMA_VERBS_IOCTL {
            return Err(ENOTTY);
        }
        let mut hb = [0u8; 24];
        mem.read(arg, &mut hb).map_err(|_| EFAULT)?;
        let hdr: abi::IoctlHdr = decode(&hb);
        // `if (hdr.length > PAGE_SIZE || hdr.length != struct_size(&hdr, attrs, num_attrs))
        // return -EINVAL;`
        if u64::from(hdr.length) > PAGE_SIZE || usize::from(hdr.length) != 24 + 16 * usize::from(hdr.num_attrs) {
            return Err(EINVAL);
        }
        // `if (hdr.reserved1 || hdr.reserved2) return -EPROTONOSUPPORT;`
        if hdr.reserved1 != 0 || hdr.reserved2 != 0 {
            return Err(EPROTONOSUPPORT);
        }
        let is_uar = hdr.object_id == abi::uar_obj::OBJECT
            && matches!(hdr.method_id, abi::uar_obj::METHOD_ALLOC | abi::uar_obj::METHOD_DESTROY);
        let specs = core_method(hdr.object_id, hdr.method_id);
        if !is_uar && specs.is_none() {
            crate::log!(
                "ioctl object {:#x} method {:#x} not modelled",
                hdr.object_id,
                hdr.method_id
            );
            return Err(EPROTONOSUPPORT);
        }
        // The driver id must be the device's (docs/kernel-facts.md).
        if hdr.driver_id != abi::RDMA_DRIVER_MLX5 {
            return Err(EINVAL);
        }
        let getting_context = hdr.object_id == object::DEVICE && hdr.method_id == method::GET_CONTEXT;
        // Every method but GET_CONTEXT needs the ucontext (`ib_uverbs_get_ucontext`: EINVAL,
        // EIO once the device is gone).
        if !getting_context && !self.contexts.get(&ctx).is_some_and(|c| c.alive) {
            return Err(EINVAL);
        }
        let Some(specs) = specs else {
            return self.uar_method(ctx, &hdr, arg, mem);
        };
        let b = Bundle::parse(mem, arg, hdr.num_attrs, specs)?;
        crate::log!("ioctl object {} method {}", hdr.object_id, hdr.method_id);
        let result = match (hdr.object_id, hdr.method_id) {
            (object::DEVICE, method::GET_CONTEXT) => self.ioctl_get_context(ctx, &b, mem),
            (object::DEVICE, method::QUERY_PORT) => self.ioctl_query_port(ctx, &b, mem),
            (object::DEVICE, method::QUERY_GID_TABLE) => self.ioctl_query_gid_table(&b, mem),
            (object::ASYNC_EVENT, _) => self.ioctl_async_event_alloc(ctx, &b, mem, host),
            (object::CQ, method::CREATE) => self.ioctl_create_cq(ctx, &b, mem),
            (object::QP, method::CREATE) => self.ioctl_create_qp(ctx, &b, mem),
            (object::SRQ, method::CREATE) => self.ioctl_create_srq(ctx, &b, mem),
            (object::CQ | object::QP | object::SRQ, _) => self.ioctl_destroy(ctx, hdr.object_id, &b, mem),
            _ => self.ioctl_destroy_plain(ctx, hdr.object_id, &b),
        };
        if let Err(e) = result {
            crate::log!("ioctl object {} method {} -> errno {e}", hdr.object_id, hdr.method_id);
        }
        result
    }

    /// uverbs_std_types_device.c `UVERBS_METHOD_GET_CONTEXT`: the two optional outputs,
    /// then the driver's `alloc_ucontext`. Unlike the write form it makes no async event fd
    /// (ASYNC_EVENT_ALLOC does).
    fn ioctl_get_context(&mut self, ctx: i32, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        // ib_alloc_ucontext: a file that has a ucontext already is EINVAL.
        if self.contexts.get(&ctx).is_some_and(|c| c.alive) {
            return Err(EINVAL);
        }
        b.output(mem, 0, &caps::NUM_COMP_VECTORS.to_ne_bytes())?;
        b.output(mem, 1, &CORE_SUPPORT.to_ne_bytes())?;
        let call = b.call(mem, ctx, &[])?;
        let fresh = self.alloc_ucontext(&call, mem)?;
        b.driver_written(mem)?;
        let c = self.contexts.entry(ctx).or_default();
        *c = Context {
            async_sink: c.async_sink.take(),
            async_fd: c.async_fd,
            async_fds: std::mem::take(&mut c.async_fds),
            uar_maps: std::mem::take(&mut c.uar_maps),
            ..fresh
        };
        Ok(())
    }

    /// `UVERBS_METHOD_QUERY_PORT`: the write form's port attributes as
    /// `ib_uverbs_query_port_resp_ex` (`port_cap_flags2` 0).
    fn ioctl_query_port(&mut self, ctx: i32, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        // uverbs_get_const into a u8: a value beyond it is EINVAL.
        let port = b.number(mem, 0)?.unwrap_or(0);
        let port = u8::try_from(port).map_err(|_| EINVAL)?;
        let req = abi::QueryPort {
            response: 0,
            port_num: port,
            reserved: [0; 7],
        };
        let call = b.call(mem, ctx, req.as_bytes())?;
        self.query_port(&call, mem)?;
        let legacy: abi::QueryPortResp = core_resp(&call);
        let mut resp = legacy.as_bytes().to_vec();
        resp.resize(48, 0);
        b.output_or_zero(mem, 1, &resp)
    }

    /// The port's GID table: on an InfiniBand port, GID 0 is the link-local prefix and the
    /// port GUID (the node GUID here, as sysfs `ports/1/gids/0` shows), type IB, no netdev.
    pub fn gid_table(&self) -> Vec<abi::GidEntry> {
        let mut gid = [0u8; 16];
        gid[..8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
        gid[8..].copy_from_slice(&self.node_guid.to_be_bytes());
        vec![abi::GidEntry {
            gid,
            gid_index: 0,
            port_num: 1,
            gid_type: 0,
            netdev_ifindex: 0,
        }]
    }

    /// `UVERBS_METHOD_QUERY_GID_TABLE`: flags must be 0; the entries buffer a whole number of
    /// entries of the caller's size, at least one; fewer slots than valid GIDs is EINVAL
    /// (`rdma_query_gid_table`); each entry copied at the caller's size, zero-padded.
    fn ioctl_query_gid_table(&mut self, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        b.flags(mem, 1, 0)?;
        let entry_size = b.number(mem, 0)?.unwrap_or(0);
        if entry_size == 0 {
            return Err(EINVAL);
        }
        let len = b.get(2).map_or(0, |(_, a)| u64::from(a.len));
        if len % entry_size != 0 || len / entry_size == 0 {
            return Err(EINVAL);
        }
        let table = self.gid_table();
        if (table.len() as u64) > len / entry_size {
            return Err(EINVAL);
        }
        let mut bytes = Vec::new();
        for e in &table {
            let mut entry = e.as_bytes().to_vec();
            entry.resize(entry_size as usize, 0);
            bytes.extend_from_slice(&entry);
        }
        b.output(mem, 2, &bytes)?;
        b.output(mem, 3, &(table.len() as u64).to_ne_bytes())
    }

    /// async_event.c `UVERBS_METHOD_ASYNC_EVENT_ALLOC`: a new event fd; the first becomes the
    /// context's default, where events go.
    fn ioctl_async_event_alloc(
        &mut self,
        ctx: i32,
        b: &Bundle,
        mem: &dyn Memory,
        host: &dyn Host,
    ) -> Result<(), Errno> {
        let (fd, sink) = host.event_fd()?;
        if let Err(e) = b.set_data(mem, 0, fd as u64) {
            host.close_fd(fd);
            return Err(e);
        }
        let c = self.contexts.get_mut(&ctx).ok_or(EINVAL)?;
        c.async_fds.push(fd);
        if c.async_fd.is_none() {
            c.async_fd = Some(fd);
            c.async_sink = Some(sink);
        }
        Ok(())
    }

    /// An EVENT_FD attribute must name one of the context's async event fds: EBADF
    /// otherwise (the fd's file is not an async event file).
    fn check_event_fd(&self, ctx: i32, b: &Bundle, id: u16) -> Result<(), Errno> {
        match b.fd(id) {
            Some(fd) if !self.contexts.get(&ctx).is_some_and(|c| c.async_fds.contains(&fd)) => Err(EBADF),
            _ => Ok(()),
        }
    }

    /// uverbs_std_types_cq.c `UVERBS_METHOD_CQ_CREATE`, through the write form's handler.
    fn ioctl_create_cq(&mut self, ctx: i32, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        let comp_vector = b.number(mem, 4)?.unwrap_or(0) as u32;
        let cqe = b.number(mem, 1)?.unwrap_or(0) as u32;
        let user_handle = b.number(mem, 2)?.unwrap_or(0);
        // IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION | IGNORE_OVERRUN; mlx5 needs capabilities
        // for both that this device lacks (EOPNOTSUPP from mlx5_ib_create_cq).
        if b.flags(mem, 5, 0b11)? != 0 {
            return Err(EOPNOTSUPP);
        }
        self.check_event_fd(ctx, b, 7)?;
        let req = abi::CreateCq {
            response: 0,
            user_handle,
            cqe,
            comp_vector,
            comp_channel: b.fd(3).unwrap_or(-1),
            reserved: 0,
        };
        let call = b.call(mem, ctx, req.as_bytes())?;
        self.create_cq(&call, mem)?;
        let resp: abi::CreateCqResp = core_resp(&call);
        let out = b
            .set_data(mem, 0, u64::from(resp.cq_handle))
            .and_then(|()| b.output(mem, 6, &resp.cqe.to_ne_bytes()))
            .and_then(|()| b.driver_written(mem));
        if out.is_err() {
            self.cqs.remove(resp.cq_handle);
        }
        out
    }

    /// uverbs_std_types_qp.c `UVERBS_METHOD_QP_CREATE`: the attribute rules of the ioctl
    /// form, then the write form's handler.
    fn ioctl_create_qp(&mut self, ctx: i32, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        let cap_bytes = b.input(mem, 8)?.unwrap_or_default();
        let cap = |i: usize| u32::from_ne_bytes(cap_bytes[4 * i..4 * i + 4].try_into().unwrap_or_default());
        let user_handle = b.number(mem, 7)?.unwrap_or(0);
        let qp_type = u32::try_from(b.number(mem, 9)?.unwrap_or(0)).map_err(|_| EINVAL)?;
        const XRC_TGT: u32 = 10;
        match qp_type {
            // XRC targets take an XRCD and no CQs or PD; the model has no XRCDs.
            XRC_TGT => {
                return Err(if [5, 4, 2, 6].iter().any(|&id| b.has(id)) {
                    EINVAL
                } else {
                    ENOENT
                })
            }
            // RC, UC, UD, RAW_PACKET, XRC_INI, DRIVER.
            2 | 3 | 4 | 8 | 9 | 0xff => {}
            _ => return Err(EINVAL),
        }
        if b.has(1) || (b.has(3) && qp_type == 9) {
            return Err(EINVAL);
        }
        // `uverbs_attr_get_obj`: an absent or unknown PD/CQ is ENOENT; the model has no
        // indirection tables or SRQs, so naming one is ENOENT too.
        let owned_pd = |h: u32| self.pds.get(h).is_some_and(|p| p.ctx == ctx);
        let owned_cq = |h: u32| self.cqs.get(h).is_some_and(|c| c.ctx == ctx);
        let pd = b.handle(2).ok_or(ENOENT)??;
        if !owned_pd(pd) || b.has(6) {
            return Err(ENOENT);
        }
        let send_cq = b.handle(4).ok_or(ENOENT)??;
        if !owned_cq(send_cq) {
            return Err(ENOENT);
        }
        let recv_cq = match b.handle(5) {
            Some(h) => h?,
            None if qp_type == 9 => send_cq,
            None => return Err(ENOENT),
        };
        if !owned_cq(recv_cq) {
            return Err(ENOENT);
        }
        const SQ_SIG_ALL: u64 = 1 << 12;
        let flags = b.flags(mem, 10, (1 << 1) | (1 << 8) | (1 << 9) | (1 << 11) | SQ_SIG_ALL)?;
        // check_creation_flags: creation flags beyond SQ_SIG_ALL only for UD and raw
        // packet QPs.
        if flags & !SQ_SIG_ALL != 0 && !matches!(qp_type, 4 | 8 | 0xff) {
            return Err(EINVAL);
        }
        if b.has(11) {
            // A source QPN (IB_QP_CREATE_SOURCE_QPN) is for UD QPs, which the model lacks.
            return Err(EOPNOTSUPP);
        }
        let srq = b.handle(3).transpose()?;
        self.check_event_fd(ctx, b, 12)?;
        let req = abi::CreateQp {
            response: 0,
            user_handle,
            pd_handle: pd,
            send_cq_handle: send_cq,
            recv_cq_handle: recv_cq,
            srq_handle: srq.unwrap_or(0),
            max_send_wr: cap(0),
            max_recv_wr: cap(1),
            max_send_sge: cap(2),
            max_recv_sge: cap(3),
            max_inline_data: cap(4),
            sq_sig_all: u8::from(flags & SQ_SIG_ALL != 0),
            // Only the types checked above reach here; the write handler refuses all but RC
            // and UC (EOPNOTSUPP).
            qp_type: qp_type as u8,
            is_srq: u8::from(srq.is_some()),
            reserved: 0,
        };
        let call = b.call(mem, ctx, req.as_bytes())?;
        self.create_qp(&call, mem)?;
        let r: abi::CreateQpResp = core_resp(&call);
        let caps = [
            r.max_send_wr,
            r.max_recv_wr,
            r.max_send_sge,
            r.max_recv_sge,
            r.max_inline_data,
        ];
        let out = b
            .set_data(mem, 0, u64::from(r.qp_handle))
            .and_then(|()| b.output_or_zero(mem, 13, caps.as_bytes()))
            .and_then(|()| b.output(mem, 14, &r.qpn.to_ne_bytes()))
            .and_then(|()| b.driver_written(mem));
        if out.is_err() {
            let undo = abi::DestroyObj {
                response: 0,
                handle: r.qp_handle,
                reserved: 0,
            };
            if let Ok(call) = b.call(mem, ctx, undo.as_bytes()) {
                let _ = self.destroy_qp(&call, mem);
            }
        }
        out
    }

    /// CQ_DESTROY, QP_DESTROY, SRQ_DESTROY: the write form's handler, its response to
    /// attribute 1.
    fn ioctl_destroy(&mut self, ctx: i32, object: u16, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        let handle = b.handle(0).ok_or(EINVAL)??;
        let req = abi::DestroyObj {
            response: 0,
            handle,
            reserved: 0,
        };
        let call = b.call(mem, ctx, req.as_bytes())?;
        match object {
            object::CQ => self.destroy_cq(&call, mem)?,
            object::QP => self.destroy_qp(&call, mem)?,
            _ => self.destroy_srq(&call, mem)?,
        }
        let resp = call.core_out.as_ref().map(|c| c.borrow().clone()).unwrap_or_default();
        b.output(mem, 1, &resp)
    }

    /// PD_DESTROY, MR_DESTROY, AH_DESTROY (no response).
    fn ioctl_destroy_plain(&mut self, ctx: i32, object: u16, b: &Bundle) -> Result<(), Errno> {
        let handle = b.handle(0).ok_or(EINVAL)??;
        let req = abi::HandleOnly { handle };
        let call = Call {
            ctx,
            req: req.as_bytes(),
            response: 0,
            udata_in: Vec::new(),
            udata_out: 0,
            udata_outlen: 0,
            core_out: Some(RefCell::new(Vec::new())),
        };
        match object {
            object::PD => self.dealloc_pd(&call),
            object::MR => self.dereg_mr(&call),
            // No AH exists in the model.
            _ => Err(ENOENT),
        }
    }
}
