//! `gpubake compat`: the compatibility database.

use crate::compat::Compat;
use crate::error::Result;
use crate::version::Version;

/// `gpubake compat`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only this PyTorch release (`2.9`).
    #[arg(long)]
    release: Option<Version>,
    /// Print the whole database as JSON.
    #[arg(long)]
    json: bool,
}

/// Prints the database, or one release of it, as a table or JSON.
pub fn run(args: Args) -> Result<i32> {
    let db = Compat::embedded();
    if let Some(wanted) = &args.release {
        db.check_release(wanted)?;
    }
    if args.json {
        super::print_json(db);
    } else {
        print!("{}", db.table(args.release.as_ref()));
    }
    Ok(0)
}
