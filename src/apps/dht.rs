//! A distributed hash table of 8-byte integers over RMA atomics (003 §7.2.2).
//!
//! 003 §7.2.2 describes the key-value store of its evaluation: "a simple
//! distributed hashtable (DHT) that stores 8-Byte integers. The DHT consists
//! of parts called local volumes constructed with fixed-sized arrays. Every
//! local volume is managed by a different process. Inserts are based on MPI-3
//! atomic Compare-And-Swap and Fetch-And-Op functions. Elements after hash
//! collisions are inserted in the overflow heap that is the part of each local
//! volume. [...] a thread atomically updates the pointers to the next free
//! cell and the last element in the local volume. Memory consistency is
//! ensured with flushes."
//!
//! This app is that DHT. Each rank exposes one window of `u64`, its local
//! volume:
//!
//! | part | cells | meaning |
//! | --- | --- | --- |
//! | table keys | `table_slots` | the key stored in the slot, 0 = empty |
//! | table values | `table_slots` | its value |
//! | chain heads | `table_slots` | 1 + heap cell of the newest overflow entry of the slot, 0 = none |
//! | heap keys | `heap_cells` | key of an overflow entry |
//! | heap values | `heap_cells` | its value |
//! | heap next | `heap_cells` | 1 + next cell of the chain, 0 = end |
//! | next free cell | 1 | the heap allocation counter |
//!
//! Every rank inserts `keys_per_rank` globally distinct keys in `batches`
//! batches, one passive-target (`lock_all`) epoch per batch; between batches
//! is a safe point, where the runtime saves the window memory with the rank's
//! small state (the next batch). The table is sized with a load factor of 4,
//! so most inserts collide and go through the overflow heap: the path with
//! the most RMA actions (003 counts 6 PUTs and 4 GETs for it) is exercised.
//!
//! The verification looks every key up with GETs (as a client would), scans
//! each local volume for duplicates, misplaced and unreachable entries, and
//! reduces a digest of the *set* of stored `(key, value, owner)` triples. The
//! winner of each slot's CAS race, and so the heap positions and chain order,
//! depend on thread timing; the digest does not, so the verification value is
//! bit-identical across protocols, failure schedules and runs.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::{AppParams, Verification, safe_point};
use crate::{Communicator, Ctx, Error, GetRequest, Rank, ReduceOp, Result, Window};

/// Keys per table slot of a class: > 1, so collisions are the common case
/// and the overflow heap of 003 §7.2.2 carries most of the entries.
const LOAD_FACTOR: usize = 4;

/// Extra heap cells beyond twice the mean per-owner load: small custom sizes
/// have a large relative spread of the load an owner receives.
const HEAP_SLACK: usize = 64;

/// Batches (safe points) when `--iterations` is not given.
const DEFAULT_BATCHES: u64 = 10;

/// The empty key (keys are generated nonzero).
const EMPTY: u64 = 0;

/// Size parameters of the DHT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// Hash table slots in each rank's local volume.
    pub table_slots: usize,
    /// Overflow heap cells in each rank's local volume.
    pub heap_cells: usize,
    /// Keys each rank inserts.
    pub keys_per_rank: usize,
    /// Insert batches, one safe point after each.
    pub batches: u64,
}

impl Params {
    /// Sizes from the command line: class S (1024 slots, 4096 keys per rank),
    /// W (16384, 65536) or A (131072, 524288), S by default. `--size`
    /// replaces the keys per rank (the table then keeps the load factor of 4)
    /// and `--iterations` the number of batches (default 10). The heap holds
    /// twice the mean number of keys an owner receives, plus 64 cells.
    pub fn from_app(p: &AppParams) -> Result<Params> {
        let class = p.class.unwrap_or('S');
        let (class_slots, class_keys) = match class.to_ascii_uppercase() {
            'S' => (1024, 4096),
            'W' => (16384, 65536),
            'A' => (131072, 524288),
            other => {
                return Err(Error::config(
                    "class",
                    format!("dht has no class `{other}` (classes: S, W, A)"),
                ));
            }
        };
        let (table_slots, keys_per_rank) = match p.size {
            None => (class_slots, class_keys),
            Some(0) => {
                return Err(Error::config(
                    "size",
                    "dht needs at least one key per rank (the size is the number of keys each rank inserts)",
                ));
            }
            Some(k) => (k.div_ceil(LOAD_FACTOR), k),
        };
        let batches = p.iterations.unwrap_or(DEFAULT_BATCHES);
        if batches == 0 {
            return Err(Error::config(
                "iterations",
                "dht needs at least one insert batch",
            ));
        }
        let heap_cells = keys_per_rank
            .checked_mul(2)
            .and_then(|h| h.checked_add(HEAP_SLACK))
            .ok_or_else(|| {
                Error::config(
                    "size",
                    format!("{keys_per_rank} keys per rank do not fit in memory"),
                )
            })?;
        let params = Params {
            table_slots,
            heap_cells,
            keys_per_rank,
            batches,
        };
        params.validate()?;
        Ok(params)
    }

