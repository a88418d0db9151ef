#include "offload/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <unordered_map>

#include "offload/host_pool.h"

namespace activekv::offload {

namespace {

// Nanoseconds of the steady clock since `since` (StepTimes).
std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since)
          .count());
}

std::size_t positive(std::size_t value, const char* what) {
  if (value == 0) throw EngineInputError(std::string(what) + ": expected a positive value; got 0");
  return value;
}

// capacity_bytes when at least one slot fits, else EngineInputError naming it.
std::size_t room_for_a_slot(std::size_t capacity_bytes, std::size_t slot_bytes) {
  if (capacity_bytes < slot_bytes) {
    throw EngineInputError("capacity_bytes: expected room for at least one slot of " +
                           std::to_string(slot_bytes) + " bytes; got " +
                           std::to_string(capacity_bytes));
  }
  return capacity_bytes;
}

// This machine's physical memory in bytes (0 when the system does not say).
std::size_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_bytes = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return 0;
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_bytes);
}


// Per (token, head) of one block's K or V under `strides`: the device address of its head_dim
// words and their place in the contiguous [block_size, num_kv_heads, head_dim] tensor.
template <typename Byte, typename Visit>
void for_each_row(const KvBlockLayout& layout, const KvStrides& strides, Byte* tensor,
                  Visit&& visit) {
  const std::size_t row_bytes = layout.head_dim() * dtype_bytes(layout.dtype());
  std::size_t packed = 0;
  for (std::size_t token = 0; token < layout.block_size(); ++token) {
    for (std::size_t head = 0; head < layout.num_kv_heads(); ++head) {
      visit(tensor + token * strides.token + head * strides.head, packed, row_bytes);
      packed += row_bytes;
    }
  }
}

std::size_t direction_index(Direction direction) {
  return direction == Direction::load ? 0 : 1;
}

// The block store over a host pool of capacity_bytes, made now. A pool the checks let through may
// still not be there to allocate (an address-space limit, memory taken by others): that is an
// EngineInputError naming capacity_bytes, what was asked and why, as every other refused size is,
// not the pool's own error type.
BlockStore allocated_store(std::size_t capacity_bytes, std::size_t slot_bytes) {
  try {
    return BlockStore(capacity_bytes, slot_bytes);
  } catch (const HostPoolError& error) {
    throw EngineInputError(error.what());
  } catch (const std::bad_alloc&) {
    throw EngineInputError("capacity_bytes: cannot allocate the bookkeeping of " +
                           std::to_string(capacity_bytes / slot_bytes) + " slots of " +
                           std::to_string(slot_bytes) + " bytes (std::bad_alloc)");
  }
}

}  // namespace

// The slot size, once every scalar argument has been checked (in the reference's order), so that
// nothing is allocated for a construction that is going to be refused. A pool larger than the
// machine's memory is refused here, naming capacity_bytes, rather than failing to allocate.
std::size_t checked_slot_bytes(const KvBlockLayout& layout, CompressionMode mode,
                               std::size_t capacity_bytes, std::size_t num_regions,
                               std::size_t region_blocks, std::size_t num_device_blocks) {
  const std::size_t slot_bytes = stored_block_bytes(layout, mode);
  room_for_a_slot(capacity_bytes, slot_bytes);
  positive(num_regions, "num_regions");
  positive(region_blocks, "region_blocks");
  positive(num_device_blocks, "num_device_blocks");
  // Checked here, not only by the staging pool, so that a refused count allocates no pool.
  if (num_regions > kMaxRegions) {
    throw EngineInputError("num_regions: expected at most " + std::to_string(kMaxRegions) +
                           "; got " + std::to_string(num_regions));
  }
  const std::size_t num_slots = capacity_bytes / slot_bytes;
  const std::size_t physical = physical_memory_bytes();
  if (physical != 0 && num_slots * slot_bytes > physical) {
    throw EngineInputError("capacity_bytes: expected a pool that fits in this machine's memory (" +
                           std::to_string(physical) + " bytes); got " + std::to_string(num_slots) +
                           " slots of " + std::to_string(slot_bytes) + " bytes");
  }
  return slot_bytes;
}

