// fattn — the Python dispatch's word on a KV-cache call on CUDA tensors (kvcache_planner.hpp).
#include "kvcache_planner.hpp"

#include <map>
#include <mutex>
#include <tuple>

namespace fattn_torch {
namespace {

using Key = std::tuple<int, int, std::string, std::int64_t, bool, bool, bool, bool, bool>;

Key key_of(const KvcacheKind& k) {
  return {k.major, k.minor, k.dtype, k.head_dim, k.left_window, k.right_window, k.softcap,
          k.alibi, k.sinks};
}

struct Planner {
  std::mutex mutex;
  // Held for the life of the process and never released: a Python object freed by a static
  // destructor after the interpreter has finalised would crash at exit.
  pybind11::object* function = nullptr;
  std::map<Key, std::string> answers;
};

Planner& planner() {
  static Planner* const instance = new Planner();
  return *instance;
}

}  // namespace

std::string planned_kvcache_kernel(const KvcacheKind& kind) {
  Planner& p = planner();
  const Key key = key_of(kind);
  {
    const std::lock_guard<std::mutex> lock(p.mutex);
    if (!p.function) return {};
    if (auto found = p.answers.find(key); found != p.answers.end()) return found->second;
  }
  std::string answer;
  {
    const pybind11::gil_scoped_acquire gil;
    answer = (*p.function)(kind.major, kind.minor, kind.dtype, kind.head_dim, kind.left_window ? 0 : -1,
                           kind.right_window ? 0 : -1, kind.softcap, kind.alibi, kind.sinks)
                 .cast<std::string>();
  }
  const std::lock_guard<std::mutex> lock(p.mutex);
  p.answers.emplace(key, answer);
  return answer;
}

void bind_kvcache_planner(pybind11::module_& m) {
  m.def(
      "set_kvcache_planner",
      [](pybind11::function fn) {
        Planner& p = planner();
        const std::lock_guard<std::mutex> lock(p.mutex);
        if (p.function)
          *p.function = std::move(fn);
        else
          p.function = new pybind11::object(std::move(fn));  // see Planner::function
        p.answers.clear();
      },
      "The Python dispatch's choice for a kind of KV-cache call on CUDA: fn(major, minor, dtype, "
      "head_dim, window_left, window_right, softcap, alibi, sinks) -> kernel name");
  m.def(
      "forget_kvcache_plans",
      [] {
        Planner& p = planner();
        const std::lock_guard<std::mutex> lock(p.mutex);
        p.answers.clear();
      },
      "Forget the remembered choices (after new verification records)");
}

}  // namespace fattn_torch
