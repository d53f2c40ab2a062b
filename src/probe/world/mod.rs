//! `gpubake probe --world`: the probe on every node of a multi-node run, started by the
//! launcher the cluster already uses (torchrun `--no-python`, srun, mpirun, a PyTorchJob or
//! JobSet). This part reads where each process stands from its launcher's variables.

pub mod hostlist;
mod launchers;
pub mod place;