Direction parse_direction(std::string_view name) {
  if (name == "load") return Direction::load;
  if (name == "store") return Direction::store;
  throw EngineInputError("direction: expected \"load\" or \"store\"; got \"" + std::string(name) +
                         "\"");
}

Route parse_route(std::string_view name) {
  if (name == "cpu") return Route::cpu;
  if (name == "cuda") return Route::cuda;
  throw EngineInputError("device: expected \"cpu\" or \"cuda\"; got \"" + std::string(name) + "\"");
}

const char* route_name(Route route) { return route == Route::cuda ? "cuda" : "cpu"; }

const char* event_kind_name(EventKind kind) {
  switch (kind) {
    case EventKind::lookup:
      return "lookup";
    case EventKind::hit:
      return "hit";
    case EventKind::miss:
      return "miss";
    case EventKind::evict:
      return "evict";
    case EventKind::refuse:
      return "refuse";
    case EventKind::quarantine:
      return "quarantine";
    case EventKind::fatal:
      return "fatal";
    case EventKind::loaded:
      return "loaded";
    case EventKind::load_error:
      return "load_error";
    case EventKind::commit:
      return "commit";
    case EventKind::drop:
      return "drop";
  }
  return "unknown";
}

Engine::Engine(const KvBlockLayout& layout, CompressionMode mode, std::size_t capacity_bytes,
               std::size_t num_regions, std::size_t region_blocks, std::size_t num_device_blocks,
               Route route)
    : layout_(layout),
      mode_(mode),
      layer_bytes_(stored_layer_bytes(layout, mode)),
      tensor_bytes_(layout.bytes_per_tensor()),
      store_(allocated_store(capacity_bytes, checked_slot_bytes(layout, mode, capacity_bytes,
                                                                num_regions, region_blocks,
                                                                num_device_blocks))),
      staging_(num_regions, region_blocks),
      num_device_blocks_(num_device_blocks),
      slot_bytes_(store_.slot_bytes()),
      pool_base_(store_.slot_data(0)),
      plane_bytes_(store_.num_slots() * layer_bytes_) {
  for (auto& per_layer : faults_) per_layer.assign(layout_.num_layers(), 0);
  if (mode_ != CompressionMode::exact && route == Route::cpu) gathered_.resize(2 * tensor_bytes_);
  if (route == Route::cuda) {
    try {
      // A lease carries at most region_blocks entries, and no more than a step can hold: its
      // loads (one hash per device block, SPEC.md §6 rule 6) or its allocated stores (one slot
      // each). The route's buffers are sized by that, so a huge region_blocks (anything below
      // 2**63 serves, rule 10) sizes nothing by itself.
      const std::size_t lease_blocks =
          std::min(region_blocks, std::max(store_.num_slots(), num_device_blocks));
      cuda_ = std::make_unique<CudaRoute>(layout_, mode_, pool_base_, store_.num_slots(),
                                          num_regions, lease_blocks);
    } catch (const CudaAllocationError& error) {
      // The pool or a region too large to pin or allocate: a size the user gave, as on the CPU
      // route (allocated_store). No device or driver stays a CudaRouteError.
      throw EngineInputError(error.what());
    }
  }
}

bool Engine::fatal() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return fatal_;
}

std::size_t Engine::quarantined_regions() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return staging_.quarantined_regions();
}

ExtentCounts Engine::extent_counts() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return store_.extent_counts();
}

StepTimes Engine::last_step_times() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return last_times_;
}

StepRuns Engine::last_step_runs() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return last_runs_;
}

std::optional<RouteCounts> Engine::cuda_route_counts() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!cuda_) return std::nullopt;
  return cuda_->counts();
}

