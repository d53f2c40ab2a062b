//! The host as the preflight reads it: files under a root (`/`, or a recorded tree), the
//! programs on the default PATH there, dpkg's record of installed packages, and the running
//! daemons from that root's `/proc`.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The directories a daemon started by systemd finds programs in (systemd's default PATH),
/// in its order.
const PATH_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// The largest configuration file read: daemon configs are a few kilobytes.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The host under `root`.
pub struct Host {
    root: PathBuf,
}

/// A daemon found running, with when it started.
#[derive(Clone, Debug)]
pub struct Daemon {
    /// Its process ID.
    pub pid: u32,
    /// Its command line.
    pub args: Vec<String>,
    /// When it started, from its `/proc` entry and the boot time.
    pub started: Option<SystemTime>,
}

impl Daemon {
    /// The value of `--flag VALUE` or `--flag=VALUE` (or the short form) on its command line.
    pub fn flag(&self, long: &str, short: Option<&str>) -> Option<String> {
        let mut args = self.args.iter().skip(1);
        while let Some(arg) = args.next() {
            if let Some(value) = arg.strip_prefix(&format!("{long}=")) {
                return Some(value.to_string());
            }
            if arg == long || short.is_some_and(|s| arg == s) {
                return args.next().cloned();
            }
        }
        None
    }
}

impl Host {
    /// The host whose files lie under `root`.
    pub fn under(root: &Path) -> Host {
        Host {
            root: root.to_path_buf(),
        }
    }

    /// Where the host's `path` lies here.
    pub fn at(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// Whether the host has `path` (of any kind).
    pub fn exists(&self, path: &str) -> bool {
        self.at(path).symlink_metadata().is_ok()
    }

    /// A text file of the host: None where it does not exist; an error naming it where it
    /// cannot be read, is larger than a config file should be, or is not text.
    pub fn read(&self, path: &str) -> Result<Option<String>, String> {
        use std::io::Read;
        let file = match std::fs::File::open(self.at(path)) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("reading {path}: {e}")),
        };
        let mut bytes = Vec::new();
        file.take(MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("reading {path}: {e}"))?;
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(format!(
                "reading {path}: larger than the {MAX_CONFIG_BYTES} bytes a config file may have"
            ));
        }
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| format!("reading {path}: not UTF-8 text"))
    }

    /// When the host's `path` was last changed, if it exists.
    pub fn modified(&self, path: &str) -> Option<SystemTime> {
        self.at(path).metadata().ok()?.modified().ok()
    }

    /// Where the host's `path` leads once its links are followed as the host would follow
    /// them (an absolute target is the host's path, under the root); None where it leads
    /// nowhere or through too many links.
    pub fn resolve(&self, path: &str) -> Option<String> {
        let mut path = path.to_string();
        for _ in 0..16 {
            let at = self.at(&path);
            let meta = at.symlink_metadata().ok()?;
            if !meta.file_type().is_symlink() {
                return Some(path);
            }
            let target = std::fs::read_link(&at).ok()?;
            path = if target.is_absolute() {
                target.to_string_lossy().into_owned()
            } else {
                Path::new(&path)
                    .parent()
                    .unwrap_or(Path::new("/"))
                    .join(target)
                    .to_string_lossy()
                    .into_owned()
            };
        }
        None
    }

    /// Whether `path` is an executable file, its links followed as the host would.
    pub fn executable(&self, path: &str) -> bool {
        self.resolve(path)
            .and_then(|p| self.at(&p).metadata().ok())
            .is_some_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }

    /// Where a daemon finds the program `name` (a bare name, looked up in the default PATH; a
    /// path, taken as it is), if it is there and executable.
    pub fn program(&self, name: &str) -> Option<String> {
        if name.contains('/') {
            return self.executable(name).then(|| name.to_string());
        }
        PATH_DIRS
            .iter()
            .map(|dir| format!("{dir}/{name}"))
            .find(|path| self.executable(path))
    }

    /// The version of each installed package of `names` from dpkg's status database (Debian
    /// and Ubuntu hosts); empty where there is none.
    pub fn packages(&self, names: &[&str]) -> Result<BTreeMap<String, String>, String> {
        let Some(text) = self.read_large("/var/lib/dpkg/status")? else {
            return Ok(BTreeMap::new());
        };
        let doc: deb822_fast::Deb822 = text
            .parse()
            .map_err(|e| format!("/var/lib/dpkg/status is not a deb822 file: {e}"))?;
        let mut found = BTreeMap::new();
        for stanza in doc.iter() {
            let (Some(name), Some(version)) = (stanza.get("Package"), stanza.get("Version")) else {
                continue;
            };
            // `install ok installed`; a package removed but not purged keeps a stanza.
            let installed = stanza
                .get("Status")
                .is_some_and(|s| s.trim().ends_with(" installed"));
            if installed && names.contains(&name.trim()) {
                found.insert(name.trim().to_string(), version.trim().to_string());
            }
        }
        Ok(found)
    }

    /// dpkg's status database is megabytes on a full host.
    fn read_large(&self, path: &str) -> Result<Option<String>, String> {
        match std::fs::read(self.at(path)) {
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("reading {path}: {e}")),
        }
    }

    /// The running processes whose program is `name` (`dockerd`, `containerd`), from the
    /// root's `/proc`.
    pub fn daemons(&self, name: &str) -> Vec<Daemon> {
        let Ok(entries) = std::fs::read_dir(self.at("/proc")) else {
            return Vec::new();
        };
        let boot = self.boot_time();
        let mut found: Vec<Daemon> = entries
            .filter_map(|e| {
                let e = e.ok()?;
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
                let args: Vec<String> = cmdline
                    .split(|&b| b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                let program = args.first()?.rsplit('/').next()?.to_string();
                (program == name).then(|| Daemon {
                    pid,
                    started: boot.and_then(|boot| {
                        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                        Some(boot + started_after_boot(&stat)?)
                    }),
                    args,
                })
            })
            .collect();
        found.sort_by_key(|d| d.pid);
        found
    }

    /// When the host booted: `btime` of `/proc/stat`.
    fn boot_time(&self) -> Option<SystemTime> {
        let stat = std::fs::read_to_string(self.at("/proc/stat")).ok()?;
        let seconds: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        Some(UNIX_EPOCH + Duration::from_secs(seconds))
    }
}

