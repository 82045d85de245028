// The JSON error file: a worker started by `ingot launch` finds its path in INGOT_ERROR_FILE and, on an
// uncaught error, writes what went wrong there; the launcher reads it back to report the root cause of a
// failed group (the message a worker printed may be lost in the output of the others).
// Format: {"message": "...", "type": "...", "rank": 0, "local_rank": 0, "restart_count": 0, "pid": 123,
//          "host": "node1", "timestamp": 1700000000.25}
#pragma once

#include <optional>
#include <string>

namespace ingot::distributed::launch {

// Writes the error file if INGOT_ERROR_FILE is set (atomically; an existing file is kept, as the first error
// is the one that matters). Does nothing otherwise. Never throws: it runs while a program is failing.
void record_error(const std::string& message, const std::string& type = "error");

struct ErrorRecord {
  std::string message;         // the "message" field, or the file's text when it is not the JSON above
  std::string type, host;
  int rank = -1;
  long pid = -1;
  double timestamp = 0;        // seconds since the epoch; 0 when absent
  std::string path;
};

// Reads an error file; nullopt when it does not exist or is empty.
std::optional<ErrorRecord> read_error_file(const std::string& path);

}  // namespace ingot::distributed::launch
