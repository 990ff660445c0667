//! Multicast groups: a UD QP attached to a group receives the datagrams sent to the group's
//! GID (ATTACH_MCAST, DETACH_MCAST).

use crate::error::Result;
use crate::qp::Qp;
use crate::sys::abi::{self, AttachMcast};

impl Qp {
    /// Attaches this (UD) QP to the multicast group `gid` (and, on InfiniBand, `lid`; 0 on
    /// RoCE). The kernel refuses other QP types. On RoCE the group's datagrams come in through
    /// the IP stack: rxe hands them to the QPs only once the netdev has joined the group's IP
    /// address (say `ip addr add 239.1.2.3/32 dev eth0 autojoin`); attaching does not join.
    pub fn attach_mcast(&self, gid: &[u8; 16], lid: u16) -> Result<()> {
        self.mcast("ATTACH_MCAST", abi::cmd::ATTACH_MCAST, gid, lid)
    }

    /// Detaches this QP from the multicast group `gid` (`lid` as attached).
    pub fn detach_mcast(&self, gid: &[u8; 16], lid: u16) -> Result<()> {
        self.mcast("DETACH_MCAST", abi::cmd::DETACH_MCAST, gid, lid)
    }

    fn mcast(&self, verb: crate::Verb, command: u32, gid: &[u8; 16], lid: u16) -> Result<()> {
        let req = AttachMcast {
            gid: *gid,
            qp_handle: self.handle(),
            mlid: lid,
            reserved: 0,
        };
        self.pd.ctx.write_cmd(verb, command, &req)
    }
}