    /// Check the sizes (they may have been set by hand rather than by
    /// [`Params::from_app`]).
    fn validate(&self) -> Result<Layout> {
        if self.table_slots == 0 {
            return Err(Error::config("size", "dht needs at least one table slot"));
        }
        if self.heap_cells == 0 {
            return Err(Error::config(
                "size",
                "dht needs at least one overflow heap cell",
            ));
        }
        if self.keys_per_rank == 0 {
            return Err(Error::config("size", "dht needs at least one key per rank"));
        }
        if self.batches == 0 {
            return Err(Error::config(
                "iterations",
                "dht needs at least one insert batch",
            ));
        }
        Layout::new(self.table_slots, self.heap_cells)
    }
}

/// Offsets of the parts of a local volume (see the module documentation).
#[derive(Debug, Clone, Copy)]
struct Layout {
    slots: usize,
    heap: usize,
}

impl Layout {
    fn new(slots: usize, heap: usize) -> Result<Layout> {
        let len = slots
            .checked_mul(3)
            .zip(heap.checked_mul(3))
            .and_then(|(a, b)| a.checked_add(b))
            .and_then(|n| n.checked_add(1))
            .and_then(|n| n.checked_mul(std::mem::size_of::<u64>()));
        match len {
            Some(_) => Ok(Layout { slots, heap }),
            None => Err(Error::config(
                "size",
                format!("a local volume of {slots} slots and {heap} heap cells is too large"),
            )),
        }
    }
    fn key(&self, slot: usize) -> usize {
        slot
    }
    fn val(&self, slot: usize) -> usize {
        self.slots + slot
    }
    fn head(&self, slot: usize) -> usize {
        2 * self.slots + slot
    }
    fn hkey(&self, cell: usize) -> usize {
        3 * self.slots + cell
    }
    fn hval(&self, cell: usize) -> usize {
        3 * self.slots + self.heap + cell
    }
    fn hnext(&self, cell: usize) -> usize {
        3 * self.slots + 2 * self.heap + cell
    }
    fn counter(&self) -> usize {
        3 * self.slots + 3 * self.heap
    }
    fn len(&self) -> usize {
        self.counter() + 1
    }
}

/// splitmix64's finalizer: a bijection of `u64` with `f(0) = 0`, so distinct
/// nonzero inputs give distinct nonzero outputs.
fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// MurmurHash3's finalizer, a second mixer independent of the one that made
/// the keys, for placement.
fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Key `i` of `rank`: the inputs `rank * keys_per_rank + i + 1` are distinct
/// and nonzero (the caller checks they fit in `u64`), and [`splitmix`] is a
/// bijection fixing 0, so keys are distinct across the job and never the
/// empty key.
fn key_of(rank: Rank, i: usize, keys_per_rank: usize) -> u64 {
    splitmix(rank as u64 * keys_per_rank as u64 + i as u64 + 1)
}

/// The value stored with `key` (deterministic, so lookups can check it).
fn value_of(key: u64) -> u64 {
    key.rotate_left(17) ^ 0xa076_1d64_78bd_642f
}

/// Owner rank and table slot of `key`: owner from the high bits of the hash
/// (multiply-shift), slot from the whole hash modulo the table size.
fn place(key: u64, ranks: usize, slots: usize) -> (Rank, usize) {
    let h = fmix(key);
    let owner = ((u128::from(h) * ranks as u128) >> 64) as usize;
    let slot = (h % slots as u64) as usize;
    (owner, slot)
}

