// One rank does an expensive, cacheable job first (compiling a step, tokenizing a dataset, downloading); the
// others wait for it on the store (not in a collective, so a long compile cannot trip a collective timeout)
// and then run the same function, which finds rank 0's result in the shared cache. The cache key must not
// depend on the rank for this to pay off.
#pragma once

#include <functional>
#include <string>

#include "distributed/store.h"

namespace ingot::distributed {

// Rank 0 runs `fn` and publishes "done" (or its error) under `key`; every other rank waits up to `timeout`
// for that, then runs `fn`. If rank 0's `fn` throws, the others throw an Error quoting it instead of running.
// `key` names the job (e.g. the compile cache key): a later call with the same key finds it already done.
void rank_zero_first(Store& store, int rank, const std::string& key, const std::function<void()>& fn,
                     Millis timeout);

}  // namespace ingot::distributed
