// Turning another engine's step records into the replay engine's rows: the
// unit of their page-table rows, and request ids that are not numbers.
//
// Page-table units (what one entry of a recorded row is):
//   page   the built-in engine: pool page ids at its own page_size (a row
//          covers ceil(seq_len / page_size) pages);
//   token  sglang: req_to_token slots, one per token (a request's token at
//          position p lives in KV slot row[p]; with page_size P the pool's
//          page of that token is row[p] / P);
//   block  vLLM: block-table entries, one per block of `block` tokens (token
//          p lives in slot row[p / block] * block + p % block).
// The replay engine reads page ids at its page_size, so token and block rows
// are rewritten: page j of a row is slot(j * P) / P, and every slot of that
// page must follow on (slot(j * P + i) == page * P + i), as it does for a
// pool that hands out whole pages. A row that is not laid out in pages of P
// tokens is an InvalidArgument naming the step, request and position.
//
// Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/formats/capture_records.h"

namespace crashreplay::replay::internal {

struct PageUnit {
  enum class Kind { kPage, kToken, kBlock };
  Kind kind = Kind::kPage;
  int64_t block = 0;  // kBlock: tokens per block
};

// The unit a capture's rows are in: the toggle "<engine>.page_table_unit"
// ("page" | "token" | "block"; block size from "vllm.block_size", else
// "cache_config.block_size"), else the engine's convention (crashreplay:
// page, sglang: token, vllm: block). InvalidArgument for a block unit without
// a block size, or an unknown unit.
absl::StatusOr<PageUnit> PageUnitOf(const SessionManifest& manifest);
std::string PageUnitName(const PageUnit& unit);

// The replay's page ids for one recorded row covering positions
// [0, seq_len). `where` prefixes errors ("FILE: step 3 request 'r7'").
absl::StatusOr<std::vector<int32_t>> RowPages(const PageUnit& unit, std::span<const int64_t> entries, int64_t seq_len,
                                              int page_size, std::string_view where);

// A request id as the replay engine's int64: the number itself when the id
// is the decimal form of one (the built-in engine's ids), else a stable
// XXH3-64 of its bytes with the top bit cleared (sglang's UUIDs, vLLM's
// "cmpl-..."), so distinct ids stay distinct.
int64_t RequestIdNumber(std::string_view id);

// The recorded toggle `name`, or nullptr.
const Toggle* FindRecordedToggle(const SessionManifest& manifest, std::string_view name);

}  // namespace crashreplay::replay::internal
