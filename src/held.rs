//! The buffers one of a QP's queues holds for the safe posts (`crate::owned`), oldest
//! first, with the ids of their requests: ids grow by one with every post, within runs of
//! values no request in the process had before ([`blocks`]), so no two requests ever share
//! one. An SRQ's are in [`srq`].

mod blocks;
mod srq;

pub(crate) use srq::{SrqHeld, SrqMembers};

use crate::error::{Error, Result, WrReject};
use crate::mr::Buf;
use crate::wc::{WcOpcode, WorkQueue};
use crate::wr::{SendFlags, SendOp, SendWr, Sge};
use blocks::BLOCKS;
use std::alloc::Layout;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr::NonNull;

/// Set in every id given to a request here; a raw post must not use such `wr_id`s in a
/// process that uses the safe posts (see `Qp::post_send`).
const SAFE_ID: u64 = 1 << 63;
/// Set in the ids of receive requests.
const RECV_ID: u64 = 1 << 62;
/// What `claim` would name if its slot were empty, which it never is.
static EMPTY_SGE: Sge = Sge {
    addr: 0,
    length: 0,
    lkey: 0,
};

/// The buffers one of a QP's queues holds, oldest first. The ids of the requests it counts run
/// without a gap from `oldest` to `next`, so request `id` sits in slot `id & mask`: a slot is
/// empty for a request that holds no buffer (an inline send). A new run of ids starts only
/// while nothing is held, which keeps the ids counted gapless.
pub(crate) struct Held {
    /// The buffer each request holds (none for an inline send, or once released). A power
    /// of two long, at least 1 (so `id & mask` is always an index). In its QP's block
    /// ([`QpHeld`]), which drops the slots and frees the memory after the `Held`.
    slots: &'static mut [Option<Buf>],
    /// The operation of each slot's request, as posted (send queues only: a receive queue's
    /// are all receives), kept after the request is released until a later request takes the
    /// slot. As long as `slots`, beside it rather than in it: a post indexes both with the
    /// same scaled index, no multiplication. In the same block.
    ops: &'static mut [WcOpcode],
    /// `slots.len() - 1`.
    mask: usize,
    ids: Ids,
    /// The request array of [`Held::post_list`] (none for a receive queue).
    list: Prepared,
}

/// The most requests [`Held::post_list`] hands the provider at once.
pub(crate) const LIST: usize = 32;

/// The request array [`Held::post_list`] posts from, kept with the queue so that it is filled
/// from a template once, not for every call: while the operation and flags stay those of the
/// last list, a post writes only each request's id and SGE.
struct Prepared {
    /// [`LIST`] entries (or none). Each is an initialised request of `filled`'s operation and
    /// flags, no UD destination, except that its SGE may name a buffer given back since (never
    /// read: a post writes the SGEs of the entries it hands on). `MaybeUninit` asserts nothing
    /// about those stale SGEs; the lifetime is only what the entries are stored as.
    /// In its QP's block, as the slots.
    wrs: &'static mut [MaybeUninit<SendWr<'static>>],
    /// The operation and flags every entry holds, once filled.
    filled: Option<(SendOp, SendFlags)>,
}

impl Prepared {
    fn new(wrs: &'static mut [MaybeUninit<SendWr<'static>>]) -> Self {
        Self { wrs, filled: None }
    }

    /// The array, every entry `op` with `flags` (filled again if the last list's differed).
    #[inline]
    fn prepared(&mut self, op: SendOp, flags: SendFlags) -> &mut [MaybeUninit<SendWr<'static>>] {
        if self.filled != Some((op, flags)) {
            self.fill(op, flags);
        }
        self.wrs
    }

    #[cold]
    fn fill(&mut self, op: SendOp, flags: SendFlags) {
        for wr in self.wrs.iter_mut() {
            wr.write(SendWr {
                wr_id: 0,
                op,
                sg_list: &[],
                flags,
                ud: None,
            });
        }
        self.filled = Some((op, flags));
    }
}

