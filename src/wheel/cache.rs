//! The content-addressed wheel cache: each wheel a closure names is downloaded once, checked
//! against its sha256 every time it is used, and shared safely by gpubake processes.
//!
//! Layout under the root:
//!
//! ```text
//! wheels/sha256/ab/ab12…        the wheel's bytes, named by their sha256
//! wheels/sha256/ab/ab12….name   its original file name, for messages
//! wheels/sha256/ab/ab12….part   an interrupted download, resumed by the next fetch
//! wheels/sha256/ab/ab12….lock   locked while one process checks or writes this wheel
//! ```
//!
//! A file reaches its final name only by a rename after its bytes matched, so a crash or a
//! cut connection leaves at most a `.part` behind, never a wrong file under a trusted name.

use crate::error::{Error, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes read from the network (and from cached files) per step.
const CHUNK: usize = 256 * 1024;

/// A wheel the closure names.
#[derive(Clone, Debug)]
pub struct WheelRef {
    /// The distribution name, such as `torch`.
    pub name: String,
    /// The exact version, such as `2.9.1+cu128`.
    pub version: String,
    /// Where the wheel is downloaded from.
    pub url: String,
    /// Its size in bytes, when the lock records it.
    pub size: Option<u64>,
    /// The sha256 of its bytes, in lower-case hex.
    pub sha256: String,
}

impl WheelRef {
    /// The wheel's file name: the last segment of its URL, percent-decoded, because indexes
    /// write the `+` of a local version as `%2B`.
    pub fn file_name(&self) -> String {
        let path = self.url.split(['?', '#']).next().unwrap_or_default();
        let last = percent_decode(path.rsplit('/').next().unwrap_or_default());
        if last.is_empty() {
            format!("{}-{}.whl", self.name, self.version)
        } else {
            last
        }
    }

    fn label(&self) -> String {
        format!("{} {}", self.name, self.version)
    }
}

/// How [`WheelCache::fetch`] may get wheels.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// Use only what the cache holds; a missing wheel is an error instead of a download.
    pub offline: bool,
    /// How many wheels are downloaded (or re-hashed) at once; 0 counts as 1.
    pub jobs: usize,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            offline: false,
            jobs: 4,
        }
    }
}

/// Limits on talking to an index, so that a dead or stalled server ends in an error rather
/// than a hang.
#[derive(Clone, Debug)]
pub struct Network {
    /// The longest wait to resolve a host and to open a connection to it.
    pub connect_timeout: Duration,
    /// The longest wait for response headers and for each read of a body.
    pub read_timeout: Duration,
    /// How many more times a request is tried after a connection error, a timeout, a cut
    /// download or an HTTP 408, 429 or 5xx answer.
    pub retries: u32,
    /// The wait before the first retry; it doubles for each later one.
    pub backoff: Duration,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            retries: 3,
            backoff: Duration::from_secs(1),
        }
    }
}

/// A directory of wheels named by their sha256.
#[derive(Clone, Debug)]
pub struct WheelCache {
    root: PathBuf,
    network: Network,
    tally: Arc<Tally>,
}

/// What the fetches through one [`WheelCache`] did, for `build --timings`.
#[derive(Debug, Default)]
struct Tally {
    fetch_ns: AtomicU64,
    downloaded_files: AtomicU64,
    downloaded_bytes: AtomicU64,
    verified_files: AtomicU64,
    verified_bytes: AtomicU64,
    verify_ns: AtomicU64,
}

/// What the fetches through one cache did, so far.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct FetchTimes {
    /// Seconds the fetches took, from the first check to the last wheel in place.
    pub wall_s: f64,
    /// Wheels downloaded, each hashed as it arrived.
    pub downloaded_files: u64,
    /// Their bytes.
    pub downloaded_bytes: u64,
    /// Cached wheels hashed again before use.
    pub verified_files: u64,
    /// Their bytes.
    pub verified_bytes: u64,
    /// Seconds hashing cached wheels, summed over the threads that did it.
    pub verify_s: f64,
}

impl std::ops::Add for FetchTimes {
    type Output = FetchTimes;

