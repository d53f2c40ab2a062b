//! What a training job's start-up reads: the files under the Python environment's
//! site-packages that `import torch`, CUDA's initialisation, a GEMM, cuDNN and NCCL's
//! initialisation open or map, in the order they were first touched, with how much of each
//! the process touched.
//!
//! `gpubake probe --record-startup FILE` takes the record where the job runs (a GPU node, or
//! a CPU-only machine for the import alone); it is kept beside the lock, and
//! `build --compression estargz --startup-record FILE` lays the layers out by it, so a
//! builder without a GPU uses a record taken with one. Paths are relative to site-packages
//! (`site-packages/torch/lib/libtorch_cuda.so`), which holds the same files wherever the
//! same wheels are installed; the torch release the record was taken with is kept so that a
//! record of another release is refused rather than laying out the wrong files.

use crate::error::{Error, Location, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The format's name and version, the record's first field.
pub const FORMAT: &str = "gpubake-startup-record/1";

/// Where the paths of a record are rooted.
pub const SITE_PACKAGES: &str = "site-packages/";

/// Records larger than this are not a record.
const MAX_BYTES: u64 = 64 << 20;

/// A record of one start-up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartupRecord {
    /// [`FORMAT`].
    pub format: String,
    /// The torch release the start-up imported (`2.11.0+cu130`).
    pub torch: String,
    /// The interpreter's version.
    pub python: String,
    /// What the start-up ran: `import torch`, then, on a GPU, `cuda init`, `bf16 gemm`,
    /// `cudnn conv`, `nccl all-reduce`.
    pub steps: Vec<String>,
    /// The GPU it ran on, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// The files, in the order the start-up first touched them.
    pub files: Vec<FileRead>,
}

/// One file the start-up read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRead {
    /// `site-packages/...`.
    pub path: String,
    /// Its size when recorded.
    pub size: u64,
    /// The bytes of it the start-up touched: the whole file for what Python read, the
    /// pages it had mapped for a shared library.
    pub read: u64,
}

