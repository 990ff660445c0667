//! Work requests: what `post_send` and `post_recv` take.

use crate::attr::QpType;
use crate::error::WrReject;
use crate::open_enum::open_enum;
use crate::sys::assert_layout;

/// One scatter/gather entry: the same layout as C `struct ibv_sge`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sge {
    /// Start address, inside the memory region named by `lkey`.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}
assert_layout!(Sge, size 16, addr @ 0, length @ 8, lkey @ 12);

bitflags::bitflags! {
    /// `enum ibv_send_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct SendFlags: u32 {
        /// Wait for earlier RDMA reads and atomics before starting.
        const FENCE = 1;
        /// Generate a completion for this request.
        const SIGNALED = 1 << 1;
        /// Set the solicited-event bit.
        const SOLICITED = 1 << 2;
        /// Copy the payload into the work queue entry now; the buffers need no lkey and may
        /// be reused as soon as `post_send` returns.
        const INLINE = 1 << 3;
    }
}

/// Where a one-sided operation lands in the peer's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    /// Virtual address in the peer's memory region.
    pub addr: u64,
    /// The peer's remote key for it.
    pub rkey: u32,
}

open_enum! {
    /// `enum ibv_wr_opcode`, as far as [`SendOp`] goes: the same values as the kernel's
    /// `enum ib_uverbs_wr_opcode` (the two part at 11 to 14; `ATOMIC_WRITE` is 15 in both,
    /// in the kernel's since Linux 6.2).
    WrOpcode {
        RDMA_WRITE = 0, RDMA_WRITE_WITH_IMM = 1, SEND = 2, SEND_WITH_IMM = 3, RDMA_READ = 4,
        ATOMIC_CMP_AND_SWP = 5, ATOMIC_FETCH_AND_ADD = 6, LOCAL_INV = 7, BIND_MW = 8,
        SEND_WITH_INV = 9, ATOMIC_WRITE = 15,
    }
}

/// A bind of a memory window: what [`crate::SendOp::BindMw`] carries (from [`crate::Mw::bind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The window's rkey before the bind.
    pub mw_rkey: u32,
    /// The rkey the window has once bound: its index (the upper 24 bits of `mw_rkey`) and a
    /// key of the caller's choosing in the low 8 bits.
    pub new_rkey: u32,
    /// The local key of the memory region the window opens onto.
    pub mr_lkey: u32,
    /// Start of the window, inside the region.
    pub addr: u64,
    /// Length of the window; 0 unbinds it.
    pub length: u64,
    /// Remote access the window grants (within what the region allows): `AccessFlags` bits.
    pub access: u32,
}

