//! The scheduler hooks of `gpubake probe` as a cluster runs them.
//!
//! examples/slurm/: prolog.sh and epilog.sh as slurmd's Prolog= and Epilog= in a one-node
//! Slurm cluster of the test's own (tests/common/slurm.rs), configured with the lines of
//! examples/slurm/slurm.conf. The node is a GPU node as far as level 1 can tell: slurmd runs
//! in a mount namespace of its own whose /dev holds the device nodes of two GPUs (character
//! devices 195:0, 195:1 and 195:255, as the driver makes them), and the prolog's settings put
//! a libnvidia-ml and a libcuda built here with gcc first on the loader's path: an NVML that
//! answers every call level 1 makes as two healthy H200s would, and a libcuda whose cuInit
//! succeeds. The same NVML built with GPU 1 lost (NVML_ERROR_GPU_IS_LOST from
//! nvmlDeviceGetHandleByIndex) is the fault. A failed probe must drain the node with a reason
//! naming the check and keep the job off it; a passing one must let the job run.
//!
//! These need root (namespaces, mounts, Slurm's daemons), Debian's slurm-wlm and munge, and
//! gcc: outside CI they skip with the reason; in CI (CI set) they fail instead.
//!
//! examples/kubernetes/: the DaemonSet's essentials, read from its YAML.

mod common;
#[path = "common/slurm.rs"]
mod slurm;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Skips (printing why) where a tool or root is missing; in CI, fails instead.
fn missing(what: &str) -> bool {
    assert!(
        std::env::var_os("CI").is_none(),
        "CI runs as root with scripts/test's packages; {what}"
    );
    eprintln!("skipped: {what}");
    true
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

/// True where a Slurm cluster with a fake GPU node can run here.
fn runnable() -> bool {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return !missing("a Slurm cluster and a mount namespace need root");
    }
    for tool in [
        "slurmctld",
        "slurmd",
        "munged",
        "mungekey",
        "sbatch",
        "scontrol",
        "sinfo",
        "gcc",
        "unshare",
        "mknod",
        "mount",
    ] {
        // slurmctld and slurmd live in sbin, which a user's PATH may lack.
        let found = on_path(tool)
            || ["/usr/sbin", "/sbin"]
                .iter()
                .any(|d| Path::new(d).join(tool).is_file());
        if !found {
            return !missing(&format!("{tool} is not installed"));
        }
    }
    true
}

