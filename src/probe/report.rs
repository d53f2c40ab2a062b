//! The probe's one report, rendered three ways: a human table, JSON, and JUnit XML for CI.

use serde::Serialize;
use std::fmt::Write as _;

pub use crate::verdict::{Check, Status, Verdict};

/// Everything one probe run found.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// The command that made it (`probe`, `certify`); empty means probe.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub title: String,
    /// gpubake's version.
    pub gpubake: String,
    /// The level it ran at (`probe --level`); 0 where no level applies.
    #[serde(skip_serializing_if = "is_zero")]
    pub level: u8,
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
    /// Facts gathered on the way (driver, GPUs, libraries, matrices), by phase.
    pub facts: serde_json::Map<String, serde_json::Value>,
    /// Seconds the probe took.
    pub seconds: f64,
    /// No GPU was visible: exit 3.
    pub no_gpu: bool,
    /// What the framework phase's start-up read, when it was asked to record it (`probe
    /// --record-startup`), or why there is no record. Not a check: the node is judged alike
    /// whether or not the record could be taken.
    #[serde(skip)]
    pub startup: Option<Result<crate::startup::StartupRecord, String>>,
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

impl Report {
    /// Adds a check.
    pub fn push(
        &mut self,
        phase: &'static str,
        name: impl Into<String>,
        status: Status,
        detail: impl Into<String>,
    ) {
        self.checks.push(Check::new(phase, name, status, detail));
    }

    /// Records a fact for the JSON report.
    pub fn fact(&mut self, key: &str, value: serde_json::Value) {
        self.facts.insert(key.to_string(), value);
    }

