// Reading a core dump: scan the section headers, load the tables this
// reader uses, check every link between them, then walk devices -> SMs ->
// blocks -> warps -> lanes for the faults (docs/formats/coredump.md).
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_format.h"
#include "byte_source.h"
#include "crashreplay/formats/coredump/coredump.h"
#include "elf_reader.h"
#include "function_lookup.h"
#include "table_layout.h"

namespace crashreplay::coredump {
namespace {

constexpr uint64_t kScanChunk = 4096;  // section headers read at a time
constexpr size_t kMaxNameInLabel = 128;  // real section names are under 64 bytes
constexpr uint64_t kMaxHeldStrings = uint64_t{64} << 20;  // device and generator strings, in all
constexpr size_t kMaxProblemNotes = 3;

// "section 12 '.cudbg.wptbl.dev0.sm3.cta0'", the name made printable and cut.
std::string SectionLabel(uint64_t index, const std::string& name) {
  std::string shown = Printable(name.size() > kMaxNameInLabel ? name.substr(0, kMaxNameInLabel) : name);
  if (name.size() > kMaxNameInLabel) shown += "...";
  return absl::StrFormat("section %d '%s'", index, shown);
}

struct TableSection {
  Table table = Table::kDevices;
  ElfSection header;
  std::string label;  // "section 12 '.cudbg.wptbl.dev0.sm3.cta0'"
  std::vector<unsigned char> bytes;
  uint64_t rows = 0;
  uint64_t stride = 0;  // sh_entsize

  Row RowAt(uint64_t i) const { return Row(bytes.data() + i * stride, stride); }
  std::string RowLabel(uint64_t i) const {
    return absl::StrFormat("%s row %d (file offset %d)", label, i, header.offset + i * stride);
  }
};

// Children of a table row: (parent section, parent row) -> the child table.
using ChildMap = std::map<std::pair<const TableSection*, uint64_t>, const TableSection*>;

class Reader {
 public:
  Reader(const ByteSource& source, std::string what) : source_(source), what_(std::move(what)) {}
  absl::StatusOr<Coredump> Read();

 private:
  absl::Status Scan();
  absl::StatusOr<std::string> SectionName(const ElfSection& s);
  absl::Status LoadTable(TableSection& t);
  absl::StatusOr<const TableSection*> Parent(const TableSection& child, Table parent);
  absl::Status Link(Table child, Table parent, ChildMap* out);
  absl::StatusOr<std::string> String(const TableSection& t, uint64_t row, const char* field, uint64_t index);
  absl::Status ReadDevices();
  absl::Status ReadMeta();
  absl::Status ReadModulesAndImages(std::vector<ImageRef>* images);
  absl::Status ReadGrids();
  void CollectFaults(FunctionIndex& functions);
  void AddNotes();
  std::vector<const TableSection*> TablesOf(Table t) const;

