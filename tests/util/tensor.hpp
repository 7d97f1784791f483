// fattn tests — host tensors: a strided (B, H, S, D) view (or a (B, H, S) logsumexp) and
// the storage it lives in, in the memory layouts the tests exercise. The storage is
// larger than the view in most layouts; what lies around the view is poison (poison.hpp),
// so reads and writes outside it show.
//
// The same tensor serves both suites: CPU tests hand its host view to the library, CUDA
// tests copy its storage to a device buffer of the same size and hand the library the
// same view at the buffer's address (view_at).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "fattn/fattn.hpp"
#include "elements.hpp"
#include "poison.hpp"
#include "seed.hpp"

namespace fattn_test {

using fattn::DType;
using fattn::TensorView;

// How a logical (B, H, S, D) tensor sits in memory.
//   bhsd:       contiguous (B, H, S, D)
//   bshd:       contiguous (B, S, H, D)
//   strided:    every other element of a bigger buffer (dim stride 2), dimension order
//               S, B, H, D in memory, odd padding between heads, batches and rows, and
//               an odd start offset: nothing is contiguous (CPU only: CUDA tensors need
//               head-dim stride 1)
//   slice:      a head-dim slice of a packed buffer (dim stride 1, rows D + 19 apart,
//               like one of q/k/v inside a packed qkv tensor), start misaligned
//   padded:     (B, H, S, D) with gaps after every row, head and batch and before the
//               first; rows stay 16-byte aligned (the CUDA kernels read them in place)
//   misaligned: gaps of odd sizes and a view starting 1 element into the buffer (the
//               CUDA kernels repack it)
enum class Layout { bhsd, bshd, strided, slice, padded, misaligned };

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::bhsd: return "bhsd";
    case Layout::bshd: return "bshd";
    case Layout::strided: return "strided";
    case Layout::slice: return "slice";
    case Layout::padded: return "padded";
    case Layout::misaligned: return "misaligned";
  }
  return "?";
}

// Layout of the rank-3 (B, H, S) logsumexp output.
//   strided: every third float, heads and batches padded, dimension order S, B, H
//   padded:  contiguous rows of S with gaps after every head and batch and before the first
enum class LseLayout { none, contiguous, strided, padded };

inline const char* lse_layout_name(LseLayout l) {
  switch (l) {
    case LseLayout::none: return "nolse";
    case LseLayout::contiguous: return "lse";
    case LseLayout::strided: return "lsestrided";
    case LseLayout::padded: return "lsepadded";
  }
  return "?";
}

// Where a view sits in its storage, in elements.
struct Placement {
  std::array<std::int64_t, 4> strides;
  std::int64_t offset;        // storage before the view's first element
  std::int64_t end_gap = 0;   // storage of the layout after the view's last element
};

inline Placement placement(Layout layout, std::int64_t B, std::int64_t H, std::int64_t S,
                           std::int64_t D) {
  switch (layout) {
    case Layout::bhsd: return {{H * S * D, S * D, D, 1}, 0};
    case Layout::bshd: return {{S * H * D, D, H * D, 1}, 0};
    case Layout::strided: {
      const std::int64_t sd = 2, sh = 2 * D + 1, sb = H * sh + 3, ss = B * sb + 7;
      return {{sb, sh, ss, sd}, 5};
    }
    case Layout::slice: {
      const std::int64_t pitch = D + 19;
      return {{H * S * pitch, S * pitch, pitch, 1}, 3};
    }
    case Layout::padded: {
      constexpr std::int64_t gap = 8;  // 16 or 32 bytes: rows that start aligned stay aligned
      const std::int64_t row = D + gap, head = S * row + gap, batch = H * head + gap;
      constexpr std::int64_t end_gap = 4 * gap;  // the last row's, head's and batch's gaps, and one more
      return {{batch, head, row, 1}, gap, end_gap};
    }
    case Layout::misaligned: {
      constexpr std::int64_t row_gap = 3, head_gap = 1, batch_gap = 5, start = 1, tail = 3;
      const std::int64_t row = D + row_gap, head = S * row + head_gap, batch = H * head + batch_gap;
      return {{batch, head, row, 1}, start, row_gap + head_gap + batch_gap + tail};
    }
  }
  return {{0, 0, 0, 0}, 0};
}

