//! The MPI calls of the `mpi` backend, on a communicator of its own.
//!
//! rsmpi's safe nonblocking sends borrow their buffer for a scope; a frame
//! must outlive the call that sent it (the engine sends eagerly and moves
//! on), so sends, matched probes and receives go through `mpi::ffi` here,
//! each buffer owned by its pending request until MPI is done with it.
//! Every other module of the backend is safe code.

#![allow(unsafe_code)]

use std::os::raw::c_int;

use mpi::ffi;

use crate::{Error, Rank, Result};

/// Tag of everything ranks send each other while the job runs (frames,
/// RMA requests and replies): one tag, so that MPI's non-overtaking rule
/// keeps every channel FIFO across kinds.
pub(super) const TAG_FRAME: c_int = 1;
/// Tag of the end-of-job reports to rank 0.
pub(super) const TAG_REPORT: c_int = 2;
/// Tag of the pieces of a frame that follow its head: a payload sent from
/// the sender's own buffer instead of being copied next to the header.
const TAG_PART: c_int = 3;

/// Largest MPI message a part is cut into (counts are C `int`s).
const MAX_PART: usize = 1 << 30;

/// A buffer MPI reads from until its send completes.
pub(super) enum Held {
    Owned(#[allow(dead_code)] Vec<u8>),
    Shared(#[allow(dead_code)] bytes::Bytes),
}

pub(super) fn check(rc: c_int, what: &str) -> Result<()> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(Error::Driver(format!("{what} failed (MPI error {rc})")))
    }
}

/// A duplicate of `MPI_COMM_WORLD` and the sends still in flight on it.
pub(super) struct Transport {
    pub(super) comm: ffi::MPI_Comm,
    pub(super) rank: Rank,
    pub(super) size: usize,
    /// Nonblocking sends not known complete, each with its buffer.
    pub(super) pending: Vec<(ffi::MPI_Request, Held)>,
    /// Failures are survived in place (ULFM, [`super::ulfm`]): MPI returns
    /// errors instead of ending the job, and a call that fails because a
    /// process died sets `failed` instead of failing.
    pub(super) in_place: bool,
    /// A call saw a process of the communicator dead: the endpoint repairs
    /// the communicator before it goes on.
    pub(super) failed: bool,
}

