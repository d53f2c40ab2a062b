//! Known plugins (data/plugins.yaml): shared objects a library opens with dlopen only when a
//! setting selects them, with the settings that do. The link closure asks this table about a
//! shared object nothing needs whose own needs the image cannot resolve: what would select it,
//! and whether the image's own settings (its config's environment, the files it bakes) do.

use serde::Deserialize;
use std::path::Path;
use std::sync::OnceLock;

const PLUGINS_YAML: &str = include_str!("../../data/plugins.yaml");

/// data/plugins.yaml as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    /// The documents the entries cite, by name (the file's YAML anchors).
    pub sources: std::collections::BTreeMap<String, String>,
    /// The plugins.
    pub plugins: Vec<Plugin>,
}

/// One plugin and what makes its loader open it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plugin {
    /// Its file name, as the loader passes it to dlopen.
    pub file: String,
    /// The library that opens it.
    pub loader: String,
    /// Each list selects it when all its conditions hold.
    pub selected: Vec<Vec<Condition>>,
    /// Where upstream states the selectors.
    pub sources: Vec<String>,
    /// The wheel whose copy of the plugin the fixture records.
    pub recorded: String,
}

/// One setting a selector reads.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Condition {
    /// A bool as NVSHMEM reads one: set, and not starting with 0, N, n, F or f.
    Flag {
        /// The variable.
        env: String,
        /// Always true.
        flag: bool,
    },
    /// A variable whose value (or the loader's default when it is unset) is one of `any_of`.
    Env {
        /// The variable.
        env: String,
        /// The values that select, compared without case.
        any_of: Vec<String>,
        /// What the loader takes when the variable is unset.
        #[serde(default)]
        default: Option<String>,
    },
    /// A JSON configuration file in which the value at a dotted path is a non-empty list.
    Json {
        /// The file the loader reads by default.
        json: String,
        /// The variable that names another file instead.
        #[serde(default)]
        file_env: Option<String>,
        /// The dotted path to the list.
        nonempty: String,
    },
}

/// The embedded table.
pub fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        // The unit tests parse the embedded file, so this cannot fail in a build whose tests
        // passed.
        serde_yaml::from_str(PLUGINS_YAML).expect("data/plugins.yaml parses (its tests say so)")
    })
}

/// The known plugin whose file name is that of `path`.
pub fn known(path: &str) -> Option<&'static Plugin> {
    let name = Path::new(path).file_name()?.to_str()?;
    table().plugins.iter().find(|p| p.file == name)
}

/// What the image sees of its own settings: its config's environment and its files.
pub struct Settings<'a> {
    /// The config's `Env`.
    pub env: &'a [(String, String)],
    /// Reads a file of the image by its absolute path; None when it is not there.
    pub read: &'a dyn Fn(&str) -> Option<Vec<u8>>,
}

