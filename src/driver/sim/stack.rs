//! Stacks of simulated ranks: slots carved from a few large mappings.
//!
//! A million coroutines cannot each have a mapping of their own: Linux caps
//! a process at `vm.max_map_count` mappings (65,530 by default), and a stack
//! with a guard page costs two. So a stack is a slot of a chunk, one
//! `MAP_NORESERVE` mapping of many slots, and the kernel commits only the
//! pages a rank touches (a blocked rank's stack is a few pages at the top of
//! its slot). While the mapping limit allows, the lowest page of every slot
//! is a guard page (`PROT_NONE`), which is what corosensei asks of a stack
//! for memory safety. Beyond the limit the page stays an unused gap, and a
//! canary just above it (zero, as fresh pages are, so it costs no memory)
//! is checked every time the rank suspends or ends: an overflow ends the
//! process with a message before any other rank runs on the memory it
//! overwrote.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::num::NonZeroUsize;
use std::rc::Rc;

use corosensei::stack::{Stack, StackPointer};

/// Virtual size of one rank's stack slot, guard page included. Committed
/// only where touched: a simulated rank blocked in a collective uses a few
/// pages at the top (`lazarus sim` reports the resident bytes).
pub(crate) const SLOT_BYTES: usize = 256 << 10;

/// Slots per chunk (one mapping): 1 GiB of address space.
const SLOTS_PER_CHUNK: usize = 4096;

/// Bytes of the canary checked in unguarded slots.
const CANARY_BYTES: usize = 512;

/// Mappings left free for everything else the process maps (heap arenas,
/// files, the allocator) when deciding whether guard pages fit.
const MAPPING_RESERVE: usize = 8192;

const PAGE: usize = 4096;

struct Chunk {
    base: *mut u8,
    len: usize,
    guarded: bool,
}

struct Pool {
    chunks: Vec<Chunk>,
    /// Free slot ids (chunk × SLOTS_PER_CHUNK + index).
    free: Vec<usize>,
    /// Slots wanted in all, as the pool was told: sizes the first chunk
    /// and the guard-page decision.
    expected: usize,
}

/// The stack slots of one simulation (single-threaded: the simulator runs
/// every rank's coroutine on the thread that called it).
pub(crate) struct StackPool {
    inner: Rc<RefCell<Pool>>,
}

/// One rank's stack: a slot of the pool, returned to it on drop.
pub(crate) struct RankStack {
    id: usize,
    base: usize,
    limit: usize,
    guarded: bool,
    pool: Rc<RefCell<Pool>>,
}

/// Why no stack could be given.
#[derive(Debug)]
pub(crate) struct NoStack(pub std::io::Error);

impl StackPool {
    /// A pool for about `expected` simultaneous stacks.
    pub(crate) fn new(expected: usize) -> Self {
        StackPool {
            inner: Rc::new(RefCell::new(Pool {
                chunks: Vec::new(),
                free: Vec::new(),
                expected: expected.max(1),
            })),
        }
    }

    /// A stack for a new rank.
    pub(crate) fn take(&self) -> Result<RankStack, NoStack> {
        let mut p = self.inner.borrow_mut();
        if p.free.is_empty() {
            p.grow()?;
        }
        let id = p
            .free
            .pop()
            .ok_or_else(|| NoStack(std::io::Error::other("the stack pool did not grow")))?;
        let chunk = &p.chunks[id / SLOTS_PER_CHUNK];
        let limit = chunk.base as usize + (id % SLOTS_PER_CHUNK) * SLOT_BYTES;
        let stack = RankStack {
            id,
            base: limit + SLOT_BYTES,
            limit,
            guarded: chunk.guarded,
            pool: self.inner.clone(),
        };
        if !stack.guarded && !stack.canary_intact() {
            // A reused slot whose canary a finished rank wrote into
            // legitimately cannot happen (the check would have ended the
            // process), but zero it rather than trust that.
            stack.clear_canary();
        }
        Ok(stack)
    }

    /// Bytes of stack memory resident (committed by the kernel), over every
    /// chunk: what the simulated ranks' stacks cost.
    pub(crate) fn resident_bytes(&self) -> u64 {
        let p = self.inner.borrow();
        let mut total = 0u64;
        let mut vec = Vec::new();
        for c in &p.chunks {
            vec.clear();
            vec.resize(c.len / PAGE, 0u8);
            // SAFETY: `c.base..c.base + c.len` is a live mapping of this pool
            // (chunks are unmapped only when the pool is dropped) and `vec`
            // has one byte per page of it, as mincore(2) writes.
            let rc = unsafe { libc::mincore(c.base.cast(), c.len, vec.as_mut_ptr()) };
            if rc == 0 {
                total += vec.iter().filter(|&&b| b & 1 == 1).count() as u64 * PAGE as u64;
            }
        }
        total
    }

    /// Whether every slot handed out so far has a guard page.
    pub(crate) fn guarded(&self) -> bool {
        self.inner.borrow().chunks.iter().all(|c| c.guarded)
    }
}

/// Mappings the process holds now, and the kernel's limit.
fn mapping_budget() -> Option<(usize, usize)> {
    let limit = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    Some((maps.lines().count(), limit))
}

