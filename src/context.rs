//! An open device: the kernel context every other object lives in.

use crate::attr::{
    AhAttr, AtomicCap, DeviceAttr, DeviceAttrEx, GidType, LinkLayer, LinkSpeed, LinkWidth, Mtu, PortAttr, PortState,
};
use crate::device::{DeviceFile, DeviceInfo};
use crate::error::{Error, Result, Verb};
use crate::event_file::AsyncEventFile;
use crate::front_end::{MakeQueues, Queues};
use crate::provider::{Provider, ProviderContext};
use crate::sys::abi::{self, AsyncEventDesc, GidEntry, QueryDeviceResp, QueryPortRespEx};
use crate::sys::cmd::{self, PlainRequest};
use crate::sys::fork::Owner;
use crate::sys::ioctl::{object, Ioctl, UHW_IN, UHW_OUT};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use zerocopy::{FromBytes, IntoBytes};

/// A GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Gid {
    /// The 16 GID bytes (for RoCE, an IPv6 or IPv4-mapped address).
    pub raw: [u8; 16],
    /// Index in the port's table, as address vectors name it (`GlobalRoute::sgid_index`).
    pub index: u8,
    /// Port number.
    pub port: u8,
    /// What it addresses: InfiniBand, RoCE v1 or RoCE v2.
    pub gid_type: GidType,
    /// ifindex of the network device it belongs to (0 for none).
    pub netdev_ifindex: u32,
}

impl Gid {
    /// The GID as an IPv6 address (IPv4 appears mapped, `::ffff:a.b.c.d`).
    pub fn ip(&self) -> std::net::Ipv6Addr {
        std::net::Ipv6Addr::from(self.raw)
    }

    /// The RoCE path to `dgid` from this GID: its port and index as the source
    /// ([`AhAttr::roce`]). For two QPs on one device, `gid.route_to(gid.raw)`.
    pub fn route_to(&self, dgid: [u8; 16]) -> AhAttr {
        AhAttr::roce(self.port, dgid, self.index)
    }
}

/// What the event readers record for one CQ, held in the CQ's own kernel-object value
/// (`cq::CqInner`), which the readers reach through a [`CqWatch`].
#[derive(Debug, Default)]
pub(crate) struct CqFlags {
    /// Completion events delivered for the CQ (counted by its channel's reader).
    pub(crate) events: AtomicU32,
    /// Set when a CQ_ERR event for the CQ is read off the async event file.
    pub(crate) overrun: AtomicBool,
}

/// How a completion channel and a context reach a live CQ's [`CqFlags`] (a `Weak` of the
/// CQ, so that neither keeps it alive and the CQ needs no allocation of its own for them).
pub(crate) trait CqWatch: Send + Sync {
    fn cq_flags(&self) -> &CqFlags;
}

/// A CQ as the event readers hold it.
pub(crate) type WatchedCq = Weak<dyn CqWatch>;

pub(crate) struct ContextInner {
    pub(crate) file: Arc<DeviceFile>,
    driver_id: u32,
    /// The async event file, and the events a CQ check read ahead of the user.
    pub(crate) async_events: AsyncEventFile,
    pub(crate) device: DeviceInfo,
    pub(crate) provider: Box<dyn ProviderContext>,
    /// How a QP holds the queues `provider` makes: paired with the provider in
    /// `providers/mod.rs`, [`Queues::gathered`] for one from elsewhere. Called only with
    /// queues `provider` made.
    pub(crate) queues: MakeQueues,
    pub(crate) num_comp_vectors: u32,
    next_user_handle: AtomicU64,
    /// Each live CQ's overrun flag by user handle, set when a CQ_ERR event for it is read
    /// off the kernel's async event file.
    cq_overruns: Mutex<Vec<(u64, WatchedCq)>>,
    /// The process the context was created in; a forked child must not touch its objects
    /// (see `crate::fork`).
    pub(crate) owner: Owner,
}

