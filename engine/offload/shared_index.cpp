#include "offload/shared_index.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

namespace activekv::offload {
namespace detail {

// Every field is an atomic word: readers in other processes read them while the writer changes
// them, and the sequence tells them whether what they read is one consistent state.
struct IndexHeader {
  std::atomic<std::uint64_t> magic;
  std::atomic<std::uint64_t> engine_tag;   // hash of the engine id
  std::atomic<std::uint64_t> table_slots;  // a power of two, at least twice the pool's blocks
  std::atomic<std::uint64_t> sequence;     // odd while the writer changes the table
  std::atomic<std::uint64_t> count;        // hashes held
  std::atomic<std::uint64_t> holds_zero;   // hash 0, which the table cannot hold (its empty mark)
  std::atomic<std::uint64_t> reserved[2];

  std::atomic<std::uint64_t>* table() { return reinterpret_cast<std::atomic<std::uint64_t>*>(this + 1); }
  const std::atomic<std::uint64_t>* table() const {
    return reinterpret_cast<const std::atomic<std::uint64_t>*>(this + 1);
  }
};
static_assert(sizeof(IndexHeader) == 64, "the table starts one cache line in");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "atomics in shared memory must be lock-free to work across processes");

SharedFile::SharedFile(SharedFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

SharedFile& SharedFile::operator=(SharedFile&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = std::exchange(other.fd_, -1);
    mapping_ = std::exchange(other.mapping_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

SharedFile::~SharedFile() { reset(); }

bool SharedFile::map(std::size_t bytes, int protection) {
  void* mapping = ::mmap(nullptr, bytes, protection, MAP_SHARED, fd_, 0);
  if (mapping == MAP_FAILED) return false;
  mapping_ = mapping;
  bytes_ = bytes;
  return true;
}

void SharedFile::reset() noexcept {
  if (mapping_ != nullptr) ::munmap(mapping_, bytes_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  mapping_ = nullptr;
  bytes_ = 0;
}

}  // namespace detail

namespace {

using detail::IndexHeader;
using detail::SharedFile;

constexpr std::uint64_t kMagic = 0x3130584449564b41ULL;  // "AKVIDX01", little-endian
constexpr int kReadAttempts = 64;

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ULL;
  return hash;
}

// Block hashes from tests are small integers: mix them so that they spread over the table.
std::uint64_t home_slot(std::uint64_t hash, std::uint64_t mask) {
  hash ^= hash >> 33;
  hash *= 0xff51afd7ed558ccdULL;
  hash ^= hash >> 33;
  return hash & mask;
}

std::uint64_t table_slots_for(std::size_t capacity) {
  std::uint64_t slots = 16;
  while (slots < 2 * static_cast<std::uint64_t>(capacity)) slots *= 2;
  return slots;
}

std::size_t file_bytes(std::uint64_t table_slots) {
  return sizeof(IndexHeader) + table_slots * sizeof(std::uint64_t);
}

std::string system_error(const std::string& what, int error) {
  return what + ": " + std::strerror(error);
}

// The writer's exclusive lock. A reader probing liveness holds a shared lock for a moment, so a
// refusal is retried for a second before it means a live writer.
bool lock_exclusively(int fd) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno != EWOULDBLOCK) throw SharedIndexError(system_error("flock", errno));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// A change readers see whole (a sequence lock): the sequence is odd from begin to end, and a
// writer that died inside one left it odd, so the next writer keeps it odd. No fences (which
// ThreadSanitizer cannot check): the data words are written with release and read with acquire,
// so a reader that saw any word of a change sees the odd sequence before it, and retries.
void begin_change(IndexHeader& header) {
  const bool odd = header.sequence.load(std::memory_order_acquire) % 2 != 0;
  header.sequence.fetch_add(odd ? 2 : 1, std::memory_order_acq_rel);
}

void end_change(IndexHeader& header) {
  header.sequence.fetch_add(1, std::memory_order_release);
}

bool holds(const IndexHeader& header, std::uint64_t mask, std::uint64_t hash) {
  if (hash == 0) return header.holds_zero.load(std::memory_order_acquire) != 0;
  const auto* table = header.table();
  std::uint64_t slot = home_slot(hash, mask);
  // At most half the table is ever full; the bound only guards a read torn by a change.
  for (std::uint64_t probes = 0; probes <= mask; ++probes, slot = (slot + 1) & mask) {
    const std::uint64_t held = table[slot].load(std::memory_order_acquire);
    if (held == hash) return true;
    if (held == 0) return false;
  }
  return false;
}

// Whether the file open as `fd` is still the shared-memory object called `name`.
bool linked_as(int fd, const std::string& name) {
  struct stat held {};
  if (::fstat(fd, &held) != 0 || held.st_nlink == 0) return false;
  const int named = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (named < 0) return false;
  struct stat current {};
  const bool same = ::fstat(named, &current) == 0 && current.st_ino == held.st_ino &&
                    current.st_dev == held.st_dev;
  ::close(named);
  return same;
}

}  // namespace

std::size_t remove_stale_shared_indexes() {
  // glibc keeps POSIX shared memory in /dev/shm, the one place to list it.
  DIR* directory = ::opendir("/dev/shm");
  if (directory == nullptr) return 0;
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(directory)) {
    if (std::strncmp(entry->d_name, "activekv-", 9) == 0) names.push_back(std::string("/") + entry->d_name);
  }
  ::closedir(directory);
  std::size_t removed = 0;
  for (const std::string& name : names) {
    const int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) continue;
    SharedFile file(fd);
    // The exclusive lock granted: no writer holds the table, nor does another process removing
    // it. Removed only if the name still leads to this file: once another remover has, the name
    // may already belong to a new writer's table. (A new writer that opened this file meanwhile
    // finds it unlinked once it has its lock, and opens the name anew.)
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && linked_as(fd, name)) {
      removed += ::shm_unlink(name.c_str()) == 0;
    }
  }
  return removed;
}

