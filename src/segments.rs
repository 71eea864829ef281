//! Bytes held as the concatenation of shared buffers ([`Segments`]).
//!
//! Two things the runtime keeps are made of buffers that already exist
//! elsewhere, and copying them into one would cost memory the program's
//! critical path pays for (fresh pages the kernel zeroes):
//! - a checkpoint piece ([`crate::store::PieceWriter`]): its serialized
//!   head, then the payloads of the sender log, the very buffers the log
//!   holds (DESIGN principle 4);
//! - a collective result logged by ULML (002 §2.2): an all-gather's result
//!   is the blocks the members sent, each one the buffer its sender made
//!   ([`crate::api::comm::Communicator::all_gather_varcount`]).

use std::fmt;
use std::ops::Range;

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes held as the concatenation of shared segments.
#[derive(Clone, Default)]
pub struct Segments {
    segments: Vec<Bytes>,
    len: usize,
}

impl Segments {
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

    /// The bytes in one buffer: shared when they are one segment, a copy
    /// otherwise (what a restore parses, once).
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

    /// Bytes `range`: shared when they lie in one segment, a
    /// copy otherwise.
    ///
    /// # Panics
    /// When `range` is out of bounds or decreasing, as slicing does.
    pub fn slice(&self, range: Range<usize>) -> Bytes {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "range {range:?} of {} bytes",
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

    /// Append `b` as the last segment (nothing if it is empty).
    pub fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.len += b.len();
            self.segments.push(b);
        }
    }

    /// Copy the bytes from offset `from` on into `dst`, which they must
    /// fill: `dst.len()` bytes.
    ///
    /// # Panics
    /// When fewer than `from + dst.len()` bytes are held, as slicing does.
    pub fn copy_to_slice(&self, from: usize, dst: &mut [u8]) {
        assert!(
            from.checked_add(dst.len())
                .is_some_and(|end| end <= self.len),
            "{} bytes from {from} of {} bytes",
            dst.len(),
            self.len
        );
        let (mut at, mut done) = (0, 0);
        for s in &self.segments {
            if done == dst.len() {
                break;
            }
            let hi = at + s.len();
            if hi > from + done {
                let lo = from + done - at;
                let n = (s.len() - lo).min(dst.len() - done);
                dst[done..done + n].copy_from_slice(&s[lo..lo + n]);
                done += n;
            }
            at = hi;
        }
    }

    /// The bytes, one by one.
    fn bytes(&self) -> impl Iterator<Item = &u8> {
        self.segments.iter().flat_map(|s| s.iter())
    }

    /// Where each segment's bytes are in memory, to tell whether they are
    /// still the very buffers a checksum was computed over.
    pub(crate) fn fingerprint(&self) -> Vec<(usize, usize)> {
        (self.segments.iter())
            .map(|s| (s.as_ptr() as usize, s.len()))
            .collect()
    }
}

impl From<Bytes> for Segments {
    fn from(b: Bytes) -> Self {
        let len = b.len();
        let segments = if b.is_empty() { Vec::new() } else { vec![b] };
        Segments { segments, len }
    }
}

/// The concatenation of the buffers, in order (empty ones are left out).
impl FromIterator<Bytes> for Segments {
    fn from_iter<I: IntoIterator<Item = Bytes>>(iter: I) -> Self {
        let mut s = Segments::default();
        for b in iter {
            s.push(b);
        }
        s
    }
}

impl From<Vec<u8>> for Segments {
    fn from(v: Vec<u8>) -> Self {
        Bytes::from(v).into()
    }
}

/// Equal bytes, wherever the segments are cut.
impl PartialEq for Segments {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.bytes().eq(other.bytes())
    }
}

impl Eq for Segments {}

impl fmt::Debug for Segments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Segments({} bytes in {} segments)",
            self.len,
            self.segments.len()
        )
    }
}

/// Encoded as one byte string (the wire and disk formats carry a piece's
/// bytes after their headers, as they are, not through this; a collective
/// result in a control message is a copy, made only during recovery).
impl Serialize for Segments {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.to_bytes())
    }
}

impl<'de> Deserialize<'de> for Segments {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Bytes::deserialize(d).map(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(parts: &[&[u8]]) -> Segments {
        // A boundary even between small parts: segments of any cut.
        parts.iter().map(|p| Bytes::copy_from_slice(p)).collect()
    }

    #[test]
    fn slices_across_and_within_segments() {
        let a = vec![1u8; 4096];
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
        assert_eq!(Segments::default(), Segments::from(Vec::new()));
        assert!(Segments::from(Bytes::new()).segments().is_empty());
    }

    #[test]
    fn serializes_as_one_byte_string() {
        let d = rope(&[b"ab", b"cde"]);
        let enc = postcard::to_allocvec(&d).expect("encodes");
        assert_eq!(
            enc,
            postcard::to_allocvec(&Bytes::from_static(b"abcde")).expect("encodes")
        );
        let back: Segments = postcard::from_bytes(&enc).expect("decodes");
        assert_eq!(back, d);
        assert_eq!(back.segments().len(), 1);
    }

    #[test]
    fn copies_any_range_across_segments() {
        let d = rope(&[b"abc", b"", b"de", b"fghij"]);
        assert_eq!(d.segments().len(), 3);
        let flat = d.to_vec();
        for from in 0..=flat.len() {
            for n in 0..=flat.len() - from {
                let mut dst = vec![0u8; n];
                d.copy_to_slice(from, &mut dst);
                assert_eq!(dst, &flat[from..from + n], "{from}+{n}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "3 bytes from 8 of 10 bytes")]
    fn copying_past_the_end_panics() {
        rope(&[b"abcde", b"fghij"]).copy_to_slice(8, &mut [0u8; 3]);
    }
}
