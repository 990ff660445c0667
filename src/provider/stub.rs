//! A provider for testing the contract: user-allocated rings in mlx5's shape over whatever
//! kernel driver the device has (the kernel objects are real; the driver's own rings are left
//! unmapped). Its "device" is the provider itself: a signaled send completes at once, as a
//! owner-bit CQE written into the send CQ's user ring. Every hook the core calls
//! is written to a log the tests read.
//!
//! Built with the `test-support` feature; open a context on it with
//! [`crate::Context::open_with`].

use crate::attr::{AhAttr, GidType, QpCap, QpState, QpType};
use crate::device::{DeviceFile, DeviceInfo};
use crate::error::{Error, Result, WrReject};
use crate::provider::{
    CqRing, CreateCqCall, CreateQpCall, KernelCall, KernelInput, Provider, ProviderContext, ProviderQp, QpRequest,
    ReadyRun, ResizeCqCall, SrqCreated, SrqQueue,
};
use crate::sys::abi::{cmd as command, ReqNotifyCq};
use crate::sys::cmd;
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr::{RecvWr, SendFlags, SendList};
use std::any::Any;
use std::collections::HashMap;
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Driver response room the stub gives every command: more than any driver writes.
const DRIVER_OUT: usize = 64;

/// One call of a hook, as the stub saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Hook {
    AllocPd,
    RegMr,
    /// A CQ was created; `asked` is what the stub asked the kernel for.
    CreateCq {
        id: u32,
        asked: u32,
        granted: u32,
    },
    /// A QP was created and linked to its CQs (by stub CQ id) and SRQ.
    CreateQp {
        qpn: u32,
        send_cq: u32,
        recv_cq: u32,
        srq: bool,
    },
    /// A QP moved to `state`; on RESET, `scrubbed` completions of it left its CQs.
    Modify {
        qpn: u32,
        state: Option<QpState>,
        scrubbed: usize,
    },
    /// The kernel destroyed the QP; `scrubbed` completions of it left its CQs.
    QpDestroyed {
        qpn: u32,
        scrubbed: usize,
    },
    /// A CQ was armed with this many delivered events.
    Arm {
        id: u32,
        solicited_only: bool,
        events: u32,
    },
    /// A post reached the provider, which took this many work requests from the list.
    PostSend {
        qpn: u32,
        taken: usize,
    },
    CreateAh {
        data: u64,
    },
    DestroyAh {
        data: u64,
    },
    /// A CQ's ring was freed; `kernel_cq_alive` is what the kernel said of the CQ then.
    CqRingFreed {
        id: u32,
        kernel_cq_alive: bool,
    },
    /// An SRQ's queue was freed.
    SrqFreed,
}

/// The log of hook calls, shared by everything one stub made.
#[derive(Debug, Clone, Default)]
pub struct HookLog(Arc<Mutex<Vec<Hook>>>);

impl HookLog {
    fn push(&self, hook: Hook) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(hook);
    }

    /// Everything logged so far, in order.
    pub fn take(&self) -> Vec<Hook> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The stub provider for one device (ioctls carry the device's driver id).
#[derive(Debug)]
pub struct Stub {
    driver_id: u32,
    log: HookLog,
}

impl Stub {
    /// A stub for `device`, logging into `log`.
    pub fn new(device: &DeviceInfo, log: HookLog) -> Self {
        Self {
            driver_id: device.driver_id.unwrap_or_default(),
            log,
        }
    }
}

impl Provider for Stub {
    fn name(&self) -> &'static str {
        "stub"
    }

    fn driver_id(&self) -> u32 {
        self.driver_id
    }

    fn matches(&self, _: &DeviceInfo) -> bool {
        true
    }

    fn open(&self, file: &Arc<DeviceFile>, kernel: KernelCall<'_, ()>) -> Result<Box<dyn ProviderContext>> {
        kernel(&[], &mut [])?;
        Ok(Box::new(StubContext {
            file: file.clone(),
            log: self.log.clone(),
            next_cq: AtomicU32::new(1),
            qps: QpTable::default(),
            next_ah: AtomicU64::new(1),
        }))
    }
}

struct StubContext {
    file: Arc<DeviceFile>,
    log: HookLog,
    next_cq: AtomicU32,
    /// QPN -> the CQs a QP completes into: the per-context table a scrub works from.
    qps: QpTable,
    next_ah: AtomicU64,
}

/// QPN -> the CQs a QP completes into, shared by a context and its QPs.
#[derive(Clone, Default)]
struct QpTable(Arc<Mutex<HashMap<u32, [Arc<CqShared>; 2]>>>);

