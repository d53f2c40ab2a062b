//! containerd's side: `config.toml` and the files its `imports` name, merged as containerd
//! merges them (each imported file over what came before), the CRI plugin's table by the
//! config's version (`io.containerd.grpc.v1.cri` in version 2, `io.containerd.cri.v1.runtime`
//! from version 3), the `nvidia` runtime `nvidia-ctk runtime configure --runtime=containerd`
//! adds there, and CDI (`enable_cdi`: off by default in version 2, on from 3).

use super::host::{Daemon, Host};
use std::time::SystemTime;

/// Where containerd reads its config unless `--config` says otherwise.
pub const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";

/// The drop-ins of the toolkit: 1.18.1 and later, and 1.18.0.
pub const TOOLKIT_DROP_INS: [&str; 2] = [
    "/etc/containerd/conf.d/99-nvidia.toml",
    "/etc/containerd/config.d/99-nvidia.toml",
];

/// How deep imports may nest: containerd itself follows them until none is new.
const MAX_FILES: usize = 64;

/// containerd on the host.
#[derive(Clone, Debug)]
pub struct Containerd {
    /// The top-level config file.
    pub config_path: String,
    /// Every file read, the top-level one first, in merge order.
    pub files: Vec<String>,
    /// The config version (1 where a non-empty file names none, 2 where there is no file).
    pub version: i64,
    /// The `nvidia` runtime's binary, where the runtime is configured.
    pub nvidia: Option<Runtime>,
    /// The `runc` runtime's cgroup setting, for comparison.
    pub runc_systemd_cgroup: Option<bool>,
    /// `default_runtime_name`.
    pub default_runtime: Option<String>,
    /// `enable_cdi`, as written.
    pub enable_cdi: Option<bool>,
    /// The running containerd, if any.
    pub daemon: Option<Daemon>,
}

/// A runtime handler of the CRI plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Runtime {
    /// `options.BinaryName`.
    pub binary: Option<String>,
    /// `options.SystemdCgroup`.
    pub systemd_cgroup: Option<bool>,
}

impl Containerd {
    /// containerd as the host has it, or None where it has none; an error names the file and
    /// line that could not be read.
    pub fn read(host: &Host) -> Result<Option<Containerd>, String> {
        let daemon = host.daemons("containerd").into_iter().next();
        let config_path = daemon
            .as_ref()
            .and_then(|d| d.flag("--config", Some("-c")))
            .unwrap_or_else(|| DEFAULT_CONFIG.to_string());
        let installed =
            daemon.is_some() || host.program("containerd").is_some() || host.exists(&config_path);
        if !installed {
            return Ok(None);
        }
        let mut merged = toml::Table::new();
        let mut files = Vec::new();
        let mut version = None;
        let mut pending = vec![config_path.clone()];
        while let Some(path) = pending.first().cloned() {
            pending.remove(0);
            if files.contains(&path) {
                continue;
            }
            if files.len() == MAX_FILES {
                return Err(format!(
                    "{config_path}: its imports name more than {MAX_FILES} files"
                ));
            }
            let Some(text) = host.read(&path)? else {
                continue;
            };
            let table = super::host::parse_toml(&path, &text)?;
            // The top-level file's version is the config's; an empty file has none.
            if files.is_empty() {
                version = Some(match table.get("version") {
                    Some(v) => v
                        .as_integer()
                        .ok_or_else(|| format!("{path}: version is not a number"))?,
                    None if table.is_empty() => 2,
                    None => 1,
                });
            }
            for import in imports(&table, &path)? {
                pending.extend(expand(host, &import));
            }
            merge(&mut merged, table);
            files.push(path);
        }
        let version = version.unwrap_or(2);
        let plugin = if version >= 3 {
            "io.containerd.cri.v1.runtime"
        } else {
            "io.containerd.grpc.v1.cri"
        };
        let cri = merged
            .get("plugins")
            .and_then(|p| p.get(plugin))
            .and_then(toml::Value::as_table);
        let runtimes = cri
            .and_then(|c| c.get("containerd"))
            .and_then(|c| c.get("runtimes"));
        let runtime = |name: &str| {
            let r = runtimes?.get(name)?;
            let options = r.get("options");
            Some(Runtime {
                binary: options
                    .and_then(|o| o.get("BinaryName"))
                    .and_then(|b| b.as_str())
                    .map(str::to_string),
                systemd_cgroup: options
                    .and_then(|o| o.get("SystemdCgroup"))
                    .and_then(|b| b.as_bool()),
            })
        };
        Ok(Some(Containerd {
            files,
            version,
            nvidia: runtime("nvidia"),
            runc_systemd_cgroup: runtime("runc").and_then(|r| r.systemd_cgroup),
            default_runtime: cri
                .and_then(|c| c.get("containerd"))
                .and_then(|c| c.get("default_runtime_name"))
                .and_then(|v| v.as_str())
                .map(str::to_string),
            enable_cdi: cri
                .and_then(|c| c.get("enable_cdi"))
                .and_then(|v| v.as_bool()),
            daemon,
            config_path,
        }))
    }

