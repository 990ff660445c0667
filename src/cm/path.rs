//! IB path records: the route a connection takes, as `QUERY` reports it and as
//! [`super::CmOption::IbPath`] sets it, in the SA's 64-byte wire format.

use super::id::CmId;
use crate::error::{Error, Result, Verb};
use crate::sys::ucma::{self, path_flags, Query, QueryPath, QueryPathResp, MAX_PATHS, QUERY_PATH};
use zerocopy::FromZeros;

/// An IB path record (IBA 15.2.5.16, Linux's `struct sa_path_rec` as the SA packs it). On
/// RoCE the GIDs are the IP addresses (IPv4-mapped) and the kernel fills in the Ethernet
/// fields itself; the LIDs mean nothing there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathRecord {
    /// The service id (the RDMA CM's is its port space and port).
    pub service_id: u64,
    /// The destination GID.
    pub dgid: [u8; 16],
    /// The source GID.
    pub sgid: [u8; 16],
    /// The destination LID.
    pub dlid: u16,
    /// The source LID.
    pub slid: u16,
    /// Raw (non-IBA) traffic.
    pub raw_traffic: bool,
    /// The GRH flow label, 20 bits.
    pub flow_label: u32,
    /// The GRH hop limit.
    pub hop_limit: u8,
    /// The GRH traffic class (on RoCE the IP header's TOS byte).
    pub traffic_class: u8,
    /// The path works both ways.
    pub reversible: bool,
    /// How many paths the query asked for, 7 bits.
    pub numb_path: u8,
    /// The partition key.
    pub pkey: u16,
    /// The QoS class, 12 bits.
    pub qos_class: u16,
    /// The service level, 4 bits.
    pub sl: u8,
    /// How `mtu` bounds the path's MTU (0: greater than, 1: less than, 2: exactly, 3: the
    /// largest), 2 bits.
    pub mtu_selector: u8,
    /// The MTU code (1: 256 bytes … 5: 4096), 6 bits.
    pub mtu: u8,
    /// As `mtu_selector`, for `rate`.
    pub rate_selector: u8,
    /// The static rate code (`enum ib_rate`), 6 bits.
    pub rate: u8,
    /// As `mtu_selector`, for `packet_life_time`.
    pub packet_life_time_selector: u8,
    /// The packet lifetime, 4.096 µs × 2^n, 6 bits.
    pub packet_life_time: u8,
    /// The SA's preference among paths (0: best).
    pub preference: u8,
}

/// Bytes of a packed record.
pub(crate) const PACKED: usize = 64;

impl PathRecord {
    /// The record in the SA's wire format. Fields wider than their bits are refused.
    pub(crate) fn pack(&self, verb: Verb) -> Result<[u8; PACKED]> {
        let fits = |what: &str, value: u32, bits: u32| {
            if value >> bits != 0 {
                return Err(Error::invalid(
                    verb,
                    format!("path record {what} {value} exceeds {bits} bits"),
                ));
            }
            Ok(())
        };
        fits("flow_label", self.flow_label, 20)?;
        fits("numb_path", self.numb_path.into(), 7)?;
        fits("qos_class", self.qos_class.into(), 12)?;
        fits("sl", self.sl.into(), 4)?;
        for (what, selector, value) in [
            ("mtu", self.mtu_selector, self.mtu),
            ("rate", self.rate_selector, self.rate),
            (
                "packet_life_time",
                self.packet_life_time_selector,
                self.packet_life_time,
            ),
        ] {
            fits(what, value.into(), 6)?;
            fits("selector", selector.into(), 2)?;
        }
        let mut b = [0u8; PACKED];
        b[0..8].copy_from_slice(&self.service_id.to_be_bytes());
        b[8..24].copy_from_slice(&self.dgid);
        b[24..40].copy_from_slice(&self.sgid);
        b[40..42].copy_from_slice(&self.dlid.to_be_bytes());
        b[42..44].copy_from_slice(&self.slid.to_be_bytes());
        let word = (u32::from(self.raw_traffic) << 31) | (self.flow_label << 8) | u32::from(self.hop_limit);
        b[44..48].copy_from_slice(&word.to_be_bytes());
        b[48] = self.traffic_class;
        b[49] = (u8::from(self.reversible) << 7) | self.numb_path;
        b[50..52].copy_from_slice(&self.pkey.to_be_bytes());
        b[52..54].copy_from_slice(&((self.qos_class << 4) | u16::from(self.sl)).to_be_bytes());
        b[54] = (self.mtu_selector << 6) | self.mtu;
        b[55] = (self.rate_selector << 6) | self.rate;
        b[56] = (self.packet_life_time_selector << 6) | self.packet_life_time;
        b[57] = self.preference;
        Ok(b)
    }

