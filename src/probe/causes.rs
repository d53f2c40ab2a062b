//! cuInit's and NVML's failures by cause, each with what to do. cuInit runs in the probe itself
//! on `libcuda.so.1`, the driver's soname that the toolkit injects, so the report can name the
//! file the loader picked: a forward-compatibility libcuda and the kernel module disagree
//! there, and nowhere else.
//!
//! The codes are the CUDA driver API's (cuda.h, `CUresult`): 802 CUDA_ERROR_SYSTEM_NOT_READY
//! ("the system is not yet ready to start any CUDA work", the fabric manager on NVSwitch
//! systems), 803 CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (the display driver and the CUDA driver
//! differ), 804 CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (forward compatibility is not
//! supported on this device). CUDA's compatibility guide: the forward-compatibility package
//! (cuda-compat, /usr/local/cuda/compat) lets an older kernel module run a newer CUDA, on
//! data-center GPUs only, and must not be loaded on a kernel module newer than itself.

use super::env::Discovery;
use super::nvml::Facts;
use super::report::{Report, Status};
use serde_json::json;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The phase of the check in the report.
const PHASE: &str = "cuda";

/// What cuInit said, and about which library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Init {
    /// The file the loader opened for libcuda.so.1, as it named it.
    pub path: PathBuf,
    /// The file it resolves to (`libcuda.so.575.57.08`).
    pub real: PathBuf,
    /// cuDriverGetVersion: the CUDA version this libcuda implements, `12090`.
    pub cuda: Option<i32>,
    /// cuInit(0)'s result.
    pub code: i32,
}

type CuInit = unsafe extern "C" fn(u32) -> i32;
type CuDriverGetVersion = unsafe extern "C" fn(*mut i32) -> i32;

/// Loads libcuda.so.1 and calls cuInit(0). Err: the loader's message.
fn init() -> Result<Init, String> {
    // Loading the driver's library runs only its constructors; cuInit makes no context.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }
        .map_err(|e| super::loader::message(&e))?;
    let cu_init: libloading::Symbol<CuInit> =
        unsafe { lib.get(b"cuInit\0") }.map_err(|e| super::loader::message(&e))?;
    let path =
        loaded_from(*cu_init as *const libc::c_void).unwrap_or_else(|| "libcuda.so.1".into());
    let cuda = unsafe { lib.get::<CuDriverGetVersion>(b"cuDriverGetVersion\0") }
        .ok()
        .and_then(|get| {
            let mut v = 0;
            (unsafe { get(&mut v) } == 0).then_some(v)
        });
    let code = unsafe { cu_init(0) };
    // The library stays loaded: CUDA's driver is not meant to be unloaded after cuInit.
    std::mem::forget(lib);
    Ok(Init {
        real: std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone()),
        path,
        cuda,
        code,
    })
}

/// The file that holds `symbol`, as the loader opened it.
fn loaded_from(symbol: *const libc::c_void) -> Option<PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address and fills the struct it is given.
    if unsafe { libc::dladdr(symbol, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(
        std::ffi::OsStr::from_bytes(name.to_bytes()).to_os_string(),
    ))
}

/// The driver version a libcuda's file name carries: `libcuda.so.575.57.08` -> `575.57.08`.
fn file_version(real: &Path) -> Option<String> {
    let name = real.file_name()?.to_str()?;
    let v = name.strip_prefix("libcuda.so.")?;
    (v.matches('.').count() >= 1 && v.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .then(|| v.to_string())
}

/// `12090` -> `12.9`.
fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, v % 1000 / 10)
}

/// The kernel module's version: /proc/driver/nvidia/version, else what NVML says (NVML does
/// not initialise against a kernel module of another version, so its version is the module's).
fn kernel_module(disc: &Discovery, facts: Option<&Facts>) -> Option<String> {
    std::fs::read_to_string(disc.at("/proc/driver/nvidia/version"))
        .ok()
        .and_then(|t| crate::cdi::driver_version(&t))
        .or_else(|| facts.map(|f| f.driver.clone()).filter(|d| !d.is_empty()))
}

/// One GPU's NVLink fabric as NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Fabric {
    /// NVML index.
    pub index: u32,
    /// `not supported`, `not started`, `in progress`, `completed`.
    pub state: String,
    /// The registration's result, NVML's words.
    pub status: String,
    /// The NVLink clique the GPU joined (0 until it has).
    pub clique: u32,
}