  const ByteSource& source_;
  std::string what_;
  std::optional<ElfFile> elf_;
  std::vector<unsigned char> names_;  // the section-name table
  std::optional<ElfSection> strtab_section_;
  std::optional<std::vector<unsigned char>> strtab_;
  std::vector<std::unique_ptr<TableSection>> tables_;  // in section order
  std::unordered_map<uint64_t, TableSection*> by_index_;
  std::vector<std::pair<ElfSection, std::string>> images_;  // relocated images, with labels
  uint64_t held_budget_ = 0;  // table bytes that may still be held (the file's size)
  uint64_t strings_budget_ = kMaxHeldStrings;
  uint64_t cut_sections_ = 0;
  uint64_t faults_not_listed_ = 0;
  std::string first_cut_;
  const TableSection* devices_ = nullptr;
  ChildMap sm_of_, cta_of_, warp_of_, lane_of_;
  std::map<std::pair<uint32_t, uint64_t>, size_t> grid_by_id_;  // (device row, grid id) -> out_.grids
  Coredump out_;
};

std::vector<const TableSection*> Reader::TablesOf(Table t) const {
  std::vector<const TableSection*> out;
  for (const auto& s : tables_) {
    if (s->table == t) out.push_back(s.get());
  }
  return out;
}

absl::StatusOr<std::string> Reader::SectionName(const ElfSection& s) {
  if (elf_->names_index() == 0) return std::string();
  std::string name, why;
  if (!StringAt(names_, s.name, &name, &why)) {
    return absl::DataLossError(
        absl::StrFormat("%s: section %d (type 0x%x): its name (sh_name %d) cannot be read from the section-name "
                        "table: %s",
                        what_, s.index, s.type, s.name, why));
  }
  return name;
}

absl::Status Reader::Scan() {
  absl::StatusOr<ElfFile> elf = ElfFile::Open(source_, what_);
  if (!elf.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("not a CUDA core dump: %s", elf.status().message()));
  }
  elf_ = std::move(*elf);
  if (elf_->machine() != kEmCuda) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: not a CUDA core dump: e_machine is %d, a CUDA core dump's is %d (EM_CUDA)", what_,
                        elf_->machine(), kEmCuda));
  }
  if (elf_->type() != kEtCore) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not a CUDA core dump: e_type is %d, a core dump's is %d (ET_CORE); a CUDA module image is ET_EXEC", what_,
        elf_->type(), kEtCore));
  }
  if (absl::Status s = elf_->LoadSectionTable(kMaxSections); !s.ok()) return s;
  const uint64_t n = elf_->num_sections();
  if (elf_->names_index() != 0) {
    absl::StatusOr<ElfSection> names = elf_->ReadSection(elf_->names_index());
    if (!names.ok()) return names.status();
    if (absl::Status s = elf_->SectionBytes(
            *names, kMaxTableBytes, absl::StrFormat("the section-name table (section %d)", names->index), &names_);
        !s.ok()) {
      return s;
    }
  }
  std::vector<ElfSection> chunk;
  for (uint64_t first = 0; first < n; first += kScanChunk) {
    if (absl::Status s = elf_->ReadSections(first, std::min(kScanChunk, n - first), &chunk); !s.ok()) return s;
    for (const ElfSection& s : chunk) {
      if (s.index == 0) continue;  // the null section (or the extended count)
      ++out_.contents.sections;
      if (s.link >= n) {
        return absl::DataLossError(
            absl::StrFormat("%s: section %d (type 0x%x): sh_link %d points past the last section (the dump has %d)",
                            what_, s.index, s.type, s.link, n));
      }
      if (const std::optional<Table> table = TableOfType(s.type)) {
        absl::StatusOr<std::string> name = SectionName(s);
        if (!name.ok()) return name.status();
        auto t = std::make_unique<TableSection>();
        t->table = *table;
        t->header = s;
        t->label = SectionLabel(s.index, *name);
        by_index_[s.index] = t.get();
        tables_.push_back(std::move(t));
        continue;
      }
      switch (s.type) {
        case kShtRelocatedImage: {
          absl::StatusOr<std::string> name = SectionName(s);
          if (!name.ok()) return name.status();
          images_.emplace_back(s, SectionLabel(s.index, *name));
          ++out_.contents.relocated_images;
          continue;
        }
        case kShtStrtab: {
          if (s.index == elf_->names_index()) break;
          absl::StatusOr<std::string> name = SectionName(s);
          if (!name.ok()) return name.status();
          if (*name != ".strtab") break;
          if (strtab_section_.has_value()) {
            return absl::DataLossError(
                absl::StrFormat("%s: two .strtab sections (%d and %d)", what_, strtab_section_->index, s.index));
          }
          strtab_section_ = s;
          continue;
        }
        case kShtGlobalMemory: ++out_.contents.global_memory; break;
        case kShtManagedMemory: ++out_.contents.managed_memory; break;
        case kShtSharedMemory: ++out_.contents.shared_memory; break;
        case kShtLocalMemory: ++out_.contents.local_memory; break;
        case kShtParamMemory: ++out_.contents.param_memory; break;
        case kShtRegisters: ++out_.contents.registers; break;
        case kShtPredicates: ++out_.contents.predicates; break;
        case kShtUniformRegisters: ++out_.contents.uniform_registers; break;
        case kShtUniformPredicates: ++out_.contents.uniform_predicates; break;
        case kShtBacktrace: ++out_.contents.backtraces; break;
        case kShtUnrelocatedImage: ++out_.contents.unrelocated_images; break;
        case kShtConstBankTable: ++out_.contents.const_bank_tables; break;
        default: break;
      }
      // A section this reader does not read: its bytes are only checked
      // to be there (a dump cut inside its memory still shows its faults).
      if (!elf_->BytesInFile(s)) {
        if (cut_sections_++ == 0) first_cut_ = absl::StrFormat("section %d (type 0x%x)", s.index, s.type);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Reader::LoadTable(TableSection& t) {
  const TableSpec& spec = Spec(t.table);
  const ElfSection& h = t.header;
  if (!elf_->BytesInFile(h)) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %s (%s): its %d bytes at offset %d run past the end of the file (%d bytes): the dump is truncated", what_,
        t.label, spec.noun, h.size, h.offset, source_.size()));
  }
  if (h.entsize < spec.first_row_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %s (%s): rows of %d bytes (sh_entsize), shorter than the %d bytes of the first driver's %s rows", what_,
        t.label, spec.noun, h.entsize, spec.first_row_bytes, spec.noun));
  }
  if (h.size % h.entsize != 0) {
    return absl::DataLossError(absl::StrFormat("%s: %s (%s): its %d bytes are not a whole number of %d-byte rows",
                                               what_, t.label, spec.noun, h.size, h.entsize));
  }
  // Sections of a sound file do not overlap: the bytes held for tables
  // never pass the file's size, however a forged one points them.
  if (h.size > held_budget_) {
    return absl::DataLossError(
        absl::StrFormat("%s: %s (%s): the tables' sections add up to more bytes than the file's %d: they overlap",
                        what_, t.label, spec.noun, source_.size()));
  }
  held_budget_ -= h.size;
  if (absl::Status s = elf_->SectionBytes(h, kMaxTableBytes, t.label, &t.bytes); !s.ok()) return s;
  t.stride = h.entsize;
  t.rows = h.size / h.entsize;
  return absl::OkStatus();
}

