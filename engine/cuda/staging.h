// C interface of the CUDA route's staging kernels (engine/offload/SPEC.md §4, §5). The kernels
// read and write the pinned host pool in place through its mapped device address (zero copy), so
// one launch moves one layer of every block of a lease, however scattered the slots are.
// No C++ standard library here or in the .cu host code: see probe.h.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// One block of a lease: where its slot starts in the layer's plane of the pool (slot * stored
// layer bytes), and its device block index.
typedef struct akv_transfer {
  uint64_t slot_offset;
  uint64_t device_block;
} akv_transfer;

// Values of akv_stage_args.mode and .dtype (the engine's CompressionMode and KvDtype).
enum { AKV_MODE_EXACT = 0, AKV_MODE_INT8 = 1, AKV_MODE_FP8_E4M3 = 2 };
enum { AKV_DTYPE_FP16 = 0, AKV_DTYPE_BF16 = 1, AKV_DTYPE_FP32 = 2 };

typedef struct akv_stage_args {
  const akv_transfer* transfers;  // in device memory
  uint32_t count;                 // transfers
  uint8_t* pool;                  // device address of the mapped host pool
  uint64_t layer_offset;          // the layer's plane in the pool (layer * slots * layer bytes)
  // The layer's device KV (SPEC.md §1): K of (block b, token n, head h) is D words at
  // kv + b * block_stride + n * token_stride + h * head_stride, its V value_offset bytes further.
  uint8_t* kv;
  uint64_t block_stride;
  uint64_t token_stride;
  uint64_t head_stride;
  uint64_t value_offset;
  uint32_t num_kv_heads;          // H
  uint32_t contiguous;            // 1: each block's K (and V) is one run of T * H * D words
  uint32_t groups;                // T * H: one scale per group, K and V each
  uint32_t head_dim;              // D: elements per group
  int mode;
  int dtype;
  // Compressed modes: the region's device staging buffer (count * stored layer bytes). The
  // stored bytes cross PCIe as one wide bulk copy into it (or out of it), and the codes are
  // decoded (encoded) in device memory, so the narrow per-group accesses never touch the bus.
  // Exact mode crossing by runs: the same buffer, which akv_stage_scatter reads or writes.
  uint8_t* scratch;
  uint64_t layer_bytes;  // stored bytes of one layer of one block
  // Upper bound on the thread blocks of a bus-crossing launch, so that a load and a store
  // launched on two streams run side by side instead of one after the other.
  uint32_t max_blocks;
  // The bus crossing through the bulk copy unit (sm_90 and up; bulk_piece 0: the plain kernels,
  // also used where an address or size is not a multiple of 16 bytes): pieces of at most
  // bulk_piece bytes, bulk_stages of them in flight per thread block, bulk_blocks thread blocks.
  uint32_t bulk_piece;
  uint32_t bulk_stages;
  uint32_t bulk_blocks;
} akv_stage_args;

// The bulk copy plan the CUDA route uses on sm_90 and up, one thread block per SM (measured on an
// H200: engine/offload/cuda_route.cpp).
enum { AKV_BULK_PIECE = 16384, AKV_BULK_STAGES = 2 };

// The bus-crossing half of one lease's layer, enqueued on `stream`: in (in != 0) slots -> device
// KV (exact) or -> the staging buffer (compressed), out the reverse. Returns the cudaError_t of
// the launch (0 is success).
int akv_stage_bus(const akv_stage_args* args, int in, void* stream);
// Exact mode, the device half of a crossing by runs (SPEC.md §4, "The CUDA route"): the layer's
// K then V of transfer t sit in the region's staging buffer at scratch + transfers[t].slot_offset
// (a staging offset here, not a slot's), and move into the device KV (in: a scatter after the
// runs were copied in) or out of it (a gather before they are copied out), on `stream`. Returns
// the launch's cudaError_t.
int akv_stage_scatter(const akv_stage_args* args, int in, void* stream);
// Compressed modes, the device half: decode the staging buffer into the device KV (in), or encode
// the device KV into it (out). Nothing for exact mode. On its own stream, the codec of one layer
// overlaps the bus transfer of the next.
int akv_stage_codec(const akv_stage_args* args, int in, void* stream);

#ifdef __cplusplus
}
#endif