    fn add(self, o: FetchTimes) -> FetchTimes {
        FetchTimes {
            wall_s: self.wall_s + o.wall_s,
            downloaded_files: self.downloaded_files + o.downloaded_files,
            downloaded_bytes: self.downloaded_bytes + o.downloaded_bytes,
            verified_files: self.verified_files + o.verified_files,
            verified_bytes: self.verified_bytes + o.verified_bytes,
            verify_s: self.verify_s + o.verify_s,
        }
    }
}

impl WheelCache {
    /// $GPUBAKE_CACHE_DIR, else $XDG_CACHE_HOME/gpubake, else $HOME/.cache/gpubake.
    pub fn default_root() -> Result<PathBuf> {
        crate::fsutil::cache_root()
    }

    /// Opens (creating it if needed) the cache under `root`.
    pub fn open(root: PathBuf) -> Result<Self> {
        let wheels = root.join("wheels").join("sha256");
        fs::create_dir_all(&wheels).map_err(|e| Error::writing(&wheels, e))?;
        Ok(WheelCache {
            root,
            network: Network::default(),
            tally: Arc::default(),
        })
    }

    /// What the fetches through this cache have done so far.
    pub fn times(&self) -> FetchTimes {
        let t = &self.tally;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FetchTimes {
            wall_s: get(&t.fetch_ns) as f64 / 1e9,
            downloaded_files: get(&t.downloaded_files),
            downloaded_bytes: get(&t.downloaded_bytes),
            verified_files: get(&t.verified_files),
            verified_bytes: get(&t.verified_bytes),
            verify_s: get(&t.verify_ns) as f64 / 1e9,
        }
    }

    /// The same cache with other network limits (tests use short ones).
    pub fn with_network(mut self, network: Network) -> Self {
        self.network = network;
        self
    }

    /// The directory the cache lives in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where a wheel with this sha256 lives: `{root}/wheels/sha256/{first 2 hex}/{hex}`.
    pub fn path(&self, sha256: &str) -> PathBuf {
        let hex = sha256.to_ascii_lowercase();
        // A malformed hash still gets a path; fetch refuses it before using one.
        let fan = hex.get(..2).unwrap_or("__").to_string();
        self.root.join("wheels").join("sha256").join(fan).join(hex)
    }

    /// The original file name of the cached wheel with this sha256, when it was recorded.
    pub fn file_name(&self, sha256: &str) -> Option<String> {
        let text = fs::read_to_string(self.sibling(sha256, "name")).ok()?;
        let name = text.trim();
        (!name.is_empty()).then(|| name.to_string())
    }

    /// Makes every wheel available, verified, and returns their paths in the same order.
    ///
    /// Cached files are hashed again on every call: a corrupt one is removed and downloaded
    /// again, or reported missing when offline. Missing wheels are downloaded `jobs` at a
    /// time into a `.part` file that a later call resumes with an HTTP Range request, and
    /// renamed into place only after the sha256 (and size) of the whole file matched.
    pub fn fetch(&self, wheels: &[WheelRef], opts: &FetchOptions) -> Result<Vec<PathBuf>> {
        self.fetch_each(wheels, opts, &|_, _| {})
    }

