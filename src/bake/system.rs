//! The OS layer: the lock's Debian packages unpacked as dpkg unpacks them, without dpkg, apt
//! or a container, and recorded in dpkg's database (`/var/lib/dpkg/status` and each
//! package's `info/` files) so that `dpkg -l`, `dpkg -L` and a later `apt-get` inside the
//! image see them. What the packages' maintainer scripts do on a fresh install is settled
//! without running them ([`crate::bake::scripts`]), and so is libc-bin's ldconfig trigger:
//! the layer holds the image's /etc/ld.so.cache and any soname link ldconfig would make.

use crate::bake::fs::{Node, listing, read_file};
use crate::bake::scripts::{Files, Settler};
use crate::error::{Error, Result};
use crate::image::layer::{BuiltLayer, Entry, LayerSpec, ROOT, Source, build_keyed_to};
use crate::image::layout::Layout;
use crate::image::ldcache;
use crate::image::model::Image;
use crate::lock::SystemPackage;
use crate::recipe::{LoadedRecipe, Recipe, field_help};
use crate::wheel::cache::WheelRef;
use md5::{Digest as _, Md5};
use sha2::Sha256;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where dpkg keeps what is installed.
const STATUS: &str = "var/lib/dpkg/status";
const INFO: &str = "var/lib/dpkg/info";

/// The maintainer scripts dpkg runs around unpacking and configuring.
const SCRIPTS: &[&str] = &["preinst", "postinst", "prerm", "postrm", "config"];

/// One package as read from its .deb.
struct Deb {
    /// The control file's stanza.
    control: String,
    /// Every member of control.tar but `control`, by name (md5sums, conffiles, scripts).
    info: BTreeMap<String, Vec<u8>>,
    /// The files of data.tar, in archive order.
    entries: Vec<Entry>,
    /// Files whose owner in the archive is not root (written as root).
    not_root: Vec<String>,
}

/// What the OS layer holds and what the build should say about it.
pub struct SystemLayer {
    /// The layer.
    pub spec: LayerSpec,
    /// The maintainer scripts the recipe's `system_scripts:` skipped, and why.
    pub skipped: Vec<String>,
    /// Files the archives own as another user, written as root.
    pub not_root: Vec<String>,
}

/// The warning for what the image's NCCL settings (`env`, name and value) need from the OS
/// (`nccl::needs`) that neither the base nor the `system:` pins install: a library counts as
/// there when dpkg lists its package in the base or a pin installs it, or when the base's
/// loader cache knows its soname (a base with the libraries from elsewhere, MOFED's say).
/// The base is read only when a setting needs something.
pub fn unmet_need(
    base: &Image,
    env: &[(String, String)],
    pins: &[SystemPackage],
) -> Result<Option<String>> {
    let Some(need) = crate::nccl::needs::of(env) else {
        return Ok(None);
    };
    let mut installed = installed_names(base)?;
    installed.extend(pins.iter().map(|p| p.name.clone()));
    let cached = cached_sonames(base)?;
    let missing = need.missing_packages(|lib| {
        installed.iter().any(|i| i == lib.package) || cached.iter().any(|s| s == lib.soname)
    });
    Ok(need.warning(&missing))
}

/// The sonames the base's /etc/ld.so.cache lists (none without a cache).
fn cached_sonames(base: &Image) -> Result<Vec<String>> {
    const CACHE: &str = ldcache::CACHE;
    let Some(bytes) = read_file(base, CACHE)? else {
        return Ok(Vec::new());
    };
    let entries = crate::image::links::parse_cache(&bytes).map_err(|why| {
        Error::image(
            format!("{}: /{CACHE}", base.describe()),
            format!("not a glibc ld.so.cache: {why}"),
        )
    })?;
    Ok(entries.into_iter().map(|(soname, _, _)| soname).collect())
}

/// The names of the packages dpkg has installed in `base` (none for a base without dpkg).
pub fn installed_names(base: &Image) -> Result<Vec<String>> {
    let Some(status) = read_file(base, STATUS)? else {
        return Ok(Vec::new());
    };
    let at = format!("{}: /{STATUS}", base.describe());
    Ok(
        crate::debian::status::parse(&String::from_utf8_lossy(&status), &at)?
            .into_iter()
            .map(|p| p.name)
            .collect(),
    )
}

