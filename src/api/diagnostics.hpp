// fattn — the recording side of fattn/diagnostics.hpp.
#pragma once

#include "fattn/diagnostics.hpp"

namespace fattn::detail {

// Stores the stage times that last_naive_stage_seconds() returns on this thread.
void record_naive_stage_seconds(const NaiveStageSeconds& seconds);

}  // namespace fattn::detail
