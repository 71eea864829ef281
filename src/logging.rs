//! Logs: what the runtime has to tell (warnings, failures with their
//! causes, narration for debugging) as [`tracing`] events, and the
//! subscriber that prints them on stderr.
//!
//! Levels:
//!
//! - `warn` (the default): what a user must see, such as a send waiting
//!   for a receiver that reads nothing, a damaged checkpoint piece, or a
//!   rank silent for seconds;
//! - `info`: failures as they happen: each suspicion of the failure
//!   detector, each declared failure with its cause (a fault-injection
//!   kill, a process's exit status or signal, heartbeat silence against
//!   the timeout, a lost agent), each rank's notice of it, and what was
//!   lost with it;
//! - `debug`: the launcher's and the ranks' narration (connections,
//!   control messages, fallbacks such as a window kept in process memory).
//!
//! Events carry structured fields (`rank`, `peer`, `node`, `generation`,
//! `epoch`, `cause`, ...) for a subscriber that records them (a program's
//! own, say one that writes JSON). The line printed here is the level and
//! the message, which says the same in words, with no timestamp:
//!
//! ```text
//! WARN lazarus: rank 3: a send has waited 30 s: ...
//! INFO lazarus launcher: rank 1 failed: killed by fault injection (1@50%)
//! ```
//!
//! The filter ([`LogFilter`]) is a level (`error`, `warn`, `info`,
//! `debug`, `trace`, `off`) or comma-separated `TARGET=LEVEL` directives
//! (`lazarus=debug`, `warn,lazarus::driver::processes::launcher=debug`), as
//! `RUST_LOG` takes them (without `EnvFilter`'s span and field filters).
//! Which one applies: the `lazarus` command's `--log-level`; else
//! `LAZARUS_LOG`, set by a launcher for the rank processes and agents it
//! starts (the filter it runs with itself, so `--log-level` reaches every
//! process of a job); else `RUST_LOG`; else `warn`.
//!
//! A program using the library needs nothing: its first [`crate::run`]
//! installs this subscriber (from `LAZARUS_LOG`, `RUST_LOG` or `warn`)
//! unless the program installed a subscriber of its own before, which then
//! receives the events instead.

use std::fmt;
use std::io::IsTerminal as _;
use std::str::FromStr;
use std::sync::{Once, OnceLock};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, MakeWriter};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;

/// The filter when none is given: warnings and errors.
pub const DEFAULT_FILTER: &str = "warn";

/// The environment variable a launcher hands its filter over in.
pub(crate) const HANDOVER_VAR: &str = "LAZARUS_LOG";

/// The conventional environment variable of Rust programs' log filters.
pub const RUST_LOG: &str = "RUST_LOG";

/// A checked log filter: a level, or `TARGET=LEVEL` directives.
///
/// ```
/// use lazarus::logging::LogFilter;
/// assert!("info".parse::<LogFilter>().is_ok());
/// assert!("warn,lazarus=debug".parse::<LogFilter>().is_ok());
/// assert!("bogus".parse::<LogFilter>().is_err());
/// ```
#[derive(Debug, Clone)]
pub struct LogFilter {
    text: String,
    targets: Targets,
}

