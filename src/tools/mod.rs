//! Command-line tools.
