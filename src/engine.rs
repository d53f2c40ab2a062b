//! A Docker Engine, through bollard: load an image (streamed from a `docker save` archive on
//! disk, never held in memory) and run a command in a container with GPUs requested the way
//! `docker run --gpus` asks for them. `DOCKER_HOST` is respected; an engine that does not
//! answer is an environment problem (exit 3), not bad input.

use crate::error::{Error, Result};
use bollard::Docker;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, ResourcesUlimits};
use futures_util::StreamExt;
use std::path::Path;
use std::time::Duration;

/// Which GPUs a container gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gpus {
    /// Every GPU (`--gpus all`).
    All,
    /// This many (`--gpus N`).
    Count(u32),
    /// None: no GPU work.
    None,
}

impl std::str::FromStr for Gpus {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "all" => Ok(Gpus::All),
            "none" | "0" => Ok(Gpus::None),
            n => n
                .parse()
                .map(Gpus::Count)
                .map_err(|_| format!("`{n}`: expected all, none or a number of GPUs")),
        }
    }
}

impl std::fmt::Display for Gpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Gpus::All => f.write_str("all"),
            Gpus::Count(n) => write!(f, "{n}"),
            Gpus::None => f.write_str("none"),
        }
    }
}

/// What a container printed and how it ended.
#[derive(Debug)]
pub struct RunOutcome {
    /// Its exit code.
    pub exit_code: i64,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// It ran past its time and was killed; the output is what it printed until then.
    pub timed_out: bool,
    /// How the container was set up, as `docker run` flags or the runtime's equivalent.
    pub settings: Settings,
}

/// The container's setup as a training job's: what it was given, and what the engine or
/// runtime would not grant (its own limits are lower), which the probe's limits then show.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// What the container was given: `--ipc host --ulimit memlock=-1 ...`.
    pub applied: String,
    /// What was asked for and refused, with the refusal's words.
    pub withheld: Option<String>,
}

/// NGC's PyTorch containers ask to be run with `--ipc=host --ulimit memlock=-1 --ulimit
/// stack=67108864`: the host's IPC (and so its /dev/shm), no cap on locked memory for IB
/// registration, and a 64 MiB stack. certify's container is run so.
pub const TRAINING_STACK: i64 = 64 << 20;

/// The host settings of a training job's container; without `memlock` the engine's own
/// locked-memory limit stays.
fn training_job(memlock: bool) -> (HostConfig, String) {
    let limit = |name: &str, value: i64| ResourcesUlimits {
        name: Some(name.into()),
        soft: Some(value),
        hard: Some(value),
    };
    let mut ulimits = vec![limit("stack", TRAINING_STACK)];
    let mut flags = format!("--ipc host --ulimit stack={TRAINING_STACK}");
    if memlock {
        ulimits.insert(0, limit("memlock", -1));
        flags = format!("--ipc host --ulimit memlock=-1 --ulimit stack={TRAINING_STACK}");
    }
    (
        HostConfig {
            ipc_mode: Some("host".into()),
            ulimits: Some(ulimits),
            ..Default::default()
        },
        flags,
    )
}

/// The chain ID of each prefix of `diff_ids`, as the engine names a layer with all below
/// it: the first layer's is its diff ID, each next one [`next_chain_id`] of the one below.
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut chains: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff in diff_ids {
        chains.push(next_chain_id(chains.last().map(String::as_str), diff));
    }
    chains
}

/// The chain ID of the layer `diff_id` on the layers whose chain ID is `below`: the sha256
/// of `below`, a space and `diff_id`; the diff ID itself for a bottom layer.
pub fn next_chain_id(below: Option<&str>, diff_id: &str) -> String {
    use sha2::Digest as _;
    match below {
        None => diff_id.to_string(),
        Some(below) => format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(format!("{below} {diff_id}")))
        ),
    }
}

/// Bytes sent to the engine per message.
const CHUNK: usize = 1 << 20;

/// Hands what is written to the engine's request body in chunks; a closed channel (the
/// engine gave up) is a broken pipe.
pub struct ChannelWriter {
    buf: Vec<u8>,
    tx: tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
    progress: crate::progress::Progress,
}

