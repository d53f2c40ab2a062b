//! How NCCL reads one value, and what it makes of values people commonly get wrong.
//!
//! Integer parameters go through C's `strtoll(s, NULL, 0)`: `0x10` is hex, `010` is octal,
//! `true` is 0, `4M` is 4 and trailing text is dropped without a word. [`strtoll`] mirrors that
//! so the linter can say what NCCL will really use.

use super::params::{Kind, OutOfRange, Param};
use super::{Issue, Severity, closest};
use crate::version::Version;

/// What `strtoll(text, &end, 0)` returns.
#[derive(Debug, PartialEq, Eq)]
pub struct CInt<'a> {
    /// The parsed value (clamped on overflow, 0 when nothing parsed).
    pub value: i64,
    /// The text after the last digit read.
    pub rest: &'a str,
    /// At least one digit was read.
    pub digits: bool,
    /// The base chosen from the prefix: 8, 10 or 16.
    pub base: u32,
    /// The value did not fit in 64 bits (errno = ERANGE).
    pub overflow: bool,
}

/// Parses like C's `strtoll` with base 0.
///
/// ```
/// use gpubake::lint::value::strtoll;
/// assert_eq!(strtoll("0x10").value, 16);
/// assert_eq!(strtoll("010").value, 8); // octal, as NCCL reads it
/// let word = strtoll("true");
/// assert!(!word.digits); // NCCL_P2P_DISABLE=true is 0
/// assert_eq!(strtoll("4M").rest, "M"); // NCCL_BUFFSIZE=4M is 4 bytes
/// ```
pub fn strtoll(text: &str) -> CInt<'_> {
    let s = text.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = s.to_ascii_lowercase();
    let (base, body) =
        if lower.starts_with("0x") && s[2..].starts_with(|c: char| c.is_ascii_hexdigit()) {
            (16, &s[2..])
        } else if s.starts_with('0') {
            (8, s)
        } else {
            (10, s)
        };
    let len = body.find(|c: char| !c.is_digit(base)).unwrap_or(body.len());
    if len == 0 {
        return CInt {
            value: 0,
            rest: text,
            digits: false,
            base,
            overflow: false,
        };
    }
    let magnitude = i128::from_str_radix(&body[..len], base).unwrap_or(i128::MAX);
    let signed = if negative { -magnitude } else { magnitude };
    let overflow = signed > i64::MAX as i128 || signed < i64::MIN as i128;
    CInt {
        value: signed.clamp(i64::MIN as i128, i64::MAX as i128) as i64,
        rest: &body[len..],
        digits: true,
        base,
        overflow,
    }
}

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
            None,
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
            None => format!("is outside the documented range {range}"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strtoll_matches_c() {
        assert_eq!(strtoll("42").value, 42);
        assert_eq!(strtoll("0x10").value, 16);
        let octal = strtoll("010");
        assert_eq!((octal.value, octal.base), (8, 8));
        let word = strtoll("true");
        assert!(!word.digits);
        assert_eq!(word.value, 0);
        let suffixed = strtoll("4M");
        assert_eq!((suffixed.value, suffixed.rest), (4, "M"));
        assert_eq!(strtoll("  -2").value, -2);
        let bad_octal = strtoll("08");
        assert_eq!((bad_octal.value, bad_octal.rest), (0, "8"));
        assert!(strtoll("99999999999999999999").overflow);
        assert_eq!(strtoll("0x").rest, "x");
    }
}
