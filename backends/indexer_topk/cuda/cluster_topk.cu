// Cluster radix select for indexer_topk on sm_90 (kreg's `nvidia_hopper.indexer_topk_cluster`).
//
// One thread-block cluster of CL = 8 CTAs a row. Each CTA loads its eighth of the row (SL <= 16384
// keys) once from global memory into shared memory as unsigned order keys (u = kreg's int32 order
// key ^ 0x80000000, so unsigned order is score order; 0 = no key: past the row's length). The row
// is read from HBM once; every later pass reads shared memory:
//
//   pass p = 0..3: each CTA counts its keys whose higher bytes equal the prefix found so far, by
//   byte p of u (256 bins, shared-memory atomics; a CTA whose valid keys agree down to this byte
//   writes its one bin without atomics); a cluster barrier; every CTA sums the eight CTAs' bins
//   through distributed shared memory and finds the bin holding the kk-th largest key (kk = what
//   is still to be taken). A bin whose count equals kk ends the search; so does a row of at most
//   k keys. Pass 1 also lists, in position order, the CTA's keys at or above pass 0's bin when
//   they fit (the candidate list: 4,096 slots for 4-byte keys, 1,024 for 2-byte); the later
//   passes and the selection read the list instead of every key.
//
// Membership is then: keys whose prefix is above the threshold bin, plus the first kk keys of the
// bin by position (ties at the k-th key by position, kreg's rule). Each CTA knows its (above,
// in-bin) counts from its own bins; one cluster exchange gives the counts of the CTAs before it;
// then one sweep of the list (or of every key) in steps of 2,048, each thread's output offset
// from a block scan of the step's counts, writes the selected positions in ascending order. A CTA
// stops once its keys above the bin are written and its in-bin keys passed. A row with fewer than
// k valid keys takes all of them; the last CTA pads the rest with -1.
//
// Keys: fp32 rows keep 4-byte keys (4 passes, 512 threads, three CTAs an SM). bf16 and fp16 rows
// keep 2-byte keys (u16 = the same order key over the 16-bit pattern; 2 passes, 256 threads and
// 32 KiB of keys a CTA, so six CTAs an SM): 64 rows of 131,072 bf16 keys run as one wave.
//
// Host entry: `kreg_cluster_topk` (extern "C"; backends/indexer_topk/cluster.py loads it with ctypes
// and turns a nonzero return into an error naming the cause). History, measurements and rejected
// variants: docs/notes/indexer_topk.md (sessions 32-35).
#include <cstdint>
#include <type_traits>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "topk_keys.cuh"

namespace {

using kreg_topk::above_bit;
using kreg_topk::equal_bit;
using kreg_topk::Keys;

constexpr int CL = 8;          // CTAs a row (a portable cluster size)
constexpr int SL_MAX = 16384;  // keys a CTA (64 / 32 KiB of shared memory): rows of <= 131072 keys

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

template <int WARPS>
struct Shared {
  uint32_t hist[2][256];          // a pass's bins (read by the other CTAs), double-buffered
  uint32_t wsum[8], lsum[8];      // select_bin: the row's and this CTA's counts of 32 bins
  uint32_t wmin[WARPS], wmax[WARPS];
  uint32_t bin, kk, bin_total, valid, lexcl, lbin;
  uint32_t scan[2][WARPS];        // block_scan's warp totals, alternating between chunks
  uint32_t cta_gt, cta_eq;        // read by the other CTAs
  uint32_t gbase, ebase;          // the same counts summed over the CTAs before this one
};

// Thread tid < 256 holds the row's count t and this CTA's count l of bin tid: finds the bin
// holding the kk-th largest key (sh.bin, sh.kk = its rank inside the bin, sh.bin_total), the
// sum of all bins (sh.valid), and this CTA's keys in the bins above it (sh.lexcl) and in it
// (sh.lbin).
template <typename S>
__device__ __forceinline__ void select_bin(S& sh, uint32_t t, uint32_t l, uint32_t kk, int tid,
                                           int lane, int warp) {
  uint32_t incl = 0, lincl = 0;
  if (tid < 256) {
    incl = t;   // keys in bins >= tid among this warp's 32 bins (a suffix scan)
    lincl = l;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_down_sync(0xFFFFFFFFu, incl, o);
      const uint32_t z = __shfl_down_sync(0xFFFFFFFFu, lincl, o);
      if (lane + o < 32) { incl += y; lincl += z; }
    }
    if (lane == 0) { sh.wsum[warp] = incl; sh.lsum[warp] = lincl; }   // warps 0..7: 32 bins each
  }
  __syncthreads();
  if (tid < 256) {
    uint32_t above = 0, labove = 0;   // keys in the bins of the higher warps
    for (int w2 = warp + 1; w2 < 8; ++w2) { above += sh.wsum[w2]; labove += sh.lsum[w2]; }
    const uint32_t excl = above + incl - t;   // keys in bins > tid
    if (tid == 0) sh.valid = above + incl;
    if (excl < kk && kk <= excl + t) {
      sh.bin = tid; sh.kk = kk - excl; sh.bin_total = t;
      sh.lexcl = labove + lincl - l; sh.lbin = l;
    }
  }
  __syncthreads();
}

