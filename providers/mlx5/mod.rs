//! ConnectX (`mlx5_ib`): user space allocates every ring and doorbell record, writes WQEs
//! and reads CQEs in the device's own formats, and rings doorbells through mapped UAR pages.

// The provider that uses them comes in a later step.
#[allow(dead_code)]
mod abi;
#[allow(dead_code)]
mod cqe;
#[cfg(test)]
mod dv_check;
#[allow(dead_code)]
mod wqe;
