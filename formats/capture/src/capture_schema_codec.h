// Conversion between the plain record structs (capture_records.h) and their
// Cap'n Proto payloads (schema/capture.capnp). Internal to formats/.
//
// ToPayload never throws: Cap'n Proto builder exceptions become a Status.
// FromPayload reads a hostile payload under CaptureLimits (traversal and
// nesting limits, size checked before copying) and converts every
// kj::Exception into DataLoss; unknown enum values map to kUnknown.
// Thread-safe (no shared state).
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crashreplay/formats/capture_format.h"
#include "crashreplay/formats/capture_records.h"

namespace crashreplay::internal {

#define CR_CAPTURE_RECORD_CODEC(T)                                       \
  absl::StatusOr<std::vector<unsigned char>> ToPayload(const T& record); \
  absl::Status FromPayload(const unsigned char* data, size_t size, const CaptureLimits& limits, T* out);

CR_CAPTURE_RECORD_CODEC(SessionManifest)
CR_CAPTURE_RECORD_CODEC(WeightHashesRecord)
CR_CAPTURE_RECORD_CODEC(StepRecord)
CR_CAPTURE_RECORD_CODEC(SnapshotRecord)
CR_CAPTURE_RECORD_CODEC(WeightCheckRecord)
CR_CAPTURE_RECORD_CODEC(FingerprintRecord)
CR_CAPTURE_RECORD_CODEC(DroppedSnapshotsRecord)
CR_CAPTURE_RECORD_CODEC(FailureRecord)
CR_CAPTURE_RECORD_CODEC(IndexRecord)
CR_CAPTURE_RECORD_CODEC(EndRecord)

#undef CR_CAPTURE_RECORD_CODEC

// A step record with its kStepListDeltas lists stored as differences from
// `base`'s where the lengths match (format 2.4, frame flag bit 4), and the
// reverse: `record`'s lists, read from such a payload, back to values.
absl::StatusOr<std::vector<unsigned char>> ToPayloadListDeltas(const StepRecord& record, const StepRecord& base);
void AddListDeltas(const StepRecord& base, StepRecord* record);

}  // namespace crashreplay::internal
