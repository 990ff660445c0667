//! Send requests in libibverbs' layout (`struct ibv_send_wr`), read where they lie: a caller
//! that holds its requests in that form (a libibverbs provider built on this crate) posts a
//! chain of them without first building a [`SendWr`] list. Each request is read as the
//! provider reaches it, inside the provider's own loop.
//!
//! A chain is what a libibverbs provider hands on, so it is checked as that provider's C
//! twin checks `ibv_post_send`, not by the core's transport rules
//! ([`SendWr::check_transport`]): the core makes sure each request can be read (a readable
//! scatter/gather list, an address handle of the QP's context); the provider checks the rest.
//! The default ([`crate::front_end::post_gathered`]) posts through a [`crate::wr::SendList`],
//! so the core's rules; rxe checks what rdma-core's rxe checks and leaves the rest to the
//! kernel, as there (`crate::front_end`: how a provider posts chains).

use crate::attr::QpType;
use crate::error::WrReject;
use crate::sys::assert_layout;
use crate::wr::{ContextId, RawOp, Remote, SendFlags, SendOp, SendWr, Sge, WrOpcode};
use std::marker::PhantomData;
use std::ptr::NonNull;

/// The leading fields of libibverbs' `struct ibv_send_wr` (verbs.h), through the `wr` union:
/// all the core reads. The XRC and memory-window fields that follow in C are left to the
/// caller's [`SlowDecode`].
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CSendWr {
    /// `wr_id`.
    pub wr_id: u64,
    /// The next request of the chain, or null.
    pub next: *mut CSendWr,
    /// `sg_list`: `num_sge` entries.
    pub sg_list: *mut Sge,
    /// `num_sge`.
    pub num_sge: i32,
    /// `opcode`, an `enum ibv_wr_opcode` ([`WrOpcode`]).
    pub opcode: u32,
    /// `send_flags` ([`SendFlags`] bits).
    pub send_flags: u32,
    /// `imm_data` (network byte order) or `invalidate_rkey` (host order).
    pub imm_data: u32,
    /// The `wr` union.
    pub wr: CSendArm,
}
assert_layout!(CSendWr, size 72, next @ 8, sg_list @ 16, num_sge @ 24, opcode @ 28,
    send_flags @ 32, imm_data @ 36, wr @ 40);

impl CSendWr {
    /// The operation, for every opcode that names no object of the caller's (all but
    /// `BIND_MW`, whose window only the caller knows, which is `None`); an opcode the core
    /// does not model is a [`SendOp::Raw`] of the request's fields, for the provider to write
    /// as given (`IBV_WR_ATOMIC_WRITE` included: this layout has no place for its value).
    pub fn send_op(&self) -> Option<SendOp> {
        let rdma = || {
            let r = self.wr.as_rdma();
            Remote {
                addr: r.remote_addr,
                rkey: r.rkey,
            }
        };
        let atomic = self.wr.as_atomic();
        let aremote = Remote {
            addr: atomic.remote_addr,
            rkey: atomic.rkey,
        };
        Some(match WrOpcode(self.opcode) {
            WrOpcode::RDMA_WRITE => SendOp::RdmaWrite(rdma()),
            // C's `imm_data` is `__be32`; `SendOp` takes host order (and the providers write
            // it back in network order, so the bytes on the wire are C's).
            WrOpcode::RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm(rdma(), u32::from_be(self.imm_data)),
            WrOpcode::SEND => SendOp::Send,
            WrOpcode::SEND_WITH_IMM => SendOp::SendWithImm {
                imm: u32::from_be(self.imm_data),
            },
            WrOpcode::RDMA_READ => SendOp::RdmaRead(rdma()),
            WrOpcode::ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
                remote: aremote,
                compare: atomic.compare_add,
                swap: atomic.swap,
            },
            WrOpcode::ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
                remote: aremote,
                add: atomic.compare_add,
            },
            // `invalidate_rkey` shares `imm_data`'s place, in host order.
            WrOpcode::SEND_WITH_INV => SendOp::SendWithInv { rkey: self.imm_data },
            WrOpcode::LOCAL_INV => SendOp::LocalInv { rkey: self.imm_data },
            WrOpcode::BIND_MW => return None,
            _ => SendOp::Raw(RawOp {
                opcode: self.opcode,
                imm_data: self.imm_data,
                remote: rdma(),
            }),
        })
    }
}

