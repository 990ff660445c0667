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
//! Connect two RC QPs on one device and move one message (`examples/loopback.rs`; the README
//! says what each default is):
//!
#![doc = concat!("```no_run\n", include_str!("../examples/loopback.rs"), "```")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, unsafe_code, unsafe_op_in_unsafe_fn, rust_2018_idioms)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod ah;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
#[allow(unsafe_code)] // registers the event fds with the reactor
pub mod aio;
mod attr;
#[allow(unsafe_code)] // reads ring memory in place, through the provider's pointers
mod batch;
#[allow(unsafe_code)] // reads send requests in libibverbs' layout through the caller's pointers
mod chain;
pub mod cm;
mod context;
mod cq;
mod device;
mod endpoint;
mod error;
mod event;
mod event_file;
#[allow(unsafe_code)] // one queues object behind two trait-object pointers
mod front_end;
mod held;
mod mcast;
#[allow(unsafe_code)] // registers caller memory and hands out views of it
mod mr;
mod mw;
mod netlink;
mod open_enum;
#[allow(unsafe_code)] // posts the buffers it holds, until their completions
mod owned;
mod parked;
mod pd;
pub mod provider;
// The vendor providers are part of this crate (they implement the contract's `pub(crate)`
// parts), kept in the top-level `providers/` folder so that vendor code is apart from the core.
#[path = "../providers/mod.rs"]
#[allow(unsafe_code)] // rings and mappings
mod providers;
mod qp;
mod remote;
mod srq;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub mod stream;
#[allow(unsafe_code)] // the kernel ABI, its commands, fds and the fork hook
mod sys;
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
pub mod testing;
mod wc;
mod wr;

/// The README's Rust code, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub use ah::Ah;
pub use attr::{
    AhAttr, AtomicCap, DeviceAttr, DeviceAttrEx, GidType, GlobalRoute, LinkLayer, LinkSpeed, LinkWidth, MigState, Mtu,
    PortAttr, PortState, QpAttrMask, QpCap, QpState, QpType, SrqAttrMask, Transport,
};
pub use batch::Batch;
pub use chain::{CAtomicArm, CRdmaArm, CSendArm, CSendWr, CUdArm, SlowDecode};
pub use context::{open, Context, Gid};
pub use cq::{Cq, CqInit, EventsReported};
pub use device::{devices, DeviceFile, DeviceInfo};
pub use endpoint::{Endpoint, PortAddr};
pub use error::{Error, Result, Verb, WrReject};
pub use event::{AsyncEvent, AsyncEventKind, CompChannel, CqEvent, EventTarget};
pub use mr::{AccessFlags, Buf, DmabufMr, LocalAccess, Mr, OutOfBounds, RemoteMr};
pub use mw::{Mw, MwType};
pub use owned::{Completion, Reaped, Reclaimed, Refused, SrqReclaimError};
pub use pd::Pd;
pub use providers::providers;
pub use qp::{AltPath, ConnectAttr, Qp, QpAttr, QpInfo, QpInit};
pub use remote::{frame_private_data, unframe_private_data, DecodeError, RemoteOutOfBounds, RemoteRegion};
pub use srq::{Srq, SrqAttr, SrqInit};
pub use wc::{WcError, WcFlags, WcOpcode, WcStatus, WorkCompletion, WorkQueue};
pub use wr::{AhRef, MwBind, RawOp, RecvWr, Remote, SendFlags, SendOp, SendWr, Sge, UdDest, WrOpcode};

#[cfg(test)]
mod tests {
    /// The README's example is `examples/loopback.rs` (which `tests/guest/loopback.sh` runs),
    /// less its header comment.
    #[test]
    fn readme_example_is_the_loopback_example() {
        let readme = include_str!("../README.md");
        let start = readme.find("```rust,no_run\n").expect("a Rust block") + "```rust,no_run\n".len();
        let block = &readme[start..start + readme[start..].find("```").expect("closed")];
        let example: String = include_str!("../examples/loopback.rs")
            .lines()
            .filter(|l| !l.starts_with("//!"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(block.trim(), example.trim());
    }
}
