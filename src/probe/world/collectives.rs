//! NCCL across the ranks of a world, on one GPU per rank: run in `gpubake probe-worker world`,
//! a child of the rank's probe, so a hang is killed and NCCL reads a fresh environment.
//!
//! The communicator is made non-blocking (`blocking = 0`): `ncclCommInitRankConfig` returns at
//! once and every later wait polls `ncclCommGetAsyncError` against the deadline, calling
//! `ncclCommAbort` when it passes, so a peer that never joins costs the deadline, not a hang.
//! Then: an all-reduce and an all-gather checked on known values, both timed at each size
//! (bus bandwidth as nccl-tests computes it), and a send/receive shift per peer distance
//! (rank r to r+k), which times every directed pair of ranks once.

use crate::probe::schedule;
use cudarc::driver::{result as cu, sys};
use cudarc::nccl::sys as nccl;
use serde::Serialize;
use std::ffi::c_void;
use std::time::{Duration, Instant};

type R<T> = Result<T, String>;

/// Bytes in NCCL's unique id.
pub const ID_BYTES: usize = 128;

/// What one rank runs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// This rank's place in the communicator (not necessarily its world rank: ranks without
    /// a GPU have no seat).
    pub rank: u32,
    /// Ranks in the communicator.
    pub nranks: u32,
    /// The CUDA ordinal of this rank's GPU.
    pub ordinal: usize,
    /// Message sizes in bytes.
    pub sizes: Vec<u64>,
    /// Timed launches per size.
    pub iters: u32,
    /// When to give up and abort the communicator.
    pub deadline: Instant,
}

/// One timed collective at one size.
#[derive(Clone, Debug, Serialize)]
pub struct Timing {
    /// Bytes of the whole result (nccl-tests' "size").
    pub bytes: u64,
    /// Microseconds per call, this rank's view.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw: f64,
    /// nccl-tests bus bandwidth, GB/s.
    pub busbw: f64,
}

/// One send from this rank to a peer, timed while every rank sends to the peer as far away.
#[derive(Clone, Debug, Serialize)]
pub struct PairTiming {
    /// The communicator rank sent to.
    pub to: u32,
    /// Bytes per send.
    pub bytes: u64,
    /// Microseconds per send.
    pub time_us: f64,
    /// GB/s, one direction.
    pub gbps: f64,
}

/// What a rank measured.
#[derive(Clone, Debug, Serialize)]
pub struct Measured {
    /// NCCL's version, `2.28.9`.
    pub nccl_version: String,
    /// Seconds until the communicator was ready.
    pub init_s: f64,
    /// Elements of the all-reduce and all-gather results compared with what they must be.
    pub checked: u64,
    /// All-reduce per size.
    pub all_reduce: Vec<Timing>,
    /// All-gather per size.
    pub all_gather: Vec<Timing>,
    /// Sends to each other rank at the largest size.
    pub pairs: Vec<PairTiming>,
}

/// nccl-tests' bus bandwidth of an all-gather: algbw (the whole result over the time) scaled
/// by (n-1)/n, the share of the result each rank receives from others.
pub fn all_gather_busbw(bytes: u64, seconds: f64, ranks: usize) -> f64 {
    schedule::algbw(bytes, seconds) * (ranks as f64 - 1.0) / ranks as f64
}

/// ncclConfig_t as NCCL 2.18 defined it. NCCL reads a config by its `version` and `size`, so
/// this layout is understood by 2.18 and every later release whatever fields they added
/// (cudarc's own struct follows the newest release, which an older NCCL would overread).
#[repr(C)]
struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: i32,
    cga_cluster_size: i32,
    min_ctas: i32,
    max_ctas: i32,
    net_name: *const std::ffi::c_char,
    split_share: i32,
}

/// NCCL_CONFIG_UNDEF_INT: "let NCCL decide".
const UNDEF: i32 = i32::MIN;

