#include "crashreplay/replay/captures/capture_io.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "capture_steps.h"
#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"
#include "crashreplay/capture/weight_hash.h"
#include "crashreplay/formats/capture_format.h"
#include "crashreplay/formats/hash.h"
#include "crashreplay/replay/captures/engine_weights.h"
#include "crashreplay/replay/config/engine_vocab.h"
#include "crashreplay/replay/config/kernel_archs.h"

namespace crashreplay::replay {

using text::Cat;

namespace {

crashreplay::ToggleValue ToCaptureValue(const ToggleValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* d = std::get_if<double>(&v)) return *d;
  return std::get<bool>(v);
}

std::string ToText(const crashreplay::ToggleValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return ToggleValueText(ToggleValue(*d));
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<CaptureRecorder>> CaptureRecorder::Begin(const std::string& session_dir,
                                                                        const std::string& checkpoint_dir,
                                                                        const Config& config, const Model& model,
                                                                        const SnapshotOptions& snapshots,
                                                                        const EngineIdentity* as) {
  SessionManifest m;
  m.engine = "crashreplay";
  m.engine_version = CRASHREPLAY_VERSION;
  m.session_id = Cat("crashreplay-", ::getpid());
  std::error_code ec;
  const std::string abs_dir = std::filesystem::absolute(checkpoint_dir, ec).string();
  m.model.checkpoint_path = abs_dir;
  {
    std::ifstream in(checkpoint_dir + "/config.json");
    std::stringstream ss;
    ss << in.rdbuf();
    m.model.config_json = ss.str();
  }
  const ModelSpec& s = model.spec;
  m.model.model_type = s.model_type;
  m.model.num_layers = static_cast<uint32_t>(s.layers);
  m.model.hidden_size = static_cast<uint32_t>(s.hidden);
  m.model.vocab_size = static_cast<uint32_t>(s.vocab);
  m.model.num_heads = static_cast<uint32_t>(s.heads);
  m.model.num_kv_heads = static_cast<uint32_t>(s.kv_heads);
  m.model.head_dim = static_cast<uint32_t>(s.head_dim);
  m.model.intermediate_size = static_cast<uint32_t>(s.intermediate);
  m.model.num_experts = static_cast<uint32_t>(s.num_experts);
  m.device.name = "crashreplay CPU (emulated device)";
  m.device.memory_capacity_bytes = static_cast<uint64_t>(config.Float("device_memory_gb") * 1e9);
  if (as == nullptr) {
    for (const ToggleSpec& t : Toggles())
      m.toggles.push_back(Toggle{std::string(t.name), ToCaptureValue(config.Get(t.name))});
  } else {
    m.engine = as->engine;
    m.engine_version = Cat("emulated by crashreplay ", CRASHREPLAY_VERSION);
    for (const auto& [k, v] : as->settings) {
      crashreplay::ToggleValue tv;
      if (v.is_bool())
        tv = v.as_bool();
      else if (v.is_int())
        tv = v.as_int();
      else if (v.is_float())
        tv = v.as_float();
      else
        tv = v.as_string();
      m.toggles.push_back(Toggle{k, tv});
    }
    for (const std::string& name : as->own_toggles) {
      m.toggles.push_back(Toggle{Cat("crashreplay.", name), ToCaptureValue(config.Get(name))});
    }
    // The emulation stores activations as the replay engine does, whatever
    // dtype the checkpoint names: say so, or the replay would take the
    // model's dtype as the engine's.
    if (std::find(as->own_toggles.begin(), as->own_toggles.end(), "activation_dtype") == as->own_toggles.end()) {
      m.toggles.push_back(Toggle{"crashreplay.activation_dtype", ToCaptureValue(config.Get("activation_dtype"))});
    }
    m.toggles.push_back(Toggle{Cat(as->engine, ".page_table_unit"), std::string("page")});
    if (!as->device_name.empty()) m.device.name = as->device_name;
    const int arch = ParseArch(config.Enum("device_arch"));
    m.device.sm_arch = static_cast<uint32_t>(std::max(arch, 0));
  }
  m.parallel.tp_size = static_cast<uint32_t>(model.tp);
  m.parallel.world_size = static_cast<uint32_t>(model.tp);
  // An engine's manifest form: its adapter hashes the engine's parameters
  // (vocabulary padded, experts stacked, ...), so the hashes are of the bytes
  // each checkpoint tensor becomes in that layout on each rank; a tensor the
  // layout does not map (quantization scales) is not hashed.
  for (size_t r = 0; as != nullptr && as->tensors != nullptr && r < static_cast<size_t>(model.tp); ++r) {
    ParallelLayout par = m.parallel;
    par.tp_rank = static_cast<uint32_t>(r);
    par.rank = static_cast<uint32_t>(r);
    const EngineLayout layout = EngineLayoutFor(m, par);
    WeightShardHashes w;
    w.rank = static_cast<uint32_t>(r);
    for (const auto& [name, t] : *as->tensors) {
      auto bytes = EngineParameterBytes(layout, name, model.spec, *as->tensors);
      if (!bytes.ok()) continue;
      w.tensors.push_back(TensorHash{name, XXH128Of(bytes->data(), bytes->size()), bytes->size()});
    }
    w.root = capture::WeightRoot(&w.tensors);
    m.weights.push_back(std::move(w));
  }
  for (size_t r = 0; as == nullptr && r < model.shard_hashes.size(); ++r) {
    WeightShardHashes w;
    w.rank = static_cast<uint32_t>(r);
    for (const auto& [name, h] : model.shard_hashes[r]) w.tensors.push_back(TensorHash{name, h.hash, h.bytes});
    w.root = capture::WeightRoot(&w.tensors);
    m.weights.push_back(std::move(w));
  }
  capture::RecorderOptions o;
  o.session_dir = session_dir;
  o.overwrite = true;
  o.install_signal_handlers = false;
  o.page_table_deltas = snapshots.page_table_deltas;
  o.step_list_deltas = snapshots.step_list_deltas;
  o.arm_coredumps = snapshots.coredumps;
  // The ring holds the last `steps` snapshots within the budget; it is
  // written on failure (OnFailure) and, for the built-in engine, on a clean
  // close too, so that any capture can start a replay from a snapshot.
  o.max_snapshots = std::max<uint32_t>(snapshots.steps, 1);
  o.snapshot_ring_bytes = snapshots.steps == 0 ? 0 : snapshots.budget_bytes;
  o.write_snapshots_on_close = snapshots.steps > 0;
  auto rec = std::unique_ptr<CaptureRecorder>(new CaptureRecorder());
  rec->snapshots_ = snapshots;
  CR_ASSIGN_OR_RETURN(rec->recorder_, capture::Recorder::Begin(m, o));
  return rec;
}

void CaptureRecorder::StateBeforeStep(const StepInput& in, const KvCache& kv) {
  if (!status_.ok() || snapshots_.steps == 0) return;
  absl::StatusOr<StepState> state = CaptureState(in, kv);
  if (!state.ok()) return;  // the device is gone; the failure record says why
  const StepState& s = *state;
  const std::vector<int64_t> rows_shape = {static_cast<int64_t>(in.rows.size()), 2};
  const std::vector<int64_t> pages_shape = {static_cast<int64_t>(s.pages.size())};
  std::vector<capture::TensorView> views;
  views.push_back(capture::TensorView{"state.rows", DType::kI64, rows_shape, s.rows.data(), s.rows.size() * 8});
  std::vector<std::string> names;
  names.reserve(s.pools.size());
  for (const StatePool& p : s.pools) names.push_back("kv." + p.name);
  if (!s.pages.empty()) {
    views.push_back(capture::TensorView{"kv.pages", DType::kI32, pages_shape, s.pages.data(), s.pages.size() * 4});
    for (size_t i = 0; i < s.pools.size(); ++i) {
      const StatePool& p = s.pools[i];
      views.push_back(capture::TensorView{names[i], p.dtype, p.shape, p.bytes.data(), p.bytes.size()});
    }
  }
  uint64_t bytes = 0;
  for (const capture::TensorView& v : views) bytes += v.byte_size;
  last_oversized_.reset();
  if (bytes > snapshots_.budget_bytes) last_oversized_ = Oversized{in.step, bytes};
  status_ = recorder_->SubmitSnapshot(static_cast<uint64_t>(in.step), views);
}

void CaptureRecorder::BeforeStep(const StepInput&) {}

void CaptureRecorder::AfterStep(const StepProgram& p) {
  if (!status_.ok()) return;
  const StepInput& in = p.input();
  std::vector<std::string> ids;
  std::vector<std::string_view> id_views;
  std::vector<int64_t> tokens, positions, seq_lens, extend_lens, pool, offsets{0}, slots, out;
  std::vector<crashreplay::SamplingParams> sampling;
  for (size_t r = 0; r < in.rows.size(); ++r) {
    const StepRow& row = in.rows[r];
    ids.push_back(std::to_string(row.request_id));
    for (size_t j = 0; j < row.tokens.size(); ++j) {
      tokens.push_back(row.tokens[j]);
      positions.push_back(row.start_pos + static_cast<int64_t>(j));
    }
    seq_lens.push_back(row.start_pos + static_cast<int64_t>(row.tokens.size()));
    extend_lens.push_back(static_cast<int64_t>(row.tokens.size()));
    pool.push_back(static_cast<int64_t>(r));
    for (int32_t page : row.page_table) slots.push_back(page);
    offsets.push_back(static_cast<int64_t>(slots.size()));
    crashreplay::SamplingParams sp;
    sp.temperature = row.sampling.temperature;
    sp.top_p = row.sampling.top_p;
    sp.top_k = row.sampling.top_k > 0 ? row.sampling.top_k : -1;
    sp.min_p = row.sampling.min_p;
    sp.seed = row.sampling.seed;
    sp.has_seed = true;
    sampling.push_back(sp);
  }
  for (const std::string& s : ids) id_views.push_back(s);
  if (!p.fault()) {
    for (int32_t t : p.SampledTokens()) out.push_back(t);
  }
  std::vector<std::string> names;
  std::vector<capture::DigestView> digests;
  names.reserve(p.records().size() + 1);
  if (!p.fault()) {
    names.push_back("step");
    digests.push_back(capture::DigestView{names.back(), true, 0, p.Digest()});
  }
  for (const KernelRecord& k : p.records()) {
    if (k.failed) continue;
    names.push_back("kernel:" + k.label);
    digests.push_back(capture::DigestView{names.back(), true, 0, k.digest});
  }
  capture::StepView v;
  v.step = static_cast<uint64_t>(in.step);
  v.mode = in.mode == ForwardMode::kPrefill ? crashreplay::ForwardMode::kPrefill : crashreplay::ForwardMode::kDecode;
  v.request_ids = id_views;
  v.token_ids = tokens;
  v.positions = positions;
  v.seq_lens = seq_lens;
  v.extend_lens = extend_lens;
  v.req_pool_indices = pool;
  v.page_table_offsets = offsets;
  v.page_table_slots = slots;
  v.sampling = sampling;
  v.output_token_ids = out;
  v.digests = digests;
  status_ = recorder_->RecordStep(v);
  // What the engine computed at each boundary (a failing step's up to the
  // kernel whose check fired: an incomplete record).
  if (status_.ok() && !p.fingerprints().empty()) {
    FingerprintRecord fr;
    fr.step = static_cast<uint64_t>(in.step);
    fr.fingerprints = p.fingerprints();
    fr.complete = !p.fault().has_value();
    fr.source = "host";
    status_ = recorder_->RecordFingerprints(fr);
  }
}

absl::Status CaptureRecorder::Finish(const std::optional<Fault>& fault) {
  CR_RETURN_IF_ERROR(status_);
  if (fault) {
    capture::FailureInfo f;
    f.reason = fault->message;
    f.stage = fault->stage;
    if (fault->step >= 0) f.step = static_cast<uint64_t>(fault->step);
    f.failure_class = fault->klass == "oom"      ? FailureClass::kOutOfMemory
                      : fault->klass == "assert" ? FailureClass::kDeviceAssert
                                                 : FailureClass::kException;
    f.exception_type = fault->Signature();
    CR_RETURN_IF_ERROR(recorder_->OnFailure(f));
  }
  return recorder_->Close();
}

namespace {

// The recorded rows of one step become StepInputs (page tables at
// `page_size` in the capture's unit, ids as numbers).
absl::Status BuildStepRows(const std::string& file, const StepRecord& s, const internal::PageUnit& unit, int page_size,
                           std::map<std::string, uint64_t>* sampled_so_far, StepInput* input,
                           int64_t* unsampled_steps) {
  input->rows.clear();
  std::vector<std::string> ids = s.request_ids;
  if (ids.empty() && !s.seq_lens.empty() && s.req_pool_indices.size() == s.seq_lens.size()) {
    // An engine that has no request ids (older sglang): a request keeps its
    // pool row for its whole life, so the row names it.
    for (int64_t i : s.req_pool_indices) ids.push_back(Cat("pool-", i));
  }
  const size_t rows = ids.size();
  std::vector<int64_t> extend = s.extend_lens;
  if (extend.empty() && s.mode == crashreplay::ForwardMode::kDecode && s.token_ids.size() == rows) {
    extend.assign(rows, 1);  // a decode step adds one token per request
  }
  auto mismatch = [&](const char* what, size_t n) {
    return absl::InvalidArgumentError(Cat(file, ": step ", s.step, " records ", rows, " requests but ", n, " ", what));
  };
  if (extend.size() != rows) return mismatch("extend lengths", extend.size());
  if (s.seq_lens.size() != rows) return mismatch("sequence lengths", s.seq_lens.size());
  if (s.page_table.size() != rows) return mismatch("page-table rows", s.page_table.size());
  if (!s.sampling.empty() && s.sampling.size() != rows) return mismatch("sampling parameters", s.sampling.size());
  if (s.sampling.empty() && rows > 0) ++*unsampled_steps;
  size_t tok = 0;
  for (size_t r = 0; r < rows; ++r) {
    const std::string where = Cat(file, ": step ", s.step, " request '", ids[r], "'");
    StepRow row;
    row.request_id = internal::RequestIdNumber(ids[r]);
    if (std::to_string(row.request_id) != ids[r]) row.request_name = ids[r];
    const int64_t n = extend[r];
    if (n < 0 || tok + n > s.token_ids.size()) {
      return absl::InvalidArgumentError(
          Cat(where, ": ", n, " new tokens, the step records ", s.token_ids.size(), " token ids in all"));
    }
    for (int64_t j = 0; j < n; ++j) row.tokens.push_back(static_cast<int32_t>(s.token_ids[tok + j]));
    tok += n;
    row.start_pos = s.seq_lens[r] - n;
    if (row.start_pos < 0) return absl::InvalidArgumentError(Cat(where, ": sequence length ", s.seq_lens[r], " < ", n));
    if (!s.page_table[r].complete()) {
      return absl::FailedPreconditionError(
          Cat(where, ": its page-table row (req_pool_index ", s.page_table[r].req_pool_index, ") holds columns from ",
              s.page_table[r].start, " on only: the recorder never had columns 0..", s.page_table[r].start - 1,
              " (it began after the request's prefill, or the steps that held them were lost); replay a step from "
              "after the request's next prefill"));
    }
    CR_ASSIGN_OR_RETURN(row.page_table,
                        internal::RowPages(unit, s.page_table[r].token_slots, s.seq_lens[r], page_size, where));
    if (!s.sampling.empty()) {
      const crashreplay::SamplingParams& sp = s.sampling[r];
      row.sampling = SamplingParams{sp.temperature, sp.top_k > 0 ? sp.top_k : 0, sp.top_p, sp.min_p, sp.seed};
    } else {
      row.sampling = SamplingParams{0.0f, 0, 1.0f, 0.0f, 0};
    }
    row.sample_offset = (*sampled_so_far)[ids[r]]++;
    input->rows.push_back(std::move(row));
  }
  return absl::OkStatus();
}

absl::Status BuildSteps(const std::string& file, const std::vector<StepRecord>& records, const internal::PageUnit& unit,
                        int page_size, std::vector<RecordedStep>* steps, std::vector<std::string>* notes) {
  std::map<std::string, uint64_t> sampled_so_far;
  int64_t unsampled = 0;
  const bool fresh = steps->empty();
  if (!fresh && steps->size() != records.size()) {
    return absl::InternalError("capture steps and records out of step");
  }
  for (size_t i = 0; i < records.size(); ++i) {
    const StepRecord& s = records[i];
    if (fresh) steps->emplace_back();
    RecordedStep& rs = (*steps)[i];
    rs.input.step = static_cast<int64_t>(s.step);
    rs.input.mode = s.mode == crashreplay::ForwardMode::kDecode ? ForwardMode::kDecode : ForwardMode::kPrefill;
    CR_RETURN_IF_ERROR(BuildStepRows(file, s, unit, page_size, &sampled_so_far, &rs.input, &unsampled));
  }
  if (unsampled > 0) notes->push_back(Cat(unsampled, " steps record no sampling parameters; they replay greedy"));
  return absl::OkStatus();
}

void AddWeights(const WeightShardHashes& w, const ParallelLayout& layout, const std::string& file,
                std::map<uint32_t, LoadedCapture::RankWeights>* by_rank) {
  LoadedCapture::RankWeights& rw = (*by_rank)[w.rank];
  rw.rank = w.rank;
  rw.parallel = layout;
  // One file holding several ranks' hashes (the built-in engine emulating
  // tp ranks in one process): each rank's hashes are of its own shard.
  if (w.rank != layout.rank) {
    rw.parallel.rank = w.rank;
    rw.parallel.tp_rank = w.rank % std::max<uint32_t>(layout.tp_size, 1);
  }
  rw.file = file;
  for (const TensorHash& t : w.tensors) {
    auto it = std::find_if(rw.tensors.begin(), rw.tensors.end(), [&](const TensorHash& x) { return x.name == t.name; });
    if (it == rw.tensors.end()) {
      rw.tensors.push_back(t);
    } else {
      *it = t;  // a later record of the same tensor wins
    }
  }
}

void CollectWeights(const CaptureReader& reader, const std::string& file,
                    std::map<uint32_t, LoadedCapture::RankWeights>* by_rank) {
  const SessionManifest& m = *reader.manifest();
  for (const WeightShardHashes& w : m.weights) AddWeights(w, m.parallel, file, by_rank);
  for (const WeightHashesRecord& r : reader.weight_hashes()) {
    for (const WeightShardHashes& w : r.shards) AddWeights(w, m.parallel, file, by_rank);
  }
}

// The other rank files of the session `file` belongs to (same directory,
// rank-NNNNN.crcap, same session id): their weight hashes. A sibling that
// cannot be read is a note, not an error: the replay reads this file.
void CollectSiblingWeights(const std::string& file, const SessionManifest& m,
                           std::map<uint32_t, LoadedCapture::RankWeights>* by_rank, std::vector<std::string>* notes) {
  const std::filesystem::path p(file);
  if (p.filename().string() != CaptureFileNameForRank(m.parallel.rank)) return;
  absl::StatusOr<std::vector<std::string>> files =
      ListCaptureFiles(p.parent_path().empty() ? "." : p.parent_path().string());
  if (!files.ok()) return;
  for (const std::string& f : *files) {
    if (std::filesystem::path(f).filename() == p.filename()) continue;
    absl::StatusOr<std::unique_ptr<CaptureReader>> r = CaptureReader::Open(f);
    if (!r.ok() || !(*r)->manifest()) {
      notes->push_back(Cat("rank file ", f, " is unreadable (", r.ok() ? "no manifest" : r.status().message(),
                           "); its weight hashes are not verified"));
      continue;
    }
    if ((*r)->manifest()->session_id != m.session_id) continue;
    CollectWeights(**r, f, by_rank);
  }
}

}  // namespace

absl::Status RepageSteps(LoadedCapture* cap, int page_size) {
  if (cap->page_size == page_size || cap->reader == nullptr) return absl::OkStatus();
  CR_ASSIGN_OR_RETURN(internal::PageUnit unit, internal::PageUnitOf(cap->manifest));
  if (unit.kind == internal::PageUnit::Kind::kPage) return absl::OkStatus();
  std::vector<std::string> notes;
  CR_RETURN_IF_ERROR(BuildSteps(cap->reader->path(), cap->reader->steps(), unit, page_size, &cap->steps, &notes));
  cap->page_size = page_size;
  return absl::OkStatus();
}

// Another engine stores activations in the dtype it runs the model in: the
// manifest's model dtype (sglang's --dtype, vLLM's resolved dtype), and for
// "auto" the checkpoint's torch_dtype. A recorded activation_dtype toggle
// wins; a dtype outside bf16/fp16/fp32 keeps the default, with a note.
static void SetActivationDType(LoadedCapture* out) {
  for (const Toggle& t : out->manifest.toggles) {
    if (t.name == "activation_dtype" || t.name == "crashreplay.activation_dtype") return;
  }
  std::string d = out->manifest.model.dtype;
  if (d.empty() || d == "auto") {
    const nlohmann::json cfg = nlohmann::json::parse(out->manifest.model.config_json, nullptr, false);
    if (cfg.is_object()) {
      for (const char* key : {"torch_dtype", "dtype"}) {
        if (cfg.contains(key) && cfg[key].is_string()) d = cfg[key].get<std::string>();
      }
    }
  }
  if (d.rfind("torch.", 0) == 0) d = d.substr(6);
  std::string act;
  if (d == "bfloat16" || d == "bf16") act = "bf16";
  if (d == "float16" || d == "half" || d == "fp16") act = "fp16";
  if (d == "float32" || d == "float" || d == "fp32") act = "fp32";
  if (act.empty()) {
    if (!d.empty()) {
      out->notes.push_back(Cat(out->manifest.engine, " ran the model in '", d, "', which activation_dtype does not ",
                               "have; activations are stored in ", ToggleValueText(out->config.Get("activation_dtype")),
                               "; choose with --set activation_dtype=..."));
    }
    return;
  }
  if (out->config.Set("activation_dtype", act).ok() && act != "fp32") {
    out->notes.push_back(Cat(out->manifest.engine, " ran the model in ", d, ": activations are stored in ", act,
                             " as it stored them (activation_dtype); --set activation_dtype=fp32 replays the fp32 ",
                             "reference"));
  }
}

absl::StatusOr<LoadedCapture> LoadCapture(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) {
    // Rank 0's file; a session whose rank 0 left none replays its lowest rank.
    file = capture::SessionRankPath(path, 0);
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) {
      absl::StatusOr<std::vector<std::string>> files = ListCaptureFiles(path);
      if (files.ok() && !files->empty()) file = files->front();
    }
  }
  CR_ASSIGN_OR_RETURN(std::unique_ptr<CaptureReader> reader, CaptureReader::Open(file));
  if (!reader->manifest()) return absl::DataLossError(Cat(file, ": no session manifest"));
  LoadedCapture out;
  out.manifest = *reader->manifest();
  bool has_nvfp4_activation = false;
  const bool other_engine = out.manifest.engine != "crashreplay";
  // Another engine's manifest names the GPU it ran on: kernels are checked
  // against its architecture (kernel_archs.h). An architecture outside the
  // table is a note.
  if (other_engine && out.manifest.device.sm_arch > 0) {
    const std::string arch = Cat("sm_", out.manifest.device.sm_arch);
    if (absl::Status s = out.config.Set("device_arch", arch); !s.ok()) {
      out.notes.push_back(Cat(out.manifest.engine, " ran on ", arch, ", which the kernel table does not list (",
                              s.message(), "); kernels are not checked against an architecture"));
    }
  }
  // sglang and vLLM speak their own words (engine_vocab.h).
  if (other_engine && HasVocabulary(out.manifest.engine)) {
    EngineSettings settings;
    for (const Toggle& t : out.manifest.toggles) {
      settings.emplace_back(t.name, std::holds_alternative<std::monostate>(t.value) ? "" : ToText(t.value));
    }
    VocabResult vr;
    // Lenient: a recorded value outside the replay's domain is a note.
    if (absl::Status s = ApplyEngineSettings(out.manifest.engine, settings, &out.config, &vr, /*lenient=*/true);
        !s.ok()) {
      return absl::DataLossError(Cat(file, ": ", s.message()));
    }
    out.notes.insert(out.notes.end(), vr.notes.begin(), vr.notes.end());
  }
  for (const Toggle& t : out.manifest.toggles) {
    if (FindToggle(t.name) == nullptr) continue;  // another engine's setting
    if (other_engine && HasVocabulary(out.manifest.engine)) continue;  // translated above
    if (other_engine && std::holds_alternative<std::monostate>(t.value)) {
      out.notes.push_back(Cat(out.manifest.engine, " left ", t.name, " unset (decided at run time); replaying with ",
                              t.name, " = ", ToggleValueText(out.config.Get(t.name)), "; choose with --set ", t.name,
                              "=..."));
      continue;
    }
    if (absl::Status s = out.config.Set(t.name, ToText(t.value)); !s.ok()) {
      // Our own engine wrote only values of the table: anything else is a
      // damaged manifest. Another engine's value (sglang's flashinfer) has
      // no counterpart here; the default stands and the user is told.
      if (out.manifest.engine == "crashreplay") return absl::DataLossError(Cat(file, ": recorded ", s.message()));
      out.notes.push_back(Cat(out.manifest.engine, " recorded ", t.name, " = ", ToText(t.value),
                              ", which the replay engine does not have (", s.message(), "); replaying with ", t.name,
                              " = ", ToggleValueText(out.config.Get(t.name)), "; choose with --set ", t.name, "=..."));
    }
    has_nvfp4_activation |= t.name == "nvfp4_activation";
  }
  if (other_engine) SetActivationDType(&out);
  // Another engine's manifest records the device it ran on; the memory
  // planner plans for that device (the built-in engine records
  // device_memory_gb itself). A device without a capacity (a CPU process)
  // leaves the default, and says so.
  if (other_engine) {
    const uint64_t capacity = out.manifest.device.memory_capacity_bytes;
    if (capacity > 0) {
      if (absl::Status s = out.config.Set("device_memory_gb", Cat(static_cast<double>(capacity) / 1e9)); !s.ok()) {
        out.notes.push_back(Cat(out.manifest.engine, " recorded a device of ", capacity, " bytes: ", s.message()));
      }
    } else {
      out.notes.push_back(Cat(out.manifest.engine, " ran on '", out.manifest.device.name, "', which records no memory ",
                              "capacity; memory is planned for device_memory_gb = ",
                              out.config.Float("device_memory_gb"), "; choose with --set device_memory_gb=..."));
    }
  }
  // Quirk: the built-in engine recorded before nvfp4_activation existed ran
  // NVFP4 layers weight-only; such a capture replays as it ran.
  if (out.manifest.engine == "crashreplay" && !has_nvfp4_activation) {
    CR_RETURN_IF_ERROR(out.config.Set("nvfp4_activation", "w4a16"));
  }
  out.weights.resize(out.manifest.weights.size());
  for (const WeightShardHashes& w : out.manifest.weights) {
    if (w.rank >= out.weights.size()) return absl::DataLossError(Cat(file, ": weight hashes of rank ", w.rank));
    for (const TensorHash& t : w.tensors) out.weights[w.rank][t.name] = t.hash;
  }
  std::map<uint32_t, LoadedCapture::RankWeights> by_rank;
  CollectWeights(*reader, file, &by_rank);
  if (out.manifest.engine != "crashreplay") CollectSiblingWeights(file, out.manifest, &by_rank, &out.notes);
  for (auto& [rank, rw] : by_rank) out.rank_weights.push_back(std::move(rw));
  const uint32_t world = std::max<uint32_t>(out.manifest.parallel.world_size, 1);
  if (!out.rank_weights.empty()) {
    for (uint32_t r = 0; r < world; ++r) {
      if (!by_rank.count(r)) out.ranks_without_file.push_back(r);
    }
  }

