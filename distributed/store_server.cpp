// TcpStoreServer: one thread, poll() over the listening socket, the client sockets and a wake pipe.
// Blocking requests (get, wait) park as waiters and are answered when a write completes them or when their
// deadline passes; a waiter whose client disconnects is dropped. Nothing here blocks on a client.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <map>
#include <unordered_map>

#include "distributed/store.h"
#include "distributed/store_wire.h"
#include "runtime/error.h"

namespace ingot::distributed {

namespace {

using Clock = std::chrono::steady_clock;

struct Conn {
  std::string in;
  std::string out;
};

struct Waiter {
  int fd;
  wire::Op op;  // kGet or kWait
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

void set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

}  // namespace

struct TcpStoreServer::State {
  std::map<std::string, std::string> data;
  std::unordered_map<int, Conn> conns;
  std::list<Waiter> waiters;
  std::atomic<int> num_clients{0};
  std::atomic<bool> stop{false};

  bool has_all(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (!data.count(k)) return false;
    return true;
  }

  void reply(int fd, wire::Writer& w) { conns[fd].out += w.finish(); }

  // Answers the waiters that are complete now, and (if `now` is given) those past their deadline.
  void service_waiters(const Clock::time_point* now) {
    for (auto it = waiters.begin(); it != waiters.end();) {
      bool done = has_all(it->keys);
      bool expired = !done && now && *now >= it->deadline;
      if (!done && !expired) {
        ++it;
        continue;
      }
      wire::Writer w;
      if (done) {
        w.u8(wire::kOk);
        if (it->op == wire::kGet) w.str(data[it->keys[0]]);
      } else {
        w.u8(wire::kTimeout);
        std::vector<std::string> missing;
        for (const auto& k : it->keys)
          if (!data.count(k)) missing.push_back(k);
        w.u32(static_cast<uint32_t>(missing.size()));
        for (const auto& k : missing) w.str(k);
      }
      reply(it->fd, w);
      it = waiters.erase(it);
    }
  }

  // Handles one request body from `fd`. A malformed body throws; the caller drops the connection.
  void handle(int fd, const std::string& body) {
    wire::Reader r(body);
    wire::Writer w;
    auto op = static_cast<wire::Op>(r.u8());
    bool changed = false;
    switch (op) {
      case wire::kSet: {
        std::string key = r.str();
        data[key] = r.str();
        changed = true;
        w.u8(wire::kOk);
        break;
      }
      case wire::kGet:
      case wire::kWait: {
        std::vector<std::string> keys = op == wire::kGet ? std::vector<std::string>{r.str()} : r.strs();
        int64_t timeout_ms = r.i64();
        waiters.push_back({fd, op, std::move(keys), Clock::now() + std::chrono::milliseconds(timeout_ms)});
        service_waiters(nullptr);
        return;
      }
      case wire::kAdd: {
        std::string key = r.str();
        int64_t delta = r.i64();
        int64_t cur = 0;
        auto it = data.find(key);
        if (it != data.end()) {
          char* end = nullptr;
          errno = 0;
          cur = std::strtoll(it->second.c_str(), &end, 10);
          if (errno || end != it->second.c_str() + it->second.size() || it->second.empty()) {
            w.u8(wire::kFailed).str("add: key '" + key + "' holds a value that is not an integer");
            break;
          }
        }
        cur += delta;
        data[key] = std::to_string(cur);
        changed = true;
        w.u8(wire::kOk).i64(cur);
        break;
      }
      case wire::kCas: {
        std::string key = r.str(), expected = r.str(), desired = r.str();
        auto it = data.find(key);
        std::string current = it == data.end() ? std::string() : it->second;
        if (current == expected) {
          data[key] = desired;
          changed = true;
          current = desired;
        }
        w.u8(wire::kOk).str(current);
        break;
      }
      case wire::kDelete: {
        w.u8(wire::kOk).u8(data.erase(r.str()) ? 1 : 0);
        break;
      }
      case wire::kCheck: {
        w.u8(wire::kOk).u8(has_all(r.strs()) ? 1 : 0);
        break;
      }
      case wire::kNumKeys: {
        w.u8(wire::kOk).i64(static_cast<int64_t>(data.size()));
        break;
      }
      default:
        INGOT_FAIL("tcp store server: unknown op ", static_cast<int>(op));
    }
    reply(fd, w);
    if (changed) service_waiters(nullptr);
  }

