// fattn-bench — the VDPBF16PS peak loop (see dot_loops.hpp): the library's own
// (cpu/common/peak_loops.hpp), which its bfloat16 products are chosen by.
#include "dot_loops.hpp"

#include "cpu/common/peak_loops.hpp"

namespace fattn_bench {

#if defined(FATTN_PEAK_BF16_DOT)
namespace {

float dot_loop(std::int64_t iterations, float, float) {
  return fattn::cpu::peak::bf16_dot_rounds(iterations);
}

}  // namespace

const DotLoop bf16_dot_loop = {dot_loop, fattn::cpu::peak::kDotFlopsPerRound};
#else
const DotLoop bf16_dot_loop = {nullptr, 0};
#endif

}  // namespace fattn_bench