void Engine::register_kv_caches(const std::vector<DeviceKvLayer>& layers) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (layers.size() != layout_.num_layers()) {
    throw EngineInputError("layers: expected num_layers = " +
                           std::to_string(layout_.num_layers()) + " arrays; got " +
                           std::to_string(layers.size()));
  }
  for (std::size_t index = 0; index < layers.size(); ++index) {
    const std::string name = "layers[" + std::to_string(index) + "]";
    if (layers[index].data == nullptr) {
      throw EngineInputError(name + ": expected the address of the layer's KV; got null");
    }
    if (layers[index].num_device_blocks != num_device_blocks_) {
      throw EngineInputError(name + ": expected num_device_blocks = " +
                             std::to_string(num_device_blocks_) + " blocks; got " +
                             std::to_string(layers[index].num_device_blocks));
    }
  }
  // Allowed until the step runs, so a step built before any registration is not stuck.
  if (phase_ == Phase::running) out_of_order("register_kv_caches");
  kv_ = layers;
}

std::size_t Engine::lookup(const std::vector<std::uint64_t>& hashes) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t found = store_.lookup(hashes);
  log(EventKind::lookup, found);
  return found;
}

void Engine::plan_load(const std::vector<std::uint64_t>& hashes,
                       const std::vector<std::int64_t>& device_blocks) {
  plan_step(hashes, device_blocks, {}, {}, "plan_load", "", "");
}

void Engine::plan_store(const std::vector<std::uint64_t>& hashes,
                        const std::vector<std::int64_t>& device_blocks) {
  plan_step({}, {}, hashes, device_blocks, "plan_store", "", "");
}

void Engine::plan_step(const std::vector<std::uint64_t>& load_hashes,
                       const std::vector<std::int64_t>& load_device_blocks,
                       const std::vector<std::uint64_t>& store_hashes,
                       const std::vector<std::int64_t>& store_device_blocks) {
  plan_step(load_hashes, load_device_blocks, store_hashes, store_device_blocks, "plan_step",
            "load_", "store_");
}

void Engine::plan_step(const std::vector<std::uint64_t>& load_hashes,
                       const std::vector<std::int64_t>& load_device_blocks,
                       const std::vector<std::uint64_t>& store_hashes,
                       const std::vector<std::int64_t>& store_device_blocks, const char* call,
                       const std::string& load_prefix, const std::string& store_prefix) {
  const std::lock_guard<std::mutex> lock(mutex_);
  // Everything is checked before anything is planned (SPEC.md §6 rules 9 and 11).
  const std::vector<PlannedBlock> loads =
      checked_plan(load_hashes, load_device_blocks, load_prefix);
  const std::vector<PlannedBlock> stores =
      checked_plan(store_hashes, store_device_blocks, store_prefix);
  if (phase_ != Phase::planning) out_of_order(call);
  check_plan_limits(planned_loads_, loads, call, load_prefix);
  check_plan_limits(planned_stores_, stores, call, store_prefix);
  // Reserved first, so that the appends cannot throw between the two plans.
  planned_loads_.reserve(planned_loads_.size() + loads.size());
  planned_stores_.reserve(planned_stores_.size() + stores.size());
  planned_loads_.insert(planned_loads_.end(), loads.begin(), loads.end());
  planned_stores_.insert(planned_stores_.end(), stores.begin(), stores.end());
}

std::vector<std::size_t> Engine::build_step() {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ != Phase::planning) out_of_order("build_step");
  std::vector<std::size_t> missed;
  for (const PlannedBlock& planned : planned_loads_) {
    if (const auto slot = store_.pin_for_load(planned.hash)) {
      loads_.push_back({planned.hash, planned.device_block, *slot, false});
      log(EventKind::hit, planned.hash);
    } else {
      log(EventKind::miss, planned.hash);
      missed.push_back(planned.device_block);
    }
  }
  for (const PlannedBlock& planned : planned_stores_) {
    stores_.push_back({planned.hash, planned.device_block, 0, false, false});
  }
  last_runs_ = StepRuns{};
  last_times_ = StepTimes{};
  run_transfers_.clear();
  for (const LoadEntry& entry : loads_) run_transfers_.push_back({entry.slot, entry.device_block});
  count_step_runs(last_runs_.load_blocks, last_runs_.load_runs, last_runs_.load_direct_runs);
  planned_loads_.clear();
  planned_stores_.clear();
  layers_loaded_ = 0;
  layers_saved_ = 0;
  phase_ = Phase::built;
  return missed;
}

