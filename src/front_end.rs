//! What the core offers front ends beyond the vendor contract: posting chains of send requests
//! in libibverbs' layout (`crate::chain`), which a front end that hands on a C program's
//! `ibv_post_send` lists and `ibv_wr_*` batches (the drop-in libibverbs provider) posts through
//! [`crate::Qp::post_send_chain`] and [`crate::Qp::post_send_batch`].
//!
//! A vendor's QP queues implement [`ChainQueues`] in addition to the vendor contract's
//! `QpQueues` when they write chains themselves (rxe: from the C fields, checked as librxe
//! checks); the others implement [`GatheredChains`] and post them through [`post_gathered`], as
//! lists for `QpQueues::post_send`.
//! `providers/mod.rs` pairs each compiled-in provider with the function that makes its
//! [`Queues`]; a provider kept outside this crate (`Context::open_with`) gets
//! [`Queues::gathered`].
//!
//! [`Queues`] holds the two views of one queues object, made once when the QP is created: the
//! vendor's trait object for every other call and the front end's for chains, so neither post
//! takes a branch or a second indirect call to reach its provider.

use crate::attr::{QpState, QpType};
use crate::chain::SendChain;
use crate::error::{Error, Result, WrReject};
use crate::provider::{QpQueues, SendList};
use crate::wr::{ContextId, SendWr};
use std::mem::MaybeUninit;
use std::ptr::NonNull;

/// A vendor's QP queues posting chains in libibverbs' layout: [`QpQueues::post_send`]'s order,
/// doorbells and error contract, indices counted from the chain's first request. A provider
/// reads each request as it writes it (`SendChain::next`) and checks what its C twin checks
/// (`crate::chain`), the QP's state included.
pub(crate) trait ChainQueues: Send {
    /// Posts a chain as `ibv_post_send` posts it; `qp_type` is the QP's and `state` its state
    /// as the core last knew it.
    ///
    /// # Safety
    /// See [`crate::Qp::post_send_chain`]; a UD request's AH must be of `context`, the QP's
    /// (`SlowWr::read` checks).
    unsafe fn post_send_chain(
        &mut self,
        chain: SendChain<'_>,
        qp_type: QpType,
        context: ContextId,
        state: QpState,
    ) -> Result<()>;

    /// [`ChainQueues::post_send_chain`] of a batch made by libibverbs' extended QP builders
    /// (`ibv_wr_*`, completed with `ibv_wr_complete`), which a C provider may write with fewer
    /// checks than `ibv_post_send`'s: a provider checks what its C twin's builders and
    /// `ibv_wr_complete` check. This default is [`ChainQueues::post_send_chain`].
    ///
    /// # Safety
    /// As for [`ChainQueues::post_send_chain`].
    unsafe fn post_send_batch(
        &mut self,
        chain: SendChain<'_>,
        qp_type: QpType,
        context: ContextId,
        state: QpState,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.post_send_chain(chain, qp_type, context, state) }
    }
}

/// Queues that write no chain themselves: their [`ChainQueues`] is [`post_gathered`] through
/// their own `post_send`, for chains and batches alike.
pub(crate) trait GatheredChains: QpQueues {}

impl<Q: GatheredChains> ChainQueues for Q {
    unsafe fn post_send_chain(
        &mut self,
        chain: SendChain<'_>,
        qp_type: QpType,
        context: ContextId,
        state: QpState,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { post_gathered(self, chain, qp_type, context, state) }
    }
}

