//! The wire format of the processes backend: length-prefixed, versioned
//! frames, the same on Unix domain sockets and TCP.
//!
//! ```text
//! | len: u32 LE | version: u8 | header_len: u32 LE | header (postcard) | payload (raw) |
//!               <------------------------- len bytes --------------------------------->
//! ```
//!
//! A frame of 4 GiB − 1 bytes or more (a large rank's checkpoint piece, or
//! an application message that large) has [`LONG_LEN`] in place of `len`,
//! followed by its length as a u64 LE; the rest is the same.
//!
//! An application frame, the message on every hot path, has its own fixed
//! layout instead (no postcard, no header length):
//!
//! ```text
//! | len: u32 LE | APP_FRAME: u8 | src epoch envelope.src envelope.dest context: u64 LE | tag: i32 LE | ssn: u64 LE | payload (raw) |
//! ```
//!
//! Otherwise the header is a postcard-encoded [`WireMsg`]. An application payload does
//! not go through postcard: the sender writes it straight from its shared
//! buffer after the header, and the receiver hands out a slice of the frame
//! it read, so a payload is copied only by the kernel (DESIGN principle 4).
//!
//! A frame longer than the configured maximum, a wrong version, a header that
//! does not decode or a connection that ends inside a frame is a
//! [`WireError`]: the reader closes that connection. Nothing is allocated
//! beyond what has actually arrived (a frame announcing 1 GiB and sending
//! 10 bytes costs at most one read chunk), and nothing panics.

use std::io::{self, Read, Write};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::Rank;
use crate::driver::{RmaOp, RmaReply, Stat, WinId};
use crate::engine::frame::{AppMessage, Body, Envelope, Frame};
use crate::segments::Segments;
use crate::store::StoreMsg;

/// Version of the wire format; a peer speaking another one is refused
/// (6: a failure notice carries its cause; 7: the acceptor ends the
/// handshake with `Welcome`).
pub const WIRE_VERSION: u8 = 7;

/// Bytes before the header: `len` and `version` and `header_len`.
const PREFIX: usize = 4 + 1 + 4;

/// In place of the version: an application frame in the fixed layout.
pub const APP_FRAME: u8 = 0xA1;

/// In place of the version, in a shared-memory ring only: an application
/// frame whose payload stays in the sender's memory, for the receiver to
/// copy straight out of it (`shm`'s cross-memory attach): its fixed
/// fields, then the payload's address and length as two u64 LE.
pub const APP_REMOTE: u8 = 0xA2;

/// In place of the version, in a shared-memory ring only: a frame whose
/// detached payload (a checkpoint piece's segments) stays in the sender's
/// memory as a list of buffers, for the receiver to copy out after the
/// frame's own bytes (`shm`'s cross-memory attach).
pub const FRAME_REMOTE: u8 = 0xA3;

/// Bytes of an application frame's fixed fields after `len` (the marker,
/// six u64 and the tag).
pub const APP_FIXED: usize = 1 + 6 * 8 + 4;

/// In place of a frame's 32-bit length: its length follows as a u64 (a
/// frame of this many bytes or more).
pub const LONG_LEN: u32 = u32::MAX;

/// Bytes of a long frame's length prefix: [`LONG_LEN`] and the u64.
pub const LONG_PREFIX: usize = 4 + 8;

/// Largest read buffer grown at once while a frame arrives.
const CHUNK: usize = 1 << 20;

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The peer closed the connection between frames (not an error of the
    /// peer: the reader just stops).
    #[error("connection closed")]
    Closed,
    /// The connection ended inside a frame.
    #[error("truncated frame: connection ended after {got} of {expected} bytes")]
    Truncated {
        /// Bytes of the frame received.
        got: usize,
        /// Bytes announced.
        expected: usize,
    },
    /// The frame announces more bytes than allowed.
    #[error("oversized frame: {len} bytes announced, at most {max} allowed")]
    Oversized {
        /// Announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The frame is of another wire version.
    #[error("wire version {got} is not supported (this is version {WIRE_VERSION})")]
    Version {
        /// Version received.
        got: u8,
    },
    /// The frame's structure is wrong.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// The sender's process ended while this process was copying a payload
    /// out of its memory (a remote record): the message is lost with its
    /// sender, whose failure is then handled as any other.
    #[error("the sending process {pid} ended while its {len}-byte payload was being read")]
    SenderGone {
        /// The sender's process id.
        pid: i32,
        /// The payload's length.
        len: usize,
    },
    /// The socket failed.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
}

/// A one-sided operation in flight (the origin waits for the reply with the
/// same `id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RmaRequest {
    /// Origin-chosen request id.
    pub id: u64,
    /// The origin's window epoch.
    pub epoch: u64,
    /// The window.
    pub window: WinId,
    /// The operation (its data travels in the header: RMA operands are small).
    pub op: RmaOp,
}

