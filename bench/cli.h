// The bench programs' command lines: CLI11 (libcli11-dev), as `ingot` and `ingot launch` parse theirs.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdlib>

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

}  // namespace ingot::bench
