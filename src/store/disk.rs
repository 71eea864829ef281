//! The on-disk checkpoint format: piece files and commit records in a
//! directory, their writer and reader, the choice of the generation a
//! whole-job restart resumes from, pruning, and the `lazarus inspect` report.
//!
//! # Layout
//!
//! ```text
//! DIR/gen-0000000012/rank-000000.piece
//! DIR/gen-0000000012/rank-000001.piece
//! DIR/gen-0000000012/COMMIT
//! DIR/MANIFEST
//! ```
//!
//! Generation numbers are zero-padded to 10 digits and ranks to 6 (wider
//! numbers simply take more digits), so a plain directory listing sorts in
//! order. Only the canonical spelling is recognised: `gen-00000000012` is not
//! an alias of generation 12 but an unrelated, ignored entry.
//!
//! # Piece file (format version 2, integers little-endian)
//!
//! | offset | bytes | field                                         |
//! |-------:|------:|-----------------------------------------------|
//! |      0 |     8 | magic `LZRPIECE`                              |
//! |      8 |     4 | format version (`u32`, 2)                     |
//! |     12 |     8 | generation (`u64`)                            |
//! |     20 |     8 | owner rank (`u64`)                            |
//! |     28 |     8 | data length `n` (`u64`)                       |
//! |     36 |     4 | CRC32C of the data (`u32`)                    |
//! |     40 |     4 | CRC32C of bytes 0..40 (the header itself)     |
//! |     44 |   `n` | the data                                      |
//!
//! The header carries its own checksum so that a damaged length or owner
//! field is reported as such instead of as a confusing data mismatch.
//!
//! # Commit record `COMMIT` (format version 2, little-endian)
//!
//! | offset    | bytes | field                                          |
//! |----------:|------:|------------------------------------------------|
//! |         0 |     8 | magic `LZRCOMIT`                               |
//! |         8 |     4 | format version (`u32`, 2)                      |
//! |        12 |     8 | generation (`u64`)                             |
//! |        20 |     8 | job size: ranks (`u64`)                        |
//! |        28 |     8 | number of entries `k` (`u64`, equal to ranks)  |
//! |        36 | 20·`k`| per rank 0, 1, …: rank `u64`, length `u64`, CRC32C `u32` |
//! | 36 + 20·`k` |   4 | CRC32C of every preceding byte                 |
//!
//! # Manifest `MANIFEST` (JSON)
//!
//! What wrote the directory: `{"program": "cg class S", "ranks": 4,
//! "protocol": "coordinated"}` ([`Manifest`]; `program` is `null` for a
//! library job that does not name it). Written when a job that stores to
//! the directory starts; a `--restart` whose job differs is refused
//! ([`check_manifest`]). A directory without one (written before manifests
//! existed) is restarted on the commit records' rank count alone.
//!
//! # Crash consistency
//!
//! Every file is written under a unique temporary name (`*.tmp`) in its final
//! directory, `fsync`ed, renamed into place, and the directory is `fsync`ed,
//! so a reader sees either no file or the whole file. [`write_commit`] checks
//! that every piece it lists is on disk with the listed length and checksum
//! before writing `COMMIT`, so a generation counts only once all its pieces
//! are durable; a generation without a valid `COMMIT` is never used, and a
//! committed generation with a damaged piece is passed over for an older one
//! (design principle 8).

use std::collections::BTreeSet;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::Piece;
use crate::{Error, Rank, Result};

/// Version of the piece and commit formats this build writes and reads.
/// Version 2: the data of a piece starts with the application's state
/// (see `engine::Snapshot`); a version 1 directory is refused as such
/// rather than failing to decode.
pub const FORMAT_VERSION: u32 = 2;

/// Bytes of a piece file's header (everything before the data).
pub const PIECE_HEADER_LEN: usize = 44;

const PIECE_MAGIC: [u8; 8] = *b"LZRPIECE";
const COMMIT_MAGIC: [u8; 8] = *b"LZRCOMIT";
/// Magic, version, generation, ranks, entry count.
const COMMIT_FIXED_LEN: usize = 36;
/// Rank, length, CRC32C.
const COMMIT_ENTRY_LEN: usize = 20;
const COMMIT_CRC_LEN: usize = 4;
const COMMIT_NAME: &str = "COMMIT";
const MANIFEST_NAME: &str = "MANIFEST";
/// Largest manifest read: a few hundred bytes are written, and a larger
/// file is not one.
const MAX_MANIFEST_BYTES: u64 = 64 << 10;
/// Suffix of a generation directory being deleted by [`retain`]: renaming
/// first makes the deletion atomic for readers (a half-deleted generation
/// would otherwise look like a corrupted one).
const DELETING_SUFFIX: &str = ".deleting";
const TMP_SUFFIX: &str = ".tmp";

/// Distinguishes temporary files of concurrent writers in one process (the
/// `threads` backend runs every rank in one process).
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

// ---------------------------------------------------------------------------
// Names

/// The directory of `generation` inside `dir`: `DIR/gen-<generation:010>`.
pub fn generation_dir(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("gen-{generation:010}"))
}

/// The piece file of `rank` in `generation`:
/// `DIR/gen-<generation:010>/rank-<rank:06>.piece`.
pub fn piece_path(dir: &Path, generation: u64, rank: Rank) -> PathBuf {
    generation_dir(dir, generation).join(piece_name(rank))
}

/// The commit record of `generation`: `DIR/gen-<generation:010>/COMMIT`.
pub fn commit_path(dir: &Path, generation: u64) -> PathBuf {
    generation_dir(dir, generation).join(COMMIT_NAME)
}

fn piece_name(rank: Rank) -> String {
    format!("rank-{rank:06}.piece")
}

/// Parses `<prefix><digits><suffix>` where the digits are the canonical
/// zero-padded spelling of the number (so two names never alias one number).
fn parse_padded(name: &str, prefix: &str, suffix: &str, width: usize) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if digits.len() < width || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    (format!("{n:0width$}") == digits).then_some(n)
}

fn parse_generation_name(name: &str) -> Option<u64> {
    parse_padded(name, "gen-", "", 10)
}

fn parse_piece_name(name: &str) -> Option<Rank> {
    parse_padded(name, "rank-", ".piece", 6).and_then(|r| Rank::try_from(r).ok())
}

// ---------------------------------------------------------------------------
// Errors

fn io_error(action: &str, path: &Path, e: &io::Error) -> Error {
    Error::Driver(format!(
        "checkpoint directory: cannot {action} {}: {e}",
        path.display()
    ))
}

fn corrupt(owner: Rank, generation: u64, path: &Path, detail: impl fmt::Display) -> Error {
    Error::CorruptCheckpoint {
        owner,
        generation,
        detail: format!("{}: {detail}", path.display()),
    }
}

/// The text of an error for a report line: the detail alone for corruption
/// (it already names the file), the whole message otherwise.
fn problem_text(e: &Error) -> String {
    match e {
        Error::CorruptCheckpoint { detail, .. } => detail.clone(),
        Error::Driver(message) => message.clone(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Reading only regular files

/// Opens `path` for reading if it is a regular file, and refuses anything
/// else with an error that says what it is: opening a FIFO blocks until a
/// writer comes (hence `O_NONBLOCK`, which changes nothing for a regular
/// file), and reading a device or a symbolic link to one (`/dev/zero`)
/// never ends (hence `O_NOFOLLOW` and the type check on the opened file).
fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let refused = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what}, not a regular file: refused, not read"),
        )
    };
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refused("a symbolic link"),
            _ => e,
        })?;
    let kind = f.metadata()?.file_type();
    if kind.is_file() {
        return Ok(f);
    }
    Err(refused(if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "not a file"
    }))
}

/// The whole content of the regular file `path` ([`open_regular`]).
fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let mut f = open_regular(path)?;
    let mut buf = Vec::with_capacity(f.metadata().map_or(0, |m| m.len() as usize));
    f.read_to_end(&mut buf)?;
    Ok(buf)
}

// ---------------------------------------------------------------------------
// Durable file writing

fn sync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("fsync directory", path, &e))
}

