//! Multi-level checkpoint storage: the schedule of levels a run keeps its
//! checkpoints in, as SCR and FTI schedule theirs.
//!
//! Levels (`--storage`, repeatable):
//!
//! | spec | level | survives |
//! | --- | --- | --- |
//! | `partner` | a copy on a rank of another node ([`super::partner`]) | one node |
//! | `xor`, `xor@N` | XOR parity over a group ([`super::erasure`]) | one member per group |
//! | `rs:M`, `rs:M@N` | Reed–Solomon, `M` parity shards per stripe (003 §5) | `M` members per group |
//! | `disk:DIR`, `disk:DIR@N` | piece files and commit records in `DIR` ([`super::disk`]) | the whole job |
//!
//! `@N` runs the level at every N-th generation only (default 1). Several
//! flags combine into one schedule, e.g. `--storage xor --storage
//! disk:DIR@5`: XOR every generation, disk every fifth.
//!
//! **Which in-memory level is on.** `partner` is the default: it is on when
//! it is named, and also when no in-memory level (`partner`, `xor`, `rs:M`)
//! is named at all, so `--storage disk:DIR` alone keeps the partner copy as
//! before. Naming `xor` or `rs:M` replaces the partner copy (that is their
//! point: parity costs `m/(k−m)` of a piece instead of a whole one); name
//! `partner` as well to keep both. At most one of `xor` and `rs:M`.
//!
//! Each level keeps its own newest generation: a level that runs every N-th
//! generation keeps the last one it wrote until a newer one of its own
//! commits, so a recovery can fall back to it when the newer generations'
//! pieces are lost. The recovery leader picks the newest committed
//! generation of which every piece is held somewhere or can be rebuilt.
//!
//! The disk level writes this rank's piece durably (write, fsync, rename)
//! before the piece counts as stored, so when the coordinated protocol's root
//! commits a generation every piece of it is on disk, and the root then writes
//! the generation's commit record there. Only a committed generation on disk
//! is ever read back: at a recovery (when the in-memory copies of a piece are
//! gone) and at a whole-job restart (`--restart DIR`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::codec::Code;
use super::erasure::{ErasureLevel, Groups};
use super::partner::PartnerStore;
use super::{CheckpointStore, Inventory, Piece, StoreEvent, StoreMsg, StoreOut, disk};
use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// One storage level of a schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LevelSpec {
    /// A copy on a partner rank in another failure domain.
    Partner,
    /// XOR parity over topology-aware groups (one loss per group).
    Xor {
        /// Encode every N-th generation.
        every: u64,
    },
    /// Reed–Solomon parity over topology-aware groups (003 §5).
    Rs {
        /// Parity shards per stripe `M`: losses tolerated per group.
        parity: usize,
        /// Encode every N-th generation.
        every: u64,
    },
    /// Pieces and commit records in `dir`, every `every`-th generation.
    Disk {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Write every N-th generation.
        every: u64,
    },
    /// Fault injection for tests, not a level: every parity shard that rank
    /// `rank`'s `xor`/`rs:M` level stores is damaged (one byte flipped after
    /// its CRC32C was computed), as silent memory corruption would. Only
    /// available through the library API, never parsed from `--storage`.
    CorruptParityAt {
        /// The rank whose parity shards are damaged.
        rank: Rank,
    },
    /// Fault injection for tests, not a level: every partner copy of
    /// another rank's piece that rank `rank` stores is damaged (one byte
    /// flipped after its CRC32C was computed), as silent memory corruption
    /// would. Only available through the library API.
    CorruptPartnerCopiesAt {
        /// The rank whose partner copies are damaged.
        rank: Rank,
    },
}

/// `rest` split at `@N` (N positive; 1 when absent).
fn split_every<'a>(spec: &str, rest: &'a str) -> Result<(&'a str, u64)> {
    match rest.rsplit_once('@') {
        Some((head, n)) => Ok((
            head,
            n.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
                Error::config("storage", format!("`{spec}`: @N must be a positive number"))
            })?,
        )),
        None => Ok((rest, 1)),
    }
}

