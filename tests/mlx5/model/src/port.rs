//! The model's port: its link layer, its addresses and GID table, the neighbour table that
//! stands in for the host's, and the counters of packets the device dropped.
//!
//! A run picks the link layer with `UVERBS_MLX5_MODEL_LINK`: `ib` (the default) for an
//! InfiniBand port addressed by LID, `eth` for a RoCE port on an Ethernet netdev, as 6.1's
//! mlx5_ib and core present one. Every process of a run has its own port (its LID on
//! InfiniBand; on Ethernet its MAC and IP addresses, derived from the same number), so GIDs
//! differ between processes and a packet sent to another process's GID is dropped.

/// A positive errno value (as `kernel::Errno`; the kernel module uses this one).
type Errno = i32;
use libc::{EINVAL, ENETUNREACH, ENODATA, ETIMEDOUT};
use std::collections::HashMap;
use std::path::PathBuf;

/// The port's link layer (`IB_LINK_LAYER_*`, as QUERY_PORT reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
}

impl LinkLayer {
    /// `UVERBS_MLX5_MODEL_LINK`: `eth` (or `roce`, `ethernet`) for Ethernet, anything else
    /// InfiniBand.
    pub fn from_env() -> Self {
        static LINK: std::sync::OnceLock<LinkLayer> = std::sync::OnceLock::new();
        *LINK.get_or_init(|| match std::env::var("UVERBS_MLX5_MODEL_LINK").as_deref() {
            Ok("eth" | "roce" | "ethernet") => LinkLayer::Ethernet,
            _ => LinkLayer::InfiniBand,
        })
    }

    /// `port_attr.link_layer` (`IB_LINK_LAYER_INFINIBAND` 1, `IB_LINK_LAYER_ETHERNET` 2).
    pub fn abi(self) -> u8 {
        match self {
            Self::InfiniBand => 1,
            Self::Ethernet => 2,
        }
    }

    /// sysfs `ports/1/link_layer`.
    pub fn sysfs(self) -> &'static str {
        match self {
            Self::InfiniBand => "InfiniBand",
            Self::Ethernet => "Ethernet",
        }
    }
}

/// A GID's type (`enum ib_uverbs_gid_type`: IB 0, RoCE v1 1, RoCE v2 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidType {
    Ib,
    RoceV1,
    RoceV2,
}

impl GidType {
    pub fn abi(self) -> u32 {
        match self {
            Self::Ib => 0,
            Self::RoceV1 => 1,
            Self::RoceV2 => 2,
        }
    }

    /// sysfs `gid_attrs/types/N` (core/sysfs.c `print_port_gid_type` via
    /// `ib_cache_gid_type_str`): an InfiniBand GID shows as "IB/RoCE v1" too.
    pub fn sysfs(self) -> &'static str {
        match self {
            Self::Ib | Self::RoceV1 => "IB/RoCE v1",
            Self::RoceV2 => "RoCE v2",
        }
    }
}

/// One valid entry of the GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gid {
    pub gid: [u8; 16],
    pub ty: GidType,
}

/// The netdev name every model process shows for its port (`gid_attrs/ndevs`).
pub const NETDEV: &str = "mlx5m0";
/// Its interface index, as the GID table ioctl reports it.
pub const NETDEV_IFINDEX: u32 = 77;
/// The model's IPv4 subnet: 10.77.0.0/16; every process's address is in it.
const IPV4_NET: [u8; 2] = [10, 77];
/// The model's IPv6 unique-local prefix (a /64): fd00:77::/64.
const IPV6_NET: [u8; 8] = [0xfd, 0, 0, 0x77, 0, 0, 0, 0];
/// The hop limit the kernel's route lookup gives for a resolved IP destination
/// (`ip4_dst_hoplimit` / `ip6_dst_hoplimit` with the default sysctls: 64).
pub const ROUTE_HOP_LIMIT: u8 = 64;
/// `gid_tbl_len` of a RoCE port (`roce_address_table_size`; an assumption of the model).
pub const ROCE_GID_TABLE_LEN: u32 = 256;
/// The first UDP source port of RoCE v2 (`IB_ROCE_UDP_ENCAP_VALID_PORT_MIN`), which mlx5
/// firmware also reports as `r_roce_min_src_udp_port`.
pub const UDP_SPORT_MIN: u16 = 0xc000;

