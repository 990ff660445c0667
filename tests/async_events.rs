//! Async events the rxe driver raises, read from the context's async fd as typed values:
//! SQ drained, port down and up (on a dummy netdev this test creates), SRQ limit and CQ error
//! are in `srq.rs` and `cq.rs`.

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;
use uverbs::*;

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

#[test]
fn sq_drained_event_after_moving_to_sqd() {
    let mut p = Pair::new();
    p.a.qp
        .modify(&QpAttr {
            state: Some(QpState::Sqd),
            en_sqd_async_notify: Some(true),
            ..Default::default()
        })
        .unwrap();
    let ev = p.ctx.get_async_event(WAIT).unwrap().expect("SQ drained event");
    assert_eq!(
        ev,
        AsyncEvent {
            kind: AsyncEventKind::SQ_DRAINED,
            target: EventTarget::Qp(p.a.qp.user_handle())
        }
    );
    let info = p.a.qp.query().unwrap();
    assert_eq!(info.attr.state, Some(QpState::Sqd));
    // Back to RTS, traffic flows again.
    p.a.qp
        .modify(&QpAttr {
            state: Some(QpState::Rts),
            ..Default::default()
        })
        .unwrap();
    let sge = [p.a.mr.sge(0, 8).unwrap()];
    let remote = Remote {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey(),
    };
    unsafe { p.a.qp.post_send(&[SendWr::new(3, SendOp::RdmaWrite(remote), &sge)]) }.unwrap();
    assert_eq!(poll_n(&mut p.a.cq, 1, 1)[0].status, WcStatus::SUCCESS);
}

fn run(cmd: &str) {
    let status = Command::new("sh").arg("-c").arg(cmd).status().expect("sh");
    assert!(status.success(), "`{cmd}` failed: {status}");
}

/// An rxe device on a dummy netdev, removed again on drop.
struct DummyRxe;

impl DummyRxe {
    fn new() -> Self {
        let _ = Command::new("sh")
            .arg("-c")
            .arg("rdma link delete rxe_uvt 2>/dev/null; ip link del uvt0 2>/dev/null")
            .status();
        run("modprobe dummy && ip link add uvt0 type dummy && ip link set uvt0 up && rdma link add rxe_uvt type rxe netdev uvt0");
        Self
    }
}

impl Drop for DummyRxe {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .arg("-c")
            .arg("rdma link delete rxe_uvt; ip link del uvt0")
            .status();
    }
}

#[test]
fn port_error_and_active_when_the_netdev_goes_down_and_up() {
    let _dev = DummyRxe::new();
    let ctx = uverbs::open(Some("rxe_uvt")).expect("open rxe_uvt");
    assert_eq!(ctx.query_port(1).unwrap().state, PortState::ACTIVE);
    run("ip link set uvt0 down");
    let ev = ctx.get_async_event(WAIT).unwrap().expect("port error event");
    assert_eq!(
        ev,
        AsyncEvent {
            kind: AsyncEventKind::PORT_ERR,
            target: EventTarget::Port(1)
        }
    );
    assert_eq!(ctx.query_port(1).unwrap().state, PortState::DOWN);
    run("ip link set uvt0 up");
    let mut kinds = Vec::new();
    while let Some(ev) = ctx.get_async_event(Some(Duration::from_secs(2))).unwrap() {
        kinds.push(ev.kind);
    }
    assert!(kinds.contains(&AsyncEventKind::PORT_ACTIVE), "got {kinds:?}");
    assert_eq!(ctx.query_port(1).unwrap().state, PortState::ACTIVE, "again");
}
