//! `RDMA_VERBS_IOCTL` (core/uverbs_ioctl.c:613 `ib_uverbs_ioctl`): the header, the attribute
//! array processed against the method's specification as `ib_uverbs_run_method` does
//! (uverbs_ioctl.c:421), and the methods the Rust core and libibverbs call
//! (core/uverbs_std_types_{device,cq,qp,srq,async_fd}.c, core/uverbs_std_types{,_mr}.c, and
//! mlx5's UAR object, hw/mlx5/main.c:3505). Each core method is turned into the write form's
//! core request and runs the same handler as the write() command, so every driver-data rule
//! applies to both; the write form's core response is then copied to the method's output
//! attributes.
//!
//! Citations are lines of Debian 12's `linux-source-6.1` (6.1.192), paths under
//! `drivers/infiniband/`, as in the rest of the model (docs/kernel-facts.md).
//!
//! Simplified against the kernel: a new object's handle is written back once the method
//! succeeded (the kernel writes it while processing the attribute, uverbs_ioctl.c:334); and
//! the model keeps one handle space per object type, so a handle that names an object of
//! another type is ENOENT where 6.1's one handle space per file answers EINVAL
//! (rdma_core.c:393-395).

use super::{decode, Call, Errno, Host, Model};
use crate::abi::{self, uar_obj, PAGE_SIZE};
use crate::mem::Memory;
use libc::{EBADF, EFAULT, EINVAL, ENOENT, ENOTTY, EOPNOTSUPP, EPROTONOSUPPORT};
use std::cell::RefCell;

mod dmabuf;
mod methods;
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
    /// `UVERBS_METHOD_REG_DMABUF_MR` of the MR object.
    pub const REG_DMABUF_MR: u16 = 4;
}

/// `UVERBS_ATTR_UHW_IN`/`OUT`: the driver's request and response bytes.
pub const UHW_IN: u16 = 0x1000;
pub const UHW_OUT: u16 = 0x1001;

/// `IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS`, what GET_CONTEXT reports.
const CORE_SUPPORT: u64 = 1;

/// `IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION`, `IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN`.
const CQ_FLAGS_TIMESTAMP_COMPLETION: u64 = 1 << 0;
const CQ_FLAGS_IGNORE_OVERRUN: u64 = 1 << 1;

/// `enum ib_uverbs_qp_create_flags`.
mod qp_create {
    pub const BLOCK_MULTICAST_LOOPBACK: u64 = 1 << 1;
    pub const SCATTER_FCS: u64 = 1 << 8;
    pub const CVLAN_STRIPPING: u64 = 1 << 9;
    pub const PCI_WRITE_END_PADDING: u64 = 1 << 11;
    pub const SQ_SIG_ALL: u64 = 1 << 12;
}

/// `enum ib_uverbs_qp_type` values the ioctl QP_CREATE tells apart.
mod qpt {
    pub const RC: u32 = 2;
    pub const UC: u32 = 3;
    pub const UD: u32 = 4;
    pub const RAW_PACKET: u32 = 8;
    pub const XRC_INI: u32 = 9;
    pub const XRC_TGT: u32 = 10;
    pub const DRIVER: u32 = 0xff;
}

/// What an IDR attribute of an existing object names.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Obj {
    Pd,
    Cq,
    Qp,
    Mr,
    Uar,
    Srq,
    Ah,
    /// XRCD, RWQ_IND_TBL: the model has none, so every handle names nothing.
    Absent,
}

/// Which file an fd attribute of an existing file names.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FdType {
    CompChannel,
    AsyncEvent,
}

