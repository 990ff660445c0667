//! ConnectX (`mlx5_ib`): user space allocates every ring and doorbell record, writes WQEs
//! and reads CQEs in the device's own formats, and rings doorbells through mapped UAR pages.
//!
//! Built: contexts with legacy UARs, PDs, CQs (poll, arm, resize), RC and UC QPs (every send
//! operation, inline data, BlueFlame for a lone request as libmlx5 does, receives,
//! RESET and destroy scrubbing), SRQs (post, limit arming, QPs on an SRQ; no resize: the
//! kernel driver has none), UD QPs with address handles on InfiniBand ports (RoCE ones:
//! `Error::Unsupported`).
//!
//! Doorbells go to the bfreg the kernel gave the QP. GET_CONTEXT asks for libmlx5's 16
//! bfregs, 4 of them low latency; Linux gives each of those to one QP and shares the others
//! (bfreg 0, without BlueFlame, and the medium ones). A QP on a dedicated bfreg rings
//! without a lock; QPs on a shared medium bfreg take that bfreg's lock around the doorbell
//! store or BlueFlame copy, the flush and the toggle of its halves, which the bfreg keeps
//! for all of them (libmlx5's `need_uuar_lock` and `mmio_wc_spinlock`).

// The device sees the WQEs, doorbell records and CQEs through memory ordered for x86-64
// (Release and Acquire there are enough for a DMA device, and `sfence` around the UAR store);
// on Arm a device outside the CPUs' shareability domain needs rdma-core's `dmb oshst`/`oshld`
// around them, which this provider does not issue (docs/mlx5-model.md, "Barriers").
#[cfg(not(target_arch = "x86_64"))]
compile_error!(
    "the mlx5 provider orders its device memory for x86-64 only: on this architecture build \
     uverbs without its `mlx5` feature (`default-features = false`); see docs/mlx5-model.md, \
     \"Barriers\""
);

mod abi;
mod ah;
mod cq;
mod cqe;
#[cfg(test)]
mod dv_check;
mod mem;
mod qp;
pub(super) use qp::queues;
mod srq;
mod wqe;

/// The hostile-CQE harness, for `crate::testing`.
#[cfg(any(test, feature = "test-support"))]
pub use cq::hostile as hostile_cqes;

use crate::attr::{AhAttr, GidType};
use crate::device::{DeviceFile, DeviceInfo};
use crate::error::{Error, Result};
use crate::provider::{
    CqRing, CreateCqCall, CreateQpCall, KernelCall, Provider, ProviderContext, ProviderQp, QpRequest, SrqCreated,
    SrqQueue,
};
use crate::sys::mapping::Mapping;
use mem::{DbPages, UarPage};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Mutex};
use zerocopy::IntoBytes;

/// `RDMA_DRIVER_MLX5` in `enum rdma_driver_id` (the second entry, after UNKNOWN).
const DRIVER_ID: u32 = 1;
/// The per-device uverbs ABI version of mlx5.
const ABI_VERSION: u32 = 1;
/// Blue flame registers asked for, and how many of them low latency (libmlx5's defaults).
const BFREGS: u32 = 16;
const LOW_LATENCY_BFREGS: u32 = 4;
/// Bfregs per UAR (`NUM_BFREGS_PER_UAR`) and the first bfreg's offset in a UAR
/// (`MLX5_BF_OFFSET`).
const BFREGS_PER_UAR: u32 = 4;
const BF_OFFSET: usize = 0x800;
/// The bytes of the UAR a bfreg index lands in (`MLX5_ADAPTER_PAGE_SIZE`).
const ADAPTER_PAGE: usize = 4096;
/// User indices the device can carry (24 bits; the all-ones one is invalid).
const MAX_USER_INDEX: u32 = 0xff_fffe;

/// The mlx5 provider.
pub(crate) struct Mlx5;

impl Provider for Mlx5 {
    fn name(&self) -> &'static str {
        "mlx5"
    }

    fn driver_id(&self) -> u32 {
        DRIVER_ID
    }

    fn matches(&self, device: &DeviceInfo) -> bool {
        let driver = match device.driver_id {
            Some(id) => id == DRIVER_ID,
            None => device.name.starts_with("mlx5_"),
        };
        driver && device.abi_version == ABI_VERSION
    }

    fn open(&self, file: &Arc<DeviceFile>, kernel: KernelCall<'_, ()>) -> Result<Box<dyn ProviderContext>> {
        let req = abi::AllocUcontextReq {
            total_num_bfregs: BFREGS,
            num_low_latency_bfregs: LOW_LATENCY_BFREGS,
            max_cqe_version: 1,
            lib_caps: abi::LIB_CAP_4K_UAR,
            ..Default::default()
        };
        let mut resp = abi::AllocUcontextResp::default();
        kernel(req.as_bytes(), resp.as_mut_bytes())?;
        let ctx = Ctx::from_response(file, &resp)?;
        Ok(Box::new(Mlx5Context(Arc::new(ctx))))
    }
}

