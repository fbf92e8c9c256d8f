// The state one step needs to run without its history: what the built-in
// engine snapshots before every step (`run --record --snapshots N`) and what
// replay restores to run step N alone (docs/replay.md "Starting from a
// snapshot").
//
// Besides its own inputs, which are in the step log (tokens, positions,
// page-table rows, sampling parameters; the RNG draw depends only on the
// request's seed, id and token count), a step reads only the paged KV cache:
// for each row, the K and V of positions [0, start_pos) of every layer and
// rank, held in pool pages page_table[0 .. ceil(start_pos / page_size)).
// The K/V of the step's own tokens are written by kv_write before attention
// reads them, and nothing else carries over from one step to the next, so
// those pages' bytes are the whole state. A prefill (start_pos 0 for every
// row) needs none.
//
// As snapshot tensors (the names and layout are the format):
//   "state.rows"  I64 [rows, 2]: request id and start_pos of each row, to
//                 check that a snapshot belongs to the step's batch;
//   "kv.pages"    I32 [n]: the pool pages, ascending;
//   "kv.<pool>"   one tensor per pool of the cache (KvCache::pools()),
//                 [planes, n, <page shape>] in the pool's dtype, plane-major
//                 then page order:
//     kv.k, kv.v      GQA: BF16 or F8_E4M3 [layers * tp, n, page_size,
//                     kv_heads_per_rank, head_dim], plane l * tp + r;
//     kv.latent       MLA: BF16 [layers * tp, n, page_size, kv_lora + rope],
//                     or U8 [layers * tp, n, page_size, token_bytes] for the
//                     fp8 latent layout (kernels/mla.h);
//     kv.index_k      DSA: BF16 [indexer layers * tp, n, page_size,
//                     index_head_dim] or U8 [.., n, page_bytes] (fp8);
//                     planes of the layers that run their own indexer only;
// A pool whose planes are replicas (KvCache::Pool::replicas: the latent
// and the index keys, which every rank holds whole) is stored with one plane
// per group, [planes / tp, n, ...] (rank 0's, plane l), when every rank's
// bytes agree, as they do unless the engine diverged between ranks: tp
// times smaller. RestoreState takes either form.
// The kv.* tensors are left out when n == 0. Captures from before MLA hold
// kv.k and kv.v, which are the GQA cache's pools: they read as before.
//
// Thread-compatible value types and pure functions over a KvCache.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "crashreplay/formats/dtype.h"
#include "crashreplay/replay/program/step.h"

namespace crashreplay::replay {

// One pool's pages ("k", "v", "latent", "index_k"): tensor kv.<name>.
struct StatePool {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;  // [planes, n, page shape...]
  std::vector<uint8_t> bytes;
};

struct StepState {
  int64_t step = -1;
  std::vector<int64_t> rows;  // request id, start_pos; per row
  std::vector<int32_t> pages;
  std::vector<StatePool> pools;  // empty when pages is
};

// The pages whose contents `in` reads and does not write, ascending.
std::vector<int32_t> StatePages(const StepInput& in, int page_size);

// The state of `in` as `kv` holds it now (before the step runs).
absl::StatusOr<StepState> CaptureState(const StepInput& in, const KvCache& kv);

// Checks that `state` is the state of `in` for a cache shaped like `kv`
// (rows, pages, dtype, shape, byte sizes; InvalidArgument naming the step and
// what differs), then writes its pages into `kv`.
absl::Status RestoreState(const StepState& state, const StepInput& in, KvCache* kv);

}  // namespace crashreplay::replay
