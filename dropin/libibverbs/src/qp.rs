//! Queue pairs: `create_qp` (and the creation `create_qp_ex` builds on), `modify_qp`,
//! `query_qp`, `destroy_qp`, `post_send`, `post_recv`.

use crate::abi::{
    ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_ex, ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr, verbs_qp, VERBS_QP_EX,
};
use crate::ah::{ah_from, ah_to, Ah};
use crate::cq::{cq_ref, Cq};
use crate::event::{destroy_core, init_sync, wait_for_acks, Slot};
use crate::ffi;
use crate::pd::{pd_ref, Pd};
use crate::spin::SpinLock;
use crate::srq::{srq_ref, Srq};
use crate::wr::{nth, post_recv_list, send_op, sges};
use crate::wr_builder::WrBuilder;
use libc::c_int;
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use uverbs::{
    AccessFlags, AltPath, CSendWr, MigState, Mtu, QpAttr, QpAttrMask, QpState, QpType, SendFlags, SendWr, WrReject,
};

/// A QP: `verbs_qp`, then the `uverbs` QP, the objects whose use counts it holds, and the
/// `ibv_wr_*` batch being built (see [`crate::qp_ex`]).
#[repr(C)]
pub struct Qp {
    vqp: verbs_qp,
    pub(crate) qp: SpinLock<uverbs::Qp>,
    pd: *const Pd,
    send_cq: *const Cq,
    recv_cq: *const Cq,
    srq: *const Srq,
    /// Used only under `qp`'s lock.
    pub(crate) builder: UnsafeCell<WrBuilder>,
}

impl Qp {
    /// The QP whose `ibv_qp_ex` is `qpx`.
    ///
    /// # Safety
    /// `qpx` must be the `ibv_qp_ex` of a live QP made by [`create_qp_ex`].
    #[inline(always)]
    pub(crate) unsafe fn from_ex<'a>(qpx: *mut ibv_qp_ex) -> &'a Qp {
        // SAFETY: `ibv_qp_ex` is at the start of `verbs_qp`, the first field of a boxed `Qp`.
        unsafe { &*qpx.cast::<Qp>() }
    }
}

/// # Safety
/// `qp` must be a live QP made by [`create_qp`].
pub(crate) unsafe fn qp_ref<'a>(qp: *mut ibv_qp) -> &'a Qp {
    // SAFETY: `ibv_qp` is at the start of `verbs_qp`, the first field of a boxed `Qp`.
    unsafe { &*qp.cast::<Qp>() }
}

pub unsafe extern "C" fn create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    ffi::guard("create_qp", std::ptr::null_mut(), || {
        // SAFETY: libibverbs passes one of our PDs and the caller's live attributes.
        unsafe { create_qp_common(pd, &mut *attr, QpEx::No) }
    })
}

/// Whether a QP is made by `create_qp_ex`, and with which `ibv_wr_*` interface.
#[derive(Clone, Copy)]
pub(crate) enum QpEx<'a> {
    /// By `create_qp`.
    No,
    /// By `create_qp_ex` without `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
    Yes,
    /// By `create_qp_ex` with `send_ops_flags`: fills in the `ibv_wr_*` entry points asked for
    /// (`crate::qp_ex`).
    WithSendOps(&'a dyn Fn(&mut ibv_qp_ex)),
}

