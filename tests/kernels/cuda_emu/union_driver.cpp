// Runs union_prep.cu's kernel (sparse_prefill's union pre-pass) on the CPU (cuda_emu.h), one CTA
// a tile, for tests/kernels/test_sparse_prefill_union_prep_emu.py. Build (the test does):
//   g++ -std=c++17 -O1 -DKREG_CUDA_EMU -Itests/kernels/cuda_emu -Ibackends/sparse_prefill/cuda
//       tests/kernels/cuda_emu/union_driver.cpp -o union_emu  (one line)
// Usage: union_emu IN OUT [MODE [COUNT_WORDS [STATS]]] (MODE and KREG_EMU_SEED as
// stream_driver.cpp's; COUNT_WORDS, the shared count words, at least and by default umax / 2: a
// union of U counts min(rp, COUNT_WORDS / ceil(U / 2)) rows at once; STATS 0: the kernel gets
// no LO / HI / NV and counts its tiles' rows itself, as without DENSE tiles; 2: the same, and
// it writes them out (lo_out / hi_out / nv_out), as with UNION_DENSE; default 1).
// IN: int32 header [total_q, s_it, topk, has_lens, num_ids, rp, tile0, ntiles, dense_span,
// union_pct, umax, by_req, page_size, s_pb, page table entries, tiles (FLAG's length),
// union_dense], then
// int32 arrays: ids [total_q * s_it], lens, LO, HI, NV [total_q each], FLAG [tiles] (as DENSE
// left it), the rows' requests [total_q], the page table.
// OUT: int32 FLAG [tiles], USZ [tiles], slots [ntiles * umax], counts [ntiles * rp * umax / 2],
// the written-out LO, HI, NV [total_q each], then the emulator's error count. USZ, slots,
// counts and the written-out statistics start as a poison value, with poisoned guards around
// them.
#include <cstdio>
#include <vector>

#include "emu_launch.h"
#include "union_prep.cu"

namespace {

void call(void* p) { union_prep_kernel(*static_cast<Params*>(p)); }

bool read_all(FILE* f, std::vector<int32_t>& v) {
  return fread(v.data(), 4, v.size(), f) == v.size();
}

}  // namespace

int main(int argc, char** argv) {
  int32_t h[17];
  FILE* f = kreg_emu::open_input(argc, argv, h, 17);
  if (!f) return 2;
  const int total_q = h[0], s_it = h[1], topk = h[2], has_lens = h[3], num_ids = h[4], rp = h[5];
  const int tile0 = h[6], ntiles = h[7], dense_span = h[8], union_pct = h[9], umax = h[10];
  const int by_req = h[11], page_size = h[12], s_pb = h[13], pt_len = h[14], tiles = h[15];
  const int union_dense = h[16];
  std::vector<int32_t> ids(static_cast<size_t>(total_q) * s_it), lens(total_q), lo(total_q),
      hi(total_q), nv(total_q), flag(tiles), row_req(total_q), pt(pt_len);
  if (!read_all(f, ids) || !read_all(f, lens) || !read_all(f, lo) || !read_all(f, hi) ||
      !read_all(f, nv) || !read_all(f, flag) || !read_all(f, row_req) || !read_all(f, pt)) {
    fprintf(stderr, "short input\n");
    return 2;
  }
  fclose(f);
  constexpr int G = 64;   // poisoned guard entries either side of each output
  constexpr int32_t POISON = 0x77777777;
  const size_t n_slots = static_cast<size_t>(ntiles) * umax;
  const size_t n_cnt = static_cast<size_t>(ntiles) * rp * (umax / 2);
  std::vector<int32_t> usz(tiles + 2 * G, POISON), slots(n_slots + 2 * G, POISON),
      cnt(n_cnt + 2 * G, POISON), lo_out(total_q + 2 * G, POISON),
      hi_out(total_q + 2 * G, POISON), nv_out(total_q + 2 * G, POISON);
  Params p{ids.data(), s_it, has_lens ? lens.data() : nullptr, lo.data(), hi.data(), nv.data(),
           flag.data(), usz.data() + G, slots.data() + G, umax, cnt.data() + G,
           static_cast<int64_t>(rp) * (umax / 2), umax / 2, by_req ? row_req.data() : nullptr,
           pt.data(), s_pb, page_size, num_ids, topk, tile0, total_q, rp, dense_span, union_pct,
           union_dense, (num_ids + 31) / 32, umax / 2, 0};
  const int count_words = argc > 4 ? atoi(argv[4]) : 0;
  const int stats = argc > 5 ? atoi(argv[5]) : 1;
  if (stats != 1) p.lo = p.hi = p.nv = nullptr;
  if (stats == 2) {
    p.lo_out = lo_out.data() + G;
    p.hi_out = hi_out.data() + G;
    p.nv_out = nv_out.data() + G;
  }
  p.count_words = count_words > umax / 2 ? count_words : umax / 2;   // as kreg_union_prep
  kreg_emu::row_lo = reinterpret_cast<const char*>(ids.data());   // the ids are read by __ldg
  kreg_emu::row_hi = kreg_emu::row_lo + ids.size() * 4;
  const size_t words = 2 * static_cast<size_t>(p.words) + p.count_words;
  for (int lt = 0; lt < ntiles; ++lt)
    kreg_emu::run_cluster(THREADS, 1, words, static_cast<unsigned>(lt), &call, &p, lt);
  for (auto* v : {&usz, &slots, &cnt, &lo_out, &hi_out, &nv_out})
    for (int i = 0; i < G; ++i)
      if ((*v)[i] != POISON || (*v)[v->size() - 1 - i] != POISON) {
        kreg_emu::error("write outside an output");
        break;
      }
  FILE* o = fopen(argv[2], "wb");
  if (!o) { perror(argv[2]); return 2; }
  const int32_t errs = static_cast<int32_t>(kreg_emu::errors);
  fwrite(flag.data(), 4, tiles, o);
  fwrite(usz.data() + G, 4, tiles, o);
  fwrite(slots.data() + G, 4, n_slots, o);
  fwrite(cnt.data() + G, 4, n_cnt, o);
  for (auto* v : {&lo_out, &hi_out, &nv_out}) fwrite(v->data() + G, 4, total_q, o);
  fwrite(&errs, 4, 1, o);
  fclose(o);
  return 0;
}
