// fattn — CPU working memory, kept between calls (see workspace_cache.hpp).
#include "api/workspace_cache.hpp"

#include <mutex>
#include <new>
#include <string>

#include "fattn/attention.hpp"

namespace fattn {
namespace {

constexpr std::size_t kAlignment = 64;  // a cache line; the widest vector

float* allocate(std::int64_t floats, const char* what) {
  try {
    return static_cast<float*>(::operator new[](static_cast<std::size_t>(floats) * sizeof(float),
                                                std::align_val_t(kAlignment)));
  } catch (const std::bad_alloc&) {
    throw Error(std::string("fattn: could not allocate ") + std::to_string(floats * 4) +
                " bytes of working memory for the " + what + " implementation");
  }
}

void release(float* block) {
  if (block) ::operator delete[](block, std::align_val_t(kAlignment));
}

struct Cache {
  std::mutex mutex;
  float* block = nullptr;
  std::int64_t floats = 0;
  bool in_use = false;
};

Cache& cache() {
  static Cache instance;
  return instance;
}

// Frees the cached block; the caller holds the mutex.
void drop_block(Cache& c) {
  release(c.block);
  c.block = nullptr;
  c.floats = 0;
}

}  // namespace

namespace detail {

WorkspaceLease::WorkspaceLease(std::int64_t floats, const char* what) {
  if (floats == 0) return;
  Cache& c = cache();
  std::unique_lock lock(c.mutex);
  if (c.in_use) {  // another call is running: it keeps the cached block
    lock.unlock();
    data_ = allocate(floats, what);
    return;
  }
  if (c.floats < floats) {  // grow: drop the old block before taking the larger one
    drop_block(c);
    c.block = allocate(floats, what);
    c.floats = floats;
  }
  c.in_use = true;
  cached_ = true;
  data_ = c.block;
}

WorkspaceLease::~WorkspaceLease() {
  if (!cached_) {
    release(data_);
    return;
  }
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  c.in_use = false;
}

}  // namespace detail

void release_cached_memory() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  if (c.in_use) return;  // the running call keeps it; a later call can release it
  drop_block(c);
}

}  // namespace fattn
