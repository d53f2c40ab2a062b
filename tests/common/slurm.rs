//! A one-node Slurm cluster of the tests' own: munged with a key of its own, slurmctld and
//! slurmd (Debian's slurm-wlm) with a minimal slurm.conf in a temporary directory, root as
//! Slurm's user. tests/world_nodes.rs starts ranks on it with srun; tests/prolog.rs runs jobs
//! under examples/slurm's prolog and epilog on it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A free port below Linux's ephemeral range (32768 and up), so that no program's outgoing
/// or passive socket takes it between this choice and its use: srun listens on several
/// ephemeral ports of its own once started, and once took the world's.
pub fn quiet_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 1000) as u16 * 10;
    loop {
        let offset = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert!(offset < 2000, "no free port from {base}");
        let port = base + offset;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
}

/// Processes a test started, stopped when it ends however it ends.
pub struct Daemons(pub Vec<Child>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for child in &mut self.0 {
            // SAFETY: kill(2) on a child of this test that has not been reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        for child in &mut self.0 {
            let until = Instant::now() + Duration::from_secs(5);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How the cluster differs from the plain one.
#[derive(Default)]
pub struct Options<'a> {
    /// Lines added to slurm.conf (`Prolog=...`), each ending in a newline.
    pub conf: &'a str,
    /// A command that slurmd runs under: it is given slurmd's command line as its arguments
    /// and must end by exec'ing them (so that stopping it stops slurmd), e.g. `unshare -m`.
    pub slurmd_under: &'a [&'a str],
}

/// The plain one-node cluster in `dir` (its slurm.conf is `dir/slurm.conf`).
pub fn start(dir: &Path) -> Daemons {
    start_with(dir, &Options::default())
}

/// The one-node cluster in `dir` with `opts`; returns once the node is idle. Node
/// `localhost`, 4 CPUs, partition `test`; no cgroups, no accounting.
pub fn start_with(dir: &Path, opts: &Options) -> Daemons {
    use std::os::unix::fs::PermissionsExt;
    // munged wants every directory above its socket searchable by all.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let key = dir.join("munge.key");
    let socket = dir.join("munge.sock");
    let made = Command::new("mungekey")
        .args(["--create", "--keyfile"])
        .arg(&key)
        .output()
        .expect("mungekey runs");
    assert!(
        made.status.success(),
        "mungekey: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let log = |name: &str| std::fs::File::create(dir.join(name)).unwrap();
    let munged = Command::new("munged")
        .arg("--foreground")
        // As root, and with the key outside /etc/munge: munged asks to be forced.
        .arg("--force")
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--key-file={}", key.display()))
        .arg(format!("--pid-file={}", dir.join("munged.pid").display()))
        .arg(format!("--seed-file={}", dir.join("munged.seed").display()))
        .arg(format!("--log-file={}", dir.join("munged.log").display()))
        .stdout(log("munged.out"))
        .stderr(log("munged.err"))
        .spawn()
        .expect("munged starts");
    let mut daemons = Daemons(vec![munged]);
    let until = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < until, "munged made no socket");
        std::thread::sleep(Duration::from_millis(50));
    }
    let conf = dir.join("slurm.conf");
    let at = |name: &str| dir.join(name).display().to_string();
    std::fs::create_dir_all(dir.join("state")).unwrap();
    std::fs::create_dir_all(dir.join("spool")).unwrap();
    let text = format!(
        "ClusterName=gpubake\n\
         SlurmctldHost=localhost(127.0.0.1)\n\
         SlurmUser=root\n\
         SlurmdUser=root\n\
         AuthType=auth/munge\n\
         AuthInfo=socket={socket}\n\
         CredType=cred/munge\n\
         SlurmctldPort={ctld}\n\
         SlurmdPort={slurmd}\n\
         StateSaveLocation={state}\n\
         SlurmdSpoolDir={spool}\n\
         SlurmctldPidFile={ctld_pid}\n\
         SlurmdPidFile={slurmd_pid}\n\
         SlurmctldLogFile={ctld_log}\n\
         SlurmdLogFile={slurmd_log}\n\
         ProctrackType=proctrack/linuxproc\n\
         TaskPlugin=task/none\n\
         SelectType=select/cons_tres\n\
         SelectTypeParameters=CR_CPU\n\
         SchedulerType=sched/builtin\n\
         MpiDefault=none\n\
         JobAcctGatherType=jobacct_gather/none\n\
         AccountingStorageType=accounting_storage/none\n\
         ReturnToService=2\n\
         SlurmdParameters=config_overrides\n\
         {extra}\
         NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN\n\
         PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n",
        socket = socket.display(),
        ctld = quiet_port(),
        slurmd = quiet_port(),
        state = at("state"),
        spool = at("spool"),
        ctld_pid = at("slurmctld.pid"),
        slurmd_pid = at("slurmd.pid"),
        ctld_log = at("slurmctld.log"),
        slurmd_log = at("slurmd.log"),
        extra = opts.conf,
    );
    std::fs::write(&conf, text).unwrap();
    let slurmd: Vec<&str> = opts
        .slurmd_under
        .iter()
        .copied()
        .chain(["slurmd", "-D", "-N", "localhost", "-f"])
        .collect();
    for (program, args) in [
        ("slurmctld", &["-D", "-i", "-f"][..]),
        (slurmd[0], &slurmd[1..]),
    ] {
        let name = if program == "slurmctld" {
            "slurmctld"
        } else {
            "slurmd"
        };
        let child = Command::new(program)
            .args(args)
            .arg(&conf)
            .env("SLURM_CONF", &conf)
            .stdout(log(&format!("{name}.out")))
            .stderr(log(&format!("{name}.err")))
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        daemons.0.push(child);
    }
    // The node is ready once slurmd has registered with slurmctld.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let state = Command::new("sinfo")
            .args(["-h", "-o", "%t"])
            .env("SLURM_CONF", &conf)
            .output()
            .unwrap();
        let state = String::from_utf8_lossy(&state.stdout).trim().to_string();
        if state == "idle" {
            break;
        }
        if Instant::now() > until {
            panic!("the Slurm node never became idle: {state}\n{}", logs(dir));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    daemons
}

/// The daemons' logs in `dir`, for a failure's message.
pub fn logs(dir: &Path) -> String {
    [
        "slurmctld.log",
        "slurmd.log",
        "slurmctld.err",
        "slurmd.err",
        "munged.log",
    ]
    .iter()
    .map(|f| {
        format!(
            "--- {f}\n{}",
            std::fs::read_to_string(dir.join(f)).unwrap_or_default()
        )
    })
    .collect()
}