const KNOWN: &str = "known: partner, xor[@N], rs:M[@N], disk:DIR[@N]";

impl FromStr for LevelSpec {
    type Err = Error;

    /// `partner`, `xor`, `xor@N`, `rs:M`, `rs:M@N`, `disk:DIR` or `disk:DIR@N`.
    fn from_str(s: &str) -> Result<Self> {
        if s == "partner" {
            return Ok(LevelSpec::Partner);
        }
        if let Some(rest) = s.strip_prefix("disk:") {
            let (dir, every) = split_every(s, rest)?;
            if dir.is_empty() {
                return Err(Error::config(
                    "storage",
                    format!("`{s}`: disk needs a directory"),
                ));
            }
            return Ok(LevelSpec::Disk {
                dir: PathBuf::from(dir),
                every,
            });
        }
        if let Some(rest) = s.strip_prefix("xor")
            && (rest.is_empty() || rest.starts_with('@'))
        {
            let (_, every) = split_every(s, rest)?;
            return Ok(LevelSpec::Xor { every });
        }
        if let Some(rest) = s.strip_prefix("rs:") {
            let (m, every) = split_every(s, rest)?;
            let parity = m.parse::<usize>().ok().filter(|&m| m > 0).ok_or_else(|| {
                Error::config(
                    "storage",
                    format!("`{s}`: rs:M needs a positive number of parity shards M"),
                )
            })?;
            return Ok(LevelSpec::Rs { parity, every });
        }
        Err(Error::config(
            "storage",
            format!("unknown storage level `{s}` ({KNOWN})"),
        ))
    }
}

impl fmt::Display for LevelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LevelSpec::Partner => f.write_str("partner"),
            LevelSpec::Xor { every } => write!(f, "xor@{every}"),
            LevelSpec::Rs { parity, every } => write!(f, "rs:{parity}@{every}"),
            LevelSpec::Disk { dir, every } => write!(f, "disk:{}@{every}", dir.display()),
            LevelSpec::CorruptParityAt { rank } => write!(f, "corrupt-parity-at:{rank}"),
            LevelSpec::CorruptPartnerCopiesAt { rank } => {
                write!(f, "corrupt-partner-copies-at:{rank}")
            }
        }
    }
}

impl LevelSpec {
    /// The erasure code and interval of an `xor` or `rs:M` level.
    fn erasure(&self) -> Option<(Code, u64)> {
        match *self {
            LevelSpec::Xor { every } => Some((Code::Xor, every)),
            LevelSpec::Rs { parity, every } => Some((Code::ReedSolomon { parity }, every)),
            _ => None,
        }
    }
}

/// Whether the partner level is on for this schedule (see the module
/// documentation).
pub fn partner_on(specs: &[LevelSpec]) -> bool {
    specs.contains(&LevelSpec::Partner) || !specs.iter().any(|s| s.erasure().is_some())
}

/// Check a schedule against the placement before any rank starts: at most one
/// erasure level, groups that the code can protect, fault-injection ranks in
/// range.
pub fn validate(specs: &[LevelSpec], placement: &Placement) -> Result<()> {
    let erasure: Vec<(Code, u64)> = specs.iter().filter_map(LevelSpec::erasure).collect();
    if erasure.len() > 1 {
        return Err(Error::config(
            "storage",
            "choose at most one of xor and rs:M",
        ));
    }
    if let Some(&(code, _)) = erasure.first() {
        Groups::new(placement, code)?;
    }
    let disks = specs
        .iter()
        .filter(|s| matches!(s, LevelSpec::Disk { .. }))
        .count();
    if disks > 1 {
        return Err(Error::config(
            "storage",
            "choose at most one disk level (use disk:DIR@N for a schedule)",
        ));
    }
    for s in specs {
        if let LevelSpec::CorruptParityAt { rank } | LevelSpec::CorruptPartnerCopiesAt { rank } = *s
            && rank >= placement.ranks()
        {
            return Err(Error::RankOutOfRange {
                rank,
                size: placement.ranks(),
            });
        }
    }
    Ok(())
}

