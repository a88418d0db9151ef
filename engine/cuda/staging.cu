// The CUDA route's staging kernels. The per-element rules are codec_rules.h's (roundings
// float_bits.h's), the same code the CPU route runs, and every float operation is one explicitly
// rounded IEEE binary32 operation (the file is also compiled with -fmad=false), so both routes
// agree bit for bit (SPEC.md §5).
// Host code here must not use the C++ standard library: see probe.h.
#include "cuda/staging.h"

#include <cuda_runtime.h>

#include "common/sbom_facts.h"

#include "offload/codec_rules.h"
#include "offload/float_bits.h"

ACTIVEKV_SBOM_CUDA_FACTS();

// A named namespace, not an anonymous one: see probe.cu.
namespace activekv_cuda_staging {

namespace fb = activekv::offload::float_bits;
namespace rules = activekv::offload::codec_rules;

constexpr unsigned kThreads = 256;
constexpr unsigned kWarpsPerBlock = kThreads / 32;

__host__ __device__ __forceinline__ uint64_t word_bytes(int dtype) {
  return dtype == AKV_DTYPE_FP32 ? 4 : 2;
}

__host__ __device__ __forceinline__ uint64_t tensor_bytes(const akv_stage_args& a) {
  return uint64_t{a.groups} * a.head_dim * word_bytes(a.dtype);
}

// K (tensor 0) or V (tensor 1) of one device block: where its first row starts (the whole
// tensor when a.contiguous).
__device__ __forceinline__ uint8_t* device_tensor(const akv_stage_args& a, uint64_t block,
                                                  unsigned tensor) {
  return a.kv + block * a.block_stride + tensor * a.value_offset;
}

// Row g (token g / H, head g % H) of a device tensor: its head_dim words.
__device__ __forceinline__ uint8_t* device_row(const akv_stage_args& a, uint8_t* tensor,
                                               uint64_t g) {
  return tensor + (g / a.num_kv_heads) * a.token_stride + (g % a.num_kv_heads) * a.head_stride;
}

// ---- exact: the stored layer is K then V, the device's raw words as they are ----

// Each thread block walks transfers (x) and its share (y) of each one's units. Unit is the widest
// access every address, stride and size allows. Contiguous: K and V are runs of units; else
// unit i of a tensor is in row i / row_units (SPEC.md §1's strides).
template <typename Unit, bool Contiguous>
__global__ void stage_exact(akv_stage_args a, bool in) {
  const uint64_t units = tensor_bytes(a) / sizeof(Unit);
  const uint64_t row_units = a.head_dim * word_bytes(a.dtype) / sizeof(Unit);
  for (uint32_t t = blockIdx.x; t < a.count; t += gridDim.x) {
    const akv_transfer transfer = a.transfers[t];
    Unit* stored = reinterpret_cast<Unit*>(a.pool + transfer.slot_offset + a.layer_offset);
    uint8_t* keys = device_tensor(a, transfer.device_block, 0);
    uint8_t* values = device_tensor(a, transfer.device_block, 1);
    for (uint64_t i = uint64_t{blockIdx.y} * blockDim.x + threadIdx.x; i < 2 * units;
         i += uint64_t{gridDim.y} * blockDim.x) {
      uint8_t* tensor = i < units ? keys : values;
      const uint64_t unit = i < units ? i : i - units;
      Unit* device;
      if constexpr (Contiguous) {
        device = reinterpret_cast<Unit*>(tensor) + unit;
      } else {
        device = reinterpret_cast<Unit*>(device_row(a, tensor, unit / row_units)) +
                 unit % row_units;
      }
      if (in) {
        *device = stored[i];
      } else {
        stored[i] = *device;
      }
    }
  }
}

// Compressed modes, the bus-crossing half: whole stored layers between the slots and the
// region's device staging buffer (transfer t at scratch + t * layer_bytes).
template <typename Unit>
__global__ void move_stored(akv_stage_args a, bool in) {
  const uint64_t units = a.layer_bytes / sizeof(Unit);
  for (uint32_t t = blockIdx.x; t < a.count; t += gridDim.x) {
    Unit* stored = reinterpret_cast<Unit*>(a.pool + a.transfers[t].slot_offset + a.layer_offset);
    Unit* staged = reinterpret_cast<Unit*>(a.scratch + t * a.layer_bytes);
    for (uint64_t i = uint64_t{blockIdx.y} * blockDim.x + threadIdx.x; i < units;
         i += uint64_t{gridDim.y} * blockDim.x) {
      if (in) {
        staged[i] = stored[i];
      } else {
        stored[i] = staged[i];
      }
    }
  }
}

// ---- bulk: the bus crossing through the SM's bulk copy unit (cp.async.bulk, sm_90 and up) ----
//
// One thread per thread block moves pieces (at most a stage, bulk_piece bytes, each) source ->
// shared memory -> destination, bulk_stages pieces in flight. Few, large requests in flight per SM
// cross PCIe both ways at once far better than the plain kernels' 16-byte loads and stores, which
// flood the bus with small requests (measurements in cuda_route.cpp). Every address and size is
// a multiple of 16 bytes (launch_bus checks).

// One piece: contiguous bytes in the pool, and one range on the device, or two (exact mode's
// whole stored layer of a block: K then V, which are apart in the device KV).
struct Piece {
  uint8_t* host;
  uint8_t* device[2];
  uint32_t device_bytes[2];  // [1] is 0 for one range
};

// Exact mode moves a block's whole stored layer (K and V) as one piece when it fits in a stage.
__host__ __device__ __forceinline__ bool whole_layers(const akv_stage_args& a) {
  return a.mode == AKV_MODE_EXACT && 2 * tensor_bytes(a) <= a.bulk_piece;
}

// What of a transfer is cut into pieces: exact mode, the stored layer whole or K and V apart;
// compressed modes, the stored layer.
__host__ __device__ __forceinline__ unsigned segments_per_transfer(const akv_stage_args& a) {
  return a.mode == AKV_MODE_EXACT && !whole_layers(a) ? 2 : 1;
}

__host__ __device__ __forceinline__ uint64_t segment_bytes(const akv_stage_args& a) {
  if (a.mode != AKV_MODE_EXACT) return a.layer_bytes;
  return whole_layers(a) ? 2 * tensor_bytes(a) : tensor_bytes(a);
}

__host__ __device__ __forceinline__ uint64_t pieces_per_segment(const akv_stage_args& a) {
  return (segment_bytes(a) + a.bulk_piece - 1) / a.bulk_piece;
}

__host__ __device__ __forceinline__ uint64_t pieces_per_transfer(const akv_stage_args& a) {
  return segments_per_transfer(a) * pieces_per_segment(a);
}

// Piece `i` of the launch (pieces_per_transfer per transfer, in transfer order).
__device__ __forceinline__ Piece piece_of(const akv_stage_args& a, uint64_t i) {
  const uint64_t per_transfer = pieces_per_transfer(a);
  const uint64_t pieces = pieces_per_segment(a);
  const akv_transfer transfer = a.transfers[i / per_transfer];
  const uint64_t within = i % per_transfer;
  const unsigned segment = static_cast<unsigned>(within / pieces);
  const uint64_t offset = (within % pieces) * a.bulk_piece;
  const uint64_t left = segment_bytes(a) - offset;
  const auto bytes = static_cast<uint32_t>(left < a.bulk_piece ? left : a.bulk_piece);
  uint8_t* stored = a.pool + transfer.slot_offset + a.layer_offset;
  if (a.mode != AKV_MODE_EXACT) {
    return {stored + offset, {a.scratch + (i / per_transfer) * a.layer_bytes + offset, nullptr},
            {bytes, 0}};
  }
  const auto tensor = static_cast<uint32_t>(tensor_bytes(a));
  if (whole_layers(a)) {
    return {stored,
            {device_tensor(a, transfer.device_block, 0), device_tensor(a, transfer.device_block, 1)},
            {tensor, tensor}};
  }
  return {stored + segment * tensor + offset,
          {device_tensor(a, transfer.device_block, segment) + offset, nullptr},
          {bytes, 0}};
}

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// Global -> shared memory, completing `bytes` on the mbarrier.
__device__ __forceinline__ void bulk_read(uint32_t shared, const uint8_t* global, uint32_t bytes,
                                          uint32_t barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(shared),
      "l"(global), "r"(bytes), "r"(barrier)
      : "memory");
#endif
}

