//! Posting without `unsafe`: the QP owns each request's local buffer from the post until the
//! completion that gives it back.
//!
//! A [`Buf`] (a piece of an [`crate::Mr`], from [`crate::Mr::into_bufs`]) is *moved* into the
//! QP by [`Qp::send_buf`] (sends, RDMA writes, reads and atomics) or [`Qp::recv_buf`], and
//! comes back only from [`Qp::reclaim`], given a [`Completion`] reaped from the QP's own CQ by
//! [`Cq::reap`]. Inline sends copy a `&[u8]` before returning ([`Qp::send_inline`]) and keep
//! nothing. The unsafe [`Qp::post_send`] and [`Qp::post_recv`] stay for callers who manage
//! buffers themselves. Receives on a shared receive queue have their own safe post and
//! reclaim, [`crate::Srq::recv_buf`] and [`crate::Srq::reclaim`] ([`srq`]).
//!
//! ```
//! # fn f(qp: &mut uverbs::Qp, cq: &mut uverbs::Cq, mut buf: uverbs::Buf) -> Result<(), Box<dyn std::error::Error>> {
//! use uverbs::{SendOp, WorkCompletion};
//! buf.fill_from(b"hello")?;
//! qp.send_buf(SendOp::Send, buf)?; // `buf` is the QP's now
//! let mut wc = [WorkCompletion::default(); 16];
//! for c in cq.reap(&mut wc).iter() {
//!     c.result()?;
//!     while let Some(buf) = qp.reclaim(c) {
//!         // ours again: the device is done with it
//! #       drop(buf);
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # Why it is sound
//!
//! The device touches a local buffer only while a work request naming it is outstanding, and
//! only through the lkey of a region that is still registered. The rules:
//!
//! 1. **Only the holder reaches a `Buf`'s bytes.** `Buf`s of one region are disjoint, and their
//!    region has no remote write or atomic access (an [`crate::Mr`] from
//!    [`crate::Pd::alloc_mr`] cannot ask for it, [`crate::LocalAccess`]; `into_bufs` checks
//!    the flags of one registered by hand), so no peer writes them. While a QP holds a `Buf`, no one else has it: the
//!    post took it by value, so the caller cannot read, write, reuse or drop it (the
//!    `compile_fail` examples below). A `Buf` is one pointer to a box holding its SGE: the post
//!    puts it in the QP's slot for the request first, the request names the SGE in that box
//!    (a receive names the second SGE there, of the buffer's whole capacity, which never
//!    changes), and the provider copies the SGE into its work queue entry before returning. (The
//!    request array the QP keeps for lists may go on naming the SGE of a buffer given back
//!    since, but only as `MaybeUninit` bits that are never read: a list post writes each
//!    entry's SGE before it hands the entry on, `src/held.rs`.) If the
//!    provider rejected the request ([`crate::Error::WorkRequest`] names it; in a list,
//!    [`Qp::send_bufs`], it and those after it), none of it was queued and the buffer comes
//!    back at once; after any other error the provider may have queued it (a doorbell that
//!    failed after the ring was published), so the QP keeps the buffer as if it were posted.
//! 2. **A `Buf` leaves the QP only once the device is done with it.** Each request gets an id
//!    (its `wr_id`) no other request in the process ever had: each queue's ids grow by one
//!    with every post, within a run of values handed to that queue alone (a dropped queue's
//!    unused values go to a later queue, never a value a request had: `src/held/blocks.rs`). A
//!    queue completes its requests in the order they were posted (InfiniBand's rule, which
//!    unsignaled sends rely on in every verbs library), so a completion for id `n` means every
//!    request of that queue up to `n` is done, *whatever its status*: an error or flush
//!    completion ends a request like a success. [`Qp::reclaim`] gives back the buffers of the
//!    requests up to `n`, oldest first, and only for a [`Completion`]: a value only
//!    [`Cq::reap`] makes, from a completion the device wrote into that CQ, which `reclaim`
//!    checks is the QP's send (or receive) CQ, the QP's number, and an id of that queue. A
//!    forged `WorkCompletion` cannot be turned into a `Completion`; an old one only names ids
//!    already given back; one of an earlier QP with the same number names an id this QP never
//!    gave out, and an id gives back buffers only if it lies between the oldest the queue
//!    holds and the last it gave out. Raw posts keep bit 63 of their `wr_id`s clear in a
//!    process that uses the safe posts (their `unsafe` contract), so their completions, this
//!    QP's or an earlier one's, give nothing back. A QP does not move to RESET while its
//!    queues count requests ([`Error::RequestsOutstanding`]): a device drops queued requests
//!    at RESET without completions, and rxe may still be writing one's buffer after the move;
//!    a move to ERR flushes every request instead, and the flushes give the buffers back. A
//!    provider that panics during a safe post aborts the process: the requests
//!    it may have queued are counted when it returns.
//! 3. **Lost completions lose no soundness.** After a CQ overrun the missing completions' buffers
//!    come back with the next completion of the same queue (it implies the earlier ones);
//!    if none comes, they stay in the QP. Unsignaled sends work the same way.
//! 4. **Destroying the QP ends all device access** to its requests: `Qp`'s drop and
//!    [`Qp::destroy`] drop the held `Buf`s only after DESTROY_QP succeeded. If the kernel
//!    refused to destroy it, the buffers are leaked with the QP's rings, never freed.
//! 5. **`mem::forget` is harmless.** Forgetting a `Qp` leaks the kernel QP and the `Buf`s it
//!    holds (each keeps its region registered and mapped: the device may still write there,
//!    and nothing else ever will). Forgetting a `Buf` leaks its share of the region. No guard
//!    object exists whose destructor soundness depends on.
//! 6. **A region outlives its buffers.** Each `Buf` holds the region; it is deregistered and
//!    unmapped after the last one is dropped, and its mapping is leaked if DEREG_MR fails. In
//!    a forked child the region's pages are zeroed ones of the child's own, never unmapped by
//!    the child (`crate::sys::mapping`): a `Buf` it inherited reads zeros there.
//!
//! A buffer cannot be reused or dropped while posted:
//!
//! ```compile_fail,E0382
//! # fn f(qp: &mut uverbs::Qp, mut buf: uverbs::Buf) -> uverbs::Result<()> {
//! qp.send_buf(uverbs::SendOp::Send, buf)?;
//! buf.as_mut_slice()[0] = 1; // moved into the QP: E0382
//! # Ok(()) }
//! ```
//!
//! ```compile_fail,E0382
//! # fn f(qp: &mut uverbs::Qp, buf: uverbs::Buf) -> uverbs::Result<()> {
//! qp.recv_buf(buf)?;
//! drop(buf); // the QP holds it: E0382
//! # Ok(()) }
//! ```
//!
//! Nor can a completion be made up to get one back early:
//!
//! ```compile_fail,E0451
//! # fn f(qp: &mut uverbs::Qp, wc: &uverbs::WorkCompletion) {
//! let fake = uverbs::Completion { wc, cq: 0 }; // private fields: E0451
//! let _ = qp.reclaim(fake);
//! # }
//! ```
//!
//! Remotely writable memory is never a plain slice without `unsafe`:
//!
//! ```compile_fail,E0133
//! # fn f(pd: &uverbs::Pd) -> uverbs::Result<()> {
//! let mr = pd.alloc_remote_mr(4096, uverbs::AccessFlags::LOCAL_WRITE | uverbs::AccessFlags::REMOTE_WRITE)?;
//! let bytes: &[u8] = mr.as_slice(); // unsafe: a peer may be writing them
//! # Ok(()) }
//! ```
//!
//! Nor allocated as an `Mr`, which does not compile:
//!
//! ```compile_fail,E0599
//! # fn f(pd: &uverbs::Pd) -> uverbs::Result<()> {
//! let mr = pd.alloc_mr(4096, uverbs::LocalAccess::LOCAL_WRITE | uverbs::LocalAccess::REMOTE_WRITE)?; // E0599
//! # Ok(()) }
//! ```
//!
//! Nor split into `Buf`s (a region registered by hand with [`crate::Pd::reg_mr`]): refused
//! at run time.

