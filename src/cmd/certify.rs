//! `gpubake certify`: static checks of an image, then the probe inside it.

use super::ImageArgs;
use crate::error::{Error, Result};
use std::path::PathBuf;

/// `gpubake certify`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    image: ImageArgs,
    /// GPUs for the probe: all, a number, or none (static checks only).
    #[arg(long, default_value = "all")]
    gpus: crate::engine::Gpus,
    /// Print the certificate as JSON.
    #[arg(long)]
    json: bool,
    /// Write the certificate (JSON) here.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Also write JUnit XML here.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Most layers allowed.
    #[arg(long, default_value_t = 127)]
    max_layers: usize,
    /// Largest compressed layer allowed, in GiB.
    #[arg(long, default_value_t = 20)]
    max_layer_gib: u64,
    /// Expected floors per GPU model for the probe (YAML like data/policy.yaml).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Run the probe under this OCI runtime (crun, runc or a path) instead of a Docker
    /// Engine, GPUs from the node's CDI spec.
    #[arg(long, value_name = "RUNTIME")]
    runtime: Option<String>,
    /// CDI devices for --runtime, e.g. nvidia.com/gpu=all (default: from --gpus).
    #[arg(long = "device", value_name = "CDI-NAME", requires = "runtime")]
    devices: Vec<String>,
    /// Where CDI specs are read for --runtime (default: /etc/cdi and /var/run/cdi).
    #[arg(long = "cdi-spec-dir", value_name = "DIR", requires = "runtime")]
    cdi_spec_dirs: Vec<PathBuf>,
    /// The probe's short run: fewer sizes, no NCCL start-ups.
    #[arg(long)]
    quick: bool,
    /// Seconds to wait for the probe (default: its worst case plus a minute).
    #[arg(long, value_name = "SECONDS")]
    probe_timeout: Option<u64>,
    /// Sign the certificate with --key and push it beside the image as a Sigstore bundle
    /// (an OCI 1.1 referrer; docker:// images only), whatever the verdict.
    #[arg(long, requires = "key")]
    attach: bool,
    /// The private key that signs the certificate (cosign's or skopeo's encrypted PEM, or a
    /// plain PKCS#8 or SEC1 one; `gpubake key generate` writes one).
    #[arg(long, value_name = "KEY", requires = "attach")]
    key: Option<PathBuf>,
    /// The key's passphrase: the file's first line (default: $GPUBAKE_KEY_PASSPHRASE, else
    /// empty).
    #[arg(long, value_name = "FILE", requires = "key")]
    passphrase_file: Option<PathBuf>,
}

/// Certifies the image, writes and attaches the certificate, and exits with its verdict.
pub fn run(args: Args) -> Result<i32> {
    // The platform is parsed with the transport, which reaches registries for it.
    let (image_ref, platform) = args.image.open()?;
    let image = &args.image.image;
    if args.attach && !matches!(image_ref, crate::image::Transport::Registry(_)) {
        return Err(Error::Usage(format!(
            "--attach pushes the certificate beside the image in its registry; {image} is not \
             a docker:// image"
        )));
    }
    let key = crate::sign::signing_key(args.key.as_deref(), args.passphrase_file.as_deref())?;
    // A shift would drop the high bits silently and turn a huge limit into a tiny one.
    let max_layer_gib = args.max_layer_gib;
    let max_layer_bytes = max_layer_gib.checked_mul(1 << 30).ok_or_else(|| {
        Error::Usage(format!(
            "--max-layer-gib {max_layer_gib}: too large to count in bytes"
        ))
    })?;
    let runner = match args.runtime {
        None => crate::certify::Runner::Engine,
        Some(program) => crate::certify::Runner::Runtime {
            program,
            devices: args.devices,
            spec_dirs: if args.cdi_spec_dirs.is_empty() {
                crate::cdi::DEFAULT_SPEC_DIRS
                    .iter()
                    .map(PathBuf::from)
                    .collect()
            } else {
                args.cdi_spec_dirs
            },
        },
    };
    let opts = crate::certify::CertifyOptions {
        gpus: args.gpus,
        runner,
        max_layers: args.max_layers,
        max_layer_bytes,
        policy: args.policy,
        quick: args.quick,
        probe_timeout: args.probe_timeout.map(std::time::Duration::from_secs),
        platform,
    };
    let certified = crate::certify::certify(&image_ref, &opts)?;
    let report = &certified.report;
    let certificate = serde_json::to_string_pretty(report).expect("reports serialize");
    if let Some(key) = &key {
        let artifact = crate::certify::attach(&image_ref, &certified, key)?;
        eprintln!("attached the signed certificate to {image} as {artifact}");
    }
    if let Some(path) = args.out {
        crate::fsutil::write_atomic(&path, certificate.as_bytes())?;
    }
    if let Some(path) = args.junit {
        crate::fsutil::write_atomic(&path, report.to_junit().as_bytes())?;
    }
    if args.json {
        println!("{certificate}");
    } else {
        print!("{}", report.to_text());
        println!("{image}: {}", crate::certify::summary(&certified));
    }
    Ok(certified.verdict.exit_code())
}