void Engine::start_load() {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ != Phase::built) out_of_order("start_load");
  if (kv_.empty()) {
    throw EngineStateError("start_load: called out of order; expected register_kv_caches first");
  }
  phase_ = Phase::running;
  if (!loads_.empty()) issue_load(0, /*final_attempt=*/true);
}

std::vector<std::size_t> Engine::wait_for_layer_load(std::int64_t layer_argument) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const std::uint32_t layer = checked_layer(layer_argument);
  if (phase_ != Phase::running || layers_loaded_ != layer || layers_saved_ != layer) {
    out_of_order("wait_for_layer_load(" + std::to_string(layer) + ")");
  }
  // Layer n + 1 is staged behind its own fence before layer n is completed, so its copy overlaps
  // the attention of layer n. With no region free, layer n is completed first (which frees one)
  // and layer n + 1 is tried once more.
  bool completed = false;
  if (layer + 1 < layout_.num_layers() && !issue_load(layer + 1, /*final_attempt=*/false)) {
    complete_load(layer);
    completed = true;
    issue_load(layer + 1, /*final_attempt=*/true);
  }
  if (!completed) complete_load(layer);
  ++layers_loaded_;
  std::vector<std::size_t> lost;
  if (lost_loads_ != 0) {
    for (const LoadEntry& entry : loads_) {
      if (entry.lost) lost.push_back(entry.device_block);
    }
  }
  if (layer + 1 == layout_.num_layers()) finish_loads();
  return lost;
}

void Engine::save_kv_layer(std::int64_t layer_argument, void* compute_stream) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const std::uint32_t layer = checked_layer(layer_argument);
  if (phase_ != Phase::running || layers_loaded_ != layer + 1 || layers_saved_ != layer) {
    out_of_order("save_kv_layer(" + std::to_string(layer) + ")");
  }
  if (layer == 0) allocate_stores();
  // Issue layer n before completing layer n - 1: one lease stays in flight behind the forward.
  // With no region free, layer n - 1 is completed first (which frees one) and layer n is tried
  // once more.
  std::optional<InFlight> issued;
  if (!issue_store(layer, /*final_attempt=*/false, compute_stream, issued)) {
    if (store_lease_) complete_store(*store_lease_);
    store_lease_.reset();
    issue_store(layer, /*final_attempt=*/true, compute_stream, issued);
  }
  if (store_lease_) complete_store(*store_lease_);
  store_lease_ = std::move(issued);
  ++layers_saved_;
}

void Engine::wait_for_save() {
  const std::lock_guard<std::mutex> lock(mutex_);
  const std::uint32_t num_layers = layout_.num_layers();
  const bool all_layers = layers_loaded_ == num_layers && layers_saved_ == num_layers;
  const bool nothing_to_move =
      layers_loaded_ == 0 && layers_saved_ == 0 && loads_.empty() && stores_.empty();
  if (phase_ != Phase::running || !(all_layers || nothing_to_move)) out_of_order("wait_for_save");
  if (store_lease_) {
    complete_store(*store_lease_);
    store_lease_.reset();
  }
  finish_stores();
  loads_.clear();
  stores_.clear();
  carried_loads_.reset();
  carried_stores_.reset();
  lost_loads_ = 0;
  load_leases_.clear();
  phase_ = Phase::planning;
}

void Engine::inject_fence_fault(Direction direction, std::int64_t layer_argument) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const std::uint32_t layer = checked_layer(layer_argument);
  ++faults_[direction_index(direction)][layer];
}

std::vector<Event> Engine::take_events() {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Event> taken;
  taken.swap(events_);
  return taken;
}

// ---- checks ----

std::uint32_t Engine::checked_layer(std::int64_t layer) const {
  if (layer < 0 || layer >= static_cast<std::int64_t>(layout_.num_layers())) {
    throw EngineInputError("layer: expected 0 <= layer < " + std::to_string(layout_.num_layers()) +
                           "; got " + std::to_string(layer));
  }
  return static_cast<std::uint32_t>(layer);
}

