//! `docker://`: images pulled from and pushed to a registry over the OCI distribution API,
//! through oci-client. Credentials come from where docker, podman and skopeo keep them
//! (docker_credential: `config.json` with its credential helpers, then podman's `auth.json`).
//!
//! Registries that answer with a bearer challenge get tokens from their token server; gpubake
//! asks for them itself where it matters (see [`super::wire`]): at login, so that a refusal is
//! named as one, and for a mount, which needs pull on a second repository.
//!
//! Pull: the manifest is read as the registry stores it (an index is descended into for the
//! platform asked for), refused once past 4 MiB while it arrives; each blob is downloaded into
//! a layout (the config, like every blob, no further than its descriptor's size, which is
//! capped too), resumed with a Range request after a broken transfer, and verified whole.
//! Push: the manifest goes up byte for byte (so its digest is the one the image has
//! everywhere else); each blob is first asked for (HEAD), then mounted from another repository
//! of the same registry where the image came from one, then uploaded as one stream read from
//! its file. A failed upload starts the blob over from a reopened file, and after the uploads
//! every blob is asked for once more, since some registries keep only part of an upload.
//!
//! oci-client is async; the async stays in this file, behind a runtime of its own.

use super::digest::Digest;
use super::layout::{Layout, MAX_JSON_BYTES, descriptor, digest_of};
use super::model::{Image, Origin, Platform, pick_platform};
use super::streamcheck::{LayerCheck, StreamCheck};
use crate::error::{Error, Result};
use crate::interrupt::ScratchDir;
use futures_util::StreamExt;
use oci_client::client::{
    BlobResponse, Certificate, CertificateEncoding, ClientConfig, ClientProtocol,
};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use oci_spec::image::{Descriptor, ImageIndex, MediaType};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How many times a blob transfer is tried before the push or pull gives up.
const ATTEMPTS: u32 = 4;

/// The manifest types gpubake reads.
pub(super) const MANIFEST_TYPES: [&str; 4] = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// How to reach registries: the options skopeo users know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Check the registry's TLS certificate (`--tls-verify=false` turns it off, and lets
    /// plain HTTP be tried; `--tls-verify=true` means HTTPS, checked, even on loopback). None:
    /// check it unless the registry is marked insecure, as skopeo does without the option,
    /// and reach a loopback registry that speaks only plain HTTP over that, as docker does.
    pub tls_verify: Option<bool>,
    /// A directory of extra CA certificates (`*.crt`, PEM), as skopeo's `--cert-dir`.
    pub cert_dir: Option<PathBuf>,
    /// A credentials file in docker's `config.json` format, read instead of the usual ones.
    pub authfile: Option<PathBuf>,
    /// A registries.conf read instead of the usual one, as skopeo's `--registries-conf`.
    pub registries_conf: Option<PathBuf>,
    /// The platform to pick from an index.
    pub platform: Platform,
    /// A layout where pulled blobs are kept between runs; a staging directory when None.
    pub blob_cache: Option<PathBuf>,
}

impl Default for Access {
    fn default() -> Self {
        Access {
            tls_verify: None,
            cert_dir: None,
            authfile: None,
            registries_conf: None,
            platform: Platform::host(),
            blob_cache: None,
        }
    }
}

/// An image in a registry: `REGISTRY/NAME[:TAG][@DIGEST]`, and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remote {
    /// The reference as written after `docker://`.
    pub reference: String,
    /// How to reach the registry.
    pub access: Access,
}

impl Remote {
    /// The reference, which must name a tag (what `doing` writes), not a digest.
    pub(crate) fn tagged(&self, doing: &str) -> Result<Reference> {
        let reference = self.parsed()?;
        if reference.digest().is_some() {
            return Err(Error::Usage(format!(
                "docker://{}: {doing} a tag, not a digest",
                self.reference
            )));
        }
        Ok(reference)
    }

    pub(crate) fn parsed(&self) -> Result<Reference> {
        self.reference.parse::<Reference>().map_err(|e| {
            Error::Usage(format!(
                "docker://{}: not an image reference ({e}); write docker://REGISTRY/NAME:TAG",
                self.reference
            ))
        })
    }
}

/// A client with its credentials for one registry.
pub(super) struct Session {
    pub(super) client: Client,
    pub(super) auth: RegistryAuth,
    /// A client of the same TLS settings for the requests gpubake makes itself (see
    /// [`super::wire`]).
    pub(super) http: reqwest::Client,
    /// `HOST[:PORT]` as requests address it (`index.docker.io` for Docker Hub).
    pub(super) registry: String,
    /// `HOST[:PORT]` as the reference writes it (`docker.io` for Docker Hub).
    written: String,
    /// `https`, or `http` for a registry that speaks only that and may be reached so.
    pub(super) scheme: &'static str,
    /// The registry is marked insecure (registries.conf, daemon.json): credentials may go to
    /// it, and to its token server, in clear text.
    pub(super) marked_insecure: bool,
    /// Where the credentials came from, for messages; None when there were none.
    creds_from: Option<String>,
    /// Where the credentials held back came from: the registry speaks plain HTTP, is not on
    /// loopback and is not marked insecure, so they are not sent.
    withheld: Option<String>,
    pub(super) what: String,
    pub(super) runtime: tokio::runtime::Runtime,
}

