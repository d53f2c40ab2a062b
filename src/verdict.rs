//! One verdict for every command that judges: the status of a check, the check, and the exit
//! code a list of checks gives. verify, the probe, the node's CDI preflight and certify report
//! in these terms; certify folds the others' checks into its own report unchanged.

use serde::Serialize;

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Holds.
    Pass,
    /// Did not run (not applicable, or something it needs is absent); says why.
    Skip,
    /// Holds, but something deserves a look.
    Warn,
    /// Does not hold.
    Fail,
}

impl Status {
    /// The word reports print: PASS, SKIP, WARN, FAIL.
    pub fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Skip => "SKIP",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One check with its reason.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// The phase: environment, nvml, compatibility, cuda, allreduce.
    pub phase: &'static str,
    /// What was checked, naming the GPU or library where one is concerned.
    pub name: String,
    /// The outcome.
    pub status: Status,
    /// Why: what was found against what was expected.
    pub detail: String,
}

impl Check {
    /// The check `name` of `phase` with its status and reason.
    pub fn new(
        phase: &'static str,
        name: impl Into<String>,
        status: Status,
        detail: impl Into<String>,
    ) -> Check {
        Check {
            phase,
            name: name.into(),
            status,
            detail: detail.into(),
        }
    }

    /// A check that held (Ok, with what was found) or failed (Err, with why).
    pub fn held(
        phase: &'static str,
        name: impl Into<String>,
        result: std::result::Result<String, String>,
    ) -> Check {
        match result {
            Ok(detail) => Check::new(phase, name, Status::Pass, detail),
            Err(detail) => Check::new(phase, name, Status::Fail, detail),
        }
    }

    /// Whether it failed.
    pub fn failed(&self) -> bool {
        self.status == Status::Fail
    }
}

/// The exit code of a judgement: 3 when the environment lacks what the checks need (no GPU,
/// no driver), else 1 when a check failed, else 0 (warnings and skips included). Usage errors
/// (2) never reach a verdict.
pub fn exit_code(checks: &[Check], environment_lacks: bool) -> i32 {
    if environment_lacks {
        3
    } else if checks.iter().any(Check::failed) {
        1
    } else {
        0
    }
}
