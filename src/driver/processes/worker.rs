//! One rank as an OS process: its endpoint, its connections, and the threads
//! that serve them.
//!
//! Each rank listens on one socket. Frames to a peer go over a connection
//! this rank opened (lazily, at the first send), so the frames of one
//! channel keep their order; frames from peers arrive on connections the
//! peers opened, each read by its own thread into the rank's inbox. That
//! reading thread is also the rank's RMA progress engine: a one-sided
//! request is applied to the window memory there, while the rank's own code
//! runs elsewhere, and the reply goes back on the same connection.
//!
//! Between ranks on one host, a channel moves to a shared-memory ring at its
//! first frame (`shm`): the rank's own thread then polls the rings it
//! receives on (no system call, no thread hand-off per frame) and blocks
//! only after a short spin, asking the senders for a doorbell on the socket.
//!
//! The control connection to the launcher carries heartbeats, statistics,
//! kill requests and the final outcome up, and the peer table, failure
//! notices and aborts down. If the launcher goes away the rank exits: no
//! orphans (also enforced by `PR_SET_PDEATHSIG`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, select, unbounded};
use serde::Serialize;

use super::LaunchEnv;
use super::auth::{Identity, Role, Secret, handshake};
use super::net::{Addr, Handshaking, Listener, Stream};
use super::shm::{self, RingReader, RingWriter};
use super::shm_window::ShmWindow;
use super::wire::{
    LONG_LEN, RemoteError, RmaRequest, WireError, WireMsg, app_head, encode_into, fixed_layout,
    read_msg, write_msg,
};
use crate::config::Config;
use crate::driver::shared::{
    SPIN_YIELDS, Slot, WAIT_SPIN, WindowMemory, WindowRegistry, Yielding, core_per_rank, lock,
    rank_body,
};
use crate::driver::{Endpoint, RmaOp, RmaReply, Stat, WinId};
use crate::engine::frame::{Body, Frame, Incoming};
use crate::fault::{FaultPlan, FaultPoint};
use crate::job::RankFn;
use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// Checks of the rings' head words before the clock is first read in a
/// blocking poll (a few microseconds).
const TIGHT_SPIN: usize = 1024;

/// Longest spin of a poll after a receiver was handed a payload to copy
/// out of this process.
const REMOTE_SPIN_MAX: Duration = Duration::from_millis(10);

/// Longest sleep of a rank that receives on rings: a doorbell lost with a
/// broken connection costs at most this.
const RING_NAP: Duration = Duration::from_millis(10);

/// What the reading threads hand to the rank's thread, in arrival order.
enum Arrival {
    In(Incoming),
    /// The channel from `from` continues in this ring.
    Ring {
        from: Rank,
        incarnation: u64,
        ring: RingReader,
    },
    /// A sender put a frame in a ring while this rank slept.
    Wake,
    /// A connection from a peer ended inside a frame (its process may have
    /// died): said once a failure notice explains it (see [`LostWithSender`]).
    Lost(LostWithSender),
}

/// A ring this rank receives on.
struct InRing {
    from: Rank,
    incarnation: u64,
    ring: RingReader,
}

/// Replies to this rank's RMA requests, from the readers of its outgoing
/// connections.
enum Reply {
    Done {
        id: u64,
        reply: Result<RmaReply>,
    },
    /// Outgoing connection `conn` closed: its reader has stopped, so no
    /// reply to a request written into it will come.
    Closed {
        conn: u64,
    },
}

/// This rank's connection to a peer, with the number that its reader's
/// [`Reply::Closed`] names.
struct Outgoing {
    conn: u64,
    stream: Stream,
}

enum PeerState {
    /// Listening at `addr`; `out` is this rank's connection to it, once
    /// made, and `ring` the shared-memory ring its frames go in, once made.
    Up {
        addr: Addr,
        incarnation: u64,
        out: Option<Outgoing>,
        ring: Option<RingWriter>,
    },
    /// Dead and being replaced: frames wait here until the replacement is
    /// up (it will want the frames of the new epoch).
    Respawning { after: u64, queue: Vec<Frame> },
    /// Dead for good (no replacement): frames to it are lost.
    Gone { after: u64 },
}

impl PeerState {
    /// The newest incarnation this state knows of (a notice about an older
    /// one is stale).
    fn incarnation(&self) -> u64 {
        match self {
            PeerState::Up { incarnation, .. } => *incarnation,
            PeerState::Respawning { after, .. } | PeerState::Gone { after } => *after + 1,
        }
    }
}

/// How often a rank waiting for an RMA reply looks whether its target was
/// declared dead (its connection's end is the quick way to learn that; this
/// is the sure one).
const RMA_RECHECK: Duration = Duration::from_millis(50);

/// How long a live peer on another host may stay unreachable (no
/// connection, no handshake) before a send fails (the launcher declares a
/// dead one within its failure detector's timeout). A peer on this host is
/// dead only when its process is, which the launcher sees at once: one
/// still unreachable after this long is reported, and waited for.
const UNREACHABLE_LIMIT: Duration = Duration::from_secs(30);

/// After this long without room in a live receiver's ring, a waiting send
/// says so (once); it keeps waiting.
const RING_STALL_REPORT: Duration = Duration::from_secs(30);

/// Attempts at reaching a peer, with exponential backoff, until
/// [`UNREACHABLE_LIMIT`] has passed (for a peer on another host).
struct Retry {
    /// Set at the first failed attempt (reading the clock costs, and most
    /// sends never retry).
    deadline: Option<Instant>,
    backoff: Duration,
    /// The peer runs on this host: past the limit, say so once and go on.
    patient: bool,
    /// The limit has been reported.
    reported: bool,
}

impl Retry {
    fn new(patient: bool) -> Self {
        Retry {
            deadline: None,
            backoff: Duration::from_micros(500),
            patient,
            reported: false,
        }
    }

    /// Wait before the next attempt at reaching `peer`; `false` once the
    /// limit has passed, unless the peer is on this host (then the limit
    /// is reported on stderr, once).
    fn wait(&mut self, peer: Rank) -> bool {
        let now = Instant::now();
        if now >= *self.deadline.get_or_insert(now + UNREACHABLE_LIMIT) && !self.reported {
            if !self.patient {
                return false;
            }
            self.reported = true;
            tracing::warn!(
                peer,
                "lazarus: rank {peer} has been unreachable for {} s; it runs on this host and \
                 the launcher has not declared it dead (stopped, or hung?): still trying",
                UNREACHABLE_LIMIT.as_secs()
            );
        }
        std::thread::sleep(self.backoff);
        self.backoff = (self.backoff * 2).min(Duration::from_millis(20));
        true
    }
}

/// What the reading threads share with the endpoint.
struct Shared {
    me: Identity,
    secret: Secret,
    max_frame: usize,
    windows: WindowRegistry,
    slot: Arc<Slot>,
    /// The job's shared-memory directory, when rings are used.
    shm_dir: Option<std::path::PathBuf>,
}

/// Write `msg` on the (shared) control connection. It is encoded before
/// the connection is taken: heartbeats wait behind a large message (the
/// rank's value) while it is written, which the launcher counts as a sign
/// of life, but not while it is copied.
fn send_ctl(ctl: &Mutex<Stream>, msg: &WireMsg, max: usize) -> std::result::Result<(), WireError> {
    use std::io::Write;
    let mut head = Vec::new();
    let detached = encode_into(msg, max, &mut head)?;
    let mut s = lock(ctl);
    s.write_all(&head)?;
    for part in detached {
        s.write_all(part)?;
    }
    Ok(())
}

/// The sending side of a [`watched`] channel: every send is counted.
#[derive(Debug)]
struct CountingSender<T> {
    tx: Sender<T>,
    sent: Arc<AtomicU64>,
}

impl<T> Clone for CountingSender<T> {
    fn clone(&self) -> Self {
        CountingSender {
            tx: self.tx.clone(),
            sent: self.sent.clone(),
        }
    }
}

