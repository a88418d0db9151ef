// activekv._engine: the KV-cache offload engine.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings/build_facts.h"
#include "bindings/errors.h"
#include "bindings/integers.h"
#include "bindings/kv_views.h"
#include "offload/compression.h"
#include "offload/cuda_route.h"
#include "offload/engine.h"
#include "offload/kv_layout.h"

namespace nb = nanobind;
using activekv::offload::DeviceKvLayer;
using activekv::offload::Engine;
using activekv::offload::EngineInputError;
using activekv::offload::EngineStateError;
using activekv::offload::KvBlockLayout;
using activekv::offload::KvDtype;
using activekv::offload::LayoutError;

using activekv::bindings::checked_kv_view;
using activekv::bindings::dtype_text;
using activekv::bindings::integer_argument;
using activekv::bindings::kv_layer_view;
using activekv::bindings::KvViewRule;
using activekv::bindings::PyInteger;
using activekv::bindings::scalar_dtype;

namespace {

using NumpyArray = nb::ndarray<nb::numpy>;

// A new numpy array that owns `bytes` of storage, shaped and typed as asked.
NumpyArray owned_array(std::size_t bytes, std::vector<std::size_t> shape, nb::dlpack::dtype dtype) {
  auto storage = std::make_unique<std::vector<std::uint8_t>>(bytes);
  std::uint8_t* data = storage->data();
  nb::capsule owner(storage.get(), [](void* pointer) noexcept {
    // Adopts the storage released below, so it is freed when the array is.
    std::unique_ptr<std::vector<std::uint8_t>>(static_cast<std::vector<std::uint8_t>*>(pointer));
  });
  storage.release();  // owned by the capsule from here on
  return NumpyArray(data, shape.size(), shape.data(), owner, nullptr, dtype);
}

nb::dlpack::dtype word_dtype(const KvBlockLayout& layout) {
  return activekv::offload::dtype_bytes(layout.dtype()) == 2 ? nb::dtype<std::uint16_t>()
                                                             : nb::dtype<std::uint32_t>();
}

// ---- Engine ----

std::size_t non_negative(const PyInteger& value, const char* name) {
  return static_cast<std::size_t>(integer_argument<EngineInputError, std::int64_t>(
      value, name, 0, std::numeric_limits<std::int64_t>::max(),
      "a non-negative integer below 2**63"));
}

// A layer argument as the engine checks it (0 <= layer < num_layers); one beyond int64 gets the
// engine's own message.
std::int64_t layer_argument(const PyInteger& layer, std::size_t num_layers) {
  return integer_argument<EngineInputError, std::int64_t>(
      layer, "layer", std::numeric_limits<std::int64_t>::min(),
      std::numeric_limits<std::int64_t>::max(), "0 <= layer < " + std::to_string(num_layers));
}

// A dimension of KvBlockLayout: the layout itself refuses 0 with its own message.
std::uint32_t layout_dimension(const PyInteger& value, const char* name) {
  return integer_argument<LayoutError, std::uint32_t>(
      value, name, 0, std::numeric_limits<std::uint32_t>::max(), "a positive integer below 2**32");
}

// Items of a Python iterable as integers of type T; EngineInputError naming `name[i]` for an item
// that is not an integer in T's range (TypeError from Python for something not iterable).
template <typename T>
std::vector<T> integers_from(nb::handle iterable, const char* name, const char* expected) {
  std::vector<T> values;
  const auto append = [&](nb::handle item) {
    T value{};
    if (!nb::try_cast<T>(item, value)) {
      throw EngineInputError(std::string(name) + "[" + std::to_string(values.size()) +
                             "]: expected " + expected + "; got " + nb::repr(item).c_str());
    }
    values.push_back(value);
  };
  // vLLM hands lists: indexing them skips an iterator object and a call per item.
  if (nb::isinstance<nb::list>(iterable)) {
    const nb::list list = nb::borrow<nb::list>(iterable);
    values.reserve(list.size());
    for (std::size_t index = 0; index < list.size(); ++index) append(list[index]);
    return values;
  }
  for (nb::handle item : iterable) append(item);
  return values;
}

std::vector<std::uint64_t> hashes_from(nb::handle iterable, const char* name = "hashes") {
  return integers_from<std::uint64_t>(iterable, name, "an unsigned 64-bit block hash");
}

std::vector<std::int64_t> device_blocks_from(nb::handle iterable,
                                             const char* name = "device_blocks") {
  return integers_from<std::int64_t>(iterable, name, "a device block index");
}

// Any array without conversion: the engine keeps the caller's memory, never a copy of it.
using AnyArray = nb::ndarray<>;
using ReadOnlyArray = nb::ndarray<nb::ro>;

// Host arrays for the codec functions: raw words of `dtype_name` ("" for stored bytes).
KvViewRule host_words(std::size_t bits, const std::string& dtype_name,
                      std::vector<std::int64_t> shape, const char* shape_text) {
  const nb::dlpack::dtype words = scalar_dtype(nb::dlpack::dtype_code::UInt, bits);
  return {{words},
          "raw words (" + dtype_text(words) + ")" +
              (dtype_name.empty() ? "" : " of dtype " + dtype_name),
          std::move(shape),
          shape_text};
}

// One block's K or V for encode_layer: read-only raw words [T, H, D].
ReadOnlyArray checked_block_words(const KvBlockLayout& layout, nb::handle item, const char* name) {
  return checked_kv_view<ReadOnlyArray>(
      item, name,
      host_words(activekv::offload::dtype_bytes(layout.dtype()) * 8,
                 activekv::offload::dtype_name(layout.dtype()),
                 {layout.block_size(), layout.num_kv_heads(), layout.head_dim()},
                 "[block_size, num_kv_heads, head_dim]"));
}

// Python's Engine: the engine plus the arrays it was given, which it only views. Holding the
// arrays here keeps their memory alive for as long as the engine may copy into or out of it.
class BoundEngine {
 public:
  BoundEngine(const KvBlockLayout& layout, const std::string& mode, const PyInteger& capacity_bytes,
              const PyInteger& num_regions, const PyInteger& region_blocks,
              const PyInteger& num_device_blocks, const std::string& device)
      : engine(layout, activekv::offload::parse_mode(mode),
               non_negative(capacity_bytes, "capacity_bytes"),
               non_negative(num_regions, "num_regions"),
               non_negative(region_blocks, "region_blocks"),
               non_negative(num_device_blocks, "num_device_blocks"),
               activekv::offload::parse_route(device)) {}

