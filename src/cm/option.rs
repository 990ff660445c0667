//! Options of an id (`rdma_set_option`) as typed values, and reporting a QP's async event to
//! the CM (`rdma_notify`).

use super::event::ConnectRequest;
use super::id::CmId;
use super::path::{PathRecord, PRIMARY_BOTH_WAYS};
use crate::error::{Error, Result};
use crate::event::AsyncEventKind;
use crate::sys::ucma::{self, option, Notify, PathRecData, SetOption};
use zerocopy::IntoBytes;

/// An option of an id, for [`CmId::set_option`] (Linux 6.1's `ucma_set_option_id`). The
/// kernel refuses an option the id's state no longer allows with `EINVAL`
/// ([`crate::Error::Kernel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmOption {
    /// The type of service (`RDMA_OPTION_ID_TOS`). On RoCE the route resolved after it
    /// carries it as the traffic class (the IP header's TOS byte of every packet) and maps it
    /// to the service level through the netdev's priorities; unset, the port's
    /// `default_roce_tos` (configfs). Set it before resolving the route.
    Tos(u8),
    /// Lets ids bind the same address and port while every one of them has it set
    /// (`RDMA_OPTION_ID_REUSEADDR`, as `SO_REUSEADDR`). Listening still needs the port alone.
    /// Turning it on is refused on a listening id, turning it off on any id past `bind`.
    ReuseAddr(bool),
    /// An IPv6 id bound to the any-address takes IPv6 requests only, and shares its port with
    /// IPv4 ids that are AF-only too (`RDMA_OPTION_ID_AFONLY`, as `IPV6_V6ONLY`). Unset, the
    /// `net.ipv6.bindv6only` sysctl decides at bind time; an IPv4 bind sets it. Only before
    /// listening or resolving.
    AfOnly(bool),
    /// The QP's local ACK timeout, 4.096 µs × 2^n, 0 for none (`RDMA_OPTION_ID_ACK_TIMEOUT`):
    /// the RTS attributes [`CmId::qp_attr`] returns carry it. Not negotiated with the peer.
    /// IB's field has 5 bits: at most 31. Set before resolving the route, it also sets the
    /// path's packet lifetime on RoCE.
    AckTimeout(u8),
    /// The route from a path record instead of resolving it (`RDMA_OPTION_IB_PATH`, as
    /// `rdma_set_option` with `IB_PATH_GMP | IB_PATH_PRIMARY | IB_PATH_BIDIRECTIONAL`): the
    /// id's address must be resolved and its route not; `ROUTE_RESOLVED` is queued at once.
    /// On RoCE the kernel takes the Ethernet fields from the resolved address.
    IbPath(PathRecord),
}

/// IB's local ACK timeout field: 5 bits.
const MAX_ACK_TIMEOUT: u8 = 31;

impl CmOption {
    /// The level, the name, and the value as the kernel reads it (`u8`, `int`, or
    /// `struct ib_path_rec_data`).
    fn encode(self) -> Result<(u32, u32, Vec<u8>)> {
        let int = |on: bool| i32::from(on).to_ne_bytes().to_vec();
        Ok(match self {
            Self::Tos(tos) => (option::LEVEL_ID, option::ID_TOS, vec![tos]),
            Self::ReuseAddr(on) => (option::LEVEL_ID, option::ID_REUSEADDR, int(on)),
            Self::AfOnly(on) => (option::LEVEL_ID, option::ID_AFONLY, int(on)),
            Self::AckTimeout(n) if n > MAX_ACK_TIMEOUT => {
                return Err(Error::invalid(
                    "set_option",
                    format!("ACK timeout {n}: the IB field holds 0 to {MAX_ACK_TIMEOUT}"),
                ))
            }
            Self::AckTimeout(n) => (option::LEVEL_ID, option::ID_ACK_TIMEOUT, vec![n]),
            Self::IbPath(path) => {
                let data = PathRecData {
                    flags: PRIMARY_BOTH_WAYS,
                    reserved: 0,
                    path_rec: path.pack("set_option")?,
                };
                (option::LEVEL_IB, option::IB_PATH, data.as_bytes().to_vec())
            }
        })
    }
}

impl CmId {
    /// Sets an option of the id (`rdma_set_option`).
    pub fn set_option(&mut self, option: CmOption) -> Result<()> {
        let (level, optname, value) = option.encode()?;
        let req = SetOption {
            optval: value.as_ptr() as u64,
            id: self.kernel_id(),
            level,
            optname,
            optlen: value.len() as u32,
        };
        // `value` lives until the call returns; the kernel copies it in.
        ucma::call(self.channel_fd(), &req, ())?;
        if matches!(option, CmOption::AckTimeout(_)) {
            self.ack_timeout_set = true;
        }
        Ok(())
    }

    /// Reports an async event of the id's QP to the CM (`rdma_notify`). `COMM_EST` (the QP
    /// received a message before the RTU arrived) completes the passive side's connection:
    /// `ESTABLISHED` follows, and a late RTU is ignored; `PATH_MIG` makes the alternate path
    /// the CM's primary. On IB and RoCE the kernel refuses any other event, an id with no
    /// connection in progress, and `COMM_EST` on an established one (`EISCONN`); elsewhere
    /// (iWARP) it ignores them.
    pub fn notify(&self, event: AsyncEventKind) -> Result<()> {
        let req = Notify {
            id: self.kernel_id(),
            event: event.0,
        };
        ucma::call(self.channel_fd(), &req, ())
    }
}

impl ConnectRequest {
    /// Sets an option of the new id before answering ([`CmId::set_option`]), e.g. its ACK
    /// timeout.
    pub fn set_option(&mut self, option: CmOption) -> Result<()> {
        self.id.set_option(option)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_encode_as_the_kernel_reads_them() {
        let one = 1i32.to_ne_bytes().to_vec();
        let zero = 0i32.to_ne_bytes().to_vec();
        let encode = |o: CmOption| o.encode().unwrap();
        assert_eq!(encode(CmOption::Tos(0xb8)), (0, 0, vec![0xb8]));
        assert_eq!(encode(CmOption::ReuseAddr(true)), (0, 1, one.clone()));
        assert_eq!(encode(CmOption::ReuseAddr(false)), (0, 1, zero));
        assert_eq!(encode(CmOption::AfOnly(true)), (0, 2, one));
        assert_eq!(encode(CmOption::AckTimeout(31)), (0, 3, vec![31]));
        assert!(matches!(
            CmOption::AckTimeout(32).encode(),
            Err(Error::InvalidArgument { .. })
        ));
        let path = PathRecord {
            pkey: 0xffff,
            ..Default::default()
        };
        let (level, name, bytes) = encode(CmOption::IbPath(path));
        assert_eq!((level, name, bytes.len()), (1, 1, 72));
        assert_eq!(&bytes[..4], &0x2bu32.to_ne_bytes(), "GMP | PRIMARY | BIDIRECTIONAL");
        assert_eq!(&bytes[8..], &path.pack("test").unwrap()[..]);
    }
}
