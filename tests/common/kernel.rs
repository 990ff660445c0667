//! The running kernel, for the tests whose expected result depends on it: where rdma_rxe or
//! the RDMA CM behaves differently between the Linux releases the suite runs on (Debian 12's
//! 6.1 and 6.12), each test expects the behaviour docs/kernel-facts.md records for the
//! release it runs on ("Between kernels"). The guest boots either (`cargo xtask guest
//! --kernel 6.12`), and `cargo xtask test` runs the suite on both.

/// The running kernel's release (`uname -r`), e.g. `6.1.0-56-amd64`.
pub fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("reading /proc/sys/kernel/osrelease")
        .trim()
        .to_string()
}

/// (major, minor) of a release string: `6.12.117+deb12-amd64` is (6, 12).
pub fn parse(release: &str) -> (u32, u32) {
    let mut it = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// Whether the running kernel is `major.minor` or newer.
pub fn at_least(major: u32, minor: u32) -> bool {
    parse(&release()) >= (major, minor)
}

/// rdma_rxe executes ATOMIC_WRITE (Linux 6.2 added it; 6.1 completes it LOC_QP_OP_ERR).
pub fn rxe_does_atomic_write() -> bool {
    at_least(6, 2)
}

/// The capability flags above bit 31 that rdma_rxe reports in the extended QUERY_DEVICE:
/// `IB_UVERBS_DEVICE_FLUSH_GLOBAL`, `FLUSH_PERSISTENT` and `ATOMIC_WRITE` (bits 38 to 40) from
/// Linux 6.2, which added flush and atomic write to rxe (seen on 6.12); none on 6.1.
pub fn rxe_upper_cap_flags() -> u64 {
    if rxe_does_atomic_write() {
        0x1C0_0000_0000
    } else {
        0
    }
}

/// rdma_rxe completes a request whose local SGE fails its lkey check (an lkey naming no MR,
/// an address outside the MR) WR_FLUSH_ERR (seen on 6.12), not LOC_QP_OP_ERR and
/// LOC_PROT_ERR (6.1).
pub fn rxe_flushes_local_key_errors() -> bool {
    at_least(6, 12)
}

/// rdma_rxe raises QP_LAST_WQE_REACHED for a QP on an SRQ moved to the error state (seen on
/// 6.12; 6.1 raises nothing).
pub fn rxe_raises_last_wqe_reached() -> bool {
    at_least(6, 12)
}

/// The RDMA CM's packet lifetime of a RoCE path resolved without an ACK timeout
/// (`CMA_IBOE_PACKET_LIFETIME`): 18 on 6.1, 16 on 6.12.
pub fn iboe_packet_lifetime() -> u8 {
    if at_least(6, 12) {
        16
    } else {
        18
    }
}
