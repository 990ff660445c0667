//! The room an extended QP builds its `ibv_wr_*` batch in (see `crate::qp_ex`): the requests,
//! copies of their scatter/gather lists and inline data, and the chain `ibv_wr_complete` posts
//! them as. Data only, used under the QP's lock: the QP holds one (`crate::qp`) and the
//! `ibv_wr_*` entry points fill it (`crate::qp_ex`).

use libc::c_int;
use std::ptr::NonNull;
use uverbs::{CRdmaArm, CSendArm, CSendWr, QpCap, QpType, SendFlags, SendWr, Sge};

/// The requests of one `ibv_wr_start` .. `ibv_wr_complete` batch, and room for what they
/// point at. Used only with the QP's lock held.
pub(crate) struct WrBuilder {
    /// The requests built so far. Their scatter/gather lists point into `sges` and UD
    /// destinations at the caller's AHs: `'static` stands for "until the batch ends", which
    /// both outlive (the AHs by the caller's contract, as with `ibv_post_send`).
    pub(crate) wrs: Vec<SendWr<'static>>,
    /// Room for the chain `ibv_wr_complete` posts: one link per request of `wrs`.
    links: Vec<Link>,
    /// Scatter/gather entries copied from the setters, and entries naming `inline`.
    sges: Vec<Sge>,
    /// Inline data copied from the setters.
    inline: Vec<u8>,
    pub(crate) max_sge: usize,
    max_inline: usize,
    /// Free send queue slots as last read; read again when the batch reaches it.
    pub(crate) room: usize,
    /// The first error of the batch (errno), or 0.
    pub(crate) err: c_int,
}

// SAFETY: the references inside `wrs` point into `sges` and `inline` (moved along with the
// builder, and never reallocated: see `WrBuilder::new`) and at AHs, which are `Sync`; the
// pointers inside `links` name `wrs` and `links`, made again for each post; the
// builder is used by one thread at a time, under the QP's lock.
unsafe impl Send for WrBuilder {}

impl WrBuilder {
    /// No room: for QPs created without `ibv_wr_*` builders (allocates nothing).
    pub(crate) fn none() -> Self {
        Self {
            wrs: Vec::new(),
            links: Vec::new(),
            sges: Vec::new(),
            inline: Vec::new(),
            max_sge: 0,
            max_inline: 0,
            room: 0,
            err: 0,
        }
    }

    /// Room for a full send queue of `depth` requests (those an empty queue takes: rdma_rxe
    /// 6.1 reports the depth asked at create, 8 say, for a ring that takes 15) with `cap`'s
    /// SGEs and inline data. The vectors never grow past this capacity, so what points into
    /// them stays valid.
    pub(crate) fn new(cap: &QpCap, depth: u32) -> Self {
        let wrs = depth.max(cap.max_send_wr) as usize;
        let max_sge = cap.max_send_sge as usize;
        let max_inline = cap.max_inline_data as usize;
        Self {
            wrs: Vec::with_capacity(wrs),
            links: Vec::with_capacity(wrs),
            // Inline data takes one entry of its own.
            sges: Vec::with_capacity(wrs * max_sge.max(1)),
            inline: Vec::with_capacity(wrs * max_inline),
            max_sge,
            max_inline,
            room: 0,
            err: 0,
        }
    }

    pub(crate) fn clear(&mut self) {
        self.wrs.clear();
        self.links.clear();
        self.sges.clear();
        self.inline.clear();
        self.room = 0;
        self.err = 0;
    }

