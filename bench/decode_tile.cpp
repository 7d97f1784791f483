// fattn-decode-tile: the decode kernel's key tile, piece by piece, with K and V in cache
// (decode_tile.hpp). Where a tile's time goes — scores, online softmax, P·V, the next
// tile's prefetch — a key, against the FMAs the tile needs (docs/perf-log.md, 2026-12-08,
// "decode's tile in cycles"). One thread; run it on an idle machine.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "decode_tile.hpp"
#include "fattn/fattn.hpp"

namespace {

using fattn_bench::DecodeTileLoops;
using fattn_bench::TileElement;

const DecodeTileLoops* loops_for(const std::string& isa) {
#if defined(__x86_64__)
  if (isa == "avx512" || (isa == "auto" && fattn::cpu_supports(fattn::Isa::avx512)))
    return &fattn_bench::avx512_decode_tile;
  if (isa == "avx2" || (isa == "auto" && fattn::cpu_supports(fattn::Isa::avx2)))
    return &fattn_bench::avx2_decode_tile;
#endif
  if (isa == "portable" || isa == "auto") return &fattn_bench::portable_decode_tile;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "fattn-decode-tile: the decode kernel's key tile with K and V in cache, piece by piece\n"
      "(scores, online softmax, P·V, and the scores and the whole tile while the next tile\n"
      "is asked of memory), nanoseconds a key, best of several rounds, one thread.\n"
      "GFLOP/s counts 2·rows·D a key for the scores and for P·V, 4·rows·D for a tile."};
  std::string isa = "auto";
  std::vector<std::string> dtypes{"float32", "float16", "bfloat16"};
  std::vector<int> rows{4};
  std::vector<int> tiles{4, 40};
  std::int64_t head_dim = 128;
  int keys = 0;
  int rounds = 7;
  app.add_option("--isa", isa, "auto|avx512|avx2|portable (the table's vector width)")
      ->check(CLI::IsMember({"auto", "avx512", "avx2", "portable"}));
  app.add_option("--dtype", dtypes, "elements of K and V: float32|float16|bfloat16")
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}));
  app.add_option("--rows", rows, "query rows of the kv head (GQA group × queries)")
      ->check(CLI::Range(1, 64));
  app.add_option("--tiles", tiles, "key tiles cycled (4: K and V in L2; 40: in L3)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--head-dim", head_dim, "head dimension D")->check(CLI::Range(16, 256));
  app.add_option("--keys", keys, "keys of each tile taken (0: the whole tile; fewer: a last, partial tile)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--rounds", rounds, "timed rounds per piece (the best is reported)")
      ->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);

  const DecodeTileLoops* loops = loops_for(isa);
  if (!loops || (isa != "auto" && isa != "portable" &&
                 !fattn::cpu_supports(isa == "avx512" ? fattn::Isa::avx512 : fattn::Isa::avx2))) {
    std::fprintf(stderr, "fattn-decode-tile: --isa %s: this CPU or build does not have it\n", isa.c_str());
    return 2;
  }
  const std::map<std::string, TileElement> elements{
      {"float32", TileElement::float32}, {"float16", TileElement::float16}, {"bfloat16", TileElement::bfloat16}};
  std::printf("fattn-decode-tile, isa %s, D %lld, one thread; ns a key (GFLOP/s)\n", loops->isa,
              static_cast<long long>(head_dim));
  std::printf("| dtype | rows | tiles | keys | scores | softmax | P·V | tile | scores, prefetching | tile, prefetching |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const std::string& dtype : dtypes)
    for (int r : rows)
      for (int t : tiles) {
        fattn_bench::DecodeTileRequest request;
        request.element = elements.at(dtype);
        request.rows = r;
        request.tiles = t;
        request.head_dim = head_dim;
        request.keys = keys;
        request.rounds = rounds;
        const fattn_bench::DecodeTileTimes x = loops->run(request);
        const double half = 2.0 * r * static_cast<double>(head_dim);  // flops a key, one product
        auto cell = [](double ns, double flops) {
          char s[48];
          std::snprintf(s, sizeof s, "%.2f (%.0f)", ns, flops / ns);
          return std::string(s);
        };
        std::printf("| %s | %d | %d | %d | %s | %.2f | %s | %s | %s | %s |\n", dtype.c_str(), r, t,
                    x.keys, cell(x.scores, half).c_str(), x.softmax, cell(x.values, half).c_str(),
                    cell(x.whole, 2 * half).c_str(), cell(x.scores_prefetching, half).c_str(),
                    cell(x.whole_prefetching, 2 * half).c_str());
      }
  return 0;
}
