//! How each launcher's variables read into a `Place`; which launcher applies, and in what
//! order they are tried, is `Place::from_env`'s. Every value is read through `Vars`, so each
//! error names its variable; each launcher also returns the `Names` it read the counts from.

use super::hostlist;
use super::place::{EnvError, Launcher, Names, Place, Vars, env_error};

const NO_MASTER: &str = "unset: this launcher does not say where rank 0 runs; set MASTER_ADDR \
     to rank 0's host name or address";

/// One process per pod: its local rank is 0 of 1, from no variable.
const ONE_PER_POD: (&str, &str) = ("", "");

/// torchrun, or `RANK`/`WORLD_SIZE` set by a PyTorchJob or by hand.
pub(super) fn torch_style(
    vars: &Vars,
    node: &str,
    launcher: Launcher,
) -> Result<(Place, Names), EnvError> {
    let names = Names {
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_size: "LOCAL_WORLD_SIZE",
    };
    let place = Place {
        rank: vars.required_number(names.rank, launcher)?,
        world_size: vars.required_number(names.size, launcher)?,
        // Without torchrun each pod runs one process.
        local_rank: if launcher == Launcher::Torchrun {
            vars.required_number(names.local_rank, launcher)?
        } else {
            vars.number(names.local_rank)?.unwrap_or(0)
        },
        local_world_size: vars.number(names.local_size)?,
        node: node.to_string(),
        master_addr: vars.master_addr(&["MASTER_ADDR"], NO_MASTER)?,
        master_port: vars.port("MASTER_PORT")?,
        job: vars.text("TORCHELASTIC_RUN_ID").map(String::from),
        launcher,
    };
    Ok((place, names))
}

/// An MPI launcher's four variables, which say nothing of where rank 0 runs: `MASTER_ADDR`
/// does, passed on as `pass_on` says.
fn mpi(
    vars: &Vars,
    node: &str,
    launcher: Launcher,
    names: Names,
    pass_on: &str,
) -> Result<(Place, Names), EnvError> {
    let place = Place {
        rank: vars.required_number(names.rank, launcher)?,
        world_size: vars.required_number(names.size, launcher)?,
        local_rank: vars.required_number(names.local_rank, launcher)?,
        local_world_size: vars.number(names.local_size)?,
        node: node.to_string(),
        master_addr: vars.master_addr(&["MASTER_ADDR"], &format!("{NO_MASTER} ({pass_on})"))?,
        master_port: vars.port("MASTER_PORT")?,
        job: None,
        launcher,
    };
    Ok((place, names))
}

pub(super) fn open_mpi(vars: &Vars, node: &str) -> Result<(Place, Names), EnvError> {
    let names = Names {
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: "OMPI_COMM_WORLD_LOCAL_SIZE",
    };
    mpi(
        vars,
        node,
        Launcher::OpenMpi,
        names,
        "mpirun -x MASTER_ADDR",
    )
}

pub(super) fn pmi(vars: &Vars, node: &str) -> Result<(Place, Names), EnvError> {
    let names = Names {
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_size: "MPI_LOCALNRANKS",
    };
    mpi(
        vars,
        node,
        Launcher::Pmi,
        names,
        "mpiexec -genv MASTER_ADDR",
    )
}

pub(super) fn slurm(vars: &Vars, node: &str) -> Result<(Place, Names), EnvError> {
    let launcher = Launcher::Slurm;
    let (size, _) = vars
        .first_of(&["SLURM_NTASKS", "SLURM_NPROCS"])
        .ok_or_else(|| env_error("SLURM_NTASKS", "unset, but srun sets it"))?;
    let names = Names {
        rank: "SLURM_PROCID",
        size,
        local_rank: "SLURM_LOCALID",
        local_size: "SLURM_STEP_TASKS_PER_NODE",
    };
    // An explicit MASTER_ADDR wins: it is how a job that places task 0 elsewhere
    // (--distribution=arbitrary) says so.
    let master_addr = match vars.text("MASTER_ADDR") {
        Some(addr) => addr.to_string(),
        None => {
            let (list_var, list) = vars
                .first_of(&[
                    "SLURM_STEP_NODELIST",
                    "SLURM_JOB_NODELIST",
                    "SLURM_NODELIST",
                ])
                .ok_or_else(|| {
                    env_error(
                        "SLURM_STEP_NODELIST",
                        "unset, and no MASTER_ADDR: nothing says where task 0 runs",
                    )
                })?;
            let hosts = hostlist::expand(list).map_err(|e| env_error(list_var, e))?;
            hosts[0].clone()
        }
    };
    let place = Place {
        rank: vars.required_number(names.rank, launcher)?,
        world_size: vars.required_number(names.size, launcher)?,
        local_rank: vars.required_number(names.local_rank, launcher)?,
        local_world_size: slurm_tasks_on_this_node(vars)?,
        node: node.to_string(),
        master_addr,
        master_port: vars.port("MASTER_PORT")?,
        job: vars
            .text("SLURM_JOB_ID")
            .map(|job| match vars.text("SLURM_STEP_ID") {
                Some(step) => format!("{job}.{step}"),
                None => job.to_string(),
            }),
        launcher,
    };
    Ok((place, names))
}

