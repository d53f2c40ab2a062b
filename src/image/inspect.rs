//! Reading images back: `inspect` (pins, presets, layers, environment) and `verify` (every
//! blob re-hashed, the OCI structure checked, and the labels, the lock and `/etc/nccl.conf`
//! in the layers checked against each other).

use super::build::{Opened, PRESET_PATH_IN_IMAGE, decompressor, open, scan_layer};
use super::layout::{Layout, digest_of};
use super::tarstream::Padded;
use super::transport::Transport;
use crate::error::{Error, Result};
use crate::lock::{LOCK_PATH_IN_IMAGE, Lock};
use crate::preset::MergedEnv;
use oci_spec::image::{ImageManifest, MediaType};
use serde::Serialize;
use serde_json::Value;
use std::io::Read;

/// Files larger than this are not read out of layers.
const MAX_FILE: u64 = 16 << 20;

/// Reads `path` from the image's filesystem: the top-most layer that has it wins, and a
/// whiteout above it means the file was deleted.
pub fn read_file(layout: &Layout, manifest: &ImageManifest, path: &str) -> Result<Option<Vec<u8>>> {
    let wanted = path.trim_start_matches('/');
    let (dir, name) = wanted.rsplit_once('/').unwrap_or(("", wanted));
    let whiteout = if dir.is_empty() {
        format!(".wh.{name}")
    } else {
        format!("{dir}/.wh.{name}")
    };
    for layer in manifest.layers().iter().rev() {
        let digest = digest_of(layer)?;
        let raw = layout.open_blob(&digest, Some(layer.size()))?;
        let reader = decompressor(layer.media_type(), raw)
            .map_err(|e| Error::image(&digest, e.to_string()))?;
        let (reader, end) = Padded::new(reader);
        let mut tar = tar::Archive::new(reader);
        let bad = |e: std::io::Error| {
            Error::image(
                format!("{}: layer {digest}", layout.describe()),
                e.to_string(),
            )
        };
        for entry in tar.entries().map_err(bad)? {
            let mut entry = entry.map_err(bad)?;
            end.saw(&entry);
            let p = entry.path().map_err(bad)?;
            let p = p.to_string_lossy();
            let p = p.trim_start_matches("./").trim_end_matches('/');
            if p == whiteout {
                return Ok(None);
            }
            if p == wanted && entry.header().entry_type().is_file() {
                let mut out = Vec::new();
                entry
                    .by_ref()
                    .take(MAX_FILE)
                    .read_to_end(&mut out)
                    .map_err(bad)?;
                end.check().map_err(bad)?;
                return Ok(Some(out));
            }
        }
        end.check().map_err(bad)?;
    }
    Ok(None)
}

/// Where glibc's `libc.so.6` lives in the distributions gpubake meets.
const LIBC_PATHS: [&str; 5] = [
    "lib/x86_64-linux-gnu/libc.so.6",
    "usr/lib/x86_64-linux-gnu/libc.so.6",
    "lib64/libc.so.6",
    "usr/lib64/libc.so.6",
    "lib/libc.so.6",
];

/// The glibc of an image, read from its own files: the version in `libc.so.6` ("release
/// version 2.36", or the `libc-2.31.so` a link names on older releases), with the
/// distribution's name from /etc/os-release. None when the image has no glibc.
pub fn base_glibc(
    layout: &Layout,
    manifest: &ImageManifest,
) -> Result<Option<(crate::version::Version, String)>> {
    let mut found: Option<String> = None;
    let mut os: Option<String> = None;
    each_entry(layout, manifest, |path, entry| {
        if LIBC_PATHS.contains(&path) {
            let kind = entry.header().entry_type();
            if kind.is_symlink() {
                let target = entry.link_name()?.unwrap_or_default();
                let name = target.file_name().map(|n| n.to_string_lossy().into_owned());
                if let Some(v) = name
                    .as_deref()
                    .and_then(|n| n.strip_prefix("libc-"))
                    .and_then(|n| n.strip_suffix(".so"))
                {
                    found = Some(v.to_string());
                }
            } else if kind.is_file() {
                let mut bytes = Vec::new();
                entry.by_ref().take(MAX_FILE).read_to_end(&mut bytes)?;
                if let Some(v) = release_version(&bytes) {
                    found = Some(v);
                }
            }
        } else if path == "etc/os-release" || path == "usr/lib/os-release" {
            let mut text = String::new();
            entry.by_ref().take(1 << 16).read_to_string(&mut text)?;
            os = text
                .lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string());
        }
        Ok(())
    })?;
    Ok(found.and_then(|v| v.parse().ok()).map(|v| {
        let what = match os {
            Some(os) => format!("glibc of {os}"),
            None => "glibc".to_string(),
        };
        (v, what)
    }))
}

