//! Shared-memory rings: the fast path between rank processes on one host.
//!
//! A ring carries the frames of one channel (sender rank and incarnation →
//! receiver rank and incarnation) in the wire format of [`super::wire`]. It
//! is a single-producer single-consumer byte ring in a file of the job's
//! shared-memory directory (`/dev/shm/lazarus-JOB`, mode 0700), mapped by
//! both processes:
//!
//! ```text
//! | magic | capacity | sender pid | sender's address of the ring | … | head (written by the sender) | … | tail, remote ok (by the receiver) | … | sleeping | … | data: capacity bytes |
//! ```
//!
//! The sender creates the ring at its first frame to a peer on the same
//! host, announces it on its authenticated socket connection (so frames sent
//! before it keep their place), and from then on writes every frame of that
//! channel into the ring. The receiver maps it when the announcement is read,
//! unlinks the file (nothing is left behind once both ends hold it), and
//! polls it from the rank's own thread: no system call and no thread
//! hand-off per frame. A receiver about to block sets `sleeping`; a sender
//! that finds it set after publishing rings a doorbell on the socket.
//!
//! A frame with detached parts of [`REMOTE_MIN`] bytes or more in all (a
//! checkpoint piece: its head and the log payloads it shares) crosses the
//! same way, as a remote frame record: the frame's own bytes and the
//! address and length of each part. The receiver copies the parts after
//! the frame's bytes into one buffer, so the frame decodes as if it had
//! crossed whole. A piece of megabytes then costs its sender no wait for a
//! receiver busy computing (the ring is not filled), and one copy.
//!
//! Nothing the peer writes can make the reader go out of bounds: positions
//! are masked into the data area, a record's length is checked against the
//! frame limit, and a record's buffer grows as its bytes arrive (as a
//! socket's reader does), not to the announced length at once.
//!
//! An application frame is read in two parts: its fixed fields onto the
//! stack and its payload into a buffer that ends at exactly the payload's
//! size, which becomes the message's `Bytes` as it is (one allocation per
//! message up to a megabyte, no copy besides the one out of the ring).
//!
//! A payload of [`REMOTE_MIN`] bytes or more does not cross the ring: the
//! sender writes a remote record (the frame's fixed fields, the payload's
//! address and length) and keeps the payload; the receiver copies it out
//! of the sender's memory with `process_vm_readv` before it consumes the
//! record, and the sender lets the payload go once the receiver's tail has
//! passed it. That is one copy where the ring takes two (ping-pong at
//! 1 MiB: 113 -> 71 us one-way). The receiver allows it only if it could
//! read the sender's memory when it attached (the header gives the
//! sender's process id and where the ring's magic number is in its
//! memory), and only from the process at the other end of the socket that
//! announced the ring (`SO_PEERCRED`); without that (ptrace restricted,
//! another PID namespace, a header naming another process), payloads
//! cross the ring.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use bytes::Bytes;

use crate::store::pool::BufferPool;

use super::wire::{
    APP_FIXED, APP_FRAME, APP_HEAD, APP_REMOTE, FRAME_REMOTE, LONG_LEN, LONG_PREFIX, WireError,
    WireMsg, decode, decode_app_parts, growth, long_len,
};

/// Records up to this size get their whole receive buffer when their first
/// bytes are read; larger ones grow with what has arrived.
const EAGER_RESERVE: usize = 64 << 20;

/// Application frames up to this size (fixed fields and payload) are read
/// by the small-record path of [`RingReader::pull`]: whole, and into a
/// buffer of their own (too small for the pool to keep).
const SMALL_APP: usize = 1024;

/// Application payloads of at least this many bytes cross a ring whose
/// receiver can read the sender's memory (cross-memory attach,
/// `process_vm_readv`) as a small record naming where the payload is; the
/// receiver copies it straight into its buffer: one copy instead of two
/// (into the ring and out of it), as MPICH does on one host.
pub const REMOTE_MIN: usize = 64 << 10;

/// Payload bytes a ring's sender keeps for its receiver to copy at most;
/// beyond them, payloads go through the ring.
const REMOTE_IN_FLIGHT: usize = 64 << 20;

/// Bytes of a remote record after its length prefix: the fixed fields of
/// an application frame (marker `APP_REMOTE`), the payload's address and
/// its length.
const REMOTE_BODY: usize = APP_FIXED + 16;

/// Data bytes of a ring at most (a power of two): a 1 MiB frame fits whole.
pub const CAPACITY: usize = 2 << 20;

/// Data bytes of a ring at least.
pub const MIN_CAPACITY: usize = 64 << 10;

/// Shared memory a rank receives into from all its peers at most, when
/// rings would otherwise take `CAPACITY` each: P ranks on one host make up
/// to P(P−1) rings.
const RECEIVE_BUDGET: usize = 32 << 20;

/// Ring capacity in a job of `ranks` ranks: `CAPACITY` for up to 17 ranks,
/// then smaller (a power of two, at least `MIN_CAPACITY`) so that a rank's
/// incoming rings stay within `RECEIVE_BUDGET`. A frame larger than its
/// ring still crosses it, in pieces.
pub fn capacity_for(ranks: usize) -> usize {
    let share = RECEIVE_BUDGET / ranks.saturating_sub(1).max(1);
    let pow2 = if share.is_power_of_two() {
        share
    } else {
        share.next_power_of_two() / 2
    };
    pow2.clamp(MIN_CAPACITY, CAPACITY)
}

fn valid_capacity(c: usize) -> bool {
    c.is_power_of_two() && (MIN_CAPACITY..=CAPACITY).contains(&c)
}

/// Bytes before the data area.
const HEADER: usize = MAPPED_HEADER;

/// Bytes every mapping has at least (a ring's or a window's header), where
/// the shared words live.
pub(super) const MAPPED_HEADER: usize = 256;
const MAGIC: u64 = 0x4c41_5a52_494e_4702; // "LAZRING", version 2 (remote frames)

/// Bytes of a remote frame record before its list of parts: the marker
/// and the number of parts.
const REMOTE_FRAME_HEAD: usize = 1 + 4;

/// Bytes a remote frame record takes per part: its address and length.
const REMOTE_PART: usize = 16;
const OFF_MAGIC: usize = 0;
const OFF_CAPACITY: usize = 8;
/// The sender's process id, and the address of the ring's first byte in
/// its memory (where `MAGIC` is), for the receiver to try reading it.
const OFF_SENDER_PID: usize = 16;
const OFF_SENDER_BASE: usize = 24;
/// Head, tail and the sleeping flag sit on their own cache lines.
const OFF_HEAD: usize = 64;
const OFF_TAIL: usize = 128;
/// Set by the receiver once it could read the sender's memory: the sender
/// may then send remote records.
const OFF_REMOTE_OK: usize = 136;
/// Set by the receiver when it lets go of the ring (its process ends or
/// it closes the ring): nothing kept for it needs keeping any longer.
const OFF_READER_GONE: usize = 144;
const OFF_SLEEPING: usize = 192;

/// Why a ring could not be made or attached.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// The file could not be created, opened, sized or mapped.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was attempted.
        what: &'static str,
        /// The ring's file.
        path: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// The file is not a ring of this version, or its name is not a plain
    /// file name of the job's directory.
    #[error("not a ring: {0}")]
    Invalid(String),
}

/// A shared mapping of one file (a ring's, or a window's:
/// [`super::shm_window`]).
pub(super) struct Mapping {
    base: *mut u8,
    len: usize,
    capacity: usize,
}

// SAFETY: the mapping is plain shared memory; every access to the shared
// words goes through atomics, and the data area is written only by the one
// sender and read only by the one receiver between the published positions.
#[allow(unsafe_code)]
unsafe impl Send for Mapping {}