impl Pool {
    fn grow(&mut self) -> Result<(), NoStack> {
        let handed = self.chunks.len() * SLOTS_PER_CHUNK;
        let slots = if self.chunks.is_empty() {
            self.expected.min(SLOTS_PER_CHUNK)
        } else {
            SLOTS_PER_CHUNK
        };
        // Guard pages cost one more mapping per slot (the slot's stack and
        // its guard do not merge); give them while all the stacks this run
        // expects fit, whole, under the limit.
        let want = self.expected.max(handed + slots);
        let guarded = match mapping_budget() {
            Some((now, limit)) => now + 2 * want.saturating_sub(handed) + MAPPING_RESERVE <= limit,
            None => true,
        };
        let len = slots * SLOT_BYTES;
        // SAFETY: a fresh anonymous private mapping with no address hint; the
        // result is checked before use.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(NoStack(std::io::Error::last_os_error()));
        }
        let base = base.cast::<u8>();
        let chunk = Chunk { base, len, guarded };
        // A transparent huge page would commit 2 MiB for the few KiB eight
        // ranks touch. Advice only: a kernel without THP refuses it harmlessly.
        // SAFETY: advice on the mapping just made.
        let _ = unsafe { libc::madvise(base.cast(), len, libc::MADV_NOHUGEPAGE) };
        if guarded {
            for i in 0..slots {
                // SAFETY: the page lies inside the mapping just made, which
                // nothing else uses yet.
                let rc = unsafe {
                    libc::mprotect(base.add(i * SLOT_BYTES).cast(), PAGE, libc::PROT_NONE)
                };
                if rc != 0 {
                    let e = std::io::Error::last_os_error();
                    drop(chunk); // unmaps it
                    return Err(NoStack(e));
                }
            }
        }
        let first = self.chunks.len() * SLOTS_PER_CHUNK;
        self.chunks.push(chunk);
        // Lowest slot ids are handed out first (popped from the end).
        self.free.extend((first..first + slots).rev());
        Ok(())
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `Pool::grow` with this length, and
        // the pool (which owns the chunks) outlives every stack in it: each
        // `RankStack` holds the pool.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

impl RankStack {
    fn canary_intact(&self) -> bool {
        self.sentinel().canary_intact()
    }

    fn clear_canary(&self) {
        // SAFETY: the canary lies in this stack's own slot, just above the
        // unused gap page (unguarded slots are read-write throughout); no
        // coroutine uses the slot yet.
        unsafe { std::ptr::write_bytes((self.limit + PAGE) as *mut u8, 0, CANARY_BYTES) }
    }

    /// What the scheduler checks between resumptions of the coroutine this
    /// stack is given to.
    pub(crate) fn sentinel(&self) -> Sentinel {
        Sentinel {
            canary: self.limit + PAGE,
            guarded: self.guarded,
        }
    }
}

/// A stack's overflow check, kept beside its coroutine (which owns the
/// stack, and so keeps the slot mapped, for as long as the two are kept).
pub(crate) struct Sentinel {
    canary: usize,
    guarded: bool,
}

impl Sentinel {
    fn canary_intact(&self) -> bool {
        // SAFETY: the canary lies in a slot of a live chunk (the coroutine
        // kept beside this sentinel holds the stack, which holds the pool),
        // read-write when unguarded; it is read only between resumptions,
        // and the slice does not outlive the call.
        let canary = unsafe { std::slice::from_raw_parts(self.canary as *const u8, CANARY_BYTES) };
        canary.iter().all(|&b| b == 0)
    }

    /// Whether the rank overflowed its stack. Slots with a guard page
    /// cannot (the guard page faults first).
    pub(crate) fn overflowed(&self) -> bool {
        !self.guarded && !self.canary_intact()
    }
}

impl Drop for RankStack {
    fn drop(&mut self) {
        self.pool.borrow_mut().free.push(self.id);
    }
}

// SAFETY: `base` and `limit` bound a slot of a live mapping owned by the
// pool this stack keeps alive; both are page-aligned (so aligned to
// STACK_ALIGNMENT); the slot holds SLOT_BYTES − one page of usable memory,
// far above MIN_STACK_SIZE. Slots have a guard page while the kernel's
// mapping limit allows; otherwise the canary check (module comment) stands
// in for it.
unsafe impl Stack for RankStack {
    fn base(&self) -> StackPointer {
        NonZeroUsize::new(self.base).unwrap_or(NonZeroUsize::MIN)
    }

    fn limit(&self) -> StackPointer {
        NonZeroUsize::new(self.limit).unwrap_or(NonZeroUsize::MIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_distinct_reused_and_zero_canaried() {
        let pool = StackPool::new(3);
        let a = pool.take().expect("a stack");
        let b = pool.take().expect("a stack");
        assert_ne!(a.base, b.base);
        assert_eq!(a.base - a.limit, SLOT_BYTES);
        assert!(!a.sentinel().overflowed() && !b.sentinel().overflowed());
        let a_base = a.base;
        drop(a);
        let c = pool.take().expect("a stack");
        assert_eq!(c.base, a_base, "a freed slot is handed out again");
        // Three expected stacks fit any mapping limit: guarded.
        assert!(pool.guarded());
    }

    #[test]
    fn a_coroutine_runs_on_a_pool_stack() {
        let pool = StackPool::new(1);
        let stack = pool.take().expect("a stack");
        let mut co =
            corosensei::Coroutine::with_stack(stack, |y: &corosensei::Yielder<u32, u32>, x| {
                let mut buf = [0u8; 8192]; // spans pages, so stack probes run
                buf[100] = 7;
                std::hint::black_box(&mut buf);
                let z = y.suspend(x + u32::from(buf[100]));
                z * 2
            });
        assert_eq!(co.resume(1).as_yield(), Some(8));
        assert_eq!(co.resume(5).as_return(), Some(10));
        assert!(pool.resident_bytes() >= 8192);
    }
}
