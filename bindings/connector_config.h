// The vLLM connector's settings, read from vLLM's objects duck-typed: the engine's shape, pool and
// mode from VllmConfig, the KV cache config and kv_connector_extra_config; each problem a
// ConnectorConfigError (Python: ValueError) naming the attribute and what was expected.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "offload/compression.h"
#include "offload/engine.h"
#include "offload/kv_layout.h"

namespace activekv::bindings::connector {

namespace nb = nanobind;
using activekv::offload::CompressionMode;
using activekv::offload::KvBlockLayout;
using activekv::offload::KvDtype;
using activekv::offload::Route;

// Defaults for kv_connector_extra_config keys that are not given.
constexpr std::int64_t kDefaultCpuBytes = std::int64_t{1} << 30;
constexpr std::int64_t kDefaultNumRegions = 4;
constexpr std::int64_t kDefaultRegionBlocks = 64;

// A vLLM configuration or object the connector cannot serve; the message names the attribute and
// what was expected. Python: ValueError.
class ConnectorConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

inline std::string type_of(nb::handle value) { return nb::type_name(value.type()).c_str(); }

inline std::int64_t int_attr(nb::handle owner, const char* name, const std::string& where) {
  nb::object value = nb::getattr(owner, name, nb::none());
  std::int64_t result = 0;
  if (value.is_none() || !nb::try_cast<std::int64_t>(value, result)) {
    throw ConnectorConfigError(where + "." + name + ": expected an integer; got " +
                               (value.is_none() ? std::string("nothing") : type_of(value)));
  }
  return result;
}

inline std::uint32_t positive_u32(std::int64_t value, const std::string& what) {
  if (value <= 0 || value > std::numeric_limits<std::uint32_t>::max()) {
    throw ConnectorConfigError(what + ": expected a positive 32-bit integer; got " +
                               std::to_string(value));
  }
  return static_cast<std::uint32_t>(value);
}

inline std::vector<std::int64_t> int_list(nb::handle iterable, const std::string& what) {
  std::vector<std::int64_t> values;
  for (nb::handle item : iterable) {
    std::int64_t value = 0;
    if (!nb::try_cast<std::int64_t>(item, value)) {
      throw ConnectorConfigError(what + ": expected integers; got " + type_of(item));
    }
    values.push_back(value);
  }
  return values;
}

// vLLM's block hashes are bytes (a sha256 by default); the engine keys blocks by 64 bits, taken as
// the FNV-1a hash of those bytes. Integer hashes (older vLLM) are used as they are.
inline std::uint64_t block_key(nb::handle hash) {
  if (nb::isinstance<nb::bytes>(hash)) {
    const nb::bytes bytes = nb::borrow<nb::bytes>(hash);
    const auto* data = reinterpret_cast<const unsigned char*>(bytes.c_str());
    std::uint64_t key = 14695981039346656037ull;
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      key = (key ^ data[i]) * 1099511628211ull;
    }
    return key;
  }
  std::uint64_t key = 0;
  if (!nb::try_cast<std::uint64_t>(hash, key)) {
    throw ConnectorConfigError("request.block_hashes: expected bytes or integer hashes; got " +
                               type_of(hash));
  }
  return key;
}

// `keys` extended by the engine keys of the block hashes `request` gained since: a request's
// hashes only ever grow, so each is keyed once, not at every scheduler call.
inline const std::vector<std::uint64_t>& extend_keys(std::vector<std::uint64_t>& keys,
                                              nb::handle request) {
  std::size_t index = 0;
  for (nb::handle hash : request.attr("block_hashes")) {
    if (index++ >= keys.size()) keys.push_back(block_key(hash));
  }
  return keys;
}

// The block ids of KV cache group 0 in a vLLM `tuple[list[int], ...]`.
inline std::vector<std::int64_t> group0_block_ids(nb::handle groups, const std::string& what) {
  for (nb::handle group : groups) return int_list(group, what + "[0]");
  throw ConnectorConfigError(what + ": expected one list of block ids per KV cache group; got none");
}

