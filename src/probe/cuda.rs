//! The GPU side of the probe, run in a child process (`gpubake probe-worker`) so that a hung
//! kernel or driver call can be killed, and so NCCL reads a fresh environment each time.
//! Loads the CUDA driver, NVRTC and NCCL at run time (cudarc), and reports JSON on stdout.
//!
//! Measures: the peer-access matrix, device memory bandwidth (a device-to-device copy), P2P
//! copy bandwidth (one and both directions) and the time of a small P2P copy, and the bundled
//! all-reduce: checked element by element against a CPU reference on fresh data, timed, and
//! timed beside NCCL on the same buffers.

use super::schedule::{self, Dtype, MAX_RANKS};
use cudarc::driver::{result as cu, sys};
use serde::Serialize;
use std::ffi::c_void;

const KERNEL_SOURCE: &str = include_str!("allreduce.cu");
const THREADS: u32 = 512;
const FLAG_SLOTS: usize = 4096;

pub(super) type R<T> = Result<T, String>;

pub(super) fn ck<T>(what: &str, r: Result<T, cu::DriverError>) -> R<T> {
    r.map_err(|e| format!("{what}: {e:?}"))
}

/// One GPU with its context, stream and compiled kernels.
pub struct Device {
    /// CUDA ordinal.
    pub ordinal: usize,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    pub(super) stream: sys::CUstream,
    /// Multiprocessors.
    pub sms: u32,
    /// Compute capability.
    pub cc: (i32, i32),
    module: Option<sys::CUmodule>,
}

impl Device {
    pub(super) fn bind(&self) -> R<()> {
        ck("cuCtxSetCurrent", unsafe { cu::ctx::set_current(self.ctx) })
    }

    fn function(&self, name: &str) -> R<sys::CUfunction> {
        let module = self.module.ok_or("the kernel module is not loaded")?;
        ck(name, unsafe {
            cu::module::get_function(module, std::ffi::CString::new(name).expect("no NUL"))
        })
    }

    pub(super) fn sync(&self) -> R<()> {
        ck("cuStreamSynchronize", unsafe {
            cu::stream::synchronize(self.stream)
        })
    }
}

/// The PCI bus id of every CUDA device, by CUDA ordinal, normalised.
pub fn pci_bus_ids() -> R<Vec<String>> {
    if !unsafe { sys::is_culib_present() } {
        return Err("libcuda.so could not be loaded".into());
    }
    ck("cuInit", cu::init())?;
    let count = ck("cuDeviceGetCount", cu::device::get_count())?;
    let mut ids = Vec::new();
    for ordinal in 0..count {
        let dev = ck("cuDeviceGet", cu::device::get(ordinal))?;
        // "0000:1b:00.0" and a NUL; CUDA asks for room for 13 characters, 64 is plenty.
        let mut buf = [0 as std::ffi::c_char; 64];
        ck("cuDeviceGetPCIBusId", unsafe {
            sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev).result()
        })?;
        let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
        ids.push(normalise_bus_id(&text).unwrap_or_else(|| text.into_owned()));
    }
    Ok(ids)
}

/// A PCI address as `dddd:bb:dd.f`, lower case. NVML writes the domain with eight digits
/// (`00000000:1B:00.0`), CUDA with four (`0000:1B:00.0`); both name the same device.
pub fn normalise_bus_id(id: &str) -> Option<String> {
    let (domain, rest) = id.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some(format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        hex(domain)?,
        hex(bus)?,
        hex(device)?,
        hex(function)?
    ))
}

/// The CUDA ordinal of each GPU in `wanted` (PCI bus ids, as NVML gives them), found by
/// bus id in `cuda` (the bus id of each CUDA ordinal). CUDA numbers devices by
/// CUDA_DEVICE_ORDER (fastest first unless told otherwise) and CUDA_VISIBLE_DEVICES, NVML by
/// PCI address, so the same index can name two different GPUs.
pub fn ordinals_for(wanted: &[String], cuda: &[String]) -> R<Vec<usize>> {
    let cuda: Vec<Option<String>> = cuda.iter().map(|id| normalise_bus_id(id)).collect();
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for id in wanted {
        let key = normalise_bus_id(id);
        match cuda.iter().position(|c| key.is_some() && *c == key) {
            Some(ordinal) => out.push(ordinal),
            None => missing.push(id.as_str()),
        }
    }
    if missing.is_empty() {
        Ok(out)
    } else {
        let seen: Vec<&str> = cuda.iter().flatten().map(String::as_str).collect();
        Err(format!(
            "no CUDA device at PCI address {} (CUDA sees {})",
            missing.join(", "),
            if seen.is_empty() {
                "none".to_string()
            } else {
                seen.join(", ")
            }
        ))
    }
}

