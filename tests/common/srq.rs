//! Two senders and two receivers on one SRQ (`tests/srq.rs`, `tests/mlx5_srq.rs`).

use super::{link, open_test_device};
use uverbs::*;

/// The objects of [`setup`].
pub struct Setup {
    pub ctx: Context,
    pub pd: Pd,
    pub srq: Srq,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub senders: Vec<Qp>,
    pub receivers: Vec<Qp>,
    pub mr: Mr,
    /// On iWARP, each sender's connection to its receiver.
    pub cm: Vec<link::CmLink>,
}

/// Two senders and two receivers on one SRQ of `max_wr` requests, connected on the test
/// device (on iWARP through the CM, [`link::connect_qps`]).
pub fn setup(max_wr: u32) -> Setup {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let srq = pd.create_srq(&SrqInit::new(max_wr, 1)).unwrap();
    let (send_cq, recv_cq) = (ctx.create_cq(512).unwrap(), ctx.create_cq(512).unwrap());
    let access = AccessFlags::LOCAL_WRITE;
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    let mut cm = Vec::new();
    for _ in 0..2 {
        let mut tx = pd.create_qp(&QpInit::new(QpType::Rc, &send_cq, &send_cq)).unwrap();
        let mut init = QpInit::new(QpType::Rc, &send_cq, &recv_cq);
        init.srq = Some(&srq);
        let mut rx = pd.create_qp(&init).expect("QP on an SRQ");
        cm.extend(link::connect_qps(&ctx, &mut tx, &mut rx, access));
        senders.push(tx);
        receivers.push(rx);
    }
    let mr = pd.alloc_mr(1 << 20, LocalAccess::LOCAL_WRITE).unwrap();
    Setup {
        ctx,
        pd,
        srq,
        send_cq,
        recv_cq,
        senders,
        receivers,
        mr,
        cm,
    }
}
