//! Checks one value the way NCCL reads it, and says what NCCL makes of values people commonly
//! get wrong. The parsing itself lives in [`crate::nccl::value`].

use super::{Issue, Severity};
use crate::nccl::params::{Condition, Effect, Kind, OutOfRange, Param, ParamTable, Rule};
use crate::nccl::suggest::closest;
use crate::nccl::value::{OLD_LEVELS, PathLevel, path_level, strtoll};
use crate::version::Version;

/// Byte-size suffixes people write and NCCL does not read.
fn unit_multiplier(rest: &str) -> Option<i64> {
    match rest.trim().to_ascii_lowercase().as_str() {
        "k" | "kb" | "kib" => Some(1 << 10),
        "m" | "mb" | "mib" => Some(1 << 20),
        "g" | "gb" | "gib" => Some(1 << 30),
        _ => None,
    }
}

fn issue(severity: Severity, code: &'static str, message: String, help: Option<String>) -> Issue {
    Issue {
        severity,
        code,
        message,
        help,
    }
}

/// Checks an integer-valued parameter (bool, int, size) in the order NCCL handles it: how
/// strtoll reads the text, the C `int` some knobs keep it in, then the rules NCCL's code
/// applies to that number. Where reading changes the number, the findings go on to say what
/// NCCL does with the number it really has (`8MB` is 8; `abc` is 0).
pub fn check_integer(p: &Param, value: &str) -> Vec<Issue> {
    let name = &p.name;
    let n = strtoll(value);
    let mut out = Vec::new();
    if n.overflow && !p.saturates {
        // ncclLoadParam sees ERANGE, logs "Invalid value ... using default" and keeps the default.
        out.push(issue(
            Severity::Error,
            "overflow",
            format!(
                "{name}=`{value}` does not fit in 64 bits: NCCL logs `Invalid value {value} for \
                 {name}, using default` and keeps its default"
            ),
            Some("write a smaller number, or drop the variable to keep the default".into()),
        ));
        return out;
    }
    if n.overflow {
        out.push(issue(
            Severity::Error,
            "overflow",
            format!(
                "{name}=`{value}` does not fit in 64 bits: NCCL reads it with strtol, which \
                 gives {}",
                n.value
            ),
            Some("write a smaller number, or drop the variable to keep the default".into()),
        ));
    }
    if !n.digits {
        let help = match p.kind {
            Kind::Bool => Some("write 1 to turn it on or 0 to turn it off".to_string()),
            _ => Some("write a plain integer".to_string()),
        };
        out.push(issue(
            Severity::Error,
            "not-a-number",
            format!("{name}=`{value}` is not a number: NCCL parses it as 0"),
            help,
        ));
    } else if !n.rest.trim().is_empty() {
        let help = match (p.kind, unit_multiplier(n.rest)) {
            (Kind::Size, Some(unit)) => Some(format!(
                "NCCL takes plain byte counts: write {}",
                n.value.saturating_mul(unit)
            )),
            _ => Some(format!("write {}", n.value)),
        };
        out.push(issue(
            Severity::Error,
            "trailing-text",
            format!(
                "NCCL reads {name}=`{value}` as {} and drops `{}`",
                n.value,
                n.rest.trim_end()
            ),
            help,
        ));
    }
    let digits = value.trim_start().trim_start_matches(['+', '-']);
    if n.digits
        && n.base == 8
        && digits.len() > 1
        && digits.as_bytes().get(1).is_some_and(|b| b.is_ascii_digit())
    {
        out.push(issue(
            Severity::Warning,
            "octal",
            format!("NCCL reads {name}=`{value}` as octal: it means {}", n.value),
            Some(format!(
                "write {} without the leading zero if you meant decimal",
                digits.trim_start_matches('0')
            )),
        ));
    }
    let kept = p.as_kept(n.value);
    if kept != n.value {
        out.push(issue(
            Severity::Error,
            "c-int",
            format!(
                "NCCL keeps {name} in a 32-bit int: {} becomes {kept}",
                n.value
            ),
            Some("write a number below 2147483648".into()),
        ));
    }
    // Say which number the rest is about when it is not the text as written.
    let shown = if value.trim() == kept.to_string() {
        format!("{name}={kept}")
    } else {
        format!("{name}={kept} (what NCCL makes of `{value}`)")
    };
    out.extend(consequence(p, kept, &shown));
    out
}