/// Everything that travels on a connection of the processes backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WireMsg {
    /// First message on every connection: who is speaking, and a nonce the
    /// other side must answer with a proof of the job secret.
    Hello {
        /// Job identifier (both sides must agree).
        job: u64,
        /// The speaker's rank, `None` for the launcher.
        rank: Option<Rank>,
        /// The speaker's incarnation.
        incarnation: u64,
        /// Fresh random challenge.
        nonce: [u8; 16],
    },
    /// HMAC-SHA256 over the peer's nonce (see `auth`).
    Proof {
        /// The MAC.
        mac: [u8; 32],
    },
    /// The acceptor verified the connector's proof and serves the
    /// connection: the last message of the handshake (see `auth`).
    Welcome,
    /// A frame of the engine; an application payload follows the header.
    Frame(Frame),
    /// An RMA operation for the receiver's window memory.
    Rma(RmaRequest),
    /// The reply to request `id`.
    RmaDone {
        /// Request id.
        id: u64,
        /// The reply, or the target's error.
        reply: Result<RmaReply, crate::Error>,
    },
    /// Worker → launcher: this rank is up and listens at `addr`.
    Ready {
        /// Listening address (see `net::Addr`).
        addr: String,
        /// OS process id.
        pid: u32,
        /// Whether the rank's protocol wants failed ranks replaced.
        replaces: bool,
        /// The rank's protocol (for error messages).
        protocol: String,
        /// Failures are reported to the program (ULFM): a rank that dies
        /// and is not respawned is left out of the job's values.
        reports_failures: bool,
    },
    /// Worker → launcher: start a new incarnation of the dead `rank` (ULFM
    /// respawn).
    Respawn {
        /// The rank.
        rank: Rank,
    },
    /// Worker → launcher: still alive.
    Heartbeat,
    /// Worker → launcher: a statistic.
    Stat(Stat),
    /// Worker → launcher: progress of rank 0.
    Progress(f64),
    /// Worker → launcher: fault injection wants `victims` killed now (kill
    /// specification number `index`).
    KillRequest {
        /// Index of the kill specification.
        index: usize,
        /// Ranks to kill at the same instant.
        victims: Vec<Rank>,
    },
    /// Worker → launcher: the rank function returned this value (postcard)
    /// and the rank enters finalize. (Values are encoded as byte strings,
    /// one copy, not byte by byte as a sequence: they can be large.)
    Finishing(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Worker → launcher: the rank function's final outcome (postcard of the
    /// value, or the error).
    Exited(Result<serde_bytes::ByteBuf, RemoteError>),
    /// Launcher → worker: every rank's incarnation and listening address
    /// (`None` while a rank is being replaced or is gone).
    Peers {
        /// `(incarnation, address)` per rank.
        addrs: Vec<Option<(u64, String)>>,
    },
    /// Launcher → worker: `rank` (incarnation `incarnation`) listens at `addr`.
    PeerUp {
        /// The rank.
        rank: Rank,
        /// Its new incarnation.
        incarnation: u64,
        /// Its address.
        addr: String,
    },
    /// Launcher → worker: a failure event.
    FailureNotice {
        /// New world epoch.
        epoch: u64,
        /// Ranks that died, with the incarnation that died.
        dead: Vec<(Rank, u64)>,
        /// Whether replacements are being started.
        respawn: bool,
        /// Why the launcher declared them dead, for the ranks' logs (a
        /// fault-injection kill, an exit status, heartbeat silence...).
        cause: String,
    },
    /// Launcher → worker: the job is aborted.
    Abort {
        /// The rank at fault.
        rank: Rank,
        /// Its error.
        reason: String,
    },
    /// Launcher → worker: answer to a `KillRequest`.
    KillAnswer {
        /// True: the kill fires (the victims are being killed).
        granted: bool,
    },
    /// Worker → launcher: finalize's leader has every live rank's `Done`
    /// as of world epoch `epoch` (see `Endpoint::conclude`).
    Conclude {
        /// The leader's world epoch.
        epoch: u64,
    },
    /// Launcher → worker: answer to `Conclude`.
    Concluded {
        /// True: no failure happened since that epoch, and no fault plan
        /// kill fires any more.
        granted: bool,
    },
    /// Rank → rank: every later frame of this channel travels in the
    /// shared-memory ring `name` of the job's shared-memory directory (see
    /// `shm`).
    ShmRing {
        /// The ring's file name.
        name: String,
    },
    /// Rank → rank: a frame was put in a ring whose receiver sleeps.
    Wake,
    /// Agent → launcher, first message: the host the agent runs on.
    AgentHello {
        /// Host name (Slurm's `SLURMD_NODENAME`, else the kernel's).
        host: String,
        /// The agent's process id.
        pid: u32,
    },
    /// Launcher → agent: a file the rank processes read (written to the
    /// agent's private directory; its path replaces the variable `var`).
    AgentFile {
        /// Variable of the rank environment that names the file.
        var: String,
        /// File name in the agent's directory.
        name: String,
        /// Content.
        bytes: Vec<u8>,
    },
    /// Launcher → agent: start incarnation `incarnation` of `rank`.
    Spawn {
        /// The rank.
        rank: Rank,
        /// Its incarnation.
        incarnation: u64,
        /// The program (bytes of the path).
        program: Vec<u8>,
        /// Its arguments (bytes).
        args: Vec<Vec<u8>>,
        /// The rank's `LAZARUS_*` environment.
        env: Vec<(String, String)>,
        /// Discard the rank's standard output.
        quiet_stdout: bool,
    },
    /// Agent → launcher: a rank process ended (or could not be started).
    RankExited {
        /// The rank.
        rank: Rank,
        /// Its incarnation.
        incarnation: u64,
        /// Exit status, or why it could not start.
        status: String,
    },
    /// Launcher → agent: kill these rank incarnations with `SIGKILL` now.
    KillRanks {
        /// `(rank, incarnation)` pairs.
        ranks: Vec<(Rank, u64)>,
    },
    /// Agent → launcher: the processes of a `KillRanks` are dead and reaped.
    Killed {
        /// `(rank, incarnation)` pairs.
        ranks: Vec<(Rank, u64)>,
    },
    /// Launcher → agent: the job is over; kill what is left and exit.
    Shutdown,
    /// Launcher → worker: every rank's value is known; leave finalize.
    JobComplete,
    /// Rank → rank (the mpi backend on ULFM): kill specification `index`
    /// of the fault plan fired. Its trigger dies with it, and a
    /// substitute must not fire it again.
    KillFired {
        /// Index of the kill specification.
        index: usize,
    },
}