/// Creates `path` and any missing parents, `fsync`ing each parent that gained
/// an entry: a piece renamed into a directory whose own entry is not yet
/// durable could vanish with it in a crash.
fn ensure_dir(path: &Path) -> Result<()> {
    match fs::metadata(path) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => {
            return Err(Error::Driver(format!(
                "checkpoint directory: {} exists and is not a directory",
                path.display()
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error("examine", path, &e)),
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(parent) = parent {
        ensure_dir(parent)?;
    }
    match fs::create_dir(path) {
        Ok(()) => {}
        // Another rank created it at the same moment; that rank syncs the
        // parent, and it does so before its own piece (and thus before any
        // commit, which waits for every piece) is written.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(io_error("create directory", path, &e)),
    }
    sync_dir(parent.unwrap_or(Path::new(".")))
}

/// Writes `parts` as the file `name` in `parent` atomically and durably:
/// temporary file, `fsync`, `rename`, `fsync` of the directory.
fn write_atomic(parent: &Path, name: &str, parts: &[&[u8]]) -> Result<()> {
    let final_path = parent.join(name);
    let tmp = parent.join(format!(
        "{name}.{}-{}{TMP_SUFFIX}",
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| -> Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| io_error("create", &tmp, &e))?;
        for part in parts {
            f.write_all(part).map_err(|e| io_error("write", &tmp, &e))?;
        }
        f.sync_all().map_err(|e| io_error("fsync", &tmp, &e))?;
        drop(f);
        fs::rename(&tmp, &final_path).map_err(|e| io_error("rename into place", &final_path, &e))
    })();
    if written.is_err() {
        // Best effort: a leftover temporary file is harmless (readers ignore
        // it and `inspect` lists it), so its removal failing is not an error.
        let _ = fs::remove_file(&tmp);
    }
    written?;
    sync_dir(parent)
}

// ---------------------------------------------------------------------------
// Little-endian field reading that cannot panic on short input

struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Fields<'a> {
    fn at(buf: &'a [u8], pos: usize) -> Self {
        Fields { buf, pos }
    }

    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let end = self.pos.checked_add(N)?;
        let bytes: [u8; N] = self.buf.get(self.pos..end)?.try_into().ok()?;
        self.pos = end;
        Some(bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take::<8>().map(u64::from_le_bytes)
    }
}

/// Checks the magic bytes and returns the format version, or why the buffer
/// is not a file of this kind.
fn magic_and_version(buf: &[u8], magic: &[u8; 8], what: &str) -> Result<u32, String> {
    let head = buf.get(..magic.len()).unwrap_or(buf);
    if head != &magic[..head.len()] {
        return Err(format!("not a Lazarus {what} (bad magic bytes)"));
    }
    Fields::at(buf, magic.len()).u32().ok_or_else(|| {
        format!(
            "truncated: {} bytes, too short for a {what} header",
            buf.len()
        )
    })
}

fn unsupported(version: u32) -> String {
    format!("format version {version} is not supported (this build reads version {FORMAT_VERSION})")
}

// ---------------------------------------------------------------------------
// Piece files

/// The fields of a piece file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PieceHeader {
    generation: u64,
    owner: u64,
    len: u64,
    crc: u32,
}

fn encode_piece_header(piece: &Piece) -> Vec<u8> {
    let mut h = Vec::with_capacity(PIECE_HEADER_LEN);
    h.extend_from_slice(&PIECE_MAGIC);
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&piece.generation.to_le_bytes());
    // usize → u64 is lossless on every platform Rust supports.
    h.extend_from_slice(&(piece.owner as u64).to_le_bytes());
    h.extend_from_slice(&(piece.data.len() as u64).to_le_bytes());
    h.extend_from_slice(&piece.crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&h);
    h.extend_from_slice(&header_crc.to_le_bytes());
    h
}

/// Parses and checks a piece header (the first [`PIECE_HEADER_LEN`] bytes of
/// `buf`; more may follow).
fn parse_piece_header(buf: &[u8]) -> Result<PieceHeader, String> {
    let version = magic_and_version(buf, &PIECE_MAGIC, "checkpoint piece")?;
    let Some(header) = buf.get(..PIECE_HEADER_LEN) else {
        return Err(if version == FORMAT_VERSION {
            format!(
                "truncated: {} bytes, the header alone is {PIECE_HEADER_LEN}",
                buf.len()
            )
        } else {
            unsupported(version)
        });
    };
    let mut f = Fields::at(header, 12);
    let (Some(generation), Some(owner), Some(len), Some(crc), Some(header_crc)) =
        (f.u64(), f.u64(), f.u64(), f.u32(), f.u32())
    else {
        return Err("internal: short piece header".into());
    };
    let body = header.get(..PIECE_HEADER_LEN - 4).unwrap_or(header);
    let want = crc32c::crc32c(body);
    if header_crc != want {
        // A newer format may lay its header out differently, so a bad
        // checksum with an unknown version is most likely that.
        return Err(if version == FORMAT_VERSION {
            format!(
                "header CRC32C {want:#010x}, recorded {header_crc:#010x}: the header is corrupted"
            )
        } else {
            format!("{}, or the header is corrupted", unsupported(version))
        });
    }
    if version != FORMAT_VERSION {
        return Err(unsupported(version));
    }
    Ok(PieceHeader {
        generation,
        owner,
        len,
        crc,
    })
}

/// Parses a whole piece file expected to hold `rank`'s piece of
/// `generation`; `path` is only used in error messages.
fn parse_piece(buf: Bytes, generation: u64, rank: Rank, path: &Path) -> Result<Piece> {
    let h = parse_piece_header(&buf).map_err(|d| corrupt(rank, generation, path, d))?;
    if h.generation != generation {
        return Err(corrupt(
            rank,
            generation,
            path,
            format!(
                "holds generation {}, not {generation} (misplaced file)",
                h.generation
            ),
        ));
    }
    if h.owner != rank as u64 {
        return Err(corrupt(
            rank,
            generation,
            path,
            format!(
                "holds the piece of rank {}, not {rank} (misplaced file)",
                h.owner
            ),
        ));
    }
    let have = buf.len().saturating_sub(PIECE_HEADER_LEN) as u64;
    if have < h.len {
        return Err(corrupt(
            rank,
            generation,
            path,
            format!("truncated: {have} of {} data bytes present", h.len),
        ));
    }
    if have > h.len {
        return Err(corrupt(
            rank,
            generation,
            path,
            format!(
                "{} unexpected bytes after the {} data bytes",
                have - h.len,
                h.len
            ),
        ));
    }
    let data = buf.slice(PIECE_HEADER_LEN..);
    let got = crc32c::crc32c(&data);
    if got != h.crc {
        return Err(corrupt(
            rank,
            generation,
            path,
            format!(
                "data CRC32C {got:#010x}, header records {:#010x}: the data is corrupted",
                h.crc
            ),
        ));
    }
    Ok(Piece {
        generation,
        owner: rank,
        data: data.into(),
        crc: h.crc,
        summed: Default::default(),
    })
}

/// Writes `piece` durably to `DIR/gen-…/rank-….piece`, creating the
/// directories as needed.
///
/// The piece's checksum is verified first, so data damaged in memory after
/// the piece was made is refused ([`Error::CorruptCheckpoint`]) rather than
/// written. When this returns `Ok`, the file is complete and durable
/// (temporary file, `fsync`, `rename`, `fsync` of the directory); an
/// existing piece of the same rank and generation is replaced atomically.
/// I/O failures are [`Error::Driver`] naming the file.
pub fn write_piece(dir: &Path, piece: &Piece) -> Result<()> {
    piece.verify()?;
    let gen_dir = generation_dir(dir, piece.generation);
    ensure_dir(&gen_dir)?;
    let header = encode_piece_header(piece);
    let parts: Vec<&[u8]> = std::iter::once(&header[..])
        .chain(piece.data.segments().iter().map(|s| &s[..]))
        .collect();
    write_atomic(&gen_dir, &piece_name(piece.owner), &parts)
}

/// Reads and verifies the piece of `rank` in `generation`.
///
/// Checks the magic bytes, format version, header checksum, that the header
/// names this generation and rank, that the data is exactly as long as
/// recorded (truncation), and the data's CRC32C. A failed check is
/// [`Error::CorruptCheckpoint`] whose detail names the file; a file that
/// cannot be read (missing, permissions) is [`Error::Driver`] naming the
/// file, the rank and the generation.
pub fn read_piece(dir: &Path, generation: u64, rank: Rank) -> Result<Piece> {
    let path = piece_path(dir, generation, rank);
    let buf = read_regular(&path).map_err(|e| {
        Error::Driver(format!(
            "checkpoint directory: cannot read the piece of rank {rank}, generation \
             {generation} at {}: {e}",
            path.display()
        ))
    })?;
    parse_piece(Bytes::from(buf), generation, rank, &path)
}

/// Write the commit record of `generation` for a job of `ranks` ranks from
/// the headers of the piece files already on disk (the writer of each piece
/// checksummed it). Used by the rank that commits, which does not hold the
/// other ranks' pieces.
pub fn commit_from_headers(dir: &Path, generation: u64, ranks: usize) -> Result<()> {
    let mut pieces = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let path = piece_path(dir, generation, rank);
        let (h, _) =
            read_piece_header(&path).map_err(|e| io_error("reading the header of", &path, &e))?;
        let len = usize::try_from(h.len).map_err(|_| {
            corrupt(
                rank,
                generation,
                &path,
                "piece length does not fit in memory",
            )
        })?;
        pieces.push((rank, len, h.crc));
    }
    write_commit(dir, generation, ranks, &pieces)
}

/// Reads only the header of a piece file and checks that the file's size
/// matches it (cheap: used before committing, when the data was just
/// checksummed by its writer).
fn read_piece_header(path: &Path) -> io::Result<(PieceHeader, u64)> {
    let f = open_regular(path)?;
    let size = f.metadata()?.len();
    let mut buf = Vec::with_capacity(PIECE_HEADER_LEN);
    f.take(PIECE_HEADER_LEN as u64).read_to_end(&mut buf)?;
    let h = parse_piece_header(&buf).map_err(io::Error::other)?;
    Ok((h, size))
}

// ---------------------------------------------------------------------------
// Commit records

/// A parsed commit record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CommitRecord {
    generation: u64,
    ranks: usize,
    /// `(rank, data length, CRC32C)` for ranks `0..ranks`, in order.
    pieces: Vec<(Rank, usize, u32)>,
}

