//! DSSE envelopes (secure-systems-lab/dsse v1): a payload and its type, signed through the
//! pre-authentication encoding so that a signature over one type can never pass for another.

use super::keys::{PrivateKey, PublicKey};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use serde::{Deserialize, Serialize};

/// The payload type of an in-toto statement.
pub const IN_TOTO: &str = "application/vnd.in-toto+json";

/// The bytes a DSSE signature covers: `DSSEv1 LEN(type) type LEN(body) body`, lengths in
/// ASCII decimal, one space between fields.
pub fn pae(payload_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// One signature of an envelope.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Signature {
    /// A hint of the key; never trusted. Left out when written: cosign checks a keyid
    /// against a fingerprint of its own and skips a signature whose keyid differs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub keyid: String,
    /// Base64 of the DER ECDSA signature over the PAE.
    pub sig: String,
}

/// A DSSE envelope as JSON carries it (and as a Sigstore bundle's `dsseEnvelope` does).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Envelope {
    /// Base64 of the payload.
    pub payload: String,
    /// What the payload is.
    pub payload_type: String,
    /// Its signatures.
    pub signatures: Vec<Signature>,
}

/// Base64 in any of the forms DSSE readers must accept: standard or URL-safe, padded or not.
pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    [&STANDARD, &URL_SAFE, &STANDARD_NO_PAD, &URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(text).ok())
        .ok_or_else(|| "not base64".to_string())
}

impl Envelope {
    /// `body` of `payload_type`, signed with `key`.
    pub fn sign(payload_type: &str, body: &[u8], key: &PrivateKey) -> Envelope {
        Envelope {
            payload: STANDARD.encode(body),
            payload_type: payload_type.to_string(),
            signatures: vec![Signature {
                keyid: String::new(),
                sig: STANDARD.encode(key.sign(&pae(payload_type, body))),
            }],
        }
    }

    /// The payload, once one signature verifies with `key` and the type is `payload_type`;
    /// else why not.
    pub fn verify(&self, payload_type: &str, key: &PublicKey) -> Result<Vec<u8>, String> {
        if self.payload_type != payload_type {
            return Err(format!(
                "its payload is {}, not {payload_type}",
                self.payload_type
            ));
        }
        let body = decode(&self.payload).map_err(|e| format!("its payload is {e}"))?;
        if self.signatures.is_empty() {
            return Err("it is not signed".into());
        }
        let message = pae(&self.payload_type, &body);
        let mut why = Vec::new();
        for s in &self.signatures {
            match decode(&s.sig).and_then(|sig| key.verify(&message, &sig)) {
                Ok(()) => return Ok(body),
                Err(e) => why.push(e),
            }
        }
        Err(format!(
            "no signature verifies with the key ({})",
            why.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_the_specs_encoding() {
        // The test vector of the DSSE protocol.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ".to_vec());
        // Lengths count bytes, not characters.
        assert_eq!(
            pae("t", "é".as_bytes()),
            "DSSEv1 1 t 2 é".as_bytes().to_vec()
        );
    }

    #[test]
    fn a_signed_envelope_verifies_and_any_change_does_not() {
        let key = PrivateKey::generate();
        let other = PrivateKey::generate();
        let env = Envelope::sign(IN_TOTO, b"{\"a\":1}", &key);
        assert_eq!(env.verify(IN_TOTO, &key.public()).unwrap(), b"{\"a\":1}");
        assert!(env.verify(IN_TOTO, &other.public()).is_err());
        assert!(
            env.verify("text/plain", &key.public())
                .unwrap_err()
                .contains("not text/plain")
        );
        let mut body = env.clone();
        body.payload = STANDARD.encode(b"{\"a\":2}");
        assert!(body.verify(IN_TOTO, &key.public()).is_err());
        // The same signature over the same body under another type does not verify: the PAE
        // binds the type.
        let mut retyped = env.clone();
        retyped.payload_type = "application/json".into();
        assert!(retyped.verify("application/json", &key.public()).is_err());
        let mut unsigned = env.clone();
        unsigned.signatures.clear();
        assert_eq!(
            unsigned.verify(IN_TOTO, &key.public()).unwrap_err(),
            "it is not signed"
        );
        // One good signature among bad ones is enough, as DSSE's threshold of one says.
        let mut two = env.clone();
        two.signatures.insert(
            0,
            Envelope::sign(IN_TOTO, b"x", &other).signatures[0].clone(),
        );
        assert!(two.verify(IN_TOTO, &key.public()).is_ok());
    }

    #[test]
    fn every_base64_form_readers_must_accept_is_read() {
        let bytes = [0xfbu8, 0xff, 0x01];
        for engine in [&STANDARD, &URL_SAFE, &STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
            assert_eq!(decode(&engine.encode(bytes)).unwrap(), bytes);
        }
        assert!(decode("not base64!").is_err());
    }
}