impl Session {
    /// A session with the registry `reference` names, over HTTPS, or over plain HTTP where
    /// the registry speaks only that and may be reached so: with `--tls-verify=false`, on
    /// loopback, or marked insecure (see [`super::insecure`]). HTTPS is tried first, as
    /// containers/image does; a registry marked insecure is not verified either.
    pub(super) fn open(remote: &Remote, reference: &Reference) -> Result<Session> {
        crate::net::use_ring();
        let registry = reference.resolve_registry().to_string();
        let what = format!("docker://{}", remote.reference);
        let standing = super::insecure::standing(
            reference.registry(),
            reference.repository(),
            remote.access.registries_conf.as_deref(),
        )?;
        let marked_insecure = standing.marked_in.is_some();
        let tls_verify = remote.access.tls_verify.unwrap_or(!marked_insecure);
        let roots = certificates(&registry, remote.access.cert_dir.as_deref())?;
        let http = http_client(&roots, tls_verify)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Environment(format!("cannot start an async runtime: {e}")))?;
        // Loopback may fall back to plain HTTP only while TLS is left to the default: an
        // explicit --tls-verify=true asks for HTTPS with a checked certificate, as skopeo reads it.
        let may_be_plain = !tls_verify || (standing.loopback && remote.access.tls_verify.is_none());
        let scheme = runtime.block_on(scheme(&http, &registry, &what, may_be_plain))?;
        let mut config = ClientConfig {
            protocol: match scheme {
                "http" => ClientProtocol::Http,
                _ => ClientProtocol::Https,
            },
            accept_invalid_certificates: !tls_verify,
            extra_root_certificates: roots,
            use_monolithic_push: true,
            connect_timeout: Some(Duration::from_secs(30)),
            read_timeout: Some(Duration::from_secs(300)),
            ..ClientConfig::default()
        };
        let wanted = remote.access.platform.clone();
        config.platform_resolver = Some(Box::new(move |entries| {
            entries
                .iter()
                .find(|e| {
                    e.platform.as_ref().is_some_and(|p| {
                        p.os.to_string() == wanted.os
                            && p.architecture.to_string() == wanted.architecture
                    })
                })
                .map(|e| e.digest.clone())
        }));
        let (mut auth, creds_from) = credentials(&registry, remote.access.authfile.as_deref())?;
        let mut withheld = None;
        if scheme == "http"
            && !standing.loopback
            && !marked_insecure
            && !matches!(auth, RegistryAuth::Anonymous)
        {
            withheld = creds_from.clone();
            auth = RegistryAuth::Anonymous;
        }
        let client = Client::new(config);
        // Requests oci-client makes without taking credentials (blob reads, HEADs) use the
        // ones stored for the registry.
        runtime.block_on(client.store_auth_if_needed(&registry, &auth));
        Ok(Session {
            client,
            auth,
            http,
            registry,
            written: reference.registry().to_string(),
            scheme,
            marked_insecure,
            creds_from,
            withheld,
            what,
            runtime,
        })
    }

    /// Refuses to send the credentials to `url` (a token server's) when that is plain HTTP to
    /// a host that is not loopback, unless the registry is marked insecure.
    pub(super) fn check_cleartext(&self, url: &str, doing: &str) -> Result<()> {
        let (Some(from), Ok(parsed)) = (&self.creds_from, reqwest::Url::parse(url)) else {
            return Ok(());
        };
        let host = parsed.host_str().unwrap_or_default();
        if parsed.scheme() != "http" || self.marked_insecure || super::insecure::is_loopback(host) {
            return Ok(());
        }
        Err(self.cleartext_refused(&format!("its token server {url}"), from, doing))
    }

    /// The error for credentials that are not sent in clear text to `to` (the registry or its
    /// token server) while `doing`.
    pub(super) fn cleartext_refused(&self, to: &str, from: &str, doing: &str) -> Error {
        Error::Usage(format!(
            "{}: {to} asks for credentials while {doing}, and gpubake does not send those from \
             {from} over plain HTTP to a host that is not loopback; serve the registry over \
             HTTPS, or mark it insecure: `[[registry]] location = \"{}\" insecure = \
             true` in registries.conf (--registries-conf), or `insecure-registries` in docker's \
             daemon.json",
            self.what, self.written
        ))
    }

    /// Whether the repository has the blob (a HEAD request).
    pub(super) async fn has_blob(
        &self,
        reference: &Reference,
        digest: &Digest,
        doing: &str,
    ) -> Result<bool> {
        self.client
            .blob_exists(reference, digest.as_str())
            .await
            .map_err(|e| self.failed(doing, e))
    }

    /// Uploads a small blob held in memory, unless the repository has it already.
    pub(super) async fn push_small(
        &self,
        reference: &Reference,
        bytes: &[u8],
        doing: &str,
    ) -> Result<()> {
        let digest = Digest::of(bytes);
        if !self.has_blob(reference, &digest, doing).await? {
            self.client
                .push_blob(reference, bytes.to_vec(), digest.as_str())
                .await
                .map_err(|e| self.failed(doing, e))?;
        }
        Ok(())
    }

    /// The error for a registry (or its token server) answering 401 while `doing`: no
    /// credentials, or ones it does not take.
    pub(super) fn refused(&self, doing: &str) -> Error {
        if let Some(from) = &self.withheld {
            return self.cleartext_refused(&format!("{} (plain HTTP)", self.registry), from, doing);
        }
        match &self.creds_from {
            None => Error::Environment(format!(
                "{}: the registry asks for credentials and none are configured for it \
                     (looked in $DOCKER_CONFIG/config.json or ~/.docker/config.json, its \
                     credential helpers, and podman's auth.json); log in with `docker login` \
                     or `podman login`, or pass --authfile",
                self.what
            )),
            Some(from) => Error::Usage(format!(
                "{}: the registry refused the credentials from {from} while {doing} \
                     (wrong user or password, or no {} access)",
                self.what,
                if doing.starts_with("push") {
                    "push"
                } else {
                    "pull"
                }
            )),
        }
    }

    /// The error for a failed request, saying what to do where there is something to do.
    pub(super) fn failed(&self, doing: &str, e: OciDistributionError) -> Error {
        // Without credentials the first request only reaches the registry; "logging in"
        // would send the reader after a login nobody set up.
        let anonymous;
        let doing = if self.creds_from.is_none() {
            anonymous = doing.replace("logging in", "connecting (no login is set up)");
            anonymous.as_str()
        } else {
            doing
        };
        let text = without_queries(&e.to_string());
        if is_unauthorized(&e) {
            return self.refused(doing);
        }
        let transport = match &e {
            OciDistributionError::RequestError(r) => {
                r.is_connect() || r.is_timeout() || r.is_request() || r.is_body()
            }
            OciDistributionError::IoError(_) => true,
            _ => false,
        };
        let detail = without_queries(&crate::net::chain(&e));
        if detail.contains("certificate") {
            return Error::Environment(format!(
                "{}: the registry's TLS certificate is not trusted while {doing} ({detail}); \
                 pass --cert-dir DIR holding its CA certificate as *.crt (or put it in \
                 /etc/containers/certs.d/HOST:PORT/), or --tls-verify=false",
                self.what
            ));
        }
        if transport {
            return Error::Environment(format!(
                "{}: the registry did not answer while {doing}: {detail}",
                self.what
            ));
        }
        let said = refusal(&e).unwrap_or_else(|| format!("{text}{}", extra(&detail, &text)));
        Error::image(&self.what, format!("{doing}: {said}"))
    }
}