fn encode_commit(rec: &CommitRecord) -> Vec<u8> {
    let mut b =
        Vec::with_capacity(COMMIT_FIXED_LEN + COMMIT_ENTRY_LEN * rec.pieces.len() + COMMIT_CRC_LEN);
    b.extend_from_slice(&COMMIT_MAGIC);
    b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    b.extend_from_slice(&rec.generation.to_le_bytes());
    b.extend_from_slice(&(rec.ranks as u64).to_le_bytes());
    b.extend_from_slice(&(rec.pieces.len() as u64).to_le_bytes());
    for &(rank, len, crc) in &rec.pieces {
        b.extend_from_slice(&(rank as u64).to_le_bytes());
        b.extend_from_slice(&(len as u64).to_le_bytes());
        b.extend_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Parses and checks the commit record found in the directory of
/// `generation`. Any failure means the generation is not committed.
fn parse_commit(buf: &[u8], generation: u64) -> Result<CommitRecord, String> {
    let version = magic_and_version(buf, &COMMIT_MAGIC, "commit record")?;
    let min = COMMIT_FIXED_LEN + COMMIT_CRC_LEN;
    let mut f = Fields::at(buf, 12);
    let (Some(recorded_gen), Some(ranks), Some(count)) = (f.u64(), f.u64(), f.u64()) else {
        return Err(if version == FORMAT_VERSION {
            format!(
                "truncated: {} bytes, a commit record has at least {min}",
                buf.len()
            )
        } else {
            unsupported(version)
        });
    };
    // Computed in u128 so a garbage count cannot overflow.
    let expected =
        (COMMIT_FIXED_LEN + COMMIT_CRC_LEN) as u128 + u128::from(count) * COMMIT_ENTRY_LEN as u128;
    if expected != buf.len() as u128 {
        return Err(if version == FORMAT_VERSION {
            format!(
                "{} bytes, but a record of {count} entries has {expected} (truncated or corrupted)",
                buf.len()
            )
        } else {
            unsupported(version)
        });
    }
    let split = buf.len() - COMMIT_CRC_LEN;
    let (body, tail) = buf.split_at(split);
    let recorded_crc = Fields::at(tail, 0).u32().unwrap_or(0);
    let want = crc32c::crc32c(body);
    if recorded_crc != want {
        return Err(if version == FORMAT_VERSION {
            format!(
                "CRC32C {want:#010x}, recorded {recorded_crc:#010x}: the commit record is corrupted"
            )
        } else {
            format!("{}, or the record is corrupted", unsupported(version))
        });
    }
    if version != FORMAT_VERSION {
        return Err(unsupported(version));
    }
    if recorded_gen != generation {
        return Err(format!(
            "records generation {recorded_gen} but lies in the directory of generation {generation}"
        ));
    }
    if ranks == 0 {
        return Err("records a job of 0 ranks".into());
    }
    if count != ranks {
        return Err(format!("lists {count} pieces for a job of {ranks} ranks"));
    }
    let ranks = usize::try_from(ranks).map_err(|_| format!("job size {ranks} is too large"))?;
    let mut pieces = Vec::with_capacity(ranks);
    let mut f = Fields::at(body, COMMIT_FIXED_LEN);
    for i in 0..ranks {
        let (Some(rank), Some(len), Some(crc)) = (f.u64(), f.u64(), f.u32()) else {
            return Err("internal: short commit entry".into());
        };
        if rank != i as u64 {
            return Err(format!(
                "entry {i} is for rank {rank}: entries must list ranks 0..{ranks} in order"
            ));
        }
        let len =
            usize::try_from(len).map_err(|_| format!("rank {rank}: length {len} is too large"))?;
        pieces.push((i, len, crc));
    }
    Ok(CommitRecord {
        generation,
        ranks,
        pieces,
    })
}

/// Writes the commit record of `generation`, making it usable for restart.
///
/// `ranks` is the job size and `pieces` holds `(rank, data length, CRC32C)`
/// of every piece of the generation: exactly one entry per rank `0..ranks`,
/// in any order. Before writing, each listed piece file is checked to be on
/// disk with a valid header recording this generation, rank, length and
/// checksum, and with the matching file size (the data itself is not
/// re-read: its writer checksummed it). The record is then written
/// atomically and durably like a piece.
///
/// Errors: a malformed `pieces` list or a piece that is not on disk is
/// [`Error::Driver`]; a piece whose header disagrees with the list is
/// [`Error::CorruptCheckpoint`]; both name the file. Nothing is written then.
pub fn write_commit(
    dir: &Path,
    generation: u64,
    ranks: usize,
    pieces: &[(Rank, usize, u32)],
) -> Result<()> {
    let gen_dir = generation_dir(dir, generation);
    let refuse = |why: String| {
        Error::Driver(format!(
            "checkpoint directory: cannot commit generation {generation} in {}: {why}",
            gen_dir.display()
        ))
    };
    if ranks == 0 {
        return Err(refuse("a job has at least one rank".into()));
    }
    let mut sorted = pieces.to_vec();
    sorted.sort_unstable_by_key(|p| p.0);
    let mut by_rank: Vec<Option<(usize, u32)>> = vec![None; ranks];
    for &(rank, len, crc) in &sorted {
        match by_rank.get_mut(rank) {
            None => {
                return Err(refuse(format!(
                    "rank {rank} is out of range for a job of {ranks} ranks"
                )));
            }
            Some(Some(_)) => return Err(refuse(format!("rank {rank} is listed twice"))),
            Some(slot) => *slot = Some((len, crc)),
        }
    }
    if let Some(missing) = by_rank.iter().position(Option::is_none) {
        return Err(refuse(format!(
            "no piece listed for rank {missing} (of {ranks})"
        )));
    }
    for &(rank, len, crc) in &sorted {
        let path = piece_path(dir, generation, rank);
        let (h, size) = read_piece_header(&path).map_err(|e| {
            refuse(format!(
                "the piece of rank {rank} is not on disk intact ({}: {e})",
                path.display()
            ))
        })?;
        let mismatch = if h.generation != generation || h.owner != rank as u64 {
            Some(format!(
                "header records generation {}, rank {}",
                h.generation, h.owner
            ))
        } else if h.len != len as u64 || h.crc != crc {
            Some(format!(
                "header records {} bytes with CRC32C {:#010x}; the commit lists {len} bytes \
                 with CRC32C {crc:#010x}",
                h.len, h.crc
            ))
        } else if size != PIECE_HEADER_LEN as u64 + h.len {
            Some(format!(
                "file is {size} bytes, its header announces {}",
                PIECE_HEADER_LEN as u64 + h.len
            ))
        } else {
            None
        };
        if let Some(m) = mismatch {
            return Err(corrupt(
                rank,
                generation,
                &path,
                format!("does not match the commit: {m}"),
            ));
        }
    }
    let record = CommitRecord {
        generation,
        ranks,
        pieces: sorted,
    };
    write_atomic(&gen_dir, COMMIT_NAME, &[&encode_commit(&record)])?;
    // The generation directory's own entry in DIR was synced when it was
    // created; syncing DIR again costs one call per generation and covers a
    // directory created by a process that died before syncing.
    sync_dir(dir)
}

/// The state of a generation's commit record.
enum CommitState {
    Valid(CommitRecord),
    Missing,
    Invalid(String),
}

fn load_commit(dir: &Path, generation: u64) -> CommitState {
    let path = commit_path(dir, generation);
    match read_regular(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => CommitState::Missing,
        Err(e) => CommitState::Invalid(format!("cannot read {}: {e}", path.display())),
        Ok(buf) => match parse_commit(&buf, generation) {
            Ok(rec) => CommitState::Valid(rec),
            Err(d) => CommitState::Invalid(format!("{}: {d}", path.display())),
        },
    }
}

/// Whether `generation` in `dir` has a valid commit record.
pub fn is_committed(dir: &Path, generation: u64) -> bool {
    matches!(load_commit(dir, generation), CommitState::Valid(_))
}

/// Reads `rank`'s piece of the committed `generation` and checks it against
/// the commit record: the record is valid and lists this rank with the
/// length and CRC32C the file holds. A piece rewritten after the commit (a
/// later run, or a re-execution that reached the same generation number)
/// is refused like a damaged one: [`Error::CorruptCheckpoint`] naming the
/// file; an unreadable file is [`Error::Driver`] (as [`read_piece`]).
pub fn read_committed_piece(dir: &Path, generation: u64, rank: Rank) -> Result<Piece> {
    let record = commit_path(dir, generation);
    let (len, crc) = match load_commit(dir, generation) {
        CommitState::Valid(rec) => rec
            .pieces
            .iter()
            .find(|&&(r, ..)| r == rank)
            .map(|&(_, len, crc)| (len, crc))
            .ok_or_else(|| {
                corrupt(
                    rank,
                    generation,
                    &record,
                    "the commit record does not list this rank",
                )
            })?,
        CommitState::Missing => {
            return Err(corrupt(rank, generation, &record, "no commit record"));
        }
        CommitState::Invalid(detail) => {
            return Err(Error::CorruptCheckpoint {
                owner: rank,
                generation,
                detail,
            });
        }
    };
    let piece = read_piece(dir, generation, rank)?;
    match unlike_record(&piece, (len, crc)) {
        Some(d) => Err(corrupt(
            rank,
            generation,
            &piece_path(dir, generation, rank),
            d,
        )),
        None => Ok(piece),
    }
}

/// How an intact `piece` differs from the `(length, CRC32C)` its commit
/// record lists, if it does.
fn unlike_record(piece: &Piece, (len, crc): (usize, u32)) -> Option<String> {
    if piece.data.len() != len {
        Some(format!(
            "holds {} bytes, the commit record lists {len}",
            piece.data.len()
        ))
    } else if piece.crc != crc {
        Some(format!(
            "CRC32C {:#010x}, the commit record lists {crc:#010x} (the piece was replaced \
             after the commit)",
            piece.crc
        ))
    } else {
        None
    }
}

// ---------------------------------------------------------------------------
// Directory scanning

/// What a checkpoint directory holds at its top level.
struct Scan {
    /// Generation directories, newest first.
    generations: Vec<(u64, PathBuf)>,
    /// Names of other entries (ignored).
    ignored: Vec<String>,
    /// Generation directories whose deletion by [`retain`] was interrupted.
    leftovers: Vec<PathBuf>,
}

fn scan(dir: &Path) -> Result<Scan> {
    let entries = fs::read_dir(dir).map_err(|e| io_error("list", dir, &e))?;
    let mut s = Scan {
        generations: Vec::new(),
        ignored: Vec::new(),
        leftovers: Vec::new(),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_error("list", dir, &e))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        // `metadata` follows symbolic links: a linked generation directory
        // is as good as a real one.
        let is_dir = fs::metadata(&path).is_ok_and(|m| m.is_dir());
        match parse_generation_name(&name) {
            Some(g) if is_dir => s.generations.push((g, path)),
            _ if name
                .strip_suffix(DELETING_SUFFIX)
                .and_then(parse_generation_name)
                .is_some() =>
            {
                s.leftovers.push(path);
            }
            _ => s.ignored.push(name),
        }
    }
    s.generations
        .sort_unstable_by_key(|&(g, _)| std::cmp::Reverse(g));
    s.ignored.sort();
    Ok(s)
}

/// Generations in `dir` whose commit record parses and checks out (magic,
/// version, checksum, generation, a complete rank list), newest first.
///
/// A missing, truncated or corrupted `COMMIT` means the generation does not
/// count; the pieces themselves are not read (see [`restart_generation`]).
/// Entries that are not generation directories are ignored. An unreadable
/// `dir` is [`Error::Driver`] naming it.
pub fn committed_generations(dir: &Path) -> Result<Vec<u64>> {
    Ok(scan(dir)?
        .generations
        .into_iter()
        .filter(|&(g, _)| matches!(load_commit(dir, g), CommitState::Valid(_)))
        .map(|(g, _)| g)
        .collect())
}

// ---------------------------------------------------------------------------
// Manifest

/// What wrote a checkpoint directory (`DIR/MANIFEST`): a restart of another
/// job from it is refused instead of restoring state that is not its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The program and the parameters that shape its state
    /// (`Config::program`, e.g. `cg class S`); `None` when the job did not
    /// say.
    pub program: Option<String>,
    /// Ranks of the job.
    pub ranks: usize,
    /// Its protocol.
    pub protocol: String,
}

