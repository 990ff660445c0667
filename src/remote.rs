//! What a peer advertises so that one-sided operations can reach its memory
//! ([`RemoteRegion`]: address, rkey and length, with a versioned byte encoding), and a framing
//! for connection private data that keeps its length ([`frame_private_data`]).

use crate::error::{Error, WrReject};
use crate::mr::{DmabufMr, Mr, OutOfBounds, RemoteMr};
use crate::wr::Remote;

/// A range of a peer's registered memory that RDMA reads, writes and atomics may reach: its
/// address, rkey and length. The owner makes one from its region ([`RemoteMr::region`],
/// [`RemoteMr::region_range`], [`Mr::region`]) and sends it [`RemoteRegion::encode`]d (in
/// connection private data or a message); the peer [`RemoteRegion::decode`]s it and hands it
/// to the safe posts ([`crate::Qp::write_buf`], [`crate::Qp::read_buf`],
/// [`crate::Qp::fetch_add_buf`], [`crate::Qp::compare_swap_buf`],
/// [`crate::Qp::write_inline`]), which check the bounds before posting
/// ([`crate::WrReject::RemoteOutOfBounds`]).
///
/// ```
/// # fn f(pd: &uverbs::Pd) -> uverbs::Result<()> {
/// use uverbs::{AccessFlags, RemoteRegion};
/// let mr = pd.alloc_remote_mr(1 << 16, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
/// let bytes = mr.region().encode(); // RemoteRegion::ENCODED_LEN bytes, for the peer
/// let back = RemoteRegion::decode(&bytes)?; // zero padding after them is ignored
/// assert_eq!(back, mr.region());
/// # Ok(()) }
/// ```
///
/// The encoding is fixed little-endian, [`RemoteRegion::ENCODED_LEN`] bytes: the magic
/// `b"uvRR"`, the version (1), a reserved 0 byte, the body's length (u16, 20), then the
/// address (u64), the length (u64) and the rkey (u32). A decoder takes a longer body of the
/// same version (fields a later release may append) and ignores bytes after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    addr: u64,
    len: u64,
    rkey: u32,
}

/// The encoding of a [`RemoteRegion`]; the body of version 1: address, length, rkey.
const FORMAT: Versioned = Versioned {
    magic: *b"uvRR",
    version: 1,
    body: 20,
};

/// A versioned little-endian encoding ([`RemoteRegion`]'s, [`crate::Endpoint`]'s): a
/// [`Versioned::HEADER`] of the magic, the version, a reserved 0 byte and the body's length
/// (u16), then the body. A decoder takes a longer body of its version (fields a later release
/// may append) and ignores the bytes after the body.
pub(crate) struct Versioned {
    /// The four bytes that start the encoding.
    pub(crate) magic: [u8; 4],
    /// The version written, the only one read.
    pub(crate) version: u8,
    /// The length of this version's body.
    pub(crate) body: usize,
}

impl Versioned {
    /// Bytes of the header.
    pub(crate) const HEADER: usize = 8;

    /// The encoded length: the header and this version's body.
    pub(crate) const fn encoded_len(&self) -> usize {
        Self::HEADER + self.body
    }

    /// Writes the header into the start of `out`; returns the rest, where the body goes.
    pub(crate) fn write_header<'a>(&self, out: &'a mut [u8]) -> &'a mut [u8] {
        out[..4].copy_from_slice(&self.magic);
        out[4] = self.version;
        out[6..8].copy_from_slice(&(self.body as u16).to_le_bytes());
        &mut out[Self::HEADER..]
    }

    /// The body of the encoding at the start of `bytes`, checked: the magic, the version, a
    /// body at least this version's and all of it there.
    pub(crate) fn body<'a>(&self, bytes: &'a [u8]) -> Result<&'a [u8], DecodeError> {
        let short = |need| DecodeError::Short { need, got: bytes.len() };
        let header = bytes.get(..Self::HEADER).ok_or(short(Self::HEADER))?;
        if header[..4] != self.magic {
            return Err(DecodeError::BadMagic);
        }
        if header[4] != self.version {
            return Err(DecodeError::Version(header[4]));
        }
        let n = usize::from(u16::from_le_bytes([header[6], header[7]]));
        if n < self.body {
            return Err(DecodeError::BadLength(n));
        }
        bytes.get(Self::HEADER..Self::HEADER + n).ok_or(short(Self::HEADER + n))
    }
}

/// Why bytes could not be decoded ([`RemoteRegion::decode`], [`crate::Endpoint::decode`],
/// [`unframe_private_data`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the encoding says.
    Short {
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        got: usize,
    },
    /// The bytes do not start with the magic: not this encoding.
    BadMagic,
    /// A version this release does not read.
    Version(u8),
    /// A body shorter than its version's.
    BadLength(usize),
    /// A field with a value the encoding does not have.
    Malformed(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Short { need, got } => write!(f, "{got} bytes, the encoding needs {need}"),
            Self::BadMagic => write!(f, "not this encoding (its magic is missing)"),
            Self::Version(v) => write!(
                f,
                "remote region encoding version {v}, this release reads {}",
                FORMAT.version
            ),
            Self::BadLength(n) => write!(f, "a {n}-byte body, shorter than its version's"),
            Self::Malformed(what) => write!(f, "malformed: {what}"),
        }
    }
}

