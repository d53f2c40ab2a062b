//! The maintainer scripts of the OS layer's packages, settled as dpkg leaves a fresh install:
//! each package's `preinst install` (before its files are unpacked) and `postinst configure`
//! (once every package is unpacked, in unpacking order) is read by
//! [`crate::debian::maintscript`] against the image, and what it changes through the commands
//! gpubake models is written into the layer: system groups (/etc/group, /etc/gshadow, with
//! the gid adduser picks), alternatives as update-alternatives leaves them (the links,
//! /etc/alternatives and /var/lib/dpkg/alternatives), stat overrides
//! (/var/lib/dpkg/statoverride) and the modes and owners the scripts set. A script that does
//! anything else is refused, naming the command, unless the recipe's `system_scripts:` says
//! to skip that package's scripts and why.

use super::fs::Node;
use crate::debian::maintscript::{self, Effect, Kind, UserGroup, World};
use crate::error::{Error, Result};
use crate::image::layer::{Entry, Owner, ROOT, Source};
use crate::image::links::{ElfInfo, Entry as TreeEntry, Tree, real_path};
use std::collections::BTreeMap;

/// The layer's files by path (relative), each with the package that holds it.
pub type Files = BTreeMap<String, (Entry, String)>;

/// adduser's range for system groups when /etc/adduser.conf does not say
/// (FIRST_SYSTEM_GID, LAST_SYSTEM_GID).
const SYSTEM_GIDS: (u32, u32) = (100, 999);

/// Where systemd-sysusers allocates from, downward: the highest system id Debian's and
/// Ubuntu's systemd is built with.
const SYSUSERS_MAX_ID: u32 = 999;

/// Where systemd-sysusers looks for a configuration file, first found wins.
const SYSUSERS_DIRS: &[&str] = &["etc/sysusers.d", "run/sysusers.d", "usr/lib/sysusers.d"];

/// systemd's default shell for the users it makes on Debian and Ubuntu.
const NOLOGIN: &str = "/usr/sbin/nologin";

/// One choice of an alternative, as update-alternatives keeps it.
#[derive(Clone, Debug)]
struct Choice {
    path: String,
    priority: i64,
    /// Slave name -> path.
    slaves: BTreeMap<String, String>,
}

/// An alternative: its master link, its slaves' links by name, its choices in the order
/// they were installed.
#[derive(Clone, Debug, Default)]
struct Alternative {
    link: String,
    slave_links: BTreeMap<String, String>,
    choices: Vec<Choice>,
}

/// The image's account databases and dpkg's records, as the scripts change them.
pub struct Settler<'a> {
    base: &'a BTreeMap<String, Node>,
    read: &'a ReadBase<'a>,
    group: String,
    gshadow: Option<String>,
    passwd: String,
    shadow: Option<String>,
    /// The day a new user's password last changed, as /etc/shadow counts: the build's epoch.
    epoch_days: u64,
    statoverride: String,
    gid_range: (u32, u32),
    uid_range: (u32, u32),
    alternatives: BTreeMap<String, Alternative>,
    /// Paths whose mode or owner a script set: (mode, owner).
    changes: BTreeMap<String, (Option<u32>, Option<Owner>)>,
    /// Runlevel links update-rc.d makes (path, target).
    init_links: Vec<(String, String)>,
    /// Directories `mkdir -p` makes.
    dirs: Vec<String>,
    groups_added: bool,
    users_added: bool,
    overrides_added: bool,
    /// Packages whose scripts are skipped, with why.
    skip: &'a BTreeMap<String, String>,
    /// What the build says of the scripts it did not settle.
    pub notes: Vec<String>,
}

/// Reads `path` of the base as text, when it is a file there.
pub type ReadBase<'a> = dyn Fn(&str) -> Result<Option<String>> + 'a;

impl<'a> Settler<'a> {
    /// A settler for a base whose files are `base` and whose file `path` reads as
    /// `read(path)`; `skip` is the recipe's `system_scripts:` (package -> why skipped).
    /// `epoch` is the build's timestamp, which a new user's password age counts from.
    pub fn new(
        base: &'a BTreeMap<String, Node>,
        read: &'a ReadBase<'a>,
        skip: &'a BTreeMap<String, String>,
        epoch: u64,
    ) -> Result<Self> {
        let conf = read("etc/adduser.conf")?.unwrap_or_default();
        let setting = |key: &str, default: u32| {
            conf.lines()
                .filter_map(|l| l.split('#').next()?.split_once('='))
                .find(|(k, _)| k.trim() == key)
                .and_then(|(_, v)| v.trim().trim_matches('"').parse().ok())
                .unwrap_or(default)
        };
        Ok(Settler {
            base,
            read,
            group: read("etc/group")?.unwrap_or_default(),
            gshadow: read("etc/gshadow")?,
            passwd: read("etc/passwd")?.unwrap_or_default(),
            shadow: read("etc/shadow")?,
            epoch_days: epoch / 86_400,
            statoverride: read("var/lib/dpkg/statoverride")?.unwrap_or_default(),
            gid_range: (
                setting("FIRST_SYSTEM_GID", SYSTEM_GIDS.0),
                setting("LAST_SYSTEM_GID", SYSTEM_GIDS.1),
            ),
            uid_range: (
                setting("FIRST_SYSTEM_UID", SYSTEM_GIDS.0),
                setting("LAST_SYSTEM_UID", SYSTEM_GIDS.1),
            ),
            alternatives: BTreeMap::new(),
            changes: BTreeMap::new(),
            init_links: Vec::new(),
            dirs: Vec::new(),
            groups_added: false,
            users_added: false,
            overrides_added: false,
            skip,
            notes: Vec::new(),
        })
    }

