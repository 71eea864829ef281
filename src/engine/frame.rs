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
use crate::store::{PieceWriter, StoreMsg};

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

/// About how many bytes an encoded [`AppMessage`] takes besides its payload
/// (envelope, SSN and length prefix, as varints): to size a checkpoint piece.
pub const ENCODED_MESSAGE_OVERHEAD: usize = 48;

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

/// A contribution to, or the outcome of, a fault-tolerant agreement
/// (ULFM's agree and shrink): flags are and-ed, failed ranks united, and the
/// largest next free context id taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgreeValue {
    /// And of the members' flags.
    pub flag: bool,
    /// World ranks known to have failed, sorted.
    pub failed: Vec<Rank>,
    /// Largest next free context id.
    pub context: ContextId,
}

impl AgreeValue {
    /// Fold another contribution in.
    pub fn combine(&mut self, o: &AgreeValue) {
        self.flag &= o.flag;
        self.failed.extend(&o.failed);
        self.failed.sort_unstable();
        self.failed.dedup();
        self.context = self.context.max(o.context);
    }
}

/// Runtime-level messages that are not the protocol's business.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuntimeMsg {
    /// The sender finished its rank function (finalize, phase 1).
    Done,
    /// Every rank finished: leave (finalize, phase 2).
    Exit,
    /// ULFM: these contexts are revoked.
    Revoke {
        /// The communicator's contexts.
        contexts: Vec<ContextId>,
    },
    /// ULFM agreement number `seq` on the communicator of `context`: the
    /// sender's contribution, to the coordinator.
    AgreeOffer {
        /// Point-to-point context of the communicator.
        context: ContextId,
        /// Agreement number on it.
        seq: u64,
        /// The contribution.
        value: AgreeValue,
    },
    /// The decided outcome of that agreement.
    AgreeDecided {
        /// Point-to-point context of the communicator.
        context: ContextId,
        /// Agreement number on it.
        seq: u64,
        /// The outcome.
        value: AgreeValue,
    },
    /// ULFM respawn: to a new incarnation of a failed rank, the
    /// communicator it joins.
    Join {
        /// Its point-to-point context (the collective one follows).
        context: ContextId,
        /// Its world ranks.
        group: Vec<Rank>,
        /// World ranks that are dead (not respawned).
        failed: Vec<Rank>,
    },
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
    /// Every rank's value is known (a rank died after entering finalize
    /// when all had): finalize returns at once.
    JobComplete,
}

/// Append the postcard encoding of `value` to `buf`.
///
/// postcard's own appending serializer (`to_extend`) copies byte strings
/// through an iterator, one byte at a time as far as the compiler is
/// concerned; this one copies them with `extend_from_slice` (a `memcpy`),
/// which is what a checkpoint piece full of logged payloads is made of
/// (that copy was 227 `perf` samples against 115 for the piece's CRC32C,
/// 8 CG W runs under `pessimistic`).
pub fn postcard_append<T: Serialize + ?Sized>(value: &T, buf: &mut Vec<u8>) -> crate::Result<()> {
    postcard::serialize_with_flavor(value, Append(buf)).map_err(Into::into)
}

/// Append `meta` to a checkpoint piece, then `blobs` after it, shared
/// rather than copied when they are large ([`PieceWriter::append_shared`]):
/// a logging protocol's payloads. Their lengths are written between the two,
/// and [`take_with_blobs`] reads all of it back.
pub fn append_with_blobs<T: Serialize + ?Sized>(
    meta: &T,
    blobs: &[&Bytes],
    piece: &mut PieceWriter<'_>,
) -> crate::Result<()> {
    postcard_append(meta, piece.buf())?;
    let lengths: Vec<u64> = blobs.iter().map(|b| b.len() as u64).collect();
    postcard_append(&lengths, piece.buf())?;
    for b in blobs {
        piece.append_shared(b);
    }
    Ok(())
}

/// Read what [`append_with_blobs`] wrote at the start of `state`: the
/// metadata, the blobs (slices of `state`, not copies) and the rest of
/// `state`. Lengths that overrun `state` are a corrupt piece, reported as
/// [`crate::Error::Codec`].
pub fn take_with_blobs<T: serde::de::DeserializeOwned>(
    state: &Bytes,
) -> crate::Result<(T, Vec<Bytes>, Bytes)> {
    let (meta, rest): (T, &[u8]) = postcard::take_from_bytes(state)?;
    let (lengths, rest): (Vec<u64>, &[u8]) = postcard::take_from_bytes(rest)?;
    let mut at = state.len() - rest.len();
    let mut blobs = Vec::with_capacity(lengths.len());
    for (i, &n) in lengths.iter().enumerate() {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| at.checked_add(n))
            .filter(|&e| e <= state.len())
            .ok_or_else(|| crate::Error::Codec {
                what: "a checkpoint piece's logged payloads".into(),
                detail: format!(
                    "payload {i} of {n} bytes runs past the {} bytes left",
                    state.len() - at
                ),
            })?;
        blobs.push(state.slice(at..end));
        at = end;
    }
    Ok((meta, blobs, state.slice(at..)))
}

/// The postcard output of [`postcard_append`].
struct Append<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for Append<'_> {
    type Output = ();

    fn try_push(&mut self, b: u8) -> postcard::Result<()> {
        self.0.push(b);
        Ok(())
    }

    fn try_extend(&mut self, b: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(b);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod append_tests {
    #[test]
    fn appends_what_postcard_encodes() {
        let value = (7u64, bytes::Bytes::from_static(b"payload"), vec![1u32, 2]);
        let mut buf = b"head".to_vec();
        super::postcard_append(&value, &mut buf).expect("encodes");
        let mut want = b"head".to_vec();
        want.extend(postcard::to_allocvec(&value).expect("encodes"));
        assert_eq!(buf, want);
    }
}