/// How to reach `registry`: `https` when it answers that; `http` when it answers plain HTTP
/// as a registry does (200 or 401 at `/v2/`, as containers/image asks), where `may_be_plain`;
/// an error naming the mismatch where not. A registry that answers neither is left to
/// `https`, whose requests then say what is wrong (an untrusted certificate, no answer).
async fn scheme(
    http: &reqwest::Client,
    registry: &str,
    what: &str,
    may_be_plain: bool,
) -> Result<&'static str> {
    let https = match http.get(format!("https://{registry}/v2/")).send().await {
        Ok(_) => return Ok("https"),
        Err(e) => e,
    };
    if https.is_timeout() {
        return Ok("https");
    }
    let plain = match http.get(format!("http://{registry}/v2/")).send().await {
        Ok(answer) => {
            answer.status().is_success() || answer.status() == reqwest::StatusCode::UNAUTHORIZED
        }
        Err(_) => false,
    };
    match (plain, may_be_plain) {
        (true, true) => Ok("http"),
        (true, false) => Err(Error::Environment(format!(
            "{what}: {registry} answers plain HTTP: use --tls-verify=false, or mark it insecure \
             (`insecure = true` in registries.conf, docker's `insecure-registries`)"
        ))),
        (false, _) => Ok("https"),
    }
}

/// A registry's error answer in its own words (`the registry answered 400: provided digest
/// did not match uploaded content (DIGEST_INVALID)`) rather than the request's URL and the
/// raw JSON; None for other errors and answers that carry no OCI error list.
fn refusal(e: &OciDistributionError) -> Option<String> {
    let OciDistributionError::ServerError { code, message, .. } = e else {
        return None;
    };
    let body: serde_json::Value = serde_json::from_str(message).ok()?;
    let errors: Vec<String> = body["errors"]
        .as_array()?
        .iter()
        .map(|x| {
            format!(
                "{} ({})",
                x["message"].as_str().unwrap_or("no message"),
                x["code"].as_str().unwrap_or("no code")
            )
        })
        .collect();
    (!errors.is_empty()).then(|| format!("the registry answered {code}: {}", errors.join("; ")))
}

/// `text` with the query of every URL in it cut: an upload's URL carries the registry's
/// upload state (`_state=…`) and a signed one its signature, neither of which a message
/// should show.
fn without_queries(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let url_end = rest[at..]
            .find(|c: char| c.is_whitespace() || "\"'<>),".contains(c))
            .map_or(rest.len(), |n| at + n);
        let url = &rest[..url_end];
        match url[at..].find('?') {
            Some(q) => out.push_str(&url[..at + q]),
            None => out.push_str(url),
        }
        rest = &rest[url_end..];
    }
    out.push_str(rest);
    out
}

fn extra(detail: &str, text: &str) -> String {
    detail
        .strip_prefix(text)
        .map(str::to_string)
        .unwrap_or_default()
}

/// True when the registry answered 401.
fn is_unauthorized(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::UnauthorizedError { .. } => true,
        OciDistributionError::AuthenticationFailure(_) => true,
        OciDistributionError::RequestError(r) => {
            r.status() == Some(reqwest::StatusCode::UNAUTHORIZED)
        }
        OciDistributionError::ServerError { code, .. } => *code == 401,
        OciDistributionError::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .any(|e| format!("{:?}", e.code).eq_ignore_ascii_case("unauthorized")),
        _ => false,
    }
}

/// The extra CA certificates for `registry`: every `*.crt` in `cert_dir`, and in the
/// per-registry directories docker and podman read (`/etc/docker/certs.d/HOST[:PORT]/`,
/// `/etc/containers/certs.d/HOST[:PORT]/`).
fn certificates(registry: &str, cert_dir: Option<&Path>) -> Result<Vec<Certificate>> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = cert_dir {
        if !d.is_dir() {
            return Err(Error::Usage(format!(
                "--cert-dir {}: not a directory",
                d.display()
            )));
        }
        dirs.push(d.to_path_buf());
    }
    for base in ["/etc/docker/certs.d", "/etc/containers/certs.d"] {
        dirs.push(Path::new(base).join(registry));
    }
    let mut certs = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "crt"))
            .collect();
        files.sort();
        for file in files {
            let data = std::fs::read(&file).map_err(|e| Error::reading(&file, e))?;
            if !String::from_utf8_lossy(&data).contains("-----BEGIN CERTIFICATE-----") {
                return Err(Error::Usage(format!(
                    "{}: not a PEM certificate",
                    file.display()
                )));
            }
            certs.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data,
            });
        }
    }
    Ok(certs)
}

