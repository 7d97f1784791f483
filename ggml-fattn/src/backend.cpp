// ggml-fattn — the ggml backend interface: registry, device and backend (ggml-fattn.h).
//
// Shaped as ggml's single-op backends (ggml-blas): an ACCEL device on the CPU buffer type,
// so the scheduler of a CPU-only llama.cpp moves the nodes this device supports onto it
// (it shares the CPU's buffers: no copies) and runs the rest on the CPU backend.
#include "ggml-fattn.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <chrono>
#include <thread>

#include "flash_attn_ext.hpp"
#include "ggml-backend-impl.h"
#include "ggml-backend.h"

namespace {

// GGML_FATTN_VERBOSE set: a line for each node left to ggml, the first node on fattn, and
// the counts when a backend is freed.
bool verbose() {
  static const bool set = std::getenv("GGML_FATTN_VERBOSE") != nullptr;
  return set;
}

struct Context {
  int n_threads = static_cast<int>(std::thread::hardware_concurrency());
  ggml_fattn::Scratch scratch;
  ggml_backend_fattn_counts counts{0, 0};
  ggml_backend_t cpu = nullptr;  // ggml's CPU backend, for a node fattn refuses at run time
  double seconds = 0.0;  // in fattn's kernels
};

ggml_guid_t fattn_guid() {
  static ggml_guid guid = {0x66, 0x61, 0x74, 0x74, 0x6e, 0x2d, 0x67, 0x67,
                           0x6d, 0x6c, 0x2d, 0x61, 0x63, 0x63, 0x65, 0x6c};
  return &guid;
}

const char* backend_name(ggml_backend_t) { return "FATTN"; }

void backend_free(ggml_backend_t backend) {
  auto* ctx = static_cast<Context*>(backend->context);
  if (verbose())
    std::fprintf(stderr, "ggml-fattn: %lld FLASH_ATTN_EXT nodes on fattn, %lld on ggml's CPU kernel (%.3f s in fattn)\n",
                 static_cast<long long>(ctx->counts.on_fattn),
                 static_cast<long long>(ctx->counts.on_ggml_cpu), ctx->seconds);
  if (ctx->cpu) ggml_backend_free(ctx->cpu);
  delete ctx;
  delete backend;
}

// A node fattn's own checks refused: ggml's CPU kernel computes it (a one-node graph on
// the CPU backend, the same tensors), so the graph never fails for it. The CPU backend
// comes from ggml's registry, as llama.cpp gets it: linked in, or a module loaded at run
// time (GGML_BACKEND_DL), its thread count set through the registry's proc address.
void compute_on_ggml_cpu(Context* ctx, ggml_tensor* node) {
  if (!ctx->cpu) ctx->cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
  if (!ctx->cpu) {
    std::fprintf(stderr, "ggml-fattn: %s: no CPU backend in ggml's registry to run it\n", node->name);
    std::abort();
  }
  ggml_backend_reg_t cpu_reg = ggml_backend_dev_backend_reg(ggml_backend_get_device(ctx->cpu));
  if (auto set_threads = reinterpret_cast<ggml_backend_set_n_threads_t>(
          ggml_backend_reg_get_proc_address(cpu_reg, "ggml_backend_set_n_threads")))
    set_threads(ctx->cpu, ctx->n_threads);
  const ggml_init_params params{ggml_graph_overhead_custom(1, false), nullptr, true};
  ggml_context* graph_ctx = ggml_init(params);
  ggml_cgraph* graph = ggml_new_graph_custom(graph_ctx, 1, false);
  ggml_graph_add_node(graph, node);
  ggml_backend_graph_compute(ctx->cpu, graph);
  ggml_free(graph_ctx);
  ++ctx->counts.on_ggml_cpu;
}

ggml_status graph_compute(ggml_backend_t backend, ggml_cgraph* graph) {
  auto* ctx = static_cast<Context*>(backend->context);
  for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
    ggml_tensor* node = ggml_graph_node(graph, i);
    if ((node->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) continue;
    switch (node->op) {
      case GGML_OP_FLASH_ATTN_EXT:
        try {
          const auto t0 = std::chrono::steady_clock::now();
          ggml_fattn::compute(node, ctx->n_threads, ctx->scratch);
          ctx->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (ctx->counts.on_fattn++ == 0 && verbose())
            std::fprintf(stderr, "ggml-fattn: the first FLASH_ATTN_EXT node (%s) ran on fattn\n", node->name);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "ggml-fattn: %s: %s; ggml's CPU kernel runs it\n", node->name, e.what());
          compute_on_ggml_cpu(ctx, node);
        }
        break;
      case GGML_OP_NONE:
      case GGML_OP_RESHAPE:
      case GGML_OP_VIEW:
      case GGML_OP_PERMUTE:
      case GGML_OP_TRANSPOSE:
        break;
      default:
        std::fprintf(stderr, "ggml-fattn: %s is not an op this backend supports\n", ggml_op_desc(node));
        return GGML_STATUS_FAILED;
    }
  }
  return GGML_STATUS_SUCCESS;
}

const ggml_backend_i kBackendInterface = {
    /* .get_name            = */ backend_name,
    /* .free                = */ backend_free,
    /* .set_tensor_async    = */ nullptr,
    /* .get_tensor_async    = */ nullptr,
    /* .set_tensor_2d_async = */ nullptr,
    /* .get_tensor_2d_async = */ nullptr,
    /* .cpy_tensor_async    = */ nullptr,
    /* .synchronize         = */ nullptr,
    /* .graph_plan_create   = */ nullptr,
    /* .graph_plan_free     = */ nullptr,
    /* .graph_plan_update   = */ nullptr,
    /* .graph_plan_compute  = */ nullptr,
    /* .graph_compute       = */ graph_compute,
    /* .event_record        = */ nullptr,
    /* .event_wait          = */ nullptr,
    /* .graph_optimize      = */ nullptr,
};

