//! The registry requests gpubake makes itself rather than through oci-client, with the
//! session's TLS settings and credentials:
//!
//! - manifest and referrers-list reads, whose bodies are refused past 4 MiB while they arrive
//!   (oci-client reads a body whole before anyone can look at its size);
//! - the token requests of the bearer flow (the docker token protocol: `/v2/` answers 401 with
//!   `WWW-Authenticate: Bearer realm=…,service=…`, the realm gives a token for the scopes asked
//!   for), made first so that a token server's refusal is reported as one, and because a
//!   cross-repository mount needs one token for two repositories;
//! - the mount itself, with that token.

use super::digest::Digest;
use super::layout::MAX_JSON_BYTES;
use super::registry::{MANIFEST_TYPES, Session};
use crate::error::{Error, Result};
use oci_client::Reference;
use oci_client::secrets::RegistryAuth;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};

/// How many times a manifest or referrers-list read is sent while the registry answers 5xx.
const GET_ATTEMPTS: u32 = 4;

/// `repository:NAME:ACTIONS`, the scope of a token for `reference`'s repository.
pub(super) fn scope(reference: &Reference, actions: &str) -> String {
    format!("repository:{}:{actions}", reference.repository())
}

/// What a registry's `/v2/` asks of a client.
#[derive(Debug, PartialEq, Eq)]
enum Challenge {
    /// Nothing: it answers anyone.
    Open,
    /// Basic credentials with every request.
    Basic,
    /// A token from `realm`, for `service`.
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

/// Reads a `WWW-Authenticate` value: a scheme, then `key="value"` pairs separated by commas
/// (a quoted value may hold commas, as scopes do).
fn challenge_of(header: &str) -> Challenge {
    let header = header.trim();
    let (scheme, params) = header.split_once(' ').unwrap_or((header, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Challenge::Basic;
    }
    let mut fields = std::collections::HashMap::new();
    let mut rest = params.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => match quoted.split_once('"') {
                Some((v, n)) => (v, n),
                None => (quoted, ""),
            },
            None => after.split_once(',').unwrap_or((after, "")),
        };
        fields.insert(key, value.to_string());
        rest = next.trim_start_matches(',').trim();
    }
    match fields.remove("realm") {
        Some(realm) => Challenge::Bearer {
            realm,
            service: fields.remove("service"),
        },
        None => Challenge::Basic,
    }
}

/// At most this much of an error body goes into a message.
const BODY_IN_MESSAGE: usize = 300;

impl Session {
    fn url(&self, path: &str) -> String {
        format!("{}://{}/v2/{path}", self.scheme, self.registry)
    }

