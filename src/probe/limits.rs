//! The container's limits as a training job meets them: the size of /dev/shm, the locked-memory,
//! stack and open-file limits, the pids cgroup's limit and whether IPC is the host's. Each is
//! judged against what NCCL and PyTorch's DataLoader need, and a shortfall names the docker
//! flag and the Kubernetes setting that lift it. Reading them is a few system calls and files,
//! well inside any budget.
//!
//! Sources of the floors:
//! - NGC's PyTorch containers note at start, under docker's defaults, that the SHMEM limit is
//!   docker's default of 64 MB and may be insufficient for PyTorch, and recommend
//!   `--ipc=host --ulimit memlock=-1 --ulimit stack=67108864`; NGC's run lines elsewhere use
//!   `--shm-size=1g` in place of `--ipc=host`: hence /dev/shm >= 1 GiB, memlock unlimited and
//!   stack >= 64 MiB.
//! - NCCL's troubleshooting guide: NCCL makes its shared-memory segments in /dev/shm and fails
//!   to initialise when too little is there (docker's default is 64 MiB); IB verbs register
//!   (pin) host memory, which the kernel refuses past RLIMIT_MEMLOCK.
//! - PyTorch's README: DataLoader workers pass batches through shared memory, so a container
//!   needs `--ipc=host` or `--shm-size`; torch.multiprocessing's `file_descriptor` sharing
//!   strategy (the default on Linux) holds a descriptor per shared tensor.
//! - Open files and pids have no published floor: 65536 open files and 4096 tasks are
//!   gpubake's (a node of 8 GPUs with 8 DataLoader workers each already runs 72 processes,
//!   each with dozens of CUDA and NCCL threads, all counted against pids.max).

use super::env::Discovery;
use super::report::{Report, Status};
use serde::Serialize;
use serde_json::json;

/// The phase's name in the report.
pub const PHASE: &str = "limits";

/// NGC's `--shm-size=1g`.
pub const SHM_FLOOR: u64 = 1 << 30;
/// NGC's `--ulimit stack=67108864`.
pub const STACK_FLOOR: u64 = 64 << 20;
/// gpubake's floor for open files (see the module's sources).
pub const NOFILE_FLOOR: u64 = 65536;
/// gpubake's floor for the pids cgroup (see the module's sources).
pub const PIDS_FLOOR: u64 = 4096;
/// The inode of the kernel's initial IPC namespace (`PROC_IPC_INIT_INO`, 0xEFFFFFFF in
/// include/linux/proc_ns.h): the host's, whoever looks. Comparing with /proc/1's namespace
/// says nothing inside a container, whose process 1 shares the container's namespace.
pub const HOST_IPC_INODE: u64 = 0xEFFF_FFFF;

/// A soft and a hard limit; None is unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Rlimit {
    /// What the process gets now.
    pub soft: Option<u64>,
    /// What it may raise the soft limit to.
    pub hard: Option<u64>,
}

/// What the container gives a job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// /dev/shm's size in bytes; None when it cannot be read.
    pub shm_bytes: Option<u64>,
    /// RLIMIT_MEMLOCK in bytes.
    pub memlock: Option<Rlimit>,
    /// RLIMIT_STACK in bytes.
    pub stack: Option<Rlimit>,
    /// RLIMIT_NOFILE.
    pub nofile: Option<Rlimit>,
    /// The pids cgroup's limit: Some(None) is `max`; None when no pids controller is seen.
    pub pids_max: Option<Option<u64>>,
    /// The IPC namespace's inode; None when /proc is hidden.
    pub ipc_inode: Option<u64>,
    /// RDMA devices on the node (/sys/class/infiniband): locked memory then matters to NCCL.
    pub rdma_devices: usize,
}

