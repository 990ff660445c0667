//! mlx5 shared receive queues: a user ring of WQEs, each a 16-byte next segment
//! (`mlx5_wqe_srq_next_seg`) and data segments, linked into a free list through
//! `next_wqe_index`; a doorbell record counting the WQEs posted.
//!
//! As in libmlx5: the free list runs from `head` (the next WQE to post) to `tail` (a WQE
//! that is never posted, so `head == tail` is full); the device takes posted WQEs along the
//! links from WQE 0; a completed WQE goes back behind `tail`. The poster and the CQ's poller
//! both change the list, under [`SrqShared`]'s lock (libmlx5's SRQ spinlock). Resizing is
//! not possible: 6.1's driver refuses it (`mlx5_ib_modify_srq`, EINVAL).

use super::cqe::BadCqe;
use super::mem::{Buffer, Doorbell};
use super::wqe::{self, SEG};
use super::{abi, Ctx};
use crate::error::{Error, Result, WrReject};
use crate::provider::{KernelCall, KernelInput, SrqCreated, SrqQueue};
use crate::wr::RecvWr;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};
use zerocopy::IntoBytes;

/// `struct mlx5_wqe_srq_next_seg`: its size, and where `next_wqe_index` (big-endian) is.
const NEXT_SEG: usize = 16;
const NEXT_WQE_INDEX: usize = 2;
/// The smallest WQE the driver lays out.
const MIN_WQE: usize = 32;
/// The doorbell record word the device reads the posted count from.
const COUNTER: usize = 0;

/// The ring's layout, as `mlx5_ib_create_srq` computes it from the core command's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    /// WQEs in the ring: `roundup_pow_of_two(max_wr + 1)`.
    wqes: u32,
    /// log2 of the WQE size: the next segment and `max_sge` data segments, a power of two of
    /// at least 32 bytes.
    shift: u32,
}

impl Geometry {
    /// Within the device's limits from GET_CONTEXT: `max_srq_recv_wr` WQEs, WQEs of
    /// `max_rq_desc_sz` bytes.
    fn new(max_wr: u32, max_sge: u32, max_srq_recv_wr: u32, max_rq_desc_sz: u16) -> Result<Self> {
        let invalid = |what: String| Error::invalid("create_srq", what);
        let wqes = max_wr
            .checked_add(1)
            .and_then(u32::checked_next_power_of_two)
            .filter(|&n| n <= max_srq_recv_wr)
            .ok_or_else(|| {
                invalid(format!(
                    "{max_wr} receives: the device takes fewer than {max_srq_recv_wr}"
                ))
            })?;
        let size = (NEXT_SEG + max_sge as usize * SEG).next_power_of_two().max(MIN_WQE);
        if size > usize::from(max_rq_desc_sz) {
            return Err(invalid(format!("{max_sge} scatter entries: too many for the device")));
        }
        Ok(Self {
            wqes,
            shift: size.trailing_zeros(),
        })
    }

    /// Data segments a WQE holds.
    fn max_sge(&self) -> u32 {
        (((1usize << self.shift) - NEXT_SEG) / SEG) as u32
    }

    fn bytes(&self) -> usize {
        (self.wqes as usize) << self.shift
    }
}

pub(super) fn create(
    ctx: &Arc<Ctx>,
    max_wr: u32,
    max_sge: u32,
    kernel: KernelCall<'_, SrqCreated>,
) -> Result<Box<dyn SrqQueue>> {
    let geo = Geometry::new(max_wr, max_sge, ctx.max_srq_recv_wr, ctx.max_rq_desc_sz)?;
    let shared = Arc::new(SrqShared::new(geo, "CREATE_SRQ")?);
    let db = ctx.db_pages.alloc("CREATE_SRQ")?;
    let cmd = abi::CreateSrq {
        buf_addr: shared.buf.addr(),
        db_addr: db.addr(),
        ..Default::default()
    };
    let mut resp = abi::CreateSrqResp::default();
    let created = kernel(cmd.as_bytes(), resp.as_mut_bytes())?;
    if created.max_wr.checked_add(1) != Some(geo.wqes) {
        return Err(Error::malformed(
            "CREATE_SRQ",
            format!(
                "the kernel granted {} receives; the ring holds {}",
                created.max_wr,
                geo.wqes - 1
            ),
        ));
    }
    Ok(Box::new(Mlx5Srq { shared, db, posted: 0 }))
}

