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
//! - Every op ([`verbs`]) converts the C arguments, calls the `uverbs` API and converts back.
//!   No op can unwind into C: each body runs under [`ffi::guard`], but for the data path
//!   (poll and post), where a panic, which cannot happen on any input, would abort (see
//!   [`verbs`]).
//!
//! `UVERBS_PROVIDER_VERBOSE=1` makes the provider say on stderr that it loaded, which devices
//! it claims, and why any op failed. See docs/libibverbs-provider.md.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod abi;
mod context;
mod device;
mod ffi;
mod libibverbs;
mod spin;
mod verbs;

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
