// Cluster radix select for indexer_topk (issue #25 probe, not a product path).
//
// One thread-block cluster of CL = 8 CTAs per row (sm_90). Each CTA loads its eighth of the row
// (SL <= 16384 keys) once from global memory into shared memory as unsigned order keys
// (u = kreg's int32 order key ^ 0x80000000; 0 = no key: past the row's length), so the row is
// read from HBM exactly once and every later pass reads shared memory:
//
//   pass p = 0..3: each CTA counts its keys whose higher bytes equal the prefix found so far,
//   by byte p of u (256 bins, shared-memory atomics); a cluster barrier; every CTA sums the
//   eight CTAs' bins through distributed shared memory and finds the bin holding the kk-th
//   largest key (kk = what is still to be taken). A bin whose count equals kk ends the search.
//
// Membership is then: keys whose prefix is above the threshold bin, plus the first `need` keys
// of the bin by position (the exact k-th key's ties by position, kreg's rule). Each warp counts
// its 1024 consecutive positions with ballots; the CTAs exchange (above, in-bin) counts through
// distributed shared memory; each warp writes its selected positions in ascending order.
// Rows with fewer than k valid keys take all of them and pad with -1.
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

constexpr int CL = 8;          // CTAs a row (a portable cluster)
constexpr int THREADS = 512;   // 16 warps
constexpr int WARPS = THREADS / 32;
constexpr int SL_MAX = 16384;  // keys a CTA (64 KiB of shared memory)
constexpr int NSAMP = 512;     // sampled keys a CTA (filter mode)
constexpr int CAP = 3072;      // candidates a CTA above the sampled threshold (filter mode)

__device__ __forceinline__ uint32_t order_u(uint32_t bits) {
  // kreg's key: -0.0 -> +0.0; negative floats flip their magnitude bits; NaN -> INT32_MIN + 1;
  // u = key ^ 0x80000000, so unsigned order is score order and every real key has u >= 1.
  if (bits == 0x80000000u) bits = 0u;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  const uint32_t key = (bits & 0x80000000u) ? (bits ^ 0x7FFFFFFFu) : bits;
  return nan ? 1u : (key ^ 0x80000000u);
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
               ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// the address of `p` (this CTA's shared memory) in CTA `rank`'s shared memory window
__device__ __forceinline__ uint32_t dsmem_addr(const void* p, uint32_t rank) {
  uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ __forceinline__ uint32_t dsmem_ld(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

template <typename T> struct Loader;
template <> struct Loader<float> {
  static constexpr int PER16 = 4;   // elements in 16 bytes
  __device__ static void load16(const float* p, uint32_t* u) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    u[0] = order_u(v.x); u[1] = order_u(v.y); u[2] = order_u(v.z); u[3] = order_u(v.w);
  }
  __device__ static uint32_t load1(const float* p) { return order_u(__float_as_uint(__ldg(p))); }
};
template <> struct Loader<__nv_bfloat16> {
  static constexpr int PER16 = 8;
  __device__ static void load16(const __nv_bfloat16* p, uint32_t* u) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      u[2 * i] = order_u(w[i] << 16);
      u[2 * i + 1] = order_u(w[i] & 0xFFFF0000u);
    }
  }
  __device__ static uint32_t load1(const __nv_bfloat16* p) {
    const unsigned short s = __ldg(reinterpret_cast<const unsigned short*>(p));
    return order_u(static_cast<uint32_t>(s) << 16);
  }
};

struct Shared {
  uint32_t hist[2][256];
  uint32_t wsum[WARPS];
  uint32_t bin, kk, bin_total, done;
  uint32_t warp_gt[WARPS], warp_eq[WARPS];
  uint32_t warp_out[WARPS], warp_eqb[WARPS];
  uint32_t cta_gt, cta_eq;        // read by the other CTAs
  uint32_t valid;                 // the row's valid keys (pass 0)
  uint32_t row_count;             // keys the row took (the last CTA, for the padding)
  uint32_t samp[NSAMP];           // filter mode: this CTA's sampled keys (read by the others)
  uint32_t ncand, f_gt, f_eq;     // filter mode: candidates (keys > ts) and keys == ts
  uint32_t G, E, over;            // the row's sums of those, and whether a CTA overflowed
  uint16_t cand[CAP];             // slice offsets of the keys > ts
};

