// A reader for CUDA GPU core dumps: the ELF file a process writes when a
// device exception hits while core dumps are armed
// (CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1). It says which device, SM, warp and
// lanes faulted, with which exception, at which PC and in which function
// (with its offset, demangled, from the relocated module image's symbols),
// the grid and block dimensions and the block and thread indices, the
// driver's versions and the generation flags from the metadata section, and
// what the dump leaves out (a lightweight dump holds no memory).
//
// What it reads (docs/formats/coredump.md has the layout, from NVIDIA's
// public cudacoredump.h; this reader follows the revision whose history
// ends at driver r575): an ELF64 little-endian file with e_machine EM_CUDA
// (190) and e_type ET_CORE, whose `.cudbg.*` sections are tables of
// fixed-size rows linked by sh_link (the parent table's section) and
// sh_info (the row of the parent). Rows grow with newer drivers, so each
// table is read with its own sh_entsize: the prefix this reader knows is
// read, anything past it is ignored (and said in `notes`); a row shorter
// than the first driver's layout is refused. Fields a driver added later
// than the dump's rows are reported absent, never zero-filled.
//
// Hostile input: every offset, size, row size, row count, sh_link, sh_info
// and string-table index is checked before use; a file that breaks a rule
// gives a Status, never a signal, and what the reader holds is bounded by
// the caps below and a small multiple of the file's size (a fault takes
// about five times the bytes of the warp row it comes from; module images
// are parsed only for the PCs looked up). Nothing is mapped: the file is read with pread, so
// a file shrinking under the reader gives DataLoss, not SIGBUS.
//
// Errors: InvalidArgument when the input is not a CUDA core dump (not ELF,
// not 64-bit little-endian, e_machine or e_type wrong); DataLoss for a
// corrupt or truncated dump, naming the section (index and name), the row
// and the file offset; ResourceExhausted over a cap; NotFound when there is
// no regular file at the path (a directory, FIFO or device is refused
// without blocking); PermissionDenied / FailedPrecondition for other I/O.
// Problems inside an embedded module image (the cubin the symbols come
// from) do not fail the read: the fault's function is then unknown and
// `Location::why_unknown` says why.
//
// Thread safety: the functions are pure; results are plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace crashreplay::coredump {

// Caps on what one dump may make the reader hold.
inline constexpr uint64_t kMaxSections = uint64_t{1} << 22;     // a full 8-GPU dump has ~10^6
inline constexpr uint64_t kMaxTableBytes = uint64_t{256} << 20;  // one table section
inline constexpr uint64_t kMaxStringBytes = 64 << 10;            // one string (device or symbol name)
inline constexpr uint64_t kMaxDemangleBytes = 8192;              // longer names are shown mangled
inline constexpr uint64_t kMaxFaults = uint64_t{1} << 20;         // 8 full GPUs hold ~70,000 warps

struct Dim3 {
  uint32_t x = 0, y = 0, z = 0;
  friend bool operator==(const Dim3&, const Dim3&) = default;
};

// The metadata row (`.cudbg.meta`, drivers r565 on).
struct Meta {
  std::string generator;      // who wrote the dump
  uint32_t driver_major = 0;  // the GPU driver as NVML reports it, e.g. 575.57 (0.0 on Tegra)
  uint32_t driver_minor = 0;
  uint32_t cuda_major = 0;  // the CUDA version of the driver API, e.g. 12.9 (not the toolkit's)
  uint32_t cuda_minor = 0;
  uint32_t flags = 0;      // the generation flags (see LeftOutByFlags)
  uint32_t timestamp = 0;  // seconds since the Unix epoch
};

struct Device {
  uint32_t index = 0;  // row in the device table (the N of ".devN" in section names)
  uint32_t id = 0;     // the CUDA device ID
  std::string name;    // display name, e.g. "NVIDIA H100 80GB HBM3"
  std::string type;    // internal name
  std::string sm_type;  // ISA, e.g. "sm_90"
  uint32_t sm_major = 0, sm_minor = 0;
  uint32_t num_sms = 0, warps_per_sm = 0, lanes_per_warp = 0;
  uint32_t pci_bus = 0, pci_device = 0;
};

struct Grid {
  uint32_t device_index = 0;
  uint64_t id = 0;  // gridId64
  uint64_t context = 0;
  uint64_t function_entry = 0;  // the kernel's entry address
  uint64_t module_handle = 0;
  Dim3 grid_dim, block_dim;
  std::optional<Dim3> cluster_dim;  // rows from r525 on
};