impl Manifest {
    /// The manifest of the job `cfg` describes.
    pub fn of(cfg: &crate::Config) -> Self {
        Manifest {
            program: cfg.program.clone(),
            ranks: cfg.ranks,
            protocol: cfg.protocol.name().to_string(),
        }
    }
}

impl fmt::Display for Manifest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.program {
            Some(p) => write!(f, "`{p}`")?,
            None => f.write_str("an unnamed program")?,
        }
        write!(f, " on {} ranks, protocol {}", self.ranks, self.protocol)
    }
}

/// Writes `manifest` into `dir` (created if missing), atomically and
/// durably like a piece. I/O failures are [`Error::Driver`] naming the path.
pub fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<()> {
    ensure_dir(dir)?;
    let text = serde_json::to_vec_pretty(manifest).map_err(|e| Error::Codec {
        what: "checkpoint manifest".into(),
        detail: e.to_string(),
    })?;
    write_atomic(dir, MANIFEST_NAME, &[&text, b"\n"])
}

/// The manifest of `dir`, `None` if it has none. A manifest that is not a
/// regular file, is too large, or does not parse is [`Error::Driver`]
/// naming it.
pub fn read_manifest(dir: &Path) -> Result<Option<Manifest>> {
    let path = dir.join(MANIFEST_NAME);
    let mut buf = Vec::new();
    match open_regular(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("read", &path, &e)),
        Ok(f) => f
            .take(MAX_MANIFEST_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(|e| io_error("read", &path, &e))?,
    };
    let bad = |why: String| {
        Error::Driver(format!(
            "checkpoint directory: {} is not a manifest: {why}",
            path.display()
        ))
    };
    if buf.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(bad(format!("larger than {MAX_MANIFEST_BYTES} bytes")));
    }
    serde_json::from_slice(&buf)
        .map(Some)
        .map_err(|e| bad(e.to_string()))
}

/// Checks that `dir` was written by the job `job` describes, before a
/// restart from it: the program (when both name one), the rank count and
/// the protocol must agree. A mismatch, or a manifest that cannot be read,
/// is [`Error::Config`] naming `--restart`. Returns the manifest found
/// (`None`: a directory written before manifests, accepted).
pub fn check_manifest(dir: &Path, job: &Manifest) -> Result<Option<Manifest>> {
    let refuse = |why: String| Error::config("restart", why);
    let Some(recorded) = read_manifest(dir).map_err(|e| refuse(problem_text(&e)))? else {
        return Ok(None);
    };
    let same_program = match (&recorded.program, &job.program) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    };
    if !same_program || recorded.ranks != job.ranks || recorded.protocol != job.protocol {
        return Err(refuse(format!(
            "{} holds the checkpoints of {recorded}; this job is {job}",
            dir.display()
        )));
    }
    Ok(Some(recorded))
}

// ---------------------------------------------------------------------------
// Restart

/// A generation that a restart passed over, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// The generation.
    pub generation: u64,
    /// Why it cannot be used (names the file at fault where there is one).
    pub reason: String,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "generation {}: {}", self.generation, self.reason)
    }
}

/// The outcome of choosing the generation a restart resumes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestartPlan {
    /// The newest usable committed generation, if any.
    pub generation: Option<u64>,
    /// Every generation newer than [`RestartPlan::generation`] (all of them
    /// if it is `None`), newest first, with the reason it was passed over:
    /// the warnings to show the user.
    pub skipped: Vec<Skipped>,
}

/// Checks `rank`'s piece of `generation`, against the commit record's
/// `(length, CRC32C)` when given.
fn check_piece(
    dir: &Path,
    generation: u64,
    rank: Rank,
    expected: Option<(usize, u32)>,
) -> PieceReport {
    let path = piece_path(dir, generation, rank);
    let size = match fs::metadata(&path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return PieceReport {
                rank,
                bytes: 0,
                ok: false,
                problem: Some(format!("{}: missing", path.display())),
            };
        }
        Err(_) => 0,
    };
    match read_piece(dir, generation, rank) {
        Ok(piece) => {
            let problem = expected
                .and_then(|listed| unlike_record(&piece, listed))
                .map(|d| format!("{}: {d}", path.display()));
            PieceReport {
                rank,
                bytes: piece.data.len() as u64,
                ok: problem.is_none(),
                problem,
            }
        }
        Err(e) => PieceReport {
            rank,
            bytes: size.saturating_sub(PIECE_HEADER_LEN as u64),
            ok: false,
            problem: Some(problem_text(&e)),
        },
    }
}

/// Chooses the generation a job of `ranks` ranks restarts from, and says
/// what was passed over and why.
///
/// The choice is the newest generation whose commit record is valid, was
/// written by a job of `ranks` ranks, and whose every piece is present,
/// intact (full read and CRC32C check) and as the commit record lists it.
/// Anything else falls back to the next older committed generation. Errors
/// only when `dir` cannot be listed ([`Error::Driver`]) or `ranks` is 0
/// ([`Error::Config`]); no usable generation is `generation: None`.
///
/// Every piece of each candidate is read once here and again by the ranks
/// that load it; restarts are rare, and checking all of them first is what
/// lets the whole job agree on one generation.
pub fn restart_plan(dir: &Path, ranks: usize) -> Result<RestartPlan> {
    if ranks == 0 {
        return Err(Error::config("ranks", "a job has at least one rank"));
    }
    let mut skipped = Vec::new();
    for (generation, _) in scan(dir)?.generations {
        let reason = match load_commit(dir, generation) {
            CommitState::Missing => "no COMMIT record (the checkpoint is incomplete)".to_string(),
            CommitState::Invalid(d) => format!("COMMIT record rejected: {d}"),
            CommitState::Valid(rec) if rec.ranks != ranks => format!(
                "committed by a job of {} ranks; this job has {ranks}",
                rec.ranks
            ),
            CommitState::Valid(rec) => {
                let bad = rec.pieces.iter().find_map(|&(rank, len, crc)| {
                    let rep = check_piece(dir, generation, rank, Some((len, crc)));
                    rep.problem.map(|p| format!("rank {rank}: {p}"))
                });
                match bad {
                    Some(why) => why,
                    None => {
                        return Ok(RestartPlan {
                            generation: Some(generation),
                            skipped,
                        });
                    }
                }
            }
        };
        skipped.push(Skipped { generation, reason });
    }
    Ok(RestartPlan {
        generation: None,
        skipped,
    })
}

