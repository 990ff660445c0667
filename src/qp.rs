//! Queue pairs: creation, the state machine (modify/query) and posting.

use crate::attr::{AhAttr, GlobalRoute, MigState, Mtu, QpAttrMask, QpCap, QpState, QpType};
use crate::chain::{CSendWr, SendChain, SlowDecode};
use crate::context::ContextInner;
use crate::cq::{Cq, CqInner, EventsReported};
use crate::error::{Error, Result, WrReject};
use crate::front_end::{GatheredChains, Queues};
use crate::held::QpHeld;
use crate::mr::AccessFlags;
use crate::pd::{Pd, PdInner};
use crate::provider::{create_object, KernelCall, QpCreated, QpQueues, QpRequest};
use crate::srq::{Srq, SrqInner};
use crate::sys::abi::{self, DestroyQpResp, ModifyQp, QpDest, QueryQp, QueryQpResp};
use crate::sys::cmd;
use crate::sys::fork::Owner;
use crate::sys::ioctl::{object, UHW_IN, UHW_OUT};
use crate::wr::{ContextId, RecvWr, SendList, SendWr};
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use zerocopy::IntoBytes;

const METHOD_QP_CREATE: u16 = 0;
const METHOD_QP_DESTROY: u16 = 1;
const CREATE_FLAG_SQ_SIG_ALL: u32 = 1 << 12;

/// `attr` as the kernel's address vector.
fn dest_to_abi(attr: AhAttr) -> QpDest {
    let grh = attr.grh.unwrap_or_default();
    QpDest {
        dgid: grh.dgid,
        flow_label: grh.flow_label,
        dlid: attr.dlid,
        reserved: 0,
        sgid_index: grh.sgid_index,
        hop_limit: grh.hop_limit,
        traffic_class: grh.traffic_class,
        sl: attr.sl,
        src_path_bits: attr.src_path_bits,
        static_rate: attr.static_rate,
        is_global: u8::from(attr.grh.is_some()),
        port_num: attr.port_num,
    }
}

fn cap_to_abi(c: QpCap) -> abi::QpCap {
    abi::QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn cap_from_abi(c: abi::QpCap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// The kernel's address vector as an [`AhAttr`].
fn dest_from_abi(d: &QpDest) -> AhAttr {
    AhAttr {
        port_num: d.port_num,
        dlid: d.dlid,
        sl: d.sl,
        src_path_bits: d.src_path_bits,
        static_rate: d.static_rate,
        grh: (d.is_global != 0).then_some(GlobalRoute {
            dgid: d.dgid,
            sgid_index: d.sgid_index,
            hop_limit: d.hop_limit,
            traffic_class: d.traffic_class,
            flow_label: d.flow_label,
        }),
    }
}

/// The alternate path of a connected QP ([`QpAttrMask::ALT_PATH`]), which the device
/// migrates to when the primary path fails. Linux accepts alternate paths on InfiniBand ports
/// only: on RoCE (rxe) MODIFY_QP refuses them with EINVAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AltPath {
    /// Address vector of the alternate path.
    pub ah: AhAttr,
    /// P_Key index on the alternate port.
    pub pkey_index: u16,
    /// Alternate port; the kernel requires it to equal `ah.port_num`.
    pub port_num: u8,
    /// Local ack timeout on the alternate path (4.096 µs × 2^timeout).
    pub timeout: u8,
}

/// QP attributes for `modify`: each `Some` field is set, and sets its [`QpAttrMask`] bit, so
/// the mask can never disagree with the values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// Next state.
    pub state: Option<QpState>,
    /// The state the caller believes the QP is in.
    pub cur_state: Option<QpState>,
    /// Ask for an async event when the SQ drains (SQD).
    pub en_sqd_async_notify: Option<bool>,
    /// Remote access the QP allows.
    pub access: Option<AccessFlags>,
    /// P_Key index.
    pub pkey_index: Option<u16>,
    /// Port.
    pub port_num: Option<u8>,
    /// Q_Key (UD).
    pub qkey: Option<u32>,
    /// Primary path address vector.
    pub ah: Option<AhAttr>,
    /// Path MTU.
    pub path_mtu: Option<Mtu>,
    /// Local ack timeout (4.096 µs × 2^timeout).
    pub timeout: Option<u8>,
    /// Transport retries.
    pub retry_cnt: Option<u8>,
    /// RNR retries (7 = infinite).
    pub rnr_retry: Option<u8>,
    /// Receive PSN.
    pub rq_psn: Option<u32>,
    /// Outstanding RDMA reads/atomics as initiator.
    pub max_rd_atomic: Option<u8>,
    /// Minimum RNR NAK timer.
    pub min_rnr_timer: Option<u8>,
    /// Send PSN.
    pub sq_psn: Option<u32>,
    /// Outstanding RDMA reads/atomics as target.
    pub max_dest_rd_atomic: Option<u8>,
    /// Destination QP number.
    pub dest_qpn: Option<u32>,
    /// Alternate path.
    pub alt_path: Option<AltPath>,
    /// Path migration state; a value must fit the kernel's one byte.
    pub path_mig_state: Option<MigState>,
    /// Mask bits sent as given, with no value: only bits no field above sets
    /// ([`QpAttrMask::CAP`], as MODIFY_QP has no capability fields; `RATE_LIMIT`; bits the
    /// type does not name). The kernel answers for them (Linux 6.1: EINVAL for `CAP` at every
    /// transition, EOPNOTSUPP for bits past `DEST_QPN`: docs/kernel-facts.md). For a caller
    /// handing on a mask it did not build (a libibverbs provider); a bit a field sets is
    /// refused ([`Error::InvalidArgument`]).
    pub bare_mask: QpAttrMask,
}