// Shared -> global memory, in the thread's current bulk group.
__device__ __forceinline__ void bulk_write(uint8_t* global, uint32_t shared, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(global),
               "r"(shared), "r"(bytes)
               : "memory");
#endif
}

constexpr unsigned kMaxStages = 8;

__global__ void stage_bulk(akv_stage_args a, bool in) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint8_t staged[];
  __shared__ __align__(8) uint64_t arrived[kMaxStages];
  if (threadIdx.x != 0) return;
  const unsigned stages = a.bulk_stages;
  for (unsigned s = 0; s < stages; ++s) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&arrived[s])));
  }
  // The barriers are then used by the bulk copy unit (the async proxy).
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  const uint64_t pieces = uint64_t{a.count} * pieces_per_transfer(a);
  uint32_t phases = 0;  // bit s: the parity stage s waits for next
  for (uint64_t first = blockIdx.x; first < pieces; first += uint64_t{gridDim.x} * stages) {
    unsigned issued = 0;
    for (; issued < stages; ++issued) {
      const uint64_t i = first + uint64_t{issued} * gridDim.x;
      if (i >= pieces) break;
      const Piece p = piece_of(a, i);
      const uint32_t shared = shared_address(staged + uint64_t{issued} * a.bulk_piece);
      const uint32_t barrier = shared_address(&arrived[issued]);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier),
                   "r"(p.device_bytes[0] + p.device_bytes[1])
                   : "memory");
      if (in) {
        bulk_read(shared, p.host, p.device_bytes[0] + p.device_bytes[1], barrier);
      } else {
        bulk_read(shared, p.device[0], p.device_bytes[0], barrier);
        if (p.device_bytes[1] != 0) {
          bulk_read(shared + p.device_bytes[0], p.device[1], p.device_bytes[1], barrier);
        }
      }
    }
    for (unsigned s = 0; s < issued; ++s) {
      const Piece p = piece_of(a, first + uint64_t{s} * gridDim.x);
      const uint32_t shared = shared_address(staged + uint64_t{s} * a.bulk_piece);
      asm volatile(
          "{\n .reg .pred done;\n wait%=:\n"
          " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n @!done bra wait%=;\n}" ::
              "r"(shared_address(&arrived[s])),
          "r"((phases >> s) & 1u)
          : "memory");
      phases ^= 1u << s;
      if (in) {
        bulk_write(p.device[0], shared, p.device_bytes[0]);
        if (p.device_bytes[1] != 0) {
          bulk_write(p.device[1], shared + p.device_bytes[0], p.device_bytes[1]);
        }
      } else {
        bulk_write(p.host, shared, p.device_bytes[0] + p.device_bytes[1]);
      }
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    // The stages' shared memory is read out before the next round overwrites it.
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
  // The writes are complete (visible) before the kernel ends, so its stream's events fence them.
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#else
  __trap();  // the route launches it on sm_90 and up only; elsewhere a failed fence, not silence
#endif
}

