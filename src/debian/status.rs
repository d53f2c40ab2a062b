//! What a base already has: the packages its dpkg database records as installed.

use super::packages::{Package, parse_index};
use super::sources::in_root;
use crate::error::{Error, Result};
use std::path::Path;

/// True for a `Status:` line of a package whose files are on disk and configured: the want
/// may be anything (`install`, `hold`, `deinstall` all leave it in place until dpkg acts), the
/// flag must be `ok` and the state `installed`. Half-installed, unpacked-only and
/// config-files packages are not there for a dependency to lean on.
pub fn installed(status: &str) -> bool {
    let words: Vec<&str> = status.split_whitespace().collect();
    matches!(words[..], [_, "ok", "installed"])
}

/// The installed packages of the unpacked root `root`, from its `/var/lib/dpkg/status`, with
/// their versions, Provides, Conflicts and Breaks. A root without one is an Environment error:
/// it is no Debian base.
pub fn read(root: &Path) -> Result<Vec<Package>> {
    let path = in_root(root, Path::new("var/lib/dpkg/status"));
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::Environment(format!(
                "{}: no dpkg status; the base is not a Debian or Ubuntu image",
                path.display()
            )));
        }
        Err(e) => return Err(Error::reading(path, e)),
    };
    parse(&text, &path.display().to_string())
}

/// The installed packages of dpkg status text (`at` names it in errors).
pub fn parse(text: &str, at: &str) -> Result<Vec<Package>> {
    parse_index(text, None, at, |s| s.get("Status").is_some_and(installed))
}

/// The root's native architecture: the one dpkg itself is built for (dpkg is Essential in
/// every Debian base), as `dpkg --print-architecture` would say.
pub fn native_arch(installed: &[Package]) -> Option<String> {
    installed
        .iter()
        .find(|p| p.name == "dpkg")
        .map(|p| p.architecture.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Package: dpkg\n\
        Essential: yes\n\
        Status: install ok installed\n\
        Priority: required\n\
        Architecture: amd64\n\
        Multi-Arch: foreign\n\
        Version: 1.21.22\n\
        Pre-Depends: libbz2-1.0, libc6 (>= 2.34), liblzma5 (>= 5.4.0)\n\
        Depends: tar (>= 1.28-1)\n\
        Breaks: libapt-pkg5.0 (<< 1.7~b)\n\
        Conffiles:\n /etc/dpkg/dpkg.cfg f4413ffb515f8f753624ae3bb365b81b\n\
        \n\
        Package: mawk\n\
        Status: install ok installed\n\
        Architecture: amd64\n\
        Version: 1.3.4.20200120-3.1\n\
        Provides: awk\n\
        \n\
        Package: gone\n\
        Status: deinstall ok config-files\n\
        Architecture: amd64\n\
        Version: 1\n\
        \n\
        Package: half\n\
        Status: install reinstreq half-installed\n\
        Architecture: amd64\n\
        Version: 1\n\
        \n\
        Package: held\n\
        Status: hold ok installed\n\
        Architecture: all\n\
        Version: 2:1.0\n";

    #[test]
    fn only_packages_on_disk_count_and_they_keep_provides_and_versions() {
        let got = parse(STATUS, "status").unwrap();
        let names: Vec<&str> = got.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["dpkg", "mawk", "held"]);
        assert!(got[0].essential);
        assert!(got[0].file.is_none());
        assert_eq!(got[0].pre_depends.0.len(), 3);
        assert_eq!(got[0].breaks.0[0][0].name, "libapt-pkg5.0");
        assert_eq!(got[1].provides.0[0][0].name, "awk");
        assert_eq!(got[2].version.to_string(), "2:1.0");
        assert_eq!(native_arch(&got).as_deref(), Some("amd64"));
    }

    #[test]
    fn a_root_without_dpkg_is_the_environment() {
        let root = tempfile::tempdir().unwrap();
        let e = read(root.path()).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.to_string()
                .contains("var/lib/dpkg/status: no dpkg status"),
            "{e}"
        );
    }
}
