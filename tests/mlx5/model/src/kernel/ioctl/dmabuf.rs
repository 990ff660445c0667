//! core/uverbs_std_types_mr.c `UVERBS_METHOD_REG_DMABUF_MR` with mlx5's
//! `mlx5_ib_reg_user_mr_dmabuf` (hw/mlx5/mr.c:1465) and core/umem_dmabuf.c
//! `ib_umem_dmabuf_get`. The model stands in for the exporter: the "dma-buf" is a memfd whose
//! pages the host maps ([`super::super::Host::map_dmabuf`]); Debian's 6.1 has no
//! `CONFIG_UDMABUF`, so no real dma-buf can be made from user memory here.

use super::{Bundle, Errno, Host, Model};
use crate::abi::{access, PAGE_SIZE};
use crate::mem::Memory;
use crate::objects::Mr;
use libc::EINVAL;
use std::sync::Arc;

/// `IB_ACCESS_RELAXED_ORDERING` (`IB_UVERBS_ACCESS_OPTIONAL_FIRST`).
const RELAXED_ORDERING: u64 = 1 << 20;

impl Model {
    /// core/uverbs_std_types_mr.c:186: the PD was looked up with the attributes; mlx5 has
    /// `reg_user_mr_dmabuf`, so no EOPNOTSUPP (:200-201). Then offset and iova must share
    /// their page offset (:218-219, EINVAL); the access flags are `uverbs_get_flags32` of
    /// local write, remote read/write/atomic and relaxed ordering (:226-233, EINVAL beyond)
    /// and pass `ib_check_mr_access` (:236: remote write or atomic needs local write). mlx5
    /// (mr.c:1484: the model's device can load page lists through UMR) hands them to
    /// `ib_umem_dmabuf_get` (umem_dmabuf.c:112): a range that wraps (:123), an fd that is not
    /// open (EBADF) or not a dma-buf (EINVAL, :129-131), a range past the buffer's end
    /// (:133) and no pages at all (:149, length 0) are EINVAL. Outputs: lkey and rkey
    /// (:259-266), after the handle.
    pub(super) fn ioctl_reg_dmabuf_mr(
        &mut self,
        ctx: i32,
        b: &Bundle,
        mem: &dyn Memory,
        host: &dyn Host,
    ) -> Result<(), Errno> {
        let pd = b.handle(1).ok_or(EINVAL)?;
        let offset = b.number(mem, 2)?.unwrap_or(0);
        let length = b.number(mem, 3)?.unwrap_or(0);
        let iova = b.number(mem, 4)?.unwrap_or(0);
        if offset & (PAGE_SIZE - 1) != iova & (PAGE_SIZE - 1) {
            return Err(EINVAL);
        }
        let fd = b.number(mem, 5)?.unwrap_or(0) as u32 as i32;
        let allowed =
            u64::from(access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC)
                | RELAXED_ORDERING;
        let a = b.flags(mem, 6, allowed)? as u32;
        if a & (access::REMOTE_ATOMIC | access::REMOTE_WRITE) != 0 && a & access::LOCAL_WRITE == 0 {
            return Err(EINVAL);
        }
        let end = offset.checked_add(length).ok_or(EINVAL)?;
        let map = host.map_dmabuf(fd)?;
        if map.len < end || length == 0 {
            return Err(EINVAL);
        }
        let map = Arc::new(map);
        self.next_key = self.next_key.wrapping_add(1);
        let handle = self.mrs.insert(Mr {
            ctx,
            pd,
            addr: map.addr + offset,
            length,
            iova,
            access: a,
            key: 0,
            dmabuf: Some(map),
        });
        // The same mkey shape as REG_MR's (kernel/context.rs).
        let key = ((handle + 2) << 8) | (self.next_key & 0xff);
        if let Some(m) = self.mrs.get_mut(handle) {
            m.key = key;
        }
        if let Some(p) = self.pds.get_mut(pd) {
            p.users += 1;
        }
        crate::log!("REG_DMABUF_MR fd {fd} offset {offset:#x} length {length:#x} iova {iova:#x} -> key {key:#x}");
        let out = b
            .set_data(mem, 0, u64::from(handle))
            .and_then(|()| b.output(mem, 7, &key.to_ne_bytes()))
            .and_then(|()| b.output(mem, 8, &key.to_ne_bytes()));
        if out.is_err() {
            self.drop_mr(handle);
        }
        out
    }
}
