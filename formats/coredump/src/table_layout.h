// The `.cudbg.*` tables as this reader knows them: section type numbers,
// the row size the first driver wrote (shorter rows are refused) and the
// row size this reader knows (longer rows are read up to it), and the byte
// offset of each field it reads. Written from the public description
// (docs/formats/coredump.md names the revision); the offsets follow the
// fields' declared order with their natural alignment, which leaves no gaps
// because the description pads every row itself. Private to
// formats/coredump.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "elf_reader.h"

namespace crashreplay::coredump {

// Section types: SHT_LOUSER (0x80000000) + n.
inline constexpr uint32_t kShtCudaBase = 0x80000000u;
enum SectionType : uint32_t {
  kShtManagedMemory = kShtCudaBase + 1,
  kShtGlobalMemory = kShtCudaBase + 2,
  kShtLocalMemory = kShtCudaBase + 3,
  kShtSharedMemory = kShtCudaBase + 4,
  kShtRegisters = kShtCudaBase + 5,
  kShtUnrelocatedImage = kShtCudaBase + 6,
  kShtRelocatedImage = kShtCudaBase + 7,
  kShtBacktrace = kShtCudaBase + 8,
  kShtDeviceTable = kShtCudaBase + 9,
  kShtContextTable = kShtCudaBase + 10,
  kShtSmTable = kShtCudaBase + 11,
  kShtGridTable = kShtCudaBase + 12,
  kShtCtaTable = kShtCudaBase + 13,
  kShtWarpTable = kShtCudaBase + 14,
  kShtLaneTable = kShtCudaBase + 15,
  kShtModuleTable = kShtCudaBase + 16,
  kShtPredicates = kShtCudaBase + 17,
  kShtParamMemory = kShtCudaBase + 18,
  kShtUniformRegisters = kShtCudaBase + 19,   // r400
  kShtUniformPredicates = kShtCudaBase + 20,  // r400
  kShtConstBankTable = kShtCudaBase + 21,     // r550
  kShtMeta = kShtCudaBase + 22,               // r565
  kShtConvergenceBarriers = kShtCudaBase + 23,  // r575
};

// The tables whose rows this reader reads.
enum class Table { kDevices, kContexts, kModules, kGrids, kSms, kCtas, kWarps, kLanes, kMeta };

struct TableSpec {
  Table table;
  uint32_t type;
  const char* noun;          // "warp table"
  const char* name;          // the section name (prefix): ".cudbg.wptbl"
  uint64_t first_row_bytes;  // the first driver's rows (r346; r565 for the metadata)
  uint64_t known_row_bytes;  // what this reader knows (r575)
};

const TableSpec& Spec(Table t);
std::optional<Table> TableOfType(uint32_t type);

// Field offsets within a row, and the driver that added fields past the
// first layout.
namespace device_row {
inline constexpr size_t kName = 0, kType = 8, kSmType = 16;  // string-table indices (u64)
inline constexpr size_t kId = 24, kPciBus = 28, kPciDevice = 32, kNumSms = 36, kWarpsPerSm = 40, kLanesPerWarp = 44,
                        kSmMajor = 56, kSmMinor = 60;  // u32
}  // namespace device_row
namespace context_row {
inline constexpr size_t kContextId = 0;  // u64
}  // namespace context_row
namespace module_row {
inline constexpr size_t kHandle = 0;  // u64
}  // namespace module_row
namespace grid_row {
inline constexpr size_t kGridId = 0, kContext = 8, kFunction = 16, kFunctionEntry = 24, kModule = 32;  // u64
inline constexpr size_t kGridDim = 72, kBlockDim = 84;  // 3 x u32
inline constexpr size_t kClusterDim = 104;              // 3 x u32, r525
}  // namespace grid_row
namespace sm_row {
inline constexpr size_t kSmId = 0;                                      // u32
inline constexpr size_t kException = 8, kErrorPcValid = 12;             // u32, r555
inline constexpr size_t kErrorPc = 16;                                  // u64, r555
}  // namespace sm_row
namespace cta_row {
inline constexpr size_t kGridId = 0;   // u64
inline constexpr size_t kBlock = 8;    // 3 x u32
inline constexpr size_t kCluster = 24;  // 3 x u32, r525
}  // namespace cta_row
namespace warp_row {
inline constexpr size_t kErrorPc = 0;  // u64
inline constexpr size_t kWarpId = 8, kValidLanes = 12, kActiveLanes = 16, kBroken = 20, kErrorPcValid = 24;  // u32
}  // namespace warp_row
namespace lane_row {
inline constexpr size_t kVirtualPc = 0, kFunctionOffset = 8;  // u64
inline constexpr size_t kLane = 16, kThread = 20, kException = 32;  // u32 (thread: 3 x u32)
}  // namespace lane_row
namespace meta_row {
inline constexpr size_t kGenerator = 0;  // string-table index (u64)
inline constexpr size_t kDriverMajor = 8, kDriverMinor = 12, kCudaMajor = 16, kCudaMinor = 20, kFlags = 24,
                        kTimestamp = 28;  // u32
}  // namespace meta_row

// One row: `bytes` is the row's sh_entsize, of which fields past the
// table's known size are never read.
class Row {
 public:
  Row(const unsigned char* p, uint64_t bytes) : p_(p), bytes_(bytes) {}
  bool Has(size_t offset, size_t width) const { return offset + width <= bytes_; }
  uint32_t U32(size_t offset) const { return Le32(p_ + offset); }
  uint64_t U64(size_t offset) const { return Le64(p_ + offset); }

 private:
  const unsigned char* p_;
  uint64_t bytes_;
};

// Generation-flag bits (the metadata row's `flags`).
inline constexpr uint32_t kFlagSkipUnrelocatedImages = 1u << 0;
inline constexpr uint32_t kFlagSkipGlobalMemory = 1u << 1;
inline constexpr uint32_t kFlagSkipSharedMemory = 1u << 2;
inline constexpr uint32_t kFlagSkipLocalMemory = 1u << 3;
inline constexpr uint32_t kFlagRetired4 = 1u << 4;  // once "skip abort"; leaves nothing out
inline constexpr uint32_t kFlagSkipConstBankMemory = 1u << 5;

}  // namespace crashreplay::coredump
