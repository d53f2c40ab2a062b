//! One verdict for every command that judges: the status of a check, the check, and the
//! verdict (with its exit code) that a list of checks gives. lint, verify, the probe, the
//! node's CDI preflight and certify judge in these terms; certify folds the others' checks
//! into its own report unchanged.

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

/// What a judgement concluded. Each command that judges (lint, verify, the probe, certify)
/// ends in one, and its exit code is the verdict's: usage errors (2) never reach one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Every check held (warnings and skips included).
    Pass,
    /// A check failed.
    Fail,
    /// The environment lacks what the checks need (no GPU, no driver), so nothing judged.
    Lacking,
}

impl Verdict {
    /// The verdict of `checks`: Lacking when the environment lacks what they need, else
    /// Fail when one failed, else Pass.
    pub fn of(checks: &[Check], environment_lacks: bool) -> Verdict {
        Verdict::of_statuses(checks.iter().map(|c| c.status), environment_lacks, false)
    }

    /// The verdict of outcomes without checks of their own (lint's findings): `strict`
    /// counts a warning as a failure.
    pub fn of_statuses(
        statuses: impl IntoIterator<Item = Status>,
        environment_lacks: bool,
        strict: bool,
    ) -> Verdict {
        if environment_lacks {
            return Verdict::Lacking;
        }
        let failing = |s: Status| s == Status::Fail || (strict && s == Status::Warn);
        if statuses.into_iter().any(failing) {
            Verdict::Fail
        } else {
            Verdict::Pass
        }
    }

    /// The exit code that says it: 0 pass, 1 fail, 3 lacking.
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Pass => 0,
            Verdict::Fail => 1,
            Verdict::Lacking => 3,
        }
    }

    /// The verdict a gpubake process said by its exit code (a probe in a container, a rank
    /// of a world): None for a code no verdict gives (a usage error, a crash, a signal).
    pub fn of_exit_code(code: i64) -> Option<Verdict> {
        match code {
            0 => Some(Verdict::Pass),
            1 => Some(Verdict::Fail),
            3 => Some(Verdict::Lacking),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(status: Status) -> Check {
        Check::new("phase", "name", status, "")
    }

    #[test]
    fn every_status_against_every_rule() {
        for status in [Status::Pass, Status::Skip, Status::Warn, Status::Fail] {
            for lacks in [false, true] {
                for strict in [false, true] {
                    let got = Verdict::of_statuses([Status::Pass, status], lacks, strict);
                    let want = if lacks {
                        Verdict::Lacking
                    } else if status == Status::Fail || (strict && status == Status::Warn) {
                        Verdict::Fail
                    } else {
                        Verdict::Pass
                    };
                    assert_eq!(got, want, "{status:?} lacks={lacks} strict={strict}");
                }
                assert_eq!(
                    Verdict::of(&[check(status)], lacks),
                    Verdict::of_statuses([status], lacks, false)
                );
            }
        }
    }

    #[test]
    fn exit_codes_read_back_as_the_verdict_that_gave_them() {
        for v in [Verdict::Pass, Verdict::Fail, Verdict::Lacking] {
            assert_eq!(Verdict::of_exit_code(v.exit_code().into()), Some(v));
        }
        for code in [2, 4, 124, 137, -1] {
            assert_eq!(Verdict::of_exit_code(code), None, "{code}");
        }
    }
}