/// The restart of the job `cfg` from `dir`: checks the directory's manifest
/// against the job ([`check_manifest`]) and chooses the generation
/// ([`restart_plan`]). Returns the manifest found and the plan; an error
/// (a mismatch, an unreadable directory) is [`Error::Config`] naming
/// `--restart`.
pub fn plan_restart(dir: &Path, cfg: &crate::Config) -> Result<(Option<Manifest>, RestartPlan)> {
    let recorded = check_manifest(dir, &Manifest::of(cfg))?;
    let plan = restart_plan(dir, cfg.ranks).map_err(|e| match e {
        e @ Error::Config { .. } => e,
        e => Error::config("restart", problem_text(&e)),
    })?;
    Ok((recorded, plan))
}

/// The newest committed generation a job of `ranks` ranks can restart from:
/// [`restart_plan`] without the list of what was skipped (call that to
/// report the warnings).
pub fn restart_generation(dir: &Path, ranks: usize) -> Result<Option<u64>> {
    Ok(restart_plan(dir, ranks)?.generation)
}

// ---------------------------------------------------------------------------
// Pruning

/// Deletes all but the newest `keep` committed generations, and every
/// uncommitted generation (no valid `COMMIT`) older than the newest committed
/// one. Uncommitted generations newer than it are kept: a checkpoint may be
/// in progress. With no committed generation nothing is deleted.
///
/// The newest committed generation is never deleted, so `keep` must be at
/// least 1 ([`Error::Config`] otherwise). Each generation is first renamed
/// to `gen-….deleting` (and `DIR` synced), then removed, so a crash midway
/// never leaves a half-deleted directory that looks like a damaged
/// checkpoint; leftovers of such a crash are removed by the next call.
/// I/O failures are [`Error::Driver`] naming the path.
pub fn retain(dir: &Path, keep: usize) -> Result<()> {
    if keep == 0 {
        return Err(Error::config(
            "keep",
            "must be at least 1: the newest committed generation is never deleted",
        ));
    }
    let s = scan(dir)?;
    for leftover in &s.leftovers {
        fs::remove_dir_all(leftover).map_err(|e| io_error("remove", leftover, &e))?;
    }
    let committed: Vec<u64> = s
        .generations
        .iter()
        .map(|&(g, _)| g)
        .filter(|&g| matches!(load_commit(dir, g), CommitState::Valid(_)))
        .collect();
    let Some(&newest) = committed.first() else {
        return Ok(());
    };
    let kept: BTreeSet<u64> = committed.iter().copied().take(keep).collect();
    let committed: BTreeSet<u64> = committed.into_iter().collect();
    for (g, path) in &s.generations {
        let delete = if committed.contains(g) {
            !kept.contains(g)
        } else {
            *g < newest
        };
        if delete {
            remove_generation(dir, path)?;
        }
    }
    Ok(())
}

/// Remove every generation newer than `generation` (committed or not): at a
/// restart from `generation` they are unusable, and the restarted run will
/// write generations with the same numbers.
pub fn remove_newer_than(dir: &Path, generation: u64) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error("list", dir, &e)),
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(g) = name.to_str().and_then(parse_generation_name) else {
            continue;
        };
        if g > generation && entry.path().is_dir() {
            remove_generation(dir, &entry.path())?;
        }
    }
    Ok(())
}

fn remove_generation(dir: &Path, path: &Path) -> Result<()> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(DELETING_SUFFIX);
    let trash = path.with_file_name(name);
    fs::rename(path, &trash).map_err(|e| io_error("rename for deletion", path, &e))?;
    sync_dir(dir)?;
    fs::remove_dir_all(&trash).map_err(|e| io_error("remove", &trash, &e))
}

// ---------------------------------------------------------------------------
// Inspector

/// One piece of a generation, as found by [`inspect`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PieceReport {
    /// Owning rank.
    pub rank: Rank,
    /// Bytes of checkpoint data (for a damaged file: what is on disk after
    /// the header; 0 if missing).
    pub bytes: u64,
    /// Whether the piece is intact (and, in a committed generation, as the
    /// commit record lists it).
    pub ok: bool,
    /// What is wrong with it, naming the file.
    pub problem: Option<String>,
}

/// One generation directory, as found by [`inspect`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GenerationReport {
    /// Generation number.
    pub generation: u64,
    /// Whether its commit record is valid.
    pub committed: bool,
    /// Committed and every piece intact: a restart could use it.
    pub usable: bool,
    /// Job size from the commit record; for an uncommitted generation, the
    /// number of piece files found.
    pub ranks: usize,
    /// Every piece: those the commit record lists, or, uncommitted, every
    /// piece file found (by rank).
    pub pieces: Vec<PieceReport>,
    /// Sum of the pieces' `bytes`.
    pub total_bytes: u64,
    /// Other findings: why the generation is uncommitted, leftover temporary
    /// files, stray or unrecognised files.
    pub notes: Vec<String>,
}

/// What a checkpoint directory holds and whether it is intact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InspectReport {
    /// The directory inspected.
    pub dir: PathBuf,
    /// Generations, newest first.
    pub generations: Vec<GenerationReport>,
    /// The generation a restart would use (newest usable; the restart also
    /// requires the job size to match).
    pub restart_from: Option<u64>,
    /// Top-level entries that are not generation directories (ignored).
    pub ignored: Vec<String>,
    /// What wrote the directory (its `MANIFEST`), if it says.
    pub manifest: Option<Manifest>,
}

fn inspect_generation(dir: &Path, generation: u64, path: &Path) -> GenerationReport {
    let mut notes = Vec::new();
    let mut piece_files = BTreeSet::new();
    match fs::read_dir(path) {
        Err(e) => notes.push(format!("cannot list {}: {e}", path.display())),
        Ok(entries) => {
            for entry in entries {
                let name = match entry {
                    Ok(entry) => entry.file_name().to_string_lossy().into_owned(),
                    Err(e) => {
                        notes.push(format!("cannot list {}: {e}", path.display()));
                        break;
                    }
                };
                if let Some(rank) = parse_piece_name(&name) {
                    piece_files.insert(rank);
                } else if name.ends_with(TMP_SUFFIX) {
                    notes.push(format!(
                        "leftover temporary file {name} (an interrupted write)"
                    ));
                } else if name != COMMIT_NAME {
                    notes.push(format!("unrecognised file {name}, ignored"));
                }
            }
        }
    }
    let (committed, ranks, pieces) = match load_commit(dir, generation) {
        CommitState::Valid(rec) => {
            let strays: Vec<String> = piece_files
                .range(rec.ranks..)
                .map(|&r| piece_name(r))
                .collect();
            if !strays.is_empty() {
                notes.push(format!(
                    "{} piece file(s) beyond the committed job of {} ranks, ignored: {}",
                    strays.len(),
                    rec.ranks,
                    strays.join(", ")
                ));
            }
            let pieces = rec
                .pieces
                .iter()
                .map(|&(rank, len, crc)| check_piece(dir, generation, rank, Some((len, crc))))
                .collect();
            (true, rec.ranks, pieces)
        }
        state => {
            notes.push(match state {
                CommitState::Invalid(d) => format!("COMMIT record rejected: {d}"),
                _ => "no COMMIT record: the checkpoint is incomplete or was interrupted".into(),
            });
            let pieces: Vec<PieceReport> = piece_files
                .iter()
                .map(|&rank| check_piece(dir, generation, rank, None))
                .collect();
            (false, pieces.len(), pieces)
        }
    };
    notes.sort();
    GenerationReport {
        generation,
        committed,
        usable: committed && pieces.iter().all(|p| p.ok),
        ranks,
        total_bytes: pieces.iter().map(|p| p.bytes).sum(),
        pieces,
        notes,
    }
}

/// Examines every generation in `dir`, verifying every checksum of every
/// piece and commit record, and works out which generation a restart would
/// use.
///
/// Reads each piece whole, one at a time. Damage is reported in the result,
/// never as an error; only an unreadable `dir` is [`Error::Driver`].
pub fn inspect(dir: &Path) -> Result<InspectReport> {
    let s = scan(dir)?;
    let mut ignored = s.ignored;
    let manifest = match read_manifest(dir) {
        Ok(m) => m,
        Err(e) => {
            ignored.push(problem_text(&e));
            None
        }
    };
    ignored.retain(|name| name != MANIFEST_NAME);
    let generations: Vec<GenerationReport> = s
        .generations
        .iter()
        .map(|(g, path)| inspect_generation(dir, *g, path))
        .collect();
    let restart_from = generations.iter().find(|g| g.usable).map(|g| g.generation);
    ignored.extend(s.leftovers.iter().map(|p| {
        format!(
            "{} (deletion interrupted)",
            p.file_name().unwrap_or_default().to_string_lossy()
        )
    }));
    Ok(InspectReport {
        dir: dir.to_path_buf(),
        generations,
        restart_from,
        ignored,
        manifest,
    })
}

/// Damaged pieces listed per generation by [`render`].
const MAX_DAMAGED_LINES: usize = 20;

