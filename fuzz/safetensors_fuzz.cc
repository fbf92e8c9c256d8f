// libFuzzer target: the safetensors header parser and validator.
//
// Any input must give either a file whose every tensor range lies inside
// the buffer, or an error status; never a crash, a leak or an out-of-bounds
// read. Reading every byte of every tensor lets ASan check the ranges the
// parser accepted.
#include <cstddef>
#include <cstdint>
#include <span>

#include "crashreplay/formats/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = crashreplay::SafetensorsFile::FromBuffer("fuzz-input", std::as_bytes(std::span(data, size)));
  if (!file.ok()) return 0;
  unsigned sum = 0;
  for (const crashreplay::TensorInfo& t : (*file)->tensors()) {
    for (std::byte b : (*file)->Data(t)) sum += static_cast<unsigned>(b);
    if ((*file)->Find(t.name) != &t) __builtin_trap();
    if (t.data_offset + t.byte_size > size) __builtin_trap();
  }
  volatile unsigned sink = sum;
  (void)sink;
  return 0;
}
