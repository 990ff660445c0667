//! Two rxe devices on the two ends of a veth pair (`rxe_wa` on `uvwa`, 169.254.30.1; `rxe_wb` on
//! `uvwb`, 169.254.30.2), so traffic leaves one netdev and arrives on the other.
//!
//! Linux 6.1's rxe opens its UDP socket and routes only in the initial network namespace (in
//! separate namespaces the GIDs appear but sends fail with LOC_QP_OP_ERR), so both ends stay in
//! the initial namespace, and policy routing sends traffic for each address out of the other
//! end's veth instead of delivering it locally.

use std::process::Command;

/// Runs `cmd` with `sh -c`; whether it succeeded.
pub fn sh(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .status()
        .is_ok_and(|s| s.success())
}

/// The veth pair with an rxe device on each end; torn down on drop.
pub struct Wire;

const UP: &str = "set -e
modprobe veth
ip link add uvwa type veth peer name uvwb
ip addr add 169.254.30.1/32 dev uvwa; ip addr add 169.254.30.2/32 dev uvwb
for i in all default uvwa uvwb; do sysctl -qw net.ipv4.conf.$i.rp_filter=0 net.ipv4.conf.$i.accept_local=1; done
sysctl -qw net.ipv4.conf.uvwa.arp_ignore=1 net.ipv4.conf.uvwb.arp_ignore=1
ip link set uvwa up; ip link set uvwb up
ip rule add pref 1000 lookup local; ip rule del pref 0 lookup local
ip rule add pref 100 iif uvwa lookup local; ip rule add pref 100 iif uvwb lookup local
ip rule add pref 200 to 169.254.30.2 lookup 200; ip route add 169.254.30.2 dev uvwa src 169.254.30.1 table 200
ip rule add pref 200 to 169.254.30.1 lookup 201; ip route add 169.254.30.1 dev uvwb src 169.254.30.2 table 201
rdma link add rxe_wa type rxe netdev uvwa; rdma link add rxe_wb type rxe netdev uvwb";

const DOWN: &str = "rdma link delete rxe_wa; rdma link delete rxe_wb; ip link del uvwa
ip rule del pref 100; ip rule del pref 100; ip rule del pref 200; ip rule del pref 200
ip route flush table 200; ip route flush table 201
ip rule show pref 0 | grep -q . || ip rule add pref 0 lookup local
ip rule del pref 1000";

impl Wire {
    /// Sets the pair up, after removing what an earlier run may have left.
    pub fn up() -> Self {
        sh(&format!("{{ {DOWN} ; }} >/dev/null 2>&1"));
        assert!(sh(UP), "setting up the veth pair with two rxe devices failed");
        Wire
    }

    /// Packets sent by the A end's netdev so far.
    pub fn tx_packets(&self) -> u64 {
        std::fs::read_to_string("/sys/class/net/uvwa/statistics/tx_packets")
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        sh(&format!("{{ {DOWN} ; }} >/dev/null 2>&1"));
    }
}