/// What a send work request does. Immediate data is given in host byte order, as
/// [`crate::WorkCompletion::imm`] returns it at the receiver; it is put in network byte order
/// where the work queue entry is written (C's `ibv_send_wr.imm_data` is already `__be32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendOp {
    /// Two-sided send.
    Send,
    /// Send with 32 bits of immediate data.
    SendWithImm {
        /// Host byte order.
        imm: u32,
    },
    /// One-sided write.
    RdmaWrite(Remote),
    /// One-sided write that also consumes a receive at the peer and delivers immediate data
    /// (host byte order).
    RdmaWriteWithImm(Remote, u32),
    /// One-sided read into the local buffers.
    RdmaRead(Remote),
    /// 64-bit compare-and-swap; the old value lands in the one 8-byte local buffer.
    CompareSwap {
        /// Target (8-byte aligned).
        remote: Remote,
        /// Value expected.
        compare: u64,
        /// Value stored if it matched.
        swap: u64,
    },
    /// 64-bit fetch-and-add; the old value lands in the one 8-byte local buffer.
    FetchAdd {
        /// Target (8-byte aligned).
        remote: Remote,
        /// Value added.
        add: u64,
    },
    /// Send that also invalidates, at the peer, the memory window (type 2) or region named
    /// by `rkey`; the receive completion says so ([`crate::WcFlags::WITH_INV`]).
    SendWithInv {
        /// The peer's rkey to invalidate.
        rkey: u32,
    },
    /// Invalidates a local memory window (type 2) or region: peers can no longer use `rkey`.
    /// Takes no buffers.
    LocalInv {
        /// The rkey to invalidate.
        rkey: u32,
    },
    /// Binds a memory window ([`crate::Mw::bind`]). Takes no buffers.
    BindMw(MwBind),
    /// Atomic write (IBA 1.5, RC only): `value` lands at the target as one 8-byte write that
    /// no peer sees half done. Takes no buffers: the request carries the value. Linux added
    /// it to rxe in 6.2; older kernels complete it with `LOC_QP_OP_ERR` (docs/kernel-facts.md).
    AtomicWrite {
        /// Target (8-byte aligned; the responder checks).
        remote: Remote,
        /// The bytes written, in the order given (no byte-order conversion).
        value: [u8; 8],
    },
    /// An operation the core does not model, named by its `enum ibv_wr_opcode` number: for a
    /// caller handing on requests it did not build, as a libibverbs provider hands on
    /// `ibv_post_send`'s (`IBV_WR_TSO`, `IBV_WR_DRIVER1`, `IBV_WR_ATOMIC_WRITE` without its
    /// value, numbers verbs.h lacks), the way rdma-core's providers pass them to their
    /// device. The core checks nothing of the operation; each provider either writes it as
    /// its C provider writes an unknown opcode (rxe: [`RawOp`]) or refuses it
    /// ([`crate::WrReject::OpcodeNotSupported`]), and the device judges the rest (rxe on Linux
    /// 6.1 completes every such request with `LOC_QP_OP_ERR`: docs/kernel-facts.md).
    Raw(RawOp),
}

/// What [`SendOp::Raw`] carries: the fields of a C `struct ibv_send_wr` every operation
/// shares, as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawOp {
    /// The `enum ibv_wr_opcode` number.
    pub opcode: u32,
    /// The `imm_data`/`invalidate_rkey` word, bytes as given (no byte-order conversion).
    pub imm_data: u32,
    /// The `wr.rdma` arm: remote address and key.
    pub remote: Remote,
}

impl SendOp {
    /// The `enum ibv_wr_opcode` value ([`WrOpcode`]).
    pub fn wr_opcode(&self) -> u32 {
        let opcode = match self {
            Self::RdmaWrite(_) => WrOpcode::RDMA_WRITE,
            Self::RdmaWriteWithImm(..) => WrOpcode::RDMA_WRITE_WITH_IMM,
            Self::Send => WrOpcode::SEND,
            Self::SendWithImm { .. } => WrOpcode::SEND_WITH_IMM,
            Self::RdmaRead(_) => WrOpcode::RDMA_READ,
            Self::CompareSwap { .. } => WrOpcode::ATOMIC_CMP_AND_SWP,
            Self::FetchAdd { .. } => WrOpcode::ATOMIC_FETCH_AND_ADD,
            Self::SendWithInv { .. } => WrOpcode::SEND_WITH_INV,
            Self::LocalInv { .. } => WrOpcode::LOCAL_INV,
            Self::BindMw(_) => WrOpcode::BIND_MW,
            Self::AtomicWrite { .. } => WrOpcode::ATOMIC_WRITE,
            Self::Raw(raw) => WrOpcode(raw.opcode),
        };
        opcode.0
    }