/// A rank's error, as it crosses to the launcher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RemoteError {
    /// Killed by fault injection.
    Killed,
    /// `Error::ProcessFailed`.
    ProcessFailed {
        /// Dead ranks.
        ranks: Vec<Rank>,
        /// Protocol.
        protocol: String,
        /// Why.
        why: String,
    },
    /// `Error::Aborted`.
    Aborted {
        /// Rank at fault.
        rank: Rank,
        /// Its error.
        reason: String,
    },
    /// `Error::Config`.
    Config {
        /// Option.
        option: String,
        /// Detail.
        detail: String,
    },
    /// `Error::App`.
    App(String),
    /// Any other error, as text.
    Other(String),
    /// `Error::Unrecoverable`.
    Unrecoverable(String),
}

impl From<&crate::Error> for RemoteError {
    fn from(e: &crate::Error) -> Self {
        use crate::Error as E;
        match e {
            E::Killed => RemoteError::Killed,
            E::ProcessFailed {
                ranks,
                protocol,
                why,
            } => RemoteError::ProcessFailed {
                ranks: ranks.clone(),
                protocol: protocol.clone(),
                why: why.clone(),
            },
            E::Aborted { rank, reason } => RemoteError::Aborted {
                rank: *rank,
                reason: reason.clone(),
            },
            E::Config { option, detail } => RemoteError::Config {
                option: option.clone(),
                detail: detail.clone(),
            },
            E::App(m) => RemoteError::App(m.clone()),
            E::Unrecoverable(m) => RemoteError::Unrecoverable(m.to_string()),
            // Without its "driver error: " prefix: it comes back as a
            // driver error naming the rank.
            E::Driver(m) => RemoteError::Other(m.clone()),
            other => RemoteError::Other(other.to_string()),
        }
    }
}

impl RemoteError {
    /// Back to the runtime's error type (`rank` names the sender of `Other`).
    pub fn into_error(self, rank: Rank) -> crate::Error {
        use crate::Error as E;
        match self {
            RemoteError::Killed => E::Killed,
            RemoteError::ProcessFailed {
                ranks,
                protocol,
                why,
            } => E::ProcessFailed {
                ranks,
                protocol,
                why,
            },
            RemoteError::Aborted { rank, reason } => E::Aborted { rank, reason },
            RemoteError::Config { option, detail } => E::Config { option, detail },
            RemoteError::App(m) => E::App(m),
            RemoteError::Other(m) => E::Driver(format!("rank {rank}: {m}")),
            RemoteError::Unrecoverable(m) => E::Unrecoverable(m.into()),
        }
    }
}

/// Payloads up to this size are copied next to the header so the frame
/// leaves in one system call; larger ones are written from their buffer.
const INLINE_PAYLOAD: usize = 16 * 1024;

/// Encode `msg` and write it to `w`. An application payload is written from
/// its shared buffer without a copy (above `INLINE_PAYLOAD`).
pub fn write_msg(w: &mut impl Write, msg: &WireMsg, max: usize) -> Result<(), WireError> {
    let mut head = Vec::new();
    let detached = encode_into(msg, max, &mut head)?;
    w.write_all(&head)?;
    for part in detached {
        w.write_all(part)?;
    }
    w.flush()?;
    Ok(())
}