    /// Settles `package`'s `script` (its text), run with `args`, against the layer's `files`
    /// so far. A script gpubake cannot settle is refused unless the recipe skips it; one that
    /// would fail under dpkg fails the build.
    pub fn run(
        &mut self,
        package: &str,
        script: (&str, &str),
        args: &[&str],
        files: &Files,
    ) -> Result<()> {
        let (name, text) = script;
        let view = View {
            settler: self,
            files,
        };
        // A package the recipe skips is read leniently: what gpubake cannot make is passed
        // over (and said), the rest is settled.
        let why = self.skip.get(package);
        let outcome = maintscript::evaluate(text, args, package, &view, why.is_some());
        if let Some(why) = why {
            for what in &outcome.skipped {
                self.notes
                    .push(format!("{package}'s {name} {what}: skipped ({why})"));
            }
            if let Some(what) = &outcome.unmodelled {
                self.notes
                    .push(format!("{package}'s {name} {what}: not run ({why})"));
                return Ok(());
            }
        } else {
            let checked = match &outcome.unmodelled {
                Some(what) => Err(what.clone()),
                None => self.check(&outcome.effects, files),
            };
            if let Err(what) = checked {
                return Err(Error::Usage(format!(
                    "{package}'s {name} {what}: gpubake cannot make that in an image without \
                     running the script; leave the package out, or add `system_scripts: \
                     {{{package}: {{skip: \"why the image does without it\"}}}}` to build \
                     without it"
                )));
            }
        }
        if outcome.status != 0 {
            return Err(Error::Build(format!(
                "{package}'s {name} exits {} on a fresh install: dpkg would leave the package \
                 half-configured",
                outcome.status
            )));
        }
        for effect in outcome.effects {
            // Leniently, each effect is judged after those before it are made (a group the
            // script added is there for the chgrp that follows), and one that cannot be made
            // is passed over and said.
            if let Some(why) = why
                && let Err(what) = self.check(std::slice::from_ref(&effect), files)
            {
                self.notes
                    .push(format!("{package}'s {name} {what}: skipped ({why})"));
                continue;
            }
            self.apply(effect, files);
        }
        Ok(())
    }

    /// Whether every effect can be made: a mode or owner is set only on a file of the layer
    /// (a base file would need copying), and only to a user and group that exist.
    fn check(&self, effects: &[Effect], files: &Files) -> std::result::Result<(), String> {
        let mut groups: Vec<String> = Vec::new();
        for e in effects {
            if let Effect::SystemGroup { name } = e {
                groups.push(name.clone());
            }
            let (path, user, group) = match e {
                Effect::SystemUser {
                    group: UserGroup::Named(g),
                    ..
                }
                | Effect::Member { group: g, .. } => {
                    if self.id("group", g).is_none() && !groups.iter().any(|n| n == g) {
                        return Err(format!(
                            "joins a user to the group {g}, which /etc/group does not have"
                        ));
                    }
                    continue;
                }
                Effect::SysUsers { confs } => {
                    for conf in confs {
                        let text = self.sysusers_conf(conf, files).ok_or_else(|| {
                            format!("runs `systemd-sysusers {conf}`, a file it does not find")
                        })?;
                        if let Some(line) = text.lines().find(|l| sysusers_line(l).is_err()) {
                            return Err(format!(
                                "runs `systemd-sysusers {conf}`, whose line `{line}` gpubake \
                                 does not read"
                            ));
                        }
                    }
                    continue;
                }
                Effect::InitLinks { name } => {
                    if init_levels(&init_script(files, name).unwrap_or_default()).is_none() {
                        return Err(format!(
                            "runs `update-rc.d {name} defaults` for a script without an LSB \
                             header in the package"
                        ));
                    }
                    continue;
                }
                Effect::Chmod { path, mode } => {
                    if symbolic_mode(mode, 0o644).is_none() {
                        return Err(format!("runs `chmod {mode} {path}`"));
                    }
                    (path, None, None)
                }
                Effect::Chown { user, group, path } => (path, user.as_deref(), group.as_deref()),
                Effect::StatOverride {
                    user, group, path, ..
                } => (path, Some(user.as_str()), Some(group.as_str())),
                _ => continue,
            };
            if !files.contains_key(path.trim_start_matches('/')) {
                return Err(format!(
                    "changes {path}, a file of the base, not of its packages"
                ));
            }
            if let Some(u) = user
                && self.id("passwd", u).is_none()
            {
                return Err(format!(
                    "gives {path} to {u}, whom /etc/passwd does not have"
                ));
            }
            if let Some(g) = group
                && self.id("group", g).is_none()
                && !groups.iter().any(|n| n == g)
            {
                return Err(format!(
                    "gives {path} to the group {g}, which /etc/group does not have"
                ));
            }
        }
        Ok(())
    }

    /// The id of `name` in /etc/passwd or /etc/group (a number is its own id).
    fn id(&self, database: &str, name: &str) -> Option<u32> {
        if let Ok(n) = name.parse() {
            return Some(n);
        }
        let text = if database == "group" {
            &self.group
        } else {
            &self.passwd
        };
        text.lines().find_map(|l| {
            let mut f = l.split(':');
            (f.next()? == name).then_some(())?;
            f.nth(1)?.parse().ok()
        })
    }

