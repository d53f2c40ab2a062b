//! `gpubake probe --world` as torchrun would start it, with every rank a process on
//! 127.0.0.1: rank 0's verdict must name every rank, and name a rank that never comes as
//! missing, one that dies after its hello as dead and one that reports too late as slow,
//! each within seconds. Without a GPU every local probe exits 3, and the world still
//! aggregates. On a GPU node these tests step aside: three full local probes take minutes.

mod common;

use common::world::{check, finish, free_port, verdict};
use common::{assert_exit, stderr, stdout};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn gpu_present() -> bool {
    let present = std::path::Path::new("/dev/nvidia0").exists();
    if present {
        eprintln!("skipped: a GPU is present; the local probes would take minutes");
    }
    present
}

/// Starts rank `rank` of `world` as torchrun --no-python would, with `extra` arguments and
/// test-only variables.
fn rank(rank: u32, world: u32, port: u16, extra: &[&str], vars: &[(&str, &str)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(["probe", "--world", "--world-port", &port.to_string()])
        .args(extra)
        .env("TORCHELASTIC_RUN_ID", "test-run")
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", (port - 1).to_string())
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the gpubake binary runs")
}

const SOON: Duration = Duration::from_secs(20);

#[test]
fn rank_zero_aggregates_every_rank() {
    if gpu_present() {
        return;
    }
    let port = free_port("127.0.0.1");
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("world.xml");
    // The followers start first: they must wait for rank 0 to listen.
    let followers: Vec<Child> = (1..3).map(|r| rank(r, 3, port, &[], &[])).collect();
    let pids: Vec<u32> = followers.iter().map(Child::id).collect();
    std::thread::sleep(Duration::from_millis(300));
    let leader = rank(
        0,
        3,
        port,
        &["--json", "--junit", junit.to_str().unwrap()],
        &[],
    );
    let leader_pid = leader.id();
    let out = finish(leader, SOON);
    assert_exit(&out, 3);
    let (json, checks) = verdict(&out);
    for (r, pid) in [(0, leader_pid), (1, pids[0]), (2, pids[1])] {
        let (status, detail) = check(&checks, &format!("rank {r}"));
        assert_eq!(status, "FAIL", "{detail}");
        assert!(
            detail.contains(&format!("pid {pid}: no GPU (local exit 3)")),
            "{detail}"
        );
        let local = &json["facts"]["world"]["ranks"][r as usize];
        assert_eq!(local["state"], "reported");
        assert_eq!(local["exit_code"], 3);
        assert_eq!(local["report"]["no_gpu"], true);
    }
    assert_eq!(check(&checks, "broadcast").0, "PASS");
    // No communicator without GPUs; each row says why, per rank.
    for name in [
        "NCCL across ranks",
        "all-reduce busbw across ranks",
        "slowest pair",
    ] {
        let (status, why) = check(&checks, name);
        assert_eq!(status, "SKIP", "{why}");
        assert!(
            why.starts_with("no communicator: rank 0 (")
                && why.matches("no GPU on this node (local exit 3)").count() == 3,
            "{why}"
        );
    }
    assert!(
        check(&checks, "rank 1").1.starts_with(&format!(
            "{} (127.0.0.1) pid",
            json["facts"]["world"]["place"]["node"].as_str().unwrap()
        )),
        "{checks:?}"
    );
    let (_, summary) = check(&checks, "world");
    assert!(
        summary.starts_with("3 of 3 ranks reported") && summary.contains("no GPU: 0, 1, 2"),
        "{summary}"
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("<testsuite name=\"world\""), "{xml}");

    for follower in followers {
        let out = finish(follower, SOON);
        assert_exit(&out, 3);
        let text = stdout(&out);
        assert!(text.contains("# nvml"), "{text}");
        assert!(
            text.contains("PASS  rendezvous")
                && text.contains(&format!("rank 0 at 127.0.0.1:{port} counted")),
            "{text}"
        );
    }
}

#[test]
fn the_default_port_is_one_above_master_port() {
    if gpu_present() {
        return;
    }
    // Only one rank: rank 0 listens, needs nobody, and says where it listened.
    let port = free_port("127.0.0.1");
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(["probe", "--world"])
        .env("TORCHELASTIC_RUN_ID", "solo")
        .env("RANK", "0")
        .env("LOCAL_RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", (port - 1).to_string())
        .output()
        .unwrap();
    assert_exit(&out, 3);
    assert!(
        stdout(&out).contains("1 of 1 ranks reported (launched by torchrun; rank 0 on"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains(&format!("port {port})")),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_rank_that_never_comes_is_missing_at_the_deadline() {
    if gpu_present() {
        return;
    }
    let port = free_port("127.0.0.1");
    let started = Instant::now();
    let follower = rank(1, 3, port, &[], &[]);
    let leader = rank(0, 3, port, &["--json", "--world-timeout", "2"], &[]);
    let out = finish(leader, SOON);
    let took = started.elapsed();
    assert_exit(&out, 1);
    let (_, checks) = verdict(&out);
    assert_eq!(
        check(&checks, "rank 2"),
        ("FAIL", "missing: no hello within 2 s")
    );
    assert!(check(&checks, "rank 1").1.contains("no GPU"));
    assert!(
        check(&checks, "world").1.contains("2 of 3 ranks reported")
            && check(&checks, "world").1.contains("missing: 2"),
        "{checks:?}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "{took:?}"
    );
    // The rank that came was counted, and keeps its own exit code.
    let out = finish(follower, SOON);
    assert_exit(&out, 3);
    assert!(
        stdout(&out).contains("PASS  rendezvous"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_rank_killed_after_its_hello_is_dead_without_waiting_for_the_deadline() {
    if gpu_present() {
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    let port = free_port("127.0.0.1");
    let started = Instant::now();
    let doomed = rank(
        2,
        3,
        port,
        &[],
        &[("GPUBAKE_WORLD_TEST_DIE_BEFORE_REPORT", "1")],
    );
    let doomed_pid = doomed.id();
    let follower = rank(1, 3, port, &[], &[]);
    // A long deadline: a dead rank is known as soon as its connection closes.
    let leader = rank(0, 3, port, &["--json", "--world-timeout", "60"], &[]);
    let out = finish(leader, SOON);
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_exit(&out, 1);
    let (_, checks) = verdict(&out);
    let (status, detail) = check(&checks, "rank 2");
    assert_eq!(status, "FAIL");
    assert!(
        detail.starts_with("dead: ") && detail.contains(&format!("pid {doomed_pid} said hello")),
        "{detail}"
    );
    assert!(check(&checks, "world").1.contains("dead: 2"), "{checks:?}");
    assert_eq!(finish(doomed, SOON).status.signal(), Some(libc::SIGKILL));
    assert_exit(&finish(follower, SOON), 3);
}

#[test]
fn a_rank_that_reports_past_the_deadline_is_slow() {
    if gpu_present() {
        return;
    }
    let port = free_port("127.0.0.1");
    let started = Instant::now();
    let mut dawdler = rank(
        2,
        3,
        port,
        &["--world-timeout", "2"],
        &[("GPUBAKE_WORLD_TEST_REPORT_DELAY_S", "30")],
    );
    let follower = rank(1, 3, port, &[], &[]);
    let leader = rank(0, 3, port, &["--json", "--world-timeout", "2"], &[]);
    let out = finish(leader, SOON);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_exit(&out, 1);
    let (_, checks) = verdict(&out);
    let (status, detail) = check(&checks, "rank 2");
    assert_eq!(status, "FAIL");
    assert!(
        detail.starts_with("slow: ") && detail.contains("no report within 2 s of the broadcast"),
        "{detail}"
    );
    assert!(check(&checks, "world").1.contains("slow: 2"), "{checks:?}");
    assert_exit(&finish(follower, SOON), 3);
    dawdler.kill().unwrap();
    dawdler.wait().unwrap();
}

#[test]
fn launcher_variables_that_do_not_add_up_are_exit_2_naming_them() {
    let run = |vars: &[(&str, &str)]| {
        Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .args(["probe", "--world"])
            .env_clear()
            .envs(vars.iter().copied())
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("RANK, SLURM_PROCID"),
        "{}",
        stderr(&out)
    );

    let out = run(&[
        ("SLURM_PROCID", "4"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NODELIST", "gpu[01-04]"),
    ]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("SLURM_PROCID, SLURM_NTASKS: rank 4 is not below the world size 4"),
        "{}",
        stderr(&out)
    );

    let out = run(&[("RANK", "1"), ("WORLD_SIZE", "2")]);
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("MASTER_ADDR"), "{}", stderr(&out));

    // --world-port without --world is a usage error from clap.
    assert_exit(&common::gpubake(&["probe", "--world-port", "4000"]), 2);
}

/// `--world-nccl-log DIR` without a GPU: no rank runs NCCL, so the directory is made but
/// left empty, each rank says why on standard error, and the verdict is the usual one
/// without GPUs (exit 3, NCCL's rows SKIP).
#[test]
fn an_nccl_log_directory_without_gpus_is_left_empty_with_the_reason() {
    if gpu_present() {
        return;
    }
    let port = free_port("127.0.0.1");
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("nccl-logs");
    let logs_arg = ["--world-nccl-log", logs.to_str().unwrap()];
    let follower = rank(1, 2, port, &logs_arg, &[]);
    let leader = rank(0, 2, port, &[&["--json"][..], &logs_arg].concat(), &[]);
    let out = finish(leader, SOON);
    assert_exit(&out, 3);
    let (_, checks) = verdict(&out);
    let (status, why) = check(&checks, "NCCL across ranks");
    assert_eq!(status, "SKIP", "{why}");
    assert!(
        check(&checks, "world")
            .1
            .starts_with("2 of 2 ranks reported"),
        "{checks:?}"
    );
    let follower = finish(follower, SOON);
    assert_exit(&follower, 3);
    for (r, out) in [(0, &out), (1, &follower)] {
        let err = stderr(out);
        let said = format!(
            "gpubake: --world-nccl-log: no NCCL log as {}/nccl-rank{r} from the run under \
             the preset: no GPU on this node (local exit 3)",
            logs.display()
        );
        assert!(err.contains(&said), "rank {r}: {err}");
    }
    let kept: Vec<_> = std::fs::read_dir(&logs)
        .expect("the directory is made even when nothing fills it")
        .collect();
    assert!(kept.is_empty(), "{kept:?}");
}

/// A directory that cannot be made is refused before the probe runs, naming it.
#[test]
fn an_nccl_log_directory_that_cannot_be_made_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let inside = file.join("logs");
    let started = Instant::now();
    let out = finish(
        rank(
            0,
            1,
            free_port("127.0.0.1"),
            &["--world-nccl-log", inside.to_str().unwrap()],
            &[],
        ),
        SOON,
    );
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains(&format!("--world-nccl-log {}:", inside.display())),
        "{}",
        stderr(&out)
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}
