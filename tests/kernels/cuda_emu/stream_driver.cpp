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
#include <random>

#include "cuda_emu.h"
#include "stream_topk.cu"

namespace {

std::mt19937 rng(12345);
int mode = 0;
std::vector<kreg_emu::Fiber>* fiber_store;
void (*body)(void*);
void* body_arg;

void entry() {
  body(body_arg);
  kreg_emu::fibers[kreg_emu::cur].state = kreg_emu::kDone;
  swapcontext(&kreg_emu::fibers[kreg_emu::cur].ctx, &kreg_emu::scheduler);
}

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
  std::vector<std::vector<uint32_t>> smem(S, std::vector<uint32_t>(words + 64));
  nthreads = THREADS;
  ncta = S;
  shared_bytes = words * 4;
  const int NF = THREADS * S;
  std::vector<Fiber> fib(NF);
  for (auto& f : fib) f.stack.resize(1 << 17);
  fibers = fib.data();
  body = &Launch<T, THREADS>::call;
  body_arg = &launch;
  for (int r = 0; r < rows; ++r) {
    std::vector<std::vector<uint32_t>> guard(S);
    for (int c = 0; c < S; ++c) {
      for (auto& x : smem[c]) x = rng();   // garbage shared memory
      for (auto& x : static_shared_mem[c]) x = static_cast<char>(rng());
      guard[c].assign(smem[c].begin() + words, smem[c].end());
      shared_base[c] = smem[c].data();
      block_idx[c] = {static_cast<unsigned>(r * S + c), 0, 0};
      block[c].count = 0;
      block[c].waiters.clear();
    }
    cluster.count = 0;
    cluster.waiters.clear();
    const int len = min(max(launch.lengths[r * launch.len_stride], 0), launch.n);
    row_lo = reinterpret_cast<const char*>(launch.scores + r * launch.row_stride);
    row_hi = row_lo + static_cast<size_t>(len) * sizeof(T);
    for (int t = 0; t < NF; ++t) {
      thread_idx[t] = {static_cast<unsigned>(t % THREADS), 0, 0};
      getcontext(&fib[t].ctx);
      fib[t].ctx.uc_stack.ss_sp = fib[t].stack.data();
      fib[t].ctx.uc_stack.ss_size = fib[t].stack.size();
      fib[t].ctx.uc_link = nullptr;
      makecontext(&fib[t].ctx, entry, 0);
      fib[t].state = kRun;
    }
    for (auto& w : warps) { w.count = 0; w.gen = 0; w.waiters.clear(); }
    std::vector<int> runnable;
    std::vector<uint32_t> prio(NF);
    for (auto& x : prio) x = rng();
    for (;;) {
      runnable.clear();
      int done = 0;
      for (int t = 0; t < NF; ++t) {
        if (fib[t].state == kRun) runnable.push_back(t);
        else if (fib[t].state == kDone) ++done;
      }
      if (done == NF) break;
      if (runnable.empty()) { error("deadlock (row, threads done)", r, done); break; }
      if (mode == 0) {
        cur = runnable[rng() % runnable.size()];
      } else {   // the highest priority runs; now and then one thread gets a new priority
        if (rng() % 64 == 0) prio[runnable[rng() % runnable.size()]] = rng();
        cur = runnable[0];
        for (int t : runnable) if (prio[t] > prio[cur]) cur = t;
      }
      swapcontext(&scheduler, &fib[cur].ctx);
    }
    for (int c = 0; c < S; ++c)
      if (!std::equal(guard[c].begin(), guard[c].end(), smem[c].begin() + words))
        error("write past the dynamic shared memory (row, CTA)", r, c);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s IN OUT [MODE]\n", argv[0]); return 2; }
  if (argc > 3) mode = atoi(argv[3]);
  if (const char* s = getenv("KREG_EMU_SEED")) rng.seed(static_cast<unsigned>(atoi(s)));
  FILE* f = fopen(argv[1], "rb");
  if (!f) { perror(argv[1]); return 2; }
  int32_t h[11];
  if (fread(h, 4, 11, f) != 11) { fprintf(stderr, "short header\n"); return 2; }
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
