//! A `docker-registry` (Debian's distribution 2.8) on a free loopback port over plain HTTP,
//! for tests that need only a registry, not logins or TLS (tests/registry.rs has those).

use std::path::Path;
use std::process::Command;

/// A running `docker-registry` and its address, killed when dropped.
pub struct LocalRegistry(pub std::process::Child, pub String);

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts one storing under `dir/registry`, its log in `dir/registry.log`.
pub fn local_registry(dir: &Path) -> LocalRegistry {
    local_registry_logging(dir, "warn")
}

/// [`local_registry`] logging at `level`: `info` logs every response with the bytes it wrote.
pub fn local_registry_logging(dir: &Path, level: &str) -> LocalRegistry {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let config = dir.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: {level}\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            dir.join("registry").display()
        ),
    )
    .unwrap();
    // Its request log goes to a file, not into the test's output.
    let log = std::fs::File::create(dir.join("registry.log")).unwrap();
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(&config)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let registry = LocalRegistry(child, addr.clone());
    for _ in 0..100 {
        if std::net::TcpStream::connect(&addr).is_ok() {
            return registry;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("docker-registry did not listen on {addr}");
}

/// In `dir`: a registries.d that turns sigstore attachments on for the registry at `addr`
/// (containers/image reads none otherwise) and `accept.json`, a policy that accepts any image,
/// for a copy that signs rather than checks.
pub fn sigstore_attachments(dir: &Path, addr: &str) {
    std::fs::create_dir_all(dir.join("registries.d")).unwrap();
    std::fs::write(
        dir.join("registries.d/local.yaml"),
        format!("docker:\n  {addr}:\n    use-sigstore-attachments: true\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("accept.json"),
        r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
    )
    .unwrap();
}
