//! What travels between ranks: frames and their bodies.
//!
//! Every frame carries the sender's world *epoch* (the number of failure events
//! it has seen). A receiver drops frames from an older epoch (they belong to an
//! execution that has been rolled back) and holds frames from a newer one until
//! it learns of the failure itself. Payloads are [`Bytes`]: shared, immutable,
//! reference-counted, so the transport and a sender-based log can hold the same
//! buffer without a copy (DESIGN principle 4).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::Rank;
use crate::protocol::Control;
use crate::store::StoreMsg;

/// Identifier of a communication context (one per communicator and use:
/// point-to-point and collective traffic of one communicator never match).
pub type ContextId = u64;

/// Message tag.
pub type Tag = i32;

/// The matching information of an application message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Sender, as a world rank.
    pub src: Rank,
    /// Destination, as a world rank.
    pub dest: Rank,
    /// Communication context.
    pub context: ContextId,
    /// Tag.
    pub tag: Tag,
}

/// An application (or collective) message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppMessage {
    /// Matching information.
    pub envelope: Envelope,
    /// Send sequence number on the channel `src -> dest` (SSN, 002 §3.1):
    /// counts every application message the sender sent to this destination.
    pub ssn: u64,
    /// The payload, shared with the sender (never copied to be logged).
    pub payload: Bytes,
}

/// Runtime-level messages that are not the protocol's business.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuntimeMsg {
    /// The sender finished its rank function (finalize, phase 1).
    Done,
    /// Every rank finished: leave (finalize, phase 2).
    Exit,
}

/// What a frame carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Body {
    /// An application message.
    App(AppMessage),
    /// A protocol control message.
    Control(Control),
    /// A checkpoint-store message.
    Store(StoreMsg),
    /// A runtime message.
    Runtime(RuntimeMsg),
}

/// A unit of transmission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// Sending world rank.
    pub src: Rank,
    /// Sender's world epoch.
    pub epoch: u64,
    /// Contents.
    pub body: Body,
}

/// What a driver hands to a rank when polled.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A frame from a peer.
    Frame(Frame),
    /// The failure detector declares `dead` failed; the world is now at `epoch`.
    FailureNotice {
        /// New world epoch.
        epoch: u64,
        /// Ranks that died in this event.
        dead: Vec<Rank>,
    },
    /// The job is being aborted because `rank` ended with an error.
    Abort {
        /// The rank at fault.
        rank: Rank,
        /// Its error, as text.
        reason: String,
    },
}
