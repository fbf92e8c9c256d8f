// Bounded reading of an ELF64 little-endian file: its header, its section
// headers (with the extended numbering a file of 65280 sections or more
// needs), section bytes and strings. Used for the core dump itself and for
// the module images (cubins) embedded in it. Private to formats/coredump.
//
// Every offset and size is checked against the source's size before it is
// read; errors are DataLoss naming `what` (the file), the section and the
// offset. Not thread-safe to share during Load; reads after it are const.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "byte_source.h"

namespace crashreplay::coredump {

inline constexpr uint16_t kEtCore = 4;
inline constexpr uint16_t kEmCuda = 190;
inline constexpr uint32_t kShtSymtab = 2;
inline constexpr uint32_t kShtStrtab = 3;
inline constexpr uint32_t kShtNobits = 8;
inline constexpr uint64_t kSectionHeaderBytes = 64;

struct ElfSection {
  uint64_t index = 0;
  uint32_t name = 0;  // offset in the section-name table
  uint32_t type = 0;
  uint64_t flags = 0, addr = 0, offset = 0, size = 0;
  uint32_t link = 0, info = 0;
  uint64_t entsize = 0;
};

// Little-endian loads from a byte buffer (the caller checks the bounds).
uint16_t Le16(const unsigned char* p);
uint32_t Le32(const unsigned char* p);
uint64_t Le64(const unsigned char* p);

class ElfFile {
 public:
  // Reads the 64-byte ELF header. InvalidArgument when the bytes are not an
  // ELF64 little-endian file (too short, wrong magic, class or data).
  static absl::StatusOr<ElfFile> Open(const ByteSource& source, std::string what);

  uint16_t type() const { return type_; }
  uint16_t machine() const { return machine_; }
  uint8_t osabi() const { return osabi_; }
  const std::string& what() const { return what_; }
  const ByteSource& source() const { return *source_; }

  // Validates the section-header table: entry size, extended numbering,
  // the table inside the file, at most `max_sections` entries
  // (ResourceExhausted), the name table's index in range.
  absl::Status LoadSectionTable(uint64_t max_sections);
  uint64_t num_sections() const { return num_sections_; }
  uint64_t names_index() const { return names_index_; }  // 0: no section-name table

  // Headers [first, first + count), which must be < num_sections().
  absl::Status ReadSections(uint64_t first, uint64_t count, std::vector<ElfSection>* out) const;
  absl::StatusOr<ElfSection> ReadSection(uint64_t index) const;

  // Whether a section's bytes lie inside the file (NOBITS sections hold none).
  bool BytesInFile(const ElfSection& s) const;
  // A section's bytes: DataLoss when they run past the end of the file,
  // ResourceExhausted when over `max_bytes`. `label` names the section.
  absl::Status SectionBytes(const ElfSection& s, uint64_t max_bytes, const std::string& label,
                            std::vector<unsigned char>* out) const;

 private:
  ElfFile(const ByteSource& source, std::string what) : source_(&source), what_(std::move(what)) {}
  const ByteSource* source_;
  std::string what_;
  uint16_t type_ = 0, machine_ = 0;
  uint8_t osabi_ = 0;
  uint64_t shoff_ = 0;
  uint16_t shentsize_ = 0, shnum_field_ = 0, shstrndx_field_ = 0;
  uint64_t num_sections_ = 0;
  uint64_t names_index_ = 0;
};

// The NUL-terminated string at `index` of a string table: the reason it
// cannot be read ("index 900 is past the end of the 120-byte table", "no
// NUL within 65536 bytes") in `why` when it cannot.
bool StringAt(const std::vector<unsigned char>& table, uint64_t index, std::string* out, std::string* why);

// `s` with control bytes (below 0x20, and 0x7f) written as \xNN: strings
// from the file go into messages and onto terminals.
std::string Printable(const std::string& s);

}  // namespace crashreplay::coredump
