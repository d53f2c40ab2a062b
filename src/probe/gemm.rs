//! Level 3's load on one GPU: bf16 GEMMs through cuBLAS for a set time, timed in batches, with
//! results that are exact by construction so that silent corruption shows bit for bit.
//!
//! Every input is an integer in -3..=3 over 4, exact in bf16; a product is a multiple of
//! 1/16 and a sum of `N` of them stays below 2^13, so fp32 holds every partial sum exactly,
//! in whatever order the GEMM adds them. The result is therefore one fixed matrix: every
//! repeat on one GPU, every GPU of a node and an integer reference on the CPU must give the
//! same bits, and any difference is a fault, not rounding. Beside the CPU's tiles, the whole
//! result is checked with Freivalds' method in integers, so a fault that repeats the same
//! wrong value every time, on a GPU with no other to compare with, is still found.

use super::cuda::{Buffer, Device, R, Timer, ck};
use cudarc::cublas::{result as blas, sys as bsys};
use cudarc::driver::result as cu;
use serde::Serialize;
use sha2::Digest;
use std::time::{Duration, Instant};

/// The matrices' side: large enough that the GEMM runs at the tensor cores' rate.
pub const N: usize = 8192;
/// Side of a tile the CPU computes to check the GPU's result.
const TILE: usize = 32;
/// How often the whole result is read back and compared with the first.
const READBACK_EVERY: Duration = Duration::from_secs(10);
/// How long one timed batch of GEMMs runs.
const BATCH_TARGET: Duration = Duration::from_millis(500);
/// The test hook, as a silent corruption would leave a result: `ORDINAL` flips the lowest bit
/// of C[0,0] in the last result read from that CUDA device (a fault that came and went);
/// `ORDINAL:ROW:COL` flips C[ROW,COL] in every result read from it, the first included (a
/// fault that repeats itself, which only a check of the whole product can see).
pub const CORRUPT_HOOK: &str = "GPUBAKE_TEST_CORRUPT_GEMM";

/// Input `which` (0 for A, 1 for B) at (row, col), times 4: an integer in -3..=3 from a hash
/// of the position, so that no pattern of the data can hide a fault.
pub fn quarter(which: u64, row: usize, col: usize) -> i8 {
    let x = splitmix((which << 62) ^ ((row as u64) << 31) ^ col as u64);
    (x % 7) as i8 - 3
}

/// The bf16 bits of `q / 4` (exact: q has at most two significant bits).
pub fn bf16_bits(q: i8) -> u16 {
    ((f32::from(q) / 4.0).to_bits() >> 16) as u16
}

/// An `n` x `n` input in cuBLAS's column-major order, as quarters.
pub fn matrix(which: u64, n: usize) -> Vec<i8> {
    let mut out = vec![0i8; n * n];
    for col in 0..n {
        for row in 0..n {
            out[row + col * n] = quarter(which, row, col);
        }
    }
    out
}

/// C = A·B at (row, col), exactly, from the quarters: the sum of products over 16.
pub fn reference(a: &[i8], b: &[i8], n: usize, row: usize, col: usize) -> f32 {
    let sum: i64 = (0..n)
        .map(|k| i64::from(a[row + k * n]) * i64::from(b[k + col * n]))
        .sum();
    // |sum| <= 9 n, far inside f32's 2^24 integers: the division by 16 is exact.
    sum as f32 / 16.0
}

/// The tiles the CPU checks: the first, the last and one in the middle, by top-left corner.
pub fn tiles(n: usize) -> Vec<(usize, usize)> {
    let last = n.saturating_sub(TILE);
    vec![(0, 0), (last / 2, last / 3), (last, last)]
}

