// The launcher's main loop (torchrun's elastic agent): rendezvous, start this node's workers, watch them,
// and on a failure stop them all, report the root cause and restart the group while restarts remain.
#pragma once

#include <ostream>

#include "distributed/launch/options.h"

namespace ingot::distributed::launch {

// Exit status of `ingot launch` (see kLaunchHelp).
constexpr int kLaunchOk = 0;
constexpr int kLaunchFailed = 1;
constexpr int kLaunchUsage = 2;

// Runs the job described by `opts`; progress and failure reports go to `log` (stderr). Returns the exit status:
// 0, 1 (workers failed with no restarts left, or the rendezvous failed) or 128 + signal when interrupted.
// Throws LaunchUsageError for flags that turn out to be unusable here (e.g. --nproc-per-node gpu without GPUs).
int run_launcher(const LaunchOptions& opts, std::ostream& log);

}  // namespace ingot::distributed::launch
