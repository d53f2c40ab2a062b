//! Which of a package's wheels an installer takes for a target interpreter and platform.
//!
//! A closure for one platform may list several wheels of one package that all fit: uv writes
//! every compatible file, and on a new glibc both `manylinux2014_x86_64` and
//! `manylinux2014_x86_64.manylinux_2_17_x86_64` wheels of a release fit. pip and uv rank the
//! wheels by the PEP 425 tags of the target, most specific first (packaging's `sys_tags`
//! order), a wheel counting as its best tag; a tie goes to the higher build tag. gpubake
//! takes the same wheel.

use std::collections::HashMap;

/// A target interpreter and platform, as a closure's inputs name them (`3.12`,
/// `x86_64-manylinux_2_39`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    python: (u32, u32),
    machine: String,
    glibc: (u32, u32),
}

/// One wheel's standing among a package's wheels for a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rank {
    /// The wheel's best tag (`cp312-cp312-manylinux_2_17_x86_64`).
    pub tag: String,
    /// Its place in the target's tag order, 1 for the most specific.
    pub place: usize,
    /// Its build tag, when the file name has one.
    pub build: Option<String>,
}

impl Target {
    /// The target of CPython `python` (`3.12`) on `platform` (`x86_64-manylinux_2_39`), or
    /// None for a platform that is not a manylinux one.
    pub fn parse(python: &str, platform: &str) -> Option<Target> {
        let (major, minor) = python.split_once('.')?;
        let python = (major.parse().ok()?, minor.parse().ok()?);
        let (machine, libc) = platform.split_once('-')?;
        let (gmajor, gminor) = libc.strip_prefix("manylinux_")?.split_once('_')?;
        Some(Target {
            python,
            machine: machine.to_string(),
            glibc: (gmajor.parse().ok()?, gminor.parse().ok()?),
        })
    }

    /// The platform tags the target runs, most specific first: every manylinux glibc from the
    /// target's down, each legacy alias right after the glibc it stands for, then `linux`.
    fn platforms(&self) -> Vec<String> {
        let m = &self.machine;
        let old_x86 = matches!(m.as_str(), "x86_64" | "i686");
        // manylinux starts at glibc 2.5 on x86, at 2.17 elsewhere.
        let oldest = if old_x86 { 5 } else { 17 };
        let mut out = Vec::new();
        if self.glibc.0 == 2 {
            for minor in (oldest..=self.glibc.1).rev() {
                out.push(format!("manylinux_2_{minor}_{m}"));
                let legacy = match minor {
                    17 => Some("manylinux2014"),
                    12 if old_x86 => Some("manylinux2010"),
                    5 if old_x86 => Some("manylinux1"),
                    _ => None,
                };
                if let Some(l) = legacy {
                    out.push(format!("{l}_{m}"));
                }
            }
        }
        out.push(format!("linux_{m}"));
        out
    }

    /// Every tag the target runs, in installer order (packaging's `cpython_tags` then
    /// `compatible_tags`, as pip and uv generate them).
    pub fn tags(&self) -> Vec<String> {
        let platforms = self.platforms();
        let (major, minor) = self.python;
        let cp = format!("cp{major}{minor}");
        let mut out = Vec::new();
        for abi in [cp.as_str(), "abi3", "none"] {
            out.extend(platforms.iter().map(|p| format!("{cp}-{abi}-{p}")));
        }
        for older in (2..minor).rev() {
            out.extend(
                platforms
                    .iter()
                    .map(|p| format!("cp{major}{older}-abi3-{p}")),
            );
        }
        let mut interpreters = vec![format!("py{major}{minor}"), format!("py{major}")];
        interpreters.extend((0..minor).rev().map(|m| format!("py{major}{m}")));
        for py in &interpreters {
            out.extend(platforms.iter().map(|p| format!("{py}-none-{p}")));
        }
        out.push(format!("{cp}-none-any"));
        out.extend(interpreters.iter().map(|py| format!("{py}-none-any")));
        out
    }
}