inline Placement lse_placement(LseLayout layout, std::int64_t B, std::int64_t H, std::int64_t S) {
  switch (layout) {
    case LseLayout::strided: {
      const std::int64_t sh = 3, sb = H * sh + 1, ss = B * sb + 2;
      return {{sb, sh, ss, 0}, 1};
    }
    case LseLayout::padded: {
      constexpr std::int64_t head_gap = 3, batch_gap = 1, start = 2, tail = 2;
      const std::int64_t head = S + head_gap, batch = H * head + batch_gap;
      return {{batch, head, 1, 0}, start, head_gap + batch_gap + tail};
    }
    case LseLayout::none:
    case LseLayout::contiguous: break;
  }
  return {{H * S, S, 1, 0}, 0};
}

// Storage a host tensor keeps after its layout's end: a CPU kernel that reads a few
// elements past the view's last one reads poison, not another allocation.
constexpr std::int64_t kHostGuardElements = 5;

// A view plus the storage it lives in. Elements are float32, float16 or bfloat16, read
// and written as floats (get, set, element, set_element); a float32 tensor also hands
// out its floats themselves (at, storage). The storage is kept in float-sized words (a
// 16-bit tensor packs two elements into one). Move-only: the view points into the storage.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Tensor&&) = default;
  Tensor& operator=(Tensor&&) = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // float32 storage, filled with `fill`, for a view at `offset` with `strides`, and
  // kHostGuardElements more after it.
  Tensor(int rank, std::array<std::int64_t, 4> sizes, std::array<std::int64_t, 4> strides,
         std::int64_t offset, float fill)
      : Tensor(DType::float32, rank, sizes, Placement{strides, offset}, kHostGuardElements) {
    this->fill(fill);
  }

  // Storage of `dtype` for a view placed as `p`, and `guard` more elements after the
  // layout's end; every byte zero.
  Tensor(DType dtype, int rank, std::array<std::int64_t, 4> sizes, const Placement& p,
         std::int64_t guard)
      : dtype_(dtype), offset_(p.offset) {
    require_host_element_type(dtype);
    std::int64_t reach = 0;
    for (std::size_t d = 0; d < static_cast<std::size_t>(rank); ++d) reach += (sizes[d] - 1) * p.strides[d];
    elements_ = p.offset + reach + 1 + p.end_gap + guard;
    words_.assign((byte_size() + sizeof(float) - 1) / sizeof(float), 0.0f);
    view_.data = bytes() + offset_ * element_bytes();
    view_.rank = rank;
    view_.sizes = sizes;
    view_.strides = p.strides;
    view_.dtype = dtype;
  }

  DType dtype() const { return dtype_; }
  int element_bytes() const { return fattn::element_size(dtype_); }

  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  const TensorView* view_ptr() const { return &view_; }
  // The same view over a copy of the storage that starts at `storage_base` (a device buffer).
  TensorView view_at(void* storage_base, fattn::Device device) const {
    TensorView v = view_;
    v.data = static_cast<std::uint8_t*>(storage_base) + offset_ * element_bytes();
    v.device = device;
    return v;
  }

  int rank() const { return view_.rank; }
  std::int64_t size(int d) const { return view_.sizes[static_cast<std::size_t>(d)]; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int d = 0; d < rank(); ++d) n *= size(d);
    return n;
  }

  // The storage, element by element (any dtype) or as bytes.
  std::int64_t storage_elements() const { return elements_; }
  std::uint8_t* bytes() { return reinterpret_cast<std::uint8_t*>(words_.data()); }
  const std::uint8_t* bytes() const { return reinterpret_cast<const std::uint8_t*>(words_.data()); }
  std::size_t byte_size() const { return static_cast<std::size_t>(elements_ * element_bytes()); }
  float element(std::int64_t e) const { return element_to_float(dtype_, bytes() + e * element_bytes()); }
  void set_element(std::int64_t e, float x) { element_from_float(dtype_, x, bytes() + e * element_bytes()); }

  std::int64_t offset_of(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3 = 0) const {
    return offset_ + i0 * view_.strides[0] + i1 * view_.strides[1] + i2 * view_.strides[2] +
           (rank() == 4 ? i3 * view_.strides[3] : 0);
  }
  float get(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3 = 0) const {
    return element(offset_of(i0, i1, i2, i3));
  }
  void set(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3, float x) {
    set_element(offset_of(i0, i1, i2, i3), x);
  }

  // float32 tensors only: the floats themselves.
  std::vector<float>& storage() {
    require_float32();
    return words_;
  }
  const std::vector<float>& storage() const {
    require_float32();
    return words_;
  }
  float& at(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3 = 0) {
    require_float32();
    return words_[static_cast<std::size_t>(offset_of(i0, i1, i2, i3))];
  }
  float at(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3 = 0) const {
    require_float32();
    return words_[static_cast<std::size_t>(offset_of(i0, i1, i2, i3))];
  }

  // Calls f(i0, i1, i2, i3) for every logical index (i3 = 0 for rank 3).
  template <class F>
  void for_each(F&& f) const {
    const std::int64_t n3 = rank() == 4 ? size(3) : 1;
    for (std::int64_t a = 0; a < size(0); ++a)
      for (std::int64_t b = 0; b < size(1); ++b)
        for (std::int64_t c = 0; c < size(2); ++c)
          for (std::int64_t d = 0; d < n3; ++d) f(a, b, c, d);
  }

  // Which storage elements the view covers.
  std::vector<char> coverage() const {
    std::vector<char> in(static_cast<std::size_t>(elements_), 0);
    for_each([&](auto a, auto b, auto c, auto d) {
      in[static_cast<std::size_t>(offset_of(a, b, c, d))] = 1;
    });
    return in;
  }

  // Every storage element (view and padding) set to x.
  void fill(float x) {
    std::uint8_t pattern[sizeof(float)];
    element_from_float(dtype_, x, pattern);
    for (std::int64_t e = 0; e < elements_; ++e)
      std::memcpy(bytes() + e * element_bytes(), pattern, static_cast<std::size_t>(element_bytes()));
  }

  // Every storage element set to the poison (host: float32 tensors only).
  void poison(Poison kind = Poison::host) {
    if (kind == Poison::device) {
      std::fill(bytes(), bytes() + byte_size(), kDevicePoisonByte);
      return;
    }
    require_float32();
    fill(kPoison);
  }
  bool holds_poison(std::int64_t e, Poison kind) const {
    if (kind == Poison::device) return is_device_poison(bytes() + e * element_bytes(), element_bytes());
    return is_host_poison(element(e));
  }

  bool same_bytes(const Tensor& other) const {
    return byte_size() == other.byte_size() && std::memcmp(bytes(), other.bytes(), byte_size()) == 0;
  }

  Tensor clone() const {
    Tensor t;
    t.dtype_ = dtype_;
    t.elements_ = elements_;
    t.words_ = words_;
    t.offset_ = offset_;
    t.view_ = view_;
    t.view_.data = t.bytes() + offset_ * element_bytes();
    return t;
  }

 private:
  void require_float32() const {
    if (dtype_ != DType::float32)
      throw std::logic_error(std::string("this test tensor holds ") + fattn::to_string(dtype_) +
                             ", not float32: use get and set");
  }

  DType dtype_ = DType::float32;
  std::int64_t elements_ = 0;
  std::vector<float> words_;
  std::int64_t offset_ = 0;
  TensorView view_;
};

