//! The RDMA connection manager without librdmacm: connect and accept by IP address over the
//! kernel's `rdma_ucm` ABI (`/dev/infiniband/rdma_cm`), with the QP moved through its states
//! as the kernel's CM dictates.
//!
//! Two levels, as in librdmacm:
//! - [`EventChannel`] and [`CmId`]: asynchronous. Every call starts a step and the channel
//!   reports how it ended ([`CmEvent`]); the channel's fd polls readable while events are
//!   queued, for event loops. Ids are named by uids from a counter, never pointers, so an
//!   id can be destroyed at any time. A [`ConnectRequest`] owns its new id until it is
//!   accepted or rejected; dropped, it destroys the id.
//! - [`Connector`], [`Listener`], [`Establishing`], [`Connection`]: the connect/accept flow,
//!   one channel per connection, each object `AsFd`. Blocking calls (`resolve`, `connect`,
//!   `get_request`, `accept`, `disconnect`) or, for an event loop, their non-blocking steps
//!   (`start`, `start_connect`, `try_request`, `start_accept`, `start_disconnect`, then
//!   `advance` whenever the fd is readable); the blocking calls are those steps and a poll(2).
//!
//! Linux's RDMA CM cannot use loopback addresses (they bind no netdev): those are refused
//! with [`crate::Error::Loopback`]. With rxe, put the device on a dummy or veth netdev with
//! an IPv4 address. Only reliable-connected ids over IP addresses exist so far; see
//! `docs/rdma-cm.md` for what is not built yet.

/// The Rust code of docs/rdma-cm.md, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../docs/rdma-cm.md")]
struct RdmaCmDoctests;

mod addr;
mod channel;
mod conn;
mod event;
mod id;
mod option;
mod path;

pub use channel::EventChannel;
pub use conn::{ConnectFailed, Connection, Connector, Establishing, Listener};
pub use event::{CmEvent, CmEventKind, ConnInfo, ConnectRequest, PrivateData};
pub use id::{AddrInfo, CmId, ConnParam, PrivateDataLimits};
pub use option::CmOption;
pub use path::PathRecord;