#[derive(Debug)]
struct DiskLevel {
    dir: PathBuf,
    /// At a restart, the generation chosen before the ranks started: older
    /// ones are an earlier run's leftovers and are never offered.
    restart_from: Option<u64>,
    /// Write every N-th generation (`None`: read only, a restart source).
    every: Option<u64>,
}

impl DiskLevel {
    fn applies(&self, generation: u64) -> bool {
        self.every.is_some_and(|n| generation.is_multiple_of(n))
    }

    /// Whether this level may offer `generation` (a restart source offers
    /// its chosen generation and whatever this run committed after it).
    fn offers(&self, generation: u64) -> bool {
        self.restart_from.is_none_or(|r| generation >= r)
    }

    /// This rank's piece of the committed `generation`, checked in full
    /// against the commit record.
    fn read_own(&self, generation: u64, rank: Rank) -> Result<Piece> {
        if !self.offers(generation) {
            return Err(Error::Driver(format!(
                "generation {generation} in {} is older than the restart's",
                self.dir.display()
            )));
        }
        disk::read_committed_piece(&self.dir, generation, rank)
    }

    /// Committed generations on disk of which this rank's piece is intact
    /// and as its commit record lists it (read and checksummed: a corrupt
    /// piece must not be offered to a recovery, which would then fall back
    /// to an older generation), and one error per piece that is not.
    fn own_pieces(&self, rank: Rank) -> (Vec<u64>, Vec<Error>) {
        let generations = match disk::committed_generations(&self.dir) {
            Ok(g) => g,
            Err(e) => return (Vec::new(), vec![e]),
        };
        let mut intact = Vec::new();
        let mut damaged = Vec::new();
        for g in generations.into_iter().filter(|&g| self.offers(g)) {
            match self.read_own(g, rank) {
                Ok(_) => intact.push(g),
                Err(e) => damaged.push(e),
            }
        }
        (intact, damaged)
    }
}

/// The levels of one rank's schedule: a local store (with the partner copy
/// when that level is on), an optional `xor`/`rs:M` level and an optional
/// disk level.
#[derive(Debug)]
pub struct MultiLevel {
    rank: Rank,
    ranks: usize,
    /// This rank's own pieces, and the partner copies when `partner_on`.
    partner: PartnerStore,
    partner_on: bool,
    erasure: Option<ErasureLevel>,
    /// A schedule the placement cannot support (reported at the first put;
    /// `Config::validate` reports it before the job starts).
    invalid: Option<Error>,
    /// The disk level written to.
    disk: Option<DiskLevel>,
    /// A `--restart` directory other than the one written to: read only.
    restart_source: Option<DiskLevel>,
    /// The disk generations of which this rank's piece was found intact at
    /// the last scrub (the start of a recovery), so that the inventory does
    /// not read every piece again; `None` once a disk generation changed.
    disk_intact: Option<Vec<u64>>,
    /// Per generation: in-memory levels that have yet to report it stored.
    unstored: BTreeMap<u64, usize>,
}

