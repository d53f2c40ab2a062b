//! Lock + base image -> new image, without a daemon: the base's blobs are imported (each
//! verified, each layer scanned for paths that escape the root), three reproducible layers
//! are added (the recipe's files, the gpubake probe binary, the NCCL preset with the lock),
//! and the config gains the merged environment, the NVIDIA variables, the pin labels and a
//! history entry per layer. `index.json` (or the archive) is written last.

use super::fs::PRESET_PATH_IN_IMAGE;
use super::layer::{BuiltLayer, Compression, Entry, LayerSpec, Source, build_layer, tree_entries};
use super::layout::{Layout, digest_of};
use super::model::{Image, Platform, strings};
use super::stack;
use super::transport::Transport;
use crate::error::{Error, Result};
use crate::lock::LOCK_PATH_IN_IMAGE;
use crate::recipe::LoadedRecipe;
use crate::resolve::Resolved;
use crate::wheel::cache::{FetchOptions, WheelCache};
use oci_spec::image::{Descriptor, ImageManifestBuilder, MediaType};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;

/// The label that says where the Python stack is: the venv's path, or `none` for an image
/// built with `--without-python` (a preflight image, which certify does not hold to the
/// lock's Python pins).
pub const STACK_LABEL: &str = "io.gpubake.python-stack";

/// Where the probe binary is stored in the image.
pub const PROBE_PATH_IN_IMAGE: &str = "/usr/local/bin/gpubake";

/// How to build.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// The destination.
    pub to: Transport,
    /// The base, overriding the recipe's `base`.
    pub from: Option<Transport>,
    /// Layer compression.
    pub compression: Compression,
    /// The timestamp of every new file and of the image (`SOURCE_DATE_EPOCH`, else 0).
    pub epoch: u64,
    /// Write every layer again instead of trusting the cache (which knows files by path,
    /// size and mtime, as make and rsync do).
    pub no_cache: bool,
    /// The Python closure to install; None builds an image without the Python stack.
    pub closure: Option<crate::closure::Closure>,
    /// Build from the wheel cache alone.
    pub offline: bool,
    /// gpubake's cache ([`WheelCache::default_root`] for the user's): the wheels, and the
    /// layers of images built for a destination other than an OCI layout.
    pub cache_dir: std::path::PathBuf,
    /// The most layers the Python stack may take.
    pub stack_layers: usize,
    /// The gpubake binary the image gets as its probe (the running one, for the CLI).
    pub probe: std::path::PathBuf,
}

/// One layer of the result.
#[derive(Debug, Serialize)]
pub struct LayerLine {
    /// `base`, `files`, `probe` or `presets`.
    pub name: String,
    /// Its digest.
    pub digest: String,
    /// Compressed size.
    pub size: u64,
    /// Taken from the cache or the base rather than written now.
    pub reused: bool,
}

/// What a build produced.
#[derive(Debug, Serialize)]
pub struct BuildReport {
    /// The destination.
    pub image: String,
    /// The manifest's digest.
    pub manifest: String,
    /// The base's manifest digest.
    pub base: String,
    /// The config's digest.
    pub config: String,
    /// Every layer, base first.
    pub layers: Vec<LayerLine>,
}

/// The timestamp reproducible builds use: `SOURCE_DATE_EPOCH` when set, else 0.
pub fn source_date_epoch() -> Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().map_err(|_| {
            Error::Usage(format!(
                "SOURCE_DATE_EPOCH=`{v}` is not a number of seconds"
            ))
        }),
        _ => Ok(0),
    }
}

