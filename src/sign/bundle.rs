//! Sigstore bundles (v0.3) of one DSSE envelope and a public key's hint: the form cosign
//! attaches attestations in and reads them back from, verified here offline against a key
//! (no transparency log, no certificate authority).

use super::dsse::{self, Envelope};
use super::keys::{PrivateKey, PublicKey};
use super::statement::Statement;
use serde::{Deserialize, Serialize};

/// The media type of a v0.3 bundle, also the artifact type of its OCI referrer.
pub const MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

/// The referrer annotation that names a bundle's predicate type (cosign's, and what registry
/// listings show): unsigned, so it may sort bundles but never vouch for one.
pub const PREDICATE_ANNOTATION: &str = "dev.sigstore.bundle.predicateType";

/// The annotations cosign writes on the OCI referrer of a bundle, and reads its predicate
/// type from: what the bundle holds, its predicate type, when it was made (RFC 3339).
pub fn annotations(
    predicate_type: &str,
    created: &str,
) -> std::collections::BTreeMap<String, String> {
    std::collections::BTreeMap::from([
        (
            "dev.sigstore.bundle.content".to_string(),
            "dsse-envelope".to_string(),
        ),
        (PREDICATE_ANNOTATION.to_string(), predicate_type.to_string()),
        (
            "org.opencontainers.image.created".to_string(),
            created.to_string(),
        ),
    ])
}

/// A public key named by its hint.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct KeyHint {
    /// Base64 of the SHA-256 of the key's SubjectPublicKeyInfo, as cosign writes it.
    pub hint: String,
}

/// What a verifier checks the signature with.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Material {
    /// The key, by hint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<KeyHint>,
    /// Transparency-log entries: none for a bundle verified against a key offline.
    #[serde(default)]
    pub tlog_entries: Vec<serde_json::Value>,
}

/// A Sigstore bundle holding a DSSE envelope.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Bundle {
    /// MEDIA_TYPE.
    pub media_type: String,
    /// The key's hint.
    pub verification_material: Material,
    /// The signed statement.
    pub dsse_envelope: Envelope,
}

impl Bundle {
    /// `statement`, signed with `key`, in a bundle.
    pub fn sign(statement: &Statement, key: &PrivateKey) -> Bundle {
        let body = serde_json::to_vec(statement).expect("statements serialize");
        Bundle {
            media_type: MEDIA_TYPE.to_string(),
            verification_material: Material {
                public_key: Some(KeyHint {
                    hint: key.public().hint(),
                }),
                tlog_entries: Vec::new(),
            },
            dsse_envelope: Envelope::sign(dsse::IN_TOTO, &body, key),
        }
    }

    /// The bundle in `bytes`, if it is a v0.3 bundle of a DSSE envelope.
    pub fn from_slice(bytes: &[u8]) -> Result<Bundle, String> {
        let b: Bundle = serde_json::from_slice(bytes)
            .map_err(|e| format!("it is not a Sigstore bundle of a DSSE envelope: {e}"))?;
        if b.media_type != MEDIA_TYPE {
            return Err(format!("it is a {}, not a {MEDIA_TYPE}", b.media_type));
        }
        Ok(b)
    }

    /// The statement, once the envelope's signature verifies with `key`; else why not. A
    /// hint that names another key says so first, since that is the likely cause.
    pub fn verify(&self, key: &PublicKey) -> Result<Statement, String> {
        let hint = key.hint();
        if let Some(theirs) = &self.verification_material.public_key
            && theirs.hint != hint
        {
            return Err(format!(
                "it is signed with another key (hint {}; this key's is {hint})",
                theirs.hint
            ));
        }
        let body = self.dsse_envelope.verify(dsse::IN_TOTO, key)?;
        Statement::from_slice(&body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::statement::Descriptor;

    fn statement() -> Statement {
        Statement::new(
            vec![Descriptor::of("app", "sha256:00ff")],
            "https://gpubake.io/certificate/v1",
            serde_json::json!({"verdict": "certified"}),
        )
    }

    #[test]
    fn a_bundle_is_written_as_cosign_reads_it() {
        let key = PrivateKey::generate();
        let json = serde_json::to_value(Bundle::sign(&statement(), &key)).unwrap();
        assert_eq!(json["mediaType"], MEDIA_TYPE);
        assert_eq!(
            json["verificationMaterial"]["publicKey"]["hint"],
            key.public().hint()
        );
        assert_eq!(
            json["verificationMaterial"]["tlogEntries"],
            serde_json::json!([])
        );
        assert_eq!(json["dsseEnvelope"]["payloadType"], dsse::IN_TOTO);
        let sigs = json["dsseEnvelope"]["signatures"].as_array().unwrap();
        assert_eq!(sigs.len(), 1, "a bundle's envelope holds one signature");
        assert!(sigs[0].get("keyid").is_none());
        let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["dsseEnvelope", "mediaType", "verificationMaterial"]);
    }

    #[test]
    fn only_the_signing_key_verifies_it() {
        let key = PrivateKey::generate();
        let bundle = Bundle::sign(&statement(), &key);
        let read = Bundle::from_slice(&serde_json::to_vec(&bundle).unwrap()).unwrap();
        assert_eq!(read.verify(&key.public()).unwrap(), statement());
        let other = PrivateKey::generate();
        assert!(
            read.verify(&other.public())
                .unwrap_err()
                .contains("another key")
        );
        // Without the hint the signature itself decides.
        let mut hintless = read.clone();
        hintless.verification_material.public_key = None;
        assert!(hintless.verify(&key.public()).is_ok());
        assert!(
            hintless
                .verify(&other.public())
                .unwrap_err()
                .contains("no signature verifies")
        );
        let mut old = serde_json::to_value(&bundle).unwrap();
        old["mediaType"] = "application/vnd.dev.sigstore.bundle+json;version=0.1".into();
        assert!(Bundle::from_slice(&serde_json::to_vec(&old).unwrap()).is_err());
    }
}