/// What NCCL does with the number it works with: the first of the knob's rules that applies,
/// else the documented bounds, which no run has tested.
fn consequence(p: &Param, x: i64, shown: &str) -> Option<Issue> {
    if p.special.contains(&x) {
        return None;
    }
    if p.kind == Kind::Bool && x != 0 && x != 1 {
        let what = if p.name == "NCCL_P2P_DISABLE" {
            "acts only when exactly 1".to_string()
        } else {
            format!("takes 0 or 1; {x} is not a documented value")
        };
        return Some(issue(
            Severity::Warning,
            "bool-range",
            format!("{} {what}", p.name),
            Some("write 0 or 1".into()),
        ));
    }
    if let Some(rule) = p.rule_for(x) {
        return Some(rule_issue(p, rule, x, shown));
    }
    documented_bounds(p, x, shown)
}

fn effect_words(effect: Effect) -> String {
    match effect {
        Effect::Default => "ignores it and keeps its default".into(),
        Effect::Use(n) => format!("uses {n} instead"),
        Effect::Crash => "crashes".into(),
        Effect::FailInit => "fails to create the communicator".into(),
    }
}

/// The finding for a value a rule applies to: the effect said as fact only where the fixture
/// has a run that shows it (`seen`, checked by tests/nccl_truth.rs).
fn rule_issue(p: &Param, rule: &Rule, x: i64, shown: &str) -> Issue {
    let name = &p.name;
    let effect = effect_words(rule.then);
    let logs = rule
        .says
        .as_deref()
        .map(|s| format!(" NCCL logs `…{s}…`;"))
        .unwrap_or_default();
    let evidence = match &rule.seen {
        Some(seen) => format!(
            "NCCL {effect} (observed with {name}={seen}, {})",
            ParamTable::embedded().observed_on
        ),
        None => format!(
            "NCCL's code ({}) suggests it {effect}; not observed",
            p.source.as_deref().unwrap_or("its source")
        ),
    };
    let code = match rule.when {
        Condition::NotMultipleOf(_) => "not-a-multiple",
        Condition::Equals(_) => "fails-init",
        _ => "out-of-range",
    };
    let help = match (rule.when, rule.then) {
        (Condition::NotMultipleOf(m), _) => {
            let down = x - x.rem_euclid(m);
            if down < m {
                format!("{m}, or a larger multiple of {m}")
            } else {
                format!("{down} or {}", down + m)
            }
        }
        (_, Effect::Use(n)) => format!("write {n} if that is what you want, or drop it"),
        _ => "drop the variable to keep NCCL's default".into(),
    };
    issue(
        Severity::Error,
        code,
        format!("{shown} {}:{logs} {evidence}", rule.when.describe()),
        Some(help),
    )
}

