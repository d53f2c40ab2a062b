//! Tar streams that stop early. Go's archive/tar, which umoci, skopeo and Docker read layers
//! with, takes the end of input after a member's data as the end of the archive, even without
//! the padding to the next 512-byte block or the two zero blocks that should follow; umoci
//! 0.4.7's `insert` writes layers that end so. The tar crate wants the padding and fails
//! ("unexpected EOF during skip"), so [`Padded`] supplies those zeros once the real input
//! has ended.
//!
//! Made-up zeros must never become file content, so every loop over the entries reports each
//! entry to [`End::saw`] and calls [`End::check`] when done: a member whose data runs past
//! the real end is refused, as Go refuses it.

use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;

const BLOCK: u64 = 512;

/// A reader that, after its input ends, supplies zeros up to the next 512-byte boundary and
/// then two zero blocks. Wrap it around whatever hashes the input, so digests cover only the
/// real bytes.
pub struct Padded<R> {
    inner: R,
    read: u64,
    /// Zeros still to supply; None while the input has not ended.
    zeros: Option<u64>,
    end: End,
}

/// Where the real input ended, and where the data of the last entry seen ends; shared with
/// the [`Padded`] reader the tar reader owns.
#[derive(Clone, Default)]
pub struct End {
    real: Rc<Cell<Option<u64>>>,
    data_end: Rc<Cell<u64>>,
}

impl<R: Read> Padded<R> {
    /// Wraps `inner`; report entries to, and check, the returned [`End`].
    pub fn new(inner: R) -> (Self, End) {
        let end = End::default();
        let reader = Padded {
            inner,
            read: 0,
            zeros: None,
            end: end.clone(),
        };
        (reader, end)
    }
}

impl<R: Read> Read for Padded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let left = match self.zeros {
            Some(left) => left,
            None => {
                let n = self.inner.read(buf)?;
                if n > 0 {
                    self.read += n as u64;
                    return Ok(n);
                }
                self.end.real.set(Some(self.read));
                (BLOCK - self.read % BLOCK) % BLOCK + 2 * BLOCK
            }
        };
        let n = left.min(buf.len() as u64) as usize;
        buf[..n].fill(0);
        self.zeros = Some(left - n as u64);
        Ok(n)
    }
}

impl End {
    /// Notes `entry` as the latest one read.
    pub fn saw<R: Read>(&self, entry: &tar::Entry<'_, R>) {
        // A GNU sparse entry's size is the expanded file's; its stored data is the header's.
        let stored = if entry.header().entry_type().is_gnu_sparse() {
            entry.header().entry_size().unwrap_or(0)
        } else {
            entry.size()
        };
        self.data_end
            .set(entry.raw_file_position().saturating_add(stored));
    }

    /// Fails when the input ended before the data of the latest entry did, that is when
    /// supplied zeros were read as its content (or its header).
    pub fn check(&self) -> io::Result<()> {
        match self.real.get() {
            Some(real) if self.data_end.get() > real => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the tar stream ends after {real} bytes, inside a member whose data runs \
                     to byte {}",
                    self.data_end.get()
                ),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar of `files`, as the tar crate writes it (padded, two zero blocks at the end).
    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// The names and contents the tar crate reads through [`Padded`], or the error.
    fn read_all(bytes: &[u8]) -> io::Result<Vec<(String, Vec<u8>)>> {
        let (reader, end) = Padded::new(bytes);
        let mut archive = tar::Archive::new(reader);
        let mut out = Vec::new();
        for entry in archive.entries()? {
            let mut entry = entry?;
            end.saw(&entry);
            let mut data = Vec::new();
            entry.read_to_end(&mut data)?;
            out.push((entry.path()?.display().to_string(), data));
        }
        end.check()?;
        Ok(out)
    }

    #[test]
    fn a_stream_cut_after_the_last_members_data_reads_whole() {
        let whole = tar_of(&[("a", b"first"), ("b", &[7u8; 1000])]);
        let expected = read_all(&whole).unwrap();
        // 512 (a) + 512 (a's data) + 512 (b) + 1000 (b's data): no padding, no end blocks.
        let cut = &whole[..512 * 3 + 1000];
        let mut plain = tar::Archive::new(cut);
        let plain: io::Result<Vec<_>> = plain.entries().unwrap().collect();
        assert!(plain.is_err(), "the tar crate alone refuses it");
        assert_eq!(read_all(cut).unwrap(), expected);
        // Cut at a block boundary: the padding is there, the end blocks are not.
        assert_eq!(read_all(&whole[..512 * 4 + 512]).unwrap(), expected);
        assert_eq!(read_all(&[]).unwrap(), Vec::new());
    }

    #[test]
    fn a_stream_cut_inside_a_members_data_or_header_is_refused() {
        let whole = tar_of(&[("a", b"first"), ("b", &[7u8; 1000])]);
        for len in [512 * 3 + 999, 512 * 3 + 600, 512 * 3, 512 * 2 + 300] {
            let err = read_all(&whole[..len]).unwrap_err();
            assert!(
                err.to_string().contains("ends after") || err.to_string().contains("checksum"),
                "{len}: {err}"
            );
        }
    }

    #[test]
    fn zeros_come_only_after_the_real_end() {
        let (mut reader, end) = Padded::new(&b"abc"[..]);
        let mut all = Vec::new();
        reader.read_to_end(&mut all).unwrap();
        assert_eq!(all.len(), 512 + 1024);
        assert_eq!(&all[..3], b"abc");
        assert!(all[3..].iter().all(|b| *b == 0));
        assert_eq!(end.real.get(), Some(3));
    }
}
