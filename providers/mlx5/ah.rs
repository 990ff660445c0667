//! mlx5 address handles: the 48-byte address vector (`struct mlx5_wqe_av`) every UD send
//! copies into its datagram segment, built in user space as libmlx5 builds it
//! (`verbs.c` `mlx5_create_ah`) for an InfiniBand port, or for a RoCE port with the
//! destination MAC the kernel resolved and the source GID's type. The AH's provider value is the address of its
//! vector, boxed here and freed by [`destroy`].

use super::abi;
use super::wqe::SEG;
use crate::attr::{AhAttr, GidType};
use crate::error::{Error, Result};
use crate::provider::KernelCall;
use zerocopy::IntoBytes;

/// Bytes of an address vector: three segments.
pub(super) const AV_SIZE: usize = 3 * SEG;

/// `MLX5_EXTENDED_UD_AV`: set in every datagram segment's `dqp_dct` (libmlx5 always
/// writes the extended form).
const EXTENDED_UD_AV: u32 = 0x8000_0000;
/// `grh_gid_fl` bit 30: the packet carries a GRH (InfiniBand; RoCE always has one).
const GRH_PRESENT: u32 = 1 << 30;
/// `IB_GRH_FLOWLABEL_MASK`.
const FLOW_LABEL: u32 = 0xf_ffff;

/// The bytes of a `struct mlx5_wqe_av` with the Q_Key and destination QP left 0: each send
/// sets its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AddressVector([u8; AV_SIZE]);

impl AddressVector {
    /// libmlx5's vector for `attr` on an InfiniBand port: `fl_mlid` the source path bits,
    /// `rlid` the destination LID, `stat_rate_sl` the mlx5 rate and the 4-bit SL; with a
    /// GRH, `grh_gid_fl` (present, source GID index, flow label), traffic class, hop
    /// limit and the destination GID.
    pub(super) fn infiniband(attr: &AhAttr) -> Self {
        let mut av = [0u8; AV_SIZE];
        av[12] = (mlx5_rate(attr.static_rate) << 4) | (attr.sl & 0xf);
        av[13] = attr.src_path_bits & 0x7f;
        av[14..16].copy_from_slice(&attr.dlid.to_be_bytes());
        if let Some(grh) = attr.grh {
            av[26] = grh.traffic_class;
            av[27] = grh.hop_limit;
            let gid_fl = GRH_PRESENT | (u32::from(grh.sgid_index) << 20) | (grh.flow_label & FLOW_LABEL);
            av[28..32].copy_from_slice(&gid_fl.to_be_bytes());
            av[32..48].copy_from_slice(&grh.dgid);
        }
        Self(av)
    }

    /// libmlx5's vector for `attr` on a RoCE port, sending to `dmac` from a source GID of
    /// type `sgid_type`: `stat_rate_sl` the mlx5 rate and the 3-bit priority in bits 1-3;
    /// the GRH fields with `grh_gid_fl`'s bit 30 clear (reserved on RoCE: every packet has
    /// one); `rmac`; and in `rlid` RoCE v2's UDP source port for a v2 GID, 0 for any other
    /// (a v1 packet has no UDP header).
    pub(super) fn roce(attr: &AhAttr, sgid_type: GidType, dmac: [u8; 6]) -> Self {
        let mut av = [0u8; AV_SIZE];
        av[12] = (mlx5_rate(attr.static_rate) << 4) | ((attr.sl & 0x7) << 1);
        let grh = attr.grh.unwrap_or_default();
        if sgid_type == GidType::ROCE_V2 {
            av[14..16].copy_from_slice(&udp_sport(grh.flow_label, &grh.dgid).to_be_bytes());
        }
        av[20..26].copy_from_slice(&dmac);
        av[26] = grh.traffic_class;
        av[27] = grh.hop_limit;
        let gid_fl = (u32::from(grh.sgid_index) << 20) | (grh.flow_label & FLOW_LABEL);
        av[28..32].copy_from_slice(&gid_fl.to_be_bytes());
        av[32..48].copy_from_slice(&grh.dgid);
        Self(av)
    }

    /// The datagram segment of a send to `remote_qpn` with `remote_qkey` (libmlx5
    /// `_set_datagram_seg`): the vector with the key and destination filled in, as three
    /// segments.
    pub(super) fn datagram_seg(&self, remote_qpn: u32, remote_qkey: u32) -> [[u8; SEG]; 3] {
        let mut av = self.0;
        av[0..4].copy_from_slice(&remote_qkey.to_be_bytes());
        av[8..12].copy_from_slice(&(remote_qpn | EXTENDED_UD_AV).to_be_bytes());
        let mut segs = [[0u8; SEG]; 3];
        for (seg, bytes) in segs.iter_mut().zip(av.chunks_exact(SEG)) {
            seg.copy_from_slice(bytes);
        }
        segs
    }
}

