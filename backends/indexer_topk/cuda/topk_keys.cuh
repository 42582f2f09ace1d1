// kreg's order keys for the indexer_topk CUDA kernels (cluster_topk.cu, stream_topk.cu).
//
// A score's key is unsigned and orders as the scores do: -0.0 = +0.0, negative values flip their
// magnitude bits, NaN sorts below every number (key 1), and 0 means "no key" (a position past the
// row's length), so every real key is >= 1. fp32 keys are 32-bit; bf16 and fp16 keys are the same
// order over the 16-bit pattern.
#pragma once
#include <cstdint>
#ifndef KREG_CUDA_EMU   // (the CPU emulator of tests/kernels/cuda_emu brings its own stand-ins)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace kreg_topk {

__device__ __forceinline__ uint32_t order_u(uint32_t bits) {
  // kreg's key: -0.0 -> +0.0; negative floats flip their magnitude bits; NaN -> INT32_MIN + 1;
  // u = key ^ 0x80000000, so unsigned order is score order and every real key has u >= 1.
  if (bits == 0x80000000u) bits = 0u;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  const uint32_t key = (bits & 0x80000000u) ? (bits ^ 0x7FFFFFFFu) : bits;
  return nan ? 1u : (key ^ 0x80000000u);
}

// The same order on a 16-bit pattern (bf16: NaN above 0x7F80; fp16: above 0x7C00): -0 -> +0,
// negative values flip their magnitude bits, NaN -> 1, every real key >= 1 (0 = no key).
template <uint32_t INF>
__device__ __forceinline__ uint32_t order_u16(uint32_t h) {
  if (h == 0x8000u) h = 0u;
  const bool nan = (h & 0x7FFFu) > INF;
  const uint32_t key = (h & 0x8000u) ? (h ^ 0x7FFFu) : h;
  return nan ? 1u : (key ^ 0x8000u);
}

// Order keys of a score type: KB bytes a key (4: fp32; 2: bf16 / fp16 as their 16-bit pattern),
// NV keys in 16 bytes of scores (the same count as keys in 16 bytes of shared memory).
template <typename T> struct Keys;
template <> struct Keys<float> {
  static constexpr int KB = 4, NV = 4;
  __device__ static uint32_t key(uint32_t bits) { return order_u(bits); }
  __device__ static uint32_t bits1(const float* p) { return __float_as_uint(__ldg(p)); }
};
template <> struct Keys<__nv_bfloat16> {
  static constexpr int KB = 2, NV = 8;
  __device__ static uint32_t key(uint32_t h) { return order_u16<0x7F80u>(h); }
  __device__ static uint32_t bits1(const __nv_bfloat16* p) {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
  }
};
template <> struct Keys<__half> {
  static constexpr int KB = 2, NV = 8;
  __device__ static uint32_t key(uint32_t h) { return order_u16<0x7C00u>(h); }
  __device__ static uint32_t bits1(const __half* p) {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
  }
};

// a > b and a == b as 0 / 1 from integer arithmetic. The selection builds its per-thread masks
// of NV keys from these: written as `mask |= (a > b) << e`, ptxas (CUDA 13.0, sm_90a) packed the
// eight predicates of the 2-byte kernel into a register with P2R after some of them had been
// overwritten (the above-the-bin count took in-bin keys; wrong offsets, lost entries).
__device__ __forceinline__ uint32_t above_bit(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((static_cast<uint64_t>(b) - a) >> 63);
}
__device__ __forceinline__ uint32_t equal_bit(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((static_cast<uint64_t>(a ^ b) - 1u) >> 63);
}

}  // namespace kreg_topk
