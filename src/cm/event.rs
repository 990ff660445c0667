//! RDMA CM events, their private data, and the connect request a listener receives.

use super::channel::ChannelInner;
use super::id::CmId;
use crate::open_enum::open_enum;
use crate::sys::ucma::{ConnParam as AbiConnParam, EventResp, MAX_PRIVATE_DATA};
use std::sync::Arc;
use zerocopy::{FromBytes, FromZeros};

open_enum! {
    /// What happened (`enum rdma_cm_event_type`).
    CmEventKind {
        ADDR_RESOLVED = 0,
        ADDR_ERROR = 1,
        ROUTE_RESOLVED = 2,
        ROUTE_ERROR = 3,
        CONNECT_REQUEST = 4,
        CONNECT_RESPONSE = 5,
        CONNECT_ERROR = 6,
        UNREACHABLE = 7,
        REJECTED = 8,
        ESTABLISHED = 9,
        DISCONNECTED = 10,
        DEVICE_REMOVAL = 11,
        MULTICAST_JOIN = 12,
        MULTICAST_ERROR = 13,
        ADDR_CHANGE = 14,
        TIMEWAIT_EXIT = 15,
    }
}

/// Private data carried by a CM message, as the kernel reported it: on IB and RoCE the whole
/// area of the message (REQ 56, REP 196, REJ 148 bytes), zero-padded after what the peer sent.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PrivateData {
    len: u8,
    buf: [u8; MAX_PRIVATE_DATA],
}

impl PrivateData {
    pub(crate) fn new(bytes: &[u8; MAX_PRIVATE_DATA], len: u8) -> Self {
        Self { len, buf: *bytes }
    }
}

impl std::ops::Deref for PrivateData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PrivateData({} bytes)", self.len)
    }
}

/// The connection parameters an event reports (`struct rdma_conn_param` less the private
/// data). In a connect request, `responder_resources` and `initiator_depth` are already
/// seen from the passive side: what it may offer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnInfo {
    /// The peer's QP number.
    pub qp_num: u32,
    /// Whether the peer's QP uses an SRQ.
    pub srq: bool,
    /// Outstanding RDMA reads/atomics this side may accept as target.
    pub responder_resources: u8,
    /// Outstanding RDMA reads/atomics this side may issue.
    pub initiator_depth: u8,
    /// Whether the peer does end-to-end flow control.
    pub flow_control: bool,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries (7: forever).
    pub rnr_retry_count: u8,
}

/// One event from an [`super::EventChannel`].
#[derive(Debug)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// 0, a negative errno (`ADDR_ERROR`, `CONNECT_ERROR`, ...), or the reject reason
    /// (`REJECTED`: 28 when the peer's application rejected, 8 when nothing listened).
    pub status: i32,
    /// The uid of the id the event is for ([`CmId::uid`]); for `CONNECT_REQUEST`, the
    /// listener's.
    pub uid: u64,
    /// The peer's private data (connect request, response, establish, reject).
    pub private_data: PrivateData,
    /// The peer's connection parameters.
    pub conn: ConnInfo,
    /// A `CONNECT_REQUEST`'s new id; [`CmEvent::take_request`] makes the request of it
    /// and the event's private data and parameters (no allocation per request).
    request: Option<CmId>,
}

impl CmEvent {
    #[cfg(test)]
    pub(crate) fn from_abi(raw: &EventResp) -> Self {
        Self::decode(raw, None)
    }

    /// The event `raw` holds; a `CONNECT_REQUEST` on `channel` (given) carries its new id,
    /// which belongs to that channel until it is accepted or rejected (dropping the request
    /// destroys it). Inlined, so that the event is written where the caller returns it: an
    /// event is a few hundred bytes (the private data), and every copy of it costs.
    #[inline(always)]
    pub(crate) fn decode(raw: &EventResp, channel: Option<&Arc<ChannelInner>>) -> Self {
        let kind = CmEventKind(raw.event);
        // The union holds `rdma_ucm_conn_param` for every connected-mode event.
        // Read in place (the union is 4-byte aligned in the response, as the struct needs).
        let zeroed;
        let p = match AbiConnParam::ref_from_prefix(&raw.param) {
            Ok((p, _)) => p,
            Err(_) => {
                zeroed = AbiConnParam::new_zeroed();
                &zeroed
            }
        };
        let conn = ConnInfo {
            qp_num: p.qp_num,
            srq: p.srq != 0,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: p.flow_control != 0,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
        };
        let request = match channel {
            Some(channel) if kind == CmEventKind::CONNECT_REQUEST => {
                Some(CmId::new(channel.clone(), raw.id, super::channel::new_uid()))
            }
            _ => None,
        };
        Self {
            kind,
            status: raw.status as i32,
            uid: raw.uid,
            private_data: PrivateData::new(&p.private_data, p.private_data_len),
            conn,
            request,
        }
    }

    /// For `CONNECT_REQUEST`: the request, with the new id. Taken once; a request dropped
    /// unanswered (or with its event) destroys the id, which the peer sees as a reject.
    pub fn take_request(&mut self) -> Option<ConnectRequest> {
        self.request.take().map(|id| ConnectRequest {
            id,
            private_data: self.private_data,
            conn: self.conn,
        })
    }
}

/// A connect request a listener received: the new id, owned here until it is accepted
/// ([`ConnectRequest::accept`], [`ConnectRequest::accept_id`]) or rejected.
#[derive(Debug)]
pub struct ConnectRequest {
    pub(crate) id: CmId,
    /// The peer's private data (56 bytes on RoCE: the whole REQ area).
    pub private_data: PrivateData,
    /// The peer's offer, seen from this side.
    pub conn: ConnInfo,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_decode_status_uid_and_the_reported_private_data() {
        let mut raw = EventResp::new_zeroed();
        (raw.uid, raw.id, raw.event, raw.status) = (42, 3, 8, 28);
        let mut p = AbiConnParam::new_zeroed();
        p.private_data[..148].fill(0xab);
        (p.private_data_len, p.qp_num, p.responder_resources, p.initiator_depth) = (148, 0x11, 4, 5);
        (p.flow_control, p.retry_count, p.rnr_retry_count) = (1, 6, 7);
        raw.param[..size_of::<AbiConnParam>()].copy_from_slice(zerocopy::IntoBytes::as_bytes(&p));
        let e = CmEvent::from_abi(&raw);
        assert_eq!((e.kind, e.status, e.uid), (CmEventKind::REJECTED, 28, 42));
        assert_eq!(&e.private_data[..], &[0xab; 148][..]);
        assert_eq!(
            e.conn,
            ConnInfo {
                qp_num: 0x11,
                srq: false,
                responder_resources: 4,
                initiator_depth: 5,
                flow_control: true,
                retry_count: 6,
                rnr_retry_count: 7,
            }
        );
        raw.status = (-110i32) as u32;
        raw.event = 99;
        let e = CmEvent::from_abi(&raw);
        assert_eq!(e.status, -110);
        assert_eq!(format!("{:?}", e.kind), "CmEventKind(99)");
    }
}