/// Encode `msg` as the bytes of one frame into `buf` (cleared first; a
/// sender reuses one buffer instead of allocating per frame): the head
/// (length prefix, format byte, header, and a payload up to
/// `INLINE_PAYLOAD`). Returns what follows the head on the wire, still the
/// sender's shared buffers: nothing, an application payload, or the
/// segments of a checkpoint piece.
pub fn encode_into<'m>(
    msg: &'m WireMsg,
    max: usize,
    buf: &mut Vec<u8>,
) -> Result<&'m [Bytes], WireError> {
    buf.clear();
    if let WireMsg::Frame(Frame {
        src,
        epoch,
        body: Body::App(app),
    }) = msg
        && fixed_layout(app)
    {
        let inline = encode_app(*src, *epoch, app, max, buf)?;
        return Ok(if inline {
            &[]
        } else {
            std::slice::from_ref(&app.payload)
        });
    }
    // A checkpoint piece (or an application message too long for the
    // fixed layout) follows the header as it is: not copied into the frame
    // on the way out (a piece's segments are written one after the other),
    // nor out of it on the way in (`decode`).
    if let WireMsg::Frame(frame) = msg
        && let Some(parts) = detached_payload(&frame.body)
    {
        let len = parts.iter().map(Bytes::len).sum();
        let mut head = frame.clone();
        detach(&mut head.body);
        encode_header(&WireMsg::Frame(head), len, max, buf)?;
        return Ok(parts);
    }
    encode_header(msg, 0, max, buf)?;
    Ok(&[])
}

/// Whether an application message fits the fixed layout, whose length is
/// 32 bits (a longer one travels as a long frame with a header).
pub fn fixed_layout(app: &AppMessage) -> bool {
    APP_FIXED + app.payload.len() < LONG_LEN as usize
}

/// The bytes of a frame body that travel after its header, not inside it:
/// an application payload, or a checkpoint piece's segments.
fn detached_payload(body: &Body) -> Option<&[Bytes]> {
    match body {
        Body::App(app) => Some(std::slice::from_ref(&app.payload)),
        Body::Store(StoreMsg::Put(p) | StoreMsg::Piece(p)) => Some(p.data.segments()),
        _ => None,
    }
}

/// Take [`detached_payload`] out of a header about to be encoded.
fn detach(body: &mut Body) {
    match body {
        Body::App(app) => app.payload = Bytes::new(),
        Body::Store(StoreMsg::Put(p) | StoreMsg::Piece(p)) => p.data = Segments::default(),
        _ => {}
    }
}

/// Put the bytes that followed a decoded header back into its body; false
/// if the body takes none, or already has some.
fn attach(body: &mut Body, payload: Bytes) -> bool {
    match body {
        Body::App(app) if app.payload.is_empty() => app.payload = payload,
        Body::Store(StoreMsg::Put(p) | StoreMsg::Piece(p)) if p.data.is_empty() => {
            p.data = payload.into();
        }
        _ => return false,
    }
    true
}

/// Encode the header of `msg` in place after the prefix, whose lengths are
/// filled in once known; `payload` bytes follow the header on the wire.
fn encode_header(
    msg: &WireMsg,
    payload: usize,
    max: usize,
    buf: &mut Vec<u8>,
) -> Result<(), WireError> {
    buf.resize(PREFIX, 0);
    *buf = postcard::to_extend(msg, std::mem::take(buf))
        .map_err(|e| WireError::Malformed(format!("cannot encode: {e}")))?;
    let header_len = buf.len() - PREFIX;
    let len = 1 + 4 + header_len + payload;
    if len > max {
        return Err(WireError::Oversized { len, max });
    }
    let hlen = u32::try_from(header_len).map_err(|_| {
        WireError::Malformed(format!(
            "a header of {header_len} bytes does not fit its 32-bit length"
        ))
    })?;
    buf[4] = WIRE_VERSION;
    buf[5..9].copy_from_slice(&hlen.to_le_bytes());
    match u32::try_from(len) {
        Ok(len32) if len32 != LONG_LEN => buf[0..4].copy_from_slice(&len32.to_le_bytes()),
        // Rare and huge: moving the (small) header over costs nothing
        // next to the payload.
        _ => {
            buf[0..4].copy_from_slice(&LONG_LEN.to_le_bytes());
            buf.splice(4..4, (len as u64).to_le_bytes());
        }
    }
    Ok(())
}

/// Read one frame from `r` (at most `max` bytes after the length prefix).
pub fn read_msg(r: &mut impl Read, max: usize) -> Result<WireMsg, WireError> {
    decode(read_frame(r, max)?)
}