/// Bounds from NCCL's documentation or gpubake's own floor, where the table has no rule from
/// NCCL's code: a warning, with what the code suggests, never an observed effect.
fn documented_bounds(p: &Param, x: i64, shown: &str) -> Option<Issue> {
    let below = p.min.filter(|&lo| x < lo);
    let above = p.max.filter(|&hi| x > hi);
    let not_multiple = p.multiple_of.filter(|&m| m > 0 && x % m != 0);
    if below.is_none() && above.is_none() && not_multiple.is_none() {
        return None;
    }
    let range = match (p.min, p.max) {
        (Some(lo), Some(hi)) => format!("{lo}..{hi}"),
        (Some(lo), None) => format!(">= {lo}"),
        (None, Some(hi)) => format!("<= {hi}"),
        (None, None) => String::new(),
    };
    let (code, what) = match not_multiple {
        Some(m) if below.is_none() && above.is_none() => {
            ("not-a-multiple", format!("is not a multiple of {m}"))
        }
        _ => (
            "out-of-range",
            match &p.bounds_from {
                Some(from) => format!("is outside {range} ({from})"),
                None => format!("is outside the documented range {range}"),
            },
        ),
    };
    let suggests = match p.out_of_range {
        Some(OutOfRange::Clamp) => "clamps it".to_string(),
        Some(OutOfRange::Fallback) => "falls back to its default".into(),
        Some(OutOfRange::Reject) => "refuses it at init".into(),
        Some(OutOfRange::Ignore) => "ignores it".into(),
        Some(OutOfRange::Crash) => "crashes".into(),
        None => String::new(),
    };
    let effect = if suggests.is_empty() {
        "what NCCL does with it was not observed".to_string()
    } else {
        format!("NCCL's code suggests it {suggests}; not observed")
    };
    let help = if range.is_empty() {
        format!("a multiple of {}", p.multiple_of.unwrap_or(1))
    } else {
        format!("a value in {range}{}", multiple_hint(p))
    };
    Some(issue(
        Severity::Warning,
        code,
        format!("{shown} {what}: {effect}"),
        Some(help),
    ))
}

fn multiple_hint(p: &Param) -> String {
    p.multiple_of
        .map(|m| format!(", a multiple of {m}"))
        .unwrap_or_default()
}

/// Matches one token against a parameter's allowed tokens. Tokens like `MAX:<N>` in the
/// table take a number after their prefix.
fn check_token(p: &Param, token: &str, what: &str) -> Option<Issue> {
    let name = &p.name;
    let token = token.trim();
    if token.is_empty() {
        return Some(issue(
            Severity::Error,
            "empty-entry",
            format!("{name} has an empty {what} (a stray separator)"),
            Some(format!("one of: {}", p.values.join(", "))),
        ));
    }
    let templated = |v: &str| {
        v.split_once('<').is_some_and(|(prefix, _)| {
            token.len() > prefix.len()
                && token[..prefix.len()].eq_ignore_ascii_case(prefix)
                && token[prefix.len()..].bytes().all(|b| b.is_ascii_digit())
        })
    };
    if p.values.iter().any(|v| v == token || templated(v)) {
        return None;
    }
    if let Some(canon) = p.values.iter().find(|v| v.eq_ignore_ascii_case(token)) {
        return p.case_sensitive.then(|| {
            issue(
                Severity::Error,
                "case",
                format!("NCCL compares {name} case-sensitively: `{token}` matches nothing and is ignored"),
                Some(format!("write `{canon}`")),
            )
        });
    }
    let suggestion = closest(token, p.values.iter().map(String::as_str))
        .map(|s| format!(" (did you mean `{s}`?)"))
        .unwrap_or_default();
    Some(issue(
        Severity::Error,
        "unknown-value",
        format!("{name}: `{token}` is not a {what} NCCL knows{suggestion}"),
        Some(format!("one of: {}", p.values.join(", "))),
    ))
}

/// Checks an enum parameter: one token (or `|`-joined flags).
pub fn check_enum(p: &Param, value: &str) -> Vec<Issue> {
    if p.legacy_int {
        let n = strtoll(value);
        if n.digits && n.rest.is_empty() {
            return check_integer(p, value);
        }
    }
    if p.values.is_empty() {
        return Vec::new();
    }
    value
        .split('|')
        .filter_map(|t| check_token(p, t, "value"))
        .collect()
}