// Exclusive scan of v over the CTA's threads in thread order; `total` gets the sum. One
// __syncthreads: consecutive calls must alternate `buf` (the other of sh.scan's two rows).
template <int WARPS>
__device__ __forceinline__ uint32_t block_scan(uint32_t v, uint32_t* buf, int lane, int warp,
                                               uint32_t& total) {
  uint32_t incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xFFFFFFFFu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) buf[warp] = incl;
  __syncthreads();
  const uint32_t x = lane < WARPS ? buf[lane] : 0u;
  total = __reduce_add_sync(0xFFFFFFFFu, x);
  return __reduce_add_sync(0xFFFFFFFFu, lane < warp ? x : 0u) + incl - v;
}

// Threads a CTA, CTAs an SM and candidate-list entries: 4-byte keys 512 x 3 (75 KiB a CTA),
// 2-byte keys 256 x 6 (37 KiB).
template <int KB> struct Geometry;
template <> struct Geometry<4> { static constexpr int THREADS = 512, MIN_BLOCKS = 3, CAP = 4096; };
template <> struct Geometry<2> { static constexpr int THREADS = 256, MIN_BLOCKS = 6, CAP = 1024; };

template <typename T>
__global__ void __cluster_dims__(CL, 1, 1)
__launch_bounds__(Geometry<Keys<T>::KB>::THREADS, Geometry<Keys<T>::KB>::MIN_BLOCKS)
cluster_topk_kernel(const T* __restrict__ scores, int64_t row_stride, int n,
                    const int32_t* __restrict__ lengths, int64_t len_stride, int k,
                    int32_t* __restrict__ out) {
  using KT = Keys<T>;
  constexpr int KB = KT::KB, NV = KT::NV;
  constexpr int THREADS = Geometry<KB>::THREADS, WARPS = THREADS / 32, CAP = Geometry<KB>::CAP;
  constexpr int CHUNK = THREADS * NV;   // keys a sweep step (2048)
  using Key = typename std::conditional<KB == 4, uint32_t, uint16_t>::type;
  extern __shared__ __align__(16) uint32_t words[];   // SL keys in position order, then CAP slots
  Key* keys = reinterpret_cast<Key*>(words);
  __shared__ Shared<WARPS> sh;
  const uint32_t rank = cluster_rank();
  const int64_t row = blockIdx.x / CL;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int SL = ((n + CL - 1) / CL + 1023) / 1024 * 1024;   // a multiple of 16 warps x 64
  const int base = static_cast<int>(rank) * SL;
  uint16_t* cand = reinterpret_cast<uint16_t*>(reinterpret_cast<char*>(words) + SL * KB);
  int len = n;
  if (lengths != nullptr) len = min(max(lengths[row * len_stride], 0), n);
  const T* src = scores + row * row_stride;

  // load: 16-byte vectors where a whole vector is valid and aligned, else element by element
  uint32_t umin = 0xFFFFFFFFu, umax = 0u;   // over this thread's valid keys
#pragma unroll (KB == 4 ? 4 : 2)
  for (int i = tid * NV; i < SL; i += THREADS * NV) {
    const int pos = base + i;
    uint32_t u[NV];
    if (pos + NV <= len && (reinterpret_cast<uintptr_t>(src + pos) & 15) == 0) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(src + pos));
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (KB == 4) {
          u[e] = KT::key(w[e]);
        } else {
          u[2 * e] = KT::key(w[e] & 0xFFFFu);
          u[2 * e + 1] = KT::key(w[e] >> 16);
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < NV; ++e) u[e] = (pos + e < len) ? KT::key(KT::bits1(src + pos + e)) : 0u;
    }
