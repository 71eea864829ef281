//! Sockets of the processes backend: Unix domain sockets on one host, TCP
//! between hosts, behind one stream type so both carry the same framing.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::{Error, Result};

/// Socket buffer size asked for on every connection.
const SOCKET_BUFFER: usize = 4 << 20;

/// Connections of one listener in their handshake at once, at most: each
/// holds a thread and a descriptor until it authenticates or the handshake
/// times out, so strangers that connect and say nothing must not be able
/// to exhaust either. A legitimate handshake takes a few round trips, so
/// even a large job's ranks starting together rarely overlap this much
/// (and a refused rank-to-rank connection is retried).
pub const MAX_HANDSHAKING: usize = 256;

/// Pause of an accept loop after the system ran out of descriptors or
/// memory: accepting again at once would only fail again, while
/// connections ending meanwhile give some back.
const EXHAUSTED_BACKOFF: Duration = Duration::from_millis(10);

/// Where a process listens: `unix:PATH` or `tcp:IP:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    /// A Unix domain socket.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(SocketAddr),
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
            Addr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

impl FromStr for Addr {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if let Some(p) = s.strip_prefix("unix:") {
            return Ok(Addr::Unix(PathBuf::from(p)));
        }
        if let Some(a) = s.strip_prefix("tcp:") {
            return a
                .parse()
                .map(Addr::Tcp)
                .map_err(|e| Error::Driver(format!("bad TCP address `{a}`: {e}")));
        }
        Err(Error::Driver(format!(
            "bad address `{s}` (expected unix:PATH or tcp:IP:PORT)"
        )))
    }
}

/// Which kind of socket ranks listen on (`--listen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// Unix domain sockets in the job's private directory (one host);
    /// with `rings`, frames between ranks travel in shared-memory rings
    /// (`shm`) and the sockets carry RMA requests and doorbells.
    Unix {
        /// Frames in shared-memory rings.
        rings: bool,
    },
    /// TCP on this address (port chosen by the kernel). Loopback unless
    /// the user names another address.
    Tcp(IpAddr),
}

impl Default for Listen {
    fn default() -> Self {
        Listen::Unix { rings: true }
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Unix { rings: true } => f.write_str("unix"),
            Listen::Unix { rings: false } => f.write_str("unix-sockets"),
            Listen::Tcp(ip) => write!(f, "tcp:{ip}"),
        }
    }
}

impl FromStr for Listen {
    type Err = Error;
    /// `unix`, `unix-sockets`, `tcp` (loopback) or `tcp:IP`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "unix" => Ok(Listen::Unix { rings: true }),
            "unix-sockets" => Ok(Listen::Unix { rings: false }),
            "tcp" => Ok(Listen::Tcp(IpAddr::from([127, 0, 0, 1]))),
            _ => s
                .strip_prefix("tcp:")
                .and_then(|ip| ip.parse().ok())
                .map(Listen::Tcp)
                .ok_or_else(|| {
                    Error::config(
                        "listen",
                        format!(
                            "`{s}`: expected unix, unix-sockets, tcp or tcp:IP (e.g. tcp:10.0.0.5)"
                        ),
                    )
                }),
        }
    }
}

/// A listening socket.
pub enum Listener {
    /// Unix domain.
    Unix(UnixListener, PathBuf),
    /// TCP.
    Tcp(TcpListener),
}

impl Listener {
    /// Listen as `kind`; a Unix socket is created at `dir/name`.
    pub fn bind(kind: Listen, dir: &Path, name: &str) -> io::Result<Listener> {
        match kind {
            Listen::Unix { .. } => {
                let path = dir.join(name);
                let _ = std::fs::remove_file(&path);
                Ok(Listener::Unix(UnixListener::bind(&path)?, path))
            }
            Listen::Tcp(ip) => Ok(Listener::Tcp(TcpListener::bind((ip, 0))?)),
        }
    }

    /// The address peers connect to.
    pub fn addr(&self) -> io::Result<Addr> {
        match self {
            Listener::Unix(_, p) => Ok(Addr::Unix(p.clone())),
            Listener::Tcp(l) => Ok(Addr::Tcp(l.local_addr()?)),
        }
    }

