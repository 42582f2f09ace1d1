// One-read streaming select for indexer_topk on sm_90 (kreg's `nvidia_hopper.indexer_topk_stream`).
//
// One CTA a row. The row is read from HBM once (plus a 1/16 sample); nothing is written to a
// workspace:
//
//   1. sample: SAMPLE keys in evenly spaced chunks of CW, held in registers; a bisection over
//      the order key (block counts) picks a threshold t with r_lo..r_hi sampled keys at or above
//      it, the window chosen so that the row holds between k and CAP keys above t with a margin
//      of four standard deviations of the sampling. Rows of at most SAMPLE keys are their own
//      sample: t is then their exact k-th key.
//   2. stream: every key once (16-byte vectors, UNROLL in flight a thread). The bisections snap
//      t to a real key, so the compares are float compares against t's float (NaN compares
//      false, -0 equals +0: the order keys' rule); keys above t are appended, (key, position),
//      to a shared-memory buffer of CAP entries (one warp scan and one shared atomic a warp per
//      UNROLL vectors; each lane converts and stores only its own hits); keys equal to t set
//      their bit in a bitmap of the row's positions (each 32-position word owned by one group
//      of lanes in one step: plain stores; STREAM_TIES=1 sends a step's masks out together,
//      transposed across the lane group, for A/B). STREAM_LOOP=0 keeps the first form (order
//      keys and a scan per vector) for A/B.
//   3. select: G keys above t, E equal to it. G >= k: T = the k-th largest of the buffer (a
//      bisection over its keys, held in registers); the bitmap is cleared and gets the
//      buffer's keys equal to T. G < k <= G + E: T = t, the bitmap holds the ties already.
//      The tied bits are cut at the (k - above)-th in position order (a block scan of popcounts),
//      the buffer's keys above T set their bits, and a last block scan writes the set bits'
//      positions: ascending, exactly k (kreg's contract: membership by score, then position).
//   A missed sample reads the row again: G > CAP raises t to the k-th largest of the CAP keys
//   the buffer kept (k keys reach it, so the next pass cannot come up short), G + E < k lowers
//   t to the lowest real key. A second G > CAP (the kept CAP are the first appended, a biased
//   prefix when the keys above t rise with position), or one at t = 1, finds the exact k-th key
//   by radix counts (radix_kth: two or three reads) before the last read: at most six reads a
//   row whatever the scores. Each extra read is counted in `stats` when it is given.
//
// Keys are kreg's order keys as unsigned (topk_keys.cuh): NaN lowest, -0 = +0, 0 = no key (past
// the row's length). bf16 / fp16 rows are read as 2-byte keys (8 a 16-byte vector). Rows of at
// most MAX_KEYS keys (the bitmap: MAX_KEYS / 8 bytes of shared memory); k <= CAP / 2. CTA
// geometries: three 256-thread CTAs an SM; for batches of fewer rows than SMs one 512-thread CTA
// a row (twice the bytes in flight for a row that has an SM to itself); and (wide = 2 / 4, or by
// the row count with STREAM_SPLIT_MAX) for batches whose rows x 2 (x 4) CTAs fit the SMs, a
// thread-block cluster of 2 (4) 512-thread CTAs a row: each
// reads a part of the row on the first pass (the same sample and t in each), then the first
// CTA copies the others' buffer entries and tie words from their shared memory into its own
// and goes on alone (a miss re-reads the whole row there, as a CTA's own pass would).
//
// Host entry: `kreg_stream_topk` (extern "C"; backends/indexer_topk/stream.py). History and
// measurements: docs/notes/indexer_topk.md ("Session 36").
#include <cstdint>
#ifdef KREG_CUDA_EMU   // built for the CPU emulator of tests/kernels/cuda_emu (the kernel alone)
#include "cuda_emu.h"
#else
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#endif

#include "topk_keys.cuh"

#ifndef STREAM_THREADS        // the geometry of batches of many rows: threads a CTA
#define STREAM_THREADS 256
#endif
#ifndef STREAM_WIDE_THREADS   // the geometry of batches of fewer rows than SMs (one CTA an SM)
#define STREAM_WIDE_THREADS 512
#endif
#ifndef STREAM_CAP
#define STREAM_CAP 6144
#endif
#ifndef STREAM_UNROLL
#define STREAM_UNROLL 8
#endif
#ifndef STREAM_SAMPLE
#define STREAM_SAMPLE 8192
#endif
#ifndef STREAM_MIN_BLOCKS
#define STREAM_MIN_BLOCKS 3
#endif
#ifndef STREAM_LOOP   // the stream's loop: 1 = float compares, appends once per UNROLL vectors
#define STREAM_LOOP 1   // 0 = order keys and a warp scan per vector (v54's first form)
#endif
#ifndef STREAM_EVICT_FIRST   // the stream's loads: ld.global.cs (1) or ld.global.nc (0)
#define STREAM_EVICT_FIRST 1
#endif
#ifndef STREAM_TIES   // the fast loop's bitmap of ties: 1 = a step's masks by one transpose
#define STREAM_TIES 0   // across the lane group (log2(32 / NV) shuffles a step: 0.92-0.97x at
#endif                  // 32-64 rows, 1.02-1.06x slower at 1024-4096 on an H100, session 40);
                        // 0 = a shuffle tree a vector
#ifndef STREAM_SPLIT_MAX   // the most CTAs (a cluster) a row of a small batch is read by when the
#define STREAM_SPLIT_MAX 2   // geometry is by the row count: 1, 2, 4 (2: pairs were 0.83-0.91x
#endif                       // one CTA a row at 32-64 rows on an H100, fours 0.93-1.72x; session 40)
#ifndef STREAM_STOP   // probes only (benchmarks/probes/stream_ab.py's phase split): 1 = return
#define STREAM_STOP 0   // after the sample's threshold, 2 = after the stream; 0 = the whole kernel
#endif
#ifndef STREAM_PACKED   // 2-byte keys: 1 = compare two keys an instruction (HSET2), masks by
#define STREAM_PACKED 1   // byte permutes and a multiply (0.88-0.96x on an H100, session 40);
                          // 0 = one float compare a key
