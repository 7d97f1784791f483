// fattn — tanh in float32 as the softcap takes it, for every backend's kernels.
//
// tanh(u) = sign(u)·|u|·P(u²)/Q(u²), |u| clamped to kTanhClamp (tanh(9) rounds to 1 in
// float32): a rational fit of relative error 3.1e-7 in float32 (scripts/fit_tanh.py). One
// division and nine FMAs. The CPU kernels evaluate it on vectors (cpu/common/score_mods.hpp),
// the CUDA kernels on scalars (cuda/score_mods.cuh); both read the coefficients here
// (scalars, not an array: device code reads constexpr scalars of the host).
#pragma once

namespace fattn::detail {

inline constexpr float kTanhClamp = 9.0f;
// P(z) = p4·z⁴ + p3·z³ + p2·z² + p1·z + p0
inline constexpr float kTanhP4 = 1.3663212839e-08f, kTanhP3 = 2.0831808719e-05f,
                       kTanhP2 = 3.5091259584e-03f, kTanhP1 = 1.3392425730e-01f,
                       kTanhP0 = 9.9999998322e-01f;
// Q(z) = q4·z⁴ + q3·z³ + q2·z² + q1·z + 1
inline constexpr float kTanhQ4 = 7.9028569118e-07f, kTanhQ3 = 3.3077721829e-04f,
                       kTanhQ2 = 2.5928489217e-02f, kTanhQ1 = 4.6725744378e-01f,
                       kTanhQ0 = 1.0f;

}  // namespace fattn::detail
