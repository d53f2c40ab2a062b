//! Lints `nccl.conf` files. First it reports every place where the text and NCCL's reading of
//! it differ (see [`crate::nccl::conf`] for how NCCL reads the file); then it checks each
//! setting as its writer evidently meant it, like a setting from any other source, so that
//! fixing the line does not uncover new findings one at a time.

use super::{Context, FileReport, Finding, Issue, LintOptions, Severity, check_var, place};
use crate::document::Document;
use crate::error::Location;
use crate::nccl::conf::{self, Line, MAX_LEN, STRIPS_CR_SINCE, Setting};
use crate::nccl::params::{Kind, ParamTable};
use crate::nccl::value::strtoll;
use crate::preset::parse_allow_comment;
use crate::version::Version;
use std::collections::HashMap;

/// Lints NCCL's own config format.
pub(super) fn lint_nccl_conf(doc: &Document, opts: &LintOptions) -> FileReport {
    let ctx = Context {
        nccl: opts.nccl.clone(),
        nccl_from: "given with --nccl".into(),
        debug: false,
    };
    let file = doc.name().to_string();
    let at = |line: usize, column: usize| Location {
        file: file.clone(),
        line: Some(line),
        column: Some(column),
    };
    let mut findings = Vec::new();
    let mut first_seen: HashMap<&str, (usize, &str)> = HashMap::new();
    let mut crlf_reported = false;
    // The warnings the preset behind a baked file accepted, recorded in comments by
    // `MergedEnv::nccl_conf`, so that this lint agrees with lint of the recipe.
    let allowed: HashMap<&str, Vec<String>> = doc
        .text()
        .lines()
        .filter_map(parse_allow_comment)
        .map(|(name, codes)| {
            let codes = codes
                .into_iter()
                .filter(|c| crate::nccl::ALLOWABLE.contains(c));
            (name, codes.map(String::from).collect())
        })
        .collect();
    let no_allow = Vec::new();
    for (number, line) in conf::read(doc.text()) {
        let setting = match line {
            Line::Blank | Line::Comment => continue,
            Line::NoEquals(text) => {
                findings.push(finding(
                    at(number, 1),
                    None,
                    Issue {
                        severity: Severity::Warning,
                        code: "no-equals",
                        message: format!("NCCL skips this line: it has no `=` (`{text}`)"),
                        help: Some("write NAME=value".into()),
                    },
                ));
                continue;
            }
            Line::Set(setting) => setting,
        };
        if setting.cr && !crlf_reported {
            crlf_reported = true;
            let issue = crlf(ctx.nccl.as_ref(), setting.value);
            findings.extend(issue.map(|i| finding(at(number, 1), None, i)));
        }
        // setenv(name, value, 0) leaves a variable alone once it is set, so the first line wins.
        if let Some((first_line, first_value)) = first_seen.get(setting.name) {
            findings.push(finding(
                at(number, 1),
                Some(setting.name),
                Issue {
                    severity: Severity::Warning,
                    code: "duplicate",
                    message: format!(
                        "{} is already set on line {first_line} (`{first_value}`): NCCL keeps \
                         that first value and ignores this line, and a value in the process \
                         environment beats both",
                        setting.name
                    ),
                    help: Some("delete one of the two lines".into()),
                },
            ));
            continue;
        }
        first_seen.insert(setting.name, (number, setting.value));
        let (mut issues, meant_name, meant_value) = differences(&setting);
        issues.extend(check_var(meant_name, meant_value, &ctx));
        let spots = (at(number, 1), at(number, setting.name.len() + 2));
        let allow = allowed.get(meant_name).unwrap_or(&no_allow);
        findings.extend(place(issues, spots, meant_name, allow));
    }
    FileReport {
        file: doc.name().to_string(),
        kind: "nccl.conf",
        nccl: opts.nccl.as_ref().map(Version::to_string),
        findings,
        unreadable: false,
    }
}

fn finding(at: Location, var: Option<&str>, issue: Issue) -> Finding {
    Finding {
        severity: issue.severity,
        code: issue.code,
        at,
        var: var.map(str::to_string),
        via: None,
        message: issue.message,
        help: issue.help,
    }
}

/// A `\r` before each `\n`: releases before 2.30.3 keep it at the end of every value.
fn crlf(nccl: Option<&Version>, example: &str) -> Option<Issue> {
    let (severity, who) = match (nccl, conf::strips_cr(nccl)) {
        (_, Some(true)) => return None,
        (Some(v), _) => (Severity::Error, format!("NCCL {v}")),
        (None, _) => (Severity::Warning, format!("NCCL before {STRIPS_CR_SINCE}")),
    };
    Some(Issue {
        severity,
        code: "crlf",
        message: format!(
            "this file has Windows line endings (`\\r\\n`): {who} keeps the `\\r` as the last \
             character of every value, so `{example}` here reaches NCCL as `{example}\\r`"
        ),
        help: Some("convert the file to Unix line endings (dos2unix)".into()),
    })
}