/// The task count of this node (`SLURM_NODEID`) in `SLURM_STEP_TASKS_PER_NODE`, which
/// compresses runs of equal counts: `2(x3),1` is 2, 2, 2, 1.
fn slurm_tasks_on_this_node(vars: &Vars) -> Result<Option<u32>, EnvError> {
    let Some((name, counts)) =
        vars.first_of(&["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"])
    else {
        return Ok(None);
    };
    let Some(node) = vars.number("SLURM_NODEID")? else {
        return Ok(None);
    };
    let malformed = || env_error(name, format!("`{counts}` is not like `2(x3),1`"));
    let mut first_node = 0u64;
    for run in counts.split(',') {
        let (count, times) = match run.trim().split_once("(x") {
            Some((count, times)) => (count, times.strip_suffix(')').ok_or_else(malformed)?),
            None => (run.trim(), "1"),
        };
        let count: u32 = count.parse().map_err(|_| malformed())?;
        let times: u64 = times.parse().map_err(|_| malformed())?;
        first_node += times;
        if u64::from(node) < first_node {
            return Ok(Some(count));
        }
    }
    Err(env_error(
        &format!("SLURM_NODEID, {name}"),
        format!("node {node} is past the {first_node} nodes of `{counts}`"),
    ))
}

pub(super) fn trainer_v2(vars: &Vars, node: &str) -> Result<(Place, Names), EnvError> {
    let launcher = Launcher::TrainerV2;
    let names = Names {
        rank: "PET_NODE_RANK",
        size: "PET_NNODES",
        local_rank: ONE_PER_POD.0,
        local_size: ONE_PER_POD.1,
    };
    let nodes = vars
        .parsed(
            names.size,
            "a whole number (an elastic MIN:MAX range needs torchrun)",
        )?
        .ok_or_else(|| env_error(names.size, "unset, but Kubeflow Trainer sets it"))?;
    let place = Place {
        rank: vars.required_number(names.rank, launcher)?,
        world_size: nodes,
        // Without torchrun each pod runs one process.
        local_rank: 0,
        local_world_size: Some(1),
        node: node.to_string(),
        master_addr: vars.master_addr(&["PET_MASTER_ADDR", "MASTER_ADDR"], NO_MASTER)?,
        master_port: match vars.port("PET_MASTER_PORT")? {
            Some(port) => Some(port),
            None => vars.port("MASTER_PORT")?,
        },
        job: None,
        launcher,
    };
    Ok((place, names))
}

