//! Which registries may be reached without verified TLS, read from the files that already say
//! so for skopeo, podman and docker on the same machine:
//!
//! - containers-registries.conf(5): the `[[registry]]` table whose `prefix` (by default its
//!   `location`) is the longest to match `HOST[:PORT]/REPOSITORY`, when it says
//!   `insecure = true`, and the v1 form `[registries.insecure] registries = [...]`. The file is
//!   `--registries-conf` (skopeo's option), else `$CONTAINERS_REGISTRIES_CONF` (podman's and
//!   buildah's variable), else `~/.config/containers/registries.conf` where it exists, else
//!   `/etc/containers/registries.conf`; the drop-ins (`*.conf` in `registries.conf.d` beside
//!   them, in name order) follow, an entry of a later file replacing one of the same prefix.
//! - docker's daemon.json `insecure-registries` (`$GPUBAKE_DOCKER_DAEMON_JSON`, else
//!   `/etc/docker/daemon.json`): `HOST[:PORT]` entries, and CIDRs an address of the registry's
//!   host falls in.
//! - loopback: docker counts 127.0.0.0/8 as insecure without being told (`docker info` lists
//!   it under "Insecure Registries").
//!
//! What gpubake does with the answer is [`super::registry::Session::open`]'s business.

use crate::error::{Error, Location, Result};
use std::net::{IpAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

/// What the configuration says of one registry.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Standing {
    /// The file that marks the registry insecure; None when none does.
    pub marked_in: Option<PathBuf>,
    /// The registry's host is a loopback address (or a name with only such addresses).
    pub loopback: bool,
}

/// The standing of `registry` (`HOST[:PORT]` as the reference writes it) for an image in
/// `repository`, with `registries_conf` in place of the usual registries.conf when given.
pub(super) fn standing(
    registry: &str,
    repository: &str,
    registries_conf: Option<&Path>,
) -> Result<Standing> {
    let addresses = addresses(host_of(registry));
    let loopback = !addresses.is_empty() && addresses.iter().all(IpAddr::is_loopback);
    let reference = format!("{registry}/{repository}");
    let marked_in = match marked_in_registries_conf(&reference, registries_conf)? {
        Some(file) => Some(file),
        None => marked_in_daemon_json(&daemon_json(), registry, &addresses)?,
    };
    Ok(Standing {
        marked_in,
        loopback,
    })
}

/// True when `host` (a name or an address, as a URL writes it) is loopback.
pub(super) fn is_loopback(host: &str) -> bool {
    let addresses = addresses(host_of(host));
    !addresses.is_empty() && addresses.iter().all(IpAddr::is_loopback)
}

/// The host of `HOST[:PORT]` (`[V6]:PORT` too), without brackets.
fn host_of(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match registry.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => registry,
    }
}

/// The host's addresses: itself when it is one, else what the resolver says (none when it
/// cannot say).
fn addresses(host: &str) -> Vec<IpAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return vec![ip];
    }
    (host, 0)
        .to_socket_addrs()
        .map(|a| a.map(|s| s.ip()).collect())
        .unwrap_or_default()
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct RegistriesConf {
    registry: Vec<RegistryTable>,
    registries: V1Tables,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct RegistryTable {
    location: String,
    prefix: String,
    insecure: bool,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct V1Tables {
    insecure: V1List,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct V1List {
    registries: Vec<String>,
}

/// One prefix and whether it is insecure, with the file that says so.
struct Entry {
    prefix: String,
    insecure: bool,
    file: PathBuf,
}

/// registries.conf and its drop-ins, in the order they are read.
fn registries_conf_files(given: Option<&Path>) -> Result<Vec<PathBuf>> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let user_file = home
        .as_ref()
        .map(|h| h.join(".config/containers/registries.conf"));
    let user_dir = home.map(|h| h.join(".config/containers/registries.conf.d"));
    let system_dir = PathBuf::from("/etc/containers/registries.conf.d");
    let chosen = given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("CONTAINERS_REGISTRIES_CONF").map(PathBuf::from));
    let (main, dirs) = match (chosen, user_file) {
        (Some(file), _) => (file, vec![Some(system_dir), user_dir]),
        (None, Some(user)) if user.exists() => (user, vec![user_dir]),
        (None, _) => (
            PathBuf::from("/etc/containers/registries.conf"),
            vec![Some(system_dir), user_dir],
        ),
    };
    if let Some(given) = given
        && !given.is_file()
    {
        return Err(Error::Usage(format!(
            "--registries-conf {}: no such file",
            given.display()
        )));
    }
    let mut files = vec![main];
    for dir in dirs.into_iter().flatten() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut drop_ins: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "conf") && p.is_file())
            .collect();
        drop_ins.sort();
        files.extend(drop_ins);
    }
    Ok(files)
}

