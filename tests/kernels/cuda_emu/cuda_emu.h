// A CPU emulator of the CUDA features kreg's streaming top-k kernel uses
// (backends/indexer_topk/cuda/stream_topk.cu, built with -DKREG_CUDA_EMU), so that the kernel's
// own source runs in CI on a machine without a GPU (tests/kernels/test_indexer_topk_stream_emu.py).
//
// One cluster at a time (one CTA, or the `ncta` CTAs of a thread-block cluster with their own
// shared memories, cluster barriers and mapped shared addresses); each CUDA thread is a ucontext
// fiber, and the scheduler switches fibers at
// every barrier, warp collective, global load and shared atomic, in a random order (mode 0) or
// letting a few threads run far ahead of the rest (mode 1), so a missing __syncthreads or a
// read-before-write shows up as a wrong answer. It also reports, as errors the test fails on:
//   * a warp collective that does not find all 32 lanes at the same call site with a full mask
//     (a shuffle or ballot inside divergent code);
//   * a deadlock (a barrier some threads never reach);
//   * a global read outside the current row's [start, start + len) or misaligned for its width;
//   * writes past the dynamic shared memory the launch would give (a guard after it);
//   * a mapped shared address (another CTA's) that is not inside this CTA's shared memory.
// Not modelled: memory-model subtleties beyond barrier ordering (every access is sequentially
// consistent here), timing, registers, and everything the host code does (not compiled here).
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using std::max;
using std::min;
#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(a, b)
#define __align__(n) alignas(n)

struct Dim3 { unsigned x, y, z; };
struct uint2 { uint32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
inline uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
struct __half { unsigned short x; };
struct __nv_bfloat16 { unsigned short x; };
inline __half __ushort_as_half(unsigned short s) { return {s}; }
inline float __half2float(__half h) {
  const uint32_t s = (h.x >> 15) & 1, e = (h.x >> 10) & 31, m = h.x & 1023;
  float f;
  if (e == 0) f = std::ldexp(static_cast<float>(m), -24);
  else if (e == 31) f = m ? NAN : INFINITY;
  else f = std::ldexp(static_cast<float>(m | 1024), static_cast<int>(e) - 25);
  return s ? -f : f;
}
struct __half2 { __half x, y; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
inline float lane_float(__nv_bfloat16 h) {
  const uint32_t u = static_cast<uint32_t>(h.x) << 16; float f; memcpy(&f, &u, 4); return f;
}
inline float lane_float(__half h) { return __half2float(h); }
// HSET2's masks: 0xFFFF in each half where the (ordered) compare holds
template <typename P> inline uint32_t pair_mask(P a, P b, bool greater) {
  const float a0 = lane_float(a.x), a1 = lane_float(a.y);
  const float b0 = lane_float(b.x), b1 = lane_float(b.y);
  const bool lo = greater ? a0 > b0 : a0 == b0, hi = greater ? a1 > b1 : a1 == b1;
  return (lo ? 0xFFFFu : 0u) | (hi ? 0xFFFF0000u : 0u);
}
inline uint32_t __hgt2_mask(__nv_bfloat162 a, __nv_bfloat162 b) { return pair_mask(a, b, true); }
inline uint32_t __heq2_mask(__nv_bfloat162 a, __nv_bfloat162 b) { return pair_mask(a, b, false); }
inline uint32_t __hgt2_mask(__half2 a, __half2 b) { return pair_mask(a, b, true); }
inline uint32_t __heq2_mask(__half2 a, __half2 b) { return pair_mask(a, b, false); }
// PRMT without its sign-replicate mode: result byte i is byte (s >> 4i) & 7 of {y, x}
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i)
    r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFFu) << (8 * i);
  return r;
}
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }

