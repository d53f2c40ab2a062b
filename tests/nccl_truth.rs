//! The linter against NCCL itself: tests/fixtures/nccl-truth.yaml holds what NCCL 2.28.9 did
//! with each setting (benches/nccl-truth.sh ran it over the cases scripts/nccl-truth-cases
//! derives from the linter's rules, on one and on two H200s; scripts/nccl-truth-fixture read
//! NCCL's own log lines). Whatever the linter says NCCL does with a value must be what NCCL
//! did:
//! - NCCL crashed or failed to start: the linter calls the value an error;
//! - NCCL ignored the value, or said it was invalid: an error (an empty value: the finding
//!   that NCCL treats it as unset);
//! - NCCL read it as something else (`true` as 0, `4M` as 4, `5` as SYS): a finding that
//!   names what NCCL read;
//! - NCCL took another channel count than asked: a finding that names the count it used;
//! - NCCL read it as written, said nothing of it and ran: no error;
//! - a name NCCL does not have: a finding;
//! - NCCL's log names a rule (`Invalid NCCL_NTHREADS 4 (must be a multiple of 32)`): the
//!   linter applies that rule first, and where the linter applies a rule whose line NCCL
//!   logs, NCCL logged it: the order of the rules is NCCL's;
//! - every effect the parameter table states as observed (`seen`) is shown by a case of the
//!   same rule in the fixture.
//!
//! Cases whose variable NCCL never read in that run (IB settings on a machine without IB)
//! are counted as unobserved and not judged.

use gpubake::lint::{Context, Issue, Severity, check_var};
use gpubake::nccl::params::{Condition, Effect, Param, ParamTable, Rule};
use gpubake::nccl::value::strtoll;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct Fixture {
    nccl: String,
    runs: Vec<Run>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Run {
    id: String,
    defaults: Observed,
}

#[derive(Deserialize, Default)]
struct Observed {
    channels: Option<u32>,
    nthreads: Option<Vec<i64>>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    value: String,
    class: Option<String>,
    run: String,
    ranks: u32,
    outcome: String,
    read_as: Option<String>,
    ignored: bool,
    said: Vec<String>,
    channels: Option<u32>,
    nthreads: Option<Vec<i64>>,
}

fn fixture() -> Fixture {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nccl-truth.yaml"),
    )
    .unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn context(fixture: &Fixture) -> Context {
    Context {
        nccl: Some(fixture.nccl.parse().unwrap()),
        nccl_from: "the fixture".into(),
        debug: false,
    }
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

/// The rule NCCL's code applies to the case's value, as the linter's table has it: the
/// number strtoll reads, kept as NCCL keeps it. None when the text is no number NCCL keeps
/// (empty, past 64 bits).
fn rule_of<'a>(p: &'a Param, value: &str) -> Option<&'a Rule> {
    let n = strtoll(value);
    if value.trim().is_empty() || n.overflow {
        return None;
    }
    p.rule_for(p.as_kept(n.value))
}

/// Whether the case shows the rule's effect, from NCCL's own line where it states it, else
/// from what the run used.
fn shows(rule: &Rule, p: &Param, case: &Case, defaults: &Observed) -> bool {
    let logged = |n: Option<i64>| {
        rule.tells
            && case.said.iter().any(|s| {
                rule.says.as_deref().is_some_and(|says| s.contains(says))
                    && n.is_none_or(|n| s.contains(&n.to_string()))
            })
    };
    let used = |n: i64| {
        if p.name.ends_with("NTHREADS") {
            case.nthreads.as_ref().and_then(|t| t.first()) == Some(&n)
        } else if p.name.ends_with("NCHANNELS") {
            case.channels.map(i64::from) == Some(n)
        } else {
            false
        }
    };
    match rule.then {
        Effect::Use(n) => logged(Some(n)) || used(n),
        Effect::Default => {
            logged(None)
                || case.read_as.as_deref() == Some("default")
                || (p.name.ends_with("NTHREADS")
                    && case.nthreads.is_some()
                    && case.nthreads == defaults.nthreads)
                || (p.name.ends_with("NCHANNELS")
                    && case.channels.is_some()
                    && case.channels == defaults.channels)
        }
        Effect::Crash => case.outcome == "crashed",
        Effect::FailInit => case.outcome == "init-failed",
    }
}