    fn apply(&mut self, effect: Effect, files: &Files) {
        match effect {
            Effect::SystemGroup { name } => {
                if self.id("group", &name).is_some() {
                    return;
                }
                // adduser takes the first gid of its system range that no group has.
                let used: Vec<u32> = self
                    .group
                    .lines()
                    .filter_map(|l| l.split(':').nth(2)?.parse().ok())
                    .collect();
                let (first, last) = self.gid_range;
                let Some(gid) = (first..=last).find(|g| !used.contains(g)) else {
                    self.notes
                        .push(format!("no system gid is free for the group {name}"));
                    return;
                };
                self.add_group(&name, gid, "!");
            }
            Effect::Alternative {
                link,
                name,
                path,
                priority,
                slaves,
            } => {
                let alt = self.alternatives.entry(name).or_default();
                alt.link = link;
                let mut by_name = BTreeMap::new();
                for s in slaves {
                    alt.slave_links.insert(s.name.clone(), s.link);
                    by_name.insert(s.name, s.path);
                }
                alt.choices.retain(|c| c.path != path);
                alt.choices.push(Choice {
                    path,
                    priority,
                    slaves: by_name,
                });
            }
            Effect::RemoveAlternative { name, path } => {
                if let Some(alt) = self.alternatives.get_mut(&name) {
                    alt.choices.retain(|c| c.path != path);
                }
            }
            Effect::StatOverride {
                user,
                group,
                mode,
                path,
                update,
            } => {
                push_line(
                    &mut self.statoverride,
                    &format!("{user} {group} {mode:o} {path}"),
                );
                self.overrides_added = true;
                if update {
                    let owner = self.owner(Some(&user), Some(&group), &path, files);
                    let change = self.changes.entry(path).or_default();
                    change.0 = Some(mode);
                    change.1 = Some(owner);
                }
            }
            Effect::SystemUser {
                name,
                uid,
                group,
                home,
                shell,
                gecos,
            } => self.system_user(&name, uid, &group, (&home, &shell, &gecos)),
            Effect::Member { user, group } => self.sysusers(SysUser::Member { user, group }),
            Effect::MakeDir { path } => self.dirs.push(path),
            Effect::SysUsers { confs } => {
                for conf in confs {
                    let text = self.sysusers_conf(&conf, files).unwrap_or_default();
                    for line in text.lines() {
                        if let Ok(Some(entry)) = sysusers_line(line) {
                            self.sysusers(entry);
                        }
                    }
                }
            }
            Effect::InitLinks { name } => {
                let (start, stop) =
                    init_levels(&init_script(files, &name).unwrap_or_default()).unwrap_or_default();
                for (kind, levels) in [("S", start), ("K", stop)] {
                    for level in levels {
                        self.init_links.push((
                            format!("etc/rc{level}.d/{kind}01{name}"),
                            format!("../init.d/{name}"),
                        ));
                    }
                }
            }
            Effect::Chmod { mode, path } => {
                let now = self.mode_of(&path, files);
                let change = self.changes.entry(path).or_default();
                change.0 = symbolic_mode(&mode, change.0.unwrap_or(now));
            }
            Effect::Chown { user, group, path } => {
                let owner = self.owner(user.as_deref(), group.as_deref(), &path, files);
                self.changes.entry(path).or_default().1 = Some(owner);
            }
        }
    }

    /// The sysusers.d file `name`, where systemd-sysusers finds it: /etc, /run, then /usr/lib,
    /// in the layer or else the base.
    fn sysusers_conf(&self, name: &str, files: &Files) -> Option<String> {
        SYSUSERS_DIRS.iter().find_map(|dir| {
            let path = format!("{dir}/{name}");
            match files.get(&path) {
                Some((e, _)) => match &e.source {
                    Source::File(p) => std::fs::read_to_string(p).ok(),
                    Source::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    _ => None,
                },
                None => (self.read)(&path).ok().flatten(),
            }
        })
    }

    /// The ids in use as gids (in /etc/group) and as uids (in /etc/passwd).
    fn ids(&self, database: &str) -> Vec<u32> {
        let text = if database == "group" {
            &self.group
        } else {
            &self.passwd
        };
        text.lines()
            .filter_map(|l| l.split(':').nth(2)?.parse().ok())
            .collect()
    }

    /// One line of a sysusers.d file, made as systemd-sysusers makes it: what exists stays,
    /// and an id left to it is the highest free one at or below 999.
    fn sysusers(&mut self, entry: SysUser) {
        match entry {
            SysUser::Group { name, gid } => {
                if self.id("group", &name).is_some() {
                    return;
                }
                let used = self.ids("group");
                let gid = gid
                    .filter(|g| !used.contains(g))
                    .or_else(|| (1..=SYSUSERS_MAX_ID).rev().find(|g| !used.contains(g)));
                if let Some(gid) = gid {
                    self.add_group(&name, gid, "!*");
                }
            }
            SysUser::User {
                name,
                id,
                gecos,
                home,
                shell,
            } => {
                if self.id("passwd", &name).is_some() {
                    return;
                }
                let (uids, gids) = (self.ids("passwd"), self.ids("group"));
                let (uid, gid) = match (id, self.id("group", &name)) {
                    (Some(id), _) => id,
                    // A group of the name already: its gid, and the uid alike where free.
                    (None, Some(g)) if !uids.contains(&g) => (g, g),
                    _ => {
                        let Some(free) = (1..=SYSUSERS_MAX_ID)
                            .rev()
                            .find(|i| !uids.contains(i) && !gids.contains(i))
                        else {
                            return;
                        };
                        (free, free)
                    }
                };
                if self.id("group", &name).is_none() {
                    self.add_group(&name, gid, "!*");
                }
                push_line(
                    &mut self.passwd,
                    &format!("{name}:x:{uid}:{gid}:{gecos}:{home}:{shell}"),
                );
                if let Some(shadow) = &mut self.shadow {
                    push_line(shadow, &format!("{name}:!*:{}::::::", self.epoch_days));
                }
                self.users_added = true;
            }
            SysUser::Member { user, group } => {
                let mut out = String::new();
                for line in self.group.lines() {
                    let mut fields: Vec<String> = line.split(':').map(str::to_string).collect();
                    if fields.len() == 4 && fields[0] == group {
                        let members: Vec<&str> =
                            fields[3].split(',').filter(|m| !m.is_empty()).collect();
                        if !members.contains(&user.as_str()) {
                            fields[3] = members
                                .into_iter()
                                .chain([user.as_str()])
                                .collect::<Vec<_>>()
                                .join(",");
                            self.groups_added = true;
                        }
                    }
                    out.push_str(&fields.join(":"));
                    out.push('\n');
                }
                self.group = out;
            }
        }
    }