// ---- compressed: codes K, codes V, scales K, scales V (SPEC.md §5) ----

__device__ __forceinline__ uint32_t load_f32_bits(int dtype, const uint8_t* words, uint64_t i) {
  if (dtype == AKV_DTYPE_FP32) return reinterpret_cast<const uint32_t*>(words)[i];
  const uint16_t word = reinterpret_cast<const uint16_t*>(words)[i];
  return dtype == AKV_DTYPE_FP16 ? fb::fp16_to_f32_bits(word) : fb::bf16_to_f32_bits(word);
}

// The dtype's word for `value` (in the low 16 bits for fp16 and bf16).
__device__ __forceinline__ uint32_t narrowed_word(int dtype, float value) {
  return dtype == AKV_DTYPE_FP32 ? rules::narrow_to_fp32(value)
                                 : rules::narrow_to_16(value, dtype == AKV_DTYPE_BF16);
}

__device__ __forceinline__ void store_narrowed(int dtype, float value, uint8_t* words, uint64_t i) {
  const uint32_t word = narrowed_word(dtype, value);
  if (dtype == AKV_DTYPE_FP32) {
    reinterpret_cast<uint32_t*>(words)[i] = word;
  } else {
    reinterpret_cast<uint16_t*>(words)[i] = static_cast<uint16_t>(word);
  }
}