impl Settings<'_> {
    fn var(&self, name: &str) -> Option<&str> {
        // The last entry wins, as it does when the runtime builds the process environment.
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Condition {
    /// The condition in words: `NVSHMEM_REMOTE_TRANSPORT=ucx`.
    pub fn describe(&self) -> String {
        match self {
            Condition::Flag { env, .. } => format!("{env}=1"),
            Condition::Env { env, any_of, .. } => format!("{env}={}", any_of.join("|")),
            Condition::Json {
                json,
                file_env,
                nonempty,
            } => match file_env {
                Some(var) => format!("{nonempty} set in {json} (or in the file ${var} names)"),
                None => format!("{nonempty} set in {json}"),
            },
        }
    }

    /// The image's setting that makes the condition hold, in words; None when it does not hold.
    /// A default alone never counts: the image must say it.
    fn held_by(&self, settings: &Settings) -> Option<String> {
        match self {
            Condition::Flag { env, .. } => {
                let value = settings.var(env)?;
                let off = value.starts_with(['0', 'N', 'n', 'F', 'f']);
                (!off).then(|| format!("{env}={value}"))
            }
            Condition::Env {
                env,
                any_of,
                default,
            } => {
                let value = settings.var(env).or(default.as_deref())?;
                any_of
                    .iter()
                    .any(|v| v.eq_ignore_ascii_case(value))
                    .then(|| format!("{env}={value}"))
            }
            Condition::Json {
                json,
                file_env,
                nonempty,
            } => {
                let file = file_env
                    .as_deref()
                    .and_then(|v| settings.var(v))
                    .unwrap_or(json);
                let bytes = (settings.read)(file)?;
                let value: serde_json::Value =
                    serde_json::from_str(&strip_line_comments(&String::from_utf8_lossy(&bytes)))
                        .ok()?;
                let list = nonempty.split('.').try_fold(&value, |v, key| v.get(key))?;
                list.as_array()
                    .is_some_and(|a| !a.is_empty())
                    .then(|| format!("{nonempty} in {file}"))
            }
        }
    }
}

impl Plugin {
    /// What would select the plugin, in words: one line per way.
    pub fn selectors(&self) -> Vec<String> {
        self.selected
            .iter()
            .map(|all| {
                all.iter()
                    .map(Condition::describe)
                    .collect::<Vec<_>>()
                    .join(" and ")
            })
            .collect()
    }

    /// The image's settings that select the plugin, in words; None when nothing the image sets
    /// selects it. A selector whose conditions hold only by the loader's defaults does not
    /// count: those plugins are the ones their loader opens for everyone, and their defaults
    /// are what the table's entries leave out.
    pub fn selected_by(&self, settings: &Settings) -> Option<String> {
        self.selected.iter().find_map(|all| {
            let held: Vec<String> = all
                .iter()
                .map(|c| c.held_by(settings))
                .collect::<Option<_>>()?;
            let said = all.iter().any(|c| match c {
                Condition::Flag { env, .. } | Condition::Env { env, .. } => {
                    settings.var(env).is_some()
                }
                Condition::Json { .. } => true,
            });
            said.then(|| held.join(" and "))
        })
    }
}

/// JSON text without the `//` comments NVIDIA's cufile.json carries (outside strings).
fn strip_line_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_string = false;
        let mut escaped = false;
        let mut end = line.len();
        let bytes = line.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if in_string => escaped = true,
                b'"' => in_string = !in_string,
                b'/' if !in_string && bytes.get(i + 1) == Some(&b'/') => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        out.push_str(&line[..end]);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings<'a>(
        env: &'a [(String, String)],
        read: &'a dyn Fn(&str) -> Option<Vec<u8>>,
    ) -> Settings<'a> {
        Settings { env, read }
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_table_parses_and_every_entry_cites_a_source() {
        let t = table();
        assert!(!t.plugins.is_empty());
        for p in &t.plugins {
            assert!(!p.sources.is_empty(), "{} cites nothing", p.file);
            assert!(!p.selected.is_empty(), "{} has no selector", p.file);
            assert!(p.selected.iter().all(|all| !all.is_empty()), "{}", p.file);
        }
    }

    #[test]
    fn a_selector_counts_only_when_the_image_sets_it() {
        let none = |_: &str| None;
        let ucx = known("/x/nvidia/nvshmem/lib/nvshmem_transport_ucx.so.3").unwrap();
        assert_eq!(ucx.selected_by(&settings(&env(&[]), &none)), None);
        let e = env(&[("NVSHMEM_REMOTE_TRANSPORT", "UCX")]);
        assert_eq!(
            ucx.selected_by(&settings(&e, &none)).as_deref(),
            Some("NVSHMEM_REMOTE_TRANSPORT=UCX")
        );
        let e = env(&[("NVSHMEM_REMOTE_TRANSPORT", "ibrc")]);
        assert_eq!(ucx.selected_by(&settings(&e, &none)), None);

        // PMIx under the default bootstrap (PMI), and not under MPI.
        let pmix = known("nvshmem_bootstrap_pmix.so.3").unwrap();
        let e = env(&[("NVSHMEM_BOOTSTRAP_PMI", "pmix")]);
        assert!(pmix.selected_by(&settings(&e, &none)).is_some());
        let e = env(&[
            ("NVSHMEM_BOOTSTRAP_PMI", "PMIX"),
            ("NVSHMEM_BOOTSTRAP", "MPI"),
        ]);
        assert_eq!(pmix.selected_by(&settings(&e, &none)), None);

        // NVSHMEM's bools: set and not 0/n/f.
        let ibgda = known("nvshmem_transport_ibgda.so.3").unwrap();
        for (value, on) in [("1", true), ("true", true), ("0", false), ("false", false)] {
            let e = env(&[("NVSHMEM_IB_ENABLE_IBGDA", value)]);
            assert_eq!(
                ibgda.selected_by(&settings(&e, &none)).is_some(),
                on,
                "{value}"
            );
        }
    }

    #[test]
    fn cufile_rdma_is_selected_by_rdma_addresses_in_cufile_json() {
        let rdma = known("libcufile_rdma.so.1").unwrap();
        let json = |list: &'static str| {
            move |path: &str| {
                (path == "/etc/cufile.json").then(|| {
                    format!(
                        "{{\n // a comment, as NVIDIA's file has\n \"properties\": {{ \"rdma_dev_addr_list\": {list} }} // and here\n}}"
                    )
                    .into_bytes()
                })
            }
        };
        let empty = json("[]");
        assert_eq!(rdma.selected_by(&settings(&env(&[]), &empty)), None);
        let set = json("[\"10.0.0.1\"]");
        assert!(rdma.selected_by(&settings(&env(&[]), &set)).is_some());
        // CUFILE_ENV_PATH_JSON names another file, which the image lacks.
        let e = env(&[("CUFILE_ENV_PATH_JSON", "/opt/cufile.json")]);
        assert_eq!(rdma.selected_by(&settings(&e, &set)), None);
    }
}