/// The digest term of one stored entry: depends on the triple only, so the
/// wrapping sum over a volume is independent of slot races and heap order.
fn entry_digest(key: u64, value: u64, owner: Rank) -> u64 {
    splitmix(key ^ splitmix(value ^ (owner as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
}

/// The keys of batch `b` of `batches` (contiguous, covering `0..keys`).
fn batch_range(b: u64, batches: u64, keys: usize) -> Range<usize> {
    let at = |b: u64| (u128::from(b) * keys as u128 / u128::from(batches.max(1))) as usize;
    at(b)..at(b + 1)
}

/// The protected state of a rank. The table itself is window memory, which
/// the runtime checkpoints and restores on its own.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct State {
    /// The batch to insert next.
    next_batch: u64,
    /// Keys this rank has inserted (checked at the end: every key exactly once
    /// across restarts).
    inserted: u64,
}

/// GET of one element.
fn get1(win: &Window<u64>, target: Rank, offset: usize) -> Result<u64> {
    win.get(target, offset, 1)?.first().copied().ok_or_else(|| {
        Error::app(format!(
            "GET of cell {offset} of rank {target} returned nothing"
        ))
    })
}

/// A request-based GET of the slot key `key` will land in, issued while the
/// key before it is inserted (the batch's inner loop overlaps one round trip
/// with the next).
struct Prefetch {
    key: u64,
    slot_key: GetRequest<u64>,
}

impl Prefetch {
    fn issue(win: &Window<u64>, lay: &Layout, ranks: usize, key: u64) -> Result<Self> {
        let (owner, slot) = place(key, ranks, lay.slots);
        Ok(Prefetch {
            key,
            slot_key: win.immediate_get(owner, lay.key(slot), 1)?,
        })
    }
}

/// Insert `key` (003 §7.2.2). Returns whether it collided. Must run inside an
/// access epoch to the owner (the batch's `lock_all`). `seen`: the slot's key
/// as a prefetch read it: a slot once taken stays taken (keys are never
/// removed), so a key seen there sends the insert straight to the overflow
/// heap; EMPTY is only a hint, the claim below decides.
fn insert(win: &Window<u64>, lay: &Layout, ranks: usize, key: u64, seen: u64) -> Result<bool> {
    let (owner, slot) = place(key, ranks, lay.slots);
    let value = value_of(key);
    // Claim the slot atomically: of all origins racing for it exactly one sees
    // EMPTY. Readers only look after the batch's unlock_all and barrier, so the
    // value may follow with a plain PUT.
    if seen == EMPTY {
        let prev = win.compare_and_swap(owner, lay.key(slot), EMPTY, key)?;
        if prev == EMPTY {
            win.put(owner, lay.val(slot), &[value])?;
            return Ok(false);
        }
    }
    // Collision: take the next free heap cell with Fetch-And-Op.
    let taken = win.fetch_and_op(owner, lay.counter(), 1, ReduceOp::Sum)?;
    let cell = usize::try_from(taken)
        .ok()
        .filter(|&c| c < lay.heap)
        .ok_or_else(|| {
            Error::app(format!(
                "the overflow heap of rank {owner} is full ({} cells): too many collisions",
                lay.heap
            ))
        })?;
    win.put(owner, lay.hkey(cell), &[key])?;
    win.put(owner, lay.hval(cell), &[value])?;
    // Link the cell at the head of the slot's chain ("atomically updates the
    // pointer to the last element"): a CAS loop, since other origins may link
    // theirs concurrently. A failed CAS returns the current head, so the retry
    // needs no extra read.
    let link = taken + 1;
    let mut head = win.fetch_and_op(owner, lay.head(slot), 0, ReduceOp::NoOp)?;
    loop {
        win.put(owner, lay.hnext(cell), &[head])?;
        // MPI orders neither PUTs among themselves nor a PUT before a CAS to
        // another location: the flush completes the cell (key, value, next)
        // before the CAS publishes it, so whoever reaches the cell through the
        // chain sees it whole ("memory consistency is ensured with flushes").
        win.flush(owner)?;
        let seen = win.compare_and_swap(owner, lay.head(slot), head, link)?;
        if seen == head {
            return Ok(true);
        }
        head = seen;
    }
}

/// The one element a GET of one element returned.
fn first(v: Vec<u64>, key: u64) -> Result<u64> {
    v.first()
        .copied()
        .ok_or_else(|| Error::app(format!("the prefetch of key {key}'s slot returned nothing")))
}

/// Every owner must be able to absorb its collisions: an owner receiving
/// `load` keys has at most `load - 1` of them collide. The keys are fixed, so
/// the loads are known before inserting; checking them here turns a heap too
/// small for this number of ranks into a clear configuration error instead of
/// a failure halfway through (collective).
fn check_heap(world: &Communicator, p: &Params, rank: Rank, ranks: usize) -> Result<()> {
    let mut mine = vec![0u64; ranks];
    for i in 0..p.keys_per_rank {
        let (owner, _) = place(key_of(rank, i, p.keys_per_rank), ranks, p.table_slots);
        mine[owner] += 1;
    }
    let mut load = vec![0u64; ranks];
    world.all_reduce_into(&mine, &mut load, ReduceOp::Sum)?;
    let (worst, max) = load
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|&(r, l)| (l, std::cmp::Reverse(r)))
        .unwrap_or((0, 0));
    if max.saturating_sub(1) > p.heap_cells as u64 {
        return Err(Error::config(
            "size",
            format!(
                "rank {worst} would receive {max} keys but its overflow heap has {} cells",
                p.heap_cells
            ),
        ));
    }
    Ok(())
}

/// Outcome of looking one key up.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Lookup {
    /// Entries holding the key (table and chain).
    copies: u64,
    /// Of those, entries with a wrong value.
    wrong: u64,
    /// The chain was broken (cell out of range, or a cycle).
    corrupt: bool,
}

