//! The bytes of a checkpoint piece, and how a piece is written.
//!
//! A piece is the concatenation of segments ([`PieceData`]): the head the
//! engine serializes (application state, engine snapshot, a protocol's
//! metadata), then, under message logging, the payloads of the sender log.
//! Those payloads are the very buffers the log holds (`Bytes` are
//! immutable), so a checkpoint shares them instead of copying them
//! (DESIGN principle 4: payloads are never copied to be logged; and the
//! copy of a log of megabytes into every piece was the logging protocols'
//! largest failure-free cost, measured in `lazarus bench cg --class W`).
//! Small payloads are copied into the head, together
//! ([`crate::engine::frame::append_with_blobs`]).
//! A partner on the threads backend keeps the same memory; the processes
//! backend writes each segment to the wire in turn; a piece that arrives
//! from another process or from disk is one segment.

use std::fmt;
use std::ops::Range;

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::pool::BufferPool;

/// Payloads of at least this many bytes are shared by a piece; smaller ones
/// are copied into its head (a segment costs a reference count, a CRC call
/// and a write of its own, which is more than copying a few hundred bytes).
/// A piece records the threshold it was written with.
pub const SHARED_SEGMENT_MIN: usize = 4096;

/// The bytes of a checkpoint piece: the concatenation of its segments.
#[derive(Clone, Default)]
pub struct PieceData {
    segments: Vec<Bytes>,
    len: usize,
}

impl PieceData {
    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the piece has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segments, in order (none of them empty).
    pub fn segments(&self) -> &[Bytes] {
        &self.segments
    }

    /// CRC32C of the bytes.
    pub fn crc32c(&self) -> u32 {
        (self.segments.iter()).fold(0, |crc, s| crc32c::crc32c_append(crc, s))
    }

    /// The bytes in one buffer: shared when the piece is one segment, a
    /// copy otherwise (what a restore parses, once).
    pub fn to_bytes(&self) -> Bytes {
        match self.segments.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            _ => Bytes::from(self.to_vec()),
        }
    }

    /// The bytes copied into a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for s in &self.segments {
            v.extend_from_slice(s);
        }
        v
    }

    /// Bytes `range` of the piece: shared when they lie in one segment, a
    /// copy otherwise.
    ///
    /// # Panics
    /// When `range` is out of bounds or decreasing, as slicing does.
    pub fn slice(&self, range: Range<usize>) -> Bytes {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "range {range:?} of a piece of {} bytes",
            self.len
        );
        let mut out = Vec::new();
        let mut at = 0;
        for s in &self.segments {
            let (lo, hi) = (at, at + s.len());
            at = hi;
            if hi <= range.start {
                continue;
            }
            if lo >= range.end {
                break;
            }
            let part = (range.start.max(lo) - lo)..(range.end.min(hi) - lo);
            if part.len() == range.len() {
                return s.slice(part);
            }
            out.extend_from_slice(&s[part]);
        }
        Bytes::from(out)
    }

    /// The bytes, one by one.
    fn bytes(&self) -> impl Iterator<Item = &u8> {
        self.segments.iter().flat_map(|s| s.iter())
    }

    /// Where each segment's bytes are in memory, to tell whether a piece
    /// still holds the very buffers a checksum was computed over.
    pub(crate) fn fingerprint(&self) -> Vec<(usize, usize)> {
        (self.segments.iter())
            .map(|s| (s.as_ptr() as usize, s.len()))
            .collect()
    }
}

impl From<Bytes> for PieceData {
    fn from(b: Bytes) -> Self {
        let len = b.len();
        let segments = if b.is_empty() { Vec::new() } else { vec![b] };
        PieceData { segments, len }
    }
}

impl From<Vec<u8>> for PieceData {
    fn from(v: Vec<u8>) -> Self {
        Bytes::from(v).into()
    }
}

/// Equal bytes, wherever the segments are cut.
impl PartialEq for PieceData {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.bytes().eq(other.bytes())
    }
}

impl Eq for PieceData {}

impl fmt::Debug for PieceData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PieceData({} bytes in {} segments)",
            self.len,
            self.segments.len()
        )
    }
}

/// Encoded as one byte string (the wire and disk formats carry a piece's
/// bytes after their headers, as they are, not through this).
impl Serialize for PieceData {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.to_bytes())
    }
}

impl<'de> Deserialize<'de> for PieceData {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Bytes::deserialize(d).map(Into::into)
    }
}

/// A checkpoint piece being written: a buffer to serialize into, and
/// payloads shared after it (see the module docs).
#[derive(Debug)]
pub struct PieceWriter<'p> {
    pool: &'p BufferPool,
    head: Vec<u8>,
    done: PieceData,
}

