// The emulator's launcher (cuda_emu.h): runs one cluster of CTAs (or one CTA) of a kernel to
// completion, each CUDA thread a fiber, switched in a random order (mode 0) or with a few
// threads far ahead of the rest (mode 1). Shared memory starts as garbage; a guard after each
// CTA's dynamic shared memory catches writes past it. Used by the drivers beside it.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda_emu.h"

namespace kreg_emu {

inline std::mt19937 rng(12345);
inline int mode = 0;
inline void (*body)(void*);
inline void* body_arg;

inline void entry() {
  body(body_arg);
  fibers[cur].state = kDone;
  swapcontext(&fibers[cur].ctx, &scheduler);
}

// One cluster of `ctas` CTAs of `threads` threads, blocks first_block .. + ctas, each with
// `words` 32-bit words of dynamic shared memory; `fn(arg)` is every thread's body. `tag` names
// the cluster in error messages (a row, a tile).
inline void run_cluster(int threads, int ctas, size_t words, unsigned first_block,
                        void (*fn)(void*), void* arg, long tag) {
  std::vector<std::vector<uint32_t>> smem(ctas, std::vector<uint32_t>(words + 64));
  std::vector<std::vector<uint32_t>> guard(ctas);
  nthreads = threads;
  ncta = ctas;
  shared_bytes = words * 4;
  const int NF = threads * ctas;
  static std::vector<Fiber> fib;   // the fibers and their stacks, kept from call to call
  if (static_cast<int>(fib.size()) < NF) fib.resize(NF);
  for (int t = 0; t < NF; ++t)
    if (fib[t].stack.empty()) fib[t].stack.resize(1 << 17);
  fibers = fib.data();
  body = fn;
  body_arg = arg;
  for (int c = 0; c < ctas; ++c) {
    for (auto& x : smem[c]) x = rng();   // garbage shared memory
    for (auto& x : static_shared_mem[c]) x = static_cast<char>(rng());
    guard[c].assign(smem[c].begin() + words, smem[c].end());
    shared_base[c] = smem[c].data();
    block_idx[c] = {first_block + c, 0, 0};
    block[c].count = 0;
    block[c].waiters.clear();
  }
  cluster.count = 0;
  cluster.waiters.clear();
  for (int t = 0; t < NF; ++t) {
    thread_idx[t] = {static_cast<unsigned>(t % threads), 0, 0};
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
    if (runnable.empty()) { error("deadlock (cluster, threads done)", tag, done); break; }
    if (mode == 0) {
      cur = runnable[rng() % runnable.size()];
    } else {   // the highest priority runs; now and then one thread gets a new priority
      if (rng() % 64 == 0) prio[runnable[rng() % runnable.size()]] = rng();
      cur = runnable[0];
      for (int t : runnable) if (prio[t] > prio[cur]) cur = t;
    }
    swapcontext(&scheduler, &fib[cur].ctx);
  }
  for (int c = 0; c < ctas; ++c)
    if (!std::equal(guard[c].begin(), guard[c].end(), smem[c].begin() + words))
      error("write past the dynamic shared memory (cluster, CTA)", tag, c);
}

// A driver's start: `prog IN OUT [MODE]` (MODE 0 random order, 1 a few threads ahead; the seed
// from KREG_EMU_SEED), IN opened with its `nh`-int header read into h. Null (after a message)
// on a bad command line or input.
inline FILE* open_input(int argc, char** argv, int32_t* h, int nh) {
  if (argc < 3) { fprintf(stderr, "usage: %s IN OUT [MODE]\n", argv[0]); return nullptr; }
  if (argc > 3) mode = atoi(argv[3]);
  if (const char* s = getenv("KREG_EMU_SEED")) rng.seed(static_cast<unsigned>(atoi(s)));
  FILE* f = fopen(argv[1], "rb");
  if (!f) { perror(argv[1]); return nullptr; }
  if (fread(h, 4, nh, f) != static_cast<size_t>(nh)) {
    fprintf(stderr, "short header\n");
    fclose(f);
    return nullptr;
  }
  return f;
}

}  // namespace kreg_emu