/// An NVML of driver 580.95.05 (CUDA 13.0) with two H200s that answers every call of the
/// probe's level 1 as healthy GPUs do: ECC on without errors, persistence on, MIG off, idle
/// clocks, PCIe Gen5 x16, 18 NVLink links up, P2P possible, no remapped rows, fabric
/// registration completed. Built with `-DLOST=1`, GPU 1 cannot be opened: 15 is
/// NVML_ERROR_GPU_IS_LOST. Layouts are NVML's (nvml.h, as nvml-wrapper-sys binds them).
const NVML: &str = r#"
#include <stdio.h>
#include <string.h>
#ifndef LOST
#define LOST -1
#endif
#define GPUS 2
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } memory_v2;
typedef struct {
    char bus_id_legacy[16];
    unsigned domain, bus, device, device_id, subsystem_id;
    char bus_id[32];
} pci_info;
typedef struct { unsigned char cluster[16]; unsigned status; unsigned clique; unsigned char state; } fabric;
static int gpu[GPUS];
static int index_of(void *h) { return (int)((int *)h - gpu); }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return r == 15 ? "GPU is lost" : "error"; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) { snprintf(b, n, "580.95.05"); return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned *c) { *c = GPUS; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
    if (i >= GPUS) return 2;
    if ((int)i == LOST) return 15;
    *h = &gpu[i];
    return 0;
}
int nvmlDeviceGetName(void *h, char *b, unsigned n) { snprintf(b, n, "NVIDIA H200"); return 0; }
int nvmlDeviceGetUUID(void *h, char *b, unsigned n) {
    snprintf(b, n, "GPU-6a1f3c2e-0000-4000-8000-00000000000%d", index_of(h));
    return 0;
}
int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) { *major = 9; *minor = 0; return 0; }
int nvmlDeviceGetBrand(void *h, unsigned *brand) { *brand = 14; return 0; }
int nvmlDeviceGetMemoryInfo_v2(void *h, memory_v2 *m) {
    m->total = 150754820096ULL; m->reserved = 0; m->used = 0; m->free = m->total;
    return 0;
}
int nvmlDeviceGetPciInfo_v3(void *h, pci_info *p) {
    memset(p, 0, sizeof *p);
    p->bus = 0x1b + 0x28 * index_of(h);
    p->device_id = 0x233510de;
    p->subsystem_id = 0x18be10de;
    snprintf(p->bus_id, sizeof p->bus_id, "00000000:%02X:00.0", p->bus);
    snprintf(p->bus_id_legacy, sizeof p->bus_id_legacy, "0000:%02X:00.0", p->bus);
    return 0;
}
int nvmlDeviceGetEccMode(void *h, unsigned *current, unsigned *pending) { *current = *pending = 1; return 0; }
int nvmlDeviceGetTotalEccErrors(void *h, unsigned type, unsigned counter, unsigned long long *n) { *n = 0; return 0; }
int nvmlDeviceGetRetiredPagesPendingStatus(void *h, unsigned *pending) { *pending = 0; return 0; }
int nvmlDeviceGetRemappedRows(void *h, unsigned *corrected, unsigned *uncorrected, unsigned *pending, unsigned *failed) {
    *corrected = *uncorrected = *pending = *failed = 0;
    return 0;
}
int nvmlDeviceGetPersistenceMode(void *h, unsigned *mode) { *mode = 1; return 0; }
int nvmlDeviceGetMigMode(void *h, unsigned *current, unsigned *pending) { *current = *pending = 0; return 0; }
int nvmlDeviceGetClockInfo(void *h, unsigned type, unsigned *mhz) { *mhz = 345; return 0; }
int nvmlDeviceGetMaxClockInfo(void *h, unsigned type, unsigned *mhz) { *mhz = 1980; return 0; }
/* 1: nvmlClocksThrottleReasonGpuIdle, the one reason of an idle GPU. */
int nvmlDeviceGetCurrentClocksThrottleReasons(void *h, unsigned long long *r) { *r = 1; return 0; }
int nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *r) { *r = 1; return 0; }
int nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned *g) { *g = 5; return 0; }
int nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned *w) { *w = 16; return 0; }
int nvmlDeviceGetMaxPcieLinkGeneration(void *h, unsigned *g) { *g = 5; return 0; }
int nvmlDeviceGetMaxPcieLinkWidth(void *h, unsigned *w) { *w = 16; return 0; }
int nvmlDeviceGetNvLinkState(void *h, unsigned link, unsigned *active) {
    if (link >= 18) return 2;
    *active = 1;
    return 0;
}
int nvmlDeviceGetCpuAffinity(void *h, unsigned words, unsigned long *set) {
    memset(set, 0, words * sizeof *set);
    set[0] = index_of(h) ? 0xf0UL : 0x0fUL;
    return 0;
}
int nvmlDeviceGetNumaNodeId(void *h, unsigned *node) { *node = 0; return 0; }
/* 40: NVML_TOPOLOGY_NODE. */
int nvmlDeviceGetTopologyCommonAncestor(void *a, void *b, unsigned *level) { *level = 40; return 0; }
int nvmlDeviceGetP2PStatus(void *a, void *b, unsigned caps, unsigned *status) { *status = 0; return 0; }
/* 3: NVML_GPU_FABRIC_STATE_COMPLETED, status NVML_SUCCESS. */
int nvmlDeviceGetGpuFabricInfo(void *h, fabric *f) {
    memset(f, 0, sizeof *f); f->state = 3; f->status = 0; f->clique = 1;
    return 0;
}
"#;

/// A libcuda of the same driver whose cuInit succeeds.
const CUDA: &str = "int cuInit(unsigned flags) { return 0; }\n\
                    int cuDriverGetVersion(int *v) { *v = 13000; return 0; }\n";

/// Runs a command under `unshare -m`, in a /dev of its own: a tmpfs holding the host's
/// null, zero, full, random, urandom and tty, its pts, shm and mqueue, and the nodes the
/// NVIDIA driver makes for two GPUs; then execs the command (slurmd), so stopping this
/// process stops it.
const NODE: &str = r#"set -eu
d=$1/dev
shift
mkdir -p "$d"
mount -t tmpfs -o mode=755 gpubake-dev "$d"
for n in null zero full random urandom tty; do
  : >"$d/$n"
  mount --bind "/dev/$n" "$d/$n"
done
for n in pts shm mqueue; do
  if [ -d "/dev/$n" ]; then mkdir "$d/$n" && mount --rbind "/dev/$n" "$d/$n"; fi
done
ln -s /proc/self/fd "$d/fd"
ln -s /proc/self/fd/0 "$d/stdin"
ln -s /proc/self/fd/1 "$d/stdout"
ln -s /proc/self/fd/2 "$d/stderr"
ln -s pts/ptmx "$d/ptmx"
mknod -m 666 "$d/nvidiactl" c 195 255
mknod -m 666 "$d/nvidia0" c 195 0
mknod -m 666 "$d/nvidia1" c 195 1
mount --move "$d" /dev
exec "$@"
"#;

/// Builds `source` into `dir/file` with DT_SONAME `soname`, and `dir/soname` as a link to it.
fn gcc(dir: &Path, file: &str, soname: &str, source: &str, defines: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    let c = dir.join(format!("{file}.c"));
    std::fs::write(&c, source).unwrap();
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join(file))
        .arg(format!("-Wl,-soname,{soname}"))
        .args(defines)
        .arg(&c)
        .output()
        .expect("gcc runs");
    assert!(
        out.status.success(),
        "gcc {file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::os::unix::fs::symlink(file, dir.join(soname)).unwrap();
}

