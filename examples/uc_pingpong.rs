//! A port of rdma-core's `ibv_uc_pingpong` (libibverbs/examples/uc_pingpong.c) to `uverbs`:
//! the same options, out-of-band exchange, QP attributes and loop, so either side can be the C
//! program (`examples/pingpong/mod.rs` says how it differs).

mod pingpong;

fn main() -> std::process::ExitCode {
    pingpong::main(pingpong::Kind::Uc)
}