impl LogFilter {
    /// The directives as given (what a launcher hands on).
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for LogFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A level word as a filter takes it.
fn level(word: &str) -> Result<LevelFilter, String> {
    let w = word.trim();
    // `LevelFilter` also reads digits (0 to 5), which nobody means here.
    if w.is_empty() || w.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{w}` is not a level"));
    }
    w.parse::<LevelFilter>()
        .map_err(|_| format!("`{w}` is not a level"))
}

impl FromStr for LogFilter {
    type Err = String;

    /// Each comma-separated directive must be a level or `TARGET=LEVEL`:
    /// `Targets` alone would take a lone word (`bogus`, or a misspelt
    /// level) as a target enabled at every level.
    fn from_str(s: &str) -> Result<Self, String> {
        const LEVELS: &str = "error, warn, info, debug, trace or off";
        let text = s.trim();
        if text.is_empty() {
            return Err(format!(
                "an empty filter: give a level ({LEVELS}) or TARGET=LEVEL directives"
            ));
        }
        for d in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            let checked = match d.split_once('=') {
                Some((target, lvl)) if !target.trim().is_empty() => level(lvl).map(|_| ()),
                Some(_) => Err(format!("`{d}` names no target")),
                None => level(d).map(|_| ()),
            };
            checked.map_err(|why| {
                format!(
                    "{why}: each directive is a level ({LEVELS}) or TARGET=LEVEL (lazarus=debug)"
                )
            })?;
        }
        let targets = text
            .parse::<Targets>()
            .map_err(|e| format!("`{text}`: {e}"))?;
        Ok(LogFilter {
            text: text.to_string(),
            targets,
        })
    }
}

fn default_filter() -> LogFilter {
    LogFilter {
        text: DEFAULT_FILTER.into(),
        targets: Targets::new().with_default(LevelFilter::WARN),
    }
}

/// The filter this process installed, once it did.
static INSTALLED: OnceLock<String> = OnceLock::new();

/// The filter of the subscriber this module installed in this process
/// (`None` when it installed none: the program has its own, or nothing
/// was logged yet). A launcher hands it to the processes it starts.
pub(crate) fn installed() -> Option<&'static str> {
    INSTALLED.get().map(String::as_str)
}

/// Install the subscriber that prints events on stderr, filtered by
/// `filter`, else by `LAZARUS_LOG`, else `RUST_LOG`, else `warn` (an
/// unreadable variable is said, as a warning, and `warn` applies).
///
/// Returns false, changing nothing, when this process already has a
/// global subscriber (the program's own, or one installed before).
pub fn init(filter: Option<&LogFilter>) -> bool {
    let (filter, bad) = match filter {
        Some(f) => (f.clone(), None),
        None => from_env(),
    };
    let text = filter.text.clone();
    let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    if tracing::subscriber::set_global_default(subscriber(filter, color, Stderr)).is_err() {
        return false;
    }
    let _ = INSTALLED.set(text);
    if let Some((var, value, why)) = bad {
        tracing::warn!(
            "lazarus: {var}=`{value}` is not a log filter ({why}); logging at `{DEFAULT_FILTER}`"
        );
    }
    true
}

/// The subscriber: `filter`'s events as [`Line`]s into `writer`.
fn subscriber<W>(filter: LogFilter, color: bool, writer: W) -> impl Subscriber + Send + Sync
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let layer = tracing_subscriber::fmt::layer()
        .event_format(Line { color })
        .with_writer(writer);
    tracing_subscriber::registry()
        .with(filter.targets)
        .with(layer)
}

/// [`init`] without a filter, once per process: what [`crate::run`] does
/// (in a launched rank process too), so that warnings reach stderr in
/// every program that installed no subscriber of its own.
pub(crate) fn init_default() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        init(None);
    });
}

/// The filter the environment names, and what was wrong with a variable
/// that could not be read as one.
fn from_env() -> (LogFilter, Option<(&'static str, String, String)>) {
    for var in [HANDOVER_VAR, RUST_LOG] {
        let Ok(value) = std::env::var(var) else {
            continue;
        };
        if value.trim().is_empty() {
            continue;
        }
        return match value.parse() {
            Ok(f) => (f, None),
            Err(why) => (default_filter(), Some((var, value, why))),
        };
    }
    (default_filter(), None)
}

/// A line per event: the level, a space, the message. Structured fields
/// are left to subscribers that record them: the message says them.
struct Line {
    /// Colour the level (stderr is a terminal and `NO_COLOR` is unset).
    color: bool,
}

impl<S, N> FormatEvent<S, N> for Line
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = *event.metadata().level();
        if self.color {
            let code = match level {
                Level::ERROR => "31",
                Level::WARN => "33",
                Level::INFO => "32",
                Level::DEBUG => "34",
                Level::TRACE => "35",
            };
            write!(w, "\x1b[{code}m{level}\x1b[0m ")?;
        } else {
            write!(w, "{level} ")?;
        }
        let mut message = Message {
            w: &mut w,
            result: Ok(()),
        };
        event.record(&mut message);
        message.result?;
        w.write_char('\n')
    }
}

/// Writes an event's `message` field.
struct Message<'a, 'w> {
    w: &'a mut Writer<'w>,
    result: fmt::Result,
}

impl Visit for Message<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.result = self.w.write_str(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.result = write!(self.w, "{value:?}");
        }
    }
}

/// Standard error through `eprint!`: a test harness captures it as it
/// captures the `eprintln!` these events replaced, and each line goes out
/// in one write.
#[derive(Clone, Copy)]
struct Stderr;

impl std::io::Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        eprint!("{}", String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Stderr;

    fn make_writer(&'a self) -> Stderr {
        *self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_levels_or_target_directives() {
        for good in [
            "error",
            "warn",
            "INFO",
            "debug",
            "trace",
            "off",
            "lazarus=debug",
            "warn,lazarus::driver::processes::launcher=debug",
            " info , lazarus=trace ",
        ] {
            let f: LogFilter = good.parse().unwrap_or_else(|e| panic!("{good}: {e}"));
            assert_eq!(f.as_str(), good.trim());
        }
        for bad in [
            "bogus",
            "",
            " ",
            "lazarus=loud",
            "=debug",
            "3",
            "info,verbose",
        ] {
            let e = bad.parse::<LogFilter>().expect_err(bad);
            assert!(e.contains("level"), "{bad}: {e}");
        }
    }

    /// Lines of the events `emit` makes under `filter`.
    fn printed(filter: &str, emit: impl FnOnce()) -> String {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().expect("buffer").extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let filter: LogFilter = filter.parse().expect("filter");
        let out = buf.clone();
        tracing::subscriber::with_default(subscriber(filter, false, move || out.clone()), emit);
        let bytes = buf.0.lock().expect("buffer").clone();
        String::from_utf8(bytes).expect("utf-8")
    }

    fn events() {
        tracing::warn!(rank = 3, "lazarus: rank 3: a send has waited 30 s: why");
        tracing::info!(rank = 1, cause = "x", "lazarus launcher: rank 1 failed: x");
        tracing::debug!("lazarus launcher: connected");
    }

    /// Today's words, after the level and nothing else (no timestamp, no
    /// fields repeated); `warn` by default hides `info` and `debug`.
    #[test]
    fn a_line_is_the_level_and_the_words() {
        assert_eq!(
            printed(DEFAULT_FILTER, events),
            "WARN lazarus: rank 3: a send has waited 30 s: why\n"
        );
        assert_eq!(
            printed("info", events),
            "WARN lazarus: rank 3: a send has waited 30 s: why\n\
             INFO lazarus launcher: rank 1 failed: x\n"
        );
        assert_eq!(printed("debug", events).lines().count(), 3);
        assert_eq!(printed("warn,lazarus=debug", events).lines().count(), 3);
        assert_eq!(printed("other=debug", events), "");
    }

    #[test]
    fn the_filter_lets_through_what_it_names() {
        let f: LogFilter = "warn,lazarus::driver=debug".parse().expect("filter");
        assert!(
            f.targets
                .would_enable("lazarus::driver::processes", &Level::DEBUG)
        );
        assert!(!f.targets.would_enable("lazarus::engine", &Level::INFO));
        assert!(f.targets.would_enable("lazarus::engine", &Level::WARN));
        let d = default_filter();
        assert!(d.targets.would_enable("lazarus", &Level::WARN));
        assert!(!d.targets.would_enable("lazarus", &Level::INFO));
    }
}