/// The fake GPUs' files in `dir`: `healthy/` and `lost/` (NVML and libcuda builds),
/// `driver/` linking to the healthy ones (the directory the probe is pointed at),
/// `no-driver/` (empty) and `node.sh`, which runs a command on the fake node. Returns node.sh.
fn fake_gpus(dir: &Path) -> PathBuf {
    let nvml = "libnvidia-ml.so.580.95.05";
    let cuda = "libcuda.so.580.95.05";
    gcc(&dir.join("healthy"), nvml, "libnvidia-ml.so.1", NVML, &[]);
    gcc(&dir.join("healthy"), cuda, "libcuda.so.1", CUDA, &[]);
    gcc(
        &dir.join("lost"),
        nvml,
        "libnvidia-ml.so.1",
        NVML,
        &["-DLOST=1"],
    );
    gcc(&dir.join("lost"), cuda, "libcuda.so.1", CUDA, &[]);
    std::fs::create_dir_all(dir.join("driver")).unwrap();
    std::fs::create_dir_all(dir.join("no-driver")).unwrap();
    for lib in ["libnvidia-ml.so.1", "libcuda.so.1"] {
        std::os::unix::fs::symlink(dir.join("healthy").join(lib), dir.join("driver").join(lib))
            .unwrap();
    }
    let node = dir.join("node.sh");
    std::fs::write(&node, NODE).unwrap();
    node
}

/// Points `dir/driver/libnvidia-ml.so.1` at the build in `dir/build`: GPU 1 falls off the bus
/// (`lost`) or comes back (`healthy`).
fn switch_nvml(dir: &Path, build: &str) {
    let link = dir.join("driver/libnvidia-ml.so.1");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(dir.join(build).join("libnvidia-ml.so.1"), &link).unwrap();
}

/// A one-node cluster whose node is a fake GPU node, with examples/slurm's hooks.
struct GpuNode {
    dir: tempfile::TempDir,
    _cluster: slurm::Daemons,
}

