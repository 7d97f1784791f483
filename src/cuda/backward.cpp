// fattn — the CUDA backend's attention_backward (backend.hpp): what the Hopper backward takes,
// its plan (compiled head dim, repacked inputs, the row pass's working rows), its parameters
// and launch. Everything here runs before any launch and fails with an Error naming the
// argument; nothing on the device is read.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/backend.hpp"
#include "cuda/backward_params.hpp"
#include "cuda/device.hpp"
#include "cuda/head_dims.hpp"  // generated: FATTN_CUDA_BACKWARD_HEAD_DIMS(X)
#include "cuda/host_checks.hpp"
#include "cuda/launchers.hpp"
#include "cuda/plan.hpp"
#include "cuda/refusal.hpp"
#include "cuda/tile_config.hpp"
#include "cuda/work_memory.hpp"
#include "model/problem.hpp"

namespace fattn::cuda {
namespace {

constexpr const char* kName = "hopper_backward";

// The compiled head dim a call runs on (0: none).
int backward_kernel_dim(std::int64_t head_dim) { return compiled_dim_for(backward_head_dims(), head_dim); }

// Query rows per (batch, head) of the row pass's output: whole tiles of either kernel.
int padded_rows(std::int64_t q_len) {
  const HopperBackwardTiles t = hopper_backward_tiles(0);
  return static_cast<int>(round_up(q_len, std::max(t.query_tile, t.dq_rows)));
}

// The compiled head dims as a type: empty where the Hopper backward is not built, so nothing
// then refers to its launcher.
#define FATTN_NEXT_DIM(d) , d
using BackwardDims = std::integer_sequence<int FATTN_CUDA_BACKWARD_HEAD_DIMS(FATTN_NEXT_DIM)>;
#undef FATTN_NEXT_DIM

template <class T, int... Dims>
void launch_at(std::integer_sequence<int, Dims...>, int dim, const BackwardParams& bp, cudaStream_t stream) {
  const bool found = ((dim == Dims && (launch_hopper_backward<T, Dims>(bp, stream), true)) || ...);
  if (!found) fail("internal error: no hopper_backward CUDA kernel for head dim " + std::to_string(dim));
}

// Whether a dimension of t repeats one slice (stride 0 with size > 1: an expanded tensor, as
// autograd hands over the gradient of a sum): the copy engine's maps take no zero stride.
bool broadcast(const TensorView& t) {
  for (int d = 0; d < 3; ++d)
    if (t.size(d) > 1 && t.stride(d) == 0) return true;
  return false;
}

template <class F>
void with_sixteen_bit(DType dtype, F&& f) {
  if (dtype == DType::float16) return f(static_cast<__half*>(nullptr));
  if (dtype == DType::bfloat16) return f(static_cast<__nv_bfloat16*>(nullptr));
  fail("internal error: the hopper_backward CUDA kernel takes float16 or bfloat16");
}

}  // namespace

std::string backward_refusal(const TensorView& q, const TensorView& k, const Options& options) {
  constexpr int kRank = 4;  // (B, H, S, D): the head dim is size(3)
  if (q.rank != kRank || k.rank != kRank) return {};  // the validation's error, not a refusal
  const CudaCall call = call_of("backward", q.dtype, q.size(3), options);
  // What the build and the call decide first, before any device is asked.
  if (std::string why = refusal_on_any_device(TableKernel::backward_tma, call); !why.empty())
    return why;
  const ComputeCapability cc = compute_capability(usable_device());
  const std::string why = capability_refusal(TableKernel::backward_tma, cc);
  return why.empty() ? why : why + " (the current CUDA device)";
}

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& lse,
                        const TensorView* dlse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const Options& options, const TensorView* dsinks) {
  const detail::Problem pr =
      detail::make_backward_problem(q, k, v, out, dout, lse, dlse, dq, dk, dv, options, dsinks);
  const std::pair<const char*, const TensorView*> rows[] = {
      {"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"dout", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  for (const auto& [name, t] : rows) expect_contiguous_rows(name, *t);
  if (const std::string why = backward_refusal(q, k, options); !why.empty())
    fail(why + " (fattn's Triton backward runs it: torch.ops.fattn.attention_backward)");
  expect_int("q.size(2) (query sequence)", pr.q_len);
  expect_int("k.size(2) (kv sequence)", pr.kv_len);
  const HopperBackwardTiles tiles = hopper_backward_tiles(0);
  expect_int("the Hopper backward's key grid (batch · kv heads · key blocks)",
             checked_product({pr.batch, pr.kv_heads, (pr.kv_len + tiles.key_rows - 1) / tiles.key_rows}, "the key grid"));
  expect_int("the Hopper backward's query grid (batch · heads · query blocks)",
             checked_product({pr.batch, pr.q_heads, (pr.q_len + tiles.dq_rows - 1) / tiles.dq_rows}, "the query grid"));
  const int device = usable_device();
  for (const auto& [name, t] : rows) expect_device_memory(name, t->data, device);
  expect_device_memory("lse", lse.data, device);
  if (dlse) expect_device_memory("dlse", dlse->data, device);
  if (options.alibi_slopes) expect_device_memory("alibi_slopes", options.alibi_slopes->data, device);
  if (options.sinks) expect_device_memory("sinks", options.sinks->data, device);
  if (dsinks) expect_device_memory("dsinks", dsinks->data, device);

  BackwardParams bp;
  bp.p = make_params(pr, q, k, v, out, &lse);
  bp.out = out.data;
  bp.out_stride = strides3(out);
  bp.dout = dout.data;
  bp.dout_stride = strides3(dout);
  bp.lse = static_cast<const float*>(lse.data);
  bp.lse_stride = strides3(lse);
  if (dlse) {
    bp.dlse = static_cast<const float*>(dlse->data);
    bp.dlse_stride = strides3(*dlse);
  }
  bp.dq = dq.data;
  bp.dk = dk.data;
  bp.dv = dv.data;
  bp.dq_stride = strides3(dq);
  bp.dk_stride = strides3(dk);
  bp.dv_stride = strides3(dv);
  bp.dq_pairs = pair_stores_ok(dq);
  bp.dk_pairs = pair_stores_ok(dk);
  bp.dv_pairs = pair_stores_ok(dv);
  bp.rows_pad = padded_rows(pr.q_len);
  if (dsinks) bp.dsinks = static_cast<float*>(dsinks->data);

  // Working memory: the row pass's two rows per (batch, head), then copies of the inputs the
  // copy engine cannot read as they are (16-byte aligned rows and strides).
  const std::int64_t row_bytes = checked_product({pr.batch, pr.q_heads, bp.rows_pad, 4}, "the backward's row buffers");
  const int chunk = 16 / element_size(q.dtype);
  const int packed_row = static_cast<int>(round_up(pr.head_dim, chunk));
  const TensorView* inputs[4] = {&q, &k, &v, &dout};
  std::int64_t repack_bytes[4] = {};
  const int row_buffers = options.sinks ? 3 : 2;  // lse_log2, delta (and the sink terms)
  std::int64_t total = row_buffers * round_up(row_bytes, kWorkAlignment);
  for (int i = 0; i < 4; ++i) {
    const TensorView& t = *inputs[i];
    if (cp_async_ready(t) && !broadcast(t)) continue;
    repack_bytes[i] = repacked_bytes(t, packed_row);
    total += round_up(repack_bytes[i], kWorkAlignment);
  }
  const auto stream = static_cast<cudaStream_t>(options.cuda_stream);
  StreamBuffer work(total, stream, kName, options.device_allocator);
  bp.lse_log2 = static_cast<float*>(work.take(row_bytes));
  bp.delta = static_cast<float*>(work.take(row_bytes));
  if (options.sinks) bp.sink_terms = static_cast<float*>(work.take(row_bytes));
  const void** data[4] = {&bp.p.q, &bp.p.k, &bp.p.v, &bp.dout};
  Strides3* strides[4] = {&bp.p.q_stride, &bp.p.k_stride, &bp.p.v_stride, &bp.dout_stride};
  const int dim = backward_kernel_dim(pr.head_dim);
  with_sixteen_bit(q.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    for (int i = 0; i < 4; ++i) {
      if (!repack_bytes[i]) continue;
      void* dst = work.take(repack_bytes[i]);
      *strides[i] = repack<T>(*inputs[i], dst, packed_row, stream);
      *data[i] = dst;
    }
    launch_at<T>(BackwardDims{}, dim, bp, stream);
  });
}

}  // namespace fattn::cuda
