#include "shrink.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "crashreplay/base/status.h"
#include "crashreplay/bisect/dd.h"
#include "crashreplay/bisect/process.h"
#include "crashreplay/bisect/replay_trial.h"
#include "crashreplay/bisect/scheduler.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_writer.h"
#include "crashreplay/formats/safetensors_file.h"
#include "crashreplay/formats/safetensors_writer.h"
#include "crashreplay/replay/captures/capture_io.h"
#include "crashreplay/replay/make_model/random_checkpoint.h"
#include "crashreplay/replay/model/checkpoint_io.h"

namespace crashreplay::tools {
namespace {

namespace fs = std::filesystem;
using bisect::ChangeSet;
using bisect::Outcome;

// The capture being shrunk, as read once.
struct Source {
  std::shared_ptr<const CaptureReader> reader;
  SessionManifest manifest;
  std::vector<const StepRecord*> steps;  // this rank's, in file order
  const FailureRecord* failure = nullptr;
  std::string checkpoint;  // the original checkpoint directory
  std::set<std::string> request_ids;  // every request id the steps record
  int64_t vocab = 0;
  int64_t layers = 0;
};

// One candidate: which requests (indices into the target step's), whether
// the layer slice stands in for the checkpoint, and which token occurrences
// keep their original id (empty: all).
struct Candidate {
  int64_t target = -1;  // index of the failing step in Source::steps; -1: before the first step
  ChangeSet requests;   // indices into steps[target]'s requests
  bool sliced = false;
  bool random_weights = false;  // the model is make-model's, drawn like the checkpoint (or its slice)
  std::vector<bool> keep_token;
  std::set<int64_t> dropped_steps;  // earlier steps (indices into Source::steps) left out whole
  std::map<std::string, int64_t> prompt_cut;  // request key -> its first tokens (positions 0..cut-1) left out
};

std::string RequestKey(const StepRecord& s, size_t i) {
  if (i < s.request_ids.size() && !s.request_ids[i].empty()) return s.request_ids[i];
  if (i < s.req_pool_indices.size()) return absl::StrCat("pool:", s.req_pool_indices[i]);
  return absl::StrCat("row:", i);
}

size_t NumRequests(const StepRecord& s) {
  return std::max({s.request_ids.size(), s.req_pool_indices.size(), s.seq_lens.size(), s.page_table.size()});
}

// Where each request's tokens start in the step's per-token lists.
absl::StatusOr<std::vector<size_t>> TokenOffsets(const StepRecord& s) {
  const size_t n = NumRequests(s);
  std::vector<size_t> off(n + 1, 0);
  if (s.extend_lens.size() == n) {
    for (size_t i = 0; i < n; ++i) off[i + 1] = off[i] + static_cast<size_t>(std::max<int64_t>(s.extend_lens[i], 0));
  } else if (s.mode == ForwardMode::kDecode) {
    for (size_t i = 0; i < n; ++i) off[i + 1] = i + 1;
  } else if (n == 1) {
    off[1] = s.token_ids.size();
  } else {
    return absl::DataLossError(absl::StrCat("step ", s.step, ": ", n, " requests without extend lengths: which ",
                                            "tokens are whose cannot be told"));
  }
  if (off[n] != s.token_ids.size()) {
    return absl::DataLossError(absl::StrCat("step ", s.step, ": the requests' extend lengths add up to ", off[n],
                                            " tokens, the step holds ", s.token_ids.size()));
  }
  return off;
}

// splitmix64: the replacement id of token occurrence j.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::optional<int64_t> LayerOf(const std::string& name) {
  static const std::regex kLayer(R"((^|\.)layers\.(\d+)\.)");
  std::smatch m;
  if (!std::regex_search(name, m, kLayer)) return std::nullopt;
  return std::stoll(m[2].str());
}

// The layer of a fingerprint boundary (L<n>.attention, ...), none for the
// model's own (embedding, final_norm, lm_head).
std::optional<int64_t> BoundaryLayer(const std::string& name) {
  static const std::regex kLayer(R"(^L(\d+)\.)");
  std::smatch m;
  if (!std::regex_search(name, m, kLayer)) return std::nullopt;
  return std::stoll(m[1].str());
}

bool KeepTensor(const std::string& name, int64_t layers) {
  const std::optional<int64_t> l = LayerOf(name);
  return !l || *l < layers;
}

std::string ShapeText(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

uint64_t PathBytes(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return fs::file_size(path, ec);
  uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(path, ec)) {
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  }
  return total;
}

// dd's oracle over one stage's universe: each set becomes a candidate.
// A batch of sets (dd asks for several at once: the subsets, then the
// complements) is judged together, so the scheduler runs them in parallel.
class StageOracle : public bisect::DeltaOracle {
 public:
  StageOracle(std::function<std::vector<Outcome>(const std::vector<ChangeSet>&)> judge,
              std::function<int()> trials_left)
      : judge_(std::move(judge)), trials_left_(std::move(trials_left)) {}
  std::vector<Outcome> Test(const std::vector<ChangeSet>& sets) override {
    std::vector<Outcome> out(sets.size(), Outcome::kUnresolved);
    std::vector<ChangeSet> fresh;
    for (const ChangeSet& s : sets) {
      if (!seen_.count(s) && std::find(fresh.begin(), fresh.end(), s) == fresh.end()) fresh.push_back(s);
    }
    const size_t room = static_cast<size_t>(std::max(0, trials_left_()));
    if (fresh.size() > room) {
      stopped_ = true;
      fresh.resize(room);
    }
    if (!fresh.empty()) {
      const std::vector<Outcome> r = judge_(fresh);
      for (size_t i = 0; i < fresh.size(); ++i) {
        seen_[fresh[i]] = r[i];
        if (r[i] == Outcome::kFail && (!smallest_ || fresh[i].size() < smallest_->size())) smallest_ = fresh[i];
      }
    }
    for (size_t i = 0; i < sets.size(); ++i) {
      if (auto it = seen_.find(sets[i]); it != seen_.end()) out[i] = it->second;
    }
    return out;
  }
  bool stopped() const override { return stopped_; }
  const std::optional<ChangeSet>& smallest_failing() const { return smallest_; }

