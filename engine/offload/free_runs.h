// The host pool's free slots as runs of consecutive slots (SPEC.md §2, "Extents"): always
// coalesced (no two free runs touch), indexed by start and by (length, start), so taking a step's
// blocks and giving a slot back cost O(log n) per run, never O(num_slots): a 4 GiB pool of
// 16 KiB slots has 262,144 of them.
#pragma once

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace activekv::offload {

// `length` consecutive slots from `start`.
struct SlotRun {
  std::size_t start;
  std::size_t length;

  bool operator==(const SlotRun& other) const {
    return start == other.start && length == other.length;
  }
  bool operator!=(const SlotRun& other) const { return !(*this == other); }
};

// Not thread-safe on its own: HostPool (under BlockStore's mutex) serializes every call. Errors
// (a slot out of range or already free, more slots asked than are free) are HostPoolError.
class FreeRuns {
 public:
  // Every slot free: one run [0, num_slots).
  explicit FreeRuns(std::size_t num_slots);

  std::size_t num_slots() const { return num_slots_; }
  std::size_t free_slots() const { return free_slots_; }
  std::size_t run_count() const { return by_start_.size(); }
  // The longest free run (0 when none is free).
  std::size_t longest_run() const;
  bool is_free(std::size_t slot) const;

  // Takes `count` free slots (count <= free_slots()) by the placement rule of SPEC.md §2: while
  // blocks remain, the smallest free run that holds all that remain (lowest start on ties) gives
  // its first slots and the rest of it stays free; when none holds them, the largest free run
  // (lowest start on ties) is taken whole. The runs taken are appended to `taken` in that order
  // (the order the caller's blocks fill them). Allocates nothing but `taken`'s growth: a run
  // cut short keeps its nodes.
  void take(std::size_t count, std::vector<SlotRun>& taken);
  // Gives a taken slot back, merged with the free runs on either side.
  void release(std::size_t slot);

  // Introspection (tests, invariants): the free runs by start.
  std::vector<SlotRun> runs() const;
  // "" when both indexes agree, runs are in range, non-empty and coalesced, and the free count
  // adds up; else the first broken invariant.
  std::string check() const;

 private:
  using ByStart = std::map<std::size_t, std::size_t>;                 // start -> length
  using ByLength = std::set<std::pair<std::size_t, std::size_t>>;     // (length, start)

  // Moves the run at `start` (its nodes reused, so nothing is allocated) to [new_start,
  // new_start + new_length).
  void reshape(ByStart::iterator run, std::size_t new_start, std::size_t new_length);
  void erase(ByStart::iterator run);

  std::size_t num_slots_;
  std::size_t free_slots_;
  ByStart by_start_;
  ByLength by_length_;
};

}  // namespace activekv::offload
