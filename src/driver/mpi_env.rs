//! What an MPI launcher tells the processes it starts (MPICH's Hydra,
//! Open MPI, Slurm's `srun` with PMI): whether this process is a rank of
//! an MPI job, in every build (the `mpi` backend itself needs the `mpi`
//! feature).

use crate::Rank;

/// Set in the ranks that the mpi backend's own launcher started.
pub(crate) const SELF_LAUNCHED: &str = "LAZARUS_MPI_JOB";

/// This process's rank in an MPI job, as its launcher says; `None`
/// outside one.
pub fn launcher_rank() -> Option<Rank> {
    ["PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// The number of processes of the MPI job this process belongs to, as its
/// launcher says; `None` outside one (or if it does not say).
pub fn launcher_size() -> Option<usize> {
    ["PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "OMPI_UNIVERSE_SIZE"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// Whether this process is a rank that `lazarus::run` on the mpi backend
/// started through `mpiexec` (it reports to that launcher and exits).
pub fn self_launched() -> bool {
    std::env::var_os(SELF_LAUNCHED).is_some()
}

/// Whether the MPI that started this process has its fault tolerance on
/// (Open MPI's `mpiexec --with-ft ulfm` sets `OMPI_MCA_mpi_ft_enable`).
pub fn fault_tolerant() -> bool {
    std::env::var("OMPI_MCA_mpi_ft_enable").is_ok_and(|v| matches!(v.trim(), "1" | "true"))
}

/// Whether ranks of the mpi backend survive the death of others in place
/// (ULFM): a `ulfm` build, either run by a fault-tolerant MPI or about to
/// start its own `mpiexec` (`lazarus run --backend mpi`, which asks Open
/// MPI for it).
pub fn recovers_in_place() -> bool {
    cfg!(feature = "ulfm") && (fault_tolerant() || launcher_rank().is_none())
}

/// Whether this process is a substitute spawned by a repair (ULFM): Open
/// MPI names the spawning job's port to the processes `MPI_Comm_spawn`
/// starts. A substitute's own `MPI_COMM_WORLD` (and so the launcher's rank
/// variables) is its alone; its rank in the job is known only once it
/// has joined ([`job_rank`]).
pub fn substitute() -> bool {
    std::env::var_os("OMPI_PARENT_PORT").is_some()
}

static JOB_RANK: std::sync::OnceLock<Rank> = std::sync::OnceLock::new();

/// This process's rank in the MPI job it ran, once the mpi backend knows
/// it (for a substitute, after it joined).
pub fn job_rank() -> Option<Rank> {
    JOB_RANK.get().copied()
}

#[cfg(feature = "mpi")]
pub(crate) fn set_job_rank(rank: Rank) {
    let _ = JOB_RANK.set(rank);
}