    /// The CRI plugin's table in this config's version.
    pub fn plugin(&self) -> &'static str {
        if self.version >= 3 {
            "io.containerd.cri.v1.runtime"
        } else {
            "io.containerd.grpc.v1.cri"
        }
    }

    /// Whether CDI injection is on: as written, else containerd's default for the version.
    pub fn cdi_enabled(&self) -> bool {
        self.enable_cdi.unwrap_or(self.version >= 3)
    }

    /// When the running containerd started, if one runs and its start is known.
    pub fn started(&self) -> Option<SystemTime> {
        self.daemon.as_ref()?.started
    }
}

/// The `imports` of a config file, relative ones taken from its directory.
fn imports(table: &toml::Table, path: &str) -> Result<Vec<String>, String> {
    let Some(value) = table.get("imports") else {
        return Ok(Vec::new());
    };
    let list = value
        .as_array()
        .ok_or_else(|| format!("{path}: imports is not a list"))?;
    let dir = std::path::Path::new(path)
        .parent()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    list.iter()
        .map(|v| {
            let s = v
                .as_str()
                .ok_or_else(|| format!("{path}: imports holds a value that is not a string"))?;
            Ok(if s.starts_with('/') {
                s.to_string()
            } else {
                format!("{dir}/{s}")
            })
        })
        .collect()
}

/// The files an import names: itself, or for a `*` in its file name every match, sorted
/// (Go's filepath.Glob, which containerd calls, sorts; a pattern only in the file name is
/// what the toolkit and containerd's defaults write).
fn expand(host: &Host, import: &str) -> Vec<String> {
    let (dir, name) = import.rsplit_once('/').unwrap_or(("", import));
    if !name.contains('*') {
        return vec![import.to_string()];
    }
    let Ok(entries) = std::fs::read_dir(host.at(dir)) else {
        return Vec::new();
    };
    let mut found: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| glob_match(name, n))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    found.sort();
    found
}

/// Whether `name` matches `pattern`, whose only special character is `*` (any run of
/// characters, `/` aside, which a file name lacks).
fn glob_match(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            let Some(rest) = name.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i))
                .any(|i| glob_match(tail, &rest[i..]))
        }
    }
}

/// Merges `over` into `base` as containerd 2.1 and later merge an imported file: tables key
/// by key, any other value replaced. Earlier releases replaced each plugin's table whole;
/// the toolkit's drop-ins copy the whole CRI table for that reason, so on them both agree.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_in_a_file_name() {
        assert!(glob_match("*.toml", "99-nvidia.toml"));
        assert!(!glob_match("*.toml", "99-nvidia.toml.bak"));
        assert!(glob_match("99-*.toml", "99-nvidia.toml"));
        assert!(!glob_match("99-*.toml", "10-other.toml"));
        assert!(glob_match("*", "anything"));
    }

    #[test]
    fn an_imported_table_merges_key_by_key() {
        let mut base: toml::Table = "[a]\nx = 1\ny = 2\n[b]\nz = 3\n".parse().unwrap();
        merge(&mut base, "[a]\ny = 20\nw = 4\n".parse().unwrap());
        assert_eq!(
            base,
            "[a]\nx = 1\ny = 20\nw = 4\n[b]\nz = 3\n".parse().unwrap()
        );
    }
}
