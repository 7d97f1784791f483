// fattn — which instruction sets the code of this translation unit may use.
//
// CMake compiles each kernel unit with its -m flags, which define __AVX512F__ and
// __AVX__. fattn.jit compiles the same units under `#pragma GCC target(...)`, which g++
// (12) applies to the code that follows but does not reflect in those macros; its
// wrappers define FATTN_TARGET_AVX512 / FATTN_TARGET_AVX instead. Code that uses the
// intrinsics of an instruction set asks these, so both builds compile the same paths
// (and give the same bits).
#pragma once

#if defined(__AVX512F__) || defined(FATTN_TARGET_AVX512)
#define FATTN_AVX512 1
#endif
#if defined(__AVX__) || defined(FATTN_TARGET_AVX)
#define FATTN_AVX 1
#endif
// AVX512-BF16 (vdpbf16ps): the avx512_bf16 unit (and the AMX unit, whose CPUs have it).
#if defined(__AVX512BF16__) || defined(FATTN_TARGET_AVX512_BF16)
#define FATTN_AVX512_BF16 1
#endif
// The AVX2 and AVX-512 units are built with F16C too (isa_flags.json): the 16-bit
// conversions of cpu/common/elements.hpp use it wherever FATTN_AVX is defined.