/// Look `key` up with GETs, as a client would: the table slot, then the whole
/// chain (to the end, so duplicates are seen too). Inside an access epoch.
fn lookup(win: &Window<u64>, lay: &Layout, ranks: usize, key: u64) -> Result<Lookup> {
    let (owner, slot) = place(key, ranks, lay.slots);
    let value = value_of(key);
    let mut out = Lookup::default();
    if get1(win, owner, lay.key(slot))? == key {
        out.copies += 1;
        if get1(win, owner, lay.val(slot))? != value {
            out.wrong += 1;
        }
    }
    let mut link = get1(win, owner, lay.head(slot))?;
    let mut steps = 0usize;
    while link != 0 {
        let cell = match usize::try_from(link - 1) {
            Ok(c) if c < lay.heap && steps < lay.heap => c,
            _ => {
                out.corrupt = true;
                break;
            }
        };
        if get1(win, owner, lay.hkey(cell))? == key {
            out.copies += 1;
            if get1(win, owner, lay.hval(cell))? != value {
                out.wrong += 1;
            }
        }
        link = get1(win, owner, lay.hnext(cell))?;
        steps += 1;
    }
    Ok(out)
}

/// What a rank finds in its own local volume.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct VolumeScan {
    /// Entries stored (nonzero table keys and used heap cells with a key).
    stored: u64,
    /// Heap cells taken (collisions resolved here).
    heap_used: u64,
    /// Entries whose key appears more than once in the volume.
    duplicates: u64,
    /// Entries in a volume or slot their key does not hash to.
    misplaced: u64,
    /// Used heap cells no chain reaches, plus broken links.
    unreachable: u64,
    /// Wrapping sum of [`entry_digest`] over the entries.
    digest: u64,
}

/// Scan a local volume (this rank's window memory).
fn scan_volume(mem: &[u64], lay: &Layout, rank: Rank, ranks: usize) -> Result<VolumeScan> {
    if mem.len() != lay.len() {
        return Err(Error::app(format!(
            "local volume of rank {rank} has {} cells, expected {}",
            mem.len(),
            lay.len()
        )));
    }
    let mut scan = VolumeScan::default();
    let counter = mem[lay.counter()];
    let used = usize::try_from(counter).map_or(lay.heap, |c| c.min(lay.heap));
    scan.heap_used = used as u64;
    if counter > lay.heap as u64 {
        // An insert found the heap full (and failed); count the excess as
        // unreachable so the run cannot verify.
        scan.unreachable += counter - lay.heap as u64;
    }
    let mut keys = Vec::with_capacity(lay.slots + used);
    let mut add = |scan: &mut VolumeScan, key: u64, value: u64, slot: usize| {
        scan.stored += 1;
        scan.digest = scan.digest.wrapping_add(entry_digest(key, value, rank));
        if place(key, ranks, lay.slots) != (rank, slot) {
            scan.misplaced += 1;
        }
        keys.push(key);
    };
    let mut reached = vec![false; used];
    for slot in 0..lay.slots {
        let key = mem[lay.key(slot)];
        if key != EMPTY {
            add(&mut scan, key, mem[lay.val(slot)], slot);
        }
        // The chain holds the slot's overflow entries, newest first.
        let mut link = mem[lay.head(slot)];
        while link != 0 {
            let cell = match usize::try_from(link - 1) {
                Ok(c) if c < used && !reached[c] => c,
                _ => {
                    scan.unreachable += 1; // out of range or a cycle
                    break;
                }
            };
            reached[cell] = true;
            add(&mut scan, mem[lay.hkey(cell)], mem[lay.hval(cell)], slot);
            link = mem[lay.hnext(cell)];
        }
    }
    // Cells taken but never linked (an insert interrupted between the two)
    // would be lost entries; a rollback must leave none.
    scan.unreachable += reached.iter().filter(|r| !**r).count() as u64;
    keys.sort_unstable();
    scan.duplicates = keys.windows(2).filter(|w| w[0] == w[1]).count() as u64;
    Ok(scan)
}

// Indices of the per-rank verification numbers, in the order they are
// reduced.
const FOUND: usize = 0;
const MISSING: usize = 1;
const DUPLICATED: usize = 2;
const WRONG: usize = 3;
const CORRUPT: usize = 4;
const STORED: usize = 5;
const HEAP_USED: usize = 6;
const VOLUME_DUPS: usize = 7;
const MISPLACED: usize = 8;
const UNREACHABLE: usize = 9;
const NOT_INSERTED: usize = 10;
const DIGEST: usize = 11;
const NUMBERS: usize = 12;

