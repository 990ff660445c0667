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

#![deny(missing_docs, unsafe_code, unsafe_op_in_unsafe_fn, rust_2018_idioms)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod ah;
mod attr;
#[allow(unsafe_code)] // reads ring memory in place, through the provider's pointers
mod batch;
mod context;
mod cq;
mod device;
mod error;
mod event;
#[allow(unsafe_code)] // registers caller memory and hands out views of it
mod mr;
mod netlink;
mod open_enum;
mod parked;
mod pd;
pub mod provider;
#[path = "../providers/mod.rs"]
#[allow(unsafe_code)] // rings and mappings
mod providers;
mod qp;
mod srq;
#[allow(unsafe_code)] // the kernel ABI, its commands, fds and the fork hook
mod sys;
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
pub mod testing;
mod wc;
mod wr;

pub use ah::Ah;
pub use attr::{
    AhAttr, AtomicCap, DeviceAttr, GlobalRoute, LinkLayer, LinkSpeed, LinkWidth, Mtu, PortAttr, PortState, QpAttrMask,
    QpCap, QpState, QpType, SrqAttrMask, Transport,
};
pub use batch::Batch;
pub use context::{open, Context, Gid};
pub use cq::{Cq, CqInit, EventsReported};
pub use device::{devices, DeviceFile, DeviceInfo};
pub use error::{Error, Result, Verb, WrReject};
pub use event::{AsyncEvent, AsyncEventKind, CompChannel, CqEvent, EventTarget};
pub use mr::{AccessFlags, Mr, OutOfBounds};
pub use pd::Pd;
pub use providers::providers;
pub use qp::{ConnectAttr, Qp, QpAttr, QpInfo, QpInit};
pub use srq::{Srq, SrqAttr, SrqInit};
pub use wc::{WcError, WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use wr::{AhRef, RecvWr, Remote, SendFlags, SendOp, SendWr, Sge, UdDest, WrOpcode};