impl ContextInner {
    /// The type of GID `index` of `port`, as libibverbs' `ibv_query_gid_type` finds it
    /// without the GID ioctl: on an InfiniBand port every GID is [`GidType::IB`] (sysfs
    /// `ports/N/link_layer`); on an Ethernet port sysfs `gid_attrs/types/N` tells RoCE v2
    /// ("RoCE v2") from RoCE v1 ("IB/RoCE v1"). No command goes to the kernel.
    pub(crate) fn gid_type(&self, port: u8, index: u8) -> Result<GidType> {
        let port_dir = self.port_dir(port);
        if crate::device::read_attr(&port_dir.join("link_layer"))? != "Ethernet" {
            return Ok(GidType::IB);
        }
        let path = port_dir.join(format!("gid_attrs/types/{index}"));
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            // The kernel answers EINVAL for an entry it holds no GID in; libibverbs
            // (`ibv_query_gid_type`) takes that as RoCE v1 and lets the kernel judge the index.
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => return Ok(GidType::ROCE_V1),
            Err(e) => return Err(Error::io(path.display().to_string(), e)),
        };
        match text.trim() {
            "RoCE v2" => Ok(GidType::ROCE_V2),
            "IB/RoCE v1" => Ok(GidType::ROCE_V1),
            other => Err(Error::malformed("sysfs", format!("{}: {other:?}", path.display()))),
        }
    }

    /// The sysfs folder of `port` (`/sys/class/infiniband/<device>/ports/<port>`), where
    /// libibverbs reads what it asks no command for.
    fn port_dir(&self, port: u8) -> std::path::PathBuf {
        std::path::Path::new("/sys/class/infiniband")
            .join(&self.device.name)
            .join(format!("ports/{port}"))
    }

    /// A fresh handle to name an object in events (its kernel handle is not known before it
    /// is created).
    pub(crate) fn new_user_handle(&self) -> u64 {
        self.next_user_handle.fetch_add(1, Ordering::Relaxed)
    }

    fn cq_overruns(&self) -> std::sync::MutexGuard<'_, Vec<(u64, WatchedCq)>> {
        self.cq_overruns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets `overrun` when a CQ_ERR event names `cq_user_handle` (on CQ create; entries of
    /// dropped CQs are pruned here, when the list is full: a scan per doubling, so creating
    /// a CQ costs the same with thousands alive, and at most half the entries are dead).
    pub(crate) fn watch_cq_overrun(&self, cq_user_handle: u64, cq: WatchedCq) {
        let mut cqs = self.cq_overruns();
        if cqs.len() == cqs.capacity() {
            cqs.retain(|(_, w)| w.strong_count() > 0);
        }
        cqs.push((cq_user_handle, cq));
    }

    /// An async event was read off the kernel's file: a CQ_ERR flags every live CQ with the
    /// user handle it names.
    fn async_event_read(&self, desc: &AsyncEventDesc) {
        if desc.event_type != abi::ASYNC_EVENT_CQ_ERR {
            return;
        }
        // The CQs are released after the list's lock: the last reference to one may be here,
        // and dropping it destroys the kernel CQ.
        let hit: Vec<Arc<dyn CqWatch>> = self
            .cq_overruns()
            .iter()
            .filter(|(h, _)| *h == desc.element)
            .filter_map(|(_, cq)| cq.upgrade())
            .collect();
        for cq in &hit {
            cq.cq_flags().overrun.store(true, Ordering::Relaxed);
        }
    }

    /// Reads the async events pending on the kernel's file into the queue the user reads
    /// first, without waiting, so that their CQ_ERRs flag their CQs.
    pub(crate) fn read_async_events_ahead(&self) -> Result<()> {
        self.async_events.read_ahead(&mut |d| self.async_event_read(d))
    }

    /// The next async event for the user: the ones read ahead first.
    pub(crate) fn next_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEventDesc>> {
        self.async_events.next(timeout, &mut |d| self.async_event_read(d))
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Whether this process is a fork of the one that created the context.
    #[inline]
    pub(crate) fn forked(&self) -> bool {
        self.owner.forked()
    }

    /// [`Error::Forked`] in a forked child.
    pub(crate) fn check_owner(&self, verb: Verb) -> Result<()> {
        self.owner.check(verb)
    }

    /// Starts an ioctl call on this context's device (inlined: the call is built in place).
    #[inline]
    pub(crate) fn ioctl<'a>(&self, object: u16, method: u16) -> Ioctl<'a> {
        Ioctl::with_owner(self.driver_id, object, method, Some(self.owner))
    }

    /// Runs a `write()` command whose only user address is its response.
    pub(crate) fn write_cmd<Req: PlainRequest, Resp: FromBytes + IntoBytes>(
        &self,
        verb: Verb,
        command: u32,
        req: &Req,
    ) -> Result<Resp> {
        self.check_owner(verb)?;
        cmd::execute_plain(self.fd(), verb, command, req, &[], &mut [])
    }

    /// Destroys a kernel object through its ioctl DESTROY method.
    ///
    /// In a forked child this does nothing: the object is the parent's (the child's copy of
    /// the device fd goes away harmlessly when it closes).
    pub(crate) fn destroy(&self, verb: Verb, obj: u16, method: u16, handle: u32, resp: &mut [u8]) -> Result<()> {
        if self.forked() {
            return Ok(());
        }
        let mut call = self.ioctl(obj, method);
        call.handle(0, handle);
        if !resp.is_empty() {
            call.output(1, resp);
        }
        call.execute(self.fd(), verb).map(drop)
    }
}

fn device_attr(r: &QueryDeviceResp) -> DeviceAttr {
    DeviceAttr {
        fw_ver: r.fw_ver,
        node_guid: u64::from_be(r.node_guid),
        sys_image_guid: u64::from_be(r.sys_image_guid),
        max_mr_size: r.max_mr_size,
        page_size_cap: r.page_size_cap,
        vendor_id: r.vendor_id,
        vendor_part_id: r.vendor_part_id,
        hw_ver: r.hw_ver,
        max_qp: r.max_qp,
        max_qp_wr: r.max_qp_wr,
        device_cap_flags: r.device_cap_flags,
        max_sge: r.max_sge,
        max_sge_rd: r.max_sge_rd,
        max_cq: r.max_cq,
        max_cqe: r.max_cqe,
        max_mr: r.max_mr,
        max_pd: r.max_pd,
        max_qp_rd_atom: r.max_qp_rd_atom,
        max_ee_rd_atom: r.max_ee_rd_atom,
        max_res_rd_atom: r.max_res_rd_atom,
        max_qp_init_rd_atom: r.max_qp_init_rd_atom,
        max_ee_init_rd_atom: r.max_ee_init_rd_atom,
        atomic_cap: AtomicCap(r.atomic_cap),
        max_ee: r.max_ee,
        max_rdd: r.max_rdd,
        max_mw: r.max_mw,
        max_raw_ipv6_qp: r.max_raw_ipv6_qp,
        max_raw_ethy_qp: r.max_raw_ethy_qp,
        max_mcast_grp: r.max_mcast_grp,
        max_mcast_qp_attach: r.max_mcast_qp_attach,
        max_total_mcast_qp_attach: r.max_total_mcast_qp_attach,
        max_ah: r.max_ah,
        max_fmr: r.max_fmr,
        max_map_per_fmr: r.max_map_per_fmr,
        max_srq: r.max_srq,
        max_srq_wr: r.max_srq_wr,
        max_srq_sge: r.max_srq_sge,
        max_pkeys: r.max_pkeys,
        local_ca_ack_delay: r.local_ca_ack_delay,
        phys_port_cnt: r.phys_port_cnt,
    }
}

fn port_attr(r: &QueryPortRespEx) -> PortAttr {
    let p = &r.legacy;
    PortAttr {
        state: PortState(p.state.into()),
        max_mtu: Mtu::from_raw(p.max_mtu),
        active_mtu: Mtu::from_raw(p.active_mtu),
        gid_tbl_len: p.gid_tbl_len,
        port_cap_flags: p.port_cap_flags,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: p.bad_pkey_cntr,
        qkey_viol_cntr: p.qkey_viol_cntr,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        max_vl_num: p.max_vl_num,
        sm_sl: p.sm_sl,
        subnet_timeout: p.subnet_timeout,
        init_type_reply: p.init_type_reply,
        active_width: LinkWidth(p.active_width.into()),
        active_speed: LinkSpeed(p.active_speed.into()),
        phys_state: p.phys_state,
        link_layer: LinkLayer(p.link_layer.into()),
        flags: p.flags,
        port_cap_flags2: r.port_cap_flags2,
    }
}

/// Opens a device by name, or the first device when `name` is `None`: the one call that gives
/// a context with the right provider.
pub fn open(name: Option<&str>) -> Result<Context> {
    Context::open(&crate::device::find(name)?)
}

impl DeviceInfo {
    /// Opens the device with the provider that drives it.
    pub fn open(&self) -> Result<Context> {
        Context::open(self)
    }
}

/// An open RDMA device. Cheap to clone; every object made from it keeps it alive.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.device.name)
            .finish_non_exhaustive()
    }
}

