//! `gpubake copy`: an image from one transport to another, every blob verified.

use super::RegistryArgs;
use crate::error::Result;

/// `gpubake copy`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The image to copy.
    src: String,
    /// Where to copy it.
    dest: String,
    #[command(flatten)]
    registry: RegistryArgs,
    /// Rewrite every layer as eStargz or zstd:chunked on the way, for nodes that pull
    /// lazily (the stargz snapshotter): a new config and manifest, so a new digest. Without
    /// it the copy keeps every blob and the digest as they are.
    #[arg(long, value_enum, value_name = "estargz|zstd:chunked")]
    compression: Option<crate::image::Compression>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Copies the image and says what was copied.
pub fn run(args: Args) -> Result<i32> {
    let registry = &args.registry;
    let (src, dest) = (
        registry.transport(&args.src)?,
        registry.transport(&args.dest)?.destination()?,
    );
    let start = std::time::Instant::now();
    let platform = registry.platform()?;
    let copied = match args.compression {
        None => src.copy_platforms(&dest, platform.as_ref())?,
        Some(lazy) if lazy.toc().is_some() => src.copy_as_lazy(&dest, platform.as_ref(), lazy)?,
        Some(other) => {
            return Err(crate::error::Error::Usage(format!(
                "copy --compression {}: copy keeps each layer's bytes, or rewrites them as \
                 estargz or zstd:chunked; build with --compression {0} to write layers that way",
                other.name()
            )));
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    let bytes = copied.bytes;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "from": src.to_string(),
                "to": dest.to_string(),
                "manifest": copied.digest,
                "platforms": copied.platforms,
                "manifest_made_by_gpubake": copied.made_here,
                "bytes": bytes,
                "seconds": seconds,
            })
        );
        return Ok(0);
    }
    println!("copied {src} to {dest} in {seconds:.2} s");
    println!(
        "  {} {} ({} in {} blobs)",
        if copied.platforms.is_empty() {
            "manifest"
        } else {
            "index"
        },
        copied.digest,
        crate::units::human_size(bytes),
        copied.blobs
    );
    if copied.made_here {
        println!("  {}", crate::image::MADE_HERE.trim_start());
    }
    if !copied.platforms.is_empty() {
        println!("  platforms {}", copied.platforms.join(", "));
    }
    Ok(0)
}