/// Creates a QP, extended as `ex` says.
///
/// # Safety
/// `pd` must be one of our PDs; `attr`'s CQ pointers must be our CQs.
pub(crate) unsafe fn create_qp_common(pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr, ex: QpEx<'_>) -> *mut ibv_qp {
    // SAFETY: per the contract.
    let p = unsafe { pd_ref(pd) };
    let Some(qp_type) = u8::try_from(attr.qp_type).ok().and_then(QpType::from_raw) else {
        return ffi::refuse_null("create_qp", libc::EOPNOTSUPP, &format!("QP type {}", attr.qp_type));
    };
    if attr.send_cq.is_null() || attr.recv_cq.is_null() {
        return ffi::refuse_null("create_qp", libc::EINVAL, "missing CQ");
    }
    // SAFETY: per the contract.
    let (scq, rcq) = unsafe { (cq_ref(attr.send_cq), cq_ref(attr.recv_cq)) };
    let same = std::ptr::eq(scq, rcq);
    // Lock in address order so two threads creating QPs on the same two CQs cannot deadlock.
    let (first, second) = if (scq as *const Cq) <= (rcq as *const Cq) {
        (scq, rcq)
    } else {
        (rcq, scq)
    };
    let g1 = first.cq.lock();
    let g2 = (!same).then(|| second.cq.lock());
    let (send_ref, recv_ref): (&uverbs::Cq, &uverbs::Cq) = match &g2 {
        None => (&g1, &g1),
        Some(g2) if std::ptr::eq(first, scq) => (&g1, g2),
        Some(g2) => (g2, &g1),
    };
    // SAFETY: a non-null `srq` is one of our SRQs (libibverbs contract).
    let srq = (!attr.srq.is_null()).then(|| unsafe { srq_ref(attr.srq) });
    let srq_guard = srq.map(|s| s.srq.lock());
    // Events name the QP by its `ibv_qp` pointer (see `Slot`).
    let slot = Slot::<Qp>::new();
    let mut init = uverbs::QpInit::new(qp_type, send_ref, recv_ref);
    init.user_handle = Some(slot.user_handle());
    init.cap = attr.cap;
    init.sq_sig_all = attr.sq_sig_all != 0;
    init.srq = srq_guard.as_deref();
    let created = p.pd.create_qp(&init);
    drop(srq_guard);
    drop(g2);
    drop(g1);
    let mut qp = match created {
        Ok(qp) => qp,
        Err(e) => return ffi::fail_null("create_qp", &e),
    };
    attr.cap = qp.cap();
    // SAFETY: all-zero is a valid verbs_qp; the fields libibverbs reads are set below and the
    // mutex/cond initialized in place once boxed.
    let mut vqp: verbs_qp = unsafe { std::mem::zeroed() };
    let base = &mut vqp.qp_ex.qp_base;
    base.context = p.ibv.context;
    base.qp_context = attr.qp_context;
    base.pd = pd;
    base.send_cq = attr.send_cq;
    base.recv_cq = attr.recv_cq;
    base.srq = attr.srq;
    base.handle = qp.handle();
    base.qp_num = qp.qpn();
    base.state = QpState::Reset as c_int;
    base.qp_type = attr.qp_type;
    let mut builder = WrBuilder::none();
    if !matches!(ex, QpEx::No) {
        // `ibv_qp_to_qp_ex` hands out the `ibv_qp_ex` of QPs made by create_qp_ex.
        vqp.comp_mask |= VERBS_QP_EX;
    }
    if let QpEx::WithSendOps(fill) = ex {
        fill(&mut vqp.qp_ex);
        // A fresh QP's room is its whole send queue.
        builder = WrBuilder::new(&attr.cap, qp.send_room());
    }
    p.users.fetch_add(1, Ordering::AcqRel);
    scq.users.fetch_add(1, Ordering::AcqRel);
    rcq.users.fetch_add(1, Ordering::AcqRel);
    if let Some(s) = srq {
        s.users.fetch_add(1, Ordering::AcqRel);
    }
    let b = slot.fill(Qp {
        vqp,
        qp: SpinLock::new(qp),
        pd: p,
        send_cq: scq,
        recv_cq: rcq,
        srq: srq.map_or(std::ptr::null(), |s| s as *const Srq),
        builder: UnsafeCell::new(builder),
    });
    // SAFETY: `b` is live and not yet shared.
    unsafe {
        init_sync(
            std::ptr::addr_of_mut!((*b).vqp.qp_ex.qp_base.mutex),
            std::ptr::addr_of_mut!((*b).vqp.qp_ex.qp_base.cond),
        );
    }
    b.cast::<ibv_qp>()
}

