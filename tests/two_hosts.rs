//! Traffic across a real wire: two rxe devices on the two ends of a veth pair, so every
//! message leaves one netdev as a RoCEv2 packet and arrives on the other (counted on the
//! interfaces), instead of rxe's loopback shortcut.
//!
//! Topology: Linux 6.1's rxe opens its UDP socket and routes only in the initial network
//! namespace (in separate namespaces the GIDs appear but sends fail with LOC_QP_OP_ERR), so
//! both ends stay in the initial namespace with 169.254/16 addresses, and policy routing sends
//! traffic for each address out of the other end's veth instead of delivering it locally.

mod common;

use common::wire::{sh, Wire};
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use uverbs::*;

const A: &str = "rxe_wa";
const B: &str = "rxe_wb";

/// One end: a context on a device, its IPv4 RoCE v2 GID, PD, CQ, MR.
struct Host {
    _ctx: Context,
    gid: Gid,
    pd: Pd,
    cq: Cq,
    mr: RemoteMr,
}

fn host(name: &str) -> Host {
    let ctx = uverbs::open(Some(name)).expect("open device");
    let gid = loopback_gid(&ctx);
    assert!(
        gid.ip()
            .to_ipv4_mapped()
            .is_some_and(|v4| v4.octets()[..2] == [169, 254]),
        "{gid:?}"
    );
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024).unwrap();
    let access =
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.alloc_remote_mr(1 << 20, access).unwrap();
    Host {
        _ctx: ctx,
        gid,
        pd,
        cq,
        mr,
    }
}

fn rc_qp(h: &Host, peer_gid: &Gid, peer_qpn: Option<u32>) -> Qp {
    let mut init = QpInit::new(QpType::Rc, &h.cq, &h.cq);
    init.cap.max_send_wr = 256;
    init.cap.max_recv_wr = 256;
    let mut qp = h.pd.create_qp(&init).unwrap();
    if let Some(peer) = peer_qpn {
        connect(&mut qp, h, peer_gid, peer);
    }
    qp
}

fn connect(qp: &mut Qp, h: &Host, peer_gid: &Gid, peer_qpn: u32) {
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let ah = h.gid.route_to(peer_gid.raw);
    qp.to_init(1, access).unwrap();
    qp.to_rtr(ah, peer_qpn, 0, Mtu::Mtu1024).unwrap();
    // The defaults (timeout 14, retry_cnt 6): `killed_peer_gives_retry_exceeded` shows they
    // let a dead peer surface (rxe retries forever with retry_cnt 7).
    qp.to_rts(0).unwrap();
}