/// The `X.Y` after glibc's "release version " in libc.so.6.
fn release_version(bytes: &[u8]) -> Option<String> {
    let at = memchr::memmem::find(bytes, b"release version ")? + "release version ".len();
    let digits: String = bytes[at..]
        .iter()
        .take(16)
        .map(|&b| b as char)
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let version = digits.trim_end_matches('.');
    version.contains('.').then(|| version.to_string())
}

/// Visits every entry of every layer, base first, with its path (no `./`, no trailing `/`).
fn each_entry(
    layout: &Layout,
    manifest: &ImageManifest,
    mut visit: impl FnMut(&str, &mut tar::Entry<'_, Padded<Box<dyn Read + '_>>>) -> std::io::Result<()>,
) -> Result<()> {
    for layer in manifest.layers() {
        let digest = digest_of(layer)?;
        let raw = layout.open_blob(&digest, Some(layer.size()))?;
        let reader = decompressor(layer.media_type(), raw)
            .map_err(|e| Error::image(&digest, e.to_string()))?;
        let bad = |e: std::io::Error| {
            Error::image(
                format!("{}: layer {digest}", layout.describe()),
                e.to_string(),
            )
        };
        let (reader, end) = Padded::new(reader);
        let mut tar = tar::Archive::new(reader);
        for entry in tar.entries().map_err(bad)? {
            let mut entry = entry.map_err(bad)?;
            end.saw(&entry);
            let path = entry.path().map_err(bad)?.to_string_lossy().into_owned();
            let path = path.trim_start_matches("./").trim_end_matches('/');
            visit(path, &mut entry).map_err(bad)?;
        }
        end.check().map_err(bad)?;
    }
    Ok(())
}

/// Every path in the image's filesystem after applying each layer's whiteouts, sorted.
pub fn paths(layout: &Layout, manifest: &ImageManifest) -> Result<Vec<String>> {
    let mut all = std::collections::BTreeSet::new();
    each_entry(layout, manifest, |p, _| {
        let (dir, name) = p
            .rsplit_once('/')
            .map(|(d, n)| (format!("{d}/"), n))
            .unwrap_or((String::new(), p));
        if name == ".wh..wh..opq" {
            all.retain(|q: &String| !q.starts_with(&dir) || *q == dir.trim_end_matches('/'));
        } else if let Some(gone) = name.strip_prefix(".wh.") {
            let gone = format!("{dir}{gone}");
            all.retain(|q: &String| *q != gone && !q.starts_with(&format!("{gone}/")));
        } else {
            all.insert(p.to_string());
        }
        Ok(())
    })?;
    Ok(all.into_iter().collect())
}

/// One layer as `inspect` shows it.
#[derive(Debug, Serialize)]
pub struct LayerInfo {
    /// Digest.
    pub digest: String,
    /// Compressed size in bytes.
    pub size: u64,
    /// Media type.
    pub media_type: String,
    /// What made it, from the history.
    pub created_by: String,
}

/// What `inspect` shows.
#[derive(Debug, Serialize)]
pub struct Inspection {
    /// The image.
    pub image: String,
    /// Manifest digest.
    pub manifest: String,
    /// Creation time from the config.
    pub created: Option<String>,
    /// `linux/amd64`.
    pub platform: String,
    /// The labels gpubake sets (`io.gpubake.*`) and the rest.
    pub labels: serde_json::Map<String, Value>,
    /// The config's environment.
    pub env: Vec<String>,
    /// Layers, base first.
    pub layers: Vec<LayerInfo>,
    /// The merged preset with provenance, when the image has one.
    pub presets: Option<MergedEnv>,
}

/// The image's config, read and verified.
pub fn config_of(img: &Opened) -> Result<Value> {
    let desc = img.manifest.config();
    let digest = digest_of(desc)?;
    serde_json::from_slice(&img.layout.read_blob(&digest, Some(desc.size()))?)
        .map_err(|e| Error::image(img.layout.describe(), format!("config {digest}: {e}")))
}