/// Per-context state.
pub(super) struct Ctx {
    /// The legacy UAR pages, in index order.
    uars: Vec<UarPage>,
    bf_reg_size: u32,
    /// Bytes of one BlueFlame buffer (half a bfreg); 0 when BlueFlame is off: no write
    /// combining (`bf_reg_size` 0) or `MLX5_SHUT_UP_BF` set.
    bf_buf_size: usize,
    /// BlueFlame for any lone request, not only inline ones: libmlx5's default, off with
    /// `MLX5_POST_SEND_PREFER_BF=0`.
    prefer_bf: bool,
    num_uars_per_page: u32,
    /// Every bfreg of the UARs, by index (`bfreg_index`'s layout, the fast-path ones too).
    bfregs: Vec<Arc<qp::BfReg>>,
    db_pages: Arc<DbPages>,
    uidx: UserIndices,
    max_sq_desc_sz: u16,
    max_rq_desc_sz: u16,
    max_send_wqebb: u32,
    max_recv_wr: u32,
    max_srq_recv_wr: u32,
}

impl Ctx {
    /// Checks GET_CONTEXT's response and maps the UAR pages it describes.
    fn from_response(file: &DeviceFile, resp: &abi::AllocUcontextResp) -> Result<Self> {
        let verb = "GET_CONTEXT";
        if resp.cqe_version != 1 {
            return Err(Error::Unsupported {
                verb,
                what: "mlx5 devices without CQE version 1 (user indices)",
            });
        }
        let per_page = resp.num_uars_per_page.max(1);
        let pages = resp.tot_bfregs / (per_page * 2);
        if pages == 0 || pages > 256 {
            return Err(Error::malformed(
                verb,
                format!("{} bfregs, {per_page} UARs per page", resp.tot_bfregs),
            ));
        }
        let page_size = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| usize::try_from(p).ok())
            .unwrap_or(4096);
        // `MLX5_SHUT_UP_BF` set (and not 0) asks for uncached UAR pages, as in libmlx5.
        let uncached = std::env::var_os("MLX5_SHUT_UP_BF").is_some_and(|v| v != "0");
        let command = if uncached {
            abi::MMAP_NC_PAGE
        } else {
            abi::MMAP_REGULAR_PAGE
        };
        let uars = (0..u64::from(pages))
            .map(|i| {
                // SAFETY: one UAR page of the device, written only with 8-byte volatile stores
                // at checked offsets (`UarPage::write64`).
                let map = unsafe {
                    Mapping::device(
                        file.as_fd().as_raw_fd(),
                        ((command << 8) | i) * page_size as u64,
                        page_size,
                    )
                }
                .map_err(|e| Error::io(format!("{verb}: mmap of UAR page {i}"), e))?;
                UarPage::new(map).ok_or_else(|| Error::malformed(verb, "mmap returned null"))
            })
            .collect::<Result<Vec<_>>>()?;
        let count = pages * per_page * BFREGS_PER_UAR;
        let bfregs = (0..count)
            .map(|i| Arc::new(qp::BfReg::new(bfreg_shared(i, resp.tot_bfregs))))
            .collect();
        Ok(Self {
            uars,
            bfregs,
            bf_reg_size: resp.bf_reg_size,
            bf_buf_size: if uncached { 0 } else { resp.bf_reg_size as usize / 2 },
            prefer_bf: std::env::var_os("MLX5_POST_SEND_PREFER_BF").is_none_or(|v| v != "0"),
            num_uars_per_page: per_page,
            db_pages: Arc::new(DbPages::new(page_size)),
            uidx: UserIndices::default(),
            max_sq_desc_sz: resp.max_sq_desc_sz,
            max_rq_desc_sz: resp.max_rq_desc_sz,
            max_send_wqebb: resp.max_send_wqebb,
            max_recv_wr: resp.max_recv_wr,
            max_srq_recv_wr: resp.max_srq_recv_wr,
        })
    }

    /// Where bfreg `index`'s doorbell is (libmlx5 `mlx5.c`'s bfreg layout), if inside the
    /// mapped UARs. Bfreg 0 is shared by QPs, so it never takes BlueFlame copies; the other
    /// shared ones do, under their lock ([`bfreg_shared`]).
    fn bfreg(&self, index: u32) -> Option<qp::SendDoorbell> {
        let per_page = BFREGS_PER_UAR * self.num_uars_per_page;
        let page = (index / per_page) as usize;
        let uar_in_page = ((index / BFREGS_PER_UAR) % self.num_uars_per_page) as usize;
        let reg = (index % BFREGS_PER_UAR) as usize;
        let offset = ADAPTER_PAGE * uar_in_page + BF_OFFSET + reg * self.bf_reg_size as usize;
        let toggle = (self.bf_reg_size / 2) as usize;
        let uar = self.uars.get(page)?;
        let reg = self.bfregs.get(index as usize)?.clone();
        let shared = reg.shared();
        let bf_size = if index == 0 { 0 } else { self.bf_buf_size };
        // A BlueFlame copy is whole basic blocks: up to `bf_size` rounded up to one.
        let copy = bf_size.next_multiple_of(wqe::SEND_WQE_BB);
        let fits = |at: usize| uar.fits(at) && (copy == 0 || uar.fits(at + copy - 8));
        // The doorbell goes to `offset` plus the current half (0 or `toggle`), as libmlx5
        // writes `bf->reg + bf->offset`.
        let second = offset.checked_add(toggle)?;
        (fits(offset) && fits(second)).then_some(qp::SendDoorbell {
            page: uar.base(),
            offset,
            toggle,
            bf_size,
            reg,
            claimed: false,
            shared,
            half: 0,
        })
    }

    /// The device's queue limits.
    fn limits(&self) -> qp::Limits {
        qp::Limits {
            max_sq_desc_sz: self.max_sq_desc_sz,
            max_rq_desc_sz: self.max_rq_desc_sz,
            max_send_wqebb: self.max_send_wqebb,
            max_recv_wr: self.max_recv_wr,
        }
    }

    /// The UAR page CQ doorbells go to.
    fn cq_uar(&self) -> &UarPage {
        &self.uars[0]
    }
}