// What the connector needs of vLLM's configuration, read once.
struct Settings {
  KvBlockLayout layout;
  CompressionMode mode;
  Route route;  // where the KV caches are: host memory (cpu) or the GPU (cuda)
  std::size_t cpu_bytes;
  std::size_t num_regions;
  std::size_t region_blocks;
  std::size_t num_device_blocks;
  std::vector<std::string> layer_names;  // model order: the order vLLM calls the layers in
  std::string engine_id;
  // vLLM's workers (tensor x pipeline parallel) and this process's rank among them (workers).
  std::size_t world_size;
  std::size_t rank;
};

inline KvDtype kv_dtype(nb::handle torch_dtype) {
  const std::string name = nb::str(torch_dtype).c_str();
  if (name == "torch.float16") return KvDtype::fp16;
  if (name == "torch.bfloat16") return KvDtype::bf16;
  if (name == "torch.float32") return KvDtype::fp32;
  throw ConnectorConfigError(
      "kv_cache_config.kv_cache_groups[0].kv_cache_spec.dtype: expected torch.float16, "
      "torch.bfloat16 or torch.float32; got " + name);
}

// kv_transfer_config.kv_connector_extra_config, validated whole: every key known, every value of
// its type. README.md ("Connector settings") lists the keys with their defaults.
constexpr const char* kExtraConfig = "kv_transfer_config.kv_connector_extra_config";
const char* const kExtraKeys[] = {"mode", "device", "cpu_bytes", "num_regions", "region_blocks"};

inline std::string extra_key(const std::string& key) {
  return std::string(kExtraConfig) + "[\"" + key + "\"]";
}

// Edit distance, for "did you mean" on a mistyped key.
inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The extra config as a dict, each key checked against kExtraKeys.
inline nb::dict extra_config(nb::handle transfer) {
  nb::object extra = nb::getattr(transfer, "kv_connector_extra_config", nb::none());
  if (extra.is_none()) return nb::dict();
  if (!nb::isinstance<nb::dict>(extra)) {
    throw ConnectorConfigError(std::string(kExtraConfig) + ": expected a dict; got " +
                               type_of(extra));
  }
  const nb::dict table = nb::borrow<nb::dict>(extra);
  std::string known;
  for (const char* key : kExtraKeys) known += std::string(known.empty() ? "" : ", ") + key;
  for (auto [key, value] : table) {
    const std::string name = nb::isinstance<nb::str>(key) ? nb::cast<std::string>(key)
                                                           : std::string(nb::repr(key).c_str());
    const char* closest = nullptr;
    std::size_t best = 3;  // suggest only a near miss
    for (const char* candidate : kExtraKeys) {
      if (name == candidate) {
        closest = candidate;
        best = 0;
        break;
      }
      const std::size_t distance = edit_distance(name, candidate);
      if (distance < best) {
        best = distance;
        closest = candidate;
      }
    }
    if (best == 0) continue;
    throw ConnectorConfigError(
        extra_key(name) + ": unknown key" +
        (closest != nullptr ? std::string(" (did you mean \"") + closest + "\"?)" : "") +
        "; expected one of " + known);
  }
  return table;
}

inline std::int64_t extra_int(const nb::dict& extra, const char* key, std::int64_t fallback) {
  if (!extra.contains(key)) return fallback;
  nb::object value = extra[key];
  std::int64_t result = 0;
  if (nb::isinstance<nb::bool_>(value) || !nb::try_cast<std::int64_t>(value, result, false) ||
      result <= 0) {
    throw ConnectorConfigError(extra_key(key) + ": expected a positive integer below 2**63; got " +
                               nb::repr(value).c_str());
  }
  return result;
}

inline std::string extra_str(const nb::dict& extra, const char* key, const char* fallback) {
  if (!extra.contains(key)) return fallback;
  std::string value;
  if (!nb::try_cast<std::string>(extra[key], value, false)) {
    throw ConnectorConfigError(extra_key(key) + ": expected a string; got " +
                               nb::repr(extra[key]).c_str());
  }
  return value;
}