mod srq;

pub use srq::SrqReclaimError;

use crate::attr::QpState;
use crate::cq::Cq;
use crate::error::{Error, Result, Verb, WrReject};
use crate::held::{without_unwinding, ListStop};
use crate::mr::Buf;
use crate::qp::Qp;
use crate::remote::{RemoteOutOfBounds, RemoteRegion};
use crate::wc::{WcOpcode, WcStatus, WorkCompletion, WorkQueue};
use crate::wr::{RecvWr, SendFlags, SendList, SendOp, SendWr, Sge, UdDest};

/// Completions just taken from a CQ by [`Cq::reap`]: the proof [`Qp::reclaim`] asks for.
#[derive(Debug)]
pub struct Reaped<'w> {
    wcs: &'w [WorkCompletion],
    cq: usize,
}

impl<'w> Reaped<'w> {
    pub(crate) fn new(wcs: &'w [WorkCompletion], cq: usize) -> Self {
        Self { wcs, cq }
    }

    /// How many completions were reaped.
    pub fn len(&self) -> usize {
        self.wcs.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.wcs.is_empty()
    }

    /// The completions, in the order the CQ delivered them.
    pub fn iter(&self) -> impl Iterator<Item = Completion<'w>> + '_ {
        self.wcs.iter().map(|wc| Completion { wc, cq: self.cq })
    }
}