namespace kreg_emu {

enum State { kRun = 0, kWait = 1, kDone = 2 };
struct Fiber { ucontext_t ctx; int state; std::vector<char> stack; };
struct Warp {   // one collective in progress (two generations: a lane may re-arrive early)
  uint64_t val[2][32]; int site[2][32]; unsigned mask[2][32];
  int count = 0; unsigned gen = 0; std::vector<int> waiters;
};
struct Block { int count = 0; std::vector<int> waiters; };

constexpr int kMaxCta = 4, kMaxFibers = 4096;
inline Fiber* fibers;
inline int nthreads, cur;       // threads a CTA; the running fiber (CTA cur / nthreads)
inline int ncta = 1;            // CTAs of the cluster
inline ucontext_t scheduler;
inline Dim3 thread_idx[kMaxFibers];
inline Dim3 block_idx[kMaxCta];
inline uint32_t* shared_base[kMaxCta];   // each CTA's dynamic shared memory
inline size_t shared_bytes = 0;
alignas(16) inline char static_shared_mem[kMaxCta][4096];   // each CTA's static __shared__
inline const char* row_lo;      // the current row's readable bytes
inline const char* row_hi;
inline long errors = 0;
inline Warp warps[kMaxFibers / 32];
inline Block block[kMaxCta];
inline Block cluster;
inline uint32_t yield_state = 88172645u;

inline int cta() { return cur / nthreads; }
inline uint32_t* dynamic_shared() { return shared_base[cta()]; }
template <typename S> inline S& static_shared() {
  static_assert(sizeof(S) <= sizeof(static_shared_mem[0]), "static shared");
  return *reinterpret_cast<S*>(static_shared_mem[cta()]);
}
inline void yield() { swapcontext(&fibers[cur].ctx, &scheduler); }
inline void maybe_yield() {   // a switch at one in four loads and shared atomics
  yield_state ^= yield_state << 13; yield_state ^= yield_state >> 17; yield_state ^= yield_state << 5;
  if ((yield_state & 3u) == 0u) yield();
}
inline void error(const char* what, long a = 0, long b = 0) {
  if (errors++ < 10) fprintf(stderr, "cuda_emu: %s (%ld, %ld)\n", what, a, b);
}

// Every lane of the warp arrives with (value, call site, mask); the last one releases them all.
inline const uint64_t* warp_arrive(uint64_t v, int site, unsigned mask) {
  const int t = cur, w = t / 32, l = t % 32;
  Warp& W = warps[w];
  const unsigned p = W.gen & 1u;
  W.val[p][l] = v; W.site[p][l] = site; W.mask[p][l] = mask;
  if (++W.count == 32) {
    W.count = 0; ++W.gen;
    for (int i = 0; i < 32; ++i)
      if (W.site[p][i] != W.site[p][0] || W.mask[p][i] != 0xFFFFFFFFu)
        error("divergent warp collective (warp, lane)", w, i);
    for (int f : W.waiters) fibers[f].state = kRun;
    W.waiters.clear();
    yield();
  } else {
    fibers[t].state = kWait; W.waiters.push_back(t); yield();
  }
  return W.val[p];
}
inline uint32_t shfl_up(unsigned m, uint32_t v, int o, int site) {
  const uint64_t* a = warp_arrive(v, site, m);
  return cur % 32 >= o ? static_cast<uint32_t>(a[cur % 32 - o]) : v;
}
inline uint32_t shfl(unsigned m, uint32_t v, int s, int site) {
  return static_cast<uint32_t>(warp_arrive(v, site, m)[s & 31]);
}
inline uint32_t shfl_xor(unsigned m, uint32_t v, int o, int site) {
  return static_cast<uint32_t>(warp_arrive(v, site, m)[(cur % 32 ^ o) & 31]);
}
inline bool any(unsigned m, bool p, int site) {
  const uint64_t* a = warp_arrive(p, site, m);
  for (int i = 0; i < 32; ++i) if (a[i]) return true;
  return false;
}
inline uint32_t reduce(unsigned m, uint32_t v, int op, int site) {   // op: 0 add, 1 max, 2 min
  const uint64_t* a = warp_arrive(v, site, m);
  uint32_t r = op == 2 ? 0xFFFFFFFFu : 0u;
  for (int i = 0; i < 32; ++i) {
    const uint32_t x = static_cast<uint32_t>(a[i]);
    r = op == 0 ? r + x : op == 1 ? max(r, x) : min(r, x);
  }
  return r;
}
template <typename T> inline void check_read(const T* p) {
  const char* c = reinterpret_cast<const char*>(p);
  if (c < row_lo || c + sizeof(T) > row_hi)
    error("global read outside the row (byte offset, row bytes)", c - row_lo, row_hi - row_lo);
  if (reinterpret_cast<uintptr_t>(p) % sizeof(T)) error("misaligned global read (bytes)", sizeof(T));
}

}  // namespace kreg_emu

