# The structured records of a crashreplay capture file.
#
# Each structured frame of the container (docs/formats/capture.md) carries one
# of the root structs below as a single Cap'n Proto message (standard
# segment-table framing, unpacked). Which struct a frame holds is decided by
# the frame's record type, not by anything in the message.
#
# Evolution rules (Cap'n Proto's own, restated because files outlive code):
#   * Never renumber, retype or remove a field; only append fields with the
#     next ordinal. A field that is no longer written stays declared (its
#     name may gain an "obsolete" prefix).
#   * New enumerants are appended; readers map values they do not know to
#     the zero enumerant ("unknown"), which every enum here has.
#   * A group or union gains members only at the end.
#   * Anything that changes what an old reader must do with a file bumps the
#     container's major version; additions that old readers may ignore bump
#     the minor version, or set a bit in SessionManifest.quirks (like rr's
#     trace quirks) that names a behaviour a newer replayer must honour.
#   * Lists of plain numbers are used for per-request columns so that a step
#     log stays a handful of contiguous arrays (cheap to build and to read).

@0xb6fe7694c29905bd;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("crashreplay::schema");

# XXH3-128, canonical order: `hi` is the half xxhsum -H2 prints first.
struct Hash128 {
  hi @0 :UInt64;
  lo @1 :UInt64;
}

# ---------------------------------------------------------------- manifest

# One configuration setting with a typed value (DESIGN.md "toggle").
struct Toggle {
  name @0 :Text;
  value :union {
    unset @1 :Void;
    int @2 :Int64;
    float @3 :Float64;
    bool @4 :Bool;
    text @5 :Text;
  }
}

struct ModelConfig {
  configJson @0 :Text;        # the checkpoint's config.json, verbatim
  modelType @1 :Text;         # "llama", "qwen3_moe", "deepseek_v3", ...
  architecture @2 :Text;      # architectures[0]
  numLayers @3 :UInt32;
  hiddenSize @4 :UInt32;
  vocabSize @5 :UInt32;
  numHeads @6 :UInt32;
  numKvHeads @7 :UInt32;
  headDim @8 :UInt32;
  intermediateSize @9 :UInt32;
  numExperts @10 :UInt32;
  quantization @11 :Text;     # "", "fp8_block", "nvfp4", "mxfp4"
  dtype @12 :Text;            # torch_dtype / the activation dtype
  checkpointPath @13 :Text;
}

struct Device {
  name @0 :Text;                  # "NVIDIA H200"
  smArch @1 :UInt32;              # 90 for sm_90, 100 for sm_100
  memoryCapacityBytes @2 :UInt64;
  driverVersion @3 :Text;
  runtimeVersion @4 :Text;
  index @5 :UInt32;               # CUDA device ordinal in the recording process
}

struct ParallelLayout {
  tpSize @0 :UInt32;
  tpRank @1 :UInt32;
  worldSize @2 :UInt32;
  rank @3 :UInt32;                # global rank; the file name carries it too
  ppSize @4 :UInt32;
  epSize @5 :UInt32;
  dpSize @6 :UInt32;
}

struct TensorHash {
  name @0 :Text;
  hash @1 :Hash128;               # XXH3-128 over the rank's shard bytes
  byteSize @2 :UInt64;
}

# Load-time hashes of one rank's weight shards. `root` is XXH3-128 over the
# sorted (name, hash) pairs (capture/ defines the exact rule).
struct WeightShardHashes {
  rank @0 :UInt32;
  tensors @1 :List(TensorHash);
  root @2 :Hash128;
}

struct SessionManifest {
  formatMajor @0 :UInt16;
  formatMinor @1 :UInt16;
  sessionId @2 :Text;             # the same in every rank file of a session
  engine @3 :Text;                # "sglang", "vllm", "crashreplay"
  engineVersion @4 :Text;
  recorderVersion @5 :Text;
  createdUnixNanos @6 :Int64;
  hostname @7 :Text;
  pid @8 :UInt32;
  model @9 :ModelConfig;
  toggles @10 :List(Toggle);      # every setting, engine flags and env switches
  device @11 :Device;
  parallel @12 :ParallelLayout;
  weights @13 :List(WeightShardHashes);  # may be empty; see WeightHashesRecord
  weightCheckPeriodSteps @14 :UInt32;    # K: every weight byte re-hashed each K steps
  # Forward compatibility (rr-style quirks): bit i set means "this file has
  # behaviour i", named in docs/formats/capture.md. Unknown bits are kept
  # and reported, never an error.
  quirks @15 :UInt64;
  features @16 :List(Text);
  # What the recorder armed for GPU core dumps (docs/capture.md, "GPU core
  # dumps"); absent (all empty) in files of recorders before it existed.
  coredump @17 :CoredumpArming;
  # Whether the session ended cleanly is not here: the file is append-only,
  # so `ok` lives in the EndRecord written by a clean close.
}

