#include "capture_schema_codec.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "absl/strings/str_format.h"
#include "crashreplay/schema/capture.capnp.h"

namespace crashreplay::internal {
namespace {

namespace s = ::crashreplay::schema;

capnp::Text::Reader Txt(const std::string& v) { return capnp::Text::Reader(v.c_str(), v.size()); }
std::string Str(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

void SetHash(s::Hash128::Builder b, const Hash128& h) {
  b.setHi(h.high);
  b.setLo(h.low);
}
Hash128 GetHash(s::Hash128::Reader r) { return Hash128{r.getHi(), r.getLo()}; }

template <typename ListBuilder, typename T>
void FillInts(ListBuilder b, const std::vector<T>& v) {
  for (size_t i = 0; i < v.size(); ++i) b.set(static_cast<unsigned>(i), v[i]);
}
template <typename T, typename ListReader>
std::vector<T> ReadInts(ListReader r) {
  std::vector<T> out;
  out.reserve(r.size());
  for (auto v : r) out.push_back(v);
  return out;
}

// ---- build ------------------------------------------------------------------

void Build(s::TensorHash::Builder b, const TensorHash& v) {
  b.setName(Txt(v.name));
  SetHash(b.initHash(), v.hash);
  b.setByteSize(v.byte_size);
}

void Build(s::WeightShardHashes::Builder b, const WeightShardHashes& v) {
  b.setRank(v.rank);
  auto t = b.initTensors(static_cast<unsigned>(v.tensors.size()));
  for (size_t i = 0; i < v.tensors.size(); ++i) Build(t[static_cast<unsigned>(i)], v.tensors[i]);
  SetHash(b.initRoot(), v.root);
}

void Build(s::TensorDescriptor::Builder b, const TensorDescriptor& v) {
  b.setName(Txt(v.name));
  b.setDtype(Txt(v.dtype));
  FillInts(b.initShape(static_cast<unsigned>(v.shape.size())), v.shape);
  FillInts(b.initStrides(static_cast<unsigned>(v.strides.size())), v.strides);
  SetHash(b.initContentHash(), v.content_hash);
  b.setByteSize(v.byte_size);
  b.setStored(v.stored);
  b.setDevice(Txt(v.device));
}

template <typename ListBuilder>
void BuildTensors(ListBuilder l, const std::vector<TensorDescriptor>& v) {
  for (size_t i = 0; i < v.size(); ++i) Build(l[static_cast<unsigned>(i)], v[i]);
}

void Build(s::SessionManifest::Builder b, const SessionManifest& v) {
  b.setFormatMajor(kCaptureMajorVersion);
  b.setFormatMinor(kCaptureMinorVersion);
  b.setSessionId(Txt(v.session_id));
  b.setEngine(Txt(v.engine));
  b.setEngineVersion(Txt(v.engine_version));
  b.setRecorderVersion(Txt(v.recorder_version));
  b.setCreatedUnixNanos(v.created_unix_nanos);
  b.setHostname(Txt(v.hostname));
  b.setPid(v.pid);
  auto m = b.initModel();
  m.setConfigJson(Txt(v.model.config_json));
  m.setModelType(Txt(v.model.model_type));
  m.setArchitecture(Txt(v.model.architecture));
  m.setNumLayers(v.model.num_layers);
  m.setHiddenSize(v.model.hidden_size);
  m.setVocabSize(v.model.vocab_size);
  m.setNumHeads(v.model.num_heads);
  m.setNumKvHeads(v.model.num_kv_heads);
  m.setHeadDim(v.model.head_dim);
  m.setIntermediateSize(v.model.intermediate_size);
  m.setNumExperts(v.model.num_experts);
  m.setQuantization(Txt(v.model.quantization));
  m.setDtype(Txt(v.model.dtype));
  m.setCheckpointPath(Txt(v.model.checkpoint_path));
  auto toggles = b.initToggles(static_cast<unsigned>(v.toggles.size()));
  for (size_t i = 0; i < v.toggles.size(); ++i) {
    auto t = toggles[static_cast<unsigned>(i)];
    const Toggle& src = v.toggles[i];
    t.setName(Txt(src.name));
    auto val = t.getValue();
    if (const auto* x = std::get_if<int64_t>(&src.value))
      val.setInt(*x);
    else if (const auto* x = std::get_if<double>(&src.value))
      val.setFloat(*x);
    else if (const auto* x = std::get_if<bool>(&src.value))
      val.setBool(*x);
    else if (const auto* x = std::get_if<std::string>(&src.value))
      val.setText(Txt(*x));
    else
      val.setUnset();
  }
  auto d = b.initDevice();
  d.setName(Txt(v.device.name));
  d.setSmArch(v.device.sm_arch);
  d.setMemoryCapacityBytes(v.device.memory_capacity_bytes);
  d.setDriverVersion(Txt(v.device.driver_version));
  d.setRuntimeVersion(Txt(v.device.runtime_version));
  d.setIndex(v.device.index);
  auto p = b.initParallel();
  p.setTpSize(v.parallel.tp_size);
  p.setTpRank(v.parallel.tp_rank);
  p.setWorldSize(v.parallel.world_size);
  p.setRank(v.parallel.rank);
  p.setPpSize(v.parallel.pp_size);
  p.setEpSize(v.parallel.ep_size);
  p.setDpSize(v.parallel.dp_size);
  auto w = b.initWeights(static_cast<unsigned>(v.weights.size()));
  for (size_t i = 0; i < v.weights.size(); ++i) Build(w[static_cast<unsigned>(i)], v.weights[i]);
  b.setWeightCheckPeriodSteps(v.weight_check_period_steps);
  b.setQuirks(v.quirks);
  auto f = b.initFeatures(static_cast<unsigned>(v.features.size()));
  for (size_t i = 0; i < v.features.size(); ++i) f.set(static_cast<unsigned>(i), Txt(v.features[i]));
  if (v.coredump != CoredumpArming{}) {
    auto c = b.initCoredump();
    c.setMode(Txt(v.coredump.mode));
    c.setReason(Txt(v.coredump.reason));
    c.setFilePattern(Txt(v.coredump.file_pattern));
    c.setGenerationFlags(v.coredump.generation_flags);
    c.setCompletionCallback(v.coredump.completion_callback);
  }
}

void Build(s::WeightHashesRecord::Builder b, const WeightHashesRecord& v) {
  auto l = b.initShards(static_cast<unsigned>(v.shards.size()));
  for (size_t i = 0; i < v.shards.size(); ++i) Build(l[static_cast<unsigned>(i)], v.shards[i]);
}

// The step record's `list`: its values, or where `base` is given, the list
// is one of kStepListDeltas and base's is as long, the differences from
// base's element by element (mod 2^64; format 2.4's list deltas).
template <typename ListBuilder>
void FillStepList(ListBuilder b, const StepRecord& v, const StepRecord* base, std::vector<int64_t> StepRecord::* list) {
  const std::vector<int64_t>& values = v.*list;
  const std::vector<int64_t>* from = base != nullptr ? &(base->*list) : nullptr;
  if (from == nullptr || from->size() != values.size() ||
      std::find(std::begin(kStepListDeltas), std::end(kStepListDeltas), list) == std::end(kStepListDeltas)) {
    FillInts(b, values);
    return;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    b.set(static_cast<unsigned>(i),
          static_cast<int64_t>(static_cast<uint64_t>(values[i]) - static_cast<uint64_t>((*from)[i])));
  }
}

void Build(s::StepRecord::Builder b, const StepRecord& v, const StepRecord* base = nullptr) {
  b.setStep(v.step);
  b.setRank(v.rank);
  b.setMode(static_cast<s::ForwardMode>(v.mode));
  b.setTimestampNanos(v.timestamp_nanos);
  auto ids = b.initRequestIds(static_cast<unsigned>(v.request_ids.size()));
  for (size_t i = 0; i < v.request_ids.size(); ++i) ids.set(static_cast<unsigned>(i), Txt(v.request_ids[i]));
  FillStepList(b.initTokenIds(static_cast<unsigned>(v.token_ids.size())), v, base, &StepRecord::token_ids);
  FillStepList(b.initPositions(static_cast<unsigned>(v.positions.size())), v, base, &StepRecord::positions);
  FillStepList(b.initSeqLens(static_cast<unsigned>(v.seq_lens.size())), v, base, &StepRecord::seq_lens);
  FillStepList(b.initExtendLens(static_cast<unsigned>(v.extend_lens.size())), v, base, &StepRecord::extend_lens);
  FillStepList(b.initReqPoolIndices(static_cast<unsigned>(v.req_pool_indices.size())), v, base,
               &StepRecord::req_pool_indices);
  auto pt = b.initPageTable(static_cast<unsigned>(v.page_table.size()));
  for (size_t i = 0; i < v.page_table.size(); ++i) {
    auto row = pt[static_cast<unsigned>(i)];
    row.setReqPoolIndex(v.page_table[i].req_pool_index);
    row.setStart(v.page_table[i].start);
    row.setFromPrevious(v.page_table[i].from_previous);
    FillInts(row.initTokenSlots(static_cast<unsigned>(v.page_table[i].token_slots.size())),
             v.page_table[i].token_slots);
  }
  FillStepList(b.initOutCacheLoc(static_cast<unsigned>(v.out_cache_loc.size())), v, base, &StepRecord::out_cache_loc);
  auto sp = b.initSampling(static_cast<unsigned>(v.sampling.size()));
  for (size_t i = 0; i < v.sampling.size(); ++i) {
    auto o = sp[static_cast<unsigned>(i)];
    const SamplingParams& src = v.sampling[i];
    o.setTemperature(src.temperature);
    o.setTopP(src.top_p);
    o.setTopK(src.top_k);
    o.setMinP(src.min_p);
    o.setSeed(src.seed);
    o.setHasSeed(src.has_seed);
  }
  b.setRngSeed(v.rng_seed);
  b.setRngOffset(v.rng_offset);
  FillStepList(b.initOutputTokenIds(static_cast<unsigned>(v.output_token_ids.size())), v, base,
               &StepRecord::output_token_ids);
  auto dg = b.initDigests(static_cast<unsigned>(v.digests.size()));
  for (size_t i = 0; i < v.digests.size(); ++i) {
    auto o = dg[static_cast<unsigned>(i)];
    o.setName(Txt(v.digests[i].name));
    if (const auto* x = std::get_if<uint64_t>(&v.digests[i].value))
      o.getValue().setU64(*x);
    else
      SetHash(o.getValue().initHash(), std::get<Hash128>(v.digests[i].value));
  }
  BuildTensors(b.initTensors(static_cast<unsigned>(v.tensors.size())), v.tensors);
}

void Build(s::SnapshotRecord::Builder b, const SnapshotRecord& v) {
  b.setStep(v.step);
  b.setRank(v.rank);
  BuildTensors(b.initTensors(static_cast<unsigned>(v.tensors.size())), v.tensors);
}

void Build(s::WeightCheckRecord::Builder b, const WeightCheckRecord& v) {
  b.setStep(v.step);
  b.setRank(v.rank);
  b.setPeriodSteps(v.period_steps);
  auto l = b.initSlices(static_cast<unsigned>(v.slices.size()));
  for (size_t i = 0; i < v.slices.size(); ++i) {
    auto o = l[static_cast<unsigned>(i)];
    const WeightSlice& src = v.slices[i];
    o.setTensor(Txt(src.tensor));
    o.setByteBegin(src.byte_begin);
    o.setByteEnd(src.byte_end);
    SetHash(o.initHash(), src.hash);
    SetHash(o.initExpected(), src.expected);
    o.setCorrupt(src.corrupt);
  }
}

void Build(s::FingerprintRecord::Builder b, const FingerprintRecord& v) {
  b.setStep(v.step);
  b.setRank(v.rank);
  b.setComplete(v.complete);
  b.setSource(Txt(v.source));
  auto l = b.initFingerprints(static_cast<unsigned>(v.fingerprints.size()));
  for (size_t i = 0; i < v.fingerprints.size(); ++i) {
    auto o = l[static_cast<unsigned>(i)];
    const Fingerprint& f = v.fingerprints[i];
    o.setName(Txt(f.name));
    o.setDtype(Txt(f.dtype));
    o.setNumel(f.numel);
    o.setColumns(f.columns);
    o.setNan(f.nan);
    o.setPosInf(f.pos_inf);
    o.setNegInf(f.neg_inf);
    o.setMin(f.min);
    o.setMax(f.max);
    o.setMaxAbs(f.max_abs);
    o.setSum(f.sum);
    o.setSumSquares(f.sum_squares);
    o.setFirstNonFiniteToken(f.first_nonfinite_token);
    o.setFirstNonFiniteColumn(f.first_nonfinite_column);
    o.setIsInt(f.is_int);
    o.setHasContentHash(f.content_hash.has_value());
    if (f.content_hash) SetHash(o.initContentHash(), *f.content_hash);
  }
}

void Build(s::DroppedSnapshotsRecord::Builder b, const DroppedSnapshotsRecord& v) {
  b.setStep(v.step);
  b.setSnapshotsDropped(v.snapshots_dropped);
  b.setBytesDropped(v.bytes_dropped);
  b.setStepsDropped(v.steps_dropped);
  b.setRecordsDropped(v.records_dropped);
  b.setWriteErrors(v.write_errors);
}

void Build(s::FailureRecord::Builder b, const FailureRecord& v) {
  b.setReason(Txt(v.reason));
  b.setStage(Txt(v.stage));
  b.setStep(v.step.value_or(0));
  b.setHasStep(v.step.has_value());
  b.setRank(v.rank);
  b.setSignal(v.signal);
  b.setExceptionType(Txt(v.exception_type));
  b.setFailureClass(static_cast<s::FailureClass>(v.failure_class));
  b.setTimestampNanos(v.timestamp_nanos);
  b.setBacktrace(Txt(v.backtrace));
  b.setCoredump(Txt(v.coredump));
  b.setCoredumpComplete(v.coredump_complete);
  b.setCoredumpNote(Txt(v.coredump_note));
}

void Build(s::IndexRecord::Builder b, const IndexRecord& v) {
  auto e = b.initEntries(static_cast<unsigned>(v.entries.size()));
  for (size_t i = 0; i < v.entries.size(); ++i) {
    auto o = e[static_cast<unsigned>(i)];
    o.setType(v.entries[i].type);
    o.setOffset(v.entries[i].offset);
    o.setStep(v.entries[i].step);
  }
  auto bl = b.initBlobs(static_cast<unsigned>(v.blobs.size()));
  for (size_t i = 0; i < v.blobs.size(); ++i) {
    auto o = bl[static_cast<unsigned>(i)];
    SetHash(o.initHash(), v.blobs[i].hash);
    o.setOffset(v.blobs[i].offset);
  }
}

void Build(s::EndRecord::Builder b, const EndRecord& v) {
  b.setOk(v.ok);
  b.setRecords(v.records);
  b.setSteps(v.steps);
  b.setBlobs(v.blobs);
  b.setIndexOffset(v.index_offset);
  b.setSnapshotsDropped(v.snapshots_dropped);
  b.setBytesDropped(v.bytes_dropped);
  b.setStepsDropped(v.steps_dropped);
  b.setRecordsDropped(v.records_dropped);
  b.setWriteErrors(v.write_errors);
}

// ---- read ---------------------------------------------------------------------

TensorHash Read(s::TensorHash::Reader r) { return TensorHash{Str(r.getName()), GetHash(r.getHash()), r.getByteSize()}; }

WeightShardHashes Read(s::WeightShardHashes::Reader r) {
  WeightShardHashes v;
  v.rank = r.getRank();
  for (auto t : r.getTensors()) v.tensors.push_back(Read(t));
  v.root = GetHash(r.getRoot());
  return v;
}

TensorDescriptor Read(s::TensorDescriptor::Reader r) {
  TensorDescriptor v;
  v.name = Str(r.getName());
  v.dtype = Str(r.getDtype());
  v.shape = ReadInts<int64_t>(r.getShape());
  v.strides = ReadInts<int64_t>(r.getStrides());
  v.content_hash = GetHash(r.getContentHash());
  v.byte_size = r.getByteSize();
  v.stored = r.getStored();
  v.device = Str(r.getDevice());
  return v;
}

template <typename ListReader>
std::vector<TensorDescriptor> ReadTensors(ListReader l) {
  std::vector<TensorDescriptor> out;
  out.reserve(l.size());
  for (auto t : l) out.push_back(Read(t));
  return out;
}

// Enum values from a newer writer that this reader does not know read as
// kUnknown (schema rule: every enum's zero is "unknown").
ForwardMode ReadMode(s::ForwardMode m) {
  const auto v = static_cast<uint16_t>(m);
  return v <= static_cast<uint16_t>(ForwardMode::kIdle) ? static_cast<ForwardMode>(v) : ForwardMode::kUnknown;
}
FailureClass ReadClass(s::FailureClass c) {
  const auto v = static_cast<uint16_t>(c);
  return v <= static_cast<uint16_t>(FailureClass::kException) ? static_cast<FailureClass>(v) : FailureClass::kUnknown;
}

void Read(s::SessionManifest::Reader r, SessionManifest* v) {
  v->format_major = r.getFormatMajor();
  v->format_minor = r.getFormatMinor();
  v->session_id = Str(r.getSessionId());
  v->engine = Str(r.getEngine());
  v->engine_version = Str(r.getEngineVersion());
  v->recorder_version = Str(r.getRecorderVersion());
  v->created_unix_nanos = r.getCreatedUnixNanos();
  v->hostname = Str(r.getHostname());
  v->pid = r.getPid();
  auto m = r.getModel();
  v->model.config_json = Str(m.getConfigJson());
  v->model.model_type = Str(m.getModelType());
  v->model.architecture = Str(m.getArchitecture());
  v->model.num_layers = m.getNumLayers();
  v->model.hidden_size = m.getHiddenSize();
  v->model.vocab_size = m.getVocabSize();
  v->model.num_heads = m.getNumHeads();
  v->model.num_kv_heads = m.getNumKvHeads();
  v->model.head_dim = m.getHeadDim();
  v->model.intermediate_size = m.getIntermediateSize();
  v->model.num_experts = m.getNumExperts();
  v->model.quantization = Str(m.getQuantization());
  v->model.dtype = Str(m.getDtype());
  v->model.checkpoint_path = Str(m.getCheckpointPath());
  for (auto t : r.getToggles()) {
    Toggle tg;
    tg.name = Str(t.getName());
    auto val = t.getValue();
    switch (val.which()) {
      case s::Toggle::Value::INT: tg.value = static_cast<int64_t>(val.getInt()); break;
      case s::Toggle::Value::FLOAT: tg.value = val.getFloat(); break;
      case s::Toggle::Value::BOOL: tg.value = val.getBool(); break;
      case s::Toggle::Value::TEXT: tg.value = Str(val.getText()); break;
      default: break;  // unset, or a kind added later
    }
    v->toggles.push_back(std::move(tg));
  }
  auto d = r.getDevice();
  v->device.name = Str(d.getName());
  v->device.sm_arch = d.getSmArch();
  v->device.memory_capacity_bytes = d.getMemoryCapacityBytes();
  v->device.driver_version = Str(d.getDriverVersion());
  v->device.runtime_version = Str(d.getRuntimeVersion());
  v->device.index = d.getIndex();
  auto p = r.getParallel();
  v->parallel.tp_size = p.getTpSize();
  v->parallel.tp_rank = p.getTpRank();
  v->parallel.world_size = p.getWorldSize();
  v->parallel.rank = p.getRank();
  v->parallel.pp_size = p.getPpSize();
  v->parallel.ep_size = p.getEpSize();
  v->parallel.dp_size = p.getDpSize();
  for (auto w : r.getWeights()) v->weights.push_back(Read(w));
  v->weight_check_period_steps = r.getWeightCheckPeriodSteps();
  v->quirks = r.getQuirks();
  for (auto f : r.getFeatures()) v->features.push_back(Str(f));
  if (r.hasCoredump()) {
    auto c = r.getCoredump();
    v->coredump.mode = Str(c.getMode());
    v->coredump.reason = Str(c.getReason());
    v->coredump.file_pattern = Str(c.getFilePattern());
    v->coredump.generation_flags = c.getGenerationFlags();
    v->coredump.completion_callback = c.getCompletionCallback();
  }
}

void Read(s::WeightHashesRecord::Reader r, WeightHashesRecord* v) {
  for (auto w : r.getShards()) v->shards.push_back(Read(w));
}

void Read(s::StepRecord::Reader r, StepRecord* v) {
  v->step = r.getStep();
  v->rank = r.getRank();
  v->mode = ReadMode(r.getMode());
  v->timestamp_nanos = r.getTimestampNanos();
  for (auto id : r.getRequestIds()) v->request_ids.push_back(Str(id));
  v->token_ids = ReadInts<int64_t>(r.getTokenIds());
  v->positions = ReadInts<int64_t>(r.getPositions());
  v->seq_lens = ReadInts<int64_t>(r.getSeqLens());
  v->extend_lens = ReadInts<int64_t>(r.getExtendLens());
  v->req_pool_indices = ReadInts<int64_t>(r.getReqPoolIndices());
  for (auto row : r.getPageTable()) {
    v->page_table.push_back(PageTableRow{row.getReqPoolIndex(), ReadInts<int64_t>(row.getTokenSlots()), row.getStart(),
                                         row.getFromPrevious()});
  }
  v->out_cache_loc = ReadInts<int64_t>(r.getOutCacheLoc());
  for (auto sp : r.getSampling()) {
    v->sampling.push_back(
        SamplingParams{sp.getTemperature(), sp.getTopP(), sp.getTopK(), sp.getMinP(), sp.getSeed(), sp.getHasSeed()});
  }
  v->rng_seed = r.getRngSeed();
  v->rng_offset = r.getRngOffset();
  v->output_token_ids = ReadInts<int64_t>(r.getOutputTokenIds());
  for (auto d : r.getDigests()) {
    Digest dg;
    dg.name = Str(d.getName());
    auto val = d.getValue();
    if (val.which() == s::Digest::Value::HASH)
      dg.value = GetHash(val.getHash());
    else
      dg.value = static_cast<uint64_t>(val.getU64());
    v->digests.push_back(std::move(dg));
  }
  v->tensors = ReadTensors(r.getTensors());
}

void Read(s::SnapshotRecord::Reader r, SnapshotRecord* v) {
  v->step = r.getStep();
  v->rank = r.getRank();
  v->tensors = ReadTensors(r.getTensors());
}

void Read(s::WeightCheckRecord::Reader r, WeightCheckRecord* v) {
  v->step = r.getStep();
  v->rank = r.getRank();
  v->period_steps = r.getPeriodSteps();
  for (auto sl : r.getSlices()) {
    v->slices.push_back(WeightSlice{Str(sl.getTensor()), sl.getByteBegin(), sl.getByteEnd(), GetHash(sl.getHash()),
                                    GetHash(sl.getExpected()), sl.getCorrupt()});
  }
}

void Read(s::FingerprintRecord::Reader r, FingerprintRecord* v) {
  v->step = r.getStep();
  v->rank = r.getRank();
  v->complete = r.getComplete();
  v->source = Str(r.getSource());
  for (auto o : r.getFingerprints()) {
    Fingerprint f;
    f.name = Str(o.getName());
    f.dtype = Str(o.getDtype());
    f.numel = o.getNumel();
    f.columns = o.getColumns();
    f.nan = o.getNan();
    f.pos_inf = o.getPosInf();
    f.neg_inf = o.getNegInf();
    f.min = o.getMin();
    f.max = o.getMax();
    f.max_abs = o.getMaxAbs();
    f.sum = o.getSum();
    f.sum_squares = o.getSumSquares();
    f.first_nonfinite_token = o.getFirstNonFiniteToken();
    f.first_nonfinite_column = o.getFirstNonFiniteColumn();
    f.is_int = o.getIsInt();
    if (o.getHasContentHash()) f.content_hash = GetHash(o.getContentHash());
    v->fingerprints.push_back(std::move(f));
  }
}

void Read(s::DroppedSnapshotsRecord::Reader r, DroppedSnapshotsRecord* v) {
  v->step = r.getStep();
  v->snapshots_dropped = r.getSnapshotsDropped();
  v->bytes_dropped = r.getBytesDropped();
  v->steps_dropped = r.getStepsDropped();
  v->records_dropped = r.getRecordsDropped();
  v->write_errors = r.getWriteErrors();
}

void Read(s::FailureRecord::Reader r, FailureRecord* v) {
  v->reason = Str(r.getReason());
  v->stage = Str(r.getStage());
  if (r.getHasStep()) v->step = r.getStep();
  v->rank = r.getRank();
  v->signal = r.getSignal();
  v->exception_type = Str(r.getExceptionType());
  v->failure_class = ReadClass(r.getFailureClass());
  v->timestamp_nanos = r.getTimestampNanos();
  v->backtrace = Str(r.getBacktrace());
  v->coredump = Str(r.getCoredump());
  v->coredump_complete = r.getCoredumpComplete();
  v->coredump_note = Str(r.getCoredumpNote());
}

void Read(s::IndexRecord::Reader r, IndexRecord* v) {
  for (auto e : r.getEntries()) v->entries.push_back(IndexEntry{e.getType(), e.getOffset(), e.getStep()});
  for (auto b : r.getBlobs()) v->blobs.push_back(BlobIndexEntry{GetHash(b.getHash()), b.getOffset()});
}

void Read(s::EndRecord::Reader r, EndRecord* v) {
  v->ok = r.getOk();
  v->records = r.getRecords();
  v->steps = r.getSteps();
  v->blobs = r.getBlobs();
  v->index_offset = r.getIndexOffset();
  v->snapshots_dropped = r.getSnapshotsDropped();
  v->bytes_dropped = r.getBytesDropped();
  v->steps_dropped = r.getStepsDropped();
  v->records_dropped = r.getRecordsDropped();
  v->write_errors = r.getWriteErrors();
}

// ---- framing of one message ---------------------------------------------------

// The standard stream framing (segment count - 1, segment sizes, padding
// to a word, segments) written straight into the vector that is returned.
std::vector<unsigned char> Flatten(capnp::MessageBuilder& message) {
  kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments = message.getSegmentsForOutput();
  const size_t table_words = (segments.size() + 2) / 2;
  size_t words = table_words;
  for (const auto& seg : segments) words += seg.size();
  std::vector<unsigned char> out;
  out.reserve(words * sizeof(capnp::word));  // written once: not zero-filled first
  out.resize(table_words * sizeof(capnp::word));
  StoreLE32(out.data(), static_cast<uint32_t>(segments.size() - 1));
  for (size_t i = 0; i < segments.size(); ++i) {
    StoreLE32(out.data() + 4 + 4 * i, static_cast<uint32_t>(segments[i].size()));
  }
  for (const auto& seg : segments) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(seg.begin());
    out.insert(out.end(), bytes, bytes + seg.size() * sizeof(capnp::word));
  }
  return out;
}

template <typename Root, typename T, typename... Extra>
absl::StatusOr<std::vector<unsigned char>> Encode(const T& record, const Extra&... extra) {
  try {
    // Cap'n Proto's default segment sizes: one segment sized to the whole
    // record measured faster by 2-3 us a decode step but compressed 10%
    // worse in the step stream (and under the zstd CLI), so not done.
    capnp::MallocMessageBuilder message;
    Build(message.initRoot<Root>(), record, extra...);
    return Flatten(message);
  } catch (const kj::Exception& e) {
    return absl::InvalidArgumentError(absl::StrFormat("cannot encode capture record: %s", e.getDescription().cStr()));
  }
}

template <typename Root, typename T>
absl::Status Decode(const unsigned char* data, size_t size, const CaptureLimits& limits, T* out) {
  if (size > limits.max_structured_payload) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("record payload is %d bytes, over the %d-byte limit for structured records", size,
                        limits.max_structured_payload));
  }
  if (size == 0 || size % sizeof(capnp::word) != 0) {
    return absl::DataLossError(
        absl::StrFormat("record payload of %d bytes is not a whole number of 8-byte words", size));
  }
  // The segment table starts with the segment count minus one. Cap'n Proto
  // 0.9's flat reader adds the one in 32 bits, so 0xffffffff wraps to zero
  // segments and the message is then read as if it had one: a forged count
  // would pass unnoticed. No writer produces it (2^32 segments).
  if (LoadLE32(data) == 0xffffffffu) {
    return absl::DataLossError(
        "malformed Cap'n Proto record: its segment table declares 2^32 segments (the count field 0xffffffff wraps "
        "to 0)");
  }
  // Copied into an aligned buffer: the file offset need not be 8-aligned.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
  std::memcpy(words.begin(), data, size);
  capnp::ReaderOptions options;
  // A well-formed message is read once; the cap stops pointer tricks that
  // make the same words count many times (amplification).
  options.traversalLimitInWords = std::min<uint64_t>(limits.traversal_limit_words, 4 * words.size() + 64);
  options.nestingLimit = limits.nesting_limit;
  try {
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    if (reader.getEnd() != words.end()) {
      return absl::DataLossError("record payload has bytes after its Cap'n Proto message");
    }
    *out = T{};
    Read(reader.getRoot<Root>(), out);
  } catch (const kj::Exception& e) {
    *out = T{};
    return absl::DataLossError(absl::StrFormat("malformed Cap'n Proto record: %s", e.getDescription().cStr()));
  }
  return absl::OkStatus();
}

}  // namespace