/// Checks NCCL_P2P_LEVEL or NCCL_NET_GDR_LEVEL the way `ncclGetLevel` (src/graph/paths.cc)
/// reads them: a level name compared exactly, or a number on the old level scale.
pub fn check_path_level(p: &Param, value: &str) -> Vec<Issue> {
    let name = &p.name;
    match path_level(value) {
        PathLevel::Name(_) => Vec::new(),
        PathLevel::Number { number, level } => {
            let scale = OLD_LEVELS[..OLD_LEVELS.len() - 1]
                .iter()
                .enumerate()
                .map(|(i, l)| format!("{i} {l}"))
                .collect::<Vec<_>>()
                .join(", ");
            let (means, help) = match level {
                Some(level) => (
                    format!("{name}={value} means {level}"),
                    Some(format!("write {level}")),
                ),
                None => (
                    format!("{number} does not fit the C int NCCL keeps the number in"),
                    Some("write a level name such as PXB".to_string()),
                ),
            };
            vec![issue(
                Severity::Warning,
                "legacy-level",
                format!(
                    "NCCL reads a number here on its old level scale ({scale}, and every \
                     larger number the same as 4): {means}; NCCL's documentation discourages numbers"
                ),
                help,
            )]
        }
        // Not a name and not a number: a wrong case, stray spaces or a typo. NCCL ignores the
        // variable and keeps its default; say why where the token checks can.
        PathLevel::Ignored => check_token(p, value, "value")
            .map(|i| vec![i])
            .unwrap_or_else(|| {
                vec![issue(
                    Severity::Error,
                    "unknown-value",
                    format!(
                        "NCCL compares {name} exactly, spaces included: `{value}` matches no \
                         level, so NCCL ignores it"
                    ),
                    Some(format!("write `{}`", value.trim())),
                )]
            }),
    }
}

/// Checks a list of names that NCCL matches as prefixes (NCCL_IB_HCA, NCCL_SOCKET_IFNAME).
/// NCCL looks for `^` and then `=` only at the very start of the whole list (the callers of
/// `parseStringList`, such as `ncclOsFindInterfaces` in src/os/linux.cc); anywhere else they
/// are part of a name, which then matches no device.
pub fn check_prefix_list(p: &Param, value: &str) -> Vec<Issue> {
    let rest = value.strip_prefix('^').unwrap_or(value);
    let rest = rest.strip_prefix('=').unwrap_or(rest);
    // NCCL keeps every byte of an entry (`parseStringList`): spaces and a `# comment` become
    // part of the name, which no device has. With NCCL_SOCKET_IFNAME=`lo # bootstrap`,
    // NCCL 2.28.9 found no interface and communicator creation failed (tests/fixtures/
    // nccl-truth.yaml).
    let spaced: Vec<Issue> = rest
        .split(',')
        .filter(|entry| entry.contains(char::is_whitespace) || entry.contains('#'))
        .map(|entry| {
            issue(
                Severity::Error,
                "list-syntax",
                format!(
                    "{}: NCCL takes `{entry}` whole as a name, spaces and `#` included; no \
                     device is named so, and with no match NCCL finds no interface and fails \
                     at init",
                    p.name
                ),
                Some(format!(
                    "write `{}`",
                    entry.split('#').next().unwrap_or("").trim()
                )),
            )
        })
        .collect();
    if !spaced.is_empty() {
        return spaced;
    }
    // A misplaced `^` only drops an exclusion from a list that names what to take anyway; a
    // misplaced `=` makes the name match nothing, which can leave NCCL no interface at all.
    // NCCL 2.28.9 ran with NCCL_SOCKET_IFNAME=`lo,^docker` (tests/fixtures/nccl-truth.yaml).
    rest.split(',')
        .filter(|entry| entry.starts_with(['^', '=']))
        .map(|entry| {
            issue(
                if entry.starts_with('^') {
                    Severity::Warning
                } else {
                    Severity::Error
                },
                "list-syntax",
                format!(
                    "{}: NCCL reads `^` and `=` only at the start of the whole list; here \
                     `{entry}` is taken as a name, which matches nothing",
                    p.name
                ),
                Some("start the list with `^` (exclude), then `=` (exact names), once: `=mlx5_0,mlx5_1` or `^=docker0`".into()),
            )
        })
        .collect()
}

/// The collectives NCCL_ALGO and NCCL_PROTO may name per function (NCCL 2.24+).
const COLLECTIVES: [&str; 5] = [
    "Broadcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "AllReduce",
];
const PER_FUNCTION_SINCE: &str = "2.24";