absl::StatusOr<const TableSection*> Reader::Parent(const TableSection& child, Table parent) {
  const TableSpec& want = Spec(parent);
  const uint32_t link = child.header.link;
  auto it = by_index_.find(link);
  if (it == by_index_.end() || it->second->table != parent) {
    std::string is;
    if (link == 0) {
      is = "section 0 is the null section";
    } else if (it != by_index_.end()) {
      is = absl::StrFormat("%s is a %s", it->second->label, Spec(it->second->table).noun);
    } else {
      absl::StatusOr<ElfSection> s = elf_->ReadSection(link);
      is = s.ok() ? absl::StrFormat("section %d is of type 0x%x", link, s->type) : std::string(s.status().message());
    }
    return absl::DataLossError(absl::StrFormat("%s: %s (%s): sh_link %d should name its %s, but %s", what_, child.label,
                                               Spec(child.table).noun, link, want.noun, is));
  }
  const TableSection* p = it->second;
  if (child.header.info >= p->rows) {
    return absl::DataLossError(absl::StrFormat("%s: %s (%s): sh_info %d names row %d of %s, which has %d row%s", what_,
                                               child.label, Spec(child.table).noun, child.header.info,
                                               child.header.info, p->label, p->rows, p->rows == 1 ? "" : "s"));
  }
  return p;
}

absl::Status Reader::Link(Table child, Table parent, ChildMap* out) {
  for (const TableSection* t : TablesOf(child)) {
    absl::StatusOr<const TableSection*> p = Parent(*t, parent);
    if (!p.ok()) return p.status();
    auto [it, fresh] = out->emplace(std::make_pair(*p, uint64_t{t->header.info}), t);
    if (!fresh) {
      return absl::DataLossError(absl::StrFormat("%s: %s and %s are both the %s of row %d of %s", what_,
                                                 it->second->label, t->label, Spec(child).noun, t->header.info,
                                                 (*p)->label));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Reader::String(const TableSection& t, uint64_t row, const char* field, uint64_t index) {
  if (!strtab_section_.has_value()) {
    return absl::DataLossError(absl::StrFormat("%s: %s: %s is string %d, but the dump has no .strtab section", what_,
                                               t.RowLabel(row), field, index));
  }
  if (!strtab_.has_value()) {
    std::vector<unsigned char> bytes;
    if (absl::Status s = elf_->SectionBytes(
            *strtab_section_, kMaxTableBytes,
            absl::StrFormat("the string table (section %d '.strtab')", strtab_section_->index), &bytes);
        !s.ok()) {
      return s;
    }
    strtab_ = std::move(bytes);
  }
  std::string out, why;
  if (!StringAt(*strtab_, index, &out, &why)) {
    return absl::DataLossError(
        absl::StrFormat("%s: %s: %s is string %d of .strtab: %s", what_, t.RowLabel(row), field, index, why));
  }
  if (out.size() > strings_budget_) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: %s: %s (string %d, %d bytes) would pass this reader's cap of %d bytes of strings held",
                        what_, t.RowLabel(row), field, index, out.size(), kMaxHeldStrings));
  }
  strings_budget_ -= out.size();
  return out;
}