/// Freivalds' check of a whole result: (16 C)·x against A·(B·x) in exact integers, for a
/// vector x of nonzero integers drawn from `seed`. One wrong element always changes its
/// row's sum (its x is not zero), and several in one row cancel only if their errors weigh
/// to zero under a random x; the cost is three matrix-vector products, not a GEMM. Counts
/// rows: `checked` rows compared, `wrong` rows that differ.
pub fn check_product(got: &[f32], a: &[i8], b: &[i8], n: usize, seed: u64) -> Mismatch {
    let x: Vec<i64> = (0..n as u64)
        .map(|j| 1 + (splitmix(seed ^ j.wrapping_mul(0x9e37_79b9_7f4a_7c15)) % 65_535) as i64)
        .collect();
    // Column by column, so that each pass reads its matrix in the order it is stored.
    let times = |m: &mut dyn FnMut(usize) -> i64, v: &[i64]| -> Vec<i64> {
        let mut out = vec![0i64; n];
        for (col, &vc) in v.iter().enumerate() {
            for (row, o) in out.iter_mut().enumerate() {
                *o += m(row + col * n) * vc;
            }
        }
        out
    };
    let bx = times(&mut |i| i64::from(b[i]), &x);
    let want = times(&mut |i| i64::from(a[i]), &bx);
    // 16 C is an integer of at most 9 n in size; an element that is not one is wrong on
    // its own, named, and left out of its row's sum.
    let mut m = Mismatch::default();
    let mut bad_rows = vec![false; n];
    let bound = 9.0 * n as f64;
    let got_x = times(
        &mut |i| {
            let v = f64::from(got[i]) * 16.0;
            if v.fract() == 0.0 && v.abs() <= bound {
                v as i64
            } else {
                let (row, col) = (i % n, i / n);
                bad_rows[row] = true;
                m.first.get_or_insert_with(|| {
                    format!(
                        "C[{row},{col}] = {:e}, not a product of these inputs",
                        got[i]
                    )
                });
                0
            }
        },
        &x,
    );
    for (row, (g, w)) in got_x.iter().zip(&want).enumerate() {
        m.checked += 1;
        if bad_rows[row] || g != w {
            m.wrong += 1;
            m.first.get_or_insert_with(|| {
                format!(
                    "row {row}: C·x = {}, A·(B·x) = {}",
                    *g as f64 / 16.0,
                    *w as f64 / 16.0
                )
            });
        }
    }
    m
}

/// splitmix64's finaliser: a well-mixed 64-bit value from any input.
fn splitmix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Differences between a result and what it should be.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Mismatch {
    /// Elements compared.
    pub checked: u64,
    /// Elements whose bits differ.
    pub wrong: u64,
    /// The first that differs: where, what was read, what was expected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first: Option<String>,
}

impl Mismatch {
    fn note(&mut self, row: usize, col: usize, got: f32, want: f32) {
        self.checked += 1;
        if got.to_bits() != want.to_bits() {
            self.wrong += 1;
            if self.first.is_none() {
                self.first = Some(format!("C[{row},{col}] = {got:e}, expected {want:e}"));
            }
        }
    }

    fn add(&mut self, other: Mismatch) {
        self.checked += other.checked;
        self.wrong += other.wrong;
        if self.first.is_none() {
            self.first = other.first;
        }
    }
}

/// `got` against `want`, element by element (both column-major `n` x `n`).
pub fn compare(got: &[f32], want: &[f32], n: usize) -> Mismatch {
    let mut m = Mismatch::default();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        m.note(i % n, i / n, *g, *w);
    }
    m
}

/// The CPU's tiles against `got`.
pub fn check_tiles(got: &[f32], a: &[i8], b: &[i8], n: usize) -> Mismatch {
    let mut m = Mismatch::default();
    let side = TILE.min(n);
    for (r0, c0) in tiles(n) {
        for col in c0..c0 + side {
            for row in r0..r0 + side {
                m.note(row, col, got[row + col * n], reference(a, b, n, row, col));
            }
        }
    }
    m
}

/// The sha256 of a result's bits, to compare GPUs by.
pub fn digest(c: &[f32]) -> String {
    let mut h = sha2::Sha256::new();
    for x in c {
        h.update(x.to_le_bytes());
    }
    hex::encode(h.finalize())
}

/// What one GPU's burn measured.
#[derive(Debug, Serialize)]
pub struct Burn {
    /// CUDA ordinal.
    pub gpu: usize,
    /// The matrices' side.
    pub n: usize,
    /// Seconds of timed GEMMs.
    pub seconds: f64,
    /// GEMMs run.
    pub gemms: u64,
    /// TFLOP/s of each timed batch, in order.
    pub tflops: Vec<f64>,
    /// Full results read back and compared with the first.
    pub readbacks: u32,
    /// Every readback against the first.
    pub repeat: Mismatch,
    /// The CPU's tiles against the first and the last result.
    pub reference: Mismatch,
    /// Freivalds' check of the first and the last result, in rows.
    pub product: Mismatch,
    /// sha256 of the first result's bits.
    pub sha256: String,
}

