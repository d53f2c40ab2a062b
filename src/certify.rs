//! `gpubake certify`: the verdict image CI needs. Static checks read the image itself (every
//! digest, the OCI structure, the pins in the labels against `/etc/gpubake/lock.yaml` and
//! against what the layers contain, the NCCL preset linted, `NVIDIA_REQUIRE_CUDA` against the
//! lock, no secrets in `Env`, layer count and sizes); the dynamic check runs `gpubake probe`
//! inside a container of the image on the GPUs asked for, and folds its report in.

use crate::bake::fs::read_file;
use crate::bake::inspect::{Verification, verify_image, verify_image_with};
use crate::engine::{Engine, Gpus, RunOutcome};
use crate::error::{Error, Result};
use crate::image::digest::Digest;
use crate::image::model::{ConfigView, Image};
use crate::image::scan::Scanned;
use crate::image::{Platform, Transport, referrers};
use crate::lint::{Context, Severity, check_var};
use crate::lock::{LOCK_PATH_IN_IMAGE, Lock, STACK_LABEL};
use crate::probe::report::{Report, Status, Verdict};
use crate::sign::bundle::{self, Bundle};
use crate::sign::keys::{PrivateKey, PublicKey};
use crate::sign::statement::{Descriptor, Statement};
use crate::units::human_size;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;

/// Where the probe's container runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Runner {
    /// A Docker Engine (`DOCKER_HOST`), GPUs requested as `docker run --gpus` does.
    #[default]
    Engine,
    /// An OCI runtime on this machine, GPUs from the node's CDI spec.
    Runtime {
        /// `crun`, `runc` or a path.
        program: String,
        /// CDI device names; empty means derived from `gpus`.
        devices: Vec<String>,
        /// Where CDI specs are looked for.
        spec_dirs: Vec<PathBuf>,
    },
}

/// How to certify.
#[derive(Clone, Debug)]
pub struct CertifyOptions {
    /// GPUs for the dynamic check.
    pub gpus: Gpus,
    /// Where the probe's container runs.
    pub runner: Runner,
    /// Most layers allowed (overlay filesystems stop at 127).
    pub max_layers: usize,
    /// Largest compressed layer allowed, bytes.
    pub max_layer_bytes: u64,
    /// How long the probe in the container may take; None is the probe's worst case plus
    /// the container's start.
    pub probe_timeout: Option<Duration>,
    /// The probe's shorter run (`probe --quick`).
    pub quick: bool,
    /// A policy file for the probe (copied into the container).
    pub policy: Option<PathBuf>,
    /// The platform to take from a multi-platform image; None for the transport's default
    /// (`--platform` of a registry, else this machine's).
    pub platform: Option<crate::image::Platform>,
}

impl Default for CertifyOptions {
    fn default() -> Self {
        CertifyOptions {
            gpus: Gpus::All,
            runner: Runner::Engine,
            max_layers: 127,
            max_layer_bytes: 20 << 30,
            probe_timeout: None,
            quick: false,
            policy: None,
            platform: None,
        }
    }
}

/// Where the policy file lands in the probe's container.
const POLICY_IN_CONTAINER: &str = "/etc/gpubake/certify-policy.yaml";

/// Time for a container to start and the probe to write its report, on top of its phases.
const CONTAINER_START: Duration = Duration::from_secs(60);

impl CertifyOptions {
    /// How long to wait for the probe: what was asked, or its worst case.
    pub fn probe_wait(&self) -> Duration {
        self.probe_timeout.unwrap_or_else(|| {
            crate::probe::budget::worst_case(
                crate::probe::budget::Level::Active,
                self.quick,
                Duration::ZERO,
            ) + CONTAINER_START
        })
    }
}

/// What a certificate's checks covered: the static checks alone, or also the probe on GPUs
/// (which GPUs, which run, under what). Recorded in the certificate as the fact `scope`, so a
/// certificate made with `--gpus none` cannot pass for one that met a GPU.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Scope {
    /// `static` (no probe reported) or `probe`.
    pub level: String,
    /// The GPUs asked for: `all`, a count, or `none`.
    pub gpus: String,
    /// The probe's run when it reported: `full` or `quick`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Where the probe's container ran: `engine` or the OCI runtime's program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher: Option<String>,
}

impl Scope {
    /// The scope of a certificate: its `scope` fact; a certificate without one (made before
    /// certify recorded it) counts as static unless it carries a probe's report.
    pub fn of(certificate: &Value) -> Scope {
        serde_json::from_value(certificate["facts"]["scope"].clone()).unwrap_or_else(|_| Scope {
            level: if certificate["facts"]["probe"].is_object() {
                "probe".into()
            } else {
                "static".into()
            },
            gpus: "unknown".into(),
            run: None,
            launcher: None,
        })
    }

    /// Whether the probe ran on GPUs and reported.
    pub fn probed(&self) -> bool {
        self.level == "probe"
    }

    /// The short form kept in the artifact's annotation and shown by `inspect`.
    pub fn annotation(&self) -> String {
        match (&self.run, &self.launcher) {
            (Some(run), Some(launcher)) if self.probed() => {
                format!("probe gpus={} run={run} launcher={launcher}", self.gpus)
            }
            _ if self.probed() => format!("probe gpus={}", self.gpus),
            _ => format!("static gpus={}", self.gpus),
        }
    }

    /// In words, for certify's last line and verify's.
    pub fn describe(&self) -> String {
        if self.probed() {
            format!(
                "static checks and the probe on {} GPU(s){}{}",
                self.gpus,
                self.run
                    .as_deref()
                    .map(|r| format!(", {r} run"))
                    .unwrap_or_default(),
                self.launcher
                    .as_deref()
                    .map(|l| format!(", under {l}"))
                    .unwrap_or_default()
            )
        } else {
            format!("static checks only, no probe ran (gpus {})", self.gpus)
        }
    }
}

/// Whether `certificate` (attached as an artifact whose verdict annotation is `verdict`)
/// certifies the image `digest`: a passing verdict, no failed check, and a probe on GPUs
/// unless `static_ok`. Ok: what it certifies; Err: why it does not.
pub fn judge_certificate(
    certificate: &Value,
    verdict: Option<&str>,
    digest: &str,
    static_ok: bool,
) -> std::result::Result<String, String> {
    if certificate["facts"]["manifest"] != digest {
        return Err(format!(
            "it certifies {}, not {digest}",
            certificate["facts"]["manifest"]
        ));
    }
    let Some(checks) = certificate["checks"].as_array() else {
        return Err("it lists no checks".to_string());
    };
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| c["status"] == "FAIL")
        .map(|c| {
            format!(
                "{}: {}",
                c["name"].as_str().unwrap_or("unnamed"),
                c["detail"].as_str().unwrap_or("")
            )
        })
        .collect();
    if verdict != Some("certified") || !failed.is_empty() {
        let verdict = verdict.unwrap_or("missing");
        return Err(match failed.as_slice() {
            [] => format!("its verdict is {verdict}"),
            _ => format!("its verdict is {verdict}; failed: {}", failed.join("; ")),
        });
    }
    let scope = Scope::of(certificate);
    if !scope.probed() && !static_ok {
        return Err(format!(
            "{}: pass --static-ok to accept a certificate without a probe",
            scope.describe()
        ));
    }
    Ok(scope.describe())
}

/// What certify concluded about one image.
pub struct Certification {
    /// The certificate: every check, with the image and the probe's report as facts.
    pub report: Report,
    /// The policy the probe judged by: where it came from and its sha256.
    pub policy: Value,
    /// The digest of the manifest that was certified.
    pub manifest: Digest,
    /// The verdict; its exit code is certify's.
    pub verdict: Verdict,
}