/// `ibv_send_wr.wr`: the arm the opcode (and the QP type, for `ud`) selects.
///
/// Opaque: its 32 bytes are always initialised, whichever arm was written, so reading any
/// arm is sound. A value is made by one of the constructors ([`CSendArm::rdma`],
/// [`CSendArm::atomic`], [`CSendArm::ud`]; the bytes no arm field covers are zero), or read
/// in place from a caller's `struct ibv_send_wr` through the `unsafe` chain posts, whose
/// contract covers those bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub union CSendArm {
    rdma: CRdmaArm,
    atomic: CAtomicArm,
    ud: CUdArm,
    /// The whole union: every byte initialised by the constructors.
    words: [u64; 4],
}
assert_layout!(CSendArm, size 32);

impl Default for CSendArm {
    /// All zero.
    fn default() -> Self {
        Self { words: [0; 4] }
    }
}

impl CSendArm {
    /// The `rdma` arm of RDMA writes and reads; the other bytes zero.
    pub fn rdma(rdma: CRdmaArm) -> Self {
        let mut a = Self::default();
        // Field by field: a whole-struct store may leave its padding uninitialised.
        a.rdma.remote_addr = rdma.remote_addr;
        a.rdma.rkey = rdma.rkey;
        a
    }

    /// The `atomic` arm of atomics.
    pub fn atomic(atomic: CAtomicArm) -> Self {
        let mut a = Self::default();
        a.atomic.remote_addr = atomic.remote_addr;
        a.atomic.compare_add = atomic.compare_add;
        a.atomic.swap = atomic.swap;
        a.atomic.rkey = atomic.rkey;
        a
    }

    /// The `ud` arm of sends on UD QPs; the other bytes zero.
    pub fn ud(ud: CUdArm) -> Self {
        let mut a = Self::default();
        a.ud.ah = ud.ah;
        a.ud.remote_qpn = ud.remote_qpn;
        a.ud.remote_qkey = ud.remote_qkey;
        a
    }

    /// The bytes read as the `rdma` arm.
    #[inline(always)]
    pub fn as_rdma(&self) -> CRdmaArm {
        // SAFETY: every byte is initialised (the type's invariant) and the arm is plain data.
        unsafe { self.rdma }
    }

    /// The bytes read as the `atomic` arm.
    #[inline(always)]
    pub fn as_atomic(&self) -> CAtomicArm {
        // SAFETY: as in `as_rdma`.
        unsafe { self.atomic }
    }

    /// The bytes read as the `ud` arm (its `ah` is only an address: reading it dereferences
    /// nothing).
    #[inline(always)]
    pub fn as_ud(&self) -> CUdArm {
        // SAFETY: as in `as_rdma`.
        unsafe { self.ud }
    }
}

impl std::fmt::Debug for CSendArm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: as in `as_rdma`.
        f.debug_tuple("CSendArm").field(unsafe { &self.words }).finish()
    }
}

/// `ibv_send_wr.wr.rdma`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CRdmaArm {
    /// `remote_addr`.
    pub remote_addr: u64,
    /// `rkey`.
    pub rkey: u32,
}

/// `ibv_send_wr.wr.atomic`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CAtomicArm {
    /// `remote_addr`.
    pub remote_addr: u64,
    /// `compare_add`.
    pub compare_add: u64,
    /// `swap`.
    pub swap: u64,
    /// `rkey`.
    pub rkey: u32,
}
assert_layout!(CAtomicArm, size 32, compare_add @ 8, swap @ 16, rkey @ 24);

/// `ibv_send_wr.wr.ud`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUdArm {
    /// `ah`: the caller's `struct ibv_ah`.
    pub ah: *mut std::ffi::c_void,
    /// `remote_qpn`.
    pub remote_qpn: u32,
    /// `remote_qkey`.
    pub remote_qkey: u32,
}
assert_layout!(CUdArm, size 16, remote_qpn @ 8, remote_qkey @ 12);