    /// `adduser --system`: the first free uid of adduser.conf's system range (free as a gid
    /// too where the user gets a group of its own), nogroup unless a group is named.
    fn system_user(
        &mut self,
        name: &str,
        uid: Option<u32>,
        group: &UserGroup,
        (home, shell, gecos): (&str, &str, &str),
    ) {
        if self.id("passwd", name).is_some() {
            return;
        }
        let (uids, gids) = (self.ids("passwd"), self.ids("group"));
        let (first, last) = self.uid_range;
        let own = *group == UserGroup::Own;
        let Some(uid) =
            uid.or_else(|| (first..=last).find(|i| !(uids.contains(i) || own && gids.contains(i))))
        else {
            self.notes
                .push(format!("no system uid is free for the user {name}"));
            return;
        };
        let gid = match group {
            UserGroup::Own => {
                let gid = if gids.contains(&uid) {
                    let (first, last) = self.gid_range;
                    (first..=last).find(|g| !gids.contains(g)).unwrap_or(uid)
                } else {
                    uid
                };
                self.add_group(name, gid, "!");
                gid
            }
            UserGroup::Named(g) => self.id("group", g).unwrap_or(65534),
            UserGroup::None => self.id("group", "nogroup").unwrap_or(65534),
        };
        push_line(
            &mut self.passwd,
            &format!("{name}:x:{uid}:{gid}:{gecos}:{home}:{shell}"),
        );
        if let Some(shadow) = &mut self.shadow {
            push_line(shadow, &format!("{name}:!:{}::::::", self.epoch_days));
        }
        self.users_added = true;
    }

    fn add_group(&mut self, name: &str, gid: u32, password: &str) {
        push_line(&mut self.group, &format!("{name}:x:{gid}:"));
        if let Some(gshadow) = &mut self.gshadow {
            push_line(gshadow, &format!("{name}:{password}::"));
        }
        self.groups_added = true;
    }

    fn mode_of(&self, path: &str, files: &Files) -> u32 {
        files
            .get(path.trim_start_matches('/'))
            .map_or(0o644, |(e, _)| e.mode)
    }

    fn owner(&self, user: Option<&str>, group: Option<&str>, path: &str, files: &Files) -> Owner {
        let now = self
            .changes
            .get(path)
            .and_then(|c| c.1)
            .or_else(|| {
                files
                    .get(path.trim_start_matches('/'))
                    .map(|(e, _)| e.owner)
            })
            .unwrap_or(ROOT);
        Owner {
            uid: user.and_then(|u| self.id("passwd", u)).unwrap_or(now.uid),
            gid: group.and_then(|g| self.id("group", g)).unwrap_or(now.gid),
        }
    }

    /// Writes what the scripts changed into the layer's `files` (`links` are the base's and
    /// the layer's symbolic links, which paths are followed through) and returns the files of
    /// dpkg's and the system's databases that changed.
    pub fn finish(self, files: &mut Files, place: &dyn Fn(&str) -> String) -> Vec<Entry> {
        let mut extra = Vec::new();
        for (path, (mode, owner)) in &self.changes {
            if let Some((entry, _)) = files.get_mut(path.trim_start_matches('/')) {
                if let Some(m) = mode {
                    entry.mode = *m;
                }
                if let Some(o) = owner {
                    entry.owner = *o;
                }
            }
        }
        let file = |path: &str, text: &str| Entry {
            path: path.into(),
            mode: 0o644,
            owner: ROOT,
            source: Source::Bytes(text.as_bytes().to_vec()),
        };
        // Only root reads the shadow files; the group that may read them is shadow's.
        let shadow_file = |path: &str, text: &str| Entry {
            mode: 0o640,
            owner: Owner {
                uid: 0,
                gid: self.id("group", "shadow").unwrap_or(0),
            },
            ..file(path, text)
        };
        if self.groups_added {
            extra.push(file("etc/group", &self.group));
            extra.extend(
                self.gshadow
                    .as_deref()
                    .map(|t| shadow_file("etc/gshadow", t)),
            );
        }
        if self.users_added {
            extra.push(file("etc/passwd", &self.passwd));
            extra.extend(self.shadow.as_deref().map(|t| shadow_file("etc/shadow", t)));
        }
        if self.overrides_added {
            extra.push(file("var/lib/dpkg/statoverride", &self.statoverride));
        }
        let exists = |path: &str| {
            let view = View {
                settler: &self,
                files,
            };
            real_path(&view, path).is_some()
        };
        let mut links: Vec<(String, String)> = Vec::new();
        for (name, alt) in &self.alternatives {
            // Auto mode: the highest priority wins, the first installed on a tie.
            let Some(best) = alt
                .choices
                .iter()
                .reduce(|a, b| if b.priority > a.priority { b } else { a })
            else {
                continue;
            };
            let mut record = format!("auto\n{}\n", alt.link);
            for (slave, link) in &alt.slave_links {
                record.push_str(&format!("{slave}\n{link}\n"));
            }
            record.push('\n');
            for c in &alt.choices {
                record.push_str(&format!("{}\n{}\n", c.path, c.priority));
                for slave in alt.slave_links.keys() {
                    record.push_str(&format!(
                        "{}\n",
                        c.slaves.get(slave).map_or("", String::as_str)
                    ));
                }
            }
            record.push('\n');
            extra.push(file(&format!("var/lib/dpkg/alternatives/{name}"), &record));
            links.push((alt.link.clone(), format!("/etc/alternatives/{name}")));
            links.push((format!("/etc/alternatives/{name}"), best.path.clone()));
            // update-alternatives leaves out a slave whose file is not there.
            for (slave, path) in &best.slaves {
                if exists(path) {
                    links.push((
                        alt.slave_links[slave].clone(),
                        format!("/etc/alternatives/{slave}"),
                    ));
                    links.push((format!("/etc/alternatives/{slave}"), path.clone()));
                }
            }
        }
        for dir in &self.dirs {
            let at = place(dir.trim_start_matches('/'));
            files.entry(at.clone()).or_insert((
                Entry {
                    path: at,
                    mode: 0o755,
                    owner: ROOT,
                    source: Source::Dir,
                },
                "mkdir".into(),
            ));
        }
        for (link, target) in links.into_iter().chain(self.init_links.iter().cloned()) {
            let at = place(link.trim_start_matches('/'));
            // update-alternatives replaces a link, never a file a package holds.
            if files
                .get(&at)
                .is_some_and(|(e, _)| !matches!(e.source, Source::Symlink(_)))
            {
                continue;
            }
            files.insert(
                at.clone(),
                (
                    Entry {
                        path: at,
                        mode: 0o777,
                        owner: ROOT,
                        source: Source::Symlink(target),
                    },
                    "update-alternatives".into(),
                ),
            );
        }
        extra
    }
}