impl QpAttr {
    pub(crate) fn to_abi(&self, qp_handle: u32) -> Result<ModifyQp> {
        let mut m = ModifyQp {
            qp_handle,
            ..Default::default()
        };
        let mut set = |bit: QpAttrMask, present: bool| {
            if present {
                m.attr_mask |= bit.bits();
            }
        };
        set(QpAttrMask::STATE, self.state.is_some());
        set(QpAttrMask::CUR_STATE, self.cur_state.is_some());
        set(QpAttrMask::EN_SQD_ASYNC_NOTIFY, self.en_sqd_async_notify.is_some());
        set(QpAttrMask::ACCESS_FLAGS, self.access.is_some());
        set(QpAttrMask::PKEY_INDEX, self.pkey_index.is_some());
        set(QpAttrMask::PORT, self.port_num.is_some());
        set(QpAttrMask::QKEY, self.qkey.is_some());
        set(QpAttrMask::AV, self.ah.is_some());
        set(QpAttrMask::PATH_MTU, self.path_mtu.is_some());
        set(QpAttrMask::TIMEOUT, self.timeout.is_some());
        set(QpAttrMask::RETRY_CNT, self.retry_cnt.is_some());
        set(QpAttrMask::RNR_RETRY, self.rnr_retry.is_some());
        set(QpAttrMask::RQ_PSN, self.rq_psn.is_some());
        set(QpAttrMask::MAX_QP_RD_ATOMIC, self.max_rd_atomic.is_some());
        set(QpAttrMask::MIN_RNR_TIMER, self.min_rnr_timer.is_some());
        set(QpAttrMask::SQ_PSN, self.sq_psn.is_some());
        set(QpAttrMask::MAX_DEST_RD_ATOMIC, self.max_dest_rd_atomic.is_some());
        set(QpAttrMask::DEST_QPN, self.dest_qpn.is_some());
        set(QpAttrMask::ALT_PATH, self.alt_path.is_some());
        set(QpAttrMask::PATH_MIG_STATE, self.path_mig_state.is_some());
        if self.bare_mask.bare() != self.bare_mask {
            return Err(Error::invalid(
                "MODIFY_QP",
                format!(
                    "bare mask bits {:#x} name attributes: set their fields instead",
                    self.bare_mask.difference(self.bare_mask.bare()).bits()
                ),
            ));
        }
        m.attr_mask |= self.bare_mask.bits();
        m.qp_state = self.state.map_or(0, |s| s as u8);
        m.cur_qp_state = self.cur_state.map_or(0, |s| s as u8);
        m.en_sqd_async_notify = self.en_sqd_async_notify.map_or(0, u8::from);
        m.qp_access_flags = self.access.map_or(0, |a| a.bits());
        m.pkey_index = self.pkey_index.unwrap_or(0);
        m.port_num = self.port_num.unwrap_or(0);
        m.qkey = self.qkey.unwrap_or(0);
        m.dest = self.ah.map(dest_to_abi).unwrap_or_default();
        m.path_mtu = self.path_mtu.map_or(0, |v| v as u8);
        m.timeout = self.timeout.unwrap_or(0);
        m.retry_cnt = self.retry_cnt.unwrap_or(0);
        m.rnr_retry = self.rnr_retry.unwrap_or(0);
        m.rq_psn = self.rq_psn.unwrap_or(0);
        m.max_rd_atomic = self.max_rd_atomic.unwrap_or(0);
        m.min_rnr_timer = self.min_rnr_timer.unwrap_or(0);
        m.sq_psn = self.sq_psn.unwrap_or(0);
        m.max_dest_rd_atomic = self.max_dest_rd_atomic.unwrap_or(0);
        m.dest_qp_num = self.dest_qpn.unwrap_or(0);
        if let Some(alt) = self.alt_path {
            m.alt_dest = dest_to_abi(alt.ah);
            m.alt_pkey_index = alt.pkey_index;
            m.alt_port_num = alt.port_num;
            m.alt_timeout = alt.timeout;
        }
        if let Some(mig) = self.path_mig_state {
            m.path_mig_state = u8::try_from(mig.0).map_err(|_| {
                Error::invalid(
                    "MODIFY_QP",
                    format!("path migration state {} does not fit in a byte", mig.0),
                )
            })?;
        }
        Ok(m)
    }
}

/// The MODIFY_QP request of a [`QpAttr`] that names the state alone.
fn state_only(qp_handle: u32, state: QpState) -> ModifyQp {
    ModifyQp {
        qp_handle,
        attr_mask: QpAttrMask::STATE.bits(),
        qp_state: state as u8,
        ..Default::default()
    }
}

/// What QUERY_QP reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpInfo {
    /// Every attribute, all `Some`.
    pub attr: QpAttr,
    /// Queue capabilities.
    pub cap: QpCap,
    /// Whether every send is signaled.
    pub sq_sig_all: bool,
    /// Whether the send queue is draining (SQD).
    pub sq_draining: bool,
}

