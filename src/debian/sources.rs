//! Where a base image gets its packages: its apt sources (one-line `sources.list` and deb822
//! `.sources`), its os-release, and the keyrings apt would trust for each source.
//!
//! Everything is read from an unpacked root directory; paths the root names (a `Signed-By`
//! file, an absolute symlink in trusted.gpg.d) are resolved inside that root, never on the host.

use crate::error::{Error, Result};
use std::path::{Component, Path, PathBuf};

/// One archive and suite apt reads binary packages from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The archive's base URI, without a trailing slash (`http://deb.debian.org/debian`).
    pub uri: String,
    /// The suite or codename under `dists/` (`bookworm`, `bookworm-updates`).
    pub suite: String,
    /// The components to read (`main`, `contrib`).
    pub components: Vec<String>,
    /// The keys a signature of this suite's InRelease must come from.
    pub keys: Keys,
    /// Where the source was declared (`ROOT/etc/apt/sources.list:3`, or what the caller says).
    pub at: String,
}

/// The keys a source trusts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keys {
    /// Keyring files (binary `.gpg` or armored `.asc`), as host paths.
    Files(Vec<PathBuf>),
    /// An armored key block written inline in a deb822 `Signed-By` field.
    Inline(String),
}

/// The fields of os-release(5) the archive client needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OsRelease {
    /// `ID` (`debian`, `ubuntu`).
    pub id: String,
    /// `ID_LIKE`, split on spaces.
    pub id_like: Vec<String>,
    /// `VERSION_CODENAME`, when set (`bookworm`, `noble`).
    pub version_codename: Option<String>,
    /// `VERSION_ID`, when set (`12`, `24.04`).
    pub version_id: Option<String>,
}

impl OsRelease {
    /// True for Debian, Ubuntu and the distributions that declare themselves like them.
    pub fn is_debian_like(&self) -> bool {
        std::iter::once(&self.id)
            .chain(&self.id_like)
            .any(|id| id == "debian" || id == "ubuntu")
    }
}

/// `path` (absolute or relative to the root) inside `root`, following symlinks as a chroot
/// would: an absolute link target restarts at `root`, `..` never climbs above it.
pub fn in_root(root: &Path, path: &Path) -> PathBuf {
    let mut pending: Vec<std::ffi::OsString> = path
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut done: Vec<std::ffi::OsString> = Vec::new();
    // A loop of links is cut after as many hops as Linux allows (40).
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            done.pop();
            continue;
        }
        let here: PathBuf = std::iter::once(root.as_os_str().to_os_string())
            .chain(done.iter().cloned())
            .chain(std::iter::once(part.clone()))
            .collect();
        match std::fs::read_link(&here) {
            Ok(target) if hops < 40 => {
                hops += 1;
                if target.is_absolute() {
                    done.clear();
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(n) => pending.push(n.to_os_string()),
                        Component::ParentDir => pending.push("..".into()),
                        _ => {}
                    }
                }
            }
            _ => done.push(part),
        }
    }
    std::iter::once(root.as_os_str().to_os_string())
        .chain(done)
        .collect()
}

/// The root's os-release: `/etc/os-release`, else `/usr/lib/os-release`, as os-release(5)
/// says. A root with neither is an Environment error naming both.
pub fn os_release(root: &Path) -> Result<OsRelease> {
    for candidate in ["etc/os-release", "usr/lib/os-release"] {
        let path = in_root(root, Path::new(candidate));
        match std::fs::read_to_string(&path) {
            Ok(text) => return Ok(parse_os_release(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::reading(path, e)),
        }
    }
    Err(Error::Environment(format!(
        "{}: neither etc/os-release nor usr/lib/os-release exists; is this an unpacked root?",
        root.display()
    )))
}

/// os-release's `KEY=value` lines, with shell quoting of the value undone.
pub fn parse_os_release(text: &str) -> OsRelease {
    let mut get = std::collections::HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            let value = value.trim();
            let unquoted = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(value);
            get.insert(key.trim().to_string(), unquoted.replace("\\\"", "\""));
        }
    }
    let non_empty = |k: &str| get.get(k).filter(|v| !v.is_empty()).cloned();
    OsRelease {
        // os-release(5): ID defaults to "linux" when absent.
        id: non_empty("ID").unwrap_or_else(|| "linux".into()),
        id_like: get
            .get("ID_LIKE")
            .map(|v| v.split_whitespace().map(String::from).collect())
            .unwrap_or_default(),
        version_codename: non_empty("VERSION_CODENAME"),
        version_id: non_empty("VERSION_ID"),
    }
}

