//! A rank's [`Endpoint`] on MPI: frames, one-sided operations and their
//! replies as MPI messages on the backend's communicator.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::transport::{TAG_FRAME, Transport};
use crate::driver::processes::wire::{self, RmaRequest, WireMsg};
use crate::driver::shared::{SPIN_YIELDS, Slot, WAIT_SPIN, WindowRegistry, Yielding};
use crate::driver::{Endpoint, RmaOp, RmaReply, Stat, WinId};
use crate::engine::frame::{Frame, Incoming};
use crate::fault::{FaultPlan, FaultPoint};
use crate::{Error, Rank, Result};

/// Longest nap of a waiting rank between looks at MPI: MPI has no wait
/// for "any message or a deadline", so a rank that found nothing after
/// spinning and yielding sleeps in growing naps up to this.
const MAX_NAP: Duration = Duration::from_millis(1);

/// Longest nap while this rank's own sends are in flight: a large one
/// moves only while its sender calls MPI.
const SENDING_NAP: Duration = Duration::from_micros(50);

/// What a rank's process knows of another, to carry out a kill of the
/// fault plan (a real `SIGKILL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Peer {
    /// A hash of the host's name: equal on one host.
    pub host: u64,
    /// Its process id.
    pub pid: u32,
}

/// A failure event survived in place: its world epoch, the ranks that
/// died, and when a survivor noticed it (since the job's start).
pub(super) type FailureEvent = (u64, Vec<Rank>, Duration);

/// What a rank's endpoint leaves behind for the job's report.
#[derive(Default)]
pub(super) struct Book {
    stats: Vec<(Duration, Stat)>,
    /// Kill specifications fired (by this rank or an earlier attempt).
    fired: Vec<usize>,
    /// The failure events survived in place (ULFM), as this rank knows
    /// them.
    failures: Vec<FailureEvent>,
}

impl Book {
    /// The statistics recorded, the kills fired and the failure events.
    pub fn take(&self) -> (Vec<(Duration, Stat)>, Vec<usize>, Vec<FailureEvent>) {
        (
            self.stats.clone(),
            self.fired.clone(),
            self.failures.clone(),
        )
    }
}

/// What the survivors tell the substitutes a repair spawned (ULFM): where
/// the job is, so that each starts as a replacement of its rank.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Resume {
    /// The world epoch the substitutes start in (0: not a substitute).
    pub epoch: u64,
    /// Kill specifications that fired: none fires again.
    pub fired: Vec<usize>,
    /// The failure events so far, this one included.
    pub failures: Vec<FailureEvent>,
    /// Time since the job started.
    pub elapsed: Duration,
    /// The generation the job started from (`Config::restart_generation`).
    pub restart_generation: Option<u64>,
}

/// One rank of an MPI job.
pub(super) struct MpiEndpoint {
    /// Shared with the job's end, which gathers the reports over it.
    net: Rc<RefCell<Transport>>,
    rank: Rank,
    size: usize,
    /// Arrivals not yet handed to the engine.
    ready: VecDeque<Incoming>,
    /// Replies to this rank's one-sided requests, by request id.
    replies: HashMap<u64, Result<RmaReply>>,
    /// The target of each request not answered yet: a request to a rank
    /// that dies is answered by its death.
    asked: HashMap<u64, Rank>,
    /// The world epoch: failure events survived so far (ULFM).
    epoch: u64,
    /// The epoch this incarnation started in (a substitute's, else 0).
    start_epoch: u64,
    /// For the substitutes of a repair.
    #[cfg_attr(not(feature = "ulfm"), allow(dead_code))]
    restart_generation: Option<u64>,
    next_request: u64,
    windows: WindowRegistry,
    slot: Arc<Slot>,
    t0: Instant,
    plan: FaultPlan,
    armed: bool,
    /// Every rank's host and process, for kills.
    peers: Vec<Peer>,
    /// Where a fired kill is written down (its index), so that the job's
    /// restart does not fire it again.
    fired_file: Option<std::path::PathBuf>,
    book: Rc<RefCell<Book>>,
    max_frame: usize,
    spin: bool,
    yielding: Yielding,
    encoded: Vec<u8>,
}

