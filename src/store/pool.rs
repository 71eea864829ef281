//! Recycled buffers for checkpoint pieces and parity shards.
//!
//! A checkpoint is written into memory the process has not touched since
//! the previous one was dropped. Memory fresh from the kernel costs a page
//! fault and a zeroing per 4 KiB page on its first touch: measured here at
//! 1.3–1.5 GB/s against 12–14 GB/s for a copy into memory already mapped
//! (`memcpy` of 256 MiB). glibc returns every block over 32 MiB to the
//! kernel when it is freed and maps a fresh one for the next allocation, so
//! a rank with a 1 GB piece paid that first touch at every checkpoint.
//!
//! A [`BufferPool`] keeps the buffers of dropped pieces and shards and hands
//! them out again; a request larger than every idle buffer grows the
//! largest one of [`GROWABLE_MIN`] or more (glibc moves such a mapping
//! with `mremap`, keeping its pages), so a log that keeps growing does not
//! make every piece fresh memory. A buffer goes back to its pool when the
//! last reference to it is dropped (the rank's own store, the partner's
//! copy on the threads backend, a frame being written), wherever that
//! happens. Ring readers of the processes backend keep one too: a piece
//! arriving for a partner is read into the buffer of the copy it replaces.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;

/// Buffers under this capacity are not kept: the allocator's free lists
/// already recycle them without a page fault.
pub const POOLED_MIN: usize = 1 << 20;

/// Idle buffers at least this large are grown for a larger request
/// ([`BufferPool::take_growable`]). glibc maps a block on its own from its
/// `mmap_threshold` up (at most 32 MiB by default) and grows such a mapping
/// with `mremap`, keeping its pages. Rank processes raise the threshold to
/// 64 MiB (`worker::keep_freed_memory`): there a block of 32–64 MiB lives
/// in the heap, where `realloc` extends it in place or moves it with a copy,
/// usually into memory the heap already holds (it keeps freed memory).
/// Measured on the ping-pong under `pessimistic` (5 alternating pairs),
/// 64 MiB here instead gave 0.94 s per rank in checkpoints against 0.66 s.
pub const GROWABLE_MIN: usize = 32 << 20;

/// At most this many idle buffers per pool (a rank needs one for the piece
/// being written while the previous generation's is still held, plus a few
/// parity shards).
pub const POOLED_MAX: usize = 4;

type Idle = Mutex<Vec<Vec<u8>>>;

/// A pool of large byte buffers (see the module docs). Clones share the
/// pool.
#[derive(Debug, Clone, Default)]
pub struct BufferPool {
    idle: Arc<Idle>,
}