fn gemm(handle: bsys::cublasHandle_t, a: &Buffer, b: &Buffer, c: &Buffer) -> R<()> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let n = N as i32;
    unsafe {
        blas::gemm_ex(
            handle,
            bsys::cublasOperation_t::CUBLAS_OP_N,
            bsys::cublasOperation_t::CUBLAS_OP_N,
            n,
            n,
            n,
            (&alpha) as *const f32 as *const _,
            a.ptr as *const _,
            bsys::cudaDataType::CUDA_R_16BF,
            n,
            b.ptr as *const _,
            bsys::cudaDataType::CUDA_R_16BF,
            n,
            (&beta) as *const f32 as *const _,
            c.ptr as *mut _,
            bsys::cudaDataType::CUDA_R_32F,
            n,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| format!("cublasGemmEx: {e:?}"))
}

fn read_back(d: &Device, c: &Buffer) -> R<Vec<f32>> {
    d.sync()?;
    let mut host = vec![0f32; N * N];
    ck("cuMemcpyDtoH", unsafe {
        cu::memcpy_dtoh_sync(&mut host, c.ptr)
    })?;
    Ok(host)
}

/// What the test hook asks of one device's results.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Corruption {
    /// Nothing.
    None,
    /// C[0,0] of the last result read.
    Last,
    /// C[row,col] of every result read.
    Every(usize, usize),
}

impl Corruption {
    /// The hook's value for CUDA device `ordinal` of an `n` x `n` result.
    pub fn asked(value: Option<&str>, ordinal: usize, n: usize) -> R<Corruption> {
        let Some(value) = value else {
            return Ok(Corruption::None);
        };
        let bad = || {
            format!(
                "{CORRUPT_HOOK}={value}: not ORDINAL or ORDINAL:ROW:COL with ROW, COL below {n}"
            )
        };
        let parts: Vec<usize> = value
            .split(':')
            .map(|p| p.trim().parse().map_err(|_| bad()))
            .collect::<R<_>>()?;
        match parts[..] {
            [_, row, col] if row >= n || col >= n => Err(bad()),
            [o] if o == ordinal => Ok(Corruption::Last),
            [o, row, col] if o == ordinal => Ok(Corruption::Every(row, col)),
            [_] | [_, _, _] => Ok(Corruption::None),
            _ => Err(bad()),
        }
    }

    /// Flips the asked element of `host`, read from the GPU; `last` for the burn's last read.
    fn apply(self, host: &mut [f32], n: usize, last: bool) {
        let at = match self {
            Corruption::Last if last => 0,
            Corruption::Every(row, col) => row + col * n,
            _ => return,
        };
        host[at] = f32::from_bits(host[at].to_bits() ^ 1);
    }
}

/// cuBLAS's handle on one GPU's stream, destroyed with it.
struct Handle(bsys::cublasHandle_t);

impl Drop for Handle {
    fn drop(&mut self) {
        unsafe {
            let _ = blas::destroy_handle(self.0);
        }
    }
}