absl::Status Reader::ReadDevices() {
  const std::vector<const TableSection*> tables = TablesOf(Table::kDevices);
  if (tables.empty()) {
    return absl::DataLossError(absl::StrFormat(
        "%s: no device table (a section of type 0x%x, '.cudbg.devtbl'): every CUDA core dump has one; this file "
        "holds %d sections and cannot be read without it",
        what_, kShtDeviceTable, out_.contents.sections));
  }
  if (tables.size() > 1) {
    return absl::DataLossError(absl::StrFormat("%s: two device tables (%s and %s); a core dump has one", what_,
                                               tables[0]->label, tables[1]->label));
  }
  devices_ = tables[0];
  for (uint64_t r = 0; r < devices_->rows; ++r) {
    const Row row = devices_->RowAt(r);
    Device d;
    d.index = static_cast<uint32_t>(r);
    absl::StatusOr<std::string> name = String(*devices_, r, "the device name", row.U64(device_row::kName));
    if (!name.ok()) return name.status();
    absl::StatusOr<std::string> type = String(*devices_, r, "the device type", row.U64(device_row::kType));
    if (!type.ok()) return type.status();
    absl::StatusOr<std::string> sm = String(*devices_, r, "the SM type", row.U64(device_row::kSmType));
    if (!sm.ok()) return sm.status();
    d.name = std::move(*name);
    d.type = std::move(*type);
    d.sm_type = std::move(*sm);
    d.id = row.U32(device_row::kId);
    d.pci_bus = row.U32(device_row::kPciBus);
    d.pci_device = row.U32(device_row::kPciDevice);
    d.num_sms = row.U32(device_row::kNumSms);
    d.warps_per_sm = row.U32(device_row::kWarpsPerSm);
    d.lanes_per_warp = row.U32(device_row::kLanesPerWarp);
    d.sm_major = row.U32(device_row::kSmMajor);
    d.sm_minor = row.U32(device_row::kSmMinor);
    out_.devices.push_back(std::move(d));
  }
  out_.contents.devices = devices_->rows;
  return absl::OkStatus();
}

absl::Status Reader::ReadMeta() {
  const std::vector<const TableSection*> tables = TablesOf(Table::kMeta);
  if (tables.empty()) return absl::OkStatus();
  if (tables.size() > 1) {
    return absl::DataLossError(absl::StrFormat("%s: two metadata sections (%s and %s); a core dump has at most one",
                                               what_, tables[0]->label, tables[1]->label));
  }
  const TableSection& t = *tables[0];
  if (t.rows == 0) {
    out_.notes.push_back(absl::StrFormat("the metadata section (%s) holds no row", t.label));
    return absl::OkStatus();
  }
  const Row row = t.RowAt(0);
  Meta m;
  absl::StatusOr<std::string> generator = String(t, 0, "the generator name", row.U64(meta_row::kGenerator));
  if (!generator.ok()) return generator.status();
  m.generator = std::move(*generator);
  m.driver_major = row.U32(meta_row::kDriverMajor);
  m.driver_minor = row.U32(meta_row::kDriverMinor);
  m.cuda_major = row.U32(meta_row::kCudaMajor);
  m.cuda_minor = row.U32(meta_row::kCudaMinor);
  m.flags = row.U32(meta_row::kFlags);
  m.timestamp = row.U32(meta_row::kTimestamp);
  out_.meta = std::move(m);
  out_.left_out = LeftOutByFlags(out_.meta->flags);
  return absl::OkStatus();
}