impl StartupRecord {
    /// Reads and checks a record; errors name the file, the line and the field.
    pub fn read(path: &Path) -> Result<StartupRecord> {
        let name = path.display().to_string();
        let bytes =
            crate::fsutil::read_capped(path, MAX_BYTES).map_err(|e| Error::reading(path, e))?;
        let at = |line: Option<usize>, column: Option<usize>| Location {
            file: name.clone(),
            line,
            column,
        };
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let record: StartupRecord = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            Error::invalid(
                at(Some(inner.line()), Some(inner.column())),
                (field != ".").then_some(field),
                format!("not a startup record: {inner}"),
                Some("take one with `gpubake probe --record-startup FILE`".into()),
            )
        })?;
        let field = |f: &str, message: String| {
            Error::invalid(
                Location::of_file(path),
                Some(f.into()),
                message,
                Some("take it again with `gpubake probe --record-startup FILE`".into()),
            )
        };
        if record.format != FORMAT {
            return Err(field(
                "format",
                format!("is `{}`; this gpubake reads `{FORMAT}`", record.format),
            ));
        }
        if record.files.is_empty() {
            return Err(field(
                "files",
                "is empty: the start-up it records read nothing under site-packages, so it \
                 cannot order a layer"
                    .into(),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, f) in record.files.iter().enumerate() {
            let rel = f.path.strip_prefix(SITE_PACKAGES).unwrap_or_default();
            let clean = !rel.is_empty()
                && Path::new(rel)
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !clean {
                return Err(field(
                    &format!("files[{i}].path"),
                    format!(
                        "`{}` is not a path under `{SITE_PACKAGES}` without `..`",
                        f.path
                    ),
                ));
            }
            if f.read > f.size {
                return Err(field(
                    &format!("files[{i}].read"),
                    format!("{} bytes read of a file of {} bytes", f.read, f.size),
                ));
            }
            if !seen.insert(&f.path) {
                return Err(field(
                    &format!("files[{i}].path"),
                    format!("`{}` is listed twice", f.path),
                ));
            }
        }
        Ok(record)
    }

    /// Writes the record to `path`, atomically.
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a record serializes");
        bytes.push(b'\n');
        crate::fsutil::write_atomic(path, &bytes)
    }

    /// Refuses a record taken with another torch release than `locked`: its files and their
    /// order belong to that release.
    pub fn check_torch(&self, locked: &str, at: &Path) -> Result<()> {
        if self.torch == locked {
            return Ok(());
        }
        Err(Error::invalid(
            Location::of_file(at),
            Some("torch".into()),
            format!(
                "was recorded with torch {}, but the lock pins torch {locked}: its files and \
                 their order are another release's",
                self.torch
            ),
            Some(
                "record the start-up again with the locked torch (`gpubake probe \
                 --record-startup FILE` in an image of this lock)"
                    .into(),
            ),
        ))
    }

    /// Bytes the start-up touched, and the whole size of the files it touched.
    pub fn totals(&self) -> (u64, u64) {
        self.files
            .iter()
            .fold((0, 0), |(r, s), f| (r + f.read, s + f.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> String {
        format!(r#"{{"path": "{path}", "size": 10, "read": 4}}"#)
    }

    fn record(format: &str, files: &[String]) -> String {
        format!(
            "{{\n  \"format\": \"{format}\",\n  \"torch\": \"2.11.0+cu130\",\n  \"python\": \
             \"3.12.3\",\n  \"steps\": [\"import torch\"],\n  \"files\": [{}]\n}}\n",
            files.join(",\n    ")
        )
    }

    fn read_text(text: &str) -> Result<StartupRecord> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("startup.json");
        std::fs::write(&path, text).unwrap();
        StartupRecord::read(&path)
    }

    fn refusal(text: &str) -> String {
        read_text(text).unwrap_err().to_string()
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let good = record(FORMAT, &[file("site-packages/torch/__init__.py")]);
        let r = read_text(&good).unwrap();
        assert_eq!(r.files[0].read, 4);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("again.json");
        r.write(&path).unwrap();
        assert_eq!(StartupRecord::read(&path).unwrap(), r);
        assert_eq!(r.totals(), (4, 10));
    }

    #[test]
    fn every_bad_record_is_refused_naming_file_and_field() {
        let ok = file("site-packages/torch/__init__.py");
        let cases = [
            (
                record("gpubake-startup-record/9", std::slice::from_ref(&ok)),
                "format",
            ),
            (record(FORMAT, &[]), "files"),
            (
                record(FORMAT, &[file("torch/__init__.py")]),
                "files[0].path",
            ),
            (
                record(FORMAT, &[file("site-packages/../etc/passwd")]),
                "files[0].path",
            ),
            (record(FORMAT, &[file("site-packages/")]), "files[0].path"),
            (
                record(FORMAT, &[file("site-packages//abs")]),
                "files[0].path",
            ),
            (record(FORMAT, &[ok.clone(), ok.clone()]), "files[1].path"),
            (
                record(
                    FORMAT,
                    &[r#"{"path": "site-packages/a.py", "size": 1, "read": 2}"#.into()],
                ),
                "files[0].read",
            ),
            (
                record(
                    FORMAT,
                    &[r#"{"path": "site-packages/a.py", "size": "1", "read": 1}"#.into()],
                ),
                "files[0].size",
            ),
            (
                record(FORMAT, std::slice::from_ref(&ok)).replace("\"steps\"", "\"stepz\""),
                "stepz",
            ),
            ("{\"format\": ".into(), "line 1"),
            ("".into(), "line 1"),
        ];
        for (text, field) in cases {
            let e = refusal(&text);
            assert!(e.contains("startup.json"), "{e}");
            assert!(e.contains(field), "{field}: {e}");
        }
        // A field's error says where it is.
        let e = refusal(&record(
            FORMAT,
            &[r#"{"path": "site-packages/a.py", "size": -1, "read": 1}"#.into()],
        ));
        assert!(e.contains(":6:"), "{e}");
    }

    #[test]
    fn a_record_past_the_cap_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.json");
        // A sparse file: its size, not its bytes, is what the cap must catch.
        std::fs::File::create(&path)
            .unwrap()
            .set_len(MAX_BYTES + 1)
            .unwrap();
        let e = StartupRecord::read(&path).unwrap_err().to_string();
        assert!(e.contains("huge.json") && e.contains("larger than"), "{e}");
    }

    #[test]
    fn a_record_of_another_torch_is_refused_naming_both() {
        let r = read_text(&record(FORMAT, &[file("site-packages/torch/version.py")])).unwrap();
        r.check_torch("2.11.0+cu130", Path::new("s.json")).unwrap();
        let e = r
            .check_torch("2.9.1+cu128", Path::new("s.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("s.json") && e.contains("torch"), "{e}");
        assert!(
            e.contains("2.11.0+cu130") && e.contains("2.9.1+cu128"),
            "{e}"
        );
    }
}
