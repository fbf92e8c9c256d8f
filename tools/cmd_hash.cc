// crashreplay hash CHECKPOINT_DIR --tp N [--json] [--verbose] [--moe-parallel expert] [--threads T]
//
// Per-rank weight-shard hashes of a safetensors checkpoint, sharded by the
// same rule the replay engine uses (formats/sharding.h). Hash definitions:
// docs/capture.md "Weight hashes". Hashes print in XXH128 canonical form,
// as `xxhsum -H2` prints them.
#include <sys/stat.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"
#include "commands_decl.h"
#include "crashreplay/capture/weight_hash.h"
#include "exit_codes.h"

namespace crashreplay::tools {

int RunHash(int argc, char** argv) {
  CLI::App app(
      "Print per-rank weight-shard hashes of a safetensors checkpoint: each tensor's XXH3-128 over the bytes\n"
      "of the rank's shard and a per-rank root over names and hashes (docs/capture.md).",
      "hash");
  std::string dir;
  int64_t tp = 1;
  bool json = false, verbose = false;
  std::string moe_parallel = "tensor";
  int threads = 0;
  app.add_option("CHECKPOINT_DIR", dir, "checkpoint directory (config.json + *.safetensors)")->required();
  app.add_option("--tp", tp, "tensor-parallel size")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  app.add_flag("--json", json, "print JSON: {\"ranks\": [{\"rank\", \"root\", \"tensors\"?}]}");
  app.add_flag("--verbose,-v", verbose, "also print every tensor's shard hash");
  app.add_option("--moe-parallel", moe_parallel, "how routed experts are split: tensor or expert")
      ->check(CLI::IsMember({"tensor", "expert"}));
  app.add_option("--threads", threads, "hashing threads (0: one per core, at most 16)");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;

  // config.json is read with a plain stream (capture/weight_hash.cc), which
  // would wait forever on a FIFO: refuse what is not a regular file first.
  // The shards themselves are opened by Checkpoint, which refuses them too.
  {
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return ReportError(
          absl::NotFoundError("checkpoint directory '" + dir + "' " +
                              (::stat(dir.c_str(), &st) == 0 ? "is not a directory" : "does not exist")));
    }
    const std::string config = dir + "/config.json";
    if (::stat(config.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return ReportError(absl::NotFoundError("'" + config + "' is not a regular file"));
    }
  }
  absl::StatusOr<ShardingModel> model = capture::ReadShardingModel(dir, moe_parallel == "expert");
  if (!model.ok()) return ReportError(model.status());
  absl::StatusOr<std::vector<WeightShardHashes>> ranks =
      capture::HashCheckpoint(dir, tp, *model, capture::HashOptions{threads});
  if (!ranks.ok()) return ReportError(ranks.status());

  if (json) {
    // nlohmann::json (a sorted map), not ordered_json: ordered_json finds a
    // key by linear search, so 100,000 tensors took minutes. Sorted keys give
    // the same order here: rank, root, tensors; tensor names sorted.
    nlohmann::json out;
    out["ranks"] = nlohmann::json::array();
    for (const WeightShardHashes& w : *ranks) {
      nlohmann::json r;
      r["rank"] = w.rank;
      r["root"] = w.root.Hex();
      if (verbose) {
        nlohmann::json t = nlohmann::json::object();
        for (const TensorHash& h : w.tensors) t[h.name] = h.hash.Hex();
        r["tensors"] = std::move(t);
      }
      out["ranks"].push_back(std::move(r));
    }
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return kExitOk;
  }
  for (const WeightShardHashes& w : *ranks) {
    uint64_t bytes = 0;
    for (const TensorHash& h : w.tensors) bytes += h.byte_size;
    std::printf("rank %u  root %s  (%zu tensors, %llu bytes)\n", w.rank, w.root.Hex().c_str(), w.tensors.size(),
                static_cast<unsigned long long>(bytes));
    if (verbose) {
      for (const TensorHash& h : w.tensors) {
        std::printf("  %s  %s  %llu\n", h.hash.Hex().c_str(), h.name.c_str(),
                    static_cast<unsigned long long>(h.byte_size));
      }
    }
  }
  return kExitOk;
}

}  // namespace crashreplay::tools
