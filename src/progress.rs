//! How far a long step has come, on stderr: a bar on a terminal, as docker, skopeo and uv
//! draw one; without a terminal (a CI log, a pipe) a line every few seconds, so a log shows
//! that the step is alive, how far it is and how fast it goes. Short steps print nothing.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Seconds between two lines without a terminal (`GPUBAKE_PROGRESS_SECONDS`, default 10; 0
/// prints a line at every update).
pub const INTERVAL_VAR: &str = "GPUBAKE_PROGRESS_SECONDS";

/// What a step counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes, shown as sizes and a rate.
    Bytes,
    /// Items (layers, files), shown as counts.
    Items,
}

/// One step's progress; cheap to update from several threads.
pub struct Progress {
    label: String,
    unit: Unit,
    total: Option<u64>,
    done: AtomicU64,
    started: Instant,
    bar: Option<indicatif::ProgressBar>,
    /// Without a terminal: when the last line was printed, and the interval.
    lines: Option<(Mutex<Instant>, Duration)>,
}

impl Progress {
    /// A step named `label` (`certify: reading the layers`) of `total` units, when known.
    pub fn new(label: impl Into<String>, unit: Unit, total: Option<u64>) -> Progress {
        let label = label.into();
        let terminal = std::io::stderr().is_terminal();
        let bar = terminal.then(|| bar(&label, unit, total));
        let lines = (!terminal).then(|| (Mutex::new(Instant::now()), interval()));
        Progress {
            label,
            unit,
            total,
            done: AtomicU64::new(0),
            started: Instant::now(),
            bar,
            lines,
        }
    }

    /// A step that counts but shows nothing: one too short to be worth a line.
    pub fn silent(label: impl Into<String>) -> Progress {
        Progress {
            label: label.into(),
            unit: Unit::Bytes,
            total: None,
            done: AtomicU64::new(0),
            started: Instant::now(),
            bar: None,
            lines: None,
        }
    }

    /// The units done so far.
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Adds `n` units done.
    pub fn inc(&self, n: u64) {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        }
        if let Some((last, every)) = &self.lines {
            let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
            if last.elapsed() >= *every {
                *last = Instant::now();
                eprintln!("{}", self.line(done));
            }
        }
    }

    /// The line a log gets: `LABEL: 1.2 GB of 4.3 GB (28%), 95.0 MB/s, 12 s`.
    fn line(&self, done: u64) -> String {
        let seconds = self.started.elapsed().as_secs_f64();
        let amount = |n: u64| match self.unit {
            Unit::Bytes => crate::units::human_size(n),
            Unit::Items => n.to_string(),
        };
        let of = match self.total {
            Some(total) if total > 0 => format!(
                " of {} ({}%)",
                amount(total),
                (done.min(total) * 100) / total
            ),
            _ => String::new(),
        };
        let rate = match self.unit {
            Unit::Bytes if seconds > 0.0 => format!(
                ", {}/s",
                crate::units::human_size((done as f64 / seconds) as u64)
            ),
            _ => String::new(),
        };
        format!("{}: {}{of}{rate}, {seconds:.0} s", self.label, amount(done))
    }

    /// Ends the step: the bar goes, and a log that got lines gets the last one.
    pub fn finish(self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Some((_, every)) = &self.lines
            && self.started.elapsed() >= *every
        {
            eprintln!("{}", self.line(self.done.load(Ordering::Relaxed)));
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn interval() -> Duration {
    std::env::var(INTERVAL_VAR)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(10), Duration::from_secs)
}

fn bar(label: &str, unit: Unit, total: Option<u64>) -> indicatif::ProgressBar {
    let bar =
        indicatif::ProgressBar::with_draw_target(total, indicatif::ProgressDrawTarget::stderr());
    let template = match (unit, total) {
        (Unit::Bytes, Some(_)) => "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        (Unit::Bytes, None) => "{prefix} {spinner} {bytes} {bytes_per_sec}",
        (Unit::Items, Some(_)) => "{prefix} [{bar:30}] {pos}/{len} {eta}",
        (Unit::Items, None) => "{prefix} {spinner} {pos}",
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(template)
            .expect("the templates are valid")
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started_ago(unit: Unit, total: Option<u64>, seconds: u64) -> Progress {
        Progress {
            label: "certify: reading the layers".into(),
            unit,
            total,
            done: AtomicU64::new(0),
            started: Instant::now() - Duration::from_secs(seconds),
            bar: None,
            lines: None,
        }
    }

    #[test]
    fn a_line_says_how_far_and_how_fast() {
        let line = started_ago(Unit::Bytes, Some(4_000_000_000), 10).line(1_000_000_000);
        assert!(
            line.starts_with("certify: reading the layers: 1.0 GB of 4.0 GB (25%), 10"),
            "{line}"
        );
        assert!(line.contains("MB/s") && line.ends_with(" s"), "{line}");
        let line = started_ago(Unit::Items, None, 3).line(3);
        assert_eq!(line, "certify: reading the layers: 3, 3 s");
    }
}