impl std::error::Error for DecodeError {}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        Error::invalid("decode", e.to_string())
    }
}

/// A range that does not fit a [`RemoteRegion`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteOutOfBounds {
    /// Start of the range, from the region's first byte.
    pub offset: u64,
    /// Length of the range.
    pub len: u64,
    /// Length of the region.
    pub region_len: u64,
}

impl std::fmt::Display for RemoteOutOfBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes at offset {} do not fit the peer's {}-byte region",
            self.len, self.offset, self.region_len
        )
    }
}

impl std::error::Error for RemoteOutOfBounds {}

impl From<RemoteOutOfBounds> for WrReject {
    fn from(e: RemoteOutOfBounds) -> Self {
        WrReject::RemoteOutOfBounds {
            offset: e.offset,
            len: e.len,
            region_len: e.region_len,
        }
    }
}

impl From<RemoteOutOfBounds> for Error {
    fn from(e: RemoteOutOfBounds) -> Self {
        Error::invalid("remote region", e.to_string())
    }
}

impl RemoteRegion {
    /// Bytes of [`RemoteRegion::encode`]'s output.
    pub const ENCODED_LEN: usize = FORMAT.encoded_len();

    /// A region from its parts, for a peer that learnt them otherwise (its own protocol).
    pub fn new(addr: u64, rkey: u32, len: u64) -> Self {
        Self { addr, len, rkey }
    }

    /// The address of its first byte, in the owner's region.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes at `offset`, as a region of their own.
    pub fn range(&self, offset: u64, len: u64) -> Result<Self, RemoteOutOfBounds> {
        self.check(offset, len)?;
        Ok(Self {
            addr: self.addr + offset,
            len,
            rkey: self.rkey,
        })
    }

    /// Where an operation on the `len` bytes at `offset` lands, checked against the length.
    pub fn at(&self, offset: u64, len: u64) -> Result<Remote, RemoteOutOfBounds> {
        self.check(offset, len)?;
        Ok(Remote {
            addr: self.addr + offset,
            rkey: self.rkey,
        })
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), RemoteOutOfBounds> {
        match offset.checked_add(len) {
            // `addr + offset` cannot overflow for a region that fits the address space; one
            // made up with `new` may not, and is refused like a range out of bounds.
            Some(end) if end <= self.len && self.addr.checked_add(end).is_some() => Ok(()),
            _ => Err(RemoteOutOfBounds {
                offset,
                len,
                region_len: self.len,
            }),
        }
    }

    /// The fixed little-endian encoding (see the type's docs).
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut b = [0u8; Self::ENCODED_LEN];
        let body = FORMAT.write_header(&mut b);
        body[0..8].copy_from_slice(&self.addr.to_le_bytes());
        body[8..16].copy_from_slice(&self.len.to_le_bytes());
        body[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Reads [`RemoteRegion::encode`]'s bytes from the start of `bytes`; what follows the
    /// encoding (padding, the rest of a message) is ignored. [`RemoteRegion::decoded_len`]
    /// says how many bytes it took.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let body = FORMAT.body(bytes)?;
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().unwrap_or_default());
        Ok(Self {
            addr: u64_at(0),
            len: u64_at(8),
            rkey: u32::from_le_bytes(body[16..20].try_into().unwrap_or_default()),
        })
    }

    /// How many bytes at the start of `bytes` the encoded region takes (its header and body).
    pub fn decoded_len(bytes: &[u8]) -> Result<usize, DecodeError> {
        Ok(Versioned::HEADER + FORMAT.body(bytes)?.len())
    }
}

impl RemoteMr {
    /// The whole region, for a peer to reach ([`RemoteRegion`]).
    pub fn region(&self) -> RemoteRegion {
        RemoteRegion::new(self.addr(), self.rkey(), self.len() as u64)
    }

    /// The `len` bytes at `offset`, for a peer to reach.
    pub fn region_range(&self, offset: usize, len: usize) -> Result<RemoteRegion, OutOfBounds> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => {
                Ok(RemoteRegion::new(self.addr() + offset as u64, self.rkey(), len as u64))
            }
            _ => Err(OutOfBounds {
                offset,
                len,
                mr_len: self.len(),
            }),
        }
    }
}

impl DmabufMr {
    /// The whole region, for a peer to reach ([`RemoteRegion`]).
    pub fn region(&self) -> RemoteRegion {
        RemoteRegion::new(self.addr(), self.rkey(), self.len() as u64)
    }
}

impl Mr {
    /// The whole region, for a peer to read (an [`Mr`] may have remote read access, never
    /// remote write: [`crate::Pd::alloc_mr`]).
    pub fn region(&self) -> RemoteRegion {
        RemoteRegion::new(self.addr(), self.rkey(), self.len() as u64)
    }
}

