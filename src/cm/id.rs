//! A connection manager id (`struct rdma_cm_id`): addressing, listening, connecting, the QP
//! moves the kernel dictates, and the device it is bound to.

use super::addr;
use super::channel::{ChannelInner, EventChannel};
use super::event::ConnectRequest;
use crate::attr::{AhAttr, GlobalRoute, Mtu, QpAttrMask, QpState, Transport};
use crate::context::{Context, ContextInner};
use crate::device::{devices, DeviceInfo};
use crate::error::{Error, Result, Verb};
use crate::mr::AccessFlags;
use crate::qp::{Qp, QpAttr};
use crate::sys::abi::{AhAttrAbi, ModifyQp, QpDest};
use crate::sys::ucma::{
    self, Accept, Bind, ConnParam as AbiConnParam, Connect, DestroyId, Disconnect, Ece, InitQpAttr, Listen, MigrateId,
    Query, QueryAddrResp, Reject, ResolveAddr, ResolveRoute, UverbsQpAttr, MAX_PRIVATE_DATA, QUERY_ADDR,
};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use zerocopy::FromZeros;

/// `IB_CM_REJ_CONSUMER_DEFINED`, the reason REJECT sends.
const REJECT_CONSUMER_DEFINED: u8 = 28;

/// How many bytes of private data each CM message carries on a transport (IP addressing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrivateDataLimits {
    /// In a connect request.
    pub connect: usize,
    /// In an accept.
    pub accept: usize,
    /// In a reject.
    pub reject: usize,
}

impl PrivateDataLimits {
    /// IB and RoCE: the IB CM's REQ, REP and REJ areas (92, 196, 148 bytes), less the 36-byte
    /// header the RDMA CM puts in a REQ for IP addressing. Elsewhere (iWARP's MPA): 251 bytes
    /// each. The ABI's length is one byte (255), but siw (Linux 6.1, `siw_send_mpareqrep`)
    /// adds MPA v2's 4-byte IRD/ORD header to that byte, so 252 bytes or more wrap the
    /// length on the wire (docs/kernel-facts.md).
    pub fn of(transport: Transport) -> Self {
        if transport == Transport::IB {
            Self {
                connect: 56,
                accept: 196,
                reject: 148,
            }
        } else {
            Self {
                connect: 251,
                accept: 251,
                reject: 251,
            }
        }
    }

    fn check(max: usize, verb: Verb, data: &[u8]) -> Result<()> {
        if data.len() > max {
            return Err(Error::PrivateDataTooLong {
                verb,
                len: data.len(),
                max,
            });
        }
        Ok(())
    }
}

/// Connection parameters for [`CmId::connect`] and [`ConnectRequest::accept_id`]
/// (`struct rdma_conn_param`).
#[derive(Debug, Clone, Copy)]
pub struct ConnParam<'a> {
    /// Sent to the peer; at most [`PrivateDataLimits`] bytes.
    pub private_data: &'a [u8],
    /// Outstanding RDMA reads/atomics accepted as target. `None`: the device's maximum when
    /// connecting, the peer's offer (capped by the device) when accepting.
    pub responder_resources: Option<u8>,
    /// Outstanding RDMA reads/atomics issued. `None` as for `responder_resources`.
    pub initiator_depth: Option<u8>,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retries, 0 to 7. rxe treats 7 as "retry forever" (the IB specification
    /// gives that meaning only to the RNR count), so the default is 6: a dead peer fails
    /// the next request with `RETRY_EXC_ERR` on every device.
    pub retry_count: u8,
    /// RNR retries, 0 to 7 (7: forever).
    pub rnr_retry_count: u8,
    /// The QP's ACK timeout (4.096 µs × 2^n, n ≤ 31) where the id has none of its own
    /// ([`super::CmOption::AckTimeout`]); `None`: the kernel's, from the path's packet
    /// lifetime (on RoCE about 2 s a try: a dead peer fails a request after about 16 s). The
    /// default, 14 (67 ms), fails it in about half a second, as `ConnectAttr::default()`.
    pub ack_timeout: Option<u8>,
}

/// [`ConnParam::default`]'s ACK timeout: 4.096 µs × 2^14 = 67 ms, `ConnectAttr::default()`'s.
const DEFAULT_ACK_TIMEOUT: u8 = 14;

impl Default for ConnParam<'_> {
    /// Flow control on, 6 transport retries (librdmacm's 7 retries forever on rxe) and 7 RNR
    /// retries (forever: a receiver short of buffers slows the sender down, it does not
    /// break the connection).
    fn default() -> Self {
        Self {
            private_data: &[],
            responder_resources: None,
            initiator_depth: None,
            flow_control: true,
            retry_count: 6,
            rnr_retry_count: 7,
            ack_timeout: Some(DEFAULT_ACK_TIMEOUT),
        }
    }
}