/// NVML's GPU fabric state of every GPU (nvmlDeviceGetGpuFabricInfo, Hopper and later).
/// Err: why it could not be read.
pub fn fabric() -> Result<Vec<Fabric>, String> {
    use nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_t;
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML: {e}"))?;
    let count = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
    let get = nvml
        .lib()
        .nvmlDeviceGetGpuFabricInfo
        .as_ref()
        .map_err(|e| format!("this NVML has no nvmlDeviceGetGpuFabricInfo: {e}"))?;
    let mut out = Vec::new();
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(|e| format!("GPU {index}: {e}"))?;
        let mut info: nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: the handle is NVML's; NVML fills the struct it is given.
        let code = unsafe { (*get)(device.handle(), &mut info) };
        if let Err(e) = nvml_wrapper::error::nvml_try(code) {
            out.push(Fabric {
                index,
                state: "unreadable".into(),
                status: e.to_string(),
                clique: 0,
            });
            continue;
        }
        let state = match u32::from(info.state) {
            0 => "not supported",
            1 => "not started",
            2 => "in progress",
            3 => "completed",
            _ => "unknown",
        };
        out.push(Fabric {
            index,
            state: state.into(),
            status: match nvml_wrapper::error::nvml_try(info.status) {
                Ok(()) => "success".into(),
                Err(e) => e.to_string(),
            },
            clique: info.cliqueId,
        });
    }
    Ok(out)
}