absl::Status Reader::ReadModulesAndImages(std::vector<ImageRef>* images) {
  ChildMap ctx_of, mod_of;
  if (absl::Status s = Link(Table::kContexts, Table::kDevices, &ctx_of); !s.ok()) return s;
  if (absl::Status s = Link(Table::kModules, Table::kContexts, &mod_of); !s.ok()) return s;
  for (const TableSection* t : TablesOf(Table::kContexts)) out_.contents.contexts += t->rows;
  for (const TableSection* t : TablesOf(Table::kModules)) out_.contents.modules += t->rows;
  std::map<std::pair<const TableSection*, uint64_t>, std::string> image_of;
  for (const auto& [section, label] : images_) {
    auto it = by_index_.find(section.link);
    if (it == by_index_.end() || it->second->table != Table::kModules) {
      return absl::DataLossError(absl::StrFormat(
          "%s: %s (a relocated module image): sh_link %d should name its module table, but %s", what_, label,
          section.link,
          it == by_index_.end() ? absl::StrFormat("section %d is not one", section.link)
                                : absl::StrFormat("%s is a %s", it->second->label, Spec(it->second->table).noun)));
    }
    const TableSection* modules = it->second;
    if (section.info >= modules->rows) {
      return absl::DataLossError(
          absl::StrFormat("%s: %s (a relocated module image): sh_info %d names row %d of %s, which has %d rows", what_,
                          label, section.info, section.info, modules->label, modules->rows));
    }
    auto [seen, fresh] = image_of.emplace(std::make_pair(modules, uint64_t{section.info}), label);
    if (!fresh) {
      return absl::DataLossError(absl::StrFormat("%s: %s and %s are both the relocated image of row %d of %s", what_,
                                                 seen->second, label, section.info, modules->label));
    }
    // module table -> its context table -> the device row that one names.
    const TableSection* contexts = by_index_.at(modules->header.link);
    ImageRef ref;
    ref.section = section;
    ref.label = label;
    ref.device_index = contexts->header.info;
    ref.module_handle = modules->RowAt(section.info).U64(module_row::kHandle);
    images->push_back(std::move(ref));
  }
  return absl::OkStatus();
}

absl::Status Reader::ReadGrids() {
  ChildMap grids_of;
  if (absl::Status s = Link(Table::kGrids, Table::kDevices, &grids_of); !s.ok()) return s;
  for (const TableSection* t : TablesOf(Table::kGrids)) {
    const uint32_t device = t->header.info;
    for (uint64_t r = 0; r < t->rows; ++r) {
      const Row row = t->RowAt(r);
      Grid g;
      g.device_index = device;
      g.id = row.U64(grid_row::kGridId);
      g.context = row.U64(grid_row::kContext);
      g.function_entry = row.U64(grid_row::kFunctionEntry);
      g.module_handle = row.U64(grid_row::kModule);
      g.grid_dim = {row.U32(grid_row::kGridDim), row.U32(grid_row::kGridDim + 4), row.U32(grid_row::kGridDim + 8)};
      g.block_dim = {row.U32(grid_row::kBlockDim), row.U32(grid_row::kBlockDim + 4), row.U32(grid_row::kBlockDim + 8)};
      if (row.Has(grid_row::kClusterDim, 12)) {
        g.cluster_dim = Dim3{row.U32(grid_row::kClusterDim), row.U32(grid_row::kClusterDim + 4),
                             row.U32(grid_row::kClusterDim + 8)};
      }
      grid_by_id_.emplace(std::make_pair(device, g.id), out_.grids.size());
      out_.grids.push_back(std::move(g));
    }
  }
  out_.contents.grids = out_.grids.size();
  return absl::OkStatus();
}