#endif

namespace {

using kreg_topk::above_bit;
using kreg_topk::equal_bit;
using kreg_topk::Keys;

constexpr int CAP = STREAM_CAP;             // buffer entries (8 bytes each)
constexpr int UNROLL = STREAM_UNROLL;       // 16-byte vectors in flight a thread
constexpr int SAMPLE = STREAM_SAMPLE;       // sampled keys a row
constexpr int CW = 64;                      // keys a sample chunk
constexpr int MAX_KEYS = 1 << 20;
constexpr uint32_t FULL = 0xFFFFFFFFu;
static_assert(SAMPLE % CW == 0, "geometry");

template <int WARPS>
struct Shared {
  uint32_t red[2][WARPS];   // block reductions and scans, alternating
  uint32_t count;           // buffer appends (may pass CAP: then the buffer holds the first CAP)
  uint32_t bin, above;      // a radix pass's bin of the need-th key, the keys in bins above it
  uint32_t eq;              // a split row's part: its keys equal to t (read by the first CTA)
};

// The thread-block cluster of a split row (launches with split > 1 only): this CTA's rank, a
// barrier of every thread of the cluster (release / acquire), another CTA's copy of a shared
// address.
#ifdef KREG_CUDA_EMU
__device__ __forceinline__ int cta_rank() { return kreg_emu::cluster_rank(); }
__device__ __forceinline__ void cluster_barrier() { kreg_emu::cluster_sync(); }
template <typename P>
__device__ __forceinline__ P* on_rank(P* p, int r) { return kreg_emu::map_rank(p, r); }
#else
__device__ __forceinline__ int cta_rank() {
  return static_cast<int>(cooperative_groups::this_cluster().block_rank());
}
__device__ __forceinline__ void cluster_barrier() { cooperative_groups::this_cluster().sync(); }
template <typename P>
__device__ __forceinline__ P* on_rank(P* p, int r) {
  return cooperative_groups::this_cluster().map_shared_rank(p, r);
}
#endif

// The CTA's sum / maximum / minimum of v (one __syncthreads; calls alternate the rows of sh.red
// through `par`).
enum class Op { kSum, kMax, kMin };
template <Op OP>
__device__ __forceinline__ uint32_t warp_reduce(uint32_t v) {
  if constexpr (OP == Op::kSum) return __reduce_add_sync(FULL, v);
  if constexpr (OP == Op::kMax) return __reduce_max_sync(FULL, v);
  return __reduce_min_sync(FULL, v);
}
template <Op OP, int WARPS>
__device__ __forceinline__ uint32_t block_reduce(uint32_t v, Shared<WARPS>& sh, int& par,
                                                 int lane, int warp) {
  v = warp_reduce<OP>(v);
  if (lane == 0) sh.red[par][warp] = v;
  __syncthreads();
  const uint32_t x = lane < WARPS ? sh.red[par][lane] : (OP == Op::kMin ? 0xFFFFFFFFu : 0u);
  par ^= 1;
  return warp_reduce<OP>(x);
}
// Exclusive scan in thread order; `total` gets the sum.
template <int WARPS>
__device__ __forceinline__ uint32_t block_scan(uint32_t v, Shared<WARPS>& sh, int& par, int lane,
                                               int warp, uint32_t& total) {
  uint32_t incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(FULL, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) sh.red[par][warp] = incl;
  __syncthreads();
  const uint32_t x = lane < WARPS ? sh.red[par][lane] : 0u;
  par ^= 1;
  total = __reduce_add_sync(FULL, x);
  return __reduce_add_sync(FULL, lane < warp ? x : 0u) + incl - v;
}

// The largest c with at least `need` of the N values a thread holds (all threads' `vals`, 0 =
// none) at or above it; lo <= every counted value. Stops early at a c whose count is in
// [need, stop] and then returns the least value at or above c (the same count; a value, so a
// real key: the stream compares scores against its float). A bisection over the bits below the
// common prefix of lo and the largest value; *cnt gets the count at the result when it stopped
// early, else the count at or above the exact result.
template <int N, int WARPS>
__device__ __forceinline__ uint32_t bisect(const uint32_t (&vals)[N], uint32_t lo, uint32_t need,
                                           uint32_t stop, Shared<WARPS>& sh, int& par, int lane,
                                           int warp, uint32_t* cnt, bool* early) {
  uint32_t hi = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) hi = max(hi, vals[j]);
  hi = block_reduce<Op::kMax>(hi, sh, par, lane, warp);
  *early = false;
  if (hi <= lo) {   // one value (or none) at or above lo
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) m += (vals[j] >= hi && vals[j] != 0u) ? 1u : 0u;
    *cnt = block_reduce<Op::kSum>(m, sh, par, lane, warp);
    return hi;
  }
  const int top = 31 - __clz(lo ^ hi);   // the highest bit where lo and hi differ
  uint32_t c0 = lo & ~((2u << top) - 1u);   // their common prefix (<= lo)
  if (top == 31) c0 = 0u;
  uint32_t best = 0;
  for (int b = top; b >= 0; --b) {
    const uint32_t c = c0 | (1u << b);
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) m += vals[j] >= c ? 1u : 0u;
    const uint32_t got = block_reduce<Op::kSum>(m, sh, par, lane, warp);
    if (got >= need) {
      c0 = c;
      best = got;
      if (got <= stop) { *early = true; break; }
    }
  }
  if (*early) {   // snap up to the least value >= c0 (no value lies in between: same count)
    uint32_t m = 0xFFFFFFFFu;
#pragma unroll
    for (int j = 0; j < N; ++j) m = vals[j] >= c0 ? min(m, vals[j]) : m;
    c0 = block_reduce<Op::kMin>(m, sh, par, lane, warp);
  }
  if (!*early) {
    // c0 is the exact need-th largest value; count at or above it
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) m += vals[j] >= c0 ? 1u : 0u;
    best = block_reduce<Op::kSum>(m, sh, par, lane, warp);
  }
  *cnt = best;
  return c0;
}

