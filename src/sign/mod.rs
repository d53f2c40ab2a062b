//! Signatures gpubake makes and checks: ECDSA P-256 keys in the forms cosign and skopeo use,
//! DSSE envelopes of in-toto statements (the build's provenance, certify's certificate) in
//! Sigstore bundles, verified offline against a public key.

pub mod bundle;
pub mod dsse;
pub mod keys;
pub mod statement;

/// The private key a command signs with (`--key`), its passphrase from `passphrase_file`
/// (see [`keys::passphrase`]); None without `--key`. Read before any work, so that a wrong
/// passphrase fails in a second rather than after a build.
pub fn signing_key(
    key: Option<&std::path::Path>,
    passphrase_file: Option<&std::path::Path>,
) -> crate::Result<Option<keys::PrivateKey>> {
    key.map(|path| keys::PrivateKey::read(path, &keys::passphrase(passphrase_file)?))
        .transpose()
}
