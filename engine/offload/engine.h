// The engine of the CPU route (SPEC.md §6, §7): the scheduler's plan of one step (lookups, loads
// and stores of vLLM blocks) and the worker's per-layer hooks that move the data between the
// device KV cache and the host pool through staging regions, with an ordered event log.
//
// Every public call takes the engine's mutex, so the scheduler side (lookup, plans) may run on
// another thread than the worker hooks. A call that raises EngineInputError or EngineStateError
// has changed nothing.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "offload/block_store.h"
#include "offload/compression.h"
#include "offload/cuda_route.h"
#include "offload/kv_layout.h"
#include "offload/staging.h"
#include "offload/transfer_runs.h"

namespace activekv::offload {

// Bad input: a value out of range, lists of different lengths, a plan larger than a region. The
// message names the argument and what was expected. Python: ValueError.
class EngineInputError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A hook called out of order (e.g. wait_for_layer_load before start_load). Python: RuntimeError.
class EngineStateError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// "load" | "store"; EngineInputError naming `direction` for anything else.
Direction parse_direction(std::string_view name);

// Where the device KV lives and who moves it: host arrays and synchronous copies (cpu), or GPU
// memory and kernels on the engine's own streams behind CUDA event fences (cuda).
enum class Route : std::uint8_t { cpu, cuda };
// "cpu" | "cuda"; EngineInputError naming `device` for anything else.
Route parse_route(std::string_view name);
const char* route_name(Route route);

enum class EventKind : std::uint8_t {
  lookup,      // value: the number of leading committed hashes
  hit,         // a planned load found committed at build_step: hash
  miss,        // a planned load not committed at build_step, dropped: hash
  evict,       // hash
  refuse,      // a store with no slot to take: hash
  quarantine,  // region
  fatal,       // every region is quarantined: num_regions
  loaded,      // hash
  load_error,  // hash
  commit,      // hash
  drop,        // a store that failed: hash
};
const char* event_kind_name(EventKind kind);

struct Event {
  EventKind kind;
  std::uint64_t value;

  bool operator==(const Event& other) const {
    return kind == other.kind && value == other.value;
  }
  bool operator!=(const Event& other) const { return !(*this == other); }
};

// The slot size an Engine of these arguments would have, or the EngineInputError its construction
// would raise; nothing is allocated (a scheduler that plans for pools in other processes checks
// their arguments so).
std::size_t checked_slot_bytes(const KvBlockLayout& layout, CompressionMode mode,
                               std::size_t capacity_bytes, std::size_t num_regions,
                               std::size_t region_blocks, std::size_t num_device_blocks);

// The runs of consecutive host slots of the last step's transfer lists (transfer_runs.h): its
// loads that hit, counted at build_step, and its allocated stores, counted when their slots are
// allocated at save_kv_layer(0); 0 until then. `direct` runs have consecutive device blocks too.
struct StepRuns {
  std::size_t load_blocks = 0;
  std::size_t load_runs = 0;
  std::size_t load_direct_runs = 0;
  std::size_t store_blocks = 0;
  std::size_t store_runs = 0;
  std::size_t store_direct_runs = 0;
};

// Host time of the last step's bookkeeping (nanoseconds, steady clock), for benchmarks: where a
// step under eviction pressure spends its time besides the bus. `allocation` is the whole of
// allocate_stores at save_kv_layer(0) (eviction included), `eviction` the part of it that freed
// victims' slots, `commit` wait_for_save's commits of the step's stores. 0 until measured.
struct StepTimes {
  std::uint64_t allocation_ns = 0;
  std::uint64_t eviction_ns = 0;
  std::uint64_t commit_ns = 0;
};

class Engine {
 public:
  // EngineInputError naming the argument: no whole slot fits in capacity_bytes, num_regions,
  // region_blocks or num_device_blocks is 0, num_regions is above kMaxRegions, or the pool is
  // larger than the machine's memory; checked before anything is allocated. A pool that then
  // cannot be allocated (or, on the CUDA route, pinned), or region buffers that cannot, are
  // EngineInputErrors too, naming capacity_bytes or region_blocks, the bytes asked and why. The
  // CUDA route pins the pool and makes its streams and events here (CudaRouteError when it cannot
  // for any other reason: no device, no driver).
  Engine(const KvBlockLayout& layout, CompressionMode mode, std::size_t capacity_bytes,
         std::size_t num_regions, std::size_t region_blocks, std::size_t num_device_blocks,
         Route route = Route::cpu);

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const KvBlockLayout& layout() const { return layout_; }
  CompressionMode mode() const { return mode_; }
  Route route() const { return cuda_ ? Route::cuda : Route::cpu; }
  // The CUDA device of the CUDA route (its device KV must be there); -1 on the CPU route.
  int cuda_device() const { return cuda_ ? cuda_->device() : -1; }
  std::size_t slot_bytes() const { return store_.slot_bytes(); }
  std::size_t num_slots() const { return store_.num_slots(); }
  std::size_t num_device_blocks() const { return num_device_blocks_; }
  bool fatal() const;
  std::size_t quarantined_regions() const;
  // The allocator's counts since construction and the last step's runs (SPEC.md §2, §7).
  ExtentCounts extent_counts() const;
  StepRuns last_step_runs() const;
  StepTimes last_step_times() const;
  // The CUDA route's counts of what it issued (which path moved each layer); none on the CPU
  // route.
  std::optional<RouteCounts> cuda_route_counts() const;