// Four consecutive elements from element i (a multiple of 4): one 8-byte (16-bit words) or
// 16-byte (fp32) access.
__device__ __forceinline__ void load_f32_bits4(int dtype, const uint8_t* words, uint64_t i,
                                               uint32_t (&bits)[4]) {
  if (dtype == AKV_DTYPE_FP32) {
    const uint4 w = *reinterpret_cast<const uint4*>(words + i * 4);
    bits[0] = w.x;
    bits[1] = w.y;
    bits[2] = w.z;
    bits[3] = w.w;
    return;
  }
  const uint2 w = *reinterpret_cast<const uint2*>(words + i * 2);
  const uint16_t half[4] = {static_cast<uint16_t>(w.x), static_cast<uint16_t>(w.x >> 16),
                            static_cast<uint16_t>(w.y), static_cast<uint16_t>(w.y >> 16)};
  for (int k = 0; k < 4; ++k) {
    bits[k] = dtype == AKV_DTYPE_FP16 ? fb::fp16_to_f32_bits(half[k]) : fb::bf16_to_f32_bits(half[k]);
  }
}

__device__ __forceinline__ void store_narrowed4(int dtype, const float (&values)[4], uint8_t* words,
                                                uint64_t i) {
  uint32_t w[4];
  for (int k = 0; k < 4; ++k) w[k] = narrowed_word(dtype, values[k]);
  if (dtype == AKV_DTYPE_FP32) {
    *reinterpret_cast<uint4*>(words + i * 4) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    *reinterpret_cast<uint2*>(words + i * 2) = make_uint2(w[0] | w[1] << 16, w[2] | w[3] << 16);
  }
}

// Scales are read and written byte-wise: their offset inside a slot need not be 4-aligned.
__device__ __forceinline__ float load_scale(const uint8_t* at) {
  const uint32_t bits = uint32_t{at[0]} | uint32_t{at[1]} << 8 | uint32_t{at[2]} << 16 |
                        uint32_t{at[3]} << 24;
  return fb::bits_to_float(bits);
}

__device__ __forceinline__ void store_scale(uint8_t* at, float scale) {
  const uint32_t bits = fb::float_to_bits(scale);
  for (int byte = 0; byte < 4; ++byte) at[byte] = static_cast<uint8_t>(bits >> (8 * byte));
}

struct Group {
  uint8_t* codes;
  uint8_t* scale;
  uint8_t* words;  // the group's first element in the device tensor
};

// Warp `warp` of the grid's y dimension handles group (tensor, g) of transfer blockIdx.x, whose
// stored layer is in the region's device staging buffer.
__device__ __forceinline__ bool locate_group(const akv_stage_args& a, Group& group) {
  const uint64_t warp = uint64_t{blockIdx.y} * kWarpsPerBlock + threadIdx.x / 32;
  if (warp >= 2ull * a.groups) return false;
  const unsigned tensor = static_cast<unsigned>(warp / a.groups);
  const uint64_t g = warp % a.groups;
  const akv_transfer t = a.transfers[blockIdx.x];
  uint8_t* stored = a.scratch + uint64_t{blockIdx.x} * a.layer_bytes;
  const uint64_t elements = uint64_t{a.groups} * a.head_dim;
  group.codes = stored + tensor * elements + g * a.head_dim;
  group.scale = stored + 2 * elements + (tensor * uint64_t{a.groups} + g) * sizeof(float);
  group.words = device_row(a, device_tensor(a, t.device_block, tensor), g);
  return true;
}