impl<'p> PieceWriter<'p> {
    /// A writer that starts with `head` (usually a buffer of `pool`); the
    /// buffers it fills are frozen through `pool`, so their memory returns
    /// to it when the piece is dropped.
    pub fn new(pool: &'p BufferPool, head: Vec<u8>) -> Self {
        PieceWriter {
            pool,
            head,
            done: PieceData::default(),
        }
    }

    /// The buffer the next bytes go to, for serializers that append.
    pub fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.head
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.done.len + self.head.len()
    }

    /// Whether nothing is written yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Append `payload`'s bytes as a segment of their own: shared, not
    /// copied. What is written after it goes to a new buffer.
    pub fn share(&mut self, payload: &Bytes) {
        if payload.is_empty() {
            return;
        }
        self.close_head();
        self.push(payload.clone());
    }

    /// The piece written.
    pub fn finish(mut self) -> PieceData {
        self.close_head();
        self.done
    }

    fn close_head(&mut self) {
        if !self.head.is_empty() {
            let head = std::mem::take(&mut self.head);
            let frozen = self.pool.freeze(head);
            self.push(frozen);
        }
    }

    fn push(&mut self, b: Bytes) {
        self.done.len += b.len();
        self.done.segments.push(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(parts: &[&[u8]]) -> PieceData {
        let pool = BufferPool::new();
        let mut w = PieceWriter::new(&pool, Vec::new());
        for p in parts {
            // A boundary even between small parts: segments of any cut.
            w.share(&Bytes::copy_from_slice(p));
        }
        w.finish()
    }

    #[test]
    fn shared_payloads_are_segments_and_the_rest_is_copied() {
        let pool = BufferPool::new();
        let big = Bytes::from(vec![7u8; SHARED_SEGMENT_MIN]);
        let small = Bytes::from(vec![8u8; SHARED_SEGMENT_MIN - 1]);
        let mut w = PieceWriter::new(&pool, b"head".to_vec());
        w.buf().extend_from_slice(&small);
        w.share(&big);
        w.share(&Bytes::new());
        w.buf().extend_from_slice(b"tail");
        assert_eq!(w.len(), 4 + small.len() + big.len() + 4);
        let d = w.finish();
        assert_eq!(d.segments().len(), 3);
        assert_eq!(d.segments()[0].len(), 4 + small.len());
        // The very buffer, not a copy.
        assert_eq!(d.segments()[1].as_ptr(), big.as_ptr());
        let mut want = b"head".to_vec();
        want.extend_from_slice(&small);
        want.extend_from_slice(&big);
        want.extend_from_slice(b"tail");
        assert_eq!(d.to_vec(), want);
        assert_eq!(d.crc32c(), crc32c::crc32c(&want));
        assert_eq!(d, PieceData::from(want));
    }

    #[test]
    fn slices_across_and_within_segments() {
        let a = vec![1u8; SHARED_SEGMENT_MIN];
        let d = rope(&[b"abc", &a, b"de", b"f"]);
        let flat = d.to_vec();
        assert_eq!(d.segments().len(), 4);
        for start in [0, 1, 3, 4, 100, flat.len() - 3, flat.len()] {
            for end in [start, start + 1, start + 2, flat.len()] {
                if end <= flat.len() {
                    assert_eq!(
                        &d.slice(start..end)[..],
                        &flat[start..end],
                        "{start}..{end}"
                    );
                }
            }
        }
        // Within the shared segment: a slice of it, not a copy.
        assert_eq!(d.slice(5..9).as_ptr(), d.segments()[1][2..].as_ptr());
    }

    #[test]
    fn equality_ignores_where_segments_are_cut() {
        let x = rope(&[b"ab", b"cde"]);
        let y = rope(&[b"abc", b"de"]);
        assert_eq!(x, y);
        assert_ne!(x, rope(&[b"abc", b"dd"]));
        assert_ne!(x, rope(&[b"abc", b"d"]));
        assert_ne!(rope(&[b"abc", b"d"]), x);
        assert_eq!(PieceData::default(), PieceData::from(Vec::new()));
        assert!(PieceData::from(Bytes::new()).segments().is_empty());
    }

    #[test]
    fn serializes_as_one_byte_string() {
        let d = rope(&[b"ab", b"cde"]);
        let enc = postcard::to_allocvec(&d).expect("encodes");
        assert_eq!(
            enc,
            postcard::to_allocvec(&Bytes::from_static(b"abcde")).expect("encodes")
        );
        let back: PieceData = postcard::from_bytes(&enc).expect("decodes");
        assert_eq!(back, d);
        assert_eq!(back.segments().len(), 1);
    }
}