/// Names of the per-rank problems, for the detail of a failed verification.
const PROBLEMS: [(usize, &str); 8] = [
    (MISSING, "keys missing"),
    (DUPLICATED, "keys found more than once"),
    (WRONG, "wrong values"),
    (CORRUPT, "broken chains on lookup"),
    (VOLUME_DUPS, "duplicate entries in its volume"),
    (MISPLACED, "misplaced entries in its volume"),
    (UNREACHABLE, "unreachable heap cells in its volume"),
    (NOT_INSERTED, "keys not inserted"),
];

/// Run the DHT on one rank: insert every batch, then verify (collective).
/// Every rank returns the same [`Verification`].
pub fn rank_main(ctx: &mut Ctx, p: &Params) -> Result<Verification> {
    let lay = p.validate()?;
    let world = ctx.world();
    let rank = ctx.rank();
    let ranks = ctx.size();
    if (ranks as u64).checked_mul(p.keys_per_rank as u64).is_none() {
        return Err(Error::config(
            "size",
            "ranks × keys per rank overflows 64 bits",
        ));
    }
    let mut state: State = ctx.restore_or_else(|| State {
        next_batch: 0,
        inserted: 0,
    })?;
    // Checked when the job starts; a restored rank skips it (under message
    // logging it re-executes alone and nobody would join the reduction).
    if ctx.restored_generation().is_none() {
        check_heap(&world, p, rank, ranks)?;
    }
    // Re-allocated in the same order after a rollback, the window comes back
    // with its checkpointed contents.
    let win = world.allocate_window::<u64>(lay.len())?;

    while state.next_batch < p.batches {
        let keys = batch_range(state.next_batch, p.batches, p.keys_per_rank);
        let n = keys.len() as u64;
        win.lock_all()?;
        let key = |i: usize| key_of(rank, i, p.keys_per_rank);
        let mut next = match keys.clone().next() {
            Some(i) => Some(Prefetch::issue(&win, &lay, ranks, key(i))?),
            None => None,
        };
        for i in keys.clone() {
            let this = next.take();
            if i + 1 < keys.end {
                next = Some(Prefetch::issue(&win, &lay, ranks, key(i + 1))?);
            }
            let (k, seen) = match this {
                Some(f) => (f.key, first(f.slot_key.wait()?, f.key)?),
                None => (key(i), EMPTY),
            };
            insert(&win, &lay, ranks, k, seen)?;
        }
        // A safe point needs every epoch closed, and the barrier makes every
        // rank's inserts of this batch complete before anyone saves its
        // volume, so the checkpoint holds whole batches only.
        win.unlock_all()?;
        world.barrier()?;
        state.next_batch += 1;
        state.inserted += n;
        safe_point(ctx, &state, state.next_batch, p.batches)?;
    }

    let v = verify(&world, &win, p, &lay, state.inserted)?;
    win.free()?;
    Ok(v)
}

