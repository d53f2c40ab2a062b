//! A child process run to a deadline: both output pipes drained (so a chatty child never
//! blocks on a full one), killed when its time is up, and what went wrong read from its own
//! words. The probe's workers and the OCI runtime's containers are both run this way.

use std::io::Read;
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How a child ended.
#[derive(Debug)]
pub struct Finished {
    /// Its status; None when it was killed at the deadline or could not be waited for.
    pub status: Option<ExitStatus>,
    /// Standard output, as far as it was read.
    pub stdout: String,
    /// Standard error, as far as it was read.
    pub stderr: String,
    /// It ran past the deadline and was killed.
    pub timed_out: bool,
}

/// Waits for `child`, spawned with piped stdout and stderr, until `deadline`; past it calls
/// `on_timeout` (to stop what the child started, say) and kills it. A process killed in the
/// middle of a driver call may never close its pipes, so output is collected only for a
/// moment after a kill.
pub fn wait(
    child: &mut Child,
    deadline: Duration,
    on_timeout: impl FnOnce(),
) -> std::io::Result<Finished> {
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            let _ = tx.send(String::from_utf8_lossy(&bytes).into_owned());
        });
        rx
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let (status, timed_out) = loop {
        match child.try_wait()? {
            Some(status) => break (Some(status), false),
            None if started.elapsed() > deadline => {
                on_timeout();
                let _ = child.kill();
                let _ = child.wait();
                break (None, true);
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let patience = if timed_out {
        Duration::from_secs(1)
    } else {
        Duration::MAX
    };
    let collect = |rx: mpsc::Receiver<String>| rx.recv_timeout(patience).unwrap_or_default();
    Ok(Finished {
        status,
        stdout: collect(out),
        stderr: collect(err),
        timed_out,
    })
}

/// The line of a child's standard error that says what went wrong: a Rust panic's message
/// (not the backtrace hint printed after it), else the last line that is not a hint.
pub fn last_words(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    if let Some(i) = lines.iter().position(|l| l.contains("panicked at")) {
        let message = lines
            .get(i + 1)
            .filter(|l| !l.starts_with("note:") && !l.starts_with("stack backtrace"))
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        return format!("{}{message}", lines[i].trim_end_matches(':'));
    }
    lines
        .iter()
        .rev()
        .find(|l| !l.starts_with("note:"))
        .map(|l| l.to_string())
        .unwrap_or_else(|| "no output".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn sh(script: &str) -> Child {
        Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    #[test]
    fn output_and_status_come_back() {
        let done = wait(
            &mut sh("echo out; echo err >&2; exit 4"),
            Duration::from_secs(30),
            || {},
        )
        .unwrap();
        assert_eq!(done.status.and_then(|s| s.code()), Some(4));
        assert_eq!(done.stdout, "out\n");
        assert_eq!(done.stderr, "err\n");
        assert!(!done.timed_out);
    }

    #[test]
    fn a_child_past_its_deadline_is_killed_and_the_hook_runs() {
        let mut hooked = false;
        let done = wait(
            &mut sh("echo started; sleep 30"),
            Duration::from_millis(200),
            || hooked = true,
        )
        .unwrap();
        assert!(done.timed_out && hooked);
        assert!(done.status.is_none());
    }
}
