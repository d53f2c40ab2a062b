//! The CPU side of the bundled all-reduce: how the elements are split among ranks (the
//! kernel reads these bounds, so this is the one schedule), the test data every rank is given
//! (a counter-based hash, so the GPU makes it and the CPU re-makes it without copies), the
//! reference sum in rank order, and the bandwidth arithmetic of nccl-tests.

/// Largest rank count the kernel takes.
pub const MAX_RANKS: usize = 8;

/// Element types the kernel reduces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE binary32.
    #[default]
    F32,
    /// bfloat16, summed in float32 and rounded once.
    Bf16,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }

    /// Elements per 16-byte vector load.
    pub fn vec(self) -> u64 {
        16 / self.size() as u64
    }

    /// The kernel name suffix.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        }
    }
}

/// Two-shot slice bounds: `ranks + 1` element offsets. Every slice but the last is a whole
/// number of vectors, so each rank's vector loads stay aligned; the last takes the rest.
pub fn slices(n: u64, ranks: usize, vec: u64) -> Vec<u64> {
    let vectors = n / vec;
    let per = vectors / ranks as u64;
    let extra = vectors % ranks as u64;
    let mut bounds = Vec::with_capacity(ranks + 1);
    let mut at = 0u64;
    bounds.push(0);
    for r in 0..ranks as u64 {
        at += (per + u64::from(r < extra)) * vec;
        bounds.push(at);
    }
    *bounds.last_mut().expect("ranks >= 1") = n;
    bounds
}

/// The element indices that block `block` of `blocks` (threads `threads` each) handles in
/// `[start, end)`: whole vectors grid-stride, and the scalar tail in block 0. Mirrors the
/// kernel's loops; used to check that every element is covered exactly once.
pub fn block_elements(
    start: u64,
    end: u64,
    vec: u64,
    block: u64,
    blocks: u64,
    threads: u64,
) -> Vec<u64> {
    let mut out = Vec::new();
    let first_vec = start / vec;
    let vectors = (end - start) / vec;
    let mut v = block * threads;
    while v < vectors {
        for t in 0..threads.min(vectors - v) {
            let idx = first_vec + v + t;
            out.extend((idx * vec)..(idx * vec + vec));
        }
        v += blocks * threads;
    }
    if block == 0 {
        out.extend((start + vectors * vec)..end);
    }
    out
}

/// The test value of element `i` of rank `rank` for run `seed`: a float in [-1, 1), as the
/// kernel's `fill` makes it (splitmix64 of the three).
pub fn value(seed: u32, rank: u32, i: u64) -> f32 {
    let mut x = (u64::from(seed) << 40)
        ^ (u64::from(rank) << 32).wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    // 24 random bits scaled into [-1, 1): exact in float32.
    ((x >> 40) as f32) * (1.0 / 8_388_608.0) - 1.0
}

/// float32 to bfloat16 bits, rounding to nearest even, as the kernel does.
pub fn bf16_bits(f: f32) -> u16 {
    let u = f.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 0x40) as u16;
    }
    let rounded = u.wrapping_add(0x7fff + ((u >> 16) & 1));
    (rounded >> 16) as u16
}

/// bfloat16 bits to float32.
pub fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// The expected output element: the ranks' values summed in rank order in float32 (for
/// bf16, the inputs rounded to bf16 first and the sum rounded once at the end).
pub fn reference(dtype: Dtype, seed: u32, ranks: usize, i: u64) -> u32 {
    match dtype {
        Dtype::F32 => {
            let mut acc = value(seed, 0, i);
            for r in 1..ranks as u32 {
                acc += value(seed, r, i);
            }
            acc.to_bits()
        }
        Dtype::Bf16 => {
            let input = |r: u32| bf16_value(bf16_bits(value(seed, r, i)));
            let mut acc = input(0);
            for r in 1..ranks as u32 {
                acc += input(r);
            }
            u32::from(bf16_bits(acc))
        }
    }
}

