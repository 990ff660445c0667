//! A drop-in libibverbs provider for SoftRoCE (`rdma_rxe`) built on the pure-Rust `uverbs`
//! core: libibverbs loads this library as a provider (driver `uverbs_rxe`, file
//! `libuverbs_rxe-rdmav34.so`), and unmodified programs linked against libibverbs
//! (`ibv_devinfo`, `ibv_rc_pingpong`, perftest, ...) then run their verbs on rxe devices
//! through `uverbs` instead of rdma-core's C rxe provider.
//!
//! How it fits together:
//!
//! - A constructor in `.init_array` runs when libibverbs `dlopen`s the library. It looks up
//!   the four libibverbs entry points it needs at symbol version `IBVERBS_PRIVATE_34`
//!   ([`libibverbs`]) and registers [`device::DEVICE_OPS`] with `verbs_register_driver_34`.
//!   On a libibverbs with another provider ABI it prints why and registers nothing.
//! - libibverbs matches rxe devices to it by kernel driver id (or name, as the C provider)
//!   and calls `alloc_context` with the device fd it opened; [`context`] builds a
//!   `uverbs::Context` on that fd and installs the op table.
//! - Every op converts the C arguments, calls the `uverbs` API and converts back, one module
//!   per object kind as in the core: [`pd`], [`mr`], [`cq`], [`qp`], [`srq`], [`ah`], with
//!   work requests in [`wr`] and what events ask of every object in [`event`]. No op can
//!   unwind into C: each body runs under [`ffi::guard`], but for the data path (poll and
//!   post), where a panic, which cannot happen on any input, would abort (see below).
//!
//! Every C object is a `Box` of a `#[repr(C)]` struct whose first field is the struct
//! libibverbs knows (`ibv_pd`, `verbs_mr`, `verbs_cq`, `verbs_qp`), so the pointer libibverbs
//! hands back converts to ours by a cast. Objects used from several threads at once by C
//! programs (CQs, QPs, SRQs) keep their `uverbs` half behind a [`spin::SpinLock`], as
//! rdma-core's rxe keeps its queues behind a `pthread_spinlock_t`.
//!
//! # The data path runs without `ffi::guard`
//!
//! `poll_cq`, `post_send`, `post_recv` and `post_srq_recv` do not run under [`ffi::guard`]:
//! its `catch_unwind` costs 26 instructions a poll and 38 a post (callgrind, `cargo xtask
//! bench`), more than half of an empty poll. They cannot panic on any input: the core's poll
//! and post bound every count and index by the rings and report bad requests as errors (the
//! only panic in their compiled code is std's assertion that the open QP's fd is not -1).
//! And were one to panic, it would not unwind into C: a panic leaving an `extern "C"` fn
//! aborts the process (Rust 1.81 and later, this crate's `rust-version`), an abort, never
//! undefined behaviour. Every other op keeps the guard.
//!
//! `UVERBS_PROVIDER_VERBOSE=1` makes the provider say on stderr that it loaded, which devices
//! it claims, and why any op failed. See docs/libibverbs-provider.md.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod abi;
mod ah;
mod context;
mod cq;
mod device;
mod event;
mod ffi;
mod libibverbs;
mod mr;
mod pd;
mod qp;
mod spin;
mod srq;
mod wr;

#[cfg(test)]
mod layout;

/// Runs when the dynamic linker loads the library (libibverbs `dlopen`s providers).
#[cfg_attr(test, allow(dead_code))]
extern "C" fn on_load() {
    ffi::guard("load", (), || {
        match libibverbs::resolve() {
            Ok(imports) => {
                // SAFETY: DEVICE_OPS is a 'static table of the layout driver.h v44 defines,
                // and libibverbs keeps only the pointer.
                unsafe { (imports.register_driver)(&device::DEVICE_OPS.0) };
                ffi::verbose(format_args!(
                    "loaded: Rust rxe provider (uverbs {}) registered with libibverbs as driver \
                     \"uverbs_rxe\" ({})",
                    env!("CARGO_PKG_VERSION"),
                    libibverbs::PABI_VERSION.to_string_lossy()
                ));
            }
            Err(why) => ffi::warn(format_args!("not registering: {why}")),
        }
    });
}

// Not in the unit-test binary, which is not loaded by libibverbs.
#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;
