//! NCCL's parameter table, as data (`data/nccl-params.yaml`): every `NCCL_*` variable NCCL
//! reads, how it parses the value, the bounds it enforces, when it appeared, and the ones that
//! were removed.

use crate::version::Version;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::OnceLock;

const PARAMS_YAML: &str = include_str!("../../data/nccl-params.yaml");

/// Names with NCCL's prefix that NCCL never reads but PyTorch does: the old spellings of
/// PyTorch's `TORCH_NCCL_*` variables, paired with the name to write instead. ProcessGroupNCCL.hpp
/// lists each new name together with its old one, and `getCvarInt` and friends in
/// torch/csrc/distributed/c10d/Utils.hpp let the new name win and warn that the old one is
/// deprecated when they find it.
pub const TORCH_OLD_NAMES: &[(&str, &str)] = &[
    (
        "NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    ),
    ("NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT"),
    ("NCCL_DESYNC_DEBUG", "TORCH_NCCL_DESYNC_DEBUG"),
    ("NCCL_ENABLE_TIMING", "TORCH_NCCL_ENABLE_TIMING"),
    (
        "NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK",
        "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK",
    ),
];

/// The `TORCH_NCCL_*` name PyTorch reads in place of `name`, if `name` is an old one.
pub fn torch_name(name: &str) -> Option<&'static str> {
    TORCH_OLD_NAMES
        .iter()
        .find(|(old, _)| *old == name)
        .map(|(_, new)| *new)
}

/// How NCCL reads a variable's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// An integer 0/1 read with strtoll.
    Bool,
    /// An integer read with strtoll (base 0).
    Int,
    /// A byte count read with strtoll (no unit suffixes).
    Size,
    /// One token of a fixed set.
    Enum,
    /// A comma-separated list, optionally inverted with `^`.
    List,
    /// Free text.
    String,
    /// A file path.
    Path,
}

/// What NCCL does with a value outside its bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutOfRange {
    /// Moves it to the nearest bound.
    Clamp,
    /// Uses the default instead.
    Fallback,
    /// Fails communicator init.
    Reject,
    /// Ignores it silently.
    Ignore,
    /// Crashes the process.
    Crash,
}

/// A test NCCL's code applies to a value it has read, as its code writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// The value is this or less.
    AtMost(i64),
    /// The value is less than this.
    Below(i64),
    /// The value is more than this.
    Above(i64),
    /// The value is not a multiple of this.
    NotMultipleOf(i64),
    /// The value is exactly this.
    Equals(i64),
}

impl Condition {
    /// Whether `x` meets the condition.
    pub fn holds(self, x: i64) -> bool {
        match self {
            Condition::AtMost(n) => x <= n,
            Condition::Below(n) => x < n,
            Condition::Above(n) => x > n,
            Condition::NotMultipleOf(m) => m != 0 && x % m != 0,
            Condition::Equals(n) => x == n,
        }
    }

    /// The condition in words, as it reads after "the value".
    pub fn describe(self) -> String {
        match self {
            Condition::AtMost(0) => "is 0 or less".into(),
            Condition::AtMost(n) => format!("is {n} or less"),
            Condition::Below(n) => format!("is below {n}"),
            Condition::Above(n) => format!("is above {n}"),
            Condition::NotMultipleOf(m) => format!("is not a multiple of {m}"),
            Condition::Equals(n) => format!("is {n}"),
        }
    }
}

/// What NCCL's code does with a value that meets a rule's condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Effect {
    /// Keeps the value it uses when the variable is unset.
    Default,
    /// Uses this value instead.
    Use(i64),
    /// The process dies.
    Crash,
    /// Communicator creation fails.
    FailInit,
}

/// One of the tests NCCL's code applies to a knob's value, in the order it applies them: the
/// first whose condition holds decides.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// When the rule applies.
    #[serde(with = "serde_yaml::with::singleton_map")]
    pub when: Condition,
    /// What NCCL then does.
    #[serde(with = "serde_yaml::with::singleton_map")]
    pub then: Effect,
    /// A fragment of the line NCCL logs when the rule applies.
    #[serde(default)]
    pub says: Option<String>,
    /// NCCL's own line states the effect (`Limiting value to 8`), so the log shows it.
    #[serde(default)]
    pub tells: bool,
    /// A value of tests/fixtures/nccl-truth.yaml that meets this rule first and whose run
    /// shows the effect; without one the effect is what NCCL's code suggests, not observed.
    /// tests/nccl_truth.rs holds every `seen` to the fixture.
    #[serde(default)]
    pub seen: Option<String>,
}

/// A deprecation and its replacement.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deprecation {
    /// Deprecated since.
    pub since: Version,
    /// The variable to use instead.
    #[serde(default, rename = "use")]
    pub replacement: Option<String>,
}

