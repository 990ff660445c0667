//! Unit tests: each kernel validation rule called with bytes, and the device against
//! well-formed and hostile WQEs and doorbells in an [`Arena`] that counts stray accesses.

use crate::abi::{self, cmd, qp_attr, qps};
use crate::harness::*;
use crate::kernel::{Errno, MapAccess, Mapping};
use crate::mem::Memory;
use libc::{EBADF, EBUSY, EFAULT, EINVAL, ENOENT, ENOMEM, ENOSPC, EOPNOTSUPP, EPERM, EPROTONOSUPPORT};
use zerocopy::{FromBytes, IntoBytes};

mod ah;
mod bfcheck;
mod context;
mod cq;
mod device;
mod dmabuf;
mod ioctl;
mod ioctl_order;
mod mmap;
mod qp;
mod srq;
mod srq_device;
mod strict;
mod write;