// --- device ---------------------------------------------------------------------------

const char* device_name(ggml_backend_dev_t) { return "FATTN"; }
const char* device_description(ggml_backend_dev_t) {
  return "fattn: exact IO-aware attention (FLASH_ATTN_EXT on the CPU)";
}
void device_memory(ggml_backend_dev_t, size_t* free, size_t* total) { *free = *total = 0; }
enum ggml_backend_dev_type device_type(ggml_backend_dev_t) { return GGML_BACKEND_DEVICE_TYPE_ACCEL; }

void device_props(ggml_backend_dev_t dev, ggml_backend_dev_props* props) {
  props->name = device_name(dev);
  props->description = device_description(dev);
  props->type = device_type(dev);
  device_memory(dev, &props->memory_free, &props->memory_total);
  props->caps = {/* .async = */ false, /* .host_buffer = */ false,
                 /* .buffer_from_host_ptr = */ true, /* .events = */ false,
                 /* .mmap_support = */ true};
}

ggml_backend_t device_init_backend(ggml_backend_dev_t, const char*) {
  return ggml_backend_fattn_init();
}
ggml_backend_buffer_type_t device_buffer_type(ggml_backend_dev_t) {
  return ggml_backend_cpu_buffer_type();
}
ggml_backend_buffer_t device_buffer_from_host_ptr(ggml_backend_dev_t, void* ptr, size_t size, size_t) {
  return ggml_backend_cpu_buffer_from_ptr(ptr, size);
}

bool device_supports_op(ggml_backend_dev_t, const ggml_tensor* op) {
  switch (op->op) {
    case GGML_OP_NONE:
    case GGML_OP_RESHAPE:
    case GGML_OP_VIEW:
    case GGML_OP_PERMUTE:
    case GGML_OP_TRANSPOSE:
      return true;
    case GGML_OP_FLASH_ATTN_EXT: {
      const std::string why = ggml_fattn::refusal(op);
      if (!why.empty() && verbose())
        std::fprintf(stderr, "ggml-fattn: %s left to ggml: %s\n", op->name, why.c_str());
      return why.empty();
    }
    default:
      return false;
  }
}

bool device_supports_buft(ggml_backend_dev_t, ggml_backend_buffer_type_t buft) {
  return ggml_backend_buft_is_host(buft);
}

const ggml_backend_device_i kDeviceInterface = {
    /* .get_name             = */ device_name,
    /* .get_description      = */ device_description,
    /* .get_memory           = */ device_memory,
    /* .get_type             = */ device_type,
    /* .get_props            = */ device_props,
    /* .init_backend         = */ device_init_backend,
    /* .get_buffer_type      = */ device_buffer_type,
    /* .get_host_buffer_type = */ nullptr,
    /* .buffer_from_host_ptr = */ device_buffer_from_host_ptr,
    /* .supports_op          = */ device_supports_op,
    /* .supports_buft        = */ device_supports_buft,
    /* .offload_op           = */ nullptr,
    /* .event_new            = */ nullptr,
    /* .event_free           = */ nullptr,
    /* .event_synchronize    = */ nullptr,
};

// --- registry --------------------------------------------------------------------------

const char* reg_name(ggml_backend_reg_t) { return "FATTN"; }
size_t reg_device_count(ggml_backend_reg_t) { return 1; }
ggml_backend_dev_t reg_device(ggml_backend_reg_t reg, size_t index) {
  GGML_ASSERT(index == 0);
  static ggml_backend_device device = {kDeviceInterface, reg, nullptr};
  return &device;
}
void* reg_proc_address(ggml_backend_reg_t, const char* name) {
  if (std::strcmp(name, "ggml_backend_set_n_threads") == 0)
    return reinterpret_cast<void*>(ggml_backend_fattn_set_n_threads);
  return nullptr;
}

const ggml_backend_reg_i kRegInterface = {
    /* .get_name         = */ reg_name,
    /* .get_device_count = */ reg_device_count,
    /* .get_device       = */ reg_device,
    /* .get_proc_address = */ reg_proc_address,
};

}  // namespace

ggml_backend_reg_t ggml_backend_fattn_reg(void) {
  static ggml_backend_reg reg = {GGML_BACKEND_API_VERSION, kRegInterface, nullptr};
  return &reg;
}

ggml_backend_t ggml_backend_fattn_init(void) {
  return new ggml_backend{fattn_guid(), kBackendInterface,
                          ggml_backend_reg_dev_get(ggml_backend_fattn_reg(), 0), new Context};
}

bool ggml_backend_is_fattn(ggml_backend_t backend) {
  return backend != nullptr && ggml_guid_matches(backend->guid, fattn_guid());
}

void ggml_backend_fattn_set_n_threads(ggml_backend_t backend, int n_threads) {
  GGML_ASSERT(ggml_backend_is_fattn(backend));
  if (n_threads > 0) static_cast<Context*>(backend->context)->n_threads = n_threads;
}

ggml_backend_fattn_counts ggml_backend_fattn_get_counts(ggml_backend_t backend) {
  GGML_ASSERT(ggml_backend_is_fattn(backend));
  return static_cast<Context*>(backend->context)->counts;
}

// The entry point ggml_backend_load() looks up in a backend's shared library.
extern "C" {
GGML_BACKEND_API ggml_backend_reg_t ggml_backend_init(void);
}
ggml_backend_reg_t ggml_backend_init(void) { return ggml_backend_fattn_reg(); }
