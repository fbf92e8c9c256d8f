#include "table_layout.h"

#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "crashreplay/formats/coredump/coredump.h"

namespace crashreplay::coredump {
namespace {

// Row sizes: the first layout, then what later drivers appended (the
// description marks each addition with its driver), up to r575.
constexpr TableSpec kSpecs[] = {
    // 3 string indices + 12 u32; r400 +2 u32 (uniform registers/predicates); r575 +2 u32.
    {Table::kDevices, kShtDeviceTable, "device table", ".cudbg.devtbl", 72, 88},
    {Table::kContexts, kShtContextTable, "context table", ".cudbg.ctxtbl", 40, 40},
    {Table::kModules, kShtModuleTable, "module table", ".cudbg.modtbl", 8, 8},
    // 7 u64 + 12 u32; r525 +cluster dims and padding; r565 +preferred cluster dims and padding.
    {Table::kGrids, kShtGridTable, "grid table", ".cudbg.gridtbl", 104, 136},
    // smId + padding; r555 +exception, error PC, cluster target block.
    {Table::kSms, kShtSmTable, "SM table", ".cudbg.smtbl", 8, 40},
    // grid id + block index + padding; r525 +cluster index; r565 +cluster dims.
    {Table::kCtas, kShtCtaTable, "CTA table", ".cudbg.ctatbl", 24, 56},
    // error PC + 6 u32; r525 +registers; r570 +shared memory; r575 +4 lane masks.
    {Table::kWarps, kShtWarpTable, "warp table", ".cudbg.wptbl", 32, 64},
    // 2 u64 + 8 u32; r575 +CBU thread state and padding.
    {Table::kLanes, kShtLaneTable, "lane table", ".cudbg.lntbl", 48, 56},
    {Table::kMeta, kShtMeta, "metadata", ".cudbg.meta", 32, 32},
};

}  // namespace

const TableSpec& Spec(Table t) { return kSpecs[static_cast<size_t>(t)]; }

std::optional<Table> TableOfType(uint32_t type) {
  for (const TableSpec& s : kSpecs) {
    if (s.type == type) return s.table;
  }
  return std::nullopt;
}

std::string ExceptionName(uint32_t code) {
  // Codes 1-3, 11, 13, 15 and 16 are the older drivers' lane-level
  // exceptions; drivers from CUDA 13.1 no longer report them.
  static const char* const kNames[] = {
      "no exception",                        // 0
      "lane illegal address",                // 1
      "lane user stack overflow",            // 2
      "device hardware stack overflow",      // 3
      "warp illegal instruction",            // 4
      "warp out-of-range address",           // 5
      "warp misaligned address",             // 6
      "warp invalid address space",         // 7
      "warp invalid PC",                     // 8
      "warp hardware stack overflow",        // 9
      "device illegal address",              // 10
      "lane misaligned address",             // 11
      "warp assert",                         // 12
      "lane syscall error",                  // 13
      "warp illegal address",                // 14
      "lane non-migratable atomic",          // 15
      "lane invalid atomic",                 // 16
      "cluster out-of-range address",        // 17
      "cluster block not present",           // 18
      "warp stack canary",                   // 19
      "warp tensor memory access check",     // 20
      "warp tensor memory leak",             // 21
      "warp call requires a newer driver",   // 22
      "warp misaligned PC",                  // 23
      "warp PC overflow",                    // 24
      "warp misaligned register",            // 25
      "warp illegal instruction encoding",   // 26
      "warp illegal instruction parameter",  // 27
      "warp out-of-range register",          // 28
      "warp invalid constant address",       // 29
      "warp MMU fault",                      // 30
      "warp barrier arrive error",           // 31
      "cluster poison",                      // 32
      "warp API stack error",                // 33
      "warp block not present",              // 34
      "warp user stack overflow",            // 35
      "TMA syscall error",                   // 36
  };
  if (code < std::size(kNames)) return kNames[code];
  if (code == 0xffffffffu) return "unknown exception";
  return absl::StrFormat("exception %d", code);
}

std::vector<std::string> LeftOutByFlags(uint32_t flags) {
  std::vector<std::string> out;
  if (flags & kFlagSkipGlobalMemory) out.push_back("global memory");
  if (flags & kFlagSkipSharedMemory) out.push_back("shared memory");
  if (flags & kFlagSkipLocalMemory) out.push_back("local memory");
  if (flags & kFlagSkipConstBankMemory) out.push_back("constant bank memory");
  if (flags & kFlagSkipUnrelocatedImages) out.push_back("unrelocated module images");
  const uint32_t known = kFlagSkipUnrelocatedImages | kFlagSkipGlobalMemory | kFlagSkipSharedMemory |
                         kFlagSkipLocalMemory | kFlagRetired4 | kFlagSkipConstBankMemory;
  if ((flags & ~known) != 0) {
    out.push_back(
        absl::StrFormat("whatever flag bits 0x%x stand for (this reader does not know them)", flags & ~known));
  }
  return out;
}

const char* PcSourceName(PcSource s) {
  switch (s) {
    case PcSource::kNone: return "none";
    case PcSource::kWarp: return "warp";
    case PcSource::kSm: return "sm";
    case PcSource::kLane: return "lane";
  }
  return "none";
}

}  // namespace crashreplay::coredump
