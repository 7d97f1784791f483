// fattn — CPU working memory, kept between calls.
//
// A fresh allocation of the naive path's Sq×Sk buffer is page-faulted in on every
// call: at B=2 H=8 S=4096 that was 266k faults and 38 % of naive's CPU time
// (docs/perf-log.md), so "fused vs naive" measured the kernel's page faults as much
// as fusion. One block is therefore kept and reused by the next call that fits in
// it; a call that finds it in use (another thread) allocates its own.
#pragma once

#include <cstdint>

namespace fattn::detail {

class WorkspaceLease {
 public:
  // floats: how many; what: named in the error if the allocation fails.
  WorkspaceLease(std::int64_t floats, const char* what);
  ~WorkspaceLease();
  WorkspaceLease(const WorkspaceLease&) = delete;
  WorkspaceLease& operator=(const WorkspaceLease&) = delete;
  float* get() const { return data_; }

 private:
  float* data_ = nullptr;
  bool cached_ = false;  // the shared block (returned to the cache) or our own
};

}  // namespace fattn::detail