/// `UVERBS_METHOD_GET_CONTEXT` and its attributes.
const METHOD_GET_CONTEXT: u16 = 3;
const METHOD_QUERY_PORT: u16 = 2;
const METHOD_QUERY_GID_TABLE: u16 = 5;
const METHOD_ASYNC_EVENT_ALLOC: u16 = 0;

impl Context {
    /// Opens `device` with the provider that drives it.
    pub fn open(device: &DeviceInfo) -> Result<Self> {
        let file = DeviceFile::open(device)?;
        Self::with_file(device, file)
    }

    /// Builds a context on a uverbs character device that is already open, as a host that
    /// opened the device itself hands it over (libibverbs passes its `cmd_fd` to a provider's
    /// `alloc_context`). `fd` must be `device`'s `/dev/infiniband/uverbsN`, opened read-write;
    /// that is checked against sysfs. The context takes ownership of `fd` (pass a `dup` to keep
    /// one) and, exactly as [`Context::open`], runs GET_CONTEXT on it and allocates its own
    /// async event fd. A uverbs file holds at most one kernel context, so `fd` must not have
    /// had GET_CONTEXT run on it before.
    pub fn from_fd(device: &DeviceInfo, fd: OwnedFd) -> Result<Self> {
        let file = DeviceFile::from_fd(device, fd)?;
        Self::with_file(device, file)
    }

