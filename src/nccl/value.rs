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
