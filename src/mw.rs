//! Memory windows: remote access to part of a memory region, granted and revoked by work
//! requests ([`crate::SendOp::BindMw`], [`crate::SendOp::LocalInv`],
//! [`crate::SendOp::SendWithInv`]) and enforced by the device.

use crate::error::Result;
use crate::mr::{AccessFlags, RemoteMr};
use crate::pd::{Pd, PdInner};
use crate::sys::abi::{self, AllocMw, AllocMwResp};
use crate::sys::ioctl::object;
use crate::wr::MwBind;
use std::sync::Arc;

const METHOD_MW_DESTROY: u16 = 0;

/// `enum ibv_mw_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MwType {
    /// Bound by a bind request on any QP of the PD; its rkey keeps its index and takes the
    /// key the bind gives it; it cannot be invalidated.
    Type1 = 1,
    /// Bound to one QP by a bind request, which gives it a new rkey; invalidated locally
    /// ([`crate::SendOp::LocalInv`]) or by the peer ([`crate::SendOp::SendWithInv`]).
    Type2 = 2,
}

impl MwType {
    /// The type of the verbs.h value, if it is one.
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::Type1),
            2 => Some(Self::Type2),
            _ => None,
        }
    }
}

/// A memory window. Dropping it deallocates it.
pub struct Mw {
    pd: Arc<PdInner>,
    handle: u32,
    rkey: u32,
    mw_type: MwType,
    /// Set once an explicit [`Mw::dealloc`] succeeded, so `Drop` does not repeat it.
    deallocated: bool,
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw")
            .field("handle", &self.handle)
            .field("rkey", &self.rkey)
            .field("type", &self.mw_type)
            .finish()
    }
}

impl Pd {
    /// Allocates a memory window of `mw_type` (ALLOC_MW). It grants nothing until bound.
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<Mw> {
        let ctx = &self.inner.ctx;
        let req = AllocMw {
            response: 0,
            pd_handle: self.inner.handle,
            mw_type: mw_type as u8,
            reserved: [0; 3],
        };
        let resp: AllocMwResp = ctx.write_cmd("ALLOC_MW", abi::cmd::ALLOC_MW, &req)?;
        Ok(Mw {
            pd: self.inner.clone(),
            handle: resp.mw_handle,
            rkey: resp.rkey,
            mw_type,
            deallocated: false,
        })
    }
}

impl Mw {
    /// The window's rkey as allocated, or as last set by [`Mw::set_rkey`].
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The kernel's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Its type.
    pub fn mw_type(&self) -> MwType {
        self.mw_type
    }

    /// The bind giving peers `access` to the `length` bytes at `addr` in `mr` (remotely
    /// writable memory: a window may grant writes, so its bytes are read by copies) under the rkey
    /// whose low 8 bits are `key`. The device checks the range and rights when it executes
    /// the request (a failure completes it with `MW_BIND_ERR`); once it completed
    /// successfully, record the new rkey with [`Mw::set_rkey`].
    pub fn bind(&self, mr: &RemoteMr, addr: u64, length: u64, access: AccessFlags, key: u8) -> MwBind {
        MwBind {
            mw_rkey: self.rkey,
            new_rkey: (self.rkey & !0xff) | u32::from(key),
            mr_lkey: mr.lkey(),
            addr,
            length,
            access: access.bits(),
        }
    }

    /// Records the rkey a completed bind gave the window.
    pub fn set_rkey(&mut self, rkey: u32) {
        self.rkey = rkey;
    }

    /// Deallocates the window now and reports the kernel's answer; on failure hands the
    /// window back, unchanged and usable, with the error.
    pub fn dealloc(mut self) -> std::result::Result<(), (Self, crate::Error)> {
        match dealloc_mw(&self.pd, self.handle) {
            Ok(()) => {
                self.deallocated = true;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }
}

fn dealloc_mw(pd: &PdInner, handle: u32) -> Result<()> {
    pd.ctx
        .destroy("DEALLOC_MW", object::MW, METHOD_MW_DESTROY, handle, &mut [])
}

impl Drop for Mw {
    fn drop(&mut self) {
        if !self.deallocated {
            let _ = dealloc_mw(&self.pd, self.handle);
        }
    }
}