impl fmt::Display for InspectReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Checkpoint directory {}", self.dir.display())?;
        if let Some(m) = &self.manifest {
            writeln!(f, "  written by {m}")?;
        }
        if self.generations.is_empty() {
            writeln!(f, "  no checkpoint generations")?;
        } else {
            writeln!(
                f,
                "{:>12}  {:<9}  {:>6}  {:>11}  {:>12}  status",
                "generation", "committed", "ranks", "pieces ok", "size"
            )?;
            for g in &self.generations {
                let ok = g.pieces.iter().filter(|p| p.ok).count();
                let status = match (g.committed, g.usable) {
                    (true, true) => "OK",
                    (true, false) => "CORRUPT",
                    (false, _) if ok == g.pieces.len() => "uncommitted",
                    (false, _) => "uncommitted, CORRUPT",
                };
                writeln!(
                    f,
                    "{:>12}  {:<9}  {:>6}  {:>11}  {:>12}  {status}",
                    g.generation,
                    if g.committed { "yes" } else { "no" },
                    g.ranks,
                    format!("{ok}/{}", g.pieces.len()),
                    crate::tools::human_bytes(g.total_bytes),
                )?;
            }
        }
        // Generations are newest first (like the table) and pieces by rank.
        let damaged: Vec<(u64, Vec<(Rank, &str)>)> = self
            .generations
            .iter()
            .map(|g| {
                let bad = g
                    .pieces
                    .iter()
                    .filter_map(|p| p.problem.as_deref().map(|why| (p.rank, why)))
                    .collect::<Vec<_>>();
                (g.generation, bad)
            })
            .filter(|(_, bad)| !bad.is_empty())
            .collect();
        if !damaged.is_empty() {
            writeln!(f, "Damaged pieces:")?;
            for (g, bad) in &damaged {
                // A whole generation can be damaged at once (a lost file
                // system); past a screenful the JSON report has the rest.
                for (rank, why) in bad.iter().take(MAX_DAMAGED_LINES) {
                    writeln!(f, "  generation {g}, rank {rank}: {why}")?;
                }
                if bad.len() > MAX_DAMAGED_LINES {
                    writeln!(
                        f,
                        "  generation {g}: {} more damaged pieces",
                        bad.len() - MAX_DAMAGED_LINES
                    )?;
                }
            }
        }
        let notes: Vec<(u64, &String)> = self
            .generations
            .iter()
            .flat_map(|g| g.notes.iter().map(move |n| (g.generation, n)))
            .collect();
        if !notes.is_empty() || !self.ignored.is_empty() {
            writeln!(f, "Notes:")?;
            for (g, note) in notes {
                writeln!(f, "  generation {g}: {note}")?;
            }
            for name in &self.ignored {
                writeln!(f, "  ignored entry {name}")?;
            }
        }
        match self.restart_from {
            Some(g) => writeln!(f, "A restart would use generation {g}."),
            None => writeln!(
                f,
                "No usable committed generation: a restart is not possible."
            ),
        }
    }
}

