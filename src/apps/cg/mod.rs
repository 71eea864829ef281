//! NAS Parallel Benchmarks CG.
pub mod npb;