/// Opens `ordinals` (all GPUs when empty), one primary context and stream each.
pub fn open(ordinals: &[usize]) -> R<Vec<Device>> {
    if !unsafe { sys::is_culib_present() } {
        return Err("libcuda.so could not be loaded".into());
    }
    ck("cuInit", cu::init())?;
    let count = ck("cuDeviceGetCount", cu::device::get_count())? as usize;
    let list: Vec<usize> = if ordinals.is_empty() {
        (0..count).collect()
    } else {
        ordinals.to_vec()
    };
    let mut out = Vec::new();
    for ordinal in list {
        let dev = ck("cuDeviceGet", cu::device::get(ordinal as i32))?;
        let ctx = ck("cuDevicePrimaryCtxRetain", unsafe {
            cu::primary_ctx::retain(dev)
        })?;
        ck("cuCtxSetCurrent", unsafe { cu::ctx::set_current(ctx) })?;
        let stream = ck(
            "cuStreamCreate",
            cu::stream::create(cu::stream::StreamKind::NonBlocking),
        )?;
        let attr = |a| {
            ck("cuDeviceGetAttribute", unsafe {
                cu::device::get_attribute(dev, a)
            })
        };
        let sms = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let cc = (
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        out.push(Device {
            ordinal,
            dev,
            ctx,
            stream,
            sms,
            cc,
            module: None,
        });
    }
    Ok(out)
}

/// Compiles the bundled kernels with NVRTC for each GPU's arch and loads them.
pub fn load_kernels(devices: &mut [Device]) -> R<String> {
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(
            "libnvrtc.so could not be loaded; NVRTC is needed to compile the all-reduce kernel"
                .into(),
        );
    }
    let mut compiled: Vec<((i32, i32), std::ffi::CString)> = Vec::new();
    for d in devices.iter_mut() {
        if !compiled.iter().any(|(cc, _)| *cc == d.cc) {
            let opts = cudarc::nvrtc::CompileOptions {
                options: vec![
                    format!("--gpu-architecture=compute_{}{}", d.cc.0, d.cc.1),
                    "--std=c++17".into(),
                ],
                fmad: Some(false),
                ..Default::default()
            };
            let ptx = cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, opts)
                .map_err(|e| format!("NVRTC: {e:?}"))?;
            compiled.push((
                d.cc,
                std::ffi::CString::new(ptx.to_src()).map_err(|e| e.to_string())?,
            ));
        }
        let ptx = &compiled
            .iter()
            .find(|(cc, _)| *cc == d.cc)
            .expect("compiled above")
            .1;
        d.bind()?;
        d.module = Some(ck("cuModuleLoadData", unsafe {
            cu::module::load_data(ptx.as_ptr() as *const c_void)
        })?);
    }
    let (mut major, mut minor) = (0, 0);
    let _ = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    Ok(format!("{major}.{minor}"))
}

/// Device memory that frees itself.
pub(super) struct Buffer {
    pub(super) ptr: sys::CUdeviceptr,
    ctx: sys::CUcontext,
}

impl Buffer {
    pub(super) fn new(d: &Device, bytes: usize) -> R<Self> {
        d.bind()?;
        let ptr = ck("cuMemAlloc", unsafe { cu::malloc_sync(bytes.max(16)) })?;
        Ok(Buffer { ptr, ctx: d.ctx })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        unsafe {
            let _ = cu::ctx::set_current(self.ctx);
            let _ = cu::free_sync(self.ptr);
        }
    }
}

/// Events on one stream, for timing.
pub(super) struct Timer {
    start: sys::CUevent,
    stop: sys::CUevent,
}

impl Timer {
    pub(super) fn new(d: &Device) -> R<Self> {
        d.bind()?;
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        Ok(Timer {
            start: ck("cuEventCreate", cu::event::create(flags))?,
            stop: ck("cuEventCreate", cu::event::create(flags))?,
        })
    }
    pub(super) fn begin(&self, d: &Device) -> R<()> {
        ck("cuEventRecord", unsafe {
            cu::event::record(self.start, d.stream)
        })
    }
    pub(super) fn end(&self, d: &Device) -> R<()> {
        ck("cuEventRecord", unsafe {
            cu::event::record(self.stop, d.stream)
        })
    }
    pub(super) fn seconds(&self) -> R<f64> {
        ck("cuEventSynchronize", unsafe {
            cu::event::synchronize(self.stop)
        })?;
        Ok(f64::from(ck("cuEventElapsedTime", unsafe {
            cu::event::elapsed(self.start, self.stop)
        })?) / 1e3)
    }
}