/// The HTTP client for gpubake's own requests, trusting what oci-client's trusts.
fn http_client(roots: &[Certificate], tls_verify: bool) -> Result<reqwest::Client> {
    let mut extra = Vec::new();
    for cert in roots {
        extra.push(
            reqwest::Certificate::from_pem(&cert.data).map_err(|e| {
                Error::Usage(format!("an extra CA certificate does not parse: {e}"))
            })?,
        );
    }
    reqwest::Client::builder()
        .danger_accept_invalid_certs(!tls_verify)
        .tls_certs_merge(extra)
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(300))
        .user_agent(crate::net::USER_AGENT)
        .build()
        .map_err(|e| Error::Environment(format!("cannot set up an HTTP client: {e}")))
}

/// The credentials for `registry` and where they came from: `authfile` when given, else
/// docker's config (with its helpers), else podman's auth.json; anonymous when none has any.
fn credentials(registry: &str, authfile: Option<&Path>) -> Result<(RegistryAuth, Option<String>)> {
    use docker_credential::{CredentialRetrievalError as Lookup, DockerCredential};
    let found = match authfile {
        Some(path) => {
            let file = std::fs::File::open(path).map_err(|e| Error::reading(path, e))?;
            let got = docker_credential::get_credential_from_reader(file, registry);
            match got {
                Err(Lookup::NoCredentialConfigured) => {
                    return Err(Error::Usage(format!(
                        "--authfile {}: has no credentials for {registry}",
                        path.display()
                    )));
                }
                other => other.map(|c| (c, path.display().to_string())),
            }
        }
        None => {
            let docker = docker_config();
            let from_docker = match &docker {
                Some(path) if path.exists() => docker_credential::get_credential(registry)
                    .map(|c| (c, path.display().to_string())),
                _ => Err(Lookup::ConfigNotFound),
            };
            match from_docker {
                Err(Lookup::NoCredentialConfigured | Lookup::ConfigNotFound) => {
                    podman_credential(registry)
                }
                Err(Lookup::ConfigReadError) => {
                    let path = docker.unwrap_or_default();
                    return Err(Error::Usage(format!(
                        "{}: unreadable as a docker config (JSON with `auths`)",
                        path.display()
                    )));
                }
                other => other,
            }
        }
    };
    match found {
        Ok((DockerCredential::UsernamePassword(user, pass), from)) => {
            Ok((RegistryAuth::Basic(user, pass), Some(from)))
        }
        Ok((DockerCredential::IdentityToken(_), from)) => Err(Error::Unsupported(format!(
            "{from} holds an identity token for {registry}; gpubake logs in with a user and \
             password (or a token used as the password)"
        ))),
        Err(Lookup::NoCredentialConfigured | Lookup::ConfigNotFound) => {
            Ok((RegistryAuth::Anonymous, None))
        }
        Err(e) => Err(Error::Environment(format!(
            "reading the credentials for {registry}: {e:?}"
        ))),
    }
}

/// Docker's config file: `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
fn docker_config() -> Option<PathBuf> {
    match std::env::var_os("DOCKER_CONFIG") {
        Some(dir) => Some(PathBuf::from(dir).join("config.json")),
        None => std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json")),
    }
}

/// Podman's login for `registry`, from `$REGISTRY_AUTH_FILE` or
/// `$XDG_RUNTIME_DIR/containers/auth.json`; a file that is not there holds none.
fn podman_credential(
    registry: &str,
) -> std::result::Result<
    (docker_credential::DockerCredential, String),
    docker_credential::CredentialRetrievalError,
> {
    use docker_credential::CredentialRetrievalError as Lookup;
    let path = match std::env::var_os("REGISTRY_AUTH_FILE") {
        Some(p) => PathBuf::from(p),
        None => match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(d) => PathBuf::from(d).join("containers/auth.json"),
            None => return Err(Lookup::ConfigNotFound),
        },
    };
    if !path.exists() {
        return Err(Lookup::ConfigNotFound);
    }
    docker_credential::get_podman_credential(registry).map(|c| (c, path.display().to_string()))
}

/// The media type a manifest declares, or what its shape says.
pub(super) fn declared_type(bytes: &[u8]) -> String {
    let value: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    match value["mediaType"].as_str() {
        Some(t) => t.to_string(),
        None if value["manifests"].is_array() => MediaType::ImageIndex.to_string(),
        None => MediaType::ImageManifest.to_string(),
    }
}

pub(super) fn is_index(media_type: &str) -> bool {
    media_type == MediaType::ImageIndex.to_string()
        || media_type == "application/vnd.docker.distribution.manifest.list.v2+json"
}

/// How a pull checks what the registry serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pulling {
    /// Each blob against its digest, as it arrives (the blob cache: a build's base, inspect).
    Digests,
    /// Each blob against its digest and each layer's tar stream and diff id, as it arrives,
    /// on its way into a temporary file that is moved into place only when all hold (copy).
    Layers,
    /// Each blob kept as served, under the digest the manifest names, in a staging layout of
    /// the pull's own, so that `verify` re-hashes it and fails a damaged one as it fails a
    /// layout's (exit 1, every such blob named). Never for a layout that outlives the pull.
    ToJudge,
}

/// Pulls the image into `into` (only the blobs it lacks) and returns it, read from there.
/// `staging` is the directory `into` lives in when it is a temporary one.
pub fn open(remote: &Remote, into: Layout, staging: Option<ScratchDir>) -> Result<Image> {
    pull(remote, into, staging, Pulling::Digests).map(|(image, _)| image)
}

