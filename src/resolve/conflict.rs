//! Explaining why nothing fits: which constraint refused the builds the recipe asked for,
//! and, for each constraint, the best build that would run if only that one were relaxed.

use super::{Candidate, Rule, rank};
use crate::compat::Compat;
use serde::Serialize;
use std::fmt;

/// A resolution that found no build, explained.
#[derive(Debug, Serialize)]
pub struct Conflict {
    /// The recipe file.
    pub recipe: String,
    /// Every constraint, as asked.
    pub asked: Vec<String>,
    /// The builds matching the recipe's PyTorch and CUDA asks, each with what refused it.
    pub refused: Vec<(String, Vec<String>)>,
    /// How many builds each constraint refused.
    pub refused_by: Vec<(String, usize)>,
    /// What would run with one constraint relaxed.
    pub would_run: Vec<String>,
}

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

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: no PyTorch build meets every constraint",
            self.recipe
        )?;
        writeln!(f, "  asked: {}", self.asked.join("; "))?;
        if self.refused.is_empty() {
            writeln!(f, "  no build matches the PyTorch and CUDA asks at all:")?;
            for (asked, n) in &self.refused_by {
                writeln!(f, "    {asked} refuses {n} builds")?;
            }
        } else {
            // Reasons name the build they refuse; several builds of one release often share
            // one (a Python range), so each is said once.
            let mut said: Vec<&str> = Vec::new();
            for reason in self.refused.iter().flat_map(|(_, why)| why) {
                if !said.contains(&reason.as_str()) {
                    said.push(reason);
                }
            }
            for reason in said.iter().take(8) {
                writeln!(f, "  {reason}")?;
            }
            if said.len() > 8 {
                writeln!(f, "  ... and {} more reasons", said.len() - 8)?;
            }
        }
        if self.would_run.is_empty() {
            write!(
                f,
                "  relaxing any single constraint is not enough; see `gpubake compat`"
            )?;
        } else {
            write!(f, "  what would run instead:")?;
            for line in &self.would_run {
                write!(f, "\n    - {line}")?;
            }
        }
        Ok(())
    }
}
