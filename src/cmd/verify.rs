//! `gpubake verify`: every blob of an image re-hashed, its labels, lock and nccl.conf agreed.

use super::ImageArgs;
use crate::error::Result;

/// `gpubake verify`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    image: ImageArgs,
    /// Also require an attached certificate with a passing verdict whose probe ran on GPUs
    /// (docker:// only).
    #[arg(long)]
    certified: bool,
    /// With --certified, also accept a certificate of the static checks alone.
    #[arg(long, requires = "certified")]
    static_ok: bool,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

/// Verifies the image and prints each check; exits 1 when one fails.
pub fn run(args: Args) -> Result<i32> {
    let (image, platform) = args.image.open()?;
    let v = if args.certified {
        crate::certify::verify_certified(&image, platform.as_ref(), args.static_ok)?
    } else {
        crate::bake::inspect::verify(&image, platform.as_ref())?
    };
    if args.json {
        super::print_json(&v);
    } else {
        for c in &v.checks {
            println!(
                "{} {:<18} {}",
                if c.failed() { "FAIL" } else { "ok  " },
                c.name,
                c.detail
            );
        }
        println!(
            "{}: {}",
            v.image,
            if v.passed() { "verified" } else { "FAILED" }
        );
    }
    Ok(v.verdict().exit_code())
}
