//! `gpubake completions` and `gpubake man`: what a shell and `man` read, made from the same
//! clap definitions as `--help`, so neither can say something `--help` does not.

use crate::error::{Error, Result};
use clap::CommandFactory;
use std::path::{Path, PathBuf};

/// `gpubake completions`'s arguments.
#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    shell: clap_complete::Shell,
}

/// Prints the completion script for the shell.
pub fn completions(args: CompletionsArgs) -> Result<i32> {
    let mut cli = super::Cli::command();
    clap_complete::generate(args.shell, &mut cli, "gpubake", &mut std::io::stdout());
    Ok(0)
}

/// `gpubake man`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// The directory the pages are written into (made when missing): gpubake.1, and
    /// gpubake-COMMAND.1 for each command (gpubake-key-generate.1 for `key generate`).
    dir: PathBuf,
}

/// Writes a man page for gpubake and for each of its commands, each atomically, and prints
/// their paths.
pub fn man(args: ManArgs) -> Result<i32> {
    std::fs::create_dir_all(&args.dir).map_err(|e| Error::writing(&args.dir, e))?;
    let mut cli = super::Cli::command();
    cli.build();
    write_pages(&cli, "gpubake", &args.dir)?;
    Ok(0)
}

/// Writes the page of `cmd` as `name.1`, then those of its visible subcommands.
fn write_pages(cmd: &clap::Command, name: &str, dir: &Path) -> Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone().name(name.to_string()))
        .render(&mut page)
        .map_err(|e| Error::io(dir, e))?;
    let path = dir.join(format!("{name}.1"));
    crate::fsutil::write_atomic(&path, &page)?;
    println!("{}", path.display());
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() != "help" {
            write_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
        }
    }
    Ok(())
}
