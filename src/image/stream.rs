//! An image streamed into a Docker Engine while it is built: a `docker save` archive whose
//! members go to the engine's load as each layer is made, with nothing on disk between the
//! two and nothing compressed (the engine stores layers unpacked and would only decompress
//! them again). A layer the engine already holds, with every layer below it, is named in
//! `manifest.json` and left out: the engine looks layers up by chain ID and opens the file
//! of a missing one only (Docker 20.10's classic store; tests/engine.rs records it).
//!
//! The archive's layer files are plain tars, so the image the engine gets has the same
//! config, and so the same image ID, as the image built into a layout with compressed
//! layers; only the manifest (which the engine does not keep) differs, in its layers'
//! media type and digests.

use super::archive::member_header;
use super::digest::Digest;
use super::layout::{Layout, digest_of};
use crate::engine::{ChannelWriter, Engine};
use crate::error::{Error, Result};
use oci_spec::image::Descriptor;
use std::collections::HashSet;
use std::io::{self, Write};
use std::sync::Mutex;
use std::thread::JoinHandle;

/// The archive on its way to the engine.
pub struct EngineStream {
    state: Mutex<State>,
    /// The chain IDs the engine holds (empty where it cannot be told what to skip).
    present: HashSet<String>,
    load: Mutex<Option<JoinHandle<Result<()>>>>,
}

struct State {
    tar: tar::Builder<ChannelWriter>,
    /// The chain ID of the layers so far.
    chain: Option<String>,
    /// manifest.json's layer files, in order.
    members: Vec<String>,
    /// Layers left out, and sent.
    left_out: usize,
    sent: usize,
}

impl EngineStream {
    /// Connects and starts the load; the engine reads what the build sends as it comes.
    pub fn start(engine: Engine) -> Result<Self> {
        let present = if engine.loads_by_chain_id() {
            engine.layer_chains()?
        } else {
            HashSet::new()
        };
        let (out, load) = engine.start_load()?;
        Ok(EngineStream {
            state: Mutex::new(State {
                tar: tar::Builder::new(out),
                chain: None,
                members: Vec::new(),
                left_out: 0,
                sent: 0,
            }),
            present,
            load: Mutex::new(Some(load)),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many layers were left out and how many sent, so far.
    pub fn counts(&self) -> (usize, usize) {
        let s = self.state();
        (s.left_out, s.sent)
    }

    /// Whether the engine holds the next layer, `diff_id` on top of the layers so far; if
    /// so it is named and not sent, and true is returned.
    pub fn skip_if_present(&self, diff_id: &Digest) -> bool {
        let mut s = self.state();
        let chain = crate::engine::next_chain_id(s.chain.as_deref(), &diff_id.to_string());
        if !self.present.contains(&chain) {
            return false;
        }
        let n = s.members.len();
        s.members.push(format!("layers/{n}.tar"));
        s.chain = Some(chain);
        s.left_out += 1;
        true
    }

    /// Sends the next layer as the blob `layer` of `layout` (compressed or not: the engine
    /// reads either), unless the engine holds it.
    pub fn blob(&self, layout: &Layout, layer: &Descriptor, diff_id: &Digest) -> Result<()> {
        if self.skip_if_present(diff_id) {
            return Ok(());
        }
        let digest = digest_of(layer)?;
        let mut reader = layout.open_blob(&digest, Some(layer.size()))?;
        self.layer(layer.size(), |out| {
            io::copy(&mut reader, out).map_err(|e| {
                if e.kind() == io::ErrorKind::BrokenPipe {
                    broken(e)
                } else {
                    Error::image(layout.describe(), format!("layer {digest}: {e}"))
                }
            })?;
            Ok(diff_id.clone())
        })
        .map(drop)
    }

    /// Sends the next layer, `size` bytes that `write` writes; returns what `write` returns
    /// (its diff ID) once the member is complete. Fewer or more bytes than `size` fail.
    pub fn layer(
        &self,
        size: u64,
        write: impl FnOnce(&mut dyn Write) -> Result<Digest>,
    ) -> Result<Digest> {
        let mut s = self.state();
        let n = s.members.len();
        let name = format!("layers/{n}.tar");
        let mut h = member_header(size);
        h.set_path(&name).map_err(broken)?;
        h.set_cksum();
        let out = s.tar.get_mut();
        out.write_all(h.as_bytes()).map_err(broken)?;
        let mut counted = Counted { inner: out, n: 0 };
        let diff_id = write(&mut counted)?;
        if counted.n != size {
            return Err(Error::Unsupported(format!(
                "a layer for the engine came to {} bytes, {size} were announced",
                counted.n
            )));
        }
        let pad = (512 - size % 512) % 512;
        s.tar
            .get_mut()
            .write_all(&[0u8; 512][..pad as usize])
            .map_err(broken)?;
        s.members.push(name);
        s.chain = Some(crate::engine::next_chain_id(
            s.chain.as_deref(),
            &diff_id.to_string(),
        ));
        s.sent += 1;
        Ok(diff_id)
    }

    /// Sends the config and `manifest.json` naming `reference`, ends the archive and waits
    /// for the engine to load it.
    pub fn finish(self, config: &[u8], reference: &str) -> Result<()> {
        let result = {
            let mut s = self.state();
            let config_name = format!("{}.json", Digest::of(config).hex());
            let manifest = serde_json::json!([{
                "Config": config_name,
                "RepoTags": [reference],
                "Layers": s.members,
            }]);
            let manifest = serde_json::to_vec(&manifest).expect("manifests serialize");
            let mut put = |name: &str, bytes: &[u8]| {
                let mut h = member_header(bytes.len() as u64);
                s.tar.append_data(&mut h, name, bytes).map_err(broken)
            };
            put(&config_name, config).and_then(|()| put("manifest.json", &manifest))
        };
        let State { tar, .. } = self.state.into_inner().unwrap_or_else(|p| p.into_inner());
        let ended = tar
            .into_inner()
            .and_then(|mut out| out.flush())
            .map_err(broken);
        let loaded = self.load.into_inner().unwrap_or_else(|p| p.into_inner());
        let loaded = join(loaded);
        // The engine's own words first: a write fails because the engine stopped reading.
        loaded.and(result).and(ended)
    }

    /// Ends the stream without an image (the build failed) and returns `error`, or the
    /// engine's own where it had stopped first.
    pub fn abandon(self, error: Error) -> Error {
        let State { tar, .. } = self.state.into_inner().unwrap_or_else(|p| p.into_inner());
        // Dropping the writer cuts the archive short: the engine loads nothing from it.
        drop(tar);
        let load = self.load.into_inner().unwrap_or_else(|p| p.into_inner());
        match (join(load), &error) {
            (Err(engine), Error::Environment(_)) => engine,
            _ => error,
        }
    }
}

fn join(load: Option<JoinHandle<Result<()>>>) -> Result<()> {
    match load.map(JoinHandle::join) {
        Some(Ok(loaded)) => loaded,
        Some(Err(panic)) => std::panic::resume_unwind(panic),
        None => Ok(()),
    }
}

/// A write to the engine failed: it stopped reading (its own error follows from the load).
fn broken(e: io::Error) -> Error {
    Error::Environment(format!("the engine stopped reading the image: {e}"))
}

/// Counts what passes, so that a member's length can be held to its header's.
struct Counted<'a, W> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