impl MpiEndpoint {
    /// The endpoint of this process's rank; `start` is where a substitute
    /// starts (the default for the job's first processes).
    pub(super) fn new(
        net: Rc<RefCell<Transport>>,
        mut plan: FaultPlan,
        peers: Vec<Peer>,
        fired_file: Option<std::path::PathBuf>,
        (max_frame, host_ranks): (usize, usize),
        start: Resume,
    ) -> Self {
        let (rank, size) = {
            let n = net.borrow();
            (n.rank(), n.size())
        };
        for &k in &start.fired {
            plan.mark_fired(k);
        }
        let armed = plan.armed_for(rank);
        let book = Book {
            failures: start.failures,
            ..Book::default()
        };
        MpiEndpoint {
            net,
            rank,
            size,
            ready: VecDeque::new(),
            replies: HashMap::new(),
            asked: HashMap::new(),
            epoch: start.epoch,
            start_epoch: start.epoch,
            restart_generation: start.restart_generation,
            next_request: 0,
            windows: WindowRegistry::default(),
            slot: Slot::new(start.epoch),
            t0: Instant::now()
                .checked_sub(start.elapsed)
                .unwrap_or_else(Instant::now),
            plan,
            armed,
            peers,
            fired_file,
            book: Rc::new(RefCell::new(book)),
            max_frame,
            spin: crate::driver::shared::core_per_rank(host_ranks),
            yielding: Yielding::new(host_ranks),
            encoded: Vec::new(),
        }
    }

    /// What the job's report needs of this rank, kept after the engine
    /// drops the endpoint.
    pub(super) fn book(&self) -> Rc<RefCell<Book>> {
        self.book.clone()
    }

    fn post(&mut self, dest: Rank, msg: &WireMsg) -> Result<()> {
        post_with(
            &mut self.net.borrow_mut(),
            dest,
            msg,
            self.max_frame,
            &mut self.encoded,
        )
    }

    /// [`MpiEndpoint::post`] of a small message as a synchronous send:
    /// complete once `dest` has matched it.
    fn post_sync(&mut self, dest: Rank, msg: &WireMsg) -> Result<()> {
        let parts = wire::encode_into(msg, self.max_frame, &mut self.encoded)
            .map_err(|e| Error::Driver(format!("frame for rank {dest}: {e}")))?;
        if !parts.is_empty() {
            return Err(Error::Driver("a synchronous send of a large frame".into()));
        }
        self.net
            .borrow_mut()
            .issend(dest, TAG_FRAME, std::mem::take(&mut self.encoded))
    }

    /// Take in what has arrived (serving one-sided requests at once) until
    /// the engine has something, or nothing more is there. Returns whether
    /// anything arrived.
    fn pump(&mut self) -> Result<bool> {
        self.net.borrow_mut().progress()?;
        self.repair_if_failed()?;
        // Until a frame for the engine came in this call, or nothing is
        // there: a rank waiting for a reply may have frames queued already,
        // and must still read on.
        let queued = self.ready.len();
        let mut any = false;
        while self.ready.len() == queued {
            let Some((from, buf)) = self.net.borrow_mut().try_receive(TAG_FRAME)? else {
                break;
            };
            any = true;
            self.handle(from, buf)?;
        }
        self.repair_if_failed()?;
        Ok(any)
    }