/// The port of one model.
#[derive(Debug, Clone)]
pub struct Port {
    pub link: LinkLayer,
    pub lid: u16,
    /// The port GUID (the interface ID of the InfiniBand GID 0).
    pub guid: u64,
    pub mac: [u8; 6],
    pub ipv4: [u8; 4],
    pub ipv6: [u8; 16],
    pub gids: Vec<Gid>,
    /// Where every process of the run records its addresses (`<dir>/neigh`): the neighbour
    /// table standing in for the host's ARP and ND caches. `None`: only `neighbours`.
    pub neigh_dir: Option<PathBuf>,
    /// Neighbours known without the directory (this port's own, and the unit tests').
    pub neighbours: HashMap<[u8; 16], [u8; 6]>,
}

/// The MAC of the port with `lid`: locally administered, the LID in the last two bytes.
pub fn mac_of(lid: u16) -> [u8; 6] {
    let l = lid.to_be_bytes();
    [0x02, 0x00, 0xc9, 0x00, l[0], l[1]]
}

/// The LID of the port whose MAC is `mac`, if it is a model port's.
pub fn lid_of_mac(mac: &[u8; 6]) -> Option<u16> {
    (mac[..4] == [0x02, 0x00, 0xc9, 0x00]).then(|| u16::from_be_bytes([mac[4], mac[5]]))
}

/// `fe80::` with the modified EUI-64 of `mac` (the link-local address and the default
/// RoCE GID, core/roce_gid_mgmt.c via `addrconf_ifid_eui48`).
pub fn link_local(mac: &[u8; 6]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8] = mac[0] ^ 2;
    g[9] = mac[1];
    g[10] = mac[2];
    g[11] = 0xff;
    g[12] = 0xfe;
    g[13] = mac[3];
    g[14] = mac[4];
    g[15] = mac[5];
    g
}