#[test]
fn the_linter_says_what_nccl_does() {
    let fixture = fixture();
    let ctx = context(&fixture);
    let table = ParamTable::embedded();
    let mut disagreements = Vec::new();
    let mut judged = 0;
    let mut classes: BTreeMap<String, usize> = BTreeMap::new();
    for case in &fixture.cases {
        // A case's class: how the value is written, then which tests it fails.
        let class = case
            .class
            .as_deref()
            .unwrap_or("example")
            .replace(" [2 ranks]", "");
        let (written, fails) = class.split_once("; ").unwrap_or((&class, "-"));
        *classes.entry(format!("written {written}")).or_default() += 1;
        *classes.entry(format!("fails {fails}")).or_default() += 1;
        let issues = check_var(&case.name, &case.value, &ctx);
        let errors = issues.iter().any(|i| i.severity == Severity::Error);
        let said = |what: &str| {
            format!(
                "{}={:?} ({}): NCCL {what}; the linter said {:?}",
                case.name,
                case.value,
                case.run,
                issues
                    .iter()
                    .map(|i| format!("{:?}: {}", i.severity, i.message))
                    .collect::<Vec<_>>()
            )
        };
        let asked = whole_number(&case.value);
        let p = table.get(&case.name);
        let kept = p.zip(asked).map(|(p, n)| p.as_kept(n));
        let rule = p.and_then(|p| rule_of(p, &case.value));
        // NCCL called it invalid, or logged the line of one of its rules for it.
        let invalid = case.said.iter().any(|s| s.contains("Invalid"))
            || p.is_some_and(|p| {
                p.rules.iter().any(|r| {
                    r.says
                        .as_deref()
                        .is_some_and(|says| case.said.iter().any(|s| s.contains(says)))
                })
            });
        let special = p.zip(kept).is_some_and(|(p, k)| p.special.contains(&k));
        let run_defaults = fixture
            .runs
            .iter()
            .find(|r| r.id == case.run)
            .map(|r| &r.defaults);
        let none = Observed::default();
        let verdict: Option<Result<(), String>> = if case.outcome != "ran" {
            Some(if errors {
                Ok(())
            } else {
                Err(said(&case.outcome))
            })
        } else if case.value.is_empty() && p.is_some() {
            // NCCL skips an empty value (ncclLoadParam: strlen > 0) and keeps its default.
            Some(if issues.iter().any(|i| i.code == "empty") {
                Ok(())
            } else {
                Err(said("treated the empty value as unset"))
            })
        } else if case.ignored || invalid {
            Some(if errors {
                Ok(())
            } else {
                Err(said("ignored the value"))
            })
        } else if let Some(read) = case
            .read_as
            .as_deref()
            .filter(|r| *r != case.value && whole_number(r).is_none_or(|n| asked != Some(n)))
        {
            Some(if names_word(&issues, read) {
                Ok(())
            } else {
                Err(said(&format!("read it as {read}")))
            })
        } else if let (Some(rule), Some(p)) = (rule, p) {
            // A rule NCCL logs nothing for: judged where the run shows its effect (the thread
            // or channel count it took); the order test holds the rules NCCL does log.
            let visible = case.nthreads.is_some() && p.name.ends_with("NTHREADS")
                || case.channels.is_some() && p.name.ends_with("NCHANNELS")
                || matches!(rule.then, Effect::Crash | Effect::FailInit) && case.ranks >= 2;
            visible.then(|| {
                if shows(rule, p, case, run_defaults.unwrap_or(&none)) && errors {
                    Ok(())
                } else {
                    Err(said(&format!(
                        "ran ({:?} channels, {:?} threads)",
                        case.channels, case.nthreads
                    )))
                }
            })
        } else if let (Some(used), Some(asked)) = (
            case.channels
                .filter(|_| case.name.ends_with("NCHANNELS") && !special),
            kept,
        ) && (case.name == "NCCL_MIN_NCHANNELS" && i64::from(used) < asked
            || case.name == "NCCL_MAX_NCHANNELS" && i64::from(used) != asked.max(0) && asked < 1)
        {
            Some(if names_word(&issues, &used.to_string()) {
                Ok(())
            } else {
                Err(said(&format!("used {used} channels")))
            })
        } else if p.is_none() {
            Some(if issues.is_empty() {
                Err(said("has no such variable"))
            } else {
                Ok(())
            })
        } else if case.read_as.is_some() && kept == asked {
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
    eprintln!(
        "{judged} of {} cases judged; cases per class:",
        fixture.cases.len()
    );
    for (class, n) in &classes {
        eprintln!("  {n:5}  {class}");
    }
    assert!(fixture.cases.len() >= 150, "{} cases", fixture.cases.len());
    assert!(
        judged >= 900,
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

/// Where NCCL's log names a rule, the linter's first rule for the value is that rule; where
/// the linter's first rule is one NCCL logs and NCCL read the variable, NCCL logged it.
#[test]
fn the_rules_apply_in_nccl_s_order() {
    let fixture = fixture();
    let table = ParamTable::embedded();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for case in &fixture.cases {
        let Some(p) = table.get(&case.name).filter(|p| !p.rules.is_empty()) else {
            continue;
        };
        if case.outcome != "ran" || case.read_as.is_none() {
            continue;
        }
        let mine = rule_of(p, &case.value);
        let logged: Vec<&Rule> = p
            .rules
            .iter()
            .filter(|r| {
                r.says
                    .as_deref()
                    .is_some_and(|says| case.said.iter().any(|s| s.contains(says)))
            })
            .collect();
        checked += 1;
        match (mine, logged.first()) {
            (Some(r), Some(l)) if std::ptr::eq(r, *l) => {}
            (Some(r), None) if r.says.is_none() => {}
            (None, None) => {}
            (mine, logged) => wrong.push(format!(
                "{}={:?} ({}): NCCL logged {:?}; the linter applies {:?}",
                case.name,
                case.value,
                case.run,
                logged.map(|r| r.when),
                mine.map(|r| r.when)
            )),
        }
    }
    eprintln!("{checked} cases of knobs with rules checked against NCCL's log");
    assert!(checked >= 100, "{checked}");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// An effect the table states as observed has a case of the same rule in the fixture that
/// shows it; and no case of a rule's class contradicts a stated crash.
#[test]
fn every_stated_effect_has_a_case_that_shows_it() {
    let fixture = fixture();
    let table = ParamTable::embedded();
    let defaults: BTreeMap<&str, &Observed> = fixture
        .runs
        .iter()
        .map(|r| (r.id.as_str(), &r.defaults))
        .collect();
    let none = Observed::default();
    let mut missing = Vec::new();
    let mut stated = 0;
    for p in &table.params {
        for rule in &p.rules {
            if rule.then == Effect::Crash {
                // One rank uses no buffer: only runs of two ranks or more can contradict.
                for case in fixture.cases.iter().filter(|c| {
                    c.name == p.name
                        && c.outcome == "ran"
                        && c.ranks >= 2
                        && rule_of(p, &c.value).is_some_and(|r| std::ptr::eq(r, rule))
                }) {
                    missing.push(format!(
                        "{}={:?} ran on {}, but the table says NCCL crashes",
                        p.name, case.value, case.run
                    ));
                }
            }
            let Some(seen) = &rule.seen else { continue };
            stated += 1;
            let shown = fixture.cases.iter().any(|c| {
                c.name == p.name
                    && c.value == *seen
                    && rule_of(p, &c.value).is_some_and(|r| std::ptr::eq(r, rule))
                    && shows(rule, p, c, defaults.get(c.run.as_str()).unwrap_or(&&none))
            });
            if !shown {
                missing.push(format!(
                    "{} {:?} -> {:?}: no case {seen:?} of this rule shows it",
                    p.name, rule.when, rule.then
                ));
            }
        }
    }
    eprintln!("{stated} stated effects checked");
    assert!(stated >= 8, "{stated}");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// The five lines of a widely copied preset, each said as NCCL 2.28.9 handles it.
#[test]
fn the_seed_preset_is_explained_as_nccl_does() {
    let fixture = fixture();
    let ctx = context(&fixture);
    let text = |name: &str, value: &str| {
        check_var(name, value, &ctx)
            .iter()
            .map(|i| format!("{:?} {}: {}", i.severity, i.code, i.message))
            .collect::<Vec<_>>()
            .join("\n")
    };
    // NCCL logged `Invalid NCCL_NTHREADS 4 (must be a multiple of 32)`, and with 100, of the
    // same rule, ran 512 threads on two H200s.
    let nthreads = text("NCCL_NTHREADS", "4");
    assert!(
        nthreads.contains("not-a-multiple")
            && nthreads.contains("must be a multiple of 32")
            && nthreads.contains("uses 512 instead (observed")
            && !nthreads.contains("64 instead"),
        "{nthreads}"
    );
    let case = fixture
        .cases
        .iter()
        .find(|c| c.name == "NCCL_NTHREADS" && c.value == "4")
        .expect("the fixture has NCCL_NTHREADS=4");
    assert!(
        case.said
            .iter()
            .any(|s| s.contains("must be a multiple of 32"))
    );
    // 4 is a number of channels NCCL takes as it is.
    let channels = text("NCCL_MIN_NCHANNELS", "4");
    assert!(!channels.contains("Error"), "{channels}");
    for (name, value) in [
        ("NCCL_ALGO", "Ring"),
        ("NCCL_PROTO", "Simple"),
        ("NCCL_P2P_LEVEL", "PIX"),
    ] {
        let said = text(name, value);
        assert!(!said.contains("Error"), "{name}={value}: {said}");
        let case = fixture
            .cases
            .iter()
            .find(|c| c.name == name && c.value == value)
            .expect("in the fixture");
        assert_eq!(case.read_as.as_deref(), Some(value), "{name}={value}");
    }
    // `8MB` is 8: said as read, then what NCCL does with 8, which no run has tried.
    let buffsize = text("NCCL_BUFFSIZE", "8MB");
    assert!(
        buffsize.contains("as 8 and drops `MB`")
            && buffsize.contains("NCCL_BUFFSIZE=8 (what NCCL makes of `8MB`)")
            && buffsize.contains("not observed"),
        "{buffsize}"
    );
    // 4 is below 8, where NCCL died on two H200s.
    let four = text("NCCL_BUFFSIZE", "4");
    assert!(
        four.contains("crashes (observed with NCCL_BUFFSIZE=0"),
        "{four}"
    );
    let thousand = text("NCCL_BUFFSIZE", "1000");
    assert!(
        !thousand.contains("crashes") && thousand.contains("not observed"),
        "{thousand}"
    );
}

#[test]
fn rules_without_a_case_are_said_as_the_code_suggests() {
    let table = ParamTable::embedded();
    for p in &table.params {
        for rule in p.rules.iter().filter(|r| r.seen.is_none()) {
            let x = match rule.when {
                Condition::AtMost(n) => n,
                Condition::Below(n) => n - 1,
                Condition::Above(n) => n + 1,
                Condition::NotMultipleOf(m) => m + 1,
                Condition::Equals(n) => n,
            };
            if !p.rule_for(x).is_some_and(|r| std::ptr::eq(r, rule)) {
                continue;
            }
            let issues = check_var(&p.name, &x.to_string(), &Context::default());
            assert!(
                issues
                    .iter()
                    .any(|i| i.message.contains("suggests") && i.message.contains("not observed")),
                "{}={x}: {:?}",
                p.name,
                issues.iter().map(|i| &i.message).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn strtoll_reading_matches_nccl() {
    assert_eq!(whole_number("0x400000"), Some(4194304));
    assert_eq!(whole_number("-1"), Some(-1));
    assert_eq!(whole_number("4M"), None);
}

/// benches/nccl-truth-cases.txt is what scripts/nccl-truth-cases derives from today's table,
/// and the fixture has a case of every integer knob and of every knob a shipped preset sets.
#[test]
fn the_cases_cover_every_knob_and_follow_the_table() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("python3")
        .arg(root.join("scripts/nccl-truth-cases"))
        .output()
        .expect("python3 runs scripts/nccl-truth-cases");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = std::fs::read_to_string(root.join("benches/nccl-truth-cases.txt")).unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout) == committed,
        "benches/nccl-truth-cases.txt is stale: run scripts/nccl-truth-cases > benches/nccl-truth-cases.txt"
    );
    let fixture = fixture();
    let has = |name: &str| fixture.cases.iter().any(|c| c.name == name);
    let table = ParamTable::embedded();
    let integer = table.params.iter().filter(|p| {
        matches!(
            p.kind,
            gpubake::nccl::params::Kind::Bool
                | gpubake::nccl::params::Kind::Int
                | gpubake::nccl::params::Kind::Size
        )
    });
    let missing: Vec<&str> = integer
        .map(|p| p.name.as_str())
        .filter(|n| *n != "NCCL_NVLS_ENABLE" && !has(n))
        .collect();
    assert!(missing.is_empty(), "no case of {missing:?}");
    for preset in std::fs::read_dir(root.join("env-presets")).unwrap() {
        let text = std::fs::read_to_string(preset.unwrap().path()).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        for (name, _) in doc["env"].as_mapping().into_iter().flatten() {
            let name = name.as_str().unwrap();
            assert!(
                !name.starts_with("NCCL_")
                    || has(name)
                    || gpubake::nccl::params::torch_name(name).is_some(),
                "no case of {name}, which a preset sets"
            );
        }
    }
}
