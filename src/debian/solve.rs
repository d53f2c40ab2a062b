//! Which packages `apt-get install --no-install-recommends ASKS` would add to a base, and at
//! which versions, decided the way apt decides them rather than by a general solver:
//!
//! - each package has one candidate, its highest version across all sources (every source at
//!   apt's default priority); an installed version as new or newer is kept;
//! - a dependency already met by what is installed, or chosen so far, is left alone; else the
//!   first alternative whose candidate meets it is installed, a virtual name through the
//!   candidates that provide it (Provides, versioned ones for versioned dependencies);
//! - Pre-Depends count as Depends; Recommends and Suggests are not followed;
//! - Conflicts and Breaks between what would be installed refuse the whole ask (apt would
//!   remove a package; gpubake does not remove what the base has).
//!
//! A SAT solver (resolvo) would also find answers apt never gives (an older version to dodge
//! a conflict); the image must hold what apt in the base would have installed.

use super::packages::{MultiArch, Package};
use crate::error::{Error, Result};
use debian_control::lossy::Relation;
use debian_control::relations::VersionConstraint;
use debversion::Version;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;

/// One package asked for: `NAME` (its candidate) or `NAME=VERSION`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The package or virtual package name.
    pub name: String,
    /// The exact version asked for, if any.
    pub version: Option<Version>,
}

impl FromStr for Ask {
    type Err = Error;

    fn from_str(text: &str) -> Result<Ask> {
        let text = text.trim();
        let (name, version) = match text.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (text, None),
        };
        // Debian policy 5.6.1: lower-case letters, digits, + - . and at least two characters.
        let good = name.len() >= 2
            && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c));
        if !good {
            return Err(Error::Usage(format!(
                "`{text}`: `{name}` is not a Debian package name (lower-case letters, digits, \
                 + - .)"
            )));
        }
        let version = version
            .map(|v| {
                v.parse().map_err(|e: debversion::ParseError| {
                    Error::Usage(format!("`{text}`: `{v}` is not a Debian version: {e}"))
                })
            })
            .transpose()?;
        Ok(Ask {
            name: name.to_string(),
            version,
        })
    }
}

impl fmt::Display for Ask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.version {
            Some(v) => write!(f, "{}={v}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

/// A package to install, fixed to one file of one archive.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Pin {
    /// `Package`.
    pub name: String,
    /// `Version`.
    pub version: String,
    /// `Architecture`.
    pub architecture: String,
    /// `Filename`, relative to `base`.
    pub filename: String,
    /// `Size` in bytes.
    pub size: u64,
    /// `SHA256`, lower-case hex.
    pub sha256: String,
    /// The archive's base URI; the `.deb` is at `BASE/FILENAME`.
    pub base: String,
    /// The version the base has installed, when this pin upgrades (or replaces) it.
    pub replaces: Option<String>,
    /// The source package, where its name is not the binary's.
    pub source: Option<String>,
}

/// Everything the choice reads, indexed once.
struct World<'a> {
    native: &'a str,
    installed: HashMap<&'a str, Vec<&'a Package>>,
    /// Archive versions by name, highest first (an earlier source first among equals).
    available: HashMap<&'a str, Vec<&'a Package>>,
    /// Virtual name to the archive packages that provide it, with the provided version.
    provided: HashMap<&'a str, Vec<(&'a Package, Option<&'a Version>)>>,
    installed_provided: HashMap<&'a str, Vec<(&'a Package, Option<&'a Version>)>>,
}

type Selected<'a> = BTreeMap<&'a str, &'a Package>;

/// The choice so far: what is chosen, and which of it the user asked for (apt never
/// unchooses those to make room).
struct State<'a> {
    selected: Selected<'a>,
    asked: BTreeSet<&'a str>,
}

/// Why a package cannot be installed: the path of dependencies from the ask, and the reason
/// at its end.
struct Failure {
    path: Vec<String>,
    reason: String,
}