  void register_kv_caches(nb::iterable layers) {
    std::vector<nb::object> items;  // owned: an iterator may drop each item after yielding it
    for (nb::handle item : layers) items.push_back(nb::borrow(item));
    const KvBlockLayout& layout = engine.layout();
    if (items.size() != layout.num_layers()) {
      throw EngineInputError("layers: expected num_layers = " +
                             std::to_string(layout.num_layers()) + " arrays; got " +
                             std::to_string(items.size()));
    }
    std::vector<AnyArray> arrays;
    std::vector<DeviceKvLayer> views;
    for (std::size_t index = 0; index < items.size(); ++index) {
      const auto [array, strides] =
          kv_layer_view(items[index], "layers[" + std::to_string(index) + "]", engine);
      arrays.push_back(array);
      views.push_back({array.data(), engine.num_device_blocks(), strides});
    }
    // GIL held: the engine's views and the arrays keeping them alive must change together, or a
    // concurrent registration could leave the engine viewing freed memory.
    engine.register_kv_caches(views);
    kv_arrays = std::move(arrays);
  }

  // Each holds its source array (through DLPack or the buffer protocol) alive and unresized.
  // Declared before `engine` so it is destroyed after it: the CUDA route drains its streams
  // first, and only then may the device KV go back to its owner.
  std::vector<AnyArray> kv_arrays;
  Engine engine;
};

// The engine's event log, taken with the GIL released (a hook may hold the engine's lock on another
// thread).
std::vector<activekv::offload::Event> taken_events(Engine& engine) {
  nb::gil_scoped_release release;
  return engine.take_events();
}

// The event kinds as Python strings, made once: an events() call builds thousands of tuples per
// step, and a new str per tuple was most of its cost. Never freed (they live as long as the
// module, which CPython never unloads).
const std::vector<nb::handle>& event_kind_strings() {
  static const std::vector<nb::handle> strings = [] {
    std::vector<nb::handle> made;
    for (int kind = 0; kind <= static_cast<int>(activekv::offload::EventKind::drop); ++kind) {
      made.push_back(nb::str(activekv::offload::event_kind_name(
                                 static_cast<activekv::offload::EventKind>(kind)))
                         .release());
    }
    return made;
  }();
  return strings;
}

// ---- DeviceKvCache ----

// A contiguous view of a Python object's bytes (the buffer protocol: bytes, bytearray, numpy),
// released when it goes out of scope.
class HostBytes {
 public:
  HostBytes(nb::handle object, const char* name) {
    if (PyObject_GetBuffer(object.ptr(), &view_, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      throw EngineInputError(std::string(name) + ": expected a contiguous bytes-like object; got " +
                             nb::type_name(object.type()).c_str());
    }
  }
  ~HostBytes() { PyBuffer_Release(&view_); }
  HostBytes(const HostBytes&) = delete;
  HostBytes& operator=(const HostBytes&) = delete;
  const void* data() const { return view_.buf; }
  std::size_t size() const { return static_cast<std::size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

std::size_t layer_index(const activekv::offload::DeviceKvCache& cache, const PyInteger& layer) {
  const std::string expected = "0 <= layer < " + std::to_string(cache.num_layers());
  return integer_argument<EngineInputError, std::size_t>(layer, "layer", 0, cache.num_layers() - 1,
                                                         expected);
}

void bind_device_kv_cache(nb::module_& m) {
  using activekv::offload::DeviceKvCache;
  nb::class_<DeviceKvCache>(
      m, "DeviceKvCache",
      "Device KV the wheel allocates itself, for a runner without torch (the GPU gates): one "
      "zeroed buffer per layer of [2, num_device_blocks, block_size, num_kv_heads, head_dim] raw "
      "words on the current CUDA device, allocated at construction.")
      .def(
          "__init__",
          [](DeviceKvCache* self, const KvBlockLayout& layout, const PyInteger& num_device_blocks) {
            new (self) DeviceKvCache(layout, non_negative(num_device_blocks, "num_device_blocks"));
          },
          nb::arg("layout"), nb::arg("num_device_blocks"))
      .def_prop_ro("device", &DeviceKvCache::device)
      .def_prop_ro("num_layers", &DeviceKvCache::num_layers)
      .def_prop_ro("layer_bytes", &DeviceKvCache::layer_bytes)
      .def_prop_ro(
          "layers",
          [](nb::handle self) {
            const auto& cache = nb::cast<const DeviceKvCache&>(self);
            const KvBlockLayout& layout = cache.layout();
            const std::size_t shape[] = {2, cache.num_device_blocks(), layout.block_size(),
                                         layout.num_kv_heads(), layout.head_dim()};
            nb::list layers;
            for (std::size_t index = 0; index < cache.num_layers(); ++index) {
              layers.append(nb::cast(nb::ndarray<>(cache.layer(index), 5, shape, self, nullptr,
                                                   word_dtype(layout), nb::device::cuda::value,
                                                   cache.device())));
            }
            return layers;
          },
          nb::sig("def layers(self) -> list[object]"),
          "One DLPack device array per layer, for Engine.register_kv_caches (each keeps this "
          "cache alive).")
      .def(
          "upload",
          [](DeviceKvCache& cache, const PyInteger& layer, nb::handle data) {
            const HostBytes bytes(data, "data");
            cache.upload(layer_index(cache, layer), bytes.data(), bytes.size());
          },
          nb::arg("layer"), nb::arg("data"),
          "Copies one whole layer of host bytes (layer_bytes of them) into the device buffer.")
      .def(
          "download",
          [](const DeviceKvCache& cache, const PyInteger& layer) {
            const std::size_t index = layer_index(cache, layer);
            nb::bytes out = nb::steal<nb::bytes>(
                PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(cache.layer_bytes())));
            if (!out.is_valid()) throw nb::python_error();
            char* data = PyBytes_AsString(out.ptr());
            if (data == nullptr) throw nb::python_error();
            cache.download(index, data, cache.layer_bytes());
            return out;
          },
          nb::arg("layer"), "One whole layer of the device buffer, copied back as bytes.");
}

}  // namespace

NB_MODULE(_engine, m) {
  m.doc() = "ActiveKV engine: KV blocks kept in host RAM and staged back layer by layer.";
  activekv::bindings::translate_standard_exceptions();
  activekv::bindings::bind_build_and_device(m);

  nb::exception<activekv::offload::LayoutError>(m, "LayoutError", PyExc_ValueError);
  nb::exception<EngineInputError>(m, "EngineInputError", PyExc_ValueError);
  nb::exception<EngineStateError>(m, "EngineStateError", PyExc_RuntimeError);
  nb::exception<activekv::offload::CudaRouteError>(m, "CudaRouteError", PyExc_RuntimeError);

  nb::enum_<KvDtype>(m, "KvDtype", "Element type of offloaded KV, carried as raw bits.")
      .value("fp16", KvDtype::fp16)
      .value("bf16", KvDtype::bf16)
      .value("fp32", KvDtype::fp32);

  nb::class_<KvBlockLayout>(m, "KvBlockLayout",
                            "Geometry of one KV block: K and V of every layer.")
      .def(
          "__init__",
          [](KvBlockLayout* self, const PyInteger& num_layers, const PyInteger& block_size,
             const PyInteger& num_kv_heads, const PyInteger& head_dim, KvDtype dtype) {
            // One at a time, in order: the first bad dimension is the one named.
            const std::uint32_t layers = layout_dimension(num_layers, "num_layers");
            const std::uint32_t tokens = layout_dimension(block_size, "block_size");
            const std::uint32_t heads = layout_dimension(num_kv_heads, "num_kv_heads");
            const std::uint32_t dim = layout_dimension(head_dim, "head_dim");
            new (self) KvBlockLayout(layers, tokens, heads, dim, dtype);
          },
          nb::arg("num_layers"), nb::arg("block_size"), nb::arg("num_kv_heads"),
          nb::arg("head_dim"), nb::arg("dtype"))
      .def_prop_ro("num_layers", &KvBlockLayout::num_layers)
      .def_prop_ro("block_size", &KvBlockLayout::block_size)
      .def_prop_ro("num_kv_heads", &KvBlockLayout::num_kv_heads)
      .def_prop_ro("head_dim", &KvBlockLayout::head_dim)
      .def_prop_ro("dtype", &KvBlockLayout::dtype)
      .def_prop_ro("bytes_per_tensor", &KvBlockLayout::bytes_per_tensor)
      .def_prop_ro("bytes_per_layer", &KvBlockLayout::bytes_per_layer)
      .def_prop_ro("bytes_per_block", &KvBlockLayout::bytes_per_block)
      .def(
          "offset_of",
          [](const KvBlockLayout& layout, const PyInteger& layer, bool value) {
            // Any integer: one out of range gets the layout's own LayoutError naming `layer`.
            const std::string expected = "0 <= layer < " + std::to_string(layout.num_layers());
            return layout.offset_of(
                integer_argument<LayoutError, std::uint32_t>(
                    layer, "layer", 0, layout.num_layers() - 1, expected),
                value);
          },
          nb::arg("layer"), nb::arg("value"),
           "Byte offset of one layer's K (value=False) or V (value=True) in a block of raw words "
           "(the exact layout; compressed slots are laid out as SPEC.md §5 says).")
      .def("__repr__",
           [](const KvBlockLayout& layout) { return "KvBlockLayout(" + layout.describe() + ")"; });

  bind_device_kv_cache(m);

  m.def(
      "stored_block_bytes",
      [](const KvBlockLayout& layout, const std::string& mode) {
        return activekv::offload::stored_block_bytes(layout, activekv::offload::parse_mode(mode));
      },
      nb::arg("layout"), nb::arg("mode"),
      "Bytes one block takes in the host pool in this mode (the slot size).");

  m.def(
      "encode_layer",
      [](const KvBlockLayout& layout, const std::string& mode, nb::handle k_words,
         nb::handle v_words) {
        const auto parsed = activekv::offload::parse_mode(mode);
        const ReadOnlyArray k = checked_block_words(layout, k_words, "k");
        const ReadOnlyArray v = checked_block_words(layout, v_words, "v");
        const std::size_t bytes = activekv::offload::stored_layer_bytes(layout, parsed);
        NumpyArray out = owned_array(bytes, {bytes}, nb::dtype<std::uint8_t>());
        activekv::offload::encode_layer(layout, parsed, k.data(), v.data(),
                                        static_cast<std::uint8_t*>(out.data()));
        return out;
      },
      nb::arg("layout"), nb::arg("mode"), nb::arg("k"), nb::arg("v"),
      nb::sig("def encode_layer(layout: KvBlockLayout, mode: str, k: NDArray, v: NDArray) "
              "-> NDArray[numpy.uint8]"),
      "Encodes one layer of one block (K and V raw words) as the host pool stores it.");

  m.def(
      "decode_layer",
      [](const KvBlockLayout& layout, const std::string& mode, nb::handle stored_bytes) {
        const auto parsed = activekv::offload::parse_mode(mode);
        const std::size_t expected = activekv::offload::stored_layer_bytes(layout, parsed);
        const ReadOnlyArray stored = checked_kv_view<ReadOnlyArray>(
            stored_bytes, "stored",
            host_words(8, "", {static_cast<std::int64_t>(expected)}, "[stored_layer_bytes]"));
        const std::size_t bytes = layout.bytes_per_tensor();
        std::vector<std::size_t> shape{layout.block_size(), layout.num_kv_heads(),
                                       layout.head_dim()};
        NumpyArray k = owned_array(bytes, shape, word_dtype(layout));
        NumpyArray v = owned_array(bytes, shape, word_dtype(layout));
        activekv::offload::decode_layer(layout, parsed, static_cast<const std::uint8_t*>(stored.data()),
                                        k.data(), v.data());
        return std::make_pair(k, v);
      },
      nb::arg("layout"), nb::arg("mode"), nb::arg("stored"),
      nb::sig("def decode_layer(layout: KvBlockLayout, mode: str, stored: NDArray[numpy.uint8]) "
              "-> tuple[NDArray, NDArray]"),
      "Decodes one stored layer back into (K, V) raw words of the layout's dtype.");

  using Release = nb::gil_scoped_release;
  nb::class_<BoundEngine>(m, "Engine",
                          "The offload engine: host pool, staging regions, per-layer hooks "
                          "(engine/offload/SPEC.md). device=\"cuda\" pins the pool and moves "
                          "the data with the wheel's kernels behind CUDA event fences.")
      .def(nb::init<const KvBlockLayout&, const std::string&, const PyInteger&, const PyInteger&,
                    const PyInteger&, const PyInteger&, const std::string&>(),
           nb::arg("layout"), nb::arg("mode"), nb::arg("capacity_bytes"), nb::arg("num_regions"),
           nb::arg("region_blocks"), nb::arg("num_device_blocks"), nb::arg("device") = "cpu")
      .def_prop_ro("device",
                   [](const BoundEngine& self) {
                     return activekv::offload::route_name(self.engine.route());
                   })
      .def_prop_ro("slot_bytes", [](const BoundEngine& self) { return self.engine.slot_bytes(); })
      .def_prop_ro("num_slots", [](const BoundEngine& self) { return self.engine.num_slots(); })
      .def_prop_ro("fatal",
                   [](const BoundEngine& self) {
                     Release release;  // waits for a hook running on another thread
                     return self.engine.fatal();
                   })
      .def_prop_ro("quarantined_regions",
                   [](const BoundEngine& self) {
                     Release release;
                     return self.engine.quarantined_regions();
                   })
      .def_prop_ro(
          "extent_stats",
          [](const BoundEngine& self) {
            activekv::offload::ExtentCounts counts;
            activekv::offload::StepRuns runs;
            std::size_t free_slots = 0;
            std::size_t free_runs = 0;
            {
              Release release;  // waits for a hook running on another thread
              counts = self.engine.extent_counts();
              runs = self.engine.last_step_runs();
              free_slots = self.engine.store().free_slots();
              free_runs = self.engine.store().free_run_count();
            }
            nb::dict stats;
            stats["free_slots"] = free_slots;
            stats["free_runs"] = free_runs;
            stats["store_steps"] = counts.store_steps;
            stats["extents"] = counts.extents;
            stats["split_steps"] = counts.split_steps;
            stats["split_blocks"] = counts.split_blocks;
            stats["single_slot_blocks"] = counts.single_slot_blocks;
            stats["last_load_blocks"] = runs.load_blocks;
            stats["last_load_runs"] = runs.load_runs;
            stats["last_load_direct_runs"] = runs.load_direct_runs;
            stats["last_store_blocks"] = runs.store_blocks;
            stats["last_store_runs"] = runs.store_runs;
            stats["last_store_direct_runs"] = runs.store_direct_runs;
            return stats;
          },
          nb::sig("def extent_stats(self) -> dict[str, int]"),
          "The host pool's free slots and free runs now, the allocator's counts since "
          "construction (steps that placed stores, the runs they took, steps split over several "
          "runs, their blocks and those in runs of one slot) and the runs of consecutive host "
          "slots of the last step's loads and stores (engine/offload/SPEC.md §2, §7).")
      .def("register_kv_caches", &BoundEngine::register_kv_caches, nb::arg("layers"),
           "One array per layer, [2, num_device_blocks, block_size, num_kv_heads, head_dim] of "
           "raw words (uint16 for fp16/bf16, uint32 for fp32) or of the layout's dtype itself, "
           "writable, C-contiguous and on the engine's device; kept by reference, never copied.")
      .def(
          "lookup",
          [](BoundEngine& self, nb::typed<nb::iterable, int> hashes) {
            const std::vector<std::uint64_t> values = hashes_from(hashes);
            Release release;
            return self.engine.lookup(values);
          },
          nb::arg("hashes"), "The number of leading hashes that are committed; pure.")
      .def(
          "plan_load",
          [](BoundEngine& self, nb::typed<nb::iterable, int> hashes,
             nb::typed<nb::iterable, int> device_blocks) {
            const std::vector<std::uint64_t> hash_values = hashes_from(hashes);
            const std::vector<std::int64_t> block_values = device_blocks_from(device_blocks);
            Release release;
            self.engine.plan_load(hash_values, block_values);
          },
          nb::arg("hashes"), nb::arg("device_blocks"),
          "Plans loads of committed blocks into these device blocks in the next step.")
      .def(
          "plan_store",
          [](BoundEngine& self, nb::typed<nb::iterable, int> hashes,
             nb::typed<nb::iterable, int> device_blocks) {
            const std::vector<std::uint64_t> hash_values = hashes_from(hashes);
            const std::vector<std::int64_t> block_values = device_blocks_from(device_blocks);
            Release release;
            self.engine.plan_store(hash_values, block_values);
          },
          nb::arg("hashes"), nb::arg("device_blocks"),
          "Plans stores of these device blocks under these hashes in the next step.")
      .def(
          "plan_step",
          [](BoundEngine& self, nb::typed<nb::iterable, int> load_hashes,
             nb::typed<nb::iterable, int> load_device_blocks,
             nb::typed<nb::iterable, int> store_hashes,
             nb::typed<nb::iterable, int> store_device_blocks) {
            const std::vector<std::uint64_t> load_values = hashes_from(load_hashes, "load_hashes");
            const std::vector<std::int64_t> load_blocks =
                device_blocks_from(load_device_blocks, "load_device_blocks");
            const std::vector<std::uint64_t> store_values =
                hashes_from(store_hashes, "store_hashes");
            const std::vector<std::int64_t> store_blocks =
                device_blocks_from(store_device_blocks, "store_device_blocks");
            Release release;
            self.engine.plan_step(load_values, load_blocks, store_values, store_blocks);
          },
          nb::arg("load_hashes"), nb::arg("load_device_blocks"), nb::arg("store_hashes"),
          nb::arg("store_device_blocks"),
          "plan_load and plan_store in one call: both are checked whole before either is "
          "planned, so a refused call plans nothing.")
      .def(
          "build_step", [](BoundEngine& self) { self.engine.build_step(); },
          nb::call_guard<Release>(), "Freezes the plan: hits pin their blocks, misses are dropped.")
      .def(
          "start_load", [](BoundEngine& self) { self.engine.start_load(); },
          nb::call_guard<Release>(), "Issues layer 0 of the step's loads.")
      .def(
          "wait_for_layer_load",
          [](BoundEngine& self, const PyInteger& layer) {
            const std::int64_t checked = layer_argument(layer, self.engine.layout().num_layers());
            Release release;
            return self.engine.wait_for_layer_load(checked);
          },
          nb::arg("layer"),
          "Issues layer + 1, completes this layer; the device blocks whose data did not arrive.")
      .def(
          "save_kv_layer",
          [](BoundEngine& self, const PyInteger& layer, const PyInteger& stream) {
            const std::int64_t checked = layer_argument(layer, self.engine.layout().num_layers());
            const auto handle = integer_argument<EngineInputError, std::uintptr_t>(
                stream, "stream", 0, std::numeric_limits<std::uintptr_t>::max(),
                "a cudaStream_t handle, an integer 0 <= stream < 2**64");
            Release release;
            self.engine.save_kv_layer(checked, reinterpret_cast<void*>(handle));
          },
          nb::arg("layer"), nb::arg("stream") = 0,
          "Issues this layer's stores (allocating slots at layer 0), completes the previous one. "
          "stream (device \"cuda\"): the cudaStream_t the forward ran the layer on, e.g. "
          "torch.cuda.current_stream().cuda_stream; the store waits for it (0: the default "
          "stream).")
      .def(
          "wait_for_save", [](BoundEngine& self) { self.engine.wait_for_save(); },
          nb::call_guard<Release>(),
          "Completes the last store; commits or drops the step's stores.")
      .def(
          "inject_fence_fault",
          [](BoundEngine& self, const std::string& direction, const PyInteger& layer) {
            const auto parsed = activekv::offload::parse_direction(direction);
            const std::int64_t checked = layer_argument(layer, self.engine.layout().num_layers());
            Release release;
            self.engine.inject_fence_fault(parsed, checked);
          },
          nb::arg("direction"), nb::arg("layer"),
          "Tests and traces only: the next lease of this direction (\"load\" | \"store\") and "
          "layer has a fence of unknown outcome.")
      .def(
          "events",
          [](BoundEngine& self) {
            const std::vector<activekv::offload::Event> events = taken_events(self.engine);
            const std::vector<nb::handle>& kinds = event_kind_strings();
            nb::list result;
            for (const auto& event : events) {
              result.append(nb::make_tuple(kinds[static_cast<std::size_t>(event.kind)],
                                           event.value));
            }
            return result;
          },
          nb::sig("def events(self) -> list[tuple[str, int]]"),
          "The (kind, value) events since the last call; the log is then empty.")
      .def(
          "event_arrays",
          [](BoundEngine& self) {
            const std::vector<activekv::offload::Event> events = taken_events(self.engine);
            // No Python object per event: a 2,048-block load step has 4,096 events, and
            // events()' tuples took ~0.6 ms of a 12 ms int8 step on the H100's host.
            const std::size_t count = events.size();
            NumpyArray kinds = owned_array(count, {count}, nb::dtype<std::uint8_t>());
            NumpyArray values =
                owned_array(count * sizeof(std::uint64_t), {count}, nb::dtype<std::uint64_t>());
            auto* kind_data = static_cast<std::uint8_t*>(kinds.data());
            auto* value_data = static_cast<std::uint64_t*>(values.data());
            for (std::size_t index = 0; index < count; ++index) {
              kind_data[index] = static_cast<std::uint8_t>(events[index].kind);
              value_data[index] = events[index].value;
            }
            return nb::make_tuple(kinds, values);
          },
          nb::sig("def event_arrays(self) -> tuple[NDArray[numpy.uint8], NDArray[numpy.uint64]]"),
          "events() as two arrays, one entry per event: the kinds (indices into EVENT_KINDS) and "
          "the values; the log is then empty. For callers that read thousands of events a step.");

  {
    // The kind names by index, as event_arrays() numbers them.
    nb::list names;
    for (const nb::handle name : event_kind_strings()) names.append(name);
    m.attr("EVENT_KINDS") = nb::tuple(names);
  }

  m.def(
      "cuda_checksum",
      [](nb::ndarray<const std::uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> words) {
        std::uint64_t sum = 0;
        activekv::bindings::throw_on_cuda_error(akv_cuda_checksum(words.data(), words.size(), &sum),
                                                "cuda_checksum");
        return sum;
      },
      nb::arg("words"), nb::call_guard<nb::gil_scoped_release>(),
      "Sums a 1-D uint32 host array with the wheel's own CUDA kernel on device 0.");
}
