//! Socket addresses in the kernel's `sockaddr` encodings, and the loopback rule.

use crate::error::{Error, Result, Verb};
use crate::sys::ucma::SOCKADDR_STORAGE;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
/// `sizeof(struct sockaddr_in)`.
const SOCKADDR_IN: u16 = 16;
/// `sizeof(struct sockaddr_in6)`.
const SOCKADDR_IN6: u16 = 28;

/// `addr` as a `sockaddr_in` or `sockaddr_in6` in a `sockaddr_storage`, with its size.
pub(crate) fn encode(addr: &SocketAddr) -> ([u8; SOCKADDR_STORAGE], u16) {
    let mut out = [0u8; SOCKADDR_STORAGE];
    let size = match addr {
        SocketAddr::V4(a) => {
            out[0..2].copy_from_slice(&AF_INET.to_ne_bytes());
            out[2..4].copy_from_slice(&a.port().to_be_bytes());
            out[4..8].copy_from_slice(&a.ip().octets());
            SOCKADDR_IN
        }
        SocketAddr::V6(a) => {
            out[0..2].copy_from_slice(&AF_INET6.to_ne_bytes());
            out[2..4].copy_from_slice(&a.port().to_be_bytes());
            out[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
            out[8..24].copy_from_slice(&a.ip().octets());
            out[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
            SOCKADDR_IN6
        }
    };
    (out, size)
}

/// The address a `sockaddr_storage` holds, if it is IPv4 or IPv6.
pub(crate) fn decode(raw: &[u8; SOCKADDR_STORAGE]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes([raw[0], raw[1]]);
    let port = u16::from_be_bytes([raw[2], raw[3]]);
    let word = |at: usize| [raw[at], raw[at + 1], raw[at + 2], raw[at + 3]];
    match family {
        AF_INET => Some(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(word(4)), port))),
        AF_INET6 => {
            let ip: [u8; 16] = raw[8..24].try_into().ok()?;
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                u32::from_be_bytes(word(4)),
                u32::from_ne_bytes(word(24)),
            )))
        }
        _ => None,
    }
}

/// Refuses loopback addresses (IPv4-mapped ones too): Linux's RDMA CM treats them as "any",
/// binds the first device, never sets the netdev, and route resolution fails.
pub(crate) fn refuse_loopback(verb: Verb, addr: &SocketAddr) -> Result<()> {
    let ip = addr.ip().to_canonical();
    if ip.is_loopback() {
        return Err(Error::Loopback { verb, addr: ip });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_through_sockaddr() {
        for text in ["169.254.77.1:7471", "[fe80::1%3]:20000", "[::ffff:169.254.1.2]:1"] {
            let addr: SocketAddr = text.parse().unwrap();
            let (raw, size) = encode(&addr);
            assert_eq!(size, if addr.is_ipv4() { 16 } else { 28 });
            assert_eq!(decode(&raw), Some(addr), "{text}");
        }
        let (raw, _) = encode(&"10.1.2.3:258".parse().unwrap());
        assert_eq!(raw[..8], [2, 0, 1, 2, 10, 1, 2, 3]);
        assert_eq!(decode(&[0; SOCKADDR_STORAGE]), None);
    }

    #[test]
    fn loopback_addresses_are_refused_in_every_spelling() {
        for text in ["127.0.0.1:1", "127.9.9.9:1", "[::1]:1", "[::ffff:127.0.0.1]:1"] {
            let err = refuse_loopback("bind", &text.parse().unwrap()).unwrap_err();
            assert!(matches!(err, Error::Loopback { .. }), "{text}: {err}");
        }
        refuse_loopback("bind", &"169.254.77.1:1".parse().unwrap()).unwrap();
        refuse_loopback("bind", &"0.0.0.0:1".parse().unwrap()).unwrap();
    }
}