/// A TOML config's text as a table; an error names the file and the line.
pub fn parse_toml(path: &str, text: &str) -> Result<toml::Table, String> {
    text.parse().map_err(|e: toml::de::Error| {
        let line = e
            .span()
            .map(|s| format!(":{}", text[..s.start].matches('\n').count() + 1))
            .unwrap_or_default();
        format!("{path}{line}: not TOML: {}", e.message())
    })
}

/// How long after boot a process started: field 22 of its `/proc/PID/stat` (`starttime`,
/// in clock ticks), counted after the `)` that ends its name, which may hold spaces.
fn started_after_boot(stat: &str) -> Option<Duration> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields 3 onwards follow the name: starttime is the 20th of them.
    let ticks: u64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
    // SAFETY: sysconf only reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = u64::try_from(per_second).ok().filter(|&t| t > 0)?;
    Some(Duration::from_millis(ticks * 1000 / per_second))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_start_is_read_past_a_name_with_spaces_and_parentheses() {
        let stat = "42 (my (odd) daemon) S 1 42 42 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 12 0 \
                    1234 100000 200 18446744073709551615";
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        assert_eq!(
            started_after_boot(stat),
            Some(Duration::from_millis(1234 * 1000 / ticks))
        );
        assert_eq!(started_after_boot("42 (short) S 1"), None);
    }

    #[test]
    fn flags_are_read_in_both_forms_and_a_program_is_found_through_links() {
        let d = Daemon {
            pid: 1,
            args: ["dockerd", "--config-file=/x.json", "-c", "/y.toml"]
                .map(String::from)
                .to_vec(),
            started: None,
        };
        assert_eq!(d.flag("--config-file", None).as_deref(), Some("/x.json"));
        assert_eq!(d.flag("--config", Some("-c")).as_deref(), Some("/y.toml"));
        assert_eq!(d.flag("--data-root", None), None);

        let dir = tempfile::tempdir().unwrap();
        let host = Host::under(dir.path());
        std::fs::create_dir_all(host.at("/usr/bin")).unwrap();
        std::fs::create_dir_all(host.at("/opt/nct")).unwrap();
        std::fs::write(host.at("/opt/nct/hook"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            host.at("/opt/nct/hook"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        // An absolute link is the host's path, not this machine's.
        std::os::unix::fs::symlink("/opt/nct/hook", host.at("/usr/bin/nvidia-cdi-hook")).unwrap();
        std::fs::write(host.at("/usr/bin/nvidia-ctk"), "not executable").unwrap();
        assert_eq!(
            host.program("nvidia-cdi-hook").as_deref(),
            Some("/usr/bin/nvidia-cdi-hook")
        );
        assert_eq!(host.program("nvidia-ctk"), None);
        assert_eq!(
            host.program("/opt/nct/hook").as_deref(),
            Some("/opt/nct/hook")
        );
    }
}