// 16 bytes of scores (NV keys) at vector v, raw (positions past len: 0). VEC: the row is
// 16-byte aligned (else, and for the row's last partial vector, element loads).
template <typename T, bool VEC>
__device__ __forceinline__ uint4 load_raw(const T* __restrict__ src, int v, int len) {
  constexpr int NV = Keys<T>::NV;
  const int p = v * NV;
  const int rem = len - p;
  if (VEC && rem >= NV) {
    const uint4* p4 = reinterpret_cast<const uint4*>(src) + v;
    return STREAM_EVICT_FIRST ? __ldcs(p4) : __ldg(p4);
  }
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int e = 0; e < NV; ++e) {
    if (e < rem) {
      const uint32_t b = Keys<T>::bits1(src + p + e);
      if constexpr (NV == 4) w[e] = b; else w[e / 2] |= b << (16 * (e & 1));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The warp's slots in the buffer: lane's first of its c appends (one warp scan, one shared
// atomic by lane 31). Every lane of the warp calls it.
template <int WARPS>
__device__ __forceinline__ uint32_t append_slots(uint32_t c, Shared<WARPS>& sh, int lane) {
  uint32_t incl = c;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(FULL, incl, o);
    if (lane >= o) incl += y;
  }
  uint32_t base = 0;
  if (lane == 31) base = atomicAdd(&sh.count, incl);
  return __shfl_sync(FULL, base, 31) + incl - c;
}

// The bitmap word of vector v's NV keys (em: which equal t) and its LPW - 1 neighbours, OR-ed
// across their lanes and stored by the first (each word belongs to one lane group of one step).
// Every lane of the warp calls it.
template <int NV>
__device__ __forceinline__ void store_ties(uint32_t em, int v, int len, uint32_t* bits,
                                           int lane) {
  constexpr int LPW = 32 / NV;
  uint32_t w = em << ((v % LPW) * NV);
#pragma unroll
  for (int o = 1; o < LPW; o <<= 1) w |= __shfl_xor_sync(FULL, w, o);
  if ((lane % LPW) == 0 && v * NV < len) bits[(v * NV) >> 5] = w;
}

// A step's bitmap words at once (STREAM_TIES 1): `eq` holds this lane's tie masks of LPW
// vectors (NV bits each: field j = vector j of the chunk). Transposed across the LPW lanes of
// the group (log2(LPW) xor shuffles, each swapping half the fields with the partner lane),
// lane l of the group holds vector l's word: field f = lane f's mask, the 32 positions from
// the group's first vector (v_first: vector 0 of the chunk of the group's first lane). Words
// that hold no tie are not stored (the pass cleared the bitmap). Every lane of the warp calls it.
template <int NV>
__device__ __forceinline__ void store_ties_step(uint32_t eq, int v_first, int stride,
                                                uint32_t* bits, int lane) {
  constexpr int LPW = 32 / NV;
  const int l = lane % LPW;
#pragma unroll
  for (int d = LPW / 2; d >= 1; d /= 2) {
    uint32_t m = 0;   // the fields f with (f & d) != 0
#pragma unroll
    for (int f = 0; f < LPW; ++f) if (f & d) m |= ((1u << NV) - 1u) << (f * NV);
    const uint32_t y = __shfl_xor_sync(FULL, eq, d);
    eq = (l & d) ? ((eq & m) | ((y >> (d * NV)) & ~m)) : ((eq & ~m) | ((y << (d * NV)) & m));
  }
  if (eq != 0u) bits[((v_first + l * stride) * NV) >> 5] = eq;
}

// One read of the row's vectors [v_begin, v_stop) (v_stop < 0: to the row's end): keys above t
// to the buffer, keys equal to t to the bitmap; returns this thread's count of keys equal to t.
template <typename T, bool VEC, int THREADS>
__device__ __forceinline__ uint32_t stream_row(const T* __restrict__ src, int len, uint32_t t,
                                               uint2* __restrict__ buf, uint32_t* __restrict__ bits,
                                               Shared<THREADS / 32>& sh, int tid, int lane,
                                               int v_begin = 0, int v_stop = -1) {
  using KT = Keys<T>;
  constexpr int NV = KT::NV;
  const int nvec = v_stop < 0 ? (len + NV - 1) / NV : v_stop;
  uint32_t eqc = 0;
  for (int v0 = v_begin; v0 < nvec; v0 += THREADS * UNROLL) {
    uint4 x[UNROLL];
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const int v = v0 + j * THREADS + tid;
      x[j] = make_uint4(0u, 0u, 0u, 0u);
      if (v < nvec) x[j] = load_raw<T, VEC>(src, v, len);
    }
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const int v = v0 + j * THREADS + tid;
      const uint32_t w4[4] = {x[j].x, x[j].y, x[j].z, x[j].w};
      const int rem = v < nvec ? len - v * NV : 0;   // valid keys of the vector (<= 0 past)
      uint32_t u[NV];
#pragma unroll
      for (int e = 0; e < NV; ++e) {
        const uint32_t raw = NV == 4 ? w4[e] : ((w4[e / 2] >> (16 * (e & 1))) & 0xFFFFu);
        u[e] = e < rem ? KT::key(raw) : 0u;
      }
      uint32_t gm = 0, em = 0;
#pragma unroll
      for (int e = 0; e < NV; ++e) {
        gm |= above_bit(u[e], t) << e;
        em |= equal_bit(u[e], t) << e;
      }
      eqc += __popc(em);
      if (__any_sync(FULL, gm != 0u)) {
        uint32_t o = append_slots(__popc(gm), sh, lane);
#pragma unroll
        for (int e = 0; e < NV; ++e) {
          if ((gm >> e) & 1u) {
            if (o < static_cast<uint32_t>(CAP)) buf[o] = make_uint2(u[e], v * NV + e);
            ++o;
          }
        }
      }
      if (__any_sync(FULL, em != 0u)) store_ties<NV>(em, v, len, bits, lane);
    }
  }
  return eqc;
}

