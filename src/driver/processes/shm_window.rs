//! Shared-memory windows: one-sided operations between rank processes on
//! one host without a round trip.
//!
//! A rank on a host whose ranks use shared-memory rings exposes each window
//! in a file of the job's shared-memory directory, named after the window,
//! the rank, its incarnation and the window epoch
//! ([`ShmWindow::file_name`]). An origin on the same host maps the file and
//! applies its PUT, GET, accumulate, compare-and-swap and lock operations
//! itself, under a process-shared mutex in the file, as the threads backend
//! applies them under the window's lock: the target's code does not run,
//! and nothing crosses a socket. The target's own accesses
//! (`with_local_window`) and operations that still arrive over its socket
//! (an origin on another host, or one that could not map the file) take the
//! same mutex.
//!
//! ```text
//! | magic | bytes | withdrawn | … | mutex (robust, process-shared) | … | readers | writer | … | memory: bytes |
//! ```
//!
//! The mutex is robust: an origin killed while holding it (in the middle of
//! a PUT, say) does not leave the window locked for ever; the next taker
//! finds it marked and carries on (the failure rolls back what the torn
//! operation touched, as any failure does). A file is created under a
//! temporary name and renamed once initialised, so an origin never maps a
//! half-made window. The owner marks the window withdrawn and unlinks the
//! file when it frees it; an origin checks the mark under the mutex and
//! treats a withdrawn window as gone. A dead rank's files are removed when
//! its replacement exposes its own.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::shm::{MAPPED_HEADER, Mapping, ShmError};
use crate::driver::shared::{LockState, WindowMemory, apply_rma};
use crate::driver::{RmaOp, RmaReply, WinId};
use crate::{Error, Rank, Result};

const MAGIC: u64 = 0x4c41_5a57_494e_4401; // "LAZWIND", version 1
const OFF_MAGIC: usize = 0;
const OFF_BYTES: usize = 8;
const OFF_WITHDRAWN: usize = 16;
/// The mutex on its own cache line.
const OFF_MUTEX: usize = 64;
/// The passive-target lock state: two u32, guarded by the mutex.
const OFF_READERS: usize = 128;
const OFF_WRITER: usize = 132;
/// Bytes before the window's memory (which is 64-byte aligned).
const HEADER: usize = MAPPED_HEADER;

const _: () = assert!(std::mem::size_of::<libc::pthread_mutex_t>() <= OFF_READERS - OFF_MUTEX);

/// One window's shared memory, mapped by its owner or by an origin.
pub struct ShmWindow {
    map: Mapping,
    bytes: usize,
    /// The file and its inode, for the owner (which unlinks it when the
    /// window is freed, unless the name was taken over since).
    owned: Option<(PathBuf, u64)>,
}

// SAFETY: all shared state is reached through atomics or under the
// process-shared mutex; the mapping lives as long as the value.
#[allow(unsafe_code)]
unsafe impl Send for ShmWindow {}
// SAFETY: as for `Send`: `&ShmWindow` gives no unsynchronised access.
#[allow(unsafe_code)]
unsafe impl Sync for ShmWindow {}

/// The mutex held: memory and lock state may be touched.
struct Held<'a>(&'a ShmWindow);

#[allow(unsafe_code)]
impl Drop for Held<'_> {
    fn drop(&mut self) {
        // SAFETY: this thread locked the mutex in `ShmWindow::hold`.
        unsafe {
            libc::pthread_mutex_unlock(self.0.mutex());
        }
    }
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ShmError + 'a {
    move |source| ShmError::Io {
        what,
        path: path.display().to_string(),
        source,
    }
}

#[allow(unsafe_code)]
impl ShmWindow {
    /// The file name of `rank`'s window `id` in its incarnation and
    /// window epoch.
    pub fn file_name(id: WinId, rank: Rank, incarnation: u64, epoch: u64) -> String {
        format!("win.{id}.{rank}.{incarnation}.{epoch}")
    }

