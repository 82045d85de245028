#include "compile/logs.h"

#include <array>
#include <cstdlib>
#include <unistd.h>
#include <iostream>
#include <mutex>

#include "runtime/error.h"

namespace ingot::compiler {
namespace {

constexpr std::array<std::pair<std::string_view, LogKind>, 10> kKinds{{
    {"graph", LogKind::Graph}, {"passes", LogKind::Passes}, {"recompiles", LogKind::Recompiles},
    {"graph_breaks", LogKind::GraphBreaks}, {"guards", LogKind::Guards}, {"output_code", LogKind::OutputCode},
    {"schedule", LogKind::Schedule}, {"perf", LogKind::Perf}, {"progress", LogKind::Progress},
    {"memory", LogKind::Memory},
}};

std::mutex g_mu;
unsigned g_mask = 0;
bool g_init = false;

unsigned parse(std::string_view spec) {
  unsigned mask = 0;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string_view::npos) end = spec.size();
    std::string_view item = spec.substr(pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) {
      if (item == "all") {
        mask = ~0u;
      } else {
        bool found = false;
        for (const auto& [name, kind] : kKinds)
          if (name == item) {
            mask |= 1u << static_cast<unsigned>(kind);
            found = true;
          }
        INGOT_CHECK(found, "INGOT_LOGS: unknown log kind '", item, "'; expected a comma list of graph, passes, ",
                    "recompiles, graph_breaks, guards, output_code, schedule, perf, progress, memory or all");
      }
    }
    pos = end + 1;
  }
  return mask;
}

unsigned mask() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_init) {
    g_init = true;
    const char* env = std::getenv("INGOT_LOGS");
    if (!env && isatty(2)) g_mask = 1u << static_cast<unsigned>(LogKind::Progress);
    if (env) {
      try {
        g_mask = parse(env);
      } catch (const Error& e) {
        std::cerr << "[ingot] warning: " << e.what() << "\n";
      }
    }
  }
  return g_mask;
}

}  // namespace

bool log_on(LogKind k) { return (mask() >> static_cast<unsigned>(k)) & 1u; }

void log(LogKind k, std::string_view text) {
  std::string_view name = "progress";
  for (const auto& [n, kind] : kKinds)
    if (kind == k) name = n;
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    out += "[ingot:";
    out += name;
    out += "] ";
    out += text.substr(pos, end - pos);
    out += "\n";
    pos = end + 1;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  std::cerr << out << std::flush;
}

void set_logs(std::string_view spec) {
  const unsigned m = parse(spec);
  mask();  // consume the environment first so it cannot override this later
  std::lock_guard<std::mutex> lock(g_mu);
  g_mask = m;
}

}  // namespace ingot::compiler