/// `destroy_qp`, as `ibv_cmd_destroy_qp`: the kernel destroy, then a wait until the program
/// has acknowledged every async event the kernel reported for the QP.
pub unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    ffi::guard("destroy_qp", libc::EIO, || {
        let q = qp.cast::<Qp>();
        // SAFETY: libibverbs passes one of our QPs, made by `create_qp_common`, which the
        // program does not use from other threads while destroying it; on success the field
        // is never read again.
        let reported = match unsafe { destroy_core(std::ptr::addr_of_mut!((*q).qp), uverbs::Qp::destroy) } {
            Ok(r) => r,
            Err(e) => return ffi::fail("destroy_qp", &e),
        };
        // SAFETY: PDs, CQs and SRQs outlive the QPs counted in them (their destroy refuses);
        // the kernel no longer counts this one.
        unsafe {
            (*(*q).pd).users.fetch_sub(1, Ordering::AcqRel);
            (*(*q).send_cq).users.fetch_sub(1, Ordering::AcqRel);
            (*(*q).recv_cq).users.fetch_sub(1, Ordering::AcqRel);
            if !(*q).srq.is_null() {
                (*(*q).srq).users.fetch_sub(1, Ordering::AcqRel);
            }
        }
        // SAFETY: `qp` is live until freed below, and `create_qp_common` initialized its mutex
        // and cond, which nobody uses after the wait.
        unsafe {
            let (mutex, cond) = (std::ptr::addr_of_mut!((*qp).mutex), std::ptr::addr_of_mut!((*qp).cond));
            wait_for_acks(
                mutex,
                cond,
                &[(std::ptr::addr_of!((*qp).events_completed), reported.r#async)],
            );
            libc::pthread_mutex_destroy(mutex);
            libc::pthread_cond_destroy(cond);
        }
        // SAFETY: made by `create_qp_common` with Box::into_raw (`MaybeUninit<Qp>` has `Qp`'s
        // layout); its `uverbs` half is gone and the rest needs no drop; this is its last use.
        drop(unsafe { Box::from_raw(q.cast::<MaybeUninit<Qp>>()) });
        0
    })
}

/// The attributes `mask` selects, the bits no attribute of `uverbs` holds passed on bare, as
/// rdma-core v44's `ibv_cmd_modify_qp` passes them to the kernel; or why the mask is refused
/// before the kernel.
fn qp_attr_from(a: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, String> {
    // `enum ibv_qp_attr_mask` is an int of bits; any bit pattern is a mask.
    let mask = QpAttrMask::from_bits_retain(mask as u32);
    // The rate limit and every bit past it need MODIFY_QP_EX, which rdma-core v44's rxe never
    // sends: its `ibv_cmd_modify_qp` refuses them with EOPNOTSUPP, as here.
    let needs_ex = QpAttrMask::from_bits_retain(!(QpAttrMask::RATE_LIMIT.bits() - 1));
    if mask.intersects(needs_ex) {
        return Err(format!(
            "attribute mask bits {:#x} need MODIFY_QP_EX (rate limit and past it)",
            mask.intersection(needs_ex).bits()
        ));
    }
    // `IBV_QP_CAP` and bits 21 to 24: MODIFY_QP has no value for them; the kernel answers.
    let bare_mask = mask.bare();
    let has = |bit: QpAttrMask| mask.contains(bit);
    let state = |v: c_int| {
        u8::try_from(v)
            .ok()
            .and_then(QpState::from_raw)
            .ok_or_else(|| format!("QP state {v}"))
    };
    Ok(QpAttr {
        state: has(QpAttrMask::STATE).then(|| state(a.qp_state)).transpose()?,
        cur_state: has(QpAttrMask::CUR_STATE).then(|| state(a.cur_qp_state)).transpose()?,
        en_sqd_async_notify: has(QpAttrMask::EN_SQD_ASYNC_NOTIFY).then_some(a.en_sqd_async_notify != 0),
        access: has(QpAttrMask::ACCESS_FLAGS).then_some(AccessFlags::from_bits_retain(a.qp_access_flags)),
        pkey_index: has(QpAttrMask::PKEY_INDEX).then_some(a.pkey_index),
        port_num: has(QpAttrMask::PORT).then_some(a.port_num),
        qkey: has(QpAttrMask::QKEY).then_some(a.qkey),
        ah: has(QpAttrMask::AV).then(|| ah_from(&a.ah_attr)),
        path_mtu: has(QpAttrMask::PATH_MTU)
            .then(|| {
                u8::try_from(a.path_mtu)
                    .ok()
                    .and_then(Mtu::from_raw)
                    .ok_or_else(|| format!("path MTU {}", a.path_mtu))
            })
            .transpose()?,
        timeout: has(QpAttrMask::TIMEOUT).then_some(a.timeout),
        retry_cnt: has(QpAttrMask::RETRY_CNT).then_some(a.retry_cnt),
        rnr_retry: has(QpAttrMask::RNR_RETRY).then_some(a.rnr_retry),
        rq_psn: has(QpAttrMask::RQ_PSN).then_some(a.rq_psn),
        max_rd_atomic: has(QpAttrMask::MAX_QP_RD_ATOMIC).then_some(a.max_rd_atomic),
        min_rnr_timer: has(QpAttrMask::MIN_RNR_TIMER).then_some(a.min_rnr_timer),
        sq_psn: has(QpAttrMask::SQ_PSN).then_some(a.sq_psn),
        max_dest_rd_atomic: has(QpAttrMask::MAX_DEST_RD_ATOMIC).then_some(a.max_dest_rd_atomic),
        dest_qpn: has(QpAttrMask::DEST_QPN).then_some(a.dest_qp_num),
        alt_path: has(QpAttrMask::ALT_PATH).then(|| AltPath {
            ah: ah_from(&a.alt_ah_attr),
            pkey_index: a.alt_pkey_index,
            port_num: a.alt_port_num,
            timeout: a.alt_timeout,
        }),
        // The kernel takes one byte; the core refuses (EINVAL) values that do not fit.
        path_mig_state: has(QpAttrMask::PATH_MIG_STATE).then_some(MigState(a.path_mig_state as u32)),
        bare_mask,
    })
}

pub unsafe extern "C" fn modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    ffi::guard("modify_qp", libc::EIO, || {
        // SAFETY: libibverbs passes one of our QPs and the caller's attributes.
        let (q, a) = unsafe { (qp_ref(qp), &*attr) };
        let attr = match qp_attr_from(a, mask) {
            Ok(attr) => attr,
            Err(why) => {
                ffi::verbose(format_args!("modify_qp: {why}"));
                return libc::EOPNOTSUPP;
            }
        };
        // libibverbs' ibv_modify_qp records the new state in `ibv_qp.state` on success.
        match q.qp.lock().modify(&attr) {
            Ok(()) => 0,
            Err(e) => ffi::fail("modify_qp", &e),
        }
    })
}

pub unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    ffi::guard("query_qp", libc::EIO, || {
        // SAFETY: libibverbs passes one of our QPs.
        let q = unsafe { qp_ref(qp) };
        let info = match q.qp.lock().query() {
            Ok(i) => i,
            Err(e) => return ffi::fail("query_qp", &e),
        };
        let i = &info.attr;
        let alt = i.alt_path;
        let out = ibv_qp_attr {
            qp_state: i.state.map_or(0, |s| s as c_int),
            cur_qp_state: i.cur_state.map_or(0, |s| s as c_int),
            path_mtu: i.path_mtu.map_or(0, |v| v as c_int),
            path_mig_state: i.path_mig_state.map_or(0, |m| m.0 as c_int),
            qkey: i.qkey.unwrap_or(0),
            rq_psn: i.rq_psn.unwrap_or(0),
            sq_psn: i.sq_psn.unwrap_or(0),
            dest_qp_num: i.dest_qpn.unwrap_or(0),
            qp_access_flags: i.access.map_or(0, |a| a.bits()),
            cap: info.cap,
            ah_attr: i.ah.as_ref().map(ah_to).unwrap_or_default(),
            alt_ah_attr: alt.map(|p| ah_to(&p.ah)).unwrap_or_default(),
            pkey_index: i.pkey_index.unwrap_or(0),
            alt_pkey_index: alt.map_or(0, |p| p.pkey_index),
            en_sqd_async_notify: u8::from(i.en_sqd_async_notify.unwrap_or(false)),
            sq_draining: u8::from(info.sq_draining),
            max_rd_atomic: i.max_rd_atomic.unwrap_or(0),
            max_dest_rd_atomic: i.max_dest_rd_atomic.unwrap_or(0),
            min_rnr_timer: i.min_rnr_timer.unwrap_or(0),
            port_num: i.port_num.unwrap_or(0),
            timeout: i.timeout.unwrap_or(0),
            retry_cnt: i.retry_cnt.unwrap_or(0),
            rnr_retry: i.rnr_retry.unwrap_or(0),
            alt_port_num: alt.map_or(0, |p| p.port_num),
            alt_timeout: alt.map_or(0, |p| p.timeout),
            rate_limit: 0,
        };
        // SAFETY: the caller's output structs; `qp` is live.
        unsafe {
            attr.write(out);
            let c = &(*qp);
            init.write(ibv_qp_init_attr {
                qp_context: c.qp_context,
                send_cq: c.send_cq,
                recv_cq: c.recv_cq,
                srq: c.srq,
                cap: info.cap,
                qp_type: c.qp_type,
                sq_sig_all: c_int::from(info.sq_sig_all),
            });
        }
        0
    })
}