impl QpTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, [Arc<CqShared>; 2]>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Scrubs `qpn`'s completions from its CQs (once if both are one); `forget` also takes
    /// the QP out of the table.
    fn scrub(&self, qpn: u32, forget: bool) -> usize {
        let mut table = self.lock();
        let cqs = if forget {
            table.remove(&qpn)
        } else {
            table.get(&qpn).cloned()
        };
        cqs.map_or(0, |[send, recv]| {
            send.scrub(qpn) + if Arc::ptr_eq(&send, &recv) { 0 } else { recv.scrub(qpn) }
        })
    }
}

/// A CQE of the stub's ring: `wr_id`, then `qpn | status << 24 | opcode << 32 | owner << 63`,
/// the second word stored last with Release. As on mlx5, a slot starts with an invalid
/// opcode and owner 0; a completion is valid when its owner bit matches the pass it is read
/// in (the consumer index's bit above the ring size).
struct Cqe([AtomicU64; 2]);

/// The opcode of a slot no completion was written to yet.
const INVALID_OPCODE: u64 = 0xff;
/// The status of a completion a scrub removed.
const SCRUBBED: u64 = 0xff;

impl Cqe {
    fn invalid() -> Self {
        Self([AtomicU64::new(0), AtomicU64::new(INVALID_OPCODE << 32)])
    }
}

/// What the stub's "device" and a CQ's poller share.
struct CqShared {
    id: u32,
    ring: Box<[Cqe]>,
    /// The device's producer index (free running), behind the lock every producer takes.
    producer: Mutex<u32>,
    /// The consumer index the poller published (free running), read by producers.
    consumed: AtomicU32,
}

impl CqShared {
    fn slots(&self) -> u32 {
        self.ring.len() as u32
    }

    /// Writes one completion, or `false` if the ring is full (an overrun).
    fn produce(&self, wr_id: u64, qpn: u32, opcode: WcOpcode) -> bool {
        let mut prod = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        if prod.wrapping_sub(self.consumed.load(Ordering::Acquire)) >= self.slots() {
            return false;
        }
        let owner = u64::from((*prod / self.slots()) & 1);
        let cqe = &self.ring[(*prod % self.slots()) as usize];
        cqe.0[0].store(wr_id, Ordering::Relaxed);
        let word = u64::from(qpn & 0xff_ffff) | u64::from(opcode.0) << 32 | owner << 63;
        cqe.0[1].store(word, Ordering::Release);
        *prod = prod.wrapping_add(1);
        true
    }

    /// Marks the unconsumed completions of `qpn` as flushed-and-scrubbed (status 0xff, never
    /// reported); returns how many.
    fn scrub(&self, qpn: u32) -> usize {
        let prod = *self.producer.lock().unwrap_or_else(|e| e.into_inner());
        let mut scrubbed = 0;
        let mut at = self.consumed.load(Ordering::Acquire);
        while at != prod {
            let cqe = &self.ring[(at % self.slots()) as usize];
            let word = cqe.0[1].load(Ordering::Acquire);
            if word as u32 & 0xff_ffff == qpn && (word >> 24) & 0xff != SCRUBBED {
                cqe.0[1].store(word | SCRUBBED << 24, Ordering::Release);
                scrubbed += 1;
            }
            at = at.wrapping_add(1);
        }
        scrubbed
    }
}

// SAFETY: the stub passes no driver request bytes.
unsafe impl ProviderContext for StubContext {
    fn alloc_pd(&self, kernel: KernelCall<'_, ()>) -> Result<()> {
        kernel(&[], &mut [0; DRIVER_OUT])?;
        self.log.push(Hook::AllocPd);
        Ok(())
    }

    fn reg_mr(&self, kernel: KernelCall<'_, ()>) -> Result<()> {
        kernel(&[], &mut [0; DRIVER_OUT])?;
        self.log.push(Hook::RegMr);
        Ok(())
    }

    fn create_cq(&self, cqe: u32, kernel: CreateCqCall<'_>) -> Result<Box<dyn CqRing>> {
        let slots = (cqe + 1).next_power_of_two();
        // As mlx5: the ring is allocated before the kernel call, which asks for it less one.
        let ring: Box<[Cqe]> = (0..slots).map(|_| Cqe::invalid()).collect();
        let created = kernel(slots - 1, &[], &mut [0; DRIVER_OUT])?;
        let id = self.next_cq.fetch_add(1, Ordering::Relaxed);
        self.log.push(Hook::CreateCq {
            id,
            asked: slots - 1,
            granted: created.cqe,
        });
        Ok(Box::new(StubCq {
            shared: Arc::new(CqShared {
                id,
                ring,
                producer: Mutex::new(0),
                consumed: AtomicU32::new(0),
            }),
            ci: 0,
            scratch: vec![WorkCompletion::default(); slots as usize].into_boxed_slice(),
            file: self.file.clone(),
            handle: created.handle,
            log: self.log.clone(),
        }))
    }