    /// The completion opcode ([`crate::WcOpcode`]) a successful request of this operation
    /// completes with; `None` for [`SendOp::Raw`], whose completion the core cannot tell.
    #[inline]
    pub fn wc_opcode(&self) -> Option<crate::wc::WcOpcode> {
        use crate::wc::WcOpcode;
        Some(match self {
            Self::Send | Self::SendWithImm { .. } | Self::SendWithInv { .. } => WcOpcode::SEND,
            Self::RdmaWrite(_) | Self::RdmaWriteWithImm(..) => WcOpcode::RDMA_WRITE,
            Self::RdmaRead(_) => WcOpcode::RDMA_READ,
            Self::CompareSwap { .. } => WcOpcode::COMP_SWAP,
            Self::FetchAdd { .. } => WcOpcode::FETCH_ADD,
            Self::LocalInv { .. } => WcOpcode::LOCAL_INV,
            Self::BindMw(_) => WcOpcode::BIND_MW,
            Self::AtomicWrite { .. } => WcOpcode::ATOMIC_WRITE,
            Self::Raw(_) => return None,
        })
    }

    /// Immediate data in network byte order, as a work queue entry carries it, when the
    /// operation has one.
    #[inline]
    pub fn imm_data(&self) -> Option<u32> {
        match *self {
            Self::SendWithImm { imm } | Self::RdmaWriteWithImm(_, imm) => Some(imm.to_be()),
            _ => None,
        }
    }

    /// Whether this is an atomic operation.
    pub fn is_atomic(&self) -> bool {
        matches!(self, Self::CompareSwap { .. } | Self::FetchAdd { .. })
    }
}

/// What a provider reads back from an address handle when posting: the value its
/// `create_ah` returned, and the context whose provider made it ([`ContextId`]). Kept
/// inside the [`crate::Ah`].
#[derive(Debug)]
pub(crate) struct AhData {
    pub(crate) provider_data: u64,
    pub(crate) context: ContextId,
}

/// Which device context an object belongs to: the address of its context's shared state,
/// which outlives every object of the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextId(pub(crate) usize);

/// An address handle as a work request names it (from [`crate::Ah::ud_dest`]), borrowed from
/// the AH so the AH outlives the request. A reference, so `Option<UdDest>` costs no tag.
#[derive(Debug, Clone, Copy)]
pub struct AhRef<'a>(&'a AhData);

impl<'a> AhRef<'a> {
    pub(crate) fn new(data: &'a AhData) -> Self {
        Self(data)
    }

    /// What the provider's `create_ah` returned for this AH.
    #[inline]
    pub(crate) fn provider_data(self) -> u64 {
        self.0.provider_data
    }

    /// The context whose provider made the AH.
    #[inline]
    pub(crate) fn context(self) -> ContextId {
        self.0.context
    }
}

/// The destination of a UD send.
#[derive(Debug, Clone, Copy)]
pub struct UdDest<'a> {
    /// Address handle of the destination port.
    pub ah: AhRef<'a>,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Destination Q_Key.
    pub remote_qkey: u32,
}

impl UdDest<'_> {
    /// Whether another device context than `context` made the AH (its provider value means
    /// nothing to that context's provider).
    #[inline]
    pub(crate) fn foreign_to(&self, context: ContextId) -> bool {
        self.ah.context() != context
    }
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local buffers (gathered for sends and writes, scattered into for reads and atomics).
    pub sg_list: &'a [Sge],
    /// Flags.
    pub flags: SendFlags,
    /// Destination, for UD QPs (required there, ignored elsewhere).
    pub ud: Option<UdDest<'a>>,
}

impl<'a> SendWr<'a> {
    /// A request of `op` over `sg_list`, signaled.
    pub fn new(wr_id: u64, op: SendOp, sg_list: &'a [Sge]) -> Self {
        Self {
            wr_id,
            op,
            sg_list,
            flags: SendFlags::SIGNALED,
            ud: None,
        }
    }

    /// Sets the UD destination.
    pub fn to(mut self, dest: UdDest<'a>) -> Self {
        self.ud = Some(dest);
        self
    }

    /// Adds `flags` to those already set: `SendWr::new(..).with(SendFlags::INLINE)` stays
    /// signaled.
    pub fn with(mut self, flags: SendFlags) -> Self {
        self.flags |= flags;
        self
    }