/// The packages dpkg has installed in `base`, with the distribution's ID from its os-release,
/// for the SBOM; None for a base without dpkg.
pub fn base_packages(base: &Image) -> Result<Option<crate::sbom::BasePackages>> {
    let Some(status) = read_file(base, STATUS)? else {
        return Ok(None);
    };
    // Debian and Ubuntu make /etc/os-release a link to ../usr/lib/os-release, and read_file
    // returns regular files only: the link's target comes next.
    let mut os_release = None;
    for path in ["etc/os-release", "usr/lib/os-release"] {
        if let Some(bytes) = read_file(base, path)? {
            os_release = Some(String::from_utf8_lossy(&bytes).into_owned());
            break;
        }
    }
    let at = format!("{}: /{STATUS}", base.describe());
    crate::sbom::BasePackages::parse(
        &String::from_utf8_lossy(&status),
        os_release.as_deref(),
        &at,
    )
    .map(Some)
}

/// What the archive client reads of a base: its apt sources and keyrings, its os-release and
/// dpkg's status.
const BASE_FILES: &[&str] = &[
    "etc/apt",
    "etc/os-release",
    "usr/lib/os-release",
    "usr/share/keyrings",
    STATUS,
];

/// How long the archive client waits on a connection or a stalled read.
const ARCHIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The packages the recipe's `system:` adds to `base`: what `apt-get install
/// --no-install-recommends` would install there, from the recipe's `apt:` archives or else
/// the base's own sources, each pinned to a .deb a signed index vouches for; in unpacking
/// order. `recipe_dir` is where the recipe's keyring paths start.
pub fn resolve(
    base: &Image,
    loaded: &LoadedRecipe,
    recipe_dir: &Path,
) -> Result<Vec<SystemPackage>> {
    // What the asks cannot have (an unknown name, a conflict, a base without dpkg) is said
    // at the recipe's field; an archive out of reach stays the environment's.
    resolve_asks(base, &loaded.recipe, recipe_dir).map_err(|e| match e {
        Error::Usage(why) => loaded.doc.invalid(&["system"], why, field_help("system")),
        other => other,
    })
}

fn resolve_asks(base: &Image, recipe: &Recipe, recipe_dir: &Path) -> Result<Vec<SystemPackage>> {
    if recipe.system.is_empty() {
        return Ok(Vec::new());
    }
    let root = tempfile::tempdir().map_err(|e| Error::writing(std::env::temp_dir(), e))?;
    crate::image::unpack::unpack_paths(base, root.path(), BASE_FILES)?;
    if !root.path().join(STATUS).exists() {
        return Err(Error::Usage(format!(
            "{} has no /{STATUS}, so it has no dpkg to record packages in: `system:` \
             installs Debian or Ubuntu packages into a Debian or Ubuntu base",
            base.describe()
        )));
    }
    let found = crate::debian::read_base(root.path())?;
    let sources = if recipe.apt.is_empty() {
        found.sources.clone()
    } else {
        recipe_sources(recipe, recipe_dir, root.path())?
    };
    if sources.is_empty() {
        return Err(Error::Usage(format!(
            "{} names no apt source; name one in the recipe's `apt:`",
            base.describe()
        )));
    }
    let asks = recipe
        .system
        .iter()
        .map(|a| a.parse())
        .collect::<Result<Vec<crate::debian::Ask>>>()?;
    let client = crate::debian::Client::new(ARCHIVE_TIMEOUT)?;
    let available = crate::debian::fetch_index(&client, &sources, &found.arch)?;
    let pins = crate::debian::solve(&found.installed, &available, &asks, &found.arch)?;
    Ok(pins
        .into_iter()
        .map(|p| SystemPackage {
            url: format!("{}/{}", p.base.trim_end_matches('/'), p.filename),
            name: p.name,
            version: p.version,
            architecture: p.architecture,
            size: p.size,
            sha256: p.sha256,
            source: p.source,
        })
        .collect())
}

/// The recipe's `apt:` archives, each trusting its own keyring or else the base's.
fn recipe_sources(
    recipe: &Recipe,
    recipe_dir: &Path,
    root: &Path,
) -> Result<Vec<crate::debian::Source>> {
    let os = crate::debian::sources::os_release(root)?;
    let base_keys = crate::debian::sources::default_keyrings(root, &os)?;
    Ok(recipe
        .apt
        .iter()
        .enumerate()
        .map(|(i, a)| crate::debian::Source {
            uri: a.url.trim_end_matches('/').to_string(),
            suite: a.suite.clone(),
            components: a.components.clone(),
            keys: crate::debian::Keys::Files(match &a.keyring {
                Some(k) => vec![recipe_dir.join(k)],
                None => base_keys.clone(),
            }),
            at: format!("the recipe's apt[{i}]"),
        })
        .collect())
}

