// The union path's pre-pass in one kernel (sparse_prefill, issue 26; UNION_PREP="cuda").
//
// The Triton pre-pass (backends/sparse_prefill/tile_kernels.py: _union_gate, _union_mark,
// _union_size, _union_count) is four launches whose bitmaps, prefixes and 16-bit counts live in
// global memory and are built by global atomics: 25-36% of the union path's time on the H200
// (docs/notes/sparse_prefill.md, "Session 18"). Here one CTA a tile does the same work with the
// tile's bitmap, word prefixes and its rows' counts (a group of rows at a time) in shared
// memory, and writes exactly what the four launches write for the union kernel (_union_fwd):
// FLAG and USZ of every tile, and for a union tile its slots (ascending; chunk positions
// translated through the request's page table) and its rows' 16-bit multiplicities at every
// union position. The decision is the Triton pre-pass's, step for step:
//   * a tile DENSE takes keeps its FLAG (USZ 0); a tile without valid entries is union with
//     U = 0 (FLAG 2); a chunk tile whose first and last rows are in different requests, and a
//     tile whose gate fails, is gathered (FLAG 0);
//   * UNION_DENSE (union_dense > 0, the pre-pass run before the dense kernels): every tile's
//     FLAG is written here, DENSE's tiles included: a tile DENSE's rule takes is tried as the
//     others are and goes union when also U * 100 <= span * union_dense, else stays dense
//     (FLAG 1: a failed gate, a span past the shared memory, no valid entries); the dense
//     kernels then read FLAG. A dense tile whose largest row has more valid entries than
//     union_dense % of the span (max NV * 100 > span * union_dense) stays dense ungated: the
//     union holds that row's slots (its duplicates counted here), so it could rarely pass;
//   * the gate: the first row's slots marked, the last row's valid entries and hits on them
//     counted: estimate = n_first + (rows - 1) * (n_last - hits); gated when
//     estimate * RP * 100 <= 2 * (valid entries of the tile's rows) * union_pct;
//   * a gated tile marks every row, counts the union exactly (U) and goes union when
//     U * RP * 100 <= (valid entries) * union_pct.
// An entry is valid when 0 <= id < num_ids and it lies within its row's length (lens, clamped to
// [0, topk]); a slot listed twice counts twice. The bitmap covers the tile's span
// [lo >> 5, hi >> 5] (LO / HI / NV: the rows' statistics, backends/sparse_prefill's
// _row_stats, or without them the same statistics of the tile's rows from a first pass over
// their ids here, a warp a row: one launch and the statistics' writes and reads fewer, and the
// ids the marks read again come from L2; with UNION_DENSE the kernel writes them out for the
// dense kernels that run after it, in _row_stats' place); a span wider than the shared
// memory holds hands the tile to the gathering kernel (never a wrong answer; the host sizes
// the memory for the whole id range).
//
// Host entry: `kreg_union_prep` (extern "C"; backends/sparse_prefill/union_prep.py).
// Under -DKREG_CUDA_EMU only the kernel is compiled (tests/kernels/cuda_emu, the CPU emulator).
#include <cstdint>
#ifdef KREG_CUDA_EMU
#include "cuda_emu.h"
#else
#include <cuda_runtime.h>
#endif

