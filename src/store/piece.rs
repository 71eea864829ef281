//! The bytes of a checkpoint piece, and how a piece is written.
//!
//! A piece is the concatenation of segments ([`Segments`]): the head the
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

use bytes::Bytes;

use super::pool::BufferPool;
use crate::segments::Segments;

/// Payloads of at least this many bytes are shared by a piece; smaller ones
/// are copied into its head (a segment costs a reference count, a CRC call
/// and a write of its own, which is more than copying a few hundred bytes).
/// A piece records the threshold it was written with.
pub const SHARED_SEGMENT_MIN: usize = 4096;

/// A checkpoint piece being written: a buffer to serialize into, and
/// payloads shared after it (see the module docs).
#[derive(Debug)]
pub struct PieceWriter<'p> {
    pool: &'p BufferPool,
    head: Vec<u8>,
    done: Segments,
}

impl<'p> PieceWriter<'p> {
    /// A writer that starts with `head` (usually a buffer of `pool`); the
    /// buffers it fills are frozen through `pool`, so their memory returns
    /// to it when the piece is dropped.
    pub fn new(pool: &'p BufferPool, head: Vec<u8>) -> Self {
        PieceWriter {
            pool,
            head,
            done: Segments::default(),
        }
    }

    /// The buffer the next bytes go to, for serializers that append.
    pub fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.head
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.done.len() + self.head.len()
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
    pub fn finish(mut self) -> Segments {
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
        self.done.push(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(d, Segments::from(want));
    }
}
