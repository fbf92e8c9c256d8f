#include "elf_reader.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "crashreplay/formats/coredump/coredump.h"

namespace crashreplay::coredump {
namespace {

constexpr uint64_t kElfHeaderBytes = 64;
constexpr uint16_t kShnXindex = 0xffff;  // e_shstrndx: the real index is in section 0's sh_link

ElfSection ParseSection(const unsigned char* p, uint64_t index) {
  ElfSection s;
  s.index = index;
  s.name = Le32(p + 0);
  s.type = Le32(p + 4);
  s.flags = Le64(p + 8);
  s.addr = Le64(p + 16);
  s.offset = Le64(p + 24);
  s.size = Le64(p + 32);
  s.link = Le32(p + 40);
  s.info = Le32(p + 44);
  // sh_addralign at 48 is not used.
  s.entsize = Le64(p + 56);
  return s;
}

}  // namespace

uint16_t Le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t Le32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t Le64(const unsigned char* p) {
  return static_cast<uint64_t>(Le32(p)) | (static_cast<uint64_t>(Le32(p + 4)) << 32);
}

absl::StatusOr<ElfFile> ElfFile::Open(const ByteSource& source, std::string what) {
  ElfFile f(source, std::move(what));
  if (source.size() < kElfHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d bytes, shorter than the %d-byte ELF header", f.what_, source.size(), kElfHeaderBytes));
  }
  std::vector<unsigned char> h;
  if (absl::Status s = source.Read(0, kElfHeaderBytes, &h, f.what_); !s.ok()) return s;
  const unsigned char magic[4] = {0x7f, 'E', 'L', 'F'};
  if (std::memcmp(h.data(), magic, sizeof magic) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: not an ELF file (no \\x7fELF magic)", f.what_));
  }
  if (h[4] != 2 || h[5] != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: ELF class %d data %d; CUDA core dumps and module images are ELF64 little-endian (class 2, data 1)",
        f.what_, h[4], h[5]));
  }
  f.osabi_ = h[7];
  f.type_ = Le16(h.data() + 16);
  f.machine_ = Le16(h.data() + 18);
  f.shoff_ = Le64(h.data() + 40);
  f.shentsize_ = Le16(h.data() + 58);
  f.shnum_field_ = Le16(h.data() + 60);
  f.shstrndx_field_ = Le16(h.data() + 62);
  return f;
}

absl::Status ElfFile::LoadSectionTable(uint64_t max_sections) {
  const uint64_t file = source_->size();
  if (shoff_ == 0) {
    // No section-header table at all: nothing to read.
    num_sections_ = 0;
    names_index_ = 0;
    return absl::OkStatus();
  }
  if (shentsize_ != kSectionHeaderBytes) {
    return absl::DataLossError(absl::StrFormat("%s: section headers are %d bytes (e_shentsize); ELF64's are %d", what_,
                                               shentsize_, kSectionHeaderBytes));
  }
  uint64_t count = shnum_field_;
  uint64_t names = shstrndx_field_;
  if (count == 0 || names == kShnXindex) {
    // Extended numbering: section 0's header holds the count and/or the
    // name table's index.
    if (!InRange(shoff_, kSectionHeaderBytes, file)) {
      return absl::DataLossError(absl::StrFormat(
          "%s: the section header table at offset %d lies past the end of the file (%d bytes): truncated", what_,
          shoff_, file));
    }
    std::vector<unsigned char> zero;
    if (absl::Status s = source_->Read(shoff_, kSectionHeaderBytes, &zero, what_); !s.ok()) return s;
    const ElfSection s0 = ParseSection(zero.data(), 0);
    if (count == 0) count = s0.size;
    if (names == kShnXindex) names = s0.link;
  }
  if (count > max_sections) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: %d sections, over this reader's cap of %d", what_, count, max_sections));
  }
  if (!InRange(shoff_, count * kSectionHeaderBytes, file)) {
    return absl::DataLossError(absl::StrFormat(
        "%s: the section header table (%d entries at offset %d) runs past the end of the file (%d bytes): the file "
        "is truncated or corrupt",
        what_, count, shoff_, file));
  }
  if (names != 0 && names >= count) {
    return absl::DataLossError(absl::StrFormat(
        "%s: the section-name table is section %d (e_shstrndx), but there are only %d sections", what_, names, count));
  }
  num_sections_ = count;
  names_index_ = names;
  return absl::OkStatus();
}

absl::Status ElfFile::ReadSections(uint64_t first, uint64_t count, std::vector<ElfSection>* out) const {
  out->clear();
  if (first > num_sections_ || count > num_sections_ - first) {
    return absl::DataLossError(
        absl::StrFormat("%s: sections %d..%d do not exist (there are %d)", what_, first, first + count, num_sections_));
  }
  std::vector<unsigned char> raw;
  if (absl::Status s = source_->Read(shoff_ + first * kSectionHeaderBytes, count * kSectionHeaderBytes, &raw, what_);
      !s.ok()) {
    return s;
  }
  out->reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) out->push_back(ParseSection(raw.data() + i * kSectionHeaderBytes, first + i));
  return absl::OkStatus();
}

absl::StatusOr<ElfSection> ElfFile::ReadSection(uint64_t index) const {
  std::vector<ElfSection> one;
  if (absl::Status s = ReadSections(index, 1, &one); !s.ok()) return s;
  return one[0];
}

bool ElfFile::BytesInFile(const ElfSection& s) const {
  return s.type == kShtNobits || InRange(s.offset, s.size, source_->size());
}

absl::Status ElfFile::SectionBytes(const ElfSection& s, uint64_t max_bytes, const std::string& label,
                                   std::vector<unsigned char>* out) const {
  if (s.type == kShtNobits) {
    out->clear();
    return absl::OkStatus();
  }
  if (!InRange(s.offset, s.size, source_->size())) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %s: its %d bytes at offset %d run past the end of the file (%d bytes): the file is truncated", what_,
        label, s.size, s.offset, source_->size()));
  }
  if (s.size > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: %s: %d bytes, over this reader's cap of %d", what_, label, s.size, max_bytes));
  }
  return source_->Read(s.offset, s.size, out, absl::StrFormat("%s: %s", what_, label));
}

bool StringAt(const std::vector<unsigned char>& table, uint64_t index, std::string* out, std::string* why) {
  if (index >= table.size()) {
    *why = absl::StrFormat("index %d is past the end of the %d-byte string table", index, table.size());
    return false;
  }
  const size_t begin = static_cast<size_t>(index);
  const size_t limit = std::min<size_t>(table.size(), begin + static_cast<size_t>(kMaxStringBytes) + 1);
  const auto nul = std::find(table.begin() + static_cast<std::ptrdiff_t>(begin),
                             table.begin() + static_cast<std::ptrdiff_t>(limit), 0);
  if (nul == table.begin() + static_cast<std::ptrdiff_t>(limit)) {
    *why = limit == table.size()
               ? absl::StrFormat("the string at index %d has no terminating NUL before the table ends", index)
               : absl::StrFormat("the string at index %d is longer than this reader's cap of %d bytes", index,
                                 kMaxStringBytes);
    return false;
  }
  out->assign(reinterpret_cast<const char*>(table.data()) + begin, static_cast<size_t>(nul - table.begin()) - begin);
  return true;
}

std::string Printable(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += absl::StrFormat("\\x%02x", u);
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace crashreplay::coredump
