// TcpStore / TcpStoreServer / PrefixStore: every operation, the blocking semantics, and the timeout errors.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "distributed/store.h"
#include "runtime/error.h"
#include "tests/testing.h"

namespace ingot::distributed {
namespace {

using namespace std::chrono_literals;

TcpStoreOptions quick(Millis timeout = 2000ms) {
  TcpStoreOptions o;
  o.connect_timeout = 2000ms;
  o.timeout = timeout;
  return o;
}

using ingot::testing::error_of;

TEST(TcpStore, SetThenGetReturnsTheSameBytesIncludingZeros) {
  TcpStoreServer server;
  TcpStore store("127.0.0.1", server.port(), quick());
  std::string value("a\0b\xff", 4);
  store.set("k", value);
  EXPECT_EQ(store.get("k"), value);
  store.set("k", "second");
  EXPECT_EQ(store.get("k"), "second");
}

TEST(TcpStore, ValuesSetByOneClientAreSeenByAnother) {
  TcpStoreServer server;
  TcpStore a("127.0.0.1", server.port(), quick());
  TcpStore b("localhost", server.port(), quick());
  a.set("addr", "10.0.0.1:1234");
  EXPECT_EQ(b.get("addr"), "10.0.0.1:1234");
  EXPECT_EQ(server.num_clients(), 2);
}

TEST(TcpStore, GetBlocksUntilAnotherClientSetsTheKey) {
  TcpStoreServer server;
  TcpStore reader("127.0.0.1", server.port(), quick());
  auto t0 = std::chrono::steady_clock::now();
  std::thread writer([&] {
    TcpStore w("127.0.0.1", server.port(), quick());
    std::this_thread::sleep_for(100ms);
    w.set("late", "here");
  });
  EXPECT_EQ(reader.get("late"), "here");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 90ms);
  writer.join();
}

TEST(TcpStore, GetTimeoutNamesTheKeyAndTheTimeoutAndTheConnectionStaysUsable) {
  TcpStoreServer server;
  TcpStore store("127.0.0.1", server.port(), quick());
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = error_of([&] { store.get("never/set", 150ms); });
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_NE(msg.find("'never/set'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("150 ms"), std::string::npos) << msg;
  EXPECT_GE(took, 140ms);
  EXPECT_LT(took, 1500ms);
  store.set("after", "ok");
  EXPECT_EQ(store.get("after"), "ok");
}

TEST(TcpStore, WaitTimeoutListsOnlyTheMissingKeys) {
  TcpStoreServer server;
  TcpStore store("127.0.0.1", server.port(), quick());
  store.set("present", "1");
  std::string msg = error_of([&] { store.wait({"present", "absent/a", "absent/b"}, 100ms); });
  EXPECT_NE(msg.find("'absent/a', 'absent/b'"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("'present'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("100 ms"), std::string::npos) << msg;
  store.set("absent/a", "");
  store.set("absent/b", "");
  store.wait({"present", "absent/a", "absent/b"}, 100ms);
  EXPECT_TRUE(store.check({"present", "absent/a"}));
  EXPECT_FALSE(store.check({"present", "other"}));
}

TEST(TcpStore, AddIsAtomicAcrossConcurrentClients) {
  TcpStoreServer server;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      TcpStore s("127.0.0.1", server.port(), quick());
      for (int i = 0; i < 50; ++i) s.add("counter", 3);
    });
  for (auto& t : threads) t.join();
  TcpStore s("127.0.0.1", server.port(), quick());
  EXPECT_EQ(s.add("counter", 0), 600);
  EXPECT_EQ(s.get("counter"), "600");
  EXPECT_EQ(s.add("fresh", -5), -5);
}

TEST(TcpStore, AddOnANonIntegerValueFailsNamingTheKey) {
  TcpStoreServer server;
  TcpStore s("127.0.0.1", server.port(), quick());
  s.set("word", "hello");
  std::string msg = error_of([&] { s.add("word", 1); });
  EXPECT_NE(msg.find("'word'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not an integer"), std::string::npos) << msg;
  EXPECT_EQ(s.add("n", 2), 2);  // still connected
}

TEST(TcpStore, CompareSetSwapsOnlyWhenTheCurrentValueMatches) {
  TcpStoreServer server;
  TcpStore s("127.0.0.1", server.port(), quick());
  EXPECT_EQ(s.compare_set("leader", "", "rank3"), "rank3");  // absent matches ""
  EXPECT_EQ(s.compare_set("leader", "", "rank5"), "rank3");  // lost the race
  EXPECT_EQ(s.compare_set("leader", "rank3", "rank7"), "rank7");
  EXPECT_EQ(s.get("leader"), "rank7");
}

TEST(TcpStore, DeleteRemovesKeysAndNumKeysCountsThem) {
  TcpStoreServer server;
  TcpStore s("127.0.0.1", server.port(), quick());
  EXPECT_EQ(s.num_keys(), 0);
  s.set("a", "1");
  s.set("b", "2");
  s.add("c", 1);
  EXPECT_EQ(s.num_keys(), 3);
  EXPECT_TRUE(s.delete_key("b"));
  EXPECT_FALSE(s.delete_key("b"));
  EXPECT_EQ(s.num_keys(), 2);
  EXPECT_FALSE(s.check({"b"}));
}

TEST(TcpStore, BarrierReleasesNobodyUntilEveryRankArrivesAndCanBeRepeated) {
  TcpStoreServer server;
  constexpr int kWorld = 3;
  std::atomic<int> passed{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r)
    threads.emplace_back([&, r] {
      TcpStore s("127.0.0.1", server.port(), quick());
      for (int round = 0; round < 3; ++round) {
        if (r == 2) std::this_thread::sleep_for(30ms);
        // Before the slow rank arrives in this round, nobody may have passed it.
        if (r == 2) {
          EXPECT_EQ(passed.load(), round * kWorld);
        }
        s.barrier("step", kWorld);
        passed++;
        s.barrier("after", kWorld);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(passed.load(), 9);
}

TEST(TcpStore, BarrierTimeoutNamesTheBarrierAndHowManyArrived) {
  TcpStoreServer server;
  TcpStore s("127.0.0.1", server.port(), quick());
  std::string msg = error_of([&] { s.barrier("init", 4, 100ms); });
  EXPECT_NE(msg.find("barrier 'init'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 ranks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("100 ms"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1 had arrived"), std::string::npos) << msg;
}

TEST(TcpStore, ClientRetriesConnectingUntilTheServerStarts) {
  int port;
  { TcpStoreServer probe; port = probe.port(); }  // a port that was free a moment ago
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(200ms);
    server = std::make_unique<TcpStoreServer>(port);
  });
  TcpStore s("127.0.0.1", port, quick());
  starter.join();
  s.set("x", "y");
  EXPECT_EQ(s.get("x"), "y");
}

TEST(TcpStore, ConnectTimeoutNamesTheAddressAndTheTimeout) {
  int port;
  { TcpStoreServer probe; port = probe.port(); }
  TcpStoreOptions o;
  o.connect_timeout = 150ms;
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = error_of([&] { TcpStore s("127.0.0.1", port, o); });
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 140ms);
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("150 ms"), std::string::npos) << msg;
}

TEST(TcpStore, ServerShutdownDuringAWaitIsAnErrorNotAHang) {
  auto server = std::make_unique<TcpStoreServer>();
  TcpStore s("127.0.0.1", server->port(), quick(10000ms));
  std::thread killer([&] {
    std::this_thread::sleep_for(100ms);
    server.reset();
  });
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = error_of([&] { s.get("never"); });
  killer.join();
  EXPECT_NE(msg.find("closed the connection"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'never'"), std::string::npos) << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2000ms);
}

TEST(TcpStore, BadPortAndBusyPortAreClearErrors) {
  EXPECT_NE(error_of([] { TcpStore s("127.0.0.1", 0); }).find("port must be in 1..65535"), std::string::npos);
  TcpStoreServer a;
  std::string msg = error_of([&] { TcpStoreServer b(a.port(), "127.0.0.1"); });
  EXPECT_NE(msg.find("cannot listen on 127.0.0.1:" + std::to_string(a.port())), std::string::npos) << msg;
}

TEST(TcpStoreServer, AClientSpeakingGarbageIsDroppedAndOthersAreStillServed) {
  TcpStoreServer server(0, "127.0.0.1");
  TcpStore good("127.0.0.1", server.port(), quick());
  good.set("k", "v");
  for (std::string junk : {std::string("\xff\xff\xff\xff", 4),             // a frame over the size limit
                           std::string("\x02\x00\x00\x00\x63\x00", 6)}) {  // unknown op 99
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server.port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
    char c;
    EXPECT_EQ(::recv(fd, &c, 1, 0), 0) << "the server must close a connection that breaks the protocol";
    ::close(fd);
  }
  EXPECT_EQ(good.get("k"), "v");
  EXPECT_EQ(server.num_clients(), 1);
}

TEST(PrefixStore, KeysOfDifferentPrefixesDoNotCollide) {
  TcpStoreServer server;
  auto base = std::make_shared<TcpStore>("127.0.0.1", server.port(), quick());
  PrefixStore g0("group0", base), g1("group1", base);
  g0.set("id", "zero");
  g1.set("id", "one");
  EXPECT_EQ(g0.get("id"), "zero");
  EXPECT_EQ(g1.get("id"), "one");
  EXPECT_EQ(base->get("group0/id"), "zero");
  EXPECT_EQ(g0.add("n", 2), 2);
  EXPECT_EQ(g1.add("n", 5), 5);
  std::string msg = error_of([&] { g0.wait({"missing"}, 50ms); });
  EXPECT_NE(msg.find("'group0/missing'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ingot::distributed