/// Reads what the core cannot read itself: any request of a UD QP (its address handle is the
/// caller's object) and operations other than sends, RDMA, atomics and invalidation (memory
/// window binds name the caller's objects). `None` refuses the request
/// ([`WrReject::Malformed`]).
///
/// # Safety
/// Called with a live request of the chain given to [`crate::Qp::post_send_chain`], and the QP's
/// type; what it returns must stay valid for `'a`.
pub type SlowDecode<'a> = unsafe fn(NonNull<CSendWr>, QpType) -> Option<SendWr<'a>>;

/// A chain of send requests in libibverbs' layout on its way to a provider, each read as it
/// comes out of [`SendChain::next`] (the module docs say who checks what).
#[derive(Clone, Copy)]
pub struct SendChain<'a> {
    next: *mut CSendWr,
    slow: SlowDecode<'a>,
    _requests: PhantomData<&'a CSendWr>,
}

/// A request of a [`SendChain`]: read in place and checked, or to be read through the
/// caller's slow path.
#[derive(Clone, Copy)]
pub enum ChainWr<'a> {
    /// A send, RDMA, atomic or invalidate request of a connected QP, read in place.
    Fast(FastWr<'a>),
    /// Any other: [`SlowWr::read`] reads and checks it.
    Slow(SlowWr<'a>),
    /// A request read in place whose scatter/gather list cannot be read (a negative count,
    /// or a null list for a positive one): refused as [`WrReject::Malformed`]. A variant
    /// rather than an error beside the enum, so that a provider's loop carries no
    /// [`WrReject`] (32 bytes; in registers it crowds out the loop's own values).
    Malformed,
}

/// A request of a [`SendChain`] the core does not read in place.
#[derive(Clone, Copy)]
pub struct SlowWr<'a> {
    at: NonNull<CSendWr>,
    slow: SlowDecode<'a>,
}

impl<'a> SlowWr<'a> {
    /// The request as the caller's [`SlowDecode`] reads it, its AH checked to be of
    /// `context` on a UD QP (the transport rules are the provider's); out of line, to keep a
    /// `SendWr` out of the provider's loop.
    #[inline(never)]
    pub fn read(self, qp_type: QpType, context: ContextId) -> Result<SendWr<'a>, WrReject> {
        // SAFETY: a live request of the chain, as `SlowDecode` asks (`SendChain::new`).
        let wr = unsafe { (self.slow)(self.at, qp_type) }.ok_or(WrReject::Malformed)?;
        if qp_type == QpType::Ud && wr.foreign_ah(context) {
            return Err(WrReject::ForeignAh);
        }
        Ok(wr)
    }
}

/// A send, RDMA, atomic or invalidate request (opcodes 0 to 7 and 9 of [`WrOpcode`]) of a
/// connected QP, read in place from the caller's [`CSendWr`].
#[derive(Clone, Copy)]
pub struct FastWr<'a> {
    c: &'a CSendWr,
    sg_list: &'a [Sge],
    /// `1 << opcode`, tested against the operation sets below.
    bit: u32,
}

/// The operations [`FastWr`] carries, as bits `1 << opcode`.
const FAST: u32 = 0b10_1111_1111;
const ATOMIC: u32 = 1 << WrOpcode::ATOMIC_CMP_AND_SWP.0 | 1 << WrOpcode::ATOMIC_FETCH_AND_ADD.0;
/// RDMA writes and reads: the `rdma` arm.
const RDMA: u32 = 1 << WrOpcode::RDMA_WRITE.0 | 1 << WrOpcode::RDMA_WRITE_WITH_IMM.0 | 1 << WrOpcode::RDMA_READ.0;
/// The operations whose `imm_data` field means something: immediate data or an rkey.
const WITH_EX: u32 = 1 << WrOpcode::RDMA_WRITE_WITH_IMM.0
    | 1 << WrOpcode::SEND_WITH_IMM.0
    | 1 << WrOpcode::LOCAL_INV.0
    | 1 << WrOpcode::SEND_WITH_INV.0;

impl<'a> FastWr<'a> {
    /// `wr_id`.
    #[inline(always)]
    pub fn wr_id(&self) -> u64 {
        self.c.wr_id
    }

    /// The operation: one of 0 to 7 and 9.
    #[inline(always)]
    pub fn opcode(&self) -> u32 {
        self.c.opcode
    }

    /// The flags.
    #[inline(always)]
    pub fn flags(&self) -> SendFlags {
        SendFlags::from_bits_retain(self.c.send_flags)
    }

