//! `gpubake key`: the ECDSA P-256 key pair `build --key` and `certify --key` sign with, in
//! the files cosign and skopeo read.

use crate::error::{Error, Result};
use crate::sign::keys::{self, PrivateKey, PublicKey};
use clap::Subcommand;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// `gpubake key`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
    /// Print as JSON.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// Write a new key pair: PREFIX.key, the private key encrypted as cosign and skopeo
    /// read it (mode 0600), and PREFIX.pub, the public key verifiers are given (0644).
    /// Existing files are never overwritten.
    Generate {
        /// Where to write: PREFIX.key and PREFIX.pub (`cosign` gives the names `cosign
        /// generate-key-pair` writes).
        #[arg(long, value_name = "PREFIX")]
        output_prefix: PathBuf,
        /// Encrypt with the first line of this file (default: $GPUBAKE_KEY_PASSPHRASE,
        /// else an empty passphrase).
        #[arg(long, value_name = "FILE")]
        passphrase_file: Option<PathBuf>,
    },
    /// Print the public key (PEM) of a private key in any form --key reads, or of a public
    /// key, with its hint (what a Sigstore bundle names it by).
    Public {
        /// The key file.
        key: PathBuf,
        /// A private key's passphrase: the first line of this file (default:
        /// $GPUBAKE_KEY_PASSPHRASE, else empty).
        #[arg(long, value_name = "FILE")]
        passphrase_file: Option<PathBuf>,
    },
}

/// Runs the action.
pub fn run(args: Args) -> Result<i32> {
    match args.action {
        Action::Generate {
            output_prefix,
            passphrase_file,
        } => generate(&output_prefix, passphrase_file.as_deref(), args.json),
        Action::Public {
            key,
            passphrase_file,
        } => public(&key, passphrase_file.as_deref(), args.json),
    }
}

/// `PREFIX` with `suffix` appended: a prefix may hold dots (`keys/v1.2`), which
/// `Path::with_extension` would take for an extension to replace.
fn suffixed(prefix: &Path, suffix: &str) -> PathBuf {
    let mut name = prefix.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

fn generate(prefix: &Path, passphrase_file: Option<&Path>, json: bool) -> Result<i32> {
    if prefix.as_os_str().is_empty() || prefix.to_string_lossy().ends_with('/') {
        return Err(Error::Usage(format!(
            "--output-prefix {:?}: names no file; give a path such as `cosign` or `keys/release`",
            prefix.display().to_string()
        )));
    }
    let private_path = suffixed(prefix, ".key");
    let public_path = suffixed(prefix, ".pub");
    // Both are checked before either is written, so a refusal leaves nothing half made. A
    // dangling link counts as existing: writing through it would put the key wherever it
    // points.
    for path in [&private_path, &public_path] {
        if std::fs::symlink_metadata(path).is_ok() {
            return Err(exists(path));
        }
    }
    let passphrase = keys::passphrase(passphrase_file)?;
    let key = PrivateKey::generate();
    let public = key.public();
    write_new(
        &private_path,
        key.to_encrypted_pem(&passphrase).as_bytes(),
        0o600,
    )?;
    // Until the public key is written too, a failure or an interrupt removes the private
    // key: a key without its .pub is one nobody could verify.
    let staged = crate::interrupt::Staged::new(&private_path);
    write_new(&public_path, public.to_pem().as_bytes(), 0o644)?;
    staged.keep();
    if passphrase.is_empty() {
        eprintln!(
            "note: {} is encrypted with an empty passphrase (no --passphrase-file, no \
             ${}): anyone who can read the file can sign with it",
            private_path.display(),
            keys::PASSPHRASE_ENV
        );
    }
    if json {
        super::print_json(&serde_json::json!({
            "private_key": private_path,
            "public_key": public_path,
            "hint": public.hint(),
        }));
    } else {
        println!(
            "wrote {} (the private key, encrypted) and {} (the public key)",
            private_path.display(),
            public_path.display()
        );
        println!("  hint {}", public.hint());
    }
    Ok(0)
}

fn exists(path: &Path) -> Error {
    Error::Usage(format!(
        "{}: exists; gpubake key generate never overwrites a key (remove it, or choose \
         another --output-prefix)",
        path.display()
    ))
}

/// Writes a file that must not exist yet, atomically, with `mode` from the start: the
/// temporary file beside it is created 0600 (so a private key is never readable by others,
/// even for a moment), widened to `mode` once written, and linked into place only if no
/// file has taken the name meanwhile. `fsutil::write_atomic` replaces files and gives new
/// ones the umask's mode, neither of which a key may have.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(Error::writing(
            dir,
            std::io::Error::from_raw_os_error(libc::ENOENT),
        ));
    }
    // tempfile makes its files 0600: the key is never readable by others on the way.
    let (mut tmp, _scratch) =
        crate::interrupt::temp_file(dir).map_err(|e| Error::writing(dir, e))?;
    tmp.write_all(bytes)
        .map_err(|e| Error::writing(tmp.path(), e))?;
    let file = tmp.as_file();
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::writing(tmp.path(), e))?;
    tmp.persist_noclobber(path).map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            exists(path)
        } else {
            Error::writing(path, e.error)
        }
    })?;
    Ok(())
}

/// Prints the public key of `path`: read as a public key if it is one, else as a private key.
fn public(path: &Path, passphrase_file: Option<&Path>, json: bool) -> Result<i32> {
    let text = crate::fsutil::read_capped(path, 64 * 1024).map_err(|e| Error::reading(path, e))?;
    let key = if String::from_utf8_lossy(&text).contains("-----BEGIN PUBLIC KEY-----") {
        PublicKey::read(path)?
    } else {
        PrivateKey::read(path, &keys::passphrase(passphrase_file)?)?.public()
    };
    if json {
        super::print_json(&serde_json::json!({
            "public_key": key.to_pem(),
            "hint": key.hint(),
        }));
    } else {
        print!("{}", key.to_pem());
        eprintln!("hint {}", key.hint());
    }
    Ok(0)
}
