//! The linter against NCCL itself: tests/fixtures/nccl-truth.yaml holds what NCCL 2.28.9 did
//! with each setting on two H200s (benches/nccl-truth.sh ran it; scripts/nccl-truth-fixture
//! read NCCL's own log lines). Whatever the linter says NCCL does with a value must be what
//! NCCL did:
//! - NCCL crashed or failed to start: the linter calls the value an error;
//! - NCCL ignored the value, or said it was invalid: an error;
//! - NCCL read it as something else (`true` as 0, `4M` as 4, `5` as SYS): a finding that
//!   names what NCCL read;
//! - NCCL clamped a channel count: a finding that names the count NCCL used;
//! - NCCL read it as written and ran: no error;
//! - a name NCCL does not have: a finding.
//!   Cases whose variable NCCL never read in that run (IB settings on a machine without IB)
//!   are counted as unobserved and not judged.

use gpubake::lint::{Context, Issue, Severity, check_var};
use gpubake::nccl::params::ParamTable;
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    nccl: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    value: String,
    outcome: String,
    read_as: Option<String>,
    ignored: bool,
    said: Vec<String>,
    channels: Option<u32>,
}

/// How strtoll with base 0 reads the whole text, as NCCL's integer parameters do; None when
/// it is not a whole number.
fn whole_number(text: &str) -> Option<i64> {
    let t = text.trim();
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let n = if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(hex, 16).ok()?
    } else if t.len() > 1 && t.starts_with('0') {
        i64::from_str_radix(&t[1..], 8).ok()?
    } else {
        t.parse().ok()?
    };
    Some(if neg { -n } else { n })
}

fn names_word(issues: &[Issue], word: &str) -> bool {
    issues.iter().any(|i| {
        let text = format!("{} {}", i.message, i.help.as_deref().unwrap_or(""));
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .any(|w| w == word)
    })
}

#[test]
fn the_linter_says_what_nccl_does() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nccl-truth.yaml"),
    )
    .unwrap();
    let fixture: Fixture = serde_yaml::from_str(&text).unwrap();
    let ctx = Context {
        nccl: Some(fixture.nccl.parse().unwrap()),
        nccl_from: "the fixture".into(),
        debug: false,
    };
    let table = ParamTable::embedded();
    let mut disagreements = Vec::new();
    let mut judged = 0;
    for case in &fixture.cases {
        let issues = check_var(&case.name, &case.value, &ctx);
        let errors = issues.iter().any(|i| i.severity == Severity::Error);
        let said = |what: &str| {
            format!(
                "{}={:?}: NCCL {what}; the linter said {:?}",
                case.name,
                case.value,
                issues
                    .iter()
                    .map(|i| format!("{:?}: {}", i.severity, i.message))
                    .collect::<Vec<_>>()
            )
        };
        let invalid = case.said.iter().any(|s| s.contains("Invalid"));
        let verdict: Option<Result<(), String>> = if case.outcome != "ran" {
            Some(if errors {
                Ok(())
            } else {
                Err(said(&case.outcome))
            })
        } else if case.ignored || invalid {
            Some(if errors {
                Ok(())
            } else {
                Err(said("ignored the value"))
            })
        } else if let Some(read) = case.read_as.as_deref().filter(|r| {
            *r != case.value && whole_number(r).is_none_or(|n| whole_number(&case.value) != Some(n))
        }) {
            Some(if names_word(&issues, read) {
                Ok(())
            } else {
                Err(said(&format!("read it as {read}")))
            })
        } else if let (Some(used), Some(asked)) = (
            case.channels.filter(|_| case.name.ends_with("NCHANNELS")),
            whole_number(&case.value),
        ) && (case.name == "NCCL_MIN_NCHANNELS" && i64::from(used) < asked
            || case.name == "NCCL_MAX_NCHANNELS" && i64::from(used) != asked.max(0) && asked < 1)
        {
            Some(if names_word(&issues, &used.to_string()) {
                Ok(())
            } else {
                Err(said(&format!("used {used} channels")))
            })
        } else if table.get(&case.name).is_none() {
            Some(if issues.is_empty() {
                Err(said("has no such variable"))
            } else {
                Ok(())
            })
        } else if case.read_as.is_some() {
            Some(if errors {
                Err(said("read it as written and ran"))
            } else {
                Ok(())
            })
        } else {
            None
        };
        if let Some(v) = verdict {
            judged += 1;
            if let Err(e) = v {
                disagreements.push(e);
            }
        }
    }
    eprintln!("{judged} of {} cases judged", fixture.cases.len());
    assert!(
        judged >= 40,
        "only {judged} of {} cases judged",
        fixture.cases.len()
    );
    assert!(
        disagreements.is_empty(),
        "{} of {judged} judged cases disagree with NCCL:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
}

#[test]
fn strtoll_reading_matches_nccl() {
    assert_eq!(whole_number("0x400000"), Some(4194304));
    assert_eq!(whole_number("-1"), Some(-1));
    assert_eq!(whole_number("4M"), None);
}
