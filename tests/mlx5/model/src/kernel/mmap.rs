//! UAR pages and the device file's `mmap`: the mlx5 UAR object's ioctl methods, the page
//! offsets `mlx5_ib_mmap` accepts, and the pages the client has mapped.

use super::{decode, Errno, MapAccess, Mapping, Model};
use crate::abi::{self, PAGE_SIZE};
use crate::mem::Memory;
use crate::objects::Uar;
use libc::{EFAULT, EINVAL, ENOENT, EOPNOTSUPP, EPROTONOSUPPORT};

impl Model {
    /// The mlx5 UAR object's methods (hw/mlx5/main.c:3505 `UAR_OBJ_ALLOC`, :3577 `DESTROY`),
    /// after [`Model::ioctl`] checked the header and processed the attributes as the core
    /// does (kernel/ioctl.rs).
    pub(super) fn uar_method(
        &mut self,
        ctx: i32,
        hdr: &abi::IoctlHdr,
        arg: u64,
        mem: &dyn Memory,
    ) -> Result<(), Errno> {
        let mut attrs = Vec::new();
        for i in 0..u64::from(hdr.num_attrs) {
            let mut ab = [0u8; 16];
            mem.read(arg + 24 + 16 * i, &mut ab).map_err(|_| EFAULT)?;
            attrs.push(decode::<abi::IoctlAttr>(&ab));
        }
        let find = |id: u16| attrs.iter().position(|a| a.attr_id == id);
        // Unknown mandatory attributes are EPROTONOSUPPORT (core/uverbs_ioctl.c:402-403).
        let known: &[u16] = if hdr.method_id == abi::uar_obj::METHOD_ALLOC {
            &[
                abi::uar_obj::ATTR_HANDLE,
                abi::uar_obj::ATTR_TYPE,
                abi::uar_obj::ATTR_MMAP_OFFSET,
                abi::uar_obj::ATTR_MMAP_LENGTH,
                abi::uar_obj::ATTR_PAGE_ID,
            ]
        } else {
            &[abi::uar_obj::ATTR_HANDLE]
        };
        if attrs
            .iter()
            .any(|a| !known.contains(&a.attr_id) && a.flags & abi::ATTR_F_MANDATORY != 0)
        {
            return Err(EPROTONOSUPPORT);
        }
        let handle_at = find(abi::uar_obj::ATTR_HANDLE).ok_or(EINVAL)?;
        if hdr.method_id == abi::uar_obj::METHOD_DESTROY {
            let h = attrs[handle_at].data;
            let h = u32::try_from(h).map_err(|_| EINVAL)?;
            self.uars.get(h).filter(|u| u.ctx == ctx).ok_or(ENOENT)?;
            self.uars.remove(h);
            return Ok(());
        }
        let type_at = find(abi::uar_obj::ATTR_TYPE).ok_or(EINVAL)?;
        let alloc_type = attrs[type_at].data;
        // hw/mlx5/main.c:3526, :3530 UAR_OBJ_ALLOC: unknown types, and BlueFlame without write
        // combining, are EOPNOTSUPP.
        if alloc_type != abi::uar_obj::TYPE_BF && alloc_type != abi::uar_obj::TYPE_NC {
            return Err(EOPNOTSUPP);
        }
        if alloc_type == abi::uar_obj::TYPE_BF && !crate::wc_support() {
            return Err(EOPNOTSUPP);
        }
        let outs = [
            abi::uar_obj::ATTR_MMAP_OFFSET,
            abi::uar_obj::ATTR_MMAP_LENGTH,
            abi::uar_obj::ATTR_PAGE_ID,
        ]
        .map(|id| find(id).ok_or(EINVAL));
        let [off_at, len_at, page_at] = [outs[0]?, outs[1]?, outs[2]?];
        let page_id = self.next_uar_page;
        let n = u64::try_from(self.uars.iter().count()).unwrap_or(0);
        // Dynamic mmap entries live at internal page offsets from MLX5_IB_MMAP_OFFSET_START <<
        // 16 (hw/mlx5/main.c:3340-3343); the client is told the offset
        // `mlx5_entry_to_mmap_offset` makes of one (main.c:2297-2304, :3538).
        let mut pgoff = (abi::mmap_cmd::OFFSET_START << 16) + n;
        while self.uars.iter().any(|(_, u)| u.ctx == ctx && u.pgoff == pgoff) {
            pgoff += 1;
        }
        let handle = self.uars.insert(Uar { ctx, pgoff, page_id });
        let write_out = |at: usize, value: &[u8]| -> Result<(), Errno> {
            let a = &attrs[at];
            let len = usize::from(a.len).min(value.len());
            mem.write(a.data, &value[..len]).map_err(|_| EFAULT)?;
            let flags = a.flags | abi::ATTR_F_VALID_OUTPUT;
            mem.write(arg + 24 + 16 * at as u64 + 4, &flags.to_ne_bytes())
                .map_err(|_| EFAULT)
        };
        let result = mem
            .write(arg + 24 + 16 * handle_at as u64 + 8, &u64::from(handle).to_ne_bytes())
            .map_err(|_| EFAULT)
            .and_then(|()| write_out(off_at, &(entry_mmap_pgoff(pgoff) * PAGE_SIZE).to_ne_bytes()))
            .and_then(|()| write_out(page_at, &page_id.to_ne_bytes()))
            .and_then(|()| write_out(len_at, &(PAGE_SIZE as u32).to_ne_bytes()));
        match result {
            Ok(()) => {
                self.next_uar_page += 1;
                crate::log!(
                    "uar alloc page {page_id} offset {:#x}",
                    entry_mmap_pgoff(pgoff) * PAGE_SIZE
                );
                Ok(())
            }
            Err(e) => {
                self.uars.remove(handle);
                Err(e)
            }
        }
    }

