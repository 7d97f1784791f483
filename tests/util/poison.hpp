// fattn tests — poison: values a test puts where a kernel must not read, or must write
// before anyone reads, so that a wrong access shows up as a NaN or as a failed check.
//
//  * Input storage outside the view holds a NaN: a kernel that reads outside its view
//    turns outputs into NaN.
//  * Output storage is poisoned before every run: an element the kernel forgot to write
//    still holds the poison (detected), and so does storage it must leave alone.
//
// Two poisons, because the two places that write them differ:
//  * host poison (CPU tests): quiet NaNs with payloads the CPU kernels never produce (they
//    only make the default NaN or propagate the payload of an input NaN), so "still
//    poison" is told apart from "wrote a NaN";
//  * device poison (CUDA tests): every byte 0xFF, because cudaMemset writes bytes, and
//    0xFF bytes are a NaN in float32, float16 and bfloat16 alike.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace fattn_test {

constexpr std::uint32_t kPoisonBits = 0x7fc0beefu;    // host: outputs, before each run
constexpr std::uint32_t kInputPadBits = 0x7fc1deadu;  // host: input storage outside the view
constexpr std::uint8_t kDevicePoisonByte = 0xFF;      // device: every byte of an output

enum class Poison { host, device };

inline float from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }
inline std::uint32_t to_bits(float f) { return std::bit_cast<std::uint32_t>(f); }
inline const float kPoison = from_bits(kPoisonBits);
inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline bool is_host_poison(float x) { return to_bits(x) == kPoisonBits; }

// Whether the element_bytes bytes at `element` all still hold the device poison.
inline bool is_device_poison(const std::uint8_t* element, int element_bytes) {
  for (int byte = 0; byte < element_bytes; ++byte)
    if (element[byte] != kDevicePoisonByte) return false;
  return true;
}

}  // namespace fattn_test
