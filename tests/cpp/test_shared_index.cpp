// The block index shared between processes (SPEC.md §8): what one rank publishes, what the reader
// counts across ranks, a writer that dies (in a forked child, killed without cleanup), a table
// taken over by the next writer, a second live writer refused, and readers that see each change
// whole while a writer churns.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "test_support.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "offload/engine.h"
#include "offload/shared_index.h"

using activekv::offload::Event;
using activekv::offload::EventKind;
using activekv::offload::SharedIndexError;
using activekv::offload::SharedIndexReader;
using activekv::offload::SharedIndexWriter;
using activekv::offload::shared_index_name;

using activekv::testing::contains;
using activekv::testing::error_message;

namespace {

// An engine id of this test process alone, so that parallel runs never share a table.
std::string engine_id(const std::string& test) {
  return "test-shared-index-" + test + "-" + std::to_string(::getpid());
}

std::vector<Event> commits(const std::vector<std::uint64_t>& hashes) {
  std::vector<Event> events;
  for (const std::uint64_t hash : hashes) events.push_back({EventKind::commit, hash});
  return events;
}

std::vector<Event> evictions(const std::vector<std::uint64_t>& hashes) {
  std::vector<Event> events;
  for (const std::uint64_t hash : hashes) events.push_back({EventKind::evict, hash});
  return events;
}

// A child process that publishes `hashes` as rank `rank`, tells the parent, then waits to be
// killed (SIGKILL: no destructor runs, its table stays behind).
pid_t child_writer(const std::string& id, std::size_t rank, const std::vector<std::uint64_t>& hashes) {
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(ready[0]);
    SharedIndexWriter writer(id, rank, 64);
    writer.publish(commits(hashes));
    const char byte = 1;
    if (::write(ready[1], &byte, 1) != 1) ::_exit(2);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  ::close(ready[0]);
  return pid;
}

void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

}  // namespace

TEST_CASE("names are per engine id and rank, whatever characters the id holds") {
  const std::string name = shared_index_name("a/b c\n", 3);
  CHECK(name.rfind("/activekv-", 0) == 0);
  CHECK(name.find('/', 1) == std::string::npos);
  CHECK(contains(name, "-r3"));
  CHECK(name != shared_index_name("a/b c\n", 2));
  CHECK(name != shared_index_name("a/b c", 3));
}

TEST_CASE("a reader counts the leading hashes its one rank holds") {
  const std::string id = engine_id("one-rank");
  SharedIndexReader reader(id, 1);
  CHECK(reader.lookup({1, 2, 3}) == 0);  // no worker yet
  SharedIndexWriter writer(id, 0, 8);
  writer.publish(commits({1, 2, 3, 0}));  // 0 too: the table's empty mark is held apart
  CHECK(writer.size() == 4);
  CHECK(reader.lookup({1, 2, 3, 4}) == 3);
  CHECK(reader.lookup({0, 1}) == 2);
  CHECK(reader.lookup({2, 9, 3}) == 1);
  CHECK(reader.lookup({}) == 0);
  writer.publish(evictions({2, 0}));
  CHECK(reader.lookup({1, 2, 3}) == 1);
  CHECK(reader.lookup({0}) == 0);
  CHECK(reader.lookup({3}) == 1);
  writer.publish({{EventKind::loaded, 2}, {EventKind::miss, 2}});  // not changes of the pool
  CHECK(reader.lookup({1, 2}) == 1);
  CHECK(writer.size() == 2);
}

TEST_CASE("eviction keeps every other hash findable (backward shift, no tombstones)") {
  const std::string id = engine_id("churn");
  SharedIndexWriter writer(id, 0, 64);
  SharedIndexReader reader(id, 1);
  std::mt19937_64 random(7);
  std::set<std::uint64_t> held;
  for (int round = 0; round < 20000; ++round) {
    // Small hashes crowd a few home slots, so deletions shift long runs.
    const std::uint64_t hash = random() % 200;
    if (held.count(hash) != 0) {
      writer.publish(evictions({hash}));
      held.erase(hash);
    } else if (held.size() < 64) {
      writer.publish(commits({hash}));
      held.insert(hash);
    }
    if (round % 97 == 0) {
      for (std::uint64_t probe = 0; probe < 200; ++probe) {
        REQUIRE(reader.lookup({probe}) == held.count(probe));
      }
    }
  }
  CHECK(writer.size() == held.size());
}

TEST_CASE("a hit needs every rank, and a rank whose process died holds nothing") {
  const std::string id = engine_id("ranks");
  SharedIndexReader reader(id, 2);
  SharedIndexWriter rank0(id, 0, 64);
  rank0.publish(commits({1, 2, 3}));
  CHECK(reader.lookup({1, 2, 3}) == 0);  // rank 1 has no table yet
  const pid_t rank1 = child_writer(id, 1, {1, 2});
  CHECK(reader.live_ranks() == 2);
  CHECK(reader.lookup({1, 2, 3}) == 2);
  kill_and_reap(rank1);
  // Its table is still there (SIGKILL ran no cleanup), but its lock went with the process; the
  // next writer to start removes it.
  CHECK(reader.live_ranks() == 1);
  CHECK(reader.lookup({1, 2, 3}) == 0);

  SUBCASE("the next writer of the rank starts empty") {
    SharedIndexWriter restarted(id, 1, 64);
    CHECK(reader.lookup({1, 2, 3}) == 0);
    restarted.publish(commits({1, 2, 3}));
    CHECK(reader.lookup({1, 2, 3}) == 3);
  }
  SUBCASE("a larger pool grows the table, and readers map it again") {
    SharedIndexWriter restarted(id, 1, 5000);
    std::vector<std::uint64_t> many;
    for (std::uint64_t hash = 1; hash <= 4000; ++hash) many.push_back(hash);
    restarted.publish(commits(many));
    CHECK(restarted.size() == many.size());
    // Rank 1's hashes now lie beyond the mapping the reader had of the dead child's table.
    CHECK(reader.lookup({1, 2, 3}) == 3);
  }
}