/// A line of a sysusers.d file that makes something.
#[derive(Debug, PartialEq, Eq)]
enum SysUser {
    /// `g NAME ID`: a group, its gid fixed or left to systemd-sysusers.
    Group { name: String, gid: Option<u32> },
    /// `u NAME ID GECOS HOME SHELL`: a user with a group of its name.
    User {
        name: String,
        id: Option<(u32, u32)>,
        gecos: String,
        home: String,
        shell: String,
    },
    /// `m USER GROUP`: a user joins a group.
    Member { user: String, group: String },
}

/// Reads one line of a sysusers.d file: None for a comment or a blank line, an error for a
/// kind gpubake does not make (`r` ranges, ids taken from a file's owner, ...).
fn sysusers_line(line: &str) -> std::result::Result<Option<SysUser>, ()> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    // Fields split at blanks, a double-quoted one kept whole.
    let mut fields = Vec::new();
    let mut rest = line;
    while !rest.is_empty() {
        rest = rest.trim_start();
        if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted.find('"').ok_or(())?;
            fields.push(quoted[..end].to_string());
            rest = &quoted[end + 1..];
        } else {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            fields.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    let field = |i: usize| fields.get(i).map(String::as_str).filter(|f| *f != "-");
    let number = |f: Option<&str>| -> std::result::Result<Option<u32>, ()> {
        f.map(|v| v.parse().map_err(|_| ())).transpose()
    };
    let name = field(1).ok_or(())?.to_string();
    Ok(Some(match field(0) {
        Some("g") => SysUser::Group {
            name,
            gid: number(field(2))?,
        },
        Some("u") => {
            let id = match field(2) {
                None => None,
                Some(v) => {
                    let (u, g) = v.split_once(':').unwrap_or((v, v));
                    Some((u.parse().map_err(|_| ())?, g.parse().map_err(|_| ())?))
                }
            };
            SysUser::User {
                name,
                id,
                gecos: field(3).unwrap_or("").to_string(),
                home: field(4).unwrap_or("/").to_string(),
                shell: field(5).unwrap_or(NOLOGIN).to_string(),
            }
        }
        Some("m") => SysUser::Member {
            user: name,
            group: field(2).ok_or(())?.to_string(),
        },
        _ => return Err(()),
    }))
}