/// Checks a list parameter: `a,b`, `^a,b`, and for NCCL_ALGO/NCCL_PROTO the per-function form
/// `list;func:list`.
pub fn check_list(p: &Param, value: &str, nccl: Option<&Version>) -> Vec<Issue> {
    if p.values.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let per_function = p.name == "NCCL_ALGO" || p.name == "NCCL_PROTO";
    let groups: Vec<&str> = if per_function {
        value.split(';').collect()
    } else {
        vec![value]
    };
    for (i, group) in groups.iter().enumerate() {
        let mut list = *group;
        if per_function && let Some((func, rest)) = group.split_once(':') {
            list = rest;
            if !COLLECTIVES
                .iter()
                .any(|c| c.eq_ignore_ascii_case(func.trim()))
            {
                out.push(issue(
                    Severity::Error,
                    "unknown-collective",
                    format!("{}: `{}` is not a collective", p.name, func.trim()),
                    Some(format!("one of: {}", COLLECTIVES.join(", "))),
                ));
            }
        } else if i > 0 {
            out.push(issue(
                Severity::Error,
                "list-syntax",
                format!(
                    "{}: every entry after `;` needs a collective, as in `AllReduce:Ring`",
                    p.name
                ),
                None,
            ));
        }
        let list = list.trim().strip_prefix('^').unwrap_or(list.trim());
        out.extend(
            list.split(',')
                .filter_map(|t| check_token(p, t, "list entry")),
        );
    }
    let since: Version = PER_FUNCTION_SINCE.parse().expect("constant");
    let per_function_form = groups.len() > 1 || (per_function && value.contains(':'));
    if per_function_form && let Some(v) = nccl.filter(|v| **v < since) {
        out.push(issue(
            Severity::Error,
            "list-syntax",
            format!(
                "{}: the per-function form needs NCCL {since}; NCCL {v} refuses it",
                p.name
            ),
            Some("a plain comma list, such as `Ring,Tree`".into()),
        ));
    }
    out
}

/// The networks NCCL has built in; a plugin may add others under its own name.
const BUILTIN_NETS: [&str; 2] = ["IB", "Socket"];

/// Checks NCCL_NET: NCCL compares it with each network's name, ignoring case (`socket` ran
/// on NCCL 2.28.9), and fails communicator creation when none matches ("Failed to initialize
/// any NET plugin" for `Sockets`). A plugin may bring any name, so only near-misses of the
/// built-in names are called errors.
pub fn check_net(p: &Param, value: &str) -> Vec<Issue> {
    let v = value.trim();
    if BUILTIN_NETS.iter().any(|b| b.eq_ignore_ascii_case(v)) {
        return Vec::new();
    }
    let lowered: Vec<String> = BUILTIN_NETS
        .iter()
        .map(|b| b.to_ascii_lowercase())
        .collect();
    match closest(&v.to_ascii_lowercase(), lowered.iter().map(String::as_str)) {
        Some(near) => {
            let name = BUILTIN_NETS
                .iter()
                .find(|b| b.eq_ignore_ascii_case(near))
                .copied()
                .unwrap_or(near);
            vec![issue(
                Severity::Error,
                "unknown-value",
                format!(
                    "{}: no network is named `{v}`: NCCL fails to create the communicator \
                     (did you mean `{name}`?)",
                    p.name
                ),
                Some(format!("write `{name}`")),
            )]
        }
        None => Vec::new(),
    }
}

#[cfg(test)]
mod net_tests {
    use super::*;
    use crate::nccl::params::ParamTable;

    #[test]
    fn only_near_misses_of_builtin_networks_are_errors() {
        let p = ParamTable::embedded().get("NCCL_NET").unwrap();
        assert!(check_net(p, "Socket").is_empty());
        assert!(check_net(p, "socket").is_empty());
        assert!(check_net(p, "IB").is_empty());
        assert_eq!(check_net(p, "Sockets")[0].severity, Severity::Error);
        assert!(check_net(p, "AWS Libfabric").is_empty());
        assert!(check_net(p, "IBext_v8").is_empty());
    }
}