/// `ibv_rate` to the mlx5 static rate (libmlx5 `ah_attr_to_mlx5_rate`, IB spec 1.3 table
/// 224 on a best-effort basis): 0 (unlimited) for what the table does not name.
fn mlx5_rate(rate: u8) -> u8 {
    const TABLE: [u8; 24] = [
        0, 0, 7, 8, 9, 10, 11, 12, 13, 14, 15, 11, 13, 15, 0, 9, 15, 0, 0, 9, 13, 0, 0, 0,
    ];
    TABLE.get(usize::from(rate)).copied().unwrap_or(0)
}

/// RoCE v2's UDP source port for a vector: from the flow label as
/// `ibv_flow_label_to_udp_sport` does, else (libmlx5 draws a random one) from the DGID, so
/// that each destination keeps one port; both in 0xc000..=0xffff.
fn udp_sport(flow_label: u32, dgid: &[u8; 16]) -> u16 {
    let fl = match flow_label & FLOW_LABEL {
        0 => {
            dgid.chunks_exact(4).fold(0u32, |h, c| {
                h.rotate_left(5) ^ u32::from_be_bytes([c[0], c[1], c[2], c[3]])
            }) & FLOW_LABEL
        }
        fl => fl,
    };
    let (low, high) = (fl & 0x3fff, fl & 0xf_c000);
    ((low ^ (high >> 14)) as u16) | 0xc000
}

/// CREATE_AH with room for the driver's answer, then the vector (for a source GID of
/// `sgid_type`), boxed; its address is the AH's provider value.
pub(super) fn create(attr: &AhAttr, sgid_type: Option<GidType>, kernel: KernelCall<'_, u32>) -> Result<u64> {
    let mut resp = abi::CreateAhResp::default();
    kernel(&[], resp.as_mut_bytes())?;
    // hw/mlx5/ah.c:106-120: the driver answers (the destination MAC, response_length 10)
    // for a RoCE AH only; an InfiniBand AH leaves the buffer alone.
    let av = match resp.response_length {
        0 => AddressVector::infiniband(attr),
        n if n >= 10 && attr.grh.is_some() => AddressVector::roce(attr, sgid_type.unwrap_or_default(), resp.dmac),
        n => {
            return Err(Error::malformed(
                "CREATE_AH",
                format!("driver response_length {n} (a RoCE answer has 10 and a GRH)"),
            ))
        }
    };
    Ok(Box::into_raw(Box::new(av)) as u64)
}

/// The vector behind an AH's provider value.
///
/// # Safety
/// `data` is a value [`create`] returned whose AH has not been destroyed; the vector is
/// only read while that AH lives.
pub(super) unsafe fn vector<'a>(data: u64) -> &'a AddressVector {
    // SAFETY: per our contract, `data` is the address of a live boxed vector.
    unsafe { &*(data as *const AddressVector) }
}