impl Certification {
    /// The word a certificate's verdict annotation holds.
    pub fn annotation(&self) -> &'static str {
        match self.verdict {
            Verdict::Pass => "certified",
            Verdict::Lacking => "lacking",
            Verdict::Fail => "failed",
        }
    }
}

/// The predicate type of a gpubake certificate: an in-toto statement about the image's
/// manifest that holds certify's verdict, its checks, the policy and the probe's report.
pub const CERTIFICATE_PREDICATE: &str = "https://gpubake.io/certificate/v1";

/// The policy file the probe judged by (`--policy`), or the embedded one, named by sha256 so
/// that `verify --require-policy` can ask for it.
pub fn policy_identity(file: Option<&std::path::Path>) -> Result<Value> {
    let bytes = file
        .map(|path| std::fs::read(path).map_err(|e| Error::reading(path, e)))
        .transpose()?;
    Ok(identity_of(file, bytes.as_deref()))
}

/// The identity of the policy `bytes` as read from `file`, or of the embedded policy: the
/// bytes the probe was given, not the file read again later (it may have changed).
fn identity_of(file: Option<&std::path::Path>, bytes: Option<&[u8]>) -> Value {
    use sha2::Digest as _;
    let (source, bytes) = match (file, bytes) {
        (Some(path), Some(bytes)) => (path.display().to_string(), bytes),
        _ => (
            "embedded".to_string(),
            crate::probe::policy::embedded_yaml().as_bytes(),
        ),
    };
    json!({"source": source, "sha256": hex::encode(sha2::Sha256::digest(bytes))})
}

/// The certificate as an in-toto statement about the certified manifest.
pub fn statement(image: &Transport, certified: &Certification) -> Statement {
    let report = serde_json::to_value(&certified.report).expect("reports serialize");
    let scope = Scope::of(&report);
    Statement::new(
        vec![Descriptor::of(
            &image.subject_name(),
            certified.manifest.as_str(),
        )],
        CERTIFICATE_PREDICATE,
        json!({
            "verdict": certified.annotation(),
            "scope": scope.annotation(),
            "policy": certified.policy,
            "gpubake": env!("CARGO_PKG_VERSION"),
            "certificate": report,
        }),
    )
}

/// Signs the certificate with `key` and pushes it beside the image as a Sigstore bundle (an
/// OCI 1.1 referrer, found through the referrers tag schema where the registry has no
/// referrers API), with the annotations cosign writes on its own bundles. Returns the
/// referrer's digest.
pub fn attach(image: &Transport, certified: &Certification, key: &PrivateKey) -> Result<Digest> {
    let Transport::Registry(remote) = image else {
        return Err(crate::error::Error::Usage(format!(
            "{image}: --attach needs a docker:// image"
        )));
    };
    let statement = statement(image, certified);
    let scope = statement.predicate["scope"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let bundle = Bundle::sign(&statement, key);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    crate::image::referrers::attach(
        remote,
        &certified.manifest,
        bundle::MEDIA_TYPE,
        &serde_json::to_vec(&bundle).expect("bundles serialize"),
        {
            let mut annotations =
                bundle::annotations(CERTIFICATE_PREDICATE, &crate::units::rfc3339(now));
            // For `inspect` and people; verify reads only the signed statement.
            annotations.insert(
                referrers::VERDICT.to_string(),
                certified.annotation().to_string(),
            );
            annotations.insert(referrers::SCOPE.to_string(), scope);
            annotations
        },
    )
}

/// Certifies `image`. The report's checks are the certificate; facts hold the image digest
/// and the probe's own report. The verdict: a pass, a failed check, or lacking when GPUs were
/// asked for and the environment could not give them.
pub fn certify(image: &Transport, opts: &CertifyOptions) -> Result<Certification> {
    let start = std::time::Instant::now();
    let mut report = Report {
        gpubake: env!("CARGO_PKG_VERSION").to_string(),
        title: "certify".into(),
        ..Report::default()
    };
    // Inputs first: a policy that does not parse, or a device the node's CDI spec does not
    // list, is bad input before any image is read.
    let policy = opts.policy.as_deref().map(read_policy).transpose()?;
    let policy_id = identity_of(opts.policy.as_deref(), policy.as_deref());
    check_device_names(opts)?;
    // The bytes the registry serves now are judged, not the blob cache's copies of them.
    let opened = image.open_as_served(opts.platform.as_ref())?;
    report.fact("image", json!(image.to_string()));
    report.fact("manifest", json!(opened.digest()));

    // One pass over the layers: it checks each blob's digest and diff id as it reads, and
    // keeps in memory what the checks after it read of the files (a 4 GB image is read once,
    // not once a check, and never written out).
    let (mut scanned, layers_read) = crate::image::scan::Scanned::checked(&opened)?;
    let verification = verify_image_with(&opened, image, Some(&layers_read))?;
    report.checks.extend(verification.checks);
    // From here on a damaged image is a failed check in the certificate, not an error: CI
    // gets its verdict (exit 1) and its JSON and JUnit files either way.
    let config = opened.config().unwrap_or_else(|e| {
        report.push("structure", "config readable", Status::Fail, e.to_string());
        Value::Null
    });
    let lock: Option<Lock> = match read_file(&opened, LOCK_PATH_IN_IMAGE) {
        Ok(bytes) => bytes.and_then(|b| serde_yaml::from_slice(&b).ok()),
        Err(e) => {
            report.push("structure", "layers readable", Status::Fail, e.to_string());
            None
        }
    };
    let env = ConfigView::parse(&config)
        .map(|c| c.env_pairs())
        .unwrap_or_default();
    preset_lint(&env, lock.as_ref(), &mut report);
    require_cuda(&env, lock.as_ref(), &mut report);
    secrets(&env, &mut report);
    layers(&opened, opts, &mut report);
    if let Err(e) = contents(&mut scanned, &opened, &config, lock.as_ref(), &mut report) {
        report.push("static", "pins vs content", Status::Fail, e.to_string());
    }
    link_closure(&mut scanned, &opened, &mut report);
    drop(scanned);

    let damaged = report
        .checks
        .iter()
        .any(|c| c.phase == "structure" && c.status == Status::Fail);
    let static_failed = report.worst() == Status::Fail;
    let mut probe_verdict = Verdict::Pass;
    let mut probed = false;
    if damaged && opts.gpus != Gpus::None {
        report.push(
            "probe",
            PROBE_CHECK,
            Status::Skip,
            "not run: the image failed its structure checks",
        );
    } else if opts.gpus == Gpus::None {
        report.push(
            "probe",
            PROBE_CHECK,
            Status::Skip,
            "not requested (--gpus none or 0 asks for no GPU)",
        );
    } else {
        probe_verdict = match dynamic(&opened, &config, image, opts, policy, &mut report) {
            ProbeRun::Lacking(missing) => {
                report.push("probe", PROBE_CHECK, Status::Skip, missing);
                Verdict::Lacking
            }
            ProbeRun::Failed(why) => {
                report.push("probe", PROBE_CHECK, Status::Fail, why);
                Verdict::Fail
            }
            ProbeRun::Reported => {
                probed = true;
                Verdict::of(&report.checks, false)
            }
        };
    }
    // One rule for what the node breaks (README, certify's exit codes): the image's own
    // failures fail it; else a node that failed its preflight is lacking, whatever the probe
    // made of such a node, since its results do not judge the image; else the probe's verdict.
    let verdict = if static_failed {
        Verdict::Fail
    } else if node_failures(&report).next().is_some() {
        Verdict::Lacking
    } else {
        probe_verdict
    };
    let scope = Scope {
        level: if probed { "probe" } else { "static" }.into(),
        gpus: opts.gpus.to_string(),
        run: probed.then(|| if opts.quick { "quick" } else { "full" }.into()),
        launcher: probed.then(|| match &opts.runner {
            Runner::Engine => "engine".to_string(),
            Runner::Runtime { program, .. } => program.clone(),
        }),
    };
    report.fact(
        "scope",
        serde_json::to_value(&scope).expect("scopes serialize"),
    );
    report.seconds = start.elapsed().as_secs_f64();
    Ok(Certification {
        report,
        policy: policy_id,
        manifest: opened.digest().clone(),
        verdict,
    })
}

/// The name of the check that stands for the probe's run in the container.
const PROBE_CHECK: &str = "gpubake probe in a container";

/// The phase of the node's own checks (its CDI spec, device nodes and driver libraries).
const NODE_PHASE: &str = "cdi";

fn node_failures(report: &Report) -> impl Iterator<Item = &crate::probe::report::Check> {
    report
        .checks
        .iter()
        .filter(|c| c.phase == NODE_PHASE && c.status == Status::Fail)
}

/// The verdict line under the report, saying what the verdict means for this run.
pub fn summary(certified: &Certification) -> String {
    let report = &certified.report;
    let probed = Scope::of(&serde_json::to_value(report).expect("reports serialize")).probed();
    match certified.verdict {
        Verdict::Pass if !probed => {
            "certified on the static checks only: no probe ran (--gpus none)".into()
        }
        Verdict::Pass => "certified".into(),
        Verdict::Lacking => {
            let node: Vec<String> = node_failures(report)
                .map(|c| format!("{}: {}", c.name, c.detail))
                .collect();
            if !node.is_empty() {
                format!(
                    "static checks passed; the node failed its preflight ({}), so no probe \
                     result here judges the image: fix the node or certify on another",
                    node.join("; ")
                )
            } else {
                let why = report
                    .checks
                    .iter()
                    .find(|c| c.name == PROBE_CHECK)
                    .map(|c| c.detail.as_str())
                    .unwrap_or("the node lacks what the probe needs");
                format!("static checks passed; the GPU probe could not run here: {why}")
            }
        }
        Verdict::Fail => "NOT certified".into(),
    }
}

fn preset_lint(env: &[(String, String)], lock: Option<&Lock>, report: &mut Report) {
    let ctx = Context {
        nccl: lock.and_then(|l| l.nccl.version.clone()),
        nccl_from: "pinned by the image's lock".into(),
        debug: false,
    };
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    for (name, value) in env {
        // The warnings the preset accepted for this very value (`allow:` in the lock), as
        // lint of the recipe drops them.
        let allowed = lock
            .and_then(|l| l.env.0.get(name))
            .filter(|var| var.value == *value)
            .map_or(&[][..], |var| &var.allow);
        let issues = check_var(name, value, &ctx)
            .into_iter()
            .filter(|i| i.severity == Severity::Error || !allowed.iter().any(|a| a == i.code));
        for issue in issues {
            match issue.severity {
                Severity::Error => errors.push(format!("{name}: {}", issue.message)),
                Severity::Warning => warnings.push(format!("{name}: {}", issue.code)),
            }
        }
    }
    let nccl_vars = env.iter().filter(|(k, _)| k.starts_with("NCCL_")).count();
    let (status, detail) = if !errors.is_empty() {
        (Status::Fail, errors.join("; "))
    } else if !warnings.is_empty() {
        (
            Status::Warn,
            format!(
                "{nccl_vars} NCCL variables; warnings: {}",
                warnings.join(", ")
            ),
        )
    } else {
        (
            Status::Pass,
            format!("{nccl_vars} NCCL variables, all valid for the pinned NCCL"),
        )
    };
    report.push("static", "NCCL preset lint", status, detail);
}

fn require_cuda(env: &[(String, String)], lock: Option<&Lock>, report: &mut Report) {
    let value = env
        .iter()
        .find(|(k, _)| k == "NVIDIA_REQUIRE_CUDA")
        .map(|(_, v)| v.clone());
    let (status, detail) = match (&value, lock) {
        (None, _) => (
            Status::Warn,
            "unset: the toolkit will not refuse nodes whose driver is too old".to_string(),
        ),
        (Some(v), _) if crate::probe::require::Requirement::parse(v).is_err() => (
            Status::Fail,
            format!("`{v}` does not parse in the toolkit's grammar"),
        ),
        (Some(v), Some(lock)) if *v != lock.nvidia.require_cuda => (
            Status::Fail,
            format!("`{v}`, but the lock derives `{}`", lock.nvidia.require_cuda),
        ),
        (Some(v), _) => (Status::Pass, format!("`{v}`")),
    };
    report.push("static", "NVIDIA_REQUIRE_CUDA", status, detail);
}

fn secrets(env: &[(String, String)], report: &mut Report) {
    let found: Vec<&str> = env
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| crate::lint::looks_secret(k))
        .collect();
    if found.is_empty() {
        report.push(
            "static",
            "no secrets in Env",
            Status::Pass,
            format!("{} variables checked", env.len()),
        );
    } else {
        report.push(
            "static",
            "no secrets in Env",
            Status::Fail,
            format!(
                "{} look like secrets; pass them at run time, not in the image",
                found.join(", ")
            ),
        );
    }
}

