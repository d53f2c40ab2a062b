//! The wheel cache against a tiny HTTP/1.1 server on 127.0.0.1 that can cut connections,
//! ignore Range, serve wrong bytes or stall, plus one real download from PyPI.

use gpubake::wheel::cache::{FetchOptions, Network, WheelCache, WheelRef};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the server answers the next requests.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Honours `Range: bytes=N-` with 206.
    Normal,
    /// Promises the whole body, sends this many bytes and closes; then back to `Normal`.
    CutOnce(usize),
    /// Answers every request with 200 and the whole file.
    IgnoreRange,
    /// The right length with every byte flipped.
    WrongBytes,
    /// The file followed by extra bytes.
    Longer,
    /// This status and no body.
    Status(u16),
    /// Sends headers, then nothing for two seconds.
    Stall,
    /// Holds each request until another one is in flight too (at most three seconds).
    WaitForPeer,
}

#[derive(Clone, Debug)]
struct Seen {
    path: String,
    range: Option<String>,
}

#[derive(Default)]
struct State {
    files: Mutex<HashMap<String, Vec<u8>>>,
    mode: Mutex<Option<Mode>>,
    seen: Mutex<Vec<Seen>>,
    active: AtomicUsize,
    peak: AtomicUsize,
}

struct Server {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let state = state.clone();
                            std::thread::spawn(move || serve(stream, &state));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        Err(_) => break,
                    }
                }
            })
        };
        Server {
            addr,
            state,
            stop,
            accept: Some(accept),
        }
    }

    /// Serves `bytes` at `/name` and returns the wheel the lock would name for it.
    fn wheel(&self, name: &str, bytes: &[u8]) -> WheelRef {
        let path = format!("/files/{name}-1.0-py3-none-any.whl");
        self.state
            .files
            .lock()
            .unwrap()
            .insert(path.clone(), bytes.to_vec());
        WheelRef {
            name: name.into(),
            version: "1.0".into(),
            url: format!("http://{}{path}", self.addr),
            size: Some(bytes.len() as u64),
            sha256: sha256(bytes),
        }
    }

    fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().unwrap() = Some(mode);
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    fn peak(&self) -> usize {
        self.state.peak.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

fn serve(mut stream: TcpStream, state: &State) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let Some(head) = read_head(&mut stream) else {
        return;
    };
    let mut lines = head.lines();
    let path = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("/")
        .to_string();
    let range = lines.find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("range")
            .then(|| v.trim().to_string())
    });
    state.seen.lock().unwrap().push(Seen {
        path: path.clone(),
        range: range.clone(),
    });
    let now = state.active.fetch_add(1, Ordering::SeqCst) + 1;
    state.peak.fetch_max(now, Ordering::SeqCst);
    let mode = state.mode.lock().unwrap().unwrap_or(Mode::Normal);
    if mode == Mode::WaitForPeer {
        let until = Instant::now() + Duration::from_secs(3);
        while state.active.load(Ordering::SeqCst) < 2 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let file = state.files.lock().unwrap().get(&path).cloned();
    let _ = respond(&mut stream, state, mode, file, range.as_deref());
    // Let the client see every byte before the close.
    let _ = stream.flush();
    let _ = stream.shutdown(std::net::Shutdown::Write);
    state.active.fetch_sub(1, Ordering::SeqCst);
}

