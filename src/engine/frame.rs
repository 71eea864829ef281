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
use crate::store::piece::SHARED_SEGMENT_MIN;
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

/// Append `meta` to a checkpoint piece, then `blobs` (a logging protocol's
/// payloads), which [`take_with_blobs`] reads back.
///
/// Layout: `meta`, the size threshold, every blob's length, the blobs
/// under the threshold together (copied into the piece's buffer, in
/// order), then the others, each shared as a segment of its own
/// ([`PieceWriter::share`]: not copied). Small blobs first, together, so
/// that the shared ones do not cut the piece's buffer into one segment per
/// small blob (in the first call, the pool's buffer sized by
/// [`crate::protocol::Protocol::state_size_hint`]; a second call, as ULML's
/// after the point-to-point log, writes into a new one). The threshold is
/// recorded so that a piece stays readable if it changes.
pub fn append_with_blobs<T: Serialize + ?Sized>(
    meta: &T,
    blobs: &[&Bytes],
    piece: &mut PieceWriter<'_>,
) -> crate::Result<()> {
    postcard_append(meta, piece.buf())?;
    let lengths: Vec<u64> = blobs.iter().map(|b| b.len() as u64).collect();
    postcard_append(&(SHARED_SEGMENT_MIN as u64), piece.buf())?;
    postcard_append(&lengths, piece.buf())?;
    for b in blobs.iter().filter(|b| b.len() < SHARED_SEGMENT_MIN) {
        piece.buf().extend_from_slice(b);
    }
    for b in blobs.iter().filter(|b| b.len() >= SHARED_SEGMENT_MIN) {
        piece.share(b);
    }
    Ok(())
}

/// Read what [`append_with_blobs`] wrote at the start of `state`: the
/// metadata, the blobs (in their order) and the rest of `state`.
///
/// The blobs are copies: a slice would keep the whole restored piece
/// (application state included) alive for as long as one logged payload
/// stays in the log. Lengths that overrun `state` are a corrupt piece,
/// reported as [`crate::Error::Codec`].
pub fn take_with_blobs<T: serde::de::DeserializeOwned>(
    state: &Bytes,
) -> crate::Result<(T, Vec<Bytes>, Bytes)> {
    let (meta, rest): (T, &[u8]) = postcard::take_from_bytes(state)?;
    let (threshold, rest): (u64, &[u8]) = postcard::take_from_bytes(rest)?;
    let (lengths, rest): (Vec<u64>, &[u8]) = postcard::take_from_bytes(rest)?;
    let corrupt = |detail: String| crate::Error::Codec {
        what: "a checkpoint piece's logged payloads".into(),
        detail,
    };
    let start = state.len() - rest.len();
    let small: u64 = (lengths.iter().filter(|&&n| n < threshold))
        .try_fold(0u64, |sum, &n| sum.checked_add(n))
        .ok_or_else(|| corrupt("the payloads' lengths overflow".into()))?;
    let small_end = usize::try_from(small)
        .ok()
        .and_then(|n| start.checked_add(n))
        .filter(|&e| e <= state.len())
        .ok_or_else(|| {
            corrupt(format!(
                "{small} bytes of small payloads, {} bytes left",
                state.len() - start
            ))
        })?;
    // Two cursors: the small blobs' region, then the shared ones'.
    let (mut small_at, mut large_at) = (start, small_end);
    let mut blobs = Vec::with_capacity(lengths.len());
    for (i, &n) in lengths.iter().enumerate() {
        let (at, limit) = if n < threshold {
            (&mut small_at, small_end)
        } else {
            (&mut large_at, state.len())
        };
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| at.checked_add(n))
            .filter(|&e| e <= limit)
            .ok_or_else(|| {
                corrupt(format!(
                    "payload {i} of {n} bytes runs past the {} bytes left",
                    limit - *at
                ))
            })?;
        blobs.push(Bytes::copy_from_slice(&state[*at..end]));
        *at = end;
    }
    Ok((meta, blobs, state.slice(large_at..)))
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

#[cfg(test)]
mod blob_tests {
    use super::*;
    use crate::store::pool::BufferPool;

    fn written(meta: &str, blobs: &[&Bytes]) -> Bytes {
        let pool = BufferPool::new();
        let mut w = PieceWriter::new(&pool, Vec::new());
        append_with_blobs(meta, blobs, &mut w).expect("encodes");
        w.buf().extend_from_slice(b"rest");
        w.finish().to_bytes()
    }

    /// Blobs come back in their order, whichever region they were in, as
    /// copies; what follows them is the rest.
    #[test]
    fn blobs_round_trip_in_order() {
        let big = Bytes::from(vec![1u8; SHARED_SEGMENT_MIN + 3]);
        let other = Bytes::from(vec![2u8; SHARED_SEGMENT_MIN]);
        let (a, b) = (Bytes::from_static(b"a"), Bytes::from_static(b"bb"));
        let blobs = [&a, &big, &b, &Bytes::new(), &other, &big];
        let state = written("meta", &blobs);
        let (meta, got, rest): (String, _, _) = take_with_blobs(&state).expect("decodes");
        assert_eq!(meta, "meta");
        assert_eq!(got.iter().collect::<Vec<_>>(), blobs);
        assert_eq!(&rest[..], b"rest");
        let span = state.as_ptr() as usize..state.as_ptr() as usize + state.len();
        assert!(
            got.iter()
                .all(|g| g.is_empty() || !span.contains(&(g.as_ptr() as usize)))
        );
    }

    /// A piece written with another threshold reads back by the one it
    /// records: with 3, "xyz" (3 bytes) is in the shared region after the
    /// small "uv", though listed first.
    #[test]
    fn the_recorded_threshold_is_followed() {
        let mut state = Vec::new();
        postcard_append("m", &mut state).expect("encodes");
        postcard_append(&3u64, &mut state).expect("encodes");
        postcard_append(&vec![3u64, 2], &mut state).expect("encodes");
        state.extend_from_slice(b"uvxyzrest");
        let (_, got, rest): (String, _, _) = take_with_blobs(&Bytes::from(state)).expect("decodes");
        assert_eq!(
            got,
            vec![Bytes::from_static(b"xyz"), Bytes::from_static(b"uv")]
        );
        assert_eq!(&rest[..], b"rest");
    }

    /// Lengths past the end are a codec error.
    #[test]
    fn overrunning_lengths_are_refused() {
        for lengths in [vec![u64::MAX, 2], vec![4], vec![1, 9_000], vec![9_000]] {
            let mut state = Vec::new();
            postcard_append("m", &mut state).expect("encodes");
            postcard_append(&(SHARED_SEGMENT_MIN as u64), &mut state).expect("encodes");
            postcard_append(&lengths, &mut state).expect("encodes");
            state.extend_from_slice(b"abc");
            let got = take_with_blobs::<String>(&Bytes::from(state));
            assert!(
                matches!(got, Err(crate::Error::Codec { .. })),
                "{lengths:?}: {got:?}"
            );
        }
    }
}
