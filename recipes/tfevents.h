// TensorBoard event files: a sequence of TFRecords, each
//   uint64 length (little-endian) | uint32 masked CRC-32C of the length bytes | data | uint32 masked CRC-32C
// of the data, where data is a serialized Event (recipes/proto/tfevents.proto). The first record carries
// file_version "brain.Event:2"; then one Event per logged scalar set.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace ingot::recipes {

class EventWriter {
 public:
  // Creates <dir>/events.out.tfevents.<unix seconds>.<hostname> (the name TensorBoard looks for).
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  // One Event at `step` with these (tag, value) scalars; flushed so a live TensorBoard sees it.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& data);
  std::string path_;
  std::FILE* f_ = nullptr;
};

struct EventScalar {
  int64_t step = 0;
  std::string tag;
  float value = 0;
};

// Reads an event file back, checking every record's length and both checksums; returns the scalars and
// sets *file_version from the first record. Throws ingot::Error naming the file and the record offset.
std::vector<EventScalar> read_event_file(const std::string& path, std::string* file_version = nullptr);

}  // namespace ingot::recipes