    /// Wait for the next connection. An error is the listener's (see
    /// [`accept_loop`]): a connection that cannot be set up is dropped here
    /// and the next one awaited.
    pub fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Unix(l, _) => {
                let s = Stream::Unix(l.accept()?.0);
                s.set_buffers(SOCKET_BUFFER);
                Ok(s)
            }
            Listener::Tcp(l) => loop {
                let (s, _) = l.accept()?;
                // Failing on a fresh socket means the peer already reset
                // it: that connection is lost, not the listener.
                if s.set_nodelay(true).is_err() {
                    continue;
                }
                let s = Stream::Tcp(s);
                s.set_buffers(SOCKET_BUFFER);
                return Ok(s);
            },
        }
    }

    /// Accept connections for as long as the listener works (see
    /// [`accept_loop`]) and `stopping` is not set; `what` names the
    /// listener in messages.
    pub fn serve(&self, what: &str, stopping: &AtomicBool, serve: impl FnMut(Stream, Handshaking)) {
        accept_loop(|| self.accept(), MAX_HANDSHAKING, what, stopping, serve);
    }

    /// A handle that ends this listener's [`serve`](Self::serve) loop from
    /// another thread (a listener serving in a thread of its own blocks in
    /// `accept` for ever otherwise: a process that runs many jobs, as
    /// `lazarus bench` does, kept one thread and socket per job).
    pub fn stopper(&self) -> io::Result<AcceptStop> {
        let socket = match self {
            Listener::Unix(l, _) => l.as_fd().try_clone_to_owned()?,
            Listener::Tcp(l) => l.as_fd().try_clone_to_owned()?,
        };
        Ok(AcceptStop {
            socket,
            stopping: Arc::new(AtomicBool::new(false)),
        })
    }
}

/// Ends a listener's accept loop (see [`Listener::stopper`]).
#[derive(Debug)]
pub struct AcceptStop {
    /// The listening socket (a duplicate descriptor of it).
    socket: OwnedFd,
    /// Set before the socket is shut down: the accept error that follows
    /// is the stop, not a failure worth a message.
    stopping: Arc<AtomicBool>,
}

impl AcceptStop {
    /// The flag to hand to [`Listener::serve`].
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.stopping.clone()
    }

    /// End the loop: shutting the listening socket down wakes a blocked
    /// `accept` with an error (Linux: `EINVAL`, for Unix and TCP sockets
    /// alike), and the loop, seeing the flag, returns quietly. Connections
    /// already accepted are not affected.
    pub fn stop(&self) {
        use nix::sys::socket::{Shutdown, shutdown};
        use std::os::fd::AsRawFd;
        self.stopping.store(true, Ordering::Release);
        let _ = shutdown(self.socket.as_raw_fd(), Shutdown::Both);
    }
}

/// A connection's place among those of its listener in their handshake:
/// dropping it, once the peer has authenticated or failed to, frees the
/// place.
#[derive(Debug)]
pub struct Handshaking(Arc<AtomicUsize>);

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Hand every connection `next` accepts to `serve` (which starts a thread
/// of its own for it) with its [`Handshaking`] place, until `next` fails
/// in a way that means the listener itself is broken.
///
/// Only that ends the loop: an accept error is otherwise about one
/// connection (reset before it was accepted, a network error passed on)
/// or a shortage of descriptors or memory, which passes once connections
/// end, so the loop pauses briefly and goes on; peers must always be able
/// to connect. Beyond `limit` connections in their handshake at once, new
/// ones are closed at once (a flood of strangers, logged once).
pub fn accept_loop(
    mut next: impl FnMut() -> io::Result<Stream>,
    limit: usize,
    what: &str,
    stopping: &AtomicBool,
    mut serve: impl FnMut(Stream, Handshaking),
) {
    let handshaking = Arc::new(AtomicUsize::new(0));
    let mut told_full = false;
    let mut told_exhausted = false;
    loop {
        match next() {
            Ok(s) => {
                // Only this thread adds places: the check cannot race.
                if handshaking.load(Ordering::Acquire) >= limit {
                    if !told_full {
                        tracing::warn!(
                            "lazarus: {what}: more than {limit} connections are \
                             authenticating at once; closing new ones until some finish"
                        );
                        told_full = true;
                    }
                    s.shutdown();
                    continue;
                }
                handshaking.fetch_add(1, Ordering::AcqRel);
                serve(s, Handshaking(handshaking.clone()));
            }
            Err(_) if stopping.load(Ordering::Acquire) => return,
            Err(e) => match e.raw_os_error() {
                Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::ENOBUFS) => {
                    if !told_exhausted {
                        tracing::warn!(
                            "lazarus: {what}: cannot accept a connection ({e}); retrying"
                        );
                        told_exhausted = true;
                    }
                    std::thread::sleep(EXHAUSTED_BACKOFF);
                }
                Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EOPNOTSUPP) => {
                    tracing::warn!("lazarus: {what}: the listening socket failed ({e})");
                    return;
                }
                // One connection's failure (ECONNABORTED, EPROTO, a
                // network error passed on, EINTR): the next may be fine.
                _ => {}
            },
        }
    }
}