/// How an attribute is passed (`enum uverbs_attr_type` with its size limits and access).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// An IDR or FD attribute with `UVERBS_ACCESS_NEW`: `len` 0; the object is allocated
    /// while the attribute is processed, which needs the ucontext.
    New,
    /// An IDR attribute naming an existing object (`UVERBS_ACCESS_READ` or `_DESTROY`).
    Idr(Obj),
    /// An FD attribute naming an existing file (`UVERBS_ACCESS_READ`).
    Fd(FdType),
    /// PTR_IN, CONST_IN, FLAGS_IN: `min..=max` bytes, inline in `data` up to 8.
    In(u16, u16),
    /// PTR_IN of a `UVERBS_ATTR_STRUCT(type, last)`: at least `min` bytes; bytes beyond the
    /// struct's `size` must be zero.
    InStruct(u16, u16),
    /// PTR_OUT of `min..=max` bytes (a `UVERBS_ATTR_STRUCT` output takes any larger size).
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
/// `UVERBS_ATTR_FLAGS_IN`: 4 to 8 bytes here; `uverbs_get_flags64` takes only 4 or 8.
const FLAGS_IN: Kind = Kind::In(4, 8);

/// core/uverbs_std_types_device.c:433.
const GET_CONTEXT: &[Spec] = &[o(0, Kind::Out(4, 4)), o(1, Kind::Out(8, 8)), UHW[0], UHW[1]];
/// core/uverbs_std_types_device.c:458: the response is `UVERBS_ATTR_STRUCT(struct
/// ib_uverbs_query_port_resp_ex, reserved)`: at least its 48 bytes, any more zeroed.
const QUERY_PORT: &[Spec] = &[m(0, CONST_IN), m(1, Kind::Out(48, u16::MAX))];
/// core/uverbs_std_types_device.c:467.
const QUERY_GID_TABLE: &[Spec] = &[
    m(0, CONST_IN),
    o(1, FLAGS_IN),
    m(2, Kind::Out(0, u16::MAX)),
    m(3, Kind::Out(8, 8)),
];
/// core/uverbs_std_types_async_fd.c:60.
const ASYNC_EVENT_ALLOC: &[Spec] = &[m(0, Kind::New)];
/// core/uverbs_std_types_cq.c:155.
const CQ_CREATE: &[Spec] = &[
    m(0, Kind::New),
    m(1, U32_IN),
    m(2, U64_IN),
    o(3, Kind::Fd(FdType::CompChannel)),
    m(4, U32_IN),
    o(5, FLAGS_IN),
    m(6, Kind::Out(4, 4)),
    o(7, Kind::Fd(FdType::AsyncEvent)),
    UHW[0],
    UHW[1],
];
/// core/uverbs_std_types_cq.c:201, uverbs_std_types_qp.c:360, uverbs_std_types_srq.c:212:
/// `struct ib_uverbs_destroy_cq_resp` (8 bytes), `ib_uverbs_destroy_qp_resp` and
/// `ib_uverbs_destroy_srq_resp` (4).
const CQ_DESTROY: &[Spec] = &[m(0, Kind::Idr(Obj::Cq)), m(1, Kind::Out(8, 8))];
const QP_DESTROY: &[Spec] = &[m(0, Kind::Idr(Obj::Qp)), m(1, Kind::Out(4, 4))];
const SRQ_DESTROY: &[Spec] = &[m(0, Kind::Idr(Obj::Srq)), m(1, Kind::Out(4, 4))];
/// core/uverbs_std_types_qp.c:286: the capabilities are `UVERBS_ATTR_STRUCT(struct
/// ib_uverbs_qp_cap, max_inline_data)`, 20 bytes or more, in and out.
const QP_CREATE: &[Spec] = &[
    m(0, Kind::New),
    o(1, Kind::Idr(Obj::Absent)),
    o(2, Kind::Idr(Obj::Pd)),
    o(3, Kind::Idr(Obj::Srq)),
    o(4, Kind::Idr(Obj::Cq)),
    o(5, Kind::Idr(Obj::Cq)),
    o(6, Kind::Idr(Obj::Absent)),
    m(7, U64_IN),
    m(8, Kind::InStruct(20, 20)),
    m(9, CONST_IN),
    o(10, FLAGS_IN),
    o(11, U32_IN),
    o(12, Kind::Fd(FdType::AsyncEvent)),
    m(13, Kind::Out(20, u16::MAX)),
    m(14, Kind::Out(4, 4)),
    UHW[0],
    UHW[1],
];
/// core/uverbs_std_types_srq.c:146.
const SRQ_CREATE: &[Spec] = &[
    m(0, Kind::New),
    m(1, Kind::Idr(Obj::Pd)),
    o(2, Kind::Idr(Obj::Absent)),
    o(3, Kind::Idr(Obj::Cq)),
    m(4, U64_IN),
    m(5, U32_IN),
    m(6, U32_IN),
    m(7, U32_IN),
    o(8, U32_IN),
    m(9, CONST_IN),
    o(10, Kind::Fd(FdType::AsyncEvent)),
    m(11, Kind::Out(4, 4)),
    m(12, Kind::Out(4, 4)),
    o(13, Kind::Out(4, 4)),
    UHW[0],
    UHW[1],
];
/// core/uverbs_std_types.c:241 (PD), :193 (AH), core/uverbs_std_types_mr.c:365 (MR).
const PD_DESTROY: &[Spec] = &[m(0, Kind::Idr(Obj::Pd))];
const AH_DESTROY: &[Spec] = &[m(0, Kind::Idr(Obj::Ah))];
const MR_DESTROY: &[Spec] = &[m(0, Kind::Idr(Obj::Mr))];
/// core/uverbs_std_types_mr.c:334: the new MR, the PD, offset, length and iova (u64), the
/// fd (a u32 PTR_IN, not an FD attribute), the optional access flags, lkey and rkey out.
const REG_DMABUF_MR: &[Spec] = &[
    m(0, Kind::New),
    m(1, Kind::Idr(Obj::Pd)),
    m(2, U64_IN),
    m(3, U64_IN),
    m(4, U64_IN),
    m(5, U32_IN),
    o(6, FLAGS_IN),
    m(7, Kind::Out(4, 4)),
    m(8, Kind::Out(4, 4)),
];
/// hw/mlx5/main.c:3558 `MLX5_IB_METHOD_UAR_OBJ_ALLOC`, :3577 `_DESTROY`.
const UAR_ALLOC: &[Spec] = &[
    m(uar_obj::ATTR_HANDLE, Kind::New),
    m(uar_obj::ATTR_TYPE, CONST_IN),
    m(uar_obj::ATTR_PAGE_ID, Kind::Out(4, 4)),
    m(uar_obj::ATTR_MMAP_LENGTH, Kind::Out(4, 4)),
    m(uar_obj::ATTR_MMAP_OFFSET, Kind::Out(8, 8)),
];
const UAR_DESTROY: &[Spec] = &[m(uar_obj::ATTR_HANDLE, Kind::Idr(Obj::Uar))];