// ---- host tensors in the CPU tests' conventions (float32, a guard after the layout) ------

// A (B, H, S, D) input filled with N(0, 1) · multiplier; padding is kInputPadBits NaN.
inline Tensor make_input(Layout layout, std::int64_t B, std::int64_t H, std::int64_t S,
                         std::int64_t D, Rng& rng, float multiplier = 1.0f) {
  const Placement p = placement(layout, B, H, S, D);
  Tensor t(DType::float32, 4, {B, H, S, D}, p, kHostGuardElements);
  t.fill(from_bits(kInputPadBits));
  t.for_each([&](auto b, auto h, auto s, auto d) { t.at(b, h, s, d) = rng.normal() * multiplier; });
  return t;
}

// A (B, H, S, D) output, all of its storage poisoned.
inline Tensor make_output(Layout layout, std::int64_t B, std::int64_t H, std::int64_t S,
                          std::int64_t D) {
  Tensor t(DType::float32, 4, {B, H, S, D}, placement(layout, B, H, S, D), kHostGuardElements);
  t.poison();
  return t;
}

// A (B, H, S) logsumexp output, poisoned.
inline Tensor make_lse(LseLayout layout, std::int64_t B, std::int64_t H, std::int64_t S) {
  Tensor t(DType::float32, 3, {B, H, S, 0}, lse_placement(layout, B, H, S), kHostGuardElements);
  t.poison();
  return t;
}

// A contiguous float32 (B, H, S, D) copy of t's view (exact: every float16 and bfloat16
// is a float32), for references that read plain floats.
inline Tensor float32_bhsd_copy(const Tensor& t) {
  const std::int64_t B = t.size(0), H = t.size(1), S = t.size(2), D = t.size(3);
  Tensor c(DType::float32, 4, {B, H, S, D}, placement(Layout::bhsd, B, H, S, D), 0);
  t.for_each([&](auto b, auto h, auto s, auto d) { c.at(b, h, s, d) = t.get(b, h, s, d); });
  return c;
}

}  // namespace fattn_test