/// Runs GEMMs on `d` for `seconds`, then reads the result back a last time and checks it.
pub fn burn(d: &Device, seconds: f64) -> R<Burn> {
    if !unsafe { bsys::is_culib_present() } {
        return Err(
            "libcublas.so could not be loaded: level 3's GEMMs need cuBLAS (the \
                    image's nvidia-cublas wheel or the CUDA toolkit's)"
                .into(),
        );
    }
    let corruption = Corruption::asked(std::env::var(CORRUPT_HOOK).ok().as_deref(), d.ordinal, N)?;
    // A new x each run: a fault cannot be fitted to one.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.as_nanos() as u64)
        .unwrap_or(0)
        ^ d.ordinal as u64;
    let (qa, qb) = (matrix(0, N), matrix(1, N));
    let upload = |q: &[i8]| -> R<Buffer> {
        let buf = Buffer::new(d, N * N * 2)?;
        let bits: Vec<u16> = q.iter().map(|&x| bf16_bits(x)).collect();
        ck("cuMemcpyHtoD", unsafe {
            cu::memcpy_htod_sync(buf.ptr, &bits)
        })?;
        Ok(buf)
    };
    let (a, b) = (upload(&qa)?, upload(&qb)?);
    let c = Buffer::new(d, N * N * 4)?;
    let read = |last: bool| -> R<Vec<f32>> {
        let mut host = read_back(d, &c)?;
        corruption.apply(&mut host, N, last);
        Ok(host)
    };
    d.bind()?;
    let handle = Handle(blas::create_handle().map_err(|e| format!("cublasCreate: {e:?}"))?);
    unsafe { blas::set_stream(handle.0, d.stream as bsys::cudaStream_t) }
        .map_err(|e| format!("cublasSetStream: {e:?}"))?;

    gemm(handle.0, &a, &b, &c)?;
    let first = read(false)?;
    let mut reference = check_tiles(&first, &qa, &qb, N);
    let mut product = check_product(&first, &qa, &qb, N, seed);
    let mut repeat = Mismatch::default();
    let timer = Timer::new(d)?;
    let flops = 2.0 * (N as f64).powi(3);
    let (mut batch, mut gemms, mut timed) = (4u64, 1u64, 0.0f64);
    let mut tflops = Vec::new();
    let mut readbacks = 1u32;
    let started = Instant::now();
    let mut last_readback = started;
    while started.elapsed().as_secs_f64() < seconds {
        timer.begin(d)?;
        for _ in 0..batch {
            gemm(handle.0, &a, &b, &c)?;
        }
        timer.end(d)?;
        let t = timer.seconds()?;
        // A batch takes milliseconds; a time of none would be a rate of infinity.
        if t.is_nan() || t <= 0.0 {
            return Err(format!("the GPU's timer gave {t} s for {batch} GEMMs"));
        }
        gemms += batch;
        timed += t;
        tflops.push(flops * batch as f64 / t / 1e12);
        // Batches of about half a second: enough launches to hide their gaps, and a rate
        // often enough to see a clock fall.
        batch = ((batch as f64 * BATCH_TARGET.as_secs_f64() / t) as u64).clamp(1, 10_000);
        if last_readback.elapsed() >= READBACK_EVERY {
            repeat.add(compare(&read(false)?, &first, N));
            readbacks += 1;
            last_readback = Instant::now();
        }
    }
    let last = read(true)?;
    repeat.add(compare(&last, &first, N));
    reference.add(check_tiles(&last, &qa, &qb, N));
    product.add(check_product(&last, &qa, &qb, N, seed.rotate_left(17)));
    Ok(Burn {
        gpu: d.ordinal,
        n: N,
        seconds: timed,
        gemms,
        tflops,
        readbacks: readbacks + 1,
        repeat,
        reference,
        product,
        sha256: digest(&first),
    })
}