/// The verification (collective): look every own key up with GETs, scan the
/// own volume, reduce. Nothing may write any more (the last batch ended with
/// a barrier), so the local scan and remote GETs see the final table.
fn verify(
    world: &Communicator,
    win: &Window<u64>,
    p: &Params,
    lay: &Layout,
    inserted: u64,
) -> Result<Verification> {
    let rank = world.rank();
    let ranks = world.size();
    let expected = (ranks as u64)
        .checked_mul(p.keys_per_rank as u64)
        .ok_or_else(|| Error::config("size", "ranks × keys per rank overflows 64 bits"))?;
    let scan = win.with_local(|m| scan_volume(m, lay, rank, ranks))??;
    let mut mine = [0u64; NUMBERS];
    win.lock_all()?;
    for i in 0..p.keys_per_rank {
        let l = lookup(win, lay, ranks, key_of(rank, i, p.keys_per_rank))?;
        match l.copies {
            0 => mine[MISSING] += 1,
            1 if l.wrong == 0 && !l.corrupt => mine[FOUND] += 1,
            1 => {}
            _ => mine[DUPLICATED] += 1,
        }
        mine[WRONG] += l.wrong;
        mine[CORRUPT] += u64::from(l.corrupt);
    }
    win.unlock_all()?;
    mine[STORED] = scan.stored;
    mine[HEAP_USED] = scan.heap_used;
    mine[VOLUME_DUPS] = scan.duplicates;
    mine[MISPLACED] = scan.misplaced;
    mine[UNREACHABLE] = scan.unreachable;
    mine[NOT_INSERTED] = (p.keys_per_rank as u64).abs_diff(inserted);
    mine[DIGEST] = scan.digest;
    let mut total = [0u64; NUMBERS];
    world.all_reduce_into(&mine, &mut total, ReduceOp::Sum)?;

    let problems: u64 = PROBLEMS.iter().map(|(i, _)| total[*i]).sum();
    let verified = problems == 0 && total[FOUND] == expected && total[STORED] == expected;
    let detail = if verified {
        format!(
            "all {expected} keys found once with their values in {ranks} local volumes \
             ({} slots + {} heap cells each); {} entries went to overflow heaps",
            p.table_slots, p.heap_cells, total[HEAP_USED]
        )
    } else {
        // Collective on every rank alike: the decision rests on reduced numbers.
        let all = world.all_gather(&mine)?;
        let mut lines = vec![format!(
            "{} of {expected} keys found once with their value; {} entries stored",
            total[FOUND], total[STORED]
        )];
        for (r, numbers) in all.chunks(NUMBERS).enumerate() {
            let bad: Vec<String> = PROBLEMS
                .iter()
                .filter(|(i, _)| numbers[*i] != 0)
                .map(|(i, what)| format!("{} {what}", numbers[*i]))
                .collect();
            if !bad.is_empty() {
                lines.push(format!("rank {r}: {}", bad.join(", ")));
            }
        }
        lines.join("; ")
    };
    Ok(Verification {
        value: format!(
            "{}/{} keys, digest {:016x}",
            total[FOUND], total[STORED], total[DIGEST]
        ),
        verified,
        detail,
        metrics: serde_json::json!({
            "keys": total[STORED],
            "collisions": total[HEAP_USED],
            "table_slots": p.table_slots,
            "heap_cells": p.heap_cells,
            "keys_per_rank": p.keys_per_rank,
            "ranks": ranks,
            "batches": p.batches,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, JobReport, ProtocolKind};

    fn small() -> Params {
        Params::from_app(&AppParams {
            size: Some(256),
            iterations: Some(4),
            ..AppParams::default()
        })
        .expect("valid sizes")
    }

    fn run(cfg: &Config, p: &Params) -> JobReport<Verification> {
        let p = p.clone();
        crate::run(cfg, move |ctx| rank_main(ctx, &p))
    }

    /// Every rank's verification, checked to be the same on all ranks.
    fn outcome(report: JobReport<Verification>) -> Verification {
        let all = report.outcome.expect("the job succeeds");
        assert_eq!(all.len(), 4);
        for v in &all[1..] {
            assert_eq!(v, &all[0], "ranks disagree");
        }
        all[0].clone()
    }

    fn collisions(v: &Verification) -> u64 {
        v.metrics["collisions"]
            .as_u64()
            .expect("collisions is a number")
    }

    #[test]
    fn classes_and_overrides() {
        let s = Params::from_app(&AppParams::default()).expect("class S");
        assert_eq!(
            s,
            Params {
                table_slots: 1024,
                heap_cells: 2 * 4096 + HEAP_SLACK,
                keys_per_rank: 4096,
                batches: 10
            }
        );
        let w = Params::from_app(&AppParams {
            class: Some('W'),
            ..AppParams::default()
        })
        .expect("class W");
        assert_eq!((w.table_slots, w.keys_per_rank), (16384, 65536));
        let a = Params::from_app(&AppParams {
            class: Some('A'),
            iterations: Some(3),
            ..AppParams::default()
        })
        .expect("class A");
        assert_eq!(
            (a.table_slots, a.keys_per_rank, a.batches),
            (131072, 524288, 3)
        );
        let p = small();
        assert_eq!((p.table_slots, p.keys_per_rank, p.batches), (64, 256, 4));
        assert!(p.heap_cells >= p.keys_per_rank);
    }

    #[test]
    fn bad_sizes_name_the_option() {
        let e = Params::from_app(&AppParams {
            class: Some('B'),
            ..AppParams::default()
        })
        .expect_err("no class B");
        assert!(matches!(&e, Error::Config { option, detail }
            if option == "class" && detail.contains("S, W, A")));
        let e = Params::from_app(&AppParams {
            size: Some(0),
            ..AppParams::default()
        })
        .expect_err("zero keys");
        assert!(matches!(&e, Error::Config { option, .. } if option == "size"));
        let e = Params::from_app(&AppParams {
            iterations: Some(0),
            ..AppParams::default()
        })
        .expect_err("zero batches");
        assert!(matches!(&e, Error::Config { option, .. } if option == "iterations"));
        let zero_slots = Params {
            table_slots: 0,
            ..small()
        };
        assert!(matches!(zero_slots.validate(), Err(Error::Config { .. })));
    }

    #[test]
    fn keys_are_distinct_nonzero_and_batches_cover_them() {
        let mut keys: Vec<u64> = (0..4)
            .flat_map(|r| (0..1000).map(move |i| key_of(r, i, 1000)))
            .collect();
        assert!(keys.iter().all(|&k| k != EMPTY));
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), 4000);
        let covered: Vec<usize> = (0..7).flat_map(|b| batch_range(b, 7, 100)).collect();
        assert_eq!(covered, (0..100).collect::<Vec<_>>());
        // Placement spreads keys over every owner and slot range.
        let mut per_owner = [0usize; 4];
        for &k in &keys {
            let (o, s) = place(k, 4, 64);
            assert!(s < 64);
            per_owner[o] += 1;
        }
        assert!(
            per_owner.iter().all(|&n| (800..1200).contains(&n)),
            "{per_owner:?}"
        );
    }

    #[test]
    fn volume_scan_sees_set_not_order_and_finds_damage() {
        let lay = Layout::new(2, 4).expect("small layout");
        // Three keys that all belong to rank 0 of 1, slot by hash.
        let keys: Vec<u64> = (0..3).map(|i| key_of(0, i, 3)).collect();
        let build = |order: &[usize]| {
            let mut m = vec![0u64; lay.len()];
            for &i in order {
                let k = keys[i];
                let (_, s) = place(k, 1, lay.slots);
                if m[lay.key(s)] == EMPTY {
                    m[lay.key(s)] = k;
                    m[lay.val(s)] = value_of(k);
                } else {
                    let c = m[lay.counter()] as usize;
                    m[lay.counter()] += 1;
                    m[lay.hkey(c)] = k;
                    m[lay.hval(c)] = value_of(k);
                    m[lay.hnext(c)] = m[lay.head(s)];
                    m[lay.head(s)] = c as u64 + 1;
                }
            }
            m
        };
        let a = scan_volume(&build(&[0, 1, 2]), &lay, 0, 1).expect("scan");
        let b = scan_volume(&build(&[2, 1, 0]), &lay, 0, 1).expect("scan");
        assert_eq!(a.stored, 3);
        assert_eq!((a.duplicates, a.misplaced, a.unreachable), (0, 0, 0));
        assert_eq!(a.digest, b.digest, "digest depends on the set only");
        assert_eq!(a.heap_used, 3 - distinct_slots(&keys, &lay));
        // A changed value changes the digest.
        let mut m = build(&[0, 1, 2]);
        let (_, s) = place(keys[0], 1, lay.slots);
        m[lay.val(s)] ^= 1;
        let c = scan_volume(&m, &lay, 0, 1).expect("scan");
        assert_ne!(c.digest, a.digest);
        // A cell taken but never linked is reported.
        let mut m = build(&[0, 1, 2]);
        m[lay.counter()] += 1;
        let d = scan_volume(&m, &lay, 0, 1).expect("scan");
        assert_eq!(d.unreachable, 1);
        // The same key stored twice is reported.
        let mut m = build(&[0]);
        let (_, s) = place(keys[0], 1, lay.slots);
        m[lay.hkey(0)] = keys[0];
        m[lay.hval(0)] = value_of(keys[0]);
        m[lay.head(s)] = 1;
        m[lay.counter()] = 1;
        let e = scan_volume(&m, &lay, 0, 1).expect("scan");
        assert_eq!((e.stored, e.duplicates), (2, 1));
    }

    fn distinct_slots(keys: &[u64], lay: &Layout) -> u64 {
        let mut s: Vec<usize> = keys.iter().map(|&k| place(k, 1, lay.slots).1).collect();
        s.sort_unstable();
        s.dedup();
        s.len() as u64
    }

    #[test]
    fn inserts_verify_and_use_the_heap() {
        let p = small();
        let v = outcome(run(&Config::new(4), &p));
        assert!(v.verified, "{}", v.detail);
        let total = 4 * p.keys_per_rank as u64;
        assert!(
            v.value
                .starts_with(&format!("{total}/{total} keys, digest ")),
            "{}",
            v.value
        );
        assert_eq!(v.metrics["keys"].as_u64(), Some(total));
        // Load factor 4: most keys collide and live in overflow heaps.
        let c = collisions(&v);
        assert!(c > total / 2 && c < total, "collisions {c} of {total}");
        // The outcome, collisions included, does not depend on the races.
        let again = outcome(run(&Config::new(4), &p));
        assert_eq!(again.value, v.value);
        assert_eq!(collisions(&again), c);
    }

    #[test]
    fn rank_failure_under_coordinated_gives_the_same_table() {
        let p = small();
        let clean = outcome(run(&Config::new(4), &p));
        let cfg = Config::new(4)
            .protocol(ProtocolKind::Coordinated)
            .checkpoint_every(1)
            .kill("1@50%".parse().expect("valid kill"));
        let report = run(&cfg, &p);
        assert_eq!(report.stats.failures, 1, "{:?}", report.stats);
        assert!(report.stats.ranks_rolled_back > 0);
        let v = outcome(report);
        assert!(v.verified, "{}", v.detail);
        assert_eq!(v.value, clean.value);
        assert_eq!(collisions(&v), collisions(&clean));
    }

    #[test]
    fn node_failure_under_coordinated_gives_the_same_table() {
        let p = small();
        let clean = outcome(run(&Config::new(4), &p));
        let cfg = Config::new(4)
            .protocol(ProtocolKind::Coordinated)
            .nodes(2)
            .kill("node:1@30%".parse().expect("valid kill"));
        let report = run(&cfg, &p);
        assert_eq!(report.stats.failures, 1, "{:?}", report.stats);
        assert_eq!(report.stats.ranks_killed, 2);
        let v = outcome(report);
        assert!(v.verified, "{}", v.detail);
        assert_eq!(v.value, clean.value);
    }

    #[test]
    fn a_lost_entry_fails_verification_and_names_its_rank() {
        let p = small();
        let clean = outcome(run(&Config::new(4), &p));
        let q = p.clone();
        // Insert everything in one epoch, then drop one table entry of rank 2's
        // volume, as a broken rollback that lost a PUT would.
        let report = crate::run(&Config::new(4), move |ctx| {
            let lay = q.validate()?;
            let world = ctx.world();
            let (rank, ranks) = (ctx.rank(), ctx.size());
            let win = world.allocate_window::<u64>(lay.len())?;
            win.lock_all()?;
            for i in 0..q.keys_per_rank {
                insert(&win, &lay, ranks, key_of(rank, i, q.keys_per_rank), EMPTY)?;
            }
            win.unlock_all()?;
            world.barrier()?;
            let mut lost = EMPTY;
            if rank == 2 {
                lost = win.with_local_mut(|m| {
                    let slot = (0..lay.slots).find(|&s| m[lay.key(s)] != EMPTY);
                    slot.map_or(EMPTY, |s| std::mem::replace(&mut m[lay.key(s)], EMPTY))
                })?;
            }
            let lost = world.all_reduce(lost, ReduceOp::BitOr)?;
            world.barrier()?;
            let v = verify(&world, &win, &q, &lay, q.keys_per_rank as u64)?;
            Ok((v, lost))
        });
        let all = report.outcome.expect("the job succeeds");
        let (v, lost) = all[0].clone();
        assert!(all.iter().all(|(w, _)| w == &v), "ranks disagree");
        assert_ne!(lost, EMPTY);
        let (inserter, _) = (0..4)
            .flat_map(|r| (0..p.keys_per_rank).map(move |i| (r, i)))
            .find(|&(r, i)| key_of(r, i, p.keys_per_rank) == lost)
            .expect("the lost key is one of the job's");
        let total = 4 * p.keys_per_rank as u64;
        assert!(!v.verified);
        assert!(
            v.value
                .starts_with(&format!("{}/{} keys, ", total - 1, total - 1)),
            "{}",
            v.value
        );
        assert_ne!(v.value, clean.value);
        assert!(
            v.detail
                .contains(&format!("rank {inserter}: 1 keys missing")),
            "{}",
            v.detail
        );
    }

    #[test]
    fn a_heap_too_small_for_the_ranks_is_a_config_error() {
        let p = Params {
            heap_cells: 8,
            ..small()
        };
        let report = run(&Config::new(4), &p);
        assert!(
            matches!(&report.outcome, Err(e) if e.to_string().contains("overflow heap")),
            "{:?}",
            report.outcome
        );
    }

    /// Timing of classes S and W (release: `cargo test --release --lib
    /// apps::dht -- --ignored --nocapture`).
    #[test]
    #[ignore = "timing; run in release"]
    fn class_timings() {
        for class in ['S', 'W'] {
            let p = Params::from_app(&AppParams {
                class: Some(class),
                ..AppParams::default()
            })
            .expect("class");
            let t0 = std::time::Instant::now();
            let v = outcome(run(&Config::new(4), &p));
            let dt = t0.elapsed();
            assert!(v.verified, "{}", v.detail);
            eprintln!(
                "dht class {class}, 4 ranks: {:.3} s, {} keys, {} collisions, value {}",
                dt.as_secs_f64(),
                v.metrics["keys"],
                collisions(&v),
                v.value
            );
        }
    }
}
