//! The fabric's packets: one request from a requester QP and the responder's answer, as
//! length-prefixed little-endian frames on a stream socket.

/// What the requester asks of the responder's QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Send {
        imm: Option<u32>,
        solicited: bool,
        data: Vec<u8>,
        /// What a UD send carries besides: `None` on a connected QP.
        datagram: Option<Datagram>,
    },
    Write {
        raddr: u64,
        rkey: u32,
        imm: Option<u32>,
        solicited: bool,
        data: Vec<u8>,
    },
    Read {
        raddr: u64,
        rkey: u32,
        len: u32,
    },
    CompareSwap {
        raddr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        raddr: u64,
        rkey: u32,
        add: u64,
    },
}

/// What a UD send carries besides its headers: the DETH's Q_Key and the service level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    pub qkey: u32,
    pub sl: u8,
}

/// The global route header (InfiniBand GRH, RoCE v1 GRH, or the IP header of RoCE v2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grh {
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
    pub tclass: u8,
    pub hop_limit: u8,
    pub flow_label: u32,
}

/// The Ethernet frame around a RoCE packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Eth {
    pub dmac: [u8; 6],
    pub smac: [u8; 6],
    /// RoCE v2 (UDP/IP, destination port 4791) rather than v1 (Ethertype 0x8915, a GRH).
    pub v2: bool,
    /// RoCE v2's UDP source port.
    pub udp_sport: u16,
}

/// The headers of a packet that the receiving device checks before it runs the request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Headers {
    /// InfiniBand LRH: the destination LID (0 on Ethernet).
    pub dlid: u16,
    /// BTH: the P_Key.
    pub pkey: u16,
    /// BTH: the PSN of the message's first packet.
    pub psn: u32,
    /// PSNs the message takes (its packets; a READ's, its response packets).
    pub npkts: u32,
    pub grh: Option<Grh>,
    pub eth: Option<Eth>,
}

/// One request packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub dst_qpn: u32,
    pub src_qpn: u32,
    pub src_lid: u16,
    pub hdr: Headers,
    pub op: Op,
}

/// The responder's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Ack,
    ReadData(Vec<u8>),
    AtomicOriginal(u64),
    /// A NAK with the syndrome the requester reports.
    Nak(u8),
    /// Receiver not ready, with the responder's `min_rnr_timer`.
    Rnr(u8),
    /// No QP took the packet (wrong QPN, state or connection): the requester times out.
    Dropped,
}

/// Longest message the fabric carries (the port's `max_msg_sz`).
pub const MAX_MESSAGE: usize = 1 << 30;

struct Writer(Vec<u8>);
impl Writer {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn imm(&mut self, v: Option<u32>) -> &mut Self {
        self.u8(u8::from(v.is_some())).u32(v.unwrap_or(0))
    }
    fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
}

struct Reader<'a>(&'a [u8]);
impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn imm(&mut self) -> Option<Option<u32>> {
        let present = self.u8()?;
        let v = self.u32()?;
        Some((present != 0).then_some(v))
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let len = self.u32()? as usize;
        if len > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(head.to_vec())
    }
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        w.u32(self.dst_qpn).u32(self.src_qpn).u16(self.src_lid);
        let h = &self.hdr;
        w.u16(h.dlid).u16(h.pkey).u32(h.psn).u32(h.npkts);
        match &h.grh {
            None => w.u8(0),
            Some(g) => w
                .u8(1)
                .raw(&g.sgid)
                .raw(&g.dgid)
                .u8(g.tclass)
                .u8(g.hop_limit)
                .u32(g.flow_label),
        };
        match &h.eth {
            None => w.u8(0),
            Some(e) => w.u8(1).raw(&e.dmac).raw(&e.smac).u8(u8::from(e.v2)).u16(e.udp_sport),
        };
        match &self.op {
            Op::Send {
                imm,
                solicited,
                data,
                datagram,
            } => {
                w.u8(0).imm(*imm).u8(u8::from(*solicited)).bytes(data);
                match datagram {
                    None => w.u8(0),
                    Some(d) => w.u8(1).u32(d.qkey).u8(d.sl),
                }
            }
            Op::Write {
                raddr,
                rkey,
                imm,
                solicited,
                data,
            } => w
                .u8(1)
                .u64(*raddr)
                .u32(*rkey)
                .imm(*imm)
                .u8(u8::from(*solicited))
                .bytes(data),
            Op::Read { raddr, rkey, len } => w.u8(2).u64(*raddr).u32(*rkey).u32(*len),
            Op::CompareSwap {
                raddr,
                rkey,
                compare,
                swap,
            } => w.u8(3).u64(*raddr).u32(*rkey).u64(*compare).u64(*swap),
            Op::FetchAdd { raddr, rkey, add } => w.u8(4).u64(*raddr).u32(*rkey).u64(*add),
        };
        w.0
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        let (dst_qpn, src_qpn, src_lid) = (r.u32()?, r.u32()?, r.u16()?);
        let mut hdr = Headers {
            dlid: r.u16()?,
            pkey: r.u16()?,
            psn: r.u32()?,
            npkts: r.u32()?,
            grh: None,
            eth: None,
        };
        hdr.grh = match r.u8()? {
            0 => None,
            1 => Some(Grh {
                sgid: r.take()?,
                dgid: r.take()?,
                tclass: r.u8()?,
                hop_limit: r.u8()?,
                flow_label: r.u32()?,
            }),
            _ => return None,
        };
        hdr.eth = match r.u8()? {
            0 => None,
            1 => Some(Eth {
                dmac: r.take()?,
                smac: r.take()?,
                v2: r.u8()? != 0,
                udp_sport: r.u16()?,
            }),
            _ => return None,
        };
        let op = match r.u8()? {
            0 => Op::Send {
                imm: r.imm()?,
                solicited: r.u8()? != 0,
                data: r.bytes()?,
                datagram: match r.u8()? {
                    0 => None,
                    1 => Some(Datagram {
                        qkey: r.u32()?,
                        sl: r.u8()?,
                    }),
                    _ => return None,
                },
            },
            1 => Op::Write {
                raddr: r.u64()?,
                rkey: r.u32()?,
                imm: r.imm()?,
                solicited: r.u8()? != 0,
                data: r.bytes()?,
            },
            2 => Op::Read {
                raddr: r.u64()?,
                rkey: r.u32()?,
                len: r.u32()?,
            },
            3 => Op::CompareSwap {
                raddr: r.u64()?,
                rkey: r.u32()?,
                compare: r.u64()?,
                swap: r.u64()?,
            },
            4 => Op::FetchAdd {
                raddr: r.u64()?,
                rkey: r.u32()?,
                add: r.u64()?,
            },
            _ => return None,
        };
        Some(Self {
            dst_qpn,
            src_qpn,
            src_lid,
            hdr,
            op,
        })
    }
}