std::vector<Engine::PlannedBlock> Engine::checked_plan(
    const std::vector<std::uint64_t>& hashes, const std::vector<std::int64_t>& device_blocks,
    const std::string& prefix) const {
  if (device_blocks.size() != hashes.size()) {
    throw EngineInputError(prefix + "device_blocks: expected one device block per hash (" +
                           std::to_string(hashes.size()) + "); got " +
                           std::to_string(device_blocks.size()));
  }
  std::vector<PlannedBlock> blocks;
  blocks.reserve(hashes.size());
  for (std::size_t index = 0; index < hashes.size(); ++index) {
    const std::int64_t device_block = device_blocks[index];
    if (device_block < 0 || static_cast<std::uint64_t>(device_block) >= num_device_blocks_) {
      throw EngineInputError(prefix + "device_blocks[" + std::to_string(index) +
                             "]: expected 0 <= device block < " +
                             std::to_string(num_device_blocks_) + "; got " +
                             std::to_string(device_block));
    }
    blocks.push_back({hashes[index], static_cast<std::size_t>(device_block)});
  }
  return blocks;
}

void Engine::check_plan_limits(const std::vector<PlannedBlock>& plan,
                               const std::vector<PlannedBlock>& blocks, const char* call,
                               const std::string& prefix) const {
  if (blocks.empty()) return;  // nothing added: the plan so far was within its limits
  // One layer of a step's loads (or stores) travels in one region.
  if (plan.size() + blocks.size() > staging_.region_blocks()) {
    throw EngineInputError(prefix + "hashes: a step moves at most region_blocks = " +
                           std::to_string(staging_.region_blocks()) + " blocks each way; " +
                           call + " would plan " + std::to_string(plan.size() + blocks.size()));
  }
  if (&plan != &planned_loads_) return;
  // A device block loaded with two hashes is refused. A bitmap of the device blocks finds any
  // block planned twice; only then are the hashes compared, by index (for the error). A map of
  // every block cost ~0.3 ms per 2,048-block step on the H100's host, a quarter of the Python
  // API's fixed cost of a 16 KiB int8 step.
  std::vector<bool> seen(num_device_blocks_, false);
  bool repeated = false;
  for (const std::vector<PlannedBlock>* list : {&planned_loads_, &blocks}) {
    for (const PlannedBlock& planned : *list) {
      repeated = repeated || seen[planned.device_block];
      seen[planned.device_block] = true;
    }
  }
  if (!repeated) return;
  std::unordered_map<std::size_t, std::uint64_t> target;  // device block -> the hash loaded
  for (const PlannedBlock& planned : planned_loads_) {
    target.emplace(planned.device_block, planned.hash);
  }
  for (std::size_t index = 0; index < blocks.size(); ++index) {
    const auto [at, added] = target.emplace(blocks[index].device_block, blocks[index].hash);
    if (!added && at->second != blocks[index].hash) {
      throw EngineInputError(prefix + "device_blocks[" + std::to_string(index) +
                             "]: expected a device block no other hash of this step loads "
                             "into; got " +
                             std::to_string(blocks[index].device_block) + " (hash " +
                             std::to_string(at->second) + "'s)");
    }
  }
}

void Engine::out_of_order(const std::string& call) const {
  throw EngineStateError(call + ": called out of order; expected " + expected_next() + " next");
}

std::string Engine::expected_next() const {
  switch (phase_) {
    case Phase::planning:
      return "plan_load, plan_store or build_step";
    case Phase::built:
      return "start_load";
    case Phase::running:
      break;
  }
  if (layers_saved_ == layout_.num_layers()) return "wait_for_save";
  if (layers_loaded_ == layers_saved_) {
    return "wait_for_layer_load(" + std::to_string(layers_loaded_) + ")";
  }
  return "save_kv_layer(" + std::to_string(layers_saved_) + ")";
}

// ---- transfers ----

bool Engine::take_fault(Direction direction, std::uint32_t layer) {
  std::uint64_t& pending = faults_[direction_index(direction)][layer];
  if (pending == 0) return false;
  --pending;
  return true;
}