std::string shared_index_name(const std::string& engine_id, std::size_t rank) {
  char digits[17];
  std::snprintf(digits, sizeof digits, "%016llx", static_cast<unsigned long long>(fnv1a(engine_id)));
  return "/activekv-" + std::string(digits) + "-r" + std::to_string(rank);
}

SharedIndexWriter::SharedIndexWriter(const std::string& engine_id, std::size_t rank,
                                     std::size_t capacity)
    : name_(shared_index_name(engine_id, rank)) {
  const std::string subject =
      "block index of engine " + engine_id + ", rank " + std::to_string(rank) + " (" + name_ + ")";
  remove_stale_shared_indexes();
  // The table locked must still be the one under the name: a stale-table removal (by another
  // engine's worker) may unlink it between the open and the lock. Then open it anew.
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    fd = ::shm_open(name_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) throw SharedIndexError(system_error("cannot open the " + subject, errno));
    file_ = SharedFile(fd);
    if (!lock_exclusively(fd)) {
      throw SharedIndexError("the " + subject + " is held by another live process (a worker of "
                             "the same engine id and rank)");
    }
    if (!linked_as(fd, name_)) {
      file_ = SharedFile();
      fd = -1;
    }
  }
  if (fd < 0) throw SharedIndexError("the " + subject + " kept being removed while it was opened");
  const std::uint64_t slots = table_slots_for(capacity);
  struct stat status {};
  if (::fstat(fd, &status) != 0) throw SharedIndexError(system_error("cannot stat the " + subject, errno));
  // Never shrink: a reader may still map the size a previous writer gave it.
  const std::size_t bytes = std::max(file_bytes(slots), static_cast<std::size_t>(status.st_size));
  // Allocated, not only sized: a full /dev/shm is an error here, not a SIGBUS at first write.
  if (const int error = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
    throw SharedIndexError(system_error("cannot allocate the " + subject, error));
  }
  if (!file_.map(bytes, PROT_READ | PROT_WRITE)) {
    throw SharedIndexError(system_error("cannot map the " + subject, errno));
  }
  IndexHeader& header = *file_.header();
  begin_change(header);
  header.magic.store(kMagic, std::memory_order_release);
  header.engine_tag.store(fnv1a(engine_id), std::memory_order_release);
  header.table_slots.store(slots, std::memory_order_release);
  header.count.store(0, std::memory_order_release);
  header.holds_zero.store(0, std::memory_order_release);
  for (std::uint64_t slot = 0; slot < slots; ++slot) {
    header.table()[slot].store(0, std::memory_order_release);
  }
  end_change(header);
}

SharedIndexWriter::~SharedIndexWriter() {
  // Removed while still locked, so no reader takes a finished worker's table for a live one;
  // only if the name still leads to it (never a successor's table).
  if (file_.is_open() && linked_as(file_.fd(), name_)) ::shm_unlink(name_.c_str());
}

void SharedIndexWriter::publish(const std::vector<Event>& events) {
  if (std::none_of(events.begin(), events.end(), [](const Event& event) {
        return event.kind == EventKind::commit || event.kind == EventKind::evict;
      })) {
    return;
  }
  IndexHeader& header = *file_.header();
  begin_change(header);
  for (const Event& event : events) {
    if (event.kind == EventKind::commit) insert(event.value);
    if (event.kind == EventKind::evict) erase(event.value);
  }
  end_change(header);
}

std::size_t SharedIndexWriter::size() const {
  const IndexHeader& header = *file_.header();
  return static_cast<std::size_t>(header.count.load(std::memory_order_acquire) +
                                  header.holds_zero.load(std::memory_order_acquire));
}