  // One view per layer (exactly num_layers, each of num_device_blocks blocks). Only between
  // steps; the views replace any registered before.
  void register_kv_caches(const std::vector<DeviceKvLayer>& layers);

  // Scheduler side.
  std::size_t lookup(const std::vector<std::uint64_t>& hashes);
  void plan_load(const std::vector<std::uint64_t>& hashes,
                 const std::vector<std::int64_t>& device_blocks);
  void plan_store(const std::vector<std::uint64_t>& hashes,
                  const std::vector<std::int64_t>& device_blocks);
  // plan_load and plan_store of one step in one call: every argument and limit of both is checked
  // before either is planned, so a step refused for its stores plans none of its loads either
  // (SPEC.md §6 rule 11). Errors name load_hashes, store_device_blocks[i], and so on.
  void plan_step(const std::vector<std::uint64_t>& load_hashes,
                 const std::vector<std::int64_t>& load_device_blocks,
                 const std::vector<std::uint64_t>& store_hashes,
                 const std::vector<std::int64_t>& store_device_blocks);
  // Pins the planned loads found committed; the device blocks of those that were not (dropped,
  // their data never arrives: a caller that promised them must say so), in plan order.
  std::vector<std::size_t> build_step();

  // Worker side, in this order per step: start_load, then for each layer n
  // wait_for_layer_load(n) and save_kv_layer(n), then wait_for_save. A step with nothing to load
  // or store may go from start_load straight to wait_for_save (vLLM's steps without a forward).
  void start_load();
  // The device blocks whose layer-`layer` data did not arrive (lost at this layer or before), in
  // plan order.
  std::vector<std::size_t> wait_for_layer_load(std::int64_t layer);
  // `compute_stream` (CUDA route): the cudaStream_t the forward ran this layer on; the store
  // waits for it. Null is the legacy default stream; the CPU route ignores it.
  void save_kv_layer(std::int64_t layer, void* compute_stream = nullptr);
  void wait_for_save();

  // The fence of the next lease of this direction and layer reports an unknown outcome
  // (counted: two injections fault the next two such leases).
  void inject_fence_fault(Direction direction, std::int64_t layer);

  // The event log since the last call; the log is then empty.
  std::vector<Event> take_events();

  // Introspection for tests; not synchronized with a step running on another thread.
  const BlockStore& store() const { return store_; }
  const StagingPool& staging() const { return staging_; }

 private:
  enum class Phase : std::uint8_t { planning, built, running };

  struct PlannedBlock {
    std::uint64_t hash;
    std::size_t device_block;
  };
  struct LoadEntry {
    std::uint64_t hash;
    std::size_t device_block;
    std::size_t slot;
    bool lost;
  };
  struct StoreEntry {
    std::uint64_t hash;
    std::size_t device_block;
    std::size_t slot;
    bool allocated;
    bool dropped;
  };
  // The entries (indices into loads_ or stores_) a lease carries, and their transfers. The same
  // list serves every layer until an entry is lost or dropped, so a steady step builds it once
  // per direction, not once per layer.
  struct Carried {
    std::vector<std::size_t> entries;
    std::vector<BlockTransfer> transfers;
  };
  // A lease in flight and what it carries.
  struct InFlight {
    std::uint32_t layer;
    Lease lease;
    std::shared_ptr<const Carried> carried;
  };

  std::uint32_t checked_layer(std::int64_t layer) const;
  // plan_load, plan_store and plan_step: `call` and the prefixes name them in messages.
  void plan_step(const std::vector<std::uint64_t>& load_hashes,
                 const std::vector<std::int64_t>& load_device_blocks,
                 const std::vector<std::uint64_t>& store_hashes,
                 const std::vector<std::int64_t>& store_device_blocks, const char* call,
                 const std::string& load_prefix, const std::string& store_prefix);
  // `prefix` names the arguments in messages: "" (hashes, device_blocks) or "load_", "store_".
  std::vector<PlannedBlock> checked_plan(const std::vector<std::uint64_t>& hashes,
                                         const std::vector<std::int64_t>& device_blocks,
                                         const std::string& prefix) const;
  // The limits that depend on the plan so far (SPEC.md §6 rule 9): region_blocks per direction
  // and, for loads (`plan` is planned_loads_), rule 6: a device block receives one hash's bytes
  // per step. Changes nothing.
  void check_plan_limits(const std::vector<PlannedBlock>& plan,
                         const std::vector<PlannedBlock>& blocks, const char* call,
                         const std::string& prefix) const;
  [[noreturn]] void out_of_order(const std::string& call) const;
  std::string expected_next() const;