#[test]
fn rc_sends_rdma_and_atomics_cross_the_wire() {
    let wire = Wire::up();
    let (mut a, mut b) = (host(A), host(B));
    let mut qa = rc_qp(&a, &b.gid, None);
    let mut qb = rc_qp(&b, &a.gid, Some(qa.qpn()));
    connect(&mut qa, &a, &b.gid, qb.qpn());
    let tx_before = wire.tx_packets();

    const N: u64 = 2000;
    const DEPTH: u64 = 128;
    for i in 0..DEPTH {
        let sge = b.mr.sge((i % DEPTH) as usize * 512, 512).unwrap();
        unsafe { qb.post_recv(&[RecvWr::new(i, &[sge])]) }.unwrap();
    }
    let (mut sent, mut got) = (0u64, 0u64);
    let mut wc = [WorkCompletion::default(); 32];
    let start = Instant::now();
    while got < N {
        while sent < N && sent < got + DEPTH / 2 {
            let off = (sent % DEPTH) as usize * 512;
            a.mr.bytes_mut()[off..off + 512].fill(sent as u8);
            a.mr.bytes_mut()[off..off + 8].copy_from_slice(&sent.to_le_bytes());
            let sge = [a.mr.sge(off, 512).unwrap()];
            unsafe { qa.post_send(&[SendWr::new(sent, SendOp::Send, &sge)]) }.unwrap();
            sent += 1;
        }
        let n = a.cq.poll(&mut wc);
        assert!(wc[..n].iter().all(WorkCompletion::is_success), "{:?}", &wc[..n]);
        let n = b.cq.poll(&mut wc);
        for c in &wc[..n] {
            assert_eq!(
                (c.status, c.wr_id, c.byte_len, c.qp_num),
                (WcStatus::SUCCESS, got, 512, qb.qpn()),
                "{c:?}"
            );
            let off = (c.wr_id % DEPTH) as usize * 512;
            let buf = &b.mr.bytes()[off..off + 512];
            assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), c.wr_id);
            assert!(buf[8..].iter().all(|&x| x == c.wr_id as u8));
            got += 1;
            if c.wr_id + DEPTH < N {
                let sge = b.mr.sge(off, 512).unwrap();
                unsafe { qb.post_recv(&[RecvWr::new(c.wr_id + DEPTH, &[sge])]) }.unwrap();
            }
        }
        assert!(start.elapsed() < 4 * TIMEOUT, "stalled at {got}");
    }
    poll_until_quiet(&mut a.cq);

    // RDMA write, read back, and a fetch-and-add, all across the wire.
    let remote = Remote {
        addr: b.mr.addr() + 600_000,
        rkey: b.mr.rkey(),
    };
    a.mr.bytes_mut()[..4096]
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = (i * 13) as u8);
    let src = [a.mr.sge(0, 4096).unwrap()];
    let back = [a.mr.sge(8192, 4096).unwrap()];
    let result = [a.mr.sge(16384, 8).unwrap()];
    let ops = [
        SendWr::new(1, SendOp::RdmaWrite(remote), &src),
        SendWr::new(2, SendOp::RdmaRead(remote), &back),
        SendWr::new(
            3,
            SendOp::FetchAdd {
                remote: Remote {
                    addr: b.mr.addr() + 700_000,
                    rkey: b.mr.rkey(),
                },
                add: 5,
            },
            &result,
        ),
    ];
    unsafe { qa.post_send(&ops) }.unwrap();
    let done = poll_n(&mut a.cq, 3, 4);
    assert!(done.iter().all(WorkCompletion::is_success), "{done:?}");
    assert_eq!(&a.mr.bytes()[8192..12288], &a.mr.bytes()[..4096]);
    assert_eq!(&b.mr.bytes()[600_000..604_096], &a.mr.bytes()[..4096]);
    assert_eq!(
        u64::from_ne_bytes(b.mr.bytes()[700_000..700_008].try_into().unwrap()),
        5
    );

    let crossed = wire.tx_packets() - tx_before;
    assert!(crossed >= N, "only {crossed} packets left the A end for {N} messages");
    println!("{N} sends plus write/read/atomic crossed the veth wire in {crossed} packets");
}

fn poll_until_quiet(cq: &mut Cq) {
    let mut wc = [WorkCompletion::default(); 32];
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        let n = cq.poll(&mut wc);
        assert!(wc[..n].iter().all(WorkCompletion::is_success), "{:?}", &wc[..n]);
    }
}

#[test]
fn ud_datagrams_cross_the_wire() {
    let wire = Wire::up();
    const QKEY: u32 = 0x0abc;
    let (mut a, mut b) = (host(A), host(B));
    let ud = |h: &Host| {
        let mut qp = h.pd.create_qp(&QpInit::new(QpType::Ud, &h.cq, &h.cq)).unwrap();
        qp.ud_to_rts(1, QKEY).unwrap();
        qp
    };
    let (mut qa, mut qb) = (ud(&a), ud(&b));
    let ah = a.pd.create_ah(&a.gid.route_to(b.gid.raw)).unwrap();
    let before = wire.tx_packets();
    for i in 0..50u64 {
        let sge = b.mr.sge(i as usize * 1024, 1024).unwrap();
        unsafe { qb.post_recv(&[RecvWr::new(i, &[sge])]) }.unwrap();
        a.mr.bytes_mut()[..256].fill(i as u8);
        let src = [a.mr.sge(0, 256).unwrap()];
        let dest = ah.ud_dest(qb.qpn(), QKEY);
        unsafe { qa.post_send(&[SendWr::new(i, SendOp::Send, &src).to(dest)]) }.unwrap();
        assert!(poll_n(&mut a.cq, 1, 1)[0].is_success());
        let c = poll_n(&mut b.cq, 1, 1)[0];
        assert_eq!(
            (c.status, c.wr_id, c.byte_len, c.src_qp),
            (WcStatus::SUCCESS, i, 40 + 256, qa.qpn()),
            "{c:?}"
        );
        let buf = &b.mr.bytes()[i as usize * 1024..][..40 + 256];
        assert_eq!(&buf[32..36], &[169, 254, 30, 1], "IPv4 source address in the GRH area");
        assert!(buf[40..].iter().all(|&x| x == i as u8));
    }
    assert!(wire.tx_packets() - before >= 50);
}