 private:
  std::function<std::vector<Outcome>(const std::vector<ChangeSet>&)> judge_;
  std::function<int()> trials_left_;
  std::map<ChangeSet, Outcome> seen_;
  std::optional<ChangeSet> smallest_;
  bool stopped_ = false;
};

// The replay command line of a candidate (or of the capture as it is).
// `own_model`: the candidate's model directory (a slice, the drawn model),
// "" for the original checkpoint.
std::vector<std::string> ReplayArgv(const ShrinkOptions& o, const std::string& capture_dir,
                                    const std::string& own_model) {
  std::vector<std::string> argv = {o.self, "replay", capture_dir, "--json"};
  argv.insert(argv.end(), o.replay_args.begin(), o.replay_args.end());
  const std::string& model = own_model.empty() ? o.model_dir : own_model;
  if (!model.empty()) argv.insert(argv.end(), {"--model", model});
  return argv;
}

bisect::TrialLimits Limits(const ShrinkOptions& o) {
  bisect::TrialLimits limits;
  limits.timeout_s = o.trial_timeout_s;
  limits.memory_limit_bytes = o.memory_limit_bytes;
  return limits;
}

// A candidate's replay as bisect's scheduler runs trials (its workers, GPU
// pool, repeats and confirmations): the configuration names the candidate's
// directory ("capture") and its own model's ("model", "" for none).
// Run is called on the scheduler's worker threads and reads only `o`.
class CandidateRunner final : public bisect::TrialRunner {
 public:
  explicit CandidateRunner(const ShrinkOptions& o) : o_(o) {}
  std::string SubjectId() const override { return o_.out_dir; }
  bisect::TrialResult Run(const bisect::TrialRequest& r, const std::atomic<bool>* cancel) override {
    bisect::ProcessSpec spec;
    const auto c = r.config.find("capture");
    const auto own = r.config.find("model");
    if (c == r.config.end() || !c->second.is_string()) {
      bisect::TrialResult bad;
      bad.verdict = bisect::Verdict::kAbort;
      bad.note = "a shrink trial without its candidate";
      return bad;
    }
    spec.argv = ReplayArgv(o_, c->second.as_string(), own != r.config.end() ? own->second.as_string() : std::string());
    const bisect::TrialLimits limits = Limits(o_);
    spec.timeout_s = limits.timeout_s;
    spec.memory_limit_bytes = limits.memory_limit_bytes;
    spec.cancel = cancel;
    if (!r.gpus.empty()) spec.env_set.emplace_back("CUDA_VISIBLE_DEVICES", r.gpus);
    bisect::TrialResult t = bisect::InterpretReplayOutput(bisect::RunProcess(spec), limits, /*diverged_is_bad=*/true);
    // A candidate the replay refuses (its usage or data errors: a cut
    // prompt an engine's driver will not take) says nothing of the target:
    // unresolved, where bisect would stop its whole search. The capture as
    // it is was replayed before any candidate, so the command itself runs.
    if (t.verdict == bisect::Verdict::kAbort) t.verdict = bisect::Verdict::kSkip;
    return t;
  }
  std::string ReproduceCommand(const std::string&, std::optional<int64_t>) const override { return ""; }

 private:
  const ShrinkOptions& o_;
};

bisect::SchedulerOptions SchedulerOptionsOf(const ShrinkOptions& o) {
  bisect::SchedulerOptions s;
  s.jobs = std::max(1, o.jobs);
  s.repeat = std::max(1, o.repeat);
  s.confirm = std::max(0, o.confirm);
  s.gpus = o.gpus;
  if (!s.gpus.empty()) s.jobs = std::min<int>(s.jobs, static_cast<int>(s.gpus.size()));
  return s;
}

class Shrinker {
 public:
  Shrinker(const ShrinkOptions& o, Source src)
      : o_(o),
        src_(std::move(src)),
        runner_(o),
        scheduler_(runner_, SchedulerOptionsOf(o)),
        start_(std::chrono::steady_clock::now()) {}

  absl::StatusOr<ShrinkResult> Run();

 private:
  // The stages' token occurrences of the kept requests, in write order.
  struct Occurrence {
    int64_t step;  // new step number
    int64_t position;
    int64_t id;
  };
  absl::Status Write(const Candidate& c, const std::string& dir, std::vector<Occurrence>* occurrences) const;
  absl::Status WriteSlice(int64_t layers, const std::string& dir);
  // The weights stage's model: the config files of the checkpoint (or its
  // slice) under OUT/model-config, and make-model's model drawn like it from
  // the seed under `dir`; an error says why it cannot stand in (make-model
  // cannot draw it, or draws other tensors than the checkpoint holds).
  absl::Status WriteRandomModel(const Candidate& c, const std::string& dir);
  // A candidate's own model directory (the slice's or the random one's),
  // "" for the original checkpoint.
  std::string OwnModel(const Candidate& c) const {
    return c.random_weights ? random_dir_ : c.sliced ? slice_dir_ : std::string();
  }
  // Writes and replays candidates (in parallel, through the scheduler):
  // each trial's verdict against the target, in order.
  std::vector<Outcome> JudgeAll(const std::vector<Candidate>& cs);
  Outcome Judge(const Candidate& c) { return JudgeAll({c})[0]; }
  // dd's oracle over a stage's sets: `make` gives each set's candidate, or
  // none for a set that passes without a trial (no request at all).
  template <typename Make>
  StageOracle OracleOf(Make make) {
    return StageOracle(
        [this, make](const std::vector<ChangeSet>& sets) {
          std::vector<Outcome> out(sets.size(), Outcome::kPass);
          std::vector<Candidate> cs;
          std::vector<size_t> at;
          for (size_t i = 0; i < sets.size(); ++i) {
            if (std::optional<Candidate> c = make(sets[i])) {
              cs.push_back(std::move(*c));
              at.push_back(i);
            }
          }
          const std::vector<Outcome> r = JudgeAll(cs);
          for (size_t k = 0; k < at.size(); ++k) out[at[k]] = r[k];
          return out;
        },
        [this] { return TrialsLeft(); });
  }
  bisect::TrialResult Replay(const std::string& capture_dir, const std::string& own_model,
                             std::optional<int64_t>* layer = nullptr) const;
  // The keys of the requests a candidate keeps (those of its failing step).
  std::set<std::string> KeptKeys(const Candidate& c) const {
    std::set<std::string> kept;
    if (c.target >= 0) {
      const StepRecord& t = *src_.steps[static_cast<size_t>(c.target)];
      for (size_t i : c.requests) kept.insert(RequestKey(t, i));
    }
    return kept;
  }
  void Say(const std::string& line) const {
    if (o_.progress) o_.progress(line);
  }
  // Trials that may still start: the trial budget's rest, none once the
  // time budget is spent.
  int TrialsLeft() const {
    if (o_.time_budget_s &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() >= *o_.time_budget_s) {
      return 0;
    }
    return std::max(0, o_.max_trials - trials_);
  }
  bool OutOfBudget() const { return TrialsLeft() == 0; }