/// As [`open`], and the image checked as `copy` checks its source (digests, tar streams,
/// diff ids, as [`Image::check`]): each blob downloaded is checked as it streams into its
/// temporary file, read once, and only the blobs `into` already held are read from there.
pub fn open_checked(remote: &Remote, into: Layout, staging: Option<ScratchDir>) -> Result<Image> {
    let (image, checked) = pull(remote, into, staging, Pulling::Layers)?;
    image.check_except(&checked)?;
    Ok(image)
}

/// Downloads every blob of the image as the registry serves it now into `into`, a fresh
/// staging layout (its directory `staging`), for `verify` and `certify` to judge: nothing is
/// taken from the blob cache, whose copies were verified when they were pulled and say
/// nothing of what the registry serves now.
pub fn open_as_served(remote: &Remote, into: Layout, staging: ScratchDir) -> Result<Image> {
    pull(remote, into, Some(staging), Pulling::ToJudge).map(|(image, _)| image)
}

/// The image pulled as `pulling` says, and the blobs checked on their way in.
fn pull(
    remote: &Remote,
    into: Layout,
    staging: Option<ScratchDir>,
    pulling: Pulling,
) -> Result<(Image, HashSet<Digest>)> {
    let reference = remote.parsed()?;
    let session = Session::open(remote, &reference)?;
    let (desc, checked) = session
        .runtime
        .block_on(pull_async(&session, remote, &reference, &into, pulling))?;
    let image = Image::in_layout(into, &desc, &remote.access.platform, staging)?;
    let origin = Origin {
        registry: reference.resolve_registry().to_string(),
        repository: reference.repository().to_string(),
        blobs: image.blobs().map(|d| d.digest().to_string()).collect(),
    };
    Ok((image.with_origin(Some(origin)), checked))
}

/// An image's manifest as the registry serves it, read without its layers: what a signature
/// or a certificate is checked against, since the manifest's digest binds every blob.
pub struct ManifestRead {
    /// The manifest's digest (the platform's, for an index).
    pub digest: Digest,
    /// The manifest.
    pub manifest: oci_spec::image::ImageManifest,
    /// The config's bytes as served (checked against its digest), or why they could not be
    /// had.
    pub config: std::result::Result<Vec<u8>, String>,
}

/// Reads the image's manifest (descending an index for the access's platform, each checked
/// against its digest) and its config, and none of its layers.
pub fn read_manifest(remote: &Remote) -> Result<ManifestRead> {
    let reference = remote.parsed()?;
    let s = Session::open(remote, &reference)?;
    s.runtime.block_on(async {
        let (bytes, digest, _) = resolve_manifest(&s, remote, &reference).await?;
        let manifest: oci_spec::image::ImageManifest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::image(&s.what, format!("manifest {digest}: {e}")))?;
        let wanted = wanted(manifest.config());
        let config = s
            .small_blob(&reference, &wanted, "reading the config")
            .await;
        Ok(ManifestRead {
            digest: Digest::of(&bytes),
            manifest,
            config,
        })
    })
}

/// The image's manifest for the access's platform: its bytes (checked against the digest the
/// registry gives), that digest, and its media type. An index is descended into, one level.
async fn resolve_manifest(
    s: &Session,
    remote: &Remote,
    reference: &Reference,
) -> Result<(Vec<u8>, String, String)> {
    let (mut bytes, mut digest) = s.manifest_needed(reference, "reading the manifest").await?;
    let mut media_type = declared_type(&bytes);
    if is_index(&media_type) {
        let index: ImageIndex = serde_json::from_slice(&bytes)
            .map_err(|e| Error::image(&s.what, format!("index {digest}: {e}")))?;
        let platform = &remote.access.platform;
        let pick = pick_platform(&index, platform).ok_or_else(|| {
            Error::image(
                &s.what,
                format!(
                    "index {digest} has no {platform} image; it has {}",
                    super::model::index_platforms(&index).join(", ")
                ),
            )
        })?;
        let by_digest = reference.clone_with_digest(pick.digest().to_string());
        (bytes, digest) = s
            .manifest_needed(&by_digest, "reading the platform's manifest")
            .await?;
        media_type = declared_type(&bytes);
        if is_index(&media_type) {
            return Err(Error::image(
                &s.what,
                format!("{digest} is an index inside an index; gpubake reads one level"),
            ));
        }
    }
    Ok((bytes, digest, media_type))
}

async fn pull_async(
    s: &Session,
    remote: &Remote,
    reference: &Reference,
    into: &Layout,
    pulling: Pulling,
) -> Result<(Descriptor, HashSet<Digest>)> {
    let (bytes, digest, media_type) = resolve_manifest(s, remote, reference).await?;
    // Session::manifest checked the bytes against their digest, which is what the image is
    // known by from here on.
    let ours = Digest::of(&bytes);
    let manifest: oci_spec::image::ImageManifest = serde_json::from_slice(&bytes)
        .map_err(|e| Error::image(&s.what, format!("manifest {digest}: {e}")))?;
    let config = manifest.config();
    if config.size() > MAX_JSON_BYTES {
        return Err(Error::image(
            &s.what,
            format!(
                "config {} is {} bytes, more than the {MAX_JSON_BYTES} a config may have; refusing it",
                config.digest(),
                config.size()
            ),
        ));
    }
    let mut checked = HashSet::new();
    if fetch_blob(s, reference, config, into, pulling, None).await? {
        checked.insert(digest_of(config)?);
    }
    let diff_ids = match pulling {
        Pulling::Layers => diff_ids(into, config)?,
        _ => Vec::new(),
    };
    let progress = crate::progress::Progress::new(
        format!("{}: pulling the layers", s.what),
        crate::progress::Unit::Bytes,
        Some(manifest.layers().iter().map(|d| d.size()).sum()),
    );
    for (i, desc) in manifest.layers().iter().enumerate() {
        let diff_id = diff_ids.get(i).cloned();
        if fetch_blob(s, reference, desc, into, pulling, diff_id).await? {
            checked.insert(digest_of(desc)?);
        }
        progress.inc(desc.size());
    }
    progress.finish();
    into.write_blob(&bytes)?;
    let desc = descriptor(media_type.as_str().into(), &ours, bytes.len() as u64);
    Ok((desc, checked))
}