  void close_conn(int fd) {
    ::close(fd);
    conns.erase(fd);
    waiters.remove_if([fd](const Waiter& w) { return w.fd == fd; });
    num_clients.store(static_cast<int>(conns.size()));
  }
};

TcpStoreServer::TcpStoreServer(int port, const std::string& host) : state_(std::make_unique<State>()) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res);
  INGOT_CHECK(rc == 0, "tcp store server: cannot resolve '", host, "': ", gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  INGOT_CHECK(listen_fd_ >= 0, "tcp store server: cannot listen on ", host, ":", port, ": ", last_error);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  set_nonblocking(listen_fd_);
  INGOT_CHECK(::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) == 0, "tcp store server: pipe: ", std::strerror(errno));
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  state_->stop = true;
  char c = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_pipe_[1], &c, 1);
  if (thread_.joinable()) thread_.join();
  for (auto& [fd, conn] : state_->conns) ::close(fd);
  ::close(listen_fd_);
  ::close(wake_pipe_[0]);
  ::close(wake_pipe_[1]);
}

int TcpStoreServer::num_clients() const { return state_->num_clients.load(); }

void TcpStoreServer::serve() {
  State& s = *state_;
  std::vector<pollfd> fds;
  while (!s.stop) {
    fds.clear();
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto& [fd, conn] : s.conns)
      fds.push_back({fd, static_cast<short>(POLLIN | (conn.out.empty() ? 0 : POLLOUT)), 0});
    int timeout_ms = -1;
    auto now = Clock::now();
    for (const Waiter& w : s.waiters) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(w.deadline - now).count() + 1;
      int t = static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
      timeout_ms = timeout_ms < 0 ? t : std::min(timeout_ms, t);
    }
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) break;
    if (s.stop) break;
    now = Clock::now();
    s.service_waiters(&now);
    if (n <= 0) continue;
    if (fds[1].revents & POLLIN) {
      while (true) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        s.conns[fd];
        s.num_clients.store(static_cast<int>(s.conns.size()));
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      int fd = fds[i].fd;
      short ev = fds[i].revents;
      if (!ev || !s.conns.count(fd)) continue;
      bool drop = (ev & (POLLERR | POLLNVAL)) != 0;
      if (!drop && (ev & (POLLIN | POLLHUP))) {
        char buf[65536];
        ssize_t got = ::recv(fd, buf, sizeof buf, 0);
        if (got > 0) {
          s.conns[fd].in.append(buf, static_cast<size_t>(got));
        } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
          drop = true;
        }
      }
      // Parse every complete frame received so far.
      while (!drop) {
        std::string& in = s.conns[fd].in;
        if (in.size() < 4) break;
        uint32_t len;
        std::memcpy(&len, in.data(), 4);
        if (len > wire::kMaxFrame) {
          drop = true;
          break;
        }
        if (in.size() < 4 + static_cast<size_t>(len)) break;
        std::string body = in.substr(4, len);
        in.erase(0, 4 + len);
        try {
          s.handle(fd, body);
        } catch (const Error&) {
          drop = true;  // a malformed request: this client is not speaking our protocol
        }
      }
      if (!drop && !s.conns[fd].out.empty()) {
        std::string& out = s.conns[fd].out;
        ssize_t sent = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
        if (sent > 0)
          out.erase(0, static_cast<size_t>(sent));
        else if (sent < 0 && errno != EAGAIN && errno != EINTR)
          drop = true;
      }
      if (drop) s.close_conn(fd);
    }
    // Replies produced for other connections (a set completing someone's wait) go out on the next POLLOUT.
  }
}

}  // namespace ingot::distributed
