// TcpStore client, PrefixStore and the store barrier.
// A client holds one blocking socket. Waits are timed by the server (it answers kTimeout with the missing
// keys), so a timeout leaves the connection usable; the client's own deadline (timeout + grace) only
// catches a server that died or hangs, and then the socket is dropped and reopened by the next call.
#include "distributed/store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <thread>

#include "distributed/store_wire.h"
#include "runtime/error.h"

namespace ingot::distributed {

namespace {

using Clock = std::chrono::steady_clock;

// Extra time the client gives the server to report a timeout itself before declaring it unresponsive.
constexpr Millis kReplyGrace{5000};

std::string join_keys(const std::vector<std::string>& keys) {
  std::ostringstream os;
  for (size_t i = 0; i < keys.size(); ++i) os << (i ? ", " : "") << "'" << keys[i] << "'";
  return os.str();
}

// Tries one connect to host:port; returns the socket or -1 with `err` set.
int try_connect(const std::string& host, int port, std::string& err) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    err = std::string("cannot resolve host: ") + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    err = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

int64_t ms(Millis t) { return static_cast<int64_t>(t.count()); }

}  // namespace

// ---- Store -------------------------------------------------------------------------------------------------

void Store::barrier(const std::string& name, int world_size, Millis timeout) {
  INGOT_CHECK(world_size >= 1, "store barrier '", name, "': world_size must be >= 1, got ", world_size);
  int64_t round;
  {
    std::lock_guard<std::mutex> lock(barrier_mu_);
    round = barrier_calls_[name]++;
  }
  std::string base = "barrier/" + name + "/" + std::to_string(round);
  int64_t arrived = add(base + "/arrived", 1);
  if (arrived == world_size) set(base + "/done", "1");
  try {
    wait({base + "/done"}, timeout);
  } catch (const Error& e) {
    INGOT_FAIL("store barrier '", name, "' (round ", round, "): not all of ", world_size,
               " ranks arrived within ", ms(timeout), " ms (", arrived, " had arrived when this rank did)\n  ",
               e.what());
  }
}

// ---- TcpStore ----------------------------------------------------------------------------------------------

TcpStore::TcpStore(const std::string& host, int port, TcpStoreOptions options)
    : Store(options.timeout), host_(host), port_(port) {
  INGOT_CHECK(port > 0 && port < 65536, "tcp store: port must be in 1..65535, got ", port, " (host ", host, ")");
  auto deadline = Clock::now() + options.connect_timeout;
  std::string err;
  Millis backoff{10};
  while (true) {
    fd_ = try_connect(host_, port_, err);
    if (fd_ >= 0) break;
    // The server may not be up yet (rank 0 or the launcher starts it): retry with a growing pause.
    auto now = Clock::now();
    INGOT_CHECK(now < deadline, "tcp store: could not connect to ", address(), " within ",
                ms(options.connect_timeout), " ms (last error: ", err, ")");
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, Millis(500));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStore::address() const { return host_ + ":" + std::to_string(port_); }

std::string TcpStore::request(const std::string& msg, const std::string& what, Millis wait_for) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) {
    std::string err;
    fd_ = try_connect(host_, port_, err);
    INGOT_CHECK(fd_ >= 0, "tcp store: ", what, ": cannot reconnect to ", address(), ": ", err);
  }
  auto fail = [&](const std::string& why) {
    ::close(fd_);
    fd_ = -1;
    INGOT_FAIL("tcp store: ", what, ": ", why, " (server ", address(), ")");
  };
  size_t off = 0;
  while (off < msg.size()) {
    ssize_t n = ::send(fd_, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(std::string("send failed: ") + std::strerror(errno));
    off += static_cast<size_t>(n);
  }
  auto deadline = Clock::now() + wait_for + kReplyGrace;
  std::string in;
  size_t need = 4;
  bool have_len = false;
  while (in.size() < need) {
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    if (left <= 0) fail("no reply within " + std::to_string(ms(wait_for + kReplyGrace)) + " ms");
    pollfd p{fd_, POLLIN, 0};
    int pr = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, std::min(sizeof buf, need - in.size()), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) fail("server closed the connection");
    if (n < 0) fail(std::string("recv failed: ") + std::strerror(errno));
    in.append(buf, static_cast<size_t>(n));
    if (!have_len && in.size() == 4) {
      uint32_t len;
      std::memcpy(&len, in.data(), 4);
      if (len > wire::kMaxFrame) fail("reply frame too large");
      need = 4 + len;
      have_len = true;
    }
  }
  std::string body = in.substr(4);
  INGOT_CHECK(!body.empty(), "tcp store: ", what, ": empty reply from ", address());
  return body;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  std::string body = request(wire::Writer().u8(wire::kSet).str(key).str(value).finish(),
                             "set '" + key + "'", timeout());
  INGOT_INTERNAL_CHECK(static_cast<uint8_t>(body[0]) == wire::kOk);
}

