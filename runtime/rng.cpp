#include "runtime/rng.h"

#include <map>

namespace ingot {
namespace {
std::mutex g_mu;
uint64_t g_seed = 0;  // given to generators created after the last manual_seed
std::map<std::pair<int, int>, Generator*>& generators() {
  static auto* m = new std::map<std::pair<int, int>, Generator*>();
  return *m;
}
}  // namespace

Generator& default_generator(Device d) {
  std::lock_guard<std::mutex> g(g_mu);
  auto key = std::make_pair(static_cast<int>(d.type), d.index);
  auto& m = generators();
  auto it = m.find(key);
  if (it == m.end()) it = m.emplace(key, new Generator(g_seed)).first;
  return *it->second;
}

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> g(g_mu);
  g_seed = seed;
  for (auto& [k, gen] : generators()) gen->manual_seed(seed);
}

}  // namespace ingot
