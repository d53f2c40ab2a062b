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
        Conflict {
            recipe: recipe.to_string(),
            asked: rules.iter().map(|r| r.asked.clone()).collect(),
            refused,
            refused_by,
            would_run,
        }
    }
}