#[allow(unsafe_code)]
impl Mapping {
    pub(super) fn map(file: &File, len: usize, path: &Path) -> Result<Mapping, ShmError> {
        if len < MAPPED_HEADER {
            return Err(ShmError::Invalid(format!(
                "{} bytes to map from {}: less than a header",
                len,
                path.display()
            )));
        }
        // SAFETY: a fresh shared mapping of a file we hold open; the
        // pointer is checked against MAP_FAILED before use.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(file),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(ShmError::Io {
                what: "cannot map",
                path: path.display().to_string(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Mapping {
            base: base.cast(),
            len,
            capacity: len.saturating_sub(HEADER),
        })
    }

    /// The first byte of the mapping (page-aligned), valid as long as
    /// `self` lives.
    pub(super) fn base(&self) -> *mut u8 {
        self.base
    }

    /// Bytes mapped.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The shared u64 at header offset `off` (8-aligned, inside the first
    /// [`MAPPED_HEADER`] bytes, which every mapping has: callers pass
    /// constants, so the check costs nothing).
    pub(super) fn word64(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= MAPPED_HEADER,
            "word64 at {off}"
        );
        // SAFETY: `off` is 8-aligned and inside the mapping (which is
        // page-aligned and at least `MAPPED_HEADER` long), and the mapping
        // lives as long as `self`.
        unsafe { &*self.base.add(off).cast::<AtomicU64>() }
    }

    /// The shared u32 at header offset `off` (as [`Mapping::word64`],
    /// 4-aligned).
    pub(super) fn word32(&self, off: usize) -> &AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off + 4 <= MAPPED_HEADER,
            "word32 at {off}"
        );
        // SAFETY: as for `word64`, 4-aligned.
        unsafe { &*self.base.add(off).cast::<AtomicU32>() }
    }

    fn sleeping(&self) -> &AtomicU32 {
        self.word32(OFF_SLEEPING)
    }

    /// Copy `src` into the data area at ring position `pos` (wrapping).
    fn write_at(&self, pos: u64, src: &[u8]) {
        let cap = self.capacity;
        let start = (pos as usize) & (cap - 1);
        let first = src.len().min(cap - start);
        // SAFETY: both ranges lie inside the data area (start < cap,
        // first <= cap - start, src.len() - first <= start); the receiver
        // does not read them until the head is published.
        unsafe {
            let data = self.base.add(HEADER);
            std::ptr::copy_nonoverlapping(src.as_ptr(), data.add(start), first);
            // Only a write across the end wraps: no second (empty) copy call
            // on the latency path otherwise.
            if first < src.len() {
                std::ptr::copy_nonoverlapping(src.as_ptr().add(first), data, src.len() - first);
            }
        }
    }

    /// Fill `dst` from the data area at ring position `pos` (wrapping).
    fn copy_out(&self, pos: u64, dst: &mut [u8]) {
        let cap = self.capacity;
        let start = (pos as usize) & (cap - 1);
        let n = dst.len();
        let first = n.min(cap - start);
        // SAFETY: as in `read_at`: both source ranges lie inside the data
        // area and are not written until the tail is published past them.
        unsafe {
            let data = self.base.add(HEADER);
            std::ptr::copy_nonoverlapping(data.add(start), dst.as_mut_ptr(), first);
            if first < n {
                std::ptr::copy_nonoverlapping(data, dst.as_mut_ptr().add(first), n - first);
            }
        }
    }

    /// Append `n` bytes from the data area at ring position `pos`
    /// (wrapping) to `dst`.
    fn read_at(&self, pos: u64, n: usize, dst: &mut Vec<u8>) {
        let cap = self.capacity;
        let start = (pos as usize) & (cap - 1);
        let first = n.min(cap - start);
        // SAFETY: both ranges lie inside the data area (as in `write_at`),
        // and the sender does not write them until the tail is published
        // past them, so nothing changes under these slices.
        unsafe {
            let data = self.base.add(HEADER);
            dst.extend_from_slice(std::slice::from_raw_parts(data.add(start), first));
            if first < n {
                dst.extend_from_slice(std::slice::from_raw_parts(data, n - first));
            }
        }
    }
}

#[allow(unsafe_code)]
impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped, once.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// Append `n` bytes at address `addr` of process `pid` to `dst`
/// (`process_vm_readv`: one copy, from that process's pages into `dst`).
/// An address the process has not mapped is an error (`EFAULT`), as is a
/// process gone (`ESRCH`) or one this process may not read (`EPERM`).
#[allow(unsafe_code)]
fn read_remote(pid: libc::pid_t, addr: u64, n: usize, dst: &mut Vec<u8>) -> std::io::Result<()> {
    dst.reserve_exact(n);
    let mut done = 0;
    while done < n {
        let spare = &mut dst.spare_capacity_mut()[..n - done];
        let local = libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: spare.len(),
        };
        let remote = libc::iovec {
            iov_base: (addr as usize).wrapping_add(done) as *mut libc::c_void,
            iov_len: n - done,
        };
        // SAFETY: `local` is `dst`'s spare capacity (writable, `n - done`
        // bytes, not aliased); the kernel writes at most that many bytes
        // there and reports how many, and only those become part of `dst`.
        // `remote` is only read, in the other process, by the kernel.
        let got = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        match got {
            -1 => return Err(std::io::Error::last_os_error()),
            0 => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
            got => {
                let got = got as usize;
                // SAFETY: the kernel initialised `got <= n - done` bytes of
                // the spare capacity.
                unsafe { dst.set_len(dst.len() + got) };
                done += got;
            }
        }
    }
    Ok(())
}

/// The little-endian u64 at `at` of `bytes` (which holds it).
fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

/// What a failed copy of `n` bytes out of process `pid` means for the
/// ring: the sender gone (its frame is lost with it), or a bad record.
fn remote_error(e: &std::io::Error, pid: libc::pid_t, n: usize) -> WireError {
    if e.raw_os_error() == Some(libc::ESRCH) {
        WireError::SenderGone { pid, len: n }
    } else {
        WireError::Malformed(format!("cannot read {n} bytes from process {pid}: {e}"))
    }
}

/// The sending end of a ring.
pub struct RingWriter {
    map: Mapping,
    /// Bytes written so far.
    head: u64,
    /// Bytes made visible to the receiver (the shared head).
    published: u64,
    /// The receiver's tail as last seen.
    tail: u64,
    /// Payloads named by remote records the receiver may still be copying:
    /// kept until its tail passes the end of their record.
    in_flight: VecDeque<(u64, Bytes)>,
    /// Their bytes.
    in_flight_bytes: usize,
}