/// Builds the layer that installs the lock's `packages` on `base` into `store`: the .debs are
/// fetched into the cache (each checked against its SHA256 while it streams), unpacked, and
/// recorded in dpkg's database. The layer is reused when the same packages go on the same
/// base's dpkg status again. Returns the layer and what its history says.
pub fn build(
    store: &Layout,
    base: &Image,
    packages: &[SystemPackage],
    skip: &BTreeMap<String, String>,
    opts: &super::LayerOptions,
) -> Result<(String, BuiltLayer)> {
    let status = read_file(base, STATUS)?;
    let mut key = Sha256::new();
    // The loader cache reads every library of the base, so the base's layers key the layer,
    // not only its dpkg status.
    // How scripts and the loader cache are settled is gpubake's: its version keys the layer.
    key.update(format!("gpubake-system-v2 {}\n", env!("CARGO_PKG_VERSION")));
    for layer in base.layers() {
        key.update(layer.diff_id().unwrap_or_default());
        key.update(b"\n");
    }
    key.update(Sha256::digest(status.as_deref().unwrap_or_default()));
    for p in packages {
        key.update(format!(
            "\n{} {} {} {}",
            p.name, p.version, p.architecture, p.sha256
        ));
    }
    // Which scripts are skipped changes what the layer holds.
    for (package, why) in skip {
        key.update(format!("\nskip {package} {why}"));
    }
    // Said whether the layer is made or reused; what each script passed over is said when
    // the layer is made.
    for (package, why) in skip {
        if packages.iter().any(|p| &p.name == package) {
            eprintln!(
                "note: {package}'s maintainer scripts are settled without what gpubake cannot \
                 make ({why})"
            );
        } else {
            eprintln!(
                "warning: `system_scripts:` names {package}, which `system:` does not install"
            );
        }
    }
    let key = hex::encode(key.finalize());
    let created_by = created_by(packages);
    // The staged files are read when the layer is written, after `make` returns; the
    // directory goes when this returns (or on interrupt).
    let stage = crate::interrupt::scratch_dir(None, ".gpubake-system-")
        .map_err(|e| Error::writing(std::env::temp_dir(), e))?;
    let layer = build_keyed_to(&opts.sink(store), &key, || {
        let refs: Vec<WheelRef> = packages
            .iter()
            .map(|p| WheelRef {
                name: p.name.clone(),
                version: p.version.clone(),
                url: p.url.clone(),
                size: Some(p.size),
                sha256: p.sha256.clone(),
            })
            .collect();
        let debs = opts.cache.fetch(&refs, &opts.fetch)?;
        let layer = system_layer(
            base,
            status.as_deref(),
            (packages, &debs),
            (skip, opts.epoch),
            stage.path(),
        )?;
        report(&layer);
        Ok(layer.spec)
    })?;
    drop(stage);
    Ok((created_by, layer))
}

/// What the build says of the layer it made: the maintainer scripts it skipped, and the
/// files written as root that the archive owns as another user.
fn report(layer: &SystemLayer) {
    for note in &layer.skipped {
        eprintln!("note: {note}");
    }
    for file in &layer.not_root {
        eprintln!("note: {file} is owned by another user in its .deb; written as root");
    }
}

fn created_by(packages: &[SystemPackage]) -> String {
    let names: Vec<String> = packages
        .iter()
        .map(|p| format!("{}={}", p.name, p.version))
        .collect();
    format!("gpubake: system packages {}", names.join(" "))
}