/// What cuInit's result means here, and what to do: (status, detail).
pub fn explain(
    init: &Init,
    module: Option<&str>,
    fabric: Option<&Result<Vec<Fabric>, String>>,
) -> (Status, String) {
    let lib = format!(
        "{}{}",
        init.path.display(),
        if init.real != init.path {
            format!(" ({})", init.real.display())
        } else {
            String::new()
        }
    );
    let lib_version = file_version(&init.real);
    let lib_cuda = init
        .cuda
        .map(|v| format!(", CUDA {}", cuda_version(v)))
        .unwrap_or_default();
    let module_text = module.unwrap_or("of unknown version");
    let compat = init
        .real
        .components()
        .chain(init.path.components())
        .any(|c| c.as_os_str() == "compat");
    match init.code {
        0 => (Status::Pass, format!("initialised through {lib}{lib_cuda}")),
        802 => {
            let fabric = match fabric {
                Some(Ok(gpus)) if !gpus.is_empty() => format!(
                    "; NVML's GPU fabric: {}",
                    gpus.iter()
                        .map(|f| format!(
                            "GPU {} {} (status {}, clique {})",
                            f.index, f.state, f.status, f.clique
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Some(Ok(_)) => "; NVML lists no GPU to read the fabric state of".into(),
                Some(Err(e)) => format!("; the GPU fabric state is unreadable: {e}"),
                None => String::new(),
            };
            (
                Status::Fail,
                format!(
                    "cuInit returned 802 (CUDA_ERROR_SYSTEM_NOT_READY){fabric}. On NVSwitch systems (HGX, DGX) CUDA waits for the fabric manager to set up the NVLink fabric: on the host, `systemctl status nvidia-fabricmanager`, then `systemctl enable --now nvidia-fabricmanager` with the fabric manager package of the driver's exact version ({module_text}); a GPU whose fabric state stays `not started` or `in progress` is not yet in the fabric"
                ),
            )
        }
        803 => {
            let versions = format!(
                "the libcuda loaded is {lib}, driver {}{lib_cuda}, but the kernel module is {module_text}",
                lib_version.as_deref().unwrap_or("of unknown version"),
            );
            let what = if compat {
                format!(
                    "it is a forward-compatibility libcuda, which runs only on an older kernel module: on this one the driver's own libcuda must be used. Take {} off LD_LIBRARY_PATH (and out of /etc/ld.so.conf.d), or build the image without the cuda-compat package",
                    init.real
                        .parent()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                )
            } else {
                "the image carries a libcuda of another driver, which shadows the one the toolkit injects: remove it from the image".to_string()
            };
            (
                Status::Fail,
                format!(
                    "cuInit returned 803 (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH): {versions}; {what}"
                ),
            )
        }
        804 => (
            Status::Fail,
            format!(
                "cuInit returned 804 (CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE): {lib}{lib_cuda} is {} on kernel module {module_text}, and this GPU does not support forward compatibility (only data-center GPUs do). Load the driver's own libcuda (take the compat directory off the library path) and use an image whose CUDA the kernel module supports, or upgrade the node's driver",
                if compat {
                    "a forward-compatibility libcuda"
                } else {
                    "a libcuda newer than the kernel module"
                }
            ),
        ),
        100 => (
            Status::Fail,
            format!(
                "cuInit returned 100 (CUDA_ERROR_NO_DEVICE) through {lib}: no GPU reaches this process (CUDA_VISIBLE_DEVICES, or no GPU given to the container)"
            ),
        ),
        code => (
            Status::Fail,
            format!("cuInit returned {code} through {lib}{lib_cuda}"),
        ),
    }
}

/// cuInit in the probe, within `budget`, explained by cause.
pub fn check(disc: &Discovery, facts: Option<&Facts>, budget: Duration, report: &mut Report) {
    let outcome = super::with_budget(budget, || {
        let init = init()?;
        // The fabric state answers 802 only; read it only then.
        let fabric = (init.code == 802).then(fabric);
        Ok::<_, String>((init, fabric))
    });
    let (init, fabric) = match outcome {
        None => {
            report.push(
                PHASE,
                "cuInit",
                Status::Fail,
                format!(
                    "no answer within {} s: the driver is hung",
                    budget.as_secs()
                ),
            );
            return;
        }
        Some(Err(e)) => {
            report.push(
                PHASE,
                "cuInit",
                Status::Skip,
                format!("libcuda.so.1 does not load: {e}"),
            );
            return;
        }
        Some(Ok(found)) => found,
    };
    let module = kernel_module(disc, facts);
    let (status, detail) = explain(&init, module.as_deref(), fabric.as_ref());
    report.push(PHASE, "cuInit", status, detail);
    report.fact(
        "cuinit",
        json!({
            "library": init.path, "file": init.real, "cuda": init.cuda, "code": init.code,
            "kernel_module": module, "fabric": fabric.and_then(Result::ok),
        }),
    );
}

/// NVML's "Unknown Error" where /dev/nvidia* exist: the container's device cgroup no longer
/// lets it open them. runc rewrites a container's device rules when systemd reloads
/// (`systemctl daemon-reload`) under the systemd cgroup driver, dropping those the toolkit's
/// hook added where /dev/char lacks links to the nodes (nvidia-container-toolkit#48,
/// nvidia-docker#1730). Opening /dev/nvidiactl tells: the kernel answers
/// EPERM for a node the cgroup denies.
pub fn nvml_unknown(disc: &Discovery, error: &str) -> String {
    let nodes = disc.device_nodes();
    if nodes.is_empty() {
        return format!("NVML did not initialise: {error}");
    }
    let ctl = disc.at("/dev/nvidiactl");
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&ctl);
    let evidence = match opened {
        Ok(_) => "yet /dev/nvidiactl opens, so the device cgroup still allows it: the driver itself failed (see the host's kernel log for an Xid)".to_string(),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => "and opening /dev/nvidiactl is refused (Operation not permitted): the container's device cgroup no longer allows the GPUs. This is the lost device cgroup: a `systemctl daemon-reload` on the host, with the systemd cgroup driver, rewrote the container's device rules without the GPUs. Delete and restart the container to get them back; to stop it happening, create the /dev/char links runc needs on the host (`nvidia-ctk system create-dev-char-symlinks --create-all`) or set `\"exec-opts\": [\"native.cgroupdriver=cgroupfs\"]` in /etc/docker/daemon.json (nvidia-docker#1730)".to_string(),
        Err(e) => format!("and opening /dev/nvidiactl fails: {e}"),
    };
    format!(
        "NVML answers {error} while {} are present, {evidence}",
        nodes
            .iter()
            .map(|n| format!("/dev/{n}"))
            .collect::<Vec<_>>()
            .join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init(code: i32, path: &str, real: &str) -> Init {
        Init {
            path: path.into(),
            real: real.into(),
            cuda: Some(12090),
            code,
        }
    }

    #[test]
    fn a_forward_compat_libcuda_on_a_newer_module_is_named_with_both_versions() {
        let i = init(
            803,
            "/usr/local/cuda/compat/libcuda.so.1",
            "/usr/local/cuda-12.9/compat/libcuda.so.575.57.08",
        );
        let (status, text) = explain(&i, Some("580.95.05"), None);
        assert_eq!(status, Status::Fail);
        assert!(
            text.contains("575.57.08") && text.contains("580.95.05"),
            "{text}"
        );
        assert!(text.contains("forward-compatibility libcuda"), "{text}");
        assert!(
            text.contains("/usr/local/cuda-12.9/compat off LD_LIBRARY_PATH"),
            "{text}"
        );

        let baked = init(
            803,
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
        );
        let (_, text) = explain(&baked, Some("580.95.05"), None);
        assert!(text.contains("remove it from the image"), "{text}");
    }

    #[test]
    fn not_ready_lists_each_gpu_s_fabric() {
        let gpus = Ok(vec![Fabric {
            index: 0,
            state: "in progress".into(),
            status: "success".into(),
            clique: 0,
        }]);
        let i = init(
            802,
            "/usr/lib/libcuda.so.1",
            "/usr/lib/libcuda.so.580.95.05",
        );
        let (_, text) = explain(&i, Some("580.95.05"), Some(&gpus));
        assert!(
            text.contains("GPU 0 in progress (status success, clique 0)"),
            "{text}"
        );
        assert!(text.contains("nvidia-fabricmanager"), "{text}");
        assert_eq!(explain(&init(0, "a", "a"), None, None).0, Status::Pass);
        assert!(explain(&init(804, "a", "a"), None, None).1.contains("804"));
    }

    #[test]
    fn the_version_is_read_from_the_file_name() {
        assert_eq!(
            file_version(Path::new("/x/libcuda.so.575.57.08")).as_deref(),
            Some("575.57.08")
        );
        assert_eq!(file_version(Path::new("/x/libcuda.so.1")), None);
    }
}
