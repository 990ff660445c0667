//! `cargo +nightly fuzz run rings`: the fuzzer's bytes become a ring header and a sequence of
//! moves by a lying kernel (indices out of range, headers rewritten, garbage in the slots,
//! sizes that do not fit the mapping) against the real rxe ring code in
//! `providers/rxe/queue.rs`, through the harness in `providers/rxe/queue/hostile.rs` (the same
//! one the unit tests run with seeded inputs). A panic or an access outside the ring (under
//! AddressSanitizer, which cargo fuzz enables) is a finding.
//!
//! The ring code is private to the uverbs crate, so it is included here by path, with the few
//! crate items it names: the real `src/error.rs` and `providers/rxe/abi.rs`, and stand-ins for
//! `QpState` (named by one error variant) and the `assert_layout!` macro (layouts are checked
//! in the main crate).

#![no_main]
#![allow(dead_code, unreachable_pub)]

use libfuzzer_sys::fuzz_target;

#[path = "../../src/error.rs"]
mod error;

/// Stands in for `uverbs::QpState`, which `error.rs` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpState;

mod sys {
    macro_rules! assert_layout {
        ($($t:tt)*) => {};
    }
    pub(crate) use assert_layout;
}

// `queue.rs` reaches its header offsets as `super::abi`: both sit at the crate root here, as
// they sit side by side in the rxe module there.
#[path = "../../providers/rxe/abi.rs"]
mod abi;
#[path = "../../providers/rxe/queue.rs"]
mod queue;

fuzz_target!(|data: &[u8]| {
    queue::hostile::run(data);
});