/// One completion reaped from a CQ; it reads as the [`WorkCompletion`] it is. Only
/// [`Cq::reap`] makes these.
#[derive(Debug, Clone, Copy)]
pub struct Completion<'w> {
    wc: &'w WorkCompletion,
    /// The CQ it came from (its shared state's address, alive while a QP on it lives).
    cq: usize,
}

impl Completion<'_> {
    /// The queue of the request this completes, whatever its status (a flush or error
    /// completion's `opcode` is undefined, but the safe posts' ids say it): `None` only for
    /// a failed request of the raw posts ([`Qp::post_send`], [`Qp::post_recv`]), which the
    /// library cannot tell.
    pub fn queue(&self) -> Option<WorkQueue> {
        if let Some(queue) = crate::held::queue_of(self.wc_id()) {
            return Some(queue);
        }
        self.is_success().then(|| {
            if self.opcode.0 & WcOpcode::RECV.0 != 0 {
                WorkQueue::Recv
            } else {
                WorkQueue::Send
            }
        })
    }

    fn wc_id(&self) -> u64 {
        self.wc.wr_id
    }
}

/// A buffer [`Qp::reclaim_detailed`] gave back, with the request it was posted with.
#[derive(Debug)]
#[non_exhaustive]
pub struct Reclaimed {
    /// The buffer (a receive's with its length set to the bytes received, when the
    /// completion was its own and a success).
    pub buf: Buf,
    /// The queue the request was posted to.
    pub queue: WorkQueue,
    /// The operation it was posted with ([`WcOpcode::RECV`] for a receive), known whatever
    /// the completion's status.
    pub op: WcOpcode,
    /// The request's `wr_id`: the completion's own, or an earlier request's that the
    /// completion implies (an unsignaled one, or one whose completion an overrun lost).
    pub wr_id: u64,
}

impl Reclaimed {
    /// Whether `c` is this request's own completion (not a later request's).
    pub fn completed_by(&self, c: &Completion<'_>) -> bool {
        c.wr_id == self.wr_id
    }
}

impl std::ops::Deref for Completion<'_> {
    type Target = WorkCompletion;

    fn deref(&self) -> &WorkCompletion {
        self.wc
    }
}