TEST_CASE("a rank served by a live process is refused to a second writer, naming it") {
  const std::string id = engine_id("second-writer");
  const pid_t first = child_writer(id, 0, {5});
  const std::string message =
      error_message<SharedIndexError>([&] { SharedIndexWriter second(id, 0, 8); });
  CHECK(contains(message, id));
  CHECK(contains(message, "rank 0"));
  CHECK(contains(message, "another live process"));
  SharedIndexReader reader(id, 1);
  CHECK(reader.lookup({5}) == 1);  // the refusal changed nothing
  kill_and_reap(first);
  CHECK(reader.lookup({5}) == 0);
  SharedIndexWriter takeover(id, 0, 8);  // and removes the table the killed child left
}

TEST_CASE("a starting writer removes the tables killed writers left, and no live one") {
  const std::string dead_id = engine_id("stale-dead");
  const std::string live_id = engine_id("stale-live");
  const pid_t live = child_writer(live_id, 0, {2});
  kill_and_reap(child_writer(dead_id, 0, {1}));  // after: a starting writer removes stale tables
  const std::string dead_name = shared_index_name(dead_id, 0);
  const auto exists = [](const std::string& name) {
    const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
    if (fd >= 0) ::close(fd);
    return fd >= 0;
  };
  CHECK(exists(dead_name));
  SharedIndexWriter other(engine_id("stale-other"), 0, 8);  // any engine's worker
  CHECK_FALSE(exists(dead_name));
  CHECK(exists(shared_index_name(live_id, 0)));
  SharedIndexReader reader(live_id, 1);
  CHECK(reader.lookup({2}) == 1);
  kill_and_reap(live);
  CHECK(activekv::offload::remove_stale_shared_indexes() >= 1);
  CHECK_FALSE(exists(shared_index_name(live_id, 0)));
}

TEST_CASE("a writer that ends cleanly removes its table") {
  const std::string id = engine_id("clean-end");
  SharedIndexReader reader(id, 1);
  {
    SharedIndexWriter writer(id, 0, 8);
    writer.publish(commits({4}));
    CHECK(reader.lookup({4}) == 1);
  }
  CHECK(reader.live_ranks() == 0);
  CHECK(reader.lookup({4}) == 0);
  SharedIndexWriter next(id, 0, 8);  // a new table under the same name
  next.publish(commits({4}));
  CHECK(reader.lookup({4}) == 1);
}

TEST_CASE("readers see each published change whole while the writer churns") {
  const std::string id = engine_id("whole");
  constexpr std::uint64_t kBlocks = 48;
  std::vector<std::uint64_t> chain;
  for (std::uint64_t hash = 1; hash <= kBlocks; ++hash) chain.push_back(hash * 1000003);
  SharedIndexWriter writer(id, 0, kBlocks);
  std::atomic<bool> done{false};
  std::thread churn([&] {
    for (int round = 0; round < 3000; ++round) {
      writer.publish(commits(chain));
      writer.publish(evictions(chain));
    }
    done = true;
  });
  SharedIndexReader reader(id, 1);
  std::size_t whole = 0;
  while (!done) {
    const std::size_t held = reader.lookup(chain);
    REQUIRE((held == 0 || held == kBlocks));  // never part of one change
    whole += held == kBlocks;
  }
  churn.join();
  MESSAGE("lookups that saw the whole chain: " << whole);
}

TEST_CASE("one reader serves lookups from several threads while its tables are replaced") {
  // The scheduler looks blocks up from several threads with the GIL released, and a lookup may
  // drop the mapping of a table its writer removed: without the reader's mutex another thread's
  // read of that mapping was a use after munmap (SIGSEGV), and its file a data race.
  const std::string id = engine_id("threads");
  std::vector<std::uint64_t> chain;
  for (std::uint64_t hash = 1; hash <= 1024; ++hash) chain.push_back(hash * 7919);
  SharedIndexReader reader(id, 1);
  std::atomic<bool> done{false};
  std::atomic<std::size_t> partial{0};
  std::atomic<std::size_t> whole{0};
  std::vector<std::thread> readers;
  for (int thread = 0; thread < 2; ++thread) {
    readers.emplace_back([&] {
      while (!done) {
        const std::size_t held = reader.lookup(chain);
        if (held != 0 && held != chain.size()) ++partial;
        whole += held == chain.size();
      }
    });
  }
  readers.emplace_back([&] {
    while (!done) (void)reader.live_ranks();
  });
  for (int round = 0; round < 60; ++round) {
    // A writer ends cleanly (its table unlinked) and the next makes a new one, some larger, so
    // readers both drop a removed mapping and map a grown one again.
    SharedIndexWriter writer(id, 0, round % 2 == 0 ? chain.size() : 4 * chain.size());
    writer.publish(commits(chain));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  done = true;
  for (std::thread& thread : readers) thread.join();
  CHECK(partial.load() == 0);
  MESSAGE("lookups that saw the whole chain: " << whole.load());
}