#pragma unroll
    for (int e = 0; e < NV; ++e) {
      umax = max(umax, u[e]);
      umin = min(umin, u[e] == 0u ? 0xFFFFFFFFu : u[e]);
    }
    if constexpr (KB == 4) {
      *reinterpret_cast<uint4*>(&keys[i]) = make_uint4(u[0], u[1], u[2], u[3]);
    } else {   // two 16-bit keys a word, the lower position in the lower half
      *reinterpret_cast<uint4*>(&keys[i]) = make_uint4(u[0] | (u[1] << 16), u[2] | (u[3] << 16),
                                                       u[4] | (u[5] << 16), u[6] | (u[7] << 16));
    }
  }
  umin = __reduce_min_sync(0xFFFFFFFFu, umin);
  umax = __reduce_max_sync(0xFFFFFFFFu, umax);
  if (lane == 0) { sh.wmin[warp] = umin; sh.wmax[warp] = umax; }
  const uint32_t cta_valid = static_cast<uint32_t>(min(max(len - base, 0), SL));
  const uint4* k4 = reinterpret_cast<const uint4*>(words);
  // key e (of NV) of a 16-byte vector of keys
  auto key_of = [](const uint32_t (&w4)[4], int e) -> uint32_t {
    return (KB == 4) ? w4[e] : ((w4[e / 2] >> (16 * (e & 1))) & 0xFFFFu);
  };

  uint32_t prefix = 0, mask = 0;
  uint32_t kk = static_cast<uint32_t>(k);
  uint32_t cmin = 0, cmax = 0, row_valid = 0;
  uint32_t cta_gt = 0, cta_eq = 0;   // this CTA's keys above the prefix (in), and equal to it
  // >= 0: cand[0, ncand) lists this CTA's keys at or above pass 0's prefix, in position order
  int ncand = cta_valid == 0u ? 0 : -1;
  int step = 0;     // block_scan calls so far (they alternate sh.scan's rows)
  for (int p = 0; p < KB; ++p) {
    const int shift = 8 * (KB - 1 - p);
    uint32_t* h = sh.hist[p & 1];
    if (tid < 256) h[tid] = 0;   // (THREADS >= 256)
    __syncthreads();   // (p = 0: also the keys and the warps' minima and maxima)
    if (p == 0) {
      cmin = 0xFFFFFFFFu; cmax = 0u;
      for (int w2 = 0; w2 < WARPS; ++w2) { cmin = min(cmin, sh.wmin[w2]); cmax = max(cmax, sh.wmax[w2]); }
    }
    if (cmax == 0u) {
      // no valid key in this CTA
    } else if (((cmin ^ cmax) >> shift) == 0u) {
      // the CTA's valid keys agree on bits above `shift` (so does every key between its least
      // and greatest): one bin holds them all, or none matches the prefix; no atomics
      if (tid == 0 && (cmin & mask) == prefix) h[(cmin >> shift) & 0xFFu] = cta_valid;
    } else if (ncand >= 0) {   // passes after the list was made: its keys only
      for (int i = tid; i < ncand; i += THREADS) {
        const uint32_t w = keys[cand[i]];
        if ((w & mask) == prefix) atomicAdd(&h[(w >> shift) & 0xFFu], 1u);
      }
    } else if (p == 1 && cta_gt + cta_eq <= static_cast<uint32_t>(CAP)) {
      // the second pass over every key also lists, in position order, the keys at or above
      // pass 0's prefix (cta_gt + cta_eq of them, known from the first pass's bins): the later
      // passes and the selection read the list instead of every key
      uint32_t listed = 0;
      for (int c0 = 0; c0 < SL; c0 += CHUNK) {
        const int i = c0 / NV + tid;
        uint32_t flags = 0;
        if (i < SL / NV) {
          const uint4 v = k4[i];
          const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int e = 0; e < NV; ++e) {
            const uint32_t w = key_of(w4, e);
            const uint32_t m = w & mask;
            if (w != 0u && m >= prefix) {
              flags |= 1u << e;
              if (m == prefix) atomicAdd(&h[(w >> shift) & 0xFFu], 1u);
            }
          }
        }
        uint32_t total;
        uint32_t o = listed + block_scan<WARPS>(__popc(flags), sh.scan[step++ & 1], lane, warp,
                                                total);
        while (flags) {
          const int e = __ffs(flags) - 1;
          flags &= flags - 1u;
          cand[o++] = static_cast<uint16_t>(i * NV + e);
        }
        listed += total;
      }
      ncand = static_cast<int>(listed);
    } else {
      for (int i = tid; i < SL / NV; i += THREADS) {
        const uint4 v = k4[i];
        const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < NV; ++e) {
          const uint32_t w = key_of(w4, e);
          if ((w & mask) == prefix && w != 0u) atomicAdd(&h[(w >> shift) & 0xFFu], 1u);
        }
      }
    }
    __syncthreads();
    cluster_sync_all();   // every CTA's bins complete and visible
    uint32_t t = 0, l = 0;
    if (tid < 256) {
      uint32_t x[CL];
#pragma unroll
      for (int r = 0; r < CL; ++r) x[r] = dsmem_ld(dsmem_addr(&h[tid], r));
#pragma unroll
      for (int r = 0; r < CL; ++r) t += x[r];
      l = h[tid];
    }
    select_bin(sh, t, l, kk, tid, lane, warp);
    if (p == 0) row_valid = sh.valid;
    if (p == 0 && sh.valid <= kk) {   // no more valid keys than k: take them all
      kk = sh.valid; mask = 0; prefix = 0;
      cta_gt = 0; cta_eq = cta_valid;
      break;
    }
    // This pass's bins are read by the other CTAs until they reach the next pass's cluster
    // barrier; the next pass counts into the other buffer, and the pass after zeroes this one
    // only after that barrier.
    prefix |= sh.bin << shift;
    mask |= 0xFFu << shift;
    kk = sh.kk;
    cta_gt += sh.lexcl;
    cta_eq = sh.lbin;
    if (sh.bin_total == kk) break;   // the whole bin is taken: no tie to resolve
  }

  // Selection: a key whose prefix is above the bin's is in; a key of the bin is in while fewer
  // than kk keys of the bin come before it in the row. Row-order counts of the CTAs before this
  // one through distributed shared memory, then one step of `CHUNK` keys (or list slots) at a
  // time, each thread's offset from a block scan of (above, in-bin) counts.
  if (tid == 0) { sh.cta_gt = cta_gt; sh.cta_eq = cta_eq; }
  cluster_sync_all();   // every CTA's counts visible
  if (warp == 0) {
    uint32_t g = 0, e = 0;
    if (lane < static_cast<int>(rank)) {
      g = dsmem_ld(dsmem_addr(&sh.cta_gt, lane));
      e = dsmem_ld(dsmem_addr(&sh.cta_eq, lane));
    }
    g = __reduce_add_sync(0xFFFFFFFFu, g);
    e = __reduce_add_sync(0xFFFFFFFFu, e);
    if (lane == 0) { sh.gbase = g; sh.ebase = e; }
  }
  cluster_arrive();   // done reading the other CTAs' shared memory (waited for at the end)
  __syncthreads();
  int32_t* orow = out + row * k;
  uint32_t gb = sh.gbase, eb = sh.ebase;   // row-order counts before the current step
  const int items = ncand >= 0 ? ncand : SL;
  // the CTA stops once it has written its keys above the bin and passed its in-bin keys or the
  // row's kk-th one (a CTA of only untaken ties writes nothing and sweeps nothing)
  const uint32_t g_end = gb + cta_gt, e_end = min(eb + cta_eq, kk);
  for (int c0 = 0; c0 < items && (gb < g_end || eb < e_end); c0 += CHUNK) {
    uint32_t u[NV];
    int lp[NV];   // local positions
    const int i = c0 / NV + tid;
    if (ncand >= 0) {
#pragma unroll
      for (int e = 0; e < NV; ++e) {
        const int j = i * NV + e;
        lp[e] = j < ncand ? cand[j] : 0;
        u[e] = j < ncand ? static_cast<uint32_t>(keys[lp[e]]) : 0u;
      }
    } else {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (i < SL / NV) v = k4[i];
      const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < NV; ++e) { lp[e] = i * NV + e; u[e] = key_of(w4, e); }
    }
    uint32_t gm = 0, em = 0;
