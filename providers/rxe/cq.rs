//! rxe completion queues: the kernel writes `struct ib_uverbs_wc` (the first 48 bytes of
//! each slot), which is byte-for-byte a [`WorkCompletion`].

use super::abi::MmInfo;
use super::queue::Consumer;
use super::RxeContext;
use crate::error::{Result, Verb};
use crate::provider::{CqCreated, CqRing, KernelCall};
use crate::wc::WorkCompletion;
use zerocopy::IntoBytes;

pub(super) fn create(ctx: &RxeContext, _cqe: u32, kernel: KernelCall<'_, CqCreated>) -> Result<Box<dyn CqRing>> {
    let mut mi = MmInfo::default();
    kernel(&[], mi.as_mut_bytes())?;
    let ring = map_ring(ctx, &mi, "CREATE_CQ")?;
    Ok(Box::new(RxeCq { ring, ctx: ctx.clone() }))
}

fn map_ring(ctx: &RxeContext, mi: &MmInfo, verb: Verb) -> Result<Consumer> {
    Ok(Consumer::new(ctx.map(mi, verb, size_of::<WorkCompletion>())?))
}

struct RxeCq {
    ring: Consumer,
    ctx: RxeContext,
}

impl RxeCq {
    fn slot(&self, i: usize) -> &WorkCompletion {
        // SAFETY: callers pass `i` below the ready count: the kernel finished writing the slot
        // before its Release store, and leaves it alone until we release it. The slot is
        // 64-byte aligned, at least 48 bytes (checked at map time), and every bit pattern is a
        // valid `WorkCompletion`. The borrow is tied to `&self`, and releasing needs `&mut`.
        unsafe { self.ring.entry(i as u32).cast::<WorkCompletion>().as_ref() }
    }
}

impl CqRing for RxeCq {
    #[inline]
    fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
        let n = (self.ring.ready() as usize).min(wc.len());
        for (i, out) in wc[..n].iter_mut().enumerate() {
            *out = *self.slot(i);
        }
        if n > 0 {
            self.ring.release(n as u32);
        }
        n
    }

    fn ready(&mut self) -> usize {
        self.ring.ready() as usize
    }

    fn entry(&self, i: usize) -> &WorkCompletion {
        self.slot(i)
    }

    fn consume(&mut self, n: usize) {
        self.ring.release(n as u32);
    }

    fn resize(&mut self, kernel: KernelCall<'_, u32>) -> Result<()> {
        let mut mi = MmInfo::default();
        kernel(&[], mi.as_mut_bytes())?;
        // The kernel copied the queued completions to the start of the new ring; the old
        // mapping goes when `ring` is replaced.
        self.ring = map_ring(&self.ctx, &mi, "RESIZE_CQ")?;
        Ok(())
    }
}