impl ConnParam<'_> {
    /// Writes the parameters into `p`, which the caller zeroed (in the command it sends:
    /// the private data area is a few hundred bytes, not to be copied again).
    fn write_abi(
        &self,
        p: &mut AbiConnParam,
        verb: Verb,
        qp_num: u32,
        responder_resources: u8,
        initiator_depth: u8,
    ) -> Result<()> {
        if self.retry_count > 7 || self.rnr_retry_count > 7 {
            return Err(Error::invalid(verb, "retry_count and rnr_retry_count are 0 to 7"));
        }
        if self.ack_timeout.is_some_and(|t| t > 31) {
            return Err(Error::invalid(verb, "ack_timeout is 0 to 31"));
        }
        p.qp_num = qp_num;
        p.private_data[..self.private_data.len()].copy_from_slice(self.private_data);
        p.private_data_len = self.private_data.len() as u8;
        p.responder_resources = responder_resources;
        p.initiator_depth = initiator_depth;
        p.flow_control = u8::from(self.flow_control);
        p.retry_count = self.retry_count;
        p.rnr_retry_count = self.rnr_retry_count;
        p.valid = 1;
        Ok(())
    }
}

/// Where an id is bound: `QUERY` with `RDMA_USER_CM_QUERY_ADDR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrInfo {
    /// The local address.
    pub src: Option<SocketAddr>,
    /// The peer's address.
    pub dst: Option<SocketAddr>,
    /// The device's node GUID (host order), 0 while the id is bound to no device.
    pub node_guid: u64,
    /// The device's kernel index.
    pub ibdev_index: u32,
    /// The port.
    pub port_num: u8,
    /// The P_Key.
    pub pkey: u16,
}

/// An RDMA CM id on an [`EventChannel`]. Dropping it destroys the kernel id (and, for a
/// listener, the requests nobody took from the channel).
pub struct CmId {
    channel: Arc<ChannelInner>,
    id: u32,
    uid: u64,
    /// Set by [`CmId::destroy`], so `Drop` does not repeat it.
    destroyed: bool,
    /// The device the id is bound to, once it is: an id never changes device after that.
    bound: OnceLock<Arc<BoundDevice>>,
    /// Whether [`super::CmOption::AckTimeout`] was set: the kernel's value then stands.
    pub(super) ack_timeout_set: bool,
    /// The ACK timeout [`CmId::connect`] took from its [`ConnParam`], for the move to RTS.
    rts_ack_timeout: Option<u8>,
}

/// What the CM needs to know of a device, found once per process (listing the devices reads
/// sysfs and dumps RDMA netlink: milliseconds, against microseconds for the `QUERY` that names
/// the device of an id).
#[derive(Debug)]
struct BoundDevice {
    info: DeviceInfo,
    guid: u64,
    transport: Transport,
    /// `max_qp_rd_atom` and `max_qp_init_rd_atom` as the one-byte CM fields, from the first
    /// QP's context: device attributes, the same in every context of the device.
    rd_atom: OnceLock<(u8, u8)>,
    /// The context [`CmId::context`] opened, while anyone uses it.
    context: Mutex<Weak<ContextInner>>,
}

impl BoundDevice {
    /// The device the kernel names by `index` and `guid`: from the process's list, or found
    /// by listing the devices (and then kept).
    fn lookup(index: u32, guid: u64) -> Result<Arc<Self>> {
        /// Every device an id was bound to, by kernel index and node GUID (two devices on one
        /// netdev share a GUID). A device removed and another added under its index and GUID
        /// would be mistaken for it; opening its character device then fails.
        static DEVICES: Mutex<Vec<Arc<BoundDevice>>> = Mutex::new(Vec::new());
        let mut cache = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = cache
            .iter()
            .find(|d| d.info.kernel_index == Some(index) && d.guid == guid)
        {
            return Ok(d.clone());
        }
        let text = sysfs_guid(guid);
        let list = devices()?;
        let names: Vec<String> = list.iter().map(|d| d.name.clone()).collect();
        let info = list
            .into_iter()
            .find(|d| d.kernel_index == Some(index) && d.node_guid == text)
            .ok_or_else(|| Error::NoDevice {
                name: None,
                reason: format!(
                    "the id is bound to device index {index} (node GUID {text}), which no uverbs device matches (present: {})",
                    names.join(", ")
                ),
            })?;
        let bound = Arc::new(Self {
            transport: info.transport()?,
            info,
            guid,
            rd_atom: OnceLock::new(),
            context: Mutex::new(Weak::new()),
        });
        cache.push(bound.clone());
        Ok(bound)
    }

    /// The device's RDMA read/atomic limits, queried on `qp`'s context the first time.
    fn rd_atom(&self, qp: &Qp) -> Result<(u8, u8)> {
        if let Some(v) = self.rd_atom.get() {
            return Ok(*v);
        }
        let dev = qp.context().query_device()?;
        Ok(*self
            .rd_atom
            .get_or_init(|| (clamp(dev.max_qp_rd_atom), clamp(dev.max_qp_init_rd_atom))))
    }
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("id", &self.id)
            .field("uid", &self.uid)
            .finish_non_exhaustive()
    }
}

impl CmId {
    pub(crate) fn new(channel: Arc<ChannelInner>, id: u32, uid: u64) -> Self {
        Self {
            channel,
            id,
            uid,
            destroyed: false,
            bound: OnceLock::new(),
            ack_timeout_set: false,
            rts_ack_timeout: None,
        }
    }

    /// The uid events for this id carry ([`super::CmEvent::uid`]).
    pub fn uid(&self) -> u64 {
        self.uid
    }

    /// The kernel's number for this id.
    pub fn kernel_id(&self) -> u32 {
        self.id
    }

