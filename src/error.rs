//! The one error type of the library, and the exit code each kind maps to.
//!
//! Exit codes follow the design: 0 pass, 1 a check failed, 2 bad input or usage,
//! 3 the environment is missing something (no GPU, no daemon).

use std::fmt;
use std::path::PathBuf;

/// A place in an input file: `recipes/x.yaml:4:9`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Location {
    /// The file as the user named it (or `builtin:NAME` for embedded files).
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(col) = self.column {
                write!(f, ":{col}")?;
            }
        }
        Ok(())
    }
}

impl Location {
    /// The whole file at `path`, no line in it: for what is wrong with a file's content as
    /// a whole (a field's value against something outside the file).
    pub fn of_file(path: &std::path::Path) -> Location {
        Location {
            file: path.display().to_string(),
            line: None,
            column: None,
        }
    }

    /// The location as a lock (and so an image) records it: an absolute path, or one that
    /// climbs with `..`, is cut to its file name, so that a lock says nothing of the machine
    /// it was made on, and a file gives the same lock wherever it lies.
    pub fn portable(&self) -> Location {
        let path = std::path::Path::new(&self.file);
        let local = path.components().all(|c| {
            matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        });
        Location {
            file: match path.file_name() {
                Some(name) if !local => name.to_string_lossy().into_owned(),
                _ => self.file.clone(),
            },
            ..self.clone()
        }
    }
}

/// Everything that can go wrong, each naming the file, field or candidate involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{}{}: {source}{}", side.verb(), path.display(), side.note())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
        /// Whether gpubake was reading it or writing it, when that is known.
        side: Side,
    },
    /// An input file is malformed, has a wrong type, an unknown key or a bad value.
    #[error("{0}")]
    Invalid(Box<Invalid>),
    /// No combination in the compatibility database satisfies the recipe.
    #[error("{0}")]
    Unsatisfiable(Box<Conflict>),
    /// A preset name matched no file in the search path or the built-in set.
    #[error("{}", unknown_preset(.name, .referenced_at, &.lookup.0, &.lookup.1))]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// Where it was asked for.
        referenced_at: Location,
        /// The presets that do exist, and where they were looked for, in order (boxed: errors
        /// travel in every Result and stay small).
        lookup: Box<(Vec<String>, Vec<String>)>,
    },
    /// Presets extend each other in a loop.
    #[error("{at}: presets extend each other in a loop: {}", .chain.join(" -> "))]
    PresetCycle {
        /// Where the loop closes.
        at: Location,
        /// The names in the loop, first repeated at the end.
        chain: Vec<String>,
    },
    /// The command line is inconsistent in a way clap cannot see.
    #[error("{0}")]
    Usage(String),
    /// An image is damaged or unreadable: a missing blob, bad JSON, a digest that does not match.
    #[error("{at}: {message}")]
    Image {
        /// The image, layout file or blob.
        at: String,
        /// What is wrong.
        message: String,
    },
    /// A transport or feature gpubake does not offer.
    #[error("{0}")]
    Unsupported(String),
    /// The Docker engine refused a build: a failing step, a missing base image.
    #[error("{0}")]
    Build(String),
    /// The Python closure cannot be resolved, or a pylock is malformed, stale or disagrees
    /// with the lock.
    #[error("{0}")]
    Closure(String),
    /// A wheel is damaged or does not match its lock: a hash, a RECORD entry, a file clash.
    #[error("{wheel}: {message}")]
    Wheel {
        /// The wheel file or its name.
        wheel: String,
        /// What is wrong.
        message: String,
    },
    /// Something the environment should provide is missing: a Docker engine, a GPU runtime.
    #[error("{0}")]
    Environment(String),
}

/// Which way an I/O error went: a full disk or a read-only filesystem is where gpubake
/// writes, and a message that named a file it was reading sent users to the wrong place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Side {
    /// Not said.
    #[default]
    Unknown,
    /// Reading the file.
    Reading,
    /// Writing into it (or into the directory): with what the filesystem had free when a
    /// full one refused.
    Writing {
        /// "; 1.9 MB free there", for a full filesystem.
        note: String,
    },
}

impl Side {
    fn verb(&self) -> &'static str {
        match self {
            Side::Unknown => "",
            Side::Reading => "reading ",
            Side::Writing { .. } => "writing ",
        }
    }

    fn note(&self) -> &str {
        match self {
            Side::Writing { note } => note,
            _ => "",
        }
    }
}

/// The bytes the filesystem holding `path` (or its nearest existing parent) has free for
/// an unprivileged writer, when statvfs answers.
fn free_space(path: &std::path::Path) -> Option<u64> {
    let mut at = Some(path);
    while let Some(p) = at {
        if let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) {
            // SAFETY: statvfs is plain data, for which all zeroes is a valid value.
            let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: `c` is a valid C string and `st` a valid out-pointer for the call.
            if unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0 {
                return Some(st.f_bavail as u64 * st.f_frsize as u64);
            }
        }
        at = p.parent();
    }
    None
}