void SharedIndexWriter::insert(std::uint64_t hash) {
  IndexHeader& header = *file_.header();
  if (hash == 0) {
    header.holds_zero.store(1, std::memory_order_release);
    return;
  }
  const std::uint64_t slots = header.table_slots.load(std::memory_order_acquire);
  const std::uint64_t mask = slots - 1;
  auto* table = header.table();
  for (std::uint64_t slot = home_slot(hash, mask);; slot = (slot + 1) & mask) {
    const std::uint64_t held = table[slot].load(std::memory_order_acquire);
    if (held == hash) return;
    if (held == 0) {
      // The pool holds at most `capacity` blocks and the table twice that: more means the
      // engine's log and this table disagree.
      if (header.count.load(std::memory_order_acquire) + 1 > slots / 2) {
        throw SharedIndexError("block index " + name_ + ": more hashes than its pool has slots");
      }
      table[slot].store(hash, std::memory_order_release);
      header.count.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
  }
}

// Linear probing with backward-shift deletion: no tombstones, so a table that churns for days
// probes no longer than a fresh one.
void SharedIndexWriter::erase(std::uint64_t hash) {
  IndexHeader& header = *file_.header();
  if (hash == 0) {
    header.holds_zero.store(0, std::memory_order_release);
    return;
  }
  const std::uint64_t mask = header.table_slots.load(std::memory_order_acquire) - 1;
  auto* table = header.table();
  std::uint64_t hole = home_slot(hash, mask);
  for (;; hole = (hole + 1) & mask) {
    const std::uint64_t held = table[hole].load(std::memory_order_acquire);
    if (held == 0) return;  // not held
    if (held == hash) break;
  }
  for (std::uint64_t next = (hole + 1) & mask;; next = (next + 1) & mask) {
    const std::uint64_t held = table[next].load(std::memory_order_acquire);
    if (held == 0) break;
    const std::uint64_t home = home_slot(held, mask);
    // `held` may move into the hole only if its home does not lie cyclically in (hole, next].
    const bool stays = hole <= next ? (hole < home && home <= next) : (hole < home || home <= next);
    if (stays) continue;
    table[hole].store(held, std::memory_order_release);
    hole = next;
  }
  table[hole].store(0, std::memory_order_release);
  header.count.fetch_sub(1, std::memory_order_acq_rel);
}

SharedIndexReader::SharedIndexReader(const std::string& engine_id, std::size_t world_size)
    : engine_tag_(fnv1a(engine_id)), ranks_(world_size) {
  for (std::size_t rank = 0; rank < world_size; ++rank) {
    names_.push_back(shared_index_name(engine_id, rank));
  }
}

const IndexHeader* SharedIndexReader::live_table(std::size_t rank) {
  SharedFile& file = ranks_[rank];
  if (file.is_open()) {
    struct stat status {};
    // Removed by its writer at a clean end: forget it, a new writer makes a new one.
    if (::fstat(file.fd(), &status) != 0 || status.st_nlink == 0) file = SharedFile();
  }
  if (!file.is_open()) {
    const int fd = ::shm_open(names_[rank].c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return nullptr;
    SharedFile opened(fd);
    struct stat status {};
    if (::fstat(fd, &status) != 0 || static_cast<std::size_t>(status.st_size) < sizeof(IndexHeader)) {
      return nullptr;  // being made: not yet sized
    }
    if (!opened.map(static_cast<std::size_t>(status.st_size), PROT_READ)) return nullptr;
    file = std::move(opened);
  }
  // The writer holds an exclusive lock for as long as its process lives: a shared lock granted
  // here means it is gone, and so are the blocks its pool held.
  if (::flock(file.fd(), LOCK_SH | LOCK_NB) == 0) {
    ::flock(file.fd(), LOCK_UN);
    return nullptr;
  }
  const IndexHeader* header = file.header();
  // A newer writer with a larger pool grew the file beyond this mapping: it is mapped again at
  // the next lookup (this one counts no hit).
  if (file_bytes(header->table_slots.load(std::memory_order_acquire)) > file.bytes()) {
    file = SharedFile();
    return nullptr;
  }
  return header;
}

std::size_t SharedIndexReader::lookup(const std::vector<std::uint64_t>& hashes) {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::size_t common = hashes.size();
  for (std::size_t rank = 0; rank < ranks_.size() && common > 0; ++rank) {
    const IndexHeader* header = live_table(rank);
    if (header == nullptr) return 0;
    const std::size_t mapped_slots = (ranks_[rank].bytes() - sizeof(IndexHeader)) / sizeof(std::uint64_t);
    std::size_t held = 0;
    bool consistent = false;
    for (int attempt = 0; attempt < kReadAttempts && !consistent; ++attempt) {
      const std::uint64_t before = header->sequence.load(std::memory_order_acquire);
      if (before % 2 != 0) {
        std::this_thread::yield();
        continue;
      }
      const std::uint64_t slots = header->table_slots.load(std::memory_order_acquire);
      const bool valid = header->magic.load(std::memory_order_acquire) == kMagic &&
                         header->engine_tag.load(std::memory_order_acquire) == engine_tag_ &&
                         slots >= 16 && (slots & (slots - 1)) == 0 && slots <= mapped_slots;
      held = 0;
      if (valid) {
        while (held < common && holds(*header, slots - 1, hashes[held])) ++held;
      }
      consistent = header->sequence.load(std::memory_order_acquire) == before;
      if (consistent && !valid) held = 0;
    }
    common = consistent ? std::min(common, held) : 0;
  }
  return common;
}

std::size_t SharedIndexReader::live_ranks() {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::size_t live = 0;
  for (std::size_t rank = 0; rank < ranks_.size(); ++rank) live += live_table(rank) != nullptr;
  return live;
}

}  // namespace activekv::offload