/// The methods modelled, by object and method id.
fn method_spec(object: u16, method_id: u16) -> Option<&'static [Spec]> {
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
        (object::SRQ, me::DESTROY) => SRQ_DESTROY,
        (object::PD, me::DESTROY_ONLY) => PD_DESTROY,
        (object::AH, me::DESTROY_ONLY) => AH_DESTROY,
        (object::MR, me::DESTROY) => MR_DESTROY,
        (object::MR, me::REG_DMABUF_MR) => REG_DMABUF_MR,
        (uar_obj::OBJECT, uar_obj::METHOD_ALLOC) => UAR_ALLOC,
        (uar_obj::OBJECT, uar_obj::METHOD_DESTROY) => UAR_DESTROY,
        _ => return None,
    })
}

/// The attributes of one call, processed against the method's specification.
struct Bundle {
    /// Address of the attribute array in the client.
    at: u64,
    /// `(position in the array, attribute)` of each attribute the method knows.
    attrs: Vec<(usize, abi::IoctlAttr)>,
}

impl Bundle {
    fn get(&self, id: u16) -> Option<(usize, abi::IoctlAttr)> {
        self.attrs.iter().find(|(_, a)| a.attr_id == id).copied()
    }

    fn has(&self, id: u16) -> bool {
        self.get(id).is_some()
    }