/// Multicast across the wire: UD QPs on B attached to a group receive what A sends to the
/// group's GID, each its own copy, and none after they detach. rxe passes a multicast
/// datagram to the group's QPs only once the IP layer has taken it in, so B's netdev joins the
/// group's IPv4 address (docs/kernel-facts.md).
#[test]
fn ud_multicast_reaches_the_attached_qps_across_the_wire() {
    let _wire = Wire::up();
    assert!(
        sh("ip addr add 239.1.2.3/32 dev uvwb autojoin"),
        "joining 239.1.2.3 on uvwb"
    );
    const QKEY: u32 = 0x0abc;
    let group: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3];
    let (mut a, mut b) = (host(A), host(B));
    let ud = |h: &Host| {
        let mut qp = h.pd.create_qp(&QpInit::new(QpType::Ud, &h.cq, &h.cq)).unwrap();
        qp.ud_to_rts(1, QKEY).unwrap();
        qp
    };
    let mut qa = ud(&a);
    let qa_qpn = qa.qpn();
    let mut members = [ud(&b), ud(&b)];
    for qp in &members {
        qp.attach_mcast(&group, 0).unwrap();
    }
    let ah = a.pd.create_ah(&a.gid.route_to(group)).unwrap();
    let mut send = |a: &mut Host, round: u8| {
        a.mr.bytes_mut()[..64].fill(round);
        let src = [a.mr.sge(0, 64).unwrap()];
        let dest = ah.ud_dest(0xff_ffff, QKEY);
        unsafe { qa.post_send(&[SendWr::new(u64::from(round), SendOp::Send, &src).to(dest)]) }.unwrap();
        assert!(poll_n(&mut a.cq, 1, 1)[0].is_success());
    };
    for (i, qp) in members.iter_mut().enumerate() {
        for round in 0..2 {
            let slot = (2 * i + round) * 1024;
            let sge = b.mr.sge(slot, 1024).unwrap();
            unsafe { qp.post_recv(&[RecvWr::new(slot as u64, &[sge])]) }.unwrap();
        }
    }
    send(&mut a, 1);
    let mut got: Vec<_> = poll_n(&mut b.cq, 2, 2)
        .into_iter()
        .map(|c| {
            assert_eq!(
                (c.status, c.byte_len, c.src_qp),
                (WcStatus::SUCCESS, 40 + 64, qa_qpn),
                "{c:?}"
            );
            let buf = &b.mr.bytes()[c.wr_id as usize..][..40 + 64];
            assert!(buf[40..].iter().all(|&x| x == 1), "the payload after the GRH");
            c.qp_num
        })
        .collect();
    got.sort_unstable();
    let mut want = [members[0].qpn(), members[1].qpn()];
    want.sort_unstable();
    assert_eq!(got, want, "one copy to each member");
    assert_idle(&mut b.cq);

    members[1].detach_mcast(&group, 0).unwrap();
    send(&mut a, 2);
    let c = poll_n(&mut b.cq, 1, 1)[0];
    assert_eq!((c.status, c.qp_num), (WcStatus::SUCCESS, members[0].qpn()), "{c:?}");
    // B's rxe hands a datagram to all the group's QPs at once: had the detached one been
    // given a copy, it would be there by now.
    assert_idle(&mut b.cq);
    members[0].detach_mcast(&group, 0).unwrap();
    send(&mut a, 3);
    // Nothing to wait for: give the datagram time to cross (it took well under this above).
    std::thread::sleep(Duration::from_secs(1));
    assert_idle(&mut b.cq);
    let err = members[0].detach_mcast(&group, 0).unwrap_err();
    assert_eq!(err.errno(), Some(nix::errno::Errno::EINVAL), "{err}");
}