impl<T> CountingSender<T> {
    fn send(&self, v: T) -> std::result::Result<(), crossbeam_channel::SendError<T>> {
        self.tx.send(v)?;
        // After the send: whoever sees the count can receive the message.
        self.sent.fetch_add(1, Ordering::Release);
        Ok(())
    }
}

/// The receiving side of a [`watched`] channel: it tells "nothing new
/// since the channel was last found empty" from one load of the senders'
/// count. The rank checks its control channel and inbox on every send and
/// every turn of a poll; `Receiver::is_empty` cost about 28 instructions a
/// call there, three calls a message (callgrind, 8 B ping-pong).
#[derive(Debug)]
struct WatchedReceiver<T> {
    rx: Receiver<T>,
    sent: Arc<AtomicU64>,
    /// The count when the channel was last found empty.
    seen: u64,
}

impl<T> WatchedReceiver<T> {
    /// Whether something may have been sent since the channel was last
    /// found empty (a message received by other means, as `select!` does,
    /// keeps this true until a `try_recv` finds the channel empty).
    fn maybe_ready(&self) -> bool {
        self.sent.load(Ordering::Acquire) != self.seen
    }

    fn try_recv(&mut self) -> std::result::Result<T, crossbeam_channel::TryRecvError> {
        // Loaded before looking: every send counted in it is in the
        // channel already, so an empty channel has delivered them all.
        let sent = self.sent.load(Ordering::Acquire);
        let r = self.rx.try_recv();
        if r.is_err() {
            self.seen = sent;
        }
        r
    }
}

/// An unbounded channel whose receiver checks for news with one load.
fn watched<T>() -> (CountingSender<T>, WatchedReceiver<T>) {
    let (tx, rx) = unbounded();
    let sent = Arc::new(AtomicU64::new(0));
    (
        CountingSender {
            tx,
            sent: sent.clone(),
        },
        WatchedReceiver { rx, sent, seen: 0 },
    )
}

/// The endpoint of a rank process.
struct ProcessEndpoint {
    sh: Arc<Shared>,
    size: usize,
    start_epoch: u64,
    t0: SystemTime,
    inbox: WatchedReceiver<Arrival>,
    self_tx: CountingSender<Arrival>,
    /// Rings this rank receives on.
    rings: Vec<InRing>,
    /// Rings this rank made (for unique names).
    rings_made: u64,
    /// The head of the frame being written into a ring (kept for reuse).
    scratch: Vec<u8>,
    /// How long the next blocking poll spins at least (zero: `WAIT_SPIN`),
    /// when a receiver was just handed a large payload to copy out of this
    /// process: a reply cannot come before that copy is done, which takes
    /// longer than `WAIT_SPIN` (waking from a doorbell instead cost more
    /// than the copy saved: ping-pong at 1 MiB 110 -> 125 us one-way).
    remote_spin: Duration,
    /// Whether a waiting rank may yield its core before it sleeps.
    yielding: Yielding,
    ctl_rx: WatchedReceiver<WireMsg>,
    ctl: Arc<Mutex<Stream>>,
    peers: Vec<PeerState>,
    replies: Receiver<Reply>,
    replies_tx: Sender<Reply>,
    /// Notices and aborts decoded from control messages, not yet returned.
    ready: VecDeque<Incoming>,
    /// The launcher said the job is complete (`JobComplete`).
    job_completed: bool,
    /// Control messages that arrived while waiting for something else.
    stashed: VecDeque<WireMsg>,
    plan: FaultPlan,
    /// `plan` may still kill at one of this rank's fault points (checked
    /// at every runtime call: without a kill to come, skipped at once).
    armed: bool,
    next_id: u64,
    /// Number of the newest outgoing connection.
    next_conn: u64,
    last_progress: f64,
    /// Whether a waiting rank spins on its rings before it sleeps
    /// ([`core_per_rank`] of the ranks on this host: CG W with 8 ranks on
    /// 2 cores ran 36% faster without spinning).
    spin: bool,
    /// Peers' shared-memory windows this rank has mapped, by `(target,
    /// window)`.
    mapped_windows: HashMap<(Rank, WinId), MappedWindow>,
    /// Every peer runs on this host: one unreachable is waited for as
    /// long as the launcher has not declared it dead (see [`Retry`]).
    peers_here: bool,
    /// Per peer, the newest incarnation the launcher declared dead and
    /// why (from its failure notices).
    causes: HashMap<Rank, (u64, String)>,
    /// Rings and connections closed because their sender ended, not yet
    /// explained by a failure notice.
    lost: Vec<LostWithSender>,
}

/// A ring closed because its sender's process ended while this rank read a
/// payload out of its memory, or a connection from a peer that ended
/// inside a frame: the message is lost with its sender. That is a
/// consequence of the sender's failure, said with the failure's cause once
/// the launcher's notice gives it (the notice may come after the loss: the
/// launcher kills before it tells), and as a warning with the symptom
/// alone if no notice ever explains it.
struct LostWithSender {
    /// "ring", or "connection" (a socket that ended inside a frame).
    what: &'static str,
    from: Rank,
    incarnation: u64,
    why: String,
}

/// Say that `l`'s payload was lost with its sender, which failed for
/// `cause` (the failure is the news, the loss its consequence: `info`).
fn lost_with_cause(me: Rank, l: &LostWithSender, cause: &str) {
    tracing::info!(
        rank = me,
        peer = l.from,
        cause,
        "lazarus: rank {me}: closing the {} from rank {}: {} (rank {} failed: {cause})",
        l.what,
        l.from,
        l.why,
        l.from
    );
}

/// Say that the ring from `l.from` was closed, for a reason no failure
/// explains.
fn lost_unexplained(me: Rank, l: &LostWithSender) {
    tracing::warn!(
        rank = me,
        peer = l.from,
        "lazarus: rank {me}: closing the {} from rank {}: {}",
        l.what,
        l.from,
        l.why
    );
}

impl Drop for ProcessEndpoint {
    /// Rings whose senders' ends no failure notice explained (a sender
    /// that exited while its payload was read) are said as they were
    /// before the cause could be known.
    fn drop(&mut self) {
        let me = self.rank();
        for l in std::mem::take(&mut self.lost) {
            lost_unexplained(me, &l);
        }
    }
}

/// A peer's window mapped by this rank, for one incarnation and window
/// epoch of the peer; `None` when the peer has it in process memory
/// (operations go over the socket; a window is exposed before its
/// allocation's barrier, so that is known at the first operation).
struct MappedWindow {
    incarnation: u64,
    epoch: u64,
    window: Option<Arc<ShmWindow>>,
}

impl ProcessEndpoint {
    /// The job's abort, once the launcher announced it: a send waiting for
    /// a peer gives up then (the peer may be the rank whose error ended
    /// the job, and never read again).
    fn aborted(&self) -> Option<Error> {
        self.ready.iter().find_map(|i| match i {
            Incoming::Abort { rank, reason } => Some(Error::Aborted {
                rank: *rank,
                reason: reason.clone(),
            }),
            _ => None,
        })
    }