impl MultiLevel {
    /// The store of `rank` for the levels `specs` (see the module
    /// documentation for which are on); `restart` is a checkpoint directory
    /// read at a whole-job restart (and written to as well when it is also a
    /// `disk` level).
    pub fn new(
        rank: Rank,
        placement: &Placement,
        specs: &[LevelSpec],
        restart: Option<(&Path, u64)>,
    ) -> Self {
        let disk = specs.iter().find_map(|s| match s {
            LevelSpec::Disk { dir, every } => Some(DiskLevel {
                dir: dir.clone(),
                every: Some(*every),
                restart_from: restart.filter(|(r, _)| *r == dir.as_path()).map(|(_, g)| g),
            }),
            _ => None,
        });
        // Restarting from one directory while writing to another: the
        // source is read, never written or pruned.
        let restart_source = restart
            .filter(|(r, _)| disk.as_ref().is_none_or(|d| d.dir.as_path() != *r))
            .map(|(dir, g)| DiskLevel {
                dir: dir.to_path_buf(),
                every: None,
                restart_from: Some(g),
            });
        let partner_on = partner_on(specs);
        let damage = specs.contains(&LevelSpec::CorruptParityAt { rank });
        let (erasure, invalid) = match specs.iter().find_map(LevelSpec::erasure) {
            Some((code, every)) => match ErasureLevel::new(rank, placement, code, every, damage) {
                Ok(level) => (Some(level), None),
                Err(e) => (None, Some(e)),
            },
            None => (None, None),
        };
        MultiLevel {
            rank,
            ranks: placement.ranks(),
            partner: if partner_on {
                PartnerStore::new(rank, placement)
                    .damaging_copies(specs.contains(&LevelSpec::CorruptPartnerCopiesAt { rank }))
            } else {
                PartnerStore::local(rank)
            },
            partner_on,
            erasure,
            invalid,
            disk,
            restart_source,
            disk_intact: None,
            unstored: BTreeMap::new(),
        }
    }

    /// Keep a second partner copy (message logging, see
    /// [`PartnerStore::with_second_copy`]).
    pub fn with_second_partner_copy(mut self) -> Self {
        if self.partner_on {
            self.partner = self.partner.with_second_copy();
        }
        self
    }

    /// The disk directory, if a disk level is configured.
    pub fn disk_dir(&self) -> Option<&Path> {
        self.disk.as_ref().map(|d| d.dir.as_path())
    }

    /// The `xor`/`rs:M` level, if configured.
    pub fn erasure(&self) -> Option<&ErasureLevel> {
        self.erasure.as_ref()
    }

    /// The erasure level if it encodes `generation`.
    fn erasure_for(&mut self, generation: u64) -> Option<&mut ErasureLevel> {
        self.erasure.as_mut().filter(|e| e.applies(generation))
    }

    /// This rank's own piece of `generation` from any level (memory first).
    fn own_piece(&self, generation: u64) -> Option<Piece> {
        self.partner
            .get(generation, self.rank)
            .or_else(|| self.erasure.as_ref()?.own_piece(generation))
            .cloned()
            .or_else(|| {
                self.disk_levels()
                    .find_map(|d| d.read_own(generation, self.rank).ok())
            })
    }

    /// The disk levels read from: the one written to, then a restart
    /// source in another directory.
    fn disk_levels(&self) -> impl Iterator<Item = &DiskLevel> {
        self.disk.iter().chain(&self.restart_source)
    }

    /// Disk generations of which this rank's piece is intact, from the last
    /// scrub if nothing changed since.
    fn disk_generations(&self) -> Vec<u64> {
        match &self.disk_intact {
            Some(g) => g.clone(),
            None => self.scan_disk().0,
        }
    }

    /// Disk generations of which this rank's piece is intact, over every
    /// disk level, and one error per damaged piece.
    fn scan_disk(&self) -> (Vec<u64>, Vec<Error>) {
        let mut intact = Vec::new();
        let mut damaged = Vec::new();
        for d in self.disk_levels() {
            let (good, bad) = d.own_pieces(self.rank);
            intact.extend(good);
            damaged.extend(bad);
        }
        intact.sort_unstable();
        intact.dedup();
        (intact, damaged)
    }

    /// Give the erasure level this rank's own piece of `generation` if it
    /// lacks it (restored from another level), before it serves a rebuild or
    /// re-encodes.
    fn share_own(&mut self, generation: u64) {
        if self
            .erasure
            .as_ref()
            .is_some_and(|e| e.applies(generation) && e.own_piece(generation).is_none())
            && let Some(piece) = self.own_piece(generation)
            && let Some(e) = self.erasure.as_mut()
        {
            e.adopt(piece);
        }
    }