    /// [`WheelCache::fetch`], calling `ready` with each wheel's index and path as soon as it
    /// is verified in place, so that its user can start while the rest arrive.
    pub fn fetch_each(
        &self,
        wheels: &[WheelRef],
        opts: &FetchOptions,
        ready: &(dyn Fn(usize, &Path) + Sync),
    ) -> Result<Vec<PathBuf>> {
        for wheel in wheels {
            check_sha256(wheel)?;
        }
        if wheels.is_empty() {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let fetched = self.fetch_all(wheels, opts, ready);
        let ns = started.elapsed().as_nanos() as u64;
        self.tally.fetch_ns.fetch_add(ns, Ordering::Relaxed);
        fetched
    }

    fn fetch_all(
        &self,
        wheels: &[WheelRef],
        opts: &FetchOptions,
        ready: &(dyn Fn(usize, &Path) + Sync),
    ) -> Result<Vec<PathBuf>> {
        let target = if io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let run = Run {
            cache: self,
            http: crate::net::client(self.network.connect_timeout, self.network.read_timeout)?,
            offline: opts.offline,
            progress: MultiProgress::with_draw_target(target),
            stop: AtomicBool::new(false),
        };
        let slots: Vec<Mutex<Option<Result<Outcome>>>> =
            wheels.iter().map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        let threads = opts.jobs.clamp(1, wheels.len());
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(wheel) = wheels.get(i) else { break };
                        if run.stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let outcome = run.ensure(wheel);
                        if let Ok(Outcome::Ready(path)) = &outcome {
                            ready(i, path);
                        }
                        if outcome.is_err() {
                            // One failure fails the fetch: stop the rest early, leaving their
                            // `.part` files for the next call to resume.
                            run.stop.store(true, Ordering::Relaxed);
                        }
                        *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
                    }
                });
            }
        });

        let mut paths = Vec::with_capacity(wheels.len());
        let mut missing = Vec::new();
        let mut failed = Vec::new();
        for (wheel, slot) in wheels.iter().zip(slots) {
            match slot.into_inner().unwrap_or_else(|p| p.into_inner()) {
                Some(Ok(Outcome::Ready(path))) => paths.push(path),
                Some(Ok(Outcome::Missing { corrupt })) => missing.push((wheel, corrupt)),
                Some(Err(e)) => failed.push((wheel, e)),
                // Not started or stopped because another wheel failed.
                Some(Ok(Outcome::Stopped)) | None => {}
            }
        }
        if !failed.is_empty() {
            return Err(first_failure(failed));
        }
        // A cached file under the pylock's hash whose bytes hash otherwise: the pylock's hash
        // is wrong or the entry was replaced. Either way the input is at fault, not the
        // machine, so it is bad input naming both hashes rather than a missing wheel.
        if let Some((wheel, Some(actual))) = missing.iter().find(|(_, c)| c.is_some()) {
            return Err(Error::Wheel {
                wheel: wheel.label(),
                message: format!(
                    "--offline: the pylock names sha256 {}, but the cache's file under that hash \
                     ({}) is sha256 {actual}: the pylock's hash is wrong or the cache entry was \
                     replaced; the entry was removed\n  help: check the hash against the index, \
                     or run without --offline to download the wheel the pylock names",
                    wheel.sha256,
                    self.path(&wheel.sha256).display()
                ),
            });
        }
        if !missing.is_empty() {
            return Err(offline_error(&self.root, &missing));
        }
        Ok(paths)
    }

    /// What no live process owns in the cache: interrupted downloads (`.part` files whose
    /// wheel lock is free, which the next fetch of that wheel would resume) and temporary
    /// files killed writers left. `gpubake gc --cache` removes them; wheels themselves stay.
    pub fn leftovers(&self) -> crate::interrupt::Leftovers {
        let mut found = crate::interrupt::Leftovers::default();
        let fans = fs::read_dir(self.root.join("wheels").join("sha256"));
        for fan in fans.into_iter().flatten().flatten() {
            let dir = fan.path();
            found
                .files
                .extend(crate::interrupt::temp_leftovers(&dir, &|_| false).files);
            for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                let Some(sha) = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_suffix(".part"))
                else {
                    continue;
                };
                // The lock is taken only to see that nobody holds it, then let go.
                // A part without a lock file is nobody's: a fetch makes the lock first.
                let free =
                    File::open(self.sibling(sha, "lock")).map_or(true, |f| f.try_lock().is_ok());
                let size = entry.metadata().map_or(0, |m| m.len());
                if free {
                    found.files.push((path, size));
                }
            }
        }
        found.files.sort();
        found
    }

    /// `path(sha256)` with `.ext` appended: the sidecar, part and lock files of a wheel.
    fn sibling(&self, sha256: &str, ext: &str) -> PathBuf {
        let mut name: OsString = self.path(sha256).into_os_string();
        name.push(".");
        name.push(ext);
        PathBuf::from(name)
    }
}