// kv_connector_extra_config[key] read by the engine's own parser (parse_mode, parse_route), its
// error naming the key.
template <typename Parse>
auto extra_choice(const nb::dict& extra, const char* key, const char* fallback, Parse&& parse) {
  const std::string value = extra_str(extra, key, fallback);
  try {
    return parse(value);
  } catch (const std::invalid_argument& error) {
    throw ConnectorConfigError(extra_key(key) + ": " + error.what());
  }
}

// The connector's mode names: the engine's, and "fp8" for fp8_e4m3 (the only fp8 it codes).
inline CompressionMode connector_mode(const std::string& name) {
  return activekv::offload::parse_mode(name == "fp8" ? "fp8_e4m3" : name);
}

// Where vLLM keeps the KV caches: its device_config.device_type ("cuda" on GPUs).
inline const char* vllm_device(nb::handle vllm_config) {
  nb::object device = nb::getattr(nb::getattr(vllm_config, "device_config", nb::none()),
                                  "device_type", nb::none());
  return !device.is_none() && std::string(nb::str(device).c_str()) == "cuda" ? "cuda" : "cpu";
}

// Why a KV cache config with other than one group cannot be served, as a user can act on it.
inline std::string groups_problem(const std::vector<nb::object>& groups) {
  if (groups.empty()) {
    return "expected one group of attention layers; got none (a model without a KV cache has "
           "nothing to offload)";
  }
  nb::object attention = nb::module_::import_("vllm.v1.kv_cache_interface").attr("AttentionSpec");
  std::string kinds;
  bool attention_only = true;
  for (const nb::object& group : groups) {
    nb::object spec = group.attr("kv_cache_spec");
    kinds += (kinds.empty() ? "" : ", ") + nb::cast<std::string>(spec.type().attr("__name__"));
    const int is_attention = PyObject_IsInstance(spec.ptr(), attention.ptr());
    if (is_attention < 0) throw nb::python_error();
    attention_only = attention_only && is_attention == 1;
  }
  return "expected one group of attention layers; got " + std::to_string(groups.size()) + " (" +
         kinds + "). " +
         (attention_only ? "Layers of several attention kinds (e.g. sliding window) share one "
                           "group when vLLM runs with --disable-hybrid-kv-cache-manager"
                         : "ActiveKV offloads attention KV only; this model also keeps state of "
                           "another kind");
}

// The spec fields that change what a block's bytes mean: a spec that sets any is refused by name.
inline void check_plain_attention(nb::handle spec, const std::string& where) {
  const auto refuse = [&](const std::string& field, const std::string& value) {
    throw ConnectorConfigError(where + "." + field + ": expected the plain K and V of " +
                               "FullAttentionSpec (ActiveKV serves no other); got " + value +
                               " in " + std::string(nb::repr(spec).c_str()));
  };
  nb::object quant = nb::getattr(spec, "kv_quant_mode", nb::none());
  if (!quant.is_none() && nb::cast<std::int64_t>(nb::int_(quant)) != 0) {
    refuse("kv_quant_mode", nb::str(quant).c_str());
  }
  for (const char* field : {"num_head_slots", "state_content_bytes"}) {
    nb::object value = nb::getattr(spec, field, nb::none());
    if (!value.is_none()) refuse(field, nb::repr(value).c_str());
  }
  nb::object per_state = nb::getattr(spec, "tokens_per_state", nb::none());
  if (!per_state.is_none() && !per_state.equal(nb::int_(1))) {
    refuse("tokens_per_state", nb::repr(per_state).c_str());
  }
}