/// Connection private data with its length in front (a little-endian u16), so that the
/// receiver gets back exactly the bytes sent: the connection manager pads private data with
/// zeros (to 56 bytes for a RoCE connect request), and the padding cannot be told from data
/// that ends in zeros. Read it back with [`unframe_private_data`]. An error for more than
/// 65,535 bytes (far beyond any private data limit).
pub fn frame_private_data(payload: &[u8]) -> crate::Result<Vec<u8>> {
    let len = u16::try_from(payload.len())
        .map_err(|_| Error::invalid("frame_private_data", format!("{} bytes, at most 65535", payload.len())))?;
    let mut out = Vec::with_capacity(2 + payload.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// The payload [`frame_private_data`] framed, from the private data received (padding after
/// it ignored).
pub fn unframe_private_data(bytes: &[u8]) -> Result<&[u8], DecodeError> {
    let short = |need| DecodeError::Short { need, got: bytes.len() };
    let len = bytes.get(..2).ok_or(short(2))?;
    let n = usize::from(u16::from_le_bytes([len[0], len[1]]));
    bytes.get(2..2 + n).ok_or(short(2 + n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_encodes_to_fixed_little_endian_bytes_and_back() {
        let r = RemoteRegion::new(0x1122_3344_5566_7788, 0xAABB_CCDD, 0x10000);
        let b = r.encode();
        assert_eq!(&b[..8], b"uvRR\x01\x00\x14\x00");
        assert_eq!(b[8..16], 0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(b[16..24], 0x10000u64.to_le_bytes());
        assert_eq!(b[24..28], 0xAABB_CCDDu32.to_le_bytes());
        assert_eq!(RemoteRegion::decode(&b), Ok(r));
        // Zero padding after it (private data comes back padded) is ignored.
        let mut padded = [0u8; 56];
        padded[..b.len()].copy_from_slice(&b);
        assert_eq!(RemoteRegion::decode(&padded), Ok(r));
        assert_eq!(RemoteRegion::decoded_len(&padded), Ok(RemoteRegion::ENCODED_LEN));
    }

    #[test]
    fn bad_encodings_are_typed_errors() {
        let b = RemoteRegion::new(1, 2, 3).encode();
        assert_eq!(
            RemoteRegion::decode(&b[..10]),
            Err(DecodeError::Short { need: 28, got: 10 })
        );
        assert_eq!(RemoteRegion::decode(&[]), Err(DecodeError::Short { need: 8, got: 0 }));
        assert_eq!(RemoteRegion::decode(&[0; 56]), Err(DecodeError::BadMagic));
        let mut v2 = b;
        v2[4] = 2;
        assert_eq!(RemoteRegion::decode(&v2), Err(DecodeError::Version(2)));
        let mut short_body = b;
        short_body[6] = 4;
        assert_eq!(RemoteRegion::decode(&short_body), Err(DecodeError::BadLength(4)));
        // A longer body of the same version: fields a later release appends, ignored.
        let mut longer = b.to_vec();
        longer[6] = 24;
        longer.extend_from_slice(&[9; 4]);
        assert_eq!(RemoteRegion::decode(&longer), Ok(RemoteRegion::new(1, 2, 3)));
        assert_eq!(RemoteRegion::decoded_len(&longer), Ok(32));
    }

    #[test]
    fn ranges_are_checked_against_the_length() {
        let r = RemoteRegion::new(0x1000, 7, 100);
        assert_eq!(r.at(0, 100).map(|a| a.addr), Ok(0x1000));
        assert_eq!(r.at(100, 0).map(|a| a.addr), Ok(0x1000 + 100));
        let err = RemoteOutOfBounds {
            offset: 96,
            len: 8,
            region_len: 100,
        };
        assert_eq!(r.at(96, 8), Err(err));
        assert!(r.at(u64::MAX, 2).is_err(), "overflow is out of bounds");
        let sub = r.range(10, 20).unwrap();
        assert_eq!((sub.addr(), sub.len(), sub.rkey()), (0x1000 + 10, 20, 7));
        assert!(sub.at(0, 21).is_err(), "a sub-range is bounded by its own length");
        assert!(
            RemoteRegion::new(u64::MAX - 4, 1, 100).at(8, 1).is_err(),
            "past the address space"
        );
    }

    #[test]
    fn framed_private_data_keeps_its_length_through_padding() {
        let framed = frame_private_data(b"ends in zeros\0\0").unwrap();
        let mut padded = [0u8; 56];
        padded[..framed.len()].copy_from_slice(&framed);
        assert_eq!(unframe_private_data(&padded), Ok(&b"ends in zeros\0\0"[..]));
        assert_eq!(unframe_private_data(&frame_private_data(b"").unwrap()), Ok(&b""[..]));
        assert_eq!(
            unframe_private_data(&[5, 0, 1]),
            Err(DecodeError::Short { need: 7, got: 3 })
        );
        assert!(frame_private_data(&vec![0; 70_000]).is_err());
    }
}