namespace {

constexpr int THREADS = 512;
constexpr int WARPS = THREADS / 32;
#ifndef UNION_PREP_LPT   // a thread's id loads in flight a row (see for_row_ids): 8 = one batch
                         // for rows of up to 4096 entries
#define UNION_PREP_LPT 8
#endif
constexpr int LPT = UNION_PREP_LPT;
constexpr int RLPT = 16;   // a lane's id loads in flight in the statistics' pass (a warp a row)

struct Params {
  const int32_t* idx;        // [total_q, s_it] ids (slots, or chunk positions)
  int64_t s_it;
  const int32_t* lens;       // null: every row has topk entries
  const int32_t* lo;         // per row: least / greatest valid id (num_ids / -1 when none);
  const int32_t* hi;         // all three null: the kernel counts its tile's rows itself
  const int32_t* nv;         // per row: valid entries
  int32_t* flag;             // per tile (global tile index): 0 gather, 1 dense, 2 union
  int32_t* usz;              // per tile: U (0 unless union)
  int32_t* slots;            // [chunk, s_lt]: the union's slots ascending
  int64_t s_lt;
  int32_t* cnt;              // [chunk, RP, s_cr]: 16-bit multiplicities, two a word
  int64_t s_ct;
  int64_t s_cr;
  const int32_t* row_req;    // null, or per row its request (ids are chunk positions)
  const int32_t* pt;         // the page table (row_req only)
  int64_t s_pb;
  int page_size;
  int num_ids;
  int topk;
  int tile0;
  int total_q;
  int rp;
  int dense_span;            // DENSE's threshold (0: no DENSE)
  int union_pct;
  int union_dense;           // UNION_DENSE's threshold (0: DENSE's tiles keep their FLAG)
  int words;                 // bitmap words the shared memory holds
  int half_max;              // count words a row may need (umax / 2)
  int count_words;           // count words the shared memory holds (>= half_max): a union of
                             // U counts min(RP, count_words / ceil(U / 2)) rows at once
  int32_t* lo_out;           // without LO / HI / NV: null, or per row [total_q] the rows'
  int32_t* hi_out;           // statistics as the kernel counts them (its tiles' rows only),
  int32_t* nv_out;           // as _row_stats writes them
};

struct Shared {
  int32_t red[2][WARPS];
  int32_t part[WARPS];
  int32_t part0[WARPS];
  int32_t partm[WARPS];      // a warp's largest row NV (UNION_DENSE's skip)
  int64_t nv;
  int32_t nv0;               // the first row's valid entries (the gate's)
  int32_t lo, hi, go, dense, run, gate, u;
  int64_t span;              // the tile's hi - lo + 1 (UNION_DENSE's rule)
};
// union_prep.py's MAX_SHARED leaves the opt-in limit 512 bytes for this static part
static_assert(sizeof(Shared) <= 512, "Shared outgrew the room union_prep.py leaves it");

__device__ __forceinline__ int row_len(const Params& p, int r) {
  if (r >= p.total_q) return 0;
  if (p.lens == nullptr) return p.topk;
  const int n = p.lens[r];
  return n < 0 ? 0 : (n < p.topk ? n : p.topk);
}

__device__ __forceinline__ const int32_t* row_ids(const Params& p, int r) {
  return p.idx + static_cast<int64_t>(r) * p.s_it;
}

// sum of v over the CTA (every thread gets it); `slot` picks one of two reduction buffers so
// that two sums may follow each other with a single barrier between their uses
__device__ __forceinline__ int block_sum(Shared& sh, int v, int slot) {
  v = static_cast<int>(__reduce_add_sync(0xFFFFFFFFu, static_cast<uint32_t>(v)));
  if (threadIdx.x % 32 == 0) sh.red[slot][threadIdx.x / 32] = v;
  __syncthreads();
  int s = 0;
  for (int w = 0; w < WARPS; ++w) s += sh.red[slot][w];
  return s;
}

// a thread's LPT entries of row r (length n) from entry `base` on, strided over the CTA; a
// slot past the row's length reads as -1, which every caller skips as invalid
__device__ __forceinline__ void load_batch(const int32_t* ids, int n, int base, int (&v)[LPT]) {
#pragma unroll
  for (int u = 0; u < LPT; ++u) {
    const int j = base + static_cast<int>(threadIdx.x) + u * THREADS;
    v[u] = j < n ? __ldg(ids + j) : -1;
  }
}

// f(id) for each of row r's entries, a thread's loads issued LPT at a time before any is used
// (the loads of one row are independent: one latency a batch, not one an entry; ptxas does not
// move a later load above a shared-memory atomic by itself)
template <typename F>
__device__ __forceinline__ void for_row_ids(const Params& p, int r, F&& f) {
  const int n = row_len(p, r);
  const int32_t* ids = row_ids(p, r);
  for (int base = 0; base < n; base += LPT * THREADS) {
    int v[LPT];
    load_batch(ids, n, base, v);
#pragma unroll
    for (int u = 0; u < LPT; ++u) f(v[u]);
  }
}

// set id s's bit if it is valid (in [0, num_ids) and within the bitmap's span of nw words)
__device__ __forceinline__ void mark_id(const Params& p, uint32_t* bits, int w_lo, int nw,
                                        int s) {
  const int w = (s >> 5) - w_lo;
  if (s >= 0 && s < p.num_ids && w >= 0 && w < nw) atomicOr(bits + w, 1u << (s & 31));
}

// set the bits of a thread's loaded ids (a batch of one row, strided as load_batch loads
// them), one atomic an id
__device__ __forceinline__ void mark_ids(const Params& p, uint32_t* bits, int w_lo, int nw,
                                         const int (&v)[LPT]) {
#pragma unroll
  for (int q = 0; q < LPT; ++q) mark_id(p, bits, w_lo, nw, v[q]);
}

// set the bit of every valid id of row r
__device__ __forceinline__ void mark_row(const Params& p, uint32_t* bits, int w_lo, int nw,
                                         int r) {
  for_row_ids(p, r, [&](int s) { mark_id(p, bits, w_lo, nw, s); });
}

__global__ void __launch_bounds__(THREADS, 2) union_prep_kernel(Params p) {
#ifdef KREG_CUDA_EMU
  uint32_t* smem = kreg_emu::dynamic_shared();
  Shared& sh = kreg_emu::static_shared<Shared>();
#else
  extern __shared__ uint32_t smem[];
  __shared__ Shared sh;
#endif
  uint32_t* bits = smem;                 // [words]
  uint32_t* pre = smem + p.words;        // [words]: set bits before each word
  uint32_t* cs = pre + p.words;          // [count_words]: a group of rows' counts
  const int lt = blockIdx.x;
  const int t = p.tile0 + lt;
  const int r0 = t * p.rp;
  const int tid = threadIdx.x;

  const bool one_batch = p.topk <= LPT * THREADS;   // a row's ids are one batch of loads
  const int rows = min(p.total_q - r0, p.rp);
  const int r1 = r0 + rows - 1;

  // the tile's statistics (from LO / HI / NV a thread a row, or from the rows' ids, then warp
  // and CTA reductions) and the first decisions (DENSE's tile, an empty one, mixed requests)
  {
    uint32_t lo = 2147483647u, hi1 = 0u, nvr = 0u, nv0 = 0u;   // hi + 1 (HI is -1 if none)
    uint32_t nvm = 0u;   // the largest row NV (UNION_DENSE's skip)
    if (p.lo != nullptr) {
      for (int i = tid; i < p.rp; i += THREADS) {
        const int r = r0 + i;
        if (r < p.total_q) {
          lo = min(lo, static_cast<uint32_t>(p.lo[r]));
          hi1 = max(hi1, static_cast<uint32_t>(p.hi[r] + 1));
          nvr += static_cast<uint32_t>(p.nv[r]);
          nvm = max(nvm, static_cast<uint32_t>(p.nv[r]));
        }
      }
      nv0 = tid == 0 ? static_cast<uint32_t>(p.nv[r0]) : 0u;
    } else {
      // a warp a row (rows w, w + WARPS, ..): its least / greatest valid id and valid entries,
      // RLPT coalesced loads a lane in flight at a time, then warp reductions; written out as
      // the row's LO / HI / NV when the host asks (UNION_DENSE: the dense kernels read them)
      const int lane = tid % 32;
      for (int i = tid / 32; i < rows; i += WARPS) {
        const int r = r0 + i;
        const int n = row_len(p, r);
        const int32_t* ids = row_ids(p, r);
        uint32_t rlo = 2147483647u, rhi1 = 0u, rn = 0u;
        for (int base = 0; base < n; base += 32 * RLPT) {
          int v[RLPT];
#pragma unroll
          for (int u = 0; u < RLPT; ++u) {
            const int j = base + lane + 32 * u;
            v[u] = j < n ? __ldg(ids + j) : -1;
          }
#pragma unroll
          for (int u = 0; u < RLPT; ++u) {
            if (v[u] >= 0 && v[u] < p.num_ids) {
              rlo = min(rlo, static_cast<uint32_t>(v[u]));
              rhi1 = max(rhi1, static_cast<uint32_t>(v[u]) + 1u);
              ++rn;
            }
          }
        }
        rlo = __reduce_min_sync(0xFFFFFFFFu, rlo);
        rhi1 = __reduce_max_sync(0xFFFFFFFFu, rhi1);
        rn = __reduce_add_sync(0xFFFFFFFFu, rn);
        if (lane == 0 && p.lo_out != nullptr) {
          p.lo_out[r] = rn > 0u ? static_cast<int32_t>(rlo) : p.num_ids;
          p.hi_out[r] = static_cast<int32_t>(rhi1) - 1;
          p.nv_out[r] = static_cast<int32_t>(rn);
        }
        lo = min(lo, rlo);
        hi1 = max(hi1, rhi1);
        nvm = max(nvm, rn);
        // the sums below add every lane's share: lane 0 holds the warp's rows
        if (lane == 0) {
          nvr += rn;
          nv0 += i == 0 ? rn : 0u;
        }
      }
    }
    lo = __reduce_min_sync(0xFFFFFFFFu, lo);
    hi1 = __reduce_max_sync(0xFFFFFFFFu, hi1);
    nvr = __reduce_add_sync(0xFFFFFFFFu, nvr);
    nv0 = __reduce_add_sync(0xFFFFFFFFu, nv0);
    nvm = __reduce_max_sync(0xFFFFFFFFu, nvm);
    if (tid % 32 == 0) {
      sh.red[0][tid / 32] = static_cast<int32_t>(lo);
      sh.red[1][tid / 32] = static_cast<int32_t>(hi1);
      sh.part[tid / 32] = static_cast<int32_t>(nvr);
      sh.part0[tid / 32] = static_cast<int32_t>(nv0);
      sh.partm[tid / 32] = static_cast<int32_t>(nvm);
    }
  }
  __syncthreads();
  if (tid == 0) {
    int lo = 2147483647, hi = -1, nv0 = 0, nvm = 0;
    int64_t nv = 0;
    for (int w = 0; w < WARPS; ++w) {
      lo = min(lo, sh.red[0][w]);
      hi = max(hi, sh.red[1][w] - 1);
      nv += sh.part[w];
      nv0 += sh.part0[w];
      nvm = max(nvm, sh.partm[w]);
    }
    bool dense = false;
    const int64_t span = max(hi - lo + 1, 0);
    if (p.dense_span > 0) dense = span * p.rp * 100 <= nv * p.dense_span;
    // UNION_DENSE tries a dense tile unless its largest row alone is past the threshold
    const bool try_dense =
        p.union_dense > 0 && static_cast<int64_t>(nvm) * 100 <= span * p.union_dense;
    const bool go = hi >= lo && (!dense || try_dense);
    bool mixed = false;
    if (p.row_req != nullptr) {
      const int r_last = min(r0 + p.rp, p.total_q) - 1;
      mixed = p.row_req[r0] != p.row_req[r_last];
    }
    const int nw = go ? (hi >> 5) - (lo >> 5) + 1 : 0;
    sh.lo = lo;
    sh.hi = hi;
    sh.nv = nv;
    sh.nv0 = nv0;
    sh.go = go;
    sh.dense = dense;
    sh.span = span;
    sh.run = go && !mixed && nw <= p.words;
  }
  __syncthreads();
  // not gated: DENSE's tile keeps its FLAG (with UNION_DENSE it is written: 1), an empty one
  // is union with U = 0
  if (!sh.run) {
    if (tid == 0) {
      if (sh.dense) {
        if (p.union_dense > 0) p.flag[t] = 1;
      } else {
        p.flag[t] = sh.go ? 0 : 2;
      }
      p.usz[t] = 0;
    }
    return;
  }
  const int w_lo = sh.lo >> 5;
  const int nw = (sh.hi >> 5) - w_lo + 1;
  const int64_t nv = sh.nv;

  // the gate: the first row's bits, then the last row's valid entries and hits on them (rows
  // of one batch: both rows' ids loaded first, their latency under the clear)
  {
    int v1 = 0, h1 = 0;
    auto hit = [&](int s) {
      const int w = (s >> 5) - w_lo;
      if (s >= 0 && s < p.num_ids && w >= 0 && w < nw) {
        ++v1;
        h1 += (bits[w] >> (s & 31)) & 1u;
      }
    };
    if (one_batch) {
      int va[LPT], vb[LPT];
      load_batch(row_ids(p, r0), row_len(p, r0), 0, va);
      load_batch(row_ids(p, r1), row_len(p, r1), 0, vb);
      for (int w = tid; w < nw; w += THREADS) bits[w] = 0u;
      __syncthreads();
      mark_ids(p, bits, w_lo, nw, va);
      __syncthreads();
#pragma unroll
      for (int q = 0; q < LPT; ++q) hit(vb[q]);
    } else {
      for (int w = tid; w < nw; w += THREADS) bits[w] = 0u;
      __syncthreads();
      mark_row(p, bits, w_lo, nw, r0);
      __syncthreads();
      for_row_ids(p, r1, hit);
    }
    v1 = block_sum(sh, v1, 0);
    h1 = block_sum(sh, h1, 1);
    const int64_t est = static_cast<int64_t>(sh.nv0) +
                        static_cast<int64_t>(rows - 1) * max(v1 - h1, 0);
    if (!(est * p.rp * 100 <= 2 * nv * p.union_pct)) {
      if (tid == 0) {
        p.flag[t] = sh.dense ? 1 : 0;
        p.usz[t] = 0;
      }
      return;
    }
  }

  // every other row's bits (rows of one batch two at a time: 2 x LPT loads in flight before
  // their marks); the exact union size and each word's prefix
  if (one_batch) {
    for (int i = 1; i < rows; i += 2) {
      int va[LPT], vb[LPT];
      load_batch(row_ids(p, r0 + i), row_len(p, r0 + i), 0, va);
      const bool two = i + 1 < rows;
      load_batch(row_ids(p, r0 + i + (two ? 1 : 0)), two ? row_len(p, r0 + i + 1) : 0, 0, vb);
      mark_ids(p, bits, w_lo, nw, va);
      mark_ids(p, bits, w_lo, nw, vb);
    }
  } else {
    for (int i = 1; i < rows; ++i) mark_row(p, bits, w_lo, nw, r0 + i);
  }
  __syncthreads();
  const int per = (nw + THREADS - 1) / THREADS;   // a thread's run of words
  const int wa = min(tid * per, nw), wb = min(wa + per, nw);
  int mine = 0;
  for (int w = wa; w < wb; ++w) mine += __popc(bits[w]);
  // exclusive scan of `mine` over the CTA (warp scans, then the warps' totals)
  int incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = static_cast<int>(__shfl_up_sync(0xFFFFFFFFu, static_cast<uint32_t>(incl), o));
    if (tid % 32 >= o) incl += y;
  }
  if (tid % 32 == 31) sh.red[0][tid / 32] = incl;
  __syncthreads();
  int before = incl - mine, u = 0;
  for (int w = 0; w < WARPS; ++w) {
    const int x = sh.red[0][w];
    if (w < tid / 32) before += x;
    u += x;
  }
  for (int w = wa; w < wb; ++w) {
    pre[w] = static_cast<uint32_t>(before);
    before += __popc(bits[w]);
  }
  const bool is_union = static_cast<int64_t>(u) * p.rp * 100 <= nv * p.union_pct &&
                        (!sh.dense || static_cast<int64_t>(u) * 100 <= sh.span * p.union_dense);
  if (tid == 0) {
    p.flag[t] = is_union ? 2 : (sh.dense ? 1 : 0);
    p.usz[t] = is_union ? u : 0;
  }
  if (!is_union) return;
  __syncthreads();   // every prefix written