void Engine::note_lost_region(std::size_t region) {
  log(EventKind::quarantine, region);
  // The last region to go makes the engine fatal; no lease is in flight then (a quarantined
  // region never is), so nothing can be waiting on one.
  if (staging_.all_quarantined() && !fatal_) {
    fatal_ = true;
    log(EventKind::fatal, staging_.num_regions());
  }
}

// The hot loops of the CPU route: per block only pointer arithmetic and the copies (exact mode
// with contiguous K and V is two memcpy calls; slots and device blocks were range-checked when
// they were planned). K and V placed otherwise (vLLM's [B, H, N, C] views) move row by row, and
// the compressed modes code them through gathered_.
void Engine::copy_in(std::uint32_t layer, std::size_t region,
                     const std::vector<BlockTransfer>& list) {
  if (cuda_) {
    cuda_->issue(Direction::load, region, layer, list, kv_[layer], nullptr);
    return;
  }
  const KvStrides& strides = kv_[layer].strides;
  const bool contiguous = tensors_contiguous(layout_, strides);
  std::uint8_t* const base = static_cast<std::uint8_t*>(kv_[layer].data);
  const std::uint8_t* const stored = pool_base_ + layer * plane_bytes_;
  for (const BlockTransfer& block : list) {
    const std::uint8_t* source = stored + block.slot * layer_bytes_;
    std::uint8_t* const keys = base + block.device_block * strides.block;
    std::uint8_t* const values = keys + strides.value;
    if (mode_ == CompressionMode::exact && contiguous) {
      std::memcpy(keys, source, tensor_bytes_);
      std::memcpy(values, source + tensor_bytes_, tensor_bytes_);
      continue;
    }
    if (contiguous) {
      decode_layer(layout_, mode_, source, keys, values);
      continue;
    }
    if (mode_ != CompressionMode::exact) {
      decode_layer(layout_, mode_, source, gathered_.data(), gathered_.data() + tensor_bytes_);
      source = gathered_.data();
    }
    for (std::uint8_t* tensor : {keys, values}) {
      for_each_row(layout_, strides, tensor, [&](std::uint8_t* row, std::size_t at, std::size_t n) {
        std::memcpy(row, source + at, n);
      });
      source += tensor_bytes_;
    }
  }
}

// Written into the slots at transfer: a store whose fence is lost is dropped, and a dropped slot
// is freed without ever being read, so nothing unfenced is ever observed.
void Engine::copy_out(std::uint32_t layer, std::size_t region,
                      const std::vector<BlockTransfer>& list, void* compute_stream) {
  if (cuda_) {
    cuda_->issue(Direction::store, region, layer, list, kv_[layer], compute_stream);
    return;
  }
  const KvStrides& strides = kv_[layer].strides;
  const bool contiguous = tensors_contiguous(layout_, strides);
  const std::uint8_t* const base = static_cast<const std::uint8_t*>(kv_[layer].data);
  std::uint8_t* const stored = pool_base_ + layer * plane_bytes_;
  for (const BlockTransfer& block : list) {
    std::uint8_t* const destination = stored + block.slot * layer_bytes_;
    const std::uint8_t* const keys = base + block.device_block * strides.block;
    const std::uint8_t* const values = keys + strides.value;
    if (mode_ == CompressionMode::exact && contiguous) {
      std::memcpy(destination, keys, tensor_bytes_);
      std::memcpy(destination + tensor_bytes_, values, tensor_bytes_);
      continue;
    }
    if (contiguous) {
      encode_layer(layout_, mode_, keys, values, destination);
      continue;
    }
    std::uint8_t* packed = mode_ == CompressionMode::exact ? destination : gathered_.data();
    for (const std::uint8_t* tensor : {keys, values}) {
      for_each_row(layout_, strides, tensor,
                   [&](const std::uint8_t* row, std::size_t at, std::size_t n) {
                     std::memcpy(packed + at, row, n);
                   });
      packed += tensor_bytes_;
    }
    if (mode_ != CompressionMode::exact) {
      encode_layer(layout_, mode_, gathered_.data(), gathered_.data() + tensor_bytes_,
                   destination);
    }
  }
}

