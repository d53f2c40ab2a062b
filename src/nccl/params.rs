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
    /// Inclusive upper bound.
    #[serde(default)]
    pub max: Option<i64>,
    /// The value must be a multiple of this.
    #[serde(default)]
    pub multiple_of: Option<i64>,
    /// Sentinels always accepted (auto, unset).
    #[serde(default)]
    pub special: Vec<i64>,
    /// What NCCL does with values out of bounds.
    #[serde(default)]
    pub out_of_range: Option<OutOfRange>,
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
    /// What NCCL was seen doing with out-of-range values, on which release and machine
    /// (tests/fixtures/nccl-truth.yaml); quoted in findings.
    #[serde(default)]
    pub observed: Option<String>,
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
        let nthreads = t.get("NCCL_NTHREADS").unwrap();
        assert_eq!(
            (nthreads.min, nthreads.max, nthreads.multiple_of),
            (Some(64), Some(512), Some(32))
        );
        assert!(t.get("NCCL_P2P_LEVEL").unwrap().case_sensitive);
        for (old, _) in TORCH_OLD_NAMES {
            assert!(t.get(old).is_none() && t.removed(old).is_none(), "{old}");
        }
    }
}
