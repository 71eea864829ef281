//! In-place recovery on ULFM (the `ulfm` feature: Open MPI 5 built with
//! it, run under `mpiexec --with-ft ulfm`): the repair of 002 §3.2.
//!
//! When a process of the job dies, every survivor's next MPI call on the
//! backend's communicator fails with `MPIX_ERR_PROC_FAILED`
//! ([`Transport::lost`]). Each survivor then repairs it, collectively with
//! the others: acknowledge the failure, shrink the communicator to the
//! survivors (which agrees on who died), spawn one substitute per dead
//! process (`MPI_Comm_spawn` of this same program), merge the two groups
//! and reorder them (`MPI_Comm_split` keyed by rank number) so that each
//! substitute takes the number of the rank it replaces. The run's protocol
//! then recovers exactly as on the processes backend: the survivors are
//! told of the failure (`Incoming::FailureNotice`), the substitutes start
//! as replacements in the new epoch.
//!
//! The communicator is not revoked: a survivor's frames to another
//! survivor are not lost with the old communicator (the logging protocols
//! do not resend them). Each survivor ends the old communicator with an
//! empty message to every other survivor, a marker sent after its last
//! frame there, and reads the old communicator until every other
//! survivor's marker has come; frames on the new one are all sent after
//! the markers, so every channel stays FIFO across the repair.
#![allow(unsafe_code)]

use std::ffi::{CString, OsString};
use std::os::raw::{c_char, c_int};
use std::os::unix::ffi::OsStrExt;

use mpi::ffi;

use super::transport::{TAG_FRAME, Transport, all_gather, bcast, check};
use crate::{Error, Rank, Result};

unsafe extern "C" {
    fn MPIX_Comm_failure_ack(comm: ffi::MPI_Comm) -> c_int;
    fn MPIX_Comm_failure_get_acked(comm: ffi::MPI_Comm, failed: *mut ffi::MPI_Group) -> c_int;
    fn MPIX_Comm_shrink(comm: ffi::MPI_Comm, newcomm: *mut ffi::MPI_Comm) -> c_int;
}

/// Whether MPI error code `rc` says a process died, or the communicator was
/// revoked.
pub(super) fn is_failure(rc: c_int) -> bool {
    let mut class: c_int = 0;
    // SAFETY: an out-parameter valid for writes.
    if unsafe { ffi::MPI_Error_class(rc, &mut class) } != ffi::MPI_SUCCESS as c_int {
        return false;
    }
    [
        ffi::MPI_ERR_PROC_FAILED,
        ffi::MPI_ERR_PROC_FAILED_PENDING,
        ffi::MPI_ERR_REVOKED,
    ]
    .contains(&(class as u32))
}

/// What a repair of the communicator leaves the endpoint.
pub(super) struct Repair {
    /// The ranks that died, in order; their substitutes have their numbers.
    pub dead: Vec<Rank>,
    /// Frames the other survivors sent on the old communicator before
    /// their markers, not yet read: to be handled before anything newer.
    pub drained: Vec<(Rank, Vec<u8>)>,
    /// Every rank's `[host hash, process id]`, substitutes included.
    pub peers: Vec<[u64; 2]>,
}

/// What a substitute learns when it joins the job.
pub(super) struct Joined {
    /// Its transport, on the repaired communicator, with its rank's number.
    pub net: Transport,
    /// The lowest survivor's account of the job (the endpoint's `Resume`).
    pub resume: Vec<u8>,
    /// Every rank's `[host hash, process id]`.
    pub peers: Vec<[u64; 2]>,
}

impl Transport {
    /// Repair the communicator after a process died (a survivor's part).
    /// `resume` tells the substitutes what they need to know, given the
    /// dead ranks (the lowest survivor's is what they get); `me` is this
    /// process's `[host hash, process id]`.
    pub(super) fn repair(
        &mut self,
        me: [u64; 2],
        resume: impl FnOnce(&[Rank]) -> Vec<u8>,
    ) -> Result<Repair> {
        // SAFETY: MPI calls on live communicators and groups, with
        // out-parameters valid for writes; each handle made here is freed
        // once.
        unsafe {
            check(MPIX_Comm_failure_ack(self.comm), "MPIX_Comm_failure_ack")?;
            self.failed = false;
            let mut shrunk: ffi::MPI_Comm = std::mem::zeroed();
            check(MPIX_Comm_shrink(self.comm, &mut shrunk), "MPIX_Comm_shrink")?;
            let alive = members_in(shrunk, self.comm)?;
            let dead: Vec<Rank> = (0..self.size).filter(|r| !alive.contains(r)).collect();
            if dead.is_empty() {
                ffi::MPI_Comm_free(&mut shrunk);
                return Ok(Repair {
                    dead,
                    drained: Vec::new(),
                    peers: Vec::new(),
                });
            }
            let inter = spawn(shrunk, dead.len())?;
            let mut merged: ffi::MPI_Comm = std::mem::zeroed();
            check(
                ffi::MPI_Intercomm_merge(inter, 0, &mut merged),
                "MPI_Intercomm_merge",
            )?;
            // Merged rank 0 is the lowest survivor (survivors first).
            let root = alive.first() == Some(&self.rank);
            let names: Vec<u64> = dead.iter().map(|&d| d as u64).collect();
            bcast(merged, 0, root, postcard::to_allocvec(&names)?)?;
            bcast(merged, 0, root, resume(&dead))?;
            let next = reorder(merged, self.rank)?;
            let peers = all_gather(next, me)?;
            let mut inter = inter;
            check(ffi::MPI_Comm_disconnect(&mut inter), "MPI_Comm_disconnect")?;
            let drained = self.drain(&alive)?;
            ffi::MPI_Comm_free(&mut self.comm);
            ffi::MPI_Comm_free(&mut merged);
            ffi::MPI_Comm_free(&mut shrunk);
            self.comm = next;
            super::REPAIRED.store(true, std::sync::atomic::Ordering::Relaxed);
            check(
                ffi::MPI_Comm_set_errhandler(next, ffi::RSMPI_ERRORS_RETURN),
                "MPI_Comm_set_errhandler",
            )?;
            Ok(Repair {
                dead,
                drained,
                peers,
            })
        }
    }