void Reader::CollectFaults(FunctionIndex& functions) {
  std::map<std::tuple<uint32_t, std::optional<uint64_t>, uint64_t>, size_t> located;
  auto locate = [&](uint32_t device, std::optional<size_t> grid, uint64_t pc) -> size_t {
    const std::optional<uint64_t> module =
        grid.has_value() ? std::optional<uint64_t>(out_.grids[*grid].module_handle) : std::nullopt;
    auto [it, fresh] = located.emplace(std::make_tuple(device, module, pc), out_.locations.size());
    if (fresh) out_.locations.push_back(functions.Locate(device, module, pc));
    return it->second;
  };
  for (const Device& device : out_.devices) {
    auto sm_it = sm_of_.find({devices_, device.index});
    if (sm_it == sm_of_.end()) continue;
    const TableSection* sms = sm_it->second;
    for (uint64_t s = 0; s < sms->rows; ++s) {
      const Row sm = sms->RowAt(s);
      const uint32_t sm_id = sm.U32(sm_row::kSmId);
      const bool sm_knows = sm.Has(sm_row::kErrorPc, 8);
      const uint32_t sm_exception = sm_knows ? sm.U32(sm_row::kException) : 0;
      uint64_t warp_faults = 0;  // found on this SM, listed or not
      auto cta_it = cta_of_.find({sms, s});
      const TableSection* ctas = cta_it == cta_of_.end() ? nullptr : cta_it->second;
      for (uint64_t c = 0; ctas != nullptr && c < ctas->rows; ++c) {
        const Row cta = ctas->RowAt(c);
        const uint64_t grid_id = cta.U64(cta_row::kGridId);
        const Dim3 block{cta.U32(cta_row::kBlock), cta.U32(cta_row::kBlock + 4), cta.U32(cta_row::kBlock + 8)};
        std::optional<size_t> grid;
        if (auto g = grid_by_id_.find({device.index, grid_id}); g != grid_by_id_.end()) grid = g->second;
        auto warp_it = warp_of_.find({ctas, c});
        const TableSection* warps = warp_it == warp_of_.end() ? nullptr : warp_it->second;
        for (uint64_t w = 0; warps != nullptr && w < warps->rows; ++w) {
          const Row warp = warps->RowAt(w);
          const bool pc_valid = warp.U32(warp_row::kErrorPcValid) != 0;
          Fault f;
          f.device_index = device.index;
          f.device_id = device.id;
          f.sm = sm_id;
          f.warp = warp.U32(warp_row::kWarpId);
          f.valid_lanes = warp.U32(warp_row::kValidLanes);
          f.active_lanes = warp.U32(warp_row::kActiveLanes);
          f.grid_id = grid_id;
          f.block = block;
          f.grid = grid;
          if (pc_valid) f.error_pc = warp.U64(warp_row::kErrorPc);
          auto lane_it = lane_of_.find({warps, w});
          if (lane_it != lane_of_.end()) {
            f.lanes_read = true;
            const TableSection* lanes = lane_it->second;
            for (uint64_t l = 0; l < lanes->rows; ++l) {
              const Row lane = lanes->RowAt(l);
              const uint32_t exception = lane.U32(lane_row::kException);
              if (exception == 0) continue;
              f.lanes.push_back(FaultingLane{
                  lane.U32(lane_row::kLane),
                  Dim3{lane.U32(lane_row::kThread), lane.U32(lane_row::kThread + 4), lane.U32(lane_row::kThread + 8)},
                  exception, lane.U64(lane_row::kVirtualPc)});
            }
          }
          if (f.lanes.empty() && !pc_valid) continue;
          ++warp_faults;
          if (out_.faults.size() >= kMaxFaults) {
            ++faults_not_listed_;
            continue;
          }
          f.exception = !f.lanes.empty() ? f.lanes[0].exception : sm_exception;
          if (f.error_pc.has_value()) {
            f.pc_source = PcSource::kWarp;
            f.location = locate(device.index, grid, *f.error_pc);
          } else if (!f.lanes.empty()) {
            f.pc_source = PcSource::kLane;
            f.location = locate(device.index, grid, f.lanes[0].pc);
          }
          out_.faults.push_back(std::move(f));
        }
      }
      if (sm_exception != 0 && warp_faults == 0) {
        // The SM saw an exception no warp in the dump carries.
        if (out_.faults.size() >= kMaxFaults) {
          ++faults_not_listed_;
          continue;
        }
        Fault f;
        f.device_index = device.index;
        f.device_id = device.id;
        f.sm = sm_id;
        f.exception = sm_exception;
        if (sm.U32(sm_row::kErrorPcValid) != 0) {
          f.error_pc = sm.U64(sm_row::kErrorPc);
          f.pc_source = PcSource::kSm;
          f.location = locate(device.index, std::nullopt, *f.error_pc);
        }
        out_.faults.push_back(std::move(f));
      }
    }
  }
}