    /// Apply a message of the launcher.
    fn apply(&mut self, c: WireMsg) {
        match c {
            WireMsg::Peers { addrs } => self.set_peers(addrs),
            WireMsg::PeerUp {
                rank,
                incarnation,
                addr,
            } => {
                let Some(p) = self.peers.get(rank) else {
                    return;
                };
                if incarnation < p.incarnation() {
                    return;
                }
                let addr = match addr.parse() {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(
                            peer = rank,
                            "lazarus: rank {}: {e}",
                            self.sh.me.rank.unwrap_or(0)
                        );
                        return;
                    }
                };
                let old = std::mem::replace(
                    &mut self.peers[rank],
                    PeerState::Up {
                        addr,
                        incarnation,
                        out: None,
                        ring: None,
                    },
                );
                if let PeerState::Respawning { queue, .. } = old {
                    for f in queue {
                        // A failure here is the replacement dying again;
                        // the launcher will say so.
                        let _ = self.send(rank, f);
                    }
                }
            }
            WireMsg::FailureNotice {
                epoch,
                dead,
                respawn,
                cause,
            } => {
                let me = self.rank();
                let names: Vec<Rank> = dead.iter().map(|d| d.0).collect();
                tracing::info!(
                    rank = me,
                    epoch,
                    cause = %cause,
                    "lazarus: rank {me}: told that rank{} {} failed: {cause}",
                    if names.len() == 1 { "" } else { "s" },
                    crate::error::list(&names)
                );
                for &(r, inc) in &dead {
                    self.causes.insert(r, (inc, cause.clone()));
                }
                let mut ranks = Vec::new();
                for (r, inc) in dead {
                    ranks.push(r);
                    // What the dead incarnation wrote whole is delivered
                    // (as a socket's buffered frames would be), then its
                    // ring goes.
                    self.close_rings(|from, i| from == r && i <= inc);
                    // Its windows' memory is lost with it.
                    self.mapped_windows
                        .retain(|&(t, _), m| t != r || m.incarnation > inc);
                    let Some(p) = self.peers.get_mut(r) else {
                        continue;
                    };
                    match p {
                        // Already replaced: the notice is old news.
                        PeerState::Up { incarnation, .. } if *incarnation > inc => continue,
                        PeerState::Up { out, .. } => {
                            if let Some(o) = out.take() {
                                o.stream.shutdown();
                            }
                        }
                        // Keep the frames already waiting for the replacement.
                        PeerState::Respawning { .. } if respawn => continue,
                        PeerState::Respawning { .. } | PeerState::Gone { .. } => {}
                    }
                    *p = if respawn {
                        PeerState::Respawning {
                            after: inc,
                            queue: Vec::new(),
                        }
                    } else {
                        PeerState::Gone { after: inc }
                    };
                }
                // Payloads lost with their senders, now explained.
                let (explained, still): (Vec<LostWithSender>, Vec<LostWithSender>) =
                    std::mem::take(&mut self.lost).into_iter().partition(|l| {
                        self.causes
                            .get(&l.from)
                            .is_some_and(|(dead, _)| *dead >= l.incarnation)
                    });
                self.lost = still;
                for l in &explained {
                    if let Some((_, cause)) = self.causes.get(&l.from) {
                        lost_with_cause(me, l, cause);
                    }
                }
                self.ready
                    .push_back(Incoming::FailureNotice { epoch, dead: ranks });
            }
            WireMsg::Abort { rank, reason } => {
                self.ready.push_back(Incoming::Abort { rank, reason })
            }
            WireMsg::JobComplete => {
                // Remembered too: the engine may take it in before `flush`
                // looks for it, and a receiver that died after the end
                // never copies out what it was sent.
                self.job_completed = true;
                self.ready.push_back(Incoming::JobComplete)
            }
            // A stale kill answer, or nothing a rank expects from the launcher.
            _ => {}
        }
    }

    fn set_peers(&mut self, addrs: Vec<Option<(u64, String)>>) {
        self.peers = addrs
            .into_iter()
            .map(
                |a| match a.and_then(|(inc, s)| s.parse().ok().map(|a| (inc, a))) {
                    Some((incarnation, addr)) => PeerState::Up {
                        addr,
                        incarnation,
                        out: None,
                        ring: None,
                    },
                    None => PeerState::Respawning {
                        after: 0,
                        queue: Vec::new(),
                    },
                },
            )
            .collect();
    }

    /// [`Endpoint::fault_point`] with kills still to fire on this rank.
    #[cold]
    #[inline(never)]
    fn fault_point_armed(&mut self, at: &FaultPoint) -> Result<()> {
        let rank = self.rank();
        let Some((index, victims)) = self.plan.check_indexed(rank, at) else {
            return Ok(());
        };
        self.armed = self.plan.armed_for(rank);
        let req = WireMsg::KillRequest { index, victims };
        if send_ctl(&self.ctl, &req, self.sh.max_frame).is_err() {
            return Err(Error::Driver("lost the launcher".into()));
        }
        // Wait for the launcher's answer; keep other control messages.
        loop {
            match self.ctl_rx.rx.recv() {
                Ok(WireMsg::KillAnswer { granted: true }) => loop {
                    // The launcher is killing us (SIGKILL) with the other
                    // victims at the same instant.
                    std::thread::sleep(Duration::from_secs(1));
                },
                Ok(WireMsg::KillAnswer { granted: false }) => return Ok(()),
                Ok(other) => self.stashed.push_back(other),
                Err(_) => return Err(Error::Driver("lost the launcher".into())),
            }
        }
    }

    /// Apply every control message already here.
    fn drain_control(&mut self) {
        // Checked on every send and poll: one load when nothing came.
        if self.stashed.is_empty() && !self.ctl_rx.maybe_ready() {
            return;
        }
        while let Some(c) = self.stashed.pop_front() {
            self.apply(c);
        }
        while let Ok(c) = self.ctl_rx.try_recv() {
            self.apply(c);
        }
    }

    /// This rank's connection to `dest`, opened if needed: `Err(true)` if
    /// nothing listens at its address any more (it exited or died),
    /// `Err(false)` if the attempt failed otherwise (worth retrying).
    fn out(&mut self, dest: Rank) -> std::result::Result<&mut Outgoing, bool> {
        let sh = self.sh.clone();
        let replies = self.replies_tx.clone();
        let conn = self.next_conn + 1;
        let Some(PeerState::Up {
            addr,
            incarnation,
            out,
            ..
        }) = self.peers.get_mut(dest)
        else {
            return Err(true);
        };
        if out.is_none() {
            match connect(&sh, addr, dest, *incarnation, conn, replies) {
                Ok(stream) => {
                    self.next_conn = conn;
                    *out = Some(Outgoing { conn, stream });
                }
                Err((e, gone)) => {
                    tracing::debug!(
                        peer = dest,
                        "lazarus: rank {}: cannot reach rank {dest}: {e}",
                        sh.me.rank.unwrap_or(0)
                    );
                    return Err(gone);
                }
            }
        }
        out.as_mut().ok_or(false)
    }

    fn drop_out(&mut self, dest: Rank) {
        if let Some(PeerState::Up { out, .. }) = self.peers.get_mut(dest)
            && let Some(o) = out.take()
        {
            o.stream.shutdown();
        }
    }

    /// Forget outgoing connection `conn`, whose reader has stopped. On TCP a
    /// write into a connection the peer has closed still succeeds (the
    /// reset comes later), so without this an RMA request could go into it
    /// and wait for a reply nobody will read.
    fn closed_out(&mut self, conn: u64) {
        for p in &mut self.peers {
            if let PeerState::Up { out, .. } = p
                && out.as_ref().is_some_and(|o| o.conn == conn)
                && let Some(o) = out.take()
            {
                o.stream.shutdown();
            }
        }
    }

    /// The incarnation of `dest` if it is up.
    fn up_incarnation(&self, dest: Rank) -> Option<u64> {
        match self.peers.get(dest) {
            Some(PeerState::Up { incarnation, .. }) => Some(*incarnation),
            _ => None,
        }
    }

    /// `target`'s window `id` of `epoch` in its incarnation, mapped from
    /// its file when the target is on this host and exposed it in shared
    /// memory (`None` otherwise: the request goes over the socket).
    fn mapped_window(
        &mut self,
        target: Rank,
        incarnation: u64,
        id: WinId,
        epoch: u64,
    ) -> Option<Arc<ShmWindow>> {
        let dir = self.sh.shm_dir.as_ref()?;
        if !matches!(
            self.peers.get(target),
            Some(PeerState::Up {
                addr: Addr::Unix(_),
                ..
            })
        ) {
            return None;
        }
        if let Some(m) = self.mapped_windows.get(&(target, id))
            && (m.incarnation, m.epoch) == (incarnation, epoch)
        {
            return m.window.clone();
        }
        let window =
            match ShmWindow::open(dir, &ShmWindow::file_name(id, target, incarnation, epoch)) {
                Ok(w) => w.map(Arc::new),
                Err(e) => {
                    tracing::debug!(
                        peer = target,
                        "lazarus: rank {}: window {id} of rank {target} over the socket: {e}",
                        self.rank()
                    );
                    None
                }
            };
        let m = MappedWindow {
            incarnation,
            epoch,
            window: window.clone(),
        };
        self.mapped_windows.insert((target, id), m);
        window
    }

    /// Take every whole frame out of the rings into `ready`. A ring whose
    /// contents do not decode is closed (as a socket would be).
    fn pump_rings(&mut self) {
        let max = self.sh.max_frame;
        // (ring, why, whether its sender's process had ended)
        let mut broken = Vec::new();
        for (i, r) in self.rings.iter_mut().enumerate() {
            loop {
                let record = match r.ring.pull(max) {
                    Ok(Some(rec)) => rec,
                    Ok(None) => break,
                    Err(e) => {
                        let gone = matches!(e, WireError::SenderGone { .. });
                        broken.push((i, e.to_string(), gone));
                        break;
                    }
                };
                match record.decode() {
                    Ok(WireMsg::Frame(f)) if f.src == r.from => {
                        self.ready.push_back(Incoming::Frame(f));
                    }
                    Ok(_) => {
                        broken.push((i, "a message that is not its frame".to_string(), false));
                        break;
                    }
                    Err(e) => {
                        broken.push((i, e.to_string(), false));
                        break;
                    }
                }
            }
        }
        for (i, why, gone) in broken.into_iter().rev() {
            let r = self.rings.remove(i);
            let lost = LostWithSender {
                what: "ring",
                from: r.from,
                incarnation: r.incarnation,
                why,
            };
            if gone {
                self.lost_with_sender(lost);
            } else {
                lost_unexplained(self.rank(), &lost);
            }
        }
    }

    /// Deliver the whole frames of the rings `which(from, incarnation)`
    /// selects, then drop those rings.
    fn close_rings(&mut self, which: impl Fn(Rank, u64) -> bool) {
        if self.rings.iter().any(|r| which(r.from, r.incarnation)) {
            self.pump_rings();
            self.rings.retain(|r| !which(r.from, r.incarnation));
        }
    }

    /// What an arrival from the reading threads means for the caller.
    fn take(&mut self, a: Arrival) -> Option<Incoming> {
        match a {
            Arrival::In(i) => Some(i),
            Arrival::Ring {
                from,
                incarnation,
                ring,
            } => {
                self.rings.push(InRing {
                    from,
                    incarnation,
                    ring,
                });
                // A ring of an incarnation already declared dead: only what
                // it holds whole is delivered.
                if self
                    .peers
                    .get(from)
                    .is_some_and(|p| p.incarnation() > incarnation)
                {
                    self.close_rings(|r, i| r == from && i <= incarnation);
                }
                None
            }
            Arrival::Wake => None,
            Arrival::Lost(l) => {
                self.lost_with_sender(l);
                None
            }
        }
    }

    /// A payload or frame `l` lost because its sender's connection or
    /// process ended: said with the cause if a failure notice gave it
    /// already, else kept until one does.
    fn lost_with_sender(&mut self, l: LostWithSender) {
        match self.causes.get(&l.from) {
            Some((dead, cause)) if *dead >= l.incarnation => {
                lost_with_cause(self.rank(), &l, cause)
            }
            _ => self.lost.push(l),
        }
    }

    /// The ring to `dest`, made and announced at the first frame. `None`
    /// when rings are not used for it (another host, no shared-memory
    /// directory) or could not be made (the socket carries the frame).
    fn ring_to(&mut self, dest: Rank) -> Option<RingWriter> {
        self.sh.shm_dir.as_ref()?;
        let Some(PeerState::Up {
            addr: Addr::Unix(_),
            incarnation,
            ring,
            ..
        }) = self.peers.get_mut(dest)
        else {
            return None;
        };
        if let Some(w) = ring.take() {
            return Some(w);
        }
        let dir = self.sh.shm_dir.clone()?;
        let me = self.sh.me;
        let name = format!(
            "{}.{}-{dest}.{incarnation}.{}",
            me.rank.unwrap_or(0),
            me.incarnation,
            self.rings_made
        );
        self.rings_made += 1;
        let w = match RingWriter::create(&dir, &name, shm::capacity_for(self.size)) {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!(
                    peer = dest,
                    "lazarus: rank {}: no ring to rank {dest}: {e}",
                    me.rank.unwrap_or(0)
                );
                return None;
            }
        };
        // Announced on the socket after the frames sent there: the
        // receiver reads the ring only from this point of the channel.
        let max = self.sh.max_frame;
        let announce = WireMsg::ShmRing { name: name.clone() };
        match self
            .out(dest)
            .map(|o| write_msg(&mut o.stream, &announce, max))
        {
            Ok(Ok(())) => Some(w),
            failed => {
                if matches!(failed, Ok(Err(_))) {
                    self.drop_out(dest);
                }
                let _ = std::fs::remove_file(dir.join(&name));
                None
            }
        }
    }

    /// A receiver is to copy `bytes` out of this process: the next blocking
    /// poll spins for the copy's expected time (at 2 GB/s at least, at most
    /// `REMOTE_SPIN_MAX`), since a reply cannot come sooner.
    fn expect_copy(&mut self, bytes: usize) {
        let copy = Duration::from_nanos(bytes as u64 / 2);
        self.remote_spin = self.remote_spin.max(copy.min(REMOTE_SPIN_MAX));
    }

    /// Ring the doorbell of `dest`, which sleeps with a frame in its ring.
    fn doorbell(&mut self, dest: Rank) {
        let max = self.sh.max_frame;
        if let Ok(o) = self.out(dest)
            && write_msg(&mut o.stream, &WireMsg::Wake, max).is_err()
        {
            // Its poll naps at most `RING_NAP`: a lost doorbell only delays.
            self.drop_out(dest);
        }
    }

    /// Write `msg` into the ring to `dest`. `Ok(false)` when no ring is
    /// used for it, or `dest` died meanwhile (the caller decides where the
    /// frame goes, as for a socket).
    fn ring_send(&mut self, dest: Rank, msg: &WireMsg) -> Result<bool> {
        /// Parts larger than this are published every this many bytes, so
        /// that the receiver copies out while the rest is copied in. 16 KiB
        /// rather than 64: a 64 KiB message was then written whole before
        /// the receiver could start (ping-pong one-way 8.83 -> 7.27 us at
        /// 64 KiB, 6 alternating runs; 8 B to 4 MiB otherwise within noise).
        const STREAM_CHUNK: usize = 16 << 10;
        let max = self.sh.max_frame;
        let cannot = |e| match e {
            WireError::Oversized { len, max } => oversized(msg, dest, len, max),
            e => Error::Driver(format!("a frame to rank {dest} cannot be sent: {e}")),
        };
        // The common cases first, into a ring that is open and has room: a
        // small application frame written and published whole in place,
        // or a large one whose receiver copies the payload out of this
        // process (`shm::REMOTE_MIN`).
        if let WireMsg::Frame(Frame {
            src,
            epoch,
            body: Body::App(app),
        }) = msg
            && let small = app.payload.len() < STREAM_CHUNK
            && (small || app.payload.len() >= shm::REMOTE_MIN)
            && let Some(PeerState::Up { ring: Some(w), .. }) = self.peers.get_mut(dest)
        {
            let fixed = app_head(*src, *epoch, app, max).map_err(cannot)?;
            let written = if small {
                w.write_whole(&[&fixed, &app.payload])
            } else {
                w.write_remote(&fixed, &app.payload)
            };
            if written {
                if w.wake_needed() {
                    self.doorbell(dest);
                }
                if !small {
                    self.expect_copy(app.payload.len());
                }
                return Ok(true);
            }
        }
        let Some(inc) = self.up_incarnation(dest) else {
            return Ok(false);
        };
        let Some(mut w) = self.ring_to(dest) else {
            return Ok(false);
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        let fixed;
        let (head, tail): (&[u8], &[Bytes]) = if let WireMsg::Frame(Frame {
            src,
            epoch,
            body: Body::App(app),
        }) = msg
            && fixed_layout(app)
        {
            // The fixed fields from the stack and the payload from its own
            // buffer: nothing is assembled (or copied) before the ring.
            fixed = app_head(*src, *epoch, app, max).map_err(cannot)?;
            (&fixed, std::slice::from_ref(&app.payload))
        } else {
            // A checkpoint piece's segments follow its header one by one.
            let tail = encode_into(msg, max, &mut scratch).map_err(cannot)?;
            (&scratch, tail)
        };
        // Detached parts of `REMOTE_MIN` bytes or more in all (a checkpoint
        // piece): the receiver copies them out of this process, and the
        // ring carries only the frame's bytes and where the parts are.
        let parts_len: usize = tail.iter().map(Bytes::len).sum();
        let remote = parts_len >= shm::REMOTE_MIN
            && head.get(..4).is_some_and(|p| p != LONG_LEN.to_le_bytes())
            && w.write_remote_frame(&head[4..], tail);
        if remote {
            if w.wake_needed() {
                self.doorbell(dest);
            }
            self.expect_copy(parts_len);
        }
        // When the receiver last made room (set at the first wait after
        // it did), and whether the user was told it stopped.
        let mut stalled_since = None;
        let mut told = false;
        // Indexed rather than a chained iterator: that cost 50 instructions
        // per message here (callgrind, 8 B ping-pong).
        // (Written already if it went as a remote frame.)
        let parts_to_write = if remote { 0 } else { tail.len() + 1 };
        for i in 0..parts_to_write {
            let part: &[u8] = match i.checked_sub(1) {
                None => head,
                Some(j) => &tail[j],
            };
            let mut off = 0;
            let mut waits = 0u32;
            while off < part.len() {
                let n = w.write(&part[off..part.len().min(off + STREAM_CHUNK)]);
                if n > 0 {
                    off += n;
                    waits = 0;
                    stalled_since = None;
                    // A large part is published as it goes, so the receiver
                    // copies out while the rest is written.
                    if part.len() > STREAM_CHUNK && w.publish() && w.wake_needed() {
                        self.doorbell(dest);
                    }
                    continue;
                }
                // Full: let the receiver have what is written.
                if w.publish() && w.wake_needed() {
                    self.doorbell(dest);
                }
                // Take in what others send meanwhile (the receiver
                // may itself be blocked writing to this rank, maybe in a
                // ring announced only now), and give up on a receiver that
                // died.
                self.drain_control();
                while let Ok(a) = self.inbox.try_recv() {
                    if let Some(i) = self.take(a) {
                        self.ready.push_back(i);
                    }
                }
                self.pump_rings();
                if self.up_incarnation(dest) != Some(inc) {
                    return Ok(false);
                }
                if let Some(e) = self.aborted() {
                    return Err(e);
                }
                // A live receiver reads its rings only when it enters the
                // runtime: one that computes for minutes between calls is
                // busy, not lost, and the send waits for it as long as it
                // lives (as an MPI send waits for its receive). Only a
                // failure notice or the job's abort ends the wait (both
                // checked above); a long one is reported once,
                // so that a program waiting on a receiver that never comes
                // back to the runtime says why.
                let now = Instant::now();
                let since = *stalled_since.get_or_insert(now);
                if !told && now - since > RING_STALL_REPORT {
                    tracing::warn!(
                        peer = dest,
                        "lazarus: rank {}: rank {dest} has not read its ring for {} s; it is \
                         alive (no failure notice), so the send waits for it",
                        self.rank(),
                        RING_STALL_REPORT.as_secs()
                    );
                    told = true;
                }
                waits += 1;
                if self.spin && waits < 64 {
                    std::hint::spin_loop();
                } else if waits < 128 && self.yielding.may(Instant::now()) {
                    std::thread::yield_now();
                } else if waits < 4096 {
                    std::thread::sleep(Duration::from_micros(50));
                } else {
                    // Minutes of waiting need not cost a core.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        if w.publish() && w.wake_needed() {
            self.doorbell(dest);
        }
        if let Some(PeerState::Up {
            incarnation, ring, ..
        }) = self.peers.get_mut(dest)
            && *incarnation == inc
        {
            *ring = Some(w);
        }
        self.scratch = scratch;
        Ok(true)
    }
}

/// Open, authenticate and serve (for RMA replies) connection number `conn`
/// to `dest`.
fn connect(
    sh: &Arc<Shared>,
    addr: &Addr,
    dest: Rank,
    incarnation: u64,
    conn: u64,
    replies: Sender<Reply>,
) -> std::result::Result<Stream, (String, bool)> {
    let retry = |e: String| (e, false);
    let mut s = Stream::connect(addr).map_err(|e| {
        let gone = matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
        );
        (e.to_string(), gone)
    })?;
    let peer =
        handshake(&mut s, &sh.secret, sh.me, Role::Connector).map_err(|e| retry(e.to_string()))?;
    if peer.rank != Some(dest) || peer.incarnation != incarnation {
        return Err(retry(format!(
            "expected rank {dest} incarnation {incarnation}, reached {peer}"
        )));
    }
    let mut rd = s.try_clone().map_err(|e| retry(e.to_string()))?;
    let max = sh.max_frame;
    std::thread::Builder::new()
        .name(format!("rma-replies-{dest}"))
        .spawn(move || {
            loop {
                match read_msg(&mut rd, max) {
                    Ok(WireMsg::RmaDone { id, reply }) => {
                        let _ = replies.send(Reply::Done { id, reply });
                    }
                    Ok(_) => {}
                    Err(_) => {
                        let _ = replies.send(Reply::Closed { conn });
                        return;
                    }
                }
            }
        })
        .map_err(|e| retry(e.to_string()))?;
    Ok(s)
}

impl Endpoint for ProcessEndpoint {
    fn rank(&self) -> Rank {
        self.sh.me.rank.unwrap_or(0)
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
        if dest == self.rank() {
            let _ = self.self_tx.send(Arrival::In(Incoming::Frame(frame)));
            return Ok(());
        }
        // A frame is never dropped while its peer may be alive: a failed
        // connect, handshake or write is retried (on a new connection: a
        // frame cut short is discarded by the receiver) until it goes
        // through, or nothing listens at the peer's address any more (it
        // died, and the launcher's notice is on its way, or it finished), or
        // the notice says it died (then the frame waits for the replacement).
        let max = self.sh.max_frame;
        let msg = WireMsg::Frame(frame);
        let mut retry = Retry::new(self.peers_here);
        loop {
            self.drain_control();
            match self.peers.get_mut(dest) {
                Some(PeerState::Respawning { queue, .. }) => {
                    if let WireMsg::Frame(f) = msg {
                        queue.push(f);
                    }
                    return Ok(());
                }
                Some(PeerState::Gone { .. }) | None => return Ok(()),
                Some(PeerState::Up { .. }) => {}
            }
            let inc = self.up_incarnation(dest);
            if self.ring_send(dest, &msg)? {
                return Ok(());
            }
            if self.up_incarnation(dest) != inc {
                continue; // it died while the frame went in: look again
            }
            match self.out(dest).map(|o| write_msg(&mut o.stream, &msg, max)) {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(WireError::Oversized { len, max })) => {
                    return Err(oversized(&msg, dest, len, max));
                }
                Ok(Err(_)) => self.drop_out(dest),
                Err(true) => return Ok(()), // lost with the peer, as on a real network
                Err(false) => {}
            }
            if let Some(e) = self.aborted() {
                return Err(e);
            }
            if !retry.wait(dest) {
                return Err(Error::Driver(format!(
                    "rank {dest} has been unreachable for {} s and the launcher has not \
                     declared it dead",
                    UNREACHABLE_LIMIT.as_secs()
                )));
            }
        }
    }

    fn poll(&mut self, timeout: Option<Duration>) -> Result<Option<Incoming>> {
        // Read the clock only once nothing is there at once.
        let mut start = None;
        let mut tight_spun = false;
        let mut yields = 0;
        let mut spin_for = None;
        loop {
            self.drain_control();
            self.pump_rings();
            if let Some(i) = self.ready.pop_front() {
                return Ok(Some(i));
            }
            if self.inbox.maybe_ready()
                && let Ok(a) = self.inbox.try_recv()
            {
                if let Some(i) = self.take(a) {
                    return Ok(Some(i));
                }
                continue;
            }
            // A zero timeout must not reach `select!`: its `default(0)`
            // backs off (spins and yields) for microseconds before it gives
            // up, and the engine polls with a zero timeout on every posted
            // receive.
            if timeout == Some(Duration::ZERO) {
                return Ok(None);
            }
            // A reply is often well under a microsecond away: watch the
            // rings' head words in a tight loop (no clock read, no pause
            // instruction, which alone takes tens of nanoseconds) before
            // anything else.
            if self.spin
                && !tight_spun
                && !self.rings.is_empty()
                && timeout.is_none_or(|t| t >= WAIT_SPIN)
            {
                tight_spun = true;
                if (0..TIGHT_SPIN).any(|_| self.rings.iter().any(|r| r.ring.has_data())) {
                    continue;
                }
            }
            let now = Instant::now();
            let start = *start.get_or_insert(now);
            let deadline = timeout.map(|t| start + t);
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            // A frame is often a few microseconds away (a reply): spin on
            // the rings (only their head words: nothing else is touched
            // until one moves), then yield the core a few times (to the
            // reading threads, or to other ranks) while `Yielding` allows,
            // before sleeping.
            let spin_for = *spin_for
                .get_or_insert_with(|| std::mem::take(&mut self.remote_spin).max(WAIT_SPIN));
            if self.spin && !self.rings.is_empty() && now - start < spin_for {
                for _ in 0..256 {
                    if self.rings.iter().any(|r| r.ring.has_data()) {
                        break;
                    }
                    std::hint::spin_loop();
                }
                continue;
            }
            if yields < SPIN_YIELDS && self.yielding.may(now) {
                yields += 1;
                std::thread::yield_now();
                continue;
            }
            if !self.rings.iter().all(|r| r.ring.sleep()) {
                self.rings.iter().for_each(|r| r.ring.wake());
                continue;
            }
            let mut wait = deadline.map_or(Duration::from_secs(3600), |d| d - now);
            if !self.rings.is_empty() {
                wait = wait.min(RING_NAP);
            }
            let got = select! {
                recv(self.inbox.rx) -> m => match m {
                    Ok(a) => Some(a),
                    Err(_) => return Err(Error::Driver("inbox closed".into())),
                },
                recv(self.ctl_rx.rx) -> c => {
                    if let Ok(c) = c {
                        self.stashed.push_back(c);
                    }
                    None
                }
                default(wait) => None,
            };
            self.rings.iter().for_each(|r| r.ring.wake());
            if let Some(i) = got.and_then(|a| self.take(a)) {
                return Ok(Some(i));
            }
        }
    }

    fn now(&self) -> Duration {
        SystemTime::now()
            .duration_since(self.t0)
            .unwrap_or(Duration::ZERO)
    }

    fn compute(&mut self, d: Duration) -> Result<()> {
        std::thread::sleep(d);
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        // Two kinds of frames are handed over but not yet delivered:
        // - those for a rank being replaced, queued until the launcher's
        //   `PeerUp`. Data and control travel apart: the replacement's
        //   `Done` can arrive before the `PeerUp` the launcher sent
        //   earlier, so the `PeerUp` is on its way;
        // - remote records whose payloads stay in this process until their
        //   receiver copies them out: ending now would lose the payload and
        //   the ring with every frame behind it.
        // Wait for both, reading what others send meanwhile (they may be
        // waiting for this rank to copy their payloads out), until the job
        // ends or aborts.
        let mut nap = Duration::from_micros(20);
        loop {
            self.drain_control();
            while let Ok(a) = self.inbox.try_recv() {
                if let Some(i) = self.take(a) {
                    self.ready.push_back(i);
                }
            }
            self.pump_rings();
            if let Some(e) = self.aborted() {
                return Err(e);
            }
            if self.job_completed {
                return Ok(());
            }
            let queued = self
                .peers
                .iter()
                .any(|p| matches!(p, PeerState::Respawning { queue, .. } if !queue.is_empty()));
            let kept = self.peers.iter_mut().any(|p| match p {
                PeerState::Up { ring: Some(w), .. } => !w.copied(),
                _ => false,
            });
            if !queued && !kept {
                return Ok(());
            }
            // Nothing announces a receiver's copy: look again soon.
            match self.ctl_rx.rx.recv_timeout(nap) {
                Ok(c) => self.apply(c),
                Err(RecvTimeoutError::Timeout) => nap = (nap * 2).min(RING_NAP),
                // The launcher is gone: the job ends anyway.
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
        }
    }

    fn conclude(&mut self, epoch: u64) -> bool {
        let req = WireMsg::Conclude { epoch };
        if send_ctl(&self.ctl, &req, self.sh.max_frame).is_err() {
            return false; // the launcher is gone: the job ends anyway
        }
        // Wait for the launcher's answer; keep other control messages.
        loop {
            match self.ctl_rx.rx.recv() {
                Ok(WireMsg::Concluded { granted }) => {
                    if granted {
                        self.armed = false;
                    }
                    return granted;
                }
                Ok(other) => self.stashed.push_back(other),
                Err(_) => return false,
            }
        }
    }

    fn fault_point(&mut self, at: &FaultPoint) -> Result<()> {
        // Called at every operation: the check stays small, the rest apart.
        if !self.armed {
            return Ok(());
        }
        self.fault_point_armed(at)
    }

    fn window_expose(
        &mut self,
        id: WinId,
        epoch: u64,
        bytes: usize,
        init: Option<&[u8]>,
    ) -> Result<()> {
        let rank = self.rank();
        // In a file peers on this host map, when rings are used (else, or
        // if it cannot be made, in this process: operations then come over
        // the socket).
        let shared = self.sh.shm_dir.as_ref().and_then(|dir| {
            let key = (id, rank, self.sh.me.incarnation, epoch);
            match ShmWindow::create(dir, key, bytes, init) {
                Ok(w) => Some(Box::new(w) as Box<dyn WindowMemory>),
                Err(e) => {
                    tracing::debug!(
                        rank,
                        "lazarus: rank {rank}: window {id} in process memory: {e}"
                    );
                    None
                }
            }
        });
        self.sh
            .windows
            .expose_live((rank, &self.sh.slot), id, epoch, (bytes, init), shared)
    }

    fn window_withdraw(&mut self, id: WinId) {
        let rank = self.rank();
        self.sh.windows.withdraw(id, rank, &self.sh.slot);
    }

    fn rma(&mut self, epoch: u64, target: Rank, id: WinId, op: RmaOp) -> Result<RmaReply> {
        if target == self.rank() {
            return self.sh.windows.rma(epoch, target, id, op);
        }
        self.drain_control();
        // Nothing is awaited between requests: what waits is a late reply to
        // an abandoned request, or the end of a connection, which must not
        // carry this request.
        while let Ok(r) = self.replies.try_recv() {
            if let Reply::Closed { conn } = r {
                self.closed_out(conn);
            }
        }
        let gone = || {
            Error::Driver(format!(
                "rank {target} exposes no window {id} in epoch {epoch}"
            ))
        };
        let incarnation = match self.peers.get(target) {
            Some(PeerState::Up { incarnation, .. }) => *incarnation,
            _ => return Err(gone()),
        };
        // A target on this host: applied here, in its window's memory.
        if let Some(w) = self.mapped_window(target, incarnation, id, epoch) {
            return match w.apply_live(id, op)? {
                Some(reply) => Ok(reply),
                None => {
                    self.mapped_windows.remove(&(target, id));
                    Err(gone())
                }
            };
        }
        self.next_id += 1;
        let req_id = self.next_id;
        let max = self.sh.max_frame;
        let msg = WireMsg::Rma(RmaRequest {
            id: req_id,
            epoch,
            window: id,
            op,
        });
        // Opening the connection is retried while the peer may be alive; a
        // request is never written twice (operations are not idempotent).
        let mut retry = Retry::new(self.peers_here);
        let (conn, sent) = loop {
            match self.out(target) {
                Ok(o) => break (o.conn, write_msg(&mut o.stream, &msg, max)),
                Err(false) if retry.wait(target) => {
                    self.drain_control();
                    if !matches!(self.peers.get(target), Some(PeerState::Up { incarnation: i, .. }) if *i == incarnation)
                    {
                        return Err(gone());
                    }
                }
                Err(_) => return Err(gone()),
            }
        };
        match sent {
            Ok(()) => {}
            Err(WireError::Oversized { len, max }) => {
                return Err(Error::Driver(format!(
                    "an RMA request of {len} bytes to rank {target} exceeds the transport's limit of {max} bytes"
                )));
            }
            Err(_) => {
                self.drop_out(target);
                return Err(gone());
            }
        }
        loop {
            match self.replies.recv_timeout(RMA_RECHECK) {
                Ok(Reply::Done { id, reply }) if id == req_id => {
                    return reply;
                }
                Ok(Reply::Done { .. }) => {} // a reply to an abandoned request
                Ok(Reply::Closed { conn: c }) => {
                    self.closed_out(c);
                    if c == conn {
                        return Err(gone());
                    }
                }
                // A reader's reply comes before its `Closed`, so an empty
                // channel and a dead target mean no reply is coming.
                Err(RecvTimeoutError::Timeout) => {
                    self.drain_control();
                    if self.up_incarnation(target) != Some(incarnation) {
                        return Err(gone());
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return Err(gone()),
            }
        }
    }

    fn with_local_window(&mut self, id: WinId, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        let rank = self.rank();
        self.sh
            .windows
            .with_local_live((rank, &self.sh.slot), id, f)
    }

    fn record(&mut self, stat: Stat) {
        let _ = send_ctl(&self.ctl, &WireMsg::Stat(stat), self.sh.max_frame);
    }

    fn report_progress(&mut self, fraction: f64) {
        if self.rank() == 0 && (fraction - self.last_progress).abs() >= 0.001 {
            self.last_progress = fraction;
            let _ = send_ctl(&self.ctl, &WireMsg::Progress(fraction), self.sh.max_frame);
        }
    }

    fn respawn(&mut self, rank: Rank) -> Result<()> {
        send_ctl(&self.ctl, &WireMsg::Respawn { rank }, self.sh.max_frame)
            .map_err(|e| Error::Driver(format!("asking the launcher to respawn rank {rank}: {e}")))
    }

    fn await_respawn(&mut self, rank: Rank) {
        self.drain_control();
        if let Some(p) = self.peers.get_mut(rank)
            && let PeerState::Gone { after } = *p
        {
            *p = PeerState::Respawning {
                after,
                queue: Vec::new(),
            };
        }
    }
}

/// Serve one accepted connection: authenticate, then deliver frames and
/// apply RMA requests until it closes. `place` is held until the peer has
/// authenticated (or failed to).
fn serve_connection(
    mut s: Stream,
    place: Handshaking,
    sh: Arc<Shared>,
    inbox: CountingSender<Arrival>,
) {
    let me = sh.me.rank.unwrap_or(0);
    let authenticated = handshake(&mut s, &sh.secret, sh.me, Role::Acceptor);
    drop(place);
    let peer = match authenticated {
        Ok(p) if p.rank.is_some() => p,
        Ok(p) => {
            tracing::warn!(
                rank = me,
                "lazarus: rank {me}: refused a connection from {p}: not a rank"
            );
            return;
        }
        // A peer killed while it connected is no intruder: its death is
        // reported by the launcher, not here.
        Err(e) if e.peer_vanished() => return,
        Err(e) => {
            tracing::warn!(rank = me, "lazarus: rank {me}: refused a connection: {e}");
            return;
        }
    };
    let from = peer.rank.unwrap_or(usize::MAX);
    let peer_pid = s.peer_pid();
    let mut wr = match s.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    // Small frames arrive whole in one read; large ones bypass the buffer.
    let mut s = std::io::BufReader::with_capacity(64 * 1024, s);
    loop {
        match read_msg(&mut s, sh.max_frame) {
            Ok(WireMsg::Frame(f)) if f.src == from => {
                if inbox.send(Arrival::In(Incoming::Frame(f))).is_err() {
                    return;
                }
            }
            Ok(WireMsg::ShmRing { name }) => {
                let ring = sh
                    .shm_dir
                    .as_deref()
                    .ok_or_else(|| "this rank uses no rings".to_string())
                    .and_then(|dir| {
                        RingReader::attach(dir, &name, peer_pid).map_err(|e| e.to_string())
                    });
                let ring = match ring {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(
                            rank = me,
                            peer = from,
                            "lazarus: rank {me}: closing the connection from rank {from}: \
                             cannot attach its ring: {e}"
                        );
                        return;
                    }
                };
                let arrival = Arrival::Ring {
                    from,
                    incarnation: peer.incarnation,
                    ring,
                };
                if inbox.send(arrival).is_err() {
                    return;
                }
            }
            Ok(WireMsg::Wake) => {
                if inbox.send(Arrival::Wake).is_err() {
                    return;
                }
            }
            Ok(WireMsg::Rma(req)) => {
                let reply = sh.windows.rma(req.epoch, me, req.window, req.op);
                let done = WireMsg::RmaDone { id: req.id, reply };
                if write_msg(&mut wr, &done, sh.max_frame).is_err() {
                    return;
                }
            }
            Ok(other) => {
                tracing::warn!(
                    rank = me,
                    peer = from,
                    "lazarus: rank {me}: closing the connection from rank {from}: unexpected {other:?}"
                );
                return;
            }
            Err(WireError::Closed) => return,
            // Ended inside a frame: the sender's process may have died,
            // which its failure notice will say.
            Err(e @ (WireError::Truncated { .. } | WireError::Io(_))) => {
                let _ = inbox.send(Arrival::Lost(LostWithSender {
                    what: "connection",
                    from,
                    incarnation: peer.incarnation,
                    why: e.to_string(),
                }));
                return;
            }
            Err(e) => {
                tracing::warn!(
                    rank = me,
                    peer = from,
                    "lazarus: rank {me}: closing the connection from rank {from}: {e}"
                );
                return;
            }
        }
    }
}

/// Every received payload is a fresh buffer, and a logging protocol keeps
/// them until receivers' checkpoints trim the logs. glibc would give large
/// freed buffers back to the kernel (munmap, or trimming the heap top), so
/// the next ones fault fresh pages in; keep freed memory for reuse instead.
#[allow(unsafe_code)]
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt takes two integers and only changes allocator
        // thresholds; it is called before this process starts its threads.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        }
    }
}

