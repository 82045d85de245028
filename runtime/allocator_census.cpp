// The allocation census (Note [Allocation census], allocator_census.h): one book per allocator.
#include "runtime/allocator_census.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "runtime/allocator.h"
#include "runtime/error.h"

namespace ingot::census {
namespace {

// Owners are interned: a book counts per owner index. 0 is "other", 1 "before the census".
constexpr int kOther = 0, kBefore = 1;

struct Names {
  std::mutex mu;
  std::vector<std::string> names{"other", "before the census"};
  std::map<std::string, int, std::less<>> index{{"other", kOther}, {"before the census", kBefore}};
};
Names& names() {
  static Names* n = new Names();  // never destroyed: allocations may outlive static destruction
  return *n;
}

int intern(std::string_view owner) {
  Names& n = names();
  std::lock_guard<std::mutex> g(n.mu);
  auto it = n.index.find(owner);
  if (it != n.index.end()) return it->second;
  n.names.emplace_back(owner);
  const int i = static_cast<int>(n.names.size()) - 1;
  n.index.emplace(std::string(owner), i);
  return i;
}

std::string name_of(int i) {
  Names& n = names();
  std::lock_guard<std::mutex> g(n.mu);
  return n.names[static_cast<size_t>(i)];
}

thread_local int t_owner = kOther;

bool env_names_memory() {
  const char* env = std::getenv("INGOT_LOGS");
  if (!env) return false;
  std::string_view s(env);
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t end = std::min(s.find(',', pos), s.size());
    const std::string_view item = s.substr(pos, end - pos);
    if (item == "memory" || item == "all") return true;
    pos = end + 1;
  }
  return false;
}

std::atomic<bool> g_started{false};

struct Block {
  int64_t bytes = 0;
  int owner = kOther;
};

// One allocator's census. `total` equals the allocator's allocated bytes: blocks it does not know (allocated
// before the census started) are counted under kBefore from their allocator's count at the first event.
class Book {
 public:
  void allocated(const void* p, int64_t bytes, int64_t allocated_before) {
    std::lock_guard<std::mutex> g(mu_);
    if (!seeded_) seed(allocated_before);
    live_[p] = Block{bytes, t_owner};
    add(t_owner, bytes, 1);
    total_ += bytes;
    if (total_ > peak_) {
      peak_ = total_;
      peak_bytes_ = bytes_;
      peak_blocks_ = blocks_;
    }
  }
  void freed(const void* p, int64_t bytes) {
    std::lock_guard<std::mutex> g(mu_);
    if (!seeded_) return;  // everything before the first allocation it saw is in the seed
    auto it = live_.find(p);
    if (it == live_.end()) {
      add(kBefore, -bytes, -1);
    } else {
      add(it->second.owner, -it->second.bytes, -1);
      live_.erase(it);
    }
    total_ -= bytes;
  }
  void attribute(const void* p, int owner) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = live_.find(p);
    if (it == live_.end() || it->second.owner == owner) return;
    add(it->second.owner, -it->second.bytes, -1);
    it->second.owner = owner;
    add(owner, it->second.bytes, 1);
  }
  int owner_of(const void* p) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = live_.find(p);
    return it == live_.end() ? -1 : it->second.owner;
  }
  Snapshot snapshot() {
    std::lock_guard<std::mutex> g(mu_);
    Snapshot s;
    s.peak_bytes = peak_;
    s.current_bytes = total_;
    for (size_t i = 0; i < peak_bytes_.size(); ++i)
      if (peak_bytes_[i] != 0 || peak_blocks_[i] != 0)
        s.owners.push_back({name_of(static_cast<int>(i)), peak_bytes_[i], peak_blocks_[i]});
    std::sort(s.owners.begin(), s.owners.end(), [](const Share& a, const Share& b) { return a.bytes > b.bytes; });
    return s;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> g(mu_);
    peak_ = total_;
    peak_bytes_ = bytes_;
    peak_blocks_ = blocks_;
  }

 private:
  void seed(int64_t allocated_before) {
    seeded_ = true;
    total_ = peak_ = allocated_before;
    add(kBefore, allocated_before, 0);
    peak_bytes_ = bytes_;
    peak_blocks_ = blocks_;
  }
  void add(int owner, int64_t bytes, int64_t blocks) {
    const size_t i = static_cast<size_t>(owner);
    if (bytes_.size() <= i) {
      bytes_.resize(i + 1, 0);
      blocks_.resize(i + 1, 0);
    }
    bytes_[i] += bytes;
    blocks_[i] += blocks;
  }

  std::mutex mu_;
  bool seeded_ = false;
  std::unordered_map<const void*, Block> live_;
  std::vector<int64_t> bytes_, blocks_, peak_bytes_, peak_blocks_;  // per owner: now, and at the peak
  int64_t total_ = 0, peak_ = 0;
};

Book& book(Device d) {
  // The CPU's and up to 64 CUDA devices'; never destroyed (frees may come during static destruction).
  static std::vector<Book*>* books = [] {
    auto* v = new std::vector<Book*>();
    for (int i = 0; i < 65; ++i) v->push_back(new Book());
    return v;
  }();
  const size_t i = d.is_cpu() ? 0 : static_cast<size_t>(d.index) + 1;
  INGOT_CHECK(i < books->size(), "census: device ", d.str(), " is beyond the 64 CUDA devices it keeps books for");
  return *(*books)[i];
}

}  // namespace

bool on() {
  static const bool from_env = env_names_memory();
  return from_env || g_started.load(std::memory_order_relaxed);
}

void start() { g_started.store(true); }

Owner::Owner(std::string_view owner) : previous_(t_owner) {
  if (on()) t_owner = intern(owner);
}
Owner::~Owner() { t_owner = previous_; }

void attribute(const Storage& s, std::string_view owner) {
  if (!on() || !s.data) return;
  book(s.device).attribute(s.data.get(), intern(owner));
}

std::string owner_of(const Storage& s) {
  if (!on() || !s.data) return "";
  const int o = book(s.device).owner_of(s.data.get());
  return o < 0 ? "" : name_of(o);
}

Snapshot at_peak(Device d) { return book(d).snapshot(); }
void reset_peak(Device d) { book(d).reset_peak(); }

std::string format(const Snapshot& s, Device d) {
  std::ostringstream os;
  os << "census of " << d.str() << "'s allocator at its peak: " << static_cast<double>(s.peak_bytes) / 1e6
     << " MB (now " << static_cast<double>(s.current_bytes) / 1e6 << " MB)";
  for (const Share& o : s.owners)
    os << "\n  " << static_cast<double>(o.bytes) / 1e6 << " MB  "
       << (s.peak_bytes > 0 ? 100.0 * static_cast<double>(o.bytes) / static_cast<double>(s.peak_bytes) : 0.0)
       << "%  " << o.owner << " (" << o.blocks << " blocks)";
  return os.str();
}

void on_allocate(Device d, const void* p, int64_t bytes, int64_t allocated_before) {
  if (on()) book(d).allocated(p, bytes, allocated_before);
}

void on_free(Device d, const void* p, int64_t bytes) {
  if (on()) book(d).freed(p, bytes);
}

}  // namespace ingot::census