impl Config {
    fn non_blocking() -> Self {
        Config {
            size: std::mem::size_of::<Config>(),
            magic: 0xcafe_beef,
            version: 2 * 10000 + 18 * 100,
            blocking: 0,
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            net_name: std::ptr::null(),
            split_share: UNDEF,
        }
    }
}

/// Makes a unique id: the communicator's root starts listening in this process, which must
/// therefore stay alive until every rank has joined.
pub fn unique_id() -> R<[u8; ID_BYTES]> {
    loaded()?;
    let id = cudarc::nccl::result::get_uniqueid().map_err(|e| named("ncclGetUniqueId", e.0))?;
    Ok(id.internal.map(|c| c as u8))
}

fn loaded() -> R<()> {
    if unsafe { nccl::is_culib_present() } {
        Ok(())
    } else {
        Err("libnccl could not be loaded".into())
    }
}

/// `ncclSystemError (2): ...` with NCCL's own name for the code.
fn named(call: &str, code: nccl::ncclResult_t) -> String {
    let text = unsafe { nccl::ncclGetErrorString(code) };
    let text = if text.is_null() {
        String::new()
    } else {
        unsafe { std::ffi::CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    format!("{call}: {code:?} ({text})")
}

fn ck<T>(what: &str, r: Result<T, cu::DriverError>) -> R<T> {
    r.map_err(|e| format!("{what}: {e:?}"))
}

/// A communicator that is aborted, not destroyed, when a wait failed: destroying one whose
/// peers are gone would wait for them.
struct Comm {
    raw: nccl::ncclComm_t,
    healthy: bool,
}

impl Comm {
    /// Waits until NCCL finished the last call on this communicator, or the deadline passed.
    fn settle(&mut self, call: &str, deadline: Instant) -> R<()> {
        let asked_at = Instant::now();
        loop {
            let mut state = nccl::ncclResult_t::ncclSuccess;
            let asked = unsafe { nccl::ncclCommGetAsyncError(self.raw, &mut state) };
            if asked != nccl::ncclResult_t::ncclSuccess {
                self.healthy = false;
                return Err(named("ncclCommGetAsyncError", asked));
            }
            match state {
                nccl::ncclResult_t::ncclSuccess => return Ok(()),
                nccl::ncclResult_t::ncclInProgress if Instant::now() < deadline => {
                    // A non-blocking communicator answers every collective "in progress"
                    // and settles in microseconds: sleeping here would time the sleep (a
                    // 5 ms nap made every size take 5 ms). Only a long wait (init) naps.
                    if asked_at.elapsed() < Duration::from_millis(50) {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                nccl::ncclResult_t::ncclInProgress => {
                    self.healthy = false;
                    return Err(format!(
                        "{call} still in progress at the deadline: aborted (a peer that never \
                         joined, or a network NCCL cannot cross)"
                    ));
                }
                code => {
                    self.healthy = false;
                    return Err(format!("{}{}", named(call, code), self.last_error()));
                }
            }
        }
    }

    /// Checks a call's return, then waits for it to settle.
    fn call(&mut self, call: &str, code: nccl::ncclResult_t, deadline: Instant) -> R<()> {
        match code {
            nccl::ncclResult_t::ncclSuccess | nccl::ncclResult_t::ncclInProgress => {
                self.settle(call, deadline)
            }
            code => {
                self.healthy = false;
                Err(format!("{}{}", named(call, code), self.last_error()))
            }
        }
    }

    fn last_error(&self) -> String {
        let text = unsafe { nccl::ncclGetLastError(self.raw) };
        if text.is_null() {
            return String::new();
        }
        let text = unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy();
        if text.trim().is_empty() {
            String::new()
        } else {
            format!(": {}", text.trim())
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        unsafe {
            if self.healthy {
                let _ = nccl::ncclCommFinalize(self.raw);
                let mut state = nccl::ncclResult_t::ncclInProgress;
                let until = Instant::now() + Duration::from_secs(5);
                while state == nccl::ncclResult_t::ncclInProgress && Instant::now() < until {
                    let _ = nccl::ncclCommGetAsyncError(self.raw, &mut state);
                    std::thread::sleep(Duration::from_millis(5));
                }
                if state == nccl::ncclResult_t::ncclSuccess {
                    let _ = nccl::ncclCommDestroy(self.raw);
                    return;
                }
            }
            let _ = nccl::ncclCommAbort(self.raw);
        }
    }
}

/// Device memory that frees itself.
struct Buffer(sys::CUdeviceptr);

impl Buffer {
    fn new(bytes: usize) -> R<Self> {
        Ok(Buffer(ck("cuMemAlloc", unsafe {
            cu::malloc_sync(bytes.max(16))
        })?))
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let _ = unsafe { cu::free_sync(self.0) };
    }
}

/// The GPU, its stream and the communicator of this rank.
struct Rank {
    plan: Plan,
    stream: sys::CUstream,
    comm: Comm,
}

/// Joins the communicator `id` and measures. Err says which step failed and why.
pub fn run(plan: &Plan, id: &[u8; ID_BYTES]) -> R<Measured> {
    loaded()?;
    if !unsafe { sys::is_culib_present() } {
        return Err("libcuda.so could not be loaded".into());
    }
    ck("cuInit", cu::init())?;
    let dev = ck("cuDeviceGet", cu::device::get(plan.ordinal as i32))?;
    let ctx = ck("cuDevicePrimaryCtxRetain", unsafe {
        cu::primary_ctx::retain(dev)
    })?;
    ck("cuCtxSetCurrent", unsafe { cu::ctx::set_current(ctx) })?;
    let stream = ck(
        "cuStreamCreate",
        cu::stream::create(cu::stream::StreamKind::NonBlocking),
    )?;
    let mut version = 0;
    unsafe { nccl::ncclGetVersion(&mut version) };
    let nccl_version = format!(
        "{}.{}.{}",
        version / 10000,
        version % 10000 / 100,
        version % 100
    );

    let started = Instant::now();
    let mut unique = nccl::ncclUniqueId {
        internal: [0; ID_BYTES],
    };
    for (slot, byte) in unique.internal.iter_mut().zip(id) {
        *slot = *byte as std::ffi::c_char;
    }
    let mut config = Config::non_blocking();
    let mut comm = Comm {
        raw: std::ptr::null_mut(),
        healthy: true,
    };
    let code = unsafe {
        nccl::ncclCommInitRankConfig(
            &mut comm.raw,
            plan.nranks as i32,
            unique,
            plan.rank as i32,
            (&mut config as *mut Config).cast(),
        )
    };
    comm.call("ncclCommInitRankConfig", code, plan.deadline)?;
    let init_s = started.elapsed().as_secs_f64();
    let mut rank = Rank {
        plan: plan.clone(),
        stream,
        comm,
    };
    rank.measure(nccl_version, init_s)
}

impl Rank {
    fn measure(&mut self, nccl_version: String, init_s: f64) -> R<Measured> {
        let n = self.plan.nranks as usize;
        // All-gather sizes are rounded down to whole elements per rank.
        let sizes: Vec<u64> = self
            .plan
            .sizes
            .iter()
            .map(|s| (s / (4 * n as u64)).max(1) * 4 * n as u64)
            .collect();
        let top = *sizes.iter().max().ok_or("no message size")? as usize;
        let (send, recv) = (Buffer::new(top)?, Buffer::new(top)?);
        let checked = self.check(&send, &recv, sizes[0])?;
        let mut all_reduce = Vec::new();
        let mut all_gather = Vec::new();
        for &bytes in &sizes {
            let t = self.timed(|me| me.all_reduce(&send, &recv, bytes))?;
            all_reduce.push(Timing {
                bytes,
                time_us: t * 1e6,
                algbw: schedule::algbw(bytes, t),
                busbw: schedule::busbw(bytes, t, n),
            });
            let t = self.timed(|me| me.all_gather(&send, &recv, bytes))?;
            all_gather.push(Timing {
                bytes,
                time_us: t * 1e6,
                algbw: schedule::algbw(bytes, t),
                busbw: all_gather_busbw(bytes, t, n),
            });
        }
        let mut pairs = Vec::new();
        let me = self.plan.rank as usize;
        for k in 1..n {
            let (to, from) = ((me + k) % n, (me + n - k) % n);
            let t = self.timed(|r| r.shift(&send, &recv, top as u64, to, from))?;
            pairs.push(PairTiming {
                to: to as u32,
                bytes: top as u64,
                time_us: t * 1e6,
                gbps: schedule::algbw(top as u64, t),
            });
        }
        Ok(Measured {
            nccl_version,
            init_s,
            checked,
            all_reduce,
            all_gather,
            pairs,
        })
    }

    /// Every rank puts rank+1 in each element: the all-reduce must give n(n+1)/2 everywhere,
    /// the all-gather r+1 in rank r's slice. Returns the elements compared.
    fn check(&mut self, send: &Buffer, recv: &Buffer, bytes: u64) -> R<u64> {
        let n = self.plan.nranks as usize;
        let mine = (self.plan.rank + 1) as f32;
        ck("cuMemsetD32", unsafe {
            sys::cuMemsetD32_v2(send.0, mine.to_bits(), bytes as usize / 4).result()
        })?;
        // A plain memset need not be done when it returns; NCCL's stream does not wait for it.
        ck("cuCtxSynchronize", unsafe {
            sys::cuCtxSynchronize().result()
        })?;
        self.all_reduce(send, recv, bytes)?;
        self.drain()?;
        let sum = (n * (n + 1) / 2) as f32;
        let got = self.read(recv, bytes)?;
        if let Some(i) = got.iter().position(|v| *v != sum) {
            return Err(format!(
                "all-reduce of {bytes} bytes gave {} at element {i}, not {sum}",
                got[i]
            ));
        }
        self.all_gather(send, recv, bytes)?;
        self.drain()?;
        let gathered = self.read(recv, bytes)?;
        let per_rank = gathered.len() / n;
        if let Some(i) = gathered
            .iter()
            .enumerate()
            .position(|(i, v)| *v != (i / per_rank + 1) as f32)
        {
            return Err(format!(
                "all-gather of {bytes} bytes gave {} at element {i}, not {}",
                gathered[i],
                i / per_rank + 1
            ));
        }
        Ok((got.len() + gathered.len()) as u64)
    }

    fn read(&self, buffer: &Buffer, bytes: u64) -> R<Vec<f32>> {
        let mut host = vec![0f32; bytes as usize / 4];
        ck("cuMemcpyDtoH", unsafe {
            cu::memcpy_dtoh_sync(&mut host, buffer.0)
        })?;
        Ok(host)
    }

    fn all_reduce(&mut self, send: &Buffer, recv: &Buffer, bytes: u64) -> R<()> {
        let code = unsafe {
            nccl::ncclAllReduce(
                send.0 as *const c_void,
                recv.0 as *mut c_void,
                bytes as usize / 4,
                nccl::ncclDataType_t::ncclFloat32,
                nccl::ncclRedOp_t::ncclSum,
                self.comm.raw,
                self.stream.cast(),
            )
        };
        self.comm.call("ncclAllReduce", code, self.plan.deadline)
    }

    fn all_gather(&mut self, send: &Buffer, recv: &Buffer, bytes: u64) -> R<()> {
        let code = unsafe {
            nccl::ncclAllGather(
                send.0 as *const c_void,
                recv.0 as *mut c_void,
                bytes as usize / 4 / self.plan.nranks as usize,
                nccl::ncclDataType_t::ncclFloat32,
                self.comm.raw,
                self.stream.cast(),
            )
        };
        self.comm.call("ncclAllGather", code, self.plan.deadline)
    }

    /// Sends to `to` and receives from `from` in one group.
    fn shift(&mut self, send: &Buffer, recv: &Buffer, bytes: u64, to: usize, from: usize) -> R<()> {
        let count = bytes as usize / 4;
        let float = nccl::ncclDataType_t::ncclFloat32;
        let deadline = self.plan.deadline;
        self.comm.call(
            "ncclGroupStart",
            unsafe { nccl::ncclGroupStart() },
            deadline,
        )?;
        let sent = unsafe {
            nccl::ncclSend(
                send.0 as *const c_void,
                count,
                float,
                to as i32,
                self.comm.raw,
                self.stream.cast(),
            )
        };
        let received = unsafe {
            nccl::ncclRecv(
                recv.0 as *mut c_void,
                count,
                float,
                from as i32,
                self.comm.raw,
                self.stream.cast(),
            )
        };
        let ended = unsafe { nccl::ncclGroupEnd() };
        for (call, code) in [
            ("ncclSend", sent),
            ("ncclRecv", received),
            ("ncclGroupEnd", ended),
        ] {
            self.comm.call(call, code, deadline)?;
        }
        Ok(())
    }

    /// Waits for the stream to run dry, watching NCCL for an error and the deadline.
    fn drain(&mut self) -> R<()> {
        loop {
            match unsafe { sys::cuStreamQuery(self.stream) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                other => return Err(format!("cuStreamQuery: {other:?}")),
            }
            self.comm
                .settle("the queued collectives", self.plan.deadline)?;
            if Instant::now() >= self.plan.deadline {
                self.comm.healthy = false;
                return Err(
                    "the collectives had not finished at the deadline: aborted (a peer stopped, \
                     or the network is that slow)"
                        .into(),
                );
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Average seconds of `op`: one warm-up call, then `iters` calls between two events.
    fn timed(&mut self, mut op: impl FnMut(&mut Self) -> R<()>) -> R<f64> {
        op(self)?;
        self.drain()?;
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        let start = ck("cuEventCreate", cu::event::create(flags))?;
        let stop = ck("cuEventCreate", cu::event::create(flags))?;
        let timing = (|| {
            ck("cuEventRecord", unsafe {
                cu::event::record(start, self.stream)
            })?;
            for _ in 0..self.plan.iters {
                op(self)?;
            }
            ck("cuEventRecord", unsafe {
                cu::event::record(stop, self.stream)
            })?;
            self.drain()?;
            let ms = ck("cuEventElapsedTime", unsafe {
                cu::event::elapsed(start, stop)
            })?;
            Ok(f64::from(ms) / 1e3 / f64::from(self.plan.iters.max(1)))
        })();
        unsafe {
            let _ = cu::event::destroy(start);
            let _ = cu::event::destroy(stop);
        }
        timing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_gather_bus_bandwidth_is_nccl_tests_arithmetic() {
        // 1 GB gathered in 0.1 s by 4 ranks: algbw 10 GB/s, each rank received 3/4 of it.
        assert!((all_gather_busbw(1_000_000_000, 0.1, 4) - 7.5).abs() < 1e-9);
        // All-reduce for comparison: 2(n-1)/n.
        assert!((schedule::busbw(1_000_000_000, 0.1, 4) - 15.0).abs() < 1e-9);
        assert_eq!(all_gather_busbw(1_000_000_000, 0.1, 1), 0.0);
    }

    #[test]
    fn the_config_is_the_size_nccl_2_18_expects() {
        // size_t, 3 x u32, 3 x int, a pointer, an int: 48 bytes on 64-bit Linux with padding.
        assert_eq!(std::mem::size_of::<Config>(), 48);
        let c = Config::non_blocking();
        assert_eq!((c.magic, c.version, c.blocking), (0xcafe_beef, 21800, 0));
    }
}