/// Whether QPs share bfreg `index` (in `bfreg_index`'s layout: 4 a UAR, the first 2 not
/// fast-path), and so must post on it under its lock: libmlx5's `need_uuar_lock`. Linux
/// (hw/mlx5/qp.c `alloc_bfreg`) numbers the non-fast-path bfregs `n = index / 4 * 2 + index %
/// 4`, gives bfreg 0 to every QP when nothing else is left (no BlueFlame there, so no copy to
/// tear: the 8-byte doorbell is one store), the last `LOW_LATENCY_BFREGS` to one QP each (high
/// class: lock-free), and the ones between to several QPs, least used first (medium class).
fn bfreg_shared(index: u32, total: u32) -> bool {
    let n = index / BFREGS_PER_UAR * 2 + index % BFREGS_PER_UAR;
    index != 0 && index % BFREGS_PER_UAR < 2 && n < total.saturating_sub(LOW_LATENCY_BFREGS)
}

/// The context's user indices: the lowest free one is handed out.
#[derive(Default)]
struct UserIndices {
    /// Bit `i` set: index `i` is taken.
    used: Mutex<Vec<u64>>,
}

impl UserIndices {
    fn alloc(&self) -> Result<u32> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let word = match used.iter().position(|w| *w != u64::MAX) {
            Some(w) => w,
            None => {
                used.push(0);
                used.len() - 1
            }
        };
        let index = word as u32 * 64 + used[word].trailing_ones();
        if index > MAX_USER_INDEX {
            return Err(Error::Unsupported {
                verb: "create_qp",
                what: "more than 2^24 - 1 QPs in one mlx5 context",
            });
        }
        used[word] |= 1 << (index % 64);
        Ok(index)
    }

    fn free(&self, index: u32) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = used.get_mut(index as usize / 64) {
            *w &= !(1 << (index % 64));
        }
    }
}

struct Mlx5Context(Arc<Ctx>);

// SAFETY: the driver bytes passed here name no user memory but ALLOC_PD's and CREATE_AH's
// response buffers, which live across the calls; the CQ and QP halves vouch for their own.
unsafe impl ProviderContext for Mlx5Context {
    fn alloc_pd(&self, kernel: KernelCall<'_, ()>) -> Result<()> {
        let mut resp = abi::AllocPdResp::default();
        kernel(&[], resp.as_mut_bytes())
    }

    fn reg_mr(&self, kernel: KernelCall<'_, ()>) -> Result<()> {
        kernel(&[], &mut [])
    }

    fn create_cq(&self, cqe: u32, kernel: CreateCqCall<'_>) -> Result<Box<dyn CqRing>> {
        cq::create(&self.0, cqe, kernel)
    }

    fn create_qp(&self, request: &QpRequest<'_>, kernel: CreateQpCall<'_>) -> Result<ProviderQp> {
        qp::create(&self.0, request, kernel)
    }

    fn create_srq(&self, max_wr: u32, max_sge: u32, kernel: KernelCall<'_, SrqCreated>) -> Result<Box<dyn SrqQueue>> {
        srq::create(&self.0, max_wr, max_sge, kernel)
    }

    fn create_ah(&self, attr: &AhAttr, sgid_type: Option<GidType>, kernel: KernelCall<'_, u32>) -> Result<u64> {
        ah::create(attr, sgid_type, kernel)
    }

    fn destroy_ah(&self, provider_data: u64) {
        // SAFETY: the core hands back `create_ah`'s value once, after the kernel destroyed
        // the AH; no send names it any more (a request borrows its AH).
        unsafe { ah::destroy(provider_data) }
    }
}

#[cfg(test)]
mod tests {
    use super::bfreg_shared;

    /// libmlx5's `need_uuar_lock` for its 16 bfregs, 4 of them low latency: bfreg 0 and the
    /// low-latency ones (non-fast-path numbers 12 to 15, indices 24, 25, 28, 29) lock-free,
    /// the medium ones (1 to 11) locked; fast-path indices never handed out.
    #[test]
    fn shared_bfregs_are_the_medium_ones() {
        let locked: Vec<u32> = (0..32).filter(|&i| bfreg_shared(i, 16)).collect();
        assert_eq!(locked, [1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21]);
    }
}