fn layers(opened: &Image, opts: &CertifyOptions, report: &mut Report) {
    let layers = opened.manifest().layers();
    let total: u64 = layers.iter().map(|l| l.size()).sum();
    report.push(
        "static",
        "layer count",
        if layers.len() <= opts.max_layers {
            Status::Pass
        } else {
            Status::Fail
        },
        format!(
            "{} layers (at most {}), {} compressed",
            layers.len(),
            opts.max_layers,
            human_size(total)
        ),
    );
    let big: Vec<String> = layers
        .iter()
        .filter(|l| l.size() > opts.max_layer_bytes)
        .map(|l| format!("{} is {}", l.digest(), human_size(l.size())))
        .collect();
    report.push(
        "static",
        "layer size",
        if big.is_empty() {
            Status::Pass
        } else {
            Status::Fail
        },
        if big.is_empty() {
            format!("every layer under {}", human_size(opts.max_layer_bytes))
        } else {
            format!(
                "{} (cap {})",
                big.join(", "),
                human_size(opts.max_layer_bytes)
            )
        },
    );
}

/// The image's link closure (src/image/links.rs), judged by what a job loads: a library that a
/// program or a Python extension module needs and nothing provides, or one bound from another
/// copy than its siblings, fails; so does a plugin that cannot load here when the image's own
/// settings select it. A plugin that cannot load here and that nothing in the image selects is
/// named in the detail; one data/plugins.yaml does not know, a duplicate copy or a compat
/// libcuda the loader reaches deserves a look.
fn link_closure(scanned: &mut Scanned, image: &Image, report: &mut Report) {
    const NAME: &str = "link closure";
    ib_transport(scanned, image, report);
    let analyzed = scanned.answer(image, |tree| {
        crate::image::links::analyze_tree(tree, &tree.env)
    });
    let links = match analyzed.and_then(|l| l) {
        Ok(l) => l,
        Err(e) => return report.push("static", NAME, Status::Fail, e.to_string()),
    };
    let (status, detail) = judge_links(&links);
    report.push("static", NAME, status, detail);
}