/// The diff ids the config `desc` (in `into`) lists, in order, where it is an image's config;
/// none for another kind (an artifact's), whose layers have none to check.
fn diff_ids(into: &Layout, desc: &Descriptor) -> Result<Vec<String>> {
    let image_config = [
        MediaType::ImageConfig.to_string(),
        "application/vnd.docker.container.image.v1+json".to_string(),
    ];
    if !image_config.contains(&desc.media_type().to_string()) {
        return Ok(Vec::new());
    }
    let bytes = into.read_blob(&digest_of(desc)?, Some(desc.size()))?;
    let config: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::image(into.describe(), format!("config {}: {e}", desc.digest())))?;
    Ok(config["rootfs"]["diff_ids"]
        .as_array()
        .map(|ids| {
            ids.iter()
                .filter_map(|id| id.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// Downloads one blob into `into` unless it is there, resuming a broken transfer where it
/// stopped (when the registry honours Range) and checking it as `pulling` says: the whole
/// blob against its digest at the end, and with [`Pulling::Layers`] a layer's tar stream and
/// `diff_id` as it streams. True when it was downloaded (and so checked), false when `into`
/// had it.
pub(super) async fn fetch_blob(
    s: &Session,
    reference: &Reference,
    desc: &Descriptor,
    into: &Layout,
    pulling: Pulling,
    diff_id: Option<String>,
) -> Result<bool> {
    let digest = digest_of(desc)?;
    if into.has_blob(&digest, desc.size()) {
        return Ok(false);
    }
    let layer_check = || match pulling {
        Pulling::Layers => LayerCheck::start(desc, &digest, diff_id.clone()),
        _ => None,
    };
    let mut layer = layer_check();
    let wanted = OciDescriptor {
        digest: digest.to_string(),
        size: desc.size() as i64,
        media_type: desc.media_type().to_string(),
        ..OciDescriptor::default()
    };
    let mut writer = into.blob_writer()?;
    let mut have: u64 = 0;
    let mut last = String::new();
    for attempt in 1..=ATTEMPTS {
        if attempt > 1 {
            tokio::time::sleep(Duration::from_millis(500 * u64::from(attempt))).await;
        }
        if have > 0 {
            eprintln!("{}: resuming blob {digest} at byte {have}", s.what);
        }
        let response = match s
            .client
            .pull_blob_stream_partial(reference, &wanted, have, None)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                let e = s.failed(&format!("downloading blob {digest}"), e);
                if !matches!(e, Error::Environment(_)) || is_missing_creds(&e) {
                    return Err(e);
                }
                last = e.to_string();
                continue;
            }
        };
        let mut stream = match response {
            BlobResponse::Partial(stream) => stream,
            BlobResponse::Full(stream) => {
                if have > 0 {
                    // The registry ignored the Range: start the blob over.
                    writer = into.blob_writer()?;
                    layer = layer_check();
                    have = 0;
                }
                stream
            }
        };
        let mut broken = None;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => {
                    writer
                        .write_all(&bytes)
                        .map_err(|e| Error::writing_needing(into.root(), e, desc.size() - have))?;
                    if let Some(layer) = &layer {
                        layer.feed(&bytes);
                    }
                    have += bytes.len() as u64;
                    if have > desc.size() {
                        return Err(Error::image(
                            &s.what,
                            format!(
                                "blob {digest} is longer than the {} bytes its descriptor says",
                                desc.size()
                            ),
                        ));
                    }
                }
                Err(e) => {
                    broken = Some(e.to_string());
                    break;
                }
            }
        }
        match broken {
            // Every byte is here: an error after the last one (oci-client's own digest check
            // of a whole-blob answer) is the commit's to name.
            _ if have == desc.size() => {
                if pulling == Pulling::ToJudge {
                    let (got, _) = writer.commit()?;
                    if got != digest {
                        let (from, to) = (into.blob_path(&got), into.blob_path(&digest));
                        std::fs::rename(&from, &to).map_err(|e| Error::writing(&to, e))?;
                    }
                    return Ok(true);
                }
                // Both verdicts come before the blob is moved into place. A digest that does
                // not hold is named as the cause, whatever the layer's reader made of the bytes.
                let arrived = |got: Digest| {
                    Error::image(&s.what, format!("blob {digest} arrived with content {got}"))
                };
                if let Some(Err(e)) = layer.take().map(LayerCheck::finish) {
                    let got = writer.discard()?;
                    return Err(if got == digest {
                        Error::image(&s.what, e)
                    } else {
                        arrived(got)
                    });
                }
                return match writer.commit_if(&digest)? {
                    Ok(_) => Ok(true),
                    Err(got) => Err(arrived(got)),
                };
            }
            None => {
                last = format!("the transfer ended after {have} of {} bytes", desc.size());
            }
            Some(e) => last = e,
        }
    }
    Err(Error::Environment(format!(
        "{}: downloading blob {digest} failed {ATTEMPTS} times; last: {last}",
        s.what
    )))
}

/// The blob `desc` names, as oci-client asks for it.
pub(super) fn wanted(desc: &Descriptor) -> OciDescriptor {
    OciDescriptor {
        digest: desc.digest().to_string(),
        size: i64::try_from(desc.size()).unwrap_or(i64::MAX),
        media_type: desc.media_type().to_string(),
        ..OciDescriptor::default()
    }
}

fn is_missing_creds(e: &Error) -> bool {
    e.to_string().contains("asks for credentials")
}

