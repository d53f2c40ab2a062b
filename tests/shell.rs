//! `gpubake completions` and `gpubake man`, as a shell and `man` use them: completion of a
//! command and of a flag in bash, and a page for every command that groff renders cleanly and
//! that says what `--help` says.

mod common;

use clap::CommandFactory;
use common::{assert_exit, gpubake, stdout};
use std::process::Command;

/// What bash offers for the words of `line` (the last one being completed), with the script
/// `gpubake completions bash` prints loaded, as bash-completion loads it.
fn bash_completes(script: &str, line: &[&str]) -> Vec<String> {
    let words: Vec<String> = line.iter().map(|w| format!("'{w}'")).collect();
    let text = format!(
        "{script}\nCOMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE='{joined}'; \
         COMP_POINT=${{#COMP_LINE}}; _gpubake gpubake '{cur}' '{prev}'; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        words = words.join(" "),
        cword = line.len() - 1,
        joined = line.join(" "),
        cur = line[line.len() - 1],
        prev = line[line.len() - 2],
    );
    let out = Command::new("bash")
        .args(["--norc", "-c", &text])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_commands_and_their_flags() {
    if !common::have("bash", "--version") {
        eprintln!("skipped: no bash");
        return;
    }
    let out = gpubake(&["completions", "bash"]);
    assert_exit(&out, 0);
    let script = stdout(&out);
    assert_eq!(bash_completes(&script, &["gpubake", "cer"]), ["certify"]);
    let mut offered = bash_completes(&script, &["gpubake", "c"]);
    offered.sort();
    assert_eq!(offered, ["certify", "compat", "completions", "copy"]);
    let offered = bash_completes(&script, &["gpubake", "certify", "--gp"]);
    assert_eq!(offered, ["--gpus"]);
    // Every shell clap knows gets a script that names every command.
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = gpubake(&["completions", shell]);
        assert_exit(&out, 0);
        assert!(stdout(&out).contains("certify"), "{shell}");
    }
    assert_exit(&gpubake(&["completions", "tcsh"]), 2);
}

#[test]
fn every_command_has_a_man_page_that_renders_and_says_what_help_says() {
    let dir = tempfile::tempdir().unwrap();
    let out = gpubake(&["man", dir.path().to_str().unwrap()]);
    assert_exit(&out, 0);
    let written: Vec<String> = stdout(&out).lines().map(str::to_string).collect();

    // The pages wanted: gpubake's, and one per visible command and subcommand.
    fn pages(cmd: &clap::Command, name: &str, out: &mut Vec<(String, String)>) {
        out.push((
            name.to_string(),
            cmd.get_about().map(|a| a.to_string()).unwrap_or_default(),
        ));
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            pages(sub, &format!("{name}-{}", sub.get_name()), out);
        }
    }
    let mut wanted = Vec::new();
    pages(&gpubake::cmd::Cli::command(), "gpubake", &mut wanted);
    assert!(wanted.len() > 15, "{wanted:?}");
    assert_eq!(written.len(), wanted.len(), "{written:?}");
    assert!(
        !written.iter().any(|p| p.contains("probe-worker")),
        "{written:?}"
    );
    let groff = common::have("groff", "--version");
    if !groff {
        eprintln!("the pages are not rendered: no groff");
    }
    for (name, about) in &wanted {
        let page = dir.path().join(format!("{name}.1"));
        assert!(written.contains(&page.display().to_string()), "{name}");
        let text = std::fs::read_to_string(&page).unwrap();
        assert!(text.contains(".TH"), "{name}: {text}");
        if !groff {
            continue;
        }
        let out = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww"])
            .arg(&page)
            .env("LC_ALL", "C.UTF-8")
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}");
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(warnings.trim().is_empty(), "{name}: {warnings}");
        // The rendered page says the command's summary line, as `--help` does (groff may
        // break and hyphenate it: compare its words without spaces and hyphens).
        let flat = |s: &str| -> String {
            s.chars()
                .filter(|c| c.is_alphanumeric())
                .collect::<String>()
        };
        let rendered = String::from_utf8_lossy(&out.stdout);
        let rendered = flat(&strip_overstrike(&rendered));
        assert!(
            rendered.contains(&flat(about)),
            "{name}: `{about}` not in the page"
        );
    }
}

/// Text without the backspace overstrikes of groff's terminal output (bold, underline).
fn strip_overstrike(text: &str) -> String {
    let mut out: Vec<char> = Vec::new();
    for c in text.chars() {
        if c == '\u{8}' {
            out.pop();
        } else {
            out.push(c);
        }
    }
    out.into_iter().collect()
}

/// The visible commands, each as the words that name it (`["key", "generate"]`).
fn command_paths() -> Vec<Vec<String>> {
    fn walk(cmd: &clap::Command, above: &[String], out: &mut Vec<Vec<String>>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let mut words = above.to_vec();
            words.push(sub.get_name().to_string());
            out.push(words.clone());
            walk(sub, &words, out);
        }
    }
    let mut out = vec![Vec::new()];
    walk(&gpubake::cmd::Cli::command(), &[], &mut out);
    out
}

/// docs/reference/ holds each command's `--help`, word for word: a change to a command's
/// options that leaves its page behind fails here. `GPUBAKE_BLESS=1` writes the pages anew.
#[test]
fn the_reference_pages_are_the_commands_help() {
    let dir = common::root().join("docs/reference");
    let bless = std::env::var_os("GPUBAKE_BLESS").is_some();
    let mut stale = Vec::new();
    let mut names = Vec::new();
    for words in command_paths() {
        let mut args: Vec<&str> = words.iter().map(String::as_str).collect();
        args.push("--help");
        let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .args(&args)
            .env_remove("COLUMNS")
            .output()
            .unwrap();
        assert_exit(&out, 0);
        let title = std::iter::once("gpubake")
            .chain(words.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        let page = format!("# `{title}`\n\n```text\n{}```\n", stdout(&out));
        let name = format!("{}.md", title.replace(' ', "-"));
        let path = dir.join(&name);
        names.push(name.clone());
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &page).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(page.as_str()) {
            stale.push(name);
        }
    }
    assert!(
        stale.is_empty(),
        "docs/reference/ differs from --help for {stale:?}: run GPUBAKE_BLESS=1 cargo test \
         --test shell the_reference_pages"
    );
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    names.sort();
    assert_eq!(
        present, names,
        "docs/reference/ holds a page per command, no more"
    );
}