    /// The worst status of any check.
    pub fn worst(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Pass)
    }

    /// The verdict: lacking when there is no GPU, else whether a check failed.
    pub fn verdict(&self) -> Verdict {
        Verdict::of(&self.checks, self.no_gpu)
    }

    /// The verdict's exit code: 0 pass (warnings included), 1 a check failed, 3 no GPU.
    pub fn exit_code(&self) -> i32 {
        self.verdict().exit_code()
    }

    /// The line under the probe's table that says what the verdict means, as certify's
    /// report ends with its own: the failed checks by name, or what the machine lacks.
    pub fn verdict_line(&self) -> String {
        let failed: Vec<&str> = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .map(|c| c.name.as_str())
            .collect();
        match self.verdict() {
            Verdict::Pass => "verdict: passed".to_string(),
            Verdict::Fail => format!("verdict: FAILED: {}", failed.join(", ")),
            Verdict::Lacking => format!(
                "verdict: not judged: no GPU to probe here (failed above: {})",
                failed.join(", ")
            ),
        }
    }

    /// The human table.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let width = self
            .checks
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(10)
            .min(44);
        let mut phase = "";
        for c in &self.checks {
            if c.phase != phase {
                phase = c.phase;
                let _ = writeln!(out, "# {phase}");
            }
            let _ = writeln!(
                out,
                "  {}  {:<width$}  {}",
                c.status.label(),
                c.name,
                c.detail
            );
            // Under the check it is about, indented past the status, so a reader of a failure
            // sees at once what to do and on whose word.
            if let Some(a) = &c.advice {
                let _ = writeln!(out, "        {}", a.line());
                if let Some(again) = &a.escalate {
                    let _ = writeln!(out, "        if it recurs: {again}");
                }
            }
        }
        let count = |s: Status| self.checks.iter().filter(|c| c.status == s).count();
        let _ = writeln!(
            out,
            "# {} passed, {} warned, {} failed, {} skipped in {:.1} s",
            count(Status::Pass),
            count(Status::Warn),
            count(Status::Fail),
            count(Status::Skip),
            self.seconds
        );
        out
    }

    /// The all-reduce measurements as a table like nccl-tests': per size and type, the bundled
    /// kernel's time and bus bandwidth, NCCL's on the same buffers, and (ranks sharing one GPU)
    /// the memory throughput against a plain device-to-device copy.
    pub fn bench_table(&self) -> Option<String> {
        let v = self.facts.get("allreduce")?;
        let rows = v["rows"].as_array()?;
        let copy = v["copy_gbps"].as_f64();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# all-reduce: bundled kernel beside NCCL on the same buffers{}",
            copy.map(|c| format!("; device copy {c:.0} GB/s (read+write)"))
                .unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "#{:>12} {:>5} {:>9} {:>6} {:>10} {:>8} {:>10} {:>8} {:>8} {:>6}",
            "bytes",
            "type",
            "algo",
            "ranks",
            "time(us)",
            "busbw",
            "nccl(us)",
            "busbw",
            "vs copy",
            "exact"
        );
        for r in rows {
            let num = |k: &str, p: usize| {
                r[k].as_f64()
                    .map(|x| format!("{x:.p$}"))
                    .unwrap_or_else(|| "-".into())
            };
            let vs_copy = match (r["local_gbps"].as_f64(), copy) {
                (Some(l), Some(c)) if c > 0.0 => format!("{:.0}%", 100.0 * l / c),
                _ => "-".into(),
            };
            let _ = writeln!(
                out,
                " {:>12} {:>5} {:>9} {:>6} {:>10} {:>8} {:>10} {:>8} {:>8} {:>6}",
                r["bytes"].as_u64().unwrap_or(0),
                r["dtype"].as_str().unwrap_or(""),
                r["algo"].as_str().unwrap_or(""),
                r["ranks"].as_u64().unwrap_or(0),
                num("time_us", 1),
                num("busbw", 1),
                num("nccl_time_us", 1),
                num("nccl_busbw", 1),
                vs_copy,
                if r["wrong"].as_u64() == Some(0) {
                    "yes"
                } else {
                    "NO"
                }
            );
        }
        Some(out)
    }

    /// JUnit XML: one test case per check, grouped in a suite per phase, the whole titled
    /// after the command that made it.
    pub fn to_junit(&self) -> String {
        use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};
        let mut junit = quick_junit::Report::new(format!("gpubake {}", self.title()));
        junit.set_time(std::time::Duration::from_secs_f64(self.seconds.max(0.0)));
        let mut phases: Vec<&str> = self.checks.iter().map(|c| c.phase).collect();
        phases.dedup();
        for phase in phases {
            let mut suite = TestSuite::new(phase);
            for c in self.checks.iter().filter(|c| c.phase == phase) {
                let status = match c.status {
                    Status::Pass | Status::Warn => TestCaseStatus::success(),
                    Status::Skip => {
                        let mut s = TestCaseStatus::skipped();
                        s.set_message(c.detail.as_str());
                        s
                    }
                    Status::Fail => {
                        let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                        match &c.advice {
                            // CI shows the message; the type lets a pipeline route on the action.
                            Some(a) => {
                                s.set_message(format!("{} | {}", c.detail, a.line()));
                                s.set_type(a.action.label());
                            }
                            None => {
                                s.set_message(c.detail.as_str());
                            }
                        }
                        s
                    }
                };
                let mut case = TestCase::new(c.name.as_str(), status);
                case.set_classname(format!("gpubake.{}.{phase}", self.title()));
                match c.status {
                    Status::Pass => {
                        case.set_system_out(c.detail.as_str());
                    }
                    Status::Warn => {
                        let advice = c
                            .advice
                            .as_ref()
                            .map(|a| format!(" | {}", a.line()))
                            .unwrap_or_default();
                        case.set_system_out(format!("WARN: {}{advice}", c.detail));
                    }
                    _ => {}
                }
                suite.add_test_case(case);
            }
            junit.add_test_suite(suite);
        }
        junit
            .to_string()
            .expect("JUnit of plain strings serializes")
    }

    /// The command the report is from: `probe` unless set.
    pub fn title(&self) -> &str {
        if self.title.is_empty() {
            "probe"
        } else {
            &self.title
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        let mut r = Report::default();
        r.push("environment", "container", Status::Pass, "docker");
        r.push(
            "nvml",
            "GPU 0 ECC",
            Status::Warn,
            "3 corrected errors <since boot>",
        );
        r.push(
            "nvml",
            "GPU 0 PCIe link",
            Status::Fail,
            "Gen4 x8, expected Gen5 x16 & more",
        );
        r.push("allreduce", "nccl", Status::Skip, "libnccl.so.2 not found");
        r
    }

    #[test]
    fn exit_codes_follow_the_worst_check() {
        let mut r = sample();
        assert_eq!(r.exit_code(), 1);
        r.checks.retain(|c| c.status != Status::Fail);
        assert_eq!(r.exit_code(), 0);
        r.no_gpu = true;
        assert_eq!(r.exit_code(), 3);
    }

    #[test]
    fn junit_is_well_formed_and_escaped() {
        let xml = sample().to_junit();
        assert!(xml.contains("name=\"gpubake probe\""), "{xml}");
        assert!(
            xml.contains("tests=\"4\" skipped=\"1\" failures=\"1\""),
            "{xml}"
        );
        assert!(
            xml.contains("message=\"Gen4 x8, expected Gen5 x16 &amp; more\""),
            "{xml}"
        );
        assert!(xml.contains("&lt;since boot&gt;"), "{xml}");
        assert!(
            xml.contains("<skipped message=\"libnccl.so.2 not found\""),
            "{xml}"
        );
        assert_eq!(xml.matches("<testsuite ").count(), 3);
        assert_eq!(xml.matches("</testsuite>").count(), 3);
        let mut certify = sample();
        certify.title = "certify".into();
        let xml = certify.to_junit();
        assert!(xml.contains("name=\"gpubake certify\""), "{xml}");
        assert!(xml.contains("classname=\"gpubake.certify.nvml\""), "{xml}");
    }

    #[test]
    fn bench_table_shows_kernel_nccl_and_copy() {
        let mut r = sample();
        assert!(r.bench_table().is_none());
        r.fact(
            "allreduce",
            serde_json::json!({"copy_gbps": 4000.0, "rows": [
                {"bytes": 1024, "dtype": "f32", "algo": "two-shot", "ranks": 4, "time_us": 6.0, "busbw": 0.2,
                 "local_gbps": 3900.0, "wrong": 0},
                {"bytes": 1024, "dtype": "bf16", "algo": "one-shot", "ranks": 2, "time_us": 5.0, "busbw": 0.3,
                 "nccl_time_us": 20.0, "nccl_busbw": 0.1, "wrong": 3}
            ]}),
        );
        let table = r.bench_table().unwrap();
        assert!(table.contains("device copy 4000 GB/s"), "{table}");
        assert!(table.contains("98%") && table.contains("   yes"), "{table}");
        assert!(
            table.contains("20.0") && table.contains("    NO"),
            "{table}"
        );
    }

    /// The sample with what to do about its failure and its warning.
    fn advised() -> Report {
        use crate::verdict::{Action, Advice};
        let mut r = sample();
        r.checks[2].advice = Some(Advice {
            action: Action::Reboot,
            class: "pcie_link_degraded".into(),
            why: "a reboot retrains the link".into(),
            source: "judgement".into(),
            section: None,
            see: vec!["https://example.org/pcie".into()],
            escalate: Some("drain-and-replace if still degraded".into()),
            fallback: None,
        });
        r.checks[1].advice = Some(Advice {
            action: Action::None,
            class: "ecc_corrected_high".into(),
            why: "hardware fixed them & carries on".into(),
            source: "https://example.org/xid".into(),
            section: Some("Xid 92".into()),
            see: vec![],
            escalate: None,
            fallback: None,
        });
        r
    }

    #[test]
    fn text_puts_the_action_and_its_source_under_the_check() {
        let text = advised().to_text();
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.contains("FAIL  GPU 0 PCIe link"))
            .unwrap();
        assert_eq!(
            lines[at + 1],
            "        action: reboot (pcie_link_degraded): a reboot retrains the link \
             [judgement; see https://example.org/pcie]"
        );
        assert_eq!(
            lines[at + 2],
            "        if it recurs: drain-and-replace if still degraded"
        );
        assert!(
            text.contains("        action: none (ecc_corrected_high): hardware fixed them"),
            "{text}"
        );
        // Without advice the table is as it was.
        assert!(!sample().to_text().contains("action:"));
    }

    #[test]
    fn junit_failure_message_carries_the_action() {
        let xml = advised().to_junit();
        assert!(
            xml.contains(
                "message=\"Gen4 x8, expected Gen5 x16 &amp; more | action: reboot \
                 (pcie_link_degraded): a reboot retrains the link [judgement; see \
                 https://example.org/pcie]\""
            ),
            "{xml}"
        );
        assert!(xml.contains("type=\"reboot\""), "{xml}");
        assert!(
            xml.contains("WARN: 3 corrected errors &lt;since boot&gt; | action: none"),
            "{xml}"
        );
        assert!(
            xml.contains("carries on [https://example.org/xid]"),
            "{xml}"
        );
    }

    #[test]
    fn text_groups_by_phase_and_counts() {
        let text = sample().to_text();
        assert!(text.contains("# nvml\n"), "{text}");
        assert!(text.contains("FAIL  GPU 0 PCIe link"), "{text}");
        assert!(
            text.contains("1 passed, 1 warned, 1 failed, 1 skipped"),
            "{text}"
        );
    }
}