/// Read the bytes of one frame from `r` (everything after the length
/// prefix, at most `max`), to be [`decode`]d: a reader that must tell
/// receiving a large frame from decoding it uses the two apart.
pub fn read_frame(r: &mut impl Read, max: usize) -> Result<Bytes, WireError> {
    let mut len_bytes = [0u8; 4];
    match read_exactly(r, &mut len_bytes, 0) {
        // Nothing of a next frame: the peer closed between frames.
        Err(WireError::Truncated { got: 0, .. }) => return Err(WireError::Closed),
        r => r?,
    }
    let mut len = u32::from_le_bytes(len_bytes) as usize;
    if len == LONG_LEN as usize {
        let mut long = [0u8; 8];
        read_exactly(r, &mut long, 4)?;
        len = long_len(long, max)?;
    }
    if len > max {
        return Err(WireError::Oversized { len, max });
    }
    if len < 5 {
        return Err(WireError::Malformed(format!(
            "frame of {len} bytes is shorter than its own prefix"
        )));
    }
    // Grow the buffer only as data arrives (see `growth`). `read_to_end`
    // fills spare capacity without zeroing it first.
    let mut buf: Vec<u8> = Vec::new();
    while buf.len() < len {
        let want = growth(buf.len(), len);
        buf.reserve_exact(want);
        let n = r.by_ref().take(want as u64).read_to_end(&mut buf)?;
        if n < want {
            return Err(WireError::Truncated {
                got: buf.len(),
                expected: len,
            });
        }
    }
    Ok(Bytes::from(buf))
}

/// Fill `buf` from `r`; `before` bytes of the frame came before it (for
/// the error when the connection ends inside it).
fn read_exactly(r: &mut impl Read, buf: &mut [u8], before: usize) -> Result<(), WireError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(WireError::Truncated {
                    got: before + got,
                    expected: before + buf.len(),
                });
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The length of a long frame from its u64 (after [`LONG_LEN`]), at most
/// `max`.
pub fn long_len(bytes: [u8; 8], max: usize) -> Result<usize, WireError> {
    let len = u64::from_le_bytes(bytes);
    usize::try_from(len)
        .ok()
        .filter(|&l| l <= max)
        .ok_or(WireError::Oversized {
            len: usize::try_from(len).unwrap_or(usize::MAX),
            max,
        })
}

/// How many bytes to grow a buffer holding `have` bytes of a `len`-byte
/// frame by: one chunk, or as many as have arrived already if more, and
/// never past the frame's end. A frame announcing 1 GiB and sending 10
/// bytes then costs one chunk, not 1 GiB; a large one grows geometrically
/// (few reallocations) and ends in a buffer of exactly its size.
pub fn growth(have: usize, len: usize) -> usize {
    len.saturating_sub(have).min(CHUNK.max(have))
}

/// Bytes of an application frame before its payload: the length prefix and
/// the fixed fields.
pub const APP_HEAD: usize = 4 + APP_FIXED;