fn check_sha256(wheel: &WheelRef) -> Result<()> {
    let ok = wheel.sha256.len() == 64 && wheel.sha256.bytes().all(|b| b.is_ascii_hexdigit());
    if ok {
        Ok(())
    } else {
        Err(Error::Wheel {
            wheel: wheel.label(),
            message: format!(
                "sha256 `{}` is not 64 hex digits ({})",
                wheel.sha256, wheel.url
            ),
        })
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| {
            std::str::from_utf8(h)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        });
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The first byte offset of a `Content-Range: bytes START-END/TOTAL` header.
fn content_range_start(value: &str) -> Option<u64> {
    let spec = value.trim().strip_prefix("bytes")?.trim_start();
    spec.split('-').next()?.trim().parse().ok()
}

/// What one `fetch` call shares between its worker threads.
struct Run<'a> {
    cache: &'a WheelCache,
    http: reqwest::blocking::Client,
    offline: bool,
    progress: MultiProgress,
    stop: AtomicBool,
}

enum Outcome {
    /// The wheel is at this path and its bytes match.
    Ready(PathBuf),
    /// Offline and not cached; `corrupt` is the hash of a bad cached copy that was removed.
    Missing { corrupt: Option<String> },
    /// Given up because another wheel failed.
    Stopped,
}

/// How one HTTP request for a wheel ended.
enum Attempt {
    /// Every byte the server sent is in the `.part` file.
    Complete {
        sha256: String,
        len: u64,
        /// The `.part` held bytes from an earlier request.
        resumed: bool,
        /// The server sent more than the lock's size; reading stopped there.
        overran: bool,
    },
    Stopped,
}

/// Why one HTTP request for a wheel failed.
enum Failure {
    /// Worth trying again after a pause: the connection, a timeout, a 5xx answer.
    Transient(String),
    /// The `.part` cannot be resumed; start again from zero.
    Restart(String),
    /// Trying again would not help.
    Fatal(Error),
}