// Thread tid < 256 holds the count t of bin tid; finds the bin holding the kk-th largest key
// (sh.bin, sh.kk = its rank inside the bin, sh.bin_total) and the sum of all bins (sh.valid).
__device__ __forceinline__ void select_bin(Shared& sh, uint32_t t, uint32_t kk, int tid,
                                           int lane, int warp) {
  uint32_t incl = 0;
  if (tid < 256) {
    incl = t;   // keys in bins >= tid among this warp's 32 bins (a suffix scan)
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_down_sync(0xFFFFFFFFu, incl, o);
      if (lane + o < 32) incl += y;
    }
    if (lane == 0) sh.wsum[warp] = incl;   // warps 0..7 hold bins 32w..32w+31
  }
  __syncthreads();
  if (tid < 256) {
    uint32_t above = 0;   // keys in the bins of the higher warps
    for (int w2 = warp + 1; w2 < 8; ++w2) above += sh.wsum[w2];
    const uint32_t excl = above + incl - t;   // keys in bins > tid
    if (tid == 0) sh.valid = above + incl;
    if (excl < kk && kk <= excl + t) { sh.bin = tid; sh.kk = kk - excl; sh.bin_total = t; }
  }
  __syncthreads();
}

// AGG: 0 = one shared-memory atomic a counted key; 1 = lanes of a bin add once (match.any);
// 2 = the lanes in lane 0's bin add once (a ballot), the rest one atomic each.
// stop (timing probes only): 1 = return after the load, 2 = after the first pass, 3 = after the
// search (the row's output is then left unwritten).
template <typename T, int AGG>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(THREADS, 3)
cluster_topk_kernel(const T* __restrict__ scores, int64_t row_stride, int n,
                    const int32_t* __restrict__ lengths, int k, int32_t* __restrict__ out,
                    int stop, int filt) {
  extern __shared__ __align__(16) uint32_t keys[];   // SL keys
  __shared__ Shared sh;
  const uint32_t rank = cluster_rank();
  const int row = blockIdx.x / CL;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int SL = ((n + CL - 1) / CL + 1023) / 1024 * 1024;   // a multiple of a warp's 1024
  const int base = static_cast<int>(rank) * SL;
  int len = n;
  if (lengths != nullptr) len = min(max(lengths[row], 0), n);
  const T* src = scores + row * row_stride;

  // load: 16-byte vectors where the whole vector is inside the row's valid keys
  constexpr int P16 = Loader<T>::PER16;
#pragma unroll 4
  for (int i = tid * P16; i < SL; i += THREADS * P16) {
    const int pos = base + i;
    uint32_t u[P16];
    if (pos + P16 <= len && (reinterpret_cast<uintptr_t>(src + pos) & 15) == 0) {
      Loader<T>::load16(src + pos, u);
    } else {
#pragma unroll
      for (int e = 0; e < P16; ++e) u[e] = (pos + e < len) ? Loader<T>::load1(src + pos + e) : 0u;
    }
#pragma unroll
    for (int e = 0; e < P16; e += 4)
      *reinterpret_cast<uint4*>(&keys[i + e]) = make_uint4(u[e], u[e + 1], u[e + 2], u[e + 3]);
  }

  if (stop == 1) { __syncthreads(); if (tid == 0 && keys[SL - 1] == 7u) out[row] = 7; return; }
  uint32_t prefix = 0, mask = 0;
  uint32_t kk = static_cast<uint32_t>(k);
  uint32_t floor_u = 1;      // keys below never taken (1: every valid key may be)
  bool cands = false;        // the search runs over the candidate lists
  bool search = true;
  // Filter mode: a threshold ts from 4096 evenly spaced samples of the row (about 1.25 k
  // keys above it), then each CTA lists its keys > ts and counts those == ts. When the row
  // has at least k keys >= ts and no list overflowed, the search runs over the lists only,
  // or not at all when the k-th key is ts itself; otherwise it runs over every key.
  const int step = SL / NSAMP;
  uint32_t V = 0;   // valid samples of the row
  for (int r = 0; r < CL; ++r) {
    const int b0 = r * SL;
    const int c = len <= b0 ? 0 : min(NSAMP, (len - b0 + step - 1) / step);
    V += static_cast<uint32_t>(c);
  }
  if (filt && len >= 4 * k && V >= 1024) {
    if (tid < NSAMP) sh.samp[tid] = keys[tid * step];
    if (tid == 0) { sh.ncand = 0; sh.f_eq = 0; }
    __syncthreads();
    cluster_sync_all();   // every CTA's samples visible
    uint32_t sv[CL * NSAMP / THREADS];
#pragma unroll
    for (int j = 0; j < CL * NSAMP / THREADS; ++j) {
      const int idx = tid + j * THREADS;
      sv[j] = dsmem_ld(dsmem_addr(&sh.samp[idx % NSAMP], idx / NSAMP));
    }
    const uint32_t rs = static_cast<uint32_t>(
        (5ull * static_cast<uint64_t>(k) * V) / (4ull * static_cast<uint64_t>(len))) + 8u;
    uint32_t sp = 0, sm = 0, skk = min(rs, V);
    for (int p = 0; p < 4; ++p) {
      const int shift = 24 - 8 * p;
      uint32_t* h = sh.hist[p & 1];
      if (tid < 256) h[tid] = 0;
      __syncthreads();
#pragma unroll
      for (int j = 0; j < CL * NSAMP / THREADS; ++j)
        if (sv[j] != 0u && (sv[j] & sm) == sp) atomicAdd(&h[(sv[j] >> shift) & 0xFFu], 1u);
      __syncthreads();
      select_bin(sh, tid < 256 ? h[tid] : 0u, skk, tid, lane, warp);
      sp |= sh.bin << shift;
      sm |= 0xFFu << shift;
      skk = sh.kk;
    }
    const uint32_t ts = sp;   // the rs-th largest sample
    uint32_t ceq = 0;
    const uint32_t lt_mask = (1u << lane) - 1u;
    for (int i = tid; i < SL; i += THREADS) {
      const uint32_t u = keys[i];
      const bool gt = u > ts;
      ceq += (u == ts) ? 1u : 0u;
      const uint32_t m = __ballot_sync(0xFFFFFFFFu, gt);
      if (m) {
        uint32_t b0 = 0;
        if (lane == 0) b0 = atomicAdd(&sh.ncand, __popc(m));
        b0 = __shfl_sync(0xFFFFFFFFu, b0, 0);
        const uint32_t pos = b0 + __popc(m & lt_mask);
        if (gt && pos < CAP) sh.cand[pos] = static_cast<uint16_t>(i);
      }
    }
    ceq = __reduce_add_sync(0xFFFFFFFFu, ceq);
    if (lane == 0 && ceq) atomicAdd(&sh.f_eq, ceq);
    __syncthreads();
    if (tid == 0) sh.f_gt = sh.ncand;
    __syncthreads();
    cluster_sync_all();   // every CTA's counts visible
    if (tid == 0) {
      uint32_t G = 0, E = 0, over = 0;
      for (int r = 0; r < CL; ++r) {
        const uint32_t g = dsmem_ld(dsmem_addr(&sh.f_gt, r));
        G += g; E += dsmem_ld(dsmem_addr(&sh.f_eq, r)); over |= g > CAP ? 1u : 0u;
      }
      sh.G = G; sh.E = E; sh.over = over;
    }
    __syncthreads();
    const uint32_t G = sh.G, E = sh.E;
    if (!sh.over && G + E >= kk) {
      if (G < kk) {   // the k-th key is ts: no search
        prefix = ts; mask = 0xFFFFFFFFu; kk -= G; floor_u = ts; search = false;
      } else {
        cands = true; floor_u = ts + 1;
      }
    }
  }
  for (int p = 0; search && p < 4; ++p) {
    const int shift = 24 - 8 * p;
    uint32_t* h = sh.hist[p & 1];
    if (tid < 256) h[tid] = 0;
    __syncthreads();   // also: the keys' stores (p = 0) before the reads below
    if (cands) {
      const int nc = static_cast<int>(sh.ncand);
      for (int i = tid; i < nc; i += THREADS) {
        const uint32_t u = keys[sh.cand[i]];
        if ((u & mask) == prefix) atomicAdd(&h[(u >> shift) & 0xFFu], 1u);
      }
    } else {
      const uint4* k4 = reinterpret_cast<const uint4*>(keys);
      for (int i = tid; i < SL / 4; i += THREADS) {
        const uint4 v = k4[i];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool in = (w[e] & mask) == prefix && w[e] != 0u;
          const uint32_t b = (w[e] >> shift) & 0xFFu;
          if (AGG == 2) {
            const uint32_t b0 = __shfl_sync(0xFFFFFFFFu, b, 0);
            const uint32_t m0 = __ballot_sync(0xFFFFFFFFu, in && b == b0);
            if (lane == 0 && m0) atomicAdd(&h[b0], __popc(m0));
            if (in && b != b0) atomicAdd(&h[b], 1u);
          } else if (AGG == 1) {
            const uint32_t act = __ballot_sync(0xFFFFFFFFu, in);
            if (in) {
              const uint32_t peers = __match_any_sync(act, b);
              if ((__ffs(peers) - 1) == lane) atomicAdd(&h[b], __popc(peers));
            }
          } else if (in) {
            atomicAdd(&h[b], 1u);
          }
        }
      }
    }
    __syncthreads();
    if (stop == 2) { if (tid < 256 && h[tid] == 12345u) out[row] = 7; return; }
    cluster_sync_all();   // every CTA's bins complete and visible
    uint32_t t = 0;
    if (tid < 256) {
#pragma unroll
      for (int r = 0; r < CL; ++r) t += dsmem_ld(dsmem_addr(&h[tid], r));
    }
    select_bin(sh, t, kk, tid, lane, warp);
    if (p == 0 && sh.valid <= kk) {   // no more valid keys than k: take them all
      kk = sh.valid; mask = 0; prefix = 0;
      break;
    }
    // (this pass's bins are read by the other CTAs until they reach the next pass's cluster
    // barrier; the next pass counts into the other buffer, and the one after zeroes this one
    // only after that barrier)
    prefix |= sh.bin << shift;
    mask |= 0xFFu << shift;
    kk = sh.kk;
    if (sh.bin_total == kk) break;   // the whole bin is taken: no tie to resolve
  }
  if (stop == 3) { cluster_sync_all(); return; }
  // Selection: prefix above -> in; prefix equal -> the first kk by position.
  // (u & mask) > prefix, and u != 0 (mask 0: every valid key is in the bin)
  uint32_t gt = 0, eq = 0;
  const int wbase = warp * (SL / WARPS);
  const int per_warp = SL / WARPS;
  for (int j = lane; j < per_warp; j += 32) {
    const uint32_t u = keys[wbase + j];
    const uint32_t m = u & mask;
    gt += __popc(__ballot_sync(0xFFFFFFFFu, u >= floor_u && m > prefix));
    eq += __popc(__ballot_sync(0xFFFFFFFFu, u >= floor_u && m == prefix));
  }
  if (lane == 0) { sh.warp_gt[warp] = gt; sh.warp_eq[warp] = eq; }
  __syncthreads();
  if (tid == 0) {
    uint32_t g = 0, e = 0;
    for (int w2 = 0; w2 < WARPS; ++w2) { g += sh.warp_gt[w2]; e += sh.warp_eq[w2]; }
    sh.cta_gt = g; sh.cta_eq = e;
  }
  __syncthreads();
  cluster_sync_all();
  if (tid == 0) {
    uint32_t outb = 0, eqb = 0;
    for (uint32_t r = 0; r < rank; ++r) {
      const uint32_t g = dsmem_ld(dsmem_addr(&sh.cta_gt, r));
      const uint32_t e = dsmem_ld(dsmem_addr(&sh.cta_eq, r));
      const uint32_t take = eqb >= kk ? 0u : min(e, kk - eqb);
      outb += g + take; eqb += e;
    }
    for (int w2 = 0; w2 < WARPS; ++w2) {
      sh.warp_out[w2] = outb; sh.warp_eqb[w2] = eqb;
      const uint32_t e = sh.warp_eq[w2];
      const uint32_t take = eqb >= kk ? 0u : min(e, kk - eqb);
      outb += sh.warp_gt[w2] + take; eqb += e;
    }
  }
  cluster_arrive();   // done reading the other CTAs' shared memory
  __syncthreads();
  int32_t* orow = out + static_cast<int64_t>(row) * k;
  uint32_t o = sh.warp_out[warp], eb = sh.warp_eqb[warp];
  const uint32_t lt = (1u << lane) - 1u;
  for (int j = 0; j < per_warp; j += 32) {
    const uint32_t u = keys[wbase + j + lane];
    const uint32_t m = u & mask;
    const bool g = u >= floor_u && m > prefix;
    const bool e = u >= floor_u && m == prefix;
    const uint32_t eb_m = __ballot_sync(0xFFFFFFFFu, e);
    const bool take = g || (e && eb + __popc(eb_m & lt) < kk);
    const uint32_t tb = __ballot_sync(0xFFFFFFFFu, take);
    if (take) orow[o + __popc(tb & lt)] = base + wbase + j + lane;
    o += __popc(tb); eb += __popc(eb_m);
  }
  // pad: the row took min(k, valid) keys
  if (rank == CL - 1) {
    // the last CTA knows the total: its last warp's o is the row's count
    __syncthreads();
    if (warp == WARPS - 1 && lane == 0) sh.row_count = o;
    __syncthreads();
    for (int i = static_cast<int>(sh.row_count) + tid; i < k; i += THREADS) orow[i] = -1;
  }
  cluster_wait();
}