    /// The last request built, for a setter; an error if there is none.
    pub(crate) fn last(&mut self) -> Option<&mut SendWr<'static>> {
        if self.err != 0 {
            return None;
        }
        if self.wrs.is_empty() {
            self.err = libc::EINVAL;
        }
        self.wrs.last_mut()
    }

    /// Copies `list` into `sges` and makes it the last request's list.
    pub(crate) fn set_sges(&mut self, list: &[Sge]) {
        if self.last().is_none() {
            return;
        }
        if list.len() > self.max_sge.max(1) || self.sges.len() + list.len() > self.sges.capacity() {
            self.err = libc::ENOSPC;
            return;
        }
        let start = self.sges.len();
        self.sges.extend_from_slice(list);
        // SAFETY: `start..start + list.len()` was just written; `sges` never grows past its
        // capacity (checked above), so the entries stay where they are until `clear`, which
        // also empties `wrs`.
        let copied: &'static [Sge] = unsafe { std::slice::from_raw_parts(self.sges.as_ptr().add(start), list.len()) };
        if let Some(wr) = self.wrs.last_mut() {
            wr.sg_list = copied;
        }
    }

    /// Copies the buffers into `inline` and makes them the last request's inline data.
    pub(crate) fn set_inline(&mut self, bufs: &[(*const u8, usize)]) {
        if self.last().is_none() {
            return;
        }
        let total = bufs.iter().map(|&(_, len)| len).fold(0usize, usize::saturating_add);
        if total > self.max_inline || self.inline.len() + total > self.inline.capacity() {
            self.err = libc::ENOSPC;
            return;
        }
        let start = self.inline.len();
        for &(addr, len) in bufs {
            if len != 0 {
                // SAFETY: the caller's buffer of `len` bytes (the ibv_wr_set_inline_data*
                // contract).
                self.inline
                    .extend_from_slice(unsafe { std::slice::from_raw_parts(addr, len) });
            }
        }
        let sge = Sge {
            // SAFETY: `start` is at most the length; `inline` never grows past its capacity,
            // so the bytes stay where they are until `clear`.
            addr: unsafe { self.inline.as_ptr().add(start) } as u64,
            length: total as u32,
            lkey: 0,
        };
        self.set_sges(&[sge]);
        if let Some(wr) = self.wrs.last_mut() {
            wr.flags |= SendFlags::INLINE;
        }
    }
}

/// A link of the chain a batch is posted as: a C request with no opcode libibverbs has, so
/// that the core hands it to [`built_wr`] (`uverbs::SlowDecode`), which returns the request
/// built.
#[repr(C)]
struct Link {
    c: CSendWr,
    wr: *const SendWr<'static>,
}

impl WrBuilder {
    /// Links the requests built into a chain in `links`; its first link. `wrs` must not be
    /// empty, and neither may change until the chain is posted.
    pub(crate) fn chain(&mut self) -> NonNull<CSendWr> {
        self.links.clear();
        for wr in &self.wrs {
            self.links.push(Link {
                c: CSendWr {
                    wr_id: wr.wr_id,
                    next: std::ptr::null_mut(),
                    sg_list: std::ptr::null_mut(),
                    num_sge: 0,
                    // No libibverbs opcode: the core reads no field of the link itself.
                    opcode: u32::MAX,
                    send_flags: 0,
                    imm_data: 0,
                    wr: CSendArm::rdma(CRdmaArm {
                        remote_addr: 0,
                        rkey: 0,
                    }),
                },
                wr,
            });
        }
        // `links` holds as many as `wrs` (same capacity), so it never reallocated above.
        let base = self.links.as_mut_ptr();
        for i in 1..self.links.len() {
            // SAFETY: `i - 1` and `i` are links just written.
            unsafe { (*base.add(i - 1)).c.next = std::ptr::addr_of_mut!((*base.add(i)).c) };
        }
        // SAFETY: not empty (the contract), so `base` is a live link; `c` is its first field.
        unsafe { NonNull::new_unchecked(std::ptr::addr_of_mut!((*base).c)) }
    }
}

/// The request a [`Link`] stands for.
///
/// # Safety
/// `at` must be the `c` of a link made by [`WrBuilder::chain`], whose builder is unchanged.
pub(crate) unsafe fn built_wr(at: NonNull<CSendWr>, _qp_type: QpType) -> Option<SendWr<'static>> {
    // SAFETY: `c` is the first field of the `repr(C)` link, which names a live request.
    Some(unsafe { *(*at.as_ptr().cast::<Link>()).wr })
}