/// The strings of a JSON list (`Env`, `diff_ids`); empty when it is not one.
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Reads an image's pins, presets, layers and environment.
pub fn inspect(image: &Transport) -> Result<Inspection> {
    let img = open(image)?;
    let config = config_of(&img)?;
    let history: Vec<&Value> = config["history"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter(|e| !e["empty_layer"].as_bool().unwrap_or(false))
                .collect()
        })
        .unwrap_or_default();
    let layers = img
        .manifest
        .layers()
        .iter()
        .enumerate()
        .map(|(i, l)| LayerInfo {
            digest: l.digest().to_string(),
            size: l.size(),
            media_type: l.media_type().to_string(),
            created_by: history
                .get(i)
                .and_then(|h| h["created_by"].as_str())
                .unwrap_or("")
                .to_string(),
        })
        .collect();
    let presets = read_file(&img.layout, &img.manifest, PRESET_PATH_IN_IMAGE)?
        .and_then(|bytes| serde_yaml::from_slice::<MergedEnv>(&bytes).ok());
    Ok(Inspection {
        image: image.to_string(),
        manifest: img.desc.digest().to_string(),
        created: config["created"].as_str().map(String::from),
        platform: format!(
            "{}/{}",
            config["os"].as_str().unwrap_or("?"),
            config["architecture"].as_str().unwrap_or("?")
        ),
        labels: config["config"]["Labels"]
            .as_object()
            .cloned()
            .unwrap_or_default(),
        env: strings(&config["config"]["Env"]),
        layers,
        presets,
    })
}

impl Inspection {
    /// The human view: pins, layers, presets with provenance, environment.
    pub fn to_text(&self) -> String {
        let info = self;
        let rebuilt = if info.image.starts_with("docker-daemon:") {
            " (rebuilt from `docker save`: the engine keeps no manifest; its image ID is the config digest)"
        } else {
            ""
        };
        let mut out = format!(
            "image     {}\nmanifest  {}{rebuilt}\nplatform  {}\n",
            info.image, info.manifest, info.platform
        );
        if let Some(c) = &info.created {
            out.push_str(&format!("created   {c}\n"));
        }
        out.push_str("pins\n");
        for (k, v) in info
            .labels
            .iter()
            .filter(|(k, _)| k.starts_with("io.gpubake."))
        {
            out.push_str(&format!(
                "  {:<28} {}\n",
                k.trim_start_matches("io.gpubake."),
                v.as_str().unwrap_or("")
            ));
        }
        out.push_str("layers\n");
        for l in &info.layers {
            out.push_str(&format!(
                "  {} {:>9}  {}\n",
                l.digest,
                human_size(l.size),
                l.created_by
            ));
        }
        if let Some(p) = &info.presets {
            out.push_str("presets\n");
            for (k, v) in &p.0 {
                out.push_str(&format!("  {k}={}  ({})\n", v.value, v.origin.by));
            }
        }
        out.push_str("env\n");
        for e in &info.env {
            out.push_str(&format!("  {e}\n"));
        }
        out
    }
}

/// One check of `verify`.
#[derive(Debug, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub ok: bool,
    /// What was found.
    pub detail: String,
}

/// What `verify` found.
#[derive(Debug, Serialize)]
pub struct Verification {
    /// The image.
    pub image: String,
    /// The checks, in order.
    pub checks: Vec<Check>,
}

impl Verification {
    /// True when every check held.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    fn check(&mut self, name: impl Into<String>, result: std::result::Result<String, String>) {
        let (ok, detail) = match result {
            Ok(d) => (true, d),
            Err(d) => (false, d),
        };
        self.checks.push(Check {
            name: name.into(),
            ok,
            detail,
        });
    }
}

/// Re-hashes every blob and checks structure and consistency. A missing blob or an
/// unreadable index is an error (exit 2); content that does not match is a failed check.
pub fn verify(image: &Transport) -> Result<Verification> {
    verify_opened(&open(image)?, image)
}