    fn create_qp(&self, request: &QpRequest<'_>, kernel: CreateQpCall<'_>) -> Result<ProviderQp> {
        let half = |ring: &dyn CqRing| {
            ring.as_any()
                .downcast_ref::<StubCq>()
                .map(|cq| cq.shared.clone())
                .ok_or_else(|| Error::invalid("CREATE_QP", "a CQ of another provider"))
        };
        let (send_cq, recv_cq) = (half(request.send_cq)?, half(request.recv_cq)?);
        // The stub's own limits, reported back instead of what the kernel granted.
        let cap = QpCap {
            max_inline_data: 0,
            ..request.cap
        };
        let created = kernel(cap, &[], &mut [0; DRIVER_OUT])?;
        self.log.push(Hook::CreateQp {
            qpn: created.qpn,
            send_cq: send_cq.id,
            recv_cq: recv_cq.id,
            srq: request.srq.is_some(),
        });
        self.qps.lock().insert(created.qpn, [send_cq.clone(), recv_cq]);
        Ok(ProviderQp {
            queues: Box::new(StubQp {
                qpn: created.qpn,
                qp_type: request.qp_type,
                max_send_wr: cap.max_send_wr,
                send_cq,
                qps: self.qps.clone(),
                log: self.log.clone(),
            }),
            cap,
        })
    }

    fn create_srq(&self, _: u32, _: u32, kernel: KernelCall<'_, SrqCreated>) -> Result<Box<dyn SrqQueue>> {
        kernel(&[], &mut [0; DRIVER_OUT])?;
        Ok(Box::new(StubSrq { log: self.log.clone() }))
    }

    fn create_ah(&self, _attr: &AhAttr, _sgid_type: Option<GidType>, kernel: KernelCall<'_, u32>) -> Result<u64> {
        kernel(&[], &mut [0; DRIVER_OUT])?;
        let data = self.next_ah.fetch_add(1, Ordering::Relaxed);
        self.log.push(Hook::CreateAh { data });
        Ok(data)
    }

    fn destroy_ah(&self, data: u64) {
        self.log.push(Hook::DestroyAh { data });
    }
}

/// A stub CQ's consumer side.
struct StubCq {
    shared: Arc<CqShared>,
    /// Consumer index (free running).
    ci: u32,
    /// Completions translated for [`CqRing::ready_run`], one slot per ring slot.
    scratch: Box<[WorkCompletion]>,
    file: Arc<DeviceFile>,
    handle: u32,
    log: HookLog,
}

impl StubCq {
    /// The completion at `ci + ahead`, if the device wrote it (owner bit of this pass).
    fn ready_at(&self, ahead: u32) -> Option<(u64, u64)> {
        let at = self.ci.wrapping_add(ahead);
        let slots = self.shared.slots();
        let cqe = &self.shared.ring[(at % slots) as usize];
        let word = cqe.0[1].load(Ordering::Acquire);
        let pass = u64::from((at / slots) & 1);
        let valid = (word >> 32) & 0xff != INVALID_OPCODE && word >> 63 == pass;
        valid.then(|| (cqe.0[0].load(Ordering::Relaxed), word))
    }

    /// Takes up to `max` completions into `out` (skipping scrubbed ones), returns how many.
    fn take(&mut self, out: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some((wr_id, word)) = self.ready_at(0) else { break };
            self.ci = self.ci.wrapping_add(1);
            if (word >> 24) & 0xff == SCRUBBED {
                continue;
            }
            let mut wc = WorkCompletion::default();
            wc.wr_id = wr_id;
            wc.status = WcStatus::SUCCESS;
            wc.opcode = WcOpcode((word >> 32) as u32 & 0xff);
            wc.qp_num = word as u32 & 0xff_ffff;
            out[n] = wc;
            n += 1;
        }
        self.shared.consumed.store(self.ci, Ordering::Release);
        n
    }

    /// Whether the kernel still has this CQ: REQ_NOTIFY_CQ on a destroyed handle is EINVAL.
    fn kernel_cq_alive(&self) -> bool {
        let req = ReqNotifyCq {
            cq_handle: self.handle,
            solicited_only: 0,
        };
        // SAFETY: the request holds no user pointers.
        let probe: Result<()> =
            unsafe { cmd::execute(self.file.as_fd(), "probe", command::REQ_NOTIFY_CQ, &req, &[], &mut []) };
        probe.is_ok()
    }
}

