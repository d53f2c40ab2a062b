//! Where this process stands in a multi-node run, read from the environment its launcher
//! set: which rank it is, how many there are, and where rank 0 listens. A pure function of
//! the variables, so every launcher's shape is testable without the launcher.
//!
//! Launchers, first match wins (a launcher nested in another sets both sets of variables:
//! torchrun or mpirun inside a Slurm allocation is the inner one):
//!
//! 1. torchrun (`--no-python`): `TORCHELASTIC_RUN_ID` with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!    `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`.
//! 2. Open MPI: `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`.
//! 3. MPICH and Intel MPI (Hydra): `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`, `MPI_LOCALNRANKS`.
//! 4. Slurm `srun`: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, and the step's node list,
//!    whose first host runs task 0 under block and cyclic distribution.
//! 5. `RANK` and `WORLD_SIZE` without torchrun: Kubeflow's PyTorchJob (one process per pod,
//!    `WORLD_SIZE` counts pods), or set by hand.
//! 6. Kubeflow Trainer v2 on JobSet without torchrun: `PET_NODE_RANK`, `PET_NNODES`,
//!    `PET_MASTER_ADDR`, `PET_MASTER_PORT` (one process per pod).
//! 7. An Indexed Job or a JobSet: `JOB_COMPLETION_INDEX` is the rank. Kubernetes says neither
//!    how many pods there are nor where pod 0 is, so the manifest sets `WORLD_SIZE` (the
//!    completions) and `MASTER_ADDR` (pod 0 under the headless service, such as
//!    `<jobset>-<job>-0-0.<jobset>`). One replicated Job only: the index restarts in each.
//!
//! MPI launchers do not say where rank 0 runs, so they need `MASTER_ADDR` too.

use super::launchers::{indexed_job, open_mpi, pmi, slurm, torch_style, trainer_v2};
use std::collections::HashMap;
use std::fmt;

/// The port the world listens on when nothing names one: torchrun's default `MASTER_PORT`
/// plus one, as if torchrun had set it.
pub const DEFAULT_WORLD_PORT: u16 = 29501;

/// The launcher whose variables were read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Launcher {
    /// torchrun's elastic agent.
    Torchrun,
    /// Open MPI's mpirun.
    OpenMpi,
    /// A PMI process manager: MPICH's or Intel MPI's Hydra.
    Pmi,
    /// Slurm's srun.
    Slurm,
    /// `RANK` and `WORLD_SIZE` from Kubeflow's PyTorchJob or by hand.
    TorchEnv,
    /// Kubeflow Trainer v2's `PET_*` variables.
    TrainerV2,
    /// Kubernetes' `JOB_COMPLETION_INDEX`.
    IndexedJob,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "Open MPI",
            Launcher::Pmi => "Hydra (MPICH or Intel MPI)",
            Launcher::Slurm => "Slurm srun",
            Launcher::TorchEnv => "a PyTorchJob or hand-set RANK/WORLD_SIZE",
            Launcher::TrainerV2 => "Kubeflow Trainer",
            Launcher::IndexedJob => "an Indexed Job",
        })
    }
}

/// This process's place in the world.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Place {
    /// Its global rank, below `world_size`.
    pub rank: u32,
    /// How many ranks there are.
    pub world_size: u32,
    /// Its rank among the processes of its node.
    pub local_rank: u32,
    /// How many processes its node runs, where the launcher says.
    pub local_world_size: Option<u32>,
    /// This node's host name.
    pub node: String,
    /// Where rank 0 runs.
    pub master_addr: String,
    /// The launcher's own port on rank 0's node, which the world must not take.
    pub master_port: Option<u16>,
    /// The run's identity where the launcher gives one, so two runs never mix.
    pub job: Option<String>,
    /// Whose variables these are.
    pub launcher: Launcher,
}

/// A variable that is missing, malformed or inconsistent with another.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {problem}")]
pub struct EnvError {
    /// The variable (or variables) at fault.
    pub variable: String,
    /// What is wrong and what to do.
    pub problem: String,
}

pub(super) fn env_error(variable: &str, problem: impl Into<String>) -> EnvError {
    EnvError {
        variable: variable.to_string(),
        problem: problem.into(),
    }
}