fn respond(
    stream: &mut TcpStream,
    state: &State,
    mode: Mode,
    file: Option<Vec<u8>>,
    range: Option<&str>,
) -> std::io::Result<()> {
    let head = |status: &str, extra: &str, len: usize| {
        format!("HTTP/1.1 {status}\r\nContent-Length: {len}\r\nConnection: close\r\n{extra}\r\n")
    };
    if let Mode::Status(code) = mode {
        return stream.write_all(head(&format!("{code} Oops"), "", 0).as_bytes());
    }
    let Some(mut file) = file else {
        return stream.write_all(head("404 Not Found", "", 0).as_bytes());
    };
    match mode {
        Mode::WrongBytes => file.iter_mut().for_each(|b| *b ^= 0xff),
        Mode::Longer => file.extend(std::iter::repeat_n(7u8, 1000)),
        _ => {}
    }
    let start = range
        .filter(|_| mode != Mode::IgnoreRange)
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok());
    let (status, extra, body) = match start {
        Some(n) if n >= file.len() => {
            let extra = format!("Content-Range: bytes */{}\r\n", file.len());
            return stream.write_all(head("416 Range Not Satisfiable", &extra, 0).as_bytes());
        }
        Some(n) => (
            "206 Partial Content",
            format!(
                "Content-Range: bytes {n}-{}/{}\r\n",
                file.len() - 1,
                file.len()
            ),
            &file[n..],
        ),
        None => ("200 OK", String::new(), &file[..]),
    };
    stream.write_all(head(status, &extra, body.len()).as_bytes())?;
    match mode {
        Mode::CutOnce(k) => {
            *state.mode.lock().unwrap() = Some(Mode::Normal);
            stream.write_all(&body[..k.min(body.len())])
        }
        Mode::Stall => {
            stream.flush()?;
            std::thread::sleep(Duration::from_secs(2));
            Ok(())
        }
        _ => stream.write_all(body),
    }
}

/// Reads up to the blank line that ends the request head (bounded to 64 KiB).
fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while head.len() < 64 * 1024 {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
        if head.ends_with(b"\r\n\r\n") {
            return String::from_utf8(head).ok();
        }
    }
    None
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Deterministic bytes, larger than one read chunk of the cache.
fn content(seed: u32, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Short limits so that failures end in well under a second.
fn quick(retries: u32) -> Network {
    Network {
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_millis(500),
        retries,
        backoff: Duration::from_millis(10),
    }
}

fn cache_in(dir: &Path, retries: u32) -> WheelCache {
    WheelCache::open(dir.to_path_buf())
        .unwrap()
        .with_network(quick(retries))
}

/// Like `cache_in`, with time for a server that holds requests for up to three seconds.
fn patient_cache_in(dir: &Path) -> WheelCache {
    WheelCache::open(dir.to_path_buf())
        .unwrap()
        .with_network(Network {
            read_timeout: Duration::from_secs(10),
            ..quick(0)
        })
}

fn online() -> FetchOptions {
    FetchOptions::default()
}

fn offline() -> FetchOptions {
    FetchOptions {
        offline: true,
        jobs: 4,
    }
}

fn part_of(cache: &WheelCache, wheel: &WheelRef) -> std::path::PathBuf {
    let mut p = cache.path(&wheel.sha256).into_os_string();
    p.push(".part");
    p.into()
}

#[test]
fn a_download_lands_at_its_hash_path_and_is_reused() {
    let server = Server::start();
    let bytes = content(1, 700_000);
    let wheel = server.wheel("alpha", &bytes);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 0);

    let paths = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap();
    assert_eq!(paths, vec![cache.path(&wheel.sha256)]);
    let expected = dir
        .path()
        .join("wheels/sha256")
        .join(&wheel.sha256[..2])
        .join(&wheel.sha256);
    assert_eq!(paths[0], expected);
    assert_eq!(std::fs::read(&paths[0]).unwrap(), bytes);
    assert_eq!(
        cache.file_name(&wheel.sha256).as_deref(),
        Some("alpha-1.0-py3-none-any.whl")
    );
    assert!(!part_of(&cache, &wheel).exists());

    // A cached wheel is hashed again but not downloaded again.
    assert_eq!(cache.fetch(&[wheel], &online()).unwrap(), paths);
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/files/alpha-1.0-py3-none-any.whl");
}

