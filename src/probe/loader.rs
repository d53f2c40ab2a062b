//! What the dynamic loader said when a library would not load, kept whole. libloading 0.9
//! prints only "dlopen failed" and keeps dlerror's text as the error's source, so a report
//! that prints the error alone loses the one line that says what is missing.

/// The error with every source it carries: `dlopen failed: libfoo.so: cannot open shared
/// object file: No such file or directory`.
pub fn message(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = e.source();
    }
    text
}

/// The file the loader could not open, by its name: glibc names it first
/// (`libpthread.so.0: cannot open shared object file: ...`), musl says `Error loading shared
/// library libpthread.so.0: ... (needed by ...)`. None for other failures (a wrong ELF class,
/// a missing symbol version).
pub fn unopened(dlerror: &str) -> Option<String> {
    let glibc = dlerror
        .rsplit_once(": cannot open shared object file")
        .map(|(before, _)| before.rsplit(": ").next().unwrap_or(before).trim());
    let musl = dlerror
        .split_once("Error loading shared library ")
        .and_then(|(_, rest)| rest.split_once(':'))
        .map(|(lib, _)| lib.trim());
    glibc.or(musl).map(|lib| {
        // A path names the same file: `/usr/lib/libnvidia-ml.so.1` is NVML too.
        lib.rsplit('/').next().unwrap_or(lib).to_string()
    })
}

/// Why `library` does not load, and what to do: the loader's own words, then the library it
/// lacks where the loader names one other than `library` itself.
pub fn explain(library: &str, dlerror: &str) -> String {
    match unopened(dlerror) {
        Some(lib) if lib == library => format!("{library} could not be loaded: {dlerror}"),
        Some(lib) => format!(
            "{library} is present but does not load: {dlerror}. The image lacks {lib}, which \
             {library} needs"
        ),
        None => format!("{library} is present but does not load: {dlerror}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loader_s_words_survive_and_name_what_is_missing() {
        let glibc = "dlopen failed: /opt/nvidia/nccl/lib/libnccl.so.2: libcudart.so.12: cannot open shared object file: No such file or directory";
        assert_eq!(unopened(glibc).as_deref(), Some("libcudart.so.12"));
        assert!(explain("libnccl.so.2", glibc).contains("The image lacks libcudart.so.12"));
        let musl = "Error loading shared library libpthread.so.0: No such file or directory (needed by /usr/lib/libnvidia-ml.so.1)";
        assert_eq!(unopened(musl).as_deref(), Some("libpthread.so.0"));
        let itself = "libnvidia-ml.so.1: cannot open shared object file: No such file or directory";
        assert!(explain("libnvidia-ml.so.1", itself).contains("could not be loaded"));
        assert_eq!(
            unopened("/x/libnccl.so.2: wrong ELF class: ELFCLASS32"),
            None
        );
    }

    #[test]
    fn a_library_whose_dependency_is_gone_is_reported_with_the_loader_s_message() {
        let dir = tempfile::tempdir().unwrap();
        let dep = dir.path().join("libgonedep.so");
        let lib = dir.path().join("libneedsgone.so");
        let src = dir.path().join("x.c");
        std::fs::write(&src, "int gone(void); int f(void) { return gone(); }\n").unwrap();
        std::fs::write(dir.path().join("d.c"), "int gone(void) { return 1; }\n").unwrap();
        let cc = |args: &[&std::ffi::OsStr]| {
            std::process::Command::new("cc")
                .args(args)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !cc(&[
            "-shared".as_ref(),
            "-fPIC".as_ref(),
            "-o".as_ref(),
            dep.as_os_str(),
            dir.path().join("d.c").as_os_str(),
        ]) {
            eprintln!("skipped: no C compiler");
            return;
        }
        assert!(cc(&[
            "-shared".as_ref(),
            "-fPIC".as_ref(),
            "-o".as_ref(),
            lib.as_os_str(),
            src.as_os_str(),
            "-L".as_ref(),
            dir.path().as_os_str(),
            "-lgonedep".as_ref(),
        ]));
        std::fs::remove_file(&dep).unwrap();
        let error = unsafe { libloading::Library::new(&lib) }.unwrap_err();
        let text = message(&error);
        assert!(
            text.contains("libgonedep.so: cannot open shared object file"),
            "{text}"
        );
        assert_eq!(unopened(&text).as_deref(), Some("libgonedep.so"));
        // The compatibility check's own reading of a libnccl.so.2 that does not load.
        let nccl = dir.path().join("libnccl.so.2");
        std::fs::rename(&lib, &nccl).unwrap();
        let said = super::super::nccl_version(&nccl).unwrap_err();
        assert!(
            said.contains("libgonedep.so: cannot open shared object file"),
            "{said}"
        );
        assert!(
            explain("libnccl.so.2", &said).contains("The image lacks libgonedep.so"),
            "{said}"
        );
    }
}