// A score as float (exact for every dtype) and the float of a real order key.
template <typename T> struct Floats;
template <> struct Floats<float> {
  __device__ static float of(uint32_t w, int) { return __uint_as_float(w); }
  __device__ static float of_key(uint32_t u) {
    return __uint_as_float(u >= 0x80000000u ? (u ^ 0x80000000u) : ~u);
  }
};
template <> struct Floats<__nv_bfloat16> {
  __device__ static float of(uint32_t w, int half) {
    return __uint_as_float(half ? (w & 0xFFFF0000u) : (w << 16));
  }
  __device__ static float of_key(uint32_t u) {
    return __uint_as_float((u >= 0x8000u ? (u ^ 0x8000u) : (~u & 0xFFFFu)) << 16);
  }
};
template <> struct Floats<__half> {
  __device__ static float of(uint32_t w, int half) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(half ? (w >> 16) : w)));
  }
  __device__ static float of_key(uint32_t u) {
    return __half2float(__ushort_as_half(
        static_cast<unsigned short>(u >= 0x8000u ? (u ^ 0x8000u) : (~u & 0xFFFFu))));
  }
};

#if STREAM_PACKED
// 2-byte keys two at a time: a 32-bit word of two scores against t's pair (HSET2: 0xFFFF a half
// where the compare holds; NaN compares false, -0 equals +0, the float rule). P::raw: a 16-bit
// order key's score bits.
template <typename T> struct Pairs;
template <> struct Pairs<__nv_bfloat16> { using V = __nv_bfloat162; };
template <> struct Pairs<__half> { using V = __half2; };
template <typename T>
__device__ __forceinline__ typename Pairs<T>::V pair_of(uint32_t w) {
  return *reinterpret_cast<const typename Pairs<T>::V*>(&w);
}
__device__ __forceinline__ uint32_t raw16(uint32_t u) {
  return u >= 0x8000u ? (u ^ 0x8000u) : (~u & 0xFFFFu);
}
// Four words of 0x0000 / 0xFFFF halves (keys 0-7 of a vector) as an 8-bit mask: the halves'
// high bytes gathered four to a word, then each word's bytes to four bits by one multiply (the
// partial products land on distinct bits: no carries).
__device__ __forceinline__ uint32_t nibble(uint32_t bytes) {
  return ((bytes & 0x01010101u) * 0x01020408u) >> 24;
}
__device__ __forceinline__ uint32_t halves_to_bits(uint32_t m0, uint32_t m1, uint32_t m2,
                                                   uint32_t m3) {
  return nibble(__byte_perm(m0, m1, 0x7531u)) | (nibble(__byte_perm(m2, m3, 0x7531u)) << 4);
}
#endif

// The stream with float compares (STREAM_LOOP 1): t is a real key (the bisections snap to one),
// so for a score x, key(x) > t <=> x > ft and key(x) == t <=> x == ft (NaN compares false; -0
// equals +0), where ft is t's float; t = 1 (NaN's key: NANT) takes every number above it and NaN
// as equal. The vectors whose keys are all inside the row run here; the lanes' above-t masks of
// UNROLL vectors go to the buffer in one warp scan, each lane then converting and storing only
// its own hits; the rest of the row (its last partial vectors) runs through stream_row.
template <typename T, bool VEC, int THREADS, bool NANT>
__device__ __forceinline__ uint32_t stream_row_fast(const T* __restrict__ src, int len,
                                                    uint32_t t, float ft,
                                                    uint2* __restrict__ buf,
                                                    uint32_t* __restrict__ bits,
                                                    Shared<THREADS / 32>& sh, int tid, int lane,
                                                    int v_begin, int v_stop) {
  using KT = Keys<T>;
  constexpr int NV = KT::NV;
  constexpr int STEP = THREADS * UNROLL;
  static_assert(UNROLL * NV <= 64, "one 64-bit mask a step");
  // the steps whose every key is valid (v_begin: a multiple of STEP)
  const int full = min(v_stop, len / NV);
  const int v_end = full > v_begin ? v_begin + (full - v_begin) / STEP * STEP : v_begin;
  uint32_t eqc = 0;
  for (int v0 = v_begin; v0 < v_end; v0 += STEP) {
    uint4 x[UNROLL];
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const int v = v0 + j * THREADS + tid;
      if (VEC) {
        const uint4* p4 = reinterpret_cast<const uint4*>(src) + v;
        x[j] = STREAM_EVICT_FIRST ? __ldcs(p4) : __ldg(p4);
      } else {
        x[j] = load_raw<T, false>(src, v, len);
      }
    }
    uint64_t gm = 0, eall = 0;   // above / equal t: bit j * NV + e (vector j, key e)
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const uint32_t w4[4] = {x[j].x, x[j].y, x[j].z, x[j].w};
      uint32_t em = 0;
#if STREAM_PACKED
      if constexpr (NV == 8) {
        const typename Pairs<T>::V t2 = pair_of<T>(raw16(t) | (raw16(t) << 16));
        uint32_t g4[4], q4[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const typename Pairs<T>::V v = pair_of<T>(w4[c]);
          g4[c] = NANT ? __heq2_mask(v, v) : __hgt2_mask(v, t2);
          q4[c] = NANT ? ~g4[c] : __heq2_mask(v, t2);
        }
        gm |= static_cast<uint64_t>(halves_to_bits(g4[0], g4[1], g4[2], g4[3])) << (j * NV);
        em = halves_to_bits(q4[0], q4[1], q4[2], q4[3]);
      } else
#endif
      {
#pragma unroll
        for (int e = 0; e < NV; ++e) {
          const float f = Floats<T>::of(w4[NV == 4 ? e : e / 2], NV == 4 ? 0 : (e & 1));
          const bool g = NANT ? (f == f) : (f > ft);
          const bool q = NANT ? (f != f) : (f == ft);
          gm |= static_cast<uint64_t>(g) << (j * NV + e);
          em |= static_cast<uint32_t>(q) << e;
        }
      }
      if (STREAM_TIES && UNROLL % (32 / NV) == 0) {
        eall |= static_cast<uint64_t>(em) << (j * NV);
      } else {
        eqc += __popc(em);
        if (__any_sync(FULL, em != 0u)) store_ties<NV>(em, v0 + j * THREADS + tid, len, bits, lane);
      }
    }
    if (STREAM_TIES && UNROLL % (32 / NV) == 0) {
      eqc += __popcll(eall);
      if (__any_sync(FULL, eall != 0ull)) {
        constexpr int LPW = 32 / NV;
        const int v_first = v0 + tid - lane % LPW;
#pragma unroll
        for (int c = 0; c < UNROLL / LPW; ++c)
          store_ties_step<NV>(static_cast<uint32_t>(eall >> (32 * c)), v_first + c * LPW * THREADS,
                              THREADS, bits, lane);
      }
    }
    if (__any_sync(FULL, gm != 0ull)) {
      uint32_t o = append_slots(__popcll(gm), sh, lane);
      while (gm) {   // this lane's hits only (divergent; no collective inside)
        const int b = __ffsll(static_cast<long long>(gm)) - 1;
        gm &= gm - 1ull;
        const int j = b / NV, e = b % NV;
        uint4 xv = x[0];
#pragma unroll
        for (int jj = 1; jj < UNROLL; ++jj) if (jj == j) xv = x[jj];
        const int c4 = NV == 4 ? e : e / 2;
        const uint32_t w = c4 == 0 ? xv.x : c4 == 1 ? xv.y : c4 == 2 ? xv.z : xv.w;
        const uint32_t raw = NV == 4 ? w : ((w >> (16 * (e & 1))) & 0xFFFFu);
        if (o < static_cast<uint32_t>(CAP))
          buf[o] = make_uint2(KT::key(raw), (v0 + j * THREADS + tid) * NV + e);
        ++o;
      }
    }
  }
  return eqc + stream_row<T, VEC, THREADS>(src, len, t, buf, bits, sh, tid, lane, v_end, v_stop);
}