    /// The fd of the channel the id is on, to write its commands to.
    pub(super) fn channel_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.channel.fd()
    }

    /// Binds to a local address (`rdma_bind_addr`); port 0 picks one. A device address binds
    /// the id to that device; `0.0.0.0` to none.
    pub fn bind(&mut self, addr: SocketAddr) -> Result<()> {
        addr::refuse_loopback("bind", &addr)?;
        let (raw, size) = addr::encode(&addr);
        let req = Bind {
            id: self.id,
            addr_size: size,
            reserved: 0,
            addr: raw,
        };
        ucma::call(self.channel.fd(), &req, ())
    }

    /// Starts resolving `dst` (and binds to `src`, if given, or a local address of the route):
    /// `ADDR_RESOLVED` or `ADDR_ERROR` follows (`rdma_resolve_addr`).
    pub fn resolve_addr(&mut self, src: Option<SocketAddr>, dst: SocketAddr, timeout: Duration) -> Result<()> {
        addr::refuse_loopback("resolve_addr", &dst)?;
        let mut req = ResolveAddr::new_zeroed();
        if let Some(src) = src {
            addr::refuse_loopback("resolve_addr", &src)?;
            (req.src_addr, req.src_size) = addr::encode(&src);
        }
        (req.dst_addr, req.dst_size) = addr::encode(&dst);
        req.id = self.id;
        req.timeout_ms = timeout_ms(timeout);
        ucma::call(self.channel.fd(), &req, ())
    }

    /// Starts resolving the route to the resolved address: `ROUTE_RESOLVED` or
    /// `ROUTE_ERROR` follows (`rdma_resolve_route`).
    pub fn resolve_route(&mut self, timeout: Duration) -> Result<()> {
        let req = ResolveRoute {
            id: self.id,
            timeout_ms: timeout_ms(timeout).max(1),
        };
        ucma::call(self.channel.fd(), &req, ())
    }

    /// Listens for connect requests on the bound address (`rdma_listen`); 0 asks for the
    /// kernel's maximum backlog.
    pub fn listen(&mut self, backlog: u32) -> Result<()> {
        let req = Listen { id: self.id, backlog };
        ucma::call(self.channel.fd(), &req, ())
    }

    /// Where the id is bound (`QUERY` of the address).
    pub fn query_addr(&self) -> Result<AddrInfo> {
        let req = Query {
            response: 0,
            id: self.id,
            option: QUERY_ADDR,
        };
        let mut init = QueryAddrResp::new_zeroed();
        // A kernel too old to report the index leaves this.
        init.ibdev_index = u32::MAX;
        let r = ucma::call(self.channel.fd(), &req, init)?;
        Ok(AddrInfo {
            src: addr::decode(&r.src_addr),
            dst: addr::decode(&r.dst_addr),
            node_guid: u64::from_be(r.node_guid),
            ibdev_index: r.ibdev_index,
            port_num: r.port_num,
            pkey: r.pkey,
        })
    }

    /// The device the id is bound to, matched by kernel index **and** node GUID (two devices
    /// on one netdev share a GUID). The first call on an id asks the kernel (`QUERY`); the
    /// device list is read once per process.
    pub fn device(&self) -> Result<DeviceInfo> {
        Ok(self.bound()?.info.clone())
    }

    fn bound(&self) -> Result<&Arc<BoundDevice>> {
        if let Some(b) = self.bound.get() {
            return Ok(b);
        }
        let a = self.query_addr()?;
        if a.node_guid == 0 {
            return Err(Error::invalid(
                "device",
                "the id is bound to no device yet: bind it to a device's address or resolve an address first",
            ));
        }
        if a.ibdev_index == u32::MAX {
            return Err(Error::Unsupported {
                verb: "device",
                what: "the kernel reports no device index for rdma_cm ids (Linux 5.4 or later does)",
            });
        }
        let found = BoundDevice::lookup(a.ibdev_index, a.node_guid)?;
        Ok(self.bound.get_or_init(|| found))
    }

    /// The id's device, opened once per process while any handle to it lives.
    pub fn context(&self) -> Result<Context> {
        let bound = self.bound()?;
        let mut slot = bound.context.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(inner) = slot.upgrade() {
            return Ok(Context { inner });
        }
        let ctx = Context::open(&bound.info)?;
        *slot = Arc::downgrade(&ctx.inner);
        Ok(ctx)
    }

    /// The private data limits of the id's transport.
    pub fn private_data_limits(&self) -> Result<PrivateDataLimits> {
        Ok(PrivateDataLimits::of(self.bound()?.transport))
    }

    /// The QP attributes the CM dictates for moving to `state` (`INIT_QP_ATTR`), converted
    /// field by field.
    pub fn qp_attr(&self, state: QpState) -> Result<QpAttr> {
        let req = InitQpAttr {
            response: 0,
            id: self.id,
            qp_state: state as u32,
        };
        let r = ucma::call(self.channel.fd(), &req, UverbsQpAttr::new_zeroed())?;
        qp_attr_from_abi(&r)
    }

    /// Moves `qp` to `state` with the CM's attributes; `rd_atomic` replaces the negotiated
    /// `max_dest_rd_atomic` (RTR) or `max_rd_atomic` (RTS) where the CM sets one, `ack_timeout`
    /// the ACK timeout where the CM sets one and the id has no ACK timeout option.
    ///
    /// The kernel's attributes go straight into the MODIFY_QP request ([`modify_from_cm`]),
    /// checked as [`CmId::qp_attr`] checks them, with no [`QpAttr`] in between.
    fn move_qp(&self, qp: &mut Qp, state: QpState, rd_atomic: Option<u8>, ack_timeout: Option<u8>) -> Result<()> {
        let req = InitQpAttr {
            response: 0,
            id: self.id,
            qp_state: state as u32,
        };
        let mut r = UverbsQpAttr::new_zeroed();
        ucma::execute_into(self.channel.fd(), &req, &mut r).map_err(|e| Error::kernel("INIT_QP_ATTR", e))?;
        let (mut m, next) = modify_from_cm(&r, qp.handle())?;
        let has = |bit: QpAttrMask| m.attr_mask & bit.bits() != 0;
        if let (Some(t), true, false) = (ack_timeout, has(QpAttrMask::TIMEOUT), self.ack_timeout_set) {
            m.timeout = t;
        }
        if let Some(n) = rd_atomic {
            if has(QpAttrMask::MAX_DEST_RD_ATOMIC) {
                m.max_dest_rd_atomic = n;
            }
            if has(QpAttrMask::MAX_QP_RD_ATOMIC) {
                m.max_rd_atomic = n;
            }
        }
        qp.modify_abi(&m, next)
    }

    /// Moves `qp` from RESET to INIT with the CM's attributes, so receives can be posted
    /// before connecting or accepting (librdmacm does this when it creates the QP).
    pub fn init_qp(&self, qp: &mut Qp) -> Result<()> {
        self.check_qp("init_qp", qp)?;
        self.move_qp(qp, QpState::Init, None, None)
    }

    /// Whether the id's device speaks iWARP: the kernel then moves the QP to RTS when the
    /// connection is established (no `CONNECT_RESPONSE`, no RTR or RTS from user space).
    pub(crate) fn is_iwarp(&self) -> Result<bool> {
        Ok(self.bound()?.transport == Transport::IWARP)
    }

    fn check_qp(&self, verb: Verb, qp: &Qp) -> Result<&Arc<BoundDevice>> {
        let bound = self.bound()?;
        let (theirs, info) = (qp.context_device(), &bound.info);
        if theirs.kernel_index != info.kernel_index || theirs.node_guid != info.node_guid {
            return Err(Error::invalid(
                verb,
                format!("the QP is on {}, the id on {}", theirs.name, info.name),
            ));
        }
        Ok(bound)
    }

    /// Sends a connect request for `qp` (`rdma_connect`), after moving it to INIT if it is in
    /// RESET. `CONNECT_RESPONSE` (then [`CmId::establish`]), `REJECTED`, `UNREACHABLE` or
    /// `CONNECT_ERROR` follows.
    pub fn connect(&mut self, qp: &mut Qp, param: &ConnParam<'_>) -> Result<()> {
        let bound = self.check_qp("connect", qp)?;
        PrivateDataLimits::check(
            PrivateDataLimits::of(bound.transport).connect,
            "connect",
            param.private_data,
        )?;
        let (max_rr, max_depth) = bound.rd_atom(qp)?;
        let rr = param.responder_resources.unwrap_or(u8::MAX).min(max_rr);
        let depth = param.initiator_depth.unwrap_or(u8::MAX).min(max_depth);
        let mut req = Connect::new_zeroed();
        param.write_abi(&mut req.conn_param, "connect", qp.qpn(), rr, depth)?;
        req.id = self.id;
        self.rts_ack_timeout = param.ack_timeout;
        if qp.state() == QpState::Reset {
            self.move_qp(qp, QpState::Init, None, None)?;
        }
        ucma::call(self.channel.fd(), &req, ())
    }

    /// On `CONNECT_RESPONSE`: applies the CM's INIT attributes again (the access flags the
    /// answer allows: remote read and atomics need responder resources, which only the peer's
    /// reply settles), moves `qp` to RTR and RTS with the negotiated values and sends the RTU;
    /// the connection is then established (`rdma_establish`). Moves already made are skipped:
    /// a caller may make them itself with [`CmId::qp_attr`] and send before the RTU. As
    /// librdmacm does: rping's server reads the client's memory over such a connection.
    pub fn establish(&mut self, qp: &mut Qp) -> Result<()> {
        if qp.state() != QpState::Rts {
            if qp.state() != QpState::Rtr {
                self.move_qp(qp, QpState::Init, None, None)?;
                self.move_qp(qp, QpState::Rtr, None, None)?;
            }
            self.move_qp(qp, QpState::Rts, None, self.rts_ack_timeout)?;
        }
        let req = Accept {
            uid: self.uid,
            conn_param: AbiConnParam::new_zeroed(),
            id: self.id,
            reserved: 0,
            ece: Ece::default(),
        };
        ucma::call(self.channel.fd(), &req, ())
    }

    /// Records what `ESTABLISHED` means for `qp`: on iWARP the kernel moved the QP to RTS
    /// itself when the connection came up (there is no MODIFY_QP for user space to make, and
    /// siw's QUERY_QP does not report the state), so call this on `ESTABLISHED` before posting
    /// sends. Elsewhere the moves to RTS were this side's own ([`CmId::establish`],
    /// [`ConnectRequest::accept_id`]) and nothing changes.
    pub fn established(&self, qp: &mut Qp) -> Result<()> {
        if self.is_iwarp()? {
            self.check_qp("established", qp)?;
            qp.kernel_moved_to(QpState::Rts);
        }
        Ok(())
    }

    /// Moves `qp` to ERR (flushing its posted requests) and sends a disconnect request
    /// (`rdma_disconnect`); both sides then see `DISCONNECTED`.
    ///
    /// On iWARP the QP goes to SQD instead, as librdmacm does: the driver then closes the
    /// connection gracefully and flushes the queues itself.
    pub fn disconnect(&mut self, qp: &mut Qp) -> Result<()> {
        if self.is_iwarp()? {
            if qp.state() == QpState::Rts {
                qp.move_to(QpState::Sqd)?;
            }
        } else if qp.state() != QpState::Err {
            qp.move_to(QpState::Err)?;
        }
        ucma::call(self.channel.fd(), &Disconnect { id: self.id }, ())
    }

    /// Moves the id, with its queued events, to `to` (`rdma_migrate_id`); returns how many
    /// events the old channel reported for it.
    pub fn migrate(&mut self, to: &EventChannel) -> Result<u32> {
        let req = MigrateId {
            response: 0,
            id: self.id,
            fd: self.channel.fd().as_raw_fd() as u32,
        };
        let r = ucma::call(to.inner.fd(), &req, Default::default())?;
        self.channel.unregister(self.uid);
        to.inner.register(self.uid, self.id);
        self.channel = to.inner.clone();
        Ok(r.events_reported)
    }

    /// Destroys the id (`rdma_destroy_id`) and returns how many events the kernel reported
    /// for it. Its queued events go with it; events already read are plain values, so there
    /// is nothing to wait for.
    pub fn destroy(mut self) -> Result<u32> {
        self.destroyed = true;
        self.destroy_kernel_id()
    }

    fn destroy_kernel_id(&self) -> Result<u32> {
        self.channel.unregister(self.uid);
        let req = DestroyId {
            response: 0,
            id: self.id,
            reserved: 0,
        };
        ucma::call(self.channel.fd(), &req, Default::default()).map(|r| r.events_reported)
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        if !self.destroyed {
            // Nothing to report to: `destroy` returns the error to callers that want it.
            let _ = self.destroy_kernel_id();
        }
    }
}