impl Cq {
    /// Polls like [`Cq::poll`] into `wc` and returns what it got as [`Completion`]s, which
    /// [`Qp::reclaim`] turns back into the buffers the requests were posted with. A ring read
    /// like `poll`: when it comes back empty, [`Cq::check`] tells of an overrun.
    #[inline]
    pub fn reap<'w>(&mut self, wc: &'w mut [WorkCompletion]) -> Reaped<'w> {
        let n = self.poll(wc);
        Reaped::new(&wc[..n], self.identity())
    }

    /// [`Cq::reap`] through [`Cq::try_poll`]: the completions that fit, then
    /// [`Error::CqOverrun`] once the CQ overran, though nobody reads async events.
    #[inline]
    pub fn try_reap<'w>(&mut self, wc: &'w mut [WorkCompletion]) -> Result<Reaped<'w>> {
        let n = self.try_poll(wc)?;
        Ok(Reaped::new(&wc[..n], self.identity()))
    }
}

/// A post that failed, with the buffer if it was not posted.
#[derive(Debug)]
pub struct Refused {
    /// Why.
    pub error: Error,
    /// The buffer, unposted: always, except after an error other than
    /// [`Error::WorkRequest`] from the provider (such as a failed doorbell), when the request
    /// may have been queued: then `None`, and the QP holds the buffer like a posted one until
    /// a completion or the QP's destruction gives it back.
    pub buf: Option<Buf>,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for Refused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<Refused> for Error {
    fn from(r: Refused) -> Self {
        r.error
    }
}

impl Qp {
    /// Posts `op` with `buf` as its local buffer, signaled: the bytes `0..buf.len()` are
    /// gathered for a send or write, or receive what a read or atomic fetches (8 bytes). The
    /// QP holds `buf` until [`Qp::reclaim`] gives it back. On failure the buffer comes back in
    /// the [`Refused`] unless the request may have been queued ([`Refused::buf`]).
    #[inline]
    pub fn send_buf(&mut self, op: SendOp, buf: Buf) -> std::result::Result<(), Refused> {
        self.send_buf_with(op, buf, SendFlags::SIGNALED, None)
    }

    /// [`Qp::send_buf`] with `flags` (as given: without [`SendFlags::SIGNALED`] the buffer
    /// comes back with a later signaled request's completion) and, on a UD QP, `dest`.
    #[inline]
    pub fn send_buf_with(
        &mut self,
        op: SendOp,
        buf: Buf,
        flags: SendFlags,
        dest: Option<UdDest<'_>>,
    ) -> std::result::Result<(), Refused> {
        // The queue is closed while the QP's state forbids sends: `next_id` fails then too.
        let id = match self.owner.check("post_send").and_then(|()| self.send_id("send_buf")) {
            Ok(id) => id,
            Err(error) => return Err(Refused { error, buf: Some(buf) }),
        };
        if dest.is_some_and(|dest| dest.foreign_to(self.context)) {
            let error = Error::WorkRequest {
                verb: "send_buf",
                index: 0,
                reason: WrReject::ForeignAh,
            };
            return Err(Refused { error, buf: Some(buf) });
        }
        if let Err(error) = modelled(&op, "send_buf") {
            return Err(Refused { error, buf: Some(buf) });
        }
        let wr = SendWr {
            wr_id: id,
            op,
            sg_list: std::slice::from_ref(self.held.sends.claim_send(buf, &op)),
            flags,
            ud: dest,
        };
        // SAFETY: the buffer stays in `self.held.sends` until `reclaim` sees a completion of this
        // request or a later one from this QP's send CQ, or until the QP is destroyed: the
        // device is done with it by then (the module docs). No one else holds it meanwhile.
        match without_unwinding(|| unsafe { self.queues.vendor().post_send(SendList::new(std::slice::from_ref(&wr))) })
        {
            Ok(()) => {
                self.held.sends.commit();
                Ok(())
            }
            Err(error) => {
                let buf = if matches!(error, Error::WorkRequest { .. }) {
                    Some(self.held.sends.unclaim())
                } else {
                    // The provider may have queued it: held like a posted one.
                    self.held.sends.commit();
                    None
                };
                Err(Refused { error, buf })
            }
        }
    }