fn version_ok(constraint: &Option<(VersionConstraint, Version)>, have: &Version) -> bool {
    use std::cmp::Ordering::*;
    let Some((op, want)) = constraint else {
        return true;
    };
    let order = have.cmp(want);
    match op {
        VersionConstraint::LessThan => order == Less,
        VersionConstraint::LessThanEqual => order != Greater,
        VersionConstraint::Equal => order == Equal,
        VersionConstraint::GreaterThanEqual => order != Less,
        VersionConstraint::GreaterThan => order == Greater,
    }
}

fn group_text(group: &[Relation]) -> String {
    group
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// apt's order among several providers of one virtual name: Essential first, then by
/// Priority, then by name (apt's last resort is its cache order, which is by name for an
/// archive's sorted index).
fn provider_rank(p: &Package) -> (bool, u8, &str) {
    let priority = match p.priority.as_deref() {
        Some("required") => 0,
        Some("important") => 1,
        Some("standard") => 2,
        Some("optional") => 3,
        _ => 4,
    };
    (!p.essential, priority, p.name.as_str())
}

impl<'a> World<'a> {
    fn new(installed: &'a [Package], available: &'a [Package], native: &'a str) -> World<'a> {
        let mut world = World {
            native,
            installed: HashMap::new(),
            available: HashMap::new(),
            provided: HashMap::new(),
            installed_provided: HashMap::new(),
        };
        for p in installed {
            world.installed.entry(&p.name).or_default().push(p);
            for (name, v) in provides(p) {
                world
                    .installed_provided
                    .entry(name)
                    .or_default()
                    .push((p, v));
            }
        }
        for p in available {
            world.available.entry(&p.name).or_default().push(p);
        }
        for versions in world.available.values_mut() {
            // Stable: among equal versions the first source read stays first.
            versions.sort_by(|a, b| b.version.cmp(&a.version));
        }
        for p in available {
            if world.candidate(&p.name).is_some_and(|c| std::ptr::eq(c, p)) {
                for (name, v) in provides(p) {
                    world.provided.entry(name).or_default().push((p, v));
                }
            }
        }
        world
    }

    /// The archive's candidate for `name`: its highest version there.
    fn candidate(&self, name: &str) -> Option<&'a Package> {
        self.available.get(name).and_then(|v| v.first().copied())
    }

    /// True when the base already has `p`'s name at `p`'s version or newer, so apt would
    /// keep what is there.
    fn kept(&self, p: &Package) -> bool {
        self.installed
            .get(p.name.as_str())
            .is_some_and(|v| v.iter().any(|i| i.version >= p.version))
    }

    /// Whether `rel` names `p` itself, by name, version and architecture qualifier.
    fn names(&self, rel: &Relation, p: &Package) -> bool {
        p.name == rel.name && version_ok(&rel.version, &p.version) && self.arch_ok(rel, p, false)
    }

    /// Whether `p`, providing `rel.name` at `provided`, meets `rel`: an unversioned
    /// dependency is met by any Provides, a versioned one only by a versioned Provides.
    fn provides_for(&self, rel: &Relation, p: &Package, provided: Option<&Version>) -> bool {
        let version = match (&rel.version, provided) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(_), Some(v)) => version_ok(&rel.version, v),
        };
        version && self.arch_ok(rel, p, true)
    }

    /// The architecture rules of a dependency on `p`: plain names want this machine's
    /// architecture (or `all`, or a Multi-Arch: foreign package); `:any` wants Multi-Arch:
    /// allowed (or, through Provides, foreign); `:native` and `:ARCH` name the architecture.
    fn arch_ok(&self, rel: &Relation, p: &Package, via_provides: bool) -> bool {
        let native = p.architecture == self.native || p.architecture == "all";
        match rel.archqual.as_deref() {
            None => native || p.multi_arch == MultiArch::Foreign,
            Some("any") => {
                p.multi_arch == MultiArch::Allowed
                    || (via_provides && p.multi_arch == MultiArch::Foreign)
            }
            Some("native") => native,
            Some(arch) => p.architecture == arch || (arch == self.native && native),
        }
    }

    /// The packages present once `selected` is installed over the base: a selected version
    /// replaces the installed one of its name.
    fn present(&self, name: &str, selected: &Selected<'a>) -> Vec<&'a Package> {
        match selected.get(name) {
            Some(p) => vec![*p],
            None => self.installed.get(name).cloned().unwrap_or_default(),
        }
    }

    fn met(&self, rel: &Relation, selected: &Selected<'a>) -> bool {
        if self
            .present(&rel.name, selected)
            .iter()
            .any(|p| self.names(rel, p))
        {
            return true;
        }
        let installed = self.installed_provided.get(rel.name.as_str());
        if installed
            .into_iter()
            .flatten()
            .any(|(p, v)| !selected.contains_key(p.name.as_str()) && self.provides_for(rel, p, *v))
        {
            return true;
        }
        selected
            .values()
            .any(|p| provides(p).any(|(name, v)| name == rel.name && self.provides_for(rel, p, v)))
    }

    /// What apt would install to meet `rel`, in the order it would try them.
    fn targets(&self, rel: &Relation) -> Vec<&'a Package> {
        let mut out = Vec::new();
        if let Some(c) = self.candidate(&rel.name)
            && self.names(rel, c)
            && !self.kept(c)
        {
            out.push(c);
        }
        let mut providers: Vec<&'a Package> = self
            .provided
            .get(rel.name.as_str())
            .into_iter()
            .flatten()
            .filter(|(p, v)| self.provides_for(rel, p, *v) && !self.kept(p))
            .map(|(p, _)| *p)
            .collect();
        providers.sort_by_key(|p| provider_rank(p));
        for p in providers {
            if !out.iter().any(|o| std::ptr::eq(*o, p)) {
                out.push(p);
            }
        }
        out
    }

    /// Why no package meets `rel`, for a message.
    fn why_not(&self, rel: &Relation) -> String {
        let mut why = Vec::new();
        match self.candidate(&rel.name) {
            Some(c) if !self.arch_ok(rel, c, false) => why.push(format!(
                "{} is {} Multi-Arch: {:?}, which `{rel}` cannot use",
                c.label(),
                c.architecture,
                c.multi_arch
            )),
            Some(c) => why.push(format!("the newest {} is {}", rel.name, c.version)),
            None => {}
        }
        for i in self.installed.get(rel.name.as_str()).into_iter().flatten() {
            why.push(format!("the base has {}", i.label()));
        }
        let providers: Vec<String> = self
            .provided
            .get(rel.name.as_str())
            .into_iter()
            .flatten()
            .map(|(p, v)| match v {
                Some(v) => format!("{} (= {v})", p.name),
                None => p.name.clone(),
            })
            .collect();
        if !providers.is_empty() {
            why.push(format!("provided by {}", providers.join(", ")));
        }
        if why.is_empty() {
            format!("no package is named {} and none provides it", rel.name)
        } else {
            format!("`{rel}`: {}", why.join("; "))
        }
    }

    /// Chooses `p` and, depth first, what its dependencies need.
    fn mark(&self, p: &'a Package, state: &mut State<'a>) -> Result<(), Failure> {
        if let Some(have) = state.selected.get(p.name.as_str()) {
            if std::ptr::eq(*have, p) || have.version == p.version {
                return Ok(());
            }
            return Err(Failure {
                path: Vec::new(),
                reason: format!(
                    "{} is needed, but {} is already chosen",
                    p.label(),
                    have.label()
                ),
            });
        }
        state.selected.insert(&p.name, p);
        self.mark_deps(p, state)
    }

    /// What choosing `p` entails, as apt's MarkInstall does it: first its Conflicts and
    /// Breaks unchoose what they hit among the packages chosen only as dependencies (never
    /// an asked one), then each of its Pre-Depends and Depends is met.
    fn mark_deps(&self, p: &'a Package, state: &mut State<'a>) -> Result<(), Failure> {
        for rel in p.conflicts.0.iter().chain(&p.breaks.0).flatten() {
            let hit: Vec<&'a str> = state
                .selected
                .values()
                .filter(|q| q.name != p.name && !state.asked.contains(q.name.as_str()))
                .filter(|q| self.clashes(rel, q))
                .map(|q| q.name.as_str())
                .collect();
            for name in hit {
                state.selected.remove(name);
            }
        }
        for group in p.pre_depends.0.iter().chain(&p.depends.0) {
            self.satisfy(p, group, state)?;
        }
        Ok(())
    }

    /// Meets one dependency of `p`, unless something present meets it already: the first
    /// choice that installs, choices that upgrade a package of the base before new ones.
    fn satisfy(
        &self,
        p: &'a Package,
        group: &'a [Relation],
        state: &mut State<'a>,
    ) -> Result<(), Failure> {
        if group.iter().any(|rel| self.met(rel, &state.selected)) {
            return Ok(());
        }
        let mut choices: Vec<&'a Package> = Vec::new();
        for rel in group {
            for t in self.targets(rel) {
                if !choices.iter().any(|c| std::ptr::eq(*c, t)) {
                    choices.push(t);
                }
            }
        }
        // Stable: within each half the order of the alternatives and providers stays.
        let (upgrades, new): (Vec<_>, Vec<_>) = choices
            .into_iter()
            .partition(|c| self.installed.contains_key(c.name.as_str()));
        let mut failures: Vec<Failure> = Vec::new();
        for target in upgrades.into_iter().chain(new) {
            let before = state.selected.clone();
            match self.mark(target, state) {
                Ok(()) => return Ok(()),
                Err(f) => {
                    state.selected = before;
                    failures.push(f);
                }
            }
        }
        let mut path = vec![format!("{} depends on {}", p.label(), group_text(group))];
        let reason = if failures.is_empty() {
            group
                .iter()
                .map(|rel| self.why_not(rel))
                .collect::<Vec<_>>()
                .join("; ")
        } else {
            let first = failures.remove(0);
            path.extend(first.path);
            let mut reason = first.reason;
            for other in failures {
                reason.push_str(&format!(
                    "; and the other choice fails: {}{}",
                    other
                        .path
                        .iter()
                        .map(|s| format!("{s} -> "))
                        .collect::<String>(),
                    other.reason
                ));
            }
            reason
        };
        Err(Failure { path, reason })
    }

    /// Whether the negative relation `rel` (Conflicts, Breaks) hits `q`, by name or by what
    /// `q` provides.
    fn clashes(&self, rel: &Relation, q: &Package) -> bool {
        (q.name == rel.name && version_ok(&rel.version, &q.version))
            || provides(q).any(|(n, v)| {
                n == rel.name
                    && match (&rel.version, v) {
                        (None, _) => true,
                        (Some(_), None) => false,
                        (Some(_), Some(v)) => version_ok(&rel.version, v),
                    }
            })
    }

    /// The names closest to `name`, for an unknown ask.
    fn nearest(&self, name: &str) -> Vec<&'a str> {
        let mut scored: Vec<(usize, &'a str)> = self
            .available
            .keys()
            .chain(self.provided.keys())
            .copied()
            .filter_map(|n| {
                let d = strsim::damerau_levenshtein(name, n);
                // A name that contains the ask (`rdma` in `rdma-core`) is near too.
                let d = if n.contains(name) && name.len() >= 3 {
                    d.min(n.len() - name.len()).min(3)
                } else {
                    d
                };
                (d <= (name.len() / 3).max(2)).then_some((d, n))
            })
            .collect();
        scored.sort();
        scored.dedup();
        scored.into_iter().take(5).map(|(_, n)| n).collect()
    }

    /// The archive package an ask means; None when the base already has it.
    fn resolve_ask(&self, ask: &Ask) -> Result<Option<&'a Package>> {
        let versions = self.available.get(ask.name.as_str());
        if let Some(want) = &ask.version {
            if let Some(p) = versions.into_iter().flatten().find(|p| &p.version == want) {
                let there = self
                    .installed
                    .get(ask.name.as_str())
                    .is_some_and(|v| v.iter().any(|i| &i.version == want));
                return Ok((!there).then_some(*p));
            }
            if let Some(versions) = versions {
                let list: Vec<String> = versions.iter().map(|p| p.version.to_string()).collect();
                return Err(Error::Usage(format!(
                    "`{ask}`: the archives have no version {want} of {}; they have {}",
                    ask.name,
                    list.join(", ")
                )));
            }
        } else if let Some(c) = self.candidate(&ask.name) {
            return Ok((!self.kept(c)).then_some(c));
        }
        if ask.version.is_none() {
            // A virtual name: apt takes it when exactly one package provides it, and asks the
            // user to choose otherwise.
            let installed: Vec<&Package> = self
                .installed_provided
                .get(ask.name.as_str())
                .into_iter()
                .flatten()
                .map(|(p, _)| *p)
                .collect();
            if !installed.is_empty() {
                return Ok(None);
            }
            let mut providers: Vec<&'a Package> = self
                .provided
                .get(ask.name.as_str())
                .into_iter()
                .flatten()
                .map(|(p, _)| *p)
                .collect();
            providers.sort_by(|a, b| a.name.cmp(&b.name));
            providers.dedup_by(|a, b| a.name == b.name);
            match providers[..] {
                [one] => return Ok((!self.kept(one)).then_some(one)),
                [] => {}
                _ => {
                    let names: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
                    return Err(Error::Usage(format!(
                        "`{ask}` is a virtual package provided by {}; ask for one of them",
                        names.join(", ")
                    )));
                }
            }
        }
        let near = self.nearest(&ask.name);
        let hint = if near.is_empty() {
            String::new()
        } else {
            format!("; nearest names: {}", near.join(", "))
        };
        Err(Error::Usage(format!(
            "`{ask}`: no package of that name in the archives' indexes ({} packages){hint}",
            self.available.len()
        )))
    }

    /// Conflicts and Breaks among the packages present after the install; an old clash within
    /// the base itself is none of gpubake's business.
    fn check_clashes(&self, selected: &Selected<'a>) -> Result<()> {
        let mut present: Vec<&'a Package> = selected.values().copied().collect();
        for (name, versions) in &self.installed {
            if !selected.contains_key(name) {
                present.extend(versions.iter().copied());
            }
        }
        for p in &present {
            for (kind, relations) in [("conflicts with", &p.conflicts), ("breaks", &p.breaks)] {
                for rel in relations.0.iter().flatten() {
                    for q in &present {
                        if q.name == p.name {
                            continue;
                        }
                        let new = |x: &Package| selected.contains_key(x.name.as_str());
                        if !new(p) && !new(q) {
                            continue;
                        }
                        let hit = self.clashes(rel, q);
                        if hit {
                            let side = |x: &Package| {
                                if new(x) {
                                    format!("{} (to install)", x.label())
                                } else {
                                    format!("{} (in the base)", x.label())
                                }
                            };
                            return Err(Error::Usage(format!(
                                "{} {kind} {} (`{rel}`); they cannot be installed together",
                                side(p),
                                side(q)
                            )));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// `selected` with each package after the ones it depends on (its first chosen
    /// alternative), ties by name: an order dpkg can unpack and configure in.
    fn order(&self, selected: &Selected<'a>) -> Vec<&'a Package> {
        fn visit<'a>(
            world: &World<'a>,
            p: &'a Package,
            selected: &Selected<'a>,
            seen: &mut BTreeSet<&'a str>,
            out: &mut Vec<&'a Package>,
        ) {
            if !seen.insert(&p.name) {
                return;
            }
            for group in p.pre_depends.0.iter().chain(&p.depends.0) {
                let dep = group.iter().find_map(|rel| {
                    selected.values().copied().find(|q| {
                        world.names(rel, q)
                            || provides(q)
                                .any(|(n, v)| n == rel.name && world.provides_for(rel, q, v))
                    })
                });
                if let Some(q) = dep {
                    visit(world, q, selected, seen, out);
                }
            }
            out.push(p);
        }
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for p in selected.values() {
            visit(self, p, selected, &mut seen, &mut out);
        }
        out
    }
}

/// The names (and provided versions) `p` provides.
fn provides(p: &Package) -> impl Iterator<Item = (&str, Option<&Version>)> {
    p.provides
        .0
        .iter()
        .flatten()
        .map(|r| (r.name.as_str(), r.version.as_ref().map(|(_, v)| v)))
}

/// The packages to add to a base that has `installed` so that `asks` are met, choosing from
/// `available` (every source's packages for `native` and `all`) as apt would; a dependency
/// before what depends on it. An unknown name, an unsatisfiable dependency (with the chain
/// that fails) or a clash between packages is a Usage error.
pub fn solve(
    installed: &[Package],
    available: &[Package],
    asks: &[Ask],
    native: &str,
) -> Result<Vec<Pin>> {
    let world = World::new(installed, available, native);
    let mut state = State {
        selected: BTreeMap::new(),
        asked: BTreeSet::new(),
    };
    // apt-get install marks every asked package first and only then what each needs, so an
    // asked package meets the others' dependencies before anything else is tried.
    let mut targets = Vec::new();
    for ask in asks {
        if let Some(target) = world.resolve_ask(ask)? {
            if let Some(have) = state.selected.get(target.name.as_str())
                && have.version != target.version
            {
                return Err(Error::Usage(format!(
                    "`{ask}` asks for {}, but {} is asked for too",
                    target.label(),
                    have.label()
                )));
            }
            state.selected.insert(&target.name, target);
            state.asked.insert(&target.name);
            targets.push((ask, target));
        }
    }
    let failed = |ask: &dyn fmt::Display, target: &Package, f: Failure| {
        let chain: String = f.path.iter().map(|s| format!("\n  {s}")).collect();
        Error::Usage(format!(
            "cannot install `{ask}` ({}):{chain}\n  but {}",
            target.label(),
            f.reason
        ))
    };
    for (ask, target) in &targets {
        world
            .mark_deps(target, &mut state)
            .map_err(|f| failed(ask, target, f))?;
    }
    // A package unchosen for a later one's Conflicts may leave a dependency of an earlier
    // choice open; meet those again (apt's problem resolver does this at the end).
    for _ in 0..8 {
        let open: Vec<(&Package, &Vec<Relation>)> = state
            .selected
            .values()
            .flat_map(|p| {
                p.pre_depends
                    .0
                    .iter()
                    .chain(&p.depends.0)
                    .map(move |g| (*p, g))
            })
            .filter(|(_, g)| !g.iter().any(|rel| world.met(rel, &state.selected)))
            .collect();
        if open.is_empty() {
            break;
        }
        for (p, group) in open {
            if state.selected.contains_key(p.name.as_str()) {
                world
                    .satisfy(p, group, &mut state)
                    .map_err(|f| failed(&p.name, p, f))?;
            }
        }
    }
    let selected = state.selected;
    world.check_clashes(&selected)?;
    Ok(world
        .order(&selected)
        .into_iter()
        .map(|p| {
            let file = p
                .file
                .as_ref()
                .expect("archive packages carry their pool file");
            Pin {
                name: p.name.clone(),
                version: p.version.to_string(),
                architecture: p.architecture.clone(),
                filename: file.filename.clone(),
                size: file.size,
                sha256: file.sha256.clone(),
                base: file.base.clone(),
                source: p.source.clone().filter(|s| *s != p.name),
                replaces: world
                    .installed
                    .get(p.name.as_str())
                    .and_then(|v| v.first())
                    .map(|i| i.version.to_string()),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::debian::packages::parse_index;

    /// An archive's Packages index of `stanzas`, at base `http://a`.
    fn archive(stanzas: &[String]) -> Vec<Package> {
        parse_index(&stanzas.concat(), Some("http://a"), "Packages", |_| true).unwrap()
    }

    /// A base's installed packages, from dpkg status stanzas.
    fn installed(status: &str) -> Vec<Package> {
        parse_index(status, None, "status", |_| true).unwrap()
    }

    fn stanza(name: &str, version: &str, extra: &str) -> String {
        format!(
            "Package: {name}\nVersion: {version}\nArchitecture: amd64\n{extra}\
             Filename: pool/{name}_{version}.deb\nSize: 1\nSHA256: {}\n\n",
            "0".repeat(64)
        )
    }

    fn names(pins: &[Pin]) -> Vec<String> {
        pins.iter()
            .map(|p| format!("{}={}", p.name, p.version))
            .collect()
    }

    fn asks(list: &[&str]) -> Vec<Ask> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    /// What `solve` adds to `base` for `list`, as `NAME=VERSION` in install order.
    fn chosen(base: &[Package], avail: &[Package], list: &[&str]) -> Vec<String> {
        names(&solve(base, avail, &asks(list), "amd64").unwrap())
    }

    /// Why `solve` refuses `list`, in its words.
    fn refused(base: &[Package], avail: &[Package], list: &[&str]) -> String {
        solve(base, avail, &asks(list), "amd64")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn asks_parse_names_and_versions() {
        let a: Ask = "openssh-client=1:9.2p1-2".parse().unwrap();
        assert_eq!(a.name, "openssh-client");
        assert_eq!(a.version.unwrap().epoch, Some(1));
        assert!("Bad_Name".parse::<Ask>().is_err());
        assert!("x".parse::<Ask>().is_err());
        let e = "numactl=".parse::<Ask>().unwrap_err();
        assert!(e.to_string().contains("is not a Debian version"), "{e}");
    }

    #[test]
    fn highest_candidate_dependencies_first_and_installed_alternatives_win() {
        let base = installed(
            "Package: mawk\nStatus: install ok installed\nVersion: 1.3\nArchitecture: amd64\n\
             Provides: awk\n\nPackage: libc6\nStatus: install ok installed\nVersion: 2.36-9\n\
             Architecture: amd64\n",
        );
        let avail = archive(&[
            stanza(
                "app",
                "1.0",
                "Pre-Depends: libx (>= 2)\nDepends: gawk | awk, libc6 (>= 2.30), helper\n\
                 Recommends: fat\n",
            ),
            stanza("libx", "2.1", ""),
            stanza("libx", "3.0", ""),
            stanza("gawk", "5", "Provides: awk\n"),
            stanza("helper", "1", "Depends: libx (<< 4)\n"),
            stanza("fat", "1", ""),
        ]);
        let pins = solve(&base, &avail, &asks(&["app"]), "amd64").unwrap();
        // gawk is the first alternative, but mawk in the base already provides awk.
        assert_eq!(names(&pins), ["libx=3.0", "helper=1", "app=1.0"]);
        assert_eq!(pins[0].filename, "pool/libx_3.0.deb");
        assert_eq!(pins[0].base, "http://a");
        // Every asked package is chosen before any dependency, as apt-get does: in either
        // order the asked libx 2.1 meets app's `libx (>= 2)`.
        assert_eq!(
            chosen(&base, &avail, &["app", "libx=2.1"]),
            ["libx=2.1", "helper=1", "app=1.0"]
        );
        assert_eq!(
            chosen(&base, &avail, &["libx=2.1", "app"]),
            ["libx=2.1", "helper=1", "app=1.0"]
        );
    }

    #[test]
    fn a_later_conflict_unchooses_an_earlier_alternative_as_apt_does() {
        // libreoffice's shape: one package takes `nogui | core`, a later one needs core,
        // and the two cores conflict. apt ends with core alone; so must this.
        let avail = archive(&[
            stanza("top", "1", "Depends: base-core, core-user\n"),
            stanza("base-core", "1", "Depends: core-nogui | core\n"),
            stanza("core-user", "1", "Depends: core\n"),
            stanza("core", "1", "Conflicts: core-nogui\n"),
            stanza("core-nogui", "1", "Conflicts: core\n"),
        ]);
        assert_eq!(
            chosen(&[], &avail, &["top"]),
            ["core=1", "base-core=1", "core-user=1", "top=1"]
        );
    }

    #[test]
    fn versioned_provides_and_virtual_asks() {
        let avail = archive(&[
            stanza("user", "1", "Depends: api (>= 2)\n"),
            stanza("old-impl", "1", "Provides: api\n"),
            stanza("new-impl", "1", "Provides: api (= 2.5)\n"),
            stanza("one", "1", "Provides: only-virtual\n"),
        ]);
        assert_eq!(chosen(&[], &avail, &["user"]), ["new-impl=1", "user=1"]);
        assert_eq!(chosen(&[], &avail, &["only-virtual"]), ["one=1"]);
        let e = refused(&[], &avail, &["api"]);
        assert!(
            e.contains("virtual package provided by new-impl, old-impl"),
            "{e}"
        );
    }

    #[test]
    fn arch_qualifiers_follow_multi_arch() {
        let avail = archive(&[
            stanza("tool", "1", "Depends: python3:any, libfoo:native\n"),
            stanza("python3", "3.11", "Multi-Arch: allowed\n"),
            stanza("libfoo", "1", ""),
            stanza("strict", "1", "Depends: plain:any\n"),
            stanza("plain", "1", ""),
        ]);
        assert_eq!(
            chosen(&[], &avail, &["tool"]),
            ["libfoo=1", "python3=3.11", "tool=1"]
        );
        let e = refused(&[], &avail, &["strict"]);
        assert!(e.contains("Multi-Arch: No"), "{e}");
    }

    #[test]
    fn clashes_name_both_packages_and_chains_show_the_path() {
        let base = installed(
            "Package: keep\nStatus: install ok installed\nVersion: 1\nArchitecture: amd64\n",
        );
        let avail = archive(&[
            stanza("pa", "1", "Conflicts: pb\n"),
            stanza("pb", "2", ""),
            stanza("pc", "1", "Breaks: keep (<< 2)\n"),
            stanza("top", "1", "Depends: mid\n"),
            stanza("mid", "1", "Depends: low (>= 5) | missing\n"),
            stanza("low", "4", ""),
        ]);
        let e = refused(&base, &avail, &["pa", "pb"]);
        assert_eq!(
            e,
            "pa 1 (to install) conflicts with pb 2 (to install) (`pb`); they cannot be \
             installed together"
        );
        let e = refused(&base, &avail, &["pc"]);
        assert!(
            e.contains("pc 1 (to install) breaks keep 1 (in the base)"),
            "{e}"
        );
        let e = refused(&base, &avail, &["top"]);
        assert_eq!(
            e,
            "cannot install `top` (top 1):\n  top 1 depends on mid\n  mid 1 depends on \
             low (>= 5) | missing\n  but `low (>= 5)`: the newest low is 4; no package is \
             named missing and none provides it"
        );
    }

    #[test]
    fn unknown_names_suggest_the_nearest() {
        let avail = archive(&[stanza("rdma-core", "1", ""), stanza("numactl", "1", "")]);
        let e = refused(&[], &avail, &["rdma-cor"]);
        assert!(e.ends_with("nearest names: rdma-core"), "{e}");
        let e = refused(&[], &avail, &["numactl=9"]);
        assert!(e.contains("no version 9 of numactl; they have 1"), "{e}");
    }
}
