//! The probe's time budgets, in one place so that whoever waits for the probe (certify, a CI
//! job) can wait for its worst case rather than a guess.

use std::time::Duration;

/// How long NVML may take to answer before the driver counts as hung.
pub fn nvml(quick: bool) -> Duration {
    Duration::from_secs(if quick { 10 } else { 30 })
}

/// How long one worker process (CUDA copies, an all-reduce ladder, one NCCL run) may take.
pub fn worker(quick: bool) -> Duration {
    Duration::from_secs(if quick { 20 } else { 120 })
}

/// How long the framework check may take, every rank included: importing torch, CUDA's start,
/// a GEMM, a convolution and ProcessGroupNCCL's rendezvous and all-reduces.
pub fn framework(quick: bool) -> Duration {
    Duration::from_secs(if quick { 60 } else { 180 })
}

/// Worker runs one probe makes at most: the copies and the all-reduce, plus, when not quick,
/// NCCL with the preset, with its defaults, and once more with the preset logging what it
/// applied.
fn worker_runs(quick: bool) -> u32 {
    if quick { 2 } else { 5 }
}

/// The longest a probe can run before every phase has hit its budget.
pub fn worst_case(quick: bool) -> Duration {
    nvml(quick) + worker(quick) * worker_runs(quick) + framework(quick)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_case_covers_every_phase() {
        assert_eq!(worst_case(false), Duration::from_secs(30 + 5 * 120 + 180));
        assert!(worst_case(true) < worst_case(false));
    }
}