/// The verdict of [`link_closure`] on an analyzed image.
fn judge_links(links: &crate::image::links::LinkReport) -> (Status, String) {
    let missing = links
        .unresolved
        .iter()
        .filter(|u| !u.driver)
        .map(|u| format!("{} needs {} (not found)", u.file, u.needed));
    let crossed = links.cross_copy.iter().map(|x| {
        format!(
            "{} binds {} from {} but {} from {}",
            x.file, x.soname, x.bound, x.sibling, x.sibling_bound
        )
    });
    let selected = links.cannot_load.iter().filter_map(|p| {
        let by = p.selected_by.as_ref()?;
        Some(format!(
            "{} needs {} (not found), and the image selects it: {by}",
            p.file,
            p.missing.join(", ")
        ))
    });
    let failed: Vec<String> = crossed.chain(missing).chain(selected).collect();
    let unknown: Vec<String> = links
        .cannot_load
        .iter()
        .filter(|p| p.loader.is_none())
        .map(|p| format!("{} needs {}", p.file, p.missing.join(", ")))
        .collect();
    let unselected: Vec<String> = links
        .cannot_load
        .iter()
        .filter(|p| p.loader.is_some() && p.selected_by.is_none())
        .map(|p| {
            format!(
                "{} (needs {}; selected by {})",
                file_name(&p.file),
                p.missing.join(", "),
                p.selectors.join(" or ")
            )
        })
        .collect();
    let unselected = if unselected.is_empty() {
        String::new()
    } else {
        format!(
            "; plugins that cannot load here, which nothing in the image selects: {}",
            unselected.join(", ")
        )
    };
    if !failed.is_empty() {
        return (Status::Fail, failed.join("; "));
    }
    let mut looks = Vec::new();
    if !unknown.is_empty() {
        looks.push(format!(
            "shared objects nothing needs that cannot load here, opened by no known loader: {}",
            unknown.join("; ")
        ));
    }
    if !links.duplicates.is_empty() {
        looks.push(format!(
            "{} sonames with more than one copy ({} bound by nothing)",
            links.duplicates.len(),
            human_size(links.dead_bytes)
        ));
    }
    if !links.compat_libcuda.is_empty() {
        looks.push(format!(
            "the loader reaches {}",
            links.compat_libcuda.join(", ")
        ));
    }
    if looks.is_empty() {
        (
            Status::Pass,
            format!(
                "{} ELF files, {} programs and extension modules: every library they need \
                 resolved, one copy each{unselected}",
                links.elf_files, links.roots
            ),
        )
    } else {
        (Status::Warn, format!("{}{unselected}", looks.join("; ")))
    }
}

/// The last component of `path`.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Where the image's NCCL settings ask for the IB transport (`nccl::needs`): whether the
/// image's loader finds the libraries NCCL and libibverbs open by name, as a process started
/// in it would (the probe in the container opens them for real).
fn ib_transport(scanned: &mut Scanned, image: &Image, report: &mut Report) {
    const NAME: &str = "IB transport libraries";
    let Some(need) = crate::nccl::needs::of(&scanned.env) else {
        return;
    };
    let names: Vec<&str> = need.libraries.iter().map(|l| l.soname).collect();
    let found = scanned.answer(image, |tree| {
        crate::image::links::dlopened(tree, &tree.env, &names)
    });
    let found = match found.and_then(|f| f) {
        Ok(found) => found,
        Err(e) => return report.push("static", NAME, Status::Fail, e.to_string()),
    };
    let missing = need.missing_packages(|lib| {
        found
            .iter()
            .any(|(name, path)| name == lib.soname && path.is_some())
    });
    let seen: Vec<String> = found
        .iter()
        .map(|(name, path)| match path {
            Some(p) => format!("{name} -> {p}"),
            None => format!("{name} not found"),
        })
        .collect();
    let (status, detail) = match need.warning(&missing) {
        Some(warning) => (Status::Fail, format!("{}: {warning}", seen.join(", "))),
        None => (
            Status::Pass,
            format!("{} (for {})", seen.join(", "), need.because),
        ),
    };
    report.push("static", NAME, status, detail);
}

/// Pins in the lock against what the layers install: every `==` requirement against the
/// distribution's own METADATA, and NCCL also against the version compiled into libnccl.
fn contents(
    scanned: &mut Scanned,
    image: &Image,
    config: &Value,
    lock: Option<&Lock>,
    report: &mut Report,
) -> Result<()> {
    let Some(lock) = lock else {
        report.push(
            "static",
            "pins vs content",
            Status::Skip,
            format!("no {LOCK_PATH_IN_IMAGE}: not a gpubake image"),
        );
        return Ok(());
    };
    let found = scanned.answer(image, crate::bake::fs::contents_of)??;
    let preflight = ConfigView::parse(config).is_ok_and(|c| c.label(STACK_LABEL) == Some("none"));
    if preflight && !found.dists.contains_key("torch") {
        report.push(
            "static",
            "pins vs content",
            Status::Skip,
            format!(
                "built without the Python stack ({STACK_LABEL}=none): a preflight image, \
                 the lock's Python pins are not installed"
            ),
        );
        return Ok(());
    }
    let (status, detail) = judge_contents(lock, &found);
    report.push("static", "pins vs content", status, detail);
    Ok(())
}

/// The verdict of [`contents`], apart from reading the image.
fn judge_contents(lock: &Lock, found: &crate::bake::fs::Contents) -> (Status, String) {
    use crate::names::normalize;
    let mut wrong = Vec::new();
    let mut checked = 0usize;
    let torch_pin = format!("{}+{}", lock.torch.version, lock.torch.variant);
    let Some((torch, _)) = found.dists.get("torch") else {
        return (
            Status::Fail,
            format!(
                "the lock pins torch {torch_pin}, but no torch is installed in the image's layers"
            ),
        );
    };
    if torch != &torch_pin && torch != &lock.torch.version.to_string() {
        wrong.push(format!("torch {torch}, the lock pins {torch_pin}"));
    }
    for (name, spec) in &lock.packages {
        let bare = normalize(name.split('[').next().unwrap_or(name));
        let Some(want) = spec.strip_prefix("==") else {
            continue;
        };
        if bare == "torch" {
            continue;
        }
        checked += 1;
        match found.dists.get(&bare) {
            Some((have, _)) if release_eq(have, want) => {}
            Some((have, _)) => wrong.push(format!("{bare} {have}, the lock pins {want}")),
            None => wrong.push(format!("{bare}: the lock pins {want}, the image has none")),
        }
    }
    let nccl_dist = found
        .dists
        .iter()
        .find(|(n, _)| n.starts_with("nvidia-nccl-"))
        .map(|(_, (v, _))| v.clone());
    if let Some(pin) = &lock.nccl.version {
        match &nccl_dist {
            Some(v) if release_eq(v, &pin.to_string()) => {}
            Some(v) => wrong.push(format!("nvidia-nccl {v}, the lock pins NCCL {pin}")),
            None => wrong.push(format!(
                "the lock pins NCCL {pin}, the image has no nvidia-nccl wheel"
            )),
        }
        for (path, version) in &found.nccl {
            match version {
                Some(v) if release_eq(v, &pin.to_string()) => {}
                Some(v) => wrong.push(format!("/{path} reports NCCL {v}, the lock pins {pin}")),
                None => wrong.push(format!("/{path} carries no NCCL version string")),
            }
        }
    }
    let runtime = found
        .dists
        .iter()
        .find(|(n, _)| n.starts_with("nvidia-cuda-runtime"))
        .map(|(_, (v, _))| v.clone());
    if let (Some(have), Some(pin)) = (&runtime, &lock.cuda.runtime)
        && !release_eq(have, pin)
    {
        wrong.push(format!("CUDA runtime {have}, the lock pins {pin}"));
    }
    if wrong.is_empty() {
        let libs: Vec<String> = found
            .nccl
            .iter()
            .map(|(p, v)| format!("/{p} {}", v.as_deref().unwrap_or("?")))
            .collect();
        (
            Status::Pass,
            format!(
                "torch {torch}, {checked} more pins as installed; NCCL {} ({}); CUDA runtime {}",
                nccl_dist.as_deref().unwrap_or("not pinned"),
                if libs.is_empty() {
                    "no libnccl".to_string()
                } else {
                    libs.join(", ")
                },
                runtime.as_deref().unwrap_or("not found")
            ),
        )
    } else {
        (Status::Fail, wrong.join("; "))
    }
}