/// What [`Qp::to_rtr`] and [`Qp::to_rts`] set on an RC QP besides the path, QP number and
/// PSNs (UC QPs take none of them). [`Default`] is for a data plane: a peer that stops
/// answering fails the send with `RETRY_EXC_ERR` after about half a second, never hangs.
/// Pass your own to [`Qp::to_rtr_with`] and [`Qp::to_rts_with`]; any other attribute goes
/// through [`Qp::modify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectAttr {
    /// Local ACK timeout, 4.096 µs × 2^`timeout` (0: none). Default 14, about 67 ms.
    pub timeout: u8,
    /// Transport retries after a timeout before the send fails with `RETRY_EXC_ERR`, 0–7.
    /// Default 6. rxe retries forever with 7 (`docs/kernel-facts.md`), so a dead peer
    /// would never surface.
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (the peer had no receive posted), 0–6, or 7 for forever.
    /// Default 7: a peer slow to post receives delays sends but never fails them; a dead
    /// peer still fails them through `retry_cnt`.
    pub rnr_retry: u8,
    /// How long the peer is told to wait before retrying after this QP sent an RNR NAK,
    /// as the IB spec's table code (12: 0.64 ms). Default 12.
    pub min_rnr_timer: u8,
    /// RDMA reads and atomics this QP keeps outstanding as initiator. Default 16; a device
    /// that allows fewer (`DeviceAttr::max_qp_init_rd_atom`) refuses it with EINVAL.
    pub max_rd_atomic: u8,
    /// RDMA reads and atomics this QP accepts outstanding as target. Default 16; the
    /// device limit is `DeviceAttr::max_qp_rd_atom`.
    pub max_dest_rd_atomic: u8,
}

impl Default for ConnectAttr {
    fn default() -> Self {
        Self {
            timeout: 14,
            retry_cnt: 6,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
        }
    }
}

/// How to create a QP.
#[derive(Debug, Clone, Copy)]
pub struct QpInit<'a> {
    /// Transport.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: &'a Cq,
    /// CQ for receive completions.
    pub recv_cq: &'a Cq,
    /// Queue sizes; the kernel may grant more.
    pub cap: QpCap,
    /// Signal every send, whatever its flags.
    pub sq_sig_all: bool,
    /// Take receives from this SRQ instead of a receive queue of the QP's own.
    pub srq: Option<&'a Srq>,
    /// The value naming the QP in events; `None` picks a fresh one.
    pub user_handle: Option<u64>,
}

impl<'a> QpInit<'a> {
    /// The inline data [`QpInit::new`] asks for: a size every provider grants without growing
    /// its send queue entries (rxe grants at least 16 bytes per scatter/gather entry anyway,
    /// mlx5 what was asked, rounded up), so [`Qp::send_inline`] of up to this many bytes works
    /// the same everywhere.
    pub const INLINE: u32 = 16;

    /// A QP of `qp_type` on these CQs with 128 send and 128 receive work requests, one
    /// scatter/gather entry each, [`QpInit::INLINE`] bytes of inline data, sends signaled only when they ask
    /// (`sq_sig_all` false), its own receive queue and a fresh user handle. Change the
    /// fields before `create_qp` for more; the kernel may grant more than asked
    /// ([`Qp::cap`]).
    ///
    /// An awaitable CQ (`aio::AsyncCq`, feature `tokio`) lends its [`Cq`] here as well:
    /// `QpInit::new(QpType::Rc, &acq, &acq)`.
    pub fn new(qp_type: QpType, send_cq: &'a Cq, recv_cq: &'a Cq) -> Self {
        Self {
            qp_type,
            send_cq,
            recv_cq,
            cap: QpCap {
                max_send_wr: 128,
                max_recv_wr: 128,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: Self::INLINE,
            },
            sq_sig_all: false,
            srq: None,
            user_handle: None,
        }
    }
}

/// A queue pair.
pub struct Qp {
    /// The provider's queues, through the vendor contract and the front-end interface.
    pub(crate) queues: Queues,
    pub(crate) owner: Owner,
    /// The buffers the safe posts (`crate::owned`) lent the device, per queue (`sends`,
    /// `recvs`); dropped only after the kernel destroyed the QP.
    pub(crate) held: QpHeld,
    handle: u32,
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    state: QpState,
    /// [`Qp::post_send`] hands the list straight to the provider: the state allows sends and
    /// the QP is connected (a UD QP's AHs are checked first).
    direct_send: bool,
    /// The context it belongs to: a UD request's AH must be of it.
    pub(crate) context: ContextId,
    user_handle: u64,
    /// Set once an explicit [`Qp::destroy`] succeeded, so `Drop` does not repeat it.
    destroyed: bool,
    /// Its number among the PD's QPs, for regions that wait for responders
    /// (`PdInner::qp_released`).
    responder: u64,
    // Dropped after `queues` is released by `Drop`; kept alive so the kernel objects the QP
    // uses outlive it.
    pub(crate) pd: Arc<PdInner>,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    _srq: Option<Arc<SrqInner>>,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .field("type", &self.qp_type)
            .field("state", &self.state)
            .field("cap", &self.cap)
            .finish()
    }
}

impl Pd {
    /// Creates a QP in this PD.
    pub fn create_qp(&self, init: &QpInit<'_>) -> Result<Qp> {
        Qp::new(self, init)
    }
}