  const ShrinkOptions& o_;
  Source src_;
  bisect::FailureSignature target_;
  int trials_ = 0;
  int64_t slice_layers_ = 0;
  std::string slice_dir_;
  std::string slice_config_;  // the slice's config.json text, for the manifests
  std::string random_dir_;     // the weights stage's model
  std::string random_config_;  // its config.json text
  // The recorded fingerprints and sampled tokens go into the candidates:
  // --no-anonymize, or a target that is a departure from them.
  bool keep_recording_ = false;
  ShrinkResult result_;
  CandidateRunner runner_;
  bisect::Scheduler scheduler_;
  std::chrono::steady_clock::time_point start_;
};

absl::Status Shrinker::Write(const Candidate& c, const std::string& dir, std::vector<Occurrence>* occurrences) const {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  SessionManifest m = src_.manifest;
  const std::set<std::string> kept = KeptKeys(c);
  // Random weights match no recorded hash: none is kept.
  auto keep_weight = [&](const std::string& name) {
    return !c.random_weights && (!c.sliced || KeepTensor(name, slice_layers_));
  };
  for (WeightShardHashes& w : m.weights) {
    std::erase_if(w.tensors, [&](const TensorHash& t) { return !keep_weight(t.name); });
  }
  if (c.random_weights) m.weights.clear();
  const std::string own = OwnModel(c);
  // A model of OUT's own is named as the README's command gives it (run
  // from OUT, --model model): no path of the machine that shrank it.
  m.model.checkpoint_path = own.empty() ? src_.checkpoint : "model";
  if (c.sliced) {
    m.model.config_json = slice_config_;
    m.model.num_layers = static_cast<uint32_t>(slice_layers_);
  }
  if (c.random_weights) m.model.config_json = random_config_;
  if (o_.anonymize) {
    m.hostname.clear();
    m.pid = 0;
    m.session_id = "shrunk";  // the user's session id (often host, pid and time) stays home
    nlohmann::json cfg = nlohmann::json::parse(m.model.config_json, nullptr, false);
    if (cfg.is_object() && cfg.contains("_name_or_path")) {
      cfg.erase("_name_or_path");
      m.model.config_json = cfg.dump();
    }
    std::erase_if(m.toggles, [](const Toggle& t) {
      const std::string* s = std::get_if<std::string>(&t.value);
      return s != nullptr && (s->find('/') != std::string::npos || (!s->empty() && (*s)[0] == '~'));
    });
  }
  CaptureWriterOptions wo;
  wo.overwrite = true;
  wo.fsync_on_close = false;
  CR_ASSIGN_OR_RETURN(std::unique_ptr<CaptureWriter> w,
                      CaptureWriter::Create(capture::SessionRankPath(dir, m.parallel.rank), m, wo));
  for (const WeightHashesRecord& wh : src_.reader->weight_hashes()) {
    if (c.random_weights) break;
    WeightHashesRecord r = wh;
    for (WeightShardHashes& s : r.shards) {
      std::erase_if(s.tensors, [&](const TensorHash& t) { return !keep_weight(t.name); });
    }
    CR_RETURN_IF_ERROR(w->Append(r));
  }
  std::map<std::string, std::string> names;  // original request key -> r<k>
  int64_t out_step = 0;
  int64_t target_out = -1;
  size_t occurrence = 0;
  for (int64_t si = 0; si <= c.target; ++si) {
    if (si < c.target && c.dropped_steps.count(si)) continue;
    const StepRecord& s = *src_.steps[static_cast<size_t>(si)];
    const size_t n = NumRequests(s);
    CR_ASSIGN_OR_RETURN(std::vector<size_t> off, TokenOffsets(s));
    StepRecord r;
    r.step = static_cast<uint64_t>(out_step);
    r.rank = s.rank;
    r.mode = s.mode;
    r.rng_seed = s.rng_seed;
    r.rng_offset = s.rng_offset;
    for (size_t i = 0; i < n; ++i) {
      const std::string key = RequestKey(s, i);
      if (!kept.count(key)) continue;
      // A shortened prompt: its tokens at positions < cut are gone, the rest
      // move down by cut, and so do the request's length and row.
      const auto cut_it = c.prompt_cut.find(key);
      const int64_t cut = cut_it == c.prompt_cut.end() ? 0 : cut_it->second;
      size_t removed = 0;
      for (size_t t = off[i]; cut > 0 && t < off[i + 1]; ++t) {
        if (t < s.positions.size() && s.positions[t] < cut) ++removed;
      }
      if (removed > 0 && removed == off[i + 1] - off[i]) continue;  // the step ran only what was cut
      if (!names.count(key)) names[key] = absl::StrCat("r", names.size());
      if (!s.request_ids.empty()) r.request_ids.push_back(o_.anonymize ? names[key] : s.request_ids[i]);
      for (size_t t = off[i]; t < off[i + 1]; ++t) {
        if (cut > 0 && t < s.positions.size() && s.positions[t] < cut) continue;
        int64_t id = s.token_ids[t];
        if (!c.keep_token.empty() && !c.keep_token[occurrence] && src_.vocab > 0) {
          id = static_cast<int64_t>(Mix(o_.seed ^ (occurrence * 0x100000001b3ull)) % static_cast<uint64_t>(src_.vocab));
        }
        const int64_t pos = t < s.positions.size() ? s.positions[t] - cut : -1;
        if (occurrences) occurrences->push_back({out_step, pos, s.token_ids[t]});
        ++occurrence;
        r.token_ids.push_back(id);
        if (t < s.positions.size()) r.positions.push_back(pos);
        if (s.out_cache_loc.size() == s.token_ids.size()) r.out_cache_loc.push_back(s.out_cache_loc[t]);
      }
      if (i < s.seq_lens.size()) r.seq_lens.push_back(s.seq_lens[i] - cut);
      if (s.extend_lens.size() == n) r.extend_lens.push_back(s.extend_lens[i] - static_cast<int64_t>(removed));
      if (s.req_pool_indices.size() == n) r.req_pool_indices.push_back(s.req_pool_indices[i]);
      if (s.page_table.size() == n) {
        PageTableRow row = s.page_table[i];
        const size_t drop = std::min(row.token_slots.size(), static_cast<size_t>(cut));
        row.token_slots.erase(row.token_slots.begin(), row.token_slots.begin() + static_cast<std::ptrdiff_t>(drop));
        r.page_table.push_back(std::move(row));
      }
      if (s.sampling.size() == n) r.sampling.push_back(s.sampling[i]);
      if (keep_recording_ && s.output_token_ids.size() == n) r.output_token_ids.push_back(s.output_token_ids[i]);
    }
    if (si == c.target) target_out = out_step;
    if (NumRequests(r) == 0) continue;
    CR_RETURN_IF_ERROR(w->Append(r));
    if (keep_recording_) {
      // The step's recorded fingerprints, summaries over its whole batch: a
      // candidate that changed the batch no longer matches them, and its
      // replay departs elsewhere (fails differently), as it should.
      for (const FingerprintRecord& fr : src_.reader->fingerprints()) {
        if (fr.step != s.step || fr.rank != s.rank) continue;
        FingerprintRecord moved = fr;
        moved.step = static_cast<uint64_t>(out_step);
        if (c.sliced) {
          // A slice's boundaries past its last layer (final_norm, lm_head)
          // were recorded over every layer: not the slice's to compare.
          std::erase_if(moved.fingerprints, [&](const Fingerprint& f) {
            const std::optional<int64_t> l = BoundaryLayer(f.name);
            return l ? *l >= slice_layers_ : f.name != "embedding";
          });
        }
        CR_RETURN_IF_ERROR(w->Append(moved));
      }
    }
    ++out_step;
  }
  if (src_.failure != nullptr) {
    FailureRecord f = *src_.failure;
    if (f.step) {
      if (target_out < 0) return absl::InternalError("the failing step was dropped");
      f.step = static_cast<uint64_t>(target_out);
    }
    if (o_.anonymize) {
      f.backtrace.clear();
      // The engine's message may name requests (a kept one by its new name,
      // a dropped one not at all), the host, the checkpoint or the capture.
      for (std::string* text : {&f.reason, &f.exception_type}) {
        for (const std::string& id : src_.request_ids) {
          if (id.size() < 4) continue;  // "0", "17": too short to tell from other text, and to identify anyone
          const auto it = names.find(id);
          *text = absl::StrReplaceAll(*text, {{id, it == names.end() ? "<request>" : it->second}});
        }
        for (const std::string& origin : {src_.manifest.hostname, src_.checkpoint, o_.capture}) {
          if (origin.size() >= 3) *text = absl::StrReplaceAll(*text, {{origin, "<original>"}});
        }
      }
    }
    CR_RETURN_IF_ERROR(w->Append(f));
  }
  return w->Close();
}

absl::Status Shrinker::WriteSlice(int64_t layers, const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::ifstream in(src_.checkpoint + "/config.json");
  if (!in) return absl::NotFoundError(absl::StrCat(src_.checkpoint, "/config.json: cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json cfg = nlohmann::json::parse(ss.str(), nullptr, false);
  if (!cfg.is_object()) return absl::DataLossError(absl::StrCat(src_.checkpoint, "/config.json: not a JSON object"));
  // The per-layer lists (layer_types, mlp_layer_types, ...) have one entry
  // a layer: cut with the layers.
  for (auto& [k, v] : cfg.items()) {
    if (v.is_array() && static_cast<int64_t>(v.size()) == src_.layers) v.erase(v.begin() + layers, v.end());
  }
  cfg["num_hidden_layers"] = layers;
  if (o_.anonymize) cfg.erase("_name_or_path");
  SafetensorsWriter out;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(src_.checkpoint, ec)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::unique_ptr<SafetensorsFile>> open;
  for (const fs::path& p : files) {
    CR_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::Open(p.string()));
    for (const TensorInfo& t : f->tensors()) {
      if (!KeepTensor(t.name, layers)) continue;
      CR_RETURN_IF_ERROR(out.Add(t.name, t.dtype, t.shape, f->Data(t)));
    }
    open.push_back(std::move(f));
  }
  CR_RETURN_IF_ERROR(out.Write(dir + "/model.safetensors"));
  // The other small JSON files a loader reads beside config.json (ModelOpt's
  // hf_quant_config.json, generation_config.json); not the shard index.
  for (const auto& e : fs::directory_iterator(src_.checkpoint, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".json" || name == "config.json" || name.find(".index.json") != std::string::npos ||
        name.rfind("tokenizer", 0) == 0) {
      continue;
    }
    fs::copy_file(e.path(), dir + "/" + name, fs::copy_options::overwrite_existing, ec);
  }
  slice_config_ = cfg.dump(2) + "\n";
  std::ofstream cf(dir + "/config.json");
  cf << slice_config_;
  slice_layers_ = layers;
  slice_dir_ = dir;
  return cf ? absl::OkStatus() : absl::DataLossError(absl::StrCat("cannot write ", dir, "/config.json"));
}

absl::Status Shrinker::WriteRandomModel(const Candidate& c, const std::string& dir) {
  const std::string like = o_.out_dir + "/model-config";
  std::error_code ec;
  fs::remove_all(like, ec);
  fs::create_directories(like, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot create ", like, ": ", ec.message()));
  // The config files as the candidate's replay reads them: the slice's
  // (already anonymized), else the checkpoint's without its origin.
  const std::string from = c.sliced ? slice_dir_ : src_.checkpoint;
  for (const auto& e : fs::directory_iterator(from, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".json" || name.find(".index.json") != std::string::npos ||
        name.rfind("tokenizer", 0) == 0) {
      continue;
    }
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (name == "config.json" && o_.anonymize) {
      nlohmann::json cfg = nlohmann::json::parse(text, nullptr, false);
      if (!cfg.is_object()) return absl::DataLossError(absl::StrCat(e.path().string(), ": not a JSON object"));
      cfg.erase("_name_or_path");
      text = cfg.dump(2) + "\n";
    }
    if (name == "config.json") random_config_ = text;
    std::ofstream out(like + "/" + name, std::ios::binary);
    out << text;
    if (!out) return absl::DataLossError(absl::StrCat("cannot write ", like, "/", name));
  }
  if (ec) return absl::NotFoundError(absl::StrCat(from, ": ", ec.message()));
  replay::MakeModelOptions mo;
  mo.like = like;
  mo.seed = o_.seed;
  mo.threads = 0;
  fs::remove_all(dir, ec);
  CR_ASSIGN_OR_RETURN(replay::WrittenCheckpoint w, replay::WriteRandomCheckpoint(dir, mo));
  // The same tensors the engine loads from the checkpoint: names, dtypes,
  // shapes (a tensor make-model does not draw, or draws otherwise, says so).
  CR_ASSIGN_OR_RETURN(replay::LoadedCheckpoint want, replay::LoadCheckpointDir(from, {true}));
  CR_ASSIGN_OR_RETURN(replay::LoadedCheckpoint got, replay::LoadCheckpointDir(dir, {true}));
  for (const auto& [name, t] : want.tensors) {
    auto it = got.tensors.find(name);
    if (it == got.tensors.end()) return absl::UnimplementedError(absl::StrCat("make-model does not draw '", name, "'"));
    if (it->second.dtype != t.dtype || it->second.shape != t.shape) {
      const std::string drawn =
          absl::StrCat(std::string(DTypeName(it->second.dtype)), " ", ShapeText(it->second.shape));
      const std::string held = absl::StrCat(std::string(DTypeName(t.dtype)), " ", ShapeText(t.shape));
      return absl::UnimplementedError(
          absl::StrCat("make-model draws '", name, "' as ", drawn, ", the checkpoint holds ", held));
    }
  }
  for (const auto& [name, t] : got.tensors) {
    if (!want.tensors.count(name)) {
      return absl::UnimplementedError(absl::StrCat("make-model draws '", name, "', which the checkpoint lacks"));
    }
  }
  random_dir_ = dir;
  return absl::OkStatus();
}

// The layer a replay's failure is in: its fault's layer, else the layer of
// the boundary where the engine departed (L<k>.*), else none.
std::optional<int64_t> FailureLayer(const std::string& replay_stdout) {
  const nlohmann::json j = nlohmann::json::parse(replay_stdout, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  if (auto f = j.find("fault"); f != j.end() && f->is_object()) {
    if (auto l = f->find("layer"); l != f->end() && l->is_number_integer() && l->get<int64_t>() >= 0) {
      return l->get<int64_t>();
    }
  }
  for (const char* key : {"engine_divergence", "diverged"}) {
    if (auto d = j.find(key); d != j.end() && d->is_object()) {
      static const std::regex kLayerKernel(R"(^L(\d+)\.)");
      std::smatch m;
      const std::string b = d->value("boundary", d->value("kernel", std::string()));
      if (std::regex_search(b, m, kLayerKernel)) return std::stoll(m[1].str());
    }
  }
  return std::nullopt;
}

bisect::TrialResult Shrinker::Replay(const std::string& capture_dir, const std::string& own_model,
                                     std::optional<int64_t>* layer) const {
  bisect::ProcessSpec spec;
  spec.argv = ReplayArgv(o_, capture_dir, own_model);
  const bisect::TrialLimits limits = Limits(o_);
  spec.timeout_s = limits.timeout_s;
  spec.memory_limit_bytes = limits.memory_limit_bytes;
  if (!o_.gpus.empty()) spec.env_set.emplace_back("CUDA_VISIBLE_DEVICES", o_.gpus.front());
  const bisect::ProcessResult p = bisect::RunProcess(spec);
  if (layer != nullptr) *layer = FailureLayer(p.stdout_text);
  return bisect::InterpretReplayOutput(p, limits, /*diverged_is_bad=*/true);
}

std::vector<Outcome> Shrinker::JudgeAll(const std::vector<Candidate>& cs) {
  std::vector<Outcome> out(cs.size(), Outcome::kUnresolved);
  std::vector<Config> configs;
  std::vector<size_t> which;
  std::vector<int> number;
  for (size_t i = 0; i < cs.size(); ++i) {
    ++trials_;
    const std::string dir = absl::StrCat(o_.out_dir, "/trials/trial-", trials_);
    if (absl::Status s = Write(cs[i], dir, nullptr); !s.ok()) {
      Say(absl::StrCat("trial ", trials_, ": cannot write the candidate: ", s.message()));
      continue;
    }
    configs.push_back({{"capture", ConfigValue::String(dir)}, {"model", ConfigValue::String(OwnModel(cs[i]))}});
    which.push_back(i);
    number.push_back(trials_);
  }
  const std::vector<bisect::TrialResult> rs = scheduler_.RunBatch(configs);
  for (size_t k = 0; k < rs.size(); ++k) {
    const bisect::TrialResult& r = rs[k];
    const Candidate& c = cs[which[k]];
    std::error_code ec;
    fs::remove_all(configs[k].at("capture").as_string(), ec);
    Outcome o = Outcome::kUnresolved;
    if (r.verdict == bisect::Verdict::kGood) o = Outcome::kPass;
    if (r.verdict == bisect::Verdict::kBad)
      o = bisect::SameBug(r.signature, target_) ? Outcome::kFail : Outcome::kOther;
    out[which[k]] = o;
    Say(absl::StrCat(
        "trial ", number[k], ": ", c.requests.size(), " request(s)", c.sliced ? ", layer slice" : "",
        c.random_weights ? ", random weights" : "",
        c.keep_token.empty()
            ? std::string()
            : absl::StrCat(", ", std::count(c.keep_token.begin(), c.keep_token.end(), true), " original token id(s)"),
        ": ",
        o == Outcome::kFail    ? "fails the same way"
        : o == Outcome::kPass  ? "does not fail"
        : o == Outcome::kOther ? absl::StrCat("fails differently (", bisect::DescribeSignature(r.signature), ")")
        : r.verdict == bisect::Verdict::kFlaky
            ? absl::StrCat("flaky (", r.bad_runs, " of ", r.runs, " runs failed): counted as unresolved")
            : absl::StrCat("unresolved (", r.note, ")")));
  }
  return out;
}

absl::StatusOr<ShrinkResult> Shrinker::Run() {
  ShrinkResult& res = result_;
  res.bytes_before = PathBytes(src_.reader->path());
  Say(absl::StrCat("replaying ", o_.capture, " as it is"));
  std::optional<int64_t> layer;
  const bisect::TrialResult base = Replay(o_.capture, "", &layer);
  ++trials_;
  if (base.verdict == bisect::Verdict::kGood) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nothing to shrink: the replay of ", o_.capture,
        " does not fail (it reproduces the recording); shrink keeps a failure, give the configuration under which "
        "it fails (--config, --set)"));
  }
  if (base.verdict != bisect::Verdict::kBad) {
    return absl::FailedPreconditionError(absl::StrCat("the replay of ", o_.capture, " cannot be judged: ", base.note,
                                                      base.stderr_tail.empty() ? "" : ": ", base.stderr_tail));
  }
  target_ = base.signature;
  res.target = target_;
  // A departure from the recording (the exact engine's fingerprints or
  // tokens against the recorded ones) needs the recording; under --engine
  // the two engines are compared with each other, live.
  const bool live = std::find(o_.replay_args.begin(), o_.replay_args.end(), "--engine") != o_.replay_args.end();
  const bool against_recording = !live && (target_.failure_class == bisect::FailureClass::kEngineDivergence ||
                                           target_.failure_class == bisect::FailureClass::kOutputMismatch);
  keep_recording_ = !o_.anonymize || against_recording;
  if (against_recording && o_.anonymize) {
    res.needs["recording"] =
        "the recorded fingerprints and sampled tokens: the failure is the replay's departure from them (they are "
        "summaries of the batch the user ran)";
  }
  Say(absl::StrCat("target: ", bisect::DescribeSignature(target_)));
  Candidate cur;
  cur.target = src_.steps.empty() ? -1 : static_cast<int64_t>(src_.steps.size()) - 1;
  if (target_.step && *target_.step >= 0 && *target_.step < static_cast<int64_t>(src_.steps.size())) {
    cur.target = *target_.step;
  }
  if (cur.target >= 0) {
    const size_t n = NumRequests(*src_.steps[static_cast<size_t>(cur.target)]);
    for (size_t i = 0; i < n; ++i) cur.requests.push_back(i);
  }

  // Stage 1: requests.
  {
    ShrinkStage st{"requests", static_cast<int64_t>(cur.requests.size()), 0, 0, ""};
    const int before = trials_;
    if (cur.requests.size() > 1) {
      StageOracle oracle = OracleOf([&](const ChangeSet& set) -> std::optional<Candidate> {
        if (set.empty()) return std::nullopt;  // no request: no step to fail in
        Candidate c = cur;
        c.requests.clear();
        for (size_t i : set) c.requests.push_back(cur.requests[i]);
        return c;
      });
      const bisect::DdResult dd = bisect::IsolateCulprit(cur.requests.size(), oracle);
      ChangeSet keep;
      if (dd.complete && !dd.culprit.empty()) {
        keep = dd.culprit;
      } else if (oracle.smallest_failing()) {
        keep = *oracle.smallest_failing();
        res.minimal = false;
      } else {
        for (size_t i = 0; i < cur.requests.size(); ++i) keep.push_back(i);
        res.minimal = false;
      }
      ChangeSet kept;
      for (size_t i : keep) kept.push_back(cur.requests[i]);
      cur.requests = kept;
      if (!dd.complete) st.note = "trial budget reached: the smallest failing set found so far";
    } else if (cur.target < 0) {
      st.note = "the failure happens before the first step: every step is dropped";
    }
    st.after = static_cast<int64_t>(cur.requests.size());
    st.trials = trials_ - before;
    res.stages.push_back(st);
  }

  // Stage 2: history - the earlier steps the kept requests ran in (their
  // KV then holds what no replayed step wrote: zeros in the exact engine).
  {
    const std::set<std::string> kept = KeptKeys(cur);
    std::vector<int64_t> history;  // earlier steps with a kept request
    for (int64_t si = 0; si < cur.target; ++si) {
      const StepRecord& s = *src_.steps[static_cast<size_t>(si)];
      for (size_t i = 0; i < NumRequests(s); ++i) {
        if (kept.count(RequestKey(s, i))) {
          history.push_back(si);
          break;
        }
      }
    }
    ShrinkStage st{"history", static_cast<int64_t>(history.size()), static_cast<int64_t>(history.size()), 0, ""};
    const int before = trials_;
    auto with_steps = [&](const ChangeSet& keep) {
      Candidate c = cur;
      std::set<size_t> in(keep.begin(), keep.end());
      for (size_t k = 0; k < history.size(); ++k) {
        if (!in.count(k)) c.dropped_steps.insert(history[k]);
      }
      return c;
    };
    if (!history.empty() && against_recording) {
      // Without its history a step reads zeros where its KV was: it departs
      // from the recorded fingerprints whatever the configuration, so such a
      // candidate would "fail the same way" for another reason.
      st.note =
          "the failure is a departure from the recording, which a step without its history departs from anyway: "
          "the history is kept";
    } else if (!history.empty()) {
      StageOracle oracle = OracleOf([&](const ChangeSet& set) -> std::optional<Candidate> { return with_steps(set); });
      // No history at all first: most failures of a step's own make-up need none.
      ChangeSet keep;
      if (Judge(with_steps({})) == Outcome::kFail) {
        st.note = "the failure needs none of the earlier steps";
      } else {
        const bisect::DdResult dd = bisect::IsolateCulprit(history.size(), oracle);
        if (dd.complete && !dd.culprit.empty()) {
          keep = dd.culprit;
        } else if (oracle.smallest_failing()) {
          keep = *oracle.smallest_failing();
          res.minimal = false;
          st.note = "trial budget reached: the smallest failing set found so far";
        } else {
          for (size_t k = 0; k < history.size(); ++k) keep.push_back(k);
          if (!dd.complete) res.minimal = false;
        }
      }
      cur = with_steps(keep);
      st.after = static_cast<int64_t>(keep.size());
    }
    st.trials = trials_ - before;
    res.stages.push_back(st);
  }

  // Stage 3: prompt - each kept request's prompt shortened from its start
  // (its later positions, length and row moved down), to the shortest
  // that still fails. Rows of token slots only: a row of pages or blocks
  // cannot lose part of a page.
  {
    std::map<std::string, int64_t> prompt_len;  // request -> its prompt's tokens, from its first step
    std::set<std::string> not_tokens;
    const std::set<std::string> kept = KeptKeys(cur);
    std::vector<std::string> order;
    for (int64_t si = 0; si <= cur.target; ++si) {
      if (si < cur.target && cur.dropped_steps.count(si)) continue;
      const StepRecord& s = *src_.steps[static_cast<size_t>(si)];
      auto off = TokenOffsets(s);
      if (!off.ok()) continue;
      for (size_t i = 0; i < NumRequests(s); ++i) {
        const std::string key = RequestKey(s, i);
        if (!kept.count(key)) continue;
        const bool token_row = i < s.page_table.size() && i < s.seq_lens.size() && s.page_table[i].start == 0 &&
                               static_cast<int64_t>(s.page_table[i].token_slots.size()) == s.seq_lens[i];
        if (!token_row) not_tokens.insert(key);
        if (prompt_len.count(key)) continue;
        const size_t first = (*off)[i], end = (*off)[i + 1];
        const bool from_zero = first < end && first < s.positions.size() && s.positions[first] == 0;
        prompt_len[key] = from_zero ? static_cast<int64_t>(end - first) : 0;
        order.push_back(key);
      }
    }
    int64_t before_tokens = 0, after_tokens = 0;
    for (const auto& [k, len] : prompt_len) before_tokens += len;
    ShrinkStage st{"prompt", before_tokens, before_tokens, 0, ""};
    const int before = trials_;
    std::vector<std::string> skipped;
    for (const std::string& key : order) {
      const int64_t len = prompt_len[key];
      if (len < 2) continue;
      if (not_tokens.count(key)) {
        skipped.push_back(key);
        continue;
      }
      // The largest cut in [0, len - 1] that still fails (one prompt token
      // stays): the whole cut first, then by halves.
      auto fails = [&](int64_t cut) {
        Candidate c = cur;
        c.prompt_cut[key] = cut;
        return Judge(c) == Outcome::kFail;
      };
      int64_t good = 0, bad = len;  // cut `good` fails; cuts >= `bad` do not (or are not tried)
      if (!OutOfBudget() && fails(len - 1)) {
        good = len - 1;
      } else {
        bad = len - 1;
        while (bad - good > 1 && !OutOfBudget()) {
          const int64_t mid = good + (bad - good) / 2;
          (fails(mid) ? good : bad) = mid;
        }
        if (bad - good > 1) res.minimal = false;
      }
      if (good > 0) cur.prompt_cut[key] = good;
    }
    for (const auto& [k, len] : prompt_len) {
      after_tokens += len - (cur.prompt_cut.count(k) ? cur.prompt_cut.at(k) : 0);
    }
    st.after = after_tokens;
    if (!skipped.empty()) {
      st.note =
          absl::StrCat(skipped.size(), " request(s) with rows of pages or blocks, not token slots: not shortened");
    }
    st.trials = trials_ - before;
    res.stages.push_back(st);
  }

  // Stage 4: layers.
  {
    ShrinkStage st{"layers", src_.layers, src_.layers, 0, ""};
    const int before = trials_;
    if (layer && src_.layers > 0) {
      const int64_t k = *layer;
      if (k + 1 < src_.layers && !OutOfBudget()) {
        if (absl::Status s = WriteSlice(k + 1, o_.out_dir + "/model"); !s.ok()) {
          st.note = absl::StrCat("no slice: ", s.message());
        } else {
          Candidate c = cur;
          c.sliced = true;
          if (Judge(c) == Outcome::kFail) {
            cur = c;
            st.after = k + 1;
          } else {
            st.note = absl::StrCat("a slice of layers 0..", k, " does not fail the same way: the full model is kept");
          }
        }
      } else if (k + 1 >= src_.layers) {
        st.note = absl::StrCat("the failure is in the last layer (", k, ")");
      }
    } else if (src_.layers <= 0) {
      st.note = "the model's layer count is not known (no config.json recorded or found)";
    } else {
      st.note =
          absl::StrCat("the failure (", target_.kernel.empty() ? "no kernel" : target_.kernel, ") is in no layer");
    }
    if (!cur.sliced) {
      std::error_code ec;
      fs::remove_all(o_.out_dir + "/model", ec);
    }
    st.trials = trials_ - before;
    res.stages.push_back(st);
  }

  // Stage 5: weights - the same tensors with values drawn from the seed
  // (make-model --like the checkpoint or its slice), kept when the failure
  // survives them: the repro then needs the config files and the seed, not
  // the checkpoint.
  {
    ShrinkStage st{"weights", 0, 0, 0, ""};
    const int before = trials_;
    const std::string like_dir = o_.out_dir + "/model-config";
    Candidate c = cur;
    c.random_weights = true;
    absl::Status made = OutOfBudget() ? absl::ResourceExhaustedError("the trial budget is spent")
                                      : WriteRandomModel(c, o_.out_dir + "/model-random");
    absl::StatusOr<replay::LoadedCheckpoint> held =
        replay::LoadCheckpointDir(cur.sliced ? slice_dir_ : src_.checkpoint, {true});
    st.before = st.after = held.ok() ? static_cast<int64_t>(held->tensors.size()) : 0;
    if (made.ok() && Judge(c) == Outcome::kFail) {
      cur = c;
      st.after = 0;
      // The drawn model takes the slice's place as OUT/model.
      std::error_code ec;
      fs::remove_all(o_.out_dir + "/model", ec);
      fs::rename(random_dir_, o_.out_dir + "/model", ec);
      if (ec) return absl::InternalError(absl::StrCat("cannot move ", random_dir_, " to model/: ", ec.message()));
      random_dir_ = o_.out_dir + "/model";
    } else {
      st.note = made.ok() ? "random values of the same tensors do not fail the same way: the checkpoint's are kept"
                          : absl::StrCat("not tried: ", made.message());
      res.needs["weights"] = st.note;
      std::error_code ec;
      fs::remove_all(o_.out_dir + "/model-random", ec);
      fs::remove_all(like_dir, ec);
    }
    st.trials = trials_ - before;
    res.stages.push_back(st);
  }

  // Stage 6: token ids.
  {
    std::vector<Occurrence> occ;
    if (absl::Status s = Write(cur, o_.out_dir + "/capture", &occ); !s.ok()) return s;
    ShrinkStage st{"token_ids", static_cast<int64_t>(occ.size()), static_cast<int64_t>(occ.size()), 0, ""};
    const int before = trials_;
    if (!o_.anonymize) {
      st.note = "--no-anonymize: the original ids are kept";
    } else if (against_recording) {
      // An id replaced in an earlier step changes what the failing step
      // reads from the KV cache, and so its departure from the recording,
      // whatever the configuration: every id is needed.
      st.note = "the failure is a departure from the recording of these tokens: every id is kept";
      res.needs["token_ids"] = "all (the failure is a departure from the recording of these tokens)";
    } else if (src_.vocab <= 0) {
      st.note = "the capture records no vocabulary size: ids are kept";
      res.needs["token_ids"] = "all (no vocabulary size recorded)";
    } else if (!occ.empty()) {
      auto candidate = [&](const ChangeSet& set) {
        Candidate c = cur;
        c.keep_token.assign(occ.size(), false);
        for (size_t i : set) c.keep_token[i] = true;
        return c;
      };
      StageOracle oracle = OracleOf([&](const ChangeSet& set) -> std::optional<Candidate> { return candidate(set); });
      ChangeSet keep;
      const std::vector<Outcome> none = oracle.Test({ChangeSet{}});
      if (none[0] == Outcome::kFail) {
        keep = {};
      } else {
        const bisect::DdResult dd = bisect::IsolateCulprit(occ.size(), oracle);
        if (dd.complete) {
          keep = dd.culprit;
        } else if (oracle.smallest_failing()) {
          keep = *oracle.smallest_failing();
          res.minimal = false;
        } else {
          for (size_t i = 0; i < occ.size(); ++i) keep.push_back(i);
          res.minimal = false;
          st.note = "trial budget reached: every original id is kept";
        }
      }
      cur = candidate(keep);
      st.after = static_cast<int64_t>(keep.size());
      nlohmann::json ids = nlohmann::json::array();
      for (size_t i : keep) ids.push_back({{"step", occ[i].step}, {"position", occ[i].position}, {"id", occ[i].id}});
      res.needs["token_ids"] = ids;
    }
    st.trials = trials_ - before;
    res.stages.push_back(st);
  }

  // The result: written once more as it stands, and checked to fail.
  res.capture_dir = o_.out_dir + "/capture";
  if (absl::Status s = Write(cur, res.capture_dir, nullptr); !s.ok()) return s;
  std::error_code ec;
  fs::remove_all(o_.out_dir + "/trials", ec);
  res.model_dir = cur.sliced || cur.random_weights ? o_.out_dir + "/model" : "";
  if (!cur.sliced && !cur.random_weights) res.needs["checkpoint"] = src_.checkpoint;
  if (cur.random_weights) {
    res.model_config_dir = o_.out_dir + "/model-config";
    res.regenerate_command = bisect::ShellJoin(
        {"crashreplay", "make-model", "model", "--like", "model-config", "--seed", absl::StrCat(o_.seed)});
  }
  if (!o_.anonymize) res.needs["request_ids"] = "kept (--no-anonymize)";
  // The shrunk capture judged again, repeat + confirm runs in all: what the
  // README promises rests on more than one run of a failure that may be
  // flaky.
  {
    const Config final_config = {{"capture", ConfigValue::String(res.capture_dir)},
                                 {"model", ConfigValue::String(OwnModel(cur))}};
    const bisect::TrialResult r = scheduler_.Confirm({final_config})[0];
    res.confirm_runs = r.runs;
    res.confirm_failed = r.verdict == bisect::Verdict::kBad && bisect::SameBug(r.signature, target_) ? r.runs
                         : r.verdict == bisect::Verdict::kFlaky                                      ? r.bad_runs
                                                                                                     : 0;
    Say(absl::StrCat("the shrunk capture failed the same way in ", res.confirm_failed, " of ", res.confirm_runs,
                     " runs"));
  }
  res.trials = trials_;
  res.bytes_after = PathBytes(res.capture_dir);
  std::vector<std::string> cmd = {"crashreplay", "replay", "capture", "--json"};
  cmd.insert(cmd.end(), o_.replay_args.begin(), o_.replay_args.end());
  if (cur.sliced || cur.random_weights) {
    cmd.insert(cmd.end(), {"--model", "model"});
  } else if (!o_.model_dir.empty()) {
    cmd.insert(cmd.end(), {"--model", o_.model_dir});
  }
  res.replay_command = bisect::ShellJoin(cmd);
  return res;
}

}  // namespace