impl Drop for StubCq {
    fn drop(&mut self) {
        let kernel_cq_alive = self.kernel_cq_alive();
        self.log.push(Hook::CqRingFreed {
            id: self.shared.id,
            kernel_cq_alive,
        });
    }
}

// SAFETY: `ready_run` describes `scratch`, which only `&mut self` methods change; no driver
// request bytes.
unsafe impl CqRing for StubCq {
    fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
        self.take(wc)
    }

    fn ready_run(&mut self) -> ReadyRun {
        // Translates into the scratch array; the ring slots are consumed at once, which the
        // contract allows a translating provider (`consume` then has nothing left to do).
        let mut scratch = std::mem::take(&mut self.scratch);
        let len = self.take(&mut scratch);
        self.scratch = scratch;
        let first = NonNull::from(&mut self.scratch[0]);
        ReadyRun {
            first,
            before_wrap: len,
            wrapped: first,
            len,
            stride: size_of::<WorkCompletion>(),
        }
    }

    fn consume(&mut self, _: usize) {}

    fn resize(&mut self, _: u32, _: ResizeCqCall<'_>) -> Result<u32> {
        Err(Error::Unsupported {
            verb: "RESIZE_CQ",
            what: "resizing a stub CQ",
        })
    }

    fn arm(&mut self, solicited_only: bool, events: u32, _kernel: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        // Armed in "user space", as mlx5 does: no kernel command.
        self.log.push(Hook::Arm {
            id: self.shared.id,
            solicited_only,
            events,
        });
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A stub QP: sends complete at once into the send CQ.
struct StubQp {
    qpn: u32,
    qp_type: QpType,
    /// Its send queue's depth, all of it always free: sends complete as they are posted.
    max_send_wr: u32,
    send_cq: Arc<CqShared>,
    qps: QpTable,
    log: HookLog,
}

// SAFETY: the stub passes no driver request bytes.
unsafe impl crate::provider::QpQueues for StubQp {
    unsafe fn post_send(&mut self, wrs: SendList<'_, '_>) -> Result<()> {
        let mut taken = 0;
        let mut result = Ok(());
        for (index, wr) in wrs.iter(self.qp_type).enumerate() {
            let done = wr.and_then(|wr| {
                let signaled = wr.flags.contains(SendFlags::SIGNALED);
                match !signaled || self.send_cq.produce(wr.wr_id, self.qpn, WcOpcode::SEND) {
                    true => Ok(()),
                    false => Err(WrReject::QueueFull),
                }
            });
            if let Err(reason) = done {
                result = Err(Error::WorkRequest {
                    verb: "post_send",
                    index,
                    reason,
                });
                break;
            }
            taken += 1;
        }
        self.log.push(Hook::PostSend { qpn: self.qpn, taken });
        result
    }

    unsafe fn post_recv(&mut self, _: &[RecvWr<'_>]) -> Result<()> {
        Ok(())
    }

    /// Sends complete as they are posted (as long as the send CQ has room).
    fn send_room(&mut self) -> u32 {
        self.max_send_wr
    }

    fn modify(&mut self, next: Option<QpState>, kernel: KernelCall<'_, ()>) -> Result<()> {
        kernel(&[], &mut [])?;
        let scrubbed = if next == Some(QpState::Reset) {
            self.qps.scrub(self.qpn, false)
        } else {
            0
        };
        self.log.push(Hook::Modify {
            qpn: self.qpn,
            state: next,
            scrubbed,
        });
        Ok(())
    }

    fn destroyed(&mut self) {
        let scrubbed = self.qps.scrub(self.qpn, true);
        self.log.push(Hook::QpDestroyed {
            qpn: self.qpn,
            scrubbed,
        });
    }
}

/// A stub SRQ: takes receives and does nothing with them.
struct StubSrq {
    log: HookLog,
}

impl Drop for StubSrq {
    fn drop(&mut self) {
        self.log.push(Hook::SrqFreed);
    }
}

// SAFETY: the stub passes no driver request bytes.
unsafe impl SrqQueue for StubSrq {
    unsafe fn post_recv(&mut self, _: &[RecvWr<'_>]) -> Result<()> {
        Ok(())
    }

    fn modify(&mut self, _: bool, kernel: KernelInput<'_>) -> Result<()> {
        kernel(&[])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
