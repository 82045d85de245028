// Key-value store for rendezvous: ranks publish and wait for small values (addresses, NCCL ids, counters).
//   TcpStoreServer   the server; hosted by `ingot launch` or by rank 0 (see bootstrap.h), one thread, poll()
//   TcpStore         a client; connects with retry until connect_timeout, each call thread-safe
//   PrefixStore      a view that prefixes every key (one namespace per process group / restart)
// Values are byte strings (std::string holds any bytes). Every blocking call has a timeout; a timeout is an
// ingot::Error naming the key(s) still missing, the timeout and the server address, never a hang.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ingot::distributed {

using Millis = std::chrono::milliseconds;

// The interface every store offers. get() and wait() block until the key(s) exist or the timeout passes.
class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits for `key` up to `timeout` (default timeout()), then returns its value.
  virtual std::string get(const std::string& key, Millis timeout) = 0;
  std::string get(const std::string& key) { return get(key, timeout()); }
  // Atomically adds `delta` to the integer stored at `key` (absent = 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets `key` to `desired` if its current value is `expected` (an absent key matches expected == "");
  // returns the value after the call (desired on success, the current value otherwise).
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;
  // Removes `key`; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;
  // True if every key exists now (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists; throws naming the missing keys after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Number of keys in the whole store (all prefixes).
  virtual int64_t num_keys() = 0;

  // Blocks until `world_size` callers have entered the barrier called `name`. Repeated calls with the same
  // name form successive barriers (each caller counts its own calls, so all ranks must call equally often).
  void barrier(const std::string& name, int world_size, Millis timeout);
  void barrier(const std::string& name, int world_size) { barrier(name, world_size, timeout()); }

  Millis timeout() const { return timeout_; }
  void set_timeout(Millis t) { timeout_ = t; }

 protected:
  explicit Store(Millis timeout) : timeout_(timeout) {}

 private:
  Millis timeout_;
  std::mutex barrier_mu_;
  std::map<std::string, int64_t> barrier_calls_;
};

// The server. Binds host:port (port 0 = any free port; read it back with port()) and serves on one thread
// until destroyed. Throws if the port cannot be bound, naming host and port.
class TcpStoreServer {
 public:
  explicit TcpStoreServer(int port = 0, const std::string& host = "0.0.0.0");
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // Number of client connections open now (the launcher uses it to see workers attach).
  int num_clients() const;

 private:
  struct State;
  void serve();
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  int port_ = 0;
  std::unique_ptr<State> state_;
  std::thread thread_;
};

struct TcpStoreOptions {
  Millis connect_timeout{30000};  // retry connecting this long (the server may start after the client)
  Millis timeout{300000};         // default for get/wait/barrier
};

class TcpStore final : public Store {
 public:
  TcpStore(const std::string& host, int port, TcpStoreOptions options = {});
  ~TcpStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Millis timeout) override;
  using Store::get;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool delete_key(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  using Store::wait;
  int64_t num_keys() override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  std::string request(const std::string& msg, const std::string& what, Millis deadline);
  std::string address() const;
  std::string host_;
  int port_;
  int fd_ = -1;
  std::mutex mu_;
};

// A view of `base` in which every key is "<prefix>/<key>". Shares base's connection.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Millis timeout) override;
  using Store::get;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool delete_key(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  using Store::wait;
  int64_t num_keys() override;

  Store& base() { return *base_; }

 private:
  std::string k(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> k(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace ingot::distributed
