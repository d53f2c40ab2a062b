//! The NVIDIA Container Toolkit on the host: its programs, its package version and
//! `/etc/nvidia-container-runtime/config.toml`, read as the toolkit reads it (a key left out,
//! or commented out as the package writes defaults, means its default).

use super::host::Host;

/// Where the toolkit reads its configuration.
pub const CONFIG: &str = "/etc/nvidia-container-runtime/config.toml";

/// The toolkit's packages, newest name first.
pub const PACKAGES: [&str; 2] = ["nvidia-container-toolkit", "nvidia-container-toolkit-base"];

/// What the host has of the toolkit.
#[derive(Clone, Debug, Default)]
pub struct Toolkit {
    /// The package version, where dpkg knows it.
    pub version: Option<String>,
    /// `nvidia-container-runtime`, the runtime engines register.
    pub runtime: Option<String>,
    /// `nvidia-container-runtime-hook`, the prestart hook of legacy injection and of Docker's
    /// `--gpus`.
    pub hook: Option<String>,
    /// `nvidia-cdi-hook`, which CDI specs name for their createContainer hooks.
    pub cdi_hook: Option<String>,
    /// `nvidia-ctk`, which writes engine configs and CDI specs.
    pub ctk: Option<String>,
    /// Its config file.
    pub config: Config,
}

/// The toolkit's config file, as far as the preflight judges it.
#[derive(Clone, Debug)]
pub struct Config {
    /// Whether the file exists (without it, every key has its default).
    pub present: bool,
    /// `nvidia-container-runtime.mode`: auto, legacy, cdi, jit-cdi or csv.
    pub mode: String,
    /// `nvidia-container-cli.no-cgroups`.
    pub no_cgroups: bool,
    /// `nvidia-container-cli.ldconfig`.
    pub ldconfig: String,
    /// `features.allow-ldconfig-from-container`.
    pub ldconfig_from_container: bool,
    /// `nvidia-container-runtime.runtimes`: the low-level runtimes it hands over to, the
    /// first found wins.
    pub runtimes: Vec<String>,
    /// `nvidia-container-runtime.modes.cdi.spec-dirs`.
    pub spec_dirs: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            present: false,
            mode: "auto".into(),
            no_cgroups: false,
            ldconfig: "@/sbin/ldconfig".into(),
            ldconfig_from_container: false,
            runtimes: vec!["runc".into(), "crun".into()],
            spec_dirs: crate::cdi::DEFAULT_SPEC_DIRS
                .iter()
                .map(|d| d.to_string())
                .collect(),
        }
    }
}

impl Toolkit {
    /// The toolkit as the host has it; an error names the file that could not be read.
    pub fn read(host: &Host) -> Result<Toolkit, String> {
        let packages = host.packages(&PACKAGES)?;
        let version = PACKAGES.iter().find_map(|p| packages.get(*p).cloned());
        let config = match host.read(CONFIG)? {
            Some(text) => Config::parse(&text)?,
            None => Config::default(),
        };
        Ok(Toolkit {
            version,
            runtime: host.program("nvidia-container-runtime"),
            hook: host.program("nvidia-container-runtime-hook"),
            cdi_hook: host.program("nvidia-cdi-hook"),
            ctk: host.program("nvidia-ctk"),
            config,
        })
    }

    /// Whether any piece of the toolkit is installed.
    pub fn installed(&self) -> bool {
        self.version.is_some()
            || self.runtime.is_some()
            || self.hook.is_some()
            || self.ctk.is_some()
    }

    /// How `nvidia-container-runtime` injects GPUs: `auto` resolves to jit-cdi from the
    /// toolkit's 1.18.0 release candidates on and to legacy before; None where `auto` meets
    /// an unknown version.
    pub fn runtime_mode(&self) -> Option<&str> {
        match self.config.mode.as_str() {
            "auto" => {
                let version = self.version.as_deref()?;
                Some(if at_least(version, "1.18.0~rc.1") {
                    "jit-cdi"
                } else {
                    "legacy"
                })
            }
            mode => Some(mode),
        }
    }

    /// Whether the hook (Docker's `--gpus` without `--runtime=nvidia`) runs at all: it
    /// resolves `auto` to legacy and refuses any other mode set explicitly.
    pub fn hook_refuses(&self) -> bool {
        !matches!(self.config.mode.as_str(), "auto" | "legacy")
    }
}

