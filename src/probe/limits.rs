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
//! - NUMA memory binding: Docker's default seccomp profile (moby's profiles/seccomp/default.json)
//!   allows get_mempolicy, mbind, set_mempolicy and set_mempolicy_home_node only to a
//!   container with CAP_SYS_NICE, which docker does not grant by default; anything it does not
//!   allow fails with EPERM. So `numactl --membind`, `--localalloc` and `--preferred` (all
//!   set_mempolicy) fail in a plain `docker run`, while `--cpunodebind` and `--physcpubind`
//!   (sched_setaffinity) work. The probe asks the kernel rather than reading the profile: a
//!   runtime, a profile or a kernel may differ, and the call's answer is what numactl meets.

use super::env::Discovery;
use super::nccl_log;
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
/// MPOL_DEFAULT and MPOL_BIND (include/uapi/linux/mempolicy.h).
const MPOL_DEFAULT: libc::c_int = 0;
const MPOL_BIND: libc::c_int = 2;
/// CAP_SYS_NICE is capability 23 (include/uapi/linux/capability.h).
const CAP_SYS_NICE: u32 = 23;
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

/// What the kernel answered when the probe bound its memory to a NUMA node, as `numactl
/// --membind` does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum MemoryBinding {
    /// set_mempolicy(MPOL_BIND) to `node` succeeded (and was undone at once).
    Allowed {
        /// The node bound to: the first the process may use.
        node: u32,
    },
    /// set_mempolicy refused it.
    Refused {
        /// The node it was asked for.
        node: u32,
        /// The errno.
        errno: i32,
        /// The errno as numactl prints it, with its name where it is a usual one.
        words: String,
    },
    /// There is nothing to bind: the kernel has no NUMA memory policy (ENOSYS), or no node is
    /// listed.
    NotApplicable {
        /// Which of the two.
        why: String,
    },
}

impl MemoryBinding {
    /// A refusal with the errno's words.
    pub fn refused(node: u32, errno: i32) -> Self {
        MemoryBinding::Refused {
            node,
            errno,
            words: errno_words(errno),
        }
    }

    /// Whether memory binding works here; None when it does not apply.
    pub fn allowed(&self) -> Option<bool> {
        match self {
            MemoryBinding::Allowed { .. } => Some(true),
            MemoryBinding::Refused { .. } => Some(false),
            MemoryBinding::NotApplicable { .. } => None,
        }
    }
}

/// `Operation not permitted (EPERM)`: the C library's words, as numactl prints them after
/// `set_mempolicy: `, and the errno's name for the usual ones.
fn errno_words(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    // Rust appends " (os error N)" to strerror's words.
    let words = text.split(" (os error").next().unwrap_or(&text).to_string();
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::EINVAL => "EINVAL",
        libc::EFAULT => "EFAULT",
        libc::ENOMEM => "ENOMEM",
        libc::ENOSYS => "ENOSYS",
        _ => return format!("{words} (errno {errno})"),
    };
    format!("{words} ({name})")
}

/// Binds this thread's memory to `node` with set_mempolicy(MPOL_BIND) and, when the kernel
/// accepts, puts the default policy back at once: the probe allocates nothing meanwhile.
pub fn try_memory_binding(node: u32) -> MemoryBinding {
    const BITS: usize = u64::BITS as usize;
    // The kernel takes masks of up to a page of bits (get_nodes); a node past that is no
    // node of any machine, and its mask is not worth allocating.
    if node >= 1 << 15 {
        return MemoryBinding::NotApplicable {
            why: format!("node {node} is past the nodes any kernel numbers"),
        };
    }
    let mut mask = vec![0u64; node as usize / BITS + 1];
    mask[node as usize / BITS] |= 1 << (node as usize % BITS);
    // The kernel reads maxnode - 1 bits (mm/mempolicy.c, get_nodes), so libnuma passes one
    // more than the mask holds.
    let maxnode = (mask.len() * BITS + 1) as libc::c_ulong;
    // SAFETY: set_mempolicy reads `maxnode - 1` bits from the mask, which holds that many,
    // and changes only this thread's memory policy.
    let bound =
        unsafe { libc::syscall(libc::SYS_set_mempolicy, MPOL_BIND, mask.as_ptr(), maxnode) };
    if bound != 0 {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if errno == libc::ENOSYS {
            return MemoryBinding::NotApplicable {
                why: format!(
                    "the kernel has no NUMA memory policy (set_mempolicy: {})",
                    errno_words(errno)
                ),
            };
        }
        return MemoryBinding::refused(node, errno);
    }
    // SAFETY: MPOL_DEFAULT takes no mask; this undoes the binding above on this thread.
    unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            MPOL_DEFAULT,
            std::ptr::null::<libc::c_ulong>(),
            0 as libc::c_ulong,
        )
    };
    MemoryBinding::Allowed { node }
}