#[test]
fn a_cut_download_leaves_a_part_that_the_next_fetch_resumes_with_range() {
    let server = Server::start();
    let bytes = content(2, 500_000);
    let wheel = server.wheel("beta", &bytes);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 0);
    let cut = 123_457;
    server.set_mode(Mode::CutOnce(cut));

    let err = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap_err();
    assert_eq!(err.exit_code(), 3, "{err}");
    assert!(err.to_string().contains(&wheel.url), "{err}");
    assert!(!cache.path(&wheel.sha256).exists());
    let part = part_of(&cache, &wheel);
    assert_eq!(std::fs::read(&part).unwrap(), &bytes[..cut]);

    let paths = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap();
    assert_eq!(std::fs::read(&paths[0]).unwrap(), bytes);
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].range, None);
    assert_eq!(
        seen[1].range.as_deref(),
        Some(format!("bytes={cut}-").as_str())
    );
    assert!(!part.exists());
}

#[test]
fn a_cut_download_is_resumed_within_one_fetch_when_retries_are_allowed() {
    let server = Server::start();
    let bytes = content(3, 400_000);
    let wheel = server.wheel("gamma", &bytes);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 2);
    server.set_mode(Mode::CutOnce(300_001));

    let paths = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap();
    assert_eq!(std::fs::read(&paths[0]).unwrap(), bytes);
    let ranges: Vec<_> = server.seen().into_iter().map(|s| s.range).collect();
    assert_eq!(ranges, vec![None, Some("bytes=300001-".to_string())]);
}

#[test]
fn a_server_that_ignores_range_still_gives_a_correct_file() {
    let server = Server::start();
    let bytes = content(4, 600_000);
    let wheel = server.wheel("delta", &bytes);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 0);
    server.set_mode(Mode::CutOnce(200_000));
    cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap_err();
    assert_eq!(
        std::fs::metadata(part_of(&cache, &wheel)).unwrap().len(),
        200_000
    );

    server.set_mode(Mode::IgnoreRange);
    let paths = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap();
    assert_eq!(std::fs::read(&paths[0]).unwrap(), bytes);
    let seen = server.seen();
    assert_eq!(seen[1].range.as_deref(), Some("bytes=200000-"));
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[test]
fn wrong_bytes_are_refused_naming_both_hashes_and_nothing_is_cached() {
    let server = Server::start();
    let bytes = content(5, 300_000);
    let wheel = server.wheel("epsilon", &bytes);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 3);
    server.set_mode(Mode::WrongBytes);

    let err = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap_err();
    let text = err.to_string();
    assert_eq!(err.exit_code(), 2, "{text}");
    let flipped: Vec<u8> = bytes.iter().map(|b| b ^ 0xff).collect();
    for needle in [
        "epsilon",
        "1.0",
        wheel.url.as_str(),
        wheel.sha256.as_str(),
        &sha256(&flipped),
    ] {
        assert!(text.contains(needle), "`{needle}` missing from: {text}");
    }
    assert!(!cache.path(&wheel.sha256).exists());
    assert!(!part_of(&cache, &wheel).exists());
    // A mismatch is not retried: the same bytes would come again.
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn a_server_sending_more_than_the_lock_says_is_refused() {
    let server = Server::start();
    let bytes = content(6, 1000);
    let wheel = server.wheel("zeta", &bytes);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 0);
    server.set_mode(Mode::Longer);

    let err = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap_err();
    assert_eq!(err.exit_code(), 2, "{err}");
    assert!(
        err.to_string().contains("more than the 1000 bytes"),
        "{err}"
    );
    assert!(!cache.path(&wheel.sha256).exists());
}

