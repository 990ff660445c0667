//! The provider contract, through the stub provider (`uverbs::provider::stub`): user-allocated
//! rings in mlx5's shape over the real kernel objects of the test device. Each hook must run
//! at its moment, and a provider's ring must outlive every kernel object that can still use it.

mod common;

use common::*;
use uverbs::provider::stub::{Hook, HookLog, Stub};
use uverbs::*;

/// A context on the test device whose provider is the stub, and the stub's log.
fn stub_context() -> (Context, HookLog) {
    let name = std::env::var("UVERBS_TEST_DEVICE").ok();
    let devices = uverbs::devices().unwrap();
    let device = devices
        .iter()
        .find(|d| name.as_deref().is_none_or(|n| d.name == n))
        .expect("an RDMA device: run with `cargo xtask test`");
    let log = HookLog::default();
    let ctx = Context::open_with(device, &Stub::new(device, log.clone())).unwrap();
    (ctx, log)
}

fn connect(qp: &mut Qp, ctx: &Context) {
    let path = loopback_path(ctx);
    qp.to_init(1, AccessFlags::empty()).unwrap();
    qp.to_rtr(path, qp.qpn(), 0, Mtu::Mtu1024).unwrap();
    qp.to_rts(0).unwrap();
}

fn send(id: u64, signaled: bool) -> SendWr<'static> {
    let wr = SendWr::new(id, SendOp::Send, &[]);
    if signaled {
        wr
    } else {
        wr.set_flags(SendFlags::empty())
    }
}

#[test]
fn every_hook_runs_at_its_moment() {
    let (ctx, log) = stub_context();
    let pd = ctx.alloc_pd().unwrap();
    let _mr = pd.alloc_mr(4096, LocalAccess::LOCAL_WRITE).unwrap();
    assert_eq!(log.take(), [Hook::AllocPd, Hook::RegMr], "PD and MR carry driver data");

    let mut cq = ctx.create_cq(10).unwrap();
    let created = log.take();
    let [Hook::CreateCq { id, asked: 15, granted }] = created[..] else {
        panic!("the stub chose the kernel's CQ size (16 slots, cqe 15): {created:?}")
    };
    assert!(granted >= 15 && cq.capacity() == granted, "{granted} {}", cq.capacity());

    let mut init = QpInit::new(QpType::Rc, &cq, &cq);
    init.cap.max_inline_data = 64;
    let mut qp = pd.create_qp(&init).unwrap();
    let qpn = qp.qpn();
    assert_eq!(
        log.take(),
        [Hook::CreateQp {
            qpn,
            send_cq: id,
            recv_cq: id,
            srq: false
        }],
        "the QP was linked to its CQ's provider half"
    );
    assert_eq!(qp.cap().max_inline_data, 0, "the provider's own limit is reported");

    connect(&mut qp, &ctx);
    let moves: Vec<_> = [QpState::Init, QpState::Rtr, QpState::Rts]
        .map(|s| Hook::Modify {
            qpn,
            state: Some(s),
            scrubbed: 0,
        })
        .into();
    assert_eq!(log.take(), moves);

    // The stub's device completes signaled sends at once into the user ring.
    unsafe { qp.post_send(&[send(1, true), send(2, false), send(3, true), send(4, true)]) }.unwrap();
    assert_eq!(log.take(), [Hook::PostSend { qpn, taken: 4 }]);
    let mut wc = [WorkCompletion::default(); 8];
    let n = cq.poll(&mut wc);
    let got: Vec<_> = wc[..n].iter().map(|c| (c.wr_id, c.qp_num, c.status)).collect();
    assert_eq!(got, [1, 3, 4].map(|i| (i, qpn, WcStatus::SUCCESS)));

    // RESET scrubs the QP's unpolled completions from its CQ.
    unsafe { qp.post_send(&[send(5, true), send(6, true)]) }.unwrap();
    qp.modify(&QpAttr {
        state: Some(QpState::Reset),
        ..Default::default()
    })
    .unwrap();
    let reset = log.take();
    assert_eq!(
        reset[1..],
        [Hook::Modify {
            qpn,
            state: Some(QpState::Reset),
            scrubbed: 2
        }]
    );
    assert_eq!(cq.poll(&mut wc), 0, "scrubbed completions are never reported");

    // Arming goes to the provider, which sees the delivered-event count.
    cq.req_notify(true).unwrap();
    assert_eq!(
        log.take(),
        [Hook::Arm {
            id,
            solicited_only: true,
            events: 0
        }]
    );

    // The AH's provider half is released once the kernel AH is gone.
    let ah = pd.create_ah(&loopback_path(&ctx)).unwrap();
    drop(ah);
    assert_eq!(log.take(), [Hook::CreateAh { data: 1 }, Hook::DestroyAh { data: 1 }]);

    connect(&mut qp, &ctx);
    log.take();
    unsafe { qp.post_send(&[send(7, true)]) }.unwrap();
    drop(qp);
    assert_eq!(
        log.take(),
        [Hook::PostSend { qpn, taken: 1 }, Hook::QpDestroyed { qpn, scrubbed: 1 }],
        "after the kernel destroy the provider scrubs and forgets the QP"
    );
    assert_eq!(cq.poll(&mut wc), 0);
}

