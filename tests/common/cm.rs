//! The RDMA connection manager tests' shared set-up (`tests/cm.rs`, `tests/aio_cm.rs`): the
//! CM address the guest provides, one end's verbs objects, and the checks that no cm_id, fd
//! or mapping is left.

use super::*;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use uverbs::*;

/// `UVERBS_CM_ADDR` with `port`.
pub fn cm_addr(port: u16) -> SocketAddr {
    let ip: IpAddr = std::env::var("UVERBS_CM_ADDR")
        .expect(
            "UVERBS_CM_ADDR: an IPv4 address of a netdev with an RDMA device; `cargo xtask test` \
             runs this in a guest that sets it",
        )
        .parse()
        .expect("UVERBS_CM_ADDR is an IP address");
    SocketAddr::new(ip, port)
}

/// `len` bytes that differ per test and per position.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed) | 1)
        .collect()
}

/// One end's verbs objects on the device the CM chose.
pub struct Side {
    pub pd: Pd,
    pub cq: Cq,
    pub mr: Mr,
}

impl Side {
    pub fn new(ctx: &Context) -> Self {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let mr = pd.alloc_mr(4096, LocalAccess::LOCAL_WRITE).unwrap();
        Self { pd, cq, mr }
    }

    pub fn qp(&self) -> Qp {
        self.pd.create_qp(&QpInit::new(QpType::Rc, &self.cq, &self.cq)).unwrap()
    }

    pub fn post_recv(&mut self, qp: &mut Qp, wr_id: u64) {
        let sge = [self.mr.sge(0, 1024).unwrap()];
        // SAFETY: `mr` outlives the request (the test polls its completion or flush).
        unsafe { qp.post_recv(&[RecvWr::new(wr_id, &sge)]).unwrap() };
    }

    /// Waits for one completion and returns it.
    pub fn one(&mut self) -> WorkCompletion {
        poll_n(&mut self.cq, 1, 1)[0]
    }
}

/// What `rdma resource show cm_id` prints.
pub fn cm_id_table() -> String {
    let out = Command::new("rdma")
        .args(["resource", "show", "cm_id"])
        .output()
        .expect("running `rdma resource show cm_id` (iproute2)");
    assert!(out.status.success(), "rdma resource show cm_id: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lines of `rdma resource show cm_id` that belong to this process. The kernel records
/// the creating *thread*'s id as `pid`: a line is ours if that thread is one of ours, or has
/// exited (an id outlives its thread only while its process keeps the channel open, and the
/// test binary runs alone: `cargo xtask test` runs one binary at a time).
pub fn my_cm_ids() -> Vec<String> {
    cm_id_table()
        .lines()
        .filter(|l| {
            let mut words = l.split_whitespace();
            let Some(tid) = words.by_ref().skip_while(|w| *w != "pid").nth(1) else {
                return false;
            };
            let ours = std::path::Path::new("/proc/self/task").join(tid).exists();
            ours || !std::path::Path::new("/proc").join(tid).exists()
        })
        .map(String::from)
        .collect()
}

pub fn assert_no_cm_ids() {
    // The kernel destroys an id inside DESTROY_ID; nothing is deferred.
    let left = my_cm_ids();
    assert!(left.is_empty(), "cm_ids left behind: {left:#?}");
}

/// Every open fd and every mapping of the process: `/proc/self/fd` entries and
/// `/proc/self/maps` lines.
pub fn process_footprint() -> (usize, usize) {
    let fds = std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count();
    let maps = std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .count();
    (fds, maps)
}
