//! A drop-in libibverbs provider for SoftRoCE (`rdma_rxe`) and soft-iWARP (`siw`) built on the
//! pure-Rust `uverbs` core: libibverbs loads this library as a provider (drivers `uverbs_rxe`
//! and `uverbs_siw`, file `libuverbs_rxe-rdmav34.so`), and unmodified programs linked against
//! libibverbs (`ibv_devinfo`, `ibv_rc_pingpong`, perftest, librdmacm's `rping`, ...) then run
//! their verbs on rxe and siw devices through `uverbs` instead of rdma-core's C providers.
//!
//! How it fits together:
//!
//! - A constructor in `.init_array` runs when libibverbs `dlopen`s the library. It looks up
//!   the four libibverbs entry points it needs at symbol version `IBVERBS_PRIVATE_34`
//!   ([`libibverbs`]) and registers, with `verbs_register_driver_34`, one driver per
//!   provider of the `uverbs` core it fronts ([`device::FRONTENDS`]: rxe and siw), each with a
//!   match table made from the core provider's kernel driver id ([`uverbs::providers`],
//!   [`ops::device_ops`]). On a libibverbs with another provider ABI it prints why and
//!   registers nothing.
//! - libibverbs matches devices to a driver by kernel driver id (or name, as the C provider)
//!   and calls `alloc_context` with the device fd it opened; [`context`] builds a
//!   `uverbs::Context` on that fd, which picks the core provider, and installs the op table
//!   ([`ops`], the one module that names every object module's entry points).
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
mod mw;
mod ops;
mod pd;
mod qp;
mod qp_ex;
mod spin;
mod srq;
mod wr;
mod wr_builder;

#[cfg(test)]
mod layout;

/// Runs when the dynamic linker loads the library (libibverbs `dlopen`s providers).
#[cfg_attr(test, allow(dead_code))]
extern "C" fn on_load() {
    ffi::guard("load", (), || {
        match libibverbs::resolve() {
            Ok(imports) => {
                for frontend in device::FRONTENDS {
                    let Some(ops) = ops::device_ops(frontend) else {
                        ffi::warn(format_args!(
                            "not registering driver \"{}\": the uverbs core has no {} provider",
                            frontend.driver.to_string_lossy(),
                            frontend.core
                        ));
                        continue;
                    };
                    // SAFETY: `ops` is a never-freed table of the layout driver.h v44 defines,
                    // and libibverbs keeps only the pointer.
                    unsafe { (imports.register_driver)(ops) };
                    ffi::verbose(format_args!(
                        "loaded: Rust {} provider (uverbs {}) registered with libibverbs as driver \
                         \"{}\" ({})",
                        frontend.core,
                        env!("CARGO_PKG_VERSION"),
                        frontend.driver.to_string_lossy(),
                        libibverbs::PABI_VERSION.to_string_lossy()
                    ));
                }
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
