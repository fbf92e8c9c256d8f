// `crashreplay sample-capture OUT`: writes a small, valid two-rank session
// (OUT/rank-00000.crcap, OUT/rank-00001.crcap) for tests and for people
// learning the format. The content is synthetic but shaped like a real
// decode loop: a prefill then decode steps, KV pages shared between steps
// (stored once), weight checks, a dropped-snapshot counter. Deterministic:
// the same command writes the same bytes.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "command.h"
#include "commands_decl.h"
#include "crashreplay/base/status.h"
#include "crashreplay/formats/capture_writer.h"
#include "exit_codes.h"

namespace crashreplay::tools {
namespace {

constexpr int kRanks = 2;
constexpr int kSteps = 4;

// bf16 values of a smooth deterministic signal (no RNG: identical bits on
// every platform and standard library).
std::vector<std::byte> Bf16Wave(size_t count, uint32_t seed) {
  std::vector<std::byte> out(count * 2);
  for (size_t i = 0; i < count; ++i) {
    const float f = 0.05f * std::sin(0.01f * static_cast<float>(i * (seed + 1))) +
                    0.001f * static_cast<float>((i * 2654435761u + seed) % 97);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits += 0x7fff + ((bits >> 16) & 1);
    const uint16_t b = static_cast<uint16_t>(bits >> 16);
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
  return out;
}

TensorDescriptor Bf16Tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<std::byte>& bytes,
                            bool stored) {
  TensorDescriptor t;
  t.name = name;
  t.dtype = "BF16";
  t.shape = std::move(shape);
  t.content_hash = XXH128Of(bytes.data(), bytes.size());
  t.byte_size = bytes.size();
  t.stored = stored;
  t.device = "cuda:0";
  return t;
}

SessionManifest SampleManifest(uint32_t rank) {
  SessionManifest m;
  m.session_id = "sample-session-0001";
  m.engine = "crashreplay-sample";
  m.engine_version = CRASHREPLAY_VERSION;
  m.recorder_version = CRASHREPLAY_VERSION;
  m.created_unix_nanos = 1767225600000000000;  // fixed: the sample is deterministic
  m.hostname = "sample-host";
  m.pid = 1000 + rank;
  m.model.config_json =
      R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, )"
      R"("num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, )"
      R"("intermediate_size": 128, "torch_dtype": "bfloat16"})";
  m.model.model_type = "llama";
  m.model.architecture = "LlamaForCausalLM";
  m.model.num_layers = 2;
  m.model.hidden_size = 64;
  m.model.vocab_size = 256;
  m.model.num_heads = 4;
  m.model.num_kv_heads = 2;
  m.model.head_dim = 16;
  m.model.intermediate_size = 128;
  m.model.dtype = "bfloat16";
  m.toggles = {{"attention_backend", std::string("flashinfer")},
               {"mem_fraction_static", 0.88},
               {"cuda_graph_max_bs", int64_t{160}},
               {"disable_cuda_graph", false},
               {"kv_cache_dtype", std::string("auto")},
               {"page_size", int64_t{16}},
               {"tp_size", int64_t{kRanks}},
               {"SGL_ENABLE_JIT_DEEPGEMM", false}};
  m.device = {"NVIDIA H200", 90, 150754820096ull, "570.124.06", "12.8", rank};
  m.parallel.tp_size = kRanks;
  m.parallel.tp_rank = rank;
  m.parallel.world_size = kRanks;
  m.parallel.rank = rank;
  m.weight_check_period_steps = 4;
  m.features = {"step-log", "snapshots", "weight-checks"};
  return m;
}