/// What is wrong with an input, and where.
#[derive(Debug, thiserror::Error)]
#[error("{at}: {}{message}{}", field_prefix(.field), help_suffix(.help))]
pub struct Invalid {
    /// Where.
    pub at: Location,
    /// The field path, such as `gpus[1]` or `env.NCCL_ALGO`.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
    /// What is allowed instead.
    pub help: Option<String>,
}

fn field_prefix(field: &Option<String>) -> String {
    field
        .as_ref()
        .map(|f| format!("field `{f}`: "))
        .unwrap_or_default()
}

fn help_suffix(help: &Option<String>) -> String {
    help.as_ref()
        .map(|h| format!("\n  allowed: {h}"))
        .unwrap_or_default()
}

fn unknown_preset(name: &str, at: &Location, known: &[String], searched: &[String]) -> String {
    let mut text = format!("{at}: no preset named `{name}`");
    if let Some(best) = crate::nccl::suggest::closest(name, known.iter().map(String::as_str)) {
        text.push_str(&format!(" (did you mean `{best}`?)"));
    }
    text.push_str(&format!("\n  looked in {}", searched.join(", ")));
    text.push_str(&format!("\n  known presets: {}", known.join(", ")));
    text
}

/// The exit code of bad input: a usage error, an unreadable or invalid file.
pub const BAD_INPUT: i32 = 2;

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            // A full disk or a read-only filesystem is the machine's state, not the input's.
            Error::Io { source, .. }
                if out_of_space(source)
                    || source.kind() == std::io::ErrorKind::ReadOnlyFilesystem =>
            {
                3
            }
            Error::Io { .. }
            | Error::Invalid(_)
            | Error::Unsatisfiable(_)
            | Error::UnknownPreset { .. }
            | Error::PresetCycle { .. }
            | Error::Usage(_)
            | Error::Image { .. }
            | Error::Unsupported(_)
            | Error::Build(_)
            | Error::Wheel { .. }
            | Error::Closure(_) => BAD_INPUT,
            Error::Environment(_) => 3,
        }
    }

    /// The error as JSON, for a script that asked for JSON: its message, its exit code, and a
    /// conflict's parts.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({"error": self.to_string(), "exit": self.exit_code()});
        if let Error::Unsatisfiable(conflict) = self {
            v["conflict"] = serde_json::to_value(conflict).expect("conflicts serialize");
        }
        v
    }

    /// Shorthand for an invalid-input error.
    pub fn invalid(
        at: Location,
        field: Option<String>,
        message: impl Into<String>,
        help: Option<String>,
    ) -> Self {
        Error::Invalid(Box::new(Invalid {
            at,
            field,
            message: message.into(),
            help,
        }))
    }

    /// Shorthand for a damaged-image error.
    pub fn image(at: impl fmt::Display, message: impl Into<String>) -> Self {
        Error::Image {
            at: at.to_string(),
            message: message.into(),
        }
    }

    /// Shorthand for an I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
            side: Side::Unknown,
        }
    }

    /// An error reading `path`.
    pub fn reading(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
            side: Side::Reading,
        }
    }

    /// An error writing `path` (a file, or the directory it goes in); a full filesystem's
    /// free space is noted.
    pub fn writing(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::writing_with(path.into(), source, None)
    }

    /// [`Error::writing`] of something `needed` bytes long, which a full filesystem's note
    /// compares with what it has free.
    pub fn writing_needing(path: impl Into<PathBuf>, source: std::io::Error, needed: u64) -> Self {
        Self::writing_with(path.into(), source, Some(needed))
    }

    fn writing_with(path: PathBuf, source: std::io::Error, needed: Option<u64>) -> Self {
        let mut said = Vec::new();
        if out_of_space(&source) {
            let size = crate::units::human_size;
            said.extend(needed.map(|n| format!("{} to write", size(n))));
            said.extend(free_space(&path).map(|n| format!("{} free there", size(n))));
        }
        let note = if said.is_empty() {
            String::new()
        } else {
            format!("; {}", said.join(", "))
        };
        Error::Io {
            path,
            source,
            side: Side::Writing { note },
        }
    }

    /// An error copying from `from` into `to`: a full or read-only filesystem, or a quota,
    /// is the destination's; anything else, the source's.
    pub fn copying(
        from: impl Into<PathBuf>,
        to: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        if out_of_space(&source) || source.kind() == std::io::ErrorKind::ReadOnlyFilesystem {
            Error::writing(to, source)
        } else {
            Error::reading(from, source)
        }
    }
}

