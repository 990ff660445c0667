//! Two rxe devices on the two ends of a veth pair (`rxe_wa` on `uvwa`, 169.254.30.1; `rxe_wb` on
//! `uvwb`, 169.254.30.2), so traffic leaves one netdev and arrives on the other.
//!
//! Linux 6.1's rxe opens its UDP socket and routes only in the initial network namespace (in
//! separate namespaces the GIDs appear but sends fail with LOC_QP_OP_ERR), so both ends stay in
//! the initial namespace, and policy routing sends traffic for each address out of the other
//! end's veth instead of delivering it locally.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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

/// The pair's set-up, shared with `tests/guest/rping_cmatose_interop.sh`.
const UP: &str = include_str!("veth_up.sh");
/// Its teardown (each step may fail when there is nothing to undo).
const DOWN: &str = include_str!("veth_down.sh");

impl Wire {
    /// Sets the pair up, after removing what an earlier run may have left.
    pub fn up() -> Self {
        sh(&format!("{{\n{DOWN}\n}} >/dev/null 2>&1"));
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
        sh(&format!("{{\n{DOWN}\n}} >/dev/null 2>&1"));
    }
}

/// The frames a netdev sends and receives from its creation on, kept by a packet socket
/// (`AF_PACKET`, all protocols) until read.
pub struct Capture {
    fd: OwnedFd,
}

/// RoCE v2's UDP port.
const ROCE_V2_PORT: u16 = 4791;

impl Capture {
    /// Starts capturing on `ifname` (needs CAP_NET_RAW: the guest runs as root).
    pub fn on(ifname: &str) -> Self {
        let all = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2); the result is checked before use.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                all.into(),
            )
        };
        assert!(raw >= 0, "socket(AF_PACKET): {}", std::io::Error::last_os_error());
        // SAFETY: `raw` is a new socket nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let index = std::fs::read_to_string(format!("/sys/class/net/{ifname}/ifindex")).unwrap();
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid start.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = all;
        addr.sll_ifindex = index.trim().parse().unwrap();
        // SAFETY: `addr` is a sockaddr_ll of the length passed.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        assert_eq!(
            r,
            0,
            "binding the packet socket to {ifname}: {}",
            std::io::Error::last_os_error()
        );
        Self { fd }
    }

    /// The IPv4 source address and TOS byte of every RoCE v2 packet (IPv4, UDP to port 4791)
    /// captured so far.
    pub fn roce_packets(&self) -> Vec<(std::net::Ipv4Addr, u8)> {
        let mut tos = Vec::new();
        let mut frame = [0u8; 2048];
        loop {
            // SAFETY: `frame` is writable for its length.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), frame.as_mut_ptr().cast(), frame.len(), 0) };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock, "recv: {err}");
                return tos;
            }
            let f = &frame[..n as usize];
            // Ethernet (14 bytes), IPv4 with its header length, UDP.
            if f.len() < 14 + 20 + 8 || f[12..14] != [0x08, 0x00] || f[14 + 9] != libc::IPPROTO_UDP as u8 {
                continue;
            }
            let udp = 14 + usize::from(f[14] & 0xf) * 4;
            if f.len() >= udp + 4 && u16::from_be_bytes([f[udp + 2], f[udp + 3]]) == ROCE_V2_PORT {
                let src = std::net::Ipv4Addr::new(f[26], f[27], f[28], f[29]);
                tos.push((src, f[15]));
            }
        }
    }
}