    /// Create and map `dir/name` with `bytes` bytes of memory (zero, then
    /// `init`), for its owner. Files of `rank`'s earlier incarnations (a
    /// dead predecessor's) are removed first.
    pub fn create(
        dir: &Path,
        (id, rank, incarnation, epoch): (WinId, Rank, u64, u64),
        bytes: usize,
        init: Option<&[u8]>,
    ) -> Result<ShmWindow, ShmError> {
        use std::os::unix::fs::OpenOptionsExt;
        remove_predecessors(dir, rank, incarnation);
        let name = Self::file_name(id, rank, incarnation, epoch);
        let path = dir.join(&name);
        let tmp = dir.join(format!("{name}.new"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io("cannot create", &tmp))?;
        let inode =
            std::os::unix::fs::MetadataExt::ino(&file.metadata().map_err(io("cannot stat", &tmp))?);
        let made = (|| {
            let len = HEADER + bytes.max(1);
            // Allocated now (as a ring is): a page a full /dev/shm cannot
            // back would otherwise kill a writer with SIGBUS.
            let off = libc::off_t::try_from(len)
                .map_err(|_| ShmError::Invalid(format!("window of {bytes} bytes")))?;
            nix::fcntl::posix_fallocate(&file, 0, off)
                .map_err(|e| io("cannot allocate", &tmp)(std::io::Error::from(e)))?;
            let map = Mapping::map(&file, len, &tmp)?;
            let w = ShmWindow {
                map,
                bytes,
                owned: None,
            };
            w.init_mutex(&tmp)?;
            if let Some(init) = init {
                let n = init.len().min(bytes);
                w.memory()[..n].copy_from_slice(&init[..n]);
            }
            w.word64(OFF_BYTES).store(bytes as u64, Ordering::Relaxed);
            w.word64(OFF_MAGIC).store(MAGIC, Ordering::Release);
            std::fs::rename(&tmp, &path).map_err(io("cannot publish", &path))?;
            Ok(w)
        })();
        match made {
            Ok(mut w) => {
                w.owned = Some((path, inode));
                Ok(w)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Map the window file `dir/name` made by a peer; `Ok(None)` when there
    /// is none (not exposed yet, exposed in heap memory, or freed).
    pub fn open(dir: &Path, name: &str) -> Result<Option<ShmWindow>, ShmError> {
        let path = dir.join(name);
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("cannot open", &path)(e)),
        };
        let size = file.metadata().map_err(io("cannot stat", &path))?.len();
        let len = usize::try_from(size).unwrap_or(0);
        if len <= HEADER {
            return Err(ShmError::Invalid(format!(
                "{} has {size} bytes, not a window's",
                path.display()
            )));
        }
        let map = Mapping::map(&file, len, &path)?;
        let mut w = ShmWindow {
            map,
            bytes: 0,
            owned: None,
        };
        let bytes = w.word64(OFF_BYTES).load(Ordering::Relaxed);
        if w.word64(OFF_MAGIC).load(Ordering::Acquire) != MAGIC
            || usize::try_from(bytes).map_or(true, |b| HEADER + b.max(1) != len)
        {
            return Err(ShmError::Invalid(format!(
                "{} has no window header",
                path.display()
            )));
        }
        w.bytes = bytes as usize;
        Ok(Some(w))
    }

    fn word64(&self, off: usize) -> &AtomicU64 {
        self.map.word64(off)
    }

    fn word32(&self, off: usize) -> &AtomicU32 {
        self.map.word32(off)
    }

    fn mutex(&self) -> *mut libc::pthread_mutex_t {
        // SAFETY: the mutex slot lies inside the header (checked by the
        // const assertion above), suitably aligned.
        unsafe { self.map.base().add(OFF_MUTEX).cast() }
    }

    /// The window's memory. Only under the mutex, or before the file is
    /// published.
    #[allow(clippy::mut_from_ref)]
    fn memory(&self) -> &mut [u8] {
        debug_assert!(HEADER + self.bytes <= self.map.len());
        // SAFETY: the range lies inside the mapping; callers hold the
        // mutex (or own the unpublished file), so no one else touches it.
        unsafe { std::slice::from_raw_parts_mut(self.map.base().add(HEADER), self.bytes) }
    }

    fn init_mutex(&self, path: &Path) -> Result<(), ShmError> {
        // SAFETY: attribute and mutex initialised in place, in memory no
        // one else maps yet; the attribute object is destroyed after use.
        let rc = unsafe {
            let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
            let mut rc = libc::pthread_mutexattr_init(&mut attr);
            if rc == 0 {
                rc = libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
            }
            if rc == 0 {
                rc = libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
            }
            if rc == 0 {
                rc = libc::pthread_mutex_init(self.mutex(), &attr);
            }
            libc::pthread_mutexattr_destroy(&mut attr);
            rc
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io("cannot make the mutex of", path)(
                std::io::Error::from_raw_os_error(rc),
            ))
        }
    }

    /// Take the mutex. A holder that died leaves it marked: the state is
    /// made consistent and kept (a failure is being recovered anyway).
    fn hold(&self) -> Result<Held<'_>> {
        // SAFETY: the mutex was initialised before the file was published.
        let rc = unsafe { libc::pthread_mutex_lock(self.mutex()) };
        match rc {
            0 => Ok(Held(self)),
            libc::EOWNERDEAD => {
                // SAFETY: this thread holds the mutex (EOWNERDEAD grants it).
                unsafe {
                    libc::pthread_mutex_consistent(self.mutex());
                }
                Ok(Held(self))
            }
            rc => Err(Error::Driver(format!(
                "a shared-memory window's mutex: {}",
                std::io::Error::from_raw_os_error(rc)
            ))),
        }
    }