void Engine::mark_lost(std::size_t load) {
  if (loads_[load].lost) return;
  loads_[load].lost = true;
  ++lost_loads_;
  carried_loads_.reset();
}

void Engine::mark_dropped(std::size_t store) {
  stores_[store].dropped = true;
  carried_stores_.reset();
}

const std::shared_ptr<const Engine::Carried>& Engine::carried_loads() {
  if (!carried_loads_) {
    auto carried = std::make_shared<Carried>();
    for (std::size_t index = 0; index < loads_.size(); ++index) {
      if (loads_[index].lost) continue;  // a lost block is not transferred again
      carried->entries.push_back(index);
      carried->transfers.push_back({loads_[index].slot, loads_[index].device_block});
    }
    carried_loads_ = std::move(carried);
  }
  return carried_loads_;
}

const std::shared_ptr<const Engine::Carried>& Engine::carried_stores() {
  if (!carried_stores_) {
    auto carried = std::make_shared<Carried>();
    for (std::size_t index = 0; index < stores_.size(); ++index) {
      if (!stores_[index].allocated || stores_[index].dropped) continue;
      carried->entries.push_back(index);
      carried->transfers.push_back({stores_[index].slot, stores_[index].device_block});
    }
    carried_stores_ = std::move(carried);
  }
  return carried_stores_;
}

bool Engine::issue_load(std::uint32_t layer, bool final_attempt) {
  const std::shared_ptr<const Carried> carried = carried_loads();
  if (carried->entries.empty()) return true;
  const Prepared prepared = staging_.prepare(layer, Direction::load);
  if (prepared.status == PrepareStatus::no_region && !final_attempt) return false;
  if (prepared.status != PrepareStatus::ok) {
    // No region to stage through: this layer's data cannot arrive.
    for (const std::size_t index : carried->entries) mark_lost(index);
    return true;
  }
  staging_.bind(prepared.lease, carried->transfers);
  const FenceOutcome fence =
      take_fault(Direction::load, layer) ? FenceOutcome::unknown : FenceOutcome::signalled;
  staging_.transfer(prepared.lease, fence, [&](const std::vector<BlockTransfer>& list) {
    copy_in(layer, prepared.lease.region, list);
  });
  load_leases_.push_back({layer, prepared.lease, carried});
  return true;
}

void Engine::complete_load(std::uint32_t layer) {
  for (auto it = load_leases_.begin(); it != load_leases_.end(); ++it) {
    if (it->layer != layer) continue;
    const InFlight in_flight = std::move(*it);
    load_leases_.erase(it);
    const CompleteStatus status =
        staging_.complete(in_flight.lease, [](const std::vector<BlockTransfer>&) {},
                          observe(Direction::load, in_flight.lease));
    if (status == CompleteStatus::lost) {
      note_lost_region(in_flight.lease.region);
      for (const std::size_t index : in_flight.carried->entries) mark_lost(index);
    }
    return;
  }
}

void Engine::finish_loads() {
  for (const LoadEntry& entry : loads_) {
    store_.finish_load(entry.hash, !entry.lost);
    log(entry.lost ? EventKind::load_error : EventKind::loaded, entry.hash);
  }
}