    /// Checks an `mmap` of `len` bytes at page offset `pgoff` on the device file (main.c:2306
    /// `mlx5_ib_mmap`); the caller then maps the page and reports a UAR with
    /// [`Model::mapped`].
    pub fn check_mmap(&self, ctx: i32, pgoff: u64, len: u64, access: MapAccess) -> Result<Mapping, Errno> {
        let c = self.contexts.get(&ctx).filter(|c| c.alive).ok_or(EINVAL)?;
        // hw/mlx5/main.c:2054 get_command, :2070 get_extended_index.
        let command = (pgoff >> 8) & 0xff;
        let index = (pgoff & 0xff) | (((pgoff >> 16) & 0xff) << 8);
        match command {
            // main.c:2162 uar_mmap: `if (bfregi->lib_uar_dyn) return -EINVAL;`, :2165 exactly
            // one page, :2173 an index within the static pages.
            abi::mmap_cmd::WC_PAGE if crate::wc_support() => self.check_mmap(ctx, pgoff & !0xff00, len, access),
            abi::mmap_cmd::REGULAR_PAGE | abi::mmap_cmd::NC_PAGE => {
                if c.lib_uar_dyn || len != PAGE_SIZE || index >= c.static_uar_pages {
                    return Err(EINVAL);
                }
                Ok(Mapping::Uar)
            }
            // main.c:2318: WC pages need write combining: EPERM without it (with it, a WC
            // page is a static UAR page as above).
            abi::mmap_cmd::WC_PAGE | abi::mmap_cmd::ALLOC_WC => Err(libc::EPERM),
            // main.c:2325.
            abi::mmap_cmd::GET_CONTIGUOUS_PAGES => Err(libc::ENOSYS),
            // main.c:2327: one page (:2328), never writable (:2331); 4 KiB pages (:2336).
            abi::mmap_cmd::CORE_CLOCK => {
                if len != PAGE_SIZE {
                    return Err(EINVAL);
                }
                if access.write {
                    return Err(libc::EPERM);
                }
                Ok(Mapping::CoreClock)
            }
            // main.c:2096 mlx5_ib_mmap_clock_info_page: one shared page (:2100), index V1
            // (:2104), neither writable nor executable (:2107), and only where the device has
            // a clock info page (:2111).
            abi::mmap_cmd::CLOCK_INFO => {
                if len != PAGE_SIZE || !access.shared {
                    return Err(EINVAL);
                }
                if index != abi::CLOCK_INFO_V1 {
                    return Err(EOPNOTSUPP);
                }
                if access.write || access.exec {
                    return Err(libc::EPERM);
                }
                // No clock info page on the model (`caps::HAS_CLOCK_INFO`).
                Err(EOPNOTSUPP)
            }
            // main.c:2350 -> :2266 mlx5_ib_mmap_offset: every other command names a dynamic
            // entry at internal offset `command << 16 | index` (main.c:2255
            // mlx5_vma_to_pgoff); none there, or another length, is EINVAL (main.c:2279).
            _ => {
                let entry = (command << 16) | index;
                self.uars
                    .iter()
                    .find(|(_, u)| u.ctx == ctx && u.pgoff == entry)
                    .ok_or(EINVAL)?;
                if len == PAGE_SIZE {
                    Ok(Mapping::Uar)
                } else {
                    Err(EINVAL)
                }
            }
        }
    }

    /// A UAR page of context `ctx` is now mapped at `addr`, from page offset `pgoff`.
    pub fn mapped(&mut self, ctx: i32, pgoff: u64, addr: u64) {
        if let Some(c) = self.contexts.get_mut(&ctx) {
            c.uar_maps.push(addr);
            let command = (pgoff >> 8) & 0xff;
            if let abi::mmap_cmd::REGULAR_PAGE | abi::mmap_cmd::NC_PAGE | abi::mmap_cmd::WC_PAGE = command {
                c.static_uars
                    .push(((pgoff & 0xff) | (((pgoff >> 16) & 0xff) << 8), addr));
            }
        }
    }

    /// A core clock page is now mapped at `client`, and at `view` for the model to write.
    pub fn mapped_clock(&mut self, client: u64, view: u64) {
        self.clock_pages.push((client, view));
    }

    /// UAR and core clock pages currently mapped.
    pub fn mapped_pages(&self) -> usize {
        self.contexts.values().map(|c| c.uar_maps.len()).sum::<usize>() + self.clock_pages.len()
    }

    /// The client unmapped `[addr, addr + len)`: forget the pages inside it; returns the
    /// views of the clock pages among them, for the caller to unmap.
    pub fn unmapped(&mut self, addr: u64, len: u64) -> Vec<u64> {
        let inside = |p: u64| p >= addr && p < addr.saturating_add(len);
        for c in self.contexts.values_mut() {
            c.uar_maps.retain(|&p| !inside(p));
            c.static_uars.retain(|&(_, p)| !inside(p));
        }
        let (gone, kept) = self.clock_pages.iter().partition(|&&(client, _)| inside(client));
        self.clock_pages = kept;
        gone.into_iter().map(|(_, view)| view).collect()
    }
}

/// The page offset a client maps the dynamic entry at internal page offset `entry` with
/// (hw/mlx5/main.c:2297 `mlx5_entry_to_mmap_offset`): the command in bits 8-15, the index's low
/// byte in bits 0-7 and its high byte in bits 16-23.
fn entry_mmap_pgoff(entry: u64) -> u64 {
    let command = (entry >> 16) & 0xffff;
    let index = entry & 0xffff;
    ((index >> 8) << 16) | (command << 8) | (index & 0xff)
}