impl BufferPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty buffer with room for at least `capacity` bytes: the
    /// smallest idle one that is large enough (and at most twice that),
    /// else the largest idle one that can grow in place of a new one
    /// ([`BufferPool::take_growable`]), grown; else a new one.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        match self.take_growable(capacity) {
            Some(mut b) => {
                b.reserve_exact(capacity);
                b
            }
            None => Vec::with_capacity(capacity),
        }
    }

    /// As [`BufferPool::take_idle`]; when no idle buffer is large enough,
    /// the largest one of at least [`GROWABLE_MIN`] bytes, for the caller
    /// to grow (never allocates). A block that large is a mapping of its
    /// own in glibc, which grows it with `mremap`: the pages it has keep
    /// their place and are neither copied nor faulted and zeroed again, so
    /// only the growth is fresh memory. (A log that keeps growing makes
    /// every checkpoint piece larger than any before it: a CG-like
    /// steady state finds a buffer that fits.)
    pub fn take_growable(&self, capacity: usize) -> Option<Vec<u8>> {
        if let Some(b) = self.take_idle(capacity) {
            return Some(b);
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let largest = (idle.iter().enumerate())
            .filter(|(_, b)| (GROWABLE_MIN..capacity).contains(&b.capacity()))
            .max_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i)?;
        Some(idle.swap_remove(largest))
    }

    /// The smallest idle buffer with room for `capacity` bytes and at most
    /// twice that, if there is one (emptied); never allocates. (A buffer
    /// much larger than asked for would be held for as long as its small
    /// contents: a 4 MiB message kept in a log must not pin the previous
    /// piece's 300 MiB.) For a reader that must not reserve
    /// what a peer merely announces: it grows a fresh buffer only as bytes
    /// arrive, but memory already held costs nothing to reuse.
    pub fn take_idle(&self, capacity: usize) -> Option<Vec<u8>> {
        if capacity < POOLED_MIN {
            return None;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let fit = (idle.iter().enumerate())
            .filter(|(_, b)| (capacity..=capacity.saturating_mul(2)).contains(&b.capacity()))
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i)?;
        Some(idle.swap_remove(fit))
    }

    /// `buf` as shared bytes; its memory comes back to this pool when the
    /// last reference is dropped (if it is large enough to keep).
    pub fn freeze(&self, buf: Vec<u8>) -> Bytes {
        if buf.capacity() < POOLED_MIN {
            return Bytes::from(buf);
        }
        Bytes::from_owner(Pooled {
            buf,
            home: Arc::downgrade(&self.idle),
        })
    }

    /// Idle buffers held (for tests and statistics).
    pub fn idle(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A buffer on loan from a pool, as the owner of a [`Bytes`].
struct Pooled {
    buf: Vec<u8>,
    home: Weak<Idle>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(idle) = self.home.upgrade() else {
            return; // the pool is gone: the memory goes back to the allocator
        };
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let mut idle = idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < POOLED_MAX {
            idle.push(buf);
        } else if let Some(smallest) = idle.iter_mut().min_by_key(|b| b.capacity()) {
            // Keep the larger buffers: a small one can stand in for no
            // large request, a large one for every small one.
            if smallest.capacity() < buf.capacity() {
                *smallest = buf;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_is_handed_out_again() {
        let pool = BufferPool::new();
        let mut v = pool.take(2 * POOLED_MIN);
        v.resize(2 * POOLED_MIN, 7);
        let addr = v.as_ptr() as usize;
        let b = pool.freeze(v);
        let shared = b.slice(10..20);
        drop(b);
        assert_eq!(pool.idle(), 0, "a slice still refers to it");
        assert_eq!(&shared[..], &[7; 10]);
        drop(shared);
        assert_eq!(pool.idle(), 1);
        let again = pool.take(POOLED_MIN + 1);
        assert_eq!(again.as_ptr() as usize, addr, "the same memory");
        assert!(again.is_empty());
        assert_eq!(pool.idle(), 0);
        assert!(
            pool.take_idle(POOLED_MIN).is_none(),
            "take_idle never allocates"
        );
    }

    #[test]
    fn small_buffers_too_small_idle_ones_and_a_full_pool() {
        let pool = BufferPool::new();
        drop(pool.freeze(vec![1; 100]));
        assert_eq!(pool.idle(), 0, "small buffers are left to the allocator");
        drop(pool.freeze(Vec::with_capacity(POOLED_MIN)));
        let big = pool.take(4 * POOLED_MIN);
        assert!(big.capacity() >= 4 * POOLED_MIN);
        assert_eq!(pool.idle(), 1, "the idle buffer is too small for it");
        drop(pool.freeze(big));
        assert_eq!(pool.idle(), 2);
        assert!(
            pool.take_idle(POOLED_MIN + 1).is_none(),
            "4 MiB is too large to lend for 1 MiB + 1"
        );
        for i in 0..=POOLED_MAX {
            drop(pool.freeze(Vec::with_capacity((2 + i) * POOLED_MIN)));
        }
        assert_eq!(pool.idle(), POOLED_MAX);
        // The smallest ones (1, 2 and 3 MiB) were given up.
        assert!(pool.take_idle(POOLED_MIN).is_none());
        assert_eq!(
            pool.take_idle(2 * POOLED_MIN).map(|b| b.capacity()),
            Some(4 * POOLED_MIN)
        );
    }

    #[test]
    fn a_larger_request_grows_the_largest_idle_mapping_below_it() {
        let pool = BufferPool::new();
        // Address space only: none of these is touched.
        for cap in [POOLED_MIN, GROWABLE_MIN, 2 * GROWABLE_MIN] {
            drop(pool.freeze(Vec::with_capacity(cap)));
        }
        assert_eq!(pool.idle(), 3);
        // Nothing fits 5 × 32 MiB: the 64 MiB one is lent, to be grown.
        let lent = pool.take_growable(5 * GROWABLE_MIN).map(|b| b.capacity());
        assert_eq!(lent, Some(2 * GROWABLE_MIN));
        assert_eq!(pool.idle(), 2);
        // `take` grows the 32 MiB one; the 1 MiB one is too small to be
        // worth growing.
        let grown = pool.take(3 * GROWABLE_MIN);
        assert!(grown.capacity() >= 3 * GROWABLE_MIN && grown.is_empty());
        assert_eq!(pool.idle(), 1);
        assert!(pool.take_growable(2 * POOLED_MIN).is_none());
        assert_eq!(pool.idle(), 1, "the 1 MiB buffer stays");
        // One that fits is still preferred to one to grow.
        drop(pool.freeze(grown));
        drop(pool.freeze(Vec::with_capacity(GROWABLE_MIN)));
        let fit = pool.take_growable(GROWABLE_MIN).map(|b| b.capacity());
        assert_eq!(fit, Some(GROWABLE_MIN));
    }

    #[test]
    fn a_buffer_outliving_its_pool_is_freed() {
        let pool = BufferPool::new();
        let b = pool.freeze(vec![3; POOLED_MIN]);
        let b2 = b.clone();
        drop(pool);
        drop(b);
        assert_eq!(b2.len(), POOLED_MIN);
    }
}
