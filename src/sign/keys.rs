//! ECDSA P-256 keys as cosign and skopeo write and read them.
//!
//! A public key is a `PUBLIC KEY` PEM (PKIX SubjectPublicKeyInfo), as both tools write it.
//! A private key is read in the encrypted form both tools sign with, under either of its PEM
//! labels, or in the plain PKCS#8 and SEC1 forms openssl writes. The encrypted form is PEM
//! around base64 of a JSON document:
//!
//! ```text
//! {"kdf":{"name":"scrypt","params":{"N":32768,"r":8,"p":1},"salt":"<b64, 32 bytes>"},
//!  "cipher":{"name":"nacl/secretbox","nonce":"<b64, 24 bytes>"},"ciphertext":"<b64>"}
//! ```
//!
//! The secretbox key is `scrypt(passphrase, salt, N, r, p, 32)`; the ciphertext is the
//! Poly1305 tag followed by the encrypted PKCS#8 DER of the key (Go's `secretbox.Seal`,
//! which `crypto_secretbox` matches byte for byte).

use crate::error::{Error, Location, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use p256::ecdsa::signature::{Signer, Verifier};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::elliptic_curve::zeroize::Zeroizing;
use p256::pkcs8::der::asn1::{BitStringRef, ObjectIdentifier, OctetStringRef};
use p256::pkcs8::der::{Decode, Reader, SliceReader, TagMode, TagNumber};
use p256::pkcs8::{
    AlgorithmIdentifierRef, DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey,
    LineEnding, PrivateKeyInfo, SubjectPublicKeyInfoRef,
};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The label skopeo and containers/image write, and cosign before 2.0.1. gpubake writes it
/// because every version of all three reads it; containers/image up to 5.24 reads no other.
pub const COSIGN_LABEL: &str = "ENCRYPTED COSIGN PRIVATE KEY";
/// The label cosign 2.0.1 and later writes.
pub const SIGSTORE_LABEL: &str = "ENCRYPTED SIGSTORE PRIVATE KEY";
/// The environment variable [`passphrase`] falls back on.
pub const PASSPHRASE_ENV: &str = "GPUBAKE_KEY_PASSPHRASE";

/// log2 of the scrypt N gpubake writes: 32768, the only N that go-tuf's `encrypted`
/// (cosign before 2.2, containers/image before 5.28) accepts, and one every later reader
/// still accepts. Newer tools write 65536.
const WRITTEN_LOG_N: u8 = 15;
/// log2 of the N values go-securesystemslib accepts (its "legacy", "standard" and "OWASP"
/// costs), which is what cosign 2.2+ and containers/image 5.28+ read.
const ACCEPTED_LOG_N: [u8; 3] = [15, 16, 17];
/// The r and p every writer uses, and the only ones go-securesystemslib accepts.
const SCRYPT_R: u32 = 8;
const SCRYPT_P: u32 = 1;
/// A key or passphrase file is a few hundred bytes; anything far larger is the wrong file.
const MAX_KEY_FILE: u64 = 64 * 1024;

const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");

/// An ECDSA P-256 signing key.
#[derive(Clone)]
pub struct PrivateKey(SigningKey);

/// An ECDSA P-256 verifying key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

impl std::fmt::Debug for PrivateKey {
    // Names the key by its public half, so that a debug print never shows the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PrivateKey(hint {})", self.public().hint())
    }
}

/// The JSON document inside an encrypted key, with the field names and order Go writes.
#[derive(Serialize, Deserialize)]
struct Encrypted {
    kdf: Kdf,
    cipher: Cipher,
    ciphertext: String,
}

#[derive(Serialize, Deserialize)]
struct Kdf {
    name: String,
    params: ScryptParams,
    salt: String,
}

#[derive(Serialize, Deserialize)]
struct ScryptParams {
    #[serde(rename = "N")]
    n: u64,
    r: u64,
    p: u64,
}

#[derive(Serialize, Deserialize)]
struct Cipher {
    name: String,
    nonce: String,
}

impl PrivateKey {
    /// A new random key, from the operating system's generator.
    pub fn generate() -> PrivateKey {
        PrivateKey(SigningKey::random(&mut rand_core::OsRng))
    }