impl ChannelWriter {
    fn send(&mut self) -> std::io::Result<()> {
        self.progress.inc(self.buf.len() as u64);
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx
            .blocking_send(Ok(bytes::Bytes::from(chunk)))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

impl std::io::Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let take = (CHUNK - self.buf.len()).min(data.len());
        self.buf.extend_from_slice(&data[..take]);
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        Ok(take)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            self.send()
        }
    }
}

/// A connected engine.
pub struct Engine {
    docker: Docker,
    rt: tokio::runtime::Runtime,
    host: String,
}

impl Engine {
    /// Connects (DOCKER_HOST, else the local socket) and pings.
    pub fn connect() -> Result<Self> {
        let host =
            std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
        let missing = |e: String| {
            Error::Environment(format!(
                "no Docker engine answers at {host}: {e}; start dockerd or set DOCKER_HOST"
            ))
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| missing(e.to_string()))?;
        // A training image is gigabytes: loading or building one outlasts bollard's default
        // two-minute request timeout. Waits that must be short have their own deadlines.
        let docker = Docker::connect_with_defaults()
            .map_err(|e| missing(e.to_string()))?
            .with_timeout(Duration::from_secs(3600));
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), docker.ping()).await })
            .map_err(|_| missing("no answer within 10 s".into()))?
            .map_err(|e| missing(e.to_string()))?;
        Ok(Engine { docker, rt, host })
    }

    /// Where the engine is.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Loads a `docker save` archive, streaming it from disk.
    pub fn load(&self, archive: &Path) -> Result<()> {
        let mut file = std::fs::File::open(archive).map_err(|e| Error::reading(archive, e))?;
        self.load_with(|out| {
            std::io::copy(&mut file, out)
                .map(drop)
                .map_err(|e| Error::io(archive, e))
        })
    }

    /// Loads the `docker save` archive that `write` writes, streamed to the engine as it is
    /// made ([`Engine::start_load`]). Where the engine stopped reading, its own words are the
    /// error; otherwise `write`'s.
    pub fn load_with(&self, write: impl FnOnce(&mut ChannelWriter) -> Result<()>) -> Result<()> {
        let (mut out, load) = self.start_load()?;
        let written = write(&mut out).and_then(|()| {
            std::io::Write::flush(&mut out).map_err(|e| {
                Error::Environment(format!("the engine stopped reading the image: {e}"))
            })
        });
        drop(out);
        let loaded = match load.join() {
            Ok(loaded) => loaded,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        loaded.and(written)
    }

    /// Starts loading a `docker save` archive that the caller writes into the returned
    /// writer, streamed to the engine as it is made: no file between the two. The engine
    /// gets the archive once the writer is flushed and dropped; the handle ends with the
    /// engine's answer, naming what it refused (an archive cut short loads nothing).
    pub fn start_load(&self) -> Result<(ChannelWriter, std::thread::JoinHandle<Result<()>>)> {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(8);
        let docker = self.docker.clone();
        // The load runs on a thread of its own, with a runtime of its own, while the caller
        // writes.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Environment(format!("starting the engine's load: {e}")))?;
        let load = std::thread::Builder::new()
            .name("engine-load".into())
            .spawn(move || {
                let body = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
                rt.block_on(async {
                    let mut progress = docker.import_image_stream(
                        bollard::query_parameters::ImportImageOptionsBuilder::default()
                            .quiet(true)
                            .build(),
                        body,
                        None,
                    );
                    while let Some(step) = progress.next().await {
                        step.map_err(|e| {
                            Error::Environment(format!("the engine refused the image: {e}"))
                        })?;
                    }
                    Ok(())
                })
            })
            .map_err(|e| Error::Environment(format!("starting the engine's load: {e}")))?;
        Ok((
            ChannelWriter {
                buf: Vec::with_capacity(CHUNK),
                tx,
                progress: crate::progress::Progress::new(
                    "loading into the engine",
                    crate::progress::Unit::Bytes,
                    None,
                ),
            },
            load,
        ))
    }

    /// Whether a `docker load` may leave out the layers the engine has: an engine that keeps
    /// images in its own graph-driver store (docker before the containerd image store) looks
    /// each layer up by chain ID and opens the file of a missing one only (recorded with
    /// Docker 20.10.24 in tests/engine_stream.rs). The containerd image store imports every
    /// blob the archive names.
    pub fn loads_by_chain_id(&self) -> bool {
        let Ok(info) = self.rt.block_on(self.docker.info()) else {
            return false;
        };
        let containerd = info
            .driver_status
            .iter()
            .flatten()
            .any(|pair| pair.iter().any(|v| v.contains("io.containerd.snapshotter")));
        !containerd
    }

    /// The chain IDs of every layer stack the engine holds: each image's layers, every
    /// prefix of them.
    pub fn layer_chains(&self) -> Result<std::collections::HashSet<String>> {
        let listing = |e: bollard::errors::Error| {
            Error::Environment(format!("listing the engine's images: {e}"))
        };
        self.rt.block_on(async {
            let images = self
                .docker
                .list_images(Some(
                    bollard::query_parameters::ListImagesOptionsBuilder::default()
                        .all(true)
                        .build(),
                ))
                .await
                .map_err(listing)?;
            let mut chains = std::collections::HashSet::new();
            for image in images {
                // An image removed since the listing holds nothing to reuse.
                let Ok(inspect) = self.docker.inspect_image(&image.id).await else {
                    continue;
                };
                let layers = inspect.root_fs.and_then(|r| r.layers).unwrap_or_default();
                chains.extend(chain_ids(&layers));
            }
            Ok(chains)
        })
    }

    /// Writes `name` as a `docker save` archive to `to`, streaming.
    pub fn export(&self, name: &str, to: &Path) -> Result<()> {
        let docker = self.docker.clone();
        let name = name.to_string();
        let to = to.to_path_buf();
        self.rt.block_on(async move {
            use tokio::io::AsyncWriteExt;
            let mut file = tokio::fs::File::create(&to)
                .await
                .map_err(|e| Error::writing(&to, e))?;
            let mut stream = docker.export_image(&name);
            let progress = crate::progress::Progress::new(
                format!("exporting {name} from the engine"),
                crate::progress::Unit::Bytes,
                None,
            );
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| match e {
                    // The engine answered: it has no such image. That is the name given, like
                    // a missing OCI directory (exit 2), not a missing engine (exit 3).
                    bollard::errors::Error::DockerResponseServerError {
                        status_code: 404,
                        message,
                    } => Error::Usage(format!(
                        "docker-daemon:{name}: the engine has no such image ({message})"
                    )),
                    e => Error::Environment(format!("exporting {name} from the engine: {e}")),
                })?;
                file.write_all(&chunk)
                    .await
                    .map_err(|e| Error::writing(&to, e))?;
                progress.inc(chunk.len() as u64);
            }
            progress.finish();
            file.flush().await.map_err(|e| Error::writing(&to, e))
        })
    }

    /// Builds the context in the tar file `context` (its Dockerfile at the root), streamed to
    /// the engine, and tags the result `tag`. The build log
    /// goes to `log` line by line; a failure names the step that failed. The engine tags only
    /// a finished build, so a failed one leaves no tag behind.
    pub fn build(&self, context: &Path, tag: &str, mut log: impl FnMut(&str)) -> Result<()> {
        let context_path = context.to_path_buf();
        let options = bollard::query_parameters::BuildImageOptionsBuilder::default()
            .dockerfile("Dockerfile")
            .t(tag)
            .rm(true)
            .forcerm(true)
            .build();
        let docker = self.docker.clone();
        let result = self.rt.block_on(async move {
            let file = tokio::fs::File::open(&context_path)
                .await
                .map_err(|e| format!("{}: {e}", context_path.display()))?;
            let body = tokio_util::io::ReaderStream::with_capacity(file, 1 << 20);
            let mut stream =
                docker.build_image(options, None, Some(bollard::body_try_stream(body)));
            let mut step = String::new();
            while let Some(item) = stream.next().await {
                let failure = match item {
                    Ok(info) => {
                        if let Some(text) = info.stream {
                            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                                if line.starts_with("Step ") {
                                    step = line.to_string();
                                }
                                log(line);
                            }
                        }
                        info.error_detail.map(|d| d.message.unwrap_or_default())
                    }
                    Err(e) => Some(e.to_string()),
                };
                if let Some(message) = failure {
                    let at = if step.is_empty() {
                        String::new()
                    } else {
                        format!(" at {step}")
                    };
                    return Err(format!("the build failed{at}: {message}"));
                }
            }
            Ok(())
        });
        result.map_err(|message| {
            // A refused build and a lost engine look alike in the stream; ask the engine.
            let alive = self
                .rt
                .block_on(async {
                    tokio::time::timeout(Duration::from_secs(5), self.docker.ping()).await
                })
                .is_ok_and(|r| r.is_ok());
            if alive {
                Error::Build(message)
            } else {
                Error::Environment(format!("lost the engine at {}: {message}", self.host))
            }
        })
    }

    /// True when the engine has an image by this name.
    pub fn has_image(&self, name: &str) -> bool {
        self.rt.block_on(self.docker.inspect_image(name)).is_ok()
    }

    /// Removes an image by name, quietly.
    pub fn remove_image(&self, name: &str) {
        let _ = self.rt.block_on(
            self.docker.remove_image(
                name,
                Some(
                    bollard::query_parameters::RemoveImageOptionsBuilder::default()
                        .force(true)
                        .build(),
                ),
                None,
            ),
        );
    }

    /// Runs `cmd` in a new container of `image` with `gpus` and `files` (absolute path,
    /// bytes) placed in it before it starts, as a training job is run (`training_job`);
    /// waits up to `timeout`, killing it then, and removes the container. An engine that
    /// may not lift the locked-memory limit (one without CAP_SYS_RESOURCE, which runc needs
    /// for it) runs the container with its own limit, and the outcome says so. An error
    /// means the engine could not run it.
    pub fn run(
        &self,
        image: &str,
        cmd: &[&str],
        files: &[(&str, Vec<u8>)],
        gpus: &Gpus,
        timeout: Duration,
    ) -> Result<RunOutcome> {
        match self.run_with(image, cmd, files, gpus, timeout, training_job(true)) {
            // runc: "error setting rlimit type 8: operation not permitted" (8 is RLIMIT_MEMLOCK).
            Err(e) if e.to_string().contains("rlimit type 8") => {
                let mut out =
                    self.run_with(image, cmd, files, gpus, timeout, training_job(false))?;
                out.settings.withheld = Some(format!("--ulimit memlock=-1: {e}"));
                Ok(out)
            }
            other => other,
        }
    }

    fn run_with(
        &self,
        image: &str,
        cmd: &[&str],
        files: &[(&str, Vec<u8>)],
        gpus: &Gpus,
        timeout: Duration,
        (host, applied): (HostConfig, String),
    ) -> Result<RunOutcome> {
        let upload = files_tar(files)?;
        let requests = match gpus {
            Gpus::None => None,
            g => Some(vec![DeviceRequest {
                driver: Some("nvidia".into()),
                count: Some(match g {
                    Gpus::Count(n) => i64::from(*n),
                    _ => -1,
                }),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }]),
        };
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
            host_config: Some(HostConfig {
                device_requests: requests,
                ..host
            }),
            ..Default::default()
        };
        let docker = self.docker.clone();
        self.rt.block_on(async move {
            let created = docker
                .create_container(
                    None::<bollard::query_parameters::CreateContainerOptions>,
                    body,
                )
                .await
                .map_err(|e| {
                    Error::Environment(format!("cannot create a container of {image}: {e}"))
                })?;
            let id = created.id;
            let result = async {
                if let Some(tar) = upload {
                    docker
                        .upload_to_container(
                            &id,
                            Some(
                                bollard::query_parameters::UploadToContainerOptionsBuilder::new()
                                    .path("/")
                                    .build(),
                            ),
                            bollard::body_full(tar.into()),
                        )
                        .await
                        .map_err(|e| {
                            Error::Environment(format!("cannot copy files into the container: {e}"))
                        })?;
                }
                docker
                    .start_container(
                        &id,
                        None::<bollard::query_parameters::StartContainerOptions>,
                    )
                    .await
                    .map_err(|e| Error::Environment(format!("cannot start the container: {e}")))?;
                let mut wait = docker
                    .wait_container(&id, None::<bollard::query_parameters::WaitContainerOptions>);
                let mut timed_out = false;
                let exit_code = match tokio::time::timeout(timeout, wait.next()).await {
                    Err(_) => {
                        timed_out = true;
                        let _ = docker
                            .kill_container(
                                &id,
                                None::<bollard::query_parameters::KillContainerOptions>,
                            )
                            .await;
                        -1
                    }
                    Ok(Some(Ok(r))) => r.status_code,
                    // bollard reports a non-zero exit as an error carrying the code.
                    Ok(Some(Err(bollard::errors::Error::DockerContainerWaitError {
                        code,
                        ..
                    }))) => code,
                    Ok(Some(Err(e))) => {
                        return Err(Error::Environment(format!(
                            "waiting for the container: {e}"
                        )));
                    }
                    Ok(None) => {
                        return Err(Error::Environment(
                            "the engine ended the wait without a status".into(),
                        ));
                    }
                };
                let mut logs = docker.logs(
                    &id,
                    Some(
                        bollard::query_parameters::LogsOptionsBuilder::default()
                            .stdout(true)
                            .stderr(true)
                            .build(),
                    ),
                );
                let (mut stdout, mut stderr) = (String::new(), String::new());
                while let Some(chunk) = logs.next().await {
                    match chunk {
                        Ok(bollard::container::LogOutput::StdOut { message }) => {
                            stdout.push_str(&String::from_utf8_lossy(&message))
                        }
                        Ok(bollard::container::LogOutput::StdErr { message }) => {
                            stderr.push_str(&String::from_utf8_lossy(&message))
                        }
                        Ok(_) => {}
                        Err(e) => {
                            return Err(Error::Environment(format!(
                                "reading the container's output: {e}"
                            )));
                        }
                    }
                }
                Ok(RunOutcome {
                    exit_code,
                    stdout,
                    stderr,
                    timed_out,
                    settings: Settings {
                        applied,
                        withheld: None,
                    },
                })
            }
            .await;
            let _ = docker
                .remove_container(
                    &id,
                    Some(
                        bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                            .force(true)
                            .build(),
                    ),
                )
                .await;
            result
        })
    }
}