// A read of the row's vectors [v_begin, v_stop) (v_begin a multiple of THREADS * UNROLL).
template <typename T, bool VEC, int THREADS>
__device__ __forceinline__ uint32_t stream_pass(const T* __restrict__ src, int len, uint32_t t,
                                                uint2* __restrict__ buf,
                                                uint32_t* __restrict__ bits,
                                                Shared<THREADS / 32>& sh, int tid, int lane,
                                                int v_begin, int v_stop) {
  if (!STREAM_LOOP)
    return stream_row<T, VEC, THREADS>(src, len, t, buf, bits, sh, tid, lane, v_begin, v_stop);
  if (t == 1u)
    return stream_row_fast<T, VEC, THREADS, true>(src, len, t, 0.0f, buf, bits, sh, tid, lane,
                                                  v_begin, v_stop);
  return stream_row_fast<T, VEC, THREADS, false>(src, len, t, Floats<T>::of_key(t), buf, bits,
                                                 sh, tid, lane, v_begin, v_stop);
}

// The exact k-th largest key of the row among its keys above t (a row with more than k of
// them), by radix counts: one read a digit of RADIX_BITS (or fewer: 32-bit keys take three
// reads, 16-bit keys two), each counting the keys above t whose higher digits match the ones
// chosen so far into a histogram in `hist` (1 << RADIX_BITS words: the buffer's space, unused
// between passes). The bound on the retries of a row whose sample and first retry both missed
// (keys above t that rise with position make the buffer's first CAP a biased prefix). Adds its
// reads to *reads.
constexpr int RADIX_BITS = 11;
template <typename T, bool VEC, int THREADS>
__device__ __noinline__ uint32_t radix_kth(const T* __restrict__ src, int len, uint32_t t,
                                           uint32_t k, uint32_t* __restrict__ hist,
                                           Shared<THREADS / 32>& sh, int& par, int tid, int lane,
                                           int warp, int* reads) {
  using KT = Keys<T>;
  constexpr int NV = KT::NV, KEY_BITS = 8 * KT::KB, BINS = 1 << RADIX_BITS;
  constexpr int HB = BINS / THREADS;   // bins a thread (the bin search)
  static_assert(BINS % THREADS == 0, "geometry");
  const int nvec = (len + NV - 1) / NV;
  uint32_t prefix = 0u, need = k;
  int done = 0;   // the key's high bits fixed so far
  while (done < KEY_BITS) {
    const int d = min(RADIX_BITS, KEY_BITS - done);
    const int shift = KEY_BITS - done - d;
    for (int i = tid; i < BINS; i += THREADS) hist[i] = 0u;
    __syncthreads();
    for (int v = tid; v < nvec; v += THREADS) {
      const uint4 x = load_raw<T, VEC>(src, v, len);
      const uint32_t w4[4] = {x.x, x.y, x.z, x.w};
      const int rem = len - v * NV;
#pragma unroll
      for (int e = 0; e < NV; ++e) {
        const uint32_t raw = NV == 4 ? w4[e] : ((w4[e / 2] >> (16 * (e & 1))) & 0xFFFFu);
        const uint32_t u = e < rem ? KT::key(raw) : 0u;
        // (u >> shift) >> d: the digits above this one (a shift by 32 is undefined)
        if (u > t && ((u >> shift) >> d) == prefix)
          atomicAdd(&hist[(u >> shift) & ((1u << d) - 1u)], 1u);
      }
    }
    ++*reads;
    __syncthreads();
    // the bin b (counted from the top) with above(b) < need <= above(b) + hist[b]
    uint32_t mine = 0;
#pragma unroll
    for (int j = 0; j < HB; ++j) mine += hist[tid * HB + j];
    uint32_t total;
    const uint32_t below = block_scan(mine, sh, par, lane, warp, total);
    uint32_t above = total - below - mine;
#pragma unroll
    for (int j = HB - 1; j >= 0; --j) {
      const uint32_t c = hist[tid * HB + j];
      if (above < need && need <= above + c) {
        sh.bin = static_cast<uint32_t>(tid * HB + j);
        sh.above = above;
      }
      above += c;
    }
    __syncthreads();
    prefix = (prefix << d) | sh.bin;
    need -= sh.above;
    done += d;
    __syncthreads();   // every thread has read sh.bin / sh.above and hist before they change
  }
  return prefix;
}

