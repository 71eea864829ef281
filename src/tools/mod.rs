//! The tools behind the `lazarus` command line: the run summary (JSON) and
//! the benchmark driver. The binary (`src/main.rs`) only parses arguments.

pub mod bench;
pub mod chaos;
pub mod model;
pub mod plot;
pub mod report;
pub mod scale;
pub mod summary;

use serde::Serialize;

/// The version of the JSON that `--json` writes, whatever the subcommand:
/// raised when a field is renamed, removed or changes meaning, so that a
/// script reading an old report can tell. 1: the first versioned one (the
/// sim rows and bench-codec figures moved from a bare list into `rows` and
/// `figures`).
pub const JSON_SCHEMA: u32 = 1;

/// A report as it is written: `schema` and `lazarus_version` first, then
/// the report's own fields. `body` must serialize as a map (a struct);
/// wrap a list in a struct with a named field.
#[derive(Debug, Serialize)]
pub struct Versioned<'a, T: Serialize> {
    /// [`JSON_SCHEMA`].
    pub schema: u32,
    /// The `lazarus` crate version that wrote it.
    pub lazarus_version: &'static str,
    /// The report.
    #[serde(flatten)]
    pub body: &'a T,
}

impl<'a, T: Serialize> Versioned<'a, T> {
    /// `body` under this build's schema and version.
    pub fn new(body: &'a T) -> Self {
        Versioned {
            schema: JSON_SCHEMA,
            lazarus_version: env!("CARGO_PKG_VERSION"),
            body,
        }
    }
}
