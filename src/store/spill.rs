//! Spill files of a bounded message log (issue 33, build 2).
//!
//! A logging protocol keeps every payload a rank sent until the receiver's
//! checkpoint makes it unnecessary (004 §2.2). Under `--log-budget` the
//! payloads that do not fit move to a [`LogSpill`], which the runtime
//! provides (DESIGN principle 2: a protocol touches no file itself). The
//! implementation here, [`FileSpill`], keeps one append-only, unlinked file
//! per destination in the spill directory (so a killed rank leaves nothing
//! behind), frees the trimmed front of a file by punching a hole, and starts
//! it again at offset 0 once everything in it was trimmed.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::{Error, Rank, Result};

/// One append-only sequence of a spill, trimmed from its front: a channel's
/// payloads, or a communicator's logged collective results (ULML, 002
/// §2.2: they are payload log too, and count against the same budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SpillStream {
    /// Payloads sent to this rank.
    Channel(Rank),
    /// Collective results of this communicator context.
    Results(u64),
}

impl fmt::Display for SpillStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpillStream::Channel(r) => write!(f, "rank {r}'s channel"),
            SpillStream::Results(c) => write!(f, "the results of context {c}"),
        }
    }
}

/// Where a message log keeps payloads it moved out of memory, by stream.
/// Offsets are those [`LogSpill::append`] returned.
pub trait LogSpill: Send + fmt::Debug {
    /// Append `payload` to `stream`; returns its offset. Fails with
    /// [`Error::LogSpill`] when the spill is full or cannot be written (the
    /// log then keeps the payload in memory).
    fn append(&mut self, stream: SpillStream, payload: &[u8]) -> Result<u64>;
    /// Read back `len` bytes at `offset` of `stream`.
    fn read(&self, stream: SpillStream, offset: u64, len: usize) -> Result<Bytes>;
    /// Nothing of `stream` below `upto` is needed any more (`None`: nothing
    /// at all).
    fn release(&mut self, stream: SpillStream, upto: Option<u64>);
    /// Bytes the spill holds now (appended and not released).
    fn held(&self) -> u64;
}

/// One stream's spill file.
#[derive(Debug)]
struct DestFile {
    file: File,
    /// Bytes appended since the file was last started again.
    len: u64,
    /// Bytes at its front released (punched out).
    freed: u64,
}

/// A [`LogSpill`] in unlinked files of a directory, holding at most
/// `limit` bytes.
pub struct FileSpill {
    dir: PathBuf,
    limit: u64,
    files: BTreeMap<SpillStream, DestFile>,
}

impl fmt::Debug for FileSpill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileSpill")
            .field("dir", &self.dir)
            .field("limit", &self.limit)
            .field("held", &self.held())
            .finish()
    }
}

impl FileSpill {
    /// Spill files in `dir`, holding at most `limit` bytes in all. Nothing
    /// is created before the first payload is spilled.
    pub fn new(dir: impl Into<PathBuf>, limit: u64) -> Self {
        FileSpill {
            dir: dir.into(),
            limit,
            files: BTreeMap::new(),
        }
    }

    /// The bound for a log budget of `budget` bytes spilling into `dir`:
    /// half the space free there now, and at least 16 budgets (a spill
    /// that fills the disk would fail the checkpoints and the other jobs
    /// writing there).
    pub fn limit_for(dir: &Path, budget: usize) -> u64 {
        let floor = 16 * budget as u64;
        // The field types differ between platforms.
        #[allow(clippy::unnecessary_cast)]
        match nix::sys::statvfs::statvfs(dir) {
            Ok(s) => floor.max(s.blocks_available() as u64 * s.fragment_size() as u64 / 2),
            Err(_) => floor,
        }
    }

    fn error(&self, what: &str, e: impl fmt::Display) -> Error {
        Error::LogSpill {
            detail: format!("{what} in {}: {e}", self.dir.display()),
        }
    }

    /// An unlinked file in the spill directory: `O_TMPFILE` where the file
    /// system has it, else a named file removed at once.
    fn open(&self) -> Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        let unnamed = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(&self.dir);
        if let Ok(f) = unnamed {
            return Ok(f);
        }
        let name = self.dir.join(format!(
            ".lazarus-log-spill-{}-{:x}",
            std::process::id(),
            self as *const Self as usize
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&name)
            .map_err(|e| self.error("cannot create a spill file", e))?;
        // Unlinked now: a rank killed later leaves nothing behind.
        std::fs::remove_file(&name).map_err(|e| self.error("cannot unlink a spill file", e))?;
        Ok(f)
    }
}