    /// Replaces the flags, [`SendFlags::SIGNALED`] included: without it the request makes no
    /// completion unless the QP signals every send (`QpInit::sq_sig_all`).
    pub fn set_flags(mut self, flags: SendFlags) -> Self {
        self.flags = flags;
        self
    }

    /// The name [`SendWr::set_flags`] had before 0.1.0: replaces the flags,
    /// [`SendFlags::SIGNALED`] included. Kept for one release; [`SendWr::with`] adds flags
    /// instead (a request stays signaled).
    #[deprecated(
        since = "0.2.0",
        note = "renamed `set_flags` (replaces every flag, SIGNALED included); `with` adds flags"
    )]
    pub fn flags(self, flags: SendFlags) -> Self {
        self.set_flags(flags)
    }

    /// Checks the rules every transport imposes, whatever the device: which operations the
    /// QP type allows, that UD sends have a destination, that inline data is not used where
    /// the device must write, and atomic alignment.
    #[inline]
    pub(crate) fn check_transport(&self, qp_type: QpType) -> Result<(), WrReject> {
        // One match on the operation: the transports that carry it, and what it asks of the
        // request.
        let inline = self.flags.contains(SendFlags::INLINE);
        let allowed = match self.op {
            SendOp::Send | SendOp::SendWithImm { .. } => qp_type != QpType::Ud || self.ud.is_some(),
            SendOp::RdmaWrite(_) | SendOp::RdmaWriteWithImm(..) | SendOp::SendWithInv { .. } => qp_type != QpType::Ud,
            // The device writes the local buffers: no inline data.
            SendOp::RdmaRead(_) => qp_type == QpType::Rc && !inline,
            SendOp::CompareSwap { remote, .. } | SendOp::FetchAdd { remote, .. } => {
                if qp_type != QpType::Rc || inline {
                    return Err(WrReject::OpcodeNotSupported);
                }
                if remote.addr % 8 != 0 || self.sg_list.len() != 1 || self.sg_list[0].length < 8 {
                    return Err(WrReject::BadAtomic);
                }
                true
            }
            // Memory window operations carry no data.
            SendOp::LocalInv { .. } | SendOp::BindMw(_) => qp_type != QpType::Ud && self.sg_list.is_empty(),
            // The value travels in the request.
            SendOp::AtomicWrite { .. } => qp_type == QpType::Rc && self.sg_list.is_empty(),
            // The device judges what the core does not model.
            SendOp::Raw(_) => true,
        };
        if !allowed {
            return Err(WrReject::OpcodeNotSupported);
        }
        Ok(())
    }

    /// Whether the request names a UD destination [`UdDest::foreign_to`] `context`:
    /// [`WrReject::ForeignAh`] on a UD QP of `context`.
    #[inline]
    pub(crate) fn foreign_ah(&self, context: ContextId) -> bool {
        self.ud.is_some_and(|dest| dest.foreign_to(context))
    }

    /// Total bytes named by the scatter/gather list.
    pub fn total_len(&self) -> u64 {
        self.sg_list.iter().map(|s| u64::from(s.length)).sum()
    }
}

/// Send work requests on their way to a provider: each comes out of [`SendList::iter`] only
/// after the core checked it against the transport rules every device shares
/// (`SendWr::check_transport`) for the QP's transport, so a provider cannot skip them. The
/// check runs as the provider walks the list, inside its own loop; the provider names the
/// transport it was created with (`QpRequest::qp_type`), which keeps the list two words. On a
/// UD QP every request's AH is one of the QP's context, so one the provider made: the core
/// checks that before it makes the list (`SendWr::foreign_ah`), off the connected QPs' path.
#[derive(Debug, Clone, Copy)]
pub struct SendList<'l, 'a>(&'l [SendWr<'a>]);