    /// A record from the SA's wire format (every bit pattern is one).
    pub(crate) fn unpack(b: &[u8; PACKED]) -> Self {
        let be16 = |at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
        let word = u32::from_be_bytes([b[44], b[45], b[46], b[47]]);
        let gid = |at: usize| {
            let mut g = [0u8; 16];
            g.copy_from_slice(&b[at..at + 16]);
            g
        };
        Self {
            service_id: u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            dgid: gid(8),
            sgid: gid(24),
            dlid: be16(40),
            slid: be16(42),
            raw_traffic: word >> 31 != 0,
            flow_label: (word >> 8) & 0xf_ffff,
            hop_limit: word as u8,
            traffic_class: b[48],
            reversible: b[49] >> 7 != 0,
            numb_path: b[49] & 0x7f,
            pkey: be16(50),
            qos_class: be16(52) >> 4,
            sl: (be16(52) & 0xf) as u8,
            mtu_selector: b[54] >> 6,
            mtu: b[54] & 0x3f,
            rate_selector: b[55] >> 6,
            rate: b[55] & 0x3f,
            packet_life_time_selector: b[56] >> 6,
            packet_life_time: b[56] & 0x3f,
            preference: b[57],
        }
    }
}

/// The flags of a path that serves a connection both ways (what QUERY reports and
/// `RDMA_OPTION_IB_PATH` looks for).
pub(crate) const PRIMARY_BOTH_WAYS: u32 = path_flags::GMP | path_flags::PRIMARY | path_flags::BIDIRECTIONAL;

impl CmId {
    /// The route's paths, primary first (`QUERY` of the paths): empty until the route is
    /// resolved.
    pub fn query_path(&self) -> Result<Vec<PathRecord>> {
        let req = QueryPath(Query {
            response: 0,
            id: self.kernel_id(),
            option: QUERY_PATH,
        });
        let r = ucma::call(self.channel_fd(), &req, QueryPathResp::new_zeroed())?;
        let n = usize::try_from(r.num_paths).unwrap_or(usize::MAX).min(MAX_PATHS);
        Ok(r.path_data[..n]
            .iter()
            .map(|p| PathRecord::unpack(&p.path_rec))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A RoCE record as 6.1's `ib_sa_pack_path` lays it out: every field at its IBA bit
    /// position, and back.
    #[test]
    fn records_pack_at_the_iba_bit_positions_and_back() {
        let mut sgid = [0u8; 16];
        sgid[10..].copy_from_slice(&[0xff, 0xff, 169, 254, 77, 1]);
        let rec = PathRecord {
            service_id: 0x0000_0000_0106_1d4f,
            dgid: [7; 16],
            sgid,
            dlid: 0x1234,
            slid: 0x5678,
            raw_traffic: true,
            flow_label: 0xabcde,
            hop_limit: 64,
            traffic_class: 0x68,
            reversible: true,
            numb_path: 1,
            pkey: 0xffff,
            qos_class: 0x123,
            sl: 5,
            mtu_selector: 2,
            mtu: 3,
            rate_selector: 2,
            rate: 16,
            packet_life_time_selector: 2,
            packet_life_time: 17,
            preference: 9,
        };
        let b = rec.pack("test").unwrap();
        assert_eq!(&b[0..8], &[0, 0, 0, 0, 0x01, 0x06, 0x1d, 0x4f]);
        assert_eq!(&b[24..40], &sgid);
        assert_eq!(&b[40..44], &[0x12, 0x34, 0x56, 0x78]);
        assert_eq!(&b[44..48], &[0x8a, 0xbc, 0xde, 64]);
        assert_eq!(&b[48..58], &[0x68, 0x81, 0xff, 0xff, 0x12, 0x35, 0x83, 0x90, 0x91, 9]);
        assert_eq!(&b[58..], &[0; 6]);
        assert_eq!(PathRecord::unpack(&b), rec);
        let wide = PathRecord { sl: 16, ..rec };
        assert!(matches!(wide.pack("test"), Err(Error::InvalidArgument { .. })));
        let wide = PathRecord { mtu_selector: 4, ..rec };
        assert!(matches!(wide.pack("test"), Err(Error::InvalidArgument { .. })));
    }
}