template <typename T, int AGG>
int launch(const void* scores, int64_t row_stride, int rows, int n, const int32_t* lengths,
           int k, int32_t* out, int stop, int filt, cudaStream_t stream) {
  const int SL = ((n + CL - 1) / CL + 1023) / 1024 * 1024;
  if (SL > SL_MAX) return 1;
  const size_t smem = static_cast<size_t>(SL) * 4;
  auto kern = cluster_topk_kernel<T, AGG>;
  static bool set = false;
  if (!set) {
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             SL_MAX * 4) != cudaSuccess) return 2;
    set = true;
  }
  if (rows == 0) return 0;
  kern<<<rows * CL, THREADS, smem, stream>>>(static_cast<const T*>(scores), row_stride, n,
                                             lengths, k, out, stop, filt);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

}  // namespace

extern "C" int cluster_topk(const void* scores, int dtype, int agg, int64_t row_stride, int rows,
                            int n, const int32_t* lengths, int k, int32_t* out, int stop,
                            int filt, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
#define KREG_CL_LAUNCH(T, A) launch<T, A>(scores, row_stride, rows, n, lengths, k, out, stop, filt, s)
  if (dtype == 0) {
    if (agg == 1) return KREG_CL_LAUNCH(float, 1);
    if (agg == 2) return KREG_CL_LAUNCH(float, 2);
    return KREG_CL_LAUNCH(float, 0);
  }
  if (agg == 1) return KREG_CL_LAUNCH(__nv_bfloat16, 1);
  if (agg == 2) return KREG_CL_LAUNCH(__nv_bfloat16, 2);
  return KREG_CL_LAUNCH(__nv_bfloat16, 0);
#undef KREG_CL_LAUNCH
}