    /// Expect `Stored` of `generation` from each in-memory level it applies to.
    fn expect_stored(&mut self, generation: u64) {
        let levels = 1 + usize::from(self.erasure_for(generation).is_some());
        self.unstored.insert(generation, levels);
    }

    /// Pass a level's output on, reporting `Stored` once every level did.
    fn join(&mut self, sub: StoreOut, out: &mut StoreOut) {
        out.sends.extend(sub.sends);
        for ev in sub.events {
            match ev {
                StoreEvent::Stored { generation } => {
                    if let Some(left) = self.unstored.get_mut(&generation) {
                        *left = left.saturating_sub(1);
                        if *left == 0 {
                            self.unstored.remove(&generation);
                            out.events.push(ev);
                        }
                    }
                }
                StoreEvent::Restored { .. } | StoreEvent::FetchFailed { .. } => out.events.push(ev),
            }
        }
    }
}

impl CheckpointStore for MultiLevel {
    fn name(&self) -> &'static str {
        let code = self.erasure.as_ref().map(ErasureLevel::code);
        match (self.partner_on, code, self.disk.is_some()) {
            (true, None, false) => "partner",
            (true, None, true) => "partner+disk",
            (true, Some(Code::Xor), false) => "partner+xor",
            (true, Some(Code::Xor), true) => "partner+xor+disk",
            (true, Some(_), false) => "partner+rs",
            (true, Some(_), true) => "partner+rs+disk",
            (false, Some(Code::Xor), false) => "xor",
            (false, Some(Code::Xor), true) => "xor+disk",
            (false, _, false) => "rs",
            (false, _, true) => "rs+disk",
        }
    }

    fn put(&mut self, piece: Piece, out: &mut StoreOut) -> Result<()> {
        if let Some(e) = &self.invalid {
            return Err(e.clone());
        }
        let generation = piece.generation;
        if let Some(d) = &self.disk
            && d.applies(generation)
        {
            // Durable before the piece counts as stored: the commit record
            // is written only after every rank reported stored.
            disk::write_piece(&d.dir, &piece)?;
            self.disk_intact = None;
        }
        self.expect_stored(generation);
        let mut sub = StoreOut::default();
        if let Some(e) = self.erasure_for(generation) {
            e.put(piece.clone(), &mut sub)?;
        }
        self.partner.put(piece, &mut sub)?;
        self.join(sub, out);
        Ok(())
    }

    fn on_msg(&mut self, src: Rank, msg: StoreMsg, out: &mut StoreOut) -> Result<()> {
        let mut sub = StoreOut::default();
        match msg {
            StoreMsg::Erasure(m) => {
                let m = *m;
                if let super::erasure::ErasureMsg::RebuildRequest { generation } = m {
                    self.share_own(generation);
                }
                let Some(e) = self.erasure.as_mut() else {
                    return Err(Error::config(
                        "storage",
                        format!(
                            "rank {src} sent an xor/rs message, but no such level is configured here"
                        ),
                    ));
                };
                e.on_msg(src, m, &mut sub)?;
            }
            other => self.partner.on_msg(src, other, &mut sub)?,
        }
        self.join(sub, out);
        Ok(())
    }

    fn fetch(&mut self, generation: u64, holder: Rank, out: &mut StoreOut) -> Result<()> {
        if self.partner.get(generation, self.rank).is_none() {
            if let Some(piece) = self.own_piece(generation) {
                self.partner.adopt(piece);
                out.events.push(StoreEvent::Restored { generation });
                return Ok(());
            }
            if holder == self.rank {
                // Reported held (a disk piece) but unreadable now: asking
                // ourselves would wait for ever.
                let why = self
                    .disk_levels()
                    .find_map(|d| d.read_own(generation, self.rank).err())
                    .map_or_else(
                        || "no level holds it any more".to_string(),
                        |e| e.to_string(),
                    );
                return Err(Error::CorruptCheckpoint {
                    owner: self.rank,
                    generation,
                    detail: format!("this rank's own piece cannot be read back: {why}"),
                });
            }
        }
        self.partner.fetch(generation, holder, out)
    }

    fn replicate(&mut self, generation: u64, out: &mut StoreOut) -> Result<()> {
        // A rebuilt piece lives in the erasure level only so far.
        if self.partner.get(generation, self.rank).is_none()
            && let Some(piece) = self.own_piece(generation)
        {
            self.partner.adopt(piece);
        }
        self.share_own(generation);
        self.expect_stored(generation);
        let mut sub = StoreOut::default();
        if let Some(e) = self.erasure_for(generation) {
            e.replicate(generation, &mut sub)?;
        }
        self.partner.replicate(generation, &mut sub)?;
        self.join(sub, out);
        Ok(())
    }

    fn commit(&mut self, generation: u64) -> Result<()> {
        self.partner.commit(generation)?;
        if let Some(e) = self.erasure.as_mut() {
            e.commit(generation);
        }
        self.unstored.retain(|&g, _| g >= generation);
        if self.rank == 0
            && let Some(d) = &self.disk
            && d.applies(generation)
        {
            self.disk_intact = None;
            // A recovery decision commits the generation it restores: a
            // valid record of it is this timeline's (newer ones were
            // removed at the decision) and stays. A generation the disk
            // cannot commit (a damaged or missing piece file) is not a
            // reason to stop the job, which the in-memory levels protect;
            // only a whole-job restart loses it, so say so.
            let done = disk::is_committed(&d.dir, generation)
                || disk::commit_from_headers(&d.dir, generation, self.ranks)
                    .map_err(|e| {
                        tracing::warn!(
                            generation,
                            dir = %d.dir.display(),
                            "lazarus: generation {generation} is not committed in {} (a \
                             whole-job restart cannot use it): {e}",
                            d.dir.display()
                        );
                    })
                    .is_ok();
            if done {
                disk::retain(&d.dir, 2)?;
            }
        }
        Ok(())
    }

    fn committed(&self) -> Option<u64> {
        let on_disk = self.disk_generations().into_iter().max();
        self.partner.committed().max(on_disk)
    }

    fn held(&self) -> Vec<(u64, Rank)> {
        let mut held = self.partner.held();
        let erasure = self
            .erasure
            .iter()
            .flat_map(|e| e.own_generations())
            .collect::<Vec<_>>();
        for g in erasure.into_iter().chain(self.disk_generations()) {
            if !held.contains(&(g, self.rank)) {
                held.push((g, self.rank));
            }
        }
        held
    }

    fn get(&self, generation: u64, owner: Rank) -> Option<&Piece> {
        self.partner.get(generation, owner).or_else(|| {
            (owner == self.rank)
                .then(|| self.erasure.as_ref()?.own_piece(generation))
                .flatten()
        })
    }

    fn retain_only(&mut self, keep: Option<u64>) -> Result<()> {
        self.partner.retain_only(keep)?;
        if let Some(e) = self.erasure.as_mut() {
            e.retain_only(keep);
        }
        self.unstored.clear();
        // Generations on disk newer than the one the recovery restores
        // belong to the abandoned execution: the re-execution writes new
        // ones with the same numbers, which must not mix with them, and
        // pruning (newest two kept) must not prefer them. The restart
        // source in another directory is the user's and is left alone.
        if self.rank == 0
            && let Some(d) = &self.disk
        {
            self.disk_intact = None;
            disk::remove_newer_than(&d.dir, keep.unwrap_or(0))?;
        }
        Ok(())
    }

    fn discard(&mut self, generation: u64) {
        self.partner.discard(generation);
        if let Some(e) = self.erasure.as_mut() {
            e.discard(generation);
        }
        self.unstored.remove(&generation);
    }

    fn retain_owner(&mut self, owner: Rank, keep: u64) {
        self.partner.retain_owner(owner, keep);
        if owner == self.rank {
            self.unstored.retain(|&g, _| g >= keep);
        }
    }

    fn abort_transfers(&mut self) {
        self.partner.abort_transfers();
        if let Some(e) = self.erasure.as_mut() {
            e.abort_transfers();
        }
        self.unstored.clear();
    }

    fn bytes_held(&self) -> usize {
        self.partner.bytes_held() + self.erasure.as_ref().map_or(0, ErasureLevel::bytes_held)
    }

    fn parity_held(&self) -> Vec<(u64, usize)> {
        self.erasure
            .as_ref()
            .map_or_else(Vec::new, ErasureLevel::parity_held)
    }

    fn can_rebuild(&self, generation: u64, owner: Rank, inv: &Inventory) -> bool {
        self.erasure
            .as_ref()
            .is_some_and(|e| e.can_rebuild(generation, owner, inv))
    }

    fn redundancy_lost(&self, generation: u64, owner: Rank, inv: &Inventory) -> bool {
        (self.partner_on && self.partner.redundancy_lost(generation, owner, inv))
            || self
                .erasure
                .as_ref()
                .is_some_and(|e| e.redundancy_lost(generation, owner, inv))
    }

    fn rebuild(&mut self, generation: u64, out: &mut StoreOut) -> Result<()> {
        match self.erasure.as_mut() {
            Some(e) => e.rebuild(generation, out),
            None => Err(Error::config(
                "storage",
                format!("no xor/rs level to rebuild generation {generation} from"),
            )),
        }
    }

    fn scrub(&mut self) -> Vec<Error> {
        let mut errors = self.partner.scrub();
        if let Some(e) = self.erasure.as_mut() {
            errors.extend(e.scrub());
        }
        let (intact, damaged) = self.scan_disk();
        errors.extend(damaged);
        self.disk_intact = Some(intact);
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn parses_levels() {
        assert_eq!(
            "partner".parse::<LevelSpec>().expect("valid"),
            LevelSpec::Partner
        );
        assert_eq!(
            "disk:/tmp/x@5".parse::<LevelSpec>().expect("valid"),
            LevelSpec::Disk {
                dir: PathBuf::from("/tmp/x"),
                every: 5
            }
        );
        assert_eq!(
            "disk:ckpt".parse::<LevelSpec>().expect("valid"),
            LevelSpec::Disk {
                dir: PathBuf::from("ckpt"),
                every: 1
            }
        );
        for (spec, level) in [
            ("xor", LevelSpec::Xor { every: 1 }),
            ("xor@3", LevelSpec::Xor { every: 3 }),
            (
                "rs:2",
                LevelSpec::Rs {
                    parity: 2,
                    every: 1,
                },
            ),
            (
                "rs:3@4",
                LevelSpec::Rs {
                    parity: 3,
                    every: 4,
                },
            ),
        ] {
            assert_eq!(spec.parse::<LevelSpec>().expect(spec), level);
            // Display spells it back in a form that parses to the same level.
            assert_eq!(level.to_string().parse::<LevelSpec>().expect(spec), level);
        }
        for bad in [
            "disk:",
            "disk:x@0",
            "tape",
            "xor@0",
            "xor:2",
            "xorx",
            "rs:",
            "rs:0",
            "rs:x",
            "rs:2@",
            "corrupt-parity-at:1",
        ] {
            let e = bad.parse::<LevelSpec>().expect_err(bad);
            assert!(e.to_string().contains("`storage`"), "{e}");
        }
    }

    fn put(store: &mut MultiLevel, generation: u64, data: &[u8]) {
        let piece = Piece::new(generation, store.rank, Bytes::copy_from_slice(data));
        store.put(piece, &mut StoreOut::default()).expect("stored");
    }

    /// The disk level at a recovery: damage is reported and not offered, a
    /// damaged piece does not stop the commit of a generation memory holds,
    /// the abandoned execution's newer generations are removed, and a piece
    /// rewritten after its commit is refused.
    #[test]
    fn disk_level_at_a_recovery() {
        let dir = std::env::temp_dir().join(format!(
            "lazarus-levels-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let pl = Placement::block(2, 2).expect("valid");
        let specs = [LevelSpec::Disk {
            dir: dir.clone(),
            every: 1,
        }];
        let mut stores: Vec<MultiLevel> = (0..2)
            .map(|r| MultiLevel::new(r, &pl, &specs, None))
            .collect();
        for g in 1..=3 {
            for s in &mut stores {
                put(s, g, format!("rank {} gen {g}", s.rank).as_bytes());
            }
            stores[0].commit(g).expect("committed");
        }
        // Generation 3 is abandoned by a failure (its commit record is
        // there; say the recovery found another piece of it lost).
        let piece = disk::piece_path(&dir, 2, 1);
        let len = std::fs::metadata(&piece).expect("piece").len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&piece)
            .and_then(|f| f.set_len(len - 3))
            .expect("truncated");
        let errors = stores[1].scrub();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].to_string().contains(&piece.display().to_string()),
            "names the file: {}",
            errors[0]
        );
        // (Pruning keeps the newest two committed generations.)
        assert_eq!(stores[1].disk_generations(), vec![3]);
        assert!(stores[0].scrub().is_empty());
        assert_eq!(stores[0].disk_generations(), vec![2, 3]);
        // The decision restores generation 2 (memory holds it whole): the
        // truncated file does not stop its commit, and generation 3 goes.
        stores[0].retain_only(Some(2)).expect("retained");
        stores[0]
            .commit(2)
            .expect("a damaged disk piece is not fatal");
        assert_eq!(disk::committed_generations(&dir).expect("listed"), vec![2]);
        // The re-execution writes generation 3 again: rank 1 first. Its
        // new piece is not the committed one of the abandoned execution.
        put(&mut stores[1], 3, b"re-executed");
        assert!(!disk::is_committed(&dir, 3));
        assert!(stores[1].disk_generations().is_empty());
        // A piece replaced after its commit record is refused by name.
        assert_eq!(stores[0].disk_generations(), vec![2]);
        put(&mut stores[0], 2, b"rewritten");
        let e = disk::read_committed_piece(&dir, 2, 0).expect_err("replaced");
        assert!(e.to_string().contains("the commit record lists"), "{e}");
        assert!(stores[0].disk_generations().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn partner_is_on_unless_replaced() {
        let disk = LevelSpec::Disk {
            dir: PathBuf::from("d"),
            every: 2,
        };
        let xor = LevelSpec::Xor { every: 1 };
        assert!(partner_on(&[]));
        assert!(partner_on(std::slice::from_ref(&disk)));
        assert!(!partner_on(&[xor.clone(), disk.clone()]));
        assert!(partner_on(&[LevelSpec::Partner, xor.clone()]));
        let pl = Placement::block(4, 2).expect("valid");
        assert_eq!(
            MultiLevel::new(0, &pl, &[xor.clone(), disk], None).name(),
            "xor+disk"
        );
        let rs = LevelSpec::Rs {
            parity: 2,
            every: 1,
        };
        let e = validate(&[xor.clone(), rs.clone()], &pl).expect_err("two codes");
        assert!(e.to_string().contains("at most one"), "{e}");
        validate(&[rs], &pl).expect("rs:2 over 4 ranks on 2 nodes");
        let e = validate(
            &[LevelSpec::Rs {
                parity: 4,
                every: 1,
            }],
            &pl,
        )
        .expect_err("too few ranks");
        assert!(e.to_string().contains("at least 5 ranks"), "{e}");
        assert!(validate(&[xor, LevelSpec::CorruptParityAt { rank: 4 }], &pl).is_err());
        let disk_in = |d: &str| LevelSpec::Disk {
            dir: PathBuf::from(d),
            every: 1,
        };
        let e = validate(&[disk_in("a"), disk_in("b")], &pl).expect_err("two disk levels");
        assert!(e.to_string().contains("at most one disk level"), "{e}");
    }
}
