//! How NCCL reads `nccl.conf` files, so the linter can compare what a file says with what NCCL
//! will set.
//!
//! NCCL's loader is `setEnvFile` in src/misc/param.cc, called once per process by
//! `initEnvFunc` before the first parameter is read. For each line it:
//! - drops one trailing `\n`, and since 2.30.3 one `\r` before it; older releases keep the `\r`
//!   as the last character of the value;
//! - skips the line when its very first character is `#` (since 2.26.2);
//! - skips the line when it has no `=`;
//! - takes every byte before the first `=` as the name and every byte after it as the value,
//!   verbatim: no trimming of spaces, no `export`, no quotes removed, no `$VAR` expansion, and a
//!   `# comment` after the value stays in the value. Name and value are cut to 1023 bytes;
//! - calls `setenv(name, value, 0)` (`ncclOsSetEnv` in src/os/linux.cc), which never replaces
//!   a variable that is already set. So the process environment beats every file, the first
//!   line of a file beats a later line with the same name, and `$NCCL_CONF_FILE` (or
//!   `~/.nccl.conf`), read first, beats `/etc/nccl.conf`.

use crate::version::Version;

/// The first release whose loader strips a `\r` before the end of the line.
pub const STRIPS_CR_SINCE: &str = "2.30.3";

/// The longest name or value the loader copies; it cuts the rest off.
pub const MAX_LEN: usize = 1023;

/// One line of an nccl.conf file, as NCCL's loader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// Empty or only blanks: skipped, as it has no `=`.
    Blank,
    /// A comment. NCCL skips a line that starts with `#` (since 2.26.2). Any other line whose
    /// first non-blank is `#` is skipped for having no `=`, or sets a variable whose name holds
    /// the `#`, which nothing reads; so comments have no effect in every release.
    Comment,
    /// Text without `=`: skipped.
    NoEquals(&'a str),
    /// `name=value`: NCCL sets `name` to `value` unless `name` is already set.
    Set(Setting<'a>),
}

/// A line with an `=`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting<'a> {
    /// Everything before the first `=`, spaces and all.
    pub name: &'a str,
    /// Everything after the first `=`, without a final `\r`.
    pub value: &'a str,
    /// The line ended in `\r\n`: releases before [`STRIPS_CR_SINCE`] add `\r` to the value.
    pub cr: bool,
}

/// Splits a file into numbered lines (from 1) the way NCCL's loader does: only `\n` ends a
/// line, so a `\r` from a Windows line ending stays with the line.
pub fn read(text: &str) -> impl Iterator<Item = (usize, Line<'_>)> {
    let text = text.strip_suffix('\n').unwrap_or(text);
    text.split('\n')
        .enumerate()
        .filter(|(_, line)| !(text.is_empty() && line.is_empty()))
        .map(|(i, line)| (i + 1, classify(line)))
}

fn classify(line: &str) -> Line<'_> {
    let (line, cr) = match line.strip_suffix('\r') {
        Some(rest) => (rest, true),
        None => (line, false),
    };
    if line.trim().is_empty() {
        return Line::Blank;
    }
    if line.trim_start().starts_with('#') {
        return Line::Comment;
    }
    match line.split_once('=') {
        Some((name, value)) => Line::Set(Setting { name, value, cr }),
        None => Line::NoEquals(line),
    }
}

/// Whether `nccl` drops the `\r` of a Windows line ending; None when the version is unknown.
pub fn strips_cr(nccl: Option<&Version>) -> Option<bool> {
    let since: Version = STRIPS_CR_SINCE.parse().expect("constant");
    nccl.map(|v| *v >= since)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(line: &str) -> Setting<'_> {
        match classify(line) {
            Line::Set(s) => s,
            other => panic!("{line:?} is {other:?}"),
        }
    }

    #[test]
    fn names_and_values_are_kept_verbatim() {
        let spaced = set("NCCL_DEBUG = WARN");
        assert_eq!((spaced.name, spaced.value), ("NCCL_DEBUG ", " WARN"));
        assert_eq!(set("export NCCL_X=1").name, "export NCCL_X");
        assert_eq!(set("  NCCL_X=1").name, "  NCCL_X");
        assert_eq!(set("NCCL_X=eth0 # nic").value, "eth0 # nic");
        assert_eq!(set("NCCL_X=a=b").value, "a=b");
        let crlf = set("NCCL_X=1\r");
        assert_eq!((crlf.value, crlf.cr), ("1", true));
    }

    #[test]
    fn skipped_lines() {
        assert_eq!(classify("# NCCL_DEBUG=INFO"), Line::Comment);
        assert_eq!(classify("   # note"), Line::Comment);
        assert_eq!(classify("  \r"), Line::Blank);
        assert_eq!(classify("no equals"), Line::NoEquals("no equals"));
        let lines: Vec<usize> = read("a=1\n\nb=2\n").map(|(n, _)| n).collect();
        assert_eq!(lines, [1, 2, 3]);
        assert_eq!(read("").count(), 0);
    }
}
