// How the launchers of a job find each other, agree on ranks, and tell each other about failures, all through
// one TcpStore. One launcher hosts the store (node 0 with --master-addr/--master-port, the launcher on the
// --rdzv-endpoint host in dynamic mode, or this launcher alone); workers use the same store afterwards
// (MASTER_ADDR/MASTER_PORT), under their own key prefix.
//
// Keys, under "launch/<run id>/":
//   round/<r>/joined            join counter (dynamic: the join order is the node rank)
//   round/<r>/node/<n>          "<nproc> <host>" of node n
//   round/<r>/closed            the number of nodes of round r (dynamic MIN:MAX: fixed by whoever closes it)
//   round/<r>/failure           the first failure's description; every node stops its workers and restarts
//   round/<r>/done              count of nodes whose workers all succeeded
//   final                       set when a node gives up (no restarts left, interrupted): all nodes stop
//   left                        count of launchers finished; the host keeps the store up until all left
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "distributed/launch/options.h"
#include "distributed/store.h"

namespace ingot::distributed::launch {

class SignalWatch;

// A stop signal arrived while the launcher was waiting for the other nodes.
struct Interrupted {
  int signal;
};

struct NodeAssignment {
  int round = 0;
  int node_rank = 0, num_nodes = 1;
  int rank_offset = 0, world_size = 1;  // this node's workers are ranks rank_offset .. + local world size
};

class Rendezvous {
 public:
  // Hosts or connects to the store. Throws ingot::Error naming the address when neither works.
  Rendezvous(const LaunchOptions& opts, std::string run_id, int local_world_size, SignalWatch& signals);
  ~Rendezvous();

  // Joins round `round` and waits (watching for stop signals, which throw Interrupted) until the nodes of the
  // round are known. Throws ingot::Error after join_timeout or when the round is closed or full.
  NodeAssignment join(int round);

  // The first failure of a round wins; later reports are ignored. Returns the winning description.
  std::string report_failure(int round, const std::string& description);
  std::optional<std::string> failure(int round);
  // Ends the job for every node (no restarts left, or interrupted).
  void report_final(const std::string& description);
  std::optional<std::string> final_failure();
  void report_done(int round);
  bool all_done(const NodeAssignment& a);
  // Called once at the end; the host waits (up to `timeout_s`) for every node to leave before closing the store.
  void leave(int num_nodes, double timeout_s);

  bool hosting() const { return server_ != nullptr; }
  const std::string& store_host() const { return store_host_; }  // what workers get as MASTER_ADDR
  int store_port() const { return store_port_; }
  Store& store() { return *store_; }

 private:
  std::string key(const std::string& k) const { return "launch/" + run_id_ + "/" + k; }
  std::string round_key(int round, const std::string& k) const;
  // Polls check(keys) until they exist, a stop signal (throws Interrupted) or the deadline (returns false).
  bool wait_keys(const std::vector<std::string>& keys, double deadline_s);

  const LaunchOptions& opts_;
  std::string run_id_;
  int local_world_size_;
  SignalWatch& signals_;
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<TcpStore> store_;
  std::string store_host_;
  int store_port_ = 0;
  std::string hostname_;
};

// This machine's host name (what failure reports print).
std::string local_hostname();

}  // namespace ingot::distributed::launch