  // the union's ids ascending: a set bit's position = its word's prefix + set bits below it
  int32_t* slots = p.slots + static_cast<int64_t>(lt) * p.s_lt;
  const int32_t* pt_row = p.row_req != nullptr
      ? p.pt + static_cast<int64_t>(p.row_req[r0]) * p.s_pb : nullptr;
  for (int w = tid; w < nw; w += THREADS) {
    uint32_t b = bits[w];
    int pos = static_cast<int>(pre[w]);
    while (b != 0u) {
      const int bit = __ffs(static_cast<int>(b)) - 1;
      int id = (w_lo + w) * 32 + bit;
      if (pt_row != nullptr) id = pt_row[id / p.page_size] * p.page_size + id % p.page_size;
      slots[pos++] = id;
      b &= b - 1u;
    }
  }

  // each row's multiplicities (the tile's RP rows; rows past total_q are zeros), a group of
  // rows at once: as many rows' count words as the shared memory holds (ceil(U / 2) a row),
  // so a group costs two barriers, not each row, and its copy-out is one flat loop
  const int half = (u + 1) >> 1;
  const int grp = min(p.rp, max(1, p.count_words / max(half, 1)));
  int32_t* cnt_t = p.cnt + static_cast<int64_t>(lt) * p.s_ct;
  uint32_t* cr = cs;   // the counted row's words (cs + its place in the group)
  auto pos_of = [&](int s) {   // s's place in the union, or -1 for an invalid entry
    const int w = (s >> 5) - w_lo;
    if (s >= 0 && s < p.num_ids && w >= 0 && w < nw)
      return static_cast<int>(pre[w]) + __popc(bits[w] & ((1u << (s & 31)) - 1u));
    return -1;
  };
  // one atomic an entry, on its 16-bit field of the row's words (a field holds at most
  // topk <= 65535)
  auto count = [&](int s) {
    const int pos = pos_of(s);
    if (pos >= 0) atomicAdd(cr + (pos >> 1), 1u << ((pos & 1) * 16));
  };
  // Rows of one batch (topk <= LPT x THREADS): the next row's ids are loaded as soon as this
  // row's are counted, so their latency passes under the counting, the barriers and the
  // copy-out. (A thread clears, for the next group, only words it copied out itself: the
  // flat loops give word c to the same thread each time, so no barrier between.)
  int v[LPT];
  if (one_batch) load_batch(row_ids(p, r0), row_len(p, r0), 0, v);
  for (int i0 = 0; i0 < p.rp; i0 += grp) {
    const int g = min(grp, p.rp - i0);
    const int n = g * half;
    for (int c = tid; c < n; c += THREADS) cs[c] = 0u;
    __syncthreads();   // cleared before any thread counts
    for (int j = 0; j < g; ++j) {
      const int i = i0 + j;
      cr = cs + j * half;
      if (one_batch) {
#pragma unroll
        for (int q = 0; q < LPT; ++q) count(v[q]);
        if (i + 1 < p.rp) load_batch(row_ids(p, r0 + i + 1), row_len(p, r0 + i + 1), 0, v);
      } else {
        for_row_ids(p, r0 + i, count);
      }
    }
    __syncthreads();
    for (int c = tid; c < n; c += THREADS) {
      const int j = c / half;
      cnt_t[(i0 + j) * p.s_cr + (c - j * half)] = static_cast<int32_t>(cs[c]);
    }
  }
}

}  // namespace