impl LogSpill for FileSpill {
    fn append(&mut self, dest: SpillStream, payload: &[u8]) -> Result<u64> {
        if self.held() + payload.len() as u64 > self.limit {
            return Err(self.error(
                "the spill is full",
                format!("{} bytes held, limit {}", self.held(), self.limit),
            ));
        }
        if !self.files.contains_key(&dest) {
            let file = self.open()?;
            self.files.insert(
                dest,
                DestFile {
                    file,
                    len: 0,
                    freed: 0,
                },
            );
        }
        let dir = self.dir.clone();
        let Some(f) = self.files.get_mut(&dest) else {
            return Err(Error::LogSpill {
                detail: format!("no spill file for {dest} in {}", dir.display()),
            });
        };
        let offset = f.len;
        f.file
            .write_all_at(payload, offset)
            .map_err(|e| Error::LogSpill {
                detail: format!("cannot write a spill file in {}: {e}", dir.display()),
            })?;
        f.len += payload.len() as u64;
        Ok(offset)
    }

    fn read(&self, dest: SpillStream, offset: u64, len: usize) -> Result<Bytes> {
        if len == 0 {
            // An empty payload has nothing in the file, which may have
            // started again since (its offset was the end).
            return Ok(Bytes::new());
        }
        let f = self.files.get(&dest).ok_or_else(|| Error::LogSpill {
            detail: format!("no spill file for {dest}"),
        })?;
        if offset + len as u64 > f.len || offset < f.freed {
            return Err(self.error(
                "a spilled payload is out of range",
                format!("{len} bytes at {offset} of the spill of {dest}"),
            ));
        }
        let mut buf = vec![0; len];
        f.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| self.error("cannot read a spill file", e))?;
        Ok(buf.into())
    }

    fn release(&mut self, dest: SpillStream, upto: Option<u64>) {
        let Some(f) = self.files.get_mut(&dest) else {
            return;
        };
        match upto {
            Some(upto) if upto < f.len => {
                if upto > f.freed {
                    // Best effort: where holes cannot be punched the bytes
                    // stay on disk until the file starts again.
                    let _ = nix::fcntl::fallocate(
                        &f.file,
                        nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                            | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                        f.freed as i64,
                        (upto - f.freed) as i64,
                    );
                    f.freed = upto;
                }
            }
            _ => {
                // Everything trimmed: start the file again.
                let _ = f.file.set_len(0);
                f.len = 0;
                f.freed = 0;
            }
        }
    }

    fn held(&self) -> u64 {
        self.files.values().map(|f| f.len - f.freed).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_reads_back_releases_and_refuses_past_its_limit() {
        const ONE: SpillStream = SpillStream::Channel(1);
        const TWO: SpillStream = SpillStream::Results(1);
        let dir = std::env::temp_dir();
        let mut s = FileSpill::new(&dir, 100);
        let a = s.append(ONE, &[1; 40]).expect("appends");
        let b = s.append(ONE, &[2; 40]).expect("appends");
        let c = s.append(TWO, &[3; 10]).expect("appends");
        assert_eq!((a, b, c), (0, 40, 0));
        assert_eq!(s.read(ONE, b, 40).expect("reads"), vec![2u8; 40]);
        assert_eq!(s.held(), 90);
        assert!(matches!(
            s.append(TWO, &[4; 20]),
            Err(Error::LogSpill { .. })
        ));
        s.release(ONE, Some(b));
        assert_eq!(s.held(), 50);
        assert!(s.read(ONE, a, 40).is_err(), "released");
        assert!(s.read(ONE, b, 41).is_err(), "past the end");
        s.release(ONE, None);
        assert_eq!(s.held(), 10);
        // An empty payload spilled at the end reads back after the file
        // started again.
        let empty = s.append(TWO, &[]).expect("appends");
        s.release(TWO, Some(empty));
        assert_eq!(s.read(TWO, empty, 0).expect("reads"), Bytes::new());
        assert_eq!(s.append(ONE, &[5; 5]).expect("appends"), 0);
    }
}