/// One NCCL variable.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Param {
    /// `NCCL_...`.
    pub name: String,
    /// How the value parses.
    pub kind: Kind,
    /// The first NCCL version that reads it.
    pub since: Version,
    /// system, debug or internal (undocumented).
    pub doc: String,
    /// Inclusive lower bound.
    #[serde(default)]
    pub min: Option<i64>,
    /// Where `min` and `max` come from when not from NCCL's documentation.
    #[serde(default)]
    pub bounds_from: Option<String>,
    /// Inclusive upper bound.
    #[serde(default)]
    pub max: Option<i64>,
    /// The value must be a multiple of this.
    #[serde(default)]
    pub multiple_of: Option<i64>,
    /// Sentinels always accepted (auto, unset).
    #[serde(default)]
    pub special: Vec<i64>,
    /// What NCCL's code suggests it does with values outside `min`..`max`, where no `rules`
    /// say more; never observed, so findings say so.
    #[serde(default)]
    pub out_of_range: Option<OutOfRange>,
    /// NCCL keeps the value in a C `int`: a number past 32 bits wraps before any rule applies.
    #[serde(default)]
    pub c_int: bool,
    /// NCCL reads the value with its own strtol and no overflow check, not through
    /// ncclLoadParam: a number past 64 bits saturates instead of leaving the default.
    #[serde(default)]
    pub saturates: bool,
    /// Where NCCL's code applies `rules`.
    #[serde(default)]
    pub source: Option<String>,
    /// The tests NCCL applies to the value, in its order.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Tokens of an enum or list.
    #[serde(default)]
    pub values: Vec<String>,
    /// NCCL compares tokens with strcmp.
    #[serde(default)]
    pub case_sensitive: bool,
    /// An enum that also takes integers.
    #[serde(default)]
    pub legacy_int: bool,
    /// Deprecated, with its replacement.
    #[serde(default)]
    pub deprecated: Option<Deprecation>,
    /// Defined but never read.
    #[serde(default)]
    pub unused: bool,
    /// Why setting it is risky in production.
    #[serde(default)]
    pub risk: Option<String>,
    /// Only these values are risky; empty means any explicit setting.
    #[serde(default)]
    pub risk_when: Vec<String>,
    /// The value NCCL uses when the variable is unset, where it is one fixed number; setting
    /// it explicitly changes nothing, so it carries no risk.
    #[serde(default)]
    pub default: Option<i64>,
    /// A list of names NCCL matches as prefixes unless the list starts with `=` (after an
    /// optional `^`): `parseStringList` and `matchIfList` in src/misc/utils.cc.
    #[serde(default)]
    pub prefix_match: bool,
}

impl Param {
    /// The number NCCL works with once it has read `x` with strtoll: in a C `int` for the
    /// knobs that keep one.
    pub fn as_kept(&self, x: i64) -> i64 {
        if self.c_int { x as i32 as i64 } else { x }
    }

    /// The rule NCCL's code applies to the number it works with, if any: the sentinels it
    /// takes for "unset" never meet one.
    pub fn rule_for(&self, kept: i64) -> Option<&Rule> {
        if self.special.contains(&kept) {
            return None;
        }
        self.rules.iter().find(|r| r.when.holds(kept))
    }
}

/// A variable NCCL no longer reads.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Removed {
    /// `NCCL_...`.
    pub name: String,
    /// The last version that read it.
    pub last: Version,
    /// The variable that took its place.
    #[serde(default, rename = "use")]
    pub replacement: Option<String>,
    /// What it did.
    pub note: String,
}

/// The whole table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamTable {
    /// The NCCL version the table was derived from.
    pub analyzed: Version,
    /// The runs the rules' `seen` cases come from (tests/fixtures/nccl-truth.yaml).
    pub observed_on: String,
    /// Variables NCCL reads.
    pub params: Vec<Param>,
    /// Variables NCCL used to read.
    pub removed: Vec<Removed>,
    #[serde(skip)]
    index: HashMap<String, usize>,
}

impl ParamTable {
    /// The table embedded in this binary.
    pub fn embedded() -> &'static ParamTable {
        static TABLE: OnceLock<ParamTable> = OnceLock::new();
        TABLE.get_or_init(|| {
            let mut table: ParamTable = serde_yaml::from_str(PARAMS_YAML)
                .expect("data/nccl-params.yaml is checked by tests");
            table.index = table
                .params
                .iter()
                .enumerate()
                .map(|(i, p)| (p.name.clone(), i))
                .collect();
            table
        })
    }

    /// The variable `name`, if NCCL reads it.
    pub fn get(&self, name: &str) -> Option<&Param> {
        self.index.get(name).map(|&i| &self.params[i])
    }

    /// The removed variable `name`, if it was one.
    pub fn removed(&self, name: &str) -> Option<&Removed> {
        self.removed.iter().find(|r| r.name == name)
    }

    /// Every name NCCL reads or used to read, for suggestions.
    pub fn all_names(&self) -> impl Iterator<Item = &str> {
        self.params
            .iter()
            .map(|p| p.name.as_str())
            .chain(self.removed.iter().map(|r| r.name.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_loads_and_is_sane() {
        let t = ParamTable::embedded();
        assert!(t.params.len() >= 240, "{}", t.params.len());
        assert!(t.removed.len() >= 20);
        for p in &t.params {
            assert!(p.name.starts_with("NCCL_"), "{}", p.name);
            if let (Some(lo), Some(hi)) = (p.min, p.max) {
                assert!(lo <= hi, "{}: min above max", p.name);
            }
            if matches!(p.kind, Kind::Enum) {
                assert!(
                    !p.values.is_empty() || p.legacy_int,
                    "{}: enum without values",
                    p.name
                );
            }
            assert!(
                t.removed(&p.name).is_none(),
                "{} is both read and removed",
                p.name
            );
        }
        // NCCL's getNthreads: a multiple of 32 first, then the maximum, then the minimum.
        let nthreads = t.get("NCCL_NTHREADS").unwrap();
        let first = |x| nthreads.rule_for(x).map(|r| r.then);
        assert_eq!(first(4), Some(Effect::Use(512)));
        assert_eq!(first(48), Some(Effect::Use(512)));
        assert_eq!(first(1024), Some(Effect::Use(512)));
        assert_eq!(first(32), Some(Effect::Use(64)));
        assert_eq!(first(0), Some(Effect::Default));
        assert_eq!(first(256), None);
        assert_eq!(nthreads.as_kept((1 << 32) + 64), 64);
        assert!(t.get("NCCL_P2P_LEVEL").unwrap().case_sensitive);
        for (old, _) in TORCH_OLD_NAMES {
            assert!(t.get(old).is_none() && t.removed(old).is_none(), "{old}");
        }
    }
}
