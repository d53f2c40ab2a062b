//! in-toto Statement v1: what a signature is about (its subjects, by digest) and what it says
//! (a predicate of a named type). Only the spec's fields are written: Sigstore's verifiers
//! read statements with protobuf's JSON reader, which refuses unknown fields.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The statement type of in-toto v1.
pub const STATEMENT_V1: &str = "https://in-toto.io/Statement/v1";

/// A resource by name and digests (in-toto's ResourceDescriptor), as subjects and as SLSA's
/// resolved dependencies.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// A name for it (an image reference, a file name).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Where it is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uri: String,
    /// Its digests by algorithm, lowercase hex.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub digest: BTreeMap<String, String>,
    /// Its media type.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub media_type: String,
    /// Anything else about it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, serde_json::Value>,
}

impl Descriptor {
    /// `name` with the digest `algorithm:hex` (an OCI digest).
    pub fn of(name: &str, digest: &str) -> Descriptor {
        let (algorithm, hex) = digest.split_once(':').unwrap_or(("sha256", digest));
        Descriptor {
            name: name.to_string(),
            digest: BTreeMap::from([(algorithm.to_string(), hex.to_string())]),
            ..Descriptor::default()
        }
    }

    /// Whether it names the OCI digest `digest`.
    pub fn has(&self, digest: &str) -> bool {
        digest.split_once(':').is_some_and(|(algorithm, hex)| {
            self.digest.get(algorithm).map(String::as_str) == Some(hex)
        })
    }
}

/// An in-toto v1 statement.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Statement {
    /// Always STATEMENT_V1.
    #[serde(rename = "_type")]
    pub kind: String,
    /// What it is about.
    pub subject: Vec<Descriptor>,
    /// What the predicate is.
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    /// What it says.
    #[serde(default)]
    pub predicate: serde_json::Value,
}

impl Statement {
    /// A statement of `predicate_type` about `subjects`.
    pub fn new(
        subjects: Vec<Descriptor>,
        predicate_type: &str,
        predicate: serde_json::Value,
    ) -> Statement {
        Statement {
            kind: STATEMENT_V1.to_string(),
            subject: subjects,
            predicate_type: predicate_type.to_string(),
            predicate,
        }
    }

    /// The statement in `bytes`, if it is an in-toto v1 statement; else why not.
    pub fn from_slice(bytes: &[u8]) -> Result<Statement, String> {
        let s: Statement = serde_json::from_slice(bytes)
            .map_err(|e| format!("its payload is not an in-toto statement: {e}"))?;
        if s.kind != STATEMENT_V1 {
            return Err(format!("its statement is {}, not {STATEMENT_V1}", s.kind));
        }
        if s.subject.is_empty() {
            return Err("its statement has no subject".into());
        }
        Ok(s)
    }

    /// Whether one of its subjects is the OCI digest `digest`.
    pub fn about(&self, digest: &str) -> bool {
        self.subject.iter().any(|s| s.has(digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_is_written_with_the_specs_fields_only() {
        let s = Statement::new(
            vec![Descriptor::of("registry.example/app", "sha256:abc")],
            "https://example.com/p/v1",
            serde_json::json!({"k": 1}),
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "_type": STATEMENT_V1,
                "subject": [{"name": "registry.example/app", "digest": {"sha256": "abc"}}],
                "predicateType": "https://example.com/p/v1",
                "predicate": {"k": 1}
            })
        );
        let back = Statement::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert!(back.about("sha256:abc"));
        assert!(!back.about("sha256:abd") && !back.about("sha512:abc") && !back.about("abc"));
    }

    #[test]
    fn statements_of_another_version_or_without_subject_are_refused() {
        let v01 = br#"{"_type":"https://in-toto.io/Statement/v0.1","subject":[{"digest":{"sha256":"a"}}],"predicateType":"x"}"#;
        assert!(Statement::from_slice(v01).unwrap_err().contains("v0.1"));
        let none =
            br#"{"_type":"https://in-toto.io/Statement/v1","subject":[],"predicateType":"x"}"#;
        assert!(
            Statement::from_slice(none)
                .unwrap_err()
                .contains("no subject")
        );
        assert!(Statement::from_slice(b"[]").is_err());
    }
}
