//! Helpers for the tests that hand the Debian base to the Docker Engine.

use std::path::Path;
use std::process::Command;

/// Copies the OCI layout `base` (tag `bookworm`) into the Docker Engine as `tag`, so a
/// build or a container can start from it; fails the test with skopeo's words.
pub fn base_into_engine(base: &Path, tag: &str) {
    let out = Command::new("skopeo")
        .args([
            "copy",
            "--quiet",
            &format!("oci:{}:bookworm", base.display()),
        ])
        .arg(format!("docker-daemon:{tag}"))
        .output()
        .expect("skopeo runs");
    assert!(
        out.status.success(),
        "skopeo copy into the engine as {tag}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
