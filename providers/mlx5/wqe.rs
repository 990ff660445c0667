//! Work queue entry segments, big-endian as the device reads them (`mlx5dv.h`'s
//! `struct mlx5_wqe_*_seg`). Each encoder returns the segment as two 8-byte words in the
//! device's byte order (the send queue stores them) and as bytes (the receive queues and the
//! checks against `mlx5dv.h`); the queues write whole segments, wrapping at the ring's end.

/// Bytes in one segment unit: a WQE's size is counted in these (`ds`).
pub const SEG: usize = 16;
/// `MLX5_SEND_WQE_BB`: a send WQE occupies whole basic blocks of this size.
pub const SEND_WQE_BB: usize = 64;
/// `MLX5_INLINE_SEG`: the bit marking an inline data segment's byte count.
pub const INLINE_SEG: u32 = 0x8000_0000;
/// `MLX5_INVALID_LKEY`: ends a receive WQE's scatter list when it has fewer entries than
/// the queue's maximum.
pub const INVALID_LKEY: u32 = 0x100;

/// Send WQE opcodes (`MLX5_OPCODE_*`), as the control segment and requester CQEs carry them.
pub mod opcode {
    pub const SEND_INVAL: u8 = 0x01;
    pub const RDMA_WRITE: u8 = 0x08;
    pub const RDMA_WRITE_IMM: u8 = 0x09;
    pub const SEND: u8 = 0x0a;
    pub const SEND_IMM: u8 = 0x0b;
    pub const RDMA_READ: u8 = 0x10;
    pub const ATOMIC_CS: u8 = 0x11;
    pub const ATOMIC_FA: u8 = 0x12;
}

/// The control segment's `fm_ce_se` bits (`MLX5_WQE_CTRL_*`).
pub mod ctrl_flags {
    /// Generate a CQE.
    pub const CQ_UPDATE: u8 = 0x08;
    /// Set the solicited-event bit at the responder.
    pub const SOLICITED: u8 = 0x02;
    /// Wait for earlier reads and atomics.
    pub const FENCE: u8 = 0x80;
}

/// The fields of a control segment (`mlx5dv_set_ctrl_seg`'s arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ctrl {
    /// The WQE's producer index (in basic blocks, modulo 2^16).
    pub pi: u16,
    pub opcode: u8,
    pub opmod: u8,
    pub qpn: u32,
    pub fm_ce_se: u8,
    /// The WQE's size in 16-byte units.
    pub ds: u8,
    pub signature: u8,
    /// Immediate data as it goes on the wire: already in network byte order, stored as is.
    pub imm: u32,
}

/// A 16-byte segment as the two 8-byte words a ring holds, each already in the device's
/// byte order: storing them in native order puts the segment's bytes in place. The posting
/// path writes these; the byte forms below are their bytes.
pub type Words = [u64; 2];

/// The bytes of a segment in word form.
pub fn bytes(words: Words) -> [u8; SEG] {
    let mut s = [0; SEG];
    s[..8].copy_from_slice(&words[0].to_ne_bytes());
    s[8..].copy_from_slice(&words[1].to_ne_bytes());
    s
}

/// The byte of a control segment that holds `ds` (the low byte of `qpn_ds`).
pub const CTRL_DS_BYTE: usize = 7;

/// `struct mlx5_wqe_ctrl_seg` (`dci_stream_channel_id` zero): `opmod_idx_opcode` and `qpn_ds`
/// (the QPN's low 24 bits), then `signature`, `fm_ce_se` and the immediate data.
#[inline(always)]
pub fn ctrl_words(c: &Ctrl) -> Words {
    let first = u64::from(c.opmod) << 56
        | u64::from(c.pi) << 40
        | u64::from(c.opcode) << 32
        | u64::from(c.qpn & 0xff_ffff) << 8
        | u64::from(c.ds);
    let second = u64::from(c.signature) << 56 | u64::from(c.fm_ce_se) << 32 | u64::from(u32::from_be(c.imm));
    [first.to_be(), second.to_be()]
}