#pragma unroll
    for (int e = 0; e < NV; ++e) {
      const uint32_t m = u[e] & mask;   // (u = 0, no key: m = 0 is never above the prefix)
      gm |= above_bit(m, prefix) << e;
      em |= (equal_bit(m, prefix) & above_bit(u[e], 0u)) << e;
    }
    uint32_t total;   // (above << 16 | in-bin): at most CHUNK each
    const uint32_t before = block_scan<WARPS>((__popc(gm) << 16) | __popc(em),
                                              sh.scan[step++ & 1], lane, warp, total);
    uint32_t e_at = eb + (before & 0xFFFFu);
    uint32_t o = gb + (before >> 16) + min(e_at, kk);
#pragma unroll
    for (int e = 0; e < NV; ++e) {
      if ((gm >> e) & 1u) {
        orow[o++] = base + lp[e];
      } else if ((em >> e) & 1u) {
        if (e_at < kk) orow[o++] = base + lp[e];
        ++e_at;
      }
    }
    gb += total >> 16;
    eb += total & 0xFFFFu;
  }
  if (rank == CL - 1) {   // the row took min(valid keys, k) entries: pad the rest with -1
    for (int i = static_cast<int>(min(row_valid, static_cast<uint32_t>(k))) + tid; i < k;
         i += THREADS) orow[i] = -1;
  }
  cluster_wait();   // no CTA exits while another may still read its shared memory
}

