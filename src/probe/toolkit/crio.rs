//! CRI-O's side: `crio.conf` and every file of its drop-in directory, applied in name order
//! (the last one wins), the `nvidia` runtime `nvidia-ctk runtime configure --runtime=crio`
//! writes there (`runtime_path`), and the drop-in directory toolkits 1.18.0 to 1.19.0 wrote
//! to, which CRI-O does not read. CDI is always on in CRI-O (1.24 and later).

use super::host::{Daemon, Host};
use std::time::SystemTime;

/// Where CRI-O reads its config unless `--config` says otherwise.
pub const DEFAULT_CONFIG: &str = "/etc/crio/crio.conf";

/// Its drop-in directory unless `--config-dir` says otherwise.
pub const DEFAULT_DROP_INS: &str = "/etc/crio/crio.conf.d";

/// Where toolkits 1.18.0 to 1.19.0 wrote their drop-in (and NVIDIA's install guide still
/// says): a directory CRI-O does not read.
pub const UNREAD_DROP_IN: &str = "/etc/crio/conf.d/99-nvidia.toml";

/// CRI-O on the host.
#[derive(Clone, Debug)]
pub struct Crio {
    /// Every file read, in the order applied.
    pub files: Vec<String>,
    /// `crio.runtime.runtimes.nvidia.runtime_path`, where the runtime is configured (the
    /// inner None: configured without a path).
    pub nvidia: Option<Option<String>>,
    /// `crio.runtime.default_runtime`.
    pub default_runtime: Option<String>,
    /// `crio.runtime.cgroup_manager` (systemd unless set).
    pub cgroup_manager: String,
    /// `crio.runtime.cdi_spec_dirs`, where set.
    pub cdi_spec_dirs: Option<Vec<String>>,
    /// The running crio, if any.
    pub daemon: Option<Daemon>,
}

impl Crio {
    /// CRI-O as the host has it, or None where it has none; an error names the file and
    /// line that could not be read.
    pub fn read(host: &Host) -> Result<Option<Crio>, String> {
        let daemon = host.daemons("crio").into_iter().next();
        let flag =
            |long: &str, short: &str| daemon.as_ref().and_then(|d| d.flag(long, Some(short)));
        let config = flag("--config", "-c").unwrap_or_else(|| DEFAULT_CONFIG.into());
        let drop_ins = flag("--config-dir", "-d").unwrap_or_else(|| DEFAULT_DROP_INS.into());
        let installed = daemon.is_some()
            || host.program("crio").is_some()
            || host.exists(&config)
            || host.exists(&drop_ins);
        if !installed {
            return Ok(None);
        }
        let mut paths = vec![config];
        if let Ok(entries) = std::fs::read_dir(host.at(&drop_ins)) {
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .filter_map(|e| e.file_name().into_string().ok())
                .collect();
            names.sort();
            paths.extend(names.into_iter().map(|n| format!("{drop_ins}/{n}")));
        }
        let mut crio = Crio {
            files: Vec::new(),
            nvidia: None,
            default_runtime: None,
            cgroup_manager: "systemd".into(),
            cdi_spec_dirs: None,
            daemon,
        };
        for path in paths {
            let Some(text) = host.read(&path)? else {
                continue;
            };
            let table = super::host::parse_toml(&path, &text)?;
            crio.apply(&table);
            crio.files.push(path);
        }
        Ok(Some(crio))
    }

    /// What one file sets, over what the files before it set.
    fn apply(&mut self, table: &toml::Table) {
        let Some(runtime) = table
            .get("crio")
            .and_then(|c| c.get("runtime"))
            .and_then(toml::Value::as_table)
        else {
            return;
        };
        if let Some(nvidia) = runtime.get("runtimes").and_then(|r| r.get("nvidia")) {
            self.nvidia = Some(
                nvidia
                    .get("runtime_path")
                    .and_then(|p| p.as_str())
                    .map(str::to_string),
            );
        }
        if let Some(default) = runtime.get("default_runtime").and_then(|v| v.as_str()) {
            self.default_runtime = Some(default.to_string());
        }
        if let Some(manager) = runtime.get("cgroup_manager").and_then(|v| v.as_str()) {
            self.cgroup_manager = manager.to_string();
        }
        if let Some(dirs) = runtime.get("cdi_spec_dirs").and_then(|v| v.as_array()) {
            self.cdi_spec_dirs = Some(
                dirs.iter()
                    .filter_map(|d| d.as_str().map(str::to_string))
                    .collect(),
            );
        }
    }

    /// When the running crio started, if one runs and its start is known.
    pub fn started(&self) -> Option<SystemTime> {
        self.daemon.as_ref()?.started
    }
}
