//! A suite's InRelease: its OpenPGP signature checked against the source's keyring, then its
//! fields and the SHA256 list of the index files it vouches for.
//!
//! The signature is checked as apt checks it through gpgv: at least one good signature by a
//! key of the keyring, none bad; a signature by a key outside the keyring is ignored (archives
//! sign with two keys, a base trusts both or one); a good signature by an expired or revoked
//! key, or one over a weak digest (MD5, SHA-1, RIPEMD-160), does not count. Only the signed
//! text is read; nothing outside the signed block can reach the parser.

use super::http::Client;
use super::sources::{Keys, Source};
use crate::error::{Error, Result};
use pgp::composed::{CleartextSignedMessage, Deserializable, SignedPublicKey};
use pgp::crypto::hash::HashAlgorithm;
use pgp::packet::{Signature, SignatureType};
use pgp::types::KeyDetails;
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// An InRelease bigger than this is no archive's (Debian's main suite is about 150 kB).
const INRELEASE_LIMIT: u64 = 64 << 20;

/// The public keys a source trusts, and the files they came from (for messages).
pub struct Keyring {
    keys: Vec<SignedPublicKey>,
    /// Where the keys were read from.
    pub files: Vec<String>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("keys", &self.fingerprints())
            .field("files", &self.files)
            .finish()
    }
}

impl Keyring {
    /// The keys of `keys`: each keyring file binary (`.gpg`) or armored (`.asc`), or an inline
    /// armored block. An empty list is an Environment error: there is nothing to trust.
    pub fn load(keys: &Keys) -> Result<Keyring> {
        let mut ring = Keyring {
            keys: Vec::new(),
            files: Vec::new(),
        };
        match keys {
            Keys::Files(files) => {
                for file in files {
                    let bytes = std::fs::read(file).map_err(|e| Error::reading(file, e))?;
                    ring.add(&bytes, &file.display().to_string())?;
                }
            }
            Keys::Inline(text) => ring.add(text.as_bytes(), "the inline Signed-By key")?,
        }
        Ok(ring)
    }

    /// Adds the keys in `bytes` (binary or armored), `at` naming them in errors.
    pub fn add(&mut self, bytes: &[u8], at: &str) -> Result<()> {
        let bad = |e: pgp::errors::Error| {
            Error::Usage(format!("{at}: not an OpenPGP public keyring: {e}"))
        };
        if bytes.len() >= 12 && &bytes[8..12] == b"KBXf" {
            return Err(Error::Usage(format!(
                "{at}: a GnuPG keybox, which apt does not read either; export it with \
                 `gpg --export` into a keyring file"
            )));
        }
        let armored = bytes
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .is_some_and(|i| bytes[i..].starts_with(b"-----BEGIN PGP"));
        let keys: Vec<_> = if armored {
            SignedPublicKey::from_armor_many(bytes)
                .map_err(bad)?
                .0
                .collect::<std::result::Result<_, _>>()
                .map_err(bad)?
        } else {
            SignedPublicKey::from_bytes_many(bytes)
                .map_err(bad)?
                .collect::<std::result::Result<_, _>>()
                .map_err(bad)?
        };
        if keys.is_empty() {
            return Err(Error::Usage(format!("{at}: holds no OpenPGP public key")));
        }
        self.keys.extend(keys);
        self.files.push(at.to_string());
        Ok(())
    }

    /// The primary keys' fingerprints, upper-case hex as gpg prints them.
    pub fn fingerprints(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|k| hex::encode_upper(k.fingerprint().as_bytes()))
            .collect()
    }

    fn described(&self) -> String {
        if self.files.is_empty() {
            "an empty keyring".to_string()
        } else {
            self.files.join(", ")
        }
    }
}

/// A key that may have made a signature: a primary key or a bound subkey, with when it
/// stops being valid (None: never) and whether it is revoked.
struct Signer<'a> {
    key: SignerKey<'a>,
    primary: String,
    expires: Option<u64>,
    revoked: bool,
}

