//! `cargo +nightly fuzz run siw_cqe`: the fuzzer's bytes become a siw CQ of 1 to 16 slots and
//! a sequence of moves by a lying kernel (CQEs of any bytes in any slot, with or without the
//! VALID flag, over unpolled ones) and by the poller (polls of any width, staged runs consumed
//! in part), against the real siw CQ, its CQE translation and its slot protocol, through the
//! harness in `providers/siw/cq.rs` (the same one its unit test runs with seeded inputs). A
//! panic (a completion that is not the one in the slot at its position, a slot given back
//! unread) or an access outside the ring (AddressSanitizer) is a finding.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    uverbs::testing::siw_hostile::HostileCq::run(data);
});
