//! The tools behind the `lazarus` command line: the run summary (JSON) and
//! the benchmark driver. The binary (`src/main.rs`) only parses arguments.

pub mod bench;
pub mod chaos;
pub mod model;
pub mod plot;
pub mod report;
pub mod scale;
pub mod summary;
pub mod table_one;

use serde::Serialize;

/// A byte count as summaries and tables print it: `bytesize`'s SI form
/// (`22.4 MB`, `512 B`). The JSON reports keep the exact integer.
pub fn human_bytes(n: u64) -> String {
    bytesize::ByteSize(n).display().si().to_string()
}

/// A size chosen as a power of two (a ping-pong message, a `bench-codec`
/// piece) in IEC units: `8 B`, `64 KiB`, `1.5 MiB`.
pub fn binary_size(n: u64) -> String {
    let s = bytesize::ByteSize(n).display().iec().to_string();
    s.replace(".0 ", " ")
}

/// [`human_bytes`] of a median or a mean (rounded to whole bytes; NaN and
/// negative values print as 0 B).
pub fn human_bytes_f64(n: f64) -> String {
    human_bytes(n.round() as u64)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_as_people_read_them() {
        assert_eq!(human_bytes(100), "100 B");
        assert_eq!(human_bytes(22_400_000), "22.4 MB");
        assert_eq!(human_bytes(3 << 30), "3.2 GB");
        assert_eq!(human_bytes_f64(1536.4), "1.5 kB");
        assert_eq!(human_bytes_f64(f64::NAN), "0 B");
        assert_eq!(binary_size(8), "8 B");
        assert_eq!(binary_size(64 << 10), "64 KiB");
        assert_eq!(binary_size(3 << 19), "1.5 MiB");
        assert_eq!(binary_size(4 << 20), "4 MiB");
    }
}