# Weight hashes computed after the session began (hashing a large
# checkpoint takes seconds; the recorder does it off the serving path).
struct WeightHashesRecord {
  shards @0 :List(WeightShardHashes);
}

# ---------------------------------------------------------------- steps

enum ForwardMode {
  unknown @0;
  prefill @1;
  decode @2;
  extend @3;
  mixed @4;
  idle @5;
}

# Where a tensor's bytes are. `contentHash` is XXH3-128 of the dense bytes
# (row-major, no padding); when `stored` is true a blob frame with that hash
# holds them (blobs are content-addressed, so the hash is the reference).
struct TensorDescriptor {
  name @0 :Text;
  dtype @1 :Text;                 # formats/dtype.h names: "BF16", "F8_E4M3", ...
  shape @2 :List(Int64);
  strides @3 :List(Int64);        # in elements; empty means contiguous
  contentHash @4 :Hash128;
  byteSize @5 :UInt64;
  stored @6 :Bool;                # false: only the hash was recorded
  device @7 :Text;                # where it lived: "cpu", "cuda:0"
}

struct SamplingParams {
  temperature @0 :Float32;
  topP @1 :Float32;
  topK @2 :Int32;
  minP @3 :Float32;
  seed @4 :UInt64;
  hasSeed @5 :Bool;
}

struct Digest {
  name @0 :Text;
  value :union {
    u64 @1 :UInt64;
    hash @2 :Hash128;
  }
}

# One row of the page table: the KV slots a request's tokens occupy.
# Format 2.3 on, a row may be a delta (frame flag bit 3 marks a step frame
# holding any row with start != 0 or fromPrevious): tokenSlots are the
# row's columns from `start` on; with fromPrevious, columns 0..start-1 are
# those of the previous row of the same reqPoolIndex in this file (the
# same rank), without it they were never recorded (an incomplete row).
struct PageTableRow {
  reqPoolIndex @0 :Int64;
  tokenSlots @1 :List(Int64);
  start @2 :Int64;
  fromPrevious @3 :Bool;
}

struct StepRecord {
  step @0 :UInt64;
  rank @1 :UInt32;
  mode @2 :ForwardMode;
  timestampNanos @3 :Int64;
  # Batch composition, one entry per request unless stated.
  requestIds @4 :List(Text);
  tokenIds @5 :List(Int64);       # per token, after future tokens are resolved
  positions @6 :List(Int64);      # per token
  seqLens @7 :List(Int64);
  extendLens @8 :List(Int64);     # tokens this step adds per request
  reqPoolIndices @9 :List(Int64);
  pageTable @10 :List(PageTableRow);  # req_to_token slices the step reads
  outCacheLoc @11 :List(Int64);   # per token: the KV slot it writes
  sampling @12 :List(SamplingParams);
  rngSeed @13 :UInt64;
  rngOffset @14 :UInt64;
  outputTokenIds @15 :List(Int64);
  digests @16 :List(Digest);
  tensors @17 :List(TensorDescriptor);
}

# Tensor snapshots of a step written after the step record (the ring's
# background writer emits them, or the crash path flushes them).
struct SnapshotRecord {
  step @0 :UInt64;
  rank @1 :UInt32;
  tensors @2 :List(TensorDescriptor);
}

# ---------------------------------------------------------------- integrity

struct WeightSlice {
  tensor @0 :Text;
  byteBegin @1 :UInt64;
  byteEnd @2 :UInt64;             # exclusive
  hash @3 :Hash128;               # seen after the step's forward pass
  expected @4 :Hash128;           # from the load-time hashes
  corrupt @5 :Bool;               # hash != expected
}

struct WeightCheckRecord {
  step @0 :UInt64;
  rank @1 :UInt32;
  periodSteps @2 :UInt32;         # K: full coverage every K steps
  slices @3 :List(WeightSlice);
}

# Cumulative counters: the last record in a file holds the totals.
struct DroppedSnapshotsRecord {
  step @0 :UInt64;                # the step being recorded when counted
  snapshotsDropped @1 :UInt64;
  bytesDropped @2 :UInt64;
  # Disk errors (docs/capture.md, "Disk full and slow disks"), cumulative:
  stepsDropped @3 :UInt64;        # step records never written: queue full, or held past the in-memory bound
  recordsDropped @4 :UInt64;      # other records held past the bound (weight checks, fingerprints)
  writeErrors @5 :UInt64;         # failed writes (ENOSPC, EDQUOT, EFBIG, EIO), retries included
}

