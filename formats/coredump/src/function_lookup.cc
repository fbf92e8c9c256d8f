#include "function_lookup.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "absl/strings/str_format.h"

namespace crashreplay::coredump {
namespace {

constexpr uint64_t kSymbolBytes = 24;  // Elf64_Sym
constexpr uint8_t kSttFunc = 2;
// Real images do not nest functions; a hostile one may overlap any number,
// so the walk down from a PC is capped.
constexpr int kMaxOverlapWalk = 4096;

struct FunctionSymbol {
  uint64_t start = 0;
  uint64_t size = 0;
  uint32_t name = 0;    // offset in its string table
  uint32_t image = 0;   // index into Device::images
  uint32_t strtab = 0;  // index into Image::strtabs
  uint64_t order = 0;   // position among the device's symbols: ties keep it
};

}  // namespace

struct FunctionIndex::Image {
  const ImageRef* ref = nullptr;
  std::unique_ptr<ByteSource> bytes;  // the image's range of the dump
  std::optional<ElfFile> elf;
  std::string error;  // why the image cannot be used; empty when it can
  std::vector<ElfSection> strtab_sections;
  std::vector<std::optional<std::vector<unsigned char>>> strtabs;  // read on first use
};

struct FunctionIndex::Device {
  std::vector<Image> images;
  std::vector<FunctionSymbol> functions;  // of every usable image, sorted by start
  size_t unreadable = 0;                  // images that cannot be read
};

FunctionIndex::FunctionIndex(const ByteSource& dump, std::vector<ImageRef> images)
    : dump_(dump), refs_(std::move(images)), read_budget_(dump.size()) {
  for (size_t i = 0; i < refs_.size(); ++i) refs_by_device_[refs_[i].device_index].push_back(i);
}

bool FunctionIndex::Spend(uint64_t n) {
  if (n > read_budget_) return false;
  read_budget_ -= n;
  return true;
}

namespace {
std::string OverBudget(const std::string& what) {
  return absl::StrFormat("%s: the module images' tables add up to more bytes than the dump holds (they overlap)", what);
}
}  // namespace

FunctionIndex::~FunctionIndex() = default;

void FunctionIndex::Parse(Image& out) {
  const ImageRef& ref = *out.ref;
  if (!InRange(ref.section.offset, ref.section.size, dump_.size())) {
    out.error = "its bytes run past the end of the dump (truncated)";
    return;
  }
  out.bytes = SliceSource(dump_, ref.section.offset, ref.section.size);
  absl::StatusOr<ElfFile> elf = ElfFile::Open(*out.bytes, absl::StrFormat("the module image in %s", ref.label));
  if (!elf.ok()) {
    out.error = std::string(elf.status().message());
    return;
  }
  if (elf->machine() != kEmCuda) {
    out.error = absl::StrFormat("%s: e_machine %d, not a CUDA module image (%d)", elf->what(), elf->machine(), kEmCuda);
    return;
  }
  if (absl::Status s = elf->LoadSectionTable(kMaxSections); !s.ok()) {
    out.error = std::string(s.message());
    return;
  }
  if (!Spend(elf->num_sections() * kSectionHeaderBytes)) {
    out.error = OverBudget(elf->what());
    return;
  }
  out.elf = std::move(*elf);
}

FunctionIndex::Device& FunctionIndex::Get(uint32_t device_index) {
  auto found = devices_.find(device_index);
  if (found != devices_.end()) return *found->second;
  auto d = std::make_unique<Device>();
  Device& dev = *d;
  devices_.emplace(device_index, std::move(d));
  for (size_t r : refs_by_device_[device_index]) {
    dev.images.emplace_back();
    Image& image = dev.images.back();
    image.ref = &refs_[r];
    Parse(image);
  }
  uint64_t order = 0;
  std::vector<ElfSection> sections;
  std::vector<unsigned char> symbols;
  for (size_t i = 0; i < dev.images.size(); ++i) {
    Image& image = dev.images[i];
    if (image.error.empty()) {
      const ElfFile& elf = *image.elf;
      absl::Status s = elf.ReadSections(0, elf.num_sections(), &sections);
      for (size_t k = 0; s.ok() && k < sections.size(); ++k) {
        const ElfSection& sec = sections[k];
        if (sec.type != kShtSymtab) continue;
        const std::string label = absl::StrFormat("symbol table (section %d)", sec.index);
        if (sec.entsize != kSymbolBytes) {
          s = absl::DataLossError(absl::StrFormat("%s: %s has %d-byte entries; ELF64 symbols are %d", elf.what(), label,
                                                  sec.entsize, kSymbolBytes));
          break;
        }
        if (sec.link == 0 || sec.link >= sections.size() || sections[sec.link].type != kShtStrtab) {
          s = absl::DataLossError(
              absl::StrFormat("%s: %s: sh_link %d does not name a string table", elf.what(), label, sec.link));
          break;
        }
        if (!elf.BytesInFile(sec)) {
          s = elf.SectionBytes(sec, kMaxTableBytes, label, &symbols);  // says why
          break;
        }
        if (!Spend(sec.size)) {
          s = absl::ResourceExhaustedError(OverBudget(elf.what()));
          break;
        }
        s = elf.SectionBytes(sec, kMaxTableBytes, label, &symbols);
        if (!s.ok()) break;
        const uint32_t strtab = static_cast<uint32_t>(image.strtab_sections.size());
        image.strtab_sections.push_back(sections[sec.link]);
        image.strtabs.emplace_back();
        for (uint64_t off = 0; off + kSymbolBytes <= symbols.size(); off += kSymbolBytes) {
          const unsigned char* sym = symbols.data() + off;
          const uint8_t info = sym[4];
          const uint16_t shndx = Le16(sym + 6);
          const uint64_t size = Le64(sym + 16);
          if ((info & 0xf) != kSttFunc || shndx == 0 || size == 0) continue;
          dev.functions.push_back(
              FunctionSymbol{Le64(sym + 8), size, Le32(sym), static_cast<uint32_t>(i), strtab, order++});
        }
      }
      if (!s.ok()) image.error = std::string(s.message());
    }
    if (!image.error.empty()) {
      ++dev.unreadable;
      problems_.push_back(absl::StrFormat("%s cannot be read: %s", image.ref->label, image.error));
    }
  }
  std::sort(dev.functions.begin(), dev.functions.end(), [](const FunctionSymbol& a, const FunctionSymbol& b) {
    return a.start != b.start ? a.start < b.start : a.order < b.order;
  });
  return dev;
}

Location FunctionIndex::Locate(uint32_t device_index, std::optional<uint64_t> module_handle, uint64_t pc) {
  Location loc;
  loc.pc = pc;
  Device& dev = Get(device_index);
  if (dev.images.empty()) {
    loc.why_unknown = absl::StrFormat("the dump holds no relocated module image for device row %d", device_index);
    return loc;
  }
  const std::string problems = dev.unreadable == 0
                                   ? std::string()
                                   : absl::StrFormat(" (%d of them cannot be read: see the notes)", dev.unreadable);
  // The function with the largest start at or below pc that covers it.
  auto it = std::upper_bound(dev.functions.begin(), dev.functions.end(), pc,
                             [](uint64_t v, const FunctionSymbol& f) { return v < f.start; });
  const FunctionSymbol* hit = nullptr;
  for (int steps = 0; it != dev.functions.begin() && steps < kMaxOverlapWalk; ++steps) {
    --it;
    if (pc - it->start >= it->size) continue;
    // Of those starting there, the first in table order, the grid's module first.
    auto first = it;
    while (first != dev.functions.begin() && std::prev(first)->start == it->start) --first;
    hit = &*first;
    for (auto k = first; k != dev.functions.end() && k->start == it->start; ++k) {
      if (pc - k->start < k->size && module_handle == dev.images[k->image].ref->module_handle) {
        hit = &*k;
        break;
      }
    }
    break;
  }
  if (hit == nullptr) {
    loc.why_unknown =
        absl::StrFormat("no function symbol in the %d relocated module image%s of device row %d covers 0x%x%s",
                        dev.images.size(), dev.images.size() == 1 ? "" : "s", device_index, pc, problems);
    return loc;
  }
  Image& image = dev.images[hit->image];
  std::optional<std::vector<unsigned char>>& table = image.strtabs[hit->strtab];
  std::string why;
  if (!table.has_value()) {
    std::vector<unsigned char> bytes;
    const ElfSection& st = image.strtab_sections[hit->strtab];
    const std::string label = absl::StrFormat("string table (section %d)", st.index);
    absl::Status s = !image.elf->BytesInFile(st) || Spend(st.size)
                         ? image.elf->SectionBytes(st, kMaxTableBytes, label, &bytes)
                         : absl::ResourceExhaustedError(OverBudget(image.elf->what()));
    if (s.ok()) {
      table = std::move(bytes);
    } else {
      why = std::string(s.message());
    }
  }
  std::string name;
  if (table.has_value() && StringAt(*table, hit->name, &name, &why)) {
    std::string demangled = Demangle(name);
    const uint64_t held = name.size() + demangled.size();
    if (held > name_budget_) {
      loc.why_unknown = absl::StrFormat(
          "the function at 0x%x in %s covers 0x%x, but its name would pass this reader's cap of %d bytes of names",
          hit->start, image.ref->label, pc, kMaxNameBytes);
      return loc;
    }
    name_budget_ -= held;
    Function f;
    f.name = std::move(name);
    f.demangled = std::move(demangled);
    f.start = hit->start;
    f.size = hit->size;
    f.offset = pc - hit->start;
    f.module_handle = image.ref->module_handle;
    loc.function = std::move(f);
    return loc;
  }
  loc.why_unknown = absl::StrFormat("the function at 0x%x in %s covers 0x%x but its name cannot be read: %s",
                                    hit->start, image.ref->label, pc, why);
  return loc;
}

std::string Demangle(const std::string& name) {
  if (name.size() > kMaxDemangleBytes || !name.starts_with("_Z")) return name;
  int status = 0;
  char* out = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) {
    std::free(out);
    return name;
  }
  std::string result(out);
  std::free(out);
  return result;
}

}  // namespace crashreplay::coredump