impl ConnectRequest {
    /// The device the request came in on.
    pub fn device(&self) -> Result<DeviceInfo> {
        self.id.device()
    }

    /// The device's context, opened once per process ([`CmId::context`]).
    pub fn context(&self) -> Result<Context> {
        self.id.context()
    }

    /// Moves `qp` to INIT for this request ([`CmId::init_qp`]): receives posted before the
    /// accept are there when the peer's first message arrives.
    pub fn init_qp(&self, qp: &mut Qp) -> Result<()> {
        self.id.init_qp(qp)
    }

    /// The new id's addresses.
    pub fn query_addr(&self) -> Result<AddrInfo> {
        self.id.query_addr()
    }

    /// Accepts with `qp` (`rdma_accept`): moves it to INIT (if in RESET), RTR and RTS with the
    /// negotiated values and sends the accept. The returned id sees `ESTABLISHED` on this
    /// request's channel.
    pub fn accept_id(self, qp: &mut Qp, param: &ConnParam<'_>) -> Result<CmId> {
        let bound = self.id.check_qp("accept", qp)?;
        PrivateDataLimits::check(
            PrivateDataLimits::of(bound.transport).accept,
            "accept",
            param.private_data,
        )?;
        let (max_rr, max_depth) = bound.rd_atom(qp)?;
        let rr = param
            .responder_resources
            .unwrap_or(self.conn.responder_resources)
            .min(max_rr);
        let depth = param
            .initiator_depth
            .unwrap_or(self.conn.initiator_depth)
            .min(max_depth);
        let mut req = Accept::new_zeroed();
        param.write_abi(&mut req.conn_param, "accept", qp.qpn(), rr, depth)?;
        (req.uid, req.id) = (self.id.uid, self.id.id);
        let accepted = (|| {
            if qp.state() == QpState::Reset {
                self.id.move_qp(qp, QpState::Init, None, None)?;
            }
            // iWARP: the kernel moves the QP to RTS when the connection is up.
            if bound.transport != Transport::IWARP {
                self.id.move_qp(qp, QpState::Rtr, Some(rr), None)?;
                self.id.move_qp(qp, QpState::Rts, Some(depth), param.ack_timeout)?;
            }
            ucma::call(self.id.channel.fd(), &req, ())
        })();
        if let Err(e) = accepted {
            // The kernel's CM id left the request state: the peer's reject (it gave up)
            // came in, unreported for a request not accepted yet (Linux 6.1), and the CM
            // refuses the QP attributes and the accept with EINVAL.
            return Err(match e {
                Error::Kernel {
                    verb: "INIT_QP_ATTR" | "ACCEPT",
                    errno: nix::errno::Errno::EINVAL,
                } => Error::RequestWithdrawn { verb: "accept" },
                e => e,
            });
        }
        self.id.channel.register(self.id.uid, self.id.id);
        Ok(self.id)
    }