    /// Whether the owner has freed this window.
    pub fn withdrawn(&self) -> bool {
        self.word32(OFF_WITHDRAWN).load(Ordering::Acquire) != 0
    }

    /// Apply `op` unless the window was freed (`Ok(None)`: the target no
    /// longer exposes it).
    pub fn apply_live(&self, id: WinId, op: RmaOp) -> Result<Option<RmaReply>> {
        let _held = self.hold()?;
        if self.withdrawn() {
            return Ok(None);
        }
        let mut state = LockState {
            readers: self.word32(OFF_READERS).load(Ordering::Relaxed) as usize,
            writer: self.word32(OFF_WRITER).load(Ordering::Relaxed) != 0,
        };
        let reply = apply_rma(&mut state, self.memory(), id, op)?;
        let readers = u32::try_from(state.readers).unwrap_or(u32::MAX);
        self.word32(OFF_READERS).store(readers, Ordering::Relaxed);
        self.word32(OFF_WRITER)
            .store(u32::from(state.writer), Ordering::Relaxed);
        Ok(Some(reply))
    }
}

impl WindowMemory for ShmWindow {
    fn apply(&self, id: WinId, op: RmaOp) -> Result<RmaReply> {
        self.apply_live(id, op)?.ok_or_else(|| Error::Rma {
            window: id,
            detail: "the window was freed".into(),
        })
    }

    fn with_memory(&self, f: &mut dyn FnMut(&mut [u8])) {
        // A mutex that cannot be taken is a broken mapping; the owner's
        // access then sees its memory unguarded rather than not at all.
        let held = self.hold();
        f(self.memory());
        drop(held);
    }
}