impl Config {
    /// Reads the config's text; an error names the file, the line and the key.
    pub fn parse(text: &str) -> Result<Config, String> {
        let doc = super::host::parse_toml(CONFIG, text)?;
        let table = |name: &str| doc.get(name).and_then(toml::Value::as_table);
        let string =
            |t: Option<&toml::Table>, section: &str, key: &str| -> Result<Option<String>, String> {
                match t.and_then(|t| t.get(key)) {
                    None => Ok(None),
                    Some(toml::Value::String(s)) => Ok(Some(s.clone())),
                    Some(other) => Err(format!(
                        "{CONFIG}: {section}.{key} is {}, where the toolkit reads a string",
                        other.type_str()
                    )),
                }
            };
        let boolean =
            |t: Option<&toml::Table>, section: &str, key: &str| -> Result<Option<bool>, String> {
                match t.and_then(|t| t.get(key)) {
                    None => Ok(None),
                    Some(toml::Value::Boolean(b)) => Ok(Some(*b)),
                    Some(other) => Err(format!(
                        "{CONFIG}: {section}.{key} is {}, where the toolkit reads true or false",
                        other.type_str()
                    )),
                }
            };
        let strings = |t: Option<&toml::Table>,
                       section: &str,
                       key: &str|
         -> Result<Option<Vec<String>>, String> {
            match t.and_then(|t| t.get(key)) {
                None => Ok(None),
                Some(toml::Value::Array(items)) => items
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .map(Some)
                    .ok_or_else(|| {
                        format!("{CONFIG}: {section}.{key} holds a value that is not a string")
                    }),
                Some(other) => Err(format!(
                    "{CONFIG}: {section}.{key} is {}, where the toolkit reads a list of strings",
                    other.type_str()
                )),
            }
        };
        let runtime = table("nvidia-container-runtime");
        let cli = table("nvidia-container-cli");
        let features = table("features");
        let cdi_mode = runtime
            .and_then(|r| r.get("modes"))
            .and_then(toml::Value::as_table)
            .and_then(|m| m.get("cdi"))
            .and_then(toml::Value::as_table);
        let defaults = Config::default();
        let mode = string(runtime, "nvidia-container-runtime", "mode")?.unwrap_or(defaults.mode);
        if !["auto", "legacy", "cdi", "jit-cdi", "csv"].contains(&mode.as_str()) {
            return Err(format!(
                "{CONFIG}: nvidia-container-runtime.mode = \"{mode}\": the toolkit knows auto, \
                 legacy, cdi, jit-cdi and csv"
            ));
        }
        Ok(Config {
            present: true,
            mode,
            no_cgroups: boolean(cli, "nvidia-container-cli", "no-cgroups")?.unwrap_or(false),
            ldconfig: string(cli, "nvidia-container-cli", "ldconfig")?.unwrap_or(defaults.ldconfig),
            ldconfig_from_container: boolean(
                features,
                "features",
                "allow-ldconfig-from-container",
            )?
            .unwrap_or(false),
            runtimes: strings(runtime, "nvidia-container-runtime", "runtimes")?
                .unwrap_or(defaults.runtimes),
            spec_dirs: strings(cdi_mode, "nvidia-container-runtime.modes.cdi", "spec-dirs")?
                .unwrap_or(defaults.spec_dirs),
        })
    }
}

/// Whether the Debian version `have` (`1.18.1-1`) is at least `want`.
pub fn at_least(have: &str, want: &str) -> bool {
    match (
        have.parse::<debversion::Version>(),
        want.parse::<debversion::Version>(),
    ) {
        (Ok(have), Ok(want)) => have >= want,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the package's postinst leaves (`nvidia-ctk config --in-place`): defaults commented
    /// out, so a missing key is its default.
    #[test]
    fn a_config_of_defaults_commented_out_reads_as_the_defaults() {
        let text = "#accept-nvidia-visible-devices-as-volume-mounts = false\n\
                    [nvidia-container-cli]\n#ldconfig = \"@/sbin/ldconfig.real\"\n\
                    #no-cgroups = false\n[nvidia-container-runtime]\n#mode = \"auto\"\n";
        let config = Config::parse(text).unwrap();
        assert!(config.present);
        assert_eq!(config.mode, "auto");
        assert!(!config.no_cgroups);
        assert_eq!(config.runtimes, ["runc", "crun"]);
    }

    #[test]
    fn a_wrong_key_type_or_mode_or_bad_toml_is_named_with_its_place() {
        let err = Config::parse("[nvidia-container-runtime]\nmode = \"magic\"\n").unwrap_err();
        assert!(err.contains("mode = \"magic\""), "{err}");
        let err = Config::parse("[nvidia-container-cli]\nno-cgroups = \"yes\"\n").unwrap_err();
        assert!(
            err.contains("nvidia-container-cli.no-cgroups is string"),
            "{err}"
        );
        let err = Config::parse("[nvidia-container-cli]\n\nldconfig = @/sbin\n").unwrap_err();
        assert!(err.starts_with(&format!("{CONFIG}:3: not TOML")), "{err}");
    }

    #[test]
    fn auto_resolves_by_the_toolkits_version_and_the_hook_refuses_other_modes() {
        let kit = |version: Option<&str>, mode: &str| Toolkit {
            version: version.map(str::to_string),
            config: Config {
                mode: mode.into(),
                ..Config::default()
            },
            ..Toolkit::default()
        };
        assert_eq!(kit(Some("1.17.8-1"), "auto").runtime_mode(), Some("legacy"));
        assert_eq!(
            kit(Some("1.18.0-1"), "auto").runtime_mode(),
            Some("jit-cdi")
        );
        assert_eq!(
            kit(Some("1.18.0~rc.1-1"), "auto").runtime_mode(),
            Some("jit-cdi")
        );
        assert_eq!(
            kit(Some("1.17.9~rc.1-1"), "auto").runtime_mode(),
            Some("legacy")
        );
        assert_eq!(kit(None, "auto").runtime_mode(), None);
        assert_eq!(kit(None, "cdi").runtime_mode(), Some("cdi"));
        assert!(!kit(None, "auto").hook_refuses());
        assert!(!kit(None, "legacy").hook_refuses());
        assert!(kit(None, "cdi").hook_refuses());
    }
}