    /// Rejects with `private_data` (`rdma_reject`); the peer sees `REJECTED` with reason 28
    /// and the data. The id is destroyed.
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        let max = self.id.private_data_limits()?.reject;
        PrivateDataLimits::check(max, "reject", private_data)?;
        let mut req = Reject {
            id: self.id.id,
            private_data_len: private_data.len() as u8,
            reason: REJECT_CONSUMER_DEFINED,
            reserved: [0; 2],
            private_data: [0; MAX_PRIVATE_DATA],
        };
        req.private_data[..private_data.len()].copy_from_slice(private_data);
        ucma::call(self.id.channel.fd(), &req, ())
    }

    /// Moves the new id to another channel before answering ([`CmId::migrate`]).
    pub fn migrate(&mut self, to: &EventChannel) -> Result<u32> {
        self.id.migrate(to)
    }
}

/// A device limit as the one-byte CM field (librdmacm caps the same way).
fn clamp(n: u32) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

fn timeout_ms(t: Duration) -> u32 {
    u32::try_from(t.as_millis()).unwrap_or(u32::MAX)
}

/// A node GUID as sysfs prints it (`0250:56ff:fe8a:1e2f`).
fn sysfs_guid(guid: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        guid >> 48,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    )
}

/// The attributes INIT_QP_ATTR may name: those a [`QpAttr`] carries.
const CM_CARRIED: QpAttrMask = QpAttrMask::STATE
    .union(QpAttrMask::CUR_STATE)
    .union(QpAttrMask::EN_SQD_ASYNC_NOTIFY)
    .union(QpAttrMask::ACCESS_FLAGS)
    .union(QpAttrMask::PKEY_INDEX)
    .union(QpAttrMask::PORT)
    .union(QpAttrMask::QKEY)
    .union(QpAttrMask::AV)
    .union(QpAttrMask::PATH_MTU)
    .union(QpAttrMask::TIMEOUT)
    .union(QpAttrMask::RETRY_CNT)
    .union(QpAttrMask::RNR_RETRY)
    .union(QpAttrMask::RQ_PSN)
    .union(QpAttrMask::MAX_QP_RD_ATOMIC)
    .union(QpAttrMask::MIN_RNR_TIMER)
    .union(QpAttrMask::SQ_PSN)
    .union(QpAttrMask::MAX_DEST_RD_ATOMIC)
    .union(QpAttrMask::DEST_QPN);