/// `can[i][j]`: GPU i can access GPU j's memory; access is enabled where it can.
pub fn peer_access(devices: &[Device]) -> R<Vec<Vec<bool>>> {
    let mut can = vec![vec![true; devices.len()]; devices.len()];
    for (i, a) in devices.iter().enumerate() {
        for (j, b) in devices.iter().enumerate() {
            if i == j {
                continue;
            }
            let mut ok = 0i32;
            ck("cuDeviceCanAccessPeer", unsafe {
                sys::cuDeviceCanAccessPeer(&mut ok, a.dev, b.dev).result()
            })?;
            can[i][j] = ok == 1;
            if ok == 1 {
                a.bind()?;
                let r = unsafe { sys::cuCtxEnablePeerAccess(b.ctx, 0) };
                if r != sys::CUresult::CUDA_SUCCESS
                    && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
                {
                    return Err(format!("cuCtxEnablePeerAccess {i}->{j}: {r:?}"));
                }
            }
        }
    }
    Ok(can)
}

/// Device-to-device copy bandwidth of one GPU, GB/s counting bytes read plus written.
pub fn memory_bandwidth(d: &Device, bytes: usize, iters: u32) -> R<f64> {
    let (src, dst) = (Buffer::new(d, bytes)?, Buffer::new(d, bytes)?);
    let t = Timer::new(d)?;
    let copy = || {
        ck("cuMemcpyDtoDAsync", unsafe {
            cu::memcpy_dtod_async(dst.ptr, src.ptr, bytes, d.stream)
        })
    };
    copy()?;
    t.begin(d)?;
    for _ in 0..iters {
        copy()?;
    }
    t.end(d)?;
    Ok(2.0 * bytes as f64 * f64::from(iters) / t.seconds()? / 1e9)
}

/// P2P copies between two GPUs: (one direction GB/s, both directions GB/s, µs per 4-byte
/// copy). The last is 200 copies queued back to back, timed together: how often a small copy
/// completes, not a round trip (nothing waits for the other GPU to answer).
pub fn p2p(a: &Device, b: &Device, bytes: usize, iters: u32) -> R<(f64, f64, f64)> {
    let (src_a, dst_b) = (Buffer::new(a, bytes)?, Buffer::new(b, bytes)?);
    let (src_b, dst_a) = (Buffer::new(b, bytes)?, Buffer::new(a, bytes)?);
    let ta = Timer::new(a)?;
    let tb = Timer::new(b)?;
    let copy = |d: &Device, dst: &Buffer, src: &Buffer, n: usize| {
        ck("cuMemcpyPeerAsync", unsafe {
            cu::memcpy_peer_async(dst.ctx, dst.ptr, src.ctx, src.ptr, n, d.stream)
        })
    };
    copy(a, &dst_b, &src_a, bytes)?;
    a.sync()?;
    ta.begin(a)?;
    for _ in 0..iters {
        copy(a, &dst_b, &src_a, bytes)?;
    }
    ta.end(a)?;
    let uni = bytes as f64 * f64::from(iters) / ta.seconds()? / 1e9;
    ta.begin(a)?;
    tb.begin(b)?;
    for _ in 0..iters {
        copy(a, &dst_b, &src_a, bytes)?;
        copy(b, &dst_a, &src_b, bytes)?;
    }
    ta.end(a)?;
    tb.end(b)?;
    let both = 2.0 * bytes as f64 * f64::from(iters) / ta.seconds()?.max(tb.seconds()?) / 1e9;
    let small = 200u32;
    ta.begin(a)?;
    for _ in 0..small {
        copy(a, &dst_b, &src_a, 4)?;
    }
    ta.end(a)?;
    let small_copy_us = ta.seconds()? / f64::from(small) * 1e6;
    Ok((uni, both, small_copy_us))
}