// amax over the finite elements (0 if none) of the warp's group: max is exact, so the lanes'
// order cannot matter. Every lane of the warp must call it (`active` false adds nothing).
__device__ __forceinline__ float warp_amax(float amax) {
  for (int offset = 16; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  }
  return amax;
}

// Width consecutive elements of a group per lane per step. Width 1: any head_dim, any
// alignment. Width 4 (head_dim % 4 == 0, aligned words; see vector_codec): one 32-bit access to
// the codes and one wide access to the words. The arithmetic is the same element by element, so
// the codes and words are the same at either width.
template <unsigned Width>
__device__ __forceinline__ void load_bits(int dtype, const uint8_t* words, uint64_t i,
                                          uint32_t (&bits)[Width]) {
  if constexpr (Width == 4) {
    load_f32_bits4(dtype, words, i, bits);
  } else {
    bits[0] = load_f32_bits(dtype, words, i);
  }
}

template <unsigned Width>
__device__ __forceinline__ void store_words(int dtype, const float (&values)[Width],
                                            uint8_t* words, uint64_t i) {
  if constexpr (Width == 4) {
    store_narrowed4(dtype, values, words, i);
  } else {
    store_narrowed(dtype, values[0], words, i);
  }
}

// The Width codes from code i, packed little-endian.
template <unsigned Width>
__device__ __forceinline__ uint32_t load_codes(const uint8_t* codes, unsigned i) {
  if constexpr (Width == 4) return *reinterpret_cast<const uint32_t*>(codes + i);
  return codes[i];
}

template <unsigned Width>
__device__ __forceinline__ void store_codes(uint8_t* codes, unsigned i, uint32_t packed) {
  if constexpr (Width == 4) {
    *reinterpret_cast<uint32_t*>(codes + i) = packed;
  } else {
    codes[i] = static_cast<uint8_t>(packed);
  }
}

template <unsigned Width>
__global__ void decode_groups(akv_stage_args a) {
  Group group;
  if (!locate_group(a, group)) return;
  const bool int8 = a.mode == AKV_MODE_INT8;
  const float scale = load_scale(group.scale);
  for (unsigned i = (threadIdx.x % 32) * Width; i < a.head_dim; i += 32 * Width) {
    const uint32_t codes = load_codes<Width>(group.codes, i);
    float values[Width];
    for (unsigned k = 0; k < Width; ++k) {
      values[k] = rules::decode_element(int8, static_cast<uint8_t>(codes >> (8 * k)), scale);
    }
    store_words<Width>(a.dtype, values, group.words, i);
  }
}

template <unsigned Width>
__global__ void encode_groups(akv_stage_args a) {
  Group group;
  const bool active = locate_group(a, group);
  float amax = 0.0f;
  uint32_t bits[Width];
  if (active) {
    for (unsigned i = (threadIdx.x % 32) * Width; i < a.head_dim; i += 32 * Width) {
      load_bits<Width>(a.dtype, group.words, i, bits);
      for (unsigned k = 0; k < Width; ++k) amax = fmaxf(amax, rules::finite_magnitude(bits[k]));
    }
  }
  amax = warp_amax(amax);
  if (!active) return;
  const bool int8 = a.mode == AKV_MODE_INT8;
  const float scale = rules::group_scale(int8, amax);
  if (threadIdx.x % 32 == 0) store_scale(group.scale, scale);
  for (unsigned i = (threadIdx.x % 32) * Width; i < a.head_dim; i += 32 * Width) {
    load_bits<Width>(a.dtype, group.words, i, bits);
    uint32_t codes = 0;
    for (unsigned k = 0; k < Width; ++k) {
      codes |= uint32_t{rules::encode_element(int8, bits[k], scale)} << (8 * k);
    }
    store_codes<Width>(group.codes, i, codes);
  }
}