/// nccl-tests' algorithm bandwidth: bytes of the message over time, GB/s.
pub fn algbw(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// nccl-tests' bus bandwidth of an all-reduce: algbw scaled by 2(n-1)/n, the share of the
/// message every rank must send and receive whatever the algorithm.
pub fn busbw(bytes: u64, seconds: f64, ranks: usize) -> f64 {
    algbw(bytes, seconds) * 2.0 * (ranks as f64 - 1.0) / ranks as f64
}

/// Device memory traffic of the two-shot all-reduce when all ranks share one GPU: each rank
/// reads its slice from every input and writes it, then reads the other slices and writes
/// them, `(3R - 1) * S` bytes in all.
pub fn two_shot_local_bytes(bytes: u64, ranks: usize) -> u64 {
    (3 * ranks as u64 - 1) * bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_every_element_once_and_stay_aligned() {
        for ranks in 1..=MAX_RANKS {
            for n in [
                1u64, 2, 3, 4, 5, 7, 8, 9, 31, 33, 63, 64, 65, 127, 1000, 4099, 65_537,
            ] {
                for vec in [4u64, 8] {
                    let b = slices(n, ranks, vec);
                    assert_eq!(b.len(), ranks + 1);
                    assert_eq!((b[0], b[ranks]), (0, n));
                    for r in 0..ranks {
                        assert!(b[r] <= b[r + 1], "n={n} ranks={ranks}");
                        if r + 1 < ranks {
                            assert_eq!(b[r] % vec, 0, "slice {r} of n={n} starts unaligned");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn blocks_and_tails_cover_each_slice_exactly_once() {
        for ranks in 1..=MAX_RANKS {
            for n in [1u64, 3, 5, 17, 100, 1023, 4097, 40_000] {
                let vec = 4;
                let bounds = slices(n, ranks, vec);
                for blocks in [1u64, 2, 3, 7] {
                    let threads = 32;
                    let mut seen = vec![0u8; n as usize];
                    for r in 0..ranks {
                        for b in 0..blocks {
                            for i in
                                block_elements(bounds[r], bounds[r + 1], vec, b, blocks, threads)
                            {
                                seen[i as usize] += 1;
                            }
                        }
                    }
                    assert!(
                        seen.iter().all(|&c| c == 1),
                        "n={n} ranks={ranks} blocks={blocks}"
                    );
                }
            }
        }
    }

    #[test]
    fn test_values_are_varied_and_in_range() {
        let vals: Vec<f32> = (0..10_000).map(|i| value(7, 3, i)).collect();
        assert!(vals.iter().all(|v| (-1.0..1.0).contains(v)));
        assert!(
            vals.iter().filter(|v| **v == 0.0).count() < 5,
            "never zeros"
        );
        assert_ne!(value(7, 3, 0), value(7, 4, 0));
        assert_ne!(value(7, 3, 0), value(8, 3, 0));
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        assert_eq!(
            bf16_value(bf16_bits(1.0 + 1.0 / 256.0)),
            1.0,
            "a tie rounds to even"
        );
        assert_eq!(bf16_value(bf16_bits(1.0 + 3.0 / 256.0)), 1.0 + 4.0 / 256.0);
        assert!(bf16_value(bf16_bits(f32::NAN)).is_nan());
    }

    #[test]
    fn reference_sums_in_rank_order() {
        let i = 12_345;
        let expect = value(1, 0, i) + value(1, 1, i) + value(1, 2, i);
        assert_eq!(reference(Dtype::F32, 1, 3, i), expect.to_bits());
    }

    #[test]
    fn bus_bandwidth_matches_nccl_tests() {
        // 1 GB in 10 ms on 8 ranks: algbw 100 GB/s, busbw 175 GB/s.
        assert!((algbw(1_000_000_000, 0.01) - 100.0).abs() < 1e-9);
        assert!((busbw(1_000_000_000, 0.01, 8) - 175.0).abs() < 1e-9);
        assert_eq!(busbw(1_000_000_000, 0.01, 1), 0.0);
        assert_eq!(two_shot_local_bytes(100, 4), 1100);
    }
}
