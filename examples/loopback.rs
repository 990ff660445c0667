//! Two RC QPs on one device, connected to each other, move one message: the README's
//! example (`cargo xtask guest -- target/debug/examples/loopback`).
use uverbs::{AccessFlags, Mtu, QpInit, QpType, RecvWr, SendOp, SendWr, WorkCompletion};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = uverbs::open(None)?; // the first RDMA device, with its provider
    let pd = ctx.alloc_pd()?;
    let mut cq = ctx.create_cq(16)?; // deeper than the requests that complete into it
    let mut a = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?; // 128 WRs, 1 SGE
    let mut b = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?;
    let mut mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;

    // Both ends on this device: the path to the port's RoCE v2 GID, from that GID.
    let gid = ctx.roce_v2_gid(1)?;
    let (qpn_a, qpn_b) = (a.qpn(), b.qpn());
    for (qp, peer) in [(&mut a, qpn_b), (&mut b, qpn_a)] {
        qp.to_init(gid.port, AccessFlags::empty())?;
        qp.to_rtr(gid.route_to(gid.raw), peer, 0, Mtu::Mtu1024)?;
        qp.to_rts(0)?; // ConnectAttr::default(): a dead peer fails sends in about 0.5 s
    }

    mr.as_mut_slice()[..5].copy_from_slice(b"hello");
    let (src, dst) = ([mr.sge(0, 5)?], [mr.sge(2048, 5)?]);
    // Signaled, so it completes; `.with(SendFlags::INLINE)` would add a flag.
    let send = SendWr::new(1, SendOp::SendWithImm { imm: 7 }, &src);
    // SAFETY: `mr` outlives both requests, and nothing touches it until they complete.
    unsafe {
        b.post_recv(&[RecvWr::new(2, &dst)])?;
        a.post_send(&[send])?;
    }
    let mut wc = [WorkCompletion::default(); 4];
    let mut done = 0;
    while done < 2 {
        let n = cq.poll(&mut wc); // no lock, no system call, no allocation
        for c in &wc[..n] {
            c.result()?; // a failed request becomes an error naming it
            if let Some(imm) = c.imm() {
                let text = std::str::from_utf8(&mr.as_slice()[2048..2048 + c.byte_len as usize])?;
                println!("received {text:?} with immediate {imm}");
            }
        }
        done += n;
    }
    Ok(())
}