template <typename T, int THREADS, int MIN_BLOCKS>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
stream_topk_kernel(const T* __restrict__ scores, int64_t row_stride, int n,
                   const int32_t* __restrict__ lengths, int64_t len_stride, int k,
                   int32_t* __restrict__ out, int* __restrict__ stats, int split) {
  using KT = Keys<T>;
  constexpr int WARPS = THREADS / 32;
  constexpr int SPT = SAMPLE / THREADS;   // sampled keys a thread
  constexpr int BPT = CAP / THREADS;      // buffer entries a thread (the selection)
  static_assert(SAMPLE % THREADS == 0 && CAP % THREADS == 0, "geometry");
#ifdef KREG_CUDA_EMU   // one CTA (or cluster) at a time on the CPU
  uint32_t* smem = kreg_emu::dynamic_shared();
  Shared<WARPS>& sh = kreg_emu::static_shared<Shared<WARPS>>();
#else
  extern __shared__ __align__(16) uint32_t smem[];
  __shared__ Shared<WARPS> sh;
#endif
  uint2* buf = reinterpret_cast<uint2*>(smem);   // CAP (key, position)
  uint32_t* bits = smem + 2 * CAP;               // a bit a position (wpt words a thread)
  const int rank = split > 1 ? cta_rank() : 0;   // this CTA's part of a split row
  const int64_t row = blockIdx.x / split;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int par = 0;
  int len = n;
  if (lengths != nullptr) len = min(max(lengths[row * len_stride], 0), n);
  int32_t* orow = out + row * k;
  const T* src = scores + row * row_stride;
  if (len <= k) {   // every valid key is taken
    if (rank == 0)
      for (int i = tid; i < k; i += THREADS) orow[i] = i < len ? i : -1;
    return;
  }
  const int words = (len + 31) >> 5;
  const int wpt = (words + THREADS - 1) / THREADS;   // bitmap words a thread (the scans)
  // A split row (a cluster of `split` CTAs): each CTA reads a part of the row on the first pass
  // (`part` vectors, a multiple of a step: whole bitmap words), and the first CTA takes the
  // others' buffers and tie words into its own and goes on alone. Rows shorter than a step a
  // CTA: the first CTA alone.
  const int nvec = (len + KT::NV - 1) / KT::NV;
  constexpr int STEP = THREADS * UNROLL;
  const bool split_row = split > 1 && nvec >= split * STEP;
  if (split > 1 && !split_row && rank != 0) return;
  const int part = split_row ? (nvec + split * STEP - 1) / (split * STEP) * STEP : nvec;

  // 1. the sample's threshold
  uint32_t t;
  {
    uint32_t s[SPT];
    uint32_t r_lo, r_hi;
    if (len <= SAMPLE) {
#pragma unroll
      for (int j = 0; j < SPT; ++j) {
        const int i = tid + j * THREADS;
        s[j] = i < len ? KT::key(KT::bits1(src + i)) : 0u;
      }
      r_lo = r_hi = static_cast<uint32_t>(k);
    } else {
      constexpr int NCH = SAMPLE / CW;
#pragma unroll
      for (int j = 0; j < SPT; ++j) {
        const int i = tid + j * THREADS;
        const int c = i / CW;
        const int start = static_cast<int>(static_cast<int64_t>(c) * (len - CW) / (NCH - 1));
        s[j] = KT::key(KT::bits1(src + start + i % CW));
      }
      const float f = static_cast<float>(SAMPLE) / static_cast<float>(len);
      const float a = k * f, b = CAP * f;
      float lo = ceilf(a + 4.0f * sqrtf(a)), hi = floorf(b - 4.0f * sqrtf(b));
      if (lo > hi) lo = hi = fmaxf(1.0f, floorf(0.5f * (a + b)));
      r_lo = static_cast<uint32_t>(fmaxf(lo, 1.0f));
      r_hi = static_cast<uint32_t>(fmaxf(hi, 1.0f));
    }
    uint32_t cnt;
    bool early;
    t = bisect<SPT>(s, 1u, r_lo, r_hi, sh, par, lane, warp, &cnt, &early);
    t = max(t, 1u);   // 0 is "no key"
  }
  if (STREAM_STOP == 1) {
    if (tid == 0) orow[0] = static_cast<int32_t>(t);
    return;
  }

  // 2. stream (again when the sample missed)
  const bool vec = (reinterpret_cast<uintptr_t>(src) & 15u) == 0;
  int reads = 0, overflows = 0;   // extra reads of the row (stats); passes with G > CAP
  uint32_t G = 0, E = 0;
  bool parts = split_row;   // this pass reads this CTA's part
  for (;;) {
    ++reads;
    for (int i = tid; i < words; i += THREADS) bits[i] = 0u;
    if (tid == 0) sh.count = 0u;
    __syncthreads();
    const int vb = parts ? rank * part : 0, ve = parts ? min(nvec, vb + part) : nvec;
    const uint32_t eqc =
        vb >= ve ? 0u
        : vec    ? stream_pass<T, true, THREADS>(src, len, t, buf, bits, sh, tid, lane, vb, ve)
                 : stream_pass<T, false, THREADS>(src, len, t, buf, bits, sh, tid, lane, vb, ve);
    E = block_reduce<Op::kSum>(eqc, sh, par, lane, warp);   // (its barrier also publishes sh.count)
    G = sh.count;
    if (parts) {   // a split row's first pass: the parts become this (the first) CTA's pass
      parts = false;
      if (tid == 0) sh.eq = E;
      cluster_barrier();   // every part's counts, buffer and tie words visible
      if (rank != 0) {     // read by the first CTA until the next cluster barrier
        cluster_barrier();
        return;
      }
      // the parts' kept entries after this CTA's own (up to CAP: on an overflow the buffer then
      // holds CAP keys above t, all the retry below needs), their tie words into its bitmap
      uint32_t off = min(G, static_cast<uint32_t>(CAP));
      for (int r = 1; r < split; ++r) {
        const Shared<WARPS>* o = on_rank(&sh, r);
        const uint32_t gr = o->count;
        E += o->eq;
        G += gr;
        const uint32_t take = min(min(gr, static_cast<uint32_t>(CAP)), CAP - off);
        const uint2* rb = on_rank(buf, r);
        for (int i = tid; i < static_cast<int>(take); i += THREADS) buf[off + i] = rb[i];
        off += take;
        const uint32_t* rbits = on_rank(bits, r);
        const int w_hi = min(words, (r + 1) * part * KT::NV / 32);
        for (int w = r * part * KT::NV / 32 + tid; w < w_hi; w += THREADS) bits[w] = rbits[w];
      }
      cluster_barrier();   // (also this CTA's barrier: its copies visible to all its threads)
      // G and E are the row's: a miss retries as a CTA's own pass would, reading the whole row
    }
    if (G > static_cast<uint32_t>(CAP) && (t == 1u || ++overflows > 1)) {
      // a second miss, or a miss at t = 1 (the buffer kept the row's first CAP keys: their
      // k-th is no estimate of the row's): the exact k-th key by radix counts (at most three
      // reads), then the last read (fewer than k keys above it, at least k at or above it)
      __syncthreads();   // the buffer's space becomes the histogram
      t = vec ? radix_kth<T, true, THREADS>(src, len, t, k, smem, sh, par, tid, lane, warp, &reads)
              : radix_kth<T, false, THREADS>(src, len, t, k, smem, sh, par, tid, lane, warp,
                                             &reads);
      continue;
    }
    if (G > static_cast<uint32_t>(CAP)) {   // too many above t: t = the k-th of the kept CAP
      uint32_t bv[BPT];
#pragma unroll
      for (int j = 0; j < BPT; ++j) bv[j] = buf[tid + j * THREADS].x;
      uint32_t cnt;
      bool early;
      t = bisect<BPT>(bv, t + 1u, static_cast<uint32_t>(k), static_cast<uint32_t>(k), sh, par,
                      lane, warp, &cnt, &early);
      __syncthreads();   // every thread has read the buffer before the next pass writes it
      continue;
    }
    if (G + E < static_cast<uint32_t>(k)) {   // too few: take every real key as a candidate
      t = 1u;
      __syncthreads();
      continue;
    }
    break;
  }
  if (stats != nullptr && reads > 1 && tid == 0) atomicAdd(stats, reads - 1);
  if (STREAM_STOP == 2) {
    if (tid == 0) orow[0] = static_cast<int32_t>(G + E);
    return;
  }

  // 3. select: kth (the k-th key, or a bound exactly k keys reach), the keys above it (taken)
  // and the ties at it (the first `need` by position)
  uint32_t kth = t, need = static_cast<uint32_t>(k) - G;
  if (G >= static_cast<uint32_t>(k)) {
    uint32_t bv[BPT];
#pragma unroll
    for (int j = 0; j < BPT; ++j) {
      const int i = tid + j * THREADS;
      bv[j] = i < static_cast<int>(G) ? buf[i].x : 0u;
    }
    uint32_t cnt;
    bool early;
    kth = bisect<BPT>(bv, t + 1u, static_cast<uint32_t>(k), static_cast<uint32_t>(k), sh, par,
                    lane, warp, &cnt, &early);
    // early: exactly k keys >= kth, no ties to cut; else kth is the k-th key
    uint32_t above = static_cast<uint32_t>(k);
    if (!early) {
      uint32_t m = 0;
#pragma unroll
      for (int j = 0; j < BPT; ++j) m += bv[j] > kth ? 1u : 0u;
      above = block_reduce<Op::kSum>(m, sh, par, lane, warp);
    }
    need = static_cast<uint32_t>(k) - above;
    for (int i = tid; i < words; i += THREADS) bits[i] = 0u;
    __syncthreads();
    if (need != 0u) {
#pragma unroll
      for (int j = 0; j < BPT; ++j) {
        if (bv[j] == kth) {
          const uint32_t p = buf[tid + j * THREADS].y;
          atomicOr(&bits[p >> 5], 1u << (p & 31u));
        }
      }
    }
    __syncthreads();
    if (early) kth -= 1u;   // "above kth" below then means >= the early bound
  }
  // cut the ties after the need-th in position order (a no-op when need >= their count)
  {
    const int w0 = tid * wpt;
    uint32_t mine = 0;
    for (int j = 0; j < wpt; ++j) mine += (w0 + j < words) ? __popc(bits[w0 + j]) : 0u;
    uint32_t total;
    uint32_t before = block_scan(mine, sh, par, lane, warp, total);
    if (total > need) {
      for (int j = 0; j < wpt && w0 + j < words; ++j) {
        uint32_t w = bits[w0 + j];
        if (before >= need) {
          w = 0u;
        } else {
          const uint32_t c = __popc(w);
          if (before + c > need) {   // keep the first need - before set bits
            uint32_t keep = need - before, kept = 0u, x = w;
            while (keep--) { const uint32_t lowest = x & (0u - x); kept |= lowest; x ^= lowest; }
            w = kept;
          }
          before += c;
        }
        bits[w0 + j] = w;
      }
    }
    __syncthreads();
  }
  // the keys above kth
  {
    const int m = static_cast<int>(min(G, static_cast<uint32_t>(CAP)));
    for (int i = tid; i < m; i += THREADS) {
      const uint2 e = buf[i];
      if (e.x > kth) atomicOr(&bits[e.y >> 5], 1u << (e.y & 31u));
    }
    __syncthreads();
  }
  // write the set bits' positions in order
  {
    const int w0 = tid * wpt;
    uint32_t mine = 0;
    for (int j = 0; j < wpt; ++j) mine += (w0 + j < words) ? __popc(bits[w0 + j]) : 0u;
    uint32_t total;
    uint32_t o = block_scan(mine, sh, par, lane, warp, total);
    for (int j = 0; j < wpt && w0 + j < words; ++j) {
      uint32_t w = bits[w0 + j];
      while (w) {
        const int b = __ffs(w) - 1;
        w &= w - 1u;
        if (o < static_cast<uint32_t>(k)) orow[o] = (w0 + j) * 32 + b;
        ++o;
      }
    }
    // (total == k by construction; pad defensively)
    for (int i = static_cast<int>(total) + tid; i < k; i += THREADS) orow[i] = -1;
  }
}