/// The layer that installs `packages` (their .debs already in `debs`, in the same order) on
/// `base`, whose dpkg status is `status` (None: it has no dpkg): every package's files, and
/// dpkg's status with the base's own entries kept.
/// Unpacked files are staged under `stage`, which must outlive the layer's writing.
pub fn system_layer(
    base: &Image,
    status: Option<&[u8]>,
    (packages, debs): (&[SystemPackage], &[PathBuf]),
    (skip, epoch): (&BTreeMap<String, String>, u64),
    stage: &Path,
) -> Result<SystemLayer> {
    let status = status.map(<[u8]>::to_vec).ok_or_else(|| {
        Error::Usage(format!(
            "{}: the base has no /{STATUS}: `system:` installs Debian packages into a base \
             with dpkg (Debian, Ubuntu)",
            base.describe()
        ))
    })?;
    let status = String::from_utf8(status)
        .map_err(|_| Error::Usage(format!("{}: /{STATUS} is not UTF-8", base.describe())))?;
    let mut stanzas = parse_stanzas(&status);
    // dpkg unpacks through the links of the filesystem it unpacks into: on a merged-/usr
    // base, a package's /bin/x lands in /usr/bin/x and /bin stays the base's link.
    let listing = listing(base)?;
    let mut links: BTreeMap<String, String> = listing
        .iter()
        .filter_map(|(p, n)| match n {
            Node::Link(t) => Some((p.clone(), t.clone())),
            _ => None,
        })
        .collect();
    let read_base = |path: &str| -> Result<Option<String>> {
        Ok(read_file(base, path)?.map(|b| String::from_utf8_lossy(&b).into_owned()))
    };
    let mut settler = Settler::new(&listing, &read_base, skip, epoch)?;
    let mut files: Files = BTreeMap::new();
    let mut info_entries = Vec::new();
    let mut postinsts = Vec::new();
    let mut not_root = Vec::new();
    for (i, (pkg, deb_path)) in packages.iter().zip(debs).enumerate() {
        let deb = read_deb(deb_path, &stage.join(i.to_string()), pkg)?;
        // dpkg runs `preinst install` before it unpacks the package's files, and
        // `postinst configure` once every package is unpacked.
        if let Some(text) = deb.info.get("preinst") {
            let text = String::from_utf8_lossy(text);
            settler.run(&pkg.name, ("preinst", &text), &["install"], &files)?;
        }
        if let Some(text) = deb.info.get("postinst") {
            postinsts.push((pkg.name.clone(), String::from_utf8_lossy(text).into_owned()));
        }
        let multi_arch_same = field(&deb.control, "Multi-Arch") == Some("same");
        let info_name = if multi_arch_same {
            format!("{}:{}", pkg.name, pkg.architecture)
        } else {
            pkg.name.clone()
        };
        let mut list = vec!["/.".to_string()];
        for e in &deb.entries {
            list.push(format!("/{}", e.path));
            let Some(e) = &through_links(e, &links) else {
                continue;
            };
            if let Source::Symlink(target) = &e.source {
                links.insert(e.path.clone(), target.clone());
            }
            if !matches!(e.source, Source::Dir)
                && let Some((_, owner)) = files.get(&e.path)
                && owner != &pkg.name
                && !replaces(&deb.control, owner)
            {
                return Err(Error::Build(format!(
                    "{} {} would overwrite /{}, which {owner} also holds (dpkg refuses \
                     that unless one Replaces the other)",
                    pkg.name, pkg.version, e.path
                )));
            }
            files.insert(e.path.clone(), (e.clone(), pkg.name.clone()));
        }
        not_root.extend(deb.not_root.iter().map(|p| format!("{}: /{p}", pkg.name)));
        let conffiles = conffiles_field(&deb, &files)?;
        for (member, bytes) in &deb.info {
            let mode = if SCRIPTS.contains(&member.as_str()) {
                0o755
            } else {
                0o644
            };
            info_entries.push(Entry {
                path: format!("{INFO}/{info_name}.{member}"),
                mode,
                owner: ROOT,
                source: Source::Bytes(bytes.clone()),
            });
        }
        info_entries.push(Entry {
            path: format!("{INFO}/{info_name}.list"),
            mode: 0o644,
            owner: ROOT,
            source: Source::Bytes(format!("{}\n", list.join("\n")).into_bytes()),
        });
        let stanza = installed_stanza(&deb.control, &conffiles);
        stanzas.insert(stanza_key(&stanza).expect("it names its package"), stanza);
    }
    for (package, text) in &postinsts {
        settler.run(package, ("postinst", text), &["configure", ""], &files)?;
    }
    let skipped = std::mem::take(&mut settler.notes);
    let place = |path: &str| {
        let probe = Entry {
            path: path.to_string(),
            mode: 0o777,
            owner: ROOT,
            source: Source::Symlink(String::new()),
        };
        through_links(&probe, &links).map_or_else(|| path.to_string(), |e| e.path)
    };
    let records = settler.finish(&mut files, &place);
    let mut entries: Vec<Entry> = files.into_values().map(|(e, _)| e).collect();
    settle_loader(base, &mut entries)?;
    entries.extend(info_entries);
    entries.extend(records);
    entries.push(Entry {
        path: STATUS.into(),
        mode: 0o644,
        owner: ROOT,
        source: Source::Bytes(write_stanzas(&stanzas).into_bytes()),
    });
    Ok(SystemLayer {
        spec: LayerSpec {
            name: "system".into(),
            created_by: created_by(packages),
            entries,
            prefetch: None,
        },
        skipped,
        not_root,
    })
}

