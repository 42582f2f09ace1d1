// Runs stream_topk.cu's kernel on the CPU (cuda_emu.h), one CTA a row, for
// tests/kernels/test_indexer_topk_stream_emu.py. Build (the test does):
//   g++ -std=c++17 -O1 -DKREG_CUDA_EMU -Itests/kernels/cuda_emu -Ibackends/indexer_topk/cuda \
//       tests/kernels/cuda_emu/stream_driver.cpp -o stream_emu
// Usage: stream_emu IN OUT [MODE] (MODE 0: random fiber order, 1: a few threads run ahead; SEED
// from the environment variable KREG_EMU_SEED). IN: int32 header [dtype (0 fp32, 1 bf16,
// 2 fp16), threads (256 or 512), rows, n, k, row_stride, offset (elements before row 0),
// len_stride, number of lengths, total elements, split (CTAs a row: 1, 2 or 4, a cluster)], the
// scores' raw elements, the int32 lengths.
// OUT: the int32 [rows, k] output, the kernel's stats int (extra reads), the emulator's error
// count. Shared memory starts as garbage and the output as a poison value; guards around both
// catch stray writes.
#include "emu_launch.h"
#include "stream_topk.cu"

namespace {

template <typename T, int THREADS>
struct Launch {
  const T* scores; int64_t row_stride; int n; const int32_t* lengths; int64_t len_stride; int k;
  int32_t* out; int* stats; int split;
  static void call(void* p) {
    auto* a = static_cast<Launch*>(p);
    stream_topk_kernel<T, THREADS, 1>(a->scores, a->row_stride, a->n, a->lengths, a->len_stride,
                                       a->k, a->out, a->stats, a->split);
  }
};

// rows clusters of `split` CTAs (split 1: a CTA a row), one cluster at a time
template <typename T, int THREADS>
void run(Launch<T, THREADS> launch, int rows) {
  using namespace kreg_emu;
  const int S = launch.split;
  const size_t words = static_cast<size_t>(CAP) * 2 + (launch.n + 31) / 32;
  for (int r = 0; r < rows; ++r) {
    const int len = min(max(launch.lengths[r * launch.len_stride], 0), launch.n);
    row_lo = reinterpret_cast<const char*>(launch.scores + r * launch.row_stride);
    row_hi = row_lo + static_cast<size_t>(len) * sizeof(T);
    run_cluster(THREADS, S, words, static_cast<unsigned>(r * S), &Launch<T, THREADS>::call,
                &launch, r);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int32_t h[11];
  FILE* f = kreg_emu::open_input(argc, argv, h, 11);
  if (!f) return 2;
  const int dtype = h[0], threads = h[1], rows = h[2], n = h[3], k = h[4];
  const int64_t row_stride = h[5], offset = h[6], len_stride = h[7], total = h[9];
  const int nlen = h[8], split = h[10];
  if (split != 1 && split != 2 && split != 4) { fprintf(stderr, "split %d\n", split); return 2; }
  const int es = dtype == 0 ? 4 : 2;
  std::vector<char> raw(total * es + 64);   // 16-byte aligned base
  char* base = raw.data() + ((16 - (reinterpret_cast<uintptr_t>(raw.data()) & 15)) & 15);
  std::vector<int32_t> lens(nlen);
  if (fread(base, es, total, f) != static_cast<size_t>(total) ||
      fread(lens.data(), 4, nlen, f) != static_cast<size_t>(nlen)) {
    fprintf(stderr, "short input\n");
    return 2;
  }
  fclose(f);
  constexpr int G = 64;   // poisoned guard entries either side of the output
  constexpr int32_t POISON = 0x77777777;
  std::vector<int32_t> outbuf(static_cast<size_t>(rows) * k + 2 * G, POISON);
  int32_t* out = outbuf.data() + G;
  int stats = 0;
  const char* sc = base + offset * es;
#define RUN(T)                                                                               \
  if (threads == 256)                                                                        \
    run<T, 256>({reinterpret_cast<const T*>(sc), row_stride, n, lens.data(), len_stride, k, \
                 out, &stats, split}, rows);                                                 \
  else                                                                                       \
    run<T, 512>({reinterpret_cast<const T*>(sc), row_stride, n, lens.data(), len_stride, k, \
                 out, &stats, split}, rows)
  if (dtype == 0) { RUN(float); } else if (dtype == 1) { RUN(__nv_bfloat16); } else { RUN(__half); }
  for (int i = 0; i < G; ++i)
    if (outbuf[i] != POISON || outbuf[G + static_cast<size_t>(rows) * k + i] != POISON) {
      kreg_emu::error("write outside the output");
      break;
    }
  FILE* o = fopen(argv[2], "wb");
  if (!o) { perror(argv[2]); return 2; }
  const int32_t errs = static_cast<int32_t>(kreg_emu::errors);
  fwrite(out, 4, static_cast<size_t>(rows) * k, o);
  fwrite(&stats, 4, 1, o);
  fwrite(&errs, 4, 1, o);
  fclose(o);
  return 0;
}