/// The text of the init script `name` a package of the layer ships.
fn init_script(files: &Files, name: &str) -> Option<String> {
    let (entry, _) = files.get(&format!("etc/init.d/{name}"))?;
    let bytes = match &entry.source {
        Source::File(p) => std::fs::read(p).ok()?,
        Source::Bytes(b) => b.clone(),
        _ => return None,
    };
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The runlevels an init script's LSB header starts and stops it in (`Default-Start: 2 3 4
/// 5`, `Default-Stop: 0 1 6`); None without the header.
fn init_levels(script: &str) -> Option<(Vec<String>, Vec<String>)> {
    let begin = script.find("### BEGIN INIT INFO")?;
    let header = &script[begin..script[begin..].find("### END INIT INFO")? + begin];
    let levels = |key: &str| -> Vec<String> {
        header
            .lines()
            .find_map(|l| l.trim_start_matches('#').trim().strip_prefix(key))
            .map(|v| v.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    };
    Some((levels("Default-Start:"), levels("Default-Stop:")))
}

fn push_line(text: &mut String, line: &str) {
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(line);
    text.push('\n');
}

/// chmod's mode: octal, or symbolic clauses (`u+s`, `a+x`, `go-w`, `+x`) applied to `now`.
/// None for what chmod would refuse.
pub fn symbolic_mode(mode: &str, now: u32) -> Option<u32> {
    if !mode.is_empty() && mode.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return u32::from_str_radix(mode, 8).ok().filter(|m| *m <= 0o7777);
    }
    let mut out = now;
    for clause in mode.split(',') {
        let op_at = clause.find(['+', '-', '='])?;
        let (who, rest) = clause.split_at(op_at);
        let mut mask = 0;
        for w in who.chars() {
            mask |= match w {
                'u' => 0o4700,
                'g' => 0o2070,
                'o' => 0o1007,
                'a' => 0o7777,
                _ => return None,
            };
        }
        // No `who`: every class (the umask aside, which a script's 022 would not narrow for
        // x and s bits).
        if mask == 0 {
            mask = 0o7777;
        }
        let op = rest.chars().next()?;
        let mut bits = 0;
        for p in rest[1..].chars() {
            bits |= match p {
                'r' => 0o444,
                'w' => 0o222,
                'x' => 0o111,
                'X' if out & 0o111 != 0 => 0o111,
                'X' => 0,
                's' => 0o6000,
                't' => 0o1000,
                _ => return None,
            };
        }
        let bits = bits & mask;
        out = match op {
            '+' => out | bits,
            '-' => out & !bits,
            _ => (out & !mask) | bits,
        };
    }
    Some(out)
}

/// The image as a script sees it: the layer's files over the base's, and the settler's
/// account databases and overrides.
struct View<'s, 'a> {
    settler: &'s Settler<'a>,
    files: &'s Files,
}

impl Tree for View<'_, '_> {
    fn entry(&self, path: &str) -> TreeEntry {
        let rel = path.trim_start_matches('/');
        if rel.is_empty() {
            return TreeEntry::Dir;
        }
        if let Some((e, _)) = self.files.get(rel) {
            return match &e.source {
                Source::Dir => TreeEntry::Dir,
                Source::Symlink(t) => TreeEntry::Link(t.clone()),
                _ => TreeEntry::File,
            };
        }
        // A directory the layer's writer adds above its files.
        let below = format!("{rel}/");
        let has_below = |keys: Option<&String>| keys.is_some_and(|k| k.starts_with(&below));
        match self.settler.base.get(rel) {
            None if has_below(self.files.range(below.clone()..).next().map(|(k, _)| k))
                || has_below(
                    self.settler
                        .base
                        .range(below.clone()..)
                        .next()
                        .map(|(k, _)| k),
                ) =>
            {
                TreeEntry::Dir
            }
            None => TreeEntry::Absent,
            Some(Node::Dir) => TreeEntry::Dir,
            Some(Node::Link(t)) => TreeEntry::Link(t.clone()),
            Some(Node::File { .. }) => TreeEntry::File,
        }
    }

    fn elf(&self, _real: &str) -> Option<ElfInfo> {
        None
    }

    fn read(&self, real: &str) -> std::io::Result<Vec<u8>> {
        Err(std::io::Error::other(format!("{real} is not read here")))
    }
}

impl World for View<'_, '_> {
    fn kind(&self, path: &str, follow: bool) -> Option<Kind> {
        let real = if follow {
            real_path(self, path)?
        } else {
            let (dir, name) = path.rsplit_once('/')?;
            let dir = real_path(self, if dir.is_empty() { "/" } else { dir })?;
            format!("{}/{name}", dir.trim_end_matches('/'))
        };
        let rel = real.trim_start_matches('/');
        let file = |mode: u32, size: u64| Kind::File {
            executable: mode & 0o111 != 0,
            empty: size == 0,
        };
        match self.entry(&real) {
            TreeEntry::Absent => None,
            TreeEntry::Dir => Some(Kind::Dir),
            TreeEntry::Link(_) => Some(Kind::Symlink),
            TreeEntry::File => Some(match self.files.get(rel) {
                Some((e, _)) => {
                    let size = match &e.source {
                        Source::Bytes(b) => b.len() as u64,
                        Source::File(p) => std::fs::metadata(p).map_or(0, |m| m.len()),
                        _ => 1,
                    };
                    file(e.mode, size)
                }
                None => match self.settler.base.get(rel) {
                    Some(Node::File { mode, size }) => file(*mode, *size),
                    _ => file(0, 0),
                },
            }),
        }
    }

    fn getent(&self, database: &str, name: &str) -> bool {
        matches!(database, "group" | "passwd") && self.settler.id(database, name).is_some()
    }

    fn statoverride(&self, path: &str) -> bool {
        self.settler
            .statoverride
            .lines()
            .any(|l| l.split_whitespace().nth(3) == Some(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chmod_modes_octal_and_symbolic() {
        assert_eq!(symbolic_mode("2755", 0o644), Some(0o2755));
        assert_eq!(symbolic_mode("+x", 0o644), Some(0o755));
        assert_eq!(symbolic_mode("u+s", 0o755), Some(0o4755));
        assert_eq!(symbolic_mode("g+s,o-rx", 0o755), Some(0o2750));
        assert_eq!(symbolic_mode("a=r", 0o755), Some(0o444));
        assert_eq!(symbolic_mode("u+X", 0o644), Some(0o644));
        assert_eq!(symbolic_mode("u+X", 0o654), Some(0o754));
        assert_eq!(symbolic_mode("9", 0o644), None);
        assert_eq!(symbolic_mode("u+q", 0o644), None);
    }

    fn file(path: &str, mode: u32) -> (String, (Entry, String)) {
        (
            path.to_string(),
            (
                Entry {
                    path: path.into(),
                    mode,
                    owner: ROOT,
                    source: Source::Bytes(b"x".to_vec()),
                },
                "p".into(),
            ),
        )
    }

    #[test]
    fn groups_take_the_first_free_system_gid_and_owners_follow_them() {
        let base = BTreeMap::from([
            ("usr".to_string(), Node::Dir),
            ("usr/sbin".to_string(), Node::Dir),
            (
                "usr/sbin/addgroup".to_string(),
                Node::File {
                    mode: 0o755,
                    size: 10,
                },
            ),
        ]);
        let group = "root:x:0:\nshadow:x:42:\nusers:x:100:\nnogroup:x:65534:\n";
        let read = |p: &str| -> Result<Option<String>> {
            Ok(match p {
                "etc/group" => Some(group.to_string()),
                "etc/gshadow" => Some("root:*::\n".into()),
                "etc/passwd" => Some("root:x:0:0:root:/root:/bin/bash\n".into()),
                _ => None,
            })
        };
        let skip = BTreeMap::new();
        let mut s = Settler::new(&base, &read, &skip, 0).unwrap();
        let mut files: Files = [file("usr/bin/ssh-agent", 0o755)].into_iter().collect();
        let script = "set -e\naddgroup --system rdma\nif ! dpkg-statoverride --list /usr/bin/ssh-agent >/dev/null; then\nchgrp _ssh /usr/bin/ssh-agent\nfi\n";
        // The group is not there yet: the chgrp is refused before anything changes.
        let err = s
            .run("p", ("postinst", script), &["configure", ""], &files)
            .unwrap_err();
        assert!(
            err.to_string().contains("the group _ssh, which /etc/group"),
            "{err}"
        );
        s.run(
            "q",
            ("postinst", "addgroup --system _ssh\naddgroup --system rdma\nchgrp _ssh /usr/bin/ssh-agent\nchmod 2755 /usr/bin/ssh-agent\n"),
            &["configure", ""],
            &files,
        )
        .unwrap();
        let extra = s.finish(&mut files, &|p: &str| p.to_string());
        let text = |path: &str| match &extra.iter().find(|e| e.path == path).unwrap().source {
            Source::Bytes(b) => String::from_utf8(b.clone()).unwrap(),
            _ => unreachable!(),
        };
        assert_eq!(
            text("etc/group"),
            format!("{group}_ssh:x:101:\nrdma:x:102:\n")
        );
        assert_eq!(text("etc/gshadow"), "root:*::\n_ssh:!::\nrdma:!::\n");
        let gshadow = extra.iter().find(|e| e.path == "etc/gshadow").unwrap();
        assert_eq!((gshadow.mode, gshadow.owner.gid), (0o640, 42));
        let agent = &files["usr/bin/ssh-agent"].0;
        assert_eq!(
            (agent.mode, agent.owner),
            (0o2755, Owner { uid: 0, gid: 101 })
        );
    }

    #[test]
    fn sysusers_allocate_downward_from_999_and_keep_what_exists() {
        let base = BTreeMap::new();
        let read = |p: &str| -> Result<Option<String>> {
            Ok(match p {
                "etc/group" => Some("root:x:0:\nshadow:x:42:\nusers:x:100:\n".into()),
                "etc/gshadow" => Some(String::new()),
                "etc/passwd" => Some("root:x:0:0:root:/root:/bin/bash\n".into()),
                "etc/shadow" => Some("root:*:1::::::\n".into()),
                "usr/lib/sysusers.d/basic.conf" => Some("g users 100 -\nu root 0 - /root\n".into()),
                "usr/lib/sysusers.d/systemd-journal.conf" => {
                    Some("# journal\ng systemd-journal - -\n".into())
                }
                "usr/lib/sysusers.d/systemd-network.conf" => Some(
                    "u systemd-network - \"systemd Network Management\"\nm systemd-network users\n"
                        .into(),
                ),
                _ => None,
            })
        };
        let skip = BTreeMap::new();
        let mut s = Settler::new(&base, &read, &skip, 86_400 * 20_000).unwrap();
        let files = Files::new();
        s.run(
            "systemd",
            (
                "postinst",
                "systemd-sysusers basic.conf systemd-journal.conf systemd-network.conf\n",
            ),
            &["configure", ""],
            &files,
        )
        .unwrap();
        let err = s
            .run(
                "p",
                ("postinst", "systemd-sysusers absent.conf\n"),
                &["configure", ""],
                &files,
            )
            .unwrap_err();
        assert!(err.to_string().contains("a file it does not find"), "{err}");
        let mut files = Files::new();
        let extra = s.finish(&mut files, &|p: &str| p.to_string());
        let text = |path: &str| match &extra.iter().find(|e| e.path == path).unwrap().source {
            Source::Bytes(b) => String::from_utf8(b.clone()).unwrap(),
            _ => unreachable!(),
        };
        assert_eq!(
            text("etc/group"),
            "root:x:0:\nshadow:x:42:\nusers:x:100:systemd-network\nsystemd-journal:x:999:\n\
             systemd-network:x:998:\n"
        );
        assert_eq!(
            text("etc/passwd"),
            "root:x:0:0:root:/root:/bin/bash\n\
             systemd-network:x:998:998:systemd Network Management:/:/usr/sbin/nologin\n"
        );
        assert_eq!(
            text("etc/shadow"),
            "root:*:1::::::\nsystemd-network:!*:20000::::::\n"
        );
        assert_eq!(
            text("etc/gshadow"),
            "systemd-journal:!*::\nsystemd-network:!*::\n"
        );
        assert_eq!(sysusers_line("r - 500-900"), Err(()), "ranges are not made");
    }

    #[test]
    fn adduser_takes_the_first_free_system_uid_and_nogroup() {
        let base = BTreeMap::from([(
            "usr/sbin/adduser".to_string(),
            Node::File {
                mode: 0o755,
                size: 1,
            },
        )]);
        let read = |p: &str| -> Result<Option<String>> {
            Ok(match p {
                "etc/group" => Some("root:x:0:\nusers:x:100:\nnogroup:x:65534:\n".into()),
                "etc/passwd" => Some("root:x:0:0:root:/root:/bin/bash\n_apt:x:42:65534::/nonexistent:/usr/sbin/nologin\n".into()),
                "etc/shadow" => Some(String::new()),
                _ => None,
            })
        };
        let skip = BTreeMap::new();
        let mut s = Settler::new(&base, &read, &skip, 86_400 * 20_793).unwrap();
        let files = Files::new();
        let script = "adduser --quiet --system --no-create-home --home /run/sshd --shell /usr/sbin/nologin sshd\nadduser --system --group --no-create-home --home /run/svc svc\n";
        s.run(
            "openssh-server",
            ("postinst", script),
            &["configure", ""],
            &files,
        )
        .unwrap();
        let mut files = Files::new();
        let extra = s.finish(&mut files, &|p: &str| p.to_string());
        let text = |path: &str| match &extra.iter().find(|e| e.path == path).unwrap().source {
            Source::Bytes(b) => String::from_utf8(b.clone()).unwrap(),
            _ => unreachable!(),
        };
        // As adduser 3.134 and 3.137 leave them (bookworm's and noble's images under apt).
        assert!(text("etc/passwd").ends_with(
            "sshd:x:100:65534::/run/sshd:/usr/sbin/nologin\nsvc:x:101:101::/run/svc:/usr/sbin/nologin\n"
        ));
        assert_eq!(
            text("etc/shadow"),
            "sshd:!:20793::::::\nsvc:!:20793::::::\n"
        );
        assert!(text("etc/group").ends_with("svc:x:101:\n"));
    }

    #[test]
    fn alternatives_pick_the_highest_priority_and_skip_slaves_without_files() {
        let base = BTreeMap::new();
        let read = |_: &str| -> Result<Option<String>> { Ok(None) };
        let skip = BTreeMap::new();
        let mut s = Settler::new(&base, &read, &skip, 0).unwrap();
        let mut files: Files = [
            file("usr/bin/mpirun.openmpi", 0o755),
            file("usr/bin/mpiexec.openmpi", 0o755),
            file("usr/bin/mpirun.mpich", 0o755),
        ]
        .into_iter()
        .collect();
        let install = |path: &str, prio: u32| {
            format!(
                "update-alternatives --install /usr/bin/mpirun mpirun {path} {prio} \\\n --slave /usr/bin/mpiexec mpiexec /usr/bin/mpiexec.openmpi \\\n --slave /usr/share/man/man1/mpirun.1.gz mpirun.1.gz /usr/share/man/man1/mpirun.openmpi.1.gz\n"
            )
        };
        s.run(
            "a",
            ("postinst", &install("/usr/bin/mpirun.openmpi", 50)),
            &["configure", ""],
            &files,
        )
        .unwrap();
        s.run(
            "b",
            ("postinst", &install("/usr/bin/mpirun.mpich", 40)),
            &["configure", ""],
            &files,
        )
        .unwrap();
        let extra = s.finish(&mut files, &|p: &str| p.to_string());
        let link = |p: &str| match &files[p].0.source {
            Source::Symlink(t) => t.clone(),
            _ => panic!("{p} is no link"),
        };
        assert_eq!(link("usr/bin/mpirun"), "/etc/alternatives/mpirun");
        assert_eq!(link("etc/alternatives/mpirun"), "/usr/bin/mpirun.openmpi");
        assert_eq!(link("etc/alternatives/mpiexec"), "/usr/bin/mpiexec.openmpi");
        assert!(!files.contains_key("etc/alternatives/mpirun.1.gz"));
        let record = match &extra[0].source {
            Source::Bytes(b) => String::from_utf8(b.clone()).unwrap(),
            _ => unreachable!(),
        };
        assert_eq!(extra[0].path, "var/lib/dpkg/alternatives/mpirun");
        assert_eq!(
            record,
            "auto\n/usr/bin/mpirun\nmpiexec\n/usr/bin/mpiexec\nmpirun.1.gz\n\
             /usr/share/man/man1/mpirun.1.gz\n\n/usr/bin/mpirun.openmpi\n50\n\
             /usr/bin/mpiexec.openmpi\n/usr/share/man/man1/mpirun.openmpi.1.gz\n\
             /usr/bin/mpirun.mpich\n40\n/usr/bin/mpiexec.openmpi\n\
             /usr/share/man/man1/mpirun.openmpi.1.gz\n\n"
        );
    }

    #[test]
    fn a_script_not_modelled_is_refused_unless_skipped_with_a_reason() {
        let base = BTreeMap::new();
        let read = |_: &str| -> Result<Option<String>> { Ok(None) };
        let none = BTreeMap::new();
        let script = ("postinst", "set -e\nsystemd-hwdb --usr update || true\n");
        let files = Files::new();
        let err = Settler::new(&base, &read, &none, 0)
            .unwrap()
            .run("udev", script, &["configure", ""], &files)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("udev's postinst runs `systemd-hwdb --usr update`")
                && err.contains("system_scripts: {udev: {skip:"),
            "{err}"
        );
        let skip = BTreeMap::from([("udev".to_string(), "no hwdb in a container".to_string())]);
        let mut s = Settler::new(&base, &read, &skip, 0).unwrap();
        s.run("udev", script, &["configure", ""], &files).unwrap();
        assert_eq!(
            s.notes,
            ["udev's postinst runs `systemd-hwdb --usr update`: skipped (no hwdb in a container)"]
        );
        // A script that fails as dpkg runs it fails the build.
        let err = Settler::new(&base, &read, &none, 0)
            .unwrap()
            .run(
                "p",
                ("postinst", "set -e\nfalse\n"),
                &["configure", ""],
                &files,
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("p's postinst exits 1"), "{err}");
    }
}