/// A chain posted through `queues`' [`QpQueues::post_send`], for queues that write no chain
/// themselves: sends refused below RTS, as [`crate::Qp::post_send`] refuses them, and the
/// requests gathered into lists of up to 32, one `post_send` each, so checked by the core's
/// transport rules (the `SendList`).
///
/// # Safety
/// As for [`ChainQueues::post_send_chain`].
pub(crate) unsafe fn post_gathered<Q: QpQueues + ?Sized>(
    queues: &mut Q,
    mut chain: SendChain<'_>,
    qp_type: QpType,
    context: ContextId,
    state: QpState,
) -> Result<()> {
    if state < QpState::Rts {
        return Err(Error::WorkRequest {
            verb: "post_send",
            index: 0,
            reason: WrReject::WrongState(state),
        });
    }
    const BATCH: usize = 32;
    let mut room = [const { MaybeUninit::<SendWr<'_>>::uninit() }; BATCH];
    let mut before = 0;
    loop {
        let (mut n, mut refused) = (0, None);
        while n < BATCH {
            match chain.next(qp_type).map(|wr| wr.to_send_wr(qp_type, context)) {
                None => break,
                Some(Ok(wr)) => {
                    room[n].write(wr);
                    n += 1;
                }
                Some(Err(reason)) => {
                    refused = Some(reason);
                    break;
                }
            }
        }
        // SAFETY: the first `n` were written above (`MaybeUninit<T>` has `T`'s layout).
        let wrs = unsafe { &*(std::ptr::from_ref(&room[..n]) as *const [SendWr<'_>]) };
        if n > 0 {
            // SAFETY: forwarded caller contract.
            unsafe { queues.post_send(SendList::new(wrs)) }.map_err(|e| match e {
                Error::WorkRequest { verb, index, reason } => Error::WorkRequest {
                    verb,
                    index: before + index,
                    reason,
                },
                e => e,
            })?;
        }
        if let Some(reason) = refused {
            return Err(Error::WorkRequest {
                verb: "post_send",
                index: before + n,
                reason,
            });
        }
        if n < BATCH {
            return Ok(());
        }
        before += n;
    }
}

/// The [`ChainQueues`] of queues that write no chain themselves: [`post_gathered`] through
/// them, a batch as a chain.
struct Gathered(NonNull<dyn QpQueues>);

// SAFETY: it points at the queues its `Queues` owns, which are `Send`, and moves with them.
unsafe impl Send for Gathered {}

impl ChainQueues for Gathered {
    unsafe fn post_send_chain(
        &mut self,
        chain: SendChain<'_>,
        qp_type: QpType,
        context: ContextId,
        state: QpState,
    ) -> Result<()> {
        // SAFETY: the queues of the `Queues` that owns this, alive as long as it is, and
        // reached through one view at a time (`Queues` lends one `&mut` at a time); forwarded
        // caller contract.
        unsafe { post_gathered(self.0.as_mut(), chain, qp_type, context, state) }
    }
}

/// Makes the [`Queues`] of queues a provider made, for one provider: [`Queues::new`] of its own
/// type, or [`Queues::gathered`].
///
/// # Safety
/// Called only with queues made by the provider it is paired with (`providers/mod.rs`), which
/// may cast them to its own type.
pub(crate) type MakeQueues = unsafe fn(Box<dyn QpQueues>) -> Queues;

/// A QP's queues as the core holds them: one object made by the provider, reached through the
/// vendor contract ([`Queues::vendor`]) and through the front-end interface
/// ([`Queues::chains`]), each a trait-object pointer made at creation. Owns the object (and,
/// for queues without a [`ChainQueues`] of their own, the [`Gathered`] adaptor) and drops it
/// with itself.
pub(crate) struct Queues {
    /// The provider's queues, from `Box::into_raw`.
    vendor: NonNull<dyn QpQueues>,
    /// The same object as a [`ChainQueues`], or the adaptor `adaptor` owns.
    chains: NonNull<dyn ChainQueues>,
    /// The [`Gathered`] adaptor `chains` points at, from `Box::into_raw`, when there is one.
    adaptor: Option<NonNull<Gathered>>,
}

// SAFETY: `Queues` owns one `QpQueues` object (which is `Send`) and perhaps an adaptor that
// only points at it; both views reach that one object, one `&mut` at a time.
unsafe impl Send for Queues {}

impl Queues {
    /// Queues that write chains themselves.
    pub(crate) fn new<Q: QpQueues + ChainQueues + 'static>(queues: Box<Q>) -> Self {
        let raw = Box::into_raw(queues);
        // SAFETY: `Box::into_raw` never returns null.
        let raw = unsafe { NonNull::new_unchecked(raw) };
        Self {
            vendor: raw,
            chains: raw,
            adaptor: None,
        }
    }

    /// Queues that write no chain: chains go through [`post_gathered`].
    pub(crate) fn gathered(queues: Box<dyn QpQueues>) -> Self {
        // SAFETY: `Box::into_raw` never returns null.
        let vendor = unsafe { NonNull::new_unchecked(Box::into_raw(queues)) };
        // SAFETY: as above.
        let adaptor = unsafe { NonNull::new_unchecked(Box::into_raw(Box::new(Gathered(vendor)))) };
        Self {
            vendor,
            chains: adaptor,
            adaptor: Some(adaptor),
        }
    }

    /// The queues, through the vendor contract.
    #[inline(always)]
    pub(crate) fn vendor(&mut self) -> &mut dyn QpQueues {
        // SAFETY: the live object this owns; `&mut self` lends one view at a time.
        unsafe { self.vendor.as_mut() }
    }

    /// The queues, through the front-end interface.
    #[inline(always)]
    pub(crate) fn chains(&mut self) -> &mut dyn ChainQueues {
        // SAFETY: as in `vendor`: the object or the adaptor this owns.
        unsafe { self.chains.as_mut() }
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        // SAFETY: both came from `Box::into_raw` in the constructors and are freed only here;
        // the adaptor, which points at the queues, goes first.
        unsafe {
            if let Some(adaptor) = self.adaptor {
                drop(Box::from_raw(adaptor.as_ptr()));
            }
            drop(Box::from_raw(self.vendor.as_ptr()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::{CRdmaArm, CSendArm, CSendWr};
    use crate::provider::KernelCall;
    use crate::wr::{RecvWr, SendFlags, WrOpcode};

    /// A signaled send with no buffers, in libibverbs' layout.
    fn send() -> CSendWr {
        CSendWr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: WrOpcode::SEND.0,
            send_flags: SendFlags::SIGNALED.bits(),
            imm_data: 0,
            wr: CSendArm::rdma(CRdmaArm {
                remote_addr: 0,
                rkey: 0,
            }),
        }
    }

    /// Sends of a connected QP are read in place: the slow path is never taken.
    unsafe fn never(_: NonNull<CSendWr>, _: QpType) -> Option<SendWr<'static>> {
        unreachable!("sends are read in place")
    }

    /// Records the `wr_id`s `post_send` takes, per call; refuses one of them as a full queue.
    /// Its own chains (as a provider with a writer of its own) record one call of `u64::MAX`.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<Vec<u64>>,
        full_at: Option<u64>,
    }

    // SAFETY: no kernel data; nothing is written anywhere.
    unsafe impl QpQueues for Recorder {
        unsafe fn post_send(&mut self, wrs: SendList<'_, '_>) -> Result<()> {
            let mut call = Vec::new();
            let mut result = Ok(());
            for (index, wr) in wrs.iter(QpType::Rc).enumerate() {
                let reason = match wr {
                    Ok(wr) if Some(wr.wr_id) != self.full_at => {
                        call.push(wr.wr_id);
                        continue;
                    }
                    Ok(_) => WrReject::QueueFull,
                    Err(reason) => reason,
                };
                result = Err(Error::WorkRequest {
                    verb: "post_send",
                    index,
                    reason,
                });
                break;
            }
            self.calls.push(call);
            result
        }

        unsafe fn post_recv(&mut self, _: &[RecvWr<'_>]) -> Result<()> {
            unreachable!("sends only")
        }

        fn send_room(&mut self) -> u32 {
            7
        }

        fn modify(&mut self, _: Option<QpState>, _: KernelCall<'_, ()>) -> Result<()> {
            unreachable!("sends only")
        }

        fn destroyed(&mut self) {}
    }

    impl ChainQueues for Recorder {
        unsafe fn post_send_chain(&mut self, _: SendChain<'_>, _: QpType, _: ContextId, _: QpState) -> Result<()> {
            self.calls.push(vec![u64::MAX]);
            Ok(())
        }

        unsafe fn post_send_batch(&mut self, _: SendChain<'_>, _: QpType, _: ContextId, _: QpState) -> Result<()> {
            self.calls.push(vec![u64::MAX - 1]);
            Ok(())
        }
    }

    /// `chain` linked through one raw pointer to the array: a reference to an element taken
    /// after a link was made would invalidate it (Stacked Borrows).
    fn linked(chain: &mut [CSendWr]) -> SendChain<'_> {
        let base = chain.as_mut_ptr();
        for i in 1..chain.len() {
            // SAFETY: `i - 1` and `i` are elements of the array.
            unsafe { (*base.add(i - 1)).next = base.add(i) };
        }
        // SAFETY: the test's chain, live and unchanged while the chain borrows it.
        unsafe { SendChain::new(NonNull::new_unchecked(base), never) }
    }

    /// [`post_gathered`]: lists of 32, one `post_send` each, and errors indexed from the
    /// chain's first request, whether the provider refused a request, the core's transport
    /// rules did (the `SendList`) or the chain could not read it; nothing below RTS.
    #[test]
    fn gathered_chains_go_in_lists_and_count_from_the_first() {
        let post_in = |chain: &mut Vec<CSendWr>, full_at, state| {
            let mut qp = Recorder {
                calls: Vec::new(),
                full_at,
            };
            // SAFETY: the test's chain.
            let result = unsafe { post_gathered(&mut qp, linked(chain), QpType::Rc, ContextId(0), state) };
            let index = result.map_err(|e| match e {
                Error::WorkRequest { index, reason, .. } => (index, reason),
                e => panic!("{e}"),
            });
            (qp.calls.iter().map(Vec::len).collect::<Vec<_>>(), index)
        };
        let post = |chain: &mut Vec<CSendWr>, full_at| post_in(chain, full_at, QpState::Rts);
        let sends = || -> Vec<CSendWr> { (0..70).map(|i| CSendWr { wr_id: i, ..send() }).collect() };
        assert_eq!(post(&mut sends(), None), (vec![32, 32, 6], Ok(())));
        assert_eq!(
            post(&mut sends(), Some(40)),
            (vec![32, 8], Err((40, WrReject::QueueFull)))
        );
        let mut chain = sends();
        chain[50].num_sge = -1;
        assert_eq!(post(&mut chain, None), (vec![32, 18], Err((50, WrReject::Malformed))));
        let mut chain = sends();
        chain[64].num_sge = -1;
        assert_eq!(post(&mut chain, None), (vec![32, 32], Err((64, WrReject::Malformed))));
        let mut chain = sends();
        chain[45].opcode = WrOpcode::RDMA_READ.0;
        chain[45].send_flags |= SendFlags::INLINE.bits();
        assert_eq!(
            post(&mut chain, None),
            (vec![32, 13], Err((45, WrReject::OpcodeNotSupported)))
        );
        assert_eq!(
            post_in(&mut sends(), None, QpState::Init),
            (vec![], Err((0, WrReject::WrongState(QpState::Init)))),
            "below RTS"
        );
    }

    /// Both views reach the one object, in any order, and dropping `Queues` frees it (and the
    /// adaptor) once: queues with a chain writer of their own, and queues gathered.
    #[test]
    fn both_views_reach_one_object() {
        let mut chain = vec![CSendWr { wr_id: 3, ..send() }, CSendWr { wr_id: 4, ..send() }];
        let state = QpState::Rts;
        let mut own = Queues::new(Box::new(Recorder::default()));
        let mut gathered = Queues::gathered(Box::new(Recorder::default()));
        for q in [&mut own, &mut gathered] {
            assert_eq!(q.vendor().send_room(), 7);
            // SAFETY: the test's chain.
            unsafe {
                q.chains()
                    .post_send_chain(linked(&mut chain), QpType::Rc, ContextId(0), state)
                    .unwrap();
                q.chains()
                    .post_send_batch(linked(&mut chain), QpType::Rc, ContextId(0), state)
                    .unwrap();
                let one = SendWr::new(9, crate::wr::SendOp::Send, &[]);
                q.vendor().post_send(SendList::new(&[one])).unwrap();
            }
        }
        // Read back through the vendor view's object: the recorder's calls, in order.
        let calls = |q: &mut Queues| {
            // SAFETY: the test knows both hold a `Recorder`.
            unsafe { &*std::ptr::from_mut(q.vendor()).cast::<Recorder>() }
                .calls
                .clone()
        };
        assert_eq!(calls(&mut own), [vec![u64::MAX], vec![u64::MAX - 1], vec![9]]);
        assert_eq!(calls(&mut gathered), [vec![3, 4], vec![3, 4], vec![9]]);
    }
}
