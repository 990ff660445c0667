//! Safe receives on a shared receive queue: the SRQ owns each receive's buffer from the post
//! until the completion that names it, whichever QP on the SRQ took the receive.
//!
//! [`Srq::recv_buf`] moves a [`Buf`] into the SRQ; [`Srq::reclaim`] gives it back, its length
//! set to the bytes received, for the [`Completion`] of that receive, reaped by [`crate::Cq::reap`]
//! from the receive CQ of the QP that took it. Completions that are not the SRQ's get a
//! [`SrqReclaimError`] saying why. The unsafe [`Srq::post_recv`] stays for callers who manage
//! buffers themselves.
//!
//! ```
//! # fn f(srq: &mut uverbs::Srq, cq: &mut uverbs::Cq, buf: uverbs::Buf) -> Result<(), Box<dyn std::error::Error>> {
//! use uverbs::WorkCompletion;
//! srq.recv_buf(buf)?; // the SRQ's now
//! let mut wc = [WorkCompletion::default(); 16];
//! for c in cq.reap(&mut wc).iter() {
//!     let buf = srq.reclaim(c)?; // ours again, whichever QP on the SRQ received into it
//!     c.result()?;
//!     println!("QP {} received {:?}", c.qp_num, buf.as_slice());
//!     srq.recv_buf(buf)?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Why it is sound
//!
//! The rules of the QP's own queues (`crate::owned`) hold here with one change: an SRQ's
//! receives complete in any order (each message takes the SRQ's next receive, whichever QP it
//! comes to), so a completion gives back only the buffer of the request it names.
//!
//! 1. **Only the holder reaches a `Buf`'s bytes.** As on a QP: the post takes the buffer by
//!    value (the `compile_fail` examples below), puts it in a free slot of the SRQ, names the
//!    SGE of its whole capacity in its box (which never changes), and the provider copies the
//!    SGE into the SRQ's ring before returning.
//!    A request the provider rejected ([`crate::Error::WorkRequest`]) was not queued and its
//!    buffer comes back in the [`Refused`]; after any other error it may have been, and the
//!    SRQ keeps the buffer as if it were posted.
//! 2. **A `Buf` leaves the SRQ only once the device is done with it.** Each request gets an
//!    id (its `wr_id`) no other request in the process ever had: the SRQ draws runs of ids
//!    from the QPs' source, its ids grow by one with every post (an id whose slot still
//!    holds a buffer is passed over, never used), and a slot takes a fresh id at every post. The device writes a
//!    receive's buffer only until it completes that request, with any status: success,
//!    error, or flush. [`Srq::reclaim`] gives back the buffer of exactly the request `c`
//!    names, and only when
//!    - `c` is a [`Completion`], which only [`crate::Cq::reap`] makes, from a completion the device
//!      wrote into that CQ (a forged `WorkCompletion` cannot be turned into one);
//!    - `c`'s QP is on this SRQ now and `c` came from that QP's receive CQ. QPs join the SRQ's
//!      members when created on it and leave once the kernel destroyed them, before their
//!      number can be given to another QP;
//!    - the SRQ holds a buffer under `c`'s id (in the slot the id's low bits name, the id
//!      recorded in the buffer's box by the post, which only the SRQ holding it writes): a
//!      completion kept and reclaimed again, after the slot took a new request with a new
//!      id, names nothing held.
//!
//!    Such a completion is its request's own. The QP has no receive queue of its own, so its
//!    receive completions name the SRQ's requests; its send completions (when its send CQ is
//!    its receive CQ) carry its send queue's ids (bit 62 clear) or raw ids, which keep bit 63
//!    clear ([`crate::Qp::post_send`]'s contract), and raw receives on the SRQ do too
//!    ([`Srq::post_recv`]'s); a completion left in the CQ by an earlier QP with the same
//!    number carries another queue's id, never one of this SRQ's.
//! 3. **Lost completions lose no soundness.** A receive whose completion never comes to a
//!    member (a CQ overrun; a QP destroyed before its completions were reaped, or whose
//!    provider scrubbed them from the CQ) keeps its buffer in the SRQ until the SRQ is
//!    destroyed.
//! 4. **Flushes end requests like completions.** A receive a QP on the SRQ had taken when it
//!    went to the error state completes with an error or flush status, which gives its buffer
//!    back like a success, or never completes, and its buffer stays the SRQ's (rule 3). The
//!    receives no QP took are not flushed (rxe and the mlx5 model: `tests/srq.rs`): they stay
//!    the SRQ's, for its other QPs.
//! 5. **Destroying the SRQ ends all device access** to its requests. The kernel refuses
//!    DESTROY_SRQ while a QP uses the SRQ. [`Srq::destroy_reclaim`] gives back every buffer
//!    the SRQ holds once DESTROY_SRQ succeeded; [`Srq::destroy`] and dropping the handle drop
//!    them then. A handle dropped while QPs still use the SRQ parks its buffers with the
//!    kernel SRQ, dropped after the last QP and DESTROY_SRQ, and leaked if that fails.
//! 6. **`mem::forget` is harmless**, as on a QP: forgetting an `Srq` leaks the kernel SRQ
//!    and the buffers it holds.
//!
//! A buffer cannot be reused, read or dropped while the SRQ holds it:
//!
//! ```compile_fail,E0382
//! # fn f(srq: &mut uverbs::Srq, buf: uverbs::Buf) -> uverbs::Result<()> {
//! srq.recv_buf(buf)?;
//! srq.recv_buf(buf)?; // moved into the SRQ: E0382
//! # Ok(()) }
//! ```
//!
//! ```compile_fail,E0382
//! # fn f(srq: &mut uverbs::Srq, buf: uverbs::Buf) -> uverbs::Result<()> {
//! srq.recv_buf(buf)?;
//! let first = buf.as_slice()[0]; // the device may be writing it: E0382
//! # Ok(()) }
//! ```
//!
//! ```compile_fail,E0382
//! # fn f(srq: &mut uverbs::Srq, buf: uverbs::Buf) -> uverbs::Result<()> {
//! srq.recv_buf(buf)?;
//! drop(buf); // the SRQ holds it: E0382
//! # Ok(()) }
//! ```
//!
//! Nor can a completion be made up to get one back early:
//!
//! ```compile_fail,E0308
//! # fn f(srq: &mut uverbs::Srq, wc: &uverbs::WorkCompletion) {
//! let _ = srq.reclaim(wc); // a `Completion` comes only from `Cq::reap`: E0308
//! # }
//! ```