impl Response {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        match self {
            Self::Ack => w.u8(0),
            Self::ReadData(d) => w.u8(1).bytes(d),
            Self::AtomicOriginal(v) => w.u8(2).u64(*v),
            Self::Nak(s) => w.u8(3).u8(*s),
            Self::Rnr(t) => w.u8(4).u8(*t),
            Self::Dropped => w.u8(5),
        };
        w.0
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        Some(match r.u8()? {
            0 => Self::Ack,
            1 => Self::ReadData(r.bytes()?),
            2 => Self::AtomicOriginal(r.u64()?),
            3 => Self::Nak(r.u8()?),
            4 => Self::Rnr(r.u8()?),
            5 => Self::Dropped,
            _ => return None,
        })
    }
}

/// Writes one frame: a `u32` length, then the bytes.
pub fn write_frame(out: &mut impl std::io::Write, payload: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(payload.len() + 4);
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(payload);
    out.write_all(&frame)
}

/// Reads one frame (at most [`MAX_MESSAGE`] plus headers).
pub fn read_frame(input: &mut impl std::io::Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE + 64 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "frame too long"));
    }
    let mut buf = vec![0u8; len];
    input.read_exact(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_round_trip_and_garbage_is_refused() {
        let ops = [
            Op::Send {
                imm: Some(7),
                solicited: true,
                data: vec![1, 2, 3],
                datagram: None,
            },
            Op::Send {
                imm: None,
                solicited: false,
                data: vec![4],
                datagram: Some(Datagram {
                    qkey: 0x1111_1111,
                    sl: 3,
                }),
            },
            Op::Send {
                imm: Some(1),
                solicited: false,
                data: vec![],
                datagram: Some(Datagram { qkey: 5, sl: 0 }),
            },
            Op::Write {
                raddr: 9,
                rkey: 3,
                imm: None,
                solicited: false,
                data: vec![],
            },
            Op::Read {
                raddr: 1,
                rkey: 2,
                len: 3,
            },
            Op::CompareSwap {
                raddr: 8,
                rkey: 1,
                compare: 5,
                swap: 6,
            },
            Op::FetchAdd {
                raddr: 16,
                rkey: 1,
                add: 2,
            },
        ];
        let headers = [
            Headers::default(),
            Headers {
                dlid: 4,
                pkey: 0xffff,
                psn: 0xab_cdef,
                npkts: 3,
                grh: Some(Grh {
                    sgid: [1; 16],
                    dgid: [2; 16],
                    tclass: 3,
                    hop_limit: 64,
                    flow_label: 0xf_1234,
                }),
                eth: Some(Eth {
                    dmac: [5; 6],
                    smac: [6; 6],
                    v2: true,
                    udp_sport: 0xc123,
                }),
            },
        ];
        for (i, op) in ops.into_iter().enumerate() {
            let r = Request {
                dst_qpn: 1,
                src_qpn: 2,
                src_lid: 3,
                hdr: headers[i % 2].clone(),
                op,
            };
            assert_eq!(Request::decode(&r.encode()), Some(r.clone()));
            let bytes = r.encode();
            for cut in 0..bytes.len() {
                assert!(Request::decode(&bytes[..cut]).is_none());
            }
        }
        for resp in [
            Response::Ack,
            Response::ReadData(vec![4]),
            Response::Nak(0x13),
            Response::Rnr(12),
        ] {
            assert_eq!(Response::decode(&resp.encode()), Some(resp.clone()));
        }
        assert!(Response::decode(&[9]).is_none());
    }
}