impl Qp {
    #[allow(unsafe_code)] // hands the provider's queues to the maker its context pairs with it
    fn new(pd: &Pd, init: &QpInit<'_>) -> Result<Self> {
        let ctx = &pd.inner.ctx;
        // Before the provider's step, as for CQs.
        ctx.check_owner("CREATE_QP")?;
        let same_ctx = |cq: &Cq| Arc::ptr_eq(&cq.inner.ctx, ctx);
        let srq_ctx = init.srq.is_none_or(|s| Arc::ptr_eq(&s.inner.pd.ctx, ctx));
        if !same_ctx(init.send_cq) || !same_ctx(init.recv_cq) || !srq_ctx {
            return Err(Error::invalid(
                "CREATE_QP",
                "CQs, SRQ and PD belong to different contexts",
            ));
        }
        let user_handle = init.user_handle.unwrap_or_else(|| ctx.new_user_handle());
        let request = QpRequest {
            qp_type: init.qp_type,
            cap: init.cap,
            send_cq: init.send_cq.ring(),
            recv_cq: init.recv_cq.ring(),
            srq: init.srq.map(Srq::queue),
            sq_sig_all: init.sq_sig_all,
        };
        let (created, provider) = create_object(
            "CREATE_QP",
            |kernel| ctx.provider.create_qp(&request, kernel),
            |cap_asked: QpCap, drv_in: &[u8], drv_out: &mut [u8]| {
                let asked = cap_to_abi(cap_asked);
                let mut cap = abi::QpCap::default();
                let mut qpn = 0u32;
                let flags = if init.sq_sig_all { CREATE_FLAG_SQ_SIG_ALL } else { 0 };
                let qp_type = init.qp_type as u64;
                let mut call = ctx.ioctl(object::QP, METHOD_QP_CREATE);
                let handle = call.new_handle(0);
                call.handle(2, pd.inner.handle)
                    .handle(4, init.send_cq.inner.handle())
                    .handle(5, init.recv_cq.inner.handle())
                    .input(7, &user_handle)
                    .input(8, &asked)
                    .input(9, &qp_type)
                    .input(10, &flags)
                    .fd(12, ctx.async_events.kernel().as_raw_fd())
                    .output(13, cap.as_mut_bytes())
                    .output(14, qpn.as_mut_bytes());
                if let Some(srq) = init.srq {
                    call.handle(3, srq.inner.handle);
                }
                if !drv_in.is_empty() {
                    call.input(UHW_IN, drv_in);
                }
                if !drv_out.is_empty() {
                    call.output(UHW_OUT, drv_out);
                }
                let done = call.execute(ctx.fd(), "CREATE_QP")?;
                Ok(QpCreated {
                    handle: done.handle(handle),
                    qpn,
                    cap: cap_from_abi(cap),
                })
            },
            |c| drop(destroy_qp(ctx, c.handle)),
        )?;
        let recv_depth = if let Some(srq) = init.srq {
            // Its receive completions may give back the SRQ's safe receives (`crate::owned`).
            srq.inner.members.join(created.qpn, init.recv_cq.identity());
            0
        } else {
            provider.cap.max_recv_wr
        };
        Ok(Self {
            held: QpHeld::new(provider.cap.max_send_wr, recv_depth),
            // SAFETY: the context's provider made these queues (`ContextInner::queues`).
            queues: unsafe { (ctx.queues)(provider.queues) },
            owner: ctx.owner,
            handle: created.handle,
            qpn: created.qpn,
            qp_type: init.qp_type,
            cap: provider.cap,
            state: QpState::Reset,
            direct_send: false,
            context: pd.inner.context_id(),
            user_handle,
            destroyed: false,
            responder: pd.inner.qp_created(),
            pd: pd.inner.clone(),
            _send_cq: init.send_cq.inner.clone(),
            _recv_cq: init.recv_cq.inner.clone(),
            _srq: init.srq.map(|s| s.inner.clone()),
        })
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The kernel's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The value naming this QP in [`crate::AsyncEvent`]s.
    pub fn user_handle(&self) -> u64 {
        self.user_handle
    }

    /// The transport.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Capabilities the kernel granted.
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// The device the QP is on.
    pub(crate) fn context_device(&self) -> &crate::device::DeviceInfo {
        &self.pd.ctx.device
    }

    /// The context the QP was created in.
    pub(crate) fn context(&self) -> crate::context::Context {
        crate::context::Context {
            inner: self.pd.ctx.clone(),
        }
    }

    /// The state as of the last `modify` or `query` (the device may since have moved it to
    /// an error state).
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Changes attributes and/or state (MODIFY_QP).
    ///
    /// A move to RESET is refused with [`Error::RequestsOutstanding`] while the safe posts
    /// (`crate::owned`) count requests of the QP: the device drops queued requests at RESET
    /// without completions, so their buffers would never come back, and on rxe a transfer in
    /// progress may still write one after the move (docs/kernel-facts.md). Move the QP to ERR
    /// first: every queued request then completes, flushed, and gives its buffer back.
    pub fn modify(&mut self, attr: &QpAttr) -> Result<()> {
        self.check_move(attr.state)?;
        let req = attr.to_abi(self.handle)?;
        self.run_modify(&req, attr.state)
    }

    /// MODIFY_QP with the request already in the ABI's form (the connection manager's
    /// attributes, converted once: `crate::cm`), `state` the one its mask names; the same
    /// checks as [`Qp::modify`].
    pub(crate) fn modify_abi(&mut self, req: &ModifyQp, state: Option<QpState>) -> Result<()> {
        self.check_move(state)?;
        self.run_modify(req, state)
    }

    /// [`Qp::modify`] with the state alone (the connection manager's moves to ERR and SQD),
    /// its request built directly.
    pub(crate) fn move_to(&mut self, state: QpState) -> Result<()> {
        self.modify_abi(&state_only(self.handle, state), Some(state))
    }

    /// What [`Qp::modify`] refuses before asking the kernel.
    fn check_move(&self, state: Option<QpState>) -> Result<()> {
        self.owner.check("MODIFY_QP")?;
        if state == Some(QpState::Reset) && (self.held.sends.len(), self.held.recvs.len()) != (0, 0) {
            return Err(Error::RequestsOutstanding {
                verb: "MODIFY_QP",
                send: self.held.sends.len(),
                recv: self.held.recvs.len(),
            });
        }
        Ok(())
    }

    fn run_modify(&mut self, req: &ModifyQp, state: Option<QpState>) -> Result<()> {
        let ctx = &self.pd.ctx;
        self.queues.vendor().modify(state, &mut |drv_in, drv_out| {
            cmd::execute_plain(ctx.fd(), "MODIFY_QP", abi::cmd::MODIFY_QP, req, drv_in, drv_out)
        })?;
        if let Some(state) = state {
            self.set_state(state);
            if state == QpState::Reset {
                // A reset ends whatever message its responder was in the middle of.
                self.pd.qp_released(self.responder, false);
            }
        }
        Ok(())
    }

    /// Records a state the kernel moved the QP to by itself: an iWARP QP reaches RTS when its
    /// connection is established and leaves it when the connection closes, with no
    /// MODIFY_QP from user space (and siw's QUERY_QP does not report the state).
    pub(crate) fn kernel_moved_to(&mut self, state: QpState) {
        self.set_state(state);
    }

    /// Records that an iWARP QP's connection came up through a connection manager this
    /// library does not drive, so that its sends are posted: the kernel moved the QP to RTS
    /// with no MODIFY_QP from user space and no event this side sees. For a libibverbs
    /// provider under librdmacm (`dropin/libibverbs`), which learns of the connection only
    /// from the first send posted; code on [`crate::cm`] calls [`crate::cm::CmId::established`]
    /// instead.
    ///
    /// The kernel is asked first, with an empty send doorbell (a POST_SEND of no requests,
    /// which siw refuses with ENOTCONN unless the QP is in RTS, and otherwise answers with
    /// nothing to send): if it refuses, the QP stays in its state and the kernel's error is
    /// returned, and nothing was written into the send queue. Writing first and taking the
    /// doorbell's refusal as the answer would leave the request in the queue, handed over,
    /// where siw runs it once the connection comes up (docs/kernel-facts.md). One state the
    /// doorbell cannot tell from RTS: a QP siw moved to ERROR (a TERMINATE, a reset, a failed
    /// connect) answers an empty doorbell with success, so the QP is taken as connected and
    /// its next send is written into a queue siw already flushed, where it never completes
    /// (its buffer stays held until the QP is destroyed). rdma-core's C siw provider does the
    /// same; 6.1's QUERY_QP on siw reports no state to check against.
    ///
    /// Refused with [`Error::InvalidArgument`] on a QP of a device that is not iWARP, or one
    /// not in INIT or RTR (the states an iWARP QP waits for its connection in).
    #[doc(hidden)]
    pub fn iwarp_connected_elsewhere(&mut self) -> Result<()> {
        const VERB: &str = "iwarp_connected_elsewhere";
        if self.context_device().transport()? != crate::attr::Transport::IWARP {
            return Err(Error::invalid(VERB, "the QP's device is not iWARP"));
        }
        if !matches!(self.state, QpState::Init | QpState::Rtr) {
            return Err(Error::invalid(VERB, format!("the QP is in state {:?}", self.state)));
        }
        cmd::SendDoorbell::new(self.handle).ring(self.pd.ctx.fd())?;
        self.kernel_moved_to(QpState::Rts);
        Ok(())
    }

    /// Records the state, opening or closing the safe posts' queues (`crate::owned`) with it.
    fn set_state(&mut self, state: QpState) {
        self.state = state;
        self.direct_send = state >= QpState::Rts && self.qp_type != QpType::Ud;
        self.held.sends.set_open(state >= QpState::Rts);
        // Closed in ERR too: a receive posted then may never be flushed (rxe on Linux 6.1
        // flushes only what was queued when the QP failed), and would hold off RESET for good.
        self.held
            .recvs
            .set_open(!matches!(state, QpState::Reset | QpState::Err));
    }

    /// Reads back every attribute (QUERY_QP).
    pub fn query(&mut self) -> Result<QpInfo> {
        let req = QueryQp {
            response: 0,
            qp_handle: self.handle,
            // Everything QUERY_QP can report.
            attr_mask: QpAttrMask::all().difference(QpAttrMask::RATE_LIMIT).bits(),
        };
        let r: QueryQpResp = self.ctx().write_cmd("QUERY_QP", abi::cmd::QUERY_QP, &req)?;
        let (mut state, mut cur_state) = (qp_state(r.qp_state)?, qp_state(r.cur_qp_state)?);
        // The kernel moves a QP into or out of RESET only on a MODIFY_QP, which goes through
        // this side. So RESET reported for a QP tracked elsewhere is a driver that leaves the
        // state out of its answer (6.1's siw fills neither field), and a QP tracked in RESET
        // is still there whatever is reported (6.12's siw reports its idle state as INIT);
        // the tracked state stands (docs/kernel-facts.md).
        if (state == QpState::Reset) != (self.state == QpState::Reset) {
            (state, cur_state) = (self.state, self.state);
        }
        self.set_state(state);
        let info = QpInfo {
            attr: QpAttr {
                state: Some(state),
                cur_state: Some(cur_state),
                en_sqd_async_notify: None,
                access: Some(AccessFlags::from_bits_retain(r.qp_access_flags)),
                pkey_index: Some(r.pkey_index),
                port_num: Some(r.port_num),
                qkey: Some(r.qkey),
                ah: Some(dest_from_abi(&r.dest)),
                path_mtu: Mtu::from_raw(r.path_mtu),
                timeout: Some(r.timeout),
                retry_cnt: Some(r.retry_cnt),
                rnr_retry: Some(r.rnr_retry),
                rq_psn: Some(r.rq_psn),
                max_rd_atomic: Some(r.max_rd_atomic),
                min_rnr_timer: Some(r.min_rnr_timer),
                sq_psn: Some(r.sq_psn),
                max_dest_rd_atomic: Some(r.max_dest_rd_atomic),
                dest_qpn: Some(r.dest_qp_num),
                alt_path: Some(AltPath {
                    ah: dest_from_abi(&r.alt_dest),
                    pkey_index: r.alt_pkey_index,
                    port_num: r.alt_port_num,
                    timeout: r.alt_timeout,
                }),
                path_mig_state: Some(MigState(r.path_mig_state.into())),
                bare_mask: QpAttrMask::empty(),
            },
            cap: cap_from_abi(r.cap),
            sq_sig_all: r.sq_sig_all != 0,
            sq_draining: r.sq_draining != 0,
        };
        Ok(info)
    }

    /// RESET → INIT for a connected QP: `port_num`, P_Key index 0 and the remote `access`
    /// the peer gets (`AccessFlags::REMOTE_*`; local write needs no flag here).
    pub fn to_init(&mut self, port_num: u8, access: AccessFlags) -> Result<()> {
        self.modify(&QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(port_num),
            access: Some(access),
            ..Default::default()
        })
    }