/// The device or the user's quota is full.
pub fn out_of_space(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A resolution that found no build, explained.
#[derive(Debug, serde::Serialize)]
pub struct Conflict {
    /// The recipe file.
    pub recipe: String,
    /// Every constraint, as asked.
    pub asked: Vec<String>,
    /// The builds matching the recipe's PyTorch and CUDA asks, each with what refused it.
    pub refused: Vec<(String, Vec<String>)>,
    /// How many builds each constraint refused.
    pub refused_by: Vec<(String, usize)>,
    /// What would run with one constraint relaxed.
    pub would_run: Vec<String>,
    /// The PyTorch releases the database knows, when the one asked for is not among them.
    pub known_releases: Vec<String>,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: no PyTorch build meets every constraint",
            self.recipe
        )?;
        writeln!(f, "  asked: {}", self.asked.join("; "))?;
        if self.refused.is_empty() {
            writeln!(f, "  no build matches the PyTorch and CUDA asks at all:")?;
            for (asked, n) in &self.refused_by {
                writeln!(f, "    {asked} refuses {n} builds")?;
            }
            if !self.known_releases.is_empty() {
                writeln!(
                    f,
                    "  known PyTorch releases: {}",
                    self.known_releases.join(", ")
                )?;
            }
        } else {
            // Reasons name the build they refuse; several builds of one release often share
            // one (a Python range), so each is said once.
            let mut said: Vec<&str> = Vec::new();
            for reason in self.refused.iter().flat_map(|(_, why)| why) {
                if !said.contains(&reason.as_str()) {
                    said.push(reason);
                }
            }
            for reason in said.iter().take(8) {
                writeln!(f, "  {reason}")?;
            }
            if said.len() > 8 {
                writeln!(f, "  ... and {} more reasons", said.len() - 8)?;
            }
        }
        if self.would_run.is_empty() {
            write!(
                f,
                "  relaxing any single constraint is not enough; see `gpubake compat`"
            )?;
        } else {
            write!(f, "  what would run instead:")?;
            for line in &self.would_run {
                write!(f, "\n    - {line}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portable_locations_name_no_host_directory() {
        let at = |file: &str| Location {
            file: file.into(),
            line: Some(5),
            column: Some(7),
        };
        assert_eq!(
            at("/tmp/x/recipe.yaml").portable().to_string(),
            "recipe.yaml:5:7"
        );
        assert_eq!(at("../team/p.yaml").portable().to_string(), "p.yaml:5:7");
        assert_eq!(
            at("env-presets/nvlink.yaml").portable().to_string(),
            "env-presets/nvlink.yaml:5:7"
        );
    }

    #[test]
    fn a_full_disk_is_the_environment_not_bad_input() {
        let full = Error::io("blobs/sha256/.tmp-x", std::io::Error::from_raw_os_error(28));
        assert_eq!(full.exit_code(), 3);
        assert!(
            full.to_string().contains("No space left on device"),
            "{full}"
        );
        let quota = Error::io("f", std::io::Error::from_raw_os_error(122));
        assert_eq!(quota.exit_code(), 3);
        let denied = Error::io("f", std::io::Error::from_raw_os_error(13));
        assert_eq!(denied.exit_code(), 2);
        let read_only = Error::io("f", std::io::Error::from_raw_os_error(libc::EROFS));
        assert_eq!(read_only.exit_code(), 3);
    }

    #[test]
    fn an_io_error_names_its_side_and_a_full_disk_what_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out/blobs/sha256");
        let full = Error::copying("wheel.whl", &dest, std::io::Error::from_raw_os_error(28));
        let text = full.to_string();
        assert!(
            text.starts_with(&format!("writing {}: ", dest.display())),
            "{text}"
        );
        // The nearest existing parent's filesystem answers for a path not made yet.
        assert!(
            text.contains("No space left on device") && text.ends_with(" free there"),
            "{text}"
        );
        assert_eq!(full.exit_code(), 3);
        let damaged = Error::copying(
            "wheel.whl",
            &dest,
            std::io::Error::from_raw_os_error(libc::EIO),
        );
        assert_eq!(
            damaged.to_string(),
            format!(
                "reading wheel.whl: {}",
                std::io::Error::from_raw_os_error(libc::EIO)
            )
        );
        assert_eq!(damaged.exit_code(), 2);
        let sized =
            Error::writing_needing(&dest, std::io::Error::from_raw_os_error(28), 613_000_000);
        let text = sized.to_string();
        assert!(
            text.contains("; 613.0 MB to write, ") && text.ends_with(" free there"),
            "{text}"
        );
        let plain = Error::io("f", std::io::Error::from_raw_os_error(libc::EACCES));
        assert!(plain.to_string().starts_with("f: "), "{plain}");
    }
}