/// INIT_QP_ATTR's `ib_uverbs_qp_attr` as a [`QpAttr`]: each attribute its mask names, and
/// nothing else; a mask bit [`QpAttr`] cannot carry is an error, not a silent drop.
fn qp_attr_from_abi(r: &UverbsQpAttr) -> Result<QpAttr> {
    let verb = "INIT_QP_ATTR";
    let mask = QpAttrMask::from_bits_retain(r.qp_attr_mask);
    let carried = CM_CARRIED;
    if !carried.contains(mask) {
        return Err(Error::malformed(
            verb,
            format!(
                "attribute mask {:#x} names attributes this crate cannot set",
                mask.difference(carried).bits()
            ),
        ));
    }
    let state = |raw: u32| {
        u8::try_from(raw)
            .ok()
            .and_then(QpState::from_raw)
            .ok_or_else(|| Error::malformed(verb, format!("QP state {raw}")))
    };
    let has = |bit| mask.contains(bit);
    let path_mtu = if has(QpAttrMask::PATH_MTU) {
        Some(
            u8::try_from(r.path_mtu)
                .ok()
                .and_then(Mtu::from_raw)
                .ok_or_else(|| Error::malformed(verb, format!("path MTU {}", r.path_mtu)))?,
        )
    } else {
        None
    };
    Ok(QpAttr {
        state: if has(QpAttrMask::STATE) {
            Some(state(r.qp_state)?)
        } else {
            None
        },
        cur_state: if has(QpAttrMask::CUR_STATE) {
            Some(state(r.cur_qp_state)?)
        } else {
            None
        },
        en_sqd_async_notify: has(QpAttrMask::EN_SQD_ASYNC_NOTIFY).then_some(r.en_sqd_async_notify != 0),
        access: has(QpAttrMask::ACCESS_FLAGS).then_some(AccessFlags::from_bits_retain(r.qp_access_flags)),
        pkey_index: has(QpAttrMask::PKEY_INDEX).then_some(r.pkey_index),
        port_num: has(QpAttrMask::PORT).then_some(r.port_num),
        qkey: has(QpAttrMask::QKEY).then_some(r.qkey),
        ah: has(QpAttrMask::AV).then(|| ah_from_abi(&r.ah_attr)),
        path_mtu,
        timeout: has(QpAttrMask::TIMEOUT).then_some(r.timeout),
        retry_cnt: has(QpAttrMask::RETRY_CNT).then_some(r.retry_cnt),
        rnr_retry: has(QpAttrMask::RNR_RETRY).then_some(r.rnr_retry),
        rq_psn: has(QpAttrMask::RQ_PSN).then_some(r.rq_psn),
        max_rd_atomic: has(QpAttrMask::MAX_QP_RD_ATOMIC).then_some(r.max_rd_atomic),
        min_rnr_timer: has(QpAttrMask::MIN_RNR_TIMER).then_some(r.min_rnr_timer),
        sq_psn: has(QpAttrMask::SQ_PSN).then_some(r.sq_psn),
        max_dest_rd_atomic: has(QpAttrMask::MAX_DEST_RD_ATOMIC).then_some(r.max_dest_rd_atomic),
        dest_qpn: has(QpAttrMask::DEST_QPN).then_some(r.dest_qp_num),
        alt_path: None,
        path_mig_state: None,
        bare_mask: QpAttrMask::empty(),
    })
}