/// Run `f` as the rank this process was launched as. Returns the rank's
/// outcome after reporting it to the launcher.
pub(crate) fn run_worker<T: Serialize>(
    env: &LaunchEnv,
    cfg: &Config,
    placement: Placement,
    f: &RankFn<T>,
) -> Result<T> {
    die_with_launcher(env)?;
    keep_freed_memory();
    let rank = env.rank;
    let secret = Secret::read_from(&env.secret_file).map_err(|e| {
        Error::Driver(format!(
            "rank {rank}: cannot read the job secret {}: {e}",
            env.secret_file.display()
        ))
    })?;
    let me = Identity {
        job: env.job,
        rank: Some(rank),
        incarnation: env.incarnation,
    };
    let io =
        |what: &str, e: &dyn std::fmt::Display| Error::Driver(format!("rank {rank}: {what}: {e}"));
    let listener = Listener::bind(
        env.listen,
        &env.dir,
        &format!("r{rank}.{}.sock", env.incarnation),
    )
    .map_err(|e| io("cannot listen", &e))?;
    let addr = listener.addr().map_err(|e| io("no address", &e))?;
    let mut ctl =
        Stream::connect(&env.launcher).map_err(|e| io("cannot reach the launcher", &e))?;
    let launcher = handshake(&mut ctl, &secret, me, Role::Connector)
        .map_err(|e| io("launcher handshake", &e))?;
    if launcher.rank.is_some() {
        return Err(io("launcher handshake", &"the peer is not the launcher"));
    }
    let sh = Arc::new(Shared {
        me,
        secret,
        max_frame: env.max_frame,
        windows: WindowRegistry::default(),
        slot: Slot::new(env.incarnation),
        shm_dir: env.shm_dir.clone(),
    });
    // The rank is leaving: the launcher closing the control connection is
    // no news any more.
    let finished = Arc::new(AtomicBool::new(false));
    // The outcome is written: heartbeats may stop.
    let reported = Arc::new(AtomicBool::new(false));
    let ctl_rd = ctl.try_clone().map_err(|e| io("control socket", &e))?;
    let ctl = Arc::new(Mutex::new(ctl));
    send_ctl(
        &ctl,
        &WireMsg::Ready {
            addr: addr.to_string(),
            pid: std::process::id(),
            replaces: cfg.protocol.replaces_failed_ranks(),
            protocol: cfg.protocol.name().into(),
            reports_failures: cfg.failure_handling == crate::config::FailureHandling::Return,
        },
        env.max_frame,
    )
    .map_err(|e| io("control socket", &e))?;

    let (ctl_tx, ctl_rx) = watched();
    spawn_control_reader(ctl_rd, ctl_tx, finished.clone(), env.max_frame)?;
    spawn_heartbeat(
        ctl.clone(),
        super::heartbeat_period(env.heartbeat),
        reported.clone(),
        env.max_frame,
    )?;
    let (inbox_tx, inbox) = watched();
    {
        let sh = sh.clone();
        let inbox_tx = inbox_tx.clone();
        std::thread::Builder::new()
            .name("accept".into())
            .spawn(move || {
                let what = format!("rank {rank}");
                // The rank's process ends with its job: nothing stops this.
                let never = std::sync::atomic::AtomicBool::new(false);
                listener.serve(&what, &never, |s, place| {
                    let sh = sh.clone();
                    let tx = inbox_tx.clone();
                    // No thread (none left): the connection and its place
                    // are dropped with the closure.
                    let _ = std::thread::Builder::new()
                        .name("peer-reader".into())
                        .spawn(move || serve_connection(s, place, sh, tx));
                });
            })
            .map_err(|e| io("cannot start a thread", &e))?;
    }

    // Wait for the peer table; keep whatever else arrives first.
    let mut stashed = VecDeque::new();
    let peers = loop {
        match ctl_rx.rx.recv() {
            Ok(WireMsg::Peers { addrs }) => break addrs,
            Ok(other) => stashed.push_back(other),
            Err(_) => return Err(io("launcher", &"closed before the job started")),
        }
    };
    let mut plan = FaultPlan::new(&cfg.kills, placement.clone(), cfg.seed ^ rank as u64);
    for &i in &env.fired {
        plan.mark_fired(i);
    }
    let (replies_tx, replies) = unbounded();
    let mut ep = ProcessEndpoint {
        sh,
        size: env.size,
        start_epoch: env.epoch,
        t0: env.t0,
        inbox,
        self_tx: inbox_tx,
        rings: Vec::new(),
        rings_made: 0,
        scratch: Vec::new(),
        remote_spin: Duration::ZERO,
        yielding: Yielding::new(env.host_ranks),
        ctl_rx,
        ctl: ctl.clone(),
        peers: Vec::new(),
        replies,
        replies_tx,
        ready: VecDeque::new(),
        job_completed: false,
        stashed,
        armed: plan.armed_for(rank),
        plan,
        next_id: 0,
        next_conn: 0,
        last_progress: -1.0,
        spin: core_per_rank(env.host_ranks),
        mapped_windows: HashMap::new(),
        peers_here: env.host_ranks >= env.size,
        causes: HashMap::new(),
        lost: Vec::new(),
    };
    ep.set_peers(peers);
    // The value goes to the launcher before finalize too: a process killed
    // inside finalize after another rank has already left cannot be rolled
    // back any more, and need not be, since its value is known.
    let max = env.max_frame;
    let report_ctl = ctl.clone();
    let report = move |ctx: &mut crate::api::Ctx| -> Result<T> {
        let v = f(ctx)?;
        if let Ok(bytes) = postcard::to_allocvec(&v) {
            let _ = send_ctl(&report_ctl, &WireMsg::Finishing(bytes), max);
        }
        Ok(v)
    };
    // A launched program's ranks trace when the launcher asks.
    let traced;
    let cfg = match env.trace {
        Some(t) if cfg.trace.is_none() => {
            traced = Config {
                trace: Some(t),
                ..cfg.clone()
            };
            &traced
        }
        _ => cfg,
    };
    let outcome = rank_body(Box::new(ep), cfg, placement, &report);
    if let Some(usage) = crate::driver::shared::process_usage() {
        let _ = send_ctl(&ctl, &WireMsg::Stat(usage), env.max_frame);
    }
    let wire = match &outcome {
        Ok(v) => postcard::to_allocvec(v)
            .map(serde_bytes::ByteBuf::from)
            .map_err(|e| RemoteError::Other(format!("cannot encode the rank's result: {e}"))),
        Err(e) => Err(RemoteError::from(e)),
    };
    finished.store(true, Ordering::SeqCst);
    let sent = send_ctl(&ctl, &WireMsg::Exited(wire), env.max_frame);
    // Only now: encoding and writing a large outcome takes a while, which
    // silence would have made a death.
    reported.store(true, Ordering::SeqCst);
    sent.map_err(|e| io("cannot report the outcome", &e))?;
    outcome
}