// The widest unit (16, 8, 4 or 2 bytes) that divides every address and size in `mix`.
unsigned widest_unit(uint64_t mix) {
  for (unsigned unit = 16; unit > 2; unit /= 2) {
    if (mix % unit == 0) return unit;
  }
  return 2;
}

// x: transfers, at most max_blocks; y: each transfer's share, so that few large transfers still
// spread over max_blocks thread blocks.
dim3 bus_grid(const akv_stage_args& a, uint64_t units) {
  const uint32_t x = a.count < a.max_blocks ? a.count : a.max_blocks;
  uint64_t y = (units + kThreads - 1) / kThreads;
  const uint64_t share = a.max_blocks / x;
  if (y > share) y = share;
  return dim3(x, static_cast<unsigned>(y > 0 ? y : 1));
}

template <typename Unit>
struct ExactKernel {
  static void launch(dim3 grid, cudaStream_t stream, const akv_stage_args& a, bool in) {
    if (a.contiguous) {
      stage_exact<Unit, true><<<grid, kThreads, 0, stream>>>(a, in);
    } else {
      stage_exact<Unit, false><<<grid, kThreads, 0, stream>>>(a, in);
    }
  }
};

template <typename Unit>
struct MoveKernel {
  static void launch(dim3 grid, cudaStream_t stream, const akv_stage_args& a, bool in) {
    move_stored<Unit><<<grid, kThreads, 0, stream>>>(a, in);
  }
};

template <template <typename> class Kernel>
void launch_units(unsigned unit, dim3 grid, cudaStream_t stream, const akv_stage_args& a,
                  bool in) {
  switch (unit) {
    case 16:
      Kernel<uint4>::launch(grid, stream, a, in);
      break;
    case 8:
      Kernel<uint2>::launch(grid, stream, a, in);
      break;
    case 4:
      Kernel<uint32_t>::launch(grid, stream, a, in);
      break;
    default:
      Kernel<uint16_t>::launch(grid, stream, a, in);
      break;
  }
}

// Shared memory above this needs the kernel's limit raised first.
constexpr uint64_t kDefaultSharedBytes = 48 * 1024;

