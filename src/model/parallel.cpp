// fattn — the default thread team (OpenMP) and the seam for a host's own pool.
#include "model/parallel.hpp"

#include <omp.h>

namespace fattn::detail {

Exec make_exec(const Options& options) {
  Exec exec;
  exec.workers = options.num_threads > 0 ? options.num_threads : default_num_threads();
  exec.runner = options.runner;
  return exec;
}

void run_workers(const Exec& exec, void (*worker)(void* arg, int worker_index), void* arg) {
  if (exec.workers <= 1) {
    worker(arg, 0);
    return;
  }
  if (exec.runner) {
    exec.runner->run(exec.runner->context, exec.workers, worker, arg);
    return;
  }
#pragma omp parallel num_threads(exec.workers)
  worker(arg, omp_get_thread_num());
}

}  // namespace fattn::detail

int fattn::default_num_threads() { return omp_get_max_threads(); }