  bool take_fault(Direction direction, std::uint32_t layer);
  void log(EventKind kind, std::uint64_t value) { events_.push_back({kind, value}); }
  void note_lost_region(std::size_t region);
  void mark_lost(std::size_t load);
  void mark_dropped(std::size_t store);
  // What the next load (store) lease carries: loads not lost (stores allocated and not dropped).
  const std::shared_ptr<const Carried>& carried_loads();
  const std::shared_ptr<const Carried>& carried_stores();

  // One layer's copies: slots -> device KV (decoding), device KV -> slots (encoding).
  void copy_in(std::uint32_t layer, std::size_t region, const std::vector<BlockTransfer>& list);
  // `compute_stream`: the save_kv_layer call's (CUDA route: the store waits for it).
  void copy_out(std::uint32_t layer, std::size_t region, const std::vector<BlockTransfer>& list,
                void* compute_stream);
  // The fence of an in-flight lease as observed: the armed outcome on the CPU route; on the CUDA
  // route, what waiting for its event says.
  FenceOutcome observe(Direction direction, const Lease& lease);

  // Issue one layer's transfer of every block not lost (loads) or dropped (stores). When no region
  // is free they return false and do nothing, unless `final_attempt`: then, as when every region
  // is quarantined, the transfer is not made (its loads are lost, its stores dropped).
  bool issue_load(std::uint32_t layer, bool final_attempt);
  void complete_load(std::uint32_t layer);
  void finish_loads();
  void allocate_stores();
  // Runs of run_transfers_: (blocks, runs, direct runs).
  void count_step_runs(std::size_t& blocks, std::size_t& runs, std::size_t& direct);
  // The lease in flight, if one was made, goes to `issued`.
  bool issue_store(std::uint32_t layer, bool final_attempt, void* compute_stream,
                   std::optional<InFlight>& issued);
  void complete_store(const InFlight& in_flight);
  void finish_stores();

  mutable std::mutex mutex_;
  const KvBlockLayout layout_;
  const CompressionMode mode_;
  const std::size_t layer_bytes_;   // one layer of one block as stored
  const std::size_t tensor_bytes_;  // K (or V) of one layer of one device block
  BlockStore store_;
  StagingPool staging_;
  const std::size_t num_device_blocks_;
  const std::size_t slot_bytes_;
  // The pool in layer planes (SPEC.md §2): layer l of slot s is at
  // pool_base_ + l * plane_bytes_ + s * layer_bytes_, so a run of slots is one span per layer.
  std::uint8_t* const pool_base_;
  const std::size_t plane_bytes_;
  std::unique_ptr<CudaRoute> cuda_;  // after store_: gone (streams drained) before the pool
  std::vector<DeviceKvLayer> kv_;
  // CPU route, compressed modes with device KV whose K and V are not contiguous: one block's K
  // and V gathered here (stores) or decoded here (loads). Sized at construction.
  std::vector<std::uint8_t> gathered_;

  bool fatal_ = false;
  // Faults injected and not yet taken by a lease, per direction and layer.
  std::array<std::vector<std::uint64_t>, 2> faults_;
  std::vector<Event> events_;

  Phase phase_ = Phase::planning;
  std::vector<PlannedBlock> planned_loads_;
  std::vector<PlannedBlock> planned_stores_;
  // The step being run (from build_step to wait_for_save).
  std::vector<LoadEntry> loads_;
  std::vector<StoreEntry> stores_;
  std::vector<InFlight> load_leases_;  // layer n and n + 1 at most
  std::optional<InFlight> store_lease_;
  std::shared_ptr<const Carried> carried_loads_;   // null: rebuilt at the next lease
  std::shared_ptr<const Carried> carried_stores_;  // null: rebuilt at the next lease
  std::size_t lost_loads_ = 0;                     // entries of loads_ marked lost
  StepRuns last_runs_;
  StepTimes last_times_;
  // Reused by count_step_runs, so a steady step allocates nothing for its statistics.
  std::vector<BlockTransfer> run_transfers_;
  std::vector<TransferRun> run_scratch_;
  std::uint32_t layers_loaded_ = 0;  // wait_for_layer_load calls of this step
  std::uint32_t layers_saved_ = 0;   // save_kv_layer calls of this step
};

}  // namespace activekv::offload
