//! `gpubake verify`: every blob of an image re-hashed, its labels, lock and nccl.conf agreed;
//! or, with --key, the signature or certificate of its manifest's digest.

use super::ImageArgs;
use crate::error::Result;

/// `gpubake verify`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    image: ImageArgs,
    /// Also require an attached certificate, signed with --key, with a passing verdict whose
    /// probe ran on GPUs (docker:// only). Unsigned certificates are never accepted.
    #[arg(long, requires = "key")]
    certified: bool,
    /// The public key (PEM): alone, the image's manifest must carry a signature made with it
    /// (`sha256-<hex>.sig`, as podman checks at pull); with --certified, the certificate must
    /// be signed with it.
    #[arg(long, value_name = "PUB.pem")]
    key: Option<std::path::PathBuf>,
    /// With --key: also download every blob as the registry serves it and make the checks
    /// verify makes without --key (digests, diff ids, labels, lock). Without it, --key and
    /// --certified read the manifest and the config (each checked against its digest) and
    /// what is attached to that digest, and no layer: the manifest's digest binds every
    /// layer's, and a pull verifies each.
    #[arg(long, requires = "key")]
    blobs: bool,
    /// With --certified, also accept a certificate of the static checks alone.
    #[arg(long, requires = "certified")]
    static_ok: bool,
    /// With --certified, require that the probe judged by this policy file (or `embedded`,
    /// the built-in one), compared by sha256.
    #[arg(long, value_name = "FILE", requires = "certified")]
    require_policy: Option<std::path::PathBuf>,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

/// Verifies the image and prints each check; exits 1 when one fails.
pub fn run(args: Args) -> Result<i32> {
    let (image, platform) = args.image.open()?;
    let key = args
        .key
        .as_deref()
        .map(crate::sign::keys::PublicKey::read)
        .transpose()?;
    let v = if let (Some(key), false) = (&key, args.certified) {
        crate::certify::verify_signed(&image, platform.as_ref(), key, args.blobs)?
    } else if let Some(key) = &key {
        let policy_sha256 = match &args.require_policy {
            None => None,
            Some(p) => {
                let file = (p.as_os_str() != "embedded").then_some(p.as_path());
                let policy = crate::certify::policy_identity(file)?;
                policy["sha256"].as_str().map(str::to_string)
            }
        };
        let wanted = crate::certify::Requirements {
            static_ok: args.static_ok,
            policy_sha256,
        };
        crate::certify::verify_certified(&image, platform.as_ref(), key, &wanted, args.blobs)?
    } else {
        crate::certify::verify_blobs(&image, platform.as_ref())?
    };
    if args.json {
        super::print_json(&v);
    } else {
        for c in &v.checks {
            let word = match c.status {
                crate::verdict::Status::Fail => "FAIL",
                crate::verdict::Status::Skip => "skip",
                _ => "ok  ",
            };
            println!("{word} {:<18} {}", c.name, c.detail);
        }
        println!(
            "{}: {}",
            v.image,
            if v.passed() { "verified" } else { "FAILED" }
        );
    }
    Ok(v.verdict().exit_code())
}