/// [`verify`] on an image already opened.
pub fn verify_opened(img: &Opened, image: &Transport) -> Result<Verification> {
    let mut v = Verification {
        image: image.to_string(),
        checks: Vec::new(),
    };
    let layout = &img.layout;
    for desc in std::iter::once(img.manifest.config()).chain(img.manifest.layers()) {
        let digest = digest_of(desc)?;
        if !layout.blob_path(&digest).exists() {
            return Err(Error::image(
                layout.describe(),
                format!("blob {digest} is missing"),
            ));
        }
    }

    let m = &img.manifest;
    v.check(
        "manifest",
        if m.schema_version() != 2 {
            Err(format!("schemaVersion is {}, not 2", m.schema_version()))
        } else if m.media_type().as_ref().is_some_and(|t| {
            *t != MediaType::ImageManifest
                && t.to_string() != "application/vnd.docker.distribution.manifest.v2+json"
        }) {
            Err(format!(
                "media type {:?} is not an image manifest",
                m.media_type()
            ))
        } else {
            Ok(format!(
                "{} ({} layers)",
                img.desc.digest(),
                m.layers().len()
            ))
        },
    );

    let config = match config_of(img) {
        Ok(c) => {
            v.check("config blob", Ok(m.config().digest().to_string()));
            c
        }
        Err(e) => {
            v.check("config blob", Err(e.to_string()));
            return Ok(v);
        }
    };
    let diff_ids = strings(&config["rootfs"]["diff_ids"]);
    v.check(
        "config",
        if config["os"].as_str().is_none() || config["architecture"].as_str().is_none() {
            Err("os or architecture missing".into())
        } else if diff_ids.len() != m.layers().len() {
            Err(format!(
                "{} diff_ids for {} layers",
                diff_ids.len(),
                m.layers().len()
            ))
        } else {
            Ok(format!(
                "{}/{}",
                config["os"].as_str().unwrap_or(""),
                config["architecture"].as_str().unwrap_or("")
            ))
        },
    );
    for (i, layer) in m.layers().iter().enumerate() {
        let diff_id = diff_ids.get(i).map(String::as_str).unwrap_or("");
        let result = scan_layer(layout, layer, diff_id)
            .map(|_| format!("{} {} bytes", layer.digest(), layer.size()));
        v.check(format!("layer {}", i + 1), result);
    }
    consistency(img, &config, &mut v)?;
    Ok(v)
}

/// Labels, `/etc/gpubake/lock.yaml`, `/etc/nccl.conf` and the config's environment agree.
fn consistency(img: &Opened, config: &Value, v: &mut Verification) -> Result<()> {
    let labels = config["config"]["Labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    if !labels.contains_key("io.gpubake.recipe.sha256") {
        v.check(
            "gpubake metadata",
            Ok("not a gpubake image; lock checks skipped".into()),
        );
        return Ok(());
    }
    let lock_bytes = match read_file(&img.layout, &img.manifest, LOCK_PATH_IN_IMAGE) {
        Ok(Some(b)) => b,
        Ok(None) => {
            v.check(
                "lock",
                Err(format!("{LOCK_PATH_IN_IMAGE} is missing from the layers")),
            );
            return Ok(());
        }
        Err(e) => {
            v.check("lock", Err(e.to_string()));
            return Ok(());
        }
    };
    let lock: Lock = match serde_yaml::from_slice(&lock_bytes) {
        Ok(l) => l,
        Err(e) => {
            v.check(
                "lock",
                Err(format!("{LOCK_PATH_IN_IMAGE} does not parse: {e}")),
            );
            return Ok(());
        }
    };
    v.check(
        "lock",
        Ok(format!(
            "{LOCK_PATH_IN_IMAGE} for recipe {}",
            lock.recipe.name
        )),
    );

    let disagree: Vec<String> = lock
        .labels
        .iter()
        .filter(|(k, _)| k.starts_with("io.gpubake."))
        .filter(|(k, want)| labels.get(*k).and_then(Value::as_str) != Some(want.as_str()))
        .map(|(k, want)| {
            format!(
                "label {k} is {:?}, the lock says {want:?}",
                labels.get(k).and_then(Value::as_str)
            )
        })
        .collect();
    v.check(
        "labels vs lock",
        if disagree.is_empty() {
            Ok("agree".into())
        } else {
            Err(disagree.join("; "))
        },
    );

    let conf = read_file(&img.layout, &img.manifest, "/etc/nccl.conf")?;
    v.check(
        "nccl.conf vs lock",
        match conf {
            Some(c) if c == lock.env.nccl_conf().as_bytes() => Ok("agree".into()),
            Some(c) => Err(format!(
                "/etc/nccl.conf holds {:?}, the lock's preset gives {:?}",
                String::from_utf8_lossy(&c),
                lock.env.nccl_conf()
            )),
            None => Err("/etc/nccl.conf is missing from the layers".into()),
        },
    );

    let env = strings(&config["config"]["Env"]);
    let missing: Vec<String> = lock
        .image_env()
        .into_iter()
        .map(|(k, val)| format!("{k}={val}"))
        .filter(|line| !env.contains(line))
        .collect();
    v.check(
        "env vs lock",
        if missing.is_empty() {
            Ok("agree".into())
        } else {
            Err(format!("config Env lacks {}", missing.join(", ")))
        },
    );
    Ok(())
}