impl Drop for ShmWindow {
    fn drop(&mut self) {
        if let Some((path, inode)) = &self.owned {
            // Origins still mapping it see the mark under the mutex.
            if let Ok(_held) = self.hold() {
                self.word32(OFF_WITHDRAWN).store(1, Ordering::Release);
            }
            // Only this window's file: a window exposed again under the
            // same name replaced it, and is not to be unlinked.
            let ours = std::fs::metadata(path)
                .is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == *inode);
            if ours {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// Remove the window files of `rank`'s incarnations before `incarnation`
/// (left by a process that died without freeing them).
fn remove_predecessors(dir: &Path, rank: Rank, incarnation: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let mut parts = name.split('.');
        if parts.next() != Some("win") {
            continue;
        }
        let _id = parts.next();
        let r = parts.next().and_then(|r| r.parse::<Rank>().ok());
        let inc = parts.next().and_then(|i| i.parse::<u64>().ok());
        if r == Some(rank) && inc.is_some_and(|i| i < incarnation) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockType;
    use bytes::Bytes;

    fn dir(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("lazarus-win-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("test dir");
        p
    }

    /// An origin's mapping and the owner's are the same memory and lock
    /// state; a freed window is gone for the origin, and its file too.
    #[test]
    fn an_origin_applies_operations_to_the_owners_memory() {
        let d = dir("apply");
        let owner = ShmWindow::create(&d, (3, 1, 0, 2), 16, Some(&[7u8; 4])).expect("create");
        let name = ShmWindow::file_name(3, 1, 0, 2);
        assert!(ShmWindow::open(&d, "win.3.1.0.1").expect("open").is_none());
        let origin = ShmWindow::open(&d, &name).expect("open").expect("exists");
        let put = RmaOp::Put {
            offset: 8,
            data: Bytes::from_static(&[1, 2, 3]),
        };
        assert_eq!(origin.apply(3, put).expect("put"), RmaReply::Done);
        let get = RmaOp::Get { offset: 2, len: 8 };
        assert_eq!(
            owner.apply(3, get).expect("get"),
            RmaReply::Data(Bytes::from_static(&[7, 7, 0, 0, 0, 0, 1, 2]))
        );
        let mut seen = Vec::new();
        owner.with_memory(&mut |m| seen = m.to_vec());
        assert_eq!(seen.len(), 16);
        // One exclusive lock at a time, whoever asks.
        let x = RmaOp::TryLock(LockType::Exclusive);
        assert_eq!(
            origin.apply(3, x.clone()).expect("lock"),
            RmaReply::Granted(true)
        );
        assert_eq!(
            owner.apply(3, x.clone()).expect("lock"),
            RmaReply::Granted(false)
        );
        origin
            .apply(3, RmaOp::Unlock(LockType::Exclusive))
            .expect("unlock");
        assert_eq!(owner.apply(3, x).expect("lock"), RmaReply::Granted(true));
        // Out of bounds is the same error as on the heap.
        let far = RmaOp::Get { offset: 10, len: 8 };
        assert!(matches!(origin.apply(3, far), Err(Error::Rma { .. })));
        drop(owner);
        assert!(!d.join(&name).exists(), "the owner unlinks its file");
        assert!(origin.withdrawn());
        assert!(matches!(
            origin.apply_live(3, RmaOp::Get { offset: 0, len: 1 }),
            Ok(None)
        ));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A holder that dies with the mutex (here a thread that ends holding
    /// it; a killed process is the same to a robust mutex) does not lock
    /// the window for ever.
    #[test]
    fn a_holder_that_dies_does_not_lock_the_window_for_ever() {
        let d = dir("robust");
        let owner = ShmWindow::create(&d, (0, 0, 0, 0), 8, None).expect("create");
        let name = ShmWindow::file_name(0, 0, 0, 0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let origin = ShmWindow::open(&d, &name).expect("open").expect("exists");
                std::mem::forget(origin.hold().expect("hold"));
                // Still mapped when the thread ends, as a killed process's
                // memory is while the kernel releases its robust mutexes.
                std::mem::forget(origin);
            });
        });
        let put = RmaOp::Put {
            offset: 0,
            data: Bytes::from_static(&[9]),
        };
        // On a thread of its own, so that a mutex that is not robust fails
        // the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = owner.apply(0, put);
            let _ = tx.send((r, owner));
        });
        let (r, owner) = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the window stayed locked after its holder died: the mutex is not robust");
        assert_eq!(r.expect("put"), RmaReply::Done);
        // And it is an ordinary mutex again afterwards.
        assert_eq!(
            owner
                .apply(0, RmaOp::Get { offset: 0, len: 1 })
                .expect("get"),
            RmaReply::Data(Bytes::from_static(&[9]))
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A window exposed again under the same name replaces the file, and
    /// freeing the old one leaves the new one in place.
    #[test]
    fn freeing_a_replaced_window_leaves_its_successors_file() {
        let d = dir("again");
        let first = ShmWindow::create(&d, (5, 0, 0, 0), 8, Some(&[1])).expect("create");
        let second = ShmWindow::create(&d, (5, 0, 0, 0), 8, Some(&[2])).expect("create");
        drop(first);
        let name = ShmWindow::file_name(5, 0, 0, 0);
        let origin = ShmWindow::open(&d, &name)
            .expect("open")
            .expect("still there");
        assert_eq!(
            origin
                .apply(5, RmaOp::Get { offset: 0, len: 1 })
                .expect("get"),
            RmaReply::Data(Bytes::from_static(&[2]))
        );
        drop(second);
        assert!(!d.join(&name).exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A replacement's first window removes its dead predecessor's files,
    /// not other ranks' or its own.
    #[test]
    fn a_replacement_removes_its_predecessors_files() {
        let d = dir("stale");
        let old = ShmWindow::create(&d, (1, 2, 0, 0), 8, None).expect("create");
        let other = ShmWindow::create(&d, (1, 3, 0, 0), 8, None).expect("create");
        // The predecessor dies without freeing its window.
        std::mem::forget(old);
        let _new = ShmWindow::create(&d, (1, 2, 1, 1), 8, None).expect("create");
        let mut names: Vec<String> = std::fs::read_dir(&d)
            .expect("dir")
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        assert_eq!(names, ["win.1.2.1.1", "win.1.3.0.0"]);
        drop(other);
        let _ = std::fs::remove_dir_all(&d);
    }
}