/// A field of /proc/self/status (`Mems_allowed_list:\t0-1` -> `0-1`).
fn status_field<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// Whether CapEff (hexadecimal) holds CAP_SYS_NICE.
fn has_cap_sys_nice(cap_eff: &str) -> Option<bool> {
    u64::from_str_radix(cap_eff, 16)
        .ok()
        .map(|caps| caps & (1 << CAP_SYS_NICE) != 0)
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
    /// Whether memory may be bound to a NUMA node; None when it was not tried.
    pub memory_binding: Option<MemoryBinding>,
    /// Whether the process holds CAP_SYS_NICE (CapEff); None when /proc/self/status is not
    /// readable. It only words the advice: the call's answer is the verdict.
    pub cap_sys_nice: Option<bool>,
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
        let status = std::fs::read_to_string(disc.at("/proc/self/status")).ok();
        let field = |name| status.as_deref().and_then(|s| status_field(s, name));
        // The first node this process may allocate on: under a cpuset that leaves node 0
        // out, binding to node 0 would be EINVAL, which says nothing of the permission.
        let node = field("Mems_allowed_list")
            .map(str::to_string)
            .or_else(|| std::fs::read_to_string(disc.at("/sys/devices/system/node/online")).ok())
            .and_then(|list| nccl_log::parse_ranges(&list))
            .and_then(|nodes| nodes.first().copied());
        let memory_binding = match node {
            Some(node) => try_memory_binding(node),
            None => MemoryBinding::NotApplicable {
                why: "no NUMA node is listed (neither Mems_allowed_list in /proc/self/status \
                      nor /sys/devices/system/node/online)"
                    .into(),
            },
        };
        Limits {
            shm_bytes: filesystem_size(&disc.at("/dev/shm")),
            // SAFETY: getrlimit only writes the struct it is given.
            memlock: rlimit(|l| unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, l) }),
            stack: rlimit(|l| unsafe { libc::getrlimit(libc::RLIMIT_STACK, l) }),
            nofile: rlimit(|l| unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, l) }),
            pids_max,
            ipc_inode,
            rdma_devices,
            memory_binding: Some(memory_binding),
            cap_sys_nice: field("CapEff").and_then(has_cap_sys_nice),
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
    out.push(memory_binding_verdict(l));
    out
}

/// The name of the memory binding's check.
pub const MEMORY_BINDING: &str = "NUMA memory binding";

/// Whether a rank may bind its memory to its GPU's NUMA node. A refusal warns rather than
/// fails: the job runs, only with its memory wherever the kernel first touches it.
fn memory_binding_verdict(l: &Limits) -> (&'static str, Status, String) {
    match &l.memory_binding {
        None => (MEMORY_BINDING, Status::Skip, "not tried".into()),
        Some(MemoryBinding::NotApplicable { why }) => (
            MEMORY_BINDING,
            Status::Skip,
            format!("{why}: there is no node to bind memory to"),
        ),
        Some(MemoryBinding::Allowed { node }) => (
            MEMORY_BINDING,
            Status::Pass,
            format!(
                "set_mempolicy(MPOL_BIND) to node {node} is allowed: `numactl --membind` and `--localalloc` work here"
            ),
        ),
        Some(MemoryBinding::Refused { node, errno, words }) => {
            let why = match (*errno, l.cap_sys_nice) {
                (libc::EPERM, Some(false)) => {
                    " The process lacks CAP_SYS_NICE, and Docker's default seccomp profile allows set_mempolicy and mbind only with it."
                }
                (libc::EPERM, Some(true)) => {
                    " The process holds CAP_SYS_NICE, so the seccomp profile is not Docker's default: it must allow set_mempolicy and mbind."
                }
                (libc::EPERM, None) => {
                    " Docker's default seccomp profile allows set_mempolicy and mbind only with CAP_SYS_NICE."
                }
                _ => "",
            };
            (
                MEMORY_BINDING,
                Status::Warn,
                format!(
                    "set_mempolicy(MPOL_BIND) to node {node} is refused: {words}. `numactl --membind`, `--localalloc` and `--preferred` fail here the same way; `--cpunodebind` and `--physcpubind` still work, and memory lands wherever the kernel first touches it.{why} docker: `--cap-add SYS_NICE`; Kubernetes: `securityContext.capabilities.add: [\"SYS_NICE\"]`; or a seccomp profile that allows set_mempolicy and mbind"
                ),
            )
        }
    }
}

