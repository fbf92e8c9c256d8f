// Umbrella header for safetensors checkpoints: one file (SafetensorsFile,
// TensorInfo), a checkpoint directory (Checkpoint) and the writer
// (SafetensorsWriter). See each header for its contract and
// docs/formats/safetensors.md for the format and every validation rule.
#pragma once

#include "crashreplay/formats/checkpoint.h"
#include "crashreplay/formats/safetensors_file.h"
#include "crashreplay/formats/safetensors_writer.h"
