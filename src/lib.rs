//! # Lazarus
//!
//! A runtime for MPI-style parallel programs (ranks with messages,
//! collectives and one-sided RMA windows) that survive process and node
//! failures, with the rollback-recovery protocol chosen per run.
//!
//! ```
//! use lazarus::{Config, ProtocolKind, ReduceOp};
//!
//! let cfg = Config::new(4).protocol(ProtocolKind::Coordinated);
//! let report = lazarus::run(&cfg, |ctx| {
//!     let world = ctx.world();
//!     // Protected state: restored after a failure, `init` on a fresh start.
//!     let mut state: (u64, f64) = ctx.restore_or_else(|| (0, 0.0))?;
//!     while state.0 < 10 {
//!         let mut s = [0.0];
//!         world.all_reduce_into(&[world.rank() as f64], &mut s, ReduceOp::Sum)?;
//!         state = (state.0 + 1, state.1 + s[0]);
//!         ctx.checkpoint(&state)?; // a safe point
//!     }
//!     Ok(state.1)
//! });
//! assert_eq!(report.outcome.unwrap(), vec![60.0; 4]);
//! ```
//!
//! ## Glossary
//!
//! - **rank**: one process of the parallel program (SPMD), numbered from 0.
//! - **rank function**: the closure every rank runs; it is *restartable*:
//!   after a failure the runtime calls it again (Reinit/Fenix model).
//! - **safe point**: a call to [`Ctx::checkpoint`]; where a protocol may save.
//! - **checkpoint piece**: one rank's saved state (application state, window
//!   memory, unexpected messages, counters) for one **generation**.
//! - **generation**: one global checkpoint; usable only after its **commit
//!   record** is written, i.e. after every piece of it is stored.
//! - **failure domain / node**: a set of ranks that fail together
//!   (`--nodes K`, block placement); redundancy lives in another domain.
//! - **partner**: the rank, in another failure domain, that keeps a copy of a
//!   rank's piece.
//! - **epoch** (world): the number of failure events seen; frames of an older
//!   epoch belong to a rolled-back execution and are dropped. Not to be
//!   confused with an **RMA epoch** (003 §2.2): the period between two
//!   synchronisation actions of an origin towards a target (`E(p -> q)`).
//! - **protocol**: a state machine from events to actions (module
//!   `protocol`); it owns no thread, socket or clock.
//! - **driver / backend**: what runs ranks and carries frames (module
//!   `driver`): `threads`, `processes` and `sim`; `mpi` plugs in there.
//! - **SSN**: send sequence number, per channel (002 §3.1).
//! - **determinant**: the logged outcome of a nondeterministic reception
//!   (004 §2; logging protocols): which message a wildcard receive matched,
//!   or which one-sided request a target applied to its window next and
//!   where among its own operations.
//! - **HSR / HSD**: highest SSN received from a sender (kept by the
//!   receiver); the HSR a restored rank announces is what each sender has
//!   delivered (HSD) and resends above (002 §3.3).
//! - **collective result log**: under `ulml`, each rank keeps the result of
//!   every barrier, broadcast, all-reduce and all-gather instead of their
//!   internal messages (002 §2.2); collectives are numbered per
//!   communicator.
//! - **revoke / shrink / agree / respawn**: ULFM's operations for programs
//!   that handle failures themselves (`FailureHandling::Return`,
//!   [`api::ulfm`]).
//! - **replacement** (substitute, 002): the new incarnation of a dead rank,
//!   with its number.
//! - **correlated set** (004 §3): ranks likely to fail together (a node, or
//!   `--sets N` consecutive ranks) that checkpoint and roll back together
//!   under `correlated`; a message is **internal** to a set, or **ingoing**
//!   / **outgoing** across its boundary, and only the latter are logged.
//! - **worker, virtual rank** (001): a worker (001's processor) hosts
//!   several ranks (`--workers`); a rank can move between workers at a safe
//!   point with its state, and nothing rolls back.
//! - **warning, evacuation, home** (001): a warning says a node (or worker)
//!   will fail; its ranks are evacuated to other workers. Each rank has a
//!   **home** worker (001 §3.1's index-to-home function over the valid
//!   workers) that knows where it is; a frame sent to where a rank was is
//!   **forwarded**, and its sender gets a **routing update**.
//! - **marker, cut, channel state** (Chandy–Lamport, 000): under
//!   `chandy-lamport` a rank records its state (its side of the **cut**) and
//!   sends a **marker** on every outgoing channel; the messages that reach
//!   it on a channel after its recording and before that channel's marker
//!   are the channel's **state**, saved with its piece and delivered again
//!   after a rollback. A message that **crosses** a cut was sent after its
//!   sender's cut and received before its receiver's (an orphan); a
//!   one-sided reply also crosses it when read before the target's cut and
//!   written after the origin's (000 Fig. 3). An operation **overlaps** a
//!   cut when issued before its origin's cut and completed after.
//! - **wave, get() fix** (000 §IV): the markers of one snapshot, which a
//!   rank **enters** at the first one that reaches it; the fixes (vanilla,
//!   delay, peek-and-get, double barrier, partial double barrier) decide
//!   where a rank's cut lies so that a GET in flight cannot cross it
//!   (`--get-fix`; `lazarus bench --get-fix all` measures 000 Table I).
//! - **request-based operation**: a one-sided access that returns a request
//!   at once ([`Window::immediate_get`], MPI's `MPI_Rget`), completed by
//!   `wait`/`test` or at the end of its RMA epoch.
//!
//! ## Layers
//!
//! [`api`] (what the program calls) → `engine` (matching, requests, safe
//! points, windows) → `protocol` (events to actions) → `store`
//! (checkpoint levels) → `driver` (threads; the world). See
//! `ARCHITECTURE.md`.

// What a program uses: the API, its configuration, errors, fault plans,
// the job's report, its logs and its timeline.
pub mod api;
pub mod config;
pub mod cuts;
pub mod error;
pub mod fault;
pub mod job;
pub mod logging;
pub mod migration;
pub mod trace;

// The runtime's layers below the API, and the `lazarus` command's tools:
// public so the command, the tests and the benchmarks reach them, hidden
// from the documentation because programs should not depend on them.
#[doc(hidden)]
pub mod apps;
#[doc(hidden)]
pub mod driver;
#[doc(hidden)]
pub mod engine;
#[doc(hidden)]
pub mod network;
#[doc(hidden)]
pub mod protocol;
#[doc(hidden)]
pub mod segments;
#[doc(hidden)]
pub mod store;
#[doc(hidden)]
pub mod tools;
#[doc(hidden)]
pub mod topology;

/// A rank number.
pub type Rank = usize;

pub use api::Ctx;
pub use api::comm::{
    Communicator, Message, ReceiveRequest, Request, Source, Status, TagMatch, wait_all,
};
pub use api::datatype::{DType, Equivalence, ReduceOp, bulk};
pub use api::window::{GetRequest, PutRequest, Window};
pub use config::{Backend, Config, FailureHandling};
pub use driver::{LockType, WinId};
pub use engine::frame::Tag;
pub use error::{Error, Result};
pub use fault::KillSpec;
pub use job::{JobReport, JobStats, run};
pub use protocol::ProtocolKind;
pub use topology::Placement;