enum SignerKey<'a> {
    Primary(&'a pgp::packet::PublicKey),
    Sub(&'a pgp::packet::PublicSubkey),
}

impl SignerKey<'_> {
    fn is_issuer(&self, sig: &Signature) -> bool {
        let (fingerprint, id) = match self {
            SignerKey::Primary(k) => (k.fingerprint(), k.legacy_key_id()),
            SignerKey::Sub(k) => (k.fingerprint(), k.legacy_key_id()),
        };
        sig.issuer_fingerprint().contains(&&fingerprint) || sig.issuer_key_id().contains(&&id)
    }

    fn verifies(&self, sig: &Signature, text: &[u8]) -> bool {
        match self {
            SignerKey::Primary(k) => sig.verify(*k, text).is_ok(),
            SignerKey::Sub(k) => sig.verify(*k, text).is_ok(),
        }
    }
}

fn signers(ring: &Keyring) -> Vec<Signer<'_>> {
    let mut out = Vec::new();
    for key in &ring.keys {
        let fingerprint = key.fingerprint();
        let key_id = key.legacy_key_id();
        let primary = hex::encode_upper(fingerprint.as_bytes());
        let created = u64::from(key.primary_key.created_at().as_secs());
        // The newest self-signature carries the primary key's current expiry.
        let expiry_of = |sigs: &mut dyn Iterator<Item = &Signature>, created: u64| {
            sigs.max_by_key(|s| s.created().map(|t| t.as_secs()).unwrap_or(0))
                .and_then(|s| s.key_expiration_time())
                .filter(|d| d.as_secs() > 0)
                .map(|d| created + u64::from(d.as_secs()))
        };
        let mut self_sigs = key
            .details
            .users
            .iter()
            .flat_map(|u| &u.signatures)
            .chain(&key.details.direct_signatures)
            .filter(|s| {
                // Certifications by other keys on a user id say nothing of this key's expiry.
                s.issuer_fingerprint().contains(&&fingerprint)
                    || s.issuer_key_id().contains(&&key_id)
            });
        out.push(Signer {
            key: SignerKey::Primary(&key.primary_key),
            primary: primary.clone(),
            expires: expiry_of(&mut self_sigs, created),
            revoked: !key.details.revocation_signatures.is_empty(),
        });
        for sub in &key.public_subkeys {
            // A subkey counts only with a binding signature the primary key really made.
            if sub.verify_bindings(&key.primary_key).is_err() {
                continue;
            }
            let created = u64::from(sub.key.created_at().as_secs());
            let mut bindings = sub
                .signatures
                .iter()
                .filter(|s| s.typ() == Some(SignatureType::SubkeyBinding));
            out.push(Signer {
                key: SignerKey::Sub(&sub.key),
                primary: primary.clone(),
                expires: expiry_of(&mut bindings, created),
                revoked: sub
                    .signatures
                    .iter()
                    .any(|s| s.typ() == Some(SignatureType::SubkeyRevocation)),
            });
        }
    }
    out
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The signed text of a clearsigned InRelease (`at` names it), when a key of `ring` signed
/// it; refused, naming `at` and the keyring, otherwise.
pub fn verify(inrelease: &[u8], ring: &Keyring, at: &str) -> Result<String> {
    let text = std::str::from_utf8(inrelease)
        .map_err(|_| Error::Usage(format!("{at}: not text, so not an InRelease file")))?;
    let (message, _) = CleartextSignedMessage::from_string(text).map_err(|e| {
        Error::Usage(format!(
            "{at}: refused: not a clearsigned InRelease (no valid OpenPGP signature block: {e})"
        ))
    })?;
    let signed = message.signed_text();
    let signers = signers(ring);
    let now = now_secs();
    let mut good = false;
    let mut unusable = Vec::new();
    let mut unknown = Vec::new();
    for sig in message.signatures() {
        let fingerprints = sig.issuer_fingerprint();
        let ids = sig.issuer_key_id();
        let issuer = fingerprints
            .first()
            .map(|f| hex::encode_upper(f.as_bytes()))
            .or_else(|| ids.first().map(|k| hex::encode_upper(k.as_ref())))
            .unwrap_or_else(|| "an unnamed key".into());
        let candidates: Vec<&Signer> = signers.iter().filter(|s| s.key.is_issuer(sig)).collect();
        if candidates.is_empty() {
            unknown.push(issuer);
            continue;
        }
        let verified = candidates
            .iter()
            .find(|s| s.key.verifies(sig, signed.as_bytes()));
        let Some(signer) = verified else {
            return Err(Error::Usage(format!(
                "{at}: refused: BAD signature by {issuer} (the signed text was altered, or the \
                 signature is damaged)"
            )));
        };
        let weak = matches!(
            sig.hash_alg(),
            Some(HashAlgorithm::Md5 | HashAlgorithm::Sha1 | HashAlgorithm::Ripemd160) | None
        );
        let kind_ok = matches!(sig.typ(), Some(SignatureType::Binary | SignatureType::Text));
        if weak || !kind_ok {
            unusable.push(format!("{issuer} (weak digest or wrong signature type)"));
        } else if signer.revoked {
            unusable.push(format!("{issuer} (key of {} revoked)", signer.primary));
        } else if signer.expires.is_some_and(|t| t <= now) {
            unusable.push(format!("{issuer} (key of {} expired)", signer.primary));
        } else {
            good = true;
        }
    }
    if good {
        return Ok(signed.replace("\r\n", "\n"));
    }
    let mut why = Vec::new();
    if !unusable.is_empty() {
        why.push(format!(
            "signatures that do not count: {}",
            unusable.join(", ")
        ));
    }
    if !unknown.is_empty() {
        why.push(format!(
            "signed only by keys not in the keyring: {}",
            unknown.join(", ")
        ));
    }
    if why.is_empty() {
        why.push("it carries no signature".into());
    }
    Err(Error::Usage(format!(
        "{at}: refused: no good signature by a key of {}; {}",
        ring.described(),
        why.join("; ")
    )))
}