/// Two versions with the same release numbers (`2.27.5` and `2.27.5.0`).
fn release_eq(a: &str, b: &str) -> bool {
    let parts = |v: &str| -> Vec<u64> {
        let mut p: Vec<u64> = v
            .split('+')
            .next()
            .unwrap_or(v)
            .split('.')
            .map(|x| x.parse().unwrap_or(u64::MAX))
            .collect();
        while p.last() == Some(&0) {
            p.pop();
        }
        p
    };
    parts(a) == parts(b)
}

/// The policy file's bytes, checked to parse as the probe will parse them.
fn read_policy(path: &std::path::Path) -> Result<Vec<u8>> {
    let doc = crate::document::Document::read(path)?;
    doc.parse::<Vec<crate::probe::policy::ModelPolicy>>("policy", |_| {
        Some("a list like data/policy.yaml".into())
    })?;
    // The bytes that were checked, not a second read that may differ.
    Ok(doc.text().as_bytes().to_vec())
}

/// How the dynamic check ended.
#[derive(Debug, PartialEq)]
enum ProbeRun {
    /// The probe reported; its checks are in the report.
    Reported,
    /// The environment could not give the probe what it needs (no engine, no GPU, no CDI spec).
    Lacking(String),
    /// The probe ran and did not report: a crash, a timeout, no JSON. The image's fault or
    /// the probe's, never a pass.
    Failed(String),
}

/// Runs `gpubake probe --json` in a container of the image with GPUs, through the engine or
/// an OCI runtime, and folds the probe's checks in.
fn dynamic(
    opened: &Image,
    config: &Value,
    image: &Transport,
    opts: &CertifyOptions,
    policy: Option<Vec<u8>>,
    report: &mut Report,
) -> ProbeRun {
    let mut args = vec!["gpubake", "probe", "--json"];
    if opts.quick {
        args.push("--quick");
    }
    let mut files: Vec<(&str, Vec<u8>)> = Vec::new();
    if let Some(bytes) = policy {
        args.extend(["--policy", POLICY_IN_CONTAINER]);
        files.push((POLICY_IN_CONTAINER, bytes));
    }
    let wait = opts.probe_wait();
    let outcome = match &opts.runner {
        Runner::Engine => in_engine(opened, &args, &files, opts, wait),
        Runner::Runtime {
            program,
            devices,
            spec_dirs,
        } => in_runtime(
            opened, config, &args, &files, program, devices, spec_dirs, opts, wait, report,
        ),
    };
    let outcome = match outcome {
        Ok(o) => o,
        Err(missing) => return ProbeRun::Lacking(missing),
    };
    container_settings(&outcome.settings, report);
    let (run, probe) = judge_run(&outcome, wait, image);
    if let Some(probe) = probe {
        for c in probe["checks"].as_array().cloned().unwrap_or_default() {
            let status = match c["status"].as_str() {
                Some("PASS") => Status::Pass,
                Some("WARN") => Status::Warn,
                Some("SKIP") => Status::Skip,
                _ => Status::Fail,
            };
            report.push(
                "probe",
                format!(
                    "{}: {}",
                    c["phase"].as_str().unwrap_or(""),
                    c["name"].as_str().unwrap_or("")
                ),
                status,
                c["detail"].as_str().unwrap_or(""),
            );
        }
        report.fact("probe", probe);
    }
    run
}

/// How the probe's container was run: as a training job is (`--ipc host --ulimit memlock=-1
/// --ulimit stack=67108864` or the runtime's equivalent), or what the engine would not grant.
fn container_settings(settings: &crate::engine::Settings, report: &mut Report) {
    let (status, detail) = match &settings.withheld {
        None => (
            Status::Pass,
            format!("run as a training job is run: {}", settings.applied),
        ),
        Some(refused) => (
            Status::Warn,
            format!(
                "run as a training job is run ({}), except {refused}; the probe's limits show what it got",
                settings.applied
            ),
        ),
    };
    report.push("probe", "container settings", status, detail);
}

/// What the probe's container ended with, judged: a report, a lacking environment (the
/// probe's own exit 3), or a failure with the child's real error.
fn judge_run(outcome: &RunOutcome, wait: Duration, image: &Transport) -> (ProbeRun, Option<Value>) {
    let probe: Option<Value> = serde_json::from_str::<Value>(outcome.stdout.trim())
        .ok()
        .filter(|v| v["checks"].is_array());
    if outcome.timed_out {
        return (
            ProbeRun::Failed(format!(
                "`gpubake probe` ran past {} s and was killed; its last words: {}",
                wait.as_secs(),
                crate::child::last_words(&outcome.stderr)
            )),
            None,
        );
    }
    match probe {
        None => (
            ProbeRun::Failed(format!(
                "{image}: `gpubake probe` ended (exit {}) without a report: {}",
                outcome.exit_code,
                crate::child::last_words(&outcome.stderr)
            )),
            None,
        ),
        Some(p) if Verdict::of_exit_code(outcome.exit_code) == Some(Verdict::Lacking) => {
            let why = p["checks"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["status"] == "FAIL"))
                .and_then(|c| c["detail"].as_str())
                .unwrap_or("no GPU")
                .to_string();
            (
                ProbeRun::Lacking(format!("the container saw no GPU (probe exit 3): {why}")),
                Some(p),
            )
        }
        Some(p) => (ProbeRun::Reported, Some(p)),
    }
}

/// The probe in a Docker Engine container. Err: what the environment lacks.
fn in_engine(
    opened: &Image,
    args: &[&str],
    files: &[(&str, Vec<u8>)],
    opts: &CertifyOptions,
    wait: Duration,
) -> std::result::Result<RunOutcome, String> {
    let engine = Engine::connect().map_err(|e| e.to_string())?;
    let short = &opened.digest().hex()[..12];
    let tag = format!("gpubake-certify:{short}");
    let dir =
        crate::interrupt::scratch_dir(None, ".gpubake-certify-").map_err(|e| e.to_string())?;
    let archive = dir.path().join("image.tar");
    crate::image::archive::write(opened, &archive, Some(&tag)).map_err(|e| e.to_string())?;
    engine.load(&archive).map_err(|e| e.to_string())?;
    let run = engine.run(&tag, args, files, &opts.gpus, wait);
    engine.remove_image(&tag);
    run.map_err(|e| {
        format!(
            "{e} (on {}: is nvidia-container-toolkit installed and the engine configured for it?)",
            engine.host()
        )
    })
}

/// The CDI device names for `gpus` when none were given.
fn cdi_names(gpus: &Gpus, given: &[String]) -> Vec<String> {
    if !given.is_empty() {
        return given.to_vec();
    }
    match gpus {
        Gpus::None => Vec::new(),
        Gpus::All => vec!["nvidia.com/gpu=all".into()],
        Gpus::Count(n) => (0..*n).map(|i| format!("nvidia.com/gpu={i}")).collect(),
    }
}

/// Refuses `--device` names that the node's CDI spec of that kind does not list. A node with
/// no spec, or a spec that does not load, is left to the run, which reports what it lacks.
fn check_device_names(opts: &CertifyOptions) -> Result<()> {
    let Runner::Runtime {
        devices, spec_dirs, ..
    } = &opts.runner
    else {
        return Ok(());
    };
    if opts.gpus == Gpus::None {
        return Ok(());
    }
    let Ok(specs) = crate::cdi::load(spec_dirs) else {
        return Ok(());
    };
    match crate::cdi::edits_for(&specs, spec_dirs, &cdi_names(&opts.gpus, devices)) {
        Err(e @ crate::error::Error::Usage(_)) => Err(e),
        _ => Ok(()),
    }
}