  auto unit = internal::PageUnitOf(out.manifest);
  if (!unit.ok()) return absl::InvalidArgumentError(Cat(file, ": ", unit.status().message()));
  out.page_table_unit = internal::PageUnitName(*unit);
  out.page_size = static_cast<int>(out.config.Int("page_size"));
  CR_RETURN_IF_ERROR(BuildSteps(file, reader->steps(), *unit, out.page_size, &out.steps, &out.notes));
  for (size_t i = 0; i < reader->steps().size(); ++i) {
    const StepRecord& s = reader->steps()[i];
    RecordedStep& rs = out.steps[i];
    for (const Digest& d : s.digests) {
      const Hash128* h = std::get_if<Hash128>(&d.value);
      if (h == nullptr) continue;
      if (d.name == "step") rs.digest = *h;
      if (d.name.rfind("kernel:", 0) == 0) rs.kernel_digests.emplace_back(d.name.substr(7), *h);
    }
    for (int64_t t : s.output_token_ids) rs.sampled.push_back(static_cast<int32_t>(t));
  }
  // The engine's fingerprints of each step: this rank's complete record, else
  // the last incomplete one (a failure path's).
  for (const FingerprintRecord& fr : reader->fingerprints()) {
    if (fr.rank != out.manifest.parallel.rank) continue;
    for (RecordedStep& rs : out.steps) {
      if (static_cast<uint64_t>(rs.input.step) != fr.step) continue;
      if (rs.fingerprints_complete && !rs.fingerprints.empty()) continue;
      rs.fingerprints = fr.fingerprints;
      rs.fingerprints_complete = fr.complete;
    }
  }
  for (const SnapshotRecord& sr : reader->snapshots()) {
    if (sr.rank == out.manifest.parallel.rank) out.snapshots[static_cast<int64_t>(sr.step)] = sr;
  }
  if (!reader->failures().empty()) {
    const FailureRecord& f = reader->failures().front();
    Fault fault;
    fault.message = f.reason;
    fault.stage = f.stage;
    const std::vector<std::string_view> parts = text::Split(f.exception_type, '/');
    if (parts.size() == 4) {
      fault.klass = std::string(parts[0]);
      fault.kernel = std::string(parts[2]);
      fault.check = std::string(parts[3]);
    } else {
      fault.klass = f.failure_class == FailureClass::kOutOfMemory ? "oom" : "error";
    }
    if (f.step) {
      fault.step = static_cast<int64_t>(*f.step);
      out.failure_step = fault.step;
      for (RecordedStep& rs : out.steps) {
        if (rs.input.step == fault.step) rs.fault = fault;
      }
    }
    out.failure = fault;
  }
  out.reader = std::move(reader);
  return out;
}