/// The peer end of `killed_peer_gives_retry_exceeded`, run in a child process.
fn peer_process() {
    let b = host(B);
    let a_gid = loopback_gid(&uverbs::open(Some(A)).unwrap());
    let mut qp = rc_qp(&b, &a_gid, None);
    println!("PEER_QPN={}", qp.qpn());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    connect(&mut qp, &b, &a_gid, line.trim().parse().unwrap());
    for i in 0..64 {
        let sge = b.mr.sge(i * 64, 64).unwrap();
        unsafe { qp.post_recv(&[RecvWr::new(i as u64, &[sge])]) }.unwrap();
    }
    println!("PEER_READY");
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn killed_peer_gives_retry_exceeded() {
    if std::env::var_os("UVERBS_TWO_HOSTS_PEER").is_some() {
        return peer_process();
    }
    let _wire = Wire::up();
    let mut peer = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "killed_peer_gives_retry_exceeded",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("UVERBS_TWO_HOSTS_PEER", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(peer.stdout.take().unwrap());
    // The test harness prints its own lines around ours: find the tagged ones.
    let mut read_tag = |tag: &str| loop {
        let mut l = String::new();
        assert!(out.read_line(&mut l).unwrap() > 0, "peer exited before {tag}");
        if let Some(at) = l.find(tag) {
            return l[at + tag.len()..].trim().to_owned();
        }
    };
    let peer_qpn: u32 = read_tag("PEER_QPN=").parse().expect("peer QPN");
    let (mut a, b_gid) = (host(A), loopback_gid(&uverbs::open(Some(B)).unwrap()));
    let mut qa = rc_qp(&a, &b_gid, Some(peer_qpn));
    writeln!(peer.stdin.as_mut().unwrap(), "{}", qa.qpn()).unwrap();
    read_tag("PEER_READY");

    // A survivor pair between the same two devices, in this process.
    let mut b = host(B);
    let mut sa = rc_qp(&a, &b.gid, None);
    let mut sb = rc_qp(&b, &a.gid, Some(sa.qpn()));
    connect(&mut sa, &a, &b.gid, sb.qpn());

    let sge = [a.mr.sge(0, 64).unwrap()];
    unsafe { qa.post_send(&[SendWr::new(1, SendOp::Send, &sge)]) }.unwrap();
    assert_eq!(poll_n(&mut a.cq, 1, 1)[0].status, WcStatus::SUCCESS, "peer alive");

    peer.kill().unwrap();
    peer.wait().unwrap();
    // timeout 14 (4.096 µs × 2^14 ≈ 67 ms), 6 retries: the error is due after about 0.5 s;
    // allow for emulation.
    let start = Instant::now();
    unsafe { qa.post_send(&[SendWr::new(2, SendOp::Send, &sge)]) }.unwrap();
    let c = poll_n(&mut a.cq, 1, 1)[0];
    assert_eq!((c.wr_id, c.status), (2, WcStatus::RETRY_EXC_ERR), "{c:?}");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(20),
        "error after {took:?}"
    );
    println!("RETRY_EXC_ERR {took:?} after the peer was killed");

    // The surviving QP pair keeps working.
    let rsge = b.mr.sge(0, 64).unwrap();
    unsafe { sb.post_recv(&[RecvWr::new(9, &[rsge])]) }.unwrap();
    unsafe { sa.post_send(&[SendWr::new(10, SendOp::Send, &sge)]) }.unwrap();
    assert_eq!(poll_n(&mut a.cq, 1, 1)[0].status, WcStatus::SUCCESS);
    assert_eq!(poll_n(&mut b.cq, 1, 1)[0].wr_id, 9);
}
