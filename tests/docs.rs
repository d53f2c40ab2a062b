//! The README and every `--help` agree with the CLI: each documented `gpubake` command line
//! (README console blocks and the `Example:` of every subcommand's help) is accepted by the
//! command-line parser as written, and those that run in seconds without a network or a GPU
//! are run and must end as documented.

mod common;

use clap::{CommandFactory, Parser};
use gpubake::cli::Cli;

/// A command line as a shell would split it (words, '…' and "…" quoting), without the
/// comment that may follow it.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut started = false;
    for c in line.chars() {
        match (quote, c) {
            (None, '#') if !started => break,
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if started {
                    out.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            (_, c) => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        out.push(word);
    }
    out
}

/// Every `gpubake …` command the README shows after a `$ ` prompt.
fn readme_commands() -> Vec<String> {
    let text = std::fs::read_to_string(common::root().join("README.md")).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("$ gpubake "))
        .map(|rest| format!("gpubake {rest}"))
        .collect()
}

/// Every `gpubake …` command in a subcommand's `Example:` help line (several are joined by
/// `;` or `&&`).
fn help_examples() -> Vec<String> {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    for sub in cmd.get_subcommands_mut() {
        let help = sub.render_long_help().to_string();
        for line in help.lines() {
            let Some(example) = line.trim().strip_prefix("Example: ") else {
                continue;
            };
            for part in example.split([';', '&']) {
                let part = part.trim();
                if let Some(rest) = part.strip_prefix("gpubake ") {
                    out.push(format!("gpubake {rest}"));
                }
            }
        }
    }
    out
}

#[test]
fn every_documented_command_line_is_accepted_as_written() {
    let commands: Vec<String> = readme_commands()
        .into_iter()
        .chain(help_examples())
        .collect();
    assert!(commands.len() >= 15, "{commands:?}");
    let mut refused = Vec::new();
    for line in &commands {
        if let Err(e) = Cli::try_parse_from(words(line)) {
            refused.push(format!(
                "{line}\n    {}",
                e.to_string().lines().next().unwrap_or("")
            ));
        }
    }
    assert!(
        refused.is_empty(),
        "documented commands the CLI refuses:\n{}",
        refused.join("\n")
    );
}

/// The examples that need neither a network nor a GPU nor a built image run as documented.
#[test]
fn the_offline_examples_run_as_documented() {
    let root = common::root();
    for (args, code) in [
        (vec!["presets", "show", "nvlink"], 0),
        (vec!["presets", "diff", "pcie", "nvlink"], 1), // they differ: diff(1)'s 1
        (vec!["compat", "--release", "2.9"], 0),
        (
            vec!["resolve", "recipes/h100-pytorch2.9.yaml", "--explain"],
            0,
        ),
    ] {
        let out = common::gpubake_in(&root, &args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "gpubake {}: {}",
            args.join(" "),
            common::stderr(&out)
        );
    }
    // `lint env-presets/*.yaml recipes/*.yaml` as a shell expands it.
    let mut args = vec!["lint".to_string()];
    for dir in ["env-presets", "recipes"] {
        let mut files: Vec<String> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| format!("{dir}/{}", e.file_name().to_string_lossy()))
            .filter(|f| f.ends_with(".yaml"))
            .collect();
        files.sort();
        args.extend(files);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = common::gpubake_in(&root, &args);
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "lint of the shipped files: {}",
        common::stderr(&out)
    );
}

#[test]
fn shell_words_follow_quotes_and_drop_comments() {
    assert_eq!(
        words("gpubake verify oci:./out:v1   # re-hash"),
        ["gpubake", "verify", "oci:./out:v1"]
    );
    assert_eq!(words(r#"sh -c 'a b' "c d""#), ["sh", "-c", "a b", "c d"]);
}
