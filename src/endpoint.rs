//! Addressing by link layer: an [`Endpoint`] says what a peer needs to connect a QP to this
//! one (the port's LID on InfiniBand, its GID on RoCE, the QP number and first PSN), and
//! [`Qp::connect_to`] builds the path the link layer needs from two of them.

use crate::attr::{AhAttr, LinkLayer, Mtu, QpState};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::mr::AccessFlags;
use crate::qp::{ConnectAttr, Qp};
use crate::remote::{DecodeError, Versioned};

/// How a port is addressed on its link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortAddr {
    /// InfiniBand: the port's base LID (a path to it needs no global route).
    Lid(u16),
    /// RoCE (Ethernet): a GID of the port, and its index in the port's table (the source
    /// of the owner's own paths; the peer routes to `raw`).
    Gid {
        /// The 16 GID bytes.
        raw: [u8; 16],
        /// Its index in the owner's GID table.
        index: u8,
    },
}

/// What a peer needs to connect an RC or UC QP to this one: how the port is addressed on its
/// link layer ([`PortAddr`]), the QP number, the first PSN this QP sends, and the port's
/// active MTU. Made by [`Context::endpoint`], sent [`Endpoint::encode`]d (40 bytes: fits CM
/// private data or any message), read back with [`Endpoint::decode`], and used by
/// [`Qp::connect_to`], which picks a LID path on InfiniBand and a GID path on RoCE, so the
/// caller never chooses (a wrong choice handshakes and then fails every request with
/// `RETRY_EXC_ERR`).
///
/// ```no_run
/// # fn exchange(_: &[u8]) -> Vec<u8> { unimplemented!() }
/// # fn f(ctx: &uverbs::Context, qp: &mut uverbs::Qp) -> uverbs::Result<()> {
/// use uverbs::{AccessFlags, Endpoint};
/// let me = ctx.endpoint(qp, 1)?; // port 1
/// let peer = Endpoint::decode(&exchange(&me.encode()))?; // your own channel
/// qp.connect_to(ctx, &me, &peer, AccessFlags::REMOTE_WRITE)?; // RESET -> RTS
/// # Ok(()) }
/// ```
///
/// The encoding is fixed little-endian: the magic `b"uvEP"`, the version (1), a reserved 0
/// byte, the body's length (u16, 32), then the kind (1 LID, 2 GID), the port, the GID index,
/// the MTU (`Mtu` as verbs numbers it), the LID (u16), 2 reserved bytes, the QP number
/// (u32), the PSN (u32) and the 16 GID bytes (zero for a LID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The port the QP uses, on its owner's device.
    pub port: u8,
    /// How the port is addressed.
    pub addr: PortAddr,
    /// The QP number.
    pub qpn: u32,
    /// The first PSN the QP sends (24 bits); the peer expects it.
    pub psn: u32,
    /// The port's active MTU; a connection uses the smaller of both ends'.
    pub mtu: Mtu,
}

/// The encoding of an [`Endpoint`] (its body described in the type's docs).
const FORMAT: Versioned = Versioned {
    magic: *b"uvEP",
    version: 1,
    body: 32,
};
const KIND_LID: u8 = 1;
const KIND_GID: u8 = 2;

impl Endpoint {
    /// Bytes of [`Endpoint::encode`]'s output.
    pub const ENCODED_LEN: usize = FORMAT.encoded_len();

    /// The fixed little-endian encoding (see the type's docs).
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut b = [0u8; Self::ENCODED_LEN];
        let body = FORMAT.write_header(&mut b);
        body[1] = self.port;
        body[3] = self.mtu as u8;
        match self.addr {
            PortAddr::Lid(lid) => {
                body[0] = KIND_LID;
                body[4..6].copy_from_slice(&lid.to_le_bytes());
            }
            PortAddr::Gid { raw, index } => {
                body[0] = KIND_GID;
                body[2] = index;
                body[16..32].copy_from_slice(&raw);
            }
        }
        body[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        body[12..16].copy_from_slice(&self.psn.to_le_bytes());
        b
    }

    /// Reads [`Endpoint::encode`]'s bytes from the start of `bytes` (what follows, such as
    /// private data's zero padding, is ignored).
    pub fn decode(bytes: &[u8]) -> std::result::Result<Self, DecodeError> {
        let body = FORMAT.body(bytes)?;
        let u32_at = |at: usize| u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
        let addr = match body[0] {
            KIND_LID => PortAddr::Lid(u16::from_le_bytes([body[4], body[5]])),
            KIND_GID => {
                let mut raw = [0u8; 16];
                raw.copy_from_slice(&body[16..32]);
                PortAddr::Gid { raw, index: body[2] }
            }
            _ => return Err(DecodeError::Malformed("unknown address kind")),
        };
        Ok(Self {
            port: body[1],
            addr,
            qpn: u32_at(8),
            psn: u32_at(12),
            mtu: Mtu::from_raw(body[3]).ok_or(DecodeError::Malformed("unknown MTU"))?,
        })
    }
}

impl Context {
    /// `qp`'s endpoint on `port`, for its peer: the port's LID on InfiniBand, or on RoCE its
    /// RoCE v2 GID ([`Context::roce_v2_gid`]), its active MTU, and a random first PSN (change
    /// `psn` before sending it if you choose your own).
    pub fn endpoint(&self, qp: &Qp, port: u8) -> Result<Endpoint> {
        let attr = self.query_port(port)?;
        let addr = if attr.link_layer == LinkLayer::ETHERNET {
            let gid = self.roce_v2_gid(port)?;
            PortAddr::Gid {
                raw: gid.raw,
                index: gid.index,
            }
        } else {
            PortAddr::Lid(attr.lid)
        };
        Ok(Endpoint {
            port,
            addr,
            qpn: qp.qpn(),
            psn: random_psn(),
            mtu: attr.active_mtu.unwrap_or(Mtu::Mtu1024),
        })
    }