// (world size, rank) of vLLM's parallel_config: every worker holds a pool of its own shard, and
// the scheduler counts a block as a hit only where all of them hold it (engine/offload/SPEC.md
// §9). Their block index is shared memory, so every worker must run on the scheduler's host.
inline std::pair<std::size_t, std::size_t> parallel_ranks(nb::handle vllm_config) {
  nb::object parallel = nb::getattr(vllm_config, "parallel_config", nb::none());
  if (parallel.is_none()) return {1, 0};
  const auto read = [&](const char* name, std::int64_t fallback) {
    return nb::hasattr(parallel, name) ? int_attr(parallel, name, "vllm_config.parallel_config")
                                       : fallback;
  };
  const std::int64_t world_size = read("world_size", 1);
  const std::int64_t rank = read("rank", 0);
  const std::int64_t nodes = read("nnodes", 1);
  if (nodes != 1) {
    throw ConnectorConfigError(
        "vllm_config.parallel_config.nnodes: expected 1 (ActiveKV's workers publish their blocks "
        "to the scheduler through shared memory on one host); got " + std::to_string(nodes));
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw ConnectorConfigError("vllm_config.parallel_config.rank: expected 0 <= rank < world_size (" +
                               std::to_string(world_size) + "); got " + std::to_string(rank));
  }
  return {static_cast<std::size_t>(world_size), static_cast<std::size_t>(rank)};
}

inline Settings read_settings(nb::handle vllm_config, nb::handle kv_cache_config) {
  std::vector<nb::object> groups;
  for (nb::handle group : kv_cache_config.attr("kv_cache_groups")) groups.push_back(nb::borrow(group));
  if (groups.size() != 1) {
    throw ConnectorConfigError("kv_cache_config.kv_cache_groups: " + groups_problem(groups));
  }
  const std::string where = "kv_cache_config.kv_cache_groups[0].kv_cache_spec";
  nb::object spec = groups[0].attr("kv_cache_spec");
  check_plain_attention(spec, where);
  const std::int64_t head_size = int_attr(spec, "head_size", where);
  nb::object head_size_v = nb::getattr(spec, "head_size_v", nb::none());
  if (!head_size_v.is_none() && nb::cast<std::int64_t>(head_size_v) != head_size) {
    throw ConnectorConfigError(where + ".head_size_v: expected the same as head_size (" +
                               std::to_string(head_size) + ")");
  }
  std::vector<std::string> layer_names;
  for (nb::handle name : groups[0].attr("layer_names")) {
    layer_names.push_back(nb::cast<std::string>(name));
  }
  const KvBlockLayout layout(
      positive_u32(static_cast<std::int64_t>(layer_names.size()),
                   "kv_cache_config.kv_cache_groups[0].layer_names (count)"),
      positive_u32(int_attr(spec, "block_size", where), where + ".block_size"),
      positive_u32(int_attr(spec, "num_kv_heads", where), where + ".num_kv_heads"),
      positive_u32(head_size, where + ".head_size"), kv_dtype(spec.attr("dtype")));

  nb::object transfer = vllm_config.attr("kv_transfer_config");
  if (transfer.is_none()) {
    throw ConnectorConfigError("vllm_config.kv_transfer_config: expected a KVTransferConfig");
  }
  const nb::dict extra = extra_config(transfer);
  nb::object engine_id = nb::getattr(transfer, "engine_id", nb::none());
  const auto [world_size, rank] = parallel_ranks(vllm_config);
  return Settings{
      layout,
      extra_choice(extra, "mode", "exact", connector_mode),
      extra_choice(extra, "device", vllm_device(vllm_config), activekv::offload::parse_route),
      static_cast<std::size_t>(extra_int(extra, "cpu_bytes", kDefaultCpuBytes)),
      static_cast<std::size_t>(extra_int(extra, "num_regions", kDefaultNumRegions)),
      static_cast<std::size_t>(extra_int(extra, "region_blocks", kDefaultRegionBlocks)),
      static_cast<std::size_t>(positive_u32(int_attr(kv_cache_config, "num_blocks", "kv_cache_config"),
                                            "kv_cache_config.num_blocks")),
      std::move(layer_names),
      engine_id.is_none() ? std::string() : std::string(nb::str(engine_id).c_str()),
      world_size,
      rank};
}

// An engine argument error as the user wrote the setting: "capacity_bytes: ..." becomes
// kv_connector_extra_config["cpu_bytes"]: ..., and so on.
inline std::string in_config_terms(const std::string& message) {
  const std::pair<const char*, std::string> names[] = {
      {"capacity_bytes", extra_key("cpu_bytes")},
      {"num_regions", extra_key("num_regions")},
      {"region_blocks", extra_key("region_blocks")},
      {"num_device_blocks", "kv_cache_config.num_blocks"}};
  for (const auto& [engine_name, config_name] : names) {
    const std::string prefix = std::string(engine_name) + ":";
    if (message.rfind(prefix, 0) == 0) return config_name + message.substr(prefix.size() - 1);
  }
  return message;
}