impl Transport {
    /// Duplicate the world communicator (MPI must be initialised);
    /// `in_place`: failures are survived (ULFM), so MPI must return its
    /// errors.
    pub fn new(in_place: bool) -> Result<Self> {
        // SAFETY: MPI is initialised (the caller holds the universe); the
        // out-parameters are valid for writes.
        unsafe {
            if in_place {
                check(
                    ffi::MPI_Comm_set_errhandler(ffi::RSMPI_COMM_WORLD, ffi::RSMPI_ERRORS_RETURN),
                    "MPI_Comm_set_errhandler",
                )?;
            }
            let mut comm: ffi::MPI_Comm = std::mem::zeroed();
            check(
                ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &mut comm),
                "MPI_Comm_dup",
            )?;
            Self::on(comm, in_place)
        }
    }

    /// A transport on `comm`, which it owns from now on.
    pub(super) fn on(comm: ffi::MPI_Comm, in_place: bool) -> Result<Self> {
        // SAFETY: a live communicator; out-parameters valid for writes.
        unsafe {
            if in_place {
                check(
                    ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN),
                    "MPI_Comm_set_errhandler",
                )?;
            }
            let (mut rank, mut size) = (0, 0);
            check(ffi::MPI_Comm_rank(comm, &mut rank), "MPI_Comm_rank")?;
            check(ffi::MPI_Comm_size(comm, &mut size), "MPI_Comm_size")?;
            Ok(Transport {
                comm,
                rank: rank as Rank,
                size: size as usize,
                pending: Vec::new(),
                in_place,
                failed: false,
            })
        }
    }

    /// Whether the MPI call that returned `rc` failed because a process of
    /// the communicator died (or the communicator was revoked), with
    /// failures survived in place; if so, remember it for the repair.
    pub(super) fn lost(&mut self, rc: c_int) -> bool {
        if !self.in_place || rc == ffi::MPI_SUCCESS as c_int {
            return false;
        }
        #[cfg(feature = "ulfm")]
        let lost = super::ulfm::is_failure(rc);
        #[cfg(not(feature = "ulfm"))]
        let lost = false;
        self.failed |= lost;
        lost
    }

    /// This process's rank in the job.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Processes in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Start sending `buf` to `dest` under `tag`; MPI owns the buffer until
    /// [`Transport::progress`] sees the send complete.
    pub fn isend(&mut self, dest: Rank, tag: c_int, buf: Vec<u8>) -> Result<()> {
        let (ptr, len) = (buf.as_ptr(), buf.len());
        self.isend_held(dest, tag, ptr, len, Held::Owned(buf))
    }

    /// Send a frame: its head (length prefix included) under [`TAG_FRAME`],
    /// then `parts`, the rest of its bytes, straight from the sender's
    /// shared buffers under [`TAG_PART`] (no copy; MPI keeps the order of
    /// one sender's messages under one tag).
    pub fn isend_frame(&mut self, dest: Rank, head: Vec<u8>, parts: &[bytes::Bytes]) -> Result<()> {
        self.isend(dest, TAG_FRAME, head)?;
        for part in parts {
            let mut at = 0;
            while at < part.len() {
                let piece = part.slice(at..part.len().min(at + MAX_PART));
                at += piece.len();
                let (ptr, len) = (piece.as_ptr(), piece.len());
                self.isend_held(dest, TAG_PART, ptr, len, Held::Shared(piece))?;
            }
        }
        Ok(())
    }

    /// As [`Transport::isend`], a synchronous send (`MPI_Issend`): it
    /// completes once `dest` has matched it.
    pub fn issend(&mut self, dest: Rank, tag: c_int, buf: Vec<u8>) -> Result<()> {
        let (ptr, len) = (buf.as_ptr(), buf.len());
        self.post_send(dest, tag, (ptr, len), Held::Owned(buf), true)
    }

    fn isend_held(
        &mut self,
        dest: Rank,
        tag: c_int,
        ptr: *const u8,
        len: usize,
        held: Held,
    ) -> Result<()> {
        self.post_send(dest, tag, (ptr, len), held, false)
    }

    fn post_send(
        &mut self,
        dest: Rank,
        tag: c_int,
        (ptr, len): (*const u8, usize),
        held: Held,
        synchronous: bool,
    ) -> Result<()> {
        let count = c_int::try_from(len).map_err(|_| {
            Error::Driver(format!(
                "an MPI message of {len} bytes: the mpi backend sends at most 2 GiB in one"
            ))
        })?;
        let buf = held;
        // SAFETY: `ptr..ptr+len` lies in the heap buffer `held` owns (or
        // shares), which stays alive and unmoved in `pending` until
        // MPI_Test reports the send complete; `req` is valid for writes.
        unsafe {
            let mut req: ffi::MPI_Request = std::mem::zeroed();
            let send = if synchronous {
                ffi::MPI_Issend
            } else {
                ffi::MPI_Isend
            };
            let rc = send(
                ptr.cast(),
                count,
                ffi::RSMPI_UINT8_T,
                dest as c_int,
                tag,
                self.comm,
                &mut req,
            );
            if self.lost(rc) {
                // To a dead process: lost with it, as on a socket.
                return Ok(());
            }
            check(rc, "MPI_Isend")?;
            self.pending.push((req, buf));
        }
        Ok(())
    }

    /// Let MPI make progress; free the buffers of completed sends.
    pub fn progress(&mut self) -> Result<()> {
        let mut i = 0;
        while i < self.pending.len() {
            let mut done: c_int = 0;
            // SAFETY: the request is a live request of ours; status ignored.
            let rc = unsafe {
                ffi::MPI_Test(&mut self.pending[i].0, &mut done, ffi::RSMPI_STATUS_IGNORE)
            };
            if self.lost(rc) {
                // A send to a process that died: MPI may still hold the
                // buffer, so it is leaked rather than freed.
                let (_, held) = self.pending.swap_remove(i);
                std::mem::forget(held);
                continue;
            }
            check(rc, "MPI_Test")?;
            if done != 0 {
                self.pending.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Whether sends are still in flight.
    pub fn sending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// A message under `tag` from anyone, if one has arrived: its source and
    /// bytes.
    pub fn try_receive(&mut self, tag: c_int) -> Result<Option<(Rank, Vec<u8>)>> {
        self.receive(tag, false)
    }

    /// The next message under `tag` from anyone, waiting in MPI for it
    /// (`MPI_Mprobe`, which also drives this rank's sends in flight);
    /// `None` if a process died meanwhile (failures survived in place).
    pub fn receive_blocking(&mut self, tag: c_int) -> Result<Option<(Rank, Vec<u8>)>> {
        self.receive(tag, true)
    }

    fn receive(&mut self, tag: c_int, blocking: bool) -> Result<Option<(Rank, Vec<u8>)>> {
        // SAFETY: out-parameters valid for writes; the matched message is
        // received into a buffer of exactly its size, whose length is set
        // once MPI has written it.
        unsafe {
            let mut msg: ffi::MPI_Message = std::mem::zeroed();
            let mut status: ffi::MPI_Status = std::mem::zeroed();
            if blocking {
                let rc =
                    ffi::MPI_Mprobe(ffi::RSMPI_ANY_SOURCE, tag, self.comm, &mut msg, &mut status);
                if self.lost(rc) {
                    return Ok(None);
                }
                check(rc, "MPI_Mprobe")?;
            } else {
                let mut flag: c_int = 0;
                let rc = ffi::MPI_Improbe(
                    ffi::RSMPI_ANY_SOURCE,
                    tag,
                    self.comm,
                    &mut flag,
                    &mut msg,
                    &mut status,
                );
                if self.lost(rc) {
                    return Ok(None);
                }
                check(rc, "MPI_Improbe")?;
                if flag == 0 {
                    return Ok(None);
                }
            }
            let mut count: c_int = 0;
            check(
                ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count),
                "MPI_Get_count",
            )?;
            let n = count.max(0) as usize;
            let mut buf: Vec<u8> = Vec::with_capacity(n);
            let rc = ffi::MPI_Mrecv(
                buf.as_mut_ptr().cast(),
                count,
                ffi::RSMPI_UINT8_T,
                &mut msg,
                &mut status,
            );
            if self.lost(rc) {
                return Ok(None);
            }
            check(rc, "MPI_Mrecv")?;
            buf.set_len(n);
            let from = status.MPI_SOURCE;
            // An empty message is a switch marker (`ulfm`), not a frame.
            if tag == TAG_FRAME && n > 0 && !self.receive_parts(from, &mut buf)? {
                // Its sender died before sending all of it.
                return Ok(None);
            }
            Ok(Some((from as Rank, buf)))
        }
    }

    /// The rest of a frame whose head is `buf`, received into it from its
    /// sender's [`TAG_PART`] messages (sent right after the head): the
    /// length prefix says how long the frame is. False if the sender died
    /// before all of it came.
    fn receive_parts(&mut self, from: c_int, buf: &mut Vec<u8>) -> Result<bool> {
        let total = match buf.get(..4).and_then(|b| b.try_into().ok()) {
            Some(b) if u32::from_le_bytes(b) == crate::driver::processes::wire::LONG_LEN => buf
                .get(4..12)
                .and_then(|b| b.try_into().ok())
                .map(|b| u64::from_le_bytes(b) as usize + 12),
            Some(b) => Some(u32::from_le_bytes(b) as usize + 4),
            None => None,
        }
        .ok_or_else(|| Error::Driver(format!("rank {from} sent a frame without its length")))?;
        if total > buf.len() {
            buf.reserve_exact(total - buf.len());
        }
        while buf.len() < total {
            let want = (total - buf.len()).min(MAX_PART);
            // SAFETY: `want` bytes of spare capacity at the end of `buf`
            // receive the part; the length grows by what MPI wrote.
            unsafe {
                let mut status: ffi::MPI_Status = std::mem::zeroed();
                let rc = ffi::MPI_Recv(
                    buf.as_mut_ptr().add(buf.len()).cast(),
                    want as c_int,
                    ffi::RSMPI_UINT8_T,
                    from,
                    TAG_PART,
                    self.comm,
                    &mut status,
                );
                if self.lost(rc) {
                    return Ok(false);
                }
                check(rc, "MPI_Recv")?;
                let mut count: c_int = 0;
                check(
                    ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count),
                    "MPI_Get_count",
                )?;
                if count <= 0 {
                    return Err(Error::Driver(format!(
                        "rank {from} sent an empty part of a frame"
                    )));
                }
                buf.set_len(buf.len() + count as usize);
            }
        }
        Ok(true)
    }

    /// Rank `root`'s `bytes` on every rank.
    pub fn broadcast(&mut self, root: Rank, bytes: Vec<u8>) -> Result<Vec<u8>> {
        // SAFETY: our live communicator, on which every rank calls this.
        unsafe { bcast(self.comm, root as c_int, self.rank == root, bytes) }
    }

    /// Every rank's `mine`, by rank.
    pub fn all_gather(&mut self, mine: [u64; 2]) -> Result<Vec<[u64; 2]>> {
        // SAFETY: our live communicator, on which every rank calls this.
        unsafe { all_gather(self.comm, mine) }
    }

    /// Wait for every rank (`MPI_Barrier`), before any frame is sent.
    pub fn barrier(&mut self) -> Result<()> {
        // SAFETY: a live communicator.
        unsafe { check(ffi::MPI_Barrier(self.comm), "MPI_Barrier") }
    }

    /// At the job's end: wait for every send in flight, then for every rank (a nonblocking
    /// barrier), taking in and dropping whatever frames still arrive
    /// meanwhile: a rank that ended early (an error) reads no more, so a
    /// large send to it completes only if it drains them too.
    pub fn settle(&mut self) -> Result<()> {
        let drain = |t: &mut Self| -> Result<()> {
            t.progress()?;
            while t.try_receive(TAG_FRAME)?.is_some() {}
            Ok(())
        };
        while self.sending() {
            drain(self)?;
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        // SAFETY: a live communicator; `req` valid for writes and tested
        // until complete.
        unsafe {
            let mut req: ffi::MPI_Request = std::mem::zeroed();
            check(ffi::MPI_Ibarrier(self.comm, &mut req), "MPI_Ibarrier")?;
            loop {
                let mut done: c_int = 0;
                check(
                    ffi::MPI_Test(&mut req, &mut done, ffi::RSMPI_STATUS_IGNORE),
                    "MPI_Test",
                )?;
                if done != 0 {
                    return Ok(());
                }
                drain(self)?;
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }
}

/// Rank `root`'s `bytes` on every process of `comm` (`MPI_Bcast` of the
/// length, then of the bytes); `am_root`: this process is `root`.
///
/// # Safety
/// `comm` is a live communicator on which every process calls this.
pub(super) unsafe fn bcast(
    comm: ffi::MPI_Comm,
    root: c_int,
    am_root: bool,
    bytes: Vec<u8>,
) -> Result<Vec<u8>> {
    let mut len = bytes.len() as u64;
    // SAFETY: buffers valid for the given counts on every process.
    unsafe {
        check(
            ffi::MPI_Bcast(
                (&mut len as *mut u64).cast(),
                8,
                ffi::RSMPI_UINT8_T,
                root,
                comm,
            ),
            "MPI_Bcast",
        )?;
        let mut buf = if am_root {
            bytes
        } else {
            vec![0u8; len as usize]
        };
        let count = c_int::try_from(len)
            .map_err(|_| Error::Driver("a broadcast of 2 GiB or more".into()))?;
        check(
            ffi::MPI_Bcast(
                buf.as_mut_ptr().cast(),
                count,
                ffi::RSMPI_UINT8_T,
                root,
                comm,
            ),
            "MPI_Bcast",
        )?;
        Ok(buf)
    }
}

/// Every process's `mine` on `comm`, by rank.
///
/// # Safety
/// `comm` is a live communicator on which every process calls this.
pub(super) unsafe fn all_gather(comm: ffi::MPI_Comm, mine: [u64; 2]) -> Result<Vec<[u64; 2]>> {
    // SAFETY: the caller's live communicator; buffers of the given counts.
    unsafe {
        let mut size: c_int = 0;
        check(ffi::MPI_Comm_size(comm, &mut size), "MPI_Comm_size")?;
        let mut all = vec![[0u64; 2]; size.max(0) as usize];
        check(
            ffi::MPI_Allgather(
                mine.as_ptr().cast(),
                16,
                ffi::RSMPI_UINT8_T,
                all.as_mut_ptr().cast(),
                16,
                ffi::RSMPI_UINT8_T,
                comm,
            ),
            "MPI_Allgather",
        )?;
        Ok(all)
    }
}

/// End the whole MPI job now (`MPI_Abort`): what a rank does when the job
/// cannot go on and the others may not hear of it otherwise.
#[cfg(feature = "ulfm")]
pub(super) fn abort_job(why: &Error) -> ! {
    tracing::error!("lazarus: {why}; aborting the MPI job");
    // SAFETY: MPI is initialised; MPI_Abort does not return.
    unsafe {
        ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1);
    }
    std::process::exit(1)
}

impl Drop for Transport {
    fn drop(&mut self) {
        // A send still in flight (a job ended by an error) may still read
        // its buffer: leak it rather than free memory MPI uses.
        for (_, held) in self.pending.drain(..) {
            std::mem::forget(held);
        }
        // SAFETY: our communicator, freed once.
        unsafe {
            ffi::MPI_Comm_free(&mut self.comm);
        }
    }
}
