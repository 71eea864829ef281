//! Peer authentication with the per-job secret.
//!
//! Every connection starts with a mutual challenge–response: each side sends
//! `Hello` with a fresh 16-byte nonce, then proves it knows the job's secret
//! with HMAC-SHA256 over the *other* side's nonce, its own identity and its
//! role (connecting or accepting), so a proof can be neither replayed on
//! another connection nor reflected back at its author. The secret itself
//! never travels: it reaches the ranks through a 0600 file in the job's
//! private directory. A peer that fails is dropped and the failure logged
//! by the caller.

use std::path::Path;
use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::RngExt;
use sha2::Sha256;

use super::net::Stream;
use super::wire::{WireError, WireMsg, read_msg, write_msg};
use crate::Rank;

/// Length of the job secret, bytes.
pub const SECRET_LEN: usize = 32;

/// Handshake messages are tiny: refuse anything bigger before the peer is
/// authenticated.
const HANDSHAKE_MAX: usize = 256;

/// How long an unauthenticated peer may take to complete the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The job's shared secret.
#[derive(Clone)]
pub struct Secret([u8; SECRET_LEN]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A fresh random secret.
    pub fn generate() -> Self {
        let mut s = [0u8; SECRET_LEN];
        rand::rng().fill(&mut s[..]);
        Secret(s)
    }

    /// Write it to `path`, readable by the owner only.
    pub fn write_to(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        f.write_all(&self.0)?;
        f.sync_all()
    }

    /// Hexadecimal, for handing it to agents through the environment.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// From [`Secret::to_hex`]'s form.
    pub fn from_hex(s: &str) -> Option<Self> {
        let s = s.as_bytes();
        if s.len() != 2 * SECRET_LEN {
            return None;
        }
        let mut out = [0u8; SECRET_LEN];
        for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
            *o = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
        }
        Some(Secret(out))
    }

    /// Read it from `path`.
    pub fn read_from(path: &Path) -> std::io::Result<Self> {
        let bytes = std::fs::read(path)?;
        let arr: [u8; SECRET_LEN] = bytes.as_slice().try_into().map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "secret file {} holds {} bytes, expected {SECRET_LEN}",
                    path.display(),
                    bytes.len()
                ),
            )
        })?;
        Ok(Secret(arr))
    }

    fn mac(&self, role: Role, peer_nonce: &[u8; 16], me: &Identity) -> Hmac<Sha256> {
        // The key has a fixed valid length: HMAC accepts any key size.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        m.update(b"lazarus-handshake-v1");
        m.update(&[role as u8]);
        m.update(peer_nonce);
        m.update(&me.job.to_le_bytes());
        m.update(&me.rank.map_or(u64::MAX, |r| r as u64).to_le_bytes());
        m.update(&me.incarnation.to_le_bytes());
        m
    }
}

/// Who is at one end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Job id.
    pub job: u64,
    /// Rank (`None`: the launcher).
    pub rank: Option<Rank>,
    /// Incarnation of the rank.
    pub incarnation: u64,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rank {
            Some(r) => write!(f, "rank {r} (incarnation {})", self.incarnation),
            None => f.write_str("the launcher"),
        }?;
        write!(f, " of job {}", self.job)
    }
}

/// Which end of the connection is proving.
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
pub enum Role {
    /// The side that connected.
    Connector = 1,
    /// The side that accepted.
    Acceptor = 2,
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The transport failed or the peer sent something malformed.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The peer did not follow the protocol.
    #[error("unexpected handshake message: {0}")]
    Unexpected(String),
    /// The peer belongs to another job.
    #[error("peer belongs to job {got:#x}, not {want:#x}")]
    WrongJob {
        /// The peer's job id.
        got: u64,
        /// Ours.
        want: u64,
    },
    /// The peer's proof of the secret is wrong.
    #[error("peer {0} failed authentication (wrong proof of the job secret)")]
    BadProof(Identity),
}