    /// Posts one `op` per buffer of `bufs`, in order, taking them from its front: up to
    /// [`Qp::BUF_LIST`] requests share a doorbell (the provider's list). Each request is posted
    /// with `flags` as [`Qp::send_buf_with`] posts it (not for UD QPs), and the QP holds each
    /// buffer until [`Qp::reclaim`] gives it back.
    ///
    /// On an [`Error::WorkRequest`], the requests before its `index` (counted from the first
    /// buffer of this call) were posted and the buffers not posted are back in `bufs`, in
    /// order; after another error from the provider the QP holds the buffers of the list that
    /// doorbell was for (as in [`Refused::buf`]) and those after it are back in `bufs`. The
    /// requests come from an array the QP keeps (filled again only when `op` or `flags`
    /// change), each buffer's SGE named where the QP keeps it. No allocation.
    pub fn send_bufs(&mut self, op: SendOp, bufs: &mut Vec<Buf>, flags: SendFlags) -> Result<()> {
        self.owner.check("post_send")?;
        modelled(&op, "send_bufs")?;
        let queues = self.queues.vendor();
        let (posted, stop) = self.held.sends.post_list(
            bufs,
            op,
            flags,
            // SAFETY: as in `send_buf`, for each request of the list: its buffer is in
            // `self.held.sends` until a completion gives it back, and those the provider refused
            // come out again (back into `bufs`) before anyone else can reach them.
            |wrs| unsafe { queues.post_send(SendList::new(wrs)) },
        );
        let Some(stop) = stop else {
            return Ok(());
        };
        Err(match stop {
            ListStop::Room(reason) => at_index(self.send_refusal("send_bufs", reason), posted),
            ListStop::Post(e) => at_index(e, posted),
        })
    }

    /// RDMA-writes `buf`'s bytes to `offset` in the peer's `region`, signaled, as
    /// [`Qp::send_buf`] posts it; refused before posting, the buffer back, when they do not
    /// fit the region ([`WrReject::RemoteOutOfBounds`]).
    pub fn write_buf(&mut self, buf: Buf, region: &RemoteRegion, offset: u64) -> std::result::Result<(), Refused> {
        match region.at(offset, buf.len() as u64) {
            Ok(remote) => self.send_buf(SendOp::RdmaWrite(remote), buf),
            Err(e) => Err(out_of_bounds("write_buf", e, buf)),
        }
    }

    /// RDMA-reads `buf.len()` bytes from `offset` in the peer's `region` into `buf`,
    /// signaled; checked like [`Qp::write_buf`].
    pub fn read_buf(&mut self, buf: Buf, region: &RemoteRegion, offset: u64) -> std::result::Result<(), Refused> {
        match region.at(offset, buf.len() as u64) {
            Ok(remote) => self.send_buf(SendOp::RdmaRead(remote), buf),
            Err(e) => Err(out_of_bounds("read_buf", e, buf)),
        }
    }

    /// Fetch-and-add of `add` on the 8 bytes at `offset` in the peer's `region`, the old value
    /// landing in `buf` (8 bytes long); checked like [`Qp::write_buf`].
    pub fn fetch_add_buf(
        &mut self,
        buf: Buf,
        region: &RemoteRegion,
        offset: u64,
        add: u64,
    ) -> std::result::Result<(), Refused> {
        match region.at(offset, 8) {
            Ok(remote) => self.send_buf(SendOp::FetchAdd { remote, add }, buf),
            Err(e) => Err(out_of_bounds("fetch_add_buf", e, buf)),
        }
    }