# ---------------------------------------------------------------- fingerprints (2.1)

# A fixed-size summary of one tensor the engine computed at a named point of
# a step (a "boundary": "L3.attention", "L3.down_proj", "logits", ...), so
# what the engine computed can be held against the replay's own kernels
# (docs/formats/capture.md, "Fingerprints"). Statistics are over the
# elements as the engine stored them, decoded to fp64.
struct Fingerprint {
  name @0 :Text;
  dtype @1 :Text;                 # formats/dtype.h names: "BF16", "F16", "F32", "I64", ...
  numel @2 :UInt64;
  columns @3 :UInt64;             # the last dimension: element i is (token i / columns, column i % columns)
  nan @4 :UInt64;
  posInf @5 :UInt64;
  negInf @6 :UInt64;
  min @7 :Float64;                # over the finite elements; 0 when there is none
  max @8 :Float64;
  maxAbs @9 :Float64;
  sum @10 :Float64;               # fp64 sums of the finite elements, in element order
  sumSquares @11 :Float64;
  firstNonFiniteToken @12 :Int64; # -1 when every element is finite
  firstNonFiniteColumn @13 :Int64;
  isInt @14 :Bool;                # an integer tensor (ids, indices): min/max are its range
  contentHash @15 :Hash128;       # XXH3-128 of the dense bytes, when hasContentHash
  hasContentHash @16 :Bool;
}

# The fingerprints of one step of one rank, in the order the boundaries ran.
# A step that did not finish (written by the failure path, or cut short by a
# sticky device error) has complete = false: its last entry is the last
# boundary whose kernel finished.
struct FingerprintRecord {
  step @0 :UInt64;
  rank @1 :UInt32;
  fingerprints @2 :List(Fingerprint);
  complete @3 :Bool;
  source @4 :Text;                # "host" (computed by host code) or "device" (a kernel into mapped memory)
}

# ---------------------------------------------------------------- failure, end

enum FailureClass {
  unknown @0;
  deviceAssert @1;
  outOfMemory @2;
  nonFinite @3;
  outputMismatch @4;
  timeout @5;
  crash @6;                       # fatal signal
  exception @7;                   # an exception escaped the step
}

# How GPU core dumps were armed for this process.
struct CoredumpArming {
  mode @0 :Text;                  # "off", "env", "driver_api", "failed"
  reason @1 :Text;                # why this mode (and why not armed)
  filePattern @2 :Text;           # CUDA_COREDUMP_FILE as set: %p is the pid
  generationFlags @3 :UInt32;     # CUCoredumpGenerationFlags bits asked for
  completionCallback @4 :Bool;    # the driver's completion callback is registered
}

struct FailureRecord {
  reason @0 :Text;                # the error text as seen
  stage @1 :Text;                 # "load", "graph_capture", "prefill", "decode"
  step @2 :UInt64;
  hasStep @3 :Bool;
  rank @4 :UInt32;
  signal @5 :Int32;               # 0 when not a signal
  exceptionType @6 :Text;         # e.g. "torch.AcceleratorError"
  failureClass @7 :FailureClass;
  timestampNanos @8 :Int64;
  backtrace @9 :Text;
  # The GPU core dump the recorder found for this process when it wrote
  # the failure: a name in the capture's directory, whether the coredump
  # reader read it whole, and what it said when it did not.
  coredump @10 :Text;
  coredumpComplete @11 :Bool;
  coredumpNote @12 :Text;
}

struct IndexEntry {
  type @0 :UInt16;
  offset @1 :UInt64;              # byte offset of the frame header
  step @2 :UInt64;                # for step and snapshot records
}

struct BlobIndexEntry {
  hash @0 :Hash128;
  offset @1 :UInt64;
}

# Written by a clean close just before the EndRecord.
struct IndexRecord {
  entries @0 :List(IndexEntry);
  blobs @1 :List(BlobIndexEntry);
}

struct EndRecord {
  ok @0 :Bool;                    # true only from a clean close
  records @1 :UInt64;             # frames before the index frame
  steps @2 :UInt64;
  blobs @3 :UInt64;
  indexOffset @4 :UInt64;         # frame offset of the IndexRecord
  snapshotsDropped @5 :UInt64;
  bytesDropped @6 :UInt64;
  stepsDropped @7 :UInt64;        # as in DroppedSnapshotsRecord: totals at close
  recordsDropped @8 :UInt64;
  writeErrors @9 :UInt64;
}