impl RingWriter {
    /// Create the ring file `dir/name` (mode 0600, never an existing file)
    /// with `capacity` data bytes (a power of two from `MIN_CAPACITY` to
    /// `CAPACITY`; see [`capacity_for`]), and map it.
    pub fn create(dir: &Path, name: &str, capacity: usize) -> Result<RingWriter, ShmError> {
        use std::os::unix::fs::OpenOptionsExt;
        if !valid_capacity(capacity) {
            return Err(ShmError::Invalid(format!("capacity {capacity}")));
        }
        let path = dir.join(name);
        let io = |what, source| ShmError::Io {
            what,
            path: path.display().to_string(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io("cannot create", e))?;
        let len = HEADER + capacity;
        // Allocated, not merely sized: the pages of a sparse file are found
        // missing only when first written, and a write to a page a full
        // /dev/shm cannot back kills the process with SIGBUS. Failing here
        // instead sends the frames over the socket.
        let allocated = libc::off_t::try_from(len)
            .map_err(|_| ShmError::Invalid(format!("capacity {capacity}")))
            .and_then(|l| {
                nix::fcntl::posix_fallocate(&file, 0, l)
                    .map_err(|e| io("cannot allocate", std::io::Error::from(e)))
            });
        if let Err(e) = allocated {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        let map = Mapping::map(&file, len, &path)?;
        map.word64(OFF_CAPACITY)
            .store(capacity as u64, Ordering::Relaxed);
        map.word64(OFF_SENDER_PID)
            .store(u64::from(std::process::id()), Ordering::Relaxed);
        map.word64(OFF_SENDER_BASE)
            .store(map.base() as u64, Ordering::Relaxed);
        map.word64(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok(RingWriter {
            map,
            head: 0,
            published: 0,
            tail: 0,
            in_flight: VecDeque::new(),
            in_flight_bytes: 0,
        })
    }

    /// Send an application frame whose head is `head` (from
    /// [`super::wire::app_head`]) as a remote record: `payload` stays here,
    /// kept until the receiver has copied it out of this process's memory.
    /// `false`, with nothing written, when the receiver cannot read this
    /// process's memory, too much is kept for it already, or the record
    /// does not fit now: the frame then goes through the ring.
    pub fn write_remote(&mut self, head: &[u8; APP_HEAD], payload: &Bytes) -> bool {
        self.release_copied();
        if self.map.word64(OFF_REMOTE_OK).load(Ordering::Acquire) == 0
            || self.in_flight_bytes + payload.len() > REMOTE_IN_FLIGHT
        {
            return false;
        }
        let mut record = [0u8; 4 + REMOTE_BODY];
        record[..4].copy_from_slice(&(REMOTE_BODY as u32).to_le_bytes());
        record[4..APP_HEAD].copy_from_slice(&head[4..]);
        record[4] = APP_REMOTE;
        record[APP_HEAD..APP_HEAD + 8].copy_from_slice(&(payload.as_ptr() as u64).to_le_bytes());
        record[APP_HEAD + 8..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        if !self.write_whole(&[&record]) {
            return false;
        }
        self.in_flight.push_back((self.head, payload.clone()));
        self.in_flight_bytes += payload.len();
        true
    }

    /// Send a frame whose bytes are `body` (everything after its length
    /// prefix, without its detached payload) and whose payload is `parts`
    /// as a remote frame record: the parts stay here, kept until the
    /// receiver has copied them out of this process's memory after
    /// `body`. `false`, with nothing written, as for
    /// [`RingWriter::write_remote`], or when the record would take more
    /// than a quarter of the ring (a piece of very many small parts).
    pub fn write_remote_frame(&mut self, body: &[u8], parts: &[Bytes]) -> bool {
        self.release_copied();
        let payload: usize = parts.iter().map(Bytes::len).sum();
        let len = REMOTE_FRAME_HEAD + REMOTE_PART * parts.len() + body.len();
        if self.map.word64(OFF_REMOTE_OK).load(Ordering::Acquire) == 0
            || self.in_flight_bytes + payload > REMOTE_IN_FLIGHT
            || 4 + len > self.map.capacity / 4
        {
            return false;
        }
        let Ok(count) = u32::try_from(parts.len()) else {
            return false;
        };
        let mut record = Vec::with_capacity(4 + len);
        record.extend_from_slice(&(len as u32).to_le_bytes());
        record.push(FRAME_REMOTE);
        record.extend_from_slice(&count.to_le_bytes());
        for p in parts {
            record.extend_from_slice(&(p.as_ptr() as u64).to_le_bytes());
            record.extend_from_slice(&(p.len() as u64).to_le_bytes());
        }
        record.extend_from_slice(body);
        if !self.write_whole(&[&record]) {
            return false;
        }
        for p in parts {
            self.in_flight.push_back((self.head, p.clone()));
        }
        self.in_flight_bytes += payload;
        true
    }

    /// Whether the receiver has copied every payload kept for it (or let
    /// go of the ring): until then this process must not end, or the
    /// receiver finds the payloads gone and loses the ring with the frames
    /// behind them (the finalize leader's `Exit`, for one).
    pub fn copied(&mut self) -> bool {
        self.release_copied();
        self.in_flight.is_empty() || self.map.word64(OFF_READER_GONE).load(Ordering::Acquire) != 0
    }

    /// Drop the payloads whose remote records the receiver has consumed
    /// (it copies a payload before its tail passes the record).
    fn release_copied(&mut self) {
        let Some(&(end, _)) = self.in_flight.front() else {
            return;
        };
        if end > self.tail {
            self.tail = self.map.word64(OFF_TAIL).load(Ordering::Acquire);
        }
        while let Some((end, p)) = self.in_flight.front()
            && *end <= self.tail
        {
            self.in_flight_bytes -= p.len();
            self.in_flight.pop_front();
        }
    }

    /// Copy as much of `src` as fits, not yet visible to the receiver (see
    /// [`RingWriter::publish`]); returns the bytes written (0 when the ring
    /// is full).
    pub fn write(&mut self, src: &[u8]) -> usize {
        let cap = self.map.capacity as u64;
        if self.head - self.tail == cap {
            self.tail = self.map.word64(OFF_TAIL).load(Ordering::Acquire);
        }
        let free = (cap - (self.head - self.tail)) as usize;
        let n = src.len().min(free);
        if n > 0 {
            self.map.write_at(self.head, &src[..n]);
            self.head += n as u64;
        }
        n
    }

    /// Write all of `parts` and publish them, if they fit whole (re-reading
    /// the receiver's tail if the cached one says they do not); `false`,
    /// with nothing written, if they do not.
    pub fn write_whole(&mut self, parts: &[&[u8]]) -> bool {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let cap = self.map.capacity as u64;
        if cap - (self.head - self.tail) < len {
            self.tail = self.map.word64(OFF_TAIL).load(Ordering::Acquire);
            if cap - (self.head - self.tail) < len {
                return false;
            }
        }
        for p in parts {
            self.map.write_at(self.head, p);
            self.head += p.len() as u64;
        }
        self.publish();
        true
    }

    /// Make everything written visible to the receiver; `false` if nothing
    /// new was written. A sender publishes a small frame once, whole (one
    /// store to the shared head, no half frame for the receiver to come
    /// back to), and a large one as it goes.
    pub fn publish(&mut self) -> bool {
        if self.head == self.published {
            return false;
        }
        self.published = self.head;
        // A sequentially consistent store (an `xchg` on x86), not a release
        // store: with `wake_needed`'s SeqCst load it orders the head before
        // the look at the receiver's flag without a separate fence (an
        // `mfence` cost about 10 % of a small message's round trip here).
        self.map.word64(OFF_HEAD).store(self.head, Ordering::SeqCst);
        true
    }

    /// Write and publish.
    #[cfg(test)]
    pub fn push(&mut self, src: &[u8]) -> usize {
        let n = self.write(src);
        self.publish();
        n
    }

    /// Whether the receiver went to sleep and needs a doorbell (taking the
    /// request: one doorbell per sleep).
    pub fn wake_needed(&self) -> bool {
        // Pairs with the receiver's fence in `RingReader::sleep`: the head
        // was published by a SeqCst store (`publish`), so either the
        // receiver sees it, or this SeqCst load sees its flag.
        let s = self.map.sleeping();
        s.load(Ordering::SeqCst) != 0 && s.swap(0, Ordering::AcqRel) != 0
    }
}

/// A whole record taken out of a ring.
#[derive(Debug)]
pub enum Record {
    /// An application frame: its fixed fields (marker first) and its
    /// payload, in a buffer of its own.
    App([u8; APP_FIXED], Bytes),
    /// Any other frame, whole (everything after its length prefix).
    Frame(Bytes),
}

impl Record {
    /// The message the record holds.
    pub fn decode(self) -> Result<WireMsg, WireError> {
        match self {
            Record::App(fixed, payload) => decode_app_parts(&fixed, payload),
            Record::Frame(frame) => decode(frame),
        }
    }
}

/// What has arrived of a record being reassembled.
enum Part {
    /// An application frame: `got` bytes of its fixed fields, then its
    /// payload (grown as it arrives, to its exact size).
    App {
        fixed: [u8; APP_FIXED],
        got: usize,
        payload: Vec<u8>,
    },
    /// Any other frame.
    Whole(Vec<u8>),
}

/// The receiving end of a ring, with the record being reassembled.
pub struct RingReader {
    map: Mapping,
    /// Bytes consumed so far (published as the tail once per `pull`).
    tail: u64,
    /// The record being reassembled: its length once the prefix is read,
    /// and its parts once its first byte is.
    pending: Option<(usize, Option<Part>)>,
    /// Buffers of dropped large records (a partner's previous piece, a
    /// large message the rank is done with) for the next ones.
    pool: BufferPool,
    /// The sender's process, when this process can read its memory.
    sender: Option<libc::pid_t>,
}

impl Drop for RingReader {
    fn drop(&mut self) {
        self.map.word64(OFF_READER_GONE).store(1, Ordering::Release);
    }
}

impl RingReader {
    /// Map the ring `dir/name` made by a peer, then unlink its file.
    /// `peer`: the process at the other end of the connection that
    /// announced the ring (`SO_PEERCRED`), the only one whose memory this
    /// receiver will read large payloads from.
    pub fn attach(
        dir: &Path,
        name: &str,
        peer: Option<libc::pid_t>,
    ) -> Result<RingReader, ShmError> {
        if !super::plain_file_name(name) {
            return Err(ShmError::Invalid(format!("bad ring name `{name}`")));
        }
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| ShmError::Io {
                what: "cannot open",
                path: path.display().to_string(),
                source,
            })?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = std::fs::remove_file(&path);
        // The capacity is the file's size less the header; the header must
        // say the same.
        let capacity = usize::try_from(size).unwrap_or(0).saturating_sub(HEADER);
        if !valid_capacity(capacity) {
            return Err(ShmError::Invalid(format!(
                "{} has {size} bytes, not a ring's",
                path.display()
            )));
        }
        let len = HEADER + capacity;
        let map = Mapping::map(&file, len, &path)?;
        if map.word64(OFF_MAGIC).load(Ordering::Acquire) != MAGIC
            || map.word64(OFF_CAPACITY).load(Ordering::Relaxed) != capacity as u64
        {
            return Err(ShmError::Invalid(format!(
                "{} has no ring header",
                path.display()
            )));
        }
        // Cross-memory attach works if the sender's copy of the magic
        // number can be read where it says it is (not where ptrace is
        // restricted, or across a PID namespace). The header's process id
        // is the sender's own claim: only the process the kernel says is
        // at the other end of the announcing connection is read from, so
        // a member of the job cannot point this rank at the memory of
        // another process of the same user.
        let pid = libc::pid_t::try_from(map.word64(OFF_SENDER_PID).load(Ordering::Relaxed)).ok();
        let base = map.word64(OFF_SENDER_BASE).load(Ordering::Relaxed);
        let sender = pid.filter(|&pid| peer == Some(pid)).filter(|&pid| {
            let mut magic = Vec::with_capacity(8);
            read_remote(pid, base, 8, &mut magic).is_ok() && magic[..] == MAGIC.to_le_bytes()
        });
        if sender.is_some() {
            map.word64(OFF_REMOTE_OK).store(1, Ordering::Release);
        }
        Ok(RingReader {
            map,
            tail: 0,
            pending: None,
            pool: BufferPool::new(),
            sender,
        })
    }

    /// Whether this receiver reads large payloads out of the sender's
    /// memory.
    #[cfg(test)]
    fn reads_remote(&self) -> bool {
        self.sender.is_some()
    }

    /// Bytes published and not yet consumed.
    fn available(&self) -> u64 {
        self.map
            .word64(OFF_HEAD)
            .load(Ordering::Acquire)
            .wrapping_sub(self.tail)
    }

    /// Whether anything is waiting to be read.
    pub fn has_data(&self) -> bool {
        self.available() != 0
    }

    /// Consume what has arrived; a complete record when one is done. A
    /// length above `max` or below the smallest frame is an error: the ring
    /// is then unusable.
    pub fn pull(&mut self, max: usize) -> Result<Option<Record>, WireError> {
        let avail = self.available();
        if avail == 0 {
            // Nothing new (the common case of a rank polling while it
            // waits): no record to continue or to start.
            return Ok(None);
        }
        if avail > self.map.capacity as u64 {
            return Err(WireError::Malformed(format!(
                "ring claims {avail} unread bytes in {} of capacity",
                self.map.capacity
            )));
        }
        let before = self.tail;
        let got = match self.take_small_app(avail as usize, max) {
            Some(record) => Ok(Some(record)),
            None => match self.take_remote(avail as usize, max) {
                Some(record) => record.map(Some),
                None => match self.take_remote_frame(avail as usize, max) {
                    Some(record) => record.map(Some),
                    None => self.take(avail as usize, max),
                },
            },
        };
        // One store to the shared tail per call, however many parts were read.
        if self.tail != before {
            self.map
                .word64(OFF_TAIL)
                .store(self.tail, Ordering::Release);
        }
        got
    }

    /// The common case of the latency path on its own: a small application
    /// record that has arrived whole and none begun before it, read in two
    /// copies (its prefix and fixed fields together, then its payload into
    /// a buffer of exactly its size). `None` for anything else, which
    /// [`RingReader::take`] reads (and checks) in its general way.
    fn take_small_app(&mut self, avail: usize, max: usize) -> Option<Record> {
        const HEAD: usize = 4 + APP_FIXED;
        if self.pending.is_some() || avail < HEAD {
            return None;
        }
        let mut head = [0u8; HEAD];
        self.map.copy_out(self.tail, &mut head);
        let (prefix, fixed) = head.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*prefix) as usize;
        // (A long prefix, `LONG_LEN`, is larger than any small record.)
        if fixed[0] != APP_FRAME || !(APP_FIXED..=SMALL_APP).contains(&len) || len > max {
            return None;
        }
        if 4 + len > avail {
            return None;
        }
        let n = len - APP_FIXED;
        let mut payload = Vec::with_capacity(n);
        self.map.read_at(self.tail + HEAD as u64, n, &mut payload);
        self.tail += (4 + len) as u64;
        Some(Record::App(*fixed.first_chunk()?, Bytes::from(payload)))
    }

    /// A remote record (always written whole), its payload copied out of
    /// the sender's memory before the record is consumed (the sender keeps
    /// the payload until then). `None` when the next record is not one.
    fn take_remote(&mut self, avail: usize, max: usize) -> Option<Result<Record, WireError>> {
        if self.pending.is_some() || avail < 4 + REMOTE_BODY {
            return None;
        }
        let mut record = [0u8; 4 + REMOTE_BODY];
        self.map.copy_out(self.tail, &mut record);
        let (prefix, body) = record.split_first_chunk::<4>()?;
        if body[0] != APP_REMOTE {
            return None;
        }
        let (addr, n) = (le_u64(body, APP_FIXED), le_u64(body, APP_FIXED + 8));
        let mut fixed: [u8; APP_FIXED] = *body.first_chunk()?;
        fixed[0] = APP_FRAME;
        let read = || -> Result<Record, WireError> {
            if u32::from_le_bytes(*prefix) as usize != REMOTE_BODY {
                return Err(WireError::Malformed(
                    "remote record of the wrong length".into(),
                ));
            }
            let Some(pid) = self.sender else {
                return Err(WireError::Malformed(
                    "remote record from a sender whose memory cannot be read".into(),
                ));
            };
            let n = usize::try_from(n)
                .ok()
                .filter(|&n| n <= max.saturating_sub(APP_FIXED))
                .ok_or(WireError::Oversized {
                    len: n.saturating_add(APP_FIXED as u64) as usize,
                    max,
                })?;
            let mut payload = self.pool.take_idle(n).unwrap_or_default();
            read_remote(pid, addr, n, &mut payload).map_err(|e| remote_error(&e, pid, n))?;
            Ok(Record::App(fixed, self.pool.freeze(payload)))
        };
        let got = read();
        self.tail += (4 + REMOTE_BODY) as u64;
        Some(got)
    }

    /// A remote frame record (always written whole): the frame's bytes,
    /// then its parts copied out of the sender's memory, in one buffer.
    /// `None` when the next record is not one.
    fn take_remote_frame(&mut self, avail: usize, max: usize) -> Option<Result<Record, WireError>> {
        if self.pending.is_some() || avail < 4 + REMOTE_FRAME_HEAD {
            return None;
        }
        let mut head = [0u8; 4 + REMOTE_FRAME_HEAD];
        self.map.copy_out(self.tail, &mut head);
        if head[4] != FRAME_REMOTE {
            return None;
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let count = u32::from_le_bytes([head[5], head[6], head[7], head[8]]) as usize;
        let read = |this: &mut Self| -> Result<Record, WireError> {
            let list = count
                .checked_mul(REMOTE_PART)
                .and_then(|b| b.checked_add(REMOTE_FRAME_HEAD))
                .filter(|&b| b <= len && 4 + len <= avail)
                .ok_or_else(|| {
                    WireError::Malformed(format!(
                        "remote frame record of {len} bytes listing {count} parts, \
                         {avail} bytes in the ring"
                    ))
                })?;
            let mut rec = vec![0u8; len];
            this.map.copy_out(this.tail + 4, &mut rec);
            let body = &rec[list..];
            let parts: Vec<(u64, u64)> = rec[REMOTE_FRAME_HEAD..list]
                .chunks_exact(REMOTE_PART)
                .map(|c| (le_u64(c, 0), le_u64(c, 8)))
                .collect();
            let total = parts
                .iter()
                .try_fold(body.len() as u64, |t, &(_, n)| t.checked_add(n))
                .and_then(|t| usize::try_from(t).ok())
                .ok_or_else(|| WireError::Malformed("remote frame of overflowing length".into()))?;
            if total > max {
                return Err(WireError::Oversized { len: total, max });
            }
            let Some(pid) = this.sender else {
                return Err(WireError::Malformed(
                    "remote frame from a sender whose memory cannot be read".into(),
                ));
            };
            let mut frame = this.pool.take_idle(total).unwrap_or_default();
            frame.clear();
            frame.reserve_exact(total);
            frame.extend_from_slice(body);
            for (addr, n) in parts {
                let n = n as usize;
                read_remote(pid, addr, n, &mut frame).map_err(|e| remote_error(&e, pid, n))?;
            }
            Ok(Record::Frame(this.pool.freeze(frame)))
        };
        let got = read(self);
        // Consumed whatever came of it: the sender keeps the parts until
        // the tail passes the record.
        self.tail += (4 + len.min(avail.saturating_sub(4))) as u64;
        Some(got)
    }

    /// Read what `avail` bytes hold of the current record.
    fn take(&mut self, mut avail: usize, max: usize) -> Result<Option<Record>, WireError> {
        // The first byte of a new record (not consumed), if it has arrived.
        let mut marker = None;
        let (len, part) = match self.pending.take() {
            Some(p) => p,
            None => {
                if avail < 4 {
                    return Ok(None);
                }
                // The length prefix and the byte after it in one copy
                // (consumed once the whole prefix has arrived).
                let mut head = [0u8; LONG_PREFIX + 1];
                let n = avail.min(head.len());
                self.map.copy_out(self.tail, &mut head[..n]);
                let mut len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
                let mut prefix = 4;
                if len == LONG_LEN as usize {
                    let Some(long) = head[4..LONG_PREFIX]
                        .first_chunk::<8>()
                        .filter(|_| n >= LONG_PREFIX)
                    else {
                        return Ok(None);
                    };
                    len = long_len(*long, max)?;
                    prefix = LONG_PREFIX;
                }
                self.tail += prefix as u64;
                avail -= prefix;
                marker = head.get(prefix).filter(|_| n > prefix).copied();
                if len > max {
                    return Err(WireError::Oversized { len, max });
                }
                if len < 5 {
                    return Err(WireError::Malformed(format!(
                        "frame of {len} bytes is shorter than its own prefix"
                    )));
                }
                (len, None)
            }
        };
        let mut part = match part {
            Some(p) => p,
            None if avail == 0 => {
                self.pending = Some((len, None));
                return Ok(None);
            }
            None => {
                // The first byte (not consumed yet) says how to split.
                let marker = marker.unwrap_or_else(|| {
                    let mut b = [0u8; 1];
                    self.map.copy_out(self.tail, &mut b);
                    b[0]
                });
                if marker == APP_FRAME && len >= APP_FIXED {
                    Part::App {
                        fixed: [0; APP_FIXED],
                        got: 0,
                        payload: self.pool.take_idle(len - APP_FIXED).unwrap_or_default(),
                    }
                } else {
                    Part::Whole(self.pool.take_growable(len).unwrap_or_default())
                }
            }
        };
        let done = match &mut part {
            Part::App {
                fixed,
                got,
                payload,
            } => {
                let n = avail.min(APP_FIXED - *got);
                self.read(&mut fixed[*got..*got + n]);
                *got += n;
                avail -= n;
                let rest = len - APP_FIXED;
                let n = avail.min(rest - payload.len());
                self.read_vec(n, rest, payload);
                *got == APP_FIXED && payload.len() == rest
            }
            Part::Whole(buf) => {
                let n = avail.min(len - buf.len());
                self.read_vec(n, len, buf);
                buf.len() == len
            }
        };
        if !done {
            self.pending = Some((len, Some(part)));
            return Ok(None);
        }
        // A fresh buffer ends at its exact size: `Bytes` takes it over
        // without allocating.
        Ok(Some(match part {
            Part::App { fixed, payload, .. } => Record::App(fixed, self.pool.freeze(payload)),
            Part::Whole(buf) => Record::Frame(self.pool.freeze(buf)),
        }))
    }

    /// Consume `dst.len()` bytes into `dst`.
    fn read(&mut self, dst: &mut [u8]) {
        self.map.copy_out(self.tail, dst);
        self.tail += dst.len() as u64;
    }

    /// Consume `n` bytes, appended to `dst`, which holds part of a record
    /// of `total` bytes. A record up to [`EAGER_RESERVE`] gets its whole
    /// buffer at once (address space only: pages are committed as bytes
    /// land, and regrowing a 4 MiB record from 1 MiB chunks copied 3 MiB
    /// and halved the ping-pong bandwidth); a larger one grows as
    /// `wire::read_frame`'s buffer does, by what has arrived, so a sender
    /// announcing 1 GiB and writing a few bytes costs the receiver little.
    fn read_vec(&mut self, n: usize, total: usize, dst: &mut Vec<u8>) {
        if n > 0 {
            if dst.capacity() - dst.len() < n {
                let want = if total <= EAGER_RESERVE {
                    total - dst.len()
                } else {
                    growth(dst.len(), total)
                };
                dst.reserve_exact(want.max(n));
            }
            self.map.read_at(self.tail, n, dst);
            self.tail += n as u64;
        }
    }

    /// Ask for a doorbell before blocking; `false` if data arrived
    /// meanwhile (then do not block).
    pub fn sleep(&self) -> bool {
        self.map.sleeping().store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.has_data() {
            self.map.sleeping().store(0, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Awake again: no doorbell needed.
    pub fn wake(&self) {
        self.map.sleeping().store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempdir::Dir {
        tempdir::Dir::new()
    }

    /// The tests' rings are written and read in this process: its id is
    /// what `SO_PEERCRED` would give for the announcing connection.
    fn this_process() -> Option<libc::pid_t> {
        libc::pid_t::try_from(std::process::id()).ok()
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let p = std::env::temp_dir().join(format!(
                    "lazarus-shm-test-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::create_dir_all(&p).expect("test dir");
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn record(body: &[u8]) -> Vec<u8> {
        let mut r = (body.len() as u32).to_le_bytes().to_vec();
        r.extend_from_slice(body);
        r
    }

    /// The record's bytes in one piece (and whether it came in two parts).
    fn whole(r: Record) -> (Vec<u8>, bool) {
        match r {
            Record::App(fixed, payload) => {
                let mut v = fixed.to_vec();
                v.extend_from_slice(&payload);
                (v, true)
            }
            Record::Frame(f) => (f.to_vec(), false),
        }
    }

    /// Byte `k` of test body `i`: application frames (marker first) and
    /// others alternate.
    fn body_byte(i: u64, k: usize) -> u8 {
        if k == 0 && i % 2 == 1 {
            APP_FRAME
        } else {
            (k as u64 ^ i) as u8
        }
    }

    /// `write_whole` writes a frame all at once or not at all, re-reading
    /// the receiver's tail when its cached one says the frame does not fit.
    #[test]
    fn a_whole_write_fits_entirely_or_writes_nothing() {
        let d = dir();
        let mut w = RingWriter::create(&d.0, "w", MIN_CAPACITY).expect("create");
        let mut r = RingReader::attach(&d.0, "w", this_process()).expect("attach");
        let third: Vec<u8> = (0..MIN_CAPACITY / 3 - 4).map(|k| k as u8).collect();
        let prefix = (third.len() as u32).to_le_bytes();
        for _ in 0..3 {
            assert!(w.write_whole(&[&prefix, &third]));
        }
        // Less room than a fourth: refused, nothing written or published.
        let published = w.published;
        assert!(!w.write_whole(&[&prefix, &third]));
        assert_eq!((w.head, w.published), (published, published));
        // The reader takes the three (each published whole, no wake-up
        // needed), after which the writer's cached tail is stale: it must
        // look again and find the room.
        for _ in 0..3 {
            let rec = r.pull(usize::MAX).expect("pull").expect("a whole frame");
            assert_eq!(whole(rec).0, third);
        }
        assert!(r.pull(usize::MAX).expect("pull").is_none());
        assert!(w.write_whole(&[&prefix, &third]));
        let rec = r.pull(usize::MAX).expect("pull").expect("the fourth");
        assert_eq!(whole(rec).0, third);
        // A frame larger than the ring never fits.
        let big = vec![7u8; MIN_CAPACITY + 1];
        assert!(!w.write_whole(&[&big]));
    }

    /// An application message from rank 3 in epoch 2 with `payload`, and
    /// its head on the wire.
    fn app(payload: &[u8]) -> (crate::engine::frame::AppMessage, [u8; APP_HEAD]) {
        use crate::engine::frame::{Body, Frame};
        let WireMsg::Frame(Frame {
            body: Body::App(app),
            ..
        }) = super::super::wire::tests::app(payload.to_vec())
        else {
            unreachable!("an application frame")
        };
        let head = super::super::wire::app_head(3, 2, &app, usize::MAX).expect("head");
        (app, head)
    }

    /// A large payload crosses as a remote record: the receiver copies it
    /// out of the sender's memory (here the same process), gets the
    /// message as it was sent, and the sender keeps the payload until the
    /// receiver's tail has passed the record, then lets it go.
    #[test]
    fn a_remote_record_is_copied_out_of_the_senders_memory() {
        let d = dir();
        let mut w = RingWriter::create(&d.0, "w", MIN_CAPACITY).expect("create");
        let mut r = RingReader::attach(&d.0, "w", this_process()).expect("attach");
        assert!(r.reads_remote(), "this process can read its own memory");
        // Larger than the ring: it could not cross it whole.
        let payload: Bytes = (0..3 * MIN_CAPACITY).map(|k| (k * 7) as u8).collect();
        let (sent, head) = app(&payload);
        assert!(w.write_remote(&head, &payload));
        assert_eq!(w.in_flight_bytes, payload.len());
        let rec = r.pull(usize::MAX).expect("pull").expect("a record");
        let Ok(WireMsg::Frame(f)) = rec.decode() else {
            panic!("not a frame");
        };
        assert_eq!((f.src, f.epoch), (3, 2));
        let crate::engine::frame::Body::App(got) = f.body else {
            panic!("not an application message");
        };
        assert_eq!((got.envelope, got.ssn), (sent.envelope, sent.ssn));
        assert_eq!(got.payload, payload);
        // A copy, not the sender's buffer.
        assert_ne!(got.payload.as_ptr(), payload.as_ptr());
        w.release_copied();
        assert_eq!((w.in_flight.len(), w.in_flight_bytes), (0, 0));
        // Too much kept for the receiver: refused, nothing written.
        let head_before = w.head;
        w.in_flight_bytes = REMOTE_IN_FLIGHT;
        w.in_flight.push_back((u64::MAX, Bytes::new()));
        assert!(!w.write_remote(&head, &payload));
        assert_eq!(w.head, head_before);
    }

    /// A sender may end only once its kept payloads are copied: `copied`
    /// says so after the receiver's tail passed them, or once the
    /// receiver has let go of the ring (it will never copy them), and not
    /// before (the finalize leader then lost its `Exit` with the ring,
    /// and a partner read a last checkpoint piece from freed memory).
    #[test]
    fn a_sender_knows_when_what_it_keeps_for_the_receiver_is_copied() {
        let d = dir();
        let mut w = RingWriter::create(&d.0, "w", MIN_CAPACITY).expect("create");
        let mut r = RingReader::attach(&d.0, "w", this_process()).expect("attach");
        assert!(w.copied(), "nothing kept yet");
        let payload: Bytes = (0..2 * MIN_CAPACITY).map(|k| k as u8).collect();
        let (_, head) = app(&payload);
        assert!(w.write_remote(&head, &payload));
        assert!(!w.copied(), "the receiver has not copied it");
        r.pull(usize::MAX).expect("pull").expect("a record");
        assert!(w.copied(), "the receiver's tail passed it");
        assert!(w.write_remote(&head, &payload));
        assert!(!w.copied());
        drop(r);
        assert!(w.copied(), "the receiver let go of the ring");
    }

    /// A checkpoint piece's segments cross as a remote frame record: the
    /// receiver gets the frame as if it had crossed whole (its segments
    /// after its header, in one buffer), and the sender keeps every
    /// segment until the receiver's tail has passed the record. A record
    /// of too many parts for the ring, or one listing more parts than it
    /// holds, is refused or an error, never a panic.
    #[test]
    fn a_pieces_segments_are_copied_out_of_the_senders_memory() {
        use crate::store::{Piece, StoreMsg};
        let d = dir();
        let mut w = RingWriter::create(&d.0, "w", MIN_CAPACITY).expect("create");
        let mut r = RingReader::attach(&d.0, "w", this_process()).expect("attach");
        let segments: Vec<Bytes> = (0..3usize)
            .map(|s| {
                (0..MIN_CAPACITY + 100 * s)
                    .map(|k| (k * 7 + s) as u8)
                    .collect()
            })
            .collect();
        let data: crate::segments::Segments = segments.iter().cloned().collect();
        let piece = Piece::new(5, 2, data);
        let msg = WireMsg::Frame(crate::engine::frame::Frame {
            src: 2,
            epoch: 1,
            body: crate::engine::frame::Body::Store(StoreMsg::Put(piece.clone())),
        });
        let mut buf = Vec::new();
        let parts = super::super::wire::encode_into(&msg, usize::MAX, &mut buf).expect("encode");
        assert_eq!(parts.len(), 3, "the segments are detached");
        assert!(w.write_remote_frame(&buf[4..], parts));
        let total: usize = segments.iter().map(Bytes::len).sum();
        assert_eq!((w.in_flight.len(), w.in_flight_bytes), (3, total));
        let rec = r.pull(usize::MAX).expect("pull").expect("a record");
        let Ok(WireMsg::Frame(f)) = rec.decode() else {
            panic!("not a frame");
        };
        let crate::engine::frame::Body::Store(StoreMsg::Put(got)) = f.body else {
            panic!("not a piece");
        };
        assert_eq!((got.generation, got.owner), (5, 2));
        assert_eq!(got.data.to_vec(), piece.data.to_vec());
        w.release_copied();
        assert_eq!((w.in_flight.len(), w.in_flight_bytes), (0, 0));
        // A record of more parts than a quarter of the ring holds: refused,
        // nothing written (the frame then streams through the ring).
        let many: Vec<Bytes> = (0..MIN_CAPACITY / 4 / REMOTE_PART)
            .map(|_| Bytes::from_static(b"x"))
            .collect();
        let head_before = w.head;
        assert!(!w.write_remote_frame(&buf[4..], &many));
        assert_eq!(w.head, head_before);
        // A record that lists more parts than it holds: an error.
        let mut forged = Vec::new();
        let len = (REMOTE_FRAME_HEAD + 8) as u32;
        forged.extend_from_slice(&len.to_le_bytes());
        forged.push(FRAME_REMOTE);
        forged.extend_from_slice(&1000u32.to_le_bytes());
        forged.extend_from_slice(&[0u8; 8]);
        assert!(w.write_whole(&[&forged]));
        assert!(matches!(r.pull(usize::MAX), Err(WireError::Malformed(_))));
    }

    /// A sender whose memory the receiver cannot read (its process id
    /// names no process here), or whose header names another process than
    /// the connection's peer, sends large payloads through the ring; a
    /// remote record naming memory the sender has not mapped, or longer
    /// than the frame limit, is an error for that ring, not a panic.
    #[test]
    fn remote_records_are_refused_where_they_cannot_be_read() {
        let d = dir();
        let mut w = RingWriter::create(&d.0, "w", MIN_CAPACITY).expect("create");
        w.map
            .word64(OFF_SENDER_PID)
            .store(u64::MAX, Ordering::Relaxed);
        let r = RingReader::attach(&d.0, "w", this_process()).expect("attach");
        assert!(!r.reads_remote());
        let payload = Bytes::from(vec![1u8; REMOTE_MIN]);
        let (_, head) = app(&payload);
        // A header naming a readable process that is not the one at the
        // other end of the connection (here: this process, while the
        // connection's peer is the parent) is not read from either.
        let mut w2 = RingWriter::create(&d.0, "w2", MIN_CAPACITY).expect("create");
        let parent = libc::pid_t::try_from(std::os::unix::process::parent_id()).ok();
        let r2 = RingReader::attach(&d.0, "w2", parent).expect("attach");
        assert!(!r2.reads_remote(), "the header's pid is not the peer's");
        assert!(!w2.write_remote(&head, &payload), "no remote record to it");
        assert!(!w.write_remote(&head, &payload), "no remote record to it");

        let unmapped = |n: u64, max: usize| {
            let d = dir();
            let mut w = RingWriter::create(&d.0, "w", MIN_CAPACITY).expect("create");
            let mut r = RingReader::attach(&d.0, "w", this_process()).expect("attach");
            let mut record = [0u8; 4 + REMOTE_BODY];
            record[..4].copy_from_slice(&(REMOTE_BODY as u32).to_le_bytes());
            record[4..APP_HEAD].copy_from_slice(&head[4..]);
            record[4] = APP_REMOTE;
            // Page 0 is never mapped.
            record[APP_HEAD..APP_HEAD + 8].copy_from_slice(&16u64.to_le_bytes());
            record[APP_HEAD + 8..].copy_from_slice(&n.to_le_bytes());
            assert!(w.write_whole(&[&record]));
            r.pull(max)
        };
        assert!(matches!(
            unmapped(4096, usize::MAX),
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            unmapped(4096, 1024),
            Err(WireError::Oversized { .. })
        ));
        assert!(matches!(
            unmapped(u64::MAX, usize::MAX),
            Err(WireError::Oversized { .. })
        ));
    }

    /// A sender that dies while its receiver copies a payload out of its
    /// memory is reported as gone (its failure is handled as any other),
    /// not as a malformed ring.
    #[test]
    fn a_sender_gone_during_a_remote_copy_is_reported_as_gone() {
        let d = dir();
        let mut w = RingWriter::create(&d.0, "w", MIN_CAPACITY).expect("create");
        let mut r = RingReader::attach(&d.0, "w", this_process()).expect("attach");
        assert!(r.reads_remote());
        let payload = Bytes::from(vec![5u8; REMOTE_MIN]);
        let (_, head) = app(&payload);
        assert!(w.write_remote(&head, &payload));
        // The record now names a process that has ended (and been reaped).
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("start a child process");
        let pid = libc::pid_t::try_from(child.id()).expect("a pid");
        child.kill().expect("kill the child");
        child.wait().expect("reap the child");
        r.sender = Some(pid);
        match r.pull(usize::MAX) {
            Err(WireError::SenderGone { pid: p, len }) => {
                assert_eq!((p, len), (pid, payload.len()));
            }
            other => panic!("not reported as a sender gone: {other:?}"),
        }
    }

    /// A ring file's pages are allocated when it is made (where it fails
    /// cleanly), not when first written (where a full /dev/shm would kill
    /// the writer with SIGBUS).
    #[test]
    fn a_ring_file_is_allocated_when_made() {
        use std::os::unix::fs::MetadataExt;
        let shm = Path::new("/dev/shm");
        let d = if shm.is_dir() {
            let p = shm.join(format!("lazarus-shm-test-{}-alloc", std::process::id()));
            std::fs::create_dir_all(&p).expect("test dir");
            tempdir::Dir(p)
        } else {
            dir()
        };
        let _w = RingWriter::create(&d.0, "f", CAPACITY).expect("create");
        let m = std::fs::metadata(d.0.join("f")).expect("the ring file");
        assert_eq!(m.len(), (HEADER + CAPACITY) as u64);
        assert!(
            m.blocks() * 512 >= m.len(),
            "{} of {} bytes allocated",
            m.blocks() * 512,
            m.len()
        );
    }

    #[test]
    fn frames_cross_the_wrap_around_whole_and_in_order() {
        cross_the_wrap_around(CAPACITY);
    }

    /// The smallest ring: frames many times its size cross it in pieces.
    #[test]
    fn frames_larger_than_a_small_ring_cross_it_whole() {
        cross_the_wrap_around(MIN_CAPACITY);
    }

    #[test]
    fn ring_capacity_shrinks_with_the_job_to_keep_a_rank_within_budget() {
        assert_eq!(capacity_for(1), CAPACITY);
        assert_eq!(capacity_for(2), CAPACITY);
        assert_eq!(capacity_for(17), CAPACITY);
        assert_eq!(capacity_for(18), CAPACITY / 2);
        assert_eq!(capacity_for(10_000), MIN_CAPACITY);
        for ranks in 2..600 {
            let c = capacity_for(ranks);
            assert!(valid_capacity(c), "{ranks} ranks: {c}");
            assert!(
                c == MIN_CAPACITY || c * (ranks - 1) <= RECEIVE_BUDGET,
                "{ranks} ranks: {c} bytes per ring"
            );
        }
        let d = dir();
        assert!(RingWriter::create(&d.0, "x", 3 << 16).is_err());
        let w = RingWriter::create(&d.0, "y", MIN_CAPACITY).expect("create");
        let r = RingReader::attach(&d.0, "y", this_process()).expect("attach");
        assert_eq!(
            (w.map.capacity, r.map.capacity),
            (MIN_CAPACITY, MIN_CAPACITY)
        );
    }

    fn cross_the_wrap_around(capacity: usize) {
        let d = dir();
        let mut w = RingWriter::create(&d.0, "a", capacity).expect("create");
        let mut r = RingReader::attach(&d.0, "a", this_process()).expect("attach");
        assert!(!d.0.join("a").exists(), "the receiver unlinks the file");
        let mut sent = 0u64;
        let mut got = 0u64;
        // Bodies of awkward sizes, many times the capacity in total, with a
        // reader that lags: every wrap-around position is crossed.
        // Odd ones are application frames: 300 B goes by the small-record
        // path when it has arrived whole, and by the general one when the
        // writer left it cut short at a full ring.
        let sizes = [5usize, 4093, 70_001, CAPACITY / 3, 1 << 20, 17, 9, 300];
        let mut pending: Vec<u8> = Vec::new();
        let mut i = 0usize;
        while got < 96 {
            if pending.is_empty() && sent < 96 {
                let n = sizes[(sent as usize) % sizes.len()];
                let body: Vec<u8> = (0..n).map(|k| body_byte(sent, k)).collect();
                pending = record(&body);
                sent += 1;
            }
            let n = w.push(&pending);
            pending.drain(..n);
            i += 1;
            if i.is_multiple_of(3) || n == 0 {
                while let Some(rec) = r.pull(usize::MAX).expect("pull") {
                    let n = sizes[(got as usize) % sizes.len()];
                    let (f, split) = whole(rec);
                    assert_eq!(f.len(), n);
                    assert_eq!(split, got % 2 == 1 && n >= APP_FIXED);
                    assert!(f.iter().enumerate().all(|(k, b)| *b == body_byte(got, k)));
                    got += 1;
                }
            }
        }
    }

    #[test]
    fn an_application_frame_decodes_from_its_two_parts() {
        use crate::engine::frame::{AppMessage, Body, Envelope, Frame};
        let d = dir();
        let mut w = RingWriter::create(&d.0, "m", CAPACITY).expect("create");
        let mut r = RingReader::attach(&d.0, "m", this_process()).expect("attach");
        for n in [0usize, 8, 100_000] {
            let msg = WireMsg::Frame(Frame {
                src: 1,
                epoch: 4,
                body: Body::App(AppMessage {
                    envelope: Envelope {
                        src: 1,
                        dest: 0,
                        context: 2,
                        tag: 7,
                    },
                    ssn: 9,
                    payload: Bytes::from((0..n).map(|i| i as u8).collect::<Vec<u8>>()),
                }),
            });
            let mut head = Vec::new();
            let rest =
                super::super::wire::encode_into(&msg, usize::MAX, &mut head).expect("encodes");
            assert_eq!(w.push(&head), head.len());
            for part in rest {
                assert_eq!(w.push(part), part.len());
            }
            let rec = r.pull(usize::MAX).expect("pull").expect("a record");
            assert!(matches!(rec, Record::App(..)));
            assert_eq!(rec.decode().expect("decodes"), msg);
        }
    }

    /// A record announcing far more than has arrived, beyond the eager
    /// reserve, gets a buffer of one chunk at most, whatever the announced
    /// length; one within it gets its whole buffer at once (no regrowth);
    /// one larger than a chunk still arrives whole and in order.
    #[test]
    fn a_records_buffer_grows_as_its_bytes_arrive() {
        let d = dir();
        for (marker, announced) in [
            (APP_FRAME, 512u32 << 20),
            (0, 512 << 20),
            (APP_FRAME, 4 << 20),
            (0, 4 << 20),
        ] {
            let name = format!("g{marker}-{announced}");
            let mut w = RingWriter::create(&d.0, &name, CAPACITY).expect("create");
            let mut r = RingReader::attach(&d.0, &name, this_process()).expect("attach");
            let mut start = announced.to_le_bytes().to_vec();
            start.extend_from_slice(&[marker; 100]);
            w.push(&start);
            assert!(r.pull(usize::MAX).expect("pull").is_none());
            let held = match &r.pending {
                Some((_, Some(Part::App { payload: b, .. } | Part::Whole(b)))) => b.capacity(),
                _ => panic!("a record under way"),
            };
            if announced as usize > EAGER_RESERVE {
                assert!(held <= 1 << 20, "{held} bytes held for 100 arrived");
            } else {
                assert!(
                    held >= announced as usize - APP_FIXED,
                    "{held} for {announced}"
                );
            }
        }
        let mut w = RingWriter::create(&d.0, "h", MIN_CAPACITY).expect("create");
        let mut r = RingReader::attach(&d.0, "h", this_process()).expect("attach");
        let body: Vec<u8> = (0..(5 << 20) + 3).map(|k| body_byte(2, k)).collect();
        let mut pending = record(&body);
        let mut got = None;
        while got.is_none() {
            let n = w.push(&pending);
            pending.drain(..n);
            got = r.pull(usize::MAX).expect("pull");
        }
        let (f, _) = whole(got.expect("the record"));
        assert!(f == body);
    }

    /// A record with a 64-bit length (`LONG_LEN`, then the u64), arriving
    /// a byte at a time: nothing is taken before its whole prefix is
    /// there, and the record comes out as with a 32-bit length.
    #[test]
    fn a_long_length_prefix_is_read_once_whole() {
        let d = dir();
        let mut w = RingWriter::create(&d.0, "l", MIN_CAPACITY).expect("create");
        let mut r = RingReader::attach(&d.0, "l", this_process()).expect("attach");
        for i in [0u64, 1] {
            let body: Vec<u8> = (0..300).map(|k| body_byte(i, k)).collect();
            let mut rec = LONG_LEN.to_le_bytes().to_vec();
            rec.extend_from_slice(&(body.len() as u64).to_le_bytes());
            rec.extend_from_slice(&body);
            let mut got = None;
            for (k, b) in rec.iter().enumerate() {
                assert!(got.is_none(), "a record before its byte {k}");
                assert_eq!(w.push(&[*b]), 1);
                got = r.pull(1000).expect("pull");
            }
            let (bytes, app) = whole(got.expect("the record"));
            assert_eq!((bytes, app), (body, i == 1));
        }
        // Over the limit, or more than a usize holds: an error.
        let mut rec = LONG_LEN.to_le_bytes().to_vec();
        rec.extend_from_slice(&u64::MAX.to_le_bytes());
        w.push(&rec);
        assert!(matches!(r.pull(1000), Err(WireError::Oversized { .. })));
    }

    #[test]
    fn an_oversized_or_short_length_is_an_error() {
        let d = dir();
        let mut w = RingWriter::create(&d.0, "b", CAPACITY).expect("create");
        let mut r = RingReader::attach(&d.0, "b", this_process()).expect("attach");
        w.push(&record(&[0u8; 100]));
        assert!(matches!(r.pull(50), Err(WireError::Oversized { .. })));
        let mut w = RingWriter::create(&d.0, "c", CAPACITY).expect("create");
        let mut r = RingReader::attach(&d.0, "c", this_process()).expect("attach");
        w.push(&3u32.to_le_bytes());
        assert!(matches!(r.pull(1000), Err(WireError::Malformed(_))));
    }

    #[test]
    fn names_outside_the_directory_and_foreign_files_are_refused() {
        let d = dir();
        assert!(matches!(
            RingReader::attach(&d.0, "../x", this_process()),
            Err(ShmError::Invalid(_))
        ));
        std::fs::write(d.0.join("f"), b"not a ring").expect("write");
        assert!(matches!(
            RingReader::attach(&d.0, "f", this_process()),
            Err(ShmError::Invalid(_))
        ));
        assert!(RingWriter::create(&d.0, "g", CAPACITY).is_ok());
        assert!(
            RingWriter::create(&d.0, "g", CAPACITY).is_err(),
            "an existing file is never reused"
        );
    }

    #[test]
    fn a_sleeping_receiver_gets_exactly_one_doorbell() {
        let d = dir();
        let mut w = RingWriter::create(&d.0, "s", CAPACITY).expect("create");
        let mut r = RingReader::attach(&d.0, "s", this_process()).expect("attach");
        assert!(!w.wake_needed());
        assert!(r.sleep());
        w.push(&record(b"hello"));
        assert!(w.wake_needed());
        assert!(!w.wake_needed(), "one doorbell per sleep");
        assert!(!r.sleep(), "data is waiting: do not block");
        r.wake();
        let got = r.pull(100).expect("pull").map(whole);
        assert_eq!(got, Some((b"hello".to_vec(), false)));
    }
}