#[cfg(test)]
mod tests {
    use super::*;
    use uverbs::SendOp;

    fn builder(max_send_wr: u32, max_send_sge: u32, max_inline_data: u32) -> WrBuilder {
        let cap = QpCap {
            max_send_wr,
            max_recv_wr: 0,
            max_send_sge,
            max_recv_sge: 0,
            max_inline_data,
        };
        WrBuilder::new(&cap, max_send_wr)
    }

    fn push(b: &mut WrBuilder, wr_id: u64) {
        b.wrs.push(SendWr::new(wr_id, SendOp::Send, &[]));
    }

    #[test]
    fn setters_copy_into_the_builders_room_and_fill_the_last_request() {
        let mut b = builder(4, 2, 16);
        push(&mut b, 1);
        let list = [
            Sge {
                addr: 0x1000,
                length: 8,
                lkey: 7,
            },
            Sge {
                addr: 0x2000,
                length: 24,
                lkey: 7,
            },
        ];
        b.set_sges(&list);
        push(&mut b, 2);
        let data = *b"0123456789";
        b.set_inline(&[(data.as_ptr(), 4), (data[6..].as_ptr(), 4)]);
        assert_eq!(b.err, 0);
        assert_eq!(b.wrs[0].sg_list, &list, "the list is a copy");
        assert_eq!(b.wrs[0].total_len(), 32);
        let inline = b.wrs[1];
        assert!(inline.flags.contains(SendFlags::INLINE | SendFlags::SIGNALED));
        assert_eq!((inline.sg_list.len(), inline.total_len()), (1, 8));
        // SAFETY: the entry names the builder's inline room, alive until `clear`.
        let copied = unsafe { std::slice::from_raw_parts(inline.sg_list[0].addr as *const u8, 8) };
        assert_eq!(copied, b"01236789", "the buffers, one after the other");
        b.clear();
        assert!(b.wrs.is_empty() && b.sges.is_empty() && b.inline.is_empty());
    }

    #[test]
    fn the_first_error_is_kept_and_later_setters_do_nothing() {
        let mut b = builder(4, 1, 8);
        b.set_sges(&[]);
        assert_eq!(b.err, libc::EINVAL, "a setter before any builder");
        b.clear();
        push(&mut b, 1);
        let sge = Sge {
            addr: 1,
            length: 1,
            lkey: 1,
        };
        b.set_sges(&[sge, sge]);
        assert_eq!(b.err, libc::ENOSPC, "more than max_send_sge");
        b.set_inline(&[(b"x".as_ptr(), 1)]);
        assert_eq!(b.err, libc::ENOSPC);
        assert!(b.wrs[0].sg_list.is_empty() && !b.wrs[0].flags.contains(SendFlags::INLINE));
        b.clear();
        push(&mut b, 2);
        b.set_inline(&[([0u8; 9].as_ptr(), 9)]);
        assert_eq!(b.err, libc::ENOSPC, "more than max_inline_data");
    }

    #[test]
    fn the_chain_links_every_request_built_in_order() {
        let mut b = builder(4, 1, 0);
        for wr_id in [7, 8, 9] {
            push(&mut b, wr_id);
        }
        let mut at = b.chain().as_ptr();
        let mut seen = Vec::new();
        while !at.is_null() {
            // SAFETY: a link of the chain just made, the builder unchanged.
            let (c, wr) = unsafe { (*at, built_wr(NonNull::new_unchecked(at), QpType::Rc)) };
            assert_eq!(
                c.opcode,
                u32::MAX,
                "no libibverbs opcode: the core reads nothing in place"
            );
            seen.push((c.wr_id, wr.map(|w| w.wr_id)));
            at = c.next;
        }
        assert_eq!(seen, [(7, Some(7)), (8, Some(8)), (9, Some(9))]);
    }

    #[test]
    fn a_builder_without_room_allocates_nothing() {
        let b = WrBuilder::none();
        assert_eq!((b.wrs.capacity(), b.sges.capacity(), b.inline.capacity()), (0, 0, 0));
    }
}