/// One file a Release vouches for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexFile {
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA256, lower-case hex.
    pub sha256: String,
}

/// The fields of a suite's Release that choosing and checking index files needs.
#[derive(Clone, Debug)]
pub struct Release {
    /// The InRelease it was read from.
    pub url: String,
    /// The archive's base URI.
    pub base: String,
    /// The `dists/` directory the suite's files are under (`BASE/dists/SUITE`).
    pub dist: String,
    /// `Suite`.
    pub suite: Option<String>,
    /// `Codename`.
    pub codename: Option<String>,
    /// `Date`, as written.
    pub date: Option<String>,
    /// `Valid-Until`, as written.
    pub valid_until: Option<String>,
    /// `Architectures`.
    pub architectures: Vec<String>,
    /// `Components`.
    pub components: Vec<String>,
    /// `Acquire-By-Hash: yes`: files are also served under `by-hash/SHA256/HASH`, which a
    /// mirror updates without a window where a path holds the wrong file.
    pub acquire_by_hash: bool,
    /// `No-Support-for-Architecture-all: Packages`: `all` packages are in every
    /// architecture's Packages, and binary-all is not to be read as well.
    pub all_in_arch: bool,
    /// The `SHA256` list: path under `dist` to size and hash.
    pub sha256: BTreeMap<String, IndexFile>,
}

/// Seconds since the epoch of a Release date (RFC 2822; archives write `UTC` as the zone).
pub fn parse_date(text: &str) -> Option<u64> {
    let text = text.trim();
    let text = text
        .strip_suffix("UTC")
        .map(|t| format!("{t}+0000"))
        .unwrap_or_else(|| text.to_string());
    chrono::DateTime::parse_from_rfc2822(&text)
        .ok()
        .and_then(|d| u64::try_from(d.timestamp()).ok())
}