/// Reads and judges the limits into the report; returns them for the launch line, which
/// binds memory only where the container allows it.
pub fn check(disc: &Discovery, report: &mut Report) -> Limits {
    let limits = Limits::read(disc);
    for (name, status, detail) in judge(&limits) {
        report.push(PHASE, name, status, detail);
    }
    report.fact(PHASE, json!(limits));
    limits
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
            memory_binding: Some(MemoryBinding::refused(0, libc::EPERM)),
            // docker's default capabilities: CapEff 00000000a80425fb.
            cap_sys_nice: has_cap_sys_nice("00000000a80425fb"),
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
        let (_, status, detail) = find(&j, MEMORY_BINDING);
        assert_eq!(*status, Status::Warn, "a job runs without memory binding");
        assert!(
            detail.starts_with(
                "set_mempolicy(MPOL_BIND) to node 0 is refused: Operation not permitted (EPERM)"
            ),
            "{detail}"
        );
        assert!(
            detail.contains("`numactl --membind`, `--localalloc`")
                && detail.contains("lacks CAP_SYS_NICE")
                && detail.contains("docker: `--cap-add SYS_NICE`")
                && detail.contains("capabilities.add: [\"SYS_NICE\"]")
                && detail.contains("seccomp profile that allows set_mempolicy"),
            "{detail}"
        );

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
            memory_binding: Some(MemoryBinding::Allowed { node: 1 }),
            cap_sys_nice: Some(true),
        };
        for (name, status, detail) in judge(&l) {
            assert_eq!(status, Status::Pass, "{name}: {detail}");
        }
    }

    #[test]
    fn a_refused_memory_binding_words_its_cause_by_the_capability_and_errno() {
        let judged = |binding: MemoryBinding, cap_sys_nice: Option<bool>| {
            let l = Limits {
                memory_binding: Some(binding),
                cap_sys_nice,
                ..Limits::default()
            };
            let j = judge(&l);
            let (_, status, detail) = find(&j, MEMORY_BINDING).clone();
            (status, detail)
        };
        // CAP_SYS_NICE held and still refused: not Docker's default profile.
        let (status, detail) = judged(MemoryBinding::refused(1, libc::EPERM), Some(true));
        assert_eq!(status, Status::Warn);
        assert!(
            detail.contains("to node 1 is refused") && detail.contains("holds CAP_SYS_NICE"),
            "{detail}"
        );
        let (_, detail) = judged(MemoryBinding::refused(0, libc::EPERM), None);
        assert!(detail.contains("only with CAP_SYS_NICE"), "{detail}");
        // Another errno is named as it is, without a cause the capability cannot explain.
        let (status, detail) = judged(MemoryBinding::refused(0, libc::EINVAL), Some(false));
        assert_eq!(status, Status::Warn);
        assert!(
            detail.contains("Invalid argument (EINVAL)") && !detail.contains("lacks CAP_SYS_NICE"),
            "{detail}"
        );
        let (status, detail) = judged(MemoryBinding::Allowed { node: 3 }, Some(false));
        assert_eq!(status, Status::Pass);
        assert!(detail.contains("to node 3 is allowed"), "{detail}");
        let (status, detail) = judged(
            MemoryBinding::NotApplicable {
                why: "the kernel has no NUMA memory policy".into(),
            },
            None,
        );
        assert_eq!(status, Status::Skip, "{detail}");
        assert_eq!(
            find(&judge(&Limits::default()), MEMORY_BINDING).1,
            Status::Skip
        );
        // The report's facts carry the outcome by name.
        let fact = json!(Limits {
            memory_binding: Some(MemoryBinding::refused(0, libc::EPERM)),
            ..Limits::default()
        });
        assert_eq!(fact["memory_binding"]["outcome"], "refused");
        assert_eq!(fact["memory_binding"]["errno"], libc::EPERM);
        assert_eq!(
            fact["memory_binding"]["words"],
            "Operation not permitted (EPERM)"
        );
    }

    /// The first node this process may allocate on, as the probe picks it.
    fn first_allowed_node() -> Option<u32> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let list = status_field(&status, "Mems_allowed_list")?;
        nccl_log::parse_ranges(list)?.first().copied()
    }

    /// This thread's memory policy, or the errno get_mempolicy gave.
    fn current_policy() -> Result<libc::c_int, i32> {
        let mut mode: libc::c_int = -1;
        // SAFETY: with no mask, get_mempolicy writes only the mode.
        let r = unsafe {
            libc::syscall(
                libc::SYS_get_mempolicy,
                &mut mode as *mut libc::c_int,
                std::ptr::null_mut::<libc::c_ulong>(),
                0 as libc::c_ulong,
                std::ptr::null_mut::<libc::c_void>(),
                0 as libc::c_ulong,
            )
        };
        if r == 0 {
            Ok(mode)
        } else {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
        }
    }

    #[test]
    fn the_kernel_answers_the_binding_and_an_allowed_one_is_undone() {
        let Some(node) = first_allowed_node() else {
            // No cpuset fields: a kernel without NUMA, where there is nothing to try.
            return;
        };
        match try_memory_binding(node) {
            MemoryBinding::Allowed { node: bound } => {
                assert_eq!(bound, node);
                // get_mempolicy sits under the same seccomp rule as set_mempolicy.
                assert_eq!(current_policy(), Ok(MPOL_DEFAULT), "the binding was undone");
            }
            MemoryBinding::Refused { errno, words, .. } => {
                // Under a seccomp profile that withholds it (a CI container's default).
                assert_eq!(errno, libc::EPERM, "{words}");
                assert_eq!(current_policy(), Err(libc::EPERM));
            }
            other => panic!("node {node} is listed, yet {other:?}"),
        }
        // A node outside the process's allowed set is never bound: the kernel's errno comes
        // back (EINVAL where the call is allowed, EPERM where seccomp answers first).
        let outside = 1000;
        match try_memory_binding(outside) {
            MemoryBinding::Refused { node, errno, words } => {
                assert_eq!(node, outside);
                assert!(errno == libc::EINVAL || errno == libc::EPERM, "{words}");
                assert!(
                    words.ends_with("(EINVAL)") || words.ends_with("(EPERM)"),
                    "{words}"
                );
            }
            other => panic!("node {outside} gave {other:?}"),
        }
    }

    #[test]
    fn status_fields_and_capabilities_parse() {
        let status = "Name:\tprobe\nCapEff:\t00000000a80425fb\nMems_allowed_list:\t0-1\n";
        assert_eq!(status_field(status, "Mems_allowed_list"), Some("0-1"));
        assert_eq!(status_field(status, "Mems_allowed"), None);
        let cap_eff = status_field(status, "CapEff").unwrap();
        assert_eq!(has_cap_sys_nice(cap_eff), Some(false));
        // The same with `--cap-add SYS_NICE`: bit 23.
        assert_eq!(has_cap_sys_nice("00000000a8c425fb"), Some(true));
        assert_eq!(has_cap_sys_nice("zz"), None);
        assert_eq!(errno_words(libc::EPERM), "Operation not permitted (EPERM)");
        assert!(errno_words(libc::EBUSY).ends_with(&format!("(errno {})", libc::EBUSY)));
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
        assert!(
            matches!(l.memory_binding, Some(MemoryBinding::NotApplicable { .. })),
            "no node is listed under the fake root: {:?}",
            l.memory_binding
        );
    }
}
