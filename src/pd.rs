//! Protection domains.

use crate::context::{Context, ContextInner};
use crate::error::Result;
use crate::sys::abi::{self, AllocPd, AllocPdResp};
use crate::sys::cmd;
use crate::sys::ioctl::object;
use crate::wr::ContextId;
use std::sync::Arc;

const METHOD_PD_DESTROY: u16 = 0;

pub(crate) struct PdInner {
    pub(crate) ctx: Arc<ContextInner>,
    pub(crate) handle: u32,
}

impl PdInner {
    /// The context the PD, and everything made on it, belongs to.
    #[inline]
    pub(crate) fn context_id(&self) -> ContextId {
        ContextId(Arc::as_ptr(&self.ctx) as usize)
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
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
            }),
        })
    }

    /// The kernel's handle.
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }
}
