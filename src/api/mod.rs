//! The programming model: what a rank function sees.
//!
//! Modules follow the MPI standard's chapters, with rsmpi's names:
//! [`comm`] (point-to-point, communicators), [`collective`], [`window`]
//! (one-sided RMA), [`datatype`] (element types and reduction operations).
//! The entry point is [`Ctx`], handed to the rank function by [`crate::run`].

pub mod collective;
pub mod comm;
pub mod datatype;
pub mod ulfm;
pub mod window;

use std::cell::RefCell;
use std::rc::Rc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::engine::Engine;
use crate::topology::Placement;
use crate::{Error, Rank, Result};
use comm::Communicator;

/// A rank's handle on the runtime, passed to the rank function.
///
/// A rank function is *restartable*: after a failure the runtime calls it
/// again, and [`Ctx::restore_or_else`] returns the state of the checkpoint
/// recovery selected (or runs `init` on a fresh start).
pub struct Ctx {
    engine: Rc<RefCell<Engine>>,
    world: Communicator,
}

impl Ctx {
    pub(crate) fn new(engine: Rc<RefCell<Engine>>) -> Self {
        let world = Communicator::world(engine.clone());
        Ctx { engine, world }
    }

    /// The communicator of all ranks (MPI_COMM_WORLD).
    pub fn world(&self) -> Communicator {
        self.world.clone()
    }

    /// This rank in the world.
    pub fn rank(&self) -> Rank {
        self.world.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.world.size()
    }

    /// The placement of ranks into failure domains.
    pub fn placement(&self) -> Placement {
        self.engine.borrow().placement().clone()
    }

    /// The protected state: restored from the checkpoint that recovery
    /// selected, or `init()` when the rank starts fresh. Call it once, before
    /// the first [`Ctx::checkpoint`].
    pub fn restore_or_else<S, F>(&mut self, init: F) -> Result<S>
    where
        S: DeserializeOwned,
        F: FnOnce() -> S,
    {
        let mut e = self.engine.borrow_mut();
        e.enter()?;
        match e.take_restored_app() {
            Some(bytes) => postcard::from_bytes(&bytes).map_err(|err| Error::CorruptCheckpoint {
                owner: e.rank(),
                generation: e.restored_generation().unwrap_or(0),
                detail: format!("application state does not decode as the requested type: {err}"),
            }),
            None => Ok(init()),
        }
    }

    /// A safe point: the protocol may checkpoint `state` here (with the
    /// runtime's own state: unexpected messages, window memory and fence
    /// epochs, counters). All ranks must call it the same number of times.
    /// Called inside a passive-target epoch (`lock`, `lock_all` not yet
    /// released) it returns `Error::NotSafePoint`, under every protocol.
    pub fn checkpoint<S: Serialize>(&mut self, state: &S) -> Result<()> {
        let mut ser = |buf: &mut Vec<u8>| crate::engine::frame::postcard_append(state, buf);
        self.engine.borrow_mut().safe_point(&mut ser)
    }

    /// Report how far the job is (0..=1). Kills given as `R@P%` use it.
    pub fn set_progress(&self, fraction: f64) {
        self.engine.borrow_mut().set_progress(fraction);
    }

    /// Safe points this rank has passed (restored with the checkpoint).
    pub fn safe_points(&self) -> u64 {
        self.engine.borrow().safe_points()
    }

    /// The checkpoint generation this execution was restored from.
    pub fn restored_generation(&self) -> Option<u64> {
        self.engine.borrow().restored_generation()
    }

    /// Seconds since the job started, from the driver's clock (virtual time
    /// on the simulator), like `MPI_Wtime`.
    pub fn wtime(&self) -> f64 {
        self.engine.borrow().now().as_secs_f64()
    }

    /// Charge `seconds` of computation to this rank: a sleep on real
    /// backends, virtual time on the simulator (communication-pattern apps
    /// use it instead of computing).
    pub fn compute(&self, seconds: f64) -> Result<()> {
        let d = std::time::Duration::from_secs_f64(seconds.max(0.0));
        self.engine.borrow_mut().compute(d)
    }

    /// Whether this incarnation was respawned by the survivors (ULFM,
    /// [`Communicator::respawn`]): it starts from the beginning of the rank
    /// function and gets its communicator from [`Ctx::join`].
    pub fn is_respawned(&self) -> bool {
        self.engine.borrow().is_respawned()
    }

    /// A respawned rank (ULFM): wait for the survivors' `respawn` and return
    /// the communicator they repaired, in which this rank has its old number.
    pub fn join(&self) -> Result<Communicator> {
        let (context, group) = self.engine.borrow_mut().wait_join()?;
        let comm = self
            .world
            .with_group(group, context)
            .ok_or_else(|| Error::app("join: this rank is not in the repaired communicator"))?;
        comm.barrier()?;
        Ok(comm)
    }

    /// Failure events seen so far (the world epoch).
    pub fn epoch(&self) -> u64 {
        self.engine.borrow().epoch()
    }
}

#[cfg(test)]
mod tests {
    /// Every public function of the point-to-point, collective, window and
    /// ULFM modules carries a doc example that runs (not `ignore`d, not
    /// `no_run`): `cargo test --doc` runs them, and this test keeps a new
    /// function from arriving without one.
    #[test]
    fn every_public_function_has_a_runnable_example() {
        let files = [
            ("comm.rs", include_str!("comm.rs")),
            ("collective.rs", include_str!("collective.rs")),
            ("window.rs", include_str!("window.rs")),
            ("ulfm.rs", include_str!("ulfm.rs")),
        ];
        let mut missing = Vec::new();
        let mut seen = 0;
        for (file, text) in files {
            let mut doc = String::new();
            for (i, line) in text.lines().enumerate() {
                let t = line.trim_start();
                if let Some(d) = t.strip_prefix("///") {
                    doc.push_str(d);
                    doc.push('\n');
                } else if t.starts_with("#[") {
                    // Attributes sit between a doc comment and its item.
                } else {
                    if t.starts_with("pub fn ") {
                        seen += 1;
                        let runs = doc.lines().any(|l| {
                            let l = l.trim();
                            l == "```" || l == "```rust"
                        });
                        if !runs {
                            missing.push(format!("{file}:{}: {t}", i + 1));
                        }
                    }
                    doc.clear();
                }
            }
        }
        assert!(seen >= 60, "only {seen} public functions found");
        assert!(
            missing.is_empty(),
            "without a runnable example:\n{}",
            missing.join("\n")
        );
    }
}
