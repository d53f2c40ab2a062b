//! Dotted versions and the constraints written against them.
//!
//! PyTorch, CUDA, cuDNN, NCCL, Python and driver versions are all dotted numbers of different
//! lengths (`2.9`, `12.8.90`, `9.10.2.21`, `570.26`), so one small type serves them all. A bare
//! version in a constraint is a prefix (`2.9` matches `2.9.1`), as people write it in recipes.

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// A dotted numeric version; missing trailing components compare as zero. The text is kept
/// as written, since driver versions carry zero-padded parts (`450.80.02`).
#[derive(Clone, Debug, Eq)]
pub struct Version {
    parts: Vec<u64>,
    text: String,
}

impl Version {
    /// The components, most significant first.
    pub fn parts(&self) -> &[u64] {
        &self.parts
    }

    /// The first component (`12` for `12.8`).
    pub fn major(&self) -> u64 {
        self.parts[0]
    }

    /// The second component, zero when absent.
    pub fn minor(&self) -> u64 {
        self.parts.get(1).copied().unwrap_or(0)
    }

    /// True when `prefix`'s components are the leading components of `self`.
    pub fn has_prefix(&self, prefix: &Version) -> bool {
        prefix.parts.len() <= self.parts.len()
            && self.parts[..prefix.parts.len()] == prefix.parts[..]
    }
}

impl FromStr for Version {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let parts: Result<Vec<u64>, _> = text.split('.').map(str::parse::<u64>).collect();
        if let Err(e) = &parts
            && *e.kind() == std::num::IntErrorKind::PosOverflow
        {
            return Err(format!(
                "`{text}` has a number too large for a version (at most {})",
                u64::MAX
            ));
        }
        match parts {
            Ok(parts) if !parts.is_empty() => Ok(Version {
                parts,
                text: text.to_string(),
            }),
            _ => Err(format!(
                "`{text}` is not a version: expected dotted numbers such as 2.9 or 12.8.1"
            )),
        }
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let len = self.parts.len().max(other.parts.len());
        (0..len)
            .map(|i| {
                let a = self.parts.get(i).copied().unwrap_or(0);
                let b = other.parts.get(i).copied().unwrap_or(0);
                a.cmp(&b)
            })
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A comparison operator of one requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// A bare version or `2.9.*`: every version that starts with it.
    Prefix,
    Eq,
    Ne,
    Ge,
    Gt,
    Le,
    Lt,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    op: Op,
    version: Version,
}

impl Requirement {
    fn matches(&self, v: &Version) -> bool {
        match self.op {
            Op::Prefix => v.has_prefix(&self.version),
            Op::Eq => v == &self.version,
            Op::Ne => v != &self.version,
            Op::Ge => v >= &self.version,
            Op::Gt => v > &self.version && !v.has_prefix(&self.version),
            Op::Le => v <= &self.version || v.has_prefix(&self.version),
            Op::Lt => v < &self.version,
        }
    }
}

/// Requirements joined by commas, all of which must hold: `>=12.6,<13`.
///
/// ```
/// use gpubake::version::{Constraint, Version};
/// let cuda: Constraint = ">=12.6,<13".parse().unwrap();
/// assert!(cuda.matches(&"12.8".parse::<Version>().unwrap()));
/// assert!(!cuda.matches(&"13.0".parse::<Version>().unwrap()));
/// // A bare version is a prefix, as people mean it in recipes.
/// let torch: Constraint = "2.9".parse().unwrap();
/// assert!(torch.matches(&"2.9.1".parse::<Version>().unwrap()));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constraint {
    text: String,
    reqs: Vec<Requirement>,
}

impl Constraint {
    /// True when `v` satisfies every requirement.
    pub fn matches(&self, v: &Version) -> bool {
        self.reqs.iter().all(|r| r.matches(v))
    }

    /// The smallest version the constraint admits, when it names one (`>=550` gives 550).
    /// Used for floors such as a fleet's oldest driver.
    pub fn floor(&self) -> Option<Version> {
        self.reqs
            .iter()
            .filter(|r| matches!(r.op, Op::Prefix | Op::Eq | Op::Ge | Op::Gt))
            .map(|r| r.version.clone())
            .max()
    }

    /// The constraint as the user wrote it.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl FromStr for Constraint {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err(
                "empty constraint: write a version such as 2.9 or a range such as >=12.6,<13"
                    .into(),
            );
        }
        let reqs = text
            .split(',')
            .map(|part| {
                let part = part.trim();
                let (op, rest) = [
                    ("==", Op::Eq),
                    ("!=", Op::Ne),
                    (">=", Op::Ge),
                    ("<=", Op::Le),
                    (">", Op::Gt),
                    ("<", Op::Lt),
                    ("=", Op::Eq),
                ]
                .iter()
                .find_map(|(sym, op)| part.strip_prefix(sym).map(|rest| (*op, rest)))
                .unwrap_or((Op::Prefix, part));
                let rest = rest.trim();
                let (op, rest) = match rest.strip_suffix(".*") {
                    Some(stem) if matches!(op, Op::Prefix | Op::Eq) => (Op::Prefix, stem),
                    _ => (op, rest),
                };
                let version = rest.parse().map_err(|e: String| {
                    if e.contains("too large") {
                        format!("`{part}`: {e}")
                    } else {
                        format!(
                            "`{part}` is not a version requirement: use a version (2.9), \
                             an operator and a version (>=12.6), or several joined by commas"
                        )
                    }
                })?;
                Ok(Requirement { op, version })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Constraint {
            text: text.to_string(),
            reqs,
        })
    }
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for Constraint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Constraint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    fn c(s: &str) -> Constraint {
        s.parse().unwrap()
    }

    #[test]
    fn versions_compare_numerically_not_lexically() {
        assert!(v("2.10") > v("2.9"));
        assert!(v("12.8") == v("12.8.0"));
        assert!(v("9.10.2.21") > v("9.5.1.17"));
        assert!(v("570.26") < v("570.124.06"));
    }

    #[test]
    fn bare_versions_are_prefixes() {
        assert!(c("2.9").matches(&v("2.9.1")));
        assert!(!c("2.9").matches(&v("2.10.0")));
        assert!(c("2.9.*").matches(&v("2.9.0")));
        assert!(c("==2.9.1").matches(&v("2.9.1")));
        assert!(!c("==2.9.1").matches(&v("2.9.0")));
    }

    #[test]
    fn ranges_join_with_commas() {
        let range = c(">=12.6, <13");
        assert!(range.matches(&v("12.6")));
        assert!(range.matches(&v("12.9")));
        assert!(!range.matches(&v("13.0")));
        assert!(!range.matches(&v("12.4")));
        assert!(c("<=12.8").matches(&v("12.8.90")));
        assert!(!c(">12.8").matches(&v("12.8.90")));
    }

    #[test]
    fn floors_come_from_lower_bounds() {
        assert_eq!(c(">=550").floor(), Some(v("550")));
        assert_eq!(c("570.86.10").floor(), Some(v("570.86.10")));
        assert_eq!(c("<600").floor(), None);
    }

    #[test]
    fn text_is_kept_as_written() {
        assert_eq!(v("450.80.02").to_string(), "450.80.02");
        assert_eq!(v("450.80.02"), v("450.80.2"));
    }

    #[test]
    fn bad_text_is_rejected_with_a_hint() {
        assert!("".parse::<Constraint>().unwrap_err().contains("empty"));
        assert!(
            ">=abc"
                .parse::<Constraint>()
                .unwrap_err()
                .contains(">=12.6")
        );
        assert!("1..2".parse::<Version>().is_err());
    }
}
