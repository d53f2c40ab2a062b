//! `gpubake probe --world` across "nodes" this machine makes for the purpose:
//! - Slurm's own daemons (munged, slurmctld, slurmd from Debian's slurm-wlm) started in a
//!   temporary directory, with the ranks started by `srun`;
//! - network namespaces joined by veth pairs, each rank in its own with its own address and
//!   host name, under torchrun's variables and under Slurm's, with a rank that never comes,
//!   one killed and one too slow; and the same three under a real `srun`.
//!
//! Both need root (scripts/test runs as root in CI and installs slurm-wlm): outside CI they
//! skip with the reason; in CI (CI set) they fail instead. Without a GPU every rank's local
//! probe exits 3 and NCCL across ranks is skipped with that reason; on a GPU node they step
//! aside, as tests/world.rs does.

mod common;
#[path = "common/slurm.rs"]
mod slurm;

use common::world::{check, finish, free_port, world_checks};
use common::{have, stderr};
use serde_json::Value;
use slurm::quiet_port;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// True where the test can run: root, no GPU. In CI, not being root fails the test.
fn runnable(what: &str) -> bool {
    if Path::new("/dev/nvidia0").exists() {
        eprintln!("skipped: a GPU is present; the local probes would take minutes");
        return false;
    }
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs the tests as root; {what} needs it"
        );
        eprintln!("skipped: {what} needs root");
        return false;
    }
    true
}

/// True when `tool` is on PATH (srun and sinfo cannot even say their version without a
/// cluster to ask); in CI its absence fails the test instead of skipping it.
fn on_path(tool: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs {tool}; it must be on PATH"
        );
        eprintln!("skipped: {tool} is not on PATH");
    }
    found
}

/// Runs a setup command, failing the test with its words when it fails.
fn sh(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        stderr(&out)
    );
}