/// A short, human size.
pub fn human_size(bytes: u64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB"];
    let mut size = bytes as f64;
    let mut unit = 0;
    while size >= 1000.0 && unit + 1 < units.len() {
        size /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{size:.1} {}", units[unit])
    }
}

/// What the layers install, read from the files themselves: every Python distribution by
/// its `METADATA` and every `libnccl.so*` by the version string compiled into it.
#[derive(Debug, Default, Serialize)]
pub struct Contents {
    /// Normalized distribution name -> (version as METADATA says, dist-info path).
    pub dists: std::collections::BTreeMap<String, (String, String)>,
    /// libnccl path -> the version it reports (`2.27.5`), when found.
    pub nccl: std::collections::BTreeMap<String, Option<String>>,
}

/// Reads [`Contents`] out of every layer, later layers replacing earlier ones and whiteouts
/// deleting, as a runtime would see the filesystem.
pub fn contents(layout: &Layout, manifest: &ImageManifest) -> Result<Contents> {
    let mut out = Contents::default();
    each_entry(layout, manifest, |path, entry| {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        if let Some(gone) = name.strip_prefix(".wh.") {
            let gone = if dir.is_empty() {
                gone.to_string()
            } else {
                format!("{dir}/{gone}")
            };
            out.dists.retain(|_, (_, p)| !p.starts_with(&gone));
            out.nccl.retain(|p, _| !p.starts_with(&gone));
            return Ok(());
        }
        if !entry.header().entry_type().is_file() {
            return Ok(());
        }
        if name == "METADATA" && dir.ends_with(".dist-info") {
            let mut text = String::new();
            let _ = entry.by_ref().take(1 << 20).read_to_string(&mut text);
            if let Some((dist, version)) = metadata_name_version(&text) {
                out.dists
                    .insert(crate::closure::normalize(&dist), (version, dir.to_string()));
            }
        } else if name.starts_with("libnccl.so") {
            out.nccl.insert(path.to_string(), nccl_version(entry)?);
        }
        Ok(())
    })?;
    Ok(out)
}

/// `Name` and `Version` of core metadata (the email-header part before the body).
fn metadata_name_version(text: &str) -> Option<(String, String)> {
    let mut name = None;
    let mut version = None;
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("Name:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("Version:") {
            version = Some(v.trim().to_string());
        }
    }
    Some((name?, version?))
}

/// The `NCCL version X.Y.Z` string libnccl prints at init, found in the library's bytes.
fn nccl_version(reader: &mut impl Read) -> std::io::Result<Option<String>> {
    const NEEDLE: &[u8] = b"NCCL version ";
    let finder = memchr::memmem::Finder::new(NEEDLE);
    let mut buf = vec![0u8; 1 << 20];
    let mut keep = 0usize;
    loop {
        let n = reader.read(&mut buf[keep..])?;
        if n == 0 {
            return Ok(None);
        }
        let filled = keep + n;
        if let Some(at) = finder.find(&buf[..filled]) {
            let start = at + NEEDLE.len();
            // The version follows within a few bytes; read on if the buffer ends first.
            let mut tail = buf[start..filled].to_vec();
            if tail.len() < 32 {
                let mut more = vec![0u8; 32];
                let m = reader.read(&mut more)?;
                tail.extend_from_slice(&more[..m]);
            }
            let version: String = tail
                .iter()
                .take_while(|b| b.is_ascii_digit() || **b == b'.')
                .map(|b| *b as char)
                .collect();
            std::io::copy(reader, &mut std::io::sink())?;
            return Ok((!version.is_empty()).then_some(version.trim_end_matches('.').to_string()));
        }
        // Keep the last bytes in case the needle straddles two reads.
        let carry = NEEDLE.len().min(filled);
        buf.copy_within(filled - carry..filled, 0);
        keep = carry;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_release_versions_are_read_from_libc() {
        let text = b"xx GNU C Library (Debian GLIBC 2.36-9+deb12u4) stable release version 2.36.\n";
        assert_eq!(release_version(text).as_deref(), Some("2.36"));
        assert_eq!(release_version(b"nothing here"), None);
    }
}