    /// A process of the job died (an MPI call said so): repair the
    /// communicator with the other survivors and a substitute for each
    /// dead rank ([`super::ulfm`]), then tell the engine, after the frames
    /// the survivors sent before the repair.
    fn repair_if_failed(&mut self) -> Result<()> {
        if !self.net.borrow().failed {
            return Ok(());
        }
        #[cfg(feature = "ulfm")]
        {
            let me = [
                self.peers[self.rank].host,
                u64::from(self.peers[self.rank].pid),
            ];
            let epoch = self.epoch + 1;
            let at = self.now();
            let mut fired = self.plan.fired();
            fired.extend(self.book.borrow().fired.iter().copied());
            let failures = self.book.borrow().failures.clone();
            let restart_generation = self.restart_generation;
            let t0 = self.t0;
            let resume = |dead: &[Rank]| {
                let mut failures = failures;
                failures.push((epoch, dead.to_vec(), at));
                postcard::to_allocvec(&Resume {
                    epoch,
                    fired,
                    failures,
                    elapsed: t0.elapsed(),
                    restart_generation,
                })
                .unwrap_or_default()
            };
            // A repair that fails leaves the survivors on communicators
            // that no longer agree: end the job (a launcher starts it
            // again from its checkpoints, as without ULFM).
            let repair = self
                .net
                .borrow_mut()
                .repair(me, resume)
                .unwrap_or_else(|e| super::transport::abort_job(&e));
            if repair.dead.is_empty() {
                return Ok(());
            }
            tracing::info!(
                rank = self.rank,
                epoch,
                "lazarus: rank {}: rank(s) {} died; substitutes spawned (ULFM)",
                self.rank,
                crate::error::list(&repair.dead)
            );
            self.epoch = epoch;
            self.book
                .borrow_mut()
                .failures
                .push((epoch, repair.dead.clone(), at));
            self.peers = repair
                .peers
                .iter()
                .map(|p| Peer {
                    host: p[0],
                    pid: p[1] as u32,
                })
                .collect();
            for (from, buf) in repair.drained {
                self.handle(from, buf)?;
            }
            // Requests to a dead rank are answered by its death, as on
            // the other backends.
            let dead = &repair.dead;
            let lost: Vec<u64> = self
                .asked
                .iter()
                .filter(|(_, t)| dead.contains(t))
                .map(|(&id, _)| id)
                .collect();
            for id in lost {
                let target = self.asked.remove(&id).unwrap_or_default();
                self.replies.insert(
                    id,
                    Err(Error::Driver(format!(
                        "rank {target} died before answering a one-sided request"
                    ))),
                );
            }
            self.ready.push_back(Incoming::FailureNotice {
                epoch,
                dead: repair.dead,
            });
            Ok(())
        }
        #[cfg(not(feature = "ulfm"))]
        Err(Error::Driver(
            "a process of the MPI job died, and this lazarus was built without ULFM".into(),
        ))
    }

    /// Deliver what `from` sent: a frame to the engine, a one-sided
    /// request applied and answered at once, a reply kept for its origin.
    fn handle(&mut self, from: Rank, buf: Vec<u8>) -> Result<()> {
        match decode(from, buf)? {
            WireMsg::Frame(f) => self.ready.push_back(Incoming::Frame(f)),
            WireMsg::Rma(req) => {
                let reply = self.windows.rma(req.epoch, self.rank, req.window, req.op);
                self.post(from, &WireMsg::RmaDone { id: req.id, reply })?;
            }
            WireMsg::RmaDone { id, reply } => {
                self.asked.remove(&id);
                self.replies.insert(id, reply);
            }
            WireMsg::KillFired { index } => {
                self.plan.mark_fired(index);
                self.armed = self.plan.armed_for(self.rank);
            }
            WireMsg::Abort { rank, reason } => {
                self.ready.push_back(Incoming::Abort { rank, reason });
            }
            other => {
                return Err(Error::Driver(format!(
                    "rank {from} sent an unexpected {other:?}"
                )));
            }
        }
        Ok(())
    }