use super::{Completion, Reaped, Refused};
use crate::cq::EventsReported;
use crate::error::Error;
use crate::held::{without_unwinding, SrqHeld};
use crate::mr::Buf;
use crate::srq::Srq;
use crate::wc::WcStatus;
use crate::wr::RecvWr;

/// Why [`Srq::reclaim`] gave nothing back for a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SrqReclaimError {
    /// The completion's QP is not on this SRQ (or no longer: it was destroyed), or the
    /// completion did not come from that QP's receive CQ.
    ForeignQp {
        /// The completion's QP number.
        qp_num: u32,
    },
    /// The completion is not of a safe receive: a send of a QP on the SRQ, or a receive
    /// posted with the unsafe [`Srq::post_recv`].
    NotSafeRecv {
        /// The completion's `wr_id`.
        wr_id: u64,
    },
    /// The SRQ holds no buffer for this request: it was given back already.
    NotHeld {
        /// The completion's `wr_id`.
        wr_id: u64,
    },
}

impl std::fmt::Display for SrqReclaimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ForeignQp { qp_num } => write!(f, "QP {qp_num} does not receive from this SRQ"),
            Self::NotSafeRecv { wr_id } => write!(f, "wr_id {wr_id:#x} is not a safe receive of an SRQ"),
            Self::NotHeld { wr_id } => write!(f, "the SRQ holds no buffer for wr_id {wr_id:#x}"),
        }
    }
}

impl std::error::Error for SrqReclaimError {}

