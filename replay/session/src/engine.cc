#include "crashreplay/replay/session/engine.h"

#include <algorithm>
#include <deque>
#include <set>

#include "crashreplay/base/text.h"
#include "crashreplay/replay/model/shared_expert_fusion.h"
#include "crashreplay/replay/session/backends.h"

namespace crashreplay::replay {

using text::Cat;

int64_t PagesNeeded(const std::vector<Request>& requests, int page_size) {
  int64_t n = 0;
  for (const Request& r : requests) {
    n += (static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens + page_size - 1) / page_size;
  }
  return n;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<Model> model, const EngineConfig& config,
                                                       int threads, int64_t max_pool_pages) {
  auto exec = MakeExecutor(config.device, ExecMode::kKernelByKernel, threads);
  if (!exec.ok()) return exec.status();
  return Create(std::move(model), config, std::move(*exec), max_pool_pages);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<Model> model, const EngineConfig& config,
                                                       std::unique_ptr<Executor> executor, int64_t max_pool_pages) {
  std::unique_ptr<Engine> e(new Engine(std::move(model), config));
  e->exec_ = std::move(executor);
  e->plan_ = PlanMemory(*e->model_, e->config_);
  // The fused tensor is built while the weights load, before graph capture.
  if (config.shared_experts_fusion) {
    if (std::optional<Fault> f = CheckSharedExpertFusion(*e->model_)) e->plan_.fault = std::move(f);
  }
  if (e->plan_.fault) return e;
  // The device itself may hold less than the recorded one: a failed upload
  // or pool allocation is an out-of-memory at load, as on a real server.
  auto device_oom = [&](const absl::Status& s, const char* what) {
    Fault f;
    f.klass = absl::IsResourceExhausted(s) ? "oom" : "error";
    f.stage = "load";
    f.kernel = "device_allocator";
    f.check = what;
    f.message = Cat("loading on ", e->exec_->name(), ": ", what, ": ", s.message());
    e->plan_.fault = f;
  };
  const bool stream = e->model_->streaming() || config.weights == WeightResidency::kStream;
  auto dm = stream ? DeviceModel::UploadStreaming(*e->model_, e->exec_.get())
                   : DeviceModel::Upload(*e->model_, e->exec_.get());
  if (!dm.ok() && absl::IsResourceExhausted(dm.status()) && config.weights == WeightResidency::kAuto && !stream) {
    e->notes_.push_back(Cat("weights=auto: the weights do not fit in ", e->exec_->name(), "'s memory (",
                            dm.status().message(), "); streaming them one layer at a time"));
    dm = DeviceModel::UploadStreaming(*e->model_, e->exec_.get());
  }
  if (!dm.ok()) {
    device_oom(dm.status(), "weights_fit_device");
    return e;
  }
  e->device_model_ = std::move(*dm);
  auto kv = KvCache::Create(*e->model_, e->config_, std::min(e->plan_.pool_pages, std::max<int64_t>(max_pool_pages, 1)),
                            e->exec_.get());
  if (!kv.ok()) {
    device_oom(kv.status(), "kv_pool_fits_device");
    return e;
  }
  e->kv_ = std::move(*kv);
  return e;
}

std::unique_ptr<StepProgram> Engine::Prepare(const StepInput& input) {
  if (plan_.fault) return StepProgram::Failed(exec_.get(), input, *plan_.fault);
  std::unique_ptr<StepProgram> p = StepProgram::Lower(*device_model_, config_, kv_.get(), input);
  if (device_model_->streaming()) p->set_streaming(device_model_.get());
  return p;
}

absl::Status Engine::RestoreState(const StepState& state, const StepInput& input) {
  if (!kv_) return absl::FailedPreconditionError("the memory plan failed: there is no KV cache to restore into");
  return replay::RestoreState(state, input, kv_.get());
}

namespace {

struct Running {
  const Request* req;
  std::vector<int32_t> pages;
  std::vector<int32_t> generated;
};

class PageAllocator {
 public:
  explicit PageAllocator(int64_t pages) {
    for (int64_t p = 0; p < pages; ++p) free_.insert(static_cast<int32_t>(p));
  }
  // Grows `pages` to cover `tokens` tokens; false if the pool is exhausted.
  bool Cover(std::vector<int32_t>* pages, int64_t tokens, int page_size) {
    while (static_cast<int64_t>(pages->size()) * page_size < tokens) {
      if (free_.empty()) return false;
      pages->push_back(*free_.begin());
      free_.erase(free_.begin());
    }
    return true;
  }
  void Release(const std::vector<int32_t>& pages) { free_.insert(pages.begin(), pages.end()); }