/// The probe under an OCI runtime, with the node's CDI edits; the CDI preflight goes into
/// the report. Err: what the environment lacks.
#[allow(clippy::too_many_arguments)]
fn in_runtime(
    opened: &Image,
    config: &Value,
    args: &[&str],
    files: &[(&str, Vec<u8>)],
    program: &str,
    devices: &[String],
    spec_dirs: &[PathBuf],
    opts: &CertifyOptions,
    wait: Duration,
    report: &mut Report,
) -> std::result::Result<RunOutcome, String> {
    use crate::error::Error;
    let runtime = crate::runtime::Runtime::find(program).map_err(|e| e.to_string())?;
    let specs = crate::cdi::load(spec_dirs).map_err(|e| e.to_string())?;
    let driver = std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|t| crate::cdi::driver_version(&t));
    let exists = |p: &str| std::path::Path::new(p).exists();
    report.checks.extend(crate::cdi::preflight(
        &specs,
        spec_dirs,
        driver.as_deref(),
        &exists,
    ));
    let names = cdi_names(&opts.gpus, devices);
    let edits = match crate::cdi::edits_for(&specs, spec_dirs, &names) {
        Ok(e) => e,
        Err(Error::Environment(m)) => return Err(m),
        Err(e) => return Err(e.to_string()),
    };
    report.fact(
        "runtime",
        json!({"program": runtime.program(), "devices": names}),
    );
    let bundle = crate::runtime::bundle(
        opened,
        config,
        &crate::runtime::Process {
            args,
            files,
            edits: &edits,
        },
        None,
    )
    .map_err(|e| format!("cannot make the container's bundle: {e}"))?;
    runtime.run(&bundle, wait).map_err(|e| e.to_string())
}

/// The image's digest and the checks that read it, for a check of what is signed or
/// attached for that digest. With `blobs`, every blob is downloaded as the registry serves
/// it and `verify`'s checks are made. Without, only the manifest and the config are read,
/// each checked against its digest: the manifest's digest binds every layer's, so a
/// signature or certificate of it speaks for them, and the layers are left to a pull (which
/// verifies each) or to `--blobs`.
fn judged_digest(
    image: &Transport,
    remote: &crate::image::registry::Remote,
    platform: Option<&Platform>,
    blobs: bool,
) -> Result<(Digest, Verification)> {
    if blobs {
        let img = image.open_as_served(platform)?;
        let v = verify_image(&img, image)?;
        return Ok((img.digest().clone(), v));
    }
    let mut remote = remote.clone();
    if let Some(p) = platform {
        remote.access.platform = p.clone();
    }
    let read = crate::image::registry::read_manifest(&remote)?;
    let mut v = Verification {
        image: image.to_string(),
        checks: Vec::new(),
    };
    v.check(
        "manifest",
        crate::bake::inspect::manifest_check(&read.manifest, &read.digest),
    );
    let config_digest = read.manifest.config().digest().to_string();
    let config = read.config.and_then(|bytes| {
        serde_json::from_slice::<Value>(&bytes).map_err(|e| format!("config {config_digest}: {e}"))
    });
    if let (Ok(config), Some(want)) = (&config, platform)
        && let (Some(os), Some(architecture)) =
            (config["os"].as_str(), config["architecture"].as_str())
    {
        let has = Platform {
            os: os.to_string(),
            architecture: architecture.to_string(),
            variant: config["variant"].as_str().map(String::from),
        };
        if !want.accepts(&has) {
            return Err(Error::Usage(format!(
                "{image}: the image is for {has} only, not {want}; leave --platform out or \
                 name {has}"
            )));
        }
    }
    v.check("config blob", config.map(|_| config_digest));
    let layers = read.manifest.layers().len();
    v.checks.push(crate::verdict::Check::new(
        "structure",
        "layers",
        Status::Skip,
        format!(
            "{layers} not downloaded: the manifest's digest binds them; --blobs re-hashes each \
             as the registry serves it"
        ),
    ));
    Ok((read.digest, v))
}

/// `verify` without a key: the image's structure, and every blob re-hashed as its source
/// serves it (see [`crate::bake::inspect::verify`]).
pub fn verify_blobs(image: &Transport, platform: Option<&Platform>) -> Result<Verification> {
    crate::bake::inspect::verify(image, platform)
}

/// A check that the image's manifest carries a simple signature (`sha256-<hex>.sig`, as
/// podman and skopeo check at pull) made with `key` for this repository (`verify --key`),
/// after the checks of [`judged_digest`] (`verify`'s, with `blobs`).
pub fn verify_signed(
    image: &Transport,
    platform: Option<&Platform>,
    key: &PublicKey,
    blobs: bool,
) -> Result<Verification> {
    let Transport::Registry(remote) = image else {
        return Err(Error::Usage(format!(
            "{image}: --key checks the signature kept beside the image in its registry; name \
             the image as docker://REGISTRY/NAME:TAG"
        )));
    };
    let (digest, mut v) = judged_digest(image, remote, platform, blobs)?;
    let reference = remote.parsed()?;
    let repository = format!("{}/{}", reference.registry(), reference.repository());
    let mut why = Vec::new();
    let mut accepted = None;
    for signed in crate::image::signature::signatures(remote, &digest)? {
        let judged = signed
            .and_then(|signed| {
                crate::sign::dsse::decode(&signed.signature)
                    .map_err(|e| format!("its signature is {e}"))
                    .map(|sig| (signed, sig))
            })
            .and_then(|(signed, sig)| key.verify(&signed.payload, &sig).map(|()| signed))
            .and_then(|signed| {
                crate::image::signature::judge_payload(&signed.payload, &digest, &repository)
            });
        match judged {
            Ok(()) => {
                accepted = Some(());
                break;
            }
            Err(e) => why.push(e),
        }
    }
    let tag = crate::image::signature::tag(&digest);
    v.check(
        "signature",
        match (accepted, why.is_empty()) {
            (Some(()), _) => Ok(format!(
                "{digest} is signed with the key for {repository} ({tag})"
            )),
            (None, true) => Err(format!("{digest} has no signature ({tag} holds none)")),
            (None, false) => Err(format!(
                "{} signature(s) of {digest}, none accepted: {}",
                why.len(),
                why.join("; ")
            )),
        },
    );
    Ok(v)
}

/// What `verify --certified` asks of a certificate besides its own verdict.
#[derive(Clone, Debug, Default)]
pub struct Requirements {
    /// Accept a certificate of the static checks alone (`certify --gpus none`).
    pub static_ok: bool,
    /// The sha256 of the policy the probe must have judged by.
    pub policy_sha256: Option<String>,
}