pub unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    // No `ffi::guard`: see the crate docs.
    // As rdma-core's rxe: no `bad_wr` or no list is EINVAL; `bad_wr` is cleared first.
    if bad_wr.is_null() | wr.is_null() {
        // SAFETY: `bad_wr`, when not null, is writable per the libibverbs contract.
        return unsafe { refuse_no_list(bad_wr) };
    }
    // SAFETY: as above.
    unsafe { *bad_wr = std::ptr::null_mut() };
    // SAFETY: not null, tested above.
    let first = unsafe { NonNull::new_unchecked(wr.cast::<CSendWr>()) };
    // SAFETY: libibverbs passes one of our QPs; `wr` is the caller's list, live and unchanged
    // for the call with its SGE arrays and AHs (the ibv_post_send contract), whose buffers the
    // caller keeps valid until completion, the contract `uverbs::Qp::post_send` asks for.
    let posted = unsafe { qp_ref(qp).qp.lock().post_send_chain(first, slow_send_wr) };
    match posted {
        Ok(()) => 0,
        Err(
            e @ uverbs::Error::WorkRequest {
                reason: WrReject::WrongState(QpState::Init | QpState::Rtr),
                ..
            },
        ) => {
            // SAFETY: as above; `first` is `wr`.
            unsafe { post_send_connected(qp, wr, bad_wr, first, &e) }
        }
        // SAFETY: `wr` is the list posted; `bad_wr` is writable.
        Err(e) => unsafe { reject_send(wr, bad_wr, &e) },
    }
}

