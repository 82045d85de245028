#include "distributed/launch/rendezvous.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <sstream>

#include "distributed/launch/workers.h"
#include "runtime/error.h"

namespace ingot::distributed::launch {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Millis to_ms(double s) { return Millis(static_cast<int64_t>(s * 1000)); }

// True when `host` names an address of this machine: binding a socket to it succeeds only then.
bool is_local_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "0", &hints, &res) != 0) return false;
  bool local = false;
  for (addrinfo* a = res; a && !local; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    local = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(res);
  return local;
}

}  // namespace

std::string local_hostname() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

Rendezvous::Rendezvous(const LaunchOptions& opts, std::string run_id, int local_world_size, SignalWatch& signals)
    : opts_(opts), run_id_(std::move(run_id)), local_world_size_(local_world_size), signals_(signals) {
  hostname_ = opts.local_addr.empty() ? local_hostname() : opts.local_addr;
  TcpStoreOptions so;
  so.connect_timeout = to_ms(opts.join_timeout_s());
  std::string connect_host;
  if (opts.dynamic()) {
    size_t colon = opts.rdzv_endpoint.rfind(':');
    store_host_ = opts.rdzv_endpoint.substr(0, colon);
    store_port_ = std::stoi(opts.rdzv_endpoint.substr(colon + 1));
    // The first launcher on the endpoint's host serves the store; the others there find the port taken.
    if (is_local_address(store_host_)) {
      try {
        server_ = std::make_unique<TcpStoreServer>(store_port_, "0.0.0.0");
      } catch (const Error&) {
      }
    }
    connect_host = store_host_;
  } else if (opts.max_nodes == 1) {
    // Alone: the store listens where the workers will look for it, on a free port unless one was given.
    store_host_ = opts.standalone ? (opts.local_addr.empty() ? "127.0.0.1" : opts.local_addr) : opts.master_addr;
    server_ = std::make_unique<TcpStoreServer>(opts.standalone ? 0 : opts.master_port, store_host_);
    store_port_ = server_->port();
    connect_host = store_host_;
  } else {
    store_host_ = opts.master_addr;
    store_port_ = opts.master_port;
    if (opts.node_rank == 0) {
      try {
        server_ = std::make_unique<TcpStoreServer>(store_port_, "0.0.0.0");
      } catch (const Error& e) {
        INGOT_FAIL("node rank 0 hosts the rendezvous store on --master-port ", store_port_,
                   " but cannot (is another launcher with --node-rank 0, or another program, using the port?): ",
                   e.what());
      }
    }
    connect_host = opts.node_rank == 0 ? "127.0.0.1" : store_host_;
  }
  store_ = std::make_shared<TcpStore>(connect_host, store_port_, so);
}

Rendezvous::~Rendezvous() = default;

std::string Rendezvous::round_key(int round, const std::string& k) const {
  return key("round/" + std::to_string(round) + "/" + k);
}

bool Rendezvous::wait_keys(const std::vector<std::string>& keys, double deadline_s) {
  while (true) {
    if (store_->check(keys)) return true;
    signals_.consume();
    if (signals_.stop_requests() > 0) throw Interrupted{signals_.first_stop_signal()};
    if (auto f = final_failure()) INGOT_FAIL("the job ended on another node: ", *f);
    if (now_s() > deadline_s) return false;
    pollfd p{signals_.fd(), POLLIN, 0};
    ::poll(&p, 1, 20);
  }
}