    /// Compare-and-swap on the 8 bytes at `offset` in the peer's `region`, the old value
    /// landing in `buf` (8 bytes long); checked like [`Qp::write_buf`].
    pub fn compare_swap_buf(
        &mut self,
        buf: Buf,
        region: &RemoteRegion,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> std::result::Result<(), Refused> {
        match region.at(offset, 8) {
            Ok(remote) => self.send_buf(SendOp::CompareSwap { remote, compare, swap }, buf),
            Err(e) => Err(out_of_bounds("compare_swap_buf", e, buf)),
        }
    }

    /// RDMA-writes `data` inline to `offset` in the peer's `region` ([`Qp::send_inline`]);
    /// checked like [`Qp::write_buf`].
    pub fn write_inline(&mut self, data: &[u8], region: &RemoteRegion, offset: u64) -> Result<()> {
        let remote = region.at(offset, data.len() as u64).map_err(|e| Error::WorkRequest {
            verb: "write_inline",
            index: 0,
            reason: e.into(),
        })?;
        self.send_inline(SendOp::RdmaWrite(remote), data)
    }

    /// The most requests [`Qp::send_bufs`] posts with one doorbell.
    pub const BUF_LIST: usize = crate::held::LIST;

    /// Posts `op` (a send or RDMA write) with `data` copied into the request, signaled. The
    /// QP must have been granted that much inline data ([`Qp::cap`]'s `max_inline_data`, at
    /// least [`crate::QpInit::INLINE`] for a QP created from [`crate::QpInit::new`]): more is
    /// [`WrReject::InlineTooLong`] on every provider. Nothing is held: its
    /// completion only counts (and gives back older buffers, as any later completion does).
    pub fn send_inline(&mut self, op: SendOp, data: &[u8]) -> Result<()> {
        self.send_inline_with(op, data, SendFlags::SIGNALED, None)
    }

    /// [`Qp::send_inline`] with `flags` ([`SendFlags::INLINE`] is added) and a UD `dest`.
    pub fn send_inline_with(
        &mut self,
        op: SendOp,
        data: &[u8],
        flags: SendFlags,
        dest: Option<UdDest<'_>>,
    ) -> Result<()> {
        self.owner.check("post_send")?;
        modelled(&op, "send_inline")?;
        self.check_send_state()?;
        // Refused above what the QP was granted ([`Qp::cap`]), on every provider alike.
        let max = self.cap().max_inline_data;
        let length = u32::try_from(data.len())
            .ok()
            .filter(|&n| n <= max)
            .ok_or(Error::WorkRequest {
                verb: "send_inline",
                index: 0,
                reason: WrReject::InlineTooLong { given: data.len(), max },
            })?;
        let sge = Sge {
            addr: data.as_ptr() as u64,
            length,
            lkey: 0,
        };
        let mut wr = SendWr::new(0, op, std::slice::from_ref(&sge)).set_flags(flags | SendFlags::INLINE);
        wr.ud = dest;
        if wr.foreign_ah(self.context) {
            return Err(Error::WorkRequest {
                verb: "send_inline",
                index: 0,
                reason: WrReject::ForeignAh,
            });
        }
        // Drawn only once the request is known to be well formed; a gap in the ids is harmless.
        wr.wr_id = self.held.sends.bare_id_for(&op).map_err(|reason| Error::WorkRequest {
            verb: "send_inline",
            index: 0,
            reason,
        })?;
        // SAFETY: INLINE: the provider copies `data` into the queue before returning (and
        // refuses operations the device would write into, checked by `SendList`).
        unsafe { self.queues.vendor().post_send(SendList::new(std::slice::from_ref(&wr))) }
    }

    /// Posts a receive into `buf`'s whole capacity. The QP holds it until [`Qp::reclaim`]
    /// gives it back, its length set to the bytes received. Not for QPs on an SRQ: their
    /// receives are the SRQ's ([`crate::Srq::recv_buf`]).
    ///
    /// Refused in RESET and in ERR ([`WrReject::WrongState`]): a receive posted in ERR may
    /// never complete, not even flushed (rxe on Linux 6.1, as [`Qp::post_recv`] says), and
    /// would keep the QP from RESET ([`Error::RequestsOutstanding`]).
    #[inline]
    pub fn recv_buf(&mut self, buf: Buf) -> std::result::Result<(), Refused> {
        let id = match self.owner.check("post_recv").and_then(|()| self.recv_id()) {
            Ok(id) => id,
            Err(error) => return Err(Refused { error, buf: Some(buf) }),
        };
        let wr = RecvWr::new(id, std::slice::from_ref(self.held.recvs.claim(buf, true)));
        // SAFETY: as in `send_buf`, for the receive queue and its CQ.
        match without_unwinding(|| unsafe { self.queues.vendor().post_recv(std::slice::from_ref(&wr)) }) {
            Ok(()) => {
                self.held.recvs.commit();
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
            Some(self.held.recvs.unclaim())
        } else {
            // The provider may have queued it: held like a posted one.
            self.held.recvs.commit();
            None
        };
        Refused { error, buf }
    }

    /// The next buffer `c` gives back: if `c` is a completion of this QP's send queue (from
    /// its send CQ) or receive queue (from its receive CQ), the oldest buffer the QP holds for
    /// that queue, when its request was `c`'s or an earlier one (completed, since a queue
    /// completes in order). Call until `None`: one completion may give back several buffers
    /// (unsignaled requests before it, or requests whose completions a CQ overrun lost).
    ///
    /// A receive's buffer comes back with its length set to the bytes received
    /// (`c.byte_len`); on an error status its contents are unspecified.
    pub fn reclaim(&mut self, c: Completion<'_>) -> Option<Buf> {
        self.reclaim_detailed(c).map(|r| r.buf)
    }

    /// [`Qp::reclaim`], saying which queue the buffer comes from and what its request was
    /// ([`Reclaimed`]), for success, flush and error completions alike.
    ///
    /// ```
    /// # fn f(qp: &mut uverbs::Qp, c: uverbs::Completion<'_>) {
    /// use uverbs::WorkQueue;
    /// while let Some(r) = qp.reclaim_detailed(c) {
    ///     match r.queue {
    ///         WorkQueue::Recv => { /* post it again, or read it if c succeeded */ }
    ///         WorkQueue::Send => { /* r.op: what it was posted with */ }
    ///     }
    /// }
    /// # }
    /// ```
    pub fn reclaim_detailed(&mut self, c: Completion<'_>) -> Option<Reclaimed> {
        if c.qp_num != self.qpn() {
            return None;
        }
        let (send_cq, recv_cq) = (self.send_cq_identity(), self.recv_cq_identity());
        let (held, cq) = if self.held.sends.owns(c.wr_id) {
            (&mut self.held.sends, send_cq)
        } else if self.held.recvs.owns(c.wr_id) {
            (&mut self.held.recvs, recv_cq)
        } else {
            return None;
        };
        if cq != c.cq {
            return None;
        }
        let (id, mut buf) = held.release(c.wr_id)?;
        if id == c.wr_id && held.is_recv() && c.status == WcStatus::SUCCESS {
            buf.received(c.byte_len);
        }
        let (queue, op) = if held.is_recv() {
            (WorkQueue::Recv, WcOpcode::RECV)
        } else {
            // Just released: its slot's operation is still the request's.
            (WorkQueue::Send, held.op_of(id).unwrap_or_default())
        };
        Some(Reclaimed {
            buf,
            queue,
            op,
            wr_id: id,
        })
    }

    /// The operation of the request `c` completes, whatever its status: on success the
    /// completion's own `opcode`; on a flush or error (when `opcode` is undefined) what the
    /// safe posts recorded when they posted it ([`WcOpcode::RECV`] for a receive). Ask before
    /// [`Qp::reclaim`] lets the request go: `None` once a later post took its place, and for a
    /// failed request of the raw posts or of another QP.
    pub fn completed_op(&self, c: &Completion<'_>) -> Option<WcOpcode> {
        if c.qp_num != self.qpn() {
            return None;
        }
        if c.is_success() {
            return Some(c.opcode);
        }
        match crate::held::queue_of(c.wr_id)? {
            // This QP's receive (or its SRQ's): a receive, whatever became of it.
            WorkQueue::Recv => Some(WcOpcode::RECV),
            WorkQueue::Send => self.held.sends.op_of(c.wr_id),
        }
    }

    /// Every buffer the completions of `reaped` give back to this QP ([`Qp::reclaim`] for each
    /// in turn), pushed onto `into` in the order given back; returns how many. Completions of
    /// other QPs give nothing. No allocation while `into` has room.
    pub fn reclaim_all(&mut self, reaped: &Reaped<'_>, into: &mut Vec<Buf>) -> usize {
        let before = into.len();
        for c in reaped.iter() {
            while let Some(buf) = self.reclaim(c) {
                into.push(buf);
            }
        }
        into.len() - before
    }

    /// How many requests of the safe posts the send and receive queues still count: those
    /// holding a buffer, and inline sends no completion has passed yet. While either is not 0
    /// the QP may not move to RESET ([`crate::Error::RequestsOutstanding`]).
    pub fn held_bufs(&self) -> (usize, usize) {
        (self.held.sends.len(), self.held.recvs.len())
    }

    /// The id for the next request holding a buffer on the send queue: refused while the
    /// QP's state forbids sends (the queue is closed then) or the queue is full.
    #[inline]
    fn send_id(&mut self, verb: Verb) -> Result<u64> {
        match self.held.sends.next_id() {
            Ok(id) => Ok(id),
            Err(reason) => Err(self.send_refusal(verb, reason)),
        }
    }

    #[cold]
    fn send_refusal(&self, verb: Verb, reason: WrReject) -> Error {
        self.check_send_state()
            .err()
            .unwrap_or(Error::WorkRequest { verb, index: 0, reason })
    }

    /// As `send_id`, for the receive queue (closed in RESET, and on an SRQ: no room).
    #[inline]
    fn recv_id(&mut self) -> Result<u64> {
        match self.held.recvs.next_id() {
            Ok(id) => Ok(id),
            Err(reason) => Err(self.recv_refusal(reason)),
        }
    }

    #[cold]
    fn recv_refusal(&self, reason: WrReject) -> Error {
        let reason = if matches!(self.state(), QpState::Reset | QpState::Err) {
            WrReject::WrongState(self.state())
        } else {
            reason
        };
        Error::WorkRequest {
            verb: "recv_buf",
            index: 0,
            reason,
        }
    }
}

/// Refuses a raw operation ([`SendOp::Raw`]) on the safe posts: the core cannot say what the
/// device does with a buffer lent to an operation it does not model (rule 1 of the module
/// docs reasons about the operations it does), and an unmodelled opcode reaches the kernel
/// only through the `unsafe` posts, whose caller answers for it (rxe on Linux 6.1 dereferences
/// a null pointer on one: docs/kernel-facts.md).
#[cold]
fn modelled(op: &SendOp, verb: Verb) -> Result<()> {
    match op {
        SendOp::Raw(_) => Err(Error::WorkRequest {
            verb,
            index: 0,
            reason: WrReject::OpcodeNotSupported,
        }),
        _ => Ok(()),
    }
}

/// A one-sided post refused for its range, the buffer back.
#[cold]
fn out_of_bounds(verb: Verb, e: RemoteOutOfBounds, buf: Buf) -> Refused {
    Refused {
        error: Error::WorkRequest {
            verb,
            index: 0,
            reason: e.into(),
        },
        buf: Some(buf),
    }
}

/// `e` with a work request's index counted from the start of a list of which `before` were
/// posted by earlier doorbells.
fn at_index(e: Error, before: usize) -> Error {
    match e {
        Error::WorkRequest { verb, index, reason } => Error::WorkRequest {
            verb,
            index: before + index,
            reason,
        },
        e => e,
    }
}
