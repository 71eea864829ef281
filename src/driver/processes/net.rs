//! Sockets of the processes backend: Unix domain sockets on one host, TCP
//! between hosts, behind one stream type so both carry the same framing.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use crate::{Error, Result};

/// Socket buffer size asked for on every connection.
const SOCKET_BUFFER: usize = 4 << 20;

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
                        "--listen",
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

    /// Wait for the next connection.
    pub fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Unix(l, _) => {
                let s = Stream::Unix(l.accept()?.0);
                s.set_buffers(SOCKET_BUFFER);
                Ok(s)
            }
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                let s = Stream::Tcp(s);
                s.set_buffers(SOCKET_BUFFER);
                Ok(s)
            }
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