    /// Wait until `until` holds or `deadline` passes. With a core of its
    /// own, no deadline and a host not busier than its ranks
    /// ([`Yielding`]), the rank waits inside MPI (`MPI_Mprobe`: MPI's
    /// own polling, which also moves this rank's large sends along, as a
    /// C program's blocking receive does). Otherwise (more ranks than
    /// cores, where a spinning MPI would hold the core the awaited rank
    /// needs, or a deadline) it looks, yields while [`Yielding`] allows,
    /// and naps, briefly while its own sends are still in flight (their
    /// rendezvous needs its calls).
    fn wait(&mut self, until: impl Fn(&Self) -> bool, deadline: Option<Instant>) -> Result<bool> {
        let start = Instant::now();
        let mut yields = 0;
        let mut nap = Duration::from_micros(10);
        loop {
            if self.pump()? {
                nap = Duration::from_micros(10);
            }
            if until(self) {
                return Ok(true);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(false);
            }
            // Not on a busy host: MPI's polling would hold a core that
            // other work (or the awaited rank) needs.
            if self.spin && deadline.is_none() && self.yielding.may(now) {
                // None: a process died; the next pump repairs.
                let got = self.net.borrow_mut().receive_blocking(TAG_FRAME)?;
                if let Some((from, buf)) = got {
                    self.handle(from, buf)?;
                }
                continue;
            }
            if self.spin && now - start < WAIT_SPIN {
                std::hint::spin_loop();
                continue;
            }
            if yields < SPIN_YIELDS && self.yielding.may(now) {
                yields += 1;
                std::thread::yield_now();
                continue;
            }
            let most = if self.net.borrow().sending() {
                SENDING_NAP
            } else {
                MAX_NAP
            };
            let sleep = deadline.map_or(nap, |d| nap.min(d - now));
            std::thread::sleep(sleep);
            nap = (nap * 2).min(most);
        }
    }

    /// A kill of the fault plan fired: write it down for the restart, then
    /// kill its victims with `SIGKILL` (this rank last).
    fn fire(&mut self, index: usize, victims: &[Rank]) -> Result<()> {
        let me = self.rank;
        if let Some(path) = &self.fired_file {
            use std::io::Write;
            let line = format!(
                "{index} {}\n",
                victims
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            );
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| f.write_all(line.as_bytes()).and_then(|()| f.sync_all()));
            if let Err(e) = written {
                return Err(Error::Driver(format!(
                    "cannot record the kill in {}: {e}",
                    path.display()
                )));
            }
        }
        if self.net.borrow().in_place {
            // The trigger dies with its kill (it is a victim): every other
            // rank must know it fired, so that no substitute fires it
            // again. Synchronous sends: matched before the kill.
            for r in (0..self.size).filter(|&r| r != me) {
                self.post_sync(r, &WireMsg::KillFired { index })?;
            }
            self.wait(|me| !me.net.borrow().sending(), None)?;
        }
        let here = self.peers[me].host;
        for &v in victims.iter().filter(|&&v| v != me) {
            let p = self.peers[v];
            if p.host != here {
                return Err(Error::Driver(format!(
                    "the fault plan kills rank {v}, on another host: the mpi backend kills \
                     processes of its own host only"
                )));
            }
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if victims.contains(&me) {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        // A node kill whose trigger survives: the job ends with its victims.
        Ok(())
    }
}

impl Drop for MpiEndpoint {
    fn drop(&mut self) {
        self.book.borrow_mut().fired = self.plan.fired();
    }
}

/// Encode `msg` and start sending it to `dest`: the head (header, and a
/// payload small enough to travel inline) in one buffer, a large payload
/// from its own shared buffer.
pub(super) fn post_with(
    net: &mut Transport,
    dest: Rank,
    msg: &WireMsg,
    max_frame: usize,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    let parts = wire::encode_into(msg, max_frame, scratch)
        .map_err(|e| Error::Driver(format!("frame for rank {dest}: {e}")))?;
    net.isend_frame(dest, std::mem::take(scratch), parts)
}

/// A received MPI message back to what it carries.
fn decode(from: Rank, buf: Vec<u8>) -> Result<WireMsg> {
    let bad = |e: &dyn std::fmt::Display| Error::Driver(format!("from rank {from}: {e}"));
    let prefix = match buf.get(..4).and_then(|b| b.try_into().ok()) {
        Some(b) if u32::from_le_bytes(b) == wire::LONG_LEN => wire::LONG_PREFIX,
        Some(_) => 4,
        None => return Err(bad(&"a message shorter than its length")),
    };
    if buf.len() < prefix {
        return Err(bad(&"a message shorter than its length"));
    }
    wire::decode(bytes::Bytes::from(buf).slice(prefix..)).map_err(|e| bad(&e))
}

impl Endpoint for MpiEndpoint {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn start_epoch(&self) -> u64 {
        self.start_epoch
    }