/// INIT_QP_ATTR's `ib_uverbs_qp_attr` as the MODIFY_QP request for QP `qp_handle`, and the
/// state it moves to: exactly `qp_attr_from_abi(r)?.to_abi(qp_handle)` (the same checks and
/// typed errors, every attribute the mask does not name zero), without the [`QpAttr`] in
/// between.
fn modify_from_cm(r: &UverbsQpAttr, qp_handle: u32) -> Result<(ModifyQp, Option<QpState>)> {
    let verb = "INIT_QP_ATTR";
    let mask = QpAttrMask::from_bits_retain(r.qp_attr_mask);
    if !CM_CARRIED.contains(mask) {
        return Err(Error::malformed(
            verb,
            format!(
                "attribute mask {:#x} names attributes this crate cannot set",
                mask.difference(CM_CARRIED).bits()
            ),
        ));
    }
    let has = |bit| mask.contains(bit);
    let state = |bit, raw: u32| -> Result<Option<QpState>> {
        if !has(bit) {
            return Ok(None);
        }
        u8::try_from(raw)
            .ok()
            .and_then(QpState::from_raw)
            .map(Some)
            .ok_or_else(|| Error::malformed(verb, format!("QP state {raw}")))
    };
    let path_mtu = if has(QpAttrMask::PATH_MTU) {
        u8::try_from(r.path_mtu)
            .ok()
            .and_then(Mtu::from_raw)
            .ok_or_else(|| Error::malformed(verb, format!("path MTU {}", r.path_mtu)))? as u8
    } else {
        0
    };
    // Checked in `qp_attr_from_abi`'s order: the MTU, then the states.
    let next = state(QpAttrMask::STATE, r.qp_state)?;
    let cur = state(QpAttrMask::CUR_STATE, r.cur_qp_state)?;
    let a = &r.ah_attr;
    let dest = if has(QpAttrMask::AV) {
        let global = a.is_global != 0;
        let grh = |v: u8| if global { v } else { 0 };
        QpDest {
            dgid: if global { a.dgid } else { [0; 16] },
            flow_label: if global { a.flow_label } else { 0 },
            dlid: a.dlid,
            reserved: 0,
            sgid_index: grh(a.sgid_index),
            hop_limit: grh(a.hop_limit),
            traffic_class: grh(a.traffic_class),
            sl: a.sl,
            src_path_bits: a.src_path_bits,
            static_rate: a.static_rate,
            is_global: u8::from(global),
            port_num: a.port_num,
        }
    } else {
        QpDest::default()
    };
    let m = ModifyQp {
        dest,
        alt_dest: QpDest::default(),
        qp_handle,
        attr_mask: mask.bits(),
        qkey: pick(mask, QpAttrMask::QKEY, r.qkey),
        rq_psn: pick(mask, QpAttrMask::RQ_PSN, r.rq_psn),
        sq_psn: pick(mask, QpAttrMask::SQ_PSN, r.sq_psn),
        dest_qp_num: pick(mask, QpAttrMask::DEST_QPN, r.dest_qp_num),
        qp_access_flags: pick(mask, QpAttrMask::ACCESS_FLAGS, r.qp_access_flags),
        pkey_index: pick(mask, QpAttrMask::PKEY_INDEX, r.pkey_index),
        alt_pkey_index: 0,
        qp_state: next.map_or(0, |s| s as u8),
        cur_qp_state: cur.map_or(0, |s| s as u8),
        path_mtu,
        path_mig_state: 0,
        en_sqd_async_notify: pick(
            mask,
            QpAttrMask::EN_SQD_ASYNC_NOTIFY,
            u8::from(r.en_sqd_async_notify != 0),
        ),
        max_rd_atomic: pick(mask, QpAttrMask::MAX_QP_RD_ATOMIC, r.max_rd_atomic),
        max_dest_rd_atomic: pick(mask, QpAttrMask::MAX_DEST_RD_ATOMIC, r.max_dest_rd_atomic),
        min_rnr_timer: pick(mask, QpAttrMask::MIN_RNR_TIMER, r.min_rnr_timer),
        port_num: pick(mask, QpAttrMask::PORT, r.port_num),
        timeout: pick(mask, QpAttrMask::TIMEOUT, r.timeout),
        retry_cnt: pick(mask, QpAttrMask::RETRY_CNT, r.retry_cnt),
        rnr_retry: pick(mask, QpAttrMask::RNR_RETRY, r.rnr_retry),
        alt_port_num: 0,
        alt_timeout: 0,
        reserved: [0; 2],
    };
    Ok((m, next))
}

/// `v` if `mask` names `bit`, else zero.
fn pick<T: Default>(mask: QpAttrMask, bit: QpAttrMask, v: T) -> T {
    if mask.contains(bit) {
        v
    } else {
        T::default()
    }
}