/// A limit as `get` (getrlimit for one resource) reads it; the resource's type differs
/// between glibc and musl, so the caller names it.
fn rlimit(get: impl FnOnce(&mut libc::rlimit) -> libc::c_int) -> Option<Rlimit> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    if get(&mut l) != 0 {
        return None;
    }
    let value = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    Some(Rlimit {
        soft: value(l.rlim_cur),
        hard: value(l.rlim_max),
    })
}

fn filesystem_size(path: &std::path::Path) -> Option<u64> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs writes only the struct it is given; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_blocks * st.f_frsize)
}

/// `max` or a number, as the pids controller writes it.
fn parse_pids_max(text: &str) -> Option<Option<u64>> {
    match text.trim() {
        "max" => Some(None),
        n => n.parse().ok().map(Some),
    }
}

/// `ipc:[4026531839]` -> 4026531839.
fn parse_ns_inode(link: &str) -> Option<u64> {
    link.strip_prefix("ipc:[")?.strip_suffix(']')?.parse().ok()
}

impl Limits {
    /// Reads this process's limits; files (/dev/shm, /sys, /proc) under the discovery's root.
    pub fn read(disc: &Discovery) -> Self {
        // cgroup v2 puts pids.max at the root of the container's cgroup namespace; v1 under
        // the pids controller's hierarchy.
        let pids_max = ["/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"]
            .iter()
            .find_map(|p| std::fs::read_to_string(disc.at(p)).ok())
            .and_then(|t| parse_pids_max(&t));
        let ipc_inode = std::fs::read_link(disc.at("/proc/self/ns/ipc"))
            .ok()
            .and_then(|l| parse_ns_inode(&l.to_string_lossy()));
        let rdma_devices = std::fs::read_dir(disc.at("/sys/class/infiniband"))
            .map(|d| d.count())
            .unwrap_or(0);
        Limits {
            shm_bytes: filesystem_size(&disc.at("/dev/shm")),
            // SAFETY: getrlimit only writes the struct it is given.
            memlock: rlimit(|l| unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, l) }),
            stack: rlimit(|l| unsafe { libc::getrlimit(libc::RLIMIT_STACK, l) }),
            nofile: rlimit(|l| unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, l) }),
            pids_max,
            ipc_inode,
            rdma_devices,
        }
    }

    /// Whether the process shares the host's IPC namespace.
    pub fn host_ipc(&self) -> Option<bool> {
        self.ipc_inode.map(|i| i == HOST_IPC_INODE)
    }
}

/// Bytes as people write them: `64 MiB`, `8 KiB`, `unlimited`.
fn bytes(v: Option<u64>) -> String {
    match v {
        None => "unlimited".into(),
        Some(b) if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        Some(b) if b >= 1 << 20 => format!("{} MiB", b >> 20),
        Some(b) if b >= 1 << 10 => format!("{} KiB", b >> 10),
        Some(b) => format!("{b} B"),
    }
}

fn count(v: Option<u64>) -> String {
    v.map_or("unlimited".into(), |n| n.to_string())
}

/// Below `floor` (None, unlimited, is never below).
fn below(v: Option<u64>, floor: u64) -> bool {
    v.is_some_and(|v| v < floor)
}

