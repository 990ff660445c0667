//! `cargo +nightly fuzz run rings`: the fuzzer's bytes become a ring header and a sequence of
//! moves by a lying kernel (indices out of range, headers rewritten, garbage in the slots,
//! sizes that do not fit the mapping) against the real rxe ring code in
//! `providers/rxe/queue.rs`, through the harness in `providers/rxe/queue/hostile.rs` (the same
//! one the unit tests run with seeded inputs), which the uverbs crate exports to tests under
//! its `test-support` feature. A panic or an access outside the ring (under AddressSanitizer,
//! which cargo fuzz enables) is a finding.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    uverbs::testing::hostile::run(data);
});