impl Run<'_> {
    /// Makes one wheel available under its final path, holding its lock throughout.
    fn ensure(&self, wheel: &WheelRef) -> Result<Outcome> {
        let sha = wheel.sha256.to_ascii_lowercase();
        let target = self.cache.path(&sha);
        if let Some(dir) = target.parent() {
            fs::create_dir_all(dir).map_err(|e| Error::writing(dir, e))?;
        }
        let _lock = self.lock(wheel, &sha)?;
        let mut corrupt = None;
        let hashing = Instant::now();
        let hashed = hash_file(&target);
        if let Ok((_, len)) = &hashed {
            let t = &self.cache.tally;
            t.verified_files.fetch_add(1, Ordering::Relaxed);
            t.verified_bytes.fetch_add(*len, Ordering::Relaxed);
            let ns = hashing.elapsed().as_nanos() as u64;
            t.verify_ns.fetch_add(ns, Ordering::Relaxed);
        }
        match hashed {
            Ok((actual, _)) if actual == sha => return Ok(Outcome::Ready(target)),
            Ok((actual, len)) => {
                fs::remove_file(&target).map_err(|e| Error::writing(&target, e))?;
                self.progress.suspend(|| {
                    eprintln!(
                        "warning: {}: the cached copy is corrupt ({len} bytes, sha256 {actual}, \
                         expected {sha}); removed it",
                        target.display()
                    )
                });
                corrupt = Some(actual);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::reading(&target, e)),
        }
        if self.offline {
            return Ok(Outcome::Missing { corrupt });
        }
        let bar = self.progress.add(ProgressBar::new(wheel.size.unwrap_or(0)));
        bar.set_style(
            ProgressStyle::with_template(
                "[{bar:25}] {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12} {wide_msg}",
            )
            .expect("the template is valid")
            .progress_chars("=> "),
        );
        bar.set_message(wheel.file_name());
        let outcome = self.download(wheel, &sha, &target, &bar);
        bar.finish_and_clear();
        self.progress.remove(&bar);
        outcome
    }

    /// Takes the wheel's lock, so that two processes never write the same `.part`.
    fn lock(&self, wheel: &WheelRef, sha: &str) -> Result<File> {
        let path = self.cache.sibling(sha, "lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::writing(&path, e))?;
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => return Err(Error::io(&path, e)),
        }
        // Another process is checking or downloading this wheel; its downloads are bounded by
        // the same timeouts, so waiting ends.
        let spinner = self.progress.add(ProgressBar::new_spinner());
        spinner.set_message(format!(
            "{}: waiting for another gpubake process using this cache",
            wheel.file_name()
        ));
        spinner.enable_steady_tick(Duration::from_millis(200));
        let locked = file.lock();
        spinner.finish_and_clear();
        self.progress.remove(&spinner);
        locked.map_err(|e| Error::io(&path, e))?;
        Ok(file)
    }

    fn download(
        &self,
        wheel: &WheelRef,
        sha: &str,
        target: &Path,
        bar: &ProgressBar,
    ) -> Result<Outcome> {
        let part = self.cache.sibling(sha, "part");
        let network = &self.cache.network;
        let mut failures = 0u32;
        // A resumed file that does not verify may owe it to a stale prefix: one fresh start
        // from zero is allowed before the mismatch counts.
        let mut restarted = false;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(Outcome::Stopped);
            }
            let reason = match self.attempt(wheel, &part, bar) {
                Ok(Attempt::Stopped) => return Ok(Outcome::Stopped),
                Ok(Attempt::Complete {
                    sha256,
                    len,
                    resumed,
                    overran,
                }) => {
                    let size_ok = wheel.size.is_none_or(|size| size == len);
                    if sha256 == sha && size_ok && !overran {
                        self.place(wheel, sha, &part, target)?;
                        let t = &self.cache.tally;
                        t.downloaded_files.fetch_add(1, Ordering::Relaxed);
                        t.downloaded_bytes.fetch_add(len, Ordering::Relaxed);
                        return Ok(Outcome::Ready(target.to_path_buf()));
                    }
                    remove_if_there(&part)?;
                    if resumed && !restarted {
                        restarted = true;
                        continue;
                    }
                    return Err(mismatch(wheel, sha, &sha256, len, overran));
                }
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Restart(reason)) => {
                    remove_if_there(&part)?;
                    if !restarted {
                        restarted = true;
                        continue;
                    }
                    reason
                }
                Err(Failure::Transient(reason)) => reason,
            };
            failures += 1;
            if failures > network.retries {
                return Err(Error::Environment(format!(
                    "{}: could not download {}: {reason} (tried {failures} time{})",
                    wheel.label(),
                    wheel.url,
                    if failures == 1 { "" } else { "s" }
                )));
            }
            bar.set_message(format!("{} (retrying: {reason})", wheel.file_name()));
            let factor = 1u32 << (failures - 1).min(6);
            self.pause(network.backoff.saturating_mul(factor));
            bar.set_message(wheel.file_name());
        }
    }

    /// One HTTP request, resuming the `.part` when it holds bytes, streamed through the hash.
    fn attempt(
        &self,
        wheel: &WheelRef,
        part: &Path,
        bar: &ProgressBar,
    ) -> std::result::Result<Attempt, Failure> {
        let io_fatal = |e: io::Error| Failure::Fatal(Error::writing(part, e));
        let read_fatal = |e: io::Error| Failure::Fatal(Error::reading(part, e));
        let mut have = match fs::metadata(part) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(read_fatal(e)),
        };
        if let Some(size) = wheel.size {
            if have > size {
                remove_if_there(part).map_err(Failure::Fatal)?;
                have = 0;
            } else if have == size && size > 0 {
                // An earlier run got every byte but stopped before the rename.
                let (sha256, len) = hash_file(part).map_err(read_fatal)?;
                return Ok(Attempt::Complete {
                    sha256,
                    len,
                    resumed: true,
                    overran: false,
                });
            }
        }

        let mut request = self.http.get(&wheel.url);
        if have > 0 {
            request = request.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let mut response = request.send().map_err(|e| classify(wheel, e))?;
        let status = response.status();
        let code = status.as_u16();
        let mut hasher = Sha256::new();
        let (mut file, mut len) = match code {
            206 if have > 0 => {
                let range = response
                    .headers()
                    .get(reqwest::header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok());
                if range.and_then(content_range_start) != Some(have) {
                    return Err(Failure::Restart(format!(
                        "asked for bytes {have}- and got Content-Range {}",
                        range.unwrap_or("(none)")
                    )));
                }
                let mut file = OpenOptions::new()
                    .read(true)
                    .append(true)
                    .open(part)
                    .map_err(io_fatal)?;
                let len = hash_into(&mut file, &mut hasher).map_err(read_fatal)?;
                (file, len)
            }
            // A plain 200 also answers a Range request from a server that ignores ranges:
            // the body is the whole file, so the part starts over.
            200 => (File::create(part).map_err(io_fatal)?, 0),
            416 if have > 0 => {
                return Err(Failure::Restart(format!(
                    "the server refused the range bytes={have}-"
                )));
            }
            408 | 429 | 500..=599 => {
                return Err(Failure::Transient(format!(
                    "the server answered HTTP {status}"
                )));
            }
            _ => {
                return Err(Failure::Fatal(Error::Wheel {
                    wheel: wheel.label(),
                    message: format!("{}: the server answered HTTP {status}", wheel.url),
                }));
            }
        };
        let resumed = len > 0;
        let body_len = response.content_length();
        if let Some(total) = wheel.size.or(body_len.map(|n| n + len)) {
            bar.set_length(total);
        }
        bar.set_position(len);

        let mut buf = vec![0u8; CHUNK];
        let mut overran = false;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(Attempt::Stopped);
            }
            let n = match response.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // The bytes so far are already in the part, for the next attempt to resume.
                Err(e) => {
                    return Err(Failure::Transient(format!(
                        "the connection failed after {len} bytes: {e}"
                    )));
                }
            };
            file.write_all(&buf[..n]).map_err(io_fatal)?;
            hasher.update(&buf[..n]);
            len += n as u64;
            bar.set_position(len);
            if wheel.size.is_some_and(|size| len > size) {
                // A wrong file can be arbitrarily large; what arrived already proves it wrong.
                overran = true;
                break;
            }
        }
        file.sync_all().map_err(io_fatal)?;
        Ok(Attempt::Complete {
            sha256: hex::encode(hasher.finalize()),
            len,
            resumed,
            overran,
        })
    }

    /// Moves a verified `.part` to its final name, recording the original file name first so
    /// that a wheel under its final name always has one.
    fn place(&self, wheel: &WheelRef, sha: &str, part: &Path, target: &Path) -> Result<()> {
        crate::fsutil::write_atomic(
            &self.cache.sibling(sha, "name"),
            format!("{}\n", wheel.file_name()).as_bytes(),
        )?;
        fs::rename(part, target).map_err(|e| Error::writing(target, e))
    }

    /// Sleeps for `wait`, waking early when another wheel failed.
    fn pause(&self, wait: Duration) {
        let until = Instant::now() + wait;
        while !self.stop.load(Ordering::Relaxed) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }
}