    /// The scatter/gather list.
    #[inline(always)]
    pub fn sg_list(&self) -> &'a [Sge] {
        self.sg_list
    }

    /// Immediate data (network byte order) for the operations with immediate data, the rkey
    /// to invalidate (host order) for those that invalidate, 0 for the rest.
    #[inline(always)]
    pub fn imm_or_rkey(&self) -> u32 {
        if self.bit & WITH_EX != 0 {
            self.c.imm_data
        } else {
            0
        }
    }

    /// Whether this is an RDMA write or read ([`FastWr::rdma`] applies).
    #[inline(always)]
    pub fn is_rdma(&self) -> bool {
        self.bit & RDMA != 0
    }

    /// Whether this is an atomic ([`FastWr::atomic`] applies).
    #[inline(always)]
    pub fn is_atomic(&self) -> bool {
        self.bit & ATOMIC != 0
    }

    /// The `rdma` arm.
    #[inline(always)]
    pub fn rdma(&self) -> CRdmaArm {
        self.c.wr.as_rdma()
    }

    /// The `atomic` arm, `swap` zeroed for a fetch-and-add (which has none).
    #[inline(always)]
    pub fn atomic(&self) -> CAtomicArm {
        let mut a = self.c.wr.as_atomic();
        if self.c.opcode != WrOpcode::ATOMIC_CMP_AND_SWP.0 {
            a.swap = 0;
        }
        a
    }

    /// The request as a [`SendWr`].
    pub fn to_send_wr(self) -> SendWr<'a> {
        // Every opcode read in place has an operation (`FAST`); `Send` is never taken.
        let op = self.c.send_op().unwrap_or(SendOp::Send);
        SendWr {
            wr_id: self.c.wr_id,
            op,
            sg_list: self.sg_list,
            flags: self.flags(),
            ud: None,
        }
    }
}

impl<'a> ChainWr<'a> {
    /// The request as a [`SendWr`] (read as [`SlowWr::read`] reads it).
    pub fn to_send_wr(self, qp_type: QpType, context: ContextId) -> Result<SendWr<'a>, WrReject> {
        match self {
            Self::Fast(f) => Ok(f.to_send_wr()),
            Self::Slow(s) => s.read(qp_type, context),
            Self::Malformed => Err(WrReject::Malformed),
        }
    }
}

impl<'a> SendChain<'a> {
    /// # Safety
    /// Every request from `first` on, following `next` to a null one, must be live and
    /// unchanged for `'a`, with its scatter/gather list (`num_sge` entries, when positive).
    pub(crate) unsafe fn new(first: NonNull<CSendWr>, slow: SlowDecode<'a>) -> Self {
        Self {
            next: first.as_ptr(),
            slow,
            _requests: PhantomData,
        }
    }

