//! `cargo +nightly fuzz run mlx5_device`: the fuzzer's bytes become rounds of hostile work
//! queue entries and doorbell values (control segments that lie about their size and opcode,
//! wrong keys, producer indices out of range, garbage in the receive queue and the CQ arm
//! record) thrown at the mlx5 device model (`tests/mlx5/model/`), through the harness its
//! unit tests use with seeded inputs (feature `harness`). A panic, or an access outside the
//! buffers the client registered, is a finding.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut words = data.chunks(8);
    let mut next = || {
        words.next().map_or(0, |w| {
            let mut b = [0u8; 8];
            b[..w.len()].copy_from_slice(w);
            u64::from_le_bytes(b)
        })
    };
    let stray = uverbs_mlx5_model::harness::hostile_round(&mut next);
    assert_eq!(stray, 0, "the model touched memory outside the registered buffers");
});
