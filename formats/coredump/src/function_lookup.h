// Which function a device PC falls in: the function symbols (STT_FUNC with
// a size) of the relocated module images (cubins) embedded in the dump,
// whose values the driver has relocated to the addresses the code ran at.
// A device's images are parsed the first time a PC is looked up on it,
// into one index sorted by address, so each lookup is a binary search
// whatever the number of images. An image that cannot be read makes the
// function unknown only where no other image covers the PC, is listed in
// Problems(), and never fails the dump.
//
// Bounds: the bytes read from images (section headers, symbol and string
// tables) add up to at most the dump's size, however the images overlap;
// the function names held add up to at most kMaxNameBytes. Private to
// formats/coredump; not thread-safe (one per read).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "crashreplay/formats/coredump/coredump.h"
#include "elf_reader.h"

namespace crashreplay::coredump {

struct ImageRef {
  ElfSection section;  // the `.cudbg.relfimg` section in the dump
  std::string label;   // "section 12 '.cudbg.relfimg.dev0.ctx0'"
  uint32_t device_index = 0;
  uint64_t module_handle = 0;
};

class FunctionIndex {
 public:
  // Function names (mangled and demangled) held by one read, in all.
  static constexpr uint64_t kMaxNameBytes = uint64_t{64} << 20;

  FunctionIndex(const ByteSource& dump, std::vector<ImageRef> images);
  ~FunctionIndex();
  FunctionIndex(const FunctionIndex&) = delete;
  FunctionIndex& operator=(const FunctionIndex&) = delete;

  // The function covering `pc` among the device's images; where functions
  // of several images start at the same address, the one of
  // `module_handle` (the grid's module) wins.
  Location Locate(uint32_t device_index, std::optional<uint64_t> module_handle, uint64_t pc);

  // "section 12 '...' cannot be read: why", one per image found unreadable
  // so far, in the order found.
  const std::vector<std::string>& Problems() const { return problems_; }

 private:
  struct Image;
  struct Device;
  Device& Get(uint32_t device_index);
  void Parse(Image& image);
  // Takes `n` bytes from the read budget; false when it is spent.
  bool Spend(uint64_t n);
  const ByteSource& dump_;
  std::vector<ImageRef> refs_;
  std::unordered_map<uint32_t, std::vector<size_t>> refs_by_device_;
  std::unordered_map<uint32_t, std::unique_ptr<Device>> devices_;
  std::vector<std::string> problems_;
  uint64_t read_budget_;
  uint64_t name_budget_ = kMaxNameBytes;
};

// `name` demangled when it is a C++ name of at most kMaxDemangleBytes;
// otherwise `name` itself.
std::string Demangle(const std::string& name);

}  // namespace crashreplay::coredump