inline const char* torch_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::fp16:
      return "torch.float16";
    case KvDtype::bf16:
      return "torch.bfloat16";
    case KvDtype::fp32:
      return "torch.float32";
  }
  return "unknown";
}

inline std::string quoted(const std::string& text) { return "\"" + text + "\""; }

// One setting that shapes a worker's engine, as the user wrote it: its key and its value as text.
struct SettingText {
  std::string key;
  std::string value;
};

// Every setting that shapes a worker's engine (its pool, staging, mode, device, the KV caches it
// views, the block index it publishes) but the layer names, which engine_differences compares
// name by name.
inline std::vector<SettingText> engine_shape(const Settings& settings) {
  const std::string spec = "kv_cache_config.kv_cache_groups[0].kv_cache_spec";
  const KvBlockLayout& layout = settings.layout;
  return {
      {spec + ".block_size", std::to_string(layout.block_size())},
      {spec + ".num_kv_heads", std::to_string(layout.num_kv_heads())},
      {spec + ".head_size", std::to_string(layout.head_dim())},
      {spec + ".dtype", torch_dtype_name(layout.dtype())},
      {"kv_cache_config.num_blocks", std::to_string(settings.num_device_blocks)},
      {extra_key("mode"), quoted(activekv::offload::mode_name(settings.mode))},
      {extra_key("device"), quoted(activekv::offload::route_name(settings.route))},
      {extra_key("cpu_bytes"), std::to_string(settings.cpu_bytes)},
      {extra_key("num_regions"), std::to_string(settings.num_regions)},
      {extra_key("region_blocks"), std::to_string(settings.region_blocks)},
      {"vllm_config.parallel_config.world_size", std::to_string(settings.world_size)},
      {"vllm_config.parallel_config.rank", std::to_string(settings.rank)},
  };
}

// Where `given` would need another engine than the one `live` made: one "<key>: expected <live's>
// (...); got <given's>" per setting, in engine_shape's order after the layer names; empty when
// they may share it.
inline std::vector<std::string> engine_differences(const Settings& live, const Settings& given) {
  const std::string running = " (the engine " + quoted(live.engine_id) +
                              " of this process already runs with it); got ";
  std::vector<std::string> found;
  const std::string names = "kv_cache_config.kv_cache_groups[0].layer_names";
  if (live.layer_names.size() != given.layer_names.size()) {
    found.push_back(names + " (count): expected " + std::to_string(live.layer_names.size()) +
                    running + std::to_string(given.layer_names.size()));
  } else {
    for (std::size_t i = 0; i < live.layer_names.size(); ++i) {
      if (live.layer_names[i] == given.layer_names[i]) continue;
      found.push_back(names + "[" + std::to_string(i) + "]: expected " +
                      quoted(live.layer_names[i]) + running + quoted(given.layer_names[i]));
      break;  // the first: one model's names against another's would differ at every layer
    }
  }
  const std::vector<SettingText> expected = engine_shape(live);
  const std::vector<SettingText> got = engine_shape(given);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (expected[i].value != got[i].value) {
      found.push_back(expected[i].key + ": expected " + expected[i].value + running + got[i].value);
    }
  }
  return found;
}

// The engine arguments checked as the engine would check them, without allocating its pool: the
// scheduler half has no pool but refuses what no worker could start with.
inline void check_engine_arguments(const Settings& settings) {
  try {
    activekv::offload::checked_slot_bytes(settings.layout, settings.mode, settings.cpu_bytes,
                                          settings.num_regions, settings.region_blocks,
                                          settings.num_device_blocks);
  } catch (const std::invalid_argument& error) {
    throw ConnectorConfigError(in_config_terms(error.what()));
  }
}

}  // namespace activekv::bindings::connector
