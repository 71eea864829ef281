//! The tools behind the `lazarus` command line: the run summary (JSON) and
//! the benchmark driver. The binary (`src/main.rs`) only parses arguments.

pub mod bench;
pub mod chaos;
pub mod model;
pub mod plot;
pub mod scale;
pub mod summary;
