//! `gpubake probe --world`: the probe on every node of a multi-node run, started by the
//! launcher the cluster already uses (torchrun `--no-python`, srun, mpirun, a PyTorchJob or
//! JobSet). Each rank reads its place from its launcher's variables, then joins a small
//! rendezvous that rank 0 runs on a port of its own (never the launcher's `MASTER_PORT`).

pub mod hostlist;
mod launchers;
pub mod place;
pub mod rendezvous;
pub mod wire;

use sha2::{Digest, Sha256};

/// sha256 of `bytes`, hex.
fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