/// Opens the one GPU the worker was given and burns it.
pub fn run(devices: &[Device], seconds: f64) -> R<Burn> {
    match devices {
        [d] => burn(d, seconds),
        _ => Err(format!(
            "a burn worker drives one GPU; {} given",
            devices.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_exact_in_bf16_and_cover_every_value() {
        let mut seen = [false; 7];
        for i in 0..64 {
            for j in 0..64 {
                let q = quarter(0, i, j);
                assert!((-3..=3).contains(&q));
                seen[(q + 3) as usize] = true;
                let back = f32::from_bits(u32::from(bf16_bits(q)) << 16);
                assert_eq!(back, f32::from(q) / 4.0);
            }
        }
        assert!(seen.iter().all(|s| *s), "{seen:?}");
        assert_ne!(matrix(0, 16), matrix(1, 16), "A and B differ");
    }

    #[test]
    fn the_reference_is_the_exact_product_in_any_order() {
        let n = 48;
        let (a, b) = (matrix(0, n), matrix(1, n));
        for (row, col) in [(0, 0), (5, 17), (47, 47)] {
            // The same sum in f32, added in two orders, gives the same bits: the claim the
            // whole check rests on.
            let forward: f32 = (0..n)
                .map(|k| f32::from(a[row + k * n]) / 4.0 * (f32::from(b[k + col * n]) / 4.0))
                .sum();
            let backward: f32 = (0..n)
                .rev()
                .map(|k| f32::from(a[row + k * n]) / 4.0 * (f32::from(b[k + col * n]) / 4.0))
                .sum();
            let exact = reference(&a, &b, n, row, col);
            assert_eq!(forward.to_bits(), exact.to_bits());
            assert_eq!(backward.to_bits(), exact.to_bits());
        }
    }

    /// The CPU's whole product, column-major.
    fn product(a: &[i8], b: &[i8], n: usize) -> Vec<f32> {
        (0..n * n)
            .map(|i| reference(a, b, n, i % n, i / n))
            .collect()
    }

    #[test]
    fn one_flipped_bit_is_found_by_both_comparisons() {
        let n = 64;
        let (a, b) = (matrix(0, n), matrix(1, n));
        let good = product(&a, &b, n);
        assert_eq!(compare(&good, &good, n).wrong, 0);
        let tiles_ok = check_tiles(&good, &a, &b, n);
        assert_eq!(tiles_ok.wrong, 0);
        assert_eq!(tiles_ok.checked, 3 * (TILE * TILE) as u64);
        let mut bad = good.clone();
        bad[0] = f32::from_bits(bad[0].to_bits() ^ 1);
        let repeat = compare(&bad, &good, n);
        assert_eq!(repeat.wrong, 1);
        assert!(repeat.first.unwrap().starts_with("C[0,0]"));
        assert_eq!(check_tiles(&bad, &a, &b, n).wrong, 1);
        assert_ne!(digest(&bad), digest(&good));
        // A flip outside every tile is still found by the repeat comparison.
        let mut far = good.clone();
        far[n + 40] = -far[n + 40] - 1.0;
        assert_eq!(check_tiles(&far, &a, &b, n).wrong, 0);
        assert_eq!(compare(&far, &good, n).wrong, 1);
    }

    #[test]
    fn the_whole_product_check_finds_any_wrong_element_and_names_its_row() {
        let n = 96;
        let (a, b) = (matrix(0, n), matrix(1, n));
        let good = product(&a, &b, n);
        for seed in [0, 1, u64::MAX] {
            let ok = check_product(&good, &a, &b, n, seed);
            assert_eq!((ok.checked, ok.wrong, ok.first), (n as u64, 0, None));
        }
        // Every element outside the CPU's tiles, one at a time, each kind of fault: the
        // lowest bit, a sign, a value off by one sixteenth, one that is no product of
        // these inputs (a fraction finer than 1/16, too large, not a number).
        type Fault = fn(f32) -> f32;
        let faults: [Fault; 6] = [
            |v| f32::from_bits(v.to_bits() ^ 1),
            |v| -v - 1.0,
            |v| v + 1.0 / 16.0,
            |v| v + 1.0 / 64.0,
            |_| 1e30,
            |_| f32::NAN,
        ];
        for (k, fault) in faults.iter().enumerate() {
            for i in (k..n * n).step_by(37) {
                let mut bad = good.clone();
                bad[i] = fault(bad[i]);
                if bad[i].to_bits() == good[i].to_bits() {
                    continue;
                }
                let m = check_product(&bad, &a, &b, n, i as u64);
                assert_eq!(m.wrong, 1, "element {i}, fault {k}");
                let first = m.first.unwrap();
                assert!(
                    first.starts_with(&format!("row {}:", i % n))
                        || first.starts_with(&format!("C[{},{}]", i % n, i / n)),
                    "{first}"
                );
            }
        }
        // Two wrong elements in two rows: both rows.
        let mut two = good.clone();
        two[5] += 1.0;
        two[7 + 3 * n] -= 2.0;
        assert_eq!(check_product(&two, &a, &b, n, 9).wrong, 2);
    }

    #[test]
    fn the_hook_names_a_device_and_an_element_inside_the_result() {
        let n = 64;
        let asked = |v: &str, o| Corruption::asked(Some(v), o, n);
        assert_eq!(Corruption::asked(None, 0, n), Ok(Corruption::None));
        assert_eq!(asked("0", 0), Ok(Corruption::Last));
        assert_eq!(asked("1", 0), Ok(Corruption::None));
        assert_eq!(asked("0:5:63", 0), Ok(Corruption::Every(5, 63)));
        assert_eq!(asked("1:5:63", 0), Ok(Corruption::None));
        for bad in ["", "x", "0:5", "0:64:0", "0:0:64", "0:1:2:3", "-1"] {
            assert!(asked(bad, 0).is_err(), "{bad:?}");
        }
        // Every read carries the repeated fault; only the last carries the one-off.
        let good = vec![1.0f32; n * n];
        let mut every = good.clone();
        Corruption::Every(2, 3).apply(&mut every, n, false);
        assert_eq!(
            compare(&every, &good, n).first.unwrap(),
            "C[2,3] = 1.0000001e0, expected 1e0"
        );
        let mut once = good.clone();
        Corruption::Last.apply(&mut once, n, false);
        assert_eq!(once, good);
        Corruption::Last.apply(&mut once, n, true);
        assert_eq!(compare(&once, &good, n).wrong, 1);
    }

    #[test]
    fn tiles_stay_inside_the_matrix() {
        for n in [TILE, 100, N] {
            for (r, c) in tiles(n) {
                assert!(r + TILE <= n && c + TILE <= n, "{n}: ({r},{c})");
            }
        }
    }
}
