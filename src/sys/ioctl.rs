//! The `RDMA_VERBS_IOCTL` interface: one header naming an object and method, followed by an
//! array of typed attributes (`include/uapi/rdma/rdma_user_ioctl_cmds.h`).

use super::assert_layout;
use crate::error::{Error, Result, Verb};
use crate::sys::fork::Owner;
use nix::errno::Errno;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `_IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr)`.
const RDMA_VERBS_IOCTL: u64 = 0xc018_1b01;
/// `UVERBS_ATTR_F_MANDATORY`: the kernel must understand the attribute or fail.
const ATTR_F_MANDATORY: u16 = 1;
/// Most attributes any method this crate calls takes.
const MAX_ATTRS: usize = 16;
/// Attributes the kernel writes back (new handles and fds) sit among the first this many
/// of a call: [`Done`] keeps only theirs.
const OUT_ATTRS: usize = 4;

/// Object ids (`enum uverbs_default_objects`).
pub mod object {
    pub const DEVICE: u16 = 0;
    pub const PD: u16 = 1;
    pub const CQ: u16 = 3;
    pub const QP: u16 = 4;
    pub const SRQ: u16 = 5;
    pub const AH: u16 = 6;
    pub const MR: u16 = 7;
    pub const MW: u16 = 8;
    pub const ASYNC_EVENT: u16 = 16;
}

/// Attribute ids in the driver namespace carrying vendor request and response bytes.
pub const UHW_IN: u16 = 0x1000;
/// See [`UHW_IN`].
pub const UHW_OUT: u16 = 0x1001;

/// `struct ib_uverbs_ioctl_hdr`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
struct IoctlHdr {
    length: u16,
    object_id: u16,
    method_id: u16,
    num_attrs: u16,
    reserved1: u64,
    driver_id: u32,
    reserved2: u32,
}
assert_layout!(IoctlHdr, size 24, num_attrs @ 6, driver_id @ 16);

/// `struct ib_uverbs_attr`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, IntoBytes, FromBytes, Immutable, KnownLayout)]
struct Attr {
    attr_id: u16,
    len: u16,
    flags: u16,
    /// `enum_data.elem_id` in the low byte for enum attributes, else 0.
    attr_data: u16,
    data: u64,
}
assert_layout!(Attr, size 16, data @ 8);

/// The header and attributes, contiguous as the kernel reads them.
#[repr(C)]
struct Buf {
    hdr: IoctlHdr,
    /// The first `hdr.num_attrs` are written (nothing zeroes the rest: a call is built for
    /// every kernel object a connection makes).
    attrs: [MaybeUninit<Attr>; MAX_ATTRS],
}

/// The position of an attribute whose `data` the kernel fills in (a new object's handle, a new
/// fd).
#[derive(Debug, Clone, Copy)]
pub struct Slot(usize);

/// Where a new fd will be written (from [`Ioctl::new_fd`]); taken once, by [`Done::take_fd`].
#[derive(Debug)]
pub struct FdSlot(Slot);

/// One method call being built. Buffers lent to it stay borrowed until it is executed.
pub struct Ioctl<'a> {
    buf: Buf,
    /// The process owning the kernel context, when checked (see [`Ioctl::with_owner`]).
    owner: Option<Owner>,
    _lent: PhantomData<&'a mut [u8]>,
}

impl<'a> Ioctl<'a> {
    /// Starts a call of `method` on `object` of a device whose driver has `driver_id` (the
    /// kernel refuses calls naming another driver).
    #[inline]
    pub fn new(driver_id: u32, object: u16, method: u16) -> Self {
        Self::with_owner(driver_id, object, method, None)
    }

    /// [`Ioctl::new`], refusing to run (with [`Error::Forked`]) in a fork of `owner` if one is
    /// given. The kernel runs ioctls from a forked child on the parent's context, so a child
    /// destroying inherited handles would destroy the parent's objects.
    #[inline(always)]
    pub fn with_owner(driver_id: u32, object: u16, method: u16, owner: Option<Owner>) -> Self {
        Self {
            buf: Buf {
                hdr: IoctlHdr {
                    object_id: object,
                    method_id: method,
                    driver_id,
                    ..Default::default()
                },
                attrs: [MaybeUninit::uninit(); MAX_ATTRS],
            },
            owner,
            _lent: PhantomData,
        }
    }

    fn push(&mut self, attr_id: u16, len: usize, data: u64) -> Slot {
        let n = usize::from(self.buf.hdr.num_attrs);
        // The attribute lists are fixed in this crate's code; overflowing is a bug here.
        assert!(n < MAX_ATTRS, "too many ioctl attributes");
        self.buf.attrs[n] = MaybeUninit::new(Attr {
            attr_id,
            len: len as u16,
            flags: ATTR_F_MANDATORY,
            attr_data: 0,
            data,
        });
        self.buf.hdr.num_attrs += 1;
        Slot(n)
    }

    /// An existing object's handle (IDR read, write or destroy access).
    pub fn handle(&mut self, attr_id: u16, handle: u32) -> &mut Self {
        self.push(attr_id, 0, u64::from(handle));
        self
    }