/// The names in the directory `dir` that end with one of `endings`, in name order, as apt
/// reads its `.d` directories (and for stable messages); none when `dir` does not exist.
fn names_ending(dir: &Path, endings: &[&str]) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::reading(dir, e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::reading(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if endings.iter().any(|end| name.ends_with(end)) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// The keyrings apt trusts for a source without `Signed-By`: `/etc/apt/trusted.gpg` and every
/// `.gpg` and `.asc` in `/etc/apt/trusted.gpg.d` (apt's rule). A root that has none of them
/// falls back on its distribution's archive keyring in /usr/share/keyrings (`ID` and then
/// `ID_LIKE`), which is where debian-archive-keyring and ubuntu-keyring put it. Only those
/// named keyrings, never every file there: /usr/share/keyrings also holds Debian's
/// removed-keys keyring, which must not be trusted.
pub fn default_keyrings(root: &Path, os: &OsRelease) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let single = in_root(root, Path::new("etc/apt/trusted.gpg"));
    if single.is_file() {
        found.push(single);
    }
    let dir = in_root(root, Path::new("etc/apt/trusted.gpg.d"));
    for name in names_ending(&dir, &[".gpg", ".asc"])? {
        let path = in_root(root, &Path::new("etc/apt/trusted.gpg.d").join(name));
        if path.is_file() {
            found.push(path);
        }
    }
    if found.is_empty() {
        for id in std::iter::once(&os.id).chain(&os.id_like) {
            let path = in_root(
                root,
                Path::new(&format!("usr/share/keyrings/{id}-archive-keyring.gpg")),
            );
            if path.is_file() {
                found.push(path);
                break;
            }
        }
    }
    Ok(found)
}

/// Every enabled binary (`deb`) source of the root, in apt's order: `sources.list`, then
/// `sources.list.d/*.list` and `*.sources` by name. `native` is the root's dpkg architecture;
/// a source restricted to other architectures is left out. A root that is not Debian-like is
/// refused, naming its `ID`.
pub fn base_sources(root: &Path, native: &str) -> Result<Vec<Source>> {
    let os = os_release(root)?;
    if !os.is_debian_like() {
        return Err(Error::Unsupported(format!(
            "{}: the base is `{}` (os-release ID); system packages need a Debian or Ubuntu base",
            root.display(),
            os.id
        )));
    }
    let defaults = default_keyrings(root, &os)?;
    let mut files = Vec::new();
    let list = in_root(root, Path::new("etc/apt/sources.list"));
    if list.is_file() {
        files.push(list);
    }
    let dir = in_root(root, Path::new("etc/apt/sources.list.d"));
    files.extend(
        names_ending(&dir, &[".list", ".sources"])?
            .into_iter()
            .map(|n| dir.join(n)),
    );
    let reading = Reading {
        root,
        native,
        defaults: &defaults,
    };
    let mut sources = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| Error::reading(&file, e))?;
        let at = file.display().to_string();
        let parsed = if at.ends_with(".sources") {
            parse_deb822(&text, &at, &reading)?
        } else {
            parse_one_line(&text, &at, &reading)?
        };
        sources.extend(parsed);
    }
    Ok(sources)
}