    /// The ranks known dead on the communicator (acknowledging those
    /// noticed since the last look).
    fn failed_ranks(&mut self) -> Result<Vec<Rank>> {
        // SAFETY: a live communicator; the groups made here are freed.
        unsafe {
            check(MPIX_Comm_failure_ack(self.comm), "MPIX_Comm_failure_ack")?;
            let mut failed: ffi::MPI_Group = std::mem::zeroed();
            check(
                MPIX_Comm_failure_get_acked(self.comm, &mut failed),
                "MPIX_Comm_failure_get_acked",
            )?;
            let mut all: ffi::MPI_Group = std::mem::zeroed();
            check(ffi::MPI_Comm_group(self.comm, &mut all), "MPI_Comm_group")?;
            let ranks = translate(failed, all);
            ffi::MPI_Group_free(&mut failed);
            ffi::MPI_Group_free(&mut all);
            ranks
        }
    }

    /// Send every other survivor of `alive` the marker that ends this
    /// process's frames on the old communicator, and read it until every
    /// other survivor's marker has come; then wait for this process's
    /// sends there. A survivor that dies before its marker came ends the
    /// repair with an error (one failure event at a time); one that dies
    /// after is repaired on the new communicator, which reports it too.
    fn drain(&mut self, alive: &[Rank]) -> Result<Vec<(Rank, Vec<u8>)>> {
        let me = self.rank;
        for &r in alive.iter().filter(|&&r| r != me) {
            self.isend(r, TAG_FRAME, Vec::new())?;
        }
        let mut marked = vec![false; self.size];
        marked[self.rank] = true;
        let mut missing = alive.len() - 1;
        let mut drained = Vec::new();
        while missing > 0 || !self.pending.is_empty() {
            self.progress()?;
            match self.try_receive(TAG_FRAME)? {
                Some((from, buf)) if buf.is_empty() => {
                    if from < self.size && !marked[from] {
                        marked[from] = true;
                        missing -= 1;
                    }
                }
                Some(frame) => drained.push(frame),
                None => {
                    if self.failed {
                        self.failed = false;
                        let dead = self.failed_ranks()?;
                        // Those of this failure event are known dead
                        // too: only a survivor's missing marker matters.
                        if let Some(d) = dead.iter().find(|&&d| alive.contains(&d) && !marked[d]) {
                            return Err(Error::Driver(format!(
                                "rank {d} died while the communicator was being repaired: \
                                 the mpi backend survives one failure event at a time"
                            )));
                        }
                    }
                    std::thread::yield_now();
                }
            }
        }
        self.failed = false;
        Ok(drained)
    }
}

/// This process is a substitute spawned by a repair: join the job and take
/// the number of the rank it replaces. `None` if it was not spawned.
pub(super) fn join(me: [u64; 2]) -> Result<Option<Joined>> {
    // SAFETY: MPI is initialised; out-parameters valid for writes; each
    // handle made here is freed once, or owned by the transport.
    unsafe {
        let mut parent: ffi::MPI_Comm = std::mem::zeroed();
        check(ffi::MPI_Comm_get_parent(&mut parent), "MPI_Comm_get_parent")?;
        if parent == ffi::RSMPI_COMM_NULL {
            return Ok(None);
        }
        check(
            ffi::MPI_Comm_set_errhandler(parent, ffi::RSMPI_ERRORS_RETURN),
            "MPI_Comm_set_errhandler",
        )?;
        let mut merged: ffi::MPI_Comm = std::mem::zeroed();
        check(
            ffi::MPI_Intercomm_merge(parent, 1, &mut merged),
            "MPI_Intercomm_merge",
        )?;
        let mut index: c_int = 0;
        check(
            ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut index),
            "MPI_Comm_rank",
        )?;
        let names: Vec<u64> = postcard::from_bytes(&bcast(merged, 0, false, Vec::new())?)?;
        let resume = bcast(merged, 0, false, Vec::new())?;
        let rank = names
            .get(index as usize)
            .map(|&r| r as Rank)
            .ok_or_else(|| Error::Driver("a substitute with no rank to take".into()))?;
        let next = reorder(merged, rank)?;
        let peers = all_gather(next, me)?;
        check(ffi::MPI_Comm_disconnect(&mut parent), "MPI_Comm_disconnect")?;
        ffi::MPI_Comm_free(&mut merged);
        let net = Transport::on(next, true)?;
        super::REPAIRED.store(true, std::sync::atomic::Ordering::Relaxed);
        if net.rank() != rank {
            return Err(Error::Driver(format!(
                "the substitute for rank {rank} became rank {}",
                net.rank()
            )));
        }
        Ok(Some(Joined { net, resume, peers }))
    }
}

