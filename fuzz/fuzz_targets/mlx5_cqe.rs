//! `cargo +nightly fuzz run mlx5_cqe`: the fuzzer's bytes become a CQ ring, the QPs completing
//! on it and a sequence of moves by the poster and by a lying device (CQEs of random bytes:
//! compressed and inline-scatter formats, unknown opcodes and user indices, `wqe_counter`s
//! naming nothing outstanding; entries written over unpolled ones; scrubs and resets) against
//! the real mlx5 ring, poll, CQE decoder and `wr_id` tables, through the harness in
//! `providers/mlx5/cq/hostile.rs` (the same one the unit test runs with seeded inputs), which
//! the uverbs crate exports under its `test-support` and `mlx5` features. A panic (a
//! completion that is neither a typed error nor an outstanding request's) or an access outside
//! the ring (under AddressSanitizer, which cargo fuzz enables) is a finding.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    uverbs::testing::mlx5_cqes::run(data);
});