    /// Reads `ENCRYPTED COSIGN PRIVATE KEY` and `ENCRYPTED SIGSTORE PRIVATE KEY` (scrypt N
    /// 32768, 65536 or 131072, r 8, p 1; NaCl secretbox; PKCS#8 inside), and the plain
    /// `PRIVATE KEY` (PKCS#8) and `EC PRIVATE KEY` (SEC1) forms, which ignore `passphrase`.
    /// Errors name the file and what is wrong (wrong passphrase, not P-256, unsupported
    /// scrypt parameters, not PEM...).
    pub fn read(path: &Path, passphrase: &[u8]) -> Result<PrivateKey> {
        let text = read_pem_file(path)?;
        PrivateKey::from_pem(&text, passphrase).map_err(|m| invalid(path, m))
    }

    /// The key of the first private-key block of `pem` (blocks of other labels, such as the
    /// `EC PARAMETERS` block `openssl ecparam -genkey` writes first, are skipped).
    pub fn from_pem(pem: &str, passphrase: &[u8]) -> Result<PrivateKey, String> {
        let blocks = pem_blocks(pem)?;
        let Some(block) = blocks.iter().find(|b| is_private_label(&b.label)) else {
            return Err(if blocks.iter().any(|b| b.label == "PUBLIC KEY") {
                "a public key, not a private key: sign with the private key (the .key file) \
                 and give the public key (.pub) to verifiers"
                    .into()
            } else {
                no_block("a private key", &blocks)
            });
        };
        if block.headers {
            return Err(format!(
                "an OpenSSL-encrypted {} (it has PEM headers), which gpubake does not read; \
                 decrypt it with `openssl pkey -in KEY -out PLAIN.pem` or re-encrypt it with \
                 `cosign import-key-pair --key KEY`",
                block.label
            ));
        }
        let body = block.body.as_slice();
        match block.label.as_str() {
            COSIGN_LABEL | SIGSTORE_LABEL => from_pkcs8(&decrypt(body, passphrase)?),
            "PRIVATE KEY" => from_pkcs8(body),
            "EC PRIVATE KEY" => from_sec1(body),
            "RSA PRIVATE KEY" => Err(not_p256("an RSA key")),
            "ENCRYPTED PRIVATE KEY" => Err(
                "a password-protected PKCS#8 key, which gpubake does not read; decrypt it with \
                 `openssl pkey -in KEY -out PLAIN.pem` or re-encrypt it with \
                 `cosign import-key-pair --key KEY`"
                    .into(),
            ),
            other => Err(format!(
                "an {other}, which gpubake does not read: it signs with ECDSA P-256 keys in \
                 cosign's or skopeo's encrypted PEM, or PKCS#8 or SEC1 PEM"
            )),
        }
    }

    /// `ENCRYPTED COSIGN PRIVATE KEY` with N=32768 (every cosign, skopeo and containers/image
    /// reads that).
    pub fn to_encrypted_pem(&self, passphrase: &[u8]) -> String {
        self.encrypted_pem(passphrase, COSIGN_LABEL, WRITTEN_LOG_N)
    }

    /// The encrypted form under `label`, with scrypt N = 2^`log_n`.
    fn encrypted_pem(&self, passphrase: &[u8], label: &str, log_n: u8) -> String {
        use crypto_secretbox::aead::{Aead, KeyInit};
        use rand_core::RngCore;
        let mut salt = [0u8; 32];
        let mut nonce = [0u8; 24];
        rand_core::OsRng.fill_bytes(&mut salt);
        rand_core::OsRng.fill_bytes(&mut nonce);
        let key = derive_key(passphrase, &salt, log_n).expect("the written scrypt cost is valid");
        let pkcs8 = self
            .0
            .to_pkcs8_der()
            .expect("a P-256 key encodes as PKCS#8");
        let ciphertext = crypto_secretbox::XSalsa20Poly1305::new((&*key).into())
            .encrypt((&nonce).into(), pkcs8.as_bytes())
            .expect("secretbox encrypts any length a key has");
        let doc = Encrypted {
            kdf: Kdf {
                name: "scrypt".into(),
                params: ScryptParams {
                    n: 1 << log_n,
                    r: SCRYPT_R.into(),
                    p: SCRYPT_P.into(),
                },
                salt: STANDARD.encode(salt),
            },
            cipher: Cipher {
                name: "nacl/secretbox".into(),
                nonce: STANDARD.encode(nonce),
            },
            ciphertext: STANDARD.encode(ciphertext),
        };
        let json = serde_json::to_vec(&doc).expect("the key document serializes");
        pem(label, &json)
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        PublicKey(*self.0.verifying_key())
    }

