//! gpubake's one HTTP stack (src/net.rs), as the Debian archive client and the wheel cache
//! use it: HTTPS verified against the system's trust store and `SSL_CERT_FILE`, a refused
//! certificate reported as a trust store to fix (exit 3, not retried), and the proxy
//! variables curl and pip follow (`http_proxy`, `https_proxy` through CONNECT, `no_proxy`).
//!
//! The trust store and the proxies are read from the environment, which is one per process,
//! so each case runs this test binary again as a child (`as_a_child`) with its own variables.

mod common;

use gpubake::debian::Client;
use gpubake::wheel::cache::{FetchOptions, Network, WheelCache, WheelRef};
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BODY: &[u8] = b"Package: hello\nVersion: 1.0\n";

/// Every variable that could steer the child's HTTP stack, removed before a case sets its own.
const STEERING: [&str; 10] = [
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

/// What the child saw, one line per client: `@archive OK <body>` or `archive ERR <exit> <message>`,
/// and `@wheel OK <sha256>` or `@wheel ERR <exit> <message>`.
#[test]
fn as_a_child() {
    let Ok(url) = std::env::var("GPUBAKE_TEST_NET_URL") else {
        return;
    };
    let archive = Client::new(Duration::from_secs(5))
        .unwrap()
        .get(&url, 1 << 20);
    match archive {
        Ok(body) => println!(
            "@archive OK {}",
            String::from_utf8_lossy(&body).escape_debug()
        ),
        Err(e) => println!(
            "@archive ERR {} {}",
            e.exit_code(),
            one_line(&e.to_string())
        ),
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = WheelCache::open(dir.path().to_path_buf())
        .unwrap()
        .with_network(Network {
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
            retries: 2,
            backoff: Duration::from_millis(10),
        });
    let wheel = WheelRef {
        name: "hello".into(),
        version: "1.0".into(),
        url,
        size: Some(BODY.len() as u64),
        sha256: hex::encode(Sha256::digest(BODY)),
    };
    match cache.fetch(std::slice::from_ref(&wheel), &FetchOptions::default()) {
        Ok(paths) => println!(
            "@wheel OK {}",
            hex::encode(Sha256::digest(std::fs::read(&paths[0]).unwrap()))
        ),
        Err(e) => println!("@wheel ERR {} {}", e.exit_code(), one_line(&e.to_string())),
    }
}

fn one_line(text: &str) -> String {
    text.replace('\n', " | ")
}

/// The child's two lines for `url` under `env`.
fn in_child(url: &str, env: &[(&str, &str)]) -> (String, String) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args(["--exact", "as_a_child", "--nocapture", "--test-threads=1"]);
    for name in STEERING {
        command.env_remove(name);
    }
    let out = command
        .env("GPUBAKE_TEST_NET_URL", url)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = |client: &str| {
        stdout
            .lines()
            .find_map(|l| l.split_once(&format!("@{client} ")).map(|(_, rest)| rest))
            .map(str::to_string)
            .unwrap_or_else(|| {
                panic!(
                    "the child printed no {client} line:\n{stdout}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    };
    (line("archive"), line("wheel"))
}

fn wheel_ok() -> String {
    format!("OK {}", hex::encode(Sha256::digest(BODY)))
}

fn archive_ok() -> String {
    format!("OK {}", String::from_utf8_lossy(BODY).escape_debug())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `openssl s_server -WWW` serving `dir` over TLS on 127.0.0.1, with a certificate of its
/// own (`cert.pem` in `dir`, which no system store trusts).
struct TlsServer {
    child: Child,
    port: u16,
}

impl TlsServer {
    /// A server of [`BODY`] as `/Packages`, in a directory of its own.
    fn serving_body() -> Option<(tempfile::TempDir, TlsServer)> {
        let dir = tempfile::tempdir().unwrap();
        let server = TlsServer::start(dir.path())?;
        std::fs::write(dir.path().join("Packages"), BODY).unwrap();
        Some((dir, server))
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/Packages", self.port)
    }

    fn start(dir: &Path) -> Option<TlsServer> {
        if !common::have("openssl", "version") {
            return None;
        }
        let made = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args(["-subj", "/CN=gpubake-test-archive"])
            .args(["-addext", "subjectAltName=IP:127.0.0.1"])
            // rustls (webpki) refuses a CA certificate as the server's own.
            .args(["-addext", "basicConstraints=critical,CA:FALSE"])
            .args(["-keyout", "key.pem", "-out", "cert.pem"])
            .current_dir(dir)
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(made.success(), "openssl req failed");
        let port = free_port();
        let child = Command::new("openssl")
            .args([
                "s_server", "-WWW", "-quiet", "-cert", "cert.pem", "-key", "key.pem",
            ])
            .args(["-accept", &format!("127.0.0.1:{port}")])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for(port, "openssl s_server");
        Some(TlsServer { child, port })
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A forward proxy on 127.0.0.1 that answers plain requests itself (with [`BODY`]) and
/// tunnels CONNECT to the host named; it records each request's first line.
struct Proxy {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let log = log.clone();
                std::thread::spawn(move || serve_proxy(stream, &log));
            }
        });
        Proxy { port, seen }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve_proxy(stream: TcpStream, log: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut first = String::new();
    if reader.read_line(&mut first).is_err() {
        return;
    }
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
    }
    let first = first.trim_end().to_string();
    log.lock().unwrap().push(first.clone());
    let mut client = stream;
    if let Some(target) = first.strip_prefix("CONNECT ") {
        let target = target.split(' ').next().unwrap_or_default();
        let Ok(upstream) = TcpStream::connect(target) else {
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n");
            return;
        };
        let _ = client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
        let (mut up_read, mut up_write) = (upstream.try_clone().unwrap(), upstream);
        let mut down_write = client.try_clone().unwrap();
        let up = std::thread::spawn(move || {
            let _ = std::io::copy(&mut reader, &mut up_write);
            let _ = up_write.shutdown(std::net::Shutdown::Write);
        });
        let _ = std::io::copy(&mut up_read, &mut down_write);
        let _ = down_write.shutdown(std::net::Shutdown::Both);
        let _ = up.join();
    } else {
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            BODY.len()
        );
        let _ = client.write_all(head.as_bytes());
        let _ = client.write_all(BODY);
    }
}

#[test]
fn https_is_checked_against_the_system_store_and_ssl_cert_file() {
    let Some((dir, server)) = TlsServer::serving_body() else {
        return;
    };
    let url = server.url();

    // A certificate no store trusts: the environment's to fix (exit 3), said as such, and
    // the wheel cache does not spend its retries on it.
    let (archive, wheel) = in_child(&url, &[]);
    assert!(archive.starts_with("ERR 3 "), "{archive}");
    assert!(archive.contains("certificate"), "{archive}");
    assert!(wheel.starts_with("ERR 3 "), "{wheel}");
    assert!(wheel.contains("SSL_CERT_FILE"), "{wheel}");
    assert!(
        !wheel.contains("(tried "),
        "retried a refused certificate: {wheel}"
    );

    // The same server, its certificate named by SSL_CERT_FILE (as a TLS-intercepting
    // proxy's CA is): both clients fetch the bytes.
    let cert = dir.path().join("cert.pem");
    let trusted = [("SSL_CERT_FILE", cert.to_str().unwrap())];
    assert_eq!(in_child(&url, &trusted), (archive_ok(), wheel_ok()));
}

#[test]
fn proxies_from_the_environment_are_followed_and_no_proxy_is_honoured() {
    let proxy = Proxy::start();
    // A name that never resolves: only the proxy can answer for it.
    let url = "http://archive.invalid/debian/Packages";

    for variable in ["http_proxy", "HTTP_PROXY", "ALL_PROXY"] {
        let before = proxy.seen().len();
        let got = in_child(url, &[(variable, &proxy.url())]);
        assert_eq!(got, (archive_ok(), wheel_ok()), "through {variable}");
        let seen = proxy.seen();
        assert_eq!(
            &seen[before..],
            [format!("GET {url} HTTP/1.1"), format!("GET {url} HTTP/1.1")],
            "through {variable}"
        );
    }

    // no_proxy names the host: the request goes straight to a name that does not resolve,
    // which is the environment (exit 3), and the proxy sees nothing.
    let before = proxy.seen().len();
    let (archive, wheel) = in_child(
        url,
        &[("http_proxy", &proxy.url()), ("no_proxy", ".invalid")],
    );
    assert!(archive.starts_with("ERR 3 "), "{archive}");
    assert!(archive.contains(url), "{archive}");
    assert!(wheel.starts_with("ERR 3 "), "{wheel}");
    assert_eq!(proxy.seen().len(), before, "no_proxy was not honoured");
}

#[test]
fn https_goes_through_the_proxy_with_connect_and_is_still_verified() {
    let Some((dir, server)) = TlsServer::serving_body() else {
        return;
    };
    let url = server.url();
    let proxy = Proxy::start();
    let cert = dir.path().join("cert.pem");

    let through = [
        ("https_proxy", proxy.url()),
        ("SSL_CERT_FILE", cert.display().to_string()),
    ];
    let through: Vec<(&str, &str)> = through.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(in_child(&url, &through), (archive_ok(), wheel_ok()));
    let tunnel = format!("CONNECT 127.0.0.1:{} HTTP/1.1", server.port);
    assert_eq!(proxy.seen(), [tunnel.clone(), tunnel.clone()]);

    // The tunnel carries TLS end to end: without the certificate trusted, it is refused.
    let (archive, wheel) = in_child(&url, &[("https_proxy", &proxy.url())]);
    assert!(
        archive.starts_with("ERR 3 ") && archive.contains("certificate"),
        "{archive}"
    );
    assert!(
        wheel.starts_with("ERR 3 ") && wheel.contains("SSL_CERT_FILE"),
        "{wheel}"
    );
    assert_eq!(proxy.seen().len(), 4);
}

/// The HTTP stack reads the archive's answer and nothing past the limit given.
#[test]
fn an_archive_file_over_its_limit_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut head = [0u8; 1024];
            let _ = stream.read(&mut head);
            let body = vec![b'x'; 4096];
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(&body);
        }
    });
    let client = Client::new(Duration::from_secs(5)).unwrap();
    let url = format!("http://127.0.0.1:{port}/Packages");
    assert_eq!(client.get(&url, 4096).unwrap().len(), 4096);
    let e = client.get(&url, 4095).unwrap_err();
    assert_eq!(e.exit_code(), 3, "{e}");
    assert!(e.to_string().contains("4095 bytes"), "{e}");
}

/// The registry client is the same stack: `https_proxy` carries its requests too.
#[test]
fn registry_requests_follow_the_proxy_too() {
    let proxy = Proxy::start();
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpubake"));
    for name in STEERING {
        command.env_remove(name);
    }
    let out = command
        .args(["inspect", "docker://registry.invalid/team/train:1"])
        .env("https_proxy", proxy.url())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        proxy.seen().first().map(String::as_str),
        Some("CONNECT registry.invalid:443 HTTP/1.1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