nlohmann::json ShrinkResult::ToJson() const {
  nlohmann::json j;
  j["target"] = bisect::SignatureToJson(target);
  j["stages"] = nlohmann::json::array();
  for (const ShrinkStage& s : stages) {
    nlohmann::json e = {{"stage", s.stage}, {"before", s.before}, {"after", s.after}, {"trials", s.trials}};
    if (!s.note.empty()) e["note"] = s.note;
    j["stages"].push_back(e);
  }
  j["trials"] = trials;
  j["minimal"] = minimal;
  j["confirmed"] = {{"runs", confirm_runs}, {"failed_same_way", confirm_failed}};
  j["bytes"] = {{"before", bytes_before}, {"after", bytes_after}};
  j["capture"] = "capture";
  if (!model_dir.empty() && model_config_dir.empty()) j["model"] = "model";
  if (!model_config_dir.empty()) {
    j["model_config"] = "model-config";
    j["regenerate_command"] = regenerate_command;
  }
  j["replay_command"] = replay_command;
  j["needs"] = needs.is_null() ? nlohmann::json::object() : needs;
  return j;
}

absl::StatusOr<ShrinkResult> Shrink(const ShrinkOptions& o) {
  CR_ASSIGN_OR_RETURN(replay::LoadedCapture cap, replay::LoadCapture(o.capture));
  Source src;
  src.reader = cap.reader;
  src.manifest = cap.manifest;
  for (const StepRecord& s : src.reader->steps()) {
    if (s.rank == src.manifest.parallel.rank) src.steps.push_back(&s);
    for (const std::string& id : s.request_ids) {
      if (!id.empty()) src.request_ids.insert(id);
    }
  }
  for (const FailureRecord& f : src.reader->failures()) {
    if (f.rank == src.manifest.parallel.rank && src.failure == nullptr) src.failure = &f;
  }
  src.checkpoint = o.model_dir.empty() ? cap.manifest.model.checkpoint_path : o.model_dir;
  if (src.checkpoint.empty()) {
    return absl::InvalidArgumentError("the capture records no checkpoint path: give it with --model DIR");
  }
  std::error_code ec;
  src.checkpoint = fs::absolute(src.checkpoint, ec).lexically_normal().string();
  src.vocab = cap.manifest.model.vocab_size;
  src.layers = cap.manifest.model.num_layers;
  // The recorded config.json, else the checkpoint's (a recorder that kept
  // only the path).
  std::string config_text = cap.manifest.model.config_json;
  if (config_text.empty()) {
    std::ifstream in(src.checkpoint + "/config.json");
    std::stringstream ss;
    ss << in.rdbuf();
    config_text = ss.str();
  }
  const nlohmann::json cfg = nlohmann::json::parse(config_text, nullptr, false);
  if (cfg.is_object()) {
    const nlohmann::json& text =
        cfg.contains("text_config") && cfg["text_config"].is_object() ? cfg["text_config"] : cfg;
    if (src.vocab == 0 && text.contains("vocab_size") && text["vocab_size"].is_number_integer()) {
      src.vocab = text["vocab_size"].get<int64_t>();
    }
    if (src.layers == 0 && text.contains("num_hidden_layers") && text["num_hidden_layers"].is_number_integer()) {
      src.layers = text["num_hidden_layers"].get<int64_t>();
    }
  }
  fs::create_directories(o.out_dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("-o ", o.out_dir, ": ", ec.message()));
  Shrinker s(o, std::move(src));
  return s.Run();
}

}  // namespace crashreplay::tools
