//! Pure-Rust userspace RDMA verbs.
//!
//! This crate drives RDMA devices without libibverbs: it opens `/dev/infiniband/uverbsN`,
//! speaks the kernel's uverbs ABI itself (the `RDMA_VERBS_IOCTL` methods where the kernel has
//! them, framed `write()` commands elsewhere), maps the queue rings the kernel shares, and
//! fills [`WorkCompletion`]s (layout-identical to C `struct ibv_wc`) without locks.
//!
//! The core in `src/` is vendor neutral. Vendor modules live under `providers/`, one folder
//! each, behind the contract in [`provider`]; [`open`] picks the right one for a device.
//!
//! ```no_run
//! # fn main() -> uverbs::Result<()> {
//! let ctx = uverbs::open(None)?; // the first device, with its provider
//! let pd = ctx.alloc_pd()?;
//! let mut cq = ctx.create_cq(256)?;
//! let mut wc = [uverbs::WorkCompletion::default(); 16];
//! let n = cq.poll(&mut wc);
//! # let _ = (pd, n);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs, unsafe_op_in_unsafe_fn, rust_2018_idioms)]

mod ah;
mod attr;
mod context;
mod cq;
mod device;
mod error;
mod event;
mod fork;
mod mr;
mod netlink;
mod open_enum;
mod pd;
pub mod provider;
#[path = "../providers/mod.rs"]
mod providers;
mod qp;
mod srq;
mod sys;
mod wc;
mod wr;

pub use ah::Ah;
pub use attr::{
    AhAttr, AtomicCap, DeviceAttr, GlobalRoute, LinkLayer, LinkSpeed, LinkWidth, Mtu, PortAttr, PortState, QpAttrMask,
    QpCap, QpState, QpType, SrqAttrMask, Transport,
};
pub use context::{open, Context, Gid};
pub use cq::{Batch, Cq, CqInit, EventsReported};
pub use device::{devices, DeviceFile, DeviceInfo};
pub use error::{Error, Result, Verb, WrReject};
pub use event::{AsyncEvent, AsyncEventKind, CompChannel, CqEvent, EventTarget};
pub use mr::{AccessFlags, Mr};
pub use pd::Pd;
pub use providers::providers;
pub use qp::{Qp, QpAttr, QpInfo, QpInit};
pub use srq::{Srq, SrqAttr, SrqInit};
pub use wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use wr::{AhRef, RecvWr, Remote, SendFlags, SendOp, SendWr, Sge, UdDest, WrOpcode};