template <typename T>
int launch(const void* scores, int64_t row_stride, int rows, int n, const int32_t* lengths,
           int64_t len_stride, int k, int32_t* out, cudaStream_t stream) {
  constexpr int KB = Keys<T>::KB;
  const int SL = ((n + CL - 1) / CL + 1023) / 1024 * 1024;
  if (SL > SL_MAX) return 1;
  auto kern = cluster_topk_kernel<T>;
  // the dynamic shared-memory limit is raised once per device (a device's first call)
  static bool ready[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 2;
  constexpr int LIST = Geometry<KB>::CAP * 2;   // the candidate list's bytes
  if (!ready[dev]) {
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             SL_MAX * KB + LIST) != cudaSuccess) return 2;
    ready[dev] = true;
  }
  if (rows <= 0) return 0;
  kern<<<rows * CL, Geometry<KB>::THREADS, static_cast<size_t>(SL) * KB + LIST, stream>>>(
      static_cast<const T*>(scores), row_stride, n, lengths, len_stride, k, out);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

}  // namespace

// dtype: 0 float32, 1 bfloat16, 2 float16. Returns 0, or 1 (rows longer than 131072 keys),
// 2 (no current device, or its shared-memory limit could not be raised), 3 (the launch failed:
// not an sm_90 device, or too little shared memory), 4 (unknown dtype).
extern "C" int kreg_cluster_topk(const void* scores, int dtype, int64_t row_stride, int rows,
                                 int n, const int32_t* lengths, int64_t len_stride, int k,
                                 int32_t* out, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return launch<float>(scores, row_stride, rows, n, lengths, len_stride, k, out, s);
    case 1: return launch<__nv_bfloat16>(scores, row_stride, rows, n, lengths, len_stride, k, out, s);
    case 2: return launch<__half>(scores, row_stride, rows, n, lengths, len_stride, k, out, s);
    default: return 4;
  }
}

// The largest row this kernel takes (keys), for the Python side's checks.
extern "C" int kreg_cluster_topk_max_keys() { return CL * SL_MAX; }