/// The `deb` lines of a one-line-style sources file:
/// `deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] URI SUITE COMPONENT...`.
pub fn parse_one_line(text: &str, at: &str, reading: &Reading) -> Result<Vec<Source>> {
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let here = format!("{at}:{}", n + 1);
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (kind, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        match kind {
            "deb-src" => continue,
            "deb" => {}
            other => {
                return Err(Error::Usage(format!(
                    "{here}: `{other}` is no apt source type (deb or deb-src)"
                )));
            }
        }
        let mut rest = rest.trim_start();
        let mut options = Vec::new();
        if let Some(after) = rest.strip_prefix('[') {
            let Some((inside, tail)) = after.split_once(']') else {
                return Err(Error::Usage(format!(
                    "{here}: the options in `[` have no closing `]`"
                )));
            };
            for option in inside.split_whitespace() {
                let Some((key, value)) = option.split_once('=') else {
                    return Err(Error::Usage(format!(
                        "{here}: the option `{option}` is not KEY=VALUE"
                    )));
                };
                options.push((key.to_string(), value.to_string()));
            }
            rest = tail;
        }
        let words: Vec<&str> = rest.split_whitespace().collect();
        let [uri, suite, components @ ..] = &words[..] else {
            return Err(Error::Usage(format!(
                "{here}: a `deb` line needs a URI and a suite"
            )));
        };
        let mut arches = None;
        let mut signed_by = None;
        for (key, value) in &options {
            match key.as_str() {
                "arch" => arches = Some(value.split(',').map(String::from).collect()),
                "signed-by" => signed_by = Some(value.replace(',', " ")),
                "trusted" => refuse_trusted(&here, value)?,
                _ => {}
            }
        }
        out.extend(reading.source(
            &here,
            uri,
            suite,
            components.iter().map(|c| c.to_string()).collect(),
            arches,
            signed_by.as_deref(),
        )?);
    }
    Ok(out)
}

/// The stanzas of a deb822 `.sources` file (sources.list(5)): `Types`, `URIs`, `Suites`,
/// `Components`, `Signed-By` (files or an inline key), `Architectures`, `Enabled`.
pub fn parse_deb822(text: &str, at: &str, reading: &Reading) -> Result<Vec<Source>> {
    let doc: deb822_fast::Deb822 = text
        .parse()
        .map_err(|e| Error::Usage(format!("{at}: not a deb822 sources file: {e}")))?;
    let mut out = Vec::new();
    for (n, stanza) in doc.iter().enumerate() {
        let here = format!("{at}: stanza {}", n + 1);
        let words = |key: &str| -> Vec<String> {
            stanza
                .get(key)
                .map(|v| v.split_whitespace().map(String::from).collect())
                .unwrap_or_default()
        };
        if stanza
            .get("Enabled")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("no"))
        {
            continue;
        }
        if !words("Types").iter().any(|t| t == "deb") {
            continue;
        }
        if let Some(value) = stanza.get("Trusted") {
            refuse_trusted(&here, value.trim())?;
        }
        let uris = words("URIs");
        let suites = words("Suites");
        if uris.is_empty() || suites.is_empty() {
            return Err(Error::Usage(format!(
                "{here}: a deb822 source needs URIs and Suites"
            )));
        }
        let arches = stanza
            .get("Architectures")
            .map(|v| v.split_whitespace().map(String::from).collect());
        let signed_by = stanza.get("Signed-By");
        for uri in &uris {
            for suite in &suites {
                out.extend(reading.source(
                    &here,
                    uri,
                    suite,
                    words("Components"),
                    arches.clone(),
                    signed_by,
                )?);
            }
        }
    }
    Ok(out)
}

/// `trusted=yes` turns apt's signature check off; gpubake pins only from verified archives.
fn refuse_trusted(here: &str, value: &str) -> Result<()> {
    if value.eq_ignore_ascii_case("yes") {
        return Err(Error::Usage(format!(
            "{here}: `trusted=yes` skips the archive's signature; gpubake pins packages only \
             from a signed archive: name its keyring with signed-by instead"
        )));
    }
    Ok(())
}

/// What every source of a sources file is read against: the root its paths resolve in, the
/// root's dpkg architecture, and the keyrings a source without `Signed-By` trusts.
pub struct Reading<'a> {
    /// The unpacked root; `Signed-By` paths resolve inside it.
    pub root: &'a Path,
    /// The root's dpkg architecture; a source restricted to others is left out.
    pub native: &'a str,
    /// The keyrings of a source without `Signed-By` ([`default_keyrings`]).
    pub defaults: &'a [PathBuf],
}