/// `::ffff:a.b.c.d`.
pub fn v4_mapped(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

fn is_v4_mapped(g: &[u8; 16]) -> bool {
    g[..10] == [0; 10] && g[10..12] == [0xff, 0xff]
}

fn is_link_local(g: &[u8; 16]) -> bool {
    g[0] == 0xfe && g[1] & 0xc0 == 0x80
}

/// The IPv6 or IPv4-mapped multicast test of `rdma_is_multicast_addr`.
fn is_multicast(g: &[u8; 16]) -> bool {
    g[0] == 0xff || (is_v4_mapped(g) && g[12] & 0xf0 == 0xe0)
}

fn hex_mac(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// A GID as sysfs prints it: eight groups of four hex digits.
pub fn sysfs_gid(g: &[u8; 16]) -> String {
    g.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

impl Port {
    /// The port of the process with `lid`, on `link`.
    pub fn new(lid: u16, link: LinkLayer) -> Self {
        let l = lid.to_be_bytes();
        let mac = mac_of(lid);
        let ipv4 = [IPV4_NET[0], IPV4_NET[1], l[0], l[1]];
        let mut ipv6 = [0u8; 16];
        ipv6[..8].copy_from_slice(&IPV6_NET);
        ipv6[14..].copy_from_slice(&l);
        let guid = 0x0002_c903_0001_0000 | u64::from(lid);
        let gids = match link {
            LinkLayer::InfiniBand => {
                let mut g = [0u8; 16];
                g[..8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
                g[8..].copy_from_slice(&guid.to_be_bytes());
                vec![Gid {
                    gid: g,
                    ty: GidType::Ib,
                }]
            }
            // core/roce_gid_mgmt.c: the default GIDs (the MAC's link-local address) of each
            // type at 0 and 1, then each IP address of the netdev as a v1 and a v2 GID,
            // IPv4 first (`enum_netdev_ipv4_ips`, then `enum_netdev_ipv6_ips`). The IPv6
            // link-local address equals the default GID and is not added twice.
            LinkLayer::Ethernet => [link_local(&mac), v4_mapped(ipv4), ipv6]
                .into_iter()
                .flat_map(|gid| {
                    [
                        Gid {
                            gid,
                            ty: GidType::RoceV1,
                        },
                        Gid {
                            gid,
                            ty: GidType::RoceV2,
                        },
                    ]
                })
                .collect(),
        };
        let mut neighbours = HashMap::new();
        for ip in [link_local(&mac), v4_mapped(ipv4), ipv6] {
            neighbours.insert(ip, mac);
        }
        Self {
            link,
            lid,
            guid,
            mac,
            ipv4,
            ipv6,
            gids,
            neigh_dir: None,
            neighbours,
        }
    }

    pub fn is_eth(&self) -> bool {
        self.link == LinkLayer::Ethernet
    }

    /// `gid_tbl_len` as QUERY_PORT reports it.
    pub fn gid_tbl_len(&self) -> u32 {
        match self.link {
            LinkLayer::InfiniBand => 1,
            LinkLayer::Ethernet => ROCE_GID_TABLE_LEN,
        }
    }

    /// The valid GID at `index` (core/cache.c:1221 `rdma_get_gid_attr`: beyond the table
    /// EINVAL, an empty entry ENODATA).
    pub fn gid(&self, index: u8) -> Result<Gid, Errno> {
        if u32::from(index) >= self.gid_tbl_len() {
            return Err(EINVAL);
        }
        self.gids.get(usize::from(index)).copied().ok_or(ENODATA)
    }

    /// The index of `gid` with type `ty`, if the table holds it.
    pub fn find(&self, gid: &[u8; 16], ty: GidType) -> Option<usize> {
        self.gids.iter().position(|g| &g.gid == gid && g.ty == ty)
    }

    /// Records this port's addresses in the run's neighbour table (`<dir>/neigh`).
    pub fn publish(&mut self, dir: PathBuf) {
        let _ = std::fs::create_dir_all(&dir);
        for ip in self.neighbours.keys() {
            let name = dir.join(sysfs_gid(ip).replace(':', ""));
            let tmp = name.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, hex_mac(&self.mac)).is_ok() {
                let _ = std::fs::rename(&tmp, &name);
            }
        }
        self.neigh_dir = Some(dir);
    }

    /// The neighbour entry of `ip` (an IPv6 address or an IPv4-mapped one).
    fn neighbour(&self, ip: &[u8; 16]) -> Option<[u8; 6]> {
        if let Some(mac) = self.neighbours.get(ip) {
            return Some(*mac);
        }
        let dir = self.neigh_dir.as_ref()?;
        let text = std::fs::read_to_string(dir.join(sysfs_gid(ip).replace(':', ""))).ok()?;
        parse_mac(&text)
    }

    /// The destination MAC of a RoCE path from GID `sgid_index` to `dgid`, and the hop
    /// limit the kernel puts in its place (`None`: the caller's stays), as
    /// core/verbs.c:1727 `ib_resolve_eth_dmac` does it: a multicast GID maps to its
    /// multicast MAC; a link-local destination from a RoCE v1 GID takes the MAC out of the
    /// GID (`rdma_get_ll_mac`); anything else is resolved through the IP stack
    /// (core/addr.c:799 `rdma_addr_find_l2_eth_by_grh`): source and destination of
    /// different families are EINVAL (addr.c:667), a destination outside the netdev's
    /// subnets ENETUNREACH (no route), one with no neighbour entry ETIMEDOUT (after the
    /// 1000 ms the core waits; addr.c:621), and the hop limit becomes the route's.
    pub fn resolve_dmac(&self, sgid_index: u8, dgid: &[u8; 16]) -> Result<([u8; 6], Option<u8>), Errno> {
        let sgid = self.gid(sgid_index)?;
        if is_multicast(dgid) {
            return Ok((
                if is_v4_mapped(dgid) {
                    [0x01, 0x00, 0x5e, dgid[13] & 0x7f, dgid[14], dgid[15]]
                } else {
                    [0x33, 0x33, dgid[12], dgid[13], dgid[14], dgid[15]]
                },
                None,
            ));
        }
        if is_link_local(dgid) && sgid.ty == GidType::RoceV1 {
            return Ok(([dgid[8] ^ 2, dgid[9], dgid[10], dgid[13], dgid[14], dgid[15]], None));
        }
        if is_v4_mapped(&sgid.gid) != is_v4_mapped(dgid) {
            return Err(EINVAL);
        }
        let routed = if is_v4_mapped(dgid) {
            dgid[12..14] == IPV4_NET
        } else {
            is_link_local(dgid) || dgid[..8] == IPV6_NET
        };
        if !routed {
            return Err(ENETUNREACH);
        }
        let mac = self.neighbour(dgid).ok_or(ETIMEDOUT)?;
        Ok((mac, Some(ROUTE_HOP_LIMIT)))
    }

    /// The per-process files under `ports/1/` of the device's sysfs directory: the LID, the
    /// GIDs, their types and netdevs (core/sysfs.c: every slot of the table has a `gids`
    /// file, the empty ones showing the zero GID, which libibverbs takes for "no entry";
    /// their type and netdev files cannot be read, so they are left out).
    pub fn sysfs_files(&self) -> Vec<(String, String)> {
        let mut files = vec![(
            "lid".to_string(),
            format!("{:#x}", if self.is_eth() { 0 } else { self.lid }),
        )];
        for (i, g) in self.gids.iter().enumerate() {
            files.push((format!("gids/{i}"), sysfs_gid(&g.gid)));
            files.push((format!("gid_attrs/types/{i}"), g.ty.sysfs().to_string()));
            if self.is_eth() {
                files.push((format!("gid_attrs/ndevs/{i}"), NETDEV.to_string()));
            }
        }
        for i in self.gids.len()..self.gid_tbl_len() as usize {
            files.push((format!("gids/{i}"), sysfs_gid(&[0; 16])));
        }
        files
    }

    /// The UDP source port of a RoCE v2 path with `flow_label` between QPs `lqpn` and
    /// `rqpn`, as hw/mlx5/qp.c `mlx5_set_path_udp_sport` computes it
    /// (`rdma_get_udp_sport`: the flow label, or one computed from the QP numbers).
    pub fn udp_sport(flow_label: u32, lqpn: u32, rqpn: u32) -> u16 {
        let mut fl = flow_label & 0xf_ffff;
        if fl == 0 {
            let mut v = u64::from(lqpn) * u64::from(rqpn);
            v ^= v >> 20;
            v ^= v >> 40;
            fl = (v & 0xf_ffff) as u32;
        }
        let (low, high) = (fl & 0x3fff, fl & 0xf_c000);
        ((low ^ (high >> 14)) as u16) | UDP_SPORT_MIN
    }
}

/// Why the device dropped a packet. Each is counted (see [`Drops`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// On Ethernet: the destination MAC is not the port's (or names no port at all).
    Dmac,
    /// The destination GID is not in the receiving port's table with the packet's type, or
    /// not the GID the receiving QP's path uses.
    Dgid,
    /// A RoCE packet's version (v1 or v2) differs from the type of the GID its QP's path
    /// sends from (the SGID index's type), or a packet on RoCE without a GRH.
    GidType,
    /// On InfiniBand: the destination LID is not the port's.
    Dlid,
    /// A routed packet (RoCE v2, IP) whose hop limit is 0.
    HopLimit,
    /// The BTH's P_Key matches no entry of the receiving port's P_Key table.
    Pkey,
    /// A UD packet whose Q_Key is not the receiving QP's.
    Qkey,
    /// No QP with that number, or one of another type.
    DestQpn,
    /// The QP is not in a state that receives (RTR, RTS, SQD).
    QpState,
    /// A connected QP's packet from a QP other than the one it is connected to.
    SrcQpn,
    /// A connected QP's packet whose PSN is not the one it expects.
    Psn,
    /// The source GID or LID differs from the connected QP's destination.
    Source,
}

impl DropReason {
    pub const ALL: [DropReason; 12] = [
        Self::Dmac,
        Self::Dgid,
        Self::GidType,
        Self::Dlid,
        Self::HopLimit,
        Self::Pkey,
        Self::Qkey,
        Self::DestQpn,
        Self::QpState,
        Self::SrcQpn,
        Self::Psn,
        Self::Source,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Dmac => "dmac",
            Self::Dgid => "dgid",
            Self::GidType => "gid_type",
            Self::Dlid => "dlid",
            Self::HopLimit => "hop_limit",
            Self::Pkey => "pkey",
            Self::Qkey => "qkey",
            Self::DestQpn => "dest_qpn",
            Self::QpState => "qp_state",
            Self::SrcQpn => "src_qpn",
            Self::Psn => "psn",
            Self::Source => "source",
        }
    }
}

/// Packets dropped, by reason.
#[derive(Debug, Default, Clone)]
pub struct Drops(pub HashMap<DropReason, u64>);

impl Drops {
    pub fn count(&self, reason: DropReason) -> u64 {
        self.0.get(&reason).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    pub fn add(&mut self, reason: DropReason) {
        *self.0.entry(reason).or_default() += 1;
    }

    /// One `reason count` line per reason seen, in a fixed order.
    pub fn report(&self) -> String {
        DropReason::ALL
            .iter()
            .filter(|r| self.count(**r) > 0)
            .map(|r| format!("{} {}\n", r.name(), self.count(*r)))
            .collect()
    }
}