impl<'l, 'a> SendList<'l, 'a> {
    /// `wrs`, none of which names an AH of another context ([`SendWr::foreign_ah`]) when the
    /// QP is UD.
    pub(crate) fn new(wrs: &'l [SendWr<'a>]) -> Self {
        Self(wrs)
    }

    /// How many requests the list holds.
    #[inline]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the list is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The requests in order, each once it passed the transport rules of `qp_type`, or why
    /// it did not.
    #[inline]
    pub fn iter(self, qp_type: QpType) -> impl Iterator<Item = Result<&'l SendWr<'a>, WrReject>> {
        self.0.iter().map(move |wr| wr.check_transport(qp_type).map(|()| wr))
    }
}

/// A receive-queue work request.
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Buffers the incoming message is scattered into.
    pub sg_list: &'a [Sge],
}

impl<'a> RecvWr<'a> {
    /// A receive into `sg_list`.
    pub fn new(wr_id: u64, sg_list: &'a [Sge]) -> Self {
        Self { wr_id, sg_list }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imm_goes_in_host_order_and_reaches_the_wqe_in_network_order() {
        let send = SendOp::SendWithImm { imm: 0x1234_5678 };
        assert_eq!(send.imm_data().map(u32::to_ne_bytes), Some([0x12, 0x34, 0x56, 0x78]));
        let remote = Remote { addr: 0, rkey: 0 };
        assert_eq!(
            SendOp::RdmaWriteWithImm(remote, 1).imm_data().map(u32::to_ne_bytes),
            Some([0, 0, 0, 1])
        );
        assert_eq!(SendOp::Send.imm_data(), None);
    }

    #[test]
    fn with_adds_a_flag_and_set_flags_replaces_them() {
        let wr = SendWr::new(1, SendOp::Send, &[]);
        assert_eq!(wr.flags, SendFlags::SIGNALED, "new requests are signaled");
        assert_eq!(
            wr.with(SendFlags::INLINE).flags,
            SendFlags::SIGNALED | SendFlags::INLINE
        );
        assert_eq!(wr.set_flags(SendFlags::INLINE).flags, SendFlags::INLINE);
        #[allow(deprecated)]
        let renamed = wr.flags(SendFlags::INLINE);
        assert_eq!(renamed.flags, SendFlags::INLINE, "the old name replaces them too");
    }

    #[test]
    fn atomic_write_is_for_rc_and_carries_its_value_instead_of_buffers() {
        let op = SendOp::AtomicWrite {
            remote: Remote { addr: 8, rkey: 1 },
            value: *b"01234567",
        };
        assert_eq!(op.wr_opcode(), 15);
        let wr = SendWr::new(1, op, &[]);
        assert_eq!(wr.check_transport(QpType::Rc), Ok(()));
        for qp_type in [QpType::Uc, QpType::Ud] {
            assert_eq!(wr.check_transport(qp_type), Err(WrReject::OpcodeNotSupported));
        }
        let sge = [Sge::default()];
        assert_eq!(
            SendWr::new(1, op, &sge).check_transport(QpType::Rc),
            Err(WrReject::OpcodeNotSupported)
        );
    }

    /// The core judges nothing of an operation it does not model: any transport, any
    /// buffers; its opcode is the one given.
    #[test]
    fn raw_operations_pass_every_transport_with_their_opcode() {
        let op = SendOp::Raw(RawOp {
            opcode: 10,
            imm_data: 0,
            remote: Remote { addr: 8, rkey: 1 },
        });
        assert_eq!(op.wr_opcode(), 10);
        assert_eq!(op.imm_data(), None);
        let sge = [Sge::default(); 2];
        for qp_type in [QpType::Rc, QpType::Uc, QpType::Ud] {
            for sg in [&sge[..0], &sge[..]] {
                let wr = SendWr::new(1, op, sg).with(SendFlags::INLINE);
                assert_eq!(wr.check_transport(qp_type), Ok(()), "{qp_type:?}");
            }
        }
    }
}

#[cfg(test)]
crate::sys::layout_check::kernel_layouts! {
    headers: ["rdma/ib_user_verbs.h"],
    structs: {
        Sge = "struct ib_uverbs_sge" { addr, length, lkey },
    },
}