    /// INIT → RTR for a connected QP, towards `dest_qpn` at `ah`, expecting the peer's
    /// first PSN `rq_psn`, with the default [`ConnectAttr`] (RC: 16 reads/atomics as target,
    /// RNR timer 0.64 ms).
    pub fn to_rtr(&mut self, ah: AhAttr, dest_qpn: u32, rq_psn: u32, mtu: Mtu) -> Result<()> {
        self.to_rtr_with(ah, dest_qpn, rq_psn, mtu, &ConnectAttr::default())
    }

    /// [`Qp::to_rtr`] with `connect`'s `max_dest_rd_atomic` and `min_rnr_timer` (RC only).
    pub fn to_rtr_with(
        &mut self,
        ah: AhAttr,
        dest_qpn: u32,
        rq_psn: u32,
        mtu: Mtu,
        connect: &ConnectAttr,
    ) -> Result<()> {
        let rc = self.qp_type == QpType::Rc;
        self.modify(&QpAttr {
            state: Some(QpState::Rtr),
            ah: Some(ah),
            path_mtu: Some(mtu),
            dest_qpn: Some(dest_qpn),
            rq_psn: Some(rq_psn),
            max_dest_rd_atomic: rc.then_some(connect.max_dest_rd_atomic),
            min_rnr_timer: rc.then_some(connect.min_rnr_timer),
            ..Default::default()
        })
    }