/// Judges the limits: (check name, status, detail) in report order.
pub fn judge(l: &Limits) -> Vec<(&'static str, Status, String)> {
    let mut out: Vec<(&'static str, Status, String)> = Vec::new();
    let host_ipc = l.host_ipc();
    out.push(match l.shm_bytes {
        None => ("/dev/shm", Status::Warn, "not mounted or not readable: NCCL's shared-memory transport and DataLoader workers need it".into()),
        Some(size) if size < SHM_FLOOR => ("/dev/shm", Status::Fail, format!(
            "{}, below {}: NCCL's shared-memory transport fails to set up and DataLoader workers die with a bus error. docker: `--ipc=host` (or `--shm-size=1g`); Kubernetes: an `emptyDir: {{medium: Memory}}` volume mounted at /dev/shm (or `hostIPC: true`)",
            bytes(Some(size)), bytes(Some(SHM_FLOOR)))),
        Some(size) => ("/dev/shm", Status::Pass, format!(
            "{}{}", bytes(Some(size)),
            if host_ipc == Some(true) { ", the host's (IPC shared)" } else { "" })),
    });
    out.push(match l.memlock {
        None => ("RLIMIT_MEMLOCK", Status::Warn, "not readable".into()),
        Some(r) if r.soft.is_some() => {
            let status = if l.rdma_devices > 0 { Status::Fail } else { Status::Warn };
            let why = if l.rdma_devices > 0 {
                format!("{} RDMA devices here: NCCL's IB transport registers (pins) host memory, which the kernel refuses past this limit", l.rdma_devices)
            } else {
                "no RDMA device here, but on an IB node NCCL's registration of host memory fails past this limit".into()
            };
            ("RLIMIT_MEMLOCK", status, format!(
                "{} (hard {}), not unlimited: {why}. docker: `--ulimit memlock=-1`; Kubernetes has no pod field for it: containers inherit the runtime's limit, so set `LimitMEMLOCK=infinity` in the containerd (or CRI-O) service on the node",
                bytes(r.soft), bytes(r.hard)))
        }
        Some(_) => ("RLIMIT_MEMLOCK", Status::Pass, "unlimited".into()),
    });
    out.push(match l.stack {
        None => ("RLIMIT_STACK", Status::Warn, "not readable".into()),
        Some(r) if below(r.soft, STACK_FLOOR) => ("RLIMIT_STACK", Status::Warn, format!(
            "{}, below the {} NGC's containers ask for. docker: `--ulimit stack=67108864`; Kubernetes: the runtime's limit (`LimitSTACK` in the containerd or CRI-O service)",
            bytes(r.soft), bytes(Some(STACK_FLOOR)))),
        Some(r) => ("RLIMIT_STACK", Status::Pass, bytes(r.soft)),
    });
    out.push(match l.nofile {
        None => ("RLIMIT_NOFILE", Status::Warn, "not readable".into()),
        Some(r) if below(r.soft, NOFILE_FLOOR) => ("RLIMIT_NOFILE", Status::Warn, format!(
            "{} open files (hard {}), below {NOFILE_FLOOR}: DataLoader workers share each tensor through a file descriptor and fail with `Too many open files`. docker: `--ulimit nofile=1048576`; Kubernetes: the runtime's limit (`LimitNOFILE` in the containerd or CRI-O service)",
            count(r.soft), count(r.hard))),
        Some(r) => ("RLIMIT_NOFILE", Status::Pass, format!("{} open files", count(r.soft))),
    });
    out.push(match l.pids_max {
        None => ("pids.max", Status::Skip, "no pids cgroup controller is visible".into()),
        Some(limit) if below(limit, PIDS_FLOOR) => ("pids.max", Status::Warn, format!(
            "{}, below {PIDS_FLOOR}: ranks, DataLoader workers and their CUDA and NCCL threads all count, and past it fork and thread creation fail. docker: `--pids-limit -1`; Kubernetes: the kubelet's `podPidsLimit`",
            count(limit))),
        Some(limit) => ("pids.max", Status::Pass, count(limit)),
    });
    out.push(match host_ipc {
        None => ("IPC namespace", Status::Skip, "/proc/self/ns/ipc is not readable".into()),
        Some(true) => ("IPC namespace", Status::Pass, "the host's: ranks in other containers on this node reach this one's shared memory".into()),
        Some(false) => ("IPC namespace", Status::Pass, format!(
            "private (ipc:[{}]): enough for ranks in this container; ranks in other containers on the node reach its shared memory only with docker's `--ipc=host` or Kubernetes' `hostIPC: true`",
            l.ipc_inode.unwrap_or_default())),
    });
    out
}

/// Reads and judges the limits into the report.
pub fn check(disc: &Discovery, report: &mut Report) {
    let limits = Limits::read(disc);
    for (name, status, detail) in judge(&limits) {
        report.push(PHASE, name, status, detail);
    }
    report.fact(PHASE, json!(limits));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docker_defaults() -> Limits {
        Limits {
            shm_bytes: Some(64 << 20),
            memlock: Some(Rlimit {
                soft: Some(64 << 10),
                hard: Some(64 << 10),
            }),
            stack: Some(Rlimit {
                soft: Some(8 << 20),
                hard: None,
            }),
            nofile: Some(Rlimit {
                soft: Some(1024),
                hard: Some(1024),
            }),
            pids_max: Some(Some(512)),
            ipc_inode: Some(4026532182),
            rdma_devices: 2,
        }
    }

    fn find<'a>(
        j: &'a [(&'static str, Status, String)],
        name: &str,
    ) -> &'a (&'static str, Status, String) {
        j.iter().find(|c| c.0 == name).unwrap()
    }

    #[test]
    fn docker_defaults_name_each_limit_and_its_fix() {
        let j = judge(&docker_defaults());
        let shm = find(&j, "/dev/shm");
        assert_eq!(shm.1, Status::Fail);
        assert!(shm.2.starts_with("64 MiB, below 1 GiB"), "{}", shm.2);
        assert!(shm.2.contains("--ipc=host") && shm.2.contains("medium: Memory"));
        let lock = find(&j, "RLIMIT_MEMLOCK");
        assert_eq!(lock.1, Status::Fail, "RDMA devices make it a failure");
        assert!(lock.2.starts_with("64 KiB (hard 64 KiB)"), "{}", lock.2);
        assert!(lock.2.contains("--ulimit memlock=-1") && lock.2.contains("LimitMEMLOCK"));
        assert_eq!(find(&j, "RLIMIT_STACK").1, Status::Warn);
        assert!(find(&j, "RLIMIT_STACK").2.contains("stack=67108864"));
        assert_eq!(find(&j, "RLIMIT_NOFILE").1, Status::Warn);
        assert_eq!(find(&j, "pids.max").1, Status::Warn);
        assert!(find(&j, "pids.max").2.contains("podPidsLimit"));
        assert!(find(&j, "IPC namespace").2.starts_with("private"));

        let no_rdma = Limits {
            rdma_devices: 0,
            ..docker_defaults()
        };
        assert_eq!(find(&judge(&no_rdma), "RLIMIT_MEMLOCK").1, Status::Warn);
    }

    #[test]
    fn a_training_job_s_settings_pass() {
        let unlimited = Rlimit {
            soft: None,
            hard: None,
        };
        let l = Limits {
            shm_bytes: Some(24 << 30),
            memlock: Some(unlimited),
            stack: Some(Rlimit {
                soft: Some(64 << 20),
                hard: Some(64 << 20),
            }),
            nofile: Some(Rlimit {
                soft: Some(1 << 20),
                hard: Some(1 << 20),
            }),
            pids_max: Some(None),
            ipc_inode: Some(HOST_IPC_INODE),
            rdma_devices: 2,
        };
        for (name, status, detail) in judge(&l) {
            assert_eq!(status, Status::Pass, "{name}: {detail}");
        }
    }

    #[test]
    fn cgroup_and_namespace_files_parse() {
        assert_eq!(parse_pids_max("max\n"), Some(None));
        assert_eq!(parse_pids_max("4096\n"), Some(Some(4096)));
        assert_eq!(parse_pids_max("lots"), None);
        assert_eq!(parse_ns_inode("ipc:[4026531839]"), Some(HOST_IPC_INODE));
        assert_eq!(parse_ns_inode("net:[4026531839]"), None);
        // This process's own limits are read, whatever they are.
        let dir = tempfile::tempdir().unwrap();
        let l = Limits::read(&Discovery::under(dir.path()));
        assert!(l.memlock.is_some() && l.nofile.is_some());
        assert!(l.shm_bytes.is_none(), "no /dev/shm under the fake root");
    }
}
