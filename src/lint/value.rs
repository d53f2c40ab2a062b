//! Checks one value the way NCCL reads it, and says what NCCL makes of values people commonly
//! get wrong. The parsing itself lives in [`crate::nccl::value`].

use super::{Issue, Severity};
use crate::nccl::params::{Kind, OutOfRange, Param};
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

/// Checks an integer-valued parameter (bool, int, size).
pub fn check_integer(p: &Param, value: &str) -> Vec<Issue> {
    let name = &p.name;
    let n = strtoll(value);
    if !n.digits {
        let help = match p.kind {
            Kind::Bool => Some("write 1 to turn it on or 0 to turn it off".to_string()),
            _ => Some("write a plain integer".to_string()),
        };
        return vec![issue(
            Severity::Error,
            "not-a-number",
            format!("{name}=`{value}` is not a number: NCCL parses it as 0"),
            help,
        )];
    }
    if n.overflow {
        return vec![issue(
            Severity::Error,
            "overflow",
            format!(
                "{name}=`{value}` does not fit in 64 bits: NCCL ignores it and keeps its default"
            ),
            Some("write a smaller number, or drop the variable to keep the default".into()),
        )];
    }
    let mut out = Vec::new();
    if !n.rest.is_empty() {
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
                n.value, n.rest
            ),
            help,
        ));
        return out;
    }
    let digits = value.trim_start().trim_start_matches(['+', '-']);
    if n.base == 8 && digits.len() > 1 {
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
    let x = n.value;
    if p.special.contains(&x) {
        return out;
    }
    if p.kind == Kind::Bool && x != 0 && x != 1 {
        let what = if p.name == "NCCL_P2P_DISABLE" {
            "acts only when exactly 1".to_string()
        } else {
            format!("takes 0 or 1; {x} is not a documented value")
        };
        out.push(issue(
            Severity::Warning,
            "bool-range",
            format!("{name} {what}"),
            Some("write 0 or 1".into()),
        ));
        return out;
    }
    let below = p.min.filter(|&lo| x < lo);
    let above = p.max.filter(|&hi| x > hi);
    if let Some(bound) = below.or(above) {
        let range = match (p.min, p.max) {
            (Some(lo), Some(hi)) => format!("{lo}..{hi}"),
            (Some(lo), None) => format!(">= {lo}"),
            (None, Some(hi)) => format!("<= {hi}"),
            (None, None) => unreachable!("a bound matched"),
        };
        let effect = match p.out_of_range {
            Some(OutOfRange::Clamp) => format!("is outside {range}: NCCL clamps it to {bound}"),
            Some(OutOfRange::Fallback) => {
                format!("is outside {range}: NCCL falls back to its default")
            }
            Some(OutOfRange::Reject) => format!("is outside {range}: NCCL refuses it at init"),
            Some(OutOfRange::Ignore) => format!("is outside {range}: NCCL ignores it"),
            Some(OutOfRange::Crash) => format!("is outside {range}: NCCL crashes"),
            None => format!("is outside the documented range {range}"),
        };
        let effect = match &p.observed {
            Some(seen) => format!("{effect} ({seen})"),
            None => effect,
        };
        let severity = if p.out_of_range.is_some() {
            Severity::Error
        } else {
            Severity::Warning
        };
        out.push(issue(
            severity,
            "out-of-range",
            format!("{name}={x} {effect}"),
            Some(format!("a value in {range}{}", multiple_hint(p))),
        ));
        return out;
    }
    if let Some(m) = p.multiple_of.filter(|&m| m > 0 && x % m != 0) {
        let effect = match p.out_of_range {
            Some(OutOfRange::Fallback) | None => "NCCL falls back to its default".to_string(),
            Some(OutOfRange::Clamp) => format!("NCCL uses {} instead", p.max.unwrap_or(x)),
            Some(OutOfRange::Reject) => "NCCL refuses it at init".to_string(),
            Some(OutOfRange::Ignore) => "NCCL ignores it".to_string(),
            Some(OutOfRange::Crash) => "NCCL crashes".to_string(),
        };
        out.push(issue(
            Severity::Error,
            "not-a-multiple",
            format!("{name}={x} is not a multiple of {m}: {effect}"),
            Some(format!(
                "{} or {}",
                x - x.rem_euclid(m),
                x - x.rem_euclid(m) + m
            )),
        ));
    }
    out
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
    rest.split(',')
        .filter(|entry| entry.starts_with(['^', '=']))
        .map(|entry| {
            issue(
                Severity::Error,
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
