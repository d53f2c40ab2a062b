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

/// A reader whose source is read on a thread of its own, a few chunks ahead: a layer's blob
/// is read, checked against its digest and decompressed on one core while the other hashes
/// the tar stream and writes its entries. Dropped early, it stops the thread at its next
/// chunk; the source's error reaches the reader in order, after the bytes before it.
pub struct ReadAhead {
    chunks: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
}

impl ReadAhead {
    /// Bytes of one chunk, and how many chunks may wait.
    const CHUNK: usize = 1 << 20;
    const AHEAD: usize = 8;

    /// Starts reading `source` on a thread of its own.
    pub fn new(mut source: impl Read + Send + 'static) -> ReadAhead {
        let (tx, chunks) = std::sync::mpsc::sync_channel(Self::AHEAD);
        std::thread::spawn(move || {
            loop {
                let mut chunk = vec![0u8; Self::CHUNK];
                let mut filled = 0;
                let result = loop {
                    match source.read(&mut chunk[filled..]) {
                        Ok(0) => break Ok(()),
                        Ok(n) => {
                            filled += n;
                            if filled == chunk.len() {
                                break Ok(());
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(e),
                    }
                };
                chunk.truncate(filled);
                let last = filled < Self::CHUNK || result.is_err();
                if filled > 0 && tx.send(Ok(chunk)).is_err() {
                    return;
                }
                if let Err(e) = result {
                    let _ = tx.send(Err(e));
                    return;
                }
                if last {
                    return;
                }
            }
        });
        ReadAhead {
            chunks,
            chunk: Vec::new(),
            at: 0,
        }
    }
}

impl Read for ReadAhead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.chunk.len() {
            match self.chunks.recv() {
                Ok(chunk) => {
                    self.chunk = chunk?;
                    self.at = 0;
                }
                // The thread ended after the last chunk.
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod read_ahead_tests {
    use super::*;

    struct FailsAfter(Vec<u8>, usize);

    impl Read for FailsAfter {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.1 >= self.0.len() {
                return Err(std::io::Error::other("the blob ends early"));
            }
            let n = buf.len().min(self.0.len() - self.1).min(1000);
            buf[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
            self.1 += n;
            Ok(n)
        }
    }

    #[test]
    fn every_byte_arrives_in_order_then_the_sources_error() {
        let data: Vec<u8> = (0..3_000_017u32).map(|i| (i % 251) as u8).collect();
        let mut out = Vec::new();
        ReadAhead::new(std::io::Cursor::new(data.clone()))
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, data);
        let mut out = Vec::new();
        let err = ReadAhead::new(FailsAfter(data.clone(), 0))
            .read_to_end(&mut out)
            .unwrap_err();
        assert_eq!(err.to_string(), "the blob ends early");
        assert_eq!(out, data, "the bytes before the error arrive first");
        // Dropped after a few bytes: the thread stops rather than reading on.
        let mut early = ReadAhead::new(std::io::Cursor::new(data));
        let mut two = [0u8; 2];
        early.read_exact(&mut two).unwrap();
        drop(early);
    }
}
