//! "Did you mean ...?" for names people mistype: NCCL variables, presets, GPU models.

/// The name in `candidates` closest to `name`, if any is close enough to be a likely typo.
pub fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let key = |s: &str| s.trim_start_matches("NCCL_").to_ascii_uppercase();
    let wanted = key(name);
    candidates
        .map(|c| (strsim::damerau_levenshtein(&wanted, &key(c)), c))
        .filter(|(d, c)| *d <= (key(c).len() / 4).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}