/// Where NCCL's reading of a line differs from what its writer evidently meant, and the name
/// and value as meant. NCCL takes the bytes around the first `=` verbatim (`setEnvFile` in
/// src/misc/param.cc), unlike a shell.
fn differences<'a>(setting: &Setting<'a>) -> (Vec<Issue>, &'a str, &'a str) {
    let Setting { name, value, .. } = *setting;
    let mut issues = Vec::new();
    let trimmed = name.trim();
    let exported = trimmed
        .strip_prefix("export")
        .filter(|rest| rest.starts_with([' ', '\t']))
        .map(str::trim_start);
    let meant_name = exported.unwrap_or(trimmed);
    // `NAME = value` puts spaces on both sides of `=`.
    let mut meant_value = if name.ends_with([' ', '\t']) {
        value.trim_start()
    } else {
        value
    };
    let plain_name = !meant_name.is_empty() && !meant_name.contains([' ', '\t']);
    if meant_name != name && plain_name {
        let (code, why) = match exported {
            Some(_) => ("export", "NCCL does not know `export`".to_string()),
            None => (
                "name-spaces",
                "NCCL takes every byte before `=` as the name, spaces included".to_string(),
            ),
        };
        issues.push(Issue {
            severity: Severity::Error,
            code,
            message: format!(
                "{why}: this line sets a variable named `{name}`, which nothing reads, so it \
                 has no effect"
            ),
            help: Some(format!("write `{meant_name}={meant_value}`")),
        });
    }
    let quoted = ['"', '\''].into_iter().find(|q| {
        meant_value.len() >= 2 && meant_value.starts_with(*q) && meant_value.ends_with(*q)
    });
    if quoted.is_some() {
        let inner = &meant_value[1..meant_value.len() - 1];
        issues.push(Issue {
            severity: Severity::Error,
            code: "quoted",
            message: format!(
                "NCCL does not remove quotes: {meant_name} is `{meant_value}`, quotes included"
            ),
            help: Some(format!("write `{meant_name}={inner}`")),
        });
        meant_value = inner;
    }
    if let Some(start) = inline_comment(meant_value) {
        let kind = ParamTable::embedded().get(meant_name).map(|p| p.kind);
        let kept = &meant_value[start..];
        let before = meant_value[..start].trim_end();
        let number = strtoll(before);
        let numeric = matches!(kind, Some(Kind::Bool | Kind::Int | Kind::Size))
            && number.digits
            && number.rest.is_empty();
        issues.push(Issue {
            // strtoll stops at the space, so a number still reads right; any other value
            // carries the comment into NCCL.
            severity: if numeric {
                Severity::Warning
            } else {
                Severity::Error
            },
            code: "inline-comment",
            message: if numeric {
                format!(
                    "NCCL keeps `{kept}` as part of the value: {meant_name} is `{meant_value}`, \
                     of which NCCL reads the number {before} and drops the rest"
                )
            } else {
                format!(
                    "NCCL keeps `{kept}` as part of the value: {meant_name} is `{meant_value}`, \
                     comment included"
                )
            },
            help: Some(format!(
                "move the comment to a line of its own and write `{meant_name}={before}`"
            )),
        });
        meant_value = before;
    }
    if let Some(reference) = shell_variable(meant_value) {
        issues.push(Issue {
            severity: Severity::Warning,
            code: "no-expansion",
            message: format!(
                "NCCL does not expand `{reference}`: {meant_name} gets the text as written"
            ),
            help: Some("write the value itself".into()),
        });
    }
    if value.len() > MAX_LEN {
        issues.push(Issue {
            severity: Severity::Error,
            code: "too-long",
            message: format!(
                "NCCL keeps only the first {MAX_LEN} bytes of a value; this one has {}",
                value.len()
            ),
            help: Some("shorten the value".into()),
        });
    }
    (issues, meant_name, meant_value)
}

/// Where a `# comment` after the value starts: a `#` after a space or tab.
fn inline_comment(value: &str) -> Option<usize> {
    value
        .char_indices()
        .find(|&(i, c)| c == '#' && value[..i].ends_with([' ', '\t']))
        .map(|(i, _)| i)
}

/// The first shell variable reference in a value, such as `$HOME` or `${HOME}`.
fn shell_variable(value: &str) -> Option<&str> {
    let start = value.find('$')?;
    let rest = &value[start + 1..];
    let len = if rest.starts_with('{') {
        rest.find('}').map_or(rest.len(), |end| end + 1)
    } else if rest.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len())
    } else {
        return None;
    };
    Some(&value[start..=start + len])
}
