//! The small unsafe backend: the kernel's uverbs ABI as `#[repr(C)]` structs, the two ways
//! of sending it commands (framed `write()` and the `RDMA_VERBS_IOCTL` attribute ioctl), the
//! fds the kernel creates, the fork hook, `membarrier(2)`, and the RDMA CM's `rdma_ucm` ABI.
//!
//! The crate denies `unsafe_code`; besides this module, only the providers (rings and
//! mappings), `batch` (completions read in place) and `mr` (caller memory) allow it, and a few
//! items elsewhere that *declare* an unsafe contract (`unsafe fn post_*`, the provider
//! traits) and forward it.

pub mod abi;
pub mod cmd;
pub mod fork;
pub mod ioctl;
#[cfg(test)]
pub(crate) mod layout_check;
pub(crate) mod mapping;
#[cfg(feature = "mlx5")] // a provider's lock that fences one side only (its one user so far)
pub(crate) mod membarrier;
pub mod ucma;

/// Asserts at compile time that an ABI struct has the kernel's size and field offsets.
/// Exported (hidden) so the drop-in provider crate asserts its C layouts the same way.
#[doc(hidden)]
#[macro_export]
macro_rules! assert_layout {
    ($t:ty, size $size:expr $(, $field:ident @ $off:expr)* $(,)?) => {
        const _: () = {
            assert!(::core::mem::size_of::<$t>() == $size, concat!("size of ", stringify!($t)));
            $(assert!(
                ::core::mem::offset_of!($t, $field) == $off,
                concat!("offset of ", stringify!($t), ".", stringify!($field))
            );)*
        };
    };
}
pub(crate) use crate::assert_layout;
