//! The Docker Engine's side: `daemon.json` as `nvidia-ctk runtime configure --runtime=docker`
//! writes it and as dockerd reads it, the GPU device driver `--gpus` needs (registered at
//! dockerd's start when the toolkit's hook is on its PATH), CDI by Docker's version, and the
//! cgroup driver.

use super::host::{Daemon, Host};
use std::collections::BTreeMap;
use std::time::SystemTime;

/// Where dockerd reads its config unless `--config-file` says otherwise.
pub const DEFAULT_CONFIG: &str = "/etc/docker/daemon.json";

/// Where the Docker snap's dockerd reads its config.
pub const SNAP_CONFIG: &str = "/var/snap/docker/current/config/daemon.json";

/// The packages Docker comes in.
const PACKAGES: [&str; 3] = ["docker-ce", "docker.io", "moby-engine"];

/// Docker on the host.
#[derive(Clone, Debug)]
pub struct Docker {
    /// The config file dockerd reads.
    pub config_path: String,
    /// Whether it exists.
    pub config_present: bool,
    /// `runtimes`: name to path.
    pub runtimes: BTreeMap<String, Option<String>>,
    /// `default-runtime`.
    pub default_runtime: Option<String>,
    /// `features.cdi`.
    pub cdi_feature: Option<bool>,
    /// `cdi-spec-dirs`.
    pub cdi_spec_dirs: Option<Vec<String>>,
    /// `native.cgroupdriver` from `exec-opts`.
    pub cgroup_driver: Option<String>,
    /// The engine's version from its package, as `MAJOR.MINOR.PATCH`.
    pub version: Option<String>,
    /// Whether it is the snap.
    pub snap: bool,
    /// The running dockerd, if any.
    pub daemon: Option<Daemon>,
}

impl Docker {
    /// Docker as the host has it, or None where it has no Docker; an error names the file and
    /// the line that could not be read.
    pub fn read(host: &Host) -> Result<Option<Docker>, String> {
        let daemon = host.daemons("dockerd").into_iter().next();
        let snap = host.exists("/snap/docker") || host.exists("/var/snap/docker");
        let installed = daemon.is_some()
            || snap
            || host.program("dockerd").is_some()
            || host.exists(DEFAULT_CONFIG);
        if !installed {
            return Ok(None);
        }
        let config_path = daemon
            .as_ref()
            .and_then(|d| d.flag("--config-file", None))
            .unwrap_or_else(|| (if snap { SNAP_CONFIG } else { DEFAULT_CONFIG }).to_string());
        let text = host.read(&config_path)?;
        let config: serde_json::Map<String, serde_json::Value> = match &text {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| format!("{config_path}:{}:{}: {e}", e.line(), e.column()))?,
            None => serde_json::Map::new(),
        };
        let runtimes = match config.get("runtimes") {
            None => BTreeMap::new(),
            Some(serde_json::Value::Object(map)) => map
                .iter()
                .map(|(name, r)| {
                    (
                        name.clone(),
                        r.get("path").and_then(|p| p.as_str()).map(str::to_string),
                    )
                })
                .collect(),
            Some(_) => return Err(format!("{config_path}: \"runtimes\" is not an object")),
        };
        let strings = |key: &str| -> Option<Vec<String>> {
            config.get(key)?.as_array().map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
        };
        let cgroup_driver = strings("exec-opts").and_then(|opts| {
            opts.iter().find_map(|o| {
                o.strip_prefix("native.cgroupdriver=")
                    .map(|d| d.trim().to_string())
            })
        });
        let packages = host.packages(&PACKAGES)?;
        let version = PACKAGES
            .iter()
            .find_map(|p| packages.get(*p))
            .and_then(|v| engine_version(v));
        Ok(Some(Docker {
            config_present: text.is_some(),
            runtimes,
            default_runtime: config
                .get("default-runtime")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            cdi_feature: config
                .get("features")
                .and_then(|f| f.get("cdi"))
                .and_then(|v| v.as_bool()),
            cdi_spec_dirs: strings("cdi-spec-dirs"),
            cgroup_driver,
            version,
            snap,
            daemon,
            config_path,
        }))
    }

    /// Whether Docker's own CDI is on: from 28.2 unless `features.cdi` is false, from 25.0
    /// only where it is true, never before; None where the version is unknown.
    pub fn cdi_enabled(&self) -> Option<bool> {
        let version = self.version.as_deref()?;
        Some(match self.cdi_feature {
            Some(false) => false,
            _ if at_least(version, (28, 2)) => true,
            Some(true) => at_least(version, (25, 0)),
            None => false,
        })
    }

    /// The cgroup driver dockerd uses: `exec-opts`, else systemd where the host runs cgroup v2
    /// under systemd (Docker 20.10 and later), else cgroupfs.
    pub fn cgroup_driver(&self, host: &Host) -> String {
        self.cgroup_driver.clone().unwrap_or_else(|| {
            if cgroup_v2(host) && systemd(host) {
                "systemd".into()
            } else {
                "cgroupfs".into()
            }
        })
    }

    /// When the running dockerd started, if one runs and its start is known.
    pub fn started(&self) -> Option<SystemTime> {
        self.daemon.as_ref()?.started
    }
}

