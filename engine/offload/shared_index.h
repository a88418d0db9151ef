// The block index shared between processes (SPEC.md §8). vLLM runs its scheduler in one process
// and each tensor-parallel worker in its own: the workers hold the host pools, the scheduler
// decides what to load. Each worker (one rank) publishes the hashes its pool holds committed in a
// POSIX shared-memory table that it alone writes; the scheduler reads every rank's table and
// counts a block as a hit only where every rank holds it and is alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "offload/engine.h"

namespace activekv::offload {

// A table that cannot be made or taken over (another live process serves the rank, no shared
// memory): the message names the engine id, the rank and the operating system's answer.
class SharedIndexError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The shared-memory object of one rank of one engine: "/activekv-<16 hex digits>-r<rank>", the
// digits a hash of the engine id (vLLM's engine ids may hold any character).
std::string shared_index_name(const std::string& engine_id, std::size_t rank);

// Removes every table whose writer has ended without removing it (killed): such a table counts
// for no hit, and the engine ids of a host's past runs would otherwise pile up in /dev/shm. Each
// writer calls it as it starts. The number removed.
std::size_t remove_stale_shared_indexes();

namespace detail {
struct IndexHeader;

// A file descriptor and, once mapped, its shared mapping; closed and unmapped on destruction.
class SharedFile {
 public:
  SharedFile() = default;
  explicit SharedFile(int fd) : fd_(fd) {}
  SharedFile(SharedFile&& other) noexcept;
  SharedFile& operator=(SharedFile&& other) noexcept;
  SharedFile(const SharedFile&) = delete;
  SharedFile& operator=(const SharedFile&) = delete;
  ~SharedFile();

  // Maps the first `bytes` of the file (shared); false, with errno set, when it cannot.
  bool map(std::size_t bytes, int protection);
  int fd() const { return fd_; }
  bool is_open() const { return fd_ >= 0; }
  std::size_t bytes() const { return bytes_; }
  IndexHeader* header() const { return static_cast<IndexHeader*>(mapping_); }

 private:
  void reset() noexcept;
  int fd_ = -1;
  void* mapping_ = nullptr;
  std::size_t bytes_ = 0;
};
}  // namespace detail

// One rank's side: owns its table for its lifetime (an exclusive lock on it, which the kernel
// drops when the process ends however it ends) and removes it on destruction.
class SharedIndexWriter {
 public:
  // Creates the rank's table for a pool of `capacity` blocks, or takes over the table a dead
  // process left; SharedIndexError when a live process holds it.
  SharedIndexWriter(const std::string& engine_id, std::size_t rank, std::size_t capacity);
  SharedIndexWriter(const SharedIndexWriter&) = delete;
  SharedIndexWriter& operator=(const SharedIndexWriter&) = delete;
  ~SharedIndexWriter();

  // The pool's changes as the engine logged them (commit adds its hash, evict removes it; other
  // kinds change nothing), in order, published as one change: a reader sees all or none of it.
  void publish(const std::vector<Event>& events);
  std::size_t size() const;
  const std::string& name() const { return name_; }

 private:
  void insert(std::uint64_t hash);
  void erase(std::uint64_t hash);

  std::string name_;
  detail::SharedFile file_;
};

// The scheduler's side: the leading hashes every rank of `world_size` holds. Thread-safe: its
// calls take one mutex, since looking a rank up may unmap the table another call is reading.
class SharedIndexReader {
 public:
  SharedIndexReader(const std::string& engine_id, std::size_t world_size);
  SharedIndexReader(const SharedIndexReader&) = delete;
  SharedIndexReader& operator=(const SharedIndexReader&) = delete;

  // How many of `hashes`, from the first, every rank's table holds. A rank with no table yet, or
  // whose process has ended (its lock is free), holds none; so does one whose table keeps
  // changing under the read (a bounded number of retries), which only delays a hit.
  std::size_t lookup(const std::vector<std::uint64_t>& hashes);
  // The ranks whose writer is alive now (tests, diagnostics).
  std::size_t live_ranks();
  std::size_t world_size() const { return ranks_.size(); }

 private:
  // The rank's table mapped and its writer alive, or nullptr (closing what it had mapped). With
  // mutex_ held: the header stays mapped until the next call.
  const detail::IndexHeader* live_table(std::size_t rank);

  std::mutex mutex_;
  std::uint64_t engine_tag_;
  std::vector<std::string> names_;
  std::vector<detail::SharedFile> ranks_;
};

}  // namespace activekv::offload