/// The variables a launcher gave the rank, world size, local rank and local world size in,
/// for the errors that find them inconsistent.
pub(super) struct Names {
    pub rank: &'static str,
    pub size: &'static str,
    /// Empty where one process runs per pod: local rank 0 of 1 cannot be inconsistent.
    pub local_rank: &'static str,
    pub local_size: &'static str,
}

/// Reads the environment through a map, naming the variable in every error.
pub(super) struct Vars<'a>(&'a HashMap<String, String>);

impl Vars<'_> {
    pub(super) fn text(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.text(name).is_some()
    }

    /// `name` parsed as a `T`, `what` saying what it must be ("a whole number"); None when
    /// unset. The one parser of every launcher's values, so each error names its variable.
    pub(super) fn parsed<T: std::str::FromStr>(
        &self,
        name: &str,
        what: &str,
    ) -> Result<Option<T>, EnvError> {
        self.text(name)
            .map(|v| {
                v.parse()
                    .map_err(|_| env_error(name, format!("`{v}` is not {what}")))
            })
            .transpose()
    }

    pub(super) fn number(&self, name: &str) -> Result<Option<u32>, EnvError> {
        self.parsed(name, "a whole number")
    }

    pub(super) fn required_number(&self, name: &str, launcher: Launcher) -> Result<u32, EnvError> {
        self.number(name)?.ok_or_else(|| {
            env_error(
                name,
                match launcher {
                    Launcher::TorchEnv => "unset, but RANK is set: a rank needs both".into(),
                    _ => format!("unset, but {launcher} sets it"),
                },
            )
        })
    }

    pub(super) fn port(&self, name: &str) -> Result<Option<u16>, EnvError> {
        self.parsed(name, "a port number")
    }

    /// Where rank 0 runs: the first of `names` that is set, else an error naming the first
    /// and saying `why`.
    pub(super) fn master_addr(&self, names: &[&str], why: &str) -> Result<String, EnvError> {
        match self.first_of(names) {
            Some((_, addr)) => Ok(addr.to_string()),
            None => Err(env_error(names[0], why)),
        }
    }

    /// The first of `names` that is set, by name and value.
    pub(super) fn first_of<'n>(&self, names: &[&'n str]) -> Option<(&'n str, &str)> {
        names.iter().find_map(|n| self.text(n).map(|v| (*n, v)))
    }
}

impl Place {
    /// Reads the launcher's variables from `env`; `node` is this host's name.
    pub fn from_env(env: &HashMap<String, String>, node: &str) -> Result<Place, EnvError> {
        let vars = Vars(env);
        let (place, names) = if vars.has("TORCHELASTIC_RUN_ID") {
            torch_style(&vars, node, Launcher::Torchrun)?
        } else if vars.has("OMPI_COMM_WORLD_RANK") {
            open_mpi(&vars, node)?
        } else if vars.has("PMI_RANK") {
            pmi(&vars, node)?
        } else if vars.has("SLURM_PROCID") {
            slurm(&vars, node)?
        } else if vars.has("RANK") {
            torch_style(&vars, node, Launcher::TorchEnv)?
        } else if vars.has("PET_NODE_RANK") {
            trainer_v2(&vars, node)?
        } else if vars.has("JOB_COMPLETION_INDEX") {
            indexed_job(&vars, node)?
        } else {
            return Err(env_error(
                "RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK, JOB_COMPLETION_INDEX",
                "none is set: --world runs under a launcher (torchrun --no-python, srun, \
                 mpirun, a PyTorchJob or an Indexed Job) that tells each process its rank",
            ));
        };
        place.consistent(&names)?;
        Ok(place)
    }

    /// Refuses a place no launcher would give: a rank past the world, a local rank past its
    /// node's count. `names` are the variables the launcher read them from.
    fn consistent(&self, names: &Names) -> Result<(), EnvError> {
        if self.world_size == 0 {
            return Err(env_error(names.size, "is 0: a world has at least one rank"));
        }
        if self.rank >= self.world_size {
            return Err(env_error(
                &format!("{}, {}", names.rank, names.size),
                format!(
                    "rank {} is not below the world size {}: ranks count from 0",
                    self.rank, self.world_size
                ),
            ));
        }
        if let Some(local_size) = self.local_world_size
            && self.local_rank >= local_size
        {
            return Err(env_error(
                &format!("{}, {}", names.local_rank, names.local_size),
                format!(
                    "local rank {} is not below the local world size {local_size}",
                    self.local_rank
                ),
            ));
        }
        Ok(())
    }