impl Release {
    /// The Release fields of `text` (the signed text of `url`, an InRelease of `base`).
    pub fn parse(text: &str, url: &str, base: &str, dist: &str) -> Result<Release> {
        let doc: deb822_fast::Deb822 = text
            .parse()
            .map_err(|e| Error::Usage(format!("{url}: not a Release file: {e}")))?;
        let Some(fields) = doc.iter().next() else {
            return Err(Error::Usage(format!("{url}: an empty Release file")));
        };
        let get = |k: &str| fields.get(k).map(|v| v.trim().to_string());
        let words = |k: &str| -> Vec<String> {
            fields
                .get(k)
                .map(|v| v.split_whitespace().map(String::from).collect())
                .unwrap_or_default()
        };
        let mut sha256 = BTreeMap::new();
        for line in fields.get("SHA256").unwrap_or("").lines() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts[..] {
                [] => {}
                [hash, size, path] => {
                    let size = size.parse().map_err(|_| {
                        Error::Usage(format!("{url}: SHA256 line `{line}` has a bad size"))
                    })?;
                    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err(Error::Usage(format!(
                            "{url}: SHA256 line `{line}` has a bad hash"
                        )));
                    }
                    sha256.insert(
                        path.to_string(),
                        IndexFile {
                            size,
                            sha256: hash.to_ascii_lowercase(),
                        },
                    );
                }
                _ => {
                    return Err(Error::Usage(format!(
                        "{url}: SHA256 line `{line}` is not HASH SIZE PATH"
                    )));
                }
            }
        }
        if sha256.is_empty() {
            // apt refuses a Release without a strong hash list too: MD5 alone proves nothing.
            return Err(Error::Usage(format!(
                "{url}: refused: the Release lists no SHA256 hashes"
            )));
        }
        Ok(Release {
            url: url.to_string(),
            base: base.to_string(),
            dist: dist.to_string(),
            suite: get("Suite"),
            codename: get("Codename"),
            date: get("Date"),
            valid_until: get("Valid-Until"),
            architectures: words("Architectures"),
            components: words("Components"),
            acquire_by_hash: get("Acquire-By-Hash").is_some_and(|v| v == "yes"),
            all_in_arch: words("No-Support-for-Architecture-all")
                .iter()
                .any(|w| w == "Packages"),
            sha256,
        })
    }

    /// Refuses a Release whose `Valid-Until` has passed at `now` (seconds since the epoch),
    /// as apt refuses it: an expired one may be a stale mirror replayed to hide updates.
    pub fn check_valid_until(&self, now: u64) -> Result<()> {
        let Some(until) = &self.valid_until else {
            return Ok(());
        };
        let Some(t) = parse_date(until) else {
            return Err(Error::Usage(format!(
                "{}: refused: Valid-Until `{until}` is not a date",
                self.url
            )));
        };
        if now > t {
            return Err(Error::Usage(format!(
                "{}: refused: the Release expired (Valid-Until: {until}); the archive or mirror \
                 is stale",
                self.url
            )));
        }
        Ok(())
    }

    /// The URL to download the index at `path` (as the SHA256 list names it) from.
    pub fn url_of(&self, path: &str) -> String {
        match (self.acquire_by_hash, self.sha256.get(path)) {
            (true, Some(file)) => {
                let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
                format!("{}/{dir}/by-hash/SHA256/{}", self.dist, file.sha256)
            }
            _ => format!("{}/{path}", self.dist),
        }
    }
}