/// The error for a frame over the transport's limit, saying what it
/// carried and what bounds it.
fn oversized(msg: &WireMsg, dest: Rank, len: usize, max: usize) -> Error {
    let what = match msg {
        WireMsg::Frame(Frame {
            body: Body::App(_), ..
        }) => "an application message",
        WireMsg::Frame(Frame {
            body: Body::Store(_),
            ..
        }) => {
            "a checkpoint piece (its rank's state, plus its message log under a logging \
             protocol: `Config::log_budget` bounds that)"
        }
        _ => "a runtime message",
    };
    Error::Driver(format!(
        "{what} of {len} bytes to rank {dest} exceeds the processes backend's frame limit of \
         {max} bytes (`Config::max_frame`; at most 1 TiB)"
    ))
}

/// Make sure this process dies with its launcher (`PR_SET_PDEATHSIG`), and
/// that the launcher is still there now.
fn die_with_launcher(env: &LaunchEnv) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(|e| Error::Driver(format!("PR_SET_PDEATHSIG: {e}")))?;
    }
    // The parent may be a wrapper the user put between launcher and
    // program (`sh -c`, `valgrind`): what matters is that the launcher is
    // still there. (If it dies later, the control connection closes.)
    if let Some(pid) = env.launcher_pid {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        if nix::sys::signal::kill(pid, None) == Err(nix::errno::Errno::ESRCH) {
            std::process::exit(1);
        }
    }
    Ok(())
}

