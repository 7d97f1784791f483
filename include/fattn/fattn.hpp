// fattn — public API. Include this one header.
#pragma once

#include "fattn/attention.hpp"
#include "fattn/cuda_refusal.hpp"
#include "fattn/diagnostics.hpp"
#include "fattn/kv_cache.hpp"
#include "fattn/tensor.hpp"