/// A readable table of `report`: one line per generation (number, committed,
/// ranks, intact pieces, size, OK/CORRUPT), the damaged pieces and other
/// findings, and "A restart would use generation N."
pub fn render(report: &InspectReport) -> String {
    report.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A fresh directory under the system temporary directory, removed on
    /// drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "lazarus-disk-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).expect("create temp dir");
            TempDir(p)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn data(generation: u64, rank: Rank) -> Bytes {
        // Rank 0's piece is empty: zero-length data must round-trip too.
        Bytes::from(format!("g{generation}r{rank};").repeat(rank * 37))
    }

    /// Writes every piece of `generation` for `ranks` ranks; commits it if
    /// asked.
    fn write_generation(dir: &Path, generation: u64, ranks: usize, commit: bool) -> Vec<Piece> {
        let pieces: Vec<Piece> = (0..ranks)
            .map(|r| Piece::new(generation, r, data(generation, r)))
            .collect();
        for p in &pieces {
            write_piece(dir, p).expect("write piece");
        }
        if commit {
            let list: Vec<_> = pieces
                .iter()
                .rev()
                .map(|p| (p.owner, p.data.len(), p.crc))
                .collect();
            write_commit(dir, generation, ranks, &list).expect("write commit");
        }
        pieces
    }

    fn flip_byte(path: &Path, at_from_end: usize) {
        let mut b = fs::read(path).expect("read");
        let i = b.len() - at_from_end;
        b[i] ^= 0x20;
        fs::write(path, b).expect("write");
    }

    fn truncate(path: &Path, by: usize) {
        let b = fs::read(path).expect("read");
        fs::write(path, &b[..b.len() - by]).expect("write");
    }

    #[test]
    fn round_trip_of_pieces_and_commit() {
        let t = TempDir::new("roundtrip");
        let dir = t.path();
        let pieces = write_generation(dir, 3, 4, true);
        assert!(dir.join("gen-0000000003/rank-000002.piece").is_file());
        assert!(dir.join("gen-0000000003/COMMIT").is_file());
        for p in &pieces {
            assert_eq!(&read_piece(dir, 3, p.owner).expect("read"), p);
        }
        assert_eq!(committed_generations(dir).expect("list"), vec![3]);
        assert_eq!(restart_generation(dir, 4).expect("restart"), Some(3));
        let plan = restart_plan(dir, 4).expect("plan");
        assert!(plan.skipped.is_empty());
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(generation_dir(dir, 3))
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 5, "{names:?}");
        // Rewriting a piece replaces it atomically.
        let p = Piece::new(3, 1, Bytes::from_static(b"new"));
        write_piece(dir, &p).expect("rewrite");
        assert_eq!(read_piece(dir, 3, 1).expect("read"), p);
        // ... and the commit record no longer matches it: not restartable.
        assert_eq!(restart_generation(dir, 4).expect("restart"), None);
        // Parsing is the inverse of encoding.
        let rec = CommitRecord {
            generation: 9,
            ranks: 2,
            pieces: vec![(0, 5, 7), (1, 0, u32::MAX)],
        };
        assert_eq!(parse_commit(&encode_commit(&rec), 9), Ok(rec));
    }

    #[test]
    fn write_refuses_bad_input() {
        let t = TempDir::new("refuse");
        let dir = t.path();
        let mut p = Piece::new(1, 0, Bytes::from_static(b"state"));
        p.crc ^= 1;
        assert!(matches!(
            write_piece(dir, &p),
            Err(Error::CorruptCheckpoint { .. })
        ));
        let pieces = write_generation(dir, 1, 2, false);
        let entry = |r: usize| (r, pieces[r].data.len(), pieces[r].crc);
        // Missing rank, duplicate, out of range, zero ranks, not on disk.
        for (ranks, list) in [
            (2, vec![entry(0)]),
            (2, vec![entry(0), entry(0)]),
            (2, vec![entry(0), entry(1), (2, 0, 0)]),
            (0, vec![]),
            (3, vec![entry(0), entry(1), (2, 0, 0)]),
        ] {
            let err = write_commit(dir, 1, ranks, &list).expect_err("refused");
            assert!(matches!(err, Error::Driver(_)), "{err}");
        }
        // Listed length or CRC disagreeing with the file on disk.
        let err = write_commit(dir, 1, 2, &[entry(0), (1, 1, pieces[1].crc)]).expect_err("bad");
        assert!(
            matches!(&err, Error::CorruptCheckpoint { owner: 1, generation: 1, detail }
                if detail.contains("rank-000001.piece")),
            "{err}"
        );
        assert!(!commit_path(dir, 1).exists());
        assert_eq!(committed_generations(dir).expect("list"), Vec::<u64>::new());
        assert!(matches!(retain(dir, 0), Err(Error::Config { .. })));
        assert!(matches!(restart_plan(dir, 0), Err(Error::Config { .. })));
        let missing = dir.join("does-not-exist");
        let err = inspect(&missing).expect_err("no dir");
        assert!(err.to_string().contains("does-not-exist"), "{err}");
    }

    #[test]
    fn generation_without_commit_is_not_restartable() {
        let t = TempDir::new("nocommit");
        let dir = t.path();
        write_generation(dir, 2, 3, false);
        assert_eq!(committed_generations(dir).expect("list"), Vec::<u64>::new());
        let plan = restart_plan(dir, 3).expect("plan");
        assert_eq!(plan.generation, None);
        assert_eq!(plan.skipped.len(), 1);
        assert!(plan.skipped[0].reason.contains("no COMMIT"), "{:?}", plan);
        write_generation(dir, 1, 3, true);
        let plan = restart_plan(dir, 3).expect("plan");
        assert_eq!(plan.generation, Some(1));
        assert_eq!(plan.skipped[0].generation, 2);
        // A different job size cannot use it.
        let plan = restart_plan(dir, 4).expect("plan");
        assert_eq!(plan.generation, None);
        assert!(
            plan.skipped[1].reason.contains("job of 3 ranks"),
            "{plan:?}"
        );
    }

    #[test]
    fn truncated_or_corrupted_commit_is_ignored() {
        let t = TempDir::new("badcommit");
        let dir = t.path();
        write_generation(dir, 1, 3, true);
        write_generation(dir, 2, 3, true);
        assert_eq!(committed_generations(dir).expect("list"), vec![2, 1]);
        let commit = commit_path(dir, 2);
        let good = fs::read(&commit).expect("read");
        truncate(&commit, 5);
        assert_eq!(committed_generations(dir).expect("list"), vec![1]);
        let plan = restart_plan(dir, 3).expect("plan");
        assert_eq!(plan.generation, Some(1));
        assert!(
            plan.skipped[0].reason.contains("truncated")
                && plan.skipped[0].to_string().contains("COMMIT"),
            "{plan:?}"
        );
        // Empty, cut inside the fixed part, or one flipped bit anywhere.
        for len in [0, 3, 20] {
            fs::write(&commit, &good[..len]).expect("write");
            assert_eq!(restart_generation(dir, 3).expect("restart"), Some(1));
        }
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 1 << (i % 8);
            fs::write(&commit, b).expect("write");
            assert_eq!(
                committed_generations(dir).expect("list"),
                vec![1],
                "byte {i}"
            );
        }
        // The record of generation 1 copied into generation 2's directory.
        fs::copy(commit_path(dir, 1), &commit).expect("copy");
        assert_eq!(committed_generations(dir).expect("list"), vec![1]);
        fs::write(&commit, &good).expect("restore");
        assert_eq!(restart_generation(dir, 3).expect("restart"), Some(2));
    }

    #[test]
    fn flipped_byte_in_piece_is_detected_and_restart_falls_back() {
        let t = TempDir::new("flip");
        let dir = t.path();
        write_generation(dir, 1, 3, true);
        write_generation(dir, 2, 3, true);
        let path = piece_path(dir, 2, 1);
        flip_byte(&path, 10);
        let err = read_piece(dir, 2, 1).expect_err("corrupt");
        match &err {
            Error::CorruptCheckpoint {
                owner,
                generation,
                detail,
            } => {
                assert_eq!((*owner, *generation), (1, 2));
                assert!(
                    detail.contains("gen-0000000002/rank-000001.piece"),
                    "{detail}"
                );
                assert!(detail.contains("CRC32C"), "{detail}");
            }
            other => panic!("unexpected {other}"),
        }
        assert!(err.to_string().contains("generation 2"), "{err}");
        let plan = restart_plan(dir, 3).expect("plan");
        assert_eq!(plan.generation, Some(1));
        assert!(plan.skipped[0].reason.contains("rank 1"), "{plan:?}");
        // A flipped byte in the header is caught by the header checksum.
        flip_byte(&path, 10);
        read_piece(dir, 2, 1).expect("restored");
        let mut b = fs::read(&path).expect("read");
        b[30] ^= 4; // inside the length field
        fs::write(&path, b).expect("write");
        let err = read_piece(dir, 2, 1).expect_err("corrupt header");
        assert!(err.to_string().contains("header"), "{err}");
        // A valid piece under the wrong name is refused too.
        fs::copy(piece_path(dir, 2, 0), &path).expect("copy");
        let err = read_piece(dir, 2, 1).expect_err("misplaced");
        assert!(err.to_string().contains("misplaced"), "{err}");
        assert_eq!(restart_generation(dir, 3).expect("restart"), Some(1));
    }

    #[test]
    fn truncated_piece_is_detected() {
        let t = TempDir::new("trunc");
        let dir = t.path();
        write_generation(dir, 1, 3, true);
        write_generation(dir, 2, 3, true);
        let path = piece_path(dir, 2, 2);
        let good = fs::read(&path).expect("read");
        truncate(&path, 3);
        let err = read_piece(dir, 2, 2).expect_err("truncated");
        assert!(
            matches!(&err, Error::CorruptCheckpoint { owner: 2, generation: 2, detail }
                if detail.contains("truncated") && detail.contains("rank-000002.piece")),
            "{err}"
        );
        assert_eq!(restart_generation(dir, 3).expect("restart"), Some(1));
        // Cut inside the header, and extended with trailing bytes.
        fs::write(&path, &good[..20]).expect("write");
        assert!(
            read_piece(dir, 2, 2)
                .expect_err("short")
                .to_string()
                .contains("truncated")
        );
        let mut longer = good.clone();
        longer.extend_from_slice(b"xyz");
        fs::write(&path, longer).expect("write");
        assert!(read_piece(dir, 2, 2).is_err());
        // A missing piece is an I/O error naming the file, and falls back.
        fs::remove_file(&path).expect("remove");
        let err = read_piece(dir, 2, 2).expect_err("missing");
        assert!(
            matches!(&err, Error::Driver(m) if m.contains("rank-000002.piece") && m.contains("generation 2")),
            "{err}"
        );
        assert_eq!(restart_generation(dir, 3).expect("restart"), Some(1));
    }

    #[test]
    fn garbage_in_the_directory_does_not_panic() {
        let t = TempDir::new("garbage");
        let dir = t.path();
        write_generation(dir, 4, 2, true);
        fs::write(dir.join("junk"), b"junk").expect("write");
        fs::write(dir.join("gen-0000000009"), b"a file, not a dir").expect("write");
        fs::create_dir(dir.join("gen-abc")).expect("mkdir");
        fs::create_dir(dir.join("gen-00000000004")).expect("mkdir"); // non-canonical
        fs::create_dir(dir.join("gen-0000000007")).expect("mkdir"); // empty
        let g8 = generation_dir(dir, 8);
        fs::create_dir(&g8).expect("mkdir");
        fs::write(g8.join("COMMIT"), b"LZRCOMIT\x01\0\0\0garbage").expect("write");
        fs::write(g8.join("rank-000000.piece"), b"LZRPIECE").expect("write");
        fs::write(g8.join("rank-000001.piece"), vec![0xff; 100]).expect("write");
        fs::create_dir(g8.join("rank-000002.piece")).expect("mkdir");
        fs::write(g8.join("rank-1.piece"), b"").expect("write");
        fs::write(g8.join("COMMIT.123-0.tmp"), b"").expect("write");
        let g10 = generation_dir(dir, 10);
        fs::create_dir(&g10).expect("mkdir");
        fs::create_dir(g10.join("COMMIT")).expect("mkdir"); // a directory named COMMIT

        assert_eq!(committed_generations(dir).expect("list"), vec![4]);
        let plan = restart_plan(dir, 2).expect("plan");
        assert_eq!(plan.generation, Some(4));
        assert_eq!(
            plan.skipped
                .iter()
                .map(|s| s.generation)
                .collect::<Vec<_>>(),
            vec![10, 8, 7]
        );
        let report = inspect(dir).expect("inspect");
        assert_eq!(report.restart_from, Some(4));
        let g8r = report
            .generations
            .iter()
            .find(|g| g.generation == 8)
            .expect("gen 8");
        assert!(!g8r.committed);
        assert_eq!(g8r.pieces.len(), 3);
        assert!(g8r.pieces.iter().all(|p| !p.ok));
        assert!(
            g8r.notes.iter().any(|n| n.contains("temporary")),
            "{:?}",
            g8r.notes
        );
        assert!(report.ignored.contains(&"junk".to_string()));
        let text = render(&report);
        assert!(text.contains("A restart would use generation 4."), "{text}");
        retain(dir, 1).expect("retain");
        assert_eq!(committed_generations(dir).expect("list"), vec![4]);
        assert!(
            generation_dir(dir, 8).exists(),
            "newer uncommitted generations stay"
        );
    }

    /// Runs `f` on another thread and fails if it does not return within
    /// 20 s: a read that blocks (a FIFO) must fail the test, not hang it.
    fn within_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(20))
            .expect("blocked on a file that is not a regular one")
    }

    /// A FIFO, a device and a symbolic link to `/dev/zero` in place of a
    /// piece or a commit record are refused by name, never opened for a
    /// blocking read nor read without end; the restart falls back past them.
    #[test]
    fn fifos_devices_and_links_are_refused_not_read() {
        let t = TempDir::new("special");
        let dir = t.path().to_path_buf();
        write_generation(&dir, 1, 2, true);
        for g in 2..=5 {
            write_generation(&dir, g, 2, true);
        }
        let fifo = |path: &Path| {
            let _ = fs::remove_file(path);
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
            // SAFETY: a valid NUL-terminated path; mkfifo only reads it.
            #[allow(unsafe_code)]
            let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
            assert_eq!(rc, 0, "mkfifo {}", path.display());
        };
        let link = |target: &str, path: &Path| {
            let _ = fs::remove_file(path);
            std::os::unix::fs::symlink(target, path).expect("symlink");
        };
        fifo(&piece_path(&dir, 5, 1));
        fifo(&commit_path(&dir, 4));
        link("/dev/zero", &piece_path(&dir, 3, 0));
        link("/dev/null", &commit_path(&dir, 2));
        let d = dir.clone();
        let plan = within_seconds(move || restart_plan(&d, 2)).expect("plan");
        assert_eq!(plan.generation, Some(1), "{plan:?}");
        let reasons: Vec<&str> = plan.skipped.iter().map(|s| s.reason.as_str()).collect();
        assert_eq!(reasons.len(), 4, "{reasons:?}");
        for (reason, (path, what)) in reasons.iter().zip([
            (piece_path(&dir, 5, 1), "a FIFO"),
            (commit_path(&dir, 4), "a FIFO"),
            (piece_path(&dir, 3, 0), "a symbolic link"),
            (commit_path(&dir, 2), "a symbolic link"),
        ]) {
            assert!(
                reason.contains(&path.display().to_string()) && reason.contains(what),
                "{reason}"
            );
        }
        let d = dir.clone();
        let e = within_seconds(move || read_committed_piece(&d, 5, 1)).expect_err("a FIFO");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let d = dir.clone();
        let report = within_seconds(move || inspect(&d)).expect("inspect");
        assert_eq!(report.restart_from, Some(1));
        // A device itself, not through a link (an unprivileged test cannot
        // make one in the directory).
        let e = open_regular(Path::new("/dev/zero")).expect_err("a device");
        assert!(e.to_string().contains("a device"), "{e}");
    }

    /// A manifest is compared on what both sides know: a job that does not
    /// name its program (a library user) restarts a named directory and a
    /// named job an unnamed one; another program, rank count or protocol,
    /// or a manifest that is not one, is refused naming `--restart`.
    #[test]
    fn a_manifest_is_compared_on_what_is_known() {
        let t = TempDir::new("manifest");
        let dir = t.path();
        let named = Manifest {
            program: Some("cg class S".into()),
            ranks: 4,
            protocol: "coordinated".into(),
        };
        assert_eq!(check_manifest(dir, &named).expect("none yet"), None);
        write_manifest(dir, &named).expect("write");
        assert_eq!(read_manifest(dir).expect("read"), Some(named.clone()));
        let unnamed = Manifest {
            program: None,
            ..named.clone()
        };
        assert!(check_manifest(dir, &unnamed).is_ok());
        let refused = |job: Manifest| match check_manifest(dir, &job) {
            Err(Error::Config { option, detail }) => {
                assert_eq!(option, "restart");
                assert!(detail.contains("cg class S"), "{detail}");
            }
            other => panic!("{job:?}: {other:?}"),
        };
        refused(Manifest {
            program: Some("dht 4096 keys per rank in 1024 slots".into()),
            ..named.clone()
        });
        refused(Manifest {
            ranks: 3,
            ..unnamed.clone()
        });
        refused(Manifest {
            protocol: "pessimistic".into(),
            ..unnamed.clone()
        });
        write_manifest(dir, &unnamed).expect("write");
        assert!(check_manifest(dir, &named).is_ok());
        fs::write(dir.join(MANIFEST_NAME), b"not json").expect("write");
        assert!(matches!(
            check_manifest(dir, &named),
            Err(Error::Config { option, .. }) if option == "restart"
        ));
        assert!(inspect(dir).expect("inspect").manifest.is_none());
    }

    #[test]
    fn retain_keeps_the_newest() {
        let t = TempDir::new("retain");
        let dir = t.path();
        for g in [1, 2, 4, 5] {
            write_generation(dir, g, 2, true);
        }
        write_generation(dir, 3, 2, false); // older than the newest commit
        write_generation(dir, 6, 2, false); // in progress
        fs::create_dir(dir.join("gen-0000000000.deleting")).expect("mkdir");
        retain(dir, 2).expect("retain");
        let mut left: Vec<String> = fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec!["gen-0000000004", "gen-0000000005", "gen-0000000006"]
        );
        assert_eq!(committed_generations(dir).expect("list"), vec![5, 4]);
        // The newest committed generation survives even when damaged.
        flip_byte(&piece_path(dir, 5, 1), 1);
        retain(dir, 1).expect("retain");
        assert_eq!(committed_generations(dir).expect("list"), vec![5]);
        assert_eq!(restart_generation(dir, 2).expect("restart"), None);
        // Nothing committed: nothing deleted.
        let t2 = TempDir::new("retain-none");
        write_generation(t2.path(), 1, 1, false);
        retain(t2.path(), 1).expect("retain");
        assert!(generation_dir(t2.path(), 1).exists());
    }

    #[test]
    fn inspect_reports_a_corrupted_piece() {
        let t = TempDir::new("inspect");
        let dir = t.path();
        write_generation(dir, 1, 3, true);
        write_generation(dir, 2, 3, true);
        write_generation(dir, 3, 2, false);
        flip_byte(&piece_path(dir, 2, 2), 1);
        let report = inspect(dir).expect("inspect");
        assert_eq!(report.restart_from, Some(1));
        let gens: Vec<u64> = report.generations.iter().map(|g| g.generation).collect();
        assert_eq!(gens, vec![3, 2, 1]);
        let g2 = &report.generations[1];
        assert!(g2.committed && !g2.usable);
        assert_eq!(g2.ranks, 3);
        assert!(g2.pieces[0].ok && g2.pieces[1].ok);
        assert!(!g2.pieces[2].ok);
        assert_eq!(g2.pieces[2].bytes, data(2, 2).len() as u64);
        assert!(
            g2.pieces[2]
                .problem
                .as_deref()
                .is_some_and(|p| p.contains("CRC32C")),
            "{g2:?}"
        );
        let expected_total: u64 = (0..3).map(|r| data(2, r).len() as u64).sum();
        assert_eq!(g2.total_bytes, expected_total);
        let g1 = &report.generations[2];
        assert!(g1.committed && g1.usable);
        let g3 = &report.generations[0];
        assert!(!g3.committed && !g3.usable && g3.pieces.iter().all(|p| p.ok));
        let text = render(&report);
        assert!(text.contains("A restart would use generation 1."), "{text}");
        assert!(text.contains("CORRUPT"), "{text}");
        assert!(text.contains("generation 2, rank 2"), "{text}");
        let json = serde_json::to_string(&report).expect("json");
        assert!(json.contains("\"restart_from\":1"), "{json}");
        // With the last good generation damaged too, no restart is possible.
        flip_byte(&piece_path(dir, 1, 1), 1);
        let report = inspect(dir).expect("inspect");
        assert_eq!(report.restart_from, None);
        assert!(render(&report).contains("not possible"));
    }

    #[test]
    fn render_lists_damage_in_rank_order_and_caps_it() {
        let t = TempDir::new("render");
        let dir = t.path();
        write_generation(dir, 1, 23, true);
        for r in 0..23 {
            fs::remove_file(piece_path(dir, 1, r)).expect("remove");
        }
        let text = render(&inspect(dir).expect("inspect"));
        let r0 = text.find("generation 1, rank 0:").expect("rank 0 listed");
        let r1 = text.find("generation 1, rank 1:").expect("rank 1 listed");
        assert!(r0 < r1, "{text}");
        assert!(!text.contains("rank 20:"), "{text}");
        assert!(text.contains("3 more damaged pieces"), "{text}");
        assert!(text.contains("missing"), "{text}");
    }

    #[test]
    fn random_bytes_never_panic_the_parsers() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x0d15_c0de);
        let path = Path::new("/fuzz/rank-000001.piece");
        let good_piece = {
            let p = Piece::new(5, 1, Bytes::from_static(b"some checkpoint data"));
            let mut b = encode_piece_header(&p);
            b.extend_from_slice(&p.data.to_vec());
            b
        };
        let good_commit = encode_commit(&CommitRecord {
            generation: 5,
            ranks: 3,
            pieces: vec![(0, 1, 2), (1, 20, 3), (2, 0, 4)],
        });
        assert!(parse_piece(Bytes::from(good_piece.clone()), 5, 1, path).is_ok());
        assert!(parse_commit(&good_commit, 5).is_ok());
        for round in 0..4000 {
            let len = rng.random_range(0..160usize);
            let mut buf: Vec<u8> = (0..len).map(|_| rng.random::<u8>()).collect();
            match round % 4 {
                // Pure noise.
                0 => {}
                // Noise behind a valid magic and version, so the parsers get
                // past their first checks.
                1 | 2 => {
                    let magic: &[u8] = if round % 4 == 1 {
                        &PIECE_MAGIC
                    } else {
                        &COMMIT_MAGIC
                    };
                    let mut b = magic.to_vec();
                    b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
                    b.extend_from_slice(&buf);
                    buf = b;
                }
                // A valid file with one flipped bit, or cut short: CRC32C
                // catches every single-bit error, so this must be refused.
                _ => {
                    let src = if rng.random::<bool>() {
                        &good_piece
                    } else {
                        &good_commit
                    };
                    let mut b = src.clone();
                    if rng.random::<bool>() {
                        let i = rng.random_range(0..b.len());
                        b[i] ^= 1 << rng.random_range(0..8u32);
                    } else {
                        b.truncate(rng.random_range(0..b.len()));
                    }
                    assert!(parse_piece(Bytes::from(b.clone()), 5, 1, path).is_err());
                    assert!(parse_commit(&b, 5).is_err());
                    buf = b;
                }
            }
            let _ = parse_piece(Bytes::from(buf.clone()), 5, 1, path);
            let _ = parse_piece_header(&buf);
            let _ = parse_commit(&buf, 5);
        }
    }

    #[test]
    fn names_are_canonical() {
        assert_eq!(parse_generation_name("gen-0000000012"), Some(12));
        assert_eq!(
            parse_generation_name("gen-12345678901"),
            Some(12_345_678_901)
        );
        assert_eq!(parse_generation_name("gen-00000000012"), None);
        assert_eq!(parse_generation_name("gen-000000012"), None);
        assert_eq!(parse_generation_name("gen-+000000012"), None);
        assert_eq!(parse_piece_name("rank-000003.piece"), Some(3));
        assert_eq!(parse_piece_name("rank-1234567.piece"), Some(1_234_567));
        assert_eq!(parse_piece_name("rank-000003.piece.1-0.tmp"), None);
    }
}