#define CR_CAPTURE_RECORD_CODEC_IMPL(T)                                                                   \
  absl::StatusOr<std::vector<unsigned char>> ToPayload(const T& record) { return Encode<s::T>(record); }  \
  absl::Status FromPayload(const unsigned char* data, size_t size, const CaptureLimits& limits, T* out) { \
    return Decode<s::T>(data, size, limits, out);                                                         \
  }

absl::StatusOr<std::vector<unsigned char>> ToPayloadListDeltas(const StepRecord& record, const StepRecord& base) {
  return Encode<s::StepRecord>(record, &base);
}

void AddListDeltas(const StepRecord& base, StepRecord* record) {
  for (std::vector<int64_t> StepRecord::* list : kStepListDeltas) {
    const std::vector<int64_t>& from = base.*list;
    std::vector<int64_t>& v = record->*list;
    if (from.size() != v.size()) continue;
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<int64_t>(static_cast<uint64_t>(v[i]) + static_cast<uint64_t>(from[i]));
    }
  }
}

CR_CAPTURE_RECORD_CODEC_IMPL(SessionManifest)
CR_CAPTURE_RECORD_CODEC_IMPL(WeightHashesRecord)
CR_CAPTURE_RECORD_CODEC_IMPL(StepRecord)
CR_CAPTURE_RECORD_CODEC_IMPL(SnapshotRecord)
CR_CAPTURE_RECORD_CODEC_IMPL(WeightCheckRecord)
CR_CAPTURE_RECORD_CODEC_IMPL(FingerprintRecord)
CR_CAPTURE_RECORD_CODEC_IMPL(DroppedSnapshotsRecord)
CR_CAPTURE_RECORD_CODEC_IMPL(FailureRecord)
CR_CAPTURE_RECORD_CODEC_IMPL(IndexRecord)
CR_CAPTURE_RECORD_CODEC_IMPL(EndRecord)

#undef CR_CAPTURE_RECORD_CODEC_IMPL

}  // namespace crashreplay::internal