/// Pushes `image` to `remote` (by tag, `latest` when none is named) and returns the digest
/// the registry now holds it under, which is the image's own.
pub fn push(image: &Image, remote: &Remote) -> Result<Digest> {
    let reference = remote.tagged("push to")?;
    let session = Session::open(remote, &reference)?;
    session
        .runtime
        .block_on(push_async(&session, image, &reference))
}

/// Asks `remote`'s registry for push access, as a push begins: a build calls it before it
/// builds, so a registry that is down or refuses is found out in seconds, not after the
/// build.
pub fn check_push_access(remote: &Remote) -> Result<()> {
    let reference = remote.parsed()?;
    let session = Session::open(remote, &reference)?;
    session
        .runtime
        .block_on(log_in_to_push(&session, &reference))
}

pub(super) async fn log_in_to_push(s: &Session, reference: &Reference) -> Result<()> {
    // The token server is asked first, by gpubake, so that its refusal is reported as one.
    s.authorization(
        &[super::wire::scope(reference, "pull,push")],
        "pushing: logging in",
    )
    .await?;
    s.client
        .auth(reference, &s.auth, RegistryOperation::Push)
        .await
        .map_err(|e| s.failed("pushing: logging in", e))?;
    Ok(())
}

async fn push_async(s: &Session, image: &Image, reference: &Reference) -> Result<Digest> {
    log_in_to_push(s, reference).await?;
    let mount_from = image.origin().and_then(|o| {
        (o.registry == reference.resolve_registry() && o.repository != reference.repository())
            .then(|| Reference::with_tag(o.registry.clone(), o.repository.clone(), "latest".into()))
            .map(|r| (r, &o.blobs))
    });
    let blobs: Vec<&Descriptor> = image.blobs().collect();
    let (mut present, mut mounted, mut uploaded) = (0, 0, 0);
    let progress = crate::progress::Progress::new(
        format!("{}: pushing the blobs", s.what),
        crate::progress::Unit::Bytes,
        Some(blobs.iter().map(|d| d.size()).sum()),
    );
    for desc in &blobs {
        let digest = digest_of(desc)?;
        if s.has_blob(reference, &digest, "pushing: asking for a blob")
            .await?
        {
            present += 1;
        } else if let Some((source, known)) = &mount_from
            && known.contains(digest.as_str())
            // A mount that fails for any reason leaves the upload to do the work.
            && matches!(s.mount(reference, source, &digest).await, Ok(true))
        {
            mounted += 1;
        } else {
            let diff_id = image
                .layers()
                .into_iter()
                .find(|l| l.descriptor().digest() == desc.digest())
                .and_then(|l| l.diff_id().map(str::to_string));
            upload(s, image.store(), reference, desc, &digest, diff_id).await?;
            uploaded += 1;
        }
        progress.inc(desc.size());
    }
    progress.finish();
    eprintln!(
        "{}: {uploaded} blobs uploaded, {mounted} mounted{}, {present} already there",
        s.what,
        match &mount_from {
            Some((source, _)) if mounted > 0 => format!(" from {}", source.repository()),
            _ => String::new(),
        }
    );
    // Some registries keep only part of an upload and still answer 201: ask again.
    for desc in &blobs {
        let digest = digest_of(desc)?;
        if !s
            .has_blob(reference, &digest, "pushing: checking the uploaded blobs")
            .await?
        {
            return Err(Error::Environment(format!(
                "{}: the registry accepted blob {digest} but does not have it now",
                s.what
            )));
        }
    }
    let media_type = image.descriptor().media_type().to_string();
    let content_type = reqwest::header::HeaderValue::from_str(&media_type)
        .map_err(|e| Error::image(&s.what, format!("media type {media_type}: {e}")))?;
    s.client
        .push_manifest_raw(reference, image.raw_manifest().to_vec(), content_type)
        .await
        .map_err(|e| s.failed("pushing the manifest", e))?;
    Ok(image.digest().clone())
}

/// The tag's manifest as the registry stores it, when that is an index: the index, its exact
/// bytes and their digest. Nothing else is pulled.
fn top_index(remote: &Remote) -> Result<Option<(ImageIndex, Vec<u8>, Digest)>> {
    let reference = remote.parsed()?;
    let session = Session::open(remote, &reference)?;
    // Read with the 4 MiB cap and checked against the digest the registry sends.
    let (bytes, digest) = session
        .runtime
        .block_on(session.manifest_needed(&reference, "reading the manifest"))?;
    if !is_index(&declared_type(&bytes)) {
        return Ok(None);
    }
    let ours = Digest::of(&bytes);
    let index: ImageIndex = serde_json::from_slice(&bytes)
        .map_err(|e| Error::image(&session.what, format!("index {digest}: {e}")))?;
    Ok(Some((index, bytes.to_vec(), ours)))
}

/// The platforms of the image's index, in its order; None when it is a plain manifest.
pub fn index_platforms(remote: &Remote) -> Result<Option<Vec<String>>> {
    Ok(top_index(remote)?.map(|(index, _, _)| super::model::index_platforms(&index)))
}

/// Pulls every platform of the image into `into` when the registry holds it as an index:
/// each manifest by digest with its blobs (checked as [`open_checked`] checks them, with
/// `checked`), then the index's exact bytes. None for a plain manifest (nothing is pulled
/// then).
pub fn open_index(
    remote: &Remote,
    into: Layout,
    checked: bool,
) -> Result<Option<super::model::IndexImage>> {
    let Some((index, bytes, digest)) = top_index(remote)? else {
        return Ok(None);
    };
    let reference = remote.parsed()?;
    for entry in index.manifests() {
        let by_digest = Remote {
            reference: format!(
                "{}/{}@{}",
                reference.resolve_registry(),
                reference.repository(),
                entry.digest()
            ),
            access: remote.access.clone(),
        };
        if checked {
            open_checked(&by_digest, into.clone(), None)?;
        } else {
            open(&by_digest, into.clone(), None)?;
        }
    }
    into.write_blob(&bytes)?;
    let desc = descriptor(MediaType::ImageIndex, &digest, bytes.len() as u64);
    super::model::IndexImage::in_layout(into, &desc, None).map(Some)
}

