//! The rsocket wire format (docs/rsocket-protocol.md): the connect private data
//! (`rs_conn_data`) and the immediate's encoding of operations.

use crate::error::{Error, Result};

/// The protocol version rsockets speak.
pub(crate) const VERSION: u8 = 1;
/// `RS_CONN_FLAG_NET`: the sender is big-endian.
pub(crate) const FLAG_NET: u8 = 1 << 0;
/// `RS_CONN_FLAG_IOMAP`: `target_iomap_size` is valid.
pub(crate) const FLAG_IOMAP: u8 = 1 << 1;
/// Bytes of `struct rs_conn_data`.
pub(crate) const CONN_DATA_LEN: usize = 40;
/// Entries in the target SGL table (`RS_SGL_SIZE`).
pub(crate) const SGL_SIZE: usize = 2;
/// Bytes of one `struct rs_sge`.
pub(crate) const SGE_LEN: usize = 16;
/// Control messages a side keeps outstanding at most (`RS_QP_CTRL_SIZE`).
pub(crate) const CTRL_SLOTS: u32 = 4;

/// `RS_OP_DATA`.
pub(crate) const OP_DATA: u32 = 0;
/// `RS_OP_SGL`.
pub(crate) const OP_SGL: u32 = 4;
/// `RS_OP_IOMAP_SGL`.
pub(crate) const OP_IOMAP_SGL: u32 = 6;
/// `RS_OP_CTRL`.
pub(crate) const OP_CTRL: u32 = 7;
/// `RS_CTRL_DISCONNECT`.
pub(crate) const CTRL_DISCONNECT: u32 = 0;
/// `RS_CTRL_KEEPALIVE`.
pub(crate) const CTRL_KEEPALIVE: u32 = 1;
/// `RS_CTRL_SHUTDOWN`.
pub(crate) const CTRL_SHUTDOWN: u32 = 2;
/// The data bits of an immediate.
pub(crate) const DATA_MASK: u32 = 0x1FFF_FFFF;

/// An immediate: `op` in bits 31..29, `data` in 28..0.
pub(crate) fn imm(op: u32, data: u32) -> u32 {
    (op << 29) | (data & DATA_MASK)
}

/// The operation and data of an immediate.
pub(crate) fn split_imm(imm: u32) -> (u32, u32) {
    (imm >> 29, imm & DATA_MASK)
}

/// `struct rs_sge`: where a peer may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RsSge {
    pub addr: u64,
    pub key: u32,
    pub length: u32,
}

impl RsSge {
    fn put_be(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.addr.to_be_bytes());
        out[8..12].copy_from_slice(&self.key.to_be_bytes());
        out[12..16].copy_from_slice(&self.length.to_be_bytes());
    }

    fn get_be(b: &[u8]) -> Self {
        Self {
            addr: u64::from_be_bytes(b[0..8].try_into().expect("8 bytes")),
            key: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
            length: u32::from_be_bytes(b[12..16].try_into().expect("4 bytes")),
        }
    }

    /// The 16 bytes as this host writes them (an SGL update: the sender's byte order).
    pub(crate) fn to_ne_bytes(self) -> [u8; SGE_LEN] {
        let mut b = [0; SGE_LEN];
        b[0..8].copy_from_slice(&self.addr.to_ne_bytes());
        b[8..12].copy_from_slice(&self.key.to_ne_bytes());
        b[12..16].copy_from_slice(&self.length.to_ne_bytes());
        b
    }

    /// An SGL update read as this host wrote it.
    pub(crate) fn from_ne_bytes(b: &[u8; SGE_LEN]) -> Self {
        Self {
            addr: u64::from_ne_bytes(b[0..8].try_into().expect("8 bytes")),
            key: u32::from_ne_bytes(b[8..12].try_into().expect("4 bytes")),
            length: u32::from_ne_bytes(b[12..16].try_into().expect("4 bytes")),
        }
    }
}

/// `struct rs_conn_data`, as far as this implementation uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnData {
    /// Data messages the peer may send before it hears more (`credits`).
    pub credits: u16,
    /// The sender's target SGL table (`length`: its entries).
    pub target_sgl: RsSge,
    /// The first half of the sender's receive buffer.
    pub data_buf: RsSge,
}