/// Frees the vector of an AH the kernel destroyed.
///
/// # Safety
/// `data` is a value [`create`] returned, passed here once, after its last use.
pub(super) unsafe fn destroy(data: u64) {
    // SAFETY: per our contract, `data` came from `Box::into_raw` in `create` and is freed
    // only here, once.
    drop(unsafe { Box::from_raw(data as *mut AddressVector) });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::GlobalRoute;

    /// Vectors as libmlx5 writes them (the bytes of `struct mlx5_wqe_av`).
    #[test]
    fn vectors_and_datagram_segments_have_libmlx5_bytes() {
        let plain = AhAttr {
            port_num: 1,
            dlid: 0x1234,
            sl: 0x1b,
            src_path_bits: 0xff,
            static_rate: 3,
            grh: None,
        };
        let av = AddressVector::infiniband(&plain);
        let mut want = [0u8; AV_SIZE];
        (want[12], want[13], want[14], want[15]) = ((8 << 4) | 0xb, 0x7f, 0x12, 0x34);
        assert_eq!(av.0, want);
        let global = AhAttr {
            static_rate: 99,
            grh: Some(GlobalRoute {
                dgid: [0xd0; 16],
                flow_label: 0xfff_ffff,
                sgid_index: 2,
                hop_limit: 64,
                traffic_class: 3,
            }),
            ..plain
        };
        let av = AddressVector::infiniband(&global);
        assert_eq!(av.0[12], 0xb, "rates beyond the table are unlimited");
        assert_eq!(av.0[26..32], [3, 64, 0x40, 0x2f, 0xff, 0xff]);
        assert_eq!(av.0[32..48], [0xd0; 16]);
        let segs = av.datagram_seg(0xab_cdef, 0x1111_2222);
        assert_eq!(
            segs[0],
            [0x11, 0x11, 0x22, 0x22, 0, 0, 0, 0, 0x80, 0xab, 0xcd, 0xef, 0xb, 0x7f, 0x12, 0x34]
        );
        assert_eq!(segs[1][10..16], [3, 64, 0x40, 0x2f, 0xff, 0xff]);
        assert_eq!(segs[2], [0xd0; 16]);
    }

    /// A RoCE vector: priority in bits 1-3, no GRH bit, the MAC, the UDP source port in
    /// `rlid`, the GRH fields.
    #[test]
    fn roce_vectors_carry_the_mac_and_udp_source_port() {
        let attr = AhAttr {
            port_num: 1,
            sl: 0xd,
            static_rate: 3,
            grh: Some(GlobalRoute {
                dgid: [0xd0; 16],
                flow_label: 0x1_2345,
                sgid_index: 3,
                hop_limit: 64,
                traffic_class: 8,
            }),
            ..Default::default()
        };
        let av = AddressVector::roce(&attr, GidType::ROCE_V2, [2, 0, 0xc9, 0, 1, 2]);
        assert_eq!(av.0[12], (8 << 4) | (5 << 1));
        assert_eq!(av.0[13], 0);
        // ibv_flow_label_to_udp_sport(0x12345): (0x2345 ^ (0x10000 >> 14)) | 0xc000.
        assert_eq!(av.0[14..16], (0xc000u16 | 0x2345 ^ 0x4).to_be_bytes());
        assert_eq!(av.0[20..26], [2, 0, 0xc9, 0, 1, 2]);
        assert_eq!(av.0[26..32], [8, 64, 0x00, 0x31, 0x23, 0x45]);
        assert_eq!(av.0[32..48], [0xd0; 16]);
        let mut no_fl = attr;
        no_fl.grh.as_mut().unwrap().flow_label = 0;
        let sport = u16::from_be_bytes(
            AddressVector::roce(&no_fl, GidType::ROCE_V2, [0; 6]).0[14..16]
                .try_into()
                .unwrap(),
        );
        assert!(sport >= 0xc000);
    }

    /// What `create` builds from the kernel's RoCE answer: `rlid` (WQE bytes 30-31 once in
    /// a datagram segment) holds the UDP source port for a RoCE v2 source GID and 0 for a
    /// v1 one, as libmlx5 writes them; the rest of the vector is the same for both.
    #[test]
    fn rlid_is_the_udp_source_port_for_v2_and_0_for_v1() {
        let attr = AhAttr {
            port_num: 1,
            sl: 2,
            grh: Some(GlobalRoute {
                dgid: [0xfe; 16],
                flow_label: 0x2_0001,
                sgid_index: 0,
                hop_limit: 64,
                traffic_class: 0,
            }),
            ..Default::default()
        };
        let build = |ty: GidType| {
            let mut kernel = |drv_in: &[u8], drv_out: &mut [u8]| -> Result<u32> {
                assert!(drv_in.is_empty());
                let resp = abi::CreateAhResp {
                    response_length: 10,
                    dmac: [2, 0, 0xc9, 0, 0, 7],
                    reserved: [0; 6],
                };
                drv_out.copy_from_slice(resp.as_bytes());
                Ok(5)
            };
            let data = create(&attr, Some(ty), &mut kernel).unwrap();
            // SAFETY: `data` is what `create` just returned; it is read, then freed once.
            let av = unsafe { *vector(data) };
            // SAFETY: as above, no use after this.
            unsafe { destroy(data) };
            av
        };
        let (v1, v2) = (build(GidType::ROCE_V1), build(GidType::ROCE_V2));
        assert_eq!(v1.0[14..16], [0, 0], "no UDP port for a RoCE v1 GID");
        // ibv_flow_label_to_udp_sport(0x20001): (0x0001 ^ (0x20000 >> 14)) | 0xc000.
        assert_eq!(v2.0[14..16], 0xc009u16.to_be_bytes());
        assert_eq!(v1.datagram_seg(1, 2)[0][14..16], [0, 0]);
        assert_eq!(v2.datagram_seg(1, 2)[0][14..16], [0xc0, 0x09]);
        let mut same = v2;
        same.0[14..16].fill(0);
        assert_eq!(v1, same);
        assert_eq!(v1.0[20..26], [2, 0, 0xc9, 0, 0, 7]);
    }
}