fn classify(wheel: &WheelRef, error: reqwest::Error) -> Failure {
    let text = crate::net::chain(&error);
    if error.is_builder() || error.is_redirect() {
        Failure::Fatal(Error::Wheel {
            wheel: wheel.label(),
            message: format!("cannot download `{}`: {text}", wheel.url),
        })
    } else if crate::net::is_certificate_refusal(&error) {
        tls_failure(wheel, &text)
    } else {
        Failure::Transient(text)
    }
}

fn tls_failure(wheel: &WheelRef, text: &str) -> Failure {
    Failure::Fatal(Error::Environment(format!(
        "{}: could not download {}: {text}\n  help: if a proxy intercepts TLS here, add its CA to \
         the system trust store or point SSL_CERT_FILE at a bundle that has it",
        wheel.label(),
        wheel.url
    )))
}

fn mismatch(wheel: &WheelRef, expected: &str, actual: &str, len: u64, overran: bool) -> Error {
    let size = match wheel.size {
        Some(size) if overran => {
            format!(
                "; the server sent more than the {size} bytes the lock names (hash of the first {len})"
            )
        }
        Some(size) if size != len => format!("; got {len} bytes, expected {size}"),
        _ => String::new(),
    };
    Error::Wheel {
        wheel: wheel.label(),
        message: format!(
            "{} does not match the lock: expected sha256 {expected}, got sha256 {actual}{size}; \
             the download was discarded",
            wheel.url
        ),
    }
}