    /// RESET → INIT → RTR → RTS for a UD QP on `port_num` with `qkey`, P_Key index 0 and
    /// send PSN 0.
    pub fn ud_to_rts(&mut self, port_num: u8, qkey: u32) -> Result<()> {
        self.modify(&QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(port_num),
            qkey: Some(qkey),
            ..Default::default()
        })?;
        self.modify(&QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        })?;
        self.modify(&QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0),
            ..Default::default()
        })
    }

    /// RTR → RTS for a connected QP, sending from PSN `sq_psn`, with the default
    /// [`ConnectAttr`] (RC: ACK timeout about 67 ms, 6 retries, RNR retry forever, 16
    /// reads/atomics as initiator).
    pub fn to_rts(&mut self, sq_psn: u32) -> Result<()> {
        self.to_rts_with(sq_psn, &ConnectAttr::default())
    }

    /// [`Qp::to_rts`] with `connect`'s `timeout`, `retry_cnt`, `rnr_retry` and
    /// `max_rd_atomic` (RC only).
    pub fn to_rts_with(&mut self, sq_psn: u32, connect: &ConnectAttr) -> Result<()> {
        let rc = self.qp_type == QpType::Rc;
        self.modify(&QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(sq_psn),
            timeout: rc.then_some(connect.timeout),
            retry_cnt: rc.then_some(connect.retry_cnt),
            rnr_retry: rc.then_some(connect.rnr_retry),
            max_rd_atomic: rc.then_some(connect.max_rd_atomic),
            ..Default::default()
        })
    }

    /// Posts `wrs` to the send queue with one doorbell.
    ///
    /// On success every request was queued. On [`Error::WorkRequest`] the requests before its
    /// `index` were queued and this one and the rest were not; nothing is lost silently.
    ///
    /// The safe alternatives are [`Qp::send_buf`] and [`Qp::send_inline`].
    ///
    /// # Safety
    /// Until each request completes (or the QP is destroyed), the memory its scatter/gather
    /// entries name must stay valid, and memory the device writes (RDMA read and atomic
    /// targets) must not be accessed. Inline requests' buffers are copied before return. In a
    /// process that uses the safe posts (on any QP or SRQ), no `wr_id` may have bit 63 set:
    /// those ids are the safe posts', and a completion left in a CQ by a destroyed QP can
    /// reach a later QP with the same number.
    #[allow(unsafe_code)] // forwards the caller's contract to the provider
    pub unsafe fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.owner.check("post_send")?;
        if !self.direct_send {
            // SAFETY: forwarded caller contract.
            return unsafe { self.post_send_checked(wrs) };
        }
        // SAFETY: forwarded caller contract; a connected QP reads no AH.
        unsafe { self.queues.vendor().post_send(SendList::new(wrs)) }
    }

    /// [`Qp::post_send`] off the direct path (`direct_send`): the state forbids sends, or the
    /// QP is UD. On UD the requests before the first whose AH another context made are
    /// posted, and that one is refused with [`WrReject::ForeignAh`].
    ///
    /// # Safety
    /// As for [`Qp::post_send`].
    #[allow(unsafe_code)] // forwards the caller's contract to the provider
    #[inline(never)]
    unsafe fn post_send_checked(&mut self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.check_send_state()?;
        let context = self.context;
        let Some(foreign) = wrs.iter().position(|wr| wr.foreign_ah(context)) else {
            // SAFETY: forwarded caller contract; every AH is of this QP's context.
            return unsafe { self.queues.vendor().post_send(SendList::new(wrs)) };
        };
        if foreign > 0 {
            // SAFETY: as above, for the requests before the foreign one.
            unsafe { self.queues.vendor().post_send(SendList::new(&wrs[..foreign])) }?;
        }
        Err(Error::WorkRequest {
            verb: "post_send",
            index: foreign,
            reason: WrReject::ForeignAh,
        })
    }

    /// Whether the state allows sends (RTS or later), as a post's error if not.
    pub(crate) fn check_send_state(&self) -> Result<()> {
        if self.state < QpState::Rts {
            return Err(Error::WorkRequest {
                verb: "post_send",
                index: 0,
                reason: WrReject::WrongState(self.state),
            });
        }
        Ok(())
    }

    /// How many more send requests fit in the send queue now: its depth less those posted
    /// and not yet completed by the device (which only ever frees more). A list of at most
    /// this many is never refused with [`WrReject::QueueFull`] (no system call). 0 in a forked
    /// child, which may not post (the ring is not mapped there).
    pub fn send_room(&mut self) -> u32 {
        if self.owner.forked() {
            return 0;
        }
        self.queues.vendor().send_room()
    }

    /// [`Qp::post_send`] of a chain of requests in libibverbs' layout, read by the provider
    /// as it writes each one into the send queue (no list of [`SendWr`] is built). `slow`
    /// reads the requests the core cannot ([`SlowDecode`]). An error's index counts from
    /// `first`. The requests are checked as the provider's C twin checks `ibv_post_send`
    /// (`crate::chain`), the QP's state included: rxe writes them in any state, as librxe
    /// does, and below RTS the kernel refuses the doorbell (`Error::Kernel`, EINVAL) while the
    /// requests stay in the ring for RTS; other providers refuse below RTS, as
    /// [`Qp::post_send`].
    ///
    /// # Safety
    /// [`Qp::post_send`]'s contract for every request of the chain; and every request from
    /// `first` on, following `next` to a null one, must be live and unchanged for the call,
    /// with its scatter/gather list (`num_sge` entries, when positive).
    #[allow(unsafe_code)] // forwards the caller's contract to the provider
    #[inline]
    pub unsafe fn post_send_chain(&mut self, first: NonNull<CSendWr>, slow: SlowDecode<'_>) -> Result<()> {
        self.owner.check("post_send")?;
        // SAFETY: forwarded caller contract.
        unsafe {
            self.queues
                .chains()
                .post_send_chain(SendChain::new(first, slow), self.qp_type, self.context, self.state)
        }
    }

    /// [`Qp::post_send_chain`] of a batch made by libibverbs' extended QP builders
    /// (`ibv_wr_*`): checked as the provider's C twin checks such a batch at
    /// `ibv_wr_complete`, which may be less than it checks a chain (a C provider's builders
    /// may leave an atomic's length and alignment to the kernel, say).
    ///
    /// # Safety
    /// As for [`Qp::post_send_chain`].
    #[allow(unsafe_code)] // forwards the caller's contract to the provider
    pub unsafe fn post_send_batch(&mut self, first: NonNull<CSendWr>, slow: SlowDecode<'_>) -> Result<()> {
        self.owner.check("post_send")?;
        // SAFETY: forwarded caller contract.
        unsafe {
            self.queues
                .chains()
                .post_send_batch(SendChain::new(first, slow), self.qp_type, self.context, self.state)
        }
    }

    /// Posts `wrs` to the receive queue (no system call).
    ///
    /// A receive posted while the QP is in [`QpState::Err`] may never complete, not even
    /// flushed: rxe (Linux 6.1, C rdma-core alike) flushes the receive queue only on the move
    /// to ERR (docs/kernel-facts.md). Move the QP to RESET before posting again.
    ///
    /// The safe alternative is [`Qp::recv_buf`].
    ///
    /// # Safety
    /// Until each request completes (or the QP is destroyed), the buffers it names must stay
    /// valid and must not be accessed: the device writes incoming data into them. In a
    /// process that uses the safe posts, no `wr_id` may have bit 63 set (as for
    /// [`Qp::post_send`]).
    #[allow(unsafe_code)] // forwards the caller's contract to the provider
    pub unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.owner.check("post_recv")?;
        if self.state == QpState::Reset {
            return Err(Error::WorkRequest {
                verb: "post_recv",
                index: 0,
                reason: WrReject::WrongState(self.state),
            });
        }
        // SAFETY: forwarded caller contract.
        unsafe { self.queues.vendor().post_recv(wrs) }
    }

    /// Destroys the QP now and reports the kernel's answer: how many async events it
    /// reported for the QP. On failure the QP comes back, unchanged, with the error.
    #[allow(clippy::result_large_err)] // a cold path that hands the QP back whole on failure
    pub fn destroy(mut self) -> std::result::Result<EventsReported, (Self, Error)> {
        match destroy_qp(&self.pd.ctx, self.handle) {
            Ok(n) => {
                self.destroyed = true;
                self.pd.qp_released(self.responder, true);
                self.leave_srq();
                self.queues.vendor().destroyed();
                Ok(EventsReported { comp: 0, r#async: n })
            }
            Err(e) => Err((self, e)),
        }
    }

    fn ctx(&self) -> &ContextInner {
        &self.pd.ctx
    }

    /// Takes the QP off its SRQ's members, once the kernel destroyed it.
    fn leave_srq(&self) {
        if let Some(srq) = &self._srq {
            srq.members.leave(self.qpn);
        }
    }

    /// Which CQ its send completions come from (see `Cq::identity`).
    pub(crate) fn send_cq_identity(&self) -> usize {
        Arc::as_ptr(&self._send_cq) as usize
    }

    /// Which CQ its receive completions come from.
    pub(crate) fn recv_cq_identity(&self) -> usize {
        Arc::as_ptr(&self._recv_cq) as usize
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // Kernel destroy first; `queues` (the rings) drop after this body.
        if self.destroyed {
            return;
        }
        if destroy_qp(&self.pd.ctx, self.handle).is_err() {
            // The kernel still has the QP: its rings, and the buffers its requests may still
            // touch, must never be freed.
            std::mem::forget(std::mem::replace(&mut self.queues, Queues::new(Box::new(NoQueues))));
            std::mem::forget(std::mem::replace(&mut self.held, QpHeld::new(0, 0)));
        } else {
            self.pd.qp_released(self.responder, true);
            self.leave_srq();
            if !self.owner.forked() {
                self.queues.vendor().destroyed();
            }
        }
    }
}

/// What a [`Qp`] holds in place of queues it had to leak (a zero-sized box: no allocation).
struct NoQueues;

#[allow(unsafe_code)]
// SAFETY: no kernel call, no driver bytes.
unsafe impl QpQueues for NoQueues {
    unsafe fn post_send(&mut self, _: SendList<'_, '_>) -> Result<()> {
        Err(Error::invalid("post_send", "the QP is being dropped"))
    }

    unsafe fn post_recv(&mut self, _: &[RecvWr<'_>]) -> Result<()> {
        Err(Error::invalid("post_recv", "the QP is being dropped"))
    }

    fn send_room(&mut self) -> u32 {
        0
    }

    fn modify(&mut self, _: Option<QpState>, _: KernelCall<'_, ()>) -> Result<()> {
        Err(Error::invalid("MODIFY_QP", "the QP is being dropped"))
    }

    fn destroyed(&mut self) {}
}

impl GatheredChains for NoQueues {}

/// A state QUERY_QP reported.
fn qp_state(raw: u8) -> Result<QpState> {
    QpState::from_raw(raw).ok_or_else(|| Error::malformed("QUERY_QP", format!("QP state {raw}")))
}

/// Destroys QP `handle`; returns how many async events the kernel reported for it.
fn destroy_qp(ctx: &Arc<ContextInner>, handle: u32) -> Result<u32> {
    let mut resp = DestroyQpResp::default();
    ctx.destroy("DESTROY_QP", object::QP, METHOD_QP_DESTROY, handle, resp.as_mut_bytes())?;
    Ok(resp.events_reported)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state-only request the connection manager's moves use is the one `modify` sends.
    #[test]
    fn a_state_only_request_is_the_attributes_request() {
        use zerocopy::IntoBytes;
        for state in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Err,
        ] {
            let attr = QpAttr {
                state: Some(state),
                ..Default::default()
            };
            assert_eq!(
                state_only(9, state).as_bytes(),
                attr.to_abi(9).unwrap().as_bytes(),
                "{state:?}"
            );
        }
    }

    /// Bits without a field go to the kernel as given, next to the fields' own bits; a bit a
    /// field sets cannot be given bare.
    #[test]
    fn bare_mask_bits_are_sent_as_given_and_never_name_a_field() {
        let attr = QpAttr {
            state: Some(QpState::Init),
            bare_mask: QpAttrMask::CAP | QpAttrMask::from_bits_retain(1 << 22),
            ..Default::default()
        };
        let m = attr.to_abi(3).expect("bare bits");
        assert_eq!(m.attr_mask, QpAttrMask::STATE.bits() | QpAttrMask::CAP.bits() | 1 << 22);
        assert_eq!(m.qp_handle, 3);
        for named in [QpAttrMask::STATE, QpAttrMask::DEST_QPN, QpAttrMask::ALT_PATH] {
            let attr = QpAttr {
                bare_mask: named | QpAttrMask::CAP,
                ..Default::default()
            };
            assert!(
                matches!(attr.to_abi(3), Err(Error::InvalidArgument { .. })),
                "{named:?}"
            );
        }
        assert_eq!(
            (QpAttrMask::all() | QpAttrMask::from_bits_retain(1 << 30)).bare(),
            QpAttrMask::CAP | QpAttrMask::RATE_LIMIT | QpAttrMask::from_bits_retain(1 << 30)
        );
    }
}