/// A connected socket of either kind.
#[derive(Debug)]
pub enum Stream {
    /// Unix domain.
    Unix(UnixStream),
    /// TCP (Nagle off: frames are small and latency matters).
    Tcp(TcpStream),
}

impl Stream {
    /// Connect to `addr`.
    pub fn connect(addr: &Addr) -> io::Result<Stream> {
        match addr {
            Addr::Unix(p) => {
                let s = Stream::Unix(UnixStream::connect(p)?);
                s.set_buffers(SOCKET_BUFFER);
                Ok(s)
            }
            Addr::Tcp(a) => {
                let s = TcpStream::connect_timeout(a, Duration::from_secs(5))?;
                s.set_nodelay(true)?;
                let s = Stream::Tcp(s);
                s.set_buffers(SOCKET_BUFFER);
                Ok(s)
            }
        }
    }

    /// Ask for socket buffers of `bytes` (the kernel caps them at
    /// `net.core.wmem_max`/`rmem_max`): a large message then crosses in a
    /// few wake-ups instead of one per 200 KiB. Best effort.
    pub fn set_buffers(&self, bytes: usize) {
        use nix::sys::socket::{setsockopt, sockopt};
        let _ = match self {
            Stream::Unix(s) => setsockopt(s, sockopt::SndBuf, &bytes)
                .and_then(|()| setsockopt(s, sockopt::RcvBuf, &bytes)),
            Stream::Tcp(s) => setsockopt(s, sockopt::SndBuf, &bytes)
                .and_then(|()| setsockopt(s, sockopt::RcvBuf, &bytes)),
        };
    }

    /// The process at the other end of a Unix connection, as the kernel
    /// saw it connect (`SO_PEERCRED`); `None` over TCP.
    pub fn peer_pid(&self) -> Option<libc::pid_t> {
        use nix::sys::socket::{getsockopt, sockopt};
        match self {
            Stream::Unix(s) => getsockopt(s, sockopt::PeerCredentials)
                .ok()
                .map(|c| c.pid()),
            Stream::Tcp(_) => None,
        }
    }