impl HandshakeError {
    /// The other end went away between messages of the handshake (closed
    /// or reset): a peer killed while it connected, not one that failed to
    /// authenticate. A message cut short still counts as a failure.
    pub fn peer_vanished(&self) -> bool {
        use std::io::ErrorKind;
        match self {
            HandshakeError::Wire(WireError::Closed) => true,
            HandshakeError::Wire(WireError::Io(e)) => matches!(
                e.kind(),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
            ),
            _ => false,
        }
    }
}

/// Run the handshake on a fresh connection as `role`; returns the peer's
/// authenticated identity.
pub fn handshake(
    stream: &mut Stream,
    secret: &Secret,
    me: Identity,
    role: Role,
) -> Result<Identity, HandshakeError> {
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(WireError::Io)?;
    let mut nonce = [0u8; 16];
    rand::rng().fill(&mut nonce[..]);
    write_msg(
        stream,
        &WireMsg::Hello {
            job: me.job,
            rank: me.rank,
            incarnation: me.incarnation,
            nonce,
        },
        HANDSHAKE_MAX,
    )?;
    let (peer, peer_nonce) = match read_msg(stream, HANDSHAKE_MAX)? {
        WireMsg::Hello {
            job,
            rank,
            incarnation,
            nonce,
        } => (
            Identity {
                job,
                rank,
                incarnation,
            },
            nonce,
        ),
        other => return Err(HandshakeError::Unexpected(format!("{other:?}"))),
    };
    if peer.job != me.job {
        return Err(HandshakeError::WrongJob {
            got: peer.job,
            want: me.job,
        });
    }
    let proof = secret.mac(role, &peer_nonce, &me).finalize().into_bytes();
    let mut mac = [0u8; 32];
    mac.copy_from_slice(&proof);
    write_msg(stream, &WireMsg::Proof { mac }, HANDSHAKE_MAX)?;
    let peer_role = match role {
        Role::Connector => Role::Acceptor,
        Role::Acceptor => Role::Connector,
    };
    match read_msg(stream, HANDSHAKE_MAX)? {
        WireMsg::Proof { mac } => secret
            .mac(peer_role, &nonce, &peer)
            .verify_slice(&mac)
            .map_err(|_| HandshakeError::BadProof(peer))?,
        other => return Err(HandshakeError::Unexpected(format!("{other:?}"))),
    }
    // The acceptor gives up on a handshake that takes longer than
    // HANDSHAKE_TIMEOUT (a loaded machine can make it); without a last word
    // from it, a connector whose proof arrived after that would take the
    // closed connection for an open one and lose what it sent on it (a job
    // hung so, 12 rank processes on 2 busy cores). So the connector is up
    // only once the acceptor says it serves the connection, and retries
    // otherwise.
    match role {
        Role::Acceptor => write_msg(stream, &WireMsg::Welcome, HANDSHAKE_MAX)?,
        Role::Connector => match read_msg(stream, HANDSHAKE_MAX)? {
            WireMsg::Welcome => {}
            other => return Err(HandshakeError::Unexpected(format!("{other:?}"))),
        },
    }
    stream.set_read_timeout(None).map_err(WireError::Io)?;
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn pair() -> (Stream, Stream) {
        let (a, b) = UnixStream::pair().expect("socketpair");
        (Stream::Unix(a), Stream::Unix(b))
    }

    fn id(rank: Option<Rank>) -> Identity {
        Identity {
            job: 42,
            rank,
            incarnation: 0,
        }
    }

    #[test]
    fn same_secret_authenticates_both_ways() {
        let s = Secret::generate();
        let (mut a, mut b) = pair();
        let s2 = s.clone();
        let t = std::thread::spawn(move || handshake(&mut b, &s2, id(None), Role::Acceptor));
        let peer = handshake(&mut a, &s, id(Some(3)), Role::Connector).expect("connector ok");
        assert_eq!(peer, id(None));
        assert_eq!(t.join().expect("thread").expect("acceptor ok"), id(Some(3)));
    }

    /// An acceptor that proves itself and then drops the connection (its
    /// handshake timed out on a loaded machine) leaves the connector with
    /// an error to retry on, not a connection it would send frames into.
    #[test]
    fn a_connection_the_acceptor_gave_up_on_is_not_up() {
        let s = Secret::generate();
        let (mut a, mut b) = pair();
        let s2 = s.clone();
        let t = std::thread::spawn(move || {
            let me = id(None);
            let WireMsg::Hello { nonce, .. } = read_msg(&mut b, HANDSHAKE_MAX).expect("hello")
            else {
                panic!("not a hello");
            };
            let hello = WireMsg::Hello {
                job: me.job,
                rank: me.rank,
                incarnation: me.incarnation,
                nonce: [7; 16],
            };
            write_msg(&mut b, &hello, HANDSHAKE_MAX).expect("hello sent");
            let mut mac = [0u8; 32];
            mac.copy_from_slice(&s2.mac(Role::Acceptor, &nonce, &me).finalize().into_bytes());
            write_msg(&mut b, &WireMsg::Proof { mac }, HANDSHAKE_MAX).expect("proof sent");
            let _ = read_msg(&mut b, HANDSHAKE_MAX); // the connector's proof
            // ... and no `Welcome`: the connection is dropped.
        });
        let r = handshake(&mut a, &s, id(Some(3)), Role::Connector);
        t.join().expect("thread");
        assert!(r.is_err(), "{r:?}");
    }

    #[test]
    fn a_secret_crosses_the_environment_in_hex_unchanged() {
        let s = Secret::generate();
        let back = Secret::from_hex(&s.to_hex()).expect("round trip");
        assert_eq!(back.0, s.0);
        assert!(Secret::from_hex("00").is_none(), "short");
        let bad = "zz".repeat(SECRET_LEN);
        assert!(Secret::from_hex(&bad).is_none(), "not hex");
    }

    #[test]
    fn wrong_secret_is_refused_on_both_sides() {
        let (mut a, mut b) = pair();
        let t = std::thread::spawn(move || {
            handshake(&mut b, &Secret::generate(), id(None), Role::Acceptor)
        });
        let mine = handshake(&mut a, &Secret::generate(), id(Some(1)), Role::Connector);
        assert!(matches!(mine, Err(HandshakeError::BadProof(_))), "{mine:?}");
        let theirs = t.join().expect("thread");
        assert!(
            matches!(theirs, Err(HandshakeError::BadProof(_))),
            "{theirs:?}"
        );
    }

    #[test]
    fn garbage_instead_of_hello_is_refused() {
        use std::io::Write;
        let (mut a, mut b) = pair();
        let t = std::thread::spawn(move || {
            handshake(&mut b, &Secret::generate(), id(None), Role::Acceptor)
        });
        a.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("write");
        let r = t.join().expect("thread");
        assert!(matches!(r, Err(HandshakeError::Wire(_))), "{r:?}");
        assert!(r.is_err_and(|e| !e.peer_vanished()), "garbage is a refusal");
    }

    /// A peer that dies before or after its hello has vanished (not
    /// reported as a refusal); one that sends half a frame has not.
    #[test]
    fn a_peer_gone_mid_handshake_is_told_apart_from_a_refusal() {
        use std::io::Write;
        let accept = |b: Stream| {
            std::thread::spawn(move || {
                let mut b = b;
                handshake(&mut b, &Secret::generate(), id(None), Role::Acceptor)
            })
        };
        let (a, b) = pair();
        let t = accept(b);
        drop(a);
        let r = t.join().expect("thread");
        assert!(r.is_err_and(|e| e.peer_vanished()), "closed before hello");

        let (mut a, b) = pair();
        let t = accept(b);
        read_msg(&mut a, HANDSHAKE_MAX).expect("the acceptor's hello");
        a.write_all(&[0x40, 0, 0, 0, super::super::wire::WIRE_VERSION])
            .expect("write");
        drop(a);
        let r = t.join().expect("thread");
        assert!(r.is_err_and(|e| !e.peer_vanished()), "half a frame");

        let wrong = HandshakeError::BadProof(id(Some(1)));
        assert!(!wrong.peer_vanished());
        let reset = HandshakeError::Wire(WireError::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert!(reset.peer_vanished());
    }
}