void Reader::AddNotes() {
  for (Table t : {Table::kDevices, Table::kGrids, Table::kSms, Table::kCtas, Table::kWarps, Table::kLanes,
                  Table::kContexts, Table::kModules, Table::kMeta}) {
    const TableSpec& spec = Spec(t);
    for (const TableSection* s : TablesOf(t)) {
      if (s->stride > spec.known_row_bytes) {
        out_.notes.push_back(absl::StrFormat(
            "%s rows are %d bytes; this reader knows their first %d (r575's layout): a newer driver wrote the rest, "
            "which is not read",
            spec.noun, s->stride, spec.known_row_bytes));
        break;
      }
    }
  }
  for (const TableSection* s : TablesOf(Table::kSms)) {
    if (s->stride < sm_row::kErrorPc + 8) {
      out_.notes.push_back(absl::StrFormat(
          "SM rows are %d bytes (a driver before r555): they carry no exception, so an SM whose faulting warps exited "
          "before the dump is not shown",
          s->stride));
      break;
    }
  }
  if (!out_.meta.has_value()) {
    out_.notes.push_back(
        "the dump has no metadata section (drivers before r565 write none): the driver and CUDA versions and the "
        "generation flags are not recorded");
  }
  if (faults_not_listed_ > 0) {
    out_.notes.push_back(absl::StrFormat("%d more faults are not listed (this reader lists at most %d)",
                                         faults_not_listed_, kMaxFaults));
  }
  if (cut_sections_ > 0) {
    out_.notes.push_back(absl::StrFormat(
        "%d section%s this reader does not read (memory, registers) run%s past the end of the file, the first %s: "
        "the dump is truncated; everything shown here was read whole",
        cut_sections_, cut_sections_ == 1 ? "" : "s", cut_sections_ == 1 ? "s" : "", first_cut_));
  }
}

absl::StatusOr<Coredump> Reader::Read() {
  out_.file_bytes = source_.size();
  held_budget_ = source_.size();
  if (absl::Status s = Scan(); !s.ok()) return s;
  for (auto& t : tables_) {
    if (absl::Status s = LoadTable(*t); !s.ok()) return s;
  }
  if (absl::Status s = ReadDevices(); !s.ok()) return s;
  if (absl::Status s = ReadMeta(); !s.ok()) return s;
  std::vector<ImageRef> images;
  if (absl::Status s = ReadModulesAndImages(&images); !s.ok()) return s;
  if (absl::Status s = ReadGrids(); !s.ok()) return s;
  if (absl::Status s = Link(Table::kSms, Table::kDevices, &sm_of_); !s.ok()) return s;
  if (absl::Status s = Link(Table::kCtas, Table::kSms, &cta_of_); !s.ok()) return s;
  if (absl::Status s = Link(Table::kWarps, Table::kCtas, &warp_of_); !s.ok()) return s;
  if (absl::Status s = Link(Table::kLanes, Table::kWarps, &lane_of_); !s.ok()) return s;
  for (const TableSection* t : TablesOf(Table::kSms)) out_.contents.sms += t->rows;
  for (const TableSection* t : TablesOf(Table::kCtas)) out_.contents.ctas += t->rows;
  for (const TableSection* t : TablesOf(Table::kWarps)) out_.contents.warps += t->rows;
  for (const TableSection* t : TablesOf(Table::kLanes)) out_.contents.lanes += t->rows;
  FunctionIndex functions(source_, std::move(images));
  CollectFaults(functions);
  AddNotes();
  const std::vector<std::string>& problems = functions.Problems();
  for (size_t i = 0; i < problems.size() && i < kMaxProblemNotes; ++i) out_.notes.push_back(problems[i]);
  if (problems.size() > kMaxProblemNotes) {
    out_.notes.push_back(absl::StrFormat("%d more module images cannot be read", problems.size() - kMaxProblemNotes));
  }
  return std::move(out_);
}

}  // namespace

absl::StatusOr<Coredump> ReadCoredump(std::span<const std::byte> bytes, std::string_view source) {
  std::unique_ptr<ByteSource> src = MemorySource(bytes);
  return Reader(*src, std::string(source)).Read();
}

absl::StatusOr<Coredump> ReadCoredumpFile(const std::string& path) {
  absl::StatusOr<std::unique_ptr<ByteSource>> src = FileSource(path);
  if (!src.ok()) return src.status();
  return Reader(**src, path).Read();
}

}  // namespace crashreplay::coredump