    /// The `Authorization` value for requests that need `scopes`: a bearer token from the
    /// registry's token server, the basic credentials, or none where the registry asks for
    /// none. A token server that refuses is reported as such: a 401 the way a registry's is
    /// (wrong credentials), anything else with its status and its words.
    pub(super) async fn authorization(
        &self,
        scopes: &[String],
        doing: &str,
    ) -> Result<Option<String>> {
        let probe = self
            .http
            .get(self.url(""))
            .send()
            .await
            .map_err(|e| self.failed(doing, e.into()))?;
        let header = probe
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string);
        let challenge = match (probe.status(), header) {
            (StatusCode::UNAUTHORIZED, Some(h)) => challenge_of(&h),
            (StatusCode::UNAUTHORIZED, None) => Challenge::Basic,
            _ => Challenge::Open,
        };
        let basic = match &self.auth {
            RegistryAuth::Basic(user, password) => Some((user, password)),
            _ => None,
        };
        let (realm, service) = match challenge {
            Challenge::Open => return Ok(None),
            Challenge::Basic => {
                let Some((user, password)) = basic else {
                    return Err(self.refused(doing));
                };
                // Logging in is asking `/v2/` again with the credentials: wrong ones are
                // named here, as a token server's 401 is, not at some later request.
                let login = self
                    .http
                    .get(self.url(""))
                    .basic_auth(user, Some(password))
                    .send()
                    .await
                    .map_err(|e| self.failed(doing, e.into()))?;
                if login.status() == StatusCode::UNAUTHORIZED {
                    return Err(self.refused(doing));
                }
                use base64::Engine;
                let pair = format!("{user}:{password}");
                return Ok(Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                )));
            }
            Challenge::Bearer { realm, service } => (realm, service),
        };
        let mut request = self.http.get(&realm);
        if let Some(service) = &service {
            request = request.query(&[("service", service)]);
        }
        for scope in scopes {
            request = request.query(&[("scope", scope)]);
        }
        if let Some((user, password)) = basic {
            self.check_cleartext(&realm, doing)?;
            request = request.basic_auth(user, Some(password));
        }
        let answer = request.send().await.map_err(|e| {
            Error::Environment(format!(
                "{}: the registry's token server {realm} did not answer while {doing}: {}",
                self.what,
                crate::net::chain(&e)
            ))
        })?;
        let status = answer.status();
        let body = answer.text().await.unwrap_or_default();
        if status == StatusCode::UNAUTHORIZED {
            return Err(self.refused(doing));
        }
        if !status.is_success() {
            let said: String = body.trim().chars().take(BODY_IN_MESSAGE).collect();
            let message = format!(
                "{}: the registry's token server {realm} refused a token for {} while {doing}: \
                 HTTP {status}{}",
                self.what,
                scopes.join(" "),
                if said.is_empty() {
                    String::new()
                } else {
                    format!(": {said}")
                }
            );
            // A server that is down is the environment's; one that says no is an answer.
            return Err(if status.is_server_error() {
                Error::Environment(message)
            } else {
                Error::Usage(message)
            });
        }
        let value: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let token = value["token"]
            .as_str()
            .or(value["access_token"].as_str())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Error::Environment(format!(
                    "{}: the registry's token server {realm} answered without a token while \
                     {doing}",
                    self.what
                ))
            })?;
        Ok(Some(format!("Bearer {token}")))
    }

    /// The manifest `reference` names, as the registry stores it, with its digest; None when
    /// the registry has none by that name. Read as [`Self::capped_get`] reads, so a registry
    /// that sends an endless or oversized manifest costs no more than the limit.
    pub(super) async fn manifest(
        &self,
        reference: &Reference,
        doing: &str,
    ) -> Result<Option<(Vec<u8>, String)>> {
        let name = reference
            .digest()
            .or(reference.tag())
            .unwrap_or("latest")
            .to_string();
        let path = format!("{}/manifests/{name}", reference.repository());
        let accept = MANIFEST_TYPES.join(", ");
        let Some((body, said_digest)) = self
            .capped_get(
                reference,
                &path,
                &accept,
                &format!("manifest {name}"),
                doing,
            )
            .await?
        else {
            return Ok(None);
        };
        let ours = Digest::of(&body).to_string();
        for (whose, theirs) in [
            ("the reference", reference.digest().map(str::to_string)),
            ("the registry", said_digest),
        ] {
            if let Some(theirs) = theirs
                && theirs != ours
            {
                return Err(Error::image(
                    &self.what,
                    format!("manifest {name}: its bytes hash to {ours}, {whose} says {theirs}"),
                ));
            }
        }
        Ok(Some((body, ours)))
    }

    /// The index the referrers API lists `subject`'s referrers in (in `reference`'s
    /// repository), or, where the registry has no such API (a 404), the index the tag schema
    /// keeps under `tag`; None when neither is there. Capped as manifests are.
    pub(super) async fn referrers_index(
        &self,
        reference: &Reference,
        subject: &str,
        tag: &Reference,
        doing: &str,
    ) -> Result<Option<Vec<u8>>> {
        let path = format!("{}/referrers/{subject}", reference.repository());
        let accept = "application/vnd.oci.image.index.v1+json";
        if let Some((body, _)) = self
            .capped_get(reference, &path, accept, "the referrers list", doing)
            .await?
        {
            return Ok(Some(body));
        }
        Ok(self.manifest(tag, doing).await?.map(|(body, _)| body))
    }

    /// GETs `/v2/PATH` with pull access to `reference`'s repository: the body and the
    /// `Docker-Content-Digest` the registry sent, or None on a 404. The body is refused once
    /// it passes [`MAX_JSON_BYTES`] (or its Content-Length says it will), so no more than the
    /// limit is ever read or held.
    async fn capped_get(
        &self,
        reference: &Reference,
        path: &str,
        accept: &str,
        what: &str,
        doing: &str,
    ) -> Result<Option<(Vec<u8>, Option<String>)>> {
        let auth = self
            .authorization(&[scope(reference, "pull")], doing)
            .await?;
        let mut request = self.http.get(self.url(path)).header(ACCEPT, accept);
        if let Some(auth) = auth {
            request = request.header(AUTHORIZATION, auth);
        }
        // A registry may answer a read 5xx while another client writes the same tag
        // (docker-registry's filesystem storage truncates a tag's link file before writing
        // it, and a read between the two finds no digest): a GET is asked again, after a
        // pause, before its answer stands.
        let mut attempt = 1;
        let mut answer = loop {
            let answer = request
                .try_clone()
                .expect("a GET has no streamed body")
                .send()
                .await
                .map_err(|e| self.failed(doing, e.into()))?;
            if !answer.status().is_server_error() || attempt == GET_ATTEMPTS {
                break answer;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200 << attempt)).await;
            attempt += 1;
        };
        let status = answer.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if status == StatusCode::UNAUTHORIZED {
            return Err(self.refused(doing));
        }
        if !status.is_success() {
            let said: String = answer
                .text()
                .await
                .unwrap_or_default()
                .trim()
                .chars()
                .take(BODY_IN_MESSAGE)
                .collect();
            let message = format!("{doing}: {what}: HTTP {status}: {said}");
            // A registry that keeps failing is the environment's fault; a 4xx is an answer
            // about what was asked.
            return Err(if status.is_server_error() {
                Error::Environment(format!("{}: {message} (asked {attempt} times)", self.what))
            } else {
                Error::image(&self.what, message)
            });
        }
        let too_big = |how: String| {
            Error::image(
                &self.what,
                format!(
                    "{what} {how}, more than the {MAX_JSON_BYTES} bytes a manifest or config \
                     may have; refusing it"
                ),
            )
        };
        if let Some(len) = answer.content_length()
            && len > MAX_JSON_BYTES
        {
            return Err(too_big(format!("is {len} bytes by its Content-Length")));
        }
        let said_digest = answer
            .headers()
            .get("Docker-Content-Digest")
            .and_then(|h| h.to_str().ok())
            .map(str::to_string);
        let mut body = Vec::new();
        while let Some(chunk) = answer
            .chunk()
            .await
            .map_err(|e| self.failed(doing, e.into()))?
        {
            body.extend_from_slice(&chunk);
            if body.len() as u64 > MAX_JSON_BYTES {
                return Err(too_big(format!(
                    "runs past {MAX_JSON_BYTES} bytes (reading stopped there)"
                )));
            }
        }
        Ok(Some((body, said_digest)))
    }

    /// [`Self::manifest`], where a missing manifest is an error.
    pub(super) async fn manifest_needed(
        &self,
        reference: &Reference,
        doing: &str,
    ) -> Result<(Vec<u8>, String)> {
        self.manifest(reference, doing).await?.ok_or_else(|| {
            let name = reference.digest().or(reference.tag()).unwrap_or("latest");
            Error::image(
                &self.what,
                format!(
                    "{doing}: the registry has no manifest {name} in {}",
                    reference.repository()
                ),
            )
        })
    }

    /// A small blob (a signature's payload, an attachment's content) of at most `wanted`'s
    /// size and [`MAX_JSON_BYTES`], checked against its digest: reading stops at the size its
    /// descriptor gives, whatever the registry sends.
    pub(super) async fn small_blob(
        &self,
        reference: &Reference,
        wanted: &oci_client::manifest::OciDescriptor,
        doing: &str,
    ) -> std::result::Result<Vec<u8>, String> {
        use futures_util::StreamExt as _;
        let size = u64::try_from(wanted.size).unwrap_or(u64::MAX);
        let blob = &wanted.digest;
        if size > MAX_JSON_BYTES {
            return Err(format!(
                "blob {blob} is {size} bytes, more than the {MAX_JSON_BYTES} allowed"
            ));
        }
        let mut stream = self
            .client
            .pull_blob_stream(reference, wanted)
            .await
            .map_err(|e| format!("blob {blob}: {}", self.failed(doing, e)))?;
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            // oci-client checks the digest as the stream ends, and says so as an error.
            let chunk = chunk.map_err(|e| format!("blob {blob}: {e}"))?;
            out.extend_from_slice(&chunk);
            if out.len() as u64 > size {
                return Err(format!(
                    "blob {blob} runs past the {size} bytes its descriptor gives (reading \
                     stopped there)"
                ));
            }
        }
        let got = Digest::of(&out);
        if got.as_str() != blob {
            return Err(format!("blob {blob}: its bytes are {got}"));
        }
        Ok(out)
    }

    /// Mounts blob `digest` into `target`'s repository from `source`'s, on one registry; false
    /// where the registry did not (it then opened an upload instead, which is cancelled). The
    /// token asks for push and pull on the target and pull on the source, which a registry
    /// needs to see before it shares a blob between repositories.
    pub(super) async fn mount(
        &self,
        target: &Reference,
        source: &Reference,
        digest: &Digest,
    ) -> Result<bool> {
        let doing = format!("pushing: mounting blob {digest}");
        let auth = self
            .authorization(&[scope(target, "pull,push"), scope(source, "pull")], &doing)
            .await?;
        let mut request = self
            .http
            .post(self.url(&format!("{}/blobs/uploads/", target.repository())))
            .query(&[("mount", digest.as_str()), ("from", source.repository())])
            .header(reqwest::header::CONTENT_LENGTH, "0");
        if let Some(auth) = &auth {
            request = request.header(AUTHORIZATION, auth);
        }
        let answer = request
            .send()
            .await
            .map_err(|e| self.failed(&doing, e.into()))?;
        if answer.status() == StatusCode::CREATED {
            return Ok(true);
        }
        if answer.status() == StatusCode::ACCEPTED
            && let Some(location) = answer
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|h| h.to_str().ok())
        {
            // The upload the registry opened instead would wait for data until it expires.
            let url = if location.starts_with('/') {
                format!("{}://{}{location}", self.scheme, self.registry)
            } else {
                location.to_string()
            };
            let mut cancel = self.http.delete(url);
            if let Some(auth) = &auth {
                cancel = cancel.header(AUTHORIZATION, auth);
            }
            let _ = cancel.send().await;
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_read_with_their_quoted_commas() {
        assert_eq!(
            challenge_of(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#
            ),
            Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into())
            }
        );
        assert_eq!(
            challenge_of(r#"Basic realm="Registry Realm""#),
            Challenge::Basic
        );
        assert_eq!(challenge_of("Bearer"), Challenge::Basic);
    }
}