    /// ECDSA P-256 over SHA-256 of `message`, ASN.1 DER.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        let signature: Signature = self.0.sign(message);
        signature.to_der().as_bytes().to_vec()
    }
}

impl PublicKey {
    /// `PUBLIC KEY` (PKIX SubjectPublicKeyInfo) PEM; errors name the file.
    pub fn read(path: &Path) -> Result<PublicKey> {
        let text = read_pem_file(path)?;
        PublicKey::from_pem(&text).map_err(|m| invalid(path, m))
    }

    /// The key of the `PUBLIC KEY` block of `pem`.
    pub fn from_pem(pem: &str) -> Result<PublicKey, String> {
        let blocks = pem_blocks(pem)?;
        let Some(block) = blocks.iter().find(|b| b.label == "PUBLIC KEY") else {
            return Err(if blocks.iter().any(|b| is_private_label(&b.label)) {
                "a private key, not a public key: give verifiers the public key (the .pub \
                 file; `gpubake key public KEY` prints it)"
                    .into()
            } else if blocks.iter().any(|b| b.label == "RSA PUBLIC KEY") {
                not_p256("an RSA key")
            } else {
                no_block("a public key", &blocks)
            });
        };
        let spki = SubjectPublicKeyInfoRef::try_from(block.body.as_slice())
            .map_err(|e| format!("its PUBLIC KEY is not a SubjectPublicKeyInfo: {e}"))?;
        if !is_p256(&spki.algorithm) {
            return Err(not_p256(&algorithm_name(&spki.algorithm)));
        }
        VerifyingKey::from_public_key_der(&block.body)
            .map(PublicKey)
            .map_err(|e| format!("its P-256 public key is not a point of the curve: {e}"))
    }

    /// `PUBLIC KEY` PEM, as cosign and skopeo write it.
    pub fn to_pem(&self) -> String {
        self.0
            .to_public_key_pem(LineEnding::LF)
            .expect("a P-256 key encodes as SubjectPublicKeyInfo")
    }

    /// The PKIX SubjectPublicKeyInfo DER.
    pub fn spki_der(&self) -> Vec<u8> {
        self.0
            .to_public_key_der()
            .expect("a P-256 key encodes as SubjectPublicKeyInfo")
            .into_vec()
    }

    /// Checks a DER ECDSA-SHA256 signature of `message`.
    pub fn verify(&self, message: &[u8], der_signature: &[u8]) -> Result<(), String> {
        let signature = Signature::from_der(der_signature)
            .map_err(|_| "the signature is not an ASN.1 DER ECDSA signature".to_string())?;
        self.0
            .verify(message, &signature)
            .map_err(|_| "the signature does not verify with the key".to_string())
    }

    /// Standard base64 of sha256 of the SPKI DER: cosign's publicKey.hint in a Sigstore bundle.
    pub fn hint(&self) -> String {
        use sha2::Digest as _;
        STANDARD.encode(sha2::Sha256::digest(self.spki_der()))
    }
}

/// The passphrase: the first line of `file` without its newline (as skopeo's
/// --sign-passphrase-file reads it, so one file serves both), else the env var
/// `GPUBAKE_KEY_PASSPHRASE` (a CI secret reaches a job as a variable, as cosign takes
/// `COSIGN_PASSWORD`), else empty: gpubake never prompts, since it runs unattended, and an
/// empty passphrase is one cosign and skopeo accept (plain keys ignore it).
pub fn passphrase(file: Option<&Path>) -> Result<Vec<u8>> {
    if let Some(path) = file {
        let bytes =
            crate::fsutil::read_capped(path, MAX_KEY_FILE).map_err(|e| Error::reading(path, e))?;
        // Only `\n` ends the line, as Go's ReadString('\n') and TrimSuffix leave a `\r`.
        let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
        return Ok(line.to_vec());
    }
    match std::env::var_os(PASSPHRASE_ENV) {
        Some(value) => Ok(value.into_encoded_bytes()),
        None => Ok(Vec::new()),
    }
}

