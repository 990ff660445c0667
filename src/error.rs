//! Typed errors: every failure names the verb, and kernel failures carry the errno and what it
//! usually means for that verb.

use nix::errno::Errno;

/// A verb or kernel command, as named in errors.
pub type Verb = &'static str;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The kernel refused a command.
    #[error("{verb}: kernel returned {errno}{}", hint(verb, *errno))]
    Kernel {
        /// The verb that failed.
        verb: Verb,
        /// The errno the kernel returned.
        errno: Errno,
    },
    /// No RDMA device matches, or none is present at all.
    #[error("no RDMA device{}: {reason}", match name { Some(n) => format!(" named {n:?}"), None => String::new() })]
    NoDevice {
        /// The requested device name, if any.
        name: Option<String>,
        /// Why none was found (what was looked at).
        reason: String,
    },
    /// The device exists but this crate has no provider for its driver.
    #[error("device {device:?} (driver id {driver_id:?}) has no provider in this build; known providers: {known}")]
    NoProvider {
        /// Device name.
        device: String,
        /// Driver id reported by the kernel, if it could be read.
        driver_id: Option<u32>,
        /// Comma-separated names of the compiled-in providers.
        known: String,
    },
    /// The device or provider speaks an ABI version this crate does not.
    #[error("{what}: ABI version {found} is not supported (supported: {supported})")]
    AbiVersion {
        /// Which ABI.
        what: &'static str,
        /// Version found.
        found: u32,
        /// Supported range, human readable.
        supported: &'static str,
    },
    /// The kernel handed back data that breaks the ABI's rules (a ring header out of range, a
    /// short response). Nothing was read outside the mapping.
    #[error("{verb}: malformed data from the kernel: {detail}")]
    Malformed {
        /// The verb whose response was malformed.
        verb: Verb,
        /// What was wrong.
        detail: String,
    },
    /// An argument is out of range or inconsistent; nothing was sent to the kernel.
    #[error("{verb}: invalid argument: {detail}")]
    InvalidArgument {
        /// The verb.
        verb: Verb,
        /// What was wrong.
        detail: String,
    },
    /// A work request was rejected before it reached the queue. The requests before `index`
    /// were posted (and the doorbell rung); this one and those after it were not.
    #[error("{verb}: work request {index} rejected: {reason}")]
    WorkRequest {
        /// `post_send` or `post_recv`.
        verb: Verb,
        /// Index in the list of the first request not posted.
        index: usize,
        /// Why it was rejected.
        reason: WrReject,
    },
    /// The device or kernel lacks something this operation needs.
    #[error("{verb}: not supported: {what}")]
    Unsupported {
        /// The verb.
        verb: Verb,
        /// What is missing.
        what: &'static str,
    },
    /// The CQ overran: more completions arrived than it holds and the device dropped some
    /// (a `CQ_ERR` async event): from `Cq::try_poll`, `Cq::check`, `AsyncCq::poll`,
    /// `Cq::req_notify`.
    #[error("CQ {cq_user_handle} overran: completions were lost and it cannot be used any more (ibv_poll_cq(3)); make it deeper than the work requests that can complete into it")]
    CqOverrun {
        /// `Cq::user_handle` of the CQ.
        cq_user_handle: u64,
    },
    /// A QP may not move to RESET while the safe posts still count requests of its queues:
    /// a device may still be writing their buffers (rxe's move to RESET races a transfer in
    /// progress: docs/kernel-facts.md), and no completion would ever give them back. Move it
    /// to ERR, which completes every queued request (flushed), reap those completions
    /// (`Qp::reclaim`), then move it to RESET; or destroy the QP.
    #[error("{verb}: the safe posts still count {send} send and {recv} receive requests of this QP; move it to ERR and reap their completions before RESET")]
    RequestsOutstanding {
        /// The verb.
        verb: Verb,
        /// Requests of the send queue, holding a buffer or not (inline sends).
        send: usize,
        /// Requests of the receive queue.
        recv: usize,
    },
    /// A forked child used a handle it inherited: the kernel objects belong to the parent.
    /// The child must open its own context.
    #[error("{verb}: this process is a fork of the one that opened the device; open a new context here")]
    Forked {
        /// The verb.
        verb: Verb,
    },
    /// Private data longer than the transport carries in this message; nothing was sent.
    #[error("{verb}: {len} bytes of private data, the transport carries at most {max}")]
    PrivateDataTooLong {
        /// `connect`, `accept` or `reject`.
        verb: Verb,
        /// Bytes given.
        len: usize,
        /// The transport's limit for this message.
        max: usize,
    },
    /// A loopback address: the kernel's RDMA CM binds it to no netdev and cannot route it.
    #[error("{verb}: {addr} is a loopback address, which the kernel's RDMA CM does not support; use an address of a netdev with an RDMA device (for rxe: a dummy or veth netdev)")]
    Loopback {
        /// The call given the address.
        verb: Verb,
        /// The address.
        addr: std::net::IpAddr,
    },
    /// The peer's CM rejected the connection: `status` is the IB CM reason (8: no listener
    /// on that port, 28: the peer's application rejected it).
    #[error("connection rejected (reason {status}{}) with {} bytes of private data", reject_reason(*status), private_data.len())]
    Rejected {
        /// The reject reason the event carried.
        status: i32,
        /// The peer's private data, as the kernel reported it (zero-padded to the transport's size).
        private_data: Vec<u8>,
    },
    /// The RDMA CM answered with a failure event (`ADDR_ERROR`, `ROUTE_ERROR`,
    /// `CONNECT_ERROR`, `UNREACHABLE`, ...) or an event the step does not expect.
    #[error("{verb}: the RDMA CM reported {event} with status {status}")]
    CmEvent {
        /// The step that was waiting.
        verb: Verb,
        /// The event's name.
        event: &'static str,
        /// The event's status (a negative errno, or a reject reason).
        status: i32,
    },
    /// The peer withdrew its connect request before this side accepted it: it gave up (its
    /// connect timed out or was dropped) and its CM sent a reject, which the kernel does not
    /// report for a request not yet accepted; the request's id can no longer be answered.
    #[error("{verb}: the peer withdrew its connect request before the accept (it gave up waiting); wait for its next request")]
    RequestWithdrawn {
        /// The step that found it out.
        verb: Verb,
    },
    /// No event came within the timeout.
    #[error("{verb}: no RDMA CM event within {timeout:?}")]
    TimedOut {
        /// The step that was waiting.
        verb: Verb,
        /// How long it waited.
        timeout: std::time::Duration,
    },
    /// Reading sysfs or opening the device file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being read or opened.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Why a work request was rejected before reaching the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WrReject {
    /// The queue is full: wait for completions first.
    QueueFull,
    /// More scatter/gather entries than the queue was created with.
    TooManySge {
        /// Entries in the request.
        given: usize,
        /// The queue's limit.
        max: u32,
    },
    /// Inline data longer than the queue's inline limit.
    InlineTooLong {
        /// Bytes in the request.
        given: usize,
        /// The queue's limit.
        max: u32,
    },
    /// The QP is in a state where this queue cannot be posted to.
    WrongState(crate::attr::QpState),
    /// An atomic needs an 8-byte aligned remote address and one 8-byte local buffer.
    BadAtomic,
    /// The operation is not valid for this QP type (or lacks a UD destination, asks for
    /// inline data on an operation the device writes, or gives buffers to a memory window
    /// operation), or the device's provider does not post it.
    OpcodeNotSupported,
    /// The UD destination's address handle belongs to another device context (its
    /// provider value means nothing to this QP's provider).
    ForeignAh,
    /// A request in libibverbs' layout ([`crate::CSendWr`]) that cannot be read: an unknown
    /// operation, a negative or null scatter/gather list, or what its caller's slow path
    /// refused (a UD send without an address handle, a bind without a window).
    Malformed,
    /// A one-sided operation's range does not fit the peer's advertised region
    /// ([`crate::RemoteRegion`]): refused before posting.
    RemoteOutOfBounds {
        /// Start of the range, from the region's first byte.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// Length of the region.
        region_len: u64,
    },
}

