// INGOT_LOGS=graph,passes,recompiles,graph_breaks,guards,output_code,schedule,perf,memory (comma list, or "all"):
// what the compiler prints to stderr, each line prefixed "[ingot:<kind>]". Read once per process;
// set_logs() overrides it (tests, `ingot explain`). Without INGOT_LOGS, "progress" (the compile progress line)
// is on when stderr is a terminal.
#pragma once

#include <string>
#include <string_view>

namespace ingot::compiler {

// memory: after each run of a compiled step, the step at which the device allocator held the most and the
// largest values alive there (compile/exec/executor.cpp).
enum class LogKind { Graph, Passes, Recompiles, GraphBreaks, Guards, OutputCode, Schedule, Perf, Progress, Memory };

bool log_on(LogKind k);
void log(LogKind k, std::string_view text);  // multi-line text gets the prefix on every line
// Replaces the enabled set with a comma list; throws naming an unknown kind and listing the valid ones.
void set_logs(std::string_view spec);

}  // namespace ingot::compiler