/// The secretbox key for `passphrase` and `salt` at N = 2^`log_n`, r 8, p 1.
fn derive_key(passphrase: &[u8], salt: &[u8], log_n: u8) -> Result<Zeroizing<[u8; 32]>, String> {
    let params = scrypt::Params::new(log_n, SCRYPT_R, SCRYPT_P, 32)
        .map_err(|e| format!("scrypt parameters: {e}"))?;
    let mut key = Zeroizing::new([0u8; 32]);
    scrypt::scrypt(passphrase, salt, &params, &mut *key).map_err(|e| format!("scrypt: {e}"))?;
    Ok(key)
}

/// The PKCS#8 DER inside an encrypted key's PEM body.
fn decrypt(body: &[u8], passphrase: &[u8]) -> Result<Zeroizing<Vec<u8>>, String> {
    use crypto_secretbox::aead::{Aead, KeyInit};
    let doc: Encrypted = serde_json::from_slice(body)
        .map_err(|e| format!("its encrypted key is not the JSON cosign and skopeo write: {e}"))?;
    if doc.kdf.name != "scrypt" {
        return Err(format!(
            "its key derivation is {:?}; cosign and skopeo use scrypt",
            doc.kdf.name
        ));
    }
    let ScryptParams { n, r, p } = doc.kdf.params;
    let log_n = ACCEPTED_LOG_N
        .into_iter()
        .find(|&l| n == 1 << l)
        .filter(|_| (r, p) == (SCRYPT_R.into(), SCRYPT_P.into()))
        .ok_or_else(|| {
            format!(
                "unsupported scrypt parameters N={n}, r={r}, p={p}: gpubake reads N 32768, \
                 65536 or 131072 with r 8 and p 1, as cosign and skopeo do"
            )
        })?;
    if doc.cipher.name != "nacl/secretbox" {
        return Err(format!(
            "its cipher is {:?}; cosign and skopeo use nacl/secretbox",
            doc.cipher.name
        ));
    }
    let field = |name: &str, b64: &str| {
        STANDARD
            .decode(b64)
            .map_err(|e| format!("its encrypted key's {name} is not base64: {e}"))
    };
    let salt = field("salt", &doc.kdf.salt)?;
    let nonce: [u8; 24] = field("nonce", &doc.cipher.nonce)?
        .try_into()
        .map_err(|n: Vec<u8>| format!("its nonce is {} bytes, not 24", n.len()))?;
    let ciphertext = field("ciphertext", &doc.ciphertext)?;
    let key = derive_key(passphrase, &salt, log_n)?;
    crypto_secretbox::XSalsa20Poly1305::new((&*key).into())
        .decrypt((&nonce).into(), ciphertext.as_slice())
        .map(Zeroizing::new)
        .map_err(|_| {
            let given = if passphrase.is_empty() {
                "the empty passphrase"
            } else {
                "the passphrase given"
            };
            format!(
                "wrong passphrase: the key does not decrypt with {given} (gpubake reads it \
                 from --passphrase-file, else ${PASSPHRASE_ENV}, else takes it empty)"
            )
        })
}

/// A key from PKCS#8 PrivateKeyInfo DER, refused naming its algorithm unless P-256.
fn from_pkcs8(der: &[u8]) -> Result<PrivateKey, String> {
    let info = PrivateKeyInfo::try_from(der)
        .map_err(|e| format!("its key is not PKCS#8 PrivateKeyInfo: {e}"))?;
    if !is_p256(&info.algorithm) {
        return Err(not_p256(&algorithm_name(&info.algorithm)));
    }
    SigningKey::from_pkcs8_der(der)
        .map(PrivateKey)
        .map_err(|e| format!("its P-256 key is damaged: {e}"))
}

