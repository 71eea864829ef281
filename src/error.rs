//! Typed errors of the runtime.
//!
//! Every operation of the programming model returns [`Result`]. Two variants are
//! special: [`Error::Rollback`] and [`Error::Killed`] are the runtime's way of
//! unwinding a rank function with `?` so that the rank harness can call it
//! again (rollback) or end the thread of a rank that the fault plan killed.
//! Application code only needs to propagate them.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::Rank;

/// `items` as users read a list: `1, 3, 5`, or `none` (Debug's `[1, 3, 5]`
/// is for developers).
pub(crate) fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let words: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    if words.is_empty() {
        return "none".into();
    }
    words.join(", ")
}

/// Result type of every Lazarus operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Error {
    /// A peer died and the protocol cannot recover (protocol `none`, or no
    /// usable checkpoint remains).
    #[error(
        "rank(s) {} failed and protocol `{protocol}` cannot recover: {why}",
        list(ranks)
    )]
    ProcessFailed {
        /// The ranks that died.
        ranks: Vec<Rank>,
        /// The protocol in force.
        protocol: String,
        /// Why recovery is impossible.
        why: String,
    },
    /// The protocol rolled this rank back; the rank function is about to be
    /// called again. Propagate it with `?`.
    #[error(
        "rolled back after a failure (epoch {epoch}){}",
        generation.map(|g| format!(", to checkpoint generation {g}")).unwrap_or_default()
    )]
    Rollback {
        /// The world epoch (number of failure events) that caused the rollback.
        epoch: u64,
        /// The checkpoint generation restored, if any yet chosen.
        generation: Option<u64>,
    },
    /// The communicator was revoked (ULFM, 002 §3.2): every pending and
    /// later operation on it fails. Shrink it or respawn its failed members
    /// to go on.
    #[error("the communicator (context {context}) was revoked after a failure")]
    Revoked {
        /// Its point-to-point or collective context.
        context: u64,
    },
    /// Internal to collectives: the current attempt at a collective was
    /// interrupted (a member failed, or its result came from a log) and the
    /// collective completes or starts again. Never returned to a rank
    /// function.
    #[error("collective interrupted by a failure (internal; retried)")]
    CollectiveInterrupted,
    /// This rank was killed by fault injection; everything it held is lost.
    #[error("this rank was killed by fault injection")]
    Killed,
    /// A rank number outside the communicator.
    #[error("rank {rank} is out of range for a communicator of size {size}")]
    RankOutOfRange {
        /// The offending rank.
        rank: Rank,
        /// The communicator size.
        size: usize,
    },
    /// A received message does not fit the receive buffer or type.
    #[error("message of {got} bytes does not match the expected {expected} bytes ({what})")]
    SizeMismatch {
        /// Bytes expected.
        expected: usize,
        /// Bytes received.
        got: usize,
        /// Which operation.
        what: Cow<'static, str>,
    },
    /// A structured value failed to encode or decode.
    #[error("serialisation failed for {what}: {detail}")]
    Codec {
        /// What was being encoded or decoded.
        what: Cow<'static, str>,
        /// The codec's message.
        detail: String,
    },
    /// An RMA operation broke the rules of windows and epochs.
    #[error("RMA error on window {window}: {detail}")]
    Rma {
        /// The window id.
        window: u64,
        /// What rule was broken.
        detail: String,
    },
    /// A safe point was reached in a state that cannot be checkpointed.
    #[error("cannot checkpoint here: {0}")]
    NotSafePoint(String),
    /// A checkpoint piece failed its integrity check.
    #[error("checkpoint piece of rank {owner}, generation {generation} is corrupt: {detail}")]
    CorruptCheckpoint {
        /// Owning rank of the piece.
        owner: Rank,
        /// Its generation.
        generation: u64,
        /// What check failed.
        detail: String,
    },
    /// Invalid configuration (names the option).
    #[error("invalid configuration `{option}`: {detail}")]
    Config {
        /// The option at fault.
        option: String,
        /// Why.
        detail: String,
    },
    /// A failure destroyed state that recovery needs (for example a rank's
    /// checkpoint together with the logs that would replay it).
    #[error("cannot recover: {0}")]
    Unrecoverable(Cow<'static, str>),
    /// The request handle was already completed or belongs to another rank.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The driver failed (transport broken, peer unreachable without notice).
    #[error("driver error: {0}")]
    Driver(String),
    /// The application reported an error of its own.
    #[error("application error: {0}")]
    App(String),
    /// A message log's spill file (`--log-budget`) is full or failed.
    #[error("message log spill: {detail}")]
    LogSpill {
        /// What failed, and where.
        detail: String,
    },
    /// Another rank ended with an error, so the job was aborted.
    #[error("job aborted because rank {rank} failed: {reason}")]
    Aborted {
        /// The rank whose error ended the job.
        rank: Rank,
        /// Its error.
        reason: String,
    },
}

impl Error {
    /// True for the errors the rank harness handles itself (rollback, kill):
    /// application code must propagate these unchanged.
    pub fn is_control_flow(&self) -> bool {
        matches!(self, Error::Rollback { .. } | Error::Killed)
    }

    /// Shorthand for an application error.
    pub fn app(msg: impl Into<String>) -> Self {
        Error::App(msg.into())
    }

    /// Shorthand for a configuration error.
    pub fn config(option: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Config {
            option: option.into(),
            detail: detail.into(),
        }
    }
}

impl From<postcard::Error> for Error {
    fn from(e: postcard::Error) -> Self {
        Error::Codec {
            what: "postcard value".into(),
            detail: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Users read lists and optional generations, not Debug's `[..]` and
    /// `Some(..)`.
    #[test]
    fn messages_carry_no_debug_formatting() {
        let failed = Error::ProcessFailed {
            ranks: vec![1, 3],
            protocol: "none".into(),
            why: "no checkpoint".into(),
        };
        assert!(
            failed.to_string().starts_with("rank(s) 1, 3 failed"),
            "{failed}"
        );
        let back = |generation| {
            Error::Rollback {
                epoch: 2,
                generation,
            }
            .to_string()
        };
        assert_eq!(
            back(Some(21)),
            "rolled back after a failure (epoch 2), to checkpoint generation 21"
        );
        assert_eq!(back(None), "rolled back after a failure (epoch 2)");
        assert_eq!(list(Vec::<u32>::new()), "none");
    }
}