    fn send(&mut self, dest: Rank, frame: Frame) -> Result<()> {
        if dest >= self.size {
            return Err(Error::RankOutOfRange {
                rank: dest,
                size: self.size,
            });
        }
        if dest == self.rank {
            self.ready.push_back(Incoming::Frame(frame));
            return Ok(());
        }
        self.post(dest, &WireMsg::Frame(frame))
    }

    fn poll(&mut self, timeout: Option<Duration>) -> Result<Option<Incoming>> {
        if self.ready.is_empty() {
            if timeout == Some(Duration::ZERO) {
                self.pump()?;
            } else {
                let deadline = timeout.map(|t| Instant::now() + t);
                self.wait(|me| !me.ready.is_empty(), deadline)?;
            }
        }
        Ok(self.ready.pop_front())
    }

    fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    fn compute(&mut self, d: Duration) -> Result<()> {
        // Serve one-sided requests meanwhile: the target's code is what
        // answers them on this backend.
        let deadline = Instant::now() + d;
        self.wait(|_| false, Some(deadline))?;
        Ok(())
    }

    fn fault_point(&mut self, at: &FaultPoint) -> Result<()> {
        if !self.armed {
            return Ok(());
        }
        let me = self.rank;
        if let Some((index, victims)) = self.plan.check_indexed(me, at) {
            self.armed = self.plan.armed_for(me);
            self.fire(index, &victims)?;
        }
        Ok(())
    }

    fn window_expose(
        &mut self,
        id: WinId,
        epoch: u64,
        bytes: usize,
        init: Option<&[u8]>,
    ) -> Result<()> {
        let rank = self.rank;
        self.windows
            .expose_live((rank, &self.slot), id, epoch, (bytes, init), None)
    }

    fn window_withdraw(&mut self, id: WinId) {
        self.windows.withdraw(id, self.rank, &self.slot);
    }

    fn rma(&mut self, epoch: u64, target: Rank, id: WinId, op: RmaOp) -> Result<RmaReply> {
        if target == self.rank {
            return self.windows.rma(epoch, target, id, op);
        }
        self.next_request += 1;
        let req = self.next_request;
        self.asked.insert(req, target);
        self.post(
            target,
            &WireMsg::Rma(RmaRequest {
                id: req,
                epoch,
                window: id,
                op,
            }),
        )?;
        self.wait(|me| me.replies.contains_key(&req), None)?;
        self.replies
            .remove(&req)
            .unwrap_or_else(|| Err(Error::Driver(format!("no reply from rank {target}"))))
    }

    fn with_local_window(&mut self, id: WinId, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        self.windows.with_local_live((self.rank, &self.slot), id, f)
    }

    fn record(&mut self, stat: Stat) {
        let now = self.now();
        self.book.borrow_mut().stats.push((now, stat));
    }

    fn report_progress(&mut self, _fraction: f64) {}

    fn respawn(&mut self, rank: Rank) -> Result<()> {
        Err(Error::Driver(format!(
            "respawning rank {rank} needs ULFM, which the mpi backend does not drive yet"
        )))
    }

    fn await_respawn(&mut self, _rank: Rank) {}

    fn conclude(&mut self, epoch: u64) -> bool {
        // Without ULFM no failure is survived in place: a kill ends the
        // whole job, so one not seen yet can void nothing. With it, a
        // failure this rank repaired since voids the `Done`s.
        if epoch != self.epoch {
            return false;
        }
        self.plan.conclude();
        self.armed = false;
        true
    }
}