/// A key from SEC1 ECPrivateKey DER, refused naming its curve unless P-256.
fn from_sec1(der: &[u8]) -> Result<PrivateKey, String> {
    match p256::SecretKey::from_sec1_der(der) {
        Ok(secret) => Ok(PrivateKey(SigningKey::from(secret))),
        Err(_) => Err(match sec1_curve(der) {
            Some(curve) if curve != P256 => {
                not_p256(&format!("an EC key on {}", curve_name(curve)))
            }
            _ => "its EC PRIVATE KEY is not a P-256 SEC1 ECPrivateKey".into(),
        }),
    }
}

/// The named curve of a SEC1 ECPrivateKey, when it names one.
fn sec1_curve(der: &[u8]) -> Option<ObjectIdentifier> {
    let mut reader = SliceReader::new(der).ok()?;
    reader
        .sequence(|r| {
            let _version = u8::decode(r)?;
            let _secret = OctetStringRef::decode(r)?;
            let curve = r.context_specific::<ObjectIdentifier>(TagNumber::N0, TagMode::Explicit)?;
            let _public =
                r.context_specific::<BitStringRef<'_>>(TagNumber::N1, TagMode::Explicit)?;
            Ok(curve)
        })
        .ok()
        .flatten()
}

fn is_p256(alg: &AlgorithmIdentifierRef<'_>) -> bool {
    alg.oid == EC_PUBLIC_KEY && alg.parameters_oid().ok() == Some(P256)
}

/// What a key's algorithm identifier names, for an error.
fn algorithm_name(alg: &AlgorithmIdentifierRef<'_>) -> String {
    match alg.oid.to_string().as_str() {
        "1.2.840.10045.2.1" => match alg.parameters_oid() {
            Ok(curve) => format!("an EC key on {}", curve_name(curve)),
            Err(_) => "an EC key with explicit curve parameters".into(),
        },
        "1.2.840.113549.1.1.1" | "1.2.840.113549.1.1.10" => "an RSA key".into(),
        "1.3.101.112" => "an Ed25519 key".into(),
        "1.3.101.113" => "an Ed448 key".into(),
        "1.2.840.10040.4.1" => "a DSA key".into(),
        other => format!("a key of algorithm {other}"),
    }
}

fn curve_name(curve: ObjectIdentifier) -> String {
    match curve.to_string().as_str() {
        "1.2.840.10045.3.1.7" => "P-256".into(),
        "1.3.132.0.34" => "P-384".into(),
        "1.3.132.0.35" => "P-521".into(),
        "1.3.132.0.10" => "secp256k1".into(),
        other => format!("curve {other}"),
    }
}

fn not_p256(what: &str) -> String {
    format!(
        "{what}, not ECDSA P-256: gpubake signs and verifies with P-256 keys only, the kind cosign and skopeo generate"
    )
}

/// The error for a file without the block wanted, naming the blocks it has.
fn no_block(wanted: &str, blocks: &[Block]) -> String {
    if blocks.is_empty() {
        return format!("not PEM: no -----BEGIN line, where {wanted} was expected");
    }
    let labels: Vec<&str> = blocks.iter().map(|b| b.label.as_str()).collect();
    format!("no {wanted} here; its PEM blocks are {}", labels.join(", "))
}

fn is_private_label(label: &str) -> bool {
    label.ends_with("PRIVATE KEY")
}

/// One PEM block: its label, its decoded body, and whether it had RFC 1421 headers
/// (`Proc-Type: 4,ENCRYPTED`, as OpenSSL's legacy encryption writes).
struct Block {
    label: String,
    body: Vec<u8>,
    headers: bool,
}

/// Every PEM block of `text`, text between blocks ignored as Go's `pem.Decode` ignores it.
/// Written here rather than taken from pem-rfc7468, which reads a single block and refuses
/// the text and headers around it that openssl's output can have.
fn pem_blocks(text: &str) -> Result<Vec<Block>, String> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        let Some(label) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        else {
            continue;
        };
        let end = format!("-----END {label}-----");
        let mut b64 = String::new();
        let mut headers = false;
        let mut closed = false;
        for line in lines.by_ref() {
            if line == end {
                closed = true;
                break;
            }
            headers |= line.contains(':');
            if !line.contains(':') {
                b64.push_str(line);
            }
        }
        if !closed {
            return Err(format!("its {label} block has no {end} line"));
        }
        let body = STANDARD
            .decode(&b64)
            .map_err(|e| format!("its {label} block is not base64: {e}"))?;
        blocks.push(Block {
            label: label.to_string(),
            body,
            headers,
        });
    }
    Ok(blocks)
}