    /// Opens `device` with `provider` instead of the compiled-in one that drives it: for a
    /// provider kept outside this crate, or a test provider.
    pub fn open_with(device: &DeviceInfo, provider: &dyn Provider) -> Result<Self> {
        let file = DeviceFile::open(device)?;
        Self::with_provider(device, file, provider, Queues::gathered)
    }

    fn with_file(device: &DeviceInfo, file: DeviceFile) -> Result<Self> {
        let vendor = crate::providers::find(device)?;
        Self::with_provider(device, file, vendor.provider, vendor.queues)
    }

    fn with_provider(
        device: &DeviceInfo,
        file: DeviceFile,
        provider: &dyn Provider,
        queues: MakeQueues,
    ) -> Result<Self> {
        let driver_id = provider.driver_id();
        let file = Arc::new(file);
        let mut num_comp_vectors = 0u32;
        let provider_ctx = provider.open(&file, &mut |drv_in, drv_out| {
            let mut core_support = 0u64;
            let mut call = Ioctl::new(driver_id, object::DEVICE, METHOD_GET_CONTEXT);
            call.output(0, num_comp_vectors.as_mut_bytes());
            call.output(1, core_support.as_mut_bytes());
            if !drv_in.is_empty() {
                call.input(UHW_IN, drv_in);
            }
            if !drv_out.is_empty() {
                call.output(UHW_OUT, drv_out);
            }
            call.execute(file.as_fd(), "GET_CONTEXT").map(drop)
        })?;
        let mut call = Ioctl::new(driver_id, object::ASYNC_EVENT, METHOD_ASYNC_EVENT_ALLOC);
        let slot = call.new_fd(0);
        let done = call.execute(file.as_fd(), "ASYNC_EVENT_ALLOC")?;
        let async_events = AsyncEventFile::new(done.take_fd(slot))?;
        Ok(Self {
            inner: Arc::new(ContextInner {
                file,
                driver_id,
                async_events,
                device: device.clone(),
                provider: provider_ctx,
                queues,
                num_comp_vectors,
                next_user_handle: AtomicU64::new(1),
                cq_overruns: Mutex::new(Vec::new()),
                owner: Owner::current(),
            }),
        })
    }

    /// The device this context was opened on.
    pub fn device(&self) -> &DeviceInfo {
        &self.inner.device
    }

    /// Number of completion vectors.
    pub fn num_comp_vectors(&self) -> u32 {
        self.inner.num_comp_vectors
    }

