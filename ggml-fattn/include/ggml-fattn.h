// ggml-fattn — fattn as a ggml backend: an ACCEL device on the CPU buffer type that runs
// GGML_OP_FLASH_ATTN_EXT with fattn's CPU kernels, on the ggml tensors in place, and
// leaves every other op to ggml's CPU backend (docs/llama.md).
//
// Loaded by a llama.cpp built with shared libraries, without a patch of it:
//   GGML_BACKEND_PATH=/path/to/libggml-fattn.so llama-cli ...
// (ggml_backend_load_all reads the variable), or from a program with
// ggml_backend_load("/path/to/libggml-fattn.so").
#pragma once

#include "ggml-backend.h"
#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

// The registry (one device, "FATTN") and a backend of it.
GGML_BACKEND_API ggml_backend_reg_t ggml_backend_fattn_reg(void);
GGML_BACKEND_API ggml_backend_t ggml_backend_fattn_init(void);
GGML_BACKEND_API bool ggml_backend_is_fattn(ggml_backend_t backend);
GGML_BACKEND_API void ggml_backend_fattn_set_n_threads(ggml_backend_t backend, int n_threads);

// What a backend ran: FLASH_ATTN_EXT nodes on fattn's kernels, and nodes handed to ggml's
// CPU kernel at run time (a call fattn's kernels refused after supports_op took it: none
// is expected; each is logged).
struct ggml_backend_fattn_counts {
  int64_t on_fattn;
  int64_t on_ggml_cpu;
};
GGML_BACKEND_API struct ggml_backend_fattn_counts ggml_backend_fattn_get_counts(ggml_backend_t backend);

#ifdef __cplusplus
}
#endif