impl std::fmt::Display for WrReject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::QueueFull => write!(f, "queue full"),
            Self::TooManySge { given, max } => {
                write!(f, "{given} scatter/gather entries, queue allows {max}")
            }
            Self::InlineTooLong { given, max } => {
                write!(f, "{given} bytes inline, queue allows {max}")
            }
            Self::WrongState(crate::attr::QpState::Reset) => write!(
                f,
                "QP is in state Reset: move it to INIT first (Qp::modify; a connection manager's QP: ConnectRequest::init_qp or CmId::init_qp, before the accept or connect)"
            ),
            Self::WrongState(s) => write!(f, "QP is in state {s:?}"),
            Self::BadAtomic => write!(
                f,
                "atomics need an 8-byte aligned remote address and one 8-byte local buffer"
            ),
            Self::OpcodeNotSupported => write!(f, "opcode not supported on this QP type"),
            Self::ForeignAh => write!(f, "the address handle belongs to another device context"),
            Self::Malformed => write!(
                f,
                "unreadable request (unknown opcode, bad scatter/gather list, or no address handle or window)"
            ),
            Self::RemoteOutOfBounds {
                offset,
                len,
                region_len,
            } => write!(
                f,
                "{len} bytes at offset {offset} do not fit the peer's {region_len}-byte region"
            ),
        }
    }
}