impl Srq {
    /// Posts a receive into `buf`'s whole capacity. The SRQ holds it until [`Srq::reclaim`]
    /// gives it back, its length set to the bytes received. On failure the buffer comes back
    /// in the [`Refused`] unless the request may have been queued ([`Refused::buf`]); when
    /// every slot holds a buffer (the SRQ has as many as its room when created, rounded up to
    /// a power of two) or the provider's ring is full, the error is
    /// [`crate::WrReject::QueueFull`].
    #[inline]
    pub fn recv_buf(&mut self, buf: Buf) -> std::result::Result<(), Refused> {
        if let Err(error) = self.owner.check("post_srq_recv") {
            return Err(Refused { error, buf: Some(buf) });
        }
        let (id, sge) = match self.held.claim(buf) {
            Ok(claimed) => claimed,
            Err((reason, buf)) => {
                let error = Error::WorkRequest {
                    verb: "srq_recv_buf",
                    index: 0,
                    reason,
                };
                return Err(Refused { error, buf: Some(buf) });
            }
        };
        let wr = RecvWr::new(id, std::slice::from_ref(sge));
        // SAFETY: the buffer stays in `self.held` until `reclaim` sees this request's own
        // completion from the receive CQ of a QP on this SRQ, or until the SRQ is destroyed:
        // the device is done with it by then (the module docs). No one else holds it meanwhile.
        match without_unwinding(|| unsafe { self.queue.post_recv(std::slice::from_ref(&wr)) }) {
            Ok(()) => {
                self.held.commit();
                Ok(())
            }
            Err(error) => Err(self.recv_failed(error)),
        }
    }

    /// `recv_buf`'s post failed with `error`: the claimed buffer comes back unless the
    /// provider may have queued the request.
    #[cold]
    fn recv_failed(&mut self, error: Error) -> Refused {
        let buf = if matches!(error, Error::WorkRequest { .. }) {
            self.held.unclaim()
        } else {
            // The provider may have queued it: held like a posted one.
            self.held.commit();
            None
        };
        Refused { error, buf }
    }

    /// The buffer of the receive `c` completes, if `c` is the completion of one posted with
    /// [`Srq::recv_buf`], reaped from the receive CQ of the QP on this SRQ that took it. Its
    /// length is set to the bytes received (`c.byte_len`); on an error status (a flush) its
    /// contents are unspecified. Each receive's buffer comes back once.
    #[inline]
    pub fn reclaim(&mut self, c: Completion<'_>) -> std::result::Result<Buf, SrqReclaimError> {
        if !self.held.knows(&self.inner.members, c.qp_num, c.cq) {
            return Err(SrqReclaimError::ForeignQp { qp_num: c.qp_num });
        }
        if !SrqHeld::is_recv_id(c.wr_id) {
            return Err(SrqReclaimError::NotSafeRecv { wr_id: c.wr_id });
        }
        let mut buf = self
            .held
            .release(c.wr_id)
            .ok_or(SrqReclaimError::NotHeld { wr_id: c.wr_id })?;
        if c.status == WcStatus::SUCCESS {
            buf.received(c.byte_len);
        }
        Ok(buf)
    }

    /// Every buffer the completions of `reaped` give back ([`Srq::reclaim`] for each), pushed
    /// onto `into` in the order of the completions; returns how many. Completions that are not
    /// this SRQ's give nothing. No allocation while `into` has room.
    pub fn reclaim_all(&mut self, reaped: &Reaped<'_>, into: &mut Vec<Buf>) -> usize {
        let before = into.len();
        into.extend(reaped.iter().filter_map(|c| self.reclaim(c).ok()));
        into.len() - before
    }

    /// How many buffers from [`Srq::recv_buf`] the SRQ holds (a pass over its slots).
    pub fn held_bufs(&self) -> usize {
        self.held.len()
    }

    /// [`Srq::destroy`], and every buffer the SRQ held pushed onto `into` once the kernel
    /// destroyed it. On failure (EBUSY while a QP uses the SRQ) the SRQ comes back with its
    /// buffers, unchanged.
    #[allow(clippy::result_large_err)] // a cold path that hands the SRQ back whole on failure
    pub fn destroy_reclaim(mut self, into: &mut Vec<Buf>) -> std::result::Result<EventsReported, (Self, Error)> {
        let held = std::mem::replace(&mut self.held, SrqHeld::new(0));
        match self.destroy() {
            Ok(events) => {
                let mut held = held;
                into.extend(held.drain());
                Ok(events)
            }
            Err((mut srq, error)) => {
                srq.held = held;
                Err((srq, error))
            }
        }
    }
}