/// The entries of one registries.conf; none when the file is not there.
fn read_registries_conf(file: &Path) -> Result<Vec<Entry>> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::reading(file, e)),
    };
    let at = |offset: Option<usize>| {
        let line = offset.map(|o| text[..o.min(text.len())].lines().count().max(1));
        Location {
            file: file.display().to_string(),
            line,
            column: None,
        }
    };
    let conf: RegistriesConf = toml::from_str(&text).map_err(|e| {
        Error::invalid(
            at(e.span().map(|s| s.start)),
            None,
            format!("not a registries.conf: {}", e.message().trim()),
            None,
        )
    })?;
    let mut entries: Vec<Entry> = Vec::new();
    let tables = conf.registry.iter().enumerate().map(|(i, t)| {
        let prefix = if t.prefix.is_empty() {
            &t.location
        } else {
            &t.prefix
        };
        (format!("registry[{i}]"), prefix.clone(), t.insecure)
    });
    let v1 = conf
        .registries
        .insecure
        .registries
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (
                format!("registries.insecure.registries[{i}]"),
                r.clone(),
                true,
            )
        });
    for (field, prefix, insecure) in tables.chain(v1) {
        let prefix = prefix.trim_end_matches('/').to_string();
        if prefix.is_empty() || prefix.contains("://") {
            return Err(Error::invalid(
                at(None),
                Some(field),
                format!("location {prefix:?} is not HOST[:PORT][/NAMESPACE]"),
                Some("a registry without a scheme, such as \"registry.example:5000\"".into()),
            ));
        }
        // Within a file the first entry of a prefix counts, as containers/image reads it.
        if !entries.iter().any(|e| e.prefix == prefix) {
            entries.push(Entry {
                prefix,
                insecure,
                file: file.to_path_buf(),
            });
        }
    }
    Ok(entries)
}

/// The registries.conf file that marks `reference` (`HOST[:PORT]/REPOSITORY`) insecure.
fn marked_in_registries_conf(reference: &str, given: Option<&Path>) -> Result<Option<PathBuf>> {
    let mut entries: Vec<Entry> = Vec::new();
    for file in registries_conf_files(given)? {
        for entry in read_registries_conf(&file)? {
            entries.retain(|e| e.prefix != entry.prefix);
            entries.push(entry);
        }
    }
    let best = entries
        .into_iter()
        .filter(|e| prefix_matches(reference, &e.prefix))
        .max_by_key(|e| e.prefix.len());
    Ok(best.filter(|e| e.insecure).map(|e| e.file))
}

/// containers-registries.conf(5)'s matching: the prefix is the reference, or its start up to
/// a `/`, `:` or `@`; `*.DOMAIN` matches any subdomain of DOMAIN.
fn prefix_matches(reference: &str, prefix: &str) -> bool {
    let ends_there = |rest: &str| rest.is_empty() || rest.starts_with([':', '/', '@']);
    if let Some(domain) = prefix.strip_prefix('*') {
        return reference.find(domain).is_some_and(|i| {
            !reference[..i].contains('/') && ends_there(&reference[i + domain.len()..])
        });
    }
    reference.strip_prefix(prefix).is_some_and(ends_there)
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct DaemonJson {
    #[serde(rename = "insecure-registries")]
    insecure_registries: Vec<String>,
}

/// Docker's daemon.json: `$GPUBAKE_DOCKER_DAEMON_JSON`, else `/etc/docker/daemon.json`.
fn daemon_json() -> PathBuf {
    std::env::var_os("GPUBAKE_DOCKER_DAEMON_JSON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/docker/daemon.json"))
}