/// What libc-bin's ldconfig trigger leaves once `entries` (the packages' files) are unpacked
/// on `base`: ldconfig run over the base's libraries with the packages' on top, giving the
/// image's /etc/ld.so.cache and the soname links it makes or re-points, which replace any
/// entry at their paths.
fn settle_loader(base: &Image, entries: &mut Vec<Entry>) -> Result<()> {
    let platform = base
        .platform()?
        .unwrap_or_else(crate::image::Platform::host);
    let Some(machine) = platform.elf_machine() else {
        eprintln!(
            "note: /etc/ld.so.cache is left as the base has it: gpubake reads no ELF objects \
             of {}",
            platform.architecture
        );
        return Ok(());
    };
    let root = tempfile::tempdir().map_err(|e| Error::writing(std::env::temp_dir(), e))?;
    let root = root.path();
    crate::image::unpack::unpack_where(base, root, &|path, kind| {
        kind.is_symlink() || ldcache::reads(&path.to_string_lossy())
    })?;
    for e in entries.iter() {
        let at = root.join(&e.path);
        let placed = match &e.source {
            Source::Dir => std::fs::create_dir_all(&at),
            _ if !ldcache::reads(&e.path) && !matches!(e.source, Source::Symlink(_)) => continue,
            source => {
                if let Some(parent) = at.parent() {
                    std::fs::create_dir_all(parent).map_err(|err| Error::writing(parent, err))?;
                }
                if std::fs::symlink_metadata(&at).is_ok_and(|m| !m.is_dir()) {
                    std::fs::remove_file(&at).map_err(|err| Error::writing(&at, err))?;
                }
                match source {
                    Source::Symlink(target) => std::os::unix::fs::symlink(target, &at),
                    Source::File(staged) => {
                        std::fs::hard_link(staged, &at)
                            .or_else(|_| std::fs::copy(staged, &at).map(drop))
                            .map_err(|err| Error::copying(staged, &at, err))?;
                        Ok(())
                    }
                    Source::Bytes(bytes) => std::fs::write(&at, bytes),
                    Source::Dir | Source::Zip(_) => unreachable!("no such entry here"),
                }
            }
        };
        placed.map_err(|err| Error::writing(&at, err))?;
    }
    let scan = ldcache::scan(root, machine);
    for (path, target) in scan.links {
        let path = path.trim_start_matches('/').to_string();
        entries.retain(|e| e.path != path);
        entries.push(Entry {
            path,
            mode: 0o777,
            owner: ROOT,
            source: Source::Symlink(target),
        });
    }
    entries.retain(|e| e.path != ldcache::CACHE);
    entries.push(Entry {
        path: ldcache::CACHE.into(),
        mode: 0o644,
        owner: ROOT,
        source: Source::Bytes(ldcache::encode(&scan.entries, &ldcache::generator())),
    });
    Ok(())
}

/// Where `entry` lands when its path is followed through `links` (every link of the
/// filesystem, by path): each directory on the way that is a link is replaced by its
/// target. None for a directory that is itself a link there: dpkg keeps the link.
fn through_links(entry: &Entry, links: &BTreeMap<String, String>) -> Option<Entry> {
    let mut parts: Vec<String> = Vec::new();
    let names: Vec<&str> = entry.path.split('/').collect();
    for (i, name) in names.iter().enumerate() {
        parts.push(name.to_string());
        let last = i + 1 == names.len();
        if last && !matches!(entry.source, Source::Dir) {
            break;
        }
        // A chain of links (at most 40, as the kernel allows) is followed to its end.
        for _ in 0..40 {
            let here = parts.join("/");
            let Some(target) = links.get(&here) else {
                break;
            };
            if last {
                return None;
            }
            parts.pop();
            if target.starts_with('/') {
                parts.clear();
            }
            for t in target.split('/') {
                match t {
                    "" | "." => {}
                    ".." => {
                        parts.pop();
                    }
                    t => parts.push(t.to_string()),
                }
            }
        }
    }
    Some(Entry {
        path: parts.join("/"),
        ..entry.clone()
    })
}