/// A check that a registry holds a certificate of this exact image, signed with `key`,
/// whose verdict passed and whose probe ran on GPUs (`verify --certified`), after the checks
/// of [`judged_digest`] (`verify`'s, with `blobs`). Unsigned certificates, and bundles that
/// do not verify with the key, are named with the reason and never accepted.
pub fn verify_certified(
    image: &Transport,
    platform: Option<&Platform>,
    key: &PublicKey,
    wanted: &Requirements,
    blobs: bool,
) -> Result<Verification> {
    let Transport::Registry(remote) = image else {
        return Err(Error::Usage(format!(
            "{image}: --certified reads certificates attached in a registry; name the image \
             as docker://REGISTRY/NAME:TAG"
        )));
    };
    let (digest, mut v) = judged_digest(image, remote, platform, blobs)?;
    let mut found = Vec::new();
    // Each referrer is judged on its own: one that cannot be read (pushed broken, or gone)
    // is named among the refused and never hides a good certificate beside it.
    for r in referrers::referrers(remote, &digest)? {
        let judged = if r.artifact_type == referrers::CERTIFICATE_TYPE {
            Err("an unsigned certificate: anyone who can push could have written it".to_string())
        } else if r.artifact_type == bundle::MEDIA_TYPE {
            // A bundle its listing says is another attestation (a provenance, signed with
            // the build's key) is no certificate to count, whatever key signed it; hiding
            // one this way hides nothing that could have been believed.
            if r.annotations
                .get(bundle::PREDICATE_ANNOTATION)
                .is_some_and(|t| t != CERTIFICATE_PREDICATE)
            {
                continue;
            }
            let judged = referrers::artifact_content(remote, &r.digest)
                .map_err(|e| format!("unreadable: {e}"))
                .and_then(|content| judge_bundle(&content, key, digest.as_str(), wanted));
            match judged {
                // Another attestation (a provenance) beside the certificate is no candidate.
                Ok(None) => continue,
                Ok(Some(what)) => Ok(what),
                Err(e) => Err(e),
            }
        } else if let Some(e) = &r.unread {
            Err(format!("unreadable: {e}"))
        } else {
            continue;
        };
        found.push((r.digest, judged));
    }
    v.check(
        "certificate",
        match found.iter().find(|(_, judged)| judged.is_ok()) {
            Some((d, Ok(what))) => Ok(format!("{d} certifies {digest}: {what}")),
            _ if found.is_empty() => Err(format!("no certificate is attached to {digest}")),
            _ => Err(format!(
                "{} certificate(s) attached to {digest}, none accepted: {}",
                found.len(),
                found
                    .iter()
                    .map(|(d, judged)| format!("{d}: {}", judged.as_ref().err().map_or("", |e| e)))
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
        },
    );
    Ok(v)
}

/// One attached bundle: None when it holds another kind of statement, else whether it is a
/// certificate of `digest` signed with `key` that meets `wanted`.
pub fn judge_bundle(
    content: &[u8],
    key: &PublicKey,
    digest: &str,
    wanted: &Requirements,
) -> std::result::Result<Option<String>, String> {
    let statement = Bundle::from_slice(content)?.verify(key)?;
    if statement.predicate_type != CERTIFICATE_PREDICATE {
        return Ok(None);
    }
    if !statement.about(digest) {
        let named: Vec<String> = statement
            .subject
            .iter()
            .flat_map(|s| s.digest.iter().map(|(a, h)| format!("{a}:{h}")))
            .collect();
        return Err(format!(
            "it is signed for {}, not {digest}",
            named.join(", ")
        ));
    }
    let p = &statement.predicate;
    let what = judge_certificate(
        &p["certificate"],
        p["verdict"].as_str(),
        digest,
        wanted.static_ok,
    )?;
    if let Some(want) = &wanted.policy_sha256 {
        // The policy judges the probe's measurements: static checks alone judged nothing by it.
        if !Scope::of(&p["certificate"]).probed() {
            return Err(format!(
                "{}: no probe judged by the policy required",
                Scope::of(&p["certificate"]).describe()
            ));
        }
        let theirs = p["policy"]["sha256"].as_str().unwrap_or("none");
        if theirs != want {
            return Err(format!(
                "its probe judged by the policy {} (sha256 {theirs}), not the one required \
                 (sha256 {want})",
                p["policy"]["source"].as_str().unwrap_or("unnamed")
            ));
        }
    }
    Ok(Some(format!("{what}, signed with the key")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(code: i64, stdout: &str, stderr: &str, timed_out: bool) -> RunOutcome {
        RunOutcome {
            exit_code: code,
            stdout: stdout.into(),
            stderr: stderr.into(),
            timed_out,
            settings: Default::default(),
        }
    }

    const PANIC: &str = "thread 'main' (1) panicked at src/probe/nvml.rs:80:14:\n\
                         index out of bounds: the len is 0 but the index is 0\n\
                         note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";

    #[test]
    fn a_panic_is_reported_by_its_message_not_the_backtrace_hint() {
        let why = crate::child::last_words(PANIC);
        assert!(why.contains("src/probe/nvml.rs:80:14"), "{why}");
        assert!(why.contains("index out of bounds"), "{why}");
        assert!(!why.contains("RUST_BACKTRACE"), "{why}");
        assert_eq!(crate::child::last_words(""), "no output");
        assert_eq!(crate::child::last_words("one\nlast words\n"), "last words");
    }

    #[test]
    fn a_probe_without_a_report_or_past_its_time_fails_and_only_its_exit_3_is_lacking() {
        let image: Transport = "oci:/x".parse().unwrap();
        let wait = Duration::from_secs(7);
        let (run, _) = judge_run(&outcome(101, "", PANIC, false), wait, &image);
        match run {
            ProbeRun::Failed(why) => {
                assert!(why.contains("exit 101"), "{why}");
                assert!(why.contains("index out of bounds"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let (run, _) = judge_run(&outcome(-1, "", "still working", true), wait, &image);
        assert!(
            matches!(&run, ProbeRun::Failed(w) if w.contains("ran past 7 s") && w.contains("still working")),
            "{run:?}"
        );
        let report = r#"{"checks":[{"phase":"nvml","name":"NVML","status":"FAIL","detail":"NVML did not initialise"}]}"#;
        let (run, probe) = judge_run(&outcome(3, report, "", false), wait, &image);
        assert!(
            matches!(&run, ProbeRun::Lacking(w) if w.contains("NVML did not initialise")),
            "{run:?}"
        );
        assert!(probe.is_some());
        let (run, _) = judge_run(&outcome(1, report, "", false), wait, &image);
        assert_eq!(run, ProbeRun::Reported);
        let (run, _) = judge_run(
            &outcome(0, "{\"not\": \"a report\"}", "", false),
            wait,
            &image,
        );
        assert!(matches!(run, ProbeRun::Failed(_)), "{run:?}");
    }

    #[test]
    fn a_bundle_is_accepted_only_signed_with_the_key_for_the_digest_with_a_passing_verdict() {
        use crate::sign::statement::{Descriptor, Statement};
        let digest = format!("sha256:{}", "1".repeat(64));
        let certificate = json!({
            "facts": {"manifest": digest, "scope": {"level": "static", "gpus": "none"}},
            "checks": [{"phase": "image", "name": "layers", "status": "PASS", "detail": ""}],
        });
        let predicate = |verdict: &str, policy: &str| json!({"verdict": verdict, "certificate": certificate, "policy": {"source": "embedded", "sha256": policy}});
        let key = PrivateKey::generate();
        let signed = |about: &str, kind: &str, predicate: Value, key: &PrivateKey| {
            let s = Statement::new(vec![Descriptor::of("app", about)], kind, predicate);
            serde_json::to_vec(&Bundle::sign(&s, key)).unwrap()
        };
        let loose = Requirements {
            static_ok: true,
            policy_sha256: None,
        };
        let judge = |bytes: &[u8], wanted: &Requirements| {
            judge_bundle(bytes, &key.public(), &digest, wanted)
        };
        let good = signed(
            &digest,
            CERTIFICATE_PREDICATE,
            predicate("certified", "p"),
            &key,
        );
        assert!(
            judge(&good, &loose)
                .unwrap()
                .unwrap()
                .contains("signed with the key")
        );
        // The policy, when asked for, by sha256, and only of a probe that judged by it.
        let mut probed_certificate = certificate.clone();
        probed_certificate["facts"]["scope"] =
            json!({"level": "probe", "gpus": "all", "run": "full", "launcher": "crun"});
        let probed = signed(
            &digest,
            CERTIFICATE_PREDICATE,
            json!({"verdict": "certified", "certificate": probed_certificate, "policy": {"source": "embedded", "sha256": "p"}}),
            &key,
        );
        let strict = Requirements {
            static_ok: true,
            policy_sha256: Some("p".into()),
        };
        assert!(judge(&probed, &strict).is_ok());
        assert!(
            judge(&good, &strict)
                .unwrap_err()
                .contains("no probe judged by the policy")
        );
        let other_policy = Requirements {
            static_ok: true,
            policy_sha256: Some("q".into()),
        };
        assert!(
            judge(&probed, &other_policy)
                .unwrap_err()
                .contains("not the one required")
        );
        // Static checks alone, unless accepted.
        assert!(
            judge(&good, &Requirements::default())
                .unwrap_err()
                .contains("--static-ok")
        );
        // Another key.
        let other = PrivateKey::generate();
        let theirs = signed(
            &digest,
            CERTIFICATE_PREDICATE,
            predicate("certified", "p"),
            &other,
        );
        assert!(judge(&theirs, &loose).unwrap_err().contains("another key"));
        // Another digest.
        let elsewhere = format!("sha256:{}", "2".repeat(64));
        let moved = signed(
            &elsewhere,
            CERTIFICATE_PREDICATE,
            predicate("certified", "p"),
            &key,
        );
        assert!(
            judge(&moved, &loose)
                .unwrap_err()
                .contains(&format!("signed for {elsewhere}"))
        );
        // A failed verdict, signed.
        let failed = signed(
            &digest,
            CERTIFICATE_PREDICATE,
            predicate("failed", "p"),
            &key,
        );
        assert!(
            judge(&failed, &loose)
                .unwrap_err()
                .contains("its verdict is failed")
        );
        // A payload changed after signing.
        let mut tampered: Value = serde_json::from_slice(&failed).unwrap();
        let good_json: Value = serde_json::from_slice(&good).unwrap();
        tampered["dsseEnvelope"]["payload"] = good_json["dsseEnvelope"]["payload"].clone();
        let tampered = serde_json::to_vec(&tampered).unwrap();
        assert!(
            judge(&tampered, &loose)
                .unwrap_err()
                .contains("no signature verifies")
        );
        // Unsigned.
        let mut bare: Value = serde_json::from_slice(&good).unwrap();
        bare["dsseEnvelope"]["signatures"] = json!([]);
        let bare = serde_json::to_vec(&bare).unwrap();
        assert_eq!(judge(&bare, &loose).unwrap_err(), "it is not signed");
        // Another statement (a provenance) beside the certificate is not a candidate.
        let provenance = signed(&digest, "https://slsa.dev/provenance/v1", json!({}), &key);
        assert_eq!(judge(&provenance, &loose), Ok(None));
        assert!(judge(b"{}", &loose).is_err());
    }

    #[test]
    fn the_default_wait_covers_the_probes_worst_case() {
        use crate::probe::budget::{Level, worst_case};
        let opts = CertifyOptions::default();
        assert!(opts.probe_wait() > worst_case(Level::Active, false, Duration::ZERO));
        let quick = CertifyOptions {
            quick: true,
            ..Default::default()
        };
        assert!(quick.probe_wait() > worst_case(Level::Active, true, Duration::ZERO));
        assert!(quick.probe_wait() <= opts.probe_wait());
    }

    #[test]
    fn cdi_names_follow_gpus_unless_given() {
        assert_eq!(cdi_names(&Gpus::All, &[]), ["nvidia.com/gpu=all"]);
        assert_eq!(
            cdi_names(&Gpus::Count(2), &[]),
            ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
        );
        assert!(cdi_names(&Gpus::None, &[]).is_empty());
        assert_eq!(
            cdi_names(&Gpus::All, &["nvidia.com/gpu=GPU-1".to_string()]),
            ["nvidia.com/gpu=GPU-1"]
        );
    }

    #[test]
    fn a_certificate_passes_the_gate_only_with_a_probe_unless_static_ok() {
        let digest = "sha256:aa";
        let cert = |scope: Value, status: &str| {
            json!({
                "checks": [{"phase": "static", "name": "x", "status": status, "detail": ""}],
                "facts": {"manifest": digest, "scope": scope},
            })
        };
        let static_only = cert(json!({"level": "static", "gpus": "none"}), "PASS");
        let why = judge_certificate(&static_only, Some("certified"), digest, false).unwrap_err();
        assert!(
            why.contains("static checks only") && why.contains("--static-ok"),
            "{why}"
        );
        let ok = judge_certificate(&static_only, Some("certified"), digest, true).unwrap();
        assert!(ok.contains("static checks only"), "{ok}");

        let probed = cert(
            json!({"level": "probe", "gpus": "all", "run": "quick", "launcher": "crun"}),
            "PASS",
        );
        let ok = judge_certificate(&probed, Some("certified"), digest, false).unwrap();
        assert_eq!(
            ok,
            "static checks and the probe on all GPU(s), quick run, under crun"
        );
        assert_eq!(
            Scope::of(&probed).annotation(),
            "probe gpus=all run=quick launcher=crun"
        );
        assert!(judge_certificate(&probed, Some("failed"), digest, true).is_err());
        assert!(judge_certificate(&probed, Some("certified"), "sha256:bb", true).is_err());
        let failed = cert(json!({"level": "probe", "gpus": "all"}), "FAIL");
        assert!(judge_certificate(&failed, Some("certified"), digest, true).is_err());

        // Certificates from before the scope was recorded: a probe's report or nothing.
        let old = json!({"checks": [], "facts": {"manifest": digest}});
        assert!(!Scope::of(&old).probed());
        let old = json!({"checks": [], "facts": {"manifest": digest, "probe": {"checks": []}}});
        assert!(Scope::of(&old).probed());
    }

    #[test]
    fn secret_names_are_recognised() {
        for name in [
            "HF_TOKEN",
            "WANDB_API_KEY",
            "DB_PASSWORD",
            "AWS_SECRET_ACCESS_KEY",
            "GCP_CREDENTIALS",
        ] {
            assert!(crate::lint::looks_secret(name), "{name}");
        }
        for name in [
            "NCCL_IB_HCA",
            "PATH",
            "KEYBOARD",
            "NVIDIA_VISIBLE_DEVICES",
            "TOKENIZERS_PARALLELISM",
        ] {
            assert!(!crate::lint::looks_secret(name), "{name}");
        }
    }

    #[test]
    fn pins_are_judged_against_installed_metadata_and_libnccl() {
        use crate::bake::fs::Contents;
        let lock = crate::resolve::resolve_recipe(
            &crate::recipe::LoadedRecipe::builtin_default(),
            &crate::resolve::Options::default(),
        )
        .unwrap()
        .lock;
        let mut found = Contents::default();
        let (status, detail) = judge_contents(&lock, &found);
        assert_eq!(status, Status::Fail);
        assert!(detail.contains("no torch is installed"), "{detail}");
        for (name, spec) in &lock.packages {
            let v = spec.trim_start_matches("==").to_string();
            found.dists.insert(
                crate::names::normalize(name),
                (v, format!("site-packages/{name}.dist-info")),
            );
        }
        found.nccl.insert(
            "site-packages/nvidia/nccl/lib/libnccl.so.2".into(),
            Some("2.27.5".into()),
        );
        let (status, detail) = judge_contents(&lock, &found);
        assert_eq!(status, Status::Pass, "{detail}");
        found
            .nccl
            .insert("usr/lib/libnccl.so.2".into(), Some("2.21.5".into()));
        let (status, detail) = judge_contents(&lock, &found);
        assert_eq!(status, Status::Fail);
        assert!(
            detail.contains("/usr/lib/libnccl.so.2 reports NCCL 2.21.5"),
            "{detail}"
        );
        found.nccl.remove("usr/lib/libnccl.so.2");
        found.dists.get_mut("nvidia-cudnn-cu12").unwrap().0 = "9.1.0".into();
        let (status, detail) = judge_contents(&lock, &found);
        assert_eq!(status, Status::Fail);
        assert!(
            detail.contains("nvidia-cudnn-cu12 9.1.0, the lock pins 9.10.2.21"),
            "{detail}"
        );
    }
}