/// The ids of the requests a [`Held`] counts (apart from its slots, so that a list can borrow
/// the slots while the ids move on).
struct Ids {
    /// How many requests it may count at once (0 for a QP on an SRQ; else the slots' length).
    depth: u64,
    /// The next request's id; the oldest one still counted (`next` when none is).
    next: u64,
    oldest: u64,
    /// The end of the run `next` comes from.
    end: u64,
    /// Requests below this id may be taken without the slow path: the smaller of the end of
    /// the free slots and of the run, or `next` while the queue is closed.
    limit: u64,
    /// Whether the QP's state lets this queue take requests (kept by the QP).
    open: bool,
    /// [`SAFE_ID`], and [`RECV_ID`] for a receive queue.
    kind: u64,
}

/// Why [`Held::post_list`] stopped before the end of its buffers.
pub(crate) enum ListStop {
    /// No room for the next request, or the queue is closed (as [`Held::next_id`]).
    Room(WrReject),
    /// The post of a list failed with this error.
    Post(Error),
}

/// How many slots a queue of `depth` requests has: `depth` rounded up to a power of two, at
/// least 1.
fn slots_for(depth: u32) -> usize {
    depth.max(1).next_power_of_two() as usize
}

/// How long a queue's list is: none for a receive queue or a QP on an SRQ; never longer than
/// the queue has room for.
fn list_for(depth: u32, recv: bool) -> usize {
    if recv || depth == 0 {
        0
    } else {
        LIST.min(slots_for(depth))
    }
}