    /// The next request, read in place (or why it cannot be read), or for the slow path;
    /// `None` at the end of the chain. `qp_type` is the QP's.
    #[inline(always)]
    #[allow(clippy::should_implement_trait)] // takes the QP type
    pub fn next(&mut self, qp_type: QpType) -> Option<ChainWr<'a>> {
        let at = NonNull::new(self.next)?;
        // SAFETY: a live request of the chain, unchanged for `'a` (`new`'s contract).
        let c: &'a CSendWr = unsafe { &*at.as_ptr() };
        self.next = c.next;
        let bit = 1u32.checked_shl(c.opcode).unwrap_or(0);
        if qp_type == QpType::Ud || bit & FAST == 0 {
            return Some(ChainWr::Slow(SlowWr { at, slow: self.slow }));
        }
        let sg_list: &'a [Sge] = match usize::try_from(c.num_sge) {
            Ok(0) => &[],
            // SAFETY: per `new`'s contract.
            Ok(n) if !c.sg_list.is_null() => unsafe { std::slice::from_raw_parts(c.sg_list, n) },
            _ => return Some(ChainWr::Malformed),
        };
        Some(ChainWr::Fast(FastWr { c, sg_list, bit }))
    }

    /// The chain's request when it is its only one and [`SendChain::next`] would read it in
    /// place ([`ChainWr::Fast`]), read as `next` reads it (the transport rules are the
    /// provider's); `None` otherwise, the chain left as it was. A provider's straight path for
    /// the single post.
    #[inline(always)]
    pub fn single(&self, qp_type: QpType) -> Option<FastWr<'a>> {
        let first = NonNull::new(self.next)?;
        // SAFETY: a live request of the chain (`new`'s contract).
        if !unsafe { first.as_ref() }.next.is_null() {
            return None;
        }
        match { *self }.next(qp_type)? {
            ChainWr::Fast(wr) => Some(wr),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::{AhData, AhRef, UdDest};

    fn blank(opcode: WrOpcode) -> CSendWr {
        CSendWr {
            wr_id: 7,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: opcode.0,
            send_flags: SendFlags::SIGNALED.bits(),
            imm_data: 0x1234_5678u32.to_be(),
            wr: if matches!(opcode, WrOpcode::ATOMIC_CMP_AND_SWP | WrOpcode::ATOMIC_FETCH_AND_ADD) {
                CSendArm::atomic(CAtomicArm {
                    remote_addr: 0x1000,
                    compare_add: 3,
                    swap: 4,
                    rkey: 0x77,
                })
            } else {
                CSendArm::rdma(CRdmaArm {
                    remote_addr: 0x1000,
                    rkey: 0x77,
                })
            },
        }
    }

    static AH: AhData = AhData {
        provider_data: 5,
        context: ContextId(0),
    };

    /// Whatever the slow path was asked for: a send with this wr_id (+ 100), to a UD
    /// destination on UD QPs; it refuses wr_id 0.
    unsafe fn slow_send(at: NonNull<CSendWr>, qp_type: QpType) -> Option<SendWr<'static>> {
        // SAFETY: the test's live request.
        let wr_id = unsafe { at.as_ref() }.wr_id;
        let wr = SendWr::new(wr_id + 100, SendOp::Send, &[]);
        let dest = UdDest {
            ah: AhRef::new(&AH),
            remote_qpn: 1,
            remote_qkey: 2,
        };
        let wr = if qp_type == QpType::Ud { wr.to(dest) } else { wr };
        (wr_id != 0).then_some(wr)
    }

    fn all(first: &mut CSendWr, qp_type: QpType) -> Vec<Result<SendWr<'static>, WrReject>> {
        // SAFETY: the test's chain, live for the call; `'static` only stands for it here.
        let mut chain = unsafe { SendChain::new(NonNull::from(first), slow_send) };
        std::iter::from_fn(|| chain.next(qp_type))
            .map(|wr| wr.to_send_wr(qp_type, ContextId(0)))
            .collect()
    }

    /// A request whose arm was built for another operation (an RDMA arm under an atomic
    /// opcode) reads as that operation with the bytes the arm left zero: the arm's 32 bytes
    /// are always initialised, so reading any arm from safe code is sound (under Miri, a read
    /// of uninitialised bytes fails this test).
    #[test]
    fn an_arm_built_for_another_operation_reads_as_zeros() {
        let mut c = blank(WrOpcode::RDMA_WRITE);
        c.opcode = WrOpcode::ATOMIC_CMP_AND_SWP.0;
        assert_eq!(
            c.send_op(),
            Some(SendOp::CompareSwap {
                remote: Remote { addr: 0x1000, rkey: 0 },
                compare: 0x77,
                swap: 0
            })
        );
        c.opcode = WrOpcode::ATOMIC_FETCH_AND_ADD.0;
        assert!(matches!(c.send_op(), Some(SendOp::FetchAdd { add: 0x77, .. })));
        let ud = CSendArm::ud(CUdArm {
            ah: std::ptr::null_mut(),
            remote_qpn: 5,
            remote_qkey: 6,
        });
        let a = ud.as_atomic();
        assert_eq!((a.remote_addr, a.compare_add, a.swap, a.rkey), (0, 5 | 6 << 32, 0, 0));
        assert_eq!(
            CSendArm::atomic(CAtomicArm {
                remote_addr: 0x1000,
                compare_add: 1,
                swap: 2,
                rkey: 0x77
            })
            .as_rdma()
            .rkey,
            1
        );
    }

    /// Each operation the core reads itself comes out as the `SendOp` the C fields name, with
    /// the immediate data in host order; the rest go to the slow path.
    #[test]
    fn reads_each_operation_from_the_c_fields() {
        let remote = Remote {
            addr: 0x1000,
            rkey: 0x77,
        };
        let cases = [
            (WrOpcode::RDMA_WRITE, Some(SendOp::RdmaWrite(remote))),
            (
                WrOpcode::RDMA_WRITE_WITH_IMM,
                Some(SendOp::RdmaWriteWithImm(remote, 0x1234_5678)),
            ),
            (WrOpcode::SEND, Some(SendOp::Send)),
            (WrOpcode::SEND_WITH_IMM, Some(SendOp::SendWithImm { imm: 0x1234_5678 })),
            (WrOpcode::RDMA_READ, Some(SendOp::RdmaRead(remote))),
            (
                WrOpcode::SEND_WITH_INV,
                Some(SendOp::SendWithInv {
                    rkey: 0x1234_5678u32.to_be(),
                }),
            ),
            (
                WrOpcode::LOCAL_INV,
                Some(SendOp::LocalInv {
                    rkey: 0x1234_5678u32.to_be(),
                }),
            ),
            (WrOpcode::BIND_MW, None),
            (WrOpcode(15), None),
        ];
        for (opcode, want) in cases {
            let mut c = blank(opcode);
            let got = all(&mut c, QpType::Rc);
            assert_eq!(got.len(), 1);
            let wr = got[0].as_ref().expect("read");
            match want {
                Some(op) => {
                    assert_eq!((wr.wr_id, wr.op, wr.flags), (7, op, SendFlags::SIGNALED), "{opcode:?}");
                }
                None => assert_eq!((wr.wr_id, wr.op), (107, SendOp::Send), "{opcode:?}: slow path"),
            }
        }
        let sge = [Sge {
            addr: 0x2000,
            length: 8,
            lkey: 1,
        }];
        let mut c = blank(WrOpcode::ATOMIC_CMP_AND_SWP);
        c.sg_list = sge.as_ptr().cast_mut();
        c.num_sge = 1;
        let got = all(&mut c, QpType::Rc);
        let wr = got[0].as_ref().expect("read");
        assert_eq!(
            wr.op,
            SendOp::CompareSwap {
                remote,
                compare: 3,
                swap: 4
            }
        );
        assert_eq!(wr.sg_list, &sge);
        let mut c = blank(WrOpcode::ATOMIC_FETCH_AND_ADD);
        c.sg_list = sge.as_ptr().cast_mut();
        c.num_sge = 1;
        let got = all(&mut c, QpType::Rc);
        assert_eq!(got[0].as_ref().expect("read").op, SendOp::FetchAdd { remote, add: 3 });
    }

    /// An opcode the core does not model is read as a `SendOp::Raw` of the request's
    /// fields, as given; a bind, whose window is the caller's, is not read here.
    #[test]
    fn unmodelled_opcodes_are_read_raw() {
        for opcode in [10, 11, 12, 14, WrOpcode::ATOMIC_WRITE.0, 0x20, u32::MAX] {
            let mut c = blank(WrOpcode(opcode));
            c.opcode = opcode;
            let want = SendOp::Raw(RawOp {
                opcode,
                imm_data: 0x1234_5678u32.to_be(),
                remote: Remote {
                    addr: 0x1000,
                    rkey: 0x77,
                },
            });
            assert_eq!(c.send_op(), Some(want), "opcode {opcode}");
        }
        assert_eq!(blank(WrOpcode::BIND_MW).send_op(), None);
    }

    /// A chain is followed to its end; UD requests always take the slow path; requests that
    /// cannot be read (bad lists, refusals of the slow path) are reported per request, and
    /// the transport rules are left to the provider (an inline read is read).
    #[test]
    fn follows_the_chain_and_reports_what_cannot_be_read() {
        let mut third = blank(WrOpcode::RDMA_READ);
        third.send_flags |= SendFlags::INLINE.bits();
        let mut second = blank(WrOpcode::SEND);
        second.num_sge = -1;
        second.next = &mut third;
        let mut first = blank(WrOpcode::SEND);
        first.num_sge = 2;
        first.next = &mut second;
        let got = all(&mut first, QpType::Uc);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].as_ref().err(), Some(&WrReject::Malformed), "sges named but null");
        assert_eq!(got[1].as_ref().err(), Some(&WrReject::Malformed), "negative count");
        let read = got[2]
            .as_ref()
            .expect("an inline read on UC is the provider's to judge");
        assert_eq!((read.wr_id, read.flags), (7, SendFlags::SIGNALED | SendFlags::INLINE));
        let mut ud = blank(WrOpcode::RDMA_WRITE);
        let got = all(&mut ud, QpType::Ud);
        assert_eq!(got[0].as_ref().expect("slow path").wr_id, 107);
        ud.wr_id = 0;
        assert_eq!(all(&mut ud, QpType::Ud)[0].as_ref().err(), Some(&WrReject::Malformed));
    }

    /// `single` gives the request `next` would read in place only when it is the chain's only
    /// one; any other chain (two requests, the slow path, a refusal) is left to `next`.
    #[test]
    fn single_is_a_lone_request_read_in_place() {
        let single = |c: &mut CSendWr, qp_type| {
            let first = NonNull::from(c);
            // SAFETY: the test's chain, live for the call.
            let chain = unsafe { SendChain::new(first, slow_send) };
            let wr = chain.single(qp_type).map(|wr| wr.to_send_wr());
            assert_eq!(chain.next, first.as_ptr(), "the chain is left as it was");
            wr.map(|wr| (wr.wr_id, wr.op))
        };
        let mut c = blank(WrOpcode::SEND);
        assert_eq!(single(&mut c, QpType::Rc), Some((7, SendOp::Send)));
        assert_eq!(single(&mut c, QpType::Uc), Some((7, SendOp::Send)));
        assert_eq!(single(&mut c, QpType::Ud), None, "UD: the slow path");
        let mut second = blank(WrOpcode::SEND);
        c.next = &mut second;
        assert_eq!(single(&mut c, QpType::Rc), None, "two requests");
        c.next = std::ptr::null_mut();
        c.num_sge = -1;
        assert_eq!(single(&mut c, QpType::Rc), None, "malformed");
        let mut read = blank(WrOpcode::RDMA_READ);
        assert!(single(&mut read, QpType::Rc).is_some());
        assert!(
            single(&mut read, QpType::Uc).is_some(),
            "read as given: the transport is the provider's to check"
        );
        assert_eq!(single(&mut blank(WrOpcode::BIND_MW), QpType::Rc), None);
    }

    /// Every request of a connected QP with a fast operation is read in place as given, for
    /// every connected QP type, inline or not, whatever its SGEs and target: the same
    /// `SendWr` as `CSendWr::send_op` names, with its SGEs.
    #[test]
    fn in_place_requests_are_read_as_given() {
        let sges = [
            Sge {
                addr: 0x2000,
                length: 8,
                lkey: 1,
            },
            Sge {
                addr: 0x3000,
                length: 4,
                lkey: 1,
            },
        ];
        let mut compared = 0;
        for opcode in (0..10).filter(|&o| o != WrOpcode::BIND_MW.0) {
            for qp_type in [QpType::Rc, QpType::Uc] {
                for inline in [false, true] {
                    for (sg, addr) in [(0, 0x1000), (1, 0x1004), (2, 0x1000)] {
                        let mut c = blank(WrOpcode(opcode));
                        c.sg_list = sges.as_ptr().cast_mut();
                        c.num_sge = sg;
                        if inline {
                            c.send_flags |= SendFlags::INLINE.bits();
                        }
                        c.wr.atomic.remote_addr = addr;
                        let case = format!("opcode {opcode} {qp_type:?} inline {inline} sges {sg} addr {addr:#x}");
                        // SAFETY: the test's chain, live for the call.
                        let mut chain = unsafe { SendChain::new(NonNull::from(&mut c), slow_send) };
                        let Some(ChainWr::Fast(fast)) = chain.next(qp_type) else {
                            panic!("{case}: not read in place");
                        };
                        assert!(chain.next(qp_type).is_none(), "{case}: one request");
                        let got = fast.to_send_wr();
                        let want = (7, c.send_op(), c.send_flags, &sges[..sg as usize]);
                        assert_eq!((got.wr_id, Some(got.op), got.flags.bits(), got.sg_list), want, "{case}");
                        compared += 1;
                    }
                }
            }
        }
        assert_eq!(compared, 9 * 2 * 2 * 3);
    }
}