absl::Status WriteRank(const std::string& path, uint32_t rank) {
  CaptureWriterOptions options;
  options.overwrite = true;
  CR_ASSIGN_OR_RETURN(std::unique_ptr<CaptureWriter> w, CaptureWriter::Create(path, SampleManifest(rank), options));
  // Load-time weight hashes of this rank's two shards.
  const std::vector<std::byte> embed = Bf16Wave(256 * 32, 1 + rank);
  const std::vector<std::byte> lm_head = Bf16Wave(256 * 32, 11 + rank);
  WeightShardHashes shard;
  shard.rank = rank;
  shard.tensors = {{"model.embed_tokens.weight", XXH128Of(embed.data(), embed.size()), embed.size()},
                   {"lm_head.weight", XXH128Of(lm_head.data(), lm_head.size()), lm_head.size()}};
  Hasher128 root;
  for (const TensorHash& t : shard.tensors) {
    root.Update(t.name.data(), t.name.size());
    root.Update(&t.hash, sizeof t.hash);
  }
  shard.root = root.Digest();
  CR_RETURN_IF_ERROR(w->Append(WeightHashesRecord{{shard}}));

  // The KV pages of the prompt are written once and read by every step.
  const std::vector<std::byte> prompt_kv = Bf16Wave(16 * 2 * 16, 21 + rank);
  for (int step = 0; step < kSteps; ++step) {
    const auto s = static_cast<uint64_t>(step);
    StepRecord rec;
    rec.step = s;
    rec.rank = rank;
    rec.mode = step == 0 ? ForwardMode::kPrefill : ForwardMode::kDecode;
    rec.timestamp_nanos = 1767225600000000000 + step * 25'000'000;
    rec.request_ids = {"req-0", "req-1"};
    const int64_t prompt = 5;
    if (step == 0) {
      rec.token_ids = {1, 17, 42, 99, 7, 1, 23, 5, 61, 8};
      rec.positions = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
      rec.extend_lens = {prompt, prompt};
      rec.out_cache_loc = {0, 1, 2, 3, 4, 16, 17, 18, 19, 20};
    } else {
      rec.token_ids = {100 + step, 200 + step};
      rec.positions = {prompt + step - 1, prompt + step - 1};
      rec.extend_lens = {1, 1};
      rec.out_cache_loc = {prompt + step - 1, 16 + prompt + step - 1};
    }
    rec.seq_lens = {prompt + step, prompt + step};
    rec.req_pool_indices = {0, 1};
    for (int r = 0; r < 2; ++r) {
      PageTableRow row{r, {}};
      for (int64_t t = 0; t < prompt + step; ++t) row.token_slots.push_back(16 * r + t);
      rec.page_table.push_back(std::move(row));
    }
    rec.sampling = {{0.7f, 0.95f, 40, 0.0f, 1234, true}, {0.0f, 1.0f, -1, 0.0f, 0, false}};
    rec.rng_seed = 20260101;
    rec.rng_offset = s * 4;
    rec.output_token_ids = {100 + step + 1, 200 + step + 1};
    const std::vector<std::byte> hidden = Bf16Wave(rec.token_ids.size() * 64, 31 + 7 * s + rank);
    rec.digests = {{"logits.argmax_xxh3", XXH64Of(rec.output_token_ids.data(), 16)},
                   {"hidden.xxh128", XXH128Of(hidden.data(), hidden.size())}};
    rec.tensors = {Bf16Tensor("hidden_states", {static_cast<int64_t>(rec.token_ids.size()), 64}, hidden, false)};
    CR_RETURN_IF_ERROR(w->Append(rec));

    // Snapshot: blobs first, then the record naming them.
    CR_ASSIGN_OR_RETURN(Hash128 kv_hash, w->AppendBlob(prompt_kv, 2));
    CR_ASSIGN_OR_RETURN(Hash128 hidden_hash, w->AppendBlob(hidden, 2));
    (void)kv_hash;
    (void)hidden_hash;
    SnapshotRecord snap;
    snap.step = s;
    snap.rank = rank;
    snap.tensors = {Bf16Tensor("kv_pages.layer0", {16, 2, 16}, prompt_kv, true),
                    Bf16Tensor("hidden_states", {static_cast<int64_t>(rec.token_ids.size()), 64}, hidden, true)};
    CR_RETURN_IF_ERROR(w->Append(snap));

    WeightCheckRecord wc;
    wc.step = s;
    wc.rank = rank;
    wc.period_steps = 4;
    const std::vector<std::byte>& wt = step % 2 == 0 ? embed : lm_head;
    const uint64_t begin = static_cast<uint64_t>(step / 2) * (wt.size() / 2);
    const Hash128 h = XXH128Of(wt.data() + begin, wt.size() / 2);
    wc.slices = {
        {step % 2 == 0 ? "model.embed_tokens.weight" : "lm_head.weight", begin, begin + wt.size() / 2, h, h, false}};
    CR_RETURN_IF_ERROR(w->Append(wc));
  }
  CR_RETURN_IF_ERROR(w->Append(DroppedSnapshotsRecord{kSteps - 1, 0, 0}));
  return w->Close();
}

}  // namespace

int RunSampleCapture(int argc, char** argv) {
  CLI::App app(
      "Write a small valid capture session: OUT/rank-00000.crcap and OUT/rank-00001.crcap\n"
      "(two ranks, four steps each, KV-page blobs shared between steps). Deterministic.",
      "sample-capture");
  std::string out;
  bool force = false;
  app.add_option("OUT", out, "session directory to create")->required();
  app.add_flag("--force", force, "replace rank files already in OUT");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;

  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return ReportError(absl::InvalidArgumentError(absl::StrFormat("cannot create %s: %s", out, ec.message())));
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    const std::string path = (std::filesystem::path(out) / CaptureFileNameForRank(rank)).string();
    if (!force && std::filesystem::exists(path)) {
      return ReportError(
          absl::InvalidArgumentError(absl::StrFormat("%s already exists; pass --force to replace it", path)));
    }
    if (absl::Status s = WriteRank(path, rank); !s.ok()) return ReportError(s);
  }
  std::printf("wrote a %d-rank sample session to %s\nnext: crashreplay info %s\n", kRanks, out.c_str(), out.c_str());
  return kExitOk;
}

}  // namespace crashreplay::tools