#ifndef KREG_CUDA_EMU
template <typename T, int THREADS, int MIN_BLOCKS>
int launch_geometry(const void* scores, int64_t row_stride, int rows, int n,
                    const int32_t* lengths, int64_t len_stride, int k, int32_t* out, int* stats,
                    int split, cudaStream_t stream, int dev) {
  auto kern = stream_topk_kernel<T, THREADS, MIN_BLOCKS>;
  const int words = (n + 31) / 32;
  const size_t bytes = static_cast<size_t>(CAP) * 8 + static_cast<size_t>(words) * 4;
  // the dynamic shared-memory limit raised so far, per device (raised for every size: the
  // static part counts against the default 48 KB too, so a dynamic part just under it fails)
  static size_t ready[64] = {};
  if (ready[dev] < bytes) {
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)) != cudaSuccess) return 2;
    ready[dev] = bytes;
  }
  // cudaLaunchKernel returns this launch's own error (cudaGetLastError after <<<>>> would also
  // report, and clear, an earlier unrelated one)
  const T* src = static_cast<const T*>(scores);
  if (split > 1) {   // a cluster of `split` CTAs a row
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(rows) * split);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = bytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(split);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, src, row_stride, n, lengths, len_stride, k, out, stats,
                              split) == cudaSuccess ? 0 : 3;
  }
  void* args[] = {&src, &row_stride, &n, &lengths, &len_stride, &k, &out, &stats, &split};
  return cudaLaunchKernel(reinterpret_cast<const void*>(kern), dim3(rows), dim3(THREADS), args,
                          bytes, stream) == cudaSuccess ? 0 : 3;
}