/// The verified Release of `source`'s suite: its InRelease fetched, its signature checked
/// against the source's keys, its Valid-Until honoured.
pub fn fetch(client: &Client, source: &Source) -> Result<Release> {
    let dist = format!("{}/dists/{}", source.uri, source.suite);
    let url = format!("{dist}/InRelease");
    let ring = Keyring::load(&source.keys)?;
    if ring.keys.is_empty() {
        return Err(Error::Environment(format!(
            "{}: no keyring to check {url} against (the base has no /etc/apt/trusted.gpg.d \
             keys); name one with signed-by",
            source.at
        )));
    }
    let bytes = client.get(&url, INRELEASE_LIMIT)?;
    let text = verify(&bytes, &ring, &url)?;
    let release = Release::parse(&text, &url, &source.uri, &dist)?;
    release.check_valid_until(now_secs())?;
    Ok(release)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RELEASE: &str = "Origin: Debian\nSuite: stable\nCodename: bookworm\n\
        Date: Sat, 11 Jul 2026 10:16:37 UTC\nValid-Until: Sat, 18 Jul 2026 10:16:37 UTC\n\
        Acquire-By-Hash: yes\nNo-Support-for-Architecture-all: Packages\n\
        Architectures: all amd64 arm64\nComponents: main contrib\n\
        MD5Sum:\n 0ed6d4c8891eb86358b94bb35d9e4da4  1484322 contrib/Contents-all\n\
        SHA256:\n 515e692f2c4121c6fcec444ef100cc18f79a991910615f3a88c8b7becfc94d2f 50060337 main/binary-amd64/Packages\n \
        9E0B5AABB2465B3D2E7A7FE27F9913846277833F7A2826E7767ACCCFF5B588C5  8790396 main/binary-amd64/Packages.xz\n";

    #[test]
    fn release_fields_and_the_sha256_list() {
        let r = Release::parse(
            RELEASE,
            "u/InRelease",
            "http://a",
            "http://a/dists/bookworm",
        )
        .unwrap();
        assert_eq!(r.codename.as_deref(), Some("bookworm"));
        assert_eq!(r.components, ["main", "contrib"]);
        assert!(r.acquire_by_hash && r.all_in_arch);
        assert_eq!(r.sha256.len(), 2);
        let xz = &r.sha256["main/binary-amd64/Packages.xz"];
        assert_eq!(xz.size, 8790396);
        assert!(
            xz.sha256.starts_with("9e0b5aab"),
            "hashes are kept lower-case"
        );
        assert_eq!(
            r.url_of("main/binary-amd64/Packages.xz"),
            "http://a/dists/bookworm/main/binary-amd64/by-hash/SHA256/\
             9e0b5aabb2465b3d2e7a7fe27f9913846277833f7a2826e7767acccff5b588c5"
        );
        let until = parse_date("Sat, 18 Jul 2026 10:16:37 UTC").unwrap();
        assert!(r.check_valid_until(until).is_ok());
        let e = r.check_valid_until(until + 1).unwrap_err();
        assert!(
            e.to_string()
                .contains("u/InRelease: refused: the Release expired"),
            "{e}"
        );
    }

    #[test]
    fn a_release_without_sha256_is_refused() {
        let text = RELEASE.split("SHA256:").next().unwrap();
        let e = Release::parse(text, "x/InRelease", "b", "d").unwrap_err();
        assert!(
            e.to_string()
                .contains("x/InRelease: refused: the Release lists no SHA256")
        );
    }

    #[test]
    fn dates_in_archive_form() {
        assert_eq!(parse_date("Thu, 01 Jan 1970 00:01:40 UTC"), Some(100));
        assert_eq!(parse_date("Thu, 01 Jan 1970 01:00:00 +0100"), Some(0));
        assert_eq!(parse_date("yesterday"), None);
    }

    #[test]
    fn unsigned_text_and_non_keyrings_are_refused() {
        let ring = Keyring {
            keys: Vec::new(),
            files: vec!["k.gpg".into()],
        };
        let e = verify(RELEASE.as_bytes(), &ring, "http://a/InRelease").unwrap_err();
        assert!(
            e.to_string()
                .contains("http://a/InRelease: refused: not a clearsigned InRelease"),
            "{e}"
        );
        let mut ring = ring;
        let e = ring.add(b"not a key", "junk.gpg").unwrap_err();
        assert!(e.to_string().starts_with("junk.gpg: "), "{e}");
    }
}