impl Held {
    /// Room for `depth` requests (rounded up to a power of two: the length of `slots`, whose
    /// slots are empty), with `wrs` as its list (as [`list_for`] says); closed.
    fn new(
        depth: u32,
        recv: bool,
        slots: &'static mut [Option<Buf>],
        ops: &'static mut [WcOpcode],
        wrs: &'static mut [MaybeUninit<SendWr<'static>>],
    ) -> Self {
        let cap = slots.len();
        // What the unchecked indexing of `claim`, `claim_send` and `post_list` relies on: a
        // power-of-two ring, the operations as long as the buffers. Checked once per queue.
        assert!(cap.is_power_of_two() && cap == slots_for(depth) && ops.len() == cap);
        debug_assert_eq!(wrs.len(), list_for(depth, recv));
        Self {
            slots,
            ops,
            mask: cap - 1,
            list: Prepared::new(wrs),
            ids: Ids {
                depth: if depth == 0 { 0 } else { cap as u64 },
                next: 0,
                oldest: 0,
                end: 0,
                limit: 0,
                open: false,
                kind: SAFE_ID | if recv { RECV_ID } else { 0 },
            },
        }
    }

    /// Opens or closes the queue (the QP's state allows posting to it, or not).
    pub(crate) fn set_open(&mut self, open: bool) {
        self.ids.open = open;
        self.ids.update_limit();
    }

    /// The id the next request gets, if the queue is open and has room for it; the post then
    /// `claim`s the slot for its buffer. `QueueFull` when closed too: the QP then reports its
    /// state instead.
    #[inline]
    pub(crate) fn next_id(&mut self) -> std::result::Result<u64, WrReject> {
        if self.ids.next >= self.ids.limit {
            self.ids.make_room()?;
        }
        Ok(self.ids.next)
    }

    /// Puts `buf` in the slot of the request `next_id` gave out and returns its SGE for the
    /// request to name (of its whole capacity if `whole`: a receive's); then `commit` once
    /// the provider took the request, or `unclaim`.
    #[inline]
    #[allow(unsafe_code)] // indexes the ring unchecked
    pub(crate) fn claim(&mut self, buf: Buf, whole: bool) -> &Sge {
        let at = self.ids.next as usize & self.mask;
        // SAFETY: `mask` is `slots.len() - 1` and the length a power of two (`new`), so `at`
        // is below the length.
        let slot = unsafe { self.slots.get_unchecked_mut(at) };
        // Free: `next_id` saw room, so the slot's last request (`depth` ago) was released.
        std::mem::forget(slot.replace(buf));
        match &*slot {
            Some(buf) if whole => buf.whole_sge(),
            Some(buf) => buf.sge(),
            // Never: just filled (and compiled away).
            None => &EMPTY_SGE,
        }
    }

    /// [`Held::claim`] for a send queue's request of `op`: the slot records the operation
    /// too ([`Held::op_of`]), with the slot's index computed once for both.
    #[inline]
    #[allow(unsafe_code)] // indexes the ring unchecked
    pub(crate) fn claim_send(&mut self, buf: Buf, op: &SendOp) -> &Sge {
        let at = self.ids.next as usize & self.mask;
        if let Some(op) = op.wc_opcode() {
            // SAFETY: as in `claim`: `ops` is as long as `slots`.
            unsafe { *self.ops.get_unchecked_mut(at) = op };
        }
        // SAFETY: as in `claim`.
        let slot = unsafe { self.slots.get_unchecked_mut(at) };
        // Free, as in `claim`.
        std::mem::forget(slot.replace(buf));
        sge_of(slot)
    }

    /// Records `op` as the operation of the request `next_id` just gave out (before
    /// `commit`). Nothing on a receive queue.
    #[inline]
    pub(crate) fn note_op(&mut self, op: &SendOp) {
        let at = self.ids.next as usize & self.mask;
        if let (Some(slot), Some(op)) = (self.ops.get_mut(at), op.wc_opcode()) {
            *slot = op;
        }
    }

    /// The operation request `id` was posted with, if this queue counts it or has just
    /// released it (until a later request takes its slot): a receive on a receive queue.
    pub(crate) fn op_of(&self, id: u64) -> Option<WcOpcode> {
        if !self.owns(id) || id >= self.ids.next || self.ids.next - id > self.slots.len() as u64 {
            return None;
        }
        if self.is_recv() {
            return Some(WcOpcode::RECV);
        }
        self.ops.get(id as usize & self.mask).copied()
    }

    /// Counts the claimed request: the provider took it.
    #[inline]
    pub(crate) fn commit(&mut self) {
        self.ids.next += 1;
    }

    /// The claimed buffer, back: the provider refused the request.
    pub(crate) fn unclaim(&mut self) -> Buf {
        let at = self.ids.next as usize & self.mask;
        self.slots[at].take().expect("claimed just before")
    }

    /// Posts the buffers of `bufs`, in order, in lists of at most [`LIST`] requests, each
    /// request `op` with `flags`, the next id and its buffer's SGE, the buffer in the request's
    /// slot; `post` gets each list. Returns how many requests the lists `post` took whole
    /// posted, and why it stopped if it did before the end of `bufs`: then the buffers not
    /// posted are back in `bufs`, in order (those of the last list's requests from the
    /// rejected one on, [`Error::WorkRequest`]'s index, then those not reached), and the QP
    /// holds the rest of that list as posted (after any other error the provider may have
    /// queued it all). No allocation: `bufs` keeps its capacity.
    ///
    /// Each request costs a load of its buffer, a store into its slot and one of its
    /// operation, and two into the kept array (its id and its SGE).
    #[allow(unsafe_code)] // moves the buffers out of `bufs` by hand, slots indexed unchecked
    pub(crate) fn post_list(
        &mut self,
        bufs: &mut Vec<Buf>,
        op: SendOp,
        flags: SendFlags,
        mut post: impl FnMut(&[SendWr<'_>]) -> Result<()>,
    ) -> (usize, Option<ListStop>) {
        let all = bufs.len();
        if all == 0 {
            return (0, None);
        }
        let Self {
            slots,
            ops,
            mask,
            ids,
            list,
        } = self;
        // A copy: the stores into the ring below would otherwise make the compiler load it
        // again for every request.
        let mask = *mask;
        let wrs = list.prepared(op, flags);
        let wc_op = op.wc_opcode().unwrap_or_default();
        // Every slot is reached through these pointers until the last list is posted (within
        // the ring: masked, or in the two runs `fill` writes, up to the ring's end and on from
        // its start), and no reference to the ring is made meanwhile.
        let (ring, ring_ops) = (slots.as_mut_ptr(), ops.as_mut_ptr());
        // The buffers are moved out of `bufs` as they are posted, its length 0 meanwhile (a
        // panic in `post` would leak the rest, never free one twice); those not posted are
        // moved back to its front before it returns.
        // SAFETY: 0 is no more than the capacity, and nothing is dropped.
        unsafe { bufs.set_len(0) };
        let from = bufs.as_mut_ptr();
        // Buffers moved out of `bufs` (read) and held by the posted requests.
        let (mut read, mut posted) = (0, 0);
        let mut stop = None;
        while read < all {
            // `room` free slots follow `next` (nothing is released during the call).
            let room = match ids.room() {
                Ok(room) => room,
                Err(reason) => {
                    stop = Some(ListStop::Room(reason));
                    break;
                }
            };
            let n = room.min(wrs.len()).min(all - read);
            if n == 0 {
                // No array (no send queue): `room` rules that out.
                stop = Some(ListStop::Room(WrReject::QueueFull));
                break;
            }
            let first = ids.next;
            // The list's slots run from `first`'s up to the ring's end, then (once it wraps)
            // from its start: two runs of consecutive slots, each filled without masking.
            let at = first as usize & mask;
            let head = n.min(mask + 1 - at);
            // SAFETY: `read + n` is at most `all`, the length `bufs` had: each buffer is read
            // once, so moved. `at + head` is at most the ring's length (`mask + 1`, the length
            // of `ops` too), and so is `n - head`; those slots are free (`room` counted them:
            // their last requests were released). The array's first `n` entries are
            // initialised (`prepared`, `n` at most its length).
            unsafe {
                let entries = wrs.as_mut_ptr().cast::<SendWr<'static>>();
                fill(
                    from.add(read),
                    ring.add(at),
                    ring_ops.add(at),
                    entries,
                    first,
                    head,
                    wc_op,
                );
                fill(
                    from.add(read + head),
                    ring,
                    ring_ops,
                    entries.add(head),
                    first + head as u64,
                    n - head,
                    wc_op,
                );
            }
            read += n;
            // SAFETY: the first `n` entries were just given their ids and the SGEs of the
            // buffers in their slots (alive until `post` returns, and longer); the rest of each
            // is the template `prepared` wrote. `MaybeUninit<T>` has `T`'s layout.
            let ready = unsafe { std::slice::from_raw_parts(wrs.as_ptr().cast::<SendWr<'_>>(), n) };
            if let Err(e) = without_unwinding(|| post(ready)) {
                // Only a work-request rejection says what was not queued.
                let taken = match e {
                    Error::WorkRequest { index, .. } => index.min(n),
                    _ => n,
                };
                let mut back = 0;
                for k in taken..n {
                    let at = (first as usize).wrapping_add(k) & mask;
                    // SAFETY: in the ring, as above; the provider did not queue this request,
                    // so nothing else names its buffer. It goes to the front of `bufs`, below
                    // `read - n + k`, where the buffers not read yet (from `read` on) are not.
                    unsafe {
                        if let Some(buf) = (*ring.add(at)).take() {
                            from.add(back).write(buf);
                            back += 1;
                        }
                    }
                }
                ids.next += taken as u64;
                stop = Some(ListStop::Post(e));
                // SAFETY: `back` buffers are at the front; the unread ones follow them.
                unsafe { give_back(bufs, back, read, all) };
                return (posted, stop);
            }
            ids.next += n as u64;
            posted += n;
        }
        // SAFETY: no buffer at the front; those from `read` on were not read.
        unsafe { give_back(bufs, 0, read, all) };
        (posted, stop)
    }

    /// The id for a request that holds no buffer (an inline send): counted like the others,
    /// its slot left empty. Called once the request is known to be well formed (a gap in
    /// the ids would do no harm, but holds nothing).
    #[cfg(test)]
    pub(crate) fn bare_id(&mut self) -> std::result::Result<u64, WrReject> {
        let id = self.next_id()?;
        self.ids.next += 1;
        Ok(id)
    }

    /// [`Held::bare_id`] for a request of `op`, which [`Held::op_of`] then tells.
    #[inline]
    pub(crate) fn bare_id_for(&mut self, op: &SendOp) -> std::result::Result<u64, WrReject> {
        let id = self.next_id()?;
        self.note_op(op);
        self.ids.next += 1;
        Ok(id)
    }

    /// How many requests it still counts (holding a buffer or not).
    pub(crate) fn len(&self) -> usize {
        (self.ids.next - self.ids.oldest) as usize
    }

    /// Whether this is a receive queue's.
    pub(crate) fn is_recv(&self) -> bool {
        self.ids.kind & RECV_ID != 0
    }

    /// Whether `id` is one of this queue's (possibly already given back).
    pub(crate) fn owns(&self, id: u64) -> bool {
        id & (SAFE_ID | RECV_ID) == self.ids.kind
    }

    /// The oldest held buffer, with its request's id, if that request is `id` or an earlier
    /// one; requests before it that hold no buffer are let go on the way. An `id` this queue
    /// has not given out releases nothing.
    pub(crate) fn release(&mut self, id: u64) -> Option<(u64, Buf)> {
        let ids = &mut self.ids;
        if id >= ids.next {
            // Not given out by this queue: another queue's (ids are not ordered by queue).
            return None;
        }
        while ids.oldest < ids.next && ids.oldest <= id {
            let at = ids.oldest as usize & self.mask;
            let held = ids.oldest;
            ids.oldest += 1;
            ids.update_limit();
            if let Some(buf) = self.slots[at].take() {
                return Some((held, buf));
            }
        }
        None
    }
}

/// A QP's two [`Held`]s, whose slots and the send queue's list share one allocation: a QP
/// costs one allocation here, not three. The `Held`s themselves sit in the `Qp` (a post reaches
/// its queue's ids and ring without loading a pointer first); the block holds the send slots,
/// the receive slots and the list's requests.
pub(crate) struct QpHeld {
    /// Dropped by hand, before the block they point into is freed.
    pub(crate) sends: ManuallyDrop<Held>,
    pub(crate) recvs: ManuallyDrop<Held>,
    /// The block.
    block: NonNull<u8>,
    /// The block's layout, to free it.
    layout: Layout,
    /// How many slots start the block (both queues'), to drop them from the block itself,
    /// whatever the `Held`s point at by then.
    slots: usize,
}

// SAFETY: `QpHeld` owns its block as a `Box` of its slots and requests would, and the `Held`s
// (buffers and plain values, the slices their own) are `Send` and `Sync`; nothing else points
// into the block, and `&self` lends only `&Held`s.
#[allow(unsafe_code)]
unsafe impl Send for QpHeld {}
// SAFETY: as for `Send`.
#[allow(unsafe_code)]
unsafe impl Sync for QpHeld {}
const _: () = {
    const fn held_is_send_and_sync<T: Send + Sync>() {}
    held_is_send_and_sync::<Held>();
};

impl QpHeld {
    /// Send and receive queues of `send` and `recv` requests (0 for a QP on an SRQ), closed.
    /// Aborts the process if memory runs out, as `Box` does.
    #[allow(unsafe_code)] // one allocation carved into the two queues' rings and the list
    pub(crate) fn new(send: u32, recv: u32) -> Self {
        let (scap, rcap, list) = (slots_for(send), slots_for(recv), list_for(send, false));
        let n = scap + rcap;
        let layout = (|| {
            let l = Layout::array::<Option<Buf>>(n).ok()?;
            let (l, ops_at) = l.extend(Layout::array::<WcOpcode>(n).ok()?).ok()?;
            let (l, wrs_at) = l
                .extend(Layout::array::<MaybeUninit<SendWr<'static>>>(list).ok()?)
                .ok()?;
            Some((l.pad_to_align(), ops_at, wrs_at))
        })();
        // Queue depths are `u32`s: their slots always fit the address space.
        let Some((layout, ops_at, wrs_at)) = layout else {
            std::alloc::handle_alloc_error(Layout::new::<Option<Buf>>())
        };
        // SAFETY: `layout` has a non-zero size (it holds at least two slots).
        let base = unsafe { std::alloc::alloc(layout) };
        let Some(block) = NonNull::new(base) else {
            std::alloc::handle_alloc_error(layout)
        };
        // SAFETY: the slots (`n`, from the block's start), their operations (`n`) and the
        // list's requests (`list`) lie at the offsets the layout gave, inside the block and
        // aligned for their types, apart from each other. The slots and operations are
        // written before any reference to them is made; the requests are `MaybeUninit`. The references live as long as the block:
        // `Drop` frees it only after the `Held`s (which hold them) are dropped, and nothing
        // uses them after. They are never handed out beyond a borrow of the `Held`s, and the
        // crate never moves a `Held` out of its `QpHeld` (`mem::swap` of two QPs' `Held`s
        // would leave each pointing into the other's block); `Drop` takes the slots from the
        // block, not from the `Held`s.
        unsafe {
            let slots = base.cast::<Option<Buf>>();
            let ops = base.add(ops_at).cast::<WcOpcode>();
            for k in 0..n {
                slots.add(k).write(None);
                ops.add(k).write(WcOpcode::default());
            }
            let sends = std::slice::from_raw_parts_mut(slots, scap);
            let recvs = std::slice::from_raw_parts_mut(slots.add(scap), rcap);
            let send_ops = std::slice::from_raw_parts_mut(ops, scap);
            let recv_ops = std::slice::from_raw_parts_mut(ops.add(scap), rcap);
            let wrs = std::slice::from_raw_parts_mut(base.add(wrs_at).cast::<MaybeUninit<SendWr<'static>>>(), list);
            Self {
                sends: ManuallyDrop::new(Held::new(send, false, sends, send_ops, wrs)),
                recvs: ManuallyDrop::new(Held::new(recv, true, recvs, recv_ops, &mut [])),
                block,
                layout,
                slots: n,
            }
        }
    }
}

impl Drop for QpHeld {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: dropped once, here: the `Held`s (which only point at the slots and
        // requests, and are not used again), then the slots `new` wrote at the block's start
        // (the buffers they hold), then the memory, with the layout it was allocated with.
        // The operations are `Copy` and the requests `MaybeUninit`: nothing to drop.
        unsafe {
            ManuallyDrop::drop(&mut self.sends);
            ManuallyDrop::drop(&mut self.recvs);
            let slots = self.block.as_ptr().cast::<Option<Buf>>();
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(slots, self.slots));
            std::alloc::dealloc(self.block.as_ptr(), self.layout);
        }
    }
}

/// The queue a request of the safe posts with id `id` was posted to (an SRQ's receives
/// included); `None` for a raw post's id.
pub(crate) fn queue_of(id: u64) -> Option<WorkQueue> {
    match id & (SAFE_ID | RECV_ID) {
        x if x == SAFE_ID | RECV_ID => Some(WorkQueue::Recv),
        SAFE_ID => Some(WorkQueue::Send),
        _ => None,
    }
}

impl Drop for Held {
    /// Gives back the ids of the queue's run that no request had, for another queue.
    fn drop(&mut self) {
        BLOCKS.give_back_ids(self.ids.kind, self.ids.next, self.ids.end);
    }
}

/// Runs `post`, a provider's post of requests the queue counts once it returns, and aborts
/// the process if it unwinds: a provider that panicked after queuing requests would leave
/// their ids uncounted, for the next posts to give again, and a completion of one would then
/// give back another's buffer. Costs nothing unless it unwinds.
#[inline(always)]
pub(crate) fn without_unwinding<R>(post: impl FnOnce() -> R) -> R {
    struct Abort;
    impl Drop for Abort {
        fn drop(&mut self) {
            std::process::abort();
        }
    }
    let guard = Abort;
    let result = post();
    std::mem::forget(guard);
    result
}

/// Ends [`Held::post_list`]: `bufs` holds the `front` buffers at its start, then the buffers
/// at `read..all` (not read), which move down to follow them.
///
/// # Safety
/// `bufs` has length 0 and `all` initialised buffers' room; the first `front` slots hold
/// buffers, `front <= read <= all`, and those at `read..all` were never moved out.
#[allow(unsafe_code)]
unsafe fn give_back(bufs: &mut Vec<Buf>, front: usize, read: usize, all: usize) {
    let at = bufs.as_mut_ptr();
    // SAFETY: both ranges are within the `all` slots (the caller's contract), `copy` allows
    // them to overlap, and the length then counts exactly the buffers present.
    unsafe {
        std::ptr::copy(at.add(read), at.add(front), all - read);
        bufs.set_len(front + all - read);
    }
}

/// Moves `n` buffers from `from` into the slots from `slots` on, each with the operation `op`
/// (into `ops`), and gives the requests at `wrs` the ids from `first` on and the SGEs of those
/// buffers; the rest of each request stays as it is.
///
/// # Safety
/// `from` has `n` buffers, read once (moved); `slots` and `ops` have `n` consecutive free
/// places (writing over their `None` and `Copy` operation forgets nothing); `wrs` has `n`
/// initialised requests. The SGEs named are in the buffers' boxes, which stay put while the
/// slots hold them.
#[inline(always)]
#[allow(unsafe_code)]
unsafe fn fill(
    from: *const Buf,
    slots: *mut Option<Buf>,
    ops: *mut WcOpcode,
    wrs: *mut SendWr<'static>,
    first: u64,
    n: usize,
    op: WcOpcode,
) {
    for k in 0..n {
        // SAFETY: within the `n` places of each (the caller's contract).
        unsafe {
            let slot = slots.add(k);
            slot.write(Some(from.add(k).read()));
            // Read back before the stores below, which the compiler cannot tell apart from
            // the slot.
            let sge = sge_of(&*slot);
            ops.add(k).write(op);
            let wr = wrs.add(k);
            std::ptr::addr_of_mut!((*wr).wr_id).write(first + k as u64);
            std::ptr::addr_of_mut!((*wr).sg_list).write(std::slice::from_ref(sge));
        }
    }
}

/// The SGE of the buffer just put in `slot` (the one a request names).
#[inline]
fn sge_of(slot: &Option<Buf>) -> &Sge {
    match slot {
        Some(buf) => buf.sge(),
        // Never: just filled (and compiled away). An empty list would post nothing.
        None => &EMPTY_SGE,
    }
}

impl Ids {
    /// How many requests may be taken now (at least 1), or why none: `QueueFull` when closed
    /// too (the QP then reports its state instead).
    #[inline]
    fn room(&mut self) -> std::result::Result<usize, WrReject> {
        if self.next >= self.limit {
            self.make_room()?;
        }
        Ok(usize::try_from(self.limit - self.next).unwrap_or(usize::MAX))
    }

    /// Recomputes `limit`, drawing a new run of ids when the current one is used up and
    /// nothing is held; `QueueFull` when there is no room (or the queue is closed).
    #[cold]
    fn make_room(&mut self) -> std::result::Result<(), WrReject> {
        if self.open && self.depth > 0 && self.next == self.end && self.next == self.oldest {
            // None: every block of ids was used up, never in practice.
            let run = BLOCKS.draw().ok_or(WrReject::QueueFull)?;
            self.next = self.kind + run.start;
            self.oldest = self.next;
            self.end = self.kind + run.end;
        }
        self.update_limit();
        if self.next >= self.limit {
            return Err(WrReject::QueueFull);
        }
        Ok(())
    }

    fn update_limit(&mut self) {
        self.limit = if self.open {
            (self.oldest + self.depth).min(self.end)
        } else {
            self.next
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_run_gapless_and_a_completion_releases_everything_up_to_it() {
        let mut q = QpHeld::new(3, 0); // rounded up to 4
        let h = &mut q.sends;
        h.set_open(true);
        let ids: Vec<u64> = (0..4).map(|_| h.bare_id().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
        assert!(ids.iter().all(|&id| h.owns(id)) && !h.is_recv());
        assert_eq!(h.bare_id(), Err(WrReject::QueueFull), "four counted, room for four");
        assert_eq!(h.len(), 4);
        // A completion for the third request lets the first three go (they hold no buffer).
        assert!(h.release(ids[2]).is_none());
        assert_eq!(h.len(), 1);
        // An old id releases nothing more; ids of another queue are not this one's.
        assert!(h.release(ids[0]).is_none());
        assert_eq!(h.len(), 1);
        let q4 = QpHeld::new(0, 4);
        let recv = &q4.recvs;
        assert!(!recv.owns(ids[0]) && recv.is_recv());
        assert!(h.bare_id().unwrap() > ids[3]);
    }

    #[test]
    fn each_request_keeps_its_operation_until_its_slot_is_taken_again() {
        use crate::wr::Remote;
        let mut q = QpHeld::new(2, 0);
        let h = &mut q.sends;
        h.set_open(true);
        let write = SendOp::RdmaWrite(Remote { addr: 0, rkey: 1 });
        let a = h.bare_id_for(&write).unwrap();
        let b = h.bare_id_for(&SendOp::Send).unwrap();
        assert_eq!(
            (h.op_of(a), h.op_of(b)),
            (Some(WcOpcode::RDMA_WRITE), Some(WcOpcode::SEND))
        );
        assert_eq!(queue_of(a), Some(WorkQueue::Send));
        assert!(h.release(a).is_none());
        assert_eq!(
            h.op_of(a),
            Some(WcOpcode::RDMA_WRITE),
            "released, its slot not yet taken"
        );
        let add = SendOp::FetchAdd {
            remote: Remote { addr: 0, rkey: 1 },
            add: 1,
        };
        let c = h.bare_id_for(&add).unwrap();
        assert_eq!(
            (h.op_of(a), h.op_of(c)),
            (None, Some(WcOpcode::FETCH_ADD)),
            "slot taken"
        );
        assert_eq!(h.op_of(c + 1), None, "not given out");
        let mut q2 = QpHeld::new(0, 2);
        let recv = &mut q2.recvs;
        recv.set_open(true);
        let r = recv.bare_id().unwrap();
        assert_eq!(
            (recv.op_of(r), queue_of(r)),
            (Some(WcOpcode::RECV), Some(WorkQueue::Recv))
        );
        assert_eq!(queue_of(7), None, "a raw post's id");
    }

    #[test]
    fn one_block_holds_both_queues_and_the_list() {
        let q = QpHeld::new(5, 3);
        assert_eq!((q.sends.slots.len(), q.recvs.slots.len()), (8, 4));
        assert_eq!((q.sends.list.wrs.len(), q.recvs.list.wrs.len()), (8, 0));
        let big = QpHeld::new(1000, 0);
        assert_eq!(
            (big.sends.slots.len(), big.sends.list.wrs.len(), big.recvs.slots.len()),
            (1024, LIST, 1)
        );
        assert!(big.recvs.is_recv() && !big.sends.is_recv());
    }

    #[test]
    fn every_queue_draws_ids_no_other_queue_ever_had() {
        let (mut qa, mut qb) = (QpHeld::new(4, 0), QpHeld::new(4, 0));
        let (a, b) = (&mut qa.sends, &mut qb.sends);
        a.set_open(true);
        b.set_open(true);
        let (x, y) = (a.bare_id().unwrap(), b.bare_id().unwrap());
        assert_ne!(x >> blocks::BLOCK_BITS, y >> blocks::BLOCK_BITS, "different blocks");
        let mut qc = QpHeld::new(4, 0);
        let closed = &mut qc.sends;
        assert_eq!(closed.bare_id(), Err(WrReject::QueueFull), "closed: the QP's state");
        closed.set_open(true);
        let id = closed.bare_id().unwrap();
        closed.set_open(false);
        assert_eq!(closed.bare_id(), Err(WrReject::QueueFull), "closed again");
        closed.set_open(true);
        assert_eq!(closed.bare_id(), Ok(id + 1), "reopened: the ids go on without a gap");
        let mut qn = QpHeld::new(0, 0);
        let none = &mut qn.recvs;
        none.set_open(true);
        assert_eq!(none.bare_id(), Err(WrReject::QueueFull), "no slots (a QP on an SRQ)");
    }

    #[test]
    fn an_id_the_queue_did_not_give_out_releases_nothing() {
        let mut q = QpHeld::new(4, 0);
        let h = &mut q.sends;
        h.set_open(true);
        let first = h.bare_id().unwrap();
        let next = h.next_id().unwrap();
        // Another queue's ids are not ordered with this one's: larger ones release nothing.
        assert!(h.release(next).is_none() && h.release(next + (1 << 40)).is_none());
        assert_eq!(h.len(), 1, "still counted");
        assert!(h.release(first).is_none(), "no buffer, but let go");
        assert_eq!(h.len(), 0);
    }

    #[test]
    fn queues_that_come_and_go_leave_their_unused_ids_to_the_next() {
        let before = BLOCKS.drawn();
        let mut seen = std::collections::HashSet::new();
        // Under miri fewer queues, still more than the bound below.
        let queues = if cfg!(miri) { 150 } else { 20_000 };
        for _ in 0..queues {
            let mut q = QpHeld::new(0, 1);
            let h = &mut q.recvs;
            h.set_open(true);
            assert!(seen.insert(h.bare_id().unwrap()), "an id given twice");
        }
        // Each queue drew one run; without the runs given back that is a block per queue
        // (other tests running meanwhile draw a few).
        assert!(BLOCKS.drawn() - before < 100, "{} blocks", BLOCKS.drawn() - before);
    }

    /// Set for the child process of the test below.
    const CHILD: &str = "UVERBS_TEST_PANICKING_POST";

    /// A post that panics, in the child process of the test below (in any other run it
    /// does nothing).
    #[test]
    fn panicking_post() {
        if std::env::var_os(CHILD).is_some() {
            without_unwinding(|| panic!("a provider bug"));
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // runs the test binary again; miri cannot start processes
    fn a_panicking_post_aborts_the_process() {
        use std::os::unix::process::ExitStatusExt;
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "held::tests::panicking_post", "--test-threads=1"])
            .env(CHILD, "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(status.signal(), Some(libc::SIGABRT), "{status}");
        assert_eq!(without_unwinding(|| 7), 7, "returns what the post returned");
    }
}