/// The free list and the `wr_id`s of the posted WQEs.
struct List {
    /// The next WQE to post.
    head: u16,
    /// The last free WQE, never posted.
    tail: u16,
    /// By WQE: the `wr_id` of the request posted in it, while the device may take it.
    wrid: Box<[Option<u64>]>,
}

/// What an SRQ's poster and the poller of its QPs' CQs share.
pub(super) struct SrqShared {
    buf: Buffer,
    geo: Geometry,
    list: Mutex<List>,
}

impl SrqShared {
    /// A ring with every WQE linked to the next, as libmlx5 sets it up.
    fn new(geo: Geometry, verb: &'static str) -> Result<Self> {
        let shared = Self {
            buf: Buffer::new(geo.bytes(), verb)?,
            geo,
            list: Mutex::new(List {
                head: 0,
                tail: (geo.wqes - 1) as u16,
                wrid: vec![None; geo.wqes as usize].into_boxed_slice(),
            }),
        };
        for i in 0..geo.wqes - 1 {
            shared.set_next(i as u16, (i + 1) as u16);
        }
        Ok(shared)
    }

    fn lock(&self) -> MutexGuard<'_, List> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// WQE `index` (masked to the ring).
    fn wqe(&self, index: u16) -> NonNull<u8> {
        let at = (usize::from(index) & (self.geo.wqes as usize - 1)) << self.geo.shift;
        // SAFETY: `at` is a WQE's start inside the buffer.
        unsafe { self.buf.base().add(at) }
    }

    /// The WQE free WQE `index` links to.
    fn next(&self, index: u16) -> u16 {
        // SAFETY: two bytes inside the WQE; only this SRQ's lock holder writes them.
        let raw = unsafe { self.wqe(index).add(NEXT_WQE_INDEX).cast::<[u8; 2]>().read() };
        u16::from_be_bytes(raw) & (self.geo.wqes - 1) as u16
    }

    fn set_next(&self, index: u16, next: u16) {
        // SAFETY: as in `next`; the WQE is free, so the device does not read it.
        unsafe {
            self.wqe(index)
                .add(NEXT_WQE_INDEX)
                .cast::<[u8; 2]>()
                .write(next.to_be_bytes())
        };
    }

    /// The receive CQE of WQE `wqe_counter` arrived: its `wr_id`; the WQE goes back to the
    /// free list (`mlx5_free_srq_wqe`). A WQE that is not posted is an error.
    pub(super) fn complete(&self, wqe_counter: u16) -> std::result::Result<u64, BadCqe> {
        let mut list = self.lock();
        let index = usize::from(wqe_counter);
        let wr_id = list
            .wrid
            .get_mut(index)
            .and_then(Option::take)
            .ok_or(BadCqe::WqeCounter)?;
        self.set_next(list.tail, wqe_counter);
        list.tail = wqe_counter;
        Ok(wr_id)
    }

    /// Writes `wrs` into free WQEs and returns how many it took (the rest rejected with the
    /// error for the first of them).
    fn post(&self, wrs: &[RecvWr<'_>]) -> (u16, Result<()>) {
        let mut list = self.lock();
        let max_sge = self.geo.max_sge();
        let mut posted = 0u16;
        for (index, wr) in wrs.iter().enumerate() {
            let reject = |reason| {
                Err(Error::WorkRequest {
                    verb: "post_srq_recv",
                    index,
                    reason,
                })
            };
            if wr.sg_list.len() > max_sge as usize {
                let given = wr.sg_list.len();
                return (posted, reject(WrReject::TooManySge { given, max: max_sge }));
            }
            if list.head == list.tail {
                return (posted, reject(WrReject::QueueFull));
            }
            let at = list.head;
            let data = self.wqe(at);
            // libmlx5 writes every entry, zero-length ones included, then a terminator when
            // there is room.
            for (n, sge) in wr.sg_list.iter().enumerate() {
                // SAFETY: `n < max_sge`, so the segment is inside the WQE, which is free.
                unsafe {
                    data.add(NEXT_SEG + n * SEG)
                        .cast::<[u8; SEG]>()
                        .write(wqe::data_seg(sge.length, sge.lkey, sge.addr))
                };
            }
            if wr.sg_list.len() < max_sge as usize {
                // SAFETY: as above.
                unsafe {
                    data.add(NEXT_SEG + wr.sg_list.len() * SEG)
                        .cast::<[u8; SEG]>()
                        .write(wqe::rq_terminator())
                };
            }
            list.wrid[usize::from(at)] = Some(wr.wr_id);
            list.head = self.next(at);
            posted += 1;
        }
        (posted, Ok(()))
    }
}

/// The poster's half of an SRQ.
pub(super) struct Mlx5Srq {
    shared: Arc<SrqShared>,
    db: Doorbell,
    /// WQEs posted, free-running: what the doorbell record carries.
    posted: u32,
}

impl Mlx5Srq {
    /// The shared half, for the QPs that take their receives from it.
    pub(super) fn shared(&self) -> &Arc<SrqShared> {
        &self.shared
    }
}

// SAFETY: CREATE_SRQ's driver bytes name the ring and doorbell record this SRQ owns until
// it is dropped, after the kernel destroy; MODIFY_SRQ's carry none.
unsafe impl SrqQueue for Mlx5Srq {
    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let (posted, result) = self.shared.post(wrs);
        if posted > 0 {
            self.posted = self.posted.wrapping_add(u32::from(posted));
            // Release: the WQEs reach memory before the count.
            self.db.set(COUNTER, self.posted);
        }
        result
    }