/// Whether `qp`'s device speaks iWARP (libibverbs' record of its transport).
///
/// # Safety
/// `qp` must be a live QP of ours, whose context and device libibverbs keeps live.
#[cold]
unsafe fn is_iwarp(qp: *mut ibv_qp) -> bool {
    const IBV_TRANSPORT_IWARP: c_int = 1;
    // SAFETY: per the contract.
    unsafe { (*(*(*qp).context).device).transport_type == IBV_TRANSPORT_IWARP }
}

/// `post_send` refused with `refused` because the QP is below RTS by our record. On iWARP that
/// is a connection that came up through librdmacm, which moves an iWARP QP to RTS in the
/// kernel with no `ibv_modify_qp` this provider sees: records the move and posts again. If the
/// connection is not up after all, the kernel refuses the empty doorbell that
/// `Qp::iwarp_connected_elsewhere` rings first (ENOTCONN), nothing is written, and `bad_wr`
/// names the first request. Elsewhere the refusal stands.
///
/// # Safety
/// As for [`post_send`], with `first` the non-null `wr`.
#[cold]
#[inline(never)]
unsafe fn post_send_connected(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
    first: NonNull<CSendWr>,
    refused: &uverbs::Error,
) -> c_int {
    // SAFETY: libibverbs passes one of our QPs, its context and device live.
    if !unsafe { is_iwarp(qp) } {
        // SAFETY: `wr` is the list posted; `bad_wr` is writable.
        return unsafe { reject_send(wr, bad_wr, refused) };
    }
    // SAFETY: libibverbs passes one of our QPs.
    let mut q = unsafe { qp_ref(qp) }.qp.lock();
    if let Err(e) = q.iwarp_connected_elsewhere() {
        drop(q);
        // The kernel refused the empty doorbell that asks whether the connection is up:
        // nothing was written into the send queue, so every request is refused.
        // SAFETY: `bad_wr` is writable per the libibverbs contract.
        unsafe { *bad_wr = wr };
        return ffi::fail("post_send", &e);
    }
    // SAFETY: as in `post_send`.
    let posted = unsafe { q.post_send_chain(first, slow_send_wr) };
    drop(q);
    match posted {
        Ok(()) => 0,
        // SAFETY: `wr` is the list posted; `bad_wr` is writable.
        Err(e) => unsafe { reject_send(wr, bad_wr, &e) },
    }
}

/// The `uverbs` form of a C send request the core does not read itself (any on a UD QP,
/// memory window binds), or `None` for one uverbs cannot express (unknown opcode, bad
/// scatter/gather list, UD request without an AH, bind without a window).
///
/// # Safety
/// `at` must be a live request of a list given to [`post_send`], whose SGE array, AH and MW
/// stay valid for `'a`.
unsafe fn slow_send_wr<'a>(at: NonNull<CSendWr>, qp_type: QpType) -> Option<SendWr<'a>> {
    // SAFETY: `at` came from the caller's `ibv_send_wr` (`post_send`), whose prefix
    // `CSendWr` is.
    let w = unsafe { &*at.as_ptr().cast::<ibv_send_wr>() };
    // SAFETY: per the contract.
    let (op, sg) = (send_op(w)?, unsafe { sges(w.sg_list, w.num_sge) }?);
    let swr = SendWr::new(w.wr_id, op, sg).set_flags(SendFlags::from_bits_retain(w.send_flags));
    if qp_type != QpType::Ud {
        return Some(swr);
    }
    // On UD QPs the `ud` arm is the one the caller filled.
    let ud = w.wr.as_ud();
    if ud.ah.is_null() {
        return None;
    }
    // SAFETY: a non-null AH in a work request is one of ours, live for `'a`.
    let ah = unsafe { &*ud.ah.cast::<Ah>() };
    Some(swr.to(ah.ah.ud_dest(ud.remote_qpn, ud.remote_qkey)))
}