/// The head of an application frame (length prefix and fixed fields); the
/// payload follows it on the wire. A sender may write the two from where
/// they are, without assembling the frame.
pub fn app_head(
    src: Rank,
    epoch: u64,
    app: &AppMessage,
    max: usize,
) -> Result<[u8; APP_HEAD], WireError> {
    let len = APP_FIXED + app.payload.len();
    if len > max {
        return Err(WireError::Oversized { len, max });
    }
    let len32 = u32::try_from(len).map_err(|_| WireError::Oversized { len, max })?;
    let mut h = [0u8; APP_HEAD];
    h[0..4].copy_from_slice(&len32.to_le_bytes());
    h[4] = APP_FRAME;
    let e = &app.envelope;
    let words = [src as u64, epoch, e.src as u64, e.dest as u64, e.context];
    for (i, v) in words.into_iter().enumerate() {
        h[5 + 8 * i..13 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    h[45..49].copy_from_slice(&e.tag.to_le_bytes());
    h[49..57].copy_from_slice(&app.ssn.to_le_bytes());
    Ok(h)
}

/// The head of an application frame in its fixed layout, into `buf`, with
/// the payload when it is small; returns whether it was (otherwise the
/// payload follows the head from its own buffer).
fn encode_app(
    src: Rank,
    epoch: u64,
    app: &AppMessage,
    max: usize,
    buf: &mut Vec<u8>,
) -> Result<bool, WireError> {
    let head = app_head(src, epoch, app, max)?;
    let payload = &app.payload;
    let inline = payload.len() <= INLINE_PAYLOAD;
    buf.reserve(APP_HEAD + if inline { payload.len() } else { 0 });
    buf.extend_from_slice(&head);
    if inline {
        buf.extend_from_slice(payload);
    }
    Ok(inline)
}

/// Decode an application frame in its fixed layout.
fn decode_app(frame: Bytes) -> Result<WireMsg, WireError> {
    let Some(fixed) = frame.first_chunk::<APP_FIXED>() else {
        return Err(WireError::Malformed(format!(
            "application frame of {} bytes is shorter than its fixed fields",
            frame.len()
        )));
    };
    decode_app_parts(fixed, frame.slice(APP_FIXED..))
}

/// Decode an application frame from its fixed fields (the marker first)
/// and its payload, which becomes the message's payload as it is: a ring
/// reads the two apart, so the payload is an exact buffer of its own.
pub fn decode_app_parts(fixed: &[u8; APP_FIXED], payload: Bytes) -> Result<WireMsg, WireError> {
    if fixed[0] != APP_FRAME {
        return Err(WireError::Malformed("not an application frame".into()));
    }
    let u64_at = |i: usize| {
        let at = 1 + 8 * i;
        let mut b = [0u8; 8];
        b.copy_from_slice(&fixed[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let rank = |v: u64| {
        Rank::try_from(v).map_err(|_| WireError::Malformed(format!("rank {v} out of range")))
    };
    let mut tag = [0u8; 4];
    tag.copy_from_slice(&fixed[41..45]);
    let mut ssn = [0u8; 8];
    ssn.copy_from_slice(&fixed[45..53]);
    Ok(WireMsg::Frame(Frame {
        src: rank(u64_at(0))?,
        epoch: u64_at(1),
        body: Body::App(AppMessage {
            envelope: Envelope {
                src: rank(u64_at(2))?,
                dest: rank(u64_at(3))?,
                context: u64_at(4),
                tag: i32::from_le_bytes(tag),
            },
            ssn: u64::from_le_bytes(ssn),
            payload,
        }),
    }))
}

/// Decode a frame body (everything after the length prefix).
pub fn decode(frame: Bytes) -> Result<WireMsg, WireError> {
    let version = *frame
        .first()
        .ok_or_else(|| WireError::Malformed("empty frame".into()))?;
    if version == APP_FRAME {
        return decode_app(frame);
    }
    if version != WIRE_VERSION {
        return Err(WireError::Version { got: version });
    }
    let hlen_bytes: [u8; 4] = frame
        .get(1..5)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| WireError::Malformed("no header length".into()))?;
    let hlen = u32::from_le_bytes(hlen_bytes) as usize;
    let header_end = 5usize
        .checked_add(hlen)
        .filter(|&e| e <= frame.len())
        .ok_or_else(|| {
            WireError::Malformed(format!(
                "header of {hlen} bytes does not fit a {}-byte frame",
                frame.len()
            ))
        })?;
    let (mut msg, rest) = postcard::take_from_bytes::<WireMsg>(&frame[5..header_end])
        .map_err(|e| WireError::Malformed(format!("header: {e}")))?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(format!(
            "{} stray bytes after the header",
            rest.len()
        )));
    }
    let payload = frame.slice(header_end..);
    if !payload.is_empty() {
        let n = payload.len();
        let taken = match &mut msg {
            WireMsg::Frame(f) => attach(&mut f.body, payload),
            _ => false,
        };
        if !taken {
            return Err(WireError::Malformed(format!(
                "{n} payload bytes after a message that takes none"
            )));
        }
    }
    Ok(msg)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::engine::frame::{AppMessage, Envelope, RuntimeMsg};
    use proptest::prelude::*;

    const MAX: usize = 1 << 20;

    /// An application frame from rank 3 in epoch 2 with `payload` (also
    /// used by `shm`'s tests).
    pub(in super::super) fn app(payload: Vec<u8>) -> WireMsg {
        WireMsg::Frame(Frame {
            src: 3,
            epoch: 2,
            body: Body::App(AppMessage {
                envelope: Envelope {
                    src: 3,
                    dest: 1,
                    context: 9,
                    tag: -4,
                },
                ssn: 77,
                payload: Bytes::from(payload),
            }),
        })
    }

    fn encode(msg: &WireMsg) -> Vec<u8> {
        let mut out = Vec::new();
        write_msg(&mut out, msg, MAX).expect("encodes");
        out
    }

    /// A rank's driver error comes back naming the rank, with one
    /// "driver error: " prefix (it had two); other errors keep their kind.
    #[test]
    fn remote_errors_come_back_naming_the_rank_once() {
        let back = |e: &crate::Error| RemoteError::from(e).into_error(3);
        assert_eq!(
            back(&crate::Error::Driver("lost the ring".into())).to_string(),
            "driver error: rank 3: lost the ring"
        );
        let app = crate::Error::app("boom");
        assert_eq!(back(&app), app);
    }

    #[test]
    fn round_trips_small_and_large_payloads() {
        for n in [0, 8, INLINE_PAYLOAD, INLINE_PAYLOAD + 1, 300_000] {
            let msg = app((0..n).map(|i| (i * 7) as u8).collect());
            let bytes = encode(&msg);
            let back = read_msg(&mut bytes.as_slice(), MAX).expect("decodes");
            assert_eq!(back, msg, "{n}-byte payload");
        }
        let msg = WireMsg::Frame(Frame {
            src: 0,
            epoch: 0,
            body: Body::Runtime(RuntimeMsg::Done),
        });
        assert_eq!(
            read_msg(&mut encode(&msg).as_slice(), MAX).expect("ok"),
            msg
        );
        // A checkpoint piece travels after the header: it comes back whole,
        // with its checksum, and its length counts against the limit. Also
        // a piece in segments (the head, then shared payloads): they follow
        // the header one after another and arrive as one buffer.
        let pool = crate::store::pool::BufferPool::new();
        let mut datas: Vec<Segments> = [0, 5, 300_000]
            .map(|n: usize| (0..n).map(|i| (i * 13) as u8).collect::<Vec<u8>>().into())
            .into();
        let mut w = crate::store::PieceWriter::new(&pool, b"head".to_vec());
        w.share(&Bytes::from(vec![1u8; 70_000]));
        w.share(&Bytes::from_static(b"small"));
        w.buf().extend_from_slice(b"tail");
        datas.push(w.finish());
        assert_eq!(datas[3].segments().len(), 4);
        for data in datas {
            let n = data.len();
            let piece = crate::store::Piece::new(4, 2, data);
            for body in [StoreMsg::Put(piece.clone()), StoreMsg::Piece(piece.clone())] {
                let msg = WireMsg::Frame(Frame {
                    src: 2,
                    epoch: 1,
                    body: Body::Store(body),
                });
                let back = read_msg(&mut encode(&msg).as_slice(), MAX).expect("decodes");
                assert_eq!(back, msg, "{n}-byte piece");
                let WireMsg::Frame(Frame {
                    body: Body::Store(StoreMsg::Put(p) | StoreMsg::Piece(p)),
                    ..
                }) = back
                else {
                    panic!("not a piece");
                };
                p.verify().expect("its checksum holds");
                assert!(p.data.segments().len() <= 1, "arrives as one buffer");
            }
        }
        let big = crate::store::Piece::new(1, 0, Bytes::from(vec![0u8; MAX]));
        let msg = WireMsg::Frame(Frame {
            src: 0,
            epoch: 0,
            body: Body::Store(StoreMsg::Put(big)),
        });
        assert!(matches!(
            write_msg(&mut Vec::new(), &msg, MAX),
            Err(WireError::Oversized { .. })
        ));
    }

    #[test]
    fn refuses_oversized_frames_without_allocating_them() {
        // The largest 32-bit length (`LONG_LEN`, one more, announces a
        // 64-bit one: `long_frames_round_trip`).
        let mut bytes = (LONG_LEN - 1).to_le_bytes().to_vec();
        bytes.extend_from_slice(&[WIRE_VERSION, 0, 0, 0, 0]);
        match read_msg(&mut bytes.as_slice(), MAX) {
            Err(WireError::Oversized { len, max }) => {
                assert_eq!((len, max), (LONG_LEN as usize - 1, MAX))
            }
            other => panic!("expected Oversized, got {other:?}"),
        }
        // Sending a frame over the limit is refused too.
        let mut out = Vec::new();
        assert!(matches!(
            write_msg(&mut out, &app(vec![0; MAX]), MAX),
            Err(WireError::Oversized { .. })
        ));
        assert!(out.is_empty(), "nothing written for a refused frame");
    }

    /// `bytes` (one frame) with its length as a long prefix: a reader must
    /// take the two forms alike, whatever the length.
    fn long_form(bytes: &[u8]) -> Vec<u8> {
        let len = u32::from_le_bytes(bytes[..4].try_into().expect("4"));
        let mut v = LONG_LEN.to_le_bytes().to_vec();
        v.extend_from_slice(&u64::from(len).to_le_bytes());
        v.extend_from_slice(&bytes[4..]);
        v
    }

    /// A frame with a 64-bit length reads back as the same message: an
    /// application message (fixed layout or header) and a checkpoint piece.
    #[test]
    fn long_frames_round_trip() {
        let piece = crate::store::Piece::new(4, 2, Bytes::from(vec![9u8; 70_000]));
        let msgs = [
            app(vec![5; 100]),
            app(vec![6; 300_000]),
            WireMsg::Frame(Frame {
                src: 2,
                epoch: 1,
                body: Body::Store(StoreMsg::Put(piece)),
            }),
            WireMsg::Heartbeat,
        ];
        for msg in msgs {
            let long = long_form(&encode(&msg));
            assert_eq!(read_msg(&mut long.as_slice(), MAX).expect("decodes"), msg);
            // Its length counts against the limit as a short one's does.
            assert!(matches!(
                read_msg(&mut long.as_slice(), long.len() - LONG_PREFIX - 1),
                Err(WireError::Oversized { .. })
            ));
            // The connection ending inside the 64-bit length is a truncation.
            assert!(matches!(
                read_msg(&mut &long[..7], MAX),
                Err(WireError::Truncated {
                    got: 7,
                    expected: 12
                })
            ));
        }
        // The largest length a u64 holds is refused before anything is
        // allocated.
        let mut huge = LONG_LEN.to_le_bytes().to_vec();
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        huge.push(WIRE_VERSION);
        assert!(matches!(
            read_msg(&mut huge.as_slice(), usize::MAX - 1),
            Err(WireError::Oversized { .. })
        ));
    }

    /// A frame of 4 GiB or more is sent with the long prefix: a checkpoint
    /// piece, and an application message (which leaves the fixed layout
    /// for a header). The payloads are never touched (their pages are
    /// not even mapped in): they travel after the head, from their buffer.
    #[test]
    fn a_frame_over_4_gib_gets_a_long_prefix() {
        let n = (u32::MAX as usize) + 10;
        let zeros = Bytes::from(vec![0u8; n]);
        let piece = crate::store::Piece {
            generation: 1,
            owner: 0,
            crc: 0,
            data: zeros.clone().into(),
            summed: Default::default(),
        };
        let mut big_app = app(Vec::new());
        if let WireMsg::Frame(Frame {
            body: Body::App(a), ..
        }) = &mut big_app
        {
            assert!(fixed_layout(a));
            a.payload = zeros.clone();
            assert!(!fixed_layout(a));
        }
        let msgs = [
            WireMsg::Frame(Frame {
                src: 0,
                epoch: 0,
                body: Body::Store(StoreMsg::Put(piece)),
            }),
            big_app,
        ];
        for msg in msgs {
            let mut head = Vec::new();
            let rest: usize = encode_into(&msg, usize::MAX, &mut head)
                .expect("encodes")
                .iter()
                .map(Bytes::len)
                .sum();
            assert_eq!(rest, n, "the payload follows the head as it is");
            assert_eq!(head[..4], LONG_LEN.to_le_bytes());
            let len = u64::from_le_bytes(head[4..12].try_into().expect("8"));
            assert_eq!(len as usize, head.len() - LONG_PREFIX + n);
            assert_eq!(head[LONG_PREFIX], WIRE_VERSION);
            // With the payload cut off, the head decodes to the message
            // with an empty payload: the header is whole.
            let mut frame = head[LONG_PREFIX..].to_vec();
            let hlen = u32::from_le_bytes(frame[1..5].try_into().expect("4")) as usize;
            frame.truncate(5 + hlen);
            match decode(Bytes::from(frame)).expect("the header decodes") {
                WireMsg::Frame(Frame { body, .. }) => {
                    assert_eq!(
                        detached_payload(&body).map(|p| p.iter().map(Bytes::len).sum()),
                        Some(0)
                    )
                }
                other => panic!("not a frame: {other:?}"),
            }
            // Over the limit: refused, naming the whole length.
            match encode_into(&msg, 1 << 32, &mut head) {
                Err(WireError::Oversized { len: l, .. }) => assert_eq!(l as u64, len),
                other => panic!("expected Oversized, got {other:?}"),
            }
        }
    }

    #[test]
    fn truncation_and_version_are_errors() {
        let bytes = encode(&app(vec![1; 100]));
        for cut in [1, 3, 4, 8, 20, bytes.len() - 1] {
            match read_msg(&mut &bytes[..cut], MAX) {
                Err(WireError::Truncated { .. }) => {}
                other => panic!("cut at {cut}: expected Truncated, got {other:?}"),
            }
        }
        assert!(matches!(
            read_msg(&mut &bytes[..0], MAX),
            Err(WireError::Closed)
        ));
        let mut wrong = bytes.clone();
        wrong[4] = WIRE_VERSION + 1;
        assert!(matches!(
            read_msg(&mut wrong.as_slice(), MAX),
            Err(WireError::Version { .. })
        ));
    }

    #[test]
    fn stray_payload_after_a_control_message_is_malformed() {
        let msg = WireMsg::Heartbeat;
        let mut bytes = encode(&msg);
        bytes.push(0xAA);
        let len = u32::from_le_bytes(bytes[..4].try_into().expect("4")) + 1;
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        assert!(matches!(
            read_msg(&mut bytes.as_slice(), MAX),
            Err(WireError::Malformed(_))
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Arbitrary bytes never panic the decoder and never yield more
        /// than the limit.
        #[test]
        fn decoder_never_panics_on_arbitrary_input(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut r = data.as_slice();
            // Read frames until the first error.
            for _ in 0..8 {
                if read_msg(&mut r, 4096).is_err() {
                    break;
                }
            }
        }

        /// Valid frames with arbitrary mutations (bit flips, truncation)
        /// are decoded or refused, never a panic; unmutated ones round-trip.
        #[test]
        fn mutated_frames_are_decoded_or_refused(
            payload in proptest::collection::vec(any::<u8>(), 0..64),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            cut in any::<usize>(),
        ) {
            let msg = app(payload);
            let good = encode(&msg);
            prop_assert_eq!(read_msg(&mut good.as_slice(), MAX).ok(), Some(msg));
            let mut bad = good.clone();
            for (at, x) in flips {
                let i = at % bad.len();
                bad[i] ^= x;
            }
            bad.truncate(cut % (bad.len() + 1));
            let _ = read_msg(&mut bad.as_slice(), MAX);
        }
    }
}