impl Reading<'_> {
    /// The source one `deb` line or deb822 (URI, suite) declares at `here`; None when it is
    /// restricted to architectures other than the native one.
    fn source(
        &self,
        here: &str,
        uri: &str,
        suite: &str,
        components: Vec<String>,
        arches: Option<Vec<String>>,
        signed_by: Option<&str>,
    ) -> Result<Option<Source>> {
        if let Some(arches) = &arches
            && !arches.iter().any(|a| a == self.native)
        {
            return Ok(None);
        }
        if suite.ends_with('/') {
            return Err(Error::Unsupported(format!(
                "{here}: `{uri} {suite}` is a flat repository; gpubake reads only archives with \
                 dists/SUITE/InRelease"
            )));
        }
        if components.is_empty() {
            return Err(Error::Usage(format!(
                "{here}: `{uri} {suite}` names no component"
            )));
        }
        let keys = match signed_by.map(str::trim) {
            Some(value) if value.contains("-----BEGIN PGP PUBLIC KEY BLOCK-----") => {
                // deb822 writes an empty line of a multi-line value as ` .`.
                let block: Vec<&str> = value
                    .lines()
                    .map(|l| if l.trim() == "." { "" } else { l })
                    .collect();
                Keys::Inline(block.join("\n"))
            }
            Some(value) if !value.is_empty() => {
                let mut files = Vec::new();
                for item in value.split_whitespace() {
                    if !item.contains('/') {
                        return Err(Error::Unsupported(format!(
                            "{here}: signed-by `{item}` looks like a fingerprint; gpubake takes \
                             keyring files or an inline key"
                        )));
                    }
                    files.push(in_root(self.root, Path::new(item)));
                }
                Keys::Files(files)
            }
            _ => Keys::Files(self.defaults.to_vec()),
        };
        Ok(Some(Source {
            uri: uri.trim_end_matches('/').to_string(),
            suite: suite.to_string(),
            components,
            keys,
            at: here.to_string(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_sources_keep_options_and_skip_comments_and_deb_src() {
        let root = tempfile::tempdir().unwrap();
        let text = "# a comment\n\
            deb http://deb.debian.org/debian bookworm main contrib # trailing\n\
            deb-src http://deb.debian.org/debian bookworm main\n\
            deb [ arch=amd64,arm64 signed-by=/usr/share/keyrings/x.gpg ] https://ex.org/apt/ stable main\n\
            deb [arch=arm64] http://ports.example/ bookworm main\n";
        let defaults = vec![PathBuf::from("/default.gpg")];
        let reading = Reading {
            root: root.path(),
            native: "amd64",
            defaults: &defaults,
        };
        let got = parse_one_line(text, "sources.list", &reading).unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].uri, "http://deb.debian.org/debian");
        assert_eq!(got[0].suite, "bookworm");
        assert_eq!(got[0].components, ["main", "contrib"]);
        assert_eq!(got[0].keys, Keys::Files(defaults.clone()));
        assert_eq!(got[0].at, "sources.list:2");
        assert_eq!(got[1].uri, "https://ex.org/apt");
        assert_eq!(
            got[1].keys,
            Keys::Files(vec![root.path().join("usr/share/keyrings/x.gpg")])
        );
    }

    #[test]
    fn one_line_sources_refuse_what_they_cannot_honour() {
        let root = tempfile::tempdir().unwrap();
        let reading = Reading {
            root: root.path(),
            native: "amd64",
            defaults: &[],
        };
        let parse = |t: &str| parse_one_line(t, "s.list", &reading);
        let e = parse("deb [trusted=yes] http://x/ a main\n").unwrap_err();
        assert!(e.to_string().contains("s.list:1: `trusted=yes`"), "{e}");
        assert_eq!(e.exit_code(), 2);
        let e = parse("deb http://x/\n").unwrap_err();
        assert!(e.to_string().contains("needs a URI and a suite"), "{e}");
        let e = parse("\ndeb http://x/ ./\n").unwrap_err();
        assert!(
            e.to_string().contains("s.list:2: `http://x/ ./` is a flat"),
            "{e}"
        );
        let e = parse("rpm http://x/ a main\n").unwrap_err();
        assert!(e.to_string().contains("`rpm` is no apt source type"), "{e}");
    }

    #[test]
    fn deb822_sources_multiply_uris_and_suites_and_read_inline_keys() {
        let root = tempfile::tempdir().unwrap();
        let text = "# Debian\n\
            Types: deb deb-src\n\
            URIs: http://deb.debian.org/debian\n\
            Suites: bookworm bookworm-updates\n\
            Components: main\n\
            Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\
            \n\
            Types: deb\n\
            URIs: http://off.example/\n\
            Suites: x\n\
            Components: main\n\
            Enabled: no\n\
            \n\
            Types: deb-src\n\
            URIs: http://src.example/\n\
            Suites: x\n\
            Components: main\n\
            \n\
            Types: deb\n\
            URIs: http://inline.example/\n\
            Suites: y\n\
            Components: main universe\n\
            Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mDMEZ\n -----END PGP PUBLIC KEY BLOCK-----\n";
        let reading = Reading {
            root: root.path(),
            native: "amd64",
            defaults: &[],
        };
        let got = parse_deb822(text, "d.sources", &reading).unwrap();
        let pairs: Vec<(String, String)> = got
            .iter()
            .map(|s| (s.uri.clone(), s.suite.clone()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("http://deb.debian.org/debian".into(), "bookworm".into()),
                (
                    "http://deb.debian.org/debian".into(),
                    "bookworm-updates".into()
                ),
                ("http://inline.example".into(), "y".into()),
            ]
        );
        assert_eq!(
            got[0].keys,
            Keys::Files(vec![
                root.path()
                    .join("usr/share/keyrings/debian-archive-keyring.gpg")
            ])
        );
        assert_eq!(
            got[2].keys,
            Keys::Inline(
                "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZ\n-----END PGP PUBLIC KEY BLOCK-----"
                    .into()
            )
        );
        assert_eq!(got[2].components, ["main", "universe"]);
    }

    #[test]
    fn os_release_unquotes_and_defaults() {
        let os = parse_os_release(
            "PRETTY_NAME=\"Ubuntu 24.04 LTS\"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID=\"24.04\"\n\
             VERSION_CODENAME=noble\n",
        );
        assert_eq!(os.id, "ubuntu");
        assert_eq!(os.id_like, ["debian"]);
        assert_eq!(os.version_id.as_deref(), Some("24.04"));
        assert_eq!(os.version_codename.as_deref(), Some("noble"));
        assert!(os.is_debian_like());
        let alpine = parse_os_release("ID=alpine\nVERSION_ID=3.20.0\n");
        assert!(!alpine.is_debian_like());
        assert_eq!(parse_os_release("").id, "linux");
    }

    #[test]
    fn paths_resolve_inside_the_root_even_through_absolute_links() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("usr/lib")).unwrap();
        std::fs::create_dir_all(r.join("etc/apt/trusted.gpg.d")).unwrap();
        std::fs::write(r.join("usr/lib/os-release"), "ID=debian\n").unwrap();
        std::os::unix::fs::symlink("../usr/lib/os-release", r.join("etc/os-release")).unwrap();
        std::fs::create_dir_all(r.join("usr/share/keyrings")).unwrap();
        std::fs::write(r.join("usr/share/keyrings/k.gpg"), "key").unwrap();
        // An absolute link, as packages install them: it must land in the root, not the host.
        std::os::unix::fs::symlink(
            "/usr/share/keyrings/k.gpg",
            r.join("etc/apt/trusted.gpg.d/k.gpg"),
        )
        .unwrap();
        std::os::unix::fs::symlink("/../../../etc/passwd", r.join("escape")).unwrap();
        assert_eq!(os_release(r).unwrap().id, "debian");
        let os = os_release(r).unwrap();
        assert_eq!(
            default_keyrings(r, &os).unwrap(),
            [r.join("usr/share/keyrings/k.gpg")]
        );
        assert_eq!(in_root(r, Path::new("escape")), r.join("etc/passwd"));
    }

    #[test]
    fn a_root_without_trusted_keys_falls_back_on_its_distribution_keyring() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("usr/share/keyrings")).unwrap();
        for name in [
            "debian-archive-removed-keys.gpg",
            "ubuntu-archive-keyring.gpg",
        ] {
            std::fs::write(r.join("usr/share/keyrings").join(name), "k").unwrap();
        }
        let os = parse_os_release("ID=pop\nID_LIKE=\"ubuntu debian\"\n");
        assert_eq!(
            default_keyrings(r, &os).unwrap(),
            [r.join("usr/share/keyrings/ubuntu-archive-keyring.gpg")]
        );
    }
}
