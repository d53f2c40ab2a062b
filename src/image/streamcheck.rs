//! One blob checked while it streams between a layout and a registry: its digest and size,
//! and, for a layer, its tar stream read to the end and its uncompressed digest against the
//! config's diff id, on a thread of its own fed the same bytes. A copy then reads each blob
//! once, as containers/image does, instead of once to check it and again to move it, and the
//! hashing and decompression run beside the transfer, not in its way.

use super::digest::{Digest, HashingReader, HashingWriter, Tally};
use super::model::decompressor;
use super::tarstream::Padded;
use bytes::Bytes;
use oci_spec::image::{Descriptor, MediaType};
use std::io::Read;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

/// How many chunks may wait for the layer's reader before the transfer waits for it: enough
/// (64 MiB of a push's 1 MiB chunks) that a reader held back a moment by a busy CPU does not
/// stall the transfer.
const QUEUED_CHUNKS: usize = 64;

/// The checks of one blob in flight: feed it every byte in order, then ask for the verdict.
pub struct StreamCheck {
    digest: Digest,
    size: u64,
    /// How the bytes are hashed: on the layer's own thread (so that the transfer's thread
    /// only moves bytes), or here for a blob that is no layer (a config, an artifact).
    hashing: Hashing,
}

enum Hashing {
    OnLayerThread(LayerCheck),
    Here(HashingWriter<std::io::Sink>, Tally),
}

impl StreamCheck {
    /// Starts the checks of the blob `desc` names (`digest` is its digest, parsed): its
    /// digest and size, and a layer's as [`LayerCheck::start`] says.
    pub fn start(desc: &Descriptor, digest: Digest, diff_id: Option<String>) -> StreamCheck {
        let hashing = match LayerCheck::spawn(desc, &digest, diff_id, true) {
            Some(layer) => Hashing::OnLayerThread(layer),
            None => {
                let (hashed, tally) = HashingWriter::new(std::io::sink());
                Hashing::Here(hashed, tally)
            }
        };
        StreamCheck {
            digest,
            size: desc.size(),
            hashing,
        }
    }

    /// The next bytes of the blob.
    pub fn feed(&mut self, chunk: &Bytes) {
        use std::io::Write as _;
        match &mut self.hashing {
            Hashing::OnLayerThread(layer) => layer.feed(chunk),
            // A sink never refuses bytes.
            Hashing::Here(hashed, _) => drop(hashed.write_all(chunk)),
        }
    }

    /// The verdict once every byte is fed: the digest and size first (a blob that is not
    /// what its descriptor says is named as that, whatever a decompressor made of it), then
    /// the layer's tar stream and diff id.
    pub fn finish(self) -> std::result::Result<(), String> {
        let ((got, size), layer) = match self.hashing {
            Hashing::OnLayerThread(layer) => match layer.join() {
                (Some(fed), verdict) => (fed, verdict),
                (None, verdict) => return verdict,
            },
            Hashing::Here(_, tally) => (tally.finish(), Ok(())),
        };
        if size != self.size {
            return Err(format!(
                "blob {} is {size} bytes, not the {} its descriptor says",
                self.digest, self.size
            ));
        }
        if got != self.digest {
            return Err(format!("blob {} has content {got}", self.digest));
        }
        layer
    }
}

/// What a layer's thread found: the digest and size of the bytes fed to it (when it hashed
/// them), and whether its tar stream read through to a diff id that holds.
type LayerFound = (Option<(Digest, u64)>, std::result::Result<(), String>);

/// A layer's tar stream read through on a thread of its own, from the bytes fed to it.
pub struct LayerCheck {
    queue: SyncSender<Bytes>,
    thread: JoinHandle<LayerFound>,
    digest: Digest,
}

impl LayerCheck {
    /// Starts reading the layer `desc` names (`digest` is its digest, for messages): every
    /// entry of its tar stream to the end, and its uncompressed digest against `diff_id`,
    /// what the config lists for it where the config lists diff ids. None for a blob whose
    /// media type names no tar layer (a config, an artifact): its digest is all there is.
    pub fn start(desc: &Descriptor, digest: &Digest, diff_id: Option<String>) -> Option<Self> {
        Self::spawn(desc, digest, diff_id, false)
    }

    /// As [`LayerCheck::start`]; with `hash_fed`, the thread also hashes and counts every
    /// byte fed, for [`LayerCheck::join`] to give.
    fn spawn(
        desc: &Descriptor,
        digest: &Digest,
        diff_id: Option<String>,
        hash_fed: bool,
    ) -> Option<Self> {
        if !is_tar_layer(desc.media_type()) {
            return None;
        }
        let (queue, chunks) = sync_channel(QUEUED_CHUNKS);
        let media_type = desc.media_type().clone();
        let named = digest.clone();
        let thread = std::thread::spawn(move || {
            let chunks = Chunks::new(chunks);
            let named = |e: String| format!("layer {named}: {e}");
            if !hash_fed {
                return (
                    None,
                    read_layer(chunks, &media_type, diff_id.as_deref()).map_err(named),
                );
            }
            let (mut fed, tally) = HashingReader::new(chunks);
            let verdict = read_layer(&mut fed, &media_type, diff_id.as_deref()).map_err(named);
            // Every byte fed is hashed, whatever the layer's reader left unread.
            let drained = std::io::copy(&mut fed, &mut std::io::sink());
            match drained {
                Ok(_) => (Some(tally.finish()), verdict),
                Err(e) => (None, Err(e.to_string())),
            }
        });
        Some(LayerCheck {
            queue,
            thread,
            digest: digest.clone(),
        })
    }

