//! Multi-level checkpoint storage: the in-memory partner level plus,
//! optionally, a directory on disk written every N-th generation (as SCR and
//! FTI schedule their levels).
//!
//! The disk level writes this rank's piece durably (write, fsync, rename)
//! before the piece counts as stored, so when the coordinated protocol's root
//! commits a generation every piece of it is on disk, and the root then writes
//! the generation's commit record there. Only a committed generation on disk
//! is ever read back: at a recovery (when the in-memory copies of a piece are
//! gone) and at a whole-job restart (`--restart DIR`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::partner::PartnerStore;
use super::{CheckpointStore, Piece, StoreEvent, StoreMsg, StoreOut, disk};
use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// One storage level of a schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LevelSpec {
    /// A copy on a partner rank in another failure domain (always on).
    Partner,
    /// Pieces and commit records in `dir`, every `every`-th generation.
    Disk {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Write every N-th generation.
        every: u64,
    },
}

impl FromStr for LevelSpec {
    type Err = Error;

    /// `partner`, `disk:DIR` or `disk:DIR@N`.
    fn from_str(s: &str) -> Result<Self> {
        if s == "partner" {
            return Ok(LevelSpec::Partner);
        }
        if let Some(rest) = s.strip_prefix("disk:") {
            let (dir, every) = match rest.rsplit_once('@') {
                Some((d, n)) => (
                    d,
                    n.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
                        Error::config("--storage", format!("`{s}`: @N must be a positive number"))
                    })?,
                ),
                None => (rest, 1),
            };
            if dir.is_empty() {
                return Err(Error::config(
                    "--storage",
                    format!("`{s}`: disk needs a directory"),
                ));
            }
            return Ok(LevelSpec::Disk {
                dir: PathBuf::from(dir),
                every,
            });
        }
        let planned = s.starts_with("xor") || s.starts_with("rs:");
        Err(Error::config(
            "--storage",
            if planned {
                format!(
                    "`{s}`: the XOR and Reed–Solomon levels are not selectable yet (known: partner, disk:DIR[@N])"
                )
            } else {
                format!("unknown storage level `{s}` (known: partner, disk:DIR[@N])")
            },
        ))
    }
}

impl fmt::Display for LevelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LevelSpec::Partner => f.write_str("partner"),
            LevelSpec::Disk { dir, every } => write!(f, "disk:{}@{every}", dir.display()),
        }
    }
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

    /// Committed generations on disk of which this rank's piece is intact
    /// (read and checksummed: a corrupt piece must not be offered to a
    /// recovery, which would then fall back to an older generation).
    fn own_pieces(&self, rank: Rank) -> Vec<u64> {
        disk::committed_generations(&self.dir)
            .unwrap_or_default()
            .into_iter()
            // A restart source offers its chosen generation and whatever
            // this run committed after it.
            .filter(|&g| self.restart_from.is_none_or(|r| g >= r))
            .filter(|&g| disk::read_piece(&self.dir, g, rank).is_ok())
            .collect()
    }
}

/// The partner level, plus a disk level when configured.
#[derive(Debug)]
pub struct MultiLevel {
    rank: Rank,
    ranks: usize,
    partner: PartnerStore,
    disk: Option<DiskLevel>,
}

impl MultiLevel {
    /// The store of `rank` for the levels `specs` (partner is always on);
    /// `restart` is a checkpoint directory read at a whole-job restart (and
    /// written to as well when it is also a `disk` level).
    pub fn new(
        rank: Rank,
        placement: &Placement,
        specs: &[LevelSpec],
        restart: Option<(&Path, u64)>,
    ) -> Self {
        let disk = specs
            .iter()
            .find_map(|s| match s {
                LevelSpec::Disk { dir, every } => Some(DiskLevel {
                    dir: dir.clone(),
                    every: Some(*every),
                    restart_from: restart.filter(|(r, _)| *r == dir.as_path()).map(|(_, g)| g),
                }),
                LevelSpec::Partner => None,
            })
            .or_else(|| {
                restart.map(|(dir, g)| DiskLevel {
                    dir: dir.to_path_buf(),
                    every: None,
                    restart_from: Some(g),
                })
            });
        MultiLevel {
            rank,
            ranks: placement.ranks(),
            partner: PartnerStore::new(rank, placement),
            disk,
        }
    }

    /// The disk directory, if a disk level is configured.
    pub fn disk_dir(&self) -> Option<&Path> {
        self.disk.as_ref().map(|d| d.dir.as_path())
    }
}

impl CheckpointStore for MultiLevel {
    fn name(&self) -> &'static str {
        if self.disk.is_some() {
            "partner+disk"
        } else {
            "partner"
        }
    }

    fn put(&mut self, piece: Piece, out: &mut StoreOut) -> Result<()> {
        if let Some(d) = &self.disk
            && d.applies(piece.generation)
        {
            // Durable before the piece counts as stored: the commit record
            // is written only after every rank reported stored.
            disk::write_piece(&d.dir, &piece)?;
        }
        self.partner.put(piece, out)
    }

    fn on_msg(&mut self, src: Rank, msg: StoreMsg, out: &mut StoreOut) -> Result<()> {
        self.partner.on_msg(src, msg, out)
    }

    fn fetch(&mut self, generation: u64, holder: Rank, out: &mut StoreOut) {
        if self.partner.get(generation, self.rank).is_none()
            && let Some(d) = &self.disk
            && let Ok(piece) = disk::read_piece(&d.dir, generation, self.rank)
        {
            self.partner.adopt(piece);
            out.events.push(StoreEvent::Restored { generation });
            return;
        }
        self.partner.fetch(generation, holder, out);
    }

    fn replicate(&mut self, generation: u64, out: &mut StoreOut) -> Result<()> {
        self.partner.replicate(generation, out)
    }

    fn commit(&mut self, generation: u64) -> Result<()> {
        self.partner.commit(generation)?;
        // The record is always (re)written: a restarted run that reuses its
        // directory replaces any record of the same number.
        if self.rank == 0
            && let Some(d) = &self.disk
            && d.applies(generation)
        {
            disk::commit_from_headers(&d.dir, generation, self.ranks)?;
            disk::retain(&d.dir, 2)?;
        }
        Ok(())
    }

    fn committed(&self) -> Option<u64> {
        let on_disk = self
            .disk
            .as_ref()
            .and_then(|d| d.own_pieces(self.rank).into_iter().max());
        self.partner.committed().max(on_disk)
    }

    fn held(&self) -> Vec<(u64, Rank)> {
        let mut held = self.partner.held();
        if let Some(d) = &self.disk {
            for g in d.own_pieces(self.rank) {
                if !held.contains(&(g, self.rank)) {
                    held.push((g, self.rank));
                }
            }
        }
        held
    }

    fn get(&self, generation: u64, owner: Rank) -> Option<&Piece> {
        self.partner.get(generation, owner)
    }

    fn retain_only(&mut self, keep: Option<u64>) {
        self.partner.retain_only(keep);
    }

    fn abort_transfers(&mut self) {
        self.partner.abort_transfers();
    }

    fn bytes_held(&self) -> usize {
        self.partner.bytes_held()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for bad in ["disk:", "disk:x@0", "tape", "xor", "rs:2"] {
            let e = bad.parse::<LevelSpec>().expect_err(bad);
            assert!(e.to_string().contains("--storage"), "{e}");
        }
    }
}
