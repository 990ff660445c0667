//! rxe completion queues: the kernel writes `struct ib_uverbs_wc` (the first 48 bytes of
//! each slot), which is byte-for-byte a [`WorkCompletion`].

use super::abi::MmInfo;
use super::queue::Consumer;
use super::RxeContext;
use crate::error::Result;
use crate::provider::{CqCreated, CqRing, KernelCall};
use crate::wc::WorkCompletion;
use zerocopy::IntoBytes;

pub(super) fn create(
    ctx: &RxeContext,
    _cqe: u32,
    kernel: KernelCall<'_, CqCreated>,
) -> Result<Box<dyn CqRing>> {
    let mut mi = MmInfo::default();
    kernel(&[], mi.as_mut_bytes())?;
    let queue = ctx.map(&mi, "CREATE_CQ", size_of::<WorkCompletion>())?;
    Ok(Box::new(RxeCq {
        ring: Consumer::new(queue),
    }))
}

struct RxeCq {
    ring: Consumer,
}

impl CqRing for RxeCq {
    #[inline]
    fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
        let n = (self.ring.ready() as usize).min(wc.len());
        for (i, out) in wc[..n].iter_mut().enumerate() {
            let slot = self.ring.entry(i as u32).cast::<WorkCompletion>();
            // SAFETY: the slot is ready (counted by `ready`, so the kernel finished writing it
            // before its Release store), 64-byte aligned, at least 48 bytes (checked at map
            // time), and every bit pattern is a valid `WorkCompletion`.
            *out = unsafe { slot.read() };
        }
        if n > 0 {
            self.ring.release(n as u32);
        }
        n
    }
}
