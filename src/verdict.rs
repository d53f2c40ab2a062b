//! One verdict for every command that judges: the status of a check, the check, and the
//! verdict (with its exit code) that a list of checks gives. lint, verify, the probe, the
//! node's CDI preflight and certify judge in these terms; certify folds the others' checks
//! into its own report unchanged. A check the probe failed also says what a fleet does about
//! it (its advice, src/probe/actions.rs).

use serde::{Deserialize, Serialize};

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
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

/// What a fleet does to a node about a failed check, mildest first: the order is the
/// severity that picks the worse of two actions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Nothing: a warning, an app's own fault, or a normal state.
    None,
    /// Run the job or the probe again; nothing on the node is known to be wrong.
    Rerun,
    /// The host's or the container's configuration (or the image) is wrong, not the GPU.
    FixConfig,
    /// Drain the GPU and reset it.
    ResetGpu,
    /// Drain the node and restart its operating system.
    Reboot,
    /// Take the node out of service for repair, field diagnostics or RMA.
    DrainAndReplace,
}

impl Action {
    /// The word reports print, as data/actions.yaml spells it.
    pub fn label(self) -> &'static str {
        match self {
            Action::None => "none",
            Action::Rerun => "rerun",
            Action::FixConfig => "fix-config",
            Action::ResetGpu => "reset-gpu",
            Action::Reboot => "reboot",
            Action::DrainAndReplace => "drain-and-replace",
        }
    }
}

/// The action for a check, the failure class it was put in, and the upstream document that
/// supports it (data/actions.yaml).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advice {
    /// What to do.
    pub action: Action,
    /// The failure class, a row of data/actions.yaml.
    pub class: String,
    /// Why, in a line: what the source says about the class.
    pub why: String,
    /// The source's URL, or `judgement` where no source gives an action.
    pub source: String,
    /// The heading in the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section: Option<String>,
    /// What a judgement leaned on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub see: Vec<String>,
    /// What to do when the failure comes back after the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate: Option<String>,
    /// For `fix-config`: the action of a fleet that knows only the other five.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Action>,
}

impl Advice {
    /// The source as a reader follows it: the URL, or the judgement and what it leaned on.
    pub fn cited(&self) -> String {
        match self.see.first() {
            Some(see) if self.source == "judgement" => format!("judgement; see {see}"),
            _ => self.source.clone(),
        }
    }

    /// One line for a report: the action, the class, why and the source.
    pub fn line(&self) -> String {
        format!(
            "action: {} ({}): {} [{}]",
            self.action.label(),
            self.class,
            self.why,
            self.cited()
        )
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
    /// What to do about it, where it failed (or warned of something with an action); left out
    /// of the JSON where there is none, so checks without it read as before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<Advice>,
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
            advice: None,
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
    fn advice_is_left_out_of_the_json_where_there_is_none() {
        let plain = serde_json::to_value(check(Status::Fail)).unwrap();
        assert_eq!(
            plain,
            serde_json::json!({"phase": "phase", "name": "name", "status": "FAIL", "detail": ""})
        );
        let mut advised = check(Status::Fail);
        advised.advice = Some(Advice {
            action: Action::FixConfig,
            class: "container_limits".into(),
            why: "small limits".into(),
            source: "https://example.org/limits".into(),
            section: None,
            see: vec![],
            escalate: None,
            fallback: Some(Action::None),
        });
        let json = serde_json::to_value(&advised).unwrap();
        assert_eq!(json["advice"]["action"], "fix-config");
        assert_eq!(json["advice"]["fallback"], "none");
        assert!(json["advice"].get("section").is_none(), "{json}");
        let back: Advice = serde_json::from_value(json["advice"].clone()).unwrap();
        assert_eq!(Some(back), advised.advice);
    }

    #[test]
    fn actions_order_by_severity_and_print_as_the_data_spells_them() {
        let all = [
            Action::None,
            Action::Rerun,
            Action::FixConfig,
            Action::ResetGpu,
            Action::Reboot,
            Action::DrainAndReplace,
        ];
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        for a in all {
            let json = serde_json::to_value(a).unwrap();
            assert_eq!(json, a.label(), "{a:?}");
        }
    }

    #[test]
    fn a_judgement_cites_what_it_leaned_on() {
        let mut a = Advice {
            action: Action::Rerun,
            class: "unclassified".into(),
            why: "no rule".into(),
            source: "judgement".into(),
            section: None,
            see: vec!["https://example.org/triage".into()],
            escalate: None,
            fallback: None,
        };
        assert_eq!(a.cited(), "judgement; see https://example.org/triage");
        a.source = "https://example.org/doc".into();
        assert_eq!(a.cited(), "https://example.org/doc");
        assert!(
            a.line()
                .starts_with("action: rerun (unclassified): no rule [")
        );
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