std::string TcpStore::get(const std::string& key, Millis timeout) {
  std::string body = request(wire::Writer().u8(wire::kGet).str(key).i64(ms(timeout)).finish(),
                             "get '" + key + "'", timeout);
  wire::Reader r(body);
  uint8_t status = r.u8();
  INGOT_CHECK(status != wire::kTimeout, "tcp store: get '", key, "': key did not appear within ", ms(timeout),
              " ms (server ", address(), ")");
  return r.str();
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string body = request(wire::Writer().u8(wire::kAdd).str(key).i64(delta).finish(),
                             "add '" + key + "'", timeout());
  wire::Reader r(body);
  uint8_t status = r.u8();
  if (status == wire::kFailed) INGOT_FAIL("tcp store: ", r.str(), " (server ", address(), ")");
  return r.i64();
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  std::string body = request(wire::Writer().u8(wire::kCas).str(key).str(expected).str(desired).finish(),
                             "compare_set '" + key + "'", timeout());
  wire::Reader r(body);
  r.u8();
  return r.str();
}

bool TcpStore::delete_key(const std::string& key) {
  std::string body = request(wire::Writer().u8(wire::kDelete).str(key).finish(), "delete '" + key + "'",
                             timeout());
  wire::Reader r(body);
  r.u8();
  return r.u8() != 0;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  wire::Writer w;
  w.u8(wire::kCheck).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  std::string body = request(w.finish(), "check " + join_keys(keys), timeout());
  wire::Reader r(body);
  r.u8();
  return r.u8() != 0;
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  wire::Writer w;
  w.u8(wire::kWait).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  w.i64(ms(timeout));
  std::string body = request(w.finish(), "wait for " + join_keys(keys), timeout);
  wire::Reader r(body);
  if (r.u8() == wire::kTimeout) {
    INGOT_FAIL("tcp store: wait timed out after ", ms(timeout), " ms; still missing: ", join_keys(r.strs()),
               " (server ", address(), ")");
  }
}

int64_t TcpStore::num_keys() {
  std::string body = request(wire::Writer().u8(wire::kNumKeys).finish(), "num_keys", timeout());
  wire::Reader r(body);
  r.u8();
  return r.i64();
}

// ---- PrefixStore -------------------------------------------------------------------------------------------

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : Store(base->timeout()), prefix_(std::move(prefix)), base_(std::move(base)) {}

std::vector<std::string> PrefixStore::k(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& key : keys) out.push_back(k(key));
  return out;
}

void PrefixStore::set(const std::string& key, const std::string& value) { base_->set(k(key), value); }
std::string PrefixStore::get(const std::string& key, Millis timeout) { return base_->get(k(key), timeout); }
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return base_->add(k(key), delta); }
std::string PrefixStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  return base_->compare_set(k(key), expected, desired);
}
bool PrefixStore::delete_key(const std::string& key) { return base_->delete_key(k(key)); }
bool PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(k(keys)); }
void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) { base_->wait(k(keys), timeout); }
int64_t PrefixStore::num_keys() { return base_->num_keys(); }

}  // namespace ingot::distributed