 private:
  std::set<int32_t> free_;
};

}  // namespace

RunResult Engine::Run(const std::vector<Request>& requests, StepObserver* observer) {
  RunResult result;
  result.plan = plan_;
  if (plan_.fault) {
    result.fault = plan_.fault;
    return result;
  }
  const int ps = config_.page_size;
  PageAllocator pages(kv_->pages());
  std::deque<const Request*> waiting;
  for (const Request& r : requests) waiting.push_back(&r);
  std::vector<Running> running;
  int64_t step = 0;
  auto exhausted = [&](const char* stage, int64_t need) {
    Fault f;
    f.klass = "oom";
    f.stage = stage;
    f.kernel = "scheduler";
    f.check = "kv_pool_has_free_pages";
    f.step = step;
    f.index = need;
    f.value = static_cast<double>(kv_->pages());
    f.message = Cat("step ", step, " (", stage, "): the KV pool of ", kv_->pages(), " pages has no free page for ",
                    need, " tokens; lower the load or raise mem_fraction_static");
    result.fault = f;
  };
  while (!waiting.empty() || !running.empty()) {
    StepInput in;
    in.step = step;
    std::vector<size_t> row_running;  // index into `running` for each row
    if (!waiting.empty() && static_cast<int>(running.size()) < config_.max_running_requests) {
      in.mode = ForwardMode::kPrefill;
      while (!waiting.empty() && static_cast<int>(running.size()) < config_.max_running_requests) {
        Running r{waiting.front(), {}, {}};
        if (!pages.Cover(&r.pages, static_cast<int64_t>(r.req->prompt.size()), ps)) {
          if (in.rows.empty() && running.empty()) {
            exhausted("prefill", static_cast<int64_t>(r.req->prompt.size()));
            return result;
          }
          pages.Release(r.pages);
          break;  // wait for running requests to finish
        }
        waiting.pop_front();
        StepRow row;
        row.request_id = r.req->id;
        row.tokens = r.req->prompt;
        row.start_pos = 0;
        row.page_table = r.pages;
        row.sampling = r.req->sampling;
        row.sample_offset = 0;
        in.rows.push_back(std::move(row));
        running.push_back(std::move(r));
        row_running.push_back(running.size() - 1);
      }
    }
    if (in.rows.empty()) {
      in.mode = ForwardMode::kDecode;
      for (size_t i = 0; i < running.size(); ++i) {
        Running& r = running[i];
        const int64_t len = static_cast<int64_t>(r.req->prompt.size() + r.generated.size());
        if (!pages.Cover(&r.pages, len, ps)) {
          exhausted("decode", len);
          return result;
        }
        StepRow row;
        row.request_id = r.req->id;
        row.tokens = {r.generated.back()};
        row.start_pos = len - 1;
        row.page_table = r.pages;
        row.sampling = r.req->sampling;
        row.sample_offset = r.generated.size();
        in.rows.push_back(std::move(row));
        row_running.push_back(i);
      }
    }
    if (observer) {
      observer->StateBeforeStep(in, *kv_);
      observer->BeforeStep(in);
    }
    std::unique_ptr<StepProgram> prog = Prepare(in);
    prog->RunAll();
    if (observer) observer->AfterStep(*prog);
    result.last_step_kernels = prog->records();
    result.first_nonfinite = prog->first_nonfinite();
    StepSummary sum;
    sum.step = step;
    sum.mode = in.mode;
    sum.rows = static_cast<int64_t>(in.rows.size());
    for (const StepRow& r : in.rows) sum.tokens += static_cast<int64_t>(r.tokens.size());
    sum.activation_bytes = prog->activation_bytes();
    if (prog->fault()) {
      result.fault = prog->fault();
      result.steps.push_back(sum);
      return result;
    }
    sum.digest = prog->Digest();
    sum.sampled = prog->SampledTokens();
    result.steps.push_back(sum);
    for (size_t i = 0; i < row_running.size(); ++i) running[row_running[i]].generated.push_back(sum.sampled[i]);
    std::vector<Running> still;
    for (Running& r : running) {
      if (static_cast<int64_t>(r.generated.size()) >= r.req->max_new_tokens) {
        result.outputs[r.req->id] = r.generated;
        pages.Release(r.pages);
      } else {
        still.push_back(std::move(r));
      }
    }
    running = std::move(still);
    step += 1;
  }
  return result;
}

}  // namespace crashreplay::replay
