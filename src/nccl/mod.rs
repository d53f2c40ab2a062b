//! What gpubake knows about NCCL, in one place: the parameter table, how NCCL parses a value
//! and reads nccl.conf, name suggestions, and which lint warnings a preset may accept.
//!
//! This module sits below `lint`, `preset`, `resolve` and `error`: they all read NCCL facts
//! from here, and nothing here depends on them.

pub mod conf;
pub mod needs;
pub mod params;
pub mod suggest;
pub mod value;

/// The lint warnings a preset setting may accept with `allow:`; errors cannot be allowed.
pub const ALLOWABLE: &[&str] = &[
    "production-risk",
    "too-new",
    "deprecated",
    "octal",
    "removed",
    "nvlink-bridge",
];

#[cfg(test)]
mod tests {
    /// The modules below the linter must not reach up into it: the linter reads presets and
    /// resolves recipes, so an import the other way would tie them in a loop again.
    #[test]
    fn lower_modules_do_not_import_the_linter() {
        let sources = [
            ("error.rs", include_str!("../error.rs")),
            ("preset.rs", include_str!("../preset.rs")),
            ("resolve/mod.rs", include_str!("../resolve/mod.rs")),
            (
                "resolve/conflict.rs",
                include_str!("../resolve/conflict.rs"),
            ),
            ("nccl/mod.rs", include_str!("mod.rs")),
            ("nccl/conf.rs", include_str!("conf.rs")),
            ("nccl/params.rs", include_str!("params.rs")),
            ("nccl/suggest.rs", include_str!("suggest.rs")),
            ("nccl/value.rs", include_str!("value.rs")),
        ];
        let needle = ["crate", "::lint"].concat();
        for (file, text) in sources {
            assert!(!text.contains(&needle), "src/{file} imports the linter");
        }
    }

    /// The error type sits below everything: it names what went wrong with plain data and
    /// imports only the NCCL knowledge (for name suggestions).
    #[test]
    fn the_error_type_imports_nothing_above_it() {
        let text = include_str!("../error.rs");
        for upper in [
            "resolve", "lint", "preset", "recipe", "image", "probe", "certify",
        ] {
            let needle = format!("crate::{upper}");
            assert!(!text.contains(&needle), "src/error.rs imports {needle}");
        }
    }
}