int launch_bulk(const akv_stage_args& a, cudaStream_t stream, bool in) {
  const uint64_t shared = uint64_t{a.bulk_piece} * a.bulk_stages;
  if (shared > kDefaultSharedBytes) {
    const cudaError_t raised = cudaFuncSetAttribute(
        stage_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (raised != cudaSuccess) return static_cast<int>(raised);
  }
  // As many thread blocks as pieces, up to bulk_blocks: few large blocks still spread out.
  const uint64_t pieces = uint64_t{a.count} * pieces_per_transfer(a);
  const auto blocks = static_cast<unsigned>(pieces < a.bulk_blocks ? pieces : a.bulk_blocks);
  stage_bulk<<<blocks, 32, shared, stream>>>(a, in);
  return static_cast<int>(cudaGetLastError());
}

int launch_bus(const akv_stage_args& a, cudaStream_t stream, bool in) {
  if (a.count == 0) return static_cast<int>(cudaSuccess);
  const uint64_t bases = reinterpret_cast<uint64_t>(a.pool) | a.layer_offset;
  const bool exact = a.mode == AKV_MODE_EXACT;
  const uint64_t device = reinterpret_cast<uint64_t>(exact ? a.kv : a.scratch);
  // Slot offsets (and the layer's plane) are multiples of the stored layer's bytes (2 * tensor
  // bytes in exact mode); device blocks are multiples of the tensor bytes.
  const uint64_t sizes = exact ? tensor_bytes(a) : a.layer_bytes;
  // The bulk pieces are runs of whole tensors: only where the device tensors are contiguous.
  const uint64_t tensors = exact ? a.block_stride | a.value_offset : 0;
  if (a.bulk_piece != 0 && a.bulk_stages <= kMaxStages && (!exact || a.contiguous) &&
      widest_unit(bases | device | sizes | a.bulk_piece | tensors) == 16) {
    return launch_bulk(a, stream, in);
  }
  if (exact) {
    const uint64_t tensor = tensor_bytes(a);
    const uint64_t row = a.head_dim * word_bytes(a.dtype);
    const uint64_t placement = a.block_stride | a.value_offset |
                               (a.contiguous ? 0 : row | a.token_stride | a.head_stride);
    const unsigned unit =
        widest_unit(bases | reinterpret_cast<uint64_t>(a.kv) | tensor | placement);
    launch_units<ExactKernel>(unit, bus_grid(a, 2 * tensor / unit), stream, a, in);
  } else {
    const unsigned unit =
        widest_unit(bases | reinterpret_cast<uint64_t>(a.scratch) | a.layer_bytes);
    launch_units<MoveKernel>(unit, bus_grid(a, a.layer_bytes / unit), stream, a, in);
  }
  return static_cast<int>(cudaGetLastError());
}

// Exact mode's staging buffer <-> device KV: the plain exact kernels with the staging buffer in
// the pool's place (its offsets are the entries' slot_offset, multiples of the stored layer's
// bytes, so the unit launch_bus picks holds for them too). Device memory on both sides: the bulk
// copy kernel's shared-memory detour buys nothing here.
int launch_scatter(const akv_stage_args& a, cudaStream_t stream, bool in) {
  if (a.count == 0 || a.mode != AKV_MODE_EXACT) return static_cast<int>(cudaSuccess);
  akv_stage_args staged = a;
  staged.pool = a.scratch;
  staged.layer_offset = 0;
  staged.bulk_piece = 0;
  return launch_bus(staged, stream, in);
}

// Whether every group's codes and words allow the four-wide kernels: head_dim a multiple of 4
// (so codes, scales' region and each group's words start 4-aligned inside the layer), and the
// device KV and staging buffer aligned for the widest access.
bool vector_codec(const akv_stage_args& a) {
  const uint64_t words = 4 * word_bytes(a.dtype);
  const uint64_t rows = a.block_stride | a.token_stride | a.head_stride | a.value_offset;
  return a.head_dim % 4 == 0 && (reinterpret_cast<uint64_t>(a.kv) | rows) % words == 0 &&
         reinterpret_cast<uint64_t>(a.scratch) % 4 == 0 && a.layer_bytes % 4 == 0;
}

int launch_codec(const akv_stage_args& a, cudaStream_t stream, bool in) {
  if (a.count == 0 || a.mode == AKV_MODE_EXACT) return static_cast<int>(cudaSuccess);
  const dim3 grid(a.count, (2 * a.groups + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const bool wide = vector_codec(a);
  if (in) {
    if (wide) {
      decode_groups<4><<<grid, kThreads, 0, stream>>>(a);
    } else {
      decode_groups<1><<<grid, kThreads, 0, stream>>>(a);
    }
  } else if (wide) {
    encode_groups<4><<<grid, kThreads, 0, stream>>>(a);
  } else {
    encode_groups<1><<<grid, kThreads, 0, stream>>>(a);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace activekv_cuda_staging

extern "C" int akv_stage_bus(const akv_stage_args* args, int in, void* stream) {
  return activekv_cuda_staging::launch_bus(*args, static_cast<cudaStream_t>(stream), in != 0);
}

extern "C" int akv_stage_codec(const akv_stage_args* args, int in, void* stream) {
  return activekv_cuda_staging::launch_codec(*args, static_cast<cudaStream_t>(stream), in != 0);
}

extern "C" int akv_stage_scatter(const akv_stage_args* args, int in, void* stream) {
  return activekv_cuda_staging::launch_scatter(*args, static_cast<cudaStream_t>(stream), in != 0);
}
