// fattn — diagnostics of the last call (see fattn/diagnostics.hpp).
#include "api/diagnostics.hpp"

namespace fattn {
namespace {

// Per calling thread: the stages run on worker threads, but each naive call starts and
// ends on the thread that made it.
thread_local NaiveStageSeconds last_naive_stages;

}  // namespace

NaiveStageSeconds last_naive_stage_seconds() { return last_naive_stages; }

namespace detail {

void record_naive_stage_seconds(const NaiveStageSeconds& seconds) {
  last_naive_stages = seconds;
}

}  // namespace detail
}  // namespace fattn