#[test]
fn a_corrupt_cached_file_is_detected_and_fetched_again() {
    let server = Server::start();
    let bytes = content(7, 300_000);
    let wheel = server.wheel("eta", &bytes);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 0);
    let path = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap()[0]
        .clone();

    let mut damaged = bytes.clone();
    damaged[1000] ^= 1;
    std::fs::write(&path, &damaged).unwrap();
    let again = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap();
    assert_eq!(again, vec![path.clone()]);
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    assert_eq!(server.seen().len(), 2);

    // Offline, a copy whose bytes are not the pylock's hash cannot be replaced: it is removed,
    // and since the pylock's hash or the entry is wrong (nothing is missing from the machine),
    // it is bad input naming both hashes.
    std::fs::write(&path, &damaged).unwrap();
    let err = cache
        .fetch(std::slice::from_ref(&wheel), &offline())
        .unwrap_err();
    assert_eq!(err.exit_code(), 2, "{err}");
    assert!(err.to_string().contains(&sha256(&damaged)), "{err}");
    assert!(err.to_string().contains(&wheel.sha256), "{err}");
    assert!(
        err.to_string().contains("the pylock's hash is wrong"),
        "{err}"
    );
    assert!(!path.exists());
    assert_eq!(server.seen().len(), 2);
}

#[test]
fn offline_with_missing_wheels_is_exit_3_naming_each() {
    let server = Server::start();
    let cached = server.wheel("theta", &content(8, 5000));
    let missing_a = server.wheel("iota", &content(9, 5000));
    let missing_b = server.wheel("kappa", &content(10, 5000));
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 0);
    cache
        .fetch(std::slice::from_ref(&cached), &online())
        .unwrap();

    let err = cache
        .fetch(&[cached, missing_a.clone(), missing_b.clone()], &offline())
        .unwrap_err();
    let text = err.to_string();
    assert_eq!(err.exit_code(), 3, "{text}");
    for wheel in [&missing_a, &missing_b] {
        assert!(text.contains(&wheel.name), "{text}");
        assert!(text.contains(&wheel.sha256), "{text}");
    }
    assert!(!text.contains("theta"), "{text}");
    assert!(text.contains("without --offline"), "{text}");
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn offline_with_everything_cached_makes_no_request() {
    let server = Server::start();
    let wheels = vec![
        server.wheel("lambda", &content(11, 10_000)),
        server.wheel("mu", &content(12, 20_000)),
    ];
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 0);
    let online_paths = cache.fetch(&wheels, &online()).unwrap();
    let requests = server.seen().len();

    let offline_paths = cache.fetch(&wheels, &offline()).unwrap();
    assert_eq!(offline_paths, online_paths);
    assert_eq!(server.seen().len(), requests);
}

#[test]
fn several_wheels_download_in_parallel_and_come_back_in_order() {
    let server = Server::start();
    let bodies: Vec<Vec<u8>> = (0..4).map(|i| content(20 + i, 50_000)).collect();
    let wheels: Vec<WheelRef> = ["nu", "xi", "omicron", "pi"]
        .iter()
        .zip(&bodies)
        .map(|(name, body)| server.wheel(name, body))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let cache = patient_cache_in(dir.path());
    server.set_mode(Mode::WaitForPeer);

    let paths = cache
        .fetch(
            &wheels,
            &FetchOptions {
                offline: false,
                jobs: 4,
            },
        )
        .unwrap();
    assert!(server.peak() > 1, "at most one request at a time");
    for ((path, wheel), body) in paths.iter().zip(&wheels).zip(&bodies) {
        assert_eq!(path, &cache.path(&wheel.sha256));
        assert_eq!(&std::fs::read(path).unwrap(), body);
    }
}

#[test]
fn one_job_downloads_one_at_a_time() {
    let server = Server::start();
    let wheels: Vec<WheelRef> = (0..3)
        .map(|i| server.wheel(&format!("w{i}"), &content(30 + i, 20_000)))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 0);
    let opts = FetchOptions {
        offline: false,
        jobs: 1,
    };
    cache.fetch(&wheels, &opts).unwrap();
    assert_eq!(server.peak(), 1);
    assert_eq!(server.seen().len(), 3);
}