    /// The next bytes of the layer.
    pub fn feed(&self, chunk: &Bytes) {
        // A reader that stopped has its verdict already, and its end of the queue is closed.
        let _ = self.queue.send(chunk.clone());
    }

    /// The reader's verdict, once every byte is fed.
    pub fn finish(self) -> std::result::Result<(), String> {
        self.join().1
    }

    /// The digest and size of the bytes fed (when the thread hashed them) and the reader's
    /// verdict, once every byte is fed.
    fn join(self) -> LayerFound {
        drop(self.queue);
        let digest = self.digest;
        self.thread
            .join()
            .unwrap_or_else(|_| (None, Err(format!("layer {digest}: its reader failed"))))
    }
}

/// True for the media types of tar layers (plain, gzip or zstd), as [`super::Layer::is_tar`].
fn is_tar_layer(media_type: &MediaType) -> bool {
    let media = media_type.to_string();
    ["tar", "tar+gzip", "tar+zstd", "tar.gzip"]
        .iter()
        .any(|s| media.ends_with(s))
}

/// Reads a layer's tar stream through, every entry to the end of the archive, and checks its
/// uncompressed digest against `diff_id` where there is one, as [`super::Layer::check`] does.
fn read_layer(
    raw: impl Read + Send,
    media_type: &MediaType,
    diff_id: Option<&str>,
) -> std::result::Result<(), String> {
    let reader = decompressor(media_type, raw).map_err(|e| e.to_string())?;
    let (reader, tally) = HashingReader::new(reader);
    // The padding goes outside the hashing reader: the diff ID covers the real bytes only.
    let (reader, end) = Padded::new(reader);
    let mut archive = tar::Archive::new(reader);
    let read_through = |archive: &mut tar::Archive<_>| -> std::io::Result<()> {
        for entry in archive.entries()? {
            let entry = entry?;
            end.saw(&entry);
        }
        end.check()
    };
    read_through(&mut archive).map_err(|e| e.to_string())?;
    std::io::copy(&mut archive.into_inner(), &mut std::io::sink()).map_err(|e| e.to_string())?;
    let (got, _) = tally.finish();
    match diff_id {
        Some(want) if got.as_str() != want => Err(format!(
            "uncompressed content is {got}, but the config says {want}"
        )),
        _ => Ok(()),
    }
}

/// The chunks a queue delivers, as one reader; it ends when the queue is closed.
struct Chunks {
    queue: Receiver<Bytes>,
    current: Bytes,
}

impl Chunks {
    fn new(queue: Receiver<Bytes>) -> Chunks {
        Chunks {
            queue,
            current: Bytes::new(),
        }
    }
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.queue.recv() {
                Ok(chunk) => self.current = chunk,
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::layout::{descriptor, digest_of};

    fn tar_of(name: &str, data: &[u8]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, data).unwrap();
        builder.into_inner().unwrap()
    }

    fn checked(blob: &[u8], desc: &Descriptor, diff_id: Option<String>) -> Result<(), String> {
        let mut check = StreamCheck::start(desc, digest_of(desc).unwrap(), diff_id);
        for chunk in blob.chunks(7) {
            check.feed(&Bytes::copy_from_slice(chunk));
        }
        check.finish()
    }

    #[test]
    fn a_layer_passes_only_with_its_digest_size_tar_stream_and_diff_id() {
        let tar = tar_of("a.txt", &[7u8; 3000]);
        let diff_id = Digest::of(&tar).to_string();
        let desc = descriptor(MediaType::ImageLayer, &Digest::of(&tar), tar.len() as u64);
        assert_eq!(checked(&tar, &desc, Some(diff_id.clone())), Ok(()));

        let other = Digest::of(b"other").to_string();
        let err = checked(&tar, &desc, Some(other.clone())).unwrap_err();
        assert!(
            err.contains(&format!("but the config says {other}")),
            "{err}"
        );

        let mut flipped = tar.clone();
        flipped[100] ^= 1;
        let err = checked(&flipped, &desc, Some(diff_id.clone())).unwrap_err();
        assert!(err.contains("has content"), "{err}");

        let err = checked(&tar[..1024], &desc, Some(diff_id)).unwrap_err();
        assert!(err.contains("bytes, not the"), "{err}");

        // A blob whose bytes are no tar stream, under its own digest, is refused as a layer.
        let junk = vec![0x55u8; 1000];
        let desc = descriptor(MediaType::ImageLayer, &Digest::of(&junk), 1000);
        assert!(checked(&junk, &desc, None).is_err());
        // And accepted as what it says it is, when that is no layer.
        let desc = descriptor(MediaType::ImageConfig, &Digest::of(&junk), 1000);
        assert_eq!(checked(&junk, &desc, None), Ok(()));
    }
}