    fn modify(&mut self, resize: bool, kernel: KernelInput<'_>) -> Result<()> {
        if resize {
            return Err(Error::Unsupported {
                verb: "MODIFY_SRQ",
                what: "resizing an SRQ on mlx5 (the kernel driver refuses it)",
            });
        }
        kernel(&[])
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::Sge;

    fn sge(addr: u64, length: u32) -> Sge {
        Sge { addr, length, lkey: 7 }
    }

    fn shared(wqes: u32, shift: u32) -> SrqShared {
        SrqShared::new(Geometry { wqes, shift }, "test").unwrap()
    }

    /// The WQE's bytes.
    fn wqe_bytes(s: &SrqShared, index: u16) -> Vec<u8> {
        // SAFETY: a whole WQE inside the buffer, written by the test only.
        unsafe { std::slice::from_raw_parts(s.wqe(index).as_ptr(), 1 << s.geo.shift) }.to_vec()
    }

    /// `mlx5_ib_create_srq`'s sizes, within the limits the model's GET_CONTEXT reports.
    #[test]
    fn geometry_follows_the_driver() {
        let g = |max_wr, max_sge| Geometry::new(max_wr, max_sge, 1 << 15, 512).map(|g| (g.wqes, g.shift));
        // 500 receives of one entry (ibv_srq_pingpong): 512 WQEs of 32 bytes.
        assert_eq!(g(500, 1).unwrap(), (512, 5));
        assert_eq!(g(7, 3).unwrap(), (8, 6));
        assert_eq!(g(0, 0).unwrap(), (1, 5));
        assert_eq!(g((1 << 15) - 1, 31).unwrap(), (1 << 15, 9));
        assert!(g(1 << 15, 1).is_err());
        assert!(g(1, 32).is_err(), "16 + 32 * 16 bytes rounds up past 512");
        assert!(g(u32::MAX, 1).is_err());
        assert_eq!(Geometry { wqes: 8, shift: 6 }.max_sge(), 3);
        assert_eq!(Geometry { wqes: 8, shift: 5 }.max_sge(), 1);
    }

    /// WQEs are posted along the free list and hold the segments and a terminator; the
    /// list holds one WQE that is never posted.
    #[test]
    fn posts_follow_the_free_list_until_one_is_left() {
        let s = shared(4, 6);
        let wrs: Vec<_> = (0..4u64).map(|i| (i, [sge(0x1000 * (i + 1), 64)])).collect();
        let reqs: Vec<_> = wrs.iter().map(|(id, sg)| RecvWr::new(*id, sg)).collect();
        let (n, result) = s.post(&reqs);
        assert_eq!(n, 3);
        assert!(matches!(
            result,
            Err(Error::WorkRequest {
                index: 3,
                reason: WrReject::QueueFull,
                ..
            })
        ));
        let w = wqe_bytes(&s, 1);
        assert_eq!(&w[2..4], &[0, 2], "WQE 1 links to 2");
        assert_eq!(&w[16..32], &wqe::data_seg(64, 7, 0x2000));
        assert_eq!(&w[32..48], &wqe::rq_terminator());
        let list = s.lock();
        assert_eq!((list.head, list.tail), (3, 3));
        assert_eq!(&list.wrid[..], &[Some(0), Some(1), Some(2), None]);
    }

    /// A completed WQE goes behind the tail and is posted again after those before it; a
    /// counter naming a WQE not posted is an error.
    #[test]
    fn completed_wqes_return_behind_the_tail() {
        let s = shared(4, 5);
        let one = [sge(0x1000, 8)];
        let reqs: Vec<_> = (10..13u64).map(|id| RecvWr::new(id, &one)).collect();
        assert_eq!(s.post(&reqs).0, 3);
        // The device takes WQEs 0, 1, 2; the CQEs arrive for 1 then 0.
        assert_eq!(s.complete(1), Ok(11));
        assert_eq!(s.complete(1), Err(BadCqe::WqeCounter), "already completed");
        assert_eq!(s.complete(3), Err(BadCqe::WqeCounter), "the tail, never posted");
        assert_eq!(s.complete(9), Err(BadCqe::WqeCounter), "outside the ring");
        assert_eq!(s.complete(0), Ok(10));
        // Free list now 3 -> 1 -> 0: two more posts fit, into 3 then 1.
        let reqs: Vec<_> = (20..23u64).map(|id| RecvWr::new(id, &one)).collect();
        let (n, result) = s.post(&reqs);
        assert_eq!(n, 2);
        assert!(result.is_err());
        let list = s.lock();
        assert_eq!(list.wrid[3], Some(20));
        assert_eq!(list.wrid[1], Some(21));
        assert_eq!((list.head, list.tail), (0, 0));
    }

    /// Debian's libmlx5 44 on the model, `ibv_create_srq(max_wr 3, max_sge 3)` then one
    /// `ibv_post_srq_recv` of three requests (one SGE; three with a zero-length one in the
    /// middle; none), its ring read with `mlx5dv_init_obj` (64-byte stride), doorbell record
    /// 3: the first four WQEs, which the same posts here must equal byte for byte (libmlx5's
    /// ring is twice as long, for its wait queue, from WQE 4 on).
    #[test]
    fn srq_wqes_equal_the_libmlx5_capture() {
        const CAPTURE: [&str; 4] = [
            "00000001000000000000000000000000000000640000abcd0000000000001000\
             0000000000000100000000000000000000000000000000000000000000000000",
            "0000000200000000000000000000000000000008000000110000000000002000\
             0000000000000022000000000000300000000010000000330000000000004000",
            "0000000300000000000000000000000000000000000001000000000000000000\
             0000000000000000000000000000000000000000000000000000000000000000",
            "0000000000000000000000000000000000000000000000000000000000000000\
             0000000000000000000000000000000000000000000000000000000000000000",
        ];
        let geo = Geometry::new(3, 3, 1 << 15, 512).unwrap();
        assert_eq!((geo.wqes, 1u32 << geo.shift), (4, 64));
        let s = SrqShared::new(geo, "test").unwrap();
        let one = [Sge {
            addr: 0x1000,
            length: 100,
            lkey: 0xabcd,
        }];
        let three = [
            Sge {
                addr: 0x2000,
                length: 8,
                lkey: 0x11,
            },
            Sge {
                addr: 0x3000,
                length: 0,
                lkey: 0x22,
            },
            Sge {
                addr: 0x4000,
                length: 16,
                lkey: 0x33,
            },
        ];
        let wrs = [RecvWr::new(0, &one), RecvWr::new(1, &three), RecvWr::new(2, &[])];
        let (n, result) = s.post(&wrs);
        assert_eq!(n, 3);
        result.unwrap();
        for (i, want) in CAPTURE.iter().enumerate() {
            let got: String = wqe_bytes(&s, i as u16).iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(&got, want, "WQE {i}");
        }
    }

    #[test]
    fn too_many_entries_are_refused_and_zero_length_ones_kept() {
        let s = shared(4, 5);
        let two = [sge(1, 1), sge(2, 2)];
        let (n, result) = s.post(&[RecvWr::new(1, &two)]);
        assert_eq!(n, 0);
        assert!(matches!(
            result,
            Err(Error::WorkRequest {
                reason: WrReject::TooManySge { given: 2, max: 1 },
                ..
            })
        ));
        let zero = [sge(0x40, 0)];
        assert_eq!(s.post(&[RecvWr::new(2, &zero)]).0, 1);
        assert_eq!(&wqe_bytes(&s, 0)[16..32], &wqe::data_seg(0, 7, 0x40));
    }
}