pub(super) fn indexed_job(vars: &Vars, node: &str) -> Result<(Place, Names), EnvError> {
    let names = Names {
        rank: "JOB_COMPLETION_INDEX",
        size: "WORLD_SIZE",
        local_rank: ONE_PER_POD.0,
        local_size: ONE_PER_POD.1,
    };
    let place = Place {
        rank: vars.required_number(names.rank, Launcher::IndexedJob)?,
        world_size: vars.number(names.size)?.ok_or_else(|| {
            env_error(
                names.size,
                "unset: Kubernetes does not tell a pod how many there are; set it to the \
                 Job's completions in the manifest",
            )
        })?,
        local_rank: 0,
        local_world_size: Some(1),
        node: node.to_string(),
        master_addr: vars.master_addr(
            &["MASTER_ADDR"],
            "unset: Kubernetes does not say where pod 0 is; set it in the manifest to \
             pod 0's name under the headless service (<jobset>-<job>-0-0.<jobset>)",
        )?,
        master_port: vars.port("MASTER_PORT")?,
        job: None,
        launcher: Launcher::IndexedJob,
    };
    Ok((place, names))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::world::place::DEFAULT_WORLD_PORT;
    use crate::probe::world::place::testing::{place, refused};

    #[test]
    fn slurm_rank_zero_runs_on_the_first_node_of_the_step() {
        let vars = [
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "7"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x3),1"),
            ("SLURM_STEP_NODELIST", "node[07-09],gpu-a1"),
            ("SLURM_JOB_NODELIST", "other[1-9]"),
            ("SLURM_JOB_ID", "1234"),
            ("SLURM_STEP_ID", "0"),
        ];
        let p = place(&vars);
        assert_eq!(p.launcher, Launcher::Slurm);
        assert_eq!((p.rank, p.world_size, p.local_rank), (3, 7, 0));
        assert_eq!(p.local_world_size, Some(2));
        assert_eq!(p.master_addr, "node07");
        assert_eq!(p.job.as_deref(), Some("1234.0"));
        assert_eq!(p.world_port(None).unwrap(), DEFAULT_WORLD_PORT);

        let mut last_node = vars.to_vec();
        last_node[3] = ("SLURM_NODEID", "3");
        assert_eq!(place(&last_node).local_world_size, Some(1));

        let mut past = vars.to_vec();
        past[3] = ("SLURM_NODEID", "4");
        assert_eq!(
            refused(&past).variable,
            "SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE"
        );

        let mut bad_list = vars.to_vec();
        bad_list[5] = ("SLURM_STEP_NODELIST", "node[07-");
        assert_eq!(refused(&bad_list).variable, "SLURM_STEP_NODELIST");

        let mut bad_counts = vars.to_vec();
        bad_counts[4] = ("SLURM_STEP_TASKS_PER_NODE", "2(x3");
        assert_eq!(refused(&bad_counts).variable, "SLURM_STEP_TASKS_PER_NODE");

        // An explicit MASTER_ADDR wins over the node list; a job list stands in for the step's.
        let mut told = vars.to_vec();
        told.push(("MASTER_ADDR", "10.0.0.9"));
        assert_eq!(place(&told).master_addr, "10.0.0.9");
        let mut job_list = vars.to_vec();
        job_list.remove(5);
        assert_eq!(place(&job_list).master_addr, "other1");

        let bare = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
        ];
        assert_eq!(refused(&bare).variable, "SLURM_STEP_NODELIST");
        let over = [
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODELIST", "n1"),
        ];
        assert_eq!(refused(&over).variable, "SLURM_PROCID, SLURM_NTASKS");
    }

    #[test]
    fn mpi_ranks_need_a_master_address() {
        let ompi = [
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            // mpirun inside a Slurm allocation: the inner launcher counts.
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ];
        let e = refused(&ompi);
        assert_eq!(e.variable, "MASTER_ADDR");
        assert!(e.problem.contains("mpirun -x MASTER_ADDR"), "{e}");
        let mut told = ompi.to_vec();
        told.push(("MASTER_ADDR", "head"));
        let p = place(&told);
        assert_eq!(p.launcher, Launcher::OpenMpi);
        assert_eq!((p.rank, p.world_size, p.local_world_size), (2, 4, Some(2)));

        let hydra = [
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "1"),
            ("MPI_LOCALNRANKS", "2"),
            ("MASTER_ADDR", "head"),
        ];
        let p = place(&hydra);
        assert_eq!(p.launcher, Launcher::Pmi);
        assert_eq!((p.rank, p.local_rank), (1, 1));
        assert_eq!(refused(&hydra[..2]).variable, "MPI_LOCALRANKID");
    }

    #[test]
    fn kubernetes_pods_read_pytorchjob_trainer_and_indexed_job_variables() {
        // PyTorchJob v1: one process per pod, WORLD_SIZE counts pods.
        let p = place(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "3"),
            ("MASTER_ADDR", "train-master-0"),
            ("MASTER_PORT", "23456"),
        ]);
        assert_eq!(p.launcher, Launcher::TorchEnv);
        assert_eq!((p.rank, p.local_rank, p.local_world_size), (1, 0, None));
        assert_eq!(p.world_port(None).unwrap(), 23457);

        // Kubeflow Trainer v2 on JobSet, the binary run without torchrun.
        let trainer = [
            ("PET_NODE_RANK", "2"),
            ("PET_NNODES", "4"),
            ("PET_NPROC_PER_NODE", "8"),
            ("PET_MASTER_ADDR", "tj-node-0-0.tj"),
            ("PET_MASTER_PORT", "29400"),
        ];
        let p = place(&trainer);
        assert_eq!(p.launcher, Launcher::TrainerV2);
        assert_eq!((p.rank, p.world_size), (2, 4));
        assert_eq!(p.master_addr, "tj-node-0-0.tj");
        assert_eq!(p.world_port(None).unwrap(), 29401);
        let mut elastic = trainer.to_vec();
        elastic[1] = ("PET_NNODES", "2:4");
        let e = refused(&elastic);
        assert_eq!(e.variable, "PET_NNODES");
        assert!(e.problem.contains("elastic"), "{e}");

        // A JobSet's Indexed Job: the manifest sets WORLD_SIZE and MASTER_ADDR.
        let job = [
            ("JOB_COMPLETION_INDEX", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "probe-nodes-0-0.probe"),
        ];
        let p = place(&job);
        assert_eq!(p.launcher, Launcher::IndexedJob);
        assert_eq!((p.rank, p.world_size), (1, 2));
        let e = refused(&job[..1]);
        assert_eq!(e.variable, "WORLD_SIZE");
        assert!(e.problem.contains("completions"), "{e}");
        let e = refused(&job[..2]);
        assert_eq!(e.variable, "MASTER_ADDR");
        assert!(e.problem.contains("headless service"), "{e}");
    }
}
