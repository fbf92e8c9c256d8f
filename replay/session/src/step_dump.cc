#include "crashreplay/replay/session/step_dump.h"

#include <fnmatch.h>

#include <nlohmann/json.hpp>

#include "crashreplay/base/text.h"

namespace crashreplay::replay {

using text::Cat;

absl::StatusOr<KernelPatterns> KernelPatterns::Parse(std::string_view text) {
  KernelPatterns p;
  if (text.empty()) return p;
  for (std::string_view piece : text::Split(text, ',')) {
    const std::string_view pat = text::Strip(piece);
    if (pat.empty()) {
      return absl::InvalidArgumentError(Cat("--dump-kernels '", text, "': an empty pattern between commas"));
    }
    p.patterns_.emplace_back(pat);
  }
  return p;
}

bool KernelPatterns::Matches(std::string_view label) const {
  if (patterns_.empty()) return true;
  const std::string l(label);
  for (const std::string& p : patterns_) {
    if (::fnmatch(p.c_str(), l.c_str(), 0) == 0) return true;
  }
  return false;
}

absl::Status KernelPatterns::CheckAgainst(const std::vector<std::string>& labels) const {
  std::vector<std::string> unmatched;
  for (const std::string& p : patterns_) {
    bool any = false;
    for (const std::string& l : labels) any = any || ::fnmatch(p.c_str(), l.c_str(), 0) == 0;
    if (!any) unmatched.push_back(p);
  }
  if (unmatched.empty()) return absl::OkStatus();
  std::string names;
  for (const std::string& p : unmatched) names += (names.empty() ? "'" : ", '") + p + "'";
  // Show the start of the list, one layer's worth and the tail, so the
  // naming is clear whatever the depth of the model.
  std::string some;
  const size_t head = 12, tail = 6;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i == head && labels.size() > head + tail) {
      some += ", ...";
      i = labels.size() - tail;
    }
    some += (some.empty() ? "" : ", ") + labels[i];
  }
  return absl::InvalidArgumentError(
      Cat("--dump-kernels: ", names, unmatched.size() == 1 ? " matches" : " match",
          " no kernel of this step. Kernels are named L<layer>.<kernel> inside a layer and <kernel> outside "
          "(globs with * ? [...], comma-separated); this step's ",
          labels.size(), " kernels: ", some));
}

std::string DumpFileName(int64_t step, int rank) { return Cat("step", step, ".rank", rank, ".safetensors"); }

void StepDump::AfterKernel(const StepProgram& program, size_t index) {
  const KernelCall& call = program.kernels()[index];
  const KernelRecord& rec = program.records()[index];
  if (ran_.empty()) {
    mode_ = ForwardModeName(program.input().mode);
    for (const StepRow& r : program.input().rows) request_ids_.push_back(r.request_id);
  }
  ran_.push_back(rec.label);
  complete_ = index + 1 == program.kernels().size() && !rec.failed;
  if (rec.failed) fault_kernel_ = rec.label;
  if (!patterns_.Matches(rec.label) || !status_.ok()) return;
  dumped_.push_back(rec.label);
  digests_.emplace_back(rec.label, rec.digest.Hex());
  for (const std::string& out : call.outputs) {
    const Buffer* b = program.buffer(out);
    if (b == nullptr) continue;  // the KV cache
    status_.Update(writer_.Add(Cat(rec.label, ".", out),
                               b->is_bytes ? DType::kU8
                               : b->is_int ? DType::kI32
                                           : DType::kF32,
                               b->shape,
                               std::span<const std::byte>(static_cast<const std::byte*>(b->data()), b->bytes())));
  }
}

absl::Status StepDump::Write(const std::string& path, const DumpContext& ctx, const ReplayReport& report) {
  if (!status_.ok()) return absl::InternalError(Cat(path, ": ", status_.message()));
  nlohmann::json config = nlohmann::json::object();
  for (const auto& [k, v] : ctx.config) config[k] = v;
  nlohmann::json digests = nlohmann::json::object();
  for (const auto& [k, v] : digests_) digests[k] = v;
  writer_.SetMetadata("format", "crashreplay.step_dump/1");
  writer_.SetMetadata("capture", ctx.capture);
  writer_.SetMetadata("step", std::to_string(ctx.step));
  writer_.SetMetadata("rank", std::to_string(ctx.rank));
  writer_.SetMetadata("mode", mode_);
  writer_.SetMetadata("request_ids", nlohmann::json(request_ids_).dump());
  writer_.SetMetadata("config", config.dump());
  writer_.SetMetadata("start", ctx.start);
  writer_.SetMetadata("outcome", report.outcome);
  writer_.SetMetadata("detail", report.detail);
  writer_.SetMetadata("complete", complete_ ? "true" : "false");
  writer_.SetMetadata("kernel_order", nlohmann::json(ran_).dump());
  writer_.SetMetadata("kernels", nlohmann::json(dumped_).dump());
  writer_.SetMetadata("digests", digests.dump());
  if (report.fault) {
    writer_.SetMetadata("fault", report.fault->Signature());
    writer_.SetMetadata("fault_message", report.fault->message);
    // Empty when the fault fired in an earlier step (or the memory plan):
    // then no kernel of this step ran.
    writer_.SetMetadata("fault_kernel", fault_kernel_);
  }
  if (absl::Status s = writer_.Write(path); !s.ok()) {
    return absl::Status(s.code(), Cat("cannot write the dump ", path, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace crashreplay::replay