    /// Another handle on the same socket (one side reads, the other writes).
    pub fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Unix(s) => Ok(Stream::Unix(s.try_clone()?)),
            Stream::Tcp(s) => Ok(Stream::Tcp(s.try_clone()?)),
        }
    }

    /// Bound blocking reads (`None`: wait forever).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }

    /// The local address of a TCP connection: the interface that reaches
    /// the peer (an agent's ranks listen on it).
    pub fn local_ip(&self) -> Option<IpAddr> {
        match self {
            Stream::Unix(_) => None,
            Stream::Tcp(s) => s.local_addr().ok().map(|a| a.ip()),
        }
    }

    /// Close both directions (wakes a reader blocked on this socket).
    pub fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::rc::Rc;

    fn errno(e: i32) -> io::Result<Stream> {
        Err(io::Error::from_raw_os_error(e))
    }

    /// A connected pair: the accepted end and the peer's.
    fn pair() -> (Stream, UnixStream) {
        let (a, b) = UnixStream::pair().expect("socket pair");
        (Stream::Unix(a), b)
    }

    /// Whether the peer's end was closed by the other side.
    fn closed(peer: &mut UnixStream) -> bool {
        peer.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        matches!(peer.read(&mut [0u8; 1]), Ok(0))
    }

    /// Running out of descriptors, a connection aborted before it was
    /// accepted: the loop goes on and serves the next connection; only a
    /// broken listener ends it.
    #[test]
    fn accept_errors_do_not_stop_the_loop() {
        let (s, _peer) = pair();
        let mut script: VecDeque<io::Result<Stream>> = VecDeque::from([
            errno(libc::EMFILE),
            errno(libc::ECONNABORTED),
            errno(libc::ENOBUFS),
            errno(libc::EPROTO),
            Ok(s),
            errno(libc::EBADF),
        ]);
        let mut served = 0;
        accept_loop(
            || script.pop_front().unwrap_or_else(|| errno(libc::EBADF)),
            4,
            "test",
            &AtomicBool::new(false),
            |_, _| served += 1,
        );
        assert_eq!(served, 1);
        assert!(script.is_empty());
    }

    /// Beyond the bound of connections in their handshake, a new one is
    /// closed at once; once a place is free, the next is served again.
    #[test]
    fn handshakes_beyond_the_bound_are_closed_and_later_ones_served() {
        let places: Rc<RefCell<Vec<Handshaking>>> = Rc::default();
        let mut open = Vec::new();
        let (s1, _p1) = pair();
        let (s2, _p2) = pair();
        let (s3, mut p3) = pair();
        let (s4, mut p4) = pair();
        let mut script = VecDeque::from([s1, s2, s3, s4]);
        let mut step = 0;
        let held = places.clone();
        accept_loop(
            || {
                step += 1;
                if step == 4 {
                    // The first connection authenticates: its place frees.
                    held.borrow_mut().remove(0);
                }
                script
                    .pop_front()
                    .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
            },
            2,
            "test",
            &AtomicBool::new(false),
            |s, place| {
                places.borrow_mut().push(place);
                // Kept open, as a handshake thread would.
                open.push(s);
            },
        );
        assert!(closed(&mut p3), "the third connection is closed at once");
        assert!(!closed(&mut p4), "the fourth is served");
        assert_eq!((places.borrow().len(), open.len()), (2, 3));
    }

    /// On a real socket: strangers that connect and never speak hold every
    /// place; once they leave, a peer is served again.
    #[test]
    fn a_listener_serves_again_after_a_flood_of_silent_connections() {
        let dir = std::env::temp_dir().join(format!("lazarus-net-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let l = Listener::bind(Listen::Unix { rings: false }, &dir, "flood.sock").expect("bind");
        let Ok(Addr::Unix(path)) = l.addr() else {
            panic!("a Unix address");
        };
        std::thread::spawn(move || {
            accept_loop(
                || l.accept(),
                4,
                "test",
                &AtomicBool::new(false),
                |mut s, place| {
                    std::thread::spawn(move || {
                        // The "handshake": one byte, echoed.
                        let mut b = [0u8; 1];
                        if s.read_exact(&mut b).is_ok() {
                            drop(place);
                            let _ = s.write_all(&b);
                            let _ = s.read(&mut b);
                        }
                    });
                },
            )
        });
        let silent: Vec<UnixStream> = (0..4)
            .map(|_| UnixStream::connect(&path).expect("connect"))
            .collect();
        let mut refused = UnixStream::connect(&path).expect("connect");
        assert!(closed(&mut refused), "a fifth stranger is closed");
        drop(silent);
        // The strangers' places free as their threads see them go.
        let t0 = std::time::Instant::now();
        loop {
            let mut s = UnixStream::connect(&path).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut b = [0u8; 1];
            if s.write_all(b"x").is_ok() && s.read_exact(&mut b).is_ok() {
                assert_eq!(&b, b"x");
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "no peer served after the flood"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A listener serving in its own thread, blocked in `accept`, ends when
    /// stopped, quietly, on both kinds of socket; a connection it accepted
    /// before stays open.
    #[test]
    fn a_stopped_listener_ends_its_accept_loop() {
        let dir = std::env::temp_dir().join(format!("lazarus-net-stop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        for kind in [
            Listen::Unix { rings: false },
            Listen::Tcp(IpAddr::from([127, 0, 0, 1])),
        ] {
            let l = Listener::bind(kind, &dir, "stop.sock").expect("bind");
            let addr = l.addr().expect("addr");
            let stop = l.stopper().expect("stopper");
            let flag = stop.flag();
            let (tx, rx) = std::sync::mpsc::channel();
            let (done_tx, done) = std::sync::mpsc::channel();
            let t = std::thread::spawn(move || {
                l.serve("test", &flag, |s, _| tx.send(s).expect("send"));
                done_tx.send(()).expect("done");
            });
            let mut client = Stream::connect(&addr).expect("connect");
            let mut served = rx.recv_timeout(Duration::from_secs(5)).expect("served");
            // Still blocked in accept, waiting for the next connection.
            assert!(done.recv_timeout(Duration::from_millis(50)).is_err());
            stop.stop();
            done.recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("{kind:?}: the accept loop did not end"));
            t.join().expect("join");
            client.write_all(b"y").expect("write");
            let mut b = [0u8; 1];
            served.read_exact(&mut b).expect("read");
            assert_eq!(&b, b"y", "{kind:?}: the accepted connection stays open");
            assert!(Stream::connect(&addr).is_err(), "{kind:?}: nobody listens");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