/// The parts of a wheel file name: its build tag and its expanded tag triples.
fn file_tags(file_name: &str) -> Option<(Option<String>, Vec<String>)> {
    let stem = file_name.strip_suffix(".whl")?;
    let parts: Vec<&str> = stem.split('-').collect();
    let (build, py, abi, plat) = match parts.as_slice() {
        [_, _, py, abi, plat] => (None, py, abi, plat),
        [_, _, build, py, abi, plat] => (Some(build.to_string()), py, abi, plat),
        _ => return None,
    };
    let mut tags = Vec::new();
    for p in py.split('.') {
        for a in abi.split('.') {
            for x in plat.split('.') {
                tags.push(format!("{p}-{a}-{x}"));
            }
        }
    }
    Some((build, tags))
}

/// The build tag's sort key, as the wheel spec orders it: its leading digits as a number,
/// then the rest as text; no build tag sorts first.
fn build_key(build: &Option<String>) -> (Option<u64>, String) {
    match build {
        None => (None, String::new()),
        Some(b) => {
            let digits: String = b.chars().take_while(char::is_ascii_digit).collect();
            (digits.parse().ok(), b[digits.len()..].to_string())
        }
    }
}

/// The installer's choice among `file_names` for `target`: the index of the wheel it takes
/// with its rank, and the rank of every file that fits. None when none fits.
pub fn choose(file_names: &[String], target: &Target) -> Option<(usize, Vec<(usize, Rank)>)> {
    let order: HashMap<String, usize> = target
        .tags()
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, i))
        .collect();
    let mut fits: Vec<(usize, Rank)> = Vec::new();
    for (i, name) in file_names.iter().enumerate() {
        let Some((build, tags)) = file_tags(name) else {
            continue;
        };
        if let Some((place, tag)) = tags
            .iter()
            .filter_map(|t| order.get(t).map(|p| (*p, t)))
            .min()
        {
            fits.push((
                i,
                Rank {
                    tag: tag.clone(),
                    place: place + 1,
                    build,
                },
            ));
        }
    }
    // The most specific tag first; among equals, the higher build tag; then the file's order.
    let best = fits
        .iter()
        .min_by(|(a, ra), (b, rb)| {
            ra.place
                .cmp(&rb.place)
                .then_with(|| build_key(&rb.build).cmp(&build_key(&ra.build)))
                .then_with(|| a.cmp(b))
        })?
        .0;
    Some((best, fits))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(python: &str, platform: &str) -> Target {
        Target::parse(python, platform).unwrap()
    }

    #[test]
    fn the_legacy_alias_ranks_right_after_its_glibc() {
        let p = t("3.12", "x86_64-manylinux_2_39").platforms();
        let at = |s: &str| p.iter().position(|x| x == s).unwrap();
        assert_eq!(p[0], "manylinux_2_39_x86_64");
        assert_eq!(at("manylinux2014_x86_64"), at("manylinux_2_17_x86_64") + 1);
        assert_eq!(p.last().unwrap(), "linux_x86_64");
        let arm = t("3.12", "aarch64-manylinux_2_28").platforms();
        assert!(arm.contains(&"manylinux2014_aarch64".to_string()));
        assert!(!arm.iter().any(|x| x.contains("manylinux_2_16")));
    }

    #[test]
    fn the_more_specific_wheel_wins_and_then_the_higher_build() {
        let target = t("3.12", "x86_64-manylinux_2_39");
        let names = [
            "a-1-py3-none-manylinux2014_x86_64.whl",
            "a-1-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            "a-1-py3-none-win_amd64.whl",
        ]
        .map(String::from);
        let (best, fits) = choose(&names, &target).unwrap();
        assert_eq!(best, 1);
        assert_eq!(fits.len(), 2);
        assert_eq!(fits[1].1.tag, "py3-none-manylinux_2_17_x86_64");
        let builds = [
            "torch-2.10.0-cp312-cp312-manylinux_2_28_x86_64.whl",
            "torch-2.10.0-3-cp312-cp312-manylinux_2_28_x86_64.whl",
        ]
        .map(String::from);
        assert_eq!(choose(&builds, &target).unwrap().0, 1);
        // A build tag never beats a more specific tag.
        let mixed = [
            "b-1-7-py3-none-any.whl",
            "b-1-cp312-cp312-manylinux_2_28_x86_64.whl",
        ]
        .map(String::from);
        assert_eq!(choose(&mixed, &target).unwrap().0, 1);
        assert!(choose(&names[2..], &target).is_none());
    }

    #[test]
    fn build_tags_compare_by_number_first() {
        assert!(build_key(&Some("10".into())) > build_key(&Some("9b".into())));
        assert!(build_key(&Some("1".into())) > build_key(&None));
    }
}
