//! `gpubake inspect`: an image's account of itself, or its link closure.

use super::ImageArgs;
use crate::error::Result;

/// `gpubake inspect`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    image: ImageArgs,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
    /// Report the image's link closure (reads its layers once, in memory).
    #[arg(long)]
    libraries: bool,
    /// Check the signature of every bundle attached to a docker:// image with this public
    /// key (PEM), and show what the signed statement says. Without it, the verdicts shown are
    /// the listing's unsigned annotations, labelled unchecked.
    #[arg(long, value_name = "PUB.pem", conflicts_with = "libraries")]
    key: Option<std::path::PathBuf>,
}

/// Reads the image and prints the report; exits 0 whatever it finds.
pub fn run(args: Args) -> Result<i32> {
    let (image, platform) = args.image.open()?;
    // The link closure or the image's own account, printed alike (the closure's JSON, every
    // file's closure, is made only when asked for).
    let printed = if args.libraries {
        let links = crate::bake::inspect::libraries(&image, platform.as_ref())?;
        if args.json {
            serde_json::to_string_pretty(&links).expect("reports serialize") + "\n"
        } else {
            links.to_text()
        }
    } else {
        let mut info = crate::bake::inspect::inspect(&image, platform.as_ref())?;
        if let Some(path) = &args.key {
            let key = crate::sign::keys::PublicKey::read(path)?;
            info.check_signatures(&image, &key)?;
        }
        if args.json {
            serde_json::to_string_pretty(&info).expect("reports serialize") + "\n"
        } else {
            info.to_text()
        }
    };
    print!("{printed}");
    Ok(0)
}