/// `struct mlx5_wqe_ctrl_seg` (16 bytes).
#[cfg(test)]
pub fn ctrl_seg(c: &Ctrl) -> [u8; SEG] {
    bytes(ctrl_words(c))
}

/// `struct mlx5_wqe_data_seg`: one scatter/gather entry.
#[inline(always)]
pub fn data_words(length: u32, lkey: u32, addr: u64) -> Words {
    [(u64::from(length) << 32 | u64::from(lkey)).to_be(), addr.to_be()]
}

/// `struct mlx5_wqe_data_seg`, bytes.
pub fn data_seg(length: u32, lkey: u32, addr: u64) -> [u8; SEG] {
    bytes(data_words(length, lkey, addr))
}

/// The data segment that ends a receive WQE with fewer entries than its room.
pub fn rq_terminator() -> [u8; SEG] {
    data_seg(0, INVALID_LKEY, 0)
}

/// `struct mlx5_wqe_raddr_seg`: the remote address of an RDMA operation or atomic.
#[inline(always)]
pub fn raddr_words(raddr: u64, rkey: u32) -> Words {
    [raddr.to_be(), (u64::from(rkey) << 32).to_be()]
}

/// `struct mlx5_wqe_raddr_seg`, bytes.
#[cfg(test)]
pub fn raddr_seg(raddr: u64, rkey: u32) -> [u8; SEG] {
    bytes(raddr_words(raddr, rkey))
}

/// `struct mlx5_wqe_atomic_seg`: the operands of a compare-and-swap (`swap_add` = swap) or
/// fetch-and-add (`swap_add` = add, `compare` 0).
#[inline(always)]
pub fn atomic_words(swap_add: u64, compare: u64) -> Words {
    [swap_add.to_be(), compare.to_be()]
}

/// `struct mlx5_wqe_atomic_seg`, bytes.
#[cfg(test)]
pub fn atomic_seg(swap_add: u64, compare: u64) -> [u8; SEG] {
    bytes(atomic_words(swap_add, compare))
}

/// `struct mlx5_wqe_inl_data_seg`: the 4-byte header of `len` bytes of inline data, which
/// follow it directly (the segment is padded to a 16-byte multiple).
pub fn inline_header(len: u32) -> [u8; 4] {
    (len | INLINE_SEG).to_be_bytes()
}

/// 16-byte units of an inline segment carrying `len` bytes.
pub fn inline_units(len: usize) -> usize {
    (len + 4).div_ceil(SEG)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The captures in the reference (libmlx5 on QPN 0x1c0).
    #[test]
    fn control_segments_match_libmlx5_captures() {
        let send = Ctrl {
            pi: 0,
            opcode: opcode::SEND,
            opmod: 0,
            qpn: 0x1c0,
            fm_ce_se: ctrl_flags::CQ_UPDATE,
            ds: 2,
            signature: 0,
            imm: 0,
        };
        assert_eq!(ctrl_seg(&send), [0, 0, 0, 0x0a, 0, 1, 0xc0, 2, 0, 0, 0, 8, 0, 0, 0, 0]);
        let send_imm = Ctrl {
            pi: 1,
            opcode: opcode::SEND_IMM,
            fm_ce_se: ctrl_flags::SOLICITED,
            imm: u32::from_ne_bytes([0xde, 0xad, 0xbe, 0xef]),
            ..send
        };
        assert_eq!(
            ctrl_seg(&send_imm),
            [0, 0, 1, 0x0b, 0, 1, 0xc0, 2, 0, 0, 0, 2, 0xde, 0xad, 0xbe, 0xef]
        );
        assert_eq!(inline_header(40), [0x80, 0, 0, 0x28]);
        assert_eq!(inline_units(40), 3);
        assert_eq!(inline_units(12), 1);
        assert_eq!(inline_units(13), 2);
        assert_eq!(rq_terminator(), [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }
}