/// `body` as a PEM block under `label`, in 64-character lines as Go's `pem.Encode` writes.
fn pem(label: &str, body: &[u8]) -> String {
    let b64 = STANDARD.encode(body);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// A key file's text, refused unread when far too large for a key.
fn read_pem_file(path: &Path) -> Result<String> {
    let bytes =
        crate::fsutil::read_capped(path, MAX_KEY_FILE).map_err(|e| Error::reading(path, e))?;
    String::from_utf8(bytes).map_err(|_| {
        invalid(
            path,
            "not PEM: it is not text (a DER key? convert it with `openssl pkey -inform DER`)"
                .into(),
        )
    })
}

fn invalid(path: &Path, message: String) -> Error {
    Error::invalid(
        Location {
            file: path.display().to_string(),
            line: None,
            column: None,
        },
        None,
        message,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_and_a_flipped_byte_does_not() {
        let key = PrivateKey::generate();
        let public = key.public();
        let message = b"the manifest digest";
        let sig = key.sign(message);
        public.verify(message, &sig).unwrap();
        // DER of a SEQUENCE of two INTEGERs of up to 33 bytes each.
        assert_eq!(sig[0], 0x30);
        assert!((8..=72).contains(&sig.len()), "{}", sig.len());
        let mut other = message.to_vec();
        other[0] ^= 1;
        assert!(
            public
                .verify(&other, &sig)
                .unwrap_err()
                .contains("does not verify")
        );
        for i in [sig.len() / 2, sig.len() - 1] {
            let mut bad = sig.clone();
            bad[i] ^= 1;
            assert!(public.verify(message, &bad).is_err(), "byte {i}");
        }
        let mut framing = sig.clone();
        framing[0] ^= 1;
        assert!(
            public
                .verify(message, &framing)
                .unwrap_err()
                .contains("not an ASN.1 DER")
        );
        assert!(
            PrivateKey::generate()
                .public()
                .verify(message, &sig)
                .is_err()
        );
    }

    #[test]
    fn an_encrypted_key_round_trips_under_either_label_and_each_accepted_cost() {
        let key = PrivateKey::generate();
        for (label, log_n) in [(COSIGN_LABEL, 15), (SIGSTORE_LABEL, 16), (COSIGN_LABEL, 17)] {
            let pem = key.encrypted_pem(b"pw", label, log_n);
            assert!(
                pem.starts_with(&format!("-----BEGIN {label}-----\n")),
                "{pem}"
            );
            assert!(pem.lines().all(|l| l.len() <= 64));
            let read = PrivateKey::from_pem(&pem, b"pw").unwrap();
            assert_eq!(read.public(), key.public(), "{label} N=2^{log_n}");
        }
        let written = key.to_encrypted_pem(b"");
        assert!(written.starts_with("-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----\n"));
        let doc = decoded_doc(&written);
        assert_eq!(
            doc["kdf"]["params"],
            serde_json::json!({"N": 32768, "r": 8, "p": 1})
        );
        assert_eq!(doc["kdf"]["name"], "scrypt");
        assert_eq!(doc["cipher"]["name"], "nacl/secretbox");
        assert_eq!(
            STANDARD
                .decode(doc["kdf"]["salt"].as_str().unwrap())
                .unwrap()
                .len(),
            32
        );
        assert_eq!(
            STANDARD
                .decode(doc["cipher"]["nonce"].as_str().unwrap())
                .unwrap()
                .len(),
            24
        );
        assert_eq!(
            PrivateKey::from_pem(&written, b"").unwrap().public(),
            key.public()
        );
    }

    /// The JSON document inside an encrypted PEM.
    fn decoded_doc(pem: &str) -> serde_json::Value {
        serde_json::from_slice(&pem_blocks(pem).unwrap()[0].body).unwrap()
    }

    /// `pem` with its JSON document changed by `edit`, re-wrapped under the same label.
    fn edited(pem: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
        let mut doc = decoded_doc(pem);
        edit(&mut doc);
        super::pem(COSIGN_LABEL, &serde_json::to_vec(&doc).unwrap())
    }

    #[test]
    fn a_wrong_passphrase_is_said_plainly() {
        let pem = PrivateKey::generate().to_encrypted_pem(b"right");
        let err = PrivateKey::from_pem(&pem, b"wrong").unwrap_err();
        assert!(err.starts_with("wrong passphrase"), "{err}");
        assert!(err.contains("GPUBAKE_KEY_PASSPHRASE"), "{err}");
        let err = PrivateKey::from_pem(&pem, b"").unwrap_err();
        assert!(err.contains("the empty passphrase"), "{err}");
        // A damaged ciphertext reads the same way: secretbox cannot tell the two apart.
        let damaged = edited(&pem, |d| {
            let mut ct = STANDARD.decode(d["ciphertext"].as_str().unwrap()).unwrap();
            ct[20] ^= 1;
            d["ciphertext"] = STANDARD.encode(ct).into();
        });
        assert!(
            PrivateKey::from_pem(&damaged, b"right")
                .unwrap_err()
                .starts_with("wrong passphrase")
        );
    }

    #[test]
    fn scrypt_costs_other_than_the_tools_are_refused_before_deriving() {
        let key = PrivateKey::generate();
        // 2^14 is a cost no tool writes: refused although the passphrase is right.
        let cheap = key.encrypted_pem(b"pw", COSIGN_LABEL, 14);
        let err = PrivateKey::from_pem(&cheap, b"pw").unwrap_err();
        assert!(
            err.contains("unsupported scrypt parameters N=16384, r=8, p=1"),
            "{err}"
        );
        let pem = key.to_encrypted_pem(b"pw");
        for (field, value, shown) in [
            ("N", 50000, "N=50000, r=8, p=1"),
            ("N", 1 << 20, "N=1048576, r=8, p=1"),
            ("r", 16, "N=32768, r=16, p=1"),
            ("p", 2, "N=32768, r=8, p=2"),
        ] {
            let changed = edited(&pem, |d| d["kdf"]["params"][field] = value.into());
            let err = PrivateKey::from_pem(&changed, b"pw").unwrap_err();
            assert!(
                err.contains(&format!("unsupported scrypt parameters {shown}")),
                "{err}"
            );
        }
        let argon = edited(&pem, |d| d["kdf"]["name"] = "argon2".into());
        assert!(
            PrivateKey::from_pem(&argon, b"pw")
                .unwrap_err()
                .contains("\"argon2\"")
        );
        let aes = edited(&pem, |d| d["cipher"]["name"] = "aes-gcm".into());
        assert!(
            PrivateKey::from_pem(&aes, b"pw")
                .unwrap_err()
                .contains("\"aes-gcm\"")
        );
        let short = edited(&pem, |d| {
            d["cipher"]["nonce"] = STANDARD.encode([0u8; 12]).into()
        });
        assert!(
            PrivateKey::from_pem(&short, b"pw")
                .unwrap_err()
                .contains("12 bytes, not 24")
        );
        let junk = super::pem(SIGSTORE_LABEL, b"not json");
        assert!(
            PrivateKey::from_pem(&junk, b"pw")
                .unwrap_err()
                .contains("not the JSON")
        );
    }

    #[test]
    fn plain_pkcs8_and_sec1_keys_are_read_and_ignore_the_passphrase() {
        let key = PrivateKey::generate();
        let pkcs8 = key.0.to_pkcs8_pem(LineEnding::LF).unwrap();
        assert!(pkcs8.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert_eq!(
            PrivateKey::from_pem(&pkcs8, b"anything").unwrap().public(),
            key.public()
        );
        let sec1 = p256::SecretKey::from_bytes(&key.0.to_bytes())
            .unwrap()
            .to_sec1_pem(LineEnding::LF)
            .unwrap();
        assert!(sec1.starts_with("-----BEGIN EC PRIVATE KEY-----"));
        // As `openssl ecparam -genkey` writes it: the curve's block first, text around.
        let with_params = format!(
            "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n{}trailing words\n",
            *sec1
        );
        assert_eq!(
            PrivateKey::from_pem(&with_params, b"").unwrap().public(),
            key.public()
        );
    }

    #[test]
    fn files_that_are_not_p256_private_keys_say_what_they_are() {
        let key = PrivateKey::generate();
        let err = PrivateKey::from_pem(&key.public().to_pem(), b"").unwrap_err();
        assert!(err.starts_with("a public key, not a private key"), "{err}");
        let err = PrivateKey::from_pem("just text\n", b"").unwrap_err();
        assert!(err.starts_with("not PEM"), "{err}");
        let err = PrivateKey::from_pem(
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            b"",
        )
        .unwrap_err();
        assert!(err.contains("its PEM blocks are CERTIFICATE"), "{err}");
        let err = PrivateKey::from_pem("-----BEGIN PRIVATE KEY-----\nAAAA\n", b"").unwrap_err();
        assert!(err.contains("no -----END PRIVATE KEY----- line"), "{err}");
        let err = PrivateKey::from_pem(
            "-----BEGIN PRIVATE KEY-----\n!!\n-----END PRIVATE KEY-----\n",
            b"",
        )
        .unwrap_err();
        assert!(err.contains("not base64"), "{err}");
        let legacy = "-----BEGIN EC PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nAAAA\n-----END EC PRIVATE KEY-----\n";
        assert!(
            PrivateKey::from_pem(legacy, b"")
                .unwrap_err()
                .contains("OpenSSL-encrypted")
        );
        let rsa = "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n";
        assert!(
            PrivateKey::from_pem(rsa, b"")
                .unwrap_err()
                .contains("an RSA key, not ECDSA P-256")
        );
        // PKCS#8 of Ed25519 (RFC 8410's example key).
        let ed = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n-----END PRIVATE KEY-----\n";
        assert!(
            PrivateKey::from_pem(ed, b"")
                .unwrap_err()
                .starts_with("an Ed25519 key, not ECDSA P-256")
        );
    }

    #[test]
    fn a_public_key_round_trips_through_pem_and_refuses_what_is_not_one() {
        let key = PrivateKey::generate().public();
        let pem = key.to_pem();
        assert!(
            pem.starts_with("-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE"),
            "{pem}"
        );
        assert_eq!(PublicKey::from_pem(&pem).unwrap(), key);
        assert_eq!(key.spki_der().len(), 91);
        let private = PrivateKey::generate().to_encrypted_pem(b"");
        assert!(
            PublicKey::from_pem(&private)
                .unwrap_err()
                .starts_with("a private key, not a public key")
        );
        assert!(PublicKey::from_pem("").unwrap_err().starts_with("not PEM"));
        // RFC 8410's Ed25519 public key.
        let ed = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n";
        assert!(
            PublicKey::from_pem(ed)
                .unwrap_err()
                .starts_with("an Ed25519 key, not ECDSA P-256")
        );
    }

    #[test]
    fn the_hint_is_base64_of_the_sha256_of_the_spki() {
        use sha2::Digest as _;
        let key = PrivateKey::generate().public();
        let hint = key.hint();
        assert_eq!(
            STANDARD.decode(&hint).unwrap(),
            sha2::Sha256::digest(key.spki_der()).to_vec()
        );
        assert_eq!(hint.len(), 44);
    }

    #[test]
    fn the_passphrase_is_the_files_first_line_without_its_newline() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pass");
        for (content, want) in [
            (&b"secret\n"[..], &b"secret"[..]),
            (b"secret", b"secret"),
            (b"secret\r\n", b"secret\r"),
            (b"first\nsecond\n", b"first"),
            (b"\n", b""),
            (b"", b""),
        ] {
            std::fs::write(&file, content).unwrap();
            assert_eq!(passphrase(Some(&file)).unwrap(), want, "{content:?}");
        }
        let missing = dir.path().join("missing");
        assert!(
            passphrase(Some(&missing))
                .unwrap_err()
                .to_string()
                .contains("missing")
        );
    }
}