/// The first failure in the order of the wheels, noting how many others failed with it.
fn first_failure(failed: Vec<(&WheelRef, Error)>) -> Error {
    let others: Vec<String> = failed.iter().skip(1).map(|(w, _)| w.label()).collect();
    let mut failed = failed.into_iter();
    let (_, first) = failed.next().expect("called with at least one failure");
    if others.is_empty() {
        return first;
    }
    let note = format!("\n  (also failed: {})", others.join(", "));
    match first {
        Error::Wheel { wheel, message } => Error::Wheel {
            wheel,
            message: message + &note,
        },
        Error::Environment(message) => Error::Environment(message + &note),
        other => other,
    }
}

fn offline_error(root: &Path, missing: &[(&WheelRef, Option<String>)]) -> Error {
    // The cache holds the OS packages' .debs too.
    let noun = if missing.iter().all(|(w, _)| w.file_name().ends_with(".deb")) {
        ".deb"
    } else {
        "wheel"
    };
    let mut text = format!(
        "--offline: {} {noun}{} not in the cache at {}:",
        missing.len(),
        if missing.len() == 1 { " is" } else { "s are" },
        root.display()
    );
    for (wheel, corrupt) in missing {
        text.push_str(&format!(
            "\n  {} ({}, sha256 {})",
            wheel.label(),
            wheel.file_name(),
            wheel.sha256
        ));
        if let Some(actual) = corrupt {
            text.push_str(&format!(
                " [the cached copy was corrupt (sha256 {actual}) and was removed]"
            ));
        }
    }
    text.push_str(
        "\n  help: fill the cache by running the same build without --offline on a machine that \
         reaches the index, with GPUBAKE_CACHE_DIR pointing at this cache (or copy that cache here)",
    );
    Error::Environment(text)
}

fn remove_if_there(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Error::writing(path, e)),
        _ => Ok(()),
    }
}

/// The sha256 (hex) and length of a file.
fn hash_file(path: &Path) -> io::Result<(String, u64)> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let len = hash_into(&mut file, &mut hasher)?;
    Ok((hex::encode(hasher.finalize()), len))
}

/// Feeds a reader to the hasher until its end; returns how many bytes it read.
fn hash_into(reader: &mut impl Read, hasher: &mut Sha256) -> io::Result<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut len = 0u64;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(len),
            Ok(n) => {
                hasher.update(&buf[..n]);
                len += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wheel(url: &str) -> WheelRef {
        WheelRef {
            name: "torch".into(),
            version: "2.9.1+cu128".into(),
            url: url.into(),
            size: None,
            sha256: "ab".repeat(32),
        }
    }

    #[test]
    fn file_names_come_from_the_url_percent_decoded() {
        let w = wheel(
            "https://download.pytorch.org/whl/cu128/torch-2.9.1%2Bcu128-cp312-cp312-manylinux_2_28_x86_64.whl#sha256=00",
        );
        assert_eq!(
            w.file_name(),
            "torch-2.9.1+cu128-cp312-cp312-manylinux_2_28_x86_64.whl"
        );
        assert_eq!(wheel("https://x/").file_name(), "torch-2.9.1+cu128.whl");
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }

    #[test]
    fn content_range_start_is_read() {
        assert_eq!(content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(content_range_start("bytes */200"), None);
        assert_eq!(content_range_start("items 1-2/3"), None);
    }

    #[test]
    fn paths_fan_out_by_the_first_two_hex_digits() {
        let cache = WheelCache {
            root: PathBuf::from("/cache"),
            network: Network::default(),
            tally: Arc::default(),
        };
        let sha = format!("AB{}", "0".repeat(62));
        let path = cache.path(&sha);
        assert_eq!(
            path,
            PathBuf::from(format!("/cache/wheels/sha256/ab/ab{}", "0".repeat(62)))
        );
        assert_eq!(
            cache.sibling(&sha, "part"),
            PathBuf::from(format!("{}.part", path.display()))
        );
    }

    #[test]
    fn malformed_hashes_are_refused_before_any_download() {
        let dir = tempfile::tempdir().unwrap();
        let cache = WheelCache::open(dir.path().to_path_buf()).unwrap();
        let mut w = wheel("http://127.0.0.1:9/x.whl");
        w.sha256 = "abc".into();
        let err = cache.fetch(&[w], &FetchOptions::default()).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("not 64 hex digits"), "{err}");
    }
}