namespace kreg_emu {
// A barrier of `size` fibers: the last to arrive releases the rest.
inline void arrive(Block& b, int size) {
  if (++b.count == size) {
    b.count = 0;
    for (int f : b.waiters) fibers[f].state = kRun;
    b.waiters.clear();
    yield();
  } else {
    fibers[cur].state = kWait; b.waiters.push_back(cur); yield();
  }
}
// The cluster's API (cooperative_groups::this_cluster(): block_rank, sync, map_shared_rank).
inline int cluster_rank() { return cta(); }
inline void cluster_sync() { arrive(cluster, nthreads * ncta); }
template <typename P> inline P* map_rank(P* p, int rank) {
  const char* c = reinterpret_cast<const char*>(p);
  const int me = cta();
  if (rank < 0 || rank >= ncta) { error("map_shared_rank: no such CTA (rank, CTAs)", rank, ncta); return p; }
  const char* d = reinterpret_cast<const char*>(shared_base[me]);
  if (c >= d && c + sizeof(P) <= d + shared_bytes)
    return reinterpret_cast<P*>(reinterpret_cast<char*>(shared_base[rank]) + (c - d));
  const char* st = static_shared_mem[me];
  if (c >= st && c + sizeof(P) <= st + sizeof(static_shared_mem[0]))
    return reinterpret_cast<P*>(static_shared_mem[rank] + (c - st));
  error("map_shared_rank of an address outside this CTA's shared memory (rank)", rank);
  return p;
}
}  // namespace kreg_emu

#define threadIdx kreg_emu::thread_idx[kreg_emu::cur]
#define blockIdx kreg_emu::block_idx[kreg_emu::cta()]
inline void __syncthreads() { kreg_emu::arrive(kreg_emu::block[kreg_emu::cta()], kreg_emu::nthreads); }
#define __shfl_up_sync(m, v, o) kreg_emu::shfl_up((m), (v), (o), __LINE__)
#define __shfl_sync(m, v, s) kreg_emu::shfl((m), (v), (s), __LINE__)
#define __shfl_xor_sync(m, v, o) kreg_emu::shfl_xor((m), (v), (o), __LINE__)
#define __any_sync(m, p) kreg_emu::any((m), (p), __LINE__)
#define __reduce_add_sync(m, v) kreg_emu::reduce((m), (v), 0, __LINE__)
#define __reduce_max_sync(m, v) kreg_emu::reduce((m), (v), 1, __LINE__)
#define __reduce_min_sync(m, v) kreg_emu::reduce((m), (v), 2, __LINE__)
inline uint32_t atomicAdd(uint32_t* p, uint32_t v) {
  kreg_emu::maybe_yield(); const uint32_t o = *p; *p = o + v; return o;
}
inline int atomicAdd(int* p, int v) { const int o = *p; *p = o + v; return o; }
inline uint32_t atomicOr(uint32_t* p, uint32_t v) {
  kreg_emu::maybe_yield(); const uint32_t o = *p; *p = o | v; return o;
}
template <typename T> inline T __ldg(const T* p) {
  kreg_emu::maybe_yield(); kreg_emu::check_read(p); return *p;
}
template <typename T> inline T __ldcs(const T* p) {
  kreg_emu::maybe_yield(); kreg_emu::check_read(p); return *p;
}
