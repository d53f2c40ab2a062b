//! A build's report as a person reads it: the image, its manifest and its layers, and with
//! `--timings` where the time went.

use super::BuildReport;
use crate::units::human_size;
use std::fmt::Write;

impl BuildReport {
    /// The human report, `timings` adding where the time went. The time is the command's
    /// whole run, resolution and the base included, as a user timing the command sees it.
    pub fn human(&self, timings: bool) -> String {
        let mut out = String::new();
        self.write_layers(&mut out)
            .expect("a String takes any text");
        if timings {
            self.write_timings(&mut out)
                .expect("a String takes any text");
        }
        out
    }

    /// The image, its manifest and its layers.
    fn write_layers(&self, out: &mut String) -> std::fmt::Result {
        writeln!(out, "built {} in {:.2} s", self.image, self.timings.total_s)?;
        if self.platforms.len() > 1 {
            writeln!(out, "  index    {}", self.manifest)?;
            for p in &self.platforms {
                writeln!(out, "  {:<14} manifest {}", p.platform, p.manifest)?;
            }
            writeln!(out, "  layers of {}:", self.platforms[0].platform)?;
        } else {
            writeln!(out, "  manifest {}", self.manifest)?;
        }
        if self.image.starts_with("docker-daemon:") {
            // The engine keeps no manifest of ours: it stores the image under its config
            // digest, and `inspect docker-daemon:` rebuilds a manifest from `docker save`,
            // whose digest differs. Name the one the engine shows.
            writeln!(
                out,
                "  image ID {} in the engine (what `docker images` shows; the engine does not \
                 keep the manifest above, and `inspect docker-daemon:` reports one rebuilt from \
                 `docker save`)",
                self.config
            )?;
        }
        for l in &self.layers {
            writeln!(
                out,
                "  {:<8} {} {:>9} {}",
                l.name,
                l.digest,
                human_size(l.size),
                match l.from {
                    "registry-cache" => "reused from the registry cache",
                    _ if l.reused => "reused",
                    _ => "written",
                }
            )?;
        }
        Ok(())
    }

    /// `--timings`: one line per phase, then one per layer written, in CPU seconds per stage
    /// (the stages of a layer run at once, so its wall time is not their sum).
    fn write_timings(&self, out: &mut String) -> std::fmt::Result {
        let t = &self.timings;
        let f = &t.fetch;
        writeln!(out, "timings (seconds)")?;
        writeln!(out, "  resolve    {:>8.2}", t.resolve_s)?;
        writeln!(out, "  base       {:>8.2}", t.base_s)?;
        writeln!(
            out,
            "  wheels     {:>8.2}  downloaded {} in {} files, verified {} cached in {} files ({:.2} s hashing)",
            f.wall_s,
            human_size(f.downloaded_bytes),
            f.downloaded_files,
            human_size(f.verified_bytes),
            f.verified_files,
            f.verify_s
        )?;
        writeln!(out, "  layers     {:>8.2}", t.layers_s)?;
        writeln!(out, "  transfer   {:>8.2}", t.transfer_s)?;
        writeln!(out, "  total      {:>8.2}", t.total_s)?;
        // Every layer, where it came from; those written now with where their time went.
        writeln!(
            out,
            "  {:<24} {:<14} {:<7} {:>10} {:>10} {:>7} {:>8} {:>8} {:>6} {:>6}",
            "layer",
            "from",
            "placed",
            "tar",
            "blob",
            "wall",
            "install",
            "compress",
            "hash",
            "write"
        )?;
        for l in &self.layers {
            let placed = l.placed.map_or("-", crate::fsutil::Placement::as_str);
            write!(out, "  {:<24} {:<14} {placed:<7} ", l.name, l.from)?;
            match &l.timing {
                Some(t) => writeln!(
                    out,
                    "{:>10} {:>10} {:>7.2} {:>8.2} {:>8.2} {:>6.2} {:>6.2}",
                    human_size(t.tar_bytes),
                    human_size(l.size),
                    t.wall_s,
                    t.install_s,
                    t.compress_s,
                    t.hash_s,
                    t.write_s
                )?,
                None => writeln!(out, "{:>10} {:>10}", "", human_size(l.size))?,
            }
        }
        Ok(())
    }
}