impl std::error::Error for WrReject {}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A kernel refusal of `verb` with `errno`.
    pub(crate) fn kernel(verb: Verb, errno: Errno) -> Self {
        Self::Kernel { verb, errno }
    }

    pub(crate) fn malformed(verb: Verb, detail: impl Into<String>) -> Self {
        Self::Malformed {
            verb,
            detail: detail.into(),
        }
    }

    pub(crate) fn invalid(verb: Verb, detail: impl Into<String>) -> Self {
        Self::InvalidArgument {
            verb,
            detail: detail.into(),
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }

    /// Whether a connect found nothing listening on the peer's port: the peer's CM rejected
    /// it with reason 8 (invalid service id; IB and RoCE). A server not started yet answers
    /// so: connect again. (iWARP reports a missing listener and an application's reject
    /// alike, as `ECONNREFUSED`: never `true` there.)
    pub fn is_no_listener(&self) -> bool {
        matches!(self, Self::Rejected { status: 8, .. })
    }

    /// The errno, when the kernel refused a command.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Self::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// For callers that speak `std::io`: the errno stays the raw OS error where the kernel
/// refused a command; the message (with the verb and hint) is kept in every case.
impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        match &e {
            Error::Kernel { errno, .. } => Self::new(Self::from_raw_os_error(*errno as i32).kind(), e),
            Error::Io { source, .. } => Self::new(source.kind(), e),
            Error::NoDevice { .. } | Error::NoProvider { .. } => Self::new(std::io::ErrorKind::NotFound, e),
            Error::InvalidArgument { .. } | Error::WorkRequest { .. } => Self::new(std::io::ErrorKind::InvalidInput, e),
            Error::Unsupported { .. } | Error::AbiVersion { .. } => Self::new(std::io::ErrorKind::Unsupported, e),
            Error::PrivateDataTooLong { .. } | Error::Loopback { .. } => Self::new(std::io::ErrorKind::InvalidInput, e),
            Error::Rejected { .. } => Self::new(std::io::ErrorKind::ConnectionRefused, e),
            Error::TimedOut { .. } => Self::new(std::io::ErrorKind::TimedOut, e),
            _ => Self::other(e),
        }
    }
}

/// What an IB CM reject reason means, where it is a common one.
fn reject_reason(status: i32) -> &'static str {
    match status {
        8 => ": no listener on that port (invalid service id)",
        28 => ": rejected by the peer's application (consumer defined)",
        _ => "",
    }
}

/// What an errno usually means for a given verb, to make errors actionable.
fn hint(verb: Verb, errno: Errno) -> &'static str {
    match (verb, errno) {
        ("REG_MR", Errno::ENOMEM) | ("REG_MR", Errno::EPERM) => {
            ": the region could not be pinned; RLIMIT_MEMLOCK (ulimit -l) is probably too low"
        }
        ("REG_MR", Errno::EFAULT) => ": the address range is not mapped in this process",
        ("MODIFY_QP", Errno::EINVAL) => {
            ": the attributes do not fit this state transition (wrong mask, state or value); \
             on RoCE the path needs a GRH (`AhAttr::roce`, not a bare LID)"
        }
        ("MODIFY_QP", Errno::ENODATA) => {
            ": the path's source GID index names no GID on this port (see `Context::gid_table`)"
        }
        ("MODIFY_QP", Errno::ETIMEDOUT) | ("MODIFY_QP", Errno::ENETUNREACH) => {
            ": the destination GID could not be resolved on the chosen source GID"
        }
        ("POST_SEND", Errno::EINVAL) => ": the QP is not in RTS",
        ("DESTROY_CQ", Errno::EBUSY) | ("DESTROY_PD", Errno::EBUSY) => {
            ": objects that use it still exist; destroy those first"
        }
        (_, Errno::EOPNOTSUPP) => ": the device does not implement this",
        (_, Errno::EACCES) => ": the device file was opened by another process (another user, or the parent of a fork)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_errors_print_the_errno_once_with_the_hint() {
        assert_eq!(
            Error::kernel("MODIFY_QP", Errno::ENODATA).to_string(),
            "MODIFY_QP: kernel returned ENODATA: No data available: the path's source GID index \
             names no GID on this port (see `Context::gid_table`)"
        );
        let einval = Error::kernel("MODIFY_QP", Errno::EINVAL).to_string();
        assert!(
            einval.starts_with("MODIFY_QP: kernel returned EINVAL: Invalid argument: "),
            "{einval}"
        );
        assert!(einval.contains("RoCE the path needs a GRH"), "{einval}");
        assert_eq!(
            Error::kernel("QUERY_QP", Errno::EIO).to_string(),
            "QUERY_QP: kernel returned EIO: I/O error"
        );
    }

    #[test]
    fn rejections_print_and_propagate_as_errors() {
        let reject = WrReject::TooManySge { given: 3, max: 1 };
        assert_eq!(reject.to_string(), "3 scatter/gather entries, queue allows 1");
        let boxed: Box<dyn std::error::Error> = Box::new(reject.clone());
        assert_eq!(boxed.to_string(), reject.to_string());
        let wr = Error::WorkRequest {
            verb: "post_send",
            index: 2,
            reason: reject,
        };
        assert_eq!(
            wr.to_string(),
            "post_send: work request 2 rejected: 3 scatter/gather entries, queue allows 1"
        );
    }

    #[test]
    fn io_errors_keep_the_kind_and_the_message() {
        let io = std::io::Error::from(Error::kernel("REG_MR", Errno::EPERM));
        assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(io.to_string().contains("RLIMIT_MEMLOCK"), "{io}");
        let wr = Error::WorkRequest {
            verb: "post_send",
            index: 3,
            reason: WrReject::QueueFull,
        };
        assert_eq!(std::io::Error::from(wr).kind(), std::io::ErrorKind::InvalidInput);
    }
}
