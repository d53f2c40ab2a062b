//! YAML input files: read once, parsed into typed values with errors that name the file, line,
//! column and field, and asked afterwards where a field sits so later stages (resolve, lint)
//! can point at it too.
//!
//! serde_yaml does the typed parse (its errors carry positions, and with serde_path_to_error
//! the field path); marked_yaml keeps a position for every node, which serde_yaml drops once a
//! value parsed fine.

use crate::error::{Error, Location, Result};
use indexmap::IndexMap;
use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::marker::PhantomData;
use std::path::Path;

/// Recipes and presets are small; anything larger is a mistake, refused before parsing.
pub const MAX_INPUT_BYTES: usize = 1 << 20;

/// One input file's text, its name and where each of its nodes sits.
pub struct Document {
    name: String,
    text: String,
    nodes: Option<marked_yaml::Node>,
    /// Where nesting passed the parser's depth limit, if it did.
    too_deep: Option<(usize, usize)>,
}

impl Document {
    /// Reads `path`, refusing files over [`MAX_INPUT_BYTES`] and text that is not UTF-8.
    pub fn read(path: &Path) -> Result<Self> {
        let name = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|e| Error::reading(path, e))?;
        if meta.len() > MAX_INPUT_BYTES as u64 {
            return Err(Error::invalid(
                whole_file(&name),
                None,
                format!(
                    "file is {} bytes; gpubake reads inputs of at most {} bytes",
                    meta.len(),
                    MAX_INPUT_BYTES
                ),
                Some("a recipe, preset or nccl.conf of a few kilobytes".into()),
            ));
        }
        let bytes = std::fs::read(path).map_err(|e| Error::reading(path, e))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            Error::invalid(
                whole_file(&name),
                None,
                format!(
                    "not UTF-8 text (invalid byte at offset {})",
                    e.utf8_error().valid_up_to()
                ),
                Some("a UTF-8 text file (a YAML recipe or preset, or an nccl.conf)".into()),
            )
        })?;
        Ok(Self::from_text(name, text))
    }

    /// Wraps text that is already in memory (embedded files, tests).
    pub fn from_text(name: impl Into<String>, text: impl Into<String>) -> Self {
        let text = text.into();
        let (nodes, too_deep) = match marked_yaml::parse_yaml(0, &text) {
            Ok(node) => (Some(node), None),
            Err(marked_yaml::LoadError::ScanError(m, e))
                if e.info().contains("recursion limit") =>
            {
                (None, Some((m.line(), m.column())))
            }
            Err(_) => (None, None),
        };
        Document {
            name: name.into(),
            text,
            nodes,
            too_deep,
        }
    }

    /// The file name as the user gave it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The sha256 of the text, hex-encoded.
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(self.text.as_bytes()))
    }

    /// The keys of the top-level mapping, when the file parses as one.
    pub fn top_keys(&self) -> Vec<&str> {
        match &self.nodes {
            Some(marked_yaml::Node::Mapping(map)) => map.keys().map(|k| k.as_str()).collect(),
            _ => Vec::new(),
        }
    }

    /// True when the file has no YAML content at all (only blanks and comments).
    pub fn is_blank(&self) -> bool {
        self.text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#') || l.trim() == "---")
    }

    /// Parses the whole file into `T`. `what` names the kind of file for messages ("recipe"),
    /// and `help` says what each top-level field allows.
    pub fn parse<T: DeserializeOwned>(
        &self,
        what: &str,
        help: fn(&str) -> Option<String>,
    ) -> Result<T> {
        if self.is_blank() {
            return Err(Error::invalid(
                whole_file(&self.name),
                None,
                format!("the file is empty; a {what} is a YAML mapping"),
                help(""),
            ));
        }
        // serde_yaml's parser slows down quadratically with nesting depth; refuse what
        // marked_yaml already found too deep before handing it over.
        if let Some((line, column)) = self.too_deep {
            return Err(Error::invalid(
                Location {
                    file: self.name.clone(),
                    line: Some(line),
                    column: Some(column),
                },
                None,
                "the YAML nests deeper than gpubake reads",
                help(""),
            ));
        }
        let de = serde_yaml::Deserializer::from_str(&self.text);
        serde_path_to_error::deserialize(de).map_err(|err| {
            let path = err.path().to_string();
            let segments: Vec<String> = err
                .path()
                .iter()
                .filter_map(|s| match s {
                    serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                    serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                    _ => None,
                })
                .collect();
            let inner = err.into_inner();
            let mut message = unknown_field_message(bare_message(&inner.to_string(), &path));
            // serde names the Rust type (`expected struct Recipe`); the user wrote YAML.
            if let Some(i) = message.find("expected struct ") {
                message = format!(
                    "{}expected a {what}: a mapping of its fields",
                    &message[..i]
                );
            }
            // serde_yaml places a duplicate field of a struct at the document's start; the
            // second occurrence of the key at the top level is what to fix.
            let duplicate = message
                .strip_prefix("duplicate field `")
                .and_then(|rest| rest.split('`').next())
                .filter(|_| steps_is_top(&segments))
                .and_then(|key| self.second_top_key(key));
            // serde_yaml places custom errors (bad versions, duplicate keys) at the start of
            // the document, so point at the field itself whenever it can be found.
            let steps: Vec<&str> = segments.iter().map(String::as_str).collect();
            let on_key = message.starts_with("unknown field");
            let at = match self.find(&steps, on_key) {
                _ if duplicate.is_some() => duplicate.clone().expect("checked"),
                Some(at) if !steps.is_empty() => at,
                _ => Location {
                    file: self.name.clone(),
                    line: inner.location().map(|l| l.line()),
                    column: inner.location().map(|l| l.column()),
                },
            };
            let field = (!steps.is_empty()).then(|| field_path(&steps));
            let top = steps.first().copied().unwrap_or("");
            Error::invalid(at, field, message, help(top))
        })
    }

    /// Where `key` is given a second time at the top level (a line that starts with it).
    fn second_top_key(&self, key: &str) -> Option<Location> {
        let line = self
            .text
            .lines()
            .enumerate()
            .filter(|(_, l)| {
                l.strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with(':'))
            })
            .nth(1)?
            .0;
        Some(Location {
            file: self.name.clone(),
            line: Some(line + 1),
            column: Some(1),
        })
    }

    /// Where the node at `path` sits, if every step of the path exists.
    fn find(&self, path: &[&str], key: bool) -> Option<Location> {
        let mut node = self.nodes.as_ref()?;
        let mut marker = node.span().start().copied();
        for (i, step) in path.iter().enumerate() {
            let last = i + 1 == path.len();
            node = match node {
                marked_yaml::Node::Mapping(map) => {
                    let (k, v) = map.iter().find(|(k, _)| k.as_str() == *step)?;
                    marker = if key && last {
                        k.span().start().copied()
                    } else {
                        v.span().start().copied()
                    };
                    v
                }
                marked_yaml::Node::Sequence(seq) => {
                    let v = seq.get(step.parse::<usize>().ok()?)?;
                    marker = v.span().start().copied();
                    v
                }
                marked_yaml::Node::Scalar(_) => return None,
            };
        }
        let m = marker?;
        Some(Location {
            file: self.name.clone(),
            line: Some(m.line()),
            column: Some(m.column()),
        })
    }

    /// Where the node at `path` sits; `path` holds mapping keys and sequence indices as text.
    /// With `key` set, the position of the mapping key itself rather than its value. When the
    /// path does not exist, the nearest existing parent, then the whole file.
    pub fn locate(&self, path: &[&str], key: bool) -> Location {
        (0..=path.len())
            .rev()
            .find_map(|n| self.find(&path[..n], key && n == path.len()))
            .unwrap_or_else(|| whole_file(&self.name))
    }

    /// An invalid-input error pointing at the node at `path`.
    pub fn invalid(
        &self,
        path: &[&str],
        message: impl Into<String>,
        help: Option<String>,
    ) -> Error {
        Error::invalid(
            self.locate(path, false),
            Some(field_path(path)),
            message,
            help,
        )
    }
}

