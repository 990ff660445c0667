//! Memory windows and multicast: type 1 and type 2 windows grant remote writes once bound and
//! stop granting them once unbound or invalidated (locally or by the peer's send with
//! invalidate), as the device enforces; UD QPs attach to and detach from multicast groups.

mod common;

use common::*;
use uverbs::*;

/// Memory on B's side that windows may be bound to.
fn window_mr(p: &Pair) -> RemoteMr {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND;
    p.pd.alloc_remote_mr(1 << 16, access)
        .expect("alloc_remote_mr with MW_BIND")
}

/// Posts `op` (no buffers) on B and returns its completion.
fn post_on_b(p: &mut Pair, wr_id: u64, op: SendOp) -> WorkCompletion {
    // SAFETY: the request names no buffers.
    unsafe { p.b.qp.post_send(&[SendWr::new(wr_id, op, &[])]) }.expect("post on B");
    poll_n(&mut p.b.cq, 1, 1)[0]
}

/// A writes 16 bytes of `0x5a` to `addr` under `rkey`; returns the completion's status.
fn write_from_a(p: &mut Pair, addr: u64, rkey: u32) -> WcStatus {
    p.a.mr.fill(0, 16, 0x5a).unwrap();
    let sge = [p.a.mr.sge(0, 16).unwrap()];
    let op = SendOp::RdmaWrite(Remote { addr, rkey });
    // SAFETY: A's buffer is not touched until the completion.
    unsafe { p.a.qp.post_send(&[SendWr::new(9, op, &sge)]) }.expect("post the write");
    poll_n(&mut p.a.cq, 1, 1)[0].status
}

#[test]
fn type2_window_grants_writes_until_invalidated_locally() {
    let mut p = Pair::new();
    let mr = window_mr(&p);
    let mut mw = p.pd.alloc_mw(MwType::Type2).expect("alloc_mw");
    assert_eq!(mw.mw_type(), MwType::Type2);
    assert_ne!(mw.rkey(), mr.rkey());
    let at = mr.addr() + 4096;
    let bind = mw.bind(&mr, at, 4096, AccessFlags::REMOTE_WRITE, 0x17);
    assert_eq!(bind.new_rkey, (mw.rkey() & !0xff) | 0x17);
    let c = post_on_b(&mut p, 1, SendOp::BindMw(bind));
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (1, WcStatus::SUCCESS, WcOpcode::BIND_MW),
        "{c:?}"
    );
    mw.set_rkey(bind.new_rkey);

    assert_eq!(write_from_a(&mut p, at + 100, mw.rkey()), WcStatus::SUCCESS);
    assert_eq!(&mr.bytes()[4096 + 100..4096 + 116], &[0x5a; 16]);

    let c = post_on_b(&mut p, 2, SendOp::LocalInv { rkey: mw.rkey() });
    assert_eq!((c.status, c.opcode), (WcStatus::SUCCESS, WcOpcode::LOCAL_INV), "{c:?}");
    assert_eq!(write_from_a(&mut p, at + 200, mw.rkey()), WcStatus::REM_ACCESS_ERR);
    assert_eq!(&mr.bytes()[4096 + 200..4096 + 216], &[0; 16], "nothing landed");
    mw.dealloc().map_err(|(_, e)| e).expect("dealloc_mw");
}

#[test]
fn send_with_invalidate_revokes_the_peers_window() {
    let mut p = Pair::new();
    let mr = window_mr(&p);
    let mut mw = p.pd.alloc_mw(MwType::Type2).expect("alloc_mw");
    let bind = mw.bind(&mr, mr.addr(), 8192, AccessFlags::REMOTE_WRITE, 0x42);
    let c = post_on_b(&mut p, 1, SendOp::BindMw(bind));
    assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
    mw.set_rkey(bind.new_rkey);
    assert_eq!(write_from_a(&mut p, mr.addr(), mw.rkey()), WcStatus::SUCCESS);

    let rsge = [p.b.mr.sge(0, 64).unwrap()];
    // SAFETY: B's receive buffer is read only after the completion.
    unsafe { p.b.qp.post_recv(&[RecvWr::new(7, &rsge)]) }.unwrap();
    let sge = [p.a.mr.sge(0, 8).unwrap()];
    let op = SendOp::SendWithInv { rkey: mw.rkey() };
    // SAFETY: A's buffer is not touched until the completion.
    unsafe { p.a.qp.post_send(&[SendWr::new(3, op, &sge)]) }.unwrap();
    let s = poll_n(&mut p.a.cq, 1, 1)[0];
    assert_eq!((s.status, s.opcode), (WcStatus::SUCCESS, WcOpcode::SEND), "{s:?}");
    let r = poll_n(&mut p.b.cq, 1, 1)[0];
    assert_eq!((r.wr_id, r.status, r.byte_len), (7, WcStatus::SUCCESS, 8), "{r:?}");
    // rxe flags the invalidation with its own bit (verbs.h's IP_CSUM_OK), docs/kernel-facts.md.
    assert!(r.wc_flags.contains(WcFlags::IP_CSUM_OK), "{r:?}");
    assert_eq!(r.imm_data, mw.rkey(), "the invalidated rkey");
    assert_eq!(write_from_a(&mut p, mr.addr(), mw.rkey()), WcStatus::REM_ACCESS_ERR);
}