impl ConnData {
    /// The 40 bytes this side sends: version 1, no flags (little-endian host, no iomap).
    pub(crate) fn encode(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0; CONN_DATA_LEN];
        b[0] = VERSION;
        b[1] = if cfg!(target_endian = "big") { FLAG_NET } else { 0 };
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        self.target_sgl.put_be(&mut b[8..24]);
        self.data_buf.put_be(&mut b[24..40]);
        b
    }

    /// Reads a peer's private data, refusing what this implementation does not speak.
    pub(crate) fn decode(verb: &'static str, b: &[u8]) -> Result<Self> {
        let refuse = |why: String| Err(Error::invalid(verb, format!("rsocket peer refused: {why}")));
        if b.len() < CONN_DATA_LEN {
            return refuse(format!("{} bytes of private data, not the 40 of rs_conn_data", b.len()));
        }
        if b[0] != VERSION {
            return refuse(format!("protocol version {}, not 1", b[0]));
        }
        let host_net = cfg!(target_endian = "big");
        if (b[1] & FLAG_NET != 0) != host_net {
            return refuse("the peer's byte order differs (RS_CONN_FLAG_NET): SGL swapping is not implemented".into());
        }
        if b[1] & !(FLAG_NET | FLAG_IOMAP) != 0 {
            return refuse(format!("unknown connection flags {:#04x}", b[1]));
        }
        let data = Self {
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_sgl: RsSge::get_be(&b[8..24]),
            data_buf: RsSge::get_be(&b[24..40]),
        };
        if !(1..=16).contains(&data.target_sgl.length) {
            return refuse(format!("a target SGL table of {} entries", data.target_sgl.length));
        }
        if data.credits == 0 || data.data_buf.length == 0 {
            return refuse("no credits or no receive buffer".into());
        }
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ConnData {
        ConnData {
            credits: 384,
            target_sgl: RsSge {
                addr: 0x1122_3344_5566_7788,
                key: 0xaabb_ccdd,
                length: 2,
            },
            data_buf: RsSge {
                addr: 0x7f00_0000_1000,
                key: 0x1234,
                length: 65536,
            },
        }
    }

    #[test]
    fn conn_data_is_rsockets_layout() {
        let b = sample().encode();
        assert_eq!(b[0], 1);
        assert_eq!(b[1], 0);
        assert_eq!(&b[2..4], &[0x01, 0x80]);
        assert_eq!(&b[4..8], &[0; 4]);
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(&b[16..20], &0xaabb_ccddu32.to_be_bytes());
        assert_eq!(&b[20..24], &2u32.to_be_bytes());
        assert_eq!(&b[36..40], &65536u32.to_be_bytes());
        assert_eq!(ConnData::decode("t", &b).unwrap(), sample());
        // An rsocket peer's data: IOMAP flag and a table size are accepted (never used).
        let mut theirs = b;
        theirs[1] = FLAG_IOMAP;
        theirs[7] = 3;
        assert_eq!(ConnData::decode("t", &theirs).unwrap(), sample());
        // 56 bytes of RoCE REQ private data: the tail is padding.
        let mut padded = b.to_vec();
        padded.resize(56, 0);
        assert!(ConnData::decode("t", &padded).is_ok());
    }

    #[test]
    fn what_is_not_spoken_is_refused() {
        let b = sample().encode();
        assert!(ConnData::decode("t", &b[..39]).is_err());
        let mut v = b;
        v[0] = 2;
        assert!(ConnData::decode("t", &v).unwrap_err().to_string().contains("version 2"));
        let mut n = b;
        n[1] |= FLAG_NET;
        assert!(ConnData::decode("t", &n)
            .unwrap_err()
            .to_string()
            .contains("byte order"));
        let mut s = b;
        s[20..24].copy_from_slice(&0u32.to_be_bytes());
        assert!(ConnData::decode("t", &s).is_err());
    }

    #[test]
    fn immediates_split_as_rsockets_set_them() {
        assert_eq!(imm(OP_DATA, 65536), 65536);
        assert_eq!(imm(OP_SGL, 400), 0x8000_0190);
        assert_eq!(imm(OP_CTRL, CTRL_SHUTDOWN), 0xE000_0002);
        assert_eq!(split_imm(0xE000_0000), (OP_CTRL, CTRL_DISCONNECT));
        assert_eq!(split_imm(imm(OP_DATA, DATA_MASK)), (OP_DATA, DATA_MASK));
        let sge = RsSge {
            addr: 5,
            key: 6,
            length: 7,
        };
        assert_eq!(RsSge::from_ne_bytes(&sge.to_ne_bytes()), sge);
    }
}