/// Reads the .deb at `path`: an ar archive of `debian-binary`, `control.tar[.gz|.xz|.zst]`
/// and `data.tar[...]`. Data files are staged under `stage`.
fn read_deb(path: &Path, stage: &Path, pkg: &SystemPackage) -> Result<Deb> {
    let what = || format!("{} ({} {})", path.display(), pkg.name, pkg.version);
    let bad = |why: String| Error::Build(format!("{}: {why}", what()));
    let file = std::fs::File::open(path).map_err(|e| Error::reading(path, e))?;
    let mut ar = ar::Archive::new(file);
    let mut format_seen = false;
    let mut control: Option<(String, BTreeMap<String, Vec<u8>>)> = None;
    let mut data: Option<(Vec<Entry>, Vec<String>)> = None;
    while let Some(member) = ar.next_entry() {
        let mut member = member.map_err(|e| bad(format!("not an ar archive: {e}")))?;
        let name = String::from_utf8_lossy(member.header().identifier())
            .trim_end_matches('/')
            .to_string();
        if name == "debian-binary" {
            let mut v = String::new();
            member
                .read_to_string(&mut v)
                .map_err(|e| bad(format!("debian-binary: {e}")))?;
            if !v.starts_with("2.") {
                return Err(bad(format!("format {} is not 2.x", v.trim())));
            }
            format_seen = true;
        } else if let Some(kind) = name.strip_prefix("control.tar") {
            let reader = decompressed(kind, member).map_err(|e| bad(format!("{name}: {e}")))?;
            control = Some(read_control(reader).map_err(|e| bad(format!("{name}: {e}")))?);
        } else if let Some(kind) = name.strip_prefix("data.tar") {
            let reader = decompressed(kind, member).map_err(|e| bad(format!("{name}: {e}")))?;
            std::fs::create_dir_all(stage).map_err(|e| Error::writing(stage, e))?;
            data = Some(read_data(reader, stage).map_err(|e| bad(format!("{name}: {e}")))?);
        }
    }
    if !format_seen {
        return Err(bad("no debian-binary member: not a .deb".into()));
    }
    let (control, info) = control.ok_or_else(|| bad("no control.tar member".into()))?;
    let (entries, not_root) = data.ok_or_else(|| bad("no data.tar member".into()))?;
    for (name, want) in [
        ("Package", pkg.name.as_str()),
        ("Version", pkg.version.as_str()),
        ("Architecture", pkg.architecture.as_str()),
    ] {
        if field(&control, name) != Some(want) {
            return Err(bad(format!(
                "its control file says {name}: {}, the lock {want}",
                field(&control, name).unwrap_or("(none)")
            )));
        }
    }
    Ok(Deb {
        control,
        info,
        entries,
        not_root,
    })
}

/// The member's bytes, decompressed by its suffix (`.gz`, `.xz`, `.zst`, or none).
fn decompressed<'a>(
    suffix: &str,
    member: impl Read + 'a,
) -> std::result::Result<Box<dyn Read + 'a>, String> {
    Ok(match suffix {
        "" => Box::new(member),
        ".gz" => Box::new(flate2::read::GzDecoder::new(member)),
        ".xz" => Box::new(lzma_rust2::XzReader::new(member, true)),
        ".zst" => Box::new(zstd::Decoder::new(member).map_err(|e| e.to_string())?),
        other => return Err(format!("compression `{other}` is not one dpkg writes")),
    })
}

/// The path of a tar member relative to the root: `./usr/bin/x` is `usr/bin/x`; the root
/// itself is None.
fn member_path(raw: &Path) -> Option<String> {
    let text = raw.to_string_lossy();
    let rel = text.trim_start_matches("./").trim_start_matches('/');
    let rel = rel.trim_end_matches('/');
    (!rel.is_empty() && rel != ".").then(|| rel.to_string())
}

/// The member's path, refusing one with a `..` component: dpkg refuses such a .deb, and in a
/// layer it would name a path outside the image's root.
fn inside_path(raw: &Path) -> std::io::Result<Option<String>> {
    if raw
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(std::io::Error::other(format!(
            "member `{}` climbs out of the root with `..`",
            raw.display()
        )));
    }
    Ok(member_path(raw))
}

fn read_control(reader: impl Read) -> std::io::Result<(String, BTreeMap<String, Vec<u8>>)> {
    let mut control = None;
    let mut info = BTreeMap::new();
    let mut tar = tar::Archive::new(reader);
    for entry in tar.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let Some(name) = inside_path(&entry.path()?)? else {
            continue;
        };
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes)?;
        if name == "control" {
            control = Some(String::from_utf8_lossy(&bytes).into_owned());
        } else {
            info.insert(name, bytes);
        }
    }
    let control = control.ok_or_else(|| std::io::Error::other("no control file"))?;
    Ok((control, info))
}

/// The entries of data.tar, regular files written under `stage`; a hard link becomes a copy
/// of the file it links to.
fn read_data(reader: impl Read, stage: &Path) -> std::io::Result<(Vec<Entry>, Vec<String>)> {
    let mut entries = Vec::new();
    let mut staged: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut not_root = Vec::new();
    let mut tar = tar::Archive::new(reader);
    for (n, entry) in tar.entries()?.enumerate() {
        let mut entry = entry?;
        let header = entry.header().clone();
        let Some(path) = inside_path(&entry.path()?)? else {
            continue;
        };
        let mode = header.mode()? & 0o7777;
        if header.uid()? != 0 || header.gid()? != 0 {
            not_root.push(path.clone());
        }
        let kind = header.entry_type();
        let source = if kind.is_dir() {
            Source::Dir
        } else if kind.is_symlink() {
            let target = entry
                .link_name()?
                .ok_or_else(|| std::io::Error::other(format!("{path}: a link without a target")))?;
            Source::Symlink(target.to_string_lossy().into_owned())
        } else if kind.is_hard_link() {
            let target = entry
                .link_name()?
                .as_deref()
                .and_then(member_path)
                .ok_or_else(|| std::io::Error::other(format!("{path}: a link without a target")))?;
            let file = staged.get(&target).ok_or_else(|| {
                std::io::Error::other(format!("{path}: links to {target}, not before it"))
            })?;
            Source::File(file.clone())
        } else if kind.is_file() {
            let file = stage.join(n.to_string());
            let mut out = std::fs::File::create(&file)?;
            std::io::copy(&mut entry, &mut out)?;
            staged.insert(path.clone(), file.clone());
            Source::File(file)
        } else {
            return Err(std::io::Error::other(format!(
                "{path}: a {kind:?} entry; an image layer holds files, directories and links"
            )));
        };
        entries.push(Entry {
            path,
            mode,
            owner: ROOT,
            source,
        });
    }
    Ok((entries, not_root))
}