/// Pushes a multi-platform image: each platform's manifest (with its blobs) by digest, then
/// the index's exact bytes under the tag, so the registry holds the index gpubake wrote, with
/// its digest. Returns that digest.
pub fn push_index(index: &super::model::IndexImage, remote: &Remote) -> Result<Digest> {
    let reference = remote.tagged("push to")?;
    let session = Session::open(remote, &reference)?;
    session.runtime.block_on(async {
        for image in index.images() {
            let by_digest = Reference::with_digest(
                reference.registry().to_string(),
                reference.repository().to_string(),
                image.digest().to_string(),
            );
            push_async(&session, image, &by_digest).await?;
        }
        let content_type =
            reqwest::header::HeaderValue::from_static("application/vnd.oci.image.index.v1+json");
        session
            .client
            .push_manifest_raw(&reference, index.raw().to_vec(), content_type)
            .await
            .map_err(|e| session.failed("pushing the index", e))?;
        Ok(index.digest().clone())
    })
}

/// Uploads one blob as a single stream from its file, checked as it goes (its digest and
/// size, and a layer's tar stream and `diff_id`, see [`StreamCheck`]), so that it is read
/// once: the last chunk is held back until the checks hold, so a blob that fails them never
/// reaches the registry whole and is refused (exit 2) naming what failed. Each retry reopens
/// the file and starts the blob over, since a stream half sent cannot be sent again.
pub(super) async fn upload(
    s: &Session,
    store: &Layout,
    reference: &Reference,
    desc: &Descriptor,
    digest: &Digest,
    diff_id: Option<String>,
) -> Result<()> {
    let path = store.blob_path(digest);
    let mut last = None;
    for attempt in 1..=ATTEMPTS {
        if attempt > 1 {
            tokio::time::sleep(Duration::from_millis(500 * u64::from(attempt))).await;
        }
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| Error::reading(&path, e))?;
        let refused = std::sync::Arc::new(std::sync::Mutex::new(None));
        let outgoing = Outgoing {
            chunks: tokio_util::io::ReaderStream::with_capacity(file, 1 << 20),
            check: Some(StreamCheck::start(desc, digest.clone(), diff_id.clone())),
            held: None,
            refused: refused.clone(),
        };
        let stream = futures_util::stream::unfold(outgoing, Outgoing::next);
        let pushed = s
            .client
            .push_blob_stream(reference, stream, digest.as_str(), Some(desc.size()))
            .await;
        if let Some(why) = refused.lock().map(|mut r| r.take()).unwrap_or_default() {
            return Err(Error::image(store.describe(), why));
        }
        match pushed {
            Ok(_) => return Ok(()),
            Err(e) => {
                let e = s.failed(&format!("pushing blob {digest}"), e);
                if !matches!(e, Error::Environment(_)) || is_missing_creds(&e) {
                    return Err(e);
                }
                last = Some(e);
            }
        }
    }
    Err(last.expect("at least one attempt"))
}

/// A blob's file on its way to the registry, one chunk behind the checks.
struct Outgoing {
    chunks: tokio_util::io::ReaderStream<tokio::fs::File>,
    /// None once the file has ended or failed.
    check: Option<StreamCheck>,
    /// The chunk read last, sent only once the next one is read or the checks hold.
    held: Option<bytes::Bytes>,
    /// Why the checks failed, for the upload's caller.
    refused: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl Outgoing {
    /// The next chunk to send, an error that aborts the upload, or the end.
    async fn next(
        mut self,
    ) -> Option<(
        std::result::Result<bytes::Bytes, OciDistributionError>,
        Self,
    )> {
        loop {
            match self.chunks.next().await {
                Some(Ok(chunk)) => {
                    self.check.as_mut()?.feed(&chunk);
                    if let Some(previous) = self.held.replace(chunk) {
                        return Some((Ok(previous), self));
                    }
                }
                Some(Err(e)) => {
                    self.check = None;
                    return Some((Err(OciDistributionError::from(e)), self));
                }
                None => {
                    return match self.check.take()?.finish() {
                        Ok(()) => self.held.take().map(|last| (Ok(last), self)),
                        Err(why) => {
                            let error = std::io::Error::other(why.clone());
                            if let Ok(mut refused) = self.refused.lock() {
                                *refused = Some(why);
                            }
                            Some((Err(OciDistributionError::from(error)), self))
                        }
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_say_what_they_are() {
        assert!(is_index(&declared_type(
            br#"{"schemaVersion":2,"manifests":[]}"#
        )));
        assert!(is_index(&declared_type(
            br#"{"mediaType":"application/vnd.docker.distribution.manifest.list.v2+json"}"#
        )));
        assert!(!is_index(&declared_type(
            br#"{"schemaVersion":2,"layers":[]}"#
        )));
    }

    #[test]
    fn urls_lose_their_queries() {
        assert_eq!(
            without_queries(
                "url https://h:5000/v2/a/blobs/uploads/u?_state=abc%3D&digest=sha256:1, \
                 envelope: x (see http://h/y?z)"
            ),
            "url https://h:5000/v2/a/blobs/uploads/u, envelope: x (see http://h/y)"
        );
        assert_eq!(without_queries("no url here"), "no url here");
    }

    #[test]
    fn a_cert_dir_must_hold_pem_certificates() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), "not a certificate").unwrap();
        let err = certificates("127.0.0.1:1", Some(dir.path()))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("not a PEM certificate"), "{err}");
        assert!(certificates("127.0.0.1:1", Some(&dir.path().join("none"))).is_err());
    }
}
