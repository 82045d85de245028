// The bench programs' command lines: CLI11 (libcli11-dev), as `ingot` and `ingot launch` parse theirs.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>

namespace ingot::bench {

// Parses argv into `app`: --help prints the usage and exits 0; an unknown flag, a missing value or a value of the
// wrong type prints CLI11's message naming the flag and exits non-zero (before any work starts).
inline void parse_or_exit(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
}

// Options both step benches take, their help in one place.
inline void add_timeline_slots_flag(CLI::App& app, bool& on, const std::string& group) {
  app.add_flag("--timeline-slots", on,
               "with --timeline: every collective of the last timed step (op, bytes, when it ran, exposure)")
      ->group(group);
}
inline void add_keep_last_blocks_option(CLI::App& app, int& blocks, const std::string& group) {
  app.add_option("--keep-last-blocks", blocks,
                 "ZeRO-3 (--zero-stage 3): the last K blocks stay gathered from forward to backward "
                 "(distributed.keep_last_blocks)")
      ->check(CLI::NonNegativeNumber)->capture_default_str()->group(group);
}

inline void add_gather_embeddings_flag(CLI::App& app, bool& on, const std::string& group) {
  app.add_flag("--gather-embeddings", on,
               "ZeRO-3: gather an untied token table as any unit instead of looking it up where its rows lie "
               "(distributed.vocab_parallel_embeddings false)")
      ->group(group);
}

// --reduce-wire-dtype bf16 (ZeRO-3): gradients cross the wire in bf16 and are summed in --reduce-dtype
// (distributed.reduce_wire_dtype; Note [Narrow wire, wide sum], distributed/process_group.h).
inline void add_reduce_wire_option(CLI::App& app, std::string& wire, const std::string& group) {
  app.add_option("--reduce-wire-dtype", wire,
                 "ZeRO-3: bf16 sends each rank's gradients in bf16 and sums them in --reduce-dtype where they arrive "
                 "(FSDP2's bf16 gradients with reduce_dtype f32, half the bytes; distributed.reduce_wire_dtype)")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->group(group);
}

}  // namespace ingot::bench
