//! The applications shipped with Lazarus: test oracles and benchmarks.
pub mod cg;