/// Runs `srun -N1 -n TASKS gpubake probe --world --json` on the cluster in `dir`, each task
/// through `sh -c SCRIPT` when one is given (the script sees SLURM_PROCID and ends with
/// `exec "$@"`). Returns srun's output and rank 0's, read from its output files.
fn srun_world(dir: &Path, tasks: usize, timeout_s: &str, script: Option<&str>) -> (Output, Output) {
    let port = quiet_port().to_string();
    let mut srun = Command::new("srun");
    srun.args(["-N1", &format!("-n{tasks}"), "--kill-on-bad-exit=0", "-o"])
        .arg(dir.join("out.%t"))
        .arg("-e")
        .arg(dir.join("err.%t"));
    if let Some(script) = script {
        srun.args(["sh", "-c", script, "sh"]);
    }
    let srun = srun
        .arg(env!("CARGO_BIN_EXE_gpubake"))
        .args(["probe", "--world", "--json", "--world-timeout", timeout_s])
        .args(["--world-port", &port])
        .env("SLURM_CONF", dir.join("slurm.conf"))
        // Variables of another launcher in the test's environment would win over Slurm's.
        .env_remove("RANK")
        .env_remove("MASTER_ADDR")
        .env_remove("TORCHELASTIC_RUN_ID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let done = finish(srun, Duration::from_secs(90));
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap_or_default();
    let rank0 = Output {
        status: done.status,
        stdout: read("out.0"),
        stderr: read("err.0"),
    };
    (done, rank0)
}

#[test]
fn srun_starts_every_rank_and_rank_zero_aggregates_them() {
    if !runnable("starting Slurm's daemons") {
        return;
    }
    if !(on_path("srun")
        && on_path("sinfo")
        && have("slurmctld", "-V")
        && have("slurmd", "-V")
        && have("munged", "--version")
        && have("mungekey", "--version"))
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cluster = slurm::start(dir.path());
    let started = Instant::now();
    let (done, rank0) = srun_world(dir.path(), 3, "30", None);
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    let checks = world_checks(&rank0);
    let (status, summary) = check(&checks, "world");
    assert_eq!(status, "FAIL", "{summary}");
    assert!(
        summary.starts_with("3 of 3 ranks reported (launched by Slurm srun")
            && summary.contains("no GPU: 0, 1, 2"),
        "{summary}\n{}",
        stderr(&done)
    );
    let json: Value = serde_json::from_str(&read("out.0")).unwrap();
    for r in 0..3usize {
        let (_, detail) = check(&checks, &format!("rank {r}"));
        assert!(detail.contains("no GPU (local exit 3)"), "{detail}");
        let rank = &json["facts"]["world"]["ranks"][r];
        assert_eq!(rank["state"], "reported", "{rank}");
        assert_eq!(rank["report"]["no_gpu"], true);
    }
    assert_eq!(json["facts"]["world"]["place"]["launcher"], "slurm");
    // Each rank learnt its place from srun: the other ranks print their own reports.
    for r in 1..3 {
        let text = read(&format!("out.{r}"));
        assert!(text.contains("rank 0 at localhost:"), "rank {r}: {text}");
    }
    let (status, why) = check(&checks, "NCCL across ranks");
    assert_eq!(status, "SKIP");
    assert!(why.contains("no GPU on this node (local exit 3)"), "{why}");
    assert!(started.elapsed() < Duration::from_secs(60));
    // srun reports the worst exit of its tasks: 3, every rank lacking a GPU.
    assert_eq!(done.status.code(), Some(3), "{}", stderr(&done));
}

/// Under srun, a rank that never starts the probe, one killed after the broadcast and one
/// that reports too late are each named in rank 0's verdict, within the deadline.
#[test]
fn srun_ranks_missing_killed_and_slow_are_each_named() {
    if !runnable("starting Slurm's daemons") {
        return;
    }
    if !(on_path("srun") && have("slurmctld", "-V") && have("munged", "--version")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cluster = slurm::start(dir.path());
    // Task 1 exits before probing; task 2 dies once the broadcast arrived; task 3 reports
    // 25 s late against a 5 s deadline.
    let script = "case $SLURM_PROCID in \
        1) exit 0 ;; \
        2) export GPUBAKE_WORLD_TEST_DIE_BEFORE_REPORT=1 ;; \
        3) export GPUBAKE_WORLD_TEST_REPORT_DELAY_S=25 ;; \
        esac; exec \"$@\"";
    let began = std::time::SystemTime::now();
    let (done, rank0) = srun_world(dir.path(), 4, "5", Some(script));
    let checks = world_checks(&rank0);
    assert_eq!(
        check(&checks, "rank 1"),
        ("FAIL", "missing: no hello within 5 s"),
        "{}",
        stderr(&done)
    );
    let (status, detail) = check(&checks, "rank 2");
    assert_eq!(status, "FAIL");
    assert!(
        detail.starts_with("dead: ") && detail.contains("(127.0.0.1) pid"),
        "{detail}"
    );
    let (status, detail) = check(&checks, "rank 3");
    assert_eq!(status, "FAIL");
    assert!(
        detail.starts_with("slow: ")
            && detail.contains("(127.0.0.1) pid")
            && detail.contains("no report within 5 s of the broadcast"),
        "{detail}"
    );
    let (_, summary) = check(&checks, "world");
    assert!(
        summary.starts_with("1 of 4 ranks reported (launched by Slurm srun")
            && summary.contains("missing: 1; dead: 2; slow: 3"),
        "{summary}"
    );
    // Rank 0 wrote its verdict before the slow rank's 25 s were up: its deadlines held
    // (5 s for the hellos, 5 s for the reports, and its own local probe before them).
    let written = std::fs::metadata(dir.path().join("out.0"))
        .unwrap()
        .modified()
        .unwrap();
    let took = written.duration_since(began).unwrap();
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// Network namespaces, one per rank: rank 0's holds the rendezvous address 10.T.0.1 on its
/// loopback; every other one is joined to it by a veth pair on 10.T.I.0/24 with a route to
/// that address. No bridge: the host's firewall (Docker's FORWARD policy) never sees them.
struct Nodes {
    names: Vec<String>,
    subnet: u8,
}

impl Nodes {
    fn make(subnet: u8, count: u8) -> Nodes {
        let names: Vec<String> = (0..count)
            .map(|i| format!("gbw{}-{subnet}-{i}", std::process::id() % 100_000))
            .collect();
        let nodes = Nodes { names, subnet };
        for name in &nodes.names {
            sh("ip", &["netns", "add", name]);
            sh("ip", &["-n", name, "link", "set", "lo", "up"]);
        }
        let zero = &nodes.names[0];
        sh(
            "ip",
            &["-n", zero, "addr", "add", &nodes.master(), "dev", "lo"],
        );
        for (i, name) in nodes.names.iter().enumerate().skip(1) {
            let near = format!("p{i}");
            sh(
                "ip",
                &[
                    "link", "add", &near, "netns", zero, "type", "veth", "peer", "name", "eth0",
                    "netns", name,
                ],
            );
            let net = |host: u8| format!("10.{subnet}.{i}.{host}");
            sh(
                "ip",
                &[
                    "-n",
                    zero,
                    "addr",
                    "add",
                    &format!("{}/24", net(1)),
                    "dev",
                    &near,
                ],
            );
            sh("ip", &["-n", zero, "link", "set", &near, "up"]);
            sh(
                "ip",
                &[
                    "-n",
                    name,
                    "addr",
                    "add",
                    &format!("{}/24", net(2)),
                    "dev",
                    "eth0",
                ],
            );
            sh("ip", &["-n", name, "link", "set", "eth0", "up"]);
            sh(
                "ip",
                &["-n", name, "route", "add", &nodes.master(), "via", &net(1)],
            );
        }
        nodes
    }

    /// Rank 0's address, where MASTER_ADDR points.
    fn master(&self) -> String {
        format!("10.{}.0.1", self.subnet)
    }

    /// The address rank `i` connects from.
    fn address(&self, i: usize) -> String {
        if i == 0 {
            self.master()
        } else {
            format!("10.{}.{i}.2", self.subnet)
        }
    }

    /// Starts rank `rank` in its namespace, with host name `node-RANK` in a UTS namespace of
    /// its own, the launcher's variables `vars` and nothing else from this environment.
    fn rank(&self, rank: usize, args: &[&str], vars: &[(String, String)]) -> Child {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.names[rank],
                "unshare",
                "--uts",
                "sh",
                "-c",
            ])
            .arg("hostname \"$0\" && exec \"$@\"")
            .arg(format!("node-{rank}"))
            .arg(env!("CARGO_BIN_EXE_gpubake"))
            .args(["probe", "--world", "--json"])
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ip netns exec runs")
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of each veth pair, and so the pair.
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "delete", name]).output();
        }
    }
}