/// dpkg's `Conffiles:` value: each conffile with the md5 of the bytes installed.
fn conffiles_field(deb: &Deb, files: &BTreeMap<String, (Entry, String)>) -> Result<Vec<String>> {
    let Some(list) = deb.info.get("conffiles") else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for line in String::from_utf8_lossy(list).lines() {
        // Newer dpkg allows flags after the path (`remove-on-upgrade`); the path comes first.
        let Some(path) = line.split_whitespace().next() else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        let md5 = match files.get(rel).map(|(e, _)| &e.source) {
            Some(Source::File(f)) => {
                let bytes = std::fs::read(f).map_err(|e| Error::reading(f, e))?;
                hex::encode(Md5::digest(&bytes))
            }
            // A conffile the package does not ship (one that a flag removes, say).
            _ => "newconffile".to_string(),
        };
        out.push(format!(" {path} {md5}"));
    }
    Ok(out)
}

/// The control stanza as dpkg's status holds an installed package: `Status` after
/// `Package`, and `Conffiles` before `Description`.
fn installed_stanza(control: &str, conffiles: &[String]) -> String {
    let mut out = Vec::new();
    for line in control.trim_end().lines() {
        if line.starts_with("Description:") && !conffiles.is_empty() {
            out.push("Conffiles:".to_string());
            out.extend(conffiles.iter().cloned());
        }
        out.push(line.to_string());
        if line.starts_with("Package:") {
            out.push("Status: install ok installed".to_string());
        }
    }
    out.join("\n")
}

/// The value of field `name` of a stanza (its first line).
fn field<'a>(stanza: &'a str, name: &str) -> Option<&'a str> {
    stanza.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.eq_ignore_ascii_case(name)).then(|| v.trim())
    })
}

/// Whether the control stanza's `Replaces` names `other`.
fn replaces(control: &str, other: &str) -> bool {
    field(control, "Replaces").is_some_and(|v| {
        v.split(',').any(|alt| {
            alt.split('|').any(|d| {
                d.trim()
                    .split([' ', '(', ':'])
                    .next()
                    .is_some_and(|n| n == other)
            })
        })
    })
}

/// What dpkg tells installed packages apart by: the name, and the architecture only for a
/// `Multi-Arch: same` package (several of which may be installed, one per architecture).
fn stanza_key(stanza: &str) -> Option<(String, String)> {
    let name = field(stanza, "Package")?.to_string();
    let arch = if field(stanza, "Multi-Arch") == Some("same") {
        field(stanza, "Architecture").unwrap_or("").to_string()
    } else {
        String::new()
    };
    Some((name, arch))
}

/// The stanzas of a status file by [`stanza_key`].
fn parse_stanzas(text: &str) -> BTreeMap<(String, String), String> {
    text.split("\n\n")
        .map(|s| s.trim_matches('\n'))
        .filter(|s| !s.trim().is_empty())
        .filter_map(|s| Some((stanza_key(s)?, s.to_string())))
        .collect()
}