/// Whether the host mounts the unified cgroup hierarchy (cgroup v2).
pub fn cgroup_v2(host: &Host) -> bool {
    host.exists("/sys/fs/cgroup/cgroup.controllers")
}

/// Whether systemd is the host's init (what dockerd and runc test).
pub fn systemd(host: &Host) -> bool {
    host.at("/run/systemd/system").is_dir()
}

/// `MAJOR.MINOR.PATCH` of a Docker package version: `5:28.2.1-1~debian.12~bookworm` (Docker's
/// own packages, with an epoch), `26.1.5+dfsg1-9+b9` (Debian's).
fn engine_version(package: &str) -> Option<String> {
    let upstream = package.split_once(':').map_or(package, |(_, v)| v);
    let numeric: String = upstream
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let parts: Vec<&str> = numeric.split('.').filter(|p| !p.is_empty()).collect();
    (parts.len() >= 2).then(|| parts.join("."))
}

/// Whether `MAJOR.MINOR[.PATCH]` is at least `want`.
pub fn at_least(version: &str, want: (u32, u32)) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let have = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    have >= want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_of_dockers_and_debians_packages_are_read_and_compared() {
        assert_eq!(
            engine_version("5:28.2.1-1~debian.12~bookworm").as_deref(),
            Some("28.2.1")
        );
        assert_eq!(
            engine_version("26.1.5+dfsg1-9+b9").as_deref(),
            Some("26.1.5")
        );
        assert_eq!(engine_version("latest"), None);
        assert!(at_least("28.2.1", (28, 2)));
        assert!(!at_least("28.1.9", (28, 2)));
        assert!(at_least("29.0", (28, 2)));
    }

    #[test]
    fn cdi_follows_the_version_and_the_feature_flag() {
        let docker = |version: &str, feature: Option<bool>| Docker {
            config_path: DEFAULT_CONFIG.into(),
            config_present: true,
            runtimes: BTreeMap::new(),
            default_runtime: None,
            cdi_feature: feature,
            cdi_spec_dirs: None,
            cgroup_driver: None,
            version: Some(version.into()),
            snap: false,
            daemon: None,
        };
        assert_eq!(docker("24.0.7", Some(true)).cdi_enabled(), Some(false));
        assert_eq!(docker("25.0.0", None).cdi_enabled(), Some(false));
        assert_eq!(docker("25.0.0", Some(true)).cdi_enabled(), Some(true));
        assert_eq!(docker("28.2.0", None).cdi_enabled(), Some(true));
        assert_eq!(docker("28.2.0", Some(false)).cdi_enabled(), Some(false));
    }
}