#[test]
fn two_caches_on_one_root_download_a_wheel_once() {
    let server = Server::start();
    let bytes = content(40, 800_000);
    let wheel = server.wheel("rho", &bytes);
    let dir = tempfile::tempdir().unwrap();
    // Each response waits for a second request; with the lock there is none, so it waits
    // its full three seconds while the other fetch queues on the lock.
    server.set_mode(Mode::WaitForPeer);
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let cache = patient_cache_in(dir.path());
                let wheel = wheel.clone();
                scope.spawn(move || cache.fetch(&[wheel], &online()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for result in results {
        let paths = result.unwrap();
        assert_eq!(std::fs::read(&paths[0]).unwrap(), bytes);
    }
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn http_404_is_a_wheel_error_naming_the_url_without_retries() {
    let server = Server::start();
    let mut wheel = server.wheel("sigma", &content(50, 100));
    wheel.url.push_str(".gone");
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 3);
    let err = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap_err();
    let text = err.to_string();
    assert_eq!(err.exit_code(), 2, "{text}");
    assert!(text.contains(&wheel.url) && text.contains("404"), "{text}");
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn http_503_is_retried_with_a_bound_then_exit_3() {
    let server = Server::start();
    let wheel = server.wheel("tau", &content(51, 100));
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 2);
    server.set_mode(Mode::Status(503));
    let err = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap_err();
    let text = err.to_string();
    assert_eq!(err.exit_code(), 3, "{text}");
    assert!(text.contains(&wheel.url) && text.contains("503"), "{text}");
    assert_eq!(server.seen().len(), 3);
}

#[test]
fn an_unreachable_host_is_exit_3_naming_the_url() {
    // A port that was just free: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let wheel = WheelRef {
        name: "upsilon".into(),
        version: "1.0".into(),
        url: format!("http://127.0.0.1:{port}/upsilon-1.0-py3-none-any.whl"),
        size: None,
        sha256: sha256(b"x"),
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 1);
    let err = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap_err();
    assert_eq!(err.exit_code(), 3, "{err}");
    assert!(err.to_string().contains(&wheel.url), "{err}");
}

#[test]
fn a_stalled_server_times_out_instead_of_hanging() {
    let server = Server::start();
    let wheel = server.wheel("phi", &content(52, 10_000));
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path(), 0);
    server.set_mode(Mode::Stall);
    let started = Instant::now();
    let err = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap_err();
    assert_eq!(err.exit_code(), 3, "{err}");
    assert!(started.elapsed() < Duration::from_millis(1900), "{err}");
}

/// One real wheel from PyPI through the system trust store. Skipped (with the reason) only
/// when files.pythonhosted.org cannot be reached over TCP; a TLS or hash failure fails.
#[test]
fn a_real_wheel_downloads_from_pypi() {
    let host = "files.pythonhosted.org:443";
    let reachable = host
        .to_socket_addrs()
        .map_err(|e| e.to_string())
        .and_then(|mut addrs| addrs.next().ok_or_else(|| "no address".to_string()))
        .and_then(|addr| {
            TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())
        });
    if let Err(reason) = reachable {
        eprintln!("skipped: cannot reach {host}: {reason}");
        return;
    }
    let wheel = WheelRef {
        name: "six".into(),
        version: "1.17.0".into(),
        url: "https://files.pythonhosted.org/packages/b7/ce/149a00dd41f10bc29e5921b496af8b574d8413afcd5e30dfa0ed46c2cc5e/six-1.17.0-py2.py3-none-any.whl".into(),
        size: Some(11050),
        sha256: "4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274".into(),
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = WheelCache::open(dir.path().to_path_buf())
        .unwrap()
        .with_network(Network {
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            retries: 2,
            backoff: Duration::from_millis(500),
        });
    let paths = cache
        .fetch(std::slice::from_ref(&wheel), &online())
        .unwrap_or_else(|e| panic!("{e}"));
    let bytes = std::fs::read(&paths[0]).unwrap();
    assert_eq!(bytes.len(), 11050);
    assert_eq!(sha256(&bytes), wheel.sha256);
    assert_eq!(
        cache.file_name(&wheel.sha256).as_deref(),
        Some("six-1.17.0-py2.py3-none-any.whl")
    );
}
