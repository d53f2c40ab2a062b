//! Content digests: the `sha256:<hex>` names of blobs, computed while bytes stream through a
//! writer and checked while they stream out of a reader, so no blob is trusted unread.

use sha2::{Digest as _, Sha256};
use std::fmt;
use std::io::{self, Read, Write};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

/// A `sha256:<64 hex>` digest.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    /// The 64 hex characters.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// The full `sha256:...` text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn from_hasher(h: Sha256) -> Self {
        Digest(format!("sha256:{}", hex::encode(h.finalize())))
    }
}

impl FromStr for Digest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| format!("`{s}` is not a sha256 digest"))?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!(
                "`{s}` is not a sha256 digest (64 lower-case hex digits)"
            ));
        }
        Ok(Digest(s.to_string()))
    }
}

/// A digest reads as its `sha256:...` text wherever text is taken.
impl std::ops::Deref for Digest {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The running digest and byte count of a stream, shareable with whoever owns the writer
/// (the parallel gzip encoder takes its writer by value).
#[derive(Clone, Default)]
pub struct Tally(Arc<Mutex<(Sha256, u64)>>);

impl Tally {
    fn update(&self, bytes: &[u8]) {
        let mut inner = self.0.lock().expect("no panics while hashing");
        inner.0.update(bytes);
        inner.1 += bytes.len() as u64;
    }

    /// The digest and size so far; call once the stream is complete.
    pub fn finish(&self) -> (Digest, u64) {
        let inner = self.0.lock().expect("no panics while hashing");
        (Digest::from_hasher(inner.0.clone()), inner.1)
    }
}

/// A writer that hashes and counts what passes through it.
pub struct HashingWriter<W> {
    inner: W,
    tally: Tally,
}

impl<W: Write> HashingWriter<W> {
    /// Wraps `inner`; read the result from the returned tally.
    pub fn new(inner: W) -> (Self, Tally) {
        let tally = Tally::default();
        (
            HashingWriter {
                inner,
                tally: tally.clone(),
            },
            tally,
        )
    }

    /// The wrapped writer.
    pub fn into_inner(self) -> W {
        self.inner
    }

    /// The wrapped writer, borrowed.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.tally.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes and counts what is read through it.
pub struct HashingReader<R> {
    inner: R,
    tally: Tally,
}

impl<R: Read> HashingReader<R> {
    /// Wraps `inner`; read the result from the returned tally.
    pub fn new(inner: R) -> (Self, Tally) {
        let tally = Tally::default();
        (
            HashingReader {
                inner,
                tally: tally.clone(),
            },
            tally,
        )
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.tally.update(&buf[..n]);
        Ok(n)
    }
}

/// A reader that fails at end of stream when the bytes read do not have the expected digest
/// and size, so a corrupt blob can never be consumed as if it were whole.
pub struct VerifyingReader<R> {
    inner: R,
    hasher: Sha256,
    read: u64,
    expected: Digest,
    size: Option<u64>,
    what: String,
}

impl<R: Read> VerifyingReader<R> {
    /// Wraps `inner`, which must produce exactly `size` bytes (when given) hashing to `expected`.
    /// `what` names the blob in errors.
    pub fn new(inner: R, expected: Digest, size: Option<u64>, what: impl Into<String>) -> Self {
        VerifyingReader {
            inner,
            hasher: Sha256::new(),
            read: 0,
            expected,
            size,
            what: what.into(),
        }
    }
}

impl<R: Read> Read for VerifyingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        if let Some(size) = self.size
            && self.read > size
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: longer than the {size} bytes its descriptor gives",
                    self.what
                ),
            ));
        }
        if n == 0 && !buf.is_empty() {
            let got = Digest::from_hasher(self.hasher.clone());
            if got != self.expected {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: content hashes to {got}, not {}",
                        self.what, self.expected
                    ),
                ));
            }
            if let Some(size) = self.size.filter(|s| *s != self.read) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: {} bytes, but its descriptor gives {size}",
                        self.what, self.read
                    ),
                ));
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_strictly() {
        let d = Digest::of(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(d.as_str().parse::<Digest>().unwrap(), d);
        assert!("sha256:E3B0".parse::<Digest>().is_err());
        assert!("md5:abc".parse::<Digest>().is_err());
        assert!(
            format!("sha256:../{}", &d.hex()[3..])
                .parse::<Digest>()
                .is_err()
        );
    }

    #[test]
    fn writer_hashes_what_it_writes() {
        let (mut w, tally) = HashingWriter::new(Vec::new());
        w.write_all(b"hello").unwrap();
        assert_eq!(tally.finish(), (Digest::of(b"hello"), 5));
    }

    #[test]
    fn reader_refuses_corrupt_or_short_content() {
        let good = Digest::of(b"hello");
        let mut out = Vec::new();
        VerifyingReader::new(&b"hello"[..], good.clone(), Some(5), "blob")
            .read_to_end(&mut out)
            .unwrap();
        let err = VerifyingReader::new(&b"hellO"[..], good.clone(), Some(5), "blob")
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("hashes to"), "{err}");
        let err = VerifyingReader::new(&b"hello!"[..], good, Some(5), "blob")
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("longer than"), "{err}");
    }
}
