#include "distributed/launch/error_file.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "runtime/file_util.h"

namespace ingot::distributed::launch {

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

}  // namespace

void record_error(const std::string& message, const std::string& type) {
  const char* path = std::getenv("INGOT_ERROR_FILE");
  if (!path || !*path) return;
  try {
    if (std::filesystem::exists(path)) return;
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    nlohmann::json j = {{"message", message},
                        {"type", type},
                        {"rank", env_int("RANK")},
                        {"local_rank", env_int("LOCAL_RANK")},
                        {"restart_count", env_int("INGOT_RESTART_COUNT")},
                        {"pid", static_cast<long>(getpid())},
                        {"host", std::string(host)},
                        {"timestamp", now}};
    std::string text = j.dump(2) + "\n";
    write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, text.data(), text.size()); });
  } catch (...) {
    // The program is already failing with `message`; a second error about the error file would hide it.
  }
}

std::optional<ErrorRecord> read_error_file(const std::string& path) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return std::nullopt;
  std::string text;
  try {
    text = read_file(path);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return std::nullopt;
  ErrorRecord r;
  r.path = path;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("message")) {
    // Any other content (a worker that wrote plain text) is shown as it is, cut to a readable size.
    r.message = text.size() > 4000 ? text.substr(0, 4000) + "..." : text;
    while (!r.message.empty() && (r.message.back() == '\n' || r.message.back() == '\r')) r.message.pop_back();
    return r;
  }
  const nlohmann::json& m = j["message"];
  r.message = m.is_string() ? m.get<std::string>() : m.dump();
  if (j.contains("type") && j["type"].is_string()) r.type = j["type"].get<std::string>();
  if (j.contains("host") && j["host"].is_string()) r.host = j["host"].get<std::string>();
  if (j.contains("rank") && j["rank"].is_number_integer()) r.rank = j["rank"].get<int>();
  if (j.contains("pid") && j["pid"].is_number_integer()) r.pid = j["pid"].get<long>();
  if (j.contains("timestamp") && j["timestamp"].is_number()) r.timestamp = j["timestamp"].get<double>();
  return r;
}

}  // namespace ingot::distributed::launch