/// Which launcher's variables the ranks get.
#[derive(Clone, Copy)]
enum Launcher {
    Torchrun,
    Slurm,
}

fn vars(launcher: Launcher, rank: usize, nodes: &Nodes, port: u16) -> Vec<(String, String)> {
    let pairs: Vec<(&str, String)> = match launcher {
        Launcher::Torchrun => vec![
            ("TORCHELASTIC_RUN_ID", "netns".into()),
            ("RANK", rank.to_string()),
            ("LOCAL_RANK", "0".into()),
            ("WORLD_SIZE", nodes.names.len().to_string()),
            ("LOCAL_WORLD_SIZE", "1".into()),
            ("MASTER_ADDR", nodes.master()),
            ("MASTER_PORT", (port - 1).to_string()),
        ],
        Launcher::Slurm => vec![
            ("SLURM_JOB_ID", "77".into()),
            ("SLURM_STEP_ID", "0".into()),
            ("SLURM_PROCID", rank.to_string()),
            ("SLURM_NTASKS", nodes.names.len().to_string()),
            ("SLURM_LOCALID", "0".into()),
            ("SLURM_NODEID", rank.to_string()),
            (
                "SLURM_NODELIST",
                format!("node-[0-{}]", nodes.names.len() - 1),
            ),
            // node-0 is no name this machine resolves: say where task 0 is.
            ("MASTER_ADDR", nodes.master()),
        ],
    };
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

const SOON: Duration = Duration::from_secs(30);

/// Every rank present, then one missing, one killed and one slow, each judged within the
/// deadline and named by its node's host name and address.
fn ranks_as_nodes(launcher: Launcher, subnet: u8, name: &str) {
    let nodes = Nodes::make(subnet, 3);
    let start = |rank: usize, port: u16, args: &[&str], extra: &[(&str, &str)]| {
        let mut vars = vars(launcher, rank, &nodes, port);
        vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let port = port.to_string();
        let mut all = vec!["--world-port", &port];
        all.extend(args);
        nodes.rank(rank, &all, &vars)
    };

    // All present: each rank named by its own host and address.
    let port = free_port("0.0.0.0");
    let followers: Vec<Child> = (1..3).map(|r| start(r, port, &[], &[])).collect();
    let out = finish(start(0, port, &["--world-timeout", "20"], &[]), SOON);
    let checks = world_checks(&out);
    for r in 0..3 {
        let (status, detail) = check(&checks, &format!("rank {r}"));
        assert_eq!(status, "FAIL", "{detail}");
        let who = format!("node-{r} ({}) pid ", nodes.address(r));
        assert!(
            detail.starts_with(&who)
                && detail.ends_with("no GPU (local exit 3); its report is in the JSON"),
            "{name}: {detail}"
        );
    }
    let (_, summary) = check(&checks, "world");
    assert!(
        summary.starts_with(&format!(
            "3 of 3 ranks reported (launched by {name}; rank 0 on node-0"
        )),
        "{summary}"
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    for f in followers {
        assert_eq!(finish(f, SOON).status.code(), Some(3));
    }

    // Rank 2 never comes: missing at the 2 s deadline.
    let port = free_port("0.0.0.0");
    let began = Instant::now();
    let follower = start(1, port, &[], &[]);
    let out = finish(start(0, port, &["--world-timeout", "2"], &[]), SOON);
    let took = began.elapsed();
    let checks = world_checks(&out);
    assert_eq!(
        check(&checks, "rank 2"),
        ("FAIL", "missing: no hello within 2 s")
    );
    assert!(
        check(&checks, "rank 1")
            .1
            .starts_with(&format!("node-1 ({})", nodes.address(1)))
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "{took:?}"
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(finish(follower, SOON).status.code(), Some(3));

    // Rank 2 is killed after its hello: dead, long before the 60 s deadline.
    let port = free_port("0.0.0.0");
    let began = Instant::now();
    let doomed = start(
        2,
        port,
        &[],
        &[("GPUBAKE_WORLD_TEST_DIE_BEFORE_REPORT", "1")],
    );
    let follower = start(1, port, &[], &[]);
    let out = finish(start(0, port, &["--world-timeout", "60"], &[]), SOON);
    assert!(
        began.elapsed() < Duration::from_secs(15),
        "{:?}",
        began.elapsed()
    );
    let checks = world_checks(&out);
    let (status, detail) = check(&checks, "rank 2");
    assert_eq!(status, "FAIL");
    assert!(
        detail.starts_with(&format!("dead: node-2 ({}) pid ", nodes.address(2))),
        "{detail}"
    );
    assert!(check(&checks, "world").1.contains("dead: 2"), "{checks:?}");
    assert_eq!(out.status.code(), Some(1));
    let _ = finish(doomed, SOON);
    assert_eq!(finish(follower, SOON).status.code(), Some(3));

    // Rank 2 reports 30 s late against a 2 s deadline: slow.
    let port = free_port("0.0.0.0");
    let began = Instant::now();
    let mut dawdler = start(
        2,
        port,
        &["--world-timeout", "2"],
        &[("GPUBAKE_WORLD_TEST_REPORT_DELAY_S", "30")],
    );
    let follower = start(1, port, &[], &[]);
    let out = finish(start(0, port, &["--world-timeout", "2"], &[]), SOON);
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "{:?}",
        began.elapsed()
    );
    let checks = world_checks(&out);
    let (status, detail) = check(&checks, "rank 2");
    assert_eq!(status, "FAIL");
    assert!(
        detail.starts_with(&format!("slow: node-2 ({}) pid ", nodes.address(2)))
            && detail.contains("no report within 2 s of the broadcast"),
        "{detail}"
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(finish(follower, SOON).status.code(), Some(3));
    dawdler.kill().unwrap();
    dawdler.wait().unwrap();
}

fn namespaces_work() -> bool {
    if !runnable("making network namespaces") || !have("ip", "-V") || !have("unshare", "--version")
    {
        return false;
    }
    true
}

#[test]
fn torchrun_ranks_in_network_namespaces_are_told_apart_and_judged() {
    if namespaces_work() {
        ranks_as_nodes(Launcher::Torchrun, 231, "torchrun");
    }
}

#[test]
fn slurm_ranks_in_network_namespaces_are_told_apart_and_judged() {
    if namespaces_work() {
        ranks_as_nodes(Launcher::Slurm, 232, "Slurm srun");
    }
}
