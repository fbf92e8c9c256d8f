#include "crashreplay/capture/weight_hash.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "crashreplay/base/status.h"
#include "crashreplay/formats/checkpoint.h"

namespace crashreplay::capture {
namespace {

int ThreadCount(const HashOptions& options, size_t jobs) {
  int n = options.threads > 0 ? options.threads
                              : std::min<int>(16, std::max<unsigned>(1, std::thread::hardware_concurrency()));
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(n), jobs)));
}

// Runs fn(i) for i in [0, n) on `threads` threads. Each index is handled by
// exactly one thread and writes only its own result slot, so the results do
// not depend on the thread count.
template <typename Fn>
void ParallelFor(size_t n, int threads, Fn fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

void AppendLE64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

Hash128 HashBlock(std::span<const std::byte> bytes, const ShardBlock& b) {
  const uint64_t width = b.col_byte_end - b.col_byte_begin;
  if (width == b.row_bytes) {  // whole rows: one contiguous range
    return XXH128Of(bytes.data() + static_cast<uint64_t>(b.row_begin) * b.row_bytes,
                    static_cast<uint64_t>(b.row_end - b.row_begin) * b.row_bytes);
  }
  Hasher128 h;
  for (int64_t r = b.row_begin; r < b.row_end; ++r) {
    h.Update(bytes.data() + static_cast<uint64_t>(r) * b.row_bytes + b.col_byte_begin, width);
  }
  return h.Digest();
}

}  // namespace

Hash128 WeightRoot(std::vector<TensorHash>* tensors) {
  std::sort(tensors->begin(), tensors->end(), [](const TensorHash& a, const TensorHash& b) { return a.name < b.name; });
  std::string buf;
  for (const TensorHash& t : *tensors) {
    AppendLE64(&buf, t.name.size());
    buf += t.name;
    AppendLE64(&buf, t.hash.high);
    AppendLE64(&buf, t.hash.low);
    AppendLE64(&buf, t.byte_size);
  }
  return XXH128Of(buf.data(), buf.size());
}

absl::StatusOr<WeightShardHashes> HashTensors(uint32_t rank, std::span<const TensorView> tensors,
                                              const HashOptions& options) {
  WeightShardHashes out;
  out.rank = rank;
  out.tensors.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].data == nullptr && tensors[i].byte_size > 0) {
      return absl::InvalidArgumentError(absl::StrCat("weight '", std::string(tensors[i].name), "' has no data"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (tensors[j].name == tensors[i].name) {
        return absl::InvalidArgumentError(absl::StrCat("weight '", std::string(tensors[i].name), "' is listed twice"));
      }
    }
  }
  ParallelFor(tensors.size(), ThreadCount(options, tensors.size()), [&](size_t i) {
    out.tensors[i].name = std::string(tensors[i].name);
    out.tensors[i].byte_size = tensors[i].byte_size;
    out.tensors[i].hash = XXH128Of(tensors[i].data, tensors[i].byte_size);
  });
  out.root = WeightRoot(&out.tensors);
  return out;
}

absl::StatusOr<ShardingModel> ReadShardingModel(const std::string& checkpoint_dir, bool expert_parallel) {
  ShardingModel m;
  m.expert_parallel = expert_parallel;
  const std::string path = checkpoint_dir + "/config.json";
  std::ifstream in(path);
  if (!in) return m;
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat(path, " is not a JSON object; fix or remove it"));
  }
  auto get_int = [&](const char* key) -> int64_t {
    auto it = j.find(key);
    return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
  };
  m.num_kv_heads = get_int("num_key_value_heads");
  if (m.num_kv_heads == 0) m.num_kv_heads = get_int("num_attention_heads");
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    if (m.num_experts == 0) m.num_experts = get_int(key);
  }
  return m;
}

absl::StatusOr<std::vector<WeightShardHashes>> HashCheckpoint(const std::string& checkpoint_dir, int64_t tp_size,
                                                              const ShardingModel& model, const HashOptions& options) {
  if (tp_size < 1) return absl::InvalidArgumentError(absl::StrCat("--tp must be at least 1, got ", tp_size));
  if (model.expert_parallel && model.num_experts > 0 && model.num_experts % tp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(model.num_experts, " experts do not divide over ", tp_size, " ranks for expert parallelism"));
  }
  CR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(checkpoint_dir));
  struct Job {
    uint32_t rank;
    const std::string* name;
    ShardBlock block;
    std::span<const std::byte> bytes;
    Hash128 hash;
  };
  std::vector<Job> jobs;
  for (int64_t r = 0; r < tp_size; ++r) {
    for (const std::string& name : ckpt->names()) {
      const CheckpointTensor* t = ckpt->Find(name);
      const ShardSpec spec = ShardingRuleFor(name, t->info->shape, tp_size, r, model);
      if (spec.kind == ShardKind::kOwned && spec.owner != r) continue;
      CR_ASSIGN_OR_RETURN(ShardBlock block, ShardBlockFor(name, spec, t->info->shape, t->info->byte_size));
      if (spec.kind == ShardKind::kOwned) block.held = true;
      jobs.push_back(Job{static_cast<uint32_t>(r), &name, block, t->file->Data(*t->info), {}});
    }
  }
  ParallelFor(jobs.size(), ThreadCount(options, jobs.size()),
              [&](size_t i) { jobs[i].hash = HashBlock(jobs[i].bytes, jobs[i].block); });
  std::vector<WeightShardHashes> out(static_cast<size_t>(tp_size));
  for (int64_t r = 0; r < tp_size; ++r) out[r].rank = static_cast<uint32_t>(r);
  for (const Job& j : jobs) out[j.rank].tensors.push_back(TensorHash{*j.name, j.hash, j.block.bytes()});
  for (WeightShardHashes& w : out) w.root = WeightRoot(&w.tensors);
  return out;
}

}  // namespace crashreplay::capture