    /// A new object, whose handle the kernel writes back (among the first [`OUT_ATTRS`]
    /// attributes of the call).
    pub fn new_handle(&mut self, attr_id: u16) -> Slot {
        self.push_out(attr_id)
    }

    /// An fd the method reads.
    pub fn fd(&mut self, attr_id: u16, fd: RawFd) -> &mut Self {
        self.push(attr_id, 0, fd as u64);
        self
    }

    /// A new fd the kernel creates and writes back (among the first [`OUT_ATTRS`]
    /// attributes of the call).
    pub fn new_fd(&mut self, attr_id: u16) -> FdSlot {
        FdSlot(self.push_out(attr_id))
    }

    fn push_out(&mut self, attr_id: u16) -> Slot {
        // The attribute lists are fixed in this crate's code; a late one is a bug here.
        assert!(
            usize::from(self.buf.hdr.num_attrs) < OUT_ATTRS,
            "an attribute the kernel writes back after the first {OUT_ATTRS}"
        );
        self.push(attr_id, 0, 0)
    }

    /// A value the method reads. Values up to 8 bytes travel inline, as the ABI requires.
    /// `CONST_IN` attributes (enum-typed constants) must be passed as `u64`.
    pub fn input<T: IntoBytes + Immutable + ?Sized>(&mut self, attr_id: u16, value: &'a T) -> &mut Self {
        let bytes = value.as_bytes();
        let data = if bytes.len() <= 8 {
            let mut inline = [0u8; 8];
            inline[..bytes.len()].copy_from_slice(bytes);
            u64::from_ne_bytes(inline)
        } else {
            bytes.as_ptr() as u64
        };
        self.push(attr_id, bytes.len(), data);
        self
    }

    /// A buffer the kernel writes the method's output into.
    pub fn output(&mut self, attr_id: u16, buf: &'a mut [u8]) -> &mut Self {
        self.push(attr_id, buf.len(), buf.as_mut_ptr() as u64);
        self
    }

    /// Runs the call where it was built (taking it by value moved the whole buffer).
    #[inline]
    pub fn execute(&mut self, fd: BorrowedFd<'_>, verb: Verb) -> Result<Done> {
        self.execute_here(fd, verb)
    }

    fn execute_here(&mut self, fd: BorrowedFd<'_>, verb: Verb) -> Result<Done> {
        if let Some(owner) = self.owner {
            owner.check(verb)?;
        }
        self.run(fd).map_err(|e| Error::kernel(verb, e))
    }

    fn run(&mut self, fd: BorrowedFd<'_>) -> Result<Done, Errno> {
        let n = usize::from(self.buf.hdr.num_attrs);
        self.buf.hdr.length = (size_of::<IoctlHdr>() + n * size_of::<Attr>()) as u16;
        // SAFETY: `buf` is a valid header followed by `num_attrs` attributes, `length` bytes
        // in all. Every pointer in an attribute names a buffer borrowed for `'a` (by
        // `input`/`output`), so it is live and of the declared `len` for the whole call.
        let rc = unsafe { nix::libc::ioctl(fd.as_raw_fd(), RDMA_VERBS_IOCTL as _, std::ptr::addr_of_mut!(self.buf)) };
        Errno::result(rc)?;
        Ok(Done {
            data: std::array::from_fn(|i| {
                if i < n {
                    // SAFETY: the first `n` attributes were written by `push`.
                    unsafe { self.buf.attrs[i].assume_init_ref().data }
                } else {
                    0
                }
            }),
        })
    }
}

/// The result of a successful call: what the kernel wrote into the `data` fields of the first
/// [`OUT_ATTRS`] attributes (kept small: it is copied on its way to the caller).
pub struct Done {
    data: [u64; OUT_ATTRS],
}

impl Done {
    /// The handle of a new object.
    pub fn handle(&self, slot: Slot) -> u32 {
        self.data[slot.0] as u32
    }

    /// Takes ownership of the fd the kernel created for `slot`.
    pub fn take_fd(&self, slot: FdSlot) -> OwnedFd {
        // SAFETY: the call succeeded, so the kernel created this fd for this process in the
        // attribute `slot` names; `FdSlot` is not `Copy`, so it is taken once.
        unsafe { OwnedFd::from_raw_fd(self.data[slot.0 .0] as RawFd) }
    }
}

#[cfg(test)]
super::layout_check::kernel_layouts! {
    headers: ["rdma/rdma_user_ioctl_cmds.h"],
    structs: {
        IoctlHdr = "struct ib_uverbs_ioctl_hdr" {
            length, object_id, method_id, num_attrs, reserved1, driver_id, reserved2,
        },
        Attr = "struct ib_uverbs_attr" { attr_id, len, flags, attr_data, data },
        // The fixed header, then the attributes (C's flexible `attrs[]`).
        Buf = "struct ib_uverbs_ioctl_hdr"
            sized(format!("sizeof(struct ib_uverbs_ioctl_hdr) + {MAX_ATTRS} * sizeof(struct ib_uverbs_attr)"))
        {
            hdr @ "0",
            attrs,
        },
    },
    values: {
        RDMA_VERBS_IOCTL => "RDMA_VERBS_IOCTL",
    },
}
