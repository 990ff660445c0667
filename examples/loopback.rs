//! Two RC QPs on one device, connected to each other, move one message: the README's
//! example (`cargo xtask guest -- target/debug/examples/loopback`).
use uverbs::{AccessFlags, LocalAccess, Mtu, QpInit, QpType, SendOp, WorkCompletion};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = uverbs::open(None)?; // the first RDMA device, with its provider
    let pd = ctx.alloc_pd()?;
    let mut cq = ctx.create_cq(16)?; // deeper than the requests that complete into it
    let mut a = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?; // 128 WRs, 1 SGE
    let mut b = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?;
    // Local memory (no peer writes it) cut into buffers, each owned by us or by a QP.
    let mut bufs = pd.alloc_mr(4096, LocalAccess::LOCAL_WRITE)?.into_bufs(2048)?;
    let (inbox, mut msg) = (bufs.remove(1), bufs.remove(0));

    // Both ends on this device: the path to the port's RoCE v2 GID, from that GID.
    let gid = ctx.roce_v2_gid(1)?;
    let (qpn_a, qpn_b) = (a.qpn(), b.qpn());
    for (qp, peer) in [(&mut a, qpn_b), (&mut b, qpn_a)] {
        qp.to_init(gid.port, AccessFlags::empty())?;
        qp.to_rtr(gid.route_to(gid.raw), peer, 0, Mtu::Mtu1024)?;
        qp.to_rts(0)?; // ConnectAttr::default(): a dead peer fails sends in about 0.5 s
    }

    msg.fill_from(b"hello")?;
    b.recv_buf(inbox)?; // B holds `inbox` until the completion that gives it back

    // Signaled, so it completes; `send_buf_with` takes flags and a UD destination.
    a.send_buf(SendOp::SendWithImm { imm: 7 }, msg)?; // `msg` is A's now: no `unsafe`
    let mut wc = [WorkCompletion::default(); 4];
    let mut back = Vec::new();
    while back.len() < 2 {
        for c in cq.reap(&mut wc).iter() {
            // no lock, no system call, no allocation
            c.result()?; // a failed request becomes an error naming it
            if let Some(inbox) = b.reclaim(c) {
                let text = std::str::from_utf8(inbox.as_slice())?; // its length: what arrived
                let imm = c.imm().ok_or("a receive of a send with immediate carries it")?;
                println!("received {text:?} with immediate {imm}");
                back.push(inbox);
            }
            back.extend(a.reclaim(c)); // the sent buffer, ours again
        }
    }
    Ok(())
}