/// RFC 3339 UTC time of a Unix timestamp.
pub fn rfc3339(epoch: u64) -> String {
    let days = (epoch / 86_400) as i64;
    let secs = epoch % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// Builds the image for a resolved recipe.
pub fn build(
    loaded: &LoadedRecipe,
    resolved: &Resolved,
    opts: &BuildOptions,
) -> Result<BuildReport> {
    let base_ref = match &opts.from {
        Some(t) => t.clone(),
        // The recipe's `base:` is an image reference (`nvidia/cuda:12.8.1-…`), pulled from its
        // registry, or a transport where it names one.
        None => Transport::of_base(&loaded.recipe.base)?,
    };
    let dest = opts.to.clone().supported()?;
    // An archive that could never be written (a device, a directory) is refused before any
    // work, not after the layers.
    if let Transport::DockerArchive { path, .. } = &dest {
        crate::fsutil::output_target(path)?;
    }
    // Fail before any work when an engine is the destination and none answers.
    if let Transport::DockerDaemon(_) = &dest {
        crate::engine::Engine::connect()?;
    }
    // Destinations other than a layout build in the cache's own layout, so their layers are
    // cached between builds as a layout destination's are.
    // A layout this build creates is its own until the index is written: a build that fails
    // or is interrupted removes it rather than leave blobs without an index.json.
    let mut new_layout = match &dest {
        Transport::Oci { dir, .. } if !dir.exists() => Some(crate::interrupt::Staged::new(dir)),
        _ => None,
    };
    let store = match &dest {
        Transport::Oci { dir, .. } => Layout::create(dir)?,
        Transport::DockerDaemon(_) | Transport::DockerArchive { .. } | Transport::Registry(_) => {
            Layout::create(&opts.cache_dir.join("layout"))?
        }
    };
    let _lock = store.lock()?;

    let base = base_ref.open()?;
    // The interpreter is checked before anything is written.
    let python = match &opts.closure {
        Some(_) => {
            let want = resolved
                .lock
                .python
                .version
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            let paths = super::fs::paths(&base)?;
            Some(stack::find_python(&paths, &want).map_err(|m| Error::image(&base_ref, m))?)
        }
        None => None,
    };
    let config_digest = base.manifest().config().digest().to_string();
    let mut config: Value = serde_json::from_slice(&base.config_bytes()?)
        .map_err(|e| Error::image(&base_ref, format!("config {config_digest}: {e}")))?;
    base_diff_ids(&config, base.manifest().layers().len())
        .map_err(|m| Error::image(&base_ref, format!("config {config_digest}: {m}")))?;
    import(&base, &store, &base_ref)?;

    let specs = layer_specs(loaded, resolved, &opts.probe)?;
    let mut built: Vec<(String, String, BuiltLayer)> = Vec::new();
    let mut extra_env = Vec::new();
    if let (Some(closure), Some(python)) = (&opts.closure, &python) {
        let cache = WheelCache::open(opts.cache_dir.clone())?;
        let stack_opts = stack::StackOptions {
            compression: opts.compression,
            epoch: opts.epoch,
            use_cache: !opts.no_cache,
            cache: &cache,
            fetch: FetchOptions {
                offline: opts.offline,
                jobs: 4,
            },
            budget: opts.stack_layers,
            extras: resolved
                .lock
                .pip
                .iter()
                .map(|r| crate::closure::normalize(requirement_name(r)))
                .collect(),
        };
        for l in stack::build(&store, closure, python, &stack_opts)? {
            built.push((l.name, l.created_by, l.layer));
        }
        let base_path = strings(&config["config"]["Env"])
            .into_iter()
            .find_map(|e| e.strip_prefix("PATH=").map(str::to_string));
        extra_env = stack::image_env(base_path.as_deref());
    }
    for spec in &specs {
        let layer = build_layer(&store, spec, opts.compression, opts.epoch, !opts.no_cache)?;
        built.push((spec.name.clone(), spec.created_by.clone(), layer));
    }

    let created = rfc3339(opts.epoch);
    edit_config(&mut config, resolved, &extra_env, &built, &created);
    config["config"]["Labels"][STACK_LABEL] = json!(match opts.closure {
        Some(_) => stack::VENV,
        None => "none",
    });
    let new_config = store.write_json(&config, MediaType::ImageConfig)?;
    let mut layers: Vec<Descriptor> = base.manifest().layers().clone();
    layers.extend(built.iter().map(|(_, _, l)| l.descriptor.clone()));
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(new_config.clone())
        .layers(layers)
        .annotations(HashMap::from([
            // The base as the recipe names it, and the digest of the one really used: where
            // it was read from (a local path, a daemon) would make the digest depend on the
            // build host.
            (
                "org.opencontainers.image.base.name".to_string(),
                resolved.lock.base.clone(),
            ),
            (
                "org.opencontainers.image.base.digest".to_string(),
                base.digest(),
            ),
            ("org.opencontainers.image.created".to_string(), created),
        ]))
        .build()
        .map_err(|e| Error::image(&dest, e.to_string()))?;
    let manifest_desc = store.write_json(&manifest, MediaType::ImageManifest)?;

    // The base's blobs stay where it came from: a push to the same registry mounts them.
    let image = Image::in_layout(store.clone(), &manifest_desc, &Platform::host(), None)?
        .with_origin(base.origin().cloned());
    dest.write(&image, &format!("{}:latest", loaded.recipe.name))?;
    if let Some(done) = new_layout.take() {
        done.keep();
    }

    let mut lines: Vec<LayerLine> = base
        .manifest()
        .layers()
        .iter()
        .map(|d| LayerLine {
            name: "base".into(),
            digest: d.digest().to_string(),
            size: d.size(),
            reused: true,
        })
        .collect();
    lines.extend(built.iter().map(|(name, _, l)| LayerLine {
        name: name.clone(),
        digest: l.descriptor.digest().to_string(),
        size: l.descriptor.size(),
        reused: l.reused,
    }));
    Ok(BuildReport {
        image: dest.to_string(),
        manifest: manifest_desc.digest().to_string(),
        base: base.digest(),
        config: new_config.digest().to_string(),
        layers: lines,
    })
}

/// The new layers: the recipe's files (large, rarely changed) first, then the probe, then the
/// preset and lock (small, changed most often).
fn layer_specs(loaded: &LoadedRecipe, resolved: &Resolved, probe: &Path) -> Result<Vec<LayerSpec>> {
    let lock = &resolved.lock;
    let mut specs = Vec::new();
    if !loaded.recipe.files.is_empty() {
        let mut entries = Vec::new();
        for (src, f) in loaded.file_sources()? {
            entries.extend(tree_entries(&src, &f.dest, f.mode_bits())?);
        }
        specs.push(LayerSpec {
            name: "files".into(),
            created_by: format!("gpubake build: files of recipe {}", lock.recipe.name),
            entries,
        });
    }
    specs.push(LayerSpec {
        name: "probe".into(),
        created_by: format!(
            "gpubake build: the gpubake {} probe at {PROBE_PATH_IN_IMAGE}",
            lock.gpubake
        ),
        entries: vec![Entry {
            path: rel(PROBE_PATH_IN_IMAGE),
            mode: 0o755,
            source: Source::File(probe.to_path_buf()),
        }],
    });
    let preset = format!(
        "# The merged NCCL preset of recipe `{}`, with where each value came from.\n{}",
        lock.recipe.name,
        serde_yaml::to_string(&lock.env).expect("env serializes")
    );
    let presets: Vec<&str> = loaded.recipe.presets.iter().map(String::as_str).collect();
    specs.push(LayerSpec {
        name: "presets".into(),
        created_by: format!(
            "gpubake build: NCCL preset [{}] and lock",
            presets.join(", ")
        ),
        entries: vec![
            Entry {
                path: "etc/nccl.conf".into(),
                mode: 0o644,
                source: Source::Bytes(lock.env.nccl_conf().into_bytes()),
            },
            Entry {
                path: rel(LOCK_PATH_IN_IMAGE),
                mode: 0o644,
                source: Source::Bytes(lock.to_yaml().into_bytes()),
            },
            Entry {
                path: rel(PRESET_PATH_IN_IMAGE),
                mode: 0o644,
                source: Source::Bytes(preset.into_bytes()),
            },
        ],
    });
    Ok(specs)
}

/// The distribution name of a requirement (`Transformers[torch]>=4.5` is `Transformers`).
fn requirement_name(req: &str) -> &str {
    let end = req
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .unwrap_or(req.len());
    &req[..end]
}

fn rel(path: &str) -> String {
    path.trim_start_matches('/').to_string()
}

/// The diff IDs of a base config that build can extend: the config is a JSON object and
/// `rootfs.diff_ids` a list of strings, one per layer of the manifest.
fn base_diff_ids(config: &Value, layers: usize) -> std::result::Result<Vec<String>, String> {
    if !config.is_object() {
        return Err(format!("is {}, not a JSON object", json_kind(config)));
    }
    let Some(list) = config["rootfs"]["diff_ids"].as_array() else {
        return Err("has no rootfs.diff_ids list (the layers' uncompressed digests)".into());
    };
    let mut diff_ids = Vec::new();
    for (i, d) in list.iter().enumerate() {
        match d.as_str() {
            Some(d) => diff_ids.push(d.to_string()),
            None => {
                return Err(format!(
                    "rootfs.diff_ids[{i}] is {}, not a string",
                    json_kind(d)
                ));
            }
        }
    }
    if diff_ids.len() != layers {
        return Err(format!(
            "lists {} diff_ids for {layers} layers",
            diff_ids.len()
        ));
    }
    Ok(diff_ids)
}

/// What kind of JSON value `v` is, for messages.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Extends the base config: environment, labels, diff IDs, history, creation time. The config
/// must have passed [`base_diff_ids`].
fn edit_config(
    config: &mut Value,
    resolved: &Resolved,
    extra_env: &[(String, String)],
    built: &[(String, String, BuiltLayer)],
    created: &str,
) {
    let lock = &resolved.lock;
    if !config["config"].is_object() {
        config["config"] = json!({});
    }
    let mut env: Vec<String> = strings(&config["config"]["Env"]);
    for (name, value) in lock
        .image_env()
        .into_iter()
        .chain(extra_env.iter().cloned())
    {
        let line = format!("{name}={value}");
        match env
            .iter_mut()
            .find(|e| e.split_once('=').map(|(k, _)| k) == Some(name.as_str()))
        {
            Some(existing) => *existing = line,
            None => env.push(line),
        }
    }
    config["config"]["Env"] = json!(env);
    if !config["config"]["Labels"].is_object() {
        config["config"]["Labels"] = json!({});
    }
    for (k, v) in &lock.labels {
        config["config"]["Labels"][k] = json!(v);
    }
    let mut diff_ids = strings(&config["rootfs"]["diff_ids"]);
    let mut history: Vec<Value> = match config["history"].as_array() {
        Some(h) => h.clone(),
        None => (0..diff_ids.len())
            .map(|i| json!({"created_by": format!("base image {}, layer {}", lock.base, i + 1)}))
            .collect(),
    };
    for (name, created_by, layer) in built {
        diff_ids.push(layer.diff_id.to_string());
        history.push(json!({
            "created": created,
            "created_by": created_by,
            "comment": format!("gpubake {} layer", name),
        }));
    }
    config["rootfs"]["diff_ids"] = json!(diff_ids);
    config["history"] = Value::Array(history);
    config["created"] = json!(created);
}

/// Copies the base's config and layers into `store`, unless present. Each layer is verified
/// against its digest and its diff ID, and scanned for entries that would escape the root.
fn import(base: &Image, store: &Layout, base_ref: &Transport) -> Result<()> {
    if base.store().root() == store.root() {
        return Ok(());
    }
    let config = base.manifest().config();
    let digest = digest_of(config)?;
    if !store.has_blob(&digest, config.size()) {
        store.write_blob(&base.config_bytes()?)?;
    }
    for layer in base.layers() {
        let digest = layer.digest()?;
        if store.has_blob(&digest, layer.size()) {
            continue;
        }
        let mut w = store.blob_writer()?;
        std::io::copy(&mut layer.compressed()?, &mut w).map_err(|e| {
            // A full destination is the destination's problem, not the base's.
            if crate::error::out_of_space(&e) {
                Error::io(store.root().join("blobs/sha256"), e)
            } else {
                Error::image(base_ref, e.to_string())
            }
        })?;
        w.commit()?;
        if let Err(e) = layer.scan() {
            let _ = std::fs::remove_file(store.blob_path(&digest));
            return Err(Error::image(base_ref, e));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_render_as_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }
}
