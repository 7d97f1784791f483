// fattn — diagnostics: what the last call did, for benchmarks and profiling.
#pragma once

namespace fattn {

// Wall time, in seconds, of each stage of the naive CPU implementation (Impl::naive):
//   prepare  working memory set up, K re-laid into the micro-kernel's panels
//   scores   stage 1: S = Q·Kᵀ·scale, written to the Sq×Sk buffer
//   softmax  stage 2: P = softmax(S) in place (max, exp/sum, normalise), logsumexp
//   output   stage 3: O = P·V
// Each stage is a parallel loop that ends before the next begins, so the four add up
// to the call's time less validation and dispatch.
struct NaiveStageSeconds {
  double prepare = 0, scores = 0, softmax = 0, output = 0;
};

// The stage times of the most recent naive CPU call made by the calling thread
// (all zero if it has made none). Recording costs five clock reads per call.
NaiveStageSeconds last_naive_stage_seconds();

}  // namespace fattn