// wide: 1 = one 512-thread CTA an SM (batches of fewer rows than SMs), 0 = 256-thread CTAs,
// three an SM, 2 / 4 = a cluster of two / four 512-thread CTAs a row (each reads a part of it);
// -1 = by the row count (a split of up to STREAM_SPLIT_MAX CTAs while the rows' CTAs fit the
// SMs, then 512-thread CTAs below the SM count, then 256-thread ones).
template <typename T>
int launch(const void* scores, int64_t row_stride, int rows, int n, const int32_t* lengths,
           int64_t len_stride, int k, int32_t* out, int* stats, int wide, cudaStream_t stream) {
  if (n > MAX_KEYS) return 1;
  if (k > CAP / 2) return 5;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 2;
  if (rows <= 0) return 0;
  if (wide < 0) {
    static int sms[64] = {};
    if (sms[dev] == 0 &&
        cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 2;
    wide = rows < sms[dev] ? 1 : 0;
    for (int s = 2; s <= STREAM_SPLIT_MAX; s *= 2)
      if (static_cast<int64_t>(rows) * s <= sms[dev]) wide = s;
  }
  if (wide != 0 && wide != 1 && wide != 2 && wide != 4) return 6;
  if (wide)
    return launch_geometry<T, STREAM_WIDE_THREADS, 1>(scores, row_stride, rows, n, lengths,
                                                      len_stride, k, out, stats, wide, stream,
                                                      dev);
  return launch_geometry<T, STREAM_THREADS, STREAM_MIN_BLOCKS>(
      scores, row_stride, rows, n, lengths, len_stride, k, out, stats, 1, stream, dev);
}
#endif  // !KREG_CUDA_EMU

}  // namespace

#ifndef KREG_CUDA_EMU
// dtype: 0 float32, 1 bfloat16, 2 float16. Returns 0, or 1 (rows longer than MAX_KEYS keys),
// 2 (no current device, or its shared-memory limit could not be raised), 3 (the launch failed),
// 4 (unknown dtype), 5 (k above CAP / 2), 6 (an unknown geometry). stats: null, or an int the
// kernel adds its retries to.
// wide: the geometry (-1: by the row count; 1: 512-thread CTAs; 0: 256-thread CTAs; 2 / 4: a
// cluster of two / four 512-thread CTAs a row).
extern "C" int kreg_stream_topk(const void* scores, int dtype, int64_t row_stride, int rows,
                                int n, const int32_t* lengths, int64_t len_stride, int k,
                                int32_t* out, int* stats, int wide, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0:
      return launch<float>(scores, row_stride, rows, n, lengths, len_stride, k, out, stats, wide, s);
    case 1:
      return launch<__nv_bfloat16>(scores, row_stride, rows, n, lengths, len_stride, k, out, stats,
                                   wide, s);
    case 2:
      return launch<__half>(scores, row_stride, rows, n, lengths, len_stride, k, out, stats, wide, s);
    default: return 4;
  }
}

extern "C" int kreg_stream_topk_max_keys() { return MAX_KEYS; }
extern "C" int kreg_stream_topk_max_k() { return CAP / 2; }
#endif  // !KREG_CUDA_EMU