namespace {

// One snapshot tensor, read back and checked against its descriptor.
struct SnapshotTensor {
  bool present = false;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

absl::StatusOr<SnapshotTensor> ReadSnapshotTensor(const CaptureReader& reader, const SnapshotRecord& rec,
                                                  const std::string& where, const std::string& name, bool required) {
  SnapshotTensor out;
  const TensorDescriptor* d = nullptr;
  for (const TensorDescriptor& t : rec.tensors) {
    if (t.name == name) d = &t;
  }
  if (d == nullptr) {
    if (!required) return out;
    return absl::DataLossError(Cat(where, ": tensor '", name, "' is missing"));
  }
  const std::optional<DType> dt = ParseDType(d->dtype);
  if (!dt) return absl::DataLossError(Cat(where, ": tensor '", name, "' has unknown dtype '", d->dtype, "'"));
  uint64_t n = 1;
  for (int64_t x : d->shape) {
    if (x < 0 || x > (int64_t{1} << 40))
      return absl::DataLossError(Cat(where, ": tensor '", name, "' has a bad shape"));
    n *= static_cast<uint64_t>(x);
  }
  if (!d->stored || DTypeBytes(*dt, n) != d->byte_size) {
    return absl::DataLossError(Cat(where, ": tensor '", name, "' is ", d->stored ? "inconsistent" : "not stored", " (",
                                   d->byte_size, " bytes for ", d->dtype, " of ", n, " elements)"));
  }
  absl::StatusOr<std::vector<std::byte>> bytes = reader.ReadBlob(d->content_hash);
  if (!bytes.ok()) {
    const absl::StatusCode code = bytes.status().code() == absl::StatusCode::kResourceExhausted
                                      ? absl::StatusCode::kResourceExhausted
                                      : absl::StatusCode::kDataLoss;
    return absl::Status(code, Cat(where, ": tensor '", name, "': ", bytes.status().message()));
  }
  if (bytes->size() != d->byte_size) {
    return absl::DataLossError(
        Cat(where, ": tensor '", name, "' decodes to ", bytes->size(), " bytes, not ", d->byte_size));
  }
  out.present = true;
  out.dtype = *dt;
  out.shape = d->shape;
  out.bytes = std::move(*bytes);
  return out;
}

}  // namespace

absl::StatusOr<StepState> LoadStepState(const LoadedCapture& cap, int64_t step) {
  auto it = cap.snapshots.find(step);
  if (it == cap.snapshots.end() || cap.reader == nullptr) {
    return absl::NotFoundError(Cat("no snapshot of step ", step, " in the capture"));
  }
  const std::string where = Cat(cap.reader->path(), ": snapshot of step ", step);
  const SnapshotRecord& rec = it->second;
  StepState s;
  s.step = step;
  CR_ASSIGN_OR_RETURN(SnapshotTensor rows, ReadSnapshotTensor(*cap.reader, rec, where, "state.rows", true));
  if (rows.dtype != DType::kI64 || rows.shape.size() != 2 || rows.shape[1] != 2) {
    return absl::DataLossError(Cat(where, ": tensor 'state.rows' is not I64 [rows, 2]"));
  }
  s.rows.resize(rows.bytes.size() / 8);
  std::memcpy(s.rows.data(), rows.bytes.data(), rows.bytes.size());
  CR_ASSIGN_OR_RETURN(SnapshotTensor pages, ReadSnapshotTensor(*cap.reader, rec, where, "kv.pages", false));
  if (!pages.present) return s;
  if (pages.dtype != DType::kI32 || pages.shape.size() != 1) {
    return absl::DataLossError(Cat(where, ": tensor 'kv.pages' is not I32 [pages]"));
  }
  s.pages.resize(pages.bytes.size() / 4);
  std::memcpy(s.pages.data(), pages.bytes.data(), pages.bytes.size());
  // Every kv.<pool> tensor, in the order the engine wrote them (KvCache::pools).
  for (const TensorDescriptor& t : rec.tensors) {
    if (t.name.rfind("kv.", 0) != 0 || t.name == "kv.pages") continue;
    CR_ASSIGN_OR_RETURN(SnapshotTensor pool, ReadSnapshotTensor(*cap.reader, rec, where, t.name, true));
    if (pool.shape.size() < 3 || pool.shape[1] != static_cast<int64_t>(s.pages.size())) {
      return absl::DataLossError(
          Cat(where, ": tensor '", t.name, "' is not [planes, ", s.pages.size(), " pages, ...] as 'kv.pages' says"));
    }
    StatePool p;
    p.name = t.name.substr(3);
    p.dtype = pool.dtype;
    p.shape = pool.shape;
    p.bytes.resize(pool.bytes.size());
    std::memcpy(p.bytes.data(), pool.bytes.data(), pool.bytes.size());
    s.pools.push_back(std::move(p));
  }
  if (s.pools.empty()) return absl::DataLossError(Cat(where, ": 'kv.pages' has no cache tensors with it"));
  return s;
}

}  // namespace crashreplay::replay
