// A builder of CUDA core dumps for the coredump reader's tests and its fuzz
// seeds, written from NVIDIA's public description of the format
// (cudacoredump.h; docs/formats/coredump.md names the revision) and
// independently of the reader: rows are written field by field in the
// order the description declares them, with each driver's additions marked
// so that a dump can be written with any driver's row layout. Nothing here
// includes the reader's private headers. Header-only; tests only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"

namespace crashreplay::coredump_testing {

using Bytes = std::vector<unsigned char>;

inline void PutLe(Bytes& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

// A table row as the description declares it: fields in order, with the
// driver that added each group marked, so the row of an older driver is a
// prefix ending at a mark.
class Fields {
 public:
  Fields& U32(uint64_t v) {
    PutLe(bytes_, v, 4);
    return *this;
  }
  Fields& U64(uint64_t v) {
    PutLe(bytes_, v, 8);
    return *this;
  }
  // The fields so far are what driver `driver` (and later) writes.
  Fields& Since(int driver) {
    marks_.emplace_back(driver, bytes_.size());
    return *this;
  }
  // The row as driver `driver` writes it (the newest known group when it is
  // past every mark), plus `extra` bytes of a newer driver the description
  // does not know yet.
  Bytes Row(int driver, size_t extra) const {
    size_t size = 0;
    for (const auto& [d, end] : marks_) {
      if (d <= driver) size = end;
    }
    Bytes out(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(size));
    out.insert(out.end(), extra, 0xEE);
    return out;
  }

 private:
  Bytes bytes_;
  std::vector<std::pair<int, size_t>> marks_;
};

// A string table: index 0 is the empty string.
class Strings {
 public:
  Strings() : bytes_(1, 0) {}
  uint32_t Add(const std::string& s) {
    auto it = index_.find(s);
    if (it != index_.end()) return it->second;
    const uint32_t at = static_cast<uint32_t>(bytes_.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    bytes_.push_back(0);
    index_.emplace(s, at);
    return at;
  }
  const Bytes& bytes() const { return bytes_; }

 private:
  Bytes bytes_;
  std::map<std::string, uint32_t> index_;
};

// SHT_ values.
inline constexpr uint32_t kSymtab = 2, kStrtab = 3, kNobits = 8;
inline constexpr uint32_t kCuda = 0x80000000u;  // SHT_LOUSER
inline constexpr uint32_t kGlobalMem = kCuda + 2, kSharedMem = kCuda + 4, kRegs = kCuda + 5, kRelfImg = kCuda + 7,
                          kBacktrace = kCuda + 8, kDevTable = kCuda + 9, kCtxTable = kCuda + 10, kSmTable = kCuda + 11,
                          kGridTable = kCuda + 12, kCtaTable = kCuda + 13, kWarpTable = kCuda + 14,
                          kLaneTable = kCuda + 15, kModTable = kCuda + 16, kParamMem = kCuda + 18,
                          kConstBankTable = kCuda + 21, kMetaTable = kCuda + 22;

struct Section {
  std::string name;
  uint32_t type = 0;
  uint64_t addr = 0;
  uint32_t link = 0, info = 0;
  uint64_t entsize = 0;
  Bytes data;
  uint64_t nobits_size = 0;  // for SHT_NOBITS
};

// An ELF64 little-endian file: header, then (by default) the section
// header table, then each section's bytes 8-aligned in section order.
// Section 0 is the null section; the section-name table is added first.
class ElfWriter {
 public:
  ElfWriter(uint16_t type, uint16_t machine) : type_(type), machine_(machine) {
    Section names;
    names.name = ".shstrtab";
    names.type = kStrtab;
    sections_.push_back(names);
  }
  uint32_t Add(Section s) {
    sections_.push_back(std::move(s));
    return static_cast<uint32_t>(sections_.size());  // + the null section
  }
  Section& At(uint32_t index) { return sections_[index - 1]; }

  struct Layout {
    Bytes bytes;
    uint64_t headers_at = 0;           // e_shoff
    std::vector<uint64_t> data_at;     // per section index (0: the null section)
    std::vector<uint64_t> data_size;   // bytes in the file
  };

  // `extended` writes e_shnum = 0 and e_shstrndx = SHN_XINDEX, with the
  // real values in section 0 (as a file with 65280 or more sections must).
  Layout Write(bool extended = false) const {
    Strings names;
    std::vector<uint32_t> name_at;
    for (const Section& s : sections_) name_at.push_back(names.Add(s.name));
    const uint64_t count = sections_.size() + 1;
    Layout out;
    out.headers_at = 64;
    uint64_t at = out.headers_at + 64 * count;
    out.data_at.assign(count, 0);
    out.data_size.assign(count, 0);
    for (size_t i = 0; i < sections_.size(); ++i) {
      at = (at + 7) & ~uint64_t{7};
      const Bytes& data = i == 0 ? names.bytes() : sections_[i].data;
      out.data_at[i + 1] = at;
      out.data_size[i + 1] = sections_[i].type == kNobits ? 0 : data.size();
      at += out.data_size[i + 1];
    }
    Bytes& b = out.bytes;
    // e_ident: magic, ELFCLASS64, ELFDATA2LSB, EV_CURRENT, ELFOSABI_CUDA (0x33), ABI version.
    const unsigned char ident[16] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0x33, 7, 0, 0, 0, 0, 0, 0, 0};
    b.insert(b.end(), ident, ident + 16);
    PutLe(b, type_, 2);
    PutLe(b, machine_, 2);
    PutLe(b, 1, 4);               // e_version
    PutLe(b, 0, 8);               // e_entry
    PutLe(b, 0, 8);               // e_phoff
    PutLe(b, out.headers_at, 8);  // e_shoff
    PutLe(b, 0, 4);               // e_flags
    PutLe(b, 64, 2);              // e_ehsize
    PutLe(b, 0, 2);               // e_phentsize
    PutLe(b, 0, 2);               // e_phnum
    PutLe(b, 64, 2);              // e_shentsize
    PutLe(b, extended ? 0 : count, 2);
    PutLe(b, extended ? 0xffff : 1, 2);  // e_shstrndx: the names are section 1
    auto header = [&](uint32_t name, uint32_t type, uint64_t addr, uint64_t offset, uint64_t size, uint32_t link,
                      uint32_t info, uint64_t entsize) {
      PutLe(b, name, 4);
      PutLe(b, type, 4);
      PutLe(b, 0, 8);  // sh_flags
      PutLe(b, addr, 8);
      PutLe(b, offset, 8);
      PutLe(b, size, 8);
      PutLe(b, link, 4);
      PutLe(b, info, 4);
      PutLe(b, 1, 8);  // sh_addralign
      PutLe(b, entsize, 8);
    };
    header(0, 0, 0, 0, extended ? count : 0, extended ? 1 : 0, 0, 0);
    for (size_t i = 0; i < sections_.size(); ++i) {
      const Section& s = sections_[i];
      const uint64_t size = s.type == kNobits ? s.nobits_size : (i == 0 ? names.bytes().size() : s.data.size());
      header(name_at[i], s.type, s.addr, out.data_at[i + 1], size, s.link, s.info, s.entsize);
    }
    for (size_t i = 0; i < sections_.size(); ++i) {
      b.resize(out.data_at[i + 1], 0);
      const Bytes& data = i == 0 ? names.bytes() : sections_[i].data;
      if (sections_[i].type != kNobits) b.insert(b.end(), data.begin(), data.end());
    }
    return out;
  }

  // Where section `index`'s header field at `field_offset` is in the file.
  static uint64_t HeaderField(uint32_t index, uint64_t field_offset) { return 64 + 64 * index + field_offset; }

 private:
  uint16_t type_, machine_;
  std::vector<Section> sections_;  // from section 1
};

inline constexpr uint64_t kShLink = 40, kShInfo = 44, kShName = 0, kShEntsize = 56, kShOffset = 24, kShSize = 32;

// ---- the model a dump is written from ----------------------------------------

struct FunctionModel {
  std::string name;  // as in the symbol table
  uint64_t address = 0, size = 0;
};

struct ModuleModel {
  uint64_t handle = 0;
  std::vector<FunctionModel> functions;
  bool image = true;  // write its relocated image
};

struct LaneModel {
  uint32_t lane = 0;
  uint32_t tx = 0, ty = 0, tz = 0;
  uint32_t exception = 0;
  uint64_t pc = 0;
  uint64_t pc_offset = 0;  // from the function's start
};

struct WarpModel {
  uint32_t id = 0;
  uint64_t error_pc = 0;
  bool error_pc_valid = false;
  uint32_t valid = 0xffffffffu, active = 0xffffffffu;
  std::vector<LaneModel> lanes;
  bool lane_table = true;
};

struct CtaModel {
  uint64_t grid_id = 0;
  uint32_t bx = 0, by = 0, bz = 0;
  std::vector<WarpModel> warps;
};

struct SmModel {
  uint32_t id = 0;
  uint32_t exception = 0;  // r555 rows
  bool error_pc_valid = false;
  uint64_t error_pc = 0;
  std::vector<CtaModel> ctas;
};

struct GridModel {
  uint64_t id = 0, context = 0, function = 0, entry = 0, module = 0;
  uint32_t gx = 1, gy = 1, gz = 1, bx = 1, by = 1, bz = 1;
  uint32_t cx = 1, cy = 1, cz = 1;  // cluster dims, r525 rows
};

struct DeviceModel {
  uint32_t id = 0;
  std::string name = "NVIDIA H100 80GB HBM3", type = "gh100", sm_type = "sm_90";
  uint32_t sm_major = 9, sm_minor = 0, num_sms = 132, warps_per_sm = 64, lanes_per_warp = 32;
  uint64_t context = 0x5555000;
  std::vector<ModuleModel> modules;
  std::vector<GridModel> grids;
  std::vector<SmModel> sms;
};

struct MetaModel {
  std::string generator = "cuda-coredump";
  uint32_t driver_major = 575, driver_minor = 57, cuda_major = 12, cuda_minor = 9;
  uint32_t flags = 0x2f;  // the lightweight flags: no memory, no unrelocated images, no const banks
  uint32_t timestamp = 1750000000;
};

struct DumpModel {
  std::vector<DeviceModel> devices;
  std::optional<MetaModel> meta = MetaModel{};
  int driver = 575;         // whose row layout every table uses
  size_t extra_row_bytes = 0;  // a newer driver's rows: this many more bytes a row
  // Sections to leave out.
  bool grid_tables = true, sm_tables = true, strtab = true, lane_registers = true, backtraces = true;
  bool const_banks = true;
  bool global_memory = false;  // one 4 KiB global memory section, written last
  bool extended_numbering = false;
};

// The dump written from `m`, and where its sections are.
struct BuiltDump {
  Bytes bytes;
  std::map<std::string, uint32_t> index;  // section name -> index
  ElfWriter::Layout layout;
};

// A relocated module image (ET_EXEC cubin) whose symbol table holds the
// module's functions at their addresses, plus an object symbol and a
// zero-size function that a lookup must not pick.
inline Bytes BuildModuleImage(const ModuleModel& module) {
  ElfWriter w(/*ET_EXEC*/ 2, /*EM_CUDA*/ 190);
  Strings strings;
  std::vector<uint32_t> text;
  for (const FunctionModel& f : module.functions) {
    Section s;
    s.name = ".text." + f.name;
    s.type = kNobits;  // the code bytes themselves are not needed
    s.addr = f.address;
    s.nobits_size = f.size;
    text.push_back(w.Add(std::move(s)));
  }
  Bytes symbols(24, 0);  // the null symbol
  auto symbol = [&](const std::string& name, uint8_t info, uint16_t shndx, uint64_t value, uint64_t size) {
    PutLe(symbols, strings.Add(name), 4);
    symbols.push_back(info);
    symbols.push_back(0);  // st_other
    PutLe(symbols, shndx, 2);
    PutLe(symbols, value, 8);
    PutLe(symbols, size, 8);
  };
  for (size_t i = 0; i < module.functions.size(); ++i) {
    const FunctionModel& f = module.functions[i];
    symbol("$obj$" + f.name, /*STB_LOCAL, STT_OBJECT*/ 0x01, static_cast<uint16_t>(text[i]), f.address, 16);
    symbol(f.name, /*STB_GLOBAL, STT_FUNC*/ 0x12, static_cast<uint16_t>(text[i]), f.address, f.size);
    symbol("$nosize$" + f.name, 0x12, static_cast<uint16_t>(text[i]), f.address, 0);
  }
  Section str;
  str.name = ".strtab";
  str.type = kStrtab;
  str.data = strings.bytes();
  const uint32_t str_index = w.Add(std::move(str));
  Section sym;
  sym.name = ".symtab";
  sym.type = kSymtab;
  sym.link = str_index;
  sym.entsize = 24;
  sym.data = symbols;
  w.Add(std::move(sym));
  return w.Write().bytes;
}

// ---- rows, field by field as the description declares them ---------------------

inline Fields DeviceRow(const DeviceModel& d, Strings& strings) {
  Fields f;
  f.U64(strings.Add(d.name)).U64(strings.Add(d.type)).U64(strings.Add(d.sm_type));
  f.U32(d.id).U32(/*pciBusId*/ 0x41 + d.id).U32(/*pciDevId*/ 0).U32(d.num_sms).U32(d.warps_per_sm);
  f.U32(d.lanes_per_warp).U32(/*numRegsPerLane*/ 255).U32(/*numPredicatesPrLane*/ 7).U32(d.sm_major);
  f.U32(d.sm_minor).U32(/*instructionSize*/ 16).U32(/*status*/ 0).Since(346);
  f.U32(/*numUniformRegsPrWarp*/ 63).U32(/*numUniformPredicatesPrWarp*/ 7).Since(400);
  f.U32(/*numConvergenceBarriersPrWarp*/ 16).U32(0).Since(575);
  return f;
}

inline Fields ModuleRow(const ModuleModel& mod) {
  Fields f;
  f.U64(mod.handle).Since(0);
  return f;
}

inline Fields GridRow(const GridModel& g) {
  Fields f;
  f.U64(g.id).U64(g.context).U64(g.function).U64(g.entry).U64(g.module).U64(/*parentGridId64*/ 0);
  f.U64(/*paramsOffset*/ 0x210).U32(/*kernelType*/ 1).U32(/*origin*/ 0).U32(/*gridStatus*/ 3);
  f.U32(/*numRegs*/ 40).U32(g.gx).U32(g.gy).U32(g.gz).U32(g.bx).U32(g.by).U32(g.bz);
  f.U32(/*attrLaunchBlocking*/ 0).U32(/*attrHostTid*/ 1234).Since(346);
  f.U32(g.cx).U32(g.cy).U32(g.cz).U32(0).Since(525);
  f.U32(0).U32(0).U32(0).U32(0).Since(565);
  return f;
}

inline Fields SmRow(const SmModel& sm) {
  Fields f;
  f.U32(sm.id).U32(0).Since(346);
  f.U32(sm.exception).U32(sm.error_pc_valid ? 1 : 0).U64(sm.error_pc);
  f.U32(0).U32(0).U32(0).U32(0).Since(555);
  return f;
}

inline Fields CtaRow(const CtaModel& c) {
  Fields f;
  f.U64(c.grid_id).U32(c.bx).U32(c.by).U32(c.bz).U32(0).Since(346);
  f.U32(0).U32(0).U32(0).U32(0).Since(525);
  f.U32(1).U32(1).U32(1).U32(0).Since(565);
  return f;
}

inline Fields WarpRow(const WarpModel& wp) {
  Fields f;
  f.U64(wp.error_pc).U32(wp.id).U32(wp.valid).U32(wp.active).U32(/*isWarpBroken*/ 0);
  f.U32(wp.error_pc_valid ? 1 : 0).U32(0).Since(346);
  f.U32(/*numRegs*/ 40).U32(0).Since(525);
  f.U32(/*sharedMemSize*/ 0).U32(0).Since(570);
  f.U32(0).U32(wp.active).U32(0).U32(0).Since(575);
  return f;
}

inline Fields LaneRow(const LaneModel& l) {
  Fields f;
  f.U64(l.pc).U64(l.pc_offset).U32(l.lane).U32(l.tx).U32(l.ty).U32(l.tz).U32(l.exception);
  f.U32(/*callDepth*/ 0).U32(/*syscallCallDepth*/ 0).U32(/*ccRegister*/ 0).Since(346);
  f.U32(/*cbuThreadState*/ 1).U32(0).Since(575);
  return f;
}

inline BuiltDump BuildDump(const DumpModel& m) {
  ElfWriter w(/*ET_CORE*/ 4, /*EM_CUDA*/ 190);
  Strings strings;
  BuiltDump out;
  const int drv = m.driver;
  const size_t extra = m.extra_row_bytes;
  auto add = [&](Section s) {
    const std::string name = s.name;
    const uint32_t i = w.Add(std::move(s));
    out.index[name] = i;
    return i;
  };
  // `shape` is a row of the table (any values): sh_entsize is its size even
  // when the table has no rows.
  auto table = [&](const std::string& name, uint32_t type, uint32_t link, uint32_t info,
                   const std::vector<Fields>& rows, const Fields& shape) {
    Section s;
    s.name = name;
    s.type = type;
    s.link = link;
    s.info = info;
    s.entsize = shape.Row(drv, extra).size();
    for (const Fields& f : rows) {
      const Bytes r = f.Row(drv, extra);
      s.data.insert(s.data.end(), r.begin(), r.end());
    }
    return add(std::move(s));
  };
  // The string table comes first, so that a truncated file keeps it.
  uint32_t strtab = 0;
  if (m.strtab) {
    Section s;
    s.name = ".strtab";
    s.type = kStrtab;
    strtab = add(std::move(s));
  }
  std::vector<Fields> devices;
  for (const DeviceModel& d : m.devices) devices.push_back(DeviceRow(d, strings));
  Strings scratch;
  const uint32_t devtbl = table(".cudbg.devtbl", kDevTable, 0, 0, devices, DeviceRow({}, scratch));
  if (m.meta.has_value()) {
    Fields f;
    f.U64(strings.Add(m.meta->generator)).U32(m.meta->driver_major).U32(m.meta->driver_minor);
    f.U32(m.meta->cuda_major).U32(m.meta->cuda_minor).U32(m.meta->flags).U32(m.meta->timestamp).Since(0);
    table(".cudbg.meta", kMetaTable, 0, 0, {f}, f);
  }
  for (size_t di = 0; di < m.devices.size(); ++di) {
    const DeviceModel& d = m.devices[di];
    const std::string dev = absl::StrFormat("dev%d", di);
    // One context holding the device's modules.
    Fields ctx;
    ctx.U64(d.context).U64(/*sharedWindowBase*/ 0).U64(/*localWindowBase*/ 0).U64(/*globalWindowBase*/ 0);
    ctx.U32(static_cast<uint32_t>(di)).U32(/*tid*/ 1234).Since(0);
    const uint32_t ctxtbl = table(".cudbg.ctxtbl." + dev, kCtxTable, devtbl, static_cast<uint32_t>(di), {ctx}, ctx);
    std::vector<Fields> mods;
    for (const ModuleModel& mod : d.modules) mods.push_back(ModuleRow(mod));
    const uint32_t modtbl = table(".cudbg.modtbl." + dev + ".ctx0", kModTable, ctxtbl, 0, mods, ModuleRow({}));
    for (size_t mi = 0; mi < d.modules.size(); ++mi) {
      if (!d.modules[mi].image) continue;
      Section s;
      s.name = ".cudbg.relfimg." + dev + ".ctx0";
      s.type = kRelfImg;
      s.link = modtbl;
      s.info = static_cast<uint32_t>(mi);
      s.data = BuildModuleImage(d.modules[mi]);
      const std::string key = absl::StrFormat("%s#%d", s.name, mi);
      out.index[key] = w.Add(std::move(s));
    }
    if (m.grid_tables) {
      std::vector<Fields> grids;
      for (const GridModel& g : d.grids) grids.push_back(GridRow(g));
      const uint32_t gridtbl =
          table(".cudbg.gridtbl." + dev, kGridTable, devtbl, static_cast<uint32_t>(di), grids, GridRow({}));
      for (size_t gi = 0; gi < d.grids.size() && m.const_banks; ++gi) {
        Section s;
        s.name = absl::StrFormat(".cudbg.cbankstbl.%s.grid%d", dev, gi);
        s.type = kConstBankTable;
        s.link = gridtbl;
        s.info = static_cast<uint32_t>(gi);
        s.entsize = 16;
        PutLe(s.data, 0x7000000, 8);
        PutLe(s.data, 0x10000, 4);
        PutLe(s.data, 0, 4);
        add(std::move(s));
      }
    }
    if (!m.sm_tables) continue;
    std::vector<Fields> sms;
    for (const SmModel& sm : d.sms) sms.push_back(SmRow(sm));
    const uint32_t smtbl = table(".cudbg.smtbl." + dev, kSmTable, devtbl, static_cast<uint32_t>(di), sms, SmRow({}));
    for (size_t si = 0; si < d.sms.size(); ++si) {
      const SmModel& sm = d.sms[si];
      const std::string smn = absl::StrFormat("%s.sm%d", dev, si);
      std::vector<Fields> ctas;
      for (const CtaModel& c : sm.ctas) ctas.push_back(CtaRow(c));
      const uint32_t ctatbl =
          table(".cudbg.ctatbl." + smn, kCtaTable, smtbl, static_cast<uint32_t>(si), ctas, CtaRow({}));
      for (size_t ci = 0; ci < sm.ctas.size(); ++ci) {
        const CtaModel& c = sm.ctas[ci];
        const std::string ctan = absl::StrFormat("%s.cta%d", smn, ci);
        std::vector<Fields> warps;
        for (const WarpModel& wp : c.warps) warps.push_back(WarpRow(wp));
        const uint32_t wptbl =
            table(".cudbg.wptbl." + ctan, kWarpTable, ctatbl, static_cast<uint32_t>(ci), warps, WarpRow({}));
        for (size_t wi = 0; wi < c.warps.size(); ++wi) {
          const WarpModel& wp = c.warps[wi];
          if (!wp.lane_table) continue;
          const std::string wpn = absl::StrFormat("%s.wp%d", ctan, wi);
          std::vector<Fields> lanes;
          for (const LaneModel& l : wp.lanes) lanes.push_back(LaneRow(l));
          const uint32_t lntbl =
              table(".cudbg.lntbl." + wpn, kLaneTable, wptbl, static_cast<uint32_t>(wi), lanes, LaneRow({}));
          for (size_t li = 0; li < wp.lanes.size(); ++li) {
            const std::string lnn = absl::StrFormat("%s.ln%d", wpn, li);
            if (m.lane_registers) {
              Section s;
              s.name = ".cudbg.regs." + lnn;
              s.type = kRegs;
              s.link = lntbl;
              s.info = static_cast<uint32_t>(li);
              s.entsize = 4;
              for (uint32_t r = 0; r < 8; ++r) PutLe(s.data, 0x1000 + r, 4);
              add(std::move(s));
            }
            if (m.backtraces) {
              Section s;
              s.name = ".cudbg.bt." + lnn;
              s.type = kBacktrace;
              s.link = lntbl;
              s.info = static_cast<uint32_t>(li);
              s.entsize = 24;
              PutLe(s.data, 0x80, 8);
              PutLe(s.data, wp.lanes[li].pc + 0x80, 8);
              PutLe(s.data, 0, 4);
              PutLe(s.data, 0, 4);
              add(std::move(s));
            }
          }
        }
      }
    }
  }
  if (m.global_memory) {
    Section s;
    s.name = ".cudbg.global.0";
    s.type = kGlobalMem;
    s.addr = 0x7f0000000000;
    s.data.assign(4096, 0x5a);
    add(std::move(s));
  }
  if (m.strtab) w.At(strtab).data = strings.bytes();
  out.layout = w.Write(m.extended_numbering);
  out.bytes = out.layout.bytes;
  return out;
}

// ---- the dump most tests start from ---------------------------------------------

// `void flash_attn_fwd<float>(float*, int)` as nvcc mangles it.
inline constexpr const char* kKernelName = "_Z14flash_attn_fwdIfEvPT_i";
inline constexpr const char* kKernelDemangled = "void flash_attn_fwd<float>(float*, int)";
inline constexpr uint64_t kKernelAddress = 0x7f3a00000000ull;
inline constexpr uint64_t kFaultOffset = 0x1a40;

// Device 3 (one of two), SM 12 warp 5: a warp assert in lanes 0-3 of block
// (12,0,0), grid 7; another warp of the same block runs on clean.
inline DumpModel OneFault() {
  DumpModel m;
  DeviceModel other;
  other.id = 2;
  DeviceModel d;
  d.id = 3;
  ModuleModel mod;
  mod.handle = 0xabc000;
  mod.functions = {{"_Z6helperv", kKernelAddress - 0x4000, 0x4000},
                   {kKernelName, kKernelAddress, 0x8000},
                   {"_Z7reduce2Pfi", kKernelAddress + 0x8000, 0x2000}};
  ModuleModel other_mod;
  other_mod.handle = 0xdef000;
  other_mod.functions = {{"_Z10other_kernv", 0x7f3b00000000ull, 0x1000}};
  d.modules = {other_mod, mod};
  GridModel g;
  g.id = 7;
  g.context = d.context;
  g.function = 0x1111;
  g.entry = kKernelAddress;
  g.module = mod.handle;
  g.gx = 128;
  g.bx = 256;
  d.grids = {g};
  WarpModel clean;
  clean.id = 4;
  for (uint32_t l = 0; l < 4; ++l) clean.lanes.push_back({l, 32 * 4 + l, 0, 0, 0, kKernelAddress + 0x100, 0x100});
  WarpModel bad;
  bad.id = 5;
  bad.error_pc_valid = true;
  bad.error_pc = kKernelAddress + kFaultOffset;
  for (uint32_t l = 0; l < 6; ++l) {
    const uint32_t exception = l < 4 ? 12 : 0;  // warp assert in lanes 0-3
    bad.lanes.push_back({l, 64 + l, 0, 0, exception, kKernelAddress + kFaultOffset, kFaultOffset});
  }
  CtaModel cta;
  cta.grid_id = 7;
  cta.bx = 12;
  cta.warps = {clean, bad};
  SmModel idle;
  idle.id = 11;
  SmModel sm;
  sm.id = 12;
  sm.exception = 12;
  sm.error_pc_valid = true;
  sm.error_pc = kKernelAddress + kFaultOffset;
  sm.ctas = {cta};
  d.sms = {idle, sm};
  m.devices = {other, d};
  return m;
}

}  // namespace crashreplay::coredump_testing