/// `ib_uverbs_ah_attr` (the CM's order) as an [`AhAttr`].
fn ah_from_abi(a: &AhAttrAbi) -> AhAttr {
    AhAttr {
        port_num: a.port_num,
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        grh: (a.is_global != 0).then_some(GlobalRoute {
            dgid: a.dgid,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
            flow_label: a.flow_label,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RTR as rxe's CM returns it (mask 0x129181, seen in the guest): every named field lands
    /// in its `QpAttr` field, the AV converted from the CM's field order.
    #[test]
    fn init_qp_attr_converts_field_by_field() {
        let mut r = UverbsQpAttr::new_zeroed();
        r.qp_attr_mask = 0x129181;
        r.qp_state = QpState::Rtr as u32;
        r.path_mtu = 3;
        r.rq_psn = 0xabcdef;
        r.dest_qp_num = 17;
        r.max_dest_rd_atomic = 128;
        r.min_rnr_timer = 12;
        r.sq_psn = 99; // not in the mask: must not be set
        r.ah_attr.dgid[10..].copy_from_slice(&[0xff, 0xff, 169, 254, 77, 1]);
        (r.ah_attr.flow_label, r.ah_attr.sgid_index, r.ah_attr.hop_limit) = (0x12345, 1, 64);
        (r.ah_attr.traffic_class, r.ah_attr.is_global, r.ah_attr.port_num) = (4, 1, 1);
        (r.ah_attr.dlid, r.ah_attr.sl) = (7, 2);
        let a = qp_attr_from_abi(&r).unwrap();
        let grh = a.ah.as_ref().and_then(|ah| ah.grh.as_ref()).unwrap();
        assert_eq!(grh.dgid, r.ah_attr.dgid);
        assert_eq!(
            (grh.flow_label, grh.sgid_index, grh.hop_limit, grh.traffic_class),
            (0x12345, 1, 64, 4)
        );
        let ah = a.ah.as_ref().unwrap();
        assert_eq!((ah.port_num, ah.dlid, ah.sl), (1, 7, 2));
        assert_eq!(a.state, Some(QpState::Rtr));
        assert_eq!(a.path_mtu, Some(Mtu::Mtu1024));
        assert_eq!(
            (a.rq_psn, a.dest_qpn, a.max_dest_rd_atomic, a.min_rnr_timer),
            (Some(0xabcdef), Some(17), Some(128), Some(12))
        );
        assert_eq!((a.sq_psn, a.access, a.timeout, a.port_num), (None, None, None, None));
    }

    /// The direct conversion the CM's moves use gives the very request (byte for byte) and
    /// errors that going through a `QpAttr` gives, for any mask and any values.
    #[test]
    fn modify_from_cm_is_qp_attr_then_to_abi() {
        use zerocopy::IntoBytes;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..20_000 {
            let mut r = UverbsQpAttr::new_zeroed();
            for b in r.as_mut_bytes() {
                *b = next() as u8;
            }
            // Mostly masks this crate carries, sometimes any; states and MTUs mostly valid.
            let any = next() as u32;
            r.qp_attr_mask = if round % 8 == 0 { any } else { any & CM_CARRIED.bits() };
            if round % 5 != 0 {
                r.qp_state = (next() % 7) as u32;
                r.cur_qp_state = (next() % 7) as u32;
                r.path_mtu = (next() % 5 + 1) as u32;
            }
            if round % 3 == 0 {
                r.ah_attr.is_global = 0;
            }
            let handle = next() as u32;
            let via_attr = qp_attr_from_abi(&r).and_then(|a| a.to_abi(handle).map(|m| (m, a.state)));
            match (modify_from_cm(&r, handle), via_attr) {
                (Ok((m, state)), Ok((n, want))) => {
                    assert_eq!(m.as_bytes(), n.as_bytes(), "mask {:#x}", r.qp_attr_mask);
                    assert_eq!(state, want);
                }
                (Err(e), Err(f)) => assert_eq!(e.to_string(), f.to_string()),
                (m, n) => panic!("mask {:#x}: {:?} against {:?}", r.qp_attr_mask, m.err(), n.err()),
            }
        }
    }

    #[test]
    fn init_qp_attr_refuses_what_it_cannot_carry() {
        let mut r = UverbsQpAttr::new_zeroed();
        r.qp_attr_mask = (QpAttrMask::STATE | QpAttrMask::ALT_PATH).bits();
        r.qp_state = QpState::Rtr as u32;
        let err = qp_attr_from_abi(&r).unwrap_err();
        assert!(err.to_string().contains("0x4000"), "{err}");
        r.qp_attr_mask = QpAttrMask::STATE.bits();
        r.qp_state = 9;
        assert!(matches!(qp_attr_from_abi(&r), Err(Error::Malformed { .. })));
        r.qp_attr_mask = (QpAttrMask::STATE | QpAttrMask::PATH_MTU).bits();
        (r.qp_state, r.path_mtu) = (QpState::Rtr as u32, 0x103);
        assert!(matches!(qp_attr_from_abi(&r), Err(Error::Malformed { .. })));
    }

    #[test]
    fn private_data_limits_follow_the_transport_and_guids_print_as_sysfs() {
        let roce = PrivateDataLimits::of(Transport::IB);
        assert_eq!((roce.connect, roce.accept, roce.reject), (56, 196, 148));
        let err = PrivateDataLimits::check(roce.connect, "connect", &[0; 57]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "connect: 57 bytes of private data, the transport carries at most 56"
        );
        PrivateDataLimits::check(roce.connect, "connect", &[0; 56]).unwrap();
        assert_eq!(PrivateDataLimits::of(Transport::IWARP).connect, 251);
        assert_eq!(sysfs_guid(0x0250_56ff_fe8a_1e2f), "0250:56ff:fe8a:1e2f");
    }
}
