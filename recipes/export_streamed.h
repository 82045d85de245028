// A streamed final export under ZeRO-3 (TrainTask::save_final_sharded) whose failure on the writer reaches every
// rank at once.
//
// Note [A failed export stops every rank]: every rank takes part in each tensor's gather (ShardedWeights::fetch),
// so a writer (rank 0) failing between two gathers (creating, writing, syncing or renaming a file) would leave the
// others blocked in the next gather until the process group's timeout (distributed.timeout_s, minutes), unless a
// launcher happens to stop them. So each fetch begins with a status exchange (one all-reduce of the length of the
// writer's error, 0 while it is fine) and one more follows the save: once the writer failed it joins the exchange
// the others are waiting in with its error, they receive the message (its characters summed over the ranks) and
// throw it, and every rank exits non-zero with an error naming the file. The writer's files are written
// atomically (write_file_atomic: temp file, fsync, rename), so nothing half-written is left behind.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "recipes/train_loop.h"

namespace ingot::recipes {

// Calls save(w') on every rank, w' being `w` with the status exchange before each fetch, then exchanges once more.
// `sum_over_ranks` is an elementwise sum over the ranks (DataParallel::sum); `destination` (the output directory)
// is named by the other ranks' error. On the writer an exception from save is rethrown after the others were told;
// on the other ranks the writer's failure is thrown as "rank 0 failed to write the final weights into
// '<destination>': <its message>". Test hook: INGOT_TEST_FAIL_EXPORT_AFTER=N makes the writer fail before its
// (N+1)-th tensor.
std::vector<std::string> save_streamed_with_status(
    const ShardedWeights& w, const std::function<std::vector<double>(const std::vector<double>&)>& sum_over_ranks,
    const std::string& destination, const std::function<std::vector<std::string>(const ShardedWeights&)>& save);

}  // namespace ingot::recipes