/// `post_send` without `bad_wr` or without a list: EINVAL, `bad_wr` (if any) cleared.
///
/// # Safety
/// `bad_wr` is null or writable.
#[cold]
#[inline(never)]
unsafe fn refuse_no_list(bad_wr: *mut *mut ibv_send_wr) -> c_int {
    if !bad_wr.is_null() {
        // SAFETY: per the contract.
        unsafe { *bad_wr = std::ptr::null_mut() };
    }
    libc::EINVAL
}

/// Reports a refused or failed post: `bad_wr` names the request it stopped at, none when the
/// kernel refused the doorbell (all were written), the first for any other error.
///
/// # Safety
/// `wr` must be the list given to [`post_send`], `bad_wr` writable.
#[cold]
#[inline(never)]
unsafe fn reject_send(wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr, e: &uverbs::Error) -> c_int {
    // SAFETY: the provider stopped at `index`, counted from `wr` along the list; `bad_wr` is
    // writable per the libibverbs contract.
    unsafe {
        *bad_wr = match *e {
            uverbs::Error::WorkRequest { index, .. } => nth(wr, index, |w| w.next),
            // The kernel refused the doorbell (below RTS): every request is in the ring, and
            // `bad_wr` stays null, as librxe reports it.
            uverbs::Error::Kernel { .. } => std::ptr::null_mut(),
            _ => wr,
        }
    };
    ffi::fail("post_send", e)
}

/// `attach_mcast`: joins the QP to the multicast group `gid` (`lid` on InfiniBand).
pub unsafe extern "C" fn attach_mcast(qp: *mut ibv_qp, gid: *const [u8; 16], lid: u16) -> c_int {
    ffi::guard("attach_mcast", libc::EIO, || {
        // SAFETY: libibverbs passes one of our QPs and the caller's GID.
        let (q, gid) = unsafe { (qp_ref(qp), &*gid) };
        match q.qp.lock().attach_mcast(gid, lid) {
            Ok(()) => 0,
            Err(e) => ffi::fail("attach_mcast", &e),
        }
    })
}

/// `detach_mcast`.
pub unsafe extern "C" fn detach_mcast(qp: *mut ibv_qp, gid: *const [u8; 16], lid: u16) -> c_int {
    ffi::guard("detach_mcast", libc::EIO, || {
        // SAFETY: as in `attach_mcast`.
        let (q, gid) = unsafe { (qp_ref(qp), &*gid) };
        match q.qp.lock().detach_mcast(gid, lid) {
            Ok(()) => 0,
            Err(e) => ffi::fail("detach_mcast", &e),
        }
    })
}

pub unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    // No `ffi::guard`: see the crate docs.
    // As rdma-core's rxe: no `bad_wr` is EINVAL; it is cleared first; no list, a QP on an
    // SRQ (no receive queue) and a QP in RESET by libibverbs' record (C10-97.2.1) are EINVAL
    // with `bad_wr` left null.
    if bad_wr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-null `bad_wr` is writable per the libibverbs contract; libibverbs passes
    // one of our QPs.
    let refused = unsafe {
        *bad_wr = std::ptr::null_mut();
        wr.is_null() || !(*qp).srq.is_null() || (*qp).state == QpState::Reset as c_int
    };
    if refused {
        return libc::EINVAL;
    }
    // SAFETY: as in post_send.
    unsafe { post_recv_inner(qp_ref(qp), wr, bad_wr) }
}

unsafe fn post_recv_inner(q: &Qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    let mut guard = q.qp.lock();
    // SAFETY: forwarded contract; the C caller keeps receive buffers valid and untouched
    // until completion, the contract `uverbs::Qp::post_recv` asks for.
    unsafe { post_recv_list(wr, bad_wr, |batch| guard.post_recv(batch)) }
}