#[test]
fn type1_window_binds_under_a_new_key_and_unbinds() {
    let mut p = Pair::new();
    let mr = window_mr(&p);
    let mut mw = p.pd.alloc_mw(MwType::Type1).expect("alloc_mw");
    let old = mw.rkey();
    let key = (old as u8).wrapping_add(1);
    let bind = mw.bind(&mr, mr.addr(), 4096, AccessFlags::REMOTE_WRITE, key);
    let c = post_on_b(&mut p, 1, SendOp::BindMw(bind));
    assert_eq!((c.status, c.opcode), (WcStatus::SUCCESS, WcOpcode::BIND_MW), "{c:?}");
    mw.set_rkey(bind.new_rkey);
    assert_eq!(mw.rkey() >> 8, old >> 8, "the index stays");
    assert_eq!(write_from_a(&mut p, mr.addr() + 8, mw.rkey()), WcStatus::SUCCESS);
    assert_eq!(&mr.bytes()[8..24], &[0x5a; 16]);

    // A bind of length 0 unbinds: the key grants nothing.
    let unbind = mw.bind(&mr, 0, 0, AccessFlags::empty(), key.wrapping_add(1));
    let c = post_on_b(&mut p, 2, SendOp::BindMw(unbind));
    assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
    mw.set_rkey(unbind.new_rkey);
    assert_eq!(
        write_from_a(&mut p, mr.addr() + 32, mw.rkey()),
        WcStatus::REM_ACCESS_ERR
    );
    assert_eq!(&mr.bytes()[32..48], &[0; 16]);
}

#[test]
fn window_operations_take_no_buffers_and_windows_deallocate() {
    let mut p = Pair::new();
    let mr = window_mr(&p);
    let mw = p.pd.alloc_mw(MwType::Type2).expect("alloc_mw");
    let sge = [p.b.mr.sge(0, 8).unwrap()];
    let bind = SendOp::BindMw(mw.bind(&mr, mr.addr(), 64, AccessFlags::REMOTE_WRITE, 1));
    for op in [bind, SendOp::LocalInv { rkey: mw.rkey() }] {
        // SAFETY: refused before anything is posted.
        let e = unsafe { p.b.qp.post_send(&[SendWr::new(1, op, &sge)]) }.unwrap_err();
        assert!(
            matches!(
                e,
                Error::WorkRequest {
                    reason: WrReject::OpcodeNotSupported,
                    ..
                }
            ),
            "{e}"
        );
    }
    assert!(matches!(p.pd.alloc_mw(MwType::Type1).map(|m| m.dealloc()), Ok(Ok(()))));
}

#[test]
fn ud_qps_attach_to_and_detach_from_multicast_groups() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let mut ud = pd.create_qp(&QpInit::new(QpType::Ud, &cq, &cq)).unwrap();
    ud.ud_to_rts(1, 0x1234).unwrap();
    let group = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3];
    ud.attach_mcast(&group, 0).expect("attach a UD QP");
    ud.detach_mcast(&group, 0).expect("detach it");
    let again = ud.detach_mcast(&group, 0).unwrap_err();
    assert_eq!(again.errno(), Some(nix::errno::Errno::EINVAL), "detach twice: {again}");
    let rc = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let e = rc.attach_mcast(&group, 0).unwrap_err();
    assert_eq!(e.errno(), Some(nix::errno::Errno::EINVAL), "an RC QP: {e}");
}