#ifndef KREG_CUDA_EMU
// Returns 0, or 1 (the shared memory the id range needs is over the device's limit), 2 (no
// current device, or its shared-memory limit could not be raised), 3 (the launch failed).
extern "C" int kreg_union_prep(const int32_t* idx, int64_t s_it, const int32_t* lens,
                               const int32_t* lo, const int32_t* hi, const int32_t* nv,
                               int32_t* flag, int32_t* usz, int32_t* slots, int64_t s_lt,
                               int32_t* cnt, int64_t s_ct, int64_t s_cr, const int32_t* row_req,
                               const int32_t* pt, int64_t s_pb, int page_size, int num_ids,
                               int topk, int tile0, int ntiles, int total_q, int rp,
                               int dense_span, int union_pct, int union_dense, int umax,
                               int count_words, int32_t* lo_out, int32_t* hi_out,
                               int32_t* nv_out, void* stream) {
  Params p{idx, s_it, lens, lo, hi, nv, flag, usz, slots, s_lt, cnt, s_ct, s_cr, row_req, pt,
           s_pb, page_size, num_ids, topk, tile0, total_q, rp, dense_span, union_pct,
           union_dense,
           (num_ids + 31) / 32, umax / 2, count_words > umax / 2 ? count_words : umax / 2,
           lo == nullptr ? lo_out : nullptr, hi_out, nv_out};
  const size_t bytes = (2 * static_cast<size_t>(p.words) + p.count_words) * 4;
  int dev = 0, limit = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return 2;
  if (bytes + sizeof(Shared) > static_cast<size_t>(limit)) return 1;
  if (cudaFuncSetAttribute(union_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess)
    return 2;
  if (ntiles <= 0) return 0;
  void* args[] = {&p};
  if (cudaLaunchKernel(reinterpret_cast<const void*>(union_prep_kernel), dim3(ntiles),
                       dim3(THREADS), args, bytes, static_cast<cudaStream_t>(stream)) != cudaSuccess)
    return 3;
  return 0;
}

// the shared memory a call needs (bytes) with count_words count words (at least umax / 2), for
// the host's check before it takes this path
extern "C" int64_t kreg_union_prep_smem(int num_ids, int umax, int count_words) {
  const int64_t cw = count_words > umax / 2 ? count_words : umax / 2;
  return (2 * static_cast<int64_t>((num_ids + 31) / 32) + cw) * 4 +
         static_cast<int64_t>(sizeof(Shared));
}
#endif  // !KREG_CUDA_EMU