    /// The port rank 0 listens on: `flag` (`--world-port`), else one above the launcher's
    /// port (torchrun's agent already serves its store on `MASTER_PORT`), else the default.
    pub fn world_port(&self, flag: Option<u16>) -> Result<u16, EnvError> {
        match (flag, self.master_port) {
            (Some(port), _) => Ok(port),
            (None, Some(port)) => port.checked_add(1).ok_or_else(|| {
                env_error(
                    "MASTER_PORT",
                    "is 65535, which leaves no port above it for the world: pass --world-port",
                )
            }),
            (None, None) => Ok(DEFAULT_WORLD_PORT),
        }
    }
}

/// Places from literal variables, for the tests of every launcher.
#[cfg(test)]
pub(super) mod testing {
    use super::*;

    pub fn place(pairs: &[(&str, &str)]) -> Place {
        Place::from_env(&env(pairs), "here").unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn refused(pairs: &[(&str, &str)]) -> EnvError {
        Place::from_env(&env(pairs), "here").unwrap_err()
    }

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{place, refused};
    use super::*;

    const TORCHRUN: &[(&str, &str)] = &[
        ("TORCHELASTIC_RUN_ID", "job7"),
        ("RANK", "5"),
        ("LOCAL_RANK", "1"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "node-a"),
        ("MASTER_PORT", "29500"),
    ];

    #[test]
    fn torchrun_gives_every_field_and_keeps_its_port() {
        let p = place(TORCHRUN);
        assert_eq!(
            p,
            Place {
                rank: 5,
                world_size: 8,
                local_rank: 1,
                local_world_size: Some(4),
                node: "here".into(),
                master_addr: "node-a".into(),
                master_port: Some(29500),
                job: Some("job7".into()),
                launcher: Launcher::Torchrun,
            }
        );
        assert_eq!(p.world_port(None).unwrap(), 29501);
        assert_eq!(p.world_port(Some(4000)).unwrap(), 4000);
    }

    #[test]
    fn inconsistent_torchrun_variables_are_named() {
        let mut vars = TORCHRUN.to_vec();
        vars.retain(|(k, _)| *k != "MASTER_ADDR");
        let e = refused(&vars);
        assert_eq!(e.variable, "MASTER_ADDR");

        let mut vars = TORCHRUN.to_vec();
        vars[1] = ("RANK", "8");
        let e = refused(&vars);
        assert_eq!(e.variable, "RANK, WORLD_SIZE");
        assert!(
            e.problem.contains("rank 8 is not below the world size 8"),
            "{e}"
        );

        let mut vars = TORCHRUN.to_vec();
        vars[2] = ("LOCAL_RANK", "4");
        assert_eq!(refused(&vars).variable, "LOCAL_RANK, LOCAL_WORLD_SIZE");

        let mut vars = TORCHRUN.to_vec();
        vars[3] = ("WORLD_SIZE", "eight");
        let e = refused(&vars);
        assert_eq!(e.variable, "WORLD_SIZE");
        assert!(e.problem.contains("`eight`"), "{e}");

        // Every value goes through one parser, which names the variable and says what
        // it must be.
        let mut vars = TORCHRUN.to_vec();
        vars[6] = ("MASTER_PORT", "70000");
        let e = refused(&vars);
        assert_eq!(e.variable, "MASTER_PORT");
        assert_eq!(e.problem, "`70000` is not a port number");

        let mut vars = TORCHRUN.to_vec();
        vars[6] = ("MASTER_PORT", "65535");
        let e = place(&vars).world_port(None).unwrap_err();
        assert_eq!(e.variable, "MASTER_PORT");

        let mut vars = TORCHRUN.to_vec();
        vars[3] = ("WORLD_SIZE", "0");
        vars[1] = ("RANK", "0");
        assert_eq!(refused(&vars).variable, "WORLD_SIZE");
    }

    #[test]
    fn no_launcher_is_named_as_such() {
        let e = refused(&[("HOME", "/root")]);
        assert!(e.problem.contains("torchrun --no-python"), "{e}");
        // Empty values count as unset.
        let e = refused(&[("RANK", " ")]);
        assert!(e.variable.contains("SLURM_PROCID"), "{e}");
    }
}