    /// The path from `local`'s port to `peer`: a LID path on InfiniBand, a GID path from
    /// `local`'s GID on RoCE. An error when the two are not addressed on the same link layer.
    pub fn path_between(&self, local: &Endpoint, peer: &Endpoint) -> Result<AhAttr> {
        match (local.addr, peer.addr) {
            (PortAddr::Lid(_), PortAddr::Lid(dlid)) => Ok(AhAttr {
                port_num: local.port,
                dlid,
                ..Default::default()
            }),
            // From the local GID (its index says RoCE v1 or v2) to the peer's.
            (PortAddr::Gid { index, .. }, PortAddr::Gid { raw, .. }) => Ok(AhAttr::roce(local.port, raw, index)),
            _ => Err(Error::invalid(
                "connect_to",
                format!(
                    "the ends are on different link layers (this one {}, the peer {}): InfiniBand takes a LID path, RoCE a GID path",
                    layer(&local.addr),
                    layer(&peer.addr)
                ),
            )),
        }
    }
}

fn layer(addr: &PortAddr) -> &'static str {
    match addr {
        PortAddr::Lid(_) => "InfiniBand (LID)",
        PortAddr::Gid { .. } => "RoCE (GID)",
    }
}

/// A first PSN: 24 random bits (from the standard library's per-process random hash keys).
fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    (h.finish() & 0xff_ffff) as u32
}

impl Qp {
    /// Connects this RC or UC QP, in RESET, to `peer`: RESET → INIT on `local.port` with the
    /// remote `access` the peer gets, → RTR towards `peer.qpn` on the path the link layer
    /// needs ([`Context::path_between`]: LID on InfiniBand, GID on RoCE), expecting
    /// `peer.psn`, at the smaller of the two MTUs, → RTS sending from `local.psn`, with
    /// [`ConnectAttr::default`]. `local` is this QP's own endpoint ([`Context::endpoint`]).
    pub fn connect_to(&mut self, ctx: &Context, local: &Endpoint, peer: &Endpoint, access: AccessFlags) -> Result<()> {
        self.connect_to_with(ctx, local, peer, access, &ConnectAttr::default())
    }

    /// [`Qp::connect_to`] with `connect`'s timeouts, retries and read/atomic depths.
    pub fn connect_to_with(
        &mut self,
        ctx: &Context,
        local: &Endpoint,
        peer: &Endpoint,
        access: AccessFlags,
        connect: &ConnectAttr,
    ) -> Result<()> {
        if local.qpn != self.qpn() {
            return Err(Error::invalid(
                "connect_to",
                format!("`local` is QP {}'s endpoint, not this QP's ({})", local.qpn, self.qpn()),
            ));
        }
        let path = ctx.path_between(local, peer)?;
        let mtu = local.mtu.min(peer.mtu);
        if self.state() != QpState::Init {
            self.to_init(local.port, access)?;
        }
        self.to_rtr_with(path, peer.qpn, peer.psn & 0xff_ffff, mtu, connect)?;
        self.to_rts_with(local.psn & 0xff_ffff, connect)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roce() -> Endpoint {
        Endpoint {
            port: 1,
            addr: PortAddr::Gid {
                raw: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
                index: 3,
            },
            qpn: 0x11,
            psn: 0xabcdef,
            mtu: Mtu::Mtu1024,
        }
    }

    #[test]
    fn endpoints_encode_to_fixed_bytes_and_back() {
        let ib = Endpoint {
            port: 2,
            addr: PortAddr::Lid(0x1234),
            qpn: 0x00aa_bbcc,
            psn: 7,
            mtu: Mtu::Mtu4096,
        };
        let b = ib.encode();
        assert_eq!(&b[..8], b"uvEP\x01\x00\x20\x00");
        assert_eq!(&b[8..16], &[1, 2, 0, 5, 0x34, 0x12, 0, 0]);
        assert_eq!(b[16..20], 0x00aa_bbccu32.to_le_bytes());
        assert_eq!(b[20..24], 7u32.to_le_bytes());
        assert_eq!(b[24..40], [0; 16]);
        assert_eq!(Endpoint::decode(&b), Ok(ib));
        let mut padded = [0u8; 56];
        padded[..Endpoint::ENCODED_LEN].copy_from_slice(&roce().encode());
        assert_eq!(Endpoint::decode(&padded), Ok(roce()));
    }

    #[test]
    fn bad_endpoints_are_typed_errors() {
        let b = roce().encode();
        assert_eq!(
            Endpoint::decode(&b[..39]),
            Err(DecodeError::Short { need: 40, got: 39 })
        );
        assert_eq!(Endpoint::decode(&[0; 40]), Err(DecodeError::BadMagic));
        let mut kind = b;
        kind[8] = 9;
        assert!(matches!(Endpoint::decode(&kind), Err(DecodeError::Malformed(_))));
        let mut mtu = b;
        mtu[11] = 6;
        assert!(matches!(Endpoint::decode(&mtu), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn psns_are_24_bits() {
        assert!((0..100).all(|_| random_psn() <= 0xff_ffff));
    }
}