// The function a PC falls in, from a relocated module image's symbols.
struct Function {
  std::string name;       // as in the symbol table (mangled)
  std::string demangled;  // == name when not a C++ name or over kMaxDemangleBytes
  uint64_t start = 0;     // its address
  uint64_t size = 0;
  uint64_t offset = 0;  // pc - start
  uint64_t module_handle = 0;
};

struct Location {
  uint64_t pc = 0;
  std::optional<Function> function;
  std::string why_unknown;  // set when `function` is empty
};

// Where a location's PC came from.
enum class PcSource {
  kNone,  // no PC: the warp's error PC is not valid and no lane was read
  kWarp,  // the warp's error PC (valid)
  kSm,    // the SM's error PC (r555 rows; an SM-level report)
  kLane,  // the first faulting lane's PC: the warp's error PC is not valid
};
const char* PcSourceName(PcSource s);

struct FaultingLane {
  uint32_t lane = 0;
  Dim3 thread;
  uint32_t exception = 0;
  uint64_t pc = 0;  // the lane's virtual PC
};

// One faulting warp, or an SM that reports an exception none of its
// warps in the dump carries (`warp` empty: they exited before the dump).
struct Fault {
  uint32_t device_index = 0;
  uint32_t device_id = 0;
  uint32_t sm = 0;  // smId
  std::optional<uint32_t> warp;  // warpId
  uint32_t exception = 0;  // the first faulting lane's, else the SM's; 0 = none recorded
  std::optional<uint64_t> error_pc;  // only when the dump marks it valid
  PcSource pc_source = PcSource::kNone;
  std::optional<size_t> location;  // into Coredump::locations: the PC pc_source names
  bool lanes_read = false;  // false: the dump has no lane table for this warp
  std::vector<FaultingLane> lanes;  // lanes with an exception, in table order
  uint32_t valid_lanes = 0, active_lanes = 0;
  // The block the warp runs (absent for an SM-level report).
  std::optional<uint64_t> grid_id;
  std::optional<Dim3> block;
  std::optional<size_t> grid;  // into Coredump::grids: the row for grid_id, when the dump has it
};

// How many sections of each kind the dump holds (what it does not hold is
// what a reader cannot show).
struct Contents {
  uint64_t sections = 0;
  uint64_t global_memory = 0, managed_memory = 0, shared_memory = 0, local_memory = 0, param_memory = 0;
  uint64_t registers = 0, predicates = 0, uniform_registers = 0, uniform_predicates = 0, backtraces = 0;
  uint64_t relocated_images = 0, unrelocated_images = 0, const_bank_tables = 0;
  uint64_t devices = 0, contexts = 0, modules = 0, grids = 0, sms = 0, ctas = 0, warps = 0, lanes = 0;
};

struct Coredump {
  uint64_t file_bytes = 0;
  std::optional<Meta> meta;  // absent: no metadata section (drivers before r565 wrote none)
  std::vector<Device> devices;
  std::vector<Grid> grids;
  std::vector<Fault> faults;  // by device row, SM, block, warp, in table order
  // Each PC looked up once (warps of one kernel mostly fault at one PC).
  std::vector<Location> locations;
  Contents contents;
  // What the dump leaves out, as its generation flags state it (or, with
  // no metadata, that they are not recorded).
  std::vector<std::string> left_out;
  // Other things a reader of this dump should know: rows longer than this
  // reader knows, fields older rows lack, sections cut off by truncation.
  std::vector<std::string> notes;

  const Grid* GridOf(const Fault& f) const { return f.grid.has_value() ? &grids[*f.grid] : nullptr; }
  const Location* LocationOf(const Fault& f) const {
    return f.location.has_value() ? &locations[*f.location] : nullptr;
  }
};

// Reads a dump held in memory. `source` names it in messages.
absl::StatusOr<Coredump> ReadCoredump(std::span<const std::byte> bytes, std::string_view source);
// Reads the regular file at `path` (pread; never mapped, never blocks).
absl::StatusOr<Coredump> ReadCoredumpFile(const std::string& path);

// "warp assert", "warp illegal address", ...; "exception 77" for codes this
// reader does not know.
std::string ExceptionName(uint32_t code);
// What a dump written with these generation flags leaves out, one phrase a
// kind ("global memory", ...), and one for bits this reader does not know.
std::vector<std::string> LeftOutByFlags(uint32_t flags);

// The dump as text: one line per fault ("device 3 SM 12 warp 5 lane 0: warp
// assert in `kernel(...)` +0x1a40, block (12,0,0) thread (64,0,0), grid 7
// dims (..)(..)"), then the versions and what the dump leaves out.
std::vector<std::string> SummaryLines(const Coredump& dump);

}  // namespace crashreplay::coredump
