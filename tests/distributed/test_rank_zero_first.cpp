// rank_zero_first: rank 0 finishes before the others start; its failure reaches them; waiting times out by name.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "distributed/rank_zero_first.h"
#include "runtime/error.h"

namespace ingot::distributed {
namespace {

using namespace std::chrono_literals;

TEST(RankZeroFirst, OtherRanksStartOnlyAfterRankZeroFinished) {
  TcpStoreServer server(0, "127.0.0.1");
  std::atomic<int> rank0_done{0}, others_saw_done{0};
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r)
    ts.emplace_back([&, r] {
      TcpStore s("127.0.0.1", server.port());
      for (int round = 0; round < 2; ++round)
        rank_zero_first(s, r, "compile/" + std::to_string(round), [&] {
          if (r == 0) {
            std::this_thread::sleep_for(50ms);
            rank0_done++;
          } else if (rank0_done.load() == round + 1) {
            others_saw_done++;
          }
        }, 2000ms);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(rank0_done.load(), 2);
  EXPECT_EQ(others_saw_done.load(), 4);
}

TEST(RankZeroFirst, ARankZeroFailureReachesTheOthersAndATimeoutNamesTheJob) {
  TcpStoreServer server(0, "127.0.0.1");
  std::string other_error;
  std::thread t1([&] {
    TcpStore s("127.0.0.1", server.port());
    try {
      rank_zero_first(s, 1, "tokenize", [] { FAIL() << "rank 1 must not run after rank 0 failed"; }, 2000ms);
    } catch (const Error& e) {
      other_error = e.what();
    }
  });
  TcpStore s0("127.0.0.1", server.port());
  EXPECT_THROW(rank_zero_first(s0, 0, "tokenize", [] { throw Error("disk full"); }, 2000ms), Error);
  t1.join();
  EXPECT_NE(other_error.find("rank 0 failed while running 'tokenize' first: disk full"), std::string::npos)
      << other_error;

  TcpStore s1("127.0.0.1", server.port());
  try {
    rank_zero_first(s1, 1, "lonely", [] {}, 100ms);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("waited 100 ms for rank 0 to finish 'lonely'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank_zero_first/lonely"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace ingot::distributed