NodeAssignment Rendezvous::join(int round) {
  NodeAssignment a;
  a.round = round;
  double deadline = now_s() + opts_.join_timeout_s();
  std::ostringstream info_os;
  info_os << local_world_size_ << " " << hostname_ << " " << getpid();
  const std::string info = info_os.str();
  std::string where = "rendezvous '" + run_id_ + "' (store " + store_host_ + ":" + std::to_string(store_port_) +
                      ", round " + std::to_string(round) + ")";

  if (!opts_.dynamic()) {
    a.node_rank = opts_.node_rank;
    a.num_nodes = opts_.max_nodes;
    std::string mine = round_key(round, "node/" + std::to_string(a.node_rank));
    std::string got = store_->compare_set(mine, "", info);
    INGOT_CHECK(got == info, where, ": --node-rank ", a.node_rank,
                " was already taken by another launcher (nproc, host, pid: ", got,
                "); give each node its own --node-rank");
  } else {
    std::string joined_key = round_key(round, "joined"), closed_key = round_key(round, "closed");
    int64_t idx = store_->add(joined_key, 1) - 1;
    INGOT_CHECK(idx < opts_.max_nodes, where, " is full: ", opts_.max_nodes,
                " nodes (--nnodes) have already joined");
    store_->set(round_key(round, "node/" + std::to_string(idx)), info);
    double min_reached_at = -1;
    int64_t closed = -1;
    while (closed < 0) {
      if (store_->check({closed_key})) {
        closed = std::stoll(store_->get(closed_key));
        break;
      }
      int64_t joined = store_->add(joined_key, 0);
      if (joined >= opts_.min_nodes && min_reached_at < 0) min_reached_at = now_s();
      bool close_now = joined >= opts_.max_nodes ||
                       (min_reached_at >= 0 && now_s() - min_reached_at >= opts_.last_call_timeout_s());
      if (close_now) {
        closed = std::stoll(store_->compare_set(closed_key, "", std::to_string(joined)));
        break;
      }
      if (!wait_keys({closed_key}, std::min(deadline, now_s() + 0.05)) && now_s() > deadline)
        INGOT_FAIL(where, ": only ", joined, " of ", opts_.min_nodes,
                   " nodes (--nnodes) joined within ", opts_.join_timeout_s(),
                   " s (rdzv_conf join_timeout); are the other launchers started with the same --rdzv-endpoint and "
                   "--rdzv-id?");
    }
    INGOT_CHECK(idx < closed, where, " closed with ", closed,
                " nodes before this node joined; start it again to join the next run");
    a.node_rank = static_cast<int>(idx);
    a.num_nodes = static_cast<int>(closed);
  }

  std::vector<std::string> node_keys;
  for (int n = 0; n < a.num_nodes; ++n) node_keys.push_back(round_key(round, "node/" + std::to_string(n)));
  if (!wait_keys(node_keys, deadline)) {
    std::string missing;
    for (int n = 0; n < a.num_nodes; ++n)
      if (!store_->check({node_keys[n]})) missing += (missing.empty() ? "" : ", ") + std::to_string(n);
    INGOT_FAIL(where, ": node(s) ", missing, " of ", a.num_nodes, " did not join within ",
               opts_.join_timeout_s(), " s (rdzv_conf join_timeout)");
  }
  a.world_size = 0;
  for (int n = 0; n < a.num_nodes; ++n) {
    int nproc = std::stoi(store_->get(node_keys[n]));
    if (n < a.node_rank) a.rank_offset += nproc;
    a.world_size += nproc;
  }
  return a;
}

std::string Rendezvous::report_failure(int round, const std::string& description) {
  std::string got = store_->compare_set(round_key(round, "failure"), "", description);
  return got;
}

std::optional<std::string> Rendezvous::failure(int round) {
  std::string k = round_key(round, "failure");
  if (!store_->check({k})) return std::nullopt;
  return store_->get(k);
}

void Rendezvous::report_final(const std::string& description) {
  store_->compare_set(key("final"), "", description);
}

std::optional<std::string> Rendezvous::final_failure() {
  if (!store_->check({key("final")})) return std::nullopt;
  return store_->get(key("final"));
}

void Rendezvous::report_done(int round) { store_->add(round_key(round, "done"), 1); }

bool Rendezvous::all_done(const NodeAssignment& a) {
  return store_->add(round_key(a.round, "done"), 0) >= a.num_nodes;
}

void Rendezvous::leave(int num_nodes, double timeout_s) {
  int64_t left = store_->add(key("left"), 1);
  if (!server_) return;
  // Others may still be reading the outcome from our store: wait for them, but never forever.
  double deadline = now_s() + timeout_s;
  while (left < num_nodes && now_s() < deadline) {
    pollfd p{signals_.fd(), POLLIN, 0};
    ::poll(&p, 1, 20);
    signals_.consume();
    if (signals_.stop_requests() > 1) return;
    left = store_->add(key("left"), 0);
  }
}

}  // namespace ingot::distributed::launch
