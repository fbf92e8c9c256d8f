// StepProgram's execution side: running kernels on the executor, the
// watcher, faults, and buffer access. The lowering is in step_lower.cc.
#include "crashreplay/replay/program/step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"
#include "crashreplay/replay/config/kernel_archs.h"
#include "value_stats.h"

namespace crashreplay::replay {

using text::Cat;

const char* ForwardModeName(ForwardMode m) { return m == ForwardMode::kPrefill ? "prefill" : "decode"; }

// ---- KvCache -------------------------------------------------------------------

absl::StatusOr<uint8_t*> KvCache::NewPlane(Pool* pool) {
  const size_t bytes = static_cast<size_t>(pages_) * pool->page_bytes;
  CR_ASSIGN_OR_RETURN(void* p, mem_.Alloc(bytes));
  CR_RETURN_IF_ERROR(mem_.exec()->Fill(p, 0, bytes));
  pool->planes.push_back(static_cast<uint8_t*>(p));
  return static_cast<uint8_t*>(p);
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const Model& m, const EngineConfig& c, int64_t pages,
                                                         Executor* exec) {
  std::unique_ptr<KvCache> kv(new KvCache(exec));
  kv->pages_ = pages;
  kv->page_size_ = c.page_size;
  kv->fp8_ = c.kv_cache_dtype == KvCacheDType::kFp8E4m3;
  const int32_t ps = static_cast<int32_t>(c.page_size);
  const MlaSpec& mla = m.spec.mla;
  if (!mla.enabled()) {
    const int64_t heads = m.kv_heads_local, hd = m.spec.head_dim;
    const DType dt = kv->fp8_ ? DType::kF8E4M3 : DType::kBF16;
    const size_t pb = static_cast<size_t>(ps) * heads * hd * (kv->fp8_ ? 1 : 2);
    kv->pools_ = {Pool{"k", dt, {ps, heads, hd}, pb, {}}, Pool{"v", dt, {ps, heads, hd}, pb, {}}};
    for (int64_t l = 0; l < m.spec.layers; ++l) {
      std::vector<KvPoolView> views;
      for (int r = 0; r < m.tp; ++r) {
        CR_ASSIGN_OR_RETURN(uint8_t* k, kv->NewPlane(&kv->pools_[0]));
        CR_ASSIGN_OR_RETURN(uint8_t* v, kv->NewPlane(&kv->pools_[1]));
        views.push_back(KvPoolView{k, v, kv->fp8_, pages, ps, static_cast<int32_t>(heads), static_cast<int32_t>(hd)});
      }
      CR_ASSIGN_OR_RETURN(KvPoolView * p, kv->mem_.Copy(views));
      kv->views_.push_back(p);
    }
    return kv;
  }
  const int32_t lora = static_cast<int32_t>(mla.kv_lora_rank), rope = static_cast<int32_t>(mla.qk_rope_head_dim);
  const int32_t tb = LatentTokenBytes(kv->fp8_, lora, rope);
  Pool latent{"latent",
              kv->fp8_ ? DType::kU8 : DType::kBF16,
              {ps, kv->fp8_ ? tb : lora + rope},
              static_cast<size_t>(ps) * tb,
              {},
              m.tp};
  kv->pools_.push_back(std::move(latent));
  const bool index_fp8 = c.index_cache_dtype == KvCacheDType::kFp8E4m3;
  const int32_t idim = static_cast<int32_t>(mla.index_head_dim);
  if (mla.dsa()) {
    const int64_t ipb = IndexPageBytes(index_fp8, ps, idim);
    Pool index{"index_k",
               index_fp8 ? DType::kU8 : DType::kBF16,
               index_fp8 ? std::vector<int64_t>{ipb} : std::vector<int64_t>{ps, idim},
               static_cast<size_t>(ipb),
               {},
               m.tp};
    kv->pools_.push_back(std::move(index));
  }
  for (int64_t l = 0; l < m.spec.layers; ++l) {
    std::vector<LatentPoolView> views;
    for (int r = 0; r < m.tp; ++r) {
      CR_ASSIGN_OR_RETURN(uint8_t* p, kv->NewPlane(&kv->pools_[0]));
      views.push_back(LatentPoolView{p, kv->fp8_, pages, ps, lora, rope, tb});
    }
    CR_ASSIGN_OR_RETURN(LatentPoolView * lv, kv->mem_.Copy(views));
    kv->latent_views_.push_back(lv);
    if (!mla.dsa()) continue;
    if (!mla.layer_has_indexer(l)) {
      kv->index_views_.push_back(nullptr);
      continue;
    }
    std::vector<IndexPoolView> iv;
    for (int r = 0; r < m.tp; ++r) {
      CR_ASSIGN_OR_RETURN(uint8_t* p, kv->NewPlane(&kv->pools_[1]));
      iv.push_back(IndexPoolView{p, index_fp8, pages, ps, idim});
    }
    CR_ASSIGN_OR_RETURN(IndexPoolView * ip, kv->mem_.Copy(iv));
    kv->index_views_.push_back(ip);
  }
  return kv;
}

absl::Status KvCache::CopyPages(const std::vector<int32_t>& pages, std::vector<std::vector<uint8_t>>* out) const {
  out->clear();
  Executor* exec = mem_.exec();
  for (const Pool& pool : pools_) {
    const size_t pb = pool.page_bytes;
    std::vector<uint8_t> bytes(pool.planes.size() * pages.size() * pb);
    for (size_t plane = 0; plane < pool.planes.size(); ++plane) {
      for (size_t i = 0; i < pages.size(); ++i) {
        const size_t dst = (plane * pages.size() + i) * pb, src = static_cast<size_t>(pages[i]) * pb;
        CR_RETURN_IF_ERROR(exec->CopyToHost(bytes.data() + dst, pool.planes[plane] + src, pb));
      }
    }
    out->push_back(std::move(bytes));
  }
  return absl::OkStatus();
}

absl::Status KvCache::WritePages(const std::vector<int32_t>& pages, const std::vector<std::vector<uint8_t>>& in) {
  Executor* exec = mem_.exec();
  for (size_t k = 0; k < pools_.size(); ++k) {
    const Pool& pool = pools_[k];
    const size_t pb = pool.page_bytes;
    for (size_t plane = 0; plane < pool.planes.size(); ++plane) {
      for (size_t i = 0; i < pages.size(); ++i) {
        const size_t src = (plane * pages.size() + i) * pb, dst = static_cast<size_t>(pages[i]) * pb;
        CR_RETURN_IF_ERROR(exec->CopyToDevice(pool.planes[plane] + dst, in[k].data() + src, pb));
      }
    }
  }
  return absl::OkStatus();
}

// ---- StepProgram: building -----------------------------------------------------

std::unique_ptr<StepProgram> StepProgram::Lower(const DeviceModel& model, const EngineConfig& config, KvCache* kv,
                                                StepInput input) {
  std::unique_ptr<StepProgram> p(new StepProgram(model.exec(), std::move(input)));
  absl::Status s = p->Build(model, config, kv);
  if (s.ok()) p->NameLibraries(config, model.model().spec);
  if (s.ok()) p->StoreActivations(config.activation_dtype);
  if (s.ok()) p->AssignBoundaries();
  if (!s.ok()) {
    p->kernels_.clear();
    p->status_ = s;
    Fault f;
    f.klass = absl::IsResourceExhausted(s) ? "oom" : "error";
    f.stage = ForwardModeName(p->input_.mode);
    f.kernel = "step_buffers";
    f.check = absl::IsResourceExhausted(s) ? "device_allocation" : "device_error";
    f.step = p->input_.step;
    f.message = Cat("step ", p->input_.step, " (", f.stage, "): allocating the step's buffers on ", p->exec_->name(),
                    " failed: ", s.message());
    p->fault_ = f;
  }
  return p;
}

std::unique_ptr<StepProgram> StepProgram::Failed(Executor* exec, StepInput input, Fault fault) {
  std::unique_ptr<StepProgram> p(new StepProgram(exec, std::move(input)));
  p->fault_ = std::move(fault);
  p->status_ = absl::FailedPreconditionError(p->fault_->message);
  return p;
}

absl::StatusOr<StepProgram::Buf*> StepProgram::Alloc(const std::string& name, std::vector<int64_t> shape, bool is_int,
                                                     bool is_bytes) {
  Buf& b = bufs_[name];
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  b.shape = std::move(shape);
  b.count = n;
  b.is_int = is_int;
  b.is_bytes = is_bytes;
  CR_ASSIGN_OR_RETURN(b.p, mem_.Alloc(b.size()));
  CR_RETURN_IF_ERROR(exec_->Fill(b.p, 0, b.size()));
  Buffer& m = mirror_[name];
  m.is_int = is_int;
  m.is_bytes = is_bytes;
  m.shape = b.shape;
  const void* host = b.p;
  if (!exec_->host_visible()) {
    std::vector<uint8_t>& copy = host_copy_[name];
    copy.assign(b.size(), 0);
    host = copy.data();
  }
  const size_t count = static_cast<size_t>(n);
  m.f = {};
  m.i = {};
  m.u8 = {};
  if (is_bytes) {
    m.u8 = {static_cast<const uint8_t*>(host), count};
  } else if (is_int) {
    m.i = {static_cast<const int32_t*>(host), count};
  } else {
    m.f = {static_cast<const float*>(host), count};
  }
  return &b;
}

void StepProgram::Add(std::string name, int layer, std::vector<std::string> outputs, int64_t tokens_per_rank,
                      std::vector<Op> ops) {
  kernels_.push_back(KernelCall{std::move(name), layer, std::move(outputs), tokens_per_rank, std::move(ops), {}, {}});
}

const Buffer* StepProgram::buffer(const std::string& name) const {
  auto it = mirror_.find(name);
  return it == mirror_.end() ? nullptr : &it->second;
}

// ---- StepProgram: running ------------------------------------------------------

absl::Status StepProgram::Mirror(const std::string& name) {
  if (exec_->host_visible()) return absl::OkStatus();  // the view is the buffer
  const Buf& b = bufs_.at(name);
  return exec_->CopyToHost(host_copy_.at(name).data(), b.p, b.size());
}

absl::Status StepProgram::Upload(const std::string& name, const void* data, size_t bytes) {
  const Buf& b = bufs_.at(name);
  if (bytes == 0) return absl::OkStatus();
  CR_RETURN_IF_ERROR(exec_->CopyToDevice(b.p, data, bytes));
  if (!exec_->host_visible()) std::memcpy(host_copy_.at(name).data(), data, bytes);
  return absl::OkStatus();
}

// Statistics and digest of a kernel's output buffers (as the host reads them).
void StepProgram::Watch(const KernelCall& k, KernelRecord* rec) {
  Hasher128 hasher;
  double sum_abs = 0;
  int64_t count = 0;
  bool first = true;
  for (const std::string& name : k.outputs) {
    const Buffer& b = mirror_.at(name);
    hasher.Update(b.data(), b.bytes());
    if (b.is_bytes) {  // quantized activations: hashed and counted, no value statistics
      rec->numel += static_cast<int64_t>(b.u8.size());
      continue;
    }
    const size_t n = b.is_int ? b.i.size() : b.f.size();
    rec->numel += static_cast<int64_t>(n);
    if (!b.is_int) {
      const ValueStats vs = SummarizeFloats(b.f.data(), n);
      rec->nan += vs.nan;
      rec->inf += vs.inf;
      if (vs.finite > 0) {
        rec->min = first ? vs.min : std::min<double>(rec->min, vs.min);
        rec->max = first ? vs.max : std::max<double>(rec->max, vs.max);
        rec->max_abs = std::max<double>(rec->max_abs, vs.max_abs);
        first = false;
        sum_abs += vs.sum_abs;
        count += vs.finite;
      }
      continue;
    }
    for (size_t i = 0; i < n; ++i) {  // token ids and other int32 outputs
      const double v = b.i[i];
      if (std::isnan(v)) {
        rec->nan += 1;
        continue;
      }
      if (std::isinf(v)) {
        rec->inf += 1;
        continue;
      }
      rec->min = first ? v : std::min(rec->min, v);
      rec->max = first ? v : std::max(rec->max, v);
      first = false;
      sum_abs += std::abs(v);
      rec->max_abs = std::max(rec->max_abs, std::abs(v));
      count += 1;
    }
  }
  rec->mean_abs = count ? sum_abs / count : 0.0;
  rec->digest = hasher.Digest();
}

// A launch that failed: a fired check (the executor's fault record names the
// kernel where it happened, which on an asynchronous GPU stream may be an
// earlier launch than the one that reported it), out of device memory, or
// another device error.
Fault StepProgram::DeviceFault(const KernelCall& k, const absl::Status& s) {
  Fault f;
  f.stage = ForwardModeName(input_.mode);
  f.step = input_.step;
  f.layer = k.layer;
  f.kernel = k.name;
  const std::optional<ExecFault>& ef = exec_->fault();
  if (absl::IsAborted(s) && ef.has_value()) {
    const KernelStatus& st = ef->status;
    const KernelCall* where = &k;
    for (const KernelCall& c : kernels_) {
      if (c.name == ef->tag.kernel && c.layer == ef->tag.layer) where = &c;
    }
    f.klass = "assert";
    f.kernel = ef->tag.kernel;
    f.layer = ef->tag.layer;
    f.check = CheckName(st.check);
    f.rank = where->tokens_per_rank > 0 ? static_cast<int>(st.item / where->tokens_per_rank) : -1;
    f.item = where->tokens_per_rank > 0 ? st.item % where->tokens_per_rank : st.item;
    f.index = st.index;
    f.value = st.value;
    f.message = Cat("step ", input_.step, " (", f.stage, "): kernel ", where->Label(), " check ", f.check, " failed",
                    f.rank >= 0 ? Cat(" on rank ", f.rank) : std::string(), " at item ", f.item, ": index ", f.index,
                    ", value ", f.value);
    if (!ef->device_error.empty()) f.message += Cat(" (", ef->device_error, ", surfaced in ", ef->surfaced_in, ")");
    return f;
  }
  f.klass = absl::IsResourceExhausted(s) ? "oom" : "error";
  f.check = absl::IsResourceExhausted(s) ? "device_allocation" : "device_error";
  f.message =
      Cat("step ", input_.step, " (", f.stage, "): kernel ", k.Label(), " on ", exec_->name(), ": ", s.message());
  return f;
}

// Which library kernel each of the step's kernels stands for (the kernel
// toggles), so RunNext can refuse one its library has no code for.
void StepProgram::NameLibraries(const EngineConfig& cfg, const ModelSpec& spec) {
  const bool decode = input_.mode == ForwardMode::kDecode;
  const bool dsa = spec.mla.dsa();  // attention over the indexer's selection
  arch_ = cfg.device_arch;
  page_size_ = cfg.page_size;
  for (KernelCall& k : kernels_) {
    std::string_view lib = "any";
    if (k.name == "attention" && dsa) lib = decode ? cfg.dsa_kernel : cfg.dsa_prefill_kernel;
    if (k.name == "attention" && !dsa) lib = decode ? cfg.attention_kernel : cfg.prefill_attention_kernel;
    if (k.name == "indexer") lib = cfg.indexer_kernel;
    if (k.name == "experts") lib = cfg.moe_kernel;
    if (lib != "any") k.library = std::string(lib);
  }
}

// activation_dtype: every float output a kernel writes is stored (rounded in
// place) in the engine's activation dtype by one more op at the kernel's end,
// so the watcher, the next kernel and the fingerprints see the stored values.
// The sampler's probabilities stay fp32, as every engine's sampler keeps them.
void StepProgram::StoreActivations(ActivationDType dtype) {
  if (dtype == ActivationDType::kF32) return;
  stored_dtype_ = dtype == ActivationDType::kBf16 ? DType::kBF16 : DType::kF16;
  const StoreDType d = dtype == ActivationDType::kBf16 ? StoreDType::kBf16 : StoreDType::kF16;
  for (KernelCall& k : kernels_) {
    for (const std::string& name : k.outputs) {
      const Buf& b = bufs_.at(name);
      if (b.is_int || b.is_bytes || name == "probs") continue;
      StoreOp op;
      op.x = static_cast<float*>(b.p);
      op.n = b.count;
      op.dtype = d;
      k.ops.push_back(op);
    }
  }
}

// A kernel asked to run on an architecture its library has no code for fails
// before it launches, as the libraries' host-side dispatch does.
std::optional<Fault> StepProgram::ArchFault(const KernelCall& k) const {
  if (k.library.empty() || arch_ == 0) return std::nullopt;
  const KernelLibrary* lib = FindKernelLibrary(k.library);
  if (lib == nullptr || ArchSupported(*lib, arch_)) return std::nullopt;
  Fault f;
  f.klass = "unsupported_arch";
  f.stage = ForwardModeName(input_.mode);
  f.step = input_.step;
  f.kernel = k.name;
  f.layer = k.layer;
  f.check = Cat(k.library, "_on_", ArchName(arch_));
  f.value = arch_;
  f.message =
      Cat("step ", input_.step, " (", f.stage, "): kernel ", k.Label(), " is ", lib->what, ", which has code for ",
          ArchList(*lib), ", not ", ArchName(arch_), lib->refusal.empty() ? "" : Cat(" (\"", lib->refusal, "\")"));
  return f;
}

// The step's KV slots, checked before the first layer's cache write: a slot
// (pool page * page_size + offset) written by two requests of the step, or
// written by one while another's page table reads it at an earlier
// position, means the allocator handed one page to two live requests (the
// classic aliasing bug): each then attends over the other's keys. A real
// write kernel does not look; the replay does, once a step, and names both
// requests. Rows are scanned in batch order, so the first pair reported does
// not depend on threads.
std::optional<Fault> StepProgram::SlotFault(const KernelCall& k) const {
  if (k.layer != 0 || k.name != "kv_write" || page_size_ <= 0) return std::nullopt;
  const int64_t ps = page_size_;
  // slot -> (row, position) of its writer in this step
  std::map<int64_t, std::pair<size_t, int64_t>> writers;
  auto slot_of = [&](const StepRow& r, int64_t pos) -> std::optional<int64_t> {
    const int64_t page = pos / ps;
    if (page < 0 || page >= static_cast<int64_t>(r.page_table.size())) return std::nullopt;  // the page checks say so
    return static_cast<int64_t>(r.page_table[static_cast<size_t>(page)]) * ps + pos % ps;
  };
  auto name = [](const StepRow& r) {
    return r.request_name.empty() ? Cat(r.request_id) : Cat("'", r.request_name, "'");
  };
  auto fault = [&](const char* check, int64_t slot, const std::string& what) {
    Fault f;
    f.klass = "assert";
    f.stage = ForwardModeName(input_.mode);
    f.step = input_.step;
    f.kernel = k.name;
    f.layer = k.layer;
    f.check = check;
    f.index = slot;
    f.message = Cat("step ", input_.step, " (", f.stage, "): kernel ", k.Label(), ": KV slot ", slot, " (pool page ",
                    slot / ps, ", offset ", slot % ps, ") ", what);
    return f;
  };
  for (size_t i = 0; i < input_.rows.size(); ++i) {
    const StepRow& r = input_.rows[i];
    for (size_t t = 0; t < r.tokens.size(); ++t) {
      const int64_t pos = r.start_pos + static_cast<int64_t>(t);
      const std::optional<int64_t> slot = slot_of(r, pos);
      if (!slot) continue;
      auto [it, fresh] = writers.emplace(*slot, std::make_pair(i, pos));
      if (!fresh) {
        const StepRow& o = input_.rows[it->second.first];
        return fault(CheckName(Check::kKvSlotWrittenOnce), *slot,
                     Cat("is written by request ", name(o), " (position ", it->second.second, ") and by request ",
                         name(r), " (position ", pos, ") in the same step"));
      }
    }
  }
  for (size_t i = 0; i < input_.rows.size(); ++i) {
    const StepRow& r = input_.rows[i];
    for (int64_t pos = 0; pos < r.start_pos; ++pos) {
      const std::optional<int64_t> slot = slot_of(r, pos);
      if (!slot) continue;
      auto it = writers.find(*slot);
      if (it != writers.end() && it->second.first != i) {
        const StepRow& o = input_.rows[it->second.first];
        return fault(CheckName(Check::kKvSlotNotReadWhileWritten), *slot,
                     Cat("is read by request ", name(r), " (its position ", pos, ") while request ", name(o),
                         " writes it (position ", it->second.second, ") in the same step"));
      }
    }
  }
  return std::nullopt;
}

std::optional<Fault> StepProgram::HoldLayer(const KernelCall& k) {
  if (stream_ == nullptr || stream_->held() == k.layer) return std::nullopt;
  // The kernels of the layer held so far must be done with its weights
  // before they are released (a no-op on the CPU).
  if (next_ > 0) {
    absl::Status s = exec_->Synchronize();
    if (!s.ok()) {
      status_ = s;
      return DeviceFault(kernels_[next_ - 1], s);
    }
  }
  absl::Status s = stream_->Hold(k.layer);
  if (s.ok()) return std::nullopt;
  status_ = s;
  Fault f;
  f.klass = absl::IsResourceExhausted(s) ? "oom" : "error";
  f.stage = "load";
  f.step = input_.step;
  f.layer = k.layer;
  f.kernel = "layer_weights";
  f.check = "layer_weights_load";
  f.message = Cat("step ", input_.step, ": loading layer ", k.layer, "'s weights (layer streaming) for ", k.Label(),
                  " on ", exec_->name(), ": ", s.message());
  return f;
}

std::optional<Fault> StepProgram::RunNext() {
  if (done()) return fault_;
  const KernelCall& k = kernels_[next_];
  if (std::optional<Fault> f = HoldLayer(k)) {
    fault_ = std::move(f);
    return fault_;
  }
  KernelRecord rec;
  rec.label = k.Label();
  rec.name = k.name;
  rec.layer = k.layer;
  rec.checks = KernelChecks(k);
  std::optional<Fault> pre = ArchFault(k);
  if (!pre) pre = SlotFault(k);
  if (std::optional<Fault> f = std::move(pre)) {
    rec.failed = true;
    status_ = absl::FailedPreconditionError(f->message);
    fault_ = std::move(f);
    records_.push_back(std::move(rec));
    next_ += 1;
    return fault_;
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s;
  for (const Op& op : k.ops) {
    s = exec_->Launch(op, LaunchTag{k.name, k.layer});
    if (!s.ok()) break;
  }
  if (s.ok() && watch_) {
    for (const std::string& name : k.outputs) {
      s = Mirror(name);
      if (!s.ok()) break;
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  rec.micros = std::chrono::duration<double, std::micro>(t1 - t0).count();
  if (s.ok() || absl::IsAborted(s)) {
    // A fired check leaves the outputs as the kernel wrote them (a dump
    // shows them); on the CPU they are still readable.
    if (!s.ok() && watch_ && exec_->host_visible()) {
      for (const std::string& name : k.outputs) Mirror(name).IgnoreError();
    }
    if (watch_) Watch(k, &rec);
    // Fingerprints of the boundaries the kernel finished (not of a kernel
    // whose check fired: its outputs are partial).
    if (watch_ && fingerprint_ && s.ok()) {
      for (const Boundary& b : k.boundaries) fingerprints_.push_back(Summarize(b));
    }
  }
  if ((rec.nan || rec.inf) && first_nonfinite_.empty()) first_nonfinite_ = rec.label;
  if (!s.ok()) {
    rec.failed = true;
    status_ = s;
    fault_ = DeviceFault(k, s);
  }
  records_.push_back(std::move(rec));
  next_ += 1;
  return fault_;
}

std::optional<Fault> StepProgram::RunAll() {
  while (!done()) RunNext();
  if (!fault_ && stream_ != nullptr && !kernels_.empty()) {
    // Release the last layer held (the step normally ends outside the layers).
    KernelCall after;
    if (std::optional<Fault> f = HoldLayer(after)) fault_ = std::move(f);
  }
  if (!fault_) {
    absl::Status s = exec_->Synchronize();
    if (!s.ok() && !kernels_.empty()) {
      status_ = s;
      fault_ = DeviceFault(kernels_.back(), s);
    }
  }
  return fault_;
}

// Field names follow bisect's kernel table (bisect/kernel_table.h): name
// (the label, unique in a step), layer, numel, nan_count, inf_count, digest,
// max_abs; the rest are extra.
nlohmann::json KernelRecordToJson(const KernelRecord& r) {
  return nlohmann::json{{"name", r.label},    {"kernel", r.name},   {"layer", r.layer},         {"numel", r.numel},
                        {"nan_count", r.nan}, {"inf_count", r.inf}, {"digest", r.digest.Hex()}, {"max_abs", r.max_abs},
                        {"min", r.min},       {"max", r.max},       {"mean_abs", r.mean_abs},   {"micros", r.micros},
                        {"failed", r.failed}, {"checks", r.checks}};
}

std::vector<int32_t> StepProgram::SampledTokens() const {
  auto v = ReadInts("next_tokens");
  return v.ok() ? *v : std::vector<int32_t>{};
}

Hash128 StepProgram::Digest() const {
  Hasher128 h;
  auto logits = ReadFloats("logits");
  auto next = ReadInts("next_tokens");
  if (!logits.ok() || !next.ok()) return h.Digest();
  h.Update(logits->data(), logits->size() * 4);
  h.Update(next->data(), next->size() * 4);
  return h.Digest();
}

// ---- StepProgram: device-level buffer access ----------------------------------

absl::StatusOr<std::vector<float>> StepProgram::ReadFloats(const std::string& name) const {
  auto it = bufs_.find(name);
  if (it == bufs_.end() || it->second.is_int || it->second.is_bytes) {
    return absl::NotFoundError(Cat("no float buffer '", name, "'"));
  }
  std::vector<float> v(static_cast<size_t>(it->second.count));
  CR_RETURN_IF_ERROR(exec_->CopyToHost(v.data(), it->second.p, v.size() * 4));
  return v;
}

absl::StatusOr<std::vector<int32_t>> StepProgram::ReadInts(const std::string& name) const {
  auto it = bufs_.find(name);
  if (it == bufs_.end() || !it->second.is_int) return absl::NotFoundError(Cat("no int buffer '", name, "'"));
  std::vector<int32_t> v(static_cast<size_t>(it->second.count));
  CR_RETURN_IF_ERROR(exec_->CopyToHost(v.data(), it->second.p, v.size() * 4));
  return v;
}

absl::StatusOr<std::vector<uint8_t>> StepProgram::ReadBytes(const std::string& name) const {
  auto it = bufs_.find(name);
  if (it == bufs_.end() || !it->second.is_bytes) return absl::NotFoundError(Cat("no byte buffer '", name, "'"));
  std::vector<uint8_t> v(it->second.size());
  CR_RETURN_IF_ERROR(exec_->CopyToHost(v.data(), it->second.p, v.size()));
  return v;
}

absl::Status StepProgram::WriteFloats(const std::string& name, const std::vector<float>& v) {
  auto it = bufs_.find(name);
  if (it == bufs_.end() || it->second.is_int || it->second.is_bytes ||
      it->second.count != static_cast<int64_t>(v.size())) {
    return absl::InvalidArgumentError(Cat("no float buffer '", name, "' of ", v.size(), " elements"));
  }
  return exec_->CopyToDevice(it->second.p, v.data(), v.size() * 4);
}

absl::Status StepProgram::WriteInts(const std::string& name, const std::vector<int32_t>& v) {
  auto it = bufs_.find(name);
  if (it == bufs_.end() || !it->second.is_int || it->second.count != static_cast<int64_t>(v.size())) {
    return absl::InvalidArgumentError(Cat("no int buffer '", name, "' of ", v.size(), " elements"));
  }
  return exec_->CopyToDevice(it->second.p, v.data(), v.size() * 4);
}

absl::Status StepProgram::WriteBytes(const std::string& name, const std::vector<uint8_t>& v) {
  auto it = bufs_.find(name);
  if (it == bufs_.end() || !it->second.is_bytes || it->second.size() != v.size()) {
    return absl::InvalidArgumentError(Cat("no byte buffer '", name, "' of ", v.size(), " bytes"));
  }
  return exec_->CopyToDevice(it->second.p, v.data(), v.size());
}

bool StepProgram::IsIntBuffer(const std::string& name) const {
  auto it = bufs_.find(name);
  return it != bufs_.end() && it->second.is_int;
}

bool StepProgram::IsBytesBuffer(const std::string& name) const {
  auto it = bufs_.find(name);
  return it != bufs_.end() && it->second.is_bytes;
}

}  // namespace crashreplay::replay