/// The files as a tar archive rooted at `/`, for the engine's upload; None when there are none.
fn files_tar(files: &[(&str, Vec<u8>)]) -> Result<Option<Vec<u8>>> {
    if files.is_empty() {
        return Ok(None);
    }
    let mut tar = tar::Builder::new(Vec::new());
    let mut dirs: Vec<String> = Vec::new();
    for (path, _) in files {
        let mut parent = std::path::Path::new(path.trim_start_matches('/')).parent();
        let mut chain = Vec::new();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            chain.push(format!("{}/", p.display()));
            parent = p.parent();
        }
        for d in chain.into_iter().rev() {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    for dir in &dirs {
        let mut header = tar::Header::new_gnu();
        header.set_size(0);
        header.set_mode(0o755);
        header.set_entry_type(tar::EntryType::Directory);
        tar.append_data(&mut header, dir, std::io::empty())
            .map_err(|e| Error::io(dir, e))?;
    }
    for (path, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, path.trim_start_matches('/'), bytes.as_slice())
            .map_err(|e| Error::io(path, e))?;
    }
    tar.into_inner()
        .map(Some)
        .map_err(|e| Error::io("files for the container", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Docker 20.10.24's layer store after loading a gpubake image: the directory of each
    /// layer in /var/lib/docker/image/fuse-overlayfs/layerdb/sha256/ is named by its chain
    /// ID and holds its `diff` and its `parent` (the chain ID below).
    #[test]
    fn chain_ids_are_the_engines_layer_names() {
        let diffs = [
            "sha256:f69ce001d7c5528ca1260a2fdc930c1b7ac84a24f4d7388c6d3a745ebbe92de5",
            "sha256:7f1ae6ebfffc8b7de2e8aade4e3b704ac0a804f5488975533f15c79ede34a265",
            "sha256:d63673799ab09f3371cf2d91bd15edfbbf83f41981bf928ae4606f0384870784",
        ]
        .map(String::from);
        assert_eq!(
            chain_ids(&diffs),
            [
                diffs[0].clone(),
                "sha256:003d26897d99dd7f9a2b4dd1d4964746201429351c0307bd4f5747e043c5ad2b".into(),
                "sha256:8c6879a2ab39ef6a6370e18efd93259d788075bde2957813dc4341973cc251f8".into(),
            ]
        );
        assert!(chain_ids(&[]).is_empty());
    }
}
