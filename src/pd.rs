//! Protection domains.

use crate::context::{Context, ContextInner};
use crate::error::Result;
use crate::sys::abi::{self, AllocPd, AllocPdResp};
use crate::sys::cmd;
use crate::sys::ioctl::object;
use crate::sys::mapping::Mapping;
use crate::wr::ContextId;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

const METHOD_PD_DESTROY: u16 = 0;
const METHOD_MR_DESTROY: u16 = 1;

pub(crate) struct PdInner {
    pub(crate) ctx: Arc<ContextInner>,
    pub(crate) handle: u32,
    /// Where the kernel's DEREG_MR waits for responders
    /// (`ProviderContext::dereg_waits_for_responders`): the PD's QPs, and the regions dropped
    /// while some of them might still hold one.
    responders: Mutex<Responders>,
}

/// The QPs of a PD that may hold a region in their responder, and the regions waiting for them.
#[derive(Default)]
struct Responders {
    /// The next QP's number here.
    next: u64,
    /// The QPs not yet destroyed.
    live: QpSet,
    parked: Vec<ParkedMr>,
}

/// A region dropped while QPs of its PD might still hold it: deregistered once each of
/// `waiting` is destroyed or reset.
struct ParkedMr {
    handle: u32,
    owned: Option<Mapping>,
    waiting: QpSet,
}

/// A set of QP numbers that holds its first member in place: most PDs have one QP at a time,
/// and creating one then allocates nothing here.
#[derive(Clone, Default)]
struct QpSet {
    one: Option<u64>,
    more: BTreeSet<u64>,
}

impl QpSet {
    fn insert(&mut self, qp: u64) {
        if self.one.is_none() {
            self.one = Some(qp);
        } else {
            self.more.insert(qp);
        }
    }

    fn remove(&mut self, qp: u64) {
        if self.one == Some(qp) {
            self.one = None;
        } else {
            self.more.remove(&qp);
        }
    }

    fn is_empty(&self) -> bool {
        self.one.is_none() && self.more.is_empty()
    }
}

impl PdInner {
    /// Counts a new QP of the PD; the returned number names it to [`PdInner::qp_released`].
    pub(crate) fn qp_created(&self) -> u64 {
        let mut r = self.responders.lock().unwrap_or_else(|e| e.into_inner());
        let qp = r.next;
        r.next += 1;
        r.live.insert(qp);
        qp
    }

    /// QP `qp` no longer holds any region in its responder: it was destroyed (and leaves the
    /// PD) or reset. The regions that waited only for it, and those before it, are
    /// deregistered now.
    pub(crate) fn qp_released(&self, qp: u64, destroyed: bool) {
        let ready: Vec<ParkedMr> = {
            let mut r = self.responders.lock().unwrap_or_else(|e| e.into_inner());
            if destroyed {
                r.live.remove(qp);
            }
            if r.parked.is_empty() {
                return;
            }
            for p in &mut r.parked {
                p.waiting.remove(qp);
            }
            let (ready, waiting) = std::mem::take(&mut r.parked)
                .into_iter()
                .partition(|p| p.waiting.is_empty());
            r.parked = waiting;
            ready
        };
        for p in ready {
            self.dereg_mr(p.handle, p.owned);
        }
    }

    /// Keeps a dropped region peers can access until every QP of the PD alive now was
    /// destroyed or reset; `Err` gives `owned` back when none is alive (deregister it now).
    pub(crate) fn park_mr(&self, handle: u32, owned: Option<Mapping>) -> std::result::Result<(), Option<Mapping>> {
        let mut r = self.responders.lock().unwrap_or_else(|e| e.into_inner());
        if r.live.is_empty() {
            return Err(owned);
        }
        let waiting = r.live.clone();
        r.parked.push(ParkedMr { handle, owned, waiting });
        Ok(())
    }

    /// DEREG_MR, then the region's own mapping unmapped; the mapping is leaked if the kernel
    /// refused (the device may still reach the bytes through the region's keys).
    pub(crate) fn dereg_mr(&self, handle: u32, owned: Option<Mapping>) {
        let gone = self
            .ctx
            .destroy("DEREG_MR", object::MR, METHOD_MR_DESTROY, handle, &mut [])
            .is_ok();
        if !gone {
            std::mem::forget(owned);
        }
    }

    /// The context the PD, and everything made on it, belongs to.
    #[inline]
    pub(crate) fn context_id(&self) -> ContextId {
        ContextId(Arc::as_ptr(&self.ctx) as usize)
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // No QP is left (each holds this `Arc`), so no region waits any more.
        let parked = std::mem::take(&mut self.responders.get_mut().unwrap_or_else(|e| e.into_inner()).parked);
        for p in parked {
            self.dereg_mr(p.handle, p.owned);
        }
        // Nothing can still use the PD: every MR, QP and AH holds this `Arc`.
        let _ = self
            .ctx
            .destroy("DESTROY_PD", object::PD, METHOD_PD_DESTROY, self.handle, &mut []);
    }
}

/// A protection domain. Cheap to clone; the kernel object lives while any clone, MR or QP does.
#[derive(Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd").field("handle", &self.inner.handle).finish()
    }
}

impl Context {
    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd> {
        Pd::new(self)
    }
}

impl Pd {
    fn new(ctx: &Context) -> Result<Self> {
        let inner = &ctx.inner;
        inner.check_owner("ALLOC_PD")?;
        let mut resp = AllocPdResp::default();
        inner.provider.alloc_pd(&mut |drv_in, drv_out| {
            resp = cmd::execute_plain(
                inner.fd(),
                "ALLOC_PD",
                abi::cmd::ALLOC_PD,
                &AllocPd::default(),
                drv_in,
                drv_out,
            )?;
            Ok(())
        })?;
        Ok(Self {
            inner: Arc::new(PdInner {
                ctx: ctx.inner.clone(),
                handle: resp.pd_handle,
                responders: Mutex::default(),
            }),
        })
    }

    /// The kernel's handle.
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }
}

#[cfg(test)]
mod tests {
    use super::QpSet;

    #[test]
    fn a_qp_set_holds_its_members_in_place_or_not() {
        let mut s = QpSet::default();
        assert!(s.is_empty());
        s.insert(3);
        s.insert(5);
        s.insert(7);
        let copy = s.clone();
        s.remove(5);
        s.remove(3);
        assert!(!s.is_empty(), "7 is still in");
        s.remove(9);
        s.remove(7);
        assert!(s.is_empty());
        // The first slot is taken again; the others stay where they were.
        s.insert(11);
        s.remove(11);
        assert!(s.is_empty());
        let mut c = copy;
        for qp in [7, 3, 5] {
            assert!(!c.is_empty());
            c.remove(qp);
        }
        assert!(c.is_empty());
    }
}