/// Average seconds of one `op` across `devices`: one warm-up run, then `iters` runs between
/// events on every GPU's stream; the slowest GPU's time counts.
fn timed(devices: &[Device], iters: u32, mut op: impl FnMut() -> R<()>) -> R<f64> {
    op()?;
    devices.iter().try_for_each(Device::sync)?;
    let timers: Vec<Timer> = devices.iter().map(Timer::new).collect::<R<_>>()?;
    for (t, d) in timers.iter().zip(devices) {
        t.begin(d)?;
    }
    for _ in 0..iters {
        op()?;
    }
    for (t, d) in timers.iter().zip(devices) {
        t.end(d)?;
    }
    let mut worst = 0f64;
    for t in &timers {
        worst = worst.max(t.seconds()?);
    }
    Ok(worst / f64::from(iters))
}

/// The kernel's argument block; must match `struct Args` in allreduce.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    input: [u64; MAX_RANKS],
    output: [u64; MAX_RANKS],
    flags: [u64; MAX_RANKS],
    bounds: [u64; MAX_RANKS + 1],
    n: u64,
    nranks: u32,
    rank_base: u32,
    epoch: u32,
}

/// Ranks placed on GPUs (round-robin blocks: ranks `g*k .. g*k+k` on GPU g) with their buffers.
pub struct Ranks<'a> {
    devices: &'a [Device],
    per_gpu: usize,
    input: Vec<Buffer>,
    output: Vec<Buffer>,
    flags: Vec<Buffer>,
    capacity: usize,
    epoch: u32,
}

/// Which all-reduce algorithm to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algo {
    /// Every rank reads all inputs.
    #[default]
    OneShot,
    /// Reduce-scatter, barrier, all-gather.
    TwoShot,
}

impl<'a> Ranks<'a> {
    /// Allocates `per_gpu` ranks on each device with buffers of `capacity` bytes.
    pub fn new(devices: &'a [Device], per_gpu: usize, capacity: usize) -> R<Self> {
        let n = devices.len() * per_gpu;
        if n == 0 || n > MAX_RANKS {
            return Err(format!("{n} ranks: the kernel takes 1 to {MAX_RANKS}"));
        }
        let mut r = Ranks {
            devices,
            per_gpu,
            input: vec![],
            output: vec![],
            flags: vec![],
            capacity,
            epoch: 0,
        };
        for rank in 0..n {
            let d = r.device(rank);
            r.input.push(Buffer::new(d, capacity)?);
            r.output.push(Buffer::new(d, capacity)?);
            let flags = Buffer::new(d, FLAG_SLOTS * 4)?;
            ck("cuMemsetD8", unsafe {
                cu::memset_d8_sync(flags.ptr, 0, FLAG_SLOTS * 4)
            })?;
            r.flags.push(flags);
        }
        Ok(r)
    }

    /// The number of ranks.
    pub fn count(&self) -> usize {
        self.input.len()
    }

