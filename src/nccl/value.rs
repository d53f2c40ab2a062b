//! How NCCL turns the text of an integer variable into a number.
//!
//! Integer parameters go through C's `strtoll(s, NULL, 0)` (`ncclLoadParam` in
//! src/misc/param.cc): `0x10` is hex, `010` is octal, `true` is 0, `4M` is 4 and trailing text
//! is dropped without a word. [`strtoll`] mirrors that so the linter can say what NCCL will
//! really use.

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
/// use gpubake::nccl::value::strtoll;
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

/// The variables NCCL reads as a path level with `ncclGetLevel` (src/graph/paths.cc).
pub const PATH_LEVEL_VARS: [&str; 2] = ["NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL"];

/// NCCL's path types from nearest to farthest, as far as `ncclGetLevel` accepts them by name:
/// `topoPathTypeStr` in src/graph/topo.cc up to `PATH_SYS`. A level lets NCCL use a path of
/// that type or nearer (`path->type <= level` in `ncclTopoCheckP2p` and `ncclTopoCheckGdr`).
pub const PATH_NAMES: [&str; 10] = [
    "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS",
];

/// The levels that the numbers of NCCL's first path scale stand for: `levelsOldToNew` in
/// `ncclGetLevel`. Numbers past the end are clamped to the last entry.
pub const OLD_LEVELS: [&str; 6] = ["LOC", "PIX", "PXB", "PHB", "SYS", "SYS"];

/// What `ncclGetLevel` makes of a path level's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathLevel {
    /// One of [`PATH_NAMES`], matched exactly (strcmp: case and spaces count).
    Name(&'static str),
    /// Text that starts with a digit: read with strtol and looked up in [`OLD_LEVELS`].
    Number {
        /// The number strtol reads.
        number: i64,
        /// The level it stands for; None when it does not fit the C `int` NCCL stores it in,
        /// where what NCCL does is not defined.
        level: Option<&'static str>,
    },
    /// Anything else: NCCL ignores the variable and keeps its default.
    Ignored,
}

/// Reads a path level the way `ncclGetLevel` does.
///
/// ```
/// use gpubake::nccl::value::{path_level, PathLevel};
/// assert_eq!(path_level("NVL"), PathLevel::Name("NVL"));
/// // Numbers are the old scale: 1 is PIX, not NVL, and anything above 4 is SYS.
/// assert_eq!(path_level("9"), PathLevel::Number { number: 9, level: Some("SYS") });
/// assert_eq!(path_level("nvl"), PathLevel::Ignored);
/// ```
pub fn path_level(text: &str) -> PathLevel {
    if let Some(name) = PATH_NAMES.iter().find(|name| **name == text) {
        return PathLevel::Name(name);
    }
    if !text.starts_with(|c: char| c.is_ascii_digit()) {
        return PathLevel::Ignored;
    }
    let number = strtoll(text).value;
    let level = i32::try_from(number)
        .ok()
        .map(|n| OLD_LEVELS[(n as usize).min(OLD_LEVELS.len() - 1)]);
    PathLevel::Number { number, level }
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

    #[test]
    fn path_levels_follow_ncclgetlevel() {
        assert_eq!(path_level("SYS"), PathLevel::Name("SYS"));
        // NET and DIS are path types too, but ncclGetLevel stops at SYS.
        assert_eq!(path_level("NET"), PathLevel::Ignored);
        assert_eq!(path_level(" NVL"), PathLevel::Ignored);
        assert_eq!(path_level("-1"), PathLevel::Ignored);
        let level = |text| match path_level(text) {
            PathLevel::Number { level, .. } => level,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(level("0"), Some("LOC"));
        assert_eq!(level("1"), Some("PIX"));
        assert_eq!(level("0x3"), Some("PHB"));
        assert_eq!(level("4"), Some("SYS"));
        assert_eq!(level("5"), Some("SYS"));
        assert_eq!(level("9"), Some("SYS"));
        assert_eq!(level("99999999999"), None);
    }
}