/// Renders a path of keys and indices the way users read it: `gpus[1]`, `env.NCCL_ALGO`.
pub fn field_path(path: &[&str]) -> String {
    let mut out = String::new();
    for step in path {
        if step.parse::<usize>().is_ok() {
            out.push_str(&format!("[{step}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(step);
        }
    }
    out
}

fn whole_file(name: &str) -> Location {
    Location {
        file: name.to_string(),
        line: None,
        column: None,
    }
}

/// serde_yaml's messages repeat the path in front and the position behind; both are shown
/// separately, so strip them.
fn bare_message(message: &str, path: &str) -> String {
    let message = message
        .strip_prefix(&format!("{path}: "))
        .unwrap_or(message);
    let message = match message.rfind(" at line ") {
        Some(i) if message[i..].contains(" column ") => &message[..i],
        _ => message,
    };
    message.to_string()
}

/// serde's `unknown field `sytem`, expected one of `name`, ...` lists the fields, which the
/// error's help lists again: keep the name with the likely one meant, and leave the list to
/// the help.
fn unknown_field_message(message: String) -> String {
    // Nested fields come as `env.NCCL_DEBUG: unknown field ...`; the error names the field.
    let Some(rest) = message
        .find("unknown field `")
        .map(|i| &message[i + "unknown field `".len()..])
    else {
        return message;
    };
    let Some((name, expected)) = rest.split_once('`') else {
        return message;
    };
    let fields = expected.split('`').skip(1).step_by(2);
    match crate::nccl::suggest::closest(name, fields) {
        Some(meant) => format!("unknown field `{name}` (did you mean `{meant}`?)"),
        None => format!("unknown field `{name}`"),
    }
}

/// True when a parse error's path is the document itself (a top-level field).
fn steps_is_top(segments: &[String]) -> bool {
    segments.len() <= 1
}

/// A string map that keeps file order and refuses a key given twice, which plain serde maps
/// would silently collapse to the last value.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct UniqueMap<V>(pub IndexMap<String, V>);

impl<V> UniqueMap<V> {
    /// Whether the map has no entry.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for UniqueMap<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Unique<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for Unique<V> {
            type Value = UniqueMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping of names to values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut map = IndexMap::new();
                while let Some(key) = access.next_key::<String>()? {
                    if map.contains_key(&key) {
                        return Err(serde::de::Error::custom(format!("`{key}` is given twice")));
                    }
                    let value = access.next_value()?;
                    map.insert(key, value);
                }
                Ok(UniqueMap(map))
            }
        }
        d.deserialize_map(Unique(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Small {
        name: String,
        #[serde(default)]
        env: UniqueMap<String>,
    }

    fn no_help(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn unknown_keys_are_located() {
        let doc = Document::from_text("r.yaml", "name: a\nnmae: b\n");
        let err = doc
            .parse::<Small>("recipe", no_help)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("r.yaml:2:1: field `nmae`: unknown field `nmae`"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_keys_are_refused() {
        let doc = Document::from_text("r.yaml", "name: a\nenv:\n  A: 1\n  A: 2\n");
        let err = doc
            .parse::<Small>("recipe", no_help)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`A` is given twice"), "{err}");
        assert!(err.starts_with("r.yaml:"), "{err}");
    }

    #[test]
    fn scalars_keep_their_text() {
        let doc = Document::from_text("r.yaml", "name: 3.10\nenv:\n  X: 0x10\n  Y: true\n");
        let small: Small = doc.parse("recipe", no_help).unwrap();
        assert_eq!(small.name, "3.10");
        assert_eq!(small.env.0["X"], "0x10");
        assert_eq!(small.env.0["Y"], "true");
    }

    #[test]
    fn nodes_can_be_located_after_parsing() {
        let doc = Document::from_text("r.yaml", "name: a\nenv:\n  A: 1\n  B: two\n");
        let at = doc.locate(&["env", "B"], false);
        assert_eq!((at.line, at.column), (Some(4), Some(6)));
        let at = doc.locate(&["env", "B"], true);
        assert_eq!((at.line, at.column), (Some(4), Some(3)));
    }

    #[test]
    fn blank_files_are_refused() {
        let doc = Document::from_text("r.yaml", "# only a comment\n\n");
        let err = doc
            .parse::<Small>("recipe", no_help)
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty"), "{err}");
    }
}