    /// The fd to poll for async events: readable while [`Context::get_async_event`] has one
    /// to return, including the events a CQ check ([`crate::Cq::try_poll`]) read ahead. Not
    /// itself a file of event records: read events with `get_async_event`.
    pub fn async_fd(&self) -> BorrowedFd<'_> {
        self.inner.async_events.ready()
    }

    /// The kernel's async event file itself, the one CQs, QPs and SRQs report to: for a host
    /// that reads its records directly, as libibverbs' `ibv_get_async_event` does. Events that
    /// a CQ check of this crate read ahead are no longer there (they wait in
    /// [`Context::get_async_event`]); such a host does not call those checks.
    pub fn kernel_async_fd(&self) -> BorrowedFd<'_> {
        self.inner.async_events.kernel()
    }

    /// Device attributes (QUERY_DEVICE).
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let r: QueryDeviceResp =
            self.inner
                .write_cmd("QUERY_DEVICE", abi::cmd::QUERY_DEVICE, &abi::QueryDevice::default())?;
        Ok(device_attr(&r))
    }

    /// Extended device attributes (the extended QUERY_DEVICE command): the base attributes
    /// with all 64 capability flag bits, as libibverbs' `ibv_query_device_ex` reports them.
    pub fn query_device_ex(&self) -> Result<DeviceAttrEx> {
        let verb = "QUERY_DEVICE_EX";
        self.inner.check_owner(verb)?;
        let r: abi::ExQueryDeviceResp = crate::sys::cmd::execute_ex(
            self.inner.fd(),
            verb,
            abi::ex_cmd::QUERY_DEVICE,
            &abi::ExQueryDevice::default(),
        )?;
        Ok(DeviceAttrEx {
            attr: device_attr(&r.base),
            device_cap_flags_ex: r.device_cap_flags_ex,
            completion_timestamp_mask: r.timestamp_mask,
            hca_core_clock: r.hca_core_clock,
        })
    }

    /// Port attributes (ioctl QUERY_PORT). Ports are numbered from 1.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut resp = QueryPortRespEx::default();
        let port = u64::from(port);
        let mut call = self.inner.ioctl(object::DEVICE, METHOD_QUERY_PORT);
        call.input(0, &port).output(1, resp.as_mut_bytes());
        call.execute(self.inner.fd(), "QUERY_PORT")?;
        Ok(port_attr(&resp))
    }

    /// Every valid GID of every port (ioctl QUERY_GID_TABLE). GIDs past index 255 are left
    /// out: no address vector can name them (`sgid_index` is 8 bits in the kernel ABI, as in
    /// C's `ibv_global_route`).
    pub fn gid_table(&self) -> Result<Vec<Gid>> {
        let attr = self.query_device()?;
        let mut total = 0usize;
        for port in 1..=attr.phys_port_cnt {
            total += self.query_port(port)?.gid_tbl_len as usize;
        }
        let mut entries = vec![GidEntry::default(); total.max(1)];
        let entry_size = size_of::<GidEntry>() as u64;
        let flags = 0u32;
        let mut count = 0u64;
        let mut call = self.inner.ioctl(object::DEVICE, METHOD_QUERY_GID_TABLE);
        call.input(0, &entry_size)
            .input(1, &flags)
            .output(2, entries.as_mut_bytes())
            .output(3, count.as_mut_bytes());
        call.execute(self.inner.fd(), "QUERY_GID_TABLE")?;
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        if count > entries.len() {
            return Err(Error::malformed("QUERY_GID_TABLE", format!("{count} entries returned")));
        }
        entries.truncate(count);
        Ok(entries
            .into_iter()
            .filter_map(|e| {
                Some(Gid {
                    raw: e.gid,
                    index: u8::try_from(e.gid_index).ok()?,
                    port: u8::try_from(e.port_num).ok()?,
                    gid_type: GidType(e.gid_type),
                    netdev_ifindex: e.netdev_ifindex,
                })
            })
            .collect())
    }

    /// The GID at `index` on `port`.
    pub fn query_gid(&self, port: u8, index: u8) -> Result<Gid> {
        self.gid_table()?
            .into_iter()
            .find(|g| g.port == port && g.index == index)
            .ok_or_else(|| Error::invalid("query_gid", format!("port {port} has no GID {index}")))
    }

    /// The GID RoCE v2 traffic on `port` should use: an IPv4-mapped one first (what most
    /// networks route), else any that is not link-local.
    pub fn roce_v2_gid(&self, port: u8) -> Result<Gid> {
        let table = self.gid_table()?;
        let v2 = |g: &&Gid| g.port == port && g.gid_type == GidType::ROCE_V2;
        let mapped = table.iter().filter(v2).find(|g| g.ip().to_ipv4_mapped().is_some());
        let global = table
            .iter()
            .filter(v2)
            .find(|g| g.ip().segments()[0] & 0xffc0 != 0xfe80);
        mapped.or(global).copied().ok_or_else(|| {
            Error::invalid(
                "roce_v2_gid",
                format!("port {port} has no routable RoCE v2 GID ({} GIDs)", table.len()),
            )
        })
    }

    /// The P_Key at `index` of `port` (from sysfs, as libibverbs reads it).
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        let path = self.inner.port_dir(port).join(format!("pkeys/{index}"));
        let text = crate::device::read_attr(&path)?;
        u16::from_str_radix(text.trim_start_matches("0x"), 16)
            .map_err(|_| Error::malformed("query_pkey", format!("{}: {text:?}", path.display())))
    }
}