/// The ranks in `of` of the members of `sub`, in `sub`'s order.
unsafe fn members_in(sub: ffi::MPI_Comm, of: ffi::MPI_Comm) -> Result<Vec<Rank>> {
    // SAFETY: the caller's live communicators; groups freed here.
    unsafe {
        let (mut gs, mut go): (ffi::MPI_Group, ffi::MPI_Group) =
            (std::mem::zeroed(), std::mem::zeroed());
        check(ffi::MPI_Comm_group(sub, &mut gs), "MPI_Comm_group")?;
        check(ffi::MPI_Comm_group(of, &mut go), "MPI_Comm_group")?;
        let ranks = translate(gs, go);
        ffi::MPI_Group_free(&mut gs);
        ffi::MPI_Group_free(&mut go);
        ranks
    }
}

/// The ranks in group `to` of the members of group `from`, in `from`'s
/// order (members not in `to` left out).
unsafe fn translate(from: ffi::MPI_Group, to: ffi::MPI_Group) -> Result<Vec<Rank>> {
    // SAFETY: the caller's live groups; buffers of the group's size.
    unsafe {
        let mut n: c_int = 0;
        check(ffi::MPI_Group_size(from, &mut n), "MPI_Group_size")?;
        let ranks: Vec<c_int> = (0..n).collect();
        let mut there = vec![0 as c_int; ranks.len()];
        check(
            ffi::MPI_Group_translate_ranks(from, n, ranks.as_ptr(), to, there.as_mut_ptr()),
            "MPI_Group_translate_ranks",
        )?;
        Ok(there
            .into_iter()
            .filter(|&r| r >= 0)
            .map(|r| r as Rank)
            .collect())
    }
}

/// Spawn `count` substitutes (this program, with its arguments) from the
/// survivors' communicator `comm`.
unsafe fn spawn(comm: ffi::MPI_Comm, count: usize) -> Result<ffi::MPI_Comm> {
    let cstr =
        |s: &[u8]| CString::new(s).map_err(|_| Error::Driver("an argument with a NUL byte".into()));
    let program = std::env::current_exe()
        .map_err(|e| Error::Driver(format!("cannot find this program to spawn it: {e}")))?;
    let program = cstr(program.as_os_str().as_bytes())?;
    let args = std::env::args_os()
        .skip(1)
        .map(|a: OsString| cstr(a.as_bytes()))
        .collect::<Result<Vec<_>>>()?;
    let mut argv: Vec<*mut c_char> = args.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    // The substitutes' environment is the launcher's (Open MPI starts them
    // from the daemons `mpiexec` started), where `lazarus::run`'s own
    // launcher put its `LAZARUS_*` variables.
    // SAFETY: C strings and the NULL-terminated argument vector live until
    // the call returns; out-parameters valid for writes.
    unsafe {
        let mut inter: ffi::MPI_Comm = std::mem::zeroed();
        let mut errs = vec![0 as c_int; count];
        let rc = ffi::MPI_Comm_spawn(
            program.as_ptr(),
            argv.as_mut_ptr(),
            count as c_int,
            ffi::RSMPI_INFO_NULL,
            0,
            comm,
            &mut inter,
            errs.as_mut_ptr(),
        );
        check(rc, "MPI_Comm_spawn")?;
        if let Some(e) = errs.iter().find(|&&e| e != ffi::MPI_SUCCESS as c_int) {
            return Err(Error::Driver(format!(
                "a substitute could not be spawned (MPI error {e})"
            )));
        }
        Ok(inter)
    }
}

/// `merged`'s processes reordered so that each has the number `rank`.
unsafe fn reorder(merged: ffi::MPI_Comm, rank: Rank) -> Result<ffi::MPI_Comm> {
    // SAFETY: the caller's live communicator; out-parameter valid.
    unsafe {
        let mut next: ffi::MPI_Comm = std::mem::zeroed();
        check(
            ffi::MPI_Comm_split(merged, 0, rank as c_int, &mut next),
            "MPI_Comm_split",
        )?;
        Ok(next)
    }
}