fn write_stanzas(stanzas: &BTreeMap<(String, String), String>) -> String {
    let mut out = String::new();
    for s in stanzas.values() {
        out.push_str(s.trim_end());
        out.push_str("\n\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, source: Source) -> Entry {
        Entry {
            path: path.into(),
            mode: 0o755,
            owner: ROOT,
            source,
        }
    }

    fn merged_usr() -> BTreeMap<String, String> {
        [
            ("bin", "usr/bin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
            ("usr/lib64", "lib"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
    }

    #[test]
    fn paths_go_through_the_bases_links_and_linked_directories_stay_links() {
        let links = merged_usr();
        let file = |p| entry(p, Source::Bytes(Vec::new()));
        let at = |e: Entry| through_links(&e, &links).map(|e| e.path);
        assert_eq!(at(file("bin/udevadm")), Some("usr/bin/udevadm".into()));
        assert_eq!(
            at(file("lib/udev/rules.d/x")),
            Some("usr/lib/udev/rules.d/x".into())
        );
        // A relative link inside a linked directory: lib64 -> usr/lib64 -> (usr/)lib.
        assert_eq!(at(file("lib64/ld.so")), Some("usr/lib/ld.so".into()));
        // The directory itself is the base's link: dpkg keeps the link.
        assert_eq!(at(entry("bin", Source::Dir)), None);
        assert_eq!(at(entry("usr/bin", Source::Dir)), Some("usr/bin".into()));
        // A file at a link's path replaces what it is (the link), as dpkg does.
        assert_eq!(at(file("bin")), Some("bin".into()));
        // An absolute target starts again at the root.
        let abs: BTreeMap<String, String> = [("opt/x".to_string(), "/srv/y".to_string())].into();
        assert_eq!(
            through_links(&file("opt/x/f"), &abs).map(|e| e.path),
            Some("srv/y/f".into())
        );
        // A loop ends (after the kernel's 40 hops) instead of hanging.
        let looped: BTreeMap<String, String> = [("a".to_string(), "a".to_string())].into();
        assert!(through_links(&file("a/f"), &looped).is_some());
    }

    #[test]
    fn the_installed_stanza_has_status_after_package_and_conffiles_before_description() {
        let control = "Package: p\nVersion: 1\nArchitecture: amd64\nDescription: d\n more\n";
        let conf = vec![" /etc/p.conf 0123".to_string()];
        assert_eq!(
            installed_stanza(control, &conf),
            "Package: p\nStatus: install ok installed\nVersion: 1\nArchitecture: amd64\n\
             Conffiles:\n /etc/p.conf 0123\nDescription: d\n more"
        );
        assert!(!installed_stanza(control, &[]).contains("Conffiles"));
    }

    #[test]
    fn status_stanzas_are_replaced_by_name_and_by_architecture_only_when_multi_arch_same() {
        let base = "Package: b\nArchitecture: amd64\nVersion: 1\n\nPackage: a\nArchitecture: \
                    all\nVersion: 1\n\n\nPackage: m\nMulti-Arch: same\nArchitecture: amd64\n\
                    Version: 1\n";
        let mut stanzas = parse_stanzas(base);
        assert_eq!(stanzas.len(), 3);
        let a2 = "Package: a\nArchitecture: amd64\nVersion: 2";
        stanzas.insert(stanza_key(a2).unwrap(), a2.into());
        let m2 = "Package: m\nMulti-Arch: same\nArchitecture: arm64\nVersion: 1";
        stanzas.insert(stanza_key(m2).unwrap(), m2.into());
        let text = write_stanzas(&stanzas);
        assert_eq!(parse_stanzas(&text).len(), 4, "{text}");
        assert!(text.contains("Package: a\nArchitecture: amd64\nVersion: 2\n\n"));
        assert!(!text.contains("Package: a\nArchitecture: all"));
        // Sorted by name, one blank line between, as dpkg writes it.
        assert!(text.starts_with("Package: a\n") && text.ends_with("Version: 1\n\n"));
    }

    #[test]
    fn replaces_reads_every_alternative_and_ignores_versions_and_architectures() {
        let c = "Package: x\nReplaces: foo (<< 2), bar:any | baz\n";
        for other in ["foo", "bar", "baz"] {
            assert!(replaces(c, other), "{other}");
        }
        assert!(!replaces(c, "fo"));
        assert!(!replaces("Package: x\n", "foo"));
    }

    #[test]
    fn member_paths_drop_the_dot_and_the_root() {
        assert_eq!(
            member_path(Path::new("./usr/bin/x")),
            Some("usr/bin/x".into())
        );
        assert_eq!(member_path(Path::new("./usr/")), Some("usr".into()));
        assert_eq!(member_path(Path::new("./")), None);
        assert_eq!(member_path(Path::new(".")), None);
    }

    #[test]
    fn a_data_member_that_climbs_out_of_the_root_is_refused() {
        // A hostile data.tar, written raw: the tar crate's builder refuses `..` itself.
        let mut header = tar::Header::new_gnu();
        header.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"./../etc/evil");
        header.set_size(1);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend([b'x'].iter().chain([0u8; 511].iter()));
        bytes.extend([0u8; 1024]);
        let stage = tempfile::tempdir().unwrap();
        let err = read_data(&bytes[..], stage.path()).expect_err("refused");
        assert!(err.to_string().contains("climbs out of the root"), "{err}");
        assert!(
            std::fs::read_dir(stage.path()).unwrap().next().is_none(),
            "nothing staged"
        );
        let err = read_control(&bytes[..]).expect_err("refused");
        assert!(err.to_string().contains("climbs out of the root"), "{err}");
    }
}
