#include "recipes/tfevents.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "recipes/hash.h"
#include "recipes/proto/tfevents.pb.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  INGOT_CHECK(!ec, "cannot create TensorBoard directory '", dir, "': ", ec.message());
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  path_ = (fs::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + "." +
                            host))
              .string();
  f_ = std::fopen(path_.c_str(), "wb");
  INGOT_CHECK(f_ != nullptr, "cannot create TensorBoard event file '", path_, "': ", std::strerror(errno));
  tfevents::Event e;
  e.set_wall_time(now_seconds());
  e.set_file_version("brain.Event:2");
  record(e.SerializeAsString());
}

EventWriter::~EventWriter() {
  if (f_) std::fclose(f_);
}

void EventWriter::record(const std::string& data) {
  std::string rec;
  put_le(rec, data.size(), 8);
  put_le(rec, masked_crc32c(rec.data(), 8), 4);
  rec += data;
  put_le(rec, masked_crc32c(data.data(), data.size()), 4);
  INGOT_CHECK(std::fwrite(rec.data(), 1, rec.size(), f_) == rec.size() && std::fflush(f_) == 0,
              "cannot write TensorBoard event file '", path_, "': ", std::strerror(errno));
}

void EventWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  tfevents::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  for (const auto& [tag, v] : values) {
    tfevents::Summary::Value* sv = e.mutable_summary()->add_value();
    sv->set_tag(tag);
    sv->set_simple_value(static_cast<float>(v));
  }
  record(e.SerializeAsString());
}

std::vector<EventScalar> read_event_file(const std::string& path, std::string* file_version) {
  std::string bytes = read_file(path);
  std::vector<EventScalar> out;
  size_t pos = 0;
  bool first = true;
  while (pos < bytes.size()) {
    INGOT_CHECK(bytes.size() - pos >= 12, path, ": truncated record header at offset ", pos);
    uint64_t len = get_le(&bytes[pos], 8);
    INGOT_CHECK(get_le(&bytes[pos + 8], 4) == masked_crc32c(&bytes[pos], 8), path,
                ": bad length checksum in the record at offset ", pos);
    INGOT_CHECK(len <= bytes.size() - pos - 12 && bytes.size() - pos - 12 - len >= 4, path,
                ": truncated record at offset ", pos);
    const char* data = &bytes[pos + 12];
    INGOT_CHECK(get_le(data + len, 4) == masked_crc32c(data, len), path, ": bad data checksum in the record at offset ",
                pos);
    tfevents::Event e;
    INGOT_CHECK(e.ParseFromArray(data, static_cast<int>(len)), path, ": record at offset ", pos,
                " is not an Event");
    if (first && file_version) *file_version = e.file_version();
    first = false;
    if (e.has_summary())
      for (const auto& v : e.summary().value()) out.push_back({e.step(), v.tag(), v.simple_value()});
    pos += 12 + len + 4;
  }
  return out;
}

}  // namespace ingot::recipes
