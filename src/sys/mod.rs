//! The small unsafe backend: the kernel's uverbs ABI as `#[repr(C)]` structs, the two ways
//! of sending it commands (framed `write()` and the `RDMA_VERBS_IOCTL` attribute ioctl), the
//! fds the kernel creates, the fork hook, `membarrier(2)`, and the RDMA CM's `rdma_ucm` ABI.
//!
//! Where `unsafe` is allowed: the crate denies `unsafe_code` and, test code aside, allows it
//! only here (the list in docs/architecture.md is the same; an xtask test checks both against the
//! `allow(unsafe_code)` sites):
//!
//! - `sys`: the kernel ABI, its commands, the fds the kernel creates, the fork hook,
//!   `membarrier(2)`
//! - `providers`: rings and mappings
//! - `batch`: completions read in place through the provider's pointers
//! - `chain`: send requests read in libibverbs' layout through the caller's pointers
//! - `front_end`: a QP's queues object reached through two trait-object pointers
//! - `mr`: registers caller memory and hands out views of it
//! - `owned`: posts the buffers it holds, until their completions
//! - `aio` (feature `tokio`): registers the event fds with the reactor
//! - `provider::stub` (feature `test-support`): a stub provider implementing the unsafe traits
//! - items of `provider`: the unsafe provider traits, declaring their contract
//! - items of `qp`, `srq`: `unsafe fn post_*`, forwarding the caller's contract; the empty
//!   queues' trait impls; a new QP's queues handed to the maker its context pairs with the
//!   provider; `Srq`'s `Sync`
//! - items of `cq`: the empty ring's `CqRing` impl
//! - items of `held`, `held::srq`: the rings of held buffers, indexed unchecked and moved out
//!   by hand; a QP's one block holding both queues' rings and the send list

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