    /// The bytes of an input attribute (inline up to 8 bytes, else copied in: EFAULT).
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

    /// A u32 or u64 input (`uverbs_copy_from` of a fixed-size attribute, `uverbs_get_const`).
    fn number(&self, mem: &dyn Memory, id: u16) -> Result<Option<u64>, Errno> {
        Ok(self.input(mem, id)?.map(|b| {
            let mut v = [0u8; 8];
            v[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
            u64::from_ne_bytes(v)
        }))
    }

    /// `uverbs_get_flags32`/`64` (core/uverbs_ioctl.c:642): absent is 0 (:650-652); a length
    /// other than 4 or 8 (:660-665), or bits outside `allowed` (:667-668), is EINVAL.
    fn flags(&self, mem: &dyn Memory, id: u16, allowed: u64) -> Result<u64, Errno> {
        match self.get(id) {
            None => return Ok(0),
            Some((_, a)) if a.len != 4 && a.len != 8 => return Err(EINVAL),
            Some(_) => {}
        }
        let v = self.number(mem, id)?.unwrap_or(0);
        if v & !allowed != 0 {
            return Err(EINVAL);
        }
        Ok(v)
    }

    /// The handle of an IDR attribute, looked up when the bundle was made: `None` when absent.
    fn handle(&self, id: u16) -> Option<u32> {
        self.get(id).and_then(|(_, a)| u32::try_from(a.data).ok())
    }

    /// An fd attribute, checked when the bundle was made: `None` when absent.
    fn fd(&self, id: u16) -> Option<i32> {
        self.get(id).map(|(_, a)| a.data as i64 as i32)
    }

    /// `uverbs_copy_to` (core/uverbs_ioctl.c:731): `min(len, bytes)` bytes (EFAULT, :741-742),
    /// then `UVERBS_ATTR_F_VALID_OUTPUT` (:744). Absent optional outputs are skipped.
    fn output(&self, mem: &dyn Memory, id: u16, bytes: &[u8]) -> Result<(), Errno> {
        let Some((i, a)) = self.get(id) else {
            return Ok(());
        };
        let n = usize::from(a.len).min(bytes.len());
        mem.write(a.data, &bytes[..n]).map_err(|_| EFAULT)?;
        self.set_valid(mem, i, a)
    }

    /// `uverbs_copy_to_struct_or_zero` (core/uverbs_ioctl.c:810): as [`Bundle::output`],
    /// first zeroing what the client's buffer has beyond the struct (:818-821).
    fn output_or_zero(&self, mem: &dyn Memory, id: u16, bytes: &[u8]) -> Result<(), Errno> {
        if let Some((_, a)) = self.get(id) {
            if usize::from(a.len) > bytes.len() {
                let zeros = vec![0u8; usize::from(a.len) - bytes.len()];
                mem.write(a.data + bytes.len() as u64, &zeros).map_err(|_| EFAULT)?;
            }
        }
        self.output(mem, id, bytes)
    }

    /// `uverbs_set_output` (core/uverbs_ioctl.c:148): the flag written back (EFAULT, :157-159).
    fn set_valid(&self, mem: &dyn Memory, i: usize, a: abi::IoctlAttr) -> Result<(), Errno> {
        let flags = a.flags | abi::ATTR_F_VALID_OUTPUT;
        mem.write(self.at + 16 * i as u64 + 4, &flags.to_ne_bytes())
            .map_err(|_| EFAULT)
    }

    /// Writes a new object's handle or fd into the attribute's `data` (core/uverbs_ioctl.c:334).
    fn set_data(&self, mem: &dyn Memory, id: u16, value: u64) -> Result<(), Errno> {
        let Some((i, _)) = self.get(id) else {
            return Err(EINVAL);
        };
        mem.write(self.at + 16 * i as u64 + 8, &value.to_ne_bytes())
            .map_err(|_| EFAULT)
    }

    /// The method's driver data as a [`Call`] around the write form's core request `req`
    /// (`uverbs_fill_udata`, core/uverbs_ioctl.c:698: an absent UHW_OUT is a NULL buffer of
    /// length 0, :725-727).
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
    /// (core/uverbs_ioctl.c:482-488).
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

/// `uverbs_is_attr_cleared` (core/uverbs_ioctl.c:137): whether the bytes of `a` beyond `size`
/// are zero; bytes that cannot be read count as not cleared (`ib_is_buffer_cleared`).
fn is_cleared(mem: &dyn Memory, a: &abi::IoctlAttr, size: u16) -> bool {
    let (len, size) = (usize::from(a.len), usize::from(size));
    if len <= 8 {
        return a.data.to_ne_bytes()[size.min(8)..len].iter().all(|&b| b == 0);
    }
    let mut rest = vec![0u8; len - size];
    mem.read(a.data + size as u64, &mut rest).is_ok() && rest.iter().all(|&b| b == 0)
}

impl Model {
    /// `ioctl(fd, request, arg)` on the device file: `RDMA_VERBS_IOCTL` with the methods
    /// above; every other method is EPROTONOSUPPORT, as a kernel without it answers
    /// (libibverbs then falls back to write()).
    pub fn ioctl(&mut self, ctx: i32, request: u64, arg: u64, mem: &dyn Memory, host: &dyn Host) -> Result<(), Errno> {
        // core/uverbs_ioctl.c:622-623: another request is -ENOIOCTLCMD, which the VFS
        // (fs/ioctl.c vfs_ioctl) returns as ENOTTY.
        if request != abi::RDMA_VERBS_IOCTL {
            return Err(ENOTTY);
        }
        // core/uverbs_ioctl.c:625-627: the header is copied in (EFAULT).
        let mut hb = [0u8; 24];
        mem.read(arg, &mut hb).map_err(|_| EFAULT)?;
        let hdr: abi::IoctlHdr = decode(&hb);
        // core/uverbs_ioctl.c:629-631: `if (hdr.length > PAGE_SIZE || hdr.length !=
        // struct_size(&hdr, attrs, hdr.num_attrs)) return -EINVAL;`
        if u64::from(hdr.length) > PAGE_SIZE || usize::from(hdr.length) != 24 + 16 * usize::from(hdr.num_attrs) {
            return Err(EINVAL);
        }
        // core/uverbs_ioctl.c:633-634: `if (hdr.reserved1 || hdr.reserved2) return
        // -EPROTONOSUPPORT;`
        if hdr.reserved1 != 0 || hdr.reserved2 != 0 {
            return Err(EPROTONOSUPPORT);
        }
        // core/uverbs_ioctl.c:562-563 ib_uverbs_cmd_verbs: the driver id must be the
        // device's, checked before the method is looked up (docs/kernel-facts.md).
        if hdr.driver_id != abi::RDMA_DRIVER_MLX5 {
            return Err(EINVAL);
        }
        // core/uverbs_ioctl.c:565-570: a method the device does not have is EPROTONOSUPPORT
        // (so is one the model lacks).
        let Some(specs) = method_spec(hdr.object_id, hdr.method_id) else {
            crate::log!(
                "ioctl object {:#x} method {:#x} not modelled",
                hdr.object_id,
                hdr.method_id
            );
            return Err(EPROTONOSUPPORT);
        };
        crate::log!("ioctl object {} method {}", hdr.object_id, hdr.method_id);
        let result = self.bundle(ctx, mem, arg, hdr.num_attrs, specs).and_then(|b| {
            // Destroy methods destroy the object before their handler runs
            // (core/uverbs_ioctl.c:462-472); the model's destroy handlers do both.
            match (hdr.object_id, hdr.method_id) {
                (object::DEVICE, method::GET_CONTEXT) => self.ioctl_get_context(ctx, &b, mem),
                (object::DEVICE, method::QUERY_PORT) => self.ioctl_query_port(ctx, &b, mem),
                (object::DEVICE, method::QUERY_GID_TABLE) => self.ioctl_query_gid_table(ctx, &b, mem),
                (object::ASYNC_EVENT, _) => self.ioctl_async_event_alloc(ctx, &b, mem, host),
                (object::CQ, method::CREATE) => self.ioctl_create_cq(ctx, &b, mem),
                (object::QP, method::CREATE) => self.ioctl_create_qp(ctx, &b, mem),
                (object::SRQ, method::CREATE) => self.ioctl_create_srq(ctx, &b, mem),
                (object::MR, method::REG_DMABUF_MR) => self.ioctl_reg_dmabuf_mr(ctx, &b, mem, host),
                (uar_obj::OBJECT, uar_obj::METHOD_ALLOC) => {
                    // hw/mlx5/main.c:3521-3524: the type is a `uverbs_get_const` into an
                    // enum (an unsigned int): beyond it is EINVAL (core/uverbs_ioctl.c:803).
                    if b.number(mem, uar_obj::ATTR_TYPE)?.unwrap_or(0) > u64::from(u32::MAX) {
                        return Err(EINVAL);
                    }
                    self.uar_method(ctx, &hdr, arg, mem)
                }
                (uar_obj::OBJECT, _) => self.uar_method(ctx, &hdr, arg, mem),
                (object::CQ | object::QP | object::SRQ, _) => self.ioctl_destroy(ctx, hdr.object_id, &b, mem),
                _ => self.ioctl_destroy_plain(ctx, hdr.object_id, &b),
            }
        });
        if let Err(e) = result {
            crate::log!("ioctl object {} method {} -> errno {e}", hdr.object_id, hdr.method_id);
        }
        result
    }

    /// core/uverbs_ioctl.c:421 `ib_uverbs_run_method` up to the handler: the attribute array
    /// copied in, each attribute processed in array order (`uverbs_set_attr`,
    /// `uverbs_process_attr`: sizes checked, objects looked up or allocated), then the
    /// mandatory ones required.
    fn bundle(&self, ctx: i32, mem: &dyn Memory, arg: u64, num: u16, specs: &[Spec]) -> Result<Bundle, Errno> {
        let at = arg + 24;
        // core/uverbs_ioctl.c:440-441: the whole array is copied in first (EFAULT).
        let mut raw = vec![0u8; 16 * usize::from(num)];
        mem.read(at, &mut raw).map_err(|_| EFAULT)?;
        let mut attrs: Vec<(usize, abi::IoctlAttr)> = Vec::new();
        for (i, ab) in raw.chunks_exact(16).enumerate() {
            let a: abi::IoctlAttr = decode(ab);
            // core/uverbs_ioctl.c:397-404: an attribute the method does not have is an
            // error (EPROTONOSUPPORT) only when flagged mandatory.
            let Some(spec) = specs.iter().find(|s| s.id == a.attr_id) else {
                if a.flags & abi::ATTR_F_MANDATORY != 0 {
                    return Err(EPROTONOSUPPORT);
                }
                continue;
            };
            // core/uverbs_ioctl.c:409-410: the same attribute twice is EINVAL.
            if attrs.iter().any(|(_, b)| b.attr_id == a.attr_id) {
                return Err(EINVAL);
            }
            self.process_attr(ctx, mem, spec.kind, &a)?;
            attrs.push((i, a));
        }
        // core/uverbs_ioctl.c:450-453: a mandatory attribute missing is EINVAL.
        if specs
            .iter()
            .any(|s| s.mandatory && !attrs.iter().any(|(_, a)| a.attr_id == s.id))
        {
            return Err(EINVAL);
        }
        Ok(Bundle { at, attrs })
    }

    /// core/uverbs_ioctl.c:238 `uverbs_process_attr` for one attribute of kind `kind`.
    fn process_attr(&self, ctx: i32, mem: &dyn Memory, kind: Kind, a: &abi::IoctlAttr) -> Result<(), Errno> {
        match kind {
            Kind::In(min, max) | Kind::Out(min, max) | Kind::InStruct(min, max) => {
                // :269-272: a struct input longer than the struct must be zero beyond it
                // (EOPNOTSUPP).
                let zero_trailing = matches!(kind, Kind::InStruct(..));
                if zero_trailing && a.len > max && !is_cleared(mem, a, max) {
                    return Err(EOPNOTSUPP);
                }
                // :276-279: `if (uattr->len < min_len || (!zero_trailing && uattr->len >
                // len)) return -EINVAL;`
                if a.len < min || (!zero_trailing && a.len > max) {
                    return Err(EINVAL);
                }
                // :281-283: `attr_data.reserved` must be zero (no enum attributes here).
                if a.attr_data != 0 {
                    return Err(EINVAL);
                }
                Ok(())
            }
            Kind::New | Kind::Idr(_) | Kind::Fd(_) => {
                // :307-311: IDR and FD attributes carry their value in `data`: reserved
                // bits and a length are EINVAL.
                if a.attr_data != 0 || a.len != 0 {
                    return Err(EINVAL);
                }
                // :322-326: the object is looked up or allocated now.
                match kind {
                    Kind::Idr(obj) => self.lookup_idr(ctx, obj, a.data),
                    Kind::Fd(ty) => self.lookup_fd(ctx, ty, a.data),
                    // core/rdma_core.c:265-270 alloc_uobj: a new object needs the ucontext
                    // (core/uverbs_main.c:98-99 ib_uverbs_get_ucontext_file: EINVAL).
                    _ => self.ucontext(ctx),
                }
            }
        }
    }

    /// core/uverbs_main.c:85 `ib_uverbs_get_ucontext_file`: no ucontext is EINVAL (:98-99).
    fn ucontext(&self, ctx: i32) -> Result<(), Errno> {
        if self.contexts.get(&ctx).is_some_and(|c| c.alive) {
            Ok(())
        } else {
            Err(EINVAL)
        }
    }

    /// core/rdma_core.c:309 `lookup_get_idr_uobject`: a negative id is EINVAL (:315-316), one
    /// that names no object of the file ENOENT (:325-327), whether or not it has a ucontext.
    fn lookup_idr(&self, ctx: i32, obj: Obj, id: u64) -> Result<(), Errno> {
        if (id as i64) < 0 {
            return Err(EINVAL);
        }
        let Ok(h) = u32::try_from(id) else {
            return Err(ENOENT);
        };
        let found = match obj {
            Obj::Pd => self.pds.get(h).is_some_and(|o| o.ctx == ctx),
            Obj::Cq => self.cqs.get(h).is_some_and(|o| o.ctx == ctx),
            Obj::Qp => self.qps.get(h).is_some_and(|o| o.ctx == ctx),
            Obj::Mr => self.mrs.get(h).is_some_and(|o| o.ctx == ctx),
            Obj::Uar => self.uars.get(h).is_some_and(|o| o.ctx == ctx),
            Obj::Srq => self.srqs.get(h).is_some_and(|o| o.ctx == ctx),
            Obj::Ah => self.ahs.get(h).is_some_and(|o| o.ctx == ctx),
            Obj::Absent => false,
        };
        if found {
            Ok(())
        } else {
            Err(ENOENT)
        }
    }

    /// core/rdma_core.c:333 `lookup_get_fd_uobject`: an fd beyond an int is EINVAL
    /// (:342-343); one that is not open, not a file of the type, or of another device file
    /// is EBADF (:353-366).
    fn lookup_fd(&self, ctx: i32, ty: FdType, id: u64) -> Result<(), Errno> {
        let fd = i32::try_from(id as i64).map_err(|_| EINVAL)?;
        let found = match ty {
            FdType::CompChannel => self.channels.get(&fd).is_some_and(|(owner, _)| *owner == ctx),
            FdType::AsyncEvent => self.contexts.get(&ctx).is_some_and(|c| c.async_fds.contains(&fd)),
        };
        if found {
            Ok(())
        } else {
            Err(EBADF)
        }
    }
}