/// `file` (a daemon.json), when it lists `registry` as insecure, or a CIDR one of `addresses`
/// is in.
fn marked_in_daemon_json(
    file: &Path,
    registry: &str,
    addresses: &[IpAddr],
) -> Result<Option<PathBuf>> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::reading(file, e)),
    };
    let daemon: DaemonJson = serde_json::from_str(&text).map_err(|e| {
        Error::invalid(
            Location {
                file: file.display().to_string(),
                line: Some(e.line()),
                column: Some(e.column()),
            },
            None,
            format!("not a docker daemon.json: {e}"),
            None,
        )
    })?;
    for (i, entry) in daemon.insecure_registries.iter().enumerate() {
        // dockerd drops a scheme written before an entry.
        let entry = entry
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/');
        let listed = match entry.parse::<ipnet::IpNet>() {
            Ok(net) => addresses.iter().any(|a| net.contains(a)),
            Err(_) if entry.contains('/') => {
                return Err(Error::invalid(
                    Location {
                        file: file.display().to_string(),
                        line: None,
                        column: None,
                    },
                    Some(format!("insecure-registries[{i}]")),
                    format!("{entry:?} is neither HOST[:PORT] nor a CIDR"),
                    None,
                ));
            }
            Err(_) => entry == registry,
        };
        if listed {
            return Ok(Some(file.to_path_buf()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_as_containers_registries_conf_says() {
        assert!(prefix_matches("10.0.0.2:5000/a/b", "10.0.0.2:5000"));
        assert!(prefix_matches("10.0.0.2:5000/a/b", "10.0.0.2:5000/a"));
        assert!(!prefix_matches("10.0.0.2:5000/ab/c", "10.0.0.2:5000/a"));
        assert!(!prefix_matches("10.0.0.2:50001/a", "10.0.0.2:5000"));
        assert!(prefix_matches("reg.example.com/a", "*.example.com"));
        assert!(prefix_matches("a.b.example.com:5000/a", "*.example.com"));
        assert!(!prefix_matches("example.com/a", "*.example.com"));
        assert!(!prefix_matches("other.com/x.example.com", "*.example.com"));
    }

    #[test]
    fn hosts_are_told_from_ports_and_loopback_from_the_rest() {
        assert_eq!(host_of("127.0.0.1:5000"), "127.0.0.1");
        assert_eq!(host_of("[::1]:5000"), "::1");
        assert_eq!(host_of("registry.example"), "registry.example");
        assert!(is_loopback("127.0.0.1:5000"));
        assert!(is_loopback("127.8.9.1"));
        assert!(is_loopback("[::1]:443"));
        assert!(!is_loopback("10.1.2.3:5000"));
        assert!(!is_loopback("name.invalid:5000"));
    }

    #[test]
    fn the_longest_prefix_decides_and_a_later_file_replaces_an_entry() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("registries.conf");
        std::fs::write(
            &conf,
            "unqualified-search-registries = [\"docker.io\"]\n\
             [[registry]]\nlocation = \"10.0.0.2:5000\"\ninsecure = true\n\
             [[registry]]\nlocation = \"10.0.0.2:5000/secure\"\n\
             [[registry]]\nprefix = \"*.corp.example\"\nlocation = \"mirror.corp.example\"\ninsecure = true\n",
        )
        .unwrap();
        let marked = |r: &str| marked_in_registries_conf(r, Some(&conf)).unwrap();
        assert_eq!(marked("10.0.0.2:5000/team/app"), Some(conf.clone()));
        assert_eq!(marked("10.0.0.2:5000/secure/app"), None);
        assert_eq!(marked("reg.corp.example/app"), Some(conf.clone()));
        assert_eq!(marked("10.0.0.3:5000/team/app"), None);

        let v1 = dir.path().join("v1.conf");
        std::fs::write(
            &v1,
            "[registries.insecure]\nregistries = ['10.0.0.3:5000']\n",
        )
        .unwrap();
        assert_eq!(
            marked_in_registries_conf("10.0.0.3:5000/a", Some(&v1)).unwrap(),
            Some(v1.clone())
        );
    }

    #[test]
    fn a_broken_registries_conf_or_daemon_json_is_named_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("registries.conf");
        std::fs::write(&conf, "[[registry]]\nlocation = \"a\"\ninsecure = yes\n").unwrap();
        let err = marked_in_registries_conf("a/b", Some(&conf))
            .unwrap_err()
            .to_string();
        assert!(err.contains("registries.conf:3"), "{err}");
        std::fs::write(&conf, "[[registry]]\nlocation = \"http://a\"\n").unwrap();
        let err = marked_in_registries_conf("a/b", Some(&conf))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("registry[0]") && err.contains("http://a"),
            "{err}"
        );
        let err = marked_in_registries_conf("a/b", Some(&dir.path().join("none")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--registries-conf"), "{err}");

        let daemon = dir.path().join("daemon.json");
        std::fs::write(
            &daemon,
            "{\"insecure-registries\": [\"10.0.0.0/8\", \"reg:5000\"],\n}",
        )
        .unwrap();
        let err = marked_in_daemon_json(&daemon, "reg:5000", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("daemon.json:2:1"), "{err}");
    }

    #[test]
    fn docker_insecure_registries_are_names_and_cidrs() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = dir.path().join("daemon.json");
        std::fs::write(
            &daemon,
            r#"{"mtu": 1400, "insecure-registries": ["10.1.0.0/16", "http://reg.example:5000"]}"#,
        )
        .unwrap();
        let ten: IpAddr = "10.1.2.3".parse().unwrap();
        let other: IpAddr = "10.2.2.3".parse().unwrap();
        let marked = |r: &str, a: &[IpAddr]| marked_in_daemon_json(&daemon, r, a).unwrap();
        assert_eq!(marked("10.1.2.3:5000", &[ten]), Some(daemon.clone()));
        assert_eq!(marked("10.2.2.3:5000", &[other]), None);
        assert_eq!(marked("reg.example:5000", &[other]), Some(daemon.clone()));
        assert_eq!(marked("reg.example:5001", &[other]), None);
        assert_eq!(
            marked_in_daemon_json(&dir.path().join("none.json"), "a", &[]).unwrap(),
            None
        );
    }
}