impl GpuNode {
    /// The cluster, its probe's settings `settings` (shell lines for gpubake-probe.conf,
    /// `{dir}` standing for the cluster's directory) after those every test has: the binary,
    /// the report directory, and `driver/` first on the loader's path, its libraries linked
    /// to the healthy builds.
    fn start(settings: &str) -> GpuNode {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let node = fake_gpus(d);
        for made in ["metrics", "features.d"] {
            std::fs::create_dir_all(d.join(made)).unwrap();
        }
        let conf = format!(
            "GPUBAKE_BIN={bin}\nGPUBAKE_REPORT_DIR={dir}/reports\n\
             LD_LIBRARY_PATH={dir}/driver\nexport LD_LIBRARY_PATH\n{settings}",
            bin = env!("CARGO_BIN_EXE_gpubake"),
            dir = d.display()
        )
        .replace("{dir}", &d.display().to_string());
        std::fs::write(d.join("gpubake-probe.conf"), conf).unwrap();
        let lines = hooks_conf();
        let node = node.display().to_string();
        let dir_text = d.display().to_string();
        let cluster = slurm::start_with(
            d,
            &slurm::Options {
                conf: &lines,
                slurmd_under: &[
                    "unshare",
                    "-m",
                    "--propagation",
                    "private",
                    "sh",
                    &node,
                    &dir_text,
                ],
            },
        );
        GpuNode {
            dir,
            _cluster: cluster,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    /// A Slurm command against this cluster.
    fn slurm(&self, program: &str, args: &[&str]) -> Output {
        Command::new(program)
            .args(args)
            .env("SLURM_CONF", self.path("slurm.conf"))
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    }

    /// Submits `script` as a batch job whose output goes to `dir/job.out`; its id.
    fn submit(&self, script: &str) -> String {
        let out = self.slurm(
            "sbatch",
            &[
                "--parsable",
                "-o",
                &self.path("job.out").display().to_string(),
                "--wrap",
                script,
            ],
        );
        assert!(out.status.success(), "sbatch: {}", common::stderr(&out));
        common::stdout(&out).trim().to_string()
    }

    /// `KEY=value` of `scontrol -o show job ID`.
    fn job(&self, id: &str, key: &str) -> String {
        let out = self.slurm("scontrol", &["-o", "show", "job", id]);
        common::stdout(&out)
            .split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{key}=")).map(String::from))
            .unwrap_or_default()
    }

    /// The node's state as sinfo abbreviates it (idle, comp, drain) and its reason.
    fn node(&self) -> (String, String) {
        let out = self.slurm("sinfo", &["-h", "-N", "-o", "%t|%E"]);
        let text = common::stdout(&out);
        let (state, reason) = text.trim().split_once('|').unwrap_or((text.trim(), ""));
        (state.to_string(), reason.to_string())
    }

    /// Waits up to a minute for `done`, failing with the cluster's logs and reports.
    fn wait(&self, what: &str, mut done: impl FnMut(&GpuNode) -> bool) {
        let until = Instant::now() + Duration::from_secs(60);
        while !done(self) {
            assert!(
                Instant::now() < until,
                "{what}: not within 60 s; node {:?}\nhooks.log:\n{}\nprolog.txt:\n{}\n{}",
                self.node(),
                self.read("reports/hooks.log"),
                self.read("reports/prolog.txt"),
                slurm::logs(self.dir.path())
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits for job `id` to finish, then for the node to leave `completing` (the epilog).
    fn finish(&self, id: &str) -> String {
        self.wait("the job ends", |n| {
            matches!(
                n.job(id, "JobState").as_str(),
                "COMPLETED" | "FAILED" | "CANCELLED"
            )
        });
        self.wait("the epilog ends", |n| !n.node().0.starts_with("comp"));
        self.job(id, "JobState")
    }
}

/// examples/slurm/slurm.conf's lines, the scripts named where this checkout has them.
fn hooks_conf() -> String {
    let examples = common::root().join("examples/slurm");
    let text = std::fs::read_to_string(examples.join("slurm.conf")).unwrap();
    let lines: String = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        lines.contains("Prolog=/etc/slurm/gpubake/prolog.sh\n")
            && lines.contains("Epilog=/etc/slurm/gpubake/epilog.sh\n"),
        "{lines}"
    );
    lines.replace("/etc/slurm/gpubake/", &format!("{}/", examples.display()))
}

/// A job that leaves `ran.ID` beside slurm.conf when it runs.
fn marking_job(node: &GpuNode) -> String {
    format!("echo ran > {}/ran.$SLURM_JOB_ID", node.dir.path().display())
}

#[test]
fn a_passing_probe_leaves_the_node_up_and_the_job_runs() {
    if !runnable() {
        return;
    }
    let node = GpuNode::start(
        "GPUBAKE_PROMETHEUS_FILE={dir}/metrics/gpubake.prom\n\
         GPUBAKE_NFD_FILE={dir}/features.d/gpubake\n",
    );
    let id = node.submit(&marking_job(&node));
    assert_eq!(node.finish(&id), "COMPLETED", "{}", node.read("job.out"));
    assert!(node.path(&format!("ran.{id}")).exists());
    assert_eq!(node.node(), ("idle".to_string(), "none".to_string()));

    // The prolog's report is level 1's on two healthy GPUs: nothing failed, nothing missing.
    let report = node.read("reports/prolog.txt");
    for line in [
        "PASS  /dev/nvidia*                2 GPU nodes; nvidia0 nvidia1 nvidiactl",
        "PASS  libnvidia-ml.so.1",
        "PASS  GPU 0 model                 NVIDIA H200, sm_90, 140 GiB, policy H200 SXM",
        "PASS  GPU 1 NVLink                18 of 18 links up",
        "PASS  P2P status (NVML)",
        "PASS  cuInit",
    ] {
        assert!(report.contains(line), "{line}:\n{report}");
    }
    assert!(!report.contains("FAIL"), "{report}");
    assert!(report.contains(", 0 failed, "), "{report}");
    let junit = node.read("reports/prolog.xml");
    assert!(
        junit.starts_with("<?xml") && junit.contains("<testsuite name=\"nvml\""),
        "{junit}"
    );
    let log = node.read("reports/hooks.log");
    for hook in ["prolog", "epilog"] {
        assert!(
            log.contains(&format!(
                "{hook} job {id} node localhost: probe level 1 exit 0: pass"
            )),
            "{log}"
        );
    }
    assert!(node.read("reports/epilog.txt").contains(", 0 failed, "));
    // What node_exporter and NFD read, from the epilog's run, the last.
    let metrics = node.read("metrics/gpubake.prom");
    assert!(metrics.contains("\ngpubake_probe_healthy 1\n"), "{metrics}");
    let labels = node.read("features.d/gpubake");
    assert!(
        labels.contains("\ngpubake.io/health=pass\n") && labels.contains("gpubake.io/gpu-count=2"),
        "{labels}"
    );
}

#[test]
fn a_failing_probe_drains_the_node_naming_the_check_and_the_job_does_not_run() {
    if !runnable() {
        return;
    }
    let node = GpuNode::start("");
    // GPU 1 falls off the bus before the job comes.
    switch_nvml(node.dir.path(), "lost");
    let id = node.submit(&marking_job(&node));
    node.wait("the node is drained", |n| n.node().0 == "drain");
    let (_, reason) = node.node();
    assert!(
        reason.starts_with(&format!(
            "gpubake prolog level 1 (job {id}): FAIL nvml: GPU 1 -- NVML cannot open this GPU: "
        )),
        "{reason}"
    );
    // Slurm requeued the job (SchedulerParameters=nohold_on_prolog_fail: pending, not held),
    // and it never ran here.
    node.wait("the job is requeued", |n| n.job(&id, "Restarts") == "1");
    assert_eq!(node.job(&id, "JobState"), "PENDING");
    assert!(!node.path(&format!("ran.{id}")).exists());
    assert!(node.read("reports/prolog.txt").contains("FAIL  GPU 1"));
    // The epilog of the same job failed the same way and kept the prolog's reason.
    node.wait("the epilog ran", |n| {
        n.read("reports/hooks.log").contains(&format!(
            "epilog job {id} node localhost: node already drained"
        ))
    });
    assert_eq!(node.node().1, reason);
}

#[test]
fn a_gpu_lost_during_the_job_drains_the_node_from_the_epilog() {
    if !runnable() {
        return;
    }
    let node = GpuNode::start("");
    // The job runs, and GPU 1 falls off the bus under it.
    let script = format!(
        "{} && ln -sfn {} {}",
        marking_job(&node),
        node.path("lost/libnvidia-ml.so.1").display(),
        node.path("driver/libnvidia-ml.so.1").display()
    );
    let id = node.submit(&script);
    assert_eq!(node.finish(&id), "COMPLETED", "{}", node.read("job.out"));
    assert!(node.path(&format!("ran.{id}")).exists());
    let (state, reason) = node.node();
    assert_eq!(state, "drain", "{reason}");
    assert!(
        reason.starts_with(&format!(
            "gpubake epilog level 1 (job {id}): FAIL nvml: GPU 1 -- NVML cannot open this GPU: "
        )),
        "{reason}"
    );
    assert!(node.read("reports/epilog.txt").contains("FAIL  GPU 1"));
}

#[test]
fn no_gpu_drains_a_gpu_node_and_passes_where_told_to() {
    if !runnable() {
        return;
    }
    if Path::new("/dev/nvidia0").exists() {
        eprintln!("skipped: a GPU is present; its own driver would answer");
        return;
    }
    // No driver library anywhere: exit 3. Told that this node has no GPUs, the job runs.
    let node = GpuNode::start("LD_LIBRARY_PATH={dir}/no-driver\nGPUBAKE_ON_NO_GPU=pass\n");
    let id = node.submit(&marking_job(&node));
    assert_eq!(node.finish(&id), "COMPLETED");
    assert!(node.path(&format!("ran.{id}")).exists());
    assert_eq!(node.node().0, "idle");
    assert!(
        node.read("reports/hooks.log").contains(&format!(
            "prolog job {id} node localhost: probe level 1 exit 3: pass"
        )),
        "{}",
        node.read("reports/hooks.log")
    );

    // By default, a GPU node without a GPU is drained.
    let conf = node.path("gpubake-probe.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, text.replace("GPUBAKE_ON_NO_GPU=pass", "")).unwrap();
    let id = node.submit(&marking_job(&node));
    node.wait("the node is drained", |n| n.node().0 == "drain");
    let reason = node.node().1;
    assert!(
        reason.starts_with(&format!(
            "gpubake prolog level 1 (job {id}): no GPU visible (exit 3): FAIL environment: libcuda.so.1, environment: libnvidia-ml.so.1, nvml: NVML -- "
        )),
        "{reason}"
    );
    assert!(!node.path(&format!("ran.{id}")).exists());
}

/// A flag the probe refuses (exit 2) drains the node in the probe's own words; once the
/// settings are fixed and the node resumed, jobs run.
#[test]
fn bad_settings_drain_the_node_in_the_probe_s_words_until_fixed() {
    if !runnable() {
        return;
    }
    let node = GpuNode::start("GPUBAKE_PROBE_FLAGS=\"--policy {dir}/absent.yaml\"\n");
    let id = node.submit(&marking_job(&node));
    node.wait("the node is drained", |n| n.node().0 == "drain");
    let reason = node.node().1;
    assert_eq!(
        reason,
        format!(
            "gpubake prolog level 1 (job {id}): bad input (exit 2): error: reading {}/absent.yaml: \
             No such file or directory (os error 2)",
            node.dir.path().display()
        )
    );
    assert!(!node.path(&format!("ran.{id}")).exists());

    let conf = node.path("gpubake-probe.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    let fixed: String = text
        .lines()
        .filter(|l| !l.starts_with("GPUBAKE_PROBE_FLAGS="))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&conf, fixed).unwrap();
    let resumed = node.slurm(
        "scontrol",
        &["update", "nodename=localhost", "state=resume"],
    );
    assert!(resumed.status.success(), "{}", common::stderr(&resumed));
    // The requeued job starts once its begin time (Slurm's delay after a requeue) has passed;
    // a new one starts at once.
    let id = node.submit(&marking_job(&node));
    assert_eq!(node.finish(&id), "COMPLETED");
    assert!(node.path(&format!("ran.{id}")).exists());
}

#[test]
fn the_slurm_scripts_are_posix_sh_and_shellcheck_clean() {
    let dir = common::root().join("examples/slurm");
    let scripts = [dir.join("prolog.sh"), dir.join("epilog.sh")];
    for script in &scripts {
        let text = std::fs::read_to_string(script).unwrap();
        assert!(text.starts_with("#!/bin/sh\n"), "{}", script.display());
        assert!(text.contains("\nset -eu\n"), "{}", script.display());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(script).unwrap().permissions().mode();
        assert!(mode & 0o111 != 0, "{} is not executable", script.display());
        let parsed = Command::new("sh").arg("-n").arg(script).output().unwrap();
        assert!(parsed.status.success(), "{}", common::stderr(&parsed));
    }
    if !common::have("shellcheck", "--version") {
        return;
    }
    let out = Command::new("shellcheck")
        .args(["--shell=sh", "--severity=style", "--external-sources"])
        .args(&scripts)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        common::stdout(&out),
        common::stderr(&out)
    );
}

/// examples/kubernetes/*.yaml.
fn manifest_files() -> Vec<PathBuf> {
    let dir = common::root().join("examples/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifest in {}", dir.display());
    files
}

/// Every document of examples/kubernetes/*.yaml, with the file it is in.
fn manifests() -> Vec<(String, serde_yaml::Value)> {
    use serde::Deserialize;
    let mut docs = Vec::new();
    for file in manifest_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value =
                serde_yaml::Value::deserialize(doc).unwrap_or_else(|e| panic!("{name}: {e}"));
            if !value.is_null() {
                docs.push((name.clone(), value));
            }
        }
    }
    docs
}

/// The DaemonSet of examples/kubernetes/.
fn daemonset() -> serde_yaml::Value {
    let sets: Vec<serde_yaml::Value> = manifests()
        .into_iter()
        .filter(|(_, d)| d["kind"] == "DaemonSet")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(sets.len(), 1, "one DaemonSet in examples/kubernetes/");
    sets.into_iter().next().unwrap()
}

fn text(v: &serde_yaml::Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

/// A Kubernetes quantity of bytes (`1Gi`, `1280Mi`, `512M`) as bytes.
fn bytes(q: &str) -> u64 {
    let (digits, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = digits.parse().unwrap_or_else(|_| panic!("quantity {q}"));
    n * match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => panic!("quantity {q}"),
    }
}

/// The `--emit KIND:FILE` arguments of the container's loop, as (kind, file).
fn emits(script: &str) -> Vec<(String, String)> {
    let words: Vec<&str> = script.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "--emit")
        .map(|w| {
            let (kind, file) = w[1].split_once(':').unwrap();
            (kind.to_string(), file.to_string())
        })
        .collect()
}

#[test]
fn the_kubernetes_daemonset_probes_level_1_into_nfd_and_node_exporter_when_ready() {
    for (file, doc) in manifests() {
        for key in ["apiVersion", "kind"] {
            assert!(doc[key].is_string(), "{file}: a document without {key}");
        }
        assert!(doc["metadata"]["name"].is_string(), "{file}: no name");
    }
    let ds = daemonset();
    assert_eq!(ds["apiVersion"], "apps/v1");
    let namespace = text(&ds["metadata"]["namespace"]);
    assert!(
        manifests()
            .iter()
            .any(|(_, d)| d["kind"] == "Namespace" && d["metadata"]["name"] == namespace),
        "the namespace {namespace} is made alongside"
    );
    let template = &ds["spec"]["template"];
    let selector = ds["spec"]["selector"]["matchLabels"].as_mapping().unwrap();
    for (k, v) in selector {
        assert_eq!(
            &template["metadata"]["labels"][k], v,
            "the selector picks the pods"
        );
    }
    let pod = &template["spec"];
    let containers = pod["containers"].as_sequence().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];

    // The probe image: examples/probe-image.yaml's recipe, `pytorch: none`.
    let recipe: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(common::root().join("examples/probe-image.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(recipe["pytorch"], "none");
    let image = text(&c["image"]);
    let name = image.rsplit('/').next().unwrap();
    assert!(
        name.split(':').next() == Some(text(&recipe["name"])),
        "{image}"
    );

    // A shell loop around `gpubake probe --level 1` (the image's own command is one probe).
    let command: Vec<&str> = c["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert_eq!(command, ["/busybox/sh", "-c"]);
    let script = text(&c["args"][0]);
    assert!(
        script.contains("/usr/local/bin/gpubake probe --level 1 ") && script.contains("while :"),
        "{script}"
    );
    let env = |name: &str| {
        c["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| text(&e["value"]).to_string())
    };
    let interval: u64 = env("PROBE_INTERVAL_SECONDS").unwrap().parse().unwrap();
    assert!(
        interval < gpubake::probe::emit::nfd_lifetime(1).as_secs(),
        "runs within the labels' lifetime"
    );

    // Each emitted file lands in the node's directory its reader watches, through hostPath.
    let mounts = c["volumeMounts"].as_sequence().unwrap();
    let volume = |path: &str| {
        let mount = mounts
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("nothing is mounted at {path}"));
        pod["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("no volume {:?}", mount["name"]))
            .clone()
    };
    let emitted = emits(script);
    let kinds: Vec<&str> = emitted.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["nfd", "prometheus"], "{script}");
    for (kind, file) in &emitted {
        let (dir, name) = file.rsplit_once('/').unwrap();
        let host = volume(dir);
        assert_eq!(host["hostPath"]["path"], dir, "{kind}: {host:?}");
        assert_eq!(host["hostPath"]["type"], "DirectoryOrCreate");
        match kind.as_str() {
            // nfd-worker's default local feature directory; it skips dot files.
            "nfd" => {
                assert_eq!(dir, "/etc/kubernetes/node-feature-discovery/features.d");
                assert!(!name.starts_with('.'));
            }
            // node_exporter's textfile collector reads *.prom only.
            _ => assert!(name.ends_with(".prom"), "{name}"),
        }
    }

    // Ready only while the last run passed: the probe reads the exit code the loop keeps in
    // a directory of the pod's own.
    let ready = &c["readinessProbe"]["exec"]["command"];
    let ready: Vec<&str> = ready.as_sequence().unwrap().iter().map(text).collect();
    assert_eq!(ready[..2], ["/busybox/sh", "-c"]);
    assert!(
        ready[2].starts_with("test \"$(cat /run/gpubake/exit-code)\" = 0 && "),
        "{:?}",
        ready[2]
    );
    assert!(script.contains("mv /run/gpubake/exit-code.new /run/gpubake/exit-code"));
    assert!(volume("/run/gpubake")["emptyDir"].is_mapping());

    // The GPUs: every one, through the toolkit's runtime class as the GPU operator's node
    // agents get them, and none taken from the device plugin (a request would hold its GPUs
    // for the pod's whole life). A CDI annotation would do as well.
    let cdi = template["metadata"]["annotations"]
        .as_mapping()
        .is_some_and(|a| {
            a.iter()
                .any(|(k, _)| k.as_str().is_some_and(|k| k.starts_with("cdi.k8s.io/")))
        });
    let runtime_class = pod["runtimeClassName"] == "nvidia"
        && env("NVIDIA_VISIBLE_DEVICES").as_deref() == Some("all");
    assert!(runtime_class || cdi, "{pod:?}");
    for kind in ["requests", "limits"] {
        assert!(
            c["resources"][kind]["nvidia.com/gpu"].is_null(),
            "a probe of every GPU holds none"
        );
    }
    let caps = env("NVIDIA_DRIVER_CAPABILITIES").unwrap();
    assert!(
        caps.contains("compute") && caps.contains("utility"),
        "{caps}"
    );
    assert!(
        pod["tolerations"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|t| t["key"] == "nvidia.com/gpu" && t["operator"] == "Exists"),
        "GPU nodes' taint is tolerated"
    );

    // /dev/shm as a training pod has it, at least the 1 GiB the limits phase asks for: a
    // memory-backed emptyDir, sized to the smaller of its limit and the pod's memory.
    let shm = volume("/dev/shm");
    assert_eq!(shm["emptyDir"]["medium"], "Memory");
    let size = bytes(text(&shm["emptyDir"]["sizeLimit"]));
    assert!(size >= 1 << 30, "{size}");
    assert!(bytes(text(&c["resources"]["limits"]["memory"])) > size);
}

/// The DaemonSet's loop and readiness probe, run here as the pod would run them: its mounts
/// made directories, on the fake GPU node, healthy (exit 0: ready, `health=pass`) and with
/// GPU 1 lost (exit 1: not ready, `health=fail`).
#[test]
fn the_daemonset_s_loop_runs_and_its_readiness_follows_the_exit_code() {
    if !runnable() {
        return;
    }
    let ds = daemonset();
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let node = fake_gpus(d);
    // Each path the pod mounts, here a directory of its own.
    let local = |text: &str| {
        let mut text = text.replace("/usr/local/bin/gpubake", env!("CARGO_BIN_EXE_gpubake"));
        for m in c["volumeMounts"].as_sequence().unwrap() {
            let at = d.join("pod").join(self::text(&m["name"]));
            std::fs::create_dir_all(&at).unwrap();
            text = text.replace(self::text(&m["mountPath"]), &at.display().to_string());
        }
        text
    };
    let script = local(text(&c["args"][0]));
    let ready = local(text(&c["readinessProbe"]["exec"]["command"][2]));
    let pod = |name: &str| std::fs::read_to_string(d.join("pod").join(name)).unwrap_or_default();
    for (build, code, ready_then, health) in
        [("healthy", "0", true, "pass"), ("lost", "1", false, "fail")]
    {
        switch_nvml(d, build);
        let _ = std::fs::remove_file(d.join("pod/state/exit-code"));
        let mut shell = Command::new("unshare");
        shell
            .args(["-m", "--propagation", "private", "sh"])
            .arg(&node)
            .arg(d)
            .args(["sh", "-c", &script])
            .env("LD_LIBRARY_PATH", d.join("driver"))
            .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for e in c["env"].as_sequence().unwrap() {
            shell.env(text(&e["name"]), text(&e["value"]));
        }
        let shell = shell.env("PROBE_INTERVAL_SECONDS", "3600").spawn().unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        while !d.join("pod/state/exit-code").exists() {
            assert!(Instant::now() < until, "no exit code within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        // The pod is stopped between two runs: the loop ends at once, and cleanly.
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) on a child of this test that has not been reaped.
        unsafe { libc::kill(shell.id() as i32, libc::SIGTERM) };
        let out = common::world::finish(shell, Duration::from_secs(5));
        assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
        let log = common::stdout(&out);
        assert!(
            log.contains(&format!("gpubake probe --level 1: exit {code}\n")),
            "{log}\n{}",
            pod("state/report.txt")
        );
        assert_eq!(pod("state/exit-code"), format!("{code}\n"));
        let probe = Command::new("sh").args(["-c", &ready]).status().unwrap();
        assert_eq!(probe.success(), ready_then, "{}", pod("state/report.txt"));
        // The same file, left from a run over an hour ago (a probe stuck since): not ready.
        let stale = Command::new("touch")
            .args(["-d", "2 hours ago"])
            .arg(d.join("pod/state/exit-code"))
            .status()
            .unwrap();
        assert!(stale.success());
        let probe = Command::new("sh").args(["-c", &ready]).status().unwrap();
        assert!(!probe.success(), "a stale exit code kept the pod ready");
        let labels = pod("nfd-features/gpubake");
        assert!(
            labels.contains(&format!("\ngpubake.io/health={health}\n")),
            "{labels}"
        );
        let metrics = pod("textfile-collector/gpubake.prom");
        assert!(
            metrics.contains(&format!("\ngpubake_probe_exit_code {code}\n")),
            "{metrics}"
        );
        let report = pod("state/report.txt");
        assert!(
            report.lines().any(|l| l.starts_with("  PASS  runs in ")
                && l.ends_with(" kubernetes (KUBERNETES_SERVICE_HOST is set)")),
            "{report}"
        );
        if code == "1" {
            assert!(log.contains("  FAIL  GPU 1 "), "{log}");
        }
    }
}

/// Reads each manifest into the Kubernetes API's own types (the models python3-kubernetes
/// generates from the API's OpenAPI schema) and back: a field the API does not have, a
/// value of the wrong type or a required field left out is named. Debian has no offline
/// validator of manifests (kubeconform and kubeval are not packaged; kubectl validates only
/// against a live API server's schema).
const KUBERNETES_TYPES: &str = r#"
import json, sys, yaml
from kubernetes.client import ApiClient

class Body:
    def __init__(self, doc):
        self.data = json.dumps(doc)

def diff(a, b, at):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            if k not in b:
                yield f"{at}.{k}: not a field of the API"
            else:
                yield from diff(a[k], b[k], f"{at}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from diff(x, y, f"{at}[{i}]")
    elif a != b:
        yield f"{at}: {a!r} reads as {b!r}"

api = ApiClient()
problems = []
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        if doc is None:
            continue
        version = doc["apiVersion"].rpartition("/")[2]
        try:
            obj = api.deserialize(Body(doc), version.capitalize() + doc["kind"])
        except Exception as e:
            problems.append(f"{path}: {doc['kind']}: {e}")
            continue
        problems += diff(doc, api.sanitize_for_serialization(obj), f"{path}: {doc['kind']}")
print("\n".join(problems))
sys.exit(1 if problems else 0)
"#;

#[test]
fn the_kubernetes_manifests_read_as_the_api_s_own_types() {
    // Debian's package installs for Debian's python3, which may not be first on PATH.
    let python = ["python3", "/usr/bin/python3"].into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import kubernetes.client, yaml"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some(python) = python else {
        missing("no python3 with python3-kubernetes");
        return;
    };
    let out = Command::new(python)
        .args(["-c", KUBERNETES_TYPES])
        .args(manifest_files())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        common::stdout(&out),
        common::stderr(&out)
    );
}

/// Level 3's time limit in the prolog follows the burn asked for: the level's budget (120 s,
/// the burn, 60 s) and a minute to spare, read off the `timeout` the probe runs under.
#[test]
fn the_level_3_limit_grows_with_the_burn() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("timeout-args");
    // A stand-in probe that records its parent's command line: the `timeout` it runs under.
    let fake = dir.path().join("fake-gpubake");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\ntr '\\0' ' ' </proc/$PPID/cmdline >{}\n",
            seen.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let prolog = common::root().join("examples/slurm/prolog.sh");
    for (flags, limit) in [
        ("", 840),
        ("--burn-seconds 30", 270),
        ("--quick --burn-seconds=1200", 1440),
    ] {
        let _ = std::fs::remove_file(&seen);
        Command::new("sh")
            .arg(&prolog)
            .env("GPUBAKE_PROBE_CONF", dir.path().join("none.conf"))
            .env("GPUBAKE_BIN", &fake)
            .env("GPUBAKE_PROLOG_LEVEL", "3")
            .env("GPUBAKE_PROBE_FLAGS", flags)
            .env("GPUBAKE_REPORT_DIR", dir.path().join("reports"))
            .env("SLURMD_NODENAME", "node-a")
            .env("SLURM_JOB_ID", "7")
            .output()
            .unwrap();
        let args = std::fs::read_to_string(&seen).unwrap_or_default();
        assert!(
            args.starts_with(&format!("timeout -k 5 {limit} ")),
            "{flags:?}: {args}"
        );
    }
}
