//! Helpers of the `probe --world` tests (tests/world.rs, tests/world_nodes.rs): ports, ranks
//! waited for with a deadline, rank 0's verdict.

use super::{stderr, stdout};
use serde_json::Value;
use std::process::{Child, Output};
use std::time::{Duration, Instant};

/// A port nothing listens on now at `ip`; rank 0 will take it.
pub fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits for `child`, killing it and failing the test, with what it printed, past `within`.
pub fn finish(mut child: Child, within: Duration) -> Output {
    let until = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "gpubake did not finish within {within:?}\n{}\n{}",
                stdout(&out),
                stderr(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Rank 0's JSON verdict and its checks (name, status, detail), each of the `world` phase.
pub fn verdict(out: &Output) -> (Value, Vec<(String, String, String)>) {
    let json: Value = serde_json::from_str(&stdout(out))
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", stdout(out), stderr(out)));
    let checks = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["phase"], "world", "{c}");
            let text = |k: &str| c[k].as_str().unwrap().to_string();
            (text("name"), text("status"), text("detail"))
        })
        .collect();
    (json, checks)
}

/// The checks of rank 0's verdict.
pub fn world_checks(out: &Output) -> Vec<(String, String, String)> {
    verdict(out).1
}

/// The status and detail of the check `name`, failing the test when there is none.
pub fn check<'a>(checks: &'a [(String, String, String)], name: &str) -> (&'a str, &'a str) {
    let c = checks
        .iter()
        .find(|c| c.0 == name)
        .unwrap_or_else(|| panic!("no check {name}: {checks:?}"));
    (&c.1, &c.2)
}