    fn device(&self, rank: usize) -> &'a Device {
        &self.devices[rank / self.per_gpu]
    }

    /// Writes fresh test data (`seed`) into every input and poisons every output (NaN).
    pub fn fill(&self, dtype: Dtype, n: u64, seed: u32) -> R<()> {
        for rank in 0..self.count() {
            let d = self.device(rank);
            d.bind()?;
            let f = d.function(&format!("fill_{}", dtype.name()))?;
            let (mut p, mut count, mut s, mut r) = (self.input[rank].ptr, n, seed, rank as u32);
            let mut params: Vec<*mut c_void> = vec![
                (&mut p) as *mut _ as *mut c_void,
                (&mut count) as *mut _ as *mut c_void,
                (&mut s) as *mut _ as *mut c_void,
                (&mut r) as *mut _ as *mut c_void,
            ];
            let blocks = (n.div_ceil(u64::from(THREADS))).clamp(1, u64::from(d.sms) * 8) as u32;
            ck("fill", unsafe {
                cu::launch_kernel(f, (blocks, 1, 1), (THREADS, 1, 1), 0, d.stream, &mut params)
            })?;
            ck("memset", unsafe {
                cu::memset_d8_async(
                    self.output[rank].ptr,
                    0xff,
                    n as usize * dtype.size(),
                    d.stream,
                )
            })?;
        }
        self.sync()
    }

    fn sync(&self) -> R<()> {
        self.devices.iter().try_for_each(Device::sync)
    }

    /// Launches one all-reduce of `n` elements on every GPU's stream.
    pub fn launch(&mut self, dtype: Dtype, algo: Algo, n: u64) -> R<()> {
        let bytes = n as usize * dtype.size();
        if bytes > self.capacity {
            return Err(format!(
                "{bytes} bytes exceed the {} allocated",
                self.capacity
            ));
        }
        self.epoch += 1;
        let ranks = self.count();
        let mut args = Args {
            input: [0; MAX_RANKS],
            output: [0; MAX_RANKS],
            flags: [0; MAX_RANKS],
            bounds: [0; MAX_RANKS + 1],
            n,
            nranks: ranks as u32,
            rank_base: 0,
            epoch: self.epoch,
        };
        for r in 0..ranks {
            args.input[r] = self.input[r].ptr;
            args.output[r] = self.output[r].ptr;
            args.flags[r] = self.flags[r].ptr;
        }
        let bounds = schedule::slices(n, ranks, dtype.vec());
        args.bounds[..bounds.len()].copy_from_slice(&bounds);
        let name = match algo {
            Algo::OneShot => format!("allreduce_oneshot_{}", dtype.name()),
            Algo::TwoShot => format!("allreduce_twoshot_{}", dtype.name()),
        };
        let blocks = self.blocks(&name, dtype, algo, n)?;
        for (g, d) in self.devices.iter().enumerate() {
            d.bind()?;
            let f = d.function(&name)?;
            let mut a = args;
            a.rank_base = (g * self.per_gpu) as u32;
            let mut params: Vec<*mut c_void> = vec![(&mut a) as *mut Args as *mut c_void];
            let grid = (blocks, self.per_gpu as u32, 1);
            // Two-shot blocks wait on each other: a cooperative launch guarantees they are
            // all resident, or fails instead of deadlocking.
            let launched = match algo {
                Algo::OneShot => unsafe {
                    cu::launch_kernel(f, grid, (THREADS, 1, 1), 0, d.stream, &mut params)
                },
                Algo::TwoShot => unsafe {
                    cu::launch_cooperative_kernel(
                        f,
                        grid,
                        (THREADS, 1, 1),
                        0,
                        d.stream,
                        &mut params,
                    )
                },
            };
            ck(&name, launched)?;
        }
        Ok(())
    }

    /// Blocks per rank: enough for the work, no more than fit on the GPU at once.
    fn blocks(&self, name: &str, dtype: Dtype, algo: Algo, n: u64) -> R<u32> {
        let d = &self.devices[0];
        let f = d.function(name)?;
        let per_sm = ck("occupancy", unsafe {
            cu::occupancy::max_active_block_per_multiprocessor(f, THREADS as i32, 0)
        })?
        .max(1) as u32;
        let resident = (d.sms * per_sm / self.per_gpu as u32)
            .max(1)
            .min(FLAG_SLOTS as u32);
        let work = match algo {
            Algo::OneShot => n / dtype.vec(),
            Algo::TwoShot => n / dtype.vec() / self.count() as u64,
        };
        Ok((work.div_ceil(u64::from(THREADS)) as u32).clamp(1, resident))
    }

    /// Copies every rank's output back and compares it with the CPU reference, bit for bit.
    /// Returns (elements checked, mismatches, first mismatch).
    pub fn verify(&self, dtype: Dtype, n: u64, seed: u32) -> R<(u64, u64, Option<String>)> {
        self.sync()?;
        let bytes = n as usize * dtype.size();
        let mut host = vec![0u8; bytes];
        let (mut checked, mut bad, mut first) = (0u64, 0u64, None);
        let ranks = self.count();
        let threads = std::thread::available_parallelism()
            .map(|t| t.get())
            .unwrap_or(1) as u64;
        for rank in 0..ranks {
            self.device(rank).bind()?;
            ck("cuMemcpyDtoH", unsafe {
                cu::memcpy_dtoh_sync(&mut host, self.output[rank].ptr)
            })?;
            let chunk = n.div_ceil(threads).max(1);
            let results: Vec<(u64, Option<u64>)> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        let host = &host;
                        s.spawn(move || {
                            let (lo, hi) = ((t * chunk).min(n), ((t + 1) * chunk).min(n));
                            let mut wrong = 0u64;
                            let mut first = None;
                            for i in lo..hi {
                                let got = match dtype {
                                    Dtype::F32 => u32::from_le_bytes(
                                        host[i as usize * 4..i as usize * 4 + 4]
                                            .try_into()
                                            .expect("4 bytes"),
                                    ),
                                    Dtype::Bf16 => u32::from(u16::from_le_bytes(
                                        host[i as usize * 2..i as usize * 2 + 2]
                                            .try_into()
                                            .expect("2 bytes"),
                                    )),
                                };
                                if got != schedule::reference(dtype, seed, ranks, i) {
                                    wrong += 1;
                                    first.get_or_insert(i);
                                }
                            }
                            (wrong, first)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("verifier threads do not panic"))
                    .collect()
            });
            for (wrong, f) in results {
                bad += wrong;
                if let (None, Some(i)) = (&first, f) {
                    first = Some(format!(
                        "rank {rank} element {i}: expected bits {:#x}",
                        schedule::reference(dtype, seed, ranks, i)
                    ));
                }
            }
            checked += n;
        }
        Ok((checked, bad, first))
    }

    /// Average seconds of one all-reduce over `iters` launches (after a warm-up launch).
    pub fn time(&mut self, dtype: Dtype, algo: Algo, n: u64, iters: u32) -> R<f64> {
        let devices = self.devices;
        timed(devices, iters, || self.launch(dtype, algo, n))
    }

    /// NCCL on the same buffers: average seconds of one all-reduce, one rank per GPU.
    pub fn nccl_time(&self, dtype: Dtype, n: u64, iters: u32) -> R<f64> {
        use cudarc::nccl::{result as nccl, sys as nsys};
        if self.per_gpu != 1 {
            return Err("NCCL runs one rank per GPU".into());
        }
        if !unsafe { nsys::is_culib_present() } {
            return Err("libnccl could not be loaded".into());
        }
        let ndev = self.devices.len();
        let mut comms = vec![std::ptr::null_mut(); ndev];
        let ordinals: Vec<i32> = self.devices.iter().map(|d| d.ordinal as i32).collect();
        unsafe { nccl::comm_init_all(comms.as_mut_ptr(), ndev as i32, ordinals.as_ptr()) }
            .map_err(|e| format!("ncclCommInitAll: {e:?}"))?;
        let kind = match dtype {
            Dtype::F32 => nsys::ncclDataType_t::ncclFloat32,
            Dtype::Bf16 => nsys::ncclDataType_t::ncclBfloat16,
        };
        let run = || -> R<()> {
            nccl::group_start().map_err(|e| format!("{e:?}"))?;
            for (r, d) in self.devices.iter().enumerate() {
                d.bind()?;
                unsafe {
                    nccl::all_reduce(
                        self.input[r].ptr as *const c_void,
                        self.output[r].ptr as *mut c_void,
                        n as usize,
                        kind,
                        nsys::ncclRedOp_t::ncclSum,
                        comms[r],
                        d.stream as nsys::cudaStream_t,
                    )
                }
                .map_err(|e| format!("ncclAllReduce: {e:?}"))?;
            }
            nccl::group_end().map_err(|e| format!("{e:?}"))?;
            Ok(())
        };
        let result = timed(self.devices, iters, run);
        for c in comms {
            let _ = unsafe { nccl::comm_destroy(c) };
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_from_nvml_and_cuda_are_the_same_address() {
        assert_eq!(
            normalise_bus_id("00000000:1B:00.0").as_deref(),
            Some("0000:1b:00.0")
        );
        assert_eq!(
            normalise_bus_id("0000:1b:00.0").as_deref(),
            Some("0000:1b:00.0")
        );
        assert_eq!(normalise_bus_id("garbage"), None);
        assert_eq!(normalise_bus_id("0000:zz:00.0"), None);
    }

    #[test]
    fn nvml_gpus_map_to_cuda_ordinals_by_bus_id() {
        // CUDA's fastest-first order put the GPU at 0xdb first; NVML lists by address.
        let cuda = ["0000:DB:00.0", "0000:1B:00.0", "0000:43:00.0"].map(String::from);
        let nvml = ["00000000:1B:00.0", "00000000:43:00.0", "00000000:DB:00.0"].map(String::from);
        assert_eq!(ordinals_for(&nvml, &cuda).unwrap(), [1, 2, 0]);
        assert_eq!(ordinals_for(&nvml[2..], &cuda).unwrap(), [0]);
        // CUDA_VISIBLE_DEVICES hid one: say which, and what CUDA does see.
        let err = ordinals_for(&nvml, &cuda[..2]).unwrap_err();
        assert!(
            err.contains("00000000:43:00.0") && err.contains("0000:db:00.0"),
            "{err}"
        );
        assert!(ordinals_for(&["".to_string()], &cuda).is_err());
    }
}
