//! uverbs_std_types_srq.c `UVERBS_METHOD_SRQ_CREATE`: its attributes, then the same SRQ
//! creation as the write command.

use super::super::srq::SrqRequest;
use super::{Bundle, Errno, Model};
use crate::abi::srqt;
use crate::mem::Memory;
use libc::{EINVAL, ENOENT};

impl Model {
    /// core/uverbs_std_types_srq.c:36: the sizes, limit, user handle and type; the CQ of an
    /// XRC or tag-matching SRQ (:67-72), the XRCD of an XRC one (:75-87: the model has no
    /// XRC domains, so naming one is ENOENT), the tag count of a tag-matching one (:88-94;
    /// absent is ENOENT), any other type EINVAL (:97); then the driver (the event fd was
    /// checked with the attributes). The
    /// outputs: max_wr, max_sge (:116-126), and the SRQ number only for XRC (:128-132).
    pub(super) fn ioctl_create_srq(&mut self, ctx: i32, b: &Bundle, mem: &dyn Memory) -> Result<(), Errno> {
        let max_sge = b.number(mem, 6)?.unwrap_or(0) as u32;
        let max_wr = b.number(mem, 5)?.unwrap_or(0) as u32;
        let user_handle = b.number(mem, 4)?.unwrap_or(0);
        let srq_type = u32::try_from(b.number(mem, 9)?.unwrap_or(0)).map_err(|_| EINVAL)?;
        let pd = b.handle(1).ok_or(ENOENT)?;
        if matches!(srq_type, srqt::XRC | srqt::TM) {
            let cq = b.handle(3).ok_or(ENOENT)?;
            if !self.cqs.get(cq).is_some_and(|c| c.ctx == ctx) {
                return Err(ENOENT);
            }
        }
        match srq_type {
            srqt::XRC => return Err(ENOENT),
            srqt::TM if !b.has(8) => return Err(ENOENT),
            srqt::BASIC | srqt::TM => {}
            _ => return Err(EINVAL),
        }
        let call = b.call(mem, ctx, &[])?;
        let req = SrqRequest {
            user_handle,
            pd,
            srq_type,
            max_wr,
            max_sge,
        };
        let made = self.create_srq(&call, mem, &req)?;
        let out = b
            .set_data(mem, 0, u64::from(made.handle))
            .and_then(|()| b.output(mem, 11, &made.max_wr.to_ne_bytes()))
            .and_then(|()| b.output(mem, 12, &made.max_sge.to_ne_bytes()))
            .and_then(|()| b.driver_written(mem));
        if out.is_err() {
            self.drop_srq(made.handle);
        }
        out
    }
}
