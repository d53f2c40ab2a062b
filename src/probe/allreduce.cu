// gpubake's bundled all-reduce, compiled at run time with NVRTC for the GPU at hand.
//
// One process drives every rank. Rank r owns an input and an output buffer on its GPU; other
// ranks reach them through peer pointers (or plain pointers when ranks share one GPU). A
// launch covers the ranks placed on one GPU: rank = rank_base + blockIdx.y.
//
// one-shot: every rank reads all inputs for the whole message and writes the sum.
// two-shot: reduce-scatter (rank r sums slice r from every input into its output), a barrier
//           on per-block flags (release/acquire at system scope), then all-gather (rank r
//           copies slice j from rank j's output). Block b of every rank handles the same
//           elements of a slice, so block b only waits for block b of the other ranks.
//
// Sums run in rank order in float32, so float32 results are bitwise those of a CPU adding
// the ranks' values in order; bf16 inputs are summed in float32 and rounded once.

#define MAX_RANKS 8

struct Args {
    const void* in[MAX_RANKS];
    void* out[MAX_RANKS];
    unsigned int* flags[MAX_RANKS];
    unsigned long long bounds[MAX_RANKS + 1];
    unsigned long long n;
    unsigned int nranks;
    unsigned int rank_base;
    unsigned int epoch;
};

__device__ __forceinline__ void store_release(unsigned int* p, unsigned int v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ float bf16_to_float(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}

__device__ __forceinline__ unsigned short float_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// Element access per type: whole 16-byte vectors, and single elements for the tail.
struct F32 {
    static const int VEC = 4;
    __device__ static void load(const void* p, unsigned long long v, float* x) {
        uint4 w = ((const uint4*)p)[v];
        x[0] = __uint_as_float(w.x); x[1] = __uint_as_float(w.y);
        x[2] = __uint_as_float(w.z); x[3] = __uint_as_float(w.w);
    }
    __device__ static void store(void* p, unsigned long long v, const float* x) {
        uint4 w;
        w.x = __float_as_uint(x[0]); w.y = __float_as_uint(x[1]);
        w.z = __float_as_uint(x[2]); w.w = __float_as_uint(x[3]);
        ((uint4*)p)[v] = w;
    }
    __device__ static float get(const void* p, unsigned long long i) { return ((const float*)p)[i]; }
    __device__ static void put(void* p, unsigned long long i, float x) { ((float*)p)[i] = x; }
};

struct BF16 {
    static const int VEC = 8;
    __device__ static void load(const void* p, unsigned long long v, float* x) {
        uint4 w = ((const uint4*)p)[v];
        unsigned int u[4] = {w.x, w.y, w.z, w.w};
        for (int k = 0; k < 4; k++) {
            x[2 * k] = bf16_to_float((unsigned short)(u[k] & 0xffffu));
            x[2 * k + 1] = bf16_to_float((unsigned short)(u[k] >> 16));
        }
    }
    __device__ static void store(void* p, unsigned long long v, const float* x) {
        unsigned int u[4];
        for (int k = 0; k < 4; k++)
            u[k] = (unsigned int)float_to_bf16(x[2 * k]) | ((unsigned int)float_to_bf16(x[2 * k + 1]) << 16);
        ((uint4*)p)[v] = make_uint4(u[0], u[1], u[2], u[3]);
    }
    __device__ static float get(const void* p, unsigned long long i) {
        return bf16_to_float(((const unsigned short*)p)[i]);
    }
    __device__ static void put(void* p, unsigned long long i, float x) {
        ((unsigned short*)p)[i] = float_to_bf16(x);
    }
};

// Sums elements [start, end) of every input into `dst`: vectors grid-stride, tail in block 0.
template <typename T>
__device__ void reduce_range(const Args& a, void* dst, unsigned long long start, unsigned long long end) {
    const unsigned long long first = start / T::VEC;
    const unsigned long long vectors = (end - start) / T::VEC;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long v = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; v < vectors; v += stride) {
        float acc[T::VEC], x[T::VEC];
        T::load(a.in[0], first + v, acc);
        for (unsigned int r = 1; r < a.nranks; r++) {
            T::load(a.in[r], first + v, x);
            for (int k = 0; k < T::VEC; k++) acc[k] = __fadd_rn(acc[k], x[k]);
        }
        T::store(dst, first + v, acc);
    }
    if (blockIdx.x == 0) {
        for (unsigned long long i = start + vectors * T::VEC + threadIdx.x; i < end; i += blockDim.x) {
            float acc = T::get(a.in[0], i);
            for (unsigned int r = 1; r < a.nranks; r++) acc = __fadd_rn(acc, T::get(a.in[r], i));
            T::put(dst, i, acc);
        }
    }
}

// Copies elements [start, end) from `src` to `dst` with the same block mapping.
template <typename T>
__device__ void copy_range(const void* src, void* dst, unsigned long long start, unsigned long long end) {
    const unsigned long long first = start / T::VEC;
    const unsigned long long vectors = (end - start) / T::VEC;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long v = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; v < vectors; v += stride)
        ((uint4*)dst)[first + v] = ((const uint4*)src)[first + v];
    if (blockIdx.x == 0) {
        for (unsigned long long i = start + vectors * T::VEC + threadIdx.x; i < end; i += blockDim.x)
            T::put(dst, i, T::get(src, i));
    }
}

template <typename T>
__device__ void oneshot(const Args& a) {
    const unsigned int r = a.rank_base + blockIdx.y;
    reduce_range<T>(a, a.out[r], 0, a.n);
}

template <typename T>
__device__ void twoshot(const Args& a) {
    const unsigned int r = a.rank_base + blockIdx.y;
    reduce_range<T>(a, a.out[r], a.bounds[r], a.bounds[r + 1]);
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        store_release(&a.flags[r][blockIdx.x], a.epoch);
    }
    for (unsigned int k = 1; k < a.nranks; k++) {
        const unsigned int j = (r + k) % a.nranks;
        if (threadIdx.x == 0) {
            while (load_acquire(&a.flags[j][blockIdx.x]) < a.epoch) {
            }
        }
        __syncthreads();
        copy_range<T>(a.out[j], a.out[r], a.bounds[j], a.bounds[j + 1]);
    }
}

extern "C" __global__ void allreduce_oneshot_f32(Args a) { oneshot<F32>(a); }
extern "C" __global__ void allreduce_oneshot_bf16(Args a) { oneshot<BF16>(a); }
extern "C" __global__ void allreduce_twoshot_f32(Args a) { twoshot<F32>(a); }
extern "C" __global__ void allreduce_twoshot_bf16(Args a) { twoshot<BF16>(a); }

// The test data: element i of rank `rank` is a float in [-1, 1) from splitmix64, the same
// function the CPU uses to build the reference (src/probe/schedule.rs, `value`).
__device__ __forceinline__ float test_value(unsigned int seed, unsigned int rank, unsigned long long i) {
    unsigned long long x = ((unsigned long long)seed << 40) ^ (((unsigned long long)rank << 32) + i * 0x9e3779b97f4a7c15ull);
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return __fadd_rn(__fmul_rn((float)(x >> 40), 1.0f / 8388608.0f), -1.0f);
}

extern "C" __global__ void fill_f32(float* p, unsigned long long n, unsigned int seed, unsigned int rank) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = test_value(seed, rank, i);
}

extern "C" __global__ void fill_bf16(unsigned short* p, unsigned long long n, unsigned int seed, unsigned int rank) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = float_to_bf16(test_value(seed, rank, i));
}