fn spawn_control_reader(
    mut rd: Stream,
    tx: CountingSender<WireMsg>,
    finished: Arc<AtomicBool>,
    max: usize,
) -> Result<()> {
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            loop {
                let c = match read_msg(&mut rd, max) {
                    Ok(m) => m,
                    Err(e) => {
                        if finished.load(Ordering::SeqCst) {
                            return;
                        }
                        // The launcher is gone: so is the job.
                        tracing::error!("lazarus: the launcher went away ({e}); this rank exits");
                        std::process::exit(70);
                    }
                };
                if tx.send(c).is_err() {
                    return;
                }
            }
        })
        .map(|_| ())
        .map_err(|e| Error::Driver(format!("cannot start a thread: {e}")))
}

/// Heartbeat every `every` until `reported` (the rank's outcome is with
/// the launcher).
fn spawn_heartbeat(
    ctl: Arc<Mutex<Stream>>,
    every: Duration,
    reported: Arc<AtomicBool>,
    max: usize,
) -> Result<()> {
    std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(move || {
            while !reported.load(Ordering::SeqCst) {
                if send_ctl(&ctl, &WireMsg::Heartbeat, max).is_err() {
                    return;
                }
                std::thread::sleep(every);
            }
        })
        .map(|_| ())
        .map_err(|e| Error::Driver(format!("cannot start a thread: {e}")))
}