#[test]
fn transport_rules_are_checked_before_the_provider_sees_a_request() {
    let (ctx, log) = stub_context();
    let pd = ctx.alloc_pd().unwrap();
    let mut cq = ctx.create_cq(16).unwrap();
    let mut qp = pd.create_qp(&QpInit::new(QpType::Uc, &cq, &cq)).unwrap();
    connect(&mut qp, &ctx);
    let mr = pd.alloc_mr(64, LocalAccess::LOCAL_WRITE).unwrap();
    let sge = [mr.sge(0, 8).unwrap()];
    let remote = Remote { addr: 0, rkey: 1 };
    log.take();
    let wrs = [
        send(1, true),
        send(2, true),
        SendWr::new(3, SendOp::RdmaRead(remote), &sge),
        send(4, true),
    ];
    let err = unsafe { qp.post_send(&wrs) }.unwrap_err();
    assert!(
        matches!(
            err,
            Error::WorkRequest {
                index: 2,
                reason: WrReject::OpcodeNotSupported,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        log.take(),
        [Hook::PostSend {
            qpn: qp.qpn(),
            taken: 2
        }],
        "the provider took those before it, then got it as an error"
    );
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut wc), 2);
}

/// The ring must stay alive while the kernel CQ may write into it: dropping the `Cq` handle
/// while a QP still uses the CQ parks the ring until the last QP is gone and the kernel CQ
/// destroyed. (Before the rings were parked, the ring was freed with the handle, while the
/// kernel CQ was alive.)
#[test]
fn a_cq_ring_outlives_its_handle_until_the_kernel_cq_is_destroyed() {
    let (ctx, log) = stub_context();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let srq = pd.create_srq(&SrqInit::new(16, 1)).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq, &cq);
    init.srq = Some(&srq);
    let qp = pd.create_qp(&init).unwrap();
    let qpn = qp.qpn();
    let Hook::CreateCq { id, .. } = log.take()[1] else {
        panic!("CREATE_CQ logged second")
    };
    drop(cq);
    drop(srq);
    assert_eq!(log.take(), [], "the QP keeps the kernel CQ and SRQ: their rings stay");
    drop(qp);
    assert_eq!(
        log.take(),
        [
            Hook::QpDestroyed { qpn, scrubbed: 0 },
            Hook::CqRingFreed {
                id,
                kernel_cq_alive: false
            },
            Hook::SrqFreed,
        ],
        "freed after the kernel destroyed the QP, then the CQ and the SRQ"
    );

    let lone = ctx.create_cq(16).unwrap();
    log.take();
    drop(lone);
    assert!(
        matches!(
            log.take()[..],
            [Hook::CqRingFreed {
                kernel_cq_alive: false,
                ..
            }]
        ),
        "a CQ no QP uses: its ring goes right after the kernel CQ"
    );
}
