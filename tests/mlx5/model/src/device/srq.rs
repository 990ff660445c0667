//! The device's side of shared receive queues: the next WQE is the one the last taken WQE's
//! `mlx5_wqe_srq_next_seg.next_wqe_index` names (the first is WQE 0); the doorbell record
//! counts the WQEs posted; the limit event fires once the WQEs left drop below the armed
//! limit.

use super::{Device, RecvWqe};
use crate::abi;
use crate::kernel::Model;
use crate::mem::Memory;
use crate::objects::Qp;

/// Offset of `next_wqe_index` (big-endian) in `struct mlx5_wqe_srq_next_seg`.
const NEXT_WQE_INDEX: u64 = 2;
/// Size of the next segment that starts every SRQ WQE.
const NEXT_SEG: u64 = 16;

impl Device {
    /// The user index, or SRQ number, a receive CQE of `qp` carries in `srqn_uidx`: the QP's
    /// user index with CQE version 1; with version 0 the SRQ number of a QP on an SRQ (the
    /// field is how libmlx5 finds the SRQ then), else 0.
    pub(super) fn recv_uidx(model: &Model, qp: &Qp) -> u32 {
        if qp.uidx != abi::DEFAULT_UIDX {
            return qp.uidx;
        }
        qp.srq.and_then(|h| model.srqs.get(h)).map_or(0, |s| s.srqn)
    }

    /// The WQE SRQ `h` gives the next message: `Ok(None)` when every posted WQE is taken;
    /// `Err(())` when the SRQ is in error (a doorbell record beyond the ring raises SRQ_ERR).
    pub(super) fn srq_next(model: &mut Model, h: u32, mem: &dyn Memory) -> Result<Option<RecvWqe>, ()> {
        let Some(srq) = model.srqs.get(h) else { return Err(()) };
        if srq.error {
            return Err(());
        }
        let Ok(posted) = mem.read_be32(srq.db) else {
            Self::srq_error(model, h);
            return Err(());
        };
        let left = (posted as u16).wrapping_sub(srq.taken);
        if left == 0 {
            return Ok(None);
        }
        if u32::from(left) > srq.max {
            Self::srq_error(model, h);
            return Err(());
        }
        let stride = 1u64 << srq.wqe_shift;
        let index = u64::from(srq.head) & u64::from(srq.max - 1);
        Ok(Some(RecvWqe {
            segs: srq.buf + index * stride + NEXT_SEG,
            max_segs: ((stride - NEXT_SEG) / 16).min(64),
            index: index as u16,
            srq: Some(h),
        }))
    }

    /// WQE `index` of SRQ `h` is taken: the head moves to the WQE it links to, and an armed
    /// limit the WQEs left now fall below raises SRQ_LIMIT_REACHED and disarms.
    pub(super) fn srq_take(model: &mut Model, h: u32, index: u16, mem: &dyn Memory) {
        let Some(srq) = model.srqs.get_mut(h) else { return };
        let mut next = [0u8; 2];
        let at = srq.buf + (u64::from(index) << srq.wqe_shift) + NEXT_WQE_INDEX;
        if mem.read(at, &mut next).is_err() {
            Self::srq_error(model, h);
            return;
        }
        srq.head = u16::from_be_bytes(next) & (srq.max - 1) as u16;
        srq.taken = srq.taken.wrapping_add(1);
        if srq.limit == 0 {
            return;
        }
        let posted = mem.read_be32(srq.db).unwrap_or(0) as u16;
        let left = u32::from(posted.wrapping_sub(srq.taken));
        if left < srq.limit {
            srq.limit = 0;
            crate::log!("srq {:#x} limit reached ({left} left)", srq.srqn);
            Self::srq_event(model, h, abi::event::SRQ_LIMIT_REACHED);
        }
    }

    fn srq_error(model: &mut Model, h: u32) {
        let Some(srq) = model.srqs.get_mut(h) else { return };
        if srq.error {
            return;
        }
        srq.error = true;
        crate::log!("srq {:#x} error", srq.srqn);
        Self::srq_event(model, h, abi::event::SRQ_ERR);
    }

    fn srq_event(model: &Model, h: u32, event_type: u32) {
        let Some(srq) = model.srqs.get(h) else { return };
        if let Some(sink) = model.contexts.get(&srq.ctx).and_then(|c| c.async_sink.as_ref()) {
            let ev = abi::AsyncEventDesc {
                element: srq.user_handle,
                event_type,
                reserved: 0,
            };
            sink.push(zerocopy::IntoBytes::as_bytes(&ev));
        }
    }
}