void Engine::allocate_stores() {
  const auto started = std::chrono::steady_clock::now();
  // The whole step at once, so that its blocks can take one extent (SPEC.md §2).
  std::vector<std::uint64_t> hashes;
  hashes.reserve(stores_.size());
  for (const StoreEntry& entry : stores_) hashes.push_back(entry.hash);
  // Room for everything below, so that nothing fails once the store has changed: an evict or
  // refuse event per store, plus one extent's surplus evictions. An extent holds one step's
  // stores, so at most region_blocks and at most num_slots blocks: bounded by the pool, since
  // region_blocks may be anything up to 2**63.
  events_.reserve(events_.size() + 2 * stores_.size() +
                  std::min(staging_.region_blocks(), store_.num_slots()));
  run_transfers_.reserve(stores_.size());
  run_scratch_.reserve(stores_.size());
  const StepAllocation step = [&] {
    try {
      return store_.allocate_step(hashes);
    } catch (const std::bad_alloc&) {
      // What it evicted before failing is gone all the same: logged as any eviction is.
      store_.drain_evictions_of_failed_step(
          [this](std::uint64_t hash) { log(EventKind::evict, hash); });
      throw;
    }
  }();
  run_transfers_.clear();
  for (std::size_t index = 0; index < stores_.size(); ++index) {
    StoreEntry& entry = stores_[index];
    const Allocation& allocation = step.blocks[index];
    switch (allocation.outcome) {
      case Allocation::Outcome::allocated:
        for (const std::uint64_t evicted : allocation.evicted) log(EventKind::evict, evicted);
        entry.allocated = true;
        entry.slot = allocation.slot;
        run_transfers_.push_back({entry.slot, entry.device_block});
        break;
      case Allocation::Outcome::refused:
        log(EventKind::refuse, entry.hash);
        break;
      case Allocation::Outcome::already_present:
        break;
    }
  }
  count_step_runs(last_runs_.store_blocks, last_runs_.store_runs, last_runs_.store_direct_runs);
  carried_stores_.reset();
  if (!stores_.empty()) {  // a step without stores allocated nothing: its figures stay 0
    last_times_.allocation_ns = elapsed_ns(started);
    last_times_.eviction_ns = store_.last_step_eviction_ns();
  }
}

void Engine::count_step_runs(std::size_t& blocks, std::size_t& runs, std::size_t& direct) {
  transfer_runs(run_transfers_, run_scratch_);
  const RunCounts counts = count_runs(run_scratch_);
  blocks = run_transfers_.size();
  runs = counts.runs;
  direct = counts.device_consecutive;
}

bool Engine::issue_store(std::uint32_t layer, bool final_attempt, void* compute_stream,
                         std::optional<InFlight>& issued) {
  const std::shared_ptr<const Carried> carried = carried_stores();
  if (carried->entries.empty()) return true;
  const Prepared prepared = staging_.prepare(layer, Direction::store);
  if (prepared.status == PrepareStatus::no_region && !final_attempt) return false;
  if (prepared.status != PrepareStatus::ok) {
    // No region to stage through: these blocks can never have every layer stored.
    for (const std::size_t index : carried->entries) mark_dropped(index);
    return true;
  }
  staging_.bind(prepared.lease, carried->transfers);
  const FenceOutcome fence =
      take_fault(Direction::store, layer) ? FenceOutcome::unknown : FenceOutcome::signalled;
  staging_.transfer(prepared.lease, fence, [&](const std::vector<BlockTransfer>& list) {
    copy_out(layer, prepared.lease.region, list, compute_stream);
  });
  issued = InFlight{layer, prepared.lease, carried};
  return true;
}

FenceOutcome Engine::observe(Direction direction, const Lease& lease) {
  const FenceOutcome armed = staging_.armed_fence(lease.region);
  if (!cuda_) return armed;
  return cuda_->observe(direction, lease.region, armed == FenceOutcome::unknown);
}

void Engine::complete_store(const InFlight& in_flight) {
  const CompleteStatus status =
      staging_.complete(in_flight.lease, [](const std::vector<BlockTransfer>&) {},
                        observe(Direction::store, in_flight.lease));
  if (status == CompleteStatus::lost) {
    note_lost_region(in_flight.lease.region);
    for (const std::size_t index : in_flight.carried->entries) mark_dropped(index);
  }
}

void Engine::finish_stores() {
  const auto started = std::chrono::steady_clock::now();
  for (const StoreEntry& entry : stores_) {
    if (!entry.allocated) continue;
    if (entry.dropped) {
      store_.drop(entry.hash);
      log(EventKind::drop, entry.hash);
    } else {
      store_.commit(entry.hash);
      log(EventKind::commit, entry.hash);
    }
  }
  if (!stores_.empty()) last_times_.commit_ns = elapsed_ns(started);
}

}  // namespace activekv::offload
