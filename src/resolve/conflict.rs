//! Explaining why nothing fits: which constraint refused the builds the recipe asked for,
//! and, for each constraint, the best build that would run if only that one were relaxed.

use super::{Candidate, Rule, rank};
use crate::compat::Compat;
pub use crate::error::Conflict;

impl Conflict {
    /// Builds the explanation from the rules and all candidates.
    pub fn explain(recipe: &str, rules: &[Rule], candidates: &[Candidate]) -> Self {
        let refusals: Vec<Vec<Option<String>>> = candidates
            .iter()
            .map(|c| rules.iter().map(|r| r.refuses(c)).collect())
            .collect();
        let is_ask = |key: &str| key == "pytorch" || key == "cuda";
        let refused = candidates
            .iter()
            .zip(&refusals)
            .filter(|(_, why)| {
                rules
                    .iter()
                    .zip(why.iter())
                    .all(|(r, w)| !is_ask(r.key) || w.is_none())
            })
            .map(|(c, why)| (c.label(), why.iter().flatten().cloned().collect()))
            .collect();
        let refused_by = rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    r.asked.clone(),
                    refusals.iter().filter(|w| w[i].is_some()).count(),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        let mut would_run = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let mut fits: Vec<&Candidate> = candidates
                .iter()
                .zip(&refusals)
                .filter(|(_, why)| {
                    why[i].is_some() && why.iter().enumerate().all(|(j, w)| j == i || w.is_none())
                })
                .map(|(c, _)| c)
                .collect();
            fits.sort_by_key(|c| std::cmp::Reverse(rank(c)));
            let Some(best) = fits.first() else { continue };
            let more = if fits.len() > 2 {
                format!(" (or {} other builds)", fits.len() - 1)
            } else if fits.len() == 2 {
                format!(" (or {})", fits[1].label())
            } else {
                String::new()
            };
            let how = match rule.key {
                "pytorch" => "with another PyTorch release".to_string(),
                "cuda" => format!(
                    "with another CUDA ({} is CUDA {})",
                    best.variant.tag, best.variant.cuda
                ),
                "python" => format!("with a Python that torch {} supports", best.release.release),
                "nccl" => format!("without `{}`", rule.asked),
                // Relaxing the rule for a recipe of one GPU model would drop its only GPU:
                // no advice at all.
                "gpus" if gpu_count(&rule.asked) <= 1 => continue,
                "gpus" => "without the GPUs it has no code for".to_string(),
                "driver" => match Compat::embedded().family_floor(best.variant.cuda.major()) {
                    Some(family) => format!("on a fleet with driver >= {}", family.min_driver),
                    None => "on a newer driver".to_string(),
                },
                "glibc" => format!("on a base image with glibc >= {}", best.release.glibc),
                _ => format!("without `{}`", rule.asked),
            };
            would_run.push(format!("{how}: {} would run{more}", best.label()));
        }
        let pytorch_unknown = rules
            .iter()
            .enumerate()
            .any(|(i, r)| r.key == "pytorch" && refusals.iter().all(|why| why[i].is_some()));
        let mut known_releases: Vec<&crate::version::Version> = Vec::new();
        if pytorch_unknown {
            for c in candidates {
                if !known_releases.contains(&&c.release.release) {
                    known_releases.push(&c.release.release);
                }
            }
            known_releases.sort();
        }
        Conflict {
            recipe: recipe.to_string(),
            asked: merge_asked(rules.iter().map(|r| r.asked.as_str())),
            known_releases: known_releases.iter().map(|v| v.to_string()).collect(),
            refused,
            refused_by,
            would_run,
        }
    }
}

/// The GPU models a `gpus` rule names (`gpus a100, h100`).
fn gpu_count(asked: &str) -> usize {
    asked
        .trim_start_matches("gpus")
        .split([',', ' '])
        .filter(|g| !g.is_empty())
        .count()
}

/// The constraints as asked, one line each: the same constraint from several presets is said
/// once, naming them all (`nccl >=2.20 (presets base, nvlink)`).
fn merge_asked<'a>(asked: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut merged: Vec<(String, Vec<String>)> = Vec::new();
    for a in asked {
        let (what, by) = match a.strip_suffix(')').and_then(|t| t.rsplit_once(" (")) {
            Some((what, by)) => (what.to_string(), Some(by.to_string())),
            None => (a.to_string(), None),
        };
        match merged.iter_mut().find(|(w, _)| *w == what) {
            Some((_, bys)) => bys.extend(by),
            None => merged.push((what, by.into_iter().collect())),
        }
    }
    merged
        .into_iter()
        .map(|(what, bys)| match bys.len() {
            0 => what,
            1 => format!("{what} ({})", bys[0]),
            _ => {
                let names: Vec<&str> = bys
                    .iter()
                    .map(|b| b.strip_prefix("preset ").unwrap_or(b))
                    .collect();
                let all_presets = bys.iter().all(|b| b.starts_with("preset "));
                if all_presets {
                    format!("{what} (presets {})", names.join(", "))
                } else {
                    format!("{what} ({})", bys.join(", "))
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_constraint_from_two_presets_is_said_once() {
        let asked = merge_asked(
            [
                "pytorch 2.6",
                "nccl >=2.20 (preset base)",
                "nccl >=2.20 (preset nvlink)",
                "gpus rtx5090",
            ]
            .into_iter(),
        );
        assert_eq!(
            asked,
            [
                "pytorch 2.6",
                "nccl >=2.20 (presets base, nvlink)",
                "gpus rtx5090"
            ]
        );
        assert_eq!(gpu_count("gpus rtx5090"), 1);
        assert_eq!(gpu_count("gpus a100, h100"), 2);
    }
}
